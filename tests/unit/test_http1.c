/* Unit tests for src/http1.c: the upstream response parser. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>

#include "agw/http1.h"

struct parsed {
    int head_rc;
    struct agw_http1_response resp;
    int body_rc;
    char body[4096];
    size_t body_len;
};

/* Feeds <msg> in pieces of <step> bytes (0 = all at once), then EOF when <eof>. */
static void parse(const char *msg, size_t len, size_t step, bool eof, struct parsed *out)
{
    struct agw_http1_parser *p = agw_http1_parser_new(1024);
    struct evbuffer *in = evbuffer_new(), *body = evbuffer_new();
    size_t off = 0;
    bool head = false;

    memset(out, 0, sizeof(*out));
    out->head_rc = AGW_AGAIN;
    if (step == 0)
        step = len ? len : 1;
    while (off < len) {
        size_t n = len - off < step ? len - off : step;
        evbuffer_add(in, msg + off, n);
        off += n;
        if (!head) {
            out->head_rc = agw_http1_parse_head(p, in, &out->resp);
            if (out->head_rc == AGW_AGAIN)
                continue;
            if (out->head_rc < 0)
                goto done;
            head = true;
        }
        out->body_rc = agw_http1_parse_body(p, in, body);
        if (out->body_rc != 0)
            goto done;
    }
    if (head && eof && out->body_rc == 0)
        out->body_rc = agw_http1_parse_eof(p);
done:
    out->body_len = evbuffer_get_length(body);
    if (out->body_len >= sizeof(out->body))
        out->body_len = sizeof(out->body) - 1;
    evbuffer_remove(body, out->body, out->body_len);
    out->body[out->body_len] = '\0';
    evbuffer_free(in);
    evbuffer_free(body);
    agw_http1_parser_free(p);
}

#define PARSE(msg, step, eof, out) parse(msg, sizeof(msg) - 1, step, eof, out)

static const char sse_chunked[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                  "Transfer-Encoding: chunked\r\n\r\n"
                                  "c\r\ndata: {\"a\":1\r\n" /* a frame spanning chunks */
                                  "3;ext=1\r\n}\n\n\r\n"
                                  "19\r\ndata: {}\n\ndata: {\"b\":2}\n\n\r\n"
                                  "0\r\nX-Trailer: yes\r\n\r\n";
static const char sse_decoded[] = "data: {\"a\":1}\n\ndata: {}\n\ndata: {\"b\":2}\n\n";

Test(http1, chunked_at_every_split)
{
    for (size_t step = 0; step < 12; step++) {
        struct parsed r;
        PARSE(sse_chunked, step, false, &r);
        cr_assert_eq(r.head_rc, 0, "step %zu: %d", step, r.head_rc);
        cr_assert_eq(r.resp.status, 200);
        cr_assert_str_eq(r.resp.content_type, "text/event-stream");
        cr_assert_eq(r.resp.body, AGW_HTTP1_BODY_CHUNKED);
        cr_assert(r.resp.keep_alive);
        cr_assert_eq(r.body_rc, 1, "step %zu: %d", step, r.body_rc);
        cr_assert_str_eq(r.body, sse_decoded, "step %zu: %zu bytes, expected %zu", step, r.body_len,
                         strlen(sse_decoded));
        agw_http1_response_clear(&r.resp);
    }
}

Test(http1, content_length)
{
    static const char m[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
    for (size_t step = 0; step < 8; step++) {
        struct parsed r;
        PARSE(m, step, false, &r);
        cr_assert_eq(r.head_rc, 0);
        cr_assert_eq(r.resp.body, AGW_HTTP1_BODY_LENGTH);
        cr_assert_eq(r.resp.content_length, 5);
        cr_assert_eq(r.body_rc, 1);
        cr_assert_str_eq(r.body, "hello");
        agw_http1_response_clear(&r.resp);
    }
}

Test(http1, close_delimited)
{
    static const char m[] =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: {}\n\n";
    struct parsed r;
    PARSE(m, 3, true, &r);
    cr_assert_eq(r.resp.body, AGW_HTTP1_BODY_CLOSE);
    cr_assert_not(r.resp.keep_alive);
    cr_assert_eq(r.body_rc, 1, "EOF completes a close-delimited body");
    cr_assert_str_eq(r.body, "data: {}\n\n");
    agw_http1_response_clear(&r.resp);
}

Test(http1, cut_bodies_fail_at_eof)
{
    static const char len[] = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhel";
    static const char chk[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel";
    struct parsed r;
    PARSE(len, 0, true, &r);
    cr_assert_eq(r.body_rc, -AGW_EPROTO);
    agw_http1_response_clear(&r.resp);
    PARSE(chk, 0, true, &r);
    cr_assert_eq(r.body_rc, -AGW_EPROTO);
    cr_assert_str_eq(r.body, "hel");
    agw_http1_response_clear(&r.resp);
}

Test(http1, interim_responses_skipped_and_101_refused)
{
    static const char m[] =
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n"
        "HTTP/1.1 204 No Content\r\n\r\n";
    static const char up[] = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";
    struct parsed r;
    PARSE(m, 0, false, &r);
    cr_assert_eq(r.head_rc, 0);
    cr_assert_eq(r.resp.status, 204);
    cr_assert_eq(r.resp.body, AGW_HTTP1_BODY_NONE);
    cr_assert_eq(r.body_rc, 1);
    agw_http1_response_clear(&r.resp);
    PARSE(up, 0, false, &r);
    cr_assert_eq(r.head_rc, -AGW_EPROTO);
}

Test(http1, keep_alive_rules)
{
    struct parsed r;
    PARSE("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", 0, false, &r);
    cr_assert_not(r.resp.keep_alive);
    agw_http1_response_clear(&r.resp);
    PARSE("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", 0, false, &r);
    cr_assert_eq(r.resp.minor_version, 0);
    cr_assert_not(r.resp.keep_alive);
    agw_http1_response_clear(&r.resp);
    PARSE("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n", 0, false, &r);
    cr_assert(r.resp.keep_alive);
    agw_http1_response_clear(&r.resp);
    PARSE("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 0,
          false, &r);
    cr_assert_eq(r.resp.body, AGW_HTTP1_BODY_CHUNKED, "Transfer-Encoding wins over Content-Length");
    cr_assert_not(r.resp.keep_alive);
    cr_assert_eq(r.body_rc, 1);
    agw_http1_response_clear(&r.resp);
}

Test(http1, bad_heads)
{
    static const char *const bad[] = {
        "HTTP/2.0 200 OK\r\n\r\n",
        "HTTP/1.1 20 OK\r\n\r\n",
        "HTTP/1.1 2000 OK\r\n\r\n",
        "HTTP/1.1 099 Odd\r\n\r\n",
        "ICY 200 OK\r\n\r\n",
        "HTTP/1.1 200 OK\r\nBad Header: x\r\n\r\n",
        "HTTP/1.1 200 OK\r\n: empty\r\n\r\n",
        "HTTP/1.1 200 OK\r\nA: b\r\n folded\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct parsed r;
        parse(bad[i], strlen(bad[i]), 0, false, &r);
        cr_assert_eq(r.head_rc, -AGW_EPROTO, "case %zu: %s", i, bad[i]);
    }
}

Test(http1, same_content_length_twice_is_fine_and_lf_heads_work)
{
    struct parsed r;
    PARSE("HTTP/1.1 200 OK\nContent-Length: 2\nContent-Length: 2\n\nok", 1, false, &r);
    cr_assert_eq(r.head_rc, 0);
    cr_assert_eq(r.body_rc, 1);
    cr_assert_str_eq(r.body, "ok");
    agw_http1_response_clear(&r.resp);
}

Test(http1, head_over_the_limit)
{
    char m[3000];
    int n = snprintf(m, sizeof(m), "HTTP/1.1 200 OK\r\nX-Big: ");
    memset(m + n, 'a', 2000);
    struct parsed r;
    parse(m, (size_t)n + 2000, 0, false, &r);
    cr_assert_eq(r.head_rc, -AGW_ETOOBIG, "an endless head fails at max_head");
    memcpy(m + n + 2000, "\r\n\r\n", 4);
    parse(m, (size_t)n + 2004, 0, false, &r);
    cr_assert_eq(r.head_rc, -AGW_ETOOBIG, "a complete head over max_head fails too");
}

Test(http1, bad_chunks)
{
    static const char *const bad[] = {
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFF\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3 x\r\nabc\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct parsed r;
        parse(bad[i], strlen(bad[i]), 0, false, &r);
        cr_assert_eq(r.head_rc, 0);
        cr_assert_eq(r.body_rc, -AGW_EPROTO, "case %zu: %d", i, r.body_rc);
        agw_http1_response_clear(&r.resp);
    }
    char m[2000];
    int n = snprintf(m, sizeof(m), "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;");
    memset(m + n, 'e', 1500);
    struct parsed r;
    parse(m, (size_t)n + 1500, 0, false, &r);
    cr_assert_eq(r.body_rc, -AGW_ETOOBIG, "an endless chunk-size line fails");
    agw_http1_response_clear(&r.resp);
}

Test(http1, pipelined_leftover_and_reuse)
{
    static const char two[] =
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 404 Not Found\r\n"
        "Content-Length: 0\r\n\r\n";
    struct agw_http1_parser *p = agw_http1_parser_new(1024);
    struct evbuffer *in = evbuffer_new(), *body = evbuffer_new();
    struct agw_http1_response resp;

    evbuffer_add(in, two, sizeof(two) - 1);
    cr_assert_eq(agw_http1_parse_head(p, in, &resp), 0);
    cr_assert_eq(agw_http1_parse_body(p, in, body), 1);
    cr_assert_eq(evbuffer_get_length(body), 2);
    cr_assert_gt(evbuffer_get_length(in), 0, "the next response stays in the input");
    agw_http1_response_clear(&resp);
    agw_http1_parser_reset(p);
    cr_assert_eq(agw_http1_parse_head(p, in, &resp), 0);
    cr_assert_eq(resp.status, 404);
    cr_assert_eq(agw_http1_parse_body(p, in, body), 1);
    cr_assert_eq(evbuffer_get_length(in), 0);
    agw_http1_response_clear(&resp);
    evbuffer_free(in);
    evbuffer_free(body);
    agw_http1_parser_free(p);
    agw_http1_parser_free(NULL);
}
