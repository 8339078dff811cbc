/* The per-request test knobs (doc/demo-agent.md, "Knobs"): how a run is shaped (events, size,
 * scenario ending, ids), paced and written (delay_ms, first_byte_delay_ms, bytewise, write_each),
 * framed (framing, crlf, comments, multiline, content_type, dialect), ended (drop_after, stall,
 * fail, done, hangup, status) and how a waiting run takes decisions (wait_decision, decision).
 *
 * They come from the query string of an agent POST and from X-Demo-<Name> headers ('-' for '_'),
 * the header winning. An unknown query parameter is ignored (it may mean something to someone
 * else); an unknown X-Demo- header is an error (it is a typo), and so is a value out of range: the
 * request is answered 400 with a message naming the knob. The knob table and the parsing are
 * private to knobs.c; a struct knobs is a plain value (no pointers), embedded in its run. */
#ifndef DEMO_KNOBS_H
#define DEMO_KNOBS_H

#include "agw/common.h"

struct header;

enum framing { FRAMING_CHUNKED = 0, FRAMING_CLOSE, FRAMING_LENGTH };
enum dialect { DIALECT_AGUI = 0, DIALECT_CLOUDBASE, DIALECT_AGKIT };

/* Per-request test knobs, from the query string and X-Demo-<Name> headers (the header wins). -1 =
 * unset. */
struct knobs {
    int64_t events;   /* content events of the final text message; -1 = the scenario's own */
    int64_t size;     /* bytes of each content delta (filler text); -1 = the scenario's text */
    int64_t delay_ms; /* between events; 0 = as fast as the client reads */
    int64_t first_byte_delay_ms; /* before the status line */
    int64_t drop_after;          /* close the connection after this many events; -1 = never */
    int64_t stall;         /* 1 = stop after the first content event and keep the connection open */
    int64_t wait_decision; /* 1 = after a frontend tool call, wait for a decision-only POST */
    int64_t decision;      /* enum decision_mode: what a decision for a waiting run gets */
    int64_t status;        /* 0 = stream; else answer this status with a JSON error */
    int64_t crlf, bytewise, done, fail, multiline, comments, ts; /* booleans */
    int64_t reasoning;  /* 1 = the conversation's answer follows a reasoning message */
    int64_t activity;   /* 1 = the conversation shows a plan as an activity message */
    int64_t metadata;   /* 1 = text messages' start and end events carry metadata */
    int64_t subagent;   /* 1 = the conversation's answer streams as chunks beside a sub-agent's */
    int64_t write_each; /* 1 = every event its own chunk in its own write(), even unpaced */
    int64_t lifecycle_none; /* 1 = no RUN_STARTED / RUN_FINISHED */
    int64_t dialect;        /* enum dialect */
    int64_t framing;        /* enum framing */
    int64_t hangup;         /* enum hangup: what becomes of a kept-alive connection afterwards */
    int64_t ids;            /* enum ids: how message and tool-call ids are made */
    char content_type[256]; /* "" = text/event-stream */
};

/* A backend's keep-alive timeout, as a client sees it: the connection was kept alive, then closed
 * while idle ("idle"), or as the next request arrived, unanswered ("next"). */
enum hangup { HANGUP_NONE = 0, HANGUP_IDLE, HANGUP_NEXT };

/* Message and tool-call ids: from the request's message count alone (msg_<n+1>, call_00x: a
 * scripted conversation gets the seed's ids), or those followed by "-<runId>", new in every run (as
 * a model's ids are), so that a client resending the same messages still gets new messages. */
enum ids { IDS_COUNT = 0, IDS_RUN };

/* What a decision-only POST for a waiting run gets: "live" applies it to the waiting run and
 * answers 202 (a backend that takes live decisions); "stream" treats it as a new run, streamed
 * back, and the waiting run ends without it (as Mastra and AG-Kit servers do); "empty" answers an
 * empty event stream and leaves the waiting run as it is (as CopilotKit's runtime does: "already
 * running"); "refuse" answers 409 with a JSON error and leaves the waiting run as it is. */
enum decision_mode { DECISION_LIVE = 0, DECISION_STREAM, DECISION_EMPTY, DECISION_REFUSE };

/* Unsets every knob (see struct knobs for what unset means). */
void knobs_init(struct knobs *k);
/* Applies the knobs of <query> (the target after '?', "" for none) and then of the X-Demo-* fields
 * among the <nhdrs> header fields <hdrs> (names lowercase, http.h) to <k>. Returns 0, or
 * -AGW_EINVAL with the reason, for a 400, in <err>. */
int knobs_parse(struct knobs *k, const char *query, const struct header *hdrs, size_t nhdrs,
                char *err, size_t errlen);

#endif
