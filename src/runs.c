/* The registry of active runs: chained hash tables, one per index, over the same entries. New
 * entries go to the head of their chain, so the first match of a lookup is the newest. The tables
 * double when the entries outnumber the buckets. */
#include "config.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "agw/runs.h"

#define INITIAL_BUCKETS 64

struct agw_runs {
    struct agw_run_entry **buckets[AGW_RUNS_N_INDEXES];
    size_t n_buckets; /* a power of two, the same for every index */
    size_t count;
    uint64_t seq;
    pthread_mutex_t lock;
};

/* FNV-1a over the strings, each followed by a separator byte that no C string contains. */
static uint64_t hash_fields(const char *a, const char *b, const char *c)
{
    const char *parts[3] = {a, b, c};
    uint64_t h = AGW_FNV_INIT;

    for (size_t i = 0; i < 3 && parts[i] != NULL; i++)
        h = agw_fnv1a(agw_fnv1a(h, parts[i], strlen(parts[i])), "\xff", 1);
    return h ^ (h >> 29);
}

static uint64_t hash_for(int index, const char *agent, const char *thread, const char *run)
{
    switch (index) {
    case AGW_RUNS_BY_KEY:
        return hash_fields(agent, thread, run);
    case AGW_RUNS_BY_THREAD:
        return hash_fields(agent, thread, NULL);
    default:
        return hash_fields(agent, run, NULL);
    }
}

static void link_entry(struct agw_runs *runs, int index, struct agw_run_entry *e)
{
    struct agw_run_entry **head = &runs->buckets[index][e->hash[index] & (runs->n_buckets - 1)];

    e->next[index] = *head;
    *head = e;
}

static void unlink_entry(struct agw_runs *runs, int index, struct agw_run_entry *e)
{
    struct agw_run_entry **p = &runs->buckets[index][e->hash[index] & (runs->n_buckets - 1)];

    while (*p != e)
        p = &(*p)->next[index];
    *p = e->next[index];
}

static int by_seq(const void *a, const void *b)
{
    const struct agw_run_entry *x = *(struct agw_run_entry *const *)a;
    const struct agw_run_entry *y = *(struct agw_run_entry *const *)b;

    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Doubles every table. Chains are rebuilt oldest first so that the newest entry stays at the head.
 */
static void grow(struct agw_runs *runs)
{
    size_t old_n = runs->n_buckets;
    struct agw_run_entry **all = agw_xcalloc(runs->count, sizeof(*all));
    size_t n = 0;

    for (size_t b = 0; b < old_n; b++)
        for (struct agw_run_entry *e = runs->buckets[0][b]; e != NULL; e = e->next[0])
            all[n++] = e;
    runs->n_buckets = 2 * old_n;
    for (int i = 0; i < AGW_RUNS_N_INDEXES; i++) {
        free(runs->buckets[i]);
        runs->buckets[i] = agw_xcalloc(runs->n_buckets, sizeof(*runs->buckets[i]));
    }
    qsort(all, n, sizeof(*all), by_seq);
    for (size_t k = 0; k < n; k++)
        for (int i = 0; i < AGW_RUNS_N_INDEXES; i++)
            link_entry(runs, i, all[k]);
    free(all);
}

struct agw_runs *agw_runs_new(void)
{
    struct agw_runs *runs = agw_xcalloc(1, sizeof(*runs));

    pthread_mutex_init(&runs->lock, NULL);
    runs->n_buckets = INITIAL_BUCKETS;
    for (int i = 0; i < AGW_RUNS_N_INDEXES; i++)
        runs->buckets[i] = agw_xcalloc(runs->n_buckets, sizeof(*runs->buckets[i]));
    return runs;
}

/* An entry's strings live in its own block, after the struct (agw_runs_add()). */
static void entry_free(struct agw_run_entry *e)
{
    free(e);
}

/* Copies <n> bytes of <s> to <p> and returns the byte after them. */
static char *put(char *p, const char *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

void agw_runs_free(struct agw_runs *runs)
{
    if (runs == NULL)
        return;
    for (size_t b = 0; b < runs->n_buckets; b++) {
        struct agw_run_entry *e = runs->buckets[0][b], *next;
        for (; e != NULL; e = next) {
            next = e->next[0];
            entry_free(e);
        }
    }
    for (int i = 0; i < AGW_RUNS_N_INDEXES; i++)
        free(runs->buckets[i]);
    pthread_mutex_destroy(&runs->lock);
    free(runs);
}

void agw_runs_lock(struct agw_runs *runs)
{
    pthread_mutex_lock(&runs->lock);
}

void agw_runs_unlock(struct agw_runs *runs)
{
    pthread_mutex_unlock(&runs->lock);
}

size_t agw_runs_count(struct agw_runs *runs)
{
    size_t n;

    pthread_mutex_lock(&runs->lock);
    n = runs->count;
    pthread_mutex_unlock(&runs->lock);
    return n;
}

struct agw_run_entry *agw_runs_add(struct agw_runs *runs, const char *agent_id,
                                   const char *thread_id, const char *run_id,
                                   const char *backend_url, const void *home, void *owner)
{
    const char *url = backend_url != NULL ? backend_url : "";
    size_t na = strlen(agent_id), nt = strlen(thread_id), nr = strlen(run_id), nu = strlen(url);
    /* one block: the struct, the key "ag_ui:{agent}:{thread}:{run}", then the four strings */
    struct agw_run_entry *e =
        agw_xcalloc(1, sizeof(*e) + (6 + na + 1 + nt + 1 + nr + 1) + (na + nt + nr + nu + 4));
    char *p = (char *)(e + 1);

    e->key = p;
    p = put(p, "ag_ui:", 6);
    p = put(p, agent_id, na);
    *p++ = ':';
    p = put(p, thread_id, nt);
    *p++ = ':';
    p = put(p, run_id, nr);
    *p++ = '\0';
    e->agent_id = p;
    p = put(p, agent_id, na + 1);
    e->thread_id = p;
    p = put(p, thread_id, nt + 1);
    e->run_id = p;
    p = put(p, run_id, nr + 1);
    e->backend_url = p;
    put(p, url, nu + 1);
    e->home = home;
    e->owner = owner;
    for (int i = 0; i < AGW_RUNS_N_INDEXES; i++)
        e->hash[i] = hash_for(i, agent_id, thread_id, run_id);
    pthread_mutex_lock(&runs->lock);
    e->seq = ++runs->seq;
    if (runs->count >= runs->n_buckets)
        grow(runs);
    for (int i = 0; i < AGW_RUNS_N_INDEXES; i++)
        link_entry(runs, i, e);
    runs->count++;
    pthread_mutex_unlock(&runs->lock);
    return e;
}

void agw_runs_remove(struct agw_runs *runs, struct agw_run_entry *e)
{
    if (e == NULL)
        return;
    pthread_mutex_lock(&runs->lock);
    for (int i = 0; i < AGW_RUNS_N_INDEXES; i++)
        unlink_entry(runs, i, e);
    runs->count--;
    pthread_mutex_unlock(&runs->lock);
    entry_free(e);
}

struct agw_run_entry *agw_runs_find(const struct agw_runs *runs, const char *agent_id,
                                    const char *thread_id, const char *run_id)
{
    uint64_t h = hash_for(AGW_RUNS_BY_KEY, agent_id, thread_id, run_id);
    struct agw_run_entry *e = runs->buckets[AGW_RUNS_BY_KEY][h & (runs->n_buckets - 1)];

    for (; e != NULL; e = e->next[AGW_RUNS_BY_KEY])
        if (e->hash[AGW_RUNS_BY_KEY] == h && strcmp(e->run_id, run_id) == 0 &&
            strcmp(e->thread_id, thread_id) == 0 && strcmp(e->agent_id, agent_id) == 0)
            return e;
    return NULL;
}

struct agw_run_entry *agw_runs_latest(const struct agw_runs *runs, const char *agent_id,
                                      const char *thread_id)
{
    uint64_t h = hash_for(AGW_RUNS_BY_THREAD, agent_id, thread_id, NULL);
    struct agw_run_entry *e = runs->buckets[AGW_RUNS_BY_THREAD][h & (runs->n_buckets - 1)];

    for (; e != NULL; e = e->next[AGW_RUNS_BY_THREAD])
        if (e->hash[AGW_RUNS_BY_THREAD] == h && strcmp(e->thread_id, thread_id) == 0 &&
            strcmp(e->agent_id, agent_id) == 0)
            return e;
    return NULL;
}

size_t agw_runs_by_run_id(const struct agw_runs *runs, const char *agent_id, const char *run_id,
                          struct agw_run_entry **out, size_t max)
{
    uint64_t h = hash_for(AGW_RUNS_BY_RUN, agent_id, NULL, run_id);
    struct agw_run_entry *e = runs->buckets[AGW_RUNS_BY_RUN][h & (runs->n_buckets - 1)];
    size_t n = 0;

    for (; e != NULL; e = e->next[AGW_RUNS_BY_RUN]) {
        if (e->hash[AGW_RUNS_BY_RUN] == h && strcmp(e->run_id, run_id) == 0 &&
            strcmp(e->agent_id, agent_id) == 0) {
            if (n < max)
                out[n] = e;
            n++;
        }
    }
    return n;
}
