/* What the gateway's files share (src/gateway.c: wiring, routing, runs; src/decision.c: decisions
 * and cancellation): the gateway object and the helpers that answer, count and log a request.
 * Private to those files. */
#ifndef AGW_GATEWAY_INTERNAL_H
#define AGW_GATEWAY_INTERNAL_H

#include "agw/auth.h"
#include "agw/config.h"
#include "agw/gateway.h"
#include "agw/http_server.h"
#include "agw/limits.h"
#include "agw/metrics.h"
#include "agw/relay.h"
#include "agw/runs.h"
#include "agw/upstream.h"

#define MAX_PORTS (AGW_MAX_LISTENERS + 1) /* the listeners and the admin listener */

struct event_base;
struct evdns_base;
struct event;

/* Per-agent runtime state: its backends' pools on this loop and the round-robin cursor. */
struct agent_rt {
    const struct agw_agent_config *cfg;
    struct agw_upstream_pool **pools;
    const char **keys; /* the backends' URLs, for balancing (borrowed from cfg) */
    size_t rr;
};

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
    struct agw_metrics *metrics;
};

/* What the access log says of a request: borrowed from the request while it is alive
 * (agw_gw_req_info), or copied when the line is written later, after the request may be gone (a
 * detached run, a decision: agw_gw_req_info_copy, then agw_gw_req_info_clear). */
struct req_info {
    const char *id, *peer, *method, *path;
    char *copy; /* agw_gw_req_info_copy: the four strings, in one block */
};

struct req_info agw_gw_req_info(const struct agw_req *req);
void agw_gw_req_info_copy(struct req_info *ri, const struct agw_req *req);
void agw_gw_req_info_clear(struct req_info *ri);
void agw_gw_access_log(const struct req_info *ri, const char *agent, const char *thread,
                       const char *run, const char *key_id, int status, uint64_t events,
                       uint64_t bytes, uint64_t duration_ms, const char *upstream,
                       const char *outcome, bool detached);

/* Answers 202 {"status":<status>,"threadId":…,"runId":…}. */
void agw_gw_reply_accepted(struct agw_req *req, const char *status, const char *thread,
                           const char *run);
/* Answers an error, logs and counts it. */
void agw_gw_reply_error(struct agw_gateway *gw, struct agw_req *req, const char *agent, int status,
                        const char *msg);
/* Bearer auth for everything under /v1/. <agent_id> NULL: any valid key will do. Answers 401 or 403
 * itself and returns false; on success *<key> is the matching key (NULL with auth off). */
bool agw_gw_authorize(struct agw_gateway *gw, struct agw_req *req, const char *agent_id,
                      const struct agw_auth_key **key);

/* A run's record until its relay ends: the relay's on_end (agw_gw_run_ended) counts and logs it,
 * then frees this. */
struct run_ctx {
    struct agw_gateway *gw;
    struct req_info ri;
    const char *key_id; /* borrowed from the config */
};

void agw_gw_run_ended(void *arg, const struct agw_relay_summary *s);

#endif
