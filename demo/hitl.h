/* Human in the loop on the backend's side (doc/demo-agent.md, "Waiting for a decision"). With
 * wait_decision=1 a run that calls a frontend tool stays open at EV_WAIT, its pending call kept in
 * the run. A decision-only POST (doc/protocol.md#decisions, classified exactly as the gateway does)
 * for its thread then gets what the decision knob says (enum decision_mode, knobs.h): live applies
 * it to the waiting run, which answers the tool as scenario (a) would and ends; stream ends the
 * waiting run without it and plays it as a new run; empty and refuse leave the waiting run as it
 * is. */
#ifndef DEMO_HITL_H
#define DEMO_HITL_H

#include <jansson.h>

#include "agw/common.h"

#include "knobs.h"

struct conn;

/* Called with every agent POST on <c> whose body parsed to the object <in>, before it becomes a
 * run. When it is a decision-only POST and a run of its thread waits (that exact run by runId,
 * else the thread's latest), answers it as <mode> says: live (202 naming the waiting run, which
 * resumes), empty (an empty event stream) or refuse (409), and returns true: <c> is answered. It
 * returns false when the POST is to be played as a new run: no decision, no waiting run, or
 * decision=stream (the waiting run has then been ended without it). */
bool take_decision(struct conn *c, const json_t *in, enum decision_mode mode);

#endif
