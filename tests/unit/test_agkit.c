/* Tests for src/agkit.c: each rule of the legacy AG-Kit translation (doc/dialects.md), the request
 * and the events, and the events through the normaliser (agw_agui with "ag-kit") as a client gets
 * them. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "agw/agkit.h"
#include "agw/agui.h"

static json_t *request(const char *body)
{
    char err[AGW_AGKIT_ERR_MAX];
    size_t len = 0;
    char *out = agw_agkit_request(body, strlen(body), &len, err, sizeof(err));
    json_t *j;

    cr_assert_not_null(out, "%s", err);
    cr_assert_eq(len, strlen(out));
    j = json_loads(out, 0, NULL);
    cr_assert_not_null(j, "%s", out);
    free(out);
    return j;
}

static void expect_json(json_t *got, const char *want)
{
    json_t *w = json_loads(want, 0, NULL);
    char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);

    cr_assert_not_null(w, "bad expectation %s", want);
    cr_assert(json_equal(got, w), "got %s\nwant %s", g, want);
    free(g);
    json_decref(w);
}

Test(agkit, request_first_turn)
{
    json_t *j = request(
        "{\"threadId\":\"c7d3\",\"runId\":\"r1\",\"messages\":[{\"id\":\"m1\",\"role\":\"user\","
        "\"content\":\"Change background color to blue.\"}],\"tools\":[{\"name\":\"change-"
        "background-color\",\"description\":\"Change it\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"color\":{\"type\":\"string\"}},\"required\":[\"color\"]}}],"
        "\"state\":{},\"context\":[],\"forwardedProps\":{}}");

    expect_json(j,
                "{\"conversationId\":\"c7d3\",\"messages\":[{\"role\":\"user\",\"content\":"
                "\"Change background color to blue.\"}],\"tools\":[{\"name\":\"change-"
                "background-color\",\"description\":\"Change it\",\"parameters\":\"{\\\"type\\\":"
                "\\\"object\\\",\\\"properties\\\":{\\\"color\\\":{\\\"type\\\":\\\"string\\\"}},"
                "\\\"required\\\":[\\\"color\\\"]}\"}]}");
    json_decref(j);
}

/* The backend saw everything up to its own last answer: a tool result, or the next user turn, is
 * all it gets. */
Test(agkit, request_sends_only_what_the_backend_has_not_seen)
{
    json_t *j = request(
        "{\"threadId\":\"c7d3\",\"runId\":\"r2\",\"messages\":["
        "{\"id\":\"m1\",\"role\":\"user\",\"content\":\"Change background color to blue.\"},"
        "{\"id\":\"a1\",\"role\":\"assistant\",\"toolCalls\":[{\"id\":\"a_b_c\",\"type\":"
        "\"function\",\"function\":{\"name\":\"change-background-color\",\"arguments\":"
        "\"{\\\"color\\\":\\\"blue\\\"}\"}}]},"
        "{\"id\":\"t1\",\"role\":\"tool\",\"toolCallId\":\"a_b_c\",\"content\":\"Background "
        "color successfully changed to: blue\"}]}");

    expect_json(j,
                "{\"conversationId\":\"c7d3\",\"messages\":[{\"role\":\"tool\",\"content\":"
                "\"Background color successfully changed to: blue\",\"toolCallId\":\"a_b_c\"}]}");
    json_decref(j);
    j = request(
        "{\"threadId\":\"t\",\"runId\":\"r3\",\"messages\":["
        "{\"id\":\"m1\",\"role\":\"user\",\"content\":\"hi\"},"
        "{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"Hello\"},"
        "{\"id\":\"m2\",\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"and \"},"
        "{\"type\":\"binary\",\"mimeType\":\"image/png\",\"data\":\"AA==\"},"
        "{\"type\":\"text\",\"text\":\"more\"}]}]}");
    expect_json(j, "{\"conversationId\":\"t\",\"messages\":[{\"role\":\"user\",\"content\":"
                   "\"and more\"}]}");
    json_decref(j);
}

Test(agkit, request_resume)
{
    json_t *j = request("{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[],\"resume\":["
                        "{\"interruptId\":\"int_1\",\"payload\":{\"approved\":true}}]}");

    expect_json(j, "{\"conversationId\":\"t\",\"messages\":[],\"resume\":{\"interruptId\":"
                   "\"int_1\",\"payload\":{\"approved\":true}}}");
    json_decref(j);
    j = request("{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[],\"resume\":"
                "{\"interruptId\":\"int_2\",\"payload\":\"yes\"}}");
    expect_json(j, "{\"conversationId\":\"t\",\"messages\":[],\"resume\":{\"interruptId\":"
                   "\"int_2\",\"payload\":\"yes\"}}");
    json_decref(j);
}

/* ---- events ---------------------------------------------------------------------------------- */

struct collected {
    char text[8192];
};

static void collect(void *arg, const char *json, size_t len)
{
    struct collected *c = arg;
    size_t n = strlen(c->text);

    cr_assert_lt(n + len + 2, sizeof(c->text));
    memcpy(c->text + n, json, len);
    c->text[n + len] = '\n';
    c->text[n + len + 1] = '\0';
}

static const char *translate(struct agw_agkit *t, struct collected *c, const char *data)
{
    c->text[0] = '\0';
    agw_agkit_feed(t, data, strlen(data), collect, c);
    return c->text;
}

Test(agkit, events)
{
    struct agw_agkit *t = agw_agkit_new("r1");
    struct collected c;

    cr_assert_str_eq(
        translate(t, &c, "{\"type\": \"text\", \"content\": \"Hello\"}"),
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"r1-msg-1\",\"role\":"
        "\"assistant\"}\n{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"r1-msg-1\","
        "\"delta\":\"Hello\"}\n");
    cr_assert_str_eq(translate(t, &c, "{\"type\":\"text\",\"content\":\" there!\"}"),
                     "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"r1-msg-1\",\"delta\":"
                     "\" there!\"}\n");
    cr_assert_str_eq(translate(t, &c, "{\"type\":\"text\",\"content\":\"\"}"), "",
                     "an empty text adds nothing");
    cr_assert_str_eq(
        translate(
            t, &c,
            "{\"type\":\"tool-call-start\",\"toolCallId\":\"a_b_c\",\"toolCallName\":\"change-"
            "background-color\"}"),
        "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"r1-msg-1\"}\n{\"type\":\"TOOL_CALL_START\","
        "\"toolCallId\":\"a_b_c\",\"toolCallName\":\"change-background-color\"}\n");
    cr_assert_str_eq(
        translate(
            t, &c,
            "{\"type\":\"tool-call-args\",\"toolCallId\":\"a_b_c\",\"delta\":\"{\\\"color\\\":\"}"),
        "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"a_b_c\",\"delta\":\"{\\\"color\\\":\"}\n");
    cr_assert_str_eq(translate(t, &c, "{\"type\":\"tool-call-end\",\"toolCallId\":\"a_b_c\"}"),
                     "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"a_b_c\"}\n");
    cr_assert_str_eq(
        translate(t, &c,
                  "{\"type\":\"tool-result\",\"toolCallId\":\"a_b_c\",\"result\":{\"ok\":true}}"),
        "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"r1-msg-2\",\"content\":\"{\\\"ok\\\":true}"
        "\","
        "\"role\":\"tool\",\"toolCallId\":\"a_b_c\"}\n");
    cr_assert_str_eq(
        translate(t, &c, "{\"type\":\"tool-result\",\"toolCallId\":\"x\",\"result\":\"done\"}"),
        "{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"r1-msg-3\",\"content\":\"done\","
        "\"role\":\"tool\",\"toolCallId\":\"x\"}\n");
    cr_assert_str_eq(
        translate(t, &c, "{\"type\":\"text\",\"content\":\"ok\"}"),
        "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"r1-msg-4\",\"role\":"
        "\"assistant\"}\n{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"r1-msg-4\","
        "\"delta\":\"ok\"}\n");
    cr_assert_str_eq(translate(t, &c, "{\"type\":\"usage\",\"tokens\":12}"), "",
                     "a legacy type with no AG-UI meaning is dropped");
    cr_assert_str_eq(translate(t, &c, "not json"), "not json\n",
                     "not an event: handed on for the normaliser to refuse");
    c.text[0] = '\0';
    agw_agkit_end(t, collect, &c);
    cr_assert_str_eq(c.text, "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"r1-msg-4\"}\n");
    agw_agkit_free(t);
}

Test(agkit, interrupt_and_done)
{
    struct agw_agkit *t = agw_agkit_new("r9");
    struct collected c = {""};

    translate(t, &c, "{\"type\":\"text\",\"content\":\"About to delete\"}");
    c.text[0] = '\0';
    const char *interrupt = "{\"type\":\"interrupt\",\"id\":\"int_1\",\"reason\":\"confirm\","
                            "\"payload\":{\"count\":15}}";
    cr_assert_eq(agw_agkit_feed(t, interrupt, strlen(interrupt), collect, &c), 1);
    cr_assert_str_eq(c.text, "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"r9-msg-1\"}\n"
                             "{\"type\":\"RUN_FINISHED\",\"outcome\":{\"type\":\"interrupt\","
                             "\"interrupts\":[{\"id\":\"int_1\",\"reason\":\"confirm\",\"payload\":"
                             "{\"count\":15}}]}}\n");
    cr_assert_eq(agw_agkit_feed(t, "{\"type\":\"text\"}", 15, collect, &c), 1,
                 "nothing after the end");
    agw_agkit_free(t);

    t = agw_agkit_new("r10");
    translate(t, &c, "{\"type\":\"text\",\"content\":\"bye\"}");
    c.text[0] = '\0';
    cr_assert_eq(agw_agkit_feed(t, " [DONE] ", 8, collect, &c), 1);
    cr_assert_str_eq(c.text, "{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"r10-msg-1\"}\n"
                             "{\"type\":\"RUN_FINISHED\"}\n");
    agw_agkit_free(t);
}

/* ---- through the normaliser ------------------------------------------------------------------ */

static void sink_emit(void *arg, const char *json, size_t len, bool pass)
{
    struct collected *c = arg;
    json_t *ev = json_loadb(json, len, 0, NULL);
    const char *type = json_string_value(json_object_get(ev, "type"));
    size_t n = strlen(c->text);

    (void)pass;
    snprintf(c->text + n, sizeof(c->text) - n, "%s ", type != NULL ? type : "?");
    json_decref(ev);
}

static const char *run(const char *const *frames, size_t n, bool end)
{
    static struct collected c;
    struct agw_agui *a = agw_agui_new("t1", "r1", AGW_PROTO_AGKIT);
    struct agw_agui_sink sink = {sink_emit, &c};

    c.text[0] = '\0';
    for (size_t i = 0; i < n; i++)
        agw_agui_feed(a, frames[i], strlen(frames[i]), &sink);
    if (end)
        agw_agui_end(a, &sink);
    agw_agui_free(a);
    return c.text;
}

Test(agkit, a_legacy_stream_becomes_one_ag_ui_run)
{
    const char *chat[] = {"{\"type\":\"text\",\"content\":\"Hello\"}",
                          "{\"type\":\"text\",\"content\":\" there!\"}"};
    const char *tool[] = {
        "{\"type\":\"tool-call-start\",\"toolCallId\":\"a\",\"toolCallName\":\"f\"}",
        "{\"type\":\"tool-call-args\",\"toolCallId\":\"a\",\"delta\":\"{}\"}",
        "{\"type\":\"tool-call-end\",\"toolCallId\":\"a\"}", "[DONE]"};
    const char *cut[] = {
        "{\"type\":\"tool-call-start\",\"toolCallId\":\"a\",\"toolCallName\":\"f\"}"};
    const char *bad[] = {"{\"type\":\"text\",\"content\":\"x\"}", "{oops"};

    cr_assert_str_eq(run(chat, 2, true),
                     "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT "
                     "TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED ",
                     "the end of the stream ends the message and the run");
    cr_assert_str_eq(run(tool, 4, false),
                     "RUN_STARTED TOOL_CALL_START TOOL_CALL_ARGS TOOL_CALL_END RUN_FINISHED ");
    cr_assert_str_eq(run(cut, 1, true), "RUN_STARTED TOOL_CALL_START TOOL_CALL_END RUN_ERROR ",
                     "a stream cut inside a tool call is an error");
    cr_assert_str_eq(run(bad, 2, true),
                     "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END "
                     "RUN_ERROR ",
                     "data that is not an event ends the run with INVALID_EVENT");
}

/* ---- legacy clients -------------------------------------------------------------------------- */

Test(agkit, legacy_thread)
{
    char out[16];

    cr_assert_eq(agw_agkit_legacy_thread("{\"conversationId\":\"c1\"}", 23, out, sizeof(out)), 1);
    cr_assert_str_eq(out, "c1");
    cr_assert_eq(agw_agkit_legacy_thread("{\"messages\":[]}", 15, out, sizeof(out)), 0);
    cr_assert_eq(agw_agkit_legacy_thread("{\"conversationId\":\"\"}", 21, out, sizeof(out)),
                 -AGW_EINVAL);
    cr_assert_eq(agw_agkit_legacy_thread("{\"conversationId\":7}", 20, out, sizeof(out)),
                 -AGW_EINVAL);
    cr_assert_eq(
        agw_agkit_legacy_thread("{\"conversationId\":\"0123456789abcdef\"}", 37, out, sizeof(out)),
        -AGW_EINVAL, "too long for the buffer");
    cr_assert_eq(agw_agkit_legacy_thread("[1]", 3, out, sizeof(out)), -AGW_EINVAL);
}

static json_t *to_input(const char *legacy, const char *history)
{
    char err[AGW_AGKIT_ERR_MAX];
    size_t len = 0;
    char *out =
        agw_agkit_legacy_to_input(legacy, strlen(legacy), "c1", "r2", history,
                                  history != NULL ? strlen(history) : 0, &len, err, sizeof(err));
    json_t *j;

    cr_assert_not_null(out, "%s", err);
    j = json_loads(out, 0, NULL);
    free(out);
    return j;
}

static void expect_input_error(const char *legacy, const char *want)
{
    char err[AGW_AGKIT_ERR_MAX];
    size_t len = 0;
    char *out = agw_agkit_legacy_to_input(legacy, strlen(legacy), "c1", "r2", NULL, 0, &len, err,
                                          sizeof(err));

    cr_assert_null(out, "accepted %s", legacy);
    cr_assert_str_eq(err, want);
}

Test(agkit, legacy_request_to_input)
{
    /* The thread's history (a newest-first page) comes first, oldest first, without its activity
     * messages (the client sends none); then the delta. */
    json_t *j = to_input(
        "{\"conversationId\":\"c1\",\"messages\":[{\"role\":\"tool\",\"content\":\"done\","
        "\"toolCallId\":\"a_b_c\"}],\"tools\":[{\"name\":\"f\",\"description\":\"d\","
        "\"parameters\":\"{\\\"type\\\":\\\"object\\\"}\"}],\"resume\":{\"interruptId\":\"i1\","
        "\"payload\":true}}",
        "{\"messages\":[{\"id\":\"a1\",\"role\":\"assistant\",\"toolCalls\":[]},{\"id\":\"p1\","
        "\"role\":\"activity\",\"activityType\":\"plan\",\"content\":{}},{\"id\":\"m1\","
        "\"role\":\"user\",\"content\":\"go\"}],\"has_more\":false}");

    expect_json(j, "{\"threadId\":\"c1\",\"runId\":\"r2\",\"messages\":[{\"id\":\"m1\",\"role\":"
                   "\"user\",\"content\":\"go\"},{\"id\":\"a1\",\"role\":\"assistant\","
                   "\"toolCalls\":[]},{\"id\":\"r2-in-1\",\"role\":\"tool\",\"content\":\"done\","
                   "\"toolCallId\":\"a_b_c\"}],\"tools\":[{\"name\":\"f\",\"description\":\"d\","
                   "\"parameters\":{\"type\":\"object\"}}],\"context\":[],\"state\":{},"
                   "\"forwardedProps\":{},\"resume\":[{\"interruptId\":\"i1\",\"payload\":true}]}");
    json_decref(j);
    j = to_input("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"name\":"
                 "\"g\"}]}",
                 NULL);
    expect_json(j, "{\"threadId\":\"c1\",\"runId\":\"r2\",\"messages\":[{\"id\":\"r2-in-1\","
                   "\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"name\":\"g\","
                   "\"description\":\"\",\"parameters\":{\"type\":\"object\"}}],\"context\":[],"
                   "\"state\":{},\"forwardedProps\":{}}");
    json_decref(j);

    expect_input_error("[]", "the body must be a JSON object");
    expect_input_error("{\"messages\":{}}", "messages must be an array");
    expect_input_error("{\"messages\":[1]}", "messages[0] must be an object");
    expect_input_error("{\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}",
                       "messages[0].role must be one of user, tool, system, developer, assistant");
    expect_input_error("{\"messages\":[{\"role\":\"user\",\"content\":[]}]}",
                       "messages[0].content must be a string");
    expect_input_error("{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
                       "messages[0].toolCallId is required for a tool message");
    expect_input_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}",
                       "tools must be an array");
    expect_input_error(
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"\"}]}",
        "tools[0].name must be a non-empty string");
    expect_input_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":"
                       "\"t\",\"parameters\":\"[1]\"}]}",
                       "tools[0].parameters must be a JSON Schema object as a string");
    expect_input_error("{\"messages\":[],\"resume\":{\"payload\":1}}",
                       "resume must be an object with a string interruptId");
    expect_input_error("{\"messages\":[]}", "messages must not be empty (or give resume)");
}

static const char *legacy_of(const char *json, int *rc)
{
    static struct collected c;

    c.text[0] = '\0';
    *rc = agw_agkit_to_legacy(json, strlen(json), collect, &c);
    return c.text;
}

Test(agkit, ag_ui_events_to_legacy)
{
    int rc;

    cr_assert_str_eq(
        legacy_of("{\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r\"}", &rc), "");
    cr_assert_str_eq(legacy_of("{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m\"}", &rc), "");
    cr_assert_str_eq(
        legacy_of("{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"Hi\"}", &rc),
        "{\"type\":\"text\",\"content\":\"Hi\"}\n");
    cr_assert_str_eq(legacy_of("{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m\"}", &rc), "");
    cr_assert_str_eq(
        legacy_of("{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"a\",\"toolCallName\":"
                  "\"f\",\"parentMessageId\":\"m\"}",
                  &rc),
        "{\"type\":\"tool-call-start\",\"toolCallId\":\"a\",\"toolCallName\":\"f\"}\n");
    cr_assert_str_eq(
        legacy_of("{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"a\",\"delta\":\"{}\"}", &rc),
        "{\"type\":\"tool-call-args\",\"toolCallId\":\"a\",\"delta\":\"{}\"}\n");
    cr_assert_str_eq(legacy_of("{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"a\"}", &rc),
                     "{\"type\":\"tool-call-end\",\"toolCallId\":\"a\"}\n");
    cr_assert_str_eq(legacy_of("{\"type\":\"TOOL_CALL_RESULT\",\"messageId\":\"t\",\"toolCallId\":"
                               "\"a\",\"content\":\"ok\",\"role\":\"tool\"}",
                               &rc),
                     "{\"type\":\"tool-result\",\"toolCallId\":\"a\",\"result\":\"ok\"}\n");
    cr_assert_str_eq(legacy_of("{\"type\":\"STATE_SNAPSHOT\",\"snapshot\":{}}", &rc), "");
    cr_assert_eq(rc, 0);
    cr_assert_str_eq(
        legacy_of("{\"type\":\"RUN_FINISHED\",\"threadId\":\"t\",\"runId\":\"r\"}", &rc),
        "[DONE]\n");
    cr_assert_eq(rc, 1);
    cr_assert_str_eq(legacy_of("{\"type\":\"RUN_FINISHED\",\"outcome\":{\"type\":\"interrupt\","
                               "\"interrupts\":[{\"id\":\"i1\",\"reason\":\"confirm\",\"payload\":"
                               "{\"n\":1}}]}}",
                               &rc),
                     "{\"type\":\"interrupt\",\"id\":\"i1\",\"reason\":\"confirm\",\"payload\":"
                     "{\"n\":1}}\n[DONE]\n");
    cr_assert_str_eq(legacy_of("{\"type\":\"RUN_ERROR\",\"message\":\"boom\",\"code\":\"X\"}", &rc),
                     "{\"type\":\"error\",\"code\":\"X\",\"message\":\"boom\"}\n");
    cr_assert_eq(rc, 1);
}
