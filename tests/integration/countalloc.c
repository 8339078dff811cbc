/* An LD_PRELOAD library for tests/integration/alloc.sh and idle_mem.sh: counts malloc, calloc and
 * realloc calls (and jemalloc's mallocx and rallocx) of the process it is loaded into, the bytes
 * its heap blocks hold (the allocator's malloc_usable_size() of every live block), and the calls
 * of the system-call wrappers a relayed run goes through (epoll_ctl: libevent arming or disarming
 * an event; ioctl: libevent's FIONREAD before a bufferevent's read; read, readv, writev, recv,
 * epoll_wait), and apart getpeername() (libevent's resolver path asks it of each connection it
 * connects) and the printf family with inet_ntop() (FORMAT), and writes them to stderr on SIGUSR2:
 * "ALLOCATIONS <calls> LIVE <bytes> SEPARATE <mallocx calls> EPOLL_CTL <calls> IOCTL <calls>
 * SYSCALLS <all seven> BYTES <the usable sizes of every block handed out, summed> GETPEERNAME
 * <calls> FORMAT <calls, this report's own included> STRCASECMP <calls> PEEK <recv() calls with
 * MSG_PEEK>" (only the daemon's separate heap calls mallocx(), src/mem.c). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <stdarg.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

static unsigned long n_alloc;
static unsigned long n_separate; /* mallocx() calls: the daemon's separate heap (src/mem.c) */
static long live_bytes;
static unsigned long n_bytes; /* the usable size of every block handed out, summed */
static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static char early[4096]; /* dlsym() itself calls calloc() before real_calloc is known */
static size_t early_used;

/* A block of <usable> bytes was handed out. */
static void took(size_t usable)
{
    __atomic_fetch_add(&live_bytes, (long)usable, __ATOMIC_RELAXED);
    __atomic_fetch_add(&n_bytes, usable, __ATOMIC_RELAXED);
}

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
    void *p = real_malloc(n);
    if (p != NULL)
        took(malloc_usable_size(p));
    return p;
}

void *calloc(size_t a, size_t b)
{
    if (real_calloc == NULL) {
        void *p = early + early_used;
        early_used += (a * b + 15) & ~(size_t)15;
        return p; /* static storage is zeroed */
    }
    __atomic_fetch_add(&n_alloc, 1, __ATOMIC_RELAXED);
    void *p = real_calloc(a, b);
    if (p != NULL)
        took(malloc_usable_size(p));
    return p;
}

void *realloc(void *p, size_t n)
{
    if (real_realloc == NULL)
        init();
    __atomic_fetch_add(&n_alloc, 1, __ATOMIC_RELAXED);
    if (p != NULL)
        __atomic_fetch_sub(&live_bytes, (long)malloc_usable_size(p), __ATOMIC_RELAXED);
    void *q = real_realloc(p, n);
    if (q != NULL)
        took(malloc_usable_size(q));
    else if (p != NULL && n > 0) /* failed: the old block stays */
        __atomic_fetch_add(&live_bytes, (long)malloc_usable_size(p), __ATOMIC_RELAXED);
    return q;
}

/* Aligned allocations are counted too, so that their frees balance. */
int posix_memalign(void **out, size_t align, size_t n)
{
    static int (*real)(void **, size_t, size_t);
    int rc;

    if (real == NULL)
        real = dlsym(RTLD_NEXT, "posix_memalign");
    __atomic_fetch_add(&n_alloc, 1, __ATOMIC_RELAXED);
    rc = real(out, align, n);
    if (rc == 0)
        took(malloc_usable_size(*out));
    return rc;
}

void *aligned_alloc(size_t align, size_t n)
{
    void *p = NULL;

    return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, n) == 0 ? p : NULL;
}

void *memalign(size_t align, size_t n)
{
    return aligned_alloc(align, n);
}

void free(void *p)
{
    static void (*real_free)(void *);

    if ((char *)p >= early && (char *)p < early + sizeof(early))
        return;
    if (real_free == NULL)
        real_free = dlsym(RTLD_NEXT, "free");
    if (p != NULL)
        __atomic_fetch_sub(&live_bytes, (long)malloc_usable_size(p), __ATOMIC_RELAXED);
    real_free(p);
}

/* jemalloc's own entry points: the daemon's allocator when it is built with jemalloc, whose
 * separate heap (src/mem.c) allocates through them. Counted as malloc, realloc and free are. */
void *mallocx(size_t n, int flags)
{
    static void *(*real)(size_t, int);
    void *p;

    if (real == NULL)
        real = (void *(*)(size_t, int))dlsym(RTLD_NEXT, "mallocx");
    __atomic_fetch_add(&n_alloc, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&n_separate, 1, __ATOMIC_RELAXED);
    p = real(n, flags);
    if (p != NULL)
        took(malloc_usable_size(p));
    return p;
}

void *rallocx(void *p, size_t n, int flags)
{
    static void *(*real)(void *, size_t, int);
    size_t old = malloc_usable_size(p);
    void *q;

    if (real == NULL)
        real = (void *(*)(void *, size_t, int))dlsym(RTLD_NEXT, "rallocx");
    __atomic_fetch_add(&n_alloc, 1, __ATOMIC_RELAXED);
    q = real(p, n, flags);
    if (q != NULL) { /* else the old block stays */
        __atomic_fetch_sub(&live_bytes, (long)old, __ATOMIC_RELAXED);
        took(malloc_usable_size(q));
    }
    return q;
}

void dallocx(void *p, int flags)
{
    static void (*real)(void *, int);

    if (real == NULL)
        real = (void (*)(void *, int))dlsym(RTLD_NEXT, "dallocx");
    __atomic_fetch_sub(&live_bytes, (long)malloc_usable_size(p), __ATOMIC_RELAXED);
    real(p, flags);
}

void sdallocx(void *p, size_t n, int flags)
{
    static void (*real)(void *, size_t, int);

    if (real == NULL)
        real = (void (*)(void *, size_t, int))dlsym(RTLD_NEXT, "sdallocx");
    __atomic_fetch_sub(&live_bytes, (long)malloc_usable_size(p), __ATOMIC_RELAXED);
    real(p, n, flags);
}

static unsigned long n_epoll_ctl, n_ioctl, n_syscalls, n_peek;

/* In a wrapper of <name>: <real>, the next definition (libc's), and the call counted. */
#define REAL(name)                                                                                 \
    static __typeof__(name) *real;                                                                 \
    if (real == NULL)                                                                              \
        real = (__typeof__(name) *)dlsym(RTLD_NEXT, #name);                                        \
    __atomic_fetch_add(&n_syscalls, 1, __ATOMIC_RELAXED)

int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
    REAL(epoll_ctl);
    __atomic_fetch_add(&n_epoll_ctl, 1, __ATOMIC_RELAXED);
    return real(epfd, op, fd, ev);
}

int ioctl(int fd, unsigned long req, ...)
{
    va_list ap;
    void *arg;

    va_start(ap, req);
    arg = va_arg(ap, void *);
    va_end(ap);
    REAL(ioctl);
    __atomic_fetch_add(&n_ioctl, 1, __ATOMIC_RELAXED);
    return real(fd, req, arg);
}

ssize_t read(int fd, void *buf, size_t len)
{
    REAL(read);
    return real(fd, buf, len);
}

ssize_t readv(int fd, const struct iovec *iov, int n)
{
    REAL(readv);
    return real(fd, iov, n);
}

ssize_t writev(int fd, const struct iovec *iov, int n)
{
    REAL(writev);
    return real(fd, iov, n);
}

ssize_t recv(int fd, void *buf, size_t len, int flags)
{
    REAL(recv);
    if (flags & MSG_PEEK)
        __atomic_fetch_add(&n_peek, 1, __ATOMIC_RELAXED);
    return real(fd, buf, len, flags);
}

int epoll_wait(int epfd, struct epoll_event *evs, int max, int timeout)
{
    REAL(epoll_wait);
    return real(epfd, evs, max, timeout);
}

static unsigned long n_getpeername, n_format;

/* The printf family, as the daemon and its libraries call it (through the PLT: glibc's own
 * calls inside itself are not seen), and inet_ntop(), which formats with it. */
#define FORMAT_WRAPPER(name, ...)                                                                  \
    {                                                                                              \
        static __typeof__(name) *real;                                                             \
        if (real == NULL)                                                                          \
            real = (__typeof__(name) *)dlsym(RTLD_NEXT, #name);                                    \
        __atomic_fetch_add(&n_format, 1, __ATOMIC_RELAXED);                                        \
        return real(__VA_ARGS__);                                                                  \
    }

int vsnprintf(char *s, size_t n, const char *fmt, va_list ap)
    FORMAT_WRAPPER(vsnprintf, s, n, fmt, ap) int __vsnprintf_chk(char *s, size_t n, int flag,
                                                                 size_t slen, const char *fmt,
                                                                 va_list ap)
        FORMAT_WRAPPER(__vsnprintf_chk, s, n, flag, slen, fmt,
                       ap) int vsprintf(char *s, const char *fmt, va_list ap)
            FORMAT_WRAPPER(vsprintf, s, fmt, ap) int __vsprintf_chk(char *s, int flag, size_t slen,
                                                                    const char *fmt, va_list ap)
                FORMAT_WRAPPER(__vsprintf_chk, s, flag, slen, fmt, ap) const
    char *inet_ntop(int af, const void *src, char *dst, socklen_t size)
        FORMAT_WRAPPER(inet_ntop, af, src, dst, size)

            int snprintf(char *s, size_t n, const char *fmt, ...)
{
    va_list ap;
    int r;

    va_start(ap, fmt);
    r = vsnprintf(s, n, fmt, ap); /* counted there */
    va_end(ap);
    return r;
}

int __snprintf_chk(char *s, size_t n, int flag, size_t slen, const char *fmt, ...)
{
    va_list ap;
    int r;

    va_start(ap, fmt);
    r = __vsnprintf_chk(s, n, flag, slen, fmt, ap);
    va_end(ap);
    return r;
}

int sprintf(char *s, const char *fmt, ...)
{
    va_list ap;
    int r;

    va_start(ap, fmt);
    r = vsprintf(s, fmt, ap);
    va_end(ap);
    return r;
}

int __sprintf_chk(char *s, int flag, size_t slen, const char *fmt, ...)
{
    va_list ap;
    int r;

    va_start(ap, fmt);
    r = __vsprintf_chk(s, flag, slen, fmt, ap);
    va_end(ap);
    return r;
}

int getpeername(int fd, struct sockaddr *addr, socklen_t *len)
{
    static __typeof__(getpeername) *real;

    if (real == NULL)
        real = (__typeof__(getpeername) *)dlsym(RTLD_NEXT, "getpeername");
    __atomic_fetch_add(&n_getpeername, 1, __ATOMIC_RELAXED);
    return real(fd, addr, len);
}

static unsigned long n_strcasecmp;

/* Header names compared (libevhtp's evhtp_kv_find() calls strcasecmp() on every field it passes).
 */
int strcasecmp(const char *a, const char *b)
{
    static __typeof__(strcasecmp) *real;

    if (real == NULL)
        real = (__typeof__(strcasecmp) *)dlsym(RTLD_NEXT, "strcasecmp");
    __atomic_fetch_add(&n_strcasecmp, 1, __ATOMIC_RELAXED);
    return real(a, b);
}

int strncasecmp(const char *a, const char *b, size_t n)
{
    static __typeof__(strncasecmp) *real;

    if (real == NULL)
        real = (__typeof__(strncasecmp) *)dlsym(RTLD_NEXT, "strncasecmp");
    __atomic_fetch_add(&n_strcasecmp, 1, __ATOMIC_RELAXED);
    return real(a, b, n);
}

static void dump(int sig)
{
    char b[320];
    int k = snprintf(b, sizeof(b),
                     "ALLOCATIONS %lu LIVE %ld SEPARATE %lu EPOLL_CTL %lu IOCTL %lu SYSCALLS %lu "
                     "BYTES %lu GETPEERNAME %lu FORMAT %lu STRCASECMP %lu PEEK %lu\n",
                     n_alloc, live_bytes, n_separate, n_epoll_ctl, n_ioctl, n_syscalls, n_bytes,
                     n_getpeername, n_format, n_strcasecmp, n_peek);

    (void)sig;
    if (write(2, b, (size_t)k) < 0)
        return;
}

__attribute__((constructor)) static void start(void)
{
    signal(SIGUSR2, dump);
}
