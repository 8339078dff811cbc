/* Thread history (doc/protocol.md#history): the messages of one thread, rebuilt the way the
 * official client (@ag-ui/client 1.0.0) rebuilds them, so that the gateway can hand a conversation
 * back to any frontend. Pure: no I/O, no event loop, no logging; the rules are in
 * doc/internals/history.md.
 *
 * A thread is an ordered list of AG-UI messages, each a JSON object exactly as the client holds it
 * ({id, role, content, toolCalls: [{id, type, function: {name, arguments}}], toolCallId, ...}),
 * and, beside each message (never inside it), the id of the run that produced it. Two things change
 * it:
 * - agw_history_merge_input(): the `messages` of a run's RunAgentInput, deduplicated by id (clients
 * resend their whole history on every run);
 * - agw_history_apply(): the run's relayed events, in order (text messages, tool calls, tool
 * results, message snapshots). It never holds more than <max_messages>: the oldest are dropped.
 *
 * Ownership: one struct agw_history per thread, owned by its creator; not thread-safe (the owner
 * serialises calls, even of the functions that take it const: a message held as text is parsed
 * when first asked for). Unlike elsewhere (a json_t never outlives its function), the thread holds
 * its messages as jansson values for its whole life: they are the data, edited in place event by
 * event; except a text message that only content deltas have touched so far, held as its JSON text
 * (its deltas appended as the escaped bytes they came as) until something needs it as a value.
 * Every json_t it holds is its own (deep copies of what it was given); what it hands out is
 * borrowed, valid until the next call that changes the thread.
 *
 * For a store that writes each message apart (doc/internals/store.md), a message has a position
 * in the thread's life, agw_history_dropped() + its index, which only an insertion before it or a
 * snapshot changes, and the thread knows which messages changed (were made, edited or moved) since
 * the store last saved it. */
#ifndef AGW_HISTORY_H
#define AGW_HISTORY_H

#include <jansson.h>

#include "agw/common.h"
#include "agw/input.h"  /* struct agw_input_message */
#include "agw/router.h" /* AGW_ID_MAX */

struct agw_history;

/* A new, empty thread that keeps at most <max_messages> (>= 1, asserted) messages. */
struct agw_history *agw_history_new(size_t max_messages);
/* Frees the thread and every message in it; NULL is a no-op. */
void agw_history_free(struct agw_history *h);

/* Merges <messages> (a RunAgentInput's `messages`, borrowed) sent by the client for run <run_id>
 * (copied; may be NULL). A message whose id the thread knows replaces the stored one in place when
 * it differs (it keeps the run id it had); a new id is added with <run_id>: at the end, in the
 * order given, except new messages given before the first known one, which go just before it
 * (history older than what the thread holds). Elements that are not an object with a string "id"
 * are skipped and counted as malformed. Returns the number of messages added or replaced, or
 * -AGW_EINVAL when <messages> is not an array (nothing changes, counted as malformed). */
int agw_history_merge_input(struct agw_history *h, const char *run_id, const json_t *messages);

/* agw_history_merge_input() of the "messages" of a RunAgentInput <body> (<len> bytes) read with
 * JSON_REJECT_DUPLICATES, run <run_id> (may be NULL). Messages the thread holds already, byte for
 * byte (a client resends its whole history), are found without building JSON values: the body is
 * read by the capture's scanner (agw_capture_input_messages()) and only the other messages are
 * parsed; a body the scanner does not read is parsed whole. Returns the number of messages added
 * or replaced (0 when the body has no "messages", or when it is not an array: then counted as
 * malformed, as by agw_history_merge_input()), or -AGW_EINVAL when the body is not JSON (nothing
 * changes, not counted: the caller counts it). */
int agw_history_merge_body(struct agw_history *h, const char *run_id, const char *body, size_t len);
/* agw_history_merge_body() of a body the input's scanner has read (agw_input_parse(): its
 * messages_read): its <n> messages at <m>, each an object with a plain string id. The same result,
 * without reading the body again. */
int agw_history_merge_read(struct agw_history *h, const char *run_id, const char *body,
                           const struct agw_input_message *m, size_t n);

/* Applies one relayed event (<event>, borrowed) of run <run_id> (copied when a message is made;
 * may be NULL). Returns 1 when the messages changed, 0 when the event leaves them as they are (a
 * type that makes no message, an end event, an id the thread does not know: the client ignores
 * those too), or -AGW_EINVAL when the event is malformed (not an object with a string "type", or a
 * field the rule needs missing or of the wrong type): nothing changes and it is counted. */
int agw_history_apply(struct agw_history *h, const char *run_id, const json_t *event);

/* Applies one line of a run's capture (agw_capture_take()): a text's coalesced deltas
 * (agw_capture_line_delta()) are appended as they are to a message held as text
 * (agw_history_append_text()); any other line is parsed and applied (agw_history_apply()). The
 * thread is the one agw_history_apply() of the parsed line would make. A line that begins with
 * AGW_CAPTURE_MARK must be a coalesced line as the capture wrote it (its delta is not scanned);
 * its JSON follows the mark. Returns what agw_history_apply() returns; -AGW_EINVAL (counted) for
 * a line that is not JSON. */
int agw_history_apply_line(struct agw_history *h, const char *run_id, const char *line, size_t len);
/* agw_history_apply_line() of each line of <lines> (<len> bytes of JSON Lines, as
 * agw_capture_take() hands them over; empty lines skipped). Returns how many were refused. */
int agw_history_apply_lines(struct agw_history *h, const char *run_id, const char *lines,
                            size_t len);

/* The fast path for a coalesced content line of a run's capture (agw_capture_line_delta()): what
 * agw_history_apply() does with {"type":"TEXT_MESSAGE_CONTENT","messageId":<id>,"delta":"<delta>"},
 * where <id> (<id_len> bytes, no escape in it) is the id and <delta> (<delta_len>
 * bytes) the body of a valid JSON string, escapes and all, that is appended as it is. Returns 1
 * (appended), 0 (no message has that id: nothing changes), or AGW_AGAIN when the message is not
 * held as text (nothing changes: apply the parsed event instead). */
int agw_history_append_text(struct agw_history *h, const char *id, size_t id_len, const char *delta,
                            size_t delta_len);

/* Number of messages held. */
size_t agw_history_count(const struct agw_history *h);
/* The <i>-th message, oldest first (borrowed, do not change it), or NULL when <i> is out of range.
 */
const json_t *agw_history_message(struct agw_history *h, size_t i);
/* The id of the run that produced the <i>-th message (borrowed), or NULL when it has none or <i> is
 * out of range. */
const char *agw_history_run_id(const struct agw_history *h, size_t i);
/* Messages dropped so far (oldest first) to stay within <max_messages>. */
uint64_t agw_history_dropped(const struct agw_history *h);
/* Malformed events and input messages ignored so far (not saved by agw_history_dump()). */
uint64_t agw_history_malformed(const struct agw_history *h);
/* Input messages read from a body's bytes that were parsed into a value so far: a resent copy
 * equal to the stored message, or a new one held as text, needs none (for tests). */
uint64_t agw_history_values_parsed(const struct agw_history *h);
/* The thread's index by id agrees with its messages (each at its position, found where the index
 * says): for tests. */
bool agw_history_index_ok(const struct agw_history *h);

/* The thread as one compact JSON text, NUL-terminated (schema 1 of the store kept it; now the
 * migration of such a store reads it, and tests compare threads with it):
 * {"v":1,"dropped":N,"messages":[{"run_id":"r1"|null,"message":{...}},...]}. The caller frees it
 * with free(). */
char *agw_history_dump(struct agw_history *h);
/* A thread read back from what agw_history_dump() wrote (<len> bytes at <data>), keeping at most
 * <max_messages> (the newest when the dump holds more). NULL when the text is not such a dump. */
struct agw_history *agw_history_load(const char *data, size_t len, size_t max_messages);

/* ---- for a store that writes each message apart ------------------------------------------- */

/* The index of the first message changed since agw_history_mark_saved() (or since the thread was
 * made), or agw_history_count() when none is. */
size_t agw_history_first_changed(const struct agw_history *h);
/* Whether the <i>-th message changed since agw_history_mark_saved(); false out of range. */
bool agw_history_changed(const struct agw_history *h, size_t i);
/* The <i>-th message (< agw_history_count(), asserted) as compact JSON, *<len> bytes and a NUL;
 * borrowed, valid until the thread changes or is marked saved. A message held as text is its text;
 * another is dumped once. */
const char *agw_history_message_json(struct agw_history *h, size_t i, size_t *len);
/* What a store writes for a changed message, as pieces: the message's JSON is its pieces' bytes,
 * in order, followed by '"}' when <text>. A text message grows by content deltas: once saved, what
 * it grew by is written as its next piece, so that a text streamed over many commits is written
 * once, not again at each commit. */
struct agw_history_row {
    const char *data; /* borrowed: valid until the thread changes or is marked saved */
    size_t len;
    unsigned part;   /* 0: the whole message; k > 0: the bytes appended to its pieces 0..k-1 */
    bool text;       /* the pieces lack the closing '"}' (a text message, held as text) */
    bool drop_parts; /* part 0 of a message stored in several pieces: the others go */
};
/* The row to write for the <i>-th message (< agw_history_count(), asserted), changed. */
void agw_history_message_row(struct agw_history *h, size_t i, struct agw_history_row *r);
/* Every message is as the store holds it now (after the rows of the changed ones were written). */
void agw_history_mark_saved(struct agw_history *h);

/* Shedding: a store that can read a saved message back lets the thread forget the bytes of saved
 * texts (the answers streamed by agents: most of a thread's bytes). agw_history_shed() drops from
 * memory, of every text message as saved with at least <min_bytes> saved bytes in memory, those
 * bytes, keeping their length and a hash (what a client's copy of the message is compared with);
 * what it grows by later stays in memory until the next shedding. Anything that needs a shed
 * text's bytes (a value made of it, a page, a dump, a move to another position, a comparison that
 * the length and hash do not settle) reads them back with <fn>(<arg>, <pos>, &<data>, &<len>): the
 * bytes the store holds for position <pos> (its pieces put together, at least what was shed, and a
 * NUL after them, in a block from malloc() that the thread frees), returning 0, or non-zero when
 * they cannot be read. Saved values (messages held as jansson values: user messages, tool results…)
 * are shed whatever their size, unless they have tool calls: their trees cost more than their
 * bytes; the thread keeps their length, hash and role.
 * Those that cannot be read back, or that are not what was shed, are counted
 * (agw_history_load_errors()): the message is then held as {"id": <id>} and the thread is not to
 * be trusted (a store drops it and reads it back from what it saved). Returns the bytes freed. No
 * loader set: nothing is shed. A call looks only at the messages changed (or ended) since the
 * last one: <min_bytes> is meant to stay the same from call to call. */
typedef int agw_history_load_fn(void *arg, uint64_t pos, char **data, size_t *len);
void agw_history_set_loader(struct agw_history *h, agw_history_load_fn *fn, void *arg);
size_t agw_history_shed(struct agw_history *h, size_t min_bytes);
uint64_t agw_history_load_errors(const struct agw_history *h);
/* Bytes held for the thread's texts and JSON dumps (its messages' values not counted). */
size_t agw_history_text_bytes(const struct agw_history *h);

/* A thread read back from a store, message by message: a new thread keeping at most
 * <max_messages>, whose first message will be at position <dropped> (the messages dropped before
 * it); then agw_history_restore_message() for each stored message, oldest first. */
struct agw_history *agw_history_restore(size_t max_messages, uint64_t dropped);
/* Appends the stored message of run <run_id> (may be NULL) stored at position <pos>: <r> gives its
 * pieces' bytes put together (<data>, <len>: a JSON object with a string "id", followed by '"}'
 * when <text>), and in <part> how many pieces the store holds. A text stays a text (it may grow by
 * pieces). It is not changed (it is as saved) when <pos> is its position in the thread; else it is
 * (a store writes it again, whole, where it belongs). Past <max_messages>, the oldest are dropped.
 * Returns 0, or -AGW_EINVAL when the bytes are not such an object (nothing changes). */
int agw_history_restore_message(struct agw_history *h, uint64_t pos, const char *run_id,
                                const struct agw_history_row *r);

/* ---- paging (GET /v1/ag-ui/threads/{id}/messages, doc/internals/history.md#paging) ---------- */

#define AGW_HISTORY_LIMIT_DEFAULT 50
#define AGW_HISTORY_LIMIT_MAX     200
/* The bytes a page's messages may take (as compact JSON), however few they are: a page stops before
 * the message that would take it past this, the first message excepted (one larger message comes
 * alone). Bounds the memory and the answer of one read whatever the thread holds. */
#define AGW_HISTORY_PAGE_BYTES ((size_t)4 << 20)

/* One page request, parsed from the query string by agw_history_query_parse(). Cursors are
 * exclusive message indices in the thread (0 = oldest). No pointer inside: it may be copied. */
struct agw_history_query {
    size_t limit;                /* 1..AGW_HISTORY_LIMIT_MAX */
    bool has_after;              /* only messages with index > after */
    bool has_before;             /* only messages with index < before */
    size_t after, before;        /* meaningful when has_after / has_before */
    bool desc;                   /* newest first; false = oldest first (the default) */
    char run_id[AGW_ID_MAX + 1]; /* "" = every run; else only messages of this run */
    size_t max_bytes;            /* AGW_HISTORY_PAGE_BYTES (not a query parameter; >= 1) */
};

/* Parses <query_string> (the raw query of the request target, without the '?'; NULL or "" = all
 * defaults) into <q>: '&'-separated name=value pairs, names and values percent-decoded (%XX in
 * either case, '+' is a space as in application/x-www-form-urlencoded), empty pairs skipped.
 * Parameters: limit (an integer, default AGW_HISTORY_LIMIT_DEFAULT, clamped to
 * 1..AGW_HISTORY_LIMIT_MAX, so 0 and negative numbers mean 1), after and before (non-negative
 * integers; values past SIZE_MAX saturate), order (asc or desc), run_id (1..AGW_ID_MAX bytes, no
 * NUL). Returns 0, or -AGW_EINVAL with a message for a 400 answer in <err> (may be NULL) and <q>
 * reset to the defaults, for: an unknown parameter (named), a parameter given twice, a bad %
 * escape, a value that is not what its parameter takes. after >= before is not an error: the page
 * is empty. */
int agw_history_query_parse(const char *query_string, struct agw_history_query *q, char *err,
                            size_t errlen);

/* One page of the thread, as the endpoint's body (the caller owns it, json_decref()):
 * {"messages":[...],"has_more":bool,"next_cursor":int,"prev_cursor":int}, a cursor left out
 * (never null) when it has no value.
 * The candidates are the messages with after < index < before (each bound when given) whose run is
 * <q->run_id> (when given; a message with no run never matches). The page is the <q->limit>
 * candidates nearest the cursor the client reads away from: in asc order the lowest ones, except
 * with only `before` given, where it is the highest ones (the page just before that cursor); in
 * desc order the highest ones, except with only `after` given, where it is the lowest ones (the
 * page just after that cursor). Messages come in the order asked, as deep copies (the page never
 * shares a json_t with the thread, so it outlives later changes to it). The page ends early, as if
 * <q->limit> were smaller, before a message that would take the page's messages past
 * <q->max_bytes> bytes of compact JSON; never before its first.
 * - has_more: candidates remain beyond the page in the reading direction (inside the bounds).
 * - next_cursor: the index of the page's last message, to pass as `after` (asc) or `before` (desc)
 *   for the next page, when the thread holds a message of <q->run_id> beyond it (even past the
 *   bounds given); else left out. Always there when has_more is true.
 * - prev_cursor: the index of the page's first message, to pass as `before` (asc) or `after`
 *   (desc) for the page before, when the thread holds a message of <q->run_id> before it in the
 *   reading direction; else left out (the page starts the thread).
 * An empty page has neither cursor. <q->limit> must be 1..AGW_HISTORY_LIMIT_MAX (asserted). */
json_t *agw_history_page(struct agw_history *h, const struct agw_history_query *q);
/* (NULL when a shed text of the page cannot be read back: see agw_history_shed().) */

#endif
