/* The test knobs: a table of names, types and ranges (knob_defs), the parsing of one value, and
 * the walk over the query and the X-Demo-* headers. Integer knobs are int64_t fields of struct
 * knobs, found by offset, so that adding a knob is one line of the table and one field. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agw/common.h"

#include "http.h"
#include "knobs.h"

enum knob_type { KNOB_UINT, KNOB_BOOL, KNOB_ENUM, KNOB_STR };

struct knob_word {
    const char *word;
    int64_t value;
};

static const struct knob_word lifecycle_words[] = {{"full", 0}, {"none", 1}, {NULL, 0}};
static const struct knob_word dialect_words[] = {
    {"agui", DIALECT_AGUI},    {"ag-ui", DIALECT_AGUI},  {"cloudbase", DIALECT_CLOUDBASE},
    {"ag-kit", DIALECT_AGKIT}, {"agkit", DIALECT_AGKIT}, {NULL, 0}};
static const struct knob_word framing_words[] = {
    {"chunked", FRAMING_CHUNKED}, {"close", FRAMING_CLOSE}, {"length", FRAMING_LENGTH}, {NULL, 0}};

static const struct knob_word hangup_words[] = {
    {"none", HANGUP_NONE}, {"idle", HANGUP_IDLE}, {"next", HANGUP_NEXT}, {NULL, 0}};

static const struct knob_word ids_words[] = {{"count", IDS_COUNT}, {"run", IDS_RUN}, {NULL, 0}};

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
    {"write_each", KNOB_BOOL, KOFF(write_each), 0, 1, NULL},
    {"lifecycle", KNOB_ENUM, KOFF(lifecycle_none), 0, 1, lifecycle_words},
    {"done", KNOB_BOOL, KOFF(done), 0, 1, NULL},
    {"dialect", KNOB_ENUM, KOFF(dialect), 0, 2, dialect_words},
    {"fail", KNOB_BOOL, KOFF(fail), 0, 1, NULL},
    {"multiline", KNOB_BOOL, KOFF(multiline), 0, 1, NULL},
    {"comments", KNOB_BOOL, KOFF(comments), 0, 1, NULL},
    {"ts", KNOB_BOOL, KOFF(ts), 0, 1, NULL},
    {"reasoning", KNOB_BOOL, KOFF(reasoning), 0, 1, NULL},
    {"activity", KNOB_BOOL, KOFF(activity), 0, 1, NULL},
    {"metadata", KNOB_BOOL, KOFF(metadata), 0, 1, NULL},
    {"subagent", KNOB_BOOL, KOFF(subagent), 0, 1, NULL},
    {"framing", KNOB_ENUM, KOFF(framing), 0, 2, framing_words},
    {"hangup", KNOB_ENUM, KOFF(hangup), 0, 2, hangup_words},
    {"ids", KNOB_ENUM, KOFF(ids), 0, 1, ids_words},
    {"content_type", KNOB_STR, KOFF(content_type), 0, 0, NULL},
};

static int64_t *knob_int(struct knobs *k, const struct knob_def *def)
{
    return (int64_t *)(void *)((char *)k + def->off);
}

void knobs_init(struct knobs *k)
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
int knobs_parse(struct knobs *k, const char *query, const struct header *hdrs, size_t nhdrs,
                char *err, size_t errlen)
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
    for (size_t i = 0; i < nhdrs; i++) {
        const struct header *h = &hdrs[i];
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
