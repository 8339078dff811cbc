/* AG-UI stream normalisation (doc/protocol.md#lifecycle, #in-band-errors, #dialects): whatever an
 * upstream sends, the client receives one stream that @ag-ui/client's verifier accepts. Pure: it
 * judges an upstream's events one by one (the data of its SSE frames) and hands what the client
 * gets to a sink, event by event, as JSON: the upstream's own bytes when an event passes unchanged
 * (the caller may then relay the frame it read), rewritten bytes, nothing for a dropped event, and
 * the events it makes itself. It knows events, not their framing: no SSE, no sockets, no timers.
 *
 * One struct agw_agui per run, owned by the relay. Its rules, in short:
 * - exactly one RUN_STARTED first, carrying the client's threadId/runId (injected when missing,
 * rewritten when different); RUN_FINISHED carries them too;
 * - open text messages, tool calls, reasoning messages and steps are closed before the terminal
 * event, whatever it is (RUN_FINISHED, an upstream RUN_ERROR, or the gateway's: cancel, shutdown,
 * timeout, a cut stream);
 * - exactly one terminal event (RUN_FINISHED or RUN_ERROR); nothing is written after it;
 * - "[DONE]" and empty TEXT_MESSAGE_CONTENT deltas are dropped; non-JSON data → RUN_ERROR
 * INVALID_EVENT;
 * - CloudBase fixes: RUN_ERROR {error:{code,message}} → {message,code}; TEXT_MESSAGE_START without
 * role → role "assistant"; TOOL_CALL_START with "args" → TOOL_CALL_START + TOOL_CALL_ARGS;
 * - unknown and extension events pass through; a frame that needs no change is written with the
 * upstream's own data bytes, not re-serialised;
 * - events the gateway makes carry the client's ids, an integer "timestamp" (ms) and never a null
 * field; upstream events lose null-valued top-level fields and get float timestamps truncated to
 * integers. */
#ifndef AGW_AGUI_H
#define AGW_AGUI_H

#include "agw/common.h"
#include "agw/config.h"

struct agw_agui;

/* Where the events for the client go, in order. <json> is one compact JSON object (no line break),
 * valid during the call only. <pass> is true when <json> is exactly the data just fed (the same
 * bytes at the same address): the upstream's event relayed unchanged. */
struct agw_agui_sink {
    void (*emit)(void *arg, const char *json, size_t len, bool pass);
    void *arg;
};

/* In-band error codes of doc/protocol.md#in-band-errors (static strings, compare by pointer or by
 * text). */
extern const char AGW_AGUI_UPSTREAM_ERROR[];  /* "UPSTREAM_ERROR" */
extern const char AGW_AGUI_TIMEOUT[];         /* "TIMEOUT" */
extern const char AGW_AGUI_FRAME_TOO_LARGE[]; /* "FRAME_TOO_LARGE" */
extern const char AGW_AGUI_INVALID_EVENT[];   /* "INVALID_EVENT" */
extern const char AGW_AGUI_CANCELLED[];       /* "CANCELLED" */
extern const char AGW_AGUI_SHUTDOWN[];        /* "SHUTDOWN" */

/* Copies <thread_id> and <run_id> (valid UTF-8, asserted). Owned by the caller. */
struct agw_agui *agw_agui_new(const char *thread_id, const char *run_id,
                              enum agw_protocol protocol);
void agw_agui_free(struct agw_agui *a);

/* Feeds the data of one upstream frame (<data> need not be NUL-terminated). Hands zero or more
 * events to <out>. Returns 0, or 1 when the run reached its terminal event during this call (the
 * caller should then stop reading the upstream and end the response). After the terminal event
 * every further feed is ignored and returns 1. */
int agw_agui_feed(struct agw_agui *a, const char *data, size_t len,
                  const struct agw_agui_sink *out);

/* What a fast path read of the content event the sink is being given (agw_agui_emitting_content(),
 * inside emit()): a TEXT_MESSAGE_CONTENT or REASONING_MESSAGE_CONTENT (<args> false) or
 * TOOL_CALL_ARGS (<args> true) event whose
 * id and delta are these string tokens, quotes included, inside the event's bytes: the id written
 * without an escape, the delta a JSON string that jansson reads (the fast path's scanner is
 * stricter: no \u0000, no surrogate escape, valid UTF-8). So a sink that keeps deltas (the thread
 * history's capture) need not scan the event again. */
struct agw_agui_content {
    bool args;
    const char *id, *delta;
    size_t id_len, delta_len;
};
/* Inside the sink's emit(): true, with <c> filled, when the event being emitted is such a content
 * event read by a fast path; false for any other (another type, or an event the full path wrote).
 */
bool agw_agui_emitting_content(const struct agw_agui *a, struct agw_agui_content *c);
/* Inside the sink's emit(): true when the event being emitted is one a fast path read whole, and
 * writes as it read it, as a flat object of another kind than content (a run's start or end, an
 * item's start or end, any other event relayed unchanged): one JSON object whose members are
 * strings, integers and booleans, no key escaped, no line break, "type" given once. <type> and
 * <len> get that type's bytes between its quotes, inside the event's bytes, written without an
 * escape: what jansson reads as the event's "type". False for any other event. So a sink that sorts
 * events by type (the thread history's capture) need not scan them again. */
bool agw_agui_emitting_type(const struct agw_agui *a, const char **type, size_t *len);

/* For tests: with <on> false, every frame goes through the full path (parsed by jansson), never the
 * allocation-free fast paths, whose output must be the same. On by default. */
void agw_agui_set_fast_paths(struct agw_agui *a, bool on);
/* For tests: the content events read from their delta on, everything before it being the bytes of
 * the item's content event before (the cheapest of the fast paths). */
uint64_t agw_agui_cached_reads(const struct agw_agui *a);

/* The upstream's stream ended (EOF or end of body). Writes what the run still needs: RUN_STARTED if
 * nothing was sent, then the end of anything open, then RUN_FINISHED when the stream was clean, or
 * RUN_ERROR UPSTREAM_ERROR when it was cut inside a text message, tool call or reasoning message.
 * No-op after the terminal event. */
void agw_agui_end(struct agw_agui *a, const struct agw_agui_sink *out);

/* Ends the run with RUN_ERROR {"message":<message>,"code":<code>} (RUN_STARTED first if nothing was
 * sent yet, and the end event of everything still open). No-op after the terminal event. */
void agw_agui_fail(struct agw_agui *a, const char *code, const char *message,
                   const struct agw_agui_sink *out);

/* True once the terminal event has been written. */
bool agw_agui_finished(const struct agw_agui *a);
/* Number of events written to the client so far. */
uint64_t agw_agui_events_out(const struct agw_agui *a);
/* "RUN_FINISHED", "RUN_ERROR:<code>" ("RUN_ERROR" when the error had no code; a long code is cut),
 * or NULL while running: how the run ended, for logs. Owned by <a>, unchanged until
 * agw_agui_free(). */
const char *agw_agui_outcome(const struct agw_agui *a);

#endif
