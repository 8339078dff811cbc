/* A Bloom filter over strings: a set that answers "certainly not in it" or "perhaps in it", in a
 * fixed number of bits and without the strings (doc/internals/store.md, "Threads new to the
 * database"). No false negatives: a string added is always "perhaps in it". A string never added
 * is "perhaps" with a probability that grows as the filter fills: about 0.3 % at its capacity
 * (16 bits and 4 probes per member), about 2.5 % at twice it, 8 % at three times. Nothing is ever
 * removed.
 *
 * Not thread-safe: one owner. */
#ifndef AGW_BLOOM_H
#define AGW_BLOOM_H

#include "agw/common.h"

struct agw_bloom;

/* A filter for <capacity> members (at least 1024; the bits are rounded up to a power of two);
 * aborts on allocation failure, as agw_xmalloc() does. */
struct agw_bloom *agw_bloom_new(size_t capacity);
void agw_bloom_free(struct agw_bloom *b);

void agw_bloom_add(struct agw_bloom *b, const char *s, size_t len);
/* false: <s> was never added. */
bool agw_bloom_may_hold(const struct agw_bloom *b, const char *s, size_t len);

/* The members it was sized for, the members added (a string added twice counts twice), its bits'
 * size in bytes. */
size_t agw_bloom_capacity(const struct agw_bloom *b);
size_t agw_bloom_count(const struct agw_bloom *b);
size_t agw_bloom_bytes(const struct agw_bloom *b);

#endif
