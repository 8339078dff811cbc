/* Human in the loop on the backend's side (doc/demo-agent.md, "Waiting for a decision"). With
 * wait_decision=1 a run that calls a frontend tool stays open at EV_WAIT, its pending call kept in
 * the run. A decision-only POST (SPEC §5, classified exactly as the gateway does) for its thread
 * then gets what the decision knob says (enum decision_mode, knobs.h): live applies it to the
 * waiting run, which answers the tool as scenario (a) would and ends; stream ends the waiting run
 * without it and plays it as a new run; empty and refuse leave the waiting run as it is. */
#ifndef DEMO_HITL_H
#define DEMO_HITL_H

#include <jansson.h>

#include "agw/common.h"

struct conn;
struct demo;

/* True when <body> is a decision-only RunAgentInput the gateway would accept. */
bool decision_only(const char *body, size_t len);
/* The connection whose run waits for a decision for (<thread>, <run>): that exact run, else the
 * thread's latest waiting run; NULL when none (or <thread> is NULL). */
struct conn *find_waiting(struct demo *d, const char *thread, const char *run);
/* decision=live: resumes <wc>'s waiting run with the decision <in> (from connection id <from>). */
void apply_decision(struct conn *wc, const json_t *in, uint64_t from);
/* decision=stream: <wc>'s waiting run ends without the decision (which becomes a new run). */
void abandon_wait(struct conn *wc, uint64_t from);

#endif
