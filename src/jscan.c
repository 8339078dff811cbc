/* A JSON scanner that builds nothing (include/agw/jscan.h). */
#include "config.h"

#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "agw/jscan.h"

/* Bytes a JSON string holds as they are: printable ASCII but '"' and '\\'. */
static const bool plain[256] = {
    [0x20] = 1,
    [0x21] = 1,
    [0x23 ... 0x5b] = 1,
    [0x5d ... 0x7f] = 1,
};

const char *agw_jscan_ws(const char *p, const char *end)
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

const char *agw_jscan_string(const char *s, const char *end, bool *escaped)
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

/* A number, within the limits (include/agw/jscan.h). Returns the byte after it, or NULL. */
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
    if (p == d || p - d > AGW_JSCAN_INT_DIGITS || (p < end && *p >= '0' && *p <= '9'))
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
        if (p == d || p - d > AGW_JSCAN_EXP_DIGITS)
            return NULL;
    }
    return p;
}

bool agw_jscan_open(struct agw_jscan *it, const char *p, const char *end, unsigned depth,
                    bool strict)
{
    if (p == end || (*p != '{' && *p != '['))
        return false;
    it->p = p + 1;
    it->end = end;
    it->depth = depth;
    it->strict = strict;
    it->object = *p == '{';
    it->first = true;
    it->n_keys = 0;
    return true;
}

/* A key at <p> (its opening quote) of <it>, strictly as the header says: the byte after its
 * closing quote, or NULL. */
static const char *scan_key(struct agw_jscan *it, const char *p, const char **key, size_t *len)
{
    const char *k = p + 1;
    bool escaped = false;
    size_t n;

    if (p == it->end || *p != '"' || (p = agw_jscan_string(p, it->end, &escaped)) == NULL)
        return NULL;
    n = (size_t)(p - k) - 1;
    if (it->strict) {
        if (escaped || it->n_keys == AGW_JSCAN_MAX_KEYS)
            return NULL;
        for (size_t i = 0; i < it->n_keys; i++)
            if (it->key_len[i] == n && memcmp(it->key[i], k, n) == 0)
                return NULL;
        it->key[it->n_keys] = k;
        it->key_len[it->n_keys++] = n;
    }
    *key = k;
    *len = n;
    return p;
}

int agw_jscan_next(struct agw_jscan *it, const char **key, size_t *key_len)
{
    const char *p = agw_jscan_ws(it->p, it->end), *k = NULL;
    size_t n = 0;

    if (p == it->end)
        return -1;
    if (*p == (it->object ? '}' : ']')) {
        it->p = p + 1;
        return 0;
    }
    if (!it->first) {
        if (*p++ != ',')
            return -1;
        p = agw_jscan_ws(p, it->end);
    }
    it->first = false;
    if (it->object) {
        if ((p = scan_key(it, p, &k, &n)) == NULL)
            return -1;
        p = agw_jscan_ws(p, it->end);
        if (p == it->end || *p++ != ':')
            return -1;
        p = agw_jscan_ws(p, it->end);
    }
    if (p == it->end) /* a value must follow */
        return -1;
    if (key != NULL)
        *key = k;
    if (key_len != NULL)
        *key_len = n;
    it->p = p;
    return 1;
}

bool agw_jscan_skip(struct agw_jscan *it)
{
    it->p = agw_jscan_value(it->p, it->end, it->depth, it->strict);
    return it->p != NULL;
}

bool agw_jscan_enter(struct agw_jscan *child, const struct agw_jscan *parent)
{
    return parent->depth > 0 &&
           agw_jscan_open(child, parent->p, parent->end, parent->depth - 1, parent->strict);
}

void agw_jscan_leave(struct agw_jscan *parent, const struct agw_jscan *child)
{
    parent->p = child->p;
}

const char *agw_jscan_value(const char *p, const char *end, unsigned depth, bool strict)
{
    struct agw_jscan it;
    int rc;

    if (p == end)
        return NULL;
    switch (*p) {
    case '"':
        return agw_jscan_string(p, end, NULL);
    case '{':
    case '[':
        if (depth == 0 || !agw_jscan_open(&it, p, end, depth - 1, strict))
            return NULL;
        while ((rc = agw_jscan_next(&it, NULL, NULL)) == 1)
            if (!agw_jscan_skip(&it))
                return NULL;
        return rc == 0 ? it.p : NULL;
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
