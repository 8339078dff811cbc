/* Unit tests for src/jsonpatch.c: the examples of RFC 6902's appendix A, and what the client's
 * library refuses with its checks on. */
#include <criterion/criterion.h>

#include <string.h>

#include "agw/jsonpatch.h"

static json_t *parse(const char *text)
{
    json_error_t err;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &err);

    cr_assert_not_null(v, "bad JSON in the test: %s: %s", err.text, text);
    return v;
}

/* <doc> patched with <patch> is <want> (NULL: the patch fails). */
static void expect(const char *doc, const char *patch, const char *want)
{
    json_t *d = parse(doc), *p = parse(patch);
    int rc = agw_json_patch(&d, p);

    if (want == NULL) {
        cr_assert_eq(rc, -AGW_EINVAL, "%s on %s: should fail", patch, doc);
    } else {
        json_t *w = parse(want);
        char *got = json_dumps(d, JSON_COMPACT | JSON_ENCODE_ANY);

        cr_assert_eq(rc, 0, "%s on %s: failed", patch, doc);
        cr_assert(json_equal(d, w), "%s on %s: got %s, want %s", patch, doc, got, want);
        free(got);
        json_decref(w);
    }
    json_decref(d);
    json_decref(p);
}

Test(jsonpatch, rfc6902_appendix_a)
{
    /* A.1 to A.16 */
    expect("{\"foo\":\"bar\"}", "[{\"op\":\"add\",\"path\":\"/baz\",\"value\":\"qux\"}]",
           "{\"baz\":\"qux\",\"foo\":\"bar\"}");
    expect("{\"foo\":[\"bar\",\"baz\"]}",
           "[{\"op\":\"add\",\"path\":\"/foo/1\",\"value\":\"qux\"}]",
           "{\"foo\":[\"bar\",\"qux\",\"baz\"]}");
    expect("{\"baz\":\"qux\",\"foo\":\"bar\"}", "[{\"op\":\"remove\",\"path\":\"/baz\"}]",
           "{\"foo\":\"bar\"}");
    expect("{\"foo\":[\"bar\",\"qux\",\"baz\"]}", "[{\"op\":\"remove\",\"path\":\"/foo/1\"}]",
           "{\"foo\":[\"bar\",\"baz\"]}");
    expect("{\"baz\":\"qux\",\"foo\":\"bar\"}",
           "[{\"op\":\"replace\",\"path\":\"/baz\",\"value\":\"boo\"}]",
           "{\"baz\":\"boo\",\"foo\":\"bar\"}");
    expect("{\"foo\":{\"bar\":\"baz\",\"waldo\":\"fred\"},\"qux\":{\"corge\":\"grault\"}}",
           "[{\"op\":\"move\",\"from\":\"/foo/waldo\",\"path\":\"/qux/thud\"}]",
           "{\"foo\":{\"bar\":\"baz\"},\"qux\":{\"corge\":\"grault\",\"thud\":\"fred\"}}");
    expect("{\"foo\":[\"all\",\"grass\",\"cows\",\"eat\"]}",
           "[{\"op\":\"move\",\"from\":\"/foo/1\",\"path\":\"/foo/3\"}]",
           "{\"foo\":[\"all\",\"cows\",\"eat\",\"grass\"]}");
    expect("{\"baz\":\"qux\",\"foo\":[\"a\",2,\"c\"]}",
           "[{\"op\":\"test\",\"path\":\"/baz\",\"value\":\"qux\"},"
           "{\"op\":\"test\",\"path\":\"/foo/1\",\"value\":2}]",
           "{\"baz\":\"qux\",\"foo\":[\"a\",2,\"c\"]}");
    expect("{\"baz\":\"qux\"}", "[{\"op\":\"test\",\"path\":\"/baz\",\"value\":\"bar\"}]", NULL);
    expect("{\"foo\":\"bar\"}",
           "[{\"op\":\"add\",\"path\":\"/child\",\"value\":{\"grandchild\":{}}}]",
           "{\"foo\":\"bar\",\"child\":{\"grandchild\":{}}}");
    expect("{\"foo\":\"bar\"}",
           "[{\"op\":\"add\",\"path\":\"/baz\",\"value\":\"qux\",\"xyz\":123}]",
           "{\"foo\":\"bar\",\"baz\":\"qux\"}");
    expect("{\"foo\":\"bar\"}", "[{\"op\":\"add\",\"path\":\"/baz/bat\",\"value\":\"qux\"}]", NULL);
    expect("{\"/\":9,\"~1\":10}", "[{\"op\":\"test\",\"path\":\"/~01\",\"value\":10}]",
           "{\"/\":9,\"~1\":10}");
    expect("{\"/\":9,\"~1\":10}", "[{\"op\":\"test\",\"path\":\"/~01\",\"value\":\"10\"}]", NULL);
    expect("{\"foo\":[\"bar\"]}",
           "[{\"op\":\"add\",\"path\":\"/foo/-\",\"value\":[\"abc\",\"def\"]}]",
           "{\"foo\":[\"bar\",[\"abc\",\"def\"]]}");
}

Test(jsonpatch, the_whole_document_and_copies)
{
    expect("{\"a\":1}", "[{\"op\":\"replace\",\"path\":\"\",\"value\":[1]}]", "[1]");
    expect("{\"a\":1}", "[{\"op\":\"add\",\"path\":\"\",\"value\":{\"b\":2}}]", "{\"b\":2}");
    expect("{\"a\":1}", "[{\"op\":\"remove\",\"path\":\"\"}]", "null");
    expect("{\"a\":1}", "[{\"op\":\"test\",\"path\":\"\",\"value\":{\"a\":1.0}}]", "{\"a\":1}");
    expect("{\"a\":{\"b\":1}}",
           "[{\"op\":\"copy\",\"from\":\"/a\",\"path\":\"/c\"},"
           "{\"op\":\"replace\",\"path\":\"/c/b\",\"value\":2}]",
           "{\"a\":{\"b\":1},\"c\":{\"b\":2}}");
    expect("{\"a\":{\"b\":1}}", "[{\"op\":\"copy\",\"from\":\"\",\"path\":\"/a/c\"}]",
           "{\"a\":{\"b\":1,\"c\":{\"a\":{\"b\":1}}}}");
    expect("{\"a\":{\"b\":1}}", "[{\"op\":\"move\",\"from\":\"/a\",\"path\":\"/a\"}]",
           "{\"a\":{\"b\":1}}");
    expect("{\"a\":[1,2,3]}", "[{\"op\":\"add\",\"path\":\"/a/01\",\"value\":9}]",
           "{\"a\":[1,9,2,3]}");
    expect("{\"a\":[1,2]}", "[{\"op\":\"add\",\"path\":\"/a/2\",\"value\":3}]", "{\"a\":[1,2,3]}");
}

Test(jsonpatch, what_is_refused)
{
    static const char *const bad[] = {
        "{}",                                                        /* not an array */
        "[1]",                                                       /* not an operation */
        "[{\"op\":\"add\",\"value\":1}]",                            /* no path */
        "[{\"op\":\"add\",\"path\":\"a\",\"value\":1}]",             /* not a pointer */
        "[{\"op\":\"add\",\"path\":\"/a\"}]",                        /* no value */
        "[{\"op\":\"replace\",\"path\":\"/zz\",\"value\":1}]",       /* nothing to replace */
        "[{\"op\":\"remove\",\"path\":\"/zz\"}]",                    /* nothing to remove */
        "[{\"op\":\"remove\",\"path\":\"/l/5\"}]",                   /* past the end */
        "[{\"op\":\"add\",\"path\":\"/l/4\",\"value\":1}]",          /* past the end */
        "[{\"op\":\"add\",\"path\":\"/l/x\",\"value\":1}]",          /* not an index */
        "[{\"op\":\"add\",\"path\":\"/l/-1\",\"value\":1}]",         /* not an index */
        "[{\"op\":\"replace\",\"path\":\"/l/-\",\"value\":1}]",      /* "-" is for add */
        "[{\"op\":\"add\",\"path\":\"/o/~2\",\"value\":1}]",         /* a bad escape */
        "[{\"op\":\"add\",\"path\":\"/o/__proto__\",\"value\":1}]",  /* refused */
        "[{\"op\":\"move\",\"from\":\"/o\",\"path\":\"/o/x\"}]",     /* into itself */
        "[{\"op\":\"move\",\"from\":\"/zz\",\"path\":\"/y\"}]",      /* nothing to move */
        "[{\"op\":\"copy\",\"path\":\"/y\"}]",                       /* no from */
        "[{\"op\":\"test\",\"path\":\"/zz\",\"value\":null}]",       /* nothing to test */
        "[{\"op\":\"test\",\"path\":\"/o\",\"value\":{\"k\":[1]}}]", /* not equal */
        "[{\"op\":\"frobnicate\",\"path\":\"/o\"}]",                 /* unknown */
        "[{\"op\":\"add\",\"path\":\"/s/x\",\"value\":1}]",          /* a string has no members */
    };

    for (size_t i = 0; i < AGW_ARRAY_LEN(bad); i++)
        expect("{\"l\":[1,2,3],\"o\":{\"k\":[1,2]},\"s\":\"str\"}", bad[i], NULL);
    /* operations apply in order, and the first that fails stops the patch */
    expect("{\"a\":1}",
           "[{\"op\":\"add\",\"path\":\"/b\",\"value\":2},{\"op\":\"test\",\"path\":\"/a\","
           "\"value\":2},{\"op\":\"add\",\"path\":\"/c\",\"value\":3}]",
           NULL);
}

/* Copies of the document into itself double it each time: the copies may make as many values as
 * the document and the patch hold, plus AGW_JSON_PATCH_COPY_MARGIN, and then fail. */
Test(jsonpatch, copies_cannot_grow_the_document_without_bound)
{
    json_t *patch = json_array(), *doc = json_pack("{s:i}", "a", 1);
    size_t k;

    for (k = 0; k < 40; k++) {
        char path[16];

        snprintf(path, sizeof(path), "/k%zu", k);
        json_array_append_new(patch,
                              json_pack("{s:s, s:s, s:s}", "op", "copy", "from", "", "path", path));
    }
    cr_assert_eq(agw_json_patch(&doc, patch), -AGW_EINVAL);
    json_decref(doc);
    json_decref(patch);

    /* a copy of a subtree as large as the margin allows is made */
    doc = json_pack("{s:[]}", "big");
    for (k = 0; k < AGW_JSON_PATCH_COPY_MARGIN / 2; k++)
        json_array_append_new(json_object_get(doc, "big"), json_integer((json_int_t)k));
    patch = json_pack("[{s:s, s:s, s:s}, {s:s, s:s, s:s}]", "op", "copy", "from", "/big", "path",
                      "/c1", "op", "copy", "from", "/big", "path", "/c2");
    cr_assert_eq(agw_json_patch(&doc, patch), 0);
    cr_assert_eq(json_array_size(json_object_get(doc, "c2")), AGW_JSON_PATCH_COPY_MARGIN / 2);
    json_decref(doc);
    json_decref(patch);
}
