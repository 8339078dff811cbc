/* The relay: one client stream ↔ one upstream exchange. See include/agw/relay.h for the contract
 * and doc/internals/relay.md for the design (backpressure, timers, ownership).
 *
 * The relay is a state machine whose state is exactly the enum below: every transition goes
 * through set_state(), which checks it against the table and arms or disarms the timers that
 * belong to the states left and entered. Lifetime: the relay is freed in CLOSED only, and never
 * while one of its own callbacks is on the stack (`busy` counts them; the outermost frees it). */
#include "config.h"

#include <assert.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "agw/agkit.h"
#include "agw/agui.h"
#include "agw/capture.h"
#include "agw/log.h"
#include "agw/relay.h"
#include "agw/sse.h"

enum relay_state {
    RL_ST_CONNECTING = 0, /* reaching the upstream (retries included); the client has no answer */
    RL_ST_DEFERRED,       /* the upstream answered a stream; the client's 200 waits for its first
                             event (a decision's answer: an empty stream is a 502 instead) */
    RL_ST_STREAMING,      /* the client has its 200; frames flow (heartbeat timer) */
    RL_ST_DETACHED,  /* the client left, the agent says "detach": the run goes on to its end (still
                        connecting or streaming), its events counted and dropped */
    RL_ST_FINISHING, /* the answer is complete (a terminal event, or an error answer): the client
                        takes it */
    RL_ST_CANCELLED, /* as FINISHING, after agw_relay_cancel(): the upstream was closed, not read
                        to its end */
    RL_ST_CLOSED,    /* over: the client's request is gone, or the detached run ended; freed as
                        soon as no callback of the relay runs */
    RL_N_STATES
};

static const char *const state_names[RL_N_STATES] = {
    "CONNECTING", "DEFERRED", "STREAMING", "DETACHED", "FINISHING", "CANCELLED", "CLOSED"};

#define TO(s) (1u << (s))
/* The transitions that exist; set_state() asserts them. */
static const unsigned transitions[RL_N_STATES] = {
    [RL_ST_CONNECTING] = TO(RL_ST_CONNECTING) | TO(RL_ST_DEFERRED) | TO(RL_ST_STREAMING) |
                         TO(RL_ST_DETACHED) | TO(RL_ST_FINISHING) | TO(RL_ST_CLOSED),
    [RL_ST_DEFERRED] =
        TO(RL_ST_STREAMING) | TO(RL_ST_DETACHED) | TO(RL_ST_FINISHING) | TO(RL_ST_CLOSED),
    [RL_ST_STREAMING] =
        TO(RL_ST_DETACHED) | TO(RL_ST_FINISHING) | TO(RL_ST_CANCELLED) | TO(RL_ST_CLOSED),
    [RL_ST_DETACHED] = TO(RL_ST_CLOSED),
    [RL_ST_FINISHING] = TO(RL_ST_CLOSED),
    [RL_ST_CANCELLED] = TO(RL_ST_CLOSED),
    [RL_ST_CLOSED] = 0,
};
/* The states in which the run is still going (the upstream is read). */
#define LIVE       (TO(RL_ST_CONNECTING) | TO(RL_ST_DEFERRED) | TO(RL_ST_STREAMING) | TO(RL_ST_DETACHED))
#define IN(r, set) ((TO((r)->state) & (set)) != 0)

struct agw_relay_set {
    struct event_base *base;
    TAILQ_HEAD(, agw_relay) relays;
    size_t count;
    size_t n_captures; /* relays of the set with a capture (agw_relay_set_captures()) */
    /* Relays waiting for the store (store_wait): the timer looks every STORE_WAIT_MS whether it
     * caught up, while any waits. */
    struct event *store_timer;
    size_t n_store_wait;
    struct agw_store *store; /* theirs */
    /* Relays whose capture took lines since the age timer last found it empty: while there are
     * any, the timer hands over what a capture has held since its last tick but one
     * (capture_age_cb()). */
    TAILQ_HEAD(, agw_relay) aging;
    struct event *age_timer;
};

/* How often a loop with runs waiting for the store looks whether it caught up. */
#define STORE_WAIT_MS 5
/* A capture's lines are handed to the store by CAPTURE_FLUSH_BYTES, at the run's end, and at the
 * latest at the second tick of this timer after they were captured (at most twice this), so that
 * what a slow or waiting run relayed reaches the disk within a second too: 600 ms here, the
 * batch's 20 ms and the commit interval's 200 ms. Runs shorter than a tick never take it. */
#define CAPTURE_AGE_MS 300

struct agw_relay {
    struct agw_relay_set *set;
    TAILQ_ENTRY(agw_relay) link;
    enum relay_state state;
    struct agw_req *req; /* the client's request; NULL in DETACHED and CLOSED */
    struct agw_upstream *up;
    struct agw_sse_parser *sse;
    struct agw_agui *agui;
    struct evbuffer *out; /* client frames produced and not yet handed to the server */
    /* The normaliser's events come through <sink>. Frames it passes unchanged are relayed as read:
     * <run> is the run of such frames, adjacent in the read segment being parsed, not yet appended
     * to <out> (appended before anything else is, and before the segment goes). <framed>: the
     * frame being fed sits in the segment as "data: <data>\n\n". */
    struct agw_agui_sink sink;
    const char *run;
    size_t run_len;
    bool framed;
    /* The bytes of the read being parsed, until <out> has a chain for the frames written out of it
     * (out_reserve()); 0: none to make. */
    size_t read_len;
    /* Timers. run_timer: from the start to the end of the run (LIVE states), when timeouts.run is
     * set. heartbeat: in STREAMING only, the heartbeat period, or a probe of a half-closed client
     * (probe set). */
    struct event *heartbeat;
    struct event *run_timer;
    bool probe;
    uint64_t last_write_ms;
    /* parameters: copies in one block (<params>, owned), which the pointers below point into; the
     * first <params_keep> bytes are kept for the whole run, the rest (headers, body) until the
     * upstream answers (see copy_params()) */
    char *params;
    size_t params_keep;
    const char *agent_id, *thread_id, *run_id;
    const char *body;
    size_t body_len;
    struct agw_upstream_header *headers;
    size_t n_headers;
    struct agw_upstream_pool **backends;
    size_t n_backends;
    size_t attempt;      /* index into backends of the current try */
    unsigned tries_left; /* further backends that may be tried */
    bool answered;       /* the upstream's head arrived: no more retries */
    bool flowing;        /* its first event is out (agw_upstream_set_flowing) */
    size_t stream_buffer_bytes;
    uint32_t heartbeat_ms;
    bool detach;        /* the agent's on_client_disconnect is "detach" */
    bool legacy_client; /* AG-UI events are written as legacy AG-Kit ones (doc/dialects.md) */
    bool defer_head;    /* a decision's stream: DEFERRED before STREAMING */
    agw_relay_end_fn *on_end;
    agw_relay_backend_fn *on_backend;
    void *arg;
    /* accounting */
    uint64_t start_ms;
    uint64_t bytes_out;
    int status; /* HTTP status sent to the client, 0 until then */
    const char *outcome;
    enum agw_up_failure upstream_error; /* the last upstream failure, or AGW_UP_OK */
    uint64_t connect_us, first_byte_us; /* the last attempt's (AGW_UP_NOT_MEASURED: none) */
    bool was_detached;                  /* for the summary: the run went on without its client */
    char request_id[72];
    unsigned busy; /* the relay's callbacks on the stack */
    /* the active-run registry */
    struct agw_runs *runs;
    unsigned runs_part;
    struct agw_run_entry *entry; /* while registered */
    /* thread history: what the run produced, handed to the store in pieces and at the end */
    struct agw_store *store;     /* NULL: the run is not recorded */
    struct agw_capture *capture; /* made when an event is to be kept; freed once handed over idle */
    /* Its upstream is paused because the store is behind (agw_store_congested()); the set's timer
     * resumes it. A pause for the client (backpressure) and this one are lifted separately: the
     * upstream is read again when neither holds. */
    bool store_wait;
    bool in_aging;     /* on its set's <aging> list */
    bool capture_aged; /* its capture held lines at the age timer's last tick */
    TAILQ_ENTRY(agw_relay) aging_link;
};

/* A run's capture goes to the store when it holds this much, so a long run never holds its whole
 * output (the store appends the pieces in order). */
#define CAPTURE_FLUSH_BYTES (64 * 1024)

static void relay_free(struct agw_relay *r);
static void drop_retry_params(struct agw_relay *r);
static void heartbeat_cb(evutil_socket_t fd, short what, void *arg);

static void arm(struct event *ev, uint32_t ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};

    evtimer_add(ev, &tv);
}

/* Every transition: checked against the table; the timers of the state left are disarmed and those
 * of the state entered armed. */
static void set_state(struct agw_relay *r, enum relay_state st)
{
    assert(transitions[r->state] & TO(st));
    agw_log_debug("req=%s relay %s -> %s", r->request_id, state_names[r->state], state_names[st]);
    if (r->state == RL_ST_STREAMING && st != RL_ST_STREAMING) {
        evtimer_del(r->heartbeat);
        r->probe = false;
    }
    if (!(TO(st) & LIVE) && r->run_timer != NULL)
        evtimer_del(r->run_timer);
    if (st == RL_ST_STREAMING && r->state != RL_ST_STREAMING && r->heartbeat_ms > 0)
        arm(r->heartbeat, r->heartbeat_ms);
    r->state = st;
}

static void enter(struct agw_relay *r)
{
    r->busy++;
}

/* The outermost callback frees a CLOSED relay as it returns. */
static void leave(struct agw_relay *r)
{
    if (--r->busy == 0 && r->state == RL_ST_CLOSED)
        relay_free(r);
}

static void unregister(struct agw_relay *r)
{
    if (r->entry != NULL) {
        agw_runs_remove(r->runs, r->entry);
        r->entry = NULL;
    }
}

/* Lets go of the upstream exchange: closed (the backend sees it close) with <close>, else released
 * (the rest of its response is read so that its connection can serve another run). */
static void drop_upstream(struct agw_relay *r, bool close)
{
    if (r->up == NULL)
        return;
    r->connect_us = agw_upstream_connect_us(r->up);
    r->first_byte_us = agw_upstream_first_byte_us(r->up);
    if (close)
        agw_upstream_close(r->up);
    else
        agw_upstream_release(r->up);
    r->up = NULL;
}

/* ---- writing to the client ---------------------------------------------------------------- */

/* Before the first bytes a read puts in <out>: the frames written out are about as long as the
 * bytes read, one chain for all of them rather than a small one per kilobyte. A read whose frames
 * all pass unchanged and go to the socket from where they were read (write_run()) makes none. */
static void out_reserve(struct agw_relay *r)
{
    if (r->read_len > 0) {
        evbuffer_expand(r->out, r->read_len + 256);
        r->read_len = 0;
    }
}

/* Appends the run of frames passed unchanged to <out>, in one piece. */
static void flush_run(struct agw_relay *r)
{
    if (r->run_len == 0)
        return;
    out_reserve(r);
    if (evbuffer_add(r->out, r->run, r->run_len) != 0)
        abort(); /* out of memory: the daemon's policy */
    r->run_len = 0;
}

/* Hands what the capture holds to the store: up to AGW_CAPTURE_SMALL_BYTES as a copy (the capture
 * keeps its buffer, freed or reused on this thread), beyond that the buffer itself. */
static void flush_capture(struct agw_relay *r)
{
    size_t len;
    char *lines;
    bool chunk;

    if (r->capture == NULL)
        return;
    if (!agw_capture_in_chunk(r->capture) &&
        agw_capture_size(r->capture) <= AGW_CAPTURE_SMALL_BYTES) {
        const char *held = agw_capture_lines(r->capture, &len);

        if (held != NULL)
            agw_store_run_events_copy(r->store, r->thread_id, r->run_id, held, len);
        agw_capture_clear(r->capture);
        return;
    }
    if ((lines = agw_capture_take(r->capture, &len, &chunk)) != NULL)
        agw_store_run_events(r->store, r->thread_id, r->run_id, lines, len, chunk);
}

static void aging_leave(struct agw_relay *r)
{
    if (!r->in_aging)
        return;
    TAILQ_REMOVE(&r->set->aging, r, aging_link);
    r->in_aging = false;
    r->capture_aged = false;
    if (TAILQ_EMPTY(&r->set->aging))
        event_del(r->set->age_timer);
}

/* The capture of a run that records, made when it first has something to keep: a stream that waits
 * holds none (see capture_age_cb()). */
static struct agw_capture *capture_of(struct agw_relay *r)
{
    if (r->capture == NULL) {
        r->capture = agw_capture_new();
        agw_capture_use_chunks(r->capture, agw_store_chunk, r->store);
        r->set->n_captures++;
    }
    return r->capture;
}

static void capture_free(struct agw_relay *r)
{
    if (r->capture == NULL)
        return;
    agw_capture_free(r->capture);
    r->capture = NULL;
    r->set->n_captures--;
}

/* Hands over each capture that held lines at the last tick and still does, so none waits longer
 * than two ticks; lets go of those it finds empty. Walks only the runs that captured something
 * since (an idle stream is not looked at again). A capture handed over here is freed too: its run
 * has been quiet for a tick or is slow, and an idle stream keeps no capture (112 bytes) while it
 * waits; the next event to keep makes a new one. */
static void capture_age_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_relay_set *set = arg;
    struct agw_relay *r, *next;

    (void)fd;
    (void)what;
    for (r = TAILQ_FIRST(&set->aging); r != NULL; r = next) {
        next = TAILQ_NEXT(r, aging_link);
        if (agw_capture_size(r->capture) > 0 && !r->capture_aged) {
            r->capture_aged = true;
            continue;
        }
        flush_capture(r); /* (nothing when it is empty) */
        aging_leave(r);
        capture_free(r); /* empty now: nothing open, nothing held */
    }
}

/* The capture of <r> (not on the list) took lines: the age timer watches it. */
static void aging_join(struct agw_relay *r)
{
    struct agw_relay_set *set = r->set;
    const struct timeval tick = {.tv_sec = 0, .tv_usec = CAPTURE_AGE_MS * 1000};

    if (TAILQ_EMPTY(&set->aging)) {
        if (set->age_timer == NULL)
            set->age_timer = event_new(set->base, -1, EV_PERSIST, capture_age_cb, set);
        if (set->age_timer == NULL || event_add(set->age_timer, &tick) != 0)
            abort(); /* out of memory: the daemon's policy */
    }
    TAILQ_INSERT_TAIL(&set->aging, r, aging_link);
    r->in_aging = true;
}

/* Whether the client can take more (no client: a detached run). */
static bool client_takes(const struct agw_relay *r)
{
    return r->req == NULL || agw_req_out_pending(r->req) <= r->stream_buffer_bytes;
}

static void store_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_relay_set *set = arg;
    struct agw_relay *r, *next;

    (void)fd;
    (void)what;
    if (set->n_store_wait == 0)
        return;
    if (agw_store_congested(set->store)) {
        arm(set->store_timer, STORE_WAIT_MS);
        return;
    }
    for (r = TAILQ_FIRST(&set->relays); r != NULL; r = next) {
        next = TAILQ_NEXT(r, link);
        if (!r->store_wait)
            continue;
        r->store_wait = false;
        set->n_store_wait--;
        if (r->up != NULL && IN(r, TO(RL_ST_STREAMING) | TO(RL_ST_DETACHED)) && client_takes(r))
            agw_upstream_resume(r->up);
    }
}

/* Stops reading the upstream until the store caught up (store_timer_cb()). */
static void store_pause(struct agw_relay *r)
{
    struct agw_relay_set *set = r->set;

    r->store_wait = true;
    set->store = r->store;
    agw_upstream_pause(r->up);
    if (set->n_store_wait++ == 0) {
        if (set->store_timer == NULL)
            set->store_timer = evtimer_new(set->base, store_timer_cb, set);
        arm(set->store_timer, STORE_WAIT_MS);
    }
}

static void legacy_frame(void *arg, const char *data, size_t len)
{
    struct agw_relay *r = arg;

    out_reserve(r);
    if (agw_sse_write_data(r->out, data, len) != 0)
        abort();
}

/* Captures an event for the thread's history (a run that records). */
static void record(struct agw_relay *r, const char *json, size_t len)
{
    struct agw_agui_content ct;
    const char *type;
    size_t type_len, held;

    /* a delta, or a type, the normaliser's fast path read needs no second scan */
    if (agw_agui_emitting_content(r->agui, &ct)) {
        agw_capture_content(capture_of(r), ct.args, ct.id, ct.id_len, ct.delta, ct.delta_len);
    } else if (agw_agui_emitting_type(r->agui, &type, &type_len)) {
        if (r->capture == NULL && !agw_capture_keeps_typed(type, type_len, json, len))
            return; /* dropped, and no capture is open for it to leave as it is */
        agw_capture_typed(capture_of(r), type, type_len, json, len);
    } else {
        agw_capture_event(capture_of(r), json, len);
    }
    held = agw_capture_size(r->capture);
    if (held >= CAPTURE_FLUSH_BYTES)
        flush_capture(r);
    else if (held > 0 && !r->in_aging)
        aging_join(r); /* (an event it dropped leaves nothing to age) */
}

/* The normaliser's sink: every event for the client. One that passes unchanged, from a frame that
 * sits in the read segment as "data: <data>\n\n", is the client's frame already: it joins the run
 * of such frames when it follows the last one in memory, else starts a new run. Any other event is
 * framed here ("data: <json>\n\n"), after the run. At many small events per read that is one
 * evbuffer_add() per read rather than a framed copy per event. */
static void relay_emit(void *arg, const char *json, size_t len, bool pass)
{
    struct agw_relay *r = arg;

    if (r->store != NULL)
        record(r, json, len);

    if (r->legacy_client) { /* the thread's history keeps the AG-UI events, the client its own */
        flush_run(r);
        agw_agkit_to_legacy(json, len, legacy_frame, r);
        return;
    }
    if (pass && r->framed) {
        const char *f = json - 6; /* "data: " */
        size_t n = len + 8;       /* and "\n\n" */

        if (r->run_len > 0 && r->run + r->run_len == f) {
            r->run_len += n;
            return;
        }
        flush_run(r);
        r->run = f;
        r->run_len = n;
        return;
    }
    flush_run(r);
    out_reserve(r);
    if (agw_sse_write_data(r->out, json, len) != 0)
        abort();
}

static void client_drain(struct agw_req *req, void *arg);
static void probe_client(struct agw_relay *r);

/* Sends the client its 200 and the stream's headers: STREAMING. */
static void start_client_stream(struct agw_relay *r)
{
    static const char fields[] = "Content-Type: text/event-stream\r\n"
                                 "Cache-Control: no-cache\r\n"
                                 "X-Accel-Buffering: no\r\n";

    r->status = 200;
    agw_req_stream_start(r->req, 200, fields, r->stream_buffer_bytes / 2, client_drain);
    r->last_write_ms = agw_now_ms();
    set_state(r, RL_ST_STREAMING);
    if (agw_req_half_closed(r->req))
        probe_client(r);
}

/* Hands <out> to the client; with <last>, ends the response too (in the same write when it can). */
static void flush_out(struct agw_relay *r, bool last)
{
    size_t n = evbuffer_get_length(r->out);

    if (r->req == NULL) { /* detached: nobody to write to */
        evbuffer_drain(r->out, n);
        return;
    }
    if (r->state == RL_ST_DEFERRED) { /* the first events are here */
        if (n == 0)
            return;
        start_client_stream(r);
    }
    r->bytes_out += n;
    if (last) {
        agw_req_stream_finish(r->req, r->out);
        return;
    }
    if (n == 0)
        return;
    agw_req_stream_write(r->req, r->out);
    r->last_write_ms = agw_now_ms_coarse(); /* (on every write: the cheap clock) */
}

/* The heartbeat timer is lazy: it is armed once per period and, when it fires, writes ": ping" only
 * if nothing was written for a whole period; otherwise it sleeps for the rest of the period. No
 * timer work is done per frame. As a probe it writes at once. */
static void heartbeat_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_relay *r = arg;
    uint64_t idle = agw_now_ms() - r->last_write_ms;

    (void)fd;
    (void)what;
    assert(r->state == RL_ST_STREAMING);
    if (r->probe || idle + 5 >= r->heartbeat_ms) {
        r->probe = false;
        enter(r);
        agw_sse_write_comment(r->out, "ping");
        flush_out(r, false);
        leave(r); /* cannot free: the state is still STREAMING */
        if (r->heartbeat_ms > 0)
            arm(r->heartbeat, r->heartbeat_ms);
    } else {
        arm(r->heartbeat, (uint32_t)(r->heartbeat_ms - idle));
    }
}

/* The client closed its sending side: it may be a half-close (it still reads) or a close, which
 * only writing shows (the first write draws a reset, the next one fails and the server's close
 * callback ends the run). So write a ping now and another one shortly. */
#define PROBE_MS 100

static void probe_client(struct agw_relay *r)
{
    agw_sse_write_comment(r->out, "ping");
    flush_out(r, false);
    r->probe = true;
    evtimer_del(r->heartbeat);
    arm(r->heartbeat, PROBE_MS);
}

static void client_half_close(struct agw_req *req, void *arg)
{
    struct agw_relay *r = arg;

    (void)req;
    enter(r);
    if (r->state == RL_ST_STREAMING)
        probe_client(r);
    leave(r);
}

/* ---- ending ------------------------------------------------------------------------------- */

/* The terminal event is in r->out: write it and end the chunked body (FINISHING, or CANCELLED with
 * <cancel>, where the backend must see its connection close), or, detached, end the run (CLOSED).
 */
static void finish(struct agw_relay *r, bool cancel)
{
    if (!IN(r, TO(RL_ST_DEFERRED) | TO(RL_ST_STREAMING) | TO(RL_ST_DETACHED)))
        return;
    r->outcome = agw_agui_outcome(r->agui);
    /* Before the client can see the end: a read that follows the run sees all of it. */
    flush_capture(r);
    unregister(r);
    drop_upstream(r, cancel);
    if (r->state == RL_ST_DETACHED) {
        set_state(r, RL_ST_CLOSED);
        return;
    }
    if (r->state == RL_ST_DEFERRED)
        start_client_stream(r);
    set_state(r, cancel ? RL_ST_CANCELLED : RL_ST_FINISHING);
    flush_out(r, true);
}

static void fail_stream(struct agw_relay *r, const char *code, const char *message, bool cancel)
{
    agw_agui_fail(r->agui, code, message, &r->sink);
    finish(r, cancel);
}

/* Before the client has a stream: answer with an error (FINISHING), or, detached, end (CLOSED). */
static void reply_error(struct agw_relay *r, int status, const char *msg)
{
    unregister(r);
    drop_upstream(r, true);
    if (r->outcome == NULL)
        r->outcome = "upstream_error";
    if (r->req == NULL) {
        set_state(r, RL_ST_CLOSED);
        return;
    }
    set_state(r, RL_ST_FINISHING);
    r->status = status;
    agw_req_reply_error(r->req, status, "%s", msg);
}

/* ---- the upstream ------------------------------------------------------------------------- */

static void start_attempt(struct agw_relay *r);

/* A failure before the first byte: the next backend is tried when retries remain. */
static bool retry(struct agw_relay *r)
{
    if (r->tries_left == 0 || r->n_backends == 0)
        return false;
    r->tries_left--;
    r->attempt = (r->attempt + 1) % r->n_backends;
    drop_upstream(r, true);
    agw_log_info("req=%s retrying on backend %s", r->request_id,
                 agw_upstream_pool_url(r->backends[r->attempt])->authority);
    start_attempt(r);
    return true;
}

static void backend_outcome(struct agw_relay *r, bool answered)
{
    if (r->on_backend != NULL)
        r->on_backend(r->arg, r->attempt, answered);
}

static const char *current_authority(const struct agw_relay *r)
{
    return agw_upstream_pool_url(r->backends[r->attempt])->authority;
}

/* Still waiting for the upstream's head (connecting, or detached while connecting). */
static bool before_head(const struct agw_relay *r)
{
    return r->state == RL_ST_CONNECTING || (r->state == RL_ST_DETACHED && !r->answered);
}

static void up_on_head(void *arg, const struct agw_http1_response *resp)
{
    struct agw_relay *r = arg;
    char detail[160];

    enter(r);
    if (!before_head(r))
        goto out;
    backend_outcome(r, resp->status < 500);
    if (resp->status >= 500 && retry(r))
        goto out;
    if (resp->status < 200 || resp->status > 299) {
        r->upstream_error = AGW_UP_STATUS;
        snprintf(detail, sizeof(detail), "bad gateway: the upstream answered HTTP %d",
                 resp->status);
        reply_error(r, 502, detail);
        goto out;
    }
    if (!agw_is_event_stream(resp->content_type)) {
        r->upstream_error = AGW_UP_CONTENT_TYPE;
        snprintf(
            detail, sizeof(detail),
            "bad gateway: the upstream answered with Content-Type %.80s, not text/event-stream",
            resp->content_type ? resp->content_type : "(none)");
        reply_error(r, 502, detail);
        goto out;
    }
    r->answered = true;
    drop_retry_params(r);
    if (r->runs != NULL) {
        const struct agw_url *u = agw_upstream_pool_url(r->backends[r->attempt]);
        r->entry = agw_runs_add(r->runs, r->runs_part, r->agent_id, r->thread_id, r->run_id,
                                u->text, r->set->base, r);
    }
    if (r->state == RL_ST_DETACHED) /* detached before the upstream answered: it goes on alone */
        goto out;
    if (r->defer_head)
        set_state(r, RL_ST_DEFERRED);
    else
        start_client_stream(r);
out:
    leave(r);
}

static int frame_cb(void *arg, const struct agw_sse_frame *f)
{
    struct agw_relay *r = arg;
    int rc;

    r->framed = f->framed;
    rc = agw_agui_feed(r->agui, f->data, f->data_len, &r->sink);
    r->framed = false;
    /* 1 = terminal event reached: stop parsing, the rest of the upstream's bytes are not wanted. */
    return rc == 1 ? -1 : 0;
}

/* A segment <p>, <n> of an evbuffer parsed where it lies: the frames the normaliser passes
 * unchanged are appended to <out> straight from it, in one piece per run of them (see
 * relay_emit()), so that nothing of them is referred to after the call (the segment is drained
 * then). Returns what agw_sse_parse_bytes() returned. */
static int parse_bytes(struct agw_relay *r, const char *p, size_t n)
{
    int rc = agw_sse_parse_bytes(r->sse, p, n, frame_cb, r);

    flush_run(r);
    return rc;
}

/* The same for what <body> holds, segment by segment, each drained once parsed. Returns what
 * agw_sse_parse_bytes() returned last (< 0 stops). */
static int parse_body(struct agw_relay *r, struct evbuffer *body)
{
    struct evbuffer_iovec v;
    int rc = 0;

    while (rc >= 0 && evbuffer_peek(body, -1, NULL, &v, 1) > 0) {
        rc = parse_bytes(r, v.iov_base, v.iov_len);
        evbuffer_drain(body, v.iov_len);
    }
    evbuffer_drain(body, evbuffer_get_length(body));
    return rc;
}

#define READING (TO(RL_ST_DEFERRED) | TO(RL_ST_STREAMING) | TO(RL_ST_DETACHED))

/* After body bytes were parsed (<rc>, agw_sse_parse_bytes()'s): the end, the client's share, and
 * the pauses for backpressure. */
static void after_body(struct agw_relay *r, int rc)
{
    if (rc == -AGW_ETOOBIG) {
        fail_stream(r, AGW_AGUI_FRAME_TOO_LARGE,
                    "an upstream event exceeded limits.max_frame_bytes", false);
        return;
    }
    if (agw_agui_finished(r->agui)) {
        finish(r, false);
        return;
    }
    flush_out(r, false);
    if (!r->flowing && r->up != NULL && agw_agui_events_out(r->agui) > 0) {
        r->flowing = true;
        agw_upstream_set_flowing(r->up); /* its first event is out: new runs go first now */
    }
    /* Backpressure: stop reading the upstream while the client's queue is above the limit; the
     * server's drain callback resumes it. */
    if (r->state == RL_ST_STREAMING && r->up != NULL &&
        agw_req_out_pending(r->req) > r->stream_buffer_bytes)
        agw_upstream_pause(r->up);
    /* The store is behind: no more reading (and recording) until it caught up. */
    if (r->store != NULL && r->up != NULL && !r->store_wait &&
        IN(r, TO(RL_ST_STREAMING) | TO(RL_ST_DETACHED)) && agw_store_congested(r->store))
        store_pause(r);
}

static void up_on_body(void *arg, struct evbuffer *body)
{
    struct agw_relay *r = arg;

    enter(r);
    if (!IN(r, READING)) {
        evbuffer_drain(body, evbuffer_get_length(body));
    } else {
        r->read_len = evbuffer_get_length(body);
        after_body(r, parse_body(r, body));
        r->read_len = 0;
    }
    leave(r);
}

/* The run of frames a read passed unchanged, all it made, written to the client from where they
 * were read: no copy into <out>, no chain made and freed (when the socket does not take them all,
 * the server copies what is left). Only while streaming with nothing in <out> before them, the run
 * not ended. False: nothing done. */
static bool write_run(struct agw_relay *r)
{
    if (r->run_len == 0 || r->state != RL_ST_STREAMING || r->req == NULL ||
        evbuffer_get_length(r->out) > 0 || agw_agui_finished(r->agui))
        return false;
    r->bytes_out += r->run_len;
    agw_req_stream_write_bytes(r->req, r->run, r->run_len);
    r->run_len = 0;
    r->last_write_ms = agw_now_ms_coarse();
    return true;
}

/* The same for bytes in one piece (a plain TCP connection's reads): parsed where they lie. */
static void up_on_bytes(void *arg, const char *p, size_t n)
{
    struct agw_relay *r = arg;

    enter(r);
    if (r->req != NULL)
        agw_req_prefetch_output(r->req);
    if (IN(r, READING)) {
        int rc;

        r->read_len = n;
        rc = agw_sse_parse_bytes(r->sse, p, n, frame_cb, r);
        if (rc < 0 || !write_run(r))
            flush_run(r);
        r->read_len = 0;
        after_body(r, rc);
    }
    leave(r);
}

/* A stream's objects are far apart in memory and, with thousands of streams, no longer in the CPU's
 * cache when its next event comes: each was a miss, one after the other. They are asked for here,
 * all at once, before the read (see agw_upstream_callbacks.on_readable). */
static void up_on_readable(void *arg)
{
    const struct agw_relay *r = arg;

    __builtin_prefetch(r->sse);
    __builtin_prefetch(r->agui);
    __builtin_prefetch(r->out);
    __builtin_prefetch(r->capture);
    if (r->req != NULL)
        agw_req_prefetch(r->req);
}

static int frame_end_cb(void *arg, const struct agw_sse_frame *f)
{
    return frame_cb(arg, f);
}

static void up_on_done(void *arg)
{
    struct agw_relay *r = arg;

    enter(r);
    if (!IN(r, READING))
        goto out;
    if (agw_sse_finish(r->sse, frame_end_cb, r) == -AGW_ETOOBIG)
        agw_agui_fail(r->agui, AGW_AGUI_FRAME_TOO_LARGE,
                      "an upstream event exceeded limits.max_frame_bytes", &r->sink);
    if (r->state == RL_ST_DEFERRED && agw_agui_events_out(r->agui) == 0) {
        /* Not one event: the backend did not take the decision (an agent that answers "already
         * running" with an empty stream). */
        r->upstream_error = AGW_UP_EMPTY_STREAM;
        reply_error(r, 502,
                    "bad gateway: the backend answered with an empty event stream (it did not "
                    "take the decision)");
        goto out;
    }
    agw_agui_end(r->agui, &r->sink);
    finish(r, false);
out:
    leave(r);
}

static void up_on_error(void *arg, enum agw_up_failure kind, const char *detail)
{
    struct agw_relay *r = arg;
    char msg[256];

    enter(r);
    r->upstream_error = kind;
    agw_log_warn("req=%s upstream %s: %s: %s", r->request_id, current_authority(r),
                 agw_up_failure_name(kind), detail);
    if (before_head(r)) {
        bool timeout = kind == AGW_UP_FIRST_BYTE_TIMEOUT;

        backend_outcome(r, false);
        if (kind != AGW_UP_PROTOCOL && retry(r))
            goto out;
        snprintf(msg, sizeof(msg), "%s: %s", timeout ? "gateway timeout" : "bad gateway", detail);
        reply_error(r, timeout ? 504 : 502, msg);
    } else if (r->state == RL_ST_DEFERRED) {
        snprintf(msg, sizeof(msg), "bad gateway: %s", detail); /* no stream yet */
        reply_error(r, 502, msg);
    } else if (IN(r, TO(RL_ST_STREAMING) | TO(RL_ST_DETACHED))) {
        const char *code = kind == AGW_UP_IDLE_TIMEOUT ? AGW_AGUI_TIMEOUT : AGW_AGUI_UPSTREAM_ERROR;
        snprintf(msg, sizeof(msg), "upstream failed: %s", detail);
        fail_stream(r, code, msg, false);
    }
out:
    leave(r);
}

static const struct agw_upstream_callbacks up_cbs = {
    .on_head = up_on_head,
    .on_body = up_on_body,
    .on_bytes = up_on_bytes,
    .on_readable = up_on_readable,
    .on_done = up_on_done,
    .on_error = up_on_error,
};

static void start_attempt(struct agw_relay *r)
{
    r->up = agw_upstream_start(r->backends[r->attempt], r->headers, r->n_headers, r->body,
                               r->body_len, &up_cbs, r);
}

/* ---- client callbacks and timers ---------------------------------------------------------- */

static void client_drain(struct agw_req *req, void *arg)
{
    struct agw_relay *r = arg;

    (void)req;
    if (r->up != NULL && r->state == RL_ST_STREAMING && !r->store_wait)
        agw_upstream_resume(r->up);
}

/* The client's request is gone (its answer was taken, or the client left). Whatever the state, the
 * relay never touches the request again. */
static void client_close(struct agw_req *req, void *arg)
{
    struct agw_relay *r = arg;

    (void)req;
    r->req = NULL;
    if (r->detach && IN(r, TO(RL_ST_CONNECTING) | TO(RL_ST_DEFERRED) | TO(RL_ST_STREAMING))) {
        /* The run goes on without its client: backpressure and heartbeats no longer apply. */
        agw_log_info("req=%s client went away; the run goes on detached", r->request_id);
        r->was_detached = true;
        set_state(r, RL_ST_DETACHED);
        if (r->up != NULL && r->answered && !r->store_wait)
            agw_upstream_resume(r->up);
        return;
    }
    if (IN(r, LIVE)) {
        r->outcome = "client_closed";
        agw_log_info("req=%s client went away; closing the upstream", r->request_id);
    }
    unregister(r);
    drop_upstream(r, true);
    set_state(r, RL_ST_CLOSED);
    if (r->busy == 0)
        relay_free(r);
}

static void run_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_relay *r = arg;

    (void)fd;
    (void)what;
    enter(r);
    if (before_head(r) || r->state == RL_ST_DEFERRED) {
        r->outcome = "timeout";
        reply_error(r, 504, "gateway timeout: the run exceeded timeouts.run");
    } else if (IN(r, TO(RL_ST_STREAMING) | TO(RL_ST_DETACHED))) {
        fail_stream(r, AGW_AGUI_TIMEOUT, "the run exceeded timeouts.run", false);
    }
    leave(r);
}

/* ---- life ------------------------------------------------------------------------------ */

/* Copies what the relay keeps of <p> into one block, in two parts: first what it keeps for the
 * whole run (the backends, then the ids), then, from an aligned offset, what only another attempt
 * needs (the header array, the header strings, the body). One allocation per run instead of one per
 * string; once the upstream answered, no attempt follows and the block shrinks to its first part
 * (drop_retry_params()). */
static void copy_params(struct agw_relay *r, const struct agw_relay_params *p)
{
    size_t n = p->n_headers, keep, total, la = strlen(p->agent_id) + 1,
           lt = strlen(p->thread_id) + 1, lr = strlen(p->run_id) + 1;
    char *at;

    keep = p->n_backends * sizeof(*r->backends) + la + lt + lr;
    keep = (keep + sizeof(void *) - 1) & ~(sizeof(void *) - 1);
    total = keep + n * sizeof(*r->headers) + p->body_len + 1;
    for (size_t i = 0; i < n; i++)
        total += strlen(p->headers[i].name) + strlen(p->headers[i].value) + 2;
    r->params = agw_xmalloc(total);
    r->params_keep = keep;
    r->backends = (struct agw_upstream_pool **)(void *)r->params;
    memcpy(r->backends, p->backends, p->n_backends * sizeof(*r->backends));
    r->n_backends = p->n_backends;
    at = r->params + p->n_backends * sizeof(*r->backends);
#define COPY(dst, src, len)                                                                        \
    do {                                                                                           \
        memcpy(at, (src), (len));                                                                  \
        (dst) = at;                                                                                \
        at += (len);                                                                               \
    } while (0)
    COPY(r->agent_id, p->agent_id, la);
    COPY(r->thread_id, p->thread_id, lt);
    COPY(r->run_id, p->run_id, lr);
    at = r->params + keep;
    r->headers = (struct agw_upstream_header *)(void *)at;
    r->n_headers = n;
    at += n * sizeof(*r->headers);
    for (size_t i = 0; i < n; i++) {
        COPY(r->headers[i].name, p->headers[i].name, strlen(p->headers[i].name) + 1);
        COPY(r->headers[i].value, p->headers[i].value, strlen(p->headers[i].value) + 1);
    }
    COPY(r->body, p->body, p->body_len);
    *at++ = '\0';
    r->body_len = p->body_len;
#undef COPY
    assert(at == r->params + total);
}

/* The upstream answered: no other attempt will be made, so the request's headers and body go (a
 * run may stream for hours). The block keeps the backends and the ids. */
static void drop_retry_params(struct agw_relay *r)
{
    char *old = r->params, *p;

    if (r->headers == NULL)
        return;
    r->headers = NULL;
    r->n_headers = 0;
    r->body = NULL;
    r->body_len = 0;
    /* A new block with the kept prefix (the backends and the ids), then the old one freed. */
    p = malloc(r->params_keep);
    if (p == NULL)
        return; /* the block stays as it is */
    memcpy(p, old, r->params_keep);
    r->params = p;
    r->backends = (struct agw_upstream_pool **)(void *)p;
    r->agent_id = p + (r->agent_id - old);
    r->thread_id = p + (r->thread_id - old);
    r->run_id = p + (r->run_id - old);
    free(old);
}

static struct agw_relay *relay_new(struct agw_relay_set *set, const struct agw_relay_params *p)
{
    struct agw_relay *r = agw_xcalloc(1, sizeof(*r));

    r->set = set;
    r->req = p->req;
    copy_params(r, p);
    r->tries_left =
        p->n_backends > 1
            ? (p->retries < p->n_backends - 1 ? p->retries : (unsigned)p->n_backends - 1)
            : 0;
    r->stream_buffer_bytes = p->stream_buffer_bytes;
    r->heartbeat_ms = p->heartbeat_ms;
    r->on_end = p->on_end;
    r->on_backend = p->on_backend;
    r->connect_us = r->first_byte_us = AGW_UP_NOT_MEASURED;
    r->arg = p->arg;
    r->runs = p->runs;
    r->runs_part = p->runs_part;
    r->detach = p->detach;
    r->legacy_client = p->legacy_client;
    r->store = p->store; /* recording: a capture is made when an event is to be kept */
    r->start_ms = agw_now_ms();
    {
        const char *id = agw_req_id(p->req);
        size_t n = strlen(id) < sizeof(r->request_id) ? strlen(id) : sizeof(r->request_id) - 1;

        memcpy(r->request_id, id, n);
        r->request_id[n] = '\0';
    }
    r->sse = agw_sse_parser_new(p->max_frame_bytes);
    r->agui = agw_agui_new(p->thread_id, p->run_id, p->protocol);
    r->out = evbuffer_new();
    r->sink = (struct agw_agui_sink){relay_emit, r};
    r->heartbeat = evtimer_new(set->base, heartbeat_cb, r);
    if (p->run_ms > 0) { /* no timer without timeouts.run */
        r->run_timer = evtimer_new(set->base, run_timer_cb, r);
        arm(r->run_timer, p->run_ms);
    }
    TAILQ_INSERT_TAIL(&set->relays, r, link);
    __atomic_add_fetch(&set->count, 1, __ATOMIC_RELAXED);
    agw_req_on_close(p->req, client_close, r);
    agw_req_on_half_close(p->req, client_half_close);
    return r;
}

struct agw_relay *agw_relay_start(struct agw_relay_set *set, const struct agw_relay_params *p)
{
    struct agw_relay *r = relay_new(set, p);

    start_attempt(r);
    return r;
}

struct agw_relay *agw_relay_adopt(struct agw_relay_set *set, const struct agw_relay_params *p,
                                  struct agw_upstream *up, const struct agw_http1_response *resp)
{
    struct agw_relay *r = relay_new(set, p);

    assert(p->n_backends == 1);
    r->defer_head = true;
    r->up = up;
    agw_upstream_set_callbacks(up, &up_cbs, r);
    up_on_head(r, resp);
    return r;
}

static void relay_free(struct agw_relay *r)
{
    struct agw_relay_summary s = {
        .request_id = r->request_id,
        .agent_id = r->agent_id,
        .thread_id = r->thread_id,
        .run_id = r->run_id,
        .status = r->status,
        .events = agw_agui_events_out(r->agui),
        .bytes = r->bytes_out,
        .duration_ms = agw_now_ms() - r->start_ms,
        .upstream = r->n_backends > 0 ? current_authority(r) : NULL,
        .outcome = r->outcome != NULL ? r->outcome : "client_closed",
        .upstream_error = r->upstream_error,
        .connect_us = r->connect_us,
        .first_byte_us = r->first_byte_us,
        .detached = r->was_detached,
    };

    flush_capture(r); /* a run that ended without its terminal event */
    aging_leave(r);
    capture_free(r);
    if (r->on_end != NULL)
        r->on_end(r->arg, &s);
    TAILQ_REMOVE(&r->set->relays, r, link);
    __atomic_sub_fetch(&r->set->count, 1, __ATOMIC_RELAXED);
    if (r->store_wait)
        r->set->n_store_wait--;
    unregister(r);
    agw_upstream_close(r->up);
    event_free(r->heartbeat);
    if (r->run_timer != NULL)
        event_free(r->run_timer);
    evbuffer_free(r->out);
    agw_agui_free(r->agui);
    agw_sse_parser_free(r->sse);
    free(r->params);
    free(r);
}

struct agw_relay_set *agw_relay_set_new(struct event_base *base)
{
    struct agw_relay_set *set = agw_xcalloc(1, sizeof(*set));

    set->base = base;
    TAILQ_INIT(&set->relays);
    TAILQ_INIT(&set->aging);
    return set;
}

void agw_relay_set_free(struct agw_relay_set *set)
{
    struct agw_relay *r;

    if (set == NULL)
        return;
    while ((r = TAILQ_FIRST(&set->relays)) != NULL) {
        assert(r->req == NULL && r->busy == 0);
        if (r->outcome == NULL)
            r->outcome = "closed";
        relay_free(r);
    }
    if (set->store_timer != NULL)
        event_free(set->store_timer);
    if (set->age_timer != NULL)
        event_free(set->age_timer);
    free(set);
}

void agw_relay_cancel(struct agw_relay *r)
{
    enter(r);
    if (IN(r, READING)) {
        agw_log_info("req=%s run cancelled", r->request_id);
        fail_stream(r, AGW_AGUI_CANCELLED, "the run was cancelled", true);
    }
    leave(r);
}

/* Read by the metrics from any loop: hence the atomics. */
size_t agw_relay_set_count(const struct agw_relay_set *set)
{
    return __atomic_load_n(&set->count, __ATOMIC_RELAXED);
}

size_t agw_relay_set_captures(const struct agw_relay_set *set)
{
    return set->n_captures;
}

void agw_relay_set_shutdown(struct agw_relay_set *set)
{
    struct agw_relay *r, *next;

    for (r = TAILQ_FIRST(&set->relays); r != NULL; r = next) {
        next = TAILQ_NEXT(r, link);
        enter(r);
        if (before_head(r) || r->state == RL_ST_DEFERRED) {
            r->outcome = "shutdown";
            reply_error(r, 503, "service unavailable: the gateway is shutting down");
        } else if (IN(r, TO(RL_ST_STREAMING) | TO(RL_ST_DETACHED))) {
            fail_stream(r, AGW_AGUI_SHUTDOWN, "the gateway is shutting down", false);
        }
        leave(r);
    }
}
