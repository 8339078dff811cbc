/* agui-demo-agent: the small AG-UI backend bundled with the gateway.
 *
 * It is the upstream behind the README's run command and the scriptable peer of every integration,
 * interop and benchmark test, so it is built like the gateway itself: one libevent loop, never
 * blocking, with backpressure (a stream is produced in batches while the connection's output stays
 * under OUT_HIGH and resumed from the write callback when it drains, or from a timer when events
 * are paced). It speaks HTTP/1.1 itself on raw bufferevents rather than through evhttp because its
 * test knobs need control evhttp does not give: close-delimited bodies, dropping the TCP connection
 * mid-stream, writing the response one byte at a time.
 *
 * Lifetime: a struct conn is owned by the struct demo's list from accept until it is freed, which
 * happens only at the top of a bufferevent or timer callback (never from a nested helper): helpers
 * that want the connection gone put it in CONN_ST_CLOSING and the next callback frees it once its
 * output is flushed. A struct run (one response to an agent POST) is owned by its connection. See
 * doc/demo-agent.md for the endpoints and knobs. */
#include "config.h"

#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <jansson.h>

#include "agw/common.h"
#include "agw/input.h"
#include "agw/log.h"

/* ---- limits ---------------------------------------------------------------------------------- */
#define HEAD_MAX_LINE   8192              /* request line or one header line */
#define HEAD_MAX_BYTES  (64 * 1024)       /* the whole request head */
#define HEAD_MAX_FIELDS 100               /* header fields per request */
#define BODY_MAX_BYTES  (8 * 1024 * 1024) /* request body (Content-Length or chunked) */
#define IN_MAX_BYTES    (256 * 1024) /* stop reading the socket above this much unparsed input */
#define OUT_HIGH        (64 * 1024)  /* stop producing events above this many queued output bytes */
#define OUT_LOW         (16 * 1024)  /* the write callback resumes production below this */
#define BATCH_MAX       256 /* events produced per callback, so one stream cannot hog the loop */
#define HOLD_MAX_BYTES  (16 * 1024 * 1024) /* framing=length buffers the whole body: its ceiling */
#define IDLE_TIMEOUT_S  120                /* keep-alive connection waiting for a request */
#define CLOSE_TIMEOUT_S 30                 /* flushing the last bytes before a close */
#define ECHO_MAX        512                /* bytes of the user's text echoed back */

/* ---- knobs ----------------------------------------------------------------------------------- */
enum framing { FRAMING_CHUNKED = 0, FRAMING_CLOSE, FRAMING_LENGTH };
enum dialect { DIALECT_AGUI = 0, DIALECT_CLOUDBASE };

/* Per-request test knobs, from the query string and X-Demo-<Name> headers (the header wins). -1 =
 * unset. */
struct knobs {
    int64_t events;   /* content events of the final text message; -1 = the scenario's own */
    int64_t size;     /* bytes of each content delta (filler text); -1 = the scenario's text */
    int64_t delay_ms; /* between events; 0 = as fast as the client reads */
    int64_t first_byte_delay_ms; /* before the status line */
    int64_t drop_after;          /* close the connection after this many events; -1 = never */
    int64_t stall;         /* 1 = stop after the first content event and keep the connection open */
    int64_t wait_decision; /* 1 = after a frontend tool call, wait for a decision-only POST */
    int64_t decision;      /* enum decision_mode: what a decision for a waiting run gets */
    int64_t status;        /* 0 = stream; else answer this status with a JSON error */
    int64_t crlf, bytewise, done, fail, multiline, comments, ts; /* booleans */
    int64_t lifecycle_none; /* 1 = no RUN_STARTED / RUN_FINISHED */
    int64_t dialect;        /* enum dialect */
    int64_t framing;        /* enum framing */
    int64_t hangup;         /* enum hangup: what becomes of a kept-alive connection afterwards */
    char content_type[256]; /* "" = text/event-stream */
};

enum knob_type { KNOB_UINT, KNOB_BOOL, KNOB_ENUM, KNOB_STR };

struct knob_word {
    const char *word;
    int64_t value;
};

static const struct knob_word lifecycle_words[] = {{"full", 0}, {"none", 1}, {NULL, 0}};
static const struct knob_word dialect_words[] = {
    {"agui", DIALECT_AGUI}, {"ag-ui", DIALECT_AGUI}, {"cloudbase", DIALECT_CLOUDBASE}, {NULL, 0}};
static const struct knob_word framing_words[] = {
    {"chunked", FRAMING_CHUNKED}, {"close", FRAMING_CLOSE}, {"length", FRAMING_LENGTH}, {NULL, 0}};
/* A backend's keep-alive timeout, as a client sees it: the connection was kept alive, then closed
 * while idle ("idle"), or as the next request arrived, unanswered ("next"). */
enum hangup { HANGUP_NONE = 0, HANGUP_IDLE, HANGUP_NEXT };
static const struct knob_word hangup_words[] = {
    {"none", HANGUP_NONE}, {"idle", HANGUP_IDLE}, {"next", HANGUP_NEXT}, {NULL, 0}};

/* What a decision-only POST for a waiting run gets: "live" applies it to the waiting run and
 * answers 202 (a backend that takes live decisions); "stream" treats it as a new run, streamed
 * back, and the waiting run ends without it (as Mastra and AG-Kit servers do); "empty" answers an
 * empty event stream and leaves the waiting run as it is (as CopilotKit's runtime does: "already
 * running"); "refuse" answers 409 with a JSON error and leaves the waiting run as it is. */
enum decision_mode { DECISION_LIVE = 0, DECISION_STREAM, DECISION_EMPTY, DECISION_REFUSE };
static const struct knob_word decision_words[] = {{"live", DECISION_LIVE},
                                                  {"stream", DECISION_STREAM},
                                                  {"empty", DECISION_EMPTY},
                                                  {"refuse", DECISION_REFUSE},
                                                  {NULL, 0}};

struct knob_def {
    const char *name;
    enum knob_type type;
    size_t off; /* offsetof(struct knobs, field) */
    int64_t min, max;
    const struct knob_word *words; /* KNOB_ENUM */
};

#define KOFF(f) offsetof(struct knobs, f)
static const struct knob_def knob_defs[] = {
    {"events", KNOB_UINT, KOFF(events), 0, 100000000, NULL},
    {"size", KNOB_UINT, KOFF(size), 0, 1048576, NULL},
    {"delay_ms", KNOB_UINT, KOFF(delay_ms), 0, 3600000, NULL},
    {"first_byte_delay_ms", KNOB_UINT, KOFF(first_byte_delay_ms), 0, 3600000, NULL},
    {"drop_after", KNOB_UINT, KOFF(drop_after), 0, 1000000000, NULL},
    {"stall", KNOB_BOOL, KOFF(stall), 0, 1, NULL},
    {"wait_decision", KNOB_BOOL, KOFF(wait_decision), 0, 1, NULL},
    {"decision", KNOB_ENUM, KOFF(decision), 0, 3, decision_words},
    {"status", KNOB_UINT, KOFF(status), 200, 599, NULL},
    {"crlf", KNOB_BOOL, KOFF(crlf), 0, 1, NULL},
    {"bytewise", KNOB_BOOL, KOFF(bytewise), 0, 1, NULL},
    {"lifecycle", KNOB_ENUM, KOFF(lifecycle_none), 0, 1, lifecycle_words},
    {"done", KNOB_BOOL, KOFF(done), 0, 1, NULL},
    {"dialect", KNOB_ENUM, KOFF(dialect), 0, 1, dialect_words},
    {"fail", KNOB_BOOL, KOFF(fail), 0, 1, NULL},
    {"multiline", KNOB_BOOL, KOFF(multiline), 0, 1, NULL},
    {"comments", KNOB_BOOL, KOFF(comments), 0, 1, NULL},
    {"ts", KNOB_BOOL, KOFF(ts), 0, 1, NULL},
    {"framing", KNOB_ENUM, KOFF(framing), 0, 2, framing_words},
    {"hangup", KNOB_ENUM, KOFF(hangup), 0, 2, hangup_words},
    {"content_type", KNOB_STR, KOFF(content_type), 0, 0, NULL},
};

/* ---- the event plan of one run --------------------------------------------------------------- */
enum ev_kind {
    EV_RUN_STARTED,
    EV_TEXT_START,
    EV_TEXT_CONTENT,
    EV_TEXT_END,
    EV_TOOL_START,
    EV_TOOL_ARGS,
    EV_TOOL_END,
    EV_TOOL_RESULT,
    EV_RUN_FINISHED,
    EV_RUN_ERROR,
    EV_DONE,  /* data: [DONE] */
    EV_STALL, /* not an event: production stops here for good */
    EV_WAIT,  /* not an event: production waits here for a decision (wait_decision=1) */
};

static const char *const ev_names[] = {
    "RUN_STARTED",
    "TEXT_MESSAGE_START",
    "TEXT_MESSAGE_CONTENT",
    "TEXT_MESSAGE_END",
    "TOOL_CALL_START",
    "TOOL_CALL_ARGS",
    "TOOL_CALL_END",
    "TOOL_CALL_RESULT",
    "RUN_FINISHED",
    "RUN_ERROR",
    NULL,
    NULL,
    NULL,
};

/* One delta of a text message: the raw text and its JSON string literal (quotes included), made
 * once. */
struct piece {
    char *raw;
    size_t raw_len;
    char *lit;
    size_t lit_len;
};

/* One step of the plan. All strings are owned by the step. A TEXT_MESSAGE_CONTENT step stands for
 * <count> events whose deltas cycle through <pieces>. */
struct step {
    enum ev_kind kind;
    char *id;      /* messageId (text, result) or toolCallId (tool start/args/end) */
    char *call_id; /* TOOL_CALL_RESULT: toolCallId */
    char *name;    /* TOOL_CALL_START: toolCallName */
    char *parent;  /* TOOL_CALL_START: parentMessageId, or NULL */
    char *text;    /* TOOL_CALL_ARGS delta / TOOL_CALL_START args (cloudbase) / TOOL_CALL_RESULT
                      content */
    struct piece *pieces;
    size_t npieces;
    uint64_t count;
    char *prefix; /* content fast path: {"type":"TEXT_MESSAGE_CONTENT","messageId":"…","delta": */
    size_t prefix_len;
};

/* One response to an agent POST: the knobs, the plan and where production stands. Owned by its
 * conn. */
struct run {
    struct knobs k;
    char *thread_id;
    char *run_id;
    const char *scenario; /* static name, for logs and the X-Demo-Scenario header */
    struct step *steps;
    size_t nsteps, cap;
    size_t cur;             /* next step */
    uint64_t rep;           /* next repetition of a content step */
    uint64_t emitted;       /* events produced so far */
    struct evbuffer *batch; /* frames of the current callback, before transfer coding */
    struct evbuffer *hold;  /* framing=length: the whole body until the end */
    char *scratch;          /* one serialised event */
    size_t scratch_cap;
    bool stalled; /* reached EV_STALL */
    bool waiting; /* reached EV_WAIT: a decision-only POST for this run resumes it */
    uint64_t seq; /* start order, to find a thread's latest waiting run */
    /* wait_decision: the frontend tool call the decision answers */
    char *pending_call, *pending_name, *pending_args;
    size_t followup_msg; /* the follow-up text's lowest id number (msg_<n>): past the run's own */
    bool blocked;        /* stopped at OUT_HIGH: the write callback resumes it */
};

/* ---- connections ----------------------------------------------------------------------------- */
enum conn_state {
    CONN_ST_HEAD,    /* reading a request head (or idle between keep-alive requests) */
    CONN_ST_BODY,    /* reading its body */
    CONN_ST_DELAY,   /* run accepted, waiting first_byte_delay_ms before answering */
    CONN_ST_STREAM,  /* producing the response */
    CONN_ST_CLOSING, /* flushing the last bytes, then freed */
};

static const char *const conn_state_names[] = {"head", "body", "delay", "stream", "closing"};

enum chunk_state { CHUNK_SIZE, CHUNK_DATA, CHUNK_DATA_END, CHUNK_TRAILER };

struct header {
    char *name; /* lowercased */
    char *value;
};

struct demo;

struct conn {
    struct demo *d;
    struct conn *prev, *next;
    uint64_t id;
    enum conn_state state;
    struct bufferevent *bev;
    struct event *timer; /* the current state's timer: delay, pacing, continuation or close */
    /* the request being read */
    char *method;
    char *target;
    int minor; /* HTTP/1.<minor> */
    struct header *hdrs;
    size_t nhdrs;
    size_t head_bytes;
    bool line_seen; /* the request line was parsed */
    bool keep_alive;
    bool chunked;
    enum chunk_state cst;
    uint64_t body_left; /* Content-Length bytes, or bytes left of the current chunk */
    struct evbuffer *body;
    /* the response */
    struct run *run;
    struct evbuffer
        *wire; /* bytewise: response bytes not yet handed to the socket, one per write */
    bool bytewise;
    bool hangup_next; /* hangup=next: close, unanswered, when the next request arrives */
};

struct demo {
    struct event_base *base;
    struct evconnlistener *listener;
    struct event *sig_term, *sig_int;
    struct event *relisten; /* re-enables the listener after an accept error (EMFILE) */
    struct conn *conns;
    uint64_t next_id;
    uint64_t requests;       /* agent POSTs */
    uint64_t active_streams; /* runs accepted and not yet ended */
    uint64_t client_closed;  /* runs whose client went away before their end */
    uint64_t completed;      /* runs whose last byte was queued */
    uint64_t dropped;        /* runs ended by drop_after */
    uint64_t waiting;        /* runs waiting for a decision */
    uint64_t decisions;      /* decision-only POSTs applied to a waiting run (answered 202) */
    uint64_t run_seq;
    uint64_t connections; /* open connections */
    uint64_t accepted;    /* connections accepted since start */
    json_t *last_request; /* the last agent POST, as /_demo/last-request shows it */
};

static void conn_process(struct conn *c);
static void pump(struct conn *c);

/* ---- small helpers --------------------------------------------------------------------------- */
static char ascii_lower(char ch)
{
    return (ch >= 'A' && ch <= 'Z') ? (char)(ch - 'A' + 'a') : ch;
}

static bool is_alnum(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (unsigned char)ch >= 0x80;
}

/* RFC 9110 token characters (header names, methods). */
static bool is_tchar(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch != '\0' && strchr("!#$%&'*+-.^_`|~", ch) != NULL);
}

static char *str_lower(const char *s)
{
    char *out = agw_xstrdup(s);
    for (char *p = out; *p; p++)
        *p = ascii_lower(*p);
    return out;
}

/* Length of the longest prefix of <s> (length <len>) that is at most <max> bytes and does not split
 * a UTF-8 sequence. */
static size_t utf8_cut(const char *s, size_t len, size_t max)
{
    if (len <= max)
        return len;
    while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80)
        max--;
    return max;
}

/* True when <word> occurs in <text> (both lowercase) bounded by non-alphanumerics. */
static bool has_word(const char *text, const char *word)
{
    size_t wl = strlen(word);
    for (const char *p = strstr(text, word); p; p = strstr(p + 1, word)) {
        bool left = p == text || !is_alnum(p[-1]);
        bool right = !is_alnum(p[wl]);
        if (left && right)
            return true;
    }
    return false;
}

/* A JSON string of <s> (length <len>); bytes that are not valid UTF-8 become '?' so that request
 * text (targets, header values) can always be shown. */
static json_t *json_str_lossy(const char *s, size_t len)
{
    json_t *j = json_stringn(s, len);
    char *copy;

    if (j)
        return j;
    copy = agw_xstrndup(s, len);
    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)copy[i] >= 0x80 || copy[i] == '\0')
            copy[i] = '?';
    }
    j = json_stringn(copy, len);
    free(copy);
    if (!j)
        abort(); /* out of memory, the daemon's policy */
    return j;
}

static int64_t *knob_int(struct knobs *k, const struct knob_def *def)
{
    return (int64_t *)(void *)((char *)k + def->off);
}

static uint64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static const char *reason_phrase(int status)
{
    static const struct {
        int status;
        const char *text;
    } phrases[] = {
        {100, "Continue"},
        {200, "OK"},
        {201, "Created"},
        {202, "Accepted"},
        {204, "No Content"},
        {400, "Bad Request"},
        {401, "Unauthorized"},
        {403, "Forbidden"},
        {404, "Not Found"},
        {405, "Method Not Allowed"},
        {408, "Request Timeout"},
        {409, "Conflict"},
        {413, "Content Too Large"},
        {415, "Unsupported Media Type"},
        {422, "Unprocessable Content"},
        {429, "Too Many Requests"},
        {431, "Request Header Fields Too Large"},
        {500, "Internal Server Error"},
        {501, "Not Implemented"},
        {502, "Bad Gateway"},
        {503, "Service Unavailable"},
        {504, "Gateway Timeout"},
        {505, "HTTP Version Not Supported"},
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(phrases); i++) {
        if (phrases[i].status == status)
            return phrases[i].text;
    }
    return "Status";
}

/* The header's value, or NULL. <name> is lowercase. */
static const char *header_get(const struct conn *c, const char *name)
{
    for (size_t i = 0; i < c->nhdrs; i++) {
        if (strcmp(c->hdrs[i].name, name) == 0)
            return c->hdrs[i].value;
    }
    return NULL;
}

/* ---- knobs ----------------------------------------------------------------------------------- */
static void knobs_init(struct knobs *k)
{
    memset(k, 0, sizeof(*k));
    k->events = -1;
    k->size = -1;
    k->drop_after = -1;
}

static const struct knob_def *knob_find(const char *name)
{
    for (size_t i = 0; i < AGW_ARRAY_LEN(knob_defs); i++) {
        if (strcmp(knob_defs[i].name, name) == 0)
            return &knob_defs[i];
    }
    return NULL;
}

/* Sets one knob from its text. Returns 0, or -AGW_EINVAL with the reason (naming the knob) in
 * <err>. */
static int knob_set(struct knobs *k, const struct knob_def *def, const char *val, char *err,
                    size_t errlen)
{
    int64_t *dst = NULL;

    switch (def->type) {
    case KNOB_UINT: {
        char *end = NULL;
        long long v;
        if (val[0] < '0' || val[0] > '9')
            goto bad;
        errno = 0;
        v = strtoll(val, &end, 10);
        if (errno != 0 || *end != '\0' || v < def->min || v > def->max)
            goto bad;
        *knob_int(k, def) = v;
        return 0;
    }
    case KNOB_BOOL:
        dst = knob_int(k, def);
        if (strcmp(val, "1") == 0 || strcmp(val, "true") == 0 || strcmp(val, "yes") == 0 ||
            strcmp(val, "on") == 0)
            *dst = 1;
        else if (strcmp(val, "0") == 0 || strcmp(val, "false") == 0 || strcmp(val, "no") == 0 ||
                 strcmp(val, "off") == 0)
            *dst = 0;
        else
            goto bad;
        return 0;
    case KNOB_ENUM:
        for (const struct knob_word *w = def->words; w->word; w++) {
            if (strcmp(w->word, val) == 0) {
                *knob_int(k, def) = w->value;
                return 0;
            }
        }
        goto bad;
    case KNOB_STR: {
        size_t n = strlen(val);
        if (n == 0 || n >= sizeof(k->content_type))
            goto bad;
        for (size_t i = 0; i < n; i++) {
            if ((unsigned char)val[i] < 0x20 || (unsigned char)val[i] > 0x7e)
                goto bad;
        }
        memcpy(k->content_type, val, n + 1);
        return 0;
    }
    }
bad:
    switch (def->type) {
    case KNOB_UINT:
        snprintf(err, errlen,
                 "demo knob %s: expects an integer in %" PRId64 "..%" PRId64 ", got '%.64s'",
                 def->name, def->min, def->max, val);
        break;
    case KNOB_BOOL:
        snprintf(err, errlen, "demo knob %s: expects 0 or 1, got '%.64s'", def->name, val);
        break;
    case KNOB_ENUM: {
        char words[128] = "";
        size_t n = 0;
        for (const struct knob_word *w = def->words; w->word && n < sizeof(words); w++)
            n += (size_t)snprintf(words + n, sizeof(words) - n, "%s%s", n ? "|" : "", w->word);
        snprintf(err, errlen, "demo knob %s: expects %s, got '%.64s'", def->name, words, val);
        break;
    }
    case KNOB_STR:
        snprintf(err, errlen, "demo knob %s: expects 1..255 printable ASCII characters", def->name);
        break;
    }
    return -AGW_EINVAL;
}

/* Percent-decodes <s> (length <len>, '+' = space) into a new string. Returns NULL when it decodes a
 * NUL. */
static char *url_decode(const char *s, size_t len)
{
    char *out = agw_xmalloc(len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        int hi, lo;
        if (s[i] == '%' && i + 2 < len && (hi = agw_hexval(s[i + 1])) >= 0 &&
            (lo = agw_hexval(s[i + 2])) >= 0) {
            out[n++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            out[n++] = s[i] == '+' ? ' ' : s[i];
        }
        if (n > 0 && out[n - 1] == '\0') {
            free(out);
            return NULL;
        }
    }
    out[n] = '\0';
    return out;
}

/* Applies the query's knobs (unknown parameters are ignored: they may mean something to someone
 * else) and then the X-Demo-<Name> headers (an unknown one is an error: it is a typo). */
static int knobs_parse(struct knobs *k, const char *query, const struct conn *c, char *err,
                       size_t errlen)
{
    const char *p = query;

    while (p && *p) {
        const char *amp = strchr(p, '&');
        size_t len = amp ? (size_t)(amp - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        char *key = NULL, *val = NULL;
        const struct knob_def *def;
        int rc = 0;

        if (eq && (key = url_decode(p, (size_t)(eq - p))) != NULL &&
            (val = url_decode(eq + 1, len - (size_t)(eq - p) - 1)) != NULL &&
            (def = knob_find(key)) != NULL)
            rc = knob_set(k, def, val, err, errlen);
        free(key);
        free(val);
        if (rc < 0)
            return rc;
        p = amp ? amp + 1 : NULL;
    }
    for (size_t i = 0; i < c->nhdrs; i++) {
        const struct header *h = &c->hdrs[i];
        char key[64];
        size_t n = 0;
        const struct knob_def *def;

        if (strncmp(h->name, "x-demo-", 7) != 0)
            continue;
        for (const char *q = h->name + 7; *q && n < sizeof(key) - 1; q++)
            key[n++] = *q == '-' ? '_' : *q;
        key[n] = '\0';
        def = knob_find(key);
        if (!def) {
            snprintf(err, errlen, "unknown demo knob header %.64s", h->name);
            return -AGW_EINVAL;
        }
        if (knob_set(k, def, h->value, err, errlen) < 0)
            return -AGW_EINVAL;
    }
    return 0;
}

/* ---- plans ----------------------------------------------------------------------------------- */
static char *json_literal(const char *s, size_t len, size_t *out_len)
{
    json_t *j = json_stringn(s, len);
    char *lit;

    if (!j) /* not UTF-8: only our own text reaches here, and jansson validated the request's */
        j = json_string("");
    lit = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(j);
    if (!lit)
        abort(); /* out of memory, the daemon's policy */
    *out_len = strlen(lit);
    return lit;
}

static struct step *plan_add(struct run *r, enum ev_kind kind)
{
    struct step *s;

    if (r->nsteps == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 16;
        r->steps = agw_xrealloc(r->steps, r->cap * sizeof(*r->steps));
    }
    s = &r->steps[r->nsteps++];
    memset(s, 0, sizeof(*s));
    s->kind = kind;
    return s;
}

static void piece_set(struct piece *p, const char *s, size_t len)
{
    p->raw = agw_xstrndup(s, len);
    p->raw_len = len;
    p->lit = json_literal(s, len, &p->lit_len);
}

static char *filler(size_t size)
{
    static const char text[] =
        "lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod "
        "tempor incididunt ut labore et dolore magna aliqua. ";
    char *out = agw_xmalloc(size + 1);
    for (size_t i = 0; i < size; i++)
        out[i] = text[i % (sizeof(text) - 1)];
    out[size] = '\0';
    return out;
}

/* Adds TEXT_MESSAGE_START, the content and TEXT_MESSAGE_END for message <id>. For the run's final
 * text
 * (<final>), the events and size knobs replace the scenario's deltas. */
static void plan_text(struct run *r, const char *id, const char *const *texts, size_t ntexts,
                      bool final)
{
    struct step *s;
    char prefix[256];
    size_t idlen;
    char *idlit = json_literal(id, strlen(id), &idlen);

    s = plan_add(r, EV_TEXT_START);
    s->id = agw_xstrdup(id);
    s = plan_add(r, EV_TEXT_CONTENT);
    s->id = agw_xstrdup(id);
    s->count = ntexts;
    if (final && r->k.size >= 0) {
        char *f = filler((size_t)r->k.size);
        s->pieces = agw_xcalloc(1, sizeof(*s->pieces));
        s->npieces = 1;
        piece_set(&s->pieces[0], f, (size_t)r->k.size);
        free(f);
    } else {
        s->pieces = agw_xcalloc(ntexts ? ntexts : 1, sizeof(*s->pieces));
        s->npieces = ntexts;
        for (size_t i = 0; i < ntexts; i++)
            piece_set(&s->pieces[i], texts[i], strlen(texts[i]));
    }
    if (final && r->k.events >= 0)
        s->count = (uint64_t)r->k.events;
    if (s->npieces == 0)
        s->count = 0;
    snprintf(prefix, sizeof(prefix),
             "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":%s,\"delta\":", idlit);
    s->prefix = agw_xstrdup(prefix);
    s->prefix_len = strlen(prefix);
    free(idlit);
    if (r->k.stall) {
        if (s->count > 1)
            s->count = 1;
        plan_add(r, EV_STALL);
        return;
    }
    s = plan_add(r, EV_TEXT_END);
    s->id = agw_xstrdup(id);
}

/* Adds a tool call: TOOL_CALL_START, one TOOL_CALL_ARGS (the CloudBase dialect carries the
 * arguments in the start event instead) and TOOL_CALL_END. */
static void plan_tool_call(struct run *r, const char *call_id, const char *name, const char *parent,
                           const char *args)
{
    struct step *s = plan_add(r, EV_TOOL_START);
    s->id = agw_xstrdup(call_id);
    s->name = agw_xstrdup(name);
    s->parent = parent ? agw_xstrdup(parent) : NULL;
    s->text = agw_xstrdup(args);
    if (r->k.dialect != DIALECT_CLOUDBASE) {
        s = plan_add(r, EV_TOOL_ARGS);
        s->id = agw_xstrdup(call_id);
        s->text = agw_xstrdup(args);
    }
    s = plan_add(r, EV_TOOL_END);
    s->id = agw_xstrdup(call_id);
}

static void plan_begin(struct run *r)
{
    if (!r->k.lifecycle_none)
        plan_add(r, EV_RUN_STARTED);
}

static void plan_end(struct run *r)
{
    if (r->k.fail)
        plan_add(r, EV_RUN_ERROR);
    else if (!r->k.lifecycle_none)
        plan_add(r, EV_RUN_FINISHED);
    if (r->k.done)
        plan_add(r, EV_DONE);
}

static void run_free(struct run *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nsteps; i++) {
        struct step *s = &r->steps[i];
        for (size_t j = 0; j < s->npieces; j++) {
            free(s->pieces[j].raw);
            free(s->pieces[j].lit);
        }
        free(s->pieces);
        free(s->id);
        free(s->call_id);
        free(s->name);
        free(s->parent);
        free(s->text);
        free(s->prefix);
    }
    free(r->steps);
    free(r->thread_id);
    free(r->run_id);
    free(r->pending_call);
    free(r->pending_name);
    free(r->pending_args);
    free(r->scratch);
    if (r->batch)
        evbuffer_free(r->batch);
    if (r->hold)
        evbuffer_free(r->hold);
    free(r);
}

/* ---- scenarios ------------------------------------------------------------------------------- */
/* The text of a message: its string content, or its text parts joined by spaces. Returns a new
 * string. */
static char *message_text(const json_t *msg)
{
    const json_t *content = json_object_get(msg, "content");
    struct evbuffer *b;
    size_t i, n;
    const json_t *part;
    char *out;

    if (json_is_string(content))
        return agw_xstrndup(json_string_value(content), json_string_length(content));
    if (!json_is_array(content))
        return agw_xstrdup("");
    b = evbuffer_new();
    json_array_foreach(content, i, part)
    {
        const json_t *t = json_object_get(part, "text");
        if (json_is_string(t)) {
            if (evbuffer_get_length(b) > 0)
                evbuffer_add(b, " ", 1);
            evbuffer_add(b, json_string_value(t), json_string_length(t));
        }
    }
    n = evbuffer_get_length(b);
    out = agw_xmalloc(n + 1);
    evbuffer_remove(b, out, n);
    out[n] = '\0';
    evbuffer_free(b);
    return out;
}

static const char *str_field(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool is_confirm_tool(const char *name)
{
    char *l = str_lower(name);
    bool yes = strstr(l, "confirm") != NULL;
    free(l);
    return yes;
}

/* Frontend tools: execute absent or "frontend" (backend tools run where they are defined, not
 * here). */
static bool is_frontend_tool(const json_t *tool)
{
    const char *ex = str_field(tool, "execute");
    return str_field(tool, "name") && (!ex || strcmp(ex, "frontend") == 0);
}

static const char *const stop_words[] = {
    "the",  "and",   "for",  "with", "help",  "please", "can",  "could", "you",  "your",  "our",
    "use",  "using", "tool", "find", "look",  "show",   "what", "whats", "this", "that",  "some",
    "all",  "any",   "from", "into", "about", "get",    "let",  "want",  "need", "would", "like",
    "tell", "give",  "my",   "me",   "set",   "run",    "are",  "is",    "it",   "of",    "to",
};

static bool is_stop_word(const char *w, size_t len)
{
    for (size_t i = 0; i < AGW_ARRAY_LEN(stop_words); i++) {
        if (strlen(stop_words[i]) == len && memcmp(stop_words[i], w, len) == 0)
            return true;
    }
    return false;
}

/* Splits a tool name into lowercase tokens (snake_case, kebab-case, camelCase), without stop words.
 */
static size_t name_tokens(const char *name, char toks[][32], size_t max)
{
    size_t n = 0, len = 0;
    char cur[32];

    for (const char *p = name;; p++) {
        bool boundary = *p == '\0' || *p == '_' || *p == '-' || *p == ' ' ||
                        (*p >= 'A' && *p <= 'Z' && p > name && p[-1] >= 'a' && p[-1] <= 'z');
        if (boundary && len > 0) {
            if (!is_stop_word(cur, len) && n < max) {
                memcpy(toks[n], cur, len);
                toks[n][len] = '\0';
                n++;
            }
            len = 0;
        }
        if (*p == '\0')
            break;
        if (*p != '_' && *p != '-' && *p != ' ' && len < sizeof(cur) - 1)
            cur[len++] = ascii_lower(*p);
    }
    return n;
}

/* True when the lowercase user text asks for <name>: it names it, or mentions at least half of its
 * tokens. */
static bool text_matches_tool(const char *lower_text, const char *name)
{
    char toks[8][32];
    size_t n, hits = 0;
    char *lname = str_lower(name);
    bool named = strstr(lower_text, lname) != NULL;

    free(lname);
    if (named)
        return true;
    n = name_tokens(name, toks, AGW_ARRAY_LEN(toks));
    for (size_t i = 0; i < n; i++) {
        /* "files" matches "file", "locally" matches "local": compare on the token's first 4+ bytes
         */
        size_t tl = strlen(toks[i]);
        if (tl > 4 && toks[i][tl - 1] == 's')
            toks[i][--tl] = '\0';
        if (tl >= 3 && strstr(lower_text, toks[i]))
            hits++;
    }
    return n > 0 && hits * 2 >= n;
}

/* The first word of <lower_text> worth using as a search keyword: not a stop word, not part of the
 * tool's name. Writes it into <out>; "demo" when there is none. */
static void pick_keyword(const char *lower_text, const char *tool, char *out, size_t outlen)
{
    char toks[8][32];
    size_t ntok = name_tokens(tool, toks, AGW_ARRAY_LEN(toks));
    const char *p = lower_text;

    while (*p) {
        const char *w;
        size_t len;
        bool skip = false;

        while (*p && !is_alnum(*p))
            p++;
        w = p;
        while (*p && is_alnum(*p))
            p++;
        len = (size_t)(p - w);
        if (len < 3 || is_stop_word(w, len))
            continue;
        for (size_t i = 0; i < ntok && !skip; i++) {
            size_t tl = strlen(toks[i]), cmp = tl < len ? tl : len;
            if (cmp > 4)
                cmp = 4;
            skip = cmp >= 3 && strncmp(w, toks[i], cmp) == 0;
        }
        if (skip)
            continue;
        snprintf(out, outlen, "%.*s", (int)(len < outlen ? len : outlen - 1), w);
        return;
    }
    snprintf(out, outlen, "demo");
}

/* The city of a weather question: the word after " in ", capitalised; "Beijing" when there is none.
 */
static void pick_city(const char *text, char *out, size_t outlen)
{
    char *lower = str_lower(text);
    const char *in = strstr(lower, " in ");
    size_t len = 0;

    snprintf(out, outlen, "Beijing");
    if (in) {
        const char *w = text + (in - lower) + 4;
        while (w[len] && is_alnum(w[len]) && len < outlen - 1)
            len++;
        if (len > 0) {
            memcpy(out, w, len);
            out[len] = '\0';
            if (out[0] >= 'a' && out[0] <= 'z')
                out[0] = (char)(out[0] - 'a' + 'A');
        }
    }
    free(lower);
}

/* Arguments for a frontend tool, made from its JSON-Schema parameters (an object, or a string
 * holding one, as legacy clients send) and the user's text. Returns a new compact JSON string. */
static char *tool_args(const json_t *tool, const char *text, const char *lower_text)
{
    const json_t *params = json_object_get(tool, "parameters");
    json_t *parsed = NULL, *args = json_object();
    json_t *props, *prop;
    const char *key;
    char *out;

    if (json_is_string(params))
        params = parsed = json_loads(json_string_value(params), 0, NULL);
    props = json_object_get(params, "properties");
    json_object_foreach(props, key, prop)
    {
        const char *type = str_field(prop, "type");
        const json_t *en = json_object_get(prop, "enum");
        char word[128];

        if (json_is_array(en) && json_array_size(en) > 0) {
            json_object_set(args, key, json_array_get(en, 0));
        } else if (!type || strcmp(type, "string") == 0) {
            if (strstr(key, "city") || strstr(key, "location"))
                pick_city(text, word, sizeof(word));
            else
                pick_keyword(lower_text, str_field(tool, "name"), word, sizeof(word));
            json_object_set_new(args, key, json_string(word));
        } else if (strcmp(type, "number") == 0 || strcmp(type, "integer") == 0) {
            json_object_set_new(args, key, json_integer(1));
        } else if (strcmp(type, "boolean") == 0) {
            json_object_set_new(args, key, json_true());
        }
    }
    out = json_dumps(args, JSON_COMPACT);
    json_decref(args);
    json_decref(parsed);
    return out ? out : agw_xstrdup("{}");
}

/* Classifies a confirmation tool's answer: true = approved. Accepts true/false, "yes"/"no",
 * {"approved":bool} (or confirmed/accepted/allowed), {"status"|"decision":"…"} and plain words.
 * Anything unrecognised is a denial: a demo should not "delete" on a doubt. */
static bool decision_approved(const char *content)
{
    static const char *const yes[] = {"true",     "yes",      "y",       "ok",        "okay",
                                      "approve",  "approved", "confirm", "confirmed", "accept",
                                      "accepted", "allow",    "allowed", "proceed",   "go"};
    static const char *const bool_keys[] = {"approved", "confirmed", "accepted", "allowed", "ok"};
    static const char *const str_keys[] = {"status", "decision", "action", "answer", "result"};
    json_t *j = json_loads(content, JSON_DECODE_ANY, NULL);
    char word[64];
    const char *s = content;
    bool approved = false;

    if (j) {
        s = NULL;
        if (json_is_boolean(j)) {
            approved = json_is_true(j);
        } else if (json_is_string(j)) {
            s = json_string_value(j);
        } else if (json_is_object(j)) {
            for (size_t i = 0; i < AGW_ARRAY_LEN(bool_keys) && !s; i++) {
                const json_t *v = json_object_get(j, bool_keys[i]);
                if (json_is_boolean(v)) {
                    approved = json_is_true(v);
                    json_decref(j);
                    return approved;
                }
            }
            for (size_t i = 0; i < AGW_ARRAY_LEN(str_keys) && !s; i++)
                s = str_field(j, str_keys[i]);
        }
    }
    if (s) {
        size_t n = 0;
        while (*s == ' ' || *s == '"')
            s++;
        while (s[n] && is_alnum(s[n]) && n < sizeof(word) - 1) {
            word[n] = ascii_lower(s[n]);
            n++;
        }
        word[n] = '\0';
        for (size_t i = 0; i < AGW_ARRAY_LEN(yes); i++)
            approved = approved || strcmp(word, yes[i]) == 0;
    }
    json_decref(j);
    return approved;
}

/* The confirmation request derived from the user's text: "Delete all temporary files" gives the
 * action "delete temporary files" (the human-in-the-loop scenario, doc/demo-agent.md). */
static char *confirm_action(const char *text)
{
    char *l = str_lower(text), *out;
    size_t n = strlen(l);
    char *p = l, *all;

    while (n > 0 && (l[n - 1] == '.' || l[n - 1] == '!' || l[n - 1] == '?' || l[n - 1] == ' '))
        l[--n] = '\0';
    if (strncmp(p, "please ", 7) == 0)
        p += 7;
    /* "delete all the files" → "delete files", so that "15 <what>" reads well */
    static const char *const fillers[] = {" all ", " the "}; /* each 4 bytes + a space kept */
    for (size_t i = 0; i < AGW_ARRAY_LEN(fillers); i++) {
        if ((all = strstr(p, fillers[i])) != NULL)
            memmove(all, all + 4, strlen(all + 4) + 1);
    }
    n = utf8_cut(p, strlen(p), 200);
    out = agw_xstrndup(p, n);
    free(l);
    return out;
}

static void sfmt(char *buf, size_t len, const char *fmt, ...) AGW_PRINTF(3, 4);
static void sfmt(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

/* The answer to tool <name> (called with <args>; both may be NULL) returning <content>: a
 * confirmation's outcome, or a text that uses the result. Returns the outcome's scenario name. */
static const char *followup_text(const char *name, const char *args, const char *content,
                                 char *text, size_t textlen)
{
    const char *outcome;
    size_t j;

    if (name && is_confirm_tool(name)) {
        json_t *a = args ? json_loads(args, 0, NULL) : NULL;
        const char *action = str_field(a, "action");
        const json_t *count = json_object_get(a, "count");
        bool ok = decision_approved(content);

        outcome = ok ? "confirm-approved" : "confirm-denied";
        if (!action)
            sfmt(text, textlen,
                 ok ? "Done: the action was approved and carried out."
                    : "Cancelled: the action was not carried out.");
        else if (ok && strncmp(action, "delete ", 7) == 0 && json_is_integer(count))
            sfmt(text, textlen, "Successfully deleted %" JSON_INTEGER_FORMAT " %s.",
                 json_integer_value(count), action + 7);
        else if (ok && strncmp(action, "delete ", 7) == 0)
            sfmt(text, textlen, "Successfully deleted %s.", action + 7);
        else if (ok)
            sfmt(text, textlen, "Done: %s.", action);
        else
            sfmt(text, textlen, "Cancelled: I did not %s.", action);
        json_decref(a);
    } else {
        json_t *res = json_loads(content, 0, NULL);
        size_t len;

        outcome = "tool-result";
        if (json_is_array(res) && json_array_size(res) > 0) {
            bool files = name && strstr(name, "file");
            size_t cnt = json_array_size(res);
            const json_t *it;
            len = (size_t)snprintf(text, textlen, "Found %zu %s: ", cnt,
                                   files ? (cnt == 1 ? "file" : "files")
                                         : (cnt == 1 ? "result" : "results"));
            json_array_foreach(res, j, it)
            {
                char *s = json_is_string(it) ? agw_xstrdup(json_string_value(it))
                                             : json_dumps(it, JSON_COMPACT | JSON_ENCODE_ANY);
                if (len < textlen)
                    len +=
                        (size_t)snprintf(text + len, textlen - len, "%s%s",
                                         j == 0 ? "" : (j + 1 == cnt ? " and " : ", "), s ? s : "");
                free(s);
            }
        } else {
            size_t cl = utf8_cut(content, strlen(content), ECHO_MAX);
            sfmt(text, textlen, "The %s tool returned: %.*s", name ? name : "frontend", (int)cl,
                 content);
        }
        json_decref(res);
        /* snprintf may have cut a UTF-8 sequence at the buffer's end */
        len = strlen(text);
        text[utf8_cut(text, len, textlen - 8)] = '\0';
    }
    return outcome;
}

/* Appends the answer to tool <name> returning <content> (see followup_text; <content> may be NULL)
 * as text message msg_<msg_no>, then the run's end. Scenario (a) and a waiting run's decision share
 * it, so that both answer a tool alike. Returns the outcome's scenario name. */
static const char *plan_followup(struct run *r, const char *name, const char *args,
                                 const char *content, size_t msg_no)
{
    char id[32], text[1024];
    const char *texts[1] = {text};
    const char *outcome = followup_text(name, args, content ? content : "", text, sizeof(text));

    snprintf(id, sizeof(id), "msg_%zu", msg_no);
    plan_text(r, id, texts, 1, true);
    plan_end(r);
    return outcome;
}

/* (a) The last message is a tool result: answer with a text that uses it. */
static void scenario_tool_followup(struct run *r, const json_t *messages, const json_t *last,
                                   size_t n)
{
    const char *call_id = str_field(last, "toolCallId");
    const char *content = str_field(last, "content");
    const char *name = NULL, *args = NULL;
    const json_t *m, *tc;
    size_t i, j;

    json_array_foreach(messages, i, m)
    {
        json_array_foreach(json_object_get(m, "toolCalls"), j, tc)
        {
            const json_t *fn = json_object_get(tc, "function");
            if (call_id && str_field(tc, "id") && strcmp(str_field(tc, "id"), call_id) == 0) {
                name = str_field(fn, "name");
                args = str_field(fn, "arguments");
            }
        }
    }
    plan_begin(r);
    r->scenario = plan_followup(r, name, args, content, n + 1);
}

/* After a frontend tool call: wait_decision=1 keeps the stream open for the decision (EV_WAIT),
 * otherwise the run ends and the frontend answers in a new run. */
static void plan_end_or_wait(struct run *r, const char *call_id, const char *name, const char *args,
                             size_t n)
{
    if (!r->k.wait_decision) {
        plan_end(r);
        return;
    }
    r->pending_call = agw_xstrdup(call_id);
    r->pending_name = agw_xstrdup(name);
    r->pending_args = agw_xstrdup(args);
    r->followup_msg = n + 2; /* msg_{n+1} may be this run's own text */
    plan_add(r, EV_WAIT);
}

/* (b) A destructive request with confirmAction available: ask for confirmation, then end or wait
 * (plan_end_or_wait). */
static void scenario_confirm(struct run *r, const char *tool, const char *text, size_t n)
{
    char *action = confirm_action(text);
    json_t *args = json_object();
    char msg_id[32], call_id[32], say[512];
    const char *texts[1] = {say};
    char *args_s;

    r->scenario = "confirm";
    json_object_set_new(args, "action", json_string(action));
    if (strncmp(action, "delete ", 7) == 0) {
        json_object_set_new(args, "count", json_integer(15));
        sfmt(say, sizeof(say), "About to delete 15 %s", action + 7);
    } else {
        sfmt(say, sizeof(say), "About to %s", action);
    }
    args_s = json_dumps(args, JSON_COMPACT);
    snprintf(msg_id, sizeof(msg_id), "msg_%zu", n + 1);
    snprintf(call_id, sizeof(call_id), "call_%03zu", 3 + 3 * (n - 1));
    plan_begin(r);
    plan_text(r, msg_id, texts, 1, false);
    if (!r->k.stall) {
        plan_tool_call(r, call_id, tool, msg_id, args_s ? args_s : "{}");
        plan_end_or_wait(r, call_id, tool, args_s ? args_s : "{}", n);
    } else {
        plan_end(r);
    }
    free(args_s);
    json_decref(args);
    free(action);
}

/* (c) A frontend tool the user asked for: call it; the frontend answers in the next request, or in
 * a decision for this run when it waits. */
static void scenario_frontend(struct run *r, const json_t *tool, const char *text,
                              const char *lower, size_t n)
{
    char call_id[32];
    char *args = tool_args(tool, text, lower);

    r->scenario = "frontend-tool";
    snprintf(call_id, sizeof(call_id), "call_%03zu", 2 + 3 * (n - 1));
    plan_begin(r);
    plan_tool_call(r, call_id, str_field(tool, "name"), NULL, args);
    plan_end_or_wait(r, call_id, str_field(tool, "name"), args, n);
    free(args);
}

/* (d) Weather: a server-side tool, called and answered here. */
static void scenario_weather(struct run *r, const char *text, size_t n)
{
    char city[64], msg1[32], msg2[32], call_id[32], result_id[32], args[128], result[256], say[256];
    const char *intro[1] = {"Let me check"};
    const char *final[1] = {say};
    json_t *j;
    char *s;
    struct step *st;

    r->scenario = "weather";
    pick_city(text, city, sizeof(city));
    snprintf(msg1, sizeof(msg1), "msg_%zu", n + 1);
    snprintf(msg2, sizeof(msg2), "msg_%zu", n + 2);
    snprintf(call_id, sizeof(call_id), "call_%03zu", 1 + 3 * (n - 1));
    snprintf(result_id, sizeof(result_id), "msg_tool_%zu", n);
    j = json_pack("{s:s}", "city", city);
    s = json_dumps(j, JSON_COMPACT);
    snprintf(args, sizeof(args), "%s", s ? s : "{}");
    free(s);
    json_decref(j);
    j = json_pack("{s:s,s:s,s:i,s:s}", "city", city, "condition", "Sunny", "temperature", 25,
                  "unit", "C");
    s = json_dumps(j, JSON_COMPACT);
    snprintf(result, sizeof(result), "%s", s ? s : "{}");
    free(s);
    json_decref(j);
    sfmt(say, sizeof(say),
         "%s is sunny today, 25\xc2\xb0"
         "C.",
         city);

    plan_begin(r);
    plan_text(r, msg1, intro, 1, false);
    if (!r->k.stall) {
        plan_tool_call(r, call_id, "get_weather", msg1, args);
        st = plan_add(r, EV_TOOL_RESULT);
        st->id = agw_xstrdup(result_id);
        st->call_id = agw_xstrdup(call_id);
        st->text = agw_xstrdup(result);
        plan_text(r, msg2, final, 1, true);
    }
    plan_end(r);
}

/* (e) Conversation: a friendly reply echoing the user's text, over several deltas. */
static void scenario_chat(struct run *r, const char *text, const char *lower, size_t n)
{
    char id[32], echo[ECHO_MAX + 8];
    const char *greet[] = {"Hello", "! How can I help you?"};
    const char *reply[] = {"Hello", "! You said: \"", echo, "\".", " How can I help you?"};
    size_t tl = strlen(lower);
    bool greeting;

    while (tl > 0 && !is_alnum(lower[tl - 1]))
        tl--;
    greeting = tl == 0 || (tl == 5 && strncmp(lower, "hello", 5) == 0) ||
               (tl == 2 && strncmp(lower, "hi", 2) == 0) ||
               (tl == 3 && strncmp(lower, "hey", 3) == 0);
    snprintf(echo, sizeof(echo), "%.*s", (int)utf8_cut(text, strlen(text), ECHO_MAX), text);
    r->scenario = "chat";
    snprintf(id, sizeof(id), "msg_%zu", n + 1);
    plan_begin(r);
    if (greeting)
        plan_text(r, id, greet, AGW_ARRAY_LEN(greet), true);
    else
        plan_text(r, id, reply, AGW_ARRAY_LEN(reply), true);
    plan_end(r);
}

/* Builds the run's plan from RunAgentInput <in>: the first matching scenario of (a)..(e). stall=1
 * always plays the conversation (it needs an open text message). */
static void plan_build(struct run *r, const json_t *in)
{
    const json_t *messages = json_object_get(in, "messages");
    const json_t *tools = json_object_get(in, "tools");
    size_t n = json_is_array(messages) ? json_array_size(messages) : 0;
    const json_t *last = n ? json_array_get(messages, n - 1) : NULL;
    const json_t *m, *tool, *confirm = NULL, *frontend = NULL;
    char *text = NULL, *lower = NULL;
    size_t i;

    /* the user's latest words */
    for (i = n; i > 0; i--) {
        m = json_array_get(messages, i - 1);
        if (str_field(m, "role") && strcmp(str_field(m, "role"), "user") == 0) {
            text = message_text(m);
            break;
        }
    }
    if (!text)
        text = agw_xstrdup("");
    lower = str_lower(text);
    if (n == 0)
        n = 1; /* ids stay msg_2, call_00x as in the seed */

    if (!r->k.stall && last && str_field(last, "role") &&
        strcmp(str_field(last, "role"), "tool") == 0) {
        scenario_tool_followup(r, messages, last, n);
        goto out;
    }
    json_array_foreach(tools, i, tool)
    {
        const char *name = str_field(tool, "name");
        if (!is_frontend_tool(tool))
            continue;
        if (is_confirm_tool(name)) {
            if (!confirm)
                confirm = tool;
        } else if (!frontend && text_matches_tool(lower, name)) {
            frontend = tool;
        }
    }
    if (!frontend && has_word(lower, "use")) {
        json_array_foreach(tools, i, tool)
        {
            if (is_frontend_tool(tool) && !is_confirm_tool(str_field(tool, "name"))) {
                frontend = tool;
                break;
            }
        }
    }
    if (r->k.stall) {
        scenario_chat(r, text, lower, n);
    } else if (confirm &&
               (strstr(lower, "delete") || strstr(lower, "confirm") || strstr(lower, "remove") ||
                strstr(lower, "erase") || strstr(lower, "destroy") || strstr(lower, "drop "))) {
        scenario_confirm(r, str_field(confirm, "name"), text, n);
    } else if (frontend) {
        scenario_frontend(r, frontend, text, lower, n);
    } else if (strstr(lower, "weather")) {
        scenario_weather(r, text, n);
    } else {
        scenario_chat(r, text, lower, n);
    }
out:
    free(text);
    free(lower);
}

/* ---- producing events ------------------------------------------------------------------------ */
static void scratch_reserve(struct run *r, size_t need)
{
    if (need > r->scratch_cap) {
        r->scratch_cap = need + 256;
        r->scratch = agw_xrealloc(r->scratch, r->scratch_cap);
    }
}

/* Writes one SSE frame holding <data> (one data: line per line of <data>) into <out>, with the
 * framing the knobs ask for. <type> names the event for comments=1 (NULL for [DONE]). */
static void put_frame(struct run *r, struct evbuffer *out, const char *type, const char *data,
                      size_t len)
{
    const char *eol = r->k.crlf ? "\r\n" : "\n";
    size_t el = r->k.crlf ? 2 : 1;
    const char *p = data, *end = data + len;

    if (r->k.comments) {
        if (r->emitted % 4 == 0) { /* a comment-only block between frames */
            evbuffer_add(out, ": keepalive", 11);
            evbuffer_add(out, eol, el);
            evbuffer_add(out, eol, el);
        }
        if (type)
            evbuffer_add_printf(out, "event: %s%s", type, eol);
        evbuffer_add_printf(out, "id: %" PRIu64 "%s", r->emitted + 1, eol);
        if (r->emitted % 4 == 2) { /* a comment line inside a frame */
            evbuffer_add(out, ": demo", 6);
            evbuffer_add(out, eol, el);
        }
    }
    for (;;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        evbuffer_add(out, "data: ", 6);
        evbuffer_add(out, p, n);
        evbuffer_add(out, eol, el);
        if (!nl)
            break;
        p = nl + 1;
    }
    evbuffer_add(out, eol, el);
}

static void set_str(json_t *obj, const char *key, const char *val)
{
    json_object_set_new(obj, key, json_string(val));
}

/* The event of step <s> (repetition <rep>) as JSON; used for everything but compact content events.
 */
static json_t *step_json(const struct run *r, const struct step *s, uint64_t rep)
{
    json_t *ev = json_object();

    set_str(ev, "type", ev_names[s->kind]);
    switch (s->kind) {
    case EV_RUN_STARTED:
    case EV_RUN_FINISHED:
        set_str(ev, "threadId", r->thread_id);
        set_str(ev, "runId", r->run_id);
        break;
    case EV_RUN_ERROR:
        if (r->k.dialect == DIALECT_CLOUDBASE) {
            json_object_set_new(ev, "error",
                                json_pack("{s:s,s:s}", "code", "MODEL_ERROR", "message",
                                          "demo failure requested (fail=1)"));
        } else {
            set_str(ev, "message", "demo failure requested (fail=1)");
            set_str(ev, "code", "MODEL_ERROR");
        }
        break;
    case EV_TEXT_START:
        set_str(ev, "messageId", s->id);
        if (r->k.dialect != DIALECT_CLOUDBASE)
            set_str(ev, "role", "assistant");
        break;
    case EV_TEXT_CONTENT: {
        const struct piece *p = &s->pieces[rep % s->npieces];
        set_str(ev, "messageId", s->id);
        json_object_set_new(ev, "delta", json_stringn(p->raw, p->raw_len));
        if (r->k.ts)
            json_object_set_new(ev, "sentUs", json_integer((json_int_t)wall_us()));
        break;
    }
    case EV_TEXT_END:
    case EV_TOOL_END:
        set_str(ev, s->kind == EV_TEXT_END ? "messageId" : "toolCallId", s->id);
        break;
    case EV_TOOL_START:
        set_str(ev, "toolCallId", s->id);
        set_str(ev, "toolCallName", s->name);
        if (s->parent)
            set_str(ev, "parentMessageId", s->parent);
        if (r->k.dialect == DIALECT_CLOUDBASE) {
            json_t *a = json_loads(s->text, 0, NULL);
            json_object_set_new(ev, "args", a ? a : json_string(s->text));
        }
        break;
    case EV_TOOL_ARGS:
        set_str(ev, "toolCallId", s->id);
        set_str(ev, "delta", s->text);
        break;
    case EV_TOOL_RESULT:
        set_str(ev, "messageId", s->id);
        set_str(ev, "toolCallId", s->call_id);
        set_str(ev, "content", s->text);
        break;
    case EV_DONE:
    case EV_STALL:
    case EV_WAIT:
        assert(!"not an event");
        break;
    }
    return ev;
}

/* Moves the cursor past the event just produced, and past content steps with nothing (left) to say.
 */
static void advance(struct run *r)
{
    if (r->cur < r->nsteps && r->steps[r->cur].kind == EV_TEXT_CONTENT &&
        ++r->rep < r->steps[r->cur].count)
        return;
    r->cur++;
    r->rep = 0;
    while (r->cur < r->nsteps && r->steps[r->cur].kind == EV_TEXT_CONTENT &&
           r->steps[r->cur].count == 0)
        r->cur++;
}

/* Produces the next event into r->batch. The cursor must be on an event (not past the end, not
 * EV_STALL). */
static void emit_next(struct run *r)
{
    const struct step *s = &r->steps[r->cur];

    if (s->kind == EV_DONE) {
        put_frame(r, r->batch, NULL, "[DONE]", 6);
    } else if (s->kind == EV_TEXT_CONTENT && !r->k.multiline) {
        /* the hot path of every benchmark: no JSON library, one copy into the scratch buffer */
        const struct piece *p = &s->pieces[r->rep % s->npieces];
        size_t n = s->prefix_len;
        scratch_reserve(r, s->prefix_len + p->lit_len + 48);
        memcpy(r->scratch, s->prefix, s->prefix_len);
        memcpy(r->scratch + n, p->lit, p->lit_len);
        n += p->lit_len;
        if (r->k.ts)
            n += (size_t)snprintf(r->scratch + n, r->scratch_cap - n, ",\"sentUs\":%" PRIu64,
                                  wall_us());
        r->scratch[n++] = '}';
        put_frame(r, r->batch, ev_names[s->kind], r->scratch, n);
    } else {
        json_t *ev = step_json(r, s, r->rep);
        char *txt = json_dumps(ev, r->k.multiline ? JSON_INDENT(2) : JSON_COMPACT);
        if (!txt)
            abort(); /* out of memory, the daemon's policy */
        put_frame(r, r->batch, ev_names[s->kind], txt, strlen(txt));
        free(txt);
        json_decref(ev);
    }
    r->emitted++;
    advance(r);
}

/* ---- connection output ----------------------------------------------------------------------- */
static size_t conn_queued(const struct conn *c)
{
    return evbuffer_get_length(bufferevent_get_output(c->bev)) + evbuffer_get_length(c->wire);
}

/* bytewise: hands the socket one more byte once it has written the previous one. */
static void trickle(struct conn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (evbuffer_get_length(c->wire) > 0 && evbuffer_get_length(out) == 0)
        evbuffer_remove_buffer(c->wire, out, 1);
}

/* Queues <src>'s bytes (drained) for the client, through the bytewise trickle when it is on or
 * busy. */
static void conn_send_buffer(struct conn *c, struct evbuffer *src)
{
    if (c->bytewise || evbuffer_get_length(c->wire) > 0) {
        evbuffer_add_buffer(c->wire, src);
        trickle(c);
    } else {
        evbuffer_add_buffer(bufferevent_get_output(c->bev), src);
    }
}

static void conn_send(struct conn *c, const void *data, size_t len)
{
    if (c->bytewise || evbuffer_get_length(c->wire) > 0) {
        evbuffer_add(c->wire, data, len);
        trickle(c);
    } else {
        evbuffer_add(bufferevent_get_output(c->bev), data, len);
    }
}

static void set_state(struct conn *c, enum conn_state st)
{
    agw_log_debug("conn %" PRIu64 ": %s -> %s", c->id, conn_state_names[c->state],
                  conn_state_names[st]);
    c->state = st;
}

static void arm_timer(struct conn *c, uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    evtimer_add(c->timer, &tv);
}

/* Ends the connection once its output is flushed; the write callback or the timer frees it. */
static void conn_closing(struct conn *c)
{
    struct timeval tv = {CLOSE_TIMEOUT_S, 0};

    set_state(c, CONN_ST_CLOSING);
    bufferevent_set_timeouts(c->bev, NULL, &tv);
    evtimer_del(c->timer);
    if (conn_queued(c) == 0)
        arm_timer(c, 0);
}

static void request_reset(struct conn *c)
{
    free(c->method);
    free(c->target);
    c->method = c->target = NULL;
    for (size_t i = 0; i < c->nhdrs; i++) {
        free(c->hdrs[i].name);
        free(c->hdrs[i].value);
    }
    free(c->hdrs);
    c->hdrs = NULL;
    c->nhdrs = 0;
    c->head_bytes = 0;
    c->line_seen = false;
    c->keep_alive = false;
    c->chunked = false;
    c->cst = CHUNK_SIZE;
    c->body_left = 0;
    evbuffer_drain(c->body, evbuffer_get_length(c->body));
}

/* The response is queued: wait for the next request, or close. */
static void response_done(struct conn *c, bool close)
{
    if (close || !c->keep_alive) {
        conn_closing(c);
        return;
    }
    request_reset(c);
    c->bytewise = false;
    set_state(c, CONN_ST_HEAD);
    {
        struct timeval tv = {IDLE_TIMEOUT_S, 0};
        bufferevent_set_timeouts(c->bev, &tv, NULL);
    }
    if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
        arm_timer(c, 0); /* a pipelined request: parse it from the loop, not from here */
}

/* Queues a complete response with a body and Content-Length. <extra> is a block of header lines or
 * "". */
static void send_response(struct conn *c, int status, const char *ctype, const char *body,
                          size_t len, const char *extra, bool close)
{
    struct evbuffer *b = evbuffer_new();
    bool keep = c->keep_alive && !close;

    evbuffer_add_printf(b,
                        "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                        "Cache-Control: no-cache\r\n%sConnection: %s\r\n\r\n",
                        status, reason_phrase(status), ctype, len, extra,
                        keep ? "keep-alive" : "close");
    if (c->method == NULL || strcmp(c->method, "HEAD") != 0)
        evbuffer_add(b, body, len);
    conn_send_buffer(c, b);
    evbuffer_free(b);
    response_done(c, !keep);
}

static void send_json(struct conn *c, int status, json_t *body, const char *extra, bool close)
{
    char *txt = json_dumps(body, JSON_COMPACT);
    if (!txt)
        abort();
    send_response(c, status, "application/json", txt, strlen(txt), extra, close);
    free(txt);
    json_decref(body);
}

static void send_error(struct conn *c, int status, const char *msg, bool close)
{
    agw_log_info("conn %" PRIu64 ": %s %s -> %d %s", c->id, c->method ? c->method : "-",
                 c->target ? c->target : "-", status, msg);
    json_t *body = json_object();
    json_object_set_new(body, "error", json_str_lossy(msg, strlen(msg)));
    send_json(c, status, body, "", close);
}

/* ---- streaming ------------------------------------------------------------------------------- */
/* The connection's run is over (completed, dropped or abandoned; the caller counts which): it
 * leaves the active count and is freed. */
static void run_end(struct conn *c)
{
    assert(c->d->active_streams > 0);
    c->d->active_streams--;
    if (c->run->waiting)
        c->d->waiting--;
    run_free(c->run);
    c->run = NULL;
}

static void stream_finish(struct conn *c)
{
    struct run *r = c->run;
    bool close = r->k.framing == FRAMING_CLOSE;

    if (r->k.framing == FRAMING_CHUNKED) {
        conn_send(c, "0\r\n\r\n", 5);
    } else if (r->k.framing == FRAMING_LENGTH) {
        struct evbuffer *b = evbuffer_new();
        evbuffer_add_printf(
            b,
            "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-cache\r\nX-Demo-Scenario: %s\r\nConnection: %s\r\n\r\n",
            r->k.content_type[0] ? r->k.content_type : "text/event-stream",
            evbuffer_get_length(r->hold), r->scenario, c->keep_alive ? "keep-alive" : "close");
        evbuffer_add_buffer(b, r->hold);
        conn_send_buffer(c, b);
        evbuffer_free(b);
    }
    agw_log_debug("conn %" PRIu64 ": run %s completed, %" PRIu64 " events", c->id, r->run_id,
                  r->emitted);
    c->d->completed++;
    /* The response said keep-alive all the same: the client finds out by itself. */
    if (r->k.hangup == HANGUP_IDLE)
        close = true;
    c->hangup_next = r->k.hangup == HANGUP_NEXT;
    run_end(c);
    response_done(c, close);
}

/* drop_after: the events produced so far are flushed, then the connection is closed without ending
 * the body (no last chunk; with framing=close the client sees a clean-looking EOF; with
 * framing=length nothing was sent). */
static void stream_drop(struct conn *c)
{
    agw_log_debug("conn %" PRIu64 ": dropping after %" PRIu64 " events", c->id, c->run->emitted);
    c->d->dropped++;
    run_end(c);
    conn_closing(c);
}

/* Hands the batch to the transfer coding: one chunk per batch, raw bytes, or the length-mode hold.
 */
static void flush_batch(struct conn *c)
{
    struct run *r = c->run;
    size_t n = evbuffer_get_length(r->batch);

    if (n == 0)
        return;
    switch ((enum framing)r->k.framing) {
    case FRAMING_CHUNKED: {
        char hdr[24];
        int hl = snprintf(hdr, sizeof(hdr), "%zx\r\n", n);
        evbuffer_prepend(r->batch, hdr, (size_t)hl);
        evbuffer_add(r->batch, "\r\n", 2);
        conn_send_buffer(c, r->batch);
        break;
    }
    case FRAMING_CLOSE:
        conn_send_buffer(c, r->batch);
        break;
    case FRAMING_LENGTH:
        evbuffer_add_buffer(r->hold, r->batch);
        break;
    }
}

static bool drop_due(const struct run *r)
{
    return r->k.drop_after >= 0 && r->emitted >= (uint64_t)r->k.drop_after;
}

/* Produces the next batch of events: while the client keeps up (queued output under OUT_HIGH), at
 * most BATCH_MAX events, or one event when they are paced (delay_ms, bytewise). Then decides what
 * resumes it: the write callback (output queued), the timer (pacing, or nothing queued), or nothing
 * (stalled). */
static void pump(struct conn *c)
{
    struct run *r = c->run;
    bool one = r->k.delay_ms > 0 || r->k.bytewise;
    unsigned n = 0;

    assert(c->state == CONN_ST_STREAM && r);
    r->blocked = false;
    if (r->stalled || r->waiting)
        return;
    if (evbuffer_get_length(c->wire) > 0) {
        r->blocked = true; /* still trickling the previous event */
        return;
    }
    while (r->cur < r->nsteps && !drop_due(r)) {
        if (r->steps[r->cur].kind == EV_STALL) {
            r->stalled = true;
            break;
        }
        if (r->steps[r->cur].kind == EV_WAIT) {
            r->waiting = true;
            c->d->waiting++;
            break;
        }
        if (conn_queued(c) + evbuffer_get_length(r->batch) >= OUT_HIGH) {
            r->blocked = true;
            break;
        }
        emit_next(r);
        if (++n >= BATCH_MAX || one)
            break;
    }
    flush_batch(c);
    if (r->k.framing == FRAMING_LENGTH && evbuffer_get_length(r->hold) > HOLD_MAX_BYTES) {
        agw_log_warn("conn %" PRIu64 ": framing=length body over %d bytes", c->id, HOLD_MAX_BYTES);
        run_end(c);
        send_error(c, 500, "demo framing=length: the stream exceeds 16 MiB", true);
        return;
    }
    if (drop_due(r)) {
        stream_drop(c);
    } else if (r->cur >= r->nsteps) {
        stream_finish(c);
    } else if (r->stalled) {
        agw_log_debug("conn %" PRIu64 ": stalled after %" PRIu64 " events", c->id, r->emitted);
    } else if (r->waiting) {
        agw_log_info("conn %" PRIu64 ": run %s waits for a decision on %s", c->id, r->run_id,
                     r->pending_call);
    } else if (r->k.delay_ms > 0 && !r->blocked) {
        arm_timer(c, (uint64_t)r->k.delay_ms);
    } else if (conn_queued(c) == 0) {
        arm_timer(c, 0); /* nothing on the wire (framing=length): no write callback will come */
    }
}

/* first_byte_delay_ms has passed: the status line, then the stream. */
static void start_response(struct conn *c)
{
    struct run *r = c->run;
    char buf[512];
    const char *te = "";

    if (r->k.status) {
        int status = (int)r->k.status;
        char msg[64];
        snprintf(msg, sizeof(msg), "demo status %d", status);
        c->d->completed++;
        run_end(c); /* frees r */
        send_json(c, status, json_pack("{s:s}", "error", msg), "", false);
        return;
    }
    if (c->minor == 0 && r->k.framing == FRAMING_CHUNKED)
        r->k.framing = FRAMING_CLOSE; /* HTTP/1.0 has no chunked coding */
    if (r->k.framing == FRAMING_CLOSE)
        c->keep_alive = false;
    set_state(c, CONN_ST_STREAM);
    if (r->k.framing == FRAMING_LENGTH) {
        r->hold = evbuffer_new();
    } else {
        if (r->k.framing == FRAMING_CHUNKED)
            te = "Transfer-Encoding: chunked\r\n";
        snprintf(buf, sizeof(buf),
                 "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nCache-Control: no-cache\r\n"
                 "X-Accel-Buffering: no\r\nX-Demo-Scenario: %s\r\n%sConnection: %s\r\n\r\n",
                 r->k.content_type[0] ? r->k.content_type : "text/event-stream", r->scenario, te,
                 c->keep_alive ? "keep-alive" : "close");
        conn_send(c, buf, strlen(buf));
    }
    pump(c);
}

/* ---- requests -------------------------------------------------------------------------------- */
/* Keeps the request for GET /_demo/last-request: header names lowercased, repeated headers joined
 * with
 * ", ", the body as the raw string (bytes that are not UTF-8 shown as '?'). */
static void record_request(struct conn *c, const char *path, const char *query)
{
    json_t *hdrs = json_object(), *req = json_object();
    size_t blen = evbuffer_get_length(c->body);
    const char *body = (const char *)evbuffer_pullup(c->body, -1);

    for (size_t i = 0; i < c->nhdrs; i++) {
        const char *name = c->hdrs[i].name, *val = c->hdrs[i].value;
        const json_t *prev = json_object_get(hdrs, name);
        json_t *v;
        if (json_is_string(prev)) {
            size_t n = json_string_length(prev) + strlen(val) + 3;
            char *joined = agw_xmalloc(n);
            snprintf(joined, n, "%s, %s", json_string_value(prev), val);
            v = json_str_lossy(joined, strlen(joined));
            free(joined);
        } else {
            v = json_str_lossy(val, strlen(val));
        }
        json_object_set_new(hdrs, name, v); /* names are tokens (ASCII), see parse_head */
    }
    json_object_set_new(req, "method", json_str_lossy(c->method, strlen(c->method)));
    json_object_set_new(req, "path", json_str_lossy(path, strlen(path)));
    json_object_set_new(req, "query", json_str_lossy(query, strlen(query)));
    json_object_set_new(req, "headers", hdrs);
    json_object_set_new(req, "body", json_str_lossy(body ? body : "", body ? blen : 0));
    json_decref(c->d->last_request);
    c->d->last_request = req;
}

/* ---- human in the loop ----------------------------------------------------------------------- */
/* Decision-only requests (doc/protocol.md#decisions), decided exactly as the gateway decides them
 * (src/input.c): no user message with non-blank content, and a tool message with a toolCallId. A
 * body the gateway would refuse is no decision. */
static bool decision_only(const char *body, size_t len)
{
    struct agw_input in = {0};
    bool yes = agw_input_parse(body, len, 0, &in, NULL, 0) == 0 && in.decision_only;

    agw_input_clear(&in);
    return yes;
}

/* The waiting run a decision for (<thread>, <run>) is for: that exact run, else the thread's
 * latest.
 */
static struct conn *find_waiting(struct demo *d, const char *thread, const char *run)
{
    struct conn *best = NULL;

    if (!thread)
        return NULL;
    for (struct conn *c = d->conns; c; c = c->next) {
        struct run *r = c->run;
        if (c->state != CONN_ST_STREAM || !r || !r->waiting || strcmp(r->thread_id, thread) != 0)
            continue;
        if (run && strcmp(r->run_id, run) == 0)
            return c;
        if (!best || r->seq > best->run->seq)
            best = c;
    }
    return best;
}

/* Resumes the waiting run of <wc> with the decision <in>, which came on connection <from>: the tool
 * message answering the pending call (else the last tool message) is answered as scenario (a)
 * would, with the run's own tool name and arguments, then the run ends. The follow-up text's id is
 * msg_<n+1> for a decision of n messages, as in scenario (a), but never below the run's own floor:
 * a decision carrying only its tool message would otherwise reuse the run's msg_2. The run keeps
 * its scenario name (X-Demo-Scenario, sent at the end with framing=length). */
static void apply_decision(struct conn *wc, const json_t *in, uint64_t from)
{
    struct run *r = wc->run;
    const json_t *messages = json_object_get(in, "messages"), *m, *answer = NULL;
    size_t i, msg_no = json_array_size(messages) + 1;
    const char *outcome;

    assert(r->waiting && r->steps[r->cur].kind == EV_WAIT);
    json_array_foreach(messages, i, m)
    {
        const char *role = str_field(m, "role"), *call = str_field(m, "toolCallId");
        if (!role || strcmp(role, "tool") != 0 || !call)
            continue;
        if (!answer || strcmp(str_field(answer, "toolCallId"), r->pending_call) != 0)
            answer = m;
    }
    if (msg_no < r->followup_msg)
        msg_no = r->followup_msg;
    outcome =
        plan_followup(r, r->pending_name, r->pending_args, str_field(answer, "content"), msg_no);
    agw_log_info("conn %" PRIu64 ": decision for run %s (thread %s, %s %s) applied to conn %" PRIu64
                 ": %s",
                 from, r->run_id, r->thread_id, r->pending_name, r->pending_call, wc->id, outcome);
    r->cur++; /* past EV_WAIT */
    r->rep = 0;
    r->waiting = false;
    wc->d->waiting--;
    wc->d->decisions++;
    arm_timer(wc, 0); /* production resumes from the loop */
}

/* decision=stream: the waiting run of <wc> ends without the decision that came on connection <from>
 * (which is answered as a new run). */
static void abandon_wait(struct conn *wc, uint64_t from)
{
    struct run *r = wc->run;

    assert(r->waiting && r->steps[r->cur].kind == EV_WAIT);
    agw_log_info("conn %" PRIu64 ": decision for run %s taken as a new run; conn %" PRIu64
                 " ends without it",
                 from, r->run_id, wc->id);
    r->cur++; /* past EV_WAIT */
    r->rep = 0;
    r->waiting = false;
    wc->d->waiting--;
    plan_end(r);
    arm_timer(wc, 0);
}

/* An agent POST: validate, build the run, answer after first_byte_delay_ms. */
static void handle_run(struct conn *c, const char *path, const char *query)
{
    struct demo *d = c->d;
    struct run *r = NULL;
    char err[256];
    json_t *in = NULL;
    json_error_t jerr;
    const char *tid, *rid;
    char hex[33];

    d->requests++;
    record_request(c, path, query);
    r = agw_xcalloc(1, sizeof(*r));
    knobs_init(&r->k);
    if (knobs_parse(&r->k, query, c, err, sizeof(err)) < 0) {
        run_free(r);
        send_error(c, 400, err, false);
        return;
    }
    if (!r->k.status && evbuffer_get_length(c->body) == 0) {
        run_free(r);
        send_error(c, 400, "invalid JSON body: the body is empty", false);
        return;
    }
    if (!r->k.status) {
        in = json_loadb((const char *)evbuffer_pullup(c->body, -1), evbuffer_get_length(c->body), 0,
                        &jerr);
        if (!json_is_object(in)) {
            if (in)
                snprintf(err, sizeof(err), "invalid JSON body: expects an object");
            else
                snprintf(err, sizeof(err), "invalid JSON body: %s (line %d, column %d)", jerr.text,
                         jerr.line, jerr.column);
            json_decref(in);
            run_free(r);
            send_error(c, 400, err, false);
            return;
        }
    }
    tid = str_field(in, "threadId");
    rid = str_field(in, "runId");
    if (in &&
        decision_only((const char *)evbuffer_pullup(c->body, -1), evbuffer_get_length(c->body))) {
        struct conn *wc = find_waiting(d, tid, rid);
        if (wc && r->k.decision == DECISION_LIVE) {
            json_t *ack = json_pack("{s:s,s:s,s:s}", "status", "accepted", "threadId",
                                    wc->run->thread_id, "runId", wc->run->run_id);
            apply_decision(wc, in, c->id);
            json_decref(in);
            run_free(r);
            send_json(c, 202, ack, "", false);
            return;
        }
        if (wc && r->k.decision == DECISION_EMPTY) {
            agw_log_info("conn %" PRIu64 ": decision for waiting run %s: an empty stream", c->id,
                         wc->run->run_id);
            json_decref(in);
            run_free(r);
            send_response(c, 200, "text/event-stream", "", 0, "", false);
            return;
        }
        if (wc && r->k.decision == DECISION_REFUSE) {
            json_decref(in);
            run_free(r);
            send_error(c, 409, "thread already running: the decision was not taken", false);
            return;
        }
        if (wc) /* DECISION_STREAM: the decision is a new run below */
            abandon_wait(wc, c->id);
    }
    if (tid && *tid) {
        r->thread_id = agw_xstrdup(tid);
    } else {
        agw_random_hex(hex, 16);
        r->thread_id = agw_xmalloc(40);
        snprintf(r->thread_id, 40, "thread_%s", hex);
    }
    if (rid && *rid) {
        r->run_id = agw_xstrdup(rid);
    } else {
        agw_random_hex(hex, 16);
        r->run_id = agw_xmalloc(40);
        snprintf(r->run_id, 40, "run_%s", hex);
    }
    r->batch = evbuffer_new();
    if (r->k.status)
        r->scenario = "status";
    else
        plan_build(r, in);
    json_decref(in);
    while (r->cur < r->nsteps && r->steps[r->cur].kind == EV_TEXT_CONTENT &&
           r->steps[r->cur].count == 0)
        r->cur++;

    agw_log_info("conn %" PRIu64 ": %s %s -> run thread=%s run=%s scenario=%s", c->id, c->method,
                 c->target, r->thread_id, r->run_id, r->scenario);
    c->run = r;
    c->bytewise = r->k.bytewise != 0;
    r->seq = ++d->run_seq;
    d->active_streams++;
    bufferevent_set_timeouts(c->bev, NULL, NULL); /* a stalled or paced stream is not idle */
    set_state(c, CONN_ST_DELAY);
    arm_timer(c, (uint64_t)r->k.first_byte_delay_ms);
}

static void handle_request(struct conn *c)
{
    static const char method_not_allowed[] = "{\"error\":\"method not allowed\"}";
    struct demo *d = c->d;
    const char *q = strchr(c->target, '?');
    char *path = q ? agw_xstrndup(c->target, (size_t)(q - c->target)) : agw_xstrdup(c->target);
    const char *query = q ? q + 1 : "";
    bool get = strcmp(c->method, "GET") == 0 || strcmp(c->method, "HEAD") == 0;

    if (strcmp(path, "/healthz") == 0 || strncmp(path, "/_demo/", 7) == 0) {
        if (!get) {
            send_response(c, 405, "application/json", method_not_allowed,
                          strlen(method_not_allowed), "Allow: GET, HEAD\r\n", false);
        } else if (strcmp(path, "/healthz") == 0) {
            agw_log_info("conn %" PRIu64 ": %s %s -> 200", c->id, c->method, c->target);
            send_json(c, 200, json_pack("{s:s}", "status", "ok"), "", false);
        } else if (strcmp(path, "/_demo/stats") == 0) {
            agw_log_info("conn %" PRIu64 ": %s %s -> 200", c->id, c->method, c->target);
            send_json(c, 200,
                      json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "requests",
                                (json_int_t)d->requests, "active_streams",
                                (json_int_t)d->active_streams, "client_closed",
                                (json_int_t)d->client_closed, "completed", (json_int_t)d->completed,
                                "dropped", (json_int_t)d->dropped, "connections",
                                (json_int_t)d->connections, "waiting", (json_int_t)d->waiting,
                                "decisions", (json_int_t)d->decisions, "accepted",
                                (json_int_t)d->accepted),
                      "", false);
        } else if (strcmp(path, "/_demo/last-request") == 0) {
            if (d->last_request) {
                agw_log_info("conn %" PRIu64 ": %s %s -> 200", c->id, c->method, c->target);
                send_json(c, 200, json_incref(d->last_request), "", false);
            } else {
                send_error(c, 404, "no request recorded yet", false);
            }
        } else {
            send_error(c, 404, "not found", false);
        }
    } else if (strcmp(c->method, "POST") != 0) {
        agw_log_info("conn %" PRIu64 ": %s %s -> 405", c->id, c->method, c->target);
        send_response(c, 405, "application/json", method_not_allowed, strlen(method_not_allowed),
                      "Allow: POST\r\n", false);
    } else {
        handle_run(c, path, query);
    }
    free(path);
}

/* Parses head lines from the input. Returns 0 when the head is complete, AGW_AGAIN, or an HTTP
 * status for an error (with the message in <err>). */
static int parse_head(struct conn *c, const char **err)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);

    for (;;) {
        size_t len = 0;
        char *line;
        struct evbuffer_ptr eol = evbuffer_search_eol(in, NULL, NULL, EVBUFFER_EOL_CRLF);

        if (eol.pos < 0) {
            if (evbuffer_get_length(in) > HEAD_MAX_LINE) {
                *err = "request line or header line too long";
                return c->line_seen ? 431 : 414;
            }
            return AGW_AGAIN;
        }
        line = evbuffer_readln(in, &len, EVBUFFER_EOL_CRLF);
        if (!line)
            return AGW_AGAIN;
        c->head_bytes += len + 2;
        if (len > HEAD_MAX_LINE || c->head_bytes > HEAD_MAX_BYTES) {
            free(line);
            *err = "request head too large";
            return 431;
        }
        if (!c->line_seen) {
            char *sp1, *sp2;
            if (len == 0) { /* tolerated empty lines before a request */
                free(line);
                continue;
            }
            sp1 = strchr(line, ' ');
            sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
            if (!sp1 || !sp2 || sp1 == line || sp2 == sp1 + 1 || strchr(sp2 + 1, ' ')) {
                free(line);
                *err = "malformed request line";
                return 400;
            }
            if (strcmp(sp2 + 1, "HTTP/1.1") == 0) {
                c->minor = 1;
            } else if (strcmp(sp2 + 1, "HTTP/1.0") == 0) {
                c->minor = 0;
            } else {
                bool http = strncmp(sp2 + 1, "HTTP/", 5) == 0;
                free(line);
                *err = http ? "HTTP version not supported" : "malformed request line";
                return http ? 505 : 400;
            }
            for (const char *t = line; t < sp1; t++) {
                if (!is_tchar(*t)) {
                    free(line);
                    *err = "malformed request method";
                    return 400;
                }
            }
            c->method = agw_xstrndup(line, (size_t)(sp1 - line));
            {
                /* absolute-form (http://host/path) is routed by its path */
                const char *t = sp1 + 1;
                if (strncmp(t, "http://", 7) == 0 || strncmp(t, "https://", 8) == 0) {
                    const char *slash =
                        memchr(t + 8, '/', (size_t)(sp2 - t) > 8 ? (size_t)(sp2 - t) - 8 : 0);
                    t = slash ? slash : sp2;
                }
                c->target = t == sp2 ? agw_xstrdup("/") : agw_xstrndup(t, (size_t)(sp2 - t));
            }
            c->line_seen = true;
            free(line);
            continue;
        }
        if (len == 0) {
            free(line);
            return 0;
        }
        {
            char *colon = strchr(line, ':');
            char *v, *e, *ws = strpbrk(line, " \t");
            if (!colon || colon == line || (ws && ws < colon)) {
                free(line);
                *err = "malformed header line";
                return 400;
            }
            if (c->nhdrs == HEAD_MAX_FIELDS) {
                free(line);
                *err = "too many header fields";
                return 431;
            }
            *colon = '\0';
            for (const char *t = line; *t; t++) {
                if (!is_tchar(*t)) {
                    free(line);
                    *err = "malformed header name";
                    return 400;
                }
            }
            v = colon + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            e = v + strlen(v);
            while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
                *--e = '\0';
            if (c->nhdrs == 0)
                c->hdrs = agw_xcalloc(HEAD_MAX_FIELDS, sizeof(*c->hdrs));
            c->hdrs[c->nhdrs].name = str_lower(line);
            c->hdrs[c->nhdrs].value = agw_xstrdup(v);
            c->nhdrs++;
            free(line);
        }
    }
}

/* The head is complete: decide the body's framing and the connection's persistence. Returns 0 or an
 * HTTP status with <err>. */
static int head_done(struct conn *c, const char **err)
{
    const char *te = header_get(c, "transfer-encoding");
    const char *conn = header_get(c, "connection");
    const char *expect = header_get(c, "expect");
    bool has_cl = false;

    c->keep_alive = c->minor == 1 ? !agw_header_has_token(conn, "close")
                                  : agw_header_has_token(conn, "keep-alive");
    for (size_t i = 0; i < c->nhdrs; i++) {
        char *end = NULL;
        unsigned long long v;
        if (strcmp(c->hdrs[i].name, "content-length") != 0)
            continue;
        errno = 0;
        v = strtoull(c->hdrs[i].value, &end, 10);
        if (c->hdrs[i].value[0] < '0' || c->hdrs[i].value[0] > '9' || *end != '\0' || errno != 0 ||
            (has_cl && v != c->body_left)) {
            *err = "invalid Content-Length";
            return 400;
        }
        if (v > BODY_MAX_BYTES) {
            *err = "request body too large";
            return 413;
        }
        c->body_left = v;
        has_cl = true;
    }
    if (te) {
        if (has_cl) {
            *err = "both Content-Length and Transfer-Encoding";
            return 400;
        }
        if (!agw_strieq_n(te, strlen(te), "chunked")) {
            *err = "unsupported Transfer-Encoding";
            return 501;
        }
        c->chunked = true;
        c->cst = CHUNK_SIZE;
    }
    if (expect && agw_strieq_n(expect, strlen(expect), "100-continue") && c->minor == 1 &&
        (c->chunked || c->body_left > 0) && evbuffer_get_length(bufferevent_get_input(c->bev)) == 0)
        conn_send(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    return 0;
}

/* Moves body bytes from the input into c->body. Returns 0 when the body is complete, AGW_AGAIN, or
 * an HTTP status with <err>. */
static int read_body(struct conn *c, const char **err)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);

    if (!c->chunked) {
        size_t n = evbuffer_get_length(in);
        if (n > c->body_left)
            n = (size_t)c->body_left;
        evbuffer_remove_buffer(in, c->body, n);
        c->body_left -= n;
        return c->body_left == 0 ? 0 : AGW_AGAIN;
    }
    for (;;) {
        size_t len = 0, n;
        char *line, *end = NULL;
        unsigned long long v;

        switch (c->cst) {
        case CHUNK_SIZE:
        case CHUNK_DATA_END:
        case CHUNK_TRAILER:
            line = evbuffer_readln(in, &len, EVBUFFER_EOL_CRLF);
            if (!line) {
                if (evbuffer_get_length(in) > HEAD_MAX_LINE) {
                    *err = "chunk line too long";
                    return 400;
                }
                return AGW_AGAIN;
            }
            if (c->cst == CHUNK_SIZE) {
                errno = 0;
                v = strtoull(line, &end, 16);
                if (agw_hexval(line[0]) < 0 || errno != 0 ||
                    (*end != '\0' && *end != ';' && *end != ' ' && *end != '\t')) {
                    free(line);
                    *err = "malformed chunk size";
                    return 400;
                }
                free(line);
                if (v > BODY_MAX_BYTES || evbuffer_get_length(c->body) + v > BODY_MAX_BYTES) {
                    *err = "request body too large";
                    return 413;
                }
                c->body_left = v;
                c->cst = v == 0 ? CHUNK_TRAILER : CHUNK_DATA;
            } else if (c->cst == CHUNK_DATA_END) {
                free(line);
                if (len != 0) {
                    *err = "malformed chunk end";
                    return 400;
                }
                c->cst = CHUNK_SIZE;
            } else {
                free(line);
                c->head_bytes += len + 2;
                if (c->head_bytes > HEAD_MAX_BYTES) {
                    *err = "trailers too large";
                    return 431;
                }
                if (len == 0)
                    return 0;
            }
            break;
        case CHUNK_DATA:
            n = evbuffer_get_length(in);
            if (n == 0)
                return AGW_AGAIN;
            if (n > c->body_left)
                n = (size_t)c->body_left;
            evbuffer_remove_buffer(in, c->body, n);
            c->body_left -= n;
            if (c->body_left == 0)
                c->cst = CHUNK_DATA_END;
            break;
        }
    }
}

/* Parses and answers as many complete requests as the input holds, until one starts a stream. */
static void conn_process(struct conn *c)
{
    const char *err = NULL;
    int rc;

    if (c->hangup_next && c->state == CONN_ST_HEAD &&
        evbuffer_get_length(bufferevent_get_input(c->bev)) > 0) {
        agw_log_debug("conn %" PRIu64 ": hangup=next: closing on the next request", c->id);
        evbuffer_drain(bufferevent_get_input(c->bev),
                       evbuffer_get_length(bufferevent_get_input(c->bev)));
        conn_closing(c);
        return;
    }
    while (c->state == CONN_ST_HEAD || c->state == CONN_ST_BODY) {
        if (c->state == CONN_ST_HEAD) {
            rc = parse_head(c, &err);
            if (rc == AGW_AGAIN)
                return;
            if (rc == 0)
                rc = head_done(c, &err);
            if (rc != 0) {
                c->keep_alive = false;
                send_error(c, rc, err, true);
                return;
            }
            set_state(c, CONN_ST_BODY);
        }
        rc = read_body(c, &err);
        if (rc == AGW_AGAIN)
            return;
        if (rc != 0) {
            c->keep_alive = false;
            send_error(c, rc, err, true);
            return;
        }
        handle_request(c);
    }
}

/* ---- connection callbacks -------------------------------------------------------------------- */
static void conn_free(struct conn *c)
{
    struct demo *d = c->d;

    if (c->prev)
        c->prev->next = c->next;
    else
        d->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    d->connections--;
    request_reset(c);
    run_free(c->run);
    /* libevent defers the bufferevent's destruction past its running callback, so this is safe from
     * one */
    bufferevent_free(c->bev);
    event_free(c->timer);
    evbuffer_free(c->wire);
    evbuffer_free(c->body);
    free(c);
}

static void on_read(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;

    if (c->state == CONN_ST_HEAD || c->state == CONN_ST_BODY) {
        conn_process(c);
    } else if (c->state == CONN_ST_CLOSING) {
        struct evbuffer *in = bufferevent_get_input(bev);
        evbuffer_drain(in, evbuffer_get_length(in));
    }
    /* while a response is under way, a pipelined request waits in the input (bounded by
     * IN_MAX_BYTES) */
}

static void on_write(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;

    (void)bev;
    if (evbuffer_get_length(c->wire) > 0) {
        trickle(c);
        return;
    }
    if (c->state == CONN_ST_STREAM && c->run &&
        (c->run->blocked || (c->run->k.delay_ms == 0 && !c->run->stalled && !c->run->waiting)))
        pump(c);
    else if (c->state == CONN_ST_CLOSING && conn_queued(c) == 0)
        conn_free(c);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;

    (void)bev;
    if (c->run) {
        agw_log_info("conn %" PRIu64 ": client went away during run %s (%" PRIu64 " events sent)",
                     c->id, c->run->run_id, c->run->emitted);
        c->d->client_closed++;
        run_end(c);
    } else if (what & BEV_EVENT_TIMEOUT) {
        agw_log_debug("conn %" PRIu64 ": timeout in state %s", c->id, conn_state_names[c->state]);
    }
    conn_free(c);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;

    (void)fd;
    (void)what;
    switch (c->state) {
    case CONN_ST_DELAY:
        start_response(c);
        break;
    case CONN_ST_STREAM:
        pump(c);
        break;
    case CONN_ST_HEAD:
    case CONN_ST_BODY:
        conn_process(c);
        break;
    case CONN_ST_CLOSING:
        if (conn_queued(c) == 0)
            conn_free(c);
        break;
    }
}

static void on_accept(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg)
{
    struct demo *d = arg;
    struct conn *c;
    struct timeval idle = {IDLE_TIMEOUT_S, 0};
    int one = 1;

    (void)lis;
    (void)sa;
    (void)salen;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c = agw_xcalloc(1, sizeof(*c));
    c->d = d;
    c->id = ++d->next_id;
    c->bev = bufferevent_socket_new(d->base, fd, BEV_OPT_CLOSE_ON_FREE);
    c->timer = evtimer_new(d->base, on_timer, c);
    if (!c->bev || !c->timer) {
        agw_log_error("accept: cannot allocate a connection");
        if (c->bev)
            bufferevent_free(c->bev);
        else
            evutil_closesocket(fd);
        if (c->timer)
            event_free(c->timer);
        free(c);
        return;
    }
    c->wire = evbuffer_new();
    c->body = evbuffer_new();
    c->next = d->conns;
    if (d->conns)
        d->conns->prev = c;
    d->conns = c;
    d->connections++;
    d->accepted++;
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    bufferevent_setwatermark(c->bev, EV_READ, 0, IN_MAX_BYTES);
    bufferevent_setwatermark(c->bev, EV_WRITE, OUT_LOW, 0);
    bufferevent_set_timeouts(c->bev, &idle, NULL);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    agw_log_debug("conn %" PRIu64 ": accepted", c->id);
}

static void on_relisten(evutil_socket_t fd, short what, void *arg)
{
    struct demo *d = arg;
    (void)fd;
    (void)what;
    evconnlistener_enable(d->listener);
}

static void on_accept_error(struct evconnlistener *lis, void *arg)
{
    struct demo *d = arg;
    struct timeval tv = {0, 100000};
    int err = EVUTIL_SOCKET_ERROR();

    agw_log_warn("accept: %s; pausing the listener for 100 ms", evutil_socket_error_to_string(err));
    evconnlistener_disable(lis);
    evtimer_add(d->relisten, &tv);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct demo *d = arg;
    (void)what;
    agw_log_info("signal %d: exiting", (int)sig);
    event_base_loopexit(d->base, NULL);
}

/* ---- main ------------------------------------------------------------------------------------ */
static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: agui-demo-agent [--listen ADDR:PORT] [--port-file FILE] "
        "[--log-level error|warn|info|debug]\n"
        "\n"
        "The AG-UI demo and test backend of agui-gateway.\n"
        "  -l, --listen ADDR:PORT   listen address (default 127.0.0.1:9001; port 0 = ephemeral)\n"
        "  -p, --port-file FILE     write the bound port and a newline to FILE once listening\n"
        "  -L, --log-level LEVEL    error, warn, info (default) or debug\n"
        "  -h, --help               this help\n"
        "  -V, --version            the version\n"
        "\n"
        "POST any path but /_demo/* with a RunAgentInput body to run the agent; GET /healthz,\n"
        "/_demo/stats and /_demo/last-request. Knobs: see doc/demo-agent.md.\n");
}

/* Parses "ADDR:PORT" or "[V6ADDR]:PORT" (numeric address; port 0..65535, 0 = ephemeral). */
static int parse_listen(const char *s, struct sockaddr_storage *ss, int *sslen)
{
    char host[64];
    const char *colon = strrchr(s, ':'), *h = s;
    size_t hl;
    char *end = NULL;
    long port;

    if (!colon)
        return -AGW_EINVAL;
    hl = (size_t)(colon - s);
    if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']') {
        h = s + 1;
        hl -= 2;
    }
    if (hl == 0 || hl >= sizeof(host))
        return -AGW_EINVAL;
    memcpy(host, h, hl);
    host[hl] = '\0';
    errno = 0;
    port = strtol(colon + 1, &end, 10);
    if (colon[1] < '0' || colon[1] > '9' || *end != '\0' || errno != 0 || port > 65535)
        return -AGW_EINVAL;
    memset(ss, 0, sizeof(*ss));
    if (evutil_inet_pton(AF_INET, host, &((struct sockaddr_in *)(void *)ss)->sin_addr) == 1) {
        struct sockaddr_in *sin = (struct sockaddr_in *)(void *)ss;
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)port);
        *sslen = (int)sizeof(*sin);
        return 0;
    }
    if (evutil_inet_pton(AF_INET6, host, &((struct sockaddr_in6 *)(void *)ss)->sin6_addr) == 1) {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)(void *)ss;
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t)port);
        *sslen = (int)sizeof(*sin6);
        return 0;
    }
    return -AGW_EINVAL;
}

static int write_port_file(const char *path, int port)
{
    char tmp[4096], line[16];
    int n = snprintf(line, sizeof(line), "%d\n", port);
    FILE *f;

    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
        return -AGW_EINVAL;
    f = fopen(tmp, "w");
    if (!f)
        return -AGW_EIO;
    if (fwrite(line, 1, (size_t)n, f) != (size_t)n || fclose(f) != 0) {
        unlink(tmp);
        return -AGW_EIO;
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return -AGW_EIO;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"listen", required_argument, NULL, 'l'},    {"port-file", required_argument, NULL, 'p'},
        {"log-level", required_argument, NULL, 'L'}, {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},         {NULL, 0, NULL, 0},
    };
    const char *listen_addr = "127.0.0.1:9001", *port_file = NULL;
    struct demo d;
    struct sockaddr_storage ss;
    int sslen = (int)sizeof(ss), ch, rc = 1;

    memset(&d, 0, sizeof(d));
    while ((ch = getopt_long(argc, argv, "l:p:L:hV", opts, NULL)) != -1) {
        enum agw_log_level lvl;
        switch (ch) {
        case 'l':
            listen_addr = optarg;
            break;
        case 'p':
            port_file = optarg;
            break;
        case 'L':
            if (agw_log_level_parse(optarg, &lvl) < 0) {
                fprintf(stderr,
                        "agui-demo-agent: --log-level: expects error|warn|info|debug, got '%s'\n",
                        optarg);
                return 2;
            }
            agw_log_set_level(lvl);
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("agui-demo-agent (%s) %s\n", PACKAGE_NAME, PACKAGE_VERSION);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return 2;
    }
    memset(&ss, 0, sizeof(ss));
    if (parse_listen(listen_addr, &ss, &sslen) < 0) {
        fprintf(stderr, "agui-demo-agent: --listen: expects ADDR:PORT, got '%s'\n", listen_addr);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);

    d.base = event_base_new();
    if (!d.base) {
        agw_log_error("cannot create the event loop");
        goto out;
    }
    d.listener = evconnlistener_new_bind(
        d.base, on_accept, &d, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
        1024, (struct sockaddr *)&ss, sslen);
    if (!d.listener) {
        agw_log_error("cannot listen on %s: %s", listen_addr,
                      evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
        goto out;
    }
    evconnlistener_set_error_cb(d.listener, on_accept_error);
    d.relisten = evtimer_new(d.base, on_relisten, &d);
    d.sig_term = evsignal_new(d.base, SIGTERM, on_signal, &d);
    d.sig_int = evsignal_new(d.base, SIGINT, on_signal, &d);
    if (!d.relisten || !d.sig_term || !d.sig_int || evsignal_add(d.sig_term, NULL) < 0 ||
        evsignal_add(d.sig_int, NULL) < 0) {
        agw_log_error("cannot set up signal handling");
        goto out;
    }
    {
        struct sockaddr_storage bound;
        socklen_t blen = sizeof(bound);
        int port = 0;

        if (getsockname(evconnlistener_get_fd(d.listener), (struct sockaddr *)&bound, &blen) == 0)
            port = bound.ss_family == AF_INET6
                       ? ntohs(((struct sockaddr_in6 *)(void *)&bound)->sin6_port)
                       : ntohs(((struct sockaddr_in *)(void *)&bound)->sin_port);
        agw_log_info("agui-demo-agent %s listening on %s (port %d)", PACKAGE_VERSION, listen_addr,
                     port);
        if (port_file && write_port_file(port_file, port) < 0) {
            agw_log_error("--port-file %s: %s", port_file, strerror(errno));
            goto out;
        }
    }
    if (event_base_dispatch(d.base) < 0) {
        agw_log_error("event loop failed");
        goto out;
    }
    rc = 0;
out:
    while (d.conns) {
        if (d.conns->run)
            d.active_streams--;
        conn_free(d.conns);
    }
    if (d.listener)
        evconnlistener_free(d.listener);
    if (d.relisten)
        event_free(d.relisten);
    if (d.sig_term)
        event_free(d.sig_term);
    if (d.sig_int)
        event_free(d.sig_int);
    json_decref(d.last_request);
    if (d.base)
        event_base_free(d.base);
    libevent_global_shutdown();
    return rc;
}
