/* The gateway's wiring and routing: configuration → event loop, listeners, upstream pools, relays,
 * signals and drain; the request handler that routes every endpoint (auth, validation, balancing,
 * starting runs). Decisions and cancellation are in src/decision.c, the counters in src/metrics.c,
 * the backend order in src/balance.c, the access log's format in src/log.c. */
#include "config.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
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
#include <jansson.h>

#include "agw/agkit.h"
#include "agw/balance.h"
#include "agw/cors.h"
#include "agw/decision.h"
#include "agw/input.h"
#include "agw/log.h"
#include "agw/loop_probe.h"
#include "agw/router.h"
#include "agw/tls.h"

#include "gateway_internal.h"

#define DRAIN_POLL_MS  100
#define DRAIN_GRACE_MS 2000 /* after SHUTDOWN events are written, time for clients to take them */

/* ---- metrics ----------------------------------------------------------------------------------
 */

/* The counters, the gauges and the server statistics, summed over the workers (and the process's
 * own counters). */
static void serve_metrics(struct agw_worker *w, struct agw_req *req)
{
    static const int statuses[] = AGW_SERVER_REFUSAL_STATUSES;
    struct agw_gateway *gw = w->gw;
    uint64_t refused[AGW_SERVER_N_REFUSALS] = {0}, accept_errors = 0, accept_yields = 0;
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
            accept_yields += st.accept_yields;
            for (size_t i = 0; i < AGW_SERVER_N_REFUSALS; i++)
                refused[i] += st.refused[i];
        }
        open_relays += agw_relay_set_count(gw->workers[k].relays);
    }
    struct agw_metrics_gauges g = {
        .active_runs = agw_runs_count(w->runs),
        .open_relays = open_relays,
        .accept_errors = accept_errors,
        .accept_yields = accept_yields,
        .refusal_statuses = statuses,
        .refused = refused,
        .n_refusals = AGW_SERVER_N_REFUSALS,
        .loop_lag_max_us = -1,
        .loop_lag_self_max_us = -1,
        .loop_lag_busy_max_us = -1,
    };
    struct agw_store_stats hs;
    if (gw->store != NULL) {
        agw_store_get_stats(gw->store, &hs);
        g.history = &hs;
    }
    for (unsigned k = 0; k < gw->n_workers; k++) {
        struct agw_worker *o = &gw->workers[k];
        struct agw_loop_probe_maxima pm;

        if (o->probe != NULL) {
            agw_loop_probe_maxima(o->probe, &pm);
            if (pm.late_us > g.loop_lag_max_us)
                g.loop_lag_max_us = pm.late_us;
            if (pm.own_us > g.loop_lag_self_max_us)
                g.loop_lag_self_max_us = pm.own_us;
            if (pm.running_us > g.loop_lag_busy_max_us)
                g.loop_lag_busy_max_us = pm.running_us;
        }
        g.loop_turns += __atomic_load_n(&o->loop_stats.turns, __ATOMIC_RELAXED);
        g.loop_naps += __atomic_load_n(&o->loop_stats.naps, __ATOMIC_RELAXED);
        g.loop_holds += __atomic_load_n(&o->loop_stats.holds, __ATOMIC_RELAXED);
    }
    agw_metrics_write(gw->all_metrics, gw->n_workers + 1, &g, b);
    agw_ratelimit_write_metrics(gw->ratelimit, b);
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
    agw_metrics_observe_run(w->metrics, s->agent_id, s->connect_us, s->first_byte_us,
                            s->duration_ms * 1000u);
    agw_gw_access_log(&rc->ri, s->agent_id, s->thread_id, s->run_id, rc->key_id, s->status,
                      s->events, s->bytes, s->duration_ms, s->upstream, s->outcome, s->detached);
    agw_gw_req_info_clear(&rc->ri);
    agw_ratelimit_release(w->gw->ratelimit, rc->rl);
    agw_gw_release(rc->wc);
    free(rc);
}

/* Passive health: what became of a run's attempt on a backend (agw_relay_backend_fn). */
static void run_backend_outcome(void *arg, size_t attempt, bool answered)
{
    struct run_ctx *rc = arg;
    const struct agw_agent_config *a = rc->art->cfg;
    size_t i = rc->order[attempt];
    struct agw_health *h = &rc->art->health[i];
    pthread_mutex_t *lock = &rc->wc->gc->health_lock;
    bool changed;

    if (answered && agw_health_clean(h))
        return; /* (nearly every run: nothing to write, no lock) */
    pthread_mutex_lock(lock);
    changed = answered
                  ? agw_health_succeeded(h)
                  : agw_health_failed(h, agw_now_ms_coarse(), a->max_fails, a->fail_timeout_ms);
    pthread_mutex_unlock(lock);
    if (!changed)
        return;
    if (answered) {
        agw_log_info("agent %s: backend %s answers again", a->id, a->upstreams[i].authority);
        return;
    }
    agw_log_warn("agent %s: backend %s marked down for %" PRIu32
                 " ms (%u failure%s before the first byte); other backends are tried first",
                 a->id, a->upstreams[i].authority, a->fail_timeout_ms, a->max_fails,
                 a->max_fails == 1 ? "" : "s");
    agw_metrics_add(rc->w->metrics, AGW_C_BACKENDS_MARKED_DOWN, 1);
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
        agent_id != NULL && agw_config_find_agent(w->wc->cfg, agent_id) != NULL ? agent_id : NULL;

    switch (agw_auth_check(&w->wc->cfg->auth, agw_req_known_header(req, AGW_HDR_AUTHORIZATION),
                           agent_id, key)) {
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

/* The rate limits of the key (doc/configuration.md#rate-limits): true when the run may start, with
 * the slot it took in *<slot>; otherwise answers 429 with Retry-After. */
static bool rate_limit_pass(struct agw_worker *w, struct agw_req *req, const char *agent_id,
                            const struct agw_auth_key *key, struct agw_rl_entry **slot)
{
    const char *id = key != NULL ? key->id : "";
    const struct agw_rate_limit *lim = key != NULL ? &key->rate_limit : &w->wc->cfg->rate_limit;
    char msg[AGW_ID_MAX + 200], who[AGW_ID_MAX + 48], retry[16];
    uint32_t retry_s;
    enum agw_rl_verdict rl =
        agw_ratelimit_acquire(w->gw->ratelimit, id, agw_now_ms(), &retry_s, slot);

    if (rl == AGW_RL_OK)
        return true; /* (no printf on the way of a run that starts) */
    if (key != NULL)
        snprintf(who, sizeof(who), "key '%.64s'", id);
    else
        snprintf(who, sizeof(who), "this gateway's clients (auth is off)");
    switch (rl) {
    case AGW_RL_OK:
        return true;
    case AGW_RL_RATE:
        snprintf(msg, sizeof(msg),
                 "too many requests: %s may start %u runs per minute (burst %u); retry in %u s",
                 who, lim->runs_per_minute, lim->burst, retry_s);
        break;
    case AGW_RL_CONCURRENCY:
        snprintf(msg, sizeof(msg), "too many requests: %s may run %u runs at once", who,
                 lim->concurrent_runs);
        break;
    }
    snprintf(retry, sizeof(retry), "%u", retry_s);
    agw_req_add_header(req, "Retry-After", retry);
    agw_gw_reply_error(w, req, agent_id, 429, msg);
    return false;
}

/* What every run request passes before its body is read: the token (401/403), the agent (404),
 * the Content-Type (415) and the body's size (413). Answers the error itself and returns NULL;
 * else the agent, and *<key> (NULL with auth off). */
static const struct agw_agent_config *run_gate(struct agw_worker *w, struct agw_req *req,
                                               const char *agent_id,
                                               const struct agw_auth_key **key)
{
    const struct agw_config *cfg = w->wc->cfg;
    const struct agw_agent_config *agent;
    char msg[AGW_ID_MAX + 80];

    if (!agw_gw_authorize(w, req, agent_id, key))
        return NULL;
    agent = agw_config_find_agent(cfg, agent_id);
    if (agent == NULL) {
        snprintf(msg, sizeof(msg), "agent not found: %s", agent_id);
        agw_gw_reply_error(w, req, NULL, 404, msg);
        return NULL;
    }
    if (!agw_input_content_type_ok(agw_req_known_header(req, AGW_HDR_CONTENT_TYPE))) {
        agw_gw_reply_error(w, req, agent->id, 415,
                           "unsupported media type: Content-Type must be application/json");
        return NULL;
    }
    if (evbuffer_get_length(agw_req_body(req)) > cfg->limits.max_body_bytes) {
        snprintf(msg, sizeof(msg), "payload too large: the limit is %zu bytes",
                 cfg->limits.max_body_bytes);
        agw_gw_reply_error(w, req, agent->id, 413, msg);
        return NULL;
    }
    return agent;
}

/* A RunAgentInput <body_data> for <agent>: validated (400/422), then a decision forwarded to the
 * live run, or a run (rate limited, balanced, relayed). <legacy_client>: the client reads legacy
 * AG-Kit events, and its tool results are always new runs. */
static void start_run(struct agw_worker *w, struct agw_req *req,
                      const struct agw_agent_config *agent, const struct agw_auth_key *key,
                      const char *body_data, size_t body_len, bool legacy_client)
{
    const struct agw_config *cfg = w->wc->cfg;
    struct agent_rt *art;
    struct agw_input in = {0};
    char err[AGW_INPUT_ERR_MAX], msg[AGW_INPUT_ERR_MAX + 80];
    int status;

    /* with thread history on, the scanner's reading of the messages goes to the store's writer */
    status = (w->gw->store != NULL ? agw_input_parse_keep : agw_input_parse)(
        body_data, body_len, cfg->limits.max_json_depth, &in, err, sizeof(err));
    if (status != 0) {
        agw_gw_reply_error(w, req, agent->id, status, err);
        return;
    }

    /* Upstream request headers (doc/protocol.md#upstream-request): never the client's
     * Authorization. */
    struct agw_upstream_header h[AGW_MAX_UPSTREAM_HEADERS];
    size_t n = 0;
    char traceparent[64], trace_id[33], span_id[17];
    const char *tp = agw_req_known_header(req, AGW_HDR_TRACEPARENT);
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

    /* A legacy AG-Kit backend takes no decision into a live run: a tool result is a new request. */
    if (in.decision_only && agent->decisions_forward != AGW_FORWARD_NEVER &&
        agent->protocol != AGW_PROTO_AGKIT && !legacy_client &&
        agw_decision_route(w, req, agent, key, &in, h, n, body_data, body_len)) {
        agw_input_clear(&in);
        return;
    }
    struct agw_rl_entry *slot = NULL;
    if (!rate_limit_pass(w, req, agent->id, key, &slot)) {
        agw_input_clear(&in);
        return;
    }
    art = &w->wc->agents[agent - cfg->agents];
    struct agw_upstream_pool *order[AGW_MAX_UPSTREAMS];
    size_t idx[AGW_MAX_UPSTREAMS];
    agw_balance_order(agent->balance, art->keys, agent->n_upstreams, in.thread_id, &art->rr, idx);
    /* (a backend marked down comes after the others: tried only if they fail) */
    agw_balance_skip_down(idx, agent->n_upstreams, art->health, agw_now_ms_coarse());
    for (size_t i = 0; i < agent->n_upstreams; i++)
        order[i] = art->pools[idx[i]];

    /* The legacy backend's request (doc/dialects.md); the thread's history keeps the client's. */
    char *upstream_body = NULL;
    size_t upstream_len = body_len;
    if (agent->protocol == AGW_PROTO_AGKIT) {
        upstream_body = agw_agkit_request(body_data, body_len, &upstream_len, err, sizeof(err));
        if (upstream_body == NULL) { /* cannot happen: the body was validated */
            agw_ratelimit_release(w->gw->ratelimit, slot);
            snprintf(msg, sizeof(msg), "bad request: %s", err);
            agw_gw_reply_error(w, req, agent->id, 400, msg);
            agw_input_clear(&in);
            return;
        }
    }

    struct run_ctx *rc = agw_xcalloc(1, sizeof(*rc));
    rc->w = w;
    rc->wc = agw_gw_hold(w);
    rc->rl = slot;
    agw_gw_req_info_copy(w, &rc->ri, req);
    rc->key_id = key != NULL ? key->id : NULL;
    rc->art = art;
    for (size_t i = 0; i < agent->n_upstreams; i++)
        rc->order[i] = (uint8_t)idx[i];
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
        .body = upstream_body != NULL ? upstream_body : body_data,
        .body_len = upstream_len,
        .stream_buffer_bytes = cfg->limits.stream_buffer_bytes,
        .max_frame_bytes = cfg->limits.max_frame_bytes,
        .heartbeat_ms = cfg->timeouts.heartbeat_ms,
        .run_ms = cfg->timeouts.run_ms,
        .runs = w->runs,
        .runs_part = w->index,
        .detach = agent->on_client_disconnect == AGW_DISCONNECT_DETACH,
        .legacy_client = legacy_client,
        .store = w->gw->store,
        .on_end = agw_gw_run_ended,
        .on_backend = run_backend_outcome,
        .arg = rc,
    };
    agw_metrics_add(w->metrics, AGW_C_RUNS_STARTED, 1);
    if (w->gw->store != NULL)
        agw_store_run_input(w->gw->store, agent->id, in.thread_id, in.run_id, body_data, body_len,
                            in.messages_read ? in.messages : NULL, in.n_messages);
    agw_relay_start(w->relays, &p);
    free(upstream_body); /* the relay keeps its copy */
    agw_input_clear(&in);
}

static void handle_run(struct agw_worker *w, struct agw_req *req, const struct agw_route *route)
{
    const struct agw_auth_key *key = NULL;
    const struct agw_agent_config *agent = run_gate(w, req, route->agent_id, &key);
    struct evbuffer *body = agw_req_body(req);

    if (agent != NULL)
        start_run(w, req, agent, key, (const char *)evbuffer_pullup(body, -1),
                  evbuffer_get_length(body), false);
}

/* ---- legacy AG-Kit clients (doc/dialects.md) ------------------------------------------------ */

static bool key_sees(const struct agw_config *cfg, const char *key_id, const char *agents);

/* A legacy request waiting for its thread's history (an AG-UI backend needs the whole
 * conversation, a legacy client sends only what is new). Freed by the store's answer; when the
 * request ended first, the answer finds it gone (req NULL). The agent and the key are looked up
 * again with the answer: a reload may have come in between. */
struct agkit_pending {
    struct agw_worker *w;
    struct agw_req *req; /* NULL once the request is gone */
    char agent_id[AGW_ID_MAX + 1];
    char *key_id;
    char thread_id[AGW_ID_MAX + 1];
    char run_id[48];
};

static void agkit_continue(struct agw_worker *w, struct agw_req *req,
                           const struct agw_agent_config *agent, const struct agw_auth_key *key,
                           const char *thread_id, const char *run_id, const char *history,
                           size_t history_len)
{
    struct evbuffer *body = agw_req_body(req);
    char err[AGW_AGKIT_ERR_MAX], msg[AGW_AGKIT_ERR_MAX + 16];
    size_t len = 0;
    char *input = agw_agkit_legacy_to_input((const char *)evbuffer_pullup(body, -1),
                                            evbuffer_get_length(body), thread_id, run_id, history,
                                            history_len, &len, err, sizeof(err));

    if (input == NULL) {
        snprintf(msg, sizeof(msg), "bad request: %s", err);
        agw_gw_reply_error(w, req, agent->id, 400, msg);
        return;
    }
    start_run(w, req, agent, key, input, len, true);
    free(input);
}

static void agkit_pending_closed(struct agw_req *req, void *arg)
{
    struct agkit_pending *p = arg;

    (void)req;
    p->req = NULL; /* the store's answer frees <p> */
}

static void agkit_history_done(void *arg, const struct agw_store_page *page)
{
    struct agkit_pending *p = arg;
    struct agw_worker *w = p->w;
    struct agw_req *req = p->req;
    const struct agw_config *cfg = w->wc != NULL ? w->wc->cfg : NULL;
    const struct agw_agent_config *agent = NULL;
    const struct agw_auth_key *key = NULL;
    char thread_id[AGW_ID_MAX + 1], run_id[48];
    bool no_key;

    if (req == NULL) {
        free(p->key_id);
        free(p);
        return;
    }
    /* The request goes on without <p>: its answer or its run (whose relay sets its own close
     * callback) owns it from here. */
    agw_req_on_close(req, NULL, NULL);
    if (cfg != NULL)
        agent = agw_config_find_agent(cfg, p->agent_id);
    for (size_t i = 0; cfg != NULL && p->key_id != NULL && i < cfg->auth.n_keys; i++)
        if (strcmp(cfg->auth.keys[i].id, p->key_id) == 0)
            key = &cfg->auth.keys[i];
    no_key = p->key_id != NULL && key == NULL;
    memcpy(thread_id, p->thread_id, sizeof(thread_id));
    memcpy(run_id, p->run_id, sizeof(run_id));
    free(p->key_id);
    free(p);
    if (page == NULL || agent == NULL || no_key || (page->status != 200 && page->status != 404)) {
        agw_gw_reply_error(w, req, NULL, 503,
                           "service unavailable: the thread's history could not be read");
    } else if (page->status == 200 && !key_sees(cfg, key != NULL ? key->id : NULL, page->agents)) {
        /* The thread holds answers of an agent this key may not use: as for its history. */
        char msg[AGW_ID_MAX + 32];
        snprintf(msg, sizeof(msg), "thread not found: %s", thread_id);
        agw_gw_reply_error(w, req, agent->id, 404, msg);
    } else {
        /* 404: a new thread, no history. */
        agkit_continue(w, req, agent, key, thread_id, run_id,
                       page->status == 200 ? page->body : NULL,
                       page->status == 200 ? page->len : 0);
    }
}

static void handle_agkit_send(struct agw_worker *w, struct agw_req *req,
                              const struct agw_route *route)
{
    const struct agw_auth_key *key = NULL;
    const struct agw_agent_config *agent = run_gate(w, req, route->agent_id, &key);
    struct evbuffer *body = agw_req_body(req);
    char thread_id[AGW_ID_MAX + 1], run_id[48], hex[33];
    int rc;

    if (agent == NULL)
        return;
    rc = agw_agkit_legacy_thread((const char *)evbuffer_pullup(body, -1), evbuffer_get_length(body),
                                 thread_id, sizeof(thread_id));
    if (rc < 0) {
        agw_gw_reply_error(w, req, agent->id, 400,
                           "bad request: the body must be a JSON object whose conversationId, when "
                           "given, is a non-empty string of at most 256 bytes");
        return;
    }
    if (rc == 0) { /* a new conversation */
        agw_random_hex(hex, 16);
        snprintf(thread_id, sizeof(thread_id), "conv_%s", hex);
    }
    agw_random_hex(hex, 16);
    snprintf(run_id, sizeof(run_id), "run_%s", hex);
    if (w->gw->store == NULL || rc == 0) {
        agkit_continue(w, req, agent, key, thread_id, run_id, NULL, 0);
        return;
    }
    struct agkit_pending *p = agw_xcalloc(1, sizeof(*p));
    struct agw_history_query q;
    char err[64];
    p->w = w;
    p->req = req;
    snprintf(p->agent_id, sizeof(p->agent_id), "%s", agent->id);
    p->key_id = key != NULL ? agw_xstrdup(key->id) : NULL;
    snprintf(p->thread_id, sizeof(p->thread_id), "%s", thread_id);
    snprintf(p->run_id, sizeof(p->run_id), "%s", run_id);
    agw_history_query_parse("order=desc&limit=200", &q, err, sizeof(err));
    agw_req_on_close(req, agkit_pending_closed, p);
    agw_store_read(w->gw->store, thread_id, &q, w->inbox, agkit_history_done, p);
}

/* ---- thread history ----------------------------------------------------------------------- */

/* A read of a thread's messages, waiting for the store's answer. Freed by whichever comes second:
 * the answer, or the end of the request. */
struct thread_read {
    struct agw_worker *w;
    struct agw_req *req; /* NULL once the request is gone */
    char *key_id;        /* the key's id (NULL with auth off), looked up again with the answer */
    struct req_info ri;
    bool answered;
    char thread_id[AGW_ID_MAX + 1];
};

static void thread_read_free(struct thread_read *tr)
{
    agw_gw_req_info_clear(&tr->ri);
    free(tr->key_id);
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
 * one agent's answers to a key kept away from that agent. The key is the one of the configuration
 * in force when the answer comes (a key revoked meanwhile sees nothing). */
static bool key_sees(const struct agw_config *cfg, const char *key_id, const char *agents)
{
    const struct agw_auth_key *key = NULL;
    const char *p = agents;
    char id[AGW_ID_MAX + 1];

    if (cfg->auth.mode == AGW_AUTH_NONE)
        return true;
    for (size_t i = 0; key_id != NULL && i < cfg->auth.n_keys; i++)
        if (strcmp(cfg->auth.keys[i].id, key_id) == 0)
            key = &cfg->auth.keys[i];
    if (key == NULL)
        return false;
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
    } else if (page->status == 500) {
        status = 500;
        agw_req_reply_error(req, status,
                            "internal error: thread %s could not be read from the store (logged)",
                            tr->thread_id);
    } else if (page->status != 200 || tr->w->wc == NULL ||
               !key_sees(tr->w->wc->cfg, tr->key_id, page->agents)) {
        status = 404;
        snprintf(msg, sizeof(msg), "thread not found: %s", tr->thread_id);
        agw_req_reply_error(req, status, "%s", msg);
    } else {
        status = 200;
        agw_req_add_header(req, "Cache-Control", "no-store");
        agw_req_reply(req, status, "application/json", page->body, page->len);
    }
    agw_metrics_request(tr->w->metrics, NULL, status);
    agw_gw_access_log(&tr->ri, NULL, tr->thread_id, NULL, tr->key_id, status, 0, 0,
                      agw_now_ms() - agw_req_start_ms(req), NULL,
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
    tr->key_id = key != NULL ? agw_xstrdup(key->id) : NULL;
    agw_gw_req_info_copy(w, &tr->ri, req);
    snprintf(tr->thread_id, sizeof(tr->thread_id), "%s", route->thread_id);
    agw_req_on_close(req, thread_read_closed, tr);
    agw_store_read(w->gw->store, route->thread_id, &q, w->inbox, thread_read_done, tr);
}

/* ---- dispatch -------------------------------------------------------------------------------- */

static void add_header(const char *name, const char *value, void *arg)
{
    agw_req_add_header(arg, name, value);
}

/* A CORS preflight (OPTIONS with Access-Control-Request-Method): answered here, without a token
 * and without a backend. */
static void answer_preflight(struct agw_worker *w, struct agw_req *req, const char *origin,
                             enum agw_cors_origin verdict)
{
    const struct agw_cors_config *cors = &w->wc->cfg->cors;
    char why[300], msg[400];

    if (verdict != AGW_CORS_ALLOWED) {
        snprintf(msg, sizeof(msg),
                 "forbidden: origin '%.100s' is not allowed (cors.allowed_origins)", origin);
        agw_gw_reply_error(w, req, NULL, 403, msg);
        return;
    }
    if (agw_cors_check_preflight(cors, agw_req_known_header(req, AGW_HDR_AC_REQUEST_METHOD),
                                 agw_req_known_header(req, AGW_HDR_AC_REQUEST_HEADERS), why,
                                 sizeof(why)) != 0) {
        snprintf(msg, sizeof(msg), "forbidden: %s", why);
        agw_gw_reply_error(w, req, NULL, 403, msg);
        return;
    }
    agw_cors_headers(cors, origin, true, add_header, req);
    agw_req_reply(req, 204, NULL, NULL, 0);
    agw_metrics_request(w->metrics, NULL, 204);
}

static void handle_request(struct agw_req *req, void *arg, bool admin)
{
    struct agw_worker *w = arg;
    struct agw_route route;
    char msg[AGW_ID_MAX + 160];
    const char *origin = admin ? NULL : agw_req_known_header(req, AGW_HDR_ORIGIN);
    enum agw_cors_origin cors = agw_cors_check_origin(&w->wc->cfg->cors, origin);
    int rc;

    /* Every answer to an allowed origin carries the CORS fields, errors and streams included (a
     * preflight gets its own). */
    if (cors == AGW_CORS_ALLOWED && !(agw_req_method(req) == AGW_METHOD_OPTIONS &&
                                      agw_req_known_header(req, AGW_HDR_AC_REQUEST_METHOD) != NULL))
        agw_cors_headers(&w->wc->cfg->cors, origin, false, add_header, req);

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
        else if (!admin && route.id == AGW_ROUTE_METRICS && w->wc->cfg->admin != NULL)
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
        if (cors != AGW_CORS_NONE && agw_req_known_header(req, AGW_HDR_AC_REQUEST_METHOD) != NULL) {
            answer_preflight(w, req, origin, cors);
            return;
        }
        /* A plain OPTIONS: what the route accepts. */
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
    case AGW_ROUTE_AGKIT_SEND:
        handle_agkit_send(w, req, &route);
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

/* Work handed to a loop by another thread (or by itself): a drain, a stop, a new configuration, a
 * cancel for a run it holds. The loops share no libevent object: each runs its base alone, without
 * libevent's locks (taken on every event and buffer operation when threading support is on: about
 * 1.4 % of two loops' CPU on short runs), and its mailbox is the one way in. */
struct posted {
    struct agw_loop_mail mail; /* first */
    void (*fn)(void *arg);
    void *arg;
};

/* Run on the loop; dropped with a loop that no longer runs (as a stopped libevent base drops its
 * pending callbacks): only the message's own memory is freed then. */
static void posted_cb(struct agw_loop_mail *m, bool dropped)
{
    struct posted *p = (struct posted *)m;

    if (!dropped)
        p->fn(p->arg);
    free(p);
}

void agw_gw_post(struct agw_worker *w, void (*fn)(void *arg), void *arg)
{
    struct posted *p = agw_xmalloc(sizeof(*p));

    p->mail.fn = posted_cb;
    p->fn = fn;
    p->arg = arg;
    agw_loop_mailbox_post(w->inbox, &p->mail);
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
    if (!w->shutdown_sent && elapsed >= gw->drain_ms) {
        if (agw_relay_set_count(w->relays) > 0)
            agw_log_warn("drain timeout: ending %zu runs with RUN_ERROR SHUTDOWN",
                         agw_relay_set_count(w->relays));
        w->shutdown_sent = true;
        agw_relay_set_shutdown(w->relays);
    } else if (w->shutdown_sent && elapsed >= (uint64_t)gw->drain_ms + DRAIN_GRACE_MS) {
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
        gw->drain_start_ms = agw_now_ms() - gw->drain_ms;
        for (unsigned k = 0; k < gw->n_workers; k++)
            agw_gw_post(&gw->workers[k], stop_here, &gw->workers[k]);
        return;
    }
    gw->drain_ms = gw->gc->cfg->timeouts.drain_ms;
    agw_log_info("%s: draining (%zu runs active, up to %u ms)", why, open_relays(gw), gw->drain_ms);
    gw->draining = true;
    gw->drain_start_ms = agw_now_ms();
    for (unsigned k = 0; k < gw->n_workers; k++)
        agw_gw_post(&gw->workers[k], drain_here, &gw->workers[k]);
}

/* ---- configurations ----------------------------------------------------------------------------
 */

static void gconf_unref(struct gconf *gc)
{
    if (gc == NULL || __atomic_sub_fetch(&gc->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    for (size_t i = 0; gc->listener_tls != NULL && i < gc->cfg->n_listeners; i++)
        SSL_CTX_free(gc->listener_tls[i]);
    for (size_t i = 0; gc->agent_tls != NULL && i < gc->cfg->n_agents; i++)
        SSL_CTX_free(gc->agent_tls[i]);
    free(gc->listener_tls);
    free(gc->agent_tls);
    for (size_t i = 0; gc->health != NULL && i < gc->cfg->n_agents; i++)
        free(gc->health[i]);
    free(gc->health);
    pthread_mutex_destroy(&gc->health_lock);
    agw_config_free(gc->cfg);
    free(gc);
}

/* What a configuration needs built once, before any loop uses it: the listeners' certificates and
 * the agents' CA files. Takes <cfg> (freed on failure). Returns NULL with the reason in <err>. */
static struct gconf *gconf_new(struct agw_config *cfg, unsigned generation, char *err,
                               size_t errlen)
{
    struct gconf *gc = agw_xcalloc(1, sizeof(*gc));

    gc->refs = 1;
    gc->cfg = cfg;
    gc->generation = generation;
    gc->listener_tls = agw_xcalloc(cfg->n_listeners, sizeof(*gc->listener_tls));
    gc->agent_tls = agw_xcalloc(cfg->n_agents, sizeof(*gc->agent_tls));
    gc->health = agw_xcalloc(cfg->n_agents, sizeof(*gc->health));
    for (size_t i = 0; i < cfg->n_agents; i++)
        gc->health[i] = agw_xcalloc(cfg->agents[i].n_upstreams, sizeof(**gc->health));
    pthread_mutex_init(&gc->health_lock, NULL);
    for (size_t i = 0; i < cfg->n_listeners; i++) {
        char path[64];
        if (cfg->listeners[i].tls.cert == NULL)
            continue;
        snprintf(path, sizeof(path), "listen[%zu].tls", i);
        gc->listener_tls[i] = agw_tls_server_ctx_new(&cfg->listeners[i].tls, path, err, errlen);
        if (gc->listener_tls[i] == NULL)
            goto err;
    }
    for (size_t i = 0; i < cfg->n_agents; i++) {
        const struct agw_agent_config *a = &cfg->agents[i];
        for (size_t j = 0; j < a->n_upstreams; j++) {
            char why[256];
            if (!a->upstreams[j].tls)
                continue;
            gc->agent_tls[i] = agw_tls_client_ctx_new(a->ca_file, why, sizeof(why));
            if (gc->agent_tls[i] == NULL) {
                snprintf(err, errlen, "agents.%s.ca_file: %s", a->id, why);
                goto err;
            }
            break;
        }
    }
    return gc;
err:
    gconf_unref(gc);
    return NULL;
}

/* Passive health survives a reload: each backend of the new configuration (an agent of the same
 * name, an upstream of the same URL) starts where the old configuration left it, so that a reload
 * (a key added) does not make every backend marked down be tried again at once. <to> is not yet in
 * use. */
static void carry_health(struct gconf *from, struct gconf *to)
{
    const struct agw_config *a = from->cfg, *b = to->cfg;

    pthread_mutex_lock(&from->health_lock);
    for (size_t i = 0; i < b->n_agents; i++) {
        const struct agw_agent_config *nb = &b->agents[i];
        for (size_t k = 0; k < a->n_agents; k++) {
            const struct agw_agent_config *na = &a->agents[k];
            if (strcmp(na->id, nb->id) != 0)
                continue;
            for (size_t j = 0; j < nb->n_upstreams; j++)
                for (size_t m = 0; m < na->n_upstreams; m++)
                    if (strcmp(na->upstreams[m].text, nb->upstreams[j].text) == 0) {
                        const struct agw_health *h = &from->health[k][m];
                        to->health[i][j] = (struct agw_health){
                            .down_until_ms = __atomic_load_n(&h->down_until_ms, __ATOMIC_RELAXED),
                            .fails = __atomic_load_n(&h->fails, __ATOMIC_RELAXED),
                            .since_ms = h->since_ms,
                        };
                        break;
                    }
            break;
        }
    }
    pthread_mutex_unlock(&from->health_lock);
}

/* The header fields every upstream request of agent <a> carries: built once per configuration
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

/* <gc> as loop <w> uses it: a pool per backend of every agent. Takes a reference to <gc>. */
static struct wconf *wconf_new(struct agw_worker *w, struct gconf *gc)
{
    const struct agw_config *cfg = gc->cfg;
    struct wconf *wc = agw_xcalloc(1, sizeof(*wc));
    struct agw_upstream_pool_options po = {
        .connect_ms = cfg->timeouts.connect_ms,
        .first_byte_ms = cfg->timeouts.first_byte_ms,
        .idle_ms = cfg->timeouts.idle_ms,
        .max_header_bytes = cfg->limits.max_header_bytes,
        .max_idle_conns = cfg->limits.upstream_idle_connections,
        .keepalive_ms = 60000,
    };

    __atomic_add_fetch(&gc->refs, 1, __ATOMIC_RELAXED);
    wc->w = w;
    wc->refs = 1; /* the loop's, while it is current */
    wc->gc = gc;
    wc->cfg = cfg;
    wc->agents = agw_xcalloc(cfg->n_agents, sizeof(*wc->agents));
    for (size_t i = 0; i < cfg->n_agents; i++) {
        const struct agw_agent_config *a = &cfg->agents[i];
        struct agent_rt *art = &wc->agents[i];
        char *fixed = fixed_headers(a);

        art->cfg = a;
        art->pools = agw_xcalloc(a->n_upstreams, sizeof(*art->pools));
        art->keys = agw_xcalloc(a->n_upstreams, sizeof(*art->keys));
        art->health = gc->health[i];
        po.tls = gc->agent_tls[i]; /* each pool takes its own reference */
        po.fixed_headers = fixed;  /* and its own copy */
        for (size_t j = 0; j < a->n_upstreams; j++) {
            art->keys[j] = a->upstreams[j].text;
            art->pools[j] = agw_upstream_pool_new(w->base, w->dns, &a->upstreams[j], &po);
        }
        free(fixed);
    }
    wc->next = w->wconfs;
    w->wconfs = wc;
    return wc;
}

static void wconf_free(struct wconf *wc)
{
    struct wconf **pp = &wc->w->wconfs;

    while (*pp != wc)
        pp = &(*pp)->next;
    *pp = wc->next;
    for (size_t i = 0; i < wc->cfg->n_agents; i++) {
        for (size_t j = 0; j < wc->cfg->agents[i].n_upstreams; j++)
            agw_upstream_pool_free(wc->agents[i].pools[j]);
        free(wc->agents[i].pools);
        free(wc->agents[i].keys);
    }
    free(wc->agents);
    gconf_unref(wc->gc);
    free(wc);
}

struct wconf *agw_gw_hold(struct agw_worker *w)
{
    w->wc->refs++;
    return w->wc;
}

void agw_gw_release(struct wconf *wc)
{
    if (wc == NULL)
        return;
    wc->pending++;
    event_active(wc->w->reaper, EV_TIMEOUT, 0);
}

/* Drops the references released since the last turn; a configuration no longer current and no
 * longer held goes, with its pools (their idle connections close). */
static void reap(struct agw_worker *w)
{
    struct wconf *wc = w->wconfs, *next;

    for (; wc != NULL; wc = next) {
        next = wc->next;
        assert(wc->refs >= wc->pending);
        wc->refs -= wc->pending;
        wc->pending = 0;
        if (wc->refs == 0)
            wconf_free(wc);
    }
}

static void reaper_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    reap(arg);
}

static void add_line(const char *name, const char *value, void *arg)
{
    evbuffer_add_printf(arg, "%s: %s\r\n", name, value);
}

/* agw_server_options.refusal_fields: the HTTP edge's refusals (400, 413, …) carry the CORS fields
 * an allowed origin gets on any other answer, so that a page can read them. */
static void refusal_cors(void *arg, const char *origin, struct evbuffer *out)
{
    struct agw_worker *w = arg;
    const struct agw_cors_config *cors = &w->wc->cfg->cors;

    if (agw_cors_check_origin(cors, origin) == AGW_CORS_ALLOWED)
        agw_cors_headers(cors, origin, false, add_line, out);
}

static struct agw_server_options server_options(const struct agw_config *cfg, struct agw_worker *w)
{
    return (struct agw_server_options){.max_body_bytes = cfg->limits.max_body_bytes,
                                       .max_head_bytes = cfg->limits.max_request_header_bytes,
                                       .max_header_fields = cfg->limits.max_request_header_fields,
                                       .request_ms = cfg->timeouts.request_ms,
                                       .refusal_fields = refusal_cors,
                                       .refusal_arg = w};
}

struct swap {
    struct agw_worker *w;
    struct gconf *gc; /* one reference, taken for this loop */
};

/* On each loop: the new configuration for every request from now on. Runs in flight hold the one
 * they started with; it goes when the last of them ends. */
static void swap_cb(void *arg)
{
    struct swap *sw = arg;
    struct agw_worker *w = sw->w;
    struct agw_gateway *gw = w->gw;
    const struct agw_config *cfg = sw->gc->cfg;
    struct agw_server_options so = server_options(cfg, w);
    struct wconf *old = w->wc;

    w->wc = wconf_new(w, sw->gc);
    agw_server_set_options(w->srv, &so);
    if (w->admin != NULL)
        agw_server_set_options(w->admin, &so);
    for (size_t i = 0; i < cfg->n_listeners; i++) {
        if (sw->gc->listener_tls[i] == NULL)
            continue;
        SSL_CTX_up_ref(sw->gc->listener_tls[i]); /* the server owns one reference */
        agw_server_set_tls(w->srv, gw->listener_index[i], sw->gc->listener_tls[i]);
    }
    agw_gw_release(old);
    gconf_unref(sw->gc);
    free(sw);
}

static bool same_str(const char *a, const char *b)
{
    return a == NULL || b == NULL ? a == b : strcmp(a, b) == 0;
}

/* What only a restart changes: the listeners, the worker count, the store and the history's
 * settings, the access log's destination. Returns the first such key that differs, or NULL. */
static const char *restart_only_change(const struct agw_config *a, const struct agw_config *b,
                                       char *buf, size_t len)
{
    const struct agw_listener_config *la, *lb;

    if (a->n_listeners != b->n_listeners)
        return "listen";
    for (size_t i = 0; i <= a->n_listeners; i++) {
        la = i < a->n_listeners ? &a->listeners[i] : a->admin;
        lb = i < a->n_listeners ? &b->listeners[i] : b->admin;
        if (i < a->n_listeners)
            snprintf(buf, len, "listen[%zu]", i);
        else
            snprintf(buf, len, "admin");
        if ((la == NULL) != (lb == NULL))
            return buf;
        if (la == NULL)
            continue;
        if (strcmp(la->address, lb->address) != 0 || la->port != lb->port ||
            (la->tls.cert == NULL) != (lb->tls.cert == NULL))
            return buf;
    }
    if (a->workers != b->workers)
        return "workers";
    if (a->batch_window_us != b->batch_window_us)
        return "batch_window_us";
    if (a->store.kind != b->store.kind || !same_str(a->store.path, b->store.path) ||
        !same_str(a->store.url, b->store.url))
        return "store";
    if (a->history.enabled != b->history.enabled ||
        a->history.max_messages_per_thread != b->history.max_messages_per_thread ||
        a->history.ttl_s != b->history.ttl_s ||
        a->history.cache_threads != b->history.cache_threads)
        return "history";
    if (strcmp(a->log.access, b->log.access) != 0)
        return "log.access";
    return NULL;
}

/* SIGHUP: the whole configuration, read again and applied at once, or refused whole. Loading
 * checks every key; then the certificates and CA files are loaded; only when all of that holds does
 * each loop take the new configuration, on its own next turn. A refused file changes nothing, and
 * the reason is logged. */
static void reload(struct agw_gateway *gw)
{
    char err[AGW_CONFIG_ERR_MAX], buf[64];
    struct agw_config *cfg;
    struct gconf *gc;
    const char *changed;

    if (gw->config_path == NULL) {
        agw_log_warn("SIGHUP: no configuration file to read again");
        return;
    }
    cfg = agw_config_load_file(gw->config_path, err, sizeof(err));
    if (cfg == NULL) {
        agw_log_error("SIGHUP: %s refused, the current configuration stays: %s", gw->config_path,
                      err);
        agw_metrics_add(gw->metrics, AGW_C_RELOADS_REFUSED, 1);
        return;
    }
    if (gw->workers_override >= 0)
        cfg->workers = (unsigned)gw->workers_override;
    if ((changed = restart_only_change(gw->gc->cfg, cfg, buf, sizeof(buf))) != NULL) {
        agw_log_error("SIGHUP: %s refused, the current configuration stays: %s changed, and only "
                      "a restart applies that",
                      gw->config_path, changed);
        agw_config_free(cfg);
        agw_metrics_add(gw->metrics, AGW_C_RELOADS_REFUSED, 1);
        return;
    }
    gc = gconf_new(cfg, gw->gc->generation + 1, err, sizeof(err));
    if (gc == NULL) {
        agw_log_error("SIGHUP: %s refused, the current configuration stays: %s", gw->config_path,
                      err);
        agw_metrics_add(gw->metrics, AGW_C_RELOADS_REFUSED, 1);
        return;
    }
    carry_health(gw->gc, gc);
    agw_metrics_add(gw->metrics, AGW_C_RELOADS, 1);
    agw_log_set_level((enum agw_log_level)cfg->log.level);
    agw_ratelimit_configure(gw->ratelimit, cfg, agw_now_ms());
    for (unsigned k = 0; k < gw->n_workers; k++) {
        struct swap *sw = agw_xmalloc(sizeof(*sw));
        __atomic_add_fetch(&gc->refs, 1, __ATOMIC_RELAXED);
        *sw = (struct swap){&gw->workers[k], gc};
        agw_gw_post(&gw->workers[k], swap_cb, sw);
    }
    gconf_unref(gw->gc);
    gw->gc = gc;
    agw_log_info("SIGHUP: configuration %u in force (%zu agents, %zu keys, %s)", gc->generation,
                 cfg->n_agents, cfg->auth.n_keys, gw->config_path);
    if (cfg->auth.mode == AGW_AUTH_NONE)
        agw_log_warn("AUTHENTICATION IS OFF (auth.mode = \"none\")");
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    struct agw_gateway *gw = arg;

    (void)what;
    if (sig == SIGHUP) {
        reload(gw);
        return;
    }
    if (sig == SIGUSR1) {
        int rc = agw_log_access_reopen();
        if (rc == 0)
            agw_log_info("SIGUSR1: access log %s reopened", agw_log_access_path());
        else if (rc > 0)
            agw_log_info("SIGUSR1: the access log is not a file; nothing to reopen");
        else
            agw_log_error("SIGUSR1: cannot reopen the access log %s: %s; lines go to the old file",
                          agw_log_access_path(), strerror(errno));
        return;
    }
    begin_drain(gw, sig == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* ---- life ------------------------------------------------------------------------------------ */

/* The loop probe (AGW_LOOP_PROBE_MS, for benchmarks; include/agw/loop_probe.h). */
static void start_probe(struct agw_worker *w)
{
    uint64_t period_us, report_us;

    agw_loop_probe_env(&period_us, &report_us);
    if (period_us == 0)
        return;
    w->probe = agw_loop_probe_new(w->base, period_us, report_us);
    if (w->probe == NULL)
        agw_log_warn("AGW_LOOP_PROBE_MS: no probe: %s", strerror(errno));
}

/* The latenesses the probe kept (AGW_LOOP_PROBE_REPORT_MS), logged once the loop stopped: a line
 * each, for bench/run.sh to read. */
static void log_probe(struct agw_worker *w)
{
    const struct agw_loop_lateness *l;
    size_t n;
    uint64_t lost;
    char line[160];

    l = agw_loop_probe_records(w->probe, &n, &lost);
    for (size_t i = 0; i < n; i++) {
        agw_loop_probe_format(&l[i], line, sizeof(line));
        agw_log_warn("worker %u: %s", w->index, line);
    }
    if (lost > 0)
        agw_log_warn("worker %u: loop probe: %" PRIu64 " more latenesses not kept", w->index, lost);
}

/* The loop objects of worker <w>, its relays, its first configuration (pools) and its server (the
 * listeners come later, from agw_gateway_new). */
static int worker_init(struct agw_worker *w, struct gconf *gc, char *err, size_t errlen)
{
    struct agw_server_options so = server_options(gc->cfg, w);

    w->base = agw_loop_new();
    if (w->base == NULL) {
        snprintf(err, errlen, "cannot create the event loop");
        return -1;
    }
    /* Name servers from /etc/resolv.conf; resolution never blocks the loop. */
    w->dns = evdns_base_new(w->base,
                            EVDNS_BASE_INITIALIZE_NAMESERVERS | EVDNS_BASE_DISABLE_WHEN_INACTIVE);
    if (w->dns == NULL)
        w->dns = evdns_base_new(w->base, 0);
    w->relays = agw_relay_set_new(w->base);
    w->inbox = agw_loop_mailbox_new(w->base);
    if (w->inbox == NULL) {
        snprintf(err, errlen, "cannot create the loop's mailbox (an eventfd): %s", strerror(errno));
        return -1;
    }
    w->reaper = event_new(w->base, -1, 0, reaper_cb, w);
    w->wc = wconf_new(w, gc);
    w->srv = agw_server_new(w->base, &so, main_handler, w);
    if (w->index == 0 && gc->cfg->admin != NULL)
        w->admin = agw_server_new(w->base, &so, admin_handler, w);
    w->drain_poll = evtimer_new(w->base, drain_poll_cb, w);
    w->batch_window_us = gc->cfg->batch_window_us;
    start_probe(w);
    return 0;
}

static void worker_free(struct agw_worker *w)
{
    /* Servers first: closing their connections ends the relays still attached to them. */
    agw_server_free(w->srv);
    agw_server_free(w->admin);
    agw_relay_set_free(w->relays);
    /* Every holder has let go by now: the current configuration goes with the loop's reference. */
    if (w->wc != NULL)
        agw_gw_release(w->wc);
    w->wc = NULL;
    if (w->reaper != NULL) {
        reap(w);
        event_free(w->reaper);
    }
    if (w->wconfs != NULL)
        agw_log_error("worker %u: a configuration is still held at exit", w->index);
    if (w->drain_poll != NULL)
        event_free(w->drain_poll);
    if (w->probe != NULL) {
        log_probe(w);
        agw_loop_probe_free(w->probe);
    }
    if (w->dns != NULL)
        evdns_base_free(w->dns, 0);
}

/* After the store closed (it may still answer into the inboxes until then). */
static void worker_free_loop(struct agw_worker *w)
{
    agw_loop_mailbox_free(w->inbox);
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
 * bind the same port with SO_REUSEPORT, and the kernel spreads new connections over them. Each
 * server takes a reference to <tls>. Returns the server listener index, or -1 with <err> set. */
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
        if (tls != NULL)
            SSL_CTX_up_ref(tls); /* the server's, even when listening fails */
        ix = agw_server_listen(admin ? w->admin : w->srv, address, *bound, tls, bound);
        if (ix < 0) {
            snprintf(err, errlen, "%s: cannot listen on %s port %u: %s", what, address, *bound,
                     evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
            return -1;
        }
        if (k == 0)
            index = ix;
    }
    return index;
}

struct agw_gateway *agw_gateway_new(struct agw_config *cfg, const struct agw_gateway_options *o,
                                    char *err, size_t errlen)
{
    struct agw_gateway *gw = agw_xcalloc(1, sizeof(*gw));

    gw->workers_override = o != NULL ? o->workers : -1;
    gw->config_path = o != NULL && o->config_path != NULL ? agw_xstrdup(o->config_path) : NULL;
    if (gw->workers_override >= 0)
        cfg->workers = (unsigned)gw->workers_override;
    gw->n_workers = worker_count(cfg);
    gw->runs = agw_runs_new(gw->n_workers);
    gw->all_metrics = agw_xcalloc(gw->n_workers + 1, sizeof(*gw->all_metrics));
    gw->metrics = gw->all_metrics[0] = agw_metrics_new();
    gw->ratelimit = agw_ratelimit_new();
    if ((gw->gc = gconf_new(cfg, 1, err, errlen)) == NULL)
        goto err;
    agw_ratelimit_configure(gw->ratelimit, cfg, agw_now_ms());
    if (cfg->history.enabled) {
        struct agw_store_options so = {
            .kind = cfg->store.kind,
            .path = cfg->store.path,
            .max_messages = cfg->history.max_messages_per_thread,
            .ttl_s = cfg->history.ttl_s,
            .cache_threads = cfg->history.cache_threads,
            .commit_ms = AGW_STORE_COMMIT_MS,
            .max_queue_bytes = AGW_STORE_MAX_QUEUE_BYTES,
            .congested_bytes = AGW_STORE_CONGESTED_BYTES,
        };
        if ((gw->store = agw_store_open(&so, err, errlen)) == NULL)
            goto err;
    }
    gw->workers = agw_xcalloc(gw->n_workers, sizeof(*gw->workers));
    for (unsigned k = 0; k < gw->n_workers; k++) {
        struct agw_worker *w = &gw->workers[k];
        *w = (struct agw_worker){
            .gw = gw, .runs = gw->runs, .metrics = agw_metrics_new(), .index = k};
        gw->all_metrics[k + 1] = w->metrics;
        if (worker_init(w, gw->gc, err, errlen) != 0)
            goto err;
    }
    for (size_t i = 0; i < cfg->n_listeners; i++) {
        const struct agw_listener_config *l = &cfg->listeners[i];
        SSL_CTX *tls = gw->gc->listener_tls[i];
        char path[64];
        int index;
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
        gw->sig_usr1 = evsignal_new(main_base, SIGUSR1, signal_cb, gw);
    }
    evsignal_add(gw->sig_term, NULL);
    evsignal_add(gw->sig_int, NULL);
    evsignal_add(gw->sig_hup, NULL);
    evsignal_add(gw->sig_usr1, NULL);
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
        event_free(gw->sig_usr1);
    }
    /* Relays first (their last events go to the store), then the store (it answers the reads
     * still queued), then the loops with their inboxes. */
    for (unsigned k = 0; gw->workers != NULL && k < gw->n_workers; k++)
        if (gw->workers[k].base != NULL)
            worker_free(&gw->workers[k]);
    agw_store_close(gw->store);
    for (unsigned k = 0; gw->workers != NULL && k < gw->n_workers; k++)
        worker_free_loop(&gw->workers[k]);
    free(gw->workers);
    gconf_unref(gw->gc);
    agw_runs_free(gw->runs);
    for (unsigned k = 0; k <= gw->n_workers; k++)
        agw_metrics_free(gw->all_metrics[k]); /* [0] is gw->metrics; NULL: never made */
    free(gw->all_metrics);
    agw_ratelimit_free(gw->ratelimit);
    free(gw->config_path);
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

    agw_loop_run(w->base, w->batch_window_us, &w->loop_stats);
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
        {
            /* as top -H and /proc/PID/task/TID/comm show it (worker 0 is the main thread) */
            char name[16];
            snprintf(name, sizeof(name), "agw-loop-%u", k % 100000u);
            pthread_setname_np(w->thread, name);
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    agw_loop_run(gw->workers[0].base, gw->workers[0].batch_window_us, &gw->workers[0].loop_stats);
    for (unsigned k = 1; k < gw->n_workers; k++)
        if (gw->workers[k].thread_started)
            pthread_join(gw->workers[k].thread, NULL);
    return 0;
}
