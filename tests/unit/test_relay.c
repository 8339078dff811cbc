/* Tests for src/relay.c, driven call by call against a fake server and a fake upstream
 * (tests/unit/fake_io.c): every transition of the relay's state machine and every way a run ends —
 * the terminal event, EOF, EOF mid-message, a lost upstream, each timeout, errors before the stream
 * with and without retries, cancel, shutdown, a client that leaves (cancel and detach, streaming
 * and still connecting), a decision's deferred stream (events, empty, failed) — plus backpressure,
 * heartbeats, the probe of a half-closed client, and that the relay is never freed inside one of
 * its own callbacks. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "agw/relay.h"
#include "agw/runs.h"

#include "fake_io.h"

#define SSE "text/event-stream"

static struct event_base *base;
static struct agw_relay_set *set;
static struct agw_runs *runs;
static struct agw_upstream_pool pools[2];
static struct agw_upstream_pool *backends[2] = {&pools[0], &pools[1]};

/* What on_end reported (copied: the strings die with the relay). */
static struct {
    int calls;
    int status;
    char outcome[64];
    uint64_t events;
    bool detached;
    enum agw_up_failure upstream_error;
} ended;

static void on_end(void *arg, const struct agw_relay_summary *s)
{
    (void)arg;
    cr_assert_eq(fake_in_nested_close, 0,
                 "the relay was freed inside a nested call, not as its own callback unwound");
    ended.calls++;
    ended.status = s->status;
    snprintf(ended.outcome, sizeof(ended.outcome), "%s", s->outcome);
    ended.events = s->events;
    ended.detached = s->detached;
    ended.upstream_error = s->upstream_error;
}

static void setup(void)
{
    base = event_base_new();
    set = agw_relay_set_new(base);
    runs = agw_runs_new(1);
    fake_pool_init(&pools[0], "http://127.0.0.1:9001/agent");
    fake_pool_init(&pools[1], "http://127.0.0.1:9002/agent");
    memset(&ended, 0, sizeof(ended));
}

static void teardown(void)
{
    agw_relay_set_free(set);
    cr_assert_eq(agw_runs_count(runs), 0, "a run left in the registry");
    agw_runs_free(runs);
    fake_pool_clear(&pools[0]);
    fake_pool_clear(&pools[1]);
    fake_reset();
    event_base_free(base);
}

TestSuite(relay, .init = setup, .fini = teardown);

struct opts {
    size_t n_backends;
    unsigned retries;
    bool detach;
    uint32_t heartbeat_ms, run_ms;
};

static struct agw_relay_params params(struct agw_req *req, const struct opts *o)
{
    return (struct agw_relay_params){
        .req = req,
        .agent_id = "a",
        .thread_id = "t1",
        .run_id = "r1",
        .protocol = AGW_PROTO_AGUI,
        .backends = backends,
        .n_backends = o->n_backends ? o->n_backends : 1,
        .retries = o->retries,
        .body = "{}",
        .body_len = 2,
        .stream_buffer_bytes = 1024,
        .max_frame_bytes = 4096,
        .heartbeat_ms = o->heartbeat_ms,
        .run_ms = o->run_ms,
        .runs = runs,
        .detach = o->detach,
        .on_end = on_end,
    };
}

static struct agw_relay *start(struct agw_req *req, const struct opts *o)
{
    struct agw_relay_params p = params(req, o);
    return agw_relay_start(set, &p);
}

static struct agw_upstream *last_up(void)
{
    cr_assert_gt(fake_n_ups, 0);
    return fake_ups[fake_n_ups - 1];
}

static char *body_of(struct agw_req *req)
{
    size_t n = evbuffer_get_length(req->body);
    char *s = malloc(n + 1);

    evbuffer_copyout(req->body, s, n);
    s[n] = '\0';
    return s;
}

/* The types of the events the client got, space-separated. */
static void types_of(struct agw_req *req, char *out, size_t len)
{
    char *b = body_of(req), *p = b;
    size_t k = 0;

    out[0] = '\0';
    while ((p = strstr(p, "\"type\":\"")) != NULL) {
        p += 8;
        char *e = strchr(p, '"');
        k += (size_t)snprintf(out + k, len - k, "%s%.*s", k ? " " : "", (int)(e - p), p);
        p = e;
    }
    free(b);
}

static void assert_types(struct agw_req *req, const char *want)
{
    char got[1024];
    types_of(req, got, sizeof(got));
    cr_assert_str_eq(got, want);
}

static void run_loop_ms(int ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    event_base_loopexit(base, &tv);
    event_base_dispatch(base);
}

#define START "data: {\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}\n\n"
#define TSTART                                                                                     \
    "data: {\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":\"assistant\"}\n\n"
#define TCONT "data: {\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"hi\"}\n\n"
#define TEND  "data: {\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m\"}\n\n"
#define FIN   "data: {\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}\n\n"

/* CONNECTING → STREAMING → FINISHING → CLOSED: the terminal event ends the response, the upstream
 * is released (read to its end for the pool), the run leaves the registry, and the relay is freed
 * once the client took the answer. */
Test(relay, a_whole_run)
{
    struct agw_req *req = fake_req_new();
    struct opts o = {0};

    start(req, &o);
    cr_assert_eq(agw_relay_set_count(set), 1);
    cr_assert_eq(req->status, 0, "no answer before the upstream's");
    fake_up_head(last_up(), 200, SSE);
    cr_assert_eq(req->status, 200);
    cr_assert_eq(agw_runs_count(runs), 1, "registered while streaming");
    fake_prefetches = 0;
    fake_up_body(last_up(), START TSTART TCONT);
    cr_assert_gt(fake_prefetches, 0, "the read's hints name the request");
    cr_assert(!req->finished);
    fake_up_body(last_up(), TEND FIN);
    cr_assert(req->finished);
    cr_assert(last_up()->released && !last_up()->closed, "released, not closed");
    cr_assert_eq(agw_runs_count(runs), 0);
    assert_types(req, "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END "
                      "RUN_FINISHED");
    cr_assert_eq(ended.calls, 0, "alive until the client took the answer");
    fake_req_close(req);
    cr_assert_eq(ended.calls, 1);
    cr_assert_str_eq(ended.outcome, "RUN_FINISHED");
    cr_assert_eq(ended.status, 200);
    cr_assert_eq(ended.events, 5);
    cr_assert_eq(agw_relay_set_count(set), 0);
    fake_req_free(req);
}

/* A read whose frames all pass unchanged, on a plain connection (the bytes handed where they lie),
 * goes to the client from there: no copy into the relay's output buffer. A read with a frame the
 * normaliser rewrote, or one read through an evbuffer, goes through that buffer, in order. (The
 * fake upstream hands its reads by bytes and by evbuffer in turn, by bytes first.) */
Test(relay, passed_frames_go_out_from_where_they_were_read)
{
#define REWRITTEN                                                                                  \
    "data: "                                                                                       \
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"x\",\"rawEvent\":null}"    \
    "\n\n"
    static const char want[] = START TSTART TCONT TCONT TCONT
        "data: {\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"x\"}\n\n" TCONT
            TEND FIN;
    struct agw_req *req = fake_req_new();
    struct opts o = {0};
    char *body;
    size_t n;

    start(req, &o);
    fake_up_head(last_up(), 200, SSE);
    fake_direct_writes = 0;
    fake_body_turn = 0;
    fake_up_body(last_up(), START TSTART); /* by bytes */
    cr_assert_eq(fake_direct_writes, 1);
    fake_up_body(last_up(), TCONT); /* by evbuffer */
    cr_assert_eq(fake_direct_writes, 1);
    fake_up_body(last_up(), TCONT); /* by bytes */
    cr_assert_eq(fake_direct_writes, 2);
    fake_up_body(last_up(), TCONT);           /* by evbuffer */
    fake_up_body(last_up(), REWRITTEN TCONT); /* by bytes, the first rewritten */
    cr_assert_eq(fake_direct_writes, 2, "behind a rewritten frame: through the buffer");
    fake_up_body(last_up(), TEND FIN);
    cr_assert(req->finished);
    n = evbuffer_get_length(req->body);
    body = (char *)evbuffer_pullup(req->body, (ev_ssize_t)n);
    cr_assert_eq(n, strlen(want));
    cr_assert(memcmp(body, want, n) == 0, "%.*s", (int)n, body);
    fake_req_close(req);
    cr_assert_eq(ended.events, 9);
    fake_req_free(req);
#undef REWRITTEN
}

/* Once a run's first event is out, its upstream reads yield to new work (AGW_PRIO_FLOWING): not
 * before (a new run's head and first event go first), and not for a head without events. */
Test(relay, the_upstream_yields_once_events_flow)
{
    struct agw_req *req = fake_req_new();
    struct opts o = {0};

    start(req, &o);
    fake_up_head(last_up(), 200, SSE);
    cr_assert(!last_up()->flowing, "not at the head");
    fake_up_body(last_up(), ": a comment, no event\n\n");
    cr_assert(!last_up()->flowing, "not before an event");
    fake_up_body(last_up(), START);
    cr_assert(last_up()->flowing, "from the first event on");
    fake_up_body(last_up(), FIN);
    fake_req_close(req);
    fake_req_free(req);
}

Test(relay, eof_ends_a_clean_run_and_a_cut_message_in_error)
{
    struct agw_req *req = fake_req_new();
    struct opts o = {0};

    start(req, &o);
    fake_up_head(last_up(), 200, SSE);
    fake_up_body(last_up(), START TSTART TCONT TEND);
    fake_up_done(last_up());
    assert_types(req, "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END "
                      "RUN_FINISHED");
    fake_req_close(req);
    cr_assert_str_eq(ended.outcome, "RUN_FINISHED");
    fake_req_free(req);

    req = fake_req_new();
    start(req, &o);
    fake_up_head(last_up(), 200, SSE);
    fake_up_body(last_up(), START TSTART TCONT);
    fake_up_done(last_up());
    assert_types(req, "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END "
                      "RUN_ERROR");
    cr_assert(req->finished);
    fake_req_close(req);
    cr_assert_str_eq(ended.outcome, "RUN_ERROR:UPSTREAM_ERROR");
    fake_req_free(req);
}

Test(relay, a_lost_or_idle_upstream_ends_in_band)
{
    static const struct {
        enum agw_up_failure kind;
        const char *outcome;
    } cases[] = {{AGW_UP_CLOSED, "RUN_ERROR:UPSTREAM_ERROR"},
                 {AGW_UP_IDLE_TIMEOUT, "RUN_ERROR:TIMEOUT"},
                 {AGW_UP_PROTOCOL, "RUN_ERROR:UPSTREAM_ERROR"}};

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct agw_req *req = fake_req_new();
        struct opts o = {0};

        start(req, &o);
        fake_up_head(last_up(), 200, SSE);
        fake_up_body(last_up(), START TSTART);
        fake_up_error(last_up(), cases[i].kind);
        assert_types(req, "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_END RUN_ERROR");
        cr_assert(req->finished);
        cr_assert_eq(agw_runs_count(runs), 0);
        fake_req_close(req);
        cr_assert_str_eq(ended.outcome, cases[i].outcome);
        cr_assert_eq(ended.upstream_error, cases[i].kind);
        fake_req_free(req);
    }
}

/* Before the first byte: a failure is retried on the next backend while retries remain, then
 * answered 502 (504 for a first-byte timeout); a 5xx is retried too; other non-2xx and a body that
 * is no event stream are 502 at once. */
Test(relay, errors_before_the_stream)
{
    struct agw_req *req = fake_req_new();
    struct opts two = {.n_backends = 2, .retries = 1};

    start(req, &two);
    fake_up_error(last_up(), AGW_UP_CONNECT);
    cr_assert_eq(fake_n_ups, 2, "retried on the other backend");
    cr_assert(fake_ups[0]->closed);
    cr_assert_eq(fake_ups[1]->pool, &pools[1]);
    fake_up_head(last_up(), 503, "application/json");
    cr_assert_eq(fake_n_ups, 2, "no retry left");
    cr_assert_eq(req->status, 502);
    cr_assert(strstr(req->error, "HTTP 503") != NULL, "%s", req->error);
    fake_req_close(req);
    cr_assert_str_eq(ended.outcome, "upstream_error");
    cr_assert_eq(ended.upstream_error, AGW_UP_STATUS);
    fake_req_free(req);

    struct opts one = {0};
    req = fake_req_new();
    start(req, &one);
    fake_up_error(last_up(), AGW_UP_FIRST_BYTE_TIMEOUT);
    cr_assert_eq(req->status, 504);
    fake_req_close(req);
    fake_req_free(req);

    req = fake_req_new();
    start(req, &one);
    fake_up_head(last_up(), 200, "application/json");
    cr_assert_eq(req->status, 502);
    cr_assert(strstr(req->error, "not text/event-stream") != NULL, "%s", req->error);
    cr_assert(last_up()->closed);
    fake_req_close(req);
    cr_assert_eq(ended.upstream_error, AGW_UP_CONTENT_TYPE);
    fake_req_free(req);

    req = fake_req_new();
    start(req, &two);
    fake_up_head(last_up(), 500, "application/json");
    fake_up_head(last_up(), 200, SSE);
    cr_assert_eq(req->status, 200, "a 5xx retried on the next backend, which streams");
    fake_up_body(last_up(), START FIN);
    fake_req_close(req);
    cr_assert_str_eq(ended.outcome, "RUN_FINISHED");
    fake_req_free(req);
}

Test(relay, the_run_timer_in_each_state)
{
    struct agw_req *req = fake_req_new();
    struct opts o = {.run_ms = 30};

    start(req, &o);
    run_loop_ms(80);
    cr_assert_eq(req->status, 504, "still connecting: 504");
    cr_assert(last_up()->closed);
    fake_req_close(req);
    cr_assert_str_eq(ended.outcome, "timeout");
    fake_req_free(req);

    req = fake_req_new();
    start(req, &o);
    fake_up_head(last_up(), 200, SSE);
    fake_up_body(last_up(), START TSTART);
    run_loop_ms(80);
    assert_types(req, "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_END RUN_ERROR");
    fake_req_close(req);
    cr_assert_str_eq(ended.outcome, "RUN_ERROR:TIMEOUT");
    fake_req_free(req);
}

/* STREAMING → CANCELLED: RUN_ERROR CANCELLED after closing what is open, and the backend sees its
 * connection close (closed, not released). */
Test(relay, cancel)
{
    struct agw_req *req = fake_req_new();
    struct opts o = {0};
    struct agw_relay *r = start(req, &o);

    agw_relay_cancel(r); /* connecting: nothing to cancel yet */
    cr_assert_eq(req->status, 0);
    fake_up_head(last_up(), 200, SSE);
    fake_up_body(last_up(), START TSTART TCONT);
    agw_relay_cancel(r);
    assert_types(req, "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END "
                      "RUN_ERROR");
    cr_assert(last_up()->closed && !last_up()->released);
    cr_assert_eq(agw_runs_count(runs), 0);
    agw_relay_cancel(r); /* twice: nothing more */
    fake_req_close(req);
    cr_assert_str_eq(ended.outcome, "RUN_ERROR:CANCELLED");
    fake_req_free(req);
}

Test(relay, shutdown_ends_connecting_and_streaming_runs)
{
    struct agw_req *a = fake_req_new(), *b = fake_req_new();
    struct opts o = {0};

    start(a, &o);
    start(b, &o);
    fake_up_head(last_up(), 200, SSE);
    fake_up_body(last_up(), START TSTART);
    agw_relay_set_shutdown(set);
    cr_assert_eq(a->status, 503);
    assert_types(b, "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_END RUN_ERROR");
    char *text = body_of(b);
    cr_assert(strstr(text, "SHUTDOWN") != NULL);
    free(text);
    fake_req_close(a);
    fake_req_close(b);
    cr_assert_eq(ended.calls, 2);
    fake_req_free(a);
    fake_req_free(b);
}

/* The client leaves (on_client_disconnect "cancel"): the upstream is closed at once, the relay
 * freed, whatever the state. */
Test(relay, client_leaves)
{
    struct agw_req *req = fake_req_new();
    struct opts o = {0};

    start(req, &o);
    fake_req_close(req);
    cr_assert(last_up()->closed, "connecting: the attempt is closed");
    cr_assert_eq(ended.calls, 1);
    cr_assert_str_eq(ended.outcome, "client_closed");
    cr_assert_eq(ended.status, 0);
    fake_req_free(req);

    req = fake_req_new();
    start(req, &o);
    fake_up_head(last_up(), 200, SSE);
    fake_up_body(last_up(), START);
    fake_req_close(req);
    cr_assert(last_up()->closed);
    cr_assert_eq(agw_runs_count(runs), 0);
    cr_assert_str_eq(ended.outcome, "client_closed");
    fake_req_free(req);
}

/* on_client_disconnect "detach": STREAMING → DETACHED; the run reads on (resumed if paused), stays
 * registered, and ends by itself (CLOSED) when its stream ends. */
Test(relay, detach_while_streaming)
{
    struct agw_req *req = fake_req_new();
    struct opts o = {.detach = true};

    start(req, &o);
    fake_up_head(last_up(), 200, SSE);
    req->pending = 5000; /* over stream_buffer_bytes: paused */
    fake_up_body(last_up(), START TSTART);
    cr_assert(last_up()->paused);
    fake_req_close(req);
    cr_assert_eq(ended.calls, 0, "the run goes on");
    cr_assert(!last_up()->paused, "resumed: nobody to wait for");
    cr_assert_eq(agw_runs_count(runs), 1, "still registered: decisions reach it");
    fake_prefetches = 0;
    fake_up_body(last_up(), TCONT TEND);
    fake_up_body(last_up(), FIN);
    cr_assert_eq(fake_prefetches, 0, "no hint about a request it no longer holds");
    cr_assert_eq(ended.calls, 1, "freed when its stream ended (after the callback returned)");
    cr_assert(ended.detached);
    cr_assert_str_eq(ended.outcome, "RUN_FINISHED");
    cr_assert_eq(ended.events, 5);
    cr_assert(last_up()->released);
    fake_req_free(req);
}

Test(relay, detach_while_connecting_and_its_endings)
{
    struct agw_req *req = fake_req_new();
    struct opts o = {.detach = true, .n_backends = 2, .retries = 1};
    struct agw_relay *r;

    start(req, &o);
    fake_req_close(req);
    fake_up_error(last_up(), AGW_UP_CONNECT);
    cr_assert_eq(fake_n_ups, 2, "a detached run still retries");
    fake_up_head(last_up(), 200, SSE);
    cr_assert_eq(agw_runs_count(runs), 1);
    fake_up_error(last_up(), AGW_UP_CLOSED);
    cr_assert_eq(ended.calls, 1);
    cr_assert_str_eq(ended.outcome, "RUN_ERROR:UPSTREAM_ERROR");
    fake_req_free(req);

    /* a detached run is cancelled, or drained by a shutdown */
    req = fake_req_new();
    r = start(req, &o);
    fake_up_head(last_up(), 200, SSE);
    fake_req_close(req);
    agw_relay_cancel(r);
    cr_assert_eq(ended.calls, 2);
    cr_assert_str_eq(ended.outcome, "RUN_ERROR:CANCELLED");
    cr_assert(last_up()->closed);
    fake_req_free(req);

    req = fake_req_new();
    start(req, &o);
    fake_up_head(last_up(), 200, SSE);
    fake_req_close(req);
    agw_relay_set_shutdown(set);
    cr_assert_eq(ended.calls, 3);
    cr_assert_str_eq(ended.outcome, "RUN_ERROR:SHUTDOWN");
    fake_req_free(req);

    /* a detached run still connecting when the gateway stops */
    req = fake_req_new();
    start(req, &o);
    fake_req_close(req);
    agw_relay_set_shutdown(set);
    cr_assert_eq(ended.calls, 4);
    fake_req_free(req);
}

/* A decision's stream (agw_relay_adopt): DEFERRED until the first event, so that an empty stream
 * or a failure before it is a 502 rather than an empty run. */
Test(relay, deferred_head)
{
    struct agw_relay_params p;
    static char sse[] = SSE;
    struct agw_http1_response resp = {.status = 200, .content_type = sse};
    struct agw_req *req = fake_req_new();
    struct agw_upstream *up;
    struct opts o = {0};

    up = agw_upstream_start(&pools[0], NULL, 0, "", 0, &(struct agw_upstream_callbacks){0}, NULL);
    p = params(req, &o);
    agw_relay_adopt(set, &p, up, &resp);
    cr_assert_eq(req->status, 0, "no 200 before an event");
    cr_assert_eq(agw_runs_count(runs), 1);
    fake_up_body(up, ": just a comment\n\n");
    cr_assert_eq(req->status, 0);
    fake_up_body(up, TSTART);
    cr_assert_eq(req->status, 200, "the first event: the stream starts");
    fake_up_body(up, TCONT TEND FIN);
    assert_types(req, "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END "
                      "RUN_FINISHED");
    fake_req_close(req);
    cr_assert_str_eq(ended.outcome, "RUN_FINISHED");
    fake_req_free(req);

    req = fake_req_new();
    up = agw_upstream_start(&pools[0], NULL, 0, "", 0, &(struct agw_upstream_callbacks){0}, NULL);
    p = params(req, &o);
    agw_relay_adopt(set, &p, up, &resp);
    fake_up_body(up, "data: [DONE]\n\n");
    fake_up_done(up);
    cr_assert_eq(req->status, 502, "an empty stream is no run");
    cr_assert(strstr(req->error, "empty event stream") != NULL, "%s", req->error);
    cr_assert_eq(agw_runs_count(runs), 0);
    fake_req_close(req);
    cr_assert_eq(ended.upstream_error, AGW_UP_EMPTY_STREAM);
    fake_req_free(req);

    req = fake_req_new();
    up = agw_upstream_start(&pools[0], NULL, 0, "", 0, &(struct agw_upstream_callbacks){0}, NULL);
    p = params(req, &o);
    agw_relay_adopt(set, &p, up, &resp);
    fake_up_error(up, AGW_UP_CLOSED);
    cr_assert_eq(req->status, 502, "a failure before the first event: 502");
    fake_req_close(req);
    fake_req_free(req);
}

Test(relay, backpressure_pauses_and_drain_resumes)
{
    struct agw_req *req = fake_req_new();
    struct opts o = {0};

    start(req, &o);
    fake_up_head(last_up(), 200, SSE);
    fake_up_body(last_up(), START);
    cr_assert(!last_up()->paused);
    req->pending = 2000; /* over stream_buffer_bytes (1024) */
    fake_up_body(last_up(), TSTART);
    cr_assert(last_up()->paused);
    req->pending = 100;
    fake_req_drain(req);
    cr_assert(!last_up()->paused);
    fake_req_close(req);
    fake_req_free(req);
}

/* A run that records pauses its upstream while the store is behind, whatever its client, and
 * reads again once the store caught up; the client's own backpressure is lifted apart. */
Test(relay, a_store_behind_pauses_recording_runs_until_it_caught_up)
{
    /* congested from the first byte handed over until the writer applied it (it waits up to 20 ms
     * for a batch): a capture's hand-over always finds it behind */
    struct agw_store_options so = {.kind = AGW_STORE_MEMORY,
                                   .max_messages = 100,
                                   .cache_threads = 10,
                                   .commit_ms = 20,
                                   .max_queue_bytes = 1u << 30,
                                   .congested_bytes = 1};
    char err[256] = "";
    struct agw_store *st = agw_store_open(&so, err, sizeof(err));
    struct agw_req *req = fake_req_new();
    struct opts o = {0};
    struct agw_relay_params p = params(req, &o);
    char ev[1200], *big = malloc(80 * 1024);
    size_t n = 0, one;

    cr_assert_not_null(st, "%s", err);
    p.store = st;
    p.stream_buffer_bytes = 1u << 30;
    agw_relay_start(set, &p);
    fake_up_head(last_up(), 200, SSE);
    fake_up_body(last_up(), START TSTART);
    cr_assert(!last_up()->paused, "nothing handed over yet");
    /* deltas of 1,000 bytes: more than a capture holds before it hands over (64 KiB) */
    one = (size_t)snprintf(ev, sizeof(ev),
                           "data: {\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":"
                           "\"%01000d\"}\n\n",
                           7);
    while (n + one < 80 * 1024) {
        memcpy(big + n, ev, one);
        n += one;
    }
    big[n] = '\0';
    fake_up_body(last_up(), big);
    cr_assert(agw_store_congested(st));
    cr_assert(last_up()->paused, "the store is behind: no more reading");
    req->pending = 0;
    fake_req_drain(req);
    cr_assert(last_up()->paused, "a client that drained does not lift the store's pause");
    run_loop_ms(300);
    cr_assert_not(agw_store_congested(st));
    cr_assert_not(last_up()->paused, "the store caught up: reading again");
    fake_up_body(last_up(), TEND FIN);
    cr_assert(req->finished);
    fake_req_close(req);
    fake_req_free(req);
    free(big);
    cr_assert_eq(ended.calls, 1);
    agw_store_close(st);
}

/* A run that records makes its capture when an event is to be kept (none for a dropped one), and
 * lets it go once the age timer handed it over: a stream that waits holds none. The next event to
 * keep makes another; the run ends with none. */
Test(relay, a_capture_is_made_for_what_is_kept_and_let_go_while_the_run_waits)
{
    struct agw_store_options so = {.kind = AGW_STORE_MEMORY,
                                   .max_messages = 100,
                                   .cache_threads = 10,
                                   .commit_ms = 20,
                                   .max_queue_bytes = 1u << 30};
    char err[256] = "";
    struct agw_store *st = agw_store_open(&so, err, sizeof(err));
    struct agw_req *req = fake_req_new();
    struct opts o = {0};
    struct agw_relay_params p = params(req, &o);

    cr_assert_not_null(st, "%s", err);
    p.store = st;
    agw_relay_start(set, &p);
    fake_up_head(last_up(), 200, SSE);
    fake_up_body(last_up(), START);
    cr_assert_eq(agw_relay_set_captures(set), 0, "RUN_STARTED is not kept: no capture");
    fake_up_body(last_up(), TSTART TCONT);
    cr_assert_eq(agw_relay_set_captures(set), 1);
    run_loop_ms(700); /* two ticks of the age timer: handed over, then let go */
    cr_assert_eq(agw_relay_set_captures(set), 0, "a waiting stream holds no capture");
    cr_assert_eq(ended.calls, 0, "the run goes on");
    fake_up_body(last_up(), TCONT);
    cr_assert_eq(agw_relay_set_captures(set), 1, "the next delta makes a new one");
    fake_up_body(last_up(), TEND FIN);
    cr_assert(req->finished);
    assert_types(req, "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT "
                      "TEXT_MESSAGE_END RUN_FINISHED");
    fake_req_close(req);
    fake_req_free(req);
    cr_assert_eq(ended.calls, 1);
    cr_assert_eq(agw_relay_set_captures(set), 0);
    agw_store_close(st);
}

Test(relay, heartbeats_and_the_probe_of_a_half_closed_client)
{
    struct agw_req *req = fake_req_new();
    struct opts o = {.heartbeat_ms = 20};

    start(req, &o);
    fake_up_head(last_up(), 200, SSE);
    fake_up_body(last_up(), START);
    run_loop_ms(70);
    char *b = body_of(req);
    cr_assert(strstr(b, ": ping\n\n") != NULL, "an idle stream gets heartbeats: %s", b);
    free(b);
    fake_req_close(req);
    fake_req_free(req);

    struct opts quiet = {.heartbeat_ms = 60000};
    req = fake_req_new();
    start(req, &quiet);
    fake_up_head(last_up(), 200, SSE);
    fake_up_body(last_up(), START);
    evbuffer_drain(req->body, evbuffer_get_length(req->body));
    fake_req_half_close(req);
    b = body_of(req);
    cr_assert_str_eq(b, ": ping\n\n", "a half-closed client is probed at once");
    free(b);
    run_loop_ms(250);
    b = body_of(req);
    cr_assert_str_eq(b, ": ping\n\n: ping\n\n", "… and once more shortly after");
    free(b);
    fake_req_close(req);
    fake_req_free(req);

    /* half-closed before the stream started: probed as it starts */
    req = fake_req_new();
    start(req, &quiet);
    req->half_closed = true;
    fake_up_head(last_up(), 200, SSE);
    b = body_of(req);
    cr_assert_str_eq(b, ": ping\n\n");
    free(b);
    fake_req_close(req);
    fake_req_free(req);
}

/* A write finds the client gone and the server ends the request at once, inside the upstream's
 * on_body: the relay must live until that callback returns (then it is freed, once). */
Test(relay, never_freed_inside_its_own_callback)
{
    struct agw_req *req = fake_req_new();
    struct opts o = {0};

    start(req, &o);
    fake_up_head(last_up(), 200, SSE);
    req->close_on_write = 1;
    fake_up_body(last_up(), START TSTART); /* the write closes the request inside on_body */
    cr_assert(req->gone);
    cr_assert_eq(ended.calls, 1, "freed once, after on_body returned (on_end checks the depth)");
    cr_assert_str_eq(ended.outcome, "client_closed");
    cr_assert(last_up()->closed);
    cr_assert_eq(agw_relay_set_count(set), 0);
    fake_req_free(req);

    /* the same with detach: the run goes on after the callback */
    struct opts d = {.detach = true};
    req = fake_req_new();
    start(req, &d);
    fake_up_head(last_up(), 200, SSE);
    req->close_on_write = 1;
    fake_up_body(last_up(), START TSTART);
    cr_assert_eq(ended.calls, 1, "detached, not ended");
    fake_up_body(last_up(), TEND FIN);
    cr_assert_eq(ended.calls, 2);
    cr_assert(ended.detached);
    fake_req_free(req);
}

/* Frames the normaliser passes unchanged leave as they were read, byte for byte and in order,
 * around one it rewrites (a null field removed) and one it drops ([DONE]); the relay frames what
 * the normaliser makes and merges the runs of passed frames itself. */
Test(relay, passed_frames_leave_byte_for_byte)
{
    struct agw_req *req = fake_req_new();
    struct opts o = {0};
    static const char in[] =
        START TSTART TCONT "data: {\"type\":\"CUSTOM\",\"name\":\"x\",\"value\":1,\"v\":null}\n\n"
                           "data: [DONE]\n\n" TCONT TEND FIN;
    static const char want[] = START TSTART TCONT
        "data: {\"type\":\"CUSTOM\",\"name\":\"x\",\"value\":1}\n\n" TCONT TEND FIN;

    start(req, &o);
    fake_up_head(last_up(), 200, SSE);
    fake_up_body(last_up(), in);
    char *b = body_of(req);
    cr_assert_str_eq(b, want);
    free(b);
    fake_req_close(req);
    fake_req_free(req);
}
