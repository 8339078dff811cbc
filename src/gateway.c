/* The gateway's wiring and routing: configuration → event loop, listeners, upstream pools, relays,
 * signals and drain; the request handler that routes every endpoint (auth, validation, balancing,
 * starting runs). Decisions and cancellation are in src/decision.c, the counters in src/metrics.c,
 * the backend order in src/balance.c, the access log's format in src/log.c. */
#include "config.h"

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <jansson.h>

#include "agw/balance.h"
#include "agw/decision.h"
#include "agw/input.h"
#include "agw/log.h"
#include "agw/router.h"
#include "agw/tls.h"

#include "gateway_internal.h"

#define DRAIN_POLL_MS  100
#define DRAIN_GRACE_MS 2000 /* after SHUTDOWN events are written, time for clients to take them */

/* ---- metrics ----------------------------------------------------------------------------------
 */

/* The counters are the process's; the gauges and the server statistics are summed over the
 * workers. */
static void serve_metrics(struct agw_worker *w, struct agw_req *req)
{
    static const int statuses[] = AGW_SERVER_REFUSAL_STATUSES;
    struct agw_gateway *gw = w->gw;
    uint64_t refused[AGW_SERVER_N_REFUSALS] = {0}, accept_errors = 0;
    size_t open_relays = 0;
    struct evbuffer *b = evbuffer_new();
    size_t len;

    for (unsigned k = 0; k < gw->n_workers; k++) {
        struct agw_server *servers[2] = {gw->workers[k].srv, gw->workers[k].admin};
        for (size_t s = 0; s < 2; s++) {
            struct agw_server_stats st;
            if (servers[s] == NULL)
                continue;
            agw_server_get_stats(servers[s], &st);
            accept_errors += st.accept_errors;
            for (size_t i = 0; i < AGW_SERVER_N_REFUSALS; i++)
                refused[i] += st.refused[i];
        }
        open_relays += agw_relay_set_count(gw->workers[k].relays);
    }
    struct agw_metrics_gauges g = {
        .active_runs = agw_runs_count(w->runs),
        .open_relays = open_relays,
        .accept_errors = accept_errors,
        .refusal_statuses = statuses,
        .refused = refused,
        .n_refusals = AGW_SERVER_N_REFUSALS,
        .loop_lag_max_us = -1,
    };
    struct agw_store_stats hs;
    if (gw->store != NULL) {
        agw_store_get_stats(gw->store, &hs);
        g.history = &hs;
    }
    for (unsigned k = 0; k < gw->n_workers; k++) {
        struct agw_worker *o = &gw->workers[k];
        int64_t lag = (int64_t)__atomic_load_n(&o->lag_max_us, __ATOMIC_RELAXED);
        if (o->lag_probe != NULL && lag > g.loop_lag_max_us)
            g.loop_lag_max_us = lag;
    }
    agw_metrics_write(w->metrics, &g, b);
    len = evbuffer_get_length(b);
    agw_req_reply(req, 200, "text/plain; version=0.0.4", (const char *)evbuffer_pullup(b, -1), len);
    evbuffer_free(b);
}

/* ---- access log ------------------------------------------------------------------------------ */

/* What the access log says of a request: borrowed from the request while it is alive
 * (req_info_of), or copied when the line is written later, after the request may be gone (a
 * detached run, a decision: req_info_copy, then req_info_clear). */

struct req_info agw_gw_req_info(const struct agw_worker *w, const struct agw_req *req)
{
    return (struct req_info){agw_req_id(req),   agw_req_peer(req), agw_req_method_name(req),
                             agw_req_path(req), w->index,          NULL};
}

void agw_gw_req_info_copy(const struct agw_worker *w, struct req_info *ri,
                          const struct agw_req *req)
{
    ri->worker = w->index;
    if (!agw_log_access_enabled())
        return; /* no line will be written: nothing to keep (agw_gw_access_log() returns at once) */
    const char *src[4] = {agw_req_id(req), agw_req_peer(req), agw_req_method_name(req),
                          agw_req_path(req)};
    const char **dst[4] = {&ri->id, &ri->peer, &ri->method, &ri->path};
    size_t len[4], total = 0;
    char *p;

    for (size_t i = 0; i < 4; i++) {
        if (src[i] == NULL) /* libevhtp has no name for an unknown method */
            src[i] = "";
        total += (len[i] = strlen(src[i])) + 1;
    }
    p = ri->copy = agw_xmalloc(total);
    for (size_t i = 0; i < 4; i++) {
        memcpy(p, src[i], len[i] + 1);
        *dst[i] = p;
        p += len[i] + 1;
    }
}

void agw_gw_req_info_clear(struct req_info *ri)
{
    free(ri->copy);
    ri->copy = NULL;
}

void agw_gw_access_log(const struct req_info *ri, const char *agent, const char *thread,
                       const char *run, const char *key_id, int status, uint64_t events,
                       uint64_t bytes, uint64_t duration_ms, const char *upstream,
                       const char *outcome, bool detached)
{
    struct agw_access_record r = {
        .request_id = ri->id,
        .client = ri->peer,
        .method = ri->method,
        .path = ri->path,
        .agent = agent,
        .thread = thread,
        .run = run,
        .key = key_id,
        .status = status,
        .events = events,
        .bytes = bytes,
        .duration_ms = duration_ms,
        .upstream = upstream,
        .outcome = outcome,
        .detached = detached,
        .worker = (int)ri->worker,
    };

    agw_log_access_record(&r);
}

/* Answers 202 {"status":<status>,"threadId":…,"runId":…} (the ids are valid UTF-8: they come from
 * parsed JSON through the run registry). */
void agw_gw_reply_accepted(struct agw_req *req, const char *status, const char *thread,
                           const char *run)
{
    json_t *o = json_pack("{s:s,s:s,s:s}", "status", status, "threadId", thread, "runId", run);
    char *txt = o != NULL ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;

    if (txt == NULL)
        abort(); /* out of memory */
    agw_req_reply(req, 202, "application/json", txt, strlen(txt));
    free(txt);
    json_decref(o);
}

/* Answers an error, logs and counts it. */
void agw_gw_reply_error(struct agw_worker *w, struct agw_req *req, const char *agent, int status,
                        const char *msg)
{
    struct req_info ri = agw_gw_req_info(w, req);

    agw_req_reply_error(req, status, "%s", msg);
    agw_metrics_request(w->metrics, agent, status);
    agw_gw_access_log(&ri, agent, NULL, NULL, NULL, status, 0, 0,
                      agw_now_ms() - agw_req_start_ms(req), NULL, "error", false);
}

/* ---- runs --------------------------------------------------------------------------------------
 */

void agw_gw_run_ended(void *arg, const struct agw_relay_summary *s)
{
    struct run_ctx *rc = arg;
    struct agw_worker *w = rc->w;

    agw_metrics_add(w->metrics, AGW_C_EVENTS, s->events);
    agw_metrics_add(w->metrics, AGW_C_BYTES, s->bytes);
    agw_metrics_request(w->metrics, s->agent_id, s->status ? s->status : 499);
    agw_metrics_upstream_failure(w->metrics, s->upstream_error);
    agw_gw_access_log(&rc->ri, s->agent_id, s->thread_id, s->run_id, rc->key_id, s->status,
                      s->events, s->bytes, s->duration_ms, s->upstream, s->outcome, s->detached);
    agw_gw_req_info_clear(&rc->ri);
    free(rc);
}

static bool traceparent_ok(const char *v)
{
    /* version "00" - 32 hex trace id - 16 hex parent id - 2 hex flags */
    static const char shape[] = "xx-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-xxxxxxxxxxxxxxxx-xx";

    if (v == NULL || strlen(v) != sizeof(shape) - 1)
        return false;
    for (size_t i = 0; shape[i]; i++) {
        char c = v[i];
        if (shape[i] == '-' ? c != '-' : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
    }
    return strncmp(v, "ff", 2) != 0;
}

struct fwd_ctx {
    const struct agw_agent_config *agent;
    struct agw_upstream_header *h;
    size_t *n;
};

static void forward_header(const char *name, const char *value, void *arg)
{
    struct fwd_ctx *fc = arg;

    for (size_t i = 0; i < fc->agent->n_forward_headers; i++) {
        if (*fc->n < AGW_MAX_UPSTREAM_HEADERS &&
            agw_strieq_n(name, strlen(name), fc->agent->forward_headers[i])) {
            fc->h[*fc->n].name = name;
            fc->h[*fc->n].value = value;
            (*fc->n)++;
            return;
        }
    }
}

/* Bearer auth for everything under /v1/ (doc/protocol.md#auth). <agent_id> NULL: any valid key will
 * do. Answers 401 or 403 itself and returns false; on success *<key> is the matching key (NULL with
 * auth off).
 */
bool agw_gw_authorize(struct agw_worker *w, struct agw_req *req, const char *agent_id,
                      const struct agw_auth_key **key)
{
    char msg[AGW_ID_MAX + 80];
    /* Counted by agent only when the agent exists: a client cannot grow the metrics' table. */
    const char *counted =
        agent_id != NULL && agw_config_find_agent(w->cfg, agent_id) != NULL ? agent_id : NULL;

    switch (agw_auth_check(&w->cfg->auth, agw_req_header(req, "Authorization"), agent_id, key)) {
    case AGW_AUTH_OK:
        return true;
    case AGW_AUTH_FORBIDDEN:
        agw_metrics_add(w->metrics, AGW_C_AUTH_FAILURES, 1);
        snprintf(msg, sizeof(msg), "forbidden: this key may not use agent '%s'", agent_id);
        agw_gw_reply_error(w, req, counted, 403, msg);
        return false;
    default:
        agw_metrics_add(w->metrics, AGW_C_AUTH_FAILURES, 1);
        agw_req_add_header(req, "WWW-Authenticate", "Bearer realm=\"agui-gateway\"");
        agw_gw_reply_error(w, req, counted, 401, "unauthorized: a valid bearer token is required");
        return false;
    }
}

static void handle_run(struct agw_worker *w, struct agw_req *req, const struct agw_route *route)
{
    const struct agw_config *cfg = w->cfg;
    const struct agw_agent_config *agent;
    const struct agw_auth_key *key = NULL;
    struct agent_rt *art;
    struct agw_input in = {0};
    struct evbuffer *body = agw_req_body(req);
    size_t body_len = evbuffer_get_length(body);
    const char *body_data;
    char err[AGW_INPUT_ERR_MAX], msg[AGW_INPUT_ERR_MAX + 80];
    int status;

    if (!agw_gw_authorize(w, req, route->agent_id, &key))
        return;
    agent = agw_config_find_agent(cfg, route->agent_id);
    if (agent == NULL) {
        snprintf(msg, sizeof(msg), "agent not found: %s", route->agent_id);
        agw_gw_reply_error(w, req, NULL, 404, msg);
        return;
    }
    if (!agw_input_content_type_ok(agw_req_header(req, "Content-Type"))) {
        agw_gw_reply_error(w, req, agent->id, 415,
                           "unsupported media type: Content-Type must be application/json");
        return;
    }
    if (body_len > cfg->limits.max_body_bytes) {
        snprintf(msg, sizeof(msg), "payload too large: the limit is %zu bytes",
                 cfg->limits.max_body_bytes);
        agw_gw_reply_error(w, req, agent->id, 413, msg);
        return;
    }
    body_data = (const char *)evbuffer_pullup(body, -1);
    status =
        agw_input_parse(body_data, body_len, cfg->limits.max_json_depth, &in, err, sizeof(err));
    if (status != 0) {
        agw_gw_reply_error(w, req, agent->id, status, err);
        return;
    }

    /* Upstream request headers (doc/protocol.md#upstream-request): never the client's
     * Authorization. */
    struct agw_upstream_header h[AGW_MAX_UPSTREAM_HEADERS];
    size_t n = 0;
    char traceparent[64], trace_id[33], span_id[17];
    const char *tp = agw_req_header(req, "traceparent");
    /* Content-Type, Accept and the agent's upstream_headers are the pools' fixed header fields
     * (built at start); what depends on the request comes here. */
    h[n++] = (struct agw_upstream_header){"X-Request-Id", agw_req_id(req)};
    if (traceparent_ok(tp)) {
        h[n++] = (struct agw_upstream_header){"traceparent", tp};
    } else {
        /* 00-<32 hex trace id>-<16 hex parent id>-01, without printf */
        memcpy(traceparent, "00-", 3);
        agw_random_hex(trace_id, 16);
        memcpy(traceparent + 3, trace_id, 32);
        traceparent[35] = '-';
        agw_random_hex(span_id, 8);
        memcpy(traceparent + 36, span_id, 16);
        memcpy(traceparent + 52, "-01", 4);
        h[n++] = (struct agw_upstream_header){"traceparent", traceparent};
    }
    struct fwd_ctx fc = {agent, h, &n};
    agw_req_foreach_header(req, forward_header, &fc);

    if (in.decision_only && agent->decisions_forward != AGW_FORWARD_NEVER &&
        agw_decision_route(w, req, agent, key, &in, h, n, body_data, body_len)) {
        agw_input_clear(&in);
        return;
    }
    art = &w->agents[agent - cfg->agents];
    struct agw_upstream_pool *order[AGW_MAX_UPSTREAMS];
    {
        size_t idx[AGW_MAX_UPSTREAMS];
        agw_balance_order(agent->balance, art->keys, agent->n_upstreams, in.thread_id, &art->rr,
                          idx);
        for (size_t i = 0; i < agent->n_upstreams; i++)
            order[i] = art->pools[idx[i]];
    }

    struct run_ctx *rc = agw_xcalloc(1, sizeof(*rc));
    rc->w = w;
    agw_gw_req_info_copy(w, &rc->ri, req);
    rc->key_id = key != NULL ? key->id : NULL;
    struct agw_relay_params p = {
        .req = req,
        .agent_id = agent->id,
        .thread_id = in.thread_id,
        .run_id = in.run_id,
        .protocol = agent->protocol,
        .backends = order,
        .n_backends = agent->n_upstreams,
        .retries = agent->retries,
        .headers = h,
        .n_headers = n,
        .body = body_data,
        .body_len = body_len,
        .stream_buffer_bytes = cfg->limits.stream_buffer_bytes,
        .max_frame_bytes = cfg->limits.max_frame_bytes,
        .heartbeat_ms = cfg->timeouts.heartbeat_ms,
        .run_ms = cfg->timeouts.run_ms,
        .runs = w->runs,
        .detach = agent->on_client_disconnect == AGW_DISCONNECT_DETACH,
        .store = w->gw->store,
        .on_end = agw_gw_run_ended,
        .arg = rc,
    };
    agw_metrics_add(w->metrics, AGW_C_RUNS_STARTED, 1);
    if (w->gw->store != NULL)
        agw_store_run_input(w->gw->store, agent->id, in.thread_id, in.run_id, body_data, body_len);
    agw_relay_start(w->relays, &p);
    agw_input_clear(&in);
}

/* ---- thread history ----------------------------------------------------------------------- */

/* A read of a thread's messages, waiting for the store's answer. Freed by whichever comes second:
 * the answer, or the end of the request. */
struct thread_read {
    struct agw_worker *w;
    struct agw_req *req; /* NULL once the request is gone */
    const struct agw_auth_key *key;
    struct req_info ri;
    bool answered;
    char thread_id[AGW_ID_MAX + 1];
};

static void thread_read_free(struct thread_read *tr)
{
    agw_gw_req_info_clear(&tr->ri);
    free(tr);
}

static void thread_read_closed(struct agw_req *req, void *arg)
{
    struct thread_read *tr = arg;

    (void)req;
    tr->req = NULL;
    if (tr->answered)
        thread_read_free(tr);
}

/* A key sees a thread when it may use every agent that served it (",a,b,"): a thread never shows
 * one agent's answers to a key kept away from that agent. */
static bool key_sees(const struct agw_auth_key *key, const char *agents)
{
    const char *p = agents;
    char id[AGW_ID_MAX + 1];

    if (key == NULL) /* auth off */
        return true;
    while (*p == ',' && p[1] != '\0') {
        const char *end = strchr(p + 1, ',');
        size_t n = end != NULL ? (size_t)(end - p - 1) : 0;
        if (end == NULL || n == 0 || n > AGW_ID_MAX)
            return false;
        memcpy(id, p + 1, n);
        id[n] = '\0';
        if (!agw_auth_key_allows(key, id))
            return false;
        p = end;
    }
    return true;
}

static void thread_read_done(void *arg, const struct agw_store_page *page)
{
    struct thread_read *tr = arg;
    struct agw_req *req = tr->req;
    char msg[AGW_ID_MAX + 32];
    int status;

    tr->answered = true;
    if (req == NULL) {
        thread_read_free(tr);
        return;
    }
    if (page == NULL) {
        status = 503;
        agw_req_reply_error(req, status, "service unavailable: the gateway is shutting down");
    } else if (page->status != 200 || !key_sees(tr->key, page->agents)) {
        status = 404;
        snprintf(msg, sizeof(msg), "thread not found: %s", tr->thread_id);
        agw_req_reply_error(req, status, "%s", msg);
    } else {
        status = 200;
        agw_req_add_header(req, "Cache-Control", "no-store");
        agw_req_reply(req, status, "application/json", page->body, page->len);
    }
    agw_metrics_request(tr->w->metrics, NULL, status);
    agw_gw_access_log(&tr->ri, NULL, tr->thread_id, NULL, tr->key != NULL ? tr->key->id : NULL,
                      status, 0, 0, agw_now_ms() - agw_req_start_ms(req), NULL,
                      status == 200 ? "history" : "error", false);
    /* The request ends after the answer is written: thread_read_closed() frees <tr>. */
}

static void handle_thread_messages(struct agw_worker *w, struct agw_req *req,
                                   const struct agw_route *route)
{
    const struct agw_auth_key *key = NULL;
    struct agw_history_query q;
    struct thread_read *tr;
    char err[160];

    if (!agw_gw_authorize(w, req, NULL, &key))
        return;
    if (w->gw->store == NULL) {
        agw_gw_reply_error(w, req, NULL, 404,
                           "not found: thread history is off on this gateway (history.enabled)");
        return;
    }
    if (agw_history_query_parse(agw_req_query(req), &q, err, sizeof(err)) != 0) {
        char msg[sizeof(err) + 16];
        snprintf(msg, sizeof(msg), "bad request: %s", err);
        agw_gw_reply_error(w, req, NULL, 400, msg);
        return;
    }
    tr = agw_xcalloc(1, sizeof(*tr));
    tr->w = w;
    tr->req = req;
    tr->key = key;
    agw_gw_req_info_copy(w, &tr->ri, req);
    snprintf(tr->thread_id, sizeof(tr->thread_id), "%s", route->thread_id);
    agw_req_on_close(req, thread_read_closed, tr);
    agw_store_read(w->gw->store, route->thread_id, &q, w->inbox, thread_read_done, tr);
}

/* ---- dispatch -------------------------------------------------------------------------------- */

static void handle_request(struct agw_req *req, void *arg, bool admin)
{
    struct agw_worker *w = arg;
    struct agw_route route;
    char msg[AGW_ID_MAX + 160];
    int rc;

    rc = agw_router_match(agw_req_path(req), agw_req_method(req), &route);
    if (rc == -AGW_EINVAL) {
        agw_gw_reply_error(w, req, NULL, 400, "bad request: invalid id in the path");
        return;
    }
    /* /metrics lives on the admin listener when there is one; the admin listener serves nothing
     * else. */
    if (rc == 0) {
        bool admin_route = route.id == AGW_ROUTE_HEALTHZ || route.id == AGW_ROUTE_METRICS;
        if (admin && !admin_route)
            rc = -AGW_ENOTFOUND;
        else if (!admin && route.id == AGW_ROUTE_METRICS && w->cfg->admin != NULL)
            rc = -AGW_ENOTFOUND;
    }
    if (rc != 0) {
        snprintf(msg, sizeof(msg), "not found: no route for %.16s %.100s", agw_req_method_name(req),
                 agw_req_path(req));
        agw_gw_reply_error(w, req, NULL, 404, msg);
        return;
    }
    if (!route.method_allowed) {
        agw_req_add_header(req, "Allow", agw_route_allow(route.id));
        snprintf(msg, sizeof(msg), "method not allowed: use %s", agw_route_allow(route.id));
        agw_gw_reply_error(w, req, NULL, 405, msg);
        return;
    }
    if (agw_req_method(req) == AGW_METHOD_OPTIONS) {
        /* CORS preflight answers arrive with the operations issue; until then: what the route
         * accepts. */
        agw_req_add_header(req, "Allow", agw_route_allow(route.id));
        agw_req_reply(req, 204, NULL, NULL, 0);
        agw_metrics_request(w->metrics, NULL, 204);
        return;
    }
    switch (route.id) {
    case AGW_ROUTE_HEALTHZ:
        if (w->draining) {
            agw_req_reply(req, 503, "application/json", "{\"status\":\"draining\"}", 21);
            agw_metrics_request(w->metrics, NULL, 503);
        } else {
            agw_req_reply(req, 200, "application/json", "{\"status\":\"ok\"}", 15);
            agw_metrics_request(w->metrics, NULL, 200);
        }
        return;
    case AGW_ROUTE_METRICS:
        serve_metrics(w, req);
        agw_metrics_request(w->metrics, NULL, 200);
        return;
    case AGW_ROUTE_RUNS:
        handle_run(w, req, &route);
        return;
    case AGW_ROUTE_CANCEL:
        agw_decision_cancel(w, req, &route);
        return;
    case AGW_ROUTE_THREAD_MESSAGES:
        handle_thread_messages(w, req, &route);
        return;
    case AGW_ROUTE_NONE:
        break;
    }
    agw_gw_reply_error(w, req, NULL, 500, "internal error: unrouted request");
}

static void main_handler(struct agw_req *req, void *arg)
{
    handle_request(req, arg, false);
}

static void admin_handler(struct agw_req *req, void *arg)
{
    handle_request(req, arg, true);
}

/* ---- between loops --------------------------------------------------------------------------- */

struct posted {
    void (*fn)(void *arg);
    void *arg;
};

static void posted_cb(evutil_socket_t fd, short what, void *arg)
{
    struct posted *p = arg;

    (void)fd;
    (void)what;
    p->fn(p->arg);
    free(p);
}

void agw_gw_post(struct agw_worker *w, void (*fn)(void *arg), void *arg)
{
    struct posted *p = agw_xmalloc(sizeof(*p));
    struct timeval now = {0, 0};

    p->fn = fn;
    p->arg = arg;
    /* libevent's loops take their own locks (evthread_use_pthreads() at start) and wake the target
     * loop. */
    if (event_base_once(w->base, -1, EV_TIMEOUT, posted_cb, p, &now) != 0)
        abort(); /* out of memory */
}

struct agw_worker *agw_gw_worker_of(struct agw_gateway *gw, const void *base)
{
    for (unsigned k = 0; k < gw->n_workers; k++)
        if (gw->workers[k].base == base)
            return &gw->workers[k];
    return NULL;
}

/* ---- signals and drain ----------------------------------------------------------------------- */

/* A worker's loop ends when it holds no run and no request, or when the drain's time is up. Worker
 * 0 (the main thread, which handles the signals) ends last. */
static void drain_poll_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_worker *w = arg;
    struct agw_gateway *gw = w->gw;
    uint64_t elapsed = agw_now_ms() - gw->drain_start_ms;
    struct timeval tv = {0, DRAIN_POLL_MS * 1000};
    bool others_done =
        w->index != 0 || __atomic_load_n(&gw->loops_ended, __ATOMIC_ACQUIRE) == gw->n_workers - 1;

    (void)fd;
    (void)what;
    if (agw_relay_set_count(w->relays) == 0 && agw_server_active_requests(w->srv) == 0 &&
        others_done) {
        if (w->index == 0)
            agw_log_info("drained; exiting");
        event_base_loopexit(w->base, NULL);
        return;
    }
    if (!w->shutdown_sent && elapsed >= w->cfg->timeouts.drain_ms) {
        if (agw_relay_set_count(w->relays) > 0)
            agw_log_warn("drain timeout: ending %zu runs with RUN_ERROR SHUTDOWN",
                         agw_relay_set_count(w->relays));
        w->shutdown_sent = true;
        agw_relay_set_shutdown(w->relays);
    } else if (w->shutdown_sent &&
               elapsed >= (uint64_t)w->cfg->timeouts.drain_ms + DRAIN_GRACE_MS) {
        if (agw_relay_set_count(w->relays) > 0 || agw_server_active_requests(w->srv) > 0)
            agw_log_warn("clients did not take their last events; closing");
        if (others_done) {
            event_base_loopexit(w->base, NULL);
            return;
        }
    }
    evtimer_add(w->drain_poll, &tv);
}

static void drain_here(void *arg)
{
    struct agw_worker *w = arg;
    struct timeval tv = {0, 0};

    w->draining = true;
    agw_server_drain(w->srv);
    evtimer_add(w->drain_poll, &tv);
}

static void stop_here(void *arg)
{
    struct agw_worker *w = arg;

    w->shutdown_sent = true;
    agw_relay_set_shutdown(w->relays);
}

static size_t open_relays(const struct agw_gateway *gw)
{
    size_t n = 0;

    for (unsigned k = 0; k < gw->n_workers; k++)
        n += agw_relay_set_count(gw->workers[k].relays);
    return n;
}

static void begin_drain(struct agw_gateway *gw, const char *why)
{
    if (gw->draining) {
        agw_log_warn("%s again: stopping now", why);
        gw->drain_start_ms = agw_now_ms() - gw->cfg->timeouts.drain_ms;
        for (unsigned k = 0; k < gw->n_workers; k++)
            agw_gw_post(&gw->workers[k], stop_here, &gw->workers[k]);
        return;
    }
    agw_log_info("%s: draining (%zu runs active, up to %u ms)", why, open_relays(gw),
                 gw->cfg->timeouts.drain_ms);
    gw->draining = true;
    gw->drain_start_ms = agw_now_ms();
    for (unsigned k = 0; k < gw->n_workers; k++)
        agw_gw_post(&gw->workers[k], drain_here, &gw->workers[k]);
}

struct tls_swap {
    struct agw_worker *w;
    int index;
    SSL_CTX *tls;
};

static void tls_swap_here(void *arg)
{
    struct tls_swap *t = arg;

    agw_server_set_tls(t->w->srv, t->index, t->tls);
    free(t);
}

/* SIGHUP: certificates and keys are read again for every TLS listener, once, and every worker
 * takes the new context on its own loop. A listener whose new files do not load keeps its current
 * ones (and the reason is logged); streams already running are untouched, since each connection
 * keeps the context it started with. (Reloading the whole configuration is a later step.) */
static void reload_certificates(struct agw_gateway *gw)
{
    const struct agw_config *cfg = gw->cfg;
    size_t reloaded = 0;

    for (size_t i = 0; i < cfg->n_listeners; i++) {
        char path[64], err[AGW_CONFIG_ERR_MAX];
        SSL_CTX *tls;
        if (cfg->listeners[i].tls.cert == NULL)
            continue;
        snprintf(path, sizeof(path), "listen[%zu].tls", i);
        tls = agw_tls_server_ctx_new(&cfg->listeners[i].tls, path, err, sizeof(err));
        if (tls == NULL) {
            agw_log_error("SIGHUP: keeping the current certificate of listen[%zu]: %s", i, err);
            continue;
        }
        for (unsigned k = 0; k < gw->n_workers; k++) {
            struct tls_swap *t = agw_xmalloc(sizeof(*t));
            SSL_CTX_up_ref(tls); /* each server owns one reference */
            *t = (struct tls_swap){&gw->workers[k], gw->listener_index[i], tls};
            agw_gw_post(&gw->workers[k], tls_swap_here, t);
        }
        SSL_CTX_free(tls);
        reloaded++;
    }
    agw_log_info("SIGHUP: reloaded the certificates of %zu TLS listeners", reloaded);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    struct agw_gateway *gw = arg;

    (void)what;
    if (sig == SIGHUP) {
        reload_certificates(gw);
        return;
    }
    begin_drain(gw, sig == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* ---- life ------------------------------------------------------------------------------------ */

/* The header fields every upstream request of agent <a> carries: built once, at start
 * (doc/protocol.md#upstream-request). Returns an allocated string of "Name: value\r\n" lines. */
static char *fixed_headers(const struct agw_agent_config *a)
{
    struct evbuffer *b = evbuffer_new();
    size_t len;
    char *s;

    evbuffer_add_printf(b, "Content-Type: application/json\r\nAccept: text/event-stream\r\n");
    for (size_t i = 0; i < a->n_upstream_headers; i++)
        evbuffer_add_printf(b, "%s: %s\r\n", a->upstream_headers[i].name,
                            a->upstream_headers[i].value);
    len = evbuffer_get_length(b);
    s = agw_xmalloc(len + 1);
    evbuffer_remove(b, s, len);
    s[len] = '\0';
    evbuffer_free(b);
    return s;
}

/* The loop objects of worker <w>, its upstream pools, its relays and its server (the listeners
 * come later, from agw_gateway_new). */
/* The loop probe (AGW_LOOP_PROBE_MS, for benchmarks): a timer every period; how late it fires is
 * how long the loop was busy elsewhere. */
static void lag_probe_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_worker *w = arg;
    struct timespec ts;
    uint64_t now_us, late;

    (void)fd;
    (void)what;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    now_us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
    late = now_us > w->lag_due_us ? now_us - w->lag_due_us : 0;
    if (w->lag_due_us != 0 && late > __atomic_load_n(&w->lag_max_us, __ATOMIC_RELAXED))
        __atomic_store_n(&w->lag_max_us, late, __ATOMIC_RELAXED);
    w->lag_due_us = now_us + w->lag_period_us;
}

static void start_lag_probe(struct agw_worker *w)
{
    const char *v = getenv("AGW_LOOP_PROBE_MS");
    long ms = v != NULL ? strtol(v, NULL, 10) : 0;
    struct timeval tv;

    if (ms <= 0 || ms > 10000)
        return;
    w->lag_period_us = (uint64_t)ms * 1000u;
    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    /* The highest priority: it measures the loop, it must not wait behind a busy one's work. */
    w->lag_probe = event_new(w->base, -1, EV_PERSIST, lag_probe_cb, w);
    event_priority_set(w->lag_probe, 0);
    event_add(w->lag_probe, &tv);
}

static int worker_init(struct agw_worker *w, char *err, size_t errlen)
{
    const struct agw_config *cfg = w->cfg;
    struct agw_server_options so = {.max_body_bytes = cfg->limits.max_body_bytes,
                                    .max_head_bytes = cfg->limits.max_request_header_bytes,
                                    .max_header_fields = cfg->limits.max_request_header_fields,
                                    .request_ms = cfg->timeouts.request_ms};
    struct agw_upstream_pool_options po = {
        .connect_ms = cfg->timeouts.connect_ms,
        .first_byte_ms = cfg->timeouts.first_byte_ms,
        .idle_ms = cfg->timeouts.idle_ms,
        .max_header_bytes = cfg->limits.max_header_bytes,
        .max_idle_conns = 64,
        .keepalive_ms = 60000,
    };

    w->base = event_base_new();
    if (w->base == NULL || event_base_priority_init(w->base, AGW_N_PRIORITIES) != 0) {
        snprintf(err, errlen, "cannot create the event loop");
        return -1;
    }
    /* Name servers from /etc/resolv.conf; resolution never blocks the loop. */
    w->dns = evdns_base_new(w->base,
                            EVDNS_BASE_INITIALIZE_NAMESERVERS | EVDNS_BASE_DISABLE_WHEN_INACTIVE);
    if (w->dns == NULL)
        w->dns = evdns_base_new(w->base, 0);
    w->relays = agw_relay_set_new(w->base);
    if (w->gw->store != NULL)
        w->inbox = agw_store_inbox_new(w->base);
    w->agents = agw_xcalloc(cfg->n_agents, sizeof(*w->agents));
    for (size_t i = 0; i < cfg->n_agents; i++) {
        const struct agw_agent_config *a = &cfg->agents[i];
        SSL_CTX *client_tls = NULL;
        char *fixed;
        w->agents[i].cfg = a;
        w->agents[i].pools = agw_xcalloc(a->n_upstreams, sizeof(struct agw_upstream_pool *));
        w->agents[i].keys = agw_xcalloc(a->n_upstreams, sizeof(const char *));
        for (size_t j = 0; j < a->n_upstreams; j++)
            w->agents[i].keys[j] = a->upstreams[j].text;
        for (size_t j = 0; j < a->n_upstreams && client_tls == NULL; j++) {
            if (!a->upstreams[j].tls)
                continue;
            char why[256];
            client_tls = agw_tls_client_ctx_new(a->ca_file, why, sizeof(why));
            if (client_tls == NULL) {
                snprintf(err, errlen, "agents.%s.ca_file: %s", a->id, why);
                return -1;
            }
        }
        po.tls = client_tls;
        fixed = fixed_headers(a);
        po.fixed_headers = fixed;
        for (size_t j = 0; j < a->n_upstreams; j++)
            w->agents[i].pools[j] = agw_upstream_pool_new(w->base, w->dns, &a->upstreams[j], &po);
        /* Each pool holds its own reference, and its own copy of the header lines. */
        SSL_CTX_free(client_tls);
        po.tls = NULL;
        free(fixed);
        po.fixed_headers = NULL;
    }
    w->srv = agw_server_new(w->base, &so, main_handler, w);
    if (w->index == 0 && cfg->admin != NULL)
        w->admin = agw_server_new(w->base, &so, admin_handler, w);
    w->drain_poll = evtimer_new(w->base, drain_poll_cb, w);
    start_lag_probe(w);
    return 0;
}

static void worker_free(struct agw_worker *w)
{
    const struct agw_config *cfg = w->cfg;

    /* Servers first: closing their connections ends the relays still attached to them. */
    agw_server_free(w->srv);
    agw_server_free(w->admin);
    agw_relay_set_free(w->relays);
    for (size_t i = 0; w->agents != NULL && i < cfg->n_agents; i++) {
        for (size_t j = 0; j < cfg->agents[i].n_upstreams; j++)
            if (w->agents[i].pools != NULL)
                agw_upstream_pool_free(w->agents[i].pools[j]);
        free(w->agents[i].pools);
        free(w->agents[i].keys);
    }
    free(w->agents);
    if (w->drain_poll != NULL)
        event_free(w->drain_poll);
    if (w->lag_probe != NULL)
        event_free(w->lag_probe);
    if (w->dns != NULL)
        evdns_base_free(w->dns, 0);
}

/* After the store closed (it may still answer into the inboxes until then). */
static void worker_free_loop(struct agw_worker *w)
{
    agw_store_inbox_free(w->inbox);
    if (w->base != NULL)
        event_base_free(w->base);
}

/* The number of event loops: cfg->workers, or one per core the process may run on. */
static unsigned worker_count(const struct agw_config *cfg)
{
    long n;

    if (cfg->workers > 0)
        return cfg->workers;
    n = sysconf(_SC_NPROCESSORS_ONLN);
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        n = CPU_COUNT(&set);
#endif
    if (n < 1)
        n = 1;
    return n > AGW_MAX_WORKERS ? AGW_MAX_WORKERS : (unsigned)n;
}

/* Binds listener <l> on every worker: the first binds (and learns an ephemeral port), the others
 * bind the same port with SO_REUSEPORT, and the kernel spreads new connections over them. Returns
 * the server listener index, or -1 with <err> set. */
static int listen_everywhere(struct agw_gateway *gw, bool admin, const char *address, uint16_t port,
                             SSL_CTX *tls, uint16_t *bound, char *err, size_t errlen,
                             const char *what)
{
    int index = -1;
    unsigned n = admin ? 1 : gw->n_workers;

    *bound = port;
    for (unsigned k = 0; k < n; k++) {
        struct agw_worker *w = &gw->workers[k];
        int ix;
        if (tls != NULL && k + 1 < n)
            SSL_CTX_up_ref(tls); /* one reference per server; the last takes ours */
        ix = agw_server_listen(admin ? w->admin : w->srv, address, *bound, tls, bound);
        if (ix < 0) {
            snprintf(err, errlen, "%s: cannot listen on %s port %u: %s", what, address, *bound,
                     evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
            if (tls != NULL && k + 1 < n)
                SSL_CTX_free(tls); /* ours: the failed call took the reference made for it */
            return -1;
        }
        if (k == 0)
            index = ix;
    }
    return index;
}

struct agw_gateway *agw_gateway_new(const struct agw_config *cfg, char *err, size_t errlen)
{
    struct agw_gateway *gw = agw_xcalloc(1, sizeof(*gw));

    gw->cfg = cfg;
    gw->n_workers = worker_count(cfg);
    /* Loops hand work to each other (agw_gw_post): libevent's locks are needed then. */
    if (gw->n_workers > 1 && evthread_use_pthreads() != 0) {
        snprintf(err, errlen, "cannot enable libevent's threading support");
        goto err;
    }
    gw->runs = agw_runs_new();
    gw->metrics = agw_metrics_new();
    if (cfg->history.enabled) {
        struct agw_store_options so = {
            .kind = cfg->store.kind,
            .path = cfg->store.path,
            .max_messages = cfg->history.max_messages_per_thread,
            .ttl_s = cfg->history.ttl_s,
            .cache_threads = cfg->history.cache_threads,
            .commit_ms = AGW_STORE_COMMIT_MS,
            .max_queue_bytes = AGW_STORE_MAX_QUEUE_BYTES,
        };
        if ((gw->store = agw_store_open(&so, err, errlen)) == NULL)
            goto err;
    }
    gw->workers = agw_xcalloc(gw->n_workers, sizeof(*gw->workers));
    for (unsigned k = 0; k < gw->n_workers; k++) {
        struct agw_worker *w = &gw->workers[k];
        *w = (struct agw_worker){
            .gw = gw, .cfg = cfg, .runs = gw->runs, .metrics = gw->metrics, .index = k};
        if (worker_init(w, err, errlen) != 0)
            goto err;
    }
    for (size_t i = 0; i < cfg->n_listeners; i++) {
        const struct agw_listener_config *l = &cfg->listeners[i];
        SSL_CTX *tls = NULL;
        char path[64];
        int index;
        snprintf(path, sizeof(path), "listen[%zu].tls", i);
        if (l->tls.cert != NULL &&
            (tls = agw_tls_server_ctx_new(&l->tls, path, err, errlen)) == NULL)
            goto err;
        snprintf(path, sizeof(path), "listen[%zu]", i);
        index = listen_everywhere(gw, false, l->address, l->port, tls, &gw->ports[gw->n_ports], err,
                                  errlen, path);
        if (index < 0)
            goto err;
        gw->listener_index[i] = index;
        agw_log_info("listening on %s port %u%s", l->address, gw->ports[gw->n_ports],
                     tls != NULL ? " (TLS)" : "");
        gw->n_ports++;
    }
    if (cfg->admin != NULL) {
        if (listen_everywhere(gw, true, cfg->admin->address, cfg->admin->port, NULL,
                              &gw->ports[gw->n_ports], err, errlen, "admin") < 0)
            goto err;
        agw_log_info("admin listener on %s port %u", cfg->admin->address, gw->ports[gw->n_ports]);
        gw->n_ports++;
    }
    agw_log_info("%u worker event loop%s", gw->n_workers, gw->n_workers == 1 ? "" : "s");
    {
        struct event_base *main_base = gw->workers[0].base;
        gw->sig_term = evsignal_new(main_base, SIGTERM, signal_cb, gw);
        gw->sig_int = evsignal_new(main_base, SIGINT, signal_cb, gw);
        gw->sig_hup = evsignal_new(main_base, SIGHUP, signal_cb, gw);
    }
    evsignal_add(gw->sig_term, NULL);
    evsignal_add(gw->sig_int, NULL);
    evsignal_add(gw->sig_hup, NULL);
    if (cfg->auth.mode == AGW_AUTH_NONE)
        agw_log_warn(
            "AUTHENTICATION IS OFF (auth.mode = \"none\"): anyone who reaches this gateway can run "
            "every agent");
    return gw;
err:
    agw_gateway_free(gw);
    return NULL;
}

void agw_gateway_free(struct agw_gateway *gw)
{
    if (gw == NULL)
        return;
    if (gw->sig_term != NULL) {
        event_free(gw->sig_term);
        event_free(gw->sig_int);
        event_free(gw->sig_hup);
    }
    /* Relays first (their last events go to the store), then the store (it answers the reads
     * still queued), then the loops with their inboxes. */
    for (unsigned k = 0; gw->workers != NULL && k < gw->n_workers; k++)
        if (gw->workers[k].cfg != NULL)
            worker_free(&gw->workers[k]);
    agw_store_close(gw->store);
    for (unsigned k = 0; gw->workers != NULL && k < gw->n_workers; k++)
        if (gw->workers[k].cfg != NULL)
            worker_free_loop(&gw->workers[k]);
    free(gw->workers);
    agw_runs_free(gw->runs);
    agw_metrics_free(gw->metrics);
    free(gw);
}

size_t agw_gateway_ports(const struct agw_gateway *gw, uint16_t *ports, size_t max)
{
    size_t n = gw->n_ports < max ? gw->n_ports : max;

    memcpy(ports, gw->ports, n * sizeof(*ports));
    return n;
}

static void *worker_main(void *arg)
{
    struct agw_worker *w = arg;

    event_base_dispatch(w->base);
    __atomic_add_fetch(&w->gw->loops_ended, 1, __ATOMIC_RELEASE);
    return NULL;
}

int agw_gateway_run(struct agw_gateway *gw)
{
    sigset_t all, old;

    /* Signals go to the main thread (worker 0's loop): the other threads block them. */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    for (unsigned k = 1; k < gw->n_workers; k++) {
        struct agw_worker *w = &gw->workers[k];
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            /* Its listeners would take connections no loop serves: stop them, and drain. */
            agw_log_error("cannot start worker thread %u: stopping", k);
            for (; k < gw->n_workers; k++) {
                agw_server_stop_listening(gw->workers[k].srv);
                __atomic_add_fetch(&gw->loops_ended, 1, __ATOMIC_RELEASE);
            }
            begin_drain(gw, "thread failure");
            break;
        }
        w->thread_started = true;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    event_base_dispatch(gw->workers[0].base);
    for (unsigned k = 1; k < gw->n_workers; k++)
        if (gw->workers[k].thread_started)
            pthread_join(gw->workers[k].thread, NULL);
    return 0;
}
