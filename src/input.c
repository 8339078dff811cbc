/* RunAgentInput validation (doc/protocol.md#validation) and decision-only classification
 * (doc/protocol.md#decisions).
 *
 * The body is parsed with jansson, checked in a fixed order (depth, JSON, object, threadId, runId,
 * messages, tools, context) so that the first error in that order is the one reported, and then
 * dropped: the relay forwards the client's bytes, never a re-serialisation. Before that, the
 * scanner reads the common body without a tree (below, "the scanner's reading"). Error messages
 * name field paths only; they never quote the body (it may hold secrets), which is also why
 * jansson's "near '<token>'" suffix is cut. */
#include "config.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "agw/input.h"
#include "agw/jscan.h"

/* Used when the caller passes max_depth 0, so a zeroed limit never means "unlimited". */
#define DEFAULT_MAX_DEPTH 64u

static const char *const roles[] = {"developer", "system",   "assistant", "user",
                                    "tool",      "activity", "reasoning"};
#define ROLES_TEXT "developer, system, assistant, user, tool, activity, reasoning"

/* Formats <fmt> into <err> (if any) and returns <status>, so that every check is one line. */
static int AGW_PRINTF(4, 5) fail(char *err, size_t errlen, int status, const char *fmt, ...)
{
    va_list ap;

    if (err != NULL && errlen > 0) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* Deepest [ / { nesting of <buf>, counted outside strings (escapes honoured), stopping as soon as
 * it passes <limit>. Exact for valid JSON; for invalid JSON it is an upper bound of what jansson
 * would recurse into before failing, which is all the pre-scan is for: jansson never sees a
 * document deeper than the limit. */
static unsigned max_nesting(const char *buf, size_t len, unsigned limit)
{
    unsigned depth = 0, deepest = 0;
    bool in_string = false;

    for (size_t i = 0; i < len; i++) {
        char c = buf[i];
        if (in_string) {
            if (c == '\\')
                i++; /* the escaped byte cannot end the string */
            else if (c == '"')
                in_string = false;
            continue;
        }
        switch (c) {
        case '"':
            in_string = true;
            break;
        case '[':
        case '{':
            if (++depth > deepest) {
                deepest = depth;
                if (deepest > limit)
                    return deepest;
            }
            break;
        case ']':
        case '}':
            if (depth > 0)
                depth--;
            break;
        default:
            break;
        }
    }
    return deepest;
}

/* jansson strings may hold NUL (JSON_ALLOW_NUL), so compare with the stored length, never strcmp.
 */
static bool str_is(const json_t *v, const char *s)
{
    size_t n = strlen(s);
    return json_is_string(v) && json_string_length(v) == n &&
           memcmp(json_string_value(v), s, n) == 0;
}

static bool str_nonempty(const json_t *v)
{
    return json_is_string(v) && json_string_length(v) > 0;
}

static bool str_has_nul(const json_t *v)
{
    return memchr(json_string_value(v), '\0', json_string_length(v)) != NULL;
}

/* True when <v> is a string with at least one character that is not ASCII whitespace. */
static bool str_nonblank(const json_t *v)
{
    const char *s;
    size_t n;

    if (!json_is_string(v))
        return false;
    s = json_string_value(v);
    n = json_string_length(v);
    for (size_t i = 0; i < n; i++) {
        switch (s[i]) {
        case ' ':
        case '\t':
        case '\n':
        case '\r':
        case '\v':
        case '\f':
            break;
        default:
            return true;
        }
    }
    return false;
}

/* Optional fields: absent and JSON null mean the same thing (serialisers such as pydantic write
 * null for unset fields), so both come back as NULL. */
static json_t *opt_get(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

/* threadId / runId: required non-empty strings. NUL is refused because the ids become C strings
 * (registry keys, log lines); a truncated id would name another thread. */
static int check_id(const json_t *root, const char *key, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, key);

    if (!json_is_string(v))
        return fail(err, errlen, 422, "%s is required and must be a string", key);
    if (json_string_length(v) == 0)
        return fail(err, errlen, 400, "bad request: %s cannot be empty", key);
    if (str_has_nul(v))
        return fail(err, errlen, 422, "%s must not contain NUL characters", key);
    return 0;
}

/* A user message's content: a string, or an array of input parts, each an object with a non-empty
 * string "type" ("text" parts also need a string "text"). Sets *<has_input> when the content is
 * something a model can answer: a non-blank string, a non-blank text part, or any non-text part
 * (image, binary, ...). */
static int check_user_content(const json_t *content, size_t i, bool *has_input, char *err,
                              size_t errlen)
{
    size_t j;
    json_t *part;

    if (json_is_string(content)) {
        if (str_nonblank(content))
            *has_input = true;
        return 0;
    }
    if (!json_is_array(content))
        return fail(err, errlen, 422,
                    "messages[%zu].content must be a string or an array of input parts", i);
    json_array_foreach(content, j, part)
    {
        json_t *type = json_object_get(part, "type");
        if (!json_is_object(part))
            return fail(err, errlen, 422, "messages[%zu].content[%zu] must be an object", i, j);
        if (!str_nonempty(type))
            return fail(err, errlen, 422, "messages[%zu].content[%zu].type is required", i, j);
        if (str_is(type, "text")) {
            json_t *text = json_object_get(part, "text");
            if (!json_is_string(text))
                return fail(err, errlen, 422, "messages[%zu].content[%zu].text must be a string", i,
                            j);
            if (str_nonblank(text))
                *has_input = true;
        } else {
            *has_input = true;
        }
    }
    return 0;
}

/* Content of the other roles is not checked: assistant content may be absent or null next to
 * toolCalls, activity content is an object, and the backend is the authority on what it accepts. */
static int check_messages(const json_t *root, struct agw_input *in, char *err, size_t errlen)
{
    json_t *messages = json_object_get(root, "messages");
    json_t *msg;
    size_t i;
    int rc;

    if (!json_is_array(messages))
        return fail(err, errlen, 422, "messages is required and must be an array");
    json_array_foreach(messages, i, msg)
    {
        json_t *role, *id;
        size_t r;

        if (!json_is_object(msg))
            return fail(err, errlen, 422, "messages[%zu] must be an object", i);
        role = json_object_get(msg, "role");
        for (r = 0; r < AGW_ARRAY_LEN(roles); r++) {
            if (str_is(role, roles[r]))
                break;
        }
        if (r == AGW_ARRAY_LEN(roles))
            return fail(err, errlen, 422, "messages[%zu].role must be one of " ROLES_TEXT, i);
        id = opt_get(msg, "id");
        if (id != NULL && !json_is_string(id))
            return fail(err, errlen, 422, "messages[%zu].id must be a string", i);

        if (str_is(role, "tool")) {
            if (!str_nonempty(json_object_get(msg, "toolCallId")))
                return fail(err, errlen, 422, "messages[%zu].toolCallId is required", i);
            in->has_decision = true;
        } else if (str_is(role, "user")) {
            rc = check_user_content(json_object_get(msg, "content"), i, &in->has_user_input, err,
                                    errlen);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

/* tools[].parameters: an object, or (legacy clients) a string holding a JSON object. */
static bool parameters_ok(const json_t *params, unsigned max_depth)
{
    const char *s;
    size_t n;
    json_t *schema;
    bool ok;

    if (params == NULL || json_is_object(params))
        return true;
    if (!json_is_string(params))
        return false;
    s = json_string_value(params);
    n = json_string_length(params);
    if (max_nesting(s, n, max_depth) > max_depth)
        return false;
    schema = json_loadb(s, n, 0, NULL);
    ok = json_is_object(schema);
    json_decref(schema);
    return ok;
}

static int check_tools(const json_t *root, unsigned max_depth, char *err, size_t errlen)
{
    json_t *tools = opt_get(root, "tools");
    json_t *tool;
    size_t i;

    if (tools == NULL)
        return 0;
    if (!json_is_array(tools))
        return fail(err, errlen, 422, "tools must be an array");
    json_array_foreach(tools, i, tool)
    {
        json_t *execute;

        if (!json_is_object(tool))
            return fail(err, errlen, 422, "tools[%zu] must be an object", i);
        if (!str_nonempty(json_object_get(tool, "name")))
            return fail(err, errlen, 422, "tools[%zu].name is required", i);
        if (!parameters_ok(opt_get(tool, "parameters"), max_depth))
            return fail(err, errlen, 422,
                        "tools[%zu].parameters must be an object or a JSON-Schema string", i);
        execute = opt_get(tool, "execute");
        if (execute != NULL && !str_is(execute, "frontend") && !str_is(execute, "backend"))
            return fail(err, errlen, 422, "tools[%zu].execute must be one of frontend, backend", i);
    }
    return 0;
}

static int check_context(const json_t *root, char *err, size_t errlen)
{
    json_t *context = opt_get(root, "context");
    json_t *item;
    size_t i;

    if (context == NULL)
        return 0;
    if (!json_is_array(context))
        return fail(err, errlen, 422, "context must be an array");
    json_array_foreach(context, i, item)
    {
        if (!json_is_object(item))
            return fail(err, errlen, 422, "context[%zu] must be an object", i);
    }
    return 0;
}

bool agw_input_content_type_ok(const char *content_type)
{
    static const char json_type[] = "application/json";
    const size_t n = sizeof(json_type) - 1;
    const char *p = content_type;

    if (p == NULL)
        return false;
    while (*p == ' ' || *p == '\t')
        p++;
    if (strlen(p) < n || !agw_strieq_n(p, n, json_type))
        return false;
    p += n;
    while (*p == ' ' || *p == '\t')
        p++;
    return *p == '\0' || *p == ';';
}

/* ---- the scanner's reading (include/agw/jscan.h) ----------------------------------------------
 *
 * A body the scanner reads, and finds valid by the rules above, is valid for jansson's reading too,
 * with the same ids and flags; anything else (an error, an escaped id or role, a tool's parameters
 * given as a string, duplicate keys, nesting past FAST_MAX_DEPTH...) is left to jansson's reading,
 * which decides and names the error. So the rules above stay the only statement of what is valid,
 * and the scanner only spares the common body a tree (doc/benchmarks.md, "What a run costs"). */

/* Levels of nesting the scanner follows; deeper bodies go to jansson (after the depth check). */
#define FAST_MAX_DEPTH 32

/* A scalar value the walk looked at: a string's bytes between its quotes, or another value's first
 * byte. */
struct val {
    const char *s; /* a string's bytes; NULL: absent, or not a string */
    size_t n;
    bool escaped;
    char first; /* the value's first byte ('\0': absent) */
};

/* Consumes the value at it->p into <v>: a string's bytes, or the first byte of anything else
 * (scanned and skipped). False when not judged. */
static bool take(struct agw_jscan *it, struct val *v)
{
    const char *q;

    v->first = *it->p;
    if (*it->p != '"') {
        v->s = NULL;
        return agw_jscan_skip(it);
    }
    if ((q = agw_jscan_string(it->p, it->end, &v->escaped)) == NULL)
        return false;
    v->s = it->p + 1;
    v->n = (size_t)(q - it->p) - 2;
    it->p = q;
    return true;
}

/* A string written without an escape whose bytes are <s>. */
static bool val_is(const struct val *v, const char *s)
{
    return v->s != NULL && !v->escaped && agw_streq_n(v->s, v->n, s);
}

/* str_nonblank() on a string's raw bytes as the scanner took them (escapes whole, no control byte,
 * no \u0000): an escape of a whitespace character is whitespace. */
static bool raw_nonblank(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        long c;
        if (p[i] == ' ')
            continue;
        if (p[i] != '\\')
            return true;
        switch (p[++i]) {
        case 'n':
        case 't':
        case 'r':
        case 'f':
            continue;
        case 'u':
            c = 0;
            for (int j = 1; j <= 4; j++)
                c = c << 4 | agw_hexval(p[i + (size_t)j]);
            i += 4;
            if (c == ' ' || (c >= '\t' && c <= '\r'))
                continue;
            return true;
        default:
            return true;
        }
    }
    return false;
}

/* check_user_content() on the content value at <p>..<end> (already scanned). */
static bool fast_user_content(const char *p, const char *end, bool *has_input)
{
    struct agw_jscan parts, part;
    const char *k;
    size_t kn;
    int rc;

    if (*p == '"') {
        if (raw_nonblank(p + 1, (size_t)(end - p) - 2))
            *has_input = true;
        return true;
    }
    if (*p != '[' || !agw_jscan_open(&parts, p, end, FAST_MAX_DEPTH, true))
        return false;
    while ((rc = agw_jscan_next(&parts, NULL, NULL)) == 1) {
        struct val type = {0}, text = {0};
        if (*parts.p != '{' || !agw_jscan_enter(&part, &parts))
            return false;
        while ((rc = agw_jscan_next(&part, &k, &kn)) == 1) {
            struct val *v = agw_streq_n(k, kn, "type")   ? &type
                            : agw_streq_n(k, kn, "text") ? &text
                                                         : NULL;
            if (!(v != NULL ? take(&part, v) : agw_jscan_skip(&part)))
                return false;
        }
        if (rc < 0 || type.s == NULL || type.n == 0 || type.escaped)
            return false;
        agw_jscan_leave(&parts, &part);
        if (!val_is(&type, "text"))
            *has_input = true;
        else if (text.s == NULL)
            return false;
        else if (raw_nonblank(text.s, text.n))
            *has_input = true;
    }
    return rc == 0;
}

/* check_messages() on the value at top->p, consumed. */
/* Appends to in->messages the element at <m> (up to <m_end>) of the body at <base>, whose id is
 * <id>: false (nothing kept) when that id is not a string written without an escape. */
static bool keep_message(struct agw_input *in, size_t *cap, const char *base, const char *m,
                         const char *m_end, const struct val *id)
{
    if (id->s == NULL || id->escaped)
        return false;
    if (in->n_messages == *cap) {
        *cap = *cap > 0 ? *cap * 2 : 8;
        in->messages = agw_xrealloc(in->messages, *cap * sizeof(*in->messages));
    }
    in->messages[in->n_messages++] = (struct agw_input_message){
        (size_t)(m - base), (size_t)(m_end - m), (size_t)(id->s - base), id->n};
    return true;
}

static bool fast_messages(struct agw_jscan *top, const char *base, bool keep, struct agw_input *in)
{
    struct agw_jscan msgs, msg;
    const char *k;
    size_t kn, cap = 0;
    bool kept = keep;
    int rc;

    if (*top->p != '[' || !agw_jscan_enter(&msgs, top))
        return false;
    while ((rc = agw_jscan_next(&msgs, NULL, NULL)) == 1) {
        struct val role = {0}, id = {0}, tool_call = {0};
        const char *content = NULL, *content_end = NULL, *m = msgs.p;
        size_t r;
        if (*msgs.p != '{' || !agw_jscan_enter(&msg, &msgs))
            return false;
        while ((rc = agw_jscan_next(&msg, &k, &kn)) == 1) {
            bool ok;
            if (agw_streq_n(k, kn, "content")) {
                content = msg.p;
                ok = agw_jscan_skip(&msg);
                content_end = msg.p;
            } else {
                struct val *v = agw_streq_n(k, kn, "role")         ? &role
                                : agw_streq_n(k, kn, "id")         ? &id
                                : agw_streq_n(k, kn, "toolCallId") ? &tool_call
                                                                   : NULL;
                ok = v != NULL ? take(&msg, v) : agw_jscan_skip(&msg);
            }
            if (!ok)
                return false;
        }
        if (rc < 0)
            return false;
        agw_jscan_leave(&msgs, &msg);
        kept = kept && keep_message(in, &cap, base, m, msgs.p, &id);
        for (r = 0; r < AGW_ARRAY_LEN(roles); r++)
            if (val_is(&role, roles[r]))
                break;
        if (r == AGW_ARRAY_LEN(roles) || (id.first != '\0' && id.first != 'n' && id.s == NULL))
            return false;
        if (val_is(&role, "tool")) {
            if (tool_call.s == NULL || tool_call.n == 0)
                return false;
            in->has_decision = true;
        } else if (val_is(&role, "user")) {
            if (content == NULL || !fast_user_content(content, content_end, &in->has_user_input))
                return false;
        }
    }
    if (rc < 0)
        return false;
    agw_jscan_leave(top, &msgs);
    in->messages_read = kept;
    if (!kept) {
        free(in->messages);
        in->messages = NULL;
        in->n_messages = 0;
    }
    return true;
}

/* check_tools() on the value at top->p, consumed. */
static bool fast_tools(struct agw_jscan *top)
{
    struct agw_jscan tools, tool;
    const char *k;
    size_t kn;
    int rc;

    if (*top->p == 'n')
        return agw_jscan_skip(top);
    if (*top->p != '[' || !agw_jscan_enter(&tools, top))
        return false;
    while ((rc = agw_jscan_next(&tools, NULL, NULL)) == 1) {
        struct val name = {0}, params = {0}, execute = {0};
        if (*tools.p != '{' || !agw_jscan_enter(&tool, &tools))
            return false;
        while ((rc = agw_jscan_next(&tool, &k, &kn)) == 1) {
            struct val *v = agw_streq_n(k, kn, "name")         ? &name
                            : agw_streq_n(k, kn, "parameters") ? &params
                            : agw_streq_n(k, kn, "execute")    ? &execute
                                                               : NULL;
            if (!(v != NULL ? take(&tool, v) : agw_jscan_skip(&tool)))
                return false;
        }
        if (rc < 0 || name.s == NULL || name.n == 0)
            return false;
        /* parameters as a string (legacy clients) is jansson's to read */
        if (params.first != '\0' && params.first != 'n' && params.first != '{')
            return false;
        if (execute.first != '\0' && execute.first != 'n' && !val_is(&execute, "frontend") &&
            !val_is(&execute, "backend"))
            return false;
        agw_jscan_leave(&tools, &tool);
    }
    if (rc < 0)
        return false;
    agw_jscan_leave(top, &tools);
    return true;
}

/* check_context() on the value at top->p, consumed. */
static bool fast_context(struct agw_jscan *top)
{
    struct agw_jscan items;
    int rc;

    if (*top->p == 'n')
        return agw_jscan_skip(top);
    if (*top->p != '[' || !agw_jscan_enter(&items, top))
        return false;
    while ((rc = agw_jscan_next(&items, NULL, NULL)) == 1)
        if (*items.p != '{' || !agw_jscan_skip(&items))
            return false;
    if (rc < 0)
        return false;
    agw_jscan_leave(top, &items);
    return true;
}

static bool fast_read(const char *body, size_t len, bool keep, struct agw_input *in)
{
    const char *end = body + len, *p = agw_jscan_ws(body, end), *k;
    struct agw_jscan top;
    struct val thread = {0}, run = {0};
    bool messages = false;
    size_t kn;
    int rc;

    if (p == end || *p != '{' || !agw_jscan_open(&top, p, end, FAST_MAX_DEPTH, true))
        return false;
    while ((rc = agw_jscan_next(&top, &k, &kn)) == 1) {
        bool ok;
        if (agw_streq_n(k, kn, "threadId"))
            ok = take(&top, &thread);
        else if (agw_streq_n(k, kn, "runId"))
            ok = take(&top, &run);
        else if (agw_streq_n(k, kn, "messages"))
            ok = messages = fast_messages(&top, body, keep, in);
        else if (agw_streq_n(k, kn, "tools"))
            ok = fast_tools(&top);
        else if (agw_streq_n(k, kn, "context"))
            ok = fast_context(&top);
        else
            ok = agw_jscan_skip(&top);
        if (!ok)
            return false;
    }
    /* ids become C strings as they are written: no escape to decode */
    if (rc < 0 || agw_jscan_ws(top.p, end) != end || !messages || thread.s == NULL ||
        thread.escaped || thread.n == 0 || run.s == NULL || run.escaped || run.n == 0)
        return false;
    in->thread_id = agw_xstrndup(thread.s, thread.n);
    in->run_id = agw_xstrndup(run.s, run.n);
    in->decision_only = !in->has_user_input && in->has_decision;
    return true;
}

static bool scan(const char *body, size_t len, bool keep, struct agw_input *in)
{
    memset(in, 0, sizeof(*in));
    if (body != NULL && fast_read(body, len, keep, in))
        return true;
    free(in->messages);
    memset(in, 0, sizeof(*in));
    return false;
}

bool agw_input_scan(const char *body, size_t len, struct agw_input *in)
{
    return scan(body, len, true, in);
}

static int parse(const char *body, size_t len, unsigned max_depth, bool keep, struct agw_input *in,
                 char *err, size_t errlen)
{
    assert(in != NULL);
    if (max_depth == 0)
        max_depth = DEFAULT_MAX_DEPTH;
    /* The scanner reads no more than 1 + FAST_MAX_DEPTH levels: under a limit above that, what it
     * reads is within the limit, and the depth's own pass over the body is left to jansson's
     * reading. */
    if (body != NULL &&
        (max_depth > FAST_MAX_DEPTH || max_nesting(body, len, max_depth) <= max_depth) &&
        scan(body, len, keep, in)) {
        if (err != NULL && errlen > 0)
            err[0] = '\0';
        return 0;
    }
    return agw_input_parse_jansson(body, len, max_depth, in, err, errlen);
}

int agw_input_parse(const char *body, size_t len, unsigned max_depth, struct agw_input *in,
                    char *err, size_t errlen)
{
    return parse(body, len, max_depth, false, in, err, errlen);
}

int agw_input_parse_keep(const char *body, size_t len, unsigned max_depth, struct agw_input *in,
                         char *err, size_t errlen)
{
    return parse(body, len, max_depth, true, in, err, errlen);
}

int agw_input_parse_jansson(const char *body, size_t len, unsigned max_depth, struct agw_input *in,
                            char *err, size_t errlen)
{
    json_t *root = NULL;
    json_error_t jerr;
    char *near;
    int rc;

    assert(in != NULL);
    memset(in, 0, sizeof(*in));
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (body == NULL)
        body = "";
    if (max_depth == 0)
        max_depth = DEFAULT_MAX_DEPTH;

    if (max_nesting(body, len, max_depth) > max_depth)
        return fail(err, errlen, 400, "bad request: JSON nested deeper than %u levels", max_depth);

    /* JSON_DECODE_ANY so that a scalar body gets the "must be an object" message rather than a
     * parser complaint; JSON_ALLOW_NUL because "\u0000" is valid JSON (ids refuse it, see
     * check_id). Trailing garbage and invalid UTF-8 remain errors. */
    root = json_loadb(body, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    if (root == NULL) {
        near = strstr(jerr.text, " near '");
        if (near != NULL)
            *near = '\0';
        return fail(err, errlen, 400,
                    "bad request: body is not valid JSON: %s at line %d column %d", jerr.text,
                    jerr.line, jerr.column);
    }
    if (!json_is_object(root)) {
        rc = fail(err, errlen, 400, "bad request: body must be a JSON object");
        goto out;
    }
    if ((rc = check_id(root, "threadId", err, errlen)) != 0 ||
        (rc = check_id(root, "runId", err, errlen)) != 0 ||
        (rc = check_messages(root, in, err, errlen)) != 0 ||
        (rc = check_tools(root, max_depth, err, errlen)) != 0 ||
        (rc = check_context(root, err, errlen)) != 0)
        goto out;

    in->thread_id = agw_xstrdup(json_string_value(json_object_get(root, "threadId")));
    in->run_id = agw_xstrdup(json_string_value(json_object_get(root, "runId")));
    in->decision_only = !in->has_user_input && in->has_decision;
    rc = 0;
out:
    if (rc != 0)
        memset(in, 0, sizeof(*in));
    json_decref(root);
    return rc;
}

void agw_input_clear(struct agw_input *in)
{
    if (in == NULL)
        return;
    free(in->thread_id);
    free(in->run_id);
    free(in->messages);
    memset(in, 0, sizeof(*in));
}
