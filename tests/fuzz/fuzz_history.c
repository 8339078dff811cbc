/* libFuzzer driver for the thread recorder (src/history.c). Its input after the first byte is lines
 * (separated by '\n'), each one JSON document: a line starting with 'M' is a run input's messages
 * (the rest of the line) for agw_history_merge_input(), any other line an event for
 * agw_history_apply(); lines that are not JSON are skipped. Byte 0 picks the cap (1 + b % 16). The
 * run id changes every line, and every fourth line has none.
 *
 * Invariants on top of the sanitizers: the thread never holds more than the cap; every message is
 * an object with a string "id"; apply returns -AGW_EINVAL, 0 or 1 and the malformed count grows by
 * one exactly on -AGW_EINVAL; a dump loads back and dumps to the same bytes; the whole input given
 * to agw_history_load() never crashes, and what it accepts dumps and loads back the same.
 *
 *   tests/fuzz/build.sh _build-fuzz history
 *   ./_build-fuzz/fuzz_history tests/fuzz/corpus/history */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "agw/history.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_history: invariant broken: %s\n", what);
        abort();
    }
}

static void check_thread(const struct agw_history *h, size_t cap)
{
    char *s, *s2;
    struct agw_history *back;

    check(agw_history_count(h) <= cap, "count <= cap");
    for (size_t i = 0; i < agw_history_count(h); i++) {
        const json_t *m = agw_history_message(h, i);
        check(json_is_object(m) && json_is_string(json_object_get(m, "id")),
              "message is an object with a string id");
    }
    s = agw_history_dump(h);
    back = agw_history_load(s, strlen(s), cap);
    check(back != NULL, "a dump loads");
    s2 = agw_history_dump(back);
    check(strcmp(s, s2) == 0, "dump, load, dump gives the same bytes");
    free(s);
    free(s2);
    agw_history_free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct agw_history *h, *loaded;
    size_t cap, line = 0;
    const char *p, *end;

    if (size == 0)
        return 0;
    loaded = agw_history_load((const char *)data, size, 8);
    if (loaded != NULL) {
        check_thread(loaded, 8);
        agw_history_free(loaded);
    }

    cap = 1 + data[0] % 16;
    h = agw_history_new(cap);
    p = (const char *)data + 1;
    end = (const char *)data + size;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *stop = nl != NULL ? nl : end;
        bool is_merge = p < stop && *p == 'M';
        const char *doc = is_merge ? p + 1 : p;
        char run[24];
        const char *run_id = NULL;
        json_t *v = json_loadb(doc, (size_t)(stop - doc), JSON_DECODE_ANY, NULL);

        if (line % 4 != 3) {
            snprintf(run, sizeof(run), "r%zu", line);
            run_id = run;
        }
        if (v != NULL) {
            uint64_t before = agw_history_malformed(h);
            if (is_merge) {
                int rc = agw_history_merge_input(h, run_id, v);
                check(rc >= 0 || (rc == -AGW_EINVAL && !json_is_array(v)), "merge result");
            } else {
                int rc = agw_history_apply(h, run_id, v);
                check(rc == -AGW_EINVAL || rc == 0 || rc == 1, "apply result");
                check((rc < 0) == (agw_history_malformed(h) == before + 1) &&
                          agw_history_malformed(h) <= before + 1,
                      "malformed counted once, only when refused");
            }
            json_decref(v);
            check_thread(h, cap);
        }
        line++;
        p = stop + 1;
    }
    agw_history_free(h);
    return 0;
}
