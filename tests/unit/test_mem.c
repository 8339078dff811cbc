/* Tests for src/mem.c: the heap's return of freed pages runs in background threads of its own, at
 * nice 19, with jemalloc (the default build), and is not claimed with the C library's malloc (the
 * sanitized builds); agw_mem_release_own() leaves other threads' freed pages be. */
#include "config.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#ifdef HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#include "agw/mem.h"

/* How many threads of this process are named <name>; the nice value of the last in <nice>. */
static int threads_named(const char *name, int *nice)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;

    cr_assert_not_null(d);
    while ((e = readdir(d)) != NULL) {
        char path[300], comm[64] = "";
        FILE *f;

        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
        f = fopen(path, "r");
        if (f == NULL)
            continue; /* the thread ended */
        if (fgets(comm, sizeof(comm), f) != NULL)
            comm[strcspn(comm, "\n")] = '\0';
        fclose(f);
        if (strcmp(comm, name) != 0)
            continue;
        n++;
        *nice = getpriority(PRIO_PROCESS, (id_t)strtol(e->d_name, NULL, 10));
    }
    closedir(d);
    return n;
}

Test(mem, purging_runs_in_background_threads_at_nice_19)
{
    int nice = 0;
    bool on = agw_mem_purge_in_background();

#ifdef HAVE_JEMALLOC
    bool now = false;
    size_t len = sizeof(now);

    cr_assert(on, "jemalloc: its background threads start");
    cr_assert_eq(mallctl("background_thread", &now, &len, NULL, 0), 0);
    cr_assert(now, "jemalloc reports its background threads on");
    /* (the thread names itself once it runs: on a busy machine, some time after the start) */
    int n = 0;
    for (int i = 0; i < 500 && (n = threads_named("jemalloc_bg_thd", &nice)) == 0; i++)
        usleep(10000);
    cr_assert_geq(n, 1, "a background thread runs");
    cr_assert_eq(nice, 19, "it runs at nice 19, not the loops' 0 (got %d)", nice);
    cr_assert_eq(getpriority(PRIO_PROCESS, 0), 0, "the calling thread keeps its nice value");
#else
    cr_assert(!on, "the C library's malloc has no background purging to start");
    cr_assert_eq(threads_named("jemalloc_bg_thd", &nice), 0);
#endif
}

#ifdef HAVE_JEMALLOC
/* Pages of arena <a> freed and not yet handed back to the system. */
static size_t dirty_pages(unsigned a)
{
    uint64_t epoch = 1;
    size_t n = 0, len = sizeof(epoch);
    char name[64];

    cr_assert_eq(mallctl("epoch", &epoch, &len, &epoch, sizeof(epoch)), 0);
    snprintf(name, sizeof(name), "stats.arenas.%u.pdirty", a);
    len = sizeof(n);
    cr_assert_eq(mallctl(name, &n, &len, NULL, 0), 0);
    return n;
}
#endif

#ifdef HAVE_JEMALLOC
/* A thread with an arena of its own (agw_mem_own_arena()) that frees 4 MiB and waits, holding its
 * arena's dirty pages. */
struct other {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    unsigned arena;
    int state; /* 0, 1 freed, 2 may end */
};

static void *other_main(void *arg)
{
    struct other *o = arg;
    size_t len = sizeof(o->arena);
    char *p[4];

    agw_mem_own_arena(); /* as the store's writer does */
    /* (several blocks live at once: a fresh arena's only block, freed, goes back at once) */
    for (int i = 0; i < 4; i++) {
        p[i] = malloc(1 << 20);
        memset(p[i], 1, 1 << 20);
    }
    for (int i = 0; i < 4; i++)
        free(p[i]);
    mallctl("thread.arena", &o->arena, &len, NULL, 0);
    pthread_mutex_lock(&o->lock);
    o->state = 1;
    pthread_cond_broadcast(&o->cond);
    while (o->state != 2)
        pthread_cond_wait(&o->cond, &o->lock);
    pthread_mutex_unlock(&o->lock);
    return NULL;
}
#endif

/* agw_mem_release_own() (the server's, after streams shed their requests' start) hands back the
 * separate heap's freed pages and the calling thread's arena's, and leaves those of every other
 * arena to jemalloc's decay: a thread that just freed a big block (the store's writer, a text
 * buffer) takes its pages again at once, and had to fault each in anew when the release purged
 * every arena. agw_mem_release() (after a burst of connections closed) hands back all. */
Test(mem, release_own_leaves_the_other_threads_arenas_be)
{
#ifdef HAVE_JEMALLOC
    struct other o = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    unsigned mine = 0, narenas = 0;
    size_t len = sizeof(mine);
    char *p = malloc(1 << 20), *q;
    pthread_t t;

    cr_assert_not_null(p);
    memset(p, 1, 1 << 20);
    q = agw_mem_separate_alloc(1 << 20); /* (makes the separate heap's arena: the last one) */
    cr_assert_not_null(q);
    memset(q, 1, 1 << 20);
    len = sizeof(narenas); /* the separate heap's is the last, until the other thread makes one */
    cr_assert_eq(mallctl("arenas.narenas", &narenas, &len, NULL, 0), 0);
    cr_assert_eq(pthread_create(&t, NULL, other_main, &o), 0);
    pthread_mutex_lock(&o.lock);
    while (o.state != 1)
        pthread_cond_wait(&o.cond, &o.lock);
    pthread_mutex_unlock(&o.lock);
    cr_assert_eq(mallctl("thread.arena", &mine, &len, NULL, 0), 0);
    cr_assert_neq(narenas - 1, mine);
    cr_assert_neq(o.arena, mine, "the other thread has an arena of its own, however many CPUs");
    free(p);
    agw_mem_separate_free(q);
    cr_assert_geq(dirty_pages(mine), 200, "this thread's freed block is still there");
    cr_assert_geq(dirty_pages(narenas - 1), 200, "and the separate heap's");
    cr_assert_geq(dirty_pages(o.arena), 200, "and the other thread's");
    agw_mem_release_own();
    cr_assert_eq(dirty_pages(narenas - 1), 0, "the separate heap's pages are handed back");
    cr_assert_eq(dirty_pages(mine), 0, "and this thread's");
    cr_assert_geq(dirty_pages(o.arena), 200, "the other thread's stay for its next malloc()");
    agw_mem_release();
    cr_assert_eq(dirty_pages(o.arena), 0, "a release of every heap hands them back too");
    pthread_mutex_lock(&o.lock);
    o.state = 2;
    pthread_cond_broadcast(&o.cond);
    pthread_mutex_unlock(&o.lock);
    pthread_join(t, NULL);
#else
    agw_malloc_fn *m;
    agw_realloc_fn *r;
    agw_free_fn *f;
    void *p = malloc(1 << 20);

    cr_assert_not_null(p);
    free(p);
    agw_mem_release_own(); /* malloc_trim(): nothing to check but that it returns */
    agw_mem_release();
    cr_assert(!agw_mem_separate_heap(&m, &r, &f), "the C library's build has no separate heap");
#endif
}
