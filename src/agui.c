/* AG-UI stream normalisation (doc/protocol.md#lifecycle): one struct agw_agui per run turns
 * whatever the upstream sends into a stream that @ag-ui/client's verifier accepts. The design notes
 * (rules, state, limits, what is relayed raw and what is re-serialised) are in
 * doc/internals/agui.md.
 *
 * Hot path: each upstream frame is parsed once; a frame that needs no change is written with the
 * upstream's own bytes. jansson values never outlive the call that parsed or built them. Out of
 * memory (jansson or evbuffer refusing an allocation) aborts, as agw_xmalloc() does. */
#include "config.h"

#include <assert.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <event2/buffer.h>
#include <jansson.h>

#include "agw/agui.h"
#include "agw/agkit.h"
#include "agw/log.h"
#include "agw/schema.h"

const char AGW_AGUI_UPSTREAM_ERROR[] = "UPSTREAM_ERROR";
const char AGW_AGUI_TIMEOUT[] = "TIMEOUT";
const char AGW_AGUI_FRAME_TOO_LARGE[] = "FRAME_TOO_LARGE";
const char AGW_AGUI_INVALID_EVENT[] = "INVALID_EVENT";
const char AGW_AGUI_CANCELLED[] = "CANCELLED";
const char AGW_AGUI_SHUTDOWN[] = "SHUTDOWN";

/* Bounds on what one run may hold open at once, whatever the upstream sends: the number of open
 * items and the bytes of their ids (an id may be as long as a frame). Over either limit the run
 * ends with INVALID_EVENT. */
#define AGUI_MAX_OPEN          1024
#define AGUI_MAX_OPEN_ID_BYTES (128 * 1024)
/* Bytes of an upstream string (id, type) quoted in an error message. */
#define AGUI_EXCERPT 96

#define AGUI_JSON_FLAGS (JSON_COMPACT | JSON_PRESERVE_ORDER)

enum agw_agui_state {
    AGW_AGUI_ST_IDLE = 0, /* nothing written to the client yet */
    AGW_AGUI_ST_RUNNING,  /* RUN_STARTED written, no terminal event yet */
    AGW_AGUI_ST_FINISHED, /* RUN_FINISHED or RUN_ERROR written; nothing more will be */
};

/* What the gateway tracks as "open": each kind has a start event, an end event and the field naming
 * the item. Kinds are separate namespaces (a reasoning span and a reasoning message may share a
 * messageId). */
enum item_kind {
    ITEM_STEP = 0,
    ITEM_REASONING,
    ITEM_REASONING_MESSAGE,
    ITEM_TEXT_MESSAGE,
    ITEM_TOOL_CALL,
    ITEM_SUBAGENT, /* a sub-agent run: SUBAGENT_STARTED to SUBAGENT_FINISHED or _ERROR */
};

static const struct item_desc {
    const char *start;
    const char *content; /* NULL: the kind has no content event */
    const char *end;
    const char *id_key;
    bool message;      /* open at EOF = the stream was cut mid-message */
    const char *chunk; /* the chunk event that stands for start and content; NULL: none */
    const char *what;  /* the item, in an error message */
} item_descs[] = {
    [ITEM_STEP] = {"STEP_STARTED", NULL, "STEP_FINISHED", "stepName", false, NULL, "step"},
    [ITEM_REASONING] = {"REASONING_START", NULL, "REASONING_END", "messageId", false, NULL,
                        "reasoning"},
    [ITEM_REASONING_MESSAGE] = {"REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT",
                                "REASONING_MESSAGE_END", "messageId", true,
                                "REASONING_MESSAGE_CHUNK", "reasoning message"},
    [ITEM_TEXT_MESSAGE] = {"TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
                           "messageId", true, "TEXT_MESSAGE_CHUNK", "text message"},
    [ITEM_TOOL_CALL] = {"TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "toolCallId", true,
                        "TOOL_CALL_CHUNK", "tool call"},
    [ITEM_SUBAGENT] = {"SUBAGENT_STARTED", NULL, "SUBAGENT_FINISHED", "subagentRunId", false, NULL,
                       "sub-agent run"},
};

/* What an event type means to the normaliser; everything else passes through. */
enum event_role {
    EV_PASS = 0,
    EV_RUN_STARTED,
    EV_RUN_FINISHED,
    EV_RUN_ERROR,
    EV_OPEN,
    EV_CONTENT,
    EV_CLOSE,
    EV_CHUNK,
};

struct open_item {
    /* owned, NUL-terminated (jansson was told to refuse \u0000, so no id holds a NUL); a
     * sub-agent's step: <subagentRunId> NUL <stepName> (item_key()) */
    char *id;
    size_t id_len;
    enum item_kind kind;
    bool done; /* a sub-agent run that ended: kept, as its id may not be used again in the run */
};

/* A chunk stream: the item the chunks of one lane continue until an event ends it
 * (doc/internals/agui.md, "Chunks"). */
struct chunk_lane {
    char *owner; /* the lane: a sub-agent's run id (owned), NULL for the agent's own */
    /* The start event made of the stream's first chunk, without its metadata and time: the item's
     * id, and what a later chunk may not contradict (a text's role and name, a call's tool and
     * parent message), and the sub-agent's run id the first chunk gave. */
    json_t *start;
    enum item_kind kind;
};

/* A message's, tool call's, reasoning message's or activity's id, and who opened it (see
 * owner_set()): hashes, 0 for an empty slot and for the agent's own. */
struct owner_slot {
    uint64_t key;
    uint64_t owner;
};

#define OWNERS_INLINE 4     /* slots in the run's own block: a chat run opens one or two ids */
#define OWNERS_MAX    12288 /* ids a run's table holds (16,384 slots, 256 KiB); later: unchecked */

#define AGUI_CACHED_PREFIX 160
#define OUTCOME_MAX        96 /* bytes of an outcome, its NUL included */

struct agw_agui {
    char *thread_id; /* the client's ids, in the struct's block (agw_agui_new()) */
    char *run_id;
    enum agw_protocol protocol;
    enum agw_agui_state state;
    struct open_item *open; /* in order of opening; closed in reverse */
    size_t n_open;          /* <= AGUI_MAX_OPEN */
    size_t cap_open;
    size_t open_id_bytes; /* sum of open[].id_len, <= AGUI_MAX_OPEN_ID_BYTES */
    /* Who opened each id (owner_*()): open addressing over <owners_cap> slots, <owners_inline>
     * until it grows (<owners> NULL) */
    struct owner_slot *owners;
    uint32_t owners_cap, n_owners;
    bool sub_owners; /* some id is a sub-agent run's */
    struct owner_slot owners_inline[OWNERS_INLINE];
    struct chunk_lane *lanes; /* open chunk streams, oldest first (at most one per lane) */
    size_t n_lanes;           /* <= AGUI_MAX_OPEN */
    size_t lane_bytes;        /* sum of the lanes' owners' lengths, <= AGUI_MAX_OPEN_ID_BYTES */
    uint64_t events_out;      /* frames written to the client */
    /* The last content frame accepted by the fast path, up to and including its delta's opening
     * quote (see fast_content()); cached_kind is its kind. */
    char cached[AGUI_CACHED_PREFIX];
    size_t cached_len; /* 0: nothing cached */
    enum item_kind cached_kind;
    size_t cached_id_at, cached_id_len; /* the id's token (quotes included) in <cached> */
    uint64_t cached_reads;              /* content events fast_cached() took */
    /* the content event being emitted, as a fast path read it (agw_agui_emitting_content()) */
    struct agw_agui_content emitting;
    bool has_emitting;
    /* the type of the flat event being emitted, as a fast path read it (agw_agui_emitting_type()):
     * its bytes between the quotes, or NULL */
    const char *emitting_type;
    size_t emitting_type_len;
    /* "RUN_FINISHED" or "RUN_ERROR[:<code>]" (a long code is cut: OUTCOME_MAX) once FINISHED; a
     * static string or <outcome_buf>, which holds one with a code (owned; allocated at the end:
     * an open stream does not carry its room) */
    const char *outcome;
    char *outcome_buf;
    /* The data of the event being fed: an event written with exactly these bytes is the
     * upstream's own, relayed unchanged (the sink's <pass>). */
    const char *fed;
    size_t fed_len;
    bool slow_only; /* agw_agui_set_fast_paths(false): every frame through jansson (tests) */
    struct agw_agkit *agkit; /* "ag-kit" backends: their legacy events, translated first */
};

struct agkit_feed {
    struct agw_agui *a;
    const struct agw_agui_sink *out;
};

static AGW_NORETURN void oom(const char *what)
{
    agw_log_error("agui: out of memory (%s)", what);
    abort();
}

/* For jansson calls that can only fail on allocation (their strings are known to be UTF-8). */
static json_t *must(json_t *v)
{
    if (v == NULL)
        oom("jansson");
    return v;
}

static void set_new(json_t *obj, const char *key, json_t *v)
{
    if (json_object_set_new(obj, key, must(v)) != 0)
        oom("jansson");
}

static const char *state_name(enum agw_agui_state st)
{
    switch (st) {
    case AGW_AGUI_ST_IDLE:
        return "IDLE";
    case AGW_AGUI_ST_RUNNING:
        return "RUNNING";
    case AGW_AGUI_ST_FINISHED:
        return "FINISHED";
    }
    return "?";
}

/* The only place the state changes, one step forward: IDLE -> RUNNING -> FINISHED (a terminal
 * event is always preceded by RUN_STARTED, so IDLE never goes straight to FINISHED). */
static void set_state(struct agw_agui *a, enum agw_agui_state st)
{
    assert(st == a->state + 1);
    agw_log_debug("agui: run %s: %s -> %s", a->run_id, state_name(a->state), state_name(st));
    a->state = st;
}

/* <s> (UTF-8) for an error message: itself when short, else its first AGUI_EXCERPT bytes at most,
 * cut between characters, plus "...", copied into <buf> (AGUI_EXCERPT + 4 bytes). */
static const char *excerpt(const char *s, char *buf)
{
    size_t n = strlen(s);

    if (n <= AGUI_EXCERPT)
        return s;
    n = AGUI_EXCERPT;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
        n--; /* s[n] is a continuation byte: the cut would split the character that owns it */
    memcpy(buf, s, n);
    memcpy(buf + n, "...", 4);
    return buf;
}

/* ---- output ---------------------------------------------------------------------------------- */

/* Every event leaves through here, as the JSON of one event. <data> holds no line break: the fast
 * path's scanner refuses them, and the full path re-serialises an event whose bytes had one
 * ("changed"). When <data> is the event being fed, unchanged, the sink is told so (<pass>): the
 * relay then relays the frame it read, in one piece with its neighbours, rather than framing the
 * bytes again. */
static void write_frame(struct agw_agui *a, const struct agw_agui_sink *out, const char *data,
                        size_t len)
{
    out->emit(out->arg, data, len, data == a->fed && len == a->fed_len);
    a->events_out++;
}

static void write_json(struct agw_agui *a, const struct agw_agui_sink *out, const json_t *ev)
{
    char *s = json_dumps(ev, AGUI_JSON_FLAGS);

    if (s == NULL)
        oom("json_dumps");
    write_frame(a, out, s, strlen(s));
    free(s);
}

/* A new event of the gateway's own: "type" first; the caller adds the rest, then calls
 * write_generated(). */
static json_t *new_event(const char *type)
{
    json_t *ev = must(json_object());

    set_new(ev, "type", json_string(type));
    return ev;
}

/* Stamps <ev> with the wall clock, writes it and releases it. */
static void write_generated(struct agw_agui *a, const struct agw_agui_sink *out, json_t *ev)
{
    set_new(ev, "timestamp", json_integer((json_int_t)agw_wall_ms()));
    write_json(a, out, ev);
    json_decref(ev);
}

/* Writes the injected RUN_STARTED when nothing was written yet. Every path that writes an event
 * calls this first, except the one relaying the upstream's own RUN_STARTED. */
static void begin(struct agw_agui *a, const struct agw_agui_sink *out)
{
    if (a->state != AGW_AGUI_ST_IDLE)
        return;
    json_t *ev = new_event("RUN_STARTED");
    set_new(ev, "threadId", json_string(a->thread_id));
    set_new(ev, "runId", json_string(a->run_id));
    write_generated(a, out, ev);
    set_state(a, AGW_AGUI_ST_RUNNING);
}

/* Forgets every chunk stream: the run ended. */
static void drop_lanes(struct agw_agui *a)
{
    for (size_t i = 0; i < a->n_lanes; i++) {
        free(a->lanes[i].owner);
        json_decref(a->lanes[i].start);
    }
    free(a->lanes);
    a->lanes = NULL;
    a->n_lanes = 0;
    a->lane_bytes = 0;
}

static void finish(struct agw_agui *a, const char *code, bool error)
{
    free(a->outcome_buf);
    a->outcome_buf = NULL;
    if (!error) {
        a->outcome = "RUN_FINISHED";
    } else if (code != NULL) {
        char buf[OUTCOME_MAX];

        snprintf(buf, sizeof(buf), "RUN_ERROR:%s", code);
        a->outcome = a->outcome_buf = agw_xstrdup(buf);
    } else {
        a->outcome = "RUN_ERROR";
    }
    for (size_t i = 0; i < a->n_open; i++)
        free(a->open[i].id);
    a->n_open = 0;
    a->open_id_bytes = 0;
    drop_lanes(a);
    free(a->owners); /* (no event is checked any more) */
    a->owners = NULL;
    a->owners_cap = 0;
    a->n_owners = 0;
    memset(a->owners_inline, 0, sizeof(a->owners_inline));
    set_state(a, AGW_AGUI_ST_FINISHED);
}

static void close_all(struct agw_agui *a, const struct agw_agui_sink *out, bool error);

/* Ends the run with a gateway RUN_ERROR. <message> should be valid UTF-8; it is replaced by a
 * generic text when it is not (it may quote upstream bytes). */
static void run_error(struct agw_agui *a, const struct agw_agui_sink *out, const char *code,
                      const char *message)
{
    json_t *msg = NULL;
    json_t *ev = NULL;

    if (a->state == AGW_AGUI_ST_FINISHED)
        return;
    begin(a, out);
    /* Every ending closes what is open first (a cancel, a timeout, a cut stream alike). */
    close_all(a, out, true);
    if (message != NULL)
        msg = json_string(message);
    if (msg == NULL)
        msg = json_string("the gateway ended the run");
    ev = new_event("RUN_ERROR");
    set_new(ev, "message", msg);
    if (code != NULL) {
        json_t *c = json_string(code);
        if (c != NULL)
            set_new(ev, "code", c);
    }
    write_generated(a, out, ev);
    finish(a, code, true);
}

static void invalid_event(struct agw_agui *a, const struct agw_agui_sink *out, const char *fmt, ...)
    AGW_PRINTF(3, 4);

static void invalid_event(struct agw_agui *a, const struct agw_agui_sink *out, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    agw_log_debug("agui: run %s: INVALID_EVENT: %s", a->run_id, msg);
    run_error(a, out, AGW_AGUI_INVALID_EVENT, msg);
}

/* ---- open items ------------------------------------------------------------------------------ */

/* Is <kind>/<id> open? If so and <at> is not NULL, *<at> is its index. */
static bool find_open(const struct agw_agui *a, enum item_kind kind, const char *id, size_t id_len,
                      size_t *at)
{
    /* Linear (the vector is short and capped), newest first (ends mostly close the last open). */
    for (size_t i = a->n_open; i-- > 0;) {
        const struct open_item *it = &a->open[i];
        if (it->kind == kind && it->id_len == id_len && memcmp(it->id, id, id_len) == 0) {
            if (at != NULL)
                *at = i;
            return true;
        }
    }
    return false;
}

/* Returns false when a limit would be passed. */
static bool push_open(struct agw_agui *a, enum item_kind kind, const char *id, size_t id_len)
{
    if (a->n_open >= AGUI_MAX_OPEN || id_len > AGUI_MAX_OPEN_ID_BYTES - a->open_id_bytes)
        return false;
    if (a->n_open == a->cap_open) {
        size_t cap = a->cap_open ? a->cap_open * 2 : 2; /* a run rarely has more open at once */
        if (cap > AGUI_MAX_OPEN)
            cap = AGUI_MAX_OPEN;
        a->open = agw_xrealloc(a->open, cap * sizeof(*a->open));
        a->cap_open = cap;
    }
    a->open[a->n_open].id = agw_xmalloc(id_len + 1); /* (a step's key holds a NUL) */
    memcpy(a->open[a->n_open].id, id, id_len);
    a->open[a->n_open].id[id_len] = '\0';
    a->open[a->n_open].id_len = id_len;
    a->open[a->n_open].kind = kind;
    a->open[a->n_open].done = false;
    a->n_open++;
    a->open_id_bytes += id_len;
    return true;
}

static void remove_open(struct agw_agui *a, size_t i)
{
    assert(i < a->n_open);
    a->open_id_bytes -= a->open[i].id_len;
    free(a->open[i].id);
    memmove(&a->open[i], &a->open[i + 1], (a->n_open - i - 1) * sizeof(*a->open));
    a->n_open--;
}

/* Writes the end event of every open item, newest first, and forgets them. A sub-agent run still
 * open ends with SUBAGENT_FINISHED when the run finishes, SUBAGENT_ERROR when it fails (<error>).
 */
static void close_all(struct agw_agui *a, const struct agw_agui_sink *out, bool error)
{
    for (size_t i = a->n_open; i-- > 0;) {
        const struct open_item *it = &a->open[i];
        const struct item_desc *d = &item_descs[it->kind];
        const char *step = it->kind == ITEM_STEP ? memchr(it->id, '\0', it->id_len) : NULL;
        json_t *ev;

        if (it->done)
            continue;
        ev = new_event(it->kind == ITEM_SUBAGENT && error ? "SUBAGENT_ERROR" : d->end);
        set_new(ev, d->id_key, json_string(step != NULL ? step + 1 : it->id));
        if (step != NULL)
            set_new(ev, "subagentRunId", json_string(it->id));
        if (it->kind == ITEM_SUBAGENT && error)
            set_new(ev, "message", json_string("the run ended before the sub-agent run did"));
        write_generated(a, out, ev);
        remove_open(a, i);
    }
}

static bool message_open(const struct agw_agui *a)
{
    for (size_t i = 0; i < a->n_open; i++)
        if (item_descs[a->open[i].kind].message)
            return true;
    return false;
}

/* The key of an item of <kind> named <id> (<id_len> bytes) in event <ev>, in <*key>, <*key_len>:
 * the id, but for a sub-agent's step, which the client tells apart from another's of the same name:
 * <subagentRunId> NUL <stepName>, allocated (the caller frees *<owned>). */
static void item_key(const json_t *ev, enum item_kind kind, const char *id, size_t id_len,
                     const char **key, size_t *key_len, char **owned)
{
    json_t *sub = kind == ITEM_STEP ? json_object_get(ev, "subagentRunId") : NULL;

    *owned = NULL;
    *key = id;
    *key_len = id_len;
    if (!json_is_string(sub))
        return;
    size_t n = json_string_length(sub);
    *owned = agw_xmalloc(n + 1 + id_len + 1);
    memcpy(*owned, json_string_value(sub), n + 1);
    memcpy(*owned + n + 1, id, id_len + 1);
    *key = *owned;
    *key_len = n + 1 + id_len;
}

/* ---- upstream events ------------------------------------------------------------------------- */

/* strcmp() == 0, with most of the names that differ told apart by their first byte, inline: a
 * lifecycle event is classified on every run at least four times (RUN_, TEXT_, TOOL_, STEP_,
 * REASONING_; a few hundred instructions a time with a call per name). */
static bool type_is(const char *type, const char *name)
{
    return type[0] == name[0] && strcmp(type, name) == 0;
}

static enum event_role classify(const char *type, enum item_kind *kind)
{
    if (type_is(type, "RUN_STARTED"))
        return EV_RUN_STARTED;
    if (type_is(type, "RUN_FINISHED"))
        return EV_RUN_FINISHED;
    if (type_is(type, "RUN_ERROR"))
        return EV_RUN_ERROR;
    if (type_is(type, "SUBAGENT_ERROR")) {
        *kind = ITEM_SUBAGENT;
        return EV_CLOSE;
    }
    for (size_t k = 0; k < AGW_ARRAY_LEN(item_descs); k++) {
        const struct item_desc *d = &item_descs[k];
        *kind = (enum item_kind)k;
        if (type_is(type, d->start))
            return EV_OPEN;
        if (d->content != NULL && type_is(type, d->content))
            return EV_CONTENT;
        if (type_is(type, d->end))
            return EV_CLOSE;
        if (d->chunk != NULL && type_is(type, d->chunk))
            return EV_CHUNK;
    }
    return EV_PASS;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

/* Checked on every frame: an event ('{') is refused at its first byte. */
static bool is_done_marker(const char *data, size_t len)
{
    if (len < 6 || (data[0] != '[' && !is_space(data[0])))
        return false;
    while (len > 0 && is_space(data[0]))
        data++, len--;
    while (len > 0 && is_space(data[len - 1]))
        len--;
    return len == 6 && memcmp(data, "[DONE]", 6) == 0;
}

/* Rule 8 on the top level of <ev>: null-valued fields go; a float timestamp is truncated; a
 * timestamp that is not a number goes. With <ints_as_real> (the frame was parsed with
 * JSON_DECODE_INT_AS_REAL) an integral real timestamp was an integer in the data: no change.
 * Returns true if the upstream's bytes no longer describe <ev>. */
static bool sanitise(json_t *ev, bool ints_as_real)
{
    const char *key, *type = json_string_value(json_object_get(ev, "type"));
    json_t *v;
    void *tmp;
    bool changed = false;

    json_object_foreach_safe(ev, tmp, key, v)
    {
        /* (but where the protocol gives null a meaning: a STATE_SNAPSHOT's "snapshot", ...) */
        if (json_is_null(v) && (type == NULL || !agw_schema_keeps_null(type, key))) {
            json_object_del(ev, key);
            changed = true;
        }
    }
    v = json_object_get(ev, "timestamp");
    if (v == NULL)
        return changed;
    if (json_is_integer(v) && json_integer_value(v) >= -AGW_SCHEMA_MAX_INT &&
        json_integer_value(v) <= AGW_SCHEMA_MAX_INT)
        return changed;
    if (json_is_real(v)) {
        double d = json_real_value(v);
        /* Past JavaScript's exact integers the client refuses it; such a "timestamp" is no time
         * at all. */
        if (d >= -(double)AGW_SCHEMA_MAX_INT && d <= (double)AGW_SCHEMA_MAX_INT) {
            json_int_t t = (json_int_t)d;
            /* Stored as an integer even when unchanged, in case another rule re-serialises. */
            set_new(ev, "timestamp", json_integer(t));
            return changed || !ints_as_real || (double)t != d;
        }
    }
    json_object_del(ev, "timestamp");
    return true;
}

/* Whether the client accepts <ev> (agw_schema_check()); if not, the run ends with INVALID_EVENT
 * naming the member. Called before an upstream event is relayed, and before the bookkeeping its
 * relaying does. */
static bool schema_ok(struct agw_agui *a, const struct agw_agui_sink *out, const json_t *ev)
{
    char why[320];

    if (agw_schema_check(ev, why, sizeof(why)))
        return true;
    invalid_event(a, out, "%s", why);
    return false;
}

/* Sets <key> to <value> unless it holds exactly that string. Returns true if <ev> changed. */
static bool set_string_if_differs(json_t *ev, const char *key, const char *value)
{
    json_t *v = json_object_get(ev, key);

    if (json_is_string(v) && strcmp(json_string_value(v), value) == 0)
        return false;
    set_new(ev, key, json_string(value));
    return true;
}

static bool set_client_ids(const struct agw_agui *a, json_t *ev)
{
    bool changed = set_string_if_differs(ev, "threadId", a->thread_id);
    return set_string_if_differs(ev, "runId", a->run_id) || changed;
}

/* A RUN_ERROR code as a string: strings as they are, numbers written out, anything else NULL.
 * Returns a new reference. */
static json_t *code_string(json_t *v)
{
    char buf[64];

    if (json_is_string(v))
        return json_incref(v);
    if (json_is_integer(v)) {
        snprintf(buf, sizeof(buf), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return must(json_string(buf));
    }
    if (json_is_real(v)) {
        snprintf(buf, sizeof(buf), "%.17g", json_real_value(v));
        return must(json_string(buf));
    }
    return NULL;
}

/* Brings an upstream RUN_ERROR to {message: string, code?: string}: the CloudBase form
 * {error:{code,message}} (or error: "text") is translated, a numeric code becomes a string, a
 * missing message gets a generic one. Returns true if <ev> changed. */
static bool normalise_run_error(json_t *ev)
{
    json_t *err = json_object_get(ev, "error");
    json_t *msg = json_object_get(ev, "message");
    json_t *code = json_object_get(ev, "code");
    json_t *new_code = code_string(code);
    bool changed = false;

    if (!json_is_string(msg)) {
        json_t *m = json_is_object(err) ? json_object_get(err, "message") : err;
        if (json_is_string(m))
            set_new(ev, "message", json_incref(m));
        else
            set_new(ev, "message", json_string("upstream reported an error"));
        changed = true;
    }
    if (new_code == NULL && json_is_object(err))
        new_code = code_string(json_object_get(err, "code"));
    if (new_code != code) {
        if (new_code != NULL)
            set_new(ev, "code", new_code);
        else
            json_object_del(ev, "code");
        changed = true;
    } else {
        json_decref(new_code);
    }
    if (err != NULL) {
        json_object_del(ev, "error");
        changed = true;
    }
    return changed;
}

/* Rebuilds <ev> with "type" first when it is not (jansson keeps insertion order). Returns a new
 * reference. */
static json_t *type_first(json_t *ev)
{
    void *it = json_object_iter(ev);
    const char *key;
    json_t *v;
    json_t *copy;

    if (it != NULL && strcmp(json_object_iter_key(it), "type") == 0)
        return json_incref(ev);
    copy = must(json_object());
    set_new(copy, "type", json_incref(json_object_get(ev, "type")));
    json_object_foreach(ev, key, v)
    {
        if (strcmp(key, "type") != 0)
            set_new(copy, key, json_incref(v));
    }
    return copy;
}

/* Writes an upstream event: its own bytes when nothing changed, else re-serialised compact, "type"
 * first. */
static void write_upstream(struct agw_agui *a, const struct agw_agui_sink *out, json_t *ev,
                           const char *data, size_t len, bool changed)
{
    if (!changed) {
        write_frame(a, out, data, len);
        return;
    }
    json_t *o = type_first(ev);
    write_json(a, out, o);
    json_decref(o);
}

/* The TOOL_CALL_START "args" of the CloudBase dialect as a TOOL_CALL_ARGS delta; NULL when there is
 * nothing to send. The caller frees the result. */
static char *args_delta(json_t *args)
{
    char *s;

    if (json_is_string(args)) {
        if (json_string_length(args) == 0)
            return NULL;
        return agw_xstrndup(json_string_value(args), json_string_length(args));
    }
    s = json_dumps(args, AGUI_JSON_FLAGS | JSON_ENCODE_ANY);
    if (s == NULL)
        oom("json_dumps");
    return s;
}

/* ---- who opened each id ------------------------------------------------------------------------
 *
 * The official client remembers, for the whole run, who opened each message, tool call, reasoning
 * message and activity: the sub-agent run its "subagentRunId" names, or the agent itself (none).
 * An event that names one of those ids with a "subagentRunId" of another fails its run; so does a
 * tool call started under a message another one opened (doc/internals/agui.md, "Who opened an
 * id"). The run's table keeps the same facts, each id and opener as a 64-bit hash (two different
 * ids of one run collide with a chance of about 2^-64 per pair). */

enum owner_ns {
    OWN_MESSAGE = 1, /* text messages and tool results (the client's one table of messages) */
    OWN_TOOL_CALL,
    OWN_REASONING, /* reasoning spans and reasoning messages */
    OWN_ACTIVITY,
};

/* The namespace of an item of <kind>; 0: the client keeps no opener for it. */
static enum owner_ns owner_ns_of(enum item_kind kind)
{
    switch (kind) {
    case ITEM_TEXT_MESSAGE:
        return OWN_MESSAGE;
    case ITEM_TOOL_CALL:
        return OWN_TOOL_CALL;
    case ITEM_REASONING:
    case ITEM_REASONING_MESSAGE:
        return OWN_REASONING;
    case ITEM_STEP:
    case ITEM_SUBAGENT:
        break;
    }
    return 0;
}

static uint64_t owner_key(enum owner_ns ns, const char *id, size_t len)
{
    unsigned char b = (unsigned char)ns;
    uint64_t h = agw_hash_mix(agw_fnv1a(agw_fnv1a(AGW_FNV_INIT, &b, 1), id, len));

    return h != 0 ? h : 1;
}

/* The opener a "subagentRunId" of <len> bytes at <sub> names; NULL: the agent itself (0). */
static uint64_t owner_hash(const char *sub, size_t len)
{
    uint64_t h;

    if (sub == NULL)
        return 0;
    h = agw_hash_mix(agw_fnv1a(AGW_FNV_INIT, sub, len));
    return h != 0 ? h : 1;
}

/* The same for an event's (or a message's) "subagentRunId" member <sub>: none, or not a string,
 * names the agent itself. */
static uint64_t sub_owner(const json_t *sub)
{
    return json_is_string(sub) ? owner_hash(json_string_value(sub), json_string_length(sub)) : 0;
}

static struct owner_slot *owner_slots(struct agw_agui *a, uint32_t *cap)
{
    *cap = a->owners != NULL ? a->owners_cap : OWNERS_INLINE;
    return a->owners != NULL ? a->owners : a->owners_inline;
}

/* The slot of <key>, or the empty slot where it would go. */
static struct owner_slot *owner_probe(struct owner_slot *slots, uint32_t cap, uint64_t key)
{
    for (uint32_t i = (uint32_t)key & (cap - 1);; i = (i + 1) & (cap - 1))
        if (slots[i].key == key || slots[i].key == 0)
            return &slots[i];
}

/* The opener of <key>; false if the run never named it. */
static bool owner_get(struct agw_agui *a, uint64_t key, uint64_t *owner)
{
    uint32_t cap;
    struct owner_slot *slots = owner_slots(a, &cap);
    struct owner_slot *s = owner_probe(slots, cap, key);

    *owner = s->owner;
    return s->key != 0;
}

/* Records <owner> as the opener of <key>: the first one named (<replace> false), or this one
 * (true: a tool result's message, a snapshot). Past OWNERS_MAX ids a new id is not recorded (it
 * is then not checked). */
static void owner_set(struct agw_agui *a, uint64_t key, uint64_t owner, bool replace)
{
    uint32_t cap;
    struct owner_slot *slots = owner_slots(a, &cap);
    struct owner_slot *s = owner_probe(slots, cap, key);

    if (s->key == 0) {
        if (a->n_owners >= OWNERS_MAX)
            return;
        if ((a->n_owners + 1) * 4 > cap * 3) { /* at most three quarters full */
            uint32_t ncap = cap * 2;
            struct owner_slot *n = agw_xcalloc(ncap, sizeof(*n));
            for (uint32_t i = 0; i < cap; i++)
                if (slots[i].key != 0)
                    *owner_probe(n, ncap, slots[i].key) = slots[i];
            free(a->owners);
            a->owners = n;
            a->owners_cap = ncap;
            s = owner_probe(n, ncap, key);
        }
        s->key = key;
        a->n_owners++;
    } else if (!replace) {
        return;
    }
    s->owner = owner;
    if (owner != 0)
        a->sub_owners = true;
}

static const char *const ns_what[] = {
    [OWN_MESSAGE] = "message",
    [OWN_TOOL_CALL] = "tool call",
    [OWN_REASONING] = "reasoning message",
    [OWN_ACTIVITY] = "activity",
};

/* Whether event <type> naming <id> of <ns> may carry "subagentRunId" <sub> (a JSON value, or
 * NULL): yes without one, or when the id's opener is unknown or that sub-agent run. If not, the
 * run ends with INVALID_EVENT. */
static bool owner_ok(struct agw_agui *a, const struct agw_agui_sink *out, const char *type,
                     enum owner_ns ns, const char *id, size_t id_len, const json_t *sub)
{
    uint64_t owner;
    char ex[2][AGUI_EXCERPT + 4];

    if (!json_is_string(sub) || !owner_get(a, owner_key(ns, id, id_len), &owner) ||
        owner == sub_owner(sub))
        return true;
    invalid_event(a, out, "%s for %s \"%s\" with \"subagentRunId\" \"%s\": %s opened it", type,
                  ns_what[ns], excerpt(id, ex[0]), excerpt(json_string_value(sub), ex[1]),
                  owner == 0 ? "the agent itself (no sub-agent run)" : "another sub-agent run");
    return false;
}

/* The openers a start of <kind> (TEXT_MESSAGE_START, TOOL_CALL_START, REASONING_START,
 * REASONING_MESSAGE_START) names <id> with: checked, then recorded. False: the run ended. */
static bool owner_open(struct agw_agui *a, const struct agw_agui_sink *out, const json_t *ev,
                       enum item_kind kind, const char *id, size_t id_len)
{
    enum owner_ns ns = owner_ns_of(kind);
    const json_t *sub = json_object_get(ev, "subagentRunId"), *parent;
    uint64_t key, owner, mine, parent_owner;
    bool has_parent = false;
    char ex[3][AGUI_EXCERPT + 4];

    if (ns == 0)
        return true;
    key = owner_key(ns, id, id_len);
    mine = sub_owner(sub);
    if (kind == ITEM_TOOL_CALL && json_is_string(parent = json_object_get(ev, "parentMessageId")) &&
        owner_get(a, owner_key(OWN_MESSAGE, json_string_value(parent), json_string_length(parent)),
                  &parent_owner)) {
        /* a tool call belongs to the message that carries it */
        if (json_is_string(sub) && mine != parent_owner) {
            invalid_event(a, out,
                          "TOOL_CALL_START for tool call \"%s\" with \"subagentRunId\" \"%s\": "
                          "%s opened its parent message \"%s\"",
                          excerpt(id, ex[0]), excerpt(json_string_value(sub), ex[1]),
                          parent_owner == 0 ? "the agent itself (no sub-agent run)"
                                            : "another sub-agent run",
                          excerpt(json_string_value(parent), ex[2]));
            return false;
        }
        has_parent = true;
    }
    if (owner_get(a, key, &owner)) {
        if (!owner_ok(a, out, item_descs[kind].start, ns, id, id_len, sub))
            return false;
        if (has_parent && !json_is_string(sub) && parent_owner != owner) {
            invalid_event(a, out,
                          "TOOL_CALL_START for tool call \"%s\" under message \"%s\": the two "
                          "were opened by different sub-agent runs (or the agent itself)",
                          excerpt(id, ex[0]), excerpt(json_string_value(parent), ex[1]));
            return false;
        }
        return true;
    }
    owner_set(a, key, json_is_string(sub) || !has_parent ? mine : parent_owner, false);
    return true;
}

/* The openers a message of a MESSAGES_SNAPSHOT (<replace>) or of RUN_STARTED's input names: the
 * message's, and its tool calls'. */
static void owner_messages(struct agw_agui *a, const json_t *messages, bool replace)
{
    size_t i, j;
    const json_t *m, *tc;

    json_array_foreach(messages, i, m)
    {
        const json_t *id = json_object_get(m, "id");
        const char *role = json_string_value(json_object_get(m, "role"));
        uint64_t owner = sub_owner(json_object_get(m, "subagentRunId"));
        enum owner_ns ns = role == NULL                     ? OWN_MESSAGE
                           : strcmp(role, "reasoning") == 0 ? OWN_REASONING
                           : strcmp(role, "activity") == 0  ? OWN_ACTIVITY
                                                            : OWN_MESSAGE;

        if (!json_is_string(id))
            continue;
        owner_set(a, owner_key(ns, json_string_value(id), json_string_length(id)), owner, replace);
        json_array_foreach(json_object_get(m, "toolCalls"), j, tc)
        {
            const json_t *tid = json_object_get(tc, "id");
            if (json_is_string(tid))
                owner_set(a,
                          owner_key(OWN_TOOL_CALL, json_string_value(tid), json_string_length(tid)),
                          owner, replace);
        }
    }
}

/* What an event the rules above pass (<type>) says of the openers: recorded, or checked. False:
 * the run ended. */
static bool owner_pass(struct agw_agui *a, const struct agw_agui_sink *out, const json_t *ev,
                       const char *type)
{
    const json_t *sub = json_object_get(ev, "subagentRunId");
    const json_t *id =
        json_object_get(ev, type_is(type, "REASONING_ENCRYPTED_VALUE") ? "entityId" : "messageId");
    uint64_t owner = sub_owner(sub);

    if (type_is(type, "MESSAGES_SNAPSHOT")) {
        owner_messages(a, json_object_get(ev, "messages"), true);
        return true;
    }
    if (!json_is_string(id))
        return true;
    const char *s = json_string_value(id);
    size_t n = json_string_length(id);
    if (type_is(type, "TOOL_CALL_RESULT")) {
        owner_set(a, owner_key(OWN_MESSAGE, s, n), owner, true);
    } else if (type_is(type, "ACTIVITY_SNAPSHOT")) {
        owner_set(a, owner_key(OWN_ACTIVITY, s, n), owner,
                  !json_is_false(json_object_get(ev, "replace")));
    } else if (type_is(type, "ACTIVITY_DELTA")) {
        return owner_ok(a, out, type, OWN_ACTIVITY, s, n, sub);
    } else if (type_is(type, "REASONING_ENCRYPTED_VALUE")) {
        const char *subtype = json_string_value(json_object_get(ev, "subtype"));
        uint64_t ignored;
        enum owner_ns ns = subtype != NULL && strcmp(subtype, "tool-call") == 0 ? OWN_TOOL_CALL
                           : subtype != NULL && strcmp(subtype, "message") == 0 &&
                                   owner_get(a, owner_key(OWN_MESSAGE, s, n), &ignored)
                               ? OWN_MESSAGE
                               : OWN_REASONING;
        return owner_ok(a, out, type, ns, s, n, sub);
    }
    return true;
}

/* STEP_STARTED, TEXT_MESSAGE_START, TOOL_CALL_START, REASONING_START, REASONING_MESSAGE_START,
 * SUBAGENT_STARTED. */
static void on_open(struct agw_agui *a, const struct agw_agui_sink *out, json_t *ev,
                    enum item_kind kind, const char *data, size_t len, bool changed)
{
    const struct item_desc *d = &item_descs[kind];
    json_t *idv = json_object_get(ev, d->id_key), *parent;
    char *delta = NULL, *owned;
    char ex[2][AGUI_EXCERPT + 4];
    const char *key;
    size_t key_len;
    bool known;

    if (!json_is_string(idv)) {
        invalid_event(a, out, "%s without a string \"%s\"", d->start, d->id_key);
        return;
    }
    const char *id = json_string_value(idv);
    size_t id_len = json_string_length(idv);
    item_key(ev, kind, id, id_len, &key, &key_len, &owned);
    known = find_open(a, kind, key, key_len, NULL);
    if (known) {
        free(owned);
        return; /* duplicate start: the item is open already (or, a sub-agent run, was) */
    }
    /* A start without its role gets the only one it can have (a reasoning message's), or the
     * CloudBase dialect's (a text message's). */
    if ((kind == ITEM_TEXT_MESSAGE || kind == ITEM_REASONING_MESSAGE) &&
        json_object_get(ev, "role") == NULL) {
        set_new(ev, "role", json_string(kind == ITEM_TEXT_MESSAGE ? "assistant" : "reasoning"));
        changed = true;
    }
    if (!schema_ok(a, out, ev)) {
        free(owned);
        return;
    }
    if (kind == ITEM_SUBAGENT &&
        json_is_string(parent = json_object_get(ev, "parentSubagentRunId")) &&
        !find_open(a, ITEM_SUBAGENT, json_string_value(parent), json_string_length(parent), NULL)) {
        invalid_event(a, out,
                      "%s \"%s\": its parentSubagentRunId \"%s\" was not started in this run",
                      d->start, excerpt(id, ex[0]), excerpt(json_string_value(parent), ex[1]));
        return;
    }
    if (!owner_open(a, out, ev, kind, id, id_len)) {
        free(owned);
        return;
    }
    bool pushed = push_open(a, kind, key, key_len);
    free(owned);
    if (!pushed) {
        invalid_event(a, out, "%s \"%s\": over %d simultaneously open items (%d bytes of ids)",
                      d->start, excerpt(id, ex[0]), AGUI_MAX_OPEN, AGUI_MAX_OPEN_ID_BYTES);
        return;
    }
    if (kind == ITEM_TOOL_CALL) {
        json_t *args = json_object_get(ev, "args");
        if (args != NULL) {
            delta = args_delta(args);
            json_object_del(ev, "args");
            changed = true;
        }
    }
    begin(a, out);
    write_upstream(a, out, ev, data, len, changed);
    if (delta != NULL) {
        json_t *ae = new_event("TOOL_CALL_ARGS");
        set_new(ae, "toolCallId", json_string(id));
        set_new(ae, "delta", json_string(delta));
        write_generated(a, out, ae);
        free(delta);
    }
}

/* TEXT_MESSAGE_CONTENT, TOOL_CALL_ARGS, REASONING_MESSAGE_CONTENT. */
static void on_content(struct agw_agui *a, const struct agw_agui_sink *out, json_t *ev,
                       enum item_kind kind, const char *data, size_t len, bool changed)
{
    const struct item_desc *d = &item_descs[kind];
    json_t *idv = json_object_get(ev, d->id_key);
    json_t *delta = json_object_get(ev, "delta");
    char ex[AGUI_EXCERPT + 4];

    if (!json_is_string(idv)) {
        invalid_event(a, out, "%s without a string \"%s\"", d->content, d->id_key);
        return;
    }
    if (!find_open(a, kind, json_string_value(idv), json_string_length(idv), NULL)) {
        invalid_event(a, out, "%s for %s \"%s\", which is not open", d->content, d->id_key,
                      excerpt(json_string_value(idv), ex));
        return;
    }
    if (!json_is_string(delta)) {
        invalid_event(a, out, "%s for %s \"%s\" without a string \"delta\"", d->content, d->id_key,
                      excerpt(json_string_value(idv), ex));
        return;
    }
    if (json_string_length(delta) == 0 && kind != ITEM_TOOL_CALL)
        return; /* the official client rejected empty deltas before 1.0 */
    if (!schema_ok(a, out, ev) ||
        !owner_ok(a, out, d->content, owner_ns_of(kind), json_string_value(idv),
                  json_string_length(idv), json_object_get(ev, "subagentRunId")))
        return;
    begin(a, out);
    write_upstream(a, out, ev, data, len, changed);
}

/* TEXT_MESSAGE_END, TOOL_CALL_END, REASONING_END, REASONING_MESSAGE_END, STEP_FINISHED,
 * SUBAGENT_FINISHED, SUBAGENT_ERROR. */
static void on_close(struct agw_agui *a, const struct agw_agui_sink *out, json_t *ev,
                     enum item_kind kind, const char *data, size_t len, bool changed)
{
    const struct item_desc *d = &item_descs[kind];
    json_t *idv = json_object_get(ev, d->id_key);
    const char *key;
    size_t i, key_len;
    char *owned;
    bool open;

    if (!json_is_string(idv)) {
        invalid_event(a, out, "%s without a string \"%s\"",
                      json_string_value(json_object_get(ev, "type")), d->id_key);
        return;
    }
    item_key(ev, kind, json_string_value(idv), json_string_length(idv), &key, &key_len, &owned);
    open = find_open(a, kind, key, key_len, &i) && !a->open[i].done;
    free(owned);
    if (!open)
        return; /* nothing to close: already closed, or never opened */
    if (!schema_ok(a, out, ev))
        return;
    if (owner_ns_of(kind) != 0 &&
        !owner_ok(a, out, json_string_value(json_object_get(ev, "type")), owner_ns_of(kind),
                  json_string_value(idv), json_string_length(idv),
                  json_object_get(ev, "subagentRunId")))
        return;
    if (kind == ITEM_SUBAGENT)
        a->open[i].done = true; /* (its id may not start another) */
    else
        remove_open(a, i);
    begin(a, out);
    write_upstream(a, out, ev, data, len, changed);
}

/* ---- chunk streams -----------------------------------------------------------------------------
 *
 * TEXT_MESSAGE_CHUNK, TOOL_CALL_CHUNK and REASONING_MESSAGE_CHUNK stand for the start and content
 * events of an item whose end is implied. The normaliser expands them as the official client's
 * chunk transformation does, into the explicit events the rules above then take like any other:
 * the client (any client) sees no chunk, and the stream it sees is the one it would have made of
 * the chunks itself, or the run ends with INVALID_EVENT naming the chunk it would have failed on.
 * Chunks go in lanes, one per sub-agent run (a chunk's "subagentRunId"; none: the agent's own), a
 * lane holding at most one open stream; a chunk without an id continues its lane's. Events other
 * than chunks end the streams of their lane (all of them: the run's start and end, a messages
 * snapshot), before they are handled (doc/internals/agui.md, "Chunks"). */

static const char *lane_id(const struct chunk_lane *l)
{
    return json_string_value(json_object_get(l->start, item_descs[l->kind].id_key));
}

static bool same_lane(const char *x, const char *y)
{
    return x == NULL ? y == NULL : y != NULL && strcmp(x, y) == 0;
}

/* The stream open in lane <owner>, or NULL. */
static struct chunk_lane *lane_of(struct agw_agui *a, const char *owner)
{
    for (size_t i = 0; i < a->n_lanes; i++)
        if (same_lane(a->lanes[i].owner, owner))
            return &a->lanes[i];
    return NULL;
}

/* Ends the stream of lanes[<i>]: the end event of its item, then the rules of an end. */
static void lane_end(struct agw_agui *a, const struct agw_agui_sink *out, size_t i)
{
    struct chunk_lane l = a->lanes[i];
    const struct item_desc *d = &item_descs[l.kind];
    json_t *ev = new_event(d->end), *sub = json_object_get(l.start, "subagentRunId");

    set_new(ev, d->id_key, json_incref(json_object_get(l.start, d->id_key)));
    if (sub != NULL)
        set_new(ev, "subagentRunId", json_incref(sub));
    set_new(ev, "timestamp", json_integer((json_int_t)agw_wall_ms()));
    memmove(&a->lanes[i], &a->lanes[i + 1], (a->n_lanes - i - 1) * sizeof(*a->lanes));
    a->n_lanes--;
    a->lane_bytes -= l.owner != NULL ? strlen(l.owner) : 0;
    free(l.owner);
    json_decref(l.start);
    on_close(a, out, ev, l.kind, NULL, 0, true);
    json_decref(ev);
}

/* Ends the chunk streams <ev> (of <role>, <type>) ends in the client, before it is handled. */
static void end_lanes_before(struct agw_agui *a, const struct agw_agui_sink *out, const json_t *ev,
                             enum event_role role, enum item_kind kind, const char *type)
{
    json_t *sub = json_object_get(ev, "subagentRunId");
    struct chunk_lane *l;
    bool all = role == EV_RUN_STARTED || role == EV_RUN_FINISHED || role == EV_RUN_ERROR ||
               type_is(type, "MESSAGES_SNAPSHOT");
    /* (a sub-agent run's start ends none; its end, its own lane's; a type the protocol does not
     * have, none: the client drops it first) */
    bool own = kind == ITEM_SUBAGENT && (role == EV_OPEN || role == EV_CLOSE)
                   ? role == EV_CLOSE && sub != NULL
                   : role == EV_OPEN || role == EV_CONTENT || role == EV_CLOSE ||
                         type_is(type, "TOOL_CALL_RESULT") || type_is(type, "STATE_SNAPSHOT") ||
                         type_is(type, "STATE_DELTA") || type_is(type, "CUSTOM");

    if (all) {
        while (a->n_lanes > 0 && a->state != AGW_AGUI_ST_FINISHED)
            lane_end(a, out, 0); /* oldest first, as the client ends them */
    } else if (own && (sub == NULL || json_is_string(sub)) &&
               (l = lane_of(a, json_string_value(sub))) != NULL) {
        lane_end(a, out, (size_t)(l - a->lanes));
    }
}

/* The lane a chunk of <kind> naming <id> (may be NULL) and <sub> (may be NULL) goes to, as the
 * client chooses it: the lane of the stream of that id, or <sub>'s, or the only lane with a stream
 * of <kind>, or the agent's own. False (the run ended) where the client fails the run. */
static bool chunk_lane(struct agw_agui *a, const struct agw_agui_sink *out, enum item_kind kind,
                       const char *id, const char *sub, const char **owner)
{
    const struct item_desc *d = &item_descs[kind];
    char ex[2][AGUI_EXCERPT + 4];
    size_t n = 0;

    *owner = sub;
    if (id != NULL) {
        for (size_t i = 0; i < a->n_lanes; i++) {
            const struct chunk_lane *l = &a->lanes[i];
            if (l->kind != kind || strcmp(lane_id(l), id) != 0)
                continue;
            if (sub != NULL && !same_lane(sub, l->owner)) {
                invalid_event(
                    a, out, "%s for %s \"%s\" with \"subagentRunId\" \"%s\": its stream is %s%s%s",
                    d->chunk, d->what, excerpt(id, ex[0]), excerpt(sub, ex[1]),
                    l->owner != NULL ? "sub-agent run \"" : "the agent's own",
                    l->owner != NULL ? excerpt(l->owner, ex[0]) : "",
                    l->owner != NULL ? "\"'s" : "");
                return false;
            }
            *owner = l->owner;
            return true;
        }
        return true;
    }
    if (sub != NULL)
        return true;
    const struct chunk_lane *own = lane_of(a, NULL);
    if (own != NULL && own->kind == kind)
        return true;
    for (size_t i = 0; i < a->n_lanes; i++)
        if (a->lanes[i].kind == kind && n++ == 0)
            *owner = a->lanes[i].owner;
    if (n > 1) {
        invalid_event(a, out,
                      "%s without a \"%s\" or a \"subagentRunId\", while %zu sub-agent runs have a "
                      "%s open",
                      d->chunk, d->id_key, n, d->what);
        return false;
    }
    return true;
}

/* Whether a chunk continuing stream <l> agrees with its first chunk on <key>, as the client
 * requires; if not, the run ends with INVALID_EVENT. */
static bool chunk_agrees(struct agw_agui *a, const struct agw_agui_sink *out, const json_t *ev,
                         const struct chunk_lane *l, const char *key)
{
    const struct item_desc *d = &item_descs[l->kind];
    const char *v = json_string_value(json_object_get(ev, key));
    const char *was = json_string_value(json_object_get(l->start, key));
    char ex[3][AGUI_EXCERPT + 4];

    if (v == NULL || (was != NULL && strcmp(v, was) == 0))
        return true;
    invalid_event(a, out, "%s for %s \"%s\" with \"%s\" \"%s\": its first chunk had %s%s%s",
                  d->chunk, d->what, excerpt(lane_id(l), ex[0]), key, excerpt(v, ex[1]),
                  was != NULL ? "\"" : "none", was != NULL ? excerpt(was, ex[2]) : "",
                  was != NULL ? "\"" : "");
    return false;
}

/* <e> with the chunk <ev>'s "metadata" and "timestamp", and its "rawEvent" if <raw>; then handed to
 * the rules of its role. */
static void chunk_emit(struct agw_agui *a, const struct agw_agui_sink *out, json_t *e,
                       const json_t *ev, bool raw, enum event_role role, enum item_kind kind)
{
    static const char *const carried[] = {"metadata", "rawEvent", "timestamp"};

    for (size_t i = 0; i < AGW_ARRAY_LEN(carried); i++) {
        json_t *v = json_object_get(ev, carried[i]);
        if (v != NULL && (raw || i != 1))
            set_new(e, carried[i], json_incref(v));
    }
    if (role == EV_OPEN)
        on_open(a, out, e, kind, NULL, 0, true);
    else
        on_content(a, out, e, kind, NULL, 0, true);
    json_decref(e);
}

/* What a later chunk of a stream may not contradict of its first (the start event has it). */
static const char *const *agreed_keys(enum item_kind kind)
{
    static const char *const text[] = {"role", "name", NULL};
    static const char *const tool[] = {"toolCallName", "parentMessageId", NULL};
    static const char *const none[] = {NULL};

    return kind == ITEM_TEXT_MESSAGE ? text : kind == ITEM_TOOL_CALL ? tool : none;
}

/* A TEXT_MESSAGE_CHUNK, TOOL_CALL_CHUNK or REASONING_MESSAGE_CHUNK: continues the stream of its
 * lane (chunk_lane()) when it names that stream's item or none, else ends it and opens one; then
 * its delta is the item's content. */
static void on_chunk(struct agw_agui *a, const struct agw_agui_sink *out, json_t *ev,
                     enum item_kind kind)
{
    const struct item_desc *d = &item_descs[kind];
    const char *const *agreed = agreed_keys(kind);
    const char *id = json_string_value(json_object_get(ev, d->id_key));
    const char *sub = json_string_value(json_object_get(ev, "subagentRunId"));
    json_t *delta = json_object_get(ev, "delta"), *raw = json_object_get(ev, "rawEvent");
    const char *owner;
    struct chunk_lane *l;
    bool opened = false;
    char ex[AGUI_EXCERPT + 4];

    if (!schema_ok(a, out, ev) || !chunk_lane(a, out, kind, id, sub, &owner))
        return;
    l = lane_of(a, owner);
    if (l != NULL && l->kind == kind && (id == NULL || strcmp(id, lane_id(l)) == 0)) {
        for (size_t i = 0; agreed[i] != NULL; i++)
            if (!chunk_agrees(a, out, ev, l, agreed[i]))
                return;
    } else {
        size_t owner_len = owner != NULL ? strlen(owner) : 0;
        char *own;
        json_t *start, *v;

        if (id == NULL) {
            invalid_event(a, out, "%s without a \"%s\", and no %s open in its lane", d->chunk,
                          d->id_key, d->what);
            return;
        }
        if (kind == ITEM_TOOL_CALL && json_object_get(ev, "toolCallName") == NULL) {
            invalid_event(a, out, "%s opening %s \"%s\" without a \"toolCallName\"", d->chunk,
                          d->what, excerpt(id, ex));
            return;
        }
        if (l != NULL) { /* (the owner is the chunk's: never the ended stream's string) */
            lane_end(a, out, (size_t)(l - a->lanes));
            if (a->state == AGW_AGUI_ST_FINISHED)
                return;
        }
        if (a->n_lanes >= AGUI_MAX_OPEN || owner_len > AGUI_MAX_OPEN_ID_BYTES - a->lane_bytes) {
            invalid_event(a, out,
                          "%s \"%s\": over %d simultaneously open chunk streams (%d bytes of "
                          "sub-agent run ids)",
                          d->chunk, excerpt(id, ex), AGUI_MAX_OPEN, AGUI_MAX_OPEN_ID_BYTES);
            return;
        }
        /* The start the client makes of a first chunk: a text's role defaults to "assistant". */
        start = new_event(d->start);
        set_new(start, d->id_key, json_string(id));
        if (kind == ITEM_REASONING_MESSAGE)
            set_new(start, "role", json_string("reasoning"));
        else if (kind == ITEM_TEXT_MESSAGE && json_object_get(ev, "role") == NULL)
            set_new(start, "role", json_string("assistant"));
        for (size_t i = 0; agreed[i] != NULL; i++)
            if ((v = json_object_get(ev, agreed[i])) != NULL)
                set_new(start, agreed[i], json_incref(v));
        if ((v = json_object_get(ev, "subagentRunId")) != NULL)
            set_new(start, "subagentRunId", json_incref(v));
        own = owner != NULL ? agw_xstrndup(owner, owner_len) : NULL;
        a->lanes = agw_xrealloc(a->lanes, (a->n_lanes + 1) * sizeof(*a->lanes));
        a->lanes[a->n_lanes++] = (struct chunk_lane){own, start, kind};
        a->lane_bytes += owner_len;
        chunk_emit(a, out, must(json_copy(start)), ev, false, EV_OPEN, kind);
        if (a->state == AGW_AGUI_ST_FINISHED)
            return;
        l = &a->lanes[a->n_lanes - 1];
        opened = true;
    }
    if (delta != NULL || raw != NULL || (!opened && json_object_get(ev, "metadata") != NULL)) {
        /* (a chunk that only says something of its stream is an empty delta that says it) */
        json_t *c = new_event(d->content), *s;
        set_new(c, d->id_key, json_string(lane_id(l)));
        set_new(c, "delta", delta != NULL ? json_incref(delta) : json_string(""));
        if ((s = json_object_get(ev, "subagentRunId")) != NULL ||
            (s = json_object_get(l->start, "subagentRunId")) != NULL)
            set_new(c, "subagentRunId", json_incref(s));
        chunk_emit(a, out, c, ev, true, EV_CONTENT, kind);
    }
}

/* ---- fast path for content events --------------------------------------------------------------
 *
 * Most frames of a stream are TEXT_MESSAGE_CONTENT / TOOL_CALL_ARGS / REASONING_MESSAGE_CONTENT for
 * an open item, and need no change. For those a full jansson parse (a DOM, an allocation per value)
 * is most of the gateway's CPU, so a strict allocation-free scanner reads flat events first: one
 * object whose values are strings (plus an integer "timestamp"), valid JSON and valid UTF-8.
 * Anything else — nesting, other value types, escapes in the type or id, \u0000, lone surrogates,
 * duplicate known keys, a float timestamp, an id that is not open — goes to the full path, which
 * decides exactly as before. The fast path only ever writes the upstream's own bytes, which is what
 * the full path writes for such events. */

/* Members of a flat event the fast paths take; one with more goes to the full path. */
#define FLAT_MEMBERS 16

struct flat_event {
    struct agw_schema_span type;
    union {
        struct {
            struct agw_schema_span message_id, tool_call_id, step_name, delta, role, thread_id,
                run_id;
            /* relayed as it is; read so that a content event that has one is not offered to the
             * sink as plain content (agw_agui_emitting_content()): history reads it */
            struct agw_schema_span subagent_run_id;
        };
        struct agw_schema_span spans[AGW_N_SPANS]; /* the same, for agw_schema_flat_ok() */
    };
    const char *ts; /* the "timestamp" key (an integer's), or NULL */
    /* the members the spans do not hold ("type" and "timestamp" aside), for the schema's check of
     * the events that are not content; not cleared with the spans */
    size_t n_members;
    struct agw_schema_member members[FLAT_MEMBERS];
};

#define SPAN_AT(name, k)                                                                           \
    _Static_assert(offsetof(struct flat_event, name) ==                                            \
                       offsetof(struct flat_event, spans) + (k) * sizeof(struct agw_schema_span),  \
                   #name " is span " #k)
SPAN_AT(message_id, AGW_SPAN_MESSAGE_ID);
SPAN_AT(tool_call_id, AGW_SPAN_TOOL_CALL_ID);
SPAN_AT(step_name, AGW_SPAN_STEP_NAME);
SPAN_AT(delta, AGW_SPAN_DELTA);
SPAN_AT(role, AGW_SPAN_ROLE);
SPAN_AT(thread_id, AGW_SPAN_THREAD_ID);
SPAN_AT(run_id, AGW_SPAN_RUN_ID);
SPAN_AT(subagent_run_id, AGW_SPAN_SUBAGENT_RUN_ID);

/* Bytes that need no attention inside a JSON string: printable ASCII except '"' and '\\'. */
static const bool plain_char[256] = {
    [0x20] = 1,
    [0x21] = 1,
    [0x23 ... 0x5b] = 1,
    [0x5d ... 0x7f] = 1,
};

#if defined(__SSE2__)
/* Sixteen bytes at a time: the offset of the first that is '"', '\\', a control byte or non-ASCII
 * (the signed compare with 0x20 catches both), or 16 when there is none. */
static size_t plain_run(const unsigned char *p)
{
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m128i special = _mm_or_si128(
        _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
        _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)));
    unsigned mask = (unsigned)_mm_movemask_epi8(special);

    return mask != 0 ? (size_t)__builtin_ctz(mask) : 16;
}
#define PLAIN_RUN 16
#else
/* Eight bytes at a time (SWAR): 8 when none of them is '"', '\\', a control byte or non-ASCII,
 * else 0 (the byte loop finds which). The classic "has a zero byte" test finds '"' and '\\' after
 * an XOR; "has a byte below 0x20" is exact for ASCII bytes, and a byte of 0x80 or more fails
 * through its high bit anyway. */
#define ONES      0x0101010101010101ULL
#define HIGHS     0x8080808080808080ULL

static size_t plain_run(const unsigned char *p)
{
    uint64_t w, quote, backslash, control;

    memcpy(&w, p, sizeof(w));
    quote = w ^ (ONES * '"');
    backslash = w ^ (ONES * '\\');
    quote = (quote - ONES) & ~quote;
    backslash = (backslash - ONES) & ~backslash;
    control = (w - ONES * 0x20) & ~w;
    return ((quote | backslash | control | w) & HIGHS) == 0 ? 8 : 0;
}
#define PLAIN_RUN 8
#endif

#if defined(__SSE2__)
/* The ASCII digits <p> starts with, sixteen bytes at a time (timestamps are 13 to 16 digits). */
static size_t digit_run(const unsigned char *p, const unsigned char *e)
{
    size_t n = 0;

    while ((size_t)(e - p) - n >= 16) {
        /* a digit is a byte whose distance from '0' is under 10: moved down by 0x80, a signed
         * compare tells it */
        __m128i v = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + n)),
                                 _mm_set1_epi8((char)('0' + 0x80)));
        unsigned digits = (unsigned)_mm_movemask_epi8(_mm_cmplt_epi8(v, _mm_set1_epi8(10 - 0x80)));

        if (digits != 0xffff)
            return n + (size_t)__builtin_ctz(~digits);
        n += 16;
    }
    while (p + n < e && p[n] >= '0' && p[n] <= '9')
        n++;
    return n;
}
#else
static size_t digit_run(const unsigned char *p, const unsigned char *e)
{
    size_t n = 0;

    while (p + n < e && p[n] >= '0' && p[n] <= '9')
        n++;
    return n;
}
#endif

/* Scans a JSON string at *<pp> (on the opening quote). Returns false for anything the fast path
 * leaves to jansson. */
static bool scan_string(const char **pp, const char *end, struct agw_schema_span *out)
{
    const unsigned char *p = (const unsigned char *)*pp + 1, *e = (const unsigned char *)end;

    out->p = (const char *)p;
    out->escaped = false;
    while (p < e) {
        unsigned char c;
        /* Plain printable ASCII is the common case: skip it a block, then a byte, at a time. */
        while (e - p >= PLAIN_RUN) {
            size_t k = plain_run(p);

            p += k;
            if (k < PLAIN_RUN)
                break;
        }
        while (p < e && plain_char[*p])
            p++;
        if (p == e)
            break;
        c = *p;
        if (c == '"') {
            out->n = (size_t)((const char *)p - out->p);
            *pp = (const char *)p + 1;
            return true;
        }
        if (c < 0x20)
            return false;
        if (c == '\\') {
            out->escaped = true;
            if (p + 1 >= e)
                return false;
            c = p[1];
            if (c == 'u') {
                int v = 0;
                if (e - p < 6)
                    return false;
                for (int i = 2; i < 6; i++) {
                    int h = agw_hexval((char)p[i]);
                    if (h < 0)
                        return false;
                    v = v * 16 + h;
                }
                if (v == 0 || (v >= 0xd800 && v <= 0xdfff))
                    return false; /* NUL, surrogates: the full parser decides */
                p += 6;
            } else if (strchr("\"\\/bfnrt", c) != NULL && c != '\0') {
                p += 2;
            } else {
                return false;
            }
            continue;
        }
        if (c >= 0x80) {
            size_t n = agw_utf8_seq(p, e);
            if (n == 0)
                return false;
            p += n;
            continue;
        }
        p++;
    }
    return false;
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    return p;
}

static bool key_is(const struct agw_schema_span *k, const char *name)
{
    size_t n = strlen(name);
    return !k->escaped && k->n == n && memcmp(k->p, name, n) == 0;
}

/* Sets <slot> from <v> unless it was set already (a duplicate key: left to jansson). */
static bool take(struct agw_schema_span *slot, const struct agw_schema_span *v)
{
    if (slot->p != NULL)
        return false;
    *slot = *v;
    return true;
}

/* Records member <k> of <kind> (a string's <v>) in fe->members; false when it is full. */
static bool keep_member(struct flat_event *fe, const struct agw_schema_span *k,
                        enum agw_schema_flat kind, const struct agw_schema_span *v)
{
    if (fe->n_members == FLAT_MEMBERS)
        return false;
    fe->members[fe->n_members++] = (struct agw_schema_member){
        .key = k->p,
        .key_len = k->n,
        .kind = kind,
        .s = v != NULL && !v->escaped ? v->p : NULL,
        .n = v != NULL ? v->n : 0,
    };
    return true;
}

/* The members of a flat event from <*pp> (just past its '{', or past a ',' between members)
 * through its closing '}', *<pp> then past it: the string of each key the fast paths read into
 * <fe>, every other member but "timestamp" into fe->members (keep_member()), and where an integer
 * "timestamp" came in fe->ts (a second one is refused). */
static bool scan_members(const char **pp, const char *end, struct flat_event *fe)
{
    const char *p = *pp;

    for (;;) {
        struct agw_schema_span k, v;

        p = skip_ws(p, end);
        if (p == end || *p != '"' || !scan_string(&p, end, &k) || k.escaped)
            return false;
        p = skip_ws(p, end);
        if (p == end || *p++ != ':')
            return false;
        p = skip_ws(p, end);
        if (p == end)
            return false;
        /* Every event's "metadata" is an object: one that is not, the full path refuses. */
        if (key_is(&k, "metadata"))
            return false;
        if (*p == '"') {
            if (!scan_string(&p, end, &v))
                return false;
            if (key_is(&k, "type")            ? !take(&fe->type, &v)
                : key_is(&k, "messageId")     ? !take(&fe->message_id, &v)
                : key_is(&k, "toolCallId")    ? !take(&fe->tool_call_id, &v)
                : key_is(&k, "stepName")      ? !take(&fe->step_name, &v)
                : key_is(&k, "delta")         ? !take(&fe->delta, &v)
                : key_is(&k, "role")          ? !take(&fe->role, &v)
                : key_is(&k, "threadId")      ? !take(&fe->thread_id, &v)
                : key_is(&k, "runId")         ? !take(&fe->run_id, &v)
                : key_is(&k, "subagentRunId") ? !take(&fe->subagent_run_id, &v)
                : key_is(&k, "timestamp") || key_is(&k, "args")
                    ? true
                    : !keep_member(fe, &k, AGW_FLAT_STRING, &v))
                return false;
        } else if (key_is(&k, "type") || key_is(&k, "messageId") || key_is(&k, "toolCallId") ||
                   key_is(&k, "stepName") || key_is(&k, "delta") || key_is(&k, "role") ||
                   key_is(&k, "threadId") || key_is(&k, "runId") || key_is(&k, "subagentRunId") ||
                   key_is(&k, "args")) {
            /* Not a string where one is required (the full path says why), or a key the full path
             * acts on ("args" of a CloudBase TOOL_CALL_START). */
            return false;
        } else if ((*p >= '0' && *p <= '9') || *p == '-') {
            /* An integer member ("timestamp", a sequence number; at most 18 digits, so that jansson
             * reads it as an integer too) is relayed as it is by the full path too; fractions and
             * exponents are left to it (a float timestamp is rewritten). */
            const char *d = p + (*p == '-');
            bool ts = key_is(&k, "timestamp");
            if (ts && fe->ts != NULL)
                return false;
            if (ts)
                fe->ts = k.p;
            p = d + digit_run((const unsigned char *)d, (const unsigned char *)end);
            /* (a timestamp of 16 digits or more may be past the client's exact integers: the full
             * path decides) */
            if (p == d || (p - d > 1 && *d == '0') || p - d > (ts ? 15 : 18) ||
                (p < end && (*p == '.' || *p == 'e' || *p == 'E')) ||
                (!ts && !keep_member(fe, &k, AGW_FLAT_INT, NULL)))
                return false;
        } else if (key_is(&k, "timestamp")) {
            return false; /* not a number: the full path removes it */
        } else if (end - p >= 4 && memcmp(p, "true", 4) == 0) {
            p += 4;
            if (!keep_member(fe, &k, AGW_FLAT_BOOL, NULL))
                return false;
        } else if (end - p >= 5 && memcmp(p, "false", 5) == 0) {
            p += 5;
            if (!keep_member(fe, &k, AGW_FLAT_BOOL, NULL))
                return false;
        } else {
            return false; /* null (removed by the full path), objects, arrays, floats */
        }
        p = skip_ws(p, end);
        if (p == end)
            return false;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p++ != '}')
            return false;
        *pp = p;
        return true;
    }
}

static bool scan_flat_event(const char *data, size_t len, struct flat_event *fe)
{
    const char *p = data, *end = data + len;

    memset(fe, 0, offsetof(struct flat_event, members));
    p = skip_ws(p, end);
    if (p == end || *p++ != '{' || !scan_members(&p, end, fe))
        return false;
    return skip_ws(p, end) == end && fe->type.p != NULL && !fe->type.escaped;
}

/* Writes content event <data> (<len> bytes) of item <kind>, whose id and delta tokens (quotes
 * included) the fast path read, telling the sink about them (agw_agui_emitting_content()). */
static void emit_content(struct agw_agui *a, const struct agw_agui_sink *out, const char *data,
                         size_t len, enum item_kind kind, const char *id, size_t id_len,
                         const char *delta, size_t delta_len)
{
    a->has_emitting =
        kind == ITEM_TEXT_MESSAGE || kind == ITEM_TOOL_CALL || kind == ITEM_REASONING_MESSAGE;
    a->emitting = (struct agw_agui_content){.args = kind == ITEM_TOOL_CALL,
                                            .id = id,
                                            .id_len = id_len,
                                            .delta = delta,
                                            .delta_len = delta_len};
    write_frame(a, out, data, len);
    a->has_emitting = false;
}

/* The deltas of one message usually come with the same bytes before the delta, e.g.
 * {"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"…"}. When a frame starts with the bytes
 * of the last frame accepted below, everything before its delta is known good (the same type, the
 * same open item: the cache is dropped whenever another event is handled, so no item opened or
 * closed since), and only the delta and the closing '"}' are left to check. */
static bool fast_cached(struct agw_agui *a, const char *data, size_t len,
                        const struct agw_agui_sink *out)
{
    const char *p = data + a->cached_len - 1, *end = data + len; /* the delta's opening quote */
    struct agw_schema_span delta;

    if (len < a->cached_len + 2 || data[len - 1] != '}' ||
        memcmp(data, a->cached, a->cached_len) != 0 || !scan_string(&p, end - 1, &delta))
        return false;
    if (p != end - 1) {
        /* Members after the delta (a sequence number, the time the agent sent it): read as the
         * whole scan reads them. A key the fast paths read (a second delta, say) sends the event
         * to the whole scan, which knows what came before; a timestamp does not: the cached bytes
         * hold none (fast_content()), so it is the event's only one. */
        struct flat_event tail;

        memset(&tail, 0, offsetof(struct flat_event, members));
        p = skip_ws(p, end);
        if (p == end || *p++ != ',' || !scan_members(&p, end, &tail) || p != end ||
            tail.type.p != NULL || tail.message_id.p != NULL || tail.tool_call_id.p != NULL ||
            tail.step_name.p != NULL || tail.delta.p != NULL || tail.role.p != NULL ||
            tail.thread_id.p != NULL || tail.run_id.p != NULL || tail.subagent_run_id.p != NULL)
            return false;
    }
    a->cached_reads++;
    if (delta.n == 0 && a->cached_kind != ITEM_TOOL_CALL)
        return true; /* dropped, as the full path does */
    emit_content(a, out, data, len, a->cached_kind, data + a->cached_id_at, a->cached_id_len,
                 delta.p - 1, delta.n + 2);
    return true;
}

static bool span_is(const struct agw_schema_span *sp, const char *s)
{
    return sp->p != NULL && !sp->escaped && sp->n == strlen(s) && memcmp(sp->p, s, sp->n) == 0;
}

/* The id of an item of <kind> in a flat event: its unescaped string, or NULL. */
static const struct agw_schema_span *flat_id(const struct flat_event *fe, enum item_kind kind)
{
    const struct agw_schema_span *id = kind == ITEM_STEP        ? &fe->step_name
                                       : kind == ITEM_TOOL_CALL ? &fe->tool_call_id
                                                                : &fe->message_id;

    return id->p != NULL && !id->escaped ? id : NULL;
}

/* Whether an item's start or end is one the full path keys by more than its id (a sub-agent's step)
 * or checks more of (a sub-agent run). */
static bool per_agent(const struct flat_event *fe, enum item_kind kind)
{
    return kind == ITEM_SUBAGENT || (kind == ITEM_STEP && fe->subagent_run_id.p != NULL);
}

/* Writes <data>, the flat event <fe> a fast path read whole, unchanged, telling the sink its type
 * (agw_agui_emitting_type()). */
static void write_flat(struct agw_agui *a, const struct agw_agui_sink *out,
                       const struct flat_event *fe, const char *data, size_t len)
{
    a->emitting_type = fe->type.p;
    a->emitting_type_len = fe->type.n;
    write_frame(a, out, data, len);
    a->emitting_type = NULL;
}

/* owner_pass() for a flat event of <type> the full path would pass: false when the full path is to
 * take it. */
static bool fast_owner_pass(struct agw_agui *a, const struct flat_event *fe, const char *type)
{
    const struct agw_schema_span *sub = &fe->subagent_run_id;

    if (type_is(type, "TOOL_CALL_RESULT")) {
        if (fe->message_id.p == NULL || fe->message_id.escaped || (sub->p != NULL && sub->escaped))
            return false;
        owner_set(a, owner_key(OWN_MESSAGE, fe->message_id.p, fe->message_id.n),
                  owner_hash(sub->p, sub->n), true);
        return true;
    }
    /* (the others that name an opener: not flat, or checked there) */
    return !(sub->p != NULL && type_is(type, "REASONING_ENCRYPTED_VALUE")) &&
           !type_is(type, "ACTIVITY_SNAPSHOT") && !type_is(type, "ACTIVITY_DELTA") &&
           !type_is(type, "MESSAGES_SNAPSHOT");
}

/* The lifecycle events of a plain run (RUN_STARTED and RUN_FINISHED with the client's ids, starts
 * with everything the full path would add, ends of open items, other events while running) need no
 * change either: they are relayed raw, with the bookkeeping the full path does, and without
 * building a tree. Everything else (a rewrite, a drop, an error) is left to the full path, which
 * decides; test_agui runs the hostile streams both ways. Returns true when the frame was handled.
 */
static bool fast_lifecycle(struct agw_agui *a, const struct flat_event *fe, const char *data,
                           size_t len, const struct agw_agui_sink *out)
{
    enum item_kind kind = ITEM_STEP;
    const struct agw_schema_span *id;
    char type[32];
    size_t at;

    if (fe->type.n == 0 || fe->type.n >= sizeof(type))
        return false;
    memcpy(type, fe->type.p, fe->type.n);
    type[fe->type.n] = '\0';
    /* Nothing the client would refuse goes this way: the full path says what is wrong. */
    if (!agw_schema_flat_ok(fe->type.p, fe->type.n, fe->spans, fe->members, fe->n_members))
        return false;
    switch (classify(type, &kind)) {
    case EV_RUN_STARTED:
        if (a->state != AGW_AGUI_ST_IDLE || !span_is(&fe->thread_id, a->thread_id) ||
            !span_is(&fe->run_id, a->run_id))
            return false;
        write_flat(a, out, fe, data, len);
        set_state(a, AGW_AGUI_ST_RUNNING);
        return true;
    case EV_RUN_FINISHED:
        if (a->state != AGW_AGUI_ST_RUNNING || a->n_open > 0 ||
            !span_is(&fe->thread_id, a->thread_id) || !span_is(&fe->run_id, a->run_id))
            return false;
        write_flat(a, out, fe, data, len);
        finish(a, NULL, false);
        return true;
    case EV_OPEN:
        /* (a sub-agent's start, or any once a sub-agent opened something, has its opener checked
         * by the full path; here, the agent itself opens) */
        if (per_agent(fe, kind) ||
            (owner_ns_of(kind) != 0 && (fe->subagent_run_id.p != NULL || a->sub_owners)))
            return false;
        if (a->state != AGW_AGUI_ST_RUNNING || (id = flat_id(fe, kind)) == NULL ||
            ((kind == ITEM_TEXT_MESSAGE || kind == ITEM_REASONING_MESSAGE) && fe->role.p == NULL) ||
            find_open(a, kind, id->p, id->n, NULL) || !push_open(a, kind, id->p, id->n))
            return false;
        if (owner_ns_of(kind) != 0)
            owner_set(a, owner_key(owner_ns_of(kind), id->p, id->n), 0, false);
        write_flat(a, out, fe, data, len);
        return true;
    case EV_CLOSE:
        if (per_agent(fe, kind) || (owner_ns_of(kind) != 0 && fe->subagent_run_id.p != NULL))
            return false;
        if (a->state != AGW_AGUI_ST_RUNNING || (id = flat_id(fe, kind)) == NULL ||
            !find_open(a, kind, id->p, id->n, &at))
            return false;
        remove_open(a, at);
        write_flat(a, out, fe, data, len);
        return true;
    case EV_PASS:
        if (a->state != AGW_AGUI_ST_RUNNING || !fast_owner_pass(a, fe, type))
            return false;
        write_flat(a, out, fe, data, len);
        return true;
    case EV_RUN_ERROR:
    case EV_CONTENT:
    case EV_CHUNK:
        break;
    }
    return false;
}

/* The fast paths: content events, then lifecycle ones. Returns true when the frame was fully
 * handled here. */
static bool fast_content(struct agw_agui *a, const char *data, size_t len,
                         const struct agw_agui_sink *out)
{
    struct flat_event fe;
    enum item_kind kind;
    const struct agw_schema_span *id;
    size_t before_delta;

    if (a->cached_len > 0 && fast_cached(a, data, len, out))
        return true;
    a->cached_len = 0;
    if (len < 12 || !scan_flat_event(data, len, &fe)) /* (feed() stops after the end) */
        return false;
    if (a->state != AGW_AGUI_ST_RUNNING)
        return fast_lifecycle(a, &fe, data, len, out);
    if (fe.type.n == 20 && memcmp(fe.type.p, "TEXT_MESSAGE_CONTENT", 20) == 0)
        kind = ITEM_TEXT_MESSAGE;
    else if (fe.type.n == 14 && memcmp(fe.type.p, "TOOL_CALL_ARGS", 14) == 0)
        kind = ITEM_TOOL_CALL;
    else if (fe.type.n == 25 && memcmp(fe.type.p, "REASONING_MESSAGE_CONTENT", 25) == 0)
        kind = ITEM_REASONING_MESSAGE;
    else
        return fast_lifecycle(a, &fe, data, len, out);
    if ((id = flat_id(&fe, kind)) == NULL || fe.delta.p == NULL ||
        !find_open(a, kind, id->p, id->n, NULL))
        return false;
    if (fe.subagent_run_id.p != NULL) { /* may it say so (owner_ok())? */
        uint64_t owner;
        if (fe.subagent_run_id.escaped ||
            (owner_get(a, owner_key(owner_ns_of(kind), id->p, id->n), &owner) &&
             owner != owner_hash(fe.subagent_run_id.p, fe.subagent_run_id.n)))
            return false;
    }
    /* Remember the bytes before the delta: the next content event of the item likely starts with
     * them (an agent writes its events alike), and then only its delta and what follows it is
     * read (fast_cached()). Only when they hold the type and the id (and a subagentRunId, if any):
     * bytes before a delta written first name no item, and a frame starting with them may have no
     * type at all. Nor when they hold a timestamp: the one after a cached delta is then the
     * event's only one (and one before it changes from event to event). */
    before_delta = (size_t)(fe.delta.p - data);
    if (data[len - 1] == '}' && before_delta <= sizeof(a->cached) && fe.type.p < fe.delta.p &&
        id->p < fe.delta.p && (fe.subagent_run_id.p == NULL || fe.subagent_run_id.p < fe.delta.p) &&
        (fe.ts == NULL || fe.ts > fe.delta.p)) {
        memcpy(a->cached, data, before_delta);
        a->cached_len = before_delta;
        a->cached_kind = kind;
        a->cached_id_at = (size_t)(id->p - 1 - data);
        a->cached_id_len = id->n + 2;
    }
    if (fe.delta.n == 0 && kind != ITEM_TOOL_CALL)
        return true; /* dropped, as the full path does */
    emit_content(a, out, data, len, kind, id->p - 1, id->n + 2, fe.delta.p - 1, fe.delta.n + 2);
    return true;
}

/* ---- interface ------------------------------------------------------------------------------- */

struct agw_agui *agw_agui_new(const char *thread_id, const char *run_id, enum agw_protocol protocol)
{
    size_t nt, nr;
    struct agw_agui *a;

    /* The ids come from the parsed request or the gateway: not UTF-8 is a programming error. */
    assert(thread_id != NULL && run_id != NULL);
    assert(agw_utf8_valid(thread_id, strlen(thread_id)) && agw_utf8_valid(run_id, strlen(run_id)));
    nt = strlen(thread_id) + 1;
    nr = strlen(run_id) + 1;
    a = agw_xcalloc(1, sizeof(*a) + nt + nr);
    a->thread_id = memcpy((char *)(a + 1), thread_id, nt);
    a->run_id = memcpy(a->thread_id + nt, run_id, nr);
    /* An "ag-kit" backend's legacy events become AG-UI events first (agkit.h), then go through
     * the same rules as any backend's. */
    a->protocol = protocol;
    if (protocol == AGW_PROTO_AGKIT)
        a->agkit = agw_agkit_new(run_id);
    a->state = AGW_AGUI_ST_IDLE;
    return a;
}

bool agw_agui_emitting_content(const struct agw_agui *a, struct agw_agui_content *c)
{
    if (!a->has_emitting)
        return false;
    *c = a->emitting;
    return true;
}

bool agw_agui_emitting_type(const struct agw_agui *a, const char **type, size_t *len)
{
    if (a->emitting_type == NULL)
        return false;
    *type = a->emitting_type;
    *len = a->emitting_type_len;
    return true;
}

void agw_agui_free(struct agw_agui *a)
{
    if (a == NULL)
        return;
    for (size_t i = 0; i < a->n_open; i++)
        free(a->open[i].id);
    free(a->open);
    drop_lanes(a);
    free(a->owners);
    agw_agkit_free(a->agkit);
    free(a->outcome_buf);
    free(a);
}

static int feed_event(struct agw_agui *a, const char *data, size_t len,
                      const struct agw_agui_sink *out)
{
    json_t *ev = NULL;
    json_t *type;
    json_error_t jerr;
    bool ints_as_real = false;
    bool changed;
    enum event_role role;
    enum item_kind kind = ITEM_STEP;

    assert(data != NULL || len == 0);
    if (a->state == AGW_AGUI_ST_FINISHED)
        return 1;
    if (data == NULL)
        data = "";

    if (is_done_marker(data, len))
        return 0;
    if (a->n_lanes > 0)
        a->cached_len =
            0; /* the fast paths know nothing of chunk streams: every event may end one */
    else if (!a->slow_only && fast_content(a, data, len, out))
        return a->state == AGW_AGUI_ST_FINISHED;

    /* Flags 0: one JSON document (object or array) and nothing after it, valid UTF-8, no \u0000. */
    ev = json_loadb(data, len, 0, &jerr);
    if (ev == NULL && json_error_code(&jerr) == json_error_numeric_overflow) {
        /* An integer past 64 bits (a hash, a snowflake id in a snapshot) is valid JSON that
         * JavaScript reads as a double: parse again with every integer as a real, and relay the
         * bytes as they are. */
        ev = json_loadb(data, len, JSON_DECODE_INT_AS_REAL, &jerr);
        ints_as_real = true;
    }
    if (ev == NULL) {
        /* jansson may quote the offending bytes: keep the message printable ASCII. */
        for (char *p = jerr.text; *p != '\0'; p++)
            if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
                *p = '?';
        invalid_event(a, out, "upstream data is not a JSON event: %s (line %d, column %d)",
                      jerr.text, jerr.line, jerr.column);
        goto out;
    }
    if (!json_is_object(ev)) {
        invalid_event(a, out, "upstream event is not a JSON object");
        goto out;
    }
    type = json_object_get(ev, "type");
    if (!json_is_string(type) || json_string_length(type) == 0) {
        invalid_event(a, out, "upstream event without a non-empty string \"type\"");
        goto out;
    }

    changed = memchr(data, '\n', len) != NULL || memchr(data, '\r', len) != NULL;
    changed = sanitise(ev, ints_as_real) || changed;
    /* sanitise() removed no "type": it is a non-empty string. */
    role = classify(json_string_value(type), &kind);
    if (a->n_lanes > 0 && role != EV_CHUNK) {
        end_lanes_before(a, out, ev, role, kind, json_string_value(type));
        if (a->state == AGW_AGUI_ST_FINISHED)
            goto out;
    }
    switch (role) {
    case EV_RUN_STARTED:
        if (a->state != AGW_AGUI_ST_IDLE)
            break; /* one RUN_STARTED per run */
        changed = set_client_ids(a, ev) || changed;
        if (!schema_ok(a, out, ev))
            break;
        owner_messages(a, json_object_get(json_object_get(ev, "input"), "messages"), false);
        write_upstream(a, out, ev, data, len, changed);
        set_state(a, AGW_AGUI_ST_RUNNING);
        break;
    case EV_RUN_FINISHED:
        changed = set_client_ids(a, ev) || changed;
        if (!schema_ok(a, out, ev))
            break;
        begin(a, out);
        close_all(a, out, false);
        write_upstream(a, out, ev, data, len, changed);
        finish(a, NULL, false);
        break;
    case EV_RUN_ERROR: {
        changed = normalise_run_error(ev) || changed;
        /* The backend's error is worth more than its token counts: a "usage" the client would
         * refuse goes, the error stays. */
        if (json_object_get(ev, "usage") != NULL && !agw_schema_check(ev, NULL, 0)) {
            json_object_del(ev, "usage");
            changed = true;
        }
        if (!schema_ok(a, out, ev))
            break;
        begin(a, out);
        close_all(a, out, true);
        write_upstream(a, out, ev, data, len, changed);
        json_t *code = json_object_get(ev, "code");
        finish(a, json_is_string(code) ? json_string_value(code) : NULL, true);
        break;
    }
    case EV_OPEN:
        on_open(a, out, ev, kind, data, len, changed);
        break;
    case EV_CONTENT:
        on_content(a, out, ev, kind, data, len, changed);
        break;
    case EV_CLOSE:
        on_close(a, out, ev, kind, data, len, changed);
        break;
    case EV_CHUNK:
        on_chunk(a, out, ev, kind);
        break;
    case EV_PASS:
        if (!schema_ok(a, out, ev) || !owner_pass(a, out, ev, json_string_value(type)))
            break;
        begin(a, out);
        write_upstream(a, out, ev, data, len, changed);
        break;
    }

out:
    json_decref(ev);
    return a->state == AGW_AGUI_ST_FINISHED;
}

/* One event of the ag-kit translation: the gateway's bytes, never the upstream's frame. */
static void agkit_event(void *arg, const char *json, size_t len)
{
    struct agkit_feed *f = arg;

    feed_event(f->a, json, len, f->out);
}

int agw_agui_feed(struct agw_agui *a, const char *data, size_t len, const struct agw_agui_sink *out)
{
    int rc;

    if (a->agkit != NULL) {
        struct agkit_feed f = {a, out};
        if (a->state != AGW_AGUI_ST_FINISHED)
            agw_agkit_feed(a->agkit, data != NULL ? data : "", len, agkit_event, &f);
        return a->state == AGW_AGUI_ST_FINISHED;
    }
    a->fed = data;
    a->fed_len = len;
    rc = feed_event(a, data, len, out);
    a->fed = NULL; /* the bytes are the caller's: no event written later may claim them */
    return rc;
}

void agw_agui_set_fast_paths(struct agw_agui *a, bool on)
{
    a->slow_only = !on;
}

uint64_t agw_agui_cached_reads(const struct agw_agui *a)
{
    return a->cached_reads;
}

void agw_agui_end(struct agw_agui *a, const struct agw_agui_sink *out)
{
    if (a->state == AGW_AGUI_ST_FINISHED)
        return;
    if (a->agkit != NULL) { /* a legacy stream ends by ending: its text message is complete */
        struct agkit_feed f = {a, out};
        agw_agkit_end(a->agkit, agkit_event, &f);
    }
    if (message_open(a)) {
        run_error(a, out, AGW_AGUI_UPSTREAM_ERROR,
                  "upstream closed the stream in the middle of a message");
        return;
    }
    begin(a, out);
    close_all(a, out, false);
    json_t *ev = new_event("RUN_FINISHED");
    set_new(ev, "threadId", json_string(a->thread_id));
    set_new(ev, "runId", json_string(a->run_id));
    write_generated(a, out, ev);
    finish(a, NULL, false);
}

void agw_agui_fail(struct agw_agui *a, const char *code, const char *message,
                   const struct agw_agui_sink *out)
{
    run_error(a, out, code, message);
}

bool agw_agui_finished(const struct agw_agui *a)
{
    return a->state == AGW_AGUI_ST_FINISHED;
}

uint64_t agw_agui_events_out(const struct agw_agui *a)
{
    return a->events_out;
}

const char *agw_agui_outcome(const struct agw_agui *a)
{
    return a->state == AGW_AGUI_ST_FINISHED ? a->outcome : NULL;
}
