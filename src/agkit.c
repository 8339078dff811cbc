/* The legacy AG-Kit dialect, both ways: see include/agw/agkit.h and doc/dialects.md. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "agw/agkit.h"

/* JSON text → a value; an integer past 64 bits (valid JSON, a double for JavaScript) becomes a real
 * rather than an error. */
static json_t *load(const char *data, size_t len)
{
    json_t *v = json_loadb(data, len, 0, NULL);

    return v != NULL ? v : json_loadb(data, len, JSON_DECODE_INT_AS_REAL, NULL);
}

/* <v> as compact JSON text, its length in *<len>. */
static char *dump(const json_t *v, size_t *len)
{
    char *text = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);

    if (text == NULL)
        abort(); /* out of memory */
    *len = strlen(text);
    return text;
}

/* ---- the request ----------------------------------------------------------------------------- */

/* A message's text: a string content as it is, or its "text" parts joined (an input-parts array).
 */
static json_t *content_text(json_t *content)
{
    json_t *part;
    size_t i;
    char *joined = NULL;
    size_t len = 0;
    json_t *out;

    if (json_is_string(content))
        return json_incref(content);
    if (!json_is_array(content))
        return json_string("");
    json_array_foreach(content, i, part)
    {
        json_t *text = json_object_get(part, "text");
        const char *type = json_string_value(json_object_get(part, "type"));
        if (type == NULL || strcmp(type, "text") != 0 || !json_is_string(text))
            continue;
        joined = agw_xrealloc(joined, len + json_string_length(text) + 1);
        memcpy(joined + len, json_string_value(text), json_string_length(text));
        len += json_string_length(text);
    }
    out = json_stringn(joined != NULL ? joined : "", len);
    free(joined);
    return out != NULL ? out : json_string("");
}

static json_t *legacy_message(json_t *m)
{
    json_t *out = json_object();
    json_t *role = json_object_get(m, "role");
    json_t *call = json_object_get(m, "toolCallId");

    json_object_set(out, "role", role);
    json_object_set_new(out, "content", content_text(json_object_get(m, "content")));
    if (json_is_string(call))
        json_object_set(out, "toolCallId", call);
    return out;
}

char *agw_agkit_request(const char *body, size_t len, size_t *out_len, char *err, size_t errlen)
{
    json_t *in = load(body, len), *out = NULL, *messages, *tools, *resume, *m;
    size_t i, first = 0;
    char *text = NULL;

    if (!json_is_object(in)) {
        snprintf(err, errlen, "the request is not a JSON object");
        goto out;
    }
    out = json_object();
    json_object_set(out, "conversationId", json_object_get(in, "threadId"));
    messages = json_object_get(in, "messages");
    json_array_foreach(messages, i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (role != NULL && strcmp(role, "assistant") == 0)
            first = i + 1; /* the backend has seen everything up to its own last answer */
    }
    json_t *delta = json_array();
    for (i = first; i < json_array_size(messages); i++)
        json_array_append_new(delta, legacy_message(json_array_get(messages, i)));
    json_object_set_new(out, "messages", delta);
    tools = json_object_get(in, "tools");
    if (json_array_size(tools) > 0) {
        json_t *list = json_array(), *tool;
        json_array_foreach(tools, i, tool)
        {
            json_t *t = json_object();
            json_t *params = json_object_get(tool, "parameters");
            char *schema = params != NULL ? json_dumps(params, JSON_COMPACT | JSON_ENCODE_ANY)
                                          : agw_xstrdup("{}");
            if (schema == NULL)
                abort(); /* out of memory */
            json_object_set(t, "name", json_object_get(tool, "name"));
            json_object_set(t, "description", json_object_get(tool, "description"));
            json_object_set_new(t, "parameters", json_string(schema));
            free(schema);
            json_array_append_new(list, t);
        }
        json_object_set_new(out, "tools", list);
    }
    /* resume: one answer to an interrupt, {interruptId, payload} (an array's first one). */
    resume = json_object_get(in, "resume");
    if (json_is_array(resume))
        resume = json_array_get(resume, 0);
    if (json_is_object(resume)) {
        json_t *r = json_object();
        json_t *id = json_object_get(resume, "interruptId");
        json_object_set(r, "interruptId", id != NULL ? id : json_object_get(resume, "id"));
        json_object_set(r, "payload", json_object_get(resume, "payload"));
        json_object_set_new(out, "resume", r);
    }
    text = dump(out, out_len);
out:
    json_decref(in);
    json_decref(out);
    return text;
}

/* ---- the events ------------------------------------------------------------------------------ */

struct agw_agkit {
    char *run_id;
    unsigned n_messages; /* messages made so far (their ids count up) */
    char *text_id;       /* the open text message's id, or NULL */
    bool finished;
};

struct agw_agkit *agw_agkit_new(const char *run_id)
{
    struct agw_agkit *t = agw_xcalloc(1, sizeof(*t));

    t->run_id = agw_xstrdup(run_id);
    return t;
}

void agw_agkit_free(struct agw_agkit *t)
{
    if (t == NULL)
        return;
    free(t->run_id);
    free(t->text_id);
    free(t);
}

static void emit_json(json_t *ev, agw_agkit_emit_fn *emit, void *arg)
{
    char *s = json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER);

    if (s == NULL)
        abort(); /* out of memory */
    emit(arg, s, strlen(s));
    free(s);
    json_decref(ev);
}

/* "<run id>-msg-<n>": unique in the thread, since run ids are. Allocated. */
static char *new_id(struct agw_agkit *t)
{
    size_t len = strlen(t->run_id) + 16;
    char *id = agw_xmalloc(len);

    snprintf(id, len, "%s-msg-%u", t->run_id, ++t->n_messages);
    return id;
}

static void end_text(struct agw_agkit *t, agw_agkit_emit_fn *emit, void *arg)
{
    if (t->text_id == NULL)
        return;
    emit_json(json_pack("{s:s,s:s}", "type", "TEXT_MESSAGE_END", "messageId", t->text_id), emit,
              arg);
    free(t->text_id);
    t->text_id = NULL;
}

/* Copies the fields <keys> of <from> that are present into a new event of <type>. */
static json_t *event_from(const char *type, json_t *from, const char *const *keys)
{
    json_t *ev = json_pack("{s:s}", "type", type);

    for (size_t i = 0; keys[i] != NULL; i++) {
        json_t *v = json_object_get(from, keys[i]);
        if (v != NULL && !json_is_null(v))
            json_object_set(ev, keys[i], v);
    }
    return ev;
}

static bool is_done(const char *data, size_t len)
{
    while (len > 0 && (data[len - 1] == ' ' || data[len - 1] == '\t'))
        len--;
    while (len > 0 && (*data == ' ' || *data == '\t')) {
        data++;
        len--;
    }
    return len == 6 && memcmp(data, "[DONE]", 6) == 0;
}

int agw_agkit_feed(struct agw_agkit *t, const char *data, size_t len, agw_agkit_emit_fn *emit,
                   void *arg)
{
    static const char *const start_keys[] = {"toolCallId", "toolCallName", NULL};
    static const char *const args_keys[] = {"toolCallId", "delta", NULL};
    static const char *const end_keys[] = {"toolCallId", NULL};
    json_t *ev, *type_v;
    const char *type;
    int rc = 0;

    if (t->finished)
        return 1;
    if (is_done(data, len)) {
        end_text(t, emit, arg);
        emit_json(json_pack("{s:s}", "type", "RUN_FINISHED"), emit, arg);
        t->finished = true;
        return 1;
    }
    ev = load(data, len);
    type_v = json_object_get(ev, "type");
    if (!json_is_string(type_v)) {
        emit(arg, data, len); /* not an event: the normaliser says so */
        json_decref(ev);
        return 0;
    }
    type = json_string_value(type_v);
    if (strcmp(type, "text") == 0) {
        json_t *content = json_object_get(ev, "content");
        if (json_is_string(content) && json_string_length(content) > 0) {
            if (t->text_id == NULL) {
                t->text_id = new_id(t);
                emit_json(json_pack("{s:s,s:s,s:s}", "type", "TEXT_MESSAGE_START", "messageId",
                                    t->text_id, "role", "assistant"),
                          emit, arg);
            }
            emit_json(json_pack("{s:s,s:s,s:O}", "type", "TEXT_MESSAGE_CONTENT", "messageId",
                                t->text_id, "delta", content),
                      emit, arg);
        }
    } else if (strcmp(type, "tool-call-start") == 0) {
        end_text(t, emit, arg);
        emit_json(event_from("TOOL_CALL_START", ev, start_keys), emit, arg);
    } else if (strcmp(type, "tool-call-args") == 0) {
        end_text(t, emit, arg);
        emit_json(event_from("TOOL_CALL_ARGS", ev, args_keys), emit, arg);
    } else if (strcmp(type, "tool-call-end") == 0) {
        end_text(t, emit, arg);
        emit_json(event_from("TOOL_CALL_END", ev, end_keys), emit, arg);
    } else if (strcmp(type, "tool-result") == 0) {
        json_t *result = json_object_get(ev, "result"), *content;
        char *id;
        end_text(t, emit, arg);
        id = new_id(t);
        if (json_is_string(result)) {
            content = json_incref(result);
        } else {
            char *s = json_dumps(result != NULL ? result : json_null(),
                                 JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
            content = json_string(s != NULL ? s : "null");
            free(s);
        }
        json_t *out = json_pack("{s:s,s:s,s:o,s:s}", "type", "TOOL_CALL_RESULT", "messageId", id,
                                "content", content, "role", "tool");
        json_t *call = json_object_get(ev, "toolCallId");
        if (json_is_string(call))
            json_object_set(out, "toolCallId", call);
        free(id);
        emit_json(out, emit, arg);
    } else if (strcmp(type, "interrupt") == 0) {
        static const char *const interrupt_keys[] = {"id", "reason", "payload", NULL};
        json_t *interrupt = event_from("interrupt", ev, interrupt_keys);
        json_object_del(interrupt, "type");
        end_text(t, emit, arg);
        emit_json(json_pack("{s:s,s:{s:s,s:[o]}}", "type", "RUN_FINISHED", "outcome", "type",
                            "interrupt", "interrupts", interrupt),
                  emit, arg);
        t->finished = true;
        rc = 1;
    }
    /* Any other legacy type has no AG-UI meaning: dropped. */
    json_decref(ev);
    return rc;
}

void agw_agkit_end(struct agw_agkit *t, agw_agkit_emit_fn *emit, void *arg)
{
    if (!t->finished)
        end_text(t, emit, arg);
}

/* ---- legacy clients ----------------------------------------------------------------------------
 */

int agw_agkit_legacy_thread(const char *body, size_t len, char *out, size_t outlen)
{
    json_t *in = load(body, len), *c;
    int rc = 0;

    out[0] = '\0';
    if (!json_is_object(in)) {
        rc = -AGW_EINVAL;
    } else if ((c = json_object_get(in, "conversationId")) != NULL) {
        if (!json_is_string(c) || json_string_length(c) == 0 || json_string_length(c) >= outlen ||
            strlen(json_string_value(c)) != json_string_length(c))
            rc = -AGW_EINVAL;
        else {
            memcpy(out, json_string_value(c), json_string_length(c) + 1);
            rc = 1;
        }
    }
    json_decref(in);
    return rc;
}

static int legacy_fail(char *err, size_t errlen, const char *fmt, ...) AGW_PRINTF(3, 4);

static int legacy_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -AGW_EINVAL;
}

/* One legacy message → an AG-UI one with id <run_id>-in-<n>. */
static int from_legacy_message(json_t *m, size_t i, const char *run_id, json_t *out, char *err,
                               size_t errlen)
{
    static const char *const roles[] = {"user", "tool", "system", "developer", "assistant", NULL};
    const char *role = json_string_value(json_object_get(m, "role"));
    json_t *content = json_object_get(m, "content"), *call = json_object_get(m, "toolCallId");
    size_t k = 0, idlen = strlen(run_id) + 32;
    char *id;

    if (!json_is_object(m))
        return legacy_fail(err, errlen, "messages[%zu] must be an object", i);
    while (role != NULL && roles[k] != NULL && strcmp(roles[k], role) != 0)
        k++;
    if (role == NULL || roles[k] == NULL)
        return legacy_fail(err, errlen,
                           "messages[%zu].role must be one of user, tool, system, developer, "
                           "assistant",
                           i);
    if (!json_is_string(content))
        return legacy_fail(err, errlen, "messages[%zu].content must be a string", i);
    if (strcmp(role, "tool") == 0 && (!json_is_string(call) || json_string_length(call) == 0))
        return legacy_fail(err, errlen, "messages[%zu].toolCallId is required for a tool message",
                           i);
    id = agw_xmalloc(idlen);
    snprintf(id, idlen, "%s-in-%zu", run_id, i + 1);
    json_t *msg = json_pack("{s:s,s:s,s:O}", "id", id, "role", role, "content", content);
    free(id);
    if (strcmp(role, "tool") == 0)
        json_object_set(msg, "toolCallId", call);
    json_array_append_new(out, msg);
    return 0;
}

char *agw_agkit_legacy_to_input(const char *body, size_t len, const char *thread_id,
                                const char *run_id, const char *history, size_t history_len,
                                size_t *out_len, char *err, size_t errlen)
{
    json_t *in = load(body, len), *out = NULL, *messages, *tools, *resume, *x;
    json_t *all = json_array(), *page = NULL;
    char *text = NULL;
    size_t i;

    if (!json_is_object(in)) {
        snprintf(err, errlen, "the body must be a JSON object");
        goto out;
    }
    /* The thread so far, oldest first (the page is newest first), as @ag-ui/client sends what it
     * holds: without activity messages (a UI's, not the model's). */
    page = history != NULL ? load(history, history_len) : NULL;
    x = json_object_get(page, "messages");
    for (i = json_array_size(x); i > 0; i--) {
        json_t *m = json_array_get(x, i - 1);
        const char *role = json_string_value(json_object_get(m, "role"));

        if (role == NULL || strcmp(role, "activity") != 0)
            json_array_append(all, m);
    }
    messages = json_object_get(in, "messages");
    if (messages != NULL && !json_is_array(messages)) {
        snprintf(err, errlen, "messages must be an array");
        goto out;
    }
    json_array_foreach(messages, i, x)
    {
        if (from_legacy_message(x, i, run_id, all, err, errlen) != 0)
            goto out;
    }
    out = json_pack("{s:s,s:s,s:O,s:[],s:[],s:{},s:{}}", "threadId", thread_id, "runId", run_id,
                    "messages", all, "tools", "context", "state", "forwardedProps");
    tools = json_object_get(in, "tools");
    if (tools != NULL && !json_is_array(tools)) {
        snprintf(err, errlen, "tools must be an array");
        goto out;
    }
    json_array_foreach(tools, i, x)
    {
        json_t *name = json_object_get(x, "name"), *params = json_object_get(x, "parameters");
        json_t *parsed = NULL, *desc = json_object_get(x, "description");
        if (!json_is_string(name) || json_string_length(name) == 0) {
            legacy_fail(err, errlen, "tools[%zu].name must be a non-empty string", i);
            goto out;
        }
        if (json_is_string(params))
            parsed = json_loads(json_string_value(params), 0, NULL);
        else if (json_is_object(params))
            parsed = json_incref(params);
        else if (params == NULL)
            parsed = json_pack("{s:s}", "type", "object");
        if (!json_is_object(parsed)) {
            json_decref(parsed);
            legacy_fail(err, errlen,
                        "tools[%zu].parameters must be a JSON Schema object as a string", i);
            goto out;
        }
        json_array_append_new(json_object_get(out, "tools"),
                              json_pack("{s:O,s:o,s:o}", "name", name, "description",
                                        json_is_string(desc) ? json_incref(desc) : json_string(""),
                                        "parameters", parsed));
    }
    resume = json_object_get(in, "resume");
    if (resume != NULL) {
        json_t *id = json_object_get(resume, "interruptId");
        if (!json_is_object(resume) || !json_is_string(id)) {
            snprintf(err, errlen, "resume must be an object with a string interruptId");
            goto out;
        }
        json_t *payload = json_object_get(resume, "payload");
        json_object_set_new(out, "resume",
                            json_pack("[{s:O,s:O}]", "interruptId", id, "payload",
                                      payload != NULL ? payload : json_null()));
    }
    if (json_array_size(all) == 0 && resume == NULL) {
        snprintf(err, errlen, "messages must not be empty (or give resume)");
        goto out;
    }
    text = dump(out, out_len);
out:
    json_decref(in);
    json_decref(out);
    json_decref(all);
    json_decref(page);
    return text;
}

int agw_agkit_to_legacy(const char *json, size_t len, agw_agkit_emit_fn *emit, void *arg)
{
    json_t *ev = load(json, len);
    const char *type = json_string_value(json_object_get(ev, "type"));
    int rc = 0;

    if (type == NULL) {
        json_decref(ev);
        return 0;
    }
    if (strcmp(type, "TEXT_MESSAGE_CONTENT") == 0 || strcmp(type, "TEXT_MESSAGE_CHUNK") == 0) {
        json_t *delta = json_object_get(ev, "delta");
        if (json_is_string(delta) && json_string_length(delta) > 0)
            emit_json(json_pack("{s:s,s:O}", "type", "text", "content", delta), emit, arg);
    } else if (strcmp(type, "TOOL_CALL_START") == 0) {
        static const char *const keys[] = {"toolCallId", "toolCallName", NULL};
        emit_json(event_from("tool-call-start", ev, keys), emit, arg);
    } else if (strcmp(type, "TOOL_CALL_ARGS") == 0) {
        static const char *const keys[] = {"toolCallId", "delta", NULL};
        emit_json(event_from("tool-call-args", ev, keys), emit, arg);
    } else if (strcmp(type, "TOOL_CALL_END") == 0) {
        static const char *const keys[] = {"toolCallId", NULL};
        emit_json(event_from("tool-call-end", ev, keys), emit, arg);
    } else if (strcmp(type, "TOOL_CALL_RESULT") == 0) {
        json_t *out = json_pack("{s:s}", "type", "tool-result");
        json_t *call = json_object_get(ev, "toolCallId"), *content = json_object_get(ev, "content");
        if (json_is_string(call))
            json_object_set(out, "toolCallId", call);
        json_object_set_new(out, "result",
                            content != NULL ? json_incref(content) : json_string(""));
        emit_json(out, emit, arg);
    } else if (strcmp(type, "RUN_FINISHED") == 0) {
        json_t *outcome = json_object_get(ev, "outcome"), *it;
        const char *otype = json_string_value(json_object_get(outcome, "type"));
        size_t i;
        if (otype != NULL && strcmp(otype, "interrupt") == 0) {
            json_array_foreach(json_object_get(outcome, "interrupts"), i, it)
            {
                static const char *const keys[] = {"id", "reason", "payload", NULL};
                emit_json(event_from("interrupt", it, keys), emit, arg);
            }
        }
        emit(arg, "[DONE]", 6);
        rc = 1;
    } else if (strcmp(type, "RUN_ERROR") == 0) {
        static const char *const keys[] = {"code", "message", NULL};
        emit_json(event_from("error", ev, keys), emit, arg);
        rc = 1;
    }
    json_decref(ev);
    return rc;
}
