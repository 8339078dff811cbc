/* libFuzzer driver for src/http_server.c: the REAL server side, over a loopback socket. The driver
 * is the client: it sends the input's bytes on one connection to a server listening on
 * 127.0.0.1:0, reads everything the server answers, and checks it. So every path of the gate
 * (gate_run(), serve(), answered(), refusals and the lingering close, pipelining, half-closed
 * clients, aborts) runs with the handler calls of a real owner: a handler that answers in every
 * way the API offers, synchronously and later from timers, and whose streams may outlive the
 * client.
 *
 * One event loop (agw_loop_new()) lives for the whole process; each input gets a fresh server
 * (agw_server_new() + agw_server_listen()), freed at its end, and one client connection.
 *
 * The input: its first four bytes choose the limits and what the client does, the rest is what
 * the client sends.
 *   byte 0: bits 0-1: max_head_bytes (4096, 256, 64, 16384), bits 2-3: max_body_bytes (4096, 16,
 *           0, 65536), bits 4-5: max_header_fields (32, 4, 1, 2), bits 6-7: request_ms (1000, 0,
 *           20, 5);
 *   byte 1: bits 0-1: the end of the sending (0: keep the connection open until the exchange is
 *           quiet, then close; 1: shut the sending side (SHUT_WR) after the last byte, read until
 *           quiet, then close; 2: close (FIN) right after the last byte; 3: reset (RST) right
 *           after it), bit 2: the final close is a FIN (else a reset), bit 3: a request told that
 * its client half-closed aborts (agw_req_abort()), bit 4: with request_ms 20 or 5, wait for the
 *           server to end the connection itself (its request timeout) rather than closing when
 *           quiet, bits 5-6: the size of a stream's chunks (8, 1000, 70000 bytes, or empty
 *           writes), bit 7: streams are started with extra header lines (<fields>);
 *   byte 2: the client's writes: 0 sends all at once, n > 0 writes of 1..n bytes (pseudo-random
 *           from n), one a loop turn;
 *   byte 3: bits 0-1: the client's reading (0: all it can each turn; 1: with a 4 KiB receive
 *           buffer; 2: the same, at most 512 bytes a turn; 3: nothing until all is sent), so that
 *           answers back up and streams see their drain callback; bits 2-4: k > 0 drains the server
 *           (agw_server_drain()): bit 5 clear, in the handler of the k-th request, before it
 *           answers; set, from the loop at turn 2k; bits 6-7: unused.
 *
 * The handler answers by the request path: its second byte picks the way ('a' + k, modulo 13), the
 * third a variant (steps, status, timing):
 *   a  agw_req_reply() 200 with a body (or      h  a stream started by a 1 ms timer, a chunk a ms
 *      after agw_req_detach(): no callback)     i  agw_req_reply() from a zero-timeout event
 *   b  agw_req_reply() 200 without a body       j  a stream that never ends: heartbeats once the
 *   c  agw_req_reply() 204 (a body given)          client has gone, so the server finds out
 *   d  agw_req_reply_error(), 16 statuses       k  a stream, then agw_req_abort() (now or later)
 *      (also a non-UTF-8 message)               l  a stream with headers, finished at once
 *   e  agw_req_add_header(), a name set twice,  m  a stream driven by its drain callback
 *      a value long enough for a 512+ byte head
 *   f  a stream written and finished at once
 *   g  a stream continued by zero-timeout events
 * (a HEAD request is answered with agw_req_reply(), at once or later: no stream for HEAD). Every
 * request registers a close callback, a half-close callback and, for streams, a drain callback.
 *
 * A reference, the request parser of src/http1.c run on all the client's bytes with the server's
 * limits, says which requests are valid, in order, and how the sequence ends (a refusal and its
 * status, Connection: close, or bytes that never make a request).
 *
 * Checks, on top of the sanitizers (and leak detection: each input frees everything):
 *   - the handler gets the reference's requests, in order, one at a time (the previous request
 *     closed and answered), never one after a request that ends the connection; its accessors
 *     say what the reference parsed: method, path (starting with '/', or "*"), query, every field
 *     (agw_req_foreach_header()) and the known ones, body, request id; the peer is 127.0.0.1;
 *   - the bytes the server sends are a sequence of valid HTTP/1.1 responses (the response parser
 *     of src/http1.c): "100 Continue" interims only for requests that asked, then the handler's
 *     answers in order (status, X-Request-Id, headers set once even when set twice, framing,
 *     the exact body; none for HEAD or 204), then at most one refusal with the status the
 *     reference predicts, Connection: close, and nothing after a response that closes;
 *   - when the client kept reading until the exchange was quiet (not closed early, no short
 *     request timeout): every request answered in full got its complete response, every valid
 *     request was handled unless one before it ended the connection, and the refusal came when
 *     the reference predicts one (a half-closed client still gets its answer);
 *   - close callbacks run exactly once per request, nothing runs after it; drain and half-close
 *     callbacks only for a live request (half-close only once the client shut its side); after
 *     the client has closed, every request ends (agw_server_active_requests() falls to 0) within
 *     a bound, and the server's refusal counters agree with what was seen.
 *
 *   tests/fuzz/build.sh _build-fuzz server     (or by hand, with every library source:)
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -I_build \
 *       tests/fuzz/fuzz_server.c $(find src -name '*.c' ! -name main.c) \
 *       $(pkg-config --cflags --libs evhtp libevent_openssl libevent_pthreads openssl jansson)
 *   ./a.out tests/fuzz/corpus/server
 * AGW_FUZZ_TRACE=1 prints what each input did. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>

#include "agw/http1.h"
#include "agw/http_server.h"
#include "agw/limits.h"
#include "agw/log.h"
#include "agw/loop.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define QUIET_TURNS 8          /* loop turns without any progress: the exchange is quiet */
#define PHASE1_MS   200        /* the client sends and reads for at most this long */
#define PHASE2_MS   3000       /* after the client closed, its requests must end within this */
#define BIG_BUDGET  (2u << 20) /* stream bytes an input may send in large chunks */
#define MAX_CHUNK   70000

enum end_mode { END_KEEP, END_HALF, END_CLOSE, END_RST };

enum mode {
    M_REPLY,
    M_EMPTY,
    M_204,
    M_ERROR,
    M_HEADERS,
    M_STREAM,
    M_ZERO,
    M_TIMER,
    M_LATER,
    M_FOREVER,
    M_ABORT,
    M_FIELDS,
    M_DRAIN,
    N_MODES
};

#define STREAM_FIELDS "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n"

/* ---- the reference --------------------------------------------------------------------------- */

enum ref_end { REF_INCOMPLETE, REF_REFUSED, REF_CLOSE };

struct ref_req {
    char method[AGW_HTTP1_MAX_METHOD + 1];
    char *head; /* the head, its fields split in place */
    struct agw_http1_field *f;
    size_t n_fields;
    char *path, *query; /* copies */
    char *body;
    size_t body_len;
    bool close, head_method;
};

struct reference {
    struct ref_req *r;
    size_t n;
    enum ref_end end;
    bool after_close;  /* REF_CLOSE: the client sent bytes after the request that said close */
    int status;        /* of the refusal */
    bool refused_head; /* the refused request was a HEAD (its refusal has no body) */
    char *origin;      /* the refused request's Origin, when the head said it */
    unsigned n_expect; /* heads that asked for 100-continue */
};

/* ---- one input ------------------------------------------------------------------------------- */

struct test;

/* One request the handler got. Kept until the end of the input. */
struct rec {
    struct test *t;
    struct agw_req *req; /* NULL once its close callback ran */
    size_t index;
    enum mode mode;
    unsigned variant, step, steps;
    size_t lowat; /* of a stream driven by its drain callback */
    bool head_method, close_req;
    int status; /* answered with; 0 until the answer or the stream started */
    bool reply, streaming, finished, aborted, closed, scheduled, headers, fields;
    bool has_ctype, long_header, detached;
    long clen; /* the Content-Length of a reply, -1 for none */
    unsigned closes, half_closes, drains;
    struct evbuffer *expect; /* the body the client should get */
    char id[80];
    struct event *ev; /* the next step */
    struct event *hb; /* heartbeats of a stream that never ends */
};

struct test {
    const uint8_t *data;
    size_t len;
    struct agw_server_options opts;
    enum end_mode end;
    bool final_fin, abort_on_half, wait_server, fields;
    unsigned rcv, drain_at;
    bool drain_loop, drained;
    size_t chunk;
    unsigned wseed;
    uint32_t rng;
    struct reference ref;
    struct agw_server *srv;
    int fd;
    size_t sent;
    bool shut, client_closed, server_eof, server_reset, send_failed, all_sent;
    struct evbuffer *rx;
    size_t received;
    struct rec **recs;
    size_t n_recs, cap_recs;
    unsigned pending; /* step events scheduled */
    unsigned events;  /* callbacks of ours that ran (progress) */
    size_t big_bytes;
    unsigned cors_calls;
    char *cors_origin;
    /* what the responses showed */
    size_t n_complete; /* handler answers complete, in order */
    bool refusal_seen, refusal_complete;
    int refusal_status;
    unsigned continues;
    bool exact; /* the client read until quiet: completeness can be asked */
    unsigned turns;
};

static struct event_base *base;
static struct event *tick;
static char pattern[MAX_CHUNK + 32];

static struct test *current; /* for the trace of a failure */
static void trace(const struct test *t);

static void fatal(const char *what)
{
    fprintf(stderr, "fuzz_server: %s\n", what);
    if (current != NULL && getenv("AGW_FUZZ_TRACE") != NULL)
        trace(current);
    abort();
}

static void fatal_errno(const char *what)
{
    char msg[160];

    snprintf(msg, sizeof(msg), "%s: %s", what, strerror(errno));
    fatal(msg);
}

static bool trace_on(void)
{
    static int on = -1;

    if (on < 0)
        on = getenv("AGW_FUZZ_TRACE") != NULL;
    return on;
}

/* ---- the reference parser -------------------------------------------------------------------- */

/* The request target of a head: the path ends at a '#' (dropped) or a '?' (the query follows), as
 * the server splits it. */
static void split_target(const char *head, struct ref_req *q)
{
    const char *t = strchr(head, ' ') + 1, *end = strchr(t, ' ');
    char *target = agw_xstrndup(t, (size_t)(end - t)), *c;

    if ((c = strchr(target, '#')) != NULL)
        *c = '\0';
    if ((c = strchr(target, '?')) != NULL) {
        *c = '\0';
        q->query = agw_xstrdup(c + 1);
    }
    q->path = target;
}

static void ref_origin(struct reference *ref, const char *head, size_t avail,
                       const struct agw_http1_request *hr)
{
    if (hr->origin_len == 0 || hr->origin_len >= 256 || hr->origin_at + hr->origin_len > avail)
        return;
    ref->origin = agw_xstrndup(head + hr->origin_at, hr->origin_len);
}

static void reference(struct test *t)
{
    struct reference *ref = &t->ref;
    const struct agw_http1_request_limits lim = {.max_line = AGW_MAX_REQUEST_LINE,
                                                 .max_fields = t->opts.max_header_fields,
                                                 .max_body = t->opts.max_body_bytes};
    struct agw_http1_parser *p = agw_http1_request_parser_new(t->opts.max_head_bytes, &lim);
    struct evbuffer *in = evbuffer_new(), *body = evbuffer_new();
    size_t cap = 0;

    evbuffer_add(in, t->data, t->len);
    for (;;) {
        struct agw_http1_request hr;
        struct ref_req *q;
        char *head;
        int rc = agw_http1_parse_request_head(p, in, &hr);

        if (rc == AGW_AGAIN) {
            ref->end = REF_INCOMPLETE;
            break;
        }
        if (rc < 0) {
            ref->end = REF_REFUSED;
            ref->status = hr.status;
            ref->refused_head = hr.head_method;
            if (hr.origin_len > 0 && evbuffer_get_length(in) >= hr.origin_at + hr.origin_len)
                ref_origin(ref, (const char *)evbuffer_pullup(in, hr.origin_at + hr.origin_len),
                           hr.origin_at + hr.origin_len, &hr);
            break;
        }
        if (hr.head_len == 0 || hr.head_len > evbuffer_get_length(in))
            fatal("reference: a head longer than the bytes");
        if (hr.expect_continue)
            ref->n_expect++;
        head = agw_xmalloc(hr.head_len + 1);
        evbuffer_remove(in, head, hr.head_len);
        head[hr.head_len] = '\0';
        rc = agw_http1_parse_body(p, in, body);
        if (rc <= 0) {
            if (rc == 0) {
                ref->end = REF_INCOMPLETE;
            } else {
                ref->end = REF_REFUSED;
                ref->status = agw_http1_body_over_limit(p) ? 413 : 400;
                ref->refused_head = hr.head_method;
                ref_origin(ref, head, hr.head_len, &hr);
            }
            free(head);
            break;
        }
        if (ref->n == cap) {
            cap = cap ? cap * 2 : 8;
            ref->r = agw_xrealloc(ref->r, cap * sizeof(*ref->r));
        }
        q = &ref->r[ref->n++];
        memset(q, 0, sizeof(*q));
        memcpy(q->method, hr.method, sizeof(q->method));
        q->close = hr.close;
        q->head_method = hr.head_method;
        split_target(head, q);
        q->f = agw_xcalloc(hr.n_fields + 1, sizeof(*q->f));
        q->n_fields = agw_http1_request_fields(head, hr.head_len, q->f, hr.n_fields);
        if (q->n_fields != hr.n_fields)
            fatal("reference: the fields do not split as counted");
        q->head = head;
        q->body_len = evbuffer_get_length(body);
        q->body = agw_xmalloc(q->body_len + 1);
        evbuffer_remove(body, q->body, q->body_len);
        agw_http1_parser_reset(p);
        if (hr.close) {
            ref->end = REF_CLOSE;
            ref->after_close = evbuffer_get_length(in) > 0;
            break;
        }
    }
    evbuffer_free(in);
    evbuffer_free(body);
    agw_http1_parser_free(p);
}

static void reference_free(struct reference *ref)
{
    for (size_t i = 0; i < ref->n; i++) {
        free(ref->r[i].head);
        free(ref->r[i].f);
        free(ref->r[i].path);
        free(ref->r[i].query);
        free(ref->r[i].body);
    }
    free(ref->r);
    free(ref->origin);
}

/* The first field named <name> (case-insensitively), as agw_req_known_header() finds it. */
static const char *ref_field(const struct ref_req *q, const char *name)
{
    for (size_t i = 0; i < q->n_fields; i++)
        if (strcasecmp(q->f[i].name, name) == 0)
            return q->f[i].value;
    return NULL;
}

/* The server's test of a client's X-Request-Id. */
static bool request_id_ok(const char *s)
{
    size_t n = 0;

    for (; s[n] != '\0'; n++) {
        unsigned char c = (unsigned char)s[n];
        if (n >= 64)
            return false;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.' || c == ':'))
            return false;
    }
    return n > 0;
}

/* ---- the handler ----------------------------------------------------------------------------- */

static void step(struct rec *r);

static void step_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rec *r = arg;

    (void)fd;
    (void)what;
    if (r->req == NULL)
        fatal("a step of a closed request ran");
    r->scheduled = false;
    r->t->pending--;
    r->t->events++;
    step(r);
}

static void schedule(struct rec *r, unsigned ms)
{
    struct timeval tv = {0, (suseconds_t)ms * 1000};

    if (r->ev == NULL)
        r->ev = evtimer_new(base, step_cb, r);
    if (!r->scheduled) {
        r->scheduled = true;
        r->t->pending++;
    }
    evtimer_add(r->ev, &tv);
}

static void on_close(struct agw_req *req, void *arg)
{
    struct rec *r = arg;
    struct test *t = r->t;

    t->events++;
    if (r->detached)
        fatal("a close callback after agw_req_detach()");
    if (r->closed || r->closes > 0)
        fatal("a close callback ran twice");
    if (r->req != req)
        fatal("a close callback for another request");
    if (agw_server_active_requests(t->srv) == 0)
        fatal("a close callback while no request is active");
    r->closed = true;
    r->closes++;
    r->req = NULL;
    if (r->ev != NULL) {
        if (r->scheduled)
            t->pending--;
        r->scheduled = false;
        event_free(r->ev);
        r->ev = NULL;
    }
    if (r->hb != NULL) {
        event_free(r->hb);
        r->hb = NULL;
    }
}

static void on_half_close(struct agw_req *req, void *arg)
{
    struct rec *r = arg;
    struct test *t = r->t;

    t->events++;
    if (r->detached)
        fatal("a half-close callback after agw_req_detach()");
    if (r->req != req || r->closed)
        fatal("a half-close callback for a closed request");
    if (++r->half_closes > 1)
        fatal("a half-close callback ran twice");
    if (!t->shut && !t->client_closed)
        fatal("a half-close callback while the client still sends");
    if (!agw_req_half_closed(req))
        fatal("agw_req_half_closed() is false in the half-close callback");
    if (t->abort_on_half && !r->aborted) {
        r->aborted = true;
        agw_req_abort(req);
    }
}

static void on_drain(struct agw_req *req, void *arg)
{
    struct rec *r = arg;

    r->t->events++;
    if (r->req != req || r->closed)
        fatal("a drain callback for a closed request");
    if (!r->streaming || r->finished)
        fatal("a drain callback outside a stream");
    r->drains++;
    if (r->mode != M_DRAIN || r->aborted || r->scheduled)
        return;
    if (r->variant & 1)
        step(r); /* from inside the callback, as the relay resumes its upstream there */
    else
        schedule(r, 0);
}

/* Answers: what the client must then get is noted first. */
static void reply(struct rec *r, int status, const char *ctype, const char *body, size_t len)
{
    if (r->status != 0)
        fatal("driver: answered twice");
    r->status = status;
    r->close_req |= r->t->drained; /* a draining server's answers close */
    r->reply = r->finished = true;
    r->has_ctype = ctype != NULL;
    r->clen = status == 204 ? -1 : (long)(body != NULL ? len : 0);
    if (body != NULL && status != 204 && !r->head_method)
        evbuffer_add(r->expect, body, len);
    agw_req_reply(r->req, status, ctype, body, len);
}

static void reply_body(struct rec *r, int status)
{
    char text[160];
    int n = snprintf(text, sizeof(text), "%s %.60s: %zu body bytes, request %zu\n",
                     agw_req_method_name(r->req), agw_req_path(r->req),
                     evbuffer_get_length(agw_req_body(r->req)), r->index);

    reply(r, status, "text/plain", text, (size_t)n);
}

static void reply_error(struct rec *r)
{
    static const int statuses[] = {400, 401, 403, 404, 405, 408, 413, 415,
                                   422, 429, 500, 502, 503, 504, 418, 299};
    int status = statuses[r->variant % 16];
    char msg[160];
    json_t *o;
    char *text;

    if (r->status != 0)
        fatal("driver: answered twice");
    /* What the server makes of the message: the same JSON, or its fallback for non-UTF-8. */
    if (r->variant & 32)
        snprintf(msg, sizeof(msg), "not UTF-8: \xff\xfe %zu", r->index);
    else
        snprintf(msg, sizeof(msg), "no \"such\" thing: %.60s", agw_req_path(r->req));
    o = json_pack("{s:s}", "error", msg);
    text = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
    r->status = status;
    r->close_req |= r->t->drained;
    r->reply = r->finished = r->has_ctype = true;
    r->clen = text != NULL ? (long)strlen(text) : 27;
    if (!r->head_method)
        evbuffer_add(r->expect, text != NULL ? text : "{\"error\":\"invalid request\"}",
                     (size_t)r->clen);
    free(text);
    json_decref(o);
    if (r->variant & 32)
        agw_req_reply_error(r->req, status, "not UTF-8: \xff\xfe %zu", r->index);
    else
        agw_req_reply_error(r->req, status, "no \"such\" thing: %.60s", agw_req_path(r->req));
}

static const char *long_value(void)
{
    static char v[601];

    if (v[0] == '\0') {
        memset(v, 'v', sizeof(v) - 1);
        v[sizeof(v) - 1] = '\0';
    }
    return v;
}

static void add_headers(struct rec *r)
{
    r->headers = true;
    if (r->variant & 4) { /* a head over the server's 512-byte block */
        r->long_header = true;
        agw_req_add_header(r->req, "X-Long", long_value());
    }
    agw_req_add_header(r->req, "X-Fuzz-Long", "3");
    agw_req_add_header(r->req, "X-Fuzz", "1");
    agw_req_add_header(r->req, "X-Other", "v");
    agw_req_add_header(r->req, "x-fuzz", "2"); /* replaces X-Fuzz, keeps X-Fuzz-Long */
}

static void stream_start(struct rec *r, int status, size_t lowat)
{
    if (r->status != 0)
        fatal("driver: answered twice");
    r->status = status;
    r->close_req |= r->t->drained;
    r->streaming = true;
    r->fields = r->t->fields;
    agw_req_stream_start(r->req, status, r->fields ? STREAM_FIELDS : NULL, lowat, on_drain);
}

/* A chunk of <n> bytes (fewer past the input's budget for large ones), noted, then handed over
 * with <fn>. */
static void chunk(struct rec *r, size_t n, bool last)
{
    struct evbuffer *b = evbuffer_new();

    if (n > 1000) {
        if (r->t->big_bytes + n > BIG_BUDGET)
            n = 8;
        else
            r->t->big_bytes += n;
    }
    evbuffer_add(b, pattern + (r->index + r->step) % 26, n);
    evbuffer_add(r->expect, pattern + (r->index + r->step) % 26, n);
    agw_req_prefetch(r->req); /* (hints: they change nothing) */
    agw_req_prefetch_output(r->req);
    if (last) {
        r->finished = true;
        agw_req_stream_finish(r->req, b);
    } else {
        agw_req_stream_write(r->req, b);
    }
    if (evbuffer_get_length(b) != 0)
        fatal("a stream call left bytes in the buffer");
    evbuffer_free(b);
}

static void heartbeat_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rec *r = arg;
    struct evbuffer *b;

    (void)fd;
    (void)what;
    if (r->req == NULL)
        fatal("a heartbeat of a closed request ran");
    /* Only once the client is gone: the server finds that out by writing. */
    if (!r->t->client_closed || r->aborted)
        return;
    b = evbuffer_new();
    evbuffer_add(b, "hb\n", 3);
    evbuffer_add(r->expect, "hb\n", 3);
    agw_req_stream_write(r->req, b);
    evbuffer_free(b);
}

/* The next step of an answer that goes on after the handler returned. */
static void step(struct rec *r)
{
    struct test *t = r->t;

    if (r->req == NULL || r->aborted)
        return;
    switch (r->mode) {
    case M_ZERO:
        r->step++;
        if (r->step < r->steps) {
            chunk(r, t->chunk, false);
            if (r->req != NULL)
                schedule(r, 0);
        } else {
            chunk(r, t->chunk, true);
        }
        break;
    case M_TIMER:
        if (r->step == 0) {
            if (r->variant & 4)
                add_headers(r);
            stream_start(r, 200, 0);
        } else if (r->step < r->steps) {
            chunk(r, t->chunk, false);
        } else {
            chunk(r, r->variant & 1 ? t->chunk : 0, true);
            break;
        }
        r->step++;
        if (r->req != NULL)
            schedule(r, 1);
        break;
    case M_LATER:
        if (r->variant & 2)
            reply_error(r);
        else
            reply_body(r, 200);
        break;
    case M_ABORT:
        r->aborted = true;
        agw_req_abort(r->req);
        break;
    case M_DRAIN:
        r->step++;
        if (r->step >= r->steps) {
            chunk(r, t->chunk, true);
            break;
        }
        chunk(r, t->chunk, false);
        /* (An empty write leaves the response head queued: no drain callback would come.) */
        if (r->req != NULL && (agw_req_out_pending(r->req) <= r->lowat || t->chunk == 0))
            schedule(r, 0); /* else the drain callback goes on */
        break;
    default:
        fatal("driver: a step for a mode without steps");
    }
}

/* The accessors against the reference. */
struct fields_walk {
    const struct ref_req *q;
    size_t k;
};

static void field_cb(const char *name, const char *value, void *arg)
{
    struct fields_walk *w = arg;

    if (name == NULL || value == NULL || w->k >= w->q->n_fields ||
        strcmp(name, w->q->f[w->k].name) != 0 || strcmp(value, w->q->f[w->k].value) != 0)
        fatal("agw_req_foreach_header() differs from the fields the parser split");
    w->k++;
}

static void check_request(struct test *t, struct rec *r, struct agw_req *req,
                          const struct ref_req *q)
{
    static const char *const known[AGW_N_KNOWN_HEADERS] = {
        [AGW_HDR_AUTHORIZATION] = "Authorization",
        [AGW_HDR_CONTENT_TYPE] = "Content-Type",
        [AGW_HDR_TRACEPARENT] = "traceparent",
        [AGW_HDR_ORIGIN] = "Origin",
        [AGW_HDR_AC_REQUEST_METHOD] = "Access-Control-Request-Method",
        [AGW_HDR_AC_REQUEST_HEADERS] = "Access-Control-Request-Headers",
        [AGW_HDR_X_REQUEST_ID] = "X-Request-Id",
    };
    const char *name = agw_req_method_name(req), *path = agw_req_path(req);
    const char *query = agw_req_query(req), *id = agw_req_id(req), *peer = agw_req_peer(req);
    const char *xid = ref_field(q, "X-Request-Id");
    enum agw_method m = agw_req_method(req), want = AGW_METHOD_OTHER;
    struct evbuffer *body = agw_req_body(req);
    struct fields_walk w = {q, 0};

    if (name == NULL || strcmp(name, q->method) != 0)
        fatal("agw_req_method_name() differs from the request line");
    if (strcmp(name, "GET") == 0)
        want = AGW_METHOD_GET;
    else if (strcmp(name, "HEAD") == 0)
        want = AGW_METHOD_HEAD;
    else if (strcmp(name, "POST") == 0)
        want = AGW_METHOD_POST;
    else if (strcmp(name, "OPTIONS") == 0)
        want = AGW_METHOD_OPTIONS;
    if (m != want)
        fatal("agw_req_method() does not match the method's name");
    if (path == NULL || !(path[0] == '/' || strcmp(path, "*") == 0))
        fatal("agw_req_path() is not an absolute path or \"*\"");
    if (strcmp(path, q->path) != 0)
        fatal("agw_req_path() differs from the request target");
    if ((query == NULL) != (q->query == NULL) || (query != NULL && strcmp(query, q->query) != 0))
        fatal("agw_req_query() differs from the request target");
    for (int h = 0; h < AGW_N_KNOWN_HEADERS; h++) {
        const char *v = agw_req_known_header(req, (enum agw_known_header)h);
        const char *e = ref_field(q, known[h]);

        if ((v == NULL) != (e == NULL) || (v != NULL && strcmp(v, e) != 0))
            fatal("agw_req_known_header() differs from the first field of the name");
    }
    if (agw_req_known_header(req, AGW_N_KNOWN_HEADERS) != NULL)
        fatal("agw_req_known_header() of no known header");
    agw_req_foreach_header(req, field_cb, &w);
    if (w.k != q->n_fields)
        fatal("agw_req_foreach_header() missed fields");
    if (body == NULL || evbuffer_get_length(body) != q->body_len ||
        (q->body_len > 0 &&
         memcmp(evbuffer_pullup(body, (ev_ssize_t)q->body_len), q->body, q->body_len) != 0))
        fatal("agw_req_body() differs from the body the parser decoded");
    if (id == NULL || id[0] == '\0' || strlen(id) > 64)
        fatal("agw_req_id() is empty or too long");
    if (xid != NULL && request_id_ok(xid) ? strcmp(id, xid) != 0 : strlen(id) != 32)
        fatal("agw_req_id() is neither the client's valid X-Request-Id nor a generated one");
    snprintf(r->id, sizeof(r->id), "%s", id);
    if (peer == NULL || strncmp(peer, "127.0.0.1:", 10) != 0)
        fatal("agw_req_peer() is not the loopback client");
    if (agw_req_status(req) != 0)
        fatal("a new request has a status");
    if (agw_req_start_ms(req) > agw_now_ms())
        fatal("a request started in the future");
    if (agw_req_half_closed(req) && !t->shut && !t->client_closed)
        fatal("agw_req_half_closed() while the client still sends");
    if (agw_server_active_requests(t->srv) == 0)
        fatal("the handler runs while no request is active");
}

static bool blocking(const struct rec *r)
{
    return !r->finished || r->aborted || r->close_req;
}

static void handler(struct agw_req *req, void *arg)
{
    struct test *t = arg;
    size_t i = t->n_recs;
    const struct ref_req *q;
    struct rec *r;
    const char *path;
    unsigned c;

    t->events++;
    if (i >= t->ref.n)
        fatal("the handler got a request the reference parser does not accept");
    for (size_t j = 0; j < i; j++)
        if (!t->recs[j]->closed && !t->recs[j]->detached)
            fatal("a request went to the handler before the previous one ended");
    if (i > 0 && blocking(t->recs[i - 1]))
        fatal("a request went to the handler after one that ended its connection");
    if (t->drained) /* (from the loop: this connection was idle, or busy and closes after) */
        fatal("a request went to the handler on a connection of a draining server");
    q = &t->ref.r[i];
    if (t->n_recs == t->cap_recs) {
        t->cap_recs = t->cap_recs ? t->cap_recs * 2 : 8;
        t->recs = agw_xrealloc(t->recs, t->cap_recs * sizeof(*t->recs));
    }
    r = agw_xcalloc(1, sizeof(*r));
    t->recs[t->n_recs++] = r;
    r->t = t;
    r->req = req;
    r->index = i;
    r->expect = evbuffer_new();
    r->head_method = q->head_method;
    r->close_req = q->close;
    r->clen = -1;
    check_request(t, r, req, q);
    if (t->drain_at == i + 1 && !t->drain_loop && !t->drained) {
        t->drained = true;
        agw_server_drain(t->srv); /* the connection closes after this answer */
        if (!agw_server_draining(t->srv) || agw_server_active_requests(t->srv) == 0)
            fatal("agw_server_drain() ended the request being handled");
    }
    agw_req_on_close(req, on_close, r);
    agw_req_on_half_close(req, on_half_close);

    path = agw_req_path(req);
    c = (unsigned char)path[0] == '/' ? (unsigned char)path[1] : 0;
    r->mode = c != 0 ? (enum mode)((unsigned char)(c - 'a') % N_MODES) : M_REPLY;
    r->variant = c != 0 ? (unsigned char)path[2] : 0;
    r->steps = 1 + r->variant % 4;
    if (r->head_method && r->mode >= M_STREAM) /* no stream answers a HEAD */
        r->mode = r->variant & 1 ? M_LATER : M_REPLY;

    if (agw_req_out_pending(req) > 64) /* at most a "100 Continue" waits */
        fatal("agw_req_out_pending() before the answer counts more than an interim");
    switch (r->mode) {
    case M_REPLY:
        if (r->variant & 4) { /* the owner goes away first: no callback from now on */
            agw_req_detach(req);
            r->detached = true;
        }
        reply_body(r, r->variant & 1 ? 202 : 200);
        if (r->detached)
            r->req = NULL; /* (freed once the answer is out, unbeknown to us) */
        break;
    case M_EMPTY:
        reply(r, 200, NULL, NULL, 0);
        break;
    case M_204:
        reply(r, 204, "text/plain", "ignored", 7);
        break;
    case M_ERROR:
        reply_error(r);
        break;
    case M_HEADERS:
        add_headers(r);
        reply_body(r, 200);
        break;
    case M_STREAM:
        stream_start(r, r->variant & 4 ? 202 : 200, 0);
        for (r->step = 0; r->step + 1 < r->steps && r->req != NULL; r->step++)
            chunk(r, t->chunk, false);
        if (r->req != NULL)
            chunk(r, r->variant & 8 ? 0 : t->chunk, true);
        break;
    case M_ZERO:
        stream_start(r, 200, 0);
        chunk(r, t->chunk, false);
        if (r->req != NULL)
            schedule(r, 0);
        break;
    case M_TIMER:
        schedule(r, 1);
        break;
    case M_LATER:
        schedule(r, 0);
        break;
    case M_FOREVER: {
        struct timeval tv = {0, 1000};

        stream_start(r, 200, 0);
        chunk(r, t->chunk, false);
        if (r->req != NULL) {
            r->hb = event_new(base, -1, EV_PERSIST, heartbeat_cb, r);
            event_add(r->hb, &tv);
        }
        break;
    }
    case M_ABORT:
        stream_start(r, 200, 0);
        chunk(r, t->chunk, false);
        if (r->req == NULL)
            break;
        if (r->variant & 1) {
            schedule(r, 0);
        } else {
            r->aborted = true;
            agw_req_abort(req);
        }
        break;
    case M_FIELDS:
        add_headers(r);
        stream_start(r, 200, 0);
        chunk(r, r->variant & 1 ? t->chunk : 0, true);
        break;
    case M_DRAIN:
        r->lowat = r->variant & 2 ? t->chunk / 2 : 0;
        stream_start(r, 200, r->lowat);
        chunk(r, t->chunk, false);
        if (r->req != NULL && (agw_req_out_pending(req) <= r->lowat || t->chunk == 0))
            schedule(r, 0);
        break;
    case N_MODES:
        fatal("driver: no such mode");
    }
}

static bool cors_allowed(const char *origin)
{
    if (strncmp(origin, "http", 4) != 0)
        return false;
    for (const char *c = origin; *c != '\0'; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
            return false;
    return true;
}

static void refusal_fields(void *arg, const char *origin, struct evbuffer *out)
{
    struct test *t = arg;

    if (origin == NULL || origin[0] == '\0' || strlen(origin) >= 256)
        fatal("refusal_fields() with an empty or over-long origin");
    t->cors_calls++;
    free(t->cors_origin);
    t->cors_origin = agw_xstrdup(origin);
    if (cors_allowed(origin)) /* (as src/cors.c, only origins it knows: printable ones) */
        evbuffer_add_printf(out, "Access-Control-Allow-Origin: %s\r\nVary: Origin\r\n", origin);
}

/* ---- the responses --------------------------------------------------------------------------- */

/* How many field lines of <head> (status line first, CRLF lines) are named <name>, and the value
 * of the last one. */
static unsigned head_field(const char *head, const char *name, const char **value, size_t *vlen)
{
    size_t nl = strlen(name);
    unsigned n = 0;

    for (const char *line = strstr(head, "\r\n") + 2; line[0] != '\r';) {
        const char *end = strstr(line, "\r\n");

        if ((size_t)(end - line) > nl && line[nl] == ':' && strncasecmp(line, name, nl) == 0) {
            const char *v = line + nl + 1;

            while (*v == ' ')
                v++;
            n++;
            if (value != NULL) {
                *value = v;
                *vlen = (size_t)(end - v);
            }
        }
        line = end + 2;
    }
    return n;
}

static bool field_is(const char *head, const char *name, const char *want)
{
    const char *v = NULL;
    size_t vl = 0;

    return head_field(head, name, &v, &vl) == 1 && vl == strlen(want) && memcmp(v, want, vl) == 0;
}

static void check_handler_head(const struct rec *r, const char *head,
                               const struct agw_http1_response *resp)
{
    if (r->status == 0)
        fatal("a response for a request the handler has not answered");
    if (resp->status != r->status)
        fatal("a response's status differs from the handler's (out of order?)");
    if (!field_is(head, "X-Request-Id", r->id))
        fatal("a response's X-Request-Id is not its request's id (out of order?)");
    if (resp->keep_alive == r->close_req ||
        (head_field(head, "Connection", NULL, NULL) != 0) != r->close_req)
        fatal("Connection: close differs from what the request asked");
    if (r->headers && (!field_is(head, "X-Fuzz", "2") || !field_is(head, "X-Fuzz-Long", "3") ||
                       !field_is(head, "X-Other", "v")))
        fatal("the headers set by agw_req_add_header() are not each there once, last value");
    if (r->long_header != field_is(head, "X-Long", long_value()))
        fatal("a long header set by agw_req_add_header() is missing or cut");
    if (!r->headers && head_field(head, "X-Fuzz", NULL, NULL) != 0)
        fatal("a header of another request's");
    if (r->reply) {
        char len[24];

        snprintf(len, sizeof(len), "%ld", r->clen);
        if (r->clen < 0 ? head_field(head, "Content-Length", NULL, NULL) != 0
                        : !field_is(head, "Content-Length", len))
            fatal("a reply's Content-Length is wrong");
        if ((head_field(head, "Content-Type", NULL, NULL) != 0) != r->has_ctype)
            fatal("a reply's Content-Type is missing or extra");
        if (head_field(head, "Transfer-Encoding", NULL, NULL) != 0)
            fatal("a reply with Transfer-Encoding");
    } else {
        if (resp->body != AGW_HTTP1_BODY_CHUNKED || !field_is(head, "Transfer-Encoding", "chunked"))
            fatal("a stream that is not chunked");
        if (head_field(head, "Content-Length", NULL, NULL) != 0)
            fatal("a stream with a Content-Length");
        if (r->fields && (!field_is(head, "Cache-Control", "no-cache") ||
                          !field_is(head, "X-Accel-Buffering", "no")))
            fatal("a stream's header lines are missing");
    }
}

static void check_refusal_head(struct test *t, const char *head,
                               const struct agw_http1_response *resp)
{
    static const int statuses[] = AGW_SERVER_REFUSAL_STATUSES;
    bool known = false;

    for (size_t k = 0; k < AGW_ARRAY_LEN(statuses); k++)
        known |= statuses[k] == resp->status;
    if (!known)
        fatal("a response beyond the handler's answers that is not a refusal");
    if (t->ref.end != REF_REFUSED || resp->status != t->ref.status)
        fatal("a refusal the reference parser does not predict, or another status");
    if (resp->keep_alive || !field_is(head, "Connection", "close"))
        fatal("a refusal without Connection: close");
    if (resp->content_type == NULL || strcmp(resp->content_type, "application/json") != 0)
        fatal("a refusal that is not JSON");
    if (head_field(head, "X-Request-Id", NULL, NULL) != 1)
        fatal("a refusal without one X-Request-Id");
    if (t->ref.origin != NULL && t->cors_calls != 1)
        fatal("refusal_fields() was not asked about the refused request's Origin");
    if (t->cors_calls > 0) {
        if (t->ref.origin == NULL || strcmp(t->ref.origin, t->cors_origin) != 0)
            fatal("refusal_fields() got another origin than the request's");
        if (cors_allowed(t->cors_origin) &&
            !field_is(head, "Access-Control-Allow-Origin", t->cors_origin))
            fatal("a refusal without the CORS fields it was given");
    }
    t->refusal_seen = true;
    t->refusal_status = resp->status;
}

/* Reads the bytes the server sent as responses, and checks them against the handler's answers. */
static void check_responses(struct test *t)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    const size_t cl = sizeof(cont) - 1;
    struct agw_http1_parser *p = agw_http1_parser_new(1 << 16);
    struct evbuffer *rx = t->rx, *body = evbuffer_new();
    bool last = false;
    size_t i = 0;

    while (evbuffer_get_length(rx) > 0) {
        size_t len = evbuffer_get_length(rx);
        struct agw_http1_response resp;
        struct evbuffer_ptr end;
        const struct rec *r = NULL;
        char *head;
        bool no_body, keep_alive;
        int rc;

        if (last)
            fatal("bytes after a response with Connection: close");
        if (memcmp(evbuffer_pullup(rx, (ev_ssize_t)(len < cl ? len : cl)), cont,
                   len < cl ? len : cl) == 0) {
            if (len < cl)
                break; /* a part of an interim answer */
            evbuffer_drain(rx, cl);
            if (++t->continues > t->ref.n_expect)
                fatal("100 Continue for a request that did not ask for it");
            continue;
        }
        end = evbuffer_search(rx, "\r\n\r\n", 4, NULL);
        if (end.pos < 0)
            break; /* a part of a head */
        head = agw_xmalloc((size_t)end.pos + 5);
        evbuffer_copyout(rx, head, (size_t)end.pos + 4);
        head[end.pos + 4] = '\0';
        if (strncmp(head, "HTTP/1.1 ", 9) != 0)
            fatal("a response that is not HTTP/1.1");
        if (head[9] == '1') /* (the parser would skip it) */
            fatal("an interim response other than 100 Continue");
        rc = agw_http1_parse_head(p, rx, &resp);
        if (rc != 0)
            fatal("the server sent an invalid response head");
        if (resp.status < 200)
            fatal("an interim response other than 100 Continue");
        if (i < t->n_recs) {
            r = t->recs[i];
            check_handler_head(r, head, &resp);
            no_body = r->head_method || resp.status == 204;
        } else {
            check_refusal_head(t, head, &resp);
            no_body = t->ref.refused_head;
        }
        free(head);
        if (no_body || resp.body == AGW_HTTP1_BODY_NONE) {
            rc = 1;
        } else {
            rc = agw_http1_parse_body(p, rx, body);
            if (rc < 0)
                fatal("the server sent an invalid response body");
        }
        if (resp.body == AGW_HTTP1_BODY_CLOSE)
            fatal("a response delimited by the connection's close");
        if (r != NULL) {
            size_t n = evbuffer_get_length(body), e = evbuffer_get_length(r->expect);

            if (n > e || (rc == 1 && n != e) ||
                (n > 0 &&
                 memcmp(evbuffer_pullup(body, -1), evbuffer_pullup(r->expect, -1), n) != 0))
                fatal("a response's body differs from what the handler sent");
        } else if (rc == 1 && !no_body) {
            size_t n = evbuffer_get_length(body);
            const char *b = (const char *)evbuffer_pullup(body, -1);

            if (n < 13 || memcmp(b, "{\"error\":\"", 10) != 0 || memcmp(b + n - 2, "\"}", 2) != 0)
                fatal("a refusal's body is not {\"error\":\"...\"}");
        }
        evbuffer_drain(body, evbuffer_get_length(body));
        keep_alive = resp.keep_alive;
        agw_http1_response_clear(&resp); /* (zeroes it) */
        if (rc == 0)
            break; /* the rest of the body never came */
        agw_http1_parser_reset(p);
        if (r != NULL)
            t->n_complete = ++i;
        else
            t->refusal_complete = true;
        last = !keep_alive;
    }
    if (evbuffer_get_length(rx) > 0 && last)
        fatal("bytes after a response with Connection: close");
    evbuffer_free(body);
    agw_http1_parser_free(p);
}

/* What must have happened when the client read until the exchange was quiet. */
static void check_complete(struct test *t)
{
    size_t s = t->n_recs;

    for (size_t j = 0; j < s; j++) {
        /* A client that said "Connection: close" promised to send nothing more (RFC 9112 §9.6);
         * what it sends anyway after the server closed may reset the connection before it has
         * read the answer (the server closes at once after such a client's answer, as nginx does,
         * unless the bytes came before). */
        if (t->recs[j]->close_req && t->ref.end == REF_CLOSE && t->ref.after_close &&
            j + 1 == t->ref.n)
            continue;
        if (t->recs[j]->finished && !t->recs[j]->aborted && j >= t->n_complete)
            fatal("an answer the handler finished did not reach the client (all of it)");
    }
    if (s < t->ref.n && (s == 0 || !blocking(t->recs[s - 1])))
        fatal("a valid request never reached the handler");
    if (s == t->ref.n && (s == 0 || !blocking(t->recs[s - 1])) && t->ref.end == REF_REFUSED &&
        !t->refusal_complete)
        fatal("the refusal the reference predicts did not reach the client (all of it)");
}

/* ---- the client ------------------------------------------------------------------------------ */

static bool client_read(struct test *t)
{
    static char buf[1 << 16];
    size_t max = t->rcv == 2 ? 512 : sizeof(buf);
    bool got = false;

    if (t->fd < 0 || t->server_eof || (t->rcv == 3 && !t->all_sent && !t->send_failed))
        return false;
    for (;;) {
        ssize_t n = recv(t->fd, buf, max, 0);

        if (n > 0) {
            evbuffer_add(t->rx, buf, (size_t)n);
            t->received += (size_t)n;
            got = true;
            if (t->rcv == 2)
                break;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            t->server_eof = true;
            t->server_reset = n < 0;
            got = true;
        }
        break;
    }
    return got;
}

static void client_close(struct test *t, bool rst)
{
    if (t->fd < 0)
        return;
    if (rst) {
        struct linger l = {1, 0};
        setsockopt(t->fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    }
    close(t->fd);
    t->fd = -1;
    t->client_closed = true;
}

static bool client_send(struct test *t)
{
    size_t n = t->len - t->sent;
    ssize_t w;

    if (t->wseed != 0) {
        t->rng ^= t->rng << 13;
        t->rng ^= t->rng >> 17;
        t->rng ^= t->rng << 5;
        if (n > 1 + t->rng % t->wseed)
            n = 1 + t->rng % t->wseed;
    }
    w = send(t->fd, t->data + t->sent, n, MSG_NOSIGNAL);
    if (w > 0) {
        t->sent += (size_t)w;
        return true;
    }
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        t->send_failed = true; /* the server closed */
    return false;
}

static int client_connect(uint16_t port, bool small)
{
    struct sockaddr_in sa = {0};
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1, rcvbuf = 4096, mss = 536, err = 0;

    /* Before connect(): the window and the segment size are agreed then. The server's send buffer
     * is sized from the segment size (loopback's 64 KiB would make it megabytes). */
    if (small) {
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
        setsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, sizeof(mss));
    }
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(port);
    if (fd < 0)
        fatal("cannot make a socket");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    /* Not blocking: libFuzzer's timeout alarm (SIGALRM, no SA_RESTART) would interrupt a blocking
     * connect() now and then. The listener's backlog takes the connection at once. */
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        socklen_t len = sizeof(err);
        int rc;

        if (errno != EINPROGRESS && errno != EINTR)
            fatal_errno("cannot connect to the server on 127.0.0.1");
        while ((rc = poll(&p, 1, 5000)) < 0 && errno == EINTR)
            ;
        if (rc == 0)
            fatal("connecting to the server on 127.0.0.1 took 5 s");
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
            errno = err;
            fatal_errno("cannot connect to the server on 127.0.0.1");
        }
    }
    return fd;
}

/* ---- the input ------------------------------------------------------------------------------- */

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

static void init(void)
{
    struct timeval tv = {0, 2000};

    signal(SIGPIPE, SIG_IGN);
    agw_log_set_level(AGW_LOG_ERROR);
    base = agw_loop_new();
    if (base == NULL)
        fatal("cannot make an event loop");
    /* Wakes the loop now and then, so that a blocking turn never waits long. */
    tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    event_add(tick, &tv);
    for (size_t i = 0; i < sizeof(pattern); i++)
        pattern[i] = (char)('a' + i % 26);
}

static bool records_open(const struct test *t)
{
    for (size_t i = 0; i < t->n_recs; i++)
        if (!t->recs[i]->closed && !t->recs[i]->detached)
            return true;
    return false;
}

/* The last request's answer is a stream the handler finished and the client has not read its end
 * ("0\r\n\r\n") yet: its bytes are on their way (on a loaded machine, loop turns without
 * progress do not mean the exchange is over: a large stream's last bytes came after them). */
static bool stream_end_in_flight(const struct test *t)
{
    const struct rec *r = t->n_recs > 0 ? t->recs[t->n_recs - 1] : NULL;
    size_t n = evbuffer_get_length(t->rx);
    struct evbuffer_ptr at;
    char tail[5];

    if (r == NULL || !r->streaming || !r->finished || r->aborted)
        return false;
    if (n < sizeof(tail))
        return true;
    evbuffer_ptr_set(t->rx, &at, n - sizeof(tail), EVBUFFER_PTR_SET);
    evbuffer_copyout_from(t->rx, &at, tail, sizeof(tail));
    return memcmp(tail, "0\r\n\r\n", sizeof(tail)) != 0;
}

/* The client sends and reads until the exchange is quiet (or the server closed, or time is up). */
static void phase_send(struct test *t)
{
    uint64_t deadline = agw_now_ms() + PHASE1_MS;
    bool short_timeout = t->opts.request_ms > 0 && t->opts.request_ms < 100;
    unsigned quiet = 0;
    bool bounded = false;

    for (;;) {
        unsigned events = t->events;
        bool progress = false;

        if (!t->all_sent && !t->send_failed) {
            progress = client_send(t);
            if (t->sent == t->len) {
                t->all_sent = true;
                if (t->end == END_HALF) {
                    shutdown(t->fd, SHUT_WR);
                    t->shut = true;
                } else if (t->end == END_CLOSE || t->end == END_RST) {
                    client_read(t);
                    client_close(t, t->end == END_RST);
                    return;
                }
            }
        }
        t->turns++;
        if (t->drain_loop && t->drain_at > 0 && t->turns == 2 * t->drain_at && !t->drained) {
            t->drained = true;
            agw_server_drain(t->srv); /* an idle connection closes now, a busy one after */
        }
        event_base_loop(base, t->pending > 0 || (quiet > 0 && t->wait_server && short_timeout)
                                  ? EVLOOP_ONCE
                                  : EVLOOP_ONCE | EVLOOP_NONBLOCK);
        progress |= client_read(t);
        progress |= t->events != events;
        if (t->server_eof)
            break;
        if (agw_now_ms() > deadline) {
            bounded = true;
            break;
        }
        quiet = progress || t->pending > 0 ? 0 : quiet + 1;
        if (quiet < QUIET_TURNS)
            continue;
        if (stream_end_in_flight(t)) { /* wait for it, within the deadline */
            struct pollfd pfd = {.fd = t->fd, .events = POLLIN};

            poll(&pfd, 1, 1);
            quiet = 0;
            continue;
        }
        /* Quiet. Waiting for the server's own timeout: only while no request is being answered
         * (a request's timer is off then). */
        if (t->wait_server && short_timeout && !records_open(t))
            continue;
        break;
    }
    /* Everything sent, or the server ended the connection (what came is then all there is). */
    t->exact = !bounded && (t->all_sent || t->send_failed || t->server_eof) && !short_timeout &&
               !(t->drained && t->drain_loop) && (t->end == END_KEEP || t->end == END_HALF);
}

/* The client has gone: every request must end. */
static void phase_close(struct test *t)
{
    uint64_t deadline;

    if (!t->client_closed) {
        client_read(t);
        client_close(t, !t->final_fin);
    }
    deadline = agw_now_ms() + PHASE2_MS;
    while (agw_server_active_requests(t->srv) > 0 || records_open(t) || t->pending > 0) {
        if (agw_now_ms() > deadline)
            fatal("requests still alive long after their client closed");
        event_base_loop(base, EVLOOP_ONCE);
    }
}

static void trace(const struct test *t)
{
    static const char *const ends[] = {"incomplete", "refused", "close"};
    struct agw_server_stats st;

    agw_server_get_stats(t->srv, &st);
    fprintf(stderr,
            "ref: %zu requests, then %s %d; handler: %zu, responses complete: %zu, refusal: %d%s, "
            "100s: %u; sent %zu/%zu%s%s, received %zu, server eof %d%s, exact %d, %u turns\n",
            t->ref.n, ends[t->ref.end], t->ref.status, t->n_recs, t->n_complete, t->refusal_status,
            t->refusal_complete ? " (complete)" : "", t->continues, t->sent, t->len,
            t->shut ? ", shut" : "", t->end >= END_CLOSE ? ", closed" : "", t->received,
            t->server_eof, t->server_reset ? " (reset)" : "", t->exact, t->turns);
    for (size_t i = 0; i < t->n_recs; i++) {
        const struct rec *r = t->recs[i];

        fprintf(stderr,
                "  request %zu: mode %c/%u, status %d%s%s%s%s, %zu body bytes, %u drains, %u "
                "half-closes\n",
                i, 'a' + r->mode, r->variant, r->status, r->streaming ? " stream" : "",
                r->finished ? " finished" : "", r->aborted ? " aborted" : "",
                r->close_req ? " close" : "", evbuffer_get_length(r->expect), r->drains,
                r->half_closes);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t heads[] = {4096, 256, 64, 16384}, bodies[] = {4096, 16, 0, 65536};
    static const unsigned fields[] = {32, 4, 1, 2};
    static const uint32_t timeouts[] = {1000, 0, 20, 5};
    static const size_t chunks[] = {8, 1000, MAX_CHUNK, 0};
    static struct test t;
    static uint16_t last_port;
    struct agw_server_stats st;
    uint64_t refused = 0;
    uint16_t port = 0;

    if (size < 4)
        return 0;
    if (base == NULL)
        init();
    memset(&t, 0, sizeof(t));
    t.opts.max_head_bytes = heads[data[0] & 3];
    t.opts.max_body_bytes = bodies[(data[0] >> 2) & 3];
    t.opts.max_header_fields = fields[(data[0] >> 4) & 3];
    t.opts.request_ms = timeouts[data[0] >> 6];
    t.opts.refusal_fields = refusal_fields;
    t.opts.refusal_arg = &t;
    t.end = (enum end_mode)(data[1] & 3);
    t.final_fin = data[1] & 4;
    t.abort_on_half = data[1] & 8;
    t.wait_server = data[1] & 16;
    t.chunk = chunks[(data[1] >> 5) & 3];
    t.fields = data[1] & 128;
    t.wseed = data[2];
    t.rng = 2463534242u ^ ((uint32_t)data[2] * 2654435761u);
    t.rcv = data[3] & 3;
    t.drain_at = (data[3] >> 2) & 7;
    t.drain_loop = data[3] & 32;
    t.data = data + 4;
    t.len = size - 4;
    t.fd = -1;
    t.rx = evbuffer_new();
    current = &t;
    reference(&t);

    t.srv = agw_server_new(base, &t.opts, handler, &t);
    /* The port of the previous input's server, free again (its TIME_WAIT connections do not stop
     * the bind: the listener reuses addresses): a new port for each input would leave thousands
     * of ports held by TIME_WAIT connections. */
    if ((last_port == 0 || agw_server_listen(t.srv, "127.0.0.1", last_port, NULL, &port) < 0) &&
        agw_server_listen(t.srv, "127.0.0.1", 0, NULL, &port) < 0)
        fatal_errno("cannot listen on 127.0.0.1");
    last_port = port;
    t.fd = client_connect(port, t.rcv == 1 || t.rcv == 2);
    phase_send(&t);
    phase_close(&t);

    check_responses(&t);
    if (t.exact)
        check_complete(&t);
    agw_server_get_stats(t.srv, &st);
    for (size_t k = 0; k < AGW_SERVER_N_REFUSALS; k++)
        refused += st.refused[k];
    if (refused > 1 || (t.refusal_seen && refused != 1))
        fatal("the refusal counters disagree with the refusals sent");
    if (refused == 1 && t.ref.end != REF_REFUSED)
        fatal("a request refused that the reference parser accepts");
    if (t.cors_calls > 1)
        fatal("refusal_fields() asked more than once on one connection");
    for (size_t i = 0; i < t.n_recs; i++)
        if (t.recs[i]->closes != (t.recs[i]->detached ? 0u : 1u))
            fatal("a request's close callback did not run (or ran after agw_req_detach())");
    if (agw_server_active_requests(t.srv) != 0)
        fatal("requests alive after every close callback ran");
    if (trace_on())
        trace(&t);

    agw_server_free(t.srv);
    /* Events the frees left behind (deferred callbacks) run now, not during the next input. */
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_loop(base, EVLOOP_NONBLOCK);
    for (size_t i = 0; i < t.n_recs; i++) {
        evbuffer_free(t.recs[i]->expect);
        free(t.recs[i]);
    }
    free(t.recs);
    free(t.cors_origin);
    evbuffer_free(t.rx);
    reference_free(&t.ref);
    current = NULL;
    return 0;
}
