/* Unit tests for src/runs.c: the active-run registry's three lookups, newest-first order, growth,
 * and removal in any order leaving it empty. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agw/runs.h"

static int owners[8]; /* distinct addresses to tell runs apart */

Test(runs, add_find_remove)
{
    struct agw_runs *runs = agw_runs_new();
    struct agw_run_entry *e =
        agw_runs_add(runs, "weather", "t1", "r1", "http://127.0.0.1:9001/agent", NULL, &owners[0]);

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
    struct agw_runs *runs = agw_runs_new();
    struct agw_run_entry *a = agw_runs_add(runs, "ag", "t", "r1", "u", NULL, &owners[0]);
    struct agw_run_entry *b = agw_runs_add(runs, "ag", "t", "r2", "u", NULL, &owners[1]);
    struct agw_run_entry *c = agw_runs_add(runs, "ag", "u", "r3", "u", NULL, &owners[2]);

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
    struct agw_runs *runs = agw_runs_new();
    struct agw_run_entry *old = agw_runs_add(runs, "ag", "t", "r", "u", NULL, &owners[0]);
    struct agw_run_entry *new = agw_runs_add(runs, "ag", "t", "r", "u", NULL, &owners[1]);

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
    struct agw_runs *runs = agw_runs_new();
    struct agw_run_entry *out[4];
    struct agw_run_entry *a = agw_runs_add(runs, "ag", "t1", "r", "u", NULL, &owners[0]);
    struct agw_run_entry *b = agw_runs_add(runs, "ag", "t2", "r", "u", NULL, &owners[1]);

    agw_runs_add(runs, "other", "t1", "r", "u", NULL, &owners[2]);
    agw_runs_add(runs, "ag", "t1", "x", "u", NULL, &owners[3]);
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
    struct agw_runs *runs = agw_runs_new();
    struct agw_run_entry **e = calloc(N, sizeof(*e));
    char thread[32], run[32];

    for (int i = 0; i < N; i++) {
        snprintf(thread, sizeof(thread), "thread-%d", i % 100);
        snprintf(run, sizeof(run), "run-%d", i);
        e[i] = agw_runs_add(runs, "ag", thread, run, "u", NULL, &e[i]);
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
