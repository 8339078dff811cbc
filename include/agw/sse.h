/* Server-Sent Events: an incremental parser for upstream streams and the writer for client streams. Pure: no
 * sockets, no event loop; it only moves bytes between evbuffers, so it is tested exhaustively offline.
 *
 * Parsing follows the WHATWG event-stream rules: lines end in CRLF, LF or CR (a CR at the end of the input
 * and an LF at the start of the next read are one line end); "data:" lines are joined with "\n" (one leading
 * space after the colon is stripped); "event:", "id:", "retry:" are recorded; ":" comment lines and unknown
 * fields are ignored; a blank line dispatches the frame if it had at least one data line. A frame's size is
 * the number of bytes it occupies in the input, including line ends; over <max_frame> the parser fails. */
#ifndef AGW_SSE_H
#define AGW_SSE_H

#include "agw/common.h"

struct evbuffer;
struct agw_sse_parser;

struct agw_sse_frame {
    const char *data; /* the joined data lines, NUL-terminated; borrowed until the callback returns */
    size_t data_len;
    const char *event; /* value of the last "event:" line, or NULL */
    const char *id;    /* value of the last "id:" line, or NULL */
    long retry;        /* value of a valid "retry:" line, or -1 */
};

/* Called once per dispatched frame. Return 0 to go on; a negative value stops parsing and is returned by
 * agw_sse_parse() / agw_sse_finish(). */
typedef int agw_sse_frame_fn(void *arg, const struct agw_sse_frame *frame);

/* <max_frame> bytes at most per frame (0 = no limit; never 0 in the daemon). Owned by the caller. */
struct agw_sse_parser *agw_sse_parser_new(size_t max_frame);
void agw_sse_parser_free(struct agw_sse_parser *p);

/* Consumes every byte of <in> (a partial trailing line or frame is kept inside the parser), calling <cb> for
 * each complete frame. Returns the number of frames dispatched (0 or more), -AGW_ETOOBIG when a frame exceeds
 * max_frame, or the callback's negative value. After an error the parser must not be used again. */
int agw_sse_parse(struct agw_sse_parser *p, struct evbuffer *in, agw_sse_frame_fn *cb, void *arg);
/* Same, for a memory block. */
int agw_sse_parse_bytes(struct agw_sse_parser *p, const char *buf, size_t len, agw_sse_frame_fn *cb,
                        void *arg);

/* End of input: dispatches a last frame that was not followed by a blank line (if it has data). Returns the
 * number of frames dispatched (0 or 1) or a negative value as above. */
int agw_sse_finish(struct agw_sse_parser *p, agw_sse_frame_fn *cb, void *arg);

/* True while the parser holds bytes of an incomplete frame. */
bool agw_sse_pending(const struct agw_sse_parser *p);

/* Appends "data: <data>\n\n" to <out>. <data> must hold no CR or LF (compact JSON). Returns 0. */
int agw_sse_write_data(struct evbuffer *out, const char *data, size_t len);
/* Appends ": <text>\n\n" to <out> (a heartbeat is agw_sse_write_comment(out, "ping")). */
int agw_sse_write_comment(struct evbuffer *out, const char *text);

#endif
