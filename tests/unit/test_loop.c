/* Tests for src/loop.c: a busy loop (turns shorter than the window) naps and so turns less often,
 * an idle one never naps, a window of 0 is plain dispatch, and an exit or a break ends the run.
 * The bounds are counts with wide margins, not timings; the last test bounds the callbacks of a
 * turn. */
#include <criterion/criterion.h>

#include <time.h>

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

    /* A tick every millisecond for 600 ms: about 600 turns without batching. With a 10 ms window,
     * once the mean turn is under it (about 20 turns), each turn is followed by a nap: some 50 on
     * an idle machine, 10 seen under a parallel `make check` (the process off its CPU between
     * turns makes them longer than the window); none at all is the failure looked for. */
    run_ticker(1, 600, 10000, &st, &t);
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
    cr_assert_gt(t.ticks, 20, "ticks %u", t.ticks);
    cr_assert_eq(st.naps, 0);
    cr_assert_eq(st.turns, 0, "plain dispatch keeps no statistics");
}

Test(loop, an_idle_loop_never_naps)
{
    struct agw_loop_stats st = {0};
    struct ticker t;

    /* Turns that wait 30 ms for their event are longer than a 5 ms window: no nap, ever. */
    run_ticker(30, 400, 5000, &st, &t);
    cr_assert_geq(t.ticks, 8, "ticks %u", t.ticks);
    cr_assert_eq(st.naps, 0, "naps %llu", (unsigned long long)st.naps);
    cr_assert_geq(st.turns, t.ticks);
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
    unsigned done;     /* busy callbacks run */
    unsigned at_probe; /* busy callbacks run when the probe timer last fired */
    unsigned max_run;  /* the most busy callbacks run between two firings of the probe */
    unsigned probes;
    struct event *probe;
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
}

/* Fires at the first look at the timers after it is due, and is due again 0.1 ms later: the
 * busy callbacks run between two firings are those of one turn. */
static void probe_cb(evutil_socket_t fd, short what, void *arg)
{
    struct busy *b = arg;
    const struct timeval tenth_ms = {.tv_sec = 0, .tv_usec = 100};

    (void)fd;
    (void)what;
    if (b->done - b->at_probe > b->max_run)
        b->max_run = b->done - b->at_probe;
    b->at_probe = b->done;
    b->probes++;
    if (b->done < 100)
        event_add(b->probe, &tenth_ms);
}

Test(loop, a_turn_of_busy_callbacks_lets_timers_in_after_1_ms)
{
    struct event_base *base = agw_loop_new();
    struct busy b = {0};
    struct event *ev[100];
    const struct timeval tenth_ms = {.tv_sec = 0, .tv_usec = 100};

    cr_assert_not_null(base);
    b.probe = evtimer_new(base, probe_cb, &b);
    event_priority_set(b.probe, 0);
    event_add(b.probe, &tenth_ms);
    /* 100 callbacks of 200 µs, all ready at once, as flowing streams are: 20 ms of work. */
    for (int i = 0; i < 100; i++) {
        ev[i] = event_new(base, -1, 0, busy_cb, &b);
        event_priority_set(ev[i], AGW_PRIO_FLOWING);
        event_active(ev[i], EV_READ, 0);
    }
    cr_assert_eq(agw_loop_run(base, 0, NULL), 1, "the loop ran out of events");
    cr_assert_eq(b.done, 100);
    /* A turn ends once its callbacks have run for AGW_LOOP_SLICE_US (1 ms): 5 of 200 µs (a
     * preempted callback only lasts longer, so fewer fit). libevent measures the slice with the
     * clock it reads; the coarse one moves in steps of the kernel's tick (4 ms at HZ=250), and
     * turns of up to 20 callbacks were the failure looked for. */
    cr_assert_leq(b.max_run, 6, "a turn ran %u callbacks of 200 us", b.max_run);
    cr_assert_geq(b.probes, 15, "the timer fired %u times over 20 ms of work", b.probes);
    for (int i = 0; i < 100; i++)
        event_free(ev[i]);
    event_free(b.probe);
    event_base_free(base);
}
