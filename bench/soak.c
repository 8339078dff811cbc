/* agw-soak: the client of the soak benchmark (bench/soak.sh, doc/benchmarks.md "Soak").
 *
 * One libevent loop drives C slots. Each slot plays runs one after the other until --runs runs have
 * been started in total, and checks the outcome of every one of them. A run's kind is drawn from
 * --mix with a generator seeded by --seed and the run's index, so the same seed gives the same runs
 * whatever the scheduling:
 *
 *   normal    POST .../agents/chat/runs, X-Demo-Events/X-Demo-Size chosen per run; the stream is
 *             read to its end: RUN_STARTED (our ids) ... exactly N content events of exactly the
 *             asked size ... RUN_FINISHED (our ids), then the chunked body's last chunk.
 *   cancel    POST to a stalled (stall) or slow (slow) agent; after 3 events, POST
 *             .../runs/{runId}/cancel on a second connection: 202 {"status":"cancelled",...}, and
 *             the first stream ends with RUN_ERROR code CANCELLED and a clean end of body.
 *   cut       POST to a stalled, slow or fast (MBs, backpressure) agent; after 3 events the client
 *             closes its socket. Also on agents with on_client_disconnect "detach": a paced stream
 *             (the gateway reads it to its end), and a stalled one then ended by the cancel
 *             endpoint (202).
 *   hitl      POST to hitl (wait_decision=1) with the frontend tool confirmAction and "delete the
 *             logs"; after TOOL_CALL_END, a decision-only POST (same threadId/runId, approve or
 * deny) on a second connection: 202 decision_forwarded; the first stream then goes on with the
 *             matching answer ("Successfully deleted" / "Cancelled") and RUN_FINISHED.
 *   upstream  upstream 500 or 503 -> 502; no backend listening -> 502; first byte too late -> 504;
 *             the backend drops the connection after 3 events or after its head -> 200 and an
 *             in-band RUN_ERROR ending a clean body.
 *   invalid   bad JSON -> 400, no runId -> 422, bad or no token -> 401, unknown agent -> 404,
 *             body over the limit -> 413 (sent whole, or announced with Expect: 100-continue),
 *             wrong Content-Type -> 415, cancel of an unknown run -> 404.
 *
 * Every outcome that differs from the expected one counts as a mismatch; the first --max-report of
 * them are described on stderr. Connections are kept alive and reused as HTTP/1.1 allows. The
 * result is one JSON object on stdout (runs by kind and variant, mismatches by reason, HTTP
 * statuses seen, runs/s); the exit status is 0 only when every run matched and nothing timed out.
 *
 * Lifetime: a slot owns two connections (main: the run; aux: its cancel or decision). A bufferevent
 * is freed only at the top of a libevent callback: its own event callback, or the slot's step,
 * which runs from an event of its own (event_active) and never from inside a parser. */
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
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>
#include <jansson.h>

#include "agw/common.h"

#define HEAD_MAX         (16 * 1024)
#define ERR_BODY_MAX     4096      /* bytes of a non-SSE body kept for the checks */
#define FRAME_MAX        (1 << 20) /* one SSE frame */
#define AUX_IDLE_US      5000000u  /* a kept-alive connection idle longer is not reused */
#define TEXT_KEEP        256       /* bytes of the message text kept (hitl) */
#define MAX_VARIANTS     10
#define CUT_AFTER_EVENTS 3

/* ---- kinds and variants ----------------------------------------------------------------------
 */
enum kind { K_NORMAL, K_CANCEL, K_CUT, K_HITL, K_UPSTREAM, K_INVALID, K_N };
static const char *const kind_names[K_N] = {"normal", "cancel",   "cut",
                                            "hitl",   "upstream", "invalid"};

enum {
    /* normal */
    V_SMALL = 0,
    V_BIG,
    /* cancel, cut */
    V_STALL = 0,
    V_SLOW,
    V_FAST,
    V_DETACH,
    V_DETACH_CANCEL,
    /* hitl */
    V_APPROVE = 0,
    V_DENY,
    /* upstream */
    V_500 = 0,
    V_503,
    V_DOWN,
    V_DROP,
    V_DROP0,
    V_TIMEOUT,
    /* invalid */
    V_BADJSON = 0,
    V_NORUNID,
    V_BADTOKEN,
    V_NOTOKEN,
    V_NOAGENT,
    V_BIGBODY,
    V_BIGBODY_EXPECT,
    V_CTYPE,
    V_CANCEL_UNKNOWN,
};

static const char *const variant_names[K_N][MAX_VARIANTS] = {
    [K_NORMAL] = {"small", "big"},
    [K_CANCEL] = {"stall", "slow"},
    [K_CUT] = {"stall", "slow", "fast", "detach", "detach_cancel"},
    [K_HITL] = {"approve", "deny"},
    [K_UPSTREAM] = {"status500", "status503", "down", "drop3", "drop0", "first_byte_timeout"},
    [K_INVALID] = {"bad_json", "no_run_id", "bad_token", "no_token", "unknown_agent",
                   "body_too_large", "body_too_large_expect", "content_type", "cancel_unknown_run"},
};

/* Variant weights inside a kind (the first_byte_timeout variant is rare: each one holds its slot
 * for the gateway's first-byte timeout). */
static const unsigned variant_weights[K_N][MAX_VARIANTS] = {
    [K_NORMAL] = {49, 1},
    [K_CANCEL] = {1, 1},
    [K_CUT] = {2, 2, 1, 1, 1},
    [K_HITL] = {1, 1},
    [K_UPSTREAM] = {5, 4, 3, 4, 3, 1},
    [K_INVALID] = {1, 1, 1, 1, 1, 1, 1, 1, 1},
};

/* ---- random numbers (splitmix64: one stream per run index) ------------------------------------
 */
static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static unsigned pick(uint64_t *rng, const unsigned *weights, unsigned n)
{
    unsigned total = 0, r;

    for (unsigned i = 0; i < n; i++)
        total += weights[i];
    r = (unsigned)(splitmix(rng) % total);
    for (unsigned i = 0; i < n; i++) {
        if (r < weights[i])
            return i;
        r -= weights[i];
    }
    return n - 1;
}

static unsigned range(uint64_t *rng, unsigned lo, unsigned hi)
{
    return lo + (unsigned)(splitmix(rng) % (uint64_t)(hi - lo + 1));
}

/* ---- state -------------------------------------------------------------------------------------
 */
enum hc_state {
    HC_NONE = 0,   /* no connection */
    HC_CONNECTING, /* connect() under way, request pending */
    HC_IDLE,       /* connected, no request */
    HC_HEAD,       /* request written, reading the response head */
    HC_BODY,       /* reading the body */
    HC_DONE,       /* the response is complete */
};

enum body_kind { BODY_NONE, BODY_LENGTH, BODY_CHUNKED, BODY_CLOSE };
enum chunk_state { CHUNK_SIZE, CHUNK_DATA, CHUNK_DATA_END, CHUNK_TRAILER };

struct slot;
struct soak;

/* One client connection and the response being read on it. */
struct hc {
    struct slot *s;
    const char *role; /* "main" or "aux" */
    struct bufferevent *bev;
    enum hc_state state;
    struct evbuffer *pending; /* the request, until connected */
    uint64_t last_used_us;
    bool active; /* a request of the current run was sent on this connection */
    bool failed; /* the connection broke before the response was complete */
    const char *fail_reason;
    /* response */
    int status;
    bool keep_alive;
    bool sse;
    bool www_auth;
    enum body_kind body;
    enum chunk_state chunk;
    uint64_t remaining;
    size_t head_bytes;
    struct evbuffer *err_body; /* a non-SSE body (bounded) */
    struct evbuffer *sse_in;   /* decoded SSE body bytes not yet parsed */
    struct evbuffer *frame;    /* data of the current frame */
    bool frame_has_data;
    bool unexpected_bytes; /* bytes after a complete response */
};

/* What a run saw, for its verdict. */
struct run {
    enum kind kind;
    unsigned variant;
    uint64_t index;
    char thread_id[64], run_id[64];
    unsigned n_content, size; /* normal: the asked events and delta size */
    uint64_t start_us, last_event_us;
    /* main stream */
    unsigned n_events, n_content_seen, n_after_terminal, n_bad_frames, n_bad_ids;
    uint64_t text_bytes;
    char first_type[40], last_type[40], error_code[40];
    bool saw_finished, saw_error, saw_tool_end;
    char tool_call_id[64], tool_name[64];
    char text[TEXT_KEEP]; /* text of messages after the tool call (hitl) */
    size_t text_len;
    bool after_tool;
    /* progress */
    bool aux_needed, aux_sent, verdict_given;
    bool cut_wanted; /* a cut run saw its events: nothing more is read, the step closes */
    bool cut_done;
    bool main_clean_end; /* the response body ended as HTTP says (last chunk) */
};

struct slot {
    struct soak *b;
    unsigned id;
    struct hc main, aux;
    struct event *step_ev, *timer;
    bool running; /* a run is under way */
    bool done;    /* no more runs for this slot */
    struct run r;
};

struct kind_stats {
    uint64_t runs, ok, mismatch;
    uint64_t v_runs[MAX_VARIANTS], v_mismatch[MAX_VARIANTS];
};

struct reason_count {
    char *reason;
    uint64_t n;
};

struct soak {
    struct event_base *base;
    struct sockaddr_in addr;
    char host_hdr[80];
    const char *token;
    const char *prefix;
    uint64_t seed;
    unsigned mix[K_N];
    size_t max_body;
    unsigned concurrency;
    uint64_t runs_total, runs_started, runs_done;
    double duration, run_timeout;
    unsigned max_report, reported;
    double progress_s;
    bool stopping, timed_out, interrupted;
    uint64_t t_start_us, t_end_us;
    struct kind_stats ks[K_N];
    uint64_t statuses[600];
    uint64_t requests, connects, connect_failures, events, body_bytes;
    uint64_t stray_bytes; /* bytes received on a connection with no request outstanding */
    struct reason_count *reasons;
    size_t n_reasons;
    struct slot *slots;
    unsigned active_slots;
    struct event *deadline, *sig_term, *sig_int, *progress;
    char *big_body; /* over max_body */
    size_t big_body_len;
};

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void slot_kick(struct slot *s)
{
    event_active(s->step_ev, EV_WRITE, 0);
}

static void soak_stop(struct soak *b)
{
    if (b->stopping)
        return;
    b->stopping = true;
    b->t_end_us = mono_us();
    event_base_loopbreak(b->base);
}

/* ---- connections -------------------------------------------------------------------------------
 */
static void hc_on_read(struct bufferevent *bev, void *arg);
static void hc_on_event(struct bufferevent *bev, short what, void *arg);

static void hc_close(struct hc *h)
{
    if (h->bev) {
        bufferevent_free(h->bev);
        h->bev = NULL;
    }
    if (h->pending)
        evbuffer_drain(h->pending, evbuffer_get_length(h->pending));
    h->state = HC_NONE;
}

static void hc_reset_response(struct hc *h)
{
    h->status = 0;
    h->keep_alive = true;
    h->sse = false;
    h->www_auth = false;
    h->body = BODY_NONE;
    h->chunk = CHUNK_SIZE;
    h->remaining = 0;
    h->head_bytes = 0;
    h->failed = false;
    h->fail_reason = NULL;
    h->frame_has_data = false;
    h->unexpected_bytes = false;
    evbuffer_drain(h->err_body, evbuffer_get_length(h->err_body));
    evbuffer_drain(h->sse_in, evbuffer_get_length(h->sse_in));
    evbuffer_drain(h->frame, evbuffer_get_length(h->frame));
}

/* Sends <req> (drained) on <h>: on its kept-alive connection when it has a fresh one, else on a
 * new connection. */
static void hc_send(struct hc *h, struct evbuffer *req)
{
    struct soak *b = h->s->b;
    uint64_t now = mono_us();

    hc_reset_response(h);
    h->active = true;
    b->requests++;
    if (h->bev && h->state == HC_IDLE && now - h->last_used_us < AUX_IDLE_US) {
        bufferevent_write_buffer(h->bev, req);
        h->state = HC_HEAD;
        h->last_used_us = now;
        return;
    }
    hc_close(h);
    h->bev = bufferevent_socket_new(b->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!h->bev)
        abort();
    bufferevent_setcb(h->bev, hc_on_read, NULL, hc_on_event, h);
    bufferevent_enable(h->bev, EV_READ | EV_WRITE);
    evbuffer_add_buffer(h->pending, req);
    h->state = HC_CONNECTING;
    h->last_used_us = now;
    b->connects++;
    if (bufferevent_socket_connect(h->bev, (struct sockaddr *)&b->addr, sizeof(b->addr)) < 0) {
        /* reported here for a few errors: the step sees a failed connection */
        b->connect_failures++;
        hc_close(h);
        h->failed = true;
        h->fail_reason = "connect failed";
        slot_kick(h->s);
    }
}

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
static int parse_head(struct hc *h, struct evbuffer *in)
{
    for (;;) {
        size_t len = 0;
        char *line = evbuffer_readln(in, &len, EVBUFFER_EOL_CRLF);
        const char *v;

        if (!line)
            return evbuffer_get_length(in) + h->head_bytes > HEAD_MAX ? -1 : 0;
        h->head_bytes += len + 2;
        if (h->head_bytes > HEAD_MAX) {
            free(line);
            return -1;
        }
        if (h->status == 0) { /* status line */
            int minor = 0, status = 0;
            if (sscanf(line, "HTTP/1.%d %d", &minor, &status) != 2 || status < 100 ||
                status > 599) {
                free(line);
                return -1;
            }
            h->status = status;
            h->keep_alive = minor >= 1;
        } else if (len == 0) {
            free(line);
            if (h->status >= 100 && h->status < 200) { /* 100 Continue: the real head follows */
                h->status = 0;
                h->head_bytes = 0;
                continue;
            }
            if (h->body == BODY_NONE)
                h->body = BODY_CLOSE;
            return 1;
        } else if (hdr_is(line, len, "Content-Length", &v)) {
            h->remaining = strtoull(v, NULL, 10);
            if (h->body != BODY_CHUNKED)
                h->body = BODY_LENGTH;
        } else if (hdr_is(line, len, "Transfer-Encoding", &v)) {
            if (agw_header_has_token(v, "chunked"))
                h->body = BODY_CHUNKED;
        } else if (hdr_is(line, len, "Connection", &v)) {
            if (agw_header_has_token(v, "close"))
                h->keep_alive = false;
            else if (agw_header_has_token(v, "keep-alive"))
                h->keep_alive = true;
        } else if (hdr_is(line, len, "Content-Type", &v)) {
            h->sse = strncmp(v, "text/event-stream", 17) == 0;
        } else if (hdr_is(line, len, "WWW-Authenticate", &v)) {
            h->www_auth = strncmp(v, "Bearer", 6) == 0;
        }
        free(line);
    }
}

static void slot_on_event(struct slot *s, struct hc *h, json_t *ev);

/* Parses the complete frames of h->sse_in. */
static void sse_parse(struct hc *h)
{
    for (;;) {
        size_t len = 0;
        char *line = evbuffer_readln(h->sse_in, &len, EVBUFFER_EOL_LF);

        if (!line) {
            if (evbuffer_get_length(h->sse_in) > FRAME_MAX) {
                h->s->r.n_bad_frames++;
                evbuffer_drain(h->sse_in, evbuffer_get_length(h->sse_in));
            }
            return;
        }
        if (len && line[len - 1] == '\r')
            line[--len] = '\0';
        if (len == 0) {
            if (h->frame_has_data) {
                json_error_t jerr;
                json_t *ev = json_loadb((const char *)evbuffer_pullup(h->frame, -1),
                                        evbuffer_get_length(h->frame), 0, &jerr);
                slot_on_event(h->s, h, ev);
                json_decref(ev);
            }
            evbuffer_drain(h->frame, evbuffer_get_length(h->frame));
            h->frame_has_data = false;
            if (h->s->r.cut_wanted && h == &h->s->main) {
                free(line);
                return; /* the client reads no further */
            }
        } else if (len >= 5 && memcmp(line, "data:", 5) == 0) {
            const char *d = line + 5;
            if (*d == ' ')
                d++;
            if (h->frame_has_data)
                evbuffer_add(h->frame, "\n", 1);
            evbuffer_add(h->frame, d, strlen(d));
            h->frame_has_data = true;
        }
        /* comments (": ping"), event:, id:, retry: lines are not AG-UI events */
        free(line);
    }
}

/* Takes up to <max> bytes of the body from <in>. */
static size_t take_body(struct hc *h, struct evbuffer *in, size_t max)
{
    size_t n = evbuffer_get_length(in);

    if (n > max)
        n = max;
    h->s->b->body_bytes += n;
    if (h->sse) {
        evbuffer_remove_buffer(in, h->sse_in, n);
        sse_parse(h);
    } else {
        size_t keep = evbuffer_get_length(h->err_body);
        keep = keep < ERR_BODY_MAX ? ERR_BODY_MAX - keep : 0;
        if (keep > n)
            keep = n;
        evbuffer_remove_buffer(in, h->err_body, keep);
        evbuffer_drain(in, n - keep);
    }
    return n;
}

/* Returns 1 when the body is complete, 0 for more bytes, -1 on error. */
static int parse_body(struct hc *h, struct evbuffer *in)
{
    switch (h->body) {
    case BODY_NONE:
    case BODY_CLOSE:
        take_body(h, in, evbuffer_get_length(in));
        return 0;
    case BODY_LENGTH:
        h->remaining -= take_body(h, in, h->remaining);
        return h->remaining == 0;
    case BODY_CHUNKED:
        break;
    }
    for (;;) {
        size_t len = 0;
        char *line, *end;
        if (h->s->r.cut_wanted && h == &h->s->main)
            return 0;
        switch (h->chunk) {
        case CHUNK_SIZE:
            line = evbuffer_readln(in, &len, EVBUFFER_EOL_CRLF);
            if (!line)
                return evbuffer_get_length(in) > 1024 ? -1 : 0;
            h->remaining = strtoull(line, &end, 16);
            if (end == line) {
                free(line);
                return -1;
            }
            free(line);
            h->chunk = h->remaining ? CHUNK_DATA : CHUNK_TRAILER;
            break;
        case CHUNK_DATA:
            if (!evbuffer_get_length(in))
                return 0;
            h->remaining -= take_body(h, in, h->remaining);
            if (h->remaining)
                return 0;
            h->chunk = CHUNK_DATA_END;
            break;
        case CHUNK_DATA_END:
            line = evbuffer_readln(in, &len, EVBUFFER_EOL_CRLF);
            if (!line)
                return evbuffer_get_length(in) > 2 ? -1 : 0;
            free(line);
            if (len != 0)
                return -1;
            h->chunk = CHUNK_SIZE;
            break;
        case CHUNK_TRAILER:
            line = evbuffer_readln(in, &len, EVBUFFER_EOL_CRLF);
            if (!line)
                return evbuffer_get_length(in) > HEAD_MAX ? -1 : 0;
            free(line);
            if (len == 0)
                return 1;
            break;
        }
    }
}

static void hc_response_done(struct hc *h, bool clean)
{
    struct slot *s = h->s;
    struct soak *b = s->b;

    (void)b;
    h->state = HC_DONE;
    h->last_used_us = mono_us();
    if (h == &s->main)
        s->r.main_clean_end = clean;
    slot_kick(s);
}

static void hc_fail(struct hc *h, const char *why)
{
    h->failed = true;
    h->fail_reason = why;
    h->state = HC_NONE;
    slot_kick(h->s);
}

static void hc_on_read(struct bufferevent *bev, void *arg)
{
    struct hc *h = arg;
    struct evbuffer *in = bufferevent_get_input(bev);

    while (evbuffer_get_length(in) && !(h->s->r.cut_wanted && h == &h->s->main)) {
        int rc;
        if (h->state == HC_HEAD) {
            rc = parse_head(h, in);
            if (rc < 0) {
                hc_close(h);
                hc_fail(h, "malformed response head");
                return;
            }
            if (rc == 0)
                return;
            h->s->b->statuses[h->status]++;
            h->state = HC_BODY;
            if (h->body == BODY_LENGTH && h->remaining == 0) {
                hc_response_done(h, true);
                continue;
            }
        }
        if (h->state != HC_BODY) {
            /* bytes nobody asked for */
            h->unexpected_bytes = true;
            h->s->b->stray_bytes += evbuffer_get_length(in);
            evbuffer_drain(in, evbuffer_get_length(in));
            return;
        }
        rc = parse_body(h, in);
        if (rc < 0) {
            hc_close(h);
            hc_fail(h, "malformed response body");
            return;
        }
        if (rc == 0)
            return;
        hc_response_done(h, true);
    }
}

static void hc_on_event(struct bufferevent *bev, short what, void *arg)
{
    struct hc *h = arg;
    struct soak *b = h->s->b;

    (void)bev;
    if (what & BEV_EVENT_CONNECTED) {
        int one = 1;
        setsockopt(bufferevent_getfd(h->bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        bufferevent_write_buffer(h->bev, h->pending);
        h->state = HC_HEAD;
        return;
    }
    if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
        return;
    if (h->s->r.cut_wanted && h == &h->s->main) {
        /* the client has decided to go away: what the server does now does not matter */
        hc_close(h);
        slot_kick(h->s);
        return;
    }
    if ((what & BEV_EVENT_WRITING) && (h->state == HC_HEAD || h->state == HC_BODY)) {
        /* The server closed while the request body was still going out (a 413 answered before
         * the body was read): its answer may be waiting in the socket. Reading goes on; the end
         * of the read side decides. */
        return;
    }
    switch (h->state) {
    case HC_CONNECTING:
        b->connect_failures++;
        hc_close(h);
        hc_fail(h, "connect failed");
        break;
    case HC_HEAD:
        hc_close(h);
        hc_fail(h, (what & BEV_EVENT_EOF) ? "connection closed before the response head"
                                          : "connection error before the response head");
        break;
    case HC_BODY:
        if (h->body == BODY_CLOSE && (what & BEV_EVENT_EOF)) {
            hc_close(h);
            hc_response_done(h, true);
        } else {
            hc_close(h);
            hc_fail(h, (what & BEV_EVENT_EOF) ? "connection closed in the middle of the body"
                                              : "connection error in the middle of the body");
        }
        break;
    case HC_NONE:
    case HC_IDLE:
    case HC_DONE:
        /* a kept-alive connection closed by the server between requests, or the reset that
         * follows a rejected body (413): the response, if any, is complete */
        hc_close(h);
        if (h->active)
            h->state = HC_DONE;
        break;
    }
}

static void hc_init(struct hc *h, struct slot *s, const char *role)
{
    h->s = s;
    h->role = role;
    h->pending = evbuffer_new();
    h->err_body = evbuffer_new();
    h->sse_in = evbuffer_new();
    h->frame = evbuffer_new();
    if (!h->pending || !h->err_body || !h->sse_in || !h->frame)
        abort();
}

static void hc_free(struct hc *h)
{
    if (h->bev)
        bufferevent_free(h->bev);
    evbuffer_free(h->pending);
    evbuffer_free(h->err_body);
    evbuffer_free(h->sse_in);
    evbuffer_free(h->frame);
}

/* ---- requests ----------------------------------------------------------------------------------
 */
struct req_opts {
    const char *path;
    const char *token; /* NULL: no Authorization */
    const char *content_type;
    const char *extra; /* more header lines, each ending with \r\n */
    const char *body;
    size_t body_len;
    bool expect;    /* Expect: 100-continue, and the body is not sent */
    bool no_length; /* no body at all (Content-Length: 0 anyway) */
};

static struct evbuffer *build_request(struct soak *b, const struct req_opts *o)
{
    struct evbuffer *e = evbuffer_new();

    if (!e)
        abort();
    evbuffer_add_printf(e, "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: agw-soak\r\n", o->path,
                        b->host_hdr);
    if (o->token)
        evbuffer_add_printf(e, "Authorization: Bearer %s\r\n", o->token);
    if (o->content_type)
        evbuffer_add_printf(e, "Content-Type: %s\r\n", o->content_type);
    evbuffer_add_printf(e, "Accept: text/event-stream\r\n%sContent-Length: %zu\r\n",
                        o->extra ? o->extra : "", o->no_length ? 0 : o->body_len);
    if (o->expect)
        evbuffer_add_printf(e, "Expect: 100-continue\r\n");
    evbuffer_add(e, "\r\n", 2);
    if (!o->expect && !o->no_length && o->body_len)
        evbuffer_add(e, o->body, o->body_len);
    return e;
}

static char *run_body(const struct run *r, const char *content, bool with_tool, bool with_run_id)
{
    json_t *o = json_pack("{s:s}", "threadId", r->thread_id);
    char *txt;

    if (with_run_id)
        json_object_set_new(o, "runId", json_string(r->run_id));
    json_object_set_new(o, "state", json_object());
    json_object_set_new(
        o, "messages",
        json_pack("[{s:s,s:s,s:s}]", "id", "m1", "role", "user", "content", content));
    if (with_tool)
        json_object_set_new(o, "tools",
                            json_pack("[{s:s,s:s,s:{s:s}}]", "name", "confirmAction", "description",
                                      "Ask the user to confirm", "parameters", "type", "object"));
    else
        json_object_set_new(o, "tools", json_array());
    json_object_set_new(o, "context", json_array());
    json_object_set_new(o, "forwardedProps", json_object());
    txt = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!txt)
        abort();
    return txt;
}

static void send_json(struct soak *b, struct hc *h, const char *path, const char *token,
                      const char *extra, const char *body)
{
    struct req_opts o = {.path = path,
                         .token = token,
                         .content_type = "application/json",
                         .extra = extra,
                         .body = body,
                         .body_len = strlen(body)};
    struct evbuffer *e = build_request(b, &o);
    hc_send(h, e);
    evbuffer_free(e);
}

/* ---- runs --------------------------------------------------------------------------------------
 */
static void runs_path(char *out, size_t n, const char *agent)
{
    snprintf(out, n, "/v1/ag-ui/agents/%s/runs", agent);
}

static void start_run(struct slot *s)
{
    struct soak *b = s->b;
    struct run *r = &s->r;
    uint64_t rng = b->seed ^ (0x5851f42d4c957f2dULL * (b->runs_started + 1));
    char path[160], extra[256], *body;
    enum kind k;

    memset(r, 0, sizeof(*r));
    r->index = b->runs_started++;
    k = (enum kind)pick(&rng, b->mix, K_N);
    {
        unsigned nv = 0;
        while (nv < MAX_VARIANTS && variant_names[k][nv])
            nv++;
        r->variant = pick(&rng, variant_weights[k], nv);
    }
    r->kind = k;
    r->start_us = mono_us();
    snprintf(r->thread_id, sizeof(r->thread_id), "%s-t%u-%" PRIu64, b->prefix, s->id, r->index);
    snprintf(r->run_id, sizeof(r->run_id), "%s-r%u-%" PRIu64, b->prefix, s->id, r->index);
    b->ks[k].runs++;
    b->ks[k].v_runs[r->variant]++;
    s->running = true;
    s->aux.active = false;
    s->main.active = false;
    {
        struct timeval tv;
        tv.tv_sec = (time_t)b->run_timeout;
        tv.tv_usec = (suseconds_t)((b->run_timeout - (double)tv.tv_sec) * 1e6);
        evtimer_add(s->timer, &tv);
    }

    switch (k) {
    case K_NORMAL:
        if (r->variant == V_BIG) {
            r->n_content = range(&rng, 100, 300);
            r->size = range(&rng, 512, 2048);
        } else {
            r->n_content = range(&rng, 1, 64);
            r->size = range(&rng, 1, 256);
        }
        snprintf(extra, sizeof(extra), "X-Demo-Events: %u\r\nX-Demo-Size: %u\r\n", r->n_content,
                 r->size);
        body = run_body(r, "Hello", false, true);
        runs_path(path, sizeof(path), "chat");
        send_json(b, &s->main, path, b->token, extra, body);
        free(body);
        break;
    case K_CANCEL:
    case K_CUT:
        body = run_body(r, "Hello", false, true);
        runs_path(path, sizeof(path),
                  r->variant == V_STALL    ? "stall"
                  : r->variant == V_SLOW   ? "slow"
                  : r->variant == V_FAST   ? "fast"
                  : r->variant == V_DETACH ? "detach"
                                           : "detach-stall");
        send_json(b, &s->main, path, b->token, NULL, body);
        free(body);
        r->aux_needed = k == K_CANCEL || r->variant == V_DETACH_CANCEL;
        break;
    case K_HITL:
        body = run_body(r, "delete the logs", true, true);
        runs_path(path, sizeof(path), "hitl");
        send_json(b, &s->main, path, b->token, NULL, body);
        free(body);
        r->aux_needed = true;
        break;
    case K_UPSTREAM:
        body = run_body(r, "Hello", false, true);
        extra[0] = '\0';
        switch (r->variant) {
        case V_500:
            runs_path(path, sizeof(path), "err");
            break;
        case V_503:
            runs_path(path, sizeof(path), "err");
            snprintf(extra, sizeof(extra), "X-Demo-Status: 503\r\n");
            break;
        case V_DOWN:
            runs_path(path, sizeof(path), "down");
            break;
        case V_DROP:
            runs_path(path, sizeof(path), "drop");
            break;
        case V_DROP0:
            runs_path(path, sizeof(path), "drop");
            snprintf(extra, sizeof(extra), "X-Demo-Drop-After: 0\r\n");
            break;
        default: /* V_TIMEOUT: a stream that would start after the first-byte timeout */
            runs_path(path, sizeof(path), "err");
            snprintf(extra, sizeof(extra),
                     "X-Demo-Status: 200\r\nX-Demo-First-Byte-Delay-Ms: %u\r\n", 60000u);
            break;
        }
        send_json(b, &s->main, path, b->token, extra, body);
        free(body);
        break;
    case K_INVALID: {
        struct req_opts o = {.token = b->token, .content_type = "application/json"};
        struct evbuffer *e;
        char *good = run_body(r, "Hello", false, true);
        char *norun = NULL;
        runs_path(path, sizeof(path), "chat");
        o.path = path;
        o.body = good;
        o.body_len = strlen(good);
        switch (r->variant) {
        case V_BADJSON:
            o.body_len = strlen(good) / 2; /* cut in the middle: not JSON */
            break;
        case V_NORUNID:
            norun = run_body(r, "Hello", false, false);
            o.body = norun;
            o.body_len = strlen(norun);
            break;
        case V_BADTOKEN:
            o.token = "not-the-soak-token";
            break;
        case V_NOTOKEN:
            o.token = NULL;
            break;
        case V_NOAGENT:
            runs_path(path, sizeof(path), "no-such-agent");
            break;
        case V_BIGBODY:
            o.body = b->big_body;
            o.body_len = b->big_body_len;
            break;
        case V_BIGBODY_EXPECT:
            o.body = b->big_body;
            o.body_len = b->big_body_len;
            o.expect = true;
            break;
        case V_CTYPE:
            o.content_type = "text/plain";
            break;
        default: /* V_CANCEL_UNKNOWN */
            snprintf(path, sizeof(path), "/v1/ag-ui/agents/stall/runs/%s-none/cancel", r->run_id);
            o.content_type = NULL;
            o.no_length = true;
            break;
        }
        e = build_request(b, &o);
        hc_send(&s->main, e);
        evbuffer_free(e);
        free(good);
        free(norun);
        break;
    }
    case K_N:
        abort();
    }
}

/* An SSE event of the run's main stream (NULL: the frame's data was not JSON). */
static void slot_on_event(struct slot *s, struct hc *h, json_t *ev)
{
    struct run *r = &s->r;
    const char *type;

    if (h != &s->main || !s->running) {
        r->n_bad_frames++;
        return;
    }
    s->b->events++;
    r->last_event_us = mono_us();
    if (!json_is_object(ev) || !(type = json_string_value(json_object_get(ev, "type")))) {
        r->n_bad_frames++;
        return;
    }
    if (r->saw_finished || r->saw_error)
        r->n_after_terminal++;
    r->n_events++;
    if (r->n_events == 1)
        snprintf(r->first_type, sizeof(r->first_type), "%s", type);
    snprintf(r->last_type, sizeof(r->last_type), "%s", type);
    if (strcmp(type, "RUN_STARTED") == 0 || strcmp(type, "RUN_FINISHED") == 0) {
        const char *t = json_string_value(json_object_get(ev, "threadId"));
        const char *ru = json_string_value(json_object_get(ev, "runId"));
        if (!t || !ru || strcmp(t, r->thread_id) != 0 || strcmp(ru, r->run_id) != 0)
            r->n_bad_ids++;
        if (type[4] == 'F')
            r->saw_finished = true;
    } else if (strcmp(type, "RUN_ERROR") == 0) {
        const char *c = json_string_value(json_object_get(ev, "code"));
        r->saw_error = true;
        snprintf(r->error_code, sizeof(r->error_code), "%s", c ? c : "");
    } else if (strcmp(type, "TEXT_MESSAGE_CONTENT") == 0) {
        json_t *d = json_object_get(ev, "delta");
        size_t n = json_string_length(d);
        r->n_content_seen++;
        r->text_bytes += n;
        if (r->after_tool && r->text_len + 1 < sizeof(r->text)) {
            size_t k = sizeof(r->text) - 1 - r->text_len;
            if (k > n)
                k = n;
            memcpy(r->text + r->text_len, json_string_value(d), k);
            r->text_len += k;
            r->text[r->text_len] = '\0';
        }
    } else if (strcmp(type, "TOOL_CALL_START") == 0) {
        const char *id = json_string_value(json_object_get(ev, "toolCallId"));
        const char *name = json_string_value(json_object_get(ev, "toolCallName"));
        snprintf(r->tool_call_id, sizeof(r->tool_call_id), "%s", id ? id : "");
        snprintf(r->tool_name, sizeof(r->tool_name), "%s", name ? name : "");
    } else if (strcmp(type, "TOOL_CALL_END") == 0) {
        r->saw_tool_end = true;
        r->after_tool = true;
    }
    if (r->kind == K_CUT && r->n_events >= CUT_AFTER_EVENTS)
        r->cut_wanted = true;
    if ((r->kind == K_CANCEL || r->kind == K_CUT) && r->n_events == CUT_AFTER_EVENTS)
        slot_kick(s);
    if (r->kind == K_HITL && r->saw_tool_end && !r->aux_sent)
        slot_kick(s);
}

static void note_reason(struct soak *b, const char *reason)
{
    for (size_t i = 0; i < b->n_reasons; i++) {
        if (strcmp(b->reasons[i].reason, reason) == 0) {
            b->reasons[i].n++;
            return;
        }
    }
    b->reasons = agw_xrealloc(b->reasons, (b->n_reasons + 1) * sizeof(*b->reasons));
    b->reasons[b->n_reasons].reason = agw_xstrdup(reason);
    b->reasons[b->n_reasons].n = 1;
    b->n_reasons++;
}

static const char *err_body_text(struct hc *h)
{
    evbuffer_add(h->err_body, "", 1);
    return (const char *)evbuffer_pullup(h->err_body, -1);
}

/* Checks a non-stream answer: the status and a JSON body {"error": "..."}; "" when it matches. */
static const char *check_error_answer(struct hc *h, int want)
{
    json_t *o;
    bool ok;
    static char why[96];

    if (h->failed)
        return h->fail_reason;
    if (h->status != want) {
        snprintf(why, sizeof(why), "status %d, expected %d", h->status, want);
        return why;
    }
    o = json_loads(err_body_text(h), 0, NULL);
    ok = json_is_string(json_object_get(o, "error"));
    json_decref(o);
    return ok ? "" : "error answer without a JSON {\"error\":...} body";
}

/* Checks the main stream of an SSE run: 200, SSE, clean end, ids, lifecycle. <last> is the
 * expected last event type, <code> the expected RUN_ERROR code (NULL: any). */
static const char *check_stream(struct slot *s, const char *last, const char *code)
{
    struct run *r = &s->r;
    struct hc *h = &s->main;
    static char why[160];

    if (h->status && h->status != 200) {
        snprintf(why, sizeof(why), "status %d, expected 200", h->status);
        return why;
    }
    if (h->failed)
        return h->fail_reason;
    if (!h->sse)
        return "not text/event-stream";
    if (!r->main_clean_end)
        return "the stream did not end with its last chunk";
    if (r->n_bad_frames)
        return "a frame that is not a JSON AG-UI event";
    if (strcmp(r->first_type, "RUN_STARTED") != 0)
        return "first event is not RUN_STARTED";
    if (r->n_bad_ids)
        return "RUN_STARTED/RUN_FINISHED with other ids than the request's";
    if (r->n_after_terminal)
        return "events after the terminal event";
    if (strcmp(r->last_type, last) != 0) {
        snprintf(why, sizeof(why), "last event %s, expected %s", r->last_type, last);
        return why;
    }
    if (code && strcmp(r->error_code, code) != 0) {
        snprintf(why, sizeof(why), "RUN_ERROR code '%s', expected '%s'", r->error_code, code);
        return why;
    }
    return "";
}

static const char *check_aux(struct slot *s, const char *status_word)
{
    struct hc *h = &s->aux;
    json_t *o;
    const char *why = "";
    static char buf[128];

    if (h->failed)
        return h->fail_reason;
    if (h->status != 202) {
        snprintf(buf, sizeof(buf), "%s answered %d, expected 202", status_word, h->status);
        return buf;
    }
    o = json_loads(err_body_text(h), 0, NULL);
    if (!json_is_object(o) ||
        strcmp(json_string_value(json_object_get(o, "status")) ?: "", status_word) != 0 ||
        strcmp(json_string_value(json_object_get(o, "runId")) ?: "", s->r.run_id) != 0 ||
        strcmp(json_string_value(json_object_get(o, "threadId")) ?: "", s->r.thread_id) != 0)
        why = "202 body without the expected status, threadId and runId";
    json_decref(o);
    return why;
}

static const char *verdict(struct slot *s)
{
    struct run *r = &s->r;
    struct hc *m = &s->main;
    const char *why;
    static char buf[192];

    switch (r->kind) {
    case K_NORMAL:
        why = check_stream(s, "RUN_FINISHED", NULL);
        if (*why)
            return why;
        if (r->n_content_seen != r->n_content ||
            r->text_bytes != (uint64_t)r->n_content * r->size || r->n_events != r->n_content + 4) {
            snprintf(buf, sizeof(buf),
                     "%u events, %u content events, %" PRIu64
                     " text bytes; expected %u, %u, %" PRIu64,
                     r->n_events, r->n_content_seen, r->text_bytes, r->n_content + 4, r->n_content,
                     (uint64_t)r->n_content * r->size);
            return buf;
        }
        return "";
    case K_CANCEL:
        if (!r->aux_sent)
            return m->failed ? m->fail_reason : "the stream ended before the cancel";
        why = check_aux(s, "cancelled");
        if (*why)
            return why;
        return check_stream(s, "RUN_ERROR", "CANCELLED");
    case K_CUT:
        if (!r->cut_done) {
            if (m->failed)
                return m->fail_reason;
            snprintf(buf, sizeof(buf),
                     "status %d; the stream ended after %u events, before the cut", m->status,
                     r->n_events);
            return buf;
        }
        if (m->status != 200 || !m->sse)
            return "not a 200 event stream";
        if (strcmp(r->first_type, "RUN_STARTED") != 0 || r->n_bad_ids || r->n_bad_frames)
            return "a bad stream before the cut";
        if (r->variant == V_DETACH_CANCEL) {
            if (!r->aux_sent)
                return "no cancel sent";
            return check_aux(s, "cancelled");
        }
        return "";
    case K_HITL:
        if (!r->aux_sent)
            return m->failed ? m->fail_reason : "the stream ended before TOOL_CALL_END";
        why = check_aux(s, "decision_forwarded");
        if (*why)
            return why;
        why = check_stream(s, "RUN_FINISHED", NULL);
        if (*why)
            return why;
        if (strcmp(r->tool_name, "confirmAction") != 0)
            return "no confirmAction tool call";
        if (!strstr(r->text, r->variant == V_APPROVE ? "Successfully deleted" : "Cancelled")) {
            snprintf(buf, sizeof(buf), "the answer after the decision was '%.80s'", r->text);
            return buf;
        }
        if (r->n_events != 11) {
            snprintf(buf, sizeof(buf), "%u events, expected 11", r->n_events);
            return buf;
        }
        return "";
    case K_UPSTREAM:
        switch (r->variant) {
        case V_500:
        case V_503:
        case V_DOWN:
            return check_error_answer(m, 502);
        case V_TIMEOUT:
            return check_error_answer(m, 504);
        default: /* V_DROP, V_DROP0 */
            why = check_stream(s, "RUN_ERROR", "UPSTREAM_ERROR");
            if (*why)
                return why;
            /* drop3: RUN_STARTED, TEXT_MESSAGE_START, one content, then the cut: the message is
             * closed (TEXT_MESSAGE_END) before the RUN_ERROR. */
            if (r->n_events != (r->variant == V_DROP ? 5u : 2u)) {
                snprintf(buf, sizeof(buf), "%u events, expected %u", r->n_events,
                         r->variant == V_DROP ? 5u : 2u);
                return buf;
            }
            return "";
        }
    case K_INVALID: {
        static const int want[] = {
            [V_BADJSON] = 400,        [V_NORUNID] = 422, [V_BADTOKEN] = 401,
            [V_NOTOKEN] = 401,        [V_NOAGENT] = 404, [V_BIGBODY] = 413,
            [V_BIGBODY_EXPECT] = 413, [V_CTYPE] = 415,   [V_CANCEL_UNKNOWN] = 404,
        };
        why = check_error_answer(m, want[r->variant]);
        if (*why)
            return why;
        if (want[r->variant] == 401 && !m->www_auth)
            return "401 without WWW-Authenticate: Bearer";
        return "";
    }
    case K_N:
        break;
    }
    return "unknown kind";
}

static void hc_settle(struct hc *h)
{
    if (h->active) {
        if (h->state != HC_DONE || !h->keep_alive || h->unexpected_bytes)
            hc_close(h);
        else
            h->state = HC_IDLE;
    }
    h->active = false;
}

static void run_finish(struct slot *s, const char *forced_reason)
{
    struct soak *b = s->b;
    struct run *r = &s->r;
    const char *why = forced_reason ? forced_reason : verdict(s);
    struct kind_stats *ks = &b->ks[r->kind];

    evtimer_del(s->timer);
    s->running = false;
    b->runs_done++;
    if (*why == '\0') {
        ks->ok++;
    } else {
        char reason[256];
        ks->mismatch++;
        ks->v_mismatch[r->variant]++;
        snprintf(reason, sizeof(reason), "%s/%s: %s", kind_names[r->kind],
                 variant_names[r->kind][r->variant], why);
        note_reason(b, reason);
        if (b->reported < b->max_report) {
            b->reported++;
            fprintf(stderr,
                    "agw-soak: mismatch: run %" PRIu64
                    " %s/%s thread %s run %s: %s (main: status %d, %u events, first %s, last %s,"
                    " code '%s', clean end %d%s%s; aux: sent %d, status %d%s%s; %.1f ms)\n",
                    r->index, kind_names[r->kind], variant_names[r->kind][r->variant], r->thread_id,
                    r->run_id, why, s->main.status, r->n_events, r->first_type, r->last_type,
                    r->error_code, r->main_clean_end, s->main.failed ? ", failed: " : "",
                    s->main.failed ? s->main.fail_reason : "", r->aux_sent, s->aux.status,
                    s->aux.failed ? ", failed: " : "", s->aux.failed ? s->aux.fail_reason : "",
                    (double)(mono_us() - r->start_us) / 1000.0);
        }
    }
    /* A connection used by the run whose response is not complete, or that may not be reused,
     * is closed; the others stay for the next run. */
    hc_settle(&s->main);
    hc_settle(&s->aux);
}

/* Whether the main connection is finished with the current run. */
static bool main_over(const struct slot *s)
{
    return s->main.failed || s->main.state == HC_DONE || s->r.cut_done;
}

static bool aux_over(const struct slot *s)
{
    return !s->r.aux_sent || s->aux.failed || s->aux.state == HC_DONE;
}

static void slot_step(evutil_socket_t fd, short what, void *arg)
{
    struct slot *s = arg;
    struct soak *b = s->b;
    struct run *r = &s->r;
    char path[200];

    (void)fd;
    (void)what;
    if (s->done)
        return;
    if (s->running) {
        /* the triggers */
        if (r->kind == K_CUT && !r->cut_done && r->cut_wanted) {
            hc_close(&s->main); /* the client goes away mid-stream */
            r->cut_done = true;
        }
        if (((r->kind == K_CANCEL && r->n_events >= CUT_AFTER_EVENTS && !s->main.failed) ||
             (r->kind == K_CUT && r->variant == V_DETACH_CANCEL && r->cut_done)) &&
            !r->aux_sent) {
            struct req_opts o = {.path = path, .token = b->token, .no_length = true};
            struct evbuffer *e;
            snprintf(path, sizeof(path), "/v1/ag-ui/agents/%s/runs/%s/cancel",
                     r->kind == K_CUT        ? "detach-stall"
                     : r->variant == V_STALL ? "stall"
                                             : "slow",
                     r->run_id);
            e = build_request(b, &o);
            hc_send(&s->aux, e);
            evbuffer_free(e);
            r->aux_sent = true;
        }
        if (r->kind == K_HITL && !r->aux_sent && r->saw_tool_end && !s->main.failed) {
            json_t *o =
                json_pack("{s:s,s:s,s:[{s:s,s:s,s:s,s:s}]}", "threadId", r->thread_id, "runId",
                          r->run_id, "messages", "id", "d1", "role", "tool", "toolCallId",
                          r->tool_call_id, "content", r->variant == V_APPROVE ? "true" : "false");
            char *body = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
            json_decref(o);
            if (!body)
                abort();
            runs_path(path, sizeof(path), "hitl");
            send_json(b, &s->aux, path, b->token, NULL, body);
            free(body);
            r->aux_sent = true;
        }
        if (!main_over(s))
            return;
        /* a run that still needs its second request once the stream is over cannot get it */
        if (!aux_over(s))
            return;
        run_finish(s, NULL);
    }
    if (b->stopping || b->runs_started >= b->runs_total) {
        s->done = true;
        hc_close(&s->main);
        hc_close(&s->aux);
        if (--b->active_slots == 0)
            soak_stop(b);
        return;
    }
    start_run(s);
}

static void slot_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct slot *s = arg;
    char why[200];

    (void)fd;
    (void)what;
    if (!s->running)
        return;
    if (s->r.last_event_us)
        fprintf(stderr, "agw-soak: run %" PRIu64 " %s: timed out; its last event came %.1f s ago\n",
                s->r.index, s->r.run_id, (double)(mono_us() - s->r.last_event_us) / 1e6);
    snprintf(why, sizeof(why),
             "no outcome within %.0f s (main state %d, aux state %d, last event '%s')",
             s->b->run_timeout, (int)s->main.state, (int)s->aux.state, s->r.last_type);
    hc_close(&s->main);
    hc_close(&s->aux);
    s->main.active = s->aux.active = false;
    run_finish(s, why);
    slot_kick(s);
}

/* ---- results -----------------------------------------------------------------------------------
 */
static uint64_t total_mismatches(const struct soak *b)
{
    uint64_t n = 0;
    for (unsigned k = 0; k < K_N; k++)
        n += b->ks[k].mismatch;
    return n;
}

static void print_results(struct soak *b)
{
    json_t *o = json_object(), *kinds = json_object(), *st = json_object(), *rs = json_object();
    double el;
    char *txt;
    uint64_t ok = 0;

    if (!b->t_end_us)
        b->t_end_us = mono_us();
    el = (double)(b->t_end_us - b->t_start_us) / 1e6;
    for (unsigned k = 0; k < K_N; k++) {
        json_t *v = json_object();
        json_t *ko = json_pack("{s:I,s:I,s:I}", "runs", (json_int_t)b->ks[k].runs, "ok",
                               (json_int_t)b->ks[k].ok, "mismatch", (json_int_t)b->ks[k].mismatch);
        ok += b->ks[k].ok;
        for (unsigned i = 0; i < MAX_VARIANTS && variant_names[k][i]; i++)
            json_object_set_new(v, variant_names[k][i],
                                json_pack("{s:I,s:I}", "runs", (json_int_t)b->ks[k].v_runs[i],
                                          "mismatch", (json_int_t)b->ks[k].v_mismatch[i]));
        json_object_set_new(ko, "variants", v);
        json_object_set_new(kinds, kind_names[k], ko);
    }
    for (unsigned i = 0; i < 600; i++) {
        char k[8];
        if (!b->statuses[i])
            continue;
        snprintf(k, sizeof(k), "%u", i);
        json_object_set_new(st, k, json_integer((json_int_t)b->statuses[i]));
    }
    for (size_t i = 0; i < b->n_reasons; i++)
        json_object_set_new(rs, b->reasons[i].reason, json_integer((json_int_t)b->reasons[i].n));
    json_object_set_new(o, "label", json_string(b->prefix));
    json_object_set_new(o, "runs_planned", json_integer((json_int_t)b->runs_total));
    json_object_set_new(o, "runs", json_integer((json_int_t)b->runs_done));
    json_object_set_new(o, "ok", json_integer((json_int_t)ok));
    json_object_set_new(o, "mismatches", json_integer((json_int_t)total_mismatches(b)));
    json_object_set_new(o, "incomplete", json_integer((json_int_t)(b->runs_total - b->runs_done)));
    json_object_set_new(o, "elapsed_s", json_real(el));
    json_object_set_new(o, "runs_per_s", json_real(el > 0 ? (double)b->runs_done / el : 0.0));
    json_object_set_new(o, "requests", json_integer((json_int_t)b->requests));
    json_object_set_new(o, "connects", json_integer((json_int_t)b->connects));
    json_object_set_new(o, "connect_failures", json_integer((json_int_t)b->connect_failures));
    json_object_set_new(o, "events", json_integer((json_int_t)b->events));
    json_object_set_new(o, "body_bytes", json_integer((json_int_t)b->body_bytes));
    json_object_set_new(o, "stray_bytes", json_integer((json_int_t)b->stray_bytes));
    json_object_set_new(o, "timed_out", json_boolean(b->timed_out));
    json_object_set_new(o, "interrupted", json_boolean(b->interrupted));
    json_object_set_new(o, "kinds", kinds);
    json_object_set_new(o, "statuses", st);
    json_object_set_new(o, "mismatch_reasons", rs);
    txt = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    if (!txt)
        abort();
    printf("%s\n", txt);
    fflush(stdout);
    free(txt);
    json_decref(o);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    struct soak *b = arg;
    (void)fd;
    (void)what;
    b->timed_out = true;
    soak_stop(b);
}

static void on_signal(evutil_socket_t fd, short what, void *arg)
{
    struct soak *b = arg;
    (void)fd;
    (void)what;
    b->interrupted = true;
    soak_stop(b);
}

static void on_progress(evutil_socket_t fd, short what, void *arg)
{
    struct soak *b = arg;
    double el = (double)(mono_us() - b->t_start_us) / 1e6;
    (void)fd;
    (void)what;
    fprintf(stderr,
            "agw-soak: %s: %" PRIu64 "/%" PRIu64 " runs, %" PRIu64 " mismatches, %.0f runs/s\n",
            b->prefix, b->runs_done, b->runs_total, total_mismatches(b),
            el > 0 ? (double)b->runs_done / el : 0.0);
}

/* ---- main --------------------------------------------------------------------------------------
 */
static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: agw-soak --url http://127.0.0.1:PORT --token TOKEN [options]\n"
        "  --runs N            runs in total (default 100000)\n"
        "  --concurrency C     runs at once (default 64)\n"
        "  --mix LIST          weights, default normal=50,cancel=10,cut=10,hitl=10,upstream=10,"
        "invalid=10\n"
        "  --seed S            the runs drawn (default 1)\n"
        "  --prefix P          threadId/runId prefix, unique per invocation (default soak)\n"
        "  --max-body BYTES    the gateway's limits.max_body_bytes (default 65536)\n"
        "  --run-timeout S     a run without an outcome after S seconds is a mismatch (60)\n"
        "  --duration S        stop after S seconds whatever is left (default 3600)\n"
        "  --max-report N      mismatches described on stderr (default 20)\n"
        "  --progress S        a progress line on stderr every S seconds (default 10, 0 = off)\n"
        "The gateway must serve the agents chat, stall, slow, fast, detach, detach-stall, hitl,\n"
        "err, drop and down "
        "as bench/soak.sh configures them. Prints one JSON object on stdout; exit 0 when every\n"
        "run matched.\n");
}

static int parse_url(struct soak *b, const char *url)
{
    char host[64];
    const char *p, *colon, *end;
    long port;

    if (strncmp(url, "http://", 7) != 0)
        return -1;
    p = url + 7;
    end = p + strcspn(p, "/");
    colon = memchr(p, ':', (size_t)(end - p));
    if (!colon || (size_t)(colon - p) >= sizeof(host))
        return -1;
    memcpy(host, p, (size_t)(colon - p));
    host[colon - p] = '\0';
    port = strtol(colon + 1, NULL, 10);
    if (port <= 0 || port > 65535)
        return -1;
    memset(&b->addr, 0, sizeof(b->addr));
    b->addr.sin_family = AF_INET;
    b->addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &b->addr.sin_addr) != 1)
        return -1;
    snprintf(b->host_hdr, sizeof(b->host_hdr), "%.*s", (int)(end - p), p);
    return 0;
}

static int parse_mix(struct soak *b, const char *s)
{
    char *copy = agw_xstrdup(s), *save = NULL, *tok;
    unsigned total = 0;

    memset(b->mix, 0, sizeof(b->mix));
    for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        unsigned k;
        if (!eq)
            goto bad;
        *eq = '\0';
        for (k = 0; k < K_N && strcmp(kind_names[k], tok) != 0; k++)
            ;
        if (k == K_N)
            goto bad;
        b->mix[k] = (unsigned)strtoul(eq + 1, NULL, 10);
        total += b->mix[k];
    }
    free(copy);
    return total ? 0 : -1;
bad:
    free(copy);
    return -1;
}

static double parse_num(const char *opt, const char *s, double min, double max)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || v < min || v > max) {
        fprintf(stderr, "agw-soak: %s: expects a number in %g..%g, got '%s'\n", opt, min, max, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"url", required_argument, NULL, 'u'},
        {"token", required_argument, NULL, 't'},
        {"runs", required_argument, NULL, 'r'},
        {"concurrency", required_argument, NULL, 'c'},
        {"mix", required_argument, NULL, 'm'},
        {"seed", required_argument, NULL, 's'},
        {"prefix", required_argument, NULL, 'p'},
        {"max-body", required_argument, NULL, 'B'},
        {"run-timeout", required_argument, NULL, 'T'},
        {"duration", required_argument, NULL, 'd'},
        {"max-report", required_argument, NULL, 'R'},
        {"progress", required_argument, NULL, 'P'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct soak *b = agw_xcalloc(1, sizeof(*b));
    const char *url = NULL;
    int ch, rc = 1;

    b->runs_total = 100000;
    b->concurrency = 64;
    b->seed = 1;
    b->prefix = "soak";
    b->max_body = 65536;
    b->run_timeout = 60;
    b->duration = 3600;
    b->max_report = 20;
    b->progress_s = 10;
    parse_mix(b, "normal=50,cancel=10,cut=10,hitl=10,upstream=10,invalid=10");
    while ((ch = getopt_long(argc, argv, "u:t:r:c:m:s:p:B:T:d:R:P:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'u':
            url = optarg;
            break;
        case 't':
            b->token = optarg;
            break;
        case 'r':
            b->runs_total = (uint64_t)parse_num("--runs", optarg, 1, 1e9);
            break;
        case 'c':
            b->concurrency = (unsigned)parse_num("--concurrency", optarg, 1, 10000);
            break;
        case 'm':
            if (parse_mix(b, optarg) < 0) {
                fprintf(stderr, "agw-soak: --mix: expects kind=weight,... with kinds normal, "
                                "cancel, cut, hitl, upstream, invalid\n");
                return 2;
            }
            break;
        case 's':
            b->seed = (uint64_t)parse_num("--seed", optarg, 0, 1e18);
            break;
        case 'p':
            b->prefix = optarg;
            break;
        case 'B':
            b->max_body = (size_t)parse_num("--max-body", optarg, 1024, 64 << 20);
            break;
        case 'T':
            b->run_timeout = parse_num("--run-timeout", optarg, 1, 86400);
            break;
        case 'd':
            b->duration = parse_num("--duration", optarg, 1, 864000);
            break;
        case 'R':
            b->max_report = (unsigned)parse_num("--max-report", optarg, 0, 1e6);
            break;
        case 'P':
            b->progress_s = parse_num("--progress", optarg, 0, 86400);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!url || !b->token || optind != argc) {
        usage(stderr);
        return 2;
    }
    if (parse_url(b, url) < 0) {
        fprintf(stderr, "agw-soak: --url: expects http://IPV4:PORT, got '%s'\n", url);
        return 2;
    }
    /* a valid RunAgentInput a little over the limit: it fits in the socket buffers at once */
    {
        static const char head[] = "{\"threadId\":\"big\",\"runId\":\"big\",\"messages\":[{\"id\":"
                                   "\"m1\",\"role\":\"user\",\"content\":\"";
        static const char tail[] = "\"}]}";
        size_t fill = b->max_body + 2048;
        b->big_body_len = strlen(head) + fill + strlen(tail);
        b->big_body = agw_xmalloc(b->big_body_len + 1);
        memcpy(b->big_body, head, strlen(head));
        memset(b->big_body + strlen(head), 'x', fill);
        memcpy(b->big_body + strlen(head) + fill, tail, strlen(tail) + 1);
    }

    signal(SIGPIPE, SIG_IGN);
    b->base = event_base_new();
    if (!b->base)
        goto out;
    b->slots = agw_xcalloc(b->concurrency, sizeof(*b->slots));
    for (unsigned i = 0; i < b->concurrency; i++) {
        struct slot *s = &b->slots[i];
        s->b = b;
        s->id = i;
        hc_init(&s->main, s, "main");
        hc_init(&s->aux, s, "aux");
        s->step_ev = event_new(b->base, -1, 0, slot_step, s);
        s->timer = evtimer_new(b->base, slot_timeout, s);
    }
    b->active_slots = b->concurrency;
    b->deadline = evtimer_new(b->base, on_deadline, b);
    b->sig_term = evsignal_new(b->base, SIGTERM, on_signal, b);
    b->sig_int = evsignal_new(b->base, SIGINT, on_signal, b);
    {
        struct timeval tv;
        tv.tv_sec = (time_t)b->duration;
        tv.tv_usec = 0;
        evtimer_add(b->deadline, &tv);
    }
    if (b->progress_s > 0) {
        struct timeval tv;
        tv.tv_sec = (time_t)b->progress_s;
        tv.tv_usec = (suseconds_t)((b->progress_s - (double)tv.tv_sec) * 1e6);
        b->progress = event_new(b->base, -1, EV_PERSIST, on_progress, b);
        event_add(b->progress, &tv);
    }
    evsignal_add(b->sig_term, NULL);
    evsignal_add(b->sig_int, NULL);
    b->t_start_us = mono_us();
    for (unsigned i = 0; i < b->concurrency; i++)
        slot_kick(&b->slots[i]);
    event_base_dispatch(b->base);
    print_results(b);
    rc = total_mismatches(b) || b->timed_out || b->interrupted || b->runs_done != b->runs_total ||
                 b->stray_bytes
             ? 1
             : 0;
out:
    if (b->slots) {
        for (unsigned i = 0; i < b->concurrency; i++) {
            hc_free(&b->slots[i].main);
            hc_free(&b->slots[i].aux);
            event_free(b->slots[i].step_ev);
            event_free(b->slots[i].timer);
        }
        free(b->slots);
    }
    if (b->deadline)
        event_free(b->deadline);
    if (b->progress)
        event_free(b->progress);
    if (b->sig_term)
        event_free(b->sig_term);
    if (b->sig_int)
        event_free(b->sig_int);
    if (b->base)
        event_base_free(b->base);
    for (size_t i = 0; i < b->n_reasons; i++)
        free(b->reasons[i].reason);
    free(b->reasons);
    free(b->big_body);
    free(b);
    return rc;
}
