/* Incremental HTTP/1.1 response parser for the upstream side (see include/agw/http1.h).
 *
 * The head is parsed only once it is complete (the parser looks for the blank line without copying,
 * and gives up past max_head), so the head parser itself is a plain function over one contiguous
 * block. Bodies are moved, not copied: Content-Length and chunk data go from <in> to <out> with
 * evbuffer_remove_buffer(). */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>

#include "agw/http1.h"

#define MAX_CHUNK_LINE 1024
#define MAX_CHUNK_SIZE (UINT64_C(1) << 62)

enum chunk_state {
    CH_SIZE = 0, /* reading "hex[;ext]\r\n" */
    CH_DATA,     /* <remaining> bytes of chunk data */
    CH_DATA_END, /* the CRLF after chunk data */
    CH_TRAILERS, /* trailer lines until an empty one */
    CH_DONE,
};

struct agw_http1_parser {
    size_t max_head;
    enum agw_http1_body body;
    uint64_t remaining; /* LENGTH: body bytes left; CHUNKED: bytes left in the chunk */
    enum chunk_state chunk;
    size_t trailer_bytes;
    bool done; /* the body is complete */
};

struct agw_http1_parser *agw_http1_parser_new(size_t max_head)
{
    struct agw_http1_parser *p = agw_xcalloc(1, sizeof(*p));

    p->max_head = max_head;
    return p;
}

void agw_http1_parser_free(struct agw_http1_parser *p)
{
    free(p);
}

void agw_http1_parser_reset(struct agw_http1_parser *p)
{
    size_t max_head = p->max_head;

    memset(p, 0, sizeof(*p));
    p->max_head = max_head;
}

void agw_http1_response_clear(struct agw_http1_response *resp)
{
    free(resp->content_type);
    memset(resp, 0, sizeof(*resp));
}

static bool is_tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* Does the comma-separated list <v> (<n> bytes) contain <token> (case-insensitive)? */
static bool list_has(const char *v, size_t n, const char *token)
{
    size_t tl = strlen(token);
    size_t i = 0;

    while (i < n) {
        size_t s, e;
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        s = i;
        while (i < n && v[i] != ',')
            i++;
        e = i;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t'))
            e--;
        if (e - s == tl && strncasecmp(v + s, token, tl) == 0)
            return true;
    }
    return false;
}

/* The last element of the comma-separated list <v> is <token>? */
static bool list_last_is(const char *v, size_t n, const char *token)
{
    size_t tl = strlen(token), e = n, s;

    while (e > 0 && (v[e - 1] == ' ' || v[e - 1] == '\t' || v[e - 1] == ','))
        e--;
    s = e;
    while (s > 0 && v[s - 1] != ',')
        s--;
    while (s < e && (v[s] == ' ' || v[s] == '\t'))
        s++;
    return e - s == tl && strncasecmp(v + s, token, tl) == 0;
}

/* Parses one complete head in <h> (<len> bytes, ending with the blank line). Returns 0, or
 * -AGW_EPROTO. */
static int parse_head_block(const char *h, size_t len, struct agw_http1_response *resp)
{
    const char *end = h + len, *line = h, *eol;
    bool have_cl = false, chunked = false, has_te = false, conn_close = false, conn_keep = false;
    uint64_t cl = 0;

    memset(resp, 0, sizeof(*resp));
    /* status line: HTTP/1.x SSS [reason] */
    eol = memchr(line, '\n', (size_t)(end - line));
    if (eol == NULL || eol - line < 12 || memcmp(line, "HTTP/1.", 7) != 0 ||
        (line[7] != '0' && line[7] != '1') || line[8] != ' ')
        return -AGW_EPROTO;
    resp->minor_version = line[7] - '0';
    for (int i = 9; i < 12; i++)
        if (line[i] < '0' || line[i] > '9')
            return -AGW_EPROTO;
    resp->status = (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
    if (resp->status < 100 || (eol - line > 12 && line[12] != ' ' && line[12] != '\r'))
        return -AGW_EPROTO;
    line = eol + 1;

    while (line < end) {
        const char *colon, *v, *ve;
        size_t nlen;

        eol = memchr(line, '\n', (size_t)(end - line));
        if (eol == NULL)
            return -AGW_EPROTO;
        ve = eol;
        if (ve > line && ve[-1] == '\r')
            ve--;
        if (ve == line)
            break; /* the blank line */
        if (*line == ' ' || *line == '\t')
            return -AGW_EPROTO; /* obsolete line folding */
        colon = memchr(line, ':', (size_t)(ve - line));
        if (colon == NULL || colon == line)
            return -AGW_EPROTO;
        for (const char *c = line; c < colon; c++)
            if (!is_tchar((unsigned char)*c))
                return -AGW_EPROTO;
        nlen = (size_t)(colon - line);
        v = colon + 1;
        while (v < ve && (*v == ' ' || *v == '\t'))
            v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        for (const char *c = v; c < ve; c++)
            if ((unsigned char)*c < 0x20 && *c != '\t')
                return -AGW_EPROTO;

        if (nlen == 14 && strncasecmp(line, "content-length", 14) == 0) {
            uint64_t n = 0;
            if (v == ve)
                return -AGW_EPROTO;
            for (const char *c = v; c < ve; c++) {
                if (*c < '0' || *c > '9' || n > (UINT64_MAX - 9) / 10)
                    return -AGW_EPROTO;
                n = n * 10 + (uint64_t)(*c - '0');
            }
            if (have_cl && n != cl)
                return -AGW_EPROTO;
            have_cl = true;
            cl = n;
        } else if (nlen == 17 && strncasecmp(line, "transfer-encoding", 17) == 0) {
            has_te = true;
            /* chunked must be the final coding; we decode nothing else. */
            chunked = list_last_is(v, (size_t)(ve - v), "chunked") &&
                      !(list_has(v, (size_t)(ve - v), "gzip") ||
                        list_has(v, (size_t)(ve - v), "deflate") ||
                        list_has(v, (size_t)(ve - v), "compress"));
            if (!chunked)
                return -AGW_EPROTO;
        } else if (nlen == 10 && strncasecmp(line, "connection", 10) == 0) {
            conn_close |= list_has(v, (size_t)(ve - v), "close");
            conn_keep |= list_has(v, (size_t)(ve - v), "keep-alive");
        } else if (nlen == 12 && strncasecmp(line, "content-type", 12) == 0) {
            free(resp->content_type);
            resp->content_type = agw_xstrndup(v, (size_t)(ve - v));
        }
        line = eol + 1;
    }

    resp->keep_alive = resp->minor_version == 1 ? !conn_close : (conn_keep && !conn_close);
    if ((resp->status >= 100 && resp->status < 200) || resp->status == 204 || resp->status == 304) {
        resp->body = AGW_HTTP1_BODY_NONE;
    } else if (has_te) {
        resp->body = AGW_HTTP1_BODY_CHUNKED;
        if (have_cl)
            resp->keep_alive =
                false; /* RFC 9112 §6.3: TE wins, and the connection cannot be trusted */
    } else if (have_cl) {
        resp->body = AGW_HTTP1_BODY_LENGTH;
        resp->content_length = cl;
    } else {
        resp->body = AGW_HTTP1_BODY_CLOSE;
        resp->keep_alive = false;
    }
    return 0;
}

/* Length of the head at the start of <in> including its blank line, 0 if not complete yet. */
static size_t find_head_end(struct evbuffer *in)
{
    struct evbuffer_ptr crlf, lflf;
    size_t best = 0;

    crlf = evbuffer_search(in, "\r\n\r\n", 4, NULL);
    if (crlf.pos >= 0)
        best = (size_t)crlf.pos + 4;
    /* Bare LF heads: accepted, as the RFC allows recipients to. Search only before a CRLF end. */
    lflf = evbuffer_search_range(in, "\n\n", 2, NULL, NULL);
    if (lflf.pos >= 0 && (best == 0 || (size_t)lflf.pos + 2 < best))
        best = (size_t)lflf.pos + 2;
    return best;
}

int agw_http1_parse_head(struct agw_http1_parser *p, struct evbuffer *in,
                         struct agw_http1_response *resp)
{
    for (;;) {
        size_t n = find_head_end(in);
        int rc;

        if (n == 0)
            return evbuffer_get_length(in) >= p->max_head ? -AGW_ETOOBIG : AGW_AGAIN;
        if (n > p->max_head)
            return -AGW_ETOOBIG;
        rc = parse_head_block((const char *)evbuffer_pullup(in, (ssize_t)n), n, resp);
        if (rc != 0) {
            agw_http1_response_clear(resp);
            return rc;
        }
        evbuffer_drain(in, n);
        if (resp->status >= 100 && resp->status < 200) {
            /* Interim answers are skipped; a protocol switch is not something a run can use. */
            bool upgrade = resp->status == 101;
            agw_http1_response_clear(resp);
            if (upgrade)
                return -AGW_EPROTO;
            continue;
        }
        agw_http1_parser_reset(p);
        p->body = resp->body;
        p->remaining = resp->content_length;
        p->done = resp->body == AGW_HTTP1_BODY_NONE ||
                  (resp->body == AGW_HTTP1_BODY_LENGTH && p->remaining == 0);
        return 0;
    }
}

/* Reads one line (without its line end) of at most <max> bytes from <in> into <line>. Returns its
 * length, AGW_AGAIN when no full line is there yet, or -AGW_ETOOBIG. */
static int read_line(struct evbuffer *in, char *line, size_t max)
{
    struct evbuffer_ptr lf = evbuffer_search(in, "\n", 1, NULL);
    size_t n;

    if (lf.pos < 0)
        return evbuffer_get_length(in) > max ? -AGW_ETOOBIG : AGW_AGAIN;
    n = (size_t)lf.pos;
    if (n > max)
        return -AGW_ETOOBIG;
    evbuffer_remove(in, line, n + 1);
    if (n > 0 && line[n - 1] == '\r')
        n--;
    line[n] = '\0';
    return (int)n;
}

static int parse_chunk_size(const char *line, uint64_t *size)
{
    uint64_t n = 0;
    const char *c = line;
    bool any = false;

    for (; *c; c++) {
        int d;
        if (*c >= '0' && *c <= '9')
            d = *c - '0';
        else if (*c >= 'a' && *c <= 'f')
            d = *c - 'a' + 10;
        else if (*c >= 'A' && *c <= 'F')
            d = *c - 'A' + 10;
        else
            break;
        if (n >= MAX_CHUNK_SIZE / 16)
            return -AGW_EPROTO;
        n = n * 16 + (uint64_t)d;
        any = true;
    }
    if (!any)
        return -AGW_EPROTO;
    while (*c == ' ' || *c == '\t')
        c++;
    if (*c != '\0' && *c != ';')
        return -AGW_EPROTO;
    *size = n;
    return 0;
}

static int parse_chunked(struct agw_http1_parser *p, struct evbuffer *in, struct evbuffer *out)
{
    char line[MAX_CHUNK_LINE + 2];
    int n;

    for (;;) {
        switch (p->chunk) {
        case CH_SIZE:
            n = read_line(in, line, MAX_CHUNK_LINE);
            if (n == AGW_AGAIN)
                return 0;
            if (n < 0)
                return n;
            if (parse_chunk_size(line, &p->remaining) != 0)
                return -AGW_EPROTO;
            p->chunk = p->remaining == 0 ? CH_TRAILERS : CH_DATA;
            break;
        case CH_DATA: {
            size_t avail = evbuffer_get_length(in);
            size_t take = avail < p->remaining ? avail : (size_t)p->remaining;
            if (take == 0)
                return 0;
            evbuffer_remove_buffer(in, out, take);
            p->remaining -= take;
            if (p->remaining == 0)
                p->chunk = CH_DATA_END;
            break;
        }
        case CH_DATA_END:
            n = read_line(in, line, 2);
            if (n == AGW_AGAIN) {
                /* Anything but CR or LF here is a framing error: do not wait for more to say so. */
                size_t avail = evbuffer_get_length(in);
                if (avail > 0) {
                    char c;
                    evbuffer_copyout(in, &c, 1);
                    if (c != '\r' && c != '\n')
                        return -AGW_EPROTO;
                }
                return 0;
            }
            if (n != 0)
                return -AGW_EPROTO;
            p->chunk = CH_SIZE;
            break;
        case CH_TRAILERS:
            n = read_line(in, line, MAX_CHUNK_LINE);
            if (n == AGW_AGAIN)
                return evbuffer_get_length(in) + p->trailer_bytes > p->max_head ? -AGW_ETOOBIG : 0;
            if (n < 0)
                return n;
            p->trailer_bytes += (size_t)n + 2;
            if (p->trailer_bytes > p->max_head)
                return -AGW_ETOOBIG;
            if (n == 0) {
                p->chunk = CH_DONE;
                p->done = true;
                return 1;
            }
            break;
        case CH_DONE:
            return 1;
        }
    }
}

int agw_http1_parse_body(struct agw_http1_parser *p, struct evbuffer *in, struct evbuffer *out)
{
    if (p->done)
        return 1;
    switch (p->body) {
    case AGW_HTTP1_BODY_NONE:
        p->done = true;
        return 1;
    case AGW_HTTP1_BODY_LENGTH: {
        size_t avail = evbuffer_get_length(in);
        size_t take = avail < p->remaining ? avail : (size_t)p->remaining;
        if (take > 0)
            evbuffer_remove_buffer(in, out, take);
        p->remaining -= take;
        if (p->remaining == 0)
            p->done = true;
        return p->done ? 1 : 0;
    }
    case AGW_HTTP1_BODY_CHUNKED:
        return parse_chunked(p, in, out);
    case AGW_HTTP1_BODY_CLOSE:
        evbuffer_add_buffer(out, in);
        return 0;
    }
    return -AGW_EPROTO;
}

int agw_http1_parse_eof(struct agw_http1_parser *p)
{
    if (p->done || p->body == AGW_HTTP1_BODY_CLOSE || p->body == AGW_HTTP1_BODY_NONE)
        return 1;
    return -AGW_EPROTO;
}
