/* Tests for src/upstream.c's pool: what the backend sends on a pooled connection after its response
 * (stray bytes, a whole response, its close) never reaches the next exchange, whichever turn of the
 * loop that exchange starts in, and a clean connection is reused. The backend is played on the
 * same thread and loop, so what it writes is in the gateway's socket before the loop looks again:
 * each case is an order of events, not a timing. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "agw/common.h"
#include "agw/config.h"
#include "agw/http1.h"
#include "agw/loop.h"
#include "agw/upstream.h"

#define MAX_CONNS 4

/* A stray answer: a whole response, which the next exchange must not take for its own. */
static const char STRAY[] = "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{\"n\":9}";

enum after {
    NEXT_SAME_TURN,  /* the next exchange starts in the turn the first one ended in */
    NEXT_WITH_CLIENT /* ... in the next turn, reported by the look that reports the stray bytes */
};

struct harness {
    struct event_base *base;
    struct agw_upstream_pool *pool;
    /* the backend */
    int lfd;
    struct event *accept_ev;
    int fds[MAX_CONNS];
    struct event *rds[MAX_CONNS];
    unsigned n_conns, n_requests;
    bool close_with_answer; /* shut the connection's writing down with the first answer */
    /* the exchanges */
    struct agw_upstream *up;
    unsigned n_done;
    char body[2][64];
    bool stray; /* the backend sends STRAY once the first exchange is done */
    enum after after;
    struct event *next_ev;   /* starts the second exchange */
    int client[2];           /* NEXT_WITH_CLIENT: a socket pair whose readability starts it */
    size_t idle_after_first; /* the pool's idle connections when the second exchange starts */
    bool no_pool;            /* no connection kept: each exchange on a new one */
    bool backlog_full;       /* the backend's accept queue full (a connection waits in it) */
    bool early[2]; /* each exchange's request was at the backend when its start returned */
    int filler;    /* backlog_full: the connection that fills the queue */
    uint64_t turn_done, turn_next; /* agw_loop_turn() when the first ended, the second asked */
    char error[160];
};

static void backend_read_cb(evutil_socket_t fd, short what, void *arg)
{
    struct harness *h = arg;
    char buf[4096], answer[128];
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    int len;

    (void)what;
    if (n <= 0) {
        for (unsigned i = 0; i < h->n_conns; i++)
            if (h->fds[i] == fd)
                event_del(h->rds[i]);
        return;
    }
    /* Loopback and a 2-byte body: a request arrives in one read. */
    h->n_requests++;
    len = snprintf(answer, sizeof(answer),
                   "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n"
                   "{\"n\":%u}",
                   h->n_requests);
    if (send(fd, answer, (size_t)len, MSG_NOSIGNAL) != len) /* shut down: it cannot answer */
        return;
    if (h->close_with_answer)
        shutdown(fd, SHUT_WR);
}

/* Accepts every connection waiting (the listening socket does not block), and serves each. */
static void backend_accept_cb(evutil_socket_t fd, short what, void *arg)
{
    struct harness *h = arg;
    int c;

    (void)what;
    while ((c = accept(fd, NULL, NULL)) >= 0) {
        cr_assert_lt(h->n_conns, MAX_CONNS);
        evutil_make_socket_nonblocking(c);
        h->fds[h->n_conns] = c;
        h->rds[h->n_conns] = event_new(h->base, c, EV_READ | EV_PERSIST, backend_read_cb, h);
        event_add(h->rds[h->n_conns], NULL);
        h->n_conns++;
    }
}

static void start(struct harness *h);

static void on_head(void *arg, const struct agw_http1_response *resp)
{
    (void)arg;
    cr_assert_eq(resp->status, 200);
}

static void on_body(void *arg, struct evbuffer *body)
{
    struct harness *h = arg;
    char *b = h->body[h->n_done];
    size_t have = strlen(b), n = evbuffer_get_length(body);

    cr_assert_lt(have + n, sizeof(h->body[0]));
    evbuffer_remove(body, b + have, n);
}

static void on_done(void *arg)
{
    struct harness *h = arg;

    agw_upstream_close(h->up); /* the connection goes back to the pool, in this turn */
    h->up = NULL;
    if (h->n_done == 0)
        h->turn_done = agw_loop_turn();
    if (++h->n_done == 2) {
        event_base_loopexit(h->base, NULL);
        return;
    }
    if (h->after == NEXT_WITH_CLIENT) /* reported first, at the next look */
        cr_assert_eq(write(h->client[1], "x", 1), 1);
    if (h->stray) /* on the gateway's socket when send() returns: loopback */
        cr_assert_eq(send(h->fds[h->n_conns - 1], STRAY, sizeof(STRAY) - 1, MSG_NOSIGNAL),
                     (ssize_t)sizeof(STRAY) - 1);
    if (h->after == NEXT_SAME_TURN)
        event_active(h->next_ev, EV_TIMEOUT, 1);
}

static void on_error(void *arg, enum agw_up_failure kind, const char *detail)
{
    struct harness *h = arg;

    snprintf(h->error, sizeof(h->error), "%s: %s", agw_up_failure_name(kind), detail);
    h->up = NULL;
    event_base_loopexit(h->base, NULL);
}

static const struct agw_upstream_callbacks cbs = {
    .on_head = on_head, .on_body = on_body, .on_done = on_done, .on_error = on_error};

/* Whether a request already waits at the backend: the connections it has to accept are accepted
 * (and served from then on), and each new one is looked at. */
static bool request_waiting(struct harness *h)
{
    unsigned from = h->n_conns;
    bool waiting = false;
    char b;

    backend_accept_cb(h->lfd, EV_READ, h);
    for (unsigned i = from; i < h->n_conns; i++)
        waiting |= recv(h->fds[i], &b, 1, MSG_PEEK | MSG_DONTWAIT) == 1;
    return waiting;
}

static void start(struct harness *h)
{
    static const struct agw_upstream_header ct = {"Content-Type", "application/json"};

    h->up = agw_upstream_start(h->pool, &ct, 1, "{}", 2, &cbs, h);
    h->early[h->n_done] = request_waiting(h);
}

static void next_cb(evutil_socket_t fd, short what, void *arg)
{
    struct harness *h = arg;
    char x;

    (void)what;
    if (fd >= 0 && read(fd, &x, 1) != 1)
        return;
    h->idle_after_first = agw_upstream_pool_idle(h->pool);
    h->turn_next = agw_loop_turn();
    start(h);
}

/* Two exchanges in a row on one pool, run by agw_loop_run() as the gateway's loops run. */
static void run_two(struct harness *h)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);
    struct agw_upstream_pool_options opts = {.connect_ms = 2000,
                                             .first_byte_ms = 2000,
                                             .idle_ms = 2000,
                                             .max_header_bytes = 16384,
                                             .max_idle_conns = h->no_pool ? 0 : 4,
                                             .keepalive_ms = 10000};
    struct agw_url url = {0};
    struct timeval limit = {.tv_sec = 5, .tv_usec = 0};
    char text[64], err[128];

    signal(SIGPIPE, SIG_IGN); /* as the daemon does: a write to a closed peer is an error */
    h->base = agw_loop_new();
    cr_assert_not_null(h->base);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    h->lfd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(h->lfd, 0);
    cr_assert_eq(bind(h->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    cr_assert_eq(listen(h->lfd, h->backlog_full ? 0 : 8), 0);
    cr_assert_eq(getsockname(h->lfd, (struct sockaddr *)&sa, &sl), 0);
    if (h->backlog_full) { /* one connection fills a queue of 0: the next SYN is dropped */
        h->filler = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert_eq(connect(h->filler, (struct sockaddr *)&sa, sizeof(sa)), 0);
    }
    evutil_make_socket_nonblocking(h->lfd);
    h->accept_ev = event_new(h->base, h->lfd, EV_READ | EV_PERSIST, backend_accept_cb, h);
    event_add(h->accept_ev, NULL);

    snprintf(text, sizeof(text), "http://127.0.0.1:%u/agent", (unsigned)ntohs(sa.sin_port));
    cr_assert_eq(agw_url_parse(text, &url, err, sizeof(err)), 0, "%s", err);
    h->pool = agw_upstream_pool_new(h->base, NULL, &url, &opts);
    agw_url_clear(&url);
    cr_assert_not_null(h->pool);

    if (h->after == NEXT_WITH_CLIENT) {
        cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, h->client), 0);
        h->next_ev = event_new(h->base, h->client[0], EV_READ | EV_PERSIST, next_cb, h);
        event_add(h->next_ev, NULL);
    } else {
        h->next_ev = event_new(h->base, -1, 0, next_cb, h);
    }
    event_priority_set(h->next_ev, AGW_PRIO_NEW); /* a client's request: new work */

    start(h);
    event_base_loopexit(h->base, &limit); /* a hang ends the test, which then fails */
    agw_loop_run(h->base, 100, NULL);

    if (h->up != NULL)
        agw_upstream_close(h->up);
    agw_upstream_pool_free(h->pool);
    event_free(h->next_ev);
    if (h->after == NEXT_WITH_CLIENT) {
        close(h->client[0]);
        close(h->client[1]);
    }
    for (unsigned i = 0; i < h->n_conns; i++) {
        event_free(h->rds[i]);
        close(h->fds[i]);
    }
    event_free(h->accept_ev);
    close(h->lfd);
    if (h->backlog_full)
        close(h->filler);
    event_base_free(h->base);
    cr_assert_eq(h->error[0], '\0', "an exchange failed: %s", h->error);
    cr_assert_eq(h->n_done, 2, "both exchanges ended");
}

Test(upstream, a_clean_pooled_connection_is_reused)
{
    struct harness h = {.after = NEXT_SAME_TURN};

    run_two(&h);
    cr_assert_str_eq(h.body[0], "{\"n\":1}");
    cr_assert_str_eq(h.body[1], "{\"n\":2}");
    cr_assert_eq(h.idle_after_first, 1, "the first connection went to the pool");
    cr_assert_eq(h.n_conns, 1, "and carried the second exchange");
}

/* A stray answer after the first exchange: the second gets its own, on a new connection; <idle> is
 * what the pool held when it asked (<why>). */
static void stray_case(enum after after, size_t idle, const char *why)
{
    struct harness h = {.after = after, .stray = true};

    run_two(&h);
    /* A turn can end early (its callbacks past AGW_LOOP_SLICE_US: a slow or loaded machine, a
     * sanitized build): the second exchange then asks in the next turn, whose look reported the
     * stray bytes, and the idle connection's read has dropped it first. */
    if (after == NEXT_SAME_TURN && h.turn_next != h.turn_done)
        idle = 0;
    cr_assert_eq(h.idle_after_first, idle, "%s", why);
    cr_assert_str_eq(h.body[1], "{\"n\":2}",
                     "the second exchange got its own answer, not the stray one");
    cr_assert_eq(h.n_conns, 2, "on a new connection");
}

Test(upstream, stray_bytes_in_the_turn_the_connection_went_idle_keep_it_from_reuse)
{
    /* Nothing has reported the stray answer when the second exchange asks the pool, in the same
     * turn: only a look at the socket finds it. */
    stray_case(NEXT_SAME_TURN, 1, "still in the pool when the second exchange asked");
}

Test(upstream, stray_bytes_reported_with_a_new_request_are_handled_before_it)
{
    /* The next turn's look reports the client's request first and the stray answer after it: the
     * idle connection's read runs first all the same (AGW_PRIO_IDLE) and drops it, so the request
     * finds the pool empty. */
    stray_case(NEXT_WITH_CLIENT, 0, "dropped by its read event before the request ran");
}

Test(upstream, a_clean_connection_is_reused_in_a_later_turn)
{
    struct harness h = {.after = NEXT_WITH_CLIENT};

    run_two(&h);
    cr_assert_str_eq(h.body[1], "{\"n\":2}");
    cr_assert_eq(h.n_conns, 1, "the pooled connection carried the second exchange");
}

Test(upstream, a_close_read_with_the_answer_keeps_the_connection_out_of_the_pool)
{
    /* The backend shuts its side down with its answer, reported in the same look: the connection
     * is never pooled (a connection pooled then would have its close reported to no one: the
     * edge-triggered read event took it already). */
    struct harness h = {.after = NEXT_WITH_CLIENT, .close_with_answer = true};

    run_two(&h);
    cr_assert_str_eq(h.body[0], "{\"n\":1}");
    cr_assert_eq(h.idle_after_first, 0, "not pooled");
    cr_assert_str_eq(h.body[1], "{\"n\":2}");
    cr_assert_eq(h.n_conns, 2, "a new connection for the second exchange");
}

Test(upstream, a_request_to_a_backend_on_this_host_leaves_with_the_connect)
{
    /* On loopback the handshake is over when connect() returns: the request is written at once,
     * not a turn of the loop later. */
    struct harness h = {.after = NEXT_WITH_CLIENT, .no_pool = true};

    run_two(&h);
    cr_assert_eq(h.n_conns, 2, "two new connections");
    cr_assert(h.early[0] && h.early[1], "each request was at the backend when its start returned");
    cr_assert_str_eq(h.body[1], "{\"n\":2}");
}

Test(upstream, a_connect_still_under_way_queues_the_request_and_the_pool_stops_writing_early,
     .timeout = 10)
{
    /* The backend's accept queue is full: the first connect's SYN is dropped and sent again a
     * second later, so the connection is not up when connect() returns and the early write would
     * block. The request waits in the output and goes when the connection is up; the pool stops
     * trying, so the second connection, up at once, still gets its request only once reported up.
     */
    struct harness h = {.after = NEXT_WITH_CLIENT, .no_pool = true, .backlog_full = true};

    run_two(&h);
    cr_assert_eq(h.n_conns, 3, "the filler and two new connections");
    cr_assert(!h.early[0], "the first request could not leave with the connect");
    cr_assert(!h.early[1], "the pool no longer writes early");
    cr_assert_str_eq(h.body[0], "{\"n\":1}");
    cr_assert_str_eq(h.body[1], "{\"n\":2}");
}

static void refused_error(void *arg, enum agw_up_failure kind, const char *detail)
{
    struct harness *h = arg;

    snprintf(h->error, sizeof(h->error), "%s: %s", agw_up_failure_name(kind), detail);
    event_base_loopexit(h->base, NULL);
}

Test(upstream, a_refused_connect_is_told_as_a_failed_connect)
{
    /* The early write meets the refusal (it takes the socket's error): still a failed connect. */
    static const struct agw_upstream_header ct = {"Content-Type", "application/json"};
    const struct agw_upstream_callbacks refused_cbs = {
        .on_head = on_head, .on_body = on_body, .on_done = on_done, .on_error = refused_error};
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);
    struct agw_upstream_pool_options opts = {.connect_ms = 2000,
                                             .first_byte_ms = 2000,
                                             .max_header_bytes = 16384,
                                             .keepalive_ms = 10000};
    struct harness h = {0};
    struct agw_url url = {0};
    struct timeval limit = {.tv_sec = 5, .tv_usec = 0};
    char text[64], err[128], expect[96];
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct agw_upstream *up;

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0); /* a port nobody listens on */
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(text, sizeof(text), "http://127.0.0.1:%u/agent", (unsigned)ntohs(sa.sin_port));
    cr_assert_eq(agw_url_parse(text, &url, err, sizeof(err)), 0, "%s", err);
    h.base = agw_loop_new();
    h.pool = agw_upstream_pool_new(h.base, NULL, &url, &opts);
    agw_url_clear(&url);
    up = agw_upstream_start(h.pool, &ct, 1, "{}", 2, &refused_cbs, &h);
    event_base_loopexit(h.base, &limit);
    agw_loop_run(h.base, 100, NULL);
    agw_upstream_close(up);
    agw_upstream_pool_free(h.pool);
    event_base_free(h.base);
    close(fd);
    snprintf(expect, sizeof(expect), "connect: cannot connect to 127.0.0.1:%u: Connection refused",
             (unsigned)ntohs(sa.sin_port));
    cr_assert_str_eq(h.error, expect);
}
