/* The process's heap: see include/agw/mem.h. */
#include "config.h"

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef HAVE_MALLOC_H
#include <malloc.h>
#endif
#ifdef HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif
#ifdef HAVE_VALGRIND_VALGRIND_H
#include <valgrind/valgrind.h>
#endif

#include "agw/common.h"
#include "agw/mem.h"

#ifdef HAVE_JEMALLOC

/* The separate heap: an arena of its own, and a thread cache of its own on each thread. The
 * thread's default cache is shared by every arena: a block of the separate heap freed into it would
 * be handed to a later malloc(), maybe for a long-lived object, which would keep the separate
 * heap's page resident. Without any cache, each allocation would take the arena's lock (about 95 ns
 * a malloc/free pair here, against 10 with a cache: 4 µs per short run). Blocks of the main heap
 * freed here (libevhtp's parser, libevent's objects freed in a section) pass through that cache and
 * go back to their own arena when it overflows: a bounded amount, a few hundred KiB per thread at
 * most. */
static unsigned sep_arena;
static bool sep_ok;
static pthread_once_t sep_once = PTHREAD_ONCE_INIT;
static pthread_key_t sep_key;             /* destroys a thread's cache when the thread ends */
static _Thread_local unsigned sep_tcache; /* this thread's cache + 1; 0 before its first use */

static void sep_tcache_destroy(void *v)
{
    unsigned tc = (unsigned)(uintptr_t)v - 1;

    mallctl("tcache.destroy", NULL, NULL, &tc, sizeof(tc));
    sep_tcache = 0; /* runs on the ending thread: a later use there makes a new one */
}

static void sep_init(void)
{
    size_t len = sizeof(sep_arena);

#ifdef HAVE_VALGRIND_VALGRIND_H
    /* Valgrind replaces malloc() and free(), not jemalloc's own entry points: a block that one
     * allocated and the other freed would be a crash. Under valgrind: one heap. */
    if (RUNNING_ON_VALGRIND)
        return;
#endif
    if (pthread_key_create(&sep_key, sep_tcache_destroy) != 0)
        return;
    if (mallctl("arenas.create", &sep_arena, &len, NULL, 0) != 0)
        return;
    sep_ok = true;
}

/* The MALLOCX_TCACHE flag of this thread's cache (made on first use), or no cache if none can be
 * made. */
static int sep_cache_flag(void)
{
    if (sep_tcache == 0) {
        unsigned tc;
        size_t len = sizeof(tc);

        if (mallctl("tcache.create", &tc, &len, NULL, 0) != 0)
            return MALLOCX_TCACHE_NONE;
        sep_tcache = tc + 1;
        pthread_setspecific(sep_key, (void *)(uintptr_t)sep_tcache);
    }
    return MALLOCX_TCACHE(sep_tcache - 1);
}

/* mallocx() and rallocx() take no size 0. */
static void *sep_malloc(size_t n)
{
    return mallocx(n > 0 ? n : 1, (int)MALLOCX_ARENA(sep_arena) | sep_cache_flag());
}

/* dallocx() finds any block's arena itself: this also frees blocks malloc() returned. */
static void sep_free(void *p)
{
    if (p != NULL)
        dallocx(p, sep_cache_flag());
}

static void *sep_realloc(void *p, size_t n)
{
    if (p == NULL)
        return sep_malloc(n);
    if (n == 0) {
        sep_free(p);
        return NULL;
    }
    return rallocx(p, n, (int)MALLOCX_ARENA(sep_arena) | sep_cache_flag());
}

bool agw_mem_separate_heap(agw_malloc_fn **malloc_fn, agw_realloc_fn **realloc_fn,
                           agw_free_fn **free_fn)
{
    pthread_once(&sep_once, sep_init);
    if (!sep_ok)
        return false;
    *malloc_fn = sep_malloc;
    *realloc_fn = sep_realloc;
    *free_fn = sep_free;
    return true;
}

void *agw_mem_separate_alloc(size_t n)
{
    void *p;

    pthread_once(&sep_once, sep_init);
    if (!sep_ok)
        return agw_xmalloc(n);
    p = sep_malloc(n);
    if (p == NULL) /* the policy of agw_xmalloc() */
        return agw_xmalloc(n);
    return p;
}

void agw_mem_separate_free(void *p)
{
    if (sep_ok)
        sep_free(p); /* any jemalloc block, separate heap or not */
    else
        free(p);
}

/* Sections (agw_mem_separate_enter()): their depth on this thread. */
static _Thread_local unsigned sep_depth;

static void *lev_malloc(size_t n)
{
    return sep_depth > 0 ? sep_malloc(n) : malloc(n);
}

/* A block being grown stays with its heap's allocator (realloc() may move it to the main heap). */
static void *lev_realloc(void *p, size_t n)
{
    if (p == NULL)
        return lev_malloc(n);
    return realloc(p, n);
}

static void lev_free(void *p)
{
    if (sep_depth > 0)
        sep_free(p);
    else
        free(p);
}

bool agw_mem_libevent_functions(agw_malloc_fn **malloc_fn, agw_realloc_fn **realloc_fn,
                                agw_free_fn **free_fn)
{
    pthread_once(&sep_once, sep_init);
    if (!sep_ok)
        return false;
    *malloc_fn = lev_malloc;
    *realloc_fn = lev_realloc;
    *free_fn = lev_free;
    return true;
}

void agw_mem_separate_enter(void)
{
    sep_depth++;
}

void agw_mem_separate_leave(void)
{
    sep_depth--;
}

unsigned agw_mem_separate_suspend(void)
{
    unsigned saved = sep_depth;

    sep_depth = 0;
    return saved;
}

void agw_mem_separate_resume(unsigned saved)
{
    sep_depth = saved;
}

/* The calling thread's separate cache back to its arenas, then the dirty pages of arena <a> and,
 * unless it is UINT_MAX, arena <b> purged. */
static void release_arenas(unsigned a, unsigned b)
{
    char name[64];

    if (sep_tcache != 0) { /* what this thread's separate cache holds goes back to its arenas */
        unsigned tc = sep_tcache - 1;

        mallctl("tcache.flush", NULL, NULL, &tc, sizeof(tc));
    }
    snprintf(name, sizeof(name), "arena.%u.purge", a);
    mallctl(name, NULL, NULL, NULL, 0);
    if (b != UINT_MAX) {
        snprintf(name, sizeof(name), "arena.%u.purge", b);
        mallctl(name, NULL, NULL, NULL, 0);
    }
}

void agw_mem_own_arena(void)
{
    unsigned a;
    size_t len = sizeof(a);

#ifdef HAVE_VALGRIND_VALGRIND_H
    if (RUNNING_ON_VALGRIND)
        return;
#endif
    if (mallctl("arenas.create", &a, &len, NULL, 0) == 0)
        mallctl("thread.arena", NULL, NULL, &a, sizeof(a));
}

void agw_mem_release(void)
{
    release_arenas((unsigned)MALLCTL_ARENAS_ALL, UINT_MAX);
}

void agw_mem_release_own(void)
{
    unsigned mine;
    size_t len = sizeof(mine);

    pthread_once(&sep_once, sep_init);
    if (!sep_ok || mallctl("thread.arena", &mine, &len, NULL, 0) != 0)
        release_arenas((unsigned)MALLCTL_ARENAS_ALL, UINT_MAX);
    else
        release_arenas(sep_arena, mine != sep_arena ? mine : UINT_MAX);
}

void agw_mem_release_arena(void)
{
    unsigned mine;
    size_t len = sizeof(mine);

    mallctl("thread.tcache.flush", NULL, NULL, NULL, 0);
    if (mallctl("thread.arena", &mine, &len, NULL, 0) == 0)
        release_arenas(mine, UINT_MAX);
}

/* jemalloc gives freed pages back to the system (madvise()) in the thread that frees, whenever
 * its decay is due: a loop that freed the last blocks of a page run could spend milliseconds in
 * the kernel, once caught at 6 to 8 ms under a relaying load with thread history on (a watchdog
 * thread reading the loop's kernel stack). Its background threads do that work instead. They are
 * started from a thread of ours at nice 19 (threads inherit their creator's nice value, and a
 * process may not raise its own priority again): purging yields to the event loops as the store's
 * writer does. */
static void *bg_starter(void *arg)
{
    bool *on = arg;
    bool yes = true;

    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
    *on = mallctl("background_thread", NULL, NULL, &yes, sizeof(yes)) == 0;
    return NULL;
}

bool agw_mem_purge_in_background(void)
{
    pthread_t t;
    bool on = false;

#ifdef HAVE_VALGRIND_VALGRIND_H
    if (RUNNING_ON_VALGRIND) /* valgrind's malloc() is not jemalloc's: nothing to purge */
        return false;
#endif
    if (pthread_create(&t, NULL, bg_starter, &on) != 0)
        return false;
    pthread_join(t, NULL);
    return on;
}

static char version[96];
static pthread_once_t version_once = PTHREAD_ONCE_INIT;

static void version_init(void)
{
    const char *v = NULL;
    size_t len = sizeof(v);

    if (mallctl("version", (void *)&v, &len, NULL, 0) == 0 && v != NULL)
        snprintf(version, sizeof(version), "jemalloc %s", v);
    else
        snprintf(version, sizeof(version), "jemalloc");
}

const char *agw_mem_allocator(void)
{
    pthread_once(&version_once, version_init);
    return version;
}

#else /* the C library's malloc */

bool agw_mem_separate_heap(agw_malloc_fn **malloc_fn, agw_realloc_fn **realloc_fn,
                           agw_free_fn **free_fn)
{
    (void)malloc_fn;
    (void)realloc_fn;
    (void)free_fn;
    return false;
}

void *agw_mem_separate_alloc(size_t n)
{
    return agw_xmalloc(n);
}

void agw_mem_separate_free(void *p)
{
    free(p);
}

bool agw_mem_libevent_functions(agw_malloc_fn **malloc_fn, agw_realloc_fn **realloc_fn,
                                agw_free_fn **free_fn)
{
    (void)malloc_fn;
    (void)realloc_fn;
    (void)free_fn;
    return false;
}

void agw_mem_separate_enter(void)
{
}

void agw_mem_separate_leave(void)
{
}

unsigned agw_mem_separate_suspend(void)
{
    return 0;
}

void agw_mem_separate_resume(unsigned saved)
{
    (void)saved;
}

/* Built with AddressSanitizer, the C library's heap is not the one in use: its malloc_trim() walks
 * arenas ASan never set up (it crashed so in a sanitized run of tests/integration/workers.sh). */
#if defined(__SANITIZE_ADDRESS__)
#define AGW_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AGW_ASAN 1
#endif
#endif

void agw_mem_release(void)
{
#if defined(HAVE_MALLOC_TRIM) && !defined(AGW_ASAN)
    malloc_trim(0);
#endif
}

void agw_mem_release_own(void)
{
    agw_mem_release();
}

void agw_mem_release_arena(void)
{
    agw_mem_release();
}

void agw_mem_own_arena(void)
{
}

bool agw_mem_purge_in_background(void)
{
    return false;
}

const char *agw_mem_allocator(void)
{
    return "libc";
}

#endif
