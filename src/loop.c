/* Running an event loop with wake-up batching: see include/agw/loop.h. */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "agw/log.h"
#include "agw/loop.h"

/* The turn this thread's loop is running, for agw_loop_slice_check(): its loop (NULL: no
 * agw_loop_run() on this thread), when its first check came (0: none yet; the callbacks began
 * after the wait for readiness, which a turn's own start would count), and whether a check ended
 * it. */
static _Thread_local struct {
    struct event_base *base;
    int64_t start;
    bool ended;
    uint32_t window;    /* the run's batching window (0: none, or no run on this thread) */
    unsigned n_held;    /* events in <held>, activated after the turn (agw_loop_hold()) */
    int64_t held_until; /* when the last of them is due (agw_now_us()) */
    struct event *held[AGW_LOOP_MAX_HELD];
    uint64_t turn; /* agw_loop_turn(): the turns begun by this thread's runs, this one counted */
} cur;

struct event_base *agw_loop_new(void)
{
    struct event_config *ec = event_config_new();
    const struct timeval slice = {.tv_sec = 0, .tv_usec = AGW_LOOP_SLICE_US};
    struct event_base *base = NULL;

    if (ec == NULL)
        return NULL;
    /* libevent's own slice is a backstop, for the callbacks that do not call
     * agw_loop_slice_check(): on its clock, CLOCK_MONOTONIC_COARSE, it ends a turn at the first
     * tick (4 ms at HZ=250) after the slice. Not EVENT_BASE_FLAG_PRECISE_TIMER: libevent 2.1 then
     * arms a timerfd before every epoll_wait(), a system call per turn (doc/internals/loop.md). */
    if (event_config_set_max_dispatch_interval(ec, &slice, -1, AGW_PRIO_NEW) == 0)
        base = event_base_new_with_config(ec);
    event_config_free(ec);
    if (base != NULL && event_base_priority_init(base, AGW_N_PRIORITIES) != 0) {
        event_base_free(base);
        base = NULL;
    }
    return base;
}

void agw_loop_slice_check(void)
{
    int64_t now;

    if (cur.base == NULL || cur.ended)
        return;
    now = (int64_t)agw_now_us();
    if (cur.start == 0) {
        cur.start = now;
        return;
    }
    /* A break someone else asked for is theirs: the run ends on it, as it would have. */
    if (now - cur.start < AGW_LOOP_SLICE_US || event_base_got_break(cur.base))
        return;
    cur.ended = true;
    event_base_loopbreak(cur.base);
}

uint32_t agw_loop_window_us(void)
{
    return cur.base != NULL ? cur.window : 0;
}

uint64_t agw_loop_turn(void)
{
    return cur.base != NULL ? cur.turn : 0;
}

bool agw_loop_hold(struct event *ev, uint32_t wait_us)
{
    int64_t due;

    if (cur.base == NULL || cur.window == 0 || cur.n_held == AGW_LOOP_MAX_HELD)
        return false;
    due = (int64_t)agw_now_us() + (wait_us < cur.window ? wait_us : cur.window);
    if (cur.n_held == 0 || due > cur.held_until)
        cur.held_until = due;
    cur.held[cur.n_held++] = ev;
    return true;
}

void agw_loop_unhold(struct event *ev)
{
    for (unsigned i = 0; i < cur.n_held; i++)
        if (cur.held[i] == ev)
            cur.held[i] = NULL;
}

/* The held events made active: their callbacks run in the next turn. */
static void release_held(void)
{
    for (unsigned i = 0; i < cur.n_held; i++)
        if (cur.held[i] != NULL)
            event_active(cur.held[i], EV_READ, 1);
    cur.n_held = 0;
}

int agw_loop_run(struct event_base *base, uint32_t window_us, struct agw_loop_stats *st)
{
    const int64_t window = window_us;
    /* The mean turn, smoothed over about sixteen turns; it starts as an idle loop's. A loop is
     * busy while the mean is under half the window: paced streams (events a millisecond apart per
     * stream, in bursts) give means of about 200 µs, a saturated relay of about 20 to 50 µs. */
    int64_t mean = 16 * window;
    uint64_t turns = 0, naps = 0, holds = 0;
    int rc;

    cur.window = window_us;
    cur.n_held = 0;

    for (;;) {
        int64_t t0 = (int64_t)agw_now_us(), now, len, nap;

        cur.base = base;
        cur.start = 0;
        cur.ended = false;
        cur.turn++;
        rc = event_base_loop(base, EVLOOP_ONCE);
        /* A turn that agw_loop_slice_check() ended is a turn like the others: the callbacks left
         * active run in the next, after a look at the sockets and the timers. */
        if (rc != 0 || event_base_got_exit(base) || (event_base_got_break(base) && !cur.ended))
            break;
        now = (int64_t)agw_now_us();
        len = now - t0;
        mean += (len - mean) / 16;
        turns++;
        /* A busy loop naps until the window since its last look has passed; one that holds a read
         * back (a socket in a burst), until the held reads are due. */
        nap = window > 0 && len < window && 2 * mean < window ? window - len : 0;
        if (cur.n_held > 0 && cur.held_until - now > nap)
            nap = cur.held_until - now;
        if (nap > 0) {
            struct timespec d = {.tv_sec = 0, .tv_nsec = (long)nap * 1000};

            nanosleep(&d, NULL);
            naps++;
        }
        if (cur.n_held > 0) {
            holds += cur.n_held;
            release_held();
        }
        if (st != NULL) {
            __atomic_store_n(&st->turns, turns, __ATOMIC_RELAXED);
            __atomic_store_n(&st->naps, naps, __ATOMIC_RELAXED);
            __atomic_store_n(&st->holds, holds, __ATOMIC_RELAXED);
        }
    }
    /* Whatever is held when the run ends is let go: a run started again reads it at once. */
    release_held();
    cur.base = NULL;
    return rc;
}

/* ---- mailbox -------------------------------------------------------------------------------- */

struct agw_loop_mailbox {
    pthread_mutex_t lock;
    struct agw_loop_mail *head, **tail; /* under <lock> */
    int fd;                             /* eventfd */
    struct event *ev;
};

static void mailbox_cb(evutil_socket_t fd, short what, void *arg)
{
    struct agw_loop_mailbox *mb = arg;
    struct agw_loop_mail *m, *next;
    uint64_t n;

    (void)what;
    if (read(fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
        agw_log_error("event loop mailbox: %s", strerror(errno));
    if (pthread_mutex_trylock(&mb->lock) != 0)
        return; /* a poster holds it: its write, once it lets go, brings the loop back */
    m = mb->head;
    mb->head = NULL;
    mb->tail = &mb->head;
    pthread_mutex_unlock(&mb->lock);
    for (; m != NULL; m = next) {
        next = m->next;
        m->fn(m, false);
    }
}

struct agw_loop_mailbox *agw_loop_mailbox_new(struct event_base *base)
{
    struct agw_loop_mailbox *mb = agw_xcalloc(1, sizeof(*mb));

    mb->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (mb->fd < 0) {
        free(mb);
        return NULL;
    }
    pthread_mutex_init(&mb->lock, NULL);
    mb->tail = &mb->head;
    mb->ev = event_new(base, mb->fd, EV_READ | EV_PERSIST, mailbox_cb, mb);
    if (mb->ev == NULL || event_add(mb->ev, NULL) != 0)
        abort(); /* out of memory: the daemon's policy */
    return mb;
}

void agw_loop_mailbox_post(struct agw_loop_mailbox *mb, struct agw_loop_mail *m)
{
    const uint64_t one = 1;

    m->next = NULL;
    pthread_mutex_lock(&mb->lock);
    *mb->tail = m;
    mb->tail = &m->next;
    pthread_mutex_unlock(&mb->lock);
    /* (an eventfd write fails only when its counter would overflow: each turn of the loop reads
     * it back to 0) */
    if (write(mb->fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        agw_log_error("event loop mailbox: cannot wake the loop: %s", strerror(errno));
}

void agw_loop_mailbox_free(struct agw_loop_mailbox *mb)
{
    struct agw_loop_mail *m, *next;

    if (mb == NULL)
        return;
    for (m = mb->head; m != NULL; m = next) {
        next = m->next;
        m->fn(m, true);
    }
    event_free(mb->ev);
    close(mb->fd);
    pthread_mutex_destroy(&mb->lock);
    free(mb);
}
