/* The upstream client: one HTTP/1.1 exchange per run over a pooled bufferevent. See
 * include/agw/upstream.h for the contract and doc/internals/upstream.md for the states and timers.
 *
 * States of an exchange, each with its own timer:
 *   CONNECTING (connect_ms) → WAITING (first_byte_ms) → BODY (idle_ms, suspended while paused) →
 * DONE and FAILED from any of them. The exchange is freed only by agw_upstream_close(); when that
 * is called from inside one of the exchange's callbacks the free waits until the callback has
 * returned. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/bufferevent_ssl.h>
#include <event2/util.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "agw/io.h"
#include "agw/limits.h"
#include "agw/log.h"
#include "agw/loop.h"
#include "agw/mem.h"
#include "agw/tls.h"
#include "agw/upstream.h"

const char *agw_up_failure_name(enum agw_up_failure f)
{
    static const char *const names[AGW_UP_N_FAILURES] = {
        [AGW_UP_OK] = "",
        [AGW_UP_CONNECT] = "connect",
        [AGW_UP_CONNECT_TIMEOUT] = "connect_timeout",
        [AGW_UP_FIRST_BYTE_TIMEOUT] = "first_byte_timeout",
        [AGW_UP_IDLE_TIMEOUT] = "idle_timeout",
        [AGW_UP_PROTOCOL] = "protocol",
        [AGW_UP_CLOSED] = "closed",
        [AGW_UP_TLS] = "tls",
        [AGW_UP_STATUS] = "status",
        [AGW_UP_CONTENT_TYPE] = "content_type",
        [AGW_UP_EMPTY_STREAM] = "empty_stream",
    };

    return (unsigned)f < AGW_UP_N_FAILURES ? names[f] : "";
}

/* A connection to one backend. It has exactly one owner at a time: the pool, while it waits idle
 * for the next exchange (owner NULL, in pool->idle), or one exchange. conn_to_pool() and
 * conn_from_pool() hand it over; the callbacks find their owner in <owner>, never by looking at
 * which callback is installed. */
struct up_conn {
    struct agw_upstream_pool *pool;
    struct bufferevent *bev;
    struct event *rd; /* plain TCP, once connected: our read event (see "Reading"); NULL over TLS */
    struct agw_upstream *owner; /* the exchange it serves, or NULL while idle in the pool */
    struct event *idle_timer;   /* while idle: closes it after keepalive_ms (made the first time the
                                   connection goes to the pool) */
    bool idle : 1;              /* in pool->idle (owner NULL) */
    bool unconfirmed : 1;       /* in pool->unconfirmed (owned): see confirm_cb() */
    bool held : 1;              /* its read held back to the end of the turn: see burst() */
    bool closed_seen : 1;       /* a read was reported with the backend's close: never reused */
    bool read_full : 1;         /* its last read filled its buffer: more may wait unreported */
    uint32_t idle_turn; /* while idle: the loop's turn it went to the pool in (wraps; 0: none) */
    TAILQ_ENTRY(up_conn) link; /* in pool->idle while idle, or in pool->unconfirmed */
};

TAILQ_HEAD(idle_list, up_conn);
TAILQ_HEAD(linger_list, agw_upstream);

/* After the caller has what it wanted (the run's terminal event), the rest of a response is read
 * and discarded for at most this long and this much, so that its connection can go back to the
 * pool. */
#define LINGER_MS        1000
#define LINGER_MAX_BYTES (64 * 1024)

/* For this long after a reused connection was found closed, every pooled connection is looked at
 * (one recv(MSG_PEEK)) before it is reused: see idle_unusable(). */
#define PEEK_STALE_MS 10000

struct agw_upstream_pool {
    struct event_base *base;
    struct evdns_base *dns;
    struct agw_url url; /* a copy */
    struct agw_upstream_pool_options opts;
    struct idle_list idle;
    size_t n_idle;
    struct idle_list unconfirmed; /* owned connections whose last read may not have emptied them */
    struct event *confirm_timer;  /* confirm_cb(), while <unconfirmed> is not empty */
    struct linger_list lingering; /* released exchanges finishing their response */
    char *head; /* "POST <target> HTTP/1.1\r\nHost: <authority>\r\n", built at start */
    size_t head_len;
    char *fixed; /* the fixed header lines (opts.fixed_headers), or "" */
    size_t fixed_len;
    uint64_t peek_until_ms; /* idle_unusable() looks at every connection until then (coarse; 0:
                               never set, no clock read on reuse) */
    bool late_connects;     /* a new connection was still connecting when connect() returned */
    /* The host as an address, when it is one (literal_address()); addr_len 0: a name */
    struct sockaddr_storage addr;
    socklen_t addr_len;
};

enum up_state {
    UP_ST_CONNECTING = 0,
    UP_ST_WAITING,
    UP_ST_BODY,
    UP_ST_DONE,
    UP_ST_FAILED,
};

#define PENDING_DETAIL_MAX 159 /* bytes of a deferred failure's text */

static const char *const state_names[] = {"CONNECTING", "WAITING", "BODY", "DONE", "FAILED"};

struct agw_upstream {
    struct agw_upstream_pool *pool;
    struct up_conn *conn; /* owned while the exchange runs; NULL before a connection exists */
    struct event *timer;  /* the current state's timeout */
    struct event *kick;   /* deferred work: reported failure, input left while paused (made when
                             first needed) */
    struct agw_http1_parser *parser;
    struct agw_http1_response resp;
    /* The whole request, kept for one retry on a stale pooled connection until the response head
     * arrives; freed then (a stream that runs for hours does not hold it). */
    struct evbuffer *request;
    struct evbuffer *body; /* decoded body bytes handed to on_body */
    struct agw_upstream_callbacks cbs;
    void *arg;
    enum up_state state;
    enum agw_up_failure pending_kind; /* failure to report from the kick event, or AGW_UP_OK */
    /* Its text (owned), at most PENDING_DETAIL_MAX bytes: allocated when a failure is deferred,
     * rather than carried by every open stream. */
    char *pending_detail;
    uint64_t start_us, connect_us, sent_us, first_byte_us; /* the latency metrics' */
    uint64_t last_read_ms;                                 /* for the lazy idle timer */
    unsigned busy;                                         /* depth of callbacks running */
    bool closing;                                          /* agw_upstream_close() was called */
    bool paused;
    bool reused;            /* the connection came from the pool */
    bool got_bytes;         /* at least one response byte arrived */
    bool lingering;         /* released: reading the rest of the response for the pool's sake */
    uint8_t burst_reads;    /* the response's reads so far, up to BURST_READS (see burst()) */
    uint32_t burst_read_us; /* when the last of them was */
    size_t linger_bytes;
    TAILQ_ENTRY(agw_upstream) linger_link;
};

static void destroy(struct agw_upstream *up);

/* ---- pool ----------------------------------------------------------------------------------- */

static void url_copy(struct agw_url *dst, const struct agw_url *src)
{
    dst->text = agw_xstrdup(src->text);
    dst->tls = src->tls;
    dst->host = agw_xstrdup(src->host);
    dst->port = src->port;
    dst->target = agw_xstrdup(src->target);
    dst->authority = agw_xstrdup(src->authority);
}

/* A host written as an IPv4 or IPv6 address is read once, here: a plain TCP connection to it then
 * skips libevent's resolver path, which for every connection formats the port with snprintf(),
 * reads the address back with sscanf(), allocates the result, and asks the kernel once connected
 * for the peer it connected to (getpeername()). A name, or an address inet_pton() does not take
 * (a zone index, "127.1"), is left to the resolver, per connection, as before. */
static void literal_address(struct agw_upstream_pool *pool)
{
    struct sockaddr_in *v4 = (struct sockaddr_in *)&pool->addr;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&pool->addr;

    if (inet_pton(AF_INET, pool->url.host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(pool->url.port);
        pool->addr_len = sizeof(*v4);
    } else if (inet_pton(AF_INET6, pool->url.host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(pool->url.port);
        pool->addr_len = sizeof(*v6);
    }
}

struct agw_upstream_pool *agw_upstream_pool_new(struct event_base *base, struct evdns_base *dns,
                                                const struct agw_url *url,
                                                const struct agw_upstream_pool_options *opts)
{
    struct agw_upstream_pool *pool = agw_xcalloc(1, sizeof(*pool));

    pool->base = base;
    pool->dns = dns;
    url_copy(&pool->url, url);
    pool->opts = *opts;
    if (opts->tls != NULL)
        SSL_CTX_up_ref(opts->tls);
    TAILQ_INIT(&pool->idle);
    TAILQ_INIT(&pool->unconfirmed);
    TAILQ_INIT(&pool->lingering);
    pool->head_len = strlen(url->target) + strlen(url->authority) + 26;
    pool->head = agw_xmalloc(pool->head_len + 1);
    snprintf(pool->head, pool->head_len + 1, "POST %s HTTP/1.1\r\nHost: %s\r\n", url->target,
             url->authority);
    pool->head_len = strlen(pool->head);
    pool->fixed = agw_xstrdup(opts->fixed_headers != NULL ? opts->fixed_headers : "");
    pool->fixed_len = strlen(pool->fixed);
    pool->opts.fixed_headers = NULL; /* the copy above is the pool's */
    literal_address(pool);
    return pool;
}

static void idle_timer_cb(evutil_socket_t fd, short what, void *arg);

static void unconfirmed_del(struct up_conn *c)
{
    if (c->unconfirmed) {
        TAILQ_REMOVE(&c->pool->unconfirmed, c, link);
        c->unconfirmed = false;
    }
}

/* A read held back (burst()) is forgotten when the connection changes hands, stops reading or
 * goes: it would run for nobody, or for the next owner. */
static void conn_unhold(struct up_conn *c)
{
    if (c->held) {
        agw_loop_unhold(c->rd);
        c->held = false;
    }
}

static struct up_conn *conn_new(struct agw_upstream_pool *pool, struct bufferevent *bev,
                                struct agw_upstream *owner)
{
    struct up_conn *c = agw_xcalloc(1, sizeof(*c));

    c->pool = pool;
    c->bev = bev;
    c->owner = owner;
    return c;
}

/* Closes the connection (the backend sees it close), whoever owns it. */
static void conn_free(struct up_conn *c)
{
    if (c == NULL)
        return;
    if (c->idle) {
        TAILQ_REMOVE(&c->pool->idle, c, link);
        c->pool->n_idle--;
    }
    unconfirmed_del(c);
    conn_unhold(c);
    if (c->idle_timer != NULL)
        event_free(c->idle_timer);
    if (c->rd != NULL)
        event_free(c->rd);
    bufferevent_free(c->bev);
    free(c);
}

void agw_upstream_pool_free(struct agw_upstream_pool *pool)
{
    if (pool == NULL)
        return;
    while (!TAILQ_EMPTY(&pool->lingering))
        agw_upstream_close(TAILQ_FIRST(&pool->lingering));
    while (!TAILQ_EMPTY(&pool->idle))
        conn_free(TAILQ_FIRST(&pool->idle));
    if (pool->confirm_timer != NULL)
        event_free(pool->confirm_timer);
    SSL_CTX_free(pool->opts.tls);
    agw_url_clear(&pool->url);
    free(pool->head);
    free(pool->fixed);
    free(pool);
}

const struct agw_url *agw_upstream_pool_url(const struct agw_upstream_pool *pool)
{
    return &pool->url;
}

size_t agw_upstream_pool_idle(const struct agw_upstream_pool *pool)
{
    return pool->n_idle;
}

/* An idle pooled connection said something (the backend closed it, or sent bytes nobody asked for):
 * either way it cannot carry a new request. */
static void idle_read_cb(struct bufferevent *bev, void *arg)
{
    (void)bev;
    conn_free(arg);
}

static void idle_event_cb(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    (void)what;
    conn_free(arg);
}

static void idle_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    conn_free(arg);
}

static void set_priority(struct up_conn *c, int prio);

/* The exchange is done with <c> (its response complete, the connection reusable): the pool owns it
 * from now on, or it is closed when the pool is full. A plain TCP connection's read event stays
 * added while it waits, so an idle connection that speaks is noticed without one epoll_ctl() for
 * the way in and one for the way out; at AGW_PRIO_IDLE, before any request reported with it. */
static void conn_to_pool(struct up_conn *c)
{
    struct agw_upstream_pool *pool = c->pool;
    struct timeval tv;

    c->owner = NULL;
    unconfirmed_del(c);
    conn_unhold(c);
    if (pool->n_idle >= pool->opts.max_idle_conns) {
        conn_free(c);
        return;
    }
    bufferevent_setcb(c->bev, idle_read_cb, NULL, idle_event_cb, c);
    set_priority(c, AGW_PRIO_IDLE);
    if (c->rd == NULL)
        bufferevent_enable(c->bev, EV_READ);
    else if (!event_pending(c->rd, EV_READ, NULL))
        event_add(c->rd, NULL);
    tv.tv_sec = pool->opts.keepalive_ms / 1000;
    tv.tv_usec = (pool->opts.keepalive_ms % 1000) * 1000;
    if (c->idle_timer == NULL)
        c->idle_timer = evtimer_new(pool->base, idle_timer_cb, c);
    evtimer_add(c->idle_timer, &tv);
    TAILQ_INSERT_HEAD(&pool->idle, c, link);
    c->idle = true;
    c->idle_turn = (uint32_t)agw_loop_turn();
    pool->n_idle++;
}

static void up_read_cb(struct bufferevent *bev, void *arg);
static void up_event_cb(struct bufferevent *bev, short what, void *arg);

/* Whether an idle connection must not carry a new request: the backend sent bytes after its last
 * response (they would be read as the head of the next one: another run's answer, or garbage), or
 * closed it. Bytes read already are in its input; a close reported with the last read kept it
 * out of the pool (destroy()). What came after that read is reported to the connection's read
 * event (edge-triggered: something new) by the loop's next look at the sockets, and that event
 * runs at AGW_PRIO_IDLE, before anything of the same look that could reuse the connection: in a
 * turn after the one the connection went idle in, whatever reached it before the turn's look has
 * been seen, and the connection dropped. What reached it since can only be seen with a system
 * call, recv(MSG_PEEK), made where it is likely to find something: in the turn the connection
 * went idle in (a backend's stray bytes follow its response at once); after a last read that
 * filled its buffer (the rest was not reported again); over TLS (the bufferevent reads); on a
 * thread without agw_loop_run() (tests, tools: no turns to go by); and for PEEK_STALE_MS after a
 * reused connection was found closed (a backend that closes each connection just after its
 * response while saying keep-alive: its close tends to come after the client's next request).
 * Made for every reuse, that look was one system call in six of a short run's under load, and
 * found nothing. A close that comes in the turn of the reuse costs a retry: the request, refused
 * or answered with nothing on a reused connection, is sent again once on a fresh one
 * (up_event_cb()), and the pool looks at every connection from then on. */
static bool idle_unusable(struct agw_upstream_pool *pool, struct up_conn *c)
{
    uint64_t turn = agw_loop_turn(); /* 0 on a thread without agw_loop_run(): idle_turn is too */

    if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
        return true;
    if (c->rd != NULL && !c->read_full && c->idle_turn != 0 && (uint32_t)turn != c->idle_turn &&
        (pool->peek_until_ms == 0 || agw_now_ms_coarse() >= pool->peek_until_ms))
        return false;
    return agw_io_idle_state(bufferevent_getfd(c->bev)) != 0;
}

/* Hands the most recently used idle connection (the likeliest to be still open) to <up>, or NULL,
 * closing those that cannot carry a request (idle_unusable()). */
static struct up_conn *conn_from_pool(struct agw_upstream_pool *pool, struct agw_upstream *up)
{
    struct up_conn *c;

    while ((c = TAILQ_FIRST(&pool->idle)) != NULL && idle_unusable(pool, c)) {
        agw_log_debug("upstream %s: a pooled connection spoke while idle, closed",
                      pool->url.authority);
        conn_free(c);
    }
    if (c == NULL)
        return NULL;
    TAILQ_REMOVE(&pool->idle, c, link);
    c->idle = false;
    pool->n_idle--;
    evtimer_del(c->idle_timer);
    c->owner = up;
    bufferevent_setcb(c->bev, up_read_cb, NULL, up_event_cb, up);
    return c;
}

/* ---- exchange: states and callbacks -----------------------------------------------------------
 */

static void arm_timer(struct agw_upstream *up, uint32_t ms)
{
    struct timeval tv;

    evtimer_del(up->timer);
    if (ms == 0)
        return;
    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    evtimer_add(up->timer, &tv);
}

static void set_state(struct agw_upstream *up, enum up_state st)
{
    agw_log_debug("upstream %s: %s -> %s", up->pool->url.authority, state_names[up->state],
                  state_names[st]);
    up->state = st;
    switch (st) {
    case UP_ST_CONNECTING:
        arm_timer(up, up->pool->opts.connect_ms);
        break;
    case UP_ST_WAITING:
        arm_timer(up, up->pool->opts.first_byte_ms);
        break;
    case UP_ST_BODY:
        up->last_read_ms = agw_now_ms();
        arm_timer(up, up->paused ? 0 : up->pool->opts.idle_ms);
        break;
    case UP_ST_DONE:
    case UP_ST_FAILED:
        arm_timer(up, 0);
        break;
    }
}

/* Callback bracket: returns false when the exchange was closed by the callback (then it is freed
 * here and must not be touched). */
static void call_begin(struct agw_upstream *up)
{
    up->busy++;
}

static bool call_end(struct agw_upstream *up)
{
    up->busy--;
    if (up->closing) {
        if (up->busy == 0)
            destroy(up);
        return false;
    }
    return true;
}

/* Reports the failure. The exchange may be freed before this returns (the callee closed it). */
static void fail(struct agw_upstream *up, enum agw_up_failure kind, const char *detail)
{
    if (up->state == UP_ST_DONE || up->state == UP_ST_FAILED)
        return;
    set_state(up, UP_ST_FAILED);
    if (up->conn != NULL) {
        bufferevent_disable(up->conn->bev, EV_READ | EV_WRITE);
        if (up->conn->rd != NULL)
            event_del(up->conn->rd);
        conn_unhold(up->conn);
    }
    call_begin(up);
    up->cbs.on_error(up->arg, kind, detail);
    call_end(up);
}

static void kick_cb(evutil_socket_t fd, short what, void *arg);

/* Runs kick_cb from the loop. */
static void kick(struct agw_upstream *up)
{
    if (up->kick == NULL)
        up->kick = evtimer_new(up->pool->base, kick_cb, up);
    event_active(up->kick, EV_TIMEOUT, 0);
}

/* Reports a failure from the loop rather than from the current call stack. */
static void fail_later(struct agw_upstream *up, enum agw_up_failure kind, const char *detail)
{
    up->pending_kind = kind;
    free(up->pending_detail);
    up->pending_detail = agw_xstrndup(detail, strnlen(detail, PENDING_DETAIL_MAX));
    kick(up);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_upstream *up = arg;
    char detail[96];

    (void)fd;
    (void)what;
    if (up->lingering) {
        agw_upstream_close(up);
        return;
    }
    switch (up->state) {
    case UP_ST_CONNECTING:
        snprintf(detail, sizeof(detail), "no connection within %u ms", up->pool->opts.connect_ms);
        fail(up, AGW_UP_CONNECT_TIMEOUT, detail);
        break;
    case UP_ST_WAITING:
        snprintf(detail, sizeof(detail), "no response within %u ms", up->pool->opts.first_byte_ms);
        fail(up, AGW_UP_FIRST_BYTE_TIMEOUT, detail);
        break;
    case UP_ST_BODY: {
        /* Lazy idle timer: reads only record their time; the timer sleeps again for what is left.
         */
        uint64_t idle = agw_now_ms() - up->last_read_ms;
        if (idle + 5 < up->pool->opts.idle_ms) {
            arm_timer(up, (uint32_t)(up->pool->opts.idle_ms - idle));
            break;
        }
        snprintf(detail, sizeof(detail), "nothing received for %u ms", up->pool->opts.idle_ms);
        fail(up, AGW_UP_IDLE_TIMEOUT, detail);
        break;
    }
    default:
        break;
    }
}

static bool body_ended(struct agw_upstream *up, int rc);

/* After a body parse that returned <rc>: hands over the decoded bytes in up->body, then reports the
 * end or the failure. Returns false when the exchange is over (DONE, FAILED) or was closed by a
 * callback. */
static bool body_parsed(struct agw_upstream *up, int rc)
{
    if (rc < 0) {
        fail(up, AGW_UP_PROTOCOL, "malformed response body framing");
        return false;
    }
    if (evbuffer_get_length(up->body) > 0) {
        size_t left;

        call_begin(up);
        up->cbs.on_body(up->arg, up->body);
        if (!call_end(up))
            return false;
        /* The bytes may be the read block (body_block()): what the callee left must outlive it. */
        left = evbuffer_get_length(up->body);
        if (left > 0) {
            char *copy = agw_xmalloc(left);

            evbuffer_remove(up->body, copy, left);
            evbuffer_add(up->body, copy, left);
            free(copy);
        }
    }
    return body_ended(up, rc);
}

/* After the body's bytes of a parse that returned <rc> (>= 0) were handed over: the end, if it
 * came. Returns what body_parsed() does. */
static bool body_ended(struct agw_upstream *up, int rc)
{
    if (rc == 1) {
        set_state(up, UP_ST_DONE);
        call_begin(up);
        up->cbs.on_done(up->arg);
        call_end(up);
        return false;
    }
    return up->state == UP_ST_BODY;
}

static bool body_block(struct agw_upstream *up, size_t n);
static bool input_to_block(struct evbuffer *in);

/* Parses what the input holds. Returns false when the exchange is over (DONE, FAILED) or was closed
 * by a callback (then it is gone). */
static bool process_input(struct agw_upstream *up)
{
    struct evbuffer *in = bufferevent_get_input(up->conn->bev);
    int rc;

    if (up->state == UP_ST_WAITING) {
        if (evbuffer_get_length(in) == 0)
            return true;
        if (!up->got_bytes) {
            up->got_bytes = true;
            up->first_byte_us = agw_now_us() - up->sent_us;
        }
        rc = agw_http1_parse_head(up->parser, in, &up->resp);
        if (rc == AGW_AGAIN)
            return true;
        if (rc < 0) {
            /* The callee may close the exchange from on_error: <up> may be gone after this. */
            fail(up, AGW_UP_PROTOCOL,
                 rc == -AGW_ETOOBIG ? "response head too large" : "malformed response head");
            return false;
        }
        set_state(up, UP_ST_BODY);
        /* The backend answered: no retry will send the request again. What the output still
         * references of it stays alive until written (the chains are shared). */
        agw_mem_separate_enter();
        evbuffer_free(up->request);
        agw_mem_separate_leave();
        up->request = NULL;
        /* A head that came with events is a burst's first read (burst()); one that came alone
         * is not: a backend that writes its first event just after its head, and then nothing for
         * a while (an agent waiting for its model), has that event read at once. */
        if (evbuffer_get_length(in) > 0) {
            up->burst_reads = 1;
            up->burst_read_us = (uint32_t)agw_now_us();
        }
        call_begin(up);
        up->cbs.on_head(up->arg, &up->resp);
        if (!call_end(up) || up->state != UP_ST_BODY)
            return false;
    }
    while (up->state == UP_ST_BODY && !up->paused) {
        size_t before = evbuffer_get_length(in);

        if (input_to_block(in))
            return body_block(up, before); /* may free <up> */
        rc = agw_http1_parse_body(up->parser, in, up->body);
        if (!body_parsed(up, rc))
            return false;
        /* Stop when the input is used up, or when the parser needs more bytes than the input holds
         * (a chunk line or the CRLF after chunk data cut by the read): looping again would spin
         * forever. */
        if (evbuffer_get_length(in) == 0 || evbuffer_get_length(in) == before)
            break;
    }
    return true;
}

/* Reading. libevent 2.1's bufferevents read at most 4 KiB per readiness event (EVBUFFER_MAX_READ,
 * whatever bufferevent_set_max_single_read says), each read preceded by an ioctl(FIONREAD) and
 * followed by a deferred callback: at SSE rates that is three system calls and two trips through
 * the loop per 4 KiB, or per event when events are paced. On plain TCP connections the exchange
 * reads for itself once the connection is up: the bufferevent's reading is disabled and an event
 * of ours reads up to READ_MAX bytes (into the bufferevent's input for a response head, into
 * block[] for a streaming body), then parses at once. EOF and
 * errors are reported through the same event callback as the bufferevent's. Writing, connecting
 * and the idle pool stay with the bufferevent; over TLS everything does (the socket holds records
 * for OpenSSL).
 *
 * The read event belongs to the connection (struct up_conn), not to the exchange: it is made when
 * the connection is up, stays added while the connection waits in the pool and serves the next
 * exchange as it is, and goes with the connection. Its argument is the connection, whose <owner>
 * says who it serves now. Only a paused exchange takes it out of the loop. It is edge-triggered
 * (reader_start()). */
#define READ_MAX (64 * 1024)

static void up_event_cb(struct bufferevent *bev, short what, void *arg);

/* While a response body streams and nothing waits in the input, a read goes to this block rather
 * than to the bufferevent's input: the body is decoded in place (agw_http1_decode_body()) and
 * handed over as a reference to the block, so no evbuffer holds the raw bytes, and the chunk
 * framing costs no evbuffer call at all. One block per thread: reads are handled to the end before
 * the next. */
static _Thread_local char block[READ_MAX];
static _Thread_local bool block_lent; /* body_block() is handing it over */

/* The body bytes that came with a response head (a short run's whole response often comes in the
 * head's read) take the block's way too when they fit: one copy into the block instead of an
 * evbuffer call or two per chunk. Returns true when <in>'s bytes are now in block[]. */
static bool input_to_block(struct evbuffer *in)
{
    size_t n = evbuffer_get_length(in);

    if (n == 0 || n > sizeof(block) || block_lent)
        return false;
    evbuffer_remove(in, block, n);
    return true;
}

/* <n> bytes read into block[]. Returns what body_parsed() does: false when <up> is over or gone. */
static bool body_block(struct agw_upstream *up, size_t n)
{
    size_t used = 0, body_len = 0;
    int rc = agw_http1_decode_body(up->parser, block, n, &used, &body_len);
    bool more;

    if (rc == 1 && used < n) {
        /* Bytes after the response: nobody asked for them, so the connection is not reused (the
         * pool only takes connections whose input is empty). */
        evbuffer_add(bufferevent_get_input(up->conn->bev), block + used, n - used);
    }
    block_lent = true;
    if (rc >= 0 && body_len > 0 && up->cbs.on_bytes != NULL && evbuffer_get_length(up->body) == 0) {
        /* The decoded bytes lie at the block's start, in one piece, with nothing before them. */
        call_begin(up);
        up->cbs.on_bytes(up->arg, block, body_len);
        more = call_end(up) && body_ended(up, rc); /* may free <up> */
    } else {
        if (rc >= 0 && body_len > 0)
            evbuffer_add_reference(up->body, block, body_len, NULL, NULL);
        more = body_parsed(up, rc); /* may free <up> */
    }
    block_lent = false;
#ifdef AGW_POISON_BORROWED
    /* The block was lent for the callbacks only (what they left was copied): a pointer that anyone
     * kept into it now reads garbage, and a test sees it. */
    memset(block, 0xdb, n);
#endif
    return more;
}

/* The read event is edge-triggered (reader_start()): epoll reports the socket again only when
 * something new arrives, so what a read may have left behind is ours to look for. After a read of
 * <got> bytes that the exchange took (it goes on), with <what> the callback's events:
 * - a read that filled its buffer may have left bytes: the callback runs again, after the
 *   callbacks now active;
 * - so it does when the report said the backend closed its side (EV_CLOSED, EPOLLRDHUP): the end
 *   waits behind the bytes just read, and the next read meets it;
 * - a shorter read emptied the socket as it was then, unless the report also carried an error: a
 *   reset that came with the last bytes (libevent 2.1 reports EPOLLERR as plain readability, so
 *   the two cannot be told apart). Reading again after every read to find out would cost a
 *   system call and a trip through the loop per read (short runs: +30 % CPU, measured); instead
 *   the connection waits in the pool's <unconfirmed> list, and confirm_cb() reads once more from
 *   those that stayed silent for CONFIRM_MS (one read more per silence, none while the stream
 *   flows).
 * Nothing is done while reading is paused: resuming adds the event, and epoll then looks at the
 * socket afresh. */
#define CONFIRM_MS 100

static void confirm_cb(evutil_socket_t fd, short what, void *arg);

static void confirm_arm(struct agw_upstream_pool *pool)
{
    const struct timeval tv = {.tv_sec = 0, .tv_usec = CONFIRM_MS * 1000};

    evtimer_add(pool->confirm_timer, &tv);
}

static void after_read(struct up_conn *c, ssize_t got, short what)
{
    struct agw_upstream_pool *pool = c->pool;

    if (!event_pending(c->rd, EV_READ, NULL))
        return;
    if (got == READ_MAX || (what & EV_CLOSED)) {
        event_active(c->rd, EV_READ | (what & EV_CLOSED), 1);
        return;
    }
    if (c->unconfirmed)
        return;
    TAILQ_INSERT_TAIL(&pool->unconfirmed, c, link);
    c->unconfirmed = true;
    if (pool->confirm_timer == NULL)
        pool->confirm_timer = evtimer_new(pool->base, confirm_cb, pool);
    if (!evtimer_pending(pool->confirm_timer, NULL))
        confirm_arm(pool);
}

/* Every CONFIRM_MS while connections are unconfirmed: each one that read nothing for CONFIRM_MS
 * reads once more (its callback, made active: it finds EAGAIN, and the connection is confirmed
 * empty, or the bytes, the end or the reset a report hid). The others, still streaming, wait for
 * the next tick. No callback runs from here, so the list cannot change under the walk. */
static void confirm_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_upstream_pool *pool = arg;
    uint64_t now = agw_now_ms_coarse();
    struct up_conn *c, *next;

    (void)fd;
    (void)what;
    for (c = TAILQ_FIRST(&pool->unconfirmed); c != NULL; c = next) {
        next = TAILQ_NEXT(c, link);
        if (now - c->owner->last_read_ms < CONFIRM_MS)
            continue;
        unconfirmed_del(c);
        event_active(c->rd, EV_READ, 1);
    }
    if (!TAILQ_EMPTY(&pool->unconfirmed))
        confirm_arm(pool);
}

/* A response's first reads that come back within the loop's batching window of each other are a
 * burst: a backend writing the events it has one write() each, as the demo agent and agents that
 * answer at once do, microseconds apart. Each would be a wake-up, a read and a write to the client
 * of its own; held back, the next read waits for the loop's nap (agw_loop_hold(): at most the
 * window) and takes the rest of the burst at once. A stream whose events come further apart than
 * the window (an agent streaming tokens) is never held, nor is any read past the response's first
 * BURST_READS (a head's read counts when events came with it), nor two in a row: a long stream's
 * reads, even when two come close together, go at once. Returns true when the read is held (the
 * callback returns; the loop runs it again). */
#define BURST_READS 8

static bool burst(struct up_conn *c, bool released)
{
    struct agw_upstream *up = c->owner;
    uint32_t now = (uint32_t)agw_now_us(), window = agw_loop_window_us();

    /* (microseconds modulo 2^32: a difference wraps every 71 minutes, harmlessly) */
    if (!released && up->burst_reads > 0 && now - up->burst_read_us < window &&
        agw_loop_hold(c->rd, window - (now - up->burst_read_us))) {
        c->held = true;
        return true;
    }
    up->burst_reads++;
    up->burst_read_us = now;
    return false;
}

static void rd_cb(evutil_socket_t fd, short what, void *arg)
{
    struct up_conn *c = arg;
    struct agw_upstream *up = c->owner;
    struct evbuffer *in;
    ssize_t got;
    bool released = c->held; /* a read held back (burst()), whose turn came */

    if (released) {
        /* Run by the loop after its nap (the list is empty then: nothing to walk), or made
         * active by someone else first, in the turn of the hold: then the loop forgets it. */
        agw_loop_unhold(c->rd);
        c->held = false;
    }
    if (up == NULL) {
        /* An idle connection spoke (bytes nobody asked for, or its close): unusable. */
        conn_free(c);
        return;
    }
    if (what & EV_CLOSED) /* the end follows what is read now: no exchange after this one */
        c->closed_seen = true;
    if (up->state == UP_ST_BODY && up->cbs.on_readable != NULL)
        up->cbs.on_readable(up->arg); /* before the input is looked at: one miss less to wait on */
    in = bufferevent_get_input(c->bev);
    if (up->state == UP_ST_BODY && evbuffer_get_length(in) == 0) {
        if (up->burst_reads < BURST_READS && burst(c, released))
            return;
        got = agw_io_read(fd, block, sizeof(block));
        if (got > 0) {
            c->read_full = got == READ_MAX;
            up->last_read_ms = agw_now_ms_coarse(); /* (on every event: the cheap clock) */
            if (body_block(up, (size_t)got))        /* may free <up> */
                after_read(c, got, what);
            agw_loop_slice_check();
            return;
        }
    } else {
        got = agw_io_read_into(in, fd, READ_MAX);
        if (got > 0) {
            c->read_full = got == READ_MAX;
            up->last_read_ms = agw_now_ms_coarse();
            if (process_input(up)) /* may free <up> */
                after_read(c, got, what);
            agw_loop_slice_check();
            return;
        }
    }
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    event_del(c->rd);
    up_event_cb(c->bev, BEV_EVENT_READING | (got == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR), up);
}

/* The connection is up: plain TCP connections read through rd_cb from now on. The read event
 * belongs to the connection and goes with it to the pool and to the next exchange.
 *
 * It is edge-triggered, as nginx's and HAProxy's are: epoll reports the socket once per arrival,
 * where a level-triggered socket, once reported, is polled again by the next epoll_wait() and
 * reported again while bytes wait. That cost showed with many streams: when the loop's slice ends
 * a turn with reads still due, every epoll_wait() after it handed back every socket with bytes
 * waiting (1,300 to 1,800 a turn under 2,000 paced streams, where a turn read a few dozen), each
 * polled by the kernel and activated again by libevent. What a read leaves behind is then
 * after_read()'s to find. The bufferevent never read (connect_fresh()
 * enables its writing alone), so this event is the socket's first reader and its registration
 * carries EPOLLET. libevent's epoll backend takes the flag from the event whose addition or
 * removal changes a socket's registration: a write event of the bufferevent added later (a request
 * the socket did not take at once) makes the socket level-triggered again, which costs only what
 * level-triggering costs; a write event that ends up edge-triggered (this event added or removed
 * while it waits) never holds bytes it could write, since the bufferevent writes all it has at
 * each call (bufferevent_set_max_single_write()). */
static void reader_start(struct agw_upstream *up)
{
    struct up_conn *c = up->conn;

    if (up->pool->url.tls || c->rd != NULL)
        return;
    c->rd = event_new(up->pool->base, bufferevent_getfd(c->bev),
                      EV_READ | EV_CLOSED | EV_PERSIST | EV_ET, rd_cb, c);
    bufferevent_disable(c->bev, EV_READ);
    if (!up->paused && up->state != UP_ST_DONE && up->state != UP_ST_FAILED)
        event_add(c->rd, NULL);
}

/* The priority of the connection's reads (include/agw/common.h: AGW_PRIO_*). On a loop without
 * priorities (tests, tools) libevent refuses the level, and nothing changes. */
static void set_priority(struct up_conn *c, int prio)
{
    if (c->rd != NULL)
        event_priority_set(c->rd, prio);
    else
        bufferevent_priority_set(c->bev, prio);
}

static void reading(struct agw_upstream *up, bool on)
{
    struct up_conn *c = up->conn;

    if (c->rd != NULL) {
        if (on) {
            event_add(c->rd, NULL); /* epoll looks at the socket afresh */
        } else {
            event_del(c->rd);
            unconfirmed_del(c);
            conn_unhold(c); /* adding the event again has epoll look at the socket afresh */
        }
    } else if (on) {
        bufferevent_enable(c->bev, EV_READ);
    } else {
        bufferevent_disable(c->bev, EV_READ);
    }
}

static void up_read_cb(struct bufferevent *bev, void *arg)
{
    struct agw_upstream *up = arg;

    (void)bev;
    up->last_read_ms = agw_now_ms();
    process_input(up); /* may free <up> */
    agw_loop_slice_check();
}

static void kick_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_upstream *up = arg;

    (void)fd;
    (void)what;
    if (up->pending_kind != AGW_UP_OK) {
        enum agw_up_failure kind = up->pending_kind;
        char *detail = up->pending_detail;

        up->pending_kind = AGW_UP_OK;
        up->pending_detail = NULL;
        fail(up, kind, detail);
        free(detail);
        return;
    }
    if (up->state == UP_ST_BODY && !up->paused && up->conn != NULL)
        process_input(up);
}

static int connect_fresh(struct agw_upstream *up);

static void up_event_cb(struct bufferevent *bev, short what, void *arg)
{
    struct agw_upstream *up = arg;
    char detail[160];

    if (what & BEV_EVENT_CONNECTED) {
        up->sent_us = agw_now_us();
        up->connect_us = up->sent_us - up->start_us;
        set_state(up, UP_ST_WAITING);
        reader_start(up);
        return;
    }
    if (up->state == UP_ST_CONNECTING) {
        int dns_err = bufferevent_socket_get_dns_error(bev);
        unsigned long ssl_err = up->pool->url.tls ? bufferevent_get_openssl_error(bev) : 0;
        SSL *ssl = up->pool->url.tls ? bufferevent_openssl_get_ssl(bev) : NULL;
        if (ssl != NULL && (ssl_err != 0 || SSL_get_verify_result(ssl) != X509_V_OK)) {
            char why[128];
            agw_tls_error(ssl, ssl_err, why, sizeof(why));
            snprintf(detail, sizeof(detail), "TLS handshake with %s failed: %s",
                     up->pool->url.authority, why);
            fail(up, AGW_UP_TLS, detail);
            return;
        }
        if (dns_err != 0)
            snprintf(detail, sizeof(detail), "cannot resolve %s: %s", up->pool->url.host,
                     evutil_gai_strerror(dns_err));
        else
            snprintf(detail, sizeof(detail), "cannot connect to %s: %s", up->pool->url.authority,
                     evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
        fail(up, AGW_UP_CONNECT, detail);
        return;
    }
    if (up->state == UP_ST_WAITING && up->reused && !up->got_bytes) {
        /* The backend had closed the pooled connection before our request reached it: the request
         * was not processed, so sending it again on a fresh connection is safe. */
        agw_log_debug("upstream %s: pooled connection was stale, reconnecting",
                      up->pool->url.authority);
        up->pool->peek_until_ms = agw_now_ms_coarse() + PEEK_STALE_MS;
        conn_free(up->conn);
        up->conn = NULL;
        up->reused = false;
        if (connect_fresh(up) != 0)
            fail_later(up, AGW_UP_CONNECT, "cannot create a socket");
        return;
    }
    if (up->state == UP_ST_BODY && (what & BEV_EVENT_EOF)) {
        /* Bytes that arrived with the EOF are still in the input. */
        if (!process_input(up) || up->state != UP_ST_BODY)
            return;
        if (agw_http1_parse_eof(up->parser) == 1) {
            set_state(up, UP_ST_DONE);
            call_begin(up);
            up->cbs.on_done(up->arg);
            call_end(up);
            return;
        }
        fail(up, AGW_UP_CLOSED, "the backend closed the connection before the end of the response");
        return;
    }
    if (what & BEV_EVENT_EOF)
        snprintf(detail, sizeof(detail), "the backend closed the connection %s",
                 up->state == UP_ST_WAITING ? "without answering" : "mid-response");
    else
        snprintf(detail, sizeof(detail), "connection error: %s",
                 evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    fail(up, AGW_UP_CLOSED, detail);
}

/* ---- exchange: life ----------------------------------------------------------------------- */

/* A backend on this host has accepted by the time connect() returns (on loopback the handshake runs
 * within the call): the request can go at once, a turn of the loop before the connection is
 * reported up, whose callback then finds nothing left to write. Tried while it works: a connect
 * still under way when connect() returned (the write would block) turns it off for the pool, so
 * that a backend across a network costs one write() once, and the request waits in the output as
 * before. A connect that failed is told by the write, which takes the error from the socket:
 * reported as the failed connect it is. Returns false, having done nothing, when the request is
 * in too many pieces for one writev(); true when it is dealt with (written, the rest queued;
 * queued whole; or failed). */
static bool write_early(struct agw_upstream *up)
{
    struct agw_upstream_pool *pool = up->pool;
    ssize_t w = agw_io_write_copy(bufferevent_getfd(up->conn->bev), up->request,
                                  bufferevent_get_output(up->conn->bev));
    char detail[160];

    if (w < 0) /* too many pieces for one writev(): nothing done */
        return false;
    if (w > 0 || errno == 0)
        return true;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pool->late_connects = true; /* queued whole, for the bufferevent once connected */
        return true;
    }
    snprintf(detail, sizeof(detail), "cannot connect to %s: %s", pool->url.authority,
             evutil_socket_error_to_string(errno));
    fail_later(up, AGW_UP_CONNECT, detail);
    return true;
}

static int connect_fresh(struct agw_upstream *up)
{
    struct agw_upstream_pool *pool = up->pool;
    struct bufferevent *bev;

    if (pool->url.tls) {
        SSL *ssl = SSL_new(pool->opts.tls);
        if (ssl == NULL || agw_tls_client_prepare(ssl, pool->url.host) != 0) {
            SSL_free(ssl);
            return -AGW_EIO;
        }
        /* The bufferevent owns the SSL from here (freed with it). */
        bev = bufferevent_openssl_socket_new(pool->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                             BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
        if (bev == NULL)
            return -AGW_EIO;
        /* Backends often close without close_notify; a run cut short is caught by the AG-UI rules.
         */
        bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    } else {
        evutil_socket_t fd = -1;

        /* To an address: our socket, so that a failure to make one is told now (libevent's
         * connect reports none when it cannot make its own). */
        if (pool->addr_len > 0 &&
            (fd = socket(pool->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0)
            return -AGW_EIO;
        bev =
            bufferevent_socket_new(pool->base, fd, BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
        if (bev == NULL) {
            if (fd >= 0)
                close(fd);
            return -AGW_EIO;
        }
    }
    up->conn = conn_new(pool, bev, up);
    /* Over TLS the bufferevent reads (plain TCP reads through rd_cb once connected). */
    bufferevent_set_max_single_read(bev, READ_MAX);
    if (!pool->url.tls) /* all it has at each call: see reader_start() */
        bufferevent_set_max_single_write(bev, EV_SSIZE_MAX);
    bufferevent_setcb(bev, up_read_cb, NULL, up_event_cb, up);
    set_state(up, UP_ST_CONNECTING);
    if (!pool->url.tls && pool->addr_len > 0) {
        /* Connected first, then enabled: libevent sets the socket again when it connects (its
         * events taken off and put back), so events enabled before would cost four epoll_ctl()
         * more. A failed connect is reported by the event callback (deferred): nothing is enabled
         * then, so no other callback can come before it. */
        if (bufferevent_socket_connect(bev, (struct sockaddr *)&pool->addr, (int)pool->addr_len) !=
            0) {
            agw_log_debug("upstream %s: connect failed at once", pool->url.authority);
            return 0;
        }
        bufferevent_enable(bev, EV_WRITE); /* reading starts when it is up: reader_start() */
        if (!pool->late_connects && write_early(up))
            return 0;
        /* The request waits in the output buffer until the connection is up. */
        evbuffer_add_buffer_reference(bufferevent_get_output(bev), up->request);
        return 0;
    }
    bufferevent_enable(bev, pool->url.tls ? EV_READ | EV_WRITE : EV_WRITE);
    evbuffer_add_buffer_reference(bufferevent_get_output(bev), up->request);
    if (bufferevent_socket_connect_hostname(bev, pool->dns, AF_UNSPEC, pool->url.host,
                                            pool->url.port) != 0) {
        /* The event callback reports the reason (deferred); nothing more to do here. */
        agw_log_debug("upstream %s: connect failed at once", pool->url.authority);
    }
    return 0;
}

/* A pooled plain TCP connection: the request goes to the socket at once, in one writev() of the
 * request's segments, instead of through the bufferevent's output (whose write event would cost an
 * epoll_ctl() to arm, one to disarm and a trip through the loop). What the socket does not take is
 * queued for the bufferevent; so is everything when the write fails (a stale connection: the
 * bufferevent then finds the error and the exchange retries on a fresh one). <up->request> itself
 * is kept whole for that retry. */
static void write_request_now(struct agw_upstream *up)
{
    struct evbuffer *out = bufferevent_get_output(up->conn->bev);

    if (agw_io_write_copy(bufferevent_getfd(up->conn->bev), up->request, out) < 0)
        evbuffer_add_buffer_reference(out, up->request);
}

/* The request, in one block of <out>: the pool's head, Content-Length, the fixed and the given
 * header fields, the blank line, the body. No printf on the request path. */
static void build_request(const struct agw_upstream_pool *pool,
                          const struct agw_upstream_header *headers, size_t n_headers,
                          const char *body, size_t body_len, struct evbuffer *out)
{
    size_t need = pool->head_len + 16 + 20 + 2 + pool->fixed_len + 2 + body_len,
           nl[AGW_MAX_UPSTREAM_HEADERS], vl[AGW_MAX_UPSTREAM_HEADERS];
    struct evbuffer_iovec v;
    char digits[24], *p;
    size_t k = 0, x = body_len;

    for (size_t i = 0; i < n_headers && i < AGW_MAX_UPSTREAM_HEADERS; i++)
        need += (nl[i] = strlen(headers[i].name)) + (vl[i] = strlen(headers[i].value)) + 4;
    if (evbuffer_reserve_space(out, (ev_ssize_t)need, &v, 1) != 1)
        abort(); /* out of memory: the daemon's policy */
    p = v.iov_base;
#define PUT(s, n)                                                                                  \
    do {                                                                                           \
        memcpy(p, (s), (n));                                                                       \
        p += (n);                                                                                  \
    } while (0)
    PUT(pool->head, pool->head_len);
    PUT("Content-Length: ", 16);
    do {
        digits[k++] = (char)('0' + x % 10);
        x /= 10;
    } while (x > 0);
    while (k > 0)
        *p++ = digits[--k];
    PUT("\r\n", 2);
    PUT(pool->fixed, pool->fixed_len);
    for (size_t i = 0; i < n_headers && i < AGW_MAX_UPSTREAM_HEADERS; i++) {
        PUT(headers[i].name, nl[i]);
        PUT(": ", 2);
        PUT(headers[i].value, vl[i]);
        PUT("\r\n", 2);
    }
    PUT("\r\n", 2);
    PUT(body, body_len);
#undef PUT
    v.iov_len = (size_t)(p - (char *)v.iov_base);
    evbuffer_commit_space(out, &v, 1);
}

struct agw_upstream *agw_upstream_start(struct agw_upstream_pool *pool,
                                        const struct agw_upstream_header *headers, size_t n_headers,
                                        const char *body, size_t body_len,
                                        const struct agw_upstream_callbacks *cbs, void *arg)
{
    struct agw_upstream *up = agw_xcalloc(1, sizeof(*up));

    up->pool = pool;
    up->cbs = *cbs;
    up->arg = arg;
    up->start_us = up->sent_us = agw_now_us();
    up->connect_us = up->first_byte_us = AGW_UP_NOT_MEASURED;
    up->timer = evtimer_new(pool->base, timer_cb, up);
    up->parser = agw_http1_parser_new(pool->opts.max_header_bytes);
    up->body = evbuffer_new();
    /* Freed when the response head arrives, while the stream goes on: on the separate heap
     * (include/agw/mem.h), so that it leaves no hole among the stream's objects. */
    agw_mem_separate_enter();
    up->request = evbuffer_new();
    agw_mem_separate_leave();
    build_request(pool, headers, n_headers, body, body_len, up->request);

    up->conn = conn_from_pool(pool, up);
    if (up->conn != NULL) {
        up->reused = true;
        set_priority(up->conn, AGW_PRIO_NEW); /* it may come from a run whose events flowed */
        set_state(up, UP_ST_WAITING);
        if (up->conn->rd == NULL) { /* TLS: the bufferevent reads and writes */
            bufferevent_enable(up->conn->bev, EV_READ | EV_WRITE);
            evbuffer_add_buffer_reference(bufferevent_get_output(up->conn->bev), up->request);
        } else {
            write_request_now(up);
        }
        return up;
    }
    if (connect_fresh(up) != 0) {
        up->state = UP_ST_CONNECTING;
        fail_later(up, AGW_UP_CONNECT, "cannot create a socket");
    }
    return up;
}

void agw_upstream_set_flowing(struct agw_upstream *up)
{
    if (up->conn != NULL)
        set_priority(up->conn, AGW_PRIO_FLOWING);
}

void agw_upstream_set_callbacks(struct agw_upstream *up, const struct agw_upstream_callbacks *cbs,
                                void *arg)
{
    up->cbs = *cbs;
    up->arg = arg;
}

void agw_upstream_pause(struct agw_upstream *up)
{
    if (up->paused)
        return;
    up->paused = true;
    if (up->conn != NULL && up->state == UP_ST_BODY) {
        reading(up, false);
        arm_timer(up, 0);
    }
}

void agw_upstream_resume(struct agw_upstream *up)
{
    if (!up->paused)
        return;
    up->paused = false;
    if (up->conn != NULL && up->state == UP_ST_BODY) {
        reading(up, true);
        up->last_read_ms = agw_now_ms();
        arm_timer(up, up->pool->opts.idle_ms);
        /* Bytes read before the pause may still wait in the input: handle them from the loop. */
        if (evbuffer_get_length(bufferevent_get_input(up->conn->bev)) > 0)
            kick(up);
    }
}

static void destroy(struct agw_upstream *up)
{
    if (up->lingering)
        TAILQ_REMOVE(&up->pool->lingering, up, linger_link);
    if (up->conn != NULL) {
        bool reusable = up->state == UP_ST_DONE && up->resp.keep_alive && !up->conn->closed_seen &&
                        evbuffer_get_length(bufferevent_get_input(up->conn->bev)) == 0 &&
                        evbuffer_get_length(bufferevent_get_output(up->conn->bev)) == 0;
        if (reusable)
            conn_to_pool(up->conn);
        else
            conn_free(up->conn);
        up->conn = NULL;
    }
    event_free(up->timer);
    if (up->kick != NULL)
        event_free(up->kick);
    agw_http1_parser_free(up->parser);
    agw_http1_response_clear(&up->resp);
    evbuffer_free(up->body);
    if (up->request != NULL) {
        agw_mem_separate_enter();
        evbuffer_free(up->request);
        agw_mem_separate_leave();
    }
    free(up->pending_detail);
    free(up);
}

void agw_upstream_close(struct agw_upstream *up)
{
    if (up == NULL || up->closing)
        return;
    up->closing = true;
    if (up->busy == 0)
        destroy(up);
}

static void linger_head(void *arg, const struct agw_http1_response *resp)
{
    (void)arg;
    (void)resp;
}

static void linger_body(void *arg, struct evbuffer *body)
{
    struct agw_upstream *up = arg;

    up->linger_bytes += evbuffer_get_length(body);
    evbuffer_drain(body, evbuffer_get_length(body));
    if (up->linger_bytes > LINGER_MAX_BYTES)
        agw_upstream_close(up);
}

static void linger_done(void *arg)
{
    agw_upstream_close(arg); /* DONE: the connection goes back to the pool */
}

static void linger_error(void *arg, enum agw_up_failure kind, const char *detail)
{
    (void)kind;
    (void)detail;
    agw_upstream_close(arg);
}

void agw_upstream_release(struct agw_upstream *up)
{
    static const struct agw_upstream_callbacks linger_cbs = {
        .on_head = linger_head,
        .on_body = linger_body,
        .on_done = linger_done,
        .on_error = linger_error,
    };

    if (up == NULL || up->closing)
        return;
    if (up->state != UP_ST_BODY || !up->resp.keep_alive || up->resp.body == AGW_HTTP1_BODY_CLOSE) {
        agw_upstream_close(up);
        return;
    }
    up->cbs = linger_cbs;
    up->arg = up;
    up->lingering = true;
    TAILQ_INSERT_TAIL(&up->pool->lingering, up, linger_link);
    arm_timer(up, LINGER_MS);
    if (up->paused) {
        up->paused = false;
        reading(up, true);
    }
    if (evbuffer_get_length(bufferevent_get_input(up->conn->bev)) > 0)
        kick(up);
}

uint64_t agw_upstream_connect_us(const struct agw_upstream *up)
{
    return up->connect_us;
}

uint64_t agw_upstream_first_byte_us(const struct agw_upstream *up)
{
    return up->first_byte_us;
}
