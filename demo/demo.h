/* agui-demo-agent: the small AG-UI backend bundled with the gateway.
 *
 * It is the upstream behind the README's run command and the scriptable peer of every integration,
 * interop and benchmark test, so it is built like the gateway itself: one libevent loop, never
 * blocking, with backpressure (a stream is produced in batches while the connection's output stays
 * under OUT_HIGH and resumed from the write callback when it drains, or from a timer when events
 * are paced). It speaks HTTP/1.1 itself on raw bufferevents rather than through evhttp because its
 * test knobs need control evhttp does not give: close-delimited bodies, dropping the TCP connection
 * mid-stream, writing the response one byte at a time.
 *
 * Lifetime: a struct conn is owned by the struct demo's list from accept until it is freed, which
 * happens only at the top of a bufferevent or timer callback (never from a nested helper): helpers
 * that want the connection gone put it in CONN_ST_CLOSING and the next callback frees it once its
 * output is flushed. A struct run (one response to an agent POST) is owned by its connection. See
 * doc/demo-agent.md for the endpoints and knobs.
 *
 * The program is one module per job (doc/demo-agent.md, "Source layout"):
 *   main.c       the command line, signals, the listener and the loop
 *   http.c       connections: accepting, parsing requests, queuing responses, the write path
 *   requests.c   answering a complete request: routes, /healthz, /_demo/..., the agent POST
 *   knobs.c      the test knobs: their table, parsing the query and X-Demo-* headers, errors
 *   scenarios.c  choosing the scenario of a RunAgentInput and planning its events
 *   hitl.c       human in the loop: waiting runs and the decisions that resume them
 *   run.c        a run's plan of steps and the SSE frames made from it (no I/O)
 *   stream.c     producing a run's response on its connection: framing, batches, backpressure
 *   util.c       small text and JSON helpers
 *
 * This header holds the one thing they all share: the process state, struct demo. */
#ifndef DEMO_DEMO_H
#define DEMO_DEMO_H

#include <jansson.h>

#include "agw/common.h"

struct event_base;
struct evconnlistener;
struct event;
struct conn;

/* The process: its loop, listener and connections, and the counters GET /_demo/stats shows. One,
 * owned by main(). The connection list and its counters belong to http.c; the run counters are
 * kept where runs start (requests.c), end (stream.c; http.c when the client goes away) and wait or
 * take decisions (stream.c, hitl.c). */
struct demo {
    struct event_base *base;
    struct evconnlistener *listener;
    struct event *sig_term, *sig_int;
    struct event *relisten; /* re-enables the listener after an accept error (EMFILE) */
    struct conn *conns;
    uint64_t next_id;
    uint64_t requests;       /* agent POSTs */
    uint64_t active_streams; /* runs accepted and not yet ended */
    uint64_t client_closed;  /* runs whose client went away before their end */
    uint64_t completed;      /* runs whose last byte was queued */
    uint64_t dropped;        /* runs ended by drop_after */
    uint64_t waiting;        /* runs waiting for a decision */
    uint64_t decisions;      /* decision-only POSTs applied to a waiting run (answered 202) */
    uint64_t run_seq;
    uint64_t connections; /* open connections */
    uint64_t accepted;    /* connections accepted since start */
    json_t *last_request; /* the last agent POST, as /_demo/last-request shows it */
};

#endif
