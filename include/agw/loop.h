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
 * average) never waits: the first event after a quiet spell is handled at once.
 *
 * A loop that is not busy by that measure still naps after a turn in which a callback held a read
 * back (agw_loop_hold()): a socket that became readable again within the window of its last read
 * is in a burst (a backend writing a response's events one write() each, microseconds apart), and
 * its next read waits until the window since the last has passed, to take the rest of the burst in
 * one go rather than in one wake-up per write. */
#ifndef AGW_LOOP_H
#define AGW_LOOP_H

#include "agw/common.h"

struct event_base;
struct event;

/* Bounded work per loop turn: a callback's own work is bounded elsewhere (one read of at most
 * 64 KiB), so a saturated loop answers within about this plus one callback. */
#define AGW_LOOP_SLICE_US 1000

/* A new event loop as every worker runs one: AGW_N_PRIORITIES priorities (include/agw/common.h),
 * and bounded work per turn. Run by agw_loop_run(), a turn ends once callbacks that call
 * agw_loop_slice_check() (the reads of streams and of requests) have run for about
 * AGW_LOOP_SLICE_US; libevent then looks at the sockets and the timers again before running the
 * rest, so that a saturated loop still accepts and answers. Other callbacks of AGW_PRIO_NEW and
 * lower priorities are bounded by libevent's own slice, measured on its coarse clock: up to a
 * kernel tick (4 ms at HZ=250). Timers fire within a tick too (libevent's precise clock would
 * cost a system call per turn; doc/internals/loop.md). NULL when libevent cannot make one. */
struct event_base *agw_loop_new(void);

/* Called at the end of a callback whose work can be long (a read handled to its end): once the
 * callbacks of the running turn of agw_loop_run() on this thread have run for AGW_LOOP_SLICE_US,
 * counted from the first such call of the turn, the turn ends after this callback (an
 * event_base_loopbreak() that agw_loop_run() takes for the end of a turn, not of the run). A
 * clock read; nothing on a thread that runs no agw_loop_run(). */
void agw_loop_slice_check(void);

/* What a loop did; updated with relaxed atomic stores, so another thread may read it. */
struct agw_loop_stats {
    uint64_t turns; /* looks at the sockets that ran callbacks */
    uint64_t naps;  /* turns after which the loop waited for the window to pass */
    uint64_t holds; /* reads held back to the end of their turn (agw_loop_hold()) */
};

/* Runs <base> until event_base_loopexit()/loopbreak() or until no event is left, as
 * event_base_dispatch() does, batching wake-ups over <window_us> (0: never), one turn
 * (event_base_loop(EVLOOP_ONCE)) at a time.
 * <st>, when not NULL, is kept up to date. Returns what event_base_dispatch() would: 0 after an
 * exit or a break, 1 when no event was left, -1 on an error. (A break asked for from another
 * thread in the instant a slice's own break ends a turn is taken for that turn's end; the gateway
 * stops its loops with event_base_loopexit().) */
int agw_loop_run(struct event_base *base, uint32_t window_us, struct agw_loop_stats *st);

/* The batching window of the agw_loop_run() running on this thread; 0 when it batches nothing or
 * no agw_loop_run() runs here. */
uint32_t agw_loop_window_us(void);

/* The number of the turn that the agw_loop_run() on this thread is in (the first is 1; they are
 * counted over every run on the thread), 0 when no agw_loop_run() runs here. A turn looks at the
 * sockets before it runs any callback: whatever a socket reported by a number smaller than the
 * current one was reported to its event by the time the current turn's callbacks began. */
uint64_t agw_loop_turn(void);

/* Reads held back per turn at most; a callback that finds the list full reads at once. */
#define AGW_LOOP_MAX_HELD 64

/* Called by a read callback instead of reading a socket in a burst: <ev> (a read event of this
 * thread's loop) is made active with EV_READ at the end of the running turn, after a nap of at
 * least <wait_us> (at most the window) from now, for the burst to come in. False, with nothing
 * done, when no agw_loop_run() with a window runs on this thread or AGW_LOOP_MAX_HELD reads are
 * held: the caller reads now. An event held must not be freed before it runs, unless
 * agw_loop_unhold() forgets it first. */
bool agw_loop_hold(struct event *ev, uint32_t wait_us);

/* A loop's mailbox: how another thread hands work to an event loop without libevent's locks (the
 * loops run their bases with libevent's threading support off). A message is posted from any
 * thread; the loop runs it on its own turn, in the order posted. Messages are the caller's
 * (intrusive: posting allocates nothing); <fn> runs once, on the loop with <dropped> false, or with
 * <dropped> true when the mailbox is freed with the message in it. */
struct agw_loop_mail {
    struct agw_loop_mail *next;
    void (*fn)(struct agw_loop_mail *m, bool dropped);
};
struct agw_loop_mailbox;

/* A mailbox for <base>'s loop: a list under a mutex and an eventfd the loop watches. NULL when the
 * eventfd cannot be made (errno says why). */
struct agw_loop_mailbox *agw_loop_mailbox_new(struct event_base *base);
/* Posts <m> (any thread): appended under the mutex, then the eventfd written. The loop only tries
 * the mutex (it never waits for a poster that lost its CPU while holding it): the poster's write,
 * made after it let go, brings it back. */
void agw_loop_mailbox_post(struct agw_loop_mailbox *mb, struct agw_loop_mail *m);
/* Frees the mailbox (on its loop's thread, once nothing posts any more): the messages still in it
 * are dropped (their <fn> with <dropped> true). NULL is a no-op. */
void agw_loop_mailbox_free(struct agw_loop_mailbox *mb);

/* Forgets <ev> if it is held (a linear walk of at most AGW_LOOP_MAX_HELD: for the rare case of a
 * held event freed or disabled before its turn ends). */
void agw_loop_unhold(struct event *ev);

#endif
