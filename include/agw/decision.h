/* Human in the loop, the gateway's part (doc/human-in-the-loop.md): a decision-only request for an
 * active run is forwarded to the backend serving that run, whose answer decides what the client
 * gets (202 when the backend took it into the live run, its new stream relayed as a run, or an
 * error); and the cancel endpoint. Both answer the request themselves. */
#ifndef AGW_DECISION_H
#define AGW_DECISION_H

#include "agw/common.h"

struct agw_worker;
struct agw_req;
struct agw_agent_config;
struct agw_auth_key;
struct agw_input;
struct agw_upstream_header;
struct agw_route;

/* A decision-only request (<in>, validated; <body> its bytes, forwarded as they are with the
 * upstream headers <h>) for <agent>. When an active run matches (decisions.match), it is forwarded
 * to that run's backend; with decisions.no_active_run "reject" an unmatched one gets 400. Returns
 * false when the request should start a new run instead (nothing was answered). */
bool agw_decision_route(struct agw_worker *w, struct agw_req *req,
                        const struct agw_agent_config *agent, const struct agw_auth_key *key,
                        const struct agw_input *in, const struct agw_upstream_header *h, size_t n,
                        const char *body, size_t body_len);

/* POST /v1/ag-ui/agents/{agent}/runs/{run}/cancel: every active run of the agent with that run id
 * ends with RUN_ERROR CANCELLED and its upstream is closed; 202, or 404 when there is none. */
void agw_decision_cancel(struct agw_worker *w, struct agw_req *req, const struct agw_route *route);

#endif
