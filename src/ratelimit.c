/* Rate limits per key: see include/agw/ratelimit.h.
 *
 * The bucket counts in 1/60000 of a run, so that refilling is integer arithmetic: a key with R runs
 * per minute gains R units per millisecond, a run costs 60000 units, and the bucket holds at most
 * burst × 60000. */
#include "config.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "agw/ratelimit.h"

#define RUN_UNITS 60000u /* one run, in bucket units (the milliseconds of a minute) */

struct agw_rl_entry {
    char *key_id;
    struct agw_rate_limit limit;
    uint64_t units;      /* what the bucket holds */
    uint64_t last_ms;    /* when it was last refilled */
    unsigned active;     /* runs of the key streaming now */
    bool configured;     /* in the configuration in force */
    uint64_t limited[2]; /* refusals: [0] runs_per_minute, [1] concurrent_runs */
};

struct agw_ratelimit {
    pthread_mutex_t lock;
    struct agw_rl_entry **entries; /* keys seen by any configuration, in order */
    size_t n, cap;
};

struct agw_ratelimit *agw_ratelimit_new(void)
{
    struct agw_ratelimit *rl = agw_xcalloc(1, sizeof(*rl));

    pthread_mutex_init(&rl->lock, NULL);
    return rl;
}

void agw_ratelimit_free(struct agw_ratelimit *rl)
{
    if (rl == NULL)
        return;
    for (size_t i = 0; i < rl->n; i++) {
        free(rl->entries[i]->key_id);
        free(rl->entries[i]);
    }
    free(rl->entries);
    pthread_mutex_destroy(&rl->lock);
    free(rl);
}

static struct agw_rl_entry *find(struct agw_ratelimit *rl, const char *key_id)
{
    for (size_t i = 0; i < rl->n; i++)
        if (strcmp(rl->entries[i]->key_id, key_id) == 0)
            return rl->entries[i];
    return NULL;
}

static void set_limit(struct agw_rl_entry *e, const struct agw_rate_limit *limit, uint64_t now_ms)
{
    uint64_t full = (uint64_t)limit->burst * RUN_UNITS;

    /* A new bucket, or one that grew, starts full; one that shrank keeps at most its new size. */
    if (limit->burst > e->limit.burst || e->units > full)
        e->units = full;
    e->limit = *limit;
    e->last_ms = now_ms;
}

void agw_ratelimit_configure(struct agw_ratelimit *rl, const struct agw_config *cfg,
                             uint64_t now_ms)
{
    static const struct agw_rate_limit none = {0, 0, 0};

    pthread_mutex_lock(&rl->lock);
    for (size_t i = 0; i < rl->n; i++)
        rl->entries[i]->configured = false;
    for (size_t i = 0; i < cfg->auth.n_keys + 1; i++) {
        bool anonymous = i == cfg->auth.n_keys;
        const char *id = anonymous ? "" : cfg->auth.keys[i].id;
        const struct agw_rate_limit *limit =
            anonymous ? &cfg->rate_limit : &cfg->auth.keys[i].rate_limit;
        struct agw_rl_entry *e;

        if (anonymous && cfg->auth.mode != AGW_AUTH_NONE)
            break;
        if ((e = find(rl, id)) == NULL) {
            if (rl->n == rl->cap) {
                rl->cap = rl->cap ? 2 * rl->cap : 8;
                rl->entries = agw_xrealloc(rl->entries, rl->cap * sizeof(*rl->entries));
            }
            e = rl->entries[rl->n++] = agw_xcalloc(1, sizeof(*e));
            e->key_id = agw_xstrdup(id);
        }
        set_limit(e, limit, now_ms);
        e->configured = true;
    }
    for (size_t i = 0; i < rl->n; i++)
        if (!rl->entries[i]->configured)
            set_limit(rl->entries[i], &none, now_ms);
    pthread_mutex_unlock(&rl->lock);
}

enum agw_rl_verdict agw_ratelimit_acquire(struct agw_ratelimit *rl, const char *key_id,
                                          uint64_t now_ms, uint32_t *retry_after_s,
                                          struct agw_rl_entry **entry)
{
    enum agw_rl_verdict v = AGW_RL_OK;
    struct agw_rl_entry *e;

    *entry = NULL;
    *retry_after_s = 0;
    pthread_mutex_lock(&rl->lock);
    if ((e = find(rl, key_id)) == NULL)
        goto out; /* not a configured key: nothing to count */
    if (e->limit.runs_per_minute > 0) {
        uint64_t full = (uint64_t)e->limit.burst * RUN_UNITS;
        uint64_t elapsed = now_ms > e->last_ms ? now_ms - e->last_ms : 0;
        e->units += elapsed * e->limit.runs_per_minute; /* at most 2^32 × 10^6: no overflow */
        if (e->units > full)
            e->units = full;
        e->last_ms = now_ms;
    }
    if (e->limit.concurrent_runs > 0 && e->active >= e->limit.concurrent_runs) {
        v = AGW_RL_CONCURRENCY;
        e->limited[1]++;
        *retry_after_s = 1; /* a slot frees when a run ends: no better guess */
        goto out;
    }
    if (e->limit.runs_per_minute > 0 && e->units < RUN_UNITS) {
        uint64_t wait_ms =
            (RUN_UNITS - e->units + e->limit.runs_per_minute - 1) / e->limit.runs_per_minute;
        v = AGW_RL_RATE;
        e->limited[0]++;
        *retry_after_s = (uint32_t)((wait_ms + 999) / 1000);
        if (*retry_after_s == 0)
            *retry_after_s = 1;
        goto out;
    }
    if (e->limit.runs_per_minute > 0)
        e->units -= RUN_UNITS;
    e->active++;
    *entry = e;
out:
    pthread_mutex_unlock(&rl->lock);
    return v;
}

void agw_ratelimit_release(struct agw_ratelimit *rl, struct agw_rl_entry *e)
{
    if (e == NULL)
        return;
    pthread_mutex_lock(&rl->lock);
    e->active--;
    pthread_mutex_unlock(&rl->lock);
}

unsigned agw_ratelimit_active(struct agw_ratelimit *rl, const char *key_id)
{
    struct agw_rl_entry *e;
    unsigned n;

    pthread_mutex_lock(&rl->lock);
    e = find(rl, key_id);
    n = e != NULL ? e->active : 0;
    pthread_mutex_unlock(&rl->lock);
    return n;
}

/* A label value: backslash, double quote and newline escaped (key ids are the operator's). */
static void add_label(struct evbuffer *out, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '\\' || *s == '"')
            evbuffer_add_printf(out, "\\%c", *s);
        else if (*s == '\n')
            evbuffer_add(out, "\\n", 2);
        else
            evbuffer_add(out, s, 1);
    }
}

void agw_ratelimit_write_metrics(struct agw_ratelimit *rl, struct evbuffer *out)
{
    static const char *const limits[2] = {"runs_per_minute", "concurrent_runs"};

    pthread_mutex_lock(&rl->lock);
    evbuffer_add_printf(out, "# HELP agw_rate_limited_total Runs refused with 429, by key and by "
                             "the limit that refused them.\n"
                             "# TYPE agw_rate_limited_total counter\n");
    for (size_t i = 0; i < rl->n; i++) {
        for (size_t k = 0; k < 2; k++) {
            evbuffer_add_printf(out, "agw_rate_limited_total{key=\"");
            add_label(out, rl->entries[i]->key_id);
            evbuffer_add_printf(out, "\",limit=\"%s\"} %llu\n", limits[k],
                                (unsigned long long)rl->entries[i]->limited[k]);
        }
    }
    evbuffer_add_printf(out, "# HELP agw_key_active_runs Runs streaming now, by key.\n"
                             "# TYPE agw_key_active_runs gauge\n");
    for (size_t i = 0; i < rl->n; i++) {
        evbuffer_add_printf(out, "agw_key_active_runs{key=\"");
        add_label(out, rl->entries[i]->key_id);
        evbuffer_add_printf(out, "\"} %u\n", rl->entries[i]->active);
    }
    pthread_mutex_unlock(&rl->lock);
}
