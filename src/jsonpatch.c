/* JSON Patch (RFC 6902) on jansson values (include/agw/jsonpatch.h). */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agw/jsonpatch.h"

/* The out-of-memory policy (include/agw/common.h): abort. */
static json_t *must(json_t *v)
{
    if (v == NULL)
        abort();
    return v;
}

/* A path or "from": "" or starting with '/'. */
static const char *pointer_of(const json_t *op, const char *key)
{
    const char *p = json_string_value(json_object_get(op, key));

    return p != NULL && (p[0] == '\0' || p[0] == '/') ? p : NULL;
}

/* The next reference token of <*p> (just past a '/'), unescaped into <buf> (<cap> bytes; the
 * caller gives at least the pointer's length + 1); <*p> moves to the '/' after it or the end.
 * False for a '~' that is not "~0" or "~1". */
static bool next_token(const char **p, char *buf)
{
    const char *s = *p;
    size_t n = 0;

    while (*s != '\0' && *s != '/') {
        if (*s == '~') {
            if (s[1] != '0' && s[1] != '1')
                return false;
            buf[n++] = s[1] == '0' ? '~' : '/';
            s += 2;
            continue;
        }
        buf[n++] = *s++;
    }
    buf[n] = '\0';
    *p = s;
    return strcmp(buf, "__proto__") != 0; /* refused, as the client's library refuses it */
}

/* An array index token: decimal digits only, leading zeros allowed. */
static bool array_index(const char *tok, size_t *i)
{
    size_t v = 0;

    if (*tok == '\0')
        return false;
    for (; *tok != '\0'; tok++) {
        if (*tok < '0' || *tok > '9' || v > (SIZE_MAX - 9) / 10)
            return false;
        v = v * 10 + (size_t)(*tok - '0');
    }
    *i = v;
    return true;
}

/* The value a container holds under token <tok>, or NULL. */
static json_t *child(json_t *c, const char *tok)
{
    size_t i;

    if (json_is_object(c))
        return json_object_get(c, tok);
    if (json_is_array(c) && array_index(tok, &i))
        return json_array_get(c, i);
    return NULL;
}

/* Resolves <path> (not "") in <doc> down to the container of its last token, copied to <last>
 * (at least strlen(path) + 1 bytes). NULL when a token before the last does not resolve. */
static json_t *parent_of(json_t *doc, const char *path, char *last)
{
    const char *p = path;
    json_t *c = doc;

    for (;;) {
        p++; /* past the '/' */
        if (!next_token(&p, last))
            return NULL;
        if (*p == '\0')
            return json_is_object(c) || json_is_array(c) ? c : NULL;
        if ((c = child(c, last)) == NULL)
            return NULL;
    }
}

/* The value at <path> in <doc>, borrowed, or NULL. */
static json_t *value_at(json_t *doc, const char *path, char *tok)
{
    json_t *parent;

    if (path[0] == '\0')
        return doc;
    parent = parent_of(doc, path, tok);
    return parent != NULL ? child(parent, tok) : NULL;
}

/* Equality by value, as the client's library compares for "test": numbers as numbers. */
static bool same(const json_t *a, const json_t *b)
{
    size_t i;
    const char *k;
    json_t *v;

    if (json_is_number(a) && json_is_number(b))
        return json_number_value(a) == json_number_value(b);
    if (json_typeof(a) != json_typeof(b))
        return false;
    switch (json_typeof(a)) {
    case JSON_OBJECT:
        if (json_object_size(a) != json_object_size(b))
            return false;
        json_object_foreach((json_t *)(uintptr_t)a, k, v)
        {
            const json_t *w = json_object_get(b, k);
            if (w == NULL || !same(v, w))
                return false;
        }
        return true;
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b))
            return false;
        for (i = 0; i < json_array_size(a); i++)
            if (!same(json_array_get(a, i), json_array_get(b, i)))
                return false;
        return true;
    case JSON_STRING:
        return json_string_length(a) == json_string_length(b) &&
               memcmp(json_string_value(a), json_string_value(b), json_string_length(a)) == 0;
    default: /* true, false, null */
        return true;
    }
}

/* The values in <v> (itself included), counting no further than <max> + 1. */
static size_t nodes(const json_t *v, size_t max)
{
    size_t n = 1, i;
    const char *k;
    json_t *c;

    if (json_is_array(v)) {
        for (i = 0; i < json_array_size(v) && n <= max; i++)
            n += nodes(json_array_get(v, i), max - n);
    } else if (json_is_object(v)) {
        json_object_foreach((json_t *)(uintptr_t)v, k, c)
        {
            if (n > max)
                break;
            n += nodes(c, max - n);
        }
    }
    return n;
}

/* Adds <v> (a reference taken) at <path> of *<doc>. */
static int add(json_t **doc, const char *path, json_t *v, char *tok)
{
    json_t *parent;
    size_t i;

    if (path[0] == '\0') {
        json_decref(*doc);
        *doc = v;
        return 0;
    }
    if ((parent = parent_of(*doc, path, tok)) == NULL)
        goto fail;
    if (json_is_object(parent)) {
        if (json_object_set_new(parent, tok, v) != 0)
            abort();
        return 0;
    }
    if (strcmp(tok, "-") == 0)
        i = json_array_size(parent);
    else if (!array_index(tok, &i) || i > json_array_size(parent))
        goto fail;
    if (json_array_insert_new(parent, i, v) != 0)
        abort();
    return 0;
fail:
    json_decref(v);
    return -AGW_EINVAL;
}

/* Removes what <path> (not "") names in <doc>. */
static int remove_at(json_t *doc, const char *path, char *tok)
{
    json_t *parent = parent_of(doc, path, tok);
    size_t i;

    if (json_is_object(parent))
        return json_object_del(parent, tok) == 0 ? 0 : -AGW_EINVAL;
    if (json_is_array(parent) && array_index(tok, &i) && i < json_array_size(parent))
        return json_array_remove(parent, i) == 0 ? 0 : -AGW_EINVAL;
    return -AGW_EINVAL;
}

/* One operation. <*copies>: the values "copy" may still make (a patch of copies of the document
 * into itself doubles it each time). */
static int apply_op(json_t **doc, const json_t *op, char *tok, size_t *copies)
{
    const char *name = json_string_value(json_object_get(op, "op"));
    const char *path = pointer_of(op, "path"), *from;
    const json_t *value = json_object_get(op, "value");
    json_t *v;
    size_t n;

    if (name == NULL || path == NULL)
        return -AGW_EINVAL;
    if (strcmp(name, "add") == 0) {
        if (value == NULL)
            return -AGW_EINVAL;
        return add(doc, path, must(json_deep_copy(value)), tok);
    }
    if (strcmp(name, "replace") == 0) {
        json_t *parent;
        size_t i;

        if (value == NULL)
            return -AGW_EINVAL;
        if (path[0] == '\0')
            return add(doc, path, must(json_deep_copy(value)), tok);
        parent = parent_of(*doc, path, tok);
        if (json_is_object(parent) && json_object_get(parent, tok) != NULL) {
            if (json_object_set_new(parent, tok, must(json_deep_copy(value))) != 0)
                abort();
            return 0;
        }
        if (json_is_array(parent) && array_index(tok, &i) && i < json_array_size(parent)) {
            if (json_array_set_new(parent, i, must(json_deep_copy(value))) != 0)
                abort();
            return 0;
        }
        return -AGW_EINVAL;
    }
    if (strcmp(name, "remove") == 0) {
        if (path[0] != '\0')
            return remove_at(*doc, path, tok);
        json_decref(*doc);
        *doc = must(json_null());
        return 0;
    }
    if (strcmp(name, "test") == 0) {
        if (value == NULL)
            return -AGW_EINVAL;
        v = value_at(*doc, path, tok);
        return v != NULL && same(v, value) ? 0 : -AGW_EINVAL;
    }
    if (strcmp(name, "move") != 0 && strcmp(name, "copy") != 0)
        return -AGW_EINVAL;
    if ((from = pointer_of(op, "from")) == NULL || (v = value_at(*doc, from, tok)) == NULL)
        return -AGW_EINVAL;
    if (name[0] == 'c') {
        size_t made = nodes(v, *copies);

        if (made > *copies)
            return -AGW_EINVAL;
        *copies -= made;
        return add(doc, path, must(json_deep_copy(v)), tok);
    }
    n = strlen(from);
    if (strcmp(from, path) == 0)
        return 0;
    if (strncmp(from, path, n) == 0 && path[n] == '/')
        return -AGW_EINVAL; /* into itself */
    json_incref(v);
    if (from[0] == '\0' || remove_at(*doc, from, tok) != 0) {
        json_decref(v);
        return -AGW_EINVAL;
    }
    return add(doc, path, v, tok);
}

int agw_json_patch(json_t **doc, const json_t *patch)
{
    size_t i, longest = 0, copies;
    const json_t *op;
    char *tok;
    int rc = 0;

    if (!json_is_array(patch))
        return -AGW_EINVAL;
    json_array_foreach(patch, i, op)
    {
        const char *p = json_string_value(json_object_get(op, "path"));
        const char *f = json_string_value(json_object_get(op, "from"));
        if (!json_is_object(op))
            return -AGW_EINVAL;
        if (p != NULL && strlen(p) > longest)
            longest = strlen(p);
        if (f != NULL && strlen(f) > longest)
            longest = strlen(f);
    }
    /* copies may make as many values as the document and the patch hold, and a margin: one
     * doubling at most, where the client's library would grow without bound */
    copies = AGW_JSON_PATCH_COPY_MARGIN;
    copies += nodes(*doc, SIZE_MAX / 4) + nodes(patch, SIZE_MAX / 4);
    tok = agw_xmalloc(longest + 1);
    json_array_foreach(patch, i, op)
    {
        if ((rc = apply_op(doc, op, tok, &copies)) != 0)
            break;
    }
    free(tok);
    return rc;
}
