/* Tests for src/loop_probe.c: a loop held by its own callback is late, and the probe says it ran;
 * a loop whose callback sleeps is late, and the probe says it did not run; what the probe keeps
 * and how it says it; the environment's knobs. The bounds are wide (tens of milliseconds against a
 * 1 ms period): what is checked is which part a lateness is put in, not how long anything takes. */
#include "config.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <event2/event.h>

#include "agw/common.h"
#include "agw/loop_probe.h"

static uint64_t mono_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* A callback that holds the loop for 40 ms: spinning (arg NULL) or asleep (arg not NULL). */
static void hold_cb(evutil_socket_t fd, short what, void *arg)
{
    uint64_t end = mono_us() + 40000;

    (void)fd;
    (void)what;
    if (arg != NULL) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 40000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        return;
    }
    while (mono_us() < end)
        ;
}

/* A loop with a probe of 1 ms (keeping latenesses of 5 ms or more), held 20 ms after it starts by
 * hold_cb(<sleep>), run for 150 ms. */
static struct agw_loop_probe *held_loop(struct event_base **basep, bool sleep)
{
    struct event_base *base = event_base_new();
    struct timeval at = {0, 20000}, run = {0, 150000};
    static int token;
    struct agw_loop_probe *p;

    cr_assert_not_null(base);
    cr_assert_eq(event_base_priority_init(base, AGW_N_PRIORITIES), 0);
    p = agw_loop_probe_new(base, 1000, 5000);
    cr_assert_not_null(p);
    event_base_once(base, -1, EV_TIMEOUT, hold_cb, sleep ? &token : NULL, &at);
    event_base_loopexit(base, &run);
    event_base_dispatch(base);
    *basep = base;
    return p;
}

Test(loop_probe, a_loop_running_its_own_work_is_late_and_ran)
{
    struct event_base *base;
    struct agw_loop_probe *p = held_loop(&base, false);
    struct agw_loop_probe_maxima m;
    const struct agw_loop_lateness *l;
    size_t n;
    uint64_t lost;

    agw_loop_probe_maxima(p, &m);
    cr_assert_geq(m.late_us, 30000, "40 ms in a callback: late by about that, got %lld us",
                  (long long)m.late_us);
    l = agw_loop_probe_records(p, &n, &lost);
    cr_assert_geq(n, 1, "the lateness is kept");
    cr_assert_eq(lost, 0);
    for (size_t i = 0; i < n; i++)
        cr_assert_geq(l[i].late_us, 5000, "only latenesses of the threshold or more are kept");
    if (m.own_us >= 0) { /* the kernel keeps scheduler statistics */
        cr_assert_geq(m.running_us, 10000,
                      "a loop that spun in its callback ran for much of its lateness: %lld us",
                      (long long)m.running_us);
        cr_assert_leq(m.running_us, m.own_us, "running is a part of the own part");
        cr_assert_leq(m.own_us, m.late_us, "the own part is a part of the lateness");
    }
    agw_loop_probe_free(p);
    event_base_free(base);
}

Test(loop_probe, a_loop_asleep_in_a_call_is_late_on_its_own_without_running)
{
    struct event_base *base;
    struct agw_loop_probe *p = held_loop(&base, true);
    struct agw_loop_probe_maxima m;
    const struct agw_loop_lateness *l;
    size_t n;
    uint64_t lost;
    bool found = false;

    agw_loop_probe_maxima(p, &m);
    cr_assert_geq(m.late_us, 30000, "asleep 40 ms in a callback: late by about that");
    if (m.own_us < 0) {
        agw_loop_probe_free(p);
        event_base_free(base);
        cr_skip_test("no /proc/thread-self/schedstat here: the parts are not known");
    }
    l = agw_loop_probe_records(p, &n, &lost);
    for (size_t i = 0; i < n; i++) {
        if (l[i].late_us < 30000)
            continue;
        found = true;
        /* Asleep, the thread waited for no CPU: the lateness is its own (a disk wait would be
         * here); it ran only the few microseconds around the call. */
        cr_assert_geq(l[i].own_us, 30000, "the sleep is the loop's own part: %u of %u us",
                      l[i].own_us, l[i].late_us);
        cr_assert_lt(l[i].running_us, 10000, "and it did not run meanwhile: %u us",
                     l[i].running_us);
    }
    cr_assert(found, "the 40 ms lateness is kept");
    agw_loop_probe_free(p);
    event_base_free(base);
}

Test(loop_probe, without_a_threshold_nothing_is_kept)
{
    struct event_base *base = event_base_new();
    struct timeval at = {0, 5000}, run = {0, 80000};
    struct agw_loop_probe *p = agw_loop_probe_new(base, 1000, 0);
    struct agw_loop_probe_maxima m;
    size_t n = 99;
    uint64_t lost = 99;

    cr_assert_not_null(p);
    event_base_once(base, -1, EV_TIMEOUT, hold_cb, NULL, &at);
    event_base_loopexit(base, &run);
    event_base_dispatch(base);
    agw_loop_probe_maxima(p, &m);
    cr_assert_geq(m.late_us, 30000, "the maxima are kept all the same");
    cr_assert_null(agw_loop_probe_records(p, &n, &lost));
    cr_assert_eq(n, 0);
    cr_assert_eq(lost, 0);
    agw_loop_probe_free(p);
    agw_loop_probe_free(NULL);
    event_base_free(base);
}

Test(loop_probe, a_period_out_of_range_is_refused)
{
    struct event_base *base = event_base_new();

    errno = 0;
    cr_assert_null(agw_loop_probe_new(base, 999, 0));
    cr_assert_eq(errno, EINVAL);
    cr_assert_null(agw_loop_probe_new(base, 10000001, 0));
    event_base_free(base);
}

Test(loop_probe, a_lateness_reads_as_one_line)
{
    struct agw_loop_lateness l = {
        .at_us = 1234567890, .late_us = 5123, .own_us = 456, .running_us = 123};
    char buf[160];

    agw_loop_probe_format(&l, buf, sizeof(buf));
    cr_assert_str_eq(buf,
                     "loop probe: late 5.123 ms at 1234.567890 s; own 0.456 ms, running 0.123 ms");
}

Test(loop_probe, the_environment_sets_the_period_and_the_threshold)
{
    uint64_t period, report;

    unsetenv("AGW_LOOP_PROBE_MS");
    unsetenv("AGW_LOOP_PROBE_REPORT_MS");
    agw_loop_probe_env(&period, &report);
    cr_assert_eq(period, 0, "no probe unless asked");
    cr_assert_eq(report, 0);
    setenv("AGW_LOOP_PROBE_MS", "1", 1);
    setenv("AGW_LOOP_PROBE_REPORT_MS", "2.5", 1);
    agw_loop_probe_env(&period, &report);
    cr_assert_eq(period, 1000);
    cr_assert_eq(report, 2500);
    setenv("AGW_LOOP_PROBE_MS", "0", 1);
    setenv("AGW_LOOP_PROBE_REPORT_MS", "-1", 1);
    agw_loop_probe_env(&period, &report);
    cr_assert_eq(period, 0, "0 is off");
    cr_assert_eq(report, 0, "a negative threshold keeps nothing");
    setenv("AGW_LOOP_PROBE_MS", "10001", 1);
    agw_loop_probe_env(&period, &report);
    cr_assert_eq(period, 0, "past 10 s: off");
    unsetenv("AGW_LOOP_PROBE_MS");
    unsetenv("AGW_LOOP_PROBE_REPORT_MS");
}
