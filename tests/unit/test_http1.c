/* Tests for src/http1.c, the upstream response parser: heads (whole, split at every byte, the
 * limits, every rejection), each body mode, chunked framing (extensions, trailers, every split,
 * random chunkings of SSE streams decoded back to the original bytes), EOF in each state,
 * pipelined leftovers, sticky errors and reuse. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "agw/http1.h"

#define MAX_HEAD 1024

/* ---- driving the parser ------------------------------------------------------------------ */

struct run {
    int head_rc; /* last parse_head() result */
    struct agw_http1_response resp;
    int body_rc; /* last parse_body() result, or parse_eof()'s when <eof> was asked for */
    char *body;  /* decoded body, NUL-terminated (owned) */
    size_t body_len;
    char *left; /* what stayed in <in> (owned) */
    size_t left_len;
};

static char *take_all(struct evbuffer *b, size_t *len)
{
    char *s;

    *len = evbuffer_get_length(b);
    s = agw_xmalloc(*len + 1);
    evbuffer_remove(b, s, *len);
    s[*len] = '\0';
    return s;
}

/* Appends <n> bytes to <in> as a chain of their own, as a socket read appends them: a head cut into
 * reads lies in several chains, and the parser's search beyond the first chain is exercised. */
static void add_read(struct evbuffer *in, const char *s, size_t n)
{
    struct evbuffer *read = evbuffer_new();

    evbuffer_add(read, s, n);
    evbuffer_add_buffer(in, read);
    evbuffer_free(read);
}

/* Feeds <msg> in reads of <step> bytes (0 = all at once) to a parser with <max_head>, parsing the
 * head, then the body, after each read; then EOF when <eof> and the body is still open. With
 * <blocks>, each read after the head's goes to agw_http1_decode_body() as a memory block (what the
 * head's read left over goes through the evbuffer), else everything through the evbuffer. */
static void feed_mode(const char *msg, size_t len, size_t step, size_t max_head, bool eof,
                      bool blocks, struct run *r)
{
    struct agw_http1_parser *p = agw_http1_parser_new(max_head);
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
    bool head = false;

    memset(r, 0, sizeof(*r));
    r->head_rc = AGW_AGAIN;
    if (step == 0)
        step = len > 0 ? len : 1;
    for (size_t off = 0; off < len;) {
        size_t n = len - off < step ? len - off : step;

        if (blocks && head) {
            char *b = agw_xmalloc(n);
            size_t used = 0, body_len = 0;

            memcpy(b, msg + off, n);
            off += n;
            r->body_rc = agw_http1_decode_body(p, b, n, &used, &body_len);
            cr_assert_leq(body_len, used);
            evbuffer_add(out, b, body_len);
            if (r->body_rc == 1)
                evbuffer_add(in, b + used, n - used);
            free(b);
            if (r->body_rc != 0)
                goto out;
            continue;
        }
        add_read(in, msg + off, n);
        off += n;
        if (!head) {
            r->head_rc = agw_http1_parse_head(p, in, &r->resp);
            if (r->head_rc == AGW_AGAIN)
                continue;
            if (r->head_rc < 0)
                goto out;
            head = true;
        }
        r->body_rc = agw_http1_parse_body(p, in, out);
        if (r->body_rc != 0)
            goto out;
    }
    if (head && eof)
        r->body_rc = agw_http1_parse_eof(p);
out:
    r->body = take_all(out, &r->body_len);
    r->left = take_all(in, &r->left_len);
    evbuffer_free(in);
    evbuffer_free(out);
    agw_http1_parser_free(p);
}

/* Both ways, which must agree byte for byte; <r> gets the evbuffer way's result. */
static void feed(const char *msg, size_t len, size_t step, size_t max_head, bool eof, struct run *r)
{
    struct run b;

    feed_mode(msg, len, step, max_head, eof, false, r);
    feed_mode(msg, len, step, max_head, eof, true, &b);
    cr_assert_eq(b.head_rc, r->head_rc, "step %zu", step);
    cr_assert_eq(b.body_rc, r->body_rc, "step %zu: blocks %d, evbuffer %d", step, b.body_rc,
                 r->body_rc);
    cr_assert_eq(b.body_len, r->body_len, "step %zu", step);
    cr_assert(memcmp(b.body, r->body, r->body_len) == 0, "step %zu: bodies differ", step);
    if (r->body_rc >= 0) { /* after an error what is left means nothing */
        cr_assert_eq(b.left_len, r->left_len, "step %zu", step);
        cr_assert(memcmp(b.left, r->left, r->left_len) == 0, "step %zu: leftovers differ", step);
    }
    agw_http1_response_clear(&b.resp);
    free(b.body);
    free(b.left);
}

static void run_free(struct run *r)
{
    agw_http1_response_clear(&r->resp);
    free(r->body);
    free(r->left);
}

#define FEED(msg, step, eof, r) feed(msg, strlen(msg), step, MAX_HEAD, eof, r)

/* Deterministic pseudo-random numbers for the random splits. */
static unsigned next_rand(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return (*seed >> 16) & 0x7fff;
}

/* Chunk-encodes <body> into a fresh string, in chunks of 1..<max_chunk> bytes drawn from <seed>
 * (with an extension on some, uppercase hex on others) and an optional trailer. */
static char *chunk_encode(const char *body, size_t len, size_t max_chunk, unsigned seed,
                          bool trailer, size_t *out_len)
{
    struct evbuffer *b = evbuffer_new();
    char *s;

    for (size_t off = 0; off < len;) {
        size_t n = 1 + next_rand(&seed) % max_chunk;
        unsigned style = next_rand(&seed) % 4;

        if (n > len - off)
            n = len - off;
        if (style == 0)
            evbuffer_add_printf(b, "%zX\r\n", n);
        else if (style == 1)
            evbuffer_add_printf(b, "%zx;name=\"v;al\"\r\n", n);
        else if (style == 2)
            evbuffer_add_printf(b, "%zx \n", n);
        else
            evbuffer_add_printf(b, "00%zx\r\n", n);
        evbuffer_add(b, body + off, n);
        evbuffer_add(b, style == 2 ? "\n" : "\r\n", style == 2 ? 1 : 2);
        off += n;
    }
    evbuffer_add_printf(b, "0\r\n%s\r\n", trailer ? "X-Checksum: abc\r\nX-Other:\r\n" : "");
    s = take_all(b, out_len);
    evbuffer_free(b);
    return s;
}

/* ---- heads -------------------------------------------------------------------------------- */

static const char rich_head[] = "HTTP/1.1 200 OK, fine\r\n"
                                "Server: backend/1.0\r\n"
                                "content-TYPE:   text/event-stream; charset=utf-8 \t\r\n"
                                "X-Empty:\r\n"
                                "X-Obs-Text: caf\xc3\xa9\r\n"
                                "Cache-Control: no-cache\r\n"
                                "Content-Length: 4\r\n"
                                "\r\n"
                                "data";

Test(http1, head_whole_and_split_at_every_byte)
{
    size_t len = strlen(rich_head);

    for (size_t step = 0; step <= len; step++) {
        struct run r;
        feed(rich_head, len, step, MAX_HEAD, false, &r);
        cr_assert_eq(r.head_rc, 0, "step %zu: %d", step, r.head_rc);
        cr_assert_eq(r.resp.status, 200);
        cr_assert_eq(r.resp.minor_version, 1);
        cr_assert_str_eq(r.resp.content_type, "text/event-stream; charset=utf-8");
        cr_assert_eq(r.resp.body, AGW_HTTP1_BODY_LENGTH);
        cr_assert_eq(r.resp.content_length, 4);
        cr_assert(r.resp.keep_alive);
        cr_assert_eq(r.body_rc, 1);
        cr_assert_str_eq(r.body, "data");
        cr_assert_eq(r.left_len, 0);
        run_free(&r);
    }
}

Test(http1, head_split_at_every_pair_of_points)
{
    static const char m[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nA: b\r\n\r\n";
    size_t len = strlen(m);

    for (size_t i = 0; i <= len; i++) {
        for (size_t j = i; j <= len; j++) {
            struct agw_http1_parser *p = agw_http1_parser_new(MAX_HEAD);
            struct evbuffer *in = evbuffer_new();
            struct agw_http1_response resp;

            evbuffer_add(in, m, i);
            cr_assert_eq(agw_http1_parse_head(p, in, &resp), i == len ? 0 : AGW_AGAIN);
            if (i < len) {
                evbuffer_add(in, m + i, j - i);
                cr_assert_eq(agw_http1_parse_head(p, in, &resp), j == len ? 0 : AGW_AGAIN);
                evbuffer_add(in, m + j, len - j);
                if (j < len)
                    cr_assert_eq(agw_http1_parse_head(p, in, &resp), 0, "%zu/%zu", i, j);
            }
            cr_assert_eq(resp.status, 200);
            cr_assert_eq(resp.body, AGW_HTTP1_BODY_LENGTH);
            cr_assert_eq(evbuffer_get_length(in), 0);
            agw_http1_response_clear(&resp);
            evbuffer_free(in);
            agw_http1_parser_free(p);
        }
    }
}

Test(http1, status_lines)
{
    static const struct {
        const char *m;
        int status;
        int minor;
    } ok[] = {
        {"HTTP/1.1 200 OK\r\n\r\n", 200, 1},        {"HTTP/1.0 404 Not Found\r\n\r\n", 404, 0},
        {"HTTP/1.1 200\r\n\r\n", 200, 1},  /* no reason, no space */
        {"HTTP/1.1 500 \r\n\r\n", 500, 1}, /* empty reason */
        {"HTTP/1.1 599 x\ty \xff\r\n\r\n", 599, 1}, {"HTTP/1.1 200 OK\n\n", 200, 1},
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(ok); i++) {
        struct run r;
        FEED(ok[i].m, 0, false, &r);
        cr_assert_eq(r.head_rc, 0, "case %zu", i);
        cr_assert_eq(r.resp.status, ok[i].status, "case %zu", i);
        cr_assert_eq(r.resp.minor_version, ok[i].minor, "case %zu", i);
        cr_assert_null(r.resp.content_type);
        run_free(&r);
    }
}

Test(http1, bare_lf_and_mixed_line_ends)
{
    static const char *const heads[] = {
        "HTTP/1.1 200 OK\nContent-Length: 2\nContent-Length: 2\n\nok",
        "HTTP/1.1 200 OK\r\nContent-Length: 2\n\r\nok",
        "HTTP/1.1 200 OK\nContent-Length: 2\r\n\nok",
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(heads); i++) {
        for (size_t step = 0; step < 4; step++) {
            struct run r;
            FEED(heads[i], step, false, &r);
            cr_assert_eq(r.head_rc, 0, "case %zu step %zu", i, step);
            cr_assert_eq(r.body_rc, 1);
            cr_assert_str_eq(r.body, "ok");
            run_free(&r);
        }
    }
}

Test(http1, bad_heads)
{
    static const char *const bad[] = {
        "HTTP/2.0 200 OK\r\n\r\n",
        "HTTP/1.2 200 OK\r\n\r\n",
        "HTTP/1.10 200 OK\r\n\r\n",
        "http/1.1 200 OK\r\n\r\n",
        "HTTP/1.1  200 OK\r\n\r\n",
        "HTTP/1.1 20 OK\r\n\r\n",
        "HTTP/1.1 2000 OK\r\n\r\n",
        "HTTP/1.1 20x OK\r\n\r\n",
        "HTTP/1.1 099 Odd\r\n\r\n",
        "HTTP/1.1 600 Odd\r\n\r\n",
        "HTTP/1.1 200\tOK\r\n\r\n",
        "HTTP/1.1 200 O\rK\r\n\r\n",
        "HTTP/1.1 200 O\x01K\r\n\r\n",
        "ICY 200 OK\r\n\r\n",
        "\r\nHTTP/1.1 200 OK\r\n\r\n",
        "HTTP/1.1 200 OK\r\nBad Header: x\r\n\r\n",
        "HTTP/1.1 200 OK\r\nBad-Header : x\r\n\r\n",
        "HTTP/1.1 200 OK\r\nBad(Header): x\r\n\r\n",
        "HTTP/1.1 200 OK\r\n: empty\r\n\r\n",
        "HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        "HTTP/1.1 200 OK\r\nA: b\r\n folded\r\n\r\n",
        "HTTP/1.1 200 OK\r\nA: b\r\n\tfolded\r\n\r\n",
        "HTTP/1.1 200 OK\r\n Leading: space\r\n\r\n",
        "HTTP/1.1 200 OK\r\nA: b\rc\r\n\r\n",
        "HTTP/1.1 200 OK\r\nA: b\r\r\n\r\n",
        "HTTP/1.1 200 OK\r\nA: nul\0here\r\n\r\n",
        "HTTP/1.1 200 OK\r\nA: del\x7f\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 5,\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 1 2\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551616\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked;q=1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Type: text/html\r\n\r\n",
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(bad); i++) {
        size_t len = strlen(bad[i]);
        /* the NUL case: its length is written out */
        if (strstr(bad[i], "nul") != NULL)
            len = sizeof("HTTP/1.1 200 OK\r\nA: nul\0here\r\n\r\n") - 1;
        for (size_t step = 0; step < 3; step++) {
            struct run r;
            feed(bad[i], len, step, MAX_HEAD, false, &r);
            cr_assert_eq(r.head_rc, -AGW_EPROTO, "case %zu step %zu: %d", i, step, r.head_rc);
            cr_assert_null(r.resp.content_type, "a failed head leaves nothing to free");
            run_free(&r);
        }
    }
}

Test(http1, not_http_fails_before_the_head_is_complete)
{
    static const char *const bad[] = {"SSH-2.0-OpenSSH", "\x16\x03\x01\x02", "PRI * HTTP/2.0",
                                      "HTTP/2 200", "\n"};

    for (size_t i = 0; i < AGW_ARRAY_LEN(bad); i++) {
        struct run r;
        FEED(bad[i], 0, false, &r);
        cr_assert_eq(r.head_rc, -AGW_EPROTO, "case %zu: %d", i, r.head_rc);
        run_free(&r);
    }
    struct run r;
    FEED("HTTP/1", 1, false, &r);
    cr_assert_eq(r.head_rc, AGW_AGAIN, "a prefix of a status line is just incomplete");
    run_free(&r);
}

Test(http1, head_limits)
{
    char m[3000];
    int n = snprintf(m, sizeof(m), "HTTP/1.1 200 OK\r\nX-Big: ");
    struct run r;

    memset(m + n, 'a', 2000);
    feed(m, (size_t)n + 2000, 0, MAX_HEAD, false, &r);
    cr_assert_eq(r.head_rc, -AGW_ETOOBIG, "an endless head fails at max_head");
    run_free(&r);
    feed(m, (size_t)n + 2000, 7, MAX_HEAD, false, &r);
    cr_assert_eq(r.head_rc, -AGW_ETOOBIG, "in small reads too");
    run_free(&r);
    memcpy(m + n + 2000, "\r\n\r\n", 4);
    feed(m, (size_t)n + 2004, 0, MAX_HEAD, false, &r);
    cr_assert_eq(r.head_rc, -AGW_ETOOBIG, "a complete head over max_head fails too");
    run_free(&r);

    /* Exactly max_head bytes of head pass; one more fails; one less, incomplete, waits. */
    static const char head[] = "HTTP/1.1 204 No Content\r\nX-Pad: aaaaaaaaaa\r\n\r\n";
    size_t hl = strlen(head);
    feed(head, hl, 0, hl, false, &r);
    cr_assert_eq(r.head_rc, 0);
    run_free(&r);
    feed(head, hl, 1, hl, false, &r);
    cr_assert_eq(r.head_rc, 0);
    run_free(&r);
    feed(head, hl, 0, hl - 1, false, &r);
    cr_assert_eq(r.head_rc, -AGW_ETOOBIG);
    run_free(&r);
    feed(head, hl - 1, 0, hl, false, &r);
    cr_assert_eq(r.head_rc, AGW_AGAIN);
    run_free(&r);

    /* A long body behind a small head does not count against the limit. */
    char big[4096];
    int hn = snprintf(big, sizeof(big), "HTTP/1.1 200 OK\r\nContent-Length: 4000\r\n\r\n");
    memset(big + hn, 'b', 4000);
    feed(big, (size_t)hn + 4000, 0, 64, false, &r);
    cr_assert_eq(r.head_rc, 0);
    cr_assert_eq(r.body_rc, 1);
    cr_assert_eq(r.body_len, 4000);
    run_free(&r);
}

/* The same bytes give the same answer however they are cut, even with a limit shorter than the
 * "HTTP/1." prefix (found by tests/fuzz/fuzz_http1.c). */
Test(http1, tiny_limits_are_split_invariant)
{
    static const char *const m[] = {"HTTP/11. 200 OK\r\n\r\n", "XTTP/1.1 200 OK\r\n\r\n"};
    static const int expect[2][3] = {{-AGW_ETOOBIG, -AGW_ETOOBIG, -AGW_EPROTO},
                                     {-AGW_EPROTO, -AGW_EPROTO, -AGW_EPROTO}};
    static const size_t limits[] = {1, 6, 7};

    for (size_t i = 0; i < AGW_ARRAY_LEN(m); i++) {
        for (size_t l = 0; l < AGW_ARRAY_LEN(limits); l++) {
            for (size_t step = 0; step < 3; step++) {
                struct run r;
                feed(m[i], strlen(m[i]), step, limits[l], false, &r);
                cr_assert_eq(r.head_rc, expect[i][l], "%zu/%zu/%zu: %d", i, l, step, r.head_rc);
                run_free(&r);
            }
        }
    }
}

Test(http1, head_fields)
{
    struct run r;

    FEED("HTTP/1.1 200 OK\r\nContent-Length: 7, 7\r\nCONTENT-LENGTH:7\r\n"
         "Content-Type: text/event-stream\r\nContent-Type: text/event-stream\r\n\r\n",
         0, false, &r);
    cr_assert_eq(r.head_rc, 0, "identical Content-Length and Content-Type values agree");
    cr_assert_eq(r.resp.content_length, 7);
    cr_assert_str_eq(r.resp.content_type, "text/event-stream");
    run_free(&r);

    FEED("HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\n", 0, false, &r);
    cr_assert_eq(r.head_rc, 0, "the largest uint64_t is a valid length");
    cr_assert_eq(r.resp.content_length, UINT64_MAX);
    run_free(&r);

    FEED("HTTP/1.1 200 OK\r\nContent-Type:\r\nContent-Length: 0\r\n\r\n", 0, false, &r);
    cr_assert_str_eq(r.resp.content_type, "");
    run_free(&r);

    FEED("HTTP/1.1 200 OK\r\nTransfer-Encoding:  Chunked ,\r\n\r\n0\r\n\r\n", 0, false, &r);
    cr_assert_eq(r.resp.body, AGW_HTTP1_BODY_CHUNKED, "case-insensitive, empty elements ignored");
    cr_assert_eq(r.body_rc, 1);
    run_free(&r);
}

/* ---- interim responses -------------------------------------------------------------------- */

Test(http1, interim_responses_skipped_at_every_split)
{
    static const char m[] = "HTTP/1.1 100 Continue\r\n\r\n"
                            "HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n"
                            "Content-Type: text/html\r\n\r\n"
                            "HTTP/1.1 102 Processing\n\n"
                            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                            "Transfer-Encoding: chunked\r\n\r\n"
                            "5\r\nhello\r\n0\r\n\r\n";

    for (size_t step = 0; step <= strlen(m); step++) {
        struct run r;
        FEED(m, step, false, &r);
        cr_assert_eq(r.head_rc, 0, "step %zu: %d", step, r.head_rc);
        cr_assert_eq(r.resp.status, 200);
        cr_assert_str_eq(r.resp.content_type, "text/event-stream");
        cr_assert_eq(r.body_rc, 1);
        cr_assert_str_eq(r.body, "hello");
        run_free(&r);
    }
}

Test(http1, switching_protocols_refused)
{
    static const char up[] = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                             "Connection: Upgrade\r\n\r\n";
    static const char late[] = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching\r\n\r\n";
    struct run r;

    FEED(up, 0, false, &r);
    cr_assert_eq(r.head_rc, -AGW_EPROTO);
    run_free(&r);
    FEED(late, 3, false, &r);
    cr_assert_eq(r.head_rc, -AGW_EPROTO);
    run_free(&r);
}

Test(http1, endless_interim_responses_refused)
{
    struct evbuffer *b = evbuffer_new();
    char *m;
    size_t len;
    struct run r;

    for (int i = 0; i < 32; i++)
        evbuffer_add_printf(b, "HTTP/1.1 100 Continue\r\n\r\n");
    evbuffer_add_printf(b, "HTTP/1.1 204 No Content\r\n\r\n");
    m = take_all(b, &len);
    feed(m, len, 0, MAX_HEAD, false, &r);
    cr_assert_eq(r.head_rc, 0, "32 interim answers are tolerated");
    cr_assert_eq(r.resp.status, 204);
    run_free(&r);
    free(m);

    for (int i = 0; i < 33; i++)
        evbuffer_add_printf(b, "HTTP/1.1 100 Continue\r\n\r\n");
    m = take_all(b, &len);
    feed(m, len, 25, MAX_HEAD, false, &r);
    cr_assert_eq(r.head_rc, -AGW_EPROTO, "the 33rd is one too many");
    run_free(&r);
    free(m);
    evbuffer_free(b);
}

/* ---- body modes ----------------------------------------------------------------------------- */

Test(http1, no_body_statuses)
{
    static const char *const heads[] = {
        "HTTP/1.1 204 No Content\r\n\r\n",
        "HTTP/1.1 304 Not Modified\r\nContent-Length: 50\r\n\r\n",
        "HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n",
        "HTTP/1.0 304 Not Modified\r\n\r\n",
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(heads); i++) {
        struct agw_http1_parser *p = agw_http1_parser_new(MAX_HEAD);
        struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
        struct agw_http1_response resp;

        evbuffer_add_printf(in, "%sHTTP/1.1 200", heads[i]);
        cr_assert_eq(agw_http1_parse_head(p, in, &resp), 0, "case %zu", i);
        cr_assert_eq(resp.body, AGW_HTTP1_BODY_NONE, "case %zu", i);
        cr_assert_eq(resp.content_length, 0);
        cr_assert_eq(agw_http1_parse_body(p, in, out), 1);
        cr_assert_eq(agw_http1_parse_body(p, in, out), 1, "stays complete");
        cr_assert_eq(evbuffer_get_length(out), 0);
        cr_assert_eq(evbuffer_get_length(in), 12, "the next response is left alone");
        cr_assert_eq(agw_http1_parse_eof(p), 1);
        agw_http1_response_clear(&resp);
        evbuffer_free(in);
        evbuffer_free(out);
        agw_http1_parser_free(p);
    }
}

Test(http1, content_length_split_across_reads)
{
    static const char m[] = "HTTP/1.1 200 OK\r\nContent-Length: 25\r\n\r\n"
                            "data: {\"a\":1}\n\ndata: {}\n\n";

    for (size_t step = 0; step <= strlen(m); step++) {
        struct run r;
        FEED(m, step, false, &r);
        cr_assert_eq(r.head_rc, 0);
        cr_assert_eq(r.resp.body, AGW_HTTP1_BODY_LENGTH);
        cr_assert_eq(r.resp.content_length, 25);
        cr_assert_eq(r.body_rc, 1, "step %zu", step);
        cr_assert_str_eq(r.body, "data: {\"a\":1}\n\ndata: {}\n\n");
        run_free(&r);
    }
}

Test(http1, content_length_zero_is_complete_at_once)
{
    struct agw_http1_parser *p = agw_http1_parser_new(MAX_HEAD);
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
    struct agw_http1_response resp;

    evbuffer_add_printf(in, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    cr_assert_eq(agw_http1_parse_head(p, in, &resp), 0);
    cr_assert_eq(agw_http1_parse_eof(p), 1, "nothing is missing");
    cr_assert_eq(agw_http1_parse_body(p, in, out), 1);
    agw_http1_response_clear(&resp);
    evbuffer_free(in);
    evbuffer_free(out);
    agw_http1_parser_free(p);
}

Test(http1, close_delimited)
{
    static const char m[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                            "Connection: keep-alive\r\n\r\n"
                            "data: {}\n\ndata: HTTP/1.1 200 OK\r\n\r\n";

    for (size_t step = 0; step <= strlen(m); step += 3) {
        struct run r;
        FEED(m, step, true, &r);
        cr_assert_eq(r.resp.body, AGW_HTTP1_BODY_CLOSE);
        cr_assert_not(r.resp.keep_alive, "a close-delimited body ends the connection");
        cr_assert_eq(r.body_rc, 1, "EOF completes a close-delimited body");
        cr_assert_str_eq(r.body, "data: {}\n\ndata: HTTP/1.1 200 OK\r\n\r\n");
        cr_assert_eq(r.left_len, 0);
        run_free(&r);
    }
}

Test(http1, close_delimited_returns_0_until_eof)
{
    struct agw_http1_parser *p = agw_http1_parser_new(MAX_HEAD);
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
    struct agw_http1_response resp;

    evbuffer_add_printf(in, "HTTP/1.1 200 OK\r\n\r\nabc");
    cr_assert_eq(agw_http1_parse_head(p, in, &resp), 0);
    cr_assert_eq(agw_http1_parse_body(p, in, out), 0);
    cr_assert_eq(evbuffer_get_length(in), 0);
    cr_assert_eq(evbuffer_get_length(out), 3);
    cr_assert_eq(agw_http1_parse_body(p, in, out), 0, "an empty read is no end");
    evbuffer_add(in, "def", 3);
    cr_assert_eq(agw_http1_parse_body(p, in, out), 0);
    cr_assert_eq(evbuffer_get_length(out), 6);
    cr_assert_eq(agw_http1_parse_eof(p), 1);
    cr_assert_eq(agw_http1_parse_body(p, in, out), 1, "complete after the EOF");
    agw_http1_response_clear(&resp);
    evbuffer_free(in);
    evbuffer_free(out);
    agw_http1_parser_free(p);
}

static void free_nothing(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    (*(int *)arg)++;
}

/* Whole evbuffer chains of body bytes change hands: the output points at the very memory the
 * input was given, for Content-Length and for chunk data alike. */
Test(http1, body_bytes_are_moved_not_copied)
{
    static const char payload[] = "data: {\"type\":\"TEXT_MESSAGE_CONTENT\"}\n\n";
    static const char *const heads[] = {
        "HTTP/1.1 200 OK\r\nContent-Length: 39\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n27\r\n",
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(heads); i++) {
        struct agw_http1_parser *p = agw_http1_parser_new(MAX_HEAD);
        struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
        struct agw_http1_response resp;
        struct evbuffer_iovec v;
        int freed = 0;

        evbuffer_add(in, heads[i], strlen(heads[i]));
        evbuffer_add_reference(in, payload, 39, free_nothing, &freed);
        if (i == 1)
            evbuffer_add_printf(in, "\r\n0\r\n\r\n");
        cr_assert_eq(agw_http1_parse_head(p, in, &resp), 0);
        cr_assert_eq(agw_http1_parse_body(p, in, out), 1);
        cr_assert_eq(evbuffer_peek(out, -1, NULL, &v, 1), 1, "one chain: the original");
        cr_assert_eq((const char *)v.iov_base, payload, "case %zu: the bytes were copied", i);
        cr_assert_eq(v.iov_len, 39);
        evbuffer_free(in);
        cr_assert_eq(freed, 0, "the output holds the reference now");
        evbuffer_free(out);
        cr_assert_eq(freed, 1);
        agw_http1_response_clear(&resp);
        agw_http1_parser_free(p);
    }
}

/* ---- chunked -------------------------------------------------------------------------------- */

static const char sse_chunked[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                  "Transfer-Encoding: chunked\r\n\r\n"
                                  "c\r\ndata: {\"a\":1\r\n" /* a frame spanning chunks */
                                  "3;ext=1\r\n}\n\n\r\n"
                                  "19 ; a=\"b;c\" ; d\r\ndata: {}\n\ndata: {\"b\":2}\n\n\r\n"
                                  "1A\r\ndata: {\"type\":\"RUN_END\"}\n\n\r\n"
                                  "0;last\r\nX-Trailer: yes\r\nX-Empty:\r\n\r\n";
static const char sse_decoded[] = "data: {\"a\":1}\n\ndata: {}\n\ndata: {\"b\":2}\n\n"
                                  "data: {\"type\":\"RUN_END\"}\n\n";

Test(http1, chunked_split_at_every_byte)
{
    for (size_t step = 0; step <= strlen(sse_chunked); step++) {
        struct run r;
        FEED(sse_chunked, step, false, &r);
        cr_assert_eq(r.head_rc, 0, "step %zu: %d", step, r.head_rc);
        cr_assert_eq(r.resp.status, 200);
        cr_assert_str_eq(r.resp.content_type, "text/event-stream");
        cr_assert_eq(r.resp.body, AGW_HTTP1_BODY_CHUNKED);
        cr_assert(r.resp.keep_alive);
        cr_assert_eq(r.body_rc, 1, "step %zu: %d", step, r.body_rc);
        cr_assert_str_eq(r.body, sse_decoded, "step %zu", step);
        cr_assert_eq(r.left_len, 0);
        run_free(&r);
    }
}

Test(http1, chunked_split_at_every_pair_of_points)
{
    static const char head[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    static const char body[] =
        "5;x=y\r\nhello\r\n1\r\n \r\nB\r\ndata: xy\n\n\n\r\n0\r\nT: v\r\n\r\n";
    size_t len = strlen(body);

    for (size_t i = 0; i <= len; i++) {
        for (size_t j = i; j <= len; j++) {
            struct agw_http1_parser *p = agw_http1_parser_new(MAX_HEAD);
            struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
            struct agw_http1_response resp;
            size_t cuts[] = {0, i, j, len};
            int rc = 0;
            char *s;
            size_t n;

            evbuffer_add(in, head, strlen(head));
            cr_assert_eq(agw_http1_parse_head(p, in, &resp), 0);
            for (int k = 0; k < 3; k++) {
                evbuffer_add(in, body + cuts[k], cuts[k + 1] - cuts[k]);
                rc = agw_http1_parse_body(p, in, out);
                cr_assert_eq(rc, cuts[k + 1] == len ? 1 : 0, "%zu/%zu: %d", i, j, rc);
                if (rc == 1)
                    break;
            }
            s = take_all(out, &n);
            cr_assert_str_eq(s, "hello data: xy\n\n\n", "%zu/%zu", i, j);
            free(s);
            agw_http1_response_clear(&resp);
            evbuffer_free(in);
            evbuffer_free(out);
            agw_http1_parser_free(p);
        }
    }
}

Test(http1, many_chunks_in_one_read)
{
    struct evbuffer *b = evbuffer_new();
    char expect[2001];
    char *m;
    size_t len;
    struct run r;

    evbuffer_add_printf(b, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 2000; i++) {
        expect[i] = (char)('a' + i % 26);
        evbuffer_add_printf(b, "1\r\n%c\r\n", expect[i]);
    }
    expect[2000] = '\0';
    evbuffer_add_printf(b, "0\r\n\r\n");
    m = take_all(b, &len);
    feed(m, len, 0, MAX_HEAD, false, &r);
    cr_assert_eq(r.body_rc, 1);
    cr_assert_str_eq(r.body, expect);
    run_free(&r);
    free(m);
    evbuffer_free(b);
}

/* An SSE stream of many frames, chunked at random (frames span chunks, chunks hold many frames),
 * read in random pieces: the decoded bytes are the original stream, whatever the cuts. */
Test(http1, chunked_sse_stream_round_trips)
{
    struct evbuffer *sb = evbuffer_new();
    char *stream, *enc, *msg;
    size_t stream_len, enc_len, head_len;
    unsigned seed = 7;

    for (int i = 0; i < 300; i++)
        evbuffer_add_printf(sb,
                            "event: TEXT_MESSAGE_CONTENT\r\nid: %d\ndata: {\"type\":"
                            "\"TEXT_MESSAGE_CONTENT\",\"delta\":\"%0*d\"}\n\n",
                            i, (int)(next_rand(&seed) % 60), i);
    stream = take_all(sb, &stream_len);
    evbuffer_free(sb);

    for (unsigned round = 0; round < 40; round++) {
        size_t max_chunk = round % 4 == 0 ? 3 : round % 4 == 1 ? 64 : round % 4 == 2 ? 700 : 8192;
        enc = chunk_encode(stream, stream_len, max_chunk, round, round % 2 == 0, &enc_len);
        static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                   "Transfer-Encoding: chunked\r\n\r\n";
        head_len = strlen(head);
        msg = agw_xmalloc(head_len + enc_len);
        memcpy(msg, head, head_len);
        memcpy(msg + head_len, enc, enc_len);

        struct agw_http1_parser *p = agw_http1_parser_new(MAX_HEAD);
        struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
        struct agw_http1_response resp;
        size_t off = 0, total = head_len + enc_len;
        bool head_done = false;
        int rc = 0;

        while (off < total && rc == 0) {
            size_t n = 1 + next_rand(&seed) % (round < 20 ? 16 : 4096);
            if (n > total - off)
                n = total - off;
            evbuffer_add(in, msg + off, n);
            off += n;
            if (!head_done) {
                int hrc = agw_http1_parse_head(p, in, &resp);
                if (hrc == AGW_AGAIN)
                    continue;
                cr_assert_eq(hrc, 0);
                head_done = true;
            }
            rc = agw_http1_parse_body(p, in, out);
        }
        cr_assert_eq(rc, 1, "round %u: %d", round, rc);
        cr_assert_eq(off, total, "the end of the body is the end of the input");
        cr_assert_eq(evbuffer_get_length(out), stream_len, "round %u", round);
        cr_assert_eq(memcmp(evbuffer_pullup(out, -1), stream, stream_len), 0, "round %u", round);
        cr_assert_eq(agw_http1_parse_eof(p), 1);
        agw_http1_response_clear(&resp);
        evbuffer_free(in);
        evbuffer_free(out);
        agw_http1_parser_free(p);
        free(msg);
        free(enc);
    }
    free(stream);
}

Test(http1, chunk_sizes)
{
    static const struct {
        const char *body;
        const char *decoded;
    } ok[] = {
        {"A\r\n0123456789\r\n0\r\n\r\n", "0123456789"},
        {"a\r\n0123456789\r\n0\r\n\r\n", "0123456789"},
        {"0000a\r\n0123456789\r\n000\r\n\r\n", "0123456789"},
        {"1f\r\n0123456789abcdef0123456789abcde\r\n0\r\n\r\n", "0123456789abcdef0123456789abcde"},
        {"1F\r\n0123456789abcdef0123456789abcde\r\n0\r\n\r\n", "0123456789abcdef0123456789abcde"},
        {"3 \t\r\nabc\r\n0 \r\n\r\n", "abc"},
        {"3;a\r\nabc\r\n0\r\n\r\n", "abc"},
        {"3 ; a = b ; c=\"d;e\\\"\"\r\nabc\r\n0\r\n\r\n", "abc"},
        {"3\nabc\n0\n\n", "abc"},
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(ok); i++) {
        char m[256];
        struct run r;
        snprintf(m, sizeof(m), "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%s",
                 ok[i].body);
        FEED(m, 0, false, &r);
        cr_assert_eq(r.body_rc, 1, "case %zu: %d", i, r.body_rc);
        cr_assert_str_eq(r.body, ok[i].decoded, "case %zu", i);
        run_free(&r);
    }
}

Test(http1, bad_chunk_framing)
{
    static const char *const bad[] = {
        "zz\r\n",
        "\r\n",
        " 5\r\nhello\r\n",
        "-5\r\nhello\r\n",
        "+5\r\nhello\r\n",
        "0x5\r\nhello\r\n",
        "5 x\r\nhello\r\n",
        "5\rx\r\nhello\r\n",
        "5;a\x01\r\nhello\r\n",
        "FFFFFFFFFFFFFFFFFF\r\n",
        "4000000000000001\r\n", /* 2^62 + 1 */
        "3\r\nabcX\r\n",        /* missing CRLF after data */
        "3\r\nabc\rX\n",
        "3\r\nabcd\r\n",
        "3\r\nabc\r\r\n",
        "3\r\nabc\r\n0\r\nHTTP/1.1 200 OK\r\n\r\n", /* trailers out of sync */
        "3\r\nabc\r\n0\r\n bad: folded\r\n\r\n",
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(bad); i++) {
        char m[256];
        snprintf(m, sizeof(m), "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%s", bad[i]);
        for (size_t step = 0; step < 3; step++) {
            struct run r;
            FEED(m, step, false, &r);
            cr_assert_eq(r.head_rc, 0);
            cr_assert_eq(r.body_rc, -AGW_EPROTO, "case %zu step %zu: %d", i, step, r.body_rc);
            run_free(&r);
        }
    }
}

Test(http1, missing_crlf_fails_as_soon_as_seen)
{
    struct agw_http1_parser *p = agw_http1_parser_new(MAX_HEAD);
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
    struct agw_http1_response resp;

    evbuffer_add_printf(in, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc");
    cr_assert_eq(agw_http1_parse_head(p, in, &resp), 0);
    cr_assert_eq(agw_http1_parse_body(p, in, out), 0);
    evbuffer_add(in, "\r", 1);
    cr_assert_eq(agw_http1_parse_body(p, in, out), 0, "a CR alone may still be a CRLF");
    evbuffer_add(in, "x", 1);
    cr_assert_eq(agw_http1_parse_body(p, in, out), -AGW_EPROTO);
    cr_assert_eq(agw_http1_parse_body(p, in, out), -AGW_EPROTO, "errors are sticky");
    cr_assert_eq(agw_http1_parse_eof(p), -AGW_EPROTO);
    cr_assert_eq(agw_http1_parse_head(p, in, &resp), -AGW_EPROTO);
    agw_http1_response_clear(&resp);
    evbuffer_free(in);
    evbuffer_free(out);
    agw_http1_parser_free(p);
}

Test(http1, largest_chunk_size_accepted)
{
    struct agw_http1_parser *p = agw_http1_parser_new(MAX_HEAD);
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
    struct agw_http1_response resp;

    evbuffer_add_printf(in, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                            "4000000000000000\r\nsome");
    cr_assert_eq(agw_http1_parse_head(p, in, &resp), 0);
    cr_assert_eq(agw_http1_parse_body(p, in, out), 0, "2^62 is the largest chunk");
    cr_assert_eq(evbuffer_get_length(out), 4);
    cr_assert_eq(agw_http1_parse_eof(p), -AGW_EPROTO);
    agw_http1_response_clear(&resp);
    evbuffer_free(in);
    evbuffer_free(out);
    agw_http1_parser_free(p);
}

Test(http1, chunk_size_line_limit)
{
    static const char head[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    char m[2048];
    size_t hl = strlen(head);
    struct run r;

    /* a 1024-byte size line (with CRLF, or with a bare LF) is the longest accepted */
    for (int lf_only = 0; lf_only < 2; lf_only++) {
        memcpy(m, head, hl);
        memcpy(m + hl, "3;", 2);
        memset(m + hl + 2, 'e', 1022);
        size_t n = hl + 1024;
        n += (size_t)snprintf(m + n, sizeof(m) - n, "%sabc\r\n0\r\n\r\n", lf_only ? "\n" : "\r\n");
        feed(m, n, 0, MAX_HEAD, false, &r);
        cr_assert_eq(r.body_rc, 1, "%d", r.body_rc);
        cr_assert_str_eq(r.body, "abc");
        run_free(&r);
        feed(m, n, 1, MAX_HEAD, false, &r);
        cr_assert_eq(r.body_rc, 1, "%d", r.body_rc);
        run_free(&r);

        /* 1025 bytes is over */
        memset(m + hl + 2, 'e', 1023);
        n = hl + 1025;
        n += (size_t)snprintf(m + n, sizeof(m) - n, "%sabc\r\n0\r\n\r\n", lf_only ? "\n" : "\r\n");
        feed(m, n, 0, MAX_HEAD, false, &r);
        cr_assert_eq(r.body_rc, -AGW_ETOOBIG, "%d", r.body_rc);
        run_free(&r);
    }

    /* an endless size line fails without waiting for its end, whatever the reads */
    memcpy(m, head, hl);
    memcpy(m + hl, "5;", 2);
    memset(m + hl + 2, 'e', 1500);
    for (size_t step = 0; step < 1000; step += 97) {
        feed(m, hl + 1502, step, MAX_HEAD, false, &r);
        cr_assert_eq(r.body_rc, -AGW_ETOOBIG, "step %zu: %d", step, r.body_rc);
        run_free(&r);
    }
    /* leading zeros count too */
    memset(m + hl, '0', 1500);
    feed(m, hl + 1500, 0, MAX_HEAD, false, &r);
    cr_assert_eq(r.body_rc, -AGW_ETOOBIG);
    run_free(&r);
}

Test(http1, trailer_section_limit)
{
    static const char head[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n";
    char m[4096];
    size_t hl = strlen(head), n;
    struct run r;

    /* trailers of exactly 64 bytes (the final empty line included) pass a 64-byte limit */
    memcpy(m, head, hl);
    n = hl +
        (size_t)snprintf(m + hl, sizeof(m) - hl, "X-A: %0*d\r\nX-B: %0*d\r\n\r\n", 24, 0, 24, 0);
    cr_assert_eq(n - hl, 64);
    for (size_t step = 0; step < 8; step++) {
        feed(m, n, step, 64, false, &r);
        cr_assert_eq(r.head_rc, 0);
        cr_assert_eq(r.body_rc, 1, "step %zu: %d", step, r.body_rc);
        run_free(&r);
        feed(m, n, step, 63, false, &r);
        cr_assert_eq(r.body_rc, -AGW_ETOOBIG, "step %zu: %d", step, r.body_rc);
        run_free(&r);
    }
    /* an endless trailer section of short lines fails too */
    n = hl;
    for (int i = 0; i < 200; i++)
        n += (size_t)snprintf(m + n, sizeof(m) - n, "T%d: v\r\n", i);
    feed(m, n, 0, MAX_HEAD, false, &r);
    cr_assert_eq(r.body_rc, -AGW_ETOOBIG, "%d", r.body_rc);
    run_free(&r);
    /* and so does one endless trailer line */
    memset(m + hl, 't', 2000);
    feed(m, hl + 2000, 100, MAX_HEAD, false, &r);
    cr_assert_eq(r.body_rc, -AGW_ETOOBIG, "%d", r.body_rc);
    run_free(&r);
}

/* ---- connection reuse ------------------------------------------------------------------------ */

Test(http1, keep_alive_rules)
{
    static const struct {
        const char *m;
        enum agw_http1_body body;
        bool keep_alive;
    } cases[] = {
        {"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", AGW_HTTP1_BODY_LENGTH, true},
        {"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", AGW_HTTP1_BODY_LENGTH,
         false},
        {"HTTP/1.1 200 OK\r\nConnection: Upgrade, CLOSE\r\nContent-Length: 0\r\n\r\n",
         AGW_HTTP1_BODY_LENGTH, false},
        {"HTTP/1.1 200 OK\r\nConnection: closed\r\nContent-Length: 0\r\n\r\n",
         AGW_HTTP1_BODY_LENGTH, true},
        {"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nConnection: close\r\nContent-Length: "
         "0\r\n\r\n",
         AGW_HTTP1_BODY_LENGTH, false},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", AGW_HTTP1_BODY_CHUNKED, true},
        {"HTTP/1.1 200 OK\r\n\r\n", AGW_HTTP1_BODY_CLOSE, false},
        {"HTTP/1.1 204 No Content\r\n\r\n", AGW_HTTP1_BODY_NONE, true},
        {"HTTP/1.1 304 Not Modified\r\nConnection: close\r\n\r\n", AGW_HTTP1_BODY_NONE, false},
        /* Transfer-Encoding wins over Content-Length, but the connection is not trusted again */
        {"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
         AGW_HTTP1_BODY_CHUNKED, false},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
         AGW_HTTP1_BODY_CHUNKED, false},
        /* HTTP/1.0 */
        {"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", AGW_HTTP1_BODY_LENGTH, false},
        {"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n",
         AGW_HTTP1_BODY_LENGTH, true},
        {"HTTP/1.0 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 0\r\n\r\n",
         AGW_HTTP1_BODY_LENGTH, false},
        {"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n", AGW_HTTP1_BODY_CLOSE, false},
        {"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n",
         AGW_HTTP1_BODY_CHUNKED, false},
        {"HTTP/1.0 204 No Content\r\nConnection: keep-alive\r\n\r\n", AGW_HTTP1_BODY_NONE, true},
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        struct run r;
        FEED(cases[i].m, 0, false, &r);
        cr_assert_eq(r.head_rc, 0, "case %zu", i);
        cr_assert_eq(r.resp.body, cases[i].body, "case %zu", i);
        cr_assert_eq(r.resp.keep_alive, cases[i].keep_alive, "case %zu", i);
        run_free(&r);
    }
}

Test(http1, http10_close_delimited_and_keep_alive)
{
    static const char closed[] = "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
                                 "data: 1\n\ndata: 2\n\n";
    static const char kept[] = "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n"
                               "Content-Length: 9\r\n\r\ndata: 1\n\n"
                               "HTTP/1.0 200 OK\r\n";
    struct run r;

    FEED(closed, 5, true, &r);
    cr_assert_eq(r.resp.minor_version, 0);
    cr_assert_eq(r.resp.body, AGW_HTTP1_BODY_CLOSE);
    cr_assert_not(r.resp.keep_alive);
    cr_assert_eq(r.body_rc, 1);
    cr_assert_str_eq(r.body, "data: 1\n\ndata: 2\n\n");
    run_free(&r);

    FEED(kept, 0, false, &r);
    cr_assert_eq(r.resp.minor_version, 0);
    cr_assert(r.resp.keep_alive);
    cr_assert_eq(r.body_rc, 1);
    cr_assert_str_eq(r.body, "data: 1\n\n");
    cr_assert_str_eq(r.left, "HTTP/1.0 200 OK\r\n");
    run_free(&r);
}

/* parse_eof() in every state a response can be cut in. */
Test(http1, eof_in_each_state)
{
    static const struct {
        const char *m;
        int rc;
    } cases[] = {
        {"", -AGW_EPROTO},                              /* nothing at all */
        {"HTTP/1.1 200 OK\r\nContent-", -AGW_EPROTO},   /* in the head */
        {"HTTP/1.1 100 Continue\r\n\r\n", -AGW_EPROTO}, /* only an interim answer */
        {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", -AGW_EPROTO},
        {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhell", -AGW_EPROTO},
        {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", 1},
        {"HTTP/1.1 204 No Content\r\n\r\n", 1},
        {"HTTP/1.1 200 OK\r\n\r\n", 1},
        {"HTTP/1.1 200 OK\r\n\r\nsome bytes", 1},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", -AGW_EPROTO},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5", -AGW_EPROTO},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", -AGW_EPROTO},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello", -AGW_EPROTO},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r", -AGW_EPROTO},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", -AGW_EPROTO},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n", -AGW_EPROTO},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: v\r\n", -AGW_EPROTO},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r", -AGW_EPROTO},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 1},
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        struct agw_http1_parser *p = agw_http1_parser_new(MAX_HEAD);
        struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
        struct agw_http1_response resp = {0};

        evbuffer_add(in, cases[i].m, strlen(cases[i].m));
        if (agw_http1_parse_head(p, in, &resp) == 0)
            cr_assert_geq(agw_http1_parse_body(p, in, out), 0, "case %zu", i);
        cr_assert_eq(agw_http1_parse_eof(p), cases[i].rc, "case %zu", i);
        cr_assert_eq(agw_http1_parse_eof(p), cases[i].rc, "case %zu, again", i);
        agw_http1_response_clear(&resp);
        evbuffer_free(in);
        evbuffer_free(out);
        agw_http1_parser_free(p);
    }
}

Test(http1, pipelined_leftover_stays_in_input)
{
    static const char *const firsts[] = {
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nT: 1\r\n\r\n",
        "HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n2\nok\n0\n\n",
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    };
    static const char second[] = "HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\n\r\nnope";

    for (size_t i = 0; i < AGW_ARRAY_LEN(firsts); i++) {
        for (int with_reset = 0; with_reset < 2; with_reset++) {
            struct agw_http1_parser *p = agw_http1_parser_new(MAX_HEAD);
            struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
            struct agw_http1_response resp;
            char *s;
            size_t n;

            evbuffer_add_printf(in, "%s%s", firsts[i], second);
            cr_assert_eq(agw_http1_parse_head(p, in, &resp), 0);
            cr_assert_eq(resp.status, 200);
            cr_assert_eq(agw_http1_parse_body(p, in, out), 1, "case %zu", i);
            s = take_all(out, &n);
            cr_assert_str_eq(s, "ok");
            free(s);
            s = take_all(in, &n);
            cr_assert_str_eq(s, second, "case %zu: the next response stays in <in>", i);
            evbuffer_add(in, s, n);
            free(s);
            cr_assert_eq(agw_http1_parse_eof(p), 1);
            agw_http1_response_clear(&resp);

            if (with_reset)
                agw_http1_parser_reset(p);
            cr_assert_eq(agw_http1_parse_head(p, in, &resp), 0);
            cr_assert_eq(resp.status, 404);
            cr_assert(resp.keep_alive);
            cr_assert_eq(agw_http1_parse_body(p, in, out), 1);
            s = take_all(out, &n);
            cr_assert_str_eq(s, "nope");
            free(s);
            cr_assert_eq(evbuffer_get_length(in), 0);
            agw_http1_response_clear(&resp);
            evbuffer_free(in);
            evbuffer_free(out);
            agw_http1_parser_free(p);
        }
    }
}

Test(http1, reset_and_reuse)
{
    struct agw_http1_parser *p = agw_http1_parser_new(64);
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
    struct agw_http1_response resp;

    /* a failure is sticky until a reset ... */
    evbuffer_add_printf(in, "HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n");
    cr_assert_eq(agw_http1_parse_head(p, in, &resp), -AGW_EPROTO);
    evbuffer_drain(in, evbuffer_get_length(in));
    evbuffer_add_printf(in, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx");
    cr_assert_eq(agw_http1_parse_head(p, in, &resp), -AGW_EPROTO);
    /* ... after which the parser is as new, max_head included */
    agw_http1_parser_reset(p);
    cr_assert_eq(agw_http1_parse_head(p, in, &resp), 0);
    cr_assert_eq(agw_http1_parse_body(p, in, out), 1);
    agw_http1_response_clear(&resp);

    /* a reset in the middle of a head forgets how far it had looked */
    evbuffer_add_printf(in, "HTTP/1.1 200 OK\r\nA: b\r\n");
    cr_assert_eq(agw_http1_parse_head(p, in, &resp), AGW_AGAIN);
    agw_http1_parser_reset(p);
    evbuffer_drain(in, evbuffer_get_length(in));
    evbuffer_add_printf(in, "HTTP/1.1 201 Created\r\n\r\n");
    cr_assert_eq(agw_http1_parse_head(p, in, &resp), 0);
    cr_assert_eq(resp.status, 201);
    cr_assert_eq(resp.body, AGW_HTTP1_BODY_CLOSE);
    cr_assert_eq(agw_http1_parse_eof(p), 1);
    agw_http1_response_clear(&resp);

    /* the limit survives the resets */
    agw_http1_parser_reset(p);
    evbuffer_add_printf(in, "HTTP/1.1 200 OK\r\nX: %080d\r\n\r\n", 0);
    cr_assert_eq(agw_http1_parse_head(p, in, &resp), -AGW_ETOOBIG);

    agw_http1_response_clear(&resp);
    agw_http1_response_clear(&resp);
    evbuffer_free(in);
    evbuffer_free(out);
    agw_http1_parser_free(p);
    agw_http1_parser_free(NULL);
}

/* ---- requests (the server side) ------------------------------------------------------------ */

static const struct agw_http1_request_limits REQ_LIMITS = {
    .max_line = 256, .max_fields = 8, .max_body = 1000};

struct req_run {
    int head_rc, body_rc;
    struct agw_http1_request req;
    bool over_limit;
    char *head, *body, *left; /* owned, NUL-terminated */
    size_t head_len, body_len, left_len;
};

/* Feeds <msg> in reads of <step> bytes (0 = at once) to a request parser: the head, then (once the
 * caller has taken the head) the body, after each read. */
static void req_feed(const char *msg, size_t step, struct req_run *r)
{
    struct agw_http1_parser *p = agw_http1_request_parser_new(1024, &REQ_LIMITS);
    struct evbuffer *in = evbuffer_new(), *head = evbuffer_new(), *out = evbuffer_new();
    size_t len = strlen(msg);
    bool have_head = false;

    memset(r, 0, sizeof(*r));
    r->head_rc = r->body_rc = AGW_AGAIN;
    if (step == 0)
        step = len > 0 ? len : 1;
    for (size_t off = 0; off < len;) {
        size_t n = len - off < step ? len - off : step;

        add_read(in, msg + off, n);
        off += n;
        if (!have_head) {
            r->head_rc = agw_http1_parse_request_head(p, in, &r->req);
            if (r->head_rc == AGW_AGAIN)
                continue;
            if (r->head_rc < 0)
                break;
            have_head = true;
            evbuffer_remove_buffer(in, head, r->req.head_len);
        }
        r->body_rc = agw_http1_parse_body(p, in, out);
        if (r->body_rc != 0)
            break;
    }
    r->over_limit = agw_http1_body_over_limit(p);
    r->head = take_all(head, &r->head_len);
    r->body = take_all(out, &r->body_len);
    r->left = take_all(in, &r->left_len);
    evbuffer_free(in);
    evbuffer_free(head);
    evbuffer_free(out);
    agw_http1_parser_free(p);
}

static void req_run_free(struct req_run *r)
{
    free(r->head);
    free(r->body);
    free(r->left);
}

/* <msg> is refused with <status>, whatever the reads' sizes. */
static void expect_refused(const char *msg, int status)
{
    size_t steps[] = {0, 1, 2, 7};

    for (size_t i = 0; i < AGW_ARRAY_LEN(steps); i++) {
        struct req_run r;

        req_feed(msg, steps[i], &r);
        cr_assert(r.head_rc < 0 || r.body_rc < 0, "accepted (step %zu): %s", steps[i], msg);
        if (r.head_rc < 0) {
            cr_assert_eq(r.req.status, status, "step %zu: %d instead of %d for: %s", steps[i],
                         r.req.status, status, msg);
            cr_assert_not_null(r.req.error);
        } else {
            cr_assert_eq(status, r.over_limit ? 413 : 400, "body refused (step %zu): %s", steps[i],
                         msg);
        }
        req_run_free(&r);
    }
}

/* <msg> is one complete request whose decoded body is <body>, with nothing left over. */
static void expect_request(const char *msg, const char *body)
{
    size_t steps[] = {0, 1, 3, 5};

    for (size_t i = 0; i < AGW_ARRAY_LEN(steps); i++) {
        struct req_run r;

        req_feed(msg, steps[i], &r);
        cr_assert_eq(r.head_rc, 0, "head refused (step %zu, %s): %s", steps[i],
                     r.req.error ? r.req.error : "", msg);
        cr_assert_eq(r.body_rc, 1, "body not complete (step %zu): %s", steps[i], msg);
        cr_assert_str_eq(r.body, body, "step %zu", steps[i]);
        cr_assert_eq(r.left_len, 0, "step %zu", steps[i]);
        req_run_free(&r);
    }
}

Test(http1_request, valid_requests)
{
    expect_request("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "");
    expect_request("\r\n\r\nGET / HTTP/1.1\r\nHost: \r\n\r\n", "");
    expect_request("POST /a?b=c HTTP/1.1\r\nHost: h:80\r\nContent-Length: 5\r\n\r\nhello", "hello");
    expect_request("OPTIONS * HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", "");
    expect_request("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "3;ext=1\r\nabc\r\n2;a=\"q\"\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n",
                   "abcde");
    /* Transfer codings are case-insensitive and OWS around them is no part of them. */
    expect_request(
        "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: CHUNKED\r\n\r\n1\r\na\r\n0\r\n\r\n", "a");
    expect_request("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked \r\n\r\n0\r\n\r\n",
                   "");
    expect_request(
        "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n1", "1");
    /* obs-text in a value passes; HTAB inside a value too. */
    expect_request("GET / HTTP/1.1\r\nHost: x\r\nX-A: caf\xc3\xa9\tb\r\n\r\n", "");
}

Test(http1_request, what_the_head_says)
{
    struct req_run r;

    req_feed("HEAD / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Close\r\n"
             "Expect: 100-continue\r\nContent-Length: 2\r\n\r\nab",
             0, &r);
    cr_assert_eq(r.head_rc, 0);
    cr_assert(r.req.head_method);
    cr_assert(r.req.close);
    cr_assert(r.req.expect_continue);
    cr_assert(!r.req.rewrite);
    cr_assert_eq(r.req.body, AGW_HTTP1_BODY_LENGTH);
    cr_assert_eq(r.req.content_length, 2);
    cr_assert_eq(r.head_len, r.req.head_len);
    req_run_free(&r);

    req_feed("POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX-B: 2\r\n\r\n"
             "2\r\nhi\r\n0\r\n\r\n",
             0, &r);
    cr_assert_eq(r.body_rc, 1);
    cr_assert(r.req.rewrite);
    cr_assert_eq(r.req.body, AGW_HTTP1_BODY_CHUNKED);
    cr_assert_eq(r.req.n_fields, 3);
    cr_assert_eq(r.body_len, 2);
    req_run_free(&r);
}

/* The fields the gate keeps: names and values in order, the OWS around a value gone, split in
 * place; a repeated name twice; an empty value empty. */
Test(http1_request, fields_are_split_in_place_in_order)
{
    char head[] = "POST /r HTTP/1.1\r\nHost: h\r\nX-A:  one two \t\r\nx-a:2\r\n"
                  "X-Empty:\r\nTraceparent:\t00-ab \r\n\r\n";
    struct agw_http1_request_limits lim = {.max_line = 8192, .max_fields = 100, .max_body = 1024};
    struct agw_http1_parser *p = agw_http1_request_parser_new(65536, &lim);
    struct agw_http1_request req;
    struct evbuffer *in = evbuffer_new();
    struct agw_http1_field f[8];
    char again[sizeof(head)];
    static const char *const names[] = {"Host", "X-A", "x-a", "X-Empty", "Traceparent"};
    static const char *const values[] = {"h", "one two", "2", "", "00-ab"};

    memcpy(again, head, sizeof(head));
    evbuffer_add(in, head, strlen(head));
    cr_assert_eq(agw_http1_parse_request_head(p, in, &req), 0);
    cr_assert_eq(req.head_len, strlen(head));
    cr_assert_eq(req.n_fields, 5);
    cr_assert_eq(agw_http1_request_fields(head, req.head_len, f, 8), 5);
    for (size_t i = 0; i < 5; i++) {
        cr_assert_str_eq(f[i].name, names[i], "field %zu", i);
        cr_assert_str_eq(f[i].value, values[i], "field %zu", i);
        cr_assert_eq(f[i].name_len, strlen(names[i]));
        cr_assert_eq(f[i].value_len, strlen(values[i]));
        cr_assert(f[i].name >= head && f[i].value < head + sizeof(head), "in place");
    }
    cr_assert_eq(strncmp(head, "POST /r HTTP/1.1\r\n", 18), 0, "the request line untouched");
    cr_assert_eq(agw_http1_request_fields(again, req.head_len, f, 2), 2, "at most <max>");
    cr_assert_str_eq(f[1].value, "one two");
    evbuffer_free(in);
    agw_http1_parser_free(p);
}

/* What a request head says through field <name> (spelled as given) with <value>, as a bit set:
 * 1 close, 2 expect_continue, 4 a body of 2 bytes by length, 8 chunked, 16 refused (a second Host
 * or Authorization). */
static unsigned said_by(const char *name, const char *value)
{
    char msg[256];
    struct req_run r;
    unsigned said = 0;

    snprintf(msg, sizeof(msg), "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: a\r\n%s: %s\r\n\r\n",
             name, value);
    req_feed(msg, 0, &r);
    if (r.head_rc < 0)
        said |= 16;
    said |=
        (r.head_rc >= 0 && r.req.close ? 1u : 0) |
        (r.head_rc >= 0 && r.req.expect_continue ? 2u : 0) |
        (r.head_rc >= 0 && r.req.body == AGW_HTTP1_BODY_LENGTH && r.req.content_length == 2 ? 4u
                                                                                            : 0) |
        (r.head_rc >= 0 && r.req.body == AGW_HTTP1_BODY_CHUNKED ? 8u : 0);
    req_run_free(&r);
    return said;
}

/* The names the parsers act on are told in any case, and only they: every spelling with one
 * letter's case flipped, all capitals, and alternating capitals are the name; one byte changed to
 * another token character, one dropped or one added is another field. (The names are compared
 * eight bytes at a time with a case mask, in src/http1.c.) */
Test(http1_request, field_names_in_any_case_and_only_those)
{
    static const struct {
        const char *name, *value;
        unsigned said;
    } cases[] = {
        {"connection", "close", 1}, {"expect", "100-continue", 2},
        {"content-length", "2", 4}, {"transfer-encoding", "chunked", 8},
        {"host", "y", 16},          {"authorization", "b", 16},
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        const char *name = cases[i].name;
        size_t n = strlen(name);
        char v[32];

        for (size_t k = 0; k <= n + 2; k++) { /* k < n: letter k flipped; then upper, alternating */
            for (size_t j = 0; j < n; j++) {
                bool up = k < n ? j == k : k == n ? true : j % 2 == 0;
                v[j] = up && name[j] >= 'a' && name[j] <= 'z' ? (char)(name[j] - 32) : name[j];
            }
            v[n] = '\0';
            cr_assert_eq(said_by(v, cases[i].value), cases[i].said, "%s", v);
        }
        for (size_t j = 0; j < n; j++) { /* one byte changed */
            memcpy(v, name, n + 1);
            v[j] = name[j] == '-' ? '_' : name[j] == 'z' ? 'y' : (char)(name[j] + 1);
            cr_assert_eq(said_by(v, cases[i].value), 0, "%s", v);
            v[j] = name[j] == '-' ? '.' : (char)(name[j] - 32 + 1 == 'Z' + 1 ? 'A' : name[j] - 31);
            cr_assert_eq(said_by(v, cases[i].value), 0, "%s", v);
        }
        memcpy(v, name, n - 1); /* one byte short, one too many */
        v[n - 1] = '\0';
        cr_assert_eq(said_by(v, cases[i].value), 0, "%s", v);
        memcpy(v, name, n);
        memcpy(v + n, "s", 2);
        cr_assert_eq(said_by(v, cases[i].value), 0, "%s", v);
    }
}

Test(http1_request, smuggling_shapes_are_refused)
{
    const char *tail = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
    char msg[512];

    snprintf(msg, sizeof(msg),
             "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n%s", tail);
    expect_refused(msg, 501);
    snprintf(msg, sizeof(msg), "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n%s",
             tail);
    expect_refused(msg, 501);
    snprintf(msg, sizeof(msg),
             "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: "
             "chunked\r\n\r\n%s",
             tail);
    expect_refused(msg, 400);
    snprintf(msg, sizeof(msg), "POST / HTTP/1.1\r\nHost: x\r\nContent-Length : 43\r\n\r\n%s", tail);
    expect_refused(msg, 400);
    snprintf(msg, sizeof(msg),
             "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: "
             "chunked\r\n\r\n0\r\n\r\n%s",
             tail);
    expect_refused(msg, 400);
    expect_refused(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400);
    expect_refused(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", 400);
    expect_refused("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 3\r\n\r\nabc", 400);
    /* 2^64 + 1 must not wrap to 1. */
    expect_refused("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "10000000000000001\r\na\r\n0\r\n\r\n",
                   400);
}

Test(http1_request, malformed_requests_are_refused)
{
    expect_refused("GET /healthz HTTP/1.1\nHost: x\n\n", 400);
    expect_refused("GET /healthz HTTP/1.1\r\nHost: x\n\r\n", 400);
    expect_refused("GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  folded\r\n\r\n", 400);
    expect_refused("get /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 400);
    expect_refused("GET  / HTTP/1.1\r\nHost: x\r\n\r\n", 400);
    expect_refused("GET / HTTP/1.1 \r\nHost: x\r\n\r\n", 400);
    expect_refused("GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", 400);
    expect_refused("GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n", 400);
    expect_refused("GET / HTTP/1.x\r\nHost: x\r\n\r\n", 400);
    expect_refused("GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505);
    expect_refused("GET / HTTP/1.0\r\nHost: x\r\n\r\n", 505);
    expect_refused("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400); /* a TLS ClientHello */
    expect_refused("SSH-2.0-x\r\n", 400);
    expect_refused("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello", 400);
    expect_refused("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400);
    expect_refused("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: \r\n\r\n", 400);
    expect_refused("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n\r\n",
                   400);
    expect_refused(
        "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\na\r\n0\r\n\r\n", 400);
    expect_refused(
        "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\n0\r\n\r\n", 400);
    expect_refused("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
                   400);
    expect_refused("GET / HTTP/1.1\r\nHost: x\r\nExpect: tea\r\n\r\n", 417);
    expect_refused("GET / HTTP/1.1\r\nHost: x y\r\n\r\n", 400);
}

Test(http1_request, header_validation)
{
    /* A NUL inside a value must not cut it short (a token followed by junk authenticates). */
    static const char nul[] = "GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\0junk\r\n\r\n";
    struct agw_http1_parser *p = agw_http1_request_parser_new(1024, &REQ_LIMITS);
    struct evbuffer *in = evbuffer_new();
    struct agw_http1_request req;

    evbuffer_add(in, nul, sizeof(nul) - 1);
    cr_assert_eq(agw_http1_parse_request_head(p, in, &req), -AGW_EPROTO);
    cr_assert_eq(req.status, 400);
    agw_http1_parser_free(p);
    evbuffer_free(in);

    expect_refused("GET / HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n", 400);
    expect_refused("GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x7f\r\n\r\n", 400);
    expect_refused("GET / HTTP/1.1\r\nHost: x\r\nX(A): 1\r\n\r\n", 400);
    expect_refused("GET / HTTP/1.1\r\nHost: x\r\n: 1\r\n\r\n", 400);
    expect_refused("GET / HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n", 400);
    expect_refused("GET / HTTP/1.1\r\nX-A: 1\r\n\r\n", 400);
    expect_refused("GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400);
    expect_refused("GET / HTTP/1.1\r\nHost: x\r\nAuthorization: a\r\nauthorization: b\r\n\r\n",
                   400);
}

/* The RFC's byte classes, written out independently of the parser's table and vector code. */
static bool oracle_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static bool oracle_field_char(unsigned char c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

/* <head> (with one '@' to replace) parsed by the request parser (<request>) or the response parser:
 * accepted or not. */
static bool head_accepted(const char *head, size_t len, bool request)
{
    struct agw_http1_parser *p =
        request ? agw_http1_request_parser_new(4096, &REQ_LIMITS) : agw_http1_parser_new(4096);
    struct evbuffer *in = evbuffer_new();
    struct agw_http1_request req;
    struct agw_http1_response resp;
    int rc;

    evbuffer_add(in, head, len);
    if (request) {
        rc = agw_http1_parse_request_head(p, in, &req);
    } else {
        rc = agw_http1_parse_head(p, in, &resp);
        if (rc == 0)
            agw_http1_response_clear(&resp);
    }
    evbuffer_free(in);
    agw_http1_parser_free(p);
    cr_assert(rc == 0 || rc < 0, "a whole head: %d", rc);
    return rc == 0;
}

/* Every byte value in a header name, and at each of 40 places in a header value (the vector path
 * and the tail after it; spaces and tabs at either end are trimmed, and pass), on both sides:
 * accepted exactly when the RFC's grammar allows it. A line feed ends a line and a colon ends a
 * name: they are not field bytes to classify. */
Test(http1, every_byte_in_names_and_values)
{
    static const char *const pre[2] = {"HTTP/1.1 200 OK\r\n", "GET / HTTP/1.1\r\nHost: x\r\n"};
    static const char *const post[2] = {"\r\nContent-Length: 0\r\n\r\n", "\r\n\r\n"};

    for (int side = 0; side < 2; side++) {
        for (unsigned c = 0; c < 256; c++) {
            char field[64], head[160];
            int n;

            if (c == '\n' || c == ':')
                continue;
            snprintf(field, sizeof(field), "X-@b: v");
            n = snprintf(head, sizeof(head), "%s%s%s", pre[side], field, post[side]);
            *strchr(head, '@') = (char)c;
            cr_assert_eq(head_accepted(head, (size_t)n, side == 1), oracle_tchar((unsigned char)c),
                         "side %d: byte 0x%02x in a name", side, c);
            for (int at = 0; at < 40; at++) {
                memset(field, 'a', sizeof(field));
                memcpy(field, "X-V: ", 5);
                field[5 + at] = '@';
                field[45] = '\0';
                n = snprintf(head, sizeof(head), "%s%s%s", pre[side], field, post[side]);
                *strchr(head, '@') = (char)c;
                cr_assert_eq(head_accepted(head, (size_t)n, side == 1),
                             oracle_field_char((unsigned char)c),
                             "side %d: byte 0x%02x at %d of a value", side, c, at);
            }
        }
    }
}

Test(http1_request, limits_fail_as_soon_as_they_show)
{
    char msg[4096];
    struct req_run r;
    size_t n;

    /* The 9th field, with max_fields 8, before the head is complete. */
    n = (size_t)snprintf(msg, sizeof(msg), "GET / HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < 8; i++)
        n += (size_t)snprintf(msg + n, sizeof(msg) - n, "a:\r\n");
    req_feed(msg, 0, &r);
    cr_assert_eq(r.head_rc, -AGW_ETOOBIG);
    cr_assert_eq(r.req.status, 431);
    req_run_free(&r);
    /* 8 fields are fine. */
    n = (size_t)snprintf(msg, sizeof(msg), "GET / HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < 7; i++)
        n += (size_t)snprintf(msg + n, sizeof(msg) - n, "a:\r\n");
    snprintf(msg + n, sizeof(msg) - n, "\r\n");
    expect_request(msg, "");

    /* A request line over max_line: 414 with no line end in sight. */
    n = (size_t)snprintf(msg, sizeof(msg), "GET /");
    memset(msg + n, 'a', 300);
    msg[n + 300] = '\0';
    req_feed(msg, 0, &r);
    cr_assert_eq(r.req.status, 414);
    req_run_free(&r);
    /* A field line over max_line: 431, unterminated too. */
    n = (size_t)snprintf(msg, sizeof(msg), "GET / HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(msg + n, 'a', 300);
    msg[n + 300] = '\0';
    req_feed(msg, 0, &r);
    cr_assert_eq(r.req.status, 431);
    req_run_free(&r);
    /* A line of exactly max_line passes. */
    n = (size_t)snprintf(msg, sizeof(msg), "GET / HTTP/1.1\r\nHost: x\r\nX: ");
    memset(msg + n, 'a', 256 - 3);
    snprintf(msg + n + 253, sizeof(msg) - n - 253, "\r\n\r\n");
    expect_request(msg, "");
    /* The whole head over max_head (1024) with short lines. */
    struct agw_http1_request_limits many = REQ_LIMITS;
    many.max_fields = 1000;
    struct agw_http1_parser *p = agw_http1_request_parser_new(1024, &many);
    struct evbuffer *in = evbuffer_new();
    struct agw_http1_request req;
    evbuffer_add_printf(in, "GET / HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < 200; i++)
        evbuffer_add_printf(in, "a%d: b\r\n", i);
    cr_assert_eq(agw_http1_parse_request_head(p, in, &req), -AGW_ETOOBIG);
    cr_assert_eq(req.status, 431);
    agw_http1_parser_free(p);
    evbuffer_free(in);

    /* Bodies: Content-Length over max_body at once; a chunk over what is left at its size line. */
    expect_refused("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n", 413);
    req_feed("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFF\r\n", 0, &r);
    cr_assert_eq(r.body_rc, -AGW_ETOOBIG);
    cr_assert(r.over_limit);
    req_run_free(&r);
    req_feed("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
             "1F4\r\n",
             0, &r);
    cr_assert_eq(r.body_rc, 0, "500 bytes announced: within the limit");
    req_run_free(&r);
    /* 500 + 501 > 1000: refused at the second size line. */
    char big[1200];
    n = (size_t)snprintf(big, sizeof(big),
                         "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1F4\r\n");
    memset(big + n, 'a', 500);
    snprintf(big + n + 500, sizeof(big) - n - 500, "\r\n1F5\r\n");
    req_feed(big, 0, &r);
    cr_assert_eq(r.body_rc, -AGW_ETOOBIG);
    cr_assert(r.over_limit);
    req_run_free(&r);
    /* An over-long chunk line is a framing error, not the body limit. */
    n = (size_t)snprintf(big, sizeof(big),
                         "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1;");
    memset(big + n, 'e', 1100);
    big[n + 1100] = '\0';
    req_feed(big, 0, &r);
    cr_assert_eq(r.body_rc, -AGW_ETOOBIG);
    cr_assert(!r.over_limit);
    req_run_free(&r);
}

Test(http1_request, pipelined_requests_one_after_the_other)
{
    static const char two[] = "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nabGET /b "
                              "HTTP/1.1\r\nHost: x\r\n\r\nGET /c HTTP/1.1\r\nHost: x\r\n\r\n";
    struct agw_http1_parser *p = agw_http1_request_parser_new(1024, &REQ_LIMITS);
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
    struct agw_http1_request req;
    const char *paths[] = {"/a", "/b", "/c"};

    evbuffer_add(in, two, sizeof(two) - 1);
    for (size_t i = 0; i < 3; i++) {
        char line[16] = {0};

        cr_assert_eq(agw_http1_parse_request_head(p, in, &req), 0, "request %zu", i);
        evbuffer_copyout(in, line, 5 + strlen(paths[i]));
        cr_assert(strstr(line, paths[i]) != NULL, "request %zu: %s", i, line);
        evbuffer_drain(in, req.head_len);
        cr_assert_eq(agw_http1_parse_body(p, in, out), 1);
        agw_http1_parser_reset(p);
    }
    cr_assert_eq(evbuffer_get_length(in), 0);
    cr_assert_eq(evbuffer_get_length(out), 2);
    cr_assert_eq(agw_http1_parse_request_head(p, in, &req), AGW_AGAIN);
    agw_http1_parser_free(p);
    evbuffer_free(in);
    evbuffer_free(out);
}

Test(http1_request, errors_are_sticky)
{
    struct agw_http1_parser *p = agw_http1_request_parser_new(1024, &REQ_LIMITS);
    struct evbuffer *in = evbuffer_new();
    struct agw_http1_request req;

    evbuffer_add_printf(in, "GET / HTTP/1.1\nHost: x\n\n");
    cr_assert_eq(agw_http1_parse_request_head(p, in, &req), -AGW_EPROTO);
    evbuffer_drain(in, evbuffer_get_length(in));
    evbuffer_add_printf(in, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(agw_http1_parse_request_head(p, in, &req), -AGW_EPROTO);
    agw_http1_parser_reset(p);
    cr_assert_eq(agw_http1_parse_request_head(p, in, &req), 0);
    agw_http1_parser_free(p);
    evbuffer_free(in);
}

/* A request parser in memory the caller allocated (the server keeps its parsers on a heap of its
 * own): it parses as one from agw_http1_request_parser_new() does, a chunk-size line cut between
 * reads included (the one thing it allocates), and agw_http1_parser_clear() frees that. */
Test(http1_request, parser_in_caller_memory)
{
    void *mem = malloc(agw_http1_request_parser_size());
    struct agw_http1_parser *p = agw_http1_request_parser_init(mem, 1024, &REQ_LIMITS);
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
    struct agw_http1_request req;

    cr_assert_eq((void *)p, mem);
    evbuffer_add_printf(in, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    cr_assert_eq(agw_http1_parse_request_head(p, in, &req), 0);
    evbuffer_drain(in, req.head_len);
    evbuffer_add_printf(in, "3;ext=");
    cr_assert_eq(agw_http1_parse_body(p, in, out), 0);
    evbuffer_add_printf(in, "1\r\nabc\r\n0\r\n\r\n");
    cr_assert_eq(agw_http1_parse_body(p, in, out), 1);
    cr_assert_eq(evbuffer_get_length(out), 3);
    agw_http1_parser_clear(p);
    agw_http1_parser_clear(NULL);
    /* Cleared, it can be made again in the same memory, cut line and all. */
    p = agw_http1_request_parser_init(mem, 1024, &REQ_LIMITS);
    evbuffer_drain(in, evbuffer_get_length(in));
    evbuffer_add_printf(in, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1");
    cr_assert_eq(agw_http1_parse_request_head(p, in, &req), 0);
    evbuffer_drain(in, req.head_len);
    cr_assert_eq(agw_http1_parse_body(p, in, out), 0);
    agw_http1_parser_clear(p);
    free(mem);
    evbuffer_free(in);
    evbuffer_free(out);
}

/* The method as sent, and where the Origin field's value lies in the head: kept for the server's
 * own answers (a 404 naming the method, the CORS fields of a refusal), also when the head is
 * refused after its fields were read. */
Test(http1_request, the_method_and_the_origin_are_kept)
{
    static const char head[] = "PURGE /x HTTP/1.1\r\nHost: x\r\nOrigin:  http://app.test:3000 \r\n"
                               "Content-Length: 5000\r\n\r\n";
    struct agw_http1_parser *p = agw_http1_request_parser_new(1024, &REQ_LIMITS);
    struct evbuffer *in = evbuffer_new();
    struct agw_http1_request req;

    evbuffer_add(in, head, sizeof(head) - 1);
    cr_assert_eq(agw_http1_parse_request_head(p, in, &req), -AGW_ETOOBIG);
    cr_assert_eq(req.status, 413);
    cr_assert_str_eq(req.method, "PURGE");
    cr_assert_eq(req.origin_len, 20);
    cr_assert(memcmp(head + req.origin_at, "http://app.test:3000", 20) == 0 &&
                  head[req.origin_at + 20] == ' ',
              "the value, without the spaces around it");
    agw_http1_parser_free(p);
    evbuffer_free(in);

    p = agw_http1_request_parser_new(1024, &REQ_LIMITS);
    in = evbuffer_new();
    evbuffer_add_printf(in, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(agw_http1_parse_request_head(p, in, &req), 0);
    cr_assert_eq(req.origin_len, 0, "no Origin: none");
    cr_assert_str_eq(req.method, "GET");
    agw_http1_parser_free(p);
    evbuffer_free(in);
}
