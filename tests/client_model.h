/* A model of the official client's rules that are not schemas, for the tests and fuzz targets to
 * check the gateway's output against (written from the client's verifier, not from src/agui.c). */
#ifndef AGW_TESTS_CLIENT_MODEL_H
#define AGW_TESTS_CLIENT_MODEL_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

/* The four tables of client_owner_rule(), empty. */
static json_t *client_owners_new(void)
{
    return json_pack("{s:{},s:{},s:{},s:{}}", "message", "toolCall", "reasoning", "activity");
}

/* The client's record of who opened each message, tool call, reasoning message and activity (the
 * agent itself: JSON null; a sub-agent run: its id), and its checks: NULL when <ev> (<type>) passes
 * them, else why not. <own> holds the four tables
 * (client_owners_new()). */
static const char *client_owner_rule(json_t *own, const char *type, json_t *ev)
{
    static char why[256];
    json_t *msg = json_object_get(own, "message"), *tc = json_object_get(own, "toolCall");
    json_t *rs = json_object_get(own, "reasoning"), *act = json_object_get(own, "activity");
    json_t *sub = json_object_get(ev, "subagentRunId");
    json_t *opener = json_is_string(sub) ? sub : json_null();
    const char *mid = json_string_value(json_object_get(ev, "messageId"));
    const char *tid = json_string_value(json_object_get(ev, "toolCallId"));
    json_t *map = NULL, *o;
    const char *id = NULL;

#define SAME(x, y) (json_is_null(x) ? json_is_null(y) : json_equal(x, y))
#define CHECK(m, i)                                                                                \
    do {                                                                                           \
        json_t *o_ = (i) != NULL ? json_object_get(m, i) : NULL;                                   \
        if (json_is_string(sub) && o_ != NULL && !SAME(o_, sub)) {                                 \
            snprintf(why, sizeof(why), "%s for '%s' by '%s', opened by another", type, i,          \
                     json_string_value(sub));                                                      \
            return why;                                                                            \
        }                                                                                          \
    } while (0)
#define SET(m, i, v, replace)                                                                      \
    do {                                                                                           \
        if ((replace) || json_object_get(m, i) == NULL)                                            \
            json_object_set(m, i, v);                                                              \
    } while (0)

    if (strcmp(type, "RUN_STARTED") == 0 || strcmp(type, "MESSAGES_SNAPSHOT") == 0) {
        bool replace = type[0] == 'M';
        json_t *ms = replace ? json_object_get(ev, "messages")
                             : json_object_get(json_object_get(ev, "input"), "messages");
        size_t i, j;
        json_t *m, *call;
        json_array_foreach(ms, i, m)
        {
            const char *role = json_string_value(json_object_get(m, "role"));
            json_t *ms_sub = json_object_get(m, "subagentRunId");
            json_t *who = json_is_string(ms_sub) ? ms_sub : json_null();
            if ((id = json_string_value(json_object_get(m, "id"))) == NULL)
                continue;
            map = role != NULL && strcmp(role, "reasoning") == 0  ? rs
                  : role != NULL && strcmp(role, "activity") == 0 ? act
                                                                  : msg;
            SET(map, id, who, replace);
            json_array_foreach(json_object_get(m, "toolCalls"), j, call)
            {
                const char *cid = json_string_value(json_object_get(call, "id"));
                if (cid != NULL)
                    SET(tc, cid, who, replace);
            }
        }
    } else if (strcmp(type, "TEXT_MESSAGE_START") == 0) {
        CHECK(msg, mid);
        SET(msg, mid, opener, false);
    } else if (strcmp(type, "TEXT_MESSAGE_CONTENT") == 0 || strcmp(type, "TEXT_MESSAGE_END") == 0) {
        CHECK(msg, mid);
    } else if (strcmp(type, "TOOL_CALL_START") == 0) {
        const char *parent = json_string_value(json_object_get(ev, "parentMessageId"));
        json_t *p = parent != NULL ? json_object_get(msg, parent) : NULL;
        if (p != NULL && json_is_string(sub) && !SAME(p, sub)) {
            snprintf(why, sizeof(why), "TOOL_CALL_START '%s' by '%s' under another's message", tid,
                     json_string_value(sub));
            return why;
        }
        if ((o = json_object_get(tc, tid)) != NULL) {
            CHECK(tc, tid);
            if (!json_is_string(sub) && p != NULL && !SAME(p, o)) {
                snprintf(why, sizeof(why), "TOOL_CALL_START '%s' and its message: two openers",
                         tid);
                return why;
            }
        } else {
            SET(tc, tid, json_is_string(sub) || p == NULL ? opener : p, false);
        }
    } else if (strcmp(type, "TOOL_CALL_ARGS") == 0 || strcmp(type, "TOOL_CALL_END") == 0) {
        CHECK(tc, tid);
    } else if (strcmp(type, "REASONING_START") == 0 ||
               strcmp(type, "REASONING_MESSAGE_START") == 0) {
        CHECK(rs, mid);
        SET(rs, mid, opener, false);
    } else if (strcmp(type, "REASONING_MESSAGE_CONTENT") == 0 ||
               strcmp(type, "REASONING_MESSAGE_END") == 0 || strcmp(type, "REASONING_END") == 0) {
        CHECK(rs, mid);
    } else if (strcmp(type, "ACTIVITY_SNAPSHOT") == 0) {
        if (mid != NULL)
            SET(act, mid, opener, !json_is_false(json_object_get(ev, "replace")));
    } else if (strcmp(type, "ACTIVITY_DELTA") == 0) {
        CHECK(act, mid);
    } else if (strcmp(type, "TOOL_CALL_RESULT") == 0) {
        if (mid != NULL)
            SET(msg, mid, opener, true);
    } else if (strcmp(type, "REASONING_ENCRYPTED_VALUE") == 0) {
        const char *st = json_string_value(json_object_get(ev, "subtype"));
        id = json_string_value(json_object_get(ev, "entityId"));
        map = st != NULL && strcmp(st, "tool-call") == 0 ? tc
              : st != NULL && strcmp(st, "message") == 0 && id != NULL &&
                      json_object_get(msg, id) != NULL
                  ? msg
                  : rs;
        CHECK(map, id);
    }
#undef SAME
#undef CHECK
#undef SET
    return NULL;
}

#endif
