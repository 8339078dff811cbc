/* The gateway: configuration → event loop, listeners, upstream pools, relays; and the request
 * handler that answers every route of doc/protocol.md#endpoints (auth, validation, relaying). */
#include "config.h"

#include <assert.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <jansson.h>
#include <openssl/sha.h>

#include "agw/auth.h"
#include "agw/gateway.h"
#include "agw/http_server.h"
#include "agw/input.h"
#include "agw/log.h"
#include "agw/relay.h"
#include "agw/router.h"
#include "agw/runs.h"
#include "agw/tls.h"
#include "agw/upstream.h"

#define MAX_PORTS            17
#define MAX_UPSTREAM_HEADERS 64
#define DRAIN_POLL_MS        100
#define DRAIN_GRACE_MS       2000 /* after SHUTDOWN events are written, time for clients to take them */

/* Per-agent runtime state: its backends' pools on this loop and the round-robin cursor. */
struct agent_rt {
    const struct agw_agent_config *cfg;
    struct agw_upstream_pool **pools;
    size_t rr;
};

/* Counters for /metrics (one loop, no locking needed). */
struct status_count {
    char agent[65];
    int status;
    uint64_t n;
};

struct metrics {
    struct status_count *requests;
    size_t n_requests, cap_requests;
    uint64_t events, bytes, runs_started, auth_failures;
    uint64_t decisions_forwarded, decisions_failed, decisions_rejected, decisions_streamed;
    uint64_t runs_cancelled;
    uint64_t upstream_failures[8];
};

static const char *const failure_kinds[] = {"connect",      "connect_timeout", "first_byte_timeout",
                                            "idle_timeout", "protocol",        "closed",
                                            "tls",          "status"};

struct agw_gateway {
    const struct agw_config *cfg;
    struct event_base *base;
    struct evdns_base *dns;
    struct agw_server *srv;
    struct agw_server *admin;
    struct agw_relay_set *relays;
    struct agw_runs *runs;   /* the active-run registry (doc/protocol.md#decisions) */
    struct agent_rt *agents; /* parallel to cfg->agents */
    uint16_t ports[MAX_PORTS];
    size_t n_ports;
    int listener_index[MAX_PORTS]; /* server listener index of cfg->listeners[i] */
    struct event *sig_term, *sig_int, *sig_hup, *drain_poll;
    bool draining;
    bool shutdown_sent;
    uint64_t drain_start_ms;
    struct metrics m;
};

/* ---- metrics ----------------------------------------------------------------------------------
 */

static void count_request(struct agw_gateway *gw, const char *agent, int status)
{
    struct metrics *m = &gw->m;

    if (agent == NULL)
        agent = "";
    for (size_t i = 0; i < m->n_requests; i++) {
        if (m->requests[i].status == status && strcmp(m->requests[i].agent, agent) == 0) {
            m->requests[i].n++;
            return;
        }
    }
    /* Agents come from the config (bounded); unknown agent ids are counted under "" so a client
     * cannot grow this table. */
    if (agent[0] != '\0' && agw_config_find_agent(gw->cfg, agent) == NULL)
        agent = "";
    if (m->n_requests == m->cap_requests) {
        m->cap_requests = m->cap_requests ? 2 * m->cap_requests : 16;
        m->requests = agw_xrealloc(m->requests, m->cap_requests * sizeof(*m->requests));
    }
    snprintf(m->requests[m->n_requests].agent, sizeof(m->requests[0].agent), "%s", agent);
    m->requests[m->n_requests].status = status;
    m->requests[m->n_requests].n = 1;
    m->n_requests++;
}

static void count_failure(struct agw_gateway *gw, const char *kind)
{
    for (size_t i = 0; i < AGW_ARRAY_LEN(failure_kinds); i++) {
        if (kind != NULL && strcmp(kind, failure_kinds[i]) == 0) {
            gw->m.upstream_failures[i]++;
            return;
        }
    }
}

/* What the servers count by themselves: requests refused before routing, failed accepts. */
static void serve_server_metrics(struct agw_gateway *gw, struct evbuffer *b)
{
    static const int statuses[] = AGW_SERVER_REFUSAL_STATUSES;
    struct agw_server_stats st, admin = {0};

    agw_server_get_stats(gw->srv, &st);
    if (gw->admin != NULL)
        agw_server_get_stats(gw->admin, &admin);
    evbuffer_add_printf(b, "# HELP agw_requests_refused_total Requests refused by the HTTP parser "
                           "before routing (malformed, too large, unsupported), by status.\n"
                           "# TYPE agw_requests_refused_total counter\n");
    for (size_t i = 0; i < AGW_ARRAY_LEN(statuses); i++)
        evbuffer_add_printf(b, "agw_requests_refused_total{status=\"%d\"} %" PRIu64 "\n",
                            statuses[i], st.refused[i] + admin.refused[i]);
    evbuffer_add_printf(b,
                        "# HELP agw_accept_errors_total Failed accept() calls (e.g. out of file "
                        "descriptors; accepting pauses briefly).\n"
                        "# TYPE agw_accept_errors_total counter\nagw_accept_errors_total %" PRIu64
                        "\n",
                        st.accept_errors + admin.accept_errors);
}

static void serve_metrics(struct agw_gateway *gw, struct agw_req *req)
{
    struct evbuffer *b = evbuffer_new();
    struct metrics *m = &gw->m;
    size_t len;

    evbuffer_add_printf(b,
                        "# HELP agw_requests_total Requests answered, by agent and HTTP status.\n"
                        "# TYPE agw_requests_total counter\n");
    for (size_t i = 0; i < m->n_requests; i++)
        evbuffer_add_printf(b, "agw_requests_total{agent=\"%s\",status=\"%d\"} %" PRIu64 "\n",
                            m->requests[i].agent, m->requests[i].status, m->requests[i].n);
    evbuffer_add_printf(
        b,
        "# HELP agw_active_runs Runs in the active-run registry (streaming, attached or "
        "detached).\n"
        "# TYPE agw_active_runs gauge\nagw_active_runs %zu\n"
        "# HELP agw_open_relays Runs being relayed, including those still reaching their "
        "upstream.\n"
        "# TYPE agw_open_relays gauge\nagw_open_relays %zu\n"
        "# HELP agw_runs_started_total Runs handed to an upstream.\n"
        "# TYPE agw_runs_started_total counter\nagw_runs_started_total %" PRIu64 "\n"
        "# HELP agw_events_relayed_total AG-UI events written to clients.\n"
        "# TYPE agw_events_relayed_total counter\nagw_events_relayed_total %" PRIu64 "\n"
        "# HELP agw_bytes_relayed_total Stream body bytes written to clients.\n"
        "# TYPE agw_bytes_relayed_total counter\nagw_bytes_relayed_total %" PRIu64 "\n"
        "# HELP agw_auth_failures_total Requests refused with 401 or 403.\n"
        "# TYPE agw_auth_failures_total counter\nagw_auth_failures_total %" PRIu64 "\n"
        "# HELP agw_decisions_forwarded_total Decision-only requests forwarded to a live run "
        "(202).\n"
        "# TYPE agw_decisions_forwarded_total counter\nagw_decisions_forwarded_total %" PRIu64 "\n"
        "# HELP agw_decision_failures_total Decisions the backend refused or did not answer "
        "(502/504).\n"
        "# TYPE agw_decision_failures_total counter\nagw_decision_failures_total %" PRIu64 "\n"
        "# HELP agw_decisions_rejected_total Decisions with no active run, refused (400).\n"
        "# TYPE agw_decisions_rejected_total counter\nagw_decisions_rejected_total %" PRIu64 "\n"
        "# HELP agw_decisions_streamed_total Decisions the backend answered with a new stream, "
        "relayed to the client as a run.\n"
        "# TYPE agw_decisions_streamed_total counter\nagw_decisions_streamed_total %" PRIu64 "\n"
        "# HELP agw_runs_cancelled_total Runs ended by the cancel endpoint.\n"
        "# TYPE agw_runs_cancelled_total counter\nagw_runs_cancelled_total %" PRIu64 "\n"
        "# HELP agw_upstream_failures_total Upstream failures, by kind.\n"
        "# TYPE agw_upstream_failures_total counter\n",
        agw_runs_count(gw->runs), agw_relay_set_count(gw->relays), m->runs_started, m->events,
        m->bytes, m->auth_failures, m->decisions_forwarded, m->decisions_failed,
        m->decisions_rejected, m->decisions_streamed, m->runs_cancelled);
    for (size_t i = 0; i < AGW_ARRAY_LEN(failure_kinds); i++)
        evbuffer_add_printf(b, "agw_upstream_failures_total{kind=\"%s\"} %" PRIu64 "\n",
                            failure_kinds[i], m->upstream_failures[i]);
    serve_server_metrics(gw, b);
    len = evbuffer_get_length(b);
    agw_req_reply(req, 200, "text/plain; version=0.0.4", (const char *)evbuffer_pullup(b, -1), len);
    evbuffer_free(b);
}

/* ---- access log ------------------------------------------------------------------------------ */

/* What the access log says of a request: borrowed from the request while it is alive
 * (req_info_of), or copied when the line is written later, after the request may be gone (a
 * detached run, a decision: req_info_copy, then req_info_clear). */
struct req_info {
    const char *id, *peer, *method, *path;
    char *copy; /* req_info_copy: the four strings, in one block */
};

static struct req_info req_info_of(const struct agw_req *req)
{
    return (struct req_info){agw_req_id(req), agw_req_peer(req), agw_req_method_name(req),
                             agw_req_path(req), NULL};
}

static void req_info_copy(struct req_info *ri, const struct agw_req *req)
{
    if (!agw_log_access_enabled())
        return; /* no line will be written: nothing to keep (access_log() returns at once) */
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

static void req_info_clear(struct req_info *ri)
{
    free(ri->copy);
    ri->copy = NULL;
}

static void access_log(const struct req_info *ri, const char *agent, const char *thread,
                       const char *run, const char *key_id, int status, uint64_t events,
                       uint64_t bytes, uint64_t duration_ms, const char *upstream,
                       const char *outcome, bool detached)
{
    json_t *o;
    char *line;

    if (!agw_log_access_enabled())
        return;
    o = json_object();
    json_object_set_new(o, "time", json_integer((json_int_t)agw_wall_ms()));
    json_object_set_new(o, "request_id", json_string(ri->id));
    json_object_set_new(o, "client", json_string(ri->peer));
    json_object_set_new(o, "method", json_string(ri->method));
    /* The path may hold ids a client chose: jansson refuses invalid UTF-8, so it is logged only
     * when valid. */
    json_object_set_new(o, "path", json_string(ri->path) ?: json_string("(invalid utf-8)"));
    if (agent != NULL)
        json_object_set_new(o, "agent", json_string(agent));
    if (thread != NULL)
        json_object_set_new(o, "thread", json_string(thread));
    if (run != NULL)
        json_object_set_new(o, "run", json_string(run));
    if (key_id != NULL)
        json_object_set_new(o, "key", json_string(key_id));
    json_object_set_new(o, "status", json_integer(status));
    json_object_set_new(o, "events", json_integer((json_int_t)events));
    json_object_set_new(o, "bytes", json_integer((json_int_t)bytes));
    json_object_set_new(o, "duration_ms", json_integer((json_int_t)duration_ms));
    if (upstream != NULL)
        json_object_set_new(o, "upstream", json_string(upstream));
    if (outcome != NULL)
        json_object_set_new(o, "outcome", json_string(outcome));
    if (detached)
        json_object_set_new(o, "detached", json_true());
    line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (line != NULL)
        agw_log_access(line);
    free(line);
    json_decref(o);
}

/* Answers 202 {"status":<status>,"threadId":…,"runId":…} (the ids are valid UTF-8: they come from
 * parsed JSON through the run registry). */
static void reply_accepted(struct agw_req *req, const char *status, const char *thread,
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
static void reply_error(struct agw_gateway *gw, struct agw_req *req, const char *agent, int status,
                        const char *msg)
{
    struct req_info ri = req_info_of(req);

    agw_req_reply_error(req, status, "%s", msg);
    count_request(gw, agent, status);
    access_log(&ri, agent, NULL, NULL, NULL, status, 0, 0, agw_now_ms() - agw_req_start_ms(req),
               NULL, "error", false);
}

/* ---- runs --------------------------------------------------------------------------------------
 */

struct run_ctx {
    struct agw_gateway *gw;
    struct req_info ri;
    const char *key_id; /* borrowed from the config */
};

static void run_ended(void *arg, const struct agw_relay_summary *s)
{
    struct run_ctx *rc = arg;
    struct agw_gateway *gw = rc->gw;

    gw->m.events += s->events;
    gw->m.bytes += s->bytes;
    count_request(gw, s->agent_id, s->status ? s->status : 499);
    if (s->upstream_error != NULL)
        count_failure(gw, s->upstream_error);
    access_log(&rc->ri, s->agent_id, s->thread_id, s->run_id, rc->key_id, s->status, s->events,
               s->bytes, s->duration_ms, s->upstream, s->outcome, s->detached);
    req_info_clear(&rc->ri);
    free(rc);
}

/* Rendezvous hashing: each backend's weight is a hash of (thread, backend URL); the heaviest wins
 * and the others follow in weight order for retries. Adding or removing a backend moves only the
 * threads that hashed to it, so backends that keep per-thread state keep their threads. */
static uint64_t fnv1a(const char *a, const char *b)
{
    uint64_t h = 1469598103934665603ULL;

    for (; *a; a++)
        h = (h ^ (unsigned char)*a) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL;
    for (; *b; b++)
        h = (h ^ (unsigned char)*b) * 1099511628211ULL;
    /* final avalanche (splitmix64) */
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 31;
    return h;
}

static void order_backends(struct agent_rt *a, const char *thread_id,
                           struct agw_upstream_pool **out)
{
    size_t n = a->cfg->n_upstreams;

    if (a->cfg->balance == AGW_BALANCE_ROUND_ROBIN) {
        size_t first = a->rr++ % n;
        for (size_t i = 0; i < n; i++)
            out[i] = a->pools[(first + i) % n];
        return;
    }
    uint64_t w[64];
    for (size_t i = 0; i < n; i++) {
        out[i] = a->pools[i];
        w[i] = fnv1a(thread_id, a->cfg->upstreams[i].text);
    }
    for (size_t i = 1; i < n; i++) { /* insertion sort, descending weight; n is small */
        for (size_t j = i; j > 0 && w[j] > w[j - 1]; j--) {
            uint64_t tw = w[j];
            struct agw_upstream_pool *tp = out[j];
            w[j] = w[j - 1];
            out[j] = out[j - 1];
            w[j - 1] = tw;
            out[j - 1] = tp;
        }
    }
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
        if (*fc->n < MAX_UPSTREAM_HEADERS &&
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
static bool authorize(struct agw_gateway *gw, struct agw_req *req, const char *agent_id,
                      const struct agw_auth_key **key)
{
    char msg[AGW_ID_MAX + 80];

    switch (agw_auth_check(&gw->cfg->auth, agw_req_header(req, "Authorization"), agent_id, key)) {
    case AGW_AUTH_OK:
        return true;
    case AGW_AUTH_FORBIDDEN:
        gw->m.auth_failures++;
        snprintf(msg, sizeof(msg), "forbidden: this key may not use agent '%s'", agent_id);
        reply_error(gw, req, agent_id, 403, msg);
        return false;
    default:
        gw->m.auth_failures++;
        agw_req_add_header(req, "WWW-Authenticate", "Bearer realm=\"agui-gateway\"");
        reply_error(gw, req, agent_id, 401, "unauthorized: a valid bearer token is required");
        return false;
    }
}

/* ---- human in the loop (doc/protocol.md#decisions) ---------------------------------------------
 */

/* One decision on its way to the backend of the run waiting for it. Lives until the client's
 * request is gone, or until the backend's answer turns out to be a stream, which a relay then
 * takes over. */
struct decision {
    struct agw_gateway *gw;
    struct agw_req *req;
    struct agw_upstream *up;
    struct agw_upstream_pool *backend_pool;
    struct req_info ri;
    const struct agw_agent_config *agent; /* borrowed from the config */
    const char *key_id;                   /* borrowed from the config */
    char *thread_id, *run_id;             /* the active run's */
    char *client_thread, *client_run;     /* the decision's own (a stream is relayed with them) */
    char *backend;                        /* its backend's authority, for the log */
    int status;                           /* answered to the client */
    const char *outcome;
    int refused_status; /* a non-2xx answer whose body is being read for its reason */
    char reason[256];
    size_t reason_len;
};

static void decision_answer(struct decision *d, int status, const char *outcome, const char *msg)
{
    struct agw_gateway *gw = d->gw;

    d->status = status;
    d->outcome = outcome;
    count_request(gw, d->agent->id, status);
    if (status == 202) {
        gw->m.decisions_forwarded++;
        reply_accepted(d->req, "decision_forwarded", d->thread_id, d->run_id);
    } else {
        gw->m.decisions_failed++;
        agw_req_reply_error(d->req, status, "%s", msg);
    }
}

static void decision_free(struct decision *d)
{
    req_info_clear(&d->ri);
    free(d->thread_id);
    free(d->run_id);
    free(d->client_thread);
    free(d->client_run);
    free(d->backend);
    free(d);
}

/* The backend answered the decision by starting a run: relay that stream to the client as a run
 * of its own (registered, normalised, logged like any run), with the decision's ids. The relay
 * takes the exchange, the request and the request's log record; <d> goes. */
static void decision_to_run(struct decision *d, const struct agw_http1_response *resp)
{
    struct agw_gateway *gw = d->gw;
    const struct agw_config *cfg = gw->cfg;
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
        .runs = gw->runs,
        .detach = d->agent->on_client_disconnect == AGW_DISCONNECT_DETACH,
        .on_end = run_ended,
        .arg = rc,
    };

    agw_log_info("req=%s the backend answered the decision with a new stream: relayed as a run",
                 agw_req_id(d->req));
    rc->gw = gw;
    rc->ri = d->ri; /* moved */
    memset(&d->ri, 0, sizeof(d->ri));
    rc->key_id = d->key_id;
    gw->m.decisions_streamed++;
    gw->m.runs_started++;
    d->up = NULL;
    agw_relay_adopt(gw->relays, &p, up, resp);
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

static void decision_on_error(void *arg, const char *kind, const char *detail)
{
    struct decision *d = arg;
    bool timeout = kind == AGW_UP_ERR_FIRST_BYTE_TIMEOUT;
    char msg[256];

    agw_upstream_close(d->up);
    d->up = NULL;
    if (d->refused_status != 0) { /* the refusal's body was cut: what came is the reason */
        decision_refused(d);
        return;
    }
    count_failure(d->gw, kind);
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
    access_log(&d->ri, d->agent->id, d->thread_id, d->run_id, d->key_id, d->status, 0, 0,
               agw_now_ms() - agw_req_start_ms(req), d->backend,
               d->outcome != NULL ? d->outcome : "client_closed", false);
    decision_free(d);
}

/* A decision-only request (doc/protocol.md#decisions). When an active run matches, the same body
 * goes to the backend serving it, whose answer decides (decision_on_head); with
 * decisions.no_active_run = "reject" an unmatched decision gets 400. Returns false when the request
 * should start a new run instead. */
static bool route_decision(struct agw_gateway *gw, struct agw_req *req,
                           const struct agw_agent_config *agent, const struct agw_auth_key *key,
                           const struct agw_input *in, const struct agw_upstream_header *h,
                           size_t n, const char *body, size_t body_len)
{
    const struct agw_decisions_config *dc = &gw->cfg->decisions;
    struct agw_run_entry *e;
    struct decision *d;
    char msg[1024];

    e = dc->match == AGW_MATCH_THREAD
            ? agw_runs_latest(gw->runs, agent->id, in->thread_id)
            : agw_runs_find(gw->runs, agent->id, in->thread_id, in->run_id);
    if (e == NULL) {
        if (dc->no_active_run == AGW_NO_ACTIVE_RUN_NEW_RUN)
            return false;
        gw->m.decisions_rejected++;
        snprintf(msg, sizeof(msg),
                 "bad request: no active run found for thread '%s', runId: %s; cannot "
                 "apply decisions",
                 in->thread_id, in->run_id);
        reply_error(gw, req, agent->id, 400, msg);
        return true;
    }
    d = agw_xcalloc(1, sizeof(*d));
    d->gw = gw;
    d->req = req;
    req_info_copy(&d->ri, req);
    d->agent = agent;
    d->key_id = key != NULL ? key->id : NULL;
    d->thread_id = agw_xstrdup(e->thread_id);
    d->run_id = agw_xstrdup(e->run_id);
    d->client_thread = agw_xstrdup(in->thread_id);
    d->client_run = agw_xstrdup(in->run_id);
    d->backend_pool = e->backend;
    d->backend = agw_xstrdup(agw_upstream_pool_url(e->backend)->authority);
    agw_log_info("req=%s decision for %s -> %s", agw_req_id(req), e->key, e->backend_url);
    agw_req_on_close(req, decision_closed, d);
    d->up = agw_upstream_start(e->backend, h, n, body, body_len, &decision_cbs, d);
    return true;
}

/* POST /v1/ag-ui/agents/{agent}/runs/{run}/cancel: every active run of the agent with that run id
 * (normally one; ids are meant to be unique) ends with RUN_ERROR CANCELLED and its upstream is
 * closed. */
static void handle_cancel(struct agw_gateway *gw, struct agw_req *req,
                          const struct agw_route *route)
{
    const struct agw_auth_key *key = NULL;
    struct agw_run_entry *e;
    struct req_info ri = req_info_of(req);
    char msg[2 * AGW_ID_MAX + 80], *thread;
    size_t n;

    if (!authorize(gw, req, route->agent_id, &key))
        return;
    if (agw_config_find_agent(gw->cfg, route->agent_id) == NULL) {
        snprintf(msg, sizeof(msg), "agent not found: %s", route->agent_id);
        reply_error(gw, req, NULL, 404, msg);
        return;
    }
    n = agw_runs_by_run_id(gw->runs, route->agent_id, route->run_id, &e, 1);
    if (n == 0) {
        snprintf(msg, sizeof(msg), "not found: no active run '%s' for agent '%s'", route->run_id,
                 route->agent_id);
        reply_error(gw, req, route->agent_id, 404, msg);
        return;
    }
    thread = agw_xstrdup(e->thread_id);
    /* A registered run is streaming, and cancelling it removes it from the registry: at most <n>
     * turns. */
    for (; n > 0 && agw_runs_by_run_id(gw->runs, route->agent_id, route->run_id, &e, 1) > 0; n--) {
        agw_relay_cancel(e->owner);
        gw->m.runs_cancelled++;
    }
    reply_accepted(req, "cancelled", thread, route->run_id);
    count_request(gw, route->agent_id, 202);
    access_log(&ri, route->agent_id, thread, route->run_id, key != NULL ? key->id : NULL, 202, 0, 0,
               agw_now_ms() - agw_req_start_ms(req), NULL, "cancelled", false);
    free(thread);
}

static void handle_run(struct agw_gateway *gw, struct agw_req *req, const struct agw_route *route)
{
    const struct agw_config *cfg = gw->cfg;
    const struct agw_agent_config *agent;
    const struct agw_auth_key *key = NULL;
    struct agent_rt *art;
    struct agw_input in = {0};
    struct evbuffer *body = agw_req_body(req);
    size_t body_len = evbuffer_get_length(body);
    const char *body_data;
    char err[AGW_INPUT_ERR_MAX], msg[AGW_INPUT_ERR_MAX + 80];
    int status;

    if (!authorize(gw, req, route->agent_id, &key))
        return;
    agent = agw_config_find_agent(cfg, route->agent_id);
    if (agent == NULL) {
        snprintf(msg, sizeof(msg), "agent not found: %s", route->agent_id);
        reply_error(gw, req, NULL, 404, msg);
        return;
    }
    if (!agw_input_content_type_ok(agw_req_header(req, "Content-Type"))) {
        reply_error(gw, req, agent->id, 415,
                    "unsupported media type: Content-Type must be application/json");
        return;
    }
    if (body_len > cfg->limits.max_body_bytes) {
        snprintf(msg, sizeof(msg), "payload too large: the limit is %zu bytes",
                 cfg->limits.max_body_bytes);
        reply_error(gw, req, agent->id, 413, msg);
        return;
    }
    body_data = (const char *)evbuffer_pullup(body, -1);
    status =
        agw_input_parse(body_data, body_len, cfg->limits.max_json_depth, &in, err, sizeof(err));
    if (status != 0) {
        reply_error(gw, req, agent->id, status, err);
        return;
    }

    /* Upstream request headers (doc/protocol.md#upstream-request): never the client's
     * Authorization. */
    struct agw_upstream_header h[MAX_UPSTREAM_HEADERS];
    size_t n = 0;
    char traceparent[64], trace_id[33], span_id[17];
    const char *tp = agw_req_header(req, "traceparent");
    h[n++] = (struct agw_upstream_header){"Content-Type", "application/json"};
    h[n++] = (struct agw_upstream_header){"Accept", "text/event-stream"};
    h[n++] = (struct agw_upstream_header){"X-Request-Id", agw_req_id(req)};
    if (traceparent_ok(tp)) {
        snprintf(traceparent, sizeof(traceparent), "%s", tp);
    } else {
        agw_random_hex(trace_id, 16);
        agw_random_hex(span_id, 8);
        snprintf(traceparent, sizeof(traceparent), "00-%s-%s-01", trace_id, span_id);
    }
    h[n++] = (struct agw_upstream_header){"traceparent", traceparent};
    for (size_t i = 0; i < agent->n_upstream_headers && n < MAX_UPSTREAM_HEADERS; i++)
        h[n++] = (struct agw_upstream_header){agent->upstream_headers[i].name,
                                              agent->upstream_headers[i].value};
    struct fwd_ctx fc = {agent, h, &n};
    agw_req_foreach_header(req, forward_header, &fc);

    if (in.decision_only && agent->decisions_forward != AGW_FORWARD_NEVER &&
        route_decision(gw, req, agent, key, &in, h, n, body_data, body_len)) {
        agw_input_clear(&in);
        return;
    }
    art = &gw->agents[agent - cfg->agents];
    struct agw_upstream_pool *order[64];
    order_backends(art, in.thread_id, order);

    struct run_ctx *rc = agw_xcalloc(1, sizeof(*rc));
    rc->gw = gw;
    req_info_copy(&rc->ri, req);
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
        .runs = gw->runs,
        .detach = agent->on_client_disconnect == AGW_DISCONNECT_DETACH,
        .on_end = run_ended,
        .arg = rc,
    };
    gw->m.runs_started++;
    agw_relay_start(gw->relays, &p);
    agw_input_clear(&in);
}

/* ---- dispatch -------------------------------------------------------------------------------- */

static void handle_request(struct agw_req *req, void *arg, bool admin)
{
    struct agw_gateway *gw = arg;
    struct agw_route route;
    char msg[AGW_ID_MAX + 160];
    int rc;

    rc = agw_router_match(agw_req_path(req), agw_req_method(req), &route);
    if (rc == -AGW_EINVAL) {
        reply_error(gw, req, NULL, 400, "bad request: invalid id in the path");
        return;
    }
    /* /metrics lives on the admin listener when there is one; the admin listener serves nothing
     * else. */
    if (rc == 0) {
        bool admin_route = route.id == AGW_ROUTE_HEALTHZ || route.id == AGW_ROUTE_METRICS;
        if (admin && !admin_route)
            rc = -AGW_ENOTFOUND;
        else if (!admin && route.id == AGW_ROUTE_METRICS && gw->admin != NULL)
            rc = -AGW_ENOTFOUND;
    }
    if (rc != 0) {
        snprintf(msg, sizeof(msg), "not found: no route for %.16s %.100s", agw_req_method_name(req),
                 agw_req_path(req));
        reply_error(gw, req, NULL, 404, msg);
        return;
    }
    if (!route.method_allowed) {
        agw_req_add_header(req, "Allow", agw_route_allow(route.id));
        snprintf(msg, sizeof(msg), "method not allowed: use %s", agw_route_allow(route.id));
        reply_error(gw, req, NULL, 405, msg);
        return;
    }
    if (agw_req_method(req) == AGW_METHOD_OPTIONS) {
        /* CORS preflight answers arrive with the operations issue; until then: what the route
         * accepts. */
        agw_req_add_header(req, "Allow", agw_route_allow(route.id));
        agw_req_reply(req, 204, NULL, NULL, 0);
        count_request(gw, NULL, 204);
        return;
    }
    switch (route.id) {
    case AGW_ROUTE_HEALTHZ:
        if (gw->draining) {
            agw_req_reply(req, 503, "application/json", "{\"status\":\"draining\"}", 21);
            count_request(gw, NULL, 503);
        } else {
            agw_req_reply(req, 200, "application/json", "{\"status\":\"ok\"}", 15);
            count_request(gw, NULL, 200);
        }
        return;
    case AGW_ROUTE_METRICS:
        serve_metrics(gw, req);
        count_request(gw, NULL, 200);
        return;
    case AGW_ROUTE_RUNS:
        handle_run(gw, req, &route);
        return;
    case AGW_ROUTE_CANCEL:
        handle_cancel(gw, req, &route);
        return;
    case AGW_ROUTE_THREAD_MESSAGES: {
        const struct agw_auth_key *key = NULL;
        if (!authorize(gw, req, NULL, &key))
            return;
        reply_error(gw, req, NULL, 501,
                    "not implemented yet: this endpoint arrives with a later release");
        return;
    }
    case AGW_ROUTE_NONE:
        break;
    }
    reply_error(gw, req, NULL, 500, "internal error: unrouted request");
}

static void main_handler(struct agw_req *req, void *arg)
{
    handle_request(req, arg, false);
}

static void admin_handler(struct agw_req *req, void *arg)
{
    handle_request(req, arg, true);
}

/* ---- signals and drain ----------------------------------------------------------------------- */

static void drain_poll_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_gateway *gw = arg;
    uint64_t elapsed = agw_now_ms() - gw->drain_start_ms;
    struct timeval tv = {0, DRAIN_POLL_MS * 1000};

    (void)fd;
    (void)what;
    if (agw_relay_set_count(gw->relays) == 0 && agw_server_active_requests(gw->srv) == 0) {
        agw_log_info("drained; exiting");
        event_base_loopexit(gw->base, NULL);
        return;
    }
    if (!gw->shutdown_sent && elapsed >= gw->cfg->timeouts.drain_ms) {
        agw_log_warn("drain timeout: ending %zu runs with RUN_ERROR SHUTDOWN",
                     agw_relay_set_count(gw->relays));
        gw->shutdown_sent = true;
        agw_relay_set_shutdown(gw->relays);
    } else if (gw->shutdown_sent &&
               elapsed >= (uint64_t)gw->cfg->timeouts.drain_ms + DRAIN_GRACE_MS) {
        agw_log_warn("clients did not take their last events; closing");
        event_base_loopexit(gw->base, NULL);
        return;
    }
    evtimer_add(gw->drain_poll, &tv);
}

static void begin_drain(struct agw_gateway *gw, const char *why)
{
    struct timeval tv = {0, 0};

    if (gw->draining) {
        agw_log_warn("%s again: stopping now", why);
        gw->shutdown_sent = true;
        agw_relay_set_shutdown(gw->relays);
        gw->drain_start_ms = agw_now_ms() - gw->cfg->timeouts.drain_ms;
        return;
    }
    agw_log_info("%s: draining (%zu runs active, up to %u ms)", why,
                 agw_relay_set_count(gw->relays), gw->cfg->timeouts.drain_ms);
    gw->draining = true;
    gw->drain_start_ms = agw_now_ms();
    agw_server_drain(gw->srv);
    evtimer_add(gw->drain_poll, &tv);
}

/* SIGHUP: certificates and keys are read again for every TLS listener. A listener whose new files
 * do not load keeps its current ones (and the reason is logged); streams already running are
 * untouched, since each connection keeps the context it started with. (Reloading the whole
 * configuration is a later step.) */
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
        agw_server_set_tls(gw->srv, gw->listener_index[i], tls);
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

struct agw_gateway *agw_gateway_new(const struct agw_config *cfg, char *err, size_t errlen)
{
    struct agw_gateway *gw = agw_xcalloc(1, sizeof(*gw));
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

    gw->cfg = cfg;
    gw->base = event_base_new();
    if (gw->base == NULL) {
        snprintf(err, errlen, "cannot create the event loop");
        goto err;
    }
    /* Name servers from /etc/resolv.conf; resolution never blocks the loop. */
    gw->dns = evdns_base_new(gw->base,
                             EVDNS_BASE_INITIALIZE_NAMESERVERS | EVDNS_BASE_DISABLE_WHEN_INACTIVE);
    if (gw->dns == NULL)
        gw->dns = evdns_base_new(gw->base, 0);
    gw->relays = agw_relay_set_new(gw->base);
    gw->runs = agw_runs_new();
    gw->agents = agw_xcalloc(cfg->n_agents, sizeof(*gw->agents));
    for (size_t i = 0; i < cfg->n_agents; i++) {
        const struct agw_agent_config *a = &cfg->agents[i];
        SSL_CTX *client_tls = NULL;
        gw->agents[i].cfg = a;
        gw->agents[i].pools = agw_xcalloc(a->n_upstreams, sizeof(struct agw_upstream_pool *));
        for (size_t j = 0; j < a->n_upstreams && client_tls == NULL; j++) {
            if (!a->upstreams[j].tls)
                continue;
            char why[256];
            client_tls = agw_tls_client_ctx_new(a->ca_file, why, sizeof(why));
            if (client_tls == NULL) {
                snprintf(err, errlen, "agents.%s.ca_file: %s", a->id, why);
                goto err;
            }
        }
        po.tls = client_tls;
        for (size_t j = 0; j < a->n_upstreams; j++)
            gw->agents[i].pools[j] =
                agw_upstream_pool_new(gw->base, gw->dns, &a->upstreams[j], &po);
        /* Each pool holds its own reference. */
        SSL_CTX_free(client_tls);
        po.tls = NULL;
    }
    gw->srv = agw_server_new(gw->base, &so, main_handler, gw);
    for (size_t i = 0; i < cfg->n_listeners; i++) {
        const struct agw_listener_config *l = &cfg->listeners[i];
        SSL_CTX *tls = NULL;
        char path[64];
        int index;
        snprintf(path, sizeof(path), "listen[%zu].tls", i);
        if (l->tls.cert != NULL &&
            (tls = agw_tls_server_ctx_new(&l->tls, path, err, errlen)) == NULL)
            goto err;
        index = agw_server_listen(gw->srv, l->address, l->port, tls, &gw->ports[gw->n_ports]);
        if (index < 0) {
            snprintf(err, errlen, "listen[%zu]: cannot listen on %s port %u: %s", i, l->address,
                     l->port, evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
            goto err;
        }
        gw->listener_index[i] = index;
        agw_log_info("listening on %s port %u%s", l->address, gw->ports[gw->n_ports],
                     tls != NULL ? " (TLS)" : "");
        gw->n_ports++;
    }
    if (cfg->admin != NULL) {
        gw->admin = agw_server_new(gw->base, &so, admin_handler, gw);
        if (agw_server_listen(gw->admin, cfg->admin->address, cfg->admin->port, NULL,
                              &gw->ports[gw->n_ports]) < 0) {
            snprintf(err, errlen, "admin: cannot listen on %s port %u: %s", cfg->admin->address,
                     cfg->admin->port, evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
            goto err;
        }
        agw_log_info("admin listener on %s port %u", cfg->admin->address, gw->ports[gw->n_ports]);
        gw->n_ports++;
    }
    gw->sig_term = evsignal_new(gw->base, SIGTERM, signal_cb, gw);
    gw->sig_int = evsignal_new(gw->base, SIGINT, signal_cb, gw);
    gw->sig_hup = evsignal_new(gw->base, SIGHUP, signal_cb, gw);
    gw->drain_poll = evtimer_new(gw->base, drain_poll_cb, gw);
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
    /* Servers first: closing their connections ends the relays still attached to them. */
    agw_server_free(gw->srv);
    agw_server_free(gw->admin);
    agw_relay_set_free(gw->relays);
    agw_runs_free(gw->runs);
    for (size_t i = 0; gw->agents != NULL && i < gw->cfg->n_agents; i++) {
        for (size_t j = 0; j < gw->cfg->agents[i].n_upstreams; j++)
            agw_upstream_pool_free(gw->agents[i].pools[j]);
        free(gw->agents[i].pools);
    }
    free(gw->agents);
    free(gw->m.requests);
    if (gw->sig_term != NULL) {
        event_free(gw->sig_term);
        event_free(gw->sig_int);
        event_free(gw->sig_hup);
        event_free(gw->drain_poll);
    }
    if (gw->dns != NULL)
        evdns_base_free(gw->dns, 0);
    if (gw->base != NULL)
        event_base_free(gw->base);
    free(gw);
}

size_t agw_gateway_ports(const struct agw_gateway *gw, uint16_t *ports, size_t max)
{
    size_t n = gw->n_ports < max ? gw->n_ports : max;

    memcpy(ports, gw->ports, n * sizeof(*ports));
    return n;
}

int agw_gateway_run(struct agw_gateway *gw)
{
    event_base_dispatch(gw->base);
    return 0;
}
