/* libFuzzer driver for the strict HTTP/1.1 request parser of src/http1.c (the server side:
 * agw_http1_request_parser_new(), agw_http1_parse_request_head(), agw_http1_parse_body(),
 * agw_http1_body_over_limit(), agw_http1_request_fields()). The input is
 * what a client sends on one connection; its first five bytes choose the limits and how the rest is
 * cut into reads: byte 0: max_head = 1 + 8 * b        byte 1: max_line = 1 + 2 * b byte 2:
 * max_fields = 1 + b % 32      byte 3: max_body = 16 * b (255: SIZE_MAX) byte 4: the seed of the
 * read sizes. The stream is parsed as a sequence of pipelined requests (the head taken by the
 * caller, then the body) whole, byte by byte, in the chosen reads, from an evbuffer of many small
 * segments, and byte by byte and in the chosen reads with body reads decoded in place as memory
 * blocks: every way must give the same heads, statuses, errors and decoded bodies
 * (split-invariance).
 *
 * Invariants: an accepted head is at most max_head bytes, ends with an empty line, has CR LF line
 * ends only (no bare LF), a request line "METHOD SP target SP HTTP/1.1", lines within max_line,
 * at most max_fields fields, exactly one Host, no control byte in any value, Content-Length XOR
 * Transfer-Encoding, and says what its fields say (body kind, length within max_body, Expect,
 * Connection: close, HEAD, rewrite); a decoded body is within max_body (and exactly Content-Length
 * long when complete); a complete request's fields as split (agw_http1_request_fields()) are its
 * field lines' names
 * and values, OWS trimmed, in order, as many as req->n_fields; a refused request has a status in
 * {400, 413, 414, 417, 431, 501, 505} that matches the code returned, and an error string.
 *
 *   tests/fuzz/build.sh _build-fuzz request        (or by hand:)
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -I_build src/http1.c src/common.c \
 *       tests/fuzz/fuzz_request.c $(pkg-config --cflags --libs libevent openssl)
 *   ./a.out tests/fuzz/corpus/request */
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "agw/http1.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_REQUESTS 64 /* per input: pipelining is bounded by the input anyway */

struct log {
    char *p;
    size_t len;
};

struct setup {
    size_t max_head;
    struct agw_http1_request_limits lim;
};

static void fatal(const char *what)
{
    fprintf(stderr, "fuzz_request: %s\n", what);
    abort();
}

static void log_add(struct log *l, const void *s, size_t n)
{
    if (n == 0)
        return;
    l->p = agw_xrealloc(l->p, l->len + n + 1);
    memcpy(l->p + l->len, s, n);
    l->len += n;
}

static void log_fmt(struct log *l, const char *fmt, ...) AGW_PRINTF(2, 3);

static void log_fmt(struct log *l, const char *fmt, ...)
{
    char s[160];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(s, sizeof(s), fmt, ap);
    va_end(ap);
    log_add(l, s, (size_t)n);
}

static char *take_all(struct evbuffer *b, size_t *n)
{
    char *s;

    *n = evbuffer_get_length(b);
    s = agw_xmalloc(*n + 1);
    evbuffer_remove(b, s, *n);
    s[*n] = '\0';
    return s;
}

/* RFC 9110 §5.6.2 */
static bool is_tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static bool name_is(const char *line, size_t nlen, const char *name)
{
    return agw_strieq_n(line, nlen, name);
}

/* Independent checks of a head that the parser accepted (<h>, <n> bytes). */
static void check_head(const struct setup *s, const struct agw_http1_request *req, const char *h,
                       size_t n)
{
    unsigned hosts = 0, fields = 0, cls = 0, tes = 0, expects = 0;
    bool close = false;
    uint64_t cl = 0;
    const char *line = h, *end = h + n, *sp1, *sp2;

    if (n == 0 || n > s->max_head || req->head_len != n)
        fatal("accepted head: bad length");
    if (n < 4 || memcmp(end - 4, "\r\n\r\n", 4) != 0)
        fatal("accepted head: no empty line at its end");
    for (size_t i = 0; i < n; i++)
        if (h[i] == '\n' && (i == 0 || h[i - 1] != '\r'))
            fatal("accepted head: bare LF");
    if (req->status != 0 || req->error != NULL)
        fatal("accepted head with an error status");
    for (bool first = true;; first = false) {
        const char *lf = memchr(line, '\n', (size_t)(end - line));
        size_t len = (size_t)(lf - line) - 1; /* without CR LF */

        if (len == 0) {
            if (lf + 1 != end)
                fatal("accepted head: bytes after its empty line");
            break;
        }
        if (len > s->lim.max_line)
            fatal("accepted head: a line over max_line");
        if (first) {
            sp1 = memchr(line, ' ', len);
            sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(line + len - sp1 - 1)) : NULL;
            if (sp1 == NULL || sp1 == line || sp2 == NULL || sp2 == sp1 + 1 ||
                line + len - sp2 != 9 || memcmp(sp2 + 1, "HTTP/1.1", 8) != 0)
                fatal("accepted head: bad request line");
            if (req->head_method != (sp1 - line == 4 && memcmp(line, "HEAD", 4) == 0))
                fatal("accepted head: head_method");
            for (const char *c = line; c < sp1; c++)
                if (!((*c >= 'A' && *c <= 'Z') || *c == '-' || *c == '_'))
                    fatal("accepted head: bad method");
            for (const char *c = sp1 + 1; c < sp2; c++)
                if ((unsigned char)*c <= 0x20 || (unsigned char)*c >= 0x7f)
                    fatal("accepted head: bad byte in the target");
        } else {
            const char *colon = memchr(line, ':', len), *v, *ve = line + len;
            size_t nlen;

            if (colon == NULL || colon == line)
                fatal("accepted head: a field line without a name");
            nlen = (size_t)(colon - line);
            for (const char *c = line; c < colon; c++)
                if (!is_tchar((unsigned char)*c))
                    fatal("accepted head: a field name that is not a token");
            for (v = colon + 1; v < ve; v++)
                if (((unsigned char)*v < 0x20 && *v != '\t') || *v == 0x7f)
                    fatal("accepted head: a control byte in a value");
            v = colon + 1;
            while (v < ve && (*v == ' ' || *v == '\t'))
                v++;
            while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
                ve--;
            fields++;
            if (name_is(line, nlen, "host")) {
                hosts++;
            } else if (name_is(line, nlen, "content-length")) {
                cls++;
                cl = 0;
                for (const char *c = v; c < ve; c++) {
                    if (*c < '0' || *c > '9')
                        fatal("accepted head: a Content-Length that is not a number");
                    cl = cl * 10 + (uint64_t)(*c - '0');
                }
            } else if (name_is(line, nlen, "transfer-encoding")) {
                tes++;
            } else if (name_is(line, nlen, "expect")) {
                expects++;
            } else if (name_is(line, nlen, "connection")) {
                char *value = agw_xstrndup(v, (size_t)(ve - v));
                close = close || agw_header_has_token(value, "close");
                free(value);
            }
        }
        line = lf + 1;
    }
    if (hosts != 1)
        fatal("accepted head: not exactly one Host");
    if (fields > s->lim.max_fields)
        fatal("accepted head: more fields than max_fields");
    if (cls > 1 || (cls == 1 && tes > 0))
        fatal("accepted head: Content-Length and Transfer-Encoding, or two Content-Length");
    if ((req->body == AGW_HTTP1_BODY_CHUNKED) != (tes > 0) || req->rewrite != (tes > 0))
        fatal("accepted head: chunked and rewrite must follow Transfer-Encoding");
    if ((req->body == AGW_HTTP1_BODY_LENGTH) != (cls == 1))
        fatal("accepted head: a length body must follow Content-Length");
    if (req->body == AGW_HTTP1_BODY_LENGTH &&
        (req->content_length != cl || req->content_length > s->lim.max_body))
        fatal("accepted head: content_length");
    if (req->body != AGW_HTTP1_BODY_LENGTH && req->content_length != 0)
        fatal("accepted head: content_length without Content-Length");
    if (req->expect_continue != (expects > 0))
        fatal("accepted head: expect_continue");
    if (req->close != close)
        fatal("accepted head: close");
}

/* The fields of an accepted request whose head is <h> (<n> bytes), as the gate keeps them
 * (agw_http1_request_fields()): every field line's name and value without the OWS around it, in
 * order, req->n_fields of them. */
static void check_fields(const struct agw_http1_request *req, const char *h, size_t n)
{
    const char *lf = memchr(h, '\n', n), *end = h + n;
    char *copy;
    struct agw_http1_field *f;
    size_t k = 0, nf;

    copy = malloc(n + 1);
    memcpy(copy, h, n);
    copy[n] = '\0';
    f = calloc(req->n_fields + 1, sizeof(*f));
    nf = agw_http1_request_fields(copy, n, f, req->n_fields);
    if (nf != req->n_fields)
        fatal("fields: not as many as the head says");
    for (const char *line = lf + 1; line < end - 2; line = lf + 1, k++) {
        const char *colon, *v, *ve;

        lf = memchr(line, '\n', (size_t)(end - line));
        colon = memchr(line, ':', (size_t)(lf - line));
        ve = lf - 1; /* the CR */
        for (v = colon + 1; v < ve && (*v == ' ' || *v == '\t'); v++)
            ;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        if (k >= nf || f[k].name_len != (size_t)(colon - line) ||
            memcmp(f[k].name, line, f[k].name_len) != 0 || f[k].name[f[k].name_len] != '\0' ||
            f[k].value_len != (size_t)(ve - v) || memcmp(f[k].value, v, f[k].value_len) != 0 ||
            f[k].value[f[k].value_len] != '\0' || f[k].name < copy || f[k].value >= copy + n)
            fatal("fields: a field split wrongly");
    }
    if (k != nf)
        fatal("fields: another count");
    free(f);
    free(copy);
}

static void check_refused(const struct agw_http1_request *req, int rc)
{
    bool limit = req->status == 413 || req->status == 414 || req->status == 431;

    switch (req->status) {
    case 400:
    case 413:
    case 414:
    case 417:
    case 431:
    case 501:
    case 505:
        break;
    default:
        fatal("refused with a status outside {400,413,414,417,431,501,505}");
    }
    if (req->error == NULL || req->error[0] == '\0')
        fatal("refused without an error string");
    if (rc != (limit ? -AGW_ETOOBIG : -AGW_EPROTO))
        fatal("refused: the code does not match the status");
}

/* The request being read: its head (taken by the caller) and its decoded body so far. */
struct current {
    struct agw_http1_request req;
    char *head;
    size_t head_len;
    struct log body;
};

/* The body of <cur> grew by <n> bytes at <b>. */
static void body_add(const struct setup *s, struct current *cur, const char *b, size_t n)
{
    log_add(&cur->body, b, n);
    if (cur->body.len > s->lim.max_body)
        fatal("a decoded body over max_body");
    if (cur->req.body == AGW_HTTP1_BODY_LENGTH && cur->body.len > cur->req.content_length)
        fatal("a Content-Length body longer than announced");
}

/* After a body parse that returned <rc>: logs it. Returns -1 to stop, 1 when the request ended
 * (the next head follows), 0 to go on. */
static int body_done(struct agw_http1_parser *p, struct current *cur, struct log *l, int rc,
                     int requests)
{
    if (rc == 0)
        return 0;
    log_fmt(l, "|b%d:%d:%zu|", rc, agw_http1_body_over_limit(p), cur->body.len);
    log_add(l, cur->body.p, cur->body.len);
    if (rc < 0) {
        if (rc != -AGW_EPROTO && rc != -AGW_ETOOBIG)
            fatal("body refused with an unexpected code");
        if (agw_http1_body_over_limit(p) && rc != -AGW_ETOOBIG)
            fatal("over the body limit but not -AGW_ETOOBIG");
        return -1;
    }
    if (rc != 1 || agw_http1_body_over_limit(p))
        fatal("body: unexpected result");
    if (cur->req.body == AGW_HTTP1_BODY_LENGTH && cur->body.len != cur->req.content_length)
        fatal("a complete Content-Length body of another length");
    if (cur->req.body == AGW_HTTP1_BODY_NONE && cur->body.len != 0)
        fatal("a body without framing");
    check_fields(&cur->req, cur->head, cur->head_len);
    if (requests == MAX_REQUESTS)
        return -1;
    /* Alternate between an explicit reset and parse_request_head()'s implicit one. */
    if (requests % 2 == 0)
        agw_http1_parser_reset(p);
    return 1;
}

static void current_clear(struct current *cur)
{
    free(cur->head);
    free(cur->body.p);
    memset(cur, 0, sizeof(*cur));
}

/* Parses the requests in <s>, reading it in pieces drawn from <seed> (0 = whole, 1 = byte by
 * byte), or, with <segments>, from one evbuffer of 3-byte references. With <blocks>, a read that
 * arrives in a body with nothing waiting goes to agw_http1_decode_body() as a memory block. */
static void run(const struct setup *st, const char *s, size_t n, unsigned seed, bool segments,
                bool blocks, struct log *l)
{
    struct agw_http1_parser *p = agw_http1_request_parser_new(st->max_head, &st->lim);
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new(), *head = evbuffer_new();
    struct current cur = {0};
    bool in_body = false;
    int requests = 0;
    size_t at = 0;
    int rc;

    if (segments) {
        for (; at < n; at += 3)
            evbuffer_add_reference(in, s + at, n - at < 3 ? n - at : 3, NULL, NULL);
        at = n;
    }
    for (;;) {
        if (!in_body) {
            rc = agw_http1_parse_request_head(p, in, &cur.req);
            if (rc == 0) {
                if (cur.req.head_len > evbuffer_get_length(in))
                    fatal("head_len past the input");
                evbuffer_remove_buffer(in, head, cur.req.head_len);
                cur.head = take_all(head, &cur.head_len);
                check_head(st, &cur.req, cur.head, cur.head_len);
                log_fmt(l, "|H%d:%" PRIu64 ":%d%d%d%d:", (int)cur.req.body, cur.req.content_length,
                        cur.req.expect_continue, cur.req.close, cur.req.head_method,
                        cur.req.rewrite);
                log_add(l, cur.head, cur.head_len);
                in_body = true;
                requests++;
            } else if (rc != AGW_AGAIN) {
                check_refused(&cur.req, rc);
                log_fmt(l, "|h%d:%d:%s|", rc, cur.req.status, cur.req.error);
                goto out;
            }
        }
        if (in_body) {
            rc = agw_http1_parse_body(p, in, out);
            while (evbuffer_get_length(out) > 0) {
                struct evbuffer_iovec v;
                evbuffer_peek(out, -1, NULL, &v, 1);
                body_add(st, &cur, v.iov_base, v.iov_len);
                evbuffer_drain(out, v.iov_len);
            }
            rc = body_done(p, &cur, l, rc, requests);
            if (rc < 0)
                goto out;
            if (rc == 1) {
                in_body = false;
                current_clear(&cur);
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
                    fatal("decode_body: more body than bytes used");
                body_add(st, &cur, b, blen);
                if (rc == 1)
                    evbuffer_add(in, b + used, k - used);
                free(b);
                rc = body_done(p, &cur, l, rc, requests);
                if (rc < 0)
                    goto out;
                if (rc == 1) {
                    in_body = false;
                    current_clear(&cur);
                }
                continue;
            }
            evbuffer_add(in, s + at, k);
            at += k;
        }
    }
    log_fmt(l, "|end:%d:%zu|", in_body, cur.body.len);
    log_add(l, cur.body.p, cur.body.len);
out:
    current_clear(&cur);
    evbuffer_free(in);
    evbuffer_free(out);
    evbuffer_free(head);
    agw_http1_parser_free(p);
}

static void same(const struct log *a, const struct log *b)
{
    if (a->len != b->len || (a->len > 0 && memcmp(a->p, b->p, a->len) != 0)) {
        fprintf(stderr, "whole:   %.*s\nsplit:   %.*s\n", (int)a->len, a->p, (int)b->len, b->p);
        fatal("the way the input was cut into reads changed the outcome");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct log whole = {0}, other = {0};
    struct setup st;
    const char *s;
    size_t n;
    unsigned seed;

    if (size < 5)
        return 0;
    st.max_head = 1 + (size_t)data[0] * 8;
    st.lim.max_line = 1 + (size_t)data[1] * 2;
    st.lim.max_fields = 1 + data[2] % 32u;
    st.lim.max_body = data[3] == 255 ? SIZE_MAX : (size_t)data[3] * 16;
    seed = 2u + data[4];
    s = (const char *)data + 5;
    n = size - 5;

    run(&st, s, n, 0, false, false, &whole);
    for (int mode = 0; mode < 5; mode++) {
        other = (struct log){0};
        switch (mode) {
        case 0:
            run(&st, s, n, 1, false, false, &other);
            break;
        case 1:
            run(&st, s, n, seed, false, false, &other);
            break;
        case 2:
            run(&st, s, n, 0, true, false, &other);
            break;
        case 3:
            run(&st, s, n, 1, false, true, &other);
            break;
        default:
            run(&st, s, n, seed, false, true, &other);
            break;
        }
        same(&whole, &other);
        free(other.p);
    }
    free(whole.p);
    return 0;
}
