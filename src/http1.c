/* Incremental HTTP/1.1 parsers: responses for the upstream side, requests for the server side (see
 * include/agw/http1.h).
 *
 * Head: the parser looks for the blank line one line at a time (find_lf()), remembering how far
 * it has looked (<scan>), so bytes are examined once however the head is cut into reads, and never
 * past <max_head>. Only a complete head is made contiguous (one pullup of at most <max_head>
 * bytes) and parsed as a plain block.
 *
 * Body: one decoder (decode()) walks a contiguous block and hands each run of body bytes to a
 * callback as (offset, length); framing bytes are not handed on. Two entry points use it. With
 * evbuffers, each segment is a block and a run leaves <in> for <out> with evbuffer_remove_buffer()
 * (whole chains change hands: moved, not copied). With a memory block, the runs move to its front
 * (in place: the relay's reads, no evbuffer at all). A chunk-size or trailer line cut by the end of
 * a block is kept in a small buffer allocated for it, within its ceiling (MAX_CHUNK_LINE; max_head
 * for the whole trailer section), so split points never change the outcome.
 *
 * Errors are sticky: once a call has failed, later parse_head()/parse_body() calls return the same
 * code (and parse_eof() -AGW_EPROTO) until agw_http1_parser_reset(). */
#include "config.h"

#include <assert.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "agw/http1.h"

/* Whether the <n> bytes at <name>, a field name already checked to be tchars, are <lower> (a
 * literal of lowercase letters, digits and '-') in any case. A tchar c equals a lowercase letter,
 * digit or '-' e exactly when (c | 0x20) == e: the bytes that differ from e by 0x20 only are e's
 * capital or control bytes (CR, 0x10-0x19), which are no tchars. Eight bytes at a time, the last
 * eight overlapping: a byte loop was 150 instructions a name (12 names a run). */
#define NAME_IS(name, n, lower) name_is(name, n, lower, sizeof(lower) - 1)

static inline bool name_is(const char *name, size_t n, const char *lower, size_t len)
{
    const uint64_t caps = 0x2020202020202020ULL;
    uint64_t a, b;

    if (n != len)
        return false;
    if (n < 8) {
        for (size_t i = 0; i < n; i++)
            if (((unsigned char)name[i] | 0x20) != (unsigned char)lower[i])
                return false;
        return true;
    }
    for (size_t i = 0; i + 8 < n; i += 8) {
        memcpy(&a, name + i, 8);
        memcpy(&b, lower + i, 8);
        if ((a | caps) != b)
            return false;
    }
    memcpy(&a, name + n - 8, 8);
    memcpy(&b, lower + n - 8, 8);
    return (a | caps) == b;
}

#define MAX_CHUNK_LINE 1024                  /* a chunk-size line, without its line end */
#define MAX_CHUNK_SIZE (UINT64_C(1) << 62)   /* larger chunk sizes are refused, not wrapped */
#define MAX_INTERIM    32                    /* 1xx responses skipped before the final one */
#define MAX_MOVE       ((size_t)INT_MAX / 2) /* evbuffer_remove_buffer() returns an int */

enum parser_state {
    ST_HEAD = 0, /* waiting for the (final) response head */
    ST_BODY,     /* moving body bytes, framed by <body> */
    ST_DONE,     /* the body is complete */
    ST_ERROR,    /* a call failed with <error>; only a reset leaves this state */
};

enum chunk_state {
    CH_SIZE = 0, /* reading "hex [OWS] [;ext] CRLF" */
    CH_DATA,     /* <remaining> bytes of chunk data */
    CH_DATA_END, /* the CRLF after chunk data */
    CH_DATA_CR,  /* its CR was read: the LF must follow */
    CH_TRAILERS, /* trailer lines until an empty one */
};

struct agw_http1_parser {
    size_t max_head;         /* ceiling for a head, and for the trailer section */
    enum parser_state state; /* see enum parser_state */
    int error;               /* ST_ERROR: the negative code returned by every call */
    /* ST_HEAD: bytes of <in> known to hold only non-empty head lines. */
    size_t scan;
    unsigned interim; /* ST_HEAD: 1xx responses skipped so far */
    enum agw_http1_body body;
    uint64_t remaining;     /* LENGTH: body bytes left; CHUNKED: bytes left in the chunk */
    enum chunk_state chunk; /* CHUNKED only */
    size_t trailer_bytes;   /* CHUNKED: trailer section bytes consumed, <= max_head */
    /* CHUNKED: the start of a chunk-size or trailer line that a block cut (no LF in it); allocated
     * only then, freed once the line is complete. */
    char *line;
    size_t line_len, line_cap;
    bool line_crlf; /* the last line take_line() returned ended with CR LF */
    bool request;   /* a request parser: the members below exist */
    /* Request parsers only: the limits, the lines of the head seen so far, the body bytes announced
     * so far (chunked) and whether the last -AGW_ETOOBIG was the body limit. A response parser
     * (one per upstream exchange, alive as long as its stream) is allocated without them. */
    struct agw_http1_request_limits lim;
    unsigned lines;
    uint64_t announced;
    bool over_limit;
    char why[96]; /* a refusal's message that names a limit (agw_http1_request.error points here) */
};

#define RESPONSE_PARSER_SIZE offsetof(struct agw_http1_parser, lim)

static struct agw_http1_parser *parser_new(size_t max_head, size_t size)
{
    struct agw_http1_parser *p = agw_xcalloc(1, size);

    assert(max_head > 0);
    p->max_head = max_head;
    return p;
}

struct agw_http1_parser *agw_http1_parser_new(size_t max_head)
{
    return parser_new(max_head, RESPONSE_PARSER_SIZE);
}

void agw_http1_parser_clear(struct agw_http1_parser *p)
{
    if (p == NULL)
        return;
    free(p->line);
    p->line = NULL;
    p->line_len = p->line_cap = 0;
}

void agw_http1_parser_free(struct agw_http1_parser *p)
{
    agw_http1_parser_clear(p);
    free(p);
}

size_t agw_http1_request_parser_size(void)
{
    return sizeof(struct agw_http1_parser);
}

struct agw_http1_parser *agw_http1_request_parser_init(void *mem, size_t max_head,
                                                       const struct agw_http1_request_limits *lim)
{
    struct agw_http1_parser *p = mem;

    assert(max_head > 0 && lim->max_line > 0 && lim->max_fields > 0);
    memset(p, 0, sizeof(*p));
    p->max_head = max_head;
    p->request = true;
    p->lim = *lim;
    return p;
}

struct agw_http1_parser *agw_http1_request_parser_new(size_t max_head,
                                                      const struct agw_http1_request_limits *lim)
{
    return agw_http1_request_parser_init(agw_xmalloc(sizeof(struct agw_http1_parser)), max_head,
                                         lim);
}

void agw_http1_parser_reset(struct agw_http1_parser *p)
{
    size_t max_head = p->max_head;
    bool request = p->request;
    struct agw_http1_request_limits lim = {0};

    if (request)
        lim = p->lim;
    free(p->line);
    memset(p, 0, request ? sizeof(*p) : RESPONSE_PARSER_SIZE);
    p->max_head = max_head;
    p->request = request;
    if (request)
        p->lim = lim;
}

void agw_http1_response_clear(struct agw_http1_response *resp)
{
    free(resp->content_type);
    memset(resp, 0, sizeof(*resp));
}

static int fail(struct agw_http1_parser *p, int rc)
{
    assert(rc < 0 && rc != AGW_AGAIN);
    p->state = ST_ERROR;
    p->error = rc;
    return rc;
}

/* ---- lexical helpers (RFC 9110 §5.6) ----------------------------------------------------- */

/* tchar (RFC 9110 §5.6.2): a header name's bytes, a method's. A table: every byte of every name of
 * every head is looked up. */
static const bool tchar[256] = {
    ['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1,         ['&'] = 1,         ['\''] = 1,
    ['*'] = 1, ['+'] = 1, ['-'] = 1, ['.'] = 1,         ['^'] = 1,         ['_'] = 1,
    ['`'] = 1, ['|'] = 1, ['~'] = 1, ['0' ... '9'] = 1, ['A' ... 'Z'] = 1, ['a' ... 'z'] = 1,
};

static bool is_tchar(unsigned char c)
{
    return tchar[c];
}

static bool is_ows(char c)
{
    return c == ' ' || c == '\t';
}

/* The bytes [*a, b) without the OWS at either end: moves *a on and returns the new end. */
static const char *trim_ows(const char **a, const char *b)
{
    while (*a < b && is_ows(**a))
        (*a)++;
    while (b > *a && is_ows(b[-1]))
        b--;
    return b;
}

/* field-vchar / SP / HTAB: any byte but the controls (HTAB excepted) and DEL. obs-text passes. */
static bool is_field_char(unsigned char c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

static bool all_field_chars(const char *s, size_t n)
{
    size_t i = 0;

#if defined(__SSE2__)
    /* sixteen bytes at a time where there is SSE2 (every x86-64): a byte passes when it is at least
     * 0x20 (unsigned) and not DEL, or is HTAB */
    for (; n - i >= 16; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
        __m128i ge20 = _mm_cmpeq_epi8(_mm_max_epu8(v, _mm_set1_epi8(0x20)), v);
        __m128i ok = _mm_or_si128(_mm_andnot_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(0x7f)), ge20),
                                  _mm_cmpeq_epi8(v, _mm_set1_epi8('\t')));

        if (_mm_movemask_epi8(ok) != 0xffff)
            return false;
    }
#endif
    for (; i < n; i++)
        if (!is_field_char((unsigned char)s[i]))
            return false;
    return true;
}

/* Cuts the next element off the comma-separated list that *s walks (up to <end>; *s becomes NULL
 * after the last element) into [*e, *e + *elen), trimmed of OWS. Returns false when the list is
 * exhausted. Empty elements are returned, with length 0, for the caller to judge. */
static bool next_element(const char **s, const char *end, const char **e, size_t *elen)
{
    const char *a = *s, *b;

    if (a == NULL)
        return false;
    b = memchr(a, ',', (size_t)(end - a));
    if (b == NULL) {
        b = end;
        *s = NULL;
    } else {
        *s = b + 1;
    }
    b = trim_ows(&a, b);
    *e = a;
    *elen = (size_t)(b - a);
    return true;
}

/* evbuffer_pullup() of at most max_head bytes. libevent refusing an allocation aborts, as
 * agw_xmalloc() does (the daemon's out-of-memory policy). */
static const char *pullup(struct evbuffer *in, size_t n)
{
    const char *h = (const char *)evbuffer_pullup(in, (ev_ssize_t)n);

    if (h == NULL)
        abort();
    return h;
}

/* ---- head ----------------------------------------------------------------------------------- */

/* The bytes of <in>'s first chain, where a head that came in one read lies whole. */
struct first_chain {
    const char *b;
    size_t len;
};

static struct first_chain first_chain(struct evbuffer *in)
{
    struct evbuffer_iovec v;
    struct first_chain c = {NULL, 0};

    if (evbuffer_peek(in, -1, NULL, &v, 1) >= 1) {
        c.b = v.iov_base;
        c.len = v.iov_len;
    }
    return c;
}

/* The offset in <in> of the first '\n' in [from, to), or -1; *cr = the byte before it when it is
 * after <from> (else 0). What lies in the first chain is searched in place (memchr()), the rest
 * through libevent's search: a head cut into several reads is the rare case. */
static ev_ssize_t find_lf(struct evbuffer *in, const struct first_chain *c, size_t from, size_t to,
                          char *cr)
{
    struct evbuffer_ptr a, z, lf;
    size_t rest = from;

    *cr = 0;
    if (from < c->len) {
        const char *q = memchr(c->b + from, '\n', (to < c->len ? to : c->len) - from);

        if (q != NULL) {
            if ((size_t)(q - c->b) > from)
                *cr = q[-1];
            return q - c->b;
        }
        if (to <= c->len)
            return -1;
        rest = c->len;
    }
    evbuffer_ptr_set(in, &a, rest, EVBUFFER_PTR_SET);
    evbuffer_ptr_set(in, &z, to, EVBUFFER_PTR_SET);
    lf = evbuffer_search_range(in, "\n", 1, &a, &z);
    if (lf.pos > (ev_ssize_t)from) {
        evbuffer_ptr_set(in, &a, (size_t)lf.pos - 1, EVBUFFER_PTR_SET);
        evbuffer_copyout_from(in, &a, cr, 1);
    }
    return lf.pos;
}

/* What the header fields of one head said about framing. */
struct framing {
    bool have_cl;
    uint64_t cl;
    bool have_te; /* a valid "Transfer-Encoding: chunked" was seen */
    bool conn_close;
    bool conn_keep_alive;
};

/* Splits a field line "name: value" (no line end) into its trimmed parts. Returns 0 or
 * -AGW_EPROTO: no colon, an empty name or one with non-token bytes (which includes whitespace
 * before the colon and a leading space, i.e. obs-fold), or a value with control bytes. */
static int split_field(const char *line, size_t n, size_t *nlen, const char **v, size_t *vlen)
{
    const char *colon = memchr(line, ':', n), *end = line + n, *vb, *ve;

    if (colon == NULL || colon == line)
        return -AGW_EPROTO;
    for (const char *c = line; c < colon; c++)
        if (!is_tchar((unsigned char)*c))
            return -AGW_EPROTO;
    vb = colon + 1;
    ve = trim_ows(&vb, end);
    if (!all_field_chars(vb, (size_t)(ve - vb)))
        return -AGW_EPROTO;
    *nlen = (size_t)(colon - line);
    *v = vb;
    *vlen = (size_t)(ve - vb);
    return 0;
}

/* Content-Length: 1*DIGIT, or a list of identical such values (RFC 9110 §8.6); every field line
 * must agree with the ones before. */
static int parse_content_length(const char *v, size_t n, struct framing *f)
{
    const char *s = v, *end = v + n, *e = NULL;
    size_t elen;

    if (n == 0)
        return -AGW_EPROTO;
    while (next_element(&s, end, &e, &elen)) {
        uint64_t x = 0;

        if (elen == 0)
            return -AGW_EPROTO;
        for (size_t i = 0; i < elen; i++) {
            unsigned d = (unsigned)(unsigned char)e[i] - '0';
            if (d > 9 || x > (UINT64_MAX - d) / 10)
                return -AGW_EPROTO;
            x = x * 10 + d;
        }
        if (f->have_cl && x != f->cl)
            return -AGW_EPROTO;
        f->have_cl = true;
        f->cl = x;
    }
    return 0;
}

/* Transfer-Encoding: we decode chunked and nothing else, so the only acceptable coding list, over
 * all field lines together, is a single "chunked" (which is then also the final coding). gzip or
 * any other coding would reach the SSE parser undecoded; "chunked, chunked" is invalid. */
static int parse_transfer_encoding(const char *v, size_t n, struct framing *f)
{
    const char *s = v, *end = v + n, *e = NULL;
    size_t elen;
    bool any = false;

    while (next_element(&s, end, &e, &elen)) {
        if (elen == 0)
            continue; /* "chunked," : empty list elements are legal and mean nothing */
        if (f->have_te || !agw_strieq_n(e, elen, "chunked"))
            return -AGW_EPROTO;
        f->have_te = true;
        any = true;
    }
    return any ? 0 : -AGW_EPROTO;
}

static void parse_connection(const char *v, size_t n, struct framing *f)
{
    const char *s = v, *end = v + n, *e = NULL;
    size_t elen;

    while (next_element(&s, end, &e, &elen)) {
        if (agw_strieq_n(e, elen, "close"))
            f->conn_close = true;
        else if (agw_strieq_n(e, elen, "keep-alive"))
            f->conn_keep_alive = true;
    }
}

/* "HTTP/1.x SSS[ reason]" without its line end. */
static int parse_status_line(const char *line, size_t n, struct agw_http1_response *resp)
{
    if (n < 12 || memcmp(line, "HTTP/1.", 7) != 0 || (line[7] != '0' && line[7] != '1') ||
        line[8] != ' ')
        return -AGW_EPROTO;
    for (size_t i = 9; i < 12; i++)
        if (line[i] < '0' || line[i] > '9')
            return -AGW_EPROTO;
    /* The reason phrase is optional, and so is, in practice, the space before an empty one. */
    if (n > 12 && (line[12] != ' ' || !all_field_chars(line + 13, n - 13)))
        return -AGW_EPROTO;
    resp->minor_version = line[7] - '0';
    resp->status = (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
    if (resp->status < 100 || resp->status > 599)
        return -AGW_EPROTO;
    return 0;
}

/* Length of the line at <h> (up to <end>, which a '\n' precedes), without CR LF or LF; *next is
 * set past the line end. A bare CR elsewhere in the line stays in it (and fails validation). */
static size_t cut_line(const char *h, const char *end, const char **next)
{
    const char *lf = memchr(h, '\n', (size_t)(end - h));
    size_t n;

    assert(lf != NULL);
    *next = lf + 1;
    n = (size_t)(lf - h);
    if (n > 0 && h[n - 1] == '\r')
        n--;
    return n;
}

/* Parses one complete head: <h>, <len> bytes, ending with its blank line. Fills <resp> (which
 * the caller has zeroed). Returns 0 or -AGW_EPROTO; on error <resp> may hold a content_type. */
static int parse_head_block(const char *h, size_t len, struct agw_http1_response *resp)
{
    const char *end = h + len, *line = h, *next, *v;
    struct framing f = {0};
    size_t n, nlen, vlen;
    int rc;

    n = cut_line(line, end, &next);
    if ((rc = parse_status_line(line, n, resp)) != 0)
        return rc;
    for (line = next; (n = cut_line(line, end, &next)) > 0; line = next) {
        if ((rc = split_field(line, n, &nlen, &v, &vlen)) != 0)
            return rc;
        if (NAME_IS(line, nlen, "content-length"))
            rc = parse_content_length(v, vlen, &f);
        else if (NAME_IS(line, nlen, "transfer-encoding"))
            rc = parse_transfer_encoding(v, vlen, &f);
        else if (NAME_IS(line, nlen, "connection"))
            parse_connection(v, vlen, &f);
        else if (NAME_IS(line, nlen, "content-type")) {
            /* A second, different media type leaves the body's type undecidable. */
            if (resp->content_type == NULL)
                resp->content_type = agw_xstrndup(v, vlen);
            else if (strlen(resp->content_type) != vlen || memcmp(resp->content_type, v, vlen) != 0)
                rc = -AGW_EPROTO;
        }
        if (rc != 0)
            return rc;
    }
    assert(next == end);

    if (resp->minor_version == 1)
        resp->keep_alive = !f.conn_close;
    else
        resp->keep_alive = f.conn_keep_alive && !f.conn_close;

    if (resp->status < 200 || resp->status == 204 || resp->status == 304) {
        resp->body = AGW_HTTP1_BODY_NONE;
    } else if (f.have_te) {
        resp->body = AGW_HTTP1_BODY_CHUNKED;
        /* RFC 9112 §6.1, §6.3: Transfer-Encoding wins over Content-Length, but such a message
         * (or an HTTP/1.0 one with Transfer-Encoding) may be a smuggling attempt: do not reuse
         * the connection after it. */
        if (f.have_cl || resp->minor_version == 0)
            resp->keep_alive = false;
    } else if (f.have_cl) {
        resp->body = AGW_HTTP1_BODY_LENGTH;
        resp->content_length = f.cl;
    } else {
        resp->body = AGW_HTTP1_BODY_CLOSE;
        resp->keep_alive = false;
    }
    return 0;
}

/* Looks for the blank line that ends the head at the start of <in>, resuming at <p->scan>.
 * Returns the head's length including that line, AGW_AGAIN, -AGW_ETOOBIG when no head fits in
 * max_head bytes, or -AGW_EPROTO when the bytes cannot be an HTTP/1 response. */
static ev_ssize_t find_head_end(struct agw_http1_parser *p, struct evbuffer *in)
{
    size_t len = evbuffer_get_length(in);
    size_t limit = len < p->max_head ? len : p->max_head;
    static const char prefix[] = "HTTP/1.";
    /* the prefix's bytes that are in, within max_head: split-invariant */
    size_t k = limit < sizeof(prefix) - 1 ? limit : sizeof(prefix) - 1;
    struct first_chain c = first_chain(in);

    if (p->scan > len)
        p->scan = 0; /* the caller drained <in>: start over rather than trust a stale offset */
    /* Fail fast on a peer that is not speaking HTTP/1 (TLS, HTTP/2, garbage) rather than wait
     * for max_head bytes or the idle timeout. */
    if (p->scan == 0) {
        char start[sizeof(prefix) - 1];
        const char *s = start;

        if (k > 0 && c.len >= k)
            s = c.b;
        else
            evbuffer_copyout(in, start, k);
        if (memcmp(s, prefix, k) != 0)
            return -AGW_EPROTO;
    }
    while (p->scan < limit) {
        char cr;
        ev_ssize_t lf = find_lf(in, &c, p->scan, limit, &cr);

        if (lf < 0)
            break;
        if ((size_t)lf == p->scan || ((size_t)lf == p->scan + 1 && cr == '\r')) {
            if (p->scan == 0)
                return -AGW_EPROTO; /* an empty status line */
            return lf + 1;
        }
        p->scan = (size_t)lf + 1;
    }
    return len >= p->max_head ? -AGW_ETOOBIG : AGW_AGAIN;
}

int agw_http1_parse_head(struct agw_http1_parser *p, struct evbuffer *in,
                         struct agw_http1_response *resp)
{
    assert(p->state != ST_BODY);
    if (p->state == ST_BODY)
        return -AGW_EINVAL; /* the body is unread: a caller bug, refused even without asserts */
    if (p->state == ST_ERROR)
        return p->error;
    if (p->state == ST_DONE)
        agw_http1_parser_reset(p);
    memset(resp, 0, sizeof(*resp));
    for (;;) {
        ev_ssize_t n = find_head_end(p, in);
        const char *h;
        int rc;

        if (n == AGW_AGAIN)
            return AGW_AGAIN;
        if (n < 0)
            return fail(p, (int)n);
        h = pullup(in, (size_t)n);
        rc = parse_head_block(h, (size_t)n, resp);
        /* A protocol switch is of no use to a run; an endless stream of interim answers would
         * keep the exchange alive without ever producing one. */
        if (rc == 0 && resp->status < 200 && (resp->status == 101 || ++p->interim > MAX_INTERIM))
            rc = -AGW_EPROTO;
        if (rc != 0) {
            agw_http1_response_clear(resp);
            return fail(p, rc);
        }
        evbuffer_drain(in, (size_t)n);
        p->scan = 0;
        if (resp->status >= 200)
            break;
        agw_http1_response_clear(resp); /* 100 Continue, 103 Early Hints: wait for the real one */
    }
    p->state = ST_BODY;
    p->body = resp->body;
    p->remaining = resp->content_length;
    if (resp->body == AGW_HTTP1_BODY_NONE ||
        (resp->body == AGW_HTTP1_BODY_LENGTH && p->remaining == 0))
        p->state = ST_DONE;
    return 0;
}

/* ---- request head --------------------------------------------------------------------------- */

/* Records why a request is refused. 413, 414 and 431 are limits (-AGW_ETOOBIG); the rest are
 * -AGW_EPROTO. A message naming a number is formatted into p->why. */
static int refuse(struct agw_http1_parser *p, struct agw_http1_request *req, int status,
                  const char *why)
{
    req->status = status;
    req->error = why;
    return fail(p, status == 413 || status == 414 || status == 431 ? -AGW_ETOOBIG : -AGW_EPROTO);
}

#define MAX_METHOD AGW_HTTP1_MAX_METHOD

/* Methods are upper-case tokens (as nginx takes them): a lower-case "get" names no method. */
static bool is_method_char(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || c == '-' || c == '_';
}

/* Fails fast on bytes that cannot begin a request line (a TLS handshake on a plain port, an SSH
 * banner, a lower-case method) rather than waiting for a whole line. */
static int check_method_prefix(struct agw_http1_parser *p, struct evbuffer *in,
                               struct agw_http1_request *req)
{
    char start[MAX_METHOD + 1];
    ev_ssize_t k = evbuffer_copyout(in, start, sizeof(start));
    /* Only bytes within the head's limits are looked at, so that how the input was cut into reads
     * never decides between this refusal and a limit's (split-invariance). */
    size_t window = p->max_head < p->lim.max_line + 2 ? p->max_head : p->lim.max_line + 2;

    if (k > 0 && (size_t)k > window)
        k = (ev_ssize_t)window;

    for (ev_ssize_t i = 0; i < k; i++) {
        if (start[i] == ' ' && i > 0)
            return 0;
        if (!is_method_char((unsigned char)start[i]))
            return refuse(p, req, 400, "bad request: invalid method");
    }
    return k > MAX_METHOD ? refuse(p, req, 400, "bad request: invalid method") : 0;
}

/* Looks for the blank line that ends the request head at the start of <in>, resuming at <p->scan>,
 * and checks each line as it arrives: its length, its CR LF end, the number of fields. Returns the
 * head's length including the blank line, AGW_AGAIN, or a refusal. */
static ev_ssize_t find_request_head_end(struct agw_http1_parser *p, struct evbuffer *in,
                                        struct agw_http1_request *req)
{
    size_t len, line_max = p->lim.max_line + 2;
    struct first_chain c;

    if (p->scan == 0) {
        unsigned char two[2];
        int rc;

        ev_ssize_t k;

        while ((k = evbuffer_copyout(in, two, 2)) == 2 && two[0] == '\r' && two[1] == '\n')
            evbuffer_drain(in, 2);
        if (k == 1 && two[0] == '\r')
            return AGW_AGAIN; /* maybe an empty line's CR */
        if (k > 0 && p->lines == 0 && (rc = check_method_prefix(p, in, req)) != 0)
            return rc;
    }
    len = evbuffer_get_length(in);
    c = first_chain(in);
    while (p->scan < len) {
        size_t limit = p->scan + line_max;
        char cr;
        ev_ssize_t lf;

        if (limit > len)
            limit = len;
        if (limit > p->max_head)
            limit = p->max_head;
        if (limit <= p->scan)
            break;
        lf = find_lf(in, &c, p->scan, limit, &cr);
        if (lf < 0) {
            if (limit - p->scan >= line_max) {
                snprintf(p->why, sizeof(p->why), "%s is limited to %zu bytes",
                         p->lines == 0 ? "URI too long: the request line"
                                       : "request header fields too large: a header field line",
                         p->lim.max_line);
                return refuse(p, req, p->lines == 0 ? 414 : 431, p->why);
            }
            break;
        }
        if (cr != '\r')
            return refuse(p, req, 400, "bad request: lines must end with CR LF");
        if ((size_t)lf == p->scan + 1) /* "\r\n": the blank line */
            return lf + 1;
        if (p->lines > p->lim.max_fields) {
            snprintf(p->why, sizeof(p->why),
                     "request header fields too large: more than %u header fields",
                     p->lim.max_fields);
            return refuse(p, req, 431, p->why);
        }
        p->lines++;
        p->scan = (size_t)lf + 1;
    }
    if (len >= p->max_head) {
        snprintf(p->why, sizeof(p->why),
                 "request header fields too large: the request head is limited to %zu bytes",
                 p->max_head);
        return refuse(p, req, 431, p->why);
    }
    return AGW_AGAIN;
}

/* A request target in origin form ("/path?query") or, for OPTIONS, "*": visible ASCII only. The
 * absolute form (a proxy's) is not served. */
static int check_target(struct agw_http1_parser *p, struct agw_http1_request *req, const char *t,
                        size_t n, bool options)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)t[i] <= 0x20 || (unsigned char)t[i] >= 0x7f)
            return refuse(p, req, 400, "bad request: invalid character in the request target");
    if (t[0] == '/' || (options && n == 1 && t[0] == '*'))
        return 0;
    return refuse(p, req, 400, "bad request: the request target must be an absolute path");
}

/* "METHOD SP request-target SP HTTP/1.1", without its line end; exactly one space apart. */
static int parse_request_line(struct agw_http1_parser *p, struct agw_http1_request *req,
                              const char *line, size_t n)
{
    const char *sp1 = memchr(line, ' ', n), *sp2, *v, *end = line + n;
    size_t mlen;

    if (sp1 == NULL)
        return refuse(p, req, 400, "bad request: malformed request line");
    mlen = (size_t)(sp1 - line);
    if (mlen == 0 || mlen > MAX_METHOD)
        return refuse(p, req, 400, "bad request: invalid method");
    for (size_t i = 0; i < mlen; i++)
        if (!is_method_char((unsigned char)line[i]))
            return refuse(p, req, 400, "bad request: invalid method");
    sp2 = memchr(sp1 + 1, ' ', (size_t)(end - sp1 - 1));
    if (sp2 == NULL || sp2 == sp1 + 1)
        return refuse(p, req, 400, "bad request: malformed request line");
    v = sp2 + 1;
    if (end - v != 8 || memcmp(v, "HTTP/", 5) != 0 || v[5] < '0' || v[5] > '9' || v[6] != '.' ||
        v[7] < '0' || v[7] > '9')
        return refuse(p, req, 400, "bad request: malformed request line");
    if (v[5] != '1' || v[7] != '1')
        return refuse(p, req, 505, "HTTP version not supported: use HTTP/1.1");
    req->head_method = mlen == 4 && memcmp(line, "HEAD", 4) == 0;
    memcpy(req->method, line, mlen);
    req->method[mlen] = '\0';
    return check_target(p, req, sp1 + 1, (size_t)(sp2 - sp1 - 1),
                        mlen == 7 && memcmp(line, "OPTIONS", 7) == 0);
}

/* What the field lines said. */
struct request_fields {
    const char *head; /* the head's first byte */
    unsigned host, authorization, content_length;
    uint32_t n_fields;
    bool chunked;
};

/* uri-host [":" port]: registered-name, IPv4 or bracketed IPv6 characters (may be empty). */
static bool host_ok(const char *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              strchr("-._~%!$&'()*+,;=:[]", c) != NULL))
            return false;
    }
    return true;
}

/* One field line (no line end) of a request head. */
static int request_field(struct agw_http1_parser *p, struct agw_http1_request *req,
                         struct request_fields *f, const char *line, size_t n)
{
    const char *colon, *v, *ve, *s, *e = NULL;
    size_t nlen, vlen, elen;

    if (line[0] == ' ' || line[0] == '\t')
        return refuse(p, req, 400, "bad request: obsolete line folding");
    colon = memchr(line, ':', n);
    if (colon == NULL || colon == line)
        return refuse(p, req, 400, "bad request: invalid header field name");
    nlen = (size_t)(colon - line);
    for (size_t i = 0; i < nlen; i++)
        if (!is_tchar((unsigned char)line[i]))
            return refuse(p, req, 400, "bad request: invalid header field name");
    v = colon + 1;
    ve = trim_ows(&v, line + n);
    vlen = (size_t)(ve - v);
    if (!all_field_chars(v, vlen))
        return refuse(p, req, 400, "bad request: invalid character in a header field value");

    if (NAME_IS(line, nlen, "host")) {
        if (++f->host > 1)
            return refuse(p, req, 400, "bad request: more than one Host header");
        if (!host_ok(v, vlen))
            return refuse(p, req, 400, "bad request: invalid Host header");
    } else if (NAME_IS(line, nlen, "authorization")) {
        if (++f->authorization > 1)
            return refuse(p, req, 400, "bad request: more than one Authorization header");
    } else if (NAME_IS(line, nlen, "content-length")) {
        uint64_t x = 0;

        if (++f->content_length > 1)
            return refuse(p, req, 400, "bad request: more than one Content-Length");
        if (vlen == 0 || vlen > 19)
            return refuse(p, req, 400, "bad request: invalid Content-Length");
        for (size_t i = 0; i < vlen; i++) {
            if (v[i] < '0' || v[i] > '9')
                return refuse(p, req, 400, "bad request: invalid Content-Length");
            x = x * 10 + (uint64_t)(v[i] - '0');
        }
        req->content_length = x;
    } else if (NAME_IS(line, nlen, "transfer-encoding")) {
        bool any = false;

        for (s = v; next_element(&s, ve, &e, &elen);) {
            if (elen == 0)
                continue;
            if (!agw_strieq_n(e, elen, "chunked"))
                return refuse(p, req, 501,
                              "not implemented: a Transfer-Encoding other than chunked");
            if (f->chunked)
                return refuse(p, req, 400, "bad request: chunked applied more than once");
            f->chunked = any = true;
        }
        if (!any)
            return refuse(p, req, 400, "bad request: empty Transfer-Encoding");
    } else if (NAME_IS(line, nlen, "expect")) {
        if (!agw_strieq_n(v, vlen, "100-continue"))
            return refuse(p, req, 417, "expectation failed: only 100-continue is supported");
        req->expect_continue = true;
    } else if (NAME_IS(line, nlen, "connection")) {
        for (s = v; next_element(&s, ve, &e, &elen);)
            if (agw_strieq_n(e, elen, "close"))
                req->close = true;
    } else if (NAME_IS(line, nlen, "origin")) { /* (for the CORS fields of a refusal) */
        req->origin_at = (uint32_t)(v - f->head);
        req->origin_len = (uint32_t)vlen;
    }
    return 0;
}

/* Checks one complete head (<len> bytes, ending with its blank line) and fills <req>. */
static int parse_request_block(struct agw_http1_parser *p, struct agw_http1_request *req,
                               const char *h, size_t len)
{
    const char *end = h + len, *line = h, *next;
    struct request_fields f = {.head = h};
    size_t n;
    int rc;

    n = cut_line(line, end, &next);
    if ((rc = parse_request_line(p, req, line, n)) != 0)
        return rc;
    for (line = next; (n = cut_line(line, end, &next)) > 0; line = next, f.n_fields++)
        if ((rc = request_field(p, req, &f, line, n)) != 0)
            return rc;
    if (f.host == 0)
        return refuse(p, req, 400, "bad request: missing Host header");
    req->n_fields = f.n_fields;
    if (f.chunked && f.content_length > 0)
        return refuse(p, req, 400, "bad request: both Transfer-Encoding and Content-Length");
    if (f.chunked) {
        req->body = AGW_HTTP1_BODY_CHUNKED;
        req->rewrite = true;
    } else if (f.content_length > 0) {
        if (req->content_length > p->lim.max_body)
            return refuse(p, req, 413, "payload too large");
        req->body = AGW_HTTP1_BODY_LENGTH;
    }
    return 0;
}

int agw_http1_parse_request_head(struct agw_http1_parser *p, struct evbuffer *in,
                                 struct agw_http1_request *req)
{
    ev_ssize_t n;
    int rc;

    assert(p->request && p->state != ST_BODY);
    if (p->state == ST_ERROR)
        return p->error;
    if (p->state == ST_DONE)
        agw_http1_parser_reset(p);
    memset(req, 0, sizeof(*req));
    n = find_request_head_end(p, in, req);
    if (n < 0)
        return (int)n;
    rc = parse_request_block(p, req, pullup(in, (size_t)n), (size_t)n);
    if (rc != 0)
        return rc;
    req->head_len = (size_t)n;
    p->scan = 0;
    p->lines = 0;
    p->state = ST_BODY;
    p->body = req->body;
    p->remaining = req->content_length;
    if (req->body == AGW_HTTP1_BODY_NONE ||
        (req->body == AGW_HTTP1_BODY_LENGTH && p->remaining == 0))
        p->state = ST_DONE;
    return 0;
}

bool agw_http1_body_over_limit(const struct agw_http1_parser *p)
{
    return p->over_limit;
}

size_t agw_http1_request_fields(char *head, size_t head_len, struct agw_http1_field *f, size_t max)
{
    char *end = head + head_len, *line = memchr(head, '\n', head_len), *lf;
    size_t n, k = 0;

    assert(line != NULL);
    /* after the request line, each line up to the blank one */
    for (line++; k < max && (lf = memchr(line, '\n', (size_t)(end - line))) != NULL;
         line = lf + 1) {
        if ((n = (size_t)(lf - line)) > 0 && line[n - 1] == '\r')
            n--;
        if (n == 0)
            break;
        /* The head was checked: a name is a token right before its colon, a value's bytes are
         * field bytes. */
        char *colon = memchr(line, ':', n);
        const char *v, *ve;

        assert(colon != NULL);
        v = colon + 1;
        ve = trim_ows(&v, line + n);
        *colon = '\0';
        line[ve - line] = '\0';
        f[k++] = (struct agw_http1_field){.name = line,
                                          .value = v,
                                          .name_len = (uint32_t)(colon - line),
                                          .value_len = (uint32_t)(ve - v)};
    }
    return k;
}

/* ---- body ----------------------------------------------------------------------------------- */

/* chunk-size [ OWS ] [ ";" chunk-ext ] (RFC 9112 §7.1), without the line end. The extensions are
 * ignored but must be made of field bytes. */
static int parse_chunk_size(const char *line, size_t n, uint64_t *size)
{
    const char *c = line, *end = line + n;
    uint64_t x = 0;

    if (c == end)
        return -AGW_EPROTO;
    for (; c < end; c++) {
        unsigned d;

        if (*c >= '0' && *c <= '9')
            d = (unsigned)(*c - '0');
        else if (*c >= 'a' && *c <= 'f')
            d = (unsigned)(*c - 'a' + 10);
        else if (*c >= 'A' && *c <= 'F')
            d = (unsigned)(*c - 'A' + 10);
        else
            break;
        if (x > (MAX_CHUNK_SIZE - d) / 16)
            return -AGW_EPROTO;
        x = x * 16 + d;
    }
    if (c == line)
        return -AGW_EPROTO; /* no hex digit */
    while (c < end && is_ows(*c))
        c++;
    if (c < end && (*c != ';' || !all_field_chars(c, (size_t)(end - c))))
        return -AGW_EPROTO;
    *size = x;
    return 0;
}

static void line_keep(struct agw_http1_parser *p, const char *s, size_t n)
{
    if (p->line_len + n > p->line_cap) {
        size_t cap = p->line_cap ? p->line_cap : 64;
        while (cap < p->line_len + n)
            cap *= 2;
        p->line = agw_xrealloc(p->line, cap);
        p->line_cap = cap;
    }
    memcpy(p->line + p->line_len, s, n);
    p->line_len += n;
}

/* The line kept across blocks was used: its buffer goes (lines are rarely cut, and an idle stream
 * should hold nothing). */
static void line_forget(struct agw_http1_parser *p)
{
    free(p->line);
    p->line = NULL;
    p->line_len = p->line_cap = 0;
}

/* Takes the line that starts at b[*i] (its start may have come with earlier blocks, kept in
 * p->line), if its '\n' is within <max> bytes of that start. Returns 0 with the line in *line, *n
 * (without the '\n'; *total = its bytes with the '\n') and *i past it; AGW_AGAIN when the block
 * ends first (the part is kept, *i = len); -AGW_ETOOBIG when <max> bytes hold no '\n'. */
static int take_line(struct agw_http1_parser *p, const char *b, size_t len, size_t *i, size_t max,
                     const char **line, size_t *n, size_t *total)
{
    size_t have = p->line_len, avail = len - *i;
    size_t room = max > have ? max - have : 0;
    const char *lf = memchr(b + *i, '\n', avail < room ? avail : room);
    size_t k;

    if (lf == NULL) {
        if (avail >= room)
            return -AGW_ETOOBIG;
        line_keep(p, b + *i, avail);
        *i = len;
        return AGW_AGAIN;
    }
    k = (size_t)(lf - (b + *i));
    if (have == 0) {
        *line = b + *i;
        *n = k;
    } else {
        line_keep(p, b + *i, k);
        *line = p->line;
        *n = p->line_len;
    }
    *total = have + k + 1;
    *i += k + 1;
    p->line_crlf = *n > 0 && (*line)[*n - 1] == '\r';
    if (p->line_crlf)
        (*n)--;
    return 0;
}

/* One chunk-size line or trailer line. Returns 1 at the end of the trailer section, 0, or < 0.
 * Trailers are checked for syntax (a framing desync shows up here: a status line is no field line)
 * and dropped. */
static int chunk_line(struct agw_http1_parser *p, const char *line, size_t n, size_t total)
{
    size_t nlen, vlen;
    const char *v;

    if (p->request && !p->line_crlf)
        return -AGW_EPROTO; /* a request's lines end with CR LF */
    if (p->chunk == CH_SIZE) {
        if (n > MAX_CHUNK_LINE)
            return -AGW_ETOOBIG;
        if (parse_chunk_size(line, n, &p->remaining) != 0)
            return -AGW_EPROTO;
        if (p->request) {
            /* Refused as soon as it is announced, not once max_body bytes have come. */
            if (p->remaining > p->lim.max_body - p->announced) {
                p->over_limit = true;
                return -AGW_ETOOBIG;
            }
            p->announced += p->remaining;
        }
        p->chunk = p->remaining == 0 ? CH_TRAILERS : CH_DATA;
        return 0;
    }
    p->trailer_bytes += total;
    if (n == 0)
        return 1;
    return split_field(line, n, &nlen, &v, &vlen) != 0 ? -AGW_EPROTO : 0;
}

/* Body bytes of a block: (offset, length) within it, in order. */
typedef void emit_fn(void *arg, size_t off, size_t n);

/* Decodes the body bytes of the block <b> (<len> bytes), a part of the response after what earlier
 * blocks held. Each run of body bytes is handed to <emit>; framing bytes are not. Returns 1 when
 * the body ended (*used: the bytes of <b> that were the response's; the rest follows it), 0 when
 * all of <b> was used and more is needed, or a negative error (not yet recorded in <p>). */
static int decode(struct agw_http1_parser *p, const char *b, size_t len, size_t *used,
                  emit_fn *emit, void *arg)
{
    size_t i = 0;

    switch (p->body) {
    case AGW_HTTP1_BODY_NONE:
        *used = 0;
        return 1;
    case AGW_HTTP1_BODY_LENGTH:
        i = len < p->remaining ? len : (size_t)p->remaining;
        if (i > 0)
            emit(arg, 0, i);
        p->remaining -= i;
        *used = i;
        return p->remaining == 0 ? 1 : 0;
    case AGW_HTTP1_BODY_CLOSE:
        if (len > 0)
            emit(arg, 0, len);
        *used = len;
        return 0;
    case AGW_HTTP1_BODY_CHUNKED:
        break;
    }
    while (i < len) {
        switch (p->chunk) {
        case CH_SIZE:
        case CH_TRAILERS: {
            size_t max = p->chunk == CH_SIZE ? MAX_CHUNK_LINE + 2 : p->max_head - p->trailer_bytes;
            const char *line = NULL;
            size_t n = 0, total = 0;
            int rc = take_line(p, b, len, &i, max, &line, &n, &total);

            if (rc == AGW_AGAIN)
                break;
            if (rc == 0)
                rc = chunk_line(p, line, n, total);
            if (p->line != NULL)
                line_forget(p);
            if (rc != 0) {
                *used = i;
                return rc;
            }
            break;
        }
        case CH_DATA: {
            size_t take = len - i < p->remaining ? len - i : (size_t)p->remaining;

            emit(arg, i, take);
            i += take;
            p->remaining -= take;
            if (p->remaining == 0)
                p->chunk = CH_DATA_END;
            break;
        }
        case CH_DATA_END: /* exactly CRLF (or, in a response, a bare LF): a chunk longer than
                           * announced fails here */
            if ((b[i] != '\n' || p->request) && b[i] != '\r') {
                *used = i;
                return -AGW_EPROTO;
            }
            p->chunk = b[i++] == '\n' ? CH_SIZE : CH_DATA_CR;
            break;
        case CH_DATA_CR:
            if (b[i] != '\n') {
                *used = i;
                return -AGW_EPROTO;
            }
            i++;
            p->chunk = CH_SIZE;
            break;
        }
    }
    *used = len;
    return 0;
}

/* The state checks both entry points share. Returns 0 to decode, else the value to return. */
static int body_state(const struct agw_http1_parser *p)
{
    assert(p->state != ST_HEAD);
    switch (p->state) {
    case ST_HEAD:
        return -AGW_EINVAL; /* no head yet: a caller bug, refused even without asserts */
    case ST_ERROR:
        return p->error;
    case ST_DONE:
        return 1;
    case ST_BODY:
        break;
    }
    return 0;
}

static int body_end(struct agw_http1_parser *p, int rc)
{
    if (rc < 0)
        return fail(p, rc);
    if (rc == 1)
        p->state = ST_DONE;
    return rc;
}

/* evbuffer blocks: a run of body bytes leaves <in> for <out> with evbuffer_remove_buffer(), which
 * hands over whole chains (no copy) when the run is one; framing bytes before it are drained. */
struct move_ctx {
    struct evbuffer *in, *out;
    size_t pos; /* offset in the block of the first byte still in <in> */
};

static void move_emit(void *arg, size_t off, size_t n)
{
    struct move_ctx *m = arg;
    int rc;

    evbuffer_drain(m->in, off - m->pos);
    assert(n <= MAX_MOVE);
    rc = evbuffer_remove_buffer(m->in, m->out, n);
    assert(rc == (int)n); /* only a frozen buffer or in == out refuses */
    (void)rc;
    m->pos = off + n;
}

int agw_http1_parse_body(struct agw_http1_parser *p, struct evbuffer *in, struct evbuffer *out)
{
    int rc = body_state(p);

    if (rc != 0)
        return rc;
    if (p->body == AGW_HTTP1_BODY_NONE)
        return body_end(p, 1);
    while (rc == 0 && evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec v;
        struct move_ctx m = {in, out, 0};
        size_t used = 0;

        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            break;
        rc = decode(p, v.iov_base, v.iov_len, &used, move_emit, &m);
        if (rc >= 0)
            evbuffer_drain(in, used - m.pos);
    }
    return body_end(p, rc);
}

/* Memory blocks, decoded in place: a run of body bytes moves to the front. */
struct place_ctx {
    char *buf;
    size_t len; /* body bytes at the front so far */
};

static void place_emit(void *arg, size_t off, size_t n)
{
    struct place_ctx *c = arg;

    if (off != c->len)
        memmove(c->buf + c->len, c->buf + off, n);
    c->len += n;
}

int agw_http1_decode_body(struct agw_http1_parser *p, char *buf, size_t len, size_t *used,
                          size_t *body_len)
{
    struct place_ctx c = {buf, 0};
    int rc = body_state(p);

    *used = 0;
    *body_len = 0;
    if (rc != 0)
        return rc;
    rc = decode(p, buf, len, used, place_emit, &c);
    *body_len = c.len;
    return body_end(p, rc);
}

int agw_http1_parse_eof(struct agw_http1_parser *p)
{
    if (p->state == ST_DONE)
        return 1;
    if (p->state == ST_BODY && p->body == AGW_HTTP1_BODY_CLOSE) {
        p->state = ST_DONE;
        return 1;
    }
    if (p->state != ST_ERROR)
        fail(p, -AGW_EPROTO);
    return -AGW_EPROTO;
}
