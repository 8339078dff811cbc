/* A run's events, kept for thread history (doc/internals/history.md#capture). The relay hands the
 * capture every event the client gets; on the event loop, cheaply (one pass over the bytes, no
 * jansson, no allocation beyond the amortised growth of one buffer), it keeps only what can change
 * the thread's messages, and hands that over as JSON Lines for the store's thread, which parses
 * them and applies them with agw_history_apply(). Pure: no I/O, no event loop, no logging.
 *
 * What it keeps, by the event's top-level "type":
 * - TEXT_MESSAGE_START/END, TOOL_CALL_START/END/RESULT, MESSAGES_SNAPSHOT, TEXT_MESSAGE_CHUNK,
 * TOOL_CALL_CHUNK, REASONING_MESSAGE_START/END/CHUNK and REASONING_ENCRYPTED_VALUE: copied byte for
 * byte;
 * - TEXT_MESSAGE_CONTENT and REASONING_MESSAGE_CONTENT (TOOL_CALL_ARGS): consecutive ones of one
 * messageId (toolCallId), ids compared by their raw bytes, become one event
 * {"type":"TEXT_MESSAGE_CONTENT" (…),"messageId":<id>,"delta":"<deltas>"} whose delta is the raw
 * bytes of theirs, escapes and all, concatenated: that is the JSON string of the concatenated
 * text, so nothing is decoded (a reasoning message's deltas do to it what a text's do: they append
 * to the content of the message of that id). Their other members are dropped; one with a
 * "metadata" member (which the client merges into the message) is kept byte for byte instead.
 * Events of dropped types in between do not break a run of deltas; any kept event does;
 * - RUN_STARTED: copied byte for byte when it has an "input" member (whose messages the client
 * adds), else dropped;
 * - every other type: dropped.
 * An event the scanner cannot judge (not one valid JSON object with a plain string "type", an
 * escaped key, "type", "messageId", "toolCallId" or "delta" given twice, a content event whose id
 * or delta is not a string...) is kept byte for byte too: the store's full parse decides, so the
 * thread the kept lines rebuild is the one the events would have rebuilt, whatever the bytes.
 * Events are one line each (the data of one SSE event): a raw CR or LF in a kept event becomes a
 * tab, which JSON reads as whitespace between tokens and refuses inside a string, as it does CR/LF.
 * A coalesced event's line begins with AGW_CAPTURE_MARK, before its JSON: it was written here from
 * strings read whole, so its reader takes the delta's end from the line's end instead of scanning
 * the delta again (agw_capture_line_delta()). A kept event never begins with the mark: a first
 * byte that is the mark is written as AGW_CAPTURE_NOT_MARK (the event was not JSON, and is not).
 *
 * Ownership: one struct agw_capture per run, owned by the relay; not thread-safe (one thread at a
 * time). It holds what it kept until agw_capture_take() hands it over; it sets no ceiling itself:
 * the caller takes when agw_capture_size() passes its own. */
#ifndef AGW_CAPTURE_H
#define AGW_CAPTURE_H

#include "agw/common.h"

struct agw_capture;

/* The first byte of a coalesced event's line (0x1e, the record separator; see above), and what a
 * kept event's first byte becomes when it is that byte. Neither begins a JSON text. */
#define AGW_CAPTURE_MARK     '\x1e'
#define AGW_CAPTURE_NOT_MARK '\x1f'

/* A new, empty capture. */
struct agw_capture *agw_capture_new(void);
/* Frees the capture and what it holds; NULL is a no-op. */
void agw_capture_free(struct agw_capture *c);

/* Records one event: <len> bytes at <json> (borrowed for the call; need not be NUL-terminated;
 * any bytes). Aborts on out-of-memory, as agw_xmalloc() does. */
void agw_capture_event(struct agw_capture *c, const char *json, size_t len);

/* What agw_capture_event() does with a TEXT_MESSAGE_CONTENT or REASONING_MESSAGE_CONTENT (<args>
 * false) or TOOL_CALL_ARGS (<args> true) event that the caller has read already
 * (agw_agui_emitting_content()): its id and delta as string tokens, quotes included (<id_len>,
 * <delta_len> >= 2, asserted), each a JSON string jansson reads; no scan. */
void agw_capture_content(struct agw_capture *c, bool args, const char *id, size_t id_len,
                         const char *delta, size_t delta_len);

/* What agw_capture_event() does with an event whose "type" the caller has read already
 * (agw_agui_emitting_type()): <json> is one JSON object as jansson reads it, with the unescaped
 * string <type> (<type_len> bytes, without its quotes) as its only "type". Dropped or kept by that
 * type without a scan; a content event is scanned for its id and delta as by agw_capture_event().
 */
void agw_capture_typed(struct agw_capture *c, const char *type, size_t type_len, const char *json,
                       size_t len);

/* Whether agw_capture_typed() with the same arguments keeps or coalesces anything: false for an
 * event the capture drops, which changes nothing in it (so a caller with no capture need not make
 * one for it). */
bool agw_capture_keeps_typed(const char *type, size_t type_len, const char *json, size_t len);

/* Bytes held, the open coalesced event included (without the 3 bytes that close it). */
size_t agw_capture_size(const struct agw_capture *c);

/* Hands over everything kept so far as JSON Lines (each kept event, or the mark and a coalesced
 * event, then '\n'), the open coalesced event closed first; *<len> gets their length, and *<chunk>
 * (when not NULL) whether the buffer is a chunk (below). The caller frees them with
 * agw_mem_separate_free() (they are on the separate heap, include/agw/mem.h; free() works too,
 * through the thread's default cache), or gives a chunk back to where chunks come from. NULL (and
 * *<len> 0) when nothing is held. The capture is empty then and goes on: a later delta of the same
 * message starts a new coalesced event. */
char *agw_capture_take(struct agw_capture *c, size_t *len, bool *chunk);

/* What agw_capture_take() would hand over, left in place for the caller to copy: the open
 * coalesced event closed, *<len> set, NULL when nothing is held. agw_capture_clear() then empties
 * the capture, which keeps its buffer (the next lines go to memory this thread already holds). */
const char *agw_capture_lines(struct agw_capture *c, size_t *len);
void agw_capture_clear(struct agw_capture *c);
/* Whether the buffer held is a chunk (agw_capture_use_chunks()). */
bool agw_capture_in_chunk(const struct agw_capture *c);

/* Chunks: the buffers of a long run, recycled by the caller instead of being grown by doubling and
 * freed. A capture starts with a small buffer (a run that waits keeps little); once what it holds
 * passes AGW_CAPTURE_SMALL_BYTES it moves to a chunk of AGW_CAPTURE_CHUNK_BYTES from <get> (one
 * copy of what it held), and after a take that handed over a chunk it starts the next buffer as a
 * chunk at once. A chunk is a block of exactly AGW_CAPTURE_CHUNK_BYTES that free() accepts; one
 * that an event too big for it outgrew is no chunk any more (take says so). <get> never fails
 * (out of memory aborts, as agw_xmalloc() does). Without this call every buffer grows by doubling.
 */
#define AGW_CAPTURE_SMALL_BYTES (8 * 1024)
#define AGW_CAPTURE_CHUNK_BYTES (80 * 1024)
typedef char *agw_capture_chunk_fn(void *arg);
void agw_capture_use_chunks(struct agw_capture *c, agw_capture_chunk_fn *get, void *arg);

/* The parts of a coalesced content line (see agw_capture_line_delta()). */
struct agw_capture_delta {
    bool args;      /* TOOL_CALL_ARGS (toolCallId); false: TEXT_MESSAGE_CONTENT (messageId) */
    const char *id; /* the id's bytes between its quotes, as written */
    size_t id_len;
    bool id_escaped;   /* the id holds an escape: its bytes are not its value */
    const char *delta; /* the delta's bytes between its quotes, escapes and all */
    size_t delta_len;
};

/* Whether <line> (<len> bytes, without its '\n') is exactly in the coalesced form this module
 * writes, {"type":"TEXT_MESSAGE_CONTENT","messageId":"<id>","delta":"<delta>"} (or its
 * TOOL_CALL_ARGS twin with "toolCallId"), both strings valid as the scanner checks them (as jansson
 * reads them); then <d> points into <line> at its parts. Any other line (a kept event, even one of
 * these types written otherwise) gives false: parse it (its JSON after the mark, when it has one).
 * A line that begins with AGW_CAPTURE_MARK is taken to be one this module wrote: its id is read,
 * its delta is what lies between '"delta":"' and the '"}' that end the line, unscanned. Without
 * the mark the delta is scanned. For the store's thread, so that a content line is applied without
 * building a JSON value of its delta. */
bool agw_capture_line_delta(const char *line, size_t len, struct agw_capture_delta *d);
/* The same for the line at the start of <buf> (<avail> bytes of JSON Lines), whose end is not known
 * yet: true when it is such a line, followed by a '\n' or by the end of <buf>; its length (without
 * the '\n') in *<line_len>. One pass over the line: the store's thread need not look for its end
 * first. */
bool agw_capture_line_delta_at(const char *buf, size_t avail, struct agw_capture_delta *d,
                               size_t *line_len);

/* Members of an event line, read by the scanner (agw_capture_line_fields()): each the bytes
 * between its quotes (a string written without an escape: they are its value), or NULL when the
 * line does not have it. */
struct agw_capture_fields {
    const char *type, *message_id, *role;
    size_t type_len, message_id_len, role_len;
    bool more; /* a "name", "subagentRunId" or "metadata" member is there (what a message may
                  take from it) */
};

/* Whether the scanner reads <line> (<len> bytes, without its '\n') as jansson would, enough for
 * the store's thread to apply it without building JSON values: one JSON object (the whole syntax
 * checked, as for an event) whose "type" is a string and whose "messageId" and "role" are absent
 * or strings, none of the three written with an escape, and no key written with an escape nor one
 * of the scanner's keys given twice. Then <f> points into <line>, and says whether the line has
 * members a message takes besides those. False for anything else: parse the line. */
bool agw_capture_line_fields(const char *line, size_t len, struct agw_capture_fields *f);

/* Called by agw_capture_input_messages() for each element of a run's input's "messages": its bytes
 * (<msg>, <msg_len>: an object, as sent) and its "id" (<id>, <id_len>: the bytes between the
 * quotes of a string written without an escape). Returns false to stop. */
typedef bool agw_capture_message_fn(void *arg, const char *msg, size_t msg_len, const char *id,
                                    size_t id_len);

/* For the store's thread: reads a RunAgentInput <body> (<len> bytes) with the scanner and gives
 * <fn> each element of its "messages", in order, so that messages the thread holds already need no
 * JSON value. True only when the whole body reads as jansson reads it with JSON_REJECT_DUPLICATES
 * (one object, the whole syntax checked, no key given twice in any object), no key is written with
 * an escape, "messages" is there and is an array of objects each with an "id" that is a string
 * written without an escape, within the scanner's limits, and <fn> never returned false. False
 * for anything else: parse the body. <fn> may be called before the scanner gives up: it must
 * change nothing. */
bool agw_capture_input_messages(const char *body, size_t len, agw_capture_message_fn *fn,
                                void *arg);

#endif
