/* libFuzzer driver for RunAgentInput validation (src/input.c, agw_input_parse()). The input is a
 * request body; its first byte chooses max_depth (b % 80, 0 = the default) and its second the size
 * of a small error buffer for a second call.
 *
 * Checks: the verdict is 0, 400 or 422, the same whatever error buffer is passed (none, a small
 * one, a full one), and the small buffer holds the start of the full message. A valid verdict
 * fills the documented fields: non-empty threadId and runId equal to the body's, has_decision
 * exactly when a "tool" message has a non-empty toolCallId, decision_only = !has_user_input &&
 * has_decision, every message an object with a known role, and an empty error. An error leaves
 * <in> zeroed and says why in printable ASCII (so valid UTF-8), without quoting the body: every
 * word of it is a word of input.c's or jansson's own messages, a number or a hex escape (jansson
 * names an invalid code point as '\uD800'), never a word of the body. (A new message with new words
 * needs them in <words> below.) The verdict, message and fields are those of jansson's reading
 * alone (agw_input_parse_jansson(): the scanner changes nothing), and the scanner alone
 * (agw_input_scan()) never reads as valid a body jansson's reading refuses, but for its depth; the
 * messages it keeps for the thread history are those agw_capture_input_messages() reads, and it
 * keeps them whenever that reading succeeds. The
 * body is also taken as a Content-Type value for agw_input_content_type_ok(): application/json, any
 * case, OWS around, parameters after ';'.
 *
 *   tests/fuzz/build.sh _build-fuzz input          (or by hand:)
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -I_build src/input.c src/common.c \
 *       tests/fuzz/fuzz_input.c $(pkg-config --cflags --libs jansson openssl)
 *   ./a.out tests/fuzz/corpus/input */
#include "config.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "agw/capture.h"
#include "agw/input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The words the messages are made of: src/input.c's, then jansson 2.14's (load.c). */
static const char *const words[] = {
    "bad", "request", "JSON", "nested", "deeper", "than", "levels", "body", "is", "not", "valid",
    "at", "line", "column", "must", "be", "a", "an", "object", "threadId", "runId", "required",
    "and", "string", "cannot", "empty", "contain", "NUL", "characters", "messages", "content", "or",
    "array", "of", "input", "parts", "type", "text", "role", "one", "developer", "system",
    "assistant", "user", "tool", "activity", "reasoning", "id", "toolCallId", "tools", "name",
    "parameters", "Schema", "execute", "frontend", "backend", "context",
    /* jansson */
    "unable", "to", "decode", "byte", "premature", "end", "unexpected", "newline", "control",
    "character", "invalid", "escape", "Unicode", "too", "big", "negative", "integer", "real",
    "number", "overflow", "maximum", "parsing", "depth", "reached", "expected", "duplicate", "key",
    "token", "file", "wrong", "arguments", "near", "allowed", "without", "JSON_ALLOW_NUL", "in",
    "supported", "Out", "memory", NULL};

static void fatal(const char *what, const char *err)
{
    fprintf(stderr, "fuzz_input: %s%s%s\n", what, err ? ": " : "", err ? err : "");
    abort();
}

static bool known_word(const char *w, size_t n)
{
    bool digits = true, hex = n > 2 && w[0] == '0' && w[1] == 'x';

    for (size_t i = 0; i < n; i++)
        digits = digits && isdigit((unsigned char)w[i]);
    for (size_t i = 2; hex && i < n; i++)
        hex = isxdigit((unsigned char)w[i]);
    if (digits || hex)
        return true;
    /* "\uD800": jansson names an invalid code point by its escape. */
    if (n == 5 && w[0] == 'u' && isxdigit((unsigned char)w[1]) && isxdigit((unsigned char)w[2]) &&
        isxdigit((unsigned char)w[3]) && isxdigit((unsigned char)w[4]))
        return true;
    for (size_t i = 0; words[i] != NULL; i++)
        if (strlen(words[i]) == n && memcmp(words[i], w, n) == 0)
            return true;
    return false;
}

static void check_error(const char *err)
{
    size_t n = strlen(err);

    if (n == 0)
        fatal("an error without a message", NULL);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)err[i] < 0x20 || (unsigned char)err[i] >= 0x7f)
            fatal("an error message with a byte that is not printable ASCII", err);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && (isalnum((unsigned char)err[j]) || err[j] == '_'))
            j++;
        if (j > i && !known_word(err + i, j - i))
            fatal("an error message with a word of the body in it", err);
        i = j > i ? j : i + 1;
    }
}

static bool str_eq(const json_t *v, const char *s)
{
    return json_is_string(v) && json_string_length(v) == strlen(s) &&
           memcmp(json_string_value(v), s, json_string_length(v)) == 0;
}

static void check_valid(const char *body, size_t len, const struct agw_input *in)
{
    static const char *const roles[] = {"developer", "system",   "assistant", "user",
                                        "tool",      "activity", "reasoning"};
    json_t *root = json_loadb(body, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL), *msgs, *m;
    bool decision = false;
    size_t i;

    if (in->thread_id == NULL || in->run_id == NULL || in->thread_id[0] == '\0' ||
        in->run_id[0] == '\0')
        fatal("valid without threadId or runId", NULL);
    if (!json_is_object(root))
        fatal("valid, but the body is not a JSON object", NULL);
    if (!str_eq(json_object_get(root, "threadId"), in->thread_id) ||
        !str_eq(json_object_get(root, "runId"), in->run_id))
        fatal("valid, but the ids are not the body's", NULL);
    msgs = json_object_get(root, "messages");
    if (!json_is_array(msgs))
        fatal("valid without a messages array", NULL);
    json_array_foreach(msgs, i, m)
    {
        json_t *role = json_object_get(m, "role"), *tc = json_object_get(m, "toolCallId");
        bool known = false;

        if (!json_is_object(m))
            fatal("valid with a message that is not an object", NULL);
        for (size_t r = 0; r < sizeof(roles) / sizeof(roles[0]); r++)
            known = known || str_eq(role, roles[r]);
        if (!known)
            fatal("valid with a message of an unknown role", NULL);
        if (str_eq(role, "tool"))
            decision = decision || (json_is_string(tc) && json_string_length(tc) > 0);
    }
    if (in->has_decision != decision)
        fatal("has_decision is not what the messages say", NULL);
    if (in->decision_only != (!in->has_user_input && in->has_decision))
        fatal("decision_only is not !has_user_input && has_decision", NULL);
    json_decref(root);
}

/* agw_input_content_type_ok() on the body taken as a Content-Type value (up to its first NUL). */
static void check_content_type(const char *body, size_t len)
{
    char *ct = agw_xstrndup(body, len);
    const char *p = ct;
    bool want;

    while (*p == ' ' || *p == '\t')
        p++;
    want = strncasecmp(p, "application/json", 16) == 0;
    if (want) {
        p += 16;
        while (*p == ' ' || *p == '\t')
            p++;
        want = *p == '\0' || *p == ';';
    }
    if (agw_input_content_type_ok(ct) != want)
        fatal("agw_input_content_type_ok() is wrong about", ct);
    free(ct);
}

static void same_fields(const struct agw_input *a, const struct agw_input *b)
{
    if (strcmp(a->thread_id, b->thread_id) != 0 || strcmp(a->run_id, b->run_id) != 0 ||
        a->has_user_input != b->has_user_input || a->has_decision != b->has_decision ||
        a->decision_only != b->decision_only)
        fatal("the fields are not jansson's reading's", NULL);
}

static bool read_none(void *arg, const char *msg, size_t msg_len, const char *id, size_t id_len)
{
    (void)arg, (void)msg, (void)msg_len, (void)id, (void)id_len;
    return true;
}

/* The capture's reading of the body's messages, for check_messages(). */
struct read_back {
    const char *body;
    const struct agw_input *in;
    size_t n;
};

static bool read_one(void *arg, const char *msg, size_t msg_len, const char *id, size_t id_len)
{
    struct read_back *r = arg;
    const struct agw_input_message *m = &r->in->messages[r->n];

    if (r->n == r->in->n_messages || (size_t)(msg - r->body) != m->off || msg_len != m->len ||
        (size_t)(id - r->body) != m->id_off || id_len != m->id_len)
        fatal("the input's messages are not the capture's reading of the body", NULL);
    r->n++;
    return true;
}

/* A reading of the messages that the store takes instead of reading the body again
 * (agw_history_merge_read()) is the one agw_capture_input_messages() makes: the same elements and
 * ids, in order; and the scanner keeps one whenever that reading succeeds. */
static void check_messages(const char *body, size_t len)
{
    struct agw_input in = {0};
    struct read_back r = {body, &in, 0};

    if (!agw_input_scan(body, len, &in))
        return;
    if (!in.messages_read) {
        if (in.messages != NULL || in.n_messages != 0)
            fatal("messages kept without messages_read", NULL);
        if (agw_capture_input_messages(body, len, read_none, NULL))
            fatal("the scanner kept no messages where the capture reads them", NULL);
    } else if (!agw_capture_input_messages(body, len, read_one, &r) || r.n != in.n_messages) {
        fatal("the input's messages are not the capture's reading of the body", NULL);
    }
    agw_input_clear(&in);
}

static bool zeroed(const struct agw_input *in)
{
    static const struct agw_input zero;
    return memcmp(in, &zero, sizeof(zero)) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct agw_input in = {0}, in2 = {0};
    char err[AGW_INPUT_ERR_MAX], err2[AGW_INPUT_ERR_MAX], small[80];
    const char *body;
    unsigned depth;
    size_t len, small_len;
    int rc, rc2;

    if (size < 2)
        return 0;
    depth = data[0] % 80u;
    small_len = 1 + data[1] % (sizeof(small) - 1);
    body = (const char *)data + 2;
    len = size - 2;

    memset(err, 'X', sizeof(err));
    rc = agw_input_parse(body, len, depth, &in, err, sizeof(err));
    if (memchr(err, '\0', sizeof(err)) == NULL)
        fatal("an error buffer left without a NUL", NULL);
    if (rc == 0) {
        if (err[0] != '\0')
            fatal("valid, with an error message", err);
        check_valid(body, len, &in);
    } else if (rc == 400 || rc == 422) {
        if (!zeroed(&in))
            fatal("an error that leaves the input filled", err);
        check_error(err);
    } else {
        fatal("a verdict other than 0, 400 or 422", NULL);
    }

    /* The scanner's reading changes nothing: jansson's alone gives the same verdict, message and
     * fields (src/input.c: the scanner only says "valid" where jansson does, with the same ids). */
    rc2 = agw_input_parse_jansson(body, len, depth, &in2, err2, sizeof(err2));
    if (rc2 != rc || strcmp(err2, err) != 0)
        fatal("the verdict or the message is not jansson's reading's", err2);
    if (rc == 0)
        same_fields(&in, &in2);
    agw_input_clear(&in2);
    if (agw_input_scan(body, len, &in2)) { /* within its depth limit, below the default */
        struct agw_input in3 = {0};
        if (agw_input_parse_jansson(body, len, 0, &in3, NULL, 0) != 0)
            fatal("the scanner reads as valid what jansson's reading refuses", NULL);
        same_fields(&in2, &in3);
        agw_input_clear(&in3);
    }
    agw_input_clear(&in2);

    /* Without an error buffer, and with a small one: the same verdict, a cut message. */
    rc2 = agw_input_parse(body, len, depth, &in2, NULL, 0);
    if (rc2 != rc)
        fatal("the verdict depends on the error buffer", NULL);
    agw_input_clear(&in2);
    memset(small, 'X', sizeof(small));
    rc2 = agw_input_parse(body, len, depth, &in2, small, small_len);
    if (rc2 != rc)
        fatal("the verdict depends on the error buffer's size", NULL);
    if (memchr(small, '\0', small_len) == NULL)
        fatal("a small error buffer left without a NUL", NULL);
    if (strncmp(small, err, strlen(small)) != 0 || strlen(small) != strnlen(err, small_len - 1))
        fatal("the small error buffer does not hold the start of the message", small);
    agw_input_clear(&in2);
    agw_input_clear(&in);
    agw_input_clear(&in);
    check_messages(body, len);
    check_content_type(body, len);
    return 0;
}
