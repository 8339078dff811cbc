/* Running an event loop with wake-up batching: see include/agw/loop.h. */
#include "config.h"

#include <time.h>

#include <event2/event.h>

#include "agw/loop.h"

struct event_base *agw_loop_new(void)
{
    struct event_config *ec = event_config_new();
    const struct timeval slice = {.tv_sec = 0, .tv_usec = AGW_LOOP_SLICE_US};
    struct event_base *base = NULL;

    if (ec == NULL)
        return NULL;
    /* The precise clock: libevent otherwise reads CLOCK_MONOTONIC_COARSE, which moves in steps of
     * the kernel's tick (4 ms at HZ=250), and a slice of 1 ms measured with it lasts 0 to 4 ms. */
    if (event_config_set_max_dispatch_interval(ec, &slice, -1, AGW_PRIO_NEW) == 0 &&
        event_config_set_flag(ec, EVENT_BASE_FLAG_PRECISE_TIMER) == 0)
        base = event_base_new_with_config(ec);
    event_config_free(ec);
    if (base != NULL && event_base_priority_init(base, AGW_N_PRIORITIES) != 0) {
        event_base_free(base);
        base = NULL;
    }
    return base;
}

int agw_loop_run(struct event_base *base, uint32_t window_us, struct agw_loop_stats *st)
{
    const int64_t window = window_us;
    /* The mean turn, smoothed over about sixteen turns; it starts as an idle loop's. A loop is
     * busy while the mean is under half the window: paced streams (events a millisecond apart per
     * stream, in bursts) give means of about 200 µs, a saturated relay of about 20 to 50 µs. */
    int64_t mean = 16 * window;
    uint64_t turns = 0, naps = 0;

    if (window_us == 0)
        return event_base_dispatch(base);
    for (;;) {
        int64_t t0 = (int64_t)agw_now_us(), turn;
        int rc = event_base_loop(base, EVLOOP_ONCE);

        if (rc != 0 || event_base_got_exit(base) || event_base_got_break(base))
            return rc;
        turn = (int64_t)agw_now_us() - t0;
        mean += (turn - mean) / 16;
        turns++;
        if (turn < window && 2 * mean < window) {
            struct timespec d = {.tv_sec = 0, .tv_nsec = (long)(window - turn) * 1000};

            nanosleep(&d, NULL);
            naps++;
        }
        if (st != NULL) {
            __atomic_store_n(&st->turns, turns, __ATOMIC_RELAXED);
            __atomic_store_n(&st->naps, naps, __ATOMIC_RELAXED);
        }
    }
}
