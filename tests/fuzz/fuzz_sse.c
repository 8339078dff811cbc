/* libFuzzer driver for src/sse.c. The input is an upstream byte stream; its first two bytes choose
 * the frame limit and how the rest is cut into reads. The stream is parsed whole, byte by byte, in
 * the chosen chunks and through an evbuffer of many segments: every way must dispatch the same
 * frames and end with the same result (the parser is split-invariant), and a dispatched frame must
 * respect the limit.
 *
 *   clang -fsanitize=fuzzer,address -Iinclude -I_build src/sse.c src/common.c \
 *       tests/fuzz/fuzz_sse.c $(pkg-config --cflags --libs libevent openssl)
 *   ./a.out tests/fuzz/corpus/sse */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "agw/sse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct log {
    char *p;
    size_t len;
    size_t max_frame;
};

static void log_add(struct log *l, const void *s, size_t n)
{
    l->p = agw_xrealloc(l->p, l->len + n + 1);
    memcpy(l->p + l->len, s, n);
    l->len += n;
}

static int on_frame(void *arg, const struct agw_sse_frame *f)
{
    struct log *l = arg;
    char hdr[64];

    if (f->data == NULL)
        abort();
    if (l->max_frame > 0 && f->data_len > l->max_frame)
        abort();
    snprintf(hdr, sizeof(hdr), "%zu:%ld:%c%c:", f->data_len, f->retry, f->event ? 'e' : '-',
             f->id ? 'i' : '-');
    log_add(l, hdr, strlen(hdr));
    log_add(l, f->data, f->data_len);
    if (f->event)
        log_add(l, f->event, strlen(f->event) + 1);
    if (f->id)
        log_add(l, f->id, strlen(f->id) + 1);
    /* A data line "stop" makes the callback fail: the error must be propagated the same way. */
    if (f->data_len == 4 && memcmp(f->data, "stop", 4) == 0)
        return -99;
    return 0;
}

/* Parses <s> in reads of the lengths drawn from <seed> (0 = whole, 1 = byte by byte). */
static int run(const char *s, size_t n, size_t max_frame, unsigned seed, struct log *l)
{
    struct agw_sse_parser *p = agw_sse_parser_new(max_frame);
    size_t at = 0;
    int rc = 0;

    l->max_frame = max_frame;
    while (at < n) {
        size_t k = n - at;

        if (seed == 1) {
            k = 1;
        } else if (seed > 1) {
            seed = seed * 1103515245u + 12345u;
            k = 1 + (seed >> 16) % 17;
            if (k > n - at)
                k = n - at;
        }
        if ((rc = agw_sse_parse_bytes(p, s + at, k, on_frame, l)) < 0)
            goto out;
        at += k;
    }
    rc = agw_sse_finish(p, on_frame, l);
out:
    agw_sse_parser_free(p);
    return rc < 0 ? rc : 0;
}

static int run_evbuffer(const char *s, size_t n, size_t max_frame, struct log *l)
{
    struct agw_sse_parser *p = agw_sse_parser_new(max_frame);
    struct evbuffer *in = evbuffer_new();
    int rc;

    l->max_frame = max_frame;
    for (size_t at = 0; at < n; at += 3)
        evbuffer_add_reference(in, s + at, n - at < 3 ? n - at : 3, NULL, NULL);
    rc = agw_sse_parse(p, in, on_frame, l);
    if (evbuffer_get_length(in) != 0)
        abort();
    if (rc >= 0)
        rc = agw_sse_finish(p, on_frame, l);
    evbuffer_free(in);
    agw_sse_parser_free(p);
    return rc < 0 ? rc : 0;
}

static void same(const struct log *a, int arc, const struct log *b, int brc)
{
    if (arc != brc || a->len != b->len || (a->len > 0 && memcmp(a->p, b->p, a->len) != 0))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct log whole = {0}, other = {0};
    const char *s;
    size_t n, max_frame;
    unsigned seed;
    int rc, rc2;

    if (size < 2)
        return 0;
    max_frame = data[0] < 128 ? 0 : (size_t)(data[0] - 127);
    seed = 2u + data[1];
    s = (const char *)data + 2;
    n = size - 2;

    rc = run(s, n, max_frame, 0, &whole);
    rc2 = run(s, n, max_frame, 1, &other);
    same(&whole, rc, &other, rc2);
    free(other.p);
    other = (struct log){0};
    rc2 = run(s, n, max_frame, seed, &other);
    same(&whole, rc, &other, rc2);
    free(other.p);
    other = (struct log){0};
    rc2 = run_evbuffer(s, n, max_frame, &other);
    same(&whole, rc, &other, rc2);
    free(other.p);
    free(whole.p);
    return 0;
}
