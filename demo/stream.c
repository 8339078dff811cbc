/* Producing a run's response (see stream.h). The end of a run takes three shapes: finished (the
 * last chunk, or the held body with its Content-Length), dropped (drop_after: closed without ending
 * the body) and abandoned (the client went away, counted by http.c). */
#include "config.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>
#include <jansson.h>

#include "agw/common.h"
#include "agw/log.h"

#include "demo.h"
#include "http.h"
#include "run.h"
#include "stream.h"

#define BATCH_MAX      256 /* events produced per callback, so one stream cannot hog the loop */
#define HOLD_MAX_BYTES (16 * 1024 * 1024) /* framing=length buffers the whole body: its ceiling */

/* The connection's run is over (completed, dropped or abandoned; the caller counts which): it
 * leaves the active count and is freed. */
void run_end(struct conn *c)
{
    assert(c->d->active_streams > 0);
    c->d->active_streams--;
    if (c->run->waiting)
        c->d->waiting--;
    run_free(c->run);
    c->run = NULL;
}

static void stream_finish(struct conn *c)
{
    struct run *r = c->run;
    bool close = r->k.framing == FRAMING_CLOSE;

    if (r->k.framing == FRAMING_CHUNKED) {
        conn_send(c, "0\r\n\r\n", 5);
    } else if (r->k.framing == FRAMING_LENGTH) {
        struct evbuffer *b = evbuffer_new();
        evbuffer_add_printf(
            b,
            "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-cache\r\nX-Demo-Scenario: %s\r\nConnection: %s\r\n\r\n",
            r->k.content_type[0] ? r->k.content_type : "text/event-stream",
            evbuffer_get_length(r->hold), r->scenario, c->keep_alive ? "keep-alive" : "close");
        evbuffer_add_buffer(b, r->hold);
        conn_send_buffer(c, b);
        evbuffer_free(b);
    }
    agw_log_debug("conn %" PRIu64 ": run %s completed, %" PRIu64 " events", c->id, r->run_id,
                  r->emitted);
    c->d->completed++;
    /* The response said keep-alive all the same: the client finds out by itself. */
    if (r->k.hangup == HANGUP_IDLE)
        close = true;
    c->hangup_next = r->k.hangup == HANGUP_NEXT;
    run_end(c);
    response_done(c, close);
}

/* drop_after: the events produced so far are flushed, then the connection is closed without ending
 * the body (no last chunk; with framing=close the client sees a clean-looking EOF; with
 * framing=length nothing was sent). */
static void stream_drop(struct conn *c)
{
    agw_log_debug("conn %" PRIu64 ": dropping after %" PRIu64 " events", c->id, c->run->emitted);
    c->d->dropped++;
    run_end(c);
    conn_closing(c);
}

/* Hands the batch to the transfer coding: one chunk per batch, raw bytes, or the length-mode hold.
 * With <now> (write_each) the chunk goes to the socket at once, in a write of its own. Returns
 * false when bytes of it are left queued (the socket did not take them all). */
static bool flush_batch(struct conn *c, bool now)
{
    struct run *r = c->run;
    size_t n = evbuffer_get_length(r->batch);

    if (n == 0)
        return true;
    switch ((enum framing)r->k.framing) {
    case FRAMING_CHUNKED: {
        char hdr[24];
        int hl = snprintf(hdr, sizeof(hdr), "%zx\r\n", n);
        evbuffer_prepend(r->batch, hdr, (size_t)hl);
        evbuffer_add(r->batch, "\r\n", 2);
        break;
    }
    case FRAMING_CLOSE:
        break;
    case FRAMING_LENGTH:
        evbuffer_add_buffer(r->hold, r->batch);
        return true;
    }
    if (now)
        return conn_write_now(c, r->batch);
    conn_send_buffer(c, r->batch);
    return true;
}

static bool drop_due(const struct run *r)
{
    return r->k.drop_after >= 0 && r->emitted >= (uint64_t)r->k.drop_after;
}

/* Produces the next batch of events: while the client keeps up (queued output under OUT_HIGH), at
 * most BATCH_MAX events, or one event when they are paced (delay_ms, bytewise). With write_each,
 * every event is its own chunk, written at once in its own write system call, as an agent that
 * streams model tokens writes them; production waits for the write callback while anything is
 * queued (the response head, the rest of a short write). Then decides what resumes it: the write
 * callback (output queued), the timer (pacing, or nothing queued), or nothing (stalled). */
void pump(struct conn *c)
{
    struct run *r = c->run;
    bool one = r->k.delay_ms > 0 || r->k.bytewise;
    bool each = r->k.write_each && r->k.framing != FRAMING_LENGTH;
    unsigned n = 0;

    assert(c->state == CONN_ST_STREAM && r);
    r->blocked = false;
    if (r->stalled || r->waiting)
        return;
    if (evbuffer_get_length(c->wire) > 0 || (each && conn_queued(c) > 0)) {
        r->blocked = true; /* still trickling the previous event, or writing it */
        return;
    }
    while (r->cur < r->nsteps && !drop_due(r)) {
        if (r->steps[r->cur].kind == EV_STALL) {
            r->stalled = true;
            break;
        }
        if (r->steps[r->cur].kind == EV_WAIT) {
            r->waiting = true;
            c->d->waiting++;
            break;
        }
        if (conn_queued(c) + evbuffer_get_length(r->batch) >= OUT_HIGH) {
            r->blocked = true;
            break;
        }
        emit_next(r);
        n++;
        if (each && !flush_batch(c, true)) {
            r->blocked = true; /* the socket is full: the write callback resumes */
            break;
        }
        /* A wait is not an event: the run waits as soon as the event before it is out (in this
         * turn, paced or not), so that a client that saw that event finds the run waiting. */
        if ((n >= BATCH_MAX || one) && !(r->cur < r->nsteps && r->steps[r->cur].kind == EV_WAIT))
            break;
    }
    flush_batch(c, false);
    if (r->k.framing == FRAMING_LENGTH && evbuffer_get_length(r->hold) > HOLD_MAX_BYTES) {
        agw_log_warn("conn %" PRIu64 ": framing=length body over %d bytes", c->id, HOLD_MAX_BYTES);
        run_end(c);
        send_error(c, 500, "demo framing=length: the stream exceeds 16 MiB", true);
        return;
    }
    if (drop_due(r)) {
        stream_drop(c);
    } else if (r->cur >= r->nsteps) {
        stream_finish(c);
    } else if (r->stalled) {
        agw_log_debug("conn %" PRIu64 ": stalled after %" PRIu64 " events", c->id, r->emitted);
    } else if (r->waiting) {
        agw_log_info("conn %" PRIu64 ": run %s waits for a decision on %s", c->id, r->run_id,
                     r->pending_call);
    } else if (r->k.delay_ms > 0 && !r->blocked) {
        arm_timer(c, (uint64_t)r->k.delay_ms);
    } else if (conn_queued(c) == 0) {
        arm_timer(c, 0); /* nothing on the wire (framing=length): no write callback will come */
    }
}

/* first_byte_delay_ms has passed: the status line, then the stream. */
void start_response(struct conn *c)
{
    struct run *r = c->run;
    char buf[512];
    const char *te = "";

    if (r->k.status) {
        int status = (int)r->k.status;
        char msg[64];
        snprintf(msg, sizeof(msg), "demo status %d", status);
        c->d->completed++;
        run_end(c); /* frees r */
        send_json(c, status, json_pack("{s:s}", "error", msg), "", false);
        return;
    }
    if (c->minor == 0 && r->k.framing == FRAMING_CHUNKED)
        r->k.framing = FRAMING_CLOSE; /* HTTP/1.0 has no chunked coding */
    if (r->k.framing == FRAMING_CLOSE)
        c->keep_alive = false;
    set_state(c, CONN_ST_STREAM);
    if (r->k.framing == FRAMING_LENGTH) {
        r->hold = evbuffer_new();
    } else {
        if (r->k.framing == FRAMING_CHUNKED)
            te = "Transfer-Encoding: chunked\r\n";
        snprintf(buf, sizeof(buf),
                 "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nCache-Control: no-cache\r\n"
                 "X-Accel-Buffering: no\r\nX-Demo-Scenario: %s\r\n%sConnection: %s\r\n\r\n",
                 r->k.content_type[0] ? r->k.content_type : "text/event-stream", r->scenario, te,
                 c->keep_alive ? "keep-alive" : "close");
        conn_send(c, buf, strlen(buf));
    }
    pump(c);
}
