/* Unit tests for src/input.c: RunAgentInput validation (doc/protocol.md#validation) and
 * classification (doc/protocol.md#decisions). */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agw/input.h"

#define DEPTH 64u

/* A valid envelope around <msgs> (a JSON array literal). */
#define WITH_MESSAGES(msgs) "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":" msgs "}"
/* A valid envelope with one user message plus extra top-level members <extra> (starting with a
 * comma). */
#define WITH_EXTRA(extra)                                                                          \
    "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}"     \
    "]" extra "}"

struct bad_case {
    const char *body;
    int status;
    const char *msg;
};

static int parse(const char *body, struct agw_input *in, char *err, size_t errlen)
{
    return agw_input_parse(body, strlen(body), DEPTH, in, err, errlen);
}

static void check_bad(const struct bad_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct agw_input in;
        char err[AGW_INPUT_ERR_MAX];
        int rc;

        memset(&in, 0x5a, sizeof(in)); /* garbage in: the parser must not read or free it */
        rc = parse(cases[i].body, &in, err, sizeof(err));
        cr_assert_eq(rc, cases[i].status, "case %zu (%s): status %d, want %d (%s)", i,
                     cases[i].body, rc, cases[i].status, err);
        cr_assert_str_eq(err, cases[i].msg, "case %zu (%s): got \"%s\"", i, cases[i].body, err);
        cr_assert_null(in.thread_id, "case %zu: left zeroed on error", i);
        cr_assert_null(in.run_id);
        cr_assert_not(in.has_user_input);
        cr_assert_not(in.has_decision);
        cr_assert_not(in.decision_only);
    }
}

static void check_ok(const char *const *bodies, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct agw_input in;
        char err[AGW_INPUT_ERR_MAX] = "";
        int rc = parse(bodies[i], &in, err, sizeof(err));
        cr_assert_eq(rc, 0, "case %zu (%s): %d %s", i, bodies[i], rc, err);
        agw_input_clear(&in);
    }
}

/* ---- Content-Type -------------------------------------------------------------------------------
 */

Test(input, content_type)
{
    static const struct {
        const char *ct;
        bool ok;
    } cases[] = {
        {"application/json", true},
        {"Application/JSON", true},
        {"APPLICATION/JSON", true},
        {"application/json; charset=utf-8", true},
        {"application/json;charset=UTF-8", true},
        {"application/json ; charset=utf-8", true},
        {"application/json\t;\tcharset=utf-8", true},
        {"application/json ", true},
        {" application/json", true},
        {"application/json;", true},
        {"application/jsonx", false},
        {"application/json-seq", false},
        {"application/json5", false},
        {"application/jso", false},
        {"text/json", false},
        {"application/x-www-form-urlencoded", false},
        {"text/plain", false},
        {"application/vnd.api+json", false},
        {"", false},
        {";", false},
        {NULL, false},
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++)
        cr_assert_eq(agw_input_content_type_ok(cases[i].ct), cases[i].ok, "case %zu: '%s'", i,
                     cases[i].ct ? cases[i].ct : "(null)");
}

/* ---- accepted bodies ----------------------------------------------------------------------------
 */

Test(input, seed_minimal_request)
{
    /* The minimal request: the ids, one user message and an empty tools list. */
    static const char body[] =
        "{\n  \"threadId\": \"thread-1\",\n  \"runId\": \"run-1\",\n"
        "  \"messages\": [{ \"role\": \"user\", \"content\": \"Plan my weekend\" "
        "}],\n  \"tools\": []\n}";
    struct agw_input in;
    char err[AGW_INPUT_ERR_MAX];

    cr_assert_eq(parse(body, &in, err, sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(in.thread_id, "thread-1");
    cr_assert_str_eq(in.run_id, "run-1");
    cr_assert(in.has_user_input);
    cr_assert_not(in.has_decision);
    cr_assert_not(in.decision_only);
    agw_input_clear(&in);
    cr_assert_null(in.thread_id);
    cr_assert_null(in.run_id);
}

Test(input, official_client_body_shape)
{
    /* What @ag-ui/client 1.0.0 HttpAgent sends, keys in its order. */
    static const char body[] =
        "{\"threadId\":\"5b0c3c1e-thread\",\"runId\":\"9f1c2f0a-7c53-4a57-9d3e-2b9f1f0c8e11\","
        "\"protocolVersion\":\"1.0\",\"state\":{},"
        "\"messages\":[{\"id\":\"m1\",\"role\":\"user\",\"content\":\"What's the weather?\"},"
        "{\"id\":\"m2\",\"role\":\"assistant\",\"content\":\"Let me "
        "check.\",\"toolCalls\":[{\"id\":"
        "\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
        "\"{\\\"location\\\":\\\"New York\\\"}\"}}]},"
        "{\"id\":\"result_1\",\"role\":\"tool\",\"content\":\"{\\\"temperature\\\":22}\","
        "\"toolCallId\":\"call_1\"}],"
        "\"tools\":[],\"context\":[],\"forwardedProps\":{}}";
    struct agw_input in;
    char err[AGW_INPUT_ERR_MAX];

    cr_assert_eq(parse(body, &in, err, sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(in.thread_id, "5b0c3c1e-thread");
    cr_assert_str_eq(in.run_id, "9f1c2f0a-7c53-4a57-9d3e-2b9f1f0c8e11");
    cr_assert(in.has_user_input);
    cr_assert(in.has_decision);
    cr_assert_not(in.decision_only);
    agw_input_clear(&in);
}

Test(input, accepted_shapes)
{
    static const char *const bodies[] = {
        /* messages may be empty */
        WITH_MESSAGES("[]"),
        /* every role */
        WITH_MESSAGES(
            "[{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"system\",\"content\":"
            "\"s\"},{\"role\":\"assistant\",\"content\":\"a\"},{\"role\":\"user\","
            "\"content\":\"u\"},{\"role\":\"tool\",\"toolCallId\":\"c\",\"content\":\"x\"},"
            "{\"role\":\"activity\",\"activityType\":\"p\",\"content\":{\"k\":1}},"
            "{\"role\":\"reasoning\",\"content\":\"r\"}]"),
        /* assistant content absent or null next to toolCalls */
        WITH_MESSAGES("[{\"role\":\"assistant\",\"toolCalls\":[]}]"),
        WITH_MESSAGES("[{\"role\":\"assistant\",\"content\":null,\"toolCalls\":[]}]"),
        /* other roles are lenient about content */
        WITH_MESSAGES("[{\"role\":\"system\"},{\"role\":\"developer\",\"content\":[]}]"),
        /* tool content is not checked */
        WITH_MESSAGES("[{\"role\":\"tool\",\"toolCallId\":\"c\"}]"),
        /* id: a string, or null (absent) */
        WITH_MESSAGES("[{\"id\":\"m1\",\"role\":\"user\",\"content\":\"x\"}]"),
        WITH_MESSAGES("[{\"id\":null,\"role\":\"user\",\"content\":\"x\"}]"),
        /* user content: blank strings and empty part arrays are valid (just not input) */
        WITH_MESSAGES("[{\"role\":\"user\",\"content\":\"\"}]"),
        WITH_MESSAGES("[{\"role\":\"user\",\"content\":[]}]"),
        WITH_MESSAGES("[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"},"
                      "{\"type\":\"binary\",\"mimeType\":\"image/png\",\"data\":\"AAAA\"}]}]"),
        /* tools */
        WITH_EXTRA(",\"tools\":[]"),
        WITH_EXTRA(",\"tools\":null"),
        WITH_EXTRA(",\"tools\":[{\"name\":\"f\"}]"),
        WITH_EXTRA(",\"tools\":[{\"name\":\"f\",\"description\":\"d\",\"parameters\":{\"type\":"
                   "\"object\",\"properties\":{}}}]"),
        WITH_EXTRA(
            ",\"tools\":[{\"name\":\"f\",\"parameters\":\"{\\\"type\\\":\\\"object\\\"}\"}]"),
        WITH_EXTRA(",\"tools\":[{\"name\":\"f\",\"parameters\":null}]"),
        WITH_EXTRA(",\"tools\":[{\"name\":\"f\",\"execute\":\"frontend\"},{\"name\":\"g\","
                   "\"execute\":\"backend\"},{\"name\":\"h\",\"execute\":null}]"),
        /* context */
        WITH_EXTRA(",\"context\":[]"),
        WITH_EXTRA(",\"context\":null"),
        WITH_EXTRA(",\"context\":[{\"description\":\"d\",\"value\":\"v\"}]"),
        /* passed through unchecked */
        WITH_EXTRA(",\"state\":{\"a\":[1,2]},\"parentRunId\":\"p\",\"parentThreadId\":7,\"model\":"
                   "\"m\",\"systemPrompt\":\"s\",\"config\":{\"x\":1},\"forwardedProps\":null,"
                   "\"resume\":[{\"interruptId\":\"i\",\"status\":\"resolved\"}],"
                   "\"protocolVersion\":\"1.0\",\"somethingNew\":[true]"),
        WITH_EXTRA(",\"state\":\"not an object\""),
        /* \u0000 is valid JSON and allowed outside the ids */
        WITH_MESSAGES("[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]"),
        /* non-ASCII ids, escaped */
        "{\"threadId\":\"th\\u00e9\",\"runId\":\"\xe2\x82\xac\",\"messages\":[]}",
        /* whitespace around the document */
        " \r\n\t" WITH_MESSAGES("[]") " \n",
    };
    check_ok(bodies, AGW_ARRAY_LEN(bodies));
}

Test(input, ids_are_copied)
{
    static const char body[] = "{\"runId\":\"r\\u00e9\",\"threadId\":\"a\\\"b\",\"messages\":[]}";
    struct agw_input in;
    char err[AGW_INPUT_ERR_MAX];

    cr_assert_eq(parse(body, &in, err, sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(in.thread_id, "a\"b");
    cr_assert_str_eq(in.run_id, "r\xc3\xa9");
    agw_input_clear(&in);
}

Test(input, body_not_nul_terminated)
{
    /* Only <len> bytes are read: the rest of the buffer would be trailing garbage. */
    static const char buf[] = WITH_MESSAGES("[]") "GARBAGE";
    size_t len = strlen(WITH_MESSAGES("[]"));
    char *copy = malloc(len);
    struct agw_input in;
    char err[AGW_INPUT_ERR_MAX];

    memcpy(copy, buf, len); /* no NUL anywhere: ASan catches a read past the end */
    cr_assert_eq(agw_input_parse(copy, len, DEPTH, &in, err, sizeof(err)), 0, "%s", err);
    agw_input_clear(&in);
    cr_assert_eq(agw_input_parse(buf, sizeof(buf) - 1, DEPTH, &in, err, sizeof(err)), 400);
    free(copy);
}

Test(input, clear_is_safe)
{
    struct agw_input in;

    memset(&in, 0, sizeof(in));
    agw_input_clear(&in);
    agw_input_clear(&in);
    agw_input_clear(NULL);
    cr_assert_null(in.thread_id);
}

/* ---- rejected bodies ----------------------------------------------------------------------------
 */

Test(input, not_json)
{
    static const struct bad_case cases[] = {
        {"", 400,
         "bad request: body is not valid JSON: unexpected token near end of file at line 1 "
         "column 0"},
        {"   ", 400,
         "bad request: body is not valid JSON: unexpected token near end of file at "
         "line 1 column 3"},
        {"{", 400,
         "bad request: body is not valid JSON: string or '}' expected near end of file at "
         "line 1 column 1"},
        /* two JSON documents */
        {"{} {}", 400,
         "bad request: body is not valid JSON: end of file expected at line 1 column 4"},
        {WITH_MESSAGES("[]") "\n" WITH_MESSAGES("[]"), 400,
         "bad request: body is not valid JSON: end of file expected at line 2 column 1"},
        /* trailing garbage */
        {WITH_MESSAGES("[]") "x", 400,
         "bad request: body is not valid JSON: end of file expected at line 1 column 43"},
        /* invalid UTF-8: a lone continuation byte, an overlong NUL, a UTF-16 surrogate */
        {"{\"threadId\":\"\xff\",\"runId\":\"r\",\"messages\":[]}", 400,
         "bad request: body is not valid JSON: unable to decode byte 0xff at line 1 column 13"},
        {"{\"threadId\":\"\xc0\x80\",\"runId\":\"r\",\"messages\":[]}", 400,
         "bad request: body is not valid JSON: unable to decode byte 0xc0 at line 1 column 13"},
        {"{\"threadId\":\"\xed\xa0\x80\",\"runId\":\"r\",\"messages\":[]}", 400,
         "bad request: body is not valid JSON: unable to decode byte 0xed at line 1 column 13"},
        /* a byte-order mark is not JSON */
        {"\xef\xbb\xbf{}", 400,
         "bad request: body is not valid JSON: invalid token at line 1 column 1"},
        /* the offending token is never quoted back (it could be a secret) */
        {"{\"threadId\":sk-live-SECRET}", 400,
         "bad request: body is not valid JSON: invalid token at line 1 column 14"},
        {"{'threadId':'t'}", 400,
         "bad request: body is not valid JSON: string or '}' expected at line 1 column 2"},
    };
    check_bad(cases, AGW_ARRAY_LEN(cases));
}

Test(input, not_an_object)
{
    static const struct bad_case cases[] = {
        {"[]", 400, "bad request: body must be a JSON object"},
        {"[{\"threadId\":\"t\"}]", 400, "bad request: body must be a JSON object"},
        {"\"threadId\"", 400, "bad request: body must be a JSON object"},
        {"42", 400, "bad request: body must be a JSON object"},
        {"null", 400, "bad request: body must be a JSON object"},
        {"true", 400, "bad request: body must be a JSON object"},
    };
    check_bad(cases, AGW_ARRAY_LEN(cases));
}

Test(input, thread_and_run_ids)
{
    static const struct bad_case cases[] = {
        /* empty ids: 400, not 422 (doc/protocol.md#validation) */
        {"{\"threadId\":\"\",\"runId\":\"run-1\",\"messages\":[]}", 400,
         "bad request: threadId cannot be empty"},
        {"{\"threadId\":\"thread-1\",\"runId\":\"\",\"messages\":[]}", 400,
         "bad request: runId cannot be empty"},
        {"{\"runId\":\"r\",\"messages\":[]}", 422, "threadId is required and must be a string"},
        {"{\"threadId\":null,\"runId\":\"r\",\"messages\":[]}", 422,
         "threadId is required and must be a string"},
        {"{\"threadId\":1,\"runId\":\"r\",\"messages\":[]}", 422,
         "threadId is required and must be a string"},
        {"{\"threadId\":[\"t\"],\"runId\":\"r\",\"messages\":[]}", 422,
         "threadId is required and must be a string"},
        {"{\"threadId\":\"t\",\"messages\":[]}", 422, "runId is required and must be a string"},
        {"{\"threadId\":\"t\",\"runId\":{},\"messages\":[]}", 422,
         "runId is required and must be a string"},
        {"{\"threadId\":\"t\",\"runId\":false,\"messages\":[]}", 422,
         "runId is required and must be a string"},
        /* keys are case-sensitive */
        {"{\"threadid\":\"t\",\"runId\":\"r\",\"messages\":[]}", 422,
         "threadId is required and must be a string"},
        {"{\"thread_id\":\"t\",\"run_id\":\"r\",\"messages\":[]}", 422,
         "threadId is required and must be a string"},
        /* a NUL would truncate the id once it is a C string */
        {"{\"threadId\":\"a\\u0000b\",\"runId\":\"r\",\"messages\":[]}", 422,
         "threadId must not contain NUL characters"},
        {"{\"threadId\":\"t\",\"runId\":\"\\u0000\",\"messages\":[]}", 422,
         "runId must not contain NUL characters"},
        /* order: threadId before runId before messages */
        {"{}", 422, "threadId is required and must be a string"},
        {"{\"threadId\":\"\",\"runId\":\"\"}", 400, "bad request: threadId cannot be empty"},
        {"{\"threadId\":\"t\",\"runId\":\"\"}", 400, "bad request: runId cannot be empty"},
        {"{\"threadId\":\"t\",\"runId\":\"\",\"messages\":5}", 400,
         "bad request: runId cannot be empty"},
    };
    check_bad(cases, AGW_ARRAY_LEN(cases));
}

Test(input, messages)
{
    static const struct bad_case cases[] = {
        {"{\"threadId\":\"t\",\"runId\":\"r\"}", 422, "messages is required and must be an array"},
        {WITH_MESSAGES("null"), 422, "messages is required and must be an array"},
        {WITH_MESSAGES("{}"), 422, "messages is required and must be an array"},
        {WITH_MESSAGES("\"hi\""), 422, "messages is required and must be an array"},
        {WITH_MESSAGES(
             "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"},"
             "\"c\"]"),
         422, "messages[2] must be an object"},
        {WITH_MESSAGES("[null]"), 422, "messages[0] must be an object"},
        {WITH_MESSAGES("[[]]"), 422, "messages[0] must be an object"},
        /* role */
        {WITH_MESSAGES("[{\"content\":\"x\"}]"), 422,
         "messages[0].role must be one of developer, system, assistant, user, tool, activity, "
         "reasoning"},
        {WITH_MESSAGES(
             "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"User\",\"content\":\"x\"}]"),
         422,
         "messages[1].role must be one of developer, system, assistant, user, tool, activity, "
         "reasoning"},
        {WITH_MESSAGES("[{\"role\":\"function\"}]"), 422,
         "messages[0].role must be one of developer, system, assistant, user, tool, activity, "
         "reasoning"},
        {WITH_MESSAGES("[{\"role\":\"\"}]"), 422,
         "messages[0].role must be one of developer, system, assistant, user, tool, activity, "
         "reasoning"},
        {WITH_MESSAGES("[{\"role\":\"user\\u0000\",\"content\":\"x\"}]"), 422,
         "messages[0].role must be one of developer, system, assistant, user, tool, activity, "
         "reasoning"},
        {WITH_MESSAGES("[{\"role\":5}]"), 422,
         "messages[0].role must be one of developer, system, assistant, user, tool, activity, "
         "reasoning"},
        {WITH_MESSAGES("[{\"role\":null}]"), 422,
         "messages[0].role must be one of developer, system, assistant, user, tool, activity, "
         "reasoning"},
        /* id */
        {WITH_MESSAGES("[{\"id\":1,\"role\":\"user\",\"content\":\"x\"}]"), 422,
         "messages[0].id must be a string"},
        {WITH_MESSAGES("[{\"id\":{},\"role\":\"assistant\"}]"), 422,
         "messages[0].id must be a string"},
        /* tool messages */
        {WITH_MESSAGES("[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\"},"
                       "{\"role\":\"tool\",\"content\":\"r\"}]"),
         422, "messages[2].toolCallId is required"},
        {WITH_MESSAGES("[{\"role\":\"tool\",\"toolCallId\":\"\"}]"), 422,
         "messages[0].toolCallId is required"},
        {WITH_MESSAGES("[{\"role\":\"tool\",\"toolCallId\":7}]"), 422,
         "messages[0].toolCallId is required"},
        {WITH_MESSAGES("[{\"role\":\"tool\",\"toolCallId\":null}]"), 422,
         "messages[0].toolCallId is required"},
        {WITH_MESSAGES("[{\"role\":\"tool\",\"tool_call_id\":\"c\"}]"), 422,
         "messages[0].toolCallId is required"},
        /* user content */
        {WITH_MESSAGES("[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\"}]"), 422,
         "messages[1].content must be a string or an array of input parts"},
        {WITH_MESSAGES("[{\"role\":\"user\",\"content\":null}]"), 422,
         "messages[0].content must be a string or an array of input parts"},
        {WITH_MESSAGES("[{\"role\":\"user\",\"content\":42}]"), 422,
         "messages[0].content must be a string or an array of input parts"},
        {WITH_MESSAGES("[{\"role\":\"user\",\"content\":{\"type\":\"text\",\"text\":\"x\"}}]"), 422,
         "messages[0].content must be a string or an array of input parts"},
        {WITH_MESSAGES(
             "[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":[{}]}]"),
         422, "messages[1].content[0].type is required"},
        {WITH_MESSAGES("[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                       "{\"type\":\"\"}]}]"),
         422, "messages[0].content[1].type is required"},
        {WITH_MESSAGES("[{\"role\":\"user\",\"content\":[{\"type\":3}]}]"), 422,
         "messages[0].content[0].type is required"},
        {WITH_MESSAGES("[{\"role\":\"user\",\"content\":[\"hello\"]}]"), 422,
         "messages[0].content[0] must be an object"},
        {WITH_MESSAGES("[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]"), 422,
         "messages[0].content[0].text must be a string"},
        {WITH_MESSAGES("[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":null}]}]"),
         422, "messages[0].content[0].text must be a string"},
        /* the first bad message is reported */
        {WITH_MESSAGES("[{\"role\":\"tool\"},{\"role\":\"x\"}]"), 422,
         "messages[0].toolCallId is required"},
    };
    check_bad(cases, AGW_ARRAY_LEN(cases));
}

Test(input, tools)
{
    static const struct bad_case cases[] = {
        {WITH_EXTRA(",\"tools\":{}"), 422, "tools must be an array"},
        {WITH_EXTRA(",\"tools\":\"f\""), 422, "tools must be an array"},
        {WITH_EXTRA(",\"tools\":[\"f\"]"), 422, "tools[0] must be an object"},
        {WITH_EXTRA(",\"tools\":[{}]"), 422, "tools[0].name is required"},
        {WITH_EXTRA(",\"tools\":[{\"name\":\"a\"},{\"name\":\"\"}]"), 422,
         "tools[1].name is required"},
        {WITH_EXTRA(",\"tools\":[{\"name\":1}]"), 422, "tools[0].name is required"},
        {WITH_EXTRA(",\"tools\":[{\"name\":\"f\",\"parameters\":5}]"), 422,
         "tools[0].parameters must be an object or a JSON-Schema string"},
        {WITH_EXTRA(",\"tools\":[{\"name\":\"f\",\"parameters\":[]}]"), 422,
         "tools[0].parameters must be an object or a JSON-Schema string"},
        {WITH_EXTRA(",\"tools\":[{\"name\":\"f\",\"parameters\":\"\"}]"), 422,
         "tools[0].parameters must be an object or a JSON-Schema string"},
        {WITH_EXTRA(",\"tools\":[{\"name\":\"f\",\"parameters\":\"not json\"}]"), 422,
         "tools[0].parameters must be an object or a JSON-Schema string"},
        {WITH_EXTRA(",\"tools\":[{\"name\":\"f\",\"parameters\":\"[1]\"}]"), 422,
         "tools[0].parameters must be an object or a JSON-Schema string"},
        {WITH_EXTRA(",\"tools\":[{\"name\":\"f\",\"parameters\":\"{} {}\"}]"), 422,
         "tools[0].parameters must be an object or a JSON-Schema string"},
        {WITH_EXTRA(",\"tools\":[{\"name\":\"f\",\"execute\":\"server\"}]"), 422,
         "tools[0].execute must be one of frontend, backend"},
        {WITH_EXTRA(",\"tools\":[{\"name\":\"f\",\"execute\":\"Frontend\"}]"), 422,
         "tools[0].execute must be one of frontend, backend"},
        {WITH_EXTRA(",\"tools\":[{\"name\":\"f\",\"execute\":true}]"), 422,
         "tools[0].execute must be one of frontend, backend"},
    };
    check_bad(cases, AGW_ARRAY_LEN(cases));
}

Test(input, context)
{
    static const struct bad_case cases[] = {
        {WITH_EXTRA(",\"context\":{}"), 422, "context must be an array"},
        {WITH_EXTRA(",\"context\":\"c\""), 422, "context must be an array"},
        {WITH_EXTRA(",\"context\":[{},1]"), 422, "context[1] must be an object"},
    };
    check_bad(cases, AGW_ARRAY_LEN(cases));
}

Test(input, validation_order)
{
    /* depth → JSON → object → threadId → runId → messages → tools → context, whatever the key
     * order. */
    static const struct bad_case cases[] = {
        {"{\"context\":1,\"tools\":1,\"messages\":1,\"runId\":\"\",\"threadId\":1}", 422,
         "threadId is required and must be a string"},
        {"{\"context\":1,\"tools\":1,\"messages\":1,\"runId\":\"\",\"threadId\":\"t\"}", 400,
         "bad request: runId cannot be empty"},
        {"{\"context\":1,\"tools\":1,\"messages\":1,\"runId\":\"r\",\"threadId\":\"t\"}", 422,
         "messages is required and must be an array"},
        {"{\"context\":1,\"tools\":1,\"messages\":[],\"runId\":\"r\",\"threadId\":\"t\"}", 422,
         "tools must be an array"},
        {"{\"context\":1,\"tools\":[],\"messages\":[],\"runId\":\"r\",\"threadId\":\"t\"}", 422,
         "context must be an array"},
        /* JSON errors win over everything after them, depth over JSON errors */
        {"{\"threadId\":\"\",\"runId\":\"r\",\"messages\":[]", 400,
         "bad request: body is not valid JSON: '}' expected near end of file at line 1 column 40"},
        {"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", 400,
         "bad request: JSON nested deeper than 64 levels"},
    };
    check_bad(cases, AGW_ARRAY_LEN(cases));
}

/* ---- depth limit --------------------------------------------------------------------------------
 */

/* A valid body whose "state" holds <levels> nested arrays: total depth is levels + 1. */
static char *nested_body(unsigned levels)
{
    static const char head[] = "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[],\"state\":";
    size_t n = sizeof(head) + 2 * (size_t)levels + 2;
    char *s = malloc(n);
    size_t k = 0;

    memcpy(s, head, sizeof(head) - 1);
    k = sizeof(head) - 1;
    for (unsigned i = 0; i < levels; i++)
        s[k++] = '[';
    for (unsigned i = 0; i < levels; i++)
        s[k++] = ']';
    s[k++] = '}';
    s[k] = '\0';
    return s;
}

Test(input, depth_boundary)
{
    char err[AGW_INPUT_ERR_MAX];
    struct agw_input in;
    char *ok = nested_body(63);
    char *deep = nested_body(64);

    cr_assert_eq(agw_input_parse(ok, strlen(ok), 64, &in, err, sizeof(err)), 0, "%s", err);
    agw_input_clear(&in);
    cr_assert_eq(agw_input_parse(deep, strlen(deep), 64, &in, err, sizeof(err)), 400);
    cr_assert_str_eq(err, "bad request: JSON nested deeper than 64 levels");
    /* the limit is the caller's */
    cr_assert_eq(agw_input_parse(deep, strlen(deep), 65, &in, err, sizeof(err)), 0, "%s", err);
    agw_input_clear(&in);
    cr_assert_eq(agw_input_parse(ok, strlen(ok), 10, &in, err, sizeof(err)), 400);
    cr_assert_str_eq(err, "bad request: JSON nested deeper than 10 levels");
    /* 0 means the default (64), never "unlimited" */
    cr_assert_eq(agw_input_parse(deep, strlen(deep), 0, &in, err, sizeof(err)), 400);
    cr_assert_str_eq(err, "bad request: JSON nested deeper than 64 levels");
    free(ok);
    free(deep);
}

Test(input, depth_counts_objects_and_ignores_strings)
{
    char err[AGW_INPUT_ERR_MAX];
    struct agw_input in;
    /* depth 3: {, messages [, message { */
    static const char three[] = WITH_MESSAGES("[{\"role\":\"user\",\"content\":\"hi\"}]");
    /* brackets in strings, including after an escaped quote and an escaped backslash, do not count
     */
    static const char strings[] =
        WITH_MESSAGES("[{\"role\":\"user\",\"content\":\"[[[[{{{{\\\"[[[[\\\\\"}]");
    /* mixed objects and arrays: depth 5 */
    static const char five[] =
        "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[],\"state\":{\"a\":"
        "[{\"b\":[]}]}}";

    cr_assert_eq(agw_input_parse(three, strlen(three), 3, &in, err, sizeof(err)), 0, "%s", err);
    agw_input_clear(&in);
    cr_assert_eq(agw_input_parse(three, strlen(three), 2, &in, err, sizeof(err)), 400);
    cr_assert_str_eq(err, "bad request: JSON nested deeper than 2 levels");
    cr_assert_eq(agw_input_parse(strings, strlen(strings), 3, &in, err, sizeof(err)), 0, "%s", err);
    cr_assert(in.has_user_input);
    agw_input_clear(&in);
    cr_assert_eq(agw_input_parse(five, strlen(five), 5, &in, err, sizeof(err)), 0, "%s", err);
    agw_input_clear(&in);
    cr_assert_eq(agw_input_parse(five, strlen(five), 4, &in, err, sizeof(err)), 400);
    cr_assert_str_eq(err, "bad request: JSON nested deeper than 4 levels");
}

Test(input, depth_huge_does_not_recurse)
{
    /* A megabyte of '[' is refused by the pre-scan, before jansson recurses into it. */
    size_t n = 1u << 20;
    char *s = malloc(n);
    char err[AGW_INPUT_ERR_MAX];
    struct agw_input in;

    memset(s, '[', n);
    cr_assert_eq(agw_input_parse(s, n, DEPTH, &in, err, sizeof(err)), 400);
    cr_assert_str_eq(err, "bad request: JSON nested deeper than 64 levels");
    free(s);
}

Test(input, depth_applies_to_schema_strings)
{
    char err[AGW_INPUT_ERR_MAX];
    struct agw_input in;
    /* the string "{\"a\":[[[...]]]}", depth 71, as a tool's legacy schema */
    char body[1024];
    char inner[300];
    int k = 0;

    k += snprintf(inner + k, sizeof(inner) - (size_t)k, "{\\\"a\\\":");
    for (int i = 0; i < 70; i++)
        inner[k++] = '[';
    for (int i = 0; i < 70; i++)
        inner[k++] = ']';
    inner[k++] = '}';
    inner[k] = '\0';
    snprintf(body, sizeof(body), WITH_EXTRA(",\"tools\":[{\"name\":\"f\",\"parameters\":\"%s\"}]"),
             inner);
    cr_assert_eq(agw_input_parse(body, strlen(body), DEPTH, &in, err, sizeof(err)), 422);
    cr_assert_str_eq(err, "tools[0].parameters must be an object or a JSON-Schema string");
}

/* ---- error buffer -------------------------------------------------------------------------------
 */

Test(input, small_error_buffer)
{
    char err[8];
    struct agw_input in;

    memset(err, 'x', sizeof(err));
    cr_assert_eq(parse("{\"threadId\":\"\"}", &in, err, sizeof(err)), 400);
    cr_assert_str_eq(err, "bad req");
    cr_assert_eq(parse("{\"threadId\":\"\"}", &in, NULL, 0), 400);
    cr_assert_eq(parse(WITH_MESSAGES("[]"), &in, NULL, 0), 0);
    agw_input_clear(&in);
}

Test(input, errors_never_echo_values)
{
    static const char *const bodies[] = {
        "{\"threadId\":SECRETTOKEN}",
        "{\"threadId\":\"\\qSECRET\"}",
        "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[{\"role\":\"SECRET\"}]}",
        "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[],\"tools\":[{\"name\":\"f\","
        "\"parameters\":\"SECRET\"}]}",
        "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[],\"tools\":[{\"name\":\"f\","
        "\"execute\":\"SECRET\"}]}",
        "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[],\"SECRET\":1,\"tools\":5}",
        "{\"SECRET\" 1}",
        "[\"SECRET\"]",
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(bodies); i++) {
        char err[AGW_INPUT_ERR_MAX];
        struct agw_input in;
        int rc = parse(bodies[i], &in, err, sizeof(err));
        cr_assert(rc == 400 || rc == 422, "case %zu: %d", i, rc);
        cr_assert_null(strstr(err, "SECRET"), "case %zu echoes: %s", i, err);
    }
}

/* ---- classification (doc/protocol.md#decisions) -------------------------------------------------
 */

Test(input, classification)
{
    static const struct {
        const char *messages;
        bool user, decision, decision_only;
    } cases[] = {
        {"[]", false, false, false},
        {"[{\"role\":\"user\",\"content\":\"hi\"}]", true, false, false},
        {"[{\"role\":\"user\",\"content\":\"\"}]", false, false, false},
        {"[{\"role\":\"user\",\"content\":\" \\t\\r\\n\\f\\u000b \"}]", false, false, false},
        {"[{\"role\":\"user\",\"content\":\"  x  \"}]", true, false, false},
        {"[{\"role\":\"user\",\"content\":[]}]", false, false, false},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"  \"}]}]", false, false,
         false},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"\"},{\"type\":\"text\","
         "\"text\":\"go\"}]}]",
         true, false, false},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"binary\",\"mimeType\":\"image/png\","
         "\"url\":\"https://x/y.png\"}]}]",
         true, false, false},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]", true, false,
         false},
        /* a decision: a tool message with a toolCallId, whatever its content */
        {"[{\"role\":\"tool\",\"toolCallId\":\"c1\",\"content\":\"ok\"}]", false, true, true},
        {"[{\"role\":\"tool\",\"toolCallId\":\"c1\",\"content\":\"\"}]", false, true, true},
        {"[{\"role\":\"tool\",\"toolCallId\":\"c1\"}]", false, true, true},
        {"[{\"role\":\"tool\",\"toolCallId\":\"c1\",\"content\":{\"approved\":true}}]", false, true,
         true},
        {"[{\"role\":\"tool\",\"toolCallId\":\"c1\",\"content\":null}]", false, true, true},
        /* the whole history is resent: earlier blank user turns do not make it a new input */
        {"[{\"role\":\"user\",\"content\":\"   \"},{\"role\":\"assistant\",\"toolCalls\":[{\"id\":"
         "\"c1\"}]},{\"role\":\"tool\",\"toolCallId\":\"c1\",\"content\":\"yes\"}]",
         false, true, true},
        /* user input and a decision: a new run, not decision-only */
        {"[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"tool\",\"toolCallId\":\"c1\","
         "\"content\":\"yes\"}]",
         true, true, false},
        {"[{\"role\":\"tool\",\"toolCallId\":\"c1\",\"content\":\"yes\"},{\"role\":\"user\","
         "\"content\":[{\"type\":\"text\",\"text\":\"and more\"}]}]",
         true, true, false},
        /* other roles never count as user input */
        {"[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"developer\",\"content\":\"d\"},"
         "{\"role\":\"assistant\",\"content\":\"a\"},{\"role\":\"reasoning\",\"content\":\"r\"},"
         "{\"role\":\"activity\",\"content\":{}}]",
         false, false, false},
        {"[{\"role\":\"assistant\",\"content\":\"a\"},{\"role\":\"tool\",\"toolCallId\":\"c\"}]",
         false, true, true},
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        char body[1024];
        char err[AGW_INPUT_ERR_MAX];
        struct agw_input in;

        snprintf(body, sizeof(body), "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":%s}",
                 cases[i].messages);
        cr_assert_eq(parse(body, &in, err, sizeof(err)), 0, "case %zu: %s", i, err);
        cr_assert_eq(in.has_user_input, cases[i].user, "case %zu: has_user_input", i);
        cr_assert_eq(in.has_decision, cases[i].decision, "case %zu: has_decision", i);
        cr_assert_eq(in.decision_only, cases[i].decision_only, "case %zu: decision_only", i);
        agw_input_clear(&in);
        /* the same from each reading alone: these bodies are the scanner's to read */
        cr_assert(agw_input_scan(body, strlen(body), &in), "case %zu: not read by the scanner", i);
        cr_assert_eq(in.has_user_input, cases[i].user, "case %zu: scanner: has_user_input", i);
        cr_assert_eq(in.has_decision, cases[i].decision, "case %zu: scanner: has_decision", i);
        agw_input_clear(&in);
        cr_assert_eq(agw_input_parse_jansson(body, strlen(body), DEPTH, &in, err, sizeof(err)), 0);
        cr_assert_eq(in.has_user_input, cases[i].user, "case %zu: jansson: has_user_input", i);
        cr_assert_eq(in.has_decision, cases[i].decision, "case %zu: jansson: has_decision", i);
        agw_input_clear(&in);
    }
}

/* The common body needs no tree (src/input.c, "the scanner's reading"): what the official client
 * and the benchmark send is read by the scanner, with the fields jansson's reading gives. */
Test(input, scanner_reads_common_bodies)
{
    static const char *const bodies[] = {
        "{\"threadId\":\"5b0c3c1e-thread\",\"runId\":\"9f1c2f0a\",\"protocolVersion\":\"1.0\","
        "\"state\":{},\"messages\":[{\"id\":\"m1\",\"role\":\"user\",\"content\":\"What's the\\n"
        "weather?\"},{\"id\":\"m2\",\"role\":\"assistant\",\"content\":\"Let me check.\","
        "\"toolCalls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
        "\"get_weather\",\"arguments\":\"{\\\"location\\\":\\\"New York\\\"}\"}}]},{\"id\":"
        "\"result_1\",\"role\":\"tool\",\"content\":\"22\",\"toolCallId\":\"call_1\"}],"
        "\"tools\":[{\"name\":\"f\",\"parameters\":{\"type\":\"object\"},\"execute\":"
        "\"frontend\"}],\"context\":[{\"description\":\"d\",\"value\":\"v\"}],"
        "\"forwardedProps\":{}}",
        /* bench/load.c's */
        "{\"threadId\":\"bench-thread-3-7\",\"runId\":\"bench-run-12\",\"state\":{},"
        "\"messages\":[{\"id\":\"m1\",\"role\":\"user\",\"content\":\"Hello\"}],"
        "\"tools\":[],\"context\":[],\"forwardedProps\":{}}",
        WITH_MESSAGES("[{\"role\":\"user\",\"content\":\"\\u00e9 \\ud83d\\ude00\"}]"),
        " \r\n\t" WITH_MESSAGES("[]") " \n",
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(bodies); i++) {
        struct agw_input a, b;
        char err[AGW_INPUT_ERR_MAX];

        cr_assert(agw_input_scan(bodies[i], strlen(bodies[i]), &a), "case %zu: not read", i);
        cr_assert_eq(
            agw_input_parse_jansson(bodies[i], strlen(bodies[i]), DEPTH, &b, err, sizeof(err)), 0,
            "case %zu: %s", i, err);
        cr_assert_str_eq(a.thread_id, b.thread_id, "case %zu", i);
        cr_assert_str_eq(a.run_id, b.run_id, "case %zu", i);
        cr_assert_eq(a.has_user_input, b.has_user_input, "case %zu", i);
        cr_assert_eq(a.has_decision, b.has_decision, "case %zu", i);
        cr_assert_eq(a.decision_only, b.decision_only, "case %zu", i);
        agw_input_clear(&a);
        agw_input_clear(&b);
    }
}

/* The scanner follows 33 levels (the body's object and 32 below it) and no more, so under a depth
 * limit of 33 or above the limit's own pass over the body is not needed (src/input.c). */
Test(input, scanner_depth_is_33_levels)
{
    struct agw_input in;
    char err[AGW_INPUT_ERR_MAX];

    for (unsigned levels = 33; levels <= 34; levels++) {
        char *body = nested_body(levels - 1); /* the body's object, then "state" and its arrays */
        cr_assert_eq(agw_input_scan(body, strlen(body), &in), levels == 33, "%u levels", levels);
        agw_input_clear(&in);
        /* a limit of exactly 33: the deeper body is refused whoever reads it */
        cr_assert_eq(agw_input_parse(body, strlen(body), 33, &in, err, sizeof(err)),
                     levels == 33 ? 0 : 400, "%u levels: %s", levels, err);
        agw_input_clear(&in);
        free(body);
    }
}

/* What the scanner does not judge goes to jansson's reading, whose answer stands: a reading of its
 * own there would give other ids (a duplicate key: jansson keeps the last; an escaped id), or
 * judge what only jansson checks (a schema string), or go past its limits. */
Test(input, scanner_leaves_the_rest_to_jansson)
{
    static const struct {
        const char *body;
        const char *thread_id;
    } cases[] = {
        {"{\"threadId\":\"a\",\"runId\":\"r\",\"messages\":[],\"threadId\":\"b\"}", "b"},
        {"{\"threadId\":\"th\\u00e9\",\"runId\":\"r\",\"messages\":[]}", "th\xc3\xa9"},
        {"{\"thread\\u0049d\":\"x\",\"runId\":\"r\",\"messages\":[]}", "x"},
        {WITH_MESSAGES("[{\"role\":\"us\\u0065r\",\"content\":\"hi\"}]"), "t"},
        {WITH_MESSAGES("[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]"), "t"},
        {WITH_EXTRA(",\"tools\":[{\"name\":\"f\",\"parameters\":\"{}\"}]"), "t"},
        {WITH_EXTRA(",\"state\":1234567890123456789"), "t"},
        {WITH_EXTRA(",\"state\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]"
                    "]]]]]]]]]]]]]"),
         "t"},
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        struct agw_input in;
        char err[AGW_INPUT_ERR_MAX];

        cr_assert_not(agw_input_scan(cases[i].body, strlen(cases[i].body), &in), "case %zu", i);
        cr_assert_null(in.thread_id, "case %zu: left zeroed", i);
        cr_assert_eq(parse(cases[i].body, &in, err, sizeof(err)), 0, "case %zu: %s", i, err);
        cr_assert_str_eq(in.thread_id, cases[i].thread_id, "case %zu", i);
        agw_input_clear(&in);
    }
}

/* The scanner's reading of the messages, kept for the thread history: each element's bytes and its
 * id's, when every id is a string written without an escape; none otherwise, nor from jansson's
 * reading. */
Test(input, messages_read_where_each_lies)
{
    static const char body[] =
        "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[ {\"role\":\"user\","
        "\"id\":\"u1\",\"content\":\"Hi\"} ,{\"id\":\"a-2\",\"role\":\"assistant\"}]}";
    static const char *const unread[] = {
        "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[{\"id\":\"u\\u0031\",\"role\":\"user\","
        "\"content\":\"Hi\"}]}",
        "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]"
        "}",
        "{\"threadId\":\"t\",\"runId\":\"r\",\"messages\":[{\"id\":null,\"role\":\"user\","
        "\"content\":\"Hi\"}]}",
        "{\"threadId\":\"t\\u0031\",\"runId\":\"r\",\"messages\":[{\"id\":\"u1\",\"role\":\"user\","
        "\"content\":\"Hi\"}]}",
    };
    struct agw_input in;
    const char *u1 = strstr(body, "{\"role\""), *a2 = strstr(body, "{\"id\":\"a-2\"");

    cr_assert_eq(parse(body, &in, NULL, 0), 0);
    cr_assert_not(in.messages_read, "not asked for");
    cr_assert_null(in.messages);
    agw_input_clear(&in);
    cr_assert_eq(agw_input_parse_keep(body, strlen(body), DEPTH, &in, NULL, 0), 0);
    cr_assert(in.messages_read);
    cr_assert_eq(in.n_messages, 2);
    cr_assert_eq(in.messages[0].off, (size_t)(u1 - body));
    cr_assert_eq(in.messages[0].len,
                 strlen("{\"role\":\"user\",\"id\":\"u1\",\"content\":\"Hi\"}"));
    cr_assert_eq(in.messages[0].id_off, (size_t)(strstr(body, "u1\"") - body));
    cr_assert_eq(in.messages[0].id_len, 2);
    cr_assert_eq(in.messages[1].off, (size_t)(a2 - body));
    cr_assert_eq(in.messages[1].len, strlen(a2) - 2);
    cr_assert_eq(in.messages[1].id_off, (size_t)(a2 + 7 - body));
    cr_assert_eq(in.messages[1].id_len, 3);
    agw_input_clear(&in);
    cr_assert_null(in.messages);
    for (size_t i = 0; i < sizeof(unread) / sizeof(unread[0]); i++) {
        cr_assert_eq(agw_input_parse_keep(unread[i], strlen(unread[i]), DEPTH, &in, NULL, 0), 0,
                     "case %zu", i);
        cr_assert_not(in.messages_read, "case %zu", i);
        cr_assert_null(in.messages, "case %zu", i);
        cr_assert_eq(in.n_messages, 0, "case %zu", i);
        agw_input_clear(&in);
    }
}
