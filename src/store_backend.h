/* What the thread-history store (src/store.c) needs of a durable backend: threads kept as rows of
 * (id, agents, updated, data), read one at a time, written in batches, expired by age. The embedded
 * kind is src/store_sqlite.c; the memory kind has none; a shared store (Redis) would be another.
 * Called from the store's writer thread only. Private to the store. */
#ifndef AGW_STORE_BACKEND_H
#define AGW_STORE_BACKEND_H

#include "agw/common.h"

/* One thread as stored: <data> is agw_history_dump()'s text, <agents> ",a,b,". */
struct agw_store_row {
    const char *id;
    const char *agents;
    int64_t updated_s; /* Unix seconds of the last change */
    const char *data;
    size_t len;
};

struct agw_store_backend {
    void *self; /* NULL: no backend (the memory kind) */
    /* Thread <id>: 1 with <row> filled (its strings valid until the next call), 0 when unknown,
     * -1 when it cannot be read (logged). */
    int (*load)(void *self, const char *id, struct agw_store_row *row);
    /* Writes <n> rows (each replacing the row of its id) in one transaction: 0, or -1 with nothing
     * written and the cause in <err>. */
    int (*save)(void *self, const struct agw_store_row *rows, size_t n, char *err, size_t errlen);
    /* Deletes at most <max> rows last changed before <cutoff_s>: how many, or -1. */
    int64_t (*expire)(void *self, int64_t cutoff_s, unsigned max);
    void (*close)(void *self);
};

/* The embedded kind: <dir>/history.db (SQLite, WAL), <dir> made when missing, <dir>/history.lock
 * held (one gateway per directory). 0, or -AGW_E* with a message naming the file in <err>. */
int agw_store_sqlite_open(const char *dir, struct agw_store_backend *b, char *err, size_t errlen);

#endif
