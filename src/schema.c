/* What the official client accepts of an event (include/agw/schema.h): the AG-UI 1.0 event
 * schemas as tables, read the way @ag-ui/client 1.0 reads them. */
#include "config.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agw/schema.h"

/* What a member holds. */
enum kind {
    K_STRING,
    K_ENUM,    /* a string among the field's <values> */
    K_POINTER, /* a string that is a JSON Pointer (RFC 6901): "" or "/…", '~' only as ~0 or ~1 */
    K_BOOL,
    K_COUNT,   /* an integer from 0 to AGW_SCHEMA_MAX_INT */
    K_OBJECT,  /* an object, whatever its members */
    K_ANY,     /* any value, null included */
    K_NONNULL, /* any value but null */
    K_STRINGS, /* an array of strings */
    K_NODE,    /* an object read by the field's <node> */
    K_NODES,   /* an array of objects read by <node> */
    K_NODES1,  /* the same, with at least one left once the client dropped what it drops */
    K_CONTENT, /* a string, or an array of content parts */
};

struct node;

struct field {
    const char *key; /* NULL: the end of a list */
    unsigned char key_len;
    unsigned char kind;
    bool required;
    const char *const *values; /* K_ENUM */
    const struct node *node;   /* K_NODE, K_NODES, K_NODES1 */
};

/* An object's members, told apart by the string member <disc> when it is not NULL: the variant
 * of that name (a list ended by a NULL name). An object of no variant is dropped by the client:
 * an array's element goes, an optional member goes, a required member takes its owner with it. */
struct variant {
    const char *name;
    const struct field *fields;
};

struct node {
    const char *disc;
    const struct variant *variants; /* with <disc> NULL: one, its name unused */
};

/* clang-format off */
#define REQ(k, kind)      {k, sizeof(k) - 1, kind, true, NULL, NULL}
#define OPT(k, kind)      {k, sizeof(k) - 1, kind, false, NULL, NULL}
#define REQ_ENUM(k, v)    {k, sizeof(k) - 1, K_ENUM, true, v, NULL}
#define OPT_ENUM(k, v)    {k, sizeof(k) - 1, K_ENUM, false, v, NULL}
#define REQ_NODE(k, t, n) {k, sizeof(k) - 1, t, true, NULL, n}
#define OPT_NODE(k, t, n) {k, sizeof(k) - 1, t, false, NULL, n}
#define END               {NULL, 0, 0, false, NULL, NULL}
#define TYPE(t)           t, sizeof(t) - 1
/* clang-format on */

/* ---- messages and their parts ---------------------------------------------------------------- */

static const struct field DATA_SOURCE[] = {REQ("value", K_STRING), REQ("mimeType", K_STRING), END};
static const struct field URL_SOURCE[] = {REQ("value", K_STRING), OPT("mimeType", K_STRING), END};
static const struct field FILE_SOURCE[] = {REQ("value", K_STRING), OPT("provider", K_STRING),
                                           OPT("mimeType", K_STRING), END};
static const struct node SOURCE = {
    "type", (const struct variant[]){
                {"data", DATA_SOURCE}, {"url", URL_SOURCE}, {"file", FILE_SOURCE}, {NULL, NULL}}};

static const struct field TEXT_PART[] = {OPT("id", K_STRING), REQ("text", K_STRING),
                                         OPT("metadata", K_NONNULL), END};
static const struct field MEDIA_PART[] = {OPT("id", K_STRING), REQ_NODE("source", K_NODE, &SOURCE),
                                          OPT("metadata", K_NONNULL), END};
static const struct node PART = {"type", (const struct variant[]){{"text", TEXT_PART},
                                                                  {"image", MEDIA_PART},
                                                                  {"audio", MEDIA_PART},
                                                                  {"video", MEDIA_PART},
                                                                  {"document", MEDIA_PART},
                                                                  {NULL, NULL}}};

static const char *const FUNCTION_TYPE[] = {"function", NULL};
static const struct field FUNCTION[] = {REQ("name", K_STRING), REQ("arguments", K_STRING), END};
static const struct node FUNCTION_NODE = {NULL, (const struct variant[]){{"", FUNCTION}}};
static const struct field TOOL_CALL[] = {REQ("id", K_STRING),
                                         REQ_ENUM("type", FUNCTION_TYPE),
                                         REQ_NODE("function", K_NODE, &FUNCTION_NODE),
                                         OPT("encryptedValue", K_STRING),
                                         OPT("metadata", K_OBJECT),
                                         END};
static const struct node TOOL_CALL_NODE = {NULL, (const struct variant[]){{"", TOOL_CALL}}};

#define MESSAGE_COMMON                                                                             \
    OPT("subagentRunId", K_STRING), REQ("id", K_STRING), OPT("metadata", K_OBJECT)
static const struct field TEXT_MESSAGE[] = {MESSAGE_COMMON, OPT("name", K_STRING),
                                            OPT("encryptedValue", K_STRING),
                                            REQ("content", K_STRING), END};
static const struct field ASSISTANT_MESSAGE[] = {MESSAGE_COMMON,
                                                 OPT("name", K_STRING),
                                                 OPT("encryptedValue", K_STRING),
                                                 OPT("content", K_STRING),
                                                 OPT_NODE("toolCalls", K_NODES, &TOOL_CALL_NODE),
                                                 END};
static const struct field USER_MESSAGE[] = {MESSAGE_COMMON, OPT("name", K_STRING),
                                            OPT("encryptedValue", K_STRING),
                                            REQ("content", K_CONTENT), END};
static const struct field TOOL_MESSAGE[] = {
    MESSAGE_COMMON,         REQ("content", K_CONTENT),       REQ("toolCallId", K_STRING),
    OPT("error", K_STRING), OPT("encryptedValue", K_STRING), END};
static const struct field ACTIVITY_MESSAGE[] = {MESSAGE_COMMON, REQ("activityType", K_STRING),
                                                REQ("content", K_OBJECT), END};
static const struct field REASONING_MESSAGE[] = {MESSAGE_COMMON, REQ("content", K_STRING),
                                                 OPT("encryptedValue", K_STRING), END};
static const struct node MESSAGE = {"role",
                                    (const struct variant[]){{"developer", TEXT_MESSAGE},
                                                             {"system", TEXT_MESSAGE},
                                                             {"assistant", ASSISTANT_MESSAGE},
                                                             {"user", USER_MESSAGE},
                                                             {"tool", TOOL_MESSAGE},
                                                             {"activity", ACTIVITY_MESSAGE},
                                                             {"reasoning", REASONING_MESSAGE},
                                                             {NULL, NULL}}};

/* ---- the run's input, its outcome, patches --------------------------------------------------- */

static const struct field TOOL[] = {REQ("name", K_STRING), REQ("description", K_STRING),
                                    OPT("parameters", K_NONNULL), OPT("metadata", K_OBJECT), END};
static const struct node TOOL_NODE = {NULL, (const struct variant[]){{"", TOOL}}};
static const struct field CONTEXT[] = {REQ("description", K_STRING), REQ("value", K_STRING), END};
static const struct node CONTEXT_NODE = {NULL, (const struct variant[]){{"", CONTEXT}}};
static const char *const RESUME_STATUS[] = {"resolved", "cancelled", NULL};
static const struct field RESUME[] = {REQ("interruptId", K_STRING),
                                      REQ_ENUM("status", RESUME_STATUS), OPT("payload", K_NONNULL),
                                      OPT("metadata", K_OBJECT), END};
static const struct node RESUME_NODE = {NULL, (const struct variant[]){{"", RESUME}}};
static const struct field INPUT[] = {REQ("threadId", K_STRING),
                                     REQ("runId", K_STRING),
                                     OPT("protocolVersion", K_STRING),
                                     OPT("parentRunId", K_STRING),
                                     OPT("state", K_ANY),
                                     REQ_NODE("messages", K_NODES, &MESSAGE),
                                     OPT_NODE("tools", K_NODES, &TOOL_NODE),
                                     OPT_NODE("context", K_NODES, &CONTEXT_NODE),
                                     OPT("forwardedProps", K_NONNULL),
                                     OPT_NODE("resume", K_NODES, &RESUME_NODE),
                                     END};
static const struct node INPUT_NODE = {NULL, (const struct variant[]){{"", INPUT}}};

static const struct field INTERRUPT[] = {
    OPT("subagentRunId", K_STRING), REQ("id", K_STRING),         REQ("reason", K_STRING),
    OPT("message", K_STRING),       OPT("toolCallId", K_STRING), OPT("responseSchema", K_OBJECT),
    OPT("expiresAt", K_STRING),     OPT("metadata", K_OBJECT),   END};
static const struct node INTERRUPT_NODE = {NULL, (const struct variant[]){{"", INTERRUPT}}};
static const struct field SUCCESS[] = {OPT("pendingToolCallIds", K_STRINGS), END};
static const struct field INTERRUPTED[] = {REQ_NODE("interrupts", K_NODES1, &INTERRUPT_NODE), END};
static const struct field NOTHING[] = {END};
static const struct node OUTCOME = {"type", (const struct variant[]){{"success", SUCCESS},
                                                                     {"interrupt", INTERRUPTED},
                                                                     {"cancelled", NOTHING},
                                                                     {NULL, NULL}}};
static const struct field SUSPENDED[] = {OPT("interruptIds", K_STRINGS), END};
static const struct node SUBAGENT_OUTCOME = {
    "type", (const struct variant[]){{"success", NOTHING}, {"suspended", SUSPENDED}, {NULL, NULL}}};

static const struct field USAGE[] = {OPT("provider", K_STRING),
                                     OPT("model", K_STRING),
                                     OPT("inputTokens", K_COUNT),
                                     OPT("outputTokens", K_COUNT),
                                     OPT("totalTokens", K_COUNT),
                                     OPT("reasoningTokens", K_COUNT),
                                     OPT("cachedInputTokens", K_COUNT),
                                     OPT("cacheWriteInputTokens", K_COUNT),
                                     END};
static const struct node USAGE_NODE = {NULL, (const struct variant[]){{"", USAGE}}};

static const struct field OP_VALUE[] = {REQ("path", K_POINTER), REQ("value", K_ANY), END};
static const struct field OP_PATH[] = {REQ("path", K_POINTER), END};
static const struct field OP_FROM[] = {REQ("from", K_POINTER), REQ("path", K_POINTER), END};
static const struct node PATCH_OP = {"op", (const struct variant[]){{"add", OP_VALUE},
                                                                    {"remove", OP_PATH},
                                                                    {"replace", OP_VALUE},
                                                                    {"move", OP_FROM},
                                                                    {"copy", OP_FROM},
                                                                    {"test", OP_VALUE},
                                                                    {NULL, NULL}}};

/* ---- events ---------------------------------------------------------------------------------- */

static const char *const TEXT_ROLES[] = {"developer", "system", "assistant", "user", NULL};
static const char *const REASONING_ROLE[] = {"reasoning", NULL};
static const char *const TOOL_ROLE[] = {"tool", NULL};
static const char *const ENCRYPTED_SUBTYPES[] = {"tool-call", "message", NULL};

/* Every event may carry these. */
static const struct field EVENT_COMMON[] = {OPT("metadata", K_OBJECT), OPT("rawEvent", K_NONNULL),
                                            END};

static const struct {
    const char *type;
    size_t type_len;
    bool subagent; /* it may carry a "subagentRunId" */
    const struct field *fields;
} EVENTS[] = {
    {TYPE("RUN_STARTED"), false,
     (const struct field[]){REQ("threadId", K_STRING), REQ("runId", K_STRING),
                            OPT("protocolVersion", K_STRING), OPT("parentRunId", K_STRING),
                            OPT_NODE("input", K_NODE, &INPUT_NODE), END}},
    {TYPE("RUN_FINISHED"), false,
     (const struct field[]){REQ("threadId", K_STRING), REQ("runId", K_STRING),
                            OPT("result", K_NONNULL), OPT_NODE("outcome", K_NODE, &OUTCOME),
                            OPT_NODE("usage", K_NODES, &USAGE_NODE), END}},
    {TYPE("TEXT_MESSAGE_START"), true,
     (const struct field[]){REQ("messageId", K_STRING), OPT_ENUM("role", TEXT_ROLES),
                            OPT("name", K_STRING), END}},
    {TYPE("TEXT_MESSAGE_END"), true, (const struct field[]){REQ("messageId", K_STRING), END}},
    {TYPE("TOOL_CALL_START"), true,
     (const struct field[]){REQ("toolCallId", K_STRING), REQ("toolCallName", K_STRING),
                            OPT("parentMessageId", K_STRING), END}},
    {TYPE("TOOL_CALL_END"), true, (const struct field[]){REQ("toolCallId", K_STRING), END}},
    {TYPE("TEXT_MESSAGE_CONTENT"), true,
     (const struct field[]){REQ("messageId", K_STRING), REQ("delta", K_STRING), END}},
    {TYPE("TEXT_MESSAGE_CHUNK"), true,
     (const struct field[]){OPT("messageId", K_STRING), OPT_ENUM("role", TEXT_ROLES),
                            OPT("delta", K_STRING), OPT("name", K_STRING), END}},
    {TYPE("TOOL_CALL_ARGS"), true,
     (const struct field[]){REQ("toolCallId", K_STRING), REQ("delta", K_STRING), END}},
    {TYPE("TOOL_CALL_CHUNK"), true,
     (const struct field[]){OPT("toolCallId", K_STRING), OPT("toolCallName", K_STRING),
                            OPT("parentMessageId", K_STRING), OPT("delta", K_STRING), END}},
    {TYPE("TOOL_CALL_RESULT"), true,
     (const struct field[]){REQ("messageId", K_STRING), REQ("toolCallId", K_STRING),
                            REQ("content", K_CONTENT), OPT_ENUM("role", TOOL_ROLE), END}},
    {TYPE("STATE_SNAPSHOT"), true, (const struct field[]){REQ("snapshot", K_ANY), END}},
    {TYPE("STATE_DELTA"), true, (const struct field[]){REQ_NODE("delta", K_NODES, &PATCH_OP), END}},
    {TYPE("MESSAGES_SNAPSHOT"), false,
     (const struct field[]){REQ_NODE("messages", K_NODES, &MESSAGE), END}},
    {TYPE("ACTIVITY_SNAPSHOT"), true,
     (const struct field[]){REQ("messageId", K_STRING), REQ("activityType", K_STRING),
                            REQ("content", K_OBJECT), OPT("replace", K_BOOL), END}},
    {TYPE("ACTIVITY_DELTA"), true,
     (const struct field[]){REQ("messageId", K_STRING), REQ("activityType", K_STRING),
                            REQ_NODE("patch", K_NODES, &PATCH_OP), END}},
    {TYPE("RAW"), true, (const struct field[]){REQ("event", K_ANY), OPT("source", K_STRING), END}},
    {TYPE("CUSTOM"), true, (const struct field[]){REQ("name", K_STRING), REQ("value", K_ANY), END}},
    {TYPE("RUN_ERROR"), false,
     (const struct field[]){REQ("message", K_STRING), OPT("code", K_STRING),
                            OPT_NODE("usage", K_NODES, &USAGE_NODE), END}},
    {TYPE("STEP_STARTED"), true, (const struct field[]){REQ("stepName", K_STRING), END}},
    {TYPE("STEP_FINISHED"), true, (const struct field[]){REQ("stepName", K_STRING), END}},
    {TYPE("REASONING_START"), true, (const struct field[]){REQ("messageId", K_STRING), END}},
    {TYPE("REASONING_MESSAGE_START"), true,
     (const struct field[]){REQ("messageId", K_STRING), REQ_ENUM("role", REASONING_ROLE), END}},
    {TYPE("REASONING_MESSAGE_CONTENT"), true,
     (const struct field[]){REQ("messageId", K_STRING), REQ("delta", K_STRING), END}},
    {TYPE("REASONING_MESSAGE_END"), true, (const struct field[]){REQ("messageId", K_STRING), END}},
    {TYPE("REASONING_MESSAGE_CHUNK"), true,
     (const struct field[]){OPT("messageId", K_STRING), OPT("delta", K_STRING), END}},
    {TYPE("REASONING_END"), true, (const struct field[]){REQ("messageId", K_STRING), END}},
    {TYPE("REASONING_ENCRYPTED_VALUE"), true,
     (const struct field[]){REQ_ENUM("subtype", ENCRYPTED_SUBTYPES), REQ("entityId", K_STRING),
                            REQ("encryptedValue", K_STRING), END}},
    {TYPE("SUBAGENT_STARTED"), false,
     (const struct field[]){REQ("subagentRunId", K_STRING), REQ("name", K_STRING),
                            OPT("description", K_STRING), OPT("parentSubagentRunId", K_STRING),
                            OPT("parentToolCallId", K_STRING), OPT("parentMessageId", K_STRING),
                            END}},
    {TYPE("SUBAGENT_FINISHED"), false,
     (const struct field[]){REQ("subagentRunId", K_STRING), OPT("result", K_NONNULL),
                            OPT_NODE("outcome", K_NODE, &SUBAGENT_OUTCOME), END}},
    {TYPE("SUBAGENT_ERROR"), false,
     (const struct field[]){REQ("subagentRunId", K_STRING), REQ("message", K_STRING),
                            OPT("code", K_STRING), END}},
};

static const struct field SUBAGENT_RUN_ID[] = {OPT("subagentRunId", K_STRING), END};

/* memcmp() == 0 for the short names of the tables (at most 25 bytes), without a call: eight bytes
 * at a time, the last eight overlapping */
static bool same_bytes(const char *a, const char *b, size_t n)
{
    uint64_t x, y;

    if (n >= 8) {
        for (size_t i = 0; i + 8 < n; i += 8) {
            memcpy(&x, a + i, 8);
            memcpy(&y, b + i, 8);
            if (x != y)
                return false;
        }
        memcpy(&x, a + n - 8, 8);
        memcpy(&y, b + n - 8, 8);
        return x == y;
    }
    while (n-- > 0)
        if (*a++ != *b++)
            return false;
    return true;
}

/* The index in EVENTS of the type named <type> (<len> bytes), or -1: after the tables below. */
static int event_index(const char *type, size_t len);

/* The lists of fields an event of EVENTS[<i>] names, in order: common ones first. */
static size_t event_lists(int i, const struct field *lists[3])
{
    size_t n = 0;

    lists[n++] = EVENT_COMMON;
    if (EVENTS[i].subagent)
        lists[n++] = SUBAGENT_RUN_ID;
    lists[n++] = EVENTS[i].fields;
    return n;
}

static bool in_values(const char *const *values, const char *s, size_t n)
{
    for (; *values != NULL; values++)
        if (strlen(*values) == n && memcmp(*values, s, n) == 0)
            return true;
    return false;
}

static bool is_pointer(const char *s, size_t n)
{
    if (n > 0 && s[0] != '/')
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '~' && (i + 1 == n || (s[i + 1] != '0' && s[i + 1] != '1')))
            return false;
    return true;
}

/* ---- the full check -------------------------------------------------------------------------- */

enum res { R_OK, R_DROP, R_BAD };

struct check {
    const char *type;
    char *why;
    size_t why_len;
    char path[160]; /* the member being read: "messages[2].toolCalls[0].function.name" */
    size_t path_len;
    bool path_cut;     /* deeper than <path> holds: the rest is left out */
    char dropped[200]; /* why the last R_DROP (a required member of no known kind) */
};

static size_t path_push(struct check *c, const char *key, size_t index)
{
    size_t was = c->path_len, room = sizeof(c->path) - was;
    int n = key != NULL ? snprintf(c->path + was, room, "%s%s", was > 0 ? "." : "", key)
                        : snprintf(c->path + was, room, "[%zu]", index);

    if (n < 0 || (size_t)n >= room) {
        c->path[was] = '\0';
        c->path_cut = true;
    } else {
        c->path_len += (size_t)n;
    }
    return was;
}

static void path_pop(struct check *c, size_t was)
{
    c->path_len = was;
    c->path[was] = '\0';
}

static enum res bad(struct check *c, const char *fmt, ...) AGW_PRINTF(2, 3);

/* Writes '<type> "<path>" <what>' (printf-like) to the caller's <why>. */
static enum res bad(struct check *c, const char *fmt, ...)
{
    char what[96];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    snprintf(c->why, c->why_len, "%s \"%s%s\" %s", c->type, c->path, c->path_cut ? "..." : "",
             what);
    return R_BAD;
}

/* '<type> without a string "<path>"', the normaliser's words for a missing id. */
static enum res bad_string(struct check *c)
{
    snprintf(c->why, c->why_len, "%s without a string \"%s%s\"", c->type, c->path,
             c->path_cut ? "..." : "");
    return R_BAD;
}

static enum res check_fields(struct check *c, const json_t *o, const struct field *f);

static enum res check_node(struct check *c, const json_t *v, const struct node *node)
{
    const struct field *fields = node->variants[0].fields;

    if (!json_is_object(v))
        return bad(c, "must be an object");
    if (node->disc != NULL) {
        const json_t *d = json_object_get(v, node->disc);
        const struct variant *var = node->variants;

        while (var->name != NULL &&
               !(json_is_string(d) && strcmp(json_string_value(d), var->name) == 0))
            var++;
        if (var->name == NULL) {
            snprintf(c->dropped, sizeof(c->dropped), "%s \"%s%s\" has no \"%s\" the protocol knows",
                     c->type, c->path, c->path_cut ? "..." : "", node->disc);
            return R_DROP;
        }
        fields = var->fields;
    }
    return check_fields(c, v, fields);
}

static bool is_count(const json_t *v)
{
    if (json_is_integer(v))
        return json_integer_value(v) >= 0 && json_integer_value(v) <= AGW_SCHEMA_MAX_INT;
    if (json_is_real(v)) {
        /* a document with an integer past 64 bits was read with every integer as a real */
        double d = json_real_value(v);
        return d >= 0 && d <= (double)AGW_SCHEMA_MAX_INT && d == (double)(long long)d;
    }
    return false;
}

static enum res check_value(struct check *c, const json_t *v, const struct field *f)
{
    size_t i, kept = 0, was;
    const json_t *e;
    enum res r;

    switch ((enum kind)f->kind) {
    case K_STRING:
        return json_is_string(v) ? R_OK : bad_string(c);
    case K_ENUM:
        if (json_is_string(v) && in_values(f->values, json_string_value(v), json_string_length(v)))
            return R_OK;
        if (f->values[1] == NULL)
            return bad(c, "must be \"%s\"", f->values[0]);
        {
            char list[80] = "";
            for (const char *const *p = f->values; *p != NULL; p++)
                snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s",
                         p == f->values ? "" : ", ", *p);
            return bad(c, "must be one of %s", list);
        }
    case K_POINTER:
        if (!json_is_string(v))
            return bad_string(c);
        return is_pointer(json_string_value(v), json_string_length(v))
                   ? R_OK
                   : bad(c, "must be a JSON Pointer (\"\" or starting with '/')");
    case K_BOOL:
        return json_is_boolean(v) ? R_OK : bad(c, "must be true or false");
    case K_COUNT:
        return is_count(v) ? R_OK : bad(c, "must be an integer from 0 to %lld", AGW_SCHEMA_MAX_INT);
    case K_OBJECT:
        return json_is_object(v) ? R_OK : bad(c, "must be an object");
    case K_ANY:
        return R_OK;
    case K_NONNULL:
        return json_is_null(v) ? bad(c, "must not be null") : R_OK;
    case K_NODE:
        return check_node(c, v, f->node);
    case K_STRINGS:
    case K_NODES:
    case K_NODES1:
    case K_CONTENT:
        if (f->kind == K_CONTENT && json_is_string(v))
            return R_OK;
        if (!json_is_array(v))
            return f->kind == K_CONTENT ? bad(c, "must be a string or an array of content parts")
                                        : bad(c, "must be an array");
        json_array_foreach(v, i, e)
        {
            was = path_push(c, NULL, i);
            if (f->kind == K_STRINGS)
                r = json_is_string(e) ? R_OK : bad_string(c);
            else
                r = check_node(c, e, f->kind == K_CONTENT ? &PART : f->node);
            path_pop(c, was);
            if (r == R_BAD)
                return R_BAD;
            kept += r == R_OK; /* the client drops an element of no known kind */
        }
        if (f->kind == K_NODES1 && kept == 0)
            return bad(c, "must not be empty");
        return R_OK;
    }
    return R_OK;
}

static enum res check_fields(struct check *c, const json_t *o, const struct field *f)
{
    for (; f->key != NULL; f++) {
        const json_t *v = json_object_get(o, f->key);
        size_t was = path_push(c, f->key, 0);
        enum res r;

        if (v == NULL)
            r = !f->required                                  ? R_OK
                : f->kind == K_STRING || f->kind == K_POINTER ? bad_string(c)
                                                              : bad(c, "is missing");
        else
            r = check_value(c, v, f);
        path_pop(c, was);
        if (r == R_DROP && !f->required)
            r = R_OK; /* the client removes the member */
        if (r != R_OK)
            return r;
    }
    return R_OK;
}

bool agw_schema_check(const json_t *ev, char *why, size_t why_len)
{
    const json_t *type = json_object_get(ev, "type");
    const struct field *lists[3];
    struct check c;
    int i;

    if (!json_is_string(type) ||
        (i = event_index(json_string_value(type), json_string_length(type))) < 0)
        return true; /* not an event of the protocol: the client drops it */
    memset(&c, 0, sizeof(c));
    c.type = EVENTS[i].type;
    c.why = why;
    c.why_len = why_len;
    for (size_t k = 0, n = event_lists(i, lists); k < n; k++) {
        enum res r = check_fields(&c, ev, lists[k]);
        if (r == R_DROP)
            snprintf(why, why_len, "%s", c.dropped); /* the client fails on the whole event */
        if (r != R_OK)
            return false;
    }
    return true;
}

bool agw_schema_keeps_null(const char *type, const char *key)
{
    return (strcmp(key, "snapshot") == 0 && strcmp(type, "STATE_SNAPSHOT") == 0) ||
           (strcmp(key, "value") == 0 && strcmp(type, "CUSTOM") == 0) ||
           (strcmp(key, "event") == 0 && strcmp(type, "RAW") == 0);
}

/* ---- what the client strips ---------------------------------------------------------------- */

/* Whether <fields> (or the discriminator <disc>) name <key>. */
static bool names(const struct field *fields, const char *disc, const char *key)
{
    if (disc != NULL && strcmp(disc, key) == 0)
        return true;
    for (const struct field *f = fields; f->key != NULL; f++)
        if (strcmp(f->key, key) == 0)
            return true;
    return false;
}

static enum res strip_node(json_t *v, const struct node *node, bool apply, bool *found);

/* Strips object <o> of fields <fields> (<disc>: its discriminator) as the client does: the members
 * they do not name go, and what its nested objects drop (an element of an array; an optional
 * member). R_DROP when a required member is dropped: the client drops <o> with it. <found> tells
 * whether anything goes; only with <apply> is it removed. */
static enum res strip_fields(json_t *o, const struct field *fields, const char *disc, bool apply,
                             bool *found)
{
    const char *key;
    json_t *v;
    void *tmp;

    json_object_foreach_safe(o, tmp, key, v)
    {
        if (names(fields, disc, key))
            continue;
        *found = true;
        if (apply)
            json_object_del(o, key);
    }
    for (const struct field *f = fields; f->key != NULL; f++) {
        const struct node *node = f->kind == K_CONTENT ? &PART : f->node;
        size_t i;

        if (node == NULL || (v = json_object_get(o, f->key)) == NULL)
            continue;
        if (f->kind == K_NODE) {
            if (strip_node(v, node, apply, found) == R_OK)
                continue;
            if (f->required)
                return R_DROP;
            *found = true;
            if (apply)
                json_object_del(o, f->key);
            continue;
        }
        for (i = 0; json_is_array(v) && i < json_array_size(v);) {
            if (strip_node(json_array_get(v, i), node, apply, found) == R_OK) {
                i++;
                continue;
            }
            *found = true;
            if (apply)
                json_array_remove(v, i);
            else
                i++;
        }
    }
    return R_OK;
}

/* The same for a value read by <node>: R_DROP when it is of no kind the node knows. What is not an
 * object is left as it is (the client's check refuses it). */
static enum res strip_node(json_t *v, const struct node *node, bool apply, bool *found)
{
    const struct variant *var = node->variants;

    if (!json_is_object(v))
        return R_OK;
    if (node->disc != NULL) {
        const char *d = json_string_value(json_object_get(v, node->disc));
        while (var->name != NULL && (d == NULL || strcmp(d, var->name) != 0))
            var++;
        if (var->name == NULL)
            return R_DROP;
    }
    return strip_fields(v, var->fields, node->disc, apply, found);
}

int agw_schema_strip_message(json_t *m, bool apply)
{
    bool found = false;

    if (strip_node(m, &MESSAGE, apply, &found) != R_OK)
        return -1;
    return found;
}

/* ---- the tables, listed ---------------------------------------------------------------------- */

#define WALK_PATH 256

static int cmp_names(const void *x, const void *y)
{
    return strcmp(*(const char *const *)x, *(const char *const *)y);
}

/* Lists object <path> of <fields> (<extra>: the names it has beside them, NULL-terminated), then
 * the objects its fields hold. */
static void walk_fields(const char *path, const struct field *fields, const char *const *extra,
                        agw_schema_walk_fn *fn, void *arg);

static void walk_node(const char *path, const struct node *node, agw_schema_walk_fn *fn, void *arg)
{
    char p[WALK_PATH];

    if (node->disc == NULL) {
        walk_fields(path, node->variants[0].fields, (const char *const[]){NULL}, fn, arg);
        return;
    }
    for (const struct variant *v = node->variants; v->name != NULL; v++) {
        int r = snprintf(p, sizeof(p), "%s{%s=%s}", path, node->disc, v->name);
        if (r > 0 && (size_t)r < sizeof(p)) /* (the tables' deepest path is about 100 bytes) */
            walk_fields(p, v->fields, (const char *const[]){node->disc, NULL}, fn, arg);
    }
}

static void walk_fields(const char *path, const struct field *fields, const char *const *extra,
                        agw_schema_walk_fn *fn, void *arg)
{
    const char *names[64];
    char list[1024] = "", p[WALK_PATH];
    size_t n = 0;

    for (const char *const *e = extra; *e != NULL && n < AGW_ARRAY_LEN(names); e++)
        names[n++] = *e;
    for (const struct field *f = fields; f->key != NULL && n < AGW_ARRAY_LEN(names); f++)
        names[n++] = f->key;
    qsort(names, n, sizeof(names[0]), cmp_names);
    for (size_t i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i > 0 ? " " : "",
                 names[i]);
    fn(arg, path, list);
    for (const struct field *f = fields; f->key != NULL; f++) {
        const struct node *node = f->kind == K_CONTENT ? &PART : f->node;
        if (node == NULL)
            continue;
        int r = snprintf(p, sizeof(p), "%s.%s%s", path, f->key, f->kind == K_NODE ? "" : "[]");
        if (r > 0 && (size_t)r < sizeof(p))
            walk_node(p, node, fn, arg);
    }
}

void agw_schema_walk(agw_schema_walk_fn *fn, void *arg)
{
    for (size_t i = 0; i < AGW_ARRAY_LEN(EVENTS); i++) {
        const struct field *lists[3];
        const char *extra[8] = {"type", "timestamp"}; /* (the normaliser's: rule 8) */
        size_t n = event_lists((int)i, lists), k = 2;

        for (size_t j = 0; j + 1 < n; j++)
            for (const struct field *f = lists[j]; f->key != NULL; f++)
                extra[k++] = f->key;
        extra[k] = NULL;
        walk_fields(EVENTS[i].type, lists[n - 1], extra, fn, arg);
    }
}

/* ---- flat events ----------------------------------------------------------------------------- */

static bool flat_value_ok(const struct field *f, const struct agw_schema_member *m)
{
    switch ((enum kind)f->kind) {
    case K_STRING:
    case K_CONTENT:
        return m->kind == AGW_FLAT_STRING;
    case K_ENUM:
        return m->kind == AGW_FLAT_STRING && m->s != NULL && in_values(f->values, m->s, m->n);
    case K_POINTER:
        return m->kind == AGW_FLAT_STRING && m->s != NULL && is_pointer(m->s, m->n);
    case K_BOOL:
        return m->kind == AGW_FLAT_BOOL;
    case K_ANY:
    case K_NONNULL:
        return true;
    case K_COUNT: /* (an integer's range is left to the full check) */
    case K_OBJECT:
    case K_STRINGS:
    case K_NODE:
    case K_NODES:
    case K_NODES1:
        return false;
    }
    return false;
}

const char *const agw_schema_span_keys[AGW_N_SPANS] = {
    [AGW_SPAN_MESSAGE_ID] = "messageId",
    [AGW_SPAN_TOOL_CALL_ID] = "toolCallId",
    [AGW_SPAN_STEP_NAME] = "stepName",
    [AGW_SPAN_DELTA] = "delta",
    [AGW_SPAN_ROLE] = "role",
    [AGW_SPAN_THREAD_ID] = "threadId",
    [AGW_SPAN_RUN_ID] = "runId",
    [AGW_SPAN_SUBAGENT_RUN_ID] = "subagentRunId",
};

/* Each event type's fields by name, hashed, for the flat check: built once. */
#define SLOTS 64

struct type_fields {
    const struct field *by_key[SLOTS]; /* open addressing from key_hash() */
    uint8_t bit[SLOTS];                /* the field's index in the type's own list; NOT_OWN */
    uint8_t span_slot[AGW_N_SPANS];    /* where the field each span names is; NO_SLOT: none */
    uint64_t required;                 /* the bits of its own list's required fields */
};

#define NOT_OWN 0xff
#define NO_SLOT 0xff

static struct type_fields FIELDS[AGW_ARRAY_LEN(EVENTS)];
static int8_t TYPES[SLOTS]; /* the index in EVENTS of a type, from key_hash(); -1: none */
static pthread_once_t fields_once = PTHREAD_ONCE_INIT;

static unsigned key_hash(const char *k, size_t n)
{
    return ((unsigned)n * 7u + (unsigned char)k[0] * 3u + (unsigned char)k[n - 1] * 5u +
            (unsigned char)k[n / 2]) %
           SLOTS;
}

/* The slot of the field named <key> (<len> bytes) in <tf>, or NO_SLOT. */
static unsigned slot_of(const struct type_fields *tf, const char *key, size_t len)
{
    const struct field *f;
    unsigned h;

    for (h = key_hash(key, len); (f = tf->by_key[h]) != NULL; h = (h + 1) % SLOTS)
        if (f->key_len == len && same_bytes(f->key, key, len))
            return h;
    return NO_SLOT;
}

static void build_fields(void)
{
    const struct field *lists[3];

    memset(TYPES, -1, sizeof(TYPES));
    for (size_t i = 0; i < AGW_ARRAY_LEN(EVENTS); i++) {
        unsigned h = key_hash(EVENTS[i].type, EVENTS[i].type_len);
        size_t nl = event_lists((int)i, lists);

        while (TYPES[h] >= 0)
            h = (h + 1) % SLOTS;
        TYPES[h] = (int8_t)i;
        for (size_t l = 0; l < nl; l++) {
            for (size_t k = 0; lists[l][k].key != NULL; k++) {
                const struct field *f = &lists[l][k];
                h = key_hash(f->key, f->key_len);
                while (FIELDS[i].by_key[h] != NULL)
                    h = (h + 1) % SLOTS;
                FIELDS[i].by_key[h] = f;
                FIELDS[i].bit[h] = lists[l] == EVENTS[i].fields ? (uint8_t)k : NOT_OWN;
                if (lists[l] == EVENTS[i].fields && f->required)
                    FIELDS[i].required |= UINT64_C(1) << k;
            }
        }
        for (size_t k = 0; k < AGW_N_SPANS; k++)
            FIELDS[i].span_slot[k] = (uint8_t)slot_of(&FIELDS[i], agw_schema_span_keys[k],
                                                      strlen(agw_schema_span_keys[k]));
    }
}

static int event_index(const char *type, size_t len)
{
    int i;

    if (len == 0)
        return -1;
    pthread_once(&fields_once, build_fields);
    for (unsigned h = key_hash(type, len); (i = TYPES[h]) >= 0; h = (h + 1) % SLOTS)
        if (EVENTS[i].type_len == len && same_bytes(EVENTS[i].type, type, len))
            return i;
    return -1;
}

bool agw_schema_flat_ok(const char *type, size_t type_len,
                        const struct agw_schema_span spans[AGW_N_SPANS],
                        const struct agw_schema_member *m, size_t n)
{
    const struct type_fields *tf;
    uint64_t seen = 0;
    unsigned h;
    int i = event_index(type, type_len);

    if (i < 0)
        return true; /* no type of the protocol */
    tf = &FIELDS[i];
    /* each member by the field naming it (none: the client drops it), then the required fields
     * seen (a member given twice counts once) */
    for (size_t k = 0; k < AGW_N_SPANS; k++) {
        if (spans[k].p == NULL || (h = tf->span_slot[k]) == NO_SLOT)
            continue;
        const struct agw_schema_member sm = {
            .kind = AGW_FLAT_STRING, .s = spans[k].escaped ? NULL : spans[k].p, .n = spans[k].n};
        if (!flat_value_ok(tf->by_key[h], &sm))
            return false;
        if (tf->bit[h] != NOT_OWN)
            seen |= UINT64_C(1) << tf->bit[h];
    }
    for (size_t j = 0; j < n; j++) {
        if (m[j].key_len == 0 || (h = slot_of(tf, m[j].key, m[j].key_len)) == NO_SLOT)
            continue;
        if (!flat_value_ok(tf->by_key[h], &m[j]))
            return false;
        if (tf->bit[h] != NOT_OWN)
            seen |= UINT64_C(1) << tf->bit[h];
    }
    return (seen & tf->required) == tf->required;
}
