/* libFuzzer driver for the thread recorder (src/history.c). Its input after the first byte is lines
 * (separated by '\n'), each one JSON document: a line starting with 'M' is a run input's messages
 * (the rest of the line, put in a body {"threadId":"t","messages":<line>} read with
 * JSON_REJECT_DUPLICATES) for agw_history_merge_input(), any other line an event for
 * agw_history_apply(); lines that are not JSON are skipped. Byte 0 picks the cap (1 + b % 16). The
 * run id changes every eight lines (chunk streams are a run's), and every eighth line has none.
 *
 * Invariants on top of the sanitizers: the thread never holds more than the cap; every message is
 * an object with a string "id"; apply returns -AGW_EINVAL, 0 or 1 and the malformed count grows by
 * one exactly on -AGW_EINVAL; a dump loads back and dumps to the same bytes; the whole input given
 * to agw_history_load() never crashes, and what it accepts dumps and loads back the same. After
 * each line a store's commit is simulated (rows outside the thread's positions deleted, the changed
 * messages written at theirs, agw_history_mark_saved()): the rows are then exactly the thread's
 * messages, and agw_history_restore*() reads them back as the same thread, with nothing changed.
 * A twin thread gets the same lines through the store's fast paths, agw_history_apply_line() for
 * events (with the capture's mark before those in its coalesced form, AGW_CAPTURE_MARK: their delta
 * is then taken unscanned) and agw_history_merge_body() for inputs (a merge line as a body's
 * "messages", merged on both as read whole with JSON_REJECT_DUPLICATES): it must stay the same
 * thread, return the same and count the same malformed input. The twin also sheds its saved texts
 * after each commit (agw_history_shed(), as the store does), reading them back from its rows when
 * it needs them: it must never fail to, and every check holds on it all the same.
 *
 *   tests/fuzz/build.sh _build-fuzz history
 *   ./_build-fuzz/fuzz_history tests/fuzz/corpus/history */
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
        fprintf(stderr, "fuzz_history: invariant broken: %s\n", what);
        abort();
    }
}

/* A store's rows, as a store that writes each message apart keeps them: the pieces
 * agw_history_message_row() gave, at their positions. */
struct row {
    uint64_t pos;
    unsigned part;
    bool text;
    char *run_id;
    char *data;
    size_t len;
};

struct rows {
    struct row *v;
    size_t n;
};

static void row_free(struct row *w)
{
    free(w->run_id);
    free(w->data);
}

static void rows_free(struct rows *r)
{
    for (size_t i = 0; i < r->n; i++)
        row_free(&r->v[i]);
    free(r->v);
    r->v = NULL;
    r->n = 0;
}

static char *dup_or_null(const char *s, size_t n)
{
    char *d;

    if (s == NULL)
        return NULL;
    d = malloc(n + 1);
    check(d != NULL, "malloc");
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* Keeps the rows for which <keep>(row, a, b) holds. */
static void rows_filter(struct rows *r, bool (*keep)(const struct row *, uint64_t, uint64_t),
                        uint64_t a, uint64_t b)
{
    size_t k = 0;

    for (size_t i = 0; i < r->n; i++) {
        if (keep(&r->v[i], a, b))
            r->v[k++] = r->v[i];
        else
            row_free(&r->v[i]);
    }
    r->n = k;
}

static bool in_range(const struct row *w, uint64_t first, uint64_t end)
{
    return w->pos >= first && w->pos < end;
}

static bool not_at(const struct row *w, uint64_t pos, uint64_t unused)
{
    (void)unused;
    return w->pos != pos;
}

/* What a store's commit does with the thread's changes: rows outside [first, first + count) go,
 * each changed message's row is written (a piece 0 replacing the message's pieces, another piece
 * added after the ones the store holds); then the thread is marked saved. */
static void commit(struct agw_history *h, struct rows *r)
{
    uint64_t first = agw_history_dropped(h), end = first + agw_history_count(h);

    rows_filter(r, in_range, first, end);
    for (size_t i = 0; i < agw_history_first_changed(h); i++)
        check(!agw_history_changed(h, i), "nothing changed before the first changed");
    for (size_t i = agw_history_first_changed(h); i < agw_history_count(h); i++) {
        struct agw_history_row row;
        const char *run = agw_history_run_id(h, i);
        size_t pieces = 0;
        struct row *w;

        if (!agw_history_changed(h, i))
            continue;
        agw_history_message_row(h, i, &row);
        for (size_t j = 0; j < r->n; j++) {
            if (r->v[j].pos != first + i)
                continue;
            pieces++;
            check(row.part == 0 || r->v[j].text == row.text, "a piece of a text is text");
        }
        if (row.part == 0) {
            check(row.drop_parts || pieces <= 1, "a message rewritten drops its other pieces");
            rows_filter(r, not_at, first + i, 0);
        } else {
            check(pieces == row.part, "a piece follows the pieces the store holds");
        }
        r->v = realloc(r->v, (r->n + 1) * sizeof(*r->v));
        check(r->v != NULL, "realloc");
        w = &r->v[r->n++];
        w->pos = first + i;
        w->part = row.part;
        w->text = row.text;
        w->run_id = row.part == 0 ? dup_or_null(run, run != NULL ? strlen(run) : 0) : NULL;
        w->data = dup_or_null(row.data != NULL ? row.data : "", row.len);
        w->len = row.len;
    }
    agw_history_mark_saved(h);
    check(agw_history_first_changed(h) == agw_history_count(h), "saved: nothing changed");
}

/* The twin's loader: the pieces at <pos> put together, as the store's backend reads them. */
static int load_rows(void *arg, uint64_t pos, char **data, size_t *len)
{
    struct rows *r = arg;
    size_t n = 0;
    char *b;

    for (unsigned part = 0;; part++) {
        size_t j;
        for (j = 0; j < r->n && !(r->v[j].pos == pos && r->v[j].part == part); j++)
            ;
        if (j == r->n)
            break;
        n += r->v[j].len;
    }
    b = malloc(n + 1);
    check(b != NULL, "malloc");
    *len = 0;
    for (unsigned part = 0;; part++) {
        size_t j;
        for (j = 0; j < r->n && !(r->v[j].pos == pos && r->v[j].part == part); j++)
            ;
        if (j == r->n)
            break;
        memcpy(b + *len, r->v[j].data, r->v[j].len);
        *len += r->v[j].len;
    }
    check(*len > 0, "a shed text is read back from rows that are there");
    b[*len] = '\0';
    *data = b;
    return 0;
}

static int by_pos(const void *a, const void *b)
{
    const struct row *x = a, *y = b;

    if (x->pos != y->pos)
        return x->pos < y->pos ? -1 : 1;
    return x->part < y->part ? -1 : x->part > y->part;
}

/* Every message is an object with a string id (read through its JSON text, which leaves a message
 * held as text as it is); the thread dumps, loads and dumps to the same bytes; and the store's rows
 * after a commit are the thread's messages at its positions, read back as the same thread, which is
 * returned (the caller may go on with it, as a store does after a restart). */
static struct agw_history *check_thread(struct agw_history *h, size_t cap, struct rows *r,
                                        bool read_all)
{
    char *s, *s2;
    struct agw_history *back;
    size_t k = 0;

    check(agw_history_count(h) <= cap, "count <= cap");
    /* (read_all false: a shed twin keeps its texts shed into the commit, which then writes pieces
     * of texts whose start is not in memory) */
    for (size_t i = 0; read_all && i < agw_history_count(h); i++) {
        size_t len;
        const char *j = agw_history_message_json(h, i, &len);
        json_t *m = json_loadb(j, len, JSON_ALLOW_NUL, NULL);
        check(j[len] == '\0', "a message's JSON ends with a NUL");
        check(json_is_object(m) && json_is_string(json_object_get(m, "id")),
              "message is an object with a string id");
        json_decref(m);
    }
    s = agw_history_dump(h);
    back = agw_history_load(s, strlen(s), cap);
    check(back != NULL, "a dump loads");
    s2 = agw_history_dump(back);
    check(strcmp(s, s2) == 0, "dump, load, dump gives the same bytes");
    free(s2);
    agw_history_free(back);

    commit(h, r);
    if (r->n > 1)
        qsort(r->v, r->n, sizeof(*r->v), by_pos);
    back = agw_history_restore(cap, agw_history_dropped(h));
    for (size_t i = 0; i < r->n;) {
        struct agw_history_row row = {NULL, 0, 0, r->v[i].text, false};
        size_t j = i, len = 0;
        char *data;

        check(r->v[i].pos == agw_history_dropped(h) + k, "rows at the thread's positions");
        check(r->v[i].part == 0, "a message's first piece is piece 0");
        while (j < r->n && r->v[j].pos == r->v[i].pos) {
            check(r->v[j].part == j - i, "a message's pieces follow each other");
            len += r->v[j].len;
            j++;
        }
        data = malloc(len + 1);
        check(data != NULL, "malloc");
        len = 0;
        for (size_t q = i; q < j; q++) {
            memcpy(data + len, r->v[q].data, r->v[q].len);
            len += r->v[q].len;
        }
        row.data = data;
        row.len = len;
        row.part = (unsigned)(j - i);
        check(agw_history_restore_message(back, r->v[i].pos, r->v[i].run_id, &row) == 0,
              "a row reads back");
        free(data);
        k++;
        i = j;
    }
    check(k == agw_history_count(h), "a row per message");
    check(agw_history_first_changed(back) == agw_history_count(back), "read back as saved");
    s2 = agw_history_dump(back);
    check(strcmp(s, s2) == 0, "the rows read back are the thread");
    free(s);
    free(s2);
    return back;
}

/* A merge line, as a RunAgentInput's "messages": <h> gets it read whole with
 * JSON_REJECT_DUPLICATES and agw_history_merge_input() (the reference), <h2> through
 * agw_history_merge_body() (the scanner's path). Both must return the same. */
static void merge_both(struct agw_history *h, struct agw_history *h2, const char *run_id,
                       const char *doc, size_t n)
{
    static const char head[] = "{\"threadId\":\"t\",\"messages\":";
    size_t len = sizeof(head) - 1 + n + 1;
    char *body = malloc(len);
    json_t *root;
    int rc = 0, rc2;

    check(body != NULL, "malloc");
    memcpy(body, head, sizeof(head) - 1);
    memcpy(body + sizeof(head) - 1, doc, n);
    body[len - 1] = '}';
    root = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
    if (root == NULL)
        rc = -AGW_EINVAL;
    else if (json_object_get(root, "messages") != NULL)
        rc = agw_history_merge_input(h, run_id, json_object_get(root, "messages"));
    check(rc >= 0 || (rc == -AGW_EINVAL &&
                      (root == NULL || !json_is_array(json_object_get(root, "messages")))),
          "merge result");
    if (root != NULL && rc < 0)
        rc = 0;
    json_decref(root);
    rc2 = agw_history_merge_body(h2, run_id, body, len);
    check(rc2 == rc, "merge_body returns what the whole body's merge returns");
    free(body);
}

/* agw_history_apply_line() of <doc>, marked as the capture marks its coalesced lines when it is
 * one in that form (as the scanner reads it): the mark's reading must be the scanner's. */
static int apply_line_as_captured(struct agw_history *h, const char *run_id, const char *doc,
                                  size_t n)
{
    struct agw_capture_delta d;
    char *marked;
    int rc;

    if (!agw_capture_line_delta(doc, n, &d))
        return agw_history_apply_line(h, run_id, doc, n);
    marked = malloc(n + 1);
    check(marked != NULL, "malloc");
    marked[0] = AGW_CAPTURE_MARK;
    memcpy(marked + 1, doc, n);
    rc = agw_history_apply_line(h, run_id, marked, n + 1);
    free(marked);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct agw_history *h, *h2, *loaded, *back, *back2;
    struct rows rows = {NULL, 0}, rows2 = {NULL, 0};
    size_t cap, line = 0;
    const char *p, *end;

    if (size == 0)
        return 0;
    loaded = agw_history_load((const char *)data, size, 8);
    if (loaded != NULL) {
        struct rows r = {NULL, 0};
        agw_history_free(check_thread(loaded, 8, &r, true));
        rows_free(&r);
        agw_history_free(loaded);
    }

    cap = 1 + data[0] % 16;
    h = agw_history_new(cap);
    h2 = agw_history_new(cap);
    agw_history_set_loader(h2, load_rows, &rows2);
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

        if (line % 8 != 7) {
            snprintf(run, sizeof(run), "r%zu", line / 8);
            run_id = run;
        }
        if (v != NULL) {
            uint64_t before = agw_history_malformed(h);
            char *a, *b;
            if (is_merge) {
                merge_both(h, h2, run_id, doc, (size_t)(stop - doc));
            } else {
                int rc = agw_history_apply(h, run_id, v);
                int rc2 = apply_line_as_captured(h2, run_id, doc, (size_t)(stop - doc));
                check(rc == -AGW_EINVAL || rc == 0 || rc == 1, "apply result");
                check((rc < 0) == (agw_history_malformed(h) == before + 1) &&
                          agw_history_malformed(h) <= before + 1,
                      "malformed counted once, only when refused");
                check(rc2 == rc, "apply_line returns what apply returns");
            }
            json_decref(v);
            back = check_thread(h, cap, &rows, true);
            back2 = check_thread(h2, cap, &rows2, line % 2 == 0);
            check(agw_history_load_errors(h2) == 0, "shed texts are always read back");
            if (line % 3 == 2) { /* a restart: both go on from what their rows read back */
                agw_history_free(h);
                agw_history_free(h2);
                h = back;
                h2 = back2;
                agw_history_set_loader(h2, load_rows, &rows2);
            } else {
                agw_history_free(back);
                agw_history_free(back2);
            }
            /* the twin forgets what it saved (all of it, or texts of 8 bytes or more) */
            agw_history_shed(h2, line % 2 == 0 ? 0 : 8);
            a = agw_history_dump(h);
            b = agw_history_dump(h2);
            check(strcmp(a, b) == 0, "the twin (merge_body, apply_line) is the same thread");
            check(agw_history_index_ok(h) && agw_history_index_ok(h2),
                  "the index by id agrees with the messages");
            check(agw_history_malformed(h) == agw_history_malformed(h2), "the twin counts alike");
            free(a);
            free(b);
        }
        line++;
        p = stop + 1;
    }
    rows_free(&rows);
    rows_free(&rows2);
    agw_history_free(h);
    agw_history_free(h2);
    return 0;
}
