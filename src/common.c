/* Shared helpers: allocation with the abort-on-OOM policy, clocks, random ids. */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/rand.h>

#include "agw/common.h"

static AGW_NORETURN void oom(size_t n)
{
    /* No allocation here: the message is a fixed string plus a number. */
    fprintf(stderr, "agui-gateway: out of memory allocating %zu bytes\n", n);
    abort();
}

void *agw_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL)
        oom(n);
    return p;
}

void *agw_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL)
        oom(n * size);
    return p;
}

void *agw_xaligned_alloc(size_t align, size_t n)
{
    void *p = aligned_alloc(align, n);
    if (p == NULL)
        oom(n);
    return p;
}

void *agw_xaligned_calloc(size_t align, size_t n, size_t size)
{
    return memset(agw_xaligned_alloc(align, n * size), 0, n * size);
}

void *agw_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL)
        oom(n);
    return q;
}

char *agw_xstrdup(const char *s)
{
    return agw_xstrndup(s, strlen(s));
}

char *agw_xstrndup(const char *s, size_t n)
{
    char *p = agw_xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

uint64_t agw_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t agw_now_ms_coarse(void)
{
#ifdef CLOCK_MONOTONIC_COARSE
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
#else
    return agw_now_ms();
#endif
}

uint64_t agw_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t agw_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Ids, not secrets: xoshiro256** (Blackman and Vigna), seeded per thread from the CSPRNG on first
 * use and again in a forked child. A trace id per request was two RAND_bytes() calls, each through
 * OpenSSL's provider and its locks: 4 % of the gateway's CPU at many short runs. */
static _Thread_local uint64_t rng_s[4];
static _Thread_local bool rng_seeded;

static void rng_forget(void)
{
    rng_seeded = false;
}

static void rng_register_fork(void)
{
    (void)pthread_atfork(NULL, NULL, rng_forget);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static void rng_seed(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;

    if (RAND_bytes((unsigned char *)rng_s, sizeof(rng_s)) != 1) {
        /* The CSPRNG failing is not recoverable for id generation: the clock and this thread's
         * address keep ids unique enough for logs and traces. */
        uint64_t t = agw_wall_ms() ^ (agw_now_ms() << 20) ^ (uint64_t)(uintptr_t)&rng_s;
        for (size_t i = 0; i < 4; i++) {
            t += 0x9e3779b97f4a7c15ULL; /* splitmix64 */
            uint64_t z = t;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
            rng_s[i] = z ^ (z >> 31);
        }
    }
    if ((rng_s[0] | rng_s[1] | rng_s[2] | rng_s[3]) == 0)
        rng_s[0] = 1; /* the one state xoshiro cannot leave */
    rng_seeded = true;
    (void)pthread_once(&once, rng_register_fork);
}

static uint64_t rng_next(void)
{
    uint64_t r, t;

    if (!rng_seeded)
        rng_seed();
    r = rotl(rng_s[1] * 5, 7) * 9;
    t = rng_s[1] << 17;
    rng_s[2] ^= rng_s[0];
    rng_s[3] ^= rng_s[1];
    rng_s[1] ^= rng_s[2];
    rng_s[0] ^= rng_s[3];
    rng_s[2] ^= t;
    rng_s[3] = rotl(rng_s[3], 45);
    return r;
}

void agw_random_hex(char *out, size_t nbytes)
{
    static const char hex[] = "0123456789abcdef";
    uint64_t w = 0;

    if (nbytes > 64)
        nbytes = 64;
    for (size_t i = 0; i < nbytes; i++) {
        if (i % 8 == 0)
            w = rng_next();
        out[2 * i] = hex[(w >> 4) & 15];
        out[2 * i + 1] = hex[w & 15];
        w >>= 8;
    }
    out[2 * nbytes] = '\0';
}

bool agw_strieq_n(const char *a, size_t alen, const char *b)
{
    size_t i;

    for (i = 0; i < alen; i++) {
        unsigned char ca = (unsigned char)a[i], cb = (unsigned char)b[i];
        if (cb == '\0')
            return false;
        if (ca >= 'A' && ca <= 'Z')
            ca = (unsigned char)(ca - 'A' + 'a');
        if (cb >= 'A' && cb <= 'Z')
            cb = (unsigned char)(cb - 'A' + 'a');
        if (ca != cb)
            return false;
    }
    return b[i] == '\0';
}

size_t agw_utf8_seq(const unsigned char *p, const unsigned char *end)
{
    unsigned char c = p[0];
    uint32_t cp;
    size_t n;

    if (c >= 0xc2 && c <= 0xdf)
        n = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, cp = c & 0x07;
    else
        return 0;
    if ((size_t)(end - p) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

bool agw_utf8_valid(const void *s, size_t n)
{
    const unsigned char *p = s;

    for (size_t i = 0, len; i < n; i += len)
        if ((len = p[i] < 0x80 ? 1 : agw_utf8_seq(p + i, p + n)) == 0)
            return false;
    return true;
}

int agw_hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

bool agw_header_has_token(const char *value, const char *token)
{
    size_t tl = strlen(token);

    for (const char *p = value; p != NULL && *p != '\0';) {
        const char *end, *e;
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        end = p;
        while (*end != '\0' && *end != ',')
            end++;
        e = end;
        while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        if ((size_t)(e - p) == tl && agw_strieq_n(p, tl, token))
            return true;
        p = end;
    }
    return false;
}

bool agw_is_event_stream(const char *ct)
{
    static const char want[] = "text/event-stream";
    size_t n = sizeof(want) - 1;

    if (ct == NULL || strlen(ct) < n || !agw_strieq_n(ct, n, want))
        return false;
    return ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ';
}

int agw_hex_decode(const char *hex, uint8_t *out, size_t n)
{
    uint8_t tmp[64];

    if (hex == NULL || n > sizeof(tmp))
        return -AGW_EINVAL;
    for (size_t i = 0; i < n; i++) {
        int hi, lo;
        /* hex[2i] is checked before hex[2i+1] is read, so a short string stops at its NUL. */
        if ((hi = agw_hexval(hex[2 * i])) < 0 || (lo = agw_hexval(hex[2 * i + 1])) < 0)
            return -AGW_EINVAL;
        tmp[i] = (uint8_t)(hi << 4 | lo);
    }
    if (hex[2 * n] != '\0')
        return -AGW_EINVAL;
    memcpy(out, tmp, n);
    return 0;
}
