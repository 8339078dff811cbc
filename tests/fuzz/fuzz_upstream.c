/* libFuzzer driver for src/upstream.c: the upstream response path driven through the REAL exchange,
 * over a loopback socket, with callbacks that do what the relay does (src/relay.c): close the
 * exchange from inside on_head for a non-2xx status and from inside on_error, retry once on a new
 * exchange started from inside the callback, pause and resume, release after the terminal event,
 * close from outside the callbacks. So every use-after-free in the callback/close logic is
 * reachable.
 *
 * One event_base and one listening socket (127.0.0.1:0) live for the whole process; each input gets
 * a fresh pool pointed at http://127.0.0.1:<port>/x. The driver plays the backend itself: it
 * accepts, reads each request whole, answers it with the script (the input after its 3 control
 * bytes) in writes of the chosen size, one per loop iteration (so the exchange reads them one by
 * one), then ends the connection as chosen. Timeouts are small (connect 200 ms, first byte 50 ms,
 * idle 30 ms) and every input must be over within a few seconds (a hang aborts).
 *
 * The input: its first three bytes choose what the backend and the callbacks do, the rest is the
 * script (what the backend answers to each request).
 *   byte 0: the size of the writes (0: the whole script at once);
 *   byte 1: bits 0-2: the end of the answer (0, 4: FIN; 1, 5: RST; 2: close(); 3, 6: FIN once the
 *           client's bytes are read; 7: keep the connection open for the next request),
 *           bits 3-4: on_head (pause, close, release), bits 5-6: on the k-th on_body (pause,
 *           release, close), bit 7: a second exchange on the same pool afterwards;
 *   byte 2: bits 0-3: k (its low bit: release rather than close after on_done/on_error), bit 4:
 *           on_body drains half, bit 5: retry once (on_error before the head unless "protocol",
 *           on_head >= 500), bit 6: max_header_bytes 64 (else 16 KiB), bit 7: close from outside
 *           the callbacks after k loop iterations.
 *
 * Without "drains half" the callbacks take plain bytes too (on_bytes, the relay's way), so both
 * ways of handing the body over run.
 *
 * Checks: nothing is delivered after on_done/on_error or after the callee closed; a head equals
 * what a standalone agw_http1 parser makes of the script; the body bytes delivered are a prefix of
 * what it decodes (all of them when on_done comes); a "protocol" error means the parser refuses
 * the script; "closed" after a complete response and a clean end is wrong (on_done was due).
 *
 *   tests/fuzz/build.sh _build-fuzz upstream     (or by hand, with every library source:)
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -I_build \
 *       tests/fuzz/fuzz_upstream.c $(find src -name '*.c' ! -name main.c) \
 *       $(pkg-config --cflags --libs evhtp libevent_openssl libevent_pthreads openssl jansson)
 *   ./a.out tests/fuzz/corpus/upstream */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
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

#include "agw/http1.h"
#include "agw/log.h"
#include "agw/upstream.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_CONNS     8
#define MAX_EXCHANGES 4
#define DEADLINE_MS   5000 /* an input still running after this is a hang */

enum end_action { END_FIN, END_RST, END_CLOSE, END_FIN_AFTER_READ, END_KEEP };
enum cb_action { ACT_NONE = 0, ACT_PAUSE, ACT_CLOSE, ACT_RELEASE };

static const enum end_action end_actions[8] = {
    END_FIN, END_RST, END_CLOSE,          END_FIN_AFTER_READ,
    END_FIN, END_RST, END_FIN_AFTER_READ, END_KEEP};

/* Process-wide: the loop and the backend's listening socket. */
static struct event_base *base;
static struct event *tick;
static int lfd = -1;
static char url_text[64];

/* What a standalone parser makes of the script: the reference. */
struct reference {
    int head_rc; /* 0, AGW_AGAIN or an error */
    struct agw_http1_response resp;
    int body_rc; /* 1 complete, 0 more needed, < 0 refused (when head_rc is 0) */
    char *body;
    size_t body_len;
};

/* The backend's side of one connection. */
struct conn {
    int fd;
    struct evbuffer *req; /* bytes of requests not yet answered */
    bool answering;       /* writing the script */
    size_t written;       /* of the script */
    bool ended;           /* the end action was done (fd closed or shut) */
    bool got_eof;
};

struct exchange;

/* One input. */
struct test {
    const uint8_t *script;
    size_t script_len;
    size_t chunk;
    enum end_action end;
    enum cb_action head_act, body_act;
    unsigned k;
    bool second, half, retry, small_head, outside_close, release;
    struct agw_upstream_pool *pool;
    struct reference ref;
    struct conn conns[MAX_CONNS];
    size_t n_conns;
    struct exchange *ex[MAX_EXCHANGES];
    size_t n_ex;
    bool retried;
    struct exchange *paused; /* resumed from the loop, as the relay's client_drain does */
    unsigned iterations;
};

/* One exchange, as the relay sees it. Kept until the end of the input, so a callback that comes
 * after the close is caught rather than read freed memory. */
struct exchange {
    struct test *t;
    struct agw_upstream *up; /* NULL once closed or released */
    bool over;               /* on_done or on_error came */
    bool done, got_head, partial;
    enum agw_up_failure error_kind; /* AGW_UP_OK until on_error */
    unsigned bodies;
    char *body; /* the bytes drained in on_body */
    size_t body_len;
};

static void fatal(const char *what)
{
    fprintf(stderr, "fuzz_upstream: %s\n", what);
    abort();
}

static void start_exchange(struct test *t);

/* ---- the callbacks ------------------------------------------------------------------------- */

static void check_alive(const struct exchange *e)
{
    if (e->up == NULL)
        fatal("a callback came after the exchange was closed or released");
    if (e->over)
        fatal("a callback came after on_done or on_error");
}

static void drop(struct exchange *e, bool release)
{
    struct agw_upstream *up = e->up;

    e->up = NULL;
    if (e->t->paused == e)
        e->t->paused = NULL;
    if (release)
        agw_upstream_release(up);
    else
        agw_upstream_close(up);
}

static void act(struct exchange *e, enum cb_action a)
{
    switch (a) {
    case ACT_NONE:
        break;
    case ACT_PAUSE:
        agw_upstream_pause(e->up);
        e->t->paused = e;
        break;
    case ACT_CLOSE:
        drop(e, false);
        break;
    case ACT_RELEASE:
        drop(e, true);
        break;
    }
}

/* The relay's retry(): close this exchange and start the next one from inside the callback. */
static bool retry(struct exchange *e)
{
    struct test *t = e->t;

    if (!t->retry || t->retried || t->n_ex == MAX_EXCHANGES)
        return false;
    t->retried = true;
    drop(e, false);
    start_exchange(t);
    return true;
}

static void on_head(void *arg, const struct agw_http1_response *resp)
{
    struct exchange *e = arg;
    const struct reference *ref = &e->t->ref;

    check_alive(e);
    if (e->got_head)
        fatal("on_head twice");
    e->got_head = true;
    if (ref->head_rc != 0 || resp->status != ref->resp.status ||
        resp->minor_version != ref->resp.minor_version || resp->body != ref->resp.body ||
        resp->content_length != ref->resp.content_length ||
        resp->keep_alive != ref->resp.keep_alive ||
        (resp->content_type == NULL) != (ref->resp.content_type == NULL) ||
        (resp->content_type != NULL && strcmp(resp->content_type, ref->resp.content_type) != 0))
        fatal("the head differs from what the parser makes of the script");
    if (resp->status < 200 || resp->status > 599)
        fatal("on_head with an interim or invalid status");
    if (resp->status >= 500 && retry(e))
        return;
    if (resp->status > 299) {
        drop(e, false); /* the relay's reply_error() */
        return;
    }
    act(e, e->t->head_act);
}

static void on_body(void *arg, struct evbuffer *body)
{
    struct exchange *e = arg;
    const struct reference *ref = &e->t->ref;
    size_t n = evbuffer_get_length(body);

    check_alive(e);
    if (!e->got_head)
        fatal("on_body before on_head");
    if (n == 0)
        fatal("on_body without bytes");
    if (e->t->half && n > 1) {
        n /= 2;
        e->partial = true;
    }
    e->body = agw_xrealloc(e->body, e->body_len + n + 1);
    if (evbuffer_remove(body, e->body + e->body_len, n) != (int)n)
        fatal("evbuffer_remove");
    e->body_len += n;
    if (e->body_len > ref->body_len || memcmp(e->body, ref->body, e->body_len) != 0)
        fatal("the body differs from what the parser decodes from the script");
    if (++e->bodies == e->t->k)
        act(e, e->t->body_act);
}

/* The bytes in one piece (the relay's way, src/relay.c): all of them are taken, as the relay does;
 * they are valid during the call only. Given when the test drains everything (not "half"). */
static void on_bytes(void *arg, const char *p, size_t n)
{
    struct exchange *e = arg;
    const struct reference *ref = &e->t->ref;

    check_alive(e);
    if (!e->got_head)
        fatal("on_bytes before on_head");
    if (n == 0)
        fatal("on_bytes without bytes");
    e->body = agw_xrealloc(e->body, e->body_len + n + 1);
    memcpy(e->body + e->body_len, p, n);
    e->body_len += n;
    if (e->body_len > ref->body_len || memcmp(e->body, ref->body, e->body_len) != 0)
        fatal("the body differs from what the parser decodes from the script");
    if (++e->bodies == e->t->k)
        act(e, e->t->body_act);
}

static void on_done(void *arg)
{
    struct exchange *e = arg;
    const struct reference *ref = &e->t->ref;

    check_alive(e);
    if (!e->got_head)
        fatal("on_done before on_head");
    e->over = e->done = true;
    if (ref->body_rc < 0 || (ref->body_rc == 0 && ref->resp.body != AGW_HTTP1_BODY_CLOSE))
        fatal("on_done for a body the parser does not complete");
    if (!e->partial && e->body_len != ref->body_len)
        fatal("on_done before the whole body was delivered");
    drop(e, e->t->release);
}

static void on_error(void *arg, enum agw_up_failure kind, const char *detail)
{
    struct exchange *e = arg;
    const struct reference *ref = &e->t->ref;

    check_alive(e);
    e->over = true;
    e->error_kind = kind;
    if (kind < AGW_UP_CONNECT || kind > AGW_UP_TLS) /* the exchange's own kinds only */
        fatal("on_error with an unknown kind");
    if (detail == NULL || strlen(detail) >= 160)
        fatal("on_error without a detail, or an over-long one");
    if (kind == AGW_UP_PROTOCOL && !((ref->head_rc < 0 && ref->head_rc != AGW_AGAIN) ||
                                     (ref->head_rc == 0 && ref->body_rc < 0)))
        fatal("a protocol error for a script the parser accepts");
    if (kind == AGW_UP_CLOSED && ref->head_rc == 0 && ref->body_rc == 1 &&
        (e->t->end == END_FIN || e->t->end == END_FIN_AFTER_READ))
        fatal("\"closed\" after a complete response");
    if (!e->got_head && kind != AGW_UP_PROTOCOL && retry(e))
        return;
    drop(e, e->t->release); /* the relay's reply_error() or fail_stream() → finish() */
}

static const struct agw_upstream_callbacks cbs = {
    .on_head = on_head, .on_body = on_body, .on_done = on_done, .on_error = on_error};
static const struct agw_upstream_callbacks cbs_bytes = {.on_head = on_head,
                                                        .on_body = on_body,
                                                        .on_bytes = on_bytes,
                                                        .on_done = on_done,
                                                        .on_error = on_error};

static void start_exchange(struct test *t)
{
    static const struct agw_upstream_header hdrs[] = {{"Accept", "text/event-stream"}};
    struct exchange *e = agw_xcalloc(1, sizeof(*e));

    e->t = t;
    t->ex[t->n_ex++] = e;
    e->up = agw_upstream_start(t->pool, hdrs, 1, "{}", 2, t->half ? &cbs : &cbs_bytes, e);
}

/* ---- the backend ---------------------------------------------------------------------------- */

static void set_nonblock(int fd)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static void conn_close(struct conn *c, bool rst)
{
    if (c->fd < 0)
        return;
    if (rst) {
        struct linger l = {1, 0};
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    }
    close(c->fd);
    c->fd = -1;
}

/* One complete request at the start of c->req (head and Content-Length body)? Drains it. */
static bool take_request(struct conn *c)
{
    struct evbuffer_ptr end = evbuffer_search(c->req, "\r\n\r\n", 4, NULL);
    size_t head, cl = 0;
    char *h, *p;

    if (end.pos < 0)
        return false;
    head = (size_t)end.pos + 4;
    h = (char *)evbuffer_pullup(c->req, (ev_ssize_t)head);
    /* The head ends with a line end: every line has its '\n'. */
    for (p = h; p < h + head; p = (char *)memchr(p, '\n', (size_t)(h + head - p)) + 1)
        if (h + head - p > 15 && strncasecmp(p, "Content-Length:", 15) == 0)
            cl = strtoul(p + 15, NULL, 10);
    if (evbuffer_get_length(c->req) < head + cl)
        return false;
    evbuffer_drain(c->req, head + cl);
    return true;
}

/* Accepts, reads, answers, ends. Returns true while a connection has more to write. */
static bool backend_step(struct test *t)
{
    bool busy = false;
    int fd;

    while ((fd = accept(lfd, NULL, NULL)) >= 0) {
        struct conn *c;
        if (t->n_conns == MAX_CONNS) {
            close(fd);
            continue;
        }
        set_nonblock(fd);
        c = &t->conns[t->n_conns++];
        c->fd = fd;
        c->req = evbuffer_new();
    }
    for (size_t i = 0; i < t->n_conns; i++) {
        struct conn *c = &t->conns[i];
        char buf[4096];
        ssize_t n;

        if (c->fd < 0)
            continue;
        while (!c->got_eof) {
            n = read(c->fd, buf, sizeof(buf));
            if (n > 0) {
                evbuffer_add(c->req, buf, (size_t)n);
                continue;
            }
            if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                c->got_eof = true;
            break;
        }
        if (!c->answering && !c->ended && take_request(c)) {
            c->answering = true;
            c->written = 0;
        }
        if (c->answering && c->written < t->script_len) {
            size_t k = t->script_len - c->written;
            if (t->chunk > 0 && k > t->chunk)
                k = t->chunk;
            n = write(c->fd, t->script + c->written, k);
            if (n > 0)
                c->written += (size_t)n;
            else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                c->written = t->script_len; /* the client is gone */
            busy = true;
        } else if (c->answering) {
            c->answering = false;
            switch (t->end) {
            case END_FIN:
                shutdown(c->fd, SHUT_WR);
                c->ended = true;
                break;
            case END_FIN_AFTER_READ:
                if (c->got_eof || evbuffer_get_length(c->req) == 0) {
                    shutdown(c->fd, SHUT_WR);
                    c->ended = true;
                }
                break;
            case END_RST:
                conn_close(c, true);
                c->ended = true;
                break;
            case END_CLOSE:
                conn_close(c, false);
                c->ended = true;
                break;
            case END_KEEP:
                break; /* the next request on this connection is answered again */
            }
        }
        if (c->got_eof)
            conn_close(c, false);
    }
    return busy;
}

/* ---- the reference ------------------------------------------------------------------------ */

static void reference(struct test *t, size_t max_head)
{
    struct reference *r = &t->ref;
    struct agw_http1_parser *p = agw_http1_parser_new(max_head);
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();

    memset(r, 0, sizeof(*r));
    evbuffer_add(in, t->script, t->script_len);
    r->head_rc = agw_http1_parse_head(p, in, &r->resp);
    if (r->head_rc == 0) {
        r->body_rc = agw_http1_parse_body(p, in, out);
        r->body_len = evbuffer_get_length(out);
        r->body = agw_xmalloc(r->body_len + 1);
        evbuffer_remove(out, r->body, r->body_len);
    }
    evbuffer_free(in);
    evbuffer_free(out);
    agw_http1_parser_free(p);
}

/* ---- the input ----------------------------------------------------------------------------- */

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

static void init(void)
{
    struct sockaddr_in sa = {0};
    socklen_t sl = sizeof(sa);
    struct timeval tv = {0, 10 * 1000};

    signal(SIGPIPE, SIG_IGN);
    agw_log_set_level(AGW_LOG_ERROR);
    base = event_base_new();
    /* Wakes the loop now and then, so that waiting for the exchange never blocks for long. */
    tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    event_add(tick, &tv);
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(lfd, 64) != 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0)
        fatal("cannot listen on 127.0.0.1");
    set_nonblock(lfd);
    snprintf(url_text, sizeof(url_text), "http://127.0.0.1:%u/x", (unsigned)ntohs(sa.sin_port));
}

/* True while an exchange is open (not closed or released by the callee). */
static bool exchanges_open(const struct test *t)
{
    for (size_t i = 0; i < t->n_ex; i++)
        if (t->ex[i]->up != NULL)
            return true;
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct test t = {0};
    struct agw_url url = {0};
    struct agw_upstream_pool_options opts = {0};
    char err[128];
    uint64_t deadline;
    bool started_second = false;
    unsigned settle = 0;

    if (size < 3)
        return 0;
    if (base == NULL)
        init();
    t.chunk = data[0];
    t.end = end_actions[data[1] & 7];
    t.head_act = (enum cb_action)((data[1] >> 3) & 3);
    t.body_act = (enum cb_action)((data[1] >> 5) & 3);
    t.second = data[1] & 0x80;
    t.k = data[2] & 15;
    t.half = data[2] & 0x10;
    t.retry = data[2] & 0x20;
    t.small_head = data[2] & 0x40;
    t.outside_close = data[2] & 0x80;
    t.release = t.k & 1;
    t.script = data + 3;
    t.script_len = size - 3;

    if (agw_url_parse(url_text, &url, err, sizeof(err)) != 0)
        fatal(err);
    opts.connect_ms = 200;
    opts.first_byte_ms = 50;
    opts.idle_ms = 30;
    opts.max_header_bytes = t.small_head ? 64 : 16 * 1024;
    opts.max_idle_conns = 1;
    opts.keepalive_ms = 1000;
    reference(&t, opts.max_header_bytes);
    t.pool = agw_upstream_pool_new(base, NULL, &url, &opts);
    agw_url_clear(&url);

    deadline = agw_now_ms() + DEADLINE_MS;
    start_exchange(&t);
    for (;;) {
        bool busy = backend_step(&t);

        if (agw_now_ms() > deadline)
            fatal("hang: the exchange neither ended nor failed in time");
        if (t.paused != NULL && t.iterations % 3 == 2) {
            struct exchange *e = t.paused;
            t.paused = NULL;
            agw_upstream_resume(e->up);
        }
        if (t.outside_close && t.iterations == t.k && t.ex[t.n_ex - 1]->up != NULL)
            drop(t.ex[t.n_ex - 1], false); /* the relay's client_close() */
        if (!exchanges_open(&t)) {
            if (t.second && !started_second && t.n_ex < MAX_EXCHANGES) {
                started_second = true;
                start_exchange(&t);
                continue;
            }
            /* Let what the backend still sends reach a lingering exchange, then stop. */
            if (!busy && ++settle > 3)
                break;
        }
        t.iterations++;
        /* Wait for the exchange (at most a tick) only when the backend has nothing to do. */
        event_base_loop(base, busy || t.paused != NULL || settle > 0 ? EVLOOP_ONCE | EVLOOP_NONBLOCK
                                                                     : EVLOOP_ONCE);
    }

    if (getenv("AGW_FUZZ_TRACE") != NULL) {
        for (size_t i = 0; i < t.n_ex; i++) {
            const struct exchange *e = t.ex[i];
            fprintf(stderr, "exchange %zu: %s%s, head %d, %u body calls, %zu of %zu body bytes\n",
                    i,
                    e->done                      ? "done"
                    : e->error_kind != AGW_UP_OK ? "error "
                                                 : "closed by the callee",
                    agw_up_failure_name(e->error_kind), e->got_head, e->bodies, e->body_len,
                    t.ref.body_len);
        }
        fprintf(stderr, "%zu connections, %u iterations, pool idle %zu\n", t.n_conns, t.iterations,
                agw_upstream_pool_idle(t.pool));
    }
    agw_upstream_pool_free(t.pool); /* closes lingering exchanges and idle connections */
    for (size_t i = 0; i < t.n_conns; i++) {
        conn_close(&t.conns[i], false);
        evbuffer_free(t.conns[i].req);
    }
    for (int fd; (fd = accept(lfd, NULL, NULL)) >= 0;)
        close(fd);
    /* Events the closes left behind (deferred callbacks) run now, not during the next input. */
    event_base_loop(base, EVLOOP_NONBLOCK);
    for (size_t i = 0; i < t.n_ex; i++) {
        free(t.ex[i]->body);
        free(t.ex[i]);
    }
    agw_http1_response_clear(&t.ref.resp);
    free(t.ref.body);
    return 0;
}
