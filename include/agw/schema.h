/* What the official client accepts of an event: the AG-UI 1.0 event schemas, as @ag-ui/client 1.0
 * reads an event before it applies it (doc/protocol.md#events-the-client-accepts). The client
 * first drops what its schemas do not describe: members they do not name, an array element whose
 * kind ("role" of a message, "type" of a content part, "op" of a JSON Patch operation, ...) none
 * of them has, and an optional member of an unknown kind; then it checks the rest, and one event
 * that fails fails the client's whole run. The normaliser relays no event that would fail: it ends
 * the run with INVALID_EVENT and a message naming the member instead. Pure: no I/O, no logging.
 *
 * Events of a type the protocol does not have pass (the client drops them). "timestamp" is the
 * normaliser's (rule 8): not checked here. */
#ifndef AGW_SCHEMA_H
#define AGW_SCHEMA_H

#include <jansson.h>

#include "agw/common.h"

/* JavaScript's largest exact integer (2^53 - 1): the schemas' bound on integers. */
#define AGW_SCHEMA_MAX_INT 9007199254740991LL

/* Whether event <ev> (an object with a string "type") is one the client accepts. If not, false,
 * with a message naming the member in <why> ("TOOL_CALL_START without a string \"toolCallName\"",
 * "MESSAGES_SNAPSHOT \"messages[0].content\" must be a string"). */
bool agw_schema_check(const json_t *ev, char *why, size_t why_len);

/* Whether a null <key> of an event of <type> is a value the client accepts (STATE_SNAPSHOT's
 * "snapshot", CUSTOM's "value", RAW's "event"): the normaliser keeps such a null. */
bool agw_schema_keeps_null(const char *type, const char *key);

/* What the client holds of message <m> (an object) once its schemas have read it (a message a
 * MESSAGES_SNAPSHOT or a run's input carries whole): it drops the members they do not name (of the
 * message, a tool call, its function, a content part, a part's source), a content part of a kind
 * they do not know, and the message itself when its role is one they do not know (or a member it
 * requires is of an unknown kind). Returns -1 when it drops <m>, 1 when it holds less of <m>
 * (then, with <apply>, <m> is made so), 0 when it holds <m> as it is. Values the schemas take
 * whole (a "metadata", an activity's "content") are not looked into. */
int agw_schema_strip_message(json_t *m, bool apply);

/* Lists what the tables say of every event and every object an event may hold, for the tests that
 * hold them against the client's own schemas (tests/interop/client_schemas.txt): <fn> gets each
 * object's path ("RUN_FINISHED.outcome{type=interrupt}.interrupts[]": a member's name after a
 * dot, [] for an array's elements, {<key>=<value>} for the kind an object is of) and the names of
 * its members, sorted, separated by a space. */
typedef void agw_schema_walk_fn(void *arg, const char *path, const char *members);
void agw_schema_walk(agw_schema_walk_fn *fn, void *arg);

/* One member of an event made only of strings, integers and booleans (the normaliser's fast path
 * reads such events without building them). */
enum agw_schema_flat { AGW_FLAT_STRING, AGW_FLAT_INT, AGW_FLAT_BOOL };

/* A string as the fast path reads it: its bytes between the quotes (<p> NULL: absent), <escaped>
 * when they hold an escape. */
struct agw_schema_span {
    const char *p;
    size_t n;
    bool escaped;
};

/* The string members the fast path holds apart by name, in this order (the names:
 * agw_schema_span_keys). */
enum agw_schema_spans {
    AGW_SPAN_MESSAGE_ID,
    AGW_SPAN_TOOL_CALL_ID,
    AGW_SPAN_STEP_NAME,
    AGW_SPAN_DELTA,
    AGW_SPAN_ROLE,
    AGW_SPAN_THREAD_ID,
    AGW_SPAN_RUN_ID,
    AGW_SPAN_SUBAGENT_RUN_ID,
    AGW_N_SPANS
};

extern const char *const agw_schema_span_keys[AGW_N_SPANS];

struct agw_schema_member {
    const char *key; /* its bytes between the quotes, unescaped */
    size_t key_len;
    enum agw_schema_flat kind;
    const char *s; /* a string's bytes between the quotes; NULL when it holds an escape */
    size_t n;
};

/* Whether a flat event of type <type> (<type_len> bytes, unescaped) is one the client accepts: its
 * string members named in agw_schema_span_keys in <spans>, the others (its "type" and "timestamp"
 * aside) in <m> (<n>). False also where only a full check can tell (an integer member other than
 * "timestamp", an escaped string compared with a set of values): the caller then checks the event
 * with agw_schema_check(). */
bool agw_schema_flat_ok(const char *type, size_t type_len,
                        const struct agw_schema_span spans[AGW_N_SPANS],
                        const struct agw_schema_member *m, size_t n);

#endif
