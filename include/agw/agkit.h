/* The legacy AG-Kit send-message dialect (doc/dialects.md), translated both ways for an agent whose
 * backend speaks it ("protocol": "ag-kit"): the client's RunAgentInput becomes the legacy request,
 * and the backend's legacy events become AG-UI events, which the normaliser (agui.h) then treats
 * like any backend's. Pure: JSON in, JSON out.
 *
 * Ownership: a translator is owned by its run's normaliser; every string handed to a callback is
 * valid during the call only. */
#ifndef AGW_AGKIT_H
#define AGW_AGKIT_H

#include "agw/common.h"

#define AGW_AGKIT_ERR_MAX 256

/* RunAgentInput (already validated) → the legacy request body: {"conversationId": threadId,
 * "messages": the messages the backend has not seen, without ids, "tools": [{name, description,
 * parameters as a JSON string}], "resume": {interruptId, payload}}. The backend has seen every
 * message up to its own last answer: the messages after the last assistant message are sent, all of
 * them when there is none. Returns an allocated body in *<out> (its length in *<out_len>), or NULL
 * with the reason in <err>. */
char *agw_agkit_request(const char *body, size_t len, size_t *out_len, char *err, size_t errlen);

struct agw_agkit;

/* Receives each AG-UI event the translation makes: one compact JSON object. */
typedef void agw_agkit_emit_fn(void *arg, const char *json, size_t len);

/* <run_id> names the messages the translation makes ("<run_id>-msg-1", …); copied. */
struct agw_agkit *agw_agkit_new(const char *run_id);
void agw_agkit_free(struct agw_agkit *t);

/* Translates one legacy event (the data of one SSE frame): "text" → TEXT_MESSAGE_START (for a new
 * message) and TEXT_MESSAGE_CONTENT; "tool-call-start|args|end" → TOOL_CALL_*; "tool-result" →
 * TOOL_CALL_RESULT; "interrupt" → RUN_FINISHED with an interrupt outcome; "[DONE]" → RUN_FINISHED.
 * An open text message is ended (TEXT_MESSAGE_END) before any other event. Data that is not a JSON
 * object with a string "type" is handed on as it is (the normaliser rejects it); other legacy types
 * are dropped. Returns 1 when the translation ended the run (RUN_FINISHED), else 0. */
int agw_agkit_feed(struct agw_agkit *t, const char *data, size_t len, agw_agkit_emit_fn *emit,
                   void *arg);

/* The stream ended: ends an open text message. */
void agw_agkit_end(struct agw_agkit *t, agw_agkit_emit_fn *emit, void *arg);

/* ---- legacy clients (POST /v1/ag-kit/agents/{agent_id}/send-message) ---- */

/* The legacy request's conversationId, copied into <out> (<outlen> bytes with the NUL): 1 when it
 * has one, 0 when it has none (the gateway makes one), -AGW_EINVAL when it is not a non-empty
 * string that fits (or the body is not a JSON object). */
int agw_agkit_legacy_thread(const char *body, size_t len, char *out, size_t outlen);

/* The legacy request → a RunAgentInput for an AG-UI backend, which needs the whole conversation:
 * the thread's messages so far (<history>: a page of the thread-history endpoint, newest first, or
 * NULL) followed by the request's messages (ids "<run_id>-in-<n>"), tools with their parameters
 * parsed, resume {interruptId, payload} as resume [{…}]. Returns an allocated body, or NULL with
 * the reason in <err> (the request is not a valid legacy request: 400). */
char *agw_agkit_legacy_to_input(const char *body, size_t len, const char *thread_id,
                                const char *run_id, const char *history, size_t history_len,
                                size_t *out_len, char *err, size_t errlen);

/* One AG-UI event of the client's stream (after normalisation) → the legacy events a legacy client
 * reads: TEXT_MESSAGE_CONTENT → text, TOOL_CALL_* → tool-call-*, TOOL_CALL_RESULT → tool-result,
 * RUN_FINISHED → an interrupt per interrupt of its outcome, then "[DONE]"; RUN_ERROR → an "error"
 * event {code, message} (the legacy protocol has none; the stream then ends without "[DONE]");
 * anything else is not shown. Returns 1 for the run's last event, else 0. */
int agw_agkit_to_legacy(const char *json, size_t len, agw_agkit_emit_fn *emit, void *arg);

#endif
