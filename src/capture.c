/* A run's events for thread history: a one-pass scan of each event's top-level members, no JSON
 * values built (include/agw/capture.h, doc/internals/history.md#capture). */
#include "config.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "agw/capture.h"
#include "agw/jscan.h"
#include "agw/mem.h"

/* Nesting the scanner follows below the event's own object; deeper events are kept as they are
 * (jansson's own limit is 2048). */
#define SCAN_MAX_DEPTH 32
enum kind {
    KIND_DROP = 0,
    KIND_KEEP, /* copied byte for byte */
    KIND_TEXT, /* TEXT_MESSAGE_CONTENT, REASONING_MESSAGE_CONTENT: coalesced by messageId */
    KIND_ARGS, /* TOOL_CALL_ARGS: coalesced by toolCallId */
    KIND_RUN,  /* RUN_STARTED: copied byte for byte when it has an "input" member, else dropped */
};

/* Ids of open coalesced events up to this length (quotes included) are kept in the capture
 * itself: UUIDs are 38; the struct stays in jemalloc's 112-byte class. */
#define CAPTURE_ID_COPY 40

struct agw_capture {
    char *buf;       /* JSON Lines; an open coalesced event at the end, without its '"}\n' */
    size_t len, cap; /* bytes used and allocated in buf */
    agw_capture_chunk_fn *chunk; /* where chunks come from (agw_capture_use_chunks()), or NULL */
    void *chunk_arg;
    bool buf_is_chunk; /* buf is a chunk: cap == AGW_CAPTURE_CHUNK_BYTES, from chunk() */
    bool was_chunk;    /* the last buffer taken was a chunk: the next one starts as a chunk */
    enum kind open;    /* KIND_TEXT or KIND_ARGS while a coalesced event is open; else KIND_DROP */
    size_t id_at, id_len; /* the open event's id token (quotes included) at buf + id_at */
    /* The id token again when it fits, so that the next delta's is compared here: in the buffer
     * it lies where the open event began, a line no longer in the CPU's cache on a paced stream. */
    char id[CAPTURE_ID_COPY];
};

/* One top-level member of an event: its value's bytes (a string's with its quotes). */
struct member {
    const char *p; /* NULL: absent */
    size_t n;
    bool string;  /* the value is a string */
    bool escaped; /* a string holding a backslash escape */
};

struct event {
    struct member type, message_id, tool_call_id, delta, role, input, name, subagent_run_id,
        metadata;
};

/* ---- reading events: the scanner (include/agw/jscan.h) ------------------------------------ */

static bool span_is(const char *p, size_t n, const char *name, size_t name_len)
{
    return n == name_len && memcmp(p, name, n) == 0;
}

/* The member of <ev> a key (its bytes between the quotes) names, or NULL. */
static struct member *member_of(struct event *ev, const char *k, size_t n)
{
    if (span_is(k, n, "type", 4))
        return &ev->type;
    if (span_is(k, n, "messageId", 9))
        return &ev->message_id;
    if (span_is(k, n, "toolCallId", 10))
        return &ev->tool_call_id;
    if (span_is(k, n, "delta", 5))
        return &ev->delta;
    if (span_is(k, n, "role", 4))
        return &ev->role;
    if (span_is(k, n, "input", 5))
        return &ev->input;
    if (span_is(k, n, "name", 4))
        return &ev->name;
    if (span_is(k, n, "subagentRunId", 13))
        return &ev->subagent_run_id;
    if (span_is(k, n, "metadata", 8))
        return &ev->metadata;
    return NULL;
}

/* Reads <json> as one JSON object and finds its top-level members of interest. False when the
 * event is not one jansson would read as the scanner does: not valid JSON (or past the limits
 * above), not an object, an escaped key (it may spell one of ours), one of ours given twice
 * (jansson keeps the last). Never reads past <len>. */
static bool scan_event(const char *json, size_t len, struct event *ev)
{
    const char *p = json, *end = json + len;

    memset(ev, 0, sizeof(*ev));
    p = agw_jscan_ws(p, end);
    if (p == end || *p++ != '{')
        return false;
    p = agw_jscan_ws(p, end);
    if (p < end && *p == '}')
        return agw_jscan_ws(p + 1, end) == end;
    for (;;) {
        const char *k = p, *v;
        struct member *m;
        bool escaped = false;

        if (p == end || *p != '"' || (p = agw_jscan_string(p, end, &escaped)) == NULL || escaped)
            return false;
        m = member_of(ev, k + 1, (size_t)(p - k) - 2);
        p = agw_jscan_ws(p, end);
        if (p == end || *p++ != ':')
            return false;
        v = p = agw_jscan_ws(p, end);
        if (p < end && *p == '"')
            p = agw_jscan_string(p, end, &escaped);
        else
            p = agw_jscan_value(p, end, SCAN_MAX_DEPTH, false);
        if (p == NULL)
            return false;
        if (m != NULL) {
            if (m->p != NULL)
                return false;
            m->p = v;
            m->n = (size_t)(p - v);
            m->string = *v == '"';
            m->escaped = m->string && escaped;
        }
        p = agw_jscan_ws(p, end);
        if (p == end)
            return false;
        if (*p == '}')
            return agw_jscan_ws(p + 1, end) == end;
        if (*p++ != ',')
            return false;
        p = agw_jscan_ws(p, end);
    }
}

/* What becomes of an event of type <t> (<n> bytes, unescaped). */
static enum kind classify(const char *t, size_t n)
{
    static const struct {
        const char *name;
        size_t len;
        enum kind kind;
    } types[] = {
        {"TEXT_MESSAGE_CONTENT", 20, KIND_TEXT},
        {"TOOL_CALL_ARGS", 14, KIND_ARGS},
        {"TEXT_MESSAGE_START", 18, KIND_KEEP},
        {"TEXT_MESSAGE_END", 16, KIND_KEEP},
        {"TOOL_CALL_START", 15, KIND_KEEP},
        {"TOOL_CALL_END", 13, KIND_KEEP},
        {"TOOL_CALL_RESULT", 16, KIND_KEEP},
        {"MESSAGES_SNAPSHOT", 17, KIND_KEEP},
        /* a reasoning message's deltas do to it what a text's do (append to the content of the
         * message of that id): coalesced into the same lines */
        {"REASONING_MESSAGE_CONTENT", 25, KIND_TEXT},
        {"REASONING_MESSAGE_START", 23, KIND_KEEP},
        {"REASONING_MESSAGE_END", 21, KIND_KEEP},
        {"REASONING_ENCRYPTED_VALUE", 25, KIND_KEEP},
        {"ACTIVITY_SNAPSHOT", 17, KIND_KEEP},
        {"ACTIVITY_DELTA", 14, KIND_KEEP},
        /* the messages of the input it reports: the client adds those it does not hold */
        {"RUN_STARTED", 11, KIND_RUN},
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(types); i++)
        if (span_is(t, n, types[i].name, types[i].len))
            return types[i].kind;
    return KIND_DROP;
}

/* ---- the buffer ------------------------------------------------------------------------------ */

/* The buffer's first size, then its second, then doubled as needed. The first is small: a run that
 * waits (on a model, a tool, a human) keeps what it captured until the relay's age timer takes it,
 * often a message's start and a few deltas. One that outgrows it is streaming: the second holds a
 * short answer whole (a chat turn of 10 deltas is about 1.4 KB here), so a short run makes one
 * realloc() instead of four (256 to 2,048 bytes by doubling). */
#define CAPTURE_FIRST_CAP  256
#define CAPTURE_SECOND_CAP 2048

/* Makes room for <n> more bytes; returns where they go. */
static char *room(struct agw_capture *c, size_t n)
{
    assert(n < SIZE_MAX / 4 &&
           c->len < SIZE_MAX / 4); /* events are bounded by the SSE frame limit */
    if (c->cap - c->len < n && c->chunk != NULL && !c->buf_is_chunk &&
        c->len + n <= AGW_CAPTURE_CHUNK_BYTES &&
        (c->was_chunk || c->len + n > AGW_CAPTURE_SMALL_BYTES)) {
        char *b = c->chunk(c->chunk_arg);

        if (c->len > 0)
            memcpy(b, c->buf, c->len);
        agw_mem_separate_free(c->buf);
        c->buf = b;
        c->cap = AGW_CAPTURE_CHUNK_BYTES;
        c->buf_is_chunk = true;
    }
    if (c->cap - c->len < n) {
        size_t cap = c->cap == 0                   ? CAPTURE_FIRST_CAP
                     : c->cap < CAPTURE_SECOND_CAP ? CAPTURE_SECOND_CAP
                                                   : c->cap;
        char *b;

        c->buf_is_chunk = false; /* a chunk outgrown by an event too big for it */
        while (cap - c->len < n)
            cap *= 2;
        /* Not realloc(): jemalloc's takes its slow path for a block that changes size class
         * (about 1,000 instructions for 256 to 2,048 bytes); this copies what is used. */
        b = agw_mem_separate_alloc(cap);
        if (c->len > 0)
            memcpy(b, c->buf, c->len);
        agw_mem_separate_free(c->buf);
        c->buf = b;
        c->cap = cap;
    }
    return c->buf + c->len;
}

static void put(struct agw_capture *c, const char *p, size_t n)
{
    memcpy(room(c, n), p, n);
    c->len += n;
}

static void close_open(struct agw_capture *c)
{
    if (c->open == KIND_DROP)
        return;
    put(c, "\"}\n", 3);
    c->open = KIND_DROP;
}

/* Copies an event as it is, any raw CR or LF made a tab and a first byte that is the coalesced
 * lines' mark made AGW_CAPTURE_NOT_MARK (see the header), and a '\n'. */
static void keep(struct agw_capture *c, const char *json, size_t len)
{
    char *d;

    close_open(c);
    d = room(c, len + 1);
    memcpy(d, json, len);
    if (len > 0 && d[0] == AGW_CAPTURE_MARK)
        d[0] = AGW_CAPTURE_NOT_MARK;
    if (memchr(d, '\n', len) != NULL || memchr(d, '\r', len) != NULL) /* (rare: memchr is quick) */
        for (size_t i = 0; i < len; i++)
            if (d[i] == '\n' || d[i] == '\r')
                d[i] = '\t';
    d[len] = '\n';
    c->len += len + 1;
}

/* The start of a coalesced line, up to its id: the mark, then the event's JSON. Written by
 * coalesce(), read by line_delta() (the JSON part: from the second byte). */
#define TEXT_LINE "\x1e{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":"
#define ARGS_LINE "\x1e{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":"
_Static_assert(AGW_CAPTURE_MARK == '\x1e', "TEXT_LINE and ARGS_LINE begin with the mark");

/* Appends a content event's delta to the open coalesced event, opening one first unless the open
 * one is of the same kind and id. <id> and <delta> are scanned strings: no raw line break. */
static void coalesce(struct agw_capture *c, enum kind kind, const struct member *id,
                     const struct member *delta)
{
    static const char text[] = TEXT_LINE;
    static const char args[] = ARGS_LINE;

    if (c->open != kind || c->id_len != id->n ||
        memcmp(id->n <= sizeof(c->id) ? c->id : c->buf + c->id_at, id->p, id->n) != 0) {
        close_open(c);
        if (kind == KIND_TEXT)
            put(c, text, sizeof(text) - 1);
        else
            put(c, args, sizeof(args) - 1);
        c->id_at = c->len;
        c->id_len = id->n;
        if (id->n <= sizeof(c->id))
            memcpy(c->id, id->p, id->n);
        put(c, id->p, id->n);
        put(c, ",\"delta\":\"", 10);
        c->open = kind;
    }
    put(c, delta->p + 1, delta->n - 2);
    /* The next delta of a stream goes right after this one, an event later: the lines it will
     * take are asked for now, so that it is not a write into memory the CPU must first read (on a
     * paced stream half the capture's cost was those misses). A hint: nothing is read. */
    if (c->cap - c->len >= 2 * AGW_CACHE_LINE) { /* the two lines after the one written last */
        __builtin_prefetch(c->buf + c->len + AGW_CACHE_LINE - 1, 1);
        __builtin_prefetch(c->buf + c->len + 2 * AGW_CACHE_LINE - 1, 1);
    }
}

/* ---- the interface --------------------------------------------------------------------------- */

/* A capture and its buffers are on the separate heap (include/agw/mem.h): they live while a run
 * streams and go when its stream waits (the relay frees an idle run's capture), while the stream's
 * own objects stay: on the main heap, their pages would keep the holes they leave. */
struct agw_capture *agw_capture_new(void)
{
    struct agw_capture *c = agw_mem_separate_alloc(sizeof(*c));

    memset(c, 0, sizeof(*c));
    return c;
}

void agw_capture_use_chunks(struct agw_capture *c, agw_capture_chunk_fn *get, void *arg)
{
    c->chunk = get;
    c->chunk_arg = arg;
}

void agw_capture_free(struct agw_capture *c)
{
    if (c == NULL)
        return;
    agw_mem_separate_free(c->buf);
    agw_mem_separate_free(c);
}

/* A flat RUN_STARTED (agw_capture_typed()) that may have an "input" member: the name is a key or
 * inside a string, and rare either way, so its absence is all that is checked before a scan. */
static bool may_have_input(const char *json, size_t len)
{
    return memmem(json, len, "\"input\"", 7) != NULL;
}

void agw_capture_event(struct agw_capture *c, const char *json, size_t len)
{
    struct event ev;
    const struct member *id;
    enum kind kind;

    if (!scan_event(json, len, &ev) || !ev.type.string || ev.type.escaped) {
        keep(c, json, len); /* the store's full parse decides */
        return;
    }
    kind = classify(ev.type.p + 1, ev.type.n - 2);
    if (kind == KIND_DROP)
        return; /* makes no message: a coalesced event stays open across it */
    if (kind == KIND_KEEP || (kind == KIND_RUN && ev.input.p != NULL)) {
        keep(c, json, len);
        return;
    }
    if (kind == KIND_RUN)
        return;
    id = kind == KIND_TEXT ? &ev.message_id : &ev.tool_call_id;
    if (!id->string || !ev.delta.string || ev.metadata.p != NULL) {
        /* malformed for history (it says so), or metadata to merge */
        keep(c, json, len);
        return;
    }
    coalesce(c, kind, id, &ev.delta);
}

void agw_capture_typed(struct agw_capture *c, const char *type, size_t type_len, const char *json,
                       size_t len)
{
    switch (classify(type, type_len)) {
    case KIND_DROP:
        return;
    case KIND_KEEP:
        keep(c, json, len);
        return;
    case KIND_RUN:
        if (!may_have_input(json, len))
            return;
        break;
    case KIND_TEXT:
    case KIND_ARGS: /* its id and delta are read by the scan */
        break;
    }
    agw_capture_event(c, json, len);
}

bool agw_capture_keeps_typed(const char *type, size_t type_len, const char *json, size_t len)
{
    switch (classify(type, type_len)) {
    case KIND_DROP:
        return false;
    case KIND_RUN:
        return may_have_input(json, len);
    default:
        return true;
    }
}

static AGW_NOINLINE void content_slow(struct agw_capture *c, enum kind kind, const char *id,
                                      size_t id_len, const char *delta, size_t delta_len)
{
    coalesce(c, kind, &(const struct member){.p = id, .n = id_len, .string = true},
             &(const struct member){.p = delta, .n = delta_len, .string = true});
}

/* Whether the <n> bytes at <a> and <b> are the same, 2 <= n <= CAPTURE_ID_COPY: word by word, the
 * last word overlapping the one before (an id of a stream's next delta is compared here, inline:
 * memcmp() was half of the capture's own instructions per delta). */
static inline bool same_id(const char *a, const char *b, size_t n)
{
    uint64_t x, y, diff = 0;
    uint32_t u, v;
    uint16_t s, t;

    if (n >= 8) {
        for (size_t i = 0; i + 8 < n; i += 8) {
            memcpy(&x, a + i, 8);
            memcpy(&y, b + i, 8);
            diff |= x ^ y;
        }
        memcpy(&x, a + n - 8, 8);
        memcpy(&y, b + n - 8, 8);
        return (diff | (x ^ y)) == 0;
    }
    if (n >= 4) {
        memcpy(&u, a, 4);
        memcpy(&v, b, 4);
        diff = u ^ v;
        memcpy(&u, a + n - 4, 4);
        memcpy(&v, b + n - 4, 4);
        return (diff | (u ^ v)) == 0;
    }
    memcpy(&s, a, 2);
    memcpy(&t, b, 2);
    return s == t && a[n - 1] == b[n - 1];
}

void agw_capture_content(struct agw_capture *c, bool args, const char *id, size_t id_len,
                         const char *delta, size_t delta_len)
{
    const enum kind kind = args ? KIND_ARGS : KIND_TEXT;
    const size_t n = delta_len - 2;

    assert(id_len >= 2 && delta_len >= 2 && id[0] == '"' && delta[0] == '"');
    /* The next delta of the open event, with room for it (nearly every content event of a
     * stream): appended in place, as coalesce() would. Anything else takes coalesce(). */
    if (c->open == kind && c->id_len == id_len && id_len <= sizeof(c->id) &&
        c->cap - c->len >= n + 2 * AGW_CACHE_LINE && same_id(c->id, id, id_len)) {
        char *at = c->buf + c->len;

        memcpy(at, delta + 1, n);
        c->len += n;
        __builtin_prefetch(at + n + AGW_CACHE_LINE - 1, 1);
        __builtin_prefetch(at + n + 2 * AGW_CACHE_LINE - 1, 1);
        return;
    }
    content_slow(c, kind, id, id_len, delta, delta_len);
}

/* A coalesced content line at the start of <line> (<len> bytes): its parts in <d> and its length
 * in *<line_len>; with <whole>, the line must be all of the <len> bytes, else it may be followed by
 * anything (the caller checks for its line break). */
static bool line_delta(const char *line, size_t len, bool whole, struct agw_capture_delta *d,
                       size_t *line_len)
{
    static const char text[] = TEXT_LINE, args[] = ARGS_LINE; /* (compared from the second byte) */
    static const char delta[] = ",\"delta\":";
    const char *p, *q, *end = line + len;
    const bool marked = len > 0 && line[0] == AGW_CAPTURE_MARK;
    const size_t n = len - marked;

    p = line + marked;
    if (n > sizeof(text) - 2 && memcmp(p, text + 1, sizeof(text) - 2) == 0) {
        d->args = false;
        p += sizeof(text) - 2;
    } else if (n > sizeof(args) - 2 && memcmp(p, args + 1, sizeof(args) - 2) == 0) {
        d->args = true;
        p += sizeof(args) - 2;
    } else {
        return false;
    }
    if (*p != '"' || (q = agw_jscan_string(p, end, &d->id_escaped)) == NULL)
        return false;
    d->id = p + 1;
    d->id_len = (size_t)(q - p) - 2;
    if ((size_t)(end - q) < sizeof(delta) - 1 || memcmp(q, delta, sizeof(delta) - 1) != 0)
        return false;
    p = q + sizeof(delta) - 1;
    if (p == end || *p != '"')
        return false;
    if (marked) {
        /* coalesce() wrote it from strings read whole (no raw line break in them): the delta ends
         * where the line does, with its '"}' */
        const char *e = whole ? end : memchr(p, '\n', (size_t)(end - p));

        if (e == NULL)
            e = end;
        if (e - p < 3 || e[-1] != '}' || e[-2] != '"')
            return false;
        q = e - 1;
    } else if ((q = agw_jscan_string(p, end, NULL)) == NULL || q == end || *q != '}' ||
               (whole && q + 1 != end)) {
        return false;
    }
    d->delta = p + 1;
    d->delta_len = (size_t)(q - p) - 2;
    *line_len = (size_t)(q + 1 - line);
    return true;
}

bool agw_capture_line_delta(const char *line, size_t len, struct agw_capture_delta *d)
{
    size_t n;

    return line_delta(line, len, true, d, &n);
}

bool agw_capture_line_delta_at(const char *buf, size_t avail, struct agw_capture_delta *d,
                               size_t *line_len)
{
    return line_delta(buf, avail, false, d, line_len) &&
           (*line_len == avail || buf[*line_len] == '\n');
}

/* A member that is a string written without an escape: its bytes between the quotes in *<p>. */
static bool plain_string(const struct member *m, const char **p, size_t *n)
{
    if (!m->string || m->escaped)
        return false;
    *p = m->p + 1;
    *n = m->n - 2;
    return true;
}

bool agw_capture_input_messages(const char *body, size_t len, agw_capture_message_fn *fn, void *arg)
{
    const char *end = body + len, *k;
    struct agw_jscan top, msgs, msg;
    bool seen = false;
    size_t kn;
    int rc;

    body = agw_jscan_ws(body, end);
    if (body == end || *body != '{' || !agw_jscan_open(&top, body, end, SCAN_MAX_DEPTH, true))
        return false;
    while ((rc = agw_jscan_next(&top, &k, &kn)) == 1) {
        if (!span_is(k, kn, "messages", 8)) {
            if (!agw_jscan_skip(&top))
                return false;
            continue;
        }
        /* not an array: jansson's reading says what it is */
        if (top.p == end || *top.p != '[' || !agw_jscan_enter(&msgs, &top))
            return false;
        seen = true;
        while ((rc = agw_jscan_next(&msgs, NULL, NULL)) == 1) {
            const char *m = msgs.p, *id = NULL;
            size_t id_len = 0;
            bool id_escaped = false;
            if (m == end || *m != '{' || !agw_jscan_enter(&msg, &msgs))
                return false;
            while ((rc = agw_jscan_next(&msg, &k, &kn)) == 1) {
                const char *v = msg.p;
                if (!agw_jscan_skip(&msg))
                    return false;
                if (span_is(k, kn, "id", 2) && *v == '"') {
                    id = v + 1;
                    id_len = (size_t)(msg.p - v) - 2;
                    id_escaped = memchr(id, '\\', id_len) != NULL;
                }
            }
            if (rc < 0 || id == NULL || id_escaped)
                return false;
            agw_jscan_leave(&msgs, &msg);
            if (!fn(arg, m, (size_t)(msgs.p - m), id, id_len))
                return false;
        }
        if (rc < 0)
            return false;
        agw_jscan_leave(&top, &msgs);
    }
    return rc == 0 && seen && agw_jscan_ws(top.p, end) == end;
}

bool agw_capture_line_fields(const char *line, size_t len, struct agw_capture_fields *f)
{
    struct event ev;

    memset(f, 0, sizeof(*f));
    if (!scan_event(line, len, &ev))
        return false;
    f->more = ev.name.p != NULL || ev.subagent_run_id.p != NULL || ev.metadata.p != NULL;
    return plain_string(&ev.type, &f->type, &f->type_len) &&
           (ev.message_id.p == NULL ||
            plain_string(&ev.message_id, &f->message_id, &f->message_id_len)) &&
           (ev.role.p == NULL || plain_string(&ev.role, &f->role, &f->role_len));
}

size_t agw_capture_size(const struct agw_capture *c)
{
    return c->len;
}

const char *agw_capture_lines(struct agw_capture *c, size_t *len)
{
    close_open(c);
    *len = c->len;
    return c->len > 0 ? c->buf : NULL;
}

void agw_capture_clear(struct agw_capture *c)
{
    close_open(c);
    c->len = 0;
}

bool agw_capture_in_chunk(const struct agw_capture *c)
{
    return c->buf_is_chunk;
}

char *agw_capture_take(struct agw_capture *c, size_t *len, bool *chunk)
{
    char *out;

    close_open(c);
    *len = c->len;
    if (chunk != NULL)
        *chunk = false;
    if (c->len == 0)
        return NULL; /* (then there is no buffer: one is only made to hold something) */
    out = c->buf;
    if (chunk != NULL)
        *chunk = c->buf_is_chunk;
    c->was_chunk = c->buf_is_chunk;
    c->buf = NULL;
    c->len = c->cap = 0;
    c->buf_is_chunk = false;
    return out;
}
