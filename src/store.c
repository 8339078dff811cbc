/* The thread-history store: one writer thread, a queue of records, a bounded cache of threads and,
 * for the embedded kind, a durable backend (src/store_backend.h; SQLite in src/store_sqlite.c)
 * (doc/internals/store.md).
 *
 * Everything below the queue runs on the writer thread alone: the cache, the histories, the
 * database handle. The loops only touch the queue (under <lock>) and their inbox. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/queue.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <jansson.h>

#include "agw/capture.h"
#include "agw/log.h"
#include "agw/loop.h"
#include "agw/mem.h"
#include "agw/store.h"
#include "store_backend.h"

#define INITIAL_BUCKETS 256
#define TTL_SWEEP_MS    60000 /* how often expired threads are looked for */
#define TTL_BATCH       500   /* threads deleted per transaction by the ttl */
#define WRITER_NICE     19    /* the writer thread's nice value (the loops keep 0) */
#define WRITER_SLICE_US 100   /* the writer's time slice (EEVDF custom slices, Linux 6.12+) */
/* A failed commit is tried again after the commit interval, doubled at each failure in a row up to
 * this: a disk that stays full costs an attempt every few seconds, not five a second (each builds
 * the rows of every dirty thread). */
#define COMMIT_RETRY_MAX_MS 5000
/* Records wait in the queue until the oldest is BATCH_MS old (or the commit interval, if shorter),
 * BATCH_BYTES wait, or a read comes: the writer wakes once per batch, not once per record. */
#define BATCH_MS    20
#define BATCH_BYTES (4u << 20)
/* How the writer sleeps (struct agw_store's <sleeping>): not at all; until its waiting batch is
 * due (a loop wakes it for a read or a full batch only); or with nothing waiting (a loop wakes it
 * for any record, whose batch it then waits for). */
enum { WRITER_RUNNING, WRITER_BATCHING, WRITER_IDLE };
/* Capture chunks kept for reuse (agw_store_chunk()): 10 MiB at most. Enough for the chunks a
 * batch hands over under a streaming load (about 20 ms of records at 120 MB/s, 30 chunks) and a
 * margin, so that a loop takes back pages that are already there instead of faulting new ones in.
 */
#define CHUNKS_KEPT 128
/* After a commit, a saved text with at least this much in memory is shed (agw_history_shed()):
 * the answers agents stream, most of a thread's bytes, stay on disk only; short ones stay, so that
 * a page of a chat reads few messages back. */
#define SHED_MIN_BYTES 1024
/* A writer that has had nothing to do for this long gives back what its last bursts left
 * allocated (trim()): an idle gateway holds memory for its open streams, not for the commits it
 * made a while ago. */
#define IDLE_TRIM_MS 1000

enum job_kind { JOB_INPUT, JOB_EVENTS, JOB_READ };

/* One record, in one allocation with its strings (the events' lines excepted: taken over). */
struct job {
    STAILQ_ENTRY(job) link; /* in the writer's lists */
    struct job *next_in;    /* in the loops' queue (atomic) */
    uint64_t at_ms;         /* when it was handed over */
    enum job_kind kind;
    const char *thread_id, *run_id, *agent_id; /* run_id, agent_id may be NULL */
    char *data;                                /* INPUT: the body (in the block); EVENTS: owned */
    size_t len;
    struct agw_input_message *msgs; /* INPUT: the body's messages as the loop read them (in the
                                       block); NULL: not read, the writer reads the body */
    size_t n_msgs;
    size_t cost;   /* bytes counted against max_queue_bytes */
    bool chunk;    /* JOB_EVENTS: <data> is a capture chunk, to be reused (agw_store_chunk()) */
    bool in_block; /* JOB_EVENTS: <data> is in the job's block (agw_store_run_events_copy()) */
    /* JOB_READ */
    struct agw_history_query q;
    struct agw_loop_mailbox *inbox; /* READ: where the answer goes */
    struct agw_loop_mail mail;      /* READ: the answer, posted there */
    agw_store_read_fn *done;
    void *arg;
    struct agw_store_page page;
};
STAILQ_HEAD(job_list, job);

/* A thread in memory. <agents>: ",a,b," (see struct agw_store_page). */
struct thread {
    struct agw_store *s;
    struct thread *next; /* hash chain */
    TAILQ_ENTRY(thread) lru;
    TAILQ_ENTRY(thread) dirty_link;
    uint64_t hash;
    char *agents;
    struct agw_history *h;
    int64_t updated_s; /* wall clock, seconds */
    bool dirty;
    /* The database holds no message of it outside [db_first, db_end) (but in a row that several
     * messages share, which a load reads no further than the thread's positions): empty for a
     * thread it never held, [0, UINT64_MAX) when unknown; exact after each commit of it, and
     * when it is read from the database. */
    uint64_t db_first, db_end;
    /* From its last commit: its number in the database (0: not known), and what its row then said
     * (<db_agents_len>: the length of <agents>, which only grows); valid while the store's
     * <expire_epoch> is <db_epoch> (the ttl deletes rows). */
    int64_t db_key, db_updated_s;
    size_t db_agents_len;
    uint64_t db_epoch;
    char id[]; /* in the thread's block */
};
TAILQ_HEAD(thread_list, thread);

struct agw_store {
    struct agw_store_options o;
    char *path; /* embedded: the directory, copied */
    /* The queue the loops hand records over on: a lock-free list (Vyukov's intrusive MPSC queue):
     * a loop never waits for the writer, which runs at nice 19 and could be off the CPU while it
     * held a lock the loop wanted. Loops push at <q_head> (atomic exchange); the writer alone
     * takes from <q_tail>. It sleeps in poll() on <wake_fd> (an eventfd), saying how in
     * <sleeping> (atomic): a loop writes to the eventfd only when that sleep must end. */
    struct job *q_head; /* atomic: the last record pushed */
    struct job *q_tail; /* the writer's */
    struct job q_stub;
    int wake_fd;
    int sleeping;  /* atomic: WRITER_RUNNING, WRITER_BATCHING or WRITER_IDLE */
    bool stopping; /* atomic */
    /* the writer's: records taken from the queue, waiting for their batch to be due */
    struct job_list waiting;
    size_t waiting_bytes;
    unsigned waiting_reads;
    /* bytes handed over and not yet applied, whether queued or waiting (atomic: loops add, the
     * writer takes off as it applies): the queue's bound and congestion (agw_store_congested()) */
    size_t pending_bytes;
    bool congested; /* atomic */
    /* capture chunks waiting to be reused (agw_store_chunk()): a list through their first bytes */
    pthread_mutex_t chunks_lock;
    char *chunks;
    size_t n_chunks;
    pthread_t thread;
    bool thread_started;
    /* the writer thread's */
    struct thread **buckets;
    size_t n_buckets, n_threads;
    struct thread_list lru;   /* most recently used first */
    struct thread_list dirty; /* changed since the last commit */
    uint64_t first_dirty_ms;  /* when the oldest uncommitted change was handed over */
    uint64_t batch_since_ms;  /* when the oldest record being applied was handed over */
    uint64_t next_sweep_ms;
    uint64_t trim_at_ms; /* when to trim() if still idle; 0: trimmed since the writer last worked */
    struct agw_store_backend be; /* be.self NULL: the memory kind */
    struct agw_store_msg *msgs;  /* a commit's messages, kept from one commit to the next */
    size_t msgs_cap;
    unsigned fail_streak;  /* commits failed in a row (0: the last one succeeded) */
    uint64_t expire_epoch; /* sweeps that deleted threads from the database (struct thread) */
    bool unsaved_logged;   /* dirty threads were evicted in this streak (logged once) */
    /* statistics (atomics: read from any thread) */
    uint64_t records, dropped, commits, commit_errors, expired, malformed, max_commit_us,
        congestions, thread_reads, reads_spared, unsaved, trims;
    uint64_t texts_bytes; /* the backend's long texts on disk, as of the last commit */
    size_t cached;
};

static uint64_t hash_id(const char *s)
{
    uint64_t h = agw_fnv1a(AGW_FNV_INIT, s, strlen(s));

    return h ^ (h >> 29);
}

static void stat_add(uint64_t *c, uint64_t n)
{
    __atomic_add_fetch(c, n, __ATOMIC_RELAXED);
}

/* The backend's long texts on disk, for agw_store_get_stats() (writer thread, or before it). */
static void publish_texts_bytes(struct agw_store *s)
{
    if (s->be.self != NULL && s->be.texts_bytes != NULL)
        __atomic_store_n(&s->texts_bytes, s->be.texts_bytes(s->be.self), __ATOMIC_RELAXED);
}

/* ---- the cache (writer thread) ------------------------------------------------------------ */

static struct thread **bucket_of(struct agw_store *s, uint64_t hash)
{
    return &s->buckets[hash & (s->n_buckets - 1)];
}

static void grow(struct agw_store *s)
{
    size_t old_n = s->n_buckets;
    struct thread **old = s->buckets;

    s->n_buckets *= 2;
    s->buckets = agw_xcalloc(s->n_buckets, sizeof(*s->buckets));
    for (size_t i = 0; i < old_n; i++) {
        struct thread *t, *next;
        for (t = old[i]; t != NULL; t = next) {
            struct thread **b = bucket_of(s, t->hash);
            next = t->next;
            t->next = *b;
            *b = t;
        }
    }
    free(old);
}

static struct thread *cache_find(struct agw_store *s, const char *id, uint64_t hash)
{
    for (struct thread *t = *bucket_of(s, hash); t != NULL; t = t->next)
        if (t->hash == hash && strcmp(t->id, id) == 0)
            return t;
    return NULL;
}

/* A shed text of thread <arg> read back from the backend (agw_history_set_loader()). */
static int thread_load(void *arg, uint64_t pos, char **data, size_t *len)
{
    struct thread *t = arg;

    return t->s->be.load_message(t->s->be.self, t->id, pos, data, len) == 0 ? 0 : -1;
}

static struct thread *cache_add(struct agw_store *s, const char *id, uint64_t hash,
                                struct agw_history *h, const char *agents, int64_t updated_s)
{
    size_t id_len = strlen(id);
    struct thread *t = agw_xcalloc(1, sizeof(*t) + id_len + 1);
    struct thread **b;

    memcpy(t->id, id, id_len + 1);
    t->s = s;
    t->db_end = UINT64_MAX; /* unknown (lookup_or_make() says when it is new to the database) */
    if (s->be.self != NULL)
        agw_history_set_loader(h, thread_load, t);

    if (s->n_threads + 1 > s->n_buckets)
        grow(s);
    b = bucket_of(s, hash);
    t->hash = hash;
    t->agents = agw_xstrdup(agents);
    t->h = h;
    t->updated_s = updated_s;
    t->next = *b;
    *b = t;
    TAILQ_INSERT_HEAD(&s->lru, t, lru);
    s->n_threads++;
    __atomic_store_n(&s->cached, s->n_threads, __ATOMIC_RELAXED);
    return t;
}

static void cache_remove(struct agw_store *s, struct thread *t)
{
    struct thread **p = bucket_of(s, t->hash);

    while (*p != t)
        p = &(*p)->next;
    *p = t->next;
    TAILQ_REMOVE(&s->lru, t, lru);
    if (t->dirty)
        TAILQ_REMOVE(&s->dirty, t, dirty_link);
    s->n_threads--;
    __atomic_store_n(&s->cached, s->n_threads, __ATOMIC_RELAXED);
    agw_history_free(t->h);
    free(t->agents);
    free(t);
}

/* Drops the least recently used clean threads while the cache holds more than it may. The memory
 * kind has nowhere else to keep them: they are forgotten, dirty or not. While the database refuses
 * commits (a full disk), dirty threads go too once no clean one is left, giving up their changes
 * since their last commit (counted, logged once per streak): the cache stays within
 * history.cache_threads whatever the disk does, instead of holding every thread changed since the
 * disk filled. */
static void evict(struct agw_store *s)
{
    struct thread *t = TAILQ_LAST(&s->lru, thread_list), *prev;

    for (; t != NULL && s->n_threads > s->o.cache_threads; t = prev) {
        prev = TAILQ_PREV(t, thread_list, lru);
        if (t->dirty && s->be.self != NULL)
            continue;
        cache_remove(s, t);
    }
    if (s->fail_streak == 0)
        return;
    for (t = TAILQ_LAST(&s->lru, thread_list); t != NULL && s->n_threads > s->o.cache_threads;
         t = prev) {
        prev = TAILQ_PREV(t, thread_list, lru);
        if (!s->unsaved_logged)
            agw_log_error("thread history: the store refuses writes and history.cache_threads "
                          "threads wait for it: the least recently used give up their unsaved "
                          "changes (agw_history_threads_unsaved_total)");
        s->unsaved_logged = true;
        stat_add(&s->unsaved, 1);
        cache_remove(s, t);
    }
}

static void mark_dirty(struct agw_store *s, struct thread *t)
{
    t->updated_s = (int64_t)(agw_wall_ms() / 1000);
    if (t->dirty || s->be.self == NULL)
        return;
    if (TAILQ_EMPTY(&s->dirty))
        s->first_dirty_ms = s->batch_since_ms; /* the commit interval counts from the hand-over */
    t->dirty = true;
    TAILQ_INSERT_TAIL(&s->dirty, t, dirty_link);
}

static bool expired(const struct agw_store *s, int64_t updated_s)
{
    return s->o.ttl_s > 0 && updated_s + (int64_t)s->o.ttl_s <= (int64_t)(agw_wall_ms() / 1000);
}

/* A thread being read back from the backend, message by message. */
struct restoring {
    struct agw_store *s;
    struct agw_history *h; /* made at the first message */
    bool bad;              /* a stored message could not be read */
};

static void restore_one(void *arg, const struct agw_store_msg *m)
{
    struct restoring *r = arg;
    struct agw_history_row row = {.data = m->data, .len = m->len, .part = m->part, .text = m->text};

    if (r->bad)
        return;
    if (r->h == NULL)
        r->h = agw_history_restore(r->s->o.max_messages, m->pos);
    if (agw_history_restore_message(r->h, m->pos, m->run_id, &row) != 0)
        r->bad = true;
}

/* Thread <id> from the cache or the database; NULL when neither knows it (or it expired). *<absent>
 * (may be NULL) is set when the database holds nothing of it, not even an expired row. */
static struct thread *lookup_ex(struct agw_store *s, const char *id, bool *absent)
{
    uint64_t hash = hash_id(id);
    struct thread *t = cache_find(s, id, hash);

    if (t != NULL) {
        if (expired(s, t->updated_s) && !t->dirty) {
            cache_remove(s, t);
            return NULL;
        }
        TAILQ_REMOVE(&s->lru, t, lru);
        TAILQ_INSERT_HEAD(&s->lru, t, lru);
        return t;
    }
    if (s->be.self == NULL)
        return NULL;
    /* A thread new to the database (clients draw their ids at random): nothing to read. */
    if (s->be.may_hold != NULL && !s->be.may_hold(s->be.self, id)) {
        stat_add(&s->reads_spared, 1);
        if (absent != NULL)
            *absent = true;
        return NULL;
    }
    struct agw_store_row row;
    struct restoring r = {.s = s};
    int rc = s->be.load(s->be.self, id, s->o.max_messages, &row, restore_one, &r);
    stat_add(&s->thread_reads, 1);
    if (absent != NULL)
        *absent = rc == 0;
    if (rc == 1 && !r.bad && expired(s, row.updated_s)) {
        agw_history_free(r.h);
        return NULL;
    }
    if (rc == 1 && !r.bad) {
        if (r.h == NULL) /* a thread row with no message */
            r.h = agw_history_restore(s->o.max_messages, row.first);
        t = cache_add(s, id, hash, r.h, row.agents, row.updated_s);
        /* its rows are its positions, as its last commit left them: the messages it gains next
         * may share rows */
        t->db_first = row.first;
        t->db_end = row.first + row.count;
        return t;
    }
    agw_history_free(r.h);
    if (rc != 0) {
        agw_log_error("thread history: thread %s: its stored data cannot be read: ignored", id);
        stat_add(&s->malformed, 1);
    }
    return NULL;
}

static struct thread *lookup(struct agw_store *s, const char *id)
{
    return lookup_ex(s, id, NULL);
}

/* Thread <id>, made when new. */
static struct thread *lookup_or_make(struct agw_store *s, const char *id)
{
    bool absent = false;
    struct thread *t = lookup_ex(s, id, &absent);

    if (t == NULL) {
        t = cache_add(s, id, hash_id(id), agw_history_new(s->o.max_messages), ",", 0);
        if (absent) /* new to the database: no row to delete at its first commit */
            t->db_end = 0;
    }
    return t;
}

static void add_agent(struct thread *t, const char *agent)
{
    size_t n = strlen(agent), have = strlen(t->agents);
    char *p = t->agents;

    /* ",a,b," contains ",<agent>," exactly when the agent is there. */
    for (const char *q = strstr(p, agent); q != NULL; q = strstr(q + 1, agent))
        if (q[-1] == ',' && q[n] == ',')
            return;
    t->agents = agw_xrealloc(t->agents, have + n + 2);
    memcpy(t->agents + have, agent, n);
    t->agents[have + n] = ',';
    t->agents[have + n + 1] = '\0';
}

/* ---- commits (writer thread) -------------------------------------------------------------- */

/* The changes of thread <t> since its last commit, for the backend: its row, and in *<msgs> (grown
 * as needed, <cap> entries) from index <at> on, the messages that changed. Returns how many. */
static size_t changes(const struct agw_store *s, struct thread *t, struct agw_store_row *row,
                      struct agw_store_msg **msgs, size_t *cap, size_t at)
{
    int64_t key = t->db_epoch == s->expire_epoch ? t->db_key : 0;
    struct agw_history *h = t->h;
    size_t n = agw_history_count(h), k = at;
    uint64_t first = agw_history_dropped(h);
    struct agw_history_row r;

    for (size_t i = agw_history_first_changed(h); i < n; i++) {
        if (!agw_history_changed(h, i))
            continue;
        if (k == *cap) {
            *cap = *cap > 0 ? *cap * 2 : 64;
            *msgs = agw_xrealloc(*msgs, *cap * sizeof(**msgs));
        }
        agw_history_message_row(h, i, &r);
        (*msgs)[k] = (struct agw_store_msg){.pos = first + i,
                                            .run_id = agw_history_run_id(h, i),
                                            .data = r.data,
                                            .len = r.len,
                                            .part = r.part,
                                            .text = r.text,
                                            .drop_parts = r.drop_parts};
        k++;
    }
    *row = (struct agw_store_row){
        .id = t->id,
        .agents = t->agents,
        .updated_s = t->updated_s,
        .first = first,
        .count = n,
        .n_msgs = k - at,
        .drop_before = t->db_first < first && t->db_end > t->db_first,
        .drop_after = t->db_end > first + n,
        .fresh_from = t->db_end,
        .key = key,
        .row_same = key > 0 && t->db_first == first && t->db_end == first + n &&
                    t->db_updated_s == t->updated_s && t->db_agents_len == strlen(t->agents)};
    return k - at;
}

/* How long after a failed commit the next is tried: the commit interval, doubled at each failure
 * in a row, up to COMMIT_RETRY_MAX_MS (or the interval, if longer). */
static uint64_t retry_delay_ms(const struct agw_store *s)
{
    uint64_t cap = s->o.commit_ms > COMMIT_RETRY_MAX_MS ? s->o.commit_ms : COMMIT_RETRY_MAX_MS;
    uint64_t delay = (uint64_t)s->o.commit_ms << (s->fail_streak < 12 ? s->fail_streak : 12);

    return delay < cap ? delay : cap;
}

/* Writes every dirty thread's changes in one transaction. */
static void commit(struct agw_store *s)
{
    struct timespec a, b;
    struct agw_store_row *rows;
    struct thread *t;
    size_t n = 0, n_msgs = 0;
    char err[256];
    int rc;

    if (s->be.self == NULL || TAILQ_EMPTY(&s->dirty))
        return;
    clock_gettime(CLOCK_MONOTONIC, &a);
    TAILQ_FOREACH(t, &s->dirty, dirty_link)
    n++;
    rows = agw_xcalloc(n, sizeof(*rows));
    n = 0;
    TAILQ_FOREACH(t, &s->dirty, dirty_link)
    {
        n_msgs += changes(s, t, &rows[n], &s->msgs, &s->msgs_cap, n_msgs);
        n++;
    }
    /* the messages' array is complete (it may have moved while growing): point the rows into it */
    n_msgs = 0;
    for (size_t i = 0; i < n; i++) {
        rows[i].msgs = s->msgs + n_msgs;
        n_msgs += rows[i].n_msgs;
    }
    rc = s->be.save(s->be.self, rows, n, err, sizeof(err));
    if (rc != 0) {
        free(rows);
        /* The threads stay dirty: the next commit tries them again. */
        if (s->fail_streak == 0)
            agw_log_error("thread history: commit failed: %s (retried until it succeeds)", err);
        stat_add(&s->commit_errors, 1);
        s->first_dirty_ms = agw_now_ms() + retry_delay_ms(s) - s->o.commit_ms; /* due then */
        s->fail_streak++;
        return;
    }
    for (size_t i = 0; (t = TAILQ_FIRST(&s->dirty)) != NULL; i++) { /* in the rows' order */
        TAILQ_REMOVE(&s->dirty, t, dirty_link);
        t->dirty = false;
        t->db_first = agw_history_dropped(t->h);
        t->db_end = t->db_first + agw_history_count(t->h);
        t->db_key = rows[i].key;
        t->db_updated_s = t->updated_s;
        t->db_agents_len = strlen(t->agents);
        t->db_epoch = s->expire_epoch;
        agw_history_mark_saved(t->h);
        agw_history_shed(t->h, SHED_MIN_BYTES);
    }
    free(rows);
    clock_gettime(CLOCK_MONOTONIC, &b);
    {
        uint64_t us =
            (uint64_t)(b.tv_sec - a.tv_sec) * 1000000u + (uint64_t)((b.tv_nsec - a.tv_nsec) / 1000);
        if (us > __atomic_load_n(&s->max_commit_us, __ATOMIC_RELAXED))
            __atomic_store_n(&s->max_commit_us, us, __ATOMIC_RELAXED);
    }
    if (s->fail_streak > 0)
        agw_log_info("thread history: commits succeed again");
    s->fail_streak = 0;
    s->unsaved_logged = false;
    stat_add(&s->commits, 1);
    publish_texts_bytes(s);
}

/* Deletes the threads the ttl let go: from the cache, then from the database in small
 * transactions, so that no commit waits long behind it. */
static void sweep(struct agw_store *s)
{
    int64_t cutoff = (int64_t)(agw_wall_ms() / 1000) - (int64_t)s->o.ttl_s;
    struct thread *t, *next;
    uint64_t n = 0;

    if (s->o.ttl_s == 0)
        return;
    for (t = TAILQ_FIRST(&s->lru); t != NULL; t = next) {
        next = TAILQ_NEXT(t, lru);
        if (!t->dirty && t->updated_s <= cutoff) {
            cache_remove(s, t);
            n += s->be.self == NULL;
        }
    }
    for (int64_t k = TTL_BATCH; s->be.self != NULL && k == TTL_BATCH;) {
        k = s->be.expire(s->be.self, cutoff + 1, TTL_BATCH);
        n += k > 0 ? (uint64_t)k : 0;
        if (k > 0) /* a thread still cached may have lost its row: its number is looked up again */
            s->expire_epoch++;
    }
    if (n > 0)
        agw_log_info("thread history: %llu thread%s past the ttl deleted", (unsigned long long)n,
                     n == 1 ? "" : "s");
    stat_add(&s->expired, n);
}

/* ---- applying records (writer thread) ----------------------------------------------------- */

/* A thread that could not read a shed text back (agw_history_load_errors()) is not to be trusted:
 * it is dropped from the cache, its changes since the last commit with it, and read back from the
 * database when next asked for. Returns true when it was. */
static bool drop_if_unreliable(struct agw_store *s, struct thread *t)
{
    if (agw_history_load_errors(t->h) == 0)
        return false;
    agw_log_error("thread history: thread %s: a saved message could not be read back; its changes "
                  "since the last commit are lost and it is read again from the database",
                  t->id);
    stat_add(&s->malformed, 1);
    cache_remove(s, t);
    return true;
}

static void apply_input(struct agw_store *s, struct job *j)
{
    struct thread *t = lookup_or_make(s, j->thread_id);

    /* validated before (agw_input_parse()): an absent list is fine, a body jansson refuses with
     * JSON_REJECT_DUPLICATES is counted */
    if ((j->msgs != NULL ? agw_history_merge_read(t->h, j->run_id, j->data, j->msgs, j->n_msgs)
                         : agw_history_merge_body(t->h, j->run_id, j->data, j->len)) < 0)
        stat_add(&s->malformed, 1);
    add_agent(t, j->agent_id);
    if (!drop_if_unreliable(s, t))
        mark_dirty(s, t);
}

static void apply_events(struct agw_store *s, struct job *j)
{
    struct thread *t = lookup_or_make(s, j->thread_id);
    int bad = agw_history_apply_lines(t->h, j->run_id, j->data, j->len);

    if (bad > 0)
        stat_add(&s->malformed, (uint64_t)bad);
    if (!drop_if_unreliable(s, t))
        mark_dirty(s, t);
}

static void apply_read(struct agw_store *s, struct job *j)
{
    struct thread *t = lookup(s, j->thread_id);
    json_t *page;

    if (t == NULL) {
        j->page.status = 404;
        return;
    }
    page = agw_history_page(t->h, &j->q);
    if (page == NULL) { /* a shed text could not be read back */
        drop_if_unreliable(s, t);
        j->page.status = 500;
        return;
    }
    j->page.status = 200;
    j->page.body = json_dumps(page, JSON_COMPACT);
    if (j->page.body == NULL)
        abort(); /* out of memory: the daemon's policy */
    j->page.len = strlen(j->page.body);
    j->page.agents = agw_xstrdup(t->agents);
    json_decref(page);
}

static void job_free(struct agw_store *s, struct job *j);

/* An answer, run on the asking loop (or dropped with its mailbox: then NULL). */
static void answer_cb(struct agw_loop_mail *m, bool dropped)
{
    struct job *j = (struct job *)(void *)((char *)m - offsetof(struct job, mail));

    j->done(j->arg, dropped ? NULL : &j->page);
    job_free(NULL, j); /* a read: no chunk */
}

static void deliver(struct job *j)
{
    j->mail.fn = answer_cb;
    agw_loop_mailbox_post(j->inbox, &j->mail);
}

/* A chunk handed back: kept for a loop's next agw_store_chunk() while fewer than CHUNKS_KEPT
 * wait, else freed. */
static void chunk_put(struct agw_store *s, char *c)
{
    pthread_mutex_lock(&s->chunks_lock);
    if (s->n_chunks < CHUNKS_KEPT) {
        memcpy(c, &s->chunks, sizeof(char *));
        s->chunks = c;
        s->n_chunks++;
        c = NULL;
    }
    pthread_mutex_unlock(&s->chunks_lock);
    free(c);
}

/* Frees the chunks kept for reuse (an idle writer's trim, the close). */
static void chunks_free(struct agw_store *s)
{
    char *c;

    pthread_mutex_lock(&s->chunks_lock);
    c = s->chunks;
    s->chunks = NULL;
    s->n_chunks = 0;
    pthread_mutex_unlock(&s->chunks_lock);
    while (c != NULL) {
        char *next;
        memcpy(&next, c, sizeof(char *));
        free(c);
        c = next;
    }
}

/* <s> may be NULL for a record that holds no chunk (a read). */
static void job_free(struct agw_store *s, struct job *j)
{
    if (j->kind == JOB_EVENTS && j->chunk)
        chunk_put(s, j->data);
    else if (j->kind == JOB_EVENTS && !j->in_block)
        agw_mem_separate_free(j->data); /* a capture's buffer (src/capture.c) */
    free(j->page.body);
    free(j->page.agents);
    agw_mem_separate_free(j);
}

/* <cost> bytes of records were applied: the loops may read again once under a quarter of the
 * congestion threshold. */
static void applied_bytes(struct agw_store *s, size_t cost)
{
    size_t left = __atomic_sub_fetch(&s->pending_bytes, cost, __ATOMIC_RELAXED);

    if (left <= s->o.congested_bytes / 4 && __atomic_load_n(&s->congested, __ATOMIC_RELAXED))
        __atomic_store_n(&s->congested, false, __ATOMIC_RELEASE);
}

bool agw_store_congested(const struct agw_store *s)
{
    return __atomic_load_n(&s->congested, __ATOMIC_ACQUIRE);
}

/* ---- the queue ------------------------------------------------------------------------------ */

static void queue_init(struct agw_store *s)
{
    s->q_stub.next_in = NULL;
    s->q_head = s->q_tail = &s->q_stub;
}

/* Any thread: appends <j>. Wait-free: one exchange, one store. */
static void queue_push(struct agw_store *s, struct job *j)
{
    struct job *prev;

    __atomic_store_n(&j->next_in, NULL, __ATOMIC_RELAXED);
    prev = __atomic_exchange_n(&s->q_head, j, __ATOMIC_SEQ_CST);
    __atomic_store_n(&prev->next_in, j, __ATOMIC_RELEASE);
}

/* The writer: the oldest record, or NULL when there is none, or (*<busy> set) when a loop is in
 * the middle of pushing one (between its exchange and its store: take it a moment later). */
static struct job *queue_pop(struct agw_store *s, bool *busy)
{
    struct job *tail = s->q_tail, *next = __atomic_load_n(&tail->next_in, __ATOMIC_ACQUIRE);

    if (tail == &s->q_stub) {
        if (next == NULL) {
            *busy = __atomic_load_n(&s->q_head, __ATOMIC_SEQ_CST) != tail;
            return NULL;
        }
        s->q_tail = tail = next;
        next = __atomic_load_n(&tail->next_in, __ATOMIC_ACQUIRE);
    }
    if (next != NULL) {
        s->q_tail = next;
        return tail;
    }
    if (__atomic_load_n(&s->q_head, __ATOMIC_SEQ_CST) != tail) {
        *busy = true;
        return NULL;
    }
    queue_push(s, &s->q_stub); /* <tail> is the last one: the stub goes behind it */
    next = __atomic_load_n(&tail->next_in, __ATOMIC_ACQUIRE);
    if (next != NULL) {
        s->q_tail = next;
        return tail;
    }
    *busy = true;
    return NULL;
}

/* The writer: moves what the loops handed over to its waiting list. Returns how many; *<busy> as
 * for queue_pop(). */
static size_t take(struct agw_store *s, bool *busy)
{
    struct job *j;
    size_t n = 0;

    *busy = false;
    while ((j = queue_pop(s, busy)) != NULL) {
        STAILQ_INSERT_TAIL(&s->waiting, j, link);
        s->waiting_bytes += j->cost;
        s->waiting_reads += j->kind == JOB_READ;
        n++;
    }
    return n;
}

/* Sleeps until <deadline> (agw_now_ms()), a loop's wake-up, or the stop; saying how (<kind>). A
 * record pushed after the writer last looked, which the loop that pushed it saw the writer running
 * for, is seen here before sleeping: <sleeping> is set first, then the queue looked at. */
static void writer_sleep(struct agw_store *s, int kind, uint64_t deadline)
{
    struct pollfd pfd = {.fd = s->wake_fd, .events = POLLIN};
    uint64_t now = agw_now_ms(), n;
    bool busy;

    __atomic_store_n(&s->sleeping, kind, __ATOMIC_SEQ_CST);
    if (take(s, &busy) > 0 || __atomic_load_n(&s->stopping, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(&s->sleeping, WRITER_RUNNING, __ATOMIC_SEQ_CST);
        return;
    }
    if (busy && deadline > now + 1)
        deadline = now + 1; /* a push under way: look again in a moment */
    if (deadline > now)
        poll(&pfd, 1, deadline - now > 60000 ? 60000 : (int)(deadline - now));
    __atomic_store_n(&s->sleeping, WRITER_RUNNING, __ATOMIC_SEQ_CST);
    if (read(s->wake_fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
        agw_log_error("thread history: the writer's wake-up: %s", strerror(errno));
}

/* Any thread: ends a sleep of kind <kind> (or a deeper one's). */
static void writer_wake(struct agw_store *s, int kind)
{
    int k = __atomic_load_n(&s->sleeping, __ATOMIC_SEQ_CST);
    uint64_t one = 1;

    if (k < kind)
        return;
    if (!__atomic_compare_exchange_n(&s->sleeping, &k, WRITER_RUNNING, false, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST))
        return; /* another one woke it */
    if (write(s->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        agw_log_error("thread history: cannot wake the writer: %s", strerror(errno));
}

#if defined(__linux__) && defined(SYS_sched_setattr)
/* Gives the calling thread (the writer) a time slice of WRITER_SLICE_US. Since Linux 6.6 the
 * scheduler (EEVDF) lets a running thread go on until its slice is used up before a thread that
 * wakes takes the core: a loop woken by an event could wait out a writer's slice of a few
 * milliseconds whatever the nice values, which showed in paced streams' p99 latency with history
 * on (820 and 780 µs against 572 and 438 with history off, same runs, 2026-11-26). With a slice of
 * 100 µs the writer yields at once: 700 and 628 against 636 and 668. No privilege is needed, and
 * the writer keeps its share (not SCHED_IDLE, which helped as much but can starve on a busy host).
 * On a kernel without custom slices the call fails or is ignored: nice 19 alone then. */
static void short_slice(void)
{
    struct { /* struct sched_attr, its first version (48 bytes) */
        uint32_t size, policy;
        uint64_t flags;
        int32_t nice;
        uint32_t priority;
        uint64_t runtime, deadline, period;
    } a = {.size = 48,
           .policy = SCHED_OTHER,
           .nice = WRITER_NICE,
           .runtime = (uint64_t)WRITER_SLICE_US * 1000};

    if (syscall(SYS_sched_setattr, 0, &a, 0) != 0)
        agw_log_debug("thread history: the writer's time slice stays the kernel's: %s",
                      strerror(errno));
}
#else
static inline void short_slice(void)
{
}
#endif

/* The writer has been idle IDLE_TRIM_MS: the backend's write buffers, the capture chunks kept for
 * the loops and its arena's freed pages go back (each made again by the next burst that needs it).
 * About 0.25 KiB per stream of an idle gateway's 2,000 (doc/benchmarks.md). */
static void trim(struct agw_store *s)
{
    /* counted as it begins (a test looks at the buffers between two reads of the count) */
    __atomic_add_fetch(&s->trims, 1, __ATOMIC_SEQ_CST);
    if (s->be.self != NULL && s->be.trim != NULL)
        s->be.trim(s->be.self);
    chunks_free(s);
    agw_mem_release_arena();
}

static void *writer_main(void *arg)
{
    struct agw_store *s = arg;
    uint64_t batch_ms = s->o.commit_ms < BATCH_MS ? s->o.commit_ms : BATCH_MS;
    struct job_list batch = STAILQ_HEAD_INITIALIZER(batch);

    /* its freed text buffers stay its own when a loop purges its arena (agw_mem_release_own()) */
    agw_mem_own_arena();
#ifdef __linux__
    /* Background work: on a core it shares with an event loop, the loop comes first (Linux gives a
     * thread its own nice value). At nice 19 the writer's virtual time runs 68 times faster than a
     * loop's, so a loop that wakes takes the core at once instead of waiting out the writer's slice
     * (paced streams' p99 latency with history on: 462 µs at nice 5, 394 at nice 19); the writer
     * still gets the idle time of every core and a share when all are busy
     * (doc/internals/store.md). Not SCHED_IDLE: on a host busy with other work it could starve, and
     * reads wait for it. No loop ever waits for it: the queue takes no lock. */
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), WRITER_NICE) != 0)
        agw_log_warn("thread history: cannot lower the writer's priority: %s", strerror(errno));
    short_slice();
#endif

    for (;;) {
        struct job *j;
        bool stop, busy;
        uint64_t now, due;

        take(s, &busy);
        stop = __atomic_load_n(&s->stopping, __ATOMIC_SEQ_CST);
        now = agw_now_ms();
        if (!stop && s->waiting_reads == 0 && s->waiting_bytes < BATCH_BYTES &&
            (STAILQ_EMPTY(&s->waiting) || now < STAILQ_FIRST(&s->waiting)->at_ms + batch_ms)) {
            /* no batch due: sleep until one is, or a commit, a sweep or a trim */
            bool idle = STAILQ_EMPTY(&s->waiting) && TAILQ_EMPTY(&s->dirty);
            if (idle && s->trim_at_ms != 0 && now >= s->trim_at_ms) {
                trim(s);
                s->trim_at_ms = 0;
            }
            due = s->next_sweep_ms;
            if (idle && s->trim_at_ms != 0 && s->trim_at_ms < due)
                due = s->trim_at_ms;
            if (!STAILQ_EMPTY(&s->waiting) && STAILQ_FIRST(&s->waiting)->at_ms + batch_ms < due)
                due = STAILQ_FIRST(&s->waiting)->at_ms + batch_ms;
            if (!TAILQ_EMPTY(&s->dirty) && s->first_dirty_ms + s->o.commit_ms < due)
                due = s->first_dirty_ms + s->o.commit_ms;
            if (due > now) {
                writer_sleep(s, STAILQ_EMPTY(&s->waiting) ? WRITER_IDLE : WRITER_BATCHING, due);
                continue;
            }
        } else {
            s->batch_since_ms = STAILQ_EMPTY(&s->waiting) ? now : STAILQ_FIRST(&s->waiting)->at_ms;
            STAILQ_CONCAT(&batch, &s->waiting);
            s->waiting_bytes = 0;
            s->waiting_reads = 0;
        }

        if (agw_now_ms() >= s->next_sweep_ms) { /* first of all at start */
            sweep(s);
            s->next_sweep_ms = agw_now_ms() + TTL_SWEEP_MS;
        }
        while ((j = STAILQ_FIRST(&batch)) != NULL) {
            STAILQ_REMOVE_HEAD(&batch, link);
            switch (j->kind) {
            case JOB_INPUT:
                apply_input(s, j);
                break;
            case JOB_EVENTS:
                apply_events(s, j);
                break;
            case JOB_READ:
                apply_read(s, j);
                deliver(j);
                j = NULL;
                break;
            }
            stat_add(&s->records, 1);
            if (j != NULL)
                applied_bytes(s, j->cost);
            if (j != NULL)
                job_free(s, j);
        }
        if (!TAILQ_EMPTY(&s->dirty) && (stop || agw_now_ms() >= s->first_dirty_ms + s->o.commit_ms))
            commit(s);
        evict(s);
        s->trim_at_ms = agw_now_ms() + IDLE_TRIM_MS;
        if (stop) {
            take(s, &busy);
            if (STAILQ_EMPTY(&s->waiting) && !busy) {
                if (!TAILQ_EMPTY(&s->dirty)) /* the last commit failed: the disk refuses */
                    agw_log_error("thread history: changes could not be written at exit");
                break;
            }
        }
    }
    return NULL;
}

/* ---- the loops' side ---------------------------------------------------------------------- */

static void submit(struct agw_store *s, struct job *j)
{
    size_t pending = 0;
    int wake;

    if (j->kind != JOB_READ) {
        pending = __atomic_add_fetch(&s->pending_bytes, j->cost, __ATOMIC_RELAXED);
        if (pending > s->o.max_queue_bytes) {
            /* The disk is far behind: dropping a record beats blocking a loop or growing without
             * end. */
            __atomic_sub_fetch(&s->pending_bytes, j->cost, __ATOMIC_RELAXED);
            if (__atomic_fetch_add(&s->dropped, 1, __ATOMIC_RELAXED) % 1000 == 0)
                agw_log_error("thread history: the store is behind (%zu bytes queued): records "
                              "dropped (thread %s)",
                              s->o.max_queue_bytes, j->thread_id);
            job_free(s, j);
            return;
        }
        if (s->o.congested_bytes > 0 && pending >= s->o.congested_bytes &&
            !__atomic_load_n(&s->congested, __ATOMIC_RELAXED)) {
            __atomic_store_n(&s->congested, true, __ATOMIC_RELEASE);
            stat_add(&s->congestions, 1);
        }
    }
    /* A sleeping writer is woken for a read, a full batch, or the first record (so that it sleeps
     * until that one's batch is due); a writer that runs or waits for a batch takes the others
     * when it is due, without a system call here. (Decided before the push: once pushed, <j> is
     * the writer's, who may have freed it already.) */
    wake = j->kind == JOB_READ || pending >= BATCH_BYTES ? WRITER_BATCHING : WRITER_IDLE;
    j->at_ms = agw_now_ms();
    queue_push(s, j);
    writer_wake(s, wake);
}

/* A job with copies of its ids (NULL ones stay NULL) and <extra> bytes after them (*<extra_at>),
 * for the caller to fill. */
static struct job *job_new(enum job_kind kind, const char *thread_id, const char *run_id,
                           const char *agent_id, size_t extra, char **extra_at)
{
    const char *src[3] = {thread_id, run_id, agent_id};
    size_t lens[3], size = sizeof(struct job) + extra;
    const char **dst[3];
    struct job *j;
    char *p;

    for (size_t i = 0; i < 3; i++) {
        lens[i] = src[i] != NULL ? strlen(src[i]) + 1 : 0;
        size += lens[i];
    }
    j = agw_mem_separate_alloc(size);
    memset(j, 0, sizeof(*j)); /* (the ids and the extra bytes are written by the caller) */
    j->kind = kind;
    j->cost = size;
    dst[0] = &j->thread_id;
    dst[1] = &j->run_id;
    dst[2] = &j->agent_id;
    p = (char *)(j + 1);
    for (size_t i = 0; i < 3; i++) {
        if (src[i] == NULL)
            continue;
        memcpy(p, src[i], lens[i]);
        *dst[i] = p;
        p += lens[i];
    }
    if (extra_at != NULL)
        *extra_at = p;
    return j;
}

void agw_store_run_input(struct agw_store *s, const char *agent_id, const char *thread_id,
                         const char *run_id, const char *body, size_t len,
                         const struct agw_input_message *msgs, size_t n_msgs)
{
    const size_t align = _Alignof(struct agw_input_message);
    size_t spans = msgs != NULL ? n_msgs * sizeof(*msgs) + align - 1 : 0;
    char *at;
    struct job *j = job_new(JOB_INPUT, thread_id, run_id, agent_id, spans + len, &at);

    if (msgs != NULL) {
        /* the scanner's reading first (aligned), then the body */
        at += (align - (uintptr_t)at % align) % align;
        j->msgs = (struct agw_input_message *)(void *)at;
        j->n_msgs = n_msgs;
        if (n_msgs > 0)
            memcpy(j->msgs, msgs, n_msgs * sizeof(*msgs));
        at += n_msgs * sizeof(*msgs);
    }
    memcpy(at, body, len);
    j->data = at;
    j->len = len;
    submit(s, j);
}

void agw_store_run_events(struct agw_store *s, const char *thread_id, const char *run_id,
                          char *lines, size_t len, bool chunk)
{
    struct job *j = job_new(JOB_EVENTS, thread_id, run_id, NULL, 0, NULL);

    j->data = lines;
    j->len = len;
    j->chunk = chunk;
    j->cost += len;
    submit(s, j);
}

void agw_store_run_events_copy(struct agw_store *s, const char *thread_id, const char *run_id,
                               const char *lines, size_t len)
{
    char *at;
    struct job *j = job_new(JOB_EVENTS, thread_id, run_id, NULL, len, &at);

    memcpy(at, lines, len);
    j->data = at;
    j->len = len;
    j->in_block = true;
    submit(s, j);
}

char *agw_store_chunk(void *store)
{
    struct agw_store *s = store;
    char *c;

    /* (a loop never waits for the writer: when it holds the lock, a new chunk will do) */
    if (pthread_mutex_trylock(&s->chunks_lock) != 0)
        return agw_xmalloc(AGW_CAPTURE_CHUNK_BYTES);
    c = s->chunks;
    if (c != NULL) {
        memcpy(&s->chunks, c, sizeof(char *));
        s->n_chunks--;
    }
    pthread_mutex_unlock(&s->chunks_lock);
    return c != NULL ? c : agw_xmalloc(AGW_CAPTURE_CHUNK_BYTES);
}

void agw_store_read(struct agw_store *s, const char *thread_id, const struct agw_history_query *q,
                    struct agw_loop_mailbox *inbox, agw_store_read_fn *done, void *arg)
{
    struct job *j = job_new(JOB_READ, thread_id, NULL, NULL, 0, NULL);

    j->q = *q;
    j->inbox = inbox;
    j->done = done;
    j->arg = arg;
    submit(s, j);
}

/* ---- open, close, statistics -------------------------------------------------------------- */

struct agw_store *agw_store_open(const struct agw_store_options *o, char *err, size_t errlen)
{
    struct agw_store *s = agw_xcalloc(1, sizeof(*s));

    s->wake_fd = -1;
    s->o = *o;
    if (s->o.cache_threads == 0)
        s->o.cache_threads = 1;
    s->n_buckets = INITIAL_BUCKETS;
    s->buckets = agw_xcalloc(s->n_buckets, sizeof(*s->buckets));
    TAILQ_INIT(&s->lru);
    TAILQ_INIT(&s->dirty);
    STAILQ_INIT(&s->waiting);
    queue_init(s);
    pthread_mutex_init(&s->chunks_lock, NULL);
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->wake_fd < 0) {
        snprintf(err, errlen, "thread history: eventfd: %s", strerror(errno));
        goto fail;
    }
    switch (o->kind) {
    case AGW_STORE_EMBEDDED:
        s->path = agw_xstrdup(o->path != NULL ? o->path : "var/agui-gateway");
        s->o.path = s->path;
        if (agw_store_sqlite_open(s->path, &s->be, err, errlen) != 0)
            goto fail;
        break;
    case AGW_STORE_MEMORY:
        agw_log_info("thread history: in memory (nothing survives a restart)");
        break;
    case AGW_STORE_REDIS:
        snprintf(err, errlen,
                 "store.kind: \"redis\" is not available in this release: use "
                 "\"embedded\" or \"memory\"");
        goto fail;
    }
    publish_texts_bytes(s);
    s->next_sweep_ms = agw_now_ms(); /* at once: what expired while the gateway was down */
    if (pthread_create(&s->thread, NULL, writer_main, s) != 0) {
        snprintf(err, errlen, "thread history: cannot start the writer thread");
        goto fail;
    }
    s->thread_started = true;
    pthread_setname_np(s->thread, "agw-store"); /* as top -H and /proc/PID/task/TID/comm show it */
    return s;
fail:
    agw_store_close(s);
    return NULL;
}

void agw_store_close(struct agw_store *s)
{
    struct thread *t;

    if (s == NULL)
        return;
    if (s->thread_started) {
        uint64_t one = 1;
        __atomic_store_n(&s->stopping, true, __ATOMIC_SEQ_CST);
        if (write(s->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
            agw_log_error("thread history: cannot wake the writer: %s", strerror(errno));
        pthread_join(s->thread, NULL);
    }
    while ((t = TAILQ_FIRST(&s->lru)) != NULL)
        cache_remove(s, t);
    if (s->be.self != NULL)
        s->be.close(s->be.self);
    chunks_free(s);
    pthread_mutex_destroy(&s->chunks_lock);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    free(s->buckets);
    free(s->msgs);
    free(s->path);
    free(s);
}

void agw_store_get_stats(struct agw_store *s, struct agw_store_stats *st)
{
    st->records = __atomic_load_n(&s->records, __ATOMIC_RELAXED);
    st->dropped = __atomic_load_n(&s->dropped, __ATOMIC_RELAXED);
    st->commits = __atomic_load_n(&s->commits, __ATOMIC_RELAXED);
    st->commit_errors = __atomic_load_n(&s->commit_errors, __ATOMIC_RELAXED);
    st->expired = __atomic_load_n(&s->expired, __ATOMIC_RELAXED);
    st->malformed = __atomic_load_n(&s->malformed, __ATOMIC_RELAXED);
    st->max_commit_us = __atomic_load_n(&s->max_commit_us, __ATOMIC_RELAXED);
    st->cached = __atomic_load_n(&s->cached, __ATOMIC_RELAXED);
    st->congestions = __atomic_load_n(&s->congestions, __ATOMIC_RELAXED);
    st->thread_reads = __atomic_load_n(&s->thread_reads, __ATOMIC_RELAXED);
    st->reads_spared = __atomic_load_n(&s->reads_spared, __ATOMIC_RELAXED);
    st->unsaved = __atomic_load_n(&s->unsaved, __ATOMIC_RELAXED);
    st->queued_bytes = __atomic_load_n(&s->pending_bytes, __ATOMIC_RELAXED);
    st->texts_bytes = __atomic_load_n(&s->texts_bytes, __ATOMIC_RELAXED);
    st->trims = __atomic_load_n(&s->trims, __ATOMIC_RELAXED);
}
