/* libFuzzer driver for the legacy AG-Kit translation (src/agkit.c) as a run meets it: the input is
 * a backend's stream of event data, frames separated by NUL bytes, fed through the normaliser of an
 * "ag-kit" agent (agw_agui with AGW_PROTO_AGKIT), then the end of the stream, and each event the
 * client gets is written again for a legacy client (agw_agkit_to_legacy); the same bytes are also
 * given to both request translations, as a client's body would be (the legacy one with the bytes
 * as the thread's history too).
 *
 * Checks: every event the client gets is one JSON object with a string "type" and no line break;
 * the run starts with RUN_STARTED and has exactly one terminal event, last; the request translation
 * either refuses with a message or makes a JSON object with the thread as its conversationId.
 *
 *   tests/fuzz/build.sh _build-fuzz agkit
 *   ./_build-fuzz/fuzz_agkit tests/fuzz/corpus/agkit */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "agw/agkit.h"
#include "agw/agui.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct seen {
    size_t events, terminals;
    bool after_terminal, first_ok;
};

static void on_legacy(void *arg, const char *json, size_t len)
{
    json_t *ev;

    (void)arg;
    if (len == 6 && memcmp(json, "[DONE]", 6) == 0)
        return;
    ev = json_loadb(json, len, JSON_DECODE_INT_AS_REAL, NULL);
    if (!json_is_string(json_object_get(ev, "type")) || memchr(json, '\n', len) != NULL)
        abort();
    json_decref(ev);
}

static void on_event(void *arg, const char *json, size_t len, bool pass)
{
    struct seen *s = arg;
    json_t *ev = json_loadb(json, len, JSON_DECODE_INT_AS_REAL, NULL);
    const char *type = json_string_value(json_object_get(ev, "type"));

    (void)pass;
    if (!json_is_object(ev) || type == NULL || memchr(json, '\n', len) != NULL)
        abort();
    agw_agkit_to_legacy(json, len, on_legacy, NULL);
    if (s->events == 0)
        s->first_ok = strcmp(type, "RUN_STARTED") == 0;
    if (s->terminals > 0)
        s->after_terminal = true;
    if (strcmp(type, "RUN_FINISHED") == 0 || strcmp(type, "RUN_ERROR") == 0)
        s->terminals++;
    s->events++;
    json_decref(ev);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct seen s = {0};
    struct agw_agui *a = agw_agui_new("t1", "r1", AGW_PROTO_AGKIT);
    struct agw_agui_sink sink = {on_event, &s};
    const char *p = (const char *)data, *end = p + size;
    char err[AGW_AGKIT_ERR_MAX];
    size_t out_len = 0;
    char *out;

    while (p <= end) {
        const char *nul = memchr(p, '\0', (size_t)(end - p));
        size_t n = nul != NULL ? (size_t)(nul - p) : (size_t)(end - p);
        if (agw_agui_feed(a, p, n, &sink) != 0)
            break;
        if (nul == NULL)
            break;
        p = nul + 1;
    }
    agw_agui_end(a, &sink);
    agw_agui_free(a);
    if (!s.first_ok || s.terminals != 1 || s.after_terminal)
        abort();

    out = agw_agkit_request((const char *)data, size, &out_len, err, sizeof(err));
    if (out == NULL) {
        if (err[0] == '\0')
            abort();
    } else {
        json_t *j = json_loadb(out, out_len, 0, NULL);
        if (!json_is_object(j) || json_object_get(j, "messages") == NULL)
            abort();
        json_decref(j);
        free(out);
    }
    out = agw_agkit_legacy_to_input((const char *)data, size, "t1", "r1", (const char *)data, size,
                                    &out_len, err, sizeof(err));
    if (out == NULL) {
        if (err[0] == '\0')
            abort();
    } else {
        json_t *j = json_loadb(out, out_len, 0, NULL);
        if (!json_is_object(j) || !json_is_array(json_object_get(j, "messages")))
            abort();
        json_decref(j);
        free(out);
    }
    return 0;
}
