/* Unit tests for src/history.c: each rule by which @ag-ui/client turns events into messages (text,
 * tool calls with and without parentMessageId, tool results, message snapshots), merging run inputs
 * (dedup by id, replace in place), the cap, the dump/load round trip and malformed input. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agw/common.h"
#include "agw/history.h"

static json_t *parse(const char *text)
{
    json_error_t err;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &err);
    cr_assert_not_null(v, "bad JSON in the test: %s: %s", err.text, text);
    return v;
}

/* Applies one event given as JSON text; returns what agw_history_apply() returned. */
static int ev(struct agw_history *h, const char *run_id, const char *text)
{
    json_t *e = parse(text);
    int rc = agw_history_apply(h, run_id, e);
    json_decref(e);
    return rc;
}

static int merge(struct agw_history *h, const char *run_id, const char *messages)
{
    json_t *m = parse(messages);
    int rc = agw_history_merge_input(h, run_id, m);
    json_decref(m);
    return rc;
}

/* The thread's messages equal the JSON array <expected>. */
static void expect(struct agw_history *h, const char *expected)
{
    json_t *want = parse(expected), *got = json_array();
    char *g;

    cr_assert(agw_history_index_ok(h), "the index by id agrees with the messages");
    for (size_t i = 0; i < agw_history_count(h); i++)
        json_array_append_new(got, json_deep_copy(agw_history_message(h, i)));
    g = json_dumps(got, JSON_COMPACT);
    cr_assert(json_equal(want, got), "messages:\n  got  %s\n  want %s", g, expected);
    free(g);
    json_decref(want);
    json_decref(got);
}

/* The content of message <i> on the thread's first page is <want>. */
static void expect_page_content(struct agw_history *h, size_t i, const char *want)
{
    struct agw_history_query q;
    json_t *page;

    cr_assert_eq(agw_history_query_parse("", &q, NULL, 0), 0);
    page = agw_history_page(h, &q);
    cr_assert_not_null(page);
    cr_assert_str_eq(json_string_value(json_object_get(
                         json_array_get(json_object_get(page, "messages"), i), "content")),
                     want);
    json_decref(page);
}

static void expect_runs(const struct agw_history *h, const char *const *runs, size_t n)
{
    cr_assert_eq(agw_history_count(h), n);
    for (size_t i = 0; i < n; i++) {
        const char *r = agw_history_run_id(h, i);
        if (runs[i] == NULL)
            cr_assert_null(r, "message %zu", i);
        else
            cr_assert_str_eq(r, runs[i], "message %zu", i);
    }
}

/* ---- text messages ----------------------------------------------------------------------------
 */

Test(history, text_start_creates_an_assistant_message_by_default)
{
    struct agw_history *h = agw_history_new(100);

    cr_assert_eq(ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}"), 1);
    expect(h, "[{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"\"}]");
    cr_assert_str_eq(agw_history_run_id(h, 0), "r1");
    agw_history_free(h);
}

Test(history, text_start_keeps_the_given_role)
{
    struct agw_history *h = agw_history_new(100);

    cr_assert_eq(
        ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"s\",\"role\":\"system\"}"),
        1);
    expect(h, "[{\"id\":\"s\",\"role\":\"system\",\"content\":\"\"}]");
    agw_history_free(h);
}

Test(history, text_start_for_a_known_id_changes_nothing)
{
    struct agw_history *h = agw_history_new(100);

    merge(h, "r1", "[{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"kept\"}]");
    cr_assert_eq(
        ev(h, "r2", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\",\"role\":\"user\"}"), 0);
    expect(h, "[{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"kept\"}]");
    cr_assert_str_eq(agw_history_run_id(h, 0), "r1");
    agw_history_free(h);
}

Test(history, text_content_appends_and_end_changes_nothing)
{
    struct agw_history *h = agw_history_new(100);

    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\",\"role\":\"assistant\"}");
    cr_assert_eq(
        ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"Hel\"}"),
        1);
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"lo, \"}");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"\"}");
    ev(h, "r1",
       "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"w\\u00f6rld "
       "\\ud83d\\ude00\"}");
    cr_assert_eq(ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a1\"}"), 0);
    expect(h, "[{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hello, w\\u00f6rld "
              "\\ud83d\\ude00\"}]");
    cr_assert_eq(agw_history_malformed(h), 0);
    agw_history_free(h);
}

Test(history, text_content_for_an_unknown_id_is_ignored)
{
    struct agw_history *h = agw_history_new(100);

    cr_assert_eq(
        ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"x\",\"delta\":\"a\"}"), 0);
    cr_assert_eq(ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"x\"}"), 0);
    cr_assert_eq(agw_history_count(h), 0);
    cr_assert_eq(agw_history_malformed(h), 0); /* well formed, only unknown: the client warns */
    agw_history_free(h);
}

Test(history, text_content_replaces_a_content_that_is_not_a_string)
{
    struct agw_history *h = agw_history_new(100);

    merge(h, "r1",
          "[{\"id\":\"u1\",\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"}]}]");
    ev(h, "r2", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"u1\",\"delta\":\"y\"}");
    expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"y\"}]");
    agw_history_free(h);
}

/* ---- tool calls ---------------------------------------------------------------------------------
 */

Test(history, tool_call_attaches_to_the_assistant_parent)
{
    struct agw_history *h = agw_history_new(100);

    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}");
    ev(h, "r1",
       "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"Let me check.\"}");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a1\"}");
    cr_assert_eq(
        ev(h, "r1",
           "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"weather\","
           "\"parentMessageId\":\"a1\"}"),
        1);
    ev(h, "r1", "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"{\\\"city\\\":\"}");
    ev(h, "r1", "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"\\\"Paris\\\"}\"}");
    cr_assert_eq(ev(h, "r1", "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c1\"}"), 0);
    expect(h, "[{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Let me check.\",\"toolCalls\":["
              "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"weather\","
              "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]}]");
    agw_history_free(h);
}

Test(history, tool_call_with_an_unknown_parent_makes_an_assistant_message_with_the_parent_id)
{
    struct agw_history *h = agw_history_new(100);

    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
       "\"parentMessageId\":\"p1\"}");
    /* a second call naming the same parent joins the message the first one made */
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c2\",\"toolCallName\":\"g\","
       "\"parentMessageId\":\"p1\"}");
    expect(h,
           "[{\"id\":\"p1\",\"role\":\"assistant\",\"toolCalls\":["
           "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}},"
           "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"\"}}]"
           "}]");
    cr_assert_str_eq(agw_history_run_id(h, 0), "r1");
    agw_history_free(h);
}

Test(history, tool_call_without_parent_makes_an_assistant_message_with_the_call_id)
{
    struct agw_history *h = agw_history_new(100);

    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}");
    ev(h, "r1", "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\"}");
    ev(h, "r1", "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c2\",\"toolCallName\":\"g\"}");
    /* never the last assistant message: each call without a parent gets its own */
    expect(
        h,
        "[{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"\"},"
        "{\"id\":\"c1\",\"role\":\"assistant\",\"toolCalls\":["
        "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]},"
        "{\"id\":\"c2\",\"role\":\"assistant\",\"toolCalls\":["
        "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"\"}}]}"
        "]");
    agw_history_free(h);
}

Test(history, tool_call_whose_parent_is_not_an_assistant_uses_the_call_id)
{
    struct agw_history *h = agw_history_new(100);

    merge(h, "r1", "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"hi\"}]");
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
       "\"parentMessageId\":\"u1\"}");
    expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"hi\"},"
              "{\"id\":\"c1\",\"role\":\"assistant\",\"toolCalls\":["
              "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
              "\"\"}}]}]");
    agw_history_free(h);
}

Test(history, tool_call_parent_then_text_of_the_same_id_share_one_message)
{
    struct agw_history *h = agw_history_new(100);

    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
       "\"parentMessageId\":\"m1\"}");
    cr_assert_eq(ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m1\"}"), 0);
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"ok\"}");
    expect(
        h,
        "[{\"id\":\"m1\",\"role\":\"assistant\",\"toolCalls\":["
        "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}],"
        "\"content\":\"ok\"}]");
    agw_history_free(h);
}

Test(history, tool_call_args_assemble_each_call_apart)
{
    struct agw_history *h = agw_history_new(100);

    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
       "\"parentMessageId\":\"a\"}");
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c2\",\"toolCallName\":\"g\","
       "\"parentMessageId\":\"a\"}");
    ev(h, "r1", "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c2\",\"delta\":\"[1,\"}");
    ev(h, "r1", "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"{}\"}");
    ev(h, "r1", "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c2\",\"delta\":\"2]\"}");
    cr_assert_eq(ev(h, "r1", "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"zz\",\"delta\":\"x\"}"),
                 0);
    expect(
        h,
        "[{\"id\":\"a\",\"role\":\"assistant\",\"toolCalls\":["
        "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
        "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"[1,2]\"}"
        "}]}]");
    cr_assert_eq(agw_history_malformed(h), 0);
    agw_history_free(h);
}

Test(history, tool_call_args_reach_a_call_from_the_input)
{
    struct agw_history *h = agw_history_new(100);

    merge(
        h, "r1",
        "[{\"id\":\"a\",\"role\":\"assistant\",\"toolCalls\":[{\"id\":\"c1\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\"\"}}]}]");
    cr_assert_eq(
        ev(h, "r2", "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\":1}\"}"), 1);
    expect(
        h,
        "[{\"id\":\"a\",\"role\":\"assistant\",\"toolCalls\":[{\"id\":\"c1\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]}]");
    agw_history_free(h);
}

/* ---- tool results -------------------------------------------------------------------------------
 */

Test(history, tool_result_goes_right_after_its_owner)
{
    struct agw_history *h = agw_history_new(100);

    merge(h, "r1", "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"hi\"}]");
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
       "\"parentMessageId\":\"a1\"}");
    ev(h, "r1", "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c1\"}");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a2\"}");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a2\",\"delta\":\"done\"}");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a2\"}");
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"t1\",\"toolCallId\":\"c1\","
                    "\"content\":\"42\"}"),
                 1);
    expect(
        h,
        "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"hi\"},"
        "{\"id\":\"a1\",\"role\":\"assistant\",\"toolCalls\":["
        "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]},"
        "{\"id\":\"t1\",\"role\":\"tool\",\"toolCallId\":\"c1\",\"content\":\"42\"},"
        "{\"id\":\"a2\",\"role\":\"assistant\",\"content\":\"done\"}]");
    const char *runs[] = {"r1", "r1", "r1", "r1"};
    expect_runs(h, runs, 4);
    agw_history_free(h);
}

Test(history, tool_results_of_parallel_calls_keep_their_order)
{
    struct agw_history *h = agw_history_new(100);

    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
       "\"parentMessageId\":\"a1\"}");
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c2\",\"toolCallName\":\"f\","
       "\"parentMessageId\":\"a1\"}");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a2\"}");
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"t1\",\"toolCallId\":\"c1\",\"content\":"
       "\"1\"}");
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"t2\",\"toolCallId\":\"c2\",\"content\":"
       "\"2\"}");
    cr_assert_eq(agw_history_count(h), 4);
    cr_assert_str_eq(json_string_value(json_object_get(agw_history_message(h, 0), "id")), "a1");
    cr_assert_str_eq(json_string_value(json_object_get(agw_history_message(h, 1), "id")), "t1");
    cr_assert_str_eq(json_string_value(json_object_get(agw_history_message(h, 2), "id")), "t2");
    cr_assert_str_eq(json_string_value(json_object_get(agw_history_message(h, 3), "id")), "a2");
    agw_history_free(h);
}

Test(history, tool_result_without_an_owner_is_appended)
{
    struct agw_history *h = agw_history_new(100);

    merge(h, "r1", "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"hi\"}]");
    /* a non-assistant message holding the call does not own it */
    merge(h, "r1",
          "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"hi\"},{\"id\":\"x\",\"role\":\"user\","
          "\"toolCalls\":[{\"id\":\"c9\"}]}]");
    cr_assert_eq(ev(h, "r2",
                    "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"t1\",\"toolCallId\":\"c9\","
                    "\"content\":\"true\"}"),
                 1);
    expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"hi\"},"
              "{\"id\":\"x\",\"role\":\"user\",\"toolCalls\":[{\"id\":\"c9\"}]},"
              "{\"id\":\"t1\",\"role\":\"tool\",\"toolCallId\":\"c9\",\"content\":\"true\"}]");
    const char *runs[] = {"r1", "r1", "r2"};
    expect_runs(h, runs, 3);
    agw_history_free(h);
}

/* ---- snapshots ----------------------------------------------------------------------------------
 */

Test(history, messages_snapshot_replaces_drops_and_appends)
{
    struct agw_history *h = agw_history_new(100);

    merge(h, "r1",
          "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"a\"},"
          "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"b\"},"
          "{\"id\":\"u2\",\"role\":\"user\",\"content\":\"c\"}]");
    cr_assert_eq(ev(h, "r2",
                    "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":["
                    "{\"id\":\"n1\",\"role\":\"assistant\",\"content\":\"new\"},"
                    "{\"id\":\"u2\",\"role\":\"user\",\"content\":\"c2\"},"
                    "{\"id\":\"u1\",\"role\":\"user\",\"content\":\"a\"}]}"),
                 1);
    /* known ones keep their place and run, a1 (missing) is gone, n1 comes last */
    expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"a\"},"
              "{\"id\":\"u2\",\"role\":\"user\",\"content\":\"c2\"},"
              "{\"id\":\"n1\",\"role\":\"assistant\",\"content\":\"new\"}]");
    const char *runs[] = {"r1", "r1", "r2"};
    expect_runs(h, runs, 3);
    /* an id the snapshot gives twice: the known message takes the last of them */
    cr_assert_eq(ev(h, "r3",
                    "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":["
                    "{\"id\":\"u1\",\"role\":\"user\",\"content\":\"first\"},"
                    "{\"id\":\"u1\",\"role\":\"user\",\"content\":\"last\"}]}"),
                 1);
    expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"last\"}]");
    agw_history_free(h);
}

Test(history, empty_messages_snapshot_empties_the_thread)
{
    struct agw_history *h = agw_history_new(100);

    merge(h, "r1", "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"a\"}]");
    cr_assert_eq(ev(h, "r2", "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[]}"), 1);
    cr_assert_eq(agw_history_count(h), 0);
    agw_history_free(h);
}

/* ---- merging run inputs -------------------------------------------------------------------------
 */

Test(history, merge_dedups_by_id_and_replaces_changed_messages_in_place)
{
    struct agw_history *h = agw_history_new(100);

    cr_assert_eq(merge(h, "r1", "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"hi\"}]"), 1);
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"hello\"}");
    /* the whole history again, unchanged, plus a new message */
    cr_assert_eq(merge(h, "r2",
                       "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"hi\"},"
                       "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"hello\"},"
                       "{\"id\":\"u2\",\"role\":\"user\",\"content\":\"more\"}]"),
                 1);
    /* an edited first message replaces the stored one where it stands, with its run */
    cr_assert_eq(merge(h, "r3",
                       "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"hi, edited\"},"
                       "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"hello\"},"
                       "{\"id\":\"u2\",\"role\":\"user\",\"content\":\"more\"},"
                       "{\"id\":\"u3\",\"role\":\"user\",\"content\":\"x\"},"
                       "{\"id\":\"u4\",\"role\":\"user\",\"content\":\"y\"}]"),
                 3);
    expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"hi, edited\"},"
              "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"hello\"},"
              "{\"id\":\"u2\",\"role\":\"user\",\"content\":\"more\"},"
              "{\"id\":\"u3\",\"role\":\"user\",\"content\":\"x\"},"
              "{\"id\":\"u4\",\"role\":\"user\",\"content\":\"y\"}]");
    const char *runs[] = {"r1", "r1", "r2", "r3", "r3"};
    expect_runs(h, runs, 5);
    agw_history_free(h);
}

Test(history, merge_appends_new_messages_in_the_order_given)
{
    struct agw_history *h = agw_history_new(100);

    merge(h, "r1", "[{\"id\":\"a\",\"role\":\"user\",\"content\":\"1\"}]");
    /* the known one first: the new ones after it go to the end in order, whatever lies between */
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"b\"}");
    merge(h, "r2",
          "[{\"id\":\"a\",\"role\":\"user\",\"content\":\"1\"},{\"id\":\"c\",\"role\":\"user\","
          "\"content\":\"3\"},{\"id\":\"d\",\"role\":\"user\",\"content\":\"4\"}]");
    expect(h, "[{\"id\":\"a\",\"role\":\"user\",\"content\":\"1\"},"
              "{\"id\":\"b\",\"role\":\"assistant\",\"content\":\"\"},"
              "{\"id\":\"c\",\"role\":\"user\",\"content\":\"3\"},"
              "{\"id\":\"d\",\"role\":\"user\",\"content\":\"4\"}]");
    agw_history_free(h);
}

Test(history, merge_puts_new_messages_given_before_the_known_ones_before_them)
{
    struct agw_history *h = agw_history_new(100);

    merge(h, "r2", "[{\"id\":\"c\",\"role\":\"user\",\"content\":\"3\"}]");
    merge(h, "r3",
          "[{\"id\":\"a\",\"role\":\"user\",\"content\":\"1\"},{\"id\":\"b\",\"role\":\"user\","
          "\"content\":\"2\"},{\"id\":\"c\",\"role\":\"user\",\"content\":\"3\"},{\"id\":\"d\","
          "\"role\":\"user\",\"content\":\"4\"}]");
    expect(h, "[{\"id\":\"a\",\"role\":\"user\",\"content\":\"1\"},"
              "{\"id\":\"b\",\"role\":\"user\",\"content\":\"2\"},"
              "{\"id\":\"c\",\"role\":\"user\",\"content\":\"3\"},"
              "{\"id\":\"d\",\"role\":\"user\",\"content\":\"4\"}]");
    const char *runs[] = {"r3", "r3", "r2", "r3"};
    expect_runs(h, runs, 4);
    agw_history_free(h);
}

Test(history, merge_of_a_duplicated_new_id_keeps_one_message)
{
    struct agw_history *h = agw_history_new(100);

    cr_assert_eq(merge(h, "r1",
                       "[{\"id\":\"a\",\"role\":\"user\",\"content\":\"1\"},"
                       "{\"id\":\"a\",\"role\":\"user\",\"content\":\"2\"}]"),
                 2);
    expect(h, "[{\"id\":\"a\",\"role\":\"user\",\"content\":\"2\"}]");
    agw_history_free(h);
}

Test(history, merge_skips_malformed_messages)
{
    struct agw_history *h = agw_history_new(100);

    cr_assert_eq(merge(h, "r1",
                       "[1,null,\"x\",{\"role\":\"user\"},{\"id\":7},"
                       "{\"id\":\"ok\",\"role\":\"user\",\"content\":\"\"}]"),
                 1);
    cr_assert_eq(agw_history_malformed(h), 5);
    cr_assert_eq(merge(h, "r1", "{\"id\":\"a\"}"), -AGW_EINVAL);
    cr_assert_eq(agw_history_malformed(h), 6);
    expect(h, "[{\"id\":\"ok\",\"role\":\"user\",\"content\":\"\"}]");
    agw_history_free(h);
}

Test(history, merge_copies_what_it_is_given)
{
    struct agw_history *h = agw_history_new(100);
    json_t *in = parse("[{\"id\":\"a\",\"role\":\"user\",\"content\":\"1\"}]");

    agw_history_merge_input(h, NULL, in);
    json_object_set_new(json_array_get(in, 0), "content", json_string("changed"));
    json_decref(in);
    expect(h, "[{\"id\":\"a\",\"role\":\"user\",\"content\":\"1\"}]");
    cr_assert_null(agw_history_run_id(h, 0));
    agw_history_free(h);
}

/* ---- the cap ------------------------------------------------------------------------------------
 */

Test(history, cap_drops_the_oldest)
{
    struct agw_history *h = agw_history_new(3);

    merge(h, "r1",
          "[{\"id\":\"1\",\"role\":\"user\",\"content\":\"\"},{\"id\":\"2\",\"role\":\"user\","
          "\"content\":\"\"},{\"id\":\"3\",\"role\":\"user\",\"content\":\"\"},{\"id\":\"4\","
          "\"role\":\"user\",\"content\":\"\"}]");
    expect(h, "[{\"id\":\"2\",\"role\":\"user\",\"content\":\"\"},"
              "{\"id\":\"3\",\"role\":\"user\",\"content\":\"\"},"
              "{\"id\":\"4\",\"role\":\"user\",\"content\":\"\"}]");
    cr_assert_eq(agw_history_dropped(h), 1);
    ev(h, "r2", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"5\"}");
    cr_assert_eq(agw_history_count(h), 3);
    cr_assert_eq(agw_history_dropped(h), 2);
    cr_assert_str_eq(json_string_value(json_object_get(agw_history_message(h, 0), "id")), "3");
    cr_assert_str_eq(agw_history_run_id(h, 2), "r2");
    agw_history_free(h);
}

Test(history, cap_keeps_the_newest_when_the_client_resends_its_whole_history)
{
    struct agw_history *h = agw_history_new(2);
    const char *all = "[{\"id\":\"1\",\"role\":\"user\",\"content\":\"\"},"
                      "{\"id\":\"2\",\"role\":\"user\",\"content\":\"\"},"
                      "{\"id\":\"3\",\"role\":\"user\",\"content\":\"\"}]";

    merge(h, "r1", all);
    /* 1 was dropped; resent before the known 2 and 3, it goes in front and out again */
    merge(h, "r2",
          "[{\"id\":\"1\",\"role\":\"user\",\"content\":\"\"},"
          "{\"id\":\"2\",\"role\":\"user\",\"content\":\"\"},"
          "{\"id\":\"3\",\"role\":\"user\",\"content\":\"\"},"
          "{\"id\":\"4\",\"role\":\"user\",\"content\":\"\"}]");
    expect(h, "[{\"id\":\"3\",\"role\":\"user\",\"content\":\"\"},"
              "{\"id\":\"4\",\"role\":\"user\",\"content\":\"\"}]");
    agw_history_free(h);
}

Test(history, cap_applies_to_a_snapshot)
{
    struct agw_history *h = agw_history_new(1);

    ev(h, "r1",
       "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[{\"id\":\"a\",\"role\":\"user\"},"
       "{\"id\":\"b\",\"role\":\"user\"}]}");
    expect(h, "[{\"id\":\"b\",\"role\":\"user\"}]");
    agw_history_free(h);
}

/* ---- saving message by message (a store's row per message) -------------------------------------
 */

/* The indices of the changed messages, space-separated. */
static const char *changed(const struct agw_history *h)
{
    static char out[256];
    size_t n = 0;

    out[0] = '\0';
    for (size_t i = 0; i < agw_history_count(h); i++)
        if (agw_history_changed(h, i))
            n += (size_t)snprintf(out + n, sizeof(out) - n, "%s%zu", n > 0 ? " " : "", i);
    for (size_t i = 0; i < agw_history_first_changed(h); i++)
        cr_assert(!agw_history_changed(h, i), "first_changed %zu, but %zu is changed",
                  agw_history_first_changed(h), i);
    return out;
}

Test(history, changes_are_tracked_until_saved)
{
    struct agw_history *h = agw_history_new(4);

    merge(h, "r1", "[{\"id\":\"u1\",\"role\":\"user\"},{\"id\":\"u2\",\"role\":\"user\"}]");
    cr_assert_str_eq(changed(h), "0 1");
    agw_history_mark_saved(h);
    cr_assert_str_eq(changed(h), "");
    cr_assert_eq(agw_history_first_changed(h), 2);
    merge(h, "r2", "[{\"id\":\"u1\",\"role\":\"user\"},{\"id\":\"u2\",\"role\":\"user\"}]");
    cr_assert_str_eq(changed(h), "", "an equal resend changes nothing");
    ev(h, "r2",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
       "\"parentMessageId\":\"a1\"}");
    cr_assert_str_eq(changed(h), "2");
    agw_history_mark_saved(h);
    ev(h, "r2", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"u1\",\"delta\":\"x\"}");
    cr_assert_str_eq(changed(h), "0", "an edit");
    agw_history_mark_saved(h);
    /* a tool result after its owner a1 (index 2), then the cap drops u1 */
    ev(h, "r2", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a2\"}");
    agw_history_mark_saved(h);
    cr_assert_eq(agw_history_count(h), 4);
    ev(h, "r2",
       "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"t1\",\"toolCallId\":\"c1\","
       "\"content\":\"r\"}");
    cr_assert_eq(agw_history_dropped(h), 1);
    cr_assert_str_eq(changed(h), "2 3", "the result and the message it moved");
    cr_assert_str_eq(json_string_value(json_object_get(agw_history_message(h, 3), "id")), "a2");
    agw_history_mark_saved(h);
    /* a snapshot keeping u2 and a2: a2 moves */
    ev(h, "r3",
       "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[{\"id\":\"u2\",\"role\":\"user\"},"
       "{\"id\":\"a2\",\"role\":\"assistant\",\"content\":\"\"}]}");
    cr_assert_eq(agw_history_count(h), 2);
    cr_assert_str_eq(changed(h), "1");
    agw_history_free(h);
}

/* A text message made by events is held as its JSON text: escaped as jansson escapes, its deltas
 * appended raw by agw_history_append_text(). */
Test(history, a_text_message_is_its_json)
{
    struct agw_history *h = agw_history_new(10);
    const char *j;
    size_t len;

    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a\\\"1\",\"role\":\"x/y\"}");
    ev(h, "r1",
       "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a\\\"1\",\"delta\":"
       "\"q\\n\\u0001\\t\\u00e9\"}");
    cr_assert_eq(agw_history_append_text(h, "a\"1", 3, "\\u00e9!", 7), 1);
    cr_assert_eq(agw_history_append_text(h, "nope", 4, "x", 1), 0, "an unknown id");
    j = agw_history_message_json(h, 0, &len);
    cr_assert_eq(strlen(j), len);
    cr_assert_str_eq(
        j, "{\"id\":\"a\\\"1\",\"role\":\"x/y\",\"content\":\"q\\n\\u0001\\t\xc3\xa9\\u00e9!\"}");
    expect(h,
           "[{\"id\":\"a\\\"1\",\"role\":\"x/y\",\"content\":\"q\\n\\u0001\\t\\u00e9\\u00e9!\"}]");
    /* now held as a value: a raw delta is refused, the parsed event applies */
    cr_assert_eq(agw_history_append_text(h, "a\"1", 3, "x", 1), AGW_AGAIN);
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a\\\"1\",\"delta\":\"x\"}");
    j = agw_history_message_json(h, 0, &len);
    cr_assert_str_eq(
        j, "{\"id\":\"a\\\"1\",\"role\":\"x/y\",\"content\":\"q\\n\\u0001\\t\xc3\xa9\xc3\xa9!x\"}");
    /* a message from the input is a value: raw deltas are refused */
    merge(h, "r2", "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"a\"}]");
    cr_assert_eq(agw_history_append_text(h, "u1", 2, "x", 1), AGW_AGAIN);
    agw_history_free(h);
}

/* agw_history_apply_line() (its fast paths for content lines, starts and ends) makes the thread,
 * the return codes and the malformed count agw_history_apply() of the parsed line makes. */
Test(history, apply_line_is_apply_of_the_parsed_line)
{
    static const char *const lines[] = {
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\",\"role\":\"assistant\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"x\\u00e9\\n\"}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}",
        "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a1\"}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a2\",\"role\":\"tool\",\"x\":[1,{}]}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a3\",\"role\":null}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a4\",\"role\":\"u\",\"role\":\"v\"}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a\\u0035\",\"role\":\"r\\\"q\"}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a6\",\"role\":7}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"role\":\"user\"}",
        "{\"type\":\"TEXT_MESSAGE_END\"}",
        "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":5}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a7\"",
        "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"c1\",\"delta\":\"1\"}",
        "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"zz\"}",
        "{\"type\":\"TEXT_MESSAGE_CHUNK\",\"delta\":\"2\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a2\",\"delta\":\"\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"nope\",\"delta\":\"y\"}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a8\",\"role\":\"assistant\"}  ",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"\xc3\xa9\",\"role\":\"assistant\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"\xc3\xa9\",\"delta\":\"\\\"\"}",
        "not json",
    };
    struct agw_history *a = agw_history_new(100), *b = agw_history_new(100);
    uint64_t not_json = 0;

    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        json_t *e = json_loads(lines[i], 0, NULL);
        int ra = e != NULL ? agw_history_apply(a, "r1", e) : -AGW_EINVAL;

        not_json += e == NULL;
        int rb = agw_history_apply_line(b, "r1", lines[i], strlen(lines[i]));
        char *da, *db;

        json_decref(e);
        cr_assert_eq(rb, ra, "line %zu: %d, parsed %d", i, rb, ra);
        da = agw_history_dump(a);
        db = agw_history_dump(b);
        cr_assert_str_eq(db, da, "line %zu", i);
        free(da);
        free(db);
    }
    cr_assert_eq(not_json, 2);
    cr_assert_eq(agw_history_malformed(b), agw_history_malformed(a) + not_json,
                 "a line that is not JSON counts too");
    /* the same lines as JSON Lines in one buffer, as the store applies them */
    {
        struct agw_history *c = agw_history_new(100);
        char buf[4096], *da, *dc;
        size_t k = 0;
        int bad;

        for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
            k += (size_t)snprintf(buf + k, sizeof(buf) - k, "%s\n\n", lines[i]);
        bad = agw_history_apply_lines(c, "r1", buf, k - 1); /* the last line break left out */
        cr_assert_eq((uint64_t)bad, agw_history_malformed(b), "the lines refused are counted");
        da = agw_history_dump(b);
        dc = agw_history_dump(c);
        cr_assert_str_eq(dc, da);
        free(da);
        free(dc);
        agw_history_free(c);
    }
    agw_history_free(a);
    agw_history_free(b);
}

static int merge_body(struct agw_history *h, const char *run_id, const char *body)
{
    size_t n = strlen(body);
    char *b = malloc(n > 0 ? n : 1); /* exactly its length: a read past it is caught */
    int rc;

    memcpy(b, body, n);
    rc = agw_history_merge_body(h, run_id, b, n);
    free(b);
    return rc;
}

/* A client resends its whole history: the messages the thread holds byte for byte are found as
 * they are (a text stays text), the new one is added, a changed one replaces the stored one. */
Test(history, merge_body_resent_history)
{
    struct agw_history *h = agw_history_new(10);
    const char *runs[] = {"r1", "r1", "r2"};

    cr_assert_eq(merge_body(h, "r1",
                            "{\"threadId\":\"t\",\"messages\":[{\"id\":\"u1\",\"role\":"
                            "\"user\",\"content\":\"Hi\"}],\"state\":{\"a\":[1,{}]}}"),
                 1);
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}");
    cr_assert_eq(agw_history_append_text(h, "a1", 2, "Hel\\u006co", 10), 1);
    /* the client's copy of the text, as JSON.stringify writes it, and a new question */
    cr_assert_eq(merge_body(h, "r2",
                            "{\"messages\":[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi\"},"
                            "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hel\\u006co\"},"
                            "{\"id\":\"u2\",\"role\":\"user\",\"content\":\"More\"}]}"),
                 1);
    cr_assert_eq(agw_history_append_text(h, "a1", 2, "!", 1), 1, "a1 is still held as text");
    expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi\"},"
              "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hello!\"},"
              "{\"id\":\"u2\",\"role\":\"user\",\"content\":\"More\"}]");
    expect_runs(h, runs, 3);
    /* written otherwise (spaces): compared as values, equal */
    cr_assert_eq(merge_body(h, "r3",
                            "{\"messages\":[{\"id\":\"u1\", \"role\":\"user\", "
                            "\"content\":\"Hi\"}]}"),
                 0);
    /* changed: replaced in place, keeping its run */
    cr_assert_eq(merge_body(h, "r3",
                            "{\"messages\":[{\"id\":\"u2\",\"role\":\"user\","
                            "\"content\":\"Less\"}]}"),
                 1);
    cr_assert_str_eq(json_string_value(json_object_get(agw_history_message(h, 2), "content")),
                     "Less");
    cr_assert_str_eq(agw_history_run_id(h, 2), "r2");
    cr_assert_eq(agw_history_malformed(h), 0);
    agw_history_free(h);
}

/* An input message written {"id","role","content"} as a compact dump writes it is held as its
 * bytes (no value: agw_history_text_bytes() counts them); any other is held as a value. Either
 * reads back the same, a resent copy is found equal, and a held text still takes deltas and tool
 * calls. */
Test(history, input_messages_held_as_text_when_compact)
{
    struct agw_history *h = agw_history_new(10);
    const char *plain = "{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Caf\u00e9 \\\"x\\\"\"}";
    char body[256];
    size_t held;

    snprintf(body, sizeof(body), "{\"messages\":[%s]}", plain);
    cr_assert_eq(merge_body(h, "r1", body), 1);
    held = agw_history_text_bytes(h);
    cr_assert_geq(held, strlen(plain) - 2, "held as its bytes");
    cr_assert_eq(agw_history_values_parsed(h), 0, "held as text from its bytes: no value made");
    cr_assert_eq(merge_body(h, "r2", body), 0, "the same bytes again: no change");
    cr_assert_eq(agw_history_text_bytes(h), held, "and no value or dump made for it");
    cr_assert_eq(agw_history_values_parsed(h), 0);
    /* another spacing, another member, a structured content, an escape jansson does not write:
     * values */
    cr_assert_eq(merge_body(h, "r1",
                            "{\"messages\":[{\"id\":\"u2\", \"role\":\"user\",\"content\":\"a\"},"
                            "{\"id\":\"u3\",\"role\":\"user\",\"content\":\"b\",\"name\":\"n\"},"
                            "{\"id\":\"u4\",\"role\":\"user\",\"content\":[{\"type\":\"text\"}]},"
                            "{\"id\":\"u5\",\"role\":\"user\",\"content\":\"\\u0041\"},"
                            "{\"role\":\"user\",\"id\":\"u6\",\"content\":\"c\"},"
                            "{\"id\":\"u7\",\"content\":\"d\",\"role\":\"user\"}]}"),
                 6);
    cr_assert_eq(agw_history_text_bytes(h), held, "none of them held as text");
    cr_assert_eq(agw_history_values_parsed(h), 6, "each read into a value");
    /* (a delta goes to the content, whatever the order of the members) */
    ev(h, "r2", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"u7\",\"delta\":\"!\"}");
    expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Caf\u00e9 \\\"x\\\"\"},"
              "{\"id\":\"u2\",\"role\":\"user\",\"content\":\"a\"},"
              "{\"id\":\"u3\",\"role\":\"user\",\"content\":\"b\",\"name\":\"n\"},"
              "{\"id\":\"u4\",\"role\":\"user\",\"content\":[{\"type\":\"text\"}]},"
              "{\"id\":\"u5\",\"role\":\"user\",\"content\":\"A\"},"
              "{\"role\":\"user\",\"id\":\"u6\",\"content\":\"c\"},"
              "{\"id\":\"u7\",\"content\":\"d!\",\"role\":\"user\"}]");
    agw_history_free(h);

    /* an assistant message sent as text goes on growing, and takes a tool call */
    h = agw_history_new(10);
    cr_assert_eq(merge_body(h, "r1",
                            "{\"messages\":[{\"id\":\"a1\",\"role\":\"assistant\","
                            "\"content\":\"Hi\"}]}"),
                 1);
    cr_assert_gt(agw_history_text_bytes(h), 0);
    cr_assert_eq(agw_history_append_text(h, "a1", 2, " there", 6), 1, "held as text");
    ev(h, "r2",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
       "\"parentMessageId\":\"a1\"}");
    expect(h, "[{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hi there\","
              "\"toolCalls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
              "{\"name\":\"f\",\"arguments\":\"\"}}]}]");
    cr_assert_eq(agw_history_malformed(h), 0);
    agw_history_free(h);
}

/* A new input message is held as text from its bytes alone when every escape in its content is
 * one a compact dump writes; then, and only then, as when judged from its value (a \u escape, \/,
 * an escape in the id or the role: judged from the value, which decides as before). Each content
 * reads back as jansson reads it. */
Test(history, input_message_held_as_text_from_its_bytes_as_from_its_value)
{
    static const struct {
        const char *content; /* as written in the body */
        bool from_bytes;     /* held as text without a value */
        bool as_text;        /* held as text at all */
    } cases[] = {
        {"plain", true, true},
        {"", true, true},
        {"q \\\"x\\\" b\\\\ \\b\\f\\n\\r\\t", true, true},
        {"caf\xc3\xa9 \xe2\x82\xac", true, true},
        {"slash \\/", false, false},
        {"\\u00e9", false, false},
        {"\\u0009", false, false},
        {"\\u001F", false, true},
        {"\\\\u0041", true, true},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct agw_history *h = agw_history_new(10);
        char body[256], msg[160], ref[200], *dump;
        json_t *v;
        size_t len;
        const char *j;

        snprintf(msg, sizeof(msg), "{\"id\":\"u1\",\"role\":\"user\",\"content\":\"%s\"}",
                 cases[i].content);
        snprintf(body, sizeof(body), "{\"messages\":[%s]}", msg);
        cr_assert_eq(merge_body(h, "r1", body), 1, "case %zu", i);
        cr_assert_eq(agw_history_values_parsed(h), cases[i].from_bytes ? 0 : 1, "case %zu", i);
        cr_assert_eq(agw_history_text_bytes(h) > 0, cases[i].as_text, "case %zu", i);
        v = json_loads(msg, JSON_REJECT_DUPLICATES, NULL);
        cr_assert_not_null(v, "case %zu", i);
        dump = json_dumps(v, JSON_COMPACT);
        snprintf(ref, sizeof(ref), "%s", dump);
        free(dump);
        json_decref(v);
        j = agw_history_message_json(h, 0, &len);
        cr_assert_eq(len, strlen(ref), "case %zu: %.*s", i, (int)len, j);
        cr_assert(memcmp(j, ref, len) == 0, "case %zu: %.*s, not %s", i, (int)len, j, ref);
        cr_assert_eq(merge_body(h, "r2", body), 0, "case %zu: resent, equal", i);
        agw_history_free(h);
    }
    /* an escape in the id or the role: from the value */
    {
        struct agw_history *h = agw_history_new(10);
        cr_assert_eq(merge_body(h, "r1",
                                "{\"messages\":[{\"id\":\"u1\",\"role\":\"us\\u0065r\","
                                "\"content\":\"a\"}]}"),
                     1);
        cr_assert_eq(agw_history_values_parsed(h), 1);
        expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"a\"}]");
        agw_history_free(h);
    }
}

/* Threads <a> and <b> dump the same (body <i> merged into each). */
static void assert_same_thread(struct agw_history *a, struct agw_history *b, size_t i)
{
    char *da = agw_history_dump(a), *db = agw_history_dump(b);

    cr_assert_str_eq(db, da, "body %zu", i);
    free(da);
    free(db);
}

/* The input's reading of a body (agw_input_parse_keep(), as the loop makes it) merges as the body
 * does: the same thread, message for message, whichever way each message is held. */
Test(history, merge_read_is_merge_body)
{
    static const char *const bodies[] = {
        "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[{\"id\":\"u1\",\"role\":\"user\","
        "\"content\":\"Hi\"}]}",
        "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[{\"id\":\"u1\",\"role\":\"user\","
        "\"content\":\"Hi\"},{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hello "
        "\\\"you\\\"\"},"
        "{\"id\":\"u2\", \"role\":\"user\",\"content\":\"\\u0041\"}]}",
        "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[{\"id\":\"u0\",\"role\":\"user\","
        "\"content\":\"older\"},{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi!\"},"
        "{\"id\":\"t1\",\"role\":\"tool\",\"toolCallId\":\"c1\",\"content\":\"42\"}],"
        "\"tools\":[],\"context\":[],\"state\":{\"k\":[1,2]},\"forwardedProps\":{}}",
        "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[]}",
    };
    struct agw_history *a = agw_history_new(6), *b = agw_history_new(6);

    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        struct agw_input in = {0};
        int ra, rb;

        cr_assert_eq(agw_input_parse_keep(bodies[i], strlen(bodies[i]), 0, &in, NULL, 0), 0);
        cr_assert(in.messages_read, "body %zu", i);
        ra = merge_body(a, "r", bodies[i]);
        rb = agw_history_merge_read(b, "r", bodies[i], in.messages, in.n_messages);
        cr_assert_eq(rb, ra, "body %zu: %d, the body's merge %d", i, rb, ra);
        assert_same_thread(a, b, i);
        cr_assert_eq(agw_history_text_bytes(b), agw_history_text_bytes(a), "body %zu", i);
        agw_input_clear(&in);
    }
    agw_history_free(a);
    agw_history_free(b);
}

/* What the body's whole reading with JSON_REJECT_DUPLICATES makes, whatever the scanner does. */
Test(history, merge_body_is_merge_of_the_body_read_whole)
{
    static const char *const bodies[] = {
        "{\"messages\":[{\"id\":\"m1\",\"role\":\"user\"}]}",
        "{\"messages\":[{\"id\":\"m1\",\"role\":\"user\"}]}",
        "{\"messages\":[{\"id\":\"m0\"},{\"id\":\"m1\",\"role\":\"user\"},{\"id\":\"m2\"}]}",
        "{\"messages\":[{\"id\":\"m1\",\"role\":\"x\"},{\"id\":\"m1\",\"role\":\"user\"}]}",
        "{\"messages\":[{\"id\":\"n1\"},{\"id\":\"n1\",\"a\":1}]}",
        "{\"messages\":[{\"id\":\"m\\u0031\",\"role\":\"y\"}]}",
        "{\"messages\":[{\"id\":\"m3\",\"id\":\"m4\"}]}",
        "{\"messages\":[{\"id\":\"m5\"}],\"state\":{\"k\":1,\"k\":2}}",
        "{\"messages\":[{\"id\":\"m6\"}],\"st\\u0061te\":{}}",
        "{\"messages\":[1,{\"role\":\"user\"},{\"id\":7},{\"id\":\"m7\"}]}",
        "{\"messages\":{\"id\":\"m8\"}}",
        "{\"messages\":[{\"id\":\"m9\",\"c\":\"\\u0000\"}]}",
        "{\"messages\":[{\"id\":\"m10\",\"n\":123456789012345678901234567890}]}",
        "{\"messages\":[]}",
        "{\"threadId\":\"t\"}",
        "[]",
        "{\"messages\":[{\"id\":\"m11\"}]",
        "{\"messages\":[{\"id\":\"m12\"}]} x",
        "",
    };
    struct agw_history *a = agw_history_new(6), *b = agw_history_new(6);

    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        json_t *root = json_loadb(bodies[i], strlen(bodies[i]), JSON_REJECT_DUPLICATES, NULL);
        int ra = root == NULL ? -AGW_EINVAL : 0, rb;

        if (root != NULL && json_object_get(root, "messages") != NULL)
            ra = agw_history_merge_input(a, "r", json_object_get(root, "messages"));
        if (ra < 0 && root != NULL)
            ra = 0;
        json_decref(root);
        rb = merge_body(b, "r", bodies[i]);
        cr_assert_eq(rb, ra, "body %zu: %d, read whole %d", i, rb, ra);
        assert_same_thread(a, b, i);
        cr_assert_eq(agw_history_malformed(b), agw_history_malformed(a), "body %zu", i);
    }
    agw_history_free(a);
    agw_history_free(b);
}

/* A stored message, one piece: <json> (text: without its closing '"}'). */
static int restore1(struct agw_history *h, uint64_t pos, const char *run, const char *json,
                    bool text)
{
    struct agw_history_row r = {json, strlen(json), 1, text, false};

    return agw_history_restore_message(h, pos, run, &r);
}

Test(history, restore_reads_back_what_was_saved)
{
    struct agw_history *h = agw_history_new(3), *back;
    const char *runs[] = {"r1", NULL, "r2"};

    merge(h, NULL, "[{\"id\":\"u0\",\"role\":\"user\"}]");
    merge(h, "r1", "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"caf\\u00e9\"}]");
    merge(h, NULL, "[{\"id\":\"u2\",\"role\":\"user\"}]");
    ev(h, "r2", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}");
    ev(h, "r2",
       "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"\\\"hi\\\"\"}");
    cr_assert_eq(agw_history_dropped(h), 1);

    back = agw_history_restore(3, agw_history_dropped(h));
    for (size_t i = 0; i < agw_history_count(h); i++) {
        struct agw_history_row r;
        agw_history_message_row(h, i, &r);
        cr_assert_eq(r.part, 0, "a new message is written whole");
        cr_assert_eq(r.text, i == 2, "a1 is a text");
        r.part = 1; /* read back: one piece */
        cr_assert_eq(agw_history_restore_message(back, agw_history_dropped(h) + i,
                                                 agw_history_run_id(h, i), &r),
                     0);
    }
    cr_assert_str_eq(changed(back), "", "as saved");
    cr_assert_eq(agw_history_append_text(back, "a1", 2, "", 0), 1, "a text read back is a text");
    expect(back, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"caf\\u00e9\"},"
                 "{\"id\":\"u2\",\"role\":\"user\"},"
                 "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"\\\"hi\\\"\"}]");
    expect_runs(back, runs, 3);
    cr_assert_eq(agw_history_dropped(back), 1);
    cr_assert_eq(restore1(back, 4, NULL, "{\"role\":\"user\"}", false), -AGW_EINVAL, "no id");
    cr_assert_eq(restore1(back, 4, NULL, "[", false), -AGW_EINVAL);
    cr_assert_eq(restore1(back, 4, NULL, "{\"id\":\"t\",\"role\":\"x\"}", true), -AGW_EINVAL,
                 "a text must end in a string");
    cr_assert_eq(restore1(back, 4, NULL, "{\"id\":\"t\",\"role\":\"x\",\"content\":\"a", false),
                 -AGW_EINVAL, "an open text is a text");
    cr_assert_eq(agw_history_count(back), 3);
    /* past the cap: the oldest go */
    cr_assert_eq(restore1(back, 4, NULL, "{\"id\":\"m4\"}", false), 0);
    cr_assert_eq(agw_history_dropped(back), 2);
    cr_assert_str_eq(changed(back), "1", "the text grew (by nothing)");
    agw_history_mark_saved(back);
    /* out of place (a gap): written again where it belongs */
    cr_assert_eq(restore1(back, 9, NULL, "{\"id\":\"m9\"}", false), 0);
    cr_assert_str_eq(changed(back), "2");
    agw_history_free(back);
    agw_history_free(h);
}

/* The row of a changed message: whole when new, moved or no longer a text; a text that grew since
 * it was saved, by the piece it grew by. */
Test(history, a_growing_text_is_saved_by_pieces)
{
    struct agw_history *h = agw_history_new(10);
    struct agw_history_row r;

    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}");
    cr_assert_eq(agw_history_append_text(h, "a1", 2, "abc", 3), 1);
    agw_history_message_row(h, 0, &r);
    cr_assert_eq(r.part, 0);
    cr_assert(r.text);
    cr_assert_eq(r.len, strlen("{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"abc"));
    cr_assert_eq(memcmp(r.data, "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"abc", r.len),
                 0);
    agw_history_mark_saved(h);
    cr_assert_eq(agw_history_append_text(h, "a1", 2, "de", 2), 1);
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"\\n\"}");
    agw_history_message_row(h, 0, &r);
    cr_assert_eq(r.part, 1);
    cr_assert(r.text);
    cr_assert_eq(r.len, 4);
    cr_assert_eq(memcmp(r.data, "de\\n", 4), 0);
    agw_history_mark_saved(h);
    cr_assert_eq(agw_history_append_text(h, "a1", 2, "f", 1), 1);
    agw_history_message_row(h, 0, &r);
    cr_assert_eq(r.part, 2);
    cr_assert_eq(r.len, 1);
    agw_history_mark_saved(h);
    /* moved (a message inserted before it): whole, at its new position; the one that takes its
     * old position, held in three pieces, drops the two others there */
    merge_body(h, "r0",
               "{\"messages\":[{\"id\":\"u0\",\"role\":\"user\"},{\"id\":\"a1\",\"role\":"
               "\"assistant\",\"content\":\"abcde\\nf\"}]}");
    cr_assert_str_eq(changed(h), "0 1");
    agw_history_message_row(h, 0, &r);
    cr_assert_eq(r.part, 0);
    cr_assert(r.drop_parts);
    agw_history_message_row(h, 1, &r);
    cr_assert_eq(r.part, 0);
    cr_assert_not(r.drop_parts, "nothing in pieces was at its new position");
    cr_assert(r.text, "still a text (the client's copy was the same bytes)");
    agw_history_mark_saved(h);
    cr_assert_eq(agw_history_append_text(h, "a1", 2, "g", 1), 1);
    agw_history_message_row(h, 1, &r);
    cr_assert_eq(r.part, 1, "it grows by pieces again");
    agw_history_mark_saved(h);
    /* a tool call added: a value now, written whole */
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
       "\"parentMessageId\":\"a1\"}");
    agw_history_message_row(h, 1, &r);
    cr_assert_eq(r.part, 0);
    cr_assert_not(r.text);
    cr_assert(r.drop_parts, "it was two pieces");
    cr_assert_eq(r.data[r.len], '\0');
    cr_assert(strstr(r.data, "\"toolCalls\"") != NULL, "%s", r.data);
    agw_history_free(h);
}

/* ---- shedding saved texts ------------------------------------------------------------------- */

/* A store's rows for the shedding tests: position -> the pieces put together, as written by save()
 * (a piece 0 replaces the message, another is appended). */
struct mini_store {
    char *data[16];
    size_t len[16];
    int loads, fail;
};

static void save(struct agw_history *h, struct mini_store *st)
{
    for (size_t i = agw_history_first_changed(h); i < agw_history_count(h); i++) {
        struct agw_history_row r;
        uint64_t pos = agw_history_dropped(h) + i;
        if (!agw_history_changed(h, i))
            continue;
        cr_assert_lt(pos, 16);
        agw_history_message_row(h, i, &r);
        if (r.part == 0)
            st->len[pos] = 0;
        st->data[pos] = realloc(st->data[pos], st->len[pos] + r.len + 1);
        memcpy(st->data[pos] + st->len[pos], r.data, r.len);
        st->len[pos] += r.len;
    }
    agw_history_mark_saved(h);
}

static int mini_load(void *arg, uint64_t pos, char **data, size_t *len)
{
    struct mini_store *st = arg;

    st->loads++;
    if (st->fail || pos >= 16 || st->data[pos] == NULL)
        return -1;
    *data = malloc(st->len[pos] + 1);
    memcpy(*data, st->data[pos], st->len[pos]);
    (*data)[st->len[pos]] = '\0';
    *len = st->len[pos];
    return 0;
}

static void mini_free(struct mini_store *st)
{
    for (size_t i = 0; i < 16; i++)
        free(st->data[i]);
}

static const char A1_TEXT[] = "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hello, world\"}";

/* u1 and a text a1 ("Hello, world"), saved and shed. */
static struct agw_history *shed_thread(struct mini_store *st)
{
    struct agw_history *h = agw_history_new(10);

    agw_history_set_loader(h, mini_load, st);
    merge(h, "r1", "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi\"}]");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}");
    cr_assert_eq(agw_history_append_text(h, "a1", 2, "Hello, ", 7), 1);
    save(h, st);
    cr_assert_gt(agw_history_shed(h, 0), 0, "the saved text is forgotten");
    cr_assert_eq(agw_history_shed(h, 0), 0, "and only once");
    cr_assert_eq(agw_history_append_text(h, "a1", 2, "world", 5), 1, "a shed text grows");
    save(h, st);
    agw_history_shed(h, 0);
    cr_assert_eq(st->loads, 0, "nothing read back yet");
    return h;
}

Test(history, a_shed_text_grows_by_pieces_and_reads_back_whole)
{
    struct mini_store st = {0};
    struct agw_history *h = shed_thread(&st);
    struct agw_history_row r;
    char *d;

    cr_assert_eq(st.len[1], strlen(A1_TEXT) - 2, "the store holds the text in pieces");
    cr_assert_eq(memcmp(st.data[1], A1_TEXT, st.len[1]), 0);
    /* what it grows by after shedding is the next piece */
    cr_assert_eq(agw_history_append_text(h, "a1", 2, "!", 1), 1);
    agw_history_message_row(h, 1, &r);
    cr_assert_eq(r.part, 2, "pieces 0 and 1 are saved");
    cr_assert_eq(r.len, 1);
    cr_assert_eq(r.data[0], '!');
    save(h, &st);
    agw_history_shed(h, 0);
    /* a page and a dump read the text back, and leave it shed */
    expect_page_content(h, 1, "Hello, world!");
    cr_assert_eq(st.loads, 2, "u1 (a value, shed too) and a1");
    d = agw_history_dump(h);
    cr_assert(strstr(d, "\"content\":\"Hello, world!\"") != NULL, "%s", d);
    free(d);
    cr_assert_eq(st.loads, 4);
    cr_assert_eq(agw_history_load_errors(h), 0);
    agw_history_free(h);
    mini_free(&st);
}

Test(history, a_shed_text_is_compared_by_length_and_hash)
{
    struct mini_store st = {0};
    struct agw_history *h = shed_thread(&st);

    /* the client resends its history: the same bytes need no read back */
    cr_assert_eq(
        merge_body(h, "r2",
                   "{\"messages\":[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi\"},"
                   "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hello, world\"}]}"),
        0);
    cr_assert_eq(st.loads, 0, "equal: settled by length and hash");
    cr_assert_str_eq(changed(h), "");
    /* the same length, other bytes: it is replaced (read back to compare values) */
    cr_assert_eq(merge_body(h, "r2",
                            "{\"messages\":[{\"id\":\"a1\",\"role\":\"assistant\",\"content\":"
                            "\"Hello, World\"}]}"),
                 1);
    cr_assert_eq(st.loads, 1);
    cr_assert_str_eq(changed(h), "1");
    expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi\"},"
              "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hello, World\"}]");
    agw_history_free(h);
    mini_free(&st);
}

/* The body of a RunAgentInput whose messages are u1 and a1 with content <content>. */
static char *resend_a1(const char *content)
{
    static const char fmt[] = "{\"messages\":[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi\"},"
                              "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"%s\"}]}";
    size_t n = sizeof(fmt) + strlen(content);
    char *b = malloc(n);

    snprintf(b, n, fmt, content);
    return b;
}

/* A text shed over several commits keeps one hash going on, ended or not: a client's copy is told
 * equal or not at every step without reading anything back, also when a later run's deltas make an
 * ended text grow (a message id an agent uses again). */
Test(history, a_shed_text_s_hash_goes_on_as_it_grows_even_after_its_end)
{
    struct mini_store st = {0};
    struct agw_history *h = shed_thread(&st); /* a1: "Hello, world", growing, shed */
    char want[256] = "Hello, world", *b;
    int loads;

    for (int k = 0; k < 5; k++) { /* 5 commits of 13 bytes */
        cr_assert_eq(agw_history_append_text(h, "a1", 2, " and more, ok", 13), 1);
        strcat(want, " and more, ok");
        save(h, &st);
        agw_history_shed(h, 0);
        b = resend_a1(want);
        loads = st.loads;
        cr_assert_eq(merge_body(h, "r1", b), 0, "the same text, after commit %d", k);
        cr_assert_eq(st.loads, loads, "told by length, hash and the bytes in memory");
        free(b);
        expect_page_content(h, 1, want);
    }
    cr_assert_eq(agw_history_load_errors(h), 0);
    b = resend_a1(want);
    b[strlen(b) - 5] ^= 1; /* its last content byte ('k' of ...ok"}]}), shed: the hash tells */
    cr_assert_eq(merge_body(h, "r1", b), 1, "another last byte");
    free(b);
    b = resend_a1(want);
    b[strlen(b) - 6] ^= 1; /* 'o' -> 'n' */
    want[strlen(want) - 2] ^= 1;
    cr_assert_eq(merge_body(h, "r1", b), 1, "and another");
    free(b);
    expect_page_content(h, 1, want);
    agw_history_free(h);
    mini_free(&st);

    /* the same, ended, then a later run's delta */
    memset(&st, 0, sizeof(st));
    h = shed_thread(&st);
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a1\"}");
    agw_history_shed(h, 0);
    b = resend_a1("Hello, world");
    cr_assert_eq(merge_body(h, "r2", b), 0, "equal: by length and hash");
    free(b);
    cr_assert_eq(agw_history_append_text(h, "a1", 2, "! Again.", 8), 1);
    save(h, &st);
    agw_history_shed(h, 0);
    b = resend_a1("Hello, world! Again.");
    cr_assert_eq(merge_body(h, "r2", b), 0, "equal after it was shed again");
    free(b);
    cr_assert_eq(st.loads, 0, "nothing read back");
    expect_page_content(h, 1, "Hello, world! Again.");
    cr_assert_eq(agw_history_load_errors(h), 0);
    agw_history_free(h);
    mini_free(&st);

    /* an answer ended before its first commit, shed then, extended by the next runs (an agent
     * that reuses the message's id for each run's answer): never read back, whatever it grows by */
    memset(&st, 0, sizeof(st));
    h = agw_history_new(10);
    agw_history_set_loader(h, mini_load, &st);
    merge(h, "r1", "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi\"}]");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}");
    cr_assert_eq(agw_history_append_text(h, "a1", 2, "Hello, world", 12), 1);
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a1\"}");
    save(h, &st);
    cr_assert_gt(agw_history_shed(h, 0), 0, "the ended text, saved whole, is forgotten");
    strcpy(want, "Hello, world");
    for (int k = 0; k < 4; k++) {
        ev(h, "r2", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}");
        cr_assert_eq(agw_history_append_text(h, "a1", 2, " more", 5), 1);
        strcat(want, " more");
        ev(h, "r2", "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a1\"}");
        save(h, &st);
        agw_history_shed(h, 0);
        cr_assert_eq(st.loads, 0, "an ended answer's hash goes on: no read back (commit %d)", k);
    }
    b = resend_a1(want);
    cr_assert_eq(merge_body(h, "r3", b), 0, "the same text, told by length and hash");
    free(b);
    cr_assert_eq(st.loads, 0);
    expect_page_content(h, 1, want);
    cr_assert_eq(agw_history_load_errors(h), 0);
    agw_history_free(h);
    mini_free(&st);

    /* an input message shed whole keeps a final hash: grown by deltas, it is read back once */
    memset(&st, 0, sizeof(st));
    h = agw_history_new(10);
    agw_history_set_loader(h, mini_load, &st);
    cr_assert_eq(merge_body(h, "r1",
                            "{\"messages\":[{\"id\":\"u1\",\"role\":\"user\",\"content\":"
                            "\"Hi\"}]}"),
                 1);
    save(h, &st);
    cr_assert_gt(agw_history_shed(h, 1000), 0);
    cr_assert_eq(agw_history_append_text(h, "u1", 2, " there", 6), 1);
    save(h, &st);
    agw_history_shed(h, 0);
    cr_assert_eq(st.loads, 1, "u1 read back");
    expect_page_content(h, 0, "Hi there");
    cr_assert_eq(merge_body(h, "r3",
                            "{\"messages\":[{\"id\":\"u1\",\"role\":\"user\",\"content\":"
                            "\"Hi there\"}]}"),
                 0, "equal");
    cr_assert_eq(st.loads, 2, "u1 by the page, nothing more");
    cr_assert_eq(agw_history_load_errors(h), 0);
    agw_history_free(h);
    mini_free(&st);
}

/* A small growing text (an idle stream's answer so far) keeps no room beyond its bytes once saved;
 * it grows again as before. */
Test(history, a_small_growing_text_fits_its_buffer_once_saved)
{
    struct mini_store st = {0};
    struct agw_history *h = agw_history_new(10);
    size_t before, after;

    agw_history_set_loader(h, mini_load, &st);
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\",\"role\":\"assistant\"}");
    cr_assert_eq(agw_history_append_text(h, "a1", 2, "Hel", 3), 1);
    cr_assert_eq(agw_history_append_text(h, "a1", 2, "lo", 2), 1);
    save(h, &st);
    before = agw_history_text_bytes(h);
    agw_history_shed(h, 1024); /* below the size to shed: kept, made to fit */
    after = agw_history_text_bytes(h);
    cr_assert_lt(after, before, "room let go: %zu -> %zu bytes", before, after);
    cr_assert_eq(after, strlen("{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hello") + 3,
                 "its bytes, the closing '\"}' and a NUL");
    cr_assert_eq(agw_history_append_text(h, "a1", 2, ", world", 7), 1);
    expect_page_content(h, 0, "Hello, world");
    cr_assert_eq(st.loads, 0);
    agw_history_free(h);
    mini_free(&st);
}

Test(history, a_shed_text_that_moves_is_read_back_from_where_it_was)
{
    struct mini_store st = {0};
    struct agw_history *h = shed_thread(&st);
    struct agw_history_row r;

    /* an older message sent first: it goes before u1, and a1 moves */
    cr_assert_eq(merge_body(h, "r0",
                            "{\"messages\":[{\"id\":\"u0\",\"role\":\"user\"},{\"id\":\"u1\","
                            "\"role\":\"user\",\"content\":\"Hi\"}]}"),
                 1);
    cr_assert_eq(st.loads, 2, "u1 and a1 read back from positions 0 and 1 before they moved");
    cr_assert_str_eq(changed(h), "0 1 2");
    agw_history_message_row(h, 2, &r);
    cr_assert_eq(r.part, 0, "written whole where it is now");
    cr_assert(r.text);
    cr_assert_eq(r.len, strlen(A1_TEXT) - 2);
    cr_assert_eq(memcmp(r.data, A1_TEXT, r.len), 0);
    save(h, &st);
    expect(h, "[{\"id\":\"u0\",\"role\":\"user\"},{\"id\":\"u1\",\"role\":\"user\",\"content\":"
              "\"Hi\"},{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hello, world\"}]");
    agw_history_free(h);
    mini_free(&st);
}

Test(history, a_shed_text_given_a_tool_call_or_a_snapshot_is_read_back)
{
    struct mini_store st = {0};
    struct agw_history *h = shed_thread(&st);

    ev(h, "r2",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
       "\"parentMessageId\":\"a1\"}");
    cr_assert_eq(st.loads, 1);
    expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi\"},"
              "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hello, world\",\"toolCalls\":"
              "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
              "\"arguments\":\"\"}}]}]");
    agw_history_free(h);
    mini_free(&st);
    memset(&st, 0, sizeof(st));
    h = shed_thread(&st);
    /* a snapshot without u1: a1 moves to position 0, read back from position 1 first */
    ev(h, "r2",
       "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[{\"id\":\"a1\",\"role\":\"assistant\","
       "\"content\":\"Hello, world\"}]}");
    cr_assert_eq(st.loads, 1);
    expect(h, "[{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hello, world\"}]");
    cr_assert_eq(agw_history_load_errors(h), 0);
    agw_history_free(h);
    mini_free(&st);
}

Test(history, a_shed_text_that_cannot_be_read_back_is_counted)
{
    struct mini_store st = {0};
    struct agw_history *h = shed_thread(&st);
    struct agw_history_query q;

    st.fail = 1;
    cr_assert_eq(agw_history_query_parse("", &q, NULL, 0), 0);
    cr_assert_null(agw_history_page(h, &q), "no page");
    cr_assert_eq(agw_history_load_errors(h), 1);
    /* an operation that needs it still has a message to work on: its id */
    ev(h, "r2",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
       "\"parentMessageId\":\"a1\"}");
    cr_assert_eq(agw_history_load_errors(h), 2);
    cr_assert_str_eq(json_string_value(json_object_get(agw_history_message(h, 1), "id")), "a1");
    agw_history_free(h);
    mini_free(&st);
    /* bytes that are not what was shed are refused as well */
    memset(&st, 0, sizeof(st));
    h = shed_thread(&st);
    st.data[1][10] = 'X';
    cr_assert_eq(agw_history_query_parse("", &q, NULL, 0), 0);
    cr_assert_null(agw_history_page(h, &q));
    cr_assert_eq(agw_history_load_errors(h), 1);
    agw_history_free(h);
    mini_free(&st);
}

/* Saved values are shed too (not one with tool calls): compared by length and hash, read back for
 * a page or when they change. */
Test(history, saved_values_are_shed_and_read_back)
{
    struct mini_store st = {0};
    struct agw_history *h = agw_history_new(10);
    struct agw_history_query q;
    json_t *page;

    agw_history_set_loader(h, mini_load, &st);
    merge(h, "r1",
          "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi\"},{\"id\":\"a1\",\"role\":"
          "\"assistant\",\"toolCalls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{"
          "\"name\":\"f\",\"arguments\":\"{}\"}}]}]");
    save(h, &st);
    cr_assert_gt(agw_history_shed(h, 1000), 0, "u1 is shed whatever its size");
    cr_assert_eq(agw_history_shed(h, 1000), 0, "once");
    /* the client resends it: equal without a read */
    cr_assert_eq(
        merge_body(h, "r2",
                   "{\"messages\":[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi\"}]}"),
        0);
    cr_assert_eq(st.loads, 0);
    /* a result for c1 goes after a1 (not shed: it has tool calls) */
    ev(h, "r2",
       "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"t1\",\"toolCallId\":\"c1\",\"content\":"
       "\"ok\"}");
    cr_assert_eq(st.loads, 0, "found its owner without reading anything back");
    save(h, &st);
    agw_history_shed(h, 1000);
    cr_assert_eq(agw_history_query_parse("", &q, NULL, 0), 0);
    page = agw_history_page(h, &q);
    cr_assert_not_null(page);
    cr_assert_eq(json_array_size(json_object_get(page, "messages")), 3);
    cr_assert_str_eq(json_string_value(json_object_get(
                         json_array_get(json_object_get(page, "messages"), 0), "content")),
                     "Hi");
    json_decref(page);
    cr_assert_eq(st.loads, 2, "u1 and t1 read back for the page");
    /* a delta for a shed value: read back, then appended */
    ev(h, "r3", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"u1\",\"delta\":\"!\"}");
    cr_assert_eq(st.loads, 3);
    expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi!\"},"
              "{\"id\":\"a1\",\"role\":\"assistant\",\"toolCalls\":[{\"id\":\"c1\",\"type\":"
              "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
              "{\"id\":\"t1\",\"role\":\"tool\",\"toolCallId\":\"c1\",\"content\":\"ok\"}]");
    cr_assert_eq(agw_history_load_errors(h), 0);
    agw_history_free(h);
    mini_free(&st);
}

/* An input message held as text (input_messages_held_as_text_when_compact) is shed once saved, as
 * a value is, whatever its size: compared by length and hash, read back for a page. */
Test(history, input_text_is_shed_as_a_value)
{
    struct mini_store st = {0};
    struct agw_history *h = agw_history_new(10);
    const char *body = "{\"messages\":[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Hi\"}]}";

    agw_history_set_loader(h, mini_load, &st);
    cr_assert_eq(merge_body(h, "r1", body), 1);
    cr_assert_gt(agw_history_text_bytes(h), 0, "held as text");
    save(h, &st);
    cr_assert_gt(agw_history_shed(h, 1000), 0, "shed whatever its size");
    cr_assert_eq(agw_history_text_bytes(h), 0, "its buffer given back");
    cr_assert_eq(merge_body(h, "r2", body), 0, "resent: equal without a read");
    cr_assert_eq(st.loads, 0);
    expect_page_content(h, 0, "Hi");
    cr_assert_eq(st.loads, 1, "read back for the page");
    cr_assert_eq(agw_history_load_errors(h), 0);
    agw_history_free(h);
    mini_free(&st);
}

/* A text still growing keeps its buffer across sheddings (no new pages for its next deltas); its
 * TEXT_MESSAGE_END lets the next shedding free it. */
Test(history, an_ended_text_gives_its_buffer_back)
{
    struct mini_store st = {0};
    struct agw_history *h = agw_history_new(10);
    char big[4096];

    memset(big, 'y', sizeof(big));
    agw_history_set_loader(h, mini_load, &st);
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}");
    cr_assert_eq(agw_history_append_text(h, "a1", 2, big, sizeof(big)), 1);
    save(h, &st);
    agw_history_shed(h, 0);
    cr_assert_geq(agw_history_text_bytes(h), sizeof(big), "kept while it may grow");
    cr_assert_eq(
        agw_history_apply_line(h, "r1", "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a1\"}",
                               strlen("{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a1\"}")),
        0);
    cr_assert_str_eq(changed(h), "", "an end changes nothing");
    agw_history_shed(h, 0);
    cr_assert_eq(agw_history_text_bytes(h), 0, "ended: its buffer is freed");
    cr_assert_eq(st.loads, 0);
    agw_history_free(h);
    mini_free(&st);
}

Test(history, nothing_is_shed_without_a_loader_or_below_the_minimum)
{
    struct mini_store st = {0};
    struct agw_history *h = agw_history_new(10);

    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}");
    save(h, &st);
    cr_assert_eq(agw_history_shed(h, 0), 0, "no loader");
    agw_history_set_loader(h, mini_load, &st);
    cr_assert_eq(agw_history_shed(h, 1000), 0, "below the minimum");
    cr_assert_eq(agw_history_append_text(h, "a1", 2, "x", 1), 1);
    cr_assert_eq(agw_history_shed(h, 0), 0, "changed since saved");
    save(h, &st);
    cr_assert_gt(agw_history_shed(h, 0), 0, "saved again: shed");
    agw_history_free(h);
    mini_free(&st);
}

/* ---- dump and load ------------------------------------------------------------------------------
 */

Test(history, dump_and_load_round_trip)
{
    struct agw_history *h = agw_history_new(4), *back;
    char *s, *s2;

    merge(h, NULL, "[{\"id\":\"u0\",\"role\":\"user\",\"content\":\"dropped\"}]");
    merge(h, "r1", "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"caf\\u00e9 \\\"q\\\"\\n\"}]");
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\","
       "\"parentMessageId\":\"a1\"}");
    ev(h, "r1", "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"{}\"}");
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"t1\",\"toolCallId\":\"c1\",\"content\":"
       "\"x\"}");
    merge(h, NULL, "[{\"id\":\"u2\",\"role\":\"user\",\"content\":\"\"}]");
    cr_assert_eq(agw_history_dropped(h), 1);

    s = agw_history_dump(h);
    cr_assert_null(strchr(s, '\n'), "compact: %s", s);
    back = agw_history_load(s, strlen(s), 4);
    cr_assert_not_null(back, "%s", s);
    cr_assert_eq(agw_history_count(back), agw_history_count(h));
    for (size_t i = 0; i < agw_history_count(h); i++) {
        const char *r1 = agw_history_run_id(h, i), *r2 = agw_history_run_id(back, i);
        cr_assert(json_equal(agw_history_message(h, i), agw_history_message(back, i)));
        cr_assert((r1 == NULL && r2 == NULL) || (r1 != NULL && r2 != NULL && !strcmp(r1, r2)));
    }
    cr_assert_eq(agw_history_dropped(back), 1);
    s2 = agw_history_dump(back);
    cr_assert_str_eq(s, s2);
    /* the loaded thread goes on as the first would */
    ev(back, "r2", "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"!\"}");
    cr_assert_str_eq(
        json_string_value(json_object_get(
            json_object_get(
                json_array_get(json_object_get(agw_history_message(back, 1), "toolCalls"), 0),
                "function"),
            "arguments")),
        "{}!");
    free(s2);
    agw_history_free(back);

    /* a smaller cap keeps the newest */
    back = agw_history_load(s, strlen(s), 2);
    cr_assert_eq(agw_history_count(back), 2);
    cr_assert_eq(agw_history_dropped(back), 3);
    cr_assert_str_eq(json_string_value(json_object_get(agw_history_message(back, 0), "id")), "t1");
    agw_history_free(back);
    free(s);
    agw_history_free(h);
}

Test(history, empty_thread_dump)
{
    struct agw_history *h = agw_history_new(1), *back;
    char *s = agw_history_dump(h);

    cr_assert_str_eq(s, "{\"v\":1,\"dropped\":0,\"messages\":[]}");
    back = agw_history_load(s, strlen(s), 1);
    cr_assert_not_null(back);
    cr_assert_eq(agw_history_count(back), 0);
    free(s);
    agw_history_free(back);
    agw_history_free(h);
}

Test(history, load_refuses_what_is_not_a_dump)
{
    static const char *const bad[] = {
        "",
        "nope",
        "[]",
        "{}",
        "{\"v\":2,\"dropped\":0,\"messages\":[]}",
        "{\"v\":1,\"messages\":[]}",
        "{\"v\":1,\"dropped\":-1,\"messages\":[]}",
        "{\"v\":1,\"dropped\":0}",
        "{\"v\":1,\"dropped\":0,\"messages\":{}}",
        "{\"v\":1,\"dropped\":0,\"messages\":[1]}",
        "{\"v\":1,\"dropped\":0,\"messages\":[{\"run_id\":\"r\"}]}",
        "{\"v\":1,\"dropped\":0,\"messages\":[{\"run_id\":\"r\",\"message\":{\"role\":\"user\"}}]}",
        "{\"v\":1,\"dropped\":0,\"messages\":[{\"run_id\":3,\"message\":{\"id\":\"a\"}}]}",
        "{\"v\":1,\"dropped\":0,\"messages\":[]} trailing",
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_null(agw_history_load(bad[i], strlen(bad[i]), 10), "accepted: %s", bad[i]);
}

/* ---- what is ignored ----------------------------------------------------------------------------
 */

Test(history, malformed_events_are_ignored_and_counted)
{
    static const char *const bad[] = {
        "[]",
        "\"TEXT_MESSAGE_START\"",
        "{}",
        "{\"type\":7}",
        "{\"type\":\"TEXT_MESSAGE_START\"}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":1}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\",\"role\":5}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a\",\"delta\":1}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"delta\":\"x\"}",
        "{\"type\":\"TEXT_MESSAGE_END\"}",
        "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c\"}",
        "{\"type\":\"TOOL_CALL_START\",\"toolCallName\":\"f\"}",
        "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c\",\"toolCallName\":\"f\","
        "\"parentMessageId\":{}}",
        "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c\"}",
        "{\"type\":\"TOOL_CALL_ARGS\",\"delta\":\"x\"}",
        "{\"type\":\"TOOL_CALL_END\"}",
        "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"t\",\"toolCallId\":\"c\"}",
        "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"t\",\"content\":\"x\"}",
        "{\"type\":\"TOOL_CALL_RESULT\",\"toolCallId\":\"c\",\"content\":\"x\"}",
        "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"t\",\"toolCallId\":\"c\",\"content\":{}}",
        "{\"type\":\"MESSAGES_SNAPSHOT\"}",
        "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":{}}",
        "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[{\"id\":\"a\"},{\"role\":\"user\"}]}",
        "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[{\"id\":\"a\"},3]}",
    };
    struct agw_history *h = agw_history_new(10);
    size_t n = sizeof(bad) / sizeof(bad[0]);

    merge(h, "r1",
          "[{\"id\":\"a\",\"role\":\"assistant\",\"content\":\"x\",\"toolCalls\":[{\"id\":\"c\","
          "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}]");
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ev(h, "r2", bad[i]), -AGW_EINVAL, "accepted: %s", bad[i]);
    cr_assert_eq(agw_history_malformed(h), n);
    cr_assert_eq(agw_history_apply(h, "r2", NULL), -AGW_EINVAL);
    cr_assert_eq(agw_history_malformed(h), n + 1);
    expect(h,
           "[{\"id\":\"a\",\"role\":\"assistant\",\"content\":\"x\",\"toolCalls\":[{\"id\":\"c\","
           "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}]");
    agw_history_free(h);
}

Test(history, events_that_make_no_message_are_ignored)
{
    static const char *const other[] = {
        "{\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r\"}",
        "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t\",\"runId\":\"r\"}",
        "{\"type\":\"RUN_ERROR\",\"message\":\"x\"}",
        "{\"type\":\"STEP_STARTED\",\"stepName\":\"s\"}",
        "{\"type\":\"STATE_SNAPSHOT\",\"snapshot\":{}}",
        "{\"type\":\"STATE_DELTA\",\"delta\":[]}",
        "{\"type\":\"CUSTOM\",\"name\":\"n\",\"value\":1}",
        "{\"type\":\"RAW\",\"event\":{}}",
        "{\"type\":\"REASONING_START\",\"messageId\":\"r\"}",
        "{\"type\":\"REASONING_END\",\"messageId\":\"r\"}",
        "{\"type\":\"SOMETHING_NEW\",\"messages\":7}",
        "{\"type\":\"\"}",
    };
    struct agw_history *h = agw_history_new(10);

    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++)
        cr_assert_eq(ev(h, "r1", other[i]), 0, "%s", other[i]);
    cr_assert_eq(agw_history_count(h), 0);
    cr_assert_eq(agw_history_malformed(h), 0);
    cr_assert_null(agw_history_message(h, 0));
    cr_assert_null(agw_history_run_id(h, 0));
    agw_history_free(h);
}

/* ---- a whole run --------------------------------------------------------------------------------
 */

Test(history, two_runs_of_a_tool_round_trip)
{
    struct agw_history *h = agw_history_new(100);
    static const char *const run1[] = {
        "{\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r1\"}",
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\",\"role\":\"assistant\"}",
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"Checking\"}",
        "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a1\"}",
        "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"confirm\","
        "\"parentMessageId\":\"a1\"}",
        "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"{\\\"ok\\\":\"}",
        "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"true}\"}",
        "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c1\"}",
        "{\"type\":\"RUN_FINISHED\",\"threadId\":\"t\",\"runId\":\"r1\"}",
    };

    merge(h, "r1", "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Delete the logs\"}]");
    for (size_t i = 0; i < sizeof(run1) / sizeof(run1[0]); i++)
        cr_assert_geq(ev(h, "r1", run1[i]), 0);
    /* the client answers the call in the next run, resending everything it holds */
    merge(h, "r2",
          "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Delete the logs\"},"
          "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Checking\",\"toolCalls\":["
          "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"confirm\","
          "\"arguments\":\"{\\\"ok\\\":true}\"}}]},"
          "{\"id\":\"d1\",\"role\":\"tool\",\"toolCallId\":\"c1\",\"content\":\"true\"}]");
    ev(h, "r2", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a2\"}");
    ev(h, "r2", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a2\",\"delta\":\"Deleted.\"}");
    ev(h, "r2", "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a2\"}");
    expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"Delete the logs\"},"
              "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Checking\",\"toolCalls\":["
              "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"confirm\","
              "\"arguments\":\"{\\\"ok\\\":true}\"}}]},"
              "{\"id\":\"d1\",\"role\":\"tool\",\"toolCallId\":\"c1\",\"content\":\"true\"},"
              "{\"id\":\"a2\",\"role\":\"assistant\",\"content\":\"Deleted.\"}]");
    const char *runs[] = {"r1", "r1", "r2", "r2"};
    expect_runs(h, runs, 4);
    cr_assert_eq(agw_history_malformed(h), 0);
    agw_history_free(h);
}

/* The messages a snapshot or a run's start carries whole are held as the client holds them once
 * its schemas have read them: members no schema names stripped (of a message, a tool call, its
 * function, a content part, a part's source; an activity's content and any metadata left whole), a
 * message of an unknown role, a content part of an unknown type or with a source of one, dropped.
 */
Test(history, whole_messages_are_held_as_the_clients_schemas_leave_them)
{
    struct agw_history *h = agw_history_new(100);
    size_t len;

    cr_assert_eq(
        ev(h, "r1",
           "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":["
           "{\"id\":\"u1\",\"role\":\"user\",\"x\":1,\"content\":[{\"type\":\"text\",\"text\":"
           "\"hi\","
           "\"y\":2},{\"type\":\"image\",\"source\":{\"type\":\"url\",\"value\":\"u\",\"z\":3},"
           "\"metadata\":{\"k\":[1]}},{\"type\":\"sticker\",\"id\":\"s\"},{\"type\":\"audio\","
           "\"source\":{\"type\":\"ftp\",\"value\":\"v\"}},{\"type\":\"document\",\"source\":{"
           "\"type\":\"file\",\"value\":\"f\",\"provider\":\"p\",\"w\":0}}]},"
           "{\"id\":\"bot\",\"role\":\"robot\",\"content\":\"?\"},"
           "{\"id\":\"a1\",\"role\":\"assistant\",\"parts\":[],\"metadata\":{\"deep\":{\"q\":1}},"
           "\"toolCalls\":[{\"id\":\"c1\",\"type\":\"function\",\"index\":0,\"function\":{\"name\":"
           "\"f\",\"arguments\":\"{}\",\"strict\":true}}]},"
           "{\"id\":\"t1\",\"role\":\"tool\",\"toolCallId\":\"c1\",\"content\":\"ok\",\"error\":"
           "\"e\","
           "\"status\":\"done\"},"
           "{\"id\":\"p1\",\"role\":\"activity\",\"activityType\":\"plan\",\"content\":{\"any\":{"
           "\"x\":1}},\"extra\":1},"
           "{\"id\":\"r1\",\"role\":\"reasoning\",\"content\":\"hm\",\"subagentRunId\":null,"
           "\"signature\":\"s\"}]}"),
        1);
    expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"},"
              "{\"type\":\"image\",\"source\":{\"type\":\"url\",\"value\":\"u\"},\"metadata\":{"
              "\"k\":[1]}},{\"type\":\"document\",\"source\":{\"type\":\"file\",\"value\":\"f\","
              "\"provider\":\"p\"}}]},"
              "{\"id\":\"a1\",\"role\":\"assistant\",\"metadata\":{\"deep\":{\"q\":1}},"
              "\"toolCalls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
              "\"arguments\":\"{}\"}}]},"
              "{\"id\":\"t1\",\"role\":\"tool\",\"toolCallId\":\"c1\",\"content\":\"ok\","
              "\"error\":\"e\"},"
              "{\"id\":\"p1\",\"role\":\"activity\",\"activityType\":\"plan\",\"content\":{\"any\":"
              "{\"x\":1}}},"
              "{\"id\":\"r1\",\"role\":\"reasoning\",\"content\":\"hm\"}]");
    /* a run's start: the same, for the input's messages the thread lacks */
    cr_assert_eq(
        ev(h, "r2",
           "{\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r2\",\"input\":{"
           "\"messages\":[{\"id\":\"u2\",\"role\":\"user\",\"content\":\"q\",\"lang\":\"fr\"},"
           "{\"id\":\"x\",\"role\":\"bot\",\"content\":\"-\"},7]}}"),
        1);
    cr_assert_str_eq(agw_history_message_json(h, 5, &len),
                     "{\"id\":\"u2\",\"role\":\"user\",\"content\":\"q\"}");
    cr_assert_eq(agw_history_count(h), 6);
    /* what the client's parse refuses spoils the snapshot: a message of a known role without an id,
     * or one that is not an object */
    cr_assert_lt(ev(h, "r1",
                    "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[{\"role\":\"user\",\"content\":"
                    "\"a\"}]}"),
                 0);
    cr_assert_lt(ev(h, "r1", "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[3]}"), 0);
    cr_assert_eq(agw_history_count(h), 6);
    /* one with no message the client keeps empties the thread, but for what it keeps aside (the
     * reasoning and the activity messages: the snapshot holds none) */
    cr_assert_eq(
        ev(h, "r1",
           "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[{\"id\":\"q\",\"role\":\"x\"}]}"),
        1);
    cr_assert_eq(agw_history_count(h), 2);
    agw_history_free(h);
}

/* ---- reasoning messages, encrypted values, what a snapshot keeps aside
 * ---------------------------
 */

Test(history, reasoning_messages_are_built_as_texts_with_the_reasoning_role)
{
    struct agw_history *h = agw_history_new(100);

    /* the event's own role is not read: the client makes every one a "reasoning" message */
    cr_assert_eq(
        ev(h, "r1", "{\"type\":\"REASONING_MESSAGE_START\",\"messageId\":\"t1\",\"role\":\"x\"}"),
        1);
    cr_assert_eq(
        ev(h, "r1",
           "{\"type\":\"REASONING_MESSAGE_CONTENT\",\"messageId\":\"t1\",\"delta\":\"Think\"}"),
        1);
    cr_assert_eq(
        ev(h, "r1",
           "{\"type\":\"REASONING_MESSAGE_CONTENT\",\"messageId\":\"t1\",\"delta\":\"ing\"}"),
        1);
    cr_assert_eq(ev(h, "r1", "{\"type\":\"REASONING_MESSAGE_END\",\"messageId\":\"t1\"}"), 0);
    /* a start for a known id changes nothing; content for an unknown id neither */
    cr_assert_eq(ev(h, "r1", "{\"type\":\"REASONING_MESSAGE_START\",\"messageId\":\"t1\"}"), 0);
    cr_assert_eq(
        ev(h, "r1",
           "{\"type\":\"REASONING_MESSAGE_CONTENT\",\"messageId\":\"no\",\"delta\":\"x\"}"),
        0);
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"Hi\"}");
    expect(h, "[{\"id\":\"t1\",\"role\":\"reasoning\",\"content\":\"Thinking\"},"
              "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hi\"}]");
    cr_assert_lt(ev(h, "r1", "{\"type\":\"REASONING_MESSAGE_START\"}"), 0);
    cr_assert_lt(
        ev(h, "r1", "{\"type\":\"REASONING_MESSAGE_CONTENT\",\"messageId\":\"t1\",\"delta\":3}"),
        0);
    cr_assert_eq(agw_history_malformed(h), 2);
    agw_history_free(h);
}

Test(history, encrypted_values_go_to_their_message_or_tool_call)
{
    struct agw_history *h = agw_history_new(100);

    ev(h, "r1", "{\"type\":\"REASONING_MESSAGE_START\",\"messageId\":\"t1\"}");
    ev(h, "r1", "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\"}");
    merge(h, "r0",
          "[{\"id\":\"act\",\"role\":\"activity\",\"activityType\":\"p\",\"content\":{}}]");
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"REASONING_ENCRYPTED_VALUE\",\"subtype\":\"message\",\"entityId\":"
                    "\"t1\",\"encryptedValue\":\"E1\"}"),
                 1);
    cr_assert_eq(
        ev(h, "r1",
           "{\"type\":\"REASONING_ENCRYPTED_VALUE\",\"subtype\":\"tool-call\",\"entityId\":"
           "\"c1\",\"encryptedValue\":\"E2\"}"),
        1);
    /* the same value again changes nothing; an activity message, an unknown id are left alone */
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"REASONING_ENCRYPTED_VALUE\",\"subtype\":\"message\",\"entityId\":"
                    "\"t1\",\"encryptedValue\":\"E1\"}"),
                 0);
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"REASONING_ENCRYPTED_VALUE\",\"subtype\":\"message\",\"entityId\":"
                    "\"act\",\"encryptedValue\":\"E3\"}"),
                 0);
    cr_assert_eq(
        ev(h, "r1",
           "{\"type\":\"REASONING_ENCRYPTED_VALUE\",\"subtype\":\"tool-call\",\"entityId\":"
           "\"t1\",\"encryptedValue\":\"E4\"}"),
        0, "a tool call's id, not a message's");
    expect(h, "[{\"id\":\"t1\",\"role\":\"reasoning\",\"content\":\"\",\"encryptedValue\":\"E1\"},"
              "{\"id\":\"c1\",\"role\":\"assistant\",\"toolCalls\":[{\"id\":\"c1\",\"type\":"
              "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"},\"encryptedValue\":"
              "\"E2\"}]},"
              "{\"id\":\"act\",\"role\":\"activity\",\"activityType\":\"p\",\"content\":{}}]");
    cr_assert_lt(ev(h, "r1",
                    "{\"type\":\"REASONING_ENCRYPTED_VALUE\",\"subtype\":\"message\",\"entityId\":"
                    "\"t1\"}"),
                 0);
    agw_history_free(h);
}

Test(history, activity_messages_take_no_text)
{
    struct agw_history *h = agw_history_new(100);

    merge(h, "r0",
          "[{\"id\":\"act\",\"role\":\"activity\",\"activityType\":\"p\",\"content\":{}}]");
    cr_assert_eq(
        ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"act\",\"delta\":\"x\"}"),
        0);
    cr_assert_eq(ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"act\"}"), 0);
    /* nor a raw delta to an activity message a run's input gave with a text content (held as
     * text: it has a text's form) */
    merge(h, "r1", "[{\"id\":\"act2\",\"role\":\"activity\",\"content\":\"q\"}]");
    cr_assert_eq(agw_history_append_text(h, "act2", 4, "x", 1), 0);
    cr_assert_eq(
        ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"act2\",\"delta\":\"x\"}"),
        0);
    expect(h, "[{\"id\":\"act\",\"role\":\"activity\",\"activityType\":\"p\",\"content\":{}},"
              "{\"id\":\"act2\",\"role\":\"activity\",\"content\":\"q\"}]");
    agw_history_free(h);
}

/* A thread of a user message, a reasoning message, activity messages of types "p" and "q", and an
 * assistant message; then the snapshot <snap> (with <meta> as its metadata when not NULL). */
static struct agw_history *snapshot_thread(const char *snap, const char *meta)
{
    struct agw_history *h = agw_history_new(100);
    char evt[1024];

    merge(h, "r0",
          "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"q\"},"
          "{\"id\":\"ap\",\"role\":\"activity\",\"activityType\":\"p\",\"content\":{}},"
          "{\"id\":\"aq\",\"role\":\"activity\",\"activityType\":\"q\",\"content\":{}}]");
    ev(h, "r1", "{\"type\":\"REASONING_MESSAGE_START\",\"messageId\":\"t1\"}");
    ev(h, "r1", "{\"type\":\"REASONING_MESSAGE_CONTENT\",\"messageId\":\"t1\",\"delta\":\"hm\"}");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\"}");
    snprintf(evt, sizeof(evt), "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":%s%s%s}", snap,
             meta != NULL ? ",\"metadata\":" : "", meta != NULL ? meta : "");
    cr_assert_eq(ev(h, "r2", evt), 1, "%s", evt);
    return h;
}

#define U1 "{\"id\":\"u1\",\"role\":\"user\",\"content\":\"q\"}"
#define AP "{\"id\":\"ap\",\"role\":\"activity\",\"activityType\":\"p\",\"content\":{}}"
#define AQ "{\"id\":\"aq\",\"role\":\"activity\",\"activityType\":\"q\",\"content\":{}}"
#define T1 "{\"id\":\"t1\",\"role\":\"reasoning\",\"content\":\"hm\"}"
#define A2 "{\"id\":\"a2\",\"role\":\"assistant\",\"content\":\"new\"}"
#define R9 "{\"id\":\"r9\",\"role\":\"reasoning\",\"content\":\"other\"}"
#define X9 "{\"id\":\"x9\",\"role\":\"activity\",\"activityType\":\"p\",\"content\":{}}"

Test(history, a_snapshot_keeps_reasoning_and_activity_aside_as_the_client_does)
{
    static const struct {
        const char *snap, *meta, *want;
    } cases[] = {
        /* none of either in the snapshot: both kept where they were, the rest as before */
        {"[" U1 "," A2 "]", NULL, "[" U1 "," AP "," AQ "," T1 "," A2 "]"},
        /* the snapshot brings its own reasoning: the thread's goes */
        {"[" U1 "," R9 "]", NULL, "[" U1 "," AP "," AQ "," R9 "]"},
        /* ... its own activity: the thread's goes */
        {"[" U1 "," X9 "]", NULL, "[" U1 "," T1 "," X9 "]"},
        /* it speaks for every activity type (null): none kept */
        {"[" U1 "]", "{\"@ag-ui/client\":{\"authoritativeActivityTypes\":null}}",
         "[" U1 "," T1 "]"},
        /* for type p only: q kept, even though the snapshot holds activity */
        {"[" U1 "," X9 "]", "{\"@ag-ui/client\":{\"authoritativeActivityTypes\":[\"p\"]}}",
         "[" U1 "," AQ "," T1 "," X9 "]"},
        /* for no type, or in a form the client does not read as a list: every one kept */
        {"[" U1 "," X9 "]", "{\"@ag-ui/client\":{\"authoritativeActivityTypes\":[]}}",
         "[" U1 "," AP "," AQ "," T1 "," X9 "]"},
        {"[" U1 "," X9 "]", "{\"@ag-ui/client\":{\"authoritativeActivityTypes\":[1]}}",
         "[" U1 "," AP "," AQ "," T1 "," X9 "]"},
        {"[" U1 "," X9 "]", "{\"@ag-ui/client\":7}", "[" U1 "," AP "," AQ "," T1 "," X9 "]"},
        /* metadata that does not name the client, or no such key: as without metadata */
        {"[" U1 "]", "{\"other\":{}}", "[" U1 "," AP "," AQ "," T1 "]"},
        {"[" U1 "]", "{\"@ag-ui/client\":{}}", "[" U1 "," AP "," AQ "," T1 "]"},
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        struct agw_history *h = snapshot_thread(cases[i].snap, cases[i].meta);
        expect(h, cases[i].want);
        agw_history_free(h);
    }
}

Test(history, a_run_start_adds_the_input_messages_the_thread_lacks)
{
    struct agw_history *h = agw_history_new(100);
    static const char *const runs[] = {"r0", "r0", "r1", "r1"};

    merge(h, "r0",
          "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"a\"},{\"id\":\"a1\",\"role\":"
          "\"assistant\",\"content\":\"b\"}]");
    /* known ids are left as they are (even changed: the client only adds), new ones appended in
     * order, once; elements without an id are skipped; no input, or no messages, change nothing */
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r1\",\"input\":{"
                    "\"messages\":[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"changed\"},"
                    "{\"id\":\"s1\",\"role\":\"system\",\"content\":\"c\",\"subagentRunId\":null},"
                    "{\"role\":\"user\"},{\"id\":\"u2\",\"role\":\"user\",\"content\":\"d\"},"
                    "{\"id\":\"u2\",\"role\":\"user\",\"content\":\"twice\"}]}}"),
                 1);
    cr_assert_eq(ev(h, "r2", "{\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r2\"}"), 0);
    cr_assert_eq(ev(h, "r2", "{\"type\":\"RUN_STARTED\",\"input\":{\"threadId\":\"t\"}}"), 0);
    cr_assert_eq(ev(h, "r2", "{\"type\":\"RUN_STARTED\",\"input\":7}"), 0);
    expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"a\"},"
              "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"b\"},"
              "{\"id\":\"s1\",\"role\":\"system\",\"content\":\"c\"},"
              "{\"id\":\"u2\",\"role\":\"user\",\"content\":\"d\"}]");
    expect_runs(h, runs, 4);
    cr_assert_eq(agw_history_malformed(h), 0);
    agw_history_free(h);
}

Test(history, a_tool_call_start_for_a_known_call_renames_it)
{
    struct agw_history *h = agw_history_new(100);

    ev(h, "r1", "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\"}");
    ev(h, "r1", "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"{}\"}");
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"g\","
                    "\"parentMessageId\":\"p\"}"),
                 1);
    cr_assert_eq(
        ev(h, "r1", "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"g\"}"),
        0);
    expect(h, "[{\"id\":\"c1\",\"role\":\"assistant\",\"toolCalls\":[{\"id\":\"c1\",\"type\":"
              "\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]}]");
    agw_history_free(h);
}

Test(history, a_snapshots_null_subagent_run_id_is_left_out)
{
    struct agw_history *h = agw_history_new(100);

    merge(h, "r0", "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"q\"}]");
    cr_assert_eq(
        ev(h, "r1",
           "{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[{\"id\":\"u1\",\"role\":\"user\","
           "\"content\":\"q\",\"subagentRunId\":null},{\"id\":\"a1\",\"role\":"
           "\"assistant\",\"content\":\"x\",\"subagentRunId\":null},{\"id\":\"a2\","
           "\"role\":\"assistant\",\"content\":\"y\",\"subagentRunId\":\"s\"}]}"),
        1);
    expect(h, "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"q\"},"
              "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"x\"},"
              "{\"id\":\"a2\",\"role\":\"assistant\",\"content\":\"y\",\"subagentRunId\":\"s\"}]");
    agw_history_free(h);
}

Test(history, names_and_subagent_run_ids_go_on_the_messages_their_events_make)
{
    struct agw_history *h = agw_history_new(100);

    ev(h, "r1",
       "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\",\"name\":\"Ann \\\"A\\\"\","
       "\"subagentRunId\":\"sub1\"}");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"hi\"}");
    /* null is none; a START for a known id changes nothing, its name included */
    ev(h, "r1",
       "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a2\",\"name\":null,\"subagentRunId\":"
       "null}");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a2\",\"name\":\"late\"}");
    /* a reasoning message takes no name */
    ev(h, "r1",
       "{\"type\":\"REASONING_MESSAGE_START\",\"messageId\":\"t1\",\"name\":\"n\","
       "\"subagentRunId\":"
       "\"sub2\"}");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"c1\",\"name\":\"Bo\"}");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"c1\",\"delta\":\"x\"}");
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"k1\",\"toolCallName\":\"f\","
       "\"subagentRunId\":"
       "\"sub3\"}");
    /* a call added to a message that exists does not change it */
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"k2\",\"toolCallName\":\"f\","
       "\"parentMessageId\":"
       "\"k1\",\"subagentRunId\":\"sub4\"}");
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"k3\",\"toolCallName\":\"g\","
       "\"subagentRunId\":"
       "\"sub5\"}");
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"res\",\"toolCallId\":\"k1\",\"content\":"
       "\"ok\","
       "\"subagentRunId\":\"sub6\"}");
    expect(
        h,
        "[{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"hi\",\"name\":\"Ann \\\"A\\\"\","
        "\"subagentRunId\":\"sub1\"},"
        "{\"id\":\"a2\",\"role\":\"assistant\",\"content\":\"\"},"
        "{\"id\":\"t1\",\"role\":\"reasoning\",\"content\":\"\",\"subagentRunId\":\"sub2\"},"
        "{\"id\":\"c1\",\"role\":\"assistant\",\"content\":\"x\",\"name\":\"Bo\"},"
        "{\"id\":\"k1\",\"role\":\"assistant\",\"subagentRunId\":\"sub3\",\"toolCalls\":["
        "{\"id\":\"k1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}},"
        "{\"id\":\"k2\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]},"
        "{\"id\":\"res\",\"role\":\"tool\",\"toolCallId\":\"k1\",\"content\":\"ok\","
        "\"subagentRunId\":\"sub6\"},"
        "{\"id\":\"k3\",\"role\":\"assistant\",\"subagentRunId\":\"sub5\",\"toolCalls\":["
        "{\"id\":\"k3\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"\"}}]}"
        "]");
    cr_assert_eq(agw_history_malformed(h), 0);
    cr_assert_lt(ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"z\",\"name\":1}"),
                 0);
    cr_assert_lt(ev(h, "r1",
                    "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"z\",\"toolCallId\":\"k1\","
                    "\"content\":\"ok\",\"subagentRunId\":[]}"),
                 0);
    agw_history_free(h);
}

Test(history, activity_snapshots_and_deltas)
{
    struct agw_history *h = agw_history_new(100);

    cr_assert_eq(
        ev(h, "r1",
           "{\"type\":\"ACTIVITY_SNAPSHOT\",\"messageId\":\"p1\",\"activityType\":\"plan\","
           "\"content\":{\"steps\":[\"a\"],\"done\":0},\"subagentRunId\":\"s\"}"),
        1);
    cr_assert_eq(
        ev(h, "r1",
           "{\"type\":\"ACTIVITY_DELTA\",\"messageId\":\"p1\",\"activityType\":\"plan2\","
           "\"patch\":[{\"op\":\"replace\",\"path\":\"/done\",\"value\":1},{\"op\":\"add\","
           "\"path\":\"/steps/-\",\"value\":\"b\"}]}"),
        1);
    /* a patch that fails, on its second operation, leaves the message as it was */
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"ACTIVITY_DELTA\",\"messageId\":\"p1\",\"activityType\":\"x\","
                    "\"patch\":[{\"op\":\"replace\",\"path\":\"/done\",\"value\":2},{\"op\":"
                    "\"remove\",\"path\":\"/nothing\"}]}"),
                 0);
    expect(h, "[{\"id\":\"p1\",\"role\":\"activity\",\"activityType\":\"plan2\",\"content\":{"
              "\"steps\":[\"a\",\"b\"],\"done\":1},\"subagentRunId\":\"s\"}]");
    /* replace false leaves a known id; a snapshot of a known activity message replaces its type
     * and content, keeps its other members, and its subagentRunId goes (none given) */
    cr_assert_eq(
        ev(h, "r1",
           "{\"type\":\"ACTIVITY_SNAPSHOT\",\"messageId\":\"p1\",\"activityType\":\"plan\","
           "\"content\":{\"v\":2},\"replace\":false}"),
        0);
    merge(h, "r0",
          "[{\"id\":\"p1\",\"role\":\"activity\",\"activityType\":\"plan2\",\"content\":{"
          "\"steps\":[\"a\",\"b\"],\"done\":1},\"subagentRunId\":\"s\",\"extra\":true}]");
    cr_assert_eq(
        ev(h, "r1",
           "{\"type\":\"ACTIVITY_SNAPSHOT\",\"messageId\":\"p1\",\"activityType\":\"plan\","
           "\"content\":{\"v\":2}}"),
        1);
    expect(h, "[{\"id\":\"p1\",\"role\":\"activity\",\"activityType\":\"plan\",\"content\":{"
              "\"v\":2},\"extra\":true}]");
    /* a delta on a message of another role, or an unknown id: nothing; on an activity message
     * without content: the patch applies to {} */
    merge(h, "r0",
          "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"q\"},{\"id\":\"p2\",\"role\":"
          "\"activity\",\"activityType\":\"t\"}]");
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"ACTIVITY_DELTA\",\"messageId\":\"u1\",\"activityType\":\"t\","
                    "\"patch\":[]}"),
                 0);
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"ACTIVITY_DELTA\",\"messageId\":\"zz\",\"activityType\":\"t\","
                    "\"patch\":[]}"),
                 0);
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"ACTIVITY_DELTA\",\"messageId\":\"p2\",\"activityType\":\"t\","
                    "\"patch\":[{\"op\":\"add\",\"path\":\"/k\",\"value\":1}]}"),
                 1);
    /* a snapshot for another role's id replaces that message, keeping its run id */
    cr_assert_eq(ev(h, "r2",
                    "{\"type\":\"ACTIVITY_SNAPSHOT\",\"messageId\":\"u1\",\"activityType\":\"t\","
                    "\"content\":[1]}"),
                 1);
    expect(h, "[{\"id\":\"p1\",\"role\":\"activity\",\"activityType\":\"plan\",\"content\":{"
              "\"v\":2},\"extra\":true},{\"id\":\"u1\",\"role\":\"activity\",\"activityType\":"
              "\"t\",\"content\":[1]},{\"id\":\"p2\",\"role\":\"activity\",\"activityType\":\"t\","
              "\"content\":{\"k\":1}}]");
    cr_assert_str_eq(agw_history_run_id(h, 1), "r0");
    cr_assert_eq(agw_history_malformed(h), 0);
    cr_assert_lt(ev(h, "r1", "{\"type\":\"ACTIVITY_DELTA\",\"messageId\":\"p1\",\"patch\":[]}"), 0);
    cr_assert_lt(
        ev(h, "r1", "{\"type\":\"ACTIVITY_SNAPSHOT\",\"messageId\":\"p1\",\"activityType\":\"t\"}"),
        0);
    cr_assert_lt(ev(h, "r1",
                    "{\"type\":\"ACTIVITY_SNAPSHOT\",\"messageId\":\"p1\",\"activityType\":\"t\","
                    "\"content\":{},\"replace\":\"no\"}"),
                 0);
    agw_history_free(h);
}

/* ---- metadata
 * ------------------------------------------------------------------------------------
 */

Test(history, metadata_merges_into_messages_as_the_client_merges_it)
{
    struct agw_history *h = agw_history_new(100);

    /* a text message keeps taking raw deltas around its metadata, even one with a "content" key */
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a1\",\"metadata\":{\"model\":"
                    "\"m\",\"content\":\"not the content\"}}"),
                 1);
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"Hel\"}");
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"lo\","
                    "\"metadata\":{\"model\":\"m\"}}"),
                 1);
    /* the last key wins, never recursing: usage is replaced whole */
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a1\",\"metadata\":{\"usage\":{"
                    "\"in\":1,\"out\":2}}}"),
                 1);
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a1\",\"metadata\":{\"usage\":{"
                    "\"out\":3},\"model\":\"n\"}}"),
                 1);
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a1\",\"metadata\":{\"model\":"
                    "\"n\"}}"),
                 0, "the same metadata again changes nothing");
    cr_assert_eq(ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"a1\",\"metadata\":7}"),
                 0, "metadata that is not an object is none");
    ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"a1\",\"delta\":\"!\"}");
    expect(h, "[{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hello!\",\"metadata\":{"
              "\"model\":\"n\",\"content\":\"not the content\",\"usage\":{\"out\":3}}}]");
    /* the message is still its JSON text, metadata before its content */
    {
        size_t len;
        const char *j = agw_history_message_json(h, 0, &len);
        cr_assert(len >= 19 && memcmp(j + len - 19, "\"content\":\"Hello!\"}", 19) == 0, "%.*s",
                  (int)len, j);
    }
    /* reasoning, tool calls, results */
    ev(h, "r1",
       "{\"type\":\"REASONING_MESSAGE_START\",\"messageId\":\"t1\",\"metadata\":{\"k\":1}}");
    ev(h, "r1", "{\"type\":\"REASONING_MESSAGE_END\",\"messageId\":\"t1\",\"metadata\":{\"k\":2}}");
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\",\"metadata\":{"
       "\"a\":1}}");
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"{}\",\"metadata\":{\"b\":2}"
       "}");
    cr_assert_eq(
        ev(h, "r1", "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c1\",\"metadata\":{\"a\":3}}"),
        1);
    cr_assert_eq(ev(h, "r1", "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c1\"}"), 0);
    ev(h, "r1",
       "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"res\",\"toolCallId\":\"c1\",\"content\":"
       "\"ok\",\"metadata\":{\"ms\":5}}");
    expect(h, "[{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hello!\",\"metadata\":{"
              "\"model\":\"n\",\"content\":\"not the content\",\"usage\":{\"out\":3}}},"
              "{\"id\":\"t1\",\"role\":\"reasoning\",\"content\":\"\",\"metadata\":{\"k\":2}},"
              "{\"id\":\"c1\",\"role\":\"assistant\",\"toolCalls\":[{\"id\":\"c1\",\"type\":"
              "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"},\"metadata\":{"
              "\"a\":3,\"b\":2}}]},"
              "{\"id\":\"res\",\"role\":\"tool\",\"toolCallId\":\"c1\",\"content\":\"ok\","
              "\"metadata\":{\"ms\":5}}]");
    cr_assert_eq(agw_history_malformed(h), 0);
    agw_history_free(h);
}

Test(history, metadata_of_activity_messages)
{
    struct agw_history *h = agw_history_new(100);

    ev(h, "r1",
       "{\"type\":\"ACTIVITY_SNAPSHOT\",\"messageId\":\"p1\",\"activityType\":\"plan\",\"content\":"
       "{"
       "\"n\":0},\"metadata\":{\"a\":1}}");
    /* a patch that fails still leaves its metadata merged, as the client merges it first */
    cr_assert_eq(ev(h, "r1",
                    "{\"type\":\"ACTIVITY_DELTA\",\"messageId\":\"p1\",\"activityType\":\"x\","
                    "\"patch\":[{\"op\":\"remove\",\"path\":\"/none\"}],\"metadata\":{\"b\":2}}"),
                 1);
    /* replace false: the message stays, its metadata is merged */
    cr_assert_eq(
        ev(h, "r1",
           "{\"type\":\"ACTIVITY_SNAPSHOT\",\"messageId\":\"p1\",\"activityType\":\"plan\","
           "\"content\":{\"n\":9},\"replace\":false,\"metadata\":{\"c\":3}}"),
        1);
    /* text events leave an activity message's metadata alone too */
    cr_assert_eq(
        ev(h, "r1", "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"p1\",\"metadata\":{\"d\":4}}"),
        0);
    expect(h, "[{\"id\":\"p1\",\"role\":\"activity\",\"activityType\":\"plan\",\"content\":{"
              "\"n\":0},\"metadata\":{\"a\":1,\"b\":2,\"c\":3}}]");
    agw_history_free(h);
}
