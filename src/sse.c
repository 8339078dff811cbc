/* Server-Sent Events: the incremental parser for upstream streams and the writer for client streams
 * (doc/internals/sse.md).
 *
 * The parser never holds a partial line. It is a small state machine over the bytes of the current
 * line (field name, then value), and each value byte goes straight to where it belongs: data bytes
 * into the frame's data buffer (the only copy of the payload), "event"/"id" bytes into their small
 * buffers, comment, unknown-field and "retry" bytes nowhere. So a frame split across reads at any
 * byte costs no more than a frame read whole, and memory stays bounded by <max_frame> whatever the
 * peer sends: every consumed byte is counted against the limit before anything is stored, and no
 * buffer grows past max_frame + 1 bytes. Lines are
 * found with memchr() over the contiguous segments of the input (evbuffer_peek(), no pullup); the
 * per-byte work is done by libc's vectorised scans. */
#include "config.h"

#include <assert.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "agw/sse.h"

#define BUF_MIN      256   /* first allocation of a growable buffer */
#define BUF_KEEP_MAX 65536 /* a buffer grown past this is released when its frame ends */
#define NAME_KEEP    5 /* longest field name acted on ("event", "retry"); longer ones are unknown */
#define PEEK_VECS    16 /* evbuffer segments examined per evbuffer_peek() */
#define BOM_LEN      3
#define BOM_DONE     BOM_LEN /* p->bom: the stream start has been decided (BOM skipped or absent) */

static const char bom_bytes[BOM_LEN] = {'\xEF', '\xBB', '\xBF'};

/* Where the current line is. A line starts in LINE_NAME with name_len 0; a line end seen in that
 * state with nothing read is a blank line. */
enum line_state {
    LINE_NAME,        /* reading the field name (up to the first ':') */
    LINE_VALUE_START, /* the ':' was read: one leading space may still be stripped */
    LINE_VALUE,       /* reading the field value */
};

enum field {
    FIELD_IGNORE, /* comment (":...") or unknown field: bytes are counted, not kept */
    FIELD_DATA,
    FIELD_EVENT,
    FIELD_ID,
    FIELD_RETRY,
};

/* A CR ended the last line and was the last byte available: an LF at the start of the next input
 * belongs to the same line end. */
enum cr_state {
    CR_NONE,
    CR_IN_FRAME,    /* the CR ended a field line: the LF is one more byte of the frame */
    CR_AFTER_BLANK, /* the CR ended a blank line: the frame is gone, the LF is skipped uncounted */
};

struct buf {
    char *p;    /* NULL until the first byte */
    size_t len; /* bytes used */
    size_t cap; /* 0, or > len: there is always room for the terminating NUL */
};

struct agw_sse_parser {
    size_t max_frame;   /* 0 = no limit */
    size_t frame_bytes; /* input bytes of the current frame consumed so far (saturating) */
    int err;            /* 0, or the negative code that stopped the parser (sticky) */
    unsigned bom;       /* bytes of a leading BOM matched so far; BOM_DONE once decided */
    enum cr_state cr;
    enum line_state line;
    enum field field; /* valid in LINE_VALUE_START / LINE_VALUE */
    size_t name_len;  /* bytes of the field name read so far (only the first NAME_KEEP are kept) */
    char name[NAME_KEEP];
    bool in_cb;  /* inside the frame callback: re-entering the parser is a bug */
    bool stable; /* the input outlives the parse call (agw_sse_parse_bytes()): frames may be framed
                  */

    /* The frame being assembled. */
    bool has_data;   /* at least one data line: the frame will be dispatched */
    bool has_event;  /* an "event" line was seen */
    bool has_id;     /* an "id" line without NUL was seen */
    long retry;      /* last valid "retry" value, or -1 */
    struct buf data; /* data lines joined with "\n" */
    struct buf event;
    struct buf id;

    /* The "id" / "retry" line being read: committed at its line end only if valid. */
    struct buf id_next;
    bool id_nul;      /* the id line holds a NUL: ignore it */
    bool retry_ok;    /* only digits so far, no overflow */
    bool retry_digit; /* at least one digit */
    long retry_next;
};

/* Makes room for <extra> more bytes plus a NUL. Doubles, but never beyond <limit> once the need
 * fits under it (so a buffer capped by max_frame is at most max_frame + 1 bytes). */
static void buf_reserve(struct buf *b, size_t extra, size_t limit)
{
    size_t need = b->len + extra + 1;
    size_t cap;

    if (need <= b->cap)
        return;
    cap = b->cap ? b->cap : BUF_MIN;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    if (cap > limit && need <= limit)
        cap = limit;
    b->p = agw_xrealloc(b->p, cap);
    b->cap = cap;
}

static void buf_append(struct buf *b, const char *s, size_t n, size_t limit)
{
    if (n == 0)
        return;
    buf_reserve(b, n, limit);
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

/* Empties <b>; a buffer that grew large for one big frame is released instead of kept for the
 * stream's lifetime. */
static void buf_reset(struct buf *b)
{
    b->len = 0;
    if (b->cap > BUF_KEEP_MAX) {
        free(b->p);
        b->p = NULL;
        b->cap = 0;
    }
}

static void buf_free(struct buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static const char *buf_cstr(struct buf *b)
{
    if (b->p == NULL)
        return "";
    b->p[b->len] = '\0';
    return b->p;
}

static size_t buf_limit(const struct agw_sse_parser *p)
{
    return p->max_frame > 0 && p->max_frame < SIZE_MAX ? p->max_frame + 1 : SIZE_MAX;
}

/* Counts <n> more input bytes against the frame. Called before the bytes are stored anywhere. */
static int count(struct agw_sse_parser *p, size_t n)
{
    p->frame_bytes = n > SIZE_MAX - p->frame_bytes ? SIZE_MAX : p->frame_bytes + n;
    if (p->max_frame > 0 && p->frame_bytes > p->max_frame)
        return -AGW_ETOOBIG;
    return 0;
}

static void reset_frame(struct agw_sse_parser *p)
{
    p->frame_bytes = 0;
    p->has_data = false;
    p->has_event = false;
    p->has_id = false;
    p->retry = -1;
    buf_reset(&p->data);
    buf_reset(&p->event);
    buf_reset(&p->id);
    buf_reset(&p->id_next);
}

static enum field classify(const struct agw_sse_parser *p)
{
    /* Field names are case-sensitive. */
    switch (p->name_len) {
    case 0:
        return FIELD_IGNORE; /* ":comment" */
    case 2:
        return memcmp(p->name, "id", 2) == 0 ? FIELD_ID : FIELD_IGNORE;
    case 4:
        return memcmp(p->name, "data", 4) == 0 ? FIELD_DATA : FIELD_IGNORE;
    case 5:
        if (memcmp(p->name, "event", 5) == 0)
            return FIELD_EVENT;
        return memcmp(p->name, "retry", 5) == 0 ? FIELD_RETRY : FIELD_IGNORE;
    default:
        return FIELD_IGNORE;
    }
}

/* The field name is complete (at its ':' or at the line end). */
static void field_start(struct agw_sse_parser *p)
{
    p->field = classify(p);
    switch (p->field) {
    case FIELD_DATA:
        if (p->has_data)
            buf_append(&p->data, "\n", 1, buf_limit(p));
        p->has_data = true;
        break;
    case FIELD_EVENT:
        p->event.len = 0;
        p->has_event = true;
        break;
    case FIELD_ID:
        p->id_next.len = 0;
        p->id_nul = false;
        break;
    case FIELD_RETRY:
        p->retry_next = 0;
        p->retry_ok = true;
        p->retry_digit = false;
        break;
    case FIELD_IGNORE:
        break;
    }
}

/* <n> more bytes of the current field's value (no line end among them). */
static void field_value(struct agw_sse_parser *p, const char *s, size_t n)
{
    switch (p->field) {
    case FIELD_DATA:
        buf_append(&p->data, s, n, buf_limit(p));
        break;
    case FIELD_EVENT:
        buf_append(&p->event, s, n, buf_limit(p));
        break;
    case FIELD_ID:
        if (p->id_nul)
            break;
        if (memchr(s, '\0', n) != NULL)
            p->id_nul = true;
        else
            buf_append(&p->id_next, s, n, buf_limit(p));
        break;
    case FIELD_RETRY:
        for (size_t i = 0; i < n && p->retry_ok; i++) {
            long d = s[i] - '0';

            if (d < 0 || d > 9 || p->retry_next > (LONG_MAX - d) / 10) {
                p->retry_ok = false;
                break;
            }
            p->retry_next = p->retry_next * 10 + d;
            p->retry_digit = true;
        }
        break;
    case FIELD_IGNORE:
        break;
    }
}

/* The current field line ended: commit what is only valid once complete. */
static void field_end(struct agw_sse_parser *p)
{
    if (p->field == FIELD_ID && !p->id_nul) {
        struct buf t = p->id;

        p->id = p->id_next;
        p->id_next = t;
        p->has_id = true;
    } else if (p->field == FIELD_RETRY && p->retry_ok && p->retry_digit) {
        p->retry = p->retry_next;
    }
}

/* <n> bytes of the current line, none of them a line end. */
static void line_bytes(struct agw_sse_parser *p, const char *s, size_t n)
{
    if (n == 0)
        return;
    if (p->line == LINE_NAME) {
        const char *colon = memchr(s, ':', n);
        size_t k = colon != NULL ? (size_t)(colon - s) : n;

        if (p->name_len < NAME_KEEP) {
            size_t room = NAME_KEEP - p->name_len;

            memcpy(p->name + p->name_len, s, k < room ? k : room);
        }
        p->name_len = k > SIZE_MAX - p->name_len ? SIZE_MAX : p->name_len + k;
        if (colon == NULL)
            return;
        field_start(p);
        p->line = LINE_VALUE_START;
        s += k + 1;
        n -= k + 1;
        if (n == 0)
            return;
    }
    if (p->line == LINE_VALUE_START) {
        p->line = LINE_VALUE;
        if (*s == ' ') {
            s++;
            n--;
        }
    }
    field_value(p, s, n);
}

static bool line_empty(const struct agw_sse_parser *p)
{
    return p->line == LINE_NAME && p->name_len == 0;
}

/* A non-blank line ended (or the input ended inside it). */
static void line_end(struct agw_sse_parser *p)
{
    if (p->line == LINE_NAME)
        field_start(p); /* a field name without ':' has an empty value */
    field_end(p);
    p->line = LINE_NAME;
    p->name_len = 0;
}

static int call(struct agw_sse_parser *p, struct agw_sse_frame *f, agw_sse_frame_fn *cb, void *arg)
{
    int rc;

    p->in_cb = true;
    rc = cb(arg, f);
    p->in_cb = false;
    return rc < 0 ? rc : 1;
}

/* Returns 1 once the callback accepted the frame, or the callback's negative value. */
static int dispatch(struct agw_sse_parser *p, agw_sse_frame_fn *cb, void *arg)
{
    struct agw_sse_frame f;

    f.data = buf_cstr(&p->data);
    f.data_len = p->data.len;
    f.event = p->has_event ? buf_cstr(&p->event) : NULL;
    f.id = p->has_id ? buf_cstr(&p->id) : NULL;
    f.retry = p->retry;
    f.framed = false;
    return call(p, &f, cb, arg);
}

/* At a frame's first byte, with nothing pending. */
static bool frame_start(const struct agw_sse_parser *p)
{
    return p->frame_bytes == 0 && p->line == LINE_NAME && p->name_len == 0 && !p->has_data;
}

/* The common frame, "data:[ ]<payload>\n\n" whole in one input segment from <s> (its LF at <e>),
 * is dispatched from the input itself: no copy, no line states. Counted as the line-by-line path
 * counts it. Returns 1, or a negative code. */
static int fast_frame(struct agw_sse_parser *p, const char *s, const char *e, agw_sse_frame_fn *cb,
                      void *arg)
{
    const char *v = s + 5;
    struct agw_sse_frame f = {.event = NULL, .id = NULL, .retry = -1};
    int rc;

    if ((rc = count(p, (size_t)(e - s) + 2)) < 0)
        return rc;
    if (v < e && *v == ' ')
        v++;
    f.data = v;
    f.data_len = (size_t)(e - v);
    f.framed = p->stable && v == s + 6;
    rc = call(p, &f, cb, arg);
    p->frame_bytes = 0;
    return rc;
}

/* A blank line: dispatches the frame if it has data, then starts a new one. Returns 0, 1 or < 0. */
static int blank_line(struct agw_sse_parser *p, agw_sse_frame_fn *cb, void *arg)
{
    int rc = 0;

    if (p->has_data)
        rc = dispatch(p, cb, arg);
    reset_frame(p);
    return rc;
}

static void add_frame(int *nframes)
{
    if (*nframes < INT_MAX)
        (*nframes)++;
}

static const char *find_cr(const char *s, const char *end)
{
    const char *cr = memchr(s, '\r', (size_t)(end - s));

    return cr != NULL ? cr : end;
}

/* Consumes <n> bytes at <s> (past the BOM decision). Adds the frames dispatched to *<nframes>.
 * Returns 0 or a negative code. */
static int scan(struct agw_sse_parser *p, const char *s, size_t n, agw_sse_frame_fn *cb, void *arg,
                int *nframes)
{
    const char *end = s + n;
    const char *cr;
    int rc;

    if (n == 0)
        return 0;
    if (p->cr != CR_NONE) {
        enum cr_state was = p->cr;

        p->cr = CR_NONE;
        if (*s == '\n') {
            s++;
            if (was == CR_IN_FRAME && (rc = count(p, 1)) < 0)
                return rc;
        }
    }
    /* <cr>: the first CR at or after <s>, or <end>. On an LF stream this scan runs once per
     * segment; on CR or CRLF streams once per line, over that line only. The LF search is bounded
     * by it. */
    cr = find_cr(s, end);
    while (s < end) {
        const char *e = memchr(s, '\n', (size_t)(cr - s));
        const char *next;
        size_t len;
        bool blank;

        if (e == NULL)
            e = cr;
        if (e < cr && e + 1 < end && e[1] == '\n' && e - s >= 5 && memcmp(s, "data:", 5) == 0 &&
            frame_start(p)) {
            if ((rc = fast_frame(p, s, e, cb, arg)) < 0)
                return rc;
            add_frame(nframes);
            s = e + 2;
            continue;
        }
        if (e == end) {
            /* A partial line: counted now, so a line that never ends fails once past the limit. */
            if ((rc = count(p, (size_t)(end - s))) < 0)
                return rc;
            line_bytes(p, s, (size_t)(end - s));
            return 0;
        }
        len = (size_t)(e - s);
        blank = len == 0 && line_empty(p);
        next = e + 1;
        if (*e == '\r') {
            if (next == end)
                p->cr = blank ? CR_AFTER_BLANK : CR_IN_FRAME;
            else if (*next == '\n')
                next++;
        }
        /* The line end of a blank line counts one byte, whatever its form: a CRLF's LF may only
         * arrive with the next read, after the frame was dispatched (see doc/internals/sse.md). */
        if ((rc = count(p, blank ? 1 : (size_t)(next - s))) < 0)
            return rc;
        if (blank) {
            if ((rc = blank_line(p, cb, arg)) < 0)
                return rc;
            if (rc > 0)
                add_frame(nframes);
        } else {
            line_bytes(p, s, len);
            line_end(p);
        }
        if (*e == '\r')
            cr = find_cr(next, end);
        s = next;
    }
    return 0;
}

/* Skips a leading UTF-8 BOM (possibly split across reads), then scans. */
static int feed(struct agw_sse_parser *p, const char *s, size_t n, agw_sse_frame_fn *cb, void *arg,
                int *nframes)
{
    if (p->bom < BOM_DONE) {
        unsigned matched;
        int rc;

        while (n > 0 && p->bom < BOM_LEN && *s == bom_bytes[p->bom]) {
            p->bom++;
            s++;
            n--;
        }
        if (p->bom < BOM_DONE && n > 0) {
            /* Not a BOM after all: its matched prefix is ordinary input. */
            matched = p->bom;
            p->bom = BOM_DONE;
            if ((rc = scan(p, bom_bytes, matched, cb, arg, nframes)) < 0)
                return rc;
        }
    }
    return scan(p, s, n, cb, arg, nframes);
}

struct agw_sse_parser *agw_sse_parser_new(size_t max_frame)
{
    struct agw_sse_parser *p = agw_xcalloc(1, sizeof(*p));

    p->max_frame = max_frame;
    p->retry = -1;
    return p;
}

void agw_sse_parser_free(struct agw_sse_parser *p)
{
    if (p == NULL)
        return;
    assert(!p->in_cb);
    buf_free(&p->data);
    buf_free(&p->event);
    buf_free(&p->id);
    buf_free(&p->id_next);
    free(p);
}

int agw_sse_parse(struct agw_sse_parser *p, struct evbuffer *in, agw_sse_frame_fn *cb, void *arg)
{
    struct evbuffer_iovec vec[PEEK_VECS];
    int nframes = 0;
    int rc = p->err;

    assert(in != NULL && cb != NULL && !p->in_cb);
    p->stable = false;
    while (rc == 0 && evbuffer_get_length(in) > 0) {
        int nvec = evbuffer_peek(in, -1, NULL, vec, PEEK_VECS);
        size_t used = 0;

        if (nvec <= 0)
            break;
        if (nvec > PEEK_VECS)
            nvec = PEEK_VECS;
        for (int i = 0; i < nvec && rc == 0; i++) {
            rc = feed(p, vec[i].iov_base, vec[i].iov_len, cb, arg, &nframes);
            used += vec[i].iov_len;
        }
        evbuffer_drain(in, used);
    }
    if (rc < 0) {
        /* The parser is finished: what follows the failure has no meaning any more. */
        evbuffer_drain(in, evbuffer_get_length(in));
        p->err = rc;
        return rc;
    }
    return nframes;
}

int agw_sse_parse_bytes(struct agw_sse_parser *p, const char *buf, size_t len, agw_sse_frame_fn *cb,
                        void *arg)
{
    int nframes = 0;
    int rc;

    assert((buf != NULL || len == 0) && cb != NULL && !p->in_cb);
    if (p->err < 0)
        return p->err;
    if (len == 0)
        return 0;
    p->stable = true;
    if ((rc = feed(p, buf, len, cb, arg, &nframes)) < 0) {
        p->err = rc;
        return rc;
    }
    return nframes;
}

int agw_sse_finish(struct agw_sse_parser *p, agw_sse_frame_fn *cb, void *arg)
{
    int nframes = 0;
    int rc = 0;

    assert(cb != NULL && !p->in_cb);
    if (p->err < 0)
        return p->err;
    if (p->bom > 0 && p->bom < BOM_DONE) {
        unsigned matched = p->bom;

        p->bom = BOM_DONE;
        if ((rc = scan(p, bom_bytes, matched, cb, arg, &nframes)) < 0)
            goto out;
    }
    if (!line_empty(p))
        line_end(p); /* the unterminated last line counts as complete */
    if (p->has_data && (rc = dispatch(p, cb, arg)) > 0)
        nframes = 1;
    /* Back to the state of a fresh parser: the next byte starts a new stream. */
    reset_frame(p);
    p->bom = 0;
    p->cr = CR_NONE;
    p->line = LINE_NAME;
    p->name_len = 0;
out:
    if (rc < 0) {
        p->err = rc;
        return rc;
    }
    return nframes;
}

bool agw_sse_pending(const struct agw_sse_parser *p)
{
    return p->frame_bytes > 0 || (p->bom > 0 && p->bom < BOM_DONE);
}

/* Appends <prefix> <s> "\n\n" as one contiguous reservation: the payload is copied once. */
static int write_record(struct evbuffer *out, const char *prefix, size_t plen, const char *s,
                        size_t n)
{
    struct evbuffer_iovec v;
    char *w;

    /* <s> holds no line break (the callers' contract, see sse.h): not re-checked here, this runs
     * once per relayed event. */
    assert(out != NULL && (s != NULL || n == 0));
    if (n > (size_t)EV_SSIZE_MAX - plen - 2)
        return -AGW_ETOOBIG;
    if (evbuffer_reserve_space(out, (ev_ssize_t)(plen + n + 2), &v, 1) < 1)
        return -AGW_ENOMEM;
    w = v.iov_base;
    memcpy(w, prefix, plen);
    if (n > 0)
        memcpy(w + plen, s, n);
    memcpy(w + plen + n, "\n\n", 2);
    v.iov_len = plen + n + 2;
    if (evbuffer_commit_space(out, &v, 1) < 0)
        return -AGW_ENOMEM;
    return 0;
}

int agw_sse_write_data(struct evbuffer *out, const char *data, size_t len)
{
    return write_record(out, "data: ", 6, data, len);
}

int agw_sse_write_comment(struct evbuffer *out, const char *text)
{
    assert(text != NULL);
    return write_record(out, ": ", 2, text, strlen(text));
}
