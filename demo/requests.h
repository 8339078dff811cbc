/* Answering a complete request (doc/demo-agent.md, "Endpoints"): GET or HEAD /healthz,
 * /_demo/stats and /_demo/last-request (405 for another method, 404 for another /_demo/ path); any
 * other path is the agent: a POST (405 for another method) with the knobs in its query and
 * X-Demo-* headers and a RunAgentInput body. An agent POST is kept for /_demo/last-request, then
 * refused (400), taken as a decision for a waiting run (hitl.h), or becomes a run: its plan built
 * by scenarios.h, answered after first_byte_delay_ms by stream.h. */
#ifndef DEMO_REQUESTS_H
#define DEMO_REQUESTS_H

struct conn;

/* Called by http.c with the request complete in <c> (method, target, headers, body). Answers it
 * (send_*(), http.h) or starts a run (CONN_ST_DELAY). */
void handle_request(struct conn *c);

#endif
