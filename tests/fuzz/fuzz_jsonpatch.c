/* libFuzzer driver for JSON Patch (src/jsonpatch.c), which applies the patches of the
 * ACTIVITY_DELTA events an upstream sends to a thread's activity messages. The input is two JSON
 * texts separated by the first '\n': a document and a patch (either may fail to parse: then the
 * input is only read). The patch is applied to a deep copy of the document.
 *
 * Invariants on top of the sanitizers: the document the copy was made from is unchanged (a patch
 * never reaches into the value it was not given); on success the result is a value that dumps and
 * loads back equal; applying the same patch to another copy gives the same answer and the same
 * result (no hidden state).
 *
 *   tests/fuzz/build.sh _build-fuzz jsonpatch
 *   ./_build-fuzz/fuzz_jsonpatch tests/fuzz/corpus/jsonpatch */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agw/jsonpatch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_jsonpatch: invariant broken: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data, *nl = memchr(text, '\n', size);
    json_t *doc, *patch, *before, *a, *b;
    int ra, rb;

    if (nl == NULL)
        return 0;
    doc = json_loadb(text, (size_t)(nl - text), JSON_DECODE_ANY, NULL);
    patch = json_loadb(nl + 1, size - (size_t)(nl + 1 - text), JSON_DECODE_ANY, NULL);
    if (doc == NULL || patch == NULL) {
        json_decref(doc);
        json_decref(patch);
        return 0;
    }
    before = json_deep_copy(doc);
    a = json_deep_copy(doc);
    b = json_deep_copy(doc);
    ra = agw_json_patch(&a, patch);
    rb = agw_json_patch(&b, patch);
    check(json_equal(doc, before), "the original document is unchanged");
    check(ra == 0 || ra == -AGW_EINVAL, "the answer is 0 or -AGW_EINVAL");
    check(ra == rb, "the same patch gives the same answer");
    if (ra == 0) {
        char *dump = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY);
        json_t *back;

        check(dump != NULL, "the result dumps");
        back = json_loads(dump, JSON_DECODE_ANY, NULL);
        check(back != NULL && json_equal(back, a), "the result loads back equal");
        check(json_equal(a, b), "the same patch gives the same result");
        json_decref(back);
        free(dump);
    }
    json_decref(a);
    json_decref(b);
    json_decref(before);
    json_decref(doc);
    json_decref(patch);
    return 0;
}
