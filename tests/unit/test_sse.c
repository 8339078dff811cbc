/* Tests for src/sse.c: the incremental parser (against hand-written expectations, against itself
 * split at every byte, and against a naive whole-input reference model on random streams) and the
 * writer. */
#include <criterion/criterion.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "agw/sse.h"

/* ---- recording dispatched frames
 * ------------------------------------------------------------------- */

struct rframe {
    char *data;
    size_t len;
    char *event; /* NULL when the frame had none */
    char *id;
    long retry;
    bool framed;
};

struct rec {
    struct rframe *f;
    int n;
    int cap;
    int stop_at; /* return stop_rc from the stop_at-th frame (1-based); 0 = never */
    int stop_rc;
    char *log; /* every frame serialised, to compare runs byte for byte */
    size_t log_len;
};

static char *dup_or_null(const char *s)
{
    return s == NULL ? NULL : agw_xstrdup(s);
}

static void log_add(struct rec *r, const void *s, size_t n)
{
    r->log = realloc(r->log, r->log_len + n + 1);
    cr_assert_not_null(r->log);
    memcpy(r->log + r->log_len, s, n);
    r->log_len += n;
    r->log[r->log_len] = '\0';
}

static int on_frame(void *arg, const struct agw_sse_frame *f)
{
    struct rec *r = arg;
    char hdr[64];

    cr_assert_not_null(f->data);
    /* Every frame said to be framed is, in the input, exactly the client frame that relays it. */
    if (f->framed) {
        cr_assert(memcmp(f->data - 6, "data: ", 6) == 0);
        cr_assert(memcmp(f->data + f->data_len, "\n\n", 2) == 0);
        cr_assert_null(memchr(f->data, '\n', f->data_len));
        cr_assert_null(memchr(f->data, '\r', f->data_len));
        cr_assert_null(f->event);
        cr_assert_null(f->id);
        cr_assert_eq(f->retry, -1);
    }
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 8;
        r->f = realloc(r->f, (size_t)r->cap * sizeof(*r->f));
        cr_assert_not_null(r->f);
    }
    r->f[r->n].data = malloc(f->data_len + 1);
    memcpy(r->f[r->n].data, f->data, f->data_len);
    r->f[r->n].data[f->data_len] = '\0';
    r->f[r->n].len = f->data_len;
    r->f[r->n].event = dup_or_null(f->event);
    r->f[r->n].id = dup_or_null(f->id);
    r->f[r->n].retry = f->retry;
    r->f[r->n].framed = f->framed;
    r->n++;

    snprintf(hdr, sizeof(hdr), "D%zu:", f->data_len);
    log_add(r, hdr, strlen(hdr));
    log_add(r, f->data, f->data_len);
    log_add(r, f->event ? "|E" : "|-", 2);
    if (f->event)
        log_add(r, f->event, strlen(f->event));
    log_add(r, f->id ? "|I" : "|-", 2);
    if (f->id)
        log_add(r, f->id, strlen(f->id));
    snprintf(hdr, sizeof(hdr), "|R%ld\n", f->retry);
    log_add(r, hdr, strlen(hdr));

    if (r->stop_at > 0 && r->n == r->stop_at)
        return r->stop_rc;
    return 0;
}

static void rec_free(struct rec *r)
{
    for (int i = 0; i < r->n; i++) {
        free(r->f[i].data);
        free(r->f[i].event);
        free(r->f[i].id);
    }
    free(r->f);
    free(r->log);
    memset(r, 0, sizeof(*r));
}

static void assert_frame(const struct rec *r, int i, const char *data, const char *event,
                         const char *id, long retry)
{
    cr_assert_lt(i, r->n, "frame %d missing (have %d)", i, r->n);
    cr_assert_eq(r->f[i].len, strlen(data), "frame %d: data length %zu, want %zu", i, r->f[i].len,
                 strlen(data));
    cr_assert_str_eq(r->f[i].data, data);
    if (event == NULL)
        cr_assert_null(r->f[i].event, "frame %d: unexpected event '%s'", i, r->f[i].event);
    else
        cr_assert_str_eq(r->f[i].event, event);
    if (id == NULL)
        cr_assert_null(r->f[i].id, "frame %d: unexpected id '%s'", i, r->f[i].id);
    else
        cr_assert_str_eq(r->f[i].id, id);
    cr_assert_eq(r->f[i].retry, retry);
}

/* ---- running the parser
 * ---------------------------------------------------------------------------- */

/* Parses <s> as the chunks delimited by <cuts> (ascending offsets), then finishes. Returns the
 * total number of frames, or the first negative code. */
static int run_cuts(const char *s, size_t n, const size_t *cuts, size_t ncuts, size_t max_frame,
                    struct rec *r)
{
    struct agw_sse_parser *p = agw_sse_parser_new(max_frame);
    size_t at = 0;
    int total = 0;
    int rc;

    for (size_t i = 0; i <= ncuts; i++) {
        size_t to = i < ncuts ? cuts[i] : n;

        rc = agw_sse_parse_bytes(p, s + at, to - at, on_frame, r);
        if (rc < 0)
            goto out;
        total += rc;
        at = to;
    }
    rc = agw_sse_finish(p, on_frame, r);
    if (rc >= 0) {
        cr_assert(!agw_sse_pending(p));
        rc += total;
    }
out:
    agw_sse_parser_free(p);
    cr_assert(rc < 0 || rc == r->n, "frames returned and frames seen differ");
    return rc;
}

static int run_whole(const char *s, size_t n, size_t max_frame, struct rec *r)
{
    return run_cuts(s, n, NULL, 0, max_frame, r);
}

static int run_bytewise(const char *s, size_t n, size_t max_frame, struct rec *r)
{
    size_t *cuts = malloc((n ? n : 1) * sizeof(*cuts));
    int rc;

    for (size_t i = 0; i < n; i++)
        cuts[i] = i;
    rc = run_cuts(s, n, cuts, n, max_frame, r);
    free(cuts);
    return rc;
}

/* Same through an evbuffer made of one reference chain per <step> bytes (so evbuffer_peek() returns
 * many segments, more than the parser looks at per round). */
static int run_evbuffer(const char *s, size_t n, size_t step, size_t max_frame, struct rec *r)
{
    struct agw_sse_parser *p = agw_sse_parser_new(max_frame);
    struct evbuffer *in = evbuffer_new();
    int rc, rc2;

    for (size_t at = 0; at < n; at += step)
        evbuffer_add_reference(in, s + at, n - at < step ? n - at : step, NULL, NULL);
    rc = agw_sse_parse(p, in, on_frame, r);
    cr_assert_eq(evbuffer_get_length(in), 0, "agw_sse_parse must drain its input");
    if (rc >= 0) {
        rc2 = agw_sse_finish(p, on_frame, r);
        rc = rc2 < 0 ? rc2 : rc + rc2;
    }
    evbuffer_free(in);
    agw_sse_parser_free(p);
    return rc;
}

static int parse_str(struct agw_sse_parser *p, const char *s, struct rec *r)
{
    return agw_sse_parse_bytes(p, s, strlen(s), on_frame, r);
}

/* Every way of reading <s> gives the same frames and the same result as reading it whole. */
static void check_split_invariant(const char *s, size_t n, size_t max_frame)
{
    struct rec ref = {0};
    int ref_rc = run_whole(s, n, max_frame, &ref);

    {
        struct rec r = {0};
        int rc = run_bytewise(s, n, max_frame, &r);

        cr_assert_eq(rc, ref_rc, "byte-wise: rc %d, whole: %d", rc, ref_rc);
        cr_assert_eq(r.log_len, ref.log_len);
        cr_assert(r.log_len == 0 || memcmp(r.log, ref.log, r.log_len) == 0);
        rec_free(&r);
    }
    for (size_t i = 0; i <= n; i++) {
        struct rec r = {0};
        int rc = run_cuts(s, n, &i, 1, max_frame, &r);

        cr_assert_eq(rc, ref_rc, "split at %zu: rc %d, whole: %d", i, rc, ref_rc);
        cr_assert_eq(r.log_len, ref.log_len, "split at %zu: frames differ", i);
        cr_assert(r.log_len == 0 || memcmp(r.log, ref.log, r.log_len) == 0, "split at %zu", i);
        rec_free(&r);
    }
    for (size_t step = 1; step <= 3; step++) {
        struct rec r = {0};
        int rc = run_evbuffer(s, n, step, max_frame, &r);

        cr_assert_eq(rc, ref_rc, "evbuffer step %zu: rc %d, whole: %d", step, rc, ref_rc);
        cr_assert_eq(r.log_len, ref.log_len);
        cr_assert(r.log_len == 0 || memcmp(r.log, ref.log, r.log_len) == 0);
        rec_free(&r);
    }
    rec_free(&ref);
}

/* ---- basic frames
 * ---------------------------------------------------------------------------------- */

Test(sse, one_frame)
{
    struct agw_sse_parser *p = agw_sse_parser_new(1 << 20);
    struct rec r = {0};

    cr_assert_eq(parse_str(p, "data: hello\n\n", &r), 1);
    assert_frame(&r, 0, "hello", NULL, NULL, -1);
    cr_assert(!agw_sse_pending(p));
    cr_assert_eq(agw_sse_finish(p, on_frame, &r), 0);
    cr_assert_eq(r.n, 1);
    agw_sse_parser_free(p);
    rec_free(&r);
}

Test(sse, many_frames_one_evbuffer)
{
    struct agw_sse_parser *p = agw_sse_parser_new(1 << 20);
    struct evbuffer *in = evbuffer_new();
    struct rec r = {0};
    const char *s = "data: {\"type\":\"RUN_STARTED\"}\n\n"
                    "data: {\"type\":\"TEXT_MESSAGE_START\"}\n\n"
                    "event: x\ndata: 3\n\n"
                    "data: partial";

    evbuffer_add(in, s, strlen(s));
    cr_assert_eq(agw_sse_parse(p, in, on_frame, &r), 3);
    cr_assert_eq(evbuffer_get_length(in), 0);
    assert_frame(&r, 0, "{\"type\":\"RUN_STARTED\"}", NULL, NULL, -1);
    assert_frame(&r, 1, "{\"type\":\"TEXT_MESSAGE_START\"}", NULL, NULL, -1);
    assert_frame(&r, 2, "3", "x", NULL, -1);
    cr_assert(agw_sse_pending(p));

    evbuffer_add(in, " end\n\n", 6);
    cr_assert_eq(agw_sse_parse(p, in, on_frame, &r), 1);
    assert_frame(&r, 3, "partial end", NULL, NULL, -1);
    cr_assert(!agw_sse_pending(p));
    cr_assert_eq(agw_sse_parse(p, in, on_frame, &r), 0, "an empty evbuffer is no frame");

    evbuffer_free(in);
    agw_sse_parser_free(p);
    rec_free(&r);
}

/* A frame read whole as "data: <json>\n\n" from a memory block is marked framed; every other form,
 * a frame cut by the read, and anything read through an evbuffer (drained as it goes) is not. */
Test(sse, framed_frames)
{
    struct agw_sse_parser *p = agw_sse_parser_new(1 << 20);
    struct evbuffer *in = evbuffer_new();
    struct rec r = {0};
    const char *s = "data: {\"a\":1}\n\n"     /* framed */
                    "data:{\"a\":2}\n\n"      /* no space after the colon */
                    "data:  {\"a\":3}\n\n"    /* framed: the data starts with a space */
                    "data: {\"a\":4}\r\n\r\n" /* CRLF */
                    "event: e\ndata: {\"a\":5}\n\n"
                    "data: {\"a\":6}\n\n" /* framed */
                    "data: {\"a\":7}\n";  /* cut before its blank line */

    cr_assert_eq(agw_sse_parse_bytes(p, s, strlen(s), on_frame, &r), 6);
    cr_assert_eq(agw_sse_parse_bytes(p, "\ndata: {\"a\":8}\n\n", 16, on_frame, &r), 2);
    cr_assert_eq(r.n, 8);
    for (int i = 0; i < r.n; i++)
        cr_assert_eq(r.f[i].framed, i == 0 || i == 2 || i == 5 || i == 7, "frame %d", i);
    assert_frame(&r, 2, " {\"a\":3}", NULL, NULL, -1);

    evbuffer_add(in, "data: {\"a\":9}\n\n", 16);
    cr_assert_eq(agw_sse_parse(p, in, on_frame, &r), 1);
    cr_assert(!r.f[8].framed, "an evbuffer's bytes are drained: never framed");
    evbuffer_free(in);
    agw_sse_parser_free(p);
    rec_free(&r);
}

Test(sse, empty_input)
{
    struct agw_sse_parser *p = agw_sse_parser_new(16);
    struct rec r = {0};

    cr_assert_eq(agw_sse_parse_bytes(p, NULL, 0, on_frame, &r), 0);
    cr_assert(!agw_sse_pending(p));
    cr_assert_eq(agw_sse_finish(p, on_frame, &r), 0);
    cr_assert_eq(r.n, 0);
    agw_sse_parser_free(p);
    agw_sse_parser_free(NULL);
}

/* The stream used by the split tests: every feature, every line end. */
static const char mixed[] = "\xEF\xBB\xBF"
                            ": hello\n"
                            "data: {\"type\":\"RUN_STARTED\"}\n\n"
                            "event: message\r\nid: 7\r\nretry: 1500\r\ndata: a\r\ndata:  b\r\n\r\n"
                            ": ping\r\r"
                            "data:x\rdata\r\r"
                            "unknown: field\nnocolon\ndata: [DONE]\n\n"
                            "\n\n\r\n\r\r"
                            "data:\n\n"
                            "id\nevent\ndata: c\r\n\n"
                            "data: last\r\n"
                            "data: unterminated";

Test(sse, mixed_stream_frames)
{
    struct rec r = {0};

    cr_assert_eq(run_whole(mixed, sizeof(mixed) - 1, 0, &r), 7);
    assert_frame(&r, 0, "{\"type\":\"RUN_STARTED\"}", NULL, NULL, -1);
    assert_frame(&r, 1, "a\n b", "message", "7", 1500);
    assert_frame(&r, 2, "x\n", NULL, NULL, -1);
    assert_frame(&r, 3, "[DONE]", NULL, NULL, -1);
    assert_frame(&r, 4, "", NULL, NULL, -1);
    assert_frame(&r, 5, "c", "", "", -1);
    assert_frame(&r, 6, "last\nunterminated", NULL, NULL, -1); /* dispatched by finish */
    rec_free(&r);
}

Test(sse, split_at_every_byte)
{
    check_split_invariant(mixed, sizeof(mixed) - 1, 0);
}

Test(sse, split_at_every_byte_with_limit)
{
    /* Every limit up to past the largest frame of <mixed> succeeds or fails the same way however
     * the stream is cut. */
    for (size_t max = 1; max <= 100; max++)
        check_split_invariant(mixed, sizeof(mixed) - 1, max);
}

Test(sse, every_three_way_split)
{
    const char s[] = "data: a\r\n\r\ndata: b\r\rid: 1\ndata: c\n\n";
    const size_t n = sizeof(s) - 1;
    struct rec ref = {0};
    int ref_rc = run_whole(s, n, 0, &ref);

    cr_assert_eq(ref_rc, 3);
    for (size_t i = 0; i <= n; i++) {
        for (size_t j = i; j <= n; j++) {
            size_t cuts[2] = {i, j};
            struct rec r = {0};

            cr_assert_eq(run_cuts(s, n, cuts, 2, 0, &r), ref_rc);
            cr_assert_eq(r.log_len, ref.log_len);
            cr_assert(memcmp(r.log, ref.log, r.log_len) == 0, "cuts %zu %zu", i, j);
            rec_free(&r);
        }
    }
    rec_free(&ref);
}

/* ---- line ends
 * --------------------------------------------------------------------------------------- */

Test(sse, lf_crlf_cr_streams_agree)
{
    const char *lf = "event: e\nid: 1\ndata: a\ndata: b\n\n: c\n\ndata: z\n\n";
    const char *crlf = "event: e\r\nid: 1\r\ndata: a\r\ndata: b\r\n\r\n: c\r\n\r\ndata: z\r\n\r\n";
    const char *cr = "event: e\rid: 1\rdata: a\rdata: b\r\r: c\r\rdata: z\r\r";
    const char *streams[] = {lf, crlf, cr};

    for (size_t i = 0; i < 3; i++) {
        struct rec r = {0};

        cr_assert_eq(run_whole(streams[i], strlen(streams[i]), 0, &r), 2, "stream %zu", i);
        assert_frame(&r, 0, "a\nb", "e", "1", -1);
        assert_frame(&r, 1, "z", NULL, NULL, -1);
        rec_free(&r);
        check_split_invariant(streams[i], strlen(streams[i]), 0);
    }
}

Test(sse, cr_at_chunk_end_then_lf)
{
    struct agw_sse_parser *p = agw_sse_parser_new(0);
    struct rec r = {0};

    /* The CR ends the line at once; the LF that follows is the same line end, not a blank line. */
    cr_assert_eq(parse_str(p, "data: a\r", &r), 0);
    cr_assert_eq(parse_str(p, "\ndata: b\r", &r), 0);
    cr_assert_eq(parse_str(p, "\n", &r), 0, "CR|LF must not be read as two line ends");
    cr_assert_eq(r.n, 0);
    /* A blank line ending in CR dispatches without waiting for more input. */
    cr_assert_eq(parse_str(p, "\r", &r), 1);
    assert_frame(&r, 0, "a\nb", NULL, NULL, -1);
    cr_assert(!agw_sse_pending(p));
    /* Its LF, arriving later, is skipped: no stray blank line, no byte counted. */
    cr_assert_eq(parse_str(p, "\n", &r), 0);
    cr_assert(!agw_sse_pending(p));
    cr_assert_eq(parse_str(p, "data: c\r", &r), 0);
    cr_assert_eq(parse_str(p, "\r", &r), 1);
    cr_assert_eq(parse_str(p, "data: d\n", &r), 0, "a byte other than LF after a pending CR");
    cr_assert_eq(parse_str(p, "\n", &r), 1);
    assert_frame(&r, 1, "c", NULL, NULL, -1);
    assert_frame(&r, 2, "d", NULL, NULL, -1);
    agw_sse_parser_free(p);
    rec_free(&r);
}

Test(sse, lf_blank_line_dispatches_at_once)
{
    struct agw_sse_parser *p = agw_sse_parser_new(0);
    struct rec r = {0};

    cr_assert_eq(parse_str(p, "data: a\n", &r), 0);
    cr_assert_eq(parse_str(p, "\n", &r), 1);
    cr_assert_eq(parse_str(p, "data: b\r\n\r", &r), 1);
    cr_assert_eq(r.n, 2);
    agw_sse_parser_free(p);
    rec_free(&r);
}

/* ---- fields
 * ------------------------------------------------------------------------------------------ */

Test(sse, multiline_data_joined_with_lf)
{
    struct rec r = {0};
    const char *s = "data: {\ndata:   \"a\": 1\ndata: }\n\n";

    cr_assert_eq(run_whole(s, strlen(s), 0, &r), 1);
    assert_frame(&r, 0, "{\n  \"a\": 1\n}", NULL, NULL, -1);
    rec_free(&r);
}

Test(sse, one_leading_space_stripped)
{
    struct rec r = {0};
    const char *s = "data:x\n\ndata: x\n\ndata:  x\n\ndata:\tx\n\ndata:x \n\ndata::x\n\n";

    cr_assert_eq(run_whole(s, strlen(s), 0, &r), 6);
    assert_frame(&r, 0, "x", NULL, NULL, -1);
    assert_frame(&r, 1, "x", NULL, NULL, -1);
    assert_frame(&r, 2, " x", NULL, NULL, -1);
    assert_frame(&r, 3, "\tx", NULL, NULL, -1);
    assert_frame(&r, 4, "x ", NULL, NULL, -1);
    assert_frame(&r, 5, ":x", NULL, NULL, -1);
    rec_free(&r);
}

Test(sse, event_id_retry)
{
    struct rec r = {0};
    const char *s = "event: first\nevent: second\nid: 1\nid: 2\nretry: 3000\ndata: a\n\n"
                    "data: b\n\n"                                /* all reset after a frame */
                    "retry: 12a\nretry:\nretry: -5\ndata: c\n\n" /* invalid retries ignored */
                    "retry: 10\nretry: x\ndata: d\n\n" /* an invalid one keeps the last valid */
                    "retry: 99999999999999999999999\ndata: e\n\n" /* overflow ignored */
                    "retry:0\ndata: f\n\n"
                    "event:\nid:\ndata: g\n\n" /* empty values are present, not absent */
                    "retry: 1 \ndata: h\n\n";

    cr_assert_eq(run_whole(s, strlen(s), 0, &r), 8);
    assert_frame(&r, 0, "a", "second", "2", 3000);
    assert_frame(&r, 1, "b", NULL, NULL, -1);
    assert_frame(&r, 2, "c", NULL, NULL, -1);
    assert_frame(&r, 3, "d", NULL, NULL, 10);
    assert_frame(&r, 4, "e", NULL, NULL, -1);
    assert_frame(&r, 5, "f", NULL, NULL, 0);
    assert_frame(&r, 6, "g", "", "", -1);
    assert_frame(&r, 7, "h", NULL, NULL, -1);
    rec_free(&r);
}

Test(sse, id_with_nul_ignored)
{
    struct rec r = {0};
    const char s[] = "id: 5\nid: a\0b\ndata: x\n\nid: c\0\ndata: y\n\n";

    cr_assert_eq(run_whole(s, sizeof(s) - 1, 0, &r), 2);
    assert_frame(&r, 0, "x", NULL, "5", -1);
    assert_frame(&r, 1, "y", NULL, NULL, -1);
    rec_free(&r);
    check_split_invariant(s, sizeof(s) - 1, 0);
}

Test(sse, nul_in_data_kept)
{
    struct rec r = {0};
    const char s[] = "data: a\0b\n\n";

    cr_assert_eq(run_whole(s, sizeof(s) - 1, 0, &r), 1);
    cr_assert_eq(r.f[0].len, 3);
    cr_assert(memcmp(r.f[0].data, "a\0b", 4) == 0);
    rec_free(&r);
}

Test(sse, comments_and_heartbeats)
{
    struct agw_sse_parser *p = agw_sse_parser_new(0);
    struct rec r = {0};

    cr_assert_eq(parse_str(p, ": ping\n\n", &r), 0);
    cr_assert(!agw_sse_pending(p));
    cr_assert_eq(parse_str(p, ":\n\n:ping\r\n\r\n", &r), 0);
    cr_assert_eq(parse_str(p, ": before\ndata: x\n: between: data: y\ndata: z\n: after\n\n", &r),
                 1);
    assert_frame(&r, 0, "x\nz", NULL, NULL, -1);
    cr_assert_eq(parse_str(p, ": ping", &r), 0);
    cr_assert(agw_sse_pending(p));
    cr_assert_eq(parse_str(p, "\n\n", &r), 0);
    cr_assert(!agw_sse_pending(p));
    agw_sse_parser_free(p);
    rec_free(&r);
}

Test(sse, unknown_fields_ignored)
{
    struct rec r = {0};
    const char *s = "foo: bar\nDATA: no\nData: no\ndata : no\n data: no\ndatax: no\nevents: no\n"
                    "ids: no\ndata: yes\nx\n\n"
                    "foo: only\n\n";

    cr_assert_eq(run_whole(s, strlen(s), 0, &r), 1);
    assert_frame(&r, 0, "yes", NULL, NULL, -1);
    rec_free(&r);
}

Test(sse, field_without_colon)
{
    struct rec r = {0};
    const char *s = "data\n\n"
                    "data\ndata\n\n"
                    "event\nid\nretry\ndata: x\n\n";

    cr_assert_eq(run_whole(s, strlen(s), 0, &r), 3);
    assert_frame(&r, 0, "", NULL, NULL, -1);
    assert_frame(&r, 1, "\n", NULL, NULL, -1);
    assert_frame(&r, 2, "x", "", "", -1);
    rec_free(&r);
}

Test(sse, empty_data_line_is_dispatched)
{
    struct rec r = {0};
    const char *s = "data:\n\ndata: \n\nevent: e\n\n\n\n";

    cr_assert_eq(run_whole(s, strlen(s), 0, &r), 2);
    assert_frame(&r, 0, "", NULL, NULL, -1);
    assert_frame(&r, 1, "", NULL, NULL, -1);
    rec_free(&r);
}

Test(sse, blank_line_without_data_resets_fields)
{
    struct rec r = {0};
    const char *s = "event: lost\nid: 9\nretry: 5\n\ndata: y\n\n";

    cr_assert_eq(run_whole(s, strlen(s), 0, &r), 1);
    assert_frame(&r, 0, "y", NULL, NULL, -1);
    rec_free(&r);
}

Test(sse, done_is_just_data)
{
    struct rec r = {0};
    const char *s = "data: [DONE]\n\ndata: not json at all\n\n";

    cr_assert_eq(run_whole(s, strlen(s), 0, &r), 2);
    assert_frame(&r, 0, "[DONE]", NULL, NULL, -1);
    assert_frame(&r, 1, "not json at all", NULL, NULL, -1);
    rec_free(&r);
}

Test(sse, bom)
{
    struct rec r = {0};
    const char *s = "\xEF\xBB\xBF"
                    "data: x\n\n";

    cr_assert_eq(run_whole(s, strlen(s), 0, &r), 1);
    assert_frame(&r, 0, "x", NULL, NULL, -1);
    rec_free(&r);
    check_split_invariant(s, strlen(s), 9); /* the BOM does not count against the frame */

    /* Only at the very start, and only once: elsewhere it is part of a field name. */
    s = "data: a\n\n\xEF\xBB\xBF"
        "data: b\n\n";
    cr_assert_eq(run_whole(s, strlen(s), 0, &r), 1);
    assert_frame(&r, 0, "a", NULL, NULL, -1);
    rec_free(&r);
    s = "\xEF\xBB\xBF\xEF\xBB\xBF"
        "data: b\n\n";
    cr_assert_eq(run_whole(s, strlen(s), 0, &r), 0);
    rec_free(&r);

    /* A BOM prefix that turns out not to be one is ordinary input. */
    s = "\xEF\xBB"
        "data: b\n\n";
    cr_assert_eq(run_whole(s, strlen(s), 0, &r), 0);
    check_split_invariant(s, strlen(s), 0);
    rec_free(&r);
    s = "\xEF\n"
        "data: b\n\n";
    cr_assert_eq(run_whole(s, strlen(s), 0, &r), 1);
    check_split_invariant(s, strlen(s), 0);
    rec_free(&r);
}

Test(sse, partial_bom_is_pending)
{
    struct agw_sse_parser *p = agw_sse_parser_new(0);
    struct rec r = {0};

    cr_assert_eq(parse_str(p, "\xEF", &r), 0);
    cr_assert(agw_sse_pending(p));
    cr_assert_eq(parse_str(p, "\xBB", &r), 0);
    cr_assert_eq(parse_str(p, "\xBF", &r), 0);
    cr_assert(!agw_sse_pending(p), "a whole BOM is no frame byte");
    cr_assert_eq(agw_sse_finish(p, on_frame, &r), 0);
    cr_assert_eq(parse_str(p, "\xEF\xBB", &r), 0);
    cr_assert_eq(agw_sse_finish(p, on_frame, &r), 0, "a BOM prefix at EOF is just a broken line");
    cr_assert(!agw_sse_pending(p));
    agw_sse_parser_free(p);
    rec_free(&r);
}

/* ---- limits
 * ------------------------------------------------------------------------------------------ */

Test(sse, frame_at_limit_and_one_over)
{
    const char *s = "data: x\n\n";      /* 9 bytes */
    const char *c = ": c\ndata: x\n\n"; /* 13 bytes: comments count */
    struct rec r = {0};

    cr_assert_eq(run_whole(s, strlen(s), 9, &r), 1);
    rec_free(&r);
    cr_assert_eq(run_whole(s, strlen(s), 8, &r), -AGW_ETOOBIG);
    cr_assert_eq(r.n, 0, "a frame over the limit is never dispatched");
    rec_free(&r);
    cr_assert_eq(run_bytewise(s, strlen(s), 8, &r), -AGW_ETOOBIG);
    rec_free(&r);
    cr_assert_eq(run_whole(c, strlen(c), 13, &r), 1);
    rec_free(&r);
    cr_assert_eq(run_whole(c, strlen(c), 12, &r), -AGW_ETOOBIG);
    rec_free(&r);

    /* Each frame is measured on its own. */
    cr_assert_eq(run_whole("data: x\n\ndata: y\n\ndata: z\n\n", 27, 9, &r), 3);
    rec_free(&r);
    /* A CRLF line inside a frame counts 2; the line end of the blank line counts 1. */
    cr_assert_eq(run_whole("data: x\r\n\r\n", 11, 10, &r), 1);
    rec_free(&r);
    cr_assert_eq(run_whole("data: x\r\n\r\n", 11, 9, &r), -AGW_ETOOBIG);
    rec_free(&r);
    cr_assert_eq(run_bytewise("data: x\r\n\r\ndata: y\r\n\r\n", 22, 10, &r), 2);
    rec_free(&r);
}

Test(sse, heartbeats_reset_the_count)
{
    struct agw_sse_parser *p = agw_sse_parser_new(9);
    struct rec r = {0};

    for (int i = 0; i < 1000; i++)
        cr_assert_eq(parse_str(p, ": ping\n\n", &r), 0);
    cr_assert_eq(parse_str(p, "data: x\n\n", &r), 1);
    cr_assert_eq(parse_str(p, "\n\n\n\n\n\n\n\n\n\n\n\n", &r), 0, "blank lines are empty frames");
    agw_sse_parser_free(p);
    rec_free(&r);
}

Test(sse, endless_line_fails_past_limit)
{
    const char *prefixes[] = {
        "data: ", ": ", "unknown: ", "event: ", "id: ", "retry: ", "xxxxxxxx"};

    for (size_t k = 0; k < AGW_ARRAY_LEN(prefixes); k++) {
        struct agw_sse_parser *p = agw_sse_parser_new(64);
        struct rec r = {0};
        size_t fed = strlen(prefixes[k]);
        char chunk[10];
        int rc;

        memset(chunk, prefixes[k][0] == 'r' ? '7' : 'x', sizeof(chunk));
        cr_assert_eq(parse_str(p, prefixes[k], &r), 0);
        for (;;) {
            rc = agw_sse_parse_bytes(p, chunk, sizeof(chunk), on_frame, &r);
            fed += sizeof(chunk);
            if (fed <= 64)
                cr_assert_eq(rc, 0, "%s: failed at %zu bytes", prefixes[k], fed);
            else
                break;
        }
        cr_assert_eq(rc, -AGW_ETOOBIG, "%s: rc %d at %zu bytes", prefixes[k], rc, fed);
        /* The error is sticky. */
        cr_assert_eq(parse_str(p, "\n\n", &r), -AGW_ETOOBIG);
        cr_assert_eq(agw_sse_finish(p, on_frame, &r), -AGW_ETOOBIG);
        cr_assert_eq(r.n, 0);
        agw_sse_parser_free(p);
        rec_free(&r);
    }
}

Test(sse, endless_line_through_evbuffer)
{
    struct agw_sse_parser *p = agw_sse_parser_new(1000);
    struct evbuffer *in = evbuffer_new();
    struct rec r = {0};
    char chunk[100];
    int rc = 0;
    int rounds = 0;

    memset(chunk, 'a', sizeof(chunk));
    evbuffer_add(in, "data: ", 6);
    while (rc == 0) {
        evbuffer_add(in, chunk, sizeof(chunk));
        rc = agw_sse_parse(p, in, on_frame, &r);
        cr_assert_eq(evbuffer_get_length(in), 0);
        rounds++;
    }
    cr_assert_eq(rc, -AGW_ETOOBIG);
    cr_assert_eq(rounds, 10, "6 + 10 * 100 > 1000 bytes: %d rounds", rounds);
    evbuffer_add(in, "\n\n", 2);
    cr_assert_eq(agw_sse_parse(p, in, on_frame, &r), -AGW_ETOOBIG);
    cr_assert_eq(evbuffer_get_length(in), 0, "drained even after an error");
    evbuffer_free(in);
    agw_sse_parser_free(p);
    rec_free(&r);
}

Test(sse, large_frames_and_buffer_reuse)
{
    size_t big = 300000;
    char *s = malloc(big + 32);
    struct agw_sse_parser *p = agw_sse_parser_new(1 << 20);
    struct rec r = {0};

    memcpy(s, "data: ", 6);
    for (size_t i = 0; i < big; i++)
        s[6 + i] = (char)('a' + i % 26);
    memcpy(s + 6 + big, "\n\n", 2);
    for (int round = 0; round < 3; round++) {
        /* Big, then small (the big buffer is released), then big again, in uneven chunks. */
        for (size_t at = 0; at < big + 8;) {
            size_t n = big + 8 - at < 7777 ? big + 8 - at : 7777;

            cr_assert_geq(agw_sse_parse_bytes(p, s + at, n, on_frame, &r), 0);
            at += n;
        }
        cr_assert_eq(parse_str(p, "data: small\n\n", &r), 1);
    }
    cr_assert_eq(r.n, 6);
    for (int i = 0; i < 6; i += 2) {
        cr_assert_eq(r.f[i].len, big);
        cr_assert(memcmp(r.f[i].data, s + 6, big) == 0);
        assert_frame(&r, i + 1, "small", NULL, NULL, -1);
    }
    free(s);
    agw_sse_parser_free(p);
    rec_free(&r);
}

/* ---- callback and end of input
 * ----------------------------------------------------------------------- */

Test(sse, callback_error_stops_and_propagates)
{
    struct agw_sse_parser *p = agw_sse_parser_new(0);
    struct evbuffer *in = evbuffer_new();
    struct rec r = {.stop_at = 2, .stop_rc = -42};
    const char *s = "data: 1\n\ndata: 2\n\ndata: 3\n\n";

    evbuffer_add(in, s, strlen(s));
    cr_assert_eq(agw_sse_parse(p, in, on_frame, &r), -42);
    cr_assert_eq(r.n, 2, "no frame after the one that failed");
    cr_assert_eq(evbuffer_get_length(in), 0);
    cr_assert_eq(parse_str(p, "data: 4\n\n", &r), -42, "the error is sticky");
    cr_assert_eq(agw_sse_finish(p, on_frame, &r), -42);
    cr_assert_eq(r.n, 2);
    evbuffer_free(in);
    agw_sse_parser_free(p);
    rec_free(&r);

    p = agw_sse_parser_new(0);
    r = (struct rec){.stop_at = 1, .stop_rc = -AGW_EPROTO};
    cr_assert_eq(parse_str(p, "data: 1\n\ndata: 2\n\n", &r), -AGW_EPROTO);
    cr_assert_eq(r.n, 1);
    agw_sse_parser_free(p);
    rec_free(&r);
}

Test(sse, callback_positive_is_success)
{
    struct agw_sse_parser *p = agw_sse_parser_new(0);
    struct rec r = {.stop_at = 1, .stop_rc = 7};

    cr_assert_eq(parse_str(p, "data: 1\n\ndata: 2\n\n", &r), 2);
    agw_sse_parser_free(p);
    rec_free(&r);
}

Test(sse, finish_with_trailing_frame)
{
    const char *cases[][2] = {
        {"data: x\n", "x"},           /* no blank line */
        {"data: x", "x"},             /* unterminated last line */
        {"data: a\ndata: b", "a\nb"}, /* several lines, last unterminated */
        {"data: a\r", "a"},           /* CR at the very end */
        {"data: a\r\ndata:", "a\n"},  /* unterminated empty data line */
        {"data", ""},                 /* unterminated field without colon */
        {"data: 1\n\ndata: 2", "2"},  /* after a complete frame */
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        struct agw_sse_parser *p = agw_sse_parser_new(0);
        struct rec r = {0};
        int before;

        before = parse_str(p, cases[i][0], &r);
        cr_assert_geq(before, 0);
        cr_assert(agw_sse_pending(p), "case %zu", i);
        cr_assert_eq(agw_sse_finish(p, on_frame, &r), 1, "case %zu", i);
        cr_assert_eq(r.n, before + 1);
        assert_frame(&r, r.n - 1, cases[i][1], NULL, NULL, -1);
        cr_assert(!agw_sse_pending(p));
        cr_assert_eq(agw_sse_finish(p, on_frame, &r), 0, "finish twice: nothing more");
        agw_sse_parser_free(p);
        rec_free(&r);
    }
}

Test(sse, finish_without_trailing_frame)
{
    const char *cases[] = {"",         "data: x\n\n", ": ping\n", ": ping", "event: e\nid: 1\n",
                           "foo: bar", "\n\n\r"};

    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        struct agw_sse_parser *p = agw_sse_parser_new(0);
        struct rec r = {0};
        int before = parse_str(p, cases[i], &r);

        cr_assert_geq(before, 0);
        cr_assert_eq(agw_sse_finish(p, on_frame, &r), 0, "case %zu", i);
        cr_assert_eq(r.n, before);
        cr_assert(!agw_sse_pending(p));
        agw_sse_parser_free(p);
        rec_free(&r);
    }
}

Test(sse, finish_keeps_fields_of_trailing_frame_and_resets)
{
    struct agw_sse_parser *p = agw_sse_parser_new(0);
    struct rec r = {0};

    cr_assert_eq(parse_str(p, "event: e\nid: 3\nretry: 4\ndata: x", &r), 0);
    cr_assert_eq(agw_sse_finish(p, on_frame, &r), 1);
    assert_frame(&r, 0, "x", "e", "3", 4);
    /* After finish the parser starts a new stream (a BOM is skipped again). */
    cr_assert_eq(parse_str(p,
                           "\xEF\xBB\xBF"
                           "data: y\n\n",
                           &r),
                 1);
    assert_frame(&r, 1, "y", NULL, NULL, -1);
    agw_sse_parser_free(p);
    rec_free(&r);
}

Test(sse, finish_callback_error)
{
    struct agw_sse_parser *p = agw_sse_parser_new(0);
    struct rec r = {.stop_at = 1, .stop_rc = -AGW_EINVAL};

    cr_assert_eq(parse_str(p, "data: x", &r), 0);
    cr_assert_eq(agw_sse_finish(p, on_frame, &r), -AGW_EINVAL);
    cr_assert_eq(agw_sse_finish(p, on_frame, &r), -AGW_EINVAL);
    cr_assert_eq(r.n, 1);
    agw_sse_parser_free(p);
    rec_free(&r);
}

Test(sse, pending)
{
    struct agw_sse_parser *p = agw_sse_parser_new(0);
    struct rec r = {0};

    cr_assert(!agw_sse_pending(p));
    parse_str(p, "da", &r);
    cr_assert(agw_sse_pending(p));
    parse_str(p, "ta: x", &r);
    cr_assert(agw_sse_pending(p));
    parse_str(p, "\n", &r);
    cr_assert(agw_sse_pending(p));
    parse_str(p, "\n", &r);
    cr_assert(!agw_sse_pending(p));
    parse_str(p, "event: e\n", &r);
    cr_assert(agw_sse_pending(p), "fields without data are still a partial frame");
    parse_str(p, "\r", &r);
    cr_assert(!agw_sse_pending(p));
    cr_assert_eq(r.n, 1);
    agw_sse_parser_free(p);
    rec_free(&r);
}

/* ---- a reference model, compared on random streams
 * ------------------------------------------------- */

/* The rules written the naive way: the whole input at once, one line at a time. Returns the number
 * of frames (including the trailing one at EOF) or -AGW_ETOOBIG; frames are logged into <r>. */
static int model(const char *s, size_t n, size_t max_frame, struct rec *r)
{
    size_t i = 0, frame = 0;
    int nframes = 0;
    bool has_data = false, has_event = false, has_id = false;
    long retry = -1;
    char *data = calloc(1, n + 2), *event = calloc(1, n + 1), *id = calloc(1, n + 1);
    size_t dlen = 0;

    if (n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0)
        i = 3;
    while (i < n) {
        size_t start = i, len, eol;
        bool blank;

        while (i < n && s[i] != '\r' && s[i] != '\n')
            i++;
        len = i - start;
        eol = i == n ? 0 : (s[i] == '\r' && i + 1 < n && s[i + 1] == '\n') ? 2 : 1;
        blank = len == 0 && eol > 0;
        frame += blank ? 1 : len + eol;
        if (max_frame && frame > max_frame) {
            nframes = -AGW_ETOOBIG;
            goto out;
        }
        i += eol;
        if (blank) {
            if (has_data) {
                struct agw_sse_frame f = {data,  dlen, has_event ? event : NULL, has_id ? id : NULL,
                                          retry, false};
                data[dlen] = '\0';
                on_frame(r, &f);
                nframes++;
            }
            has_data = has_event = has_id = false;
            retry = -1;
            dlen = 0;
            frame = 0;
            continue;
        }
        const char *line = s + start;
        const char *colon = memchr(line, ':', len);
        size_t nlen = colon ? (size_t)(colon - line) : len;
        const char *v = colon ? colon + 1 : line + len;
        size_t vlen = (size_t)(line + len - v);

        if (vlen > 0 && *v == ' ') {
            v++;
            vlen--;
        }
        if (nlen == 4 && memcmp(line, "data", 4) == 0) {
            if (has_data)
                data[dlen++] = '\n';
            memcpy(data + dlen, v, vlen);
            dlen += vlen;
            has_data = true;
        } else if (nlen == 5 && memcmp(line, "event", 5) == 0) {
            memcpy(event, v, vlen);
            event[vlen] = '\0';
            has_event = true;
        } else if (nlen == 2 && memcmp(line, "id", 2) == 0) {
            if (memchr(v, '\0', vlen) == NULL) {
                memcpy(id, v, vlen);
                id[vlen] = '\0';
                has_id = true;
            }
        } else if (nlen == 5 && memcmp(line, "retry", 5) == 0) {
            char tmp[64];

            size_t digits = 0;

            while (digits < vlen && v[digits] >= '0' && v[digits] <= '9')
                digits++;
            if (vlen > 0 && vlen < 19 && digits == vlen) {
                memcpy(tmp, v, vlen);
                tmp[vlen] = '\0';
                retry = strtol(tmp, NULL, 10);
            }
        }
    }
    if (has_data) {
        struct agw_sse_frame f = {data,  dlen, has_event ? event : NULL, has_id ? id : NULL,
                                  retry, false};
        data[dlen] = '\0';
        on_frame(r, &f);
        nframes++;
    }
out:
    free(data);
    free(event);
    free(id);
    return nframes;
}

Test(sse, random_streams_match_the_model)
{
    static const char *tokens[] = {
        "data",      "data:",
        "data: ",    "data:  ",
        "event",     "event: x",
        "id: 7",     "id",
        "retry: 10", "retry: 1x",
        "retry:",    ":",
        ": c",       "foo: bar",
        "x",         " ",
        "\n",        "\n",
        "\n",        "\r",
        "\r",        "\r\n",
        "\r\n",      "\xEF\xBB\xBF",
        "\xEF\xBB",  "{\"type\":\"X\"}",
        "[DONE]",    "a:b",
        "da",        "ta",
        ":",         "\0",
    };
    unsigned seed = 12345;
    char s[512];

    for (int iter = 0; iter < 3000; iter++) {
        size_t n = 0, ntok, max_frame;
        struct rec want = {0}, got = {0};
        int want_rc, got_rc;

        seed = seed * 1103515245u + 12345u;
        ntok = (seed >> 16) % 40;
        if (iter % 5 == 0 && n < 3) {
            memcpy(s, "\xEF\xBB\xBF", 3);
            n = 3;
        }
        for (size_t t = 0; t < ntok; t++) {
            const char *tok;
            size_t tl;

            seed = seed * 1103515245u + 12345u;
            tok = tokens[(seed >> 16) % AGW_ARRAY_LEN(tokens)];
            tl = tok[0] == '\0' ? 1 : strlen(tok);
            if (n + tl > sizeof(s))
                break;
            memcpy(s + n, tok, tl);
            n += tl;
        }
        seed = seed * 1103515245u + 12345u;
        max_frame = (seed >> 16) % 3 == 0 ? 0 : 4 + (seed >> 18) % 60;

        want_rc = model(s, n, max_frame, &want);
        got_rc = run_whole(s, n, max_frame, &got);
        cr_assert_eq(got_rc, want_rc, "iteration %d: rc %d, model %d", iter, got_rc, want_rc);
        cr_assert_eq(got.log_len, want.log_len, "iteration %d: frames differ", iter);
        cr_assert(got.log_len == 0 || memcmp(got.log, want.log, got.log_len) == 0, "iteration %d",
                  iter);
        rec_free(&got);

        /* Random chunking and byte-wise reading agree too. */
        {
            size_t cuts[8];
            size_t nc = 0;

            for (size_t k = 0; k < AGW_ARRAY_LEN(cuts) && n > 0; k++) {
                seed = seed * 1103515245u + 12345u;
                cuts[nc] = (seed >> 16) % (n + 1);
                if (nc == 0 || cuts[nc] >= cuts[nc - 1])
                    nc++;
            }
            got_rc = run_cuts(s, n, cuts, nc, max_frame, &got);
            cr_assert_eq(got_rc, want_rc, "iteration %d (chunked)", iter);
            cr_assert_eq(got.log_len, want.log_len);
            cr_assert(got.log_len == 0 || memcmp(got.log, want.log, got.log_len) == 0);
            rec_free(&got);
            got_rc = run_bytewise(s, n, max_frame, &got);
            cr_assert_eq(got_rc, want_rc, "iteration %d (byte-wise)", iter);
            cr_assert_eq(got.log_len, want.log_len);
            cr_assert(got.log_len == 0 || memcmp(got.log, want.log, got.log_len) == 0);
            rec_free(&got);
        }
        rec_free(&want);
    }
}

/* ---- writer
 * ------------------------------------------------------------------------------------------ */

static void assert_evbuffer_eq(struct evbuffer *b, const char *want, size_t n)
{
    size_t len = evbuffer_get_length(b);
    char *got = malloc(len + 1);

    cr_assert_eq(len, n, "length %zu, want %zu", len, n);
    evbuffer_copyout(b, got, len);
    cr_assert(memcmp(got, want, n) == 0);
    free(got);
}

Test(sse, write_data_exact_bytes)
{
    struct evbuffer *b = evbuffer_new();
    const char *json = "{\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r\"}";

    cr_assert_eq(agw_sse_write_data(b, json, strlen(json)), 0);
    assert_evbuffer_eq(b, "data: {\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r\"}\n\n",
                       strlen(json) + 8);
    cr_assert_eq(agw_sse_write_data(b, "x", 1), 0);
    cr_assert_eq(agw_sse_write_data(b, "", 0), 0);
    cr_assert_eq(agw_sse_write_data(b, NULL, 0), 0);
    evbuffer_drain(b, strlen(json) + 8);
    assert_evbuffer_eq(b, "data: x\n\ndata: \n\ndata: \n\n", 25);
    evbuffer_free(b);
}

Test(sse, write_data_length_not_strlen)
{
    struct evbuffer *b = evbuffer_new();

    cr_assert_eq(agw_sse_write_data(b, "abcdef", 3), 0);
    assert_evbuffer_eq(b, "data: abc\n\n", 11);
    evbuffer_free(b);
}

Test(sse, write_comment_exact_bytes)
{
    struct evbuffer *b = evbuffer_new();

    cr_assert_eq(agw_sse_write_comment(b, "ping"), 0);
    cr_assert_eq(agw_sse_write_comment(b, ""), 0);
    assert_evbuffer_eq(b, ": ping\n\n: \n\n", 12);
    evbuffer_free(b);
}

Test(sse, writer_round_trip)
{
    struct evbuffer *b = evbuffer_new();
    struct agw_sse_parser *p = agw_sse_parser_new(1 << 20);
    struct rec r = {0};
    size_t big = 100000;
    char *payload = malloc(big);

    for (size_t i = 0; i < big; i++)
        payload[i] = (char)(' ' + i % 90);
    agw_sse_write_comment(b, "ping");
    agw_sse_write_data(b, " leading space kept", 19);
    agw_sse_write_data(b, payload, big);
    agw_sse_write_data(b, "[DONE]", 6);
    cr_assert_eq(agw_sse_parse(p, b, on_frame, &r), 3);
    assert_frame(&r, 0, " leading space kept", NULL, NULL, -1);
    cr_assert_eq(r.f[1].len, big);
    cr_assert(memcmp(r.f[1].data, payload, big) == 0);
    assert_frame(&r, 2, "[DONE]", NULL, NULL, -1);
    free(payload);
    evbuffer_free(b);
    agw_sse_parser_free(p);
    rec_free(&r);
}
