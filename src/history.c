/* Thread history: a thread's messages rebuilt from run inputs and relayed events, the way
 * @ag-ui/client rebuilds them (include/agw/history.h, doc/internals/history.md). */
#include "config.h"

#include <assert.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agw/capture.h"
#include "agw/history.h"
#include "agw/jsonpatch.h"
#include "agw/jscan.h"
#include "agw/schema.h"

#define DUMP_VERSION   1
#define LINEAR_MAX     8     /* messages a thread finds by a scan, without a table */
#define TEXT_CLOSE     "\"}" /* what ends a text message's JSON */
#define TEXT_CLOSE_LEN 2

/* A hash of bytes given in any number of pieces (the same bytes give the same hash however they
 * are split): blocks of 32 bytes, four lanes of eight bytes (little-endian) each multiplied and
 * mixed apart, so that the multiplications do not wait for each other; a block's partial start is
 * carried to the next piece. For comparing a shed text with a client's copy: the lengths must be
 * equal too. */
struct hs {
    uint64_t h[4];
    unsigned char carry[32];
    uint64_t len; /* bytes given; len % 32 of them wait in <carry> */
};

/* One message. Most are held as jansson values (<msg>); a text message made by the events
 * (TEXT_MESSAGE_START), and a run's input message whose bytes are the same form (raw_text_item()),
 * are held as their compact JSON text instead, while nothing but content deltas touches them:
 * {"id":…,"role":…,"content":"<content> without the closing
 * '"}', so that a delta is appended as its escaped bytes, without decoding or copying the content,
 * and a store writes the text as it is. The first operation that needs a jansson value (a tool call
 * added to it, a comparison with a different copy from a client, a page, a dump) parses the text
 * and the message is held as a value from then on.
 *
 * A text the store saved may be shed (agw_history_shed()): its first <text_base> bytes are then in
 * the store only, and <text> holds the rest, [text_base, text_len): what it grew by since, usually
 * nothing. The thread keeps their length and hash (<text_hs>), which is all a client's copy is
 * compared with; anything that needs the whole text reads them back through the thread's loader.
 * A saved value (without tool calls) may be shed the same way (<shed_value>): neither <msg> nor
 * <text>, its JSON (the dump the store wrote, <text_len> bytes, all of them shed) read back and
 * parsed when needed, its role kept in <text_role>. */
/* The roles the rules tell apart (the others are ROLE_OTHER). */
enum role { ROLE_OTHER, ROLE_ASSISTANT, ROLE_TOOL, ROLE_REASONING, ROLE_ACTIVITY };

struct item {
    json_t *msg;      /* owned; NULL while the message is held as <text> */
    char *text;       /* owned; NULL when held as <msg> (or shed with nothing since) */
    size_t text_len;  /* bytes of the text, without the closing '"}' */
    size_t text_base; /* held as text: bytes of it not in <text> (shed), <= saved_len */
    size_t text_cap;  /* >= text_len - text_base + TEXT_CLOSE_LEN + 1, or 0 with <text> NULL */
    /* The hash of the first <text_base> bytes: of a shed value, <value_hash>; of a shed text, the
     * hash going on in <text_hs> (owned; NULL while nothing is shed), out of the item since only
     * the texts shed need one; but a run's input message held as text, shed whole at once, has
     * its final hash in <value_hash> and no <text_hs> (shed_text()) */
    uint64_t value_hash;
    struct hs *text_hs;
    char *json; /* owned: <msg> as compact JSON (agw_history_message_json(), comparisons with
                   a client's copy); NULL until asked, freed when the message changes */
    size_t json_len;
    uint64_t pos;      /* position in the thread's life: h->dropped + its index */
    struct item *next; /* hash chain */
    /* What the store holds of it (agw_history_message_row()): <saved_parts> pieces (0: nothing
     * known), the first <saved_len> bytes of <text> when held as text. <whole>: it must be written
     * whole (made, moved, or its store's pieces are not a prefix of <text>); else a text changed
     * since is written as the piece it grew by. */
    size_t saved_len;
    uint32_t hash;   /* of the id (the index's buckets) */
    uint32_t id_len; /* the id is <strings> */
    unsigned saved_parts;
    unsigned char text_role; /* held as text (or a shed value): its enum role */
    bool has_run;            /* the run id follows the id in <strings> (item_run()) */
    bool text_ended; /* a TEXT_MESSAGE_END named it since its last delta (a hint for memory only:
                        shedding frees the buffer of an ended text, keeps a growing one's) */
    bool shed_value; /* a value, shed: see above */
    bool from_input; /* held as text since a run's input gave it (raw_text_item()): shed as a
                        value is, whatever its size, once saved and while nothing changed it */
    bool changed;    /* made, edited or moved since agw_history_mark_saved() */
    bool whole;
    char strings[]; /* the id, then the run id, each NUL-terminated */
};

/* The item's id (<id_len> bytes) and its run's id (NULL: no run known), in its block. */
static inline const char *item_id(const struct item *it)
{
    return it->strings;
}

static inline const char *item_run(const struct item *it)
{
    return it->has_run ? it->strings + it->id_len + 1 : NULL;
}

struct agw_history {
    struct item **items;       /* oldest first */
    agw_history_load_fn *load; /* reads a shed text's bytes back (agw_history_set_loader()) */
    void *load_arg;
    uint64_t load_errors; /* shed texts that could not be read back */
    size_t n, alloc;
    size_t max;            /* >= 1: at most this many items */
    struct item **buckets; /* items by id (each in one chain), once past LINEAR_MAX items */
    size_t n_buckets;      /* 0 (no table), or a power of two >= the number of items */
    /* While there is no table: items[i]->hash for each item, so that a scan for an id reads one
     * cache line rather than every item (a new message's id is looked for in them all). */
    uint32_t lin[LINEAR_MAX];
    size_t first_changed; /* no item below this index is changed */
    size_t shed_from;     /* no item below this index changed since agw_history_shed() looked */
    /* The positions a store holds in more than one piece (a text that grew across commits),
     * ascending: a message written whole at one of them drops the other pieces there, whichever
     * message they were of (messages move). As of the last agw_history_mark_saved(). */
    uint64_t *multi;
    size_t n_multi, multi_cap;
    uint64_t dropped, malformed;
    uint64_t values_parsed; /* input messages parsed (agw_history_values_parsed()) */
};

/* The out-of-memory policy (include/agw/common.h): abort. jansson's constructors fail only on
 * allocation when their strings are known to be valid UTF-8 (they all come from parsed JSON). */
static json_t *must(json_t *v)
{
    if (v == NULL)
        abort();
    return v;
}

static void must_ok(int rc)
{
    if (rc != 0)
        abort();
}

static const char *str_field(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* An optional string field: 0 with *<out> NULL when absent (or null), 0 with the string, or
 * -AGW_EINVAL when present with another type. */
static int opt_str_field(const json_t *o, const char *key, const char **out)
{
    const json_t *v = json_object_get(o, key);

    *out = NULL;
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return -AGW_EINVAL;
    *out = json_string_value(v);
    return 0;
}

static bool str_eq(const json_t *s, const char *v)
{
    const char *a = json_string_value(s);
    return a != NULL && strcmp(a, v) == 0;
}

static const char *msg_id(const json_t *m)
{
    return str_field(m, "id");
}

/* The hash of an id (the index's buckets). */
static uint32_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = agw_fnv1a(AGW_FNV_INIT, s, n);

    return (uint32_t)(h ^ (h >> 29));
}

/* ---- hashing bytes given in pieces --------------------------------------------------------- */

#define HS_MUL 0x9E3779B97F4A7C15ULL

/* Eight bytes as a little-endian number: one load where the CPU is little-endian. (The eight shifts
 * alone made GCC 12 at -O2 leave it a function, called four times per 32 bytes hashed.) */
static inline uint64_t hs_le64(const unsigned char *u)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t x;

    memcpy(&x, u, sizeof(x));
    return x;
#else
    return (uint64_t)u[0] | (uint64_t)u[1] << 8 | (uint64_t)u[2] << 16 | (uint64_t)u[3] << 24 |
           (uint64_t)u[4] << 32 | (uint64_t)u[5] << 40 | (uint64_t)u[6] << 48 |
           (uint64_t)u[7] << 56;
#endif
}

static void hs_block(struct hs *s, const unsigned char *u)
{
    for (int k = 0; k < 4; k++) {
        uint64_t h = (s->h[k] ^ hs_le64(u + 8 * k)) * HS_MUL;
        s->h[k] = h ^ (h >> 31);
    }
}

static void hs_update(struct hs *s, const char *p, size_t n)
{
    const unsigned char *u = (const unsigned char *)p;
    size_t have = (size_t)(s->len % 32);

    s->len += n;
    if (have > 0) {
        size_t k = 32 - have < n ? 32 - have : n;
        memcpy(s->carry + have, u, k);
        u += k;
        n -= k;
        if (have + k < 32)
            return;
        hs_block(s, s->carry);
    }
    if (n >= 32) { /* the lanes in registers for the bulk of the bytes */
        uint64_t h0 = s->h[0], h1 = s->h[1], h2 = s->h[2], h3 = s->h[3];
        for (; n >= 32; n -= 32, u += 32) {
            h0 = (h0 ^ hs_le64(u)) * HS_MUL;
            h1 = (h1 ^ hs_le64(u + 8)) * HS_MUL;
            h2 = (h2 ^ hs_le64(u + 16)) * HS_MUL;
            h3 = (h3 ^ hs_le64(u + 24)) * HS_MUL;
            h0 ^= h0 >> 31;
            h1 ^= h1 >> 31;
            h2 ^= h2 >> 31;
            h3 ^= h3 >> 31;
        }
        s->h[0] = h0;
        s->h[1] = h1;
        s->h[2] = h2;
        s->h[3] = h3;
    }
    if (n > 0)
        memcpy(s->carry, u, n);
}

static uint64_t hs_final(const struct hs *s)
{
    unsigned char last[32] = {0};
    struct hs t = *s;
    uint64_t h = t.len;

    memcpy(last, t.carry, (size_t)(t.len % 32));
    hs_block(&t, last);
    for (int k = 0; k < 4; k++)
        h = ((h ^ t.h[k]) * HS_MUL) ^ (h >> 29);
    return h ^ (h >> 31);
}

/* The final hash of <n> bytes given at once. */
static uint64_t hs_of(const char *p, size_t n)
{
    struct hs s = {0};

    hs_update(&s, p, n);
    return hs_final(&s);
}

/* The final hash of item <it>'s first <text_base> bytes (> 0). */
static uint64_t item_shed_hash(const struct item *it)
{
    assert(it->text_base > 0);
    return it->text_hs == NULL ? it->value_hash : hs_final(it->text_hs);
}

/* Item <it> has nothing shed. */
static void item_hs_clear(struct item *it)
{
    free(it->text_hs);
    it->text_hs = NULL;
    it->value_hash = 0;
}

/* ---- the text form ------------------------------------------------------------------------- */

/* Bytes of the text in memory (the rest is shed). */
static size_t text_mem(const struct item *it)
{
    return it->text_len - it->text_base;
}

/* Held as text (shed or not): a text message only content deltas have touched. */
static bool is_text(const struct item *it)
{
    return it->msg == NULL && !it->shed_value;
}

static void text_reserve(struct item *it, size_t more)
{
    size_t need = text_mem(it) + more + TEXT_CLOSE_LEN + 1;

    if (need <= it->text_cap)
        return;
    /* twice the size or just enough, whichever is more: a text is mostly made in a few big
     * appends (a coalesced line per hand-over), and the first makes it the size it often stays.
     * Not realloc(): a text's first append (a short answer's whole delta) moves it to another size
     * class, where jemalloc's realloc() takes its slow path; a copy of the bytes held is cheaper
     * (the writer's instructions per short run: 420 fewer). */
    size_t cap = need > 2 * it->text_cap ? need : 2 * it->text_cap;
    char *b = agw_xmalloc(cap);

    if (it->text != NULL) {
        memcpy(b, it->text, text_mem(it));
        free(it->text);
    }
    it->text = b;
    it->text_cap = cap;
}

static void text_put(struct item *it, const char *s, size_t n)
{
    it->text_ended = false;
    text_reserve(it, n);
    memcpy(it->text + text_mem(it), s, n);
    it->text_len += n;
}

/* Appends <s> (<n> bytes of valid UTF-8) as the body of a JSON string, escaped as jansson's
 * json_dumps() escapes it. */
static void text_put_escaped(struct item *it, const char *s, size_t n)
{
    size_t from = 0;

    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *e = esc;
        size_t elen = 2;

        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        text_put(it, s + from, i - from);
        from = i + 1;
        esc[0] = '\\';
        switch (c) {
        case '"':
        case '\\':
            esc[1] = (char)c;
            break;
        case '\b':
            esc[1] = 'b';
            break;
        case '\f':
            esc[1] = 'f';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            snprintf(esc, sizeof(esc), "\\u%04X", (unsigned)c);
            elen = 6;
            break;
        }
        text_put(it, e, elen);
    }
    text_put(it, s + from, n - from);
}

/* The text message's whole JSON (<text> closed in place; the room is always there). Not for a shed
 * text (text_whole() first). */
static const char *text_closed(const struct item *it, size_t *len)
{
    assert(it->text_base == 0);
    memcpy(it->text + it->text_len, TEXT_CLOSE, TEXT_CLOSE_LEN);
    it->text[it->text_len + TEXT_CLOSE_LEN] = '\0';
    *len = it->text_len + TEXT_CLOSE_LEN;
    return it->text;
}

/* A new value of the text message: what it holds, parsed. Not for a shed text. */
static json_t *text_parse(const struct item *it)
{
    size_t len;
    const char *s = text_closed(it, &len);

    /* made of a parsed id and role and of deltas that were valid string bodies: always valid */
    return must(json_loadb(s, len, 0, NULL));
}

/* The whole JSON of text message <it>, shed or not (or of a shed value), as a new NUL-terminated
 * block (*<len> bytes), or NULL when its shed bytes cannot be read back (counted; the caller says
 * so). */
static char *text_copy(struct agw_history *h, const struct item *it, size_t *len)
{
    char *stored = NULL, *b;
    size_t n = 0;

    if (it->text_base > 0) {
        if (h->load == NULL || h->load(h->load_arg, it->pos, &stored, &n) != 0 ||
            n < it->text_base) {
            free(stored);
            h->load_errors++;
            return NULL;
        }
        if (hs_of(stored, it->text_base) != item_shed_hash(it)) { /* not what was shed */
            free(stored);
            h->load_errors++;
            return NULL;
        }
    }
    if (it->shed_value) { /* the whole JSON, as stored */
        stored[it->text_len] = '\0';
        *len = it->text_len;
        return stored;
    }
    *len = it->text_len + TEXT_CLOSE_LEN;
    b = agw_xmalloc(*len + 1);
    if (it->text_base > 0)
        memcpy(b, stored, it->text_base);
    if (text_mem(it) > 0)
        memcpy(b + it->text_base, it->text, text_mem(it));
    memcpy(b + it->text_len, TEXT_CLOSE, TEXT_CLOSE_LEN);
    b[*len] = '\0';
    free(stored);
    return b;
}

/* Makes a shed text whole in memory again (before anything that needs its bytes or moves it: its
 * shed bytes are read back from the position the store holds them at). 0, or -AGW_EIO when they
 * cannot be read back (counted; the thread is then unreliable, agw_history_load_errors()). */
static int text_whole(struct agw_history *h, struct item *it)
{
    size_t len;
    char *b;

    if (it->msg != NULL || it->text_base == 0)
        return 0;
    if ((b = text_copy(h, it, &len)) == NULL)
        return -AGW_EIO;
    if (it->shed_value) { /* a value again: the JSON the store wrote, as it was */
        json_t *v = json_loadb(b, len, JSON_ALLOW_NUL, NULL);
        free(b);
        if (v == NULL) {
            h->load_errors++;
            return -AGW_EIO;
        }
        it->msg = v;
        it->shed_value = false;
        it->text_len = it->text_base = 0;
        item_hs_clear(it);
        return 0;
    }
    free(it->text);
    it->text = b;
    it->text_cap = len + 1;
    it->text_base = 0;
    item_hs_clear(it);
    return 0;
}

/* A shed text that cannot be read back: held from now on as the value {"id": <id>} (the thread is
 * unreliable and a store discards it, agw_history_load_errors()), so that every operation still
 * has a message to work on. */
static void text_lost(struct item *it)
{
    json_t *m = must(json_object());

    must_ok(json_object_set_new(m, "id", must(json_stringn(item_id(it), it->id_len))));
    free(it->text);
    it->text = NULL;
    it->text_len = it->text_base = it->text_cap = 0;
    item_hs_clear(it);
    it->shed_value = false;
    it->msg = m;
}

/* ---- items --------------------------------------------------------------------------------- */

/* A new item (changed) for message <id> (<id_len> bytes, no NUL among them) of run <run_id> (may
 * be NULL), both copied into its block. */
static struct item *item_new(const char *id, size_t id_len, const char *run_id)
{
    size_t run_len = run_id != NULL ? strlen(run_id) + 1 : 0;
    struct item *it = agw_xcalloc(1, offsetof(struct item, strings) + id_len + 1 + run_len);

    assert(id_len < UINT32_MAX); /* (an id is part of a request body or an event: far less) */
    memcpy(it->strings, id, id_len);
    it->strings[id_len] = '\0';
    it->id_len = (uint32_t)id_len;
    if (run_id != NULL) {
        memcpy(it->strings + id_len + 1, run_id, run_len);
        it->has_run = true;
    }
    it->hash = hash_bytes(id, id_len);
    it->changed = true;
    it->whole = true;
    return it;
}

static void item_free(struct item *it)
{
    json_decref(it->msg);
    free(it->text);
    free(it->text_hs);
    free(it->json);
    free(it);
}

/* The message as a jansson value, borrowed: a text message is parsed and held as a value from now
 * on (the same message, so not a change; if it changes, it is written whole). */
static json_t *item_msg(struct agw_history *h, struct item *it)
{
    if (it->msg == NULL && text_whole(h, it) != 0)
        text_lost(it);
    if (it->msg == NULL) {
        it->msg = text_parse(it);
        free(it->text);
        it->text = NULL;
        it->text_len = it->text_cap = 0;
        it->whole = true;
    }
    return it->msg;
}

/* A new value equal to the message, sharing nothing with it; a shed text is read back for it and
 * stays shed. NULL when it cannot be read back (counted). */
static json_t *item_copy(struct agw_history *h, const struct item *it)
{
    size_t len;
    char *b;
    json_t *v;

    if (it->msg != NULL)
        return must(json_deep_copy(it->msg));
    if (it->text_base == 0)
        return text_parse(it);
    if ((b = text_copy(h, it, &len)) == NULL)
        return NULL;
    v = json_loadb(b, len, it->shed_value ? JSON_ALLOW_NUL : 0, NULL);
    free(b);
    if (v == NULL)
        h->load_errors++; /* (a shed value's bytes passed the hash: cannot happen) */
    return v;
}

static enum role role_of(const char *role, size_t len)
{
    static const struct {
        const char *name;
        size_t len;
        enum role role;
    } roles[] = {{"assistant", 9, ROLE_ASSISTANT},
                 {"tool", 4, ROLE_TOOL},
                 {"reasoning", 9, ROLE_REASONING},
                 {"activity", 8, ROLE_ACTIVITY}};

    for (size_t i = 0; role != NULL && i < AGW_ARRAY_LEN(roles); i++)
        if (len == roles[i].len && memcmp(role, roles[i].name, len) == 0)
            return roles[i].role;
    return ROLE_OTHER;
}

/* The role of a message held as a value (a non-string role is ROLE_OTHER). */
static enum role value_role(const json_t *m)
{
    const json_t *role = json_object_get(m, "role");

    return role_of(json_string_value(role), json_string_length(role));
}

static enum role item_role(const struct item *it)
{
    return it->msg != NULL ? value_role(it->msg) : (enum role)it->text_role;
}

static bool item_is_assistant(const struct item *it)
{
    return item_role(it) == ROLE_ASSISTANT;
}

static bool item_is_tool(const struct item *it)
{
    return item_role(it) == ROLE_TOOL;
}

/* Item <i> changed (made or edited): a store writes it again. */
static void touch(struct agw_history *h, size_t i)
{
    struct item *it = h->items[i];

    it->changed = true;
    free(it->json);
    it->json = NULL;
    if (i < h->first_changed)
        h->first_changed = i;
}

/* Item <i> moved to another position: a store writes it whole there. */
static void touch_moved(struct agw_history *h, size_t i)
{
    touch(h, i);
    h->items[i]->whole = true;
}

/* ---- the index by id ----------------------------------------------------------------------- */

static struct item **bucket_of(const struct agw_history *h, uint32_t hash)
{
    return &h->buckets[hash & (h->n_buckets - 1)];
}

/* Puts <it> in the chain of its bucket. */
static void chain(struct agw_history *h, struct item *it)
{
    struct item **b = bucket_of(h, it->hash);

    it->next = *b;
    *b = it;
}

/* Indexes <it>, about to be one of the thread's items. A thread of at most LINEAR_MAX messages has
 * no table (a scan is as fast and costs no memory); past it, the table has at least as many buckets
 * as items. */
static void index_add(struct agw_history *h, struct item *it)
{
    if (h->n + 1 > h->n_buckets && h->n + 1 > LINEAR_MAX) {
        struct item **old = h->buckets;
        size_t old_n = h->n_buckets;

        h->n_buckets = old_n == 0 ? 2 * LINEAR_MAX : old_n * 2;
        h->buckets = agw_xcalloc(h->n_buckets, sizeof(*h->buckets));
        if (old_n == 0) {
            for (size_t i = 0; i < h->n; i++)
                chain(h, h->items[i]);
        }
        for (size_t i = 0; i < old_n; i++) {
            struct item *x, *next;
            for (x = old[i]; x != NULL; x = next) {
                next = x->next;
                chain(h, x);
            }
        }
        free(old);
    }
    if (h->n_buckets > 0)
        chain(h, it);
}

static void index_remove(struct agw_history *h, struct item *it)
{
    struct item **p;

    if (h->n_buckets == 0)
        return;
    p = bucket_of(h, it->hash);
    while (*p != it)
        p = &(*p)->next;
    *p = it->next;
}

static bool item_has_id(const struct item *it, uint32_t hash, const char *id, size_t len)
{
    return it->hash == hash && it->id_len == len && memcmp(item_id(it), id, len) == 0;
}

/* The index of the first message with id <id> (<len> bytes; the client's messages.find), or
 * SIZE_MAX. */
static size_t find_msgn(const struct agw_history *h, const char *id, size_t len)
{
    const struct item *best = NULL;
    uint32_t hash;

    if (h->n == 0)
        return SIZE_MAX;
    hash = hash_bytes(id, len);
    if (h->n_buckets == 0) {
        for (size_t i = 0; i < h->n; i++)
            if (h->lin[i] == hash && item_has_id(h->items[i], hash, id, len))
                return i;
        return SIZE_MAX;
    }
    for (const struct item *it = *bucket_of(h, hash); it != NULL; it = it->next)
        if (item_has_id(it, hash, id, len) && (best == NULL || it->pos < best->pos))
            best = it;
    return best != NULL ? (size_t)(best->pos - h->dropped) : SIZE_MAX;
}

static size_t find_msg(const struct agw_history *h, const char *id)
{
    return find_msgn(h, id, strlen(id));
}

/* The tool call with id <tc_id> in the first message whose toolCalls hold one, or NULL; its
 * message's index in *<at>. With <assistant_only>, only assistant messages count. A message held
 * as text has no tool calls. */
static json_t *find_tool_call(const struct agw_history *h, const char *tc_id, bool assistant_only,
                              size_t *at)
{
    for (size_t i = 0; i < h->n; i++) {
        const json_t *m = h->items[i]->msg;
        const json_t *calls = json_object_get(m, "toolCalls");
        size_t k;
        json_t *tc;

        if (!json_is_array(calls) || (assistant_only && !item_is_assistant(h->items[i])))
            continue;
        json_array_foreach(calls, k, tc)
        {
            if (str_eq(json_object_get(tc, "id"), tc_id)) {
                *at = i;
                return tc;
            }
        }
    }
    return NULL;
}

/* Takes <it> (owned) into position <at> (<= h->n); the items after it move (their positions
 * follow), but none is marked changed. */
static void place(struct agw_history *h, size_t at, struct item *it)
{
    assert(at <= h->n);
    /* the items after <at> move: a shed text is read back from where the store holds it first */
    for (size_t i = at; i < h->n; i++)
        if (text_whole(h, h->items[i]) != 0)
            text_lost(h->items[i]);
    index_add(h, it);
    if (h->n == h->alloc) {
        h->alloc = h->alloc ? h->alloc * 2 : 2; /* most cached threads are short */
        h->items = agw_xrealloc(h->items, h->alloc * sizeof(*h->items));
    }
    memmove(&h->items[at + 1], &h->items[at], (h->n - at) * sizeof(*h->items));
    h->items[at] = it;
    if (h->n_buckets == 0) { /* (index_add() made none: the items fit in <lin>) */
        memmove(&h->lin[at + 1], &h->lin[at], (h->n - at) * sizeof(*h->lin));
        h->lin[at] = it->hash;
    }
    h->n++;
    for (size_t i = at; i < h->n; i++)
        h->items[i]->pos = h->dropped + i;
}

/* Takes <it> (owned) into position <at> (<= h->n); it and the items after it are changed (a store
 * writes them at their new positions). May leave more than h->max items: callers trim() once their
 * operation is done, so that indices they hold stay valid. */
static void insert_at(struct agw_history *h, size_t at, struct item *it)
{
    place(h, at, it);
    for (size_t i = at; i < h->n; i++)
        touch_moved(h, i);
}

/* A message held as a value: takes <msg> (owned; an object with a string "id"). */
static struct item *msg_item(json_t *msg, const char *run_id)
{
    const char *id = msg_id(msg);
    struct item *it = item_new(id, strlen(id), run_id);

    it->msg = msg;
    return it;
}

/* What a message-making event copies onto the message it makes besides its id and role (each
 * NULL when the event has none): TEXT_MESSAGE_START's "name", and the "subagentRunId" of the
 * events that make messages. */
struct extras {
    const char *name, *subagent_run_id;
};

/* Reads <ev>'s extras (<with_name>: its "name" too): 0, or -AGW_EINVAL when one is there but not a
 * string (null is none). */
static int extras_of(const json_t *ev, bool with_name, struct extras *x)
{
    x->name = NULL;
    if (with_name && opt_str_field(ev, "name", &x->name) < 0)
        return -AGW_EINVAL;
    return opt_str_field(ev, "subagentRunId", &x->subagent_run_id);
}

/* Adds the extras <x> (may be NULL) to the message value <m>. */
static void extras_set(json_t *m, const struct extras *x)
{
    if (x != NULL && x->name != NULL)
        must_ok(json_object_set_new(m, "name", must(json_string(x->name))));
    if (x != NULL && x->subagent_run_id != NULL)
        must_ok(json_object_set_new(m, "subagentRunId", must(json_string(x->subagent_run_id))));
}

static void text_put_member(struct item *it, const char *name, const char *v, size_t len, bool raw)
{
    text_put(it, name, strlen(name));
    if (raw)
        text_put(it, v, len);
    else
        text_put_escaped(it, v, len);
}

/* A text message {"id":<id>,"role":<role>,…<x>,"content":""}, held as text. <id> and <role>
 * (<id_len> and <role_len> bytes, no NUL among them) are the strings' values (escaped here), or
 * with <raw> the bodies of JSON strings written without an escape (the same bytes); the extras <x>
 * (may be NULL; not with <raw>) are values. */
static struct item *text_item(const char *id, size_t id_len, const char *role, size_t role_len,
                              bool raw, const struct extras *x, const char *run_id)
{
    struct item *it = item_new(id, id_len, run_id);

    assert(x == NULL || !raw);
    text_reserve(it, 32 + id_len + role_len);
    text_put_member(it, "{\"id\":\"", id, id_len, raw);
    text_put_member(it, "\",\"role\":\"", role, role_len, raw);
    if (x != NULL && x->name != NULL)
        text_put_member(it, "\",\"name\":\"", x->name, strlen(x->name), false);
    if (x != NULL && x->subagent_run_id != NULL)
        text_put_member(it, "\",\"subagentRunId\":\"", x->subagent_run_id,
                        strlen(x->subagent_run_id), false);
    text_put(it, "\",\"content\":\"", 13);
    it->text_role = (unsigned char)role_of(role, role_len);
    return it;
}

static void append(struct agw_history *h, struct item *it)
{
    insert_at(h, h->n, it);
}

/* Drops the oldest items beyond h->max. */
static void trim(struct agw_history *h)
{
    size_t k;

    if (h->n <= h->max)
        return;
    k = h->n - h->max;
    for (size_t i = 0; i < k; i++) {
        index_remove(h, h->items[i]);
        item_free(h->items[i]);
    }
    memmove(&h->items[0], &h->items[k], h->max * sizeof(*h->items));
    if (h->n_buckets == 0)
        memmove(&h->lin[0], &h->lin[k], h->max * sizeof(*h->lin));
    h->n = h->max;
    h->dropped += k;
    h->first_changed = h->first_changed > k ? h->first_changed - k : 0;
    h->shed_from = h->shed_from > k ? h->shed_from - k : 0;
}

/* Replaces the message at <i> with <msg> (owned, with the same id); the item keeps its run id. */
static void replace_at(struct agw_history *h, size_t i, json_t *msg)
{
    struct item *it = h->items[i];

    json_decref(it->msg);
    free(it->text);
    it->text = NULL;
    it->text_len = it->text_base = it->text_cap = 0;
    item_hs_clear(it);
    it->shed_value = false;
    it->msg = msg;
    it->whole = true;
    touch(h, i);
}

/* Appends <delta> to the string <key> of <o>; a missing or non-string value counts as "" (the
 * client's `${typeof c.content == "string" ? c.content : ""}${delta}`). */
static void append_str(json_t *o, const char *key, const json_t *delta)
{
    const json_t *cur = json_object_get(o, key);
    size_t dlen = json_string_length(delta);
    size_t clen = json_is_string(cur) ? json_string_length(cur) : 0;
    char *buf;

    if (clen == 0) {
        must_ok(json_object_set_new(o, key,
                                    must(json_stringn_nocheck(json_string_value(delta), dlen))));
        return;
    }
    buf = agw_xmalloc(clen + dlen);
    memcpy(buf, json_string_value(cur), clen);
    memcpy(buf + clen, json_string_value(delta), dlen);
    /* both halves are valid UTF-8 (they were parsed), so is their concatenation */
    must_ok(json_object_set_new(o, key, must(json_stringn_nocheck(buf, clen + dlen))));
    free(buf);
}

/* Appends the string <delta> to the content of message <i>. */
static void append_content(struct agw_history *h, size_t i, const json_t *delta)
{
    struct item *it = h->items[i];

    if (it->shed_value && text_whole(h, it) != 0)
        text_lost(it);
    if (is_text(it))
        text_put_escaped(it, json_string_value(delta), json_string_length(delta));
    else
        append_str(it->msg, "content", delta);
    touch(h, i);
}

/* ---- metadata: what the client's mergeMetadata() does ---------------------------------------- */

/* Merges the object <in> into the "metadata" of the value <target>, key by key, the last write
 * winning, never recursing (an absent or non-object "metadata" counts as {}). 1 when it changed. */
static int meta_merge_value(json_t *target, const json_t *in)
{
    json_t *cur = json_object_get(target, "metadata"), *m, *v;
    const char *k;

    m = json_is_object(cur) ? must(json_copy(cur)) : must(json_object());
    json_object_foreach((json_t *)(uintptr_t)in, k, v)
    {
        must_ok(json_object_set_new(m, k, must(json_deep_copy(v))));
    }
    if (json_equal(cur, m)) {
        json_decref(m);
        return 0;
    }
    must_ok(json_object_set_new(target, "metadata", m));
    return 1;
}

/* The event <ev>'s "metadata", when it is an object, merged into the value <target>. 1 when it
 * changed. */
static int meta_merge_event(json_t *target, const json_t *ev)
{
    const json_t *in = json_object_get(ev, "metadata");

    return json_is_object(in) ? meta_merge_value(target, in) : 0;
}

/* The same for a message held as text, which stays text: its "metadata" member is written (or
 * replaced) before its "content", the last member, whose body goes on growing at the end; the
 * store's pieces are then no longer a prefix of it, so it is written whole next. A metadata that
 * does not change costs a parse of the member and a comparison; one that does, a copy of the
 * text. 1 when it changed; AGW_AGAIN when it is (or, its text lost, has become) a value or its
 * text is past the scanner's limits: merge into the value. */
static int meta_merge_text(struct agw_history *h, size_t i, const json_t *in)
{
    struct item *it = h->items[i];
    struct agw_jscan w;
    const char *key, *at = NULL, *from = NULL, *to = NULL;
    size_t klen, dlen, head, tail;
    json_t *holder;
    char *dump, *b;

    if (text_whole(h, it) != 0)
        text_lost(it); /* (a value from now on) */
    if (!is_text(it) || !agw_jscan_open(&w, it->text, it->text + it->text_len, 32, false))
        return AGW_AGAIN;
    while (at == NULL && agw_jscan_next(&w, &key, &klen) == 1) {
        const char *v = w.p;

        if (agw_streq_n(key, klen, "content")) {
            at = key - 1; /* the key's opening quote: the rest is the content, unterminated */
            break;
        }
        if (!agw_jscan_skip(&w))
            return AGW_AGAIN;
        if (agw_streq_n(key, klen, "metadata")) {
            from = v;
            to = w.p;
        }
    }
    if (at == NULL)
        return AGW_AGAIN;
    holder = must(json_object());
    if (from != NULL)
        must_ok(json_object_set_new(holder, "metadata",
                                    must(json_loadb(from, (size_t)(to - from), 0, NULL))));
    if (meta_merge_value(holder, in) == 0) {
        json_decref(holder);
        return 0;
    }
    dump = json_dumps(json_object_get(holder, "metadata"), JSON_COMPACT);
    json_decref(holder);
    if (dump == NULL)
        abort();
    dlen = strlen(dump);
    /* [text .. from) <dump> [to .. end), or [text .. at) "metadata":<dump>, [at .. end) */
    head = (size_t)((from != NULL ? from : at) - it->text);
    tail = it->text_len - (size_t)((from != NULL ? to : at) - it->text);
    it->text_cap = head + 12 + dlen + tail + TEXT_CLOSE_LEN + 1;
    b = agw_xmalloc(it->text_cap);
    memcpy(b, it->text, head);
    if (from == NULL) {
        memcpy(b + head, "\"metadata\":", 11);
        head += 11;
    }
    memcpy(b + head, dump, dlen);
    head += dlen;
    if (from == NULL)
        b[head++] = ',';
    memcpy(b + head, it->text + it->text_len - tail, tail);
    free(it->text);
    free(dump);
    it->text = b;
    it->text_len = head + tail;
    it->whole = true;
    touch(h, i);
    return 1;
}

/* The event <ev>'s "metadata", when it is an object, merged into message <i>'s. 1 when it
 * changed. */
static int meta_merge(struct agw_history *h, size_t i, const json_t *ev)
{
    const json_t *in = json_object_get(ev, "metadata");
    struct item *it = h->items[i];
    int rc;

    if (!json_is_object(in))
        return 0;
    if (it->msg == NULL && !it->shed_value && (rc = meta_merge_text(h, i, in)) != AGW_AGAIN)
        return rc;
    rc = meta_merge_value(item_msg(h, it), in);
    if (rc)
        touch(h, i);
    return rc;
}

/* The same into tool call <tc> of message <at>. */
static int meta_merge_call(struct agw_history *h, json_t *tc, size_t at, const json_t *ev)
{
    if (!meta_merge_event(tc, ev))
        return 0;
    touch(h, at);
    return 1;
}

/* TEXT_MESSAGE_END for message <id>: see text_ended. */
static void text_end(struct agw_history *h, const char *id, size_t len)
{
    size_t i = find_msgn(h, id, len);

    if (i == SIZE_MAX)
        return;
    h->items[i]->text_ended = true;
    if (i < h->shed_from) /* the next shedding frees its buffer */
        h->shed_from = i;
}

struct agw_history *agw_history_new(size_t max_messages)
{
    struct agw_history *h = agw_xcalloc(1, sizeof(*h));

    assert(max_messages >= 1);
    h->max = max_messages;
    return h;
}

void agw_history_free(struct agw_history *h)
{
    if (h == NULL)
        return;
    for (size_t i = 0; i < h->n; i++)
        item_free(h->items[i]);
    free(h->items);
    free(h->buckets);
    free(h->multi);
    free(h);
}

/* A message worth storing: an object with a string id. */
static bool valid_msg(const json_t *m)
{
    return json_is_object(m) && msg_id(m) != NULL;
}

/* One message of a run's input, for merge(): a JSON value given (<value>), or the bytes of one
 * (<raw>), parsed when first needed (<parsed>). */
struct elem {
    const json_t *value; /* borrowed; NULL: made from <raw> when needed */
    json_t *parsed;      /* owned: <raw> parsed */
    const char *raw;
    size_t raw_len;
    const char *id; /* the message's id, <id_len> bytes; NULL: not an object with a string id */
    size_t id_len;
};

/* The element's value: given, or parsed from its bytes when first asked for. The scanner read
 * them as jansson does (agw_capture_input_messages()): they parse. */
static const json_t *elem_value(struct agw_history *h, struct elem *e)
{
    if (e->value == NULL && e->parsed == NULL) {
        e->parsed = must(json_loadb(e->raw, e->raw_len, JSON_REJECT_DUPLICATES, NULL));
        h->values_parsed++;
    }
    return e->value != NULL ? e->value : e->parsed;
}

/* Whether message <it> is, byte for byte, the JSON text <raw> (<len> bytes): its text, or its
 * value's compact dump (made once, kept until the message changes). */
static bool item_is_bytes(struct item *it, const char *raw, size_t len)
{
    const char *j;
    size_t n;

    if (it->msg == NULL && it->text_base > 0) /* shed: its length, hash and the rest */
        return len == it->text_len + (it->shed_value ? 0 : TEXT_CLOSE_LEN) &&
               (text_mem(it) == 0 || memcmp(raw + it->text_base, it->text, text_mem(it)) == 0) &&
               (it->shed_value || memcmp(raw + it->text_len, TEXT_CLOSE, TEXT_CLOSE_LEN) == 0) &&
               hs_of(raw, it->text_base) == item_shed_hash(it);
    if (it->msg == NULL) {
        j = text_closed(it, &n);
    } else {
        if (it->json == NULL) {
            it->json = json_dumps(it->msg, JSON_COMPACT);
            if (it->json == NULL)
                abort(); /* the tree holds only valid values: only allocation can fail */
            it->json_len = strlen(it->json);
        }
        j = it->json;
        n = it->json_len;
    }
    return n == len && memcmp(j, raw, len) == 0;
}

/* The end of the JSON string at <p> (its opening quote) when every escape in it is one a compact
 * dump writes (\" \\ \b \f \n \r \t) and, if <plain>, none at all; else NULL. The bytes are a
 * string the scanner has read (valid UTF-8, no control byte): jansson reads the same characters and
 * writes them back as they are. A \u escape or \/ is written otherwise by a dump: not judged here.
 */
static const char *dumped_string_end(const char *p, const char *end, bool plain)
{
    if (p == end || *p++ != '"')
        return NULL;
    while (p < end) {
        const char *q = memchr(p, '"', (size_t)(end - p)), *b;
        if (q == NULL)
            return NULL;
        b = memchr(p, '\\', (size_t)(q - p));
        if (b == NULL)
            return q + 1;
        if (plain || b + 1 == end || strchr("\"\\bfnrt", b[1]) == NULL || b[1] == '\0')
            return NULL;
        p = b + 2;
    }
    return NULL;
}

/* raw_text_item() without a value: the same item, from the bytes alone, when they are
 * {"id":"…","role":"…","content":"…"} with no escape in the id and the role and only the escapes a
 * compact dump writes in the content, which is then what parsing them and dumping the value gives;
 * NULL when that is not so (raw_text_item() then judges from the value). A client's new message
 * (its user's turn) costs no value, no dump. */
static struct item *raw_text_item_bytes(const struct elem *e, const char *run_id)
{
    const char *p = e->raw, *end, *id, *role, *q;
    struct item *it;

    if (e->raw == NULL || e->raw_len < 7 + 8 + 11 + 2 || memcmp(p, "{\"id\":", 6) != 0)
        return NULL;
    end = e->raw + e->raw_len;
    id = p + 6;
    if ((q = dumped_string_end(id, end, true)) == NULL || end - q < 8 ||
        memcmp(q, ",\"role\":", 8) != 0)
        return NULL;
    role = q + 8;
    if ((q = dumped_string_end(role, end, true)) == NULL || end - q < 11 ||
        memcmp(q, ",\"content\":", 11) != 0)
        return NULL;
    if ((p = dumped_string_end(q + 11, end, false)) == NULL || end - p != 1 || *p != '}')
        return NULL;
    it = item_new(id + 1, (size_t)(role - 8 - id) - 2, run_id);
    text_put(it, e->raw, e->raw_len - TEXT_CLOSE_LEN);
    it->text_ended = true;
    it->from_input = true;
    it->text_role = (unsigned char)role_of(role + 1, (size_t)(q - role) - 2);
    return it;
}

/* A new item for input message <e> (value <v>) held as text, as a text message made by events is,
 * when its bytes are {"id":…,"role":…,"content":"…"} exactly as a compact dump of <v> writes them
 * (the form chat messages have; the members in that order, as a delta is appended to the text's
 * end): its text is those bytes, no value is kept. A message as jansson holds it costs about half a
 * kilobyte in eleven blocks (a user's "Hello"); held as text, the bytes and one block. NULL for any
 * other message (other members or another order, a structured content, spacing, other escapes):
 * held as a value. */
static struct item *raw_text_item(const struct elem *e, const json_t *v, const char *run_id)
{
    static const char *const order[] = {"id", "role", "content"};
    const json_t *id = json_object_get(v, "id"), *role = json_object_get(v, "role");
    struct agw_jscan w;
    const char *key;
    size_t key_len, k = 0;
    struct item *it = NULL;
    char *dump;
    int rc;

    if (e->raw == NULL || json_object_size(v) != 3 || !json_is_string(id) ||
        !json_is_string(role) || !json_is_string(json_object_get(v, "content")))
        return NULL;
    /* the members' order, from the bytes: id, role, content */
    if (!agw_jscan_open(&w, e->raw, e->raw + e->raw_len, 0, true))
        return NULL;
    while ((rc = agw_jscan_next(&w, &key, &key_len)) == 1)
        if (k == 3 || !agw_streq_n(key, key_len, order[k++]) || !agw_jscan_skip(&w))
            return NULL;
    if (rc != 0)
        return NULL;
    /* and every byte as a compact dump writes it */
    dump = json_dumps(v, JSON_COMPACT);
    if (dump == NULL)
        abort(); /* the tree holds only valid values: only allocation can fail */
    if (strlen(dump) == e->raw_len && memcmp(dump, e->raw, e->raw_len) == 0) {
        it = item_new(json_string_value(id), json_string_length(id), run_id);
        text_put(it, e->raw, e->raw_len - TEXT_CLOSE_LEN);
        it->text_ended = true;
        it->from_input = true;
        it->text_role = (unsigned char)value_role(v);
    }
    free(dump);
    return it;
}

/* Stores a copy of <e> under its id: replaces a known one that differs (returns 1, or 0 when equal)
 * or inserts it at <at> (SIZE_MAX = at the end; returns 1). The index it ended at goes to *<where>.
 */
static int put(struct agw_history *h, struct elem *e, const char *run_id, size_t at, size_t *where)
{
    size_t i = find_msgn(h, e->id, e->id_len);
    const json_t *v;
    struct item *it;

    if (i != SIZE_MAX) {
        *where = i;
        /* the bytes the thread holds are the bytes sent: no value needed to know they are equal */
        if ((e->raw != NULL && item_is_bytes(h->items[i], e->raw, e->raw_len)) ||
            json_equal(item_msg(h, h->items[i]), (v = elem_value(h, e))))
            return 0;
        replace_at(h, i, e->parsed != NULL ? json_incref(e->parsed) : must(json_deep_copy(v)));
        return 1;
    }
    if (at == SIZE_MAX)
        at = h->n;
    if ((it = raw_text_item_bytes(e, run_id)) == NULL &&
        (it = raw_text_item(e, v = elem_value(h, e), run_id)) == NULL)
        it = msg_item(e->parsed != NULL ? json_incref(e->parsed) : must(json_deep_copy(v)), run_id);
    insert_at(h, at, it);
    *where = at;
    return 1;
}

/* agw_history_merge_input() of the <n> messages <elems>. */
static int merge(struct agw_history *h, const char *run_id, struct elem *elems, size_t n)
{
    size_t first_new = SIZE_MAX, where;
    bool anchored = false;
    int changed = 0;

    for (size_t k = 0; k < n; k++) {
        struct elem *m = &elems[k];
        size_t at;

        if (m->id == NULL) {
            h->malformed++;
            continue;
        }
        if (anchored) {
            changed += put(h, m, run_id, SIZE_MAX, &where);
            continue;
        }
        at = find_msgn(h, m->id, m->id_len);
        if (at == SIZE_MAX) {
            /* new, before any known message: placed once the first known one is found */
            if (first_new == SIZE_MAX)
                first_new = k;
            continue;
        }
        /* the first known message: the new ones given before it go just before it */
        anchored = true;
        for (size_t j = first_new; j < k; j++) {
            if (elems[j].id != NULL) {
                changed += put(h, &elems[j], run_id, at, &where);
                at = where + 1;
            }
        }
        changed += put(h, m, run_id, SIZE_MAX, &where);
    }
    if (!anchored && first_new != SIZE_MAX) {
        for (size_t j = first_new; j < n; j++)
            if (elems[j].id != NULL)
                changed += put(h, &elems[j], run_id, SIZE_MAX, &where);
    }
    trim(h);
    return changed;
}

int agw_history_merge_input(struct agw_history *h, const char *run_id, const json_t *messages)
{
    size_t n;
    struct elem *elems;
    int changed;

    if (!json_is_array(messages)) {
        h->malformed++;
        return -AGW_EINVAL;
    }
    n = json_array_size(messages);
    elems = agw_xcalloc(n > 0 ? n : 1, sizeof(*elems));
    for (size_t k = 0; k < n; k++) {
        const json_t *m = json_array_get(messages, k);
        elems[k].value = m;
        if (valid_msg(m)) {
            elems[k].id = msg_id(m);
            elems[k].id_len = strlen(elems[k].id);
        }
    }
    changed = merge(h, run_id, elems, n);
    free(elems);
    return changed;
}

/* A run's input read by the scanner: its messages' bytes and ids. */
struct scanned {
    struct agw_history *h;
    struct elem *v;
    size_t n, cap;
};

static bool scanned_one(void *arg, const char *msg, size_t msg_len, const char *id, size_t id_len)
{
    struct scanned *sc = arg;
    struct elem *e;

    if (sc->n == sc->cap) {
        sc->cap = sc->cap > 0 ? sc->cap * 2 : 16;
        sc->v = agw_xrealloc(sc->v, sc->cap * sizeof(*sc->v));
    }
    e = &sc->v[sc->n++];
    memset(e, 0, sizeof(*e));
    e->raw = msg;
    e->raw_len = msg_len;
    e->id = id;
    e->id_len = id_len;
    return true;
}

int agw_history_merge_body(struct agw_history *h, const char *run_id, const char *body, size_t len)
{
    struct scanned sc = {h, NULL, 0, 0};
    json_t *root;
    int changed = 0;

    /* Read by the scanner as jansson would read it: the messages the thread holds already, byte
     * for byte, need no value; the others are parsed one by one. */
    if (agw_capture_input_messages(body, len, scanned_one, &sc)) {
        changed = merge(h, run_id, sc.v, sc.n);
        for (size_t k = 0; k < sc.n; k++)
            json_decref(sc.v[k].parsed);
        free(sc.v);
        return changed;
    }
    free(sc.v);
    root = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
    if (root == NULL)
        return -AGW_EINVAL;
    if (json_object_get(root, "messages") != NULL)
        changed = agw_history_merge_input(h, run_id, json_object_get(root, "messages"));
    json_decref(root);
    return changed < 0 ? 0 : changed;
}

int agw_history_merge_read(struct agw_history *h, const char *run_id, const char *body,
                           const struct agw_input_message *m, size_t n)
{
    struct elem one[8], *elems = n <= AGW_ARRAY_LEN(one) ? one : agw_xcalloc(n, sizeof(*elems));
    int changed;

    for (size_t k = 0; k < n; k++)
        elems[k] = (struct elem){.raw = body + m[k].off,
                                 .raw_len = m[k].len,
                                 .id = body + m[k].id_off,
                                 .id_len = m[k].id_len};
    changed = merge(h, run_id, elems, n);
    for (size_t k = 0; k < n; k++)
        json_decref(elems[k].parsed);
    if (elems != one)
        free(elems);
    return changed;
}

/* The event's metadata merged into message <id> (none: 0), unless it is an activity message (the
 * client skips those for text and reasoning events). */
static int meta_merge_at(struct agw_history *h, const char *id, const json_t *ev)
{
    size_t i = find_msg(h, id);

    if (i == SIZE_MAX || item_role(h->items[i]) == ROLE_ACTIVITY)
        return 0;
    return meta_merge(h, i, ev);
}

/* Appends the text message <id> (see text_item()) unless the id exists: 1, or 0. */
static int text_start(struct agw_history *h, const char *run_id, const char *id, size_t id_len,
                      const char *role, size_t role_len, bool raw, const struct extras *x)
{
    if (find_msgn(h, id, id_len) != SIZE_MAX)
        return 0;
    append(h, text_item(id, id_len, role, role_len, raw, x, run_id));
    return 1;
}

/* TEXT_MESSAGE_START: {id, role (default "assistant"), content: "", name?, subagentRunId?} unless
 * the id exists. */
static int on_text_start(struct agw_history *h, const char *run_id, const json_t *ev)
{
    const char *id = str_field(ev, "messageId"), *role;
    struct extras x;

    if (id == NULL || opt_str_field(ev, "role", &role) < 0 || extras_of(ev, true, &x) < 0)
        return -AGW_EINVAL;
    return text_start(h, run_id, id, strlen(id), role ? role : "assistant", role ? strlen(role) : 9,
                      false, &x) |
           meta_merge_at(h, id, ev);
}

/* REASONING_MESSAGE_START: {id, role: "reasoning", content: "", subagentRunId?} unless the id
 * exists (the event's own role or name, if any, is not read). */
static int on_reasoning_start(struct agw_history *h, const char *run_id, const json_t *ev)
{
    const char *id = str_field(ev, "messageId");
    struct extras x;

    if (id == NULL || extras_of(ev, false, &x) < 0)
        return -AGW_EINVAL;
    return text_start(h, run_id, id, strlen(id), "reasoning", 9, false, &x) |
           meta_merge_at(h, id, ev);
}

/* TEXT_MESSAGE_CONTENT, REASONING_MESSAGE_CONTENT: appends the delta to the message's content
 * (an activity message is left alone). */
static int on_text_content(struct agw_history *h, const json_t *ev)
{
    const char *id = str_field(ev, "messageId");
    const json_t *delta = json_object_get(ev, "delta");
    size_t i;

    if (id == NULL || !json_is_string(delta))
        return -AGW_EINVAL;
    i = find_msg(h, id);
    if (i == SIZE_MAX || item_role(h->items[i]) == ROLE_ACTIVITY)
        return 0;
    append_content(h, i, delta);
    meta_merge(h, i, ev);
    return 1;
}

/* TOOL_CALL_START: {id, type: "function", function: {name, arguments: ""}} added to the assistant
 * message named by parentMessageId; else to a new assistant message whose id is parentMessageId
 * when given and unknown, or the tool call's id (no parent, or a parent that is not an assistant).
 * A call id some message holds already is not added again: that call takes the name given. */
static int on_tool_start(struct agw_history *h, const char *run_id, const json_t *ev)
{
    const char *tc_id = str_field(ev, "toolCallId"), *name = str_field(ev, "toolCallName");
    const char *parent;
    json_t *target = NULL, *calls, *tc;
    size_t i = SIZE_MAX, at = SIZE_MAX;
    struct extras x;

    if (tc_id == NULL || name == NULL || opt_str_field(ev, "parentMessageId", &parent) < 0 ||
        extras_of(ev, false, &x) < 0)
        return -AGW_EINVAL;
    if ((target = find_tool_call(h, tc_id, false, &i)) != NULL) {
        json_t *fn = json_object_get(target, "function");
        int rc = meta_merge_call(h, target, i, ev);
        if (!json_is_object(fn) || str_eq(json_object_get(fn, "name"), name))
            return rc;
        must_ok(json_object_set_new(fn, "name", must(json_string(name))));
        touch(h, i);
        return 1;
    }
    i = SIZE_MAX;
    if (parent != NULL) {
        i = find_msg(h, parent);
        if (i != SIZE_MAX && item_is_assistant(h->items[i])) {
            target = item_msg(h, h->items[i]);
            touch(h, i);
            at = i;
        }
    }
    if (target == NULL) {
        const char *id = parent != NULL && i == SIZE_MAX ? parent : tc_id;
        target = must(json_pack("{s:s, s:s, s:[]}", "id", id, "role", "assistant", "toolCalls"));
        extras_set(target, &x); /* (a message it made only) */
        append(h, msg_item(target, run_id));
        at = h->n - 1;
    }
    calls = json_object_get(target, "toolCalls");
    if (!json_is_array(calls)) {
        calls = must(json_array());
        must_ok(json_object_set_new(target, "toolCalls", calls));
    }
    tc = must(json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", tc_id, "type", "function", "function",
                        "name", name, "arguments", ""));
    must_ok(json_array_append_new(calls, tc));
    meta_merge_call(h, tc, at, ev);
    return 1;
}

/* TOOL_CALL_ARGS: appends the delta to the call's function.arguments. */
static int on_tool_args(struct agw_history *h, const json_t *ev)
{
    const char *tc_id = str_field(ev, "toolCallId");
    const json_t *delta = json_object_get(ev, "delta");
    json_t *tc, *fn;
    size_t at;

    if (tc_id == NULL || !json_is_string(delta))
        return -AGW_EINVAL;
    tc = find_tool_call(h, tc_id, false, &at);
    fn = json_object_get(tc, "function");
    if (!json_is_object(fn))
        return 0;
    append_str(fn, "arguments", delta);
    touch(h, at);
    meta_merge_call(h, tc, at, ev);
    return 1;
}

/* TOOL_CALL_END: the event's metadata merged into the call's. */
static int on_tool_end(struct agw_history *h, const json_t *ev)
{
    const char *tc_id = str_field(ev, "toolCallId");
    json_t *tc;
    size_t at;

    if (tc_id == NULL)
        return -AGW_EINVAL;
    tc = find_tool_call(h, tc_id, false, &at);
    return tc != NULL ? meta_merge_call(h, tc, at, ev) : 0;
}

/* TOOL_CALL_RESULT: {id: messageId, role: "tool", toolCallId, content} right after the assistant
 * message that owns the call and the tool messages already after it; at the end when none owns it.
 */
static int on_tool_result(struct agw_history *h, const char *run_id, const json_t *ev)
{
    const char *id = str_field(ev, "messageId"), *tc_id = str_field(ev, "toolCallId");
    const char *content = str_field(ev, "content");
    json_t *msg;
    size_t at;
    struct extras x;

    if (id == NULL || tc_id == NULL || content == NULL || extras_of(ev, false, &x) < 0)
        return -AGW_EINVAL;
    msg = must(json_pack("{s:s, s:s, s:s, s:s}", "id", id, "role", "tool", "toolCallId", tc_id,
                         "content", content));
    extras_set(msg, &x);
    meta_merge_event(msg, ev);
    if (find_tool_call(h, tc_id, true, &at) == NULL) {
        append(h, msg_item(msg, run_id));
        return 1;
    }
    at++;
    while (at < h->n && item_is_tool(h->items[at]))
        at++;
    insert_at(h, at, msg_item(msg, run_id));
    return 1;
}

/* ---- a message as the client's schemas leave it ------------------------------------------------
 *
 * The client passes every event through its schemas (@ag-ui/core 1.0) before applying it, and
 * strips what they do not describe (agw_schema_strip_message()). That concerns the messages an
 * event carries whole: a MESSAGES_SNAPSHOT's and a RUN_STARTED's input's.
 */

/* Message <m> (an object) as the client holds it once its schemas have read it: -1 when the client
 * drops it (a role it has no schema for), 0 when it holds <m> as it is, 1 with *<out> a new value
 * when it holds less (members its schemas do not name; a "subagentRunId" that is null, which the
 * client's snapshot rule leaves out too). */
static int client_message(const json_t *m, json_t **out)
{
    /* (the walk without <apply> changes nothing) */
    int rc = agw_schema_strip_message((json_t *)(uintptr_t)m, false);
    bool null_run = json_is_null(json_object_get(m, "subagentRunId"));

    if (rc <= 0 && !(rc == 0 && null_run))
        return rc < 0 ? -1 : 0;
    *out = must(json_deep_copy(m));
    agw_schema_strip_message(*out, true);
    if (null_run)
        must_ok(json_object_del(*out, "subagentRunId"));
    return 1;
}

/* The messages of array <msgs> as the client holds them (client_message()), those it drops left
 * out: a new array (of <msgs>'s own values where the client holds them as they are: to be read
 * only), or NULL when <msgs> is not an array or one of the messages it holds is not an object with
 * a string "id" (the client fails the run). */
static json_t *client_messages(const json_t *msgs)
{
    json_t *out, *m, *c;
    size_t k;

    if (!json_is_array(msgs))
        return NULL;
    out = must(json_array());
    json_array_foreach(msgs, k, m)
    {
        int rc = json_is_object(m) ? client_message(m, &c) : 0;
        if (rc < 0)
            continue;
        if (rc == 0)
            c = json_incref(m);
        if (!valid_msg(c)) {
            json_decref(c);
            json_decref(out);
            return NULL;
        }
        must_ok(json_array_append_new(out, c));
    }
    return out;
}

/* What a MESSAGES_SNAPSHOT says, read once. */
struct snapshot {
    json_t *by_id;                    /* id -> the last of the snapshot's messages with it */
    bool has_reasoning, has_activity; /* it holds a message of that role */
    int authority;                    /* snapshot_authority() */
    const json_t *types;              /* its authoritative activity types, or NULL */
};

/* The activity types a snapshot says it holds all of (its metadata's
 * "@ag-ui/client".authoritativeActivityTypes), as the client reads them: 0 = not said, 1 = said as
 * null (it holds every type), 2 = these (*<types>, an array; none when it is not an array of
 * strings, or the client's entry is not an object). */
static int snapshot_authority(const json_t *ev, const json_t **types)
{
    const json_t *meta = json_object_get(ev, "metadata");
    const json_t *entry, *t;
    size_t k;

    *types = NULL;
    if (!json_is_object(meta) || (entry = json_object_get(meta, "@ag-ui/client")) == NULL)
        return 0;
    if (!json_is_object(entry))
        return 2;
    if ((t = json_object_get(entry, "authoritativeActivityTypes")) == NULL)
        return 0;
    if (json_is_null(t))
        return 1;
    if (!json_is_array(t))
        return 2;
    json_array_foreach(t, k, entry)
    {
        if (!json_is_string(entry))
            return 2;
    }
    *types = t;
    return 2;
}

/* Whether a message the snapshot does not hold is kept aside, where it is, as the client keeps it:
 * a reasoning message when the snapshot holds none; an activity message whose type the snapshot
 * does not speak for (not among its authoritative types when it lists them; when it says nothing,
 * as long as it holds no activity message). */
static bool snapshot_keeps(struct agw_history *h, struct item *it, const struct snapshot *sn)
{
    const json_t *type, *t;
    size_t k;

    switch (item_role(it)) {
    case ROLE_REASONING:
        return !sn->has_reasoning;
    case ROLE_ACTIVITY:
        switch (sn->authority) {
        case 0:
            return !sn->has_activity;
        case 1:
            return false;
        default:
            if (sn->types == NULL)
                return true;
            /* (an activity message is a value: the client never sends one back, so none comes
             * as text; a shed one is read back) */
            type = json_object_get(item_msg(h, it), "activityType");
            json_array_foreach(sn->types, k, t)
            {
                if (json_is_string(type) && json_equal(t, type))
                    return false;
            }
            return true;
        }
    default:
        return false;
    }
}

/* MESSAGES_SNAPSHOT: known messages are replaced by the snapshot's version (keeping their place and
 * run id), those missing from it are dropped unless kept aside (snapshot_keeps()), the snapshot's
 * new ones are appended in its order. */
static int on_snapshot(struct agw_history *h, const char *run_id, const json_t *ev)
{
    json_t *snap = client_messages(json_object_get(ev, "messages")), *m;
    size_t k, kept = 0, known;
    struct snapshot sn = {0};

    if (snap == NULL)
        return -AGW_EINVAL;
    /* one pass over the snapshot: a thread of n messages and a snapshot of m cost n + m look-ups,
     * not n times m comparisons */
    sn.by_id = must(json_object());
    json_array_foreach(snap, k, m)
    {
        must_ok(json_object_set(sn.by_id, msg_id(m), m)); /* (the last of an id wins) */
        sn.has_reasoning |= value_role(m) == ROLE_REASONING;
        sn.has_activity |= value_role(m) == ROLE_ACTIVITY;
    }
    sn.authority = snapshot_authority(ev, &sn.types);
    for (size_t i = 0; i < h->n; i++) {
        struct item *it = h->items[i];
        const json_t *s = json_object_get(sn.by_id, item_id(it));
        if (s == NULL && !snapshot_keeps(h, it, &sn)) {
            index_remove(h, it);
            item_free(it);
            continue;
        }
        /* read back from where the store holds it before it moves (unreadable: it differs) */
        if (text_whole(h, it) != 0)
            text_lost(it);
        h->items[kept] = it;
        if (h->n_buckets == 0)
            h->lin[kept] = it->hash;
        if (kept != i) {
            it->pos = h->dropped + kept;
            touch_moved(h, kept);
        }
        /* (one kept aside stays as it is) */
        if (s != NULL && !json_equal(item_msg(h, it), s)) {
            replace_at(h, kept, must(json_deep_copy(s)));
        }
        kept++;
    }
    h->n = kept;
    /* the ids known before the appends: a new id given twice is appended twice, as the client does
     */
    known = h->n;
    json_array_foreach(snap, k, m)
    {
        size_t i = find_msg(h, msg_id(m));
        if (i == SIZE_MAX || i >= known)
            append(h, msg_item(must(json_deep_copy(m)), run_id));
    }
    json_decref(sn.by_id);
    json_decref(snap);
    return 1;
}

/* REASONING_ENCRYPTED_VALUE {subtype, entityId, encryptedValue}: sets "encryptedValue" on the tool
 * call <entityId> of the first assistant message holding it (subtype "tool-call"), else on the
 * message <entityId> unless it is an activity message. */
static int on_encrypted_value(struct agw_history *h, const json_t *ev)
{
    const char *subtype = str_field(ev, "subtype"), *id = str_field(ev, "entityId");
    const json_t *value = json_object_get(ev, "encryptedValue");
    json_t *target = NULL;
    size_t i;

    if (subtype == NULL || id == NULL || !json_is_string(value))
        return -AGW_EINVAL;
    if (strcmp(subtype, "tool-call") == 0) {
        target = find_tool_call(h, id, true, &i);
    } else {
        i = find_msg(h, id);
        if (i != SIZE_MAX && item_role(h->items[i]) != ROLE_ACTIVITY)
            target = item_msg(h, h->items[i]);
    }
    if (target == NULL)
        return 0;
    if (json_equal(json_object_get(target, "encryptedValue"), value))
        return 0;
    must_ok(json_object_set(target, "encryptedValue", (json_t *)(uintptr_t)value));
    touch(h, i);
    return 1;
}

/* Replaces message <i> with <m> (owned) when they differ: 1, else 0 (<m> freed). */
static int replace_if_changed(struct agw_history *h, size_t i, json_t *m)
{
    if (json_equal(item_msg(h, h->items[i]), m)) {
        json_decref(m);
        return 0;
    }
    replace_at(h, i, m);
    return 1;
}

/* ACTIVITY_SNAPSHOT {messageId, activityType, content, replace?, subagentRunId?}: a new
 * {id, role: "activity", activityType, content, subagentRunId?} is appended; an activity message
 * of that id takes the type, the content and the subagentRunId (none when the event has none),
 * keeping its other members; any other message of that id is replaced by the new one. With
 * "replace": false a message of that id is left as it is, but for the metadata an activity message
 * takes. The event's metadata is merged into what it made or changed. */
static int on_activity_snapshot(struct agw_history *h, const char *run_id, const json_t *ev)
{
    const char *id = str_field(ev, "messageId"), *type = str_field(ev, "activityType");
    const json_t *content = json_object_get(ev, "content"),
                 *replace = json_object_get(ev, "replace");
    struct extras x;
    json_t *m;
    size_t i;

    if (id == NULL || type == NULL || content == NULL ||
        (replace != NULL && !json_is_boolean(replace) && !json_is_null(replace)) ||
        extras_of(ev, false, &x) < 0)
        return -AGW_EINVAL;
    i = find_msg(h, id);
    if (i != SIZE_MAX && json_is_false(replace)) /* (an activity message takes the metadata) */
        return item_role(h->items[i]) == ROLE_ACTIVITY ? meta_merge(h, i, ev) : 0;
    if (i != SIZE_MAX && item_role(h->items[i]) == ROLE_ACTIVITY) {
        m = must(json_deep_copy(item_msg(h, h->items[i])));
        must_ok(json_object_set_new(m, "activityType", must(json_string(type))));
        must_ok(json_object_set_new(m, "content", must(json_deep_copy(content))));
        json_object_del(m, "subagentRunId");
        extras_set(m, &x);
        meta_merge_event(m, ev);
        return replace_if_changed(h, i, m);
    }
    m = must(json_pack("{s:s, s:s, s:s}", "id", id, "role", "activity", "activityType", type));
    must_ok(json_object_set_new(m, "content", must(json_deep_copy(content))));
    extras_set(m, &x);
    meta_merge_event(m, ev);
    if (i == SIZE_MAX) {
        append(h, msg_item(m, run_id));
        return 1;
    }
    return replace_if_changed(h, i, m);
}

/* ACTIVITY_DELTA {messageId, activityType, patch, metadata?}: the activity message of that id takes
 * the event's metadata, then gets its content (an empty object when it has none) patched (RFC 6902,
 * agw_json_patch()) and the type given; a patch that fails leaves the content and type as they
 * were, and an id that is not an activity message's changes nothing. */
static int on_activity_delta(struct agw_history *h, const json_t *ev)
{
    const char *id = str_field(ev, "messageId"), *type = str_field(ev, "activityType");
    const json_t *patch = json_object_get(ev, "patch");
    json_t *m, *content;
    size_t i;

    if (id == NULL || type == NULL || !json_is_array(patch))
        return -AGW_EINVAL;
    i = find_msg(h, id);
    if (i == SIZE_MAX || item_role(h->items[i]) != ROLE_ACTIVITY)
        return 0;
    m = must(json_deep_copy(item_msg(h, h->items[i])));
    /* the metadata first: it stays merged when the patch fails */
    meta_merge_event(m, ev);
    content = json_object_get(m, "content");
    content = content != NULL && !json_is_null(content) ? must(json_deep_copy(content))
                                                        : must(json_object());
    if (agw_json_patch(&content, patch) != 0) {
        json_decref(content);
        return replace_if_changed(h, i, m); /* (the client warns and goes on) */
    }
    must_ok(json_object_set_new(m, "content", content));
    must_ok(json_object_set_new(m, "activityType", must(json_string(type))));
    return replace_if_changed(h, i, m);
}

/* RUN_STARTED {input: {messages}}: the input's messages whose ids the thread does not know are
 * appended, in order, with this run's id, as the client holds them (client_message()). */
static int on_run_started(struct agw_history *h, const char *run_id, const json_t *ev)
{
    const json_t *msgs = json_object_get(json_object_get(ev, "input"), "messages"), *m;
    size_t k;
    int rc = 0;

    json_array_foreach(msgs, k, m)
    {
        json_t *c = NULL;
        int st = json_is_object(m) ? client_message(m, &c) : -1;
        if (st == 0)
            c = must(json_deep_copy(m));
        if (c != NULL && valid_msg(c) && find_msg(h, msg_id(c)) == SIZE_MAX) {
            append(h, msg_item(c, run_id));
            rc = 1;
        } else {
            json_decref(c);
        }
    }
    return rc;
}

/* The end of applying an event that returned <rc>: counts it when malformed, else trims the thread.
 * Returns <rc>. */
static int applied(struct agw_history *h, int rc)
{
    if (rc < 0) {
        h->malformed++;
        return rc;
    }
    trim(h);
    return rc;
}

int agw_history_apply(struct agw_history *h, const char *run_id, const json_t *event)
{
    const char *type = str_field(event, "type");
    int rc = 0;

    /* (chunk events never come: the normaliser writes the start, content and end events they
     * stand for) */
    if (type == NULL) {
        rc = -AGW_EINVAL;
    } else if (strcmp(type, "TEXT_MESSAGE_START") == 0) {
        rc = on_text_start(h, run_id, event);
    } else if (strcmp(type, "TEXT_MESSAGE_CONTENT") == 0 ||
               strcmp(type, "REASONING_MESSAGE_CONTENT") == 0) {
        rc = on_text_content(h, event);
    } else if (strcmp(type, "REASONING_MESSAGE_START") == 0) {
        rc = on_reasoning_start(h, run_id, event);
    } else if (strcmp(type, "REASONING_ENCRYPTED_VALUE") == 0) {
        rc = on_encrypted_value(h, event);
    } else if (strcmp(type, "TEXT_MESSAGE_END") == 0 ||
               strcmp(type, "REASONING_MESSAGE_END") == 0) {
        const char *id = str_field(event, "messageId");
        if (id != NULL)
            text_end(h, id, strlen(id));
        rc = id != NULL ? meta_merge_at(h, id, event) : -AGW_EINVAL;
    } else if (strcmp(type, "TOOL_CALL_START") == 0) {
        rc = on_tool_start(h, run_id, event);
    } else if (strcmp(type, "TOOL_CALL_ARGS") == 0) {
        rc = on_tool_args(h, event);
    } else if (strcmp(type, "TOOL_CALL_END") == 0) {
        rc = on_tool_end(h, event);
    } else if (strcmp(type, "TOOL_CALL_RESULT") == 0) {
        rc = on_tool_result(h, run_id, event);
    } else if (strcmp(type, "MESSAGES_SNAPSHOT") == 0) {
        rc = on_snapshot(h, run_id, event);
    } else if (strcmp(type, "ACTIVITY_SNAPSHOT") == 0) {
        rc = on_activity_snapshot(h, run_id, event);
    } else if (strcmp(type, "ACTIVITY_DELTA") == 0) {
        rc = on_activity_delta(h, event);
    } else if (strcmp(type, "RUN_STARTED") == 0 && json_object_get(event, "input") != NULL) {
        rc = on_run_started(h, run_id, event); /* (the capture keeps only these) */
    }
    return applied(h, rc);
}

int agw_history_append_text(struct agw_history *h, const char *id, size_t id_len, const char *delta,
                            size_t delta_len)
{
    size_t i = find_msgn(h, id, id_len);
    struct item *it;

    /* as agw_history_apply() with a TEXT_MESSAGE_CONTENT: an unknown id changes nothing, nor
     * does an activity message's (one held as text came with a text "content", which the
     * client's schemas refuse, in a run's input) */
    if (i == SIZE_MAX || item_role(h->items[i]) == ROLE_ACTIVITY)
        return applied(h, 0);
    it = h->items[i];
    if (!is_text(it))
        return AGW_AGAIN;
    text_put(it, delta, delta_len);
    touch(h, i);
    return applied(h, 1);
}

/* A line that is not a text's coalesced deltas, or whose message is not held as text. */
static int apply_other_line(struct agw_history *h, const char *run_id, const char *line, size_t len)
{
    struct agw_capture_fields f;
    json_t *ev;
    int rc;

    if (len > 0 && line[0] == AGW_CAPTURE_MARK) { /* a coalesced line: its JSON follows */
        line++;
        len--;
    }
    /* a text's boundaries need no JSON value either: its start and end */
    if (agw_capture_line_fields(line, len, &f) && f.message_id != NULL && !f.more) {
        if (agw_streq_n(f.type, f.type_len, "TEXT_MESSAGE_START"))
            return applied(h, text_start(h, run_id, f.message_id, f.message_id_len,
                                         f.role != NULL ? f.role : "assistant",
                                         f.role != NULL ? f.role_len : 9, true, NULL));
        if (agw_streq_n(f.type, f.type_len, "REASONING_MESSAGE_START"))
            return applied(h, text_start(h, run_id, f.message_id, f.message_id_len, "reasoning", 9,
                                         true, NULL));
        if (agw_streq_n(f.type, f.type_len, "TEXT_MESSAGE_END") ||
            agw_streq_n(f.type, f.type_len, "REASONING_MESSAGE_END")) {
            text_end(h, f.message_id, f.message_id_len);
            return applied(h, 0);
        }
    }
    ev = json_loadb(line, len, 0, NULL);
    if (ev == NULL) {
        h->malformed++;
        return -AGW_EINVAL;
    }
    rc = agw_history_apply(h, run_id, ev);
    json_decref(ev);
    return rc;
}

/* A text's coalesced deltas (<d>, read from the line), the bulk of the bytes, go to a message held
 * as text as they are (escaped): no JSON value is built. AGW_AGAIN when the message is not one. */
static int append_delta_line(struct agw_history *h, const struct agw_capture_delta *d)
{
    if (d->args || d->id_escaped)
        return AGW_AGAIN;
    return agw_history_append_text(h, d->id, d->id_len, d->delta, d->delta_len);
}

int agw_history_apply_line(struct agw_history *h, const char *run_id, const char *line, size_t len)
{
    struct agw_capture_delta d;
    int rc;

    if (agw_capture_line_delta(line, len, &d) && (rc = append_delta_line(h, &d)) != AGW_AGAIN)
        return rc;
    return apply_other_line(h, run_id, line, len);
}

int agw_history_apply_lines(struct agw_history *h, const char *run_id, const char *lines,
                            size_t len)
{
    const char *p = lines, *end = lines + len;
    int bad = 0;

    while (p < end) {
        struct agw_capture_delta d;
        size_t n;
        int rc;

        /* a text's coalesced deltas (most of the bytes) are read once: their end is where the
         * delta's string ends; any other line is read once too, from its end on */
        if (agw_capture_line_delta_at(p, (size_t)(end - p), &d, &n)) {
            if ((rc = append_delta_line(h, &d)) == AGW_AGAIN)
                rc = apply_other_line(h, run_id, p, n);
        } else {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            n = (size_t)((nl != NULL ? nl : end) - p);
            rc = n > 0 ? apply_other_line(h, run_id, p, n) : 0;
        }
        bad += rc < 0;
        p += n + 1;
    }
    return bad;
}

size_t agw_history_count(const struct agw_history *h)
{
    return h->n;
}

const json_t *agw_history_message(struct agw_history *h, size_t i)
{
    return i < h->n ? item_msg(h, h->items[i]) : NULL;
}

const char *agw_history_run_id(const struct agw_history *h, size_t i)
{
    return i < h->n ? item_run(h->items[i]) : NULL;
}

uint64_t agw_history_dropped(const struct agw_history *h)
{
    return h->dropped;
}

uint64_t agw_history_malformed(const struct agw_history *h)
{
    return h->malformed;
}

bool agw_history_index_ok(const struct agw_history *h)
{
    size_t chained = 0;

    for (size_t i = 0; i < h->n; i++) {
        const struct item *it = h->items[i], *x;
        if (it->pos != h->dropped + i || it->hash != hash_bytes(item_id(it), it->id_len))
            return false;
        if (h->n_buckets == 0) {
            if (i >= LINEAR_MAX || h->lin[i] != it->hash)
                return false;
            continue;
        }
        for (x = *bucket_of(h, it->hash); x != NULL && x != it; x = x->next)
            ;
        if (x == NULL)
            return false;
    }
    for (size_t b = 0; b < h->n_buckets; b++)
        for (const struct item *x = h->buckets[b]; x != NULL; x = x->next)
            chained++;
    return h->n_buckets == 0 || chained == h->n;
}

uint64_t agw_history_values_parsed(const struct agw_history *h)
{
    return h->values_parsed;
}

/* ---- for a store that keeps each message apart --------------------------------------------- */

size_t agw_history_first_changed(const struct agw_history *h)
{
    for (size_t i = h->first_changed; i < h->n; i++)
        if (h->items[i]->changed)
            return i;
    return h->n;
}

bool agw_history_changed(const struct agw_history *h, size_t i)
{
    return i < h->n && h->items[i]->changed;
}

const char *agw_history_message_json(struct agw_history *h, size_t i, size_t *len)
{
    struct item *it;

    assert(i < h->n);
    it = h->items[i];
    if (it->msg == NULL && text_whole(h, it) != 0)
        text_lost(it);
    if (it->msg == NULL)
        return text_closed(it, len);
    if (it->json == NULL) {
        it->json = json_dumps(it->msg, JSON_COMPACT);
        if (it->json == NULL)
            abort(); /* the tree holds only valid values: only allocation can fail */
        it->json_len = strlen(it->json);
    }
    *len = it->json_len;
    return it->json;
}

/* Where <pos> is or would go in h->multi. */
static size_t multi_at(const struct agw_history *h, uint64_t pos)
{
    size_t lo = 0, hi = h->n_multi;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (h->multi[mid] < pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool multi_has(const struct agw_history *h, uint64_t pos)
{
    size_t k = multi_at(h, pos);
    return k < h->n_multi && h->multi[k] == pos;
}

/* Position <pos> is (<on>) or is not held in several pieces. */
static void multi_set(struct agw_history *h, uint64_t pos, bool on)
{
    size_t k = multi_at(h, pos);
    bool has = k < h->n_multi && h->multi[k] == pos;

    if (on && !has) {
        if (h->n_multi == h->multi_cap) {
            h->multi_cap = h->multi_cap > 0 ? h->multi_cap * 2 : 4;
            h->multi = agw_xrealloc(h->multi, h->multi_cap * sizeof(*h->multi));
        }
        memmove(&h->multi[k + 1], &h->multi[k], (h->n_multi - k) * sizeof(*h->multi));
        h->multi[k] = pos;
        h->n_multi++;
    } else if (!on && has) {
        memmove(&h->multi[k], &h->multi[k + 1], (h->n_multi - k - 1) * sizeof(*h->multi));
        h->n_multi--;
    }
}

/* Whether item <it>'s row is a piece (what its text grew by since it was saved). */
static bool row_is_piece(const struct item *it)
{
    return is_text(it) && !it->whole && it->saved_parts > 0;
}

void agw_history_message_row(struct agw_history *h, size_t i, struct agw_history_row *r)
{
    struct item *it;

    assert(i < h->n);
    it = h->items[i];
    memset(r, 0, sizeof(*r));
    r->text = is_text(it);
    if (row_is_piece(it)) {
        /* a text that grew since it was saved: the bytes it grew by, as its next piece (what
         * was shed is older than that) */
        r->data = it->text + (it->saved_len - it->text_base);
        r->len = it->text_len - it->saved_len;
        r->part = it->saved_parts;
        return;
    }
    r->drop_parts = multi_has(h, h->dropped + i);
    if (it->msg == NULL && text_whole(h, it) != 0) /* (what is written whole is never shed: */
        text_lost(it);                             /* moves read it back; this is for safety) */
    r->text = is_text(it);
    if (r->text) {
        r->data = it->text;
        r->len = it->text_len;
    } else {
        r->data = agw_history_message_json(h, i, &r->len);
    }
}

void agw_history_mark_saved(struct agw_history *h)
{
    size_t k = 0;

    if (h->first_changed < h->shed_from)
        h->shed_from = h->first_changed;
    /* the store deleted the positions outside the thread's */
    for (size_t j = 0; j < h->n_multi; j++)
        if (h->multi[j] >= h->dropped && h->multi[j] < h->dropped + h->n)
            h->multi[k++] = h->multi[j];
    h->n_multi = k;
    for (size_t i = h->first_changed; i < h->n; i++) {
        struct item *it = h->items[i];
        bool piece = row_is_piece(it);
        if (!it->changed)
            continue;
        multi_set(h, h->dropped + i, piece);
        it->saved_parts = piece ? it->saved_parts + 1 : 1;
        it->saved_len = is_text(it) ? it->text_len : 0;
        it->whole = false;
        it->changed = false;
    }
    h->first_changed = h->n;
}

void agw_history_set_loader(struct agw_history *h, agw_history_load_fn *fn, void *arg)
{
    h->load = fn;
    h->load_arg = arg;
}

uint64_t agw_history_load_errors(const struct agw_history *h)
{
    return h->load_errors;
}

/* Sheds value <i>, as saved, unless it has tool calls (the thread looks them up in the values it
 * holds). Returns the bytes its dump held (its tree held more). */
static size_t shed_value(struct agw_history *h, size_t i)
{
    struct item *it = h->items[i];
    size_t len;
    const char *j;

    if (json_object_get(it->msg, "toolCalls") != NULL)
        return 0;
    j = agw_history_message_json(h, i, &len); /* the bytes the store wrote */
    item_hs_clear(it);
    it->value_hash = hs_of(j, len);
    it->text_role = (unsigned char)item_role(it);
    it->text_len = it->text_base = len;
    it->shed_value = true;
    json_decref(it->msg);
    it->msg = NULL;
    free(it->json);
    it->json = NULL;
    it->json_len = 0;
    return len;
}

/* A growing text's buffer is made to fit its bytes again, after a commit, when it is at most this
 * big and has room for this much more: an idle stream's answer (a few words so far) keeps no room
 * for more (the next delta makes it twice the size again, text_reserve()). A bigger buffer stays as
 * it is: a text streamed goes on in it (no new pages for it). */
#define TEXT_FIT_MAX   1024
#define TEXT_FIT_SLACK 32

/* agw_history_shed() of text <it> (as saved): its bytes the store holds go when they are at least
 * <min_bytes>, or when it is an ended input message. Returns the bytes let go. An input message
 * shed whole at once keeps its final hash alone (a user's message does not grow: when one does, its
 * bytes are read back first, and it goes on as any text). Not an ended answer: an agent may extend
 * it with its next run (the demo agent's default ids do), and each commit would then read it back
 * whole (doc/benchmarks.md: tried and not taken twice). */
static size_t shed_text(struct agw_history *h, struct item *it, size_t min_bytes)
{
    size_t saved, freed = 0, need;

    if (it->text_base > 0 && it->text_hs == NULL && it->saved_len > it->text_base &&
        text_whole(h, it) != 0) { /* a final hash cannot go on */
        text_lost(it);
        return 0;
    }
    saved = it->saved_len - it->text_base; /* bytes in memory the store holds */
    if (saved > 0 && it->from_input && it->text_ended && it->text_base == 0 &&
        saved == it->text_len) {
        it->value_hash = hs_of(it->text, saved);
        it->text_base = saved;
        freed = saved;
    } else if (saved > 0 && (saved >= min_bytes || (it->from_input && it->text_ended))) {
        if (it->text_hs == NULL)
            it->text_hs = agw_xcalloc(1, sizeof(*it->text_hs));
        hs_update(it->text_hs, it->text, saved);
        it->text_base += saved;
        if (text_mem(it) > 0) /* what it grew by since the commit */
            memmove(it->text, it->text + saved, text_mem(it));
        freed = saved;
    }
    if (it->text == NULL)
        return freed;
    need = text_mem(it) + TEXT_CLOSE_LEN + 1;
    if (text_mem(it) == 0 && it->text_ended) { /* an ended text frees its buffer */
        free(it->text);
        it->text = NULL;
        freed = it->text_cap;
        it->text_cap = 0;
    } else if (it->text_cap <= TEXT_FIT_MAX && it->text_cap >= need + TEXT_FIT_SLACK) {
        it->text = agw_xrealloc(it->text, need);
        freed += it->text_cap - need;
        it->text_cap = need;
    }
    return freed;
}

size_t agw_history_shed(struct agw_history *h, size_t min_bytes)
{
    size_t freed = 0;

    if (h->load == NULL)
        return 0;
    /* the items below shed_from did not change since the last look: what could be shed was */
    for (size_t i = h->shed_from; i < h->n; i++) {
        struct item *it = h->items[i];

        if (it->changed || it->saved_parts == 0)
            continue; /* not as saved */
        if (it->msg != NULL) {
            /* (not a text parsed since it was saved, item_msg(): the store holds its text,
             * not the value's dump that shed_value() would check what it reads back against) */
            if (!it->whole)
                freed += shed_value(h, i);
            continue;
        }
        if (!it->shed_value)
            freed += shed_text(h, it, min_bytes);
    }
    h->shed_from = h->n;
    return freed;
}

size_t agw_history_text_bytes(const struct agw_history *h)
{
    size_t n = 0;

    for (size_t i = 0; i < h->n; i++)
        n += h->items[i]->text_cap + h->items[i]->json_len;
    return n;
}

struct agw_history *agw_history_restore(size_t max_messages, uint64_t dropped)
{
    struct agw_history *h = agw_history_new(max_messages);

    h->dropped = dropped;
    return h;
}

int agw_history_restore_message(struct agw_history *h, uint64_t pos, const char *run_id,
                                const struct agw_history_row *r)
{
    json_t *m = NULL;
    struct item *it;

    if (r->text) { /* the bytes of a text message, without its closing '"}' */
        char *closed = agw_xmalloc(r->len + TEXT_CLOSE_LEN);
        memcpy(closed, r->data, r->len);
        memcpy(closed + r->len, TEXT_CLOSE, TEXT_CLOSE_LEN);
        m = json_loadb(closed, r->len + TEXT_CLOSE_LEN, 0, NULL);
        free(closed);
    } else {
        m = json_loadb(r->data, r->len, JSON_ALLOW_NUL, NULL);
    }
    if (!valid_msg(m)) {
        json_decref(m);
        return -AGW_EINVAL;
    }
    it = msg_item(m, run_id);
    if (r->text) { /* held as text again, to go on growing by pieces */
        it->text_role = (unsigned char)item_role(it);
        json_decref(it->msg);
        it->msg = NULL;
        text_put(it, r->data, r->len);
        it->saved_len = r->len;
    }
    it->saved_parts = r->part;
    multi_set(h, pos, r->part > 1);
    /* a message stored where it belongs is as saved; one out of place is written again, whole,
     * where it belongs now */
    it->changed = pos != h->dropped + h->n;
    it->whole = it->changed;
    place(h, h->n, it);
    if (it->changed && h->n - 1 < h->first_changed)
        h->first_changed = h->n - 1;
    trim(h);
    return 0;
}

char *agw_history_dump(struct agw_history *h)
{
    json_t *msgs = must(json_array()), *doc;
    char *s;

    /* a message held as text is parsed for the dump, and stays text (a shed one is read back; one
     * that cannot be is dumped as its id alone, and counted) */
    for (size_t i = 0; i < h->n; i++) {
        const struct item *it = h->items[i];
        json_t *m = it->msg != NULL ? json_incref(it->msg) : item_copy(h, it);
        if (m == NULL)
            m = must(json_pack("{s:s%}", "id", item_id(it), (size_t)it->id_len));
        must_ok(json_array_append_new(
            msgs, must(json_pack("{s:s?, s:o}", "run_id", item_run(it), "message", m))));
    }
    doc = must(json_pack("{s:i, s:I, s:o}", "v", DUMP_VERSION, "dropped", (json_int_t)h->dropped,
                         "messages", msgs));
    s = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(doc);
    if (s == NULL)
        abort(); /* the tree holds only valid values: only allocation can fail */
    return s;
}

struct agw_history *agw_history_load(const char *data, size_t len, size_t max_messages)
{
    struct agw_history *h = NULL;
    json_t *doc = json_loadb(data, len, JSON_ALLOW_NUL, NULL), *msgs, *e;
    json_int_t dropped;
    size_t k;

    if (!json_is_object(doc) || json_integer_value(json_object_get(doc, "v")) != DUMP_VERSION ||
        !json_is_integer(json_object_get(doc, "dropped")))
        goto out;
    dropped = json_integer_value(json_object_get(doc, "dropped"));
    msgs = json_object_get(doc, "messages");
    if (dropped < 0 || !json_is_array(msgs))
        goto out;
    json_array_foreach(msgs, k, e)
    {
        const json_t *run = json_object_get(e, "run_id");
        if (!json_is_object(e) || !valid_msg(json_object_get(e, "message")) ||
            (run != NULL && !json_is_null(run) && !json_is_string(run)))
            goto out;
    }
    h = agw_history_new(max_messages);
    h->dropped = (uint64_t)dropped;
    json_array_foreach(msgs, k, e)
    {
        append(h, msg_item(json_incref(json_object_get(e, "message")), str_field(e, "run_id")));
    }
    trim(h);
out:
    json_decref(doc);
    return h;
}

/* ---- paging ------------------------------------------------------------------------------------
 */

#define NAME_MAX_LEN 16 /* decoded bytes of a parameter name: longer ones are unknown anyway */

/* Percent-decodes <in> (<len> bytes; '+' = space) into <out> (<outlen> bytes with the NUL). Returns
 * the decoded length, -AGW_EINVAL for a bad escape or a NUL byte, -AGW_ETOOBIG when it does not
 * fit. */
static int query_decode(const char *in, size_t len, char *out, size_t outlen)
{
    size_t n = 0;

    for (size_t i = 0; i < len; i++) {
        char c = in[i];
        if (c == '%') {
            int hi, lo;
            if (len - i < 3 || (hi = agw_hexval(in[i + 1])) < 0 || (lo = agw_hexval(in[i + 2])) < 0)
                return -AGW_EINVAL;
            c = (char)(hi << 4 | lo);
            i += 2;
        } else if (c == '+') {
            c = ' ';
        }
        if (c == '\0')
            return -AGW_EINVAL;
        if (n + 1 >= outlen)
            return -AGW_ETOOBIG;
        out[n++] = c;
    }
    out[n] = '\0';
    return (int)n;
}

/* Parses the decimal <s> (an optional '-' when <allow_minus>, then at least one digit, nothing
 * else) into *<v>, saturating at SIZE_MAX; a negative number gives 0 with *<neg> set. */
static bool parse_size(const char *s, bool allow_minus, size_t *v, bool *neg)
{
    size_t x = 0;

    *neg = false;
    if (allow_minus && *s == '-') {
        *neg = true;
        s++;
    }
    if (*s == '\0')
        return false;
    for (; *s != '\0'; s++) {
        if (*s < '0' || *s > '9')
            return false;
        x = x > (SIZE_MAX - 9) / 10 ? SIZE_MAX : x * 10 + (size_t)(*s - '0');
    }
    *v = *neg ? 0 : x;
    return true;
}

static void query_defaults(struct agw_history_query *q)
{
    memset(q, 0, sizeof(*q));
    q->limit = AGW_HISTORY_LIMIT_DEFAULT;
    q->max_bytes = AGW_HISTORY_PAGE_BYTES;
}

/* Formats a parse error into <err> and returns -AGW_EINVAL. */
static int AGW_PRINTF(3, 4) query_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err != NULL && errlen > 0) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -AGW_EINVAL;
}

/* Applies one name=value pair (<name> decoded, <raw_name> as sent for messages) to <q>. */
static int query_param(struct agw_history_query *q, const char *raw_name, size_t raw_len,
                       const char *name, const char *value, size_t value_len, unsigned *seen,
                       char *err, size_t errlen)
{
    static const char *const names[] = {"limit", "after", "before", "order", "run_id"};
    char buf[AGW_ID_MAX + 1];
    size_t k, v;
    bool neg;
    int n;

    for (k = 0; k < AGW_ARRAY_LEN(names); k++)
        if (strcmp(name, names[k]) == 0)
            break;
    if (k == AGW_ARRAY_LEN(names))
        return query_fail(err, errlen, "bad request: unknown query parameter '%.*s'",
                          raw_len > 64 ? 64 : (int)raw_len, raw_name);
    if (*seen & (1u << k))
        return query_fail(err, errlen, "bad request: %s is given more than once", names[k]);
    *seen |= 1u << k;
    n = query_decode(value, value_len, buf, sizeof(buf));
    if (n == -AGW_ETOOBIG)
        return query_fail(err, errlen, "bad request: %s is longer than %d bytes", names[k],
                          AGW_ID_MAX);
    if (n < 0)
        return query_fail(err, errlen, "bad request: %s is not validly percent-encoded", names[k]);
    switch (k) {
    case 0:
        if (!parse_size(buf, true, &v, &neg))
            return query_fail(err, errlen, "bad request: limit must be an integer");
        q->limit = v < 1 ? 1 : v > AGW_HISTORY_LIMIT_MAX ? AGW_HISTORY_LIMIT_MAX : v;
        break;
    case 1:
    case 2:
        if (!parse_size(buf, false, &v, &neg))
            return query_fail(err, errlen, "bad request: %s must be a non-negative integer",
                              names[k]);
        if (k == 1) {
            q->has_after = true;
            q->after = v;
        } else {
            q->has_before = true;
            q->before = v;
        }
        break;
    case 3:
        if (strcmp(buf, "asc") != 0 && strcmp(buf, "desc") != 0)
            return query_fail(err, errlen, "bad request: order must be asc or desc");
        q->desc = buf[0] == 'd';
        break;
    default:
        if (n == 0)
            return query_fail(err, errlen, "bad request: run_id cannot be empty");
        memcpy(q->run_id, buf, (size_t)n + 1);
        break;
    }
    return 0;
}

int agw_history_query_parse(const char *query_string, struct agw_history_query *q, char *err,
                            size_t errlen)
{
    const char *p = query_string != NULL ? query_string : "";
    unsigned seen = 0;

    assert(q != NULL);
    query_defaults(q);
    while (*p != '\0') {
        size_t len = strcspn(p, "&"), nlen = strcspn(p, "=&");
        char name[NAME_MAX_LEN + 1];
        int rc;

        if (len > 0) {
            rc = query_decode(p, nlen, name, sizeof(name));
            if (rc == -AGW_EINVAL) {
                rc = query_fail(err, errlen,
                                "bad request: a query parameter name is not validly "
                                "percent-encoded");
                goto out;
            }
            if (rc < 0)
                name[0] = '\0'; /* too long: unknown */
            if (rc == 0) {
                rc = query_fail(err, errlen, "bad request: a query parameter has no name");
                goto out;
            }
            rc = query_param(q, p, nlen, name, nlen < len ? p + nlen + 1 : p + len,
                             nlen < len ? len - nlen - 1 : 0, &seen, err, errlen);
            if (rc < 0)
                goto out;
        }
        p += len;
        if (*p == '&')
            p++;
    }
    return 0;
out:
    query_defaults(q);
    return -AGW_EINVAL;
}

static bool page_match(const struct agw_history *h, const struct agw_history_query *q, size_t i)
{
    return q->run_id[0] == '\0' ||
           (item_run(h->items[i]) != NULL && strcmp(item_run(h->items[i]), q->run_id) == 0);
}

/* Whether a message of <q->run_id> lies in [<from>, <to>). */
static bool page_any(const struct agw_history *h, const struct agw_history_query *q, size_t from,
                     size_t to)
{
    for (size_t i = from; i < to; i++)
        if (page_match(h, q, i))
            return true;
    return false;
}

/* Item <i>'s size as compact JSON, without making it: a text's bytes (read back or not), a value's
 * as jansson would write it. */
static size_t page_bytes(const struct agw_history *h, size_t i)
{
    const struct item *it = h->items[i];

    if (it->msg == NULL)
        return it->text_len + TEXT_CLOSE_LEN;
    return it->json != NULL ? it->json_len : json_dumpb(it->msg, NULL, 0, JSON_COMPACT);
}

/* Whether candidate <i> ends the page that holds <n> messages of <*bytes> (else it is counted). */
static bool page_full(const struct agw_history *h, const struct agw_history_query *q, size_t i,
                      size_t n, size_t *bytes)
{
    size_t b;

    if (n == q->limit)
        return true;
    b = page_bytes(h, i);
    if (n > 0 && b > q->max_bytes - *bytes)
        return true;
    *bytes += b < q->max_bytes - *bytes ? b : q->max_bytes - *bytes;
    return false;
}

json_t *agw_history_page(struct agw_history *h, const struct agw_history_query *q)
{
    size_t idx[AGW_HISTORY_LIMIT_MAX], n = 0, lo, hi, first, last, bytes = 0;
    bool from_high, has_more = false;
    json_t *msgs, *page;

    assert(h != NULL && q != NULL);
    assert(q->limit >= 1 && q->limit <= AGW_HISTORY_LIMIT_MAX && q->max_bytes >= 1);
    /* the candidates' window: [lo, hi) */
    lo = !q->has_after ? 0 : q->after >= h->n ? h->n : q->after + 1;
    hi = q->has_before && q->before < h->n ? q->before : h->n;
    /* the end the page is taken from: the reading start, unless only the other cursor is given */
    from_high = q->desc ? !(q->has_after && !q->has_before) : (q->has_before && !q->has_after);
    if (from_high) {
        for (size_t i = hi; i > lo; i--) {
            if (!page_match(h, q, i - 1))
                continue;
            if (page_full(h, q, i - 1, n, &bytes)) {
                has_more = q->desc; /* reading downwards: a candidate remains below the page */
                break;
            }
            idx[n++] = i - 1;
        }
    } else {
        for (size_t i = lo; i < hi; i++) {
            if (!page_match(h, q, i))
                continue;
            if (page_full(h, q, i, n, &bytes)) {
                has_more = !q->desc;
                break;
            }
            idx[n++] = i;
        }
    }
    msgs = must(json_array());
    /* idx is ascending when taken from the low end, descending from the high end */
    for (size_t k = 0; k < n; k++) {
        size_t i = from_high == q->desc ? idx[k] : idx[n - 1 - k];
        json_t *m = item_copy(h, h->items[i]);
        if (m == NULL) { /* a shed text that cannot be read back */
            json_decref(msgs);
            return NULL;
        }
        must_ok(json_array_append_new(msgs, m));
    }
    page = must(json_pack("{s:o, s:b}", "messages", msgs, "has_more", has_more));
    if (n == 0)
        return page;
    first = from_high == q->desc ? idx[0] : idx[n - 1]; /* in reading order */
    last = from_high == q->desc ? idx[n - 1] : idx[0];
    if (q->desc ? page_any(h, q, 0, last) : page_any(h, q, last + 1, h->n))
        must_ok(json_object_set_new(page, "next_cursor", must(json_integer((json_int_t)last))));
    if (q->desc ? page_any(h, q, first + 1, h->n) : page_any(h, q, 0, first))
        must_ok(json_object_set_new(page, "prev_cursor", must(json_integer((json_int_t)first))));
    return page;
}
