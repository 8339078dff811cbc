/* Counters and their exposition: see include/agw/metrics.h. */
#include "config.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "agw/metrics.h"

struct status_count {
    char agent[65]; /* agent ids are at most 64 bytes (agw_agent_id_valid) */
    int status;
    uint64_t n;
};

/* One object per event loop (and one for the process's own counters): only its loop writes it, so
 * neither its lock nor its counters' cache lines go from core to core while runs are served. The
 * counters are relaxed atomics and the tables are under the object's lock for the one reader from
 * elsewhere: /metrics, on any loop, which sums the objects (agw_metrics_write()). */
/* Bucket bounds in µs, per histogram (doc/metrics.md says why these). */
#define MAX_BUCKETS 16
static const struct {
    const char *name, *help;
    uint64_t le[MAX_BUCKETS]; /* upper bounds, ascending, 0-terminated */
} histogram_info[AGW_N_HISTOGRAMS] = {
    [AGW_H_CONNECT] = {"agw_upstream_connect_seconds",
                       "Time to open a new backend connection (DNS, TCP and TLS), by agent; reused "
                       "pooled connections are not counted.",
                       {500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000,
                        2500000, 5000000}},
    [AGW_H_FIRST_BYTE] = {"agw_upstream_first_byte_seconds",
                          "Time from writing the request to a backend to its first response byte, "
                          "by agent.",
                          {5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000,
                           5000000, 10000000, 30000000, 60000000}},
    [AGW_H_RUN] = {"agw_run_duration_seconds",
                   "Relayed runs from the request to the end of the stream, by agent.",
                   {50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000, 30000000,
                    60000000, 120000000, 300000000, 600000000, 1800000000}},
};

struct histogram {
    uint64_t buckets[MAX_BUCKETS + 1]; /* not cumulative; the last is above every bound */
    uint64_t count, sum_us;
};

struct agent_latency {
    char agent[65];
    struct histogram h[AGW_N_HISTOGRAMS];
};

struct agw_metrics {
    pthread_mutex_t lock;          /* for <requests> */
    struct status_count *requests; /* by (agent, status); agents come from the config */
    size_t n_requests, cap_requests;
    uint64_t counters[AGW_N_COUNTERS];
    uint64_t upstream_failures[AGW_UP_N_FAILURES];
    struct agent_latency **latency; /* under <lock>, by agent, in the order first seen */
    size_t n_latency, cap_latency;
};

static const struct {
    const char *name, *help;
} counter_info[AGW_N_COUNTERS] = {
    [AGW_C_RUNS_STARTED] = {"agw_runs_started_total", "Runs handed to an upstream."},
    [AGW_C_EVENTS] = {"agw_events_relayed_total", "AG-UI events written to clients."},
    [AGW_C_BYTES] = {"agw_bytes_relayed_total", "Stream body bytes written to clients."},
    [AGW_C_AUTH_FAILURES] = {"agw_auth_failures_total", "Requests refused with 401 or 403."},
    [AGW_C_DECISIONS_FORWARDED] = {"agw_decisions_forwarded_total",
                                   "Decision-only requests forwarded to a live run (202)."},
    [AGW_C_DECISION_FAILURES] = {"agw_decision_failures_total",
                                 "Decisions the backend refused or did not answer (502/504)."},
    [AGW_C_DECISIONS_REJECTED] = {"agw_decisions_rejected_total",
                                  "Decisions with no active run, refused (400)."},
    [AGW_C_DECISIONS_STREAMED] = {"agw_decisions_streamed_total",
                                  "Decisions the backend answered with a new stream, relayed to "
                                  "the client as a run."},
    [AGW_C_RUNS_CANCELLED] = {"agw_runs_cancelled_total", "Runs ended by the cancel endpoint."},
    [AGW_C_RELOADS] = {"agw_config_reloads_total", "Configurations taken into service on SIGHUP."},
    [AGW_C_RELOADS_REFUSED] = {"agw_config_reloads_refused_total",
                               "Configurations refused on SIGHUP (the one in force stayed)."},
    [AGW_C_BACKENDS_MARKED_DOWN] = {"agw_upstream_marked_down_total",
                                    "Backends marked down by passive health (tried after the "
                                    "others for their agent's fail_timeout)."},
};

struct agw_metrics *agw_metrics_new(void)
{
    struct agw_metrics *m = agw_xcalloc(1, sizeof(*m));

    pthread_mutex_init(&m->lock, NULL);
    return m;
}

void agw_metrics_free(struct agw_metrics *m)
{
    if (m == NULL)
        return;
    free(m->requests);
    for (size_t i = 0; i < m->n_latency; i++)
        free(m->latency[i]);
    free(m->latency);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

void agw_metrics_add(struct agw_metrics *m, enum agw_counter c, uint64_t n)
{
    __atomic_add_fetch(&m->counters[c], n, __ATOMIC_RELAXED);
}

uint64_t agw_metrics_get(const struct agw_metrics *m, enum agw_counter c)
{
    return __atomic_load_n(&m->counters[c], __ATOMIC_RELAXED);
}

/* <m>'s count of (<agent>, <status>), made 0 when it has none (under <m>'s lock, or private). */
static struct status_count *request_of(struct agw_metrics *m, const char *agent, int status)
{
    struct status_count *r;

    for (size_t i = 0; i < m->n_requests; i++)
        if (m->requests[i].status == status && strcmp(m->requests[i].agent, agent) == 0)
            return &m->requests[i];
    if (m->n_requests == m->cap_requests) {
        m->cap_requests = m->cap_requests ? 2 * m->cap_requests : 16;
        m->requests = agw_xrealloc(m->requests, m->cap_requests * sizeof(*m->requests));
    }
    r = &m->requests[m->n_requests++];
    snprintf(r->agent, sizeof(r->agent), "%s", agent);
    r->status = status;
    r->n = 0;
    return r;
}

void agw_metrics_request(struct agw_metrics *m, const char *agent, int status)
{
    if (agent == NULL)
        agent = "";
    pthread_mutex_lock(&m->lock);
    request_of(m, agent, status)->n++;
    pthread_mutex_unlock(&m->lock);
}

void agw_metrics_upstream_failure(struct agw_metrics *m, enum agw_up_failure kind)
{
    if (kind != AGW_UP_OK && kind < AGW_UP_N_FAILURES)
        __atomic_add_fetch(&m->upstream_failures[kind], 1, __ATOMIC_RELAXED);
}

static void observe(struct histogram *h, int which, uint64_t us)
{
    size_t b = 0;

    if (us == AGW_UP_NOT_MEASURED)
        return;
    while (histogram_info[which].le[b] != 0 && us > histogram_info[which].le[b])
        b++;
    h->buckets[b]++;
    h->count++;
    h->sum_us += us;
}

/* <m>'s histograms of <agent>, made empty when it has none (under <m>'s lock, or private). */
static struct agent_latency *latency_of(struct agw_metrics *m, const char *agent)
{
    struct agent_latency *a;

    for (size_t i = 0; i < m->n_latency; i++)
        if (strcmp(m->latency[i]->agent, agent) == 0)
            return m->latency[i];
    if (m->n_latency == m->cap_latency) {
        m->cap_latency = m->cap_latency ? 2 * m->cap_latency : 8;
        m->latency = agw_xrealloc(m->latency, m->cap_latency * sizeof(*m->latency));
    }
    a = m->latency[m->n_latency++] = agw_xcalloc(1, sizeof(*a));
    snprintf(a->agent, sizeof(a->agent), "%s", agent);
    return a;
}

void agw_metrics_observe_run(struct agw_metrics *m, const char *agent, uint64_t connect_us,
                             uint64_t first_byte_us, uint64_t duration_us)
{
    struct agent_latency *a;

    if (agent == NULL)
        return;
    pthread_mutex_lock(&m->lock);
    a = latency_of(m, agent);
    observe(&a->h[AGW_H_CONNECT], AGW_H_CONNECT, connect_us);
    observe(&a->h[AGW_H_FIRST_BYTE], AGW_H_FIRST_BYTE, first_byte_us);
    observe(&a->h[AGW_H_RUN], AGW_H_RUN, duration_us);
    pthread_mutex_unlock(&m->lock);
}

static void header(struct evbuffer *out, const char *name, const char *type, const char *help)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Adds <src>'s counts to <dst> (private to the caller): the (agent, status) pairs and the agents'
 * histograms <dst> lacks are appended in <src>'s order. */
static void merge(struct agw_metrics *dst, struct agw_metrics *src)
{
    for (int c = 0; c < AGW_N_COUNTERS; c++)
        dst->counters[c] += agw_metrics_get(src, (enum agw_counter)c);
    for (int k = 0; k < AGW_UP_N_FAILURES; k++)
        dst->upstream_failures[k] += __atomic_load_n(&src->upstream_failures[k], __ATOMIC_RELAXED);
    pthread_mutex_lock(&src->lock);
    for (size_t i = 0; i < src->n_requests; i++)
        request_of(dst, src->requests[i].agent, src->requests[i].status)->n += src->requests[i].n;
    for (size_t i = 0; i < src->n_latency; i++) {
        const struct agent_latency *a = src->latency[i];
        struct agent_latency *d = latency_of(dst, a->agent);
        for (int k = 0; k < AGW_N_HISTOGRAMS; k++) {
            for (size_t b = 0; b <= MAX_BUCKETS; b++)
                d->h[k].buckets[b] += a->h[k].buckets[b];
            d->h[k].count += a->h[k].count;
            d->h[k].sum_us += a->h[k].sum_us;
        }
    }
    pthread_mutex_unlock(&src->lock);
}

/* The exposition of <m>, a merged object no other thread sees. */
static void write_merged(struct agw_metrics *m, const struct agw_metrics_gauges *g,
                         struct evbuffer *out)
{
    header(out, "agw_requests_total", "counter", "Requests answered, by agent and HTTP status.");
    for (size_t i = 0; i < m->n_requests; i++)
        evbuffer_add_printf(out, "agw_requests_total{agent=\"%s\",status=\"%d\"} %" PRIu64 "\n",
                            m->requests[i].agent, m->requests[i].status, m->requests[i].n);
    for (int k = 0; k < AGW_N_HISTOGRAMS; k++) {
        const char *name = histogram_info[k].name;
        header(out, name, "histogram", histogram_info[k].help);
        for (size_t i = 0; i < m->n_latency; i++) {
            const struct histogram *h = &m->latency[i]->h[k];
            const char *agent = m->latency[i]->agent;
            uint64_t cumulative = 0;
            size_t b = 0;
            if (h->count == 0)
                continue;
            for (; histogram_info[k].le[b] != 0; b++) {
                cumulative += h->buckets[b];
                evbuffer_add_printf(out, "%s_bucket{agent=\"%s\",le=\"%g\"} %" PRIu64 "\n", name,
                                    agent, (double)histogram_info[k].le[b] / 1e6, cumulative);
            }
            evbuffer_add_printf(out, "%s_bucket{agent=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", name,
                                agent, h->count);
            evbuffer_add_printf(out, "%s_sum{agent=\"%s\"} %.6f\n", name, agent,
                                (double)h->sum_us / 1e6);
            evbuffer_add_printf(out, "%s_count{agent=\"%s\"} %" PRIu64 "\n", name, agent, h->count);
        }
    }
    header(out, "agw_active_runs", "gauge",
           "Runs in the active-run registry (streaming, attached or detached).");
    evbuffer_add_printf(out, "agw_active_runs %zu\n", g->active_runs);
    header(out, "agw_open_relays", "gauge",
           "Runs being relayed, including those still reaching their upstream.");
    evbuffer_add_printf(out, "agw_open_relays %zu\n", g->open_relays);
    for (int c = 0; c < AGW_N_COUNTERS; c++) {
        header(out, counter_info[c].name, "counter", counter_info[c].help);
        evbuffer_add_printf(out, "%s %" PRIu64 "\n", counter_info[c].name,
                            agw_metrics_get(m, (enum agw_counter)c));
    }
    header(out, "agw_upstream_failures_total", "counter", "Upstream failures, by kind.");
    for (int k = AGW_UP_OK + 1; k < AGW_UP_N_FAILURES; k++)
        evbuffer_add_printf(out, "agw_upstream_failures_total{kind=\"%s\"} %" PRIu64 "\n",
                            agw_up_failure_name((enum agw_up_failure)k),
                            __atomic_load_n(&m->upstream_failures[k], __ATOMIC_RELAXED));
    header(out, "agw_requests_refused_total", "counter",
           "Requests refused by the HTTP parser before routing (malformed, too large, "
           "unsupported), by status.");
    for (size_t i = 0; i < g->n_refusals; i++)
        evbuffer_add_printf(out, "agw_requests_refused_total{status=\"%d\"} %" PRIu64 "\n",
                            g->refusal_statuses[i], g->refused[i]);
    header(out, "agw_accept_errors_total", "counter",
           "Failed accept() calls (e.g. out of file descriptors; accepting pauses briefly).");
    evbuffer_add_printf(out, "agw_accept_errors_total %" PRIu64 "\n", g->accept_errors);
    header(
        out, "agw_accept_yields_total", "counter",
        "Turns in which a loop stopped accepting after its batch of connections to let its other "
        "work run first.");
    evbuffer_add_printf(out, "agw_accept_yields_total %" PRIu64 "\n", g->accept_yields);
    if (g->history != NULL) {
        const struct agw_store_stats *h = g->history;
        header(out, "agw_history_records_total", "counter",
               "Thread-history records applied (run inputs, event batches, reads).");
        evbuffer_add_printf(out, "agw_history_records_total %" PRIu64 "\n", h->records);
        header(out, "agw_history_dropped_total", "counter",
               "Thread-history records dropped because the store was too far behind.");
        evbuffer_add_printf(out, "agw_history_dropped_total %" PRIu64 "\n", h->dropped);
        header(out, "agw_history_commits_total", "counter", "Store transactions committed.");
        evbuffer_add_printf(out, "agw_history_commits_total %" PRIu64 "\n", h->commits);
        header(out, "agw_history_commit_errors_total", "counter",
               "Store transactions that failed (retried).");
        evbuffer_add_printf(out, "agw_history_commit_errors_total %" PRIu64 "\n", h->commit_errors);
        header(out, "agw_history_threads_unsaved_total", "counter",
               "Threads let go with changes unwritten: the store refused commits and "
               "history.cache_threads threads waited for it.");
        evbuffer_add_printf(out, "agw_history_threads_unsaved_total %" PRIu64 "\n", h->unsaved);
        header(out, "agw_history_expired_total", "counter", "Threads deleted by history.ttl.");
        evbuffer_add_printf(out, "agw_history_expired_total %" PRIu64 "\n", h->expired);
        header(out, "agw_history_malformed_total", "counter",
               "Recorded inputs and events the store could not read.");
        evbuffer_add_printf(out, "agw_history_malformed_total %" PRIu64 "\n", h->malformed);
        header(out, "agw_history_commit_seconds_max", "gauge", "The longest store commit.");
        evbuffer_add_printf(out, "agw_history_commit_seconds_max %.6f\n",
                            (double)h->max_commit_us / 1e6);
        header(out, "agw_history_queue_bytes", "gauge",
               "Thread-history records waiting for the store's writer thread.");
        evbuffer_add_printf(out, "agw_history_queue_bytes %zu\n", h->queued_bytes);
        header(out, "agw_history_congestions_total", "counter",
               "Times the store fell behind and runs that record stopped reading their upstreams.");
        evbuffer_add_printf(out, "agw_history_congestions_total %" PRIu64 "\n", h->congestions);
        header(out, "agw_history_thread_reads_total", "counter",
               "Threads not in memory looked up in the store's database.");
        evbuffer_add_printf(out, "agw_history_thread_reads_total %" PRIu64 "\n", h->thread_reads);
        header(out, "agw_history_thread_reads_spared_total", "counter",
               "Look-ups of threads new to the store's database that read nothing.");
        evbuffer_add_printf(out, "agw_history_thread_reads_spared_total %" PRIu64 "\n",
                            h->reads_spared);
        header(out, "agw_history_cached_threads", "gauge", "Threads held in memory.");
        evbuffer_add_printf(out, "agw_history_cached_threads %zu\n", h->cached);
        header(out, "agw_history_texts_bytes", "gauge",
               "Bytes of long texts (streamed answers) in the embedded store's segment files.");
        evbuffer_add_printf(out, "agw_history_texts_bytes %" PRIu64 "\n", h->texts_bytes);
    }
    header(out, "agw_event_loop_turns_total", "counter",
           "Looks at the sockets that ran callbacks (wake-up batching on; summed over the loops).");
    evbuffer_add_printf(out, "agw_event_loop_turns_total %" PRIu64 "\n", g->loop_turns);
    header(out, "agw_event_loop_naps_total", "counter",
           "Turns after which a busy loop waited for its batch window before looking again.");
    evbuffer_add_printf(out, "agw_event_loop_naps_total %" PRIu64 "\n", g->loop_naps);
    header(out, "agw_event_loop_holds_total", "counter",
           "Backend reads held back for a loop's nap: a response's events arriving in a burst.");
    evbuffer_add_printf(out, "agw_event_loop_holds_total %" PRIu64 "\n", g->loop_holds);
    if (g->loop_lag_max_us >= 0) {
        header(out, "agw_event_loop_lag_seconds_max", "gauge",
               "The longest an event loop was late for its probe timer (AGW_LOOP_PROBE_MS).");
        evbuffer_add_printf(out, "agw_event_loop_lag_seconds_max %.6f\n",
                            (double)g->loop_lag_max_us / 1e6);
    }
    if (g->loop_lag_self_max_us >= 0) {
        header(
            out, "agw_event_loop_self_lag_seconds_max", "gauge",
            "The longest lateness for the probe timer less the loop's wait for a CPU meanwhile.");
        evbuffer_add_printf(out, "agw_event_loop_self_lag_seconds_max %.6f\n",
                            (double)g->loop_lag_self_max_us / 1e6);
    }
    if (g->loop_lag_busy_max_us >= 0) {
        header(out, "agw_event_loop_busy_lag_seconds_max", "gauge",
               "The longest time a loop ran its own work while late for its probe timer (an upper "
               "bound); the rest of its own lateness it slept.");
        evbuffer_add_printf(out, "agw_event_loop_busy_lag_seconds_max %.6f\n",
                            (double)g->loop_lag_busy_max_us / 1e6);
    }
}

void agw_metrics_write(struct agw_metrics *const *shards, size_t n,
                       const struct agw_metrics_gauges *g, struct evbuffer *out)
{
    struct agw_metrics *m = agw_metrics_new();

    for (size_t i = 0; i < n; i++)
        if (shards[i] != NULL)
            merge(m, shards[i]);
    write_merged(m, g, out);
    agw_metrics_free(m);
}
