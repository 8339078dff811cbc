/* What the gateway's files share (src/gateway.c: wiring, routing, runs; src/decision.c: decisions
 * and cancellation): the gateway object and the helpers that answer, count and log a request.
 * Private to those files. */
#ifndef AGW_GATEWAY_INTERNAL_H
#define AGW_GATEWAY_INTERNAL_H

#include <pthread.h>

#include <openssl/ssl.h>

#include "agw/auth.h"
#include "agw/balance.h"
#include "agw/config.h"
#include "agw/gateway.h"
#include "agw/http_server.h"
#include "agw/limits.h"
#include "agw/loop.h"
#include "agw/metrics.h"
#include "agw/ratelimit.h"
#include "agw/relay.h"
#include "agw/runs.h"
#include "agw/store.h"
#include "agw/upstream.h"

#define MAX_PORTS      (AGW_MAX_LISTENERS + 1) /* the listeners and the admin listener */
#define AGW_CANCEL_MAX 64 /* runs one cancel request ends (ids are meant to be unique) */

struct event_base;
struct evdns_base;
struct event;

/* Per-agent runtime state of one loop: its backends' pools and health, the round-robin cursor. */
struct agent_rt {
    const struct agw_agent_config *cfg;
    struct agw_upstream_pool **pools;
    struct agw_health *health; /* per backend: gc->health[agent] (shared by the loops) */
    const char **keys;         /* the backends' URLs, for balancing (borrowed from cfg) */
    size_t rr;
};

/* A configuration in force, shared by every loop: the loaded file and what is built from it once
 * (the TLS contexts). Reference-counted (atomically): each loop's wconf holds one, and the gateway
 * one for the current configuration. */
struct gconf {
    unsigned refs;
    struct agw_config *cfg; /* owned */
    SSL_CTX **listener_tls; /* per cfg->listeners[i]: its server context, or NULL without TLS */
    SSL_CTX **agent_tls;    /* per cfg->agents[i]: the client context for https backends, or NULL */
    /* per cfg->agents[i], per backend: passive health as every loop sees it (balance.h); changed
     * under <health_lock> (failures, and the first success after them: rare) */
    struct agw_health **health;
    pthread_mutex_t health_lock;
    unsigned generation; /* 1 at start, +1 per reload */
};

/* A configuration as one loop uses it: the shared gconf and this loop's upstream pools for its
 * agents. The loop's current one is w->wc; whatever outlives the handler that started it (a run, a
 * decision on its way) holds a reference (agw_gw_hold), so that a reload never pulls an agent, a
 * key or a pool from under it: runs in flight keep the settings they started with. Loop-local: no
 * lock. References are dropped on the loop's next turn (agw_gw_release), after the object that
 * dropped it has stopped using the pools. */
struct wconf {
    struct agw_worker *w;
    unsigned refs;    /* the loop's own while current, plus one per holder */
    unsigned pending; /* references released, to drop on the next turn */
    struct gconf *gc;
    const struct agw_config *cfg; /* gc->cfg */
    struct agent_rt *agents;      /* parallel to cfg->agents */
    struct wconf *next;           /* the loop's wconfs still alive, current first */
};

/* One event loop (a worker): its own listeners (the same addresses as every other worker's, bound
 * with SO_REUSEPORT), DNS, upstream pools and relays. A request, its relay and its upstream
 * connections live and die on the loop that accepted it; another loop reaches them only through
 * agw_gw_post(). */
struct agw_worker {
    struct agw_gateway *gw;      /* the process: what every loop shares */
    struct wconf *wc;            /* the configuration this loop serves new requests with */
    struct agw_runs *runs;       /* gw->runs: shared, locked (include/agw/runs.h) */
    struct agw_metrics *metrics; /* this loop's counts (gw->all_metrics[index + 1]) */
    unsigned index;
    struct event_base *base;
    struct evdns_base *dns;
    struct agw_server *srv;
    struct agw_server *admin; /* worker 0's only */
    struct agw_relay_set *relays;
    /* What other threads hand this loop (include/agw/loop.h): the store's answers, and the
     * other loops' work (agw_gw_post()) */
    struct agw_loop_mailbox *inbox;
    struct wconf *wconfs; /* every wconf of this loop still alive */
    struct event *reaper; /* drops released wconf references */
    struct event *drain_poll;
    struct agw_loop_probe *probe;     /* AGW_LOOP_PROBE_MS only */
    uint32_t batch_window_us;         /* the configuration's batch_window_us (restart only) */
    struct agw_loop_stats loop_stats; /* read by /metrics on any loop: atomic */
    bool draining;
    bool shutdown_sent;
    bool thread_started;
    pthread_t thread;
};

/* The process: the configuration in force, the shared registry, counters and rate limits, the
 * workers, the signals (handled on worker 0, which runs on the main thread) and the drain. */
struct agw_gateway {
    struct gconf *gc;                 /* the configuration in force (worker 0's thread only) */
    char *config_path;                /* re-read on SIGHUP; NULL: reloads are refused */
    int workers_override;             /* --workers, or -1 */
    struct agw_runs *runs;            /* the active-run registry (doc/protocol.md#decisions) */
    struct agw_metrics *metrics;      /* the process's own counts (reloads) */
    struct agw_metrics **all_metrics; /* [0] = <metrics>, then each worker's: /metrics sums them */
    struct agw_ratelimit *ratelimit;
    struct agw_store *store; /* thread history; NULL when history.enabled is false */
    struct agw_worker *workers;
    unsigned n_workers;
    uint16_t ports[MAX_PORTS];
    size_t n_ports;
    int listener_index[MAX_PORTS]; /* server listener index of cfg->listeners[i] */
    struct event *sig_term, *sig_int, *sig_hup, *sig_usr1;
    bool draining;           /* worker 0's thread only */
    uint64_t drain_start_ms; /* written before the drain is posted to the workers */
    uint32_t drain_ms;       /* timeouts.drain of the configuration in force when it began */
    unsigned loops_ended;    /* workers other than 0 whose loop has ended (atomic) */
};

/* A reference to <w>'s current configuration, for an object that outlives its handler. */
struct wconf *agw_gw_hold(struct agw_worker *w);
/* Gives it back (NULL: nothing); dropped on the loop's next turn. */
void agw_gw_release(struct wconf *wc);

/* Runs <fn>(<arg>) on <w>'s loop, on its next turn (from any thread). */
void agw_gw_post(struct agw_worker *w, void (*fn)(void *arg), void *arg);
/* The worker whose event loop is <base>, or NULL. */
struct agw_worker *agw_gw_worker_of(struct agw_gateway *gw, const void *base);

/* What the access log says of a request: borrowed from the request while it is alive
 * (agw_gw_req_info), or copied when the line is written later, after the request may be gone (a
 * detached run, a decision: agw_gw_req_info_copy, then agw_gw_req_info_clear). */
struct req_info {
    const char *id, *peer, *method, *path;
    unsigned worker; /* the event loop that took the request */
    char *copy;      /* agw_gw_req_info_copy: the four strings, in one block */
};

struct req_info agw_gw_req_info(const struct agw_worker *w, const struct agw_req *req);
void agw_gw_req_info_copy(const struct agw_worker *w, struct req_info *ri,
                          const struct agw_req *req);
void agw_gw_req_info_clear(struct req_info *ri);
void agw_gw_access_log(const struct req_info *ri, const char *agent, const char *thread,
                       const char *run, const char *key_id, int status, uint64_t events,
                       uint64_t bytes, uint64_t duration_ms, const char *upstream,
                       const char *outcome, bool detached);

/* Answers 202 {"status":<status>,"threadId":…,"runId":…}. */
void agw_gw_reply_accepted(struct agw_req *req, const char *status, const char *thread,
                           const char *run);
/* Answers an error, logs and counts it. */
void agw_gw_reply_error(struct agw_worker *w, struct agw_req *req, const char *agent, int status,
                        const char *msg);
/* Bearer auth for everything under /v1/. <agent_id> NULL: any valid key will do. Answers 401 or 403
 * itself and returns false; on success *<key> is the matching key (NULL with auth off). */
bool agw_gw_authorize(struct agw_worker *w, struct agw_req *req, const char *agent_id,
                      const struct agw_auth_key **key);

/* A run's record until its relay ends: the relay's on_end (agw_gw_run_ended) counts and logs it,
 * then frees this. */
struct run_ctx {
    struct agw_worker *w;
    struct wconf *wc;                 /* held: the configuration the run started with */
    struct agent_rt *art;             /* its agent's, in <wc> */
    uint8_t order[AGW_MAX_UPSTREAMS]; /* the backends in the order tried: indices into art's */
    struct req_info ri;
    const char *key_id;      /* borrowed from wc's config */
    struct agw_rl_entry *rl; /* the rate limits' slot it took, or NULL */
};

void agw_gw_run_ended(void *arg, const struct agw_relay_summary *s);

#endif
