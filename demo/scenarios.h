/* The demo scenarios (doc/demo-agent.md): the plan of a run is the first that matches of
 *   (a) the last message is a tool result: a text that uses it ("tool-result", or
 *       "confirm-approved" / "confirm-denied" for a confirmation tool);
 *   (b) a destructive request and a confirmation tool (confirmAction): ask, call it ("confirm");
 *   (c) a frontend tool the user asked for: call it with arguments made from its parameters and the
 *       user's words ("frontend-tool");
 *   (d) the weather: a server-side tool, called and answered here ("weather");
 *   (e) anything else: a friendly reply echoing the user ("chat").
 * Ids follow the message count (msg_<n+1>, call_00x), so that a scripted conversation gets the
 * seed's ids; with the knob ids=run each is followed by "-<runId>", new in every run. After a
 * frontend tool call, wait_decision=1 ends the plan with EV_WAIT and leaves the pending call in the
 * run for hitl.c. */
#ifndef DEMO_SCENARIOS_H
#define DEMO_SCENARIOS_H

#include <jansson.h>

#include "agw/common.h"

struct run;

/* Plans run <r> (knobs set, ids set) for RunAgentInput <in> and sets r->scenario. */
void plan_build(struct run *r, const json_t *in);
/* Plans the answer to tool <name> (called with <args>; both may be NULL) returning <content> (may
 * be NULL) as text message msg_<msg_no>, then the run's end, as scenario (a) does. Returns the
 * outcome's scenario name. */
const char *plan_followup(struct run *r, const char *name, const char *args, const char *content,
                          size_t msg_no);

#endif
