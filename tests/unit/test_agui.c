/* Unit tests for src/agui.c: every normalisation rule, plus a model of @ag-ui/client's verifier
 * applied to the output of hostile upstream streams. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <jansson.h>

#include "agw/agui.h"
#include "agw/schema.h"
#include "agw/sse.h"

#include "../client_model.h"

#define TID "t1"
#define RID "r1"

/* ---- helpers --------------------------------------------------------------------------------- */

struct result {
    char *text;        /* everything written, NUL-terminated */
    json_t *events;    /* the frames parsed back, a JSON array */
    int last_rc;       /* agw_agui_feed()'s value for the last frame fed */
    int rcs[64];       /* agw_agui_feed()'s value for each frame */
    uint64_t n_out;    /* agw_agui_events_out() at the end */
    char outcome[128]; /* agw_agui_outcome() at the end, or "" */
    bool finished;
};

static char *drain(struct evbuffer *b)
{
    size_t n = evbuffer_get_length(b);
    char *s = malloc(n + 1);

    cr_assert_not_null(s);
    evbuffer_remove(b, s, n);
    s[n] = '\0';
    return s;
}

/* A sink that frames events as the relay does. An event passed unchanged that was fed from a block
 * of frames (<block>, laid out "data: <data>\n\n" as a read holds them) is taken as the frame it
 * was read in — so its bytes must lie in the block, framed; any other event is framed anew. */
struct sink_ctx {
    struct evbuffer *out;
    const char *block; /* NULL: the frames were fed from elsewhere */
    size_t block_len;
    int passed; /* events passed unchanged */
};

static void test_emit(void *arg, const char *json, size_t len, bool pass)
{
    struct sink_ctx *c = arg;

    cr_assert_null(memchr(json, '\n', len), "an event with a line break: %.*s", (int)len, json);
    if (pass)
        c->passed++;
    if (pass && c->block != NULL) {
        cr_assert(json >= c->block + 6 && json + len + 2 <= c->block + c->block_len,
                  "an event passed unchanged whose bytes are not the frame's");
        cr_assert(memcmp(json - 6, "data: ", 6) == 0 && memcmp(json + len, "\n\n", 2) == 0);
        evbuffer_add(c->out, json - 6, len + 8);
        return;
    }
    agw_sse_write_data(c->out, json, len);
}

/* A sink framing into the evbuffer <buf> (for one call). */
#define SINK(buf) (&(struct agw_agui_sink){test_emit, &(struct sink_ctx){(buf), NULL, 0, 0}})

/* Splits a client stream into events; every frame must be exactly "data: <one JSON object>\n\n". */
static json_t *parse_stream(const char *text)
{
    json_t *arr = json_array();
    const char *p = text;

    while (*p != '\0') {
        cr_assert(strncmp(p, "data: ", 6) == 0, "frame does not start with 'data: ': %s", p);
        const char *end = strstr(p, "\n\n");
        cr_assert_not_null(end, "unterminated frame: %s", p);
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        cr_assert_null(nl, "frame spans several lines: %s", p);
        json_error_t err;
        json_t *ev = json_loadb(p + 6, (size_t)(end - p - 6), 0, &err);
        if (ev == NULL && json_error_code(&err) == json_error_numeric_overflow)
            ev = json_loadb(p + 6, (size_t)(end - p - 6), JSON_DECODE_INT_AS_REAL, &err);
        cr_assert_not_null(ev, "frame is not JSON (%s): %.*s", err.text, (int)(end - p), p);
        cr_assert(json_is_object(ev), "frame is not an object");
        json_array_append_new(arr, ev);
        p = end + 2;
    }
    return arr;
}

enum ending { END_NONE, END_EOF };

struct feed_ctx {
    struct agw_agui *a;
    struct sink_ctx sink; /* its block: the bytes the SSE parser is given */
    int framed;           /* frames that came framed */
};

/* An agw_sse_frame_fn feeding the normaliser as the relay does. */
static int feed_frame(void *arg, const struct agw_sse_frame *f)
{
    struct feed_ctx *c = arg;
    struct sink_ctx plain = {c->sink.out, NULL, 0, 0};

    c->framed += f->framed;
    if (!f->framed)
        return agw_agui_feed(c->a, f->data, f->data_len,
                             &(struct agw_agui_sink){test_emit, &plain});
    return agw_agui_feed(c->a, f->data, f->data_len, &(struct agw_agui_sink){test_emit, &c->sink});
}

/* Feeds <frames> (<n> of them) the way the relay does: laid out in one block as the frames
 * "data: <frame>\n\n", the events passed unchanged taken as the frames they were read in (frames
 * with a line break cannot be: fed from elsewhere). Each feed's value goes to <rcs> (NULL: not
 * kept). */
static void feed_framed_block(struct agw_agui *a, const char *const *frames, size_t n,
                              struct evbuffer *out, int *rcs, size_t nrcs)
{
    size_t total = 0, at = 0;
    char *block;

    for (size_t i = 0; i < n; i++)
        total += strlen(frames[i]) + 8;
    block = malloc(total + 1);
    cr_assert_not_null(block);
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(frames[i]);
        char *data = block + at + 6;
        int rc;

        memcpy(block + at, "data: ", 6);
        memcpy(data, frames[i], len);
        memcpy(data + len, "\n\n", 2);
        at += len + 8;
        if (strpbrk(frames[i], "\r\n") != NULL) {
            rc = agw_agui_feed(a, data, len, SINK(out));
        } else {
            struct sink_ctx c = {out, block, total, 0};
            rc = agw_agui_feed(a, data, len, &(struct agw_agui_sink){test_emit, &c});
        }
        if (rcs != NULL && i < nrcs)
            rcs[i] = rc;
    }
    /* The block goes now: nothing may point into it any more. */
    memset(block, 'X', total);
    free(block);
}

/* <text> with every "timestamp":<digits> made "timestamp":0 (the gateway stamps its own events with
 * the clock, which two runs do not share). Returns a new string. */
static char *without_clock(const char *text)
{
    char *s = malloc(strlen(text) + 1), *o = s;

    cr_assert_not_null(s);
    while (*text != '\0') {
        if (strncmp(text, "\"timestamp\":", 12) == 0 && text[12] >= '0' && text[12] <= '9') {
            memcpy(o, "\"timestamp\":0", 13);
            o += 13;
            text += 12;
            while (*text >= '0' && *text <= '9')
                text++;
            continue;
        }
        *o++ = *text++;
    }
    *o = '\0';
    return s;
}

/* The normaliser writes the same stream for the same input whether the frames were fed framed (held
 * back and appended in runs) or plain. */
static void assert_framed_same(const char *const *frames, size_t n, const int *rcs, size_t nrcs,
                               enum ending ending, enum agw_protocol proto, const char *plain)
{
    struct agw_agui *a = agw_agui_new(TID, RID, proto);
    struct evbuffer *out = evbuffer_new();
    int frcs[64];
    char *text, *x, *y;

    feed_framed_block(a, frames, n, out, frcs, AGW_ARRAY_LEN(frcs));
    for (size_t i = 0; i < n && i < nrcs && i < AGW_ARRAY_LEN(frcs); i++)
        cr_assert_eq(frcs[i], rcs[i], "frame %zu: framed feed returned %d, plain %d", i, frcs[i],
                     rcs[i]);
    if (ending == END_EOF)
        agw_agui_end(a, SINK(out));
    text = drain(out);
    x = without_clock(text);
    y = without_clock(plain);
    cr_assert_str_eq(x, y, "framed feeding wrote:\n%s\nplain feeding wrote:\n%s", text, plain);
    free(x);
    free(y);
    free(text);
    evbuffer_free(out);
    agw_agui_free(a);
}

/* Feeds the NULL-terminated <frames> to a fresh normaliser, then calls agw_agui_end() if <ending>
 * says so. */
static struct result run_frames_p(const char *const *frames, enum ending ending,
                                  enum agw_protocol proto)
{
    struct result r;
    struct agw_agui *a = agw_agui_new(TID, RID, proto);
    struct evbuffer *out = evbuffer_new();
    size_t i;

    memset(&r, 0, sizeof(r));
    r.last_rc = -1;
    for (i = 0; frames[i] != NULL; i++) {
        r.last_rc = agw_agui_feed(a, frames[i], strlen(frames[i]), SINK(out));
        if (i < AGW_ARRAY_LEN(r.rcs))
            r.rcs[i] = r.last_rc;
    }
    if (ending == END_EOF)
        agw_agui_end(a, SINK(out));
    r.n_out = agw_agui_events_out(a);
    r.finished = agw_agui_finished(a);
    if (agw_agui_outcome(a) != NULL)
        snprintf(r.outcome, sizeof(r.outcome), "%s", agw_agui_outcome(a));
    r.text = drain(out);
    r.events = parse_stream(r.text);
    cr_assert_eq(json_array_size(r.events), r.n_out, "events_out %llu, frames %zu",
                 (unsigned long long)r.n_out, json_array_size(r.events));
    evbuffer_free(out);
    agw_agui_free(a);
    assert_framed_same(frames, i, r.rcs, AGW_ARRAY_LEN(r.rcs), ending, proto, r.text);
    return r;
}

static struct result run_frames(const char *const *frames, enum ending ending)
{
    return run_frames_p(frames, ending, AGW_PROTO_AGUI);
}

static void result_free(struct result *r)
{
    free(r->text);
    json_decref(r->events);
}

#define RUN(ending, ...) run_frames((const char *const[]){__VA_ARGS__, NULL}, ending)

static json_t *ev_at(const struct result *r, size_t i)
{
    cr_assert_lt(i, json_array_size(r->events), "no event %zu in: %s", i, r->text);
    return json_array_get(r->events, i);
}

static const char *str_at(const struct result *r, size_t i, const char *key)
{
    json_t *v = json_object_get(ev_at(r, i), key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static void assert_type(const struct result *r, size_t i, const char *type)
{
    const char *t = str_at(r, i, "type");
    cr_assert(t != NULL && strcmp(t, type) == 0, "event %zu is %s, expected %s, in:\n%s", i,
              t ? t : "(none)", type, r->text);
}

/* The first key of event <i> is "type". */
static void assert_type_first(const struct result *r, size_t i)
{
    void *it = json_object_iter(ev_at(r, i));
    cr_assert(it != NULL && strcmp(json_object_iter_key(it), "type") == 0, "\"type\" not first: %s",
              r->text);
}

static void assert_int_timestamp(const struct result *r, size_t i)
{
    json_t *ts = json_object_get(ev_at(r, i), "timestamp");
    cr_assert(json_is_integer(ts), "event %zu has no integer timestamp: %s", i, r->text);
    cr_assert_gt(json_integer_value(ts), 1600000000000LL);
}

static void assert_client_ids(const struct result *r, size_t i)
{
    cr_assert_str_eq(str_at(r, i, "threadId"), TID);
    cr_assert_str_eq(str_at(r, i, "runId"), RID);
}

/* Asserts that event <i> is a generated RUN_ERROR with <code> and a message containing <needle>. */
static void assert_run_error(const struct result *r, size_t i, const char *code, const char *needle)
{
    assert_type(r, i, "RUN_ERROR");
    assert_type_first(r, i);
    cr_assert_str_eq(str_at(r, i, "code"), code);
    const char *m = str_at(r, i, "message");
    cr_assert_not_null(m);
    cr_assert(strstr(m, needle) != NULL, "message '%s' lacks '%s'", m, needle);
    cr_assert_eq(i + 1, json_array_size(r->events), "RUN_ERROR is not last: %s", r->text);
}

/* Asserts that event <i> closes the text message <id> that was open when the run failed, and that
 * event <i> + 1 is the gateway's RUN_ERROR (every ending closes what is open first). */
static void assert_closed_then_error(const struct result *r, size_t i, const char *id,
                                     const char *code, const char *needle)
{
    assert_type(r, i, "TEXT_MESSAGE_END");
    cr_assert_str_eq(str_at(r, i, "messageId"), id);
    assert_run_error(r, i + 1, code, needle);
}

/* The expected client bytes for frames relayed unchanged. */
static char *framed(const char *const *frames)
{
    struct evbuffer *b = evbuffer_new();
    for (size_t i = 0; frames[i] != NULL; i++)
        evbuffer_add_printf(b, "data: %s\n\n", frames[i]);
    char *s = drain(b);
    evbuffer_free(b);
    return s;
}

/* "data: <data>\n\n", malloc'd. */
static char *frame_of(const char *data)
{
    return framed((const char *const[]){data, NULL});
}

/* ---- the verifier model ------------------------------------------------------------------- */

/* A model of @ag-ui/client's verifier plus the gateway's own promises. Returns NULL if <events> is
 * a stream the client accepts as one complete run, else what is wrong (a static buffer). Checked:
 * first RUN_STARTED with the client's ids; one terminal event, last; no RUN_STARTED inside the run;
 * START/END balanced per kind and id, CONTENT/ARGS only for open ids; nothing open at the terminal
 * event (RUN_FINISHED or RUN_ERROR: every ending closes what is open first);
 * non-empty string "type"; no top-level null but where the protocol gives null a meaning; what
 * the client's schemas accept (agw_schema_check()); integer timestamps; string ids and deltas;
 * RUN_ERROR {message: string, code?: string}; TEXT_MESSAGE_START has a role; no "args" on
 * TOOL_CALL_START; no chunk event; steps apart per sub-agent run; a sub-agent run started once,
 * its parent before it, ended once, and not active at RUN_FINISHED. */
static const char *verify_stream(json_t *events)
{
    static char why[512];
    char schema_why[320];
    static const struct {
        const char *start, *content, *end, *key;
    } kinds[] = {
        {"STEP_STARTED", NULL, "STEP_FINISHED", "stepName"},
        {"REASONING_START", NULL, "REASONING_END", "messageId"},
        {"REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT", "REASONING_MESSAGE_END",
         "messageId"},
        {"TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "messageId"},
        {"TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "toolCallId"},
    };
    json_t *open[AGW_ARRAY_LEN(kinds)];
    json_t *subs = json_object(); /* sub-agent runs: true while active, false once ended */
    json_t *own = client_owners_new();
    size_t n = json_array_size(events);
    const char *err = NULL;

    for (size_t k = 0; k < AGW_ARRAY_LEN(kinds); k++)
        open[k] = json_object();
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(why, sizeof(why), __VA_ARGS__);                                                   \
        err = why;                                                                                 \
        goto out;                                                                                  \
    } while (0)

    if (n == 0)
        FAIL("empty stream");
    for (size_t i = 0; i < n; i++) {
        json_t *ev = json_array_get(events, i);
        json_t *tv = json_object_get(ev, "type");
        const char *key;
        json_t *v;

        if (!json_is_string(tv) || json_string_length(tv) == 0)
            FAIL("event %zu: no type", i);
        const char *type = json_string_value(tv);
        json_object_foreach(ev, key, v)
        {
            if (json_is_null(v) && !agw_schema_keeps_null(type, key))
                FAIL("event %zu (%s): null field %s", i, type, key);
        }
        if (!agw_schema_check(ev, schema_why, sizeof(schema_why)))
            FAIL("event %zu: the client's schemas refuse it: %s", i, schema_why);
        json_t *ts = json_object_get(ev, "timestamp");
        if (ts != NULL && !json_is_integer(ts))
            FAIL("event %zu (%s): timestamp is not an integer", i, type);
        bool terminal = strcmp(type, "RUN_FINISHED") == 0 || strcmp(type, "RUN_ERROR") == 0;
        if (i == 0 && strcmp(type, "RUN_STARTED") != 0)
            FAIL("first event is %s", type);
        if (i > 0 && strcmp(type, "RUN_STARTED") == 0)
            FAIL("event %zu: RUN_STARTED while the run is active", i);
        if (terminal != (i == n - 1))
            FAIL("event %zu (%s): %s", i, type,
                 terminal ? "terminal event not last" : "no terminal event last");
        if (strcmp(type, "RUN_STARTED") == 0 || strcmp(type, "RUN_FINISHED") == 0) {
            json_t *t = json_object_get(ev, "threadId");
            json_t *r = json_object_get(ev, "runId");
            if (!json_is_string(t) || strcmp(json_string_value(t), TID) != 0 ||
                !json_is_string(r) || strcmp(json_string_value(r), RID) != 0)
                FAIL("event %zu (%s): not the client's ids", i, type);
        }
        if (terminal) {
            for (size_t k = 0; k < AGW_ARRAY_LEN(kinds); k++)
                if (json_object_size(open[k]) != 0)
                    FAIL("%s with a %s still open", type, kinds[k].start);
        }
        if (strcmp(type, "RUN_FINISHED") == 0) {
            json_object_foreach(subs, key, v)
            {
                if (json_is_true(v))
                    FAIL("RUN_FINISHED with sub-agent run %s active", key);
            }
        }
        if (strcmp(type, "SUBAGENT_STARTED") == 0 || strcmp(type, "SUBAGENT_FINISHED") == 0 ||
            strcmp(type, "SUBAGENT_ERROR") == 0) {
            const char *sub = json_string_value(json_object_get(ev, "subagentRunId"));
            json_t *was = sub != NULL ? json_object_get(subs, sub) : NULL;
            if (sub == NULL)
                FAIL("event %zu (%s) without a subagentRunId", i, type);
            if (strcmp(type, "SUBAGENT_STARTED") == 0) {
                const char *parent = json_string_value(json_object_get(ev, "parentSubagentRunId"));
                if (was != NULL)
                    FAIL("event %zu: sub-agent run %s started twice", i, sub);
                if (parent != NULL && json_object_get(subs, parent) == NULL)
                    FAIL("event %zu: parent sub-agent run %s not started", i, parent);
                json_object_set_new(subs, sub, json_true());
            } else if (strcmp(type, "SUBAGENT_FINISHED") == 0 ||
                       strcmp(type, "SUBAGENT_ERROR") == 0) {
                if (!json_is_true(was))
                    FAIL("event %zu: %s for sub-agent run %s, not active", i, type, sub);
                json_object_set_new(subs, sub, json_false());
            }
        }
        if (strcmp(type, "RUN_ERROR") == 0) {
            if (!json_is_string(json_object_get(ev, "message")))
                FAIL("RUN_ERROR without a string message");
            json_t *c = json_object_get(ev, "code");
            if (c != NULL && !json_is_string(c))
                FAIL("RUN_ERROR with a non-string code");
            if (json_object_get(ev, "error") != NULL)
                FAIL("RUN_ERROR still carries \"error\"");
        }
        if (strcmp(type, "TEXT_MESSAGE_START") == 0 && !json_is_string(json_object_get(ev, "role")))
            FAIL("TEXT_MESSAGE_START without role");
        if (strcmp(type, "TOOL_CALL_START") == 0 && json_object_get(ev, "args") != NULL)
            FAIL("TOOL_CALL_START with args");
        if (strcmp(type, "TEXT_MESSAGE_CHUNK") == 0 || strcmp(type, "TOOL_CALL_CHUNK") == 0 ||
            strcmp(type, "REASONING_MESSAGE_CHUNK") == 0)
            FAIL("event %zu: a %s (the gateway expands chunks)", i, type);
        const char *owner_why = client_owner_rule(own, type, ev);
        if (owner_why != NULL)
            FAIL("event %zu: %s", i, owner_why);
        for (size_t k = 0; k < AGW_ARRAY_LEN(kinds); k++) {
            bool is_start = strcmp(type, kinds[k].start) == 0;
            bool is_content = kinds[k].content != NULL && strcmp(type, kinds[k].content) == 0;
            bool is_end = strcmp(type, kinds[k].end) == 0;
            if (!is_start && !is_content && !is_end)
                continue;
            json_t *idv = json_object_get(ev, kinds[k].key);
            if (!json_is_string(idv))
                FAIL("event %zu (%s): no string %s", i, type, kinds[k].key);
            const char *id = json_string_value(idv);
            char step_key[256];
            json_t *sub = json_object_get(ev, "subagentRunId");
            if (k == 0 && json_is_string(sub)) { /* the client keeps steps per sub-agent run */
                snprintf(step_key, sizeof(step_key), "%s\x1f%s", json_string_value(sub), id);
                id = step_key;
            }
            bool is_open = json_object_get(open[k], id) != NULL;
            if (is_start && is_open)
                FAIL("event %zu: %s '%s' already open", i, type, id);
            if ((is_content || is_end) && !is_open)
                FAIL("event %zu: %s '%s' not open", i, type, id);
            if (is_content) {
                json_t *d = json_object_get(ev, "delta");
                if (!json_is_string(d))
                    FAIL("event %zu: %s without string delta", i, type);
                if (k != 4 && json_string_length(d) == 0)
                    FAIL("event %zu: %s with empty delta", i, type);
            }
            if (is_start)
                json_object_set_new(open[k], id, json_true());
            if (is_end)
                json_object_del(open[k], id);
        }
    }
#undef FAIL
out:
    for (size_t k = 0; k < AGW_ARRAY_LEN(kinds); k++)
        json_decref(open[k]);
    json_decref(subs);
    json_decref(own);
    return err;
}

static void assert_verified(const struct result *r)
{
    const char *why = verify_stream(r->events);
    cr_assert_null(why, "verifier: %s\nstream:\n%s", why, r->text);
}

/* ---- rule 1 (and the hot path): raw pass-through, [DONE], non-JSON --------------------------- */

Test(agui, clean_stream_is_byte_identical)
{
    const char *const frames[] = {
        "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\",\"timestamp\":"
        "1700000000000}",
        "{\"type\":\"STEP_STARTED\",\"stepName\":\"plan\"}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m1\",\"role\":\"assistant\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"H\\u00e9llo "
        "\\\"w\\\"\"}",
        "{ \"type\" : \"TEXT_MESSAGE_CONTENT\", "
        "\"messageId\":\"m1\",\"delta\":\"\xe4\xbd\xa0\xe5\xa5\xbd\"}",
        "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m1\"}",
        "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"w\","
        "\"parentMessageId\":\"m1\"}",
        "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"{\\\"city\\\":\"}",
        "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"\"}",
        "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c1\"}",
        "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"m2\",\"toolCallId\":\"c1\",\"content\":"
        "\"ok\"}",
        "{\"type\":\"REASONING_START\",\"messageId\":\"x\"}",
        "{\"type\":\"REASONING_MESSAGE_START\",\"messageId\":\"x\",\"role\":\"reasoning\"}",
        "{\"type\":\"REASONING_MESSAGE_CONTENT\",\"messageId\":\"x\",\"delta\":\"hmm\"}",
        "{\"type\":\"REASONING_MESSAGE_END\",\"messageId\":\"x\"}",
        "{\"type\":\"REASONING_END\",\"messageId\":\"x\"}",
        "{\"type\":\"STATE_SNAPSHOT\",\"snapshot\":{\"a\":[1,2.5,null,{\"b\":null}]}}",
        "{\"type\":\"STATE_DELTA\",\"delta\":[{\"op\":\"replace\",\"path\":\"/a\",\"value\":3}]}",
        "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[]}",
        "{\"type\":\"CUSTOM\",\"name\":\"n\",\"value\":{\"z\":1,\"a\":2}}",
        "{\"type\":\"STEP_FINISHED\",\"stepName\":\"plan\"}",
        "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\",\"result\":{\"ok\":true}}",
        NULL,
    };
    struct result r = run_frames(frames, END_NONE);
    char *expect = framed(frames);

    cr_assert_str_eq(r.text, expect);
    cr_assert_eq(r.last_rc, 1);
    cr_assert_eq(r.rcs[0], 0);
    cr_assert_eq(r.n_out, AGW_ARRAY_LEN(frames) - 1);
    cr_assert_str_eq(r.outcome, "RUN_FINISHED");
    assert_verified(&r);
    free(expect);
    result_free(&r);
}

Test(agui, done_marker_dropped)
{
    struct result r = RUN(END_NONE, "[DONE]", " \t[DONE]\r\n ",
                          "{\"type\":\"CUSTOM\",\"name\":\"a\",\"value\":1}", "[DONE]");
    cr_assert_eq(r.n_out, 2);
    assert_type(&r, 0, "RUN_STARTED");
    assert_type(&r, 1, "CUSTOM");
    cr_assert_eq(r.rcs[0], 0);
    cr_assert_eq(r.last_rc, 0);
    cr_assert_eq(r.finished, false);
    result_free(&r);

    /* Nothing but [DONE]: nothing written at all, until EOF. */
    r = RUN(END_NONE, "[DONE]");
    cr_assert_str_eq(r.text, "");
    result_free(&r);

    r = RUN(END_NONE, "[DONE]x");
    assert_type(&r, 0, "RUN_STARTED");
    assert_run_error(&r, 1, "INVALID_EVENT", "not a JSON event");
    result_free(&r);
}

Test(agui, non_json_is_invalid_event)
{
    struct result r = RUN(END_NONE, "hello world");
    cr_assert_eq(r.n_out, 2);
    assert_type(&r, 0, "RUN_STARTED");
    assert_client_ids(&r, 0);
    assert_int_timestamp(&r, 0);
    assert_run_error(&r, 1, "INVALID_EVENT", "not a JSON event");
    assert_int_timestamp(&r, 1);
    cr_assert_eq(r.last_rc, 1);
    cr_assert_str_eq(r.outcome, "RUN_ERROR:INVALID_EVENT");
    assert_verified(&r);
    result_free(&r);

    /* Mid-run: no second RUN_STARTED. */
    r = RUN(END_NONE, "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}", "{oops");
    cr_assert_eq(r.n_out, 2);
    assert_run_error(&r, 1, "INVALID_EVENT", "not a JSON event");
    result_free(&r);
}

Test(agui, malformed_events_are_invalid)
{
    static const struct {
        const char *data;
        const char *needle;
    } cases[] = {
        {"{\"type\":\"CUSTOM\"}{\"type\":\"CUSTOM\"}", "not a JSON event"}, /* two documents */
        {"{\"type\":\"CUSTOM\"} x", "not a JSON event"},                    /* trailing garbage */
        {"{\"type\":\"CUSTOM\",\"v\":\"\xff\xfe\"}", "not a JSON event"},   /* invalid UTF-8 */
        {"{\"type\":\"CUSTOM\",\"v\":\"a\\u0000b\"}", "not a JSON event"},  /* NUL in a string */
        {"", "not a JSON event"},
        {"   ", "not a JSON event"},
        {"42", "not a JSON event"},
        {"\"RUN_STARTED\"", "not a JSON event"},
        {"[{\"type\":\"CUSTOM\"}]", "not a JSON object"},
        {"{}", "\"type\""},
        {"{\"type\":\"\"}", "\"type\""},
        {"{\"type\":7}", "\"type\""},
        {"{\"type\":null}", "\"type\""},
        {"{\"type\":[\"RUN_STARTED\"]}", "\"type\""},
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        struct result r = RUN(END_NONE, cases[i].data);
        cr_assert_eq(r.n_out, 2, "case %zu: %s", i, r.text);
        assert_type(&r, 0, "RUN_STARTED");
        assert_run_error(&r, 1, "INVALID_EVENT", cases[i].needle);
        cr_assert_eq(r.last_rc, 1);
        assert_verified(&r);
        result_free(&r);
    }
}

Test(agui, error_text_quoting_bad_bytes_stays_valid)
{
    /* jansson quotes the offending token; the message must still be valid UTF-8 JSON. */
    struct result r = RUN(END_NONE, "\xc3\x28garbage\x80");
    assert_run_error(&r, 1, "INVALID_EVENT", "not a JSON event");
    result_free(&r);
}

/* ---- rule 2: RUN_STARTED --------------------------------------------------------------------- */

Test(agui, run_started_injected)
{
    const char *msg =
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m1\",\"role\":\"assistant\"}";
    struct result r = RUN(END_NONE, msg);
    char *expect = NULL;

    cr_assert_eq(r.n_out, 2);
    assert_type(&r, 0, "RUN_STARTED");
    assert_type_first(&r, 0);
    assert_client_ids(&r, 0);
    assert_int_timestamp(&r, 0);
    cr_assert_eq(json_object_size(ev_at(&r, 0)), 4);
    /* The upstream event itself is still relayed raw. */
    expect = frame_of(msg);
    cr_assert_not_null(strstr(r.text, expect));
    cr_assert_eq(r.last_rc, 0);
    free(expect);
    result_free(&r);
}

Test(agui, run_started_ids_rewritten)
{
    struct result r =
        RUN(END_NONE, "{\"runId\":\"up-run\",\"type\":\"RUN_STARTED\",\"threadId\":\"up-thread\","
                      "\"parentRunId\":\"p0\",\"input\":{\"threadId\":\"t0\",\"runId\":\"r0\","
                      "\"messages\":[]},\"timestamp\":5}");
    cr_assert_eq(r.n_out, 1);
    assert_type(&r, 0, "RUN_STARTED");
    assert_type_first(&r, 0);
    assert_client_ids(&r, 0);
    cr_assert_str_eq(str_at(&r, 0, "parentRunId"), "p0");
    cr_assert(json_is_object(json_object_get(ev_at(&r, 0), "input")));
    cr_assert_eq(json_integer_value(json_object_get(ev_at(&r, 0), "timestamp")), 5);
    cr_assert_str_eq(
        r.text,
        "data: {\"type\":\"RUN_STARTED\",\"runId\":\"r1\",\"threadId\":\"t1\","
        "\"parentRunId\":\"p0\",\"input\":{\"threadId\":\"t0\",\"runId\":\"r0\",\"messages\":[]},"
        "\"timestamp\":5}\n\n");
    result_free(&r);

    /* Missing ids are filled in; only one of them differing is enough to rewrite. */
    r = RUN(END_NONE, "{\"type\":\"RUN_STARTED\"}",
            "{\"type\":\"CUSTOM\",\"name\":\"c\",\"value\":1}");
    cr_assert_str_eq(str_at(&r, 0, "threadId"), TID);
    cr_assert_str_eq(str_at(&r, 0, "runId"), RID);
    result_free(&r);
    r = RUN(END_NONE, "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":7}");
    cr_assert_str_eq(r.text,
                     "data: {\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}\n\n");
    result_free(&r);
}

Test(agui, second_run_started_dropped)
{
    struct result r =
        RUN(END_NONE, "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
            "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
            "{\"type\":\"RUN_STARTED\",\"threadId\":\"x\",\"runId\":\"y\"}");
    cr_assert_eq(r.n_out, 1);
    cr_assert_eq(r.last_rc, 0);
    result_free(&r);

    /* Also after an injected one. */
    r = RUN(END_EOF, "{\"type\":\"CUSTOM\",\"name\":\"c\",\"value\":1}",
            "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}");
    cr_assert_eq(r.n_out, 3);
    assert_type(&r, 1, "CUSTOM");
    assert_type(&r, 2, "RUN_FINISHED");
    assert_verified(&r);
    result_free(&r);
}

/* ---- rule 3: RUN_FINISHED -------------------------------------------------------------------- */

Test(agui, nothing_after_run_finished)
{
    struct result r =
        RUN(END_EOF, "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
            "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
            "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\"}", "not json",
            "{\"type\":\"RUN_ERROR\",\"message\":\"late\"}");
    cr_assert_eq(r.n_out, 2);
    cr_assert_eq(r.rcs[0], 0);
    cr_assert_eq(r.rcs[1], 1);
    cr_assert_eq(r.rcs[2], 1);
    cr_assert_eq(r.rcs[3], 1);
    cr_assert_eq(r.rcs[4], 1);
    cr_assert_str_eq(r.outcome, "RUN_FINISHED");
    assert_verified(&r);
    result_free(&r);
}

Test(agui, run_finished_closes_open_items_in_reverse)
{
    struct result r =
        RUN(END_NONE, "{\"type\":\"STEP_STARTED\",\"stepName\":\"s1\"}",
            "{\"type\":\"REASONING_START\",\"messageId\":\"x\"}",
            "{\"type\":\"REASONING_MESSAGE_START\",\"messageId\":\"x\",\"role\":\"reasoning\"}",
            "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m1\",\"role\":\"assistant\"}",
            "{\"type\":\"STEP_STARTED\",\"stepName\":\"s2\"}",
            "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\"}",
            "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m2\",\"role\":\"assistant\"}",
            "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m2\"}",
            "{\"type\":\"RUN_FINISHED\",\"threadId\":\"other\",\"runId\":\"r1\","
            "\"result\":{\"answer\":42},\"outcome\":{\"type\":\"success\"}}");
    static const struct {
        const char *type, *key, *id;
    } expect[] = {
        {"TOOL_CALL_END", "toolCallId", "c1"},   {"STEP_FINISHED", "stepName", "s2"},
        {"TEXT_MESSAGE_END", "messageId", "m1"}, {"REASONING_MESSAGE_END", "messageId", "x"},
        {"REASONING_END", "messageId", "x"},     {"STEP_FINISHED", "stepName", "s1"},
    };
    size_t base = 9; /* RUN_STARTED + 8 relayed */

    cr_assert_eq(r.n_out, base + AGW_ARRAY_LEN(expect) + 1, "%s", r.text);
    for (size_t i = 0; i < AGW_ARRAY_LEN(expect); i++) {
        assert_type(&r, base + i, expect[i].type);
        assert_type_first(&r, base + i);
        cr_assert_str_eq(str_at(&r, base + i, expect[i].key), expect[i].id);
        assert_int_timestamp(&r, base + i);
        cr_assert_eq(json_object_size(ev_at(&r, base + i)), 3);
    }
    size_t last = base + AGW_ARRAY_LEN(expect);
    assert_type(&r, last, "RUN_FINISHED");
    assert_client_ids(&r, last);
    cr_assert_eq(
        json_integer_value(json_object_get(json_object_get(ev_at(&r, last), "result"), "answer")),
        42);
    cr_assert_not_null(json_object_get(ev_at(&r, last), "outcome"));
    cr_assert_eq(r.last_rc, 1);
    assert_verified(&r);
    result_free(&r);
}

Test(agui, run_finished_first_gets_run_started)
{
    struct result r = RUN(END_NONE, "{\"type\":\"RUN_FINISHED\"}");
    cr_assert_eq(r.n_out, 2);
    assert_type(&r, 0, "RUN_STARTED");
    assert_type(&r, 1, "RUN_FINISHED");
    assert_client_ids(&r, 1);
    assert_verified(&r);
    result_free(&r);
}

/* ---- rule 4: RUN_ERROR ----------------------------------------------------------------------- */

Test(agui, cloudbase_run_error_translated)
{
    struct result r =
        RUN(END_EOF, "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
            "{\"type\":\"RUN_ERROR\",\"error\":{\"code\":\"TOOL_EXECUTION_ERROR\",\"message\":"
            "\"Tool failed\"}}",
            "{\"type\":\"CUSTOM\"}");
    cr_assert_eq(r.n_out, 2);
    cr_assert_str_eq(r.text,
                     "data: {\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}\n\n"
                     "data: {\"type\":\"RUN_ERROR\",\"message\":\"Tool failed\","
                     "\"code\":\"TOOL_EXECUTION_ERROR\"}\n\n");
    cr_assert_eq(r.rcs[1], 1);
    cr_assert_eq(r.rcs[2], 1);
    cr_assert_str_eq(r.outcome, "RUN_ERROR:TOOL_EXECUTION_ERROR");
    assert_verified(&r);
    result_free(&r);
}

Test(agui, run_error_variants)
{
    static const struct {
        const char *in;
        const char *out; /* the RUN_ERROR frame's data */
        const char *outcome;
    } cases[] = {
        /* already right: raw */
        {"{\"type\":\"RUN_ERROR\",\"message\":\"m\",\"code\":\"C\",\"timestamp\":1}",
         "{\"type\":\"RUN_ERROR\",\"message\":\"m\",\"code\":\"C\",\"timestamp\":1}",
         "RUN_ERROR:C"},
        {"{\"type\":\"RUN_ERROR\",\"message\":\"m\"}", "{\"type\":\"RUN_ERROR\",\"message\":\"m\"}",
         "RUN_ERROR"},
        /* CloudBase with a timestamp, a numeric code, no message */
        {"{\"type\":\"RUN_ERROR\",\"error\":{\"code\":500},\"timestamp\":1.9}",
         "{\"type\":\"RUN_ERROR\",\"timestamp\":1,\"message\":\"upstream reported an "
         "error\",\"code\":\"500\"}",
         "RUN_ERROR:500"},
        {"{\"type\":\"RUN_ERROR\"}",
         "{\"type\":\"RUN_ERROR\",\"message\":\"upstream reported an error\"}", "RUN_ERROR"},
        {"{\"type\":\"RUN_ERROR\",\"message\":null,\"code\":null}",
         "{\"type\":\"RUN_ERROR\",\"message\":\"upstream reported an error\"}", "RUN_ERROR"},
        {"{\"type\":\"RUN_ERROR\",\"message\":\"m\",\"code\":42}",
         "{\"type\":\"RUN_ERROR\",\"message\":\"m\",\"code\":\"42\"}", "RUN_ERROR:42"},
        {"{\"type\":\"RUN_ERROR\",\"message\":\"m\",\"code\":{\"x\":1}}",
         "{\"type\":\"RUN_ERROR\",\"message\":\"m\"}", "RUN_ERROR"},
        {"{\"type\":\"RUN_ERROR\",\"error\":\"boom\"}",
         "{\"type\":\"RUN_ERROR\",\"message\":\"boom\"}", "RUN_ERROR"},
        {"{\"type\":\"RUN_ERROR\",\"message\":7,\"error\":{\"message\":\"E\",\"code\":\"X\"}}",
         "{\"type\":\"RUN_ERROR\",\"message\":\"E\",\"code\":\"X\"}", "RUN_ERROR:X"},
        /* top-level fields win over error{} */
        {"{\"type\":\"RUN_ERROR\",\"message\":\"top\",\"code\":\"T\",\"error\":{\"message\":\"E\","
         "\"code\":\"X\"}}",
         "{\"type\":\"RUN_ERROR\",\"message\":\"top\",\"code\":\"T\"}", "RUN_ERROR:T"},
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        struct result r = RUN(END_EOF, cases[i].in);
        char *expect = NULL;
        cr_assert_eq(r.n_out, 2, "case %zu: %s", i, r.text);
        assert_type(&r, 0, "RUN_STARTED");
        expect = frame_of(cases[i].out);
        cr_assert_str_eq(strstr(r.text, "data: {\"type\":\"RUN_ERROR\""), expect, "case %zu", i);
        cr_assert_str_eq(r.outcome, cases[i].outcome, "case %zu", i);
        cr_assert_eq(r.last_rc, 1);
        assert_verified(&r);
        free(expect);
        result_free(&r);
    }
}

/* An upstream RUN_ERROR arriving with a message open: the message is closed first (the client's
 * view of the thread must not keep a message that never ends). */
Test(agui, run_error_closes_open_items_first)
{
    struct result r =
        RUN(END_NONE, "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"user\"}",
            "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c\",\"toolCallName\":\"f\"}",
            "{\"type\":\"RUN_ERROR\",\"message\":\"x\"}");
    cr_assert_eq(r.n_out, 6);
    assert_type(&r, 3, "TOOL_CALL_END");
    cr_assert_str_eq(str_at(&r, 3, "toolCallId"), "c");
    assert_type(&r, 4, "TEXT_MESSAGE_END");
    cr_assert_str_eq(str_at(&r, 4, "messageId"), "m");
    assert_type(&r, 5, "RUN_ERROR");
    assert_verified(&r);
    result_free(&r);
}

/* ---- rule 5: tracking opens ------------------------------------------------------------------ */

Test(agui, duplicate_start_and_unknown_end_dropped)
{
    struct result r =
        RUN(END_EOF, "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"assistant\"}",
            "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"assistant\"}",
            "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m\"}",
            "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m\"}",
            "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"nope\"}",
            "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"nope\"}",
            "{\"type\":\"STEP_FINISHED\",\"stepName\":\"nope\"}",
            "{\"type\":\"REASONING_END\",\"messageId\":\"nope\"}",
            "{\"type\":\"REASONING_MESSAGE_END\",\"messageId\":\"nope\"}",
            "{\"type\":\"STEP_STARTED\",\"stepName\":\"s\"}",
            "{\"type\":\"STEP_STARTED\",\"stepName\":\"s\"}",
            "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c\",\"toolCallName\":\"f\"}",
            "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c\",\"toolCallName\":\"f\"}",
            "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c\"}",
            "{\"type\":\"STEP_FINISHED\",\"stepName\":\"s\"}");
    /* RUN_STARTED, START m, END m, STEP_STARTED, TOOL_CALL_START, TOOL_CALL_END, STEP_FINISHED,
     * RUN_FINISHED */
    cr_assert_eq(r.n_out, 8, "%s", r.text);
    for (size_t i = 0; i < 15; i++)
        cr_assert_eq(r.rcs[i], 0);
    assert_type(&r, 7, "RUN_FINISHED");
    assert_verified(&r);
    result_free(&r);

    /* Nothing but dropped events: nothing is written. */
    r = RUN(END_NONE, "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"nope\"}");
    cr_assert_str_eq(r.text, "");
    result_free(&r);
}

Test(agui, same_id_in_different_kinds_is_independent)
{
    struct result r =
        RUN(END_EOF, "{\"type\":\"REASONING_START\",\"messageId\":\"x\"}",
            "{\"type\":\"REASONING_MESSAGE_START\",\"messageId\":\"x\",\"role\":\"reasoning\"}",
            "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"x\",\"role\":\"assistant\"}",
            "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"x\"}",
            "{\"type\":\"REASONING_MESSAGE_END\",\"messageId\":\"x\"}",
            "{\"type\":\"REASONING_END\",\"messageId\":\"x\"}");
    cr_assert_eq(r.n_out, 8, "%s", r.text);
    assert_verified(&r);
    result_free(&r);
}

Test(agui, content_for_unknown_id_is_invalid)
{
    static const struct {
        const char *data;
        const char *needle;
    } cases[] = {
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"ghost\",\"delta\":\"x\"}",
         "TEXT_MESSAGE_CONTENT for messageId \"ghost\""},
        {"{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"ghost\",\"delta\":\"x\"}",
         "TOOL_CALL_ARGS for toolCallId \"ghost\""},
        {"{\"type\":\"REASONING_MESSAGE_CONTENT\",\"messageId\":\"ghost\",\"delta\":\"x\"}",
         "REASONING_MESSAGE_CONTENT for messageId \"ghost\""},
        /* a closed one is not open either; so is an id open in another kind */
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"x\"}",
         "\"m\", which is not open"},
        {"{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"open\",\"delta\":\"x\"}",
         "\"open\", which is not open"},
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        struct result r =
            RUN(END_EOF, "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"user\"}",
                "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m\"}",
                "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"open\",\"role\":\"user\"}",
                cases[i].data);
        /* The message still open is closed before the RUN_ERROR. */
        cr_assert_eq(r.n_out, 6, "case %zu: %s", i, r.text);
        assert_type(&r, 4, "TEXT_MESSAGE_END");
        cr_assert_str_eq(str_at(&r, 4, "messageId"), "open");
        assert_run_error(&r, 5, "INVALID_EVENT", cases[i].needle);
        cr_assert_eq(r.last_rc, 1);
        assert_verified(&r);
        result_free(&r);
    }
}

Test(agui, long_id_quoted_as_excerpt)
{
    char data[2048];
    char id[1001];

    memset(id, 'a', 999);
    memcpy(id + 95, "\xe4\xbd\xa0", 3); /* a 3-byte character across the cut at 96 bytes */
    id[1000] = '\0';
    id[999] = 'z';
    snprintf(data, sizeof(data),
             "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"%s\",\"delta\":\"x\"}", id);
    struct result r = RUN(END_NONE, data);
    assert_run_error(&r, 1, "INVALID_EVENT", "...\", which is not open");
    cr_assert_lt(strlen(str_at(&r, 1, "message")), 200);
    cr_assert_null(strstr(str_at(&r, 1, "message"), "\xe4"));
    result_free(&r);
}

Test(agui, missing_ids_are_invalid)
{
    static const char *const cases[] = {
        "{\"type\":\"TEXT_MESSAGE_START\",\"role\":\"assistant\"}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":1}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"delta\":\"x\"}",
        "{\"type\":\"TEXT_MESSAGE_END\"}",
        "{\"type\":\"TOOL_CALL_START\",\"toolCallName\":\"f\"}",
        "{\"type\":\"TOOL_CALL_ARGS\",\"delta\":\"x\"}",
        "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":null}",
        "{\"type\":\"REASONING_START\"}",
        "{\"type\":\"REASONING_END\"}",
        "{\"type\":\"REASONING_MESSAGE_START\"}",
        "{\"type\":\"REASONING_MESSAGE_CONTENT\",\"delta\":\"x\"}",
        "{\"type\":\"REASONING_MESSAGE_END\"}",
        "{\"type\":\"STEP_STARTED\"}",
        "{\"type\":\"STEP_FINISHED\",\"stepName\":{}}",
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        struct result r = RUN(END_EOF, cases[i]);
        cr_assert_eq(r.n_out, 2, "case %zu: %s", i, r.text);
        assert_run_error(&r, 1, "INVALID_EVENT", "without a string");
        assert_verified(&r);
        result_free(&r);
    }
}

static void open_many(struct agw_agui *a, struct evbuffer *out, size_t n, size_t id_len, int *rc)
{
    char *data = malloc(id_len + 128);
    char *id = malloc(id_len + 1);

    for (size_t i = 0; i < n; i++) {
        snprintf(id, id_len + 1, "%0*zu", (int)id_len, i);
        int len = snprintf(
            data, id_len + 128,
            "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"%s\",\"toolCallName\":\"f\"}", id);
        *rc = agw_agui_feed(a, data, (size_t)len, SINK(out));
        if (*rc != 0)
            break;
    }
    free(data);
    free(id);
}

Test(agui, open_items_capped_at_1024)
{
    struct agw_agui *a = agw_agui_new(TID, RID, AGW_PROTO_AGUI);
    struct evbuffer *out = evbuffer_new();
    int rc = 0;
    const char *again =
        "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"0005\",\"toolCallName\":\"f\"}";
    const char *more = "{\"type\":\"STEP_STARTED\",\"stepName\":\"one too many\"}";

    open_many(a, out, 1024, 4, &rc);
    cr_assert_eq(rc, 0);
    cr_assert_eq(agw_agui_events_out(a), 1025);
    /* A duplicate at the cap is still just dropped. */
    cr_assert_eq(agw_agui_feed(a, again, strlen(again), SINK(out)), 0);
    cr_assert_eq(agw_agui_events_out(a), 1025);
    cr_assert_eq(agw_agui_feed(a, more, strlen(more), SINK(out)), 1);
    cr_assert_str_eq(agw_agui_outcome(a), "RUN_ERROR:INVALID_EVENT");

    char *text = drain(out);
    json_t *events = parse_stream(text);
    json_t *last = json_array_get(events, json_array_size(events) - 1);
    cr_assert_str_eq(json_string_value(json_object_get(last, "type")), "RUN_ERROR");
    cr_assert_not_null(strstr(json_string_value(json_object_get(last, "message")), "1024"));
    cr_assert_null(verify_stream(events));
    json_decref(events);
    free(text);
    evbuffer_free(out);
    agw_agui_free(a);
}

Test(agui, open_items_bounded_by_id_bytes)
{
    struct agw_agui *a = agw_agui_new(TID, RID, AGW_PROTO_AGUI);
    struct evbuffer *out = evbuffer_new();
    int rc = 0;

    /* 128 KiB of ids: 128 ids of 1 KiB fit, the 129th does not. */
    open_many(a, out, 129, 1024, &rc);
    cr_assert_eq(rc, 1);
    /* RUN_STARTED, 128 opens, their 128 ends, RUN_ERROR. */
    cr_assert_eq(agw_agui_events_out(a), 1 + 128 + 128 + 1);
    cr_assert_str_eq(agw_agui_outcome(a), "RUN_ERROR:INVALID_EVENT");
    evbuffer_free(out);
    agw_agui_free(a);
}

Test(agui, closing_frees_room_under_the_cap)
{
    struct agw_agui *a = agw_agui_new(TID, RID, AGW_PROTO_AGUI);
    struct evbuffer *out = evbuffer_new();
    const char *start =
        "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c\",\"toolCallName\":\"f\"}";
    const char *end = "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c\"}";

    for (int i = 0; i < 5000; i++) {
        cr_assert_eq(agw_agui_feed(a, start, strlen(start), SINK(out)), 0);
        cr_assert_eq(agw_agui_feed(a, end, strlen(end), SINK(out)), 0);
    }
    cr_assert_eq(agw_agui_events_out(a), 10001);
    evbuffer_free(out);
    agw_agui_free(a);
}

/* ---- rule 6: deltas -------------------------------------------------------------------------- */

Test(agui, empty_delta_dropped)
{
    struct result r =
        RUN(END_EOF, "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"assistant\"}",
            "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"\"}",
            "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"a\"}",
            "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m\"}",
            "{\"type\":\"REASONING_MESSAGE_START\",\"messageId\":\"x\",\"role\":\"reasoning\"}",
            "{\"type\":\"REASONING_MESSAGE_CONTENT\",\"messageId\":\"x\",\"delta\":\"\"}",
            "{\"type\":\"REASONING_MESSAGE_END\",\"messageId\":\"x\"}");
    /* RUN_STARTED, START, CONTENT a, END, RSTART, REND, RUN_FINISHED */
    cr_assert_eq(r.n_out, 7, "%s", r.text);
    cr_assert_str_eq(str_at(&r, 2, "delta"), "a");
    assert_type(&r, 5, "REASONING_MESSAGE_END");
    assert_verified(&r);
    result_free(&r);
}

Test(agui, non_string_delta_is_invalid)
{
    static const char *const cases[] = {
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":5}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":null}",
        "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c\",\"delta\":{\"a\":1}}",
        "{\"type\":\"REASONING_MESSAGE_CONTENT\",\"messageId\":\"x\",\"delta\":[]}",
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        struct result r =
            RUN(END_EOF, "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"user\"}",
                "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c\",\"toolCallName\":\"f\"}",
                "{\"type\":\"REASONING_MESSAGE_START\",\"messageId\":\"x\",\"role\":\"reasoning\"}",
                cases[i]);
        /* The three open items are closed, newest first, before the RUN_ERROR. */
        cr_assert_eq(r.n_out, 8, "case %zu: %s", i, r.text);
        assert_type(&r, 4, "REASONING_MESSAGE_END");
        assert_type(&r, 5, "TOOL_CALL_END");
        assert_type(&r, 6, "TEXT_MESSAGE_END");
        assert_run_error(&r, 7, "INVALID_EVENT", "without a string \"delta\"");
        assert_verified(&r);
        result_free(&r);
    }
}

/* ---- rule 7: CloudBase dialect fixes --------------------------------------------------------- */

Test(agui, text_message_start_gets_role)
{
    struct result r = RUN(END_NONE, "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"msg-1\"}");
    cr_assert_str_eq(
        strstr(r.text, "data: {\"type\":\"TEXT_MESSAGE_START\""),
        "data: "
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"msg-1\",\"role\":\"assistant\"}\n\n");
    result_free(&r);

    r = RUN(END_NONE, "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"msg-1\",\"role\":null}");
    cr_assert_str_eq(str_at(&r, 1, "role"), "assistant");
    result_free(&r);

    /* A role that is there is kept, raw. */
    r = RUN(END_NONE, "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"user\"}");
    cr_assert_str_eq(str_at(&r, 1, "role"), "user");
    result_free(&r);
}

Test(agui, cloudbase_seed_stream)
{
    /* A CloudBase-style response: no RUN_STARTED, no role, a bare RUN_FINISHED. */
    struct result r = RUN(
        END_NONE, "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"msg-1\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"msg-1\",\"delta\":\"Hello\"}",
        "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"msg-1\"}", "{\"type\":\"RUN_FINISHED\"}");
    cr_assert_eq(r.n_out, 5);
    assert_type(&r, 0, "RUN_STARTED");
    cr_assert_str_eq(str_at(&r, 1, "role"), "assistant");
    assert_type(&r, 4, "RUN_FINISHED");
    assert_client_ids(&r, 4);
    cr_assert_eq(r.last_rc, 1);
    assert_verified(&r);
    result_free(&r);
}

Test(agui, tool_call_start_with_args_split)
{
    struct result r =
        RUN(END_NONE, "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"call-2\","
                      "\"toolCallName\":\"request_input\",\"args\":\"{\\\"a\\\":1}\"}");
    cr_assert_eq(r.n_out, 3, "%s", r.text);
    assert_type(&r, 1, "TOOL_CALL_START");
    cr_assert_null(json_object_get(ev_at(&r, 1), "args"));
    cr_assert_str_eq(str_at(&r, 1, "toolCallName"), "request_input");
    assert_type(&r, 2, "TOOL_CALL_ARGS");
    assert_type_first(&r, 2);
    cr_assert_str_eq(str_at(&r, 2, "toolCallId"), "call-2");
    cr_assert_str_eq(str_at(&r, 2, "delta"), "{\"a\":1}");
    assert_int_timestamp(&r, 2);
    result_free(&r);

    /* An object (CloudBase's form) is serialised compact, key order kept. */
    r = RUN(END_EOF,
            "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"call-2\",\"toolCallName\":\"request_"
            "input\","
            "\"args\":{ \"prompt\" : \"Please enter\", \"a\": [1, 2] }}",
            "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"call-2\"}");
    cr_assert_eq(r.n_out, 5, "%s", r.text);
    cr_assert_str_eq(str_at(&r, 2, "delta"), "{\"prompt\":\"Please enter\",\"a\":[1,2]}");
    assert_type(&r, 3, "TOOL_CALL_END");
    assert_verified(&r);
    result_free(&r);

    /* Other JSON values too. */
    r = RUN(
        END_NONE,
        "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c\",\"toolCallName\":\"f\",\"args\":42}");
    cr_assert_str_eq(str_at(&r, 2, "delta"), "42");
    result_free(&r);

    /* Empty string args, null args: TOOL_CALL_START only, without args. */
    r = RUN(
        END_NONE,
        "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c\",\"toolCallName\":\"f\",\"args\":\"\"}");
    cr_assert_eq(r.n_out, 2, "%s", r.text);
    cr_assert_str_eq(
        strstr(r.text, "data: {\"type\":\"TOOL_CALL_START\""),
        "data: {\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c\",\"toolCallName\":\"f\"}\n\n");
    result_free(&r);
    r = RUN(
        END_NONE,
        "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c\",\"toolCallName\":\"f\",\"args\":null}");
    cr_assert_eq(r.n_out, 2, "%s", r.text);
    cr_assert_null(json_object_get(ev_at(&r, 1), "args"));
    result_free(&r);
}

/* ---- rule 8: nulls and timestamps ------------------------------------------------------------ */

Test(agui, null_fields_stripped)
{
    struct result r =
        RUN(END_NONE, "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"m\",\"toolCallId\":\"c\","
                      "\"content\":\"x\",\"role\":null,\"rawEvent\":null,\"nested\":{\"k\":null}}");
    cr_assert_str_eq(
        strstr(r.text, "data: {\"type\":\"TOOL_CALL_RESULT\""),
        "data: {\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"m\",\"toolCallId\":\"c\","
        "\"content\":\"x\",\"nested\":{\"k\":null}}\n\n");
    result_free(&r);
}

Test(agui, timestamps_made_integer)
{
    struct result r =
        RUN(END_NONE,
            "{\"type\":\"CUSTOM\",\"timestamp\":1700000000123.987,\"name\":\"a\",\"value\":1}",
            "{\"type\":\"CUSTOM\",\"timestamp\":\"2024-01-01\",\"name\":\"b\",\"value\":1}",
            "{\"type\":\"CUSTOM\",\"timestamp\":true,\"name\":\"c\",\"value\":1}",
            "{\"type\":\"CUSTOM\",\"timestamp\":1e300,\"name\":\"d\",\"value\":1}",
            "{\"type\":\"CUSTOM\",\"timestamp\":1700000000123,\"name\":\"e\",\"value\":1}",
            "{\"type\":\"CUSTOM\",\"timestamp\":-1.5,\"name\":\"f\",\"value\":1}");
    const char *expect =
        "data: {\"type\":\"CUSTOM\",\"timestamp\":1700000000123,\"name\":\"a\",\"value\":1}\n\n"
        "data: {\"type\":\"CUSTOM\",\"name\":\"b\",\"value\":1}\n\n"
        "data: {\"type\":\"CUSTOM\",\"name\":\"c\",\"value\":1}\n\n"
        "data: {\"type\":\"CUSTOM\",\"name\":\"d\",\"value\":1}\n\n"
        "data: {\"type\":\"CUSTOM\",\"timestamp\":1700000000123,\"name\":\"e\",\"value\":1}\n\n"
        "data: {\"type\":\"CUSTOM\",\"timestamp\":-1,\"name\":\"f\",\"value\":1}\n\n";
    cr_assert_str_eq(strstr(r.text, "data: {\"type\":\"CUSTOM\""), expect);
    result_free(&r);
}

Test(agui, reserialised_events_put_type_first)
{
    struct result r = RUN(END_NONE, "{\"name\":\"n\",\"type\":\"CUSTOM\",\"x\":null,\"value\":1}");
    cr_assert_str_eq(strstr(r.text, "data: {\"type\":\"CUSTOM\""),
                     "data: {\"type\":\"CUSTOM\",\"name\":\"n\",\"value\":1}\n\n");
    result_free(&r);

    /* Raw pass-through keeps the upstream's order (nothing to change). */
    r = RUN(END_NONE, "{\"name\":\"n\",\"type\":\"CUSTOM\",\"value\":1}");
    cr_assert_not_null(
        strstr(r.text, "data: {\"name\":\"n\",\"type\":\"CUSTOM\",\"value\":1}\n\n"));
    result_free(&r);
}

Test(agui, multi_line_data_reserialised_compact)
{
    struct result r =
        RUN(END_NONE,
            "{\n  \"type\": \"CUSTOM\",\n  \"name\": \"x\",\r\n  \"value\": {\"z\": 1, \"a\": "
            "[1, 2.5, \"l1\\nl2\"]}\n}");
    cr_assert_str_eq(
        strstr(r.text, "data: {\"type\":\"CUSTOM\""),
        "data: "
        "{\"type\":\"CUSTOM\",\"name\":\"x\",\"value\":{\"z\":1,\"a\":[1,2.5,\"l1\\nl2\"]}}\n\n");
    result_free(&r);

    /* A multi-line [DONE] is still [DONE]; a multi-line RUN_FINISHED is compacted too. */
    r = RUN(END_NONE, "\n[DONE]\n",
            "{\"type\":\n\"RUN_FINISHED\",\n\"threadId\":\"t1\",\"runId\":\"r1\"}");
    cr_assert_eq(r.n_out, 2);
    cr_assert_str_eq(strstr(r.text, "data: {\"type\":\"RUN_FINISHED\""),
                     "data: {\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}\n\n");
    result_free(&r);
}

/* ---- rule 9: pass-through -------------------------------------------------------------------- */

/* An event relayed unchanged is handed to the sink as the upstream's own bytes (pass): the relay
 * then relays the frame it read; a rewritten, dropped or generated event is not. */
Test(agui, unchanged_events_are_passed_as_the_upstreams_bytes)
{
    static const char block[] =
        "data: {\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}\n\n"
        "data: {\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"assistant\"}\n\n"
        "data: {\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"a\"}\n\n"
        "data: {\"type\":\"CUSTOM\",\"name\":\"x\",\"value\":1,\"v\":null}\n\n" /* rewritten */
        "data: {\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"b\"}\n\n"
        "data: [DONE]\n\n" /* dropped */
        "data: {\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"c\"}\n\n";
    const char *const expect =
        "data: {\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}\n\n"
        "data: {\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"assistant\"}\n\n"
        "data: {\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"a\"}\n\n"
        "data: {\"type\":\"CUSTOM\",\"name\":\"x\",\"value\":1}\n\n"
        "data: {\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"b\"}\n\n"
        "data: {\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"c\"}\n\n";
    struct agw_agui *a = agw_agui_new(TID, RID, AGW_PROTO_AGUI);
    struct agw_sse_parser *p = agw_sse_parser_new(1 << 20);
    struct evbuffer *out = evbuffer_new();
    struct feed_ctx ctx = {a, {out, block, sizeof(block) - 1, 0}, 0};
    char *text;

    cr_assert_eq(agw_sse_parse_bytes(p, block, sizeof(block) - 1, feed_frame, &ctx), 7);
    cr_assert_eq(ctx.framed, 7, "every frame of the block is framed");
    cr_assert_eq(ctx.sink.passed, 5, "five events passed as they came (not CUSTOM, not [DONE])");
    cr_assert_eq(agw_agui_events_out(a), 6);
    text = drain(out);
    cr_assert_str_eq(text, expect);
    free(text);
    evbuffer_free(out);
    agw_sse_parser_free(p);
    agw_agui_free(a);
}

/* A sink that records what agw_agui_emitting_content() says of each event. */
struct hint_ctx {
    struct agw_agui *a;
    char seen[12][160]; /* "T|A <id token> <delta token>" or "-" per event */
    int n;
};

static void hint_emit(void *arg, const char *json, size_t len, bool pass)
{
    struct hint_ctx *h = arg;
    struct agw_agui_content c;

    (void)pass;
    cr_assert_lt(h->n, 12);
    if (!agw_agui_emitting_content(h->a, &c)) {
        snprintf(h->seen[h->n++], sizeof(h->seen[0]), "-");
        return;
    }
    cr_assert(c.id >= json && c.id + c.id_len <= json + len, "the id's token is in the event");
    cr_assert(c.delta >= json && c.delta + c.delta_len <= json + len);
    snprintf(h->seen[h->n++], sizeof(h->seen[0]), "%s %.*s %.*s", c.args ? "A" : "T", (int)c.id_len,
             c.id, (int)c.delta_len, c.delta);
}

static void discard_emit(void *arg, const char *json, size_t len, bool pass)
{
    (void)arg;
    (void)json;
    (void)len;
    (void)pass;
}

/* Feeds <frames> to a run on the fast paths, recording with <emit> what the sink is told of each
 * event, which must be <want>; then the first <n_full> to a run on the full path, which tells the
 * sink nothing ("-" for every event it writes). */
static void expect_hints(void (*emit)(void *, const char *, size_t, bool),
                         const char *const *frames, size_t n_frames, const char *const *want,
                         size_t n_want, size_t n_full)
{
    struct hint_ctx h = {0};
    const struct agw_agui_sink sink = {emit, &h};

    h.a = agw_agui_new(TID, RID, AGW_PROTO_AGUI);
    for (size_t i = 0; i < n_frames; i++)
        agw_agui_feed(h.a, frames[i], strlen(frames[i]), &sink);
    cr_assert_eq(h.n, (int)n_want);
    for (int i = 0; i < h.n; i++)
        cr_assert_str_eq(h.seen[i], want[i], "event %d", i);
    agw_agui_free(h.a);
    memset(&h, 0, sizeof(h));
    h.a = agw_agui_new(TID, RID, AGW_PROTO_AGUI);
    agw_agui_set_fast_paths(h.a, false);
    for (size_t i = 0; i < n_full; i++)
        agw_agui_feed(h.a, frames[i], strlen(frames[i]), &sink);
    cr_assert_gt(h.n, 0);
    for (int i = 0; i < h.n; i++)
        cr_assert_str_eq(h.seen[i], "-", "event %d (full path)", i);
    agw_agui_free(h.a);
}

/* The sink learns the id and delta of a content event the fast path read (the first of a message
 * and the ones after it, read through the cached prefix), and nothing of any other event. */
Test(agui, the_sink_is_told_the_id_and_delta_of_fast_content)
{
    const char *const frames[] = {
        "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"assistant\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"a\\\"b\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"c\"}",
        "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"t\",\"toolCallName\":\"f\"}",
        "{\"type\":\"TOOL_CALL_ARGS\",\"delta\":\"{}\",\"toolCallId\":\"t\"}",
        "{\"type\":\"REASONING_START\",\"messageId\":\"r\"}",
    };
    const char *const want[] = {
        "-", "-", "T \"m\" \"a\\\"b\"", "T \"m\" \"c\"", "-", "A \"t\" \"{}\"", "-"};

    expect_hints(hint_emit, frames, AGW_ARRAY_LEN(frames), want, AGW_ARRAY_LEN(want), 4);
}

/* Content events with members after the delta (a sequence number, a send time, a timestamp): the
 * next one with the same bytes before its delta is read from there on (the cached prefix), and one
 * whose tail holds what the whole scan would refuse (a second delta, a second timestamp, a
 * fraction) goes to the full path as before: the sink is told nothing of it. */
Test(agui, members_after_the_delta_are_read_as_the_whole_scan_reads_them)
{
    const char *const frames[] = {
        "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"assistant\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"a\",\"sentUs\":1}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"b\","
        "\"sentUs\":1764430000123456}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"i\","
        "\"timestamp\":1700000000123,\"seq\":12345}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"j\",\"timestamp\":3,"
        "\"timestamp\":4}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"k\","
        "\"timestamp\":3.5}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"c\",\"delta\":\"d\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"timestamp\":1,\"messageId\":\"m\",\"delta\":\"f\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"timestamp\":1,\"messageId\":\"m\",\"delta\":\"g\","
        "\"timestamp\":2}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"timestamp\":1,\"messageId\":\"m\",\"delta\":\"h\","
        "\"n\":2}",
    };
    const char *const want[] = {"-",
                                "-",
                                "T \"m\" \"a\"",
                                "T \"m\" \"b\"",
                                "T \"m\" \"i\"",
                                "-",
                                "-",
                                "-",
                                "T \"m\" \"f\"",
                                "-",
                                "T \"m\" \"h\""};
    struct agw_agui *a = agw_agui_new(TID, RID, AGW_PROTO_AGUI);
    const struct agw_agui_sink sink = {discard_emit, NULL};

    expect_hints(hint_emit, frames, AGW_ARRAY_LEN(frames), want, AGW_ARRAY_LEN(want), 4);
    /* "b" and "i" from their delta on: a timestamp after a cached delta is the event's only one */
    for (size_t i = 0; i < AGW_ARRAY_LEN(frames); i++)
        agw_agui_feed(a, frames[i], strlen(frames[i]), &sink);
    cr_assert_eq(agw_agui_cached_reads(a), 2);
    agw_agui_free(a);
}

/* A sink that records what agw_agui_emitting_type() says of each event. */
static void type_emit(void *arg, const char *json, size_t len, bool pass)
{
    struct hint_ctx *h = arg;
    const char *type;
    size_t n;

    cr_assert_lt(h->n, 12);
    if (!agw_agui_emitting_type(h->a, &type, &n)) {
        snprintf(h->seen[h->n++], sizeof(h->seen[0]), "-");
        return;
    }
    cr_assert(pass, "here, a typed event is the upstream's own bytes");
    cr_assert(type > json && type + n < json + len, "the type is inside the event");
    cr_assert_eq(type[-1], '"');
    cr_assert_eq(type[n], '"');
    snprintf(h->seen[h->n++], sizeof(h->seen[0]), "%.*s", (int)n, type);
}

/* A sub-agent's content event (one with a "subagentRunId") is told of like any other: its id and
 * delta, wherever its subagentRunId stands (chunk streams, which such an event may end, are the
 * normaliser's own; history only appends the delta). */
Test(agui, a_sub_agents_content_is_told_of_like_any)
{
    const char *const frames[] = {
        "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"assistant\","
        "\"subagentRunId\":\"s\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"subagentRunId\":\"s\","
        "\"delta\":\"a\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"subagentRunId\":\"s\","
        "\"delta\":\"b\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"c\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"d\","
        "\"subagentRunId\":\"s\"}",
    };
    const char *const content[] = {
        "-", "-", "T \"m\" \"a\"", "T \"m\" \"b\"", "T \"m\" \"c\"", "T \"m\" \"d\""};
    /* (a sub-agent's start: the full path, which checks its opener) */
    const char *const typed[] = {"RUN_STARTED", "-", "-", "-", "-", "-"};

    expect_hints(hint_emit, frames, AGW_ARRAY_LEN(frames), content, AGW_ARRAY_LEN(content), 4);
    expect_hints(type_emit, frames, AGW_ARRAY_LEN(frames), typed, AGW_ARRAY_LEN(typed), 4);
}

/* The sink learns the type of every event a fast path relayed unchanged but a content one (which
 * says more through agw_agui_emitting_content()), and nothing of an event the full path wrote. */
Test(agui, the_sink_is_told_the_type_of_a_flat_event)
{
    const char *const frames[] = {
        "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
        "{\"role\":\"assistant\",\"messageId\":\"m\",\"type\":\"TEXT_MESSAGE_START\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"a\"}",
        "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m\",\"timestamp\":1.5}",
        "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m\"}",
        "{\"type\":\"CUSTOM\",\"name\":\"n\",\"value\":true}",
        "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
    };
    /* the fourth: a float timestamp, rewritten by the full path (then the fifth is an end of
     * nothing open: not written at all) */
    const char *const want[] = {"RUN_STARTED", "TEXT_MESSAGE_START", "-", "-",
                                "CUSTOM",      "RUN_FINISHED"};

    expect_hints(type_emit, frames, AGW_ARRAY_LEN(frames), want, AGW_ARRAY_LEN(want),
                 AGW_ARRAY_LEN(frames));
}

Test(agui, other_events_pass_through_raw)
{
    const char *const frames[] = {
        "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
        "{\"type\":\"ACTIVITY_SNAPSHOT\",\"messageId\":\"a\",\"activityType\":\"p\",\"content\":{}"
        "}",
        "{\"type\":\"ACTIVITY_DELTA\",\"messageId\":\"a\",\"activityType\":\"p\",\"patch\":[]}",
        "{\"type\":\"STATE_SNAPSHOT\",\"snapshot\":null}",
        "{\"type\":\"RAW\",\"event\":{\"x\":[null]}}",
        "{\"type\":\"REASONING_ENCRYPTED_VALUE\",\"subtype\":\"message\",\"entityId\":\"m\","
        "\"encryptedValue\":\"e\"}",
        "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"s\",\"name\":\"n\"}",
        "{\"type\":\"THINKING_START\"}",
        "{\"type\":\"run_finished\"}",
        "{\"type\":\"SOMETHING_NEW\",\"a\":1}",
        "{\"type\":\"STATE_SNAPSHOT\",\"snapshot\":{\"big\":123456789012345678901234567890,\"n\":1}"
        "}",
        NULL,
    };
    struct result r = run_frames(frames, END_NONE);
    char *expect = framed(frames);

    /* (the null of STATE_SNAPSHOT too: the protocol gives it a meaning, the client takes it) */
    cr_assert_str_eq(r.text, expect);
    cr_assert_eq(r.last_rc, 0);
    free(expect);
    result_free(&r);
}

/* ---- chunk streams ----------------------------------------------------------------------------
 */

/* Asserts that the run's events, their "timestamp"s aside, are the JSON array <want>. */
static void assert_events(const struct result *r, const char *want)
{
    json_error_t err;
    json_t *w = json_loads(want, 0, &err);
    json_t *got = json_deep_copy(r->events);
    size_t i;
    json_t *ev;

    cr_assert_not_null(w, "bad expectation: %s", err.text);
    json_array_foreach(got, i, ev)
    {
        json_object_del(ev, "timestamp");
    }
    char *g = json_dumps(got, JSON_COMPACT | JSON_PRESERVE_ORDER);
    cr_assert(json_equal(got, w), "got:\n%s\nwanted:\n%s", g, want);
    free(g);
    json_decref(got);
    json_decref(w);
}

Test(agui, chunks_become_the_events_the_client_makes_of_them)
{
    struct result r = RUN(
        END_NONE, "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
        "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m1\",\"delta\":\"Hel\",\"metadata\":{"
        "\"a\":1}}",
        "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"delta\":\"lo\",\"role\":\"assistant\"}",
        "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m1\",\"delta\":\"!\",\"rawEvent\":{\"r\":"
        "2}}",
        "{\"type\":\"TOOL_CALL_CHUNK\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
        "\"parentMessageId\":\"m1\",\"delta\":\"{\"}",
        "{\"type\":\"TOOL_CALL_CHUNK\",\"delta\":\"}\",\"toolCallName\":\"f\"}",
        "{\"type\":\"TOOL_CALL_CHUNK\",\"metadata\":{\"b\":2}}",
        "{\"type\":\"REASONING_MESSAGE_CHUNK\",\"messageId\":\"x\"}",
        "{\"type\":\"REASONING_MESSAGE_CHUNK\",\"delta\":\"hmm\",\"timestamp\":5}",
        "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m2\",\"role\":\"user\",\"name\":\"n\"}",
        "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m3\",\"delta\":\"\"}",
        "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}");

    assert_events(
        &r,
        "[{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"},"
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m1\",\"role\":\"assistant\","
        "\"metadata\":{\"a\":1}},"
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"Hel\",\"metadata\":{"
        "\"a\":1}},"
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"lo\"},"
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"!\",\"rawEvent\":{"
        "\"r\":2}},"
        "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m1\"},"
        "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
        "\"parentMessageId\":\"m1\"},"
        "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"{\"},"
        "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"}\"},"
        "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"\",\"metadata\":{\"b\":2}},"
        "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c1\"},"
        "{\"type\":\"REASONING_MESSAGE_START\",\"messageId\":\"x\",\"role\":\"reasoning\"},"
        "{\"type\":\"REASONING_MESSAGE_CONTENT\",\"messageId\":\"x\",\"delta\":\"hmm\"},"
        "{\"type\":\"REASONING_MESSAGE_END\",\"messageId\":\"x\"},"
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m2\",\"role\":\"user\",\"name\":\"n\"},"
        "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m2\"},"
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m3\",\"role\":\"assistant\"},"
        "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m3\"},"
        "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}]");
    /* A chunk's time is its events' (the reasoning delta's: 5); the ends are the gateway's. */
    cr_assert_eq(json_integer_value(json_object_get(ev_at(&r, 12), "timestamp")), 5);
    assert_int_timestamp(&r, 13);
    assert_verified(&r);
    result_free(&r);
}

Test(agui, chunks_go_to_their_lanes)
{
    /* The agent's own text and a sub-agent's, interleaved; a chunk naming neither goes to the
     * agent's own lane while it has a text open, else to the only lane that has one. */
    struct result r =
        RUN(END_EOF, "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"s\",\"name\":\"helper\"}",
            "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m1\",\"delta\":\"a\"}",
            "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m2\",\"subagentRunId\":\"s\","
            "\"delta\":\"b\"}",
            "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"delta\":\"c\"}",
            "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"subagentRunId\":\"s\",\"delta\":\"d\"}",
            "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m2\",\"delta\":\"e\"}",
            "{\"type\":\"TOOL_CALL_CHUNK\",\"toolCallId\":\"c\",\"toolCallName\":\"f\",\"delta\":"
            "\"{}\"}",
            "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"delta\":\"g\"}", "{\"type\":\"RAW\",\"event\":1}",
            "{\"type\":\"CUSTOM\",\"name\":\"n\",\"value\":1,\"subagentRunId\":\"s\"}",
            "{\"type\":\"SUBAGENT_FINISHED\",\"subagentRunId\":\"s\"}",
            "{\"type\":\"STATE_DELTA\",\"delta\":[]}",
            "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m4\",\"delta\":\"h\"}",
            "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m5\",\"subagentRunId\":\"t\","
            "\"delta\":\"i\"}",
            "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[]}");

    assert_events(&r,
                  "[{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"},"
                  "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"s\",\"name\":\"helper\"},"
                  "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m1\",\"role\":\"assistant\"},"
                  "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"a\"},"
                  "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m2\",\"role\":\"assistant\","
                  "\"subagentRunId\":\"s\"},"
                  "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m2\",\"delta\":\"b\","
                  "\"subagentRunId\":\"s\"},"
                  "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"c\"},"
                  "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m2\",\"delta\":\"d\","
                  "\"subagentRunId\":\"s\"},"
                  "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m2\",\"delta\":\"e\","
                  "\"subagentRunId\":\"s\"},"
                  /* the tool call takes the agent's own lane: its text ends */
                  "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m1\"},"
                  "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c\",\"toolCallName\":\"f\"},"
                  "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c\",\"delta\":\"{}\"},"
                  /* the only lane with a text open is the sub-agent's */
                  "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m2\",\"delta\":\"g\","
                  "\"subagentRunId\":\"s\"},"
                  "{\"type\":\"RAW\",\"event\":1},"
                  "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m2\",\"subagentRunId\":\"s\"},"
                  "{\"type\":\"CUSTOM\",\"name\":\"n\",\"value\":1,\"subagentRunId\":\"s\"},"
                  "{\"type\":\"SUBAGENT_FINISHED\",\"subagentRunId\":\"s\"},"
                  "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c\"},"
                  "{\"type\":\"STATE_DELTA\",\"delta\":[]},"
                  "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m4\",\"role\":\"assistant\"},"
                  "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m4\",\"delta\":\"h\"},"
                  "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m5\",\"role\":\"assistant\","
                  "\"subagentRunId\":\"t\"},"
                  "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m5\",\"delta\":\"i\","
                  "\"subagentRunId\":\"t\"},"
                  /* a snapshot ends every lane's stream, oldest first */
                  "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m4\"},"
                  "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m5\",\"subagentRunId\":\"t\"},"
                  "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[]},"
                  "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}]");
    assert_verified(&r);
    result_free(&r);
}

Test(agui, a_sub_agent_runs_start_ends_no_chunk_stream)
{
    /* SUBAGENT_STARTED is among the events the client's chunk transformation lets through without
     * ending a stream (its end ends its own lane's); so is a type the protocol does not have, which
     * the client drops before */
    struct result r =
        RUN(END_NONE,
            "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m\",\"subagentRunId\":\"s\","
            "\"delta\":\"a\"}",
            "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"s\",\"name\":\"n\"}",
            "{\"type\":\"SUBAGENT_LATER\",\"subagentRunId\":\"s\"}",
            "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"subagentRunId\":\"s\",\"delta\":\"b\"}",
            "{\"type\":\"SUBAGENT_FINISHED\",\"subagentRunId\":\"s\"}",
            "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}");

    assert_events(&r, "[{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"},"
                      "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"assistant\","
                      "\"subagentRunId\":\"s\"},"
                      "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"a\","
                      "\"subagentRunId\":\"s\"},"
                      "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"s\",\"name\":\"n\"},"
                      "{\"type\":\"SUBAGENT_LATER\",\"subagentRunId\":\"s\"},"
                      "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"b\","
                      "\"subagentRunId\":\"s\"},"
                      "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m\",\"subagentRunId\":\"s\"},"
                      "{\"type\":\"SUBAGENT_FINISHED\",\"subagentRunId\":\"s\"},"
                      "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}]");
    assert_verified(&r);
    result_free(&r);
}

Test(agui, chunks_the_client_would_fail_on_are_invalid)
{
    static const struct {
        const char *frames[3];
        const char *needle;
    } cases[] = {
        {{"{\"type\":\"TEXT_MESSAGE_CHUNK\",\"delta\":\"x\"}"},
         "TEXT_MESSAGE_CHUNK without a \"messageId\", and no text message open in its lane"},
        {{"{\"type\":\"REASONING_MESSAGE_CHUNK\",\"delta\":\"x\"}"},
         "REASONING_MESSAGE_CHUNK without a \"messageId\""},
        {{"{\"type\":\"TOOL_CALL_CHUNK\",\"toolCallId\":\"c\",\"delta\":\"{}\"}"},
         "TOOL_CALL_CHUNK opening tool call \"c\" without a \"toolCallName\""},
        {{"{\"type\":\"TOOL_CALL_CHUNK\",\"toolCallName\":\"f\"}"},
         "TOOL_CALL_CHUNK without a \"toolCallId\""},
        {{"{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m\",\"delta\":\"x\"}",
          "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"role\":\"user\",\"delta\":\"y\"}"},
         "TEXT_MESSAGE_CHUNK for text message \"m\" with \"role\" \"user\": its first chunk had "
         "\"assistant\""},
        {{"{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m\",\"delta\":\"x\"}",
          "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m\",\"name\":\"n\"}"},
         "with \"name\" \"n\": its first chunk had none"},
        {{"{\"type\":\"TOOL_CALL_CHUNK\",\"toolCallId\":\"c\",\"toolCallName\":\"f\"}",
          "{\"type\":\"TOOL_CALL_CHUNK\",\"toolCallName\":\"g\"}"},
         "TOOL_CALL_CHUNK for tool call \"c\" with \"toolCallName\" \"g\": its first chunk had "
         "\"f\""},
        {{"{\"type\":\"TOOL_CALL_CHUNK\",\"toolCallId\":\"c\",\"toolCallName\":\"f\"}",
          "{\"type\":\"TOOL_CALL_CHUNK\",\"parentMessageId\":\"p\"}"},
         "with \"parentMessageId\" \"p\": its first chunk had none"},
        {{"{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m\",\"delta\":\"x\"}",
          "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m\",\"subagentRunId\":\"s\"}"},
         "TEXT_MESSAGE_CHUNK for text message \"m\" with \"subagentRunId\" \"s\": its stream is "
         "the "
         "agent's own"},
        {{"{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m\",\"subagentRunId\":\"s\"}",
          "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m\",\"subagentRunId\":\"t\"}"},
         "its stream is sub-agent run \"s\"'s"},
        {{"{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m\",\"subagentRunId\":\"s\"}",
          "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"n\",\"subagentRunId\":\"t\"}",
          "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"delta\":\"x\"}"},
         "TEXT_MESSAGE_CHUNK without a \"messageId\" or a \"subagentRunId\", while 2 sub-agent "
         "runs have a text message open"},
        {{"{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m\",\"role\":\"tool\"}"},
         "TEXT_MESSAGE_CHUNK \"role\" must be one of"},
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        const char *frames[5] = {"{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}"};
        for (size_t k = 0; k < 3 && cases[i].frames[k] != NULL; k++)
            frames[k + 1] = cases[i].frames[k];
        struct result r = run_frames(frames, END_NONE);
        size_t n = json_array_size(r.events);

        cr_assert_gt(n, 1, "case %zu: %s", i, r.text);
        assert_run_error(&r, n - 1, "INVALID_EVENT", cases[i].needle);
        assert_verified(&r);
        result_free(&r);
    }
}

Test(agui, a_chunk_stream_open_at_eof_was_cut)
{
    struct result r =
        RUN(END_EOF, "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m\",\"delta\":\"x\"}");

    assert_closed_then_error(&r, 3, "m", "UPSTREAM_ERROR",
                             "upstream closed the stream in the middle of a message");
    assert_verified(&r);
    result_free(&r);
}

Test(agui, chunks_and_explicit_events_of_one_item)
{
    /* A chunk for a message opened explicitly continues it (its start is not written twice); the
     * explicit end then ends the chunk stream first, and is itself an end of nothing open. A
     * content event the fast path had cached is not relayed for the item after it ended. */
    struct result r =
        RUN(END_NONE, "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
            "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"assistant\"}",
            "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"a\"}",
            "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m\",\"delta\":\"b\"}",
            "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m\"}",
            "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"c\"}");

    cr_assert_eq(json_array_size(r.events), 6, "%s", r.text);
    assert_type(&r, 3, "TEXT_MESSAGE_CONTENT");
    cr_assert_str_eq(str_at(&r, 3, "delta"), "b");
    assert_type(&r, 4, "TEXT_MESSAGE_END");
    assert_run_error(&r, 5, "INVALID_EVENT",
                     "TEXT_MESSAGE_CONTENT for messageId \"m\", which is not open");
    assert_verified(&r);
    result_free(&r);
}

Test(agui, chunk_streams_are_bounded)
{
    struct agw_agui *a = agw_agui_new(TID, RID, AGW_PROTO_AGUI);
    struct evbuffer *out = evbuffer_new();
    char frame[128];
    int rc = 0;
    size_t i;

    for (i = 0; i < 2000 && rc == 0; i++) {
        int n = snprintf(frame, sizeof(frame),
                         "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m%zu\","
                         "\"subagentRunId\":\"s%zu\",\"delta\":\"x\"}",
                         i, i);
        rc = agw_agui_feed(a, frame, (size_t)n, SINK(out));
    }
    cr_assert_eq(rc, 1);
    cr_assert_leq(i, 1025);
    char *text = drain(out);
    json_t *events = parse_stream(text);
    cr_assert_null(verify_stream(events), "%s", verify_stream(events));
    cr_assert(strstr(text, "INVALID_EVENT") != NULL);
    json_decref(events);
    free(text);
    evbuffer_free(out);
    agw_agui_free(a);
}

/* ---- sub-agent runs ------------------------------------------------------------------------- */

Test(agui, sub_agent_runs_start_and_end_once)
{
    struct result r =
        RUN(END_NONE, "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
            "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"s\",\"name\":\"a\"}",
            "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"s\",\"name\":\"a\"}",
            "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"t\",\"name\":\"b\","
            "\"parentSubagentRunId\":\"s\"}",
            "{\"type\":\"SUBAGENT_FINISHED\",\"subagentRunId\":\"s\"}",
            "{\"type\":\"SUBAGENT_FINISHED\",\"subagentRunId\":\"s\"}",
            "{\"type\":\"SUBAGENT_ERROR\",\"subagentRunId\":\"nope\",\"message\":\"m\"}",
            "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"s\",\"name\":\"again\"}",
            "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"u\",\"name\":\"c\","
            "\"parentSubagentRunId\":\"s\"}",
            "{\"type\":\"SUBAGENT_ERROR\",\"subagentRunId\":\"u\",\"message\":\"boom\"}",
            "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}");

    /* a second start, an end of one ended or never started, a reuse of an ended one: dropped;
     * a parent that ended is still one; t, active at the end, is finished by the gateway */
    assert_events(&r, "[{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"},"
                      "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"s\",\"name\":\"a\"},"
                      "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"t\",\"name\":\"b\","
                      "\"parentSubagentRunId\":\"s\"},"
                      "{\"type\":\"SUBAGENT_FINISHED\",\"subagentRunId\":\"s\"},"
                      "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"u\",\"name\":\"c\","
                      "\"parentSubagentRunId\":\"s\"},"
                      "{\"type\":\"SUBAGENT_ERROR\",\"subagentRunId\":\"u\",\"message\":\"boom\"},"
                      "{\"type\":\"SUBAGENT_FINISHED\",\"subagentRunId\":\"t\"},"
                      "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}]");
    assert_int_timestamp(&r, 6);
    assert_verified(&r);
    result_free(&r);
}

Test(agui, a_failed_run_ends_its_sub_agent_runs_with_an_error)
{
    struct result r =
        RUN(END_NONE, "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"s\",\"name\":\"a\"}",
            "{\"type\":\"RUN_ERROR\",\"message\":\"m\"}");

    assert_type(&r, 2, "SUBAGENT_ERROR");
    cr_assert_str_eq(str_at(&r, 2, "subagentRunId"), "s");
    cr_assert_str_eq(str_at(&r, 2, "message"), "the run ended before the sub-agent run did");
    assert_type(&r, 3, "RUN_ERROR");
    assert_verified(&r);
    result_free(&r);

    /* a backend that ends without a terminal event finishes them */
    r = RUN(END_EOF, "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"s\",\"name\":\"a\"}");
    assert_type(&r, 2, "SUBAGENT_FINISHED");
    assert_type(&r, 3, "RUN_FINISHED");
    assert_verified(&r);
    result_free(&r);
}

Test(agui, a_sub_agent_run_needs_its_parent_started)
{
    struct result r =
        RUN(END_NONE, "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"t\",\"name\":\"b\","
                      "\"parentSubagentRunId\":\"p\"}");

    assert_run_error(&r, 1, "INVALID_EVENT",
                     "SUBAGENT_STARTED \"t\": its parentSubagentRunId \"p\" was not started in "
                     "this run");
    assert_verified(&r);
    result_free(&r);
}

Test(agui, steps_are_kept_apart_per_sub_agent_run)
{
    struct result r = RUN(END_EOF, "{\"type\":\"STEP_STARTED\",\"stepName\":\"x\"}",
                          "{\"type\":\"STEP_STARTED\",\"stepName\":\"x\",\"subagentRunId\":\"s\"}",
                          "{\"type\":\"STEP_STARTED\",\"stepName\":\"x\",\"subagentRunId\":\"s\"}",
                          "{\"type\":\"STEP_FINISHED\",\"stepName\":\"x\",\"subagentRunId\":\"s\"}",
                          "{\"type\":\"STEP_FINISHED\",\"stepName\":\"x\",\"subagentRunId\":\"s\"}",
                          "{\"type\":\"STEP_STARTED\",\"stepName\":\"y\",\"subagentRunId\":\"s\"}",
                          "{\"type\":\"STEP_FINISHED\",\"stepName\":\"y\"}");

    /* the parent's "x" and the sub-agent's are two steps; "y" is the sub-agent's: the parent's
     * end of a "y" ends nothing, and the gateway ends it, with its sub-agent run's id */
    assert_events(&r, "[{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"},"
                      "{\"type\":\"STEP_STARTED\",\"stepName\":\"x\"},"
                      "{\"type\":\"STEP_STARTED\",\"stepName\":\"x\",\"subagentRunId\":\"s\"},"
                      "{\"type\":\"STEP_FINISHED\",\"stepName\":\"x\",\"subagentRunId\":\"s\"},"
                      "{\"type\":\"STEP_STARTED\",\"stepName\":\"y\",\"subagentRunId\":\"s\"},"
                      "{\"type\":\"STEP_FINISHED\",\"stepName\":\"y\",\"subagentRunId\":\"s\"},"
                      "{\"type\":\"STEP_FINISHED\",\"stepName\":\"x\"},"
                      "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}]");
    assert_verified(&r);
    result_free(&r);
}

Test(agui, huge_integers_survive_a_rewrite)
{
    /* Parsed with integers as reals: an integral timestamp is no change; a rewrite keeps the value.
     */
    struct result r =
        RUN(END_NONE,
            "{\"type\":\"STATE_SNAPSHOT\",\"timestamp\":1700000000000,"
            "\"snapshot\":{\"big\":123456789012345678901234567890}}",
            "{\"type\":\"CUSTOM\",\"x\":null,\"timestamp\":5,\"v\":99999999999999999999,"
            "\"name\":\"n\",\"value\":1}");
    cr_assert_not_null(strstr(r.text,
                              "data: {\"type\":\"STATE_SNAPSHOT\",\"timestamp\":1700000000000,"
                              "\"snapshot\":{\"big\":123456789012345678901234567890}}\n\n"));
    /* Re-serialised (x was null): the timestamp is still written as an integer. */
    json_t *c = ev_at(&r, 2);
    cr_assert_not_null(strstr(r.text, "data: {\"type\":\"CUSTOM\",\"timestamp\":5,\"v\":"), "%s",
                       r.text);
    cr_assert_null(json_object_get(c, "x"));
    cr_assert_not_null(json_object_get(c, "v"));
    result_free(&r);
}

/* ---- rule 10: end of the upstream stream ----------------------------------------------------- */

Test(agui, eof_before_anything)
{
    struct result r = RUN(END_EOF, "[DONE]");
    cr_assert_eq(r.n_out, 2);
    assert_type(&r, 0, "RUN_STARTED");
    assert_type(&r, 1, "RUN_FINISHED");
    assert_type_first(&r, 1);
    assert_client_ids(&r, 1);
    assert_int_timestamp(&r, 1);
    cr_assert_eq(json_object_size(ev_at(&r, 1)), 4);
    cr_assert_str_eq(r.outcome, "RUN_FINISHED");
    assert_verified(&r);
    result_free(&r);
}

Test(agui, eof_clean_closes_steps_and_finishes)
{
    struct result r =
        RUN(END_EOF, "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
            "{\"type\":\"STEP_STARTED\",\"stepName\":\"a\"}",
            "{\"type\":\"REASONING_START\",\"messageId\":\"x\"}",
            "{\"type\":\"STEP_STARTED\",\"stepName\":\"b\"}");
    cr_assert_eq(r.n_out, 8, "%s", r.text);
    assert_type(&r, 4, "STEP_FINISHED");
    cr_assert_str_eq(str_at(&r, 4, "stepName"), "b");
    assert_type(&r, 5, "REASONING_END");
    assert_type(&r, 6, "STEP_FINISHED");
    cr_assert_str_eq(str_at(&r, 6, "stepName"), "a");
    assert_type(&r, 7, "RUN_FINISHED");
    assert_client_ids(&r, 7);
    cr_assert_str_eq(r.outcome, "RUN_FINISHED");
    assert_verified(&r);
    result_free(&r);
}

Test(agui, eof_mid_message_is_upstream_error)
{
    static const char *const opens[] = {
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"assistant\"}",
        "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c\",\"toolCallName\":\"f\"}",
        "{\"type\":\"REASONING_MESSAGE_START\",\"messageId\":\"x\",\"role\":\"reasoning\"}",
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(opens); i++) {
        struct result r = RUN(END_EOF, "{\"type\":\"STEP_STARTED\",\"stepName\":\"s\"}", opens[i]);
        /* The cut item, then the step, are closed before the RUN_ERROR. */
        cr_assert_eq(r.n_out, 6, "case %zu: %s", i, r.text);
        assert_type(&r, 4, "STEP_FINISHED");
        assert_run_error(&r, 5, "UPSTREAM_ERROR",
                         "upstream closed the stream in the middle of a message");
        cr_assert_str_eq(r.outcome, "RUN_ERROR:UPSTREAM_ERROR");
        assert_verified(&r);
        result_free(&r);
    }
}

Test(agui, end_after_finish_is_noop)
{
    struct agw_agui *a = agw_agui_new(TID, RID, AGW_PROTO_AGUI);
    struct evbuffer *out = evbuffer_new();
    const char *fin = "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}";

    cr_assert_null(agw_agui_outcome(a));
    cr_assert_eq(agw_agui_finished(a), false);
    cr_assert_eq(agw_agui_feed(a, fin, strlen(fin), SINK(out)), 1);
    size_t len = evbuffer_get_length(out);
    agw_agui_end(a, SINK(out));
    agw_agui_fail(a, AGW_AGUI_TIMEOUT, "late", SINK(out));
    agw_agui_end(a, SINK(out));
    cr_assert_eq(evbuffer_get_length(out), len);
    cr_assert_eq(agw_agui_events_out(a), 2);
    cr_assert_str_eq(agw_agui_outcome(a), "RUN_FINISHED");
    cr_assert_eq(agw_agui_feed(a, fin, strlen(fin), SINK(out)), 1);
    evbuffer_free(out);
    agw_agui_free(a);
}

/* ---- rule 11: agw_agui_fail() ---------------------------------------------------------------- */

static struct result fail_after(const char *const *frames, const char *code, const char *msg)
{
    struct result r;
    struct agw_agui *a = agw_agui_new(TID, RID, AGW_PROTO_AGUI);
    struct evbuffer *out = evbuffer_new();

    memset(&r, 0, sizeof(r));
    for (size_t i = 0; frames[i] != NULL; i++)
        agw_agui_feed(a, frames[i], strlen(frames[i]), SINK(out));
    agw_agui_fail(a, code, msg, SINK(out));
    r.n_out = agw_agui_events_out(a);
    r.finished = agw_agui_finished(a);
    snprintf(r.outcome, sizeof(r.outcome), "%s", agw_agui_outcome(a) ? agw_agui_outcome(a) : "");
    r.text = drain(out);
    r.events = parse_stream(r.text);
    evbuffer_free(out);
    agw_agui_free(a);
    return r;
}

Test(agui, fail_before_start)
{
    struct result r =
        fail_after((const char *const[]){NULL}, AGW_AGUI_TIMEOUT, "upstream idle for 300 s");
    cr_assert_eq(r.n_out, 2);
    assert_type(&r, 0, "RUN_STARTED");
    assert_client_ids(&r, 0);
    assert_run_error(&r, 1, "TIMEOUT", "upstream idle for 300 s");
    assert_int_timestamp(&r, 1);
    cr_assert_eq(json_object_size(ev_at(&r, 1)), 4);
    cr_assert(r.finished);
    cr_assert_str_eq(r.outcome, "RUN_ERROR:TIMEOUT");
    assert_verified(&r);
    result_free(&r);
}

Test(agui, fail_after_start)
{
    struct result r = fail_after(
        (const char *const[]){
            "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
            "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"assistant\"}", NULL},
        AGW_AGUI_FRAME_TOO_LARGE, "frame over 1048576 bytes");
    cr_assert_eq(r.n_out, 4);
    assert_type(&r, 2, "TEXT_MESSAGE_END");
    assert_run_error(&r, 3, "FRAME_TOO_LARGE", "1048576");
    assert_verified(&r);
    result_free(&r);

    /* Messages that are not UTF-8 are replaced, never dropped; a NULL message too. */
    r = fail_after((const char *const[]){NULL}, AGW_AGUI_UPSTREAM_ERROR, "bad \xff");
    assert_run_error(&r, 1, "UPSTREAM_ERROR", "gateway");
    result_free(&r);
    r = fail_after((const char *const[]){NULL}, AGW_AGUI_CANCELLED, NULL);
    assert_run_error(&r, 1, "CANCELLED", "gateway");
    result_free(&r);
}

Test(agui, code_strings)
{
    cr_assert_str_eq(AGW_AGUI_UPSTREAM_ERROR, "UPSTREAM_ERROR");
    cr_assert_str_eq(AGW_AGUI_TIMEOUT, "TIMEOUT");
    cr_assert_str_eq(AGW_AGUI_FRAME_TOO_LARGE, "FRAME_TOO_LARGE");
    cr_assert_str_eq(AGW_AGUI_INVALID_EVENT, "INVALID_EVENT");
    cr_assert_str_eq(AGW_AGUI_CANCELLED, "CANCELLED");
    cr_assert_str_eq(AGW_AGUI_SHUTDOWN, "SHUTDOWN");
}

/* ---- misc ------------------------------------------------------------------------------------ */

/* An "ag-kit" run: its legacy events are translated (agkit.c, tested in test_agkit.c) and the
 * result passes the verifier; AG-UI events from a legacy backend have no legacy meaning and are
 * dropped. */
Test(agui, agkit_runs_are_translated_then_normalised)
{
    struct result r =
        run_frames_p((const char *const[]){"{\"type\":\"text\",\"content\":\"Hi\"}",
                                           "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\"}",
                                           "{\"type\":\"text\",\"content\":\"!\"}", NULL},
                     END_EOF, AGW_PROTO_AGKIT);
    cr_assert_eq(r.n_out, 6);
    cr_assert_str_eq(str_at(&r, 1, "type"), "TEXT_MESSAGE_START");
    cr_assert_str_eq(str_at(&r, 1, "role"), "assistant");
    cr_assert_str_eq(str_at(&r, 3, "delta"), "!");
    cr_assert_str_eq(str_at(&r, 5, "type"), "RUN_FINISHED");
    assert_verified(&r);
    result_free(&r);
}

Test(agui, free_null)
{
    agw_agui_free(NULL);
}

Test(agui, not_nul_terminated_input)
{
    struct agw_agui *a = agw_agui_new(TID, RID, AGW_PROTO_AGUI);
    struct evbuffer *out = evbuffer_new();
    const char buf[] = "{\"type\":\"RAW\",\"event\":1}GARBAGE";

    cr_assert_eq(agw_agui_feed(a, buf, 24, SINK(out)), 0);
    cr_assert_eq(agw_agui_events_out(a), 2);
    char *text = drain(out);
    cr_assert_not_null(strstr(text, "data: {\"type\":\"RAW\",\"event\":1}\n\n"));
    free(text);
    evbuffer_free(out);
    agw_agui_free(a);
}

/* ---- the verifier model itself --------------------------------------------------------------- */

static const char *verify_text(const char *json_array_text)
{
    static char why[512];
    json_t *events = json_loads(json_array_text, 0, NULL);
    cr_assert_not_null(events);
    const char *w = verify_stream(events);
    snprintf(why, sizeof(why), "%s", w ? w : "");
    json_decref(events);
    return w ? why : NULL;
}

Test(agui, verifier_model_rejects_bad_streams)
{
    cr_assert_null(
        verify_text("[{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"},"
                    "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}]"));
    static const char *const bad[] = {
        "[]",
        "[{\"type\":\"CUSTOM\"}]",
        "[{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}]",
        "[{\"type\":\"RUN_STARTED\",\"threadId\":\"x\",\"runId\":\"r1\"},{\"type\":\"RUN_ERROR\","
        "\"message\":\"m\"}]",
        "[{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"},{\"type\":\"RUN_"
        "STARTED\",\"threadId\":\"t1\","
        "\"runId\":\"r1\"},{\"type\":\"RUN_ERROR\",\"message\":\"m\"}]",
        "[{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"},{\"type\":\"RUN_ERROR\","
        "\"message\":\"m\"},"
        "{\"type\":\"CUSTOM\"}]",
        "[{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"},{\"type\":\"TEXT_MESSAGE_"
        "START\","
        "\"messageId\":\"m\",\"role\":\"assistant\"},{\"type\":\"RUN_FINISHED\",\"threadId\":"
        "\"t1\",\"runId\":\"r1\"}]",
        "[{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"},{\"type\":\"TEXT_MESSAGE_"
        "END\","
        "\"messageId\":\"m\"},{\"type\":\"RUN_ERROR\",\"message\":\"m\"}]",
        "[{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\",\"x\":null},{\"type\":"
        "\"RUN_ERROR\","
        "\"message\":\"m\"}]",
        "[{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\",\"timestamp\":1.5},{"
        "\"type\":\"RUN_ERROR\","
        "\"message\":\"m\"}]",
        "[{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"},{\"type\":\"RUN_ERROR\","
        "\"error\":{}}]",
        "[{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"},{\"type\":\"STEP_"
        "STARTED\",\"stepName\":"
        "\"s\"},{\"type\":\"STEP_STARTED\",\"stepName\":\"s\"},{\"type\":\"RUN_ERROR\",\"message\":"
        "\"m\"}]",
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(bad); i++)
        cr_assert_not_null(verify_text(bad[i]), "bad stream %zu accepted", i);
}

/* ---- hostile upstreams ----------------------------------------------------------------------- */

static const char *const hostile_common[] = {
    "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
    "{\"type\":\"RUN_STARTED\",\"threadId\":\"evil\",\"runId\":\"evil\",\"parentRunId\":null}",
    "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m1\",\"role\":\"assistant\"}",
    "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m2\"}",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"hi\"}",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"\"}",
    "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m1\"}",
    "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m2\"}",
    "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\"}",
    "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c2\",\"toolCallName\":\"f\",\"args\":{\"a\":1}"
    "}",
    "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\",\"args\":\"{}\"}",
    "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"{\"}",
    "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c1\"}",
    "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c2\"}",
    "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"t\",\"toolCallId\":\"c1\",\"content\":\"r\","
    "\"role\":null}",
    "{\"type\":\"STEP_STARTED\",\"stepName\":\"s1\"}",
    "{\"type\":\"STEP_STARTED\",\"stepName\":\"s2\",\"timestamp\":1.25}",
    "{\"type\":\"STEP_FINISHED\",\"stepName\":\"s1\"}",
    "{\"type\":\"STEP_FINISHED\",\"stepName\":\"s2\"}",
    "{\"type\":\"REASONING_START\",\"messageId\":\"x\"}",
    "{\"type\":\"REASONING_END\",\"messageId\":\"x\"}",
    "{\"type\":\"REASONING_MESSAGE_START\",\"messageId\":\"x\",\"role\":\"reasoning\"}",
    "{\"type\":\"REASONING_MESSAGE_CONTENT\",\"messageId\":\"x\",\"delta\":\"...\"}",
    "{\"type\":\"REASONING_MESSAGE_CONTENT\",\"messageId\":\"x\",\"delta\":\"\"}",
    "{\"type\":\"REASONING_MESSAGE_END\",\"messageId\":\"x\"}",
    "{\"type\":\"STATE_SNAPSHOT\",\"snapshot\":{\"a\":null},\"timestamp\":\"now\"}",
    "{\"type\":\"CUSTOM\",\"name\":\"c\",\"value\":null}",
    "{\n\"type\":\"RAW\",\n\"event\":{}\n}",
    "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"k\",\"delta\":\"d\"}",
    "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"delta\":\"e\"}",
    "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m\",\"subagentRunId\":\"s\",\"delta\":\"f\"}",
    "{\"type\":\"TOOL_CALL_CHUNK\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\",\"delta\":\"{\"}",
    "{\"type\":\"TOOL_CALL_CHUNK\",\"delta\":\"}\"}",
    "{\"type\":\"REASONING_MESSAGE_CHUNK\",\"messageId\":\"x\",\"delta\":\"r\"}",
    "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"s\",\"name\":\"n\"}",
    "{\"type\":\"SUBAGENT_STARTED\",\"subagentRunId\":\"s2\",\"name\":\"n\","
    "\"parentSubagentRunId\":\"s\"}",
    "{\"type\":\"SUBAGENT_FINISHED\",\"subagentRunId\":\"s\"}",
    "{\"type\":\"SUBAGENT_ERROR\",\"subagentRunId\":\"s2\",\"message\":\"m\"}",
    "{\"type\":\"STEP_STARTED\",\"stepName\":\"s1\",\"subagentRunId\":\"s\"}",
    "{\"type\":\"STEP_FINISHED\",\"stepName\":\"s1\",\"subagentRunId\":\"s\"}",
    /* ids used by sub-agent runs, the agent or one another (who opened an id) */
    "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m1\",\"role\":\"assistant\","
    "\"subagentRunId\":\"s\"}",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"o\",\"subagentRunId\":"
    "\"s2\"}",
    "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m1\",\"subagentRunId\":\"s\"}",
    "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
    "\"parentMessageId\":\"m1\",\"subagentRunId\":\"s2\"}",
    "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c2\",\"toolCallName\":\"f\","
    "\"parentMessageId\":\"m1\"}",
    "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"1\",\"subagentRunId\":\"s\"}",
    "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"m1\",\"toolCallId\":\"c1\",\"content\":"
    "\"r\",\"subagentRunId\":\"s\"}",
    "{\"type\":\"REASONING_MESSAGE_CONTENT\",\"messageId\":\"x\",\"delta\":\"t\","
    "\"subagentRunId\":\"s\"}",
    "{\"type\":\"ACTIVITY_SNAPSHOT\",\"messageId\":\"v1\",\"activityType\":\"p\",\"content\":"
    "{},\"subagentRunId\":\"s\"}",
    "{\"type\":\"ACTIVITY_DELTA\",\"messageId\":\"v1\",\"activityType\":\"p\",\"patch\":[],"
    "\"subagentRunId\":\"s2\"}",
    "{\"type\":\"REASONING_ENCRYPTED_VALUE\",\"subtype\":\"tool-call\",\"entityId\":\"c1\","
    "\"encryptedValue\":\"e\",\"subagentRunId\":\"s2\"}",
    "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[{\"id\":\"m1\",\"role\":\"assistant\","
    "\"subagentRunId\":\"s2\"}]}",
    "[DONE]",
};

static const char *const hostile_rare[] = {
    "{\"type\":\"RUN_FINISHED\",\"threadId\":\"evil\",\"runId\":null,\"result\":1}",
    "{\"type\":\"RUN_FINISHED\"}",
    "{\"type\":\"RUN_ERROR\",\"error\":{\"code\":1,\"message\":\"boom\"}}",
    "{\"type\":\"RUN_ERROR\",\"message\":\"m\",\"code\":\"C\"}",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"ghost\",\"delta\":\"x\"}",
    "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c2\",\"delta\":7}",
    "{\"type\":\"TEXT_MESSAGE_END\"}",
    "not json at all",
    "{\"type\":\"CUSTOM\"}{\"type\":\"CUSTOM\"}",
    "{\"type\":\"\"}",
    "[1,2]",
    "",
};

static uint64_t rng_state;

static uint32_t rng(void)
{
    /* xorshift64*: deterministic, so a failure is reproducible from the printed iteration. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ULL) >> 32);
}

static void end_hostile(struct agw_agui *a, struct evbuffer *out, int how)
{
    switch (how) {
    case 0:
        agw_agui_end(a, SINK(out));
        break;
    case 1:
        agw_agui_fail(a, AGW_AGUI_CANCELLED, "client went away", SINK(out));
        agw_agui_end(a, SINK(out));
        break;
    default:
        agw_agui_end(a, SINK(out));
        agw_agui_fail(a, AGW_AGUI_SHUTDOWN, "shutting down", SINK(out));
        break;
    }
}

Test(agui, hostile_streams_always_verify)
{
    const char *frames[48];
    size_t finished = 0, errors = 0;

    rng_state = 0x9E3779B97F4A7C15ULL;
    for (int iter = 0; iter < 5000; iter++) {
        size_t n = 1 + rng() % 40;
        /* Every other stream leaves out content events (fatal for an id that is not open), so that
         * runs also reach RUN_FINISHED and EOF with items open. */
        bool no_content = rng() % 2 == 0;
        for (size_t i = 0; i < n; i++) {
            if (rng() % 100 < 4)
                frames[i] = hostile_rare[rng() % AGW_ARRAY_LEN(hostile_rare)];
            else
                frames[i] = hostile_common[rng() % AGW_ARRAY_LEN(hostile_common)];
            if (no_content && (strstr(frames[i], "_CONTENT\"") || strstr(frames[i], "_ARGS\"")))
                i--;
        }
        frames[n] = NULL;

        struct agw_agui *a = agw_agui_new(TID, RID, AGW_PROTO_AGUI);
        struct evbuffer *out = evbuffer_new();
        int rc = 0;
        for (size_t i = 0; i < n; i++) {
            int prev = rc;
            rc = agw_agui_feed(a, frames[i], strlen(frames[i]), SINK(out));
            cr_assert(prev == 0 || rc == 1, "iteration %d: feed returned 0 after the end", iter);
            cr_assert_eq(rc == 1, agw_agui_finished(a));
        }
        int ending = (int)(rng() % 3);
        end_hostile(a, out, ending);
        cr_assert(agw_agui_finished(a));
        const char *outcome = agw_agui_outcome(a);
        cr_assert_not_null(outcome);
        if (strcmp(outcome, "RUN_FINISHED") == 0)
            finished++;
        else
            errors++;

        char *text = drain(out);
        json_t *events = parse_stream(text);
        cr_assert_eq(json_array_size(events), agw_agui_events_out(a));
        if (iter % 5 == 0) { /* the same stream fed framed, ended the same way */
            struct agw_agui *b = agw_agui_new(TID, RID, AGW_PROTO_AGUI);
            struct evbuffer *bout = evbuffer_new();
            char *btext, *x, *y;

            feed_framed_block(b, frames, n, bout, NULL, 0);
            end_hostile(b, bout, ending);
            btext = drain(bout);
            x = without_clock(btext);
            y = without_clock(text);
            cr_assert_str_eq(x, y, "iteration %d: framed and plain feeding differ:\n%s\n----\n%s",
                             iter, btext, text);
            free(x);
            free(y);
            free(btext);
            evbuffer_free(bout);
            agw_agui_free(b);
        }
        const char *why = verify_stream(events);
        if (why != NULL) {
            fprintf(stderr, "iteration %d input:\n", iter);
            for (size_t i = 0; i < n; i++)
                fprintf(stderr, "  %s\n", frames[i]);
        }
        cr_assert_null(why, "iteration %d: %s\noutput:\n%s", iter, why, text);
        json_t *last = json_array_get(events, json_array_size(events) - 1);
        const char *last_type = json_string_value(json_object_get(last, "type"));
        cr_assert_str_eq(last_type,
                         strncmp(outcome, "RUN_ERROR", 9) == 0 ? "RUN_ERROR" : "RUN_FINISHED");
        json_decref(events);
        free(text);
        evbuffer_free(out);
        agw_agui_free(a);
    }
    /* The generator exercises both endings (fewer clean ones since chunk streams are followed: one
     * open at the end was cut, like any message). */
    fprintf(stderr, "hostile: %zu RUN_FINISHED, %zu RUN_ERROR\n", finished, errors);
    cr_assert_gt(finished, 300);
    cr_assert_gt(errors, 500);
}

/* Frames aimed at the fast paths' edges: ids equal to the client's but escaped, starts without
 * what the full path would add, non-string and non-number members where a rule looks. */
static const char *const fast_edges[] = {
    "{\"type\":\"RUN_STARTED\",\"threadId\":\"t\\u0031\",\"runId\":\"r1\"}",
    "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\",\"timestamp\":12}",
    "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\"}",
    "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
    "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\",\"result\":1}",
    "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r2\"}",
    "{\"type\":\"RUN_FINISHED\",\"runId\":\"r1\",\"threadId\":\"t1\",\"timestamp\":true}",
    "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m3\",\"role\":7}",
    "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m3\",\"role\":\"assistant\",\"role\":"
    "\"user\"}",
    "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m1\",\"role\":\"assistant\",\"timestamp\":"
    "12}",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"x\",\"timestamp\":false}",
    /* members after the delta: the cached prefix of m1's content events, then a tail the fast path
     * reads (numbers, booleans, strings of other keys) or leaves to the whole scan (a key it reads,
     * a timestamp, a float, null, an object, spaces before the brace) */
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"a\",\"sentUs\":17}",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"b\",\"sentUs\":18,"
    "\"ok\":true,\"who\":\"x\"}",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"\" , \"n\" : -4 }",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"c\",\"delta\":\"d\"}",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"e\",\"messageId\":"
    "\"m2\"}",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"f\",\"timestamp\":5}",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"g\",\"t\":1.5}",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"h\",\"t\":null}",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"i\",\"t\":{}}",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"j\",\"role\":\"user\"}",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"k\",\"sentUs\":1 }",
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"l\",\"x\\u0031\":1}",
    "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"{\",\"seq\":1}",
    "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"}\",\"seq\":2}",
    "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m\\u0031\"}",
    "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m3\",\"n\":1}",
    "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c3\",\"toolCallName\":\"f\",\"args\":\"x\"}",
    "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c3\",\"toolCallName\":\"f\",\"ok\":true}",
    "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c3\"}",
    "{\"type\":\"STEP_STARTED\",\"stepName\":\"s3\",\"timestamp\":true}",
    "{\"type\":\"STEP_STARTED\",\"stepName\":7}",
    "{\"type\":\"STEP_FINISHED\",\"stepName\":\"s3\"}",
    "{\"type\":\"REASONING_MESSAGE_START\",\"messageId\":\"y\"}",
    "{\"type\":\"REASONING_MESSAGE_END\",\"messageId\":\"y\"}",
    "{\"type\":\"CUSTOM\",\"name\":\"x\",\"value\":1}",
    "{\"type\":\"CUSTOM\",\"name\":\"x\",\"value\":\"v\",\"timestamp\":-3}",
    "{\"type\":\"X_UNKNOWN\"}",
    "{\"type\":\"RUN_ERROR\",\"message\":\"m\"}",
};

/* Runs <frames> (<n>) through a fresh normaliser with the fast paths <on>, ended by <ending>. */
static char *run_with_fast(const char *const *frames, size_t n, bool on, int ending, int *rcs,
                           uint64_t *events, char *outcome, size_t outcome_size)
{
    struct agw_agui *a = agw_agui_new(TID, RID, AGW_PROTO_AGUI);
    struct evbuffer *out = evbuffer_new();
    char *text, *clean;

    agw_agui_set_fast_paths(a, on);
    for (size_t i = 0; i < n; i++)
        rcs[i] = agw_agui_feed(a, frames[i], strlen(frames[i]), SINK(out));
    end_hostile(a, out, ending);
    *events = agw_agui_events_out(a);
    snprintf(outcome, outcome_size, "%s", agw_agui_outcome(a));
    text = drain(out);
    clean = without_clock(text);
    free(text);
    evbuffer_free(out);
    agw_agui_free(a);
    return clean;
}

/* The fast paths must write exactly what the full path writes, return the same values, count the
 * same events and end the same way, on random streams made of every hostile frame and the edges. */
Test(agui, fast_paths_agree_with_the_full_path)
{
    const char *pool[AGW_ARRAY_LEN(hostile_common) + AGW_ARRAY_LEN(hostile_rare) +
                     AGW_ARRAY_LEN(fast_edges)];
    size_t np = 0;
    const char *frames[40];
    int rf[40], rs[40];
    unsigned fast_finished = 0;

    for (size_t i = 0; i < AGW_ARRAY_LEN(hostile_common); i++)
        pool[np++] = hostile_common[i];
    for (size_t i = 0; i < AGW_ARRAY_LEN(hostile_rare); i++)
        pool[np++] = hostile_rare[i];
    for (size_t i = 0; i < AGW_ARRAY_LEN(fast_edges); i++)
        pool[np++] = fast_edges[i];
    rng_state = 0xD1B54A32D192ED03ULL;
    for (int iter = 0; iter < 5000; iter++) {
        size_t n = 1 + rng() % AGW_ARRAY_LEN(frames);
        int ending = (int)(rng() % 3);
        uint64_t ef, es;
        char of[96], os[96];

        /* Half the streams open with the client's own RUN_STARTED, the fast path's way in. */
        for (size_t i = 0; i < n; i++)
            frames[i] = i == 0 && iter % 2 == 0 ? hostile_common[0] : pool[rng() % np];
        char *fast = run_with_fast(frames, n, true, ending, rf, &ef, of, sizeof(of));
        char *slow = run_with_fast(frames, n, false, ending, rs, &es, os, sizeof(os));
        if (strcmp(fast, slow) != 0) {
            fprintf(stderr, "iteration %d input:\n", iter);
            for (size_t i = 0; i < n; i++)
                fprintf(stderr, "  %s\n", frames[i]);
        }
        cr_assert_str_eq(fast, slow, "iteration %d: fast paths wrote\n%s\nthe full path\n%s", iter,
                         fast, slow);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(rf[i], rs[i], "iteration %d, frame %zu", iter, i);
        cr_assert_eq(ef, es, "iteration %d", iter);
        cr_assert_str_eq(of, os, "iteration %d", iter);
        fast_finished += strcmp(of, "RUN_FINISHED") == 0;
        free(fast);
        free(slow);
    }
    cr_assert_gt(fast_finished, 200, "the streams reach RUN_FINISHED too");
}

/* The cached prefix holds what comes before a content event's delta: only when the type and the id
 * are in it does a later frame with the same bytes before its delta name the same item. A frame
 * whose delta comes first would otherwise leave "{\"delta\":\"" as the prefix, and an event with no
 * type at all ({"delta":""}, found by the fuzzer) would be taken for an empty delta of that item
 * and dropped, where the full path ends the run with INVALID_EVENT. Each stream is fed with the
 * fast paths on and off: the same bytes out, the same return values. */
Test(agui, a_cached_prefix_names_its_type_and_id)
{
    const char *const streams[][6] = {
        {"{\"delta\":\"c\",\"messageId\":\"m1\",\"type\":\"TEXT_MESSAGE_CONTENT\"}",
         "{\"delta\":\"\"}"},
        {"{\"delta\":\"c\",\"messageId\":\"m1\",\"type\":\"TEXT_MESSAGE_CONTENT\"}",
         "{\"delta\":\"d\"}"},
        {"{\"messageId\":\"m1\",\"delta\":\"c\",\"type\":\"TEXT_MESSAGE_CONTENT\"}",
         "{\"messageId\":\"m1\",\"delta\":\"\"}"},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"delta\":\"c\",\"messageId\":\"m1\"}",
         "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"delta\":\"d\"}"},
    };

    for (size_t k = 0; k < AGW_ARRAY_LEN(streams); k++) {
        const char *frames[4] = {
            "{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
            "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m1\",\"role\":\"assistant\"}",
            streams[k][0], streams[k][1]};
        int rf[4], rs[4];
        uint64_t ef, es;
        char of[96], os[96];
        char *fast = run_with_fast(frames, 4, true, 0, rf, &ef, of, sizeof(of));
        char *slow = run_with_fast(frames, 4, false, 0, rs, &es, os, sizeof(os));

        cr_assert_str_eq(fast, slow, "stream %zu: fast paths wrote\n%s\nthe full path\n%s", k, fast,
                         slow);
        cr_assert(strstr(slow, "INVALID_EVENT") != NULL,
                  "stream %zu: the last event is refused:\n%s", k, slow);
        for (size_t i = 0; i < 4; i++)
            cr_assert_eq(rf[i], rs[i], "stream %zu, frame %zu", k, i);
        cr_assert_eq(ef, es, "stream %zu", k);
        cr_assert_str_eq(of, os, "stream %zu", k);
        free(fast);
        free(slow);
    }
}

/* The allocation-free fast path for content events must decide exactly as the full parser: each
 * frame below is fed after RUN_STARTED + TEXT_MESSAGE_START m1, and the expected relay is stated
 * explicitly. */
Test(agui, content_fast_path_agrees_with_the_full_parser)
{
    static const struct {
        const char *frame;
        const char
            *expect; /* the second output frame's data, NULL = dropped, "ERROR" = INVALID_EVENT */
    } cases[] = {
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"hi\"}", "="},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"h\\u00e9 \\\"q\\\" "
         "\\n\"}",
         "="},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"caf\xc3\xa9 "
         "\xf0\x9f\x98\x80\"}",
         "="},
        {"{ \"type\" : \"TEXT_MESSAGE_CONTENT\" , \"messageId\":\"m1\", \"delta\":\"x\", "
         "\"timestamp\":1700000000000 }",
         "="},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"\"}", NULL},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\\u0031\",\"delta\":\"x\"}", "="},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"x\",\"timestamp\":1."
         "5}",
         "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"x\",\"timestamp\":"
         "1}"},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"x\",\"extra\":null}",
         "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"x\"}"},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m2\",\"delta\":\"x\"}", "ERROR"},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"bad \xc3\x28\"}",
         "ERROR"},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"nul \\u0000\"}",
         "ERROR"},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"x\"}x", "ERROR"},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"x\",}", "ERROR"},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":7}", "ERROR"},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"ctl \x01\"}",
         "ERROR"},
        /* other members: integers, booleans and strings pass as they are */
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"x\",\"sentUs\":"
         "1700000000000123,\"seq\":-5,\"last\":false,\"ok\":true,\"n\":0,\"s\":\"y\"}",
         "="},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"x\",\"big\":"
         "123456789012345678901234}",
         "="},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"x\",\"f\":2.5}", "="},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"x\",\"timestamp\":-"
         "5}",
         "="},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"x\",\"n\":01}",
         "ERROR"},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"x\",\"n\":-}",
         "ERROR"},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"x\",\"b\":truex}",
         "ERROR"},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"x\",\"timestamp\":1,"
         "\"timestamp\":2}",
         "="},
        {"{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":7,\"delta\":\"x\"}", "ERROR"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct result r = RUN(
            END_NONE, "{\"type\":\"RUN_STARTED\",\"threadId\":\"" TID "\",\"runId\":\"" RID "\"}",
            "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m1\",\"role\":\"assistant\"}",
            cases[i].frame);
        const char *exp = cases[i].expect;
        if (exp == NULL) {
            cr_assert_eq(r.n_out, 2, "case %zu: the frame is dropped", i);
        } else if (strcmp(exp, "ERROR") == 0) {
            assert_closed_then_error(&r, 2, "m1", "INVALID_EVENT", "");
        } else {
            cr_assert_eq(r.n_out, 3, "case %zu", i);
            const char *third =
                strstr(strstr(strstr(r.text, "\n\n") + 2, "\n\n") + 2, "data: ") + 6;
            size_t n = (size_t)(strstr(third, "\n\n") - third);
            const char *want = strcmp(exp, "=") == 0 ? cases[i].frame : exp;
            cr_assert(n == strlen(want) && memcmp(third, want, n) == 0, "case %zu: got %.*s", i,
                      (int)n, third);
        }
        result_free(&r);
    }
}

/* The fast path skips plain ASCII eight bytes at a time: a byte that needs attention must be seen
 * at every position of a word, and the scanner must agree with the full parser on each. */
Test(agui, content_fast_path_sees_special_bytes_at_every_offset)
{
    static const struct {
        const char *bytes;
        bool ok; /* relayed as is; else INVALID_EVENT */
    } specials[] = {
        {"\\\"", true},  {"\\\\", true},  {"\xc3\xa9", true}, {"\x7f", true},
        {"\x01", false}, {"\x1f", false}, {"\xff", false},    {"\"", false},
    };

    for (size_t s = 0; s < sizeof(specials) / sizeof(specials[0]); s++) {
        for (size_t off = 0; off < 17; off++) {
            char frame[256], delta[64];
            memset(delta, 'a', off);
            snprintf(delta + off, sizeof(delta) - off, "%s%s", specials[s].bytes,
                     "bbbbbbbbbbbbbbbbbbbb");
            snprintf(frame, sizeof(frame),
                     "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"%s\"}",
                     delta);
            struct result r =
                RUN(END_NONE,
                    "{\"type\":\"RUN_STARTED\",\"threadId\":\"" TID "\",\"runId\":\"" RID "\"}",
                    "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m1\",\"role\":\"assistant\"}",
                    frame);
            if (specials[s].ok) {
                cr_assert_eq(r.n_out, 3, "special %zu at %zu", s, off);
                cr_assert(strstr(r.text, frame) != NULL, "special %zu at %zu: relayed as is", s,
                          off);
            } else {
                assert_closed_then_error(&r, 2, "m1", "INVALID_EVENT", "");
            }
            result_free(&r);
        }
    }
}

/* Repeated deltas of a message are checked against the bytes of the last one accepted: that
 * shortcut must never accept what the full path refuses. */
#define C1(delta) "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"" delta "\"}"
#define START_M1  "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m1\",\"role\":\"assistant\"}"
#define STARTED   "{\"type\":\"RUN_STARTED\",\"threadId\":\"" TID "\",\"runId\":\"" RID "\"}"

Test(agui, repeated_deltas_shortcut_agrees_with_the_full_parser)
{
    /* accepted, repeated, then one after the message ended: INVALID_EVENT */
    struct result r = RUN(END_NONE, STARTED, START_M1, C1("a"), C1("b"),
                          "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m1\"}", C1("c"));
    assert_run_error(&r, 5, "INVALID_EVENT", "");
    result_free(&r);

    /* a control byte or broken UTF-8 in a later delta */
    r = RUN(END_NONE, STARTED, START_M1, C1("a"), C1("bad \x01"));
    assert_closed_then_error(&r, 3, "m1", "INVALID_EVENT", "");
    result_free(&r);
    r = RUN(END_NONE, STARTED, START_M1, C1("a"), C1("bad \xc3\x28"));
    assert_closed_then_error(&r, 3, "m1", "INVALID_EVENT", "");
    result_free(&r);

    /* an empty later delta is dropped; one with a member after the delta goes the full way (a null
     * member is removed); an unterminated one is invalid */
    r = RUN(END_NONE, STARTED, START_M1, C1("a"), C1(""),
            "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"b\",\"x\":null}",
            C1("c"));
    cr_assert_eq(r.n_out, 5, "%s", r.text);
    cr_assert(
        strstr(r.text,
               "data: " C1("a") "\n\n"
                                "data: {\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\","
                                "\"delta\":\"b\"}\n\n"
                                "data: " C1("c") "\n\n") != NULL,
        "%s", r.text);
    result_free(&r);
    r = RUN(END_NONE, STARTED, START_M1, C1("a"),
            "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"b}");
    assert_closed_then_error(&r, 3, "m1", "INVALID_EVENT", "");
    result_free(&r);

    /* tool call arguments keep an empty delta */
    r = RUN(END_NONE, STARTED,
            "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\"}",
            "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"{\"}",
            "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"\"}");
    cr_assert_eq(r.n_out, 4, "%s", r.text);
    result_free(&r);
}

/* The CloudBase error codes (its documentation's table) reach the client as RUN_ERROR.code, with
 * their message, from the {error:{code,message}} form. */
Test(agui, cloudbase_error_codes)
{
    static const char *const codes[] = {"INVALID_REQUEST", "TOOL_NOT_FOUND", "TOOL_EXECUTION_ERROR",
                                        "MODEL_ERROR", "TIMEOUT"};

    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        char frame[160];
        snprintf(frame, sizeof(frame),
                 "{\"type\":\"RUN_ERROR\",\"error\":{\"code\":\"%s\",\"message\":\"it failed\"}}",
                 codes[i]);
        struct result r = run_frames_p(
            (const char *const[]){"{\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}",
                                  frame, NULL},
            END_EOF, AGW_PROTO_AGUI);
        cr_assert_eq(r.n_out, 2, "%s", codes[i]);
        cr_assert_str_eq(str_at(&r, 1, "type"), "RUN_ERROR");
        cr_assert_str_eq(str_at(&r, 1, "code"), codes[i]);
        cr_assert_str_eq(str_at(&r, 1, "message"), "it failed");
        cr_assert_null(json_object_get(json_array_get(r.events, 1), "error"));
        assert_verified(&r);
        result_free(&r);
    }
}

/* ---- who opened an id ------------------------------------------------------------------------ */

/* The frames below are written with ' for " (dq() turns them back). */
#define START      "{'type':'RUN_STARTED','threadId':'t1','runId':'r1'}"
#define FINISH     "{'type':'RUN_FINISHED','threadId':'t1','runId':'r1'}"
#define M1_BY(who) "{'type':'TEXT_MESSAGE_START','messageId':'m1','role':'assistant'" who "}"
#define M1_END     "{'type':'TEXT_MESSAGE_END','messageId':'m1'}"
#define BY_A       ",'subagentRunId':'a'"
#define BY_B       ",'subagentRunId':'b'"

/* Streams the official client fails for an id used by another than its opener, each with the
 * message of the gateway's INVALID_EVENT; and streams it accepts (NULL), the same ids used as it
 * allows. Each runs with the fast paths on and off, which must agree. */
static const struct {
    const char *frames[10];
    const char *error;
} owner_cases[] = {
    {{START, M1_BY(""), "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'a'" BY_B "}"},
     "TEXT_MESSAGE_CONTENT for message 'm1' with 'subagentRunId' 'b': the agent itself (no "
     "sub-agent run) opened it"},
    {{START, M1_BY(BY_A), "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x'}",
      "{'type':'TEXT_MESSAGE_END','messageId':'m1'" BY_B "}"},
     "TEXT_MESSAGE_END for message 'm1' with 'subagentRunId' 'b': another sub-agent run opened it"},
    {{START, M1_BY(BY_A), M1_END, M1_BY(BY_B)},
     "TEXT_MESSAGE_START for message 'm1' with 'subagentRunId' 'b': another sub-agent run opened "
     "it"},
    /* a tool call belongs to the message that carries it */
    {{START, M1_BY(""), M1_END,
      "{'type':'TOOL_CALL_START','toolCallId':'c1','toolCallName':'f','parentMessageId':'m1'" BY_B
      "}"},
     "TOOL_CALL_START for tool call 'c1' with 'subagentRunId' 'b': the agent itself (no sub-agent "
     "run) opened its parent message 'm1'"},
    {{START, "{'type':'TOOL_CALL_START','toolCallId':'c1','toolCallName':'f'" BY_A "}",
      "{'type':'TOOL_CALL_END','toolCallId':'c1'}", M1_BY(""), M1_END,
      "{'type':'TOOL_CALL_START','toolCallId':'c1','toolCallName':'f','parentMessageId':'m1'}"},
     "TOOL_CALL_START for tool call 'c1' under message 'm1': the two were opened by different "
     "sub-agent runs (or the agent itself)"},
    /* a tool call under a sub-agent's message is that sub-agent's */
    {{START, M1_BY(BY_A), M1_END,
      "{'type':'TOOL_CALL_START','toolCallId':'c1','toolCallName':'f','parentMessageId':'m1'}",
      "{'type':'TOOL_CALL_ARGS','toolCallId':'c1','delta':'{'" BY_A "}",
      "{'type':'TOOL_CALL_ARGS','toolCallId':'c1','delta':'}'" BY_B "}"},
     "TOOL_CALL_ARGS for tool call 'c1' with 'subagentRunId' 'b': another sub-agent run opened it"},
    /* the run's input names openers too (and its tool calls') */
    {{"{'type':'RUN_STARTED','threadId':'t1','runId':'r1','input':{'threadId':'t1','runId':'r1',"
      "'messages':[{'id':'m0','role':'assistant','subagentRunId':'a','toolCalls':[{'id':'c0',"
      "'type':'function','function':{'name':'f','arguments':'{}'}}]}],'tools':[],'context':[],"
      "'state':{},'forwardedProps':{}}}",
      "{'type':'TEXT_MESSAGE_START','messageId':'m0','role':'assistant'}",
      "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m0','delta':'x'" BY_A "}",
      "{'type':'TEXT_MESSAGE_END','messageId':'m0'}",
      "{'type':'TOOL_CALL_START','toolCallId':'c0','toolCallName':'f'" BY_B "}"},
     "TOOL_CALL_START for tool call 'c0' with 'subagentRunId' 'b': another sub-agent run opened "
     "it"},
    /* a snapshot says who opened its messages, whoever did before */
    {{START, M1_BY(BY_A), M1_END,
      "{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'m1','role':'assistant','content':'x'}]}",
      M1_BY(BY_A)},
     "TEXT_MESSAGE_START for message 'm1' with 'subagentRunId' 'a': the agent itself (no "
     "sub-agent run) opened it"},
    /* a tool result's message is whoever sent it; an encrypted value names a message */
    {{START, "{'type':'TOOL_CALL_RESULT','messageId':'t1','toolCallId':'c1','content':'r'" BY_A "}",
      "{'type':'REASONING_ENCRYPTED_VALUE','subtype':'message','entityId':'t1',"
      "'encryptedValue':'e'" BY_B "}"},
     "REASONING_ENCRYPTED_VALUE for message 't1' with 'subagentRunId' 'b': another sub-agent run "
     "opened it"},
    /* a snapshot that does not replace leaves the opener */
    {{START,
      "{'type':'ACTIVITY_SNAPSHOT','messageId':'v1','activityType':'p','content':{}" BY_A "}",
      "{'type':'ACTIVITY_SNAPSHOT','messageId':'v1','activityType':'p','content':{},"
      "'replace':false}",
      "{'type':'ACTIVITY_DELTA','messageId':'v1','activityType':'p','patch':[]" BY_B "}"},
     "ACTIVITY_DELTA for activity 'v1' with 'subagentRunId' 'b': another sub-agent run opened it"},
    /* reasoning spans and reasoning messages share their ids */
    {{START, "{'type':'REASONING_START','messageId':'x'" BY_A "}",
      "{'type':'REASONING_MESSAGE_START','messageId':'x','role':'reasoning'" BY_B "}"},
     "REASONING_MESSAGE_START for reasoning message 'x' with 'subagentRunId' 'b': another "
     "sub-agent run opened it"},
    /* what the client allows: no subagentRunId says nothing; the opener's own; a replaced one */
    {{START, M1_BY(BY_A), "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x'}",
      "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'y'" BY_A "}",
      "{'type':'TEXT_MESSAGE_END','messageId':'m1'" BY_A "}",
      "{'type':'TOOL_CALL_START','toolCallId':'c1','toolCallName':'f','parentMessageId':'m1'}",
      "{'type':'TOOL_CALL_ARGS','toolCallId':'c1','delta':'{}'" BY_A "}",
      "{'type':'TOOL_CALL_END','toolCallId':'c1'}",
      "{'type':'TOOL_CALL_RESULT','messageId':'m1','toolCallId':'c1','content':'r'" BY_B "}",
      FINISH},
     NULL},
    /* the fast paths record what the agent itself opens */
    {{START, M1_BY(""), "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x'}", M1_END,
      "{'type':'TOOL_CALL_START','toolCallId':'c1','toolCallName':'f','parentMessageId':'m1'}",
      "{'type':'TOOL_CALL_END','toolCallId':'c1'}",
      "{'type':'TOOL_CALL_RESULT','messageId':'t1','toolCallId':'c1','content':'r'}",
      "{'type':'TEXT_MESSAGE_START','messageId':'t1','role':'assistant','subagentRunId':'s'}",
      "{'type':'TEXT_MESSAGE_END','messageId':'t1'}", FINISH},
     "TEXT_MESSAGE_START for message 't1' with 'subagentRunId' 's': the agent itself (no "
     "sub-agent run) opened it"},
};

/* <s> with every ' made ", in a buffer of the caller's (<n> bytes). */
static const char *dq(const char *s, char *buf, size_t n)
{
    size_t i = 0;

    for (; s[i] != '\0' && i + 1 < n; i++)
        buf[i] = s[i] == '\'' ? '"' : s[i];
    cr_assert_eq(s[i], '\0', "a frame too long for its buffer");
    buf[i] = '\0';
    return buf;
}

Test(agui, an_id_is_used_only_by_its_opener)
{
    static char bufs[AGW_ARRAY_LEN(owner_cases[0].frames) + 1][512];

    for (size_t c = 0; c < AGW_ARRAY_LEN(owner_cases); c++) {
        const char *frames[AGW_ARRAY_LEN(owner_cases[0].frames)];
        size_t n = 0;
        int rcs[2][AGW_ARRAY_LEN(owner_cases[0].frames)];
        uint64_t events[2];
        char outcome[2][128];
        char *text[2];

        for (; n < AGW_ARRAY_LEN(frames) && owner_cases[c].frames[n] != NULL; n++)
            frames[n] = dq(owner_cases[c].frames[n], bufs[n], sizeof(bufs[n]));
        for (int on = 0; on < 2; on++)
            text[on] = run_with_fast(frames, n, on, 0, rcs[on], &events[on], outcome[on],
                                     sizeof(outcome[on]));
        cr_assert_str_eq(text[0], text[1], "case %zu: fast paths and full path differ", c);
        cr_assert_str_eq(outcome[0], outcome[1]);
        json_t *evs = parse_stream(text[1]);
        json_t *last = json_array_get(evs, json_array_size(evs) - 1);
        const char *why = verify_stream(evs);
        cr_assert_null(why, "case %zu: %s\n%s", c, why, text[1]);
        if (owner_cases[c].error == NULL) {
            cr_assert_str_eq(outcome[1], "RUN_FINISHED", "case %zu:\n%s", c, text[1]);
        } else {
            const char *want = dq(owner_cases[c].error, bufs[n], sizeof(bufs[n]));
            cr_assert_str_eq(outcome[1], "RUN_ERROR:INVALID_EVENT", "case %zu", c);
            cr_assert_str_eq(json_string_value(json_object_get(last, "message")), want, "case %zu",
                             c);
            /* and the model finds the stream it was given wrong */
            json_t *given = json_array();
            for (size_t i = 0; i < n; i++)
                json_array_append_new(given, json_loads(frames[i], 0, NULL));
            json_array_append_new(given, json_loads(dq(FINISH, bufs[n], sizeof(bufs[n])), 0, NULL));
            cr_assert_not_null(verify_stream(given), "case %zu: the model takes it", c);
            json_decref(given);
        }
        json_decref(evs);
        free(text[0]);
        free(text[1]);
    }
}

/* A run that opens more ids than its table holds relays them all; the table's memory is bounded. */
Test(agui, a_run_with_many_ids_keeps_a_bounded_table)
{
    struct agw_agui *a = agw_agui_new(TID, RID, AGW_PROTO_AGUI);
    struct evbuffer *out = evbuffer_new();
    char frame[160];
    int rc = 0;

    for (int i = 0; i < 20000 && rc == 0; i++) {
        snprintf(frame, sizeof(frame),
                 "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c%d\",\"toolCallName\":\"f\"}", i);
        rc = agw_agui_feed(a, frame, strlen(frame), SINK(out));
        snprintf(frame, sizeof(frame), "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c%d\"}", i);
        rc = rc || agw_agui_feed(a, frame, strlen(frame), SINK(out));
    }
    cr_assert_eq(rc, 0);
    /* a sub-agent naming an id the table holds is refused; one it could not hold, relayed */
    static const char late[] = "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c19999\","
                               "\"toolCallName\":\"f\",\"subagentRunId\":\"s\"}";
    static const char early[] = "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c7\","
                                "\"toolCallName\":\"f\",\"subagentRunId\":\"s\"}";
    cr_assert_eq(agw_agui_feed(a, late, strlen(late), SINK(out)), 0);
    cr_assert_eq(agw_agui_feed(a, early, strlen(early), SINK(out)), 1);
    cr_assert_str_eq(agw_agui_outcome(a), "RUN_ERROR:INVALID_EVENT");
    evbuffer_free(out);
    agw_agui_free(a);
}

#undef START
#undef FINISH
#undef M1_BY
#undef M1_END
#undef BY_A
#undef BY_B
