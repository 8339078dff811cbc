/* The store's SQLite VFS (src/store_vfs.c): a database written through it, with pages gathered
 * and written directly, holds exactly what the same statements leave in a database written by
 * SQLite's own VFS, whatever SQLite does between its writes (a cache of a few pages makes it spill
 * and read pages again in the middle of a transaction; rollbacks; a file grown and shrunk); a
 * write the file system refuses fails the commit and leaves the database as it was. The files are
 * made in the working directory (the build tree, on a disk: a tmpfs refuses O_DIRECT). */
#include "config.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <sqlite3.h>

#include "../../src/store_vfs.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "agw-vfs.XXXXXX");
    cr_assert(mkdtemp(dir) != NULL);
}

static void teardown(void)
{
    char cmd[128];

    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(store_vfs, .init = setup, .fini = teardown);

/* Whether the file system of <dir> takes direct writes (the VFS's own probe is its open). */
static bool dir_takes_direct(void)
{
    char path[128];
    void *buf;
    int fd;
    bool ok;

    snprintf(path, sizeof(path), "%s/probe", dir);
    fd = open(path, O_WRONLY | O_CREAT | O_DIRECT, 0600);
    if (fd < 0)
        return false;
    cr_assert_eq(posix_memalign(&buf, 4096, 4096), 0);
    memset(buf, 0, 4096);
    ok = pwrite(fd, buf, 4096, 0) == 4096;
    free(buf);
    close(fd);
    unlink(path);
    return ok;
}

static sqlite3 *open_db(const char *name, const char *vfs, int page_size, int cache_pages)
{
    char path[160], sql[512];
    sqlite3 *db;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    cr_assert_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, vfs),
                 SQLITE_OK);
    snprintf(sql, sizeof(sql),
             "PRAGMA page_size=%d; PRAGMA journal_mode=TRUNCATE; PRAGMA synchronous=FULL;"
             " PRAGMA cache_size=%d;"
             " CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v BLOB NOT NULL);"
             " CREATE INDEX IF NOT EXISTS t_v ON t(substr(v, 1, 8));",
             page_size, cache_pages);
    cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
    return db;
}

static void exec(sqlite3 *db, const char *sql)
{
    cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK, "%s: %s", sql,
                 sqlite3_errmsg(db));
}

static void put(sqlite3 *db, sqlite3_stmt *st, int k, const unsigned char *v, int n)
{
    (void)db;
    sqlite3_bind_int(st, 1, k);
    sqlite3_bind_blob(st, 2, v, n, SQLITE_STATIC);
    cr_assert_eq(sqlite3_step(st), SQLITE_DONE);
    sqlite3_reset(st);
}

/* A hash of every row, in key order. */
static unsigned long long digest(sqlite3 *db, int *rows)
{
    sqlite3_stmt *st;
    unsigned long long h = 14695981039346656037ULL;

    *rows = 0;
    cr_assert_eq(sqlite3_prepare_v2(db, "SELECT k, v FROM t ORDER BY k", -1, &st, NULL), SQLITE_OK);
    while (sqlite3_step(st) == SQLITE_ROW) {
        const unsigned char *v = sqlite3_column_blob(st, 1);
        int n = sqlite3_column_bytes(st, 1);
        h = (h ^ (unsigned long long)sqlite3_column_int(st, 0)) * 1099511628211ULL;
        for (int i = 0; i < n; i++)
            h = (h ^ v[i]) * 1099511628211ULL;
        (*rows)++;
    }
    sqlite3_finalize(st);
    return h;
}

static void expect_intact(sqlite3 *db)
{
    sqlite3_stmt *st;

    cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "ok");
    sqlite3_finalize(st);
}

/* The same random transactions (inserts and replacements of values from a few bytes to several
 * pages, deletions, some rolled back) on two databases, one per VFS, with a cache of 8 pages: the
 * rows are the same, and the same once both are opened again. */
static void same_as_sqlite(int page_size)
{
    const char *vfs = agw_store_vfs_name();
    sqlite3 *a, *b;
    sqlite3_stmt *sa, *sb, *da, *db_;
    static unsigned char v[300 * 1024];
    unsigned seed = 12345;
    unsigned long long ha, hb;
    int ra, rb;

    cr_assert_not_null(vfs);
    a = open_db("direct.db", vfs, page_size, 8);
    b = open_db("plain.db", NULL, page_size, 8);
    cr_assert_eq(sqlite3_prepare_v2(a, "INSERT OR REPLACE INTO t VALUES (?1, ?2)", -1, &sa, NULL),
                 SQLITE_OK);
    cr_assert_eq(sqlite3_prepare_v2(b, "INSERT OR REPLACE INTO t VALUES (?1, ?2)", -1, &sb, NULL),
                 SQLITE_OK);
    cr_assert_eq(sqlite3_prepare_v2(a, "DELETE FROM t WHERE k % 7 = ?1", -1, &da, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_prepare_v2(b, "DELETE FROM t WHERE k % 7 = ?1", -1, &db_, NULL),
                 SQLITE_OK);
    for (size_t i = 0; i < sizeof(v); i++)
        v[i] = (unsigned char)(i * 31 + i / 977);
    for (int tx = 0; tx < 60; tx++) {
        bool rollback = rand_r(&seed) % 6 == 0;
        exec(a, "BEGIN IMMEDIATE");
        exec(b, "BEGIN IMMEDIATE");
        for (int op = 0, ops = 1 + rand_r(&seed) % 12; op < ops; op++) {
            int k = rand_r(&seed) % 200, n;
            switch (rand_r(&seed) % 4) {
            case 0: /* a long value: a chain of overflow pages */
                n = (int)(rand_r(&seed) % sizeof(v));
                break;
            case 1:
                n = 1 + rand_r(&seed) % (2 * page_size);
                break;
            default:
                n = 1 + rand_r(&seed) % 100;
            }
            v[0] = (unsigned char)tx; /* values differ from one transaction to the next */
            put(a, sa, k, v + (k % 64), n);
            put(b, sb, k, v + (k % 64), n);
        }
        if (tx % 9 == 8) { /* the file's pages freed, and taken again later */
            int r = rand_r(&seed) % 7;
            sqlite3_bind_int(da, 1, r);
            sqlite3_bind_int(db_, 1, r);
            cr_assert_eq(sqlite3_step(da), SQLITE_DONE);
            cr_assert_eq(sqlite3_step(db_), SQLITE_DONE);
            sqlite3_reset(da);
            sqlite3_reset(db_);
        }
        exec(a, rollback ? "ROLLBACK" : "COMMIT");
        exec(b, rollback ? "ROLLBACK" : "COMMIT");
        if (tx == 40) { /* the file shrinks (the freed pages go) */
            exec(a, "VACUUM");
            exec(b, "VACUUM");
        }
        ha = digest(a, &ra);
        hb = digest(b, &rb);
        cr_assert_eq(ra, rb, "transaction %d", tx);
        cr_assert_eq(ha, hb, "transaction %d: the rows differ", tx);
    }
    sqlite3_finalize(sa);
    sqlite3_finalize(sb);
    sqlite3_finalize(da);
    sqlite3_finalize(db_);
    cr_assert_eq(sqlite3_close(a), SQLITE_OK);
    cr_assert_eq(sqlite3_close(b), SQLITE_OK);
    a = open_db("direct.db", NULL, page_size, 8); /* read back by SQLite alone */
    b = open_db("plain.db", NULL, page_size, 8);
    expect_intact(a);
    cr_assert_eq(digest(a, &ra), digest(b, &rb));
    cr_assert_eq(ra, rb);
    sqlite3_close(a);
    sqlite3_close(b);
}

Test(store_vfs, a_database_written_directly_holds_what_sqlite_would_have_written)
{
    uint64_t direct = agw_store_vfs_direct_bytes(), buffered = agw_store_vfs_buffered_writes();

    same_as_sqlite(65536);
    if (dir_takes_direct()) {
        cr_assert_gt(agw_store_vfs_direct_bytes() - direct, 10u << 20, "pages written directly");
        cr_assert_eq(agw_store_vfs_buffered_writes(), buffered,
                     "no page of 64 KiB through the page cache");
    } else { /* the same through the page cache */
        cr_assert_eq(agw_store_vfs_direct_bytes(), direct);
        cr_assert_gt(agw_store_vfs_buffered_writes(), buffered);
    }
}

/* Pages of 4 KiB are written directly too; of 1 KiB (not whole blocks) through the page cache. */
Test(store_vfs, small_pages)
{
    uint64_t buffered = agw_store_vfs_buffered_writes();

    same_as_sqlite(4096);
    if (dir_takes_direct())
        cr_assert_eq(agw_store_vfs_buffered_writes(), buffered);
    teardown();
    setup();
    buffered = agw_store_vfs_buffered_writes();
    same_as_sqlite(1024);
    cr_assert_gt(agw_store_vfs_buffered_writes(), buffered);
}

Test(store_vfs, without_direct_writes_the_same)
{
    uint64_t direct = agw_store_vfs_direct_bytes();

    agw_store_vfs_set_direct(false);
    same_as_sqlite(65536);
    cr_assert_eq(agw_store_vfs_direct_bytes(), direct);
}

/* A commit whose pages the file system refuses (the file size limit here: EFBIG, as a full disk's
 * ENOSPC) fails; the database keeps what the commits before it wrote, intact, and takes the next
 * commit once it may grow again. */
Test(store_vfs, a_refused_write_fails_the_commit_and_loses_nothing_committed)
{
    sqlite3 *db = open_db("full.db", agw_store_vfs_name(), 65536, 8);
    sqlite3_stmt *st;
    static unsigned char v[2 << 20];
    struct rlimit lim;
    unsigned long long before;
    int rows, rc;

    memset(v, 'x', sizeof(v));
    cr_assert_eq(sqlite3_prepare_v2(db, "INSERT INTO t VALUES (?1, ?2)", -1, &st, NULL), SQLITE_OK);
    put(db, st, 1, v, 100 * 1024);
    before = digest(db, &rows);
    cr_assert_eq(rows, 1);
    signal(SIGXFSZ, SIG_IGN);
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &lim), 0);
    lim.rlim_cur = 1 << 20; /* the file may not pass 1 MiB */
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    exec(db, "BEGIN IMMEDIATE");
    sqlite3_bind_int(st, 1, 2);
    sqlite3_bind_blob(st, 2, v, (int)sizeof(v), SQLITE_STATIC);
    rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc == SQLITE_DONE)
        rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    cr_assert_neq(rc, SQLITE_OK, "a commit past the limit fails");
    cr_assert_neq(rc, SQLITE_DONE);
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL); /* (already rolled back, as may be) */
    lim.rlim_cur = lim.rlim_max;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    expect_intact(db);
    cr_assert_eq(digest(db, &rows), before);
    cr_assert_eq(rows, 1);
    put(db, st, 2, v, (int)sizeof(v)); /* room again */
    digest(db, &rows);
    cr_assert_eq(rows, 2);
    sqlite3_finalize(st);
    cr_assert_eq(sqlite3_close(db), SQLITE_OK);
    db = open_db("full.db", NULL, 65536, 8);
    expect_intact(db);
    digest(db, &rows);
    cr_assert_eq(rows, 2);
    sqlite3_close(db);
}

/* A commit's pages are gathered into few writes, although SQLite, its cache full, writes them one
 * at a time between reads of other pages and the growth of the file: here 40 values of 100 KB,
 * each a chain of overflow pages, in one transaction with a cache of 8 pages: 4 MB in writes of
 * 512 KiB or more on average (page by page, 64 KiB). */
Test(store_vfs, a_commit_is_written_in_few_writes)
{
    sqlite3 *db = open_db("few.db", agw_store_vfs_name(), 65536, 8);
    sqlite3_stmt *st;
    static unsigned char v[100 * 1024];
    uint64_t bytes = agw_store_vfs_direct_bytes(), writes = agw_store_vfs_direct_writes();

    cr_assert_eq(sqlite3_prepare_v2(db, "INSERT INTO t VALUES (?1, ?2)", -1, &st, NULL), SQLITE_OK);
    exec(db, "BEGIN IMMEDIATE");
    for (int k = 0; k < 40; k++) {
        memset(v, 'a' + k % 26, sizeof(v));
        put(db, st, k, v, (int)sizeof(v));
    }
    exec(db, "COMMIT");
    sqlite3_finalize(st);
    sqlite3_close(db);
    bytes = agw_store_vfs_direct_bytes() - bytes;
    writes = agw_store_vfs_direct_writes() - writes;
    if (!dir_takes_direct()) { /* all of it through the page cache */
        cr_assert_eq(bytes, 0);
        return;
    }
    cr_assert_geq(bytes, 40u * 100 * 1024);
    cr_assert_geq(bytes / writes, 512u * 1024, "%" PRIu64 " bytes in %" PRIu64 " writes", bytes,
                  writes);
}
