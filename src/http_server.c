/* The HTTP server side, over libevhtp 1.2.18 — the only file that calls it (see
 * doc/internals/libevhtp.md for the traps this works around, doc/internals/http_server.md for the
 * design, and doc/security.md for the gate, which reads and serves every request).
 *
 * Objects: one struct agw_server per event loop, one evhtp_t per listener (an evhtp_t binds one
 * socket), one struct conn_ctx per accepted connection and one struct agw_req per request. libevhtp
 * accepts every connection (and makes its TLS state); the connection is then the gate's alone (see
 * "Serving connections" below): libevhtp's objects are freed at accept, and the gate reads, parses
 * and answers every request of the connection itself. */
#include "config.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <evhtp.h>
#include <jansson.h>
#include <openssl/ssl.h>

#include "agw/limits.h"
#include "agw/http1.h"
#include "agw/io.h"
#include "agw/http_server.h"
#include "agw/log.h"
#include "agw/loop.h"
#include "agw/mem.h"

#define REQUEST_ID_MAX 64
/* After a refusal, what the client still sends is read and dropped for at most this long and this
 * much (a lingering close, as nginx does), so that its kernel does not reset the connection before
 * the client has read the answer. */
#define LINGER_MS        2000
#define LINGER_MAX_BYTES (1024 * 1024)
/* When the open connections fall to a quarter of a peak of at least TRIM_PEAK, the memory their
 * objects held is handed back to the system (glibc keeps freed heap pages otherwise: 5,000 idle
 * connections closed would leave some 40 MB of RSS behind). */
#define TRIM_PEAK 1024
/* Accepting is paused this long when accept() fails for want of descriptors or memory. */
#define ACCEPT_PAUSE_MS 100
#define ACCEPT_LOG_MS   1000 /* at most one log line per this period about failed accepts */
/* A stream gives back, this long after it started, what only the start of
 * its request needed: the head's copy, the body, the gate's parser (see shed()). */
#define SHED_MS 500
/* Shed streams give their memory back to the system in batches: agw_mem_release_own() at most
 * this long after a shed() (the allocator keeps freed pages otherwise). */
#define SHED_TRIM_MS 200

struct conn_ctx;

struct agw_server {
    struct event_base *base;
    TAILQ_HEAD(, conn_ctx) conns; /* every open connection, so shutdown can close them */
    bool draining;                /* answers close their connection */
    struct agw_server_options opts;
    agw_req_fn *handler;
    void *arg;
    evhtp_t *htps[AGW_MAX_LISTENERS];
    size_t n_htps;
    size_t active; /* live struct agw_req */
    struct agw_http1_request_limits limits;
    size_t hold_max; /* input held behind a request being answered before reading stops */
    struct event *accept_timer; /* resumes accepting after a pause */
    struct event *accept_turn;  /* made active by a turn's first accept; runs after its work */
    unsigned accept_burst;      /* connections accepted in this turn */
    bool accept_held;           /* listeners off until accept_turn runs (AGW_ACCEPT_BATCH) */
    bool accept_paused;         /* listeners off until accept_timer fires (accept() failed) */
    uint64_t accept_log_ms;     /* when accept failures were last logged */
    uint64_t accept_unlogged;   /* failures since */
    struct agw_server_stats stats;
    size_t n_conns, peak_conns;    /* open connections now, and their peak since the last trim */
    bool trim_at_zero;             /* trimmed during a fall: trim once more when none is left */
    bool trim_all;                 /* the next trim is a burst's: every heap (agw_mem_release()) */
    struct event *trim_ev;         /* deferred agw_mem_release() or agw_mem_release_own() */
    const struct timeval *shed_tv; /* SHED_MS, as a common timeout of the loop (O(1) to add) */
};

/* The gate: every byte a client sends goes through our strict parser (src/http1.c), one complete
 * request at a time (see doc/security.md). */
enum gate_state {
    GATE_HEAD = 0, /* reading a request head */
    GATE_BODY,     /* reading its body */
    GATE_BUSY,     /* being answered; what follows waits in <raw> */
    GATE_CLOSING,  /* refused: the answer goes out, then what the client still sends is dropped */
};

/* The current request's head, which the gate keeps: its fields, split in place in its text, which
 * follows them in the same block (on the separate heap). */
struct gate_head {
    size_t n;
    struct agw_http1_field f[];
};

/* The head's text (after its fields' array). */
static char *head_text(struct gate_head *h)
{
    return (char *)(h->f + h->n);
}

/* A client's address (conn_ctx's <peer>), or its text once made. */
union peer_addr {
    struct sockaddr sa; /* sa_family AF_UNSPEC: not known */
    struct sockaddr_in v4;
    struct sockaddr_in6 v6;
    char text[64];
};

struct conn_ctx {
    struct agw_server *srv;
    TAILQ_ENTRY(conn_ctx) link;
    struct bufferevent *bev; /* the connection's (made by libevhtp at accept; OpenSSL's over TLS) */
    struct event *rd;        /* plain TCP: the gate's own read event (see gate_rd_cb()) */
    struct event *timer;     /* request read timeout (slow clients), armed while no request is
                                complete; the lingering close's limit in GATE_CLOSING */
    /* Deferred work, run from the loop: agw_req_abort() (abort_pending), else gate_run() for the
     * next request after an answer. One event for both: an idle stream keeps this structure. */
    struct event *defer_ev;
    struct agw_req *cur; /* the request being answered, or NULL */
    struct agw_http1_parser *parser;
    struct agw_http1_request
        hreq;               /* the head being read, from GATE_BODY on the current request's */
    struct evbuffer *raw;   /* read from the client and not yet taken by the gate */
    struct evbuffer *body;  /* the current request's body, decoded (NULL after shed()) */
    struct gate_head *head; /* the current request's head, from GATE_BODY until it ends */
    unsigned depth;         /* our callbacks on the stack */
    enum gate_state gate;
    bool dead;          /* the connection was freed meanwhile: free this when depth reaches 0 */
    bool peer_eof;      /* the client closed its sending side */
    bool continue_sent; /* "100 Continue" written for the current request */
    bool shut_wr;       /* GATE_CLOSING: the answer is out and our side is shut */
    bool abort_pending; /* agw_req_abort() was called: defer_ev closes the connection */
    bool tls;           /* the bytes go through OpenSSL (the bufferevent's) */
    bool peer_text;     /* <peer> holds the text; else the address */
    size_t linger_bytes;
    /* The client's address, copied at accept and made text only when asked (peer_of()): a log
     * line or the access log; inet_ntop() and snprintf() cost about 2,700 instructions a
     * connection, spent for nothing when neither is written. */
    union peer_addr peer;
};

static const char *peer_of(struct conn_ctx *cc);

struct agw_req {
    struct agw_server *srv;
    struct conn_ctx *cc;
    char id[REQUEST_ID_MAX + 1];
    uint64_t start_ms;
    int status;     /* 0 until answered */
    bool complete;  /* the handler was called */
    bool streaming; /* stream_start was called */
    bool keepalive; /* the connection stays open after the answer */
    /* The request target, split in the gate's copy of the head: the path (without the query or a
     * fragment) and the query, or NULL. */
    const char *path, *query;
    /* The fields agw_req_add_header() set, as "Name: value\r\n" lines (NULL: none). */
    char *fields;
    size_t fields_len, fields_cap;
    agw_req_event_fn *on_close;
    agw_req_event_fn *on_drain;
    agw_req_event_fn *on_half_close;
    void *cb_arg;
    size_t lowat;
    /* Set by stream_start: the connection's output and socket, when chunks may go straight to the
     * socket (plain TCP, chunked); out_direct is NULL otherwise. */
    struct evbuffer *out_direct;
    evutil_socket_t fd;
    bool head_queued; /* the response head waits in out_direct: the first chunk takes it along */
    bool finished;    /* the answer, or the stream's last chunk, was written or queued */
};

/* ---- request ids ---------------------------------------------------------------------------- */

static bool request_id_ok(const char *s)
{
    size_t n = 0;

    for (; s[n] != '\0'; n++) {
        unsigned char c = (unsigned char)s[n];
        if (n >= REQUEST_ID_MAX)
            return false;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.' || c == ':'))
            return false;
    }
    return n > 0;
}

/* Unique per process start and per request without a syscall per request: a random prefix fixed at
 * start-up and a counter. */
static void new_request_id(char *out, size_t len)
{
    static char prefix[17];
    static _Atomic uint64_t counter;
    uint64_t n;

    static const char hex[] = "0123456789abcdef";

    assert(len >= 33);
    if (prefix[0] == '\0')
        agw_random_hex(prefix, 8);
    n = ++counter;
    memcpy(out, prefix, 16); /* the prefix, then the counter in 16 hex digits: no printf */
    for (int i = 31; i >= 16; i--, n >>= 4)
        out[i] = hex[n & 15];
    out[32] = '\0';
}

/* ---- connection timer ----------------------------------------------------------------------- */

static void conn_close(struct conn_ctx *cc);
static void shed(struct conn_ctx *cc);
static void unshed(struct conn_ctx *cc);

/* The write event of a plain TCP connection is armed only while its output holds bytes. A stream
 * writes its chunks to the socket itself (agw_req_stream_write()), so the event that the response
 * head would arm when it is queued, and that the bufferevent disarms once it finds the output
 * empty, were two epoll_ctl() calls a run for nothing: agw_req_stream_start() disables the event
 * before the head is queued, and every path that leaves bytes in the output arms it here (the
 * bufferevent's own bookkeeping goes on from there: it disarms the event when the output empties,
 * and arms it again on its next write). conn_leave() checks the same after each of our callbacks.
 */
static void arm_write(struct bufferevent *bev)
{
    if (bev != NULL && !(bufferevent_get_enabled(bev) & EV_WRITE) &&
        evbuffer_get_length(bufferevent_get_output(bev)) > 0)
        bufferevent_enable(bev, EV_WRITE);
}

static void arm_request_timer(struct conn_ctx *cc)
{
    struct timeval tv;

    if (cc->srv->opts.request_ms == 0)
        return;
    tv.tv_sec = cc->srv->opts.request_ms / 1000;
    tv.tv_usec = (cc->srv->opts.request_ms % 1000) * 1000;
    evtimer_add(cc->timer, &tv);
}

/* The client did not deliver a complete request in time (or idled on a kept-alive connection):
 * close it. This runs from the event loop, outside every callback of ours, so freeing the
 * connection here is safe. */
static void request_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct conn_ctx *cc = arg;

    (void)fd;
    (void)what;
    if (cc->cur != NULL && cc->cur->complete) {
        /* A request is being answered; its own timers govern it. A stream's: see shed(). */
        if (cc->cur->streaming)
            shed(cc);
        return;
    }
    agw_log_debug("conn %s: request read timeout, closing", peer_of(cc));
    conn_close(cc);
}

/* ---- replies -------------------------------------------------------------------------------- */

/* Sets a response header (name and value copied), replacing one of the same name; the head is
 * written from the lines at the answer (head_start()). A handful a request at most (CORS, Allow,
 * Retry-After): kept as the lines they will be. */
void agw_req_add_header(struct agw_req *req, const char *name, const char *value)
{
    size_t nl = strlen(name), vl = strlen(value), at = 0;

    while (at < req->fields_len) { /* drop a line of the same name */
        char *line = req->fields + at;
        char *end = (char *)memchr(line, '\n', req->fields_len - at) + 1;

        if ((size_t)(end - line) > nl && line[nl] == ':' && agw_strieq_n(line, nl, name)) {
            memmove(line, end, req->fields_len - (size_t)(end - req->fields));
            req->fields_len -= (size_t)(end - line);
        } else {
            at += (size_t)(end - line);
        }
    }
    if (req->fields_len + nl + vl + 4 > req->fields_cap) {
        req->fields_cap = (req->fields_len + nl + vl + 4) * 2;
        req->fields = agw_xrealloc(req->fields, req->fields_cap);
    }
    memcpy(req->fields + req->fields_len, name, nl);
    memcpy(req->fields + req->fields_len + nl, ": ", 2);
    memcpy(req->fields + req->fields_len + nl + 2, value, vl);
    memcpy(req->fields + req->fields_len + nl + 2 + vl, "\r\n", 2);
    req->fields_len += nl + vl + 4;
}

/* The reason phrase of every status the gateway answers (libevhtp's table lacks 422, 429, 431). */
static const char *reason_phrase(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 202:
        return "Accepted";
    case 204:
        return "No Content";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 413:
        return "Content Too Large";
    case 414:
        return "URI Too Long";
    case 415:
        return "Unsupported Media Type";
    case 417:
        return "Expectation Failed";
    case 422:
        return "Unprocessable Content";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return status < 300 ? "OK" : status < 500 ? "Client Error" : "Server Error";
    }
}

/* A response head, put together in <b> and handed to the connection's output in one evbuffer_add()
 * (what does not fit goes first). libevhtp's own head (evhtp_send_reply_start()) made a header
 * object per field, found and freed it again, and wrote each field with four evbuffer_add(): a
 * stream's head cost 7,000 instructions, a tenth of a short run's on the event loop. */
struct head {
    struct evbuffer *out;
    size_t n;
    char b[512];
};

static void head_put(struct head *h, const char *p, size_t n)
{
    if (n > sizeof(h->b) - h->n) {
        evbuffer_add(h->out, h->b, h->n);
        h->n = 0;
        if (n > sizeof(h->b)) {
            evbuffer_add(h->out, p, n);
            return;
        }
    }
    memcpy(h->b + h->n, p, n);
    h->n += n;
}

static void head_str(struct head *h, const char *s)
{
    head_put(h, s, strlen(s));
}

static void head_dec(struct head *h, size_t v)
{
    char t[24];
    size_t k = sizeof(t);

    do {
        t[--k] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    head_put(h, t + k, sizeof(t) - k);
}

/* The status line, then the fields given by agw_req_add_header(), in their order. */
static void head_start(struct head *h, struct agw_req *req, struct evbuffer *out, int status)
{
    h->out = out;
    h->n = 0;
    head_put(h, "HTTP/1.1 ", 9);
    head_dec(h, (size_t)status);
    head_put(h, " ", 1);
    head_str(h, reason_phrase(status));
    head_put(h, "\r\n", 2);
    if (req->fields_len > 0)
        head_put(h, req->fields, req->fields_len);
}

static void head_request_id(struct head *h, const struct agw_req *req)
{
    head_put(h, "X-Request-Id: ", 14);
    head_str(h, req->id);
    head_put(h, "\r\n", 2);
}

/* "Connection: close" when the connection ends with this answer, the empty line; the head goes
 * to the output. */
static void head_end(struct head *h, const struct agw_req *req)
{
    if (!req->keepalive)
        head_put(h, "Connection: close\r\n", 19);
    head_put(h, "\r\n", 2);
    evbuffer_add(h->out, h->b, h->n);
    h->n = 0;
}

/* The server drains: the answer closes its connection. */
static void no_keepalive_if_draining(struct agw_req *req)
{
    if (!req->srv->draining)
        return;
    req->keepalive = false;
}

void agw_req_reply(struct agw_req *req, int status, const char *content_type, const char *body,
                   size_t len)
{
    struct bufferevent *bev = req->cc->bev;
    struct evbuffer *out = bufferevent_get_output(bev);
    bool no_body = status == 204 || status == 304;
    struct head h;

    assert(req->status == 0);
    req->status = status;
    no_keepalive_if_draining(req);
    /* The request ends once the output has drained (gate_write_cb()). */
    head_start(&h, req, out, status);
    if (content_type != NULL) {
        head_put(&h, "Content-Type: ", 14);
        head_str(&h, content_type);
        head_put(&h, "\r\n", 2);
    }
    head_request_id(&h, req);
    if (!no_body) {
        head_put(&h, "Content-Length: ", 16);
        head_dec(&h, body != NULL ? len : 0);
        head_put(&h, "\r\n", 2);
    }
    head_end(&h, req);
    if (body != NULL && len > 0 && !no_body && !req->cc->hreq.head_method)
        evbuffer_add(out, body, len);
    req->finished = true;
    bufferevent_setwatermark(bev, EV_WRITE, 0, 0);
    arm_write(bev);
}

void agw_req_reply_error(struct agw_req *req, int status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    json_t *o;
    char *text;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    o = json_pack("{s:s}", "error", msg);
    text = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
    if (text == NULL) {
        /* The message was not valid UTF-8 (it may quote client bytes): answer without it. */
        agw_req_reply(req, status, "application/json", "{\"error\":\"invalid request\"}", 27);
    } else {
        agw_req_reply(req, status, "application/json", text, strlen(text));
    }
    free(text);
    json_decref(o);
}

int agw_req_status(const struct agw_req *req)
{
    return req->status;
}

/* ---- streaming ------------------------------------------------------------------------------ */

void agw_req_on_close(struct agw_req *req, agw_req_event_fn *on_close, void *arg)
{
    req->on_close = on_close;
    req->cb_arg = arg;
}

void agw_req_stream_start(struct agw_req *req, int status, const char *fields, size_t low_watermark,
                          agw_req_event_fn *on_drain)
{
    struct bufferevent *bev = req->cc->bev;
    struct evbuffer *out = bufferevent_get_output(bev);
    bool plain = !req->cc->tls;
    struct head h;

    assert(req->status == 0);
    req->status = status;
    req->streaming = true;
    req->on_drain = on_drain;
    req->lowat = low_watermark;
    no_keepalive_if_draining(req);
    /* The write callback runs when the output falls to the low watermark: the relay resumes its
     * upstream. */
    bufferevent_setwatermark(bev, EV_WRITE, low_watermark, 0);
    bufferevent_set_max_single_write(bev, 64 * 1024);
    /* The head is queued, not written: on plain TCP the first chunk takes it along (see below), so
     * it arms no write event (see arm_write()). Every request that reaches a handler is HTTP/1.1
     * (the gate answers any other version 505): the body is always chunked, framed here. */
    if (plain && evbuffer_get_length(out) == 0)
        bufferevent_disable(bev, EV_WRITE);
    head_start(&h, req, out, status);
    if (fields != NULL)
        head_str(&h, fields);
    head_request_id(&h, req);
    head_put(&h, "Transfer-Encoding: chunked\r\n", 28);
    head_end(&h, req);
    bufferevent_flush(bev, EV_WRITE, BEV_FLUSH);
    if (plain) {
        req->out_direct = out;
        req->fd = bufferevent_getfd(bev);
        req->head_queued = evbuffer_get_length(out) > 0;
    } else {
        arm_write(bev); /* over TLS the bytes go through OpenSSL's bufferevent */
    }
    /* The request timer is free while a request is answered (serve() stopped it): see shed(). */
    evtimer_add(req->cc->timer, req->srv->shed_tv);
}

/* A chunk is written to the socket at once when nothing is queued before it on a plain TCP
 * connection: the events reach the client in this loop iteration rather than the next, and the
 * bufferevent's write event is not armed and disarmed for them (two epoll_ctl calls a burst). One
 * writev() takes the chunk header, <buf>'s segments and the CRLF, with no copy. What the socket
 * does not take is queued as usual, and while anything is queued every chunk queues behind it, so
 * the order holds. The one exception is the response head, queued at stream start: the first chunk
 * takes it along, in front, in the same writev(), so the head and the first events leave together
 * at once rather than on the next iteration. (Over TLS every chunk is queued: the bytes go through
 * OpenSSL.) */

/* "<hex size>\r\n" into <hdr> (at least 19 bytes); returns its length. */
static size_t chunk_header(char *hdr, size_t n);

/* A chunk's data: the bytes of <buf> (emptied as they are written or queued), or, <buf> NULL, the
 * <n> bytes at <p> (copied only when queued). */
struct chunk_data {
    struct evbuffer *buf;
    const char *p;
    size_t n;
};

/* A chunk, queued in <out>, and with <last> the last chunk. */
static void queue_chunk(struct evbuffer *out, const struct chunk_data *d, bool last)
{
    char hdr[24];

    if (d->n > 0) {
        evbuffer_add(out, hdr, chunk_header(hdr, d->n));
        if (d->buf != NULL)
            evbuffer_add_buffer(out, d->buf);
        else
            evbuffer_add(out, d->p, d->n);
        evbuffer_add(out, "\r\n", 2);
    }
    if (last)
        evbuffer_add(out, "0\r\n\r\n", 5);
}

/* A chunk of a stream's body queued behind what the output holds (and with <last> the last chunk),
 * then flushed (an OpenSSL bufferevent encrypts it now). */
static void queue_reply_chunk(struct agw_req *req, const struct chunk_data *d, bool last)
{
    struct bufferevent *bev = req->cc->bev;

    queue_chunk(bufferevent_get_output(bev), d, last);
    bufferevent_flush(bev, EV_WRITE, BEV_FLUSH);
}

static size_t chunk_header(char *hdr, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    char tmp[16];
    size_t k = 0, len = 0;

    do {
        tmp[k++] = hex[n & 15];
        n >>= 4;
    } while (n > 0);
    while (k > 0)
        hdr[len++] = tmp[--k];
    hdr[len++] = '\r';
    hdr[len++] = '\n';
    return len;
}

/* One writev() of what <out> holds (the response head), the chunk's size line, its data, the CRLF
 * and, with <last>, the last chunk; what the socket does not take stays queued in order (data at
 * <p> copied). Returns false, having written nothing, when the pieces do not fit one writev(). */
static bool write_chunk_now(struct evbuffer *out, evutil_socket_t fd, const struct chunk_data *d,
                            bool last)
{
    static char crlf[7] = {'\r', '\n', '0', '\r', '\n', '\r', '\n'};
    char hdr[24];
    struct iovec pre[2] = {{hdr, chunk_header(hdr, d->n)}, {(void *)(uintptr_t)d->p, d->n}};
    struct iovec post = {crlf, last ? sizeof(crlf) : 2};

    /* An error (the client left) is left for the bufferevent to find: everything is queued. */
    return agw_io_write_framed(fd, out, pre, d->buf != NULL ? 1 : 2, d->buf, &post, 1) >= 0;
}

void agw_req_prefetch(const struct agw_req *req)
{
    for (size_t at = 0; at < sizeof(*req); at += AGW_CACHE_LINE)
        __builtin_prefetch((const char *)req + at);
}

void agw_req_prefetch_output(const struct agw_req *req)
{
    __builtin_prefetch(req->out_direct);
}

/* A chunk of the stream's body: written at once when nothing but the head is queued before it. */
static void stream_write(struct agw_req *req, const struct chunk_data *d)
{
    struct evbuffer *out = req->out_direct;
    bool head = req->head_queued;

    if (d->n == 0)
        return;
    req->head_queued = false;
    /* Anything queued but the head: the chunk queues behind it. */
    if (out == NULL || (!head && evbuffer_get_length(out) > 0) ||
        !write_chunk_now(out, req->fd, d, false))
        queue_reply_chunk(req, d, false);
    /* <out> is the connection's output: all written, there is nothing to arm, and the connection's
     * objects are not touched (with thousands of streams, two cache misses an event). */
    if (out == NULL || evbuffer_get_length(out) > 0)
        arm_write(req->cc->bev);
}

void agw_req_stream_write(struct agw_req *req, struct evbuffer *buf)
{
    const struct chunk_data d = {buf, NULL, evbuffer_get_length(buf)};

    stream_write(req, &d);
}

void agw_req_stream_write_bytes(struct agw_req *req, const char *p, size_t n)
{
    const struct chunk_data d = {NULL, p, n};

    stream_write(req, &d);
}

/* The end of the body, after <buf>'s bytes (maybe none). When nothing but the response head waits
 * in the output, the events and the last chunk go to the socket at once, in one writev(). The
 * request ends once the output is empty: gate_write_cb() ends it, run from the loop by the write
 * event or, when all went at once, by a deferred trigger (bufferevent_trigger(): public API, and
 * harmless if the write event runs it first, see gate_write_cb). Otherwise the events and the last
 * chunk are queued behind what is there. */
void agw_req_stream_finish(struct agw_req *req, struct evbuffer *buf)
{
    struct evbuffer *out = req->out_direct;
    struct bufferevent *bev = req->cc->bev;
    const struct chunk_data d = {buf, NULL, evbuffer_get_length(buf)};
    bool head = req->head_queued;
    bool now = d.n > 0 && out != NULL && (head || evbuffer_get_length(out) == 0) &&
               write_chunk_now(out, req->fd, &d, true);

    req->head_queued = false;
    req->finished = true;
    if (!now)
        queue_reply_chunk(req, &d, true);
    bufferevent_setwatermark(bev, EV_WRITE, 0, 0);
    if (evbuffer_get_length(bufferevent_get_output(bev)) == 0) /* deferred: runs whether or not */
        bufferevent_trigger(bev, EV_WRITE,                     /* the write event is armed */
                            BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
    else
        arm_write(bev);
}

size_t agw_req_out_pending(const struct agw_req *req)
{
    if (req->out_direct != NULL) /* checked after every write */
        return evbuffer_get_length(req->out_direct);
    return evbuffer_get_length(bufferevent_get_output(req->cc->bev));
}

void agw_req_on_half_close(struct agw_req *req, agw_req_event_fn *on_half_close)
{
    req->on_half_close = on_half_close;
}

bool agw_req_half_closed(const struct agw_req *req)
{
    return req->cc->peer_eof;
}

void agw_req_detach(struct agw_req *req)
{
    req->on_close = NULL;
    req->on_drain = NULL;
    req->on_half_close = NULL;
    req->cb_arg = NULL;
}

void agw_req_abort(struct agw_req *req)
{
    req->cc->abort_pending = true;
    event_active(req->cc->defer_ev, EV_TIMEOUT, 0);
}

/* ---- accessors ------------------------------------------------------------------------------ */

/* The request line is the gate's: its method (the connection reads no other head while this
 * request is answered: GATE_BUSY), its target split by split_target(). */
enum agw_method agw_req_method(const struct agw_req *req)
{
    const char *m = req->cc->hreq.method;

    switch (m[0]) { /* a method is case-sensitive (RFC 9110 §9.1) */
    case 'G':
        return strcmp(m, "GET") == 0 ? AGW_METHOD_GET : AGW_METHOD_OTHER;
    case 'H':
        return strcmp(m, "HEAD") == 0 ? AGW_METHOD_HEAD : AGW_METHOD_OTHER;
    case 'P':
        return strcmp(m, "POST") == 0 ? AGW_METHOD_POST : AGW_METHOD_OTHER;
    case 'O':
        return strcmp(m, "OPTIONS") == 0 ? AGW_METHOD_OPTIONS : AGW_METHOD_OTHER;
    default:
        return AGW_METHOD_OTHER;
    }
}

const char *agw_req_method_name(const struct agw_req *req)
{
    return req->cc->hreq.method;
}

const char *agw_req_path(const struct agw_req *req)
{
    return req->path;
}

const char *agw_req_query(const struct agw_req *req)
{
    return req->query;
}

/* agw_req_known_header(): the fields of the last request asked about on this thread. Forgotten
 * when that request is freed (forget_known()), so a new request at the same address never sees
 * them. */
static _Thread_local struct {
    const struct agw_req *req; /* whose fields <v> holds; NULL: none */
    const char *v[AGW_N_KNOWN_HEADERS];
} known;

/* Which known field a name of <len> bytes could be (by its length, then its first letter), or
 * AGW_N_KNOWN_HEADERS; the caller compares the whole name. */
static enum agw_known_header known_candidate(const char *key, size_t len)
{
    switch (len) {
    case 6:
        return AGW_HDR_ORIGIN;
    case 11:
        return AGW_HDR_TRACEPARENT;
    case 12:
        return (key[0] | 0x20) == 'x' ? AGW_HDR_X_REQUEST_ID : AGW_HDR_CONTENT_TYPE;
    case 13:
        return AGW_HDR_AUTHORIZATION;
    case 29:
        return AGW_HDR_AC_REQUEST_METHOD;
    case 30:
        return AGW_HDR_AC_REQUEST_HEADERS;
    default:
        return AGW_N_KNOWN_HEADERS;
    }
}

static const char *const known_names[AGW_N_KNOWN_HEADERS] = {
    [AGW_HDR_AUTHORIZATION] = "Authorization",
    [AGW_HDR_CONTENT_TYPE] = "Content-Type",
    [AGW_HDR_TRACEPARENT] = "traceparent",
    [AGW_HDR_ORIGIN] = "Origin",
    [AGW_HDR_AC_REQUEST_METHOD] = "Access-Control-Request-Method",
    [AGW_HDR_AC_REQUEST_HEADERS] = "Access-Control-Request-Headers",
    [AGW_HDR_X_REQUEST_ID] = "X-Request-Id",
};

const char *agw_req_known_header(const struct agw_req *req, enum agw_known_header h)
{
    const struct gate_head *head = req->cc->head;

    if (head == NULL || (unsigned)h >= AGW_N_KNOWN_HEADERS)
        return NULL;
    if (known.req != req) {
        memset(known.v, 0, sizeof(known.v));
        for (size_t i = 0; i < head->n; i++) {
            const struct agw_http1_field *f = &head->f[i];
            enum agw_known_header k = known_candidate(f->name, f->name_len);

            if (k != AGW_N_KNOWN_HEADERS && known.v[k] == NULL &&
                agw_strieq_n(f->name, f->name_len, known_names[k]))
                known.v[k] = f->value; /* the first of the name */
        }
        known.req = req;
    }
    return known.v[h];
}

static void forget_known(const struct agw_req *req)
{
    if (known.req == req)
        known.req = NULL;
}

void agw_req_foreach_header(const struct agw_req *req, agw_header_fn *fn, void *arg)
{
    const struct gate_head *head = req->cc->head;

    if (head == NULL)
        return;
    for (size_t i = 0; i < head->n; i++)
        fn(head->f[i].name, head->f[i].value, arg);
}

struct evbuffer *agw_req_body(const struct agw_req *req)
{
    return req->cc->body;
}

const char *agw_req_id(const struct agw_req *req)
{
    return req->id;
}

const char *agw_req_peer(const struct agw_req *req)
{
    return peer_of(req->cc);
}

uint64_t agw_req_start_ms(const struct agw_req *req)
{
    return req->start_ms;
}

/* ---- the gate ------------------------------------------------------------------------------- */

/* libevhtp's own parser is lenient where a server on the edge must not be (it takes unknown
 * transfer codings for "no body", truncates values at a NUL, wraps chunk sizes, closes without an
 * answer on errors, and stalls pipelined requests). So the bytes a client sends never reach it: the
 * connection's bufferevent callbacks are ours. They read into <raw>, check a whole request with
 * src/http1.c (head and body), answer refusals and close, and serve one complete, valid request at
 * a time. The next request waits in <raw> until the answer to this one has been written. */

static void conn_enter(struct conn_ctx *cc)
{
    cc->depth++;
}

/* After a call that may have closed the connection (then our context waits for us to leave).
 * Returns false when the connection is gone. */
static bool conn_alive(const struct conn_ctx *cc)
{
    return !cc->dead;
}

/* The gate's parser (made by parser_new()); NULL is a no-op. */
static void gate_parser_free(struct agw_http1_parser *p)
{
    agw_http1_parser_clear(p);
    agw_mem_separate_free(p);
}

/* The gate's parser and its body buffer, which shed() frees while a stream goes on: on the separate
 * heap (include/agw/mem.h), they leave no hole among the stream's objects. */
static struct agw_http1_parser *parser_new(struct agw_server *srv)
{
    return agw_http1_request_parser_init(agw_mem_separate_alloc(agw_http1_request_parser_size()),
                                         srv->opts.max_head_bytes, &srv->limits);
}

static struct evbuffer *body_new(void)
{
    struct evbuffer *b;

    agw_mem_separate_enter();
    b = evbuffer_new();
    agw_mem_separate_leave();
    return b;
}

/* The current request's head goes (its request ended). */
static void head_free(struct conn_ctx *cc)
{
    agw_mem_separate_free(cc->head);
    cc->head = NULL;
}

/* The head the gate accepted (cc->hreq) leaves <raw> for a block of the gate's, where its fields
 * are split. */
static void take_head(struct conn_ctx *cc)
{
    size_t len = cc->hreq.head_len, nf = cc->hreq.n_fields;
    struct gate_head *h;
    char *text;

    head_free(cc);
    h = agw_mem_separate_alloc(sizeof(*h) + nf * sizeof(h->f[0]) + len + 1);
    text = (char *)(h->f + nf);
    evbuffer_remove(cc->raw, text, len);
    text[len] = '\0';
    h->n = agw_http1_request_fields(text, len, h->f, nf);
    assert(h->n == nf); /* (head_text() finds the text after them) */
    cc->head = h;
}

static void conn_ctx_free(struct conn_ctx *cc)
{
    head_free(cc);
    gate_parser_free(cc->parser);
    agw_mem_separate_enter(); /* (a request's bytes are on the separate heap) */
    evbuffer_free(cc->raw);
    if (cc->body != NULL)
        evbuffer_free(cc->body);
    agw_mem_separate_leave();
    free(cc);
}

static void conn_leave(struct conn_ctx *cc)
{
    if (--cc->depth > 0)
        return;
    if (cc->dead)
        conn_ctx_free(cc);
    else
        arm_write(cc->bev);
}

/* Closes the connection from one of our callbacks or events. */
static void close_now(struct conn_ctx *cc)
{
    if (!cc->dead)
        conn_close(cc);
}

static void count_refusal(struct agw_server *srv, int status)
{
    static const int statuses[] = AGW_SERVER_REFUSAL_STATUSES;

    for (size_t i = 0; i < AGW_ARRAY_LEN(statuses); i++) {
        if (statuses[i] == status) {
            __atomic_add_fetch(&srv->stats.refused[i], 1, __ATOMIC_RELAXED);
            return;
        }
    }
}

/* Reading. A bufferevent reads at most 4 KiB per readiness, each read preceded by an
 * ioctl(FIONREAD) (libevent 2.1's evbuffer_read()): a system call a request for nothing. On a plain
 * TCP connection the gate reads for itself: its own event <rd> on the socket (added before the
 * bufferevent's reading is disabled, so that the socket stays registered with epoll throughout)
 * reads straight into <raw> (gate_rd_cb()). The bufferevent keeps writing and, over TLS (the
 * socket holds records for OpenSSL), reading. */
#define GATE_READ_MAX (16 * 1024)

static void reading(struct conn_ctx *cc, bool on)
{
    if (cc->rd == NULL) {
        if (on)
            bufferevent_enable(cc->bev, EV_READ);
        else
            bufferevent_disable(cc->bev, EV_READ);
    } else if (on) {
        if (!event_pending(cc->rd, EV_READ, NULL))
            event_add(cc->rd, NULL);
    } else {
        event_del(cc->rd);
    }
}

static void rd_free(struct conn_ctx *cc)
{
    if (cc->rd != NULL) {
        event_free(cc->rd);
        cc->rd = NULL;
    }
}

/* The CORS fields of a refusal (agw_server_options.refusal_fields), when the request's head said
 * where it came from: a browser reads the refusal only with them. The head is still at the start of
 * <raw> (refused while read) or its copy is the gate's (refused in the body). */
static void refusal_cors(struct conn_ctx *cc, struct evbuffer *out)
{
    const struct agw_server_options *o = &cc->srv->opts;
    size_t at = cc->hreq.origin_at, n = cc->hreq.origin_len;
    char origin[256];
    const char *h;

    if (o->refusal_fields == NULL || n == 0 || n >= sizeof(origin))
        return;
    if (cc->gate == GATE_HEAD) { /* the head is still in <raw> */
        if (evbuffer_get_length(cc->raw) < at + n ||
            (h = (const char *)evbuffer_pullup(cc->raw, (ev_ssize_t)(at + n))) == NULL)
            return;
    } else if (cc->gate == GATE_BODY && cc->head != NULL && at + n <= cc->hreq.head_len) {
        h = head_text(cc->head); /* (its values intact) */
    } else {
        return;
    }
    memcpy(origin, h + at, n);
    origin[n] = '\0';
    o->refusal_fields(o->refusal_arg, origin, out);
}

/* The answer in the output is the connection's last: once it is out (closing_written()), our
 * sending side is shut, and what the client still sends is read and dropped until it closes, for at
 * most LINGER_MS and LINGER_MAX_BYTES: a lingering close (RFC 9112 §9.6). Closing with bytes unread
 * would make the kernel answer them with a reset, which can destroy the answer before the client
 * has read it. A client that has closed its sending side sends nothing more. */
static void closing_written(struct conn_ctx *cc);

static void linger(struct conn_ctx *cc)
{
    static const struct timeval tv = {.tv_sec = LINGER_MS / 1000,
                                      .tv_usec = (LINGER_MS % 1000) * 1000};

    cc->gate = GATE_CLOSING;
    agw_mem_separate_enter(); /* (a request's bytes are on the separate heap) */
    evbuffer_drain(cc->raw, evbuffer_get_length(cc->raw));
    agw_mem_separate_leave();
    reading(cc, !cc->peer_eof);
    bufferevent_setwatermark(cc->bev, EV_WRITE, 0, 0);
    evtimer_del(cc->timer);
    evtimer_add(cc->timer, &tv);
    if (evbuffer_get_length(bufferevent_get_output(cc->bev)) == 0)
        closing_written(cc);
    else
        bufferevent_enable(cc->bev, EV_WRITE);
}

/* The last answer is out: say so and linger, or close (over TLS a shutdown would cut the record
 * layer; a client that closed its side has nothing more to send). */
static void closing_written(struct conn_ctx *cc)
{
    cc->shut_wr = true;
    if (cc->tls || cc->peer_eof)
        close_now(cc);
    else
        shutdown(bufferevent_getfd(cc->bev), SHUT_WR);
}

/* Answers a request the gate refused, in HTTP/1.1 whatever the client's version, and closes the
 * connection once the answer is out: after a framing error nothing that follows can be trusted.
 * No request object exists. */
static void refuse(struct conn_ctx *cc, int status, const char *msg)
{
    struct evbuffer *out = bufferevent_get_output(cc->bev);
    char id[REQUEST_ID_MAX + 1];
    char body[256];
    char why[96];
    int n;

    if (status == 413) { /* the parser's text does not know the limit: name it */
        snprintf(why, sizeof(why), "payload too large: the limit is %zu bytes",
                 cc->srv->limits.max_body);
        msg = why;
    }
    new_request_id(id, sizeof(id));
    n = snprintf(body, sizeof(body), "{\"error\":\"%s\"}", msg); /* ASCII text of ours */
    evbuffer_add_printf(out,
                        "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: "
                        "%d\r\nX-Request-Id: %s\r\n",
                        status, reason_phrase(status), n, id);
    refusal_cors(cc, out);
    evbuffer_add(out, "Connection: close\r\n\r\n", 21);
    if (!cc->hreq.head_method)
        evbuffer_add(out, body, (size_t)n);
    agw_log_info("conn %s: request refused: %d %s", peer_of(cc), status, msg);
    count_refusal(cc->srv, status);
    linger(cc);
}

static void serve(struct conn_ctx *cc);

/* Moves the gate on with what <raw> holds: reads a head, then a body, and hands the request over
 * when it is complete. In a section (include/agw/mem.h): what libevent allocates here (a chunked
 * body's buffers, a refusal) lives no longer than the request's start, and the request's bytes,
 * read on the separate heap (gate_rd_cb()), are freed back to it; the handler, which makes the
 * stream's long-lived objects, runs outside (serve()). */
static void gate_step(struct conn_ctx *cc);

static void gate_run(struct conn_ctx *cc)
{
    agw_mem_separate_enter();
    gate_step(cc);
    agw_mem_separate_leave();
}

static void gate_step(struct conn_ctx *cc)
{
    int rc;

    if (cc->gate == GATE_BUSY || cc->gate == GATE_CLOSING) {
        /* A request is being answered: what follows waits, within a bound. */
        if (cc->gate == GATE_BUSY && evbuffer_get_length(cc->raw) > cc->srv->hold_max)
            reading(cc, false);
        return;
    }
    if (cc->gate == GATE_HEAD) {
        rc = agw_http1_parse_request_head(cc->parser, cc->raw, &cc->hreq);
        if (rc == AGW_AGAIN) {
            if (cc->peer_eof) /* the rest will never come */
                close_now(cc);
            return;
        }
        if (rc < 0) {
            refuse(cc, cc->hreq.status, cc->hreq.error);
            return;
        }
        take_head(cc);
        cc->gate = GATE_BODY;
        cc->continue_sent = false;
    }
    rc = agw_http1_parse_body(cc->parser, cc->raw, cc->body);
    if (rc == 0) {
        if (cc->peer_eof) {
            close_now(cc);
        } else if (cc->hreq.expect_continue && !cc->continue_sent) {
            cc->continue_sent = true;
            evbuffer_add(bufferevent_get_output(cc->bev), "HTTP/1.1 100 Continue\r\n\r\n", 25);
            arm_write(cc->bev);
        }
        return;
    }
    if (rc < 0) {
        if (agw_http1_body_over_limit(cc->parser))
            refuse(cc, 413, "payload too large");
        else
            refuse(cc, 400, "bad request: malformed chunked body");
        return;
    }
    serve(cc);
}

/* New bytes from the client are in <raw>. */
static void gate_input(struct conn_ctx *cc)
{
    if (cc->gate == GATE_CLOSING) {
        cc->linger_bytes += evbuffer_get_length(cc->raw);
        evbuffer_drain(cc->raw, evbuffer_get_length(cc->raw));
        if (cc->linger_bytes > LINGER_MAX_BYTES)
            close_now(cc);
        return;
    }
    conn_enter(cc);
    gate_run(cc);
    conn_leave(cc);
}

static void gate_event_cb(struct bufferevent *bev, short what, void *arg);

/* The read event of a plain TCP connection (see reading()). The end of the client's bytes or an
 * error goes to gate_event_cb() as the bufferevent would report it, with reading stopped as the
 * bufferevent stops it. */
static void gate_rd_cb(evutil_socket_t fd, short what, void *arg)
{
    struct conn_ctx *cc = arg;
    ssize_t n;

    /* A request's bytes live until its stream sheds them (or the answer ends): on the separate
     * heap, with the rest of what shed() frees. */
    agw_mem_separate_enter();
    n = agw_io_read_append(cc->raw, fd, GATE_READ_MAX);
    agw_mem_separate_leave();
    (void)what;
    if (n > 0) {
        gate_input(cc); /* may free <cc> */
        agw_loop_slice_check();
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    event_del(cc->rd);
    gate_event_cb(cc->bev, (short)(BEV_EVENT_READING | (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR)),
                  cc);
}

static void gate_read_cb(struct bufferevent *bev, void *arg)
{
    evbuffer_add_buffer(((struct conn_ctx *)arg)->raw, bufferevent_get_input(bev));
    gate_input(arg);
    agw_loop_slice_check();
}

static void answered(struct conn_ctx *cc);

static void gate_write_cb(struct bufferevent *bev, void *arg)
{
    struct conn_ctx *cc = arg;

    if (cc->gate == GATE_CLOSING) {
        if (!cc->shut_wr && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
            closing_written(cc);
        return;
    }
    /* Our own bytes (a "100 Continue" for a request not complete yet) drained, or a trigger after
     * the request ended: nothing to do then. */
    if (cc->cur == NULL)
        return;
    /* The drain callback, and the end of the request once its answer is out. */
    conn_enter(cc);
    if (cc->cur->finished) {
        if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
            answered(cc);
    } else if (cc->cur->on_drain != NULL) {
        cc->cur->on_drain(cc->cur, cc->cur->cb_arg);
    }
    conn_leave(cc);
}

static void gate_event_cb(struct bufferevent *bev, short what, void *arg)
{
    struct conn_ctx *cc = arg;

    if (what & BEV_EVENT_CONNECTED)
        return; /* the TLS handshake is done (OpenSSL's bufferevent says so) */
    conn_enter(cc);
    if (cc->gate == GATE_CLOSING) {
        if ((what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) == BEV_EVENT_EOF && !cc->shut_wr) {
            /* The client closed its side before the last answer was out: it goes out first
             * (closing_written() then closes). */
            cc->peer_eof = true;
            reading(cc, false);
        } else {
            close_now(cc);
        }
        goto out;
    }
    if ((what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_READING)) ==
        (BEV_EVENT_EOF | BEV_EVENT_READING)) {
        /* The client closed its sending side. It may still be reading (a half-close after its
         * request): a request being answered, or complete ones waiting, are answered first. */
        cc->peer_eof = true;
        if (cc->gate != GATE_BUSY && evbuffer_get_length(cc->raw) > 0)
            gate_run(cc);
        if (!conn_alive(cc) || cc->gate == GATE_CLOSING)
            goto out;
        if (cc->gate == GATE_BUSY) {
            struct agw_req *req = cc->cur;

            if (req != NULL && req->on_half_close != NULL)
                req->on_half_close(req, req->cb_arg);
            goto out;
        }
    }
    (void)bev;
    conn_close(cc); /* an error, or the client's close */
out:
    conn_leave(cc);
}

/* An abort (agw_req_abort()) closes the connection. Else the answer to the previous request is
 * out: the next one may be in <raw> already. */
static void defer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct conn_ctx *cc = arg;

    (void)fd;
    (void)what;
    if (cc->abort_pending) {
        conn_close(cc);
        return;
    }
    if (cc->gate != GATE_HEAD)
        return;
    conn_enter(cc);
    reading(cc, true);
    if (evbuffer_get_length(cc->raw) > 0)
        gate_run(cc);
    else if (cc->peer_eof)
        close_now(cc);
    conn_leave(cc);
}

/* ---- requests ------------------------------------------------------------------------------ */

static void conn_gone(struct conn_ctx *cc);

/* The request is gone: run its owner's close callback and free it. */
static void end_request(struct conn_ctx *cc, struct agw_req *req)
{
    cc->cur = NULL;
    if (req->on_close != NULL) {
        agw_req_event_fn *fn = req->on_close;
        unsigned saved = agw_mem_separate_suspend(); /* the owner's code, outside any section */

        req->on_close = NULL;
        req->on_drain = NULL;
        req->on_half_close = NULL;
        fn(req, req->cb_arg);
        agw_mem_separate_resume(saved);
    }
    cc->srv->active--;
    forget_known(req);
    head_free(cc);
    free(req->fields);
    free(req);
}

/* The target of the request line ("METHOD SP target SP HTTP/1.1"), split in the gate's copy of the
 * head: the path ends at a '?' (the query follows) or a '#' (a fragment, which a client should not
 * send, is ignored). */
static void split_target(struct conn_ctx *cc, struct agw_req *req)
{
    char *t = strchr(head_text(cc->head), ' ') + 1;
    char *end = strchr(t, ' '), *q;

    *end = '\0';
    if ((q = strchr(t, '#')) != NULL)
        *q = '\0';
    if ((q = strchr(t, '?')) != NULL) {
        *q = '\0';
        req->query = q + 1;
    }
    req->path = t;
}

/* The request's object, once the gate has the whole request (its head in cc->head): its id (the
 * client's X-Request-Id when it is a valid one), whether its connection stays open, its target. */
static struct agw_req *req_new(struct conn_ctx *cc)
{
    struct agw_req *req = agw_xcalloc(1, sizeof(*req));
    const char *v;

    req->srv = cc->srv;
    req->cc = cc;
    req->start_ms = agw_now_ms();
    req->keepalive = !cc->hreq.close; /* (every request is HTTP/1.1: the gate refuses others) */
    cc->cur = req;
    cc->srv->active++;
    split_target(cc, req);
    v = agw_req_known_header(req, AGW_HDR_X_REQUEST_ID); /* (and the others, in the same pass) */
    if (v != NULL && request_id_ok(v))                   /* (at most REQUEST_ID_MAX bytes) */
        memcpy(req->id, v, strlen(v) + 1);
    else
        new_request_id(req->id, sizeof(req->id));
    return req;
}

/* The connection is closed: forgets it, and frees its context unless our callbacks are on the
 * stack (then the outermost one does). */
static void conn_gone(struct conn_ctx *cc)
{
    TAILQ_REMOVE(&cc->srv->conns, cc, link);
    if (--cc->srv->n_conns <= cc->srv->peak_conns / 4 && cc->srv->peak_conns >= TRIM_PEAK) {
        cc->srv->peak_conns = cc->srv->n_conns;
        cc->srv->trim_at_zero = cc->srv->n_conns > 0;
        cc->srv->trim_all = true;
        event_active(cc->srv->trim_ev, EV_TIMEOUT, 0);
    } else if (cc->srv->n_conns == 0 && cc->srv->trim_at_zero) {
        cc->srv->trim_at_zero = false;
        cc->srv->trim_all = true;
        event_active(cc->srv->trim_ev, EV_TIMEOUT, 0);
    }
    rd_free(cc);
    event_free(cc->timer);
    event_free(cc->defer_ev);
    cc->timer = cc->defer_ev = NULL;
    cc->dead = true;
    if (cc->depth == 0)
        conn_ctx_free(cc);
}

/* ---- serving connections ------------------------------------------------------------------
 *
 * libevhtp keeps, for each connection, an object with its parser's 8 KiB token buffer and, for each
 * request, an object with a copy of every header and their buffers: about 11 KiB that a stream,
 * which idles most of its life, would hold for nothing (the gate parsed the request, the chunks are
 * framed here and written straight to the socket), and that libevhtp cannot give back while the
 * connection lives. So a connection is libevhtp's only while it is accepted: in the post-accept
 * hook, libevhtp's one public way to let go of a connection, evhtp_connection_take_ownership(),
 * unsets its hooks, takes the bufferevent out, disables its reading and clears its callbacks, and
 * evhtp_connection_free() frees the rest without a hook and without touching the bufferevent (over
 * TLS an OpenSSL bufferevent, which owns the SSL; libevhtp's pointer to its connection in the SSL's
 * app data is read only by its session cache and virtual hosts, neither used, and is cleared). From
 * then on this file serves the connection: the gate reads and checks each request (gate_run()),
 * serve() calls the handler, the answer or the stream's chunks are written here, answered() ends
 * the request once its answer is out and reads the next one or closes, and errors and the client's
 * close end it in gate_event_cb() and conn_close(). */

/* Closes the connection; runs the close callback of its request. */
static void conn_close(struct conn_ctx *cc)
{
    if (cc->cur != NULL)
        end_request(cc, cc->cur);
    rd_free(cc);               /* before the socket closes */
    bufferevent_free(cc->bev); /* closes the socket (and frees the SSL) */
    cc->bev = NULL;
    conn_gone(cc);
}

/* A complete request (its head in cc->head and cc->hreq, its body in cc->body) goes to the
 * handler. */
static void serve(struct conn_ctx *cc)
{
    struct agw_req *req;

    agw_http1_parser_reset(cc->parser);
    cc->gate = GATE_BUSY;
    evtimer_del(cc->timer);
    req = req_new(cc);
    req->complete = true;
    {
        unsigned saved = agw_mem_separate_suspend(); /* (gate_run()'s section) */

        cc->srv->handler(req, cc->srv->arg);
        agw_mem_separate_resume(saved);
    }
}

/* The answer of the connection's request is out (gate_write_cb()): the request ends, and the
 * connection reads the next one (from the loop: the answer's last bytes may still be on their way
 * out of OpenSSL) within the request timeout, or closes when the answer said so. */
static void answered(struct conn_ctx *cc)
{
    bool keep = cc->cur->keepalive && !cc->srv->draining;

    end_request(cc, cc->cur);
    if (!keep) {
        /* Closed in stages (RFC 9112 §9.6) when the client may still send (a request pipelined
         * behind this one while the server drains, or bytes already come): they would otherwise
         * reset the connection before it has read the answer. A client that asked for the close
         * promised to send nothing more (the same section): closed at once, as nginx does. */
        if (cc->peer_eof || (cc->hreq.close && evbuffer_get_length(cc->raw) == 0))
            conn_close(cc);
        else
            linger(cc);
        return;
    }
    unshed(cc);
    agw_mem_separate_enter(); /* (the request's bytes, read on the separate heap) */
    evbuffer_drain(cc->body, evbuffer_get_length(cc->body));
    agw_mem_separate_leave();
    bufferevent_setwatermark(cc->bev, EV_WRITE, 0, 0);
    cc->gate = GATE_HEAD;
    event_active(cc->defer_ev, EV_TIMEOUT, 0);
    evtimer_del(cc->timer); /* (a stream's shed() may be pending) */
    arm_request_timer(cc);
}

/* A stream that has run for SHED_MS gives back what only the start of its request needed, most
 * streams being long and idle most of their lives: the copy of the head (the owner read what it
 * needed when the request arrived: the accessors answer as for an absent line and fields from now
 * on), the body's bytes and buffer, and the gate's parser (made again when the next request is
 * read). About 2 KiB of live heap a stream (8.7 KiB → 6.8 in tests/integration/idle_mem.sh). */
static void shed(struct conn_ctx *cc)
{
    struct agw_req *req = cc->cur;

    forget_known(req);
    head_free(cc);
    req->path = "/";
    req->query = NULL;
    agw_mem_separate_enter();
    evbuffer_free(cc->body);
    agw_mem_separate_leave();
    cc->body = NULL;
    gate_parser_free(cc->parser);
    cc->parser = NULL;
    if (!evtimer_pending(cc->srv->trim_ev, NULL)) {
        static const struct timeval trim_tv = {0, SHED_TRIM_MS * 1000};

        evtimer_add(cc->srv->trim_ev, &trim_tv);
    }
}

/* After shed(): the body buffer and the parser for the next request. */
static void unshed(struct conn_ctx *cc)
{
    struct agw_server *srv = cc->srv;

    if (cc->body == NULL)
        cc->body = body_new();
    if (cc->parser == NULL)
        cc->parser = parser_new(srv);
}

/* Lets go of libevhtp's objects for a connection just accepted (see above). What libevhtp frees
 * here was allocated on the separate heap (see lib_heap_init()): freed in a section, straight back
 * to it. */
static void own(evhtp_connection_t *conn)
{
    if (conn->ssl != NULL)
        SSL_set_app_data(conn->ssl, NULL);
    agw_mem_separate_enter();
    evhtp_connection_take_ownership(conn);
    evhtp_connection_free(conn);
    agw_mem_separate_leave();
}

static void format_peer(const struct sockaddr *sa, char *out, size_t len)
{
    char addr[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;

    if (sa == NULL) {
        snprintf(out, len, "unknown");
        return;
    }
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        inet_ntop(AF_INET, &in->sin_addr, addr, sizeof(addr));
        port = ntohs(in->sin_port);
        snprintf(out, len, "%s:%u", addr, port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, addr, sizeof(addr));
        port = ntohs(in6->sin6_port);
        snprintf(out, len, "[%s]:%u", addr, port);
    } else {
        snprintf(out, len, "unknown");
    }
}

/* The client's address as text ("1.2.3.4:5", "[::1]:5", "unknown"), made on the first call. */
static const char *peer_of(struct conn_ctx *cc)
{
    if (!cc->peer_text) {
        union peer_addr a = cc->peer;

        format_peer(a.sa.sa_family != AF_UNSPEC ? &a.sa : NULL, cc->peer.text,
                    sizeof(cc->peer.text));
        cc->peer_text = true;
    }
    return cc->peer.text;
}

static void listeners_enable(struct agw_server *srv, bool on)
{
    for (size_t i = 0; i < srv->n_htps; i++) {
        if (srv->htps[i]->server == NULL)
            continue;
        if (on)
            evconnlistener_enable(srv->htps[i]->server);
        else
            evconnlistener_disable(srv->htps[i]->server);
    }
}

/* Bounded accepts. libevent's listener accepts until accept() would block, calling us for each
 * connection, and stops early when we disable it. The turn's first accept makes accept_turn
 * active at the listener's priority: it runs once the work already waiting at that priority has
 * run (new runs' heads and bodies, upstream connects), and resets the count. The
 * AGW_ACCEPT_BATCH-th turns the listeners off until then; the connections still queued are accepted
 * in the next turns. */
static void note_accept(struct agw_server *srv)
{
    if (srv->accept_burst++ == 0)
        event_active(srv->accept_turn, EV_TIMEOUT, 1);
    if (srv->accept_burst == AGW_ACCEPT_BATCH && !srv->accept_held) {
        srv->accept_held = true;
        __atomic_add_fetch(&srv->stats.accept_yields, 1, __ATOMIC_RELAXED);
        listeners_enable(srv, false);
    }
}

static void accept_turn_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_server *srv = arg;

    (void)fd;
    (void)what;
    srv->accept_burst = 0;
    if (srv->accept_held) {
        srv->accept_held = false;
        if (!srv->accept_paused && !srv->draining)
            listeners_enable(srv, true);
    }
}

static evhtp_res post_accept(evhtp_connection_t *conn, void *arg)
{
    struct agw_server *srv = arg;
    struct conn_ctx *cc = agw_xcalloc(1, sizeof(*cc));

    cc->srv = srv;
    cc->bev = evhtp_connection_get_bev(conn);
    cc->tls = conn->ssl != NULL;
    cc->timer = evtimer_new(srv->base, request_timeout_cb, cc);
    cc->defer_ev = evtimer_new(srv->base, defer_cb, cc);
    cc->parser = parser_new(srv);
    cc->raw = evbuffer_new();
    /* (the text is made when asked: peer_of()) */
    if (conn->saddr != NULL && conn->saddr->sa_family == AF_INET)
        memcpy(&cc->peer.v4, conn->saddr, sizeof(cc->peer.v4));
    else if (conn->saddr != NULL && conn->saddr->sa_family == AF_INET6)
        memcpy(&cc->peer.v6, conn->saddr, sizeof(cc->peer.v6));
    else
        cc->peer.sa.sa_family = AF_UNSPEC;
    note_accept(srv);
    TAILQ_INSERT_TAIL(&srv->conns, cc, link);
    if (++srv->n_conns > srv->peak_conns)
        srv->peak_conns = srv->n_conns;
    /* The connection is the gate's from now on (see "Serving connections"). On plain TCP it reads
     * for itself (see reading()): its event is added before the bufferevent's reading is disabled
     * (the socket stays registered with epoll). Over TLS the bufferevent reads (OpenSSL's). */
    if (!cc->tls) {
        cc->rd =
            event_new(srv->base, bufferevent_getfd(cc->bev), EV_READ | EV_PERSIST, gate_rd_cb, cc);
        event_add(cc->rd, NULL);
    }
    own(conn); /* (reading disabled, callbacks cleared) */
    cc->body = body_new();
    bufferevent_setcb(cc->bev, gate_read_cb, gate_write_cb, gate_event_cb, cc);
    if (cc->tls)
        bufferevent_enable(cc->bev, EV_READ);
    arm_request_timer(cc);
    return EVHTP_RES_OK;
}

/* accept() failed. Out of descriptors (or memory), the pending connection stays in the backlog and
 * the listener would be readable again at once: stop accepting for a moment rather than spin, and
 * say so at most once a period. */
static void accept_error_cb(struct evconnlistener *lev, void *ctx)
{
    int err = EVUTIL_SOCKET_ERROR();
    evhtp_t *htp = ctx;
    struct agw_server *srv = htp->arg;
    bool pause = err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
    uint64_t now = agw_now_ms();

    __atomic_add_fetch(&srv->stats.accept_errors, 1, __ATOMIC_RELAXED);
    srv->accept_unlogged++;
    if (pause) {
        struct timeval tv = {.tv_sec = 0, .tv_usec = ACCEPT_PAUSE_MS * 1000};

        evconnlistener_disable(lev);
        srv->accept_paused = true;
        if (!evtimer_pending(srv->accept_timer, NULL))
            evtimer_add(srv->accept_timer, &tv);
    }
    if (srv->accept_log_ms == 0 || now - srv->accept_log_ms >= ACCEPT_LOG_MS) {
        agw_log_warn("accept() failed: %s (%" PRIu64 " time(s) since the last report)%s",
                     evutil_socket_error_to_string(err), srv->accept_unlogged,
                     pause ? "; accepting paused for a moment" : "");
        srv->accept_log_ms = now;
        srv->accept_unlogged = 0;
    }
}

/* After a burst of connections closed, every heap (their objects are on the main one too); after
 * streams shed, the separate heap, where what they shed was, and this loop's arena: under a
 * streaming load streams shed every few milliseconds, and a purge of every heap five times a second
 * made the store's writer fault in again the pages of the text buffers it had just freed. */
static void trim_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_server *srv = arg;

    (void)fd;
    (void)what;
    if (srv->trim_all)
        agw_mem_release();
    else
        agw_mem_release_own();
    srv->trim_all = false;
}

static void accept_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_server *srv = arg;

    (void)fd;
    (void)what;
    srv->accept_paused = false;
    if (!srv->accept_held)
        listeners_enable(srv, true);
}

/* ---- server --------------------------------------------------------------------------------- */

/* libevhtp's objects go to a heap of their own (include/agw/mem.h) when the build has one: the
 * connection and what comes with it are allocated at accept and freed at once (own()); on the heap
 * of the long-lived objects they would leave holes among them. Its parser is allocated with plain
 * malloc() and freed through the hook (the separate heap's free takes any block).
 * evhtp_set_mem_functions() also sets libevent's allocator: it is set again at once, to mem's
 * section-aware functions, so that libevent's objects go to the main heap (the connection's
 * bufferevent, made by libevhtp, outlives libevhtp's objects) except in a section (own(), the
 * gate's reads and parsing). Both calls run before any libevhtp object exists and, the first time a
 * server is made, before the loops run; with jemalloc any free takes any block anyway. */
static pthread_once_t lib_heap_once = PTHREAD_ONCE_INIT;

static void lib_heap_init(void)
{
    agw_malloc_fn *m;
    agw_realloc_fn *r;
    agw_free_fn *f;

    if (!agw_mem_separate_heap(&m, &r, &f))
        return;
    evhtp_set_mem_functions(m, r, f);
    if (agw_mem_libevent_functions(&m, &r, &f))
        event_set_mem_functions(m, r, f);
    else
        event_set_mem_functions(malloc, realloc, free);
}

/* Each connection's parser copies the limits when the connection is accepted: new options reach
 * new connections (and every request's timer from now on). */
void agw_server_set_options(struct agw_server *srv, const struct agw_server_options *opts)
{
    srv->opts = *opts;
    srv->limits = (struct agw_http1_request_limits){.max_line = AGW_MAX_REQUEST_LINE,
                                                    .max_fields = opts->max_header_fields,
                                                    .max_body = opts->max_body_bytes};
    srv->hold_max = opts->max_head_bytes + opts->max_body_bytes;
}

struct agw_server *agw_server_new(struct event_base *base, const struct agw_server_options *opts,
                                  agw_req_fn *handler, void *arg)
{
    struct agw_server *srv = agw_xcalloc(1, sizeof(*srv));

    pthread_once(&lib_heap_once, lib_heap_init);
    srv->base = base;
    TAILQ_INIT(&srv->conns);
    srv->handler = handler;
    srv->arg = arg;
    agw_server_set_options(srv, opts);
    srv->accept_timer = evtimer_new(base, accept_timer_cb, srv);
    srv->accept_turn = evtimer_new(base, accept_turn_cb, srv);
    event_priority_set(srv->accept_turn, AGW_PRIO_NEW); /* the listeners' (libevent's default) */
    srv->trim_ev = evtimer_new(base, trim_cb, srv);
    srv->shed_tv = event_base_init_common_timeout(
        base, &(struct timeval){SHED_MS / 1000, SHED_MS % 1000 * 1000});
    return srv;
}

void agw_server_free(struct agw_server *srv)
{
    if (srv == NULL)
        return;
    /* Closing a connection runs its fini hooks (and the close callbacks of its request). */
    while (!TAILQ_EMPTY(&srv->conns))
        conn_close(TAILQ_FIRST(&srv->conns));
    for (size_t i = 0; i < srv->n_htps; i++) {
        evhtp_unbind_socket(srv->htps[i]);
        evhtp_free(srv->htps[i]);
    }
    event_free(srv->accept_timer);
    event_free(srv->accept_turn);
    event_free(srv->trim_ev);
    free(srv);
}

int agw_server_listen(struct agw_server *srv, const char *address, uint16_t port, void *tls,
                      uint16_t *bound_port)
{
    evhtp_t *htp;
    char addr[96];
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    evutil_socket_t fd;

    if (srv->n_htps == AGW_MAX_LISTENERS) {
        SSL_CTX_free(tls);
        return -AGW_EINVAL;
    }
    htp = evhtp_new(srv->base, srv);
    if (htp == NULL) {
        SSL_CTX_free(tls);
        return -AGW_EIO;
    }
    /* libevhtp makes an SSL from htp->ssl_ctx for each accepted connection and frees the context in
     * evhtp_free(); we build the context ourselves (src/tls.c) rather than through
     * evhtp_ssl_init(), which cannot set a minimum version and reports success for missing files.
     */
    htp->ssl_ctx = tls;
    /* No libevhtp 100-continue (we answer Expect ourselves), no evhtp read timeouts (they would
     * kill streams; we run our own timers), Nagle off so each frame leaves at once, SO_REUSEPORT so
     * every worker loop binds the same address. */
    htp->flags = EVHTP_FLAG_ENABLE_REUSEPORT | EVHTP_FLAG_ENABLE_NODELAY;
    evhtp_set_post_accept_cb(htp, post_accept, srv);
    /* libevhtp takes "ipv6:" for IPv6 addresses. */
    if (strchr(address, ':') != NULL)
        snprintf(addr, sizeof(addr), "ipv6:%s", address);
    else
        snprintf(addr, sizeof(addr), "%s", address);
    if (evhtp_bind_socket(htp, addr, port, 1024) != 0) {
        evhtp_free(htp);
        return -AGW_EIO;
    }
    evconnlistener_set_error_cb(htp->server, accept_error_cb);
    fd = evconnlistener_get_fd(htp->server);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        evhtp_unbind_socket(htp);
        evhtp_free(htp);
        return -AGW_EIO;
    }
    if (ss.ss_family == AF_INET6)
        *bound_port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    else
        *bound_port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    srv->htps[srv->n_htps] = htp;
    return (int)srv->n_htps++;
}

void agw_server_set_tls(struct agw_server *srv, int index, void *tls)
{
    evhtp_t *htp;
    SSL_CTX *old;

    assert(index >= 0 && (size_t)index < srv->n_htps);
    htp = srv->htps[index];
    /* Each open connection's SSL holds its own reference to the context it was made from. */
    old = htp->ssl_ctx;
    htp->ssl_ctx = tls;
    SSL_CTX_free(old);
}

void agw_server_stop_listening(struct agw_server *srv)
{
    for (size_t i = 0; i < srv->n_htps; i++)
        evhtp_unbind_socket(srv->htps[i]);
}

void agw_server_drain(struct agw_server *srv)
{
    struct conn_ctx *cc, *next;

    srv->draining = true;
    agw_server_stop_listening(srv);
    /* Kept-alive connections waiting for a next request are closed now; the others close after
     * their answer. This runs from a signal event, outside the connections' callbacks. */
    for (cc = TAILQ_FIRST(&srv->conns); cc != NULL; cc = next) {
        next = TAILQ_NEXT(cc, link);
        if (cc->cur == NULL)
            conn_close(cc);
    }
}

bool agw_server_draining(const struct agw_server *srv)
{
    return srv->draining;
}

/* Read by the metrics from any loop: hence the atomics. */
void agw_server_get_stats(const struct agw_server *srv, struct agw_server_stats *st)
{
    st->accept_errors = __atomic_load_n(&srv->stats.accept_errors, __ATOMIC_RELAXED);
    st->accept_yields = __atomic_load_n(&srv->stats.accept_yields, __ATOMIC_RELAXED);
    for (size_t i = 0; i < AGW_SERVER_N_REFUSALS; i++)
        st->refused[i] = __atomic_load_n(&srv->stats.refused[i], __ATOMIC_RELAXED);
}

size_t agw_server_active_requests(const struct agw_server *srv)
{
    return srv->active;
}
