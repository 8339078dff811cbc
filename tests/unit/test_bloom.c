/* Unit tests for src/bloom.c: no string added is ever refused, strings never added are refused but
 * for the rate the sizing promises (at the capacity and at twice it), the capacity and the bytes
 * follow the request. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "agw/bloom.h"

/* UUID-shaped ids, as @ag-ui/client draws thread ids; <salt> keeps two sets apart. */
static size_t id(char *buf, size_t cap, unsigned salt, unsigned i)
{
    return (size_t)snprintf(buf, cap, "%08x-%04x-4%03x-a%03x-%012x", i * 2654435761u, salt,
                            i & 0xfff, (i >> 12) & 0xfff, i ^ (salt << 8));
}

static double false_rate(struct agw_bloom *b, unsigned n)
{
    char buf[64];
    unsigned hits = 0;

    for (unsigned i = 0; i < n; i++) {
        size_t len = id(buf, sizeof(buf), 0xbeef, i);
        hits += agw_bloom_may_hold(b, buf, len);
    }
    return (double)hits / n;
}

Test(bloom, holds_every_string_added_and_refuses_others_at_the_promised_rate)
{
    struct agw_bloom *b = agw_bloom_new(100000);
    size_t cap = agw_bloom_capacity(b);
    char buf[64];

    cr_assert_geq(cap, 100000);
    cr_assert_eq(agw_bloom_bytes(b) * 8, cap * 16, "16 bits a member");
    for (unsigned i = 0; i < cap; i++) {
        size_t len = id(buf, sizeof(buf), 1, i);
        agw_bloom_add(b, buf, len);
    }
    cr_assert_eq(agw_bloom_count(b), cap);
    for (unsigned i = 0; i < cap; i++) {
        size_t len = id(buf, sizeof(buf), 1, i);
        cr_assert(agw_bloom_may_hold(b, buf, len), "%s was added", buf);
    }
    /* at its capacity: about 0.25 % */
    double at_cap = false_rate(b, 200000);
    cr_assert_lt(at_cap, 0.006, "false positives at capacity: %.4f", at_cap);
    cr_assert_gt(at_cap, 0.0, "a filter that refuses everything would be no filter");
    /* at twice its capacity: worse, still small */
    for (unsigned i = (unsigned)cap; i < 2 * cap; i++) {
        size_t len = id(buf, sizeof(buf), 1, i);
        agw_bloom_add(b, buf, len);
    }
    double at_twice = false_rate(b, 200000);
    cr_assert_lt(at_twice, 0.04, "false positives at twice the capacity: %.4f", at_twice);
    cr_assert_gt(at_twice, at_cap);
    for (unsigned i = 0; i < 2 * cap; i += 97) {
        size_t len = id(buf, sizeof(buf), 1, i);
        cr_assert(agw_bloom_may_hold(b, buf, len), "%s was added", buf);
    }
    agw_bloom_free(b);
}

Test(bloom, an_empty_filter_refuses_everything_and_small_ones_are_rounded_up)
{
    struct agw_bloom *b = agw_bloom_new(0);

    cr_assert_geq(agw_bloom_capacity(b), 1024);
    cr_assert_eq(agw_bloom_count(b), 0);
    cr_assert_not(agw_bloom_may_hold(b, "thread-1", 8));
    cr_assert_not(agw_bloom_may_hold(b, "", 0));
    agw_bloom_add(b, "", 0);
    cr_assert(agw_bloom_may_hold(b, "", 0));
    /* the length counts, not a terminator */
    agw_bloom_add(b, "thread-1x", 8);
    cr_assert(agw_bloom_may_hold(b, "thread-1", 8));
    agw_bloom_free(b);
    agw_bloom_free(NULL);
}
