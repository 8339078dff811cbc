/* libFuzzer driver for the AG-UI normaliser (src/agui.c). The input is the data of a sequence of
 * upstream frames; its first three bytes choose how they are fed:
 *   byte 0: bits 0-1: the end (0: agw_agui_end(), 1: agw_agui_fail() with a gateway code, 2:
 *           agw_agui_fail() with the last frame's bytes as the message, maybe not UTF-8, 3: none),
 *           bit 2: protocol "ag-kit", bit 3: other client ids (with a quote and non-ASCII),
 *           bits 4-7: which frames the sink takes as the frames they were read in, as the relay
 *           does when an event passes unchanged (frame i when bit i % 4);
 *   byte 1: the byte that separates frames;
 *   byte 2: how many frames make one read (1 + b % 8): frames of a read sit next to each other in
 *           one allocation, as "data: <data>\n\n", poisoned and freed after the read (nothing may
 *           point into it then).
 * The same frames go through three normalisers: fast paths on and framed feeds as chosen, fast
 * paths on and plain feeds, fast paths off (agw_agui_set_fast_paths()) and plain feeds. All three
 * must write the same bytes (the timestamps of gateway-made events aside).
 *
 * Invariants of the output: it is a sequence of "data: <json>\n\n" frames, each a JSON object with
 * a non-empty string "type", no null top-level field but where the protocol gives null a meaning
 * (none at all in gateway-made events), one the client's schemas accept (agw_schema_check()); the
 * first is the run's only RUN_STARTED, with the client's ids; at most one terminal event
 * (RUN_FINISHED, with the client's ids, or RUN_ERROR with a string message) and nothing after it;
 * after agw_agui_end()/agw_agui_fail() the stream is terminated; content events name an open item,
 * starts do not reopen one (a step is its sub-agent run's and its name), nothing is open at
 * RUN_FINISHED; no chunk event (the gateway expands them); a sub-agent run starts once, after its
 * parent, ends once, and is not active at RUN_FINISHED; agw_agui_feed() returns 1 exactly when
 * the run is finished, and agw_agui_finished(), agw_agui_events_out() and agw_agui_outcome() agree
 * with the output. What agw_agui_emitting_content() tells the sink of an event is that event's
 * type, id and delta, as tokens inside its bytes; what agw_agui_emitting_type() tells, its type.
 *
 *   tests/fuzz/build.sh _build-fuzz agui            (or by hand:)
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -I_build src/agui.c src/sse.c \
 *       src/log.c src/common.c tests/fuzz/fuzz_agui.c \
 *       $(pkg-config --cflags --libs libevent jansson openssl)
 *   ./a.out tests/fuzz/corpus/agui */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <jansson.h>

#include "agw/agui.h"
#include "agw/log.h"
#include "agw/schema.h"

#include "../client_model.h"
#include "agw/sse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_FRAMES 256
#define MAX_OPEN   64 /* tracked by the checker; more open items are not checked */

static const char *const codes[] = {AGW_AGUI_UPSTREAM_ERROR,  AGW_AGUI_TIMEOUT,
                                    AGW_AGUI_FRAME_TOO_LARGE, AGW_AGUI_INVALID_EVENT,
                                    AGW_AGUI_CANCELLED,       AGW_AGUI_SHUTDOWN};

struct frame {
    const char *data;
    size_t len;
};

struct setup {
    const char *thread_id, *run_id;
    enum agw_protocol protocol;
    unsigned end;
    unsigned framed_mask;
    size_t per_read;
    struct frame frames[MAX_FRAMES];
    size_t n_frames;
};

static void fatal(const char *what)
{
    fprintf(stderr, "fuzz_agui: %s\n", what);
    abort();
}

/* The sink: frames each event into <out>; one passed unchanged, when the frame it was fed from may
 * be taken as read (<framed>), is taken from the read — its bytes must then be that frame's data.
 */
struct sink_ctx {
    struct agw_agui *a;
    struct evbuffer *out;
    const char *fed; /* the data being fed, and whether its frame may be taken as read */
    size_t fed_len;
    bool framed;
};

/* What agw_agui_emitting_content() says of the event emitted must be what the event is: a
 * TEXT_MESSAGE_CONTENT or REASONING_MESSAGE_CONTENT (TOOL_CALL_ARGS with <args>) whose id and delta
 * are those tokens (a string each, the id without an escape), inside its bytes (a sub-agent's
 * content event too, since history keeps no chunk streams: 3805f95). */
static void check_content_hint(const struct agw_agui *a, const char *json, size_t len)
{
    struct agw_agui_content c;
    json_t *ev, *id, *delta, *type, *reasoning;
    bool ok;

    if (!agw_agui_emitting_content(a, &c))
        return;
    if (c.id < json || c.id + c.id_len > json + len || c.delta < json ||
        c.delta + c.delta_len > json + len)
        fatal("a content hint outside the event");
    ev = json_loadb(json, len, 0, NULL);
    id = json_loadb(c.id, c.id_len, JSON_DECODE_ANY, NULL);
    delta = json_loadb(c.delta, c.delta_len, JSON_DECODE_ANY, NULL);
    type = json_string(c.args ? "TOOL_CALL_ARGS" : "TEXT_MESSAGE_CONTENT");
    reasoning = json_string(c.args ? "TOOL_CALL_ARGS" : "REASONING_MESSAGE_CONTENT");
    ok = json_is_object(ev) && json_is_string(id) && json_is_string(delta) &&
         memchr(c.id, '\\', c.id_len) == NULL &&
         (json_equal(json_object_get(ev, "type"), type) ||
          json_equal(json_object_get(ev, "type"), reasoning)) &&
         json_equal(json_object_get(ev, c.args ? "toolCallId" : "messageId"), id) &&
         json_equal(json_object_get(ev, "delta"), delta);
    json_decref(ev);
    json_decref(id);
    json_decref(delta);
    json_decref(type);
    json_decref(reasoning);
    if (!ok)
        fatal("a content hint that is not the event's id and delta");
}

/* What agw_agui_emitting_type() says of the event emitted must be what the event is: one JSON
 * object whose "type" is that string (written without an escape, inside its bytes); and never
 * beside a content hint (agw_agui_emitting_content()). (An "ag-kit" backend's event is the
 * translation the fast path read, not the data fed.) */
static void check_type_hint(const struct agw_agui *a, const char *json, size_t len)
{
    struct agw_agui_content c;
    const char *type;
    size_t n;
    json_t *ev, *want;
    bool ok;

    if (!agw_agui_emitting_type(a, &type, &n))
        return;
    if (agw_agui_emitting_content(a, &c))
        fatal("a type hint for a content event");
    if (type <= json || type + n >= json + len || type[-1] != '"' || type[n] != '"' ||
        memchr(type, '\\', n) != NULL)
        fatal("a type hint that is not an unescaped string inside the event");
    ev = json_loadb(json, len, 0, NULL);
    want = json_stringn(type, n);
    ok = json_is_object(ev) && want != NULL && json_equal(json_object_get(ev, "type"), want);
    json_decref(ev);
    json_decref(want);
    if (!ok)
        fatal("a type hint that is not the event's type");
}

static void emit(void *arg, const char *json, size_t len, bool pass)
{
    struct sink_ctx *c = arg;

    check_content_hint(c->a, json, len);
    check_type_hint(c->a, json, len);
    if (pass && (json != c->fed || len != c->fed_len))
        fatal("an event passed unchanged that is not the data fed");
    if (memchr(json, '\n', len) != NULL || memchr(json, '\r', len) != NULL)
        fatal("an event with a line break");
    if (pass && c->framed) {
        if (memcmp(json - 6, "data: ", 6) != 0 || memcmp(json + len, "\n\n", 2) != 0)
            fatal("a passed event is not framed where it was read");
        evbuffer_add(c->out, json - 6, len + 8);
        return;
    }
    agw_sse_write_data(c->out, json, len);
}

/* Feeds every frame to a new normaliser, then ends it as chosen. Returns the output. */
static char *run(const struct setup *s, bool fast, bool framed, size_t *out_len)
{
    struct agw_agui *a = agw_agui_new(s->thread_id, s->run_id, s->protocol);
    struct evbuffer *out = evbuffer_new();
    struct sink_ctx sc = {a, out, NULL, 0, false};
    const struct agw_agui_sink sink = {emit, &sc};
    char *res;

    agw_agui_set_fast_paths(a, fast);
    for (size_t i = 0; i < s->n_frames;) {
        size_t n = s->n_frames - i < s->per_read ? s->n_frames - i : s->per_read, total = 0, at = 0;
        char *read;

        /* One read: the frames one after the other, as the SSE parser leaves them in memory. */
        for (size_t j = i; j < i + n; j++)
            total += 6 + s->frames[j].len + 2;
        read = agw_xmalloc(total + 1);
        for (size_t j = i; j < i + n; j++) {
            const struct frame *f = &s->frames[j];
            bool as_framed = framed && ((s->framed_mask >> (j % 4)) & 1) &&
                             memchr(f->data, '\n', f->len) == NULL &&
                             memchr(f->data, '\r', f->len) == NULL;
            char *d;
            int rc;

            memcpy(read + at, "data: ", 6);
            d = read + at + 6;
            memcpy(d, f->data, f->len);
            memcpy(d + f->len, "\n\n", 2);
            at += 6 + f->len + 2;
            sc.fed = d;
            sc.fed_len = f->len;
            sc.framed = as_framed;
            rc = agw_agui_feed(a, d, f->len, &sink);
            sc.fed = NULL;
            sc.framed = false;
            if (rc != (agw_agui_finished(a) ? 1 : 0))
                fatal("agw_agui_feed() returned other than agw_agui_finished()");
        }
        i += n;
        memset(read, 'X', total); /* a pointer kept into the read would show */
        free(read);
    }
    switch (s->end) {
    case 0:
        agw_agui_end(a, &sink);
        break;
    case 1:
        agw_agui_fail(a, codes[s->n_frames % AGW_ARRAY_LEN(codes)], "the gateway failed", &sink);
        break;
    case 2: {
        const struct frame *f = &s->frames[s->n_frames - 1];
        char *msg = agw_xstrndup(f->data, f->len); /* may hold NUL or invalid UTF-8 */
        agw_agui_fail(a, AGW_AGUI_UPSTREAM_ERROR, msg, &sink);
        free(msg);
        break;
    }
    default:
        break;
    }
    if (s->end != 3 && !agw_agui_finished(a))
        fatal("not finished after agw_agui_end()/agw_agui_fail()");

    /* The counters and the outcome agree with the output (checked by check_output()). */
    {
        const char *outcome = agw_agui_outcome(a);
        size_t len = evbuffer_get_length(out);
        uint64_t frames = 0;
        const char *p = (const char *)evbuffer_pullup(out, -1);

        for (size_t k = 0; k + 1 < len; k++)
            if (p[k] == '\n' && p[k + 1] == '\n')
                frames++, k++;
        if (frames != agw_agui_events_out(a))
            fatal("agw_agui_events_out() differs from the frames written");
        if ((outcome != NULL) != agw_agui_finished(a) ||
            (outcome != NULL && strcmp(outcome, "RUN_FINISHED") != 0 &&
             strncmp(outcome, "RUN_ERROR", 9) != 0))
            fatal("agw_agui_outcome() disagrees with agw_agui_finished()");
    }
    res = agw_xmalloc(evbuffer_get_length(out) + 1);
    *out_len = evbuffer_get_length(out);
    evbuffer_remove(out, res, *out_len);
    res[*out_len] = '\0';
    evbuffer_free(out);
    agw_agui_free(a);
    return res;
}

/* ---- the output checker --------------------------------------------------------------------- */

static const struct {
    const char *start, *content, *end, *id_key;
} kinds[] = {
    {"STEP_STARTED", NULL, "STEP_FINISHED", "stepName"},
    {"REASONING_START", NULL, "REASONING_END", "messageId"},
    {"REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT", "REASONING_MESSAGE_END", "messageId"},
    {"TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "messageId"},
    {"TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "toolCallId"},
};

struct open_set {
    char *ids[AGW_ARRAY_LEN(kinds)][MAX_OPEN];
    size_t n[AGW_ARRAY_LEN(kinds)];
    bool overflow;
};

static int find(struct open_set *o, size_t k, const char *id)
{
    for (size_t i = 0; i < o->n[k]; i++)
        if (strcmp(o->ids[k][i], id) == 0)
            return (int)i;
    return -1;
}

static bool has_null(json_t *v)
{
    const char *key;
    json_t *x;
    size_t i;

    if (json_is_null(v))
        return true;
    if (json_is_object(v)) {
        json_object_foreach(v, key, x)
        {
            if (has_null(x))
                return true;
        }
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, x)
        {
            if (has_null(x))
                return true;
        }
    }
    return false;
}

static bool str_eq(const json_t *v, const char *s)
{
    return json_is_string(v) && strcmp(json_string_value(v), s) == 0;
}

/* Checks one item event of kind <k> (role 0 start, 1 content, 2 end) against the open set. */
static void check_item(struct open_set *o, size_t k, int role, const json_t *ev)
{
    const json_t *idv = json_object_get(ev, kinds[k].id_key);
    const json_t *sub = json_object_get(ev, "subagentRunId");
    const char *id;
    char key[512];
    int at;

    if (!json_is_string(idv))
        fatal("an item event without its id");
    id = json_string_value(idv);
    if (k == 0 && json_is_string(sub)) { /* the client keeps steps apart per sub-agent run */
        snprintf(key, sizeof(key), "%s\x1f%s", json_string_value(sub), id);
        id = key;
    }
    if (o->overflow)
        return;
    at = find(o, k, id);
    if (role == 0) {
        if (at >= 0)
            fatal("a start event for an item already open");
        if (o->n[k] == MAX_OPEN) {
            o->overflow = true;
            return;
        }
        o->ids[k][o->n[k]++] = agw_xstrdup(id);
    } else if (at < 0) {
        fatal(role == 1 ? "a content event for an item that is not open"
                        : "an end event for an item that is not open");
    } else if (role == 2) {
        free(o->ids[k][at]);
        o->ids[k][at] = o->ids[k][--o->n[k]];
    }
}

static void open_clear(struct open_set *o)
{
    for (size_t k = 0; k < AGW_ARRAY_LEN(kinds); k++)
        for (size_t i = 0; i < o->n[k]; i++)
            free(o->ids[k][i]);
    memset(o, 0, sizeof(*o));
}

static void check_output(const struct setup *s, const char *out, size_t len, uint64_t t0,
                         uint64_t t1)
{
    struct open_set open = {0};
    json_t *subs = json_object(); /* sub-agent runs: true while active, false once ended */
    json_t *owners = client_owners_new();
    size_t frames = 0;
    bool terminal = false;

    for (const char *p = out; p < out + len;) {
        const char *nl;
        json_t *ev, *type, *ts;
        json_error_t jerr;
        const char *key, *t;
        json_t *v;
        char why[320];

        if (terminal)
            fatal("an event after the terminal event");
        if ((size_t)(out + len - p) < 8 || memcmp(p, "data: ", 6) != 0)
            fatal("an output frame that does not start with \"data: \"");
        nl = memchr(p + 6, '\n', (size_t)(out + len - p - 6));
        if (nl == NULL || nl + 1 >= out + len || nl[1] != '\n')
            fatal("an output frame that is not one data line and an empty line");
        ev = json_loadb(p + 6, (size_t)(nl - p - 6), 0, &jerr);
        if (ev == NULL && json_error_code(&jerr) == json_error_numeric_overflow)
            ev = json_loadb(p + 6, (size_t)(nl - p - 6), JSON_DECODE_INT_AS_REAL, &jerr);
        if (!json_is_object(ev))
            fatal("an output frame that is not a JSON object");
        type = json_object_get(ev, "type");
        if (!json_is_string(type) || json_string_length(type) == 0)
            fatal("an output event without a non-empty string type");
        t = json_string_value(type);
        json_object_foreach(ev, key, v)
        {
            if (json_is_null(v) && !agw_schema_keeps_null(t, key))
                fatal("an output event with a null top-level field");
        }
        if (!agw_schema_check(ev, why, sizeof(why)))
            fatal(why); /* an event the official client's schemas refuse */
        ts = json_object_get(ev, "timestamp");
        if (json_is_integer(ts) && json_integer_value(ts) >= (json_int_t)t0 &&
            json_integer_value(ts) <= (json_int_t)t1 && has_null(ev))
            fatal("a gateway-made event with a null field");
        if (ts != NULL && !json_is_integer(ts) && !json_is_real(ts))
            fatal("a timestamp that is not a number");
        if ((frames == 0) != (strcmp(t, "RUN_STARTED") == 0))
            fatal("RUN_STARTED is not the first event, or not the only one");
        if (strcmp(t, "RUN_STARTED") == 0 || strcmp(t, "RUN_FINISHED") == 0) {
            if (!str_eq(json_object_get(ev, "threadId"), s->thread_id) ||
                !str_eq(json_object_get(ev, "runId"), s->run_id))
                fatal("RUN_STARTED/RUN_FINISHED without the client's ids");
        }
        if (strcmp(t, "TEXT_MESSAGE_CHUNK") == 0 || strcmp(t, "TOOL_CALL_CHUNK") == 0 ||
            strcmp(t, "REASONING_MESSAGE_CHUNK") == 0)
            fatal("a chunk event (the gateway expands them)");
        if (client_owner_rule(owners, t, ev) != NULL)
            fatal("an id used by another than its opener"); /* (a sub-agent run, or the agent) */
        if (strcmp(t, "SUBAGENT_STARTED") == 0 || strcmp(t, "SUBAGENT_FINISHED") == 0 ||
            strcmp(t, "SUBAGENT_ERROR") == 0) {
            const char *sub = json_string_value(json_object_get(ev, "subagentRunId"));
            const char *parent = json_string_value(json_object_get(ev, "parentSubagentRunId"));
            json_t *was = sub != NULL ? json_object_get(subs, sub) : NULL;
            if (sub == NULL)
                fatal("a SUBAGENT_* event without a subagentRunId");
            if (strcmp(t, "SUBAGENT_STARTED") == 0) {
                if (was != NULL)
                    fatal("a sub-agent run started twice");
                if (parent != NULL && json_object_get(subs, parent) == NULL)
                    fatal("a sub-agent run whose parent was not started");
                json_object_set_new(subs, sub, json_true());
            } else if (strcmp(t, "SUBAGENT_FINISHED") == 0 || strcmp(t, "SUBAGENT_ERROR") == 0) {
                if (!json_is_true(was))
                    fatal("the end of a sub-agent run that is not active");
                json_object_set_new(subs, sub, json_false());
            }
        }
        if (strcmp(t, "RUN_FINISHED") == 0) {
            terminal = true;
            for (size_t k = 0; k < AGW_ARRAY_LEN(kinds); k++)
                if (open.n[k] > 0 && !open.overflow)
                    fatal("RUN_FINISHED with items still open");
            json_object_foreach(subs, key, v)
            {
                if (json_is_true(v))
                    fatal("RUN_FINISHED with a sub-agent run still active");
            }
        } else if (strcmp(t, "RUN_ERROR") == 0) {
            json_t *code = json_object_get(ev, "code");
            terminal = true;
            if (!json_is_string(json_object_get(ev, "message")) ||
                (code != NULL && !json_is_string(code)) || json_object_get(ev, "error") != NULL)
                fatal("RUN_ERROR is not {message: string, code?: string}");
        }
        for (size_t k = 0; k < AGW_ARRAY_LEN(kinds); k++) {
            if (strcmp(t, kinds[k].start) == 0)
                check_item(&open, k, 0, ev);
            else if (kinds[k].content != NULL && strcmp(t, kinds[k].content) == 0)
                check_item(&open, k, 1, ev);
            else if (strcmp(t, kinds[k].end) == 0)
                check_item(&open, k, 2, ev);
        }
        json_decref(ev);
        frames++;
        p = nl + 2;
    }
    if (s->end != 3 && !terminal)
        fatal("no terminal event after agw_agui_end()/agw_agui_fail()");
    open_clear(&open);
    json_decref(subs);
    json_decref(owners);
}

/* Gateway-made events carry agw_wall_ms(): their timestamps (within [t0, t1]) become 0, so that
 * runs made at different times compare equal. */
static char *mask_timestamps(const char *s, size_t len, uint64_t t0, uint64_t t1, size_t *out_len)
{
    static const char key[] = "\"timestamp\":";
    char *m = agw_xmalloc(len + 1);
    size_t n = 0;

    for (size_t i = 0; i < len;) {
        if (len - i > sizeof(key) - 1 && memcmp(s + i, key, sizeof(key) - 1) == 0) {
            size_t j = i + sizeof(key) - 1;
            uint64_t v = 0;
            size_t digits = 0;

            while (j < len && s[j] >= '0' && s[j] <= '9' && digits < 19) {
                v = v * 10 + (uint64_t)(s[j] - '0');
                j++;
                digits++;
            }
            memcpy(m + n, key, sizeof(key) - 1);
            n += sizeof(key) - 1;
            if (digits > 0 && v >= t0 && v <= t1 && (j == len || s[j] < '0' || s[j] > '9')) {
                m[n++] = '0';
                i = j;
            } else {
                i += sizeof(key) - 1;
            }
            continue;
        }
        m[n++] = s[i++];
    }
    m[n] = '\0';
    *out_len = n;
    return m;
}

static void same(const char *a, size_t alen, const char *b, size_t blen, const char *what)
{
    if (alen != blen || memcmp(a, b, alen) != 0) {
        fprintf(stderr, "---- first:\n%.*s\n---- second:\n%.*s\n", (int)alen, a, (int)blen, b);
        fatal(what);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool quiet;
    struct setup s = {0};
    const char *p, *end;
    char *out[3], *masked[3];
    size_t len[3], mlen[3];
    uint64_t t0, t1;
    char sep;

    if (!quiet) {
        agw_log_set_level(AGW_LOG_ERROR);
        quiet = true;
    }
    if (size < 3)
        return 0;
    s.end = data[0] & 3;
    s.protocol = data[0] & 4 ? AGW_PROTO_AGKIT : AGW_PROTO_AGUI;
    s.thread_id = data[0] & 8 ? "thread \"\xc3\xa9\"" : "t1";
    s.run_id = data[0] & 8 ? "run/\xe2\x82\xac" : "r1";
    s.framed_mask = data[0] >> 4;
    sep = (char)data[1];
    s.per_read = 1 + data[2] % 8u;
    p = (const char *)data + 3;
    end = (const char *)data + size;
    while (s.n_frames < MAX_FRAMES) {
        const char *q = memchr(p, sep, (size_t)(end - p));
        s.frames[s.n_frames].data = p;
        s.frames[s.n_frames].len = (size_t)((q ? q : end) - p);
        s.n_frames++;
        if (q == NULL)
            break;
        p = q + 1;
    }

    t0 = agw_wall_ms();
    out[0] = run(&s, true, true, &len[0]);
    out[1] = run(&s, true, false, &len[1]);
    out[2] = run(&s, false, false, &len[2]);
    t1 = agw_wall_ms();
    check_output(&s, out[0], len[0], t0, t1);
    for (int i = 0; i < 3; i++)
        masked[i] = mask_timestamps(out[i], len[i], t0, t1, &mlen[i]);
    same(masked[0], mlen[0], masked[1], mlen[1], "framed and plain feeds wrote different bytes");
    same(masked[1], mlen[1], masked[2], mlen[2], "the fast paths and the full path disagree");
    for (int i = 0; i < 3; i++) {
        free(out[i]);
        free(masked[i]);
    }
    return 0;
}
