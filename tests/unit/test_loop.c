/* Tests for src/loop.c: a busy loop (turns shorter than the window) naps and so turns less often,
 * an idle one never naps, a window of 0 never naps, and an exit or a break ends the run. The
 * bounds are counts with wide margins, not timings. Then the callbacks of a turn are bounded, with
 * agw_loop_slice_check() and without; holds (a burst's read napped on); and the mailbox: letters
 * posted by other threads run once each, in order, and those left at its free are handed back as
 * dropped. */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "agw/loop.h"

struct ticker {
    struct event *ev;
    unsigned ticks;
};

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ticker *t = arg;

    (void)fd;
    (void)what;
    t->ticks++;
}

/* Runs a loop with one persistent timer of <period_ms> for <run_ms>, batching over <window_us>. */
static void run_ticker(unsigned period_ms, unsigned run_ms, uint32_t window_us,
                       struct agw_loop_stats *st, struct ticker *t)
{
    struct event_base *base = event_base_new();
    struct timeval period = {.tv_sec = 0, .tv_usec = (suseconds_t)period_ms * 1000};
    struct timeval run = {.tv_sec = run_ms / 1000, .tv_usec = (suseconds_t)(run_ms % 1000) * 1000};

    cr_assert_not_null(base);
    t->ticks = 0;
    t->ev = event_new(base, -1, EV_PERSIST, tick_cb, t);
    event_add(t->ev, &period);
    event_base_loopexit(base, &run);
    cr_assert_eq(agw_loop_run(base, window_us, st), 0, "an exit ends the run with 0");
    event_free(t->ev);
    event_base_free(base);
}

Test(loop, a_busy_loop_naps_and_turns_less_often)
{
    struct agw_loop_stats st = {0};
    struct ticker t;

    /* A tick every millisecond for 600 ms: about 600 turns without batching. A 1 ms timer fires
     * on libevent's coarse clock, at the kernel's tick: 4 ms at HZ=250, and turns of 5-6 ms have
     * been seen on this virtual machine, which a 10 ms window does not count as busy (the mean
     * must be under half the window). With a 20 ms window, once the mean turn is under half of
     * it (about 55 turns), each turn is followed by a nap: some 15 on an idle machine; none at
     * all is the failure looked for. */
    run_ticker(1, 600, 20000, &st, &t);
    cr_assert_lt(t.ticks, 250, "ticks %u: the loop did not batch", t.ticks);
    cr_assert_gt(t.ticks, 10, "ticks %u: the loop stalled", t.ticks);
    cr_assert_geq(st.naps, 3, "naps %llu", (unsigned long long)st.naps);
    cr_assert_geq(st.turns, st.naps);
}

Test(loop, without_a_window_every_tick_is_a_turn)
{
    struct agw_loop_stats st = {0};
    struct ticker t;

    run_ticker(1, 300, 0, &st, &t);
    /* (a timer of 1 ms fires at libevent's coarse clock's tick: 4 ms at HZ=250) */
    cr_assert_gt(t.ticks, 20, "ticks %u", t.ticks);
    cr_assert_eq(st.naps, 0);
    cr_assert_geq(st.turns + 1, t.ticks, "turns %llu for %u ticks", (unsigned long long)st.turns,
                  t.ticks);
}

Test(loop, an_idle_loop_never_naps)
{
    struct agw_loop_stats st = {0};
    struct ticker t;

    /* Turns that wait 30 ms for their event are longer than a 5 ms window: no nap, ever. */
    run_ticker(30, 400, 5000, &st, &t);
    cr_assert_geq(t.ticks, 8, "ticks %u", t.ticks);
    cr_assert_eq(st.naps, 0, "naps %llu", (unsigned long long)st.naps);
    /* (the turn in which the exit comes may have run a tick and not be counted: seen once, under
     * a sanitized parallel make check) */
    cr_assert_geq(st.turns + 1, t.ticks, "turns %llu for %u ticks", (unsigned long long)st.turns,
                  t.ticks);
}

static void break_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    event_base_loopbreak(arg);
}

Test(loop, a_break_ends_the_run_and_an_empty_loop_returns_1)
{
    struct event_base *base = event_base_new();
    struct timeval soon = {.tv_sec = 0, .tv_usec = 20000};

    cr_assert_eq(agw_loop_run(base, 1000, NULL), 1, "nothing to wait for");
    event_base_once(base, -1, EV_TIMEOUT, break_cb, base, &soon);
    cr_assert_eq(agw_loop_run(base, 1000, NULL), 0);
    event_base_free(base);
}

struct busy {
    bool check;        /* the callbacks call agw_loop_slice_check() */
    unsigned done;     /* busy callbacks run */
    bool pending;      /* a byte waits for the probe */
    unsigned at_write; /* busy callbacks run when it was written */
    unsigned max_wait; /* the most busy callbacks run while a byte waited */
    unsigned probes;
    unsigned timers; /* firings of the timer */
    int wr;          /* the socket's other end */
    struct event *probe, *timer;
};

static void busy_cb(evutil_socket_t fd, short what, void *arg)
{
    struct busy *b = arg;
    struct timespec t0, t;

    (void)fd;
    (void)what;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do /* 200 µs of work */
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 200000L);
    b->done++;
    if (b->done == 100) {
        event_del(b->probe); /* the run ends once nothing is left */
    } else if (!b->pending) {
        /* a new connection knocks: how many callbacks run before the loop answers it? */
        cr_assert_eq(write(b->wr, "x", 1), 1);
        b->pending = true;
        b->at_write = b->done;
    }
    if (b->check)
        agw_loop_slice_check();
}

/* The socket, at the highest priority, as a listener is: runs at the first look at the sockets
 * after a byte came. */
static void probe_cb(evutil_socket_t fd, short what, void *arg)
{
    struct busy *b = arg;
    char c;

    (void)what;
    cr_assert_eq(read(fd, &c, 1), 1);
    if (b->done - b->at_write > b->max_wait)
        b->max_wait = b->done - b->at_write;
    b->pending = false;
    b->probes++;
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct busy *b = arg;
    const struct timeval ms = {.tv_sec = 0, .tv_usec = 1000};

    (void)fd;
    (void)what;
    b->timers++;
    if (b->done < 100)
        event_add(b->timer, &ms);
}

/* 100 callbacks of 200 µs, all ready at once, as flowing streams are (20 ms of work), beside a
 * socket that each callback makes readable while it is not, and a timer due every millisecond,
 * run by agw_loop_run(). */
static void run_busy(struct busy *b)
{
    struct event_base *base = agw_loop_new();
    struct event *ev[100];
    const struct timeval ms = {.tv_sec = 0, .tv_usec = 1000};
    int sv[2];

    cr_assert_not_null(base);
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    b->wr = sv[1];
    b->probe = event_new(base, sv[0], EV_READ | EV_PERSIST, probe_cb, b);
    event_priority_set(b->probe, 0);
    event_add(b->probe, NULL);
    b->timer = evtimer_new(base, timer_cb, b);
    event_priority_set(b->timer, 0);
    event_add(b->timer, &ms);
    for (int i = 0; i < 100; i++) {
        ev[i] = event_new(base, -1, 0, busy_cb, b);
        event_priority_set(ev[i], AGW_PRIO_FLOWING);
        event_active(ev[i], EV_READ, 0);
    }
    cr_assert_eq(agw_loop_run(base, 100, NULL), 1, "the loop ran out of events");
    cr_assert_eq(b->done, 100, "a slice's end ended the run");
    for (int i = 0; i < 100; i++)
        event_free(ev[i]);
    event_free(b->probe);
    event_free(b->timer);
    event_base_free(base);
    close(sv[0]);
    close(sv[1]);
}

Test(loop, callbacks_that_check_the_slice_let_sockets_in_after_1_ms)
{
    struct busy b = {.check = true};

    run_busy(&b);
    /* The slice is counted from the first check of a turn, the end of its first callback: 1 + 5
     * callbacks of 200 µs (a preempted callback only lasts longer, so fewer fit). */
    cr_assert_leq(b.max_wait, 6, "the socket waited for %u callbacks of 200 us", b.max_wait);
    cr_assert_geq(b.probes, 14, "the socket was answered %u times over 20 ms of work", b.probes);
    /* timers, on libevent's coarse clock, fire within a tick */
    cr_assert_geq(b.timers, 3, "the timer fired %u times over 20 ms of work", b.timers);
}

Test(loop, other_callbacks_are_bounded_by_a_tick)
{
    struct busy b = {.check = false};
    struct timespec res;
    unsigned bound;

    /* libevent's own slice, on CLOCK_MONOTONIC_COARSE: a turn ends at the first tick after 1 ms */
    cr_assert_eq(clock_getres(CLOCK_MONOTONIC_COARSE, &res), 0);
    bound = (unsigned)((res.tv_sec * 1000000000L + res.tv_nsec) / 200000L) + 7;
    run_busy(&b);
    cr_assert_leq(b.max_wait, bound, "the socket waited for %u callbacks of 200 us (bound %u)",
                  b.max_wait, bound);
    cr_assert_geq(b.probes, 3, "the socket was answered %u times over 20 ms of work", b.probes);
}

Test(loop, a_check_outside_a_run_does_nothing)
{
    struct event_base *base = agw_loop_new();

    cr_assert_not_null(base);
    for (int i = 0; i < 3; i++)
        agw_loop_slice_check();
    cr_assert_not(event_base_got_break(base));
    event_base_free(base);
}

/* Holding a read back (agw_loop_hold()): a timer's callback holds <n> events; each held event's
 * callback counts its runs and the events it was given. */
struct holder {
    struct event *held[AGW_LOOP_MAX_HELD + 1];
    unsigned n, unhold; /* events to hold; how many of them to forget again at once */
    unsigned accepted;  /* holds agw_loop_hold() took */
    unsigned ran;       /* runs of held events' callbacks */
    short what;         /* the events the last of them was given */
};

static void held_cb(evutil_socket_t fd, short what, void *arg)
{
    struct holder *h = arg;

    (void)fd;
    h->ran++;
    h->what = what;
}

static void hold_cb(evutil_socket_t fd, short what, void *arg)
{
    struct holder *h = arg;

    (void)fd;
    (void)what;
    for (unsigned i = 0; i < h->n; i++)
        h->accepted += agw_loop_hold(h->held[i], 1000);
    for (unsigned i = 0; i < h->unhold; i++)
        agw_loop_unhold(h->held[i]);
}

/* A loop with a window of <window_us> that runs hold_cb() once, 5 ms in, and exits at 60 ms. */
static void run_holder(struct holder *h, uint32_t window_us, struct agw_loop_stats *st)
{
    struct event_base *base = agw_loop_new();
    const struct timeval soon = {.tv_sec = 0, .tv_usec = 5000};
    const struct timeval end = {.tv_sec = 0, .tv_usec = 60000};

    cr_assert_not_null(base);
    for (unsigned i = 0; i < h->n; i++)
        h->held[i] = event_new(base, -1, 0, held_cb, h);
    event_base_once(base, -1, EV_TIMEOUT, hold_cb, h, &soon);
    event_base_loopexit(base, &end);
    cr_assert_eq(agw_loop_run(base, window_us, st), 0);
    for (unsigned i = 0; i < h->n; i++)
        event_free(h->held[i]);
    event_base_free(base);
}

Test(loop, a_held_read_runs_after_the_nap_it_causes)
{
    struct holder h = {.n = 3};
    struct agw_loop_stats st = {0};

    /* An idle loop never naps by itself (an_idle_loop_never_naps): the one nap is the hold's. */
    run_holder(&h, 2000, &st);
    cr_assert_eq(h.accepted, 3);
    cr_assert_eq(h.ran, 3, "each held event ran once: %u runs", h.ran);
    cr_assert_eq(h.what, EV_READ);
    cr_assert_eq(st.holds, 3, "holds %llu", (unsigned long long)st.holds);
    cr_assert_eq(st.naps, 1, "naps %llu", (unsigned long long)st.naps);
}

Test(loop, an_event_forgotten_is_not_run)
{
    struct holder h = {.n = 3, .unhold = 2};
    struct agw_loop_stats st = {0};

    run_holder(&h, 2000, &st);
    cr_assert_eq(h.accepted, 3);
    cr_assert_eq(h.ran, 1, "only the event still held ran: %u runs", h.ran);
}

Test(loop, nothing_is_held_without_a_window_or_past_the_limit)
{
    struct holder none = {.n = 2}, many = {.n = AGW_LOOP_MAX_HELD + 1};
    struct agw_loop_stats st = {0};
    struct event_base *base = agw_loop_new();
    struct event *ev = event_new(base, -1, 0, held_cb, &none);

    /* outside a run, and in a run that batches nothing, the caller reads at once */
    cr_assert_not(agw_loop_hold(ev, 1000));
    cr_assert_eq(agw_loop_window_us(), 0);
    event_free(ev);
    event_base_free(base);
    run_holder(&none, 0, &st);
    cr_assert_eq(none.accepted, 0);
    cr_assert_eq(none.ran, 0);
    cr_assert_eq(st.naps, 0);
    run_holder(&many, 2000, &st);
    cr_assert_eq(many.accepted, AGW_LOOP_MAX_HELD);
    cr_assert_eq(many.ran, AGW_LOOP_MAX_HELD);
}

/* ---- the mailbox ---------------------------------------------------------------------------- */

#define POSTERS    4
#define PER_POSTER 20000

struct letter {
    struct agw_loop_mail mail; /* first: the callback gets it back */
    unsigned poster, seq;
};

struct post_office {
    struct agw_loop_mailbox *mb;
    struct letter *letters; /* POSTERS * PER_POSTER */
    unsigned next[POSTERS]; /* the sequence number each poster's next letter must have */
    unsigned received, out_of_order, dropped;
    struct event_base *base;
};

static struct post_office *office; /* (one test at a time: criterion runs each in its process) */

static void letter_cb(struct agw_loop_mail *m, bool dropped)
{
    struct letter *l = (struct letter *)m;

    if (dropped)
        office->dropped++;
    if (l->seq != office->next[l->poster])
        office->out_of_order++;
    office->next[l->poster] = l->seq + 1;
    if (++office->received == POSTERS * PER_POSTER && office->base != NULL)
        event_base_loopbreak(office->base);
}

struct poster {
    struct post_office *po;
    unsigned id;
};

static void *poster_main(void *arg)
{
    struct poster *p = arg;

    for (unsigned i = 0; i < PER_POSTER; i++) {
        struct letter *l = &p->po->letters[p->id * PER_POSTER + i];

        l->mail.fn = letter_cb;
        l->poster = p->id;
        l->seq = i;
        agw_loop_mailbox_post(p->po->mb, &l->mail);
    }
    return NULL;
}

/* Threads post while the loop runs: every letter is handed to its callback once, on the loop's
 * thread, each poster's in the order posted, none as dropped; the loop wakes for them by itself. */
Test(loop, mail_from_other_threads_runs_once_each_in_order)
{
    struct post_office po = {0};
    struct poster posters[POSTERS];
    pthread_t threads[POSTERS];
    const struct timeval limit = {.tv_sec = 20, .tv_usec = 0};

    office = &po;
    po.base = agw_loop_new();
    cr_assert_not_null(po.base);
    po.mb = agw_loop_mailbox_new(po.base);
    cr_assert_not_null(po.mb);
    po.letters = calloc(POSTERS * PER_POSTER, sizeof(*po.letters));
    cr_assert_not_null(po.letters);
    for (unsigned i = 0; i < POSTERS; i++) {
        posters[i] = (struct poster){&po, i};
        cr_assert_eq(pthread_create(&threads[i], NULL, poster_main, &posters[i]), 0);
    }
    event_base_loopexit(po.base, &limit); /* a bound, should a wake-up be lost */
    agw_loop_run(po.base, 100, NULL);
    for (unsigned i = 0; i < POSTERS; i++)
        pthread_join(threads[i], NULL);
    cr_assert_eq(po.received, POSTERS * PER_POSTER, "received %u of %u", po.received,
                 POSTERS * PER_POSTER);
    cr_assert_eq(po.out_of_order, 0);
    cr_assert_eq(po.dropped, 0);
    agw_loop_mailbox_free(po.mb);
    cr_assert_eq(po.received, POSTERS * PER_POSTER, "nothing was left to drop");
    event_base_free(po.base);
    free(po.letters);
}

/* A mailbox freed with letters in it hands each to its callback as dropped, in the order posted
 * (whoever posted it can free it then). */
Test(loop, mail_left_at_the_free_is_handed_back_as_dropped)
{
    struct post_office po = {0};
    struct poster p = {&po, 0};

    office = &po;
    po.base = agw_loop_new();
    cr_assert_not_null(po.base);
    po.mb = agw_loop_mailbox_new(po.base);
    cr_assert_not_null(po.mb);
    po.letters = calloc(PER_POSTER, sizeof(*po.letters));
    cr_assert_not_null(po.letters);
    poster_main(&p); /* posted, never run: no turn of the loop */
    cr_assert_eq(po.received, 0);
    agw_loop_mailbox_free(po.mb);
    cr_assert_eq(po.received, PER_POSTER);
    cr_assert_eq(po.dropped, PER_POSTER);
    cr_assert_eq(po.out_of_order, 0);
    event_base_free(po.base);
    free(po.letters);
}
