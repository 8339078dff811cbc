/* A run's plan and its events. Content events, the hot path of every benchmark, are written from
 * a prefix and a JSON literal made once per delta, without the JSON library; every other event is
 * built with jansson. */
#include "config.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <jansson.h>

#include "agw/common.h"

#include "run.h"

static const char *const ev_names[] = {
    "RUN_STARTED",
    "TEXT_MESSAGE_START",
    "TEXT_MESSAGE_CONTENT",
    "TEXT_MESSAGE_END",
    "TOOL_CALL_START",
    "TOOL_CALL_ARGS",
    "TOOL_CALL_END",
    "TOOL_CALL_RESULT",
    "RUN_FINISHED",
    "RUN_ERROR",
    "REASONING_START",
    "REASONING_MESSAGE_START",
    "REASONING_MESSAGE_CONTENT",
    "REASONING_MESSAGE_END",
    "REASONING_END",
    "ACTIVITY_SNAPSHOT",
    "ACTIVITY_DELTA",
    NULL, /* EV_LITERAL: its step's name */
    NULL,
    NULL,
    NULL,
};

static uint64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---- plans ----------------------------------------------------------------------------------- */

static char *json_literal(const char *s, size_t len, size_t *out_len)
{
    json_t *j = json_stringn(s, len);
    char *lit;

    if (!j) /* not UTF-8: only our own text reaches here, and jansson validated the request's */
        j = json_string("");
    lit = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(j);
    if (!lit)
        abort(); /* out of memory, the daemon's policy */
    *out_len = strlen(lit);
    return lit;
}

struct step *plan_add(struct run *r, enum ev_kind kind)
{
    struct step *s;

    if (r->nsteps == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 16;
        r->steps = agw_xrealloc(r->steps, r->cap * sizeof(*r->steps));
    }
    s = &r->steps[r->nsteps++];
    memset(s, 0, sizeof(*s));
    s->kind = kind;
    return s;
}

static void piece_set(struct piece *p, const char *s, size_t len)
{
    p->raw = agw_xstrndup(s, len);
    p->raw_len = len;
    p->lit = json_literal(s, len, &p->lit_len);
}

static char *filler(size_t size)
{
    static const char text[] =
        "lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod "
        "tempor incididunt ut labore et dolore magna aliqua. ";
    char *out = agw_xmalloc(size + 1);
    for (size_t i = 0; i < size; i++)
        out[i] = text[i % (sizeof(text) - 1)];
    out[size] = '\0';
    return out;
}

/* Adds TEXT_MESSAGE_START, the content and TEXT_MESSAGE_END for message <id>. For the run's final
 * text
 * (<final>), the events and size knobs replace the scenario's deltas. */
void plan_text(struct run *r, const char *id, const char *const *texts, size_t ntexts, bool final)
{
    struct step *s;
    char prefix[256];
    size_t idlen;
    char *idlit = json_literal(id, strlen(id), &idlen);

    s = plan_add(r, EV_TEXT_START);
    s->id = agw_xstrdup(id);
    s = plan_add(r, EV_TEXT_CONTENT);
    s->id = agw_xstrdup(id);
    s->count = ntexts;
    if (final && r->k.size >= 0) {
        char *f = filler((size_t)r->k.size);
        s->pieces = agw_xcalloc(1, sizeof(*s->pieces));
        s->npieces = 1;
        piece_set(&s->pieces[0], f, (size_t)r->k.size);
        free(f);
    } else {
        s->pieces = agw_xcalloc(ntexts ? ntexts : 1, sizeof(*s->pieces));
        s->npieces = ntexts;
        for (size_t i = 0; i < ntexts; i++)
            piece_set(&s->pieces[i], texts[i], strlen(texts[i]));
    }
    if (final && r->k.events >= 0)
        s->count = (uint64_t)r->k.events;
    if (s->npieces == 0)
        s->count = 0;
    snprintf(prefix, sizeof(prefix),
             "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":%s,\"delta\":", idlit);
    s->prefix = agw_xstrdup(prefix);
    s->prefix_len = strlen(prefix);
    free(idlit);
    if (r->k.stall) {
        if (s->count > 1)
            s->count = 1;
        plan_add(r, EV_STALL);
        return;
    }
    s = plan_add(r, EV_TEXT_END);
    s->id = agw_xstrdup(id);
}

/* Adds a tool call: TOOL_CALL_START, one TOOL_CALL_ARGS (the CloudBase dialect carries the
 * arguments in the start event instead) and TOOL_CALL_END. */
void plan_tool_call(struct run *r, const char *call_id, const char *name, const char *parent,
                    const char *args)
{
    struct step *s = plan_add(r, EV_TOOL_START);
    s->id = agw_xstrdup(call_id);
    s->name = agw_xstrdup(name);
    s->parent = parent ? agw_xstrdup(parent) : NULL;
    s->text = agw_xstrdup(args);
    if (r->k.dialect != DIALECT_CLOUDBASE) {
        s = plan_add(r, EV_TOOL_ARGS);
        s->id = agw_xstrdup(call_id);
        s->text = agw_xstrdup(args);
    }
    s = plan_add(r, EV_TOOL_END);
    s->id = agw_xstrdup(call_id);
}

void plan_reasoning(struct run *r, const char *span, const char *id, const char *const *texts,
                    size_t ntexts)
{
    struct step *s = plan_add(r, EV_REASONING_START);

    s->id = agw_xstrdup(span);
    s = plan_add(r, EV_REASONING_MESSAGE_START);
    s->id = agw_xstrdup(id);
    for (size_t i = 0; i < ntexts; i++) {
        s = plan_add(r, EV_REASONING_MESSAGE_CONTENT);
        s->id = agw_xstrdup(id);
        s->text = agw_xstrdup(texts[i]);
    }
    s = plan_add(r, EV_REASONING_MESSAGE_END);
    s->id = agw_xstrdup(id);
    s = plan_add(r, EV_REASONING_END);
    s->id = agw_xstrdup(span);
}

void plan_activity(struct run *r, const char *id, bool delta, const char *json)
{
    struct step *s = plan_add(r, delta ? EV_ACTIVITY_DELTA : EV_ACTIVITY_SNAPSHOT);

    s->id = agw_xstrdup(id);
    s->text = agw_xstrdup(json);
}

void plan_literal(struct run *r, json_t *ev)
{
    struct step *s = plan_add(r, EV_LITERAL);

    s->name = agw_xstrdup(json_string_value(json_object_get(ev, "type")));
    s->text = json_dumps(ev, JSON_COMPACT);
    if (s->text == NULL)
        abort(); /* out of memory, the daemon's policy */
    json_decref(ev);
}

void plan_begin(struct run *r)
{
    if (!r->k.lifecycle_none)
        plan_add(r, EV_RUN_STARTED);
}

void plan_end(struct run *r)
{
    if (r->k.fail)
        plan_add(r, EV_RUN_ERROR);
    else if (!r->k.lifecycle_none)
        plan_add(r, EV_RUN_FINISHED);
    if (r->k.done)
        plan_add(r, EV_DONE);
}

void run_free(struct run *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nsteps; i++) {
        struct step *s = &r->steps[i];
        for (size_t j = 0; j < s->npieces; j++) {
            free(s->pieces[j].raw);
            free(s->pieces[j].lit);
        }
        free(s->pieces);
        free(s->id);
        free(s->call_id);
        free(s->name);
        free(s->parent);
        free(s->text);
        free(s->prefix);
    }
    free(r->steps);
    free(r->thread_id);
    free(r->run_id);
    free(r->pending_call);
    free(r->pending_name);
    free(r->pending_args);
    free(r->scratch);
    if (r->batch)
        evbuffer_free(r->batch);
    if (r->hold)
        evbuffer_free(r->hold);
    free(r);
}

/* ---- producing events ------------------------------------------------------------------------ */

static void scratch_reserve(struct run *r, size_t need)
{
    if (need > r->scratch_cap) {
        r->scratch_cap = need + 256;
        r->scratch = agw_xrealloc(r->scratch, r->scratch_cap);
    }
}

/* Writes one SSE frame holding <data> (one data: line per line of <data>) into <out>, with the
 * framing the knobs ask for. <type> names the event for comments=1 (NULL for [DONE]). */
static void put_frame(struct run *r, struct evbuffer *out, const char *type, const char *data,
                      size_t len)
{
    const char *eol = r->k.crlf ? "\r\n" : "\n";
    size_t el = r->k.crlf ? 2 : 1;
    const char *p = data, *end = data + len;

    if (r->k.comments) {
        if (r->emitted % 4 == 0) { /* a comment-only block between frames */
            evbuffer_add(out, ": keepalive", 11);
            evbuffer_add(out, eol, el);
            evbuffer_add(out, eol, el);
        }
        if (type)
            evbuffer_add_printf(out, "event: %s%s", type, eol);
        evbuffer_add_printf(out, "id: %" PRIu64 "%s", r->emitted + 1, eol);
        if (r->emitted % 4 == 2) { /* a comment line inside a frame */
            evbuffer_add(out, ": demo", 6);
            evbuffer_add(out, eol, el);
        }
    }
    for (;;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        evbuffer_add(out, "data: ", 6);
        evbuffer_add(out, p, n);
        evbuffer_add(out, eol, el);
        if (!nl)
            break;
        p = nl + 1;
    }
    evbuffer_add(out, eol, el);
}

static void set_str(json_t *obj, const char *key, const char *val)
{
    json_object_set_new(obj, key, json_string(val));
}

/* The event of step <s> (repetition <rep>) as JSON; used for everything but compact content events.
 */
static json_t *step_json(const struct run *r, const struct step *s, uint64_t rep)
{
    json_t *ev = json_object();

    set_str(ev, "type", ev_names[s->kind]);
    switch (s->kind) {
    case EV_RUN_STARTED:
    case EV_RUN_FINISHED:
        set_str(ev, "threadId", r->thread_id);
        set_str(ev, "runId", r->run_id);
        break;
    case EV_RUN_ERROR:
        if (r->k.dialect == DIALECT_CLOUDBASE) {
            json_object_set_new(ev, "error",
                                json_pack("{s:s,s:s}", "code", "MODEL_ERROR", "message",
                                          "demo failure requested (fail=1)"));
        } else {
            set_str(ev, "message", "demo failure requested (fail=1)");
            set_str(ev, "code", "MODEL_ERROR");
        }
        break;
    case EV_TEXT_START:
        set_str(ev, "messageId", s->id);
        if (r->k.dialect != DIALECT_CLOUDBASE)
            set_str(ev, "role", "assistant");
        if (r->k.metadata)
            json_object_set_new(ev, "metadata", json_pack("{s:s}", "model", "agui-demo"));
        break;
    case EV_TEXT_CONTENT: {
        const struct piece *p = &s->pieces[rep % s->npieces];
        set_str(ev, "messageId", s->id);
        json_object_set_new(ev, "delta", json_stringn(p->raw, p->raw_len));
        if (r->k.ts)
            json_object_set_new(ev, "sentUs", json_integer((json_int_t)wall_us()));
        break;
    }
    case EV_TEXT_END:
    case EV_TOOL_END:
        set_str(ev, s->kind == EV_TEXT_END ? "messageId" : "toolCallId", s->id);
        if (r->k.metadata && s->kind == EV_TEXT_END)
            json_object_set_new(ev, "metadata",
                                json_pack("{s:s, s:{s:i}}", "finishReason", "stop", "usage",
                                          "outputTokens", (int)r->emitted));
        break;
    case EV_TOOL_START:
        set_str(ev, "toolCallId", s->id);
        set_str(ev, "toolCallName", s->name);
        if (s->parent)
            set_str(ev, "parentMessageId", s->parent);
        if (r->k.dialect == DIALECT_CLOUDBASE) {
            json_t *a = json_loads(s->text, 0, NULL);
            json_object_set_new(ev, "args", a ? a : json_string(s->text));
        }
        break;
    case EV_TOOL_ARGS:
        set_str(ev, "toolCallId", s->id);
        set_str(ev, "delta", s->text);
        break;
    case EV_TOOL_RESULT:
        set_str(ev, "messageId", s->id);
        set_str(ev, "toolCallId", s->call_id);
        set_str(ev, "content", s->text);
        break;
    case EV_REASONING_START:
    case EV_REASONING_MESSAGE_END:
    case EV_REASONING_END:
        set_str(ev, "messageId", s->id);
        break;
    case EV_REASONING_MESSAGE_START:
        set_str(ev, "messageId", s->id);
        set_str(ev, "role", "reasoning");
        break;
    case EV_REASONING_MESSAGE_CONTENT:
        set_str(ev, "messageId", s->id);
        set_str(ev, "delta", s->text);
        break;
    case EV_ACTIVITY_SNAPSHOT:
    case EV_ACTIVITY_DELTA:
        set_str(ev, "messageId", s->id);
        set_str(ev, "activityType", "plan");
        json_object_set_new(ev, s->kind == EV_ACTIVITY_DELTA ? "patch" : "content",
                            json_loads(s->text, 0, NULL));
        break;
    case EV_LITERAL:
    case EV_DONE:
    case EV_STALL:
    case EV_WAIT:
        assert(!"not an event built here");
        break;
    }
    return ev;
}

/* Moves the cursor past the event just produced, and past content steps with nothing (left) to say.
 */
static void advance(struct run *r)
{
    if (r->cur < r->nsteps && r->steps[r->cur].kind == EV_TEXT_CONTENT &&
        ++r->rep < r->steps[r->cur].count)
        return;
    r->cur++;
    r->rep = 0;
    while (r->cur < r->nsteps && r->steps[r->cur].kind == EV_TEXT_CONTENT &&
           r->steps[r->cur].count == 0)
        r->cur++;
}

/* The legacy AG-Kit dialect (dialect=ag-kit): lower-case events with no lifecycle and no message
 * boundaries; a confirmation is an "interrupt" rather than a tool call. Returns the event, or NULL
 * for a step the dialect does not show. */
static json_t *agkit_json(const struct run *r, const struct step *s, uint64_t rep)
{
    bool confirm = strcmp(r->scenario, "confirm") == 0;

    switch (s->kind) {
    case EV_TEXT_CONTENT: {
        const struct piece *p = &s->pieces[rep % s->npieces];
        return json_pack("{s:s,s:s%}", "type", "text", "content", p->raw, p->raw_len);
    }
    case EV_TOOL_START:
        if (confirm) {
            json_t *payload = json_loads(s->text, 0, NULL);
            return json_pack("{s:s,s:s,s:s,s:o}", "type", "interrupt", "id", s->id, "reason",
                             "confirm", "payload", payload ? payload : json_string(s->text));
        }
        return json_pack("{s:s,s:s,s:s}", "type", "tool-call-start", "toolCallId", s->id,
                         "toolCallName", s->name);
    case EV_TOOL_ARGS:
        return confirm ? NULL
                       : json_pack("{s:s,s:s,s:s}", "type", "tool-call-args", "toolCallId", s->id,
                                   "delta", s->text);
    case EV_TOOL_END:
        return confirm ? NULL
                       : json_pack("{s:s,s:s}", "type", "tool-call-end", "toolCallId", s->id);
    case EV_TOOL_RESULT: {
        json_t *result = json_loads(s->text, 0, NULL);
        return json_pack("{s:s,s:s,s:o}", "type", "tool-result", "toolCallId", s->call_id, "result",
                         result ? result : json_string(s->text));
    }
    default: /* RUN_STARTED, TEXT_MESSAGE_START/END, RUN_FINISHED, RUN_ERROR: no legacy event */
        return NULL;
    }
}

/* Produces the next event into r->batch. The cursor must be on an event (not past the end, not
 * EV_STALL). */
void emit_next(struct run *r)
{
    const struct step *s = &r->steps[r->cur];

    if (r->k.dialect == DIALECT_AGKIT && s->kind != EV_DONE) {
        json_t *ev = agkit_json(r, s, r->rep);
        if (ev != NULL) {
            char *txt = json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER);
            if (!txt)
                abort(); /* out of memory, the daemon's policy */
            put_frame(r, r->batch, NULL, txt, strlen(txt));
            free(txt);
            json_decref(ev);
        }
        r->emitted++;
        advance(r);
        return;
    }

    if (s->kind == EV_DONE) {
        put_frame(r, r->batch, NULL, "[DONE]", 6);
    } else if (s->kind == EV_LITERAL) {
        put_frame(r, r->batch, s->name, s->text, strlen(s->text));
    } else if (s->kind == EV_TEXT_CONTENT && !r->k.multiline) {
        /* the hot path of every benchmark: no JSON library, one copy into the scratch buffer */
        const struct piece *p = &s->pieces[r->rep % s->npieces];
        size_t n = s->prefix_len;
        scratch_reserve(r, s->prefix_len + p->lit_len + 48);
        memcpy(r->scratch, s->prefix, s->prefix_len);
        memcpy(r->scratch + n, p->lit, p->lit_len);
        n += p->lit_len;
        if (r->k.ts)
            n += (size_t)snprintf(r->scratch + n, r->scratch_cap - n, ",\"sentUs\":%" PRIu64,
                                  wall_us());
        r->scratch[n++] = '}';
        put_frame(r, r->batch, ev_names[s->kind], r->scratch, n);
    } else {
        json_t *ev = step_json(r, s, r->rep);
        char *txt = json_dumps(ev, r->k.multiline ? JSON_INDENT(2) : JSON_COMPACT);
        if (!txt)
            abort(); /* out of memory, the daemon's policy */
        put_frame(r, r->batch, ev_names[s->kind], txt, strlen(txt));
        free(txt);
        json_decref(ev);
    }
    r->emitted++;
    advance(r);
}
