/* agw-load: the benchmark's load generator (doc/benchmarks.md).
 *
 * One libevent loop, non-blocking, C connections. Each connection runs AG-UI runs one after the
 * other over HTTP/1.1 keep-alive (POST, then read the SSE response to its end) until --runs runs
 * have been started in total, or until --seconds have passed (runs under way then finish); with
 * --new-conn each run has a connection of its own (Connection: close, then a new connect); with
 * --hold every connection runs one stream and keeps it open (the memory scenario). The response
 * reader is written here rather than taken from src/: it is a measuring instrument, it must cost
 * the same whatever it measures, and it must not change when the gateway's own parsers do. It
 * understands status line + headers, Content-Length, chunked and close-delimited bodies, and SSE
 * frames (LF or CRLF line ends); it reads only what it measures: one event per dispatched frame
 * with a data line, "sentUs":<µs> inside the data for the per-event latency, and "RUN_ERROR" for
 * in-band failures (and, with --resend, the TEXT_MESSAGE_START and _CONTENT events it rebuilds each
 * answer from, as a client does to send it back with the next run).
 *
 * What it measures: runs completed/failed, events, body bytes, events/s and runs/s over the wall
 * time from the first connect to the last run's end, time to first event (request written → first
 * frame of the response) and per-event latency (arrival − the "sentUs" CLOCK_REALTIME stamp the
 * demo agent puts in each TEXT_MESSAGE_CONTENT with ts=1). Percentiles come from a fixed log-linear
 * histogram (1 µs resolution below 128 µs, 1/64 of an octave above: under 1.6 % error), so memory
 * is bounded whatever the run length. The result is one JSON object on stdout; progress ("ready" in
 * --hold mode) and errors go to stderr.
 *
 * Lifetime: a struct conn is owned by the bench's array from its start to the end of the program;
 * its bufferevent is freed (and the connection closed) only at the top of a callback, never from a
 * helper that a callback called and that returns into libevent code using it. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>
#include <jansson.h>

#include "agw/common.h"

#define HEAD_MAX (16 * 1024) /* response status line + headers */
#define LINE_MAX_BYTES                                                                             \
    (64 * 1024)              /* one SSE line kept (longer lines are counted, their tail dropped) */
#define MAX_HEADERS      32  /* --header options */
#define DEFAULT_INFLIGHT 128 /* connections in connect/request phase at once (listen backlogs) */

static const char default_body[] =
    "{\"threadId\":\"bench-thread\",\"runId\":\"bench-run\",\"state\":{},"
    "\"messages\":[{\"id\":\"m1\",\"role\":\"user\",\"content\":\"Hello\"}],"
    "\"tools\":[],\"context\":[],\"forwardedProps\":{}}";

/* ---- histogram
 * ------------------------------------------------------------------------------------------ */
#define HIST_LINEAR 128 /* values below are exact */
#define HIST_SUB    64  /* sub-buckets per octave above */
#define HIST_OCT    40  /* octaves 7..46: up to ~2^47 µs */
#define HIST_N      (HIST_LINEAR + HIST_OCT * HIST_SUB)

struct hist {
    uint64_t count;
    uint64_t max;
    uint64_t b[HIST_N];
};

static unsigned hist_index(uint64_t v)
{
    unsigned e, i;

    if (v < HIST_LINEAR)
        return (unsigned)v;
    e = 63u - (unsigned)__builtin_clzll(v); /* >= 7 */
    i = HIST_LINEAR + (e - 7u) * HIST_SUB + (unsigned)((v >> (e - 6u)) & (HIST_SUB - 1));
    return i < HIST_N ? i : HIST_N - 1;
}

/* The middle of bucket <i>. */
static uint64_t hist_value(unsigned i)
{
    unsigned e, sub;
    uint64_t lo;

    if (i < HIST_LINEAR)
        return i;
    e = (i - HIST_LINEAR) / HIST_SUB + 7u;
    sub = (i - HIST_LINEAR) % HIST_SUB;
    lo = (uint64_t)(HIST_SUB + sub) << (e - 6u);
    return lo + ((uint64_t)1 << (e - 6u)) / 2;
}

static void hist_add(struct hist *h, uint64_t v)
{
    h->b[hist_index(v)]++;
    h->count++;
    if (v > h->max)
        h->max = v;
}

/* The value at quantile <q> (0..1); 0 when empty. */
static uint64_t hist_quantile(const struct hist *h, double q)
{
    uint64_t rank, seen = 0;

    if (h->count == 0)
        return 0;
    rank = (uint64_t)(q * (double)h->count);
    if (rank >= h->count)
        rank = h->count - 1;
    for (unsigned i = 0; i < HIST_N; i++) {
        seen += h->b[i];
        if (seen > rank) {
            uint64_t v = hist_value(i);
            return v > h->max ? h->max : v;
        }
    }
    return h->max;
}

/* ---- state
 * ---------------------------------------------------------------------------------------------- */
enum conn_state {
    CONN_ST_IDLE = 0,   /* not started, or between connections */
    CONN_ST_CONNECTING, /* connect() under way */
    CONN_ST_HEAD,       /* request written, reading the response head */
    CONN_ST_BODY,       /* reading the body */
    CONN_ST_DONE,       /* no more runs for this connection */
};

enum body_kind { BODY_LENGTH, BODY_CHUNKED, BODY_CLOSE };
enum chunk_state { CHUNK_SIZE, CHUNK_DATA, CHUNK_DATA_END, CHUNK_TRAILER };

struct bench;

struct conn {
    struct bench *b;
    unsigned id;
    enum conn_state state;
    struct bufferevent *bev; /* NULL between connections */
    bool inflight;           /* counted in bench.inflight (connect or head phase) */
    bool keep_alive;         /* the current response allows reuse */
    bool got_event;          /* the current run has seen its first event */
    bool run_error;          /* the current run carried RUN_ERROR */
    enum body_kind body;
    enum chunk_state chunk;
    uint64_t remaining;    /* body bytes (LENGTH) or chunk bytes (CHUNKED) still to come */
    uint64_t run_start_us; /* monotonic, when the request was written */
    size_t head_bytes;
    /* SSE */
    char *line;      /* LINE_MAX_BYTES */
    size_t line_len; /* bytes kept of the current line */
    bool frame_data; /* the current frame had a data line */
    bool held;       /* --hold: counted in bench.held */
    uint64_t runs;   /* runs this connection slot has sent (its thread is runs / runs_per_thread) */
    /* --resend: the conversation so far (sent whole with each run), and the answer being read */
    json_t *conv;
    char *answer_id;
    json_t *answer; /* the answer's text, as a JSON string */
};

struct bench {
    struct event_base *base;
    struct sockaddr_in addr;
    char *host_hdr;
    char *path;
    char *request_head; /* everything but the Content-Length value and the body */
    json_t *body_tmpl;
    unsigned concurrency;
    uint64_t runs_total;
    uint64_t runs_started, runs_ok, runs_failed, runs_error_events;
    uint64_t events, bytes, connects, connect_failures;
    unsigned inflight, max_inflight;
    unsigned active; /* connections not yet DONE */
    bool hold;
    bool new_conn;            /* one connection per run (Connection: close) */
    bool resend;              /* each run sends the thread's whole conversation, as a client does */
    uint64_t runs_per_thread; /* a connection slot starts a new thread after this many runs; 0:
                                 one thread per slot for the whole load */
    double seconds;           /* start runs for this long (0 = until --runs are started) */
    bool draining;            /* --seconds passed: no new run, the ones under way finish */
    unsigned held;
    bool ready_printed;
    double hold_seconds;
    double duration;
    bool timed_out, interrupted, stopping;
    uint64_t t_start_us, t_end_us, t_ready_us;
    uint64_t now_us;  /* monotonic, refreshed once per callback */
    uint64_t wall_us; /* CLOCK_REALTIME, refreshed once per callback */
    struct hist ttfe, lat;
    uint64_t status_errors[6]; /* by status class 0 (none), 1xx..5xx */
    struct conn *conns;
    struct event *deadline, *hold_timer, *drain_timer, *sig_term, *sig_int;
    const char *label;
    const char *id_prefix; /* threadId, runId and user message ids begin with it */
};

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t real_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void tick(struct bench *b)
{
    b->now_us = mono_us();
    b->wall_us = real_us();
}

static void conn_start(struct conn *c);
static void bench_maybe_finish(struct bench *b);
static void on_deadline(evutil_socket_t fd, short what, void *arg);

static void inflight_clear(struct conn *c)
{
    if (c->inflight) {
        c->inflight = false;
        c->b->inflight--;
    }
}

/* Closes the connection (the bufferevent is freed: callers are at the top of a callback). */
static void conn_close(struct conn *c)
{
    inflight_clear(c);
    if (c->bev) {
        bufferevent_free(c->bev);
        c->bev = NULL;
    }
    c->state = CONN_ST_IDLE;
}

/* Starts idle connections while the in-flight budget allows it. */
static void start_more(struct bench *b)
{
    if (b->stopping)
        return;
    for (unsigned i = 0; i < b->concurrency && b->inflight < b->max_inflight; i++) {
        struct conn *c = &b->conns[i];
        if (c->state == CONN_ST_IDLE && !c->bev)
            conn_start(c);
    }
}

/* The connection has no more runs to do. */
static void conn_done(struct conn *c)
{
    conn_close(c);
    c->state = CONN_ST_DONE;
    c->b->active--;
}

/* No run is to start any more: stopping, draining (--seconds) or the --runs budget spent. */
static bool no_more_runs(const struct bench *b)
{
    return b->stopping || b->draining || (!b->hold && b->runs_started >= b->runs_total);
}

/* Takes a run from the budget; false when none is left. */
static bool take_run(struct bench *b)
{
    if (no_more_runs(b))
        return false;
    b->runs_started++;
    return true;
}

/* --resend: as @ag-ui/client does, each run sends the thread's whole conversation: the messages
 * of the runs before (each user message, then the answer rebuilt from the run's TEXT_MESSAGE_*
 * events), then a new user message with an id of its own. A new thread starts an empty one. */
static void resend_next(struct conn *c)
{
    struct bench *b = c->b;
    char id[64];
    json_t *m;

    if (c->conv == NULL || (b->runs_per_thread > 0 && c->runs % b->runs_per_thread == 0)) {
        json_decref(c->conv);
        c->conv = json_array();
    }
    snprintf(id, sizeof(id), "%s-user-%u-%" PRIu64, b->id_prefix, c->id, c->runs);
    m = json_object();
    json_object_set_new(m, "id", json_string(id));
    json_object_set_new(m, "role", json_string("user"));
    json_object_set_new(m, "content", json_string("Hello"));
    json_array_append_new(c->conv, m);
    json_object_set(b->body_tmpl, "messages", c->conv);
}

/* --resend: reads a TEXT_MESSAGE_START or _CONTENT event's data into the answer. */
static void resend_event(struct conn *c, const char *data, size_t len)
{
    json_t *ev;
    const char *type;

    if (!memmem(data, len, "\"TEXT_MESSAGE_START\"", 20) &&
        !memmem(data, len, "\"TEXT_MESSAGE_CONTENT\"", 22))
        return;
    ev = json_loadb(data, len, 0, NULL);
    type = json_string_value(json_object_get(ev, "type"));
    if (type != NULL && strcmp(type, "TEXT_MESSAGE_START") == 0 &&
        json_is_string(json_object_get(ev, "messageId"))) {
        free(c->answer_id);
        c->answer_id = agw_xstrdup(json_string_value(json_object_get(ev, "messageId")));
        json_decref(c->answer);
        c->answer = json_string("");
    } else if (type != NULL && strcmp(type, "TEXT_MESSAGE_CONTENT") == 0 && c->answer != NULL) {
        const json_t *d = json_object_get(ev, "delta");
        size_t n = json_string_length(c->answer), k = json_string_length(d);
        char *t = agw_xmalloc(n + k + 1);
        memcpy(t, json_string_value(c->answer), n);
        memcpy(t + n, json_string_value(d) != NULL ? json_string_value(d) : "", k);
        t[n + k] = '\0';
        json_string_setn(c->answer, t, n + k);
        free(t);
    }
    json_decref(ev);
}

/* --resend: the run ended; its answer joins the conversation. */
static void resend_end(struct conn *c, bool ok)
{
    if (ok && c->conv != NULL && c->answer_id != NULL && c->answer != NULL) {
        json_t *m = json_object();
        json_object_set_new(m, "id", json_string(c->answer_id));
        json_object_set_new(m, "role", json_string("assistant"));
        json_object_set(m, "content", c->answer);
        json_array_append_new(c->conv, m);
    }
    free(c->answer_id);
    c->answer_id = NULL;
    json_decref(c->answer);
    c->answer = NULL;
}

/* Writes the next request on an open connection. */
static void send_request(struct conn *c)
{
    struct bench *b = c->b;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    char ids[64];
    char *body;

    snprintf(ids, sizeof(ids), "%s-%u-%" PRIu64, b->id_prefix, c->id, b->runs_started);
    json_object_set_new(b->body_tmpl, "runId", json_string(ids));
    if (b->runs_per_thread > 0)
        snprintf(ids, sizeof(ids), "%s-thread-%u-%" PRIu64, b->id_prefix, c->id,
                 c->runs / b->runs_per_thread);
    else
        snprintf(ids, sizeof(ids), "%s-thread-%u", b->id_prefix, c->id);
    if (b->resend)
        resend_next(c);
    c->runs++;
    json_object_set_new(b->body_tmpl, "threadId", json_string(ids));
    body = json_dumps(b->body_tmpl, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!body)
        abort();
    evbuffer_add_printf(out, "%sContent-Length: %zu\r\n\r\n", b->request_head, strlen(body));
    evbuffer_add(out, body, strlen(body));
    free(body);
    c->state = CONN_ST_HEAD;
    c->head_bytes = 0;
    c->got_event = false;
    c->run_error = false;
    c->frame_data = false;
    c->line_len = 0;
    c->keep_alive = true;
    c->body = BODY_CLOSE;
    c->remaining = 0;
    c->run_start_us = b->now_us;
    if (!c->inflight) {
        c->inflight = true;
        b->inflight++;
    }
}

/* The current run ended (ok or not). Decides what the connection does next; may close it. */
static void run_end(struct conn *c, bool ok)
{
    struct bench *b = c->b;

    inflight_clear(c);
    if (b->resend)
        resend_end(c, ok && !c->run_error);
    if (ok && !c->run_error)
        b->runs_ok++;
    else
        b->runs_failed++;
    if (c->run_error)
        b->runs_error_events++;
    if (b->hold && !b->stopping) {
        /* a held stream that ended is not held any more: count it and stop this connection */
        if (c->held) {
            c->held = false;
            b->held--;
        }
        conn_done(c);
        return;
    }
    if (ok && c->keep_alive && !b->new_conn && c->bev && take_run(b)) {
        send_request(c);
        return;
    }
    conn_close(c);
    if (no_more_runs(b)) {
        c->state = CONN_ST_DONE;
        b->active--;
    }
    /* else: IDLE, start_more() reconnects it */
}

/* ---- SSE
 * ------------------------------------------------------------------------------------------------
 */
static void on_line(struct conn *c, const char *s, size_t len)
{
    struct bench *b = c->b;

    if (len && s[len - 1] == '\r')
        len--;
    if (len == 0) {
        if (c->frame_data) {
            b->events++;
            if (!c->got_event) {
                c->got_event = true;
                hist_add(&b->ttfe, b->now_us - c->run_start_us);
                if (b->hold && !c->held) {
                    c->held = true;
                    b->held++;
                    inflight_clear(c);
                }
            }
        }
        c->frame_data = false;
        return;
    }
    if (len >= 5 && memcmp(s, "data:", 5) == 0) {
        const char *p;
        c->frame_data = true;
        p = memmem(s, len, "\"sentUs\":", 9);
        if (p) {
            uint64_t v = 0;
            p += 9;
            while (p < s + len && *p >= '0' && *p <= '9')
                v = v * 10 + (uint64_t)(*p++ - '0');
            hist_add(&b->lat, b->wall_us > v ? b->wall_us - v : 0);
        } else if (memmem(s, len, "\"RUN_ERROR\"", 11)) {
            c->run_error = true;
        }
        if (b->resend)
            resend_event(c, s + 5, len - 5);
    }
}

/* Feeds decoded body bytes to the SSE reader. */
static void sse_feed(struct conn *c, const char *p, size_t n)
{
    c->b->bytes += n;
    while (n) {
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;

        if (c->line_len == 0 && nl) {
            on_line(c, p, take); /* the whole line is here: no copy */
        } else {
            size_t room = LINE_MAX_BYTES - c->line_len;
            size_t k = take < room ? take : room;
            memcpy(c->line + c->line_len, p, k);
            c->line_len += k;
            if (nl) {
                on_line(c, c->line, c->line_len);
                c->line_len = 0;
            }
        }
        if (!nl)
            return;
        p += take + 1;
        n -= take + 1;
    }
}

/* Feeds up to <max> bytes of <in> to the SSE reader and drains them. Returns the count. */
static size_t feed_from(struct conn *c, struct evbuffer *in, size_t max)
{
    struct evbuffer_iovec v[16];
    size_t done = 0;

    while (done < max && evbuffer_get_length(in)) {
        int nv = evbuffer_peek(in, (ev_ssize_t)(max - done), NULL, v, 16);
        size_t got = 0;
        if (nv <= 0)
            break;
        for (int i = 0; i < nv && i < 16; i++) {
            size_t k = v[i].iov_len;
            if (got + k > max - done)
                k = max - done - got;
            sse_feed(c, v[i].iov_base, k);
            got += k;
        }
        evbuffer_drain(in, got);
        done += got;
    }
    return done;
}

/* ---- HTTP/1.1 response
 * ------------------------------------------------------------------------------------ */
static bool hdr_is(const char *line, size_t len, const char *name, const char **val)
{
    size_t nl = strlen(name);
    if (len <= nl || line[nl] != ':' || !agw_strieq_n(line, nl, name))
        return false;
    *val = line + nl + 1;
    while (**val == ' ' || **val == '\t')
        (*val)++;
    return true;
}

/* Returns 1 when the head is complete, 0 for more bytes, -1 on error. */
static int parse_head(struct conn *c, struct evbuffer *in)
{
    for (;;) {
        size_t len = 0;
        char *line = evbuffer_readln(in, &len, EVBUFFER_EOL_CRLF);
        const char *v;

        if (!line)
            return evbuffer_get_length(in) + c->head_bytes > HEAD_MAX ? -1 : 0;
        c->head_bytes += len + 2;
        if (c->head_bytes > HEAD_MAX) {
            free(line);
            return -1;
        }
        if (c->head_bytes == len + 2) { /* status line */
            int minor = 0, status = 0;
            if (sscanf(line, "HTTP/1.%d %d", &minor, &status) != 2) {
                free(line);
                return -1;
            }
            if (status != 200) {
                c->b->status_errors[status / 100 <= 5 ? status / 100 : 0]++;
                free(line);
                return -1;
            }
            c->keep_alive = minor >= 1;
        } else if (len == 0) {
            free(line);
            return 1;
        } else if (hdr_is(line, len, "Content-Length", &v)) {
            char *end;
            c->remaining = strtoull(v, &end, 10);
            if (c->body != BODY_CHUNKED)
                c->body = BODY_LENGTH;
        } else if (hdr_is(line, len, "Transfer-Encoding", &v)) {
            if (agw_header_has_token(v, "chunked"))
                c->body = BODY_CHUNKED;
        } else if (hdr_is(line, len, "Connection", &v)) {
            if (agw_header_has_token(v, "close"))
                c->keep_alive = false;
            else if (agw_header_has_token(v, "keep-alive"))
                c->keep_alive = true;
        }
        free(line);
    }
}

/* Returns 1 when the body is complete, 0 for more bytes, -1 on error. */
static int parse_body(struct conn *c, struct evbuffer *in)
{
    switch (c->body) {
    case BODY_CLOSE:
        feed_from(c, in, evbuffer_get_length(in));
        return 0;
    case BODY_LENGTH:
        c->remaining -= feed_from(c, in, c->remaining);
        return c->remaining == 0;
    case BODY_CHUNKED:
        break;
    }
    for (;;) {
        switch (c->chunk) {
        case CHUNK_SIZE: {
            size_t len = 0;
            char *line = evbuffer_readln(in, &len, EVBUFFER_EOL_CRLF);
            char *end;
            if (!line)
                return evbuffer_get_length(in) > 1024 ? -1 : 0;
            c->remaining = strtoull(line, &end, 16);
            if (end == line) {
                free(line);
                return -1;
            }
            free(line);
            c->chunk = c->remaining ? CHUNK_DATA : CHUNK_TRAILER;
            break;
        }
        case CHUNK_DATA:
            c->remaining -= feed_from(c, in, c->remaining);
            if (c->remaining)
                return 0;
            c->chunk = CHUNK_DATA_END;
            break;
        case CHUNK_DATA_END: {
            size_t len = 0;
            char *line = evbuffer_readln(in, &len, EVBUFFER_EOL_CRLF);
            if (!line)
                return evbuffer_get_length(in) > 2 ? -1 : 0;
            free(line);
            if (len != 0)
                return -1;
            c->chunk = CHUNK_SIZE;
            break;
        }
        case CHUNK_TRAILER: {
            size_t len = 0;
            char *line = evbuffer_readln(in, &len, EVBUFFER_EOL_CRLF);
            if (!line)
                return evbuffer_get_length(in) > HEAD_MAX ? -1 : 0;
            free(line);
            if (len == 0)
                return 1;
            break;
        }
        }
    }
}

/* ---- callbacks
 * ------------------------------------------------------------------------------------------ */
static void on_read(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    struct bench *b = c->b;
    struct evbuffer *in = bufferevent_get_input(bev);

    tick(b);
    while (c->bev && evbuffer_get_length(in)) {
        int rc;
        if (c->state == CONN_ST_HEAD) {
            rc = parse_head(c, in);
            if (rc < 0) {
                run_end(c, false);
                break;
            }
            if (rc == 0)
                break;
            c->state = CONN_ST_BODY;
            c->chunk = CHUNK_SIZE;
            inflight_clear(c); /* the head is in: the budget is for connects and heads only */
            if (c->body == BODY_LENGTH && c->remaining == 0) {
                run_end(c, true);
                continue;
            }
        }
        if (c->state != CONN_ST_BODY) {
            /* bytes nobody asked for */
            evbuffer_drain(in, evbuffer_get_length(in));
            break;
        }
        rc = parse_body(c, in);
        if (rc < 0) {
            run_end(c, false);
            break;
        }
        if (rc == 0)
            break;
        run_end(c, true);
    }
    if (b->hold && !b->ready_printed && b->held == b->concurrency) {
        b->ready_printed = true;
        b->t_ready_us = b->now_us;
        fprintf(stderr, "ready %u\n", b->held);
        fflush(stderr);
        if (b->hold_seconds > 0) {
            struct timeval tv;
            tv.tv_sec = (time_t)b->hold_seconds;
            tv.tv_usec = (suseconds_t)((b->hold_seconds - (double)tv.tv_sec) * 1e6);
            b->hold_timer = evtimer_new(b->base, on_deadline, b);
            evtimer_add(b->hold_timer, &tv);
        }
    }
    start_more(b);
    bench_maybe_finish(b);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;
    struct bench *b = c->b;

    (void)bev;
    tick(b);
    if (what & BEV_EVENT_CONNECTED) {
        int one = 1;
        evutil_socket_t fd = bufferevent_getfd(c->bev);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (take_run(b)) {
            send_request(c);
        } else {
            conn_done(c);
        }
    } else if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        if (c->state == CONN_ST_CONNECTING) {
            b->connect_failures++;
            b->runs_failed++; /* counted as a failed run so the budget shrinks and we end */
            b->runs_started++;
            conn_close(c);
            if (no_more_runs(b) && !b->hold) {
                c->state = CONN_ST_DONE;
                b->active--;
            } else if (b->hold) {
                c->state = CONN_ST_DONE;
                b->active--;
            }
        } else if (c->state == CONN_ST_BODY && c->body == BODY_CLOSE && (what & BEV_EVENT_EOF)) {
            c->keep_alive = false;
            run_end(c, true);
        } else if (c->state == CONN_ST_HEAD || c->state == CONN_ST_BODY) {
            c->keep_alive = false;
            run_end(c, false);
        } else {
            conn_close(c); /* a kept-alive connection closed by the server while idle */
            if (no_more_runs(b) || b->hold) {
                c->state = CONN_ST_DONE;
                b->active--;
            }
        }
        if (c->state != CONN_ST_DONE && c->bev) {
            /* run_end() may have kept a closed connection: it cannot be reused */
            conn_close(c);
        }
        start_more(b);
        bench_maybe_finish(b);
    }
}

static void conn_start(struct conn *c)
{
    struct bench *b = c->b;

    c->bev = bufferevent_socket_new(b->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!c->bev)
        abort();
    bufferevent_setcb(c->bev, on_read, NULL, on_event, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    c->state = CONN_ST_CONNECTING;
    c->inflight = true;
    b->inflight++;
    b->connects++;
    if (bufferevent_socket_connect(c->bev, (struct sockaddr *)&b->addr, sizeof(b->addr)) < 0) {
        /* reported through on_event on the next loop turn for most errors; a refusal here ends it
         */
        b->connect_failures++;
        b->runs_failed++;
        b->runs_started++;
        conn_close(c);
        c->state = CONN_ST_DONE;
        b->active--;
    }
}

/* ---- results
 * -------------------------------------------------------------------------------------------- */
static void print_results(struct bench *b)
{
    double el;
    struct rusage ru;
    double cpu;
    json_t *o;
    char *txt;

    if (!b->t_end_us)
        b->t_end_us = mono_us();
    el = (double)(b->t_end_us - b->t_start_us) / 1e6;
    getrusage(RUSAGE_SELF, &ru);
    cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
          (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
    o = json_pack(
        "{s:s,s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f,"
        "s:{s:I,s:I,s:I,s:I},s:{s:I,s:I,s:I,s:I},s:b,s:b,s:f,s:I}",
        "label", b->label ? b->label : "", "concurrency", (int)b->concurrency, "runs_ok",
        (json_int_t)b->runs_ok, "runs_failed", (json_int_t)b->runs_failed, "run_errors",
        (json_int_t)b->runs_error_events, "events", (json_int_t)b->events, "bytes",
        (json_int_t)b->bytes, "connects", (json_int_t)b->connects, "connect_failures",
        (json_int_t)b->connect_failures, "elapsed_s", el, "events_per_s",
        el > 0 ? (double)b->events / el : 0.0, "runs_per_s", el > 0 ? (double)b->runs_ok / el : 0.0,
        "ttfe_us", "n", (json_int_t)b->ttfe.count, "p50", (json_int_t)hist_quantile(&b->ttfe, 0.5),
        "p99", (json_int_t)hist_quantile(&b->ttfe, 0.99), "max", (json_int_t)b->ttfe.max,
        "latency_us", "n", (json_int_t)b->lat.count, "p50", (json_int_t)hist_quantile(&b->lat, 0.5),
        "p99", (json_int_t)hist_quantile(&b->lat, 0.99), "max", (json_int_t)b->lat.max, "timed_out",
        b->timed_out, "interrupted", b->interrupted, "load_cpu_s", cpu, "held",
        (json_int_t)b->held);
    if (!o)
        abort();
    {
        json_t *st = json_object();
        static const char *const cls[] = {"other", "1xx", "2xx", "3xx", "4xx", "5xx"};
        for (unsigned i = 0; i < 6; i++)
            if (b->status_errors[i])
                json_object_set_new(st, cls[i], json_integer((json_int_t)b->status_errors[i]));
        json_object_set_new(o, "bad_status", st);
    }
    txt = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    printf("%s\n", txt);
    fflush(stdout);
    free(txt);
    json_decref(o);
}

static void bench_stop(struct bench *b)
{
    if (b->stopping)
        return;
    b->stopping = true;
    b->t_end_us = mono_us();
    event_base_loopbreak(b->base);
}

static void bench_maybe_finish(struct bench *b)
{
    if (b->active == 0)
        bench_stop(b);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    struct bench *b = arg;
    (void)fd;
    (void)what;
    if (!b->hold || !b->ready_printed)
        b->timed_out = true;
    bench_stop(b);
}

/* --seconds passed: no new run; connections waiting to (re)connect are done, the runs under way
 * finish and end the bench. */
static void on_drain(evutil_socket_t fd, short what, void *arg)
{
    struct bench *b = arg;
    (void)fd;
    (void)what;
    b->draining = true;
    for (unsigned i = 0; i < b->concurrency; i++) {
        struct conn *c = &b->conns[i];
        if (c->state == CONN_ST_IDLE && !c->bev) {
            c->state = CONN_ST_DONE;
            b->active--;
        }
    }
    bench_maybe_finish(b);
}

static void on_signal(evutil_socket_t fd, short what, void *arg)
{
    struct bench *b = arg;
    (void)fd;
    (void)what;
    b->interrupted = true;
    bench_stop(b);
}

/* ---- main
 * -----------------------------------------------------------------------------------------------
 */
static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: agw-load --url http://127.0.0.1:PORT/path [options]\n"
        "  --concurrency C     connections (default 1)\n"
        "  --runs R            runs in total, spread over the connections (default C, or no\n"
        "                      limit with --seconds)\n"
        "  --seconds S         start runs for S seconds; the runs under way then finish\n"
        "  --new-conn          a new connection per run (the request says Connection: close)\n"
        "  --runs-per-thread K a connection slot moves to a new threadId every K runs (a\n"
        "                      conversation of K turns; default: one thread per slot)\n"
        "  --resend            each run sends its thread's whole conversation, as a client\n"
        "                      does: every user message and answer before, then a new user\n"
        "                      message (answers rebuilt from the TEXT_MESSAGE_* events)\n"
        "  --duration S        stop after S seconds whatever is left (default 120)\n"
        "  --header 'N: v'     extra request header (repeatable)\n"
        "  --body FILE         RunAgentInput JSON (threadId/runId are set per run)\n"
        "  --hold              one stream per connection, kept open; 'ready N' on stderr when\n"
        "                      all have their first event; ends on SIGTERM/SIGINT/--hold-seconds\n"
        "  --hold-seconds S    end a --hold after S seconds of readiness (default: signal)\n"
        "  --max-inflight N    connections connecting or waiting for a head at once (%d)\n"
        "  --label TEXT        copied into the JSON result\n"
        "  --id-prefix TEXT    threadId, runId and message ids begin with TEXT (default\n"
        "                      bench): a warm-up with another prefix leaves the timed load's\n"
        "                      threads new\n"
        "Prints one JSON object on stdout.\n",
        DEFAULT_INFLIGHT);
}

static int parse_url(struct bench *b, const char *url)
{
    char host[64];
    const char *p, *slash, *colon;
    long port = 80;
    char *end;

    if (strncmp(url, "http://", 7) != 0)
        return -1;
    p = url + 7;
    slash = strchr(p, '/');
    if (!slash)
        slash = p + strlen(p);
    colon = memchr(p, ':', (size_t)(slash - p));
    if ((size_t)((colon ? colon : slash) - p) >= sizeof(host))
        return -1;
    memcpy(host, p, (size_t)((colon ? colon : slash) - p));
    host[(colon ? colon : slash) - p] = '\0';
    if (colon) {
        port = strtol(colon + 1, &end, 10);
        if (end != slash || port <= 0 || port > 65535)
            return -1;
    }
    memset(&b->addr, 0, sizeof(b->addr));
    b->addr.sin_family = AF_INET;
    b->addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &b->addr.sin_addr) != 1)
        return -1;
    b->host_hdr = agw_xstrndup(p, (size_t)(slash - p));
    b->path = agw_xstrdup(*slash ? slash : "/");
    return 0;
}

static double parse_seconds(const char *opt, const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || v < 0) {
        fprintf(stderr, "agw-load: %s: expects seconds, got '%s'\n", opt, s);
        exit(2);
    }
    return v;
}

static unsigned long parse_count(const char *opt, const char *s, unsigned long max)
{
    char *end;
    unsigned long v;
    errno = 0;
    v = strtoul(s, &end, 10);
    if (errno || end == s || *end || v == 0 || v > max) {
        fprintf(stderr, "agw-load: %s: expects 1..%lu, got '%s'\n", opt, max, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"url", required_argument, NULL, 'u'},
        {"concurrency", required_argument, NULL, 'c'},
        {"runs", required_argument, NULL, 'r'},
        {"duration", required_argument, NULL, 'd'},
        {"header", required_argument, NULL, 'H'},
        {"body", required_argument, NULL, 'b'},
        {"hold", no_argument, NULL, 'o'},
        {"hold-seconds", required_argument, NULL, 's'},
        {"max-inflight", required_argument, NULL, 'i'},
        {"label", required_argument, NULL, 'l'},
        {"id-prefix", required_argument, NULL, 'p'},
        {"seconds", required_argument, NULL, 'S'},
        {"new-conn", no_argument, NULL, 'n'},
        {"runs-per-thread", required_argument, NULL, 't'},
        {"resend", no_argument, NULL, 'R'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct bench *b = agw_xcalloc(1, sizeof(*b));
    const char *url = NULL, *body_file = NULL;
    const char *headers[MAX_HEADERS];
    unsigned nheaders = 0;
    struct evbuffer *head = NULL;
    json_error_t jerr;
    int ch, rc = 1;

    b->concurrency = 1;
    b->duration = 120;
    b->max_inflight = DEFAULT_INFLIGHT;
    b->id_prefix = "bench";
    while ((ch = getopt_long(argc, argv, "u:c:r:d:H:b:os:i:l:p:S:nt:Rh", opts, NULL)) != -1) {
        switch (ch) {
        case 'u':
            url = optarg;
            break;
        case 'c':
            b->concurrency = (unsigned)parse_count("--concurrency", optarg, 100000);
            break;
        case 'r':
            b->runs_total = parse_count("--runs", optarg, 1000000000UL);
            break;
        case 'd':
            b->duration = parse_seconds("--duration", optarg);
            break;
        case 'H':
            if (nheaders == MAX_HEADERS || !strchr(optarg, ':') || strpbrk(optarg, "\r\n")) {
                fprintf(stderr, "agw-load: --header: expects 'Name: value' (at most %d)\n",
                        MAX_HEADERS);
                return 2;
            }
            headers[nheaders++] = optarg;
            break;
        case 'b':
            body_file = optarg;
            break;
        case 'o':
            b->hold = true;
            break;
        case 's':
            b->hold_seconds = parse_seconds("--hold-seconds", optarg);
            break;
        case 'i':
            b->max_inflight = (unsigned)parse_count("--max-inflight", optarg, 100000);
            break;
        case 'l':
            b->label = optarg;
            break;
        case 'p':
            if (strlen(optarg) == 0 || strlen(optarg) > 16 ||
                strspn(optarg, "abcdefghijklmnopqrstuvwxyz0123456789-") != strlen(optarg)) {
                fprintf(stderr, "agw-load: --id-prefix: 1 to 16 of a-z, 0-9 and '-'\n");
                return 2;
            }
            b->id_prefix = optarg;
            break;
        case 'S':
            b->seconds = parse_seconds("--seconds", optarg);
            break;
        case 'n':
            b->new_conn = true;
            break;
        case 't':
            b->runs_per_thread = parse_count("--runs-per-thread", optarg, 1000000000UL);
            break;
        case 'R':
            b->resend = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!url || optind != argc) {
        usage(stderr);
        return 2;
    }
    if (parse_url(b, url) < 0) {
        fprintf(stderr, "agw-load: --url: expects http://IPV4:PORT/path, got '%s'\n", url);
        return 2;
    }
    if (b->hold)
        b->runs_total = b->concurrency;
    else if (!b->runs_total)
        b->runs_total = b->seconds > 0 ? UINT64_MAX : b->concurrency;
    b->body_tmpl =
        body_file ? json_load_file(body_file, 0, &jerr) : json_loads(default_body, 0, &jerr);
    if (!json_is_object(b->body_tmpl)) {
        fprintf(stderr, "agw-load: --body: %s: expects a JSON object (%s)\n",
                body_file ? body_file : "default", jerr.text);
        goto out;
    }
    head = evbuffer_new();
    evbuffer_add_printf(head,
                        "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                        "Accept: text/event-stream\r\nUser-Agent: agw-load\r\n%s",
                        b->path, b->host_hdr, b->new_conn ? "Connection: close\r\n" : "");
    for (unsigned i = 0; i < nheaders; i++)
        evbuffer_add_printf(head, "%s\r\n", headers[i]);
    evbuffer_add(head, "", 1);
    b->request_head = agw_xstrdup((const char *)evbuffer_pullup(head, -1));

    signal(SIGPIPE, SIG_IGN);
    b->base = event_base_new();
    if (!b->base)
        goto out;
    b->conns = agw_xcalloc(b->concurrency, sizeof(*b->conns));
    for (unsigned i = 0; i < b->concurrency; i++) {
        b->conns[i].b = b;
        b->conns[i].id = i;
        b->conns[i].line = agw_xmalloc(LINE_MAX_BYTES);
    }
    b->active = b->concurrency;
    b->deadline = evtimer_new(b->base, on_deadline, b);
    b->sig_term = evsignal_new(b->base, SIGTERM, on_signal, b);
    b->sig_int = evsignal_new(b->base, SIGINT, on_signal, b);
    {
        struct timeval tv;
        tv.tv_sec = (time_t)b->duration;
        tv.tv_usec = (suseconds_t)((b->duration - (double)tv.tv_sec) * 1e6);
        evtimer_add(b->deadline, &tv);
    }
    if (b->seconds > 0 && !b->hold) {
        struct timeval tv;
        tv.tv_sec = (time_t)b->seconds;
        tv.tv_usec = (suseconds_t)((b->seconds - (double)tv.tv_sec) * 1e6);
        b->drain_timer = evtimer_new(b->base, on_drain, b);
        evtimer_add(b->drain_timer, &tv);
    }
    evsignal_add(b->sig_term, NULL);
    evsignal_add(b->sig_int, NULL);
    tick(b);
    b->t_start_us = b->now_us;
    start_more(b);
    event_base_dispatch(b->base);
    print_results(b);
    rc = b->runs_failed || b->timed_out ? 1 : 0;
    if (b->hold)
        rc = b->ready_printed ? 0 : 1;
out:
    if (b->conns) {
        for (unsigned i = 0; i < b->concurrency; i++) {
            if (b->conns[i].bev)
                bufferevent_free(b->conns[i].bev);
            free(b->conns[i].line);
        }
        free(b->conns);
    }
    if (b->deadline)
        event_free(b->deadline);
    if (b->hold_timer)
        event_free(b->hold_timer);
    if (b->drain_timer)
        event_free(b->drain_timer);
    if (b->sig_term)
        event_free(b->sig_term);
    if (b->sig_int)
        event_free(b->sig_int);
    if (b->base)
        event_base_free(b->base);
    if (head)
        evbuffer_free(head);
    json_decref(b->body_tmpl);
    free(b->request_head);
    free(b->host_hdr);
    free(b->path);
    free(b);
    return rc;
}
