/* Human in the loop: decision-only requests forwarded to the backend of the run waiting for them,
 * and the cancel endpoint. See include/agw/decision.h and doc/human-in-the-loop.md. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <jansson.h>

#include "agw/decision.h"
#include "agw/input.h"
#include "agw/log.h"
#include "agw/router.h"

#include "gateway_internal.h"

/* ---- human in the loop (doc/protocol.md#decisions)
 * --------------------------------------------------------------
 */

/* One decision on its way to the backend of the run waiting for it. Lives until the client's
 * request is gone, or until the backend's answer turns out to be a stream, which a relay then
 * takes over. */
struct decision {
    struct agw_worker *w;
    struct agw_req *req;
    struct agw_upstream *up;
    struct agw_upstream_pool *backend_pool;
    struct wconf *wc; /* held: the configuration the decision came in under */
    struct req_info ri;
    const struct agw_agent_config *agent; /* borrowed from wc's config */
    const char *key_id;                   /* borrowed from wc's config */
    char *thread_id, *run_id;             /* the active run's */
    char *client_thread, *client_run;     /* the decision's own (a stream is relayed with them) */
    char *backend;                        /* its backend's authority, for the log */
    char *body;                           /* the request, for the thread's history; or NULL */
    size_t body_len;
    int status; /* answered to the client */
    const char *outcome;
    int refused_status; /* a non-2xx answer whose body is being read for its reason */
    char reason[256];
    size_t reason_len;
};

/* The backend took the decision: its messages (the tool result) join the thread. */
static void record_decision(struct decision *d)
{
    struct agw_store *store = d->w->gw->store;

    if (store != NULL && d->body != NULL)
        agw_store_run_input(store, d->agent->id, d->client_thread, d->client_run, d->body,
                            d->body_len, NULL, 0);
}

static void decision_answer(struct decision *d, int status, const char *outcome, const char *msg)
{
    struct agw_worker *w = d->w;

    d->status = status;
    d->outcome = outcome;
    agw_metrics_request(w->metrics, d->agent->id, status);
    if (status == 202) {
        record_decision(d);
        agw_metrics_add(w->metrics, AGW_C_DECISIONS_FORWARDED, 1);
        agw_gw_reply_accepted(d->req, "decision_forwarded", d->thread_id, d->run_id);
    } else {
        agw_metrics_add(w->metrics, AGW_C_DECISION_FAILURES, 1);
        agw_req_reply_error(d->req, status, "%s", msg);
    }
}

static void decision_free(struct decision *d)
{
    agw_gw_release(d->wc);
    agw_gw_req_info_clear(&d->ri);
    free(d->thread_id);
    free(d->run_id);
    free(d->client_thread);
    free(d->client_run);
    free(d->backend);
    free(d->body);
    free(d);
}

/* The backend answered the decision by starting a run: relay that stream to the client as a run
 * of its own (registered, normalised, logged like any run), with the decision's ids. The relay
 * takes the exchange, the request and the request's log record; <d> goes. */
static void decision_to_run(struct decision *d, const struct agw_http1_response *resp)
{
    struct agw_worker *w = d->w;
    const struct agw_config *cfg = d->wc->cfg;
    struct run_ctx *rc = agw_xcalloc(1, sizeof(*rc));
    struct agw_upstream *up = d->up;
    struct agw_relay_params p = {
        .req = d->req,
        .agent_id = d->agent->id,
        .thread_id = d->client_thread,
        .run_id = d->client_run,
        .protocol = d->agent->protocol,
        .backends = &d->backend_pool,
        .n_backends = 1,
        .body = "",
        .stream_buffer_bytes = cfg->limits.stream_buffer_bytes,
        .max_frame_bytes = cfg->limits.max_frame_bytes,
        .heartbeat_ms = cfg->timeouts.heartbeat_ms,
        .run_ms = cfg->timeouts.run_ms,
        .runs = w->runs,
        .runs_part = w->index,
        .detach = d->agent->on_client_disconnect == AGW_DISCONNECT_DETACH,
        .store = w->gw->store,
        .on_end = agw_gw_run_ended,
        .arg = rc,
    };

    record_decision(d);
    agw_log_info("req=%s the backend answered the decision with a new stream: relayed as a run",
                 agw_req_id(d->req));
    rc->w = w;
    rc->ri = d->ri; /* moved */
    memset(&d->ri, 0, sizeof(d->ri));
    rc->key_id = d->key_id;
    rc->wc = d->wc; /* moved: the run holds the configuration now */
    d->wc = NULL;
    agw_metrics_add(w->metrics, AGW_C_DECISIONS_STREAMED, 1);
    agw_metrics_add(w->metrics, AGW_C_RUNS_STARTED, 1);
    d->up = NULL;
    agw_relay_adopt(w->relays, &p, up, resp);
    decision_free(d); /* the relay's close callback replaced ours on the request */
}

/* The reason a backend gave with a refusal: its JSON "error" or "message" when it has one, else its
 * body's start; printable ASCII only (it is quoted to the client). */
static void refusal_reason(const struct decision *d, char *out, size_t len)
{
    json_t *j = json_loadb(d->reason, d->reason_len, 0, NULL);
    json_t *e = json_is_object(j) ? json_object_get(j, "error") : NULL;
    const char *text = d->reason;
    size_t n = d->reason_len, k = 0;

    if (json_is_object(e))
        e = json_object_get(e, "message");
    if (!json_is_string(e) && json_is_object(j))
        e = json_object_get(j, "message");
    if (json_is_string(e)) {
        text = json_string_value(e);
        n = json_string_length(e);
    }
    for (size_t i = 0; i < n && k + 1 < len; i++) {
        unsigned char c = (unsigned char)text[i];
        out[k++] = c >= 0x20 && c < 0x7f && c != '"' && c != '\\' ? (char)c : ' ';
    }
    while (k > 0 && out[k - 1] == ' ')
        k--;
    out[k] = '\0';
    json_decref(j);
}

static void decision_refused(struct decision *d)
{
    char why[200], msg[320];

    refusal_reason(d, why, sizeof(why));
    if (why[0] != '\0')
        snprintf(msg, sizeof(msg), "bad gateway: the backend refused the decision with HTTP %d: %s",
                 d->refused_status, why);
    else
        snprintf(msg, sizeof(msg), "bad gateway: the backend refused the decision with HTTP %d",
                 d->refused_status);
    decision_answer(d, 502, "decision_refused", msg);
}

/* The backend's answer decides (doc/human-in-the-loop.md, "What the backend's answer means"):
 * 202/204, or another 2xx that is no stream, took the decision into the live run → 202; a 2xx
 * event stream is a new run → relayed; anything else is an error. With decisions.forward "live"
 * only 202/204 count. */
static void decision_on_head(void *arg, const struct agw_http1_response *resp)
{
    struct decision *d = arg;
    int status = resp->status;
    bool live_only = d->agent->decisions_forward == AGW_FORWARD_LIVE;
    bool stream = agw_is_event_stream(resp->content_type);
    char msg[256];

    if (status < 200 || status > 299) {
        d->refused_status = status; /* its reason follows in the body */
        return;
    }
    if (stream && !live_only) {
        decision_to_run(d, resp);
        return;
    }
    if (status == 202 || status == 204 || (!stream && !live_only)) {
        /* The body is not wanted; reading it to its end lets the connection be reused. Released
         * before answering: the answer may end the request, and <d> with it. */
        agw_upstream_release(d->up);
        d->up = NULL;
        decision_answer(d, 202, "decision_forwarded", NULL);
        return;
    }
    /* decisions.forward "live": a backend that starts a run for the decision (or answers 200) did
     * not take it into the live run. Closing tells a streaming backend to stop. */
    agw_upstream_close(d->up);
    d->up = NULL;
    snprintf(msg, sizeof(msg),
             "bad gateway: the backend answered the decision with HTTP %d%s, not 202 "
             "(decisions.forward is \"live\")",
             status, stream ? " and a new event stream" : "");
    decision_answer(d, 502, "decision_not_live", msg);
}

static void decision_on_body(void *arg, struct evbuffer *body)
{
    struct decision *d = arg;
    size_t n = evbuffer_get_length(body), room = sizeof(d->reason) - d->reason_len;

    if (d->refused_status != 0 && room > 0)
        d->reason_len +=
            (size_t)evbuffer_remove(body, d->reason + d->reason_len, n < room ? n : room);
    evbuffer_drain(body, evbuffer_get_length(body));
    if (d->refused_status != 0 && d->reason_len == sizeof(d->reason) && d->status == 0) {
        agw_upstream_close(d->up); /* enough of the reason: no need to wait for the rest */
        d->up = NULL;
        decision_refused(d);
    }
}

static void decision_on_done(void *arg)
{
    struct decision *d = arg;

    if (d->refused_status != 0 && d->status == 0) {
        agw_upstream_close(d->up);
        d->up = NULL;
        decision_refused(d);
    }
}

static void decision_on_error(void *arg, enum agw_up_failure kind, const char *detail)
{
    struct decision *d = arg;
    bool timeout = kind == AGW_UP_FIRST_BYTE_TIMEOUT;
    char msg[256];

    agw_upstream_close(d->up);
    d->up = NULL;
    if (d->refused_status != 0) { /* the refusal's body was cut: what came is the reason */
        decision_refused(d);
        return;
    }
    agw_metrics_upstream_failure(d->w->metrics, kind);
    snprintf(msg, sizeof(msg), "%s: the decision could not be forwarded: %s",
             timeout ? "gateway timeout" : "bad gateway", detail);
    decision_answer(d, timeout ? 504 : 502, "decision_failed", msg);
}

static const struct agw_upstream_callbacks decision_cbs = {
    .on_head = decision_on_head,
    .on_body = decision_on_body,
    .on_done = decision_on_done,
    .on_error = decision_on_error,
};

static void decision_closed(struct agw_req *req, void *arg)
{
    struct decision *d = arg;

    agw_upstream_close(d->up); /* the client left before the backend answered */
    agw_gw_access_log(&d->ri, d->agent->id, d->thread_id, d->run_id, d->key_id, d->status, 0, 0,
                      agw_now_ms() - agw_req_start_ms(req), d->backend,
                      d->outcome != NULL ? d->outcome : "client_closed", false);
    decision_free(d);
}

/* The pool of this loop for the backend <url> of <agent> (runs on another loop name their backend
 * by its configured URL), or NULL. */
static struct agw_upstream_pool *pool_for(struct agw_worker *w,
                                          const struct agw_agent_config *agent, const char *url)
{
    struct agent_rt *art = &w->wc->agents[agent - w->wc->cfg->agents];

    for (size_t j = 0; j < agent->n_upstreams; j++)
        if (strcmp(agent->upstreams[j].text, url) == 0)
            return art->pools[j];
    return NULL;
}

/* A decision-only request (doc/protocol.md#decisions): see include/agw/decision.h. The run may be
 * on any loop: what the decision needs of it is copied under the registry's lock, and the decision
 * goes to the same backend through this loop's pool. */
bool agw_decision_route(struct agw_worker *w, struct agw_req *req,
                        const struct agw_agent_config *agent, const struct agw_auth_key *key,
                        const struct agw_input *in, const struct agw_upstream_header *h, size_t n,
                        const char *body, size_t body_len)
{
    const struct agw_decisions_config *dc = &w->wc->cfg->decisions;
    struct agw_run_entry *e;
    struct decision *d;
    struct agw_upstream_pool *pool = NULL;
    char msg[1024], *key_text = NULL, *backend_url = NULL, *thread_id = NULL, *run_id = NULL;

    agw_runs_lock(w->runs);
    e = dc->match == AGW_MATCH_THREAD
            ? agw_runs_latest(w->runs, agent->id, in->thread_id)
            : agw_runs_find(w->runs, agent->id, in->thread_id, in->run_id);
    if (e != NULL) {
        key_text = agw_xstrdup(e->key);
        backend_url = agw_xstrdup(e->backend_url);
        thread_id = agw_xstrdup(e->thread_id);
        run_id = agw_xstrdup(e->run_id);
    }
    agw_runs_unlock(w->runs);
    if (e == NULL) {
        if (dc->no_active_run == AGW_NO_ACTIVE_RUN_NEW_RUN)
            return false;
        agw_metrics_add(w->metrics, AGW_C_DECISIONS_REJECTED, 1);
        snprintf(msg, sizeof(msg),
                 "bad request: no active run found for thread '%s', runId: %s; cannot "
                 "apply decisions",
                 in->thread_id, in->run_id);
        agw_gw_reply_error(w, req, agent->id, 400, msg);
        return true;
    }
    pool = pool_for(w, agent, backend_url);
    if (pool == NULL) { /* a reload took the run's backend out of the agent */
        agw_gw_reply_error(w, req, agent->id, 502,
                           "bad gateway: the backend of the active run is no longer configured");
        free(key_text);
        free(backend_url);
        free(thread_id);
        free(run_id);
        return true;
    }
    d = agw_xcalloc(1, sizeof(*d));
    d->w = w;
    d->req = req;
    d->wc = agw_gw_hold(w);
    agw_gw_req_info_copy(w, &d->ri, req);
    d->agent = agent;
    d->key_id = key != NULL ? key->id : NULL;
    d->thread_id = thread_id;
    d->run_id = run_id;
    d->client_thread = agw_xstrdup(in->thread_id);
    d->client_run = agw_xstrdup(in->run_id);
    d->backend_pool = pool;
    d->backend = agw_xstrdup(agw_upstream_pool_url(pool)->authority);
    if (w->gw->store != NULL) {
        d->body = agw_xmalloc(body_len > 0 ? body_len : 1);
        memcpy(d->body, body, body_len);
        d->body_len = body_len;
    }
    agw_log_info("req=%s decision for %s -> %s", agw_req_id(req), key_text, backend_url);
    free(key_text);
    free(backend_url);
    agw_req_on_close(req, decision_closed, d);
    d->up = agw_upstream_start(pool, h, n, body, body_len, &decision_cbs, d);
    return true;
}

/* Cancels the runs of <agent_id> with <run_id> that live on this loop; returns how many. */
static size_t cancel_here(struct agw_worker *w, const char *agent_id, const char *run_id)
{
    struct agw_run_entry *e[AGW_CANCEL_MAX];
    void *owners[AGW_CANCEL_MAX];
    size_t n, k = 0;

    agw_runs_lock(w->runs);
    n = agw_runs_by_run_id(w->runs, agent_id, run_id, e, AGW_CANCEL_MAX);
    for (size_t i = 0; i < n && i < AGW_CANCEL_MAX; i++)
        if (e[i]->home == w->base)
            owners[k++] = e[i]->owner;
    agw_runs_unlock(w->runs);
    /* Only this loop ends these relays: they are still alive. */
    for (size_t i = 0; i < k; i++) {
        agw_relay_cancel(owners[i]);
        agw_metrics_add(w->metrics, AGW_C_RUNS_CANCELLED, 1);
    }
    return k;
}

struct cancel_msg {
    struct agw_worker *w;
    char agent_id[AGW_ID_MAX + 1], run_id[AGW_ID_MAX + 1];
};

static void cancel_msg_cb(void *arg)
{
    struct cancel_msg *m = arg;

    cancel_here(m->w, m->agent_id, m->run_id);
    free(m);
}

/* POST /v1/ag-ui/agents/{agent}/runs/{run}/cancel: every active run of the agent with that run id
 * (normally one; ids are meant to be unique) ends with RUN_ERROR CANCELLED and its upstream is
 * closed: at once on this loop, on the next turn of the loop that holds it otherwise. */
void agw_decision_cancel(struct agw_worker *w, struct agw_req *req, const struct agw_route *route)
{
    const struct agw_auth_key *key = NULL;
    struct agw_run_entry *e[AGW_CANCEL_MAX];
    const void *homes[AGW_CANCEL_MAX];
    struct req_info ri = agw_gw_req_info(w, req);
    char msg[2 * AGW_ID_MAX + 80], *thread = NULL;
    size_t n;

    if (!agw_gw_authorize(w, req, route->agent_id, &key))
        return;
    if (agw_config_find_agent(w->wc->cfg, route->agent_id) == NULL) {
        snprintf(msg, sizeof(msg), "agent not found: %s", route->agent_id);
        agw_gw_reply_error(w, req, NULL, 404, msg);
        return;
    }
    agw_runs_lock(w->runs);
    n = agw_runs_by_run_id(w->runs, route->agent_id, route->run_id, e, AGW_CANCEL_MAX);
    if (n > AGW_CANCEL_MAX)
        n = AGW_CANCEL_MAX;
    for (size_t i = 0; i < n; i++)
        homes[i] = e[i]->home;
    if (n > 0)
        thread = agw_xstrdup(e[0]->thread_id);
    agw_runs_unlock(w->runs);
    if (n == 0) {
        snprintf(msg, sizeof(msg), "not found: no active run '%s' for agent '%s'", route->run_id,
                 route->agent_id);
        agw_gw_reply_error(w, req, route->agent_id, 404, msg);
        return;
    }
    /* Every other loop that holds one of these runs is told once. */
    for (size_t i = 0; i < n; i++) {
        bool seen = homes[i] == w->base;
        for (size_t j = 0; j < i && !seen; j++)
            seen = homes[j] == homes[i];
        if (seen)
            continue;
        struct agw_worker *other = agw_gw_worker_of(w->gw, homes[i]);
        if (other == NULL)
            continue;
        struct cancel_msg *m = agw_xcalloc(1, sizeof(*m));
        m->w = other;
        snprintf(m->agent_id, sizeof(m->agent_id), "%s", route->agent_id);
        snprintf(m->run_id, sizeof(m->run_id), "%s", route->run_id);
        agw_gw_post(other, cancel_msg_cb, m);
    }
    cancel_here(w, route->agent_id, route->run_id);
    agw_gw_reply_accepted(req, "cancelled", thread, route->run_id);
    agw_metrics_request(w->metrics, route->agent_id, 202);
    agw_gw_access_log(&ri, route->agent_id, thread, route->run_id, key != NULL ? key->id : NULL,
                      202, 0, 0, agw_now_ms() - agw_req_start_ms(req), NULL, "cancelled", false);
    free(thread);
}
