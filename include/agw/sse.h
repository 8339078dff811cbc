/* Server-Sent Events: an incremental parser for upstream streams and the writer for client streams.
 * Pure: no sockets, no event loop; it only moves bytes between evbuffers, so it is tested
 * exhaustively offline (doc/internals/sse.md).
 *
 * Parsing follows the WHATWG event-stream rules: lines end in CRLF, LF or CR (a CR at the end of
 * the input and an LF at the start of the next read are one line end; the CR line is handled at
 * once); "data:" lines are joined with "\n" (one leading space after the colon is stripped);
 * "event:", "id:", "retry:" are recorded for the frame they appear in; ":" comment lines and
 * unknown fields are ignored; a line without ':' is a field with an empty value; a blank line
 * dispatches the frame if it had at least one data line (even an empty one) and then starts a new
 * frame. A UTF-8 BOM at the very start of the stream is skipped. Payloads are not interpreted
 * ("[DONE]" is data like any other).
 *
 * A frame's size is the number of bytes it occupies in the input: all its lines with their line
 * ends, comments included, the line end of the terminating blank line counting one byte (CRLF
 * included: its LF may arrive after the frame was dispatched). Over <max_frame> the parser fails,
 * also in the middle of a line that never ends, so the memory it holds stays bounded (about twice
 * <max_frame> at worst) whatever the peer sends. */
#ifndef AGW_SSE_H
#define AGW_SSE_H

#include "agw/common.h"

struct evbuffer;
struct agw_sse_parser;

/* Everything points into memory owned by the parser or into the input, valid until the callback
 * returns. */
struct agw_sse_frame {
    const char *data;  /* the joined data lines (may contain NUL bytes; not NUL-terminated) */
    size_t data_len;   /* bytes of <data> */
    const char *event; /* value of the frame's last "event:" line (maybe ""), or NULL */
    const char *id;    /* value of the frame's last "id:" line without NUL (maybe ""), or NULL */
    long retry;        /* the frame's last valid "retry:" value (digits only), or -1 */
    /* The input holds the frame, whole, as "data: <data>\n\n" (from data - 6 to data + data_len +
     * 2): the client frame that relays it unchanged. Only the input passed to agw_sse_parse_bytes()
     * is meant, valid until that call returns (agw_sse_parse() drains its input as it goes). */
    bool framed;
};

/* Called once per dispatched frame. Return 0 (or any value >= 0) to go on; a negative value stops
 * parsing and is returned by agw_sse_parse() / agw_sse_finish(). The callback must not call into
 * the parser, free it, or modify the evbuffer being parsed. */
typedef int agw_sse_frame_fn(void *arg, const struct agw_sse_frame *frame);

/* <max_frame> bytes at most per frame (0 = no limit; never 0 in the daemon). Owned by the caller.
 */
struct agw_sse_parser *agw_sse_parser_new(size_t max_frame);
/* NULL is a no-op. */
void agw_sse_parser_free(struct agw_sse_parser *p);

/* Consumes every byte of <in> (a partial trailing line or frame is kept inside the parser), calling
 * <cb> for each complete frame. Returns the number of frames dispatched (0 or more), -AGW_ETOOBIG
 * when a frame exceeds max_frame, or the callback's negative value. <in> is drained even on error.
 * After an error the parser must not be used again (every later call returns the same error). */
int agw_sse_parse(struct agw_sse_parser *p, struct evbuffer *in, agw_sse_frame_fn *cb, void *arg);
/* Same, for a memory block (not modified, not retained). */
int agw_sse_parse_bytes(struct agw_sse_parser *p, const char *buf, size_t len, agw_sse_frame_fn *cb,
                        void *arg);

/* End of input: dispatches a last frame that was not followed by a blank line (if it has data), an
 * unterminated last line counting as complete. Returns the number of frames dispatched (0 or 1) or
 * a negative value as above. Afterwards the parser is as new: more input is a new stream. */
int agw_sse_finish(struct agw_sse_parser *p, agw_sse_frame_fn *cb, void *arg);

/* True while the parser holds bytes of an incomplete frame (any line or partial line since the last
 * blank line, comments included, or the start of a BOM). */
bool agw_sse_pending(const struct agw_sse_parser *p);

/* Appends "data: <data>\n\n" to <out>. <data> must hold no CR or LF (compact JSON); this is not
 * checked, as it runs once per relayed event. Returns 0, or -AGW_ENOMEM if libevent could not
 * allocate (then nothing is appended). */
int agw_sse_write_data(struct evbuffer *out, const char *data, size_t len);
/* Appends ": <text>\n\n" to <out> (a heartbeat is agw_sse_write_comment(out, "ping")); <text> as
 * above. */
int agw_sse_write_comment(struct evbuffer *out, const char *text);

#endif
