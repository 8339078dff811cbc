/* The relay: one client stream ↔ one upstream exchange. See include/agw/relay.h for the states and
 * doc/internals/relay.md for the design (backpressure, timers, ownership).
 *
 * Lifetime rule: a relay is freed only from the client request's close callback (the request is
 * gone), and never while one of its own callbacks is on the stack: `busy` counts them, and a close
 * that arrives inside one (it cannot today, since libevent never writes synchronously, but the rule
 * is cheap) is deferred. */
#include "config.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "agw/agui.h"
#include "agw/log.h"
#include "agw/relay.h"
#include "agw/sse.h"

enum relay_state {
    RL_ST_CONNECTING = 0,
    RL_ST_STREAMING,
    RL_ST_FINISHING,
    RL_ST_CLOSED,
};

static const char *const state_names[] = {"CONNECTING", "STREAMING", "FINISHING", "CLOSED"};

struct agw_relay_set {
    struct event_base *base;
    TAILQ_HEAD(, agw_relay) relays;
    size_t count;
};

struct agw_relay {
    struct agw_relay_set *set;
    TAILQ_ENTRY(agw_relay) link;
    enum relay_state state;
    struct agw_req *req; /* NULL once the client's request is gone */
    struct agw_upstream *up;
    struct agw_sse_parser *sse;
    struct agw_agui *agui;
    struct evbuffer *out;    /* client frames produced and not yet handed to the server */
    struct event *heartbeat; /* the heartbeat period, or a probe of a half-closed client */
    struct event *run_timer;
    uint64_t last_write_ms;
    /* parameters (owned copies) */
    char *agent_id, *thread_id, *run_id;
    char *body;
    size_t body_len;
    struct agw_upstream_header *headers;
    char **header_strings;
    size_t n_headers;
    struct agw_upstream_pool **backends;
    size_t n_backends;
    size_t attempt;      /* index into backends of the current try */
    unsigned tries_left; /* further backends that may be tried */
    size_t stream_buffer_bytes;
    uint32_t heartbeat_ms;
    agw_relay_end_fn *on_end;
    void *arg;
    /* accounting */
    uint64_t start_ms;
    uint64_t bytes_out;
    int status; /* HTTP status sent to the client, 0 until then */
    const char *outcome;
    enum agw_up_failure upstream_error; /* the last upstream failure, or AGW_UP_OK */
    uint64_t connect_ms, first_byte_ms;
    char request_id[72];
    unsigned busy;
    bool free_pending;
    /* the active-run registry */
    struct agw_runs *runs;
    struct agw_run_entry *entry; /* while registered */
    bool detach;                 /* the agent's on_client_disconnect is "detach" */
    bool detached;               /* the client left and the run goes on */
    bool cancelled;              /* agw_relay_cancel(): close the upstream rather than drain it */
    bool probe;      /* the heartbeat timer is a probe: write a ping whatever the time */
    bool defer_head; /* the client's 200 waits for the first event (a decision's answer): until
                        then (status 0) a failure or an empty stream is answered with 502 */
};

static void relay_free(struct agw_relay *r);

static void set_state(struct agw_relay *r, enum relay_state st)
{
    agw_log_debug("req=%s relay %s -> %s", r->request_id, state_names[r->state], state_names[st]);
    r->state = st;
}

static void enter(struct agw_relay *r)
{
    r->busy++;
}

static void leave(struct agw_relay *r)
{
    if (--r->busy == 0 && r->free_pending)
        relay_free(r);
}

/* ---- writing to the client ---------------------------------------------------------------- */

static void arm_heartbeat(struct agw_relay *r, uint32_t ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};

    evtimer_add(r->heartbeat, &tv);
}

static void client_drain(struct agw_req *req, void *arg);
static void probe_client(struct agw_relay *r);

/* Sends the client its 200 and the stream's headers. */
static void start_client_stream(struct agw_relay *r)
{
    agw_req_add_header(r->req, "Content-Type", "text/event-stream");
    agw_req_add_header(r->req, "Cache-Control", "no-cache");
    agw_req_add_header(r->req, "X-Accel-Buffering", "no");
    r->status = 200;
    agw_req_stream_start(r->req, 200, r->stream_buffer_bytes / 2, client_drain);
    r->last_write_ms = agw_now_ms();
    if (agw_req_half_closed(r->req))
        probe_client(r);
    else if (r->heartbeat_ms > 0)
        arm_heartbeat(r, r->heartbeat_ms);
}

/* Hands <out> to the client; with <last>, ends the response too (in the same write when it can). */
static void flush_out(struct agw_relay *r, bool last)
{
    size_t n = evbuffer_get_length(r->out);

    if (r->req == NULL) { /* detached: nobody to write to */
        evbuffer_drain(r->out, n);
        return;
    }
    if (r->status == 0) { /* a deferred head: the first events are here */
        if (n == 0 && !last)
            return;
        start_client_stream(r);
    }
    r->bytes_out += n;
    if (last) {
        agw_req_stream_finish(r->req, r->out);
        return;
    }
    if (n == 0)
        return;
    agw_req_stream_write(r->req, r->out);
    r->last_write_ms = agw_now_ms();
}

/* The heartbeat timer is lazy: it is armed once per period and, when it fires, writes ": ping" only
 * if nothing was written for a whole period; otherwise it sleeps for the rest of the period. No
 * timer work is done per frame. */
static void heartbeat_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_relay *r = arg;
    uint64_t now = agw_now_ms(), idle = now - r->last_write_ms;

    (void)fd;
    (void)what;
    if (r->state != RL_ST_STREAMING || r->req == NULL || r->status == 0)
        return;
    if (r->probe) {
        r->probe = false;
        enter(r);
        agw_sse_write_comment(r->out, "ping");
        flush_out(r, false);
        leave(r);
        if (r->heartbeat_ms > 0)
            arm_heartbeat(r, r->heartbeat_ms);
        return;
    }
    if (idle + 5 >= r->heartbeat_ms) {
        enter(r);
        agw_sse_write_comment(r->out, "ping");
        flush_out(r, false);
        leave(r);
        arm_heartbeat(r, r->heartbeat_ms);
    } else {
        arm_heartbeat(r, (uint32_t)(r->heartbeat_ms - idle));
    }
}

/* The client closed its sending side: it may be a half-close (it still reads) or a close, which
 * only writing shows (the first write draws a reset, the next one fails and the server's close
 * callback ends the run). So write a ping now and another one shortly. */
#define PROBE_MS 100

static void probe_client(struct agw_relay *r)
{
    agw_sse_write_comment(r->out, "ping");
    flush_out(r, false);
    r->probe = true;
    evtimer_del(r->heartbeat);
    arm_heartbeat(r, PROBE_MS);
}

static void client_half_close(struct agw_req *req, void *arg)
{
    struct agw_relay *r = arg;

    (void)req;
    enter(r);
    if (r->state == RL_ST_STREAMING && r->req != NULL && r->status != 0)
        probe_client(r);
    leave(r);
}

static void unregister(struct agw_relay *r)
{
    if (r->entry != NULL) {
        agw_runs_remove(r->runs, r->entry);
        r->entry = NULL;
    }
}

/* A detached run has no request whose close would free it: it frees itself when it ends. Called
 * from inside enter()/leave() only, so the free happens as the outermost callback returns. */
static void end_if_detached(struct agw_relay *r)
{
    if (r->req == NULL && r->detached) {
        set_state(r, RL_ST_CLOSED);
        r->free_pending = true;
    }
}

/* The terminal event is in r->out: write it, end the chunked body, drop the upstream. */
static void finish(struct agw_relay *r)
{
    if (r->state != RL_ST_STREAMING)
        return;
    r->outcome = agw_agui_outcome(r->agui);
    unregister(r);
    if (r->up != NULL) {
        r->connect_ms = agw_upstream_connect_ms(r->up);
        r->first_byte_ms = agw_upstream_first_byte_ms(r->up);
        /* The backend's response usually ends right after the terminal event: let it, so its
         * connection can serve the next run. A cancelled run's backend must see the close. */
        if (r->cancelled)
            agw_upstream_close(r->up);
        else
            agw_upstream_release(r->up);
        r->up = NULL;
    }
    evtimer_del(r->heartbeat);
    evtimer_del(r->run_timer);
    set_state(r, RL_ST_FINISHING);
    if (r->req != NULL)
        flush_out(r, true);
    end_if_detached(r);
}

static void fail_stream(struct agw_relay *r, const char *code, const char *message)
{
    agw_agui_fail(r->agui, code, message, r->out);
    finish(r);
}

/* ---- before the stream: answering with an error or trying the next backend
 * --------------------------- */

static void start_attempt(struct agw_relay *r);

static void reply_error(struct agw_relay *r, int status, const char *msg)
{
    unregister(r);
    if (r->up != NULL) {
        agw_upstream_close(r->up);
        r->up = NULL;
    }
    evtimer_del(r->run_timer);
    set_state(r, RL_ST_FINISHING);
    if (r->outcome == NULL)
        r->outcome = "upstream_error";
    if (r->req != NULL) {
        r->status = status;
        agw_req_reply_error(r->req, status, "%s", msg);
    }
    end_if_detached(r);
}

/* A failure before the first byte: the next backend is tried when retries remain. */
static bool retry(struct agw_relay *r)
{
    if (r->tries_left == 0 || r->n_backends == 0)
        return false;
    r->tries_left--;
    r->attempt = (r->attempt + 1) % r->n_backends;
    if (r->up != NULL) {
        agw_upstream_close(r->up);
        r->up = NULL;
    }
    agw_log_info("req=%s retrying on backend %s", r->request_id,
                 agw_upstream_pool_url(r->backends[r->attempt])->authority);
    start_attempt(r);
    return true;
}

/* ---- upstream callbacks ------------------------------------------------------------------- */

static const char *current_authority(const struct agw_relay *r)
{
    return agw_upstream_pool_url(r->backends[r->attempt])->authority;
}

static void up_on_head(void *arg, const struct agw_http1_response *resp)
{
    struct agw_relay *r = arg;
    char detail[160];

    enter(r);
    if (resp->status >= 500 && retry(r))
        goto out;
    if (resp->status < 200 || resp->status > 299) {
        r->upstream_error = AGW_UP_STATUS;
        snprintf(detail, sizeof(detail), "bad gateway: the upstream answered HTTP %d",
                 resp->status);
        reply_error(r, 502, detail);
        goto out;
    }
    if (!agw_is_event_stream(resp->content_type)) {
        r->upstream_error = AGW_UP_CONTENT_TYPE;
        snprintf(
            detail, sizeof(detail),
            "bad gateway: the upstream answered with Content-Type %.80s, not text/event-stream",
            resp->content_type ? resp->content_type : "(none)");
        reply_error(r, 502, detail);
        goto out;
    }
    set_state(r, RL_ST_STREAMING);
    if (r->runs != NULL) {
        const struct agw_url *u = agw_upstream_pool_url(r->backends[r->attempt]);
        r->entry = agw_runs_add(r->runs, r->agent_id, r->thread_id, r->run_id, u->text,
                                r->backends[r->attempt], r);
    }
    if (r->req == NULL) /* detached before the upstream answered: the run goes on alone */
        goto out;
    if (!r->defer_head)
        start_client_stream(r);
out:
    leave(r);
}

static int frame_cb(void *arg, const struct agw_sse_frame *f)
{
    struct agw_relay *r = arg;
    int rc = f->framed ? agw_agui_feed_framed(r->agui, f->data, f->data_len, r->out)
                       : agw_agui_feed(r->agui, f->data, f->data_len, r->out);

    /* 1 = terminal event reached: stop parsing, the rest of the upstream's bytes are not wanted. */
    return rc == 1 ? -1 : 0;
}

/* Parses the body bytes <body> holds, segment by segment, in place: the frames the normaliser
 * relays unchanged are appended to <out> straight from the segment, in one piece per run of them
 * (agw_agui_feed_framed()), before the segment is drained. Returns what agw_sse_parse_bytes()
 * returned last (< 0 stops). */
static int parse_body(struct agw_relay *r, struct evbuffer *body)
{
    struct evbuffer_iovec v;
    int rc = 0;

    while (rc >= 0 && evbuffer_peek(body, -1, NULL, &v, 1) > 0) {
        rc = agw_sse_parse_bytes(r->sse, v.iov_base, v.iov_len, frame_cb, r);
        agw_agui_flush(r->agui);
        evbuffer_drain(body, v.iov_len);
    }
    evbuffer_drain(body, evbuffer_get_length(body));
    return rc;
}

static void up_on_body(void *arg, struct evbuffer *body)
{
    struct agw_relay *r = arg;
    int rc;

    enter(r);
    if (r->state != RL_ST_STREAMING) {
        evbuffer_drain(body, evbuffer_get_length(body));
        goto out;
    }
    /* The frames written out are about as long as the bytes read: one chain for all of them
     * rather than a small one per kilobyte. */
    evbuffer_expand(r->out, evbuffer_get_length(body) + 256);
    rc = parse_body(r, body);
    if (rc == -AGW_ETOOBIG) {
        fail_stream(r, AGW_AGUI_FRAME_TOO_LARGE,
                    "an upstream event exceeded limits.max_frame_bytes");
        goto out;
    }
    if (agw_agui_finished(r->agui)) {
        finish(r);
        goto out;
    }
    flush_out(r, false);
    /* Backpressure: stop reading the upstream while the client's queue is above the limit; the
     * server's drain callback resumes it. */
    if (r->req != NULL && r->up != NULL && agw_req_out_pending(r->req) > r->stream_buffer_bytes)
        agw_upstream_pause(r->up);
out:
    leave(r);
}

static int frame_end_cb(void *arg, const struct agw_sse_frame *f)
{
    return frame_cb(arg, f);
}

static void up_on_done(void *arg)
{
    struct agw_relay *r = arg;

    enter(r);
    if (r->state == RL_ST_STREAMING) {
        int rc = agw_sse_finish(r->sse, frame_end_cb, r);
        if (rc == -AGW_ETOOBIG)
            agw_agui_fail(r->agui, AGW_AGUI_FRAME_TOO_LARGE,
                          "an upstream event exceeded limits.max_frame_bytes", r->out);
        if (r->status == 0 && r->req != NULL && agw_agui_events_out(r->agui) == 0) {
            /* A deferred head and not one event: the backend did not take the decision (an
             * agent that answers "already running" with an empty stream). */
            r->upstream_error = AGW_UP_EMPTY_STREAM;
            reply_error(r, 502,
                        "bad gateway: the backend answered with an empty event stream (it did not "
                        "take the decision)");
            goto out;
        }
        agw_agui_end(r->agui, r->out);
        finish(r);
    }
out:
    leave(r);
}

static void up_on_error(void *arg, enum agw_up_failure kind, const char *detail)
{
    struct agw_relay *r = arg;
    char msg[256];

    enter(r);
    r->upstream_error = kind;
    agw_log_warn("req=%s upstream %s: %s: %s", r->request_id, current_authority(r),
                 agw_up_failure_name(kind), detail);
    if (r->state == RL_ST_CONNECTING) {
        if (kind != AGW_UP_PROTOCOL && retry(r))
            goto out;
        bool timeout = kind == AGW_UP_FIRST_BYTE_TIMEOUT;
        snprintf(msg, sizeof(msg), "%s: %s", timeout ? "gateway timeout" : "bad gateway", detail);
        reply_error(r, timeout ? 504 : 502, msg);
        goto out;
    }
    if (r->state == RL_ST_STREAMING && r->status == 0 && r->req != NULL) {
        snprintf(msg, sizeof(msg), "bad gateway: %s", detail); /* a deferred head: no stream yet */
        reply_error(r, 502, msg);
        goto out;
    }
    if (r->state == RL_ST_STREAMING) {
        const char *code = kind == AGW_UP_IDLE_TIMEOUT ? AGW_AGUI_TIMEOUT : AGW_AGUI_UPSTREAM_ERROR;
        snprintf(msg, sizeof(msg), "upstream failed: %s", detail);
        fail_stream(r, code, msg);
    }
out:
    leave(r);
}

static const struct agw_upstream_callbacks up_cbs = {
    .on_head = up_on_head,
    .on_body = up_on_body,
    .on_done = up_on_done,
    .on_error = up_on_error,
};

static void start_attempt(struct agw_relay *r)
{
    r->up = agw_upstream_start(r->backends[r->attempt], r->headers, r->n_headers, r->body,
                               r->body_len, &up_cbs, r);
}

/* ---- client callbacks and timers ---------------------------------------------------------- */

static void client_drain(struct agw_req *req, void *arg)
{
    struct agw_relay *r = arg;

    (void)req;
    if (r->up != NULL && r->state == RL_ST_STREAMING)
        agw_upstream_resume(r->up);
}

static void client_close(struct agw_req *req, void *arg)
{
    struct agw_relay *r = arg;

    (void)req;
    r->req = NULL;
    if ((r->state == RL_ST_CONNECTING || r->state == RL_ST_STREAMING) && r->detach) {
        /* The run goes on without its client: backpressure and heartbeats no longer apply. */
        agw_log_info("req=%s client went away; the run goes on detached", r->request_id);
        r->detached = true;
        evtimer_del(r->heartbeat);
        if (r->up != NULL && r->state == RL_ST_STREAMING)
            agw_upstream_resume(r->up);
        return;
    }
    if (r->state == RL_ST_CONNECTING || r->state == RL_ST_STREAMING) {
        r->outcome = "client_closed";
        agw_log_info("req=%s client went away; closing the upstream", r->request_id);
    }
    unregister(r);
    if (r->up != NULL) {
        r->connect_ms = agw_upstream_connect_ms(r->up);
        r->first_byte_ms = agw_upstream_first_byte_ms(r->up);
        agw_upstream_close(r->up);
        r->up = NULL;
    }
    set_state(r, RL_ST_CLOSED);
    if (r->busy > 0)
        r->free_pending = true;
    else
        relay_free(r);
}

static void run_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_relay *r = arg;

    (void)fd;
    (void)what;
    enter(r);
    if (r->state == RL_ST_CONNECTING) {
        r->outcome = "timeout";
        reply_error(r, 504, "gateway timeout: the run exceeded timeouts.run");
    } else if (r->state == RL_ST_STREAMING) {
        fail_stream(r, AGW_AGUI_TIMEOUT, "the run exceeded timeouts.run");
    }
    leave(r);
}

/* ---- life ------------------------------------------------------------------------------ */

static struct agw_relay *relay_new(struct agw_relay_set *set, const struct agw_relay_params *p)
{
    struct agw_relay *r = agw_xcalloc(1, sizeof(*r));

    r->set = set;
    r->req = p->req;
    r->agent_id = agw_xstrdup(p->agent_id);
    r->thread_id = agw_xstrdup(p->thread_id);
    r->run_id = agw_xstrdup(p->run_id);
    r->body = agw_xstrndup(p->body, p->body_len);
    r->body_len = p->body_len;
    r->n_headers = p->n_headers;
    r->headers = agw_xcalloc(p->n_headers, sizeof(*r->headers));
    r->header_strings = agw_xcalloc(2 * p->n_headers, sizeof(char *));
    for (size_t i = 0; i < p->n_headers; i++) {
        r->header_strings[2 * i] = agw_xstrdup(p->headers[i].name);
        r->header_strings[2 * i + 1] = agw_xstrdup(p->headers[i].value);
        r->headers[i].name = r->header_strings[2 * i];
        r->headers[i].value = r->header_strings[2 * i + 1];
    }
    r->n_backends = p->n_backends;
    r->backends = agw_xcalloc(p->n_backends, sizeof(*r->backends));
    memcpy(r->backends, p->backends, p->n_backends * sizeof(*r->backends));
    r->tries_left =
        p->n_backends > 1
            ? (p->retries < p->n_backends - 1 ? p->retries : (unsigned)p->n_backends - 1)
            : 0;
    r->stream_buffer_bytes = p->stream_buffer_bytes;
    r->heartbeat_ms = p->heartbeat_ms;
    r->on_end = p->on_end;
    r->arg = p->arg;
    r->runs = p->runs;
    r->detach = p->detach;
    r->start_ms = agw_now_ms();
    snprintf(r->request_id, sizeof(r->request_id), "%s", agw_req_id(p->req));
    r->sse = agw_sse_parser_new(p->max_frame_bytes);
    r->agui = agw_agui_new(p->thread_id, p->run_id, p->protocol);
    r->out = evbuffer_new();
    r->heartbeat = evtimer_new(set->base, heartbeat_cb, r);
    r->run_timer = evtimer_new(set->base, run_timer_cb, r);
    if (p->run_ms > 0) {
        struct timeval tv = {.tv_sec = p->run_ms / 1000, .tv_usec = (p->run_ms % 1000) * 1000};
        evtimer_add(r->run_timer, &tv);
    }
    TAILQ_INSERT_TAIL(&set->relays, r, link);
    set->count++;
    agw_req_on_close(p->req, client_close, r);
    agw_req_on_half_close(p->req, client_half_close);
    return r;
}

struct agw_relay *agw_relay_start(struct agw_relay_set *set, const struct agw_relay_params *p)
{
    struct agw_relay *r = relay_new(set, p);

    start_attempt(r);
    return r;
}

struct agw_relay *agw_relay_adopt(struct agw_relay_set *set, const struct agw_relay_params *p,
                                  struct agw_upstream *up, const struct agw_http1_response *resp)
{
    struct agw_relay *r = relay_new(set, p);

    assert(p->n_backends == 1);
    r->defer_head = true;
    r->up = up;
    agw_upstream_set_callbacks(up, &up_cbs, r);
    up_on_head(r, resp);
    return r;
}

static void relay_free(struct agw_relay *r)
{
    struct agw_relay_summary s = {
        .request_id = r->request_id,
        .agent_id = r->agent_id,
        .thread_id = r->thread_id,
        .run_id = r->run_id,
        .status = r->status,
        .events = agw_agui_events_out(r->agui),
        .bytes = r->bytes_out,
        .duration_ms = agw_now_ms() - r->start_ms,
        .upstream = r->n_backends > 0 ? current_authority(r) : NULL,
        .outcome = r->outcome != NULL ? r->outcome : "client_closed",
        .upstream_error = r->upstream_error,
        .connect_ms = r->connect_ms,
        .first_byte_ms = r->first_byte_ms,
        .detached = r->detached,
    };

    if (r->on_end != NULL)
        r->on_end(r->arg, &s);
    TAILQ_REMOVE(&r->set->relays, r, link);
    r->set->count--;
    unregister(r);
    agw_upstream_close(r->up);
    event_free(r->heartbeat);
    event_free(r->run_timer);
    evbuffer_free(r->out);
    agw_agui_free(r->agui);
    agw_sse_parser_free(r->sse);
    for (size_t i = 0; i < 2 * r->n_headers; i++)
        free(r->header_strings[i]);
    free(r->header_strings);
    free(r->headers);
    free(r->backends);
    free(r->body);
    free(r->agent_id);
    free(r->thread_id);
    free(r->run_id);
    free(r);
}

struct agw_relay_set *agw_relay_set_new(struct event_base *base)
{
    struct agw_relay_set *set = agw_xcalloc(1, sizeof(*set));

    set->base = base;
    TAILQ_INIT(&set->relays);
    return set;
}

void agw_relay_set_free(struct agw_relay_set *set)
{
    struct agw_relay *r;

    if (set == NULL)
        return;
    while ((r = TAILQ_FIRST(&set->relays)) != NULL) {
        assert(r->req == NULL && r->busy == 0);
        if (r->outcome == NULL)
            r->outcome = "closed";
        relay_free(r);
    }
    free(set);
}

void agw_relay_cancel(struct agw_relay *r)
{
    enter(r);
    if (r->state == RL_ST_STREAMING) {
        agw_log_info("req=%s run cancelled", r->request_id);
        r->cancelled = true;
        fail_stream(r, AGW_AGUI_CANCELLED, "the run was cancelled");
    }
    leave(r);
}

size_t agw_relay_set_count(const struct agw_relay_set *set)
{
    return set->count;
}

void agw_relay_set_shutdown(struct agw_relay_set *set)
{
    struct agw_relay *r, *next;

    for (r = TAILQ_FIRST(&set->relays); r != NULL; r = next) {
        next = TAILQ_NEXT(r, link);
        enter(r);
        if (r->state == RL_ST_CONNECTING) {
            r->outcome = "shutdown";
            reply_error(r, 503, "service unavailable: the gateway is shutting down");
        } else if (r->state == RL_ST_STREAMING) {
            fail_stream(r, AGW_AGUI_SHUTDOWN, "the gateway is shutting down");
        }
        leave(r);
    }
}
