/* Tests for src/metrics.c: counters land on their lines, requests are counted by agent, every
 * failure kind is exported, and the whole exposition is well-formed Prometheus text (every sample
 * belongs to a metric announced by HELP and TYPE, names and labels are valid). */
#include <criterion/criterion.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "agw/metrics.h"

static char *expose(struct agw_metrics *m)
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

    agw_metrics_write(m, &g, b);
    n = evbuffer_get_length(b);
    s = malloc(n + 1);
    evbuffer_remove(b, s, n);
    s[n] = '\0';
    evbuffer_free(b);
    return s;
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

/* Each sample's metric was announced by a HELP and a TYPE line just before its samples; every
 * failure kind has a sample; no metric is announced twice. */
Test(metrics, the_exposition_is_well_formed)
{
    struct agw_metrics *m = agw_metrics_new();
    char announced[64][64];
    size_t n_announced = 0;
    char current[64] = "";

    agw_metrics_request(m, "weather", 200);
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
            char type[16];
            cr_assert_eq(sscanf(line + 7, "%63s %15s", name, type), 2, "%s", line);
            cr_assert_str_eq(name, current, "TYPE without its HELP: %s", line);
            cr_assert(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0, "%s", line);
            continue;
        }
        size_t k = strcspn(line, "{ ");
        cr_assert(name_ok(line, k), "bad metric name: %s", line);
        cr_assert(k == strlen(current) && strncmp(line, current, k) == 0,
                  "a sample of a metric not announced just before: %s", line);
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
