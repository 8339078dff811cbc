/* The counters behind /metrics and their Prometheus text exposition (doc/metrics.md). One struct
 * agw_metrics per event loop, which alone counts into it (and one for the process's own counts):
 * a run's counting touches no memory another core writes. The exposition, from any thread, sums
 * them. Every metric's name and help text is defined here once. Pure but for the evbuffer the
 * exposition is written to. */
#ifndef AGW_METRICS_H
#define AGW_METRICS_H

#include "agw/common.h"
#include "agw/config.h"
#include "agw/store.h"
#include "agw/upstream.h"

struct evbuffer;
struct agw_metrics;

/* Plain counters (in the exposition's order). */
enum agw_counter {
    AGW_C_RUNS_STARTED = 0,     /* agw_runs_started_total */
    AGW_C_EVENTS,               /* agw_events_relayed_total */
    AGW_C_BYTES,                /* agw_bytes_relayed_total */
    AGW_C_AUTH_FAILURES,        /* agw_auth_failures_total */
    AGW_C_DECISIONS_FORWARDED,  /* agw_decisions_forwarded_total */
    AGW_C_DECISION_FAILURES,    /* agw_decision_failures_total */
    AGW_C_DECISIONS_REJECTED,   /* agw_decisions_rejected_total */
    AGW_C_DECISIONS_STREAMED,   /* agw_decisions_streamed_total */
    AGW_C_RUNS_CANCELLED,       /* agw_runs_cancelled_total */
    AGW_C_RELOADS,              /* agw_config_reloads_total */
    AGW_C_RELOADS_REFUSED,      /* agw_config_reloads_refused_total */
    AGW_C_BACKENDS_MARKED_DOWN, /* agw_upstream_marked_down_total */
    AGW_N_COUNTERS
};

/* What the exposition reads from elsewhere at the time it is written. */
struct agw_metrics_gauges {
    size_t active_runs; /* the active-run registry's size */
    size_t open_relays;
    uint64_t accept_errors;
    uint64_t accept_yields;
    const int *refusal_statuses; /* requests the HTTP parser refused, by status */
    const uint64_t *refused;
    size_t n_refusals;
    const struct agw_store_stats *history; /* the thread-history store's, or NULL when off */
    int64_t loop_lag_max_us;      /* the loop probe's longest lateness; < 0 when the probe is off */
    int64_t loop_lag_self_max_us; /* that lateness less its wait for a CPU; < 0: not known */
    int64_t loop_lag_busy_max_us; /* of that, the most the loop spent running; < 0: not known */
    uint64_t loop_turns, loop_naps, loop_holds; /* summed over the loops (include/agw/loop.h) */
};

/* Requests are counted by agent id as given: callers pass only configured agents (NULL otherwise),
 * so a client cannot grow the table. The configuration may change (SIGHUP); the table keeps every
 * agent it has counted. */
struct agw_metrics *agw_metrics_new(void);
void agw_metrics_free(struct agw_metrics *m);

void agw_metrics_add(struct agw_metrics *m, enum agw_counter c, uint64_t n);
uint64_t agw_metrics_get(const struct agw_metrics *m, enum agw_counter c);
/* One request answered with <status> for <agent> (NULL or "" when it named none). */
void agw_metrics_request(struct agw_metrics *m, const char *agent, int status);
/* One upstream failure of <kind> (AGW_UP_OK counts nothing). */
void agw_metrics_upstream_failure(struct agw_metrics *m, enum agw_up_failure kind);

/* The latency histograms (by agent), observed once per run when it ends: */
enum agw_histogram {
    AGW_H_CONNECT = 0, /* agw_upstream_connect_seconds: a new backend connection (DNS, TCP, TLS) */
    AGW_H_FIRST_BYTE, /* agw_upstream_first_byte_seconds: request written → first response byte */
    AGW_H_RUN,        /* agw_run_duration_seconds: the whole run, as the access log's duration */
    AGW_N_HISTOGRAMS
};
/* One run of <agent> (a configured id): each value in µs, AGW_UP_NOT_MEASURED to leave one out. One
 * lock (<m>'s own). */
void agw_metrics_observe_run(struct agw_metrics *m, const char *agent, uint64_t connect_us,
                             uint64_t first_byte_us, uint64_t duration_us);

/* Appends the whole exposition (Prometheus text format 0.0.4) of the sum of the <n> objects
 * <shards> (NULL ones skipped) to <out>; callable from any thread while their loops count (each
 * object's lock is taken in turn, for a copy of its tables). */
void agw_metrics_write(struct agw_metrics *const *shards, size_t n,
                       const struct agw_metrics_gauges *g, struct evbuffer *out);

#endif
