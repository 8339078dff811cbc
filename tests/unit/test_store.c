/* Unit tests for src/store.c: records applied in order and read back through an event loop's
 * mailbox, both kinds; the embedded store across a close and a reopen (a restart); the startup
 * errors (a read-only directory, a file that is not a database, the redis kind, a newer schema);
 * the per-thread cap, the ttl, the memory kind's cache limit, the agents list, and a mailbox freed
 * with an answer still in it. Schema 3 (src/store_sqlite.c), read back with SQLite: a row per
 * message at its position, a text growing across commits, an insertion mid-thread, a shrinking
 * snapshot, the cap and the ttl on the rows, an unreadable row, a text written by pieces, and the
 * migration of schema 1 and schema 2 stores. */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <linux/capability.h>

#include <event2/event.h>
#include <jansson.h>
#include <sqlite3.h>

#include "agw/loop.h"
#include "agw/input.h"
#include "agw/store.h"
#include "../../src/store_backend.h"
#include "../../src/store_texts.h"
#include "../../src/store_vfs.h"

static char dir[] = "/tmp/agw-store-test.XXXXXX";

static void setup(void)
{
    cr_assert(mkdtemp(dir) != NULL);
}

static void teardown(void)
{
    char cmd[128];

    snprintf(cmd, sizeof(cmd), "chmod -R u+w %s; rm -rf %s", dir, dir);
    cr_assert_eq(system(cmd), 0);
    agw_store_texts_tune(0, 0, false, false);
}

TestSuite(store, .init = setup, .fini = teardown);

static struct agw_store_options options(enum agw_store_kind kind, const char *path, size_t max,
                                        uint64_t ttl_s, size_t cache)
{
    return (struct agw_store_options){.kind = kind,
                                      .path = path,
                                      .max_messages = max,
                                      .ttl_s = ttl_s,
                                      .cache_threads = cache,
                                      .commit_ms = 20,
                                      .max_queue_bytes = 1 << 20};
}

static struct agw_store *open_store(enum agw_store_kind kind, const char *path, size_t max,
                                    uint64_t ttl_s, size_t cache)
{
    struct agw_store_options o = options(kind, path, max, ttl_s, cache);
    char err[512] = "";
    struct agw_store *s = agw_store_open(&o, err, sizeof(err));

    cr_assert(s != NULL, "agw_store_open: %s", err);
    return s;
}

static char *db_dir(void)
{
    static char p[128];

    snprintf(p, sizeof(p), "%s/store", dir);
    return p;
}

struct answer {
    struct event_base *base;
    bool called, null;
    int status;
    json_t *page;
    char agents[256];
};

static void on_answer(void *arg, const struct agw_store_page *page)
{
    struct answer *a = arg;

    a->called = true;
    a->null = page == NULL;
    if (page != NULL) {
        a->status = page->status;
        if (page->body != NULL)
            a->page = json_loadb(page->body, page->len, 0, NULL);
        if (page->agents != NULL)
            snprintf(a->agents, sizeof(a->agents), "%s", page->agents);
    }
    if (a->base != NULL)
        event_base_loopbreak(a->base);
}

/* Reads thread <id> with query <qs> through a fresh loop and mailbox. */
static struct answer read_thread(struct agw_store *s, const char *id, const char *qs)
{
    struct answer a = {0};
    struct agw_history_query q;
    struct event_base *base = event_base_new();
    struct agw_loop_mailbox *in = agw_loop_mailbox_new(base);
    struct timeval tv = {5, 0};

    cr_assert_eq(agw_history_query_parse(qs, &q, NULL, 0), 0);
    a.base = base;
    agw_store_read(s, id, &q, in, on_answer, &a);
    event_base_loopexit(base, &tv);
    event_base_dispatch(base);
    cr_assert(a.called, "no answer within 5 s");
    a.base = NULL;
    agw_loop_mailbox_free(in);
    event_base_free(base);
    return a;
}

static struct agw_store_stats stats_of(struct agw_store *s);

static void input(struct agw_store *s, const char *agent, const char *thread, const char *run,
                  const char *body)
{
    agw_store_run_input(s, agent, thread, run, body, strlen(body), NULL, 0);
}

static void events(struct agw_store *s, const char *thread, const char *run, const char *lines)
{
    agw_store_run_events(s, thread, run, strdup(lines), strlen(lines), false);
}

static const char RUN1_EVENTS[] =
    "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\",\"role\":\"assistant\"}\n"
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"Hel\"}\n"
    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"lo\"}\n"
    "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a1\"}\n";

static void write_run1(struct agw_store *s, const char *thread)
{
    input(s, "demo", thread, "r1",
          "{\"threadId\":\"t\",\"runId\":\"r1\",\"messages\":[{\"id\":\"u1\",\"role\":\"user\","
          "\"content\":\"Hi\"}]}");
    events(s, thread, "r1", RUN1_EVENTS);
}

static void expect_run1(const struct answer *a)
{
    json_t *m = json_object_get(a->page, "messages");

    cr_assert_eq(a->status, 200);
    cr_assert_eq(json_array_size(m), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(m, 0), "id")), "u1");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(m, 1), "content")), "Hello");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(m, 1), "role")), "assistant");
}

/* Threads t0 .. t<n - 1> each read back as write_run1() wrote them. */
static void expect_run1_in_threads(struct agw_store *s, int n)
{
    for (int i = 0; i < n; i++) {
        char t[16];
        struct answer a;
        snprintf(t, sizeof(t), "t%d", i);
        a = read_thread(s, t, NULL);
        expect_run1(&a);
        json_decref(a.page);
    }
}

/* The loop's reading of a body (agw_input_parse_keep()) is what the writer merges: it does not read
 * the body again. Given the reading of its first message alone, the thread has that one; given the
 * whole reading, both. */
Test(store, merges_the_loops_reading_of_a_body)
{
    static const char body[] =
        "{\"threadId\":\"t\",\"runId\":\"r1\",\"messages\":[{\"id\":\"u1\",\"role\":\"user\","
        "\"content\":\"Hi\"},{\"id\":\"u2\",\"role\":\"user\",\"content\":\"there\"}]}";
    struct agw_store *s = open_store(AGW_STORE_MEMORY, NULL, 100, 0, 100);
    struct agw_input in = {0};
    struct answer a;
    json_t *m;

    cr_assert_eq(agw_input_parse_keep(body, strlen(body), 0, &in, NULL, 0), 0);
    cr_assert(in.messages_read);
    cr_assert_eq(in.n_messages, 2);
    agw_store_run_input(s, "demo", "t1", "r1", body, strlen(body), in.messages, 1);
    a = read_thread(s, "t1", NULL);
    m = json_object_get(a.page, "messages");
    cr_assert_eq(json_array_size(m), 1, "the reading given, not the body's");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(m, 0), "id")), "u1");
    json_decref(a.page);
    agw_store_run_input(s, "demo", "t1", "r2", body, strlen(body), in.messages, in.n_messages);
    a = read_thread(s, "t1", NULL);
    m = json_object_get(a.page, "messages");
    cr_assert_eq(json_array_size(m), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(m, 1), "content")), "there");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(m, 1), "id")), "u2");
    json_decref(a.page);
    agw_input_clear(&in);
    agw_store_close(s);
}

Test(store, memory_records_are_read_back_in_order)
{
    struct agw_store *s = open_store(AGW_STORE_MEMORY, NULL, 100, 0, 100);
    struct answer a;

    write_run1(s, "t1");
    a = read_thread(s, "t1", NULL);
    expect_run1(&a);
    cr_assert_str_eq(a.agents, ",demo,");
    json_decref(a.page);
    a = read_thread(s, "nope", NULL);
    cr_assert_eq(a.status, 404);
    cr_assert_null(a.page);
    agw_store_close(s);
}

Test(store, events_handed_over_as_a_copy_are_applied_as_taken_ones)
{
    struct agw_store *s = open_store(AGW_STORE_MEMORY, NULL, 100, 0, 100);
    char lines[sizeof(RUN1_EVENTS)]; /* on the stack: the store must copy, never free it */
    struct answer a;

    input(s, "demo", "t1", "r1",
          "{\"threadId\":\"t\",\"runId\":\"r1\",\"messages\":[{\"id\":\"u1\",\"role\":\"user\","
          "\"content\":\"Hi\"}]}");
    memcpy(lines, RUN1_EVENTS, sizeof(RUN1_EVENTS));
    agw_store_run_events_copy(s, "t1", "r1", lines, sizeof(RUN1_EVENTS) - 1);
    memset(lines, 'x', sizeof(lines) - 1); /* the caller's bytes are its own again at once */
    a = read_thread(s, "t1", NULL);
    expect_run1(&a);
    json_decref(a.page);
    agw_store_close(s);
}

Test(store, capture_chunks_are_reused_once_applied)
{
    struct agw_store *s = open_store(AGW_STORE_MEMORY, NULL, 100, 0, 100);
    char *c1 = agw_store_chunk(s), *c2 = agw_store_chunk(s), *again;
    struct answer a;

    cr_assert_not_null(c1);
    cr_assert_neq(c1, c2, "two chunks at once are two blocks");
    input(s, "demo", "t1", "r1",
          "{\"threadId\":\"t\",\"runId\":\"r1\",\"messages\":[{\"id\":\"u1\",\"role\":\"user\","
          "\"content\":\"Hi\"}]}");
    memcpy(c1, RUN1_EVENTS, sizeof(RUN1_EVENTS) - 1);
    agw_store_run_events(s, "t1", "r1", c1, sizeof(RUN1_EVENTS) - 1, true);
    a = read_thread(s, "t1", NULL); /* after the read, the events were applied */
    expect_run1(&a);
    json_decref(a.page);
    again = agw_store_chunk(s);
    cr_assert_eq(again, c1, "the applied chunk is handed out again");
    free(again);
    free(c2);
    agw_store_close(s);
}

Test(store, congested_while_records_wait_and_until_a_quarter_is_left)
{
    struct agw_store_options o = options(AGW_STORE_MEMORY, NULL, 100, 0, 100);
    char err[512] = "";
    struct agw_store *s;
    struct agw_store_stats st;
    struct answer a;

    o.congested_bytes = 4096;
    s = agw_store_open(&o, err, sizeof(err));
    cr_assert_not_null(s, "%s", err);
    cr_assert_not(agw_store_congested(s));
    write_run1(s, "t1"); /* a few hundred bytes: under the threshold */
    cr_assert_not(agw_store_congested(s));
    {
        /* one record of 8 KiB: past the threshold as it is handed over */
        char *lines = malloc(9000);
        int k = snprintf(lines, 9000,
                         "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a2\"}\n"
                         "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a2\",\"delta\":\"");
        memset(lines + k, 'x', 8192);
        k += 8192;
        k += snprintf(lines + k, 9000 - (size_t)k, "\"}\n");
        agw_store_run_events(s, "t2", "r2", lines, (size_t)k, false);
    }
    cr_assert(agw_store_congested(s), "over 4 KiB handed over and not applied");
    a = read_thread(s, "t2", NULL); /* the writer applied everything before answering */
    json_decref(a.page);
    cr_assert_not(agw_store_congested(s), "all applied");
    agw_store_get_stats(s, &st);
    cr_assert_eq(st.congestions, 1);
    agw_store_close(s);
}

/* A record that would take the queue past max_queue_bytes (the disk far behind) is dropped, counted
 * and freed (the sanitized build checks the free), the records before and after it applied: a
 * loop never waits, and the queue never grows past its bound. */
Test(store, a_record_past_the_queue_bound_is_dropped_and_counted)
{
    struct agw_store_options o = options(AGW_STORE_MEMORY, NULL, 100, 0, 100);
    char err[512] = "", *lines = malloc(9000);
    struct agw_store *s;
    struct answer a;
    int k;

    o.max_queue_bytes = 4096;
    s = agw_store_open(&o, err, sizeof(err));
    cr_assert_not_null(s, "%s", err);
    write_run1(s, "t1");
    k = snprintf(lines, 9000,
                 "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a2\",\"role\":\"assistant\"}\n"
                 "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a2\",\"delta\":\"");
    memset(lines + k, 'x', 8192);
    k += 8192;
    k += snprintf(lines + k, 9000 - (size_t)k, "\"}\n");
    agw_store_run_events(s, "t1", "r2", lines, (size_t)k, false); /* 8 KiB: over the bound */
    events(s, "t1", "r3",
           "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a3\",\"role\":\"assistant\"}\n"
           "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a3\",\"delta\":\"after\"}\n");
    a = read_thread(s, "t1", NULL);
    cr_assert_eq(a.status, 200);
    {
        json_t *m = json_object_get(a.page, "messages");
        cr_assert_eq(json_array_size(m), 3, "u1, a1, a3: a2 dropped");
        cr_assert_str_eq(json_string_value(json_object_get(json_array_get(m, 2), "id")), "a3");
        cr_assert_str_eq(json_string_value(json_object_get(json_array_get(m, 2), "content")),
                         "after");
    }
    json_decref(a.page);
    cr_assert_eq(stats_of(s).dropped, 1);
    cr_assert_eq(stats_of(s).queued_bytes, 0);
    agw_store_close(s);
}

/* Loops hand records over concurrently without a lock: four threads push 2,000 runs each, on
 * threads of their own, and every message is there afterwards, in each thread's order. */
struct pusher {
    struct agw_store *s;
    int k;
};

static void *push_runs(void *arg)
{
    struct pusher *p = arg;
    char thread[32], run[32], body[160];

    for (int i = 0; i < 2000; i++) {
        snprintf(thread, sizeof(thread), "p%d-t%d", p->k, i % 10);
        snprintf(run, sizeof(run), "r%d", i);
        snprintf(body, sizeof(body),
                 "{\"threadId\":\"%s\",\"runId\":\"%s\",\"messages\":[{\"id\":\"m%d\",\"role\":"
                 "\"user\",\"content\":\"%d\"}]}",
                 thread, run, i, i);
        agw_store_run_input(p->s, "demo", thread, run, body, strlen(body), NULL, 0);
    }
    return NULL;
}

Test(store, records_from_many_threads_at_once_all_arrive)
{
    struct agw_store_options o = options(AGW_STORE_MEMORY, NULL, 1000, 0, 1000);
    char err[512] = "";
    struct agw_store *s;
    pthread_t th[4];
    struct pusher ps[4];
    struct answer a;

    o.max_queue_bytes = 64u << 20; /* none dropped */
    s = agw_store_open(&o, err, sizeof(err));
    cr_assert_not_null(s, "%s", err);

    for (int k = 0; k < 4; k++) {
        ps[k] = (struct pusher){s, k};
        cr_assert_eq(pthread_create(&th[k], NULL, push_runs, &ps[k]), 0);
    }
    for (int k = 0; k < 4; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < 4; k++) {
        for (int t = 0; t < 10; t++) {
            char id[32];
            json_t *m;
            snprintf(id, sizeof(id), "p%d-t%d", k, t);
            a = read_thread(s, id, "limit=200");
            cr_assert_eq(a.status, 200, "%s", id);
            m = json_object_get(a.page, "messages");
            cr_assert_eq(json_array_size(m), 200, "%s: every run's message", id);
            for (size_t i = 0; i < 200; i++) {
                char want[16];
                snprintf(want, sizeof(want), "m%zu", (size_t)t + 10 * i);
                cr_assert_str_eq(json_string_value(json_object_get(json_array_get(m, i), "id")),
                                 want, "%s: in order", id);
            }
            json_decref(a.page);
        }
    }
    agw_store_close(s);
}

Test(store, embedded_survives_a_restart)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    struct answer a;
    struct stat st;
    char p[256];

    write_run1(s, "t1");
    input(s, "other", "t1", "r2",
          "{\"threadId\":\"t1\",\"runId\":\"r2\",\"messages\":[{\"id\":\"u1\",\"role\":\"user\","
          "\"content\":\"Hi\"},{\"id\":\"u2\",\"role\":\"user\",\"content\":\"More\"}]}");
    agw_store_close(s);
    snprintf(p, sizeof(p), "%s/history.db", db_dir());
    cr_assert_eq(stat(p, &st), 0, "the database file is there");

    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    a = read_thread(s, "t1", "order=desc&limit=1");
    cr_assert_eq(a.status, 200);
    cr_assert_str_eq(json_string_value(json_object_get(
                         json_array_get(json_object_get(a.page, "messages"), 0), "id")),
                     "u2");
    cr_assert_str_eq(a.agents, ",demo,other,");
    json_decref(a.page);
    a = read_thread(s, "t1", "limit=2");
    expect_run1(&a); /* u1 and a1 first, then u2 */
    cr_assert(json_is_true(json_object_get(a.page, "has_more")));
    json_decref(a.page);
    agw_store_close(s);
}

/* Pages a commit appended are on disk when it returns: the store lets the kernel drop them from the
 * page cache (written once, read back rarely), so that the next commit's pages are those, not fresh
 * ones, and so are the B-trees' last leaves the next commit rewrote in place. Here 40 answers of
 * 100 KB (each a row in a leaf and an overflow page): with the pages kept, the whole file would
 * still be resident; with them let go, only the pages at the file's start that every commit
 * rewrites (the header and the B-trees' roots: 6 pages of 64 KiB), however many commits there were
 * (a sanitized build commits more often). The directory is made in the working directory (the build
 * tree), on a disk: a tmpfs /tmp would hold its pages whatever the advice. */
Test(store, embedded_leaves_what_it_committed_out_of_the_page_cache)
{
    static char text[100 * 1024 + 1], lines[128 * 1024];
    char here[] = "agw-store-shed.XXXXXX", path[256], cmd[300], id[32];
    struct agw_store *s;
    struct stat st;
    unsigned char *vec;
    size_t pages, resident = 0, page = (size_t)sysconf(_SC_PAGESIZE);
    void *map;
    int fd, rc;

    cr_assert(mkdtemp(here) != NULL);
    agw_store_texts_tune(SIZE_MAX / 2, 0, false, false); /* the answers in the database's pages */
    s = open_store(AGW_STORE_EMBEDDED, here, 100, 0, 100);
    memset(text, 'w', sizeof(text) - 1);
    for (int i = 0; i < 40; i++) {
        struct answer a;

        snprintf(id, sizeof(id), "t%d", i);
        input(s, "demo", id, "r1",
              "{\"threadId\":\"t\",\"runId\":\"r1\",\"messages\":[{\"id\":\"u1\","
              "\"role\":\"user\",\"content\":\"Hi\"}]}");
        snprintf(lines, sizeof(lines),
                 "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a%d\",\"role\":\"assistant\"}\n"
                 "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a%d\",\"delta\":\"%s\"}\n"
                 "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a%d\"}\n",
                 i, i, text, i);
        events(s, id, "r1", lines);
        a = read_thread(s, id, NULL); /* applied (the queue holds 1 MiB at most) */
        cr_assert_eq(a.status, 200);
        json_decref(a.page);
    }
    agw_store_close(s); /* the last commit */

    snprintf(path, sizeof(path), "%s/history.db", here);
    fd = open(path, O_RDONLY);
    cr_assert(fd >= 0);
    cr_assert_eq(fstat(fd, &st), 0);
    cr_assert_gt(st.st_size, 40 * 100 * 1024, "every answer is in the file");
    map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    cr_assert(map != MAP_FAILED);
    pages = ((size_t)st.st_size + page - 1) / page;
    vec = malloc(pages);
    cr_assert_not_null(vec);
    rc = mincore(map, (size_t)st.st_size, vec);
    for (size_t i = 0; rc == 0 && i < pages; i++)
        resident += vec[i] & 1;
    free(vec);
    munmap(map, (size_t)st.st_size);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", here);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(rc, 0, "mincore: %s", strerror(errno));
    /* the 6 pages at the start, and 2 more of slack */
    cr_assert_leq(resident, 8 * 65536 / page,
                  "%zu of the file's %zu pages are still in the page cache", resident, pages);
}

/* SQLite's allocation statistics take a process-wide mutex around each of its malloc()s: nothing
 * reads them, the embedded kind turns them off before SQLite's first use (with them on, the
 * database open here holds about 1.4 MB by their count). */
Test(store, embedded_keeps_no_sqlite_allocation_statistics)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    struct answer a;

    write_run1(s, "t1");
    a = read_thread(s, "t1", "limit=2"); /* the writer has applied and committed the run */
    expect_run1(&a);
    json_decref(a.page);
    cr_assert_eq(sqlite3_memory_used(), 0, "SQLite counts its allocations: %lld bytes",
                 (long long)sqlite3_memory_used());
    cr_assert_eq(sqlite3_memory_highwater(0), 0);
    agw_store_close(s);
}

Test(store, embedded_cache_smaller_than_the_threads_reloads_from_disk)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 2);
    struct agw_store_stats st;

    for (int i = 0; i < 20; i++) {
        char t[16];
        snprintf(t, sizeof(t), "t%d", i);
        write_run1(s, t);
    }
    nanosleep(&(struct timespec){0, 300 * 1000 * 1000}, NULL); /* committed, then evicted */
    agw_store_get_stats(s, &st);
    cr_assert_leq(st.cached, 2, "cached %zu", st.cached);
    cr_assert_gt(st.commits, 0);
    expect_run1_in_threads(s, 20);
    agw_store_close(s);
}

Test(store, memory_kind_forgets_the_least_recently_used_past_its_cache)
{
    struct agw_store *s = open_store(AGW_STORE_MEMORY, NULL, 100, 0, 2);
    struct answer a;

    write_run1(s, "t1");
    a = read_thread(s, "t1", NULL); /* applied */
    json_decref(a.page);
    write_run1(s, "t2");
    write_run1(s, "t3");
    a = read_thread(s, "t3", NULL);
    expect_run1(&a);
    json_decref(a.page);
    a = read_thread(s, "t1", NULL);
    cr_assert_eq(a.status, 404);
    agw_store_close(s);
}

Test(store, max_messages_keeps_the_newest)
{
    struct agw_store *s = open_store(AGW_STORE_MEMORY, NULL, 3, 0, 10);
    struct answer a;
    json_t *m;

    write_run1(s, "t1");
    input(s, "demo", "t1", "r2",
          "{\"messages\":[{\"id\":\"u2\",\"role\":\"user\",\"content\":\"a\"},"
          "{\"id\":\"u3\",\"role\":\"user\",\"content\":\"b\"}]}");
    a = read_thread(s, "t1", NULL);
    m = json_object_get(a.page, "messages");
    cr_assert_eq(json_array_size(m), 3);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(m, 0), "id")), "a1");
    json_decref(a.page);
    agw_store_close(s);
}

Test(store, ttl_deletes_idle_threads_at_start_and_on_read)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    struct answer a;
    struct agw_store_stats st;

    write_run1(s, "t1");
    agw_store_close(s);
    sleep(2);
    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 1, 100); /* ttl 1 s: t1 is past it */
    a = read_thread(s, "t1", NULL);
    cr_assert_eq(a.status, 404);
    agw_store_get_stats(s, &st);
    cr_assert_eq(st.expired, 1);
    agw_store_close(s);

    s = open_store(AGW_STORE_MEMORY, NULL, 100, 1, 100);
    write_run1(s, "t2");
    a = read_thread(s, "t2", NULL);
    cr_assert_eq(a.status, 200);
    json_decref(a.page);
    sleep(2);
    a = read_thread(s, "t2", NULL);
    cr_assert_eq(a.status, 404, "past the ttl");
    agw_store_close(s);
}

/* Makes permission bits bind this test's process even when it runs as root (as CI does): root
 * writes anywhere only by CAP_DAC_OVERRIDE (and reads and searches by CAP_DAC_READ_SEARCH), which
 * this process drops from its effective set; criterion runs each test in a process of its own. */
static void drop_dac_override(void)
{
    struct __user_cap_header_struct head = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct caps[_LINUX_CAPABILITY_U32S_3];

    cr_assert_eq(syscall(SYS_capget, &head, caps), 0, "capget: %s", strerror(errno));
    caps[CAP_TO_INDEX(CAP_DAC_OVERRIDE)].effective &= ~CAP_TO_MASK(CAP_DAC_OVERRIDE);
    caps[CAP_TO_INDEX(CAP_DAC_READ_SEARCH)].effective &= ~CAP_TO_MASK(CAP_DAC_READ_SEARCH);
    cr_assert_eq(syscall(SYS_capset, &head, caps), 0, "capset: %s", strerror(errno));
}

Test(store, a_read_only_directory_is_a_clear_error)
{
    struct agw_store_options o = options(AGW_STORE_EMBEDDED, db_dir(), 10, 0, 10);
    char err[512] = "";

    drop_dac_override();
    cr_assert_eq(mkdir(db_dir(), 0500), 0);
    cr_assert_null(agw_store_open(&o, err, sizeof(err)));
    cr_assert(strstr(err, db_dir()) != NULL, "names the path: %s", err);
    cr_assert(strstr(err, strerror(EACCES)) != NULL, "says why: %s", err);
}

Test(store, a_directory_that_cannot_be_made_is_a_clear_error)
{
    struct agw_store_options o = options(AGW_STORE_EMBEDDED, "/proc/agw-no/store", 10, 0, 10);
    char err[512] = "";

    cr_assert_null(agw_store_open(&o, err, sizeof(err)));
    cr_assert(strstr(err, "cannot create the directory /proc/agw-no") != NULL, "%s", err);
}

Test(store, a_file_that_is_not_a_database_is_a_clear_error)
{
    struct agw_store_options o = options(AGW_STORE_EMBEDDED, db_dir(), 10, 0, 10);
    char err[512] = "", p[256];
    FILE *f;

    cr_assert_eq(mkdir(db_dir(), 0700), 0);
    snprintf(p, sizeof(p), "%s/history.db", db_dir());
    f = fopen(p, "w");
    cr_assert(f != NULL);
    for (int i = 0; i < 200; i++)
        fputs("this is not an SQLite database, it is a text file. ", f);
    fclose(f);
    cr_assert_null(agw_store_open(&o, err, sizeof(err)));
    cr_assert(strstr(err, "not a database") != NULL, "%s", err);
}

Test(store, a_store_in_use_by_another_gateway_is_a_clear_error)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 10, 0, 10);
    struct agw_store_options o = options(AGW_STORE_EMBEDDED, db_dir(), 10, 0, 10);
    char err[512] = "";

    cr_assert_null(agw_store_open(&o, err, sizeof(err)));
    cr_assert(strstr(err, "in use by another gateway") != NULL, "%s", err);
    agw_store_close(s);
    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 10, 0, 10); /* free again once closed */
    agw_store_close(s);
}

Test(store, redis_is_refused_with_a_clear_error)
{
    struct agw_store_options o = {.kind = AGW_STORE_REDIS, .max_messages = 10};
    char err[512] = "";

    cr_assert_null(agw_store_open(&o, err, sizeof(err)));
    cr_assert(strstr(err, "redis") != NULL, "%s", err);
}

Test(store, malformed_records_are_counted_not_fatal)
{
    struct agw_store *s = open_store(AGW_STORE_MEMORY, NULL, 100, 0, 10);
    struct agw_store_stats st;
    struct answer a;

    input(s, "demo", "t1", "r1", "{not json");
    events(s, "t1", "r1", "{\"type\":\"TEXT_MESSAGE_START\"}\nnot json\n\n");
    write_run1(s, "t1");
    a = read_thread(s, "t1", NULL);
    expect_run1(&a);
    json_decref(a.page);
    agw_store_get_stats(s, &st);
    cr_assert_eq(st.malformed, 3, "%llu", (unsigned long long)st.malformed);
    agw_store_close(s);
}

static double cpu_seconds(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* The writer thread sleeps until a record, a commit or a sweep is due: it never spins (its waits
 * use the monotonic clock its deadlines are taken on). */
Test(store, an_idle_store_sleeps)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 10, 3600, 10);
    double before;

    write_run1(s, "t1"); /* a commit comes due */
    nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    before = cpu_seconds();
    nanosleep(&(struct timespec){0, 500 * 1000 * 1000}, NULL);
    cr_assert_lt(cpu_seconds() - before, 0.1, "%.3f s of CPU in 0.5 s idle",
                 cpu_seconds() - before);
    agw_store_close(s);
}

Test(store, a_mailbox_freed_first_gives_null)
{
    struct agw_store *s = open_store(AGW_STORE_MEMORY, NULL, 100, 0, 10);
    struct event_base *base = event_base_new();
    struct agw_loop_mailbox *in = agw_loop_mailbox_new(base);
    struct agw_history_query q;
    struct answer a = {0};

    write_run1(s, "t1");
    cr_assert_eq(agw_history_query_parse(NULL, &q, NULL, 0), 0);
    agw_store_read(s, "t1", &q, in, on_answer, &a);
    agw_store_close(s); /* answers the read into the mailbox, which no loop runs */
    cr_assert_not(a.called);
    agw_loop_mailbox_free(in);
    cr_assert(a.called && a.null);
    event_base_free(base);
}

/* ---- schema 3: a row per message ---------------------------------------------------------- */

static sqlite3 *db_file(void)
{
    char p[256];
    sqlite3 *db = NULL;

    snprintf(p, sizeof(p), "%s/history.db", db_dir());
    cr_assert_eq(sqlite3_open(p, &db), SQLITE_OK);
    return db;
}

static void exec_sql(sqlite3 *db, const char *sql);

static uint32_t le_at(const unsigned char *p, int bytes)
{
    uint32_t v = 0;

    for (int i = 0; i < bytes; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

/* db_file() with, for this connection only, the table thread_messages: the thread's id in place of
 * its number, a row per message piece; the messages of a row several share (part -1: for each, 4
 * bytes of data length, a flags byte, 2 bytes of run id length, the run id, the data) as rows of
 * their own, <shared> 1, as the store reads them (decoded here apart from src/store_sqlite.c): a
 * message's own row first, of two shared rows that hold a position the later one, only the
 * thread's positions [dropped, dropped + n_messages). */
static sqlite3 *db_rows(void)
{
    sqlite3 *db = db_file();
    sqlite3_stmt *rd, *ins, *own, *del;

    exec_sql(db, "CREATE TEMP TABLE thread_messages (thread TEXT, pos INTEGER, part INTEGER,"
                 " run_id TEXT, text INTEGER, data TEXT, shared INTEGER);"
                 "INSERT INTO thread_messages SELECT t.id, m.pos, m.part, m.run_id, m.text, m.data,"
                 " 0 FROM messages m JOIN threads t ON t.key = m.thread WHERE m.part >= 0");
    cr_assert_eq(sqlite3_prepare_v2(db,
                                    "SELECT t.id, t.dropped, t.n_messages, m.pos, m.data, m.n"
                                    " FROM messages m JOIN threads t ON t.key = m.thread"
                                    " WHERE m.part = -1 ORDER BY t.id, m.pos",
                                    -1, &rd, NULL),
                 SQLITE_OK);
    cr_assert_eq(sqlite3_prepare_v2(db,
                                    "INSERT INTO thread_messages VALUES (?1, ?2, 0, ?3, ?4, ?5, 1)",
                                    -1, &ins, NULL),
                 SQLITE_OK);
    cr_assert_eq(sqlite3_prepare_v2(db,
                                    "SELECT count(*) FROM thread_messages WHERE thread = ?1 AND"
                                    " pos = ?2 AND part = 0 AND shared = 0",
                                    -1, &own, NULL),
                 SQLITE_OK);
    cr_assert_eq(sqlite3_prepare_v2(db,
                                    "DELETE FROM thread_messages WHERE thread = ?1 AND pos = ?2 AND"
                                    " shared = 1",
                                    -1, &del, NULL),
                 SQLITE_OK);
    while (sqlite3_step(rd) == SQLITE_ROW) {
        const char *id = (const char *)sqlite3_column_text(rd, 0);
        int64_t first = sqlite3_column_int64(rd, 1), end = first + sqlite3_column_int64(rd, 2);
        int64_t pos = sqlite3_column_int64(rd, 3), n = sqlite3_column_int64(rd, 5);
        const unsigned char *b = sqlite3_column_blob(rd, 4);
        size_t len = (size_t)sqlite3_column_bytes(rd, 4), at = 0;

        for (int64_t p = pos; p < pos + n; p++) {
            uint32_t dl, rl;
            int mine;
            cr_assert_geq(len - at, 7, "a shared row of %s at %" PRId64 " is cut", id, pos);
            dl = le_at(b + at, 4);
            rl = le_at(b + at + 5, 2);
            cr_assert_geq(len - at - 7, (size_t)rl + dl);
            if (p >= first && p < end) {
                sqlite3_bind_text(own, 1, id, -1, SQLITE_STATIC);
                sqlite3_bind_int64(own, 2, p);
                cr_assert_eq(sqlite3_step(own), SQLITE_ROW);
                mine = sqlite3_column_int(own, 0);
                sqlite3_reset(own);
                sqlite3_bind_text(del, 1, id, -1, SQLITE_STATIC);
                sqlite3_bind_int64(del, 2, p);
                cr_assert_eq(sqlite3_step(del), SQLITE_DONE);
                sqlite3_reset(del);
                if (mine == 0) {
                    sqlite3_bind_text(ins, 1, id, -1, SQLITE_STATIC);
                    sqlite3_bind_int64(ins, 2, p);
                    if (b[at + 4] & 2)
                        sqlite3_bind_text(ins, 3, (const char *)b + at + 7, (int)rl, SQLITE_STATIC);
                    else
                        sqlite3_bind_null(ins, 3);
                    sqlite3_bind_int(ins, 4, (b[at + 4] & 1) != 0);
                    sqlite3_bind_text(ins, 5, (const char *)b + at + 7 + rl, (int)dl,
                                      SQLITE_STATIC);
                    cr_assert_eq(sqlite3_step(ins), SQLITE_DONE);
                    sqlite3_reset(ins);
                }
            }
            at += 7 + rl + dl;
        }
        cr_assert_eq(at, len, "a shared row of %s at %" PRId64 " is longer than its messages", id,
                     pos);
    }
    sqlite3_finalize(rd);
    sqlite3_finalize(ins);
    sqlite3_finalize(own);
    sqlite3_finalize(del);
    return db;
}

/* The first column of the first row of <sql> as an integer (-1: no row). */
static long long q1(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st;
    long long v = -1;

    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql,
                 sqlite3_errmsg(db));
    if (sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

static void exec_sql(sqlite3 *db, const char *sql)
{
    char *msg = NULL;

    cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, &msg), SQLITE_OK, "%s: %s", sql,
                 msg != NULL ? msg : "");
}

/* The ids of thread <id>'s messages, space-separated, as the store answers them. */
static char *ids_of(struct agw_store *s, const char *id, char *out, size_t len)
{
    struct answer a = read_thread(s, id, "limit=200");
    json_t *m;
    size_t i, n = 0;

    out[0] = '\0';
    if (a.status != 200) {
        snprintf(out, len, "%d", a.status);
        return out;
    }
    json_array_foreach(json_object_get(a.page, "messages"), i, m)
    {
        n += (size_t)snprintf(out + n, len - n, "%s%s", n > 0 ? " " : "",
                              json_string_value(json_object_get(m, "id")));
    }
    json_decref(a.page);
    return out;
}

/* Opens the embedded store of db_dir() again and checks thread <id>'s message ids. */
static void assert_ids_after_restart(const char *id, const char *want)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    char ids[256];

    cr_assert_str_eq(ids_of(s, id, ids, sizeof(ids)), want);
    agw_store_close(s);
}

/* Waits past the store's commit interval (20 ms in these tests). */
static void committed(void)
{
    nanosleep(&(struct timespec){0, 150 * 1000 * 1000}, NULL);
}

/* A message at its position: its run, its text without the closing, one piece (the two messages
 * of one commit, new to the database, share a row). */
Test(store, embedded_writes_each_message_at_its_position)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    sqlite3 *db;
    sqlite3_stmt *st;
    json_t *m;

    write_run1(s, "t1");
    agw_store_close(s);
    db = db_rows();
    cr_assert_eq(q1(db, "PRAGMA user_version"), 5);
    cr_assert_eq(q1(db, "SELECT count(*) FROM thread_messages WHERE thread = 't1'"), 2);
    cr_assert_eq(q1(db, "SELECT count(*) FROM messages"), 1, "one row the two share");
    cr_assert_eq(q1(db, "SELECT n_messages FROM threads WHERE id = 't1'"), 2);
    cr_assert_eq(q1(db, "SELECT dropped FROM threads WHERE id = 't1'"), 0);
    cr_assert_eq(sqlite3_prepare_v2(db,
                                    "SELECT run_id, data || '\"}', text, part FROM thread_messages"
                                    " WHERE thread = 't1' AND pos = 1",
                                    -1, &st, NULL),
                 SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "r1");
    cr_assert_eq(sqlite3_column_int(st, 2), 1, "a text, without its closing");
    cr_assert_eq(sqlite3_column_int(st, 3), 0, "one piece");
    m = json_loads((const char *)sqlite3_column_text(st, 1), 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(m, "id")), "a1");
    cr_assert_str_eq(json_string_value(json_object_get(m, "content")), "Hello");
    json_decref(m);
    sqlite3_finalize(st);
    sqlite3_close(db);
}

/* Messages new to the database that one commit writes side by side share a row; read back (after
 * a restart) as they were written. A thread that shrank keeps the shared row that begins before
 * its end (its positions past the end are not read), and the messages written where those were
 * are read from the newer row; a message edited later is read from its own row. */
Test(store, messages_new_in_a_commit_share_a_row_and_read_back_as_written)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    char ids[256];
    struct answer a;
    sqlite3 *db;

    input(s, "demo", "t1", "r1",
          "{\"messages\":[{\"id\":\"m1\",\"role\":\"user\",\"content\":\"1\"},"
          "{\"id\":\"m2\",\"role\":\"user\",\"content\":\"2\"},"
          "{\"id\":\"m3\",\"role\":\"user\",\"content\":\"3\"},"
          "{\"id\":\"m4\",\"role\":\"user\",\"content\":\"4\"}]}");
    committed();
    events(s, "t1", "r2",
           "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[{\"id\":\"m1\",\"role\":\"user\","
           "\"content\":\"1\"},{\"id\":\"m2\",\"role\":\"user\",\"content\":\"2\"}]}\n");
    committed();
    input(s, "demo", "t1", "r3",
          "{\"messages\":[{\"id\":\"m1\",\"role\":\"user\",\"content\":\"1\"},"
          "{\"id\":\"m2\",\"role\":\"user\",\"content\":\"2\"},"
          "{\"id\":\"n3\",\"role\":\"user\",\"content\":\"x\"},"
          "{\"id\":\"n4\",\"role\":\"user\",\"content\":\"y\"}]}");
    cr_assert_str_eq(ids_of(s, "t1", ids, sizeof(ids)), "m1 m2 n3 n4");
    agw_store_close(s);

    db = db_rows();
    cr_assert_eq(q1(db, "SELECT count(*) FROM messages WHERE part = -1 AND pos = 0 AND n = 4"), 1,
                 "the first commit's four messages in one row, kept: it begins before the end");
    cr_assert_eq(q1(db, "SELECT count(*) FROM messages WHERE part = -1 AND pos = 2 AND n = 2"), 1);
    cr_assert_eq(q1(db, "SELECT count(*) FROM messages WHERE part >= 0"), 0, "no row of its own");
    cr_assert_eq(q1(db, "SELECT count(*) FROM thread_messages WHERE thread = 't1' AND pos = 2 AND"
                        " data LIKE '%\"content\":\"x%' AND run_id = 'r3'"),
                 1);
    sqlite3_close(db);
    assert_ids_after_restart("t1", "m1 m2 n3 n4");

    /* edited: its own row, read before the shared one */
    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    input(s, "demo", "t1", "r4",
          "{\"messages\":[{\"id\":\"n3\",\"role\":\"user\",\"content\":\"z\"}]}");
    agw_store_close(s);
    db = db_rows();
    cr_assert_eq(q1(db, "SELECT count(*) FROM messages WHERE part = 0 AND pos = 2"), 1);
    sqlite3_close(db);
    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    a = read_thread(s, "t1", NULL);
    cr_assert_eq(a.status, 200);
    cr_assert_str_eq(json_string_value(json_object_get(
                         json_array_get(json_object_get(a.page, "messages"), 2), "content")),
                     "z");
    cr_assert_str_eq(json_string_value(json_object_get(
                         json_array_get(json_object_get(a.page, "messages"), 3), "content")),
                     "y");
    json_decref(a.page);
    agw_store_close(s);
}

/* A text streamed over several records, committed in between: each commit adds what it grew by as
 * a piece of its own; read back (after a restart) whole, and still a text that grows by pieces. A
 * piece missing makes the thread unreadable. */
Test(store, a_text_growing_across_commits_is_written_by_pieces)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    static const char abe5[] = "ab\xc3\xa9"
                               "ab\xc3\xa9"
                               "ab\xc3\xa9"
                               "ab\xc3\xa9"
                               "ab\xc3\xa9";
    static const char growth[] =
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a2\",\"delta\":\"ab\\u00e9\"}\n";
    struct agw_store_stats st;
    struct answer a;
    sqlite3 *db;
    json_t *m;

    write_run1(s, "t1");
    events(s, "t1", "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a2\"}\n");
    for (int i = 0; i < 5; i++) {
        committed();
        events(s, "t1", "r1", growth);
    }
    agw_store_get_stats(s, &st);
    cr_assert_geq(st.commits, 5);
    agw_store_close(s);
    db = db_rows();
    cr_assert_eq(q1(db, "SELECT count(*) FROM thread_messages WHERE thread = 't1' AND pos = 2"), 6,
                 "the start, then a piece per commit");
    cr_assert_eq(q1(db,
                    "SELECT length(data) FROM thread_messages WHERE thread = 't1' AND pos = 2 AND "
                    "part = 3"),
                 8, "a piece is what the text grew by, escaped as it came");
    sqlite3_close(db);

    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    a = read_thread(s, "t1", "order=desc&limit=1");
    m = json_array_get(json_object_get(a.page, "messages"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(m, "id")), "a2");
    cr_assert_str_eq(json_string_value(json_object_get(m, "content")), abe5);
    cr_assert_str_eq(json_string_value(json_object_get(m, "role")), "assistant");
    json_decref(a.page);
    events(s, "t1", "r1", growth); /* read back, it goes on growing by pieces */
    agw_store_close(s);
    db = db_rows();
    cr_assert_eq(q1(db, "SELECT max(part) FROM thread_messages WHERE thread = 't1' AND pos = 2"),
                 6);
    exec_sql(db, "DELETE FROM messages WHERE thread = (SELECT key FROM threads WHERE id = 't1')"
                 " AND pos = 2 AND part = 4");
    sqlite3_close(db);
    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    a = read_thread(s, "t1", NULL);
    cr_assert_eq(a.status, 404, "a piece missing: unreadable");
    agw_store_get_stats(s, &st);
    cr_assert_eq(st.malformed, 1);
    agw_store_close(s);
}

/* A thread that streams keeps its number and its row from one commit to the next: each commit
 * writes its answer's new piece alone (no look-up of the thread by id, its row written again only
 * when its second of last change moved), and the answer reads back whole after a restart. */
Test(store, a_streaming_thread_is_written_without_its_row)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    static const char growth[] =
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a2\",\"delta\":\"ab\"}\n";
    uint64_t l0, w0, l1, w1;
    struct answer a;
    json_t *m;

    write_run1(s, "t1");
    events(s, "t1", "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a2\"}\n");
    committed();
    agw_store_sqlite_counts(&l0, &w0);
    cr_assert_geq(w0, 1, "the thread's row was written");
    for (int i = 0; i < 5; i++) {
        events(s, "t1", "r1", growth);
        committed();
    }
    agw_store_sqlite_counts(&l1, &w1);
    cr_assert_eq(l1, l0, "no look-up of a thread whose number is known");
    cr_assert_leq(w1 - w0, 2, "5 commits wrote the row %" PRIu64 " times", w1 - w0);
    agw_store_close(s);
    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    a = read_thread(s, "t1", "order=desc&limit=1");
    m = json_array_get(json_object_get(a.page, "messages"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(m, "content")), "ababababab");
    json_decref(a.page);
    write_run1(s, "t1"); /* read back: looked up once, then known again */
    committed();
    agw_store_sqlite_counts(&l0, &w0);
    events(s, "t1", "r1", growth);
    committed();
    agw_store_sqlite_counts(&l1, &w1);
    cr_assert_eq(l1, l0);
    agw_store_close(s);
}

/* A tool result goes after its owner, before messages already written: the rows from there on are
 * written again at their new positions. */
Test(store, an_insertion_mid_thread_survives_a_restart)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    char ids[256];
    sqlite3 *db;

    write_run1(s, "t1");
    events(s, "t1", "r1",
           "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
           "\"parentMessageId\":\"a1\"}\n"
           "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"{}\"}\n"
           "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a2\"}\n"
           "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a2\",\"delta\":\"later\"}\n");
    committed();
    events(s, "t1", "r1",
           "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"tr1\",\"toolCallId\":\"c1\","
           "\"content\":\"42\"}\n");
    cr_assert_str_eq(ids_of(s, "t1", ids, sizeof(ids)), "u1 a1 tr1 a2");
    agw_store_close(s);

    db = db_rows();
    cr_assert_eq(q1(db, "SELECT count(*) FROM thread_messages WHERE thread = 't1'"), 4);
    cr_assert_eq(q1(db, "SELECT max(pos) FROM thread_messages WHERE thread = 't1'"), 3);
    cr_assert_eq(q1(db,
                    "SELECT count(*) FROM thread_messages WHERE thread = 't1' AND pos = 3 AND data "
                    "LIKE '%later%'"),
                 1);
    sqlite3_close(db);
    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    cr_assert_str_eq(ids_of(s, "t1", ids, sizeof(ids)), "u1 a1 tr1 a2");
    {
        struct answer a = read_thread(s, "t1", "limit=2");
        json_t *tc = json_array_get(
            json_object_get(json_array_get(json_object_get(a.page, "messages"), 1), "toolCalls"),
            0);
        cr_assert_str_eq(
            json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")), "{}");
        json_decref(a.page);
    }
    agw_store_close(s);
}

/* A snapshot that keeps fewer messages than were written: the rows past the thread's end go. */
Test(store, a_snapshot_that_shrinks_a_thread_survives_a_restart)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    char ids[256];
    sqlite3 *db;

    write_run1(s, "t1");
    events(s, "t1", "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a2\"}\n");
    committed();
    events(s, "t1", "r2",
           "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[{\"id\":\"a2\",\"role\":\"assistant\","
           "\"content\":\"kept\"}]}\n");
    cr_assert_str_eq(ids_of(s, "t1", ids, sizeof(ids)), "a2");
    agw_store_close(s);
    db = db_rows();
    cr_assert_eq(q1(db, "SELECT count(*) FROM thread_messages WHERE thread = 't1'"), 1);
    cr_assert_eq(q1(db, "SELECT pos FROM thread_messages WHERE thread = 't1'"), 0);
    sqlite3_close(db);
    assert_ids_after_restart("t1", "a2");
}

/* The cap: the oldest rows go with the messages; a smaller cap at the next start reads only the
 * newest, and the next commit deletes the others. */
Test(store, the_cap_keeps_the_newest_rows_across_restarts)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 3, 0, 100);
    char ids[256];
    sqlite3 *db;

    input(s, "demo", "t1", "r1",
          "{\"messages\":[{\"id\":\"m1\",\"role\":\"user\",\"content\":\"1\"},"
          "{\"id\":\"m2\",\"role\":\"user\",\"content\":\"2\"}]}");
    committed();
    input(s, "demo", "t1", "r2",
          "{\"messages\":[{\"id\":\"m3\",\"role\":\"user\",\"content\":\"3\"},"
          "{\"id\":\"m4\",\"role\":\"user\",\"content\":\"4\"},"
          "{\"id\":\"m5\",\"role\":\"user\",\"content\":\"5\"}]}");
    cr_assert_str_eq(ids_of(s, "t1", ids, sizeof(ids)), "m3 m4 m5");
    agw_store_close(s);
    db = db_rows();
    cr_assert_eq(q1(db, "SELECT count(*) FROM thread_messages WHERE thread = 't1'"), 3);
    cr_assert_eq(q1(db, "SELECT min(pos) FROM thread_messages WHERE thread = 't1'"), 2);
    cr_assert_eq(q1(db, "SELECT dropped FROM threads WHERE id = 't1'"), 2);
    sqlite3_close(db);

    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 2, 0, 100);
    cr_assert_str_eq(ids_of(s, "t1", ids, sizeof(ids)), "m4 m5");
    input(s, "demo", "t1", "r3", "{\"messages\":[{\"id\":\"m6\",\"role\":\"user\"}]}");
    cr_assert_str_eq(ids_of(s, "t1", ids, sizeof(ids)), "m5 m6");
    agw_store_close(s);
    db = db_rows();
    cr_assert_eq(q1(db, "SELECT count(*) FROM thread_messages WHERE thread = 't1'"), 2);
    cr_assert_eq(q1(db, "SELECT min(pos) FROM thread_messages WHERE thread = 't1'"), 4);
    sqlite3_close(db);
    assert_ids_after_restart("t1", "m5 m6");
}

Test(store, the_ttl_deletes_a_threads_messages_with_it)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    sqlite3 *db;

    write_run1(s, "t1");
    write_run1(s, "t2");
    agw_store_close(s);
    db = db_rows();
    exec_sql(db, "UPDATE threads SET updated = 1 WHERE id = 't1'");
    sqlite3_close(db);
    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 3600, 100);
    agw_store_close(s); /* the sweep runs at start */
    db = db_rows();
    cr_assert_eq(q1(db, "SELECT count(*) FROM threads"), 1);
    cr_assert_eq(q1(db, "SELECT count(*) FROM thread_messages WHERE thread = 't1'"), 0);
    cr_assert_eq(q1(db, "SELECT count(*) FROM thread_messages WHERE thread = 't2'"), 2);
    sqlite3_close(db);
}

Test(store, a_stored_message_that_cannot_be_read_is_a_404_counted)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    struct agw_store_stats st;
    struct answer a;
    sqlite3 *db;

    write_run1(s, "t1");
    write_run1(s, "t2");
    agw_store_close(s);
    db = db_rows();
    /* the row that holds message 1: its own, or the one it shares */
    exec_sql(db, "UPDATE messages SET data = '{not json'"
                 " WHERE thread = (SELECT key FROM threads WHERE id = 't1') AND pos <= 1"
                 " AND (pos = 1 OR part = -1)");
    sqlite3_close(db);
    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    a = read_thread(s, "t1", NULL);
    cr_assert_eq(a.status, 404);
    a = read_thread(s, "t2", NULL);
    expect_run1(&a);
    json_decref(a.page);
    agw_store_get_stats(s, &st);
    cr_assert_eq(st.malformed, 1);
    agw_store_close(s);
}

/* A long answer is forgotten once saved (shed) and read back for a page; when it cannot be (its
 * rows gone under the store), the page is a 500, the thread is dropped from the cache, counted,
 * and read again from the database at the next request. */
Test(store, a_shed_answer_is_read_back_and_a_lost_one_is_a_500)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    struct agw_store_stats st;
    struct answer a;
    char *lines = malloc(5000);
    json_t *m;
    sqlite3 *db;
    int k;

    k = snprintf(lines, 5000,
                 "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}\n"
                 "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"");
    memset(lines + k, 'z', 4000);
    k += 4000;
    k += snprintf(lines + k, 5000 - (size_t)k,
                  "\"}\n{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a1\"}\n");
    agw_store_run_events(s, "t1", "r1", lines, (size_t)k, false);
    a = read_thread(s, "t1", NULL);
    json_decref(a.page);
    usleep(300 * 1000); /* committed (every 20 ms here), then shed */
    a = read_thread(s, "t1", NULL);
    cr_assert_eq(a.status, 200);
    m = json_array_get(json_object_get(a.page, "messages"), 0);
    cr_assert_eq(json_string_length(json_object_get(m, "content")), 4000, "read back whole");
    json_decref(a.page);
    db = db_rows();
    exec_sql(db, "DELETE FROM messages WHERE thread = (SELECT key FROM threads WHERE id = 't1')");
    sqlite3_close(db);
    a = read_thread(s, "t1", NULL);
    cr_assert_eq(a.status, 500, "the shed answer cannot be read back");
    agw_store_get_stats(s, &st);
    cr_assert_eq(st.malformed, 1);
    a = read_thread(s, "t1", NULL); /* read again from the database: a thread row, no message */
    cr_assert_eq(a.status, 200);
    cr_assert_eq(json_array_size(json_object_get(a.page, "messages")), 0);
    json_decref(a.page);
    agw_store_close(s);
}

/* A store written by schema version 1 (one row per thread, the thread as one JSON text) is
 * migrated at start: every thread readable as before, positions from its dropped count; a thread
 * whose data could not be read is left out. */
Test(store, a_version_1_store_is_migrated)
{
    struct agw_store *s;
    struct answer a;
    char ids[256];
    sqlite3 *db;

    cr_assert_eq(mkdir(db_dir(), 0700), 0);
    db = db_file();
    exec_sql(db, "PRAGMA journal_mode=WAL;"
                 "CREATE TABLE threads (id TEXT PRIMARY KEY, agents TEXT NOT NULL,"
                 " updated INTEGER NOT NULL, data TEXT NOT NULL);"
                 "CREATE INDEX threads_updated ON threads(updated);"
                 "PRAGMA user_version=1;");
    exec_sql(db,
             "INSERT INTO threads VALUES ('t1', ',demo,other,', strftime('%s','now'),"
             " '{\"v\":1,\"dropped\":2,\"messages\":["
             "{\"run_id\":\"r1\",\"message\":{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi\"}},"
             "{\"run_id\":null,\"message\":{\"id\":\"a1\",\"role\":\"assistant\","
             "\"content\":\"Hello\",\"toolCalls\":[{\"id\":\"c1\",\"type\":\"function\","
             "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}}]}');"
             "INSERT INTO threads VALUES ('t2', ',demo,', strftime('%s','now'), 'not json');"
             "INSERT INTO threads VALUES ('t3', ',demo,', strftime('%s','now'),"
             " '{\"v\":1,\"dropped\":0,\"messages\":[]}');");
    sqlite3_close(db);

    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    a = read_thread(s, "t1", NULL);
    cr_assert_eq(a.status, 200);
    cr_assert_str_eq(a.agents, ",demo,other,");
    {
        json_t *a1 = json_array_get(json_object_get(a.page, "messages"), 1);
        json_t *tc = json_array_get(json_object_get(a1, "toolCalls"), 0);
        cr_assert_str_eq(
            json_string_value(json_object_get(json_object_get(tc, "function"), "name")), "f");
    }
    json_decref(a.page);
    cr_assert_str_eq(ids_of(s, "t1", ids, sizeof(ids)), "u1 a1");
    cr_assert_str_eq(ids_of(s, "t2", ids, sizeof(ids)), "404");
    cr_assert_str_eq(ids_of(s, "t3", ids, sizeof(ids)), "");
    a = read_thread(s, "t1", "run_id=r1");
    cr_assert_eq(json_array_size(json_object_get(a.page, "messages")), 1);
    json_decref(a.page);
    input(s, "demo", "t1", "r2", "{\"messages\":[{\"id\":\"u2\",\"role\":\"user\"}]}");
    agw_store_close(s);

    db = db_rows();
    cr_assert_eq(q1(db, "PRAGMA user_version"), 5);
    cr_assert_eq(q1(db, "SELECT count(*) FROM sqlite_master WHERE name = 'threads_v1'"), 0);
    cr_assert_eq(q1(db, "SELECT count(*) FROM threads"), 2);
    cr_assert_eq(q1(db, "SELECT min(pos) FROM thread_messages WHERE thread = 't1'"), 2);
    cr_assert_eq(q1(db, "SELECT max(pos) FROM thread_messages WHERE thread = 't1'"), 4);
    sqlite3_close(db);
    assert_ids_after_restart("t1", "u1 a1 u2");
}

/* A store written by schema version 2 (messages keyed by the thread's id) is migrated at start:
 * each thread gets a number, its messages (pieces too) follow it, the old tables go, and the
 * thread reads and grows as before; deleting a thread still deletes its messages. */
Test(store, a_version_2_store_is_migrated)
{
    struct agw_store *s;
    char ids[256];
    sqlite3 *db;

    cr_assert_eq(mkdir(db_dir(), 0700), 0);
    db = db_file();
    exec_sql(db,
             "CREATE TABLE threads (id TEXT PRIMARY KEY, agents TEXT NOT NULL,"
             " updated INTEGER NOT NULL, dropped INTEGER NOT NULL, n_messages INTEGER NOT NULL);"
             "CREATE INDEX threads_updated ON threads(updated);"
             "CREATE TABLE messages (thread TEXT NOT NULL, pos INTEGER NOT NULL,"
             " part INTEGER NOT NULL, run_id TEXT, text INTEGER NOT NULL, data TEXT NOT NULL,"
             " PRIMARY KEY (thread, pos, part));"
             "CREATE TRIGGER threads_delete AFTER DELETE ON threads"
             " BEGIN DELETE FROM messages WHERE thread = old.id; END;"
             "PRAGMA user_version=2;");
    exec_sql(db, "INSERT INTO threads VALUES ('t2', ',demo,', strftime('%s','now'), 0, 1);"
                 "INSERT INTO threads VALUES ('t1', ',demo,', strftime('%s','now'), 3, 2);"
                 "INSERT INTO messages VALUES ('t2', 0, 0, 'r0', 0,"
                 " '{\"id\":\"x1\",\"role\":\"user\",\"content\":\"Yo\"}');"
                 "INSERT INTO messages VALUES ('t1', 3, 0, 'r1', 0,"
                 " '{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi\"}');"
                 "INSERT INTO messages VALUES ('t1', 4, 0, 'r1', 1,"
                 " '{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hel');"
                 "INSERT INTO messages VALUES ('t1', 4, 1, NULL, 1, 'lo');");
    sqlite3_close(db);

    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    cr_assert_str_eq(ids_of(s, "t1", ids, sizeof(ids)), "u1 a1");
    cr_assert_str_eq(ids_of(s, "t2", ids, sizeof(ids)), "x1");
    {
        struct answer a = read_thread(s, "t1", "run_id=r1");
        json_t *a1 = json_array_get(json_object_get(a.page, "messages"), 1);
        cr_assert_eq(a.status, 200);
        cr_assert_str_eq(json_string_value(json_object_get(a1, "content")), "Hello");
        json_decref(a.page);
    }
    input(s, "demo", "t1", "r2", "{\"messages\":[{\"id\":\"u2\",\"role\":\"user\"}]}");
    agw_store_close(s);

    db = db_rows();
    cr_assert_eq(q1(db, "PRAGMA user_version"), 5);
    cr_assert_eq(q1(db, "SELECT count(*) FROM sqlite_master WHERE name LIKE '%_v2'"), 0);
    cr_assert_eq(q1(db, "SELECT key FROM threads WHERE id = 't2'"), 1, "numbered by first write");
    cr_assert_eq(q1(db, "SELECT key FROM threads WHERE id = 't1'"), 2);
    cr_assert_eq(q1(db, "SELECT count(*) FROM thread_messages WHERE thread = 't1'"), 4);
    cr_assert_eq(q1(db, "SELECT max(pos) FROM thread_messages WHERE thread = 't1'"), 5);
    exec_sql(db, "DELETE FROM threads WHERE id = 't2'");
    cr_assert_eq(q1(db, "SELECT count(*) FROM messages WHERE thread = 1"), 0);
    sqlite3_close(db);
    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    cr_assert_str_eq(ids_of(s, "t1", ids, sizeof(ids)), "u1 a1 u2");
    cr_assert_str_eq(ids_of(s, "t2", ids, sizeof(ids)), "404");
    agw_store_close(s);
}

Test(store, a_newer_schema_is_a_clear_error)
{
    struct agw_store_options o = options(AGW_STORE_EMBEDDED, db_dir(), 10, 0, 10);
    char err[512] = "";
    sqlite3 *db;

    cr_assert_eq(mkdir(db_dir(), 0700), 0);
    db = db_file();
    exec_sql(db, "CREATE TABLE x (a); PRAGMA user_version=6;");
    sqlite3_close(db);
    cr_assert_null(agw_store_open(&o, err, sizeof(err)));
    cr_assert(strstr(err, "schema version 6") != NULL, "%s", err);
    cr_assert(strstr(err, "history.db") != NULL, "%s", err);
}

/* ---- schema 4: long texts apart, in segment files ---------------------------------------- */

/* A run of thread <id> whose answer (message <mid>) is <n> bytes of <c>, handed over in <records>
 * records, each given time to be committed before the next (so a text grows by pieces). */
static void long_answer(struct agw_store *s, const char *id, const char *run, const char *mid,
                        size_t n, char c, int records)
{
    for (int r = 0; r < records; r++) {
        size_t from = n * (size_t)r / (size_t)records, to = n * (size_t)(r + 1) / (size_t)records;
        size_t cap = to - from + 256, k = 0;
        char *lines = malloc(cap);

        cr_assert_not_null(lines);
        if (r == 0)
            k += (size_t)snprintf(lines, cap,
                                  "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"%s\","
                                  "\"role\":\"assistant\"}\n",
                                  mid);
        k += (size_t)snprintf(lines + k, cap - k,
                              "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"%s\","
                              "\"delta\":\"",
                              mid);
        memset(lines + k, c, to - from);
        k += to - from;
        k += (size_t)snprintf(lines + k, cap - k, "\"}\n");
        if (r == records - 1)
            k += (size_t)snprintf(lines + k, cap - k,
                                  "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"%s\"}\n", mid);
        agw_store_run_events(s, id, run, lines, k, false);
        usleep(60 * 1000); /* committed (every 20 ms here) */
    }
}

/* Thread <id>'s message <mid> as read back: <n> bytes of <c>. */
static void expect_long_answer(struct agw_store *s, const char *id, const char *mid, size_t n,
                               char c)
{
    struct answer a = read_thread(s, id, "limit=200");
    json_t *m, *found = NULL;
    size_t i;

    cr_assert_eq(a.status, 200, "%s: %d", id, a.status);
    json_array_foreach(json_object_get(a.page, "messages"), i, m)
    {
        if (strcmp(json_string_value(json_object_get(m, "id")), mid) == 0)
            found = m;
    }
    cr_assert_not_null(found, "%s: no message %s", id, mid);
    const char *text = json_string_value(json_object_get(found, "content"));
    cr_assert_not_null(text);
    cr_assert_eq(strlen(text), n, "%s/%s: %zu bytes", id, mid, strlen(text));
    cr_assert_eq(strspn(text, (char[]){c, '\0'}), n, "%s/%s: the bytes as written", id, mid);
    json_decref(a.page);
}

static char *texts_file(const char *store, uint64_t seg, char *out, size_t len)
{
    snprintf(out, len, "%s/history.texts/%08" PRIu64, store, seg);
    return out;
}

static long long file_size(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

/* The segment files in <store>/history.texts. */
static int count_texts_files(const char *store)
{
    char cmd[300];
    FILE *f;
    int n = -1;

    snprintf(cmd, sizeof(cmd), "ls %s/history.texts | wc -l", store);
    f = popen(cmd, "r");
    cr_assert_not_null(f);
    cr_assert_eq(fscanf(f, "%d", &n), 1);
    pclose(f);
    return n;
}

/* This process's descriptors of <store>/history.texts and the files in it. */
static int texts_fds(const char *store)
{
    char want[300], link[512], p[64];
    int n = 0;

    snprintf(want, sizeof(want), "%s/history.texts", store);
    for (int fd = 0; fd < 1024; fd++) {
        ssize_t k;
        snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
        if ((k = readlink(p, link, sizeof(link) - 1)) <= 0)
            continue;
        link[k] = '\0';
        n += strstr(link, want) != NULL;
    }
    return n;
}

/* Whether the file system of <store> takes O_DIRECT (tmpfs does not). */
static bool direct_io_works(const char *store)
{
    char p[300];
    int fd;

    snprintf(p, sizeof(p), "%s/probe", store);
    fd = open(p, O_WRONLY | O_CREAT | O_DIRECT, 0600);
    if (fd >= 0)
        close(fd);
    unlink(p);
    return fd >= 0;
}

/* Waits (3 s at most) until the store's writer, idle, has begun a trim since it had trimmed <n>
 * times, and the buffers are given back. */
static void trimmed_past(struct agw_store *s, uint64_t n)
{
    for (int i = 0; i < 300; i++) {
        if (stats_of(s).trims > n && agw_store_vfs_stage_bytes() == 0 &&
            agw_store_texts_buffer_bytes() == 0)
            return;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    cr_assert_fail("the idle writer did not give its buffers back within 3 s (trims %" PRIu64
                   " since %" PRIu64 ", buffers %" PRIu64 " and %" PRIu64 " bytes)",
                   stats_of(s).trims, n, agw_store_vfs_stage_bytes(),
                   agw_store_texts_buffer_bytes());
}

/* A writer idle for a second gives back what its commits' bursts left allocated: the buffer its
 * database pages were gathered in for the direct writes, the long texts' append buffer. A text
 * appended after that goes on at its segment's committed end, the last block's bytes taken from
 * the copy kept of them, and every text reads back whole after a restart. In the working
 * directory (the build tree), on a disk: a tmpfs takes no direct writes, and gathers nothing. The
 * store counts a trim as it begins, so that no trim began while the buffers were looked at when the
 * count did not move. */
Test(store, an_idle_writer_gives_back_its_write_buffers)
{
    char here[] = "agw-store-trim.XXXXXX";
    struct agw_store *s;
    uint64_t trims, stage, texts;
    bool direct;

    cr_assert(mkdtemp(here) != NULL);
    direct = direct_io_works(here);
    agw_store_texts_tune(0, 0, false, false);
    s = open_store(AGW_STORE_EMBEDDED, here, 100, 0, 100);
    for (int round = 0; round < 3; round++) {
        char run[8], mid[8];

        snprintf(run, sizeof(run), "r%d", round);
        snprintf(mid, sizeof(mid), "a%d", round);
        trims = stats_of(s).trims;
        /* 10,001 bytes: the segment's last block partly filled */
        long_answer(s, "long", run, mid, 10001, (char)('p' + round), 1);
        stage = agw_store_vfs_stage_bytes();
        texts = agw_store_texts_buffer_bytes();
        if (stats_of(s).trims == trims) { /* no trim since the commit: both held */
            cr_assert_gt(texts, 0, "the texts' append buffer, after a commit");
            if (direct)
                cr_assert_gt(stage, 0, "the database's gathering buffer, after a commit");
        }
        trimmed_past(s, trims);
    }
    for (int round = 0; round < 3; round++)
        expect_long_answer(s, "long", (char[]){'a', (char)('0' + round), '\0'}, 10001,
                           (char)('p' + round));
    agw_store_close(s);
    s = open_store(AGW_STORE_EMBEDDED, here, 100, 0, 100);
    for (int round = 0; round < 3; round++)
        expect_long_answer(s, "long", (char[]){'a', (char)('0' + round), '\0'}, 10001,
                           (char)('p' + round));
    agw_store_close(s);
    cr_assert_eq(agw_store_texts_buffer_bytes(), 0);
    {
        char cmd[100];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", here);
        cr_assert_eq(system(cmd), 0);
    }
}

/* Pieces of AGW_TEXTS_MIN bytes or more are kept in the segment files, the rows saying where: an
 * answer of 100 KB streamed over four commits is four pieces there, and none of its bytes is in
 * the database; a short one stays in its row. Both read back whole after a restart, and from the
 * segment after they were shed, whether the texts were written directly or through the page
 * cache (whose pages the store then lets go). */
Test(store, long_texts_are_kept_apart_and_read_back)
{
    for (int direct = 0; direct < 2; direct++) {
        char store[200], seg1[300];
        uint64_t appended0, direct0, appended1, direct1;
        struct agw_store *s;
        sqlite3 *db;
        sqlite3 *q;

        snprintf(store, sizeof(store), "%s/store-%d", dir, direct);
        agw_store_texts_tune(0, 0, !direct, false);
        agw_store_texts_counts(&appended0, &direct0);
        s = open_store(AGW_STORE_EMBEDDED, store, 100, 0, 100);
        write_run1(s, "short");
        long_answer(s, "long", "r1", "a1", 100000, 'q', 4);
        expect_long_answer(s, "long", "a1", 100000, 'q'); /* shed after its commits: read back */
        cr_assert_eq(texts_fds(store), 2, "the directory and the segment appended to, at rest");
        cr_assert_geq(stats_of(s).texts_bytes, 100000, "agw_history_texts_bytes");
        agw_store_close(s);
        cr_assert_eq(texts_fds(store), 0);
        agw_store_texts_counts(&appended1, &direct1);
        cr_assert_geq(appended1 - appended0, 100000);
        if (direct && direct_io_works(store))
            cr_assert_geq(direct1 - direct0, 100000, "written directly");
        else
            cr_assert_eq(direct1, direct0, "through the page cache");

        snprintf(seg1, sizeof(seg1), "%s/history.db", store);
        cr_assert_eq(sqlite3_open(seg1, &db), SQLITE_OK);
        q = db;
        cr_assert_geq(q1(q, "SELECT count(*) FROM messages WHERE seg IS NOT NULL"), 4);
        cr_assert_lt(q1(q, "SELECT max(length(data)) FROM messages"), AGW_TEXTS_MIN);
        cr_assert_geq(q1(q, "SELECT sum(len) FROM messages"), 100000);
        cr_assert_eq(q1(q, "SELECT count(*) FROM segments"), 1);
        cr_assert_eq(q1(q, "SELECT count(*) FROM pieces"),
                     q1(q, "SELECT count(*) FROM messages WHERE seg IS NOT NULL"));
        cr_assert_eq(q1(q, "SELECT size FROM segments WHERE seg = 1"),
                     q1(q, "SELECT max(off + len) FROM messages WHERE seg = 1"));
        cr_assert_geq(file_size(texts_file(store, 1, seg1, sizeof(seg1))),
                      q1(q, "SELECT size FROM segments WHERE seg = 1"));
        sqlite3_close(db);

        s = open_store(AGW_STORE_EMBEDDED, store, 100, 0, 100);
        cr_assert_geq(stats_of(s).texts_bytes, 100000, "counted again at start");
        expect_long_answer(s, "long", "a1", 100000, 'q');
        {
            struct answer a = read_thread(s, "short", NULL);
            expect_run1(&a);
            json_decref(a.page);
        }
        long_answer(s, "long", "r2", "a2", 30000, 'v', 2); /* appends after a restart */
        agw_store_close(s);
        s = open_store(AGW_STORE_EMBEDDED, store, 100, 0, 100);
        expect_long_answer(s, "long", "a1", 100000, 'q');
        expect_long_answer(s, "long", "a2", 30000, 'v');
        agw_store_close(s);
    }
}

/* Segment pages written through the page cache (a file system without O_DIRECT, or direct writes
 * turned off, as here) are let go once on the disk: after four commits of a 100 KB answer, none of
 * the file's pages is still cached. In the working directory (the build tree), on a disk: a tmpfs
 * would hold its pages whatever the advice. */
Test(store, texts_written_through_the_page_cache_are_let_go)
{
    char here[] = "agw-store-texts.XXXXXX", path[300], cmd[300];
    struct agw_store *s;
    unsigned char *vec;
    size_t pages, resident = 0, page = (size_t)sysconf(_SC_PAGESIZE);
    long long size;
    void *map;
    int fd, rc;

    cr_assert(mkdtemp(here) != NULL);
    agw_store_texts_tune(0, 0, true, false);
    s = open_store(AGW_STORE_EMBEDDED, here, 100, 0, 100);
    long_answer(s, "long", "r1", "a1", 100000, 'q', 4);
    agw_store_close(s);
    size = file_size(texts_file(here, 1, path, sizeof(path)));
    cr_assert_gt(size, 100000);
    fd = open(path, O_RDONLY);
    cr_assert(fd >= 0);
    map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    cr_assert(map != MAP_FAILED);
    pages = ((size_t)size + page - 1) / page;
    vec = malloc(pages);
    cr_assert_not_null(vec);
    rc = mincore(map, (size_t)size, vec);
    for (size_t i = 0; rc == 0 && i < pages; i++)
        resident += vec[i] & 1;
    free(vec);
    munmap(map, (size_t)size);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", here);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(rc, 0, "mincore: %s", strerror(errno));
    cr_assert_leq(resident, 1, "%zu of the segment's %zu pages are still in the page cache",
                  resident, pages);
}

/* A segment's bytes past the size the database gives it (a commit that did not happen) are cut
 * at start, and files of segments the database does not list are deleted; what follows is written
 * in their place and read back. */
Test(store, a_segment_is_cut_to_its_committed_size_at_start)
{
    char seg1[300], stray[300], junk[10000];
    long long committed;
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    sqlite3 *db;
    FILE *f;

    long_answer(s, "t1", "r1", "a1", 20000, 'x', 1);
    agw_store_close(s);
    db = db_file();
    committed = q1(db, "SELECT size FROM segments WHERE seg = 1");
    sqlite3_close(db);
    cr_assert_gt(committed, 20000);
    texts_file(db_dir(), 1, seg1, sizeof(seg1));
    memset(junk, 'J', sizeof(junk));
    f = fopen(seg1, "a");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(junk, 1, sizeof(junk), f), sizeof(junk));
    fclose(f);
    texts_file(db_dir(), 7, stray, sizeof(stray));
    f = fopen(stray, "w");
    cr_assert_not_null(f);
    fclose(f);

    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    cr_assert_eq(file_size(seg1), committed, "cut to what the database counts");
    cr_assert_eq(file_size(stray), -1, "a segment the database does not list is deleted");
    long_answer(s, "t2", "r1", "a2", 9000, 'y', 1);
    agw_store_close(s);
    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    expect_long_answer(s, "t1", "a1", 20000, 'x');
    expect_long_answer(s, "t2", "a2", 9000, 'y');
    agw_store_close(s);
}

/* A segment file shorter than the database says, or gone, stops the start with a message naming
 * it: the texts it held are lost, and serving their threads without them would be silent. */
Test(store, a_cut_or_lost_segment_is_a_clear_start_error)
{
    struct agw_store_options o = options(AGW_STORE_EMBEDDED, db_dir(), 10, 0, 10);
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    char seg1[300], err[512] = "";

    long_answer(s, "t1", "r1", "a1", 20000, 'x', 1);
    agw_store_close(s);
    texts_file(db_dir(), 1, seg1, sizeof(seg1));
    cr_assert_eq(truncate(seg1, 100), 0);
    cr_assert_null(agw_store_open(&o, err, sizeof(err)));
    cr_assert(strstr(err, "history.texts/00000001") != NULL, "%s", err);
    cr_assert(strstr(err, "cut") != NULL, "%s", err);
    cr_assert_eq(unlink(seg1), 0);
    cr_assert_null(agw_store_open(&o, err, sizeof(err)));
    cr_assert(strstr(err, "history.texts/00000001") != NULL, "%s", err);
    cr_assert(strstr(err, "lost") != NULL, "%s", err);
}

/* Segments of 64 KiB here, looked at after every commit: as the cap drops a thread's old answers,
 * the segments that held only those are deleted, and the first one, where one answer of another
 * thread is still in use beside dead ones, is compacted (that answer moved to the current
 * segment); the files stay few, every segment the database lists is there, and both threads read
 * back whole after a restart. */
Test(store, unused_segments_are_deleted_and_sparse_ones_compacted)
{
    uint64_t texts_before, texts_after;
    struct agw_store *s;
    char mid[16];
    sqlite3 *db;
    int files;

    agw_store_texts_tune(1024, 64 << 10, false, true);
    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 2, 0, 100);
    long_answer(s, "keep", "r0", "k0", 10000, 'k', 1);
    for (int i = 1; i <= 30; i++) {
        char run[16];
        snprintf(run, sizeof(run), "r%d", i);
        snprintf(mid, sizeof(mid), "a%d", i);
        long_answer(s, "t", run, mid, 20000, (char)('a' + i % 20), 1);
    }
    for (int i = 0; i < 10; i++) { /* more commits: the collection goes round the segments */
        char id[16];
        snprintf(id, sizeof(id), "tick%d", i);
        write_run1(s, id);
        usleep(40 * 1000);
    }
    /* still cached, its text shed: read back from where the compaction moved it */
    expect_long_answer(s, "keep", "k0", 10000, 'k');
    texts_before = stats_of(s).texts_bytes; /* about 610 KB written, 50 KB of it in use */
    cr_assert_geq(texts_before, 50000);
    cr_assert_leq(texts_before, 4 * (64 << 10), "agw_history_texts_bytes: %" PRIu64, texts_before);
    agw_store_close(s);

    files = count_texts_files(db_dir());
    cr_assert_leq(files, 4, "%d segment files for 50 KB in use", files);
    db = db_file();
    cr_assert_eq(q1(db, "SELECT count(*) FROM segments"), files);
    cr_assert_eq(q1(db, "SELECT count(*) FROM segments WHERE seg = 1"), 0, "compacted");
    cr_assert_eq(q1(db, "SELECT count(*) FROM messages WHERE seg IS NOT NULL"
                        " AND seg NOT IN (SELECT seg FROM segments)"),
                 0);
    cr_assert_gt(q1(db, "SELECT max(seg) FROM segments"), 9, "segments were made as texts came");
    sqlite3_close(db);
    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 2, 0, 100);
    expect_long_answer(s, "keep", "k0", 10000, 'k');
    expect_long_answer(s, "t", "a29", 20000, (char)('a' + 29 % 20));
    expect_long_answer(s, "t", "a30", 20000, (char)('a' + 30 % 20));
    agw_store_close(s);

    /* the table the collection reads: an entry for each piece apart, of a segment the database
     * lists; rows then given other bytes, or deleted with their thread, leave their entries behind
     * (nothing keeps the table on every write), but the collection counts only the entries whose
     * row still points at them: those segments go, entries and all */
    db = db_file();
    cr_assert_eq(q1(db, "SELECT count(*) FROM messages m JOIN pieces p ON p.seg = m.seg"
                        " AND p.off = m.off AND p.len = m.len AND p.thread = m.thread"
                        " AND p.pos = m.pos AND p.part = m.part"),
                 q1(db, "SELECT count(*) FROM messages WHERE seg IS NOT NULL"));
    cr_assert_eq(q1(db, "SELECT count(*) FROM pieces WHERE seg NOT IN (SELECT seg FROM segments)"),
                 0);
    exec_sql(db, "UPDATE messages SET data = '{}', seg = NULL, off = NULL, len = NULL"
                 " WHERE thread = (SELECT key FROM threads WHERE id = 't') AND seg IS NOT NULL");
    exec_sql(db, "DELETE FROM threads WHERE id = 'keep'");
    sqlite3_close(db);
    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 2, 0, 100);
    texts_before = stats_of(s).texts_bytes;
    for (int i = 0; i < 8; i++) {
        char id[16];
        snprintf(id, sizeof(id), "tock%d", i);
        write_run1(s, id);
        usleep(40 * 1000);
    }
    texts_after = stats_of(s).texts_bytes;
    agw_store_close(s);
    db = db_file();
    cr_assert_eq(q1(db, "SELECT count(*) FROM messages WHERE seg IS NOT NULL"), 0);
    cr_assert_eq(q1(db, "SELECT count(*) FROM segments"), 1, "the current segment alone");
    cr_assert_eq((long long)texts_after, q1(db, "SELECT size FROM segments"),
                 "agw_history_texts_bytes: %" PRIu64, texts_after);
    cr_assert_leq(texts_after, texts_before);
    cr_assert_eq(q1(db, "SELECT count(*) FROM pieces WHERE seg <> (SELECT seg FROM segments)"), 0);
    cr_assert_eq(count_texts_files(db_dir()), 1);
    sqlite3_close(db);
}

/* A store of schema 3 (every text in its row) is migrated at start: its rows stay as they are and
 * read back, and long texts written from then on go to the segments. */
Test(store, a_version_3_store_is_migrated)
{
    struct agw_store *s;
    char ids[256];
    sqlite3 *db;

    cr_assert_eq(mkdir(db_dir(), 0700), 0);
    db = db_file();
    exec_sql(db, "CREATE TABLE threads (key INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE,"
                 " agents TEXT NOT NULL, updated INTEGER NOT NULL, dropped INTEGER NOT NULL,"
                 " n_messages INTEGER NOT NULL);"
                 "CREATE INDEX threads_updated ON threads(updated);"
                 "CREATE TABLE messages (thread INTEGER NOT NULL, pos INTEGER NOT NULL,"
                 " part INTEGER NOT NULL, run_id TEXT, text INTEGER NOT NULL, data TEXT NOT NULL,"
                 " PRIMARY KEY (thread, pos, part));"
                 "CREATE TRIGGER threads_delete AFTER DELETE ON threads"
                 " BEGIN DELETE FROM messages WHERE thread = old.key; END;"
                 "PRAGMA user_version=3;");
    exec_sql(db, "INSERT INTO threads VALUES (1, 't1', ',demo,', strftime('%s','now'), 0, 2);"
                 "INSERT INTO messages VALUES (1, 0, 0, 'r1', 0,"
                 " '{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi\"}');"
                 "INSERT INTO messages VALUES (1, 1, 0, 'r1', 1,"
                 " '{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hel');"
                 "INSERT INTO messages VALUES (1, 1, 1, NULL, 1, 'lo');");
    sqlite3_close(db);

    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    {
        struct answer a = read_thread(s, "t1", NULL);
        expect_run1(&a);
        json_decref(a.page);
    }
    long_answer(s, "t1", "r2", "a2", 12000, 'm', 2);
    agw_store_close(s);
    db = db_file();
    cr_assert_eq(q1(db, "PRAGMA user_version"), 5);
    cr_assert_geq(q1(db, "SELECT count(*) FROM messages WHERE seg IS NOT NULL"), 2);
    sqlite3_close(db);
    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    cr_assert_str_eq(ids_of(s, "t1", ids, sizeof(ids)), "u1 a1 a2");
    expect_long_answer(s, "t1", "a2", 12000, 'm');
    agw_store_close(s);
}

/* ---- threads new to the database (a filter of the ids it holds) ---------------------------- */

static struct agw_store_stats stats_of(struct agw_store *s)
{
    struct agw_store_stats st;

    agw_store_get_stats(s, &st);
    return st;
}

/* Waits (5 s at most) until the records are applied and committed and the threads past a cache of
 * <cache> evicted. */
static void settled(struct agw_store *s, size_t cache)
{
    for (int i = 0; i < 500; i++) {
        struct agw_store_stats st = stats_of(s);
        if (st.queued_bytes == 0 && st.commits > 0 && st.cached <= cache)
            return;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    cr_assert_fail("the store did not settle within 5 s");
}

/* A thread's first record reads nothing from the database, nor does a read of a thread it never
 * held, while every thread it holds is still read back: across evictions from the cache and across
 * a restart (the filter is made again from the table at start). */
Test(store, threads_new_to_the_database_are_not_read_from_it)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 2);
    struct agw_store_stats st;
    char t[16];

    for (int i = 0; i < 20; i++) {
        snprintf(t, sizeof(t), "t%d", i);
        write_run1(s, t);
    }
    settled(s, 2);
    st = stats_of(s);
    cr_assert_eq(st.reads_spared, 20, "spared %" PRIu64, st.reads_spared);
    cr_assert_eq(st.thread_reads, 0, "read %" PRIu64, st.thread_reads);
    expect_run1_in_threads(s, 20);
    st = stats_of(s);
    cr_assert_geq(st.thread_reads, 18, "threads evicted from a cache of 2 are read back");
    for (int i = 0; i < 20; i++) {
        snprintf(t, sizeof(t), "n%d", i);
        cr_assert_eq(read_thread(s, t, NULL).status, 404);
    }
    cr_assert_eq(stats_of(s).reads_spared, 40);
    cr_assert_eq(stats_of(s).thread_reads, st.thread_reads, "an unknown thread reads nothing");
    agw_store_close(s);

    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 2);
    expect_run1_in_threads(s, 20);
    cr_assert_eq(read_thread(s, "n1", NULL).status, 404);
    st = stats_of(s);
    cr_assert_eq(st.thread_reads, 20);
    cr_assert_eq(st.reads_spared, 1);
    agw_store_close(s);
}

/* A database of more threads than one step of the scan (16,384 ids) is known only after a few
 * commits: until then every look-up reads the table, as it must (a thread of the part not yet
 * scanned is found), then threads new to it read nothing again. */
Test(store, a_large_database_is_scanned_in_steps_and_read_meanwhile)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    struct agw_store_stats st;
    struct answer a;
    sqlite3 *db;
    char sql[256];

    write_run1(s, "t0");
    agw_store_close(s);
    db = db_file();
    exec_sql(db, "BEGIN");
    for (int i = 0; i < 40000; i++) {
        snprintf(sql, sizeof(sql),
                 "INSERT INTO threads (id, agents, updated, dropped, n_messages)"
                 " VALUES ('bulk-%d', ',demo,', %lld, 0, 0)",
                 i, (long long)time(NULL));
        exec_sql(db, sql);
    }
    exec_sql(db, "COMMIT");
    sqlite3_close(db);

    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    a = read_thread(s, "bulk-39999", NULL); /* past the first step */
    cr_assert_eq(a.status, 200);
    json_decref(a.page);
    write_run1(s, "new-1");
    committed();
    st = stats_of(s);
    cr_assert_eq(st.reads_spared, 0, "not known yet: looked up");
    cr_assert_eq(st.thread_reads, 2);
    /* each commit scans a step: two more, and the 40,001 are known */
    /* a commit a step: after two more the 40,001 are known, and new threads read nothing (a slow
     * writer may take two records in one commit: a few more then) */
    for (int i = 2; i < 12 && stats_of(s).reads_spared == 0; i++) {
        char t[16];
        snprintf(t, sizeof(t), "new-%d", i);
        write_run1(s, t);
        committed();
    }
    st = stats_of(s);
    cr_assert_geq(st.reads_spared, 1, "new threads read nothing once the scan is done");
    a = read_thread(s, "bulk-20000", NULL);
    cr_assert_eq(a.status, 200, "a scanned thread is found");
    json_decref(a.page);
    a = read_thread(s, "t0", NULL);
    expect_run1(&a);
    json_decref(a.page);
    cr_assert_eq(read_thread(s, "nope", NULL).status, 404);
    cr_assert_eq(stats_of(s).reads_spared, st.reads_spared + 1);
    agw_store_close(s);
}

/* Past its capacity (16,384 threads for a new database) the filter is made again, twice as large,
 * from the table, while the full one goes on answering: no thread is lost on the way. */
Test(store, the_filter_grows_past_its_capacity_without_losing_a_thread)
{
    /* room for every record at once: a sanitized writer falls behind the loop below */
    struct agw_store_options o = options(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    char t[32], body[128], err[512] = "";
    struct agw_store *s;

    o.max_queue_bytes = 64 << 20;
    s = agw_store_open(&o, err, sizeof(err));
    cr_assert(s != NULL, "agw_store_open: %s", err);

    for (int i = 0; i < 20000; i++) {
        snprintf(t, sizeof(t), "g-%d", i);
        snprintf(body, sizeof(body),
                 "{\"messages\":[{\"id\":\"u%d\",\"role\":\"user\",\"content\":\"Hi\"}]}", i);
        input(s, "demo", t, "r1", body);
        if (i % 2000 == 1999)
            committed();
    }
    for (int i = 0; i < 4; i++) { /* commits, each a step of the new filter's scan */
        snprintf(t, sizeof(t), "late-%d", i);
        write_run1(s, t);
        committed();
    }
    uint64_t reads = stats_of(s).thread_reads;
    for (int i = 0; i < 20000; i += 499) {
        char ids[64], want[16];
        snprintf(t, sizeof(t), "g-%d", i);
        snprintf(want, sizeof(want), "u%d", i);
        cr_assert_str_eq(ids_of(s, t, ids, sizeof(ids)), want, "thread %s", t);
    }
    cr_assert_gt(stats_of(s).thread_reads, reads, "evicted threads were read back");
    cr_assert_eq(stats_of(s).dropped, 0);
    write_run1(s, "after");
    committed();
    uint64_t spared = stats_of(s).reads_spared;
    cr_assert_eq(read_thread(s, "never", NULL).status, 404);
    cr_assert_eq(stats_of(s).reads_spared, spared + 1);
    agw_store_close(s);
}

/* ---- a disk that refuses writes ------------------------------------------------------------ */

/* A disk that refuses the store's writes (here a file-size limit below the database's size, which
 * fails its writes as a full disk does): commits fail, are counted and retried, less and less
 * often; the writer's memory stays within history.cache_threads, the least recently used threads
 * giving up their unwritten changes (counted); once the disk takes writes again, the commits
 * resume, and a restart finds what was committed: the thread written before, the threads kept in
 * memory meanwhile, the threads written after, and none of those given up. */
static void full_disk(void)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 4);
    struct agw_store_stats st;
    struct rlimit was, full;
    uint64_t errors, commits;
    int readable = 0;
    char t[16];

    write_run1(s, "t0");
    settled(s, 4);
    cr_assert_eq(signal(SIGXFSZ, SIG_IGN) == SIG_ERR, false);
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &was), 0);
    full = (struct rlimit){.rlim_cur = 4096, .rlim_max = was.rlim_max};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &full), 0);
    for (int i = 0; i < 20; i++) {
        snprintf(t, sizeof(t), "f%d", i);
        write_run1(s, t);
    }
    for (int i = 0; i < 500; i++) {
        st = stats_of(s);
        if (st.queued_bytes == 0 && st.commit_errors >= 2 && st.cached <= 4)
            break;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    cr_assert_geq(st.commit_errors, 2, "commits failed and were retried: %" PRIu64,
                  st.commit_errors);
    cr_assert_leq(st.cached, 4, "the cache stays within its bound: %zu threads", st.cached);
    cr_assert_geq(st.unsaved, 16, "threads gave up their changes: %" PRIu64, st.unsaved);
    cr_assert_leq(st.unsaved, 20, "%" PRIu64, st.unsaved);
    errors = st.commit_errors;
    nanosleep(&(struct timespec){1, 0}, NULL);
    st = stats_of(s);
    cr_assert_leq(st.commit_errors - errors, 10,
                  "the attempts back off: %" PRIu64 " in 1 s (every 20 ms, 50 would be made)",
                  st.commit_errors - errors);

    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &was), 0); /* the disk has room again */
    errors = st.commit_errors;
    commits = st.commits;
    for (int i = 0; i < 4; i++) {
        snprintf(t, sizeof(t), "t%d", i + 1);
        write_run1(s, t);
    }
    for (int i = 0; i < 1000 && stats_of(s).commits == commits; i++) /* the attempt due */
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    settled(s, 4);
    st = stats_of(s);
    cr_assert_gt(st.commits, commits, "commits resumed");
    cr_assert_leq(st.commit_errors, errors + 1, "%" PRIu64 " errors", st.commit_errors);
    agw_store_close(s);

    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    expect_run1_in_threads(s, 5); /* t0 before, t1 .. t4 after */
    for (int i = 0; i < 20; i++) {
        struct answer a;
        snprintf(t, sizeof(t), "f%d", i);
        a = read_thread(s, t, NULL);
        if (a.status == 200) {
            expect_run1(&a);
            readable++;
        } else {
            cr_assert_eq(a.status, 404, "%s: %d", t, a.status);
        }
        json_decref(a.page);
    }
    cr_assert_eq(readable, 20 - (int)st.unsaved, "%d threads kept, %" PRIu64 " given up", readable,
                 st.unsaved);
    agw_store_close(s);
}

Test(store, a_full_disk_keeps_the_cache_bounded_and_commits_resume)
{
    full_disk();
}

/* The same with every piece in the segment files: their writes fail as the database's do (the
 * file size limit), each failed commit forgets what it appended, and what follows is appended in
 * its place. */
Test(store, a_full_disk_with_texts_apart_keeps_the_cache_bounded_and_commits_resume)
{
    agw_store_texts_tune(1, 0, false, false);
    full_disk();
}

/* Schema 4 had no rows that several messages share: migrated, its rows read as they were, and new
 * messages share rows from then on. */
Test(store, a_version_4_store_is_migrated)
{
    struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    sqlite3 *db;

    input(s, "demo", "t1", "r1",
          "{\"messages\":[{\"id\":\"m1\",\"role\":\"user\",\"content\":\"1\"}]}");
    agw_store_close(s);
    db = db_file();
    exec_sql(db, "ALTER TABLE messages DROP COLUMN n; PRAGMA user_version=4;");
    sqlite3_close(db);

    s = open_store(AGW_STORE_EMBEDDED, db_dir(), 100, 0, 100);
    input(s, "demo", "t1", "r2",
          "{\"messages\":[{\"id\":\"m1\",\"role\":\"user\",\"content\":\"1\"},"
          "{\"id\":\"m2\",\"role\":\"user\",\"content\":\"2\"},"
          "{\"id\":\"m3\",\"role\":\"user\",\"content\":\"3\"}]}");
    agw_store_close(s);
    db = db_file();
    cr_assert_eq(q1(db, "PRAGMA user_version"), 5);
    cr_assert_eq(q1(db, "SELECT count(*) FROM messages WHERE part = 0 AND pos = 0"), 1);
    cr_assert_eq(q1(db, "SELECT n FROM messages WHERE part = -1 AND pos = 1"), 2);
    sqlite3_close(db);
    assert_ids_after_restart("t1", "m1 m2 m3");
}

/* ---- random changes, read back after each restart ---------------------------------------- */

static uint64_t rnd_next(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* The messages of thread <id> as a page reads them (NULL: none). */
static json_t *page_of(struct agw_store *s, const char *id)
{
    struct answer a = read_thread(s, id, "limit=200");

    cr_assert(a.status == 200 || a.status == 404, "thread %s: %d", id, a.status);
    return a.page;
}

/* A MESSAGES_SNAPSHOT of the thread's messages, some left out and the last two swapped. */
static char *snapshot_of(struct agw_store *s, const char *id, uint64_t *x)
{
    json_t *page = page_of(s, id), *keep = json_array(), *ev, *m;
    size_t i, n;
    char *line;

    json_array_foreach(page != NULL ? json_object_get(page, "messages") : NULL, i, m)
    {
        if (rnd_next(x) % 4 != 0)
            json_array_append(keep, m);
    }
    n = json_array_size(keep);
    if (n >= 2 && rnd_next(x) % 2 == 0) {
        json_t *last = json_incref(json_array_get(keep, n - 1));
        json_array_set(keep, n - 1, json_array_get(keep, n - 2));
        json_array_set_new(keep, n - 2, last);
    }
    ev = json_pack("{s:s, s:o}", "type", "MESSAGES_SNAPSHOT", "messages", keep);
    line = json_dumps(ev, JSON_COMPACT);
    json_decref(ev);
    json_decref(page);
    return line;
}

/* Random changes to three threads under a cap of 7 messages: new user messages, answers streamed
 * over commits (some long enough to be kept apart), tool results placed after their owner,
 * edits, snapshots that drop and reorder; a commit between some of them. After each restart every
 * thread reads back as it read before it. The rows that several messages share, the pieces of a
 * text grown across commits, and the rows deleted by the cap and by snapshots all meet here. */
Test(store, random_changes_read_back_the_same_after_each_restart)
{
    for (uint64_t seed = 1; seed <= 4; seed++) {
        struct agw_store *s = open_store(AGW_STORE_EMBEDDED, db_dir(), 7, 0, 100);
        uint64_t x = seed * 0x9E3779B97F4A7C15ULL;
        char open_text[3][32] = {"", "", ""}, last_answer[3][32] = {"", "", ""};
        char buf[8192], run[32];
        int next = 0;

        for (int step = 0; step < 80; step++) {
            int t = (int)(rnd_next(&x) % 3);
            char th[8];
            snprintf(th, sizeof(th), "t%d", t);
            snprintf(run, sizeof(run), "r%d", step);
            switch (rnd_next(&x) % 6) {
            case 0: { /* one to three new user messages */
                int k = 1 + (int)(rnd_next(&x) % 3), at;
                at = snprintf(buf, sizeof(buf), "{\"messages\":[");
                for (int i = 0; i < k; i++)
                    at += snprintf(buf + at, sizeof(buf) - (size_t)at,
                                   "%s{\"id\":\"u%d\",\"role\":\"user\",\"content\":\"q%d\"}",
                                   i > 0 ? "," : "", next, next),
                        next++;
                snprintf(buf + at, sizeof(buf) - (size_t)at, "]}");
                input(s, "demo", th, run, buf);
                break;
            }
            case 1:
            case 2: { /* an answer streamed: started, grown, sometimes ended */
                size_t len = rnd_next(&x) % 8 == 0 ? 5000 : 1 + rnd_next(&x) % 40;
                char delta[5001];
                int at = 0;
                memset(delta, 'a' + (int)(rnd_next(&x) % 26), len);
                delta[len] = '\0';
                if (open_text[t][0] == '\0') {
                    snprintf(open_text[t], sizeof(open_text[t]), "a%d", next++);
                    at = snprintf(buf, sizeof(buf),
                                  "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"%s\","
                                  "\"role\":\"assistant\"}\n",
                                  open_text[t]);
                }
                at += snprintf(buf + at, sizeof(buf) - (size_t)at,
                               "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"%s\","
                               "\"delta\":\"%s\"}\n",
                               open_text[t], delta);
                if (rnd_next(&x) % 3 == 0) {
                    snprintf(buf + at, sizeof(buf) - (size_t)at,
                             "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"%s\"}\n",
                             open_text[t]);
                    snprintf(last_answer[t], sizeof(last_answer[t]), "%s", open_text[t]);
                    open_text[t][0] = '\0';
                }
                events(s, th, run, buf);
                break;
            }
            case 3: /* a tool call on the last answer, and its result after it */
                if (last_answer[t][0] == '\0')
                    break;
                snprintf(buf, sizeof(buf),
                         "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c%d\",\"toolCallName\":"
                         "\"f\",\"parentMessageId\":\"%s\"}\n"
                         "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c%d\"}\n"
                         "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"tr%d\",\"toolCallId\":"
                         "\"c%d\",\"content\":\"%d\"}\n",
                         next, last_answer[t], next, next, next, next);
                next++;
                events(s, th, run, buf);
                break;
            case 4: { /* a snapshot */
                char *line = snapshot_of(s, th, &x);
                snprintf(buf, sizeof(buf), "%s\n", line);
                free(line);
                events(s, th, run, buf);
                open_text[t][0] = '\0';
                break;
            }
            default: /* an edit of a user message the thread may hold */
                snprintf(buf, sizeof(buf),
                         "{\"messages\":[{\"id\":\"u%d\",\"role\":\"user\",\"content\":\"e%d\"}]}",
                         next > 0 ? (int)(rnd_next(&x) % (uint64_t)next) : 0, step);
                input(s, "demo", th, run, buf);
            }
            if (rnd_next(&x) % 3 == 0)
                nanosleep(&(struct timespec){0, 40 * 1000 * 1000}, NULL); /* a commit */
            if (rnd_next(&x) % 6 == 0 || step == 79) {
                json_t *before[3];
                for (int i = 0; i < 3; i++) {
                    snprintf(th, sizeof(th), "t%d", i);
                    before[i] = page_of(s, th);
                }
                agw_store_close(s);
                s = open_store(AGW_STORE_EMBEDDED, db_dir(), 7, 0, 100);
                for (int i = 0; i < 3; i++) {
                    json_t *after;
                    char *b, *a;
                    snprintf(th, sizeof(th), "t%d", i);
                    after = page_of(s, th);
                    b = before[i] != NULL ? json_dumps(before[i], JSON_COMPACT) : NULL;
                    a = after != NULL ? json_dumps(after, JSON_COMPACT) : NULL;
                    cr_assert((a == NULL) == (b == NULL) && (a == NULL || strcmp(a, b) == 0),
                              "seed %" PRIu64 ", step %d, thread %s:\n  before %s\n  after  %s",
                              seed, step, th, b ? b : "(none)", a ? a : "(none)");
                    free(a);
                    free(b);
                    json_decref(before[i]);
                    json_decref(after);
                }
            }
        }
        agw_store_close(s);
        snprintf(buf, sizeof(buf), "rm -rf %s", db_dir());
        cr_assert_eq(system(buf), 0); /* the next seed starts empty */
    }
}
