/* A JSON scanner that builds nothing: it reads bytes as jansson would read them, within limits
 * of its own, and says only "this is what jansson reads" or "not judged". Every caller keeps
 * jansson behind it: when the scanner gives up (invalid JSON, or valid JSON past its limits), the
 * caller parses with jansson, which decides and reports. So the scanner may refuse more than
 * jansson, never accept what jansson would read differently.
 *
 * What it accepts, exactly as jansson 2.14 reads it (json_loadb with JSON_DECODE_ANY and
 * JSON_ALLOW_NUL, or without them, the same for what is accepted here):
 * - strings: valid UTF-8, no control byte, escapes among \" \\ \/ \b \f \n \r \t \uXXXX,
 * surrogates in pairs only; not \u0000 (jansson takes it only with JSON_ALLOW_NUL);
 * - numbers: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? with at most AGW_JSCAN_INT_DIGITS
 * digits before the point and AGW_JSCAN_EXP_DIGITS in the exponent (no overflow, which jansson
 * refuses);
 * - true, false, null, arrays and objects nested at most <depth> levels (the callers' limit);
 * - whitespace: space, tab, LF, CR.
 * Strictly (<strict>), an object's keys are also written without an escape (an escaped key may
 * spell another) and none is given twice (jansson keeps the last one, a reader of the first would
 * see another document), with at most AGW_JSCAN_MAX_KEYS keys in one object.
 *
 * Pure; no allocation; never reads past <end>. */
#ifndef AGW_JSCAN_H
#define AGW_JSCAN_H

#include "agw/common.h"

#define AGW_JSCAN_INT_DIGITS 18 /* always fit jansson's json_int_t and keep a real finite */
#define AGW_JSCAN_EXP_DIGITS 2
#define AGW_JSCAN_MAX_KEYS   64

/* The first byte at or after <p> that is not JSON whitespace (or <end>). */
const char *agw_jscan_ws(const char *p, const char *end);

/* The string whose opening quote is at <p>: the byte after its closing quote, or NULL. *<escaped>
 * (may be NULL) tells whether it holds an escape. The raw bytes between the quotes are whole
 * characters and whole escapes: two such strings concatenated are one such string. */
const char *agw_jscan_string(const char *p, const char *end, bool *escaped);

/* Any value at <p> (no whitespace before it), with at most <depth> levels of arrays and objects
 * (a scalar needs none): the byte after it, or NULL. */
const char *agw_jscan_value(const char *p, const char *end, unsigned depth, bool strict);

/* A walk over one array or object, member by member, for a caller that looks into some values and
 * skips the others, scanning every byte once:
 *
 *     struct agw_jscan it;
 *     if (!agw_jscan_open(&it, p, end, depth, true)) ... not judged
 *     while ((rc = agw_jscan_next(&it, &key, &key_len)) == 1) {
 *         (it.p is at the value: either agw_jscan_skip(&it), or agw_jscan_enter(&child, &it),
 *          walk the child to its end, then agw_jscan_leave(&it, &child))
 *     }
 *     rc == 0: it.p is after the closing bracket; rc < 0: not judged
 *
 * A value that is never skipped nor left is not scanned: the walk must consume each. */
struct agw_jscan {
    const char *p, *end;
    unsigned depth; /* levels the values may still open */
    bool strict;
    bool object; /* an object (keys) or an array */
    bool first;  /* no member read yet */
    size_t n_keys;
    const char *key[AGW_JSCAN_MAX_KEYS]; /* strictly: the keys read so far, between the quotes */
    size_t key_len[AGW_JSCAN_MAX_KEYS];
};

/* Opens the array or object whose bracket is at <p>; its values may open <depth> more levels.
 * False when <p> is neither. */
bool agw_jscan_open(struct agw_jscan *it, const char *p, const char *end, unsigned depth,
                    bool strict);
/* The next member: 1 with it->p at its value's first byte (it->p < it->end; and, in an object, its
 * key's bytes between the quotes in *<key>, *<key_len>; both may be NULL), 0 at the end (it->p
 * after the closing bracket), -1 when not judged. */
int agw_jscan_next(struct agw_jscan *it, const char **key, size_t *key_len);
/* Scans the value at it->p and moves past it. False when not judged. */
bool agw_jscan_skip(struct agw_jscan *it);
/* Opens the value at <parent>'s p (an array or object) as <child>, one level deeper. False when it
 * is neither, or no level is left. */
bool agw_jscan_enter(struct agw_jscan *child, const struct agw_jscan *parent);
/* After <child> (entered from <parent>) reached its end: <parent> goes on after it. */
void agw_jscan_leave(struct agw_jscan *parent, const struct agw_jscan *child);

#endif
