/* The HTTP server side: the only module that calls libevhtp (so the server could move to another
 * library without touching the rest). Every request is checked by the strict parser of src/http1.c
 * before libevhtp sees it (refusals — 400, 413, 414, 417, 431, 501, 505 — are answered here and
 * close the connection), a whole request must arrive within a read timeout (slow clients), and
 * complete requests go to one handler, one at a time per connection (pipelined requests wait their
 * turn). Responses are either a whole body or a chunked stream with backpressure callbacks. A
 * client that closes its sending side after its request still gets the answer.
 *
 * Lifetime: a struct agw_req is created when a whole request has arrived and freed by this module
 * after its response ended or its client went away. A stream's request line and header fields are
 * given back 500 ms after it started (the accessors then answer as for absent ones): its owner
 * reads what it keeps when the request arrives. A handler that streams registers callbacks; the
 * close callback is the last one, and the request must not be touched after it returns. */
#ifndef AGW_HTTP_SERVER_H
#define AGW_HTTP_SERVER_H

#include "agw/common.h"

struct event_base;
struct evbuffer;
struct agw_server;
struct agw_req;

struct agw_server_options {
    size_t max_body_bytes;      /* larger bodies get 413 */
    size_t max_head_bytes;      /* request line + header fields; larger heads get 431 */
    unsigned max_header_fields; /* more get 431 */
    uint32_t request_ms; /* a connection must deliver a request's headers and body within this (0 =
                            no limit) */
    /* The CORS fields of a refusal answered to a request from <origin> (its Origin field, when the
     * head was read that far): complete "Name: value\r\n" lines added to <out>, none for an origin
     * that is not allowed. NULL: refusals carry none. Called on the connection's loop. */
    void (*refusal_fields)(void *arg, const char *origin, struct evbuffer *out);
    void *refusal_arg;
};

/* A loop accepts at most this many connections in one turn, then lets the rest of its ready work
 * run before it accepts more: a burst of queued connections (1,000 took one callback 59 ms) would
 * otherwise hold the loop in one callback. 64 accepts are about half a millisecond of work, within
 * the loop's slice (AGW_LOOP_SLICE_US); nginx takes one per readiness by default, HAProxy 4. */
#define AGW_ACCEPT_BATCH 64

/* The statuses the server answers by itself, in the order of agw_server_stats.refused. */
#define AGW_SERVER_REFUSAL_STATUSES                                                                \
    {                                                                                              \
        400, 413, 414, 417, 431, 501, 505                                                          \
    }
#define AGW_SERVER_N_REFUSALS 7

struct agw_server_stats {
    uint64_t accept_errors; /* accept() failures (e.g. out of descriptors) */
    uint64_t accept_yields; /* times a loop stopped accepting for a turn (AGW_ACCEPT_BATCH) */
    uint64_t refused[AGW_SERVER_N_REFUSALS]; /* requests refused before the handler, by status */
};

/* Called once per complete request (headers and body). The handler must eventually answer:
 * agw_req_reply*() or agw_req_stream_*(). */
typedef void agw_req_fn(struct agw_req *req, void *arg);
/* Close and drain callbacks: see agw_req_on_close() and agw_req_stream_start(). */
typedef void agw_req_event_fn(struct agw_req *req, void *arg);

/* One server per event loop; owned by the caller. */
struct agw_server *agw_server_new(struct event_base *base, const struct agw_server_options *opts,
                                  agw_req_fn *handler, void *arg);
void agw_server_free(struct agw_server *srv);
/* New options (a configuration reload): connections accepted from now on use them; those already
 * open keep the request limits they were accepted with. */
void agw_server_set_options(struct agw_server *srv, const struct agw_server_options *opts);
/* Binds a listener with SO_REUSEPORT (so each worker loop can bind the same address). Port 0 picks
 * a free port; *<bound_port> receives the port actually bound. <tls> (an SSL_CTX, or NULL for plain
 * HTTP) becomes the listener's: the server frees it. Returns the listener's index (0, 1, … in call
 * order) or -AGW_EIO. */
int agw_server_listen(struct agw_server *srv, const char *address, uint16_t port, void *tls,
                      uint16_t *bound_port);
/* Replaces listener <index>'s TLS context (certificate reload): new connections use <tls>;
 * connections already open keep the context they started with until they end. Takes ownership. */
void agw_server_set_tls(struct agw_server *srv, int index, void *tls);
/* Closes the listening sockets (drain): running requests go on. */
void agw_server_stop_listening(struct agw_server *srv);
/* Drain: stop listening, close idle kept-alive connections, and close every other connection after
 * its current answer. */
void agw_server_drain(struct agw_server *srv);
bool agw_server_draining(const struct agw_server *srv);
/* Requests currently alive on this server. */
size_t agw_server_active_requests(const struct agw_server *srv);
void agw_server_get_stats(const struct agw_server *srv, struct agw_server_stats *st);

/* ---- reading the request ---- */
enum agw_method agw_req_method(const struct agw_req *req);
const char *agw_req_method_name(const struct agw_req *req);
const char *agw_req_path(const struct agw_req *req);  /* without the query, still percent-encoded */
const char *agw_req_query(const struct agw_req *req); /* raw query string or NULL */
/* The header fields the gateway itself reads, found together in one pass over the request's fields
 * on the first ask: each lookup by name walks every field with strcasecmp() (five lookups a run
 * were about 1,300 instructions). The value is the first field of the name (the names compared
 * case-insensitively); NULL if absent. One request at a time per thread: valid while its handler
 * runs. */
enum agw_known_header {
    AGW_HDR_AUTHORIZATION,
    AGW_HDR_CONTENT_TYPE,
    AGW_HDR_TRACEPARENT,
    AGW_HDR_ORIGIN,
    AGW_HDR_AC_REQUEST_METHOD,  /* Access-Control-Request-Method */
    AGW_HDR_AC_REQUEST_HEADERS, /* Access-Control-Request-Headers */
    AGW_HDR_X_REQUEST_ID,
    AGW_N_KNOWN_HEADERS
};
const char *agw_req_known_header(const struct agw_req *req, enum agw_known_header h);
typedef void agw_header_fn(const char *name, const char *value, void *arg);
void agw_req_foreach_header(const struct agw_req *req, agw_header_fn *fn, void *arg);
/* The request body (complete when the handler runs); borrowed. */
struct evbuffer *agw_req_body(const struct agw_req *req);
/* X-Request-Id from the client when it is sane, else a generated one. */
const char *agw_req_id(const struct agw_req *req);
/* "address:port" of the client. */
const char *agw_req_peer(const struct agw_req *req);
/* Monotonic ms at which the request's headers arrived. */
uint64_t agw_req_start_ms(const struct agw_req *req);

/* ---- answering with a whole body ---- */
/* Adds a response header (copied). Before the reply or stream start only. */
void agw_req_add_header(struct agw_req *req, const char *name, const char *value);
void agw_req_reply(struct agw_req *req, int status, const char *content_type, const char *body,
                   size_t len);
/* Answers {"error":"<message>"} as application/json. */
void agw_req_reply_error(struct agw_req *req, int status, const char *fmt, ...) AGW_PRINTF(3, 4);
/* Status sent, or 0 while unanswered. */
int agw_req_status(const struct agw_req *req);

/* Registers <on_close>, run once when the request is gone: the client disconnected, the response
 * was fully written, or the server is shutting down. The request is freed right after it returns.
 * Anything that keeps a pointer to the request (an upstream exchange waiting for its answer)
 * registers it at once. */
void agw_req_on_close(struct agw_req *req, agw_req_event_fn *on_close, void *arg);

/* ---- answering with a stream (chunked transfer coding) ---- */
/* Sends the status line and headers now: those added with agw_req_add_header(), then <fields>
 * (NULL: none), complete header lines ("Name: value\r\n" each) that outlive the call, built once
 * by the caller (the relay's are a constant), then X-Request-Id and Transfer-Encoding. From then
 * on <on_drain> runs whenever the bytes queued toward the client fall to <low_watermark> or below
 * (the relay resumes reading its upstream there). */
void agw_req_stream_start(struct agw_req *req, int status, const char *fields, size_t low_watermark,
                          agw_req_event_fn *on_drain);
/* Moves every byte of <buf> to the client as one chunk (no-op when <buf> is empty). */
void agw_req_stream_write(struct agw_req *req, struct evbuffer *buf);
/* The same for <n> bytes at <p>: written from there when the socket takes them at once (nothing
 * queued before them), else copied into the connection's output. */
void agw_req_stream_write_bytes(struct agw_req *req, const char *p, size_t n);
/* Hints before a stream's next chunk, which change nothing: the CPU is asked for the request's
 * memory (agw_req_prefetch()), then, once that has arrived, for its connection's output buffer
 * (agw_req_prefetch_output()). */
void agw_req_prefetch(const struct agw_req *req);
void agw_req_prefetch_output(const struct agw_req *req);
/* Moves every byte of <buf> (maybe none) to the client as a last chunk and ends the chunked body,
 * in one system call where it can be. The request is freed (and on_close runs) once the client
 * took it. */
void agw_req_stream_finish(struct agw_req *req, struct evbuffer *buf);
/* Bytes queued toward the client and not yet written to the socket. */
size_t agw_req_out_pending(const struct agw_req *req);
/* Registers <on_half_close> (with the close callback's argument), run once if the client closes its
 * sending side while its request is being answered. The answer goes on: the client may still be
 * reading. One that closed its socket altogether is only found by writing to it, so a streaming
 * handler should write something soon (a heartbeat): the writes fail, and on_close follows. */
void agw_req_on_half_close(struct agw_req *req, agw_req_event_fn *on_half_close);
/* True once the client has closed its sending side. */
bool agw_req_half_closed(const struct agw_req *req);
/* Removes the close, drain and half-close callbacks (their owner is going away first). */
void agw_req_detach(struct agw_req *req);
/* Ends the connection now (a stream that cannot be completed cleanly); on_close runs from the loop.
 */
void agw_req_abort(struct agw_req *req);

#endif
