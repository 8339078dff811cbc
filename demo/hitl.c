/* Waiting runs and the decisions that resume them (see hitl.h). A waiting run is a connection in
 * CONN_ST_STREAM whose run stopped at EV_WAIT; resuming it appends the rest of the plan past
 * EV_WAIT and lets the connection's timer pump it from the loop. */
#include "config.h"

#include <assert.h>
#include <inttypes.h>
#include <string.h>

#include <event2/buffer.h>
#include <jansson.h>

#include "agw/common.h"
#include "agw/input.h"
#include "agw/log.h"

#include "demo.h"
#include "hitl.h"
#include "http.h"
#include "run.h"
#include "scenarios.h"
#include "util.h"

/* Decision-only requests (doc/protocol.md#decisions), decided exactly as the gateway decides them
 * (src/input.c): no user message with non-blank content, and a tool message with a toolCallId. A
 * body the gateway would refuse is no decision. */
static bool decision_only(const char *body, size_t len)
{
    struct agw_input in = {0};
    bool yes = agw_input_parse(body, len, 0, &in, NULL, 0) == 0 && in.decision_only;

    agw_input_clear(&in);
    return yes;
}

/* The waiting run a decision for (<thread>, <run>) is for: that exact run, else the thread's
 * latest.
 */
static struct conn *find_waiting(struct demo *d, const char *thread, const char *run)
{
    struct conn *best = NULL;

    if (!thread)
        return NULL;
    for (struct conn *c = d->conns; c; c = c->next) {
        struct run *r = c->run;
        if (c->state != CONN_ST_STREAM || !r || !r->waiting || strcmp(r->thread_id, thread) != 0)
            continue;
        if (run && strcmp(r->run_id, run) == 0)
            return c;
        if (!best || r->seq > best->run->seq)
            best = c;
    }
    return best;
}

/* Resumes the waiting run of <wc> with the decision <in>, which came on connection <from>: the tool
 * message answering the pending call (else the last tool message) is answered as scenario (a)
 * would, with the run's own tool name and arguments, then the run ends. The follow-up text's id is
 * msg_<n+1> for a decision of n messages, as in scenario (a), but never below the run's own floor:
 * a decision carrying only its tool message would otherwise reuse the run's msg_2. The run keeps
 * its scenario name (X-Demo-Scenario, sent at the end with framing=length). */
static void apply_decision(struct conn *wc, const json_t *in, uint64_t from)
{
    struct run *r = wc->run;
    const json_t *messages = json_object_get(in, "messages"), *m, *answer = NULL;
    size_t i, msg_no = json_array_size(messages) + 1;
    const char *outcome;

    assert(r->waiting && r->steps[r->cur].kind == EV_WAIT);
    json_array_foreach(messages, i, m)
    {
        const char *role = str_field(m, "role"), *call = str_field(m, "toolCallId");
        if (!role || strcmp(role, "tool") != 0 || !call)
            continue;
        if (!answer || strcmp(str_field(answer, "toolCallId"), r->pending_call) != 0)
            answer = m;
    }
    if (msg_no < r->followup_msg)
        msg_no = r->followup_msg;
    outcome =
        plan_followup(r, r->pending_name, r->pending_args, str_field(answer, "content"), msg_no);
    agw_log_info("conn %" PRIu64 ": decision for run %s (thread %s, %s %s) applied to conn %" PRIu64
                 ": %s",
                 from, r->run_id, r->thread_id, r->pending_name, r->pending_call, wc->id, outcome);
    r->cur++; /* past EV_WAIT */
    r->rep = 0;
    r->waiting = false;
    wc->d->waiting--;
    wc->d->decisions++;
    arm_timer(wc, 0); /* production resumes from the loop */
}

/* decision=stream: the waiting run of <wc> ends without the decision that came on connection <from>
 * (which is answered as a new run). */
static void abandon_wait(struct conn *wc, uint64_t from)
{
    struct run *r = wc->run;

    assert(r->waiting && r->steps[r->cur].kind == EV_WAIT);
    agw_log_info("conn %" PRIu64 ": decision for run %s taken as a new run; conn %" PRIu64
                 " ends without it",
                 from, r->run_id, wc->id);
    r->cur++; /* past EV_WAIT */
    r->rep = 0;
    r->waiting = false;
    wc->d->waiting--;
    plan_end(r);
    arm_timer(wc, 0);
}

/* An agent POST on <c> whose body parsed to <in>: when it is a decision for a waiting run, answers
 * it as <mode> says (see hitl.h). The decision=stream answer is the caller's: a new run. */
bool take_decision(struct conn *c, const json_t *in, enum decision_mode mode)
{
    struct conn *wc;

    if (!decision_only((const char *)evbuffer_pullup(c->body, -1), evbuffer_get_length(c->body)))
        return false;
    wc = find_waiting(c->d, str_field(in, "threadId"), str_field(in, "runId"));
    if (wc && mode == DECISION_LIVE) {
        json_t *ack = json_pack("{s:s,s:s,s:s}", "status", "accepted", "threadId",
                                wc->run->thread_id, "runId", wc->run->run_id);
        apply_decision(wc, in, c->id);
        send_json(c, 202, ack, "", false);
        return true;
    }
    if (wc && mode == DECISION_EMPTY) {
        agw_log_info("conn %" PRIu64 ": decision for waiting run %s: an empty stream", c->id,
                     wc->run->run_id);
        send_response(c, 200, "text/event-stream", "", 0, "", false);
        return true;
    }
    if (wc && mode == DECISION_REFUSE) {
        send_error(c, 409, "thread already running: the decision was not taken", false);
        return true;
    }
    if (wc) /* DECISION_STREAM: the decision is a new run, played by the caller */
        abandon_wait(wc, c->id);
    return false;
}
