/* Tests for src/balance.c: rendezvous hashing spreads threads evenly, keeps a thread on its
 * backend, moves only about 1/n of the threads when a backend comes or goes (and only to or from
 * that backend), orders the rest for retries; round robin rotates. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "agw/balance.h"

#define THREADS 30000

static const char *const URLS[] = {"http://10.0.0.1:9001/agent", "http://10.0.0.2:9001/agent",
                                   "http://10.0.0.3:9001/agent", "http://10.0.0.4:9001/agent",
                                   "http://10.0.0.5:9001/agent"};

static size_t first_of(const char *const *keys, size_t n, const char *thread)
{
    size_t order[8], rr = 0;

    agw_balance_order(AGW_BALANCE_THREAD_AFFINITY, keys, n, thread, &rr, order);
    return order[0];
}

static void thread_name(char *buf, size_t len, int i)
{
    snprintf(buf, len, "thread-%d", i);
}

Test(balance, threads_spread_evenly)
{
    size_t count[5] = {0};
    char t[32];

    for (int i = 0; i < THREADS; i++) {
        thread_name(t, sizeof(t), i);
        count[first_of(URLS, 5, t)]++;
    }
    for (size_t b = 0; b < 5; b++) /* 6000 expected each; 5 % either way */
        cr_assert(count[b] > 5700 && count[b] < 6300, "backend %zu got %zu of %d", b, count[b],
                  THREADS);
}

Test(balance, a_thread_keeps_its_backend)
{
    for (int i = 0; i < 100; i++) {
        char t[32];
        thread_name(t, sizeof(t), i);
        size_t a = first_of(URLS, 5, t);
        for (int k = 0; k < 10; k++)
            cr_assert_eq(first_of(URLS, 5, t), a);
    }
}

/* Adding a fifth backend moves about 1/5 of the threads, each to the new one. */
Test(balance, adding_a_backend_moves_only_its_share)
{
    size_t moved = 0;
    char t[32];

    for (int i = 0; i < THREADS; i++) {
        thread_name(t, sizeof(t), i);
        size_t before = first_of(URLS, 4, t), after = first_of(URLS, 5, t);
        if (before != after) {
            cr_assert_eq(after, 4, "a thread moved between old backends");
            moved++;
        }
    }
    cr_assert(moved > THREADS / 5 - 300 && moved < THREADS / 5 + 300, "%zu of %d moved", moved,
              THREADS);
}

/* Removing backend 2 moves exactly its threads, and each goes to its second choice. */
Test(balance, removing_a_backend_moves_only_its_threads)
{
    const char *const without[] = {URLS[0], URLS[1], URLS[3], URLS[4]};
    const size_t map[] = {0, 1, 3, 4}; /* index in <without> → index in URLS */
    size_t moved = 0;
    char t[32];

    for (int i = 0; i < THREADS; i++) {
        size_t order[8], rr = 0;
        thread_name(t, sizeof(t), i);
        agw_balance_order(AGW_BALANCE_THREAD_AFFINITY, URLS, 5, t, &rr, order);
        size_t after = map[first_of(without, 4, t)];
        if (order[0] == 2) {
            cr_assert_eq(after, order[1], "a removed backend's thread went to its second choice");
            moved++;
        } else {
            cr_assert_eq(after, order[0], "a thread of a remaining backend moved");
        }
    }
    cr_assert(moved > THREADS / 5 - 300 && moved < THREADS / 5 + 300, "%zu moved", moved);
}

Test(balance, the_order_is_a_permutation_by_weight)
{
    size_t order[5], rr = 0;

    agw_balance_order(AGW_BALANCE_THREAD_AFFINITY, URLS, 5, "t1", &rr, order);
    bool seen[5] = {false};
    for (size_t i = 0; i < 5; i++) {
        cr_assert_lt(order[i], 5);
        cr_assert(!seen[order[i]]);
        seen[order[i]] = true;
        if (i > 0)
            cr_assert_geq(agw_balance_weight("t1", URLS[order[i - 1]]),
                          agw_balance_weight("t1", URLS[order[i]]));
    }
    cr_assert_eq(rr, 0, "affinity leaves the cursor alone");
}

Test(balance, round_robin_rotates)
{
    size_t order[3], rr = 0;

    for (size_t run = 0; run < 7; run++) {
        agw_balance_order(AGW_BALANCE_ROUND_ROBIN, URLS, 3, "same-thread", &rr, order);
        for (size_t i = 0; i < 3; i++)
            cr_assert_eq(order[i], (run + i) % 3, "run %zu position %zu", run, i);
    }
    agw_balance_order(AGW_BALANCE_ROUND_ROBIN, URLS, 1, "x", &rr, order);
    cr_assert_eq(order[0], 0);
}

/* ---- passive health ----------------------------------------------------------------------------
 */

Test(balance, one_failure_marks_a_backend_down_for_fail_timeout)
{
    struct agw_health h = {0};

    cr_assert(!agw_health_down(&h, 1000));
    cr_assert(agw_health_failed(&h, 1000, 1, 10000), "marked at the first failure");
    cr_assert(agw_health_down(&h, 1000));
    cr_assert(agw_health_down(&h, 10999));
    cr_assert(!agw_health_down(&h, 11000), "up again once fail_timeout passed");
    cr_assert(!agw_health_failed(&h, 5000, 1, 10000), "a failure while down marks nothing new");
    cr_assert(agw_health_down(&h, 14999), "… but keeps it down from then on");
    cr_assert(!agw_health_clean(&h));
    cr_assert(agw_health_succeeded(&h), "an answer brings it back, and says so");
    cr_assert(!agw_health_down(&h, 5000));
    cr_assert(agw_health_clean(&h));
    cr_assert(!agw_health_succeeded(&h), "said once");
}

Test(balance, max_fails_counts_failures_within_fail_timeout)
{
    struct agw_health h = {0};

    cr_assert(!agw_health_failed(&h, 0, 3, 1000));
    cr_assert(!agw_health_failed(&h, 500, 3, 1000));
    cr_assert(!agw_health_failed(&h, 1000, 3, 1000), "the window began at 0: this one starts anew");
    cr_assert(!agw_health_failed(&h, 1500, 3, 1000));
    cr_assert(!agw_health_down(&h, 1500));
    cr_assert(agw_health_failed(&h, 1999, 3, 1000), "three within fail_timeout");
    cr_assert(agw_health_down(&h, 2998));
    cr_assert(!agw_health_down(&h, 2999));

    struct agw_health g = {0};
    cr_assert(!agw_health_failed(&g, 0, 2, 1000));
    cr_assert(!agw_health_clean(&g), "failing, not yet down");
    cr_assert(!agw_health_succeeded(&g), "an answer clears the count (it was not down)");
    cr_assert(agw_health_clean(&g));
    cr_assert(!agw_health_failed(&g, 10, 2, 1000), "counted from one again");
}

Test(balance, max_fails_zero_never_marks)
{
    struct agw_health h = {0};

    for (int i = 0; i < 100; i++)
        cr_assert(!agw_health_failed(&h, (uint64_t)i, 0, 1000));
    cr_assert(!agw_health_down(&h, 50));
    cr_assert(agw_health_clean(&h));
}

Test(balance, backends_down_come_after_the_others_in_their_order)
{
    struct agw_health h[5] = {{0}};
    size_t order[5] = {3, 1, 4, 0, 2};

    agw_health_failed(&h[1], 100, 1, 1000);
    agw_health_failed(&h[0], 100, 1, 1000);
    agw_balance_skip_down(order, 5, h, 500);
    size_t want[5] = {3, 4, 2, 1, 0};
    for (size_t i = 0; i < 5; i++)
        cr_assert_eq(order[i], want[i], "position %zu", i);

    size_t again[5] = {3, 1, 4, 0, 2};
    agw_balance_skip_down(again, 5, h, 1100); /* both up again */
    size_t same[5] = {3, 1, 4, 0, 2};
    for (size_t i = 0; i < 5; i++)
        cr_assert_eq(again[i], same[i]);

    struct agw_health all[2] = {{0}};
    size_t two[2] = {1, 0};
    agw_health_failed(&all[0], 0, 1, 1000);
    agw_health_failed(&all[1], 0, 1, 1000);
    agw_balance_skip_down(two, 2, all, 10);
    cr_assert(two[0] == 1 && two[1] == 0, "all down: the order stays, and all are tried");
}
