/* Running an event loop with wake-up batching (doc/internals/loop.md).
 *
 * A relay under load is woken by the kernel once per event that arrives: with agents that write
 * one event per write(), a busy loop wakes tens of thousands of times a second, finds one socket
 * ready each time, and spends most of its CPU going to sleep and waking up. agw_loop_run() runs
 * the loop like event_base_dispatch(), and while the loop is busy — its turns, measured from one
 * look at the sockets to the end of the callbacks it ran, are shorter than half <window_us> on
 * average and this one was shorter than the window — it waits until <window_us> after that look
 * before looking again. Each look then finds every event that arrived meanwhile, so a busy loop
 * makes fewer wake-ups and fewer reads and writes per event, and an event waits at most
 * <window_us> (plus the kernel's timer slack) longer than it would have. A loop that is idle or
 * lightly loaded (its turns block, waiting for the next event, for longer than the window on
 * average) never waits: the first event after a quiet spell is handled at once. */
#ifndef AGW_LOOP_H
#define AGW_LOOP_H

#include "agw/common.h"

struct event_base;

/* Bounded work per loop turn (agw_loop_new()): a callback's own work is bounded elsewhere (one read
 * of at most 64 KiB), so a saturated loop answers within about this plus one callback. */
#define AGW_LOOP_SLICE_US 1000

/* A new event loop as every worker runs one: AGW_N_PRIORITIES priorities (include/agw/common.h),
 * and bounded work per turn — once callbacks of AGW_PRIO_NEW and lower priorities have run for
 * AGW_LOOP_SLICE_US in a turn, libevent looks at the sockets and the timers again before running
 * the rest, so that a saturated loop still accepts, answers and fires its timers. NULL when
 * libevent cannot make one. */
struct event_base *agw_loop_new(void);

/* What a loop did; updated with relaxed atomic stores, so another thread may read it. */
struct agw_loop_stats {
    uint64_t turns; /* looks at the sockets that ran callbacks */
    uint64_t naps;  /* turns after which the loop waited for the window to pass */
};

/* Runs <base> until event_base_loopexit()/loopbreak() or until no event is left, as
 * event_base_dispatch() does, batching wake-ups over <window_us> (0: never; plain dispatch).
 * <st>, when not NULL, is kept up to date. Returns what event_base_dispatch() would: 0 after an
 * exit or a break, 1 when no event was left, -1 on an error. */
int agw_loop_run(struct event_base *base, uint32_t window_us, struct agw_loop_stats *st);

#endif
