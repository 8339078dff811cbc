/* Tests for src/metrics.c: counters land on their lines, requests are counted by agent, every
 * failure kind is exported, and the whole exposition is well-formed Prometheus text (every sample
 * belongs to a metric announced by HELP and TYPE, names and labels are valid). */
#include <criterion/criterion.h>

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "agw/metrics.h"

static char *expose_all(struct agw_metrics *const *m, size_t n_shards)
{
    static const int statuses[] = {400, 431};
    static const uint64_t refused[] = {3, 1};
    struct agw_metrics_gauges g = {.active_runs = 2,
                                   .open_relays = 5,
                                   .accept_errors = 7,
                                   .refusal_statuses = statuses,
                                   .refused = refused,
                                   .n_refusals = 2};
    struct evbuffer *b = evbuffer_new();
    size_t n;
    char *s;

    agw_metrics_write(m, n_shards, &g, b);
    n = evbuffer_get_length(b);
    s = malloc(n + 1);
    evbuffer_remove(b, s, n);
    s[n] = '\0';
    evbuffer_free(b);
    return s;
}

static char *expose(struct agw_metrics *m)
{
    return expose_all(&m, 1);
}

static bool has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)) != NULL; p++)
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return true;
    return false;
}

Test(metrics, counters_and_gauges)
{
    struct agw_metrics *m = agw_metrics_new();

    agw_metrics_add(m, AGW_C_EVENTS, 10);
    agw_metrics_add(m, AGW_C_EVENTS, 5);
    agw_metrics_add(m, AGW_C_DECISIONS_STREAMED, 1);
    cr_assert_eq(agw_metrics_get(m, AGW_C_EVENTS), 15);
    agw_metrics_request(m, "weather", 200);
    agw_metrics_request(m, "weather", 200);
    agw_metrics_request(m, NULL, 404);
    agw_metrics_upstream_failure(m, AGW_UP_CONTENT_TYPE);
    agw_metrics_upstream_failure(m, AGW_UP_OK);
    char *s = expose(m);
    cr_assert(has_line(s, "agw_events_relayed_total 15"), "%s", s);
    cr_assert(has_line(s, "agw_decisions_streamed_total 1"), "%s", s);
    cr_assert(has_line(s, "agw_requests_total{agent=\"weather\",status=\"200\"} 2"), "%s", s);
    cr_assert(has_line(s, "agw_requests_total{agent=\"\",status=\"404\"} 1"), "%s", s);
    cr_assert(has_line(s, "agw_upstream_failures_total{kind=\"content_type\"} 1"), "%s", s);
    cr_assert(has_line(s, "agw_upstream_failures_total{kind=\"empty_stream\"} 0"), "%s", s);
    cr_assert(has_line(s, "agw_active_runs 2"), "%s", s);
    cr_assert(has_line(s, "agw_open_relays 5"), "%s", s);
    cr_assert(has_line(s, "agw_accept_errors_total 7"), "%s", s);
    cr_assert(has_line(s, "agw_requests_refused_total{status=\"431\"} 1"), "%s", s);
    free(s);
    agw_metrics_free(m);
}

static bool name_ok(const char *s, size_t n)
{
    if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':'))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':'))
            return false;
    return true;
}

/* Each sample's metric was announced by a HELP and a TYPE line just before its samples (a
 * histogram's as <name>_bucket, _sum and _count); every failure kind has a sample; no metric is
 * announced twice. */
Test(metrics, the_exposition_is_well_formed)
{
    struct agw_metrics *m = agw_metrics_new();
    char announced[64][64];
    size_t n_announced = 0;
    char current[64] = "", type[16] = "";

    agw_metrics_request(m, "weather", 200);
    agw_metrics_observe_run(m, "weather", 700, 20000, 1500000);
    char *s = expose(m);
    for (char *line = strtok(s, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char name[64];
        if (strncmp(line, "# HELP ", 7) == 0) {
            cr_assert_eq(sscanf(line + 7, "%63s", name), 1);
            for (size_t i = 0; i < n_announced; i++)
                cr_assert_str_neq(announced[i], name, "%s announced twice", name);
            snprintf(announced[n_announced++], sizeof(announced[0]), "%s", name);
            snprintf(current, sizeof(current), "%s", name);
            continue;
        }
        if (strncmp(line, "# TYPE ", 7) == 0) {
            cr_assert_eq(sscanf(line + 7, "%63s %15s", name, type), 2, "%s", line);
            cr_assert_str_eq(name, current, "TYPE without its HELP: %s", line);
            cr_assert(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 ||
                          strcmp(type, "histogram") == 0,
                      "%s", line);
            continue;
        }
        size_t k = strcspn(line, "{ ");
        size_t base = strlen(current);
        cr_assert(name_ok(line, k), "bad metric name: %s", line);
        cr_assert(strncmp(line, current, base) == 0, "a sample of a metric not announced: %s",
                  line);
        if (strcmp(type, "histogram") == 0)
            cr_assert(strncmp(line + base, "_bucket{", 8) == 0 ||
                          strncmp(line + base, "_sum{", 5) == 0 ||
                          strncmp(line + base, "_count{", 7) == 0,
                      "a histogram's sample is a _bucket, _sum or _count: %s", line);
        else
            cr_assert_eq(k, base, "a sample of a metric not announced just before: %s", line);
        if (line[k] == '{') {
            char *end = strchr(line, '}');
            cr_assert_not_null(end, "%s", line);
            k = (size_t)(end - line) + 1;
        }
        cr_assert_eq(line[k], ' ', "%s", line);
        char *num_end = NULL;
        strtod(line + k + 1, &num_end);
        cr_assert(num_end != line + k + 1 && *num_end == '\0', "bad value: %s", line);
    }
    cr_assert_geq(n_announced, 15);
    free(s);
    s = expose(m);
    for (int kind = AGW_UP_OK + 1; kind < AGW_UP_N_FAILURES; kind++) {
        char want[128];
        snprintf(want, sizeof(want), "agw_upstream_failures_total{kind=\"%s\"} 0",
                 agw_up_failure_name((enum agw_up_failure)kind));
        cr_assert(has_line(s, want), "no line %s", want);
    }
    free(s);
    agw_metrics_free(m);
}

/* A histogram: cumulative buckets in ascending order of le, +Inf equal to _count, _sum in seconds;
 * a value not measured is left out; one table per agent. */
Test(metrics, histograms)
{
    struct agw_metrics *m = agw_metrics_new();
    char *s;

    agw_metrics_observe_run(m, "weather", 400, 30000, 2000000);   /* 0.4 ms, 30 ms, 2 s */
    agw_metrics_observe_run(m, "weather", 3000, 7000000, 700000); /* 3 ms, 7 s, 0.7 s */
    agw_metrics_observe_run(m, "weather", AGW_UP_NOT_MEASURED, AGW_UP_NOT_MEASURED, 100000000);
    agw_metrics_observe_run(m, "news", AGW_UP_NOT_MEASURED, 1000, 4000000000u); /* over 30 min */
    s = expose(m);
    cr_assert(has_line(s, "# TYPE agw_upstream_connect_seconds histogram"), "%s", s);
    cr_assert(has_line(s, "agw_upstream_connect_seconds_bucket{agent=\"weather\",le=\"0.0005\"} 1"),
              "%s", s);
    cr_assert(has_line(s, "agw_upstream_connect_seconds_bucket{agent=\"weather\",le=\"0.0025\"} 1"),
              "%s", s);
    cr_assert(has_line(s, "agw_upstream_connect_seconds_bucket{agent=\"weather\",le=\"0.005\"} 2"),
              "%s", s);
    cr_assert(has_line(s, "agw_upstream_connect_seconds_bucket{agent=\"weather\",le=\"+Inf\"} 2"),
              "%s", s);
    cr_assert(has_line(s, "agw_upstream_connect_seconds_count{agent=\"weather\"} 2"), "%s", s);
    cr_assert(has_line(s, "agw_upstream_connect_seconds_sum{agent=\"weather\"} 0.003400"), "%s", s);
    cr_assert_null(strstr(s, "agw_upstream_connect_seconds_count{agent=\"news\"}"),
                   "no connect measured for news: no series");
    cr_assert(
        has_line(s, "agw_upstream_first_byte_seconds_bucket{agent=\"weather\",le=\"0.05\"} 1"),
        "%s", s);
    cr_assert(has_line(s, "agw_upstream_first_byte_seconds_bucket{agent=\"weather\",le=\"5\"} 1"),
              "%s", s);
    cr_assert(has_line(s, "agw_upstream_first_byte_seconds_bucket{agent=\"weather\",le=\"10\"} 2"),
              "%s", s);
    cr_assert(has_line(s, "agw_upstream_first_byte_seconds_bucket{agent=\"news\",le=\"0.005\"} 1"),
              "%s", s);
    cr_assert(has_line(s, "agw_run_duration_seconds_count{agent=\"weather\"} 3"), "%s", s);
    cr_assert(has_line(s, "agw_run_duration_seconds_bucket{agent=\"weather\",le=\"1\"} 1"), "%s",
              s);
    cr_assert(has_line(s, "agw_run_duration_seconds_bucket{agent=\"weather\",le=\"2.5\"} 2"), "%s",
              s);
    cr_assert(has_line(s, "agw_run_duration_seconds_bucket{agent=\"weather\",le=\"120\"} 3"), "%s",
              s);
    cr_assert(has_line(s, "agw_run_duration_seconds_bucket{agent=\"news\",le=\"1800\"} 0"), "%s",
              s);
    cr_assert(has_line(s, "agw_run_duration_seconds_bucket{agent=\"news\",le=\"+Inf\"} 1"), "%s",
              s);
    /* Cumulative: every bucket line of a series at least the one before. */
    uint64_t prev = 0;
    for (const char *p = s;
         (p = strstr(p, "agw_run_duration_seconds_bucket{agent=\"weather\"")) != NULL; p++) {
        uint64_t v = strtoull(strchr(p, '}') + 2, NULL, 10);
        cr_assert_geq(v, prev);
        prev = v;
    }
    free(s);
    agw_metrics_free(m);
}

/* The exposition sums the objects it is given (one per event loop): counters, the (agent, status)
 * pairs (the same pair in two objects is one line), the failures and each agent's histograms. */
Test(metrics, the_objects_of_the_loops_are_summed)
{
    struct agw_metrics *m[3] = {agw_metrics_new(), NULL, agw_metrics_new()};
    char *s;

    agw_metrics_add(m[0], AGW_C_RELOADS, 1);
    agw_metrics_add(m[0], AGW_C_EVENTS, 4);
    agw_metrics_add(m[2], AGW_C_EVENTS, 6);
    agw_metrics_request(m[0], "weather", 200);
    agw_metrics_request(m[2], "weather", 200);
    agw_metrics_request(m[2], "weather", 200);
    agw_metrics_request(m[2], "news", 502);
    agw_metrics_upstream_failure(m[0], AGW_UP_CONTENT_TYPE);
    agw_metrics_upstream_failure(m[2], AGW_UP_CONTENT_TYPE);
    agw_metrics_observe_run(m[0], "weather", 400, 30000, 2000000);
    agw_metrics_observe_run(m[2], "weather", 3000, 7000000, 700000);
    agw_metrics_observe_run(m[2], "news", AGW_UP_NOT_MEASURED, 1000, 1000);
    s = expose_all(m, 3);
    static const char *const want[] = {
        "agw_events_relayed_total 10",
        "agw_config_reloads_total 1",
        "agw_requests_total{agent=\"weather\",status=\"200\"} 3",
        "agw_requests_total{agent=\"news\",status=\"502\"} 1",
        "agw_upstream_failures_total{kind=\"content_type\"} 2",
        "agw_upstream_connect_seconds_bucket{agent=\"weather\",le=\"0.0005\"} 1",
        "agw_upstream_connect_seconds_bucket{agent=\"weather\",le=\"0.005\"} 2",
        "agw_upstream_connect_seconds_sum{agent=\"weather\"} 0.003400",
        "agw_run_duration_seconds_count{agent=\"weather\"} 2",
        "agw_run_duration_seconds_count{agent=\"news\"} 1",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        cr_assert(has_line(s, want[i]), "no line '%s' in:\n%s", want[i], s);
    cr_assert_eq(strstr(strstr(s, "status=\"200\"") + 1, "status=\"200\""), NULL,
                 "one line per pair: %s", s);
    free(s);
    agw_metrics_free(m[0]);
    agw_metrics_free(m[2]);
}

struct counting {
    struct agw_metrics *m;
    int runs;
};

static void *count_runs(void *arg)
{
    struct counting *c = arg;

    for (int i = 0; i < c->runs; i++) {
        agw_metrics_add(c->m, AGW_C_EVENTS, 10);
        agw_metrics_request(c->m, i % 2 ? "weather" : "news", 200);
        agw_metrics_observe_run(c->m, "weather", 100, 1000, 10000);
    }
    return NULL;
}

/* Two loops count, each into its own object, while /metrics is written from a third thread: nothing
 * is lost, and what is read meanwhile never exceeds the totals. */
Test(metrics, loops_count_while_the_exposition_is_written)
{
    enum { RUNS = 20000 };
    struct agw_metrics *m[2] = {agw_metrics_new(), agw_metrics_new()};
    struct counting c[2] = {{m[0], RUNS}, {m[1], RUNS}};
    pthread_t t[2];
    char *s;

    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, count_runs, &c[i]), 0);
    for (int k = 0; k < 50; k++) {
        const char *p;
        s = expose_all(m, 2);
        p = strstr(s, "\nagw_events_relayed_total ");
        cr_assert_not_null(p, "%s", s);
        cr_assert_leq(strtoull(p + 27, NULL, 10), 2ull * RUNS * 10);
        free(s);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    s = expose_all(m, 2);
    cr_assert(has_line(s, "agw_events_relayed_total 400000"), "%s", s);
    cr_assert(has_line(s, "agw_requests_total{agent=\"weather\",status=\"200\"} 20000"), "%s", s);
    cr_assert(has_line(s, "agw_requests_total{agent=\"news\",status=\"200\"} 20000"), "%s", s);
    cr_assert(has_line(s, "agw_run_duration_seconds_count{agent=\"weather\"} 40000"), "%s", s);
    free(s);
    agw_metrics_free(m[0]);
    agw_metrics_free(m[1]);
}
