/* The embedded kind of the thread-history store: SQLite in WAL mode, one row per thread
 * (src/store_backend.h, doc/internals/store.md). Used by the store's writer thread alone. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agw/log.h"
#include "store_backend.h"

struct db {
    sqlite3 *db;
    sqlite3_stmt *st_load, *st_save, *st_expire;
    int lock_fd; /* <dir>/history.lock, flock()ed while open; -1 = none */
};

static const char SCHEMA[] = "CREATE TABLE IF NOT EXISTS threads ("
                             " id TEXT PRIMARY KEY,"
                             " agents TEXT NOT NULL,"
                             " updated INTEGER NOT NULL,"
                             " data TEXT NOT NULL);"
                             "CREATE INDEX IF NOT EXISTS threads_updated ON threads(updated);";

static int db_fail(struct db *d, const char *file, const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "store.path: %s: %s: %s", file, what,
             d->db != NULL ? sqlite3_errmsg(d->db) : "cannot allocate");
    return -AGW_EIO;
}

/* mkdir -p <dir>. */
static int make_dirs(const char *dir, char *err, size_t errlen)
{
    char *p = agw_xstrdup(dir);
    int rc = 0;

    for (char *q = p + 1;; q++) {
        if (*q != '/' && *q != '\0')
            continue;
        char c = *q;
        *q = '\0';
        if (mkdir(p, 0750) != 0 && errno != EEXIST) {
            snprintf(err, errlen, "store.path: cannot create the directory %s: %s", p,
                     strerror(errno));
            rc = -AGW_EIO;
            break;
        }
        *q = c;
        if (c == '\0')
            break;
    }
    free(p);
    return rc;
}

static int db_load(void *self, const char *id, struct agw_store_row *row)
{
    struct db *d = self;
    int rc;

    sqlite3_reset(d->st_load); /* the last row's strings go now */
    sqlite3_bind_text(d->st_load, 1, id, -1, SQLITE_TRANSIENT);
    rc = sqlite3_step(d->st_load);
    if (rc == SQLITE_DONE)
        return 0;
    if (rc != SQLITE_ROW) {
        agw_log_error("thread history: cannot read thread %s: %s", id, sqlite3_errmsg(d->db));
        return -1;
    }
    row->id = id;
    row->agents = (const char *)sqlite3_column_text(d->st_load, 0);
    row->updated_s = sqlite3_column_int64(d->st_load, 1);
    row->data = (const char *)sqlite3_column_text(d->st_load, 2);
    row->len = (size_t)sqlite3_column_bytes(d->st_load, 2);
    if (row->agents == NULL)
        row->agents = ",";
    return row->data != NULL ? 1 : -1;
}

static int db_save(void *self, const struct agw_store_row *rows, size_t n, char *err, size_t errlen)
{
    struct db *d = self;
    bool ok = sqlite3_exec(d->db, "BEGIN", NULL, NULL, NULL) == SQLITE_OK;

    for (size_t i = 0; ok && i < n; i++) {
        sqlite3_bind_text(d->st_save, 1, rows[i].id, -1, SQLITE_STATIC);
        sqlite3_bind_text(d->st_save, 2, rows[i].agents, -1, SQLITE_STATIC);
        sqlite3_bind_int64(d->st_save, 3, rows[i].updated_s);
        sqlite3_bind_text(d->st_save, 4, rows[i].data, (int)rows[i].len, SQLITE_STATIC);
        ok = sqlite3_step(d->st_save) == SQLITE_DONE;
        sqlite3_reset(d->st_save);
        sqlite3_clear_bindings(d->st_save);
    }
    if (ok)
        ok = sqlite3_exec(d->db, "COMMIT", NULL, NULL, NULL) == SQLITE_OK;
    if (!ok) {
        snprintf(err, errlen, "%s", sqlite3_errmsg(d->db));
        sqlite3_exec(d->db, "ROLLBACK", NULL, NULL, NULL);
        return -1;
    }
    return 0;
}

static int64_t db_expire(void *self, int64_t cutoff_s, unsigned max)
{
    struct db *d = self;
    int64_t n;

    sqlite3_bind_int64(d->st_expire, 1, cutoff_s);
    sqlite3_bind_int(d->st_expire, 2, (int)max);
    n = sqlite3_step(d->st_expire) == SQLITE_DONE ? sqlite3_changes(d->db) : -1;
    sqlite3_reset(d->st_expire);
    return n;
}

static void db_close(void *self)
{
    struct db *d = self;

    sqlite3_finalize(d->st_load);
    sqlite3_finalize(d->st_save);
    sqlite3_finalize(d->st_expire);
    if (d->db != NULL)
        sqlite3_close(d->db);
    if (d->lock_fd >= 0)
        close(d->lock_fd);
    free(d);
}

static int db_open(struct db *d, const char *dir, char *err, size_t errlen)
{
    char file[4096];
    int v;

    if (make_dirs(dir, err, errlen) != 0)
        return -AGW_EIO;
    /* One gateway per embedded store: two writers would each hold their own idea of a thread. */
    if ((size_t)snprintf(file, sizeof(file), "%s/history.lock", dir) >= sizeof(file)) {
        snprintf(err, errlen, "store.path: too long");
        return -AGW_EINVAL;
    }
    d->lock_fd = open(file, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    if (d->lock_fd < 0) {
        snprintf(err, errlen, "store.path: %s: cannot open: %s", file, strerror(errno));
        return -AGW_EIO;
    }
    if (flock(d->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        snprintf(err, errlen,
                 "store.path: %s is in use by another gateway process (one gateway per embedded "
                 "store)",
                 dir);
        return -AGW_EIO;
    }
    if ((size_t)snprintf(file, sizeof(file), "%s/history.db", dir) >= sizeof(file)) {
        snprintf(err, errlen, "store.path: too long");
        return -AGW_EINVAL;
    }
    if (sqlite3_open_v2(file, &d->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK)
        return db_fail(d, file, "cannot open", err, errlen);
    /* The schema read tells a file that is not a database; BEGIN IMMEDIATE (a write lock) tells a
     * read-only file or directory, before any client is served. */
    sqlite3_busy_timeout(d->db, 2000);
    if (sqlite3_exec(d->db, "PRAGMA journal_mode=WAL", NULL, NULL, NULL) != SQLITE_OK)
        return db_fail(d, file, "cannot use it", err, errlen);
    if (sqlite3_exec(d->db, "PRAGMA synchronous=NORMAL; BEGIN IMMEDIATE", NULL, NULL, NULL) !=
            SQLITE_OK ||
        sqlite3_exec(d->db, SCHEMA, NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_exec(d->db, "PRAGMA user_version=1; COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        return db_fail(d, file, "cannot write to it", err, errlen);
    {
        sqlite3_stmt *st;
        if (sqlite3_prepare_v2(d->db, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK)
            return db_fail(d, file, "cannot read it", err, errlen);
        v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
        sqlite3_finalize(st);
        if (v != 1) {
            snprintf(err, errlen, "store.path: %s: schema version %d, this gateway reads 1", file,
                     v);
            return -AGW_EINVAL;
        }
    }
    if (sqlite3_prepare_v2(d->db, "SELECT agents, updated, data FROM threads WHERE id = ?1", -1,
                           &d->st_load, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(d->db,
                           "INSERT INTO threads (id, agents, updated, data) VALUES (?1, ?2, ?3, ?4)"
                           " ON CONFLICT(id) DO UPDATE SET agents = excluded.agents,"
                           " updated = excluded.updated, data = excluded.data",
                           -1, &d->st_save, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(d->db,
                           "DELETE FROM threads WHERE id IN"
                           " (SELECT id FROM threads WHERE updated < ?1 LIMIT ?2)",
                           -1, &d->st_expire, NULL) != SQLITE_OK)
        return db_fail(d, file, "cannot prepare its statements", err, errlen);
    agw_log_info("thread history: %s (SQLite %s, WAL)", file, sqlite3_libversion());
    return 0;
}

int agw_store_sqlite_open(const char *dir, struct agw_store_backend *b, char *err, size_t errlen)
{
    struct db *d = agw_xcalloc(1, sizeof(*d));
    int rc;

    d->lock_fd = -1;
    if ((rc = db_open(d, dir, err, errlen)) != 0) {
        db_close(d);
        return rc;
    }
    *b = (struct agw_store_backend){
        .self = d, .load = db_load, .save = db_save, .expire = db_expire, .close = db_close};
    return 0;
}
