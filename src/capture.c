/* A run's events for thread history: a one-pass scan of each event's top-level members, no JSON
 * values built (include/agw/capture.h, doc/internals/history.md#capture). */
#include "config.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "agw/capture.h"

/* Nesting the scanner follows below the event's own object; deeper events are kept as they are
 * (jansson's own limit is 2048). */
#define SCAN_MAX_DEPTH 32
/* Keys of one object the strict reading (a run's input) compares for duplicates; an object with
 * more is left to jansson. */
#define STRICT_MAX_KEYS 64
/* Digits of a number's integer part the scanner accepts: 18 always fit jansson's json_int_t and
 * keep a real far from overflow (jansson refuses both overflows). */
#define SCAN_MAX_INT_DIGITS 18
/* Digits of an exponent: 2 keep a real far from overflow. */
#define SCAN_MAX_EXP_DIGITS 2

enum kind {
    KIND_DROP = 0,
    KIND_KEEP, /* copied byte for byte */
    KIND_TEXT, /* TEXT_MESSAGE_CONTENT: coalesced by messageId */
    KIND_ARGS, /* TOOL_CALL_ARGS: coalesced by toolCallId */
};

struct agw_capture {
    char *buf;       /* JSON Lines; an open coalesced event at the end, without its '"}\n' */
    size_t len, cap; /* bytes used and allocated in buf */
    agw_capture_chunk_fn *chunk; /* where chunks come from (agw_capture_use_chunks()), or NULL */
    void *chunk_arg;
    bool buf_is_chunk; /* buf is a chunk: cap == AGW_CAPTURE_CHUNK_BYTES, from chunk() */
    bool was_chunk;    /* the last buffer taken was a chunk: the next one starts as a chunk */
    enum kind open;    /* KIND_TEXT or KIND_ARGS while a coalesced event is open; else KIND_DROP */
    size_t id_at, id_len; /* the open event's id token (quotes included) at buf + id_at */
};

/* One top-level member of an event: its value's bytes (a string's with its quotes). */
struct member {
    const char *p; /* NULL: absent */
    size_t n;
    bool string;  /* the value is a string */
    bool escaped; /* a string holding a backslash escape */
};

struct event {
    struct member type, message_id, tool_call_id, delta, role;
};

/* ---- the scanner: one valid JSON object, as jansson reads it, or false ----------------------- */

/* Bytes a JSON string holds as they are: printable ASCII but '"' and '\\'. */
static const bool plain[256] = {
    [0x20] = 1,
    [0x21] = 1,
    [0x23 ... 0x5b] = 1,
    [0x5d ... 0x7f] = 1,
};

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* The value of the 4 hex digits at <p> (4 bytes are there), or -1. */
static long hex4(const char *p)
{
    long v = 0;

    for (int i = 0; i < 4; i++) {
        int h = agw_hexval(p[i]);
        if (h < 0)
            return -1;
        v = v << 4 | h;
    }
    return v;
}

#define ONES  0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* The first byte at or after <p> that is not plain (or <e>). Text is mostly plain ASCII: eight
 * bytes are tested at a time, a word with a byte below 0x20, a '"', a '\\' or a byte of 0x80 or
 * more is read byte by byte (the tests below are exact: a byte "below n" test (x - n*ONES) & ~x &
 * HIGHS is nonzero exactly when a byte of x is below n, for n <= 0x80). */
static const unsigned char *skip_plain(const unsigned char *p, const unsigned char *e)
{
#if defined(__SSE2__)
    /* sixteen bytes at a time where there is SSE2 (every x86-64): a '"', a '\\', a control byte
     * or a byte of 0x80 or more (the signed compare with 0x20 catches both) ends the run */
    while (e - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        __m128i special = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
                                                    _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
                                       _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)));
        unsigned mask = (unsigned)_mm_movemask_epi8(special);
        if (mask != 0)
            return p + __builtin_ctz(mask);
        p += 16;
    }
#endif
    while (e - p >= 8) {
        uint64_t x, q, b;
        memcpy(&x, p, 8);
        q = x ^ (0x22 * ONES); /* '"' bytes become 0 */
        b = x ^ (0x5c * ONES); /* '\\' bytes become 0 */
        if ((((x - 0x20 * ONES) & ~x) | ((q - ONES) & ~q) | ((b - ONES) & ~b) | x) & HIGHS)
            break;
        p += 8;
    }
    while (p < e && plain[*p])
        p++;
    return p;
}

/* A string at <p> (its opening quote) that jansson takes with the store's flags: valid UTF-8, no
 * control byte, escapes among \" \\ \/ \b \f \n \r \t \uXXXX, surrogates only in pairs, no \u0000.
 * *<escaped> (may be NULL) tells whether it holds an escape. Returns the byte after the closing
 * quote, or NULL. So the raw bytes between the quotes are whole characters and whole escapes: two
 * such strings concatenated are one such string. */
static const char *scan_string(const char *s, const char *end, bool *escaped)
{
    const unsigned char *p = (const unsigned char *)s + 1, *e = (const unsigned char *)end;
    bool esc = false;

    for (;;) {
        p = skip_plain(p, e);
        if (p == e)
            return NULL;
        if (*p == '"')
            break;
        if (*p == '\\') {
            long v;
            esc = true;
            if (e - p < 2)
                return NULL;
            if (p[1] != 'u') {
                if (strchr("\"\\/bfnrt", p[1]) == NULL || p[1] == '\0')
                    return NULL;
                p += 2;
                continue;
            }
            if (e - p < 6 || (v = hex4((const char *)p + 2)) <= 0 || (v >= 0xdc00 && v <= 0xdfff))
                return NULL; /* short, not hex, \u0000 or a lone low surrogate */
            p += 6;
            if (v >= 0xd800 && v <= 0xdbff) {
                if (e - p < 6 || p[0] != '\\' || p[1] != 'u' ||
                    (v = hex4((const char *)p + 2)) < 0xdc00 || v > 0xdfff)
                    return NULL; /* a high surrogate without its low one */
                p += 6;
            }
            continue;
        }
        if (*p < 0x20)
            return NULL;
        {
            size_t n = agw_utf8_seq(p, e);
            if (n == 0)
                return NULL;
            p += n;
        }
    }
    if (escaped != NULL)
        *escaped = esc;
    return (const char *)p + 1;
}

/* A number jansson takes (-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?), within the limits
 * above. Returns the byte after it, or NULL. */
static const char *scan_number(const char *p, const char *end)
{
    const char *d;

    if (p < end && *p == '-')
        p++;
    d = p;
    if (p < end && *p == '0')
        p++;
    else
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    if (p == d || p - d > SCAN_MAX_INT_DIGITS || (p < end && *p >= '0' && *p <= '9'))
        return NULL; /* no digit, too many, or a leading zero */
    if (p < end && *p == '.') {
        d = ++p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == d)
            return NULL;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        d = p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == d || p - d > SCAN_MAX_EXP_DIGITS)
            return NULL;
    }
    return p;
}

static bool span_is(const char *p, size_t n, const char *name, size_t name_len)
{
    return n == name_len && memcmp(p, name, n) == 0;
}

static const char *scan_value(const char *p, const char *end, unsigned depth, bool strict);

/* The keys of one object, for the strict reading (a key is its bytes between the quotes). */
struct keys {
    const char *p[STRICT_MAX_KEYS];
    size_t n[STRICT_MAX_KEYS];
    size_t count;
};

/* A key at <p> (its opening quote). Strictly (<keys> not NULL), as jansson reads it with
 * JSON_REJECT_DUPLICATES: written without an escape (an escaped key may spell another) and not one
 * of <keys>, which it joins; past STRICT_MAX_KEYS keys the scanner gives up. Returns the byte after
 * its closing quote, or NULL. */
static const char *scan_key(const char *p, const char *end, struct keys *keys)
{
    const char *k = p + 1;
    bool escaped = false;
    size_t n;

    if (p == end || *p != '"' || (p = scan_string(p, end, &escaped)) == NULL)
        return NULL;
    if (keys == NULL)
        return p;
    n = (size_t)(p - k) - 1;
    if (escaped || keys->count == STRICT_MAX_KEYS)
        return NULL;
    for (size_t i = 0; i < keys->count; i++)
        if (keys->n[i] == n && memcmp(keys->p[i], k, n) == 0)
            return NULL;
    keys->p[keys->count] = k;
    keys->n[keys->count++] = n;
    return p;
}

/* The members of an object after its '{', <depth> levels still allowed below it; with <keys>
 * (empty) the strict reading (scan_key()), where the value of its "id" member goes to <id> (when
 * not NULL; p NULL: none). Returns the byte after its '}', or NULL. */
static const char *scan_members(const char *p, const char *end, unsigned depth, struct keys *keys,
                                struct member *id)
{
    p = skip_ws(p, end);
    if (p < end && *p == '}')
        return p + 1;
    for (;;) {
        const char *v;
        if ((p = scan_key(p, end, keys)) == NULL)
            return NULL;
        p = skip_ws(p, end);
        if (p == end || *p++ != ':')
            return NULL;
        v = p = skip_ws(p, end);
        if ((p = scan_value(p, end, depth, keys != NULL)) == NULL)
            return NULL;
        if (id != NULL && span_is(keys->p[keys->count - 1], keys->n[keys->count - 1], "id", 2)) {
            id->p = v;
            id->n = (size_t)(p - v);
            id->string = *v == '"';
            id->escaped = id->string && memchr(v, '\\', id->n) != NULL;
        }
        p = skip_ws(p, end);
        if (p == end)
            return NULL;
        if (*p == '}')
            return p + 1;
        if (*p++ != ',')
            return NULL;
        p = skip_ws(p, end);
    }
}

/* An object after its '{': scan_members(), strictly (with the room for its keys, which only the
 * strict reading needs) or not. */
static const char *scan_object(const char *p, const char *end, unsigned depth, bool strict,
                               struct member *id)
{
    struct keys keys;

    assert(id == NULL || strict);
    if (!strict)
        return scan_members(p, end, depth, NULL, NULL);
    keys.count = 0;
    return scan_members(p, end, depth, &keys, id);
}

/* The elements of an array after its '['. Returns the byte after its ']', or NULL. */
static const char *scan_array(const char *p, const char *end, unsigned depth, bool strict)
{
    p = skip_ws(p, end);
    if (p < end && *p == ']')
        return p + 1;
    for (;;) {
        if ((p = scan_value(p, end, depth, strict)) == NULL)
            return NULL;
        p = skip_ws(p, end);
        if (p == end)
            return NULL;
        if (*p == ']')
            return p + 1;
        if (*p++ != ',')
            return NULL;
        p = skip_ws(p, end);
    }
}

/* Any value at <p> (no whitespace before it). Returns the byte after it, or NULL. */
static const char *scan_value(const char *p, const char *end, unsigned depth, bool strict)
{
    if (p == end)
        return NULL;
    switch (*p) {
    case '"':
        return scan_string(p, end, NULL);
    case '{':
        return depth > 0 ? scan_object(p + 1, end, depth - 1, strict, NULL) : NULL;
    case '[':
        return depth > 0 ? scan_array(p + 1, end, depth - 1, strict) : NULL;
    case 't':
        return end - p >= 4 && memcmp(p, "true", 4) == 0 ? p + 4 : NULL;
    case 'f':
        return end - p >= 5 && memcmp(p, "false", 5) == 0 ? p + 5 : NULL;
    case 'n':
        return end - p >= 4 && memcmp(p, "null", 4) == 0 ? p + 4 : NULL;
    default:
        return scan_number(p, end);
    }
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
    p = skip_ws(p, end);
    if (p == end || *p++ != '{')
        return false;
    p = skip_ws(p, end);
    if (p < end && *p == '}')
        return skip_ws(p + 1, end) == end;
    for (;;) {
        const char *k = p, *v;
        struct member *m;
        bool escaped = false;

        if (p == end || *p != '"' || (p = scan_string(p, end, &escaped)) == NULL || escaped)
            return false;
        m = member_of(ev, k + 1, (size_t)(p - k) - 2);
        p = skip_ws(p, end);
        if (p == end || *p++ != ':')
            return false;
        v = p = skip_ws(p, end);
        if (p < end && *p == '"')
            p = scan_string(p, end, &escaped);
        else
            p = scan_value(p, end, SCAN_MAX_DEPTH, false);
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
        p = skip_ws(p, end);
        if (p == end)
            return false;
        if (*p == '}')
            return skip_ws(p + 1, end) == end;
        if (*p++ != ',')
            return false;
        p = skip_ws(p, end);
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
        {"TEXT_MESSAGE_CONTENT", 20, KIND_TEXT}, {"TOOL_CALL_ARGS", 14, KIND_ARGS},
        {"TEXT_MESSAGE_START", 18, KIND_KEEP},   {"TEXT_MESSAGE_END", 16, KIND_KEEP},
        {"TOOL_CALL_START", 15, KIND_KEEP},      {"TOOL_CALL_END", 13, KIND_KEEP},
        {"TOOL_CALL_RESULT", 16, KIND_KEEP},     {"MESSAGES_SNAPSHOT", 17, KIND_KEEP},
        {"TEXT_MESSAGE_CHUNK", 18, KIND_KEEP},   {"TOOL_CALL_CHUNK", 15, KIND_KEEP},
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(types); i++)
        if (span_is(t, n, types[i].name, types[i].len))
            return types[i].kind;
    return KIND_DROP;
}

/* ---- the buffer ------------------------------------------------------------------------------ */

/* The buffer's first size, doubled as needed. Small: a run that waits (on a model, a tool, a human)
 * keeps what it captured so far for as long as it waits, often a message's start and a few deltas;
 * a long run's doublings are a handful of realloc() calls. */
#define CAPTURE_FIRST_CAP 256

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
        free(c->buf);
        c->buf = b;
        c->cap = AGW_CAPTURE_CHUNK_BYTES;
        c->buf_is_chunk = true;
    }
    if (c->cap - c->len < n) {
        size_t cap = c->cap > 0 ? c->cap : CAPTURE_FIRST_CAP;
        c->buf_is_chunk = false; /* a chunk outgrown by an event too big for it */
        while (cap - c->len < n)
            cap *= 2;
        c->buf = agw_xrealloc(c->buf, cap);
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

/* Copies an event as it is, any raw CR or LF made a tab (see the header), and a '\n'. */
static void keep(struct agw_capture *c, const char *json, size_t len)
{
    char *d;

    close_open(c);
    d = room(c, len + 1);
    memcpy(d, json, len);
    for (size_t i = 0; i < len; i++)
        if (d[i] == '\n' || d[i] == '\r')
            d[i] = '\t';
    d[len] = '\n';
    c->len += len + 1;
}

/* Appends a content event's delta to the open coalesced event, opening one first unless the open
 * one is of the same kind and id. <id> and <delta> are scanned strings: no raw line break. */
static void coalesce(struct agw_capture *c, enum kind kind, const struct member *id,
                     const struct member *delta)
{
    static const char text[] = "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":";
    static const char args[] = "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":";

    if (c->open != kind || c->id_len != id->n || memcmp(c->buf + c->id_at, id->p, id->n) != 0) {
        close_open(c);
        if (kind == KIND_TEXT)
            put(c, text, sizeof(text) - 1);
        else
            put(c, args, sizeof(args) - 1);
        c->id_at = c->len;
        c->id_len = id->n;
        put(c, id->p, id->n);
        put(c, ",\"delta\":\"", 10);
        c->open = kind;
    }
    put(c, delta->p + 1, delta->n - 2);
}

/* ---- the interface --------------------------------------------------------------------------- */

struct agw_capture *agw_capture_new(void)
{
    return agw_xcalloc(1, sizeof(struct agw_capture));
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
    free(c->buf);
    free(c);
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
    if (kind == KIND_KEEP) {
        keep(c, json, len);
        return;
    }
    id = kind == KIND_TEXT ? &ev.message_id : &ev.tool_call_id;
    if (!id->string || !ev.delta.string) {
        keep(c, json, len); /* malformed for history: it says so */
        return;
    }
    coalesce(c, kind, id, &ev.delta);
}

void agw_capture_content(struct agw_capture *c, bool args, const char *id, size_t id_len,
                         const char *delta, size_t delta_len)
{
    const struct member i = {.p = id, .n = id_len, .string = true};
    const struct member d = {.p = delta, .n = delta_len, .string = true};

    assert(id_len >= 2 && delta_len >= 2 && id[0] == '"' && delta[0] == '"');
    coalesce(c, args ? KIND_ARGS : KIND_TEXT, &i, &d);
}

/* A coalesced content line at the start of <line> (<len> bytes): its parts in <d> and its length
 * in *<line_len>; with <whole>, the line must be all of the <len> bytes, else it may be followed by
 * anything (the caller checks for its line break). */
static bool line_delta(const char *line, size_t len, bool whole, struct agw_capture_delta *d,
                       size_t *line_len)
{
    static const char text[] = "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":";
    static const char args[] = "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":";
    static const char delta[] = ",\"delta\":";
    const char *p, *q, *end = line + len;

    if (len > sizeof(text) - 1 && memcmp(line, text, sizeof(text) - 1) == 0) {
        d->args = false;
        p = line + sizeof(text) - 1;
    } else if (len > sizeof(args) - 1 && memcmp(line, args, sizeof(args) - 1) == 0) {
        d->args = true;
        p = line + sizeof(args) - 1;
    } else {
        return false;
    }
    if (*p != '"' || (q = scan_string(p, end, &d->id_escaped)) == NULL)
        return false;
    d->id = p + 1;
    d->id_len = (size_t)(q - p) - 2;
    if ((size_t)(end - q) < sizeof(delta) - 1 || memcmp(q, delta, sizeof(delta) - 1) != 0)
        return false;
    p = q + sizeof(delta) - 1;
    if (p == end || *p != '"' || (q = scan_string(p, end, NULL)) == NULL || q == end || *q != '}' ||
        (whole && q + 1 != end))
        return false;
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
    const char *p = body, *end = body + len;
    struct keys keys;
    bool seen = false;

    keys.count = 0;
    p = skip_ws(p, end);
    if (p == end || *p++ != '{')
        return false;
    for (;;) {
        p = skip_ws(p, end);
        if ((p = scan_key(p, end, &keys)) == NULL)
            return false;
        p = skip_ws(p, end);
        if (p == end || *p++ != ':')
            return false;
        p = skip_ws(p, end);
        if (!span_is(keys.p[keys.count - 1], keys.n[keys.count - 1], "messages", 8)) {
            p = scan_value(p, end, SCAN_MAX_DEPTH, true);
        } else if (p < end && *p == '[') {
            seen = true;
            p = skip_ws(p + 1, end);
            if (p < end && *p == ']') {
                p++;
            } else {
                for (;;) {
                    struct member id = {NULL, 0, false, false};
                    const char *e = p;
                    if (p == end || *p != '{' ||
                        (p = scan_object(p + 1, end, SCAN_MAX_DEPTH - 2, true, &id)) == NULL ||
                        !id.string || id.escaped ||
                        !fn(arg, e, (size_t)(p - e), id.p + 1, id.n - 2))
                        return false;
                    p = skip_ws(p, end);
                    if (p == end)
                        return false;
                    if (*p == ']') {
                        p++;
                        break;
                    }
                    if (*p++ != ',')
                        return false;
                    p = skip_ws(p, end);
                }
            }
        } else {
            return false; /* not an array: jansson's reading says what it is */
        }
        if (p == NULL)
            return false;
        p = skip_ws(p, end);
        if (p == end)
            return false;
        if (*p == '}')
            return seen && skip_ws(p + 1, end) == end;
        if (*p++ != ',')
            return false;
    }
}

bool agw_capture_line_fields(const char *line, size_t len, struct agw_capture_fields *f)
{
    struct event ev;

    memset(f, 0, sizeof(*f));
    return scan_event(line, len, &ev) && plain_string(&ev.type, &f->type, &f->type_len) &&
           (ev.message_id.p == NULL ||
            plain_string(&ev.message_id, &f->message_id, &f->message_id_len)) &&
           (ev.role.p == NULL || plain_string(&ev.role, &f->role, &f->role_len));
}

size_t agw_capture_size(const struct agw_capture *c)
{
    return c->len;
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
