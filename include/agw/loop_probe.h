/*
 * The loop probe: how late an event loop serves a timer that fires every period, and why.
 *
 * A diagnostic for benchmarks (AGW_LOOP_PROBE_MS in the daemon, bench/probe.c beside it): a timerfd
 * (the kernel's high-resolution timer, not the loop's millisecond timeouts) at the loop's highest
 * priority becomes readable every period; how late the loop reads it after the first expiry it had
 * not served is how long a ready event waited for the loop. That lateness has two parts the kernel
 * tells apart (/proc/thread-self/schedstat): time the loop's thread was runnable and waited for a
 * CPU (another thread or process had it), and the rest, the loop's own part (its callbacks, or a
 * sleep in a system call: a wait on a disk would be here). Of the own part, the loop can have run
 * at most its thread's time on a CPU since the expiry it served before; the rest it slept.
 *
 * A virtual machine whose host pauses its CPU shows the pause as the loop's own part, even as its
 * running (a kernel that does not account stolen time counts it as the thread's time on a CPU): a
 * probe in a bare loop beside the one measured, on the same CPU, sees the same pauses at the same
 * moments, and tells them from the measured loop's own (bench/run.sh --stall).
 *
 * Ownership: the probe belongs to the loop's thread, which creates it (agw_loop_probe_new() before
 * the loop runs or on it), and frees it once the loop stopped. agw_loop_probe_maxima() may be
 * called from any thread; agw_loop_probe_records() only once the loop stopped.
 */
#ifndef AGW_LOOP_PROBE_H
#define AGW_LOOP_PROBE_H

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct agw_loop_probe;

/* One lateness the probe kept (at least its report threshold): when the loop served the timer
 * (CLOCK_MONOTONIC, µs), and its parts (µs); own and running are 0 where the kernel keeps no
 * scheduler statistics. */
struct agw_loop_lateness {
    uint64_t at_us;
    uint32_t late_us;
    uint32_t own_us;
    uint32_t running_us;
};

/* The longest lateness so far and the longest own and running parts (each its own maximum, µs);
 * own_us and running_us are -1 where the kernel keeps no scheduler statistics. */
struct agw_loop_probe_maxima {
    int64_t late_us;
    int64_t own_us;
    int64_t running_us;
};

/* At most this many latenesses are kept; later ones are counted, not kept. */
#define AGW_LOOP_PROBE_RECORDS 8192

/* A probe on <base> firing every <period_us> (1 ms to 10 s), started once the loop runs (a start-up
 * before it is not the loop's lateness). <report_us> > 0: every lateness of at least that is kept
 * (agw_loop_probe_records()). NULL with errno set when no timerfd can be made, or EINVAL. */
struct agw_loop_probe *agw_loop_probe_new(struct event_base *base, uint64_t period_us,
                                          uint64_t report_us);
void agw_loop_probe_free(struct agw_loop_probe *p);

/* Any thread. */
void agw_loop_probe_maxima(const struct agw_loop_probe *p, struct agw_loop_probe_maxima *out);

/* The latenesses kept, oldest first (*n of them), and how many more were not (*lost). */
const struct agw_loop_lateness *agw_loop_probe_records(const struct agw_loop_probe *p, size_t *n,
                                                       uint64_t *lost);

/* One kept lateness as a line of text (no newline), the same for every program that reports one:
 * "loop probe: late 5.123 ms at 1234.567890 s; own 0.456 ms, running 0.123 ms". */
void agw_loop_probe_format(const struct agw_loop_lateness *l, char *buf, size_t len);

/* The period and report threshold asked for by the environment: AGW_LOOP_PROBE_MS (1..10000; else
 * 0, no probe) and AGW_LOOP_PROBE_REPORT_MS (a decimal, at most 10000; else 0, none kept), in µs.
 */
void agw_loop_probe_env(uint64_t *period_us, uint64_t *report_us);

#endif
