/* Shared definitions: error codes, the out-of-memory policy and small helpers used by every module.
 */
#ifndef AGW_COMMON_H
#define AGW_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Functions return 0 (or a count) on success and a negative AGW_E* code on failure. "Needs more
 * bytes" is not an error: incremental parsers return AGW_AGAIN. */
enum {
    AGW_EINVAL = 1, /* bad argument or malformed input */
    AGW_ENOMEM,     /* allocation refused (only where the caller chose not to abort) */
    AGW_ETOOBIG,    /* input over a configured limit */
    AGW_EPROTO,     /* peer broke the protocol */
    AGW_EIO,        /* socket or file error */
    AGW_ENOTFOUND,  /* no such object */
    AGW_ETIMEDOUT,  /* a timer expired */
    AGW_ECLOSED,    /* peer closed the connection */
};
#define AGW_AGAIN (-1000)

/* Event priorities of every event loop (event_base_priority_init(base, AGW_N_PRIORITIES); an event
 * runs only when no event of a smaller number is waiting). Everything starts at AGW_PRIO_NEW,
 * libevent's default for three levels: accepts, request heads and bodies, upstream connects, a
 * run until its first event is out. A run's upstream reads drop to AGW_PRIO_FLOWING once events
 * flow, so that streams already flowing cannot starve a new run's first event. AGW_PRIO_IDLE is
 * the read of an upstream connection waiting in its pool: a close or stray bytes reported in the
 * same look at the sockets as a new request are handled before the request can take the
 * connection (src/upstream.c, idle_unusable()). */
enum { AGW_PRIO_IDLE = 0, AGW_PRIO_NEW = 1, AGW_PRIO_FLOWING = 2, AGW_N_PRIORITIES = 3 };

#define AGW_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
/* A CPU cache line (x86-64 and most ARM cores), for prefetch hints. */
#define AGW_CACHE_LINE 64

#if defined(__GNUC__)
#define AGW_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define AGW_NORETURN     __attribute__((noreturn))
#define AGW_NOINLINE     __attribute__((noinline)) /* keeps a fast path's caller lean */
#else
#define AGW_PRINTF(f, a)
#define AGW_NORETURN
#define AGW_NOINLINE
#endif

/* Out-of-memory policy: the daemon cannot do anything useful without memory, so every allocation
 * goes through these wrappers, which log and abort() on failure. Untrusted input never decides an
 * allocation's size without first passing an explicit limit (body, header, frame and buffer
 * ceilings). */
void *agw_xmalloc(size_t n);
void *agw_xcalloc(size_t n, size_t size);
/* <n> zeroed objects of <size> bytes at an address that is a multiple of <align> (a power of two
 * dividing n * size); freed with free(). */
void *agw_xaligned_calloc(size_t align, size_t n, size_t size);
/* <n> bytes, not zeroed (a large block's pages stay untouched until written), at an address that is
 * a multiple of <align> (a power of two dividing n); freed with free(). */
void *agw_xaligned_alloc(size_t align, size_t n);
void *agw_xrealloc(void *p, size_t n);
char *agw_xstrdup(const char *s);
char *agw_xstrndup(const char *s, size_t n);

/* Monotonic clock in milliseconds and wall clock in milliseconds since the epoch. */
uint64_t agw_now_ms(void);
uint64_t agw_wall_ms(void);
/* Monotonic clock in microseconds (latency measurements). */
uint64_t agw_now_us(void);
/* The monotonic clock in milliseconds as the kernel last ticked it (CLOCK_MONOTONIC_COARSE: a few
 * milliseconds behind agw_now_ms() at most, never ahead of it, and cheaper to read: no time source
 * is read). For stamps of activity taken on every event that idle checks compare with
 * agw_now_ms(): a stamp a tick old makes a stream look idle a tick sooner, never later. */
uint64_t agw_now_ms_coarse(void);

/* Writes <nbytes_of_randomness> (at most 64) random bytes as lowercase hex plus NUL into <out>
 * (2 * n + 1 bytes): request, trace and message ids. Not for secrets: a fast generator seeded per
 * thread (and per forked child) from OpenSSL's CSPRNG. */
void agw_random_hex(char *out, size_t nbytes_of_randomness);

/* The value of one hex digit (either case), or -1. */
int agw_hexval(char c);
/* The length (2..4) of the strict UTF-8 sequence (RFC 3629) that starts at <p>, a byte >= 0x80,
 * with <end> past the last byte; 0 when it is not one: a continuation or invalid lead byte,
 * truncated, overlong, a surrogate, or past U+10FFFF. */
size_t agw_utf8_seq(const unsigned char *p, const unsigned char *end);
/* True when the <n> bytes at <s> are strict UTF-8 as agw_utf8_seq() reads it (NUL bytes are
 * ASCII). */
bool agw_utf8_valid(const void *s, size_t n);
/* Decodes exactly 2 * <n> hex digits (either case) and nothing after them from <hex> into <out>.
 * Returns 0, or -AGW_EINVAL (NULL, short, long or not hex) with <out> untouched. */
int agw_hex_decode(const char *hex, uint8_t *out, size_t n);

/* True when the comma-separated header value <value> (e.g. a Connection header) holds <token>,
 * case-insensitively, ignoring spaces and tabs around elements. <value> may be NULL. */
bool agw_header_has_token(const char *value, const char *token);

/* HTTP methods the gateway tells apart. */
enum agw_method {
    AGW_METHOD_OTHER = 0,
    AGW_METHOD_GET,
    AGW_METHOD_HEAD,
    AGW_METHOD_POST,
    AGW_METHOD_OPTIONS,
};

/* Case-insensitive ASCII comparison of <a> (length <alen>) with the NUL-terminated <b>. */
bool agw_strieq_n(const char *a, size_t alen, const char *b);
/* True when the <alen> bytes at <a> are the NUL-terminated <b> (a parser's span against a name).
 * Inline: the callers compare spans with literals, whose length the compiler knows. */
static inline bool agw_streq_n(const char *a, size_t alen, const char *b)
{
    return alen == strlen(b) && memcmp(a, b, alen) == 0;
}

/* FNV-1a: <h> (AGW_FNV_INIT to start) carried over the <len> bytes at <p>. Cheap and well spread in
 * its low bits; short inputs leave the high bits poorly mixed: finish with agw_hash_mix() where
 * they count. Not a keyed hash: whoever chooses the keys can make them collide. Inline: it runs
 * per request and per look-up. */
#define AGW_FNV_INIT 1469598103934665603ULL
static inline uint64_t agw_fnv1a(uint64_t h, const void *p, size_t len)
{
    const unsigned char *b = p;

    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}
/* splitmix64's finalizer: every bit of <h> changes about half of the result's. */
static inline uint64_t agw_hash_mix(uint64_t h)
{
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 31;
    return h;
}

/* True when the Content-Type value <content_type> (may be NULL) is text/event-stream, with or
 * without parameters. */
bool agw_is_event_stream(const char *content_type);

#endif
