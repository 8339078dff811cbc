/* An LD_PRELOAD library for tests/integration/alloc.sh: counts malloc, calloc and realloc calls of
 * the process it is loaded into, and writes the counts to stderr on SIGUSR2. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static unsigned long n_alloc;
static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static char early[4096]; /* dlsym() itself calls calloc() before real_calloc is known */
static size_t early_used;

static void init(void)
{
    real_malloc = dlsym(RTLD_NEXT, "malloc");
    real_calloc = dlsym(RTLD_NEXT, "calloc");
    real_realloc = dlsym(RTLD_NEXT, "realloc");
}

void *malloc(size_t n)
{
    if (real_malloc == NULL)
        init();
    __atomic_fetch_add(&n_alloc, 1, __ATOMIC_RELAXED);
    return real_malloc(n);
}

void *calloc(size_t a, size_t b)
{
    if (real_calloc == NULL) {
        void *p = early + early_used;
        early_used += (a * b + 15) & ~(size_t)15;
        return p; /* static storage is zeroed */
    }
    __atomic_fetch_add(&n_alloc, 1, __ATOMIC_RELAXED);
    return real_calloc(a, b);
}

void *realloc(void *p, size_t n)
{
    if (real_realloc == NULL)
        init();
    __atomic_fetch_add(&n_alloc, 1, __ATOMIC_RELAXED);
    return real_realloc(p, n);
}

void free(void *p)
{
    static void (*real_free)(void *);

    if ((char *)p >= early && (char *)p < early + sizeof(early))
        return;
    if (real_free == NULL)
        real_free = dlsym(RTLD_NEXT, "free");
    real_free(p);
}

static void dump(int sig)
{
    char b[64];
    int k = snprintf(b, sizeof(b), "ALLOCATIONS %lu\n", n_alloc);

    (void)sig;
    if (write(2, b, (size_t)k) < 0)
        return;
}

__attribute__((constructor)) static void start(void)
{
    signal(SIGUSR2, dump);
}
