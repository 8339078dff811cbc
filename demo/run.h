/* A run: one response to an agent POST, as a plan of steps built at request time (scenarios.h,
 * hitl.h) and a cursor that walks it. A TEXT_MESSAGE_CONTENT step stands for <count> events whose
 * deltas cycle through its pieces, so a run of 10^8 events costs no memory. emit_next() turns the
 * event under the cursor into an SSE frame in r->batch, formatted as the knobs say (dialect, crlf,
 * comments, multiline, ts). Nothing here does I/O: stream.h puts the frames on the wire.
 *
 * Ownership: a struct run owns its steps and every string in them, its buffers and its pending tool
 * call; it is owned by its connection (c->run, http.h) and freed by run_free(). */
#ifndef DEMO_RUN_H
#define DEMO_RUN_H

#include <jansson.h>

#include "agw/common.h"

#include "knobs.h"

struct evbuffer;

enum ev_kind {
    EV_RUN_STARTED,
    EV_TEXT_START,
    EV_TEXT_CONTENT,
    EV_TEXT_END,
    EV_TOOL_START,
    EV_TOOL_ARGS,
    EV_TOOL_END,
    EV_TOOL_RESULT,
    EV_RUN_FINISHED,
    EV_RUN_ERROR,
    EV_REASONING_START, /* a reasoning span, and the one reasoning message in it (one delta each) */
    EV_REASONING_MESSAGE_START,
    EV_REASONING_MESSAGE_CONTENT,
    EV_REASONING_MESSAGE_END,
    EV_REASONING_END,
    EV_ACTIVITY_SNAPSHOT, /* <id>, and <text>: the content's JSON */
    EV_ACTIVITY_DELTA,    /* <id>, and <text>: the patch's JSON */
    EV_LITERAL,           /* <text>: the event's JSON as it is sent, <name>: its type */
    EV_DONE,              /* data: [DONE] */
    EV_STALL,             /* not an event: production stops here for good */
    EV_WAIT,              /* not an event: production waits here for a decision (wait_decision=1) */
};

/* One delta of a text message: the raw text and its JSON string literal (quotes included), made
 * once. */
struct piece {
    char *raw;
    size_t raw_len;
    char *lit;
    size_t lit_len;
};

/* One step of the plan. All strings are owned by the step. A TEXT_MESSAGE_CONTENT step stands for
 * <count> events whose deltas cycle through <pieces>. */
struct step {
    enum ev_kind kind;
    char *id;      /* messageId (text, result) or toolCallId (tool start/args/end) */
    char *call_id; /* TOOL_CALL_RESULT: toolCallId */
    char *name;    /* TOOL_CALL_START: toolCallName */
    char *parent;  /* TOOL_CALL_START: parentMessageId, or NULL */
    char *text;    /* TOOL_CALL_ARGS delta / TOOL_CALL_START args (cloudbase) / TOOL_CALL_RESULT
                      content */
    struct piece *pieces;
    size_t npieces;
    uint64_t count;
    char *prefix; /* content fast path: {"type":"TEXT_MESSAGE_CONTENT","messageId":"…","delta": */
    size_t prefix_len;
};

/* One response to an agent POST: the knobs, the plan and where production stands. Owned by its
 * conn. */
struct run {
    struct knobs k;
    char *thread_id;
    char *run_id;
    const char *scenario; /* static name, for logs and the X-Demo-Scenario header */
    struct step *steps;
    size_t nsteps, cap;
    size_t cur;             /* next step */
    uint64_t rep;           /* next repetition of a content step */
    uint64_t emitted;       /* events produced so far */
    struct evbuffer *batch; /* frames of the current callback, before transfer coding */
    struct evbuffer *hold;  /* framing=length: the whole body until the end */
    char *scratch;          /* one serialised event */
    size_t scratch_cap;
    bool stalled; /* reached EV_STALL */
    bool waiting; /* reached EV_WAIT: a decision-only POST for this run resumes it */
    uint64_t seq; /* start order, to find a thread's latest waiting run */
    /* wait_decision: the frontend tool call the decision answers */
    char *pending_call, *pending_name, *pending_args;
    size_t followup_msg; /* the follow-up text's lowest id number (msg_<n>): past the run's own */
    bool blocked;        /* stopped at OUT_HIGH: the write callback resumes it */
};

/* Appends a zeroed step of <kind> to the plan and returns it (valid until the next plan_add). */
struct step *plan_add(struct run *r, enum ev_kind kind);
/* TEXT_MESSAGE_START, the content (<ntexts> deltas; for the run's <final> text the events and size
 * knobs replace them) and TEXT_MESSAGE_END for message <id>; with stall=1, an EV_STALL instead of
 * the end. The strings are copied. */
void plan_text(struct run *r, const char *id, const char *const *texts, size_t ntexts, bool final);
/* TOOL_CALL_START, TOOL_CALL_ARGS (in the start event with dialect=cloudbase) and TOOL_CALL_END.
 * <parent> may be NULL. The strings are copied. */
void plan_tool_call(struct run *r, const char *call_id, const char *name, const char *parent,
                    const char *args);
/* RUN_STARTED, unless lifecycle=none. */
void plan_begin(struct run *r);
/* Adds an ACTIVITY_SNAPSHOT (<delta> false) or ACTIVITY_DELTA of activity message <id> (type
 * "plan"), <json> its content or patch. */
void plan_activity(struct run *r, const char *id, bool delta, const char *json);
/* Adds event <ev> (taken: a JSON object with a string "type"), sent as its compact dump. */
void plan_literal(struct run *r, json_t *ev);
/* Adds a reasoning span <span> holding reasoning message <id>, one REASONING_MESSAGE_CONTENT per
 * text of <texts>. */
void plan_reasoning(struct run *r, const char *span, const char *id, const char *const *texts,
                    size_t ntexts);
/* The run's end as the knobs say: RUN_ERROR (fail=1) or RUN_FINISHED (unless lifecycle=none), then
 * [DONE] (done=1). */
void plan_end(struct run *r);
/* Frees the run and everything it owns; NULL is a no-op. */
void run_free(struct run *r);
/* Serialises the event under the cursor into r->batch and moves the cursor on. The cursor must be
 * on an event: not past the end, not on EV_STALL or EV_WAIT. */
void emit_next(struct run *r);

#endif
