/* Unit tests for src/common.c. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "agw/common.h"

Test(common, strdup_and_strndup)
{
    char *a = agw_xstrdup("hello");
    char *b = agw_xstrndup("hello world", 5);

    cr_assert_str_eq(a, "hello");
    cr_assert_str_eq(b, "hello");
    free(a);
    free(b);
}

Test(common, zero_sized_allocations_are_valid_pointers)
{
    void *p = agw_xmalloc(0), *q = agw_xcalloc(0, 0);

    cr_assert_not_null(p);
    cr_assert_not_null(q);
    p = agw_xrealloc(p, 0);
    cr_assert_not_null(p);
    free(p);
    free(q);
}

Test(common, random_hex_is_hex_and_unique)
{
    char a[33], b[33];

    agw_random_hex(a, 16);
    agw_random_hex(b, 16);
    cr_assert_eq(strlen(a), 32);
    cr_assert_eq(strspn(a, "0123456789abcdef"), 32);
    cr_assert_str_neq(a, b);
}

Test(common, strieq_n)
{
    cr_assert(agw_strieq_n("Content-Type", 12, "content-type"));
    cr_assert(agw_strieq_n("ABC", 3, "abc"));
    cr_assert_not(agw_strieq_n("ABC", 2, "abc"), "a prefix is not equal");
    cr_assert_not(agw_strieq_n("ABCD", 4, "abc"), "longer is not equal");
    cr_assert(agw_strieq_n("", 0, ""));
}

Test(common, clocks_move_forward)
{
    uint64_t a = agw_now_ms(), w = agw_wall_ms();

    cr_assert_gt(w, (uint64_t)1600000000000ULL, "wall clock in ms since the epoch");
    cr_assert_geq(agw_now_ms(), a);
}

/* The coarse clock is the same clock as of the kernel's last tick: never ahead of agw_now_ms() read
 * after it, never far behind (a tick is 1-10 ms; 100 allows for a descheduled test). */
Test(common, the_coarse_clock_trails_the_monotonic_one_by_a_tick)
{
    for (int i = 0; i < 100000; i++) {
        uint64_t c = agw_now_ms_coarse(), m = agw_now_ms();

        cr_assert_leq(c, m, "coarse %llu ahead of %llu", (unsigned long long)c,
                      (unsigned long long)m);
        cr_assert_lt(m - c, 100, "coarse %llu ms behind", (unsigned long long)(m - c));
    }
}

Test(common, header_has_token)
{
    cr_assert(agw_header_has_token("close", "close"));
    cr_assert(agw_header_has_token("Keep-Alive, Upgrade", "upgrade"));
    cr_assert(agw_header_has_token(" a ,\tclose\t, b", "close"));
    cr_assert_not(agw_header_has_token("closed", "close"));
    cr_assert_not(agw_header_has_token("", "close"));
    cr_assert_not(agw_header_has_token(NULL, "close"));
}

Test(common, utf8_seq_is_strict)
{
    const unsigned char ok2[] = {0xc3, 0xa9}, ok3[] = {0xe2, 0x82, 0xac},
                        ok4[] = {0xf0, 0x9f, 0x98, 0x80};
    const unsigned char overlong[] = {0xc0, 0xaf}, overlong3[] = {0xe0, 0x80, 0xaf};
    const unsigned char surrogate[] = {0xed, 0xa0, 0x80}, too_big[] = {0xf4, 0x90, 0x80, 0x80};
    const unsigned char cont[] = {0x80}, bad_cont[] = {0xc3, 0x28};

    cr_assert_eq(agw_utf8_seq(ok2, ok2 + 2), 2);
    cr_assert_eq(agw_utf8_seq(ok3, ok3 + 3), 3);
    cr_assert_eq(agw_utf8_seq(ok4, ok4 + 4), 4);
    cr_assert_eq(agw_utf8_seq(ok4, ok4 + 3), 0, "truncated");
    cr_assert_eq(agw_utf8_seq(overlong, overlong + 2), 0);
    cr_assert_eq(agw_utf8_seq(overlong3, overlong3 + 3), 0);
    cr_assert_eq(agw_utf8_seq(surrogate, surrogate + 3), 0);
    cr_assert_eq(agw_utf8_seq(too_big, too_big + 4), 0);
    cr_assert_eq(agw_utf8_seq(cont, cont + 1), 0);
    cr_assert_eq(agw_utf8_seq(bad_cont, bad_cont + 2), 0);
}

Test(common, utf8_valid_walks_every_sequence)
{
    cr_assert(agw_utf8_valid("", 0));
    cr_assert(agw_utf8_valid("plain ascii", 11));
    cr_assert(agw_utf8_valid("a\0b", 3), "NUL is ASCII");
    cr_assert(agw_utf8_valid("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14));
    cr_assert_not(agw_utf8_valid("caf\xc3", 4), "truncated at the end");
    cr_assert_not(agw_utf8_valid("\xc3\xa9\xa9", 3), "a stray continuation byte");
    cr_assert_not(agw_utf8_valid("x\xed\xa0\x80", 4), "a surrogate");
    cr_assert_not(agw_utf8_valid("\xc0\xaf", 2), "overlong");
}
