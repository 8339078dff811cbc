/* libFuzzer driver for src/http1.c. The input is what an upstream sends on one connection; its
 * first two bytes choose max_head and how the rest is cut into reads. The stream is parsed as a
 * sequence of pipelined responses whole, byte by byte, in the chosen reads, and from an evbuffer of
 * many small segments, and byte by byte and in the chosen reads with body reads decoded in place as
 * memory blocks: every way must log the same heads, the same decoded body bytes and the same
 * results (the parser is split-invariant). Invariants of a parsed head are checked on the way.
 *
 *   clang -fsanitize=fuzzer,address,undefined -Iinclude -I_build src/http1.c src/common.c \
 *       tests/fuzz/fuzz_http1.c $(pkg-config --cflags --libs libevent openssl)
 *   ./a.out tests/fuzz/corpus/http1 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "agw/http1.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_RESPONSES 64 /* per input: pipelining is bounded by the input anyway */

struct log {
    char *p;
    size_t len;
};

static void log_add(struct log *l, const void *s, size_t n)
{
    l->p = agw_xrealloc(l->p, l->len + n + 1);
    memcpy(l->p + l->len, s, n);
    l->len += n;
}

static void log_rc(struct log *l, char what, int rc)
{
    char s[32];

    snprintf(s, sizeof(s), "|%c%d|", what, rc);
    log_add(l, s, strlen(s));
}

static void check_head(const struct agw_http1_response *r, size_t max_head)
{
    if (r->status < 200 || r->status > 599 || (r->minor_version != 0 && r->minor_version != 1))
        abort();
    if ((r->body == AGW_HTTP1_BODY_NONE) != (r->status == 204 || r->status == 304))
        abort();
    if (r->body == AGW_HTTP1_BODY_CLOSE && r->keep_alive)
        abort();
    if (r->body != AGW_HTTP1_BODY_LENGTH && r->content_length != 0)
        abort();
    if (r->content_type != NULL) {
        size_t n = strlen(r->content_type);
        if (n >= max_head)
            abort();
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)r->content_type[i] < 0x20 && r->content_type[i] != '\t')
                abort();
    }
}

static void log_head(struct log *l, const struct agw_http1_response *r)
{
    char s[96];

    snprintf(s, sizeof(s), "|H%d.%d:%d:%d:%llu:%c:", r->minor_version, r->status, (int)r->body,
             r->keep_alive, (unsigned long long)r->content_length, r->content_type ? 't' : '-');
    log_add(l, s, strlen(s));
    if (r->content_type != NULL)
        log_add(l, r->content_type, strlen(r->content_type) + 1);
}

/* After a body parse that returned <rc>: logs it. Returns -1 to stop, 1 when the response ended
 * (the next head follows), 0 to go on. */
static int body_done(struct agw_http1_parser *p, struct log *l, int rc, int responses)
{
    if (rc == 0)
        return 0;
    log_rc(l, 'b', rc);
    if (rc < 0 || responses == MAX_RESPONSES)
        return -1;
    /* Alternate between an explicit reset and parse_head()'s implicit one. */
    if (responses % 2 == 0)
        agw_http1_parser_reset(p);
    return 1;
}

/* Parses the responses in <s>, reading it in pieces drawn from <seed> (0 = whole, 1 = byte by
 * byte), or, with <segments>, from one evbuffer of 3-byte references. With <blocks>, a read that
 * arrives in a body with nothing waiting goes to agw_http1_decode_body() as a memory block. */
static void run(const char *s, size_t n, size_t max_head, unsigned seed, bool segments, bool blocks,
                struct log *l)
{
    struct agw_http1_parser *p = agw_http1_parser_new(max_head);
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
    struct agw_http1_response resp = {0};
    bool in_body = false;
    int responses = 0;
    size_t at = 0;
    int rc;

    if (segments) {
        for (; at < n; at += 3)
            evbuffer_add_reference(in, s + at, n - at < 3 ? n - at : 3, NULL, NULL);
        at = n;
    }
    for (;;) {
        if (!in_body) {
            rc = agw_http1_parse_head(p, in, &resp);
            if (rc == 0) {
                check_head(&resp, max_head);
                log_head(l, &resp);
                agw_http1_response_clear(&resp);
                in_body = true;
                responses++;
            } else if (rc != AGW_AGAIN) {
                log_rc(l, 'h', rc);
                goto out;
            }
        }
        if (in_body) {
            size_t before = evbuffer_get_length(in);
            rc = agw_http1_parse_body(p, in, out);
            if (evbuffer_get_length(out) > before)
                abort(); /* decoding never grows the bytes */
            while (evbuffer_get_length(out) > 0) {
                struct evbuffer_iovec v;
                evbuffer_peek(out, -1, NULL, &v, 1);
                log_add(l, v.iov_base, v.iov_len);
                evbuffer_drain(out, v.iov_len);
            }
            rc = body_done(p, l, rc, responses);
            if (rc < 0)
                goto out;
            if (rc == 1) {
                in_body = false;
                continue;
            }
        }
        if (at == n)
            break;
        {
            size_t k = n - at;
            if (seed == 1) {
                k = 1;
            } else if (seed > 1) {
                seed = seed * 1103515245u + 12345u;
                k = 1 + (seed >> 16) % 61;
                if (k > n - at)
                    k = n - at;
            }
            if (blocks && in_body && evbuffer_get_length(in) == 0) {
                char *b = agw_xmalloc(k);
                size_t used = 0, blen = 0;

                memcpy(b, s + at, k);
                at += k;
                rc = agw_http1_decode_body(p, b, k, &used, &blen);
                if (blen > used || used > k)
                    abort();
                log_add(l, b, blen);
                if (rc == 1)
                    evbuffer_add(in, b + used, k - used);
                free(b);
                rc = body_done(p, l, rc, responses);
                if (rc < 0)
                    goto out;
                in_body = rc == 0;
                continue;
            }
            evbuffer_add(in, s + at, k);
            at += k;
        }
    }
    log_rc(l, 'e', agw_http1_parse_eof(p));
    log_rc(l, 'E', agw_http1_parse_eof(p));
out:
    agw_http1_response_clear(&resp);
    evbuffer_free(in);
    evbuffer_free(out);
    agw_http1_parser_free(p);
}

static void same(const struct log *a, const struct log *b)
{
    if (a->len != b->len || (a->len > 0 && memcmp(a->p, b->p, a->len) != 0))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct log whole = {0}, other = {0};
    const char *s;
    size_t n, max_head;
    unsigned seed;

    if (size < 2)
        return 0;
    max_head = 1 + (size_t)data[0] * 8;
    seed = 2u + data[1];
    s = (const char *)data + 2;
    n = size - 2;

    run(s, n, max_head, 0, false, false, &whole);
    for (int mode = 0; mode < 5; mode++) {
        other = (struct log){0};
        switch (mode) {
        case 0:
            run(s, n, max_head, 1, false, false, &other);
            break;
        case 1:
            run(s, n, max_head, seed, false, false, &other);
            break;
        case 2:
            run(s, n, max_head, 0, true, false, &other);
            break;
        case 3:
            run(s, n, max_head, 1, false, true, &other);
            break;
        default:
            run(s, n, max_head, seed, false, true, &other);
            break;
        }
        same(&whole, &other);
        free(other.p);
    }
    free(whole.p);
    return 0;
}
