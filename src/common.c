/* Shared helpers: allocation with the abort-on-OOM policy, clocks, random ids. */
#include "config.h"

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

uint64_t agw_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void agw_random_hex(char *out, size_t nbytes)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[64];

    if (nbytes > sizeof(raw))
        nbytes = sizeof(raw);
    if (RAND_bytes(raw, (int)nbytes) != 1) {
        /* The CSPRNG failing is not recoverable for id generation; fall back to the clock so ids
         * stay unique enough for logs (they are never secrets). */
        uint64_t t = agw_now_ms() ^ (uint64_t)(uintptr_t)out;
        for (size_t i = 0; i < nbytes; i++)
            raw[i] = (unsigned char)(t >> ((i % 8) * 8)) ^ (unsigned char)i;
    }
    for (size_t i = 0; i < nbytes; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
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
