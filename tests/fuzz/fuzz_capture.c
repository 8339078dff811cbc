/* libFuzzer driver for the capture of a run's events (src/capture.c). Byte 0 picks the thread's cap
 * (1 + b % 16), how often the capture is taken (every (b >> 4) % 8 events; 0 = once, at the end)
 * and, with its high bit, the separator of the events that follow: '\n' (JSON Lines, readable
 * corpora) or 0x1e (RFC 7464's record separator, so that events may hold raw line breaks). Each
 * event is fed from a heap copy of exactly its length, so that a read past it is caught. Every
 * other event that jansson reads as an object with a string "type" is given with that type
 * (agw_capture_typed(), as the relay gives what the normaliser read), the others scanned.
 *
 * Invariants on top of the sanitizers:
 * - the capture holds what it says (agw_capture_size() before a take is the taken length, or that
 * plus the 3 bytes that close a coalesced event); the output is JSON Lines with no more lines than
 * events;
 * - every line is an input event as it was (raw CR and LF made tabs, a first byte 0x1e made
 * 0x1f), or a coalesced content event (the mark 0x1e, then {"type":"TEXT_MESSAGE_CONTENT",
 * "messageId":…,"delta":…} or its TOOL_CALL_ARGS twin) that jansson parses into exactly those
 * three string members;
 * - the thread rebuilt from the kept lines (applied as the store does, agw_history_apply_lines():
 * coalesced text deltas appended raw to a message held as text) dumps to the same bytes as the
 * thread rebuilt from the events themselves, whatever the bytes.
 *
 *   tests/fuzz/build.sh _build-fuzz capture
 *   ./_build-fuzz/fuzz_capture tests/fuzz/corpus/capture */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "agw/capture.h"
#include "agw/history.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_capture: invariant broken: %s\n", what);
        abort();
    }
}

struct span {
    const char *p;
    size_t n;
};

/* The events of the input, as fed (before the CR/LF rule). */
struct events {
    struct span *v;
    size_t n;
};

static bool starts_with(const char *p, size_t n, const char *prefix)
{
    size_t k = strlen(prefix);
    return n >= k && memcmp(p, prefix, k) == 0;
}

/* <line> is event <e> with CR and LF made tabs, and a first byte that is the coalesced lines' mark
 * made AGW_CAPTURE_NOT_MARK. */
static bool is_event(const char *line, size_t n, const struct span *e)
{
    if (n != e->n)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = e->p[i] == '\n' || e->p[i] == '\r' ? '\t' : e->p[i];
        if (i == 0 && c == AGW_CAPTURE_MARK)
            c = AGW_CAPTURE_NOT_MARK;
        if (line[i] != c)
            return false;
    }
    return true;
}

static bool is_coalesced(const char *line, size_t n)
{
    struct agw_capture_delta marked, scanned;
    const char *id_key;
    json_t *v;
    bool ok;

    if (n == 0 || line[0] != AGW_CAPTURE_MARK)
        return false;
    /* read from the line's end (marked) or scanned (without the mark), its parts are the same */
    check(agw_capture_line_delta(line, n, &marked), "a marked line reads as a coalesced one");
    check(agw_capture_line_delta(line + 1, n - 1, &scanned), "its JSON is one, scanned");
    check(marked.args == scanned.args && marked.id == scanned.id &&
              marked.id_len == scanned.id_len && marked.id_escaped == scanned.id_escaped &&
              marked.delta == scanned.delta && marked.delta_len == scanned.delta_len,
          "the mark's reading is the scanner's");
    line++;
    n--;
    if (starts_with(line, n, "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\""))
        id_key = "messageId";
    else if (starts_with(line, n, "{\"type\":\"TOOL_CALL_ARGS\",\"toolCallId\":\""))
        id_key = "toolCallId";
    else
        return false;
    v = json_loadb(line, n, 0, NULL);
    ok = json_is_object(v) && json_object_size(v) == 3 &&
         json_is_string(json_object_get(v, "type")) && json_is_string(json_object_get(v, id_key)) &&
         json_is_string(json_object_get(v, "delta"));
    json_decref(v);
    return ok;
}

/* Checks the lines taken and applies them to <h> as the store does; returns how many. *<from> is
 * the first event a verbatim line may still be (the lines keep the events' order). */
static size_t take_and_apply(struct agw_capture *c, struct agw_history *h, const struct events *ev,
                             size_t *from)
{
    size_t held = agw_capture_size(c), len, lines = 0;
    char *out = agw_capture_take(c, &len, NULL);
    const char *p = out, *end;

    check((out == NULL) == (len == 0), "NULL exactly when nothing is held");
    check(len == held || len == held + 3, "agw_capture_size() is what is taken");
    check(agw_capture_size(c) == 0, "empty after a take");
    if (out == NULL)
        return 0;
    end = out + len;
    check(end[-1] == '\n', "JSON Lines end with a line break");
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)(nl - p);
        bool known = is_coalesced(p, n);

        for (size_t i = *from; !known && i < ev->n; i++) {
            if (is_event(p, n, &ev->v[i])) {
                known = true;
                *from = i + 1;
            }
        }
        check(known, "a line is an input event or a coalesced content event");
        lines++;
        p = nl + 1;
    }
    agw_history_apply_lines(h, "r1", out, len); /* as the store applies them */
    free(out);
    return lines;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct agw_history *direct, *captured;
    struct agw_capture *c;
    struct events ev = {NULL, 0};
    size_t cap, every, lines = 0, fed = 0, from = 0;
    char sep;
    const char *p, *end;
    char *a, *b;

    if (size == 0)
        return 0;
    cap = 1 + data[0] % 16;
    every = (data[0] >> 4) % 8;
    sep = data[0] & 0x80 ? 0x1e : '\n';
    p = (const char *)data + 1;
    end = (const char *)data + size;
    ev.v = malloc((size + 1) * sizeof(*ev.v));
    check(ev.v != NULL, "malloc");
    while (p < end) {
        const char *stop = memchr(p, sep, (size_t)(end - p));
        if (stop == NULL)
            stop = end;
        ev.v[ev.n].p = p;
        ev.v[ev.n].n = (size_t)(stop - p);
        ev.n++;
        p = stop + 1;
    }

    direct = agw_history_new(cap);
    captured = agw_history_new(cap);
    c = agw_capture_new();
    for (size_t i = 0; i < ev.n; i++) {
        char *copy = malloc(ev.v[i].n > 0 ? ev.v[i].n : 1);
        json_t *v, *type;

        check(copy != NULL, "malloc");
        memcpy(copy, ev.v[i].p, ev.v[i].n);
        v = json_loadb(copy, ev.v[i].n, 0, NULL);
        if (v != NULL)
            agw_history_apply(direct, "r1", v);
        type = json_object_get(v, "type");
        if (i % 2 == 1 && json_is_string(type)) /* as the relay gives what the normaliser read */
            agw_capture_typed(c, json_string_value(type), json_string_length(type), copy,
                              ev.v[i].n);
        else
            agw_capture_event(c, copy, ev.v[i].n);
        json_decref(v);
        free(copy);
        fed++;
        if (every > 0 && fed % every == 0)
            lines += take_and_apply(c, captured, &ev, &from);
    }
    lines += take_and_apply(c, captured, &ev, &from);
    check(lines <= ev.n, "no more lines than events");

    a = agw_history_dump(direct);
    b = agw_history_dump(captured);
    if (strcmp(a, b) != 0)
        fprintf(stderr, "from the events: %s\nfrom the capture: %s\n", a, b);
    check(strcmp(a, b) == 0, "the kept lines rebuild the thread the events rebuild");
    free(a);
    free(b);
    agw_history_free(direct);
    agw_history_free(captured);
    agw_capture_free(c);
    free(ev.v);
    return 0;
}
