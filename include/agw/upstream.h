/* The upstream client: non-blocking HTTP/1.1 exchanges with agent backends over libevent
 * bufferevents, with a keep-alive connection pool per backend URL and per event loop, evdns name
 * resolution, and the three pre-stream/stream timeouts (connect, first byte, idle between reads).
 *
 * Ownership: a pool belongs to the caller (one per backend per loop) and must outlive its
 * exchanges. An exchange (struct agw_upstream) belongs to whoever started it and ends with
 * agw_upstream_close(), which is safe to call from inside the exchange's own callbacks (the free is
 * deferred until the callback returns). After on_error or on_done nothing more is delivered. */
#ifndef AGW_UPSTREAM_H
#define AGW_UPSTREAM_H

#include "agw/common.h"
#include "agw/config.h"
#include "agw/http1.h"

struct event_base;
struct evdns_base;
struct evbuffer;
struct agw_upstream_pool;
struct agw_upstream;

/* Why an upstream exchange failed. The first kinds are the exchange's own; the last ones are judged
 * by its owner from what the backend answered. Exported to /metrics and the log by name. */
enum agw_up_failure {
    AGW_UP_OK = 0,
    AGW_UP_CONNECT,            /* "connect": refused, unreachable, DNS failure, no socket */
    AGW_UP_CONNECT_TIMEOUT,    /* "connect_timeout" */
    AGW_UP_FIRST_BYTE_TIMEOUT, /* "first_byte_timeout" */
    AGW_UP_IDLE_TIMEOUT,       /* "idle_timeout" */
    AGW_UP_PROTOCOL,           /* "protocol": malformed or oversized response head or body */
    AGW_UP_CLOSED,             /* "closed": connection lost before the body's end */
    AGW_UP_TLS,                /* "tls" */
    AGW_UP_STATUS,             /* "status": a status the caller cannot use (non-2xx) */
    AGW_UP_CONTENT_TYPE,       /* "content_type": not text/event-stream */
    AGW_UP_EMPTY_STREAM,       /* "empty_stream": an event stream with no event */
    AGW_UP_N_FAILURES
};

/* "connect", …; "" for AGW_UP_OK. */
const char *agw_up_failure_name(enum agw_up_failure f);

struct agw_upstream_pool_options {
    uint32_t connect_ms;
    uint32_t first_byte_ms;
    uint32_t idle_ms; /* 0 = never */
    size_t max_header_bytes;
    unsigned max_idle_conns; /* kept-alive connections kept per pool */
    uint32_t keepalive_ms;   /* an idle pooled connection is closed after this */
    void *tls; /* SSL_CTX for https upstreams (the pool takes its own reference), or NULL */
    /* Header fields every request of the pool carries, after Host and Content-Length: complete
     * "Name: value\r\n" lines (copied), or NULL. Built once, at start, not per request. */
    const char *fixed_headers;
};

struct agw_upstream_pool *agw_upstream_pool_new(struct event_base *base, struct evdns_base *dns,
                                                const struct agw_url *url,
                                                const struct agw_upstream_pool_options *opts);
/* Closes idle connections. Exchanges still running must be closed first. */
void agw_upstream_pool_free(struct agw_upstream_pool *pool);
const struct agw_url *agw_upstream_pool_url(const struct agw_upstream_pool *pool);
size_t agw_upstream_pool_idle(const struct agw_upstream_pool *pool);

struct agw_upstream_callbacks {
    /* The response head arrived. The callee may agw_upstream_close() here (e.g. a non-2xx status).
     */
    void (*on_head)(void *arg, const struct agw_http1_response *resp);
    /* Decoded body bytes are in <body>; the callee drains what it consumed (normally everything).
     * The bytes may be the read buffer itself, valid only during the call: what is left in <body>
     * is copied afterwards, so that it waits for the next call safely. */
    void (*on_body)(void *arg, struct evbuffer *body);
    /* Optional: decoded body bytes as plain memory, valid only during the call, all of which the
     * callee consumes (it keeps what it needs of them). Given instead of on_body() where the bytes
     * lie in one piece and nothing waits before them: every body read of a plain TCP connection.
     * Spares an evbuffer reference, a peek and a drain per read. */
    void (*on_bytes)(void *arg, const char *p, size_t n);
    /* Optional: body bytes are about to be read (a plain TCP connection, before its read()). A
     * hint, which must change nothing: the callee may ask the CPU for the memory the bytes will
     * touch, so that it arrives while the kernel copies them. */
    void (*on_readable)(void *arg);
    /* The body ended cleanly. */
    void (*on_done)(void *arg);
    /* The exchange failed; <kind> is one of the exchange's own kinds (AGW_UP_CONNECT …
     * AGW_UP_TLS), <detail> a human-readable reason. */
    void (*on_error)(void *arg, enum agw_up_failure kind, const char *detail);
};

struct agw_upstream_header {
    const char *name;
    const char *value;
};

/* Starts "POST <url target>" with Host, Content-Length, the pool's fixed header fields, the given
 * extra headers and body (copied: one block, formatted without printf). Returns the exchange; every
 * outcome is reported through <cbs>, never from inside this call. */
struct agw_upstream *agw_upstream_start(struct agw_upstream_pool *pool,
                                        const struct agw_upstream_header *headers, size_t n_headers,
                                        const char *body, size_t body_len,
                                        const struct agw_upstream_callbacks *cbs, void *arg);

/* Hands the exchange's callbacks to a new owner (e.g. from inside on_head: the decision whose
 * answer turned out to be a stream gives it to a relay). The next callback goes to <cbs>/<arg>. */
void agw_upstream_set_callbacks(struct agw_upstream *up, const struct agw_upstream_callbacks *cbs,
                                void *arg);

/* The response's events flow to the client: its reads yield to new work from now on
 * (AGW_PRIO_FLOWING, include/agw/common.h), until the connection serves another exchange. */
void agw_upstream_set_flowing(struct agw_upstream *up);

/* Backpressure: stop / resume reading the response (the idle timer is suspended while paused). */
void agw_upstream_pause(struct agw_upstream *up);
void agw_upstream_resume(struct agw_upstream *up);

/* Ends the exchange: the connection goes back to the pool when the response was complete and
 * reusable, else it is closed (the backend sees its connection close). No callback runs afterwards.
 */
void agw_upstream_close(struct agw_upstream *up);

/* Like agw_upstream_close() for a caller that got what it wanted before the response ended (the
 * run's terminal event): the rest of the response is read and discarded (at most 1 s and 64 KiB) so
 * that the connection can return to the pool; otherwise it is closed. No callback runs afterwards.
 */
void agw_upstream_release(struct agw_upstream *up);

/* For the latency metrics, in microseconds, or AGW_UP_NOT_MEASURED: connecting a new connection
 * (DNS, TCP and the TLS handshake; a pooled connection reused has none), and from the request's
 * write to the first response byte. */
#define AGW_UP_NOT_MEASURED UINT64_MAX
uint64_t agw_upstream_connect_us(const struct agw_upstream *up);
uint64_t agw_upstream_first_byte_us(const struct agw_upstream *up);

#endif
