/* The HTTP server side, over libevhtp 1.2.18 — the only file that calls it (see
 * doc/internals/http_server.md and
 * ../shared/notes/libevhtp.md for the traps this works around).
 *
 * Objects: one struct agw_server per event loop, one evhtp_t per listener (an evhtp_t binds one
 * socket), one struct conn_ctx per accepted connection (freed by the connection_fini hook) and one
 * struct agw_req per request (created in the headers hook, freed by the request_fini hook, which
 * runs on a normal end, a client abort and shutdown alike). */
#include "config.h"

#include <arpa/inet.h>
#include <assert.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_struct.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <evhtp.h>
#include <jansson.h>
#include <openssl/ssl.h>

#include "agw/http_server.h"
#include "agw/log.h"

#define MAX_LISTENERS    16
#define MAX_HEADER_BYTES (64 * 1024) /* all request header names + values */
#define REQUEST_ID_MAX   64

struct conn_ctx;

struct agw_server {
    struct event_base *base;
    TAILQ_HEAD(, conn_ctx) conns; /* every open connection, so shutdown can close them */
    bool draining;                /* answers close their connection */
    struct agw_server_options opts;
    agw_req_fn *handler;
    void *arg;
    evhtp_t *htps[MAX_LISTENERS];
    size_t n_htps;
    size_t active; /* live struct agw_req */
};

struct conn_ctx {
    struct agw_server *srv;
    TAILQ_ENTRY(conn_ctx) link;
    evhtp_connection_t *conn;
    struct event
        *timer; /* request read timeout (slow clients), armed while no request is complete */
    struct event *abort_ev; /* deferred agw_req_abort() */
    struct agw_req *cur;    /* the request being read or answered, or NULL */
    char peer[64];
};

struct agw_req {
    struct agw_server *srv;
    struct conn_ctx *cc;
    evhtp_request_t *r;
    char id[REQUEST_ID_MAX + 1];
    uint64_t start_ms;
    int status;     /* 0 until answered */
    bool rejected;  /* answered before the body was read (413, 417, 431, 505): ignore the rest */
    bool complete;  /* the handler was called */
    bool streaming; /* stream_start was called */
    size_t header_bytes; /* sum of header names and values read */
    size_t body_bytes;   /* body bytes read */
    agw_req_event_fn *on_close;
    agw_req_event_fn *on_drain;
    void *cb_arg;
    size_t lowat;
    /* Set by stream_start: the connection's output and socket, when chunks may go straight to the
     * socket (plain TCP, chunked); out_direct is NULL otherwise. */
    struct evbuffer *out_direct;
    evutil_socket_t fd;
    bool head_queued; /* the response head waits in out_direct: the first chunk takes it along */
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

    if (prefix[0] == '\0')
        agw_random_hex(prefix, 8);
    n = ++counter;
    snprintf(out, len, "%.16s%016" PRIx64, prefix, n);
}

/* ---- connection timer ----------------------------------------------------------------------- */

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
 * close it. This runs from the event loop, outside every libevhtp callback, so freeing the
 * connection here is safe. */
static void request_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct conn_ctx *cc = arg;

    (void)fd;
    (void)what;
    if (cc->cur != NULL && cc->cur->complete)
        return; /* a request is being answered; its own timers govern it */
    agw_log_debug("conn %s: request read timeout, closing", cc->peer);
    evhtp_connection_free(cc->conn);
}

static void abort_cb(evutil_socket_t fd, short what, void *arg)
{
    struct conn_ctx *cc = arg;

    (void)fd;
    (void)what;
    evhtp_connection_free(cc->conn);
}

/* ---- replies -------------------------------------------------------------------------------- */

static void set_header(evhtp_request_t *r, const char *name, const char *value)
{
    evhtp_header_t *old;

    while ((old = evhtp_headers_find_header(r->headers_out, name)) != NULL)
        evhtp_header_rm_and_free(r->headers_out, old);
    evhtp_headers_add_header(r->headers_out, evhtp_header_new(name, value, 1, 1));
}

void agw_req_add_header(struct agw_req *req, const char *name, const char *value)
{
    set_header(req->r, name, value);
}

void agw_req_reply(struct agw_req *req, int status, const char *content_type, const char *body,
                   size_t len)
{
    assert(req->status == 0);
    req->status = status;
    if (req->srv->draining)
        evhtp_request_set_keepalive(req->r, 0);
    if (content_type != NULL)
        set_header(req->r, "Content-Type", content_type);
    set_header(req->r, "X-Request-Id", req->id);
    if (body != NULL && len > 0 && req->r->method != htp_method_HEAD)
        evbuffer_add(req->r->buffer_out, body, len);
    evhtp_send_reply(req->r, (evhtp_res)status);
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

/* Answers before the body is read and closes the connection after the answer: the rest of the
 * request is never looked at (libevhtp frees the connection once the reply is flushed, as
 * keep-alive is off). */
static void reject_early(struct agw_req *req, int status, const char *msg)
{
    req->rejected = true;
    evhtp_request_set_keepalive(req->r, 0);
    set_header(req->r, "Connection", "close");
    agw_req_reply_error(req, status, "%s", msg);
}

/* ---- streaming ------------------------------------------------------------------------------ */

void agw_req_on_close(struct agw_req *req, agw_req_event_fn *on_close, void *arg)
{
    req->on_close = on_close;
    req->cb_arg = arg;
}

void agw_req_stream_start(struct agw_req *req, int status, size_t low_watermark,
                          agw_req_event_fn *on_drain)
{
    struct bufferevent *bev = evhtp_request_get_bev(req->r);

    assert(req->status == 0);
    req->status = status;
    req->streaming = true;
    req->on_drain = on_drain;
    req->lowat = low_watermark;
    if (req->srv->draining)
        evhtp_request_set_keepalive(req->r, 0);
    set_header(req->r, "X-Request-Id", req->id);
    /* The on_write hook runs when the output falls to the low watermark: the relay resumes its
     * upstream. */
    bufferevent_setwatermark(bev, EV_WRITE, low_watermark, 0);
    bufferevent_set_max_single_write(bev, 64 * 1024);
    evhtp_send_reply_chunk_start(req->r, (evhtp_res)status);
    bufferevent_flush(bev, EV_WRITE, BEV_FLUSH);
    if (req->r->conn->ssl == NULL && (req->r->flags & EVHTP_REQ_FLAG_CHUNKED)) {
        req->out_direct = bufferevent_get_output(bev);
        req->fd = bufferevent_getfd(bev);
        req->head_queued = evbuffer_get_length(req->out_direct) > 0;
    }
}

/* A chunk is written to the socket at once when nothing is queued before it on a plain TCP
 * connection: the events reach the client in this loop iteration rather than the next, and the
 * bufferevent's write event is not armed and disarmed for them (two epoll_ctl calls a burst). One
 * writev() takes the chunk header, <buf>'s segments and the CRLF, with no copy. What the socket
 * does not take is queued as usual, and while anything is queued every chunk queues behind it, so
 * the order holds. The one exception is the response head, which libevhtp queues at stream start:
 * the first chunk takes it along, in front, in the same writev(), so the head and the first events
 * leave together at once rather than on the next iteration. (libevhtp would queue the chunk and
 * flush it on the next iteration; over TLS it must, the bytes go through OpenSSL.) */
#define DIRECT_SEGMENTS 16
#define HEAD_SEGMENTS   4

/* "<hex size>\r\n" into <hdr> (at least 19 bytes); returns its length. */
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

/* Returns false, having written nothing, when <out> (whose bytes go first: the response head) or
 * <buf> has too many segments for one writev(). */
static bool write_chunk_now(struct evbuffer *out, evutil_socket_t fd, struct evbuffer *buf,
                            size_t n, bool last)
{
    struct evbuffer_iovec seg[DIRECT_SEGMENTS], head[HEAD_SEGMENTS];
    struct iovec iov[HEAD_SEGMENTS + DIRECT_SEGMENTS + 2];
    char hdr[24], crlf[7] = {'\r', '\n', '0', '\r', '\n', '\r', '\n'};
    size_t tail = last ? sizeof(crlf) : 2; /* the chunk's CRLF, and the last chunk after it */
    size_t hl, done, body, queued = evbuffer_get_length(out);
    int nhead = queued > 0 ? evbuffer_peek(out, -1, NULL, head, HEAD_SEGMENTS) : 0;
    int nseg = evbuffer_peek(buf, -1, NULL, seg, DIRECT_SEGMENTS);
    int k = 0;
    ssize_t w;

    if (nseg > DIRECT_SEGMENTS || nhead > HEAD_SEGMENTS)
        return false;
    hl = chunk_header(hdr, n);
    for (int i = 0; i < nhead; i++)
        iov[k++] = (struct iovec){.iov_base = head[i].iov_base, .iov_len = head[i].iov_len};
    iov[k++] = (struct iovec){.iov_base = hdr, .iov_len = hl};
    for (int i = 0; i < nseg; i++)
        iov[k++] = (struct iovec){.iov_base = seg[i].iov_base, .iov_len = seg[i].iov_len};
    iov[k++] = (struct iovec){.iov_base = crlf, .iov_len = tail};
    /* An error (the client left) is left for the bufferevent to find: everything is queued. */
    w = writev(fd, iov, k);
    done = w > 0 ? (size_t)w : 0;
    if (queued > 0) {
        size_t sent = done < queued ? done : queued;

        /* The bufferevent keeps its output's front frozen outside its own writes, as libevent's
         * write callback does: thawed for this drain. */
        evbuffer_unfreeze(out, 1);
        evbuffer_drain(out, sent);
        evbuffer_freeze(out, 1);
        done -= sent;
    }
    if (done < hl)
        evbuffer_add(out, hdr + done, hl - done);
    done = done > hl ? done - hl : 0;
    body = done < n ? done : n;
    evbuffer_drain(buf, body);
    evbuffer_add_buffer(out, buf);
    done -= body;
    if (done < tail)
        evbuffer_add(out, crlf + done, tail - done);
    return true;
}

/* The connection's write event is armed: its write callback will run on the next iteration. */
static bool write_armed(const struct agw_req *req)
{
    struct bufferevent *bev = evhtp_request_get_bev(req->r);

    return event_pending(&bev->ev_write, EV_WRITE, NULL);
}

void agw_req_stream_write(struct agw_req *req, struct evbuffer *buf)
{
    struct evbuffer *out = req->out_direct;
    size_t n = evbuffer_get_length(buf);

    bool head = req->head_queued;

    if (n == 0)
        return;
    req->head_queued = false;
    /* Anything queued but the head: the chunk queues behind it. */
    if (out == NULL || (!head && evbuffer_get_length(out) > 0) ||
        !write_chunk_now(out, req->fd, buf, n, false))
        evhtp_send_reply_chunk(req->r, buf);
}

/* The end of the body, after <buf>'s bytes (maybe none). When the connection's write event is armed
 * already (the head of a response whose events all came in this iteration was queued at stream
 * start) and nothing else waits in the output, the events and the last chunk go to the socket at
 * once, in one writev(). libevhtp is then only told that the reply is finished: the armed event
 * runs its write callback on the next iteration, and that completes the request (it wants an empty
 * output and the flag). The write event is looked at directly (event2/bufferevent_struct.h): it is
 * what makes this safe, since without it nothing would ever complete the request. Otherwise the
 * events and the last chunk are queued behind what is there. */
void agw_req_stream_finish(struct agw_req *req, struct evbuffer *buf)
{
    struct evbuffer *out = req->out_direct;
    size_t n = evbuffer_get_length(buf);
    bool head = req->head_queued;

    req->head_queued = false;
    if (n > 0 && out != NULL && (head || evbuffer_get_length(out) == 0) && write_armed(req) &&
        write_chunk_now(out, req->fd, buf, n, true)) {
        evhtp_send_reply_end(req->r);
        return;
    }
    if (n > 0)
        evhtp_send_reply_chunk(req->r, buf);
    evhtp_send_reply_chunk_end(req->r);
}

size_t agw_req_out_pending(const struct agw_req *req)
{
    if (req->out_direct != NULL) /* checked after every write: no walk through libevhtp */
        return evbuffer_get_length(req->out_direct);
    return evbuffer_get_length(bufferevent_get_output(evhtp_request_get_bev(req->r)));
}

void agw_req_detach(struct agw_req *req)
{
    req->on_close = NULL;
    req->on_drain = NULL;
    req->cb_arg = NULL;
}

void agw_req_abort(struct agw_req *req)
{
    event_active(req->cc->abort_ev, EV_TIMEOUT, 0);
}

/* ---- accessors ------------------------------------------------------------------------------ */

enum agw_method agw_req_method(const struct agw_req *req)
{
    switch (req->r->method) {
    case htp_method_GET:
        return AGW_METHOD_GET;
    case htp_method_HEAD:
        return AGW_METHOD_HEAD;
    case htp_method_POST:
        return AGW_METHOD_POST;
    case htp_method_OPTIONS:
        return AGW_METHOD_OPTIONS;
    default:
        return AGW_METHOD_OTHER;
    }
}

const char *agw_req_method_name(const struct agw_req *req)
{
    return htparser_get_methodstr_m(req->r->method);
}

const char *agw_req_path(const struct agw_req *req)
{
    if (req->r->uri == NULL || req->r->uri->path == NULL || req->r->uri->path->full == NULL)
        return "/";
    return req->r->uri->path->full;
}

const char *agw_req_query(const struct agw_req *req)
{
    if (req->r->uri == NULL || req->r->uri->query_raw == NULL)
        return NULL;
    return (const char *)req->r->uri->query_raw;
}

const char *agw_req_header(const struct agw_req *req, const char *name)
{
    return evhtp_header_find(req->r->headers_in, name);
}

struct foreach_ctx {
    agw_header_fn *fn;
    void *arg;
};

static int foreach_cb(evhtp_kv_t *kv, void *arg)
{
    struct foreach_ctx *fc = arg;

    fc->fn(kv->key, kv->val, fc->arg);
    return 0;
}

void agw_req_foreach_header(const struct agw_req *req, agw_header_fn *fn, void *arg)
{
    struct foreach_ctx fc = {fn, arg};

    evhtp_kvs_for_each(req->r->headers_in, foreach_cb, &fc);
}

struct evbuffer *agw_req_body(const struct agw_req *req)
{
    return req->r->buffer_in;
}

const char *agw_req_id(const struct agw_req *req)
{
    return req->id;
}

const char *agw_req_peer(const struct agw_req *req)
{
    return req->cc->peer;
}

uint64_t agw_req_start_ms(const struct agw_req *req)
{
    return req->start_ms;
}

/* ---- libevhtp hooks ------------------------------------------------------------------------- */

static void request_complete_cb(evhtp_request_t *r, void *arg);

static evhtp_res on_header(evhtp_request_t *r, evhtp_header_t *h, void *arg)
{
    struct conn_ctx *cc = arg;
    struct agw_req *req = cc->cur;

    (void)r;
    if (req == NULL || req->rejected)
        return EVHTP_RES_OK;
    req->header_bytes += h->klen + h->vlen;
    if (req->header_bytes > MAX_HEADER_BYTES)
        reject_early(req, 431, "request header fields too large");
    return EVHTP_RES_OK;
}

static evhtp_res on_read(evhtp_request_t *r, struct evbuffer *buf, void *arg)
{
    struct conn_ctx *cc = arg;
    struct agw_req *req = cc->cur;

    (void)r;
    if (req == NULL || req->rejected) {
        evbuffer_drain(buf, evbuffer_get_length(buf));
        return EVHTP_RES_OK;
    }
    req->body_bytes += evbuffer_get_length(buf);
    if (req->body_bytes > cc->srv->opts.max_body_bytes) {
        /* A chunked body (no Content-Length) grew past the limit. */
        evbuffer_drain(buf, evbuffer_get_length(buf));
        char msg[96];
        snprintf(msg, sizeof(msg), "payload too large: the limit is %zu bytes",
                 cc->srv->opts.max_body_bytes);
        reject_early(req, 413, msg);
    }
    return EVHTP_RES_OK;
}

/* The request is gone: run its owner's close callback and free it. */
static void end_request(struct conn_ctx *cc, struct agw_req *req)
{
    cc->cur = NULL;
    if (req->on_close != NULL) {
        agw_req_event_fn *fn = req->on_close;
        req->on_close = NULL;
        req->on_drain = NULL;
        fn(req, req->cb_arg);
    }
    cc->srv->active--;
    free(req);
}

static evhtp_res on_request_fini(evhtp_request_t *r, void *arg)
{
    struct conn_ctx *cc = arg;
    struct agw_req *req = cc->cur;

    if (req == NULL || req->r != r)
        return EVHTP_RES_OK;
    end_request(cc, req);
    /* A kept-alive connection must deliver its next request within the same limit. */
    arm_request_timer(cc);
    return EVHTP_RES_OK;
}

static evhtp_res on_headers(evhtp_request_t *r, evhtp_headers_t *hdrs, void *arg)
{
    struct conn_ctx *cc = arg;
    struct agw_req *req = cc->cur;
    const char *v;

    (void)hdrs;
    if (req == NULL)
        return EVHTP_RES_ERROR;
    /* Route every complete request to our handler, whatever libevhtp's own callback lookup chose.
     */
    r->cb = request_complete_cb;
    r->cbarg = cc;
    if (req->rejected)
        return EVHTP_RES_OK;

    v = evhtp_header_find(r->headers_in, "X-Request-Id");
    if (v != NULL && request_id_ok(v))
        snprintf(req->id, sizeof(req->id), "%s", v);
    else
        new_request_id(req->id, sizeof(req->id));

    if (r->proto != EVHTP_PROTO_11) {
        reject_early(req, 505, "HTTP version not supported: use HTTP/1.1");
        return EVHTP_RES_OK;
    }
    v = evhtp_header_find(r->headers_in, "Content-Length");
    if (v != NULL) {
        char *end = NULL;
        unsigned long long n = strtoull(v, &end, 10);
        if (end == v || *end != '\0' || v[0] == '-') {
            reject_early(req, 400, "bad request: invalid Content-Length");
            return EVHTP_RES_OK;
        }
        if (n > cc->srv->opts.max_body_bytes) {
            char msg[96];
            snprintf(msg, sizeof(msg), "payload too large: the limit is %zu bytes",
                     cc->srv->opts.max_body_bytes);
            reject_early(req, 413, msg);
            return EVHTP_RES_OK;
        }
    }
    v = evhtp_header_find(r->headers_in, "Expect");
    if (v != NULL) {
        if (!agw_strieq_n(v, strlen(v), "100-continue")) {
            reject_early(req, 417, "expectation failed: only 100-continue is supported");
            return EVHTP_RES_OK;
        }
        /* libevhtp's own 100-continue is off: it would answer any Expect, even after a rejection.
         */
        evbuffer_add_printf(bufferevent_get_output(evhtp_request_get_bev(r)),
                            "HTTP/1.1 100 Continue\r\n\r\n");
    }
    return EVHTP_RES_OK;
}

static evhtp_res on_headers_start(evhtp_request_t *r, void *arg)
{
    struct conn_ctx *cc = arg;
    struct agw_req *req;

    if (cc->cur != NULL)
        return EVHTP_RES_ERROR; /* pipelined request behind one still alive: refuse (see doc) */
    req = agw_xcalloc(1, sizeof(*req));
    req->srv = cc->srv;
    req->cc = cc;
    req->r = r;
    req->start_ms = agw_now_ms();
    cc->cur = req;
    cc->srv->active++;
    /* The request-level fini hook is what libevhtp runs when it frees the request, in every case.
     */
    evhtp_request_set_hook(r, evhtp_hook_on_request_fini, (evhtp_hook)on_request_fini, cc);
    return EVHTP_RES_OK;
}

static void request_complete_cb(evhtp_request_t *r, void *arg)
{
    struct conn_ctx *cc = arg;
    struct agw_req *req = cc->cur;

    if (req == NULL || req->r != r || req->rejected)
        return;
    req->complete = true;
    evtimer_del(cc->timer);
    cc->srv->handler(req, cc->srv->arg);
}

static evhtp_res on_write(evhtp_connection_t *conn, void *arg)
{
    struct conn_ctx *cc = arg;
    struct agw_req *req = cc->cur;

    (void)conn;
    if (req != NULL && req->streaming && req->on_drain != NULL)
        req->on_drain(req, req->cb_arg);
    return EVHTP_RES_OK;
}

static evhtp_res on_connection_fini(evhtp_connection_t *conn, void *arg)
{
    struct conn_ctx *cc = arg;

    (void)conn;
    /* libevhtp runs this hook before it frees the connection's request: end the request here and
     * unhook it, since its fini hook would otherwise run with this context already freed. */
    if (cc->cur != NULL) {
        evhtp_request_unset_hook(cc->cur->r, evhtp_hook_on_request_fini);
        end_request(cc, cc->cur);
    }
    TAILQ_REMOVE(&cc->srv->conns, cc, link);
    event_free(cc->timer);
    event_free(cc->abort_ev);
    free(cc);
    return EVHTP_RES_OK;
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

static evhtp_res post_accept(evhtp_connection_t *conn, void *arg)
{
    struct agw_server *srv = arg;
    struct conn_ctx *cc = agw_xcalloc(1, sizeof(*cc));

    cc->srv = srv;
    cc->conn = conn;
    cc->timer = evtimer_new(srv->base, request_timeout_cb, cc);
    cc->abort_ev = evtimer_new(srv->base, abort_cb, cc);
    format_peer(conn->saddr, cc->peer, sizeof(cc->peer));
    TAILQ_INSERT_TAIL(&srv->conns, cc, link);
    evhtp_connection_set_hook(conn, evhtp_hook_on_headers_start, (evhtp_hook)on_headers_start, cc);
    evhtp_connection_set_hook(conn, evhtp_hook_on_header, (evhtp_hook)on_header, cc);
    evhtp_connection_set_hook(conn, evhtp_hook_on_headers, (evhtp_hook)on_headers, cc);
    evhtp_connection_set_hook(conn, evhtp_hook_on_read, (evhtp_hook)on_read, cc);
    evhtp_connection_set_hook(conn, evhtp_hook_on_write, (evhtp_hook)on_write, cc);
    evhtp_connection_set_hook(conn, evhtp_hook_on_connection_fini, (evhtp_hook)on_connection_fini,
                              cc);
    arm_request_timer(cc);
    return EVHTP_RES_OK;
}

/* Requests that reach libevhtp's generic callback without our headers hook having run (it cannot
 * happen with the hooks above, but an unanswered request would hang the connection). */
static void gencb(evhtp_request_t *r, void *arg)
{
    (void)arg;
    evhtp_send_reply(r, EVHTP_RES_SERVERR);
}

/* ---- server --------------------------------------------------------------------------------- */

struct agw_server *agw_server_new(struct event_base *base, const struct agw_server_options *opts,
                                  agw_req_fn *handler, void *arg)
{
    struct agw_server *srv = agw_xcalloc(1, sizeof(*srv));

    srv->base = base;
    TAILQ_INIT(&srv->conns);
    srv->opts = *opts;
    srv->handler = handler;
    srv->arg = arg;
    return srv;
}

void agw_server_free(struct agw_server *srv)
{
    if (srv == NULL)
        return;
    /* Closing a connection runs its fini hooks (and the close callbacks of its request). */
    while (!TAILQ_EMPTY(&srv->conns))
        evhtp_connection_free(TAILQ_FIRST(&srv->conns)->conn);
    for (size_t i = 0; i < srv->n_htps; i++) {
        evhtp_unbind_socket(srv->htps[i]);
        evhtp_free(srv->htps[i]);
    }
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

    if (srv->n_htps == MAX_LISTENERS) {
        SSL_CTX_free(tls);
        return -AGW_EINVAL;
    }
    htp = evhtp_new(srv->base, NULL);
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
    evhtp_set_gencb(htp, gencb, srv);
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
     * their answer. This runs from a signal event, outside libevhtp's callbacks. */
    for (cc = TAILQ_FIRST(&srv->conns); cc != NULL; cc = next) {
        next = TAILQ_NEXT(cc, link);
        if (cc->cur == NULL)
            evhtp_connection_free(cc->conn);
    }
}

bool agw_server_draining(const struct agw_server *srv)
{
    return srv->draining;
}

size_t agw_server_active_requests(const struct agw_server *srv)
{
    return srv->active;
}
