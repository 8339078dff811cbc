/* Unit tests for src/capture.c: which events are kept, the coalescing of text and tool-call deltas
 * (and what breaks it), escapes concatenated raw, the scanner's reading of whitespace, extra and
 * nested members and escaped keys, malformed events kept as they are, take() mid-run, and the
 * property the store relies on: the kept lines rebuild the thread the events would have rebuilt.
 * Every event is fed from a heap buffer of exactly its length, so that the sanitized build catches
 * a read past it. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "agw/capture.h"
#include "agw/history.h"

/* <text> with every ' made a " (the events read better so), in a buffer of exactly its length. */
static char *dq(const char *text, size_t *len)
{
    size_t n = strlen(text);
    char *b = malloc(n > 0 ? n : 1);

    cr_assert_not_null(b);
    for (size_t i = 0; i < n; i++)
        b[i] = text[i] == '\'' ? '"' : text[i];
    *len = n;
    return b;
}

/* Feeds <len> bytes from a copy of exactly that size. */
static void feed_raw(struct agw_capture *c, const char *bytes, size_t len)
{
    char *b = malloc(len > 0 ? len : 1);

    cr_assert_not_null(b);
    memcpy(b, bytes, len);
    agw_capture_event(c, b, len);
    free(b);
}

static void feed(struct agw_capture *c, const char *text)
{
    size_t len;
    char *b = dq(text, &len);

    agw_capture_event(c, b, len);
    free(b);
}

/* What take() hands over, NUL-terminated ("" for nothing). */
static char *take_str(struct agw_capture *c)
{
    size_t len = 12345;
    char *lines = agw_capture_take(c, &len, NULL), *s;

    if (lines == NULL) {
        cr_assert_eq(len, 0);
        return calloc(1, 1);
    }
    cr_assert_gt(len, 0);
    cr_assert_eq(lines[len - 1], '\n', "JSON Lines end with a line break");
    s = malloc(len + 1);
    memcpy(s, lines, len);
    s[len] = '\0';
    free(lines);
    cr_assert_eq(agw_capture_size(c), 0, "empty after take");
    return s;
}

/* take() hands over <want> (with ' made "). */
static void expect_out(struct agw_capture *c, const char *want)
{
    size_t n;
    char *w = dq(want, &n), *got = take_str(c), *ws = malloc(n + 1);

    memcpy(ws, w, n);
    ws[n] = '\0';
    cr_assert_str_eq(got, ws);
    free(w);
    free(ws);
    free(got);
}

/* A line of what take() handed over, parsed: a coalesced event's line begins with the capture's
 * mark, which is not JSON; the JSON after it is. */
static json_t *load_line(const char *p, size_t n)
{
    json_t *v;

    if (n > 0 && p[0] == AGW_CAPTURE_MARK) {
        p++;
        n--;
    }
    v = json_loadb(p, n, 0, NULL);
    cr_assert_not_null(v, "%.*s", (int)n, p);
    return v;
}

/* Feeds each event of <events> to a new capture and expects <want>. */
static void expect_capture(const char *const *events, size_t n, const char *want)
{
    struct agw_capture *c = agw_capture_new();

    for (size_t i = 0; i < n; i++)
        feed(c, events[i]);
    expect_out(c, want);
    agw_capture_free(c);
}

#define EXPECT_CAPTURE(want, ...)                                                                  \
    do {                                                                                           \
        static const char *const evs_[] = {__VA_ARGS__};                                           \
        expect_capture(evs_, AGW_ARRAY_LEN(evs_), want);                                           \
    } while (0)

/* Each event is kept byte for byte, alone. */
static void expect_verbatim(const char *text)
{
    struct agw_capture *c = agw_capture_new();
    size_t n;
    char *b = dq(text, &n), *got, *want = malloc(n + 2);

    agw_capture_event(c, b, n);
    memcpy(want, b, n);
    want[n] = '\n';
    want[n + 1] = '\0';
    got = take_str(c);
    cr_assert_str_eq(got, want, "kept as it is: %s", want);
    free(b);
    free(want);
    free(got);
    agw_capture_free(c);
}

/* ---- which events are kept ------------------------------------------------------------------- */

Test(capture, keeps_the_types_history_reads_byte_for_byte)
{
    EXPECT_CAPTURE("{'type':'TEXT_MESSAGE_START','messageId':'m1','role':'assistant'}\n"
                   "{'type':'TEXT_MESSAGE_END','messageId':'m1','timestamp':1}\n"
                   "{'type':'TOOL_CALL_START','toolCallId':'t1','toolCallName':'f'}\n"
                   "{'type':'TOOL_CALL_END','toolCallId':'t1'}\n"
                   "{'type':'TOOL_CALL_RESULT','messageId':'r1','toolCallId':'t1','content':'ok'}\n"
                   "{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'u1','role':'user'}]}\n",
                   "{'type':'TEXT_MESSAGE_START','messageId':'m1','role':'assistant'}",
                   "{'type':'TEXT_MESSAGE_END','messageId':'m1','timestamp':1}",
                   "{'type':'TOOL_CALL_START','toolCallId':'t1','toolCallName':'f'}",
                   "{'type':'TOOL_CALL_END','toolCallId':'t1'}",
                   "{'type':'TOOL_CALL_RESULT','messageId':'r1','toolCallId':'t1','content':'ok'}",
                   "{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'u1','role':'user'}]}");
}

Test(capture, drops_every_other_type)
{
    EXPECT_CAPTURE(
        "{'type':'TEXT_MESSAGE_END','messageId':'m1'}\n",
        "{'type':'RUN_STARTED','threadId':'t','runId':'r'}",
        "{'type':'STEP_STARTED','stepName':'s'}", "{'type':'STEP_FINISHED','stepName':'s'}",
        "{'type':'STATE_SNAPSHOT','snapshot':{'a':1}}",
        "{'type':'STATE_DELTA','delta':[{'op':'add','path':'/a','value':1}]}",
        "{'type':'REASONING_START','messageId':'x'}", "{'type':'REASONING_END','messageId':'x'}",
        "{'type':'CUSTOM','name':'n','value':null}", "{'type':'RAW','event':{}}",
        "{'type':'SOMETHING_NEW'}", "{'type':'text_message_start','messageId':'m'}", "{'type':''}",
        "{'type':'TEXT_MESSAGE_END','messageId':'m1'}",
        "{'type':'RUN_FINISHED','threadId':'t','runId':'r'}",
        "{'type':'RUN_ERROR','message':'boom','code':'UPSTREAM_ERROR'}");
}

Test(capture, nothing_held_gives_null)
{
    struct agw_capture *c = agw_capture_new();
    size_t len = 99;

    cr_assert_null(agw_capture_take(c, &len, NULL));
    cr_assert_eq(len, 0);
    feed(c, "{'type':'RUN_STARTED','threadId':'t','runId':'r'}");
    cr_assert_eq(agw_capture_size(c), 0);
    cr_assert_null(agw_capture_take(c, &len, NULL));
    cr_assert_eq(len, 0);
    agw_capture_free(c);
    agw_capture_free(NULL);
}

/* ---- coalescing ------------------------------------------------------------------------------ */

Test(capture, text_deltas_of_one_message_become_one_event)
{
    EXPECT_CAPTURE("{'type':'TEXT_MESSAGE_START','messageId':'m1'}\n"
                   "\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'Hello, world'}\n"
                   "{'type':'TEXT_MESSAGE_END','messageId':'m1'}\n",
                   "{'type':'TEXT_MESSAGE_START','messageId':'m1'}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'Hel'}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'lo, '}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'world'}",
                   "{'type':'TEXT_MESSAGE_END','messageId':'m1'}");
}

Test(capture, tool_call_args_of_one_call_become_one_event)
{
    EXPECT_CAPTURE(
        "\x1e{'type':'TOOL_CALL_ARGS','toolCallId':'t1','delta':'{\\'city\\':\\'Paris\\'}'}\n"
        "{'type':'TOOL_CALL_END','toolCallId':'t1'}\n",
        "{'type':'TOOL_CALL_ARGS','toolCallId':'t1','delta':'{\\'ci'}",
        "{'type':'TOOL_CALL_ARGS','toolCallId':'t1','delta':'ty\\':'}",
        "{'type':'TOOL_CALL_ARGS','toolCallId':'t1','delta':'\\'Paris\\'}'}",
        "{'type':'TOOL_CALL_END','toolCallId':'t1'}");
}

Test(capture, interleaved_ids_break_coalescing)
{
    EXPECT_CAPTURE("\x1e{'type':'TOOL_CALL_ARGS','toolCallId':'t1','delta':'ab'}\n"
                   "\x1e{'type':'TOOL_CALL_ARGS','toolCallId':'t2','delta':'c'}\n"
                   "\x1e{'type':'TOOL_CALL_ARGS','toolCallId':'t1','delta':'d'}\n"
                   "\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'t1','delta':'e'}\n"
                   "\x1e{'type':'TOOL_CALL_ARGS','toolCallId':'t1','delta':'f'}\n",
                   "{'type':'TOOL_CALL_ARGS','toolCallId':'t1','delta':'a'}",
                   "{'type':'TOOL_CALL_ARGS','toolCallId':'t1','delta':'b'}",
                   "{'type':'TOOL_CALL_ARGS','toolCallId':'t2','delta':'c'}",
                   "{'type':'TOOL_CALL_ARGS','toolCallId':'t1','delta':'d'}",
                   /* the same id, another kind */
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'t1','delta':'e'}",
                   "{'type':'TOOL_CALL_ARGS','toolCallId':'t1','delta':'f'}");
}

Test(capture, a_kept_event_in_between_breaks_coalescing_a_dropped_one_does_not)
{
    EXPECT_CAPTURE("\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'ab'}\n"
                   "{'type':'TOOL_CALL_START','toolCallId':'t1','toolCallName':'f'}\n"
                   "\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'cd'}\n",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'a'}",
                   "{'type':'STATE_DELTA','delta':[]}", "{'type':'CUSTOM','name':'x'}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'b'}",
                   "{'type':'TOOL_CALL_START','toolCallId':'t1','toolCallName':'f'}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'c'}",
                   "{'type':'REASONING_END','messageId':'m1'}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'d'}");
}

Test(capture, reasoning_messages_are_kept_and_their_deltas_coalesced_as_a_texts)
{
    /* a reasoning message's deltas append to the content of the message of their id, as a text's
     * do: one coalesced line, whichever kind of content event came */
    EXPECT_CAPTURE("{'type':'REASONING_MESSAGE_START','messageId':'r1','role':'reasoning'}\n"
                   "\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'r1','delta':'abc'}\n"
                   "{'type':'REASONING_MESSAGE_END','messageId':'r1'}\n"
                   "{'type':'REASONING_ENCRYPTED_VALUE','subtype':'message','entityId':'r1',"
                   "'encryptedValue':'e'}\n"
                   "\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'r1','delta':'d'}\n",
                   "{'type':'REASONING_START','messageId':'s'}",
                   "{'type':'REASONING_MESSAGE_START','messageId':'r1','role':'reasoning'}",
                   "{'type':'REASONING_MESSAGE_CONTENT','messageId':'r1','delta':'a'}",
                   "{'type':'REASONING_MESSAGE_CONTENT','messageId':'r1','delta':'b','x':1}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'r1','delta':'c'}",
                   "{'type':'REASONING_MESSAGE_END','messageId':'r1'}",
                   "{'type':'REASONING_ENCRYPTED_VALUE','subtype':'message','entityId':'r1',"
                   "'encryptedValue':'e'}",
                   "{'type':'REASONING_MESSAGE_CONTENT','messageId':'r1','delta':'d'}",
                   "{'type':'REASONING_END','messageId':'s'}");
}

Test(capture, ids_are_compared_by_their_bytes)
{
    /* "m\u0031" is "m1" once decoded: not coalesced, which is harmless (two events) */
    EXPECT_CAPTURE("\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'a'}\n"
                   "\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m\\u0031','delta':'bc'}\n"
                   "\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'d'}\n",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'a'}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m\\u0031','delta':'b'}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m\\u0031','delta':'c'}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'d'}");
}

/* The open event's id is compared from a copy in the capture when it is short, from the buffer
 * when it is not: ids of 38 and 39 characters (the copy holds 40 bytes, quotes included) that
 * differ only in their last character, or only in their first, each end the open event; the same
 * id given again, from another buffer, continues it. Ids of every shorter length too, and each
 * event given either way (a content event given by its tokens, with the open event's id, takes
 * agw_capture_content()'s fast path, which compares ids word by word). */
Test(capture, ids_at_the_length_of_the_kept_copy_are_compared_whole)
{
    for (size_t k = 2; k <= 2 * 41 + 1; k++) {
        const size_t n = k / 2, parity = k % 2;
        struct agw_capture *c = agw_capture_new();
        char id[64], other_last[64], other_first[64], want[4096];
        size_t w = 0;

        memset(id, 'a', n);
        id[n] = '\0';
        memcpy(other_last, id, n + 1);
        other_last[n - 1] = 'b';
        memcpy(other_first, id, n + 1);
        other_first[0] = 'b';
        const char *seq[] = {id, id, other_last, other_last, id, other_first, id, id};
        const char *last = NULL;
        for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
            char ev[256];
            int len = snprintf(ev, sizeof(ev),
                               "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"%s\","
                               "\"delta\":\"%zu\"}",
                               seq[i], i);
            char tok[70];
            int tl = snprintf(tok, sizeof(tok), "\"%s\"", seq[i]);
            char d[8];
            int dl = snprintf(d, sizeof(d), "\"%zu\"", i);

            if ((i + parity) % 2 == 0)
                feed_raw(c, ev, (size_t)len);
            else
                agw_capture_content(c, false, tok, (size_t)tl, d, (size_t)dl);
            if (last == NULL || strcmp(last, seq[i]) != 0) {
                if (last != NULL)
                    w += (size_t)snprintf(want + w, sizeof(want) - w, "\"}\n");
                w += (size_t)snprintf(want + w, sizeof(want) - w,
                                      "\x1e{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"%s\","
                                      "\"delta\":\"",
                                      seq[i]);
            }
            w += (size_t)snprintf(want + w, sizeof(want) - w, "%zu", i);
            last = seq[i];
        }
        snprintf(want + w, sizeof(want) - w, "\"}\n");
        char *got = take_str(c);
        cr_assert_str_eq(got, want, "ids of %zu characters (parity %zu)", n, parity);
        free(got);
        agw_capture_free(c);
    }
}

/* agw_capture_keeps_typed() says of each type what the capture does with an event of it: a capture
 * given an event of a type it does not keep holds nothing (a RUN_STARTED without an input among
 * them). */
Test(capture, keeps_type_says_what_a_capture_does)
{
    static const char *const kept[] = {
        "TEXT_MESSAGE_START",        "TEXT_MESSAGE_CONTENT",  "TEXT_MESSAGE_END",
        "TOOL_CALL_START",           "TOOL_CALL_ARGS",        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",          "MESSAGES_SNAPSHOT",     "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT", "REASONING_MESSAGE_END", "REASONING_ENCRYPTED_VALUE",
        "ACTIVITY_SNAPSHOT",         "ACTIVITY_DELTA",
    };
    static const char run_input[] = "{\"type\":\"RUN_STARTED\",\"input\":{\"messages\":[]}}";
    static const char *const dropped[] = {
        "RUN_STARTED",
        "RUN_FINISHED",
        "RUN_ERROR",
        "STEP_STARTED",
        "STATE_DELTA",
        "STATE_SNAPSHOT",
        "CUSTOM",
        "RAW",
        "TEXT_MESSAGE",
        "TEXT_MESSAGE_ENDS",
        "text_message_start",
        "REASONING_START",
        "REASONING_END",
        /* (the normaliser writes the events a chunk stands for: none comes) */
        "TEXT_MESSAGE_CHUNK",
        "TOOL_CALL_CHUNK",
        "REASONING_MESSAGE_CHUNK",
    };

    for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++)
        cr_assert(agw_capture_keeps_typed(kept[i], strlen(kept[i]), "{}", 2), "%s", kept[i]);
    cr_assert(agw_capture_keeps_typed("RUN_STARTED", 11, run_input, sizeof(run_input) - 1));
    for (size_t i = 0; i < sizeof(dropped) / sizeof(dropped[0]); i++) {
        struct agw_capture *c = agw_capture_new();
        char ev[160];
        int n = snprintf(ev, sizeof(ev), "{\"type\":\"%s\",\"messageId\":\"m\",\"delta\":\"x\"}",
                         dropped[i]);

        cr_assert_not(agw_capture_keeps_typed(dropped[i], strlen(dropped[i]), ev, (size_t)n), "%s",
                      dropped[i]);
        agw_capture_typed(c, dropped[i], strlen(dropped[i]), ev, (size_t)n);
        cr_assert_eq(agw_capture_size(c), 0, "%s kept", dropped[i]);
        agw_capture_free(c);
    }
}

Test(capture, empty_deltas_coalesce_too)
{
    EXPECT_CAPTURE("\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':''}\n"
                   "{'type':'TEXT_MESSAGE_END','messageId':'m1'}\n"
                   "\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x'}\n",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':''}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':''}",
                   "{'type':'TEXT_MESSAGE_END','messageId':'m1'}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':''}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x'}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':''}");
}

Test(capture, take_closes_the_open_event_and_the_capture_goes_on)
{
    struct agw_capture *c = agw_capture_new();
    static const char open_text[] = "\x1e{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\","
                                    "\"delta\":\"ab";

    feed(c, "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'a'}");
    feed(c, "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'b'}");
    cr_assert_eq(agw_capture_size(c), strlen(open_text), "the open event, without its end");
    expect_out(c, "\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'ab'}\n");
    feed(c, "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'c'}");
    feed(c, "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'d'}");
    feed(c, "{'type':'TEXT_MESSAGE_END','messageId':'m1'}");
    expect_out(c, "\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'cd'}\n"
                  "{'type':'TEXT_MESSAGE_END','messageId':'m1'}\n");
    expect_out(c, "");
    agw_capture_free(c);
}

Test(capture, lines_left_in_place_then_cleared_keep_the_buffer)
{
    struct agw_capture *c = agw_capture_new();
    static const char want[] = "\x1e{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\","
                               "\"delta\":\"ab\"}\n";
    const char *lines, *again;
    size_t len = 12345;

    cr_assert_null(agw_capture_lines(c, &len), "nothing held: no lines");
    cr_assert_eq(len, 0);
    feed(c, "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'a'}");
    feed(c, "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'b'}");
    lines = agw_capture_lines(c, &len);
    cr_assert_not_null(lines);
    cr_assert_eq(len, strlen(want), "the open event closed, as take() closes it");
    cr_assert(memcmp(lines, want, len) == 0);
    cr_assert_not(agw_capture_in_chunk(c));
    agw_capture_clear(c);
    cr_assert_eq(agw_capture_size(c), 0);
    /* the next delta starts a new event, in the same buffer */
    feed(c, "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'c'}");
    again = agw_capture_lines(c, &len);
    cr_assert_eq(again, lines, "the buffer is kept");
    expect_out(c, "\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'c'}\n");
    agw_capture_free(c);
}

Test(capture, grows_past_its_first_buffer)
{
    struct agw_capture *c = agw_capture_new();
    char *lines, *want;
    size_t len, n = 0;
    json_t *v;

    for (int i = 0; i < 5000; i++) {
        feed(c, "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'0123456789'}");
        if (i % 1000 == 999)
            feed(c, "{'type':'TEXT_MESSAGE_START','messageId':'m2'}");
    }
    lines = agw_capture_take(c, &len, NULL);
    cr_assert_not_null(lines);
    /* five coalesced events of 10,000 bytes of text, each followed by a start */
    want = malloc(10001);
    for (int i = 0; i < 1000; i++)
        memcpy(want + 10 * i, "0123456789", 10);
    want[10000] = '\0';
    for (const char *p = lines; p < lines + len; n++) {
        const char *nl = memchr(p, '\n', (size_t)(lines + len - p));
        cr_assert_not_null(nl);
        v = load_line(p, (size_t)(nl - p));
        if (n % 2 == 0)
            cr_assert_str_eq(json_string_value(json_object_get(v, "delta")), want);
        else
            cr_assert_str_eq(json_string_value(json_object_get(v, "type")), "TEXT_MESSAGE_START");
        json_decref(v);
        p = nl + 1;
    }
    cr_assert_eq(n, 10);
    free(want);
    free(lines);
    agw_capture_free(c);
}

/* ---- escapes --------------------------------------------------------------------------------- */

/* The coalesced delta of <deltas> (JSON string bodies, with ' made ") parses, as JSON, to the
 * decoded deltas concatenated. */
static void expect_concatenation(const char *const *deltas, size_t n)
{
    struct agw_capture *c = agw_capture_new();
    json_t *want_s, *got;
    char *lines, *want = NULL;
    size_t len, want_len = 0;

    for (size_t i = 0; i < n; i++) {
        char text[512];
        json_t *e;
        json_error_t err;
        size_t tl;
        char *t;

        snprintf(text, sizeof(text),
                 "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'%s'}", deltas[i]);
        t = dq(text, &tl);
        e = json_loadb(t, tl, 0, &err);
        cr_assert_not_null(e, "the test's event: %s", err.text);
        want = realloc(want, want_len + json_string_length(json_object_get(e, "delta")) + 1);
        memcpy(want + want_len, json_string_value(json_object_get(e, "delta")),
               json_string_length(json_object_get(e, "delta")));
        want_len += json_string_length(json_object_get(e, "delta"));
        json_decref(e);
        agw_capture_event(c, t, tl);
        free(t);
    }
    lines = agw_capture_take(c, &len, NULL);
    cr_assert_not_null(lines);
    cr_assert_eq(memchr(lines, '\n', len), lines + len - 1, "one line");
    got = load_line(lines, len - 1);
    want_s = json_stringn(want, want_len);
    cr_assert(json_equal(json_object_get(got, "delta"), want_s), "%.*s", (int)len, lines);
    cr_assert_eq(json_object_size(got), 3);
    json_decref(got);
    json_decref(want_s);
    free(want);
    free(lines);
    agw_capture_free(c);
}

/* A pool of chunks for agw_capture_use_chunks(): counts what it gave. */
struct pool {
    int given;
};

static char *give_chunk(void *arg)
{
    struct pool *p = arg;
    char *c = malloc(AGW_CAPTURE_CHUNK_BYTES);

    cr_assert_not_null(c);
    memset(c, 'X', AGW_CAPTURE_CHUNK_BYTES); /* what a reused chunk holds: someone else's bytes */
    p->given++;
    return c;
}

/* Everything take() hands over, with whether it was a chunk. */
static char *take_all(struct agw_capture *c, bool *chunk, size_t *len)
{
    char *lines = agw_capture_take(c, len, chunk);

    cr_assert_not_null(lines);
    return lines;
}

Test(capture, a_long_run_moves_to_chunks_and_stays_on_them)
{
    struct pool p = {0};
    struct agw_capture *plain = agw_capture_new(), *c = agw_capture_new();
    char *a, *b;
    size_t alen, blen;
    bool chunk;
    char ev[256];

    agw_capture_use_chunks(c, give_chunk, &p);
    /* small: no chunk */
    feed(c, "{'type':'TEXT_MESSAGE_START','messageId':'m1'}");
    feed(plain, "{'type':'TEXT_MESSAGE_START','messageId':'m1'}");
    cr_assert_eq(p.given, 0);
    a = take_all(c, &chunk, &alen);
    cr_assert_not(chunk, "a small run's buffer is no chunk");
    free(a);
    free(take_all(plain, &chunk, &alen));
    /* past AGW_CAPTURE_SMALL_BYTES: one chunk, holding what was there, and still one after */
    for (int i = 0; i < 2000; i++) {
        snprintf(ev, sizeof(ev), "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'%04d'}",
                 i);
        feed(c, ev);
        feed(plain, ev);
        if (i % 500 == 0) { /* kept events between the deltas */
            feed(c, "{'type':'TOOL_CALL_END','toolCallId':'t1'}");
            feed(plain, "{'type':'TOOL_CALL_END','toolCallId':'t1'}");
        }
    }
    cr_assert_eq(p.given, 1, "moved to a chunk once");
    a = take_all(c, &chunk, &alen);
    cr_assert(chunk);
    b = take_all(plain, &chunk, &blen);
    cr_assert_not(chunk);
    cr_assert_eq(alen, blen);
    cr_assert_eq(memcmp(a, b, alen), 0, "a chunk holds what a grown buffer holds");
    free(a);
    free(b);
    /* after a chunk, the next buffer is a chunk from the first byte */
    feed(c, "{'type':'TEXT_MESSAGE_END','messageId':'m1'}");
    cr_assert_eq(p.given, 2);
    a = take_all(c, &chunk, &alen);
    cr_assert(chunk);
    cr_assert_eq(alen, strlen("{'type':'TEXT_MESSAGE_END','messageId':'m1'}\n"));
    free(a);
    /* an event bigger than a chunk outgrows it: no chunk any more */
    {
        size_t n = AGW_CAPTURE_CHUNK_BYTES + 100;
        char *big = malloc(n + 64);
        size_t k = (size_t)snprintf(big, 64, "{\"type\":\"TOOL_CALL_RESULT\",\"content\":\"");
        memset(big + k, 'z', n - k - 2);
        memcpy(big + n - 2, "\"}", 2);
        feed_raw(c, big, n);
        a = take_all(c, &chunk, &alen);
        cr_assert_not(chunk, "an outgrown chunk is no chunk");
        cr_assert_eq(alen, n + 1);
        cr_assert_eq(memcmp(a, big, n), 0);
        free(a);
        free(big);
    }
    agw_capture_free(c);
    agw_capture_free(plain);
}

/* A content event given by its tokens (agw_capture_content()) is kept as agw_capture_event() keeps
 * the event: coalesced with its neighbours of the same id either way. */
Test(capture, content_given_by_its_tokens_is_the_event)
{
    static const struct {
        bool args;
        const char *event, *id, *delta;
    } evs[] = {
        {false, "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'He'}", "'m1'", "'He'"},
        {false, "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'llo \\\\u00e9'}", "'m1'",
         "'llo \\\\u00e9'"},
        {true, "{'type':'TOOL_CALL_ARGS','toolCallId':'c1','delta':'{\\'a'}", "'c1'", "'{\\'a'"},
        {true, "{'type':'TOOL_CALL_ARGS','toolCallId':'c1','delta':''}", "'c1'", "''"},
        {false, "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m2','delta':'x'}", "'m2'", "'x'"},
    };
    struct agw_capture *a = agw_capture_new(), *b = agw_capture_new();
    char *x, *y;

    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++) {
        size_t il, dl;
        char *id = dq(evs[i].id, &il), *delta = dq(evs[i].delta, &dl);
        feed(a, evs[i].event);
        agw_capture_content(b, evs[i].args, id, il, delta, dl);
        if (i == 2) { /* a kept event in between, on both */
            feed(a, "{'type':'TOOL_CALL_START','toolCallId':'c1','toolCallName':'f'}");
            feed(b, "{'type':'TOOL_CALL_START','toolCallId':'c1','toolCallName':'f'}");
        }
        free(id);
        free(delta);
    }
    x = take_str(a);
    y = take_str(b);
    cr_assert_str_eq(y, x);
    free(x);
    free(y);
    agw_capture_free(a);
    agw_capture_free(b);
}

/* An event given with its type (agw_capture_typed(): a type the normaliser read) is kept or dropped
 * as agw_capture_event() does after its own scan: kept types byte for byte, dropped ones leaving a
 * run of deltas open, content events scanned for their id and delta. */
Test(capture, an_event_given_with_its_type_is_the_event)
{
    static const struct {
        const char *type, *event;
    } evs[] = {
        {"RUN_STARTED", "{'type':'RUN_STARTED','threadId':'t','runId':'r'}"},
        {"TEXT_MESSAGE_START", "{'type':'TEXT_MESSAGE_START','messageId':'m1','role':'assistant'}"},
        {"TEXT_MESSAGE_CONTENT", "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'He'}"},
        {"STEP_STARTED", "{'stepName':'s','type':'STEP_STARTED'}"},
        {"TEXT_MESSAGE_CONTENT", "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'llo'}"},
        {"TEXT_MESSAGE_END", "{'messageId':'m1','type':'TEXT_MESSAGE_END','timestamp':12}"},
        {"TOOL_CALL_START", "{'type':'TOOL_CALL_START','toolCallId':'c1','toolCallName':'f'}"},
        {"TOOL_CALL_ARGS", "{'type':'TOOL_CALL_ARGS','toolCallId':'c1','delta':'{}'}"},
        {"TOOL_CALL_END", "{'type':'TOOL_CALL_END','toolCallId':'c1'}"},
        {"CUSTOM", "{'type':'CUSTOM','name':'n','value':true}"},
        {"RUN_FINISHED", "{'type':'RUN_FINISHED','threadId':'t','runId':'r'}"},
    };
    struct agw_capture *a = agw_capture_new(), *b = agw_capture_new();
    char *x, *y;

    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++) {
        size_t len, tl;
        char *ev = dq(evs[i].event, &len), *type = dq(evs[i].type, &tl);
        agw_capture_event(a, ev, len);
        agw_capture_typed(b, type, tl, ev, len);
        free(ev);
        free(type);
    }
    x = take_str(a);
    y = take_str(b);
    cr_assert_str_eq(y, x);
    cr_assert_str_eq(
        y, "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"m1\",\"role\":\"assistant\"}\n"
           "\x1e{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\",\"delta\":\"Hello\"}\n"
           "{\"messageId\":\"m1\",\"type\":\"TEXT_MESSAGE_END\",\"timestamp\":12}\n"
           "{\"type\":\"TOOL_CALL_START\",\"toolCallId\":\"c1\",\"toolCallName\":\"f\"}\n"
           "\x1e{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\"c1\",\"delta\":\"{}\"}\n"
           "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"c1\"}\n");
    free(x);
    free(y);
    agw_capture_free(a);
    agw_capture_free(b);
}

Test(capture, escaped_deltas_concatenate_to_the_concatenated_text)
{
    static const char *const a[] = {"say \\'hi\\'", "\\\\", "\\n", "x\\\\\\'", "\\'\\\\y"};
    static const char *const b[] = {"caf\\u00e9 ", "\\ud83d\\ude00", "\\u00e9\\u00E9",
                                    "\\/\\b\\f\\r\\t"};
    static const char *const c[] = {"\xc3\xa9", "\xf0\x9f\x98\x80", "\xe2\x82\xac", "plain"};
    static const char *const d[] = {"", "\\\\", "", "u0041", "\\\\u0041"};

    expect_concatenation(a, AGW_ARRAY_LEN(a));
    expect_concatenation(b, AGW_ARRAY_LEN(b));
    expect_concatenation(c, AGW_ARRAY_LEN(c));
    expect_concatenation(d, AGW_ARRAY_LEN(d));
}

/* ---- the scanner ----------------------------------------------------------------------------- */

Test(capture, whitespace_between_tokens)
{
    EXPECT_CAPTURE("\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'abc'}\n"
                   "{ 'type' : 'TEXT_MESSAGE_END' , 'messageId' : 'm1' }\n",
                   " {'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'a'}",
                   "{ 'type' : 'TEXT_MESSAGE_CONTENT' , 'messageId' :'m1','delta': 'b' } ",
                   "\t{\t'delta'\t:\t'c'\t,\t'messageId':'m1','type':'TEXT_MESSAGE_CONTENT'}\t",
                   "{ 'type' : 'TEXT_MESSAGE_END' , 'messageId' : 'm1' }");
}

Test(capture, extra_members_of_content_events_are_left_out)
{
    EXPECT_CAPTURE(
        "\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'ab'}\n",
        "{'type':'TEXT_MESSAGE_CONTENT','timestamp':1700000000000,'messageId':'m1','delta':'a'}",
        "{'rawEvent':{'a':[1,2.5,-3e+2,true,false,null,'x']},'type':'TEXT_MESSAGE_CONTENT',"
        "'messageId':'m1','delta':'b','toolCallId':7}");
}

Test(capture, nested_keys_are_not_the_events_own)
{
    EXPECT_CAPTURE(
        "\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'ab'}\n"
        "{'value':['type','TEXT_MESSAGE_START'],'type':'TOOL_CALL_END','toolCallId':'t'}\n",
        "{'type':'TEXT_MESSAGE_CONTENT','rawEvent':{'type':'RUN_STARTED','delta':5,"
        "'messageId':'x','nested':{'delta':'no'}},'messageId':'m1','delta':'a'}",
        "{'type':'CUSTOM','value':{'type':'TEXT_MESSAGE_START','messageId':'m1'}}",
        "{'type':'CUSTOM','name':'x\\',\\'type\\':\\'TEXT_MESSAGE_START'}",
        "{'value':[{'delta':'x'},[['type']]],'type':'RUN_STARTED'}",
        "{'rawEvent':{'messageId':'m2','delta':'zz'},'messageId':'m1','type':"
        "'TEXT_MESSAGE_CONTENT','delta':'b'}",
        "{'value':['type','TEXT_MESSAGE_START'],'type':'TOOL_CALL_END','toolCallId':'t'}");
}

Test(capture, escaped_keys_and_escaped_types_are_kept_as_they_are)
{
    /* jansson reads these keys as "type" and "delta": the scanner does not guess */
    expect_verbatim("{'typ\\u0065':'RUN_STARTED'}");
    expect_verbatim("{'type':'RUN_STARTED','typ\\u0065':'TEXT_MESSAGE_START','messageId':'m'}");
    expect_verbatim("{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','\\u0064elta':'x'}");
    expect_verbatim("{'type':'RUN_STARTED','\\u00e9':1}");
    /* a type spelt with escapes */
    expect_verbatim("{'type':'TEXT_MESSAGE_\\u0043ONTENT','messageId':'m1','delta':'x'}");
    expect_verbatim("{'type':'RUN_\\u0053TARTED'}");
}

Test(capture, a_verbatim_event_breaks_coalescing)
{
    EXPECT_CAPTURE("\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'a'}\n"
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','\\u0064elta':'b'}\n"
                   "\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'c'}\n",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'a'}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','\\u0064elta':'b'}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'c'}");
}

Test(capture, events_the_scanner_cannot_judge_are_kept_as_they_are)
{
    static const char *const bad[] = {
        "",
        "not json",
        "[{'type':'RUN_STARTED'}]",
        "'RUN_STARTED'",
        "{}",
        "{'type':'RUN_STARTED'",
        "{'type':'RUN_STARTED'}}",
        "{'type':'RUN_STARTED'} x",
        "{'type':'RUN_STARTED',}",
        "{'type':'RUN_STARTED' 'a':1}",
        "{'type' 'RUN_STARTED'}",
        "{type:'RUN_STARTED'}",
        "{'type':'RUN_STARTED','type':'RUN_FINISHED'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'a','delta':'b'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','messageId':'m2','delta':'a'}",
        "{'type':7}",
        "{'type':null,'messageId':'m1'}",
        "{'type':['TEXT_MESSAGE_START']}",
        "{'messageId':'m1','delta':'x'}",
        /* content events history refuses: kept, so that it counts them */
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':7}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':null,'delta':'x'}",
        "{'type':'TEXT_MESSAGE_CONTENT','delta':'x'}",
        "{'type':'TOOL_CALL_ARGS','messageId':'t1','delta':'x'}",
        "{'type':'TOOL_CALL_ARGS','toolCallId':'t1','delta':{'a':1}}",
    };
    /* invalid JSON that looks like an event: jansson refuses it */
    static const char *const invalid[] = {
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'a\\x'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'\\u00'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'\\u00g0'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'\\ud83d'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'\\ude00'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'\\ud83d\\u0041'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'\\u0000'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'tab\there'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'\xc3'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'\xc0\xaf'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'\xed\xa0\x80'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'\xf4\x90\x80\x80'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'\xff'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':01}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':1.}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':1e}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':-}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':+1}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':.5}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':tru}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':nulls}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':[1,]}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':[1}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':{'a'}}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':{1:2}}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':NaN}",
    };
    /* past the scanner's limits (jansson refuses the first two too) */
    static const char *const beyond[] = {
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':99999999999999999999}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':1e999}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':1234567890123456789}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':1e100}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'x','n':[[[[[[[[[[[[[[[[[[[["
        "[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(bad); i++)
        expect_verbatim(bad[i]);
    for (size_t i = 0; i < AGW_ARRAY_LEN(invalid); i++) {
        size_t len;
        char *e = dq(invalid[i], &len);
        cr_assert_null(json_loadb(e, len, 0, NULL), "jansson refuses %s", invalid[i]);
        free(e);
        expect_verbatim(invalid[i]);
    }
    for (size_t i = 0; i < AGW_ARRAY_LEN(beyond); i++)
        expect_verbatim(beyond[i]);
}

Test(capture, numbers_and_literals_within_the_limits_are_read)
{
    EXPECT_CAPTURE("\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'ab'}\n",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'a','n':[0,-0,"
                   "123456789012345678,-123456789012345678,0.5,-1.25e-10,1E+99,2e0,true,false,"
                   "null,{},[],{'a':[{}]}]}",
                   "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'b','n':[[[[[[[[[[[["
                   "[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}");
}

Test(capture, raw_line_breaks_become_tabs)
{
    struct agw_capture *c = agw_capture_new();
    static const char between[] = "{\"type\":\"TEXT_MESSAGE_END\",\r\n\"messageId\":\"m1\"}\n";
    static const char inside[] = "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a\nb\"}";
    static const char content[] = "{\"type\":\"TEXT_MESSAGE_CONTENT\",\r\n\"messageId\":\"m1\","
                                  "\"delta\":\"x\"}";
    static const char cr_only[] = "{\"type\":\"TOOL_CALL_END\",\r\"toolCallId\":\"c\"}";
    char *got;
    json_t *v;

    feed_raw(c, between, strlen(between) - 1);
    feed_raw(c, inside, strlen(inside));
    feed_raw(c, content, strlen(content));
    feed_raw(c, cr_only, strlen(cr_only));
    got = take_str(c);
    cr_assert_str_eq(got, "{\"type\":\"TEXT_MESSAGE_END\",\t\t\"messageId\":\"m1\"}\n"
                          "{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a\tb\"}\n"
                          "\x1e{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m1\","
                          "\"delta\":\"x\"}\n"
                          "{\"type\":\"TOOL_CALL_END\",\t\"toolCallId\":\"c\"}\n");
    /* between tokens a tab is whitespace as CR LF was; inside a string it is refused as LF was */
    v = json_loads("{\"type\":\"TEXT_MESSAGE_END\",\t\t\"messageId\":\"m1\"}", 0, NULL);
    cr_assert_not_null(v);
    json_decref(v);
    cr_assert_null(json_loads("{\"type\":\"TEXT_MESSAGE_START\",\"messageId\":\"a\tb\"}", 0, NULL));
    free(got);
    agw_capture_free(c);
}

Test(capture, truncations_of_an_event_never_read_past_it)
{
    static const char *const events[] = {
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m\\u0031','delta':'a\\ud83d\\ude00\xc3\xa9',"
        "'n':[-1.5e+10,{'x':true}],'f':false,'z':null}",
        "{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'u1','content':'\\\\\\''}]}",
    };

    /* every prefix (from an exact-size copy: the sanitizers see a read past it) */
    for (size_t k = 0; k < AGW_ARRAY_LEN(events); k++) {
        size_t len;
        char *full = dq(events[k], &len);
        for (size_t n = 0; n <= len; n++) {
            struct agw_capture *c = agw_capture_new();
            size_t out_len;
            char *out;

            feed_raw(c, full, n);
            out = agw_capture_take(c, &out_len, NULL);
            if (n < len) {
                cr_assert_eq(out_len, n + 1, "a cut event is kept as it is (%zu)", n);
                cr_assert(n == 0 || memcmp(out, full, n) == 0);
            }
            free(out);
            agw_capture_free(c);
        }
        free(full);
    }
}

/* ---- reading a coalesced line back ---------------------------------------------------------- */

static bool line_delta(const char *text, struct agw_capture_delta *d)
{
    size_t len;
    char *line = dq(text, &len); /* exactly its length: a read past it is caught */
    bool ok = agw_capture_line_delta(line, len, d);

    if (ok) { /* the parts point into the line: copy what the test looks at */
        static char id[64], delta[64];
        snprintf(id, sizeof(id), "%.*s", (int)d->id_len, d->id);
        snprintf(delta, sizeof(delta), "%.*s", (int)d->delta_len, d->delta);
        d->id = id;
        d->delta = delta;
    }
    free(line);
    return ok;
}

/* A coalesced line at the start of a buffer of lines, with the capture's mark or without: found
 * with its length when a line break or the end follows it, not otherwise. */
Test(capture, a_coalesced_line_is_found_at_the_start_of_lines)
{
    struct agw_capture_delta d;
    size_t n, len, want = strlen("{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'x'}");
    char *b;

    for (int marked = 0; marked < 2; marked++) {
        const char *m = marked ? "\x1e" : "";
        char text[128];

        snprintf(text, sizeof(text),
                 "%s{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'x'}\n{'type':'X'}\n",
                 m);
        b = dq(text, &len);
        cr_assert(agw_capture_line_delta_at(b, len, &d, &n));
        cr_assert_eq(n, want + (size_t)marked);
        cr_assert_eq(d.delta_len, 1);
        cr_assert_eq(d.delta[0], 'x');
        free(b);
        snprintf(text, sizeof(text),
                 "%s{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'x'}", m);
        b = dq(text, &len);
        cr_assert(agw_capture_line_delta_at(b, len, &d, &n), "the end of the buffer ends it too");
        cr_assert_eq(n, want + (size_t)marked);
        free(b);
        snprintf(text, sizeof(text),
                 "%s{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'x'} \n", m);
        b = dq(text, &len);
        cr_assert_not(agw_capture_line_delta_at(b, len, &d, &n), "anything else after it");
        free(b);
        snprintf(text, sizeof(text), "%s{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'x",
                 m);
        b = dq(text, &len);
        cr_assert_not(agw_capture_line_delta_at(b, len, &d, &n), "cut");
        free(b);
    }
}

/* A marked line's delta is not scanned: it ends where the line does (the capture writes the mark
 * only before strings it read whole); an unmarked one's is, and its end must end the line. */
Test(capture, a_marked_line_delta_ends_with_the_line)
{
    struct agw_capture_delta d;
    size_t n, len;
    char *b;

    /* a quote inside: marked, it is the delta's (the capture never writes this); unmarked, the
     * delta's string ends there and the line is not in the coalesced form */
    b = dq("\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'a','b'}\n", &len);
    cr_assert(agw_capture_line_delta_at(b, len, &d, &n));
    cr_assert_eq(d.delta_len, strlen("a\",\"b"));
    cr_assert_eq(n, len - 1);
    free(b);
    b = dq("{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'a','b'}\n", &len);
    cr_assert_not(agw_capture_line_delta_at(b, len, &d, &n));
    free(b);
    /* a marked line still needs its '"}' at the end, and its id is read as a string */
    b = dq("\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'a'\n", &len);
    cr_assert_not(agw_capture_line_delta_at(b, len, &d, &n));
    free(b);
    b = dq("\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'}\n", &len);
    cr_assert_not(agw_capture_line_delta_at(b, len, &d, &n), "no room for a delta");
    free(b);
    b = dq("\x1e{'type':'TEXT_MESSAGE_CONTENT','messageId':a1,'delta':'x'}\n", &len);
    cr_assert_not(agw_capture_line_delta_at(b, len, &d, &n));
    free(b);
    b = dq("\x1e{'type':'TOOL_CALL_ARGS','toolCallId':'c\\u0031','delta':''}", &len);
    cr_assert(agw_capture_line_delta_at(b, len, &d, &n));
    cr_assert(d.args);
    cr_assert(d.id_escaped);
    cr_assert_eq(d.delta_len, 0);
    free(b);
}

/* A kept event never begins with the mark: a first byte that is the mark (not JSON) is written as
 * AGW_CAPTURE_NOT_MARK (not JSON either), so no reader takes it for a coalesced line. */
Test(capture, a_kept_event_never_begins_with_the_mark)
{
    static const char ev[] = "\x1e{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\","
                             "\"delta\":\"a\",\"x\":\"b\"}";
    struct agw_capture *c = agw_capture_new();
    struct agw_capture_delta d;
    char *got;
    size_t n;

    feed_raw(c, ev, strlen(ev));
    got = take_str(c);
    cr_assert_eq(got[0], AGW_CAPTURE_NOT_MARK);
    cr_assert_eq(strlen(got), strlen(ev) + 1);
    cr_assert(memcmp(got + 1, ev + 1, strlen(ev) - 1) == 0 && got[strlen(ev)] == '\n');
    cr_assert_not(agw_capture_line_delta_at(got, strlen(got), &d, &n));
    free(got);
    agw_capture_free(c);
}

Test(capture, a_coalesced_line_is_read_back_in_parts)
{
    struct agw_capture_delta d;

    cr_assert(
        line_delta("{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'x\\'y\\u00e9'}", &d));
    cr_assert_not(d.args);
    cr_assert_not(d.id_escaped);
    cr_assert_str_eq(d.id, "a1");
    cr_assert_str_eq(d.delta, "x\\\"y\\u00e9");
    cr_assert(line_delta("{'type':'TOOL_CALL_ARGS','toolCallId':'c\\u0031','delta':''}", &d));
    cr_assert(d.args);
    cr_assert(d.id_escaped);
    cr_assert_str_eq(d.id, "c\\u0031");
    cr_assert_str_eq(d.delta, "");
    /* whatever the coalescing does not write is not read: it goes to the full parse */
    cr_assert_not(
        line_delta("{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'x','t':1}", &d));
    cr_assert_not(
        line_delta("{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'x','delta':'y'}", &d));
    cr_assert_not(line_delta("{'type':'TEXT_MESSAGE_CONTENT', 'messageId':'a1','delta':'x'}", &d));
    cr_assert_not(line_delta("{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'x'} ", &d));
    cr_assert_not(line_delta("{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':1}", &d));
    cr_assert_not(line_delta("{'type':'TEXT_MESSAGE_CONTENT','messageId':1,'delta':'x'}", &d));
    cr_assert_not(
        line_delta("{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'\\u0000'}", &d));
    cr_assert_not(
        line_delta("{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'\\ud83d'}", &d));
    cr_assert_not(
        line_delta("{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'\xff'}", &d));
    cr_assert_not(line_delta("{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'x", &d));
    cr_assert_not(line_delta("{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1'", &d));
    cr_assert_not(line_delta("{'type':'TEXT_MESSAGE_START','messageId':'a1'}", &d));
    cr_assert_not(line_delta("", &d));
}

/* ---- reading a run's input ---------------------------------------------------------------- */

struct got {
    char text[512];
    size_t calls;
    size_t stop_at; /* 0: never stop */
};

static bool got_one(void *arg, const char *msg, size_t msg_len, const char *id, size_t id_len)
{
    struct got *g = arg;
    size_t n = strlen(g->text);

    snprintf(g->text + n, sizeof(g->text) - n, "%s%.*s=%.*s", n > 0 ? " " : "", (int)id_len, id,
             (int)msg_len, msg);
    return ++g->calls != g->stop_at;
}

static bool input_messages(const char *text, struct got *g)
{
    size_t len;
    char *body = dq(text, &len);
    bool ok = agw_capture_input_messages(body, len, got_one, g);

    free(body);
    return ok;
}

Test(capture, a_run_input_gives_its_messages)
{
    struct got g = {"", 0, 0};

    cr_assert(input_messages(" {'threadId':'t','state':{'a':[1,{'b':null}]},'messages':[ "
                             "{'role':'user','id':'m1'} ,{'id':'m\xc3\xa9','x':{'id':'\\u00e9'}}],"
                             "'tools':[]} ",
                             &g));
    cr_assert_str_eq(g.text,
                     "m1={\"role\":\"user\",\"id\":\"m1\"} "
                     "m\xc3\xa9={\"id\":\"m\xc3\xa9\",\"x\":{\"id\":\"\\u00e9\"}}",
                     "%s", g.text);
    g = (struct got){"", 0, 0};
    cr_assert(input_messages("{'messages':[]}", &g));
    cr_assert_eq(g.calls, 0);
    /* what jansson with JSON_REJECT_DUPLICATES would refuse, or read otherwise: jansson decides */
    static const char *const refused[] = {
        "{'messages':[{'id':'m1'}],'messages':[]}",
        "{'messages':[{'id':'m1','id':'m2'}]}",
        "{'messages':[{'id':'m1'}],'state':{'a':1,'a':2}}",
        "{'messages':[{'id':'m1'}],'st\\u0061te':{}}",
        "{'messages':[{'id':'m1','r\\u006fle':'user'}]}",
        "{'messages':[{'id':'m\\u0031'}]}",
        "{'messages':[{'id':1}]}",
        "{'messages':[{'role':'user'}]}",
        "{'messages':[1]}",
        "{'messages':{}}",
        "{'threadId':'t'}",
        "{}",
        "[]",
        "{'messages':[{'id':'m1','c':'\\u0000'}]}",
        "{'messages':[{'id':'m1'}]",
        "{'messages':[{'id':'m1'}]}}",
        "{'messages':[{'id':'m1'},]}",
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        g = (struct got){"", 0, 0};
        cr_assert_not(input_messages(refused[i], &g), "%s", refused[i]);
    }
    /* the callback stops it */
    g = (struct got){"", 0, 1};
    cr_assert_not(input_messages("{'messages':[{'id':'a'},{'id':'b'}]}", &g));
    cr_assert_eq(g.calls, 1);
}

/* ---- the property the store relies on -------------------------------------------------------- */

/* Applies each line of <lines> to <h> as the store does. */
static void apply_lines(struct agw_history *h, const char *lines, size_t len)
{
    const char *p = lines, *end = lines + len;

    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl != NULL ? nl : end) - p);

        if (n > 0)
            agw_history_apply_line(h, "r1", p, n);
        p += n + 1;
    }
}

/* Applying <events> one by one and applying what the capture kept of them (taken after every
 * <take_every> events, 0 = once at the end) give the same thread. Returns the number of lines. */
static size_t same_thread(const char *const *events, size_t n, size_t take_every)
{
    struct agw_history *direct = agw_history_new(100), *captured = agw_history_new(100);
    struct agw_capture *c = agw_capture_new();
    static const char input[] = "[{\"id\":\"u1\",\"role\":\"user\",\"content\":\"weather?\"}]";
    json_t *msgs = json_loads(input, 0, NULL);
    size_t lines_n = 0;
    char *a, *b;

    agw_history_merge_input(direct, "r1", msgs);
    agw_history_merge_input(captured, "r1", msgs);
    json_decref(msgs);
    for (size_t i = 0; i <= n; i++) {
        if (i == n || (take_every > 0 && i > 0 && i % take_every == 0)) {
            size_t len;
            char *lines = agw_capture_take(c, &len, NULL);
            for (size_t k = 0; k < len; k++)
                lines_n += lines[k] == '\n';
            apply_lines(captured, lines, len);
            free(lines);
        }
        if (i < n) {
            size_t len;
            char *e = dq(events[i], &len);
            json_t *ev = json_loadb(e, len, 0, NULL);
            if (ev != NULL)
                agw_history_apply(direct, "r1", ev);
            json_decref(ev);
            agw_capture_event(c, e, len);
            free(e);
        }
    }
    a = agw_history_dump(direct);
    b = agw_history_dump(captured);
    cr_assert_str_eq(b, a, "take every %zu", take_every);
    cr_assert_gt(agw_history_count(direct), 1, "the stream makes messages");
    free(a);
    free(b);
    agw_history_free(direct);
    agw_history_free(captured);
    agw_capture_free(c);
    return lines_n;
}

static void expect_same_thread(const char *const *events, size_t n, size_t lines_at_end)
{
    size_t lines = same_thread(events, n, 0);

    cr_assert_eq(lines, lines_at_end, "%zu lines", lines);
    for (size_t k = 1; k <= 4; k++)
        same_thread(events, n, k);
}

Test(capture, a_text_run_rebuilds_the_same_thread)
{
    static const char *const events[] = {
        "{'type':'RUN_STARTED','threadId':'t1','runId':'r1','timestamp':1}",
        "{'type':'STEP_STARTED','stepName':'think'}",
        "{'type':'TEXT_MESSAGE_START','messageId':'a1','role':'assistant'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'It is '}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'\\'sunny\\' '}",
        "{'type':'STATE_DELTA','delta':[{'op':'replace','path':'/x','value':2}]}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'in Par'}",
        "{ 'type' : 'TEXT_MESSAGE_CONTENT', 'messageId' : 'a1', 'delta' : 'is \\u2600\\n' }",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'\\ud83c\\udf1e "
        "\xc3\xa9t\xc3\xa9'}",
        "{'type':'TEXT_MESSAGE_END','messageId':'a1'}",
        "{'type':'STEP_FINISHED','stepName':'think'}",
        "{'type':'RUN_FINISHED','threadId':'t1','runId':'r1'}",
    };

    expect_same_thread(events, AGW_ARRAY_LEN(events), 3);
}

Test(capture, a_reasoning_run_rebuilds_the_same_thread)
{
    static const char *const events[] = {
        "{'type':'RUN_STARTED','threadId':'t1','runId':'r1'}",
        "{'type':'REASONING_START','messageId':'s1'}",
        "{'type':'REASONING_MESSAGE_START','messageId':'t1','role':'reasoning'}",
        "{'type':'REASONING_MESSAGE_CONTENT','messageId':'t1','delta':'Let me '}",
        "{'type':'REASONING_MESSAGE_CONTENT','messageId':'t1','delta':'think \\u2600'}",
        "{'type':'REASONING_MESSAGE_END','messageId':'t1'}",
        "{'type':'REASONING_ENCRYPTED_VALUE','subtype':'message','entityId':'t1',"
        "'encryptedValue':'xyz'}",
        "{'type':'REASONING_END','messageId':'s1'}",
        "{'type':'TEXT_MESSAGE_START','messageId':'a1','role':'assistant'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'Sunny.'}",
        "{'type':'TEXT_MESSAGE_END','messageId':'a1'}",
        "{'type':'REASONING_MESSAGE_START','messageId':'t2','role':'reasoning'}",
        "{'type':'REASONING_MESSAGE_CONTENT','messageId':'t2','delta':'after'}",
        "{'type':'REASONING_MESSAGE_CONTENT','messageId':'t2','delta':'wards'}",
        "{'type':'REASONING_MESSAGE_END','messageId':'t2'}",
        "{'type':'RUN_FINISHED','threadId':'t1','runId':'r1'}",
    };

    expect_same_thread(events, AGW_ARRAY_LEN(events), 10);
}

Test(capture, a_run_start_is_kept_only_with_an_input)
{
    static const char *const evs[] = {
        "{\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r\"}",
        "{\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r\",\"note\":\"input\"}",
        "{\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r\",\"input\":{\"messages\":[]}}",
        "{\"type\":\"RUN_STARTED\",\"input\":\"x\"}",
    };
    static const bool kept[] = {false, false, true, true};

    for (size_t i = 0; i < AGW_ARRAY_LEN(evs); i++) {
        for (int typed = 0; typed < 2; typed++) {
            struct agw_capture *c = agw_capture_new();
            size_t len = strlen(evs[i]), n;
            char *got;

            if (typed)
                agw_capture_typed(c, "RUN_STARTED", 11, evs[i], len);
            else
                agw_capture_event(c, evs[i], len);
            got = agw_capture_take(c, &n, NULL);
            cr_assert_eq(got != NULL, kept[i], "%s (typed %d)", evs[i], typed);
            if (got != NULL) {
                cr_assert_eq(n, len + 1);
                cr_assert(memcmp(got, evs[i], len) == 0 && got[len] == '\n');
            }
            free(got);
            agw_capture_free(c);
        }
    }
}

Test(capture, a_run_start_with_an_input_rebuilds_the_same_thread)
{
    static const char *const events[] = {
        "{'type':'RUN_STARTED','threadId':'t1','runId':'r1','input':{'threadId':'t1','runId':'r1',"
        "'messages':[{'id':'u1','role':'user','content':'hi'},{'id':'u0','role':'user','content':"
        "'before','subagentRunId':null}]}}",
        "{'type':'TEXT_MESSAGE_START','messageId':'a1','role':'assistant'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'Hel'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'lo'}",
        "{'type':'TEXT_MESSAGE_END','messageId':'a1'}",
        "{'type':'RUN_FINISHED','threadId':'t1','runId':'r1'}",
    };

    expect_same_thread(events, AGW_ARRAY_LEN(events), 4);
}

Test(capture, names_and_subagent_run_ids_rebuild_the_same_thread)
{
    static const char *const events[] = {
        "{'type':'TEXT_MESSAGE_START','messageId':'a1','role':'assistant','name':'Ann'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'hi','subagentRunId':'s'}",
        "{'type':'TEXT_MESSAGE_END','messageId':'a1','name':'ignored'}",
        "{'type':'REASONING_MESSAGE_START','messageId':'t1','subagentRunId':'s'}",
        "{'type':'REASONING_MESSAGE_END','messageId':'t1'}",
        "{'type':'TEXT_MESSAGE_START','messageId':'a2','subagentRunId':null}",
        "{'type':'CUSTOM','name':'n','name':'twice'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a2','delta':'x'}",
    };

    /* (the CUSTOM event with a key given twice is kept for the store's parse to judge) */
    expect_same_thread(events, AGW_ARRAY_LEN(events), 8);
}

Test(capture, an_activity_run_rebuilds_the_same_thread)
{
    static const char *const events[] = {
        "{'type':'ACTIVITY_SNAPSHOT','messageId':'p1','activityType':'plan','content':{'steps':"
        "['a','b'],'done':0}}",
        "{'type':'TEXT_MESSAGE_START','messageId':'a1'}",
        "{'type':'ACTIVITY_DELTA','messageId':'p1','activityType':'plan','patch':[{'op':'replace',"
        "'path':'/done','value':1}]}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'x'}",
        "{'type':'ACTIVITY_DELTA','messageId':'p1','activityType':'plan','patch':[{'op':'add',"
        "'path':'/steps/-','value':'c'}]}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'y'}",
    };

    expect_same_thread(events, AGW_ARRAY_LEN(events), 6);
}

Test(capture, metadata_rebuilds_the_same_thread)
{
    /* a content event with metadata is kept as it is (the coalescing would drop it) */
    static const char *const events[] = {
        "{'type':'TEXT_MESSAGE_START','messageId':'a1','metadata':{'model':'m'}}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'He'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'l','metadata':{'lp':[1]}}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'lo'}",
        "{'type':'TEXT_MESSAGE_END','messageId':'a1','metadata':{'usage':{'out':3}}}",
        "{'type':'TOOL_CALL_START','toolCallId':'c1','toolCallName':'f','metadata':{'a':1}}",
        "{'type':'TOOL_CALL_ARGS','toolCallId':'c1','delta':'{}','metadata':{'b':1}}",
        "{'type':'TOOL_CALL_END','toolCallId':'c1','metadata':{'a':2}}",
    };

    expect_same_thread(events, AGW_ARRAY_LEN(events), 8);
}

/* A sub-agent's content is coalesced like the agent's own: its subagentRunId is nothing the message
 * takes (the start's is). */
Test(capture, a_sub_agents_content_rebuilds_the_same_thread)
{
    static const char *const events[] = {
        "{'type':'TEXT_MESSAGE_START','messageId':'p1','role':'assistant'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'p1','delta':'a'}",
        "{'type':'TEXT_MESSAGE_START','messageId':'s1','subagentRunId':'x'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'s1','delta':'y','subagentRunId':'x'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'s1','delta':'z','subagentRunId':'x'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'p1','delta':'b'}",
        "{'type':'TEXT_MESSAGE_END','messageId':'s1','subagentRunId':'x'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'p1','delta':'!'}",
    };

    expect_same_thread(events, AGW_ARRAY_LEN(events), 7);
}

Test(capture, a_tool_call_run_rebuilds_the_same_thread)
{
    static const char *const events[] = {
        "{'type':'RUN_STARTED','threadId':'t1','runId':'r1'}",
        "{'type':'TEXT_MESSAGE_START','messageId':'a1','role':'assistant'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'Let me '}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'check.'}",
        "{'type':'TEXT_MESSAGE_END','messageId':'a1'}",
        "{'type':'TOOL_CALL_START','toolCallId':'c1','toolCallName':'weather',"
        "'parentMessageId':'a1'}",
        "{'type':'TOOL_CALL_ARGS','toolCallId':'c1','delta':'{\\'ci'}",
        "{'type':'TOOL_CALL_ARGS','toolCallId':'c1','delta':'ty\\':\\'Pa'}",
        "{'type':'TOOL_CALL_START','toolCallId':'c2','toolCallName':'time',"
        "'parentMessageId':'a1'}",
        "{'type':'TOOL_CALL_ARGS','toolCallId':'c2','delta':'{\\'tz\\':'}",
        "{'type':'TOOL_CALL_ARGS','toolCallId':'c1','delta':'ris\\'}'}",
        "{'type':'TOOL_CALL_ARGS','toolCallId':'c2','delta':'\\'CET\\'}'}",
        "{'type':'TOOL_CALL_END','toolCallId':'c1'}",
        "{'type':'TOOL_CALL_END','toolCallId':'c2'}",
        "{'type':'TOOL_CALL_RESULT','messageId':'t1','toolCallId':'c1','content':'22C',"
        "'role':'tool'}",
        "{'type':'TOOL_CALL_RESULT','messageId':'t2','toolCallId':'c2','content':'14:00'}",
        "{'type':'TOOL_CALL_START','toolCallId':'c3','toolCallName':'noop'}",
        "{'type':'TOOL_CALL_ARGS','toolCallId':'c3','delta':''}",
        "{'type':'TOOL_CALL_ARGS','toolCallId':'c3','delta':'{}'}",
        "{'type':'TOOL_CALL_END','toolCallId':'c3'}",
        "{'type':'TEXT_MESSAGE_START','messageId':'a2'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a2','delta':'22C'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a2','delta':' at 14:00.'}",
        "{'type':'TEXT_MESSAGE_END','messageId':'a2'}",
        "{'type':'RUN_FINISHED','threadId':'t1','runId':'r1'}",
    };

    expect_same_thread(events, AGW_ARRAY_LEN(events), 19);
}

Test(capture, a_run_with_a_snapshot_rebuilds_the_same_thread)
{
    static const char *const events[] = {
        "{'type':'RUN_STARTED','threadId':'t1','runId':'r1'}",
        "{'type':'TEXT_MESSAGE_START','messageId':'a1'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'draft '}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'text'}",
        "{'type':'TEXT_MESSAGE_END','messageId':'a1'}",
        "{'type':'MESSAGES_SNAPSHOT','messages':[{'id':'u1','role':'user','content':'weather?'},"
        "{'id':'a1','role':'assistant','content':'rewritten: '},{'id':'s1','role':'system',"
        "'content':'{\\'type\\':\\'TEXT_MESSAGE_CONTENT\\'}'}]}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'and '}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'a1','delta':'more'}",
        "{'type':'TOOL_CALL_START','toolCallId':'c9','toolCallName':'f'}",
        "{'type':'TOOL_CALL_ARGS','toolCallId':'c9','delta':'[1,'}",
        "{'type':'CUSTOM','name':'progress','value':{'type':'TOOL_CALL_ARGS','delta':'no'}}",
        "{'type':'TOOL_CALL_ARGS','toolCallId':'c9','delta':'2]'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'unknown','delta':'ignored'}",
        "{'type':'TOOL_CALL_END','toolCallId':'c9'}",
        "{'type':'RUN_FINISHED','threadId':'t1','runId':'r1'}",
    };

    expect_same_thread(events, AGW_ARRAY_LEN(events), 9);
}

Test(capture, odd_and_malformed_events_rebuild_the_same_thread)
{
    static const char *const events[] = {
        "{'type':'TEXT_MESSAGE_START','messageId':'m1','role':'assistant'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'a'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m\\u0031','delta':'b'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'c','messageId':'m1'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','\\u0064elta':'d'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'e','delta':'f'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':7}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'\\ud83d'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'\\ude00'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'\\u00'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'e9'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'g','n':99999999999999999999}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'h'} trailing",
        "{'typ\\u0065':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'i'}",
        "{'type':'RUN_STARTED','typ\\u0065':'TEXT_MESSAGE_START','messageId':'m2'}",
        "{'type':'TEXT_MESSAGE_CHUNK','messageId':'m3','delta':'j'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m1','delta':'k'}",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m2','delta':'l'}",
        "not json at all",
        "{'type':'TEXT_MESSAGE_CONTENT','messageId':'m2','delta':'m'}",
    };

    expect_same_thread(events, AGW_ARRAY_LEN(events), 19);
}
