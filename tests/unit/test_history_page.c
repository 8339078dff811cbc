/* Unit tests for the paging half of src/history.c (agw_history_query_parse, agw_history_page): the
 * query parameters and each of their errors, every combination of cursors, limits and orders, the
 * run filter, the empty thread, and walks through a whole thread page by page, both ways. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agw/history.h"

/* A thread of <n> messages with ids "m0".."m<n-1>", message i made by run <runs>(i) (NULL = no
 * run). */
static struct agw_history *thread(size_t n, const char *(*runs)(size_t))
{
    struct agw_history *h = agw_history_new(1000);

    for (size_t i = 0; i < n; i++) {
        char id[32];
        json_t *m;

        snprintf(id, sizeof(id), "m%zu", i);
        m = json_pack("[{s:s, s:s, s:s}]", "id", id, "role", "user", "content", "x");
        cr_assert_eq(agw_history_merge_input(h, runs != NULL ? runs(i) : "r", m), 1);
        json_decref(m);
    }
    return h;
}

/* The byte budget of the pages page() asks for (0: the default). */
static size_t page_max_bytes;

static json_t *page(struct agw_history *h, const char *qs)
{
    struct agw_history_query q;
    char err[256] = "";

    cr_assert_eq(agw_history_query_parse(qs, &q, err, sizeof(err)), 0, "%s: %s", qs, err);
    cr_assert_eq(q.max_bytes, AGW_HISTORY_PAGE_BYTES);
    if (page_max_bytes > 0)
        q.max_bytes = page_max_bytes;
    return agw_history_page(h, &q);
}

/* The bytes of <msgs>' messages as compact JSON. */
static size_t page_size(const json_t *msgs)
{
    size_t k, sum = 0;
    json_t *m;

    json_array_foreach(msgs, k, m)
    {
        sum += json_dumpb(m, NULL, 0, JSON_COMPACT);
    }
    return sum;
}

/* The index of message "m<i>". */
static long msg_index(const json_t *m)
{
    const char *id = json_string_value(json_object_get(m, "id"));
    cr_assert(id != NULL && id[0] == 'm');
    return strtol(id + 1, NULL, 10);
}

/* -1 when the cursor is left out (never null). */
static long cursor(const json_t *p, const char *key)
{
    const json_t *v = json_object_get(p, key);
    cr_assert(v == NULL || json_is_integer(v), "%s", key);
    return v == NULL ? -1 : (long)json_integer_value(v);
}

/* The page for <qs> holds the messages of the indices <ids> ("3,4,5", "" for none), in that order,
 * with these has_more, next_cursor and prev_cursor (-1 = left out). */
static void expect(struct agw_history *h, const char *qs, const char *ids, bool more, long next,
                   long prev)
{
    json_t *p = page(h, qs), *msgs = json_object_get(p, "messages");
    char got[4096] = "";
    size_t k;
    json_t *m;

    cr_assert_eq(json_object_size(p), 2 + (size_t)(next >= 0) + (size_t)(prev >= 0), "%s", qs);
    cr_assert(json_is_array(msgs), "%s", qs);
    json_array_foreach(msgs, k, m)
    {
        size_t len = strlen(got);
        snprintf(got + len, sizeof(got) - len, "%s%ld", k ? "," : "", msg_index(m));
    }
    cr_assert_str_eq(got, ids, "%s: messages", qs);
    cr_assert(json_is_boolean(json_object_get(p, "has_more")), "%s", qs);
    cr_assert_eq(json_is_true(json_object_get(p, "has_more")), more, "%s: has_more", qs);
    cr_assert_eq(cursor(p, "next_cursor"), next, "%s: next_cursor", qs);
    cr_assert_eq(cursor(p, "prev_cursor"), prev, "%s: prev_cursor", qs);
    json_decref(p);
}

/* ---- the query string ---------------------------------------------------------------------------
 */

static void expect_defaults(const struct agw_history_query *q)
{
    cr_assert_eq(q->limit, AGW_HISTORY_LIMIT_DEFAULT);
    cr_assert(!q->has_after && !q->has_before && !q->desc);
    cr_assert_str_eq(q->run_id, "");
}

Test(history_page, query_defaults)
{
    static const char *const qs[] = {NULL, "", "&", "&&&"};
    struct agw_history_query q;

    cr_assert_eq(AGW_HISTORY_LIMIT_DEFAULT, 50);
    cr_assert_eq(AGW_HISTORY_LIMIT_MAX, 200);
    for (size_t i = 0; i < AGW_ARRAY_LEN(qs); i++) {
        cr_assert_eq(agw_history_query_parse(qs[i], &q, NULL, 0), 0);
        expect_defaults(&q);
    }
}

Test(history_page, query_every_parameter)
{
    struct agw_history_query q;
    char err[128];

    cr_assert_eq(agw_history_query_parse("limit=10&after=3&before=0009&order=desc&run_id=r%2F1%e2"
                                         "%82%AC+x",
                                         &q, err, sizeof(err)),
                 0, "%s", err);
    cr_assert_eq(q.limit, 10);
    cr_assert(q.has_after && q.has_before && q.desc);
    cr_assert_eq(q.after, 3);
    cr_assert_eq(q.before, 9);
    cr_assert_str_eq(q.run_id, "r/1\xe2\x82\xac x");

    /* names are decoded too, empty pairs are skipped, order=asc is the default spelled out */
    cr_assert_eq(agw_history_query_parse("&%72un_id=a&&order=asc&after=0&", &q, err, sizeof(err)),
                 0, "%s", err);
    cr_assert_str_eq(q.run_id, "a");
    cr_assert(q.has_after && !q.has_before && !q.desc);
    cr_assert_eq(q.after, 0);

    /* a cursor past SIZE_MAX saturates; after >= before is an empty page, not an error */
    cr_assert_eq(
        agw_history_query_parse("after=99999999999999999999999999&before=1", &q, err, sizeof(err)),
        0);
    cr_assert_eq(q.after, SIZE_MAX);
    cr_assert_eq(q.before, 1);
}

Test(history_page, query_limit_is_clamped)
{
    static const struct {
        const char *qs;
        size_t limit;
    } cases[] = {
        {"limit=1", 1},     {"limit=50", 50},   {"limit=200", 200},
        {"limit=0", 1},     {"limit=500", 200}, {"limit=-3", 1},
        {"limit=201", 200}, {"limit=007", 7},   {"limit=99999999999999999999999", 200},
    };
    struct agw_history_query q;

    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        cr_assert_eq(agw_history_query_parse(cases[i].qs, &q, NULL, 0), 0, "%s", cases[i].qs);
        cr_assert_eq(q.limit, cases[i].limit, "%s", cases[i].qs);
    }
}

Test(history_page, query_errors)
{
    char long_run[300] = "run_id=";
    static const struct {
        const char *qs, *err;
    } cases[] = {
        {"limit=abc", "bad request: limit must be an integer"},
        {"limit=", "bad request: limit must be an integer"},
        {"limit", "bad request: limit must be an integer"},
        {"limit=1.5", "bad request: limit must be an integer"},
        {"limit=%2B1", "bad request: limit must be an integer"},
        {"limit=1+", "bad request: limit must be an integer"},
        {"limit=-", "bad request: limit must be an integer"},
        {"after=-1", "bad request: after must be a non-negative integer"},
        {"after=x", "bad request: after must be a non-negative integer"},
        {"after=", "bad request: after must be a non-negative integer"},
        {"before=1e3", "bad request: before must be a non-negative integer"},
        {"before", "bad request: before must be a non-negative integer"},
        {"order=up", "bad request: order must be asc or desc"},
        {"order=ASC", "bad request: order must be asc or desc"},
        {"order=", "bad request: order must be asc or desc"},
        {"run_id=", "bad request: run_id cannot be empty"},
        {"run_id", "bad request: run_id cannot be empty"},
        {"run_id=%zz", "bad request: run_id is not validly percent-encoded"},
        {"run_id=a%2", "bad request: run_id is not validly percent-encoded"},
        {"run_id=a%00b", "bad request: run_id is not validly percent-encoded"},
        {"limit=%", "bad request: limit is not validly percent-encoded"},
        {"foo=1", "bad request: unknown query parameter 'foo'"},
        {"limit=2&Limit=3", "bad request: unknown query parameter 'Limit'"},
        {"limit=2&cursor", "bad request: unknown query parameter 'cursor'"},
        {"thread_id_or_anything_long=1",
         "bad request: unknown query parameter 'thread_id_or_anything_long'"},
        {"limit=1&limit=2", "bad request: limit is given more than once"},
        {"order=asc&%6Frder=desc", "bad request: order is given more than once"},
        {"%zz=1", "bad request: a query parameter name is not validly percent-encoded"},
        {"=1", "bad request: a query parameter has no name"},
        {"limit=2&=", "bad request: a query parameter has no name"},
    };
    struct agw_history_query q;
    char err[256];

    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        /* every field set first: an error leaves the defaults */
        memset(&q, 0x5a, sizeof(q));
        err[0] = '\0';
        cr_assert_eq(agw_history_query_parse(cases[i].qs, &q, err, sizeof(err)), -AGW_EINVAL,
                     "accepted: %s", cases[i].qs);
        cr_assert_str_eq(err, cases[i].err, "%s", cases[i].qs);
        expect_defaults(&q);
        cr_assert_eq(agw_history_query_parse(cases[i].qs, &q, NULL, 0), -AGW_EINVAL);
    }

    /* run_id: AGW_ID_MAX bytes once decoded, not one more */
    memset(long_run + 7, 'a', AGW_ID_MAX);
    long_run[7 + AGW_ID_MAX] = '\0';
    cr_assert_eq(agw_history_query_parse(long_run, &q, err, sizeof(err)), 0);
    cr_assert_eq(strlen(q.run_id), AGW_ID_MAX);
    strcat(long_run, "a");
    cr_assert_eq(agw_history_query_parse(long_run, &q, err, sizeof(err)), -AGW_EINVAL);
    cr_assert_str_eq(err, "bad request: run_id is longer than 256 bytes");
    /* a short buffer gets a truncated message, never an overflow */
    cr_assert_eq(agw_history_query_parse("foo", &q, err, 12), -AGW_EINVAL);
    cr_assert_str_eq(err, "bad request");
}

/* ---- pages --------------------------------------------------------------------------------------
 */

Test(history_page, ascending_every_cursor_combination)
{
    struct agw_history *h = thread(10, NULL);

    /* no cursor: from the start */
    expect(h, NULL, "0,1,2,3,4,5,6,7,8,9", false, -1, -1);
    expect(h, "limit=200", "0,1,2,3,4,5,6,7,8,9", false, -1, -1);
    expect(h, "limit=3", "0,1,2", true, 2, -1);
    expect(h, "limit=1", "0", true, 0, -1);
    expect(h, "limit=10", "0,1,2,3,4,5,6,7,8,9", false, -1, -1);
    /* after: the page just after it */
    expect(h, "after=3&limit=3", "4,5,6", true, 6, 4);
    expect(h, "after=6&limit=3", "7,8,9", false, -1, 7);
    expect(h, "after=7&limit=3", "8,9", false, -1, 8);
    expect(h, "after=0", "1,2,3,4,5,6,7,8,9", false, -1, 1);
    expect(h, "after=9", "", false, -1, -1);
    expect(h, "after=1000", "", false, -1, -1);
    /* before alone: the page just before it, still oldest first, to read on with next_cursor */
    expect(h, "before=6&limit=3", "3,4,5", false, 5, 3);
    expect(h, "before=2&limit=3", "0,1", false, 1, -1);
    expect(h, "before=0", "", false, -1, -1);
    expect(h, "before=1000&limit=2", "8,9", false, -1, 8);
    expect(h, "before=10", "0,1,2,3,4,5,6,7,8,9", false, -1, -1);
    /* both: a window read from its start; has_more stays inside it, the cursors do not */
    expect(h, "after=2&before=8&limit=3", "3,4,5", true, 5, 3);
    expect(h, "after=2&before=6&limit=3", "3,4,5", false, 5, 3);
    expect(h, "after=2&before=6", "3,4,5", false, 5, 3);
    expect(h, "after=5&before=6", "", false, -1, -1);
    expect(h, "after=5&before=5", "", false, -1, -1);
    expect(h, "after=7&before=3", "", false, -1, -1);
    expect(h, "after=0&before=9&limit=8", "1,2,3,4,5,6,7,8", false, 8, 1);
    agw_history_free(h);
}

Test(history_page, descending_every_cursor_combination)
{
    struct agw_history *h = thread(10, NULL);

    /* no cursor: from the end */
    expect(h, "order=desc", "9,8,7,6,5,4,3,2,1,0", false, -1, -1);
    expect(h, "order=desc&limit=200", "9,8,7,6,5,4,3,2,1,0", false, -1, -1);
    expect(h, "order=desc&limit=3", "9,8,7", true, 7, -1);
    expect(h, "order=desc&limit=1", "9", true, 9, -1);
    /* before: the page just before it */
    expect(h, "order=desc&before=6&limit=3", "5,4,3", true, 3, 5);
    expect(h, "order=desc&before=3&limit=3", "2,1,0", false, -1, 2);
    expect(h, "order=desc&before=2&limit=3", "1,0", false, -1, 1);
    expect(h, "order=desc&before=0", "", false, -1, -1);
    expect(h, "order=desc&before=1000&limit=2", "9,8", true, 8, -1);
    /* after alone: the page just after it, still newest first */
    expect(h, "order=desc&after=3&limit=3", "6,5,4", false, 4, 6);
    expect(h, "order=desc&after=7&limit=3", "9,8", false, 8, -1);
    expect(h, "order=desc&after=9", "", false, -1, -1);
    expect(h, "limit=4&order=desc&after=0", "4,3,2,1", false, 1, 4);
    /* both: a window read from its end */
    expect(h, "order=desc&after=2&before=8&limit=3", "7,6,5", true, 5, 7);
    expect(h, "order=desc&after=4&before=8&limit=3", "7,6,5", false, 5, 7);
    expect(h, "order=desc&after=5&before=6", "", false, -1, -1);
    expect(h, "order=desc&after=8&before=2", "", false, -1, -1);
    agw_history_free(h);
}

Test(history_page, default_limit_and_clamps)
{
    struct agw_history *h = thread(250, NULL);
    json_t *p;

    p = page(h, NULL);
    cr_assert_eq(json_array_size(json_object_get(p, "messages")), 50);
    cr_assert_eq(cursor(p, "next_cursor"), 49);
    cr_assert(json_is_true(json_object_get(p, "has_more")));
    json_decref(p);
    p = page(h, "limit=500");
    cr_assert_eq(json_array_size(json_object_get(p, "messages")), 200);
    cr_assert_eq(cursor(p, "next_cursor"), 199);
    json_decref(p);
    p = page(h, "limit=200&order=desc");
    cr_assert_eq(json_array_size(json_object_get(p, "messages")), 200);
    cr_assert_eq(cursor(p, "next_cursor"), 50);
    json_decref(p);
    p = page(h, "limit=200&after=49");
    cr_assert_eq(json_array_size(json_object_get(p, "messages")), 200);
    cr_assert(!json_is_true(json_object_get(p, "has_more")));
    cr_assert_eq(cursor(p, "next_cursor"), -1);
    cr_assert_eq(cursor(p, "prev_cursor"), 50);
    json_decref(p);
    expect(h, "limit=0", "0", true, 0, -1);
    expect(h, "limit=0&order=desc", "249", true, 249, -1);
    agw_history_free(h);
}

/* r1: 0,1,4,5,8,9; r2: 2,3,6,7; message 10 has no run. */
static const char *two_runs(size_t i)
{
    return i == 10 ? NULL : (i / 2) % 2 == 0 ? "r1" : "r2";
}

Test(history_page, run_filter)
{
    struct agw_history *h = thread(11, two_runs);

    cr_assert_null(agw_history_run_id(h, 10));
    expect(h, NULL, "0,1,2,3,4,5,6,7,8,9,10", false, -1, -1);
    expect(h, "run_id=r2&limit=2", "2,3", true, 3, -1);
    expect(h, "run_id=r2&limit=2&after=3", "6,7", false, -1, 6);
    expect(h, "run_id=r2&after=1&before=7", "2,3,6", false, 6, -1);
    expect(h, "run_id=r2&order=desc&limit=3", "7,6,3", true, 3, -1);
    expect(h, "run_id=r2&order=desc&before=3", "2", false, -1, 2);
    expect(h, "run_id=r1&after=1&limit=1", "4", true, 4, 4);
    expect(h, "run_id=r1&before=4&limit=5", "0,1", false, 1, -1);
    expect(h, "run_id=r1&order=desc", "9,8,5,4,1,0", false, -1, -1);
    expect(h, "run_id=r1&order=desc&after=5", "9,8", false, 8, -1);
    expect(h, "run_id=r1&after=9", "", false, -1, -1);
    expect(h, "run_id=r2&after=7", "", false, -1, -1);
    expect(h, "run_id=r3", "", false, -1, -1);
    expect(h, "run_id=r3&order=desc&after=1&before=9", "", false, -1, -1);
    agw_history_free(h);
}

Test(history_page, empty_thread)
{
    static const char *const qs[] = {
        NULL,
        "order=desc",
        "after=0",
        "before=0",
        "before=5",
        "after=0&before=5",
        "limit=1",
        "limit=200&order=desc&after=3",
        "order=desc&before=2",
        "run_id=r",
        "after=2&before=1&order=desc&run_id=x",
    };
    struct agw_history *h = agw_history_new(5);

    for (size_t i = 0; i < AGW_ARRAY_LEN(qs); i++)
        expect(h, qs[i], "", false, -1, -1);
    agw_history_free(h);
}

Test(history_page, messages_are_copies)
{
    struct agw_history *h = thread(2, NULL);
    json_t *p = page(h, NULL), *m = json_array_get(json_object_get(p, "messages"), 0);
    json_t *ev = json_pack("{s:s, s:s, s:s}", "type", "TEXT_MESSAGE_CONTENT", "messageId", "m0",
                           "delta", "more");

    cr_assert(m != agw_history_message(h, 0));
    cr_assert(json_equal(m, agw_history_message(h, 0)));
    cr_assert_eq(agw_history_apply(h, "r", ev), 1);
    cr_assert_str_eq(json_string_value(json_object_get(agw_history_message(h, 0), "content")),
                     "xmore");
    cr_assert_str_eq(json_string_value(json_object_get(m, "content")), "x");
    json_decref(ev);
    agw_history_free(h);
    /* the page outlives the thread */
    cr_assert_str_eq(json_string_value(json_object_get(m, "id")), "m0");
    json_decref(p);
}

/* ---- walks --------------------------------------------------------------------------------------
 */

static const char *every_third_r2(size_t i)
{
    return i % 3 == 1 ? "r2" : "r1";
}

/* Walks the whole thread with <limit> in <order>, forward with next_cursor from the first page,
 * then backward with prev_cursor from the last page, and checks that both walks return <want>
 * (indices in reading order, <nwant> of them) exactly once each. */
static void walk(struct agw_history *h, size_t limit, bool desc, const char *run, const long *want,
                 size_t nwant)
{
    char qs[128], filter[32] = "";
    long *got = calloc(nwant + 1, sizeof(*got)), c = -1;
    size_t n = 0, pages = 0;

    if (run != NULL)
        snprintf(filter, sizeof(filter), "&run_id=%s", run);
    /* forward */
    for (;;) {
        json_t *p, *msgs, *m;
        size_t k;

        if (c < 0)
            snprintf(qs, sizeof(qs), "limit=%zu&order=%s%s", limit, desc ? "desc" : "asc", filter);
        else
            snprintf(qs, sizeof(qs), "limit=%zu&order=%s&%s=%ld%s", limit, desc ? "desc" : "asc",
                     desc ? "before" : "after", c, filter);
        p = page(h, qs);
        msgs = json_object_get(p, "messages");
        cr_assert(json_array_size(msgs) >= 1 || nwant == 0, "%s", qs);
        cr_assert(json_array_size(msgs) <= limit);
        cr_assert(json_array_size(msgs) <= 1 || page_size(msgs) <= page_max_bytes ||
                      page_max_bytes == 0,
                  "%s: %zu bytes", qs, page_size(msgs));
        json_array_foreach(msgs, k, m)
        {
            cr_assert(n < nwant, "%s: too many", qs);
            got[n++] = msg_index(m);
        }
        cr_assert_eq(cursor(p, "prev_cursor") < 0, pages == 0, "%s", qs);
        c = cursor(p, "next_cursor");
        /* no bound given: has_more and next_cursor agree */
        cr_assert_eq(json_is_true(json_object_get(p, "has_more")), c >= 0, "%s", qs);
        json_decref(p);
        pages++;
        cr_assert(pages <= nwant + 1, "%s: endless walk", qs);
        if (c < 0)
            break;
    }
    cr_assert_eq(n, nwant);
    for (size_t i = 0; i < nwant; i++)
        cr_assert_eq(got[i], want[i], "forward, limit %zu, %s: message %zu", limit,
                     desc ? "desc" : "asc", i);

    /* backward: from the last page of the forward walk, each page before it is prepended */
    memset(got, 0xff, (nwant + 1) * sizeof(*got));
    pages = 0;
    for (;;) {
        json_t *p = page(h, qs), *msgs = json_object_get(p, "messages");
        size_t len = json_array_size(msgs);

        cr_assert(len >= 1 || nwant == 0, "%s", qs);
        cr_assert(n >= len, "%s: too many", qs);
        for (size_t k = len; k > 0; k--)
            got[--n] = msg_index(json_array_get(msgs, k - 1));
        /* a page reached backward still leads forward, except the last one */
        cr_assert_eq(cursor(p, "next_cursor") >= 0, pages > 0, "%s", qs);
        c = cursor(p, "prev_cursor");
        json_decref(p);
        pages++;
        cr_assert(pages <= nwant + 1, "%s: endless walk", qs);
        if (c < 0)
            break;
        snprintf(qs, sizeof(qs), "limit=%zu&order=%s&%s=%ld%s", limit, desc ? "desc" : "asc",
                 desc ? "after" : "before", c, filter);
    }
    cr_assert_eq(n, 0);
    for (size_t i = 0; i < nwant; i++)
        cr_assert_eq(got[i], want[i], "backward, limit %zu, %s: message %zu", limit,
                     desc ? "desc" : "asc", i);
    free(got);
}

Test(history_page, walks_return_every_message_once_in_order)
{
    static const size_t limits[] = {1, 2, 3, 5, 7, 22, 23, 24, 50, 200};
    struct agw_history *h = thread(23, every_third_r2);
    long all[23], r2[23];
    size_t nr2 = 0;

    for (size_t i = 0; i < 23; i++) {
        all[i] = (long)i;
        if (i % 3 == 1)
            r2[nr2++] = (long)i;
    }
    for (size_t l = 0; l < AGW_ARRAY_LEN(limits); l++) {
        long rev[23];

        walk(h, limits[l], false, NULL, all, 23);
        walk(h, limits[l], false, "r2", r2, nr2);
        for (size_t i = 0; i < 23; i++)
            rev[i] = all[22 - i];
        walk(h, limits[l], true, NULL, rev, 23);
        for (size_t i = 0; i < nr2; i++)
            rev[i] = r2[nr2 - 1 - i];
        walk(h, limits[l], true, "r2", rev, nr2);
    }
    agw_history_free(h);
}

Test(history_page, walk_of_an_empty_thread_is_one_empty_page)
{
    struct agw_history *h = agw_history_new(3);

    walk(h, 1, false, NULL, NULL, 0);
    walk(h, 50, true, "r", NULL, 0);
    agw_history_free(h);
}

/* ---- the byte budget ----------------------------------------------------------------------------
 */

/* A thread of <n> messages "m0".."m<n-1>" (run "r1", every third "r2") whose contents are
 * <sizes>[i % nsizes] bytes long. */
static struct agw_history *sized_thread(size_t n, const size_t *sizes, size_t nsizes)
{
    struct agw_history *h = agw_history_new(1000);

    for (size_t i = 0; i < n; i++) {
        size_t len = sizes[i % nsizes];
        char id[32], *content = malloc(len + 1);
        json_t *m;

        memset(content, 'a' + (int)(i % 26), len);
        content[len] = '\0';
        snprintf(id, sizeof(id), "m%zu", i);
        m = json_pack("[{s:s, s:s, s:s}]", "id", id, "role", "user", "content", content);
        cr_assert_eq(agw_history_merge_input(h, every_third_r2(i), m), 1);
        json_decref(m);
        free(content);
    }
    return h;
}

Test(history_page, a_page_stops_at_four_mebibytes)
{
    /* messages of a mebibyte: three fit in 4 MiB, a fourth would not */
    static const size_t mib[] = {1 << 20};
    struct agw_history *h = sized_thread(10, mib, 1);

    expect(h, NULL, "0,1,2", true, 2, -1);
    expect(h, "after=2", "3,4,5", true, 5, 3);
    expect(h, "order=desc", "9,8,7", true, 7, -1);
    expect(h, "before=9", "6,7,8", false, 8, 6);
    expect(h, "limit=2", "0,1", true, 1, -1);
    agw_history_free(h);

    /* a message past the budget comes alone, in either order, and the walk goes on past it */
    static const size_t mixed[] = {100, (size_t)5 << 20, 100, 100};
    h = sized_thread(4, mixed, 4);
    expect(h, NULL, "0", true, 0, -1);
    expect(h, "after=0", "1", true, 1, 1);
    expect(h, "after=1", "2,3", false, -1, 2);
    expect(h, "order=desc", "3,2", true, 2, -1);
    expect(h, "order=desc&before=2", "1", true, 1, 1);
    agw_history_free(h);
}

Test(history_page, walks_under_a_byte_budget_return_every_message_once_in_order)
{
    /* contents of 10 to 700 bytes against budgets from one message's size to several */
    static const size_t sizes[] = {10, 700, 40, 300, 90, 10, 500};
    static const size_t budgets[] = {1, 200, 701, 1000, 2500};
    struct agw_history *h = sized_thread(23, sizes, AGW_ARRAY_LEN(sizes));
    long all[23], r2[23], rev[23];
    size_t nr2 = 0;

    for (size_t i = 0; i < 23; i++) {
        all[i] = (long)i;
        if (i % 3 == 1)
            r2[nr2++] = (long)i;
    }
    for (size_t b = 0; b < AGW_ARRAY_LEN(budgets); b++) {
        page_max_bytes = budgets[b];
        for (size_t limit = 1; limit <= 8; limit += 7) {
            walk(h, limit, false, NULL, all, 23);
            walk(h, limit, false, "r2", r2, nr2);
            for (size_t i = 0; i < 23; i++)
                rev[i] = all[22 - i];
            walk(h, limit, true, NULL, rev, 23);
            for (size_t i = 0; i < nr2; i++)
                rev[i] = r2[nr2 - 1 - i];
            walk(h, limit, true, "r2", rev, nr2);
        }
    }
    page_max_bytes = 0;
    agw_history_free(h);
}

Test(history_page, streamed_texts_count_as_their_bytes)
{
    /* five assistant answers of 1.5 MiB streamed in deltas of 64 KiB: two fit in 4 MiB */
    struct agw_history *h = agw_history_new(100);
    char *delta = malloc((64 << 10) + 1);

    memset(delta, 'z', 64 << 10);
    delta[64 << 10] = '\0';
    for (size_t i = 0; i < 5; i++) {
        char id[32];
        json_t *ev;

        snprintf(id, sizeof(id), "m%zu", i);
        ev = json_pack("{s:s, s:s, s:s}", "type", "TEXT_MESSAGE_START", "messageId", id, "role",
                       "assistant");
        cr_assert_eq(agw_history_apply(h, "r1", ev), 1);
        json_decref(ev);
        for (size_t k = 0; k < 24; k++) {
            ev = json_pack("{s:s, s:s, s:s}", "type", "TEXT_MESSAGE_CONTENT", "messageId", id,
                           "delta", delta);
            cr_assert_eq(agw_history_apply(h, "r1", ev), 1);
            json_decref(ev);
        }
    }
    free(delta);
    expect(h, NULL, "0,1", true, 1, -1);
    expect(h, "order=desc&before=4", "3,2", true, 2, 3);
    agw_history_free(h);
}
