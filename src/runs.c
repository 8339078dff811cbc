/* The registry of active runs: one part per event loop, each with chained hash tables, one per
 * index, over the same entries, and its own lock. A loop adds and removes its runs in its own part
 * alone: a run's registration takes only that part's lock (which nothing else takes but a lookup)
 * and writes no memory another loop's runs use. The
 * lookups (decisions, cancels: rare) hold every part and look in each. New entries go to the head
 * of their chain, so the first match of a lookup in a part is that part's newest; across parts the
 * newest is the one registered last (<seq>: the time of registration, in ns). The tables double
 * when the entries outnumber the buckets. */
#include "config.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agw/runs.h"

#define INITIAL_BUCKETS 64

/* Aligned so that two loops' parts share no cache line. */
struct part {
    _Alignas(AGW_CACHE_LINE) pthread_mutex_t lock;
    struct agw_run_entry **buckets[AGW_RUNS_N_INDEXES];
    size_t n_buckets; /* a power of two, the same for every index */
    size_t count;
    uint64_t last_seq;
};

struct agw_runs {
    struct part *parts;
    unsigned n_parts;
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

static void link_entry(struct part *pt, int index, struct agw_run_entry *e)
{
    struct agw_run_entry **head = &pt->buckets[index][e->hash[index] & (pt->n_buckets - 1)];

    e->next[index] = *head;
    *head = e;
}

static void unlink_entry(struct part *pt, int index, struct agw_run_entry *e)
{
    struct agw_run_entry **p = &pt->buckets[index][e->hash[index] & (pt->n_buckets - 1)];

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
static void grow(struct part *pt)
{
    size_t old_n = pt->n_buckets;
    struct agw_run_entry **all = agw_xcalloc(pt->count, sizeof(*all));
    size_t n = 0;

    for (size_t b = 0; b < old_n; b++)
        for (struct agw_run_entry *e = pt->buckets[0][b]; e != NULL; e = e->next[0])
            all[n++] = e;
    pt->n_buckets = 2 * old_n;
    for (int i = 0; i < AGW_RUNS_N_INDEXES; i++) {
        free(pt->buckets[i]);
        pt->buckets[i] = agw_xcalloc(pt->n_buckets, sizeof(*pt->buckets[i]));
    }
    qsort(all, n, sizeof(*all), by_seq);
    for (size_t k = 0; k < n; k++)
        for (int i = 0; i < AGW_RUNS_N_INDEXES; i++)
            link_entry(pt, i, all[k]);
    free(all);
}

struct agw_runs *agw_runs_new(unsigned n_parts)
{
    struct agw_runs *runs = agw_xcalloc(1, sizeof(*runs));

    runs->n_parts = n_parts > 0 ? n_parts : 1;
    runs->parts = agw_xaligned_calloc(AGW_CACHE_LINE, runs->n_parts, sizeof(*runs->parts));
    for (unsigned k = 0; k < runs->n_parts; k++) {
        struct part *pt = &runs->parts[k];
        pthread_mutex_init(&pt->lock, NULL);
        pt->n_buckets = INITIAL_BUCKETS;
        for (int i = 0; i < AGW_RUNS_N_INDEXES; i++)
            pt->buckets[i] = agw_xcalloc(pt->n_buckets, sizeof(*pt->buckets[i]));
    }
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
    for (unsigned k = 0; k < runs->n_parts; k++) {
        struct part *pt = &runs->parts[k];
        for (size_t b = 0; b < pt->n_buckets; b++) {
            struct agw_run_entry *e = pt->buckets[0][b], *next;
            for (; e != NULL; e = next) {
                next = e->next[0];
                entry_free(e);
            }
        }
        for (int i = 0; i < AGW_RUNS_N_INDEXES; i++)
            free(pt->buckets[i]);
        pthread_mutex_destroy(&pt->lock);
    }
    free(runs->parts);
    free(runs);
}

void agw_runs_lock(struct agw_runs *runs)
{
    for (unsigned k = 0; k < runs->n_parts; k++) /* in order: lookups do not deadlock */
        pthread_mutex_lock(&runs->parts[k].lock);
}

void agw_runs_unlock(struct agw_runs *runs)
{
    for (unsigned k = runs->n_parts; k-- > 0;)
        pthread_mutex_unlock(&runs->parts[k].lock);
}

size_t agw_runs_count(struct agw_runs *runs)
{
    size_t n = 0;

    for (unsigned k = 0; k < runs->n_parts; k++) {
        pthread_mutex_lock(&runs->parts[k].lock);
        n += runs->parts[k].count;
        pthread_mutex_unlock(&runs->parts[k].lock);
    }
    return n;
}

/* <a> was registered after <b>. */
static bool newer(const struct agw_run_entry *a, const struct agw_run_entry *b)
{
    return a->seq != b->seq ? a->seq > b->seq : a->part > b->part;
}

struct agw_run_entry *agw_runs_add(struct agw_runs *runs, unsigned part, const char *agent_id,
                                   const char *thread_id, const char *run_id,
                                   const char *backend_url, const void *home, void *owner)
{
    struct part *pt = &runs->parts[part < runs->n_parts ? part : 0];
    struct timespec ts;
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
    e->part = (unsigned)(pt - runs->parts);
    for (int i = 0; i < AGW_RUNS_N_INDEXES; i++)
        e->hash[i] = hash_for(i, agent_id, thread_id, run_id);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    pthread_mutex_lock(&pt->lock);
    /* the time, made strictly increasing within the part (a coarse clock could repeat itself) */
    e->seq = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    if (e->seq <= pt->last_seq)
        e->seq = pt->last_seq + 1;
    pt->last_seq = e->seq;
    if (pt->count >= pt->n_buckets)
        grow(pt);
    for (int i = 0; i < AGW_RUNS_N_INDEXES; i++)
        link_entry(pt, i, e);
    pt->count++;
    pthread_mutex_unlock(&pt->lock);
    return e;
}

void agw_runs_remove(struct agw_runs *runs, struct agw_run_entry *e)
{
    struct part *pt;

    if (e == NULL)
        return;
    pt = &runs->parts[e->part];
    pthread_mutex_lock(&pt->lock);
    for (int i = 0; i < AGW_RUNS_N_INDEXES; i++)
        unlink_entry(pt, i, e);
    pt->count--;
    pthread_mutex_unlock(&pt->lock);
    entry_free(e);
}

/* <e> is in the chains of index <index> with hash <h>, for <agent_id> and the ids given (NULL:
 * any). */
static bool matches(const struct agw_run_entry *e, int index, uint64_t h, const char *agent_id,
                    const char *thread_id, const char *run_id)
{
    return e->hash[index] == h && (run_id == NULL || strcmp(e->run_id, run_id) == 0) &&
           (thread_id == NULL || strcmp(e->thread_id, thread_id) == 0) &&
           strcmp(e->agent_id, agent_id) == 0;
}

/* The newest entry of index <index> for the ids (NULL: any), in every part. */
static struct agw_run_entry *newest(const struct agw_runs *runs, int index, const char *agent_id,
                                    const char *thread_id, const char *run_id)
{
    uint64_t h = hash_for(index, agent_id, thread_id, run_id);
    struct agw_run_entry *best = NULL;

    for (unsigned k = 0; k < runs->n_parts; k++) {
        const struct part *pt = &runs->parts[k];
        struct agw_run_entry *e = pt->buckets[index][h & (pt->n_buckets - 1)];
        while (e != NULL && !matches(e, index, h, agent_id, thread_id, run_id))
            e = e->next[index];
        if (e != NULL && (best == NULL || newer(e, best)))
            best = e; /* (a part's first match is its newest) */
    }
    return best;
}

struct agw_run_entry *agw_runs_find(const struct agw_runs *runs, const char *agent_id,
                                    const char *thread_id, const char *run_id)
{
    return newest(runs, AGW_RUNS_BY_KEY, agent_id, thread_id, run_id);
}

struct agw_run_entry *agw_runs_latest(const struct agw_runs *runs, const char *agent_id,
                                      const char *thread_id)
{
    return newest(runs, AGW_RUNS_BY_THREAD, agent_id, thread_id, NULL);
}

/* Inserts <e> into <out> (<n> entries kept, newest first) unless all <max> are newer. */
static void keep_newest(struct agw_run_entry **out, size_t n, size_t max, struct agw_run_entry *e)
{
    size_t i = n < max ? n : max;

    while (i > 0 && newer(e, out[i - 1])) {
        if (i < max)
            out[i] = out[i - 1];
        i--;
    }
    if (i < max)
        out[i] = e;
}

size_t agw_runs_by_run_id(const struct agw_runs *runs, const char *agent_id, const char *run_id,
                          struct agw_run_entry **out, size_t max)
{
    uint64_t h = hash_for(AGW_RUNS_BY_RUN, agent_id, NULL, run_id);
    size_t n = 0;

    for (unsigned k = 0; k < runs->n_parts; k++) {
        const struct part *pt = &runs->parts[k];
        struct agw_run_entry *e = pt->buckets[AGW_RUNS_BY_RUN][h & (pt->n_buckets - 1)];
        for (; e != NULL; e = e->next[AGW_RUNS_BY_RUN])
            if (matches(e, AGW_RUNS_BY_RUN, h, agent_id, NULL, run_id))
                keep_newest(out, n++, max, e);
    }
    return n;
}
