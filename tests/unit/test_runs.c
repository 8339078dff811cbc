/* Unit tests for src/runs.c: the active-run registry's three lookups, newest-first order, growth,
 * and removal in any order leaving it empty; its parts (one per event loop): lookups see every
 * part, newest first across them, and loops registering in their own parts at once lose nothing. */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agw/runs.h"

static int owners[8]; /* distinct addresses to tell runs apart */

Test(runs, add_find_remove)
{
    struct agw_runs *runs = agw_runs_new(1);
    struct agw_run_entry *e = agw_runs_add(runs, 0, "weather", "t1", "r1",
                                           "http://127.0.0.1:9001/agent", NULL, &owners[0]);

    cr_assert_str_eq(e->key, "ag_ui:weather:t1:r1");
    cr_assert_str_eq(e->backend_url, "http://127.0.0.1:9001/agent");
    cr_assert_eq(agw_runs_count(runs), 1);
    cr_assert_eq(agw_runs_find(runs, "weather", "t1", "r1"), e);
    cr_assert_null(agw_runs_find(runs, "weather", "t1", "r2"));
    cr_assert_null(agw_runs_find(runs, "weather", "t2", "r1"));
    cr_assert_null(agw_runs_find(runs, "other", "t1", "r1"));
    /* the separator keeps ("a","bc") and ("ab","c") apart */
    cr_assert_null(agw_runs_find(runs, "weathert", "1", "r1"));
    cr_assert_eq(agw_runs_latest(runs, "weather", "t1"), e);
    cr_assert_null(agw_runs_latest(runs, "weather", "t2"));
    agw_runs_remove(runs, e);
    cr_assert_eq(agw_runs_count(runs), 0);
    cr_assert_null(agw_runs_find(runs, "weather", "t1", "r1"));
    cr_assert_null(agw_runs_latest(runs, "weather", "t1"));
    agw_runs_free(runs);
}

Test(runs, latest_of_thread_is_newest)
{
    struct agw_runs *runs = agw_runs_new(1);
    struct agw_run_entry *a = agw_runs_add(runs, 0, "ag", "t", "r1", "u", NULL, &owners[0]);
    struct agw_run_entry *b = agw_runs_add(runs, 0, "ag", "t", "r2", "u", NULL, &owners[1]);
    struct agw_run_entry *c = agw_runs_add(runs, 0, "ag", "u", "r3", "u", NULL, &owners[2]);

    cr_assert_eq(agw_runs_latest(runs, "ag", "t"), b);
    cr_assert_eq(agw_runs_latest(runs, "ag", "u"), c);
    agw_runs_remove(runs, b);
    cr_assert_eq(agw_runs_latest(runs, "ag", "t"), a);
    agw_runs_remove(runs, a);
    cr_assert_null(agw_runs_latest(runs, "ag", "t"));
    cr_assert_eq(agw_runs_latest(runs, "ag", "u"), c);
    agw_runs_free(runs); /* frees c */
}

Test(runs, reused_key_returns_newest_and_removes_the_right_one)
{
    struct agw_runs *runs = agw_runs_new(1);
    struct agw_run_entry *old = agw_runs_add(runs, 0, "ag", "t", "r", "u", NULL, &owners[0]);
    struct agw_run_entry *new = agw_runs_add(runs, 0, "ag", "t", "r", "u", NULL, &owners[1]);

    cr_assert_eq(agw_runs_find(runs, "ag", "t", "r"), new);
    agw_runs_remove(runs, new);
    cr_assert_eq(agw_runs_find(runs, "ag", "t", "r"), old);
    cr_assert_eq(agw_runs_find(runs, "ag", "t", "r")->owner, &owners[0]);
    agw_runs_remove(runs, old);
    cr_assert_eq(agw_runs_count(runs), 0);
    agw_runs_free(runs);
}

Test(runs, by_run_id_across_threads)
{
    struct agw_runs *runs = agw_runs_new(1);
    struct agw_run_entry *out[4];
    struct agw_run_entry *a = agw_runs_add(runs, 0, "ag", "t1", "r", "u", NULL, &owners[0]);
    struct agw_run_entry *b = agw_runs_add(runs, 0, "ag", "t2", "r", "u", NULL, &owners[1]);

    agw_runs_add(runs, 0, "other", "t1", "r", "u", NULL, &owners[2]);
    agw_runs_add(runs, 0, "ag", "t1", "x", "u", NULL, &owners[3]);
    cr_assert_eq(agw_runs_by_run_id(runs, "ag", "r", out, 4), 2);
    cr_assert_eq(out[0], b);
    cr_assert_eq(out[1], a);
    cr_assert_eq(agw_runs_by_run_id(runs, "ag", "r", out, 1), 2, "counts beyond max");
    cr_assert_eq(out[0], b);
    cr_assert_eq(agw_runs_by_run_id(runs, "ag", "nope", out, 4), 0);
    agw_runs_free(runs);
}

/* Thousands of runs force several table doublings; every lookup still finds its entry and the
 * newest-first order survives the rehash. Removal in an interleaved order empties the registry. */
Test(runs, growth_and_removal)
{
    enum { N = 5000 };
    struct agw_runs *runs = agw_runs_new(1);
    struct agw_run_entry **e = calloc(N, sizeof(*e));
    char thread[32], run[32];

    for (int i = 0; i < N; i++) {
        snprintf(thread, sizeof(thread), "thread-%d", i % 100);
        snprintf(run, sizeof(run), "run-%d", i);
        e[i] = agw_runs_add(runs, 0, "ag", thread, run, "u", NULL, &e[i]);
    }
    cr_assert_eq(agw_runs_count(runs), N);
    for (int i = 0; i < N; i++) {
        snprintf(thread, sizeof(thread), "thread-%d", i % 100);
        snprintf(run, sizeof(run), "run-%d", i);
        cr_assert_eq(agw_runs_find(runs, "ag", thread, run), e[i], "run %d", i);
    }
    for (int t = 0; t < 100; t++) {
        snprintf(thread, sizeof(thread), "thread-%d", t);
        cr_assert_eq(agw_runs_latest(runs, "ag", thread), e[N - 100 + t], "thread %d", t);
    }
    for (int i = 0; i < N; i += 2)
        agw_runs_remove(runs, e[i]);
    for (int i = N - 1; i > 0; i -= 2)
        agw_runs_remove(runs, e[i]);
    cr_assert_eq(agw_runs_count(runs), 0);
    cr_assert_null(agw_runs_latest(runs, "ag", "thread-1"));
    free(e);
    agw_runs_free(runs);
}

/* Runs registered in different parts (loops): every lookup sees them all, the newest first. */
Test(runs, lookups_see_every_part_newest_first)
{
    struct agw_runs *runs = agw_runs_new(3);
    struct agw_run_entry *out[4];
    struct agw_run_entry *a = agw_runs_add(runs, 2, "ag", "t", "r", "u", NULL, &owners[0]);
    struct agw_run_entry *b = agw_runs_add(runs, 0, "ag", "t", "r", "u", NULL, &owners[1]);
    struct agw_run_entry *c = agw_runs_add(runs, 1, "ag", "t2", "r", "u", NULL, &owners[2]);
    struct agw_run_entry *d = agw_runs_add(runs, 2, "ag", "t", "q", "u", NULL, &owners[3]);

    cr_assert_eq(a->part, 2);
    cr_assert_eq(b->part, 0);
    cr_assert_eq(agw_runs_add(runs, 7, "ag", "x", "x", "u", NULL, NULL)->part, 0,
                 "out of range: part 0");
    cr_assert_eq(agw_runs_count(runs), 5);
    cr_assert_eq(agw_runs_find(runs, "ag", "t", "r"), b, "the same key in two parts: the newer");
    cr_assert_eq(agw_runs_latest(runs, "ag", "t"), d);
    cr_assert_eq(agw_runs_latest(runs, "ag", "t2"), c);
    cr_assert_eq(agw_runs_by_run_id(runs, "ag", "r", out, 4), 3);
    cr_assert_eq(out[0], c);
    cr_assert_eq(out[1], b);
    cr_assert_eq(out[2], a);
    cr_assert_eq(agw_runs_by_run_id(runs, "ag", "r", out, 2), 3, "counts beyond max");
    cr_assert_eq(out[0], c);
    cr_assert_eq(out[1], b);
    agw_runs_remove(runs, b);
    cr_assert_eq(agw_runs_find(runs, "ag", "t", "r"), a);
    agw_runs_remove(runs, d);
    cr_assert_eq(agw_runs_latest(runs, "ag", "t"), a);
    agw_runs_free(runs);
}

struct loop_runs {
    struct agw_runs *runs;
    unsigned part;
};

enum { LOOP_RUNS = 20000 };

/* A loop's runs: registered and removed in its part, a few at a time. */
static void *register_runs(void *arg)
{
    struct loop_runs *l = arg;
    struct agw_run_entry *live[8] = {0};
    char thread[32], run[32];

    for (int i = 0; i < LOOP_RUNS; i++) {
        snprintf(thread, sizeof(thread), "t%u-%d", l->part, i % 50);
        snprintf(run, sizeof(run), "r%u-%d", l->part, i);
        agw_runs_remove(l->runs, live[i % 8]);
        live[i % 8] = agw_runs_add(l->runs, l->part, "ag", thread, run, "u", NULL, NULL);
    }
    for (int i = 0; i < 8; i++)
        agw_runs_remove(l->runs, live[i]);
    return NULL;
}

/* Two loops register runs in their own parts while a third thread looks them up under the lock:
 * each lookup finds what it should, and the registry ends empty. */
Test(runs, loops_register_in_their_parts_while_lookups_run)
{
    struct agw_runs *runs = agw_runs_new(2);
    struct loop_runs l[2] = {{runs, 0}, {runs, 1}};
    pthread_t t[2];
    size_t found = 0;

    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, register_runs, &l[i]), 0);
    for (int k = 0; k < 2000; k++) {
        struct agw_run_entry *e;
        agw_runs_lock(runs);
        e = agw_runs_latest(runs, "ag", k % 2 ? "t1-7" : "t0-7");
        if (e != NULL) {
            cr_assert_str_eq(e->thread_id, k % 2 ? "t1-7" : "t0-7");
            cr_assert_eq(e->part, (unsigned)(k % 2));
            found++;
        }
        agw_runs_unlock(runs);
        cr_assert_leq(agw_runs_count(runs), 16);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(agw_runs_count(runs), 0);
    cr_log_info("lookups that found a live run: %zu of 2000", found);
    agw_runs_free(runs);
}
