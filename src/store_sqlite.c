/* The embedded kind of the thread-history store: SQLite with a rollback journal, a row per thread
 * and a row per message (src/store_backend.h, doc/internals/store.md). Used by the store's writer
 * thread alone. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agw/bloom.h"
#include "agw/history.h"
#include "agw/log.h"
#include "store_backend.h"
#include "store_texts.h"
#include "store_vfs.h"

#define SCHEMA_VERSION 5
/* Pages of 64 KiB, SQLite's largest (its default is 4 KiB): a commit appends a few hundred
 * kilobytes of new messages, a streamed answer is hundreds of kilobytes in a chain of overflow
 * pages; fewer, bigger pages are fewer to write. Measured with the benchmark's records: the
 * writer's CPU per run is about 25 % lower than with 4 KiB pages on short chat runs, over half
 * lower on long streamed ones (doc/internals/store.md). Only a new database takes it (an existing
 * one keeps its page size).
 *
 * A rollback journal (TRUNCATE), not a write-ahead log: the writer thread is the database's only
 * user, so WAL's readers-beside-the-writer buy nothing, while WAL writes every byte twice (to the
 * log, then to the database at the checkpoint). With a rollback journal a commit writes the pages
 * it adds (a streamed answer's, mostly) once, and journals only the original content of the pages
 * it changes: the writer's CPU under the streaming benchmark fell by a quarter. synchronous=FULL:
 * each commit is on disk when it returns, and the database survives a power loss too. */
#define PAGE_SIZE_PRAGMA "PRAGMA page_size=65536"
/* A thread's messages new to the database that a commit writes side by side (positions where no row
 * holds a message) share one row, up to this many: one insert rather than one each (see
 * save_shared()). A load looks this far back for the shared row that holds its first position. */
#define SHARED_MAX     64
#define SHARED_MAX_STR "64"

struct db {
    sqlite3 *db;
    sqlite3_stmt *st_thread, *st_messages, *st_message, *st_thread_key, *st_update_thread,
        *st_insert_thread, *st_drop_before, *st_drop_from, *st_save_message, *st_drop_parts,
        *st_expire, *st_max_key, *st_scan_ids, *st_segments, *st_segment_size, *st_gc_next,
        *st_gc_count, *st_gc_drop, *st_gc_rows, *st_gc_move, *st_gc_forget, *st_piece,
        *st_save_shared, *st_shared_before, *st_shared_at;
    /* Pieces of AGW_TEXTS_MIN bytes or more: in the segments (src/store_texts.h). */
    struct agw_texts *texts;
    size_t texts_min;
    int texts_errno; /* why an append or a sync failed in this transaction (0: none did) */
    uint64_t gc_seg; /* the segment the collection looked at last */
    int64_t gc_ms;   /* when */
    /* Threads new to the database (doc/internals/store.md): once <known> is set, every id in the
     * threads table is in it, so a look-up of an id it has never seen reads nothing. <building>
     * is filled by a scan of the table in steps (known_step(), after each commit) and replaces
     * <known> when the scan ends; both take every id inserted meanwhile. */
    struct agw_bloom *known, *building;
    sqlite3_int64 scan_key; /* the scan has added the ids of the keys up to this one */
    char *buf;              /* a message's pieces put together, read back */
    size_t buf_len, buf_cap;
    unsigned char *shared; /* a shared row being written, or read back (its own copy) */
    size_t shared_len, shared_cap;
    int lock_fd; /* <dir>/history.lock, flock()ed while open; -1 = none */
    /* history.db again, read-only, for posix_fadvise() alone (db_shed()); -1 = none. Closed only
     * after SQLite's handle: closing a descriptor of the file drops the process's POSIX locks on
     * it, SQLite's included. */
    int data_fd;
    off_t shed_from; /* the file's size after the last commit: what lies past it is new */
    off_t shed_prev; /* the size before the last commit: the pages it appended lie past it */
};

/* Schema 4: a row per thread and a row per message piece, keyed by the thread's number, the
 * message's position in the thread's life and the piece's number (a message is one piece, but for
 * a text that grew over several commits: what it grew by was added as a piece). <text>: the pieces
 * lack the text's closing '"}'. The trigger deletes a thread's messages with it (the ttl). A piece
 * of AGW_TEXTS_MIN bytes or more is not in its row: <data> is empty and <seg>, <off>, <len> say
 * where in the segment files it is (src/store_texts.h); <segments> lists those files and the bytes
 * of each that are committed, and <pieces> each segment's pieces (for its collection, db_gc()).
 * Schema 3 was the same without them.
 *
 * A thread's number (<key>, its rowid) is given in the order threads are first written, so the
 * messages of the threads in use lie together at the end of the messages' index, whatever their
 * ids. Schema 2 keyed messages by the thread's id: clients draw ids at random (UUIDs), so each
 * commit inserted into pages all over the index, and journaled each whole 64 KiB page it touched;
 * the writer's cost per run grew with the database (writer micro-benchmark, 2 message rows and a
 * thread row per run: 8.7 us at 30,000 runs, 10.2 at 100,000, 12.3 at 300,000; schema 3: 4.6,
 * 5.1, 6.3). See doc/internals/store.md. */
/* The pieces apart, by segment: what the collection counts and moves (db_gc()). Its own table,
 * written only with a piece apart, rather than an index of <messages>; nor does a trigger keep it:
 * an index of that table is written, and a trigger on it run, by the upserts of nearly every
 * commit, and either cost the writer about 2,000 instructions per short run (6 %; callgrind), whose
 * texts are all in their rows. So an entry may outlive its piece (the row deleted, or given other
 * bytes): the collection counts only the entries whose row still points at them, and deletes the
 * others with their segment. Keyed by its place in its segment (unique: appends do not overlap);
 * the row it was written for by its key (thread, pos, part), which a VACUUM keeps. */
#define SCHEMA_TEXTS                                                                               \
    "CREATE TABLE IF NOT EXISTS segments (seg INTEGER PRIMARY KEY, size INTEGER NOT NULL);"        \
    "CREATE TABLE IF NOT EXISTS pieces (seg INTEGER NOT NULL, off INTEGER NOT NULL,"               \
    " len INTEGER NOT NULL, thread INTEGER NOT NULL, pos INTEGER NOT NULL, part INTEGER NOT NULL," \
    " PRIMARY KEY (seg, off)) WITHOUT ROWID;"
static const char SCHEMA[] = "CREATE TABLE IF NOT EXISTS threads ("
                             " key INTEGER PRIMARY KEY,"
                             " id TEXT NOT NULL UNIQUE,"
                             " agents TEXT NOT NULL,"
                             " updated INTEGER NOT NULL,"
                             " dropped INTEGER NOT NULL,"
                             " n_messages INTEGER NOT NULL);"
                             "CREATE INDEX IF NOT EXISTS threads_updated ON threads(updated);"
                             "CREATE TABLE IF NOT EXISTS messages ("
                             " thread INTEGER NOT NULL,"
                             " pos INTEGER NOT NULL,"
                             " part INTEGER NOT NULL,"
                             " run_id TEXT,"
                             " text INTEGER NOT NULL,"
                             " data TEXT NOT NULL,"
                             " seg INTEGER, off INTEGER, len INTEGER,"
                             " n INTEGER,"
                             " PRIMARY KEY (thread, pos, part));" SCHEMA_TEXTS
                             "CREATE TRIGGER IF NOT EXISTS threads_delete AFTER DELETE ON threads"
                             " BEGIN DELETE FROM messages WHERE thread = old.key; END;";

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

/* Adds the piece of the row <st> is on to the <*n> bytes of <*b> (<*cap> allocated, room kept for a
 * '\0'): its bytes are the row's column <col>, or, when the next column names a segment, the <len>
 * bytes at <off> there (columns <col> + 1 to + 3). false when they cannot be read. */
static bool add_piece(struct db *d, sqlite3_stmt *st, int col, char **b, size_t *n, size_t *cap)
{
    const char *data = (const char *)sqlite3_column_text(st, col);
    size_t len = (size_t)sqlite3_column_bytes(st, col);
    bool apart = sqlite3_column_type(st, col + 1) != SQLITE_NULL;
    sqlite3_int64 seg = 0, off = 0;

    if (data == NULL)
        return false;
    if (apart) {
        sqlite3_int64 l = sqlite3_column_int64(st, col + 3);
        seg = sqlite3_column_int64(st, col + 1);
        off = sqlite3_column_int64(st, col + 2);
        if (seg <= 0 || off < 0 || l < 0 || (uint64_t)l > (uint64_t)INT32_MAX)
            return false;
        len = (size_t)l;
    }
    if (*cap - *n < len + 1) {
        *cap = (*n + len + 1) * 2;
        *b = agw_xrealloc(*b, *cap);
    }
    if (apart) {
        if (agw_texts_read(d->texts, (uint64_t)seg, (uint64_t)off, len, *b + *n) != 0)
            return false;
    } else {
        memcpy(*b + *n, data, len);
    }
    *n += len;
    return true;
}

/* Gives <fn> the message <m> whose pieces <d->buf> holds, of run <run>. */
static void give(struct db *d, agw_store_msg_fn *fn, void *arg, struct agw_store_msg *m,
                 const char *run)
{
    d->buf[d->buf_len] = '\0';
    m->data = d->buf;
    m->len = d->buf_len;
    m->run_id = run;
    fn(arg, m);
}

/* ---- rows that several messages share ------------------------------------------------------
 * Part -1 at the position of the first, <n> messages; its data is, for each, a head of 7 bytes
 * (the data's length, 4 bytes little-endian; flags: 1 a text, 2 a run id; the run id's length, 2
 * bytes) then the run id and the data. A message written later at one of those positions (edited,
 * moved, or grown by a piece) has its own row there, which comes first; of two shared rows that
 * hold a position, the one that begins later is the newer (a shared row begins where the thread
 * then ended, and a thread that shrinks deletes the rows that begin past its end). A shared row's
 * positions below the thread's first (the cap dropped them) or past its end are not read. */
#define SHARED_HEAD 7
#define SHARED_TEXT 1u
#define SHARED_RUN  2u

struct shared_entry {
    const char *data, *run; /* <run> NULL: none */
    size_t len, run_len;
    bool text;
};

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;

    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* The entry at <pos> of the shared row that begins at <start>, holds <n> messages and whose data
 * is <b> (<len> bytes): false when it holds none there, or its data is not well formed. */
static bool shared_entry_at(const unsigned char *b, size_t len, sqlite3_int64 start,
                            sqlite3_int64 n, uint64_t pos, struct shared_entry *e)
{
    size_t at = 0;

    if (b == NULL || n < 2 || n > SHARED_MAX || start < 0 || pos < (uint64_t)start ||
        pos >= (uint64_t)start + (uint64_t)n)
        return false;
    for (uint64_t i = (uint64_t)start;; i++) {
        size_t dl, rl;
        if (len - at < SHARED_HEAD)
            return false;
        dl = (size_t)get_le(b + at, 4);
        rl = (size_t)get_le(b + at + 5, 2);
        if (len - at - SHARED_HEAD < rl || len - at - SHARED_HEAD - rl < dl)
            return false;
        if (i == pos) {
            e->text = (b[at + 4] & SHARED_TEXT) != 0;
            e->run = (b[at + 4] & SHARED_RUN) != 0 ? (const char *)b + at + SHARED_HEAD : NULL;
            e->run_len = rl;
            e->data = (const char *)b + at + SHARED_HEAD + rl;
            e->len = dl;
            return true;
        }
        at += SHARED_HEAD + rl + dl;
    }
}

/* Whether <b> (<len> bytes) is the data of a shared row of <n> messages, each well formed. */
static bool shared_valid(const unsigned char *b, size_t len, sqlite3_int64 n)
{
    size_t at = 0;

    if (b == NULL || n < 2 || n > SHARED_MAX)
        return false;
    for (sqlite3_int64 i = 0; i < n; i++) {
        size_t dl, rl;
        if (len - at < SHARED_HEAD)
            return false;
        dl = (size_t)get_le(b + at, 4);
        rl = (size_t)get_le(b + at + 5, 2);
        if ((b[at + 4] & ~(SHARED_TEXT | SHARED_RUN)) != 0 || len - at - SHARED_HEAD < rl ||
            len - at - SHARED_HEAD - rl < dl)
            return false;
        at += SHARED_HEAD + rl + dl;
    }
    return at == len;
}

/* The shared row <st> is on (columns: its position, data, count) copied into <d->shared>, its
 * start and count in *<start> and *<n>; false when it cannot be read. */
static bool take_shared(struct db *d, sqlite3_stmt *st, sqlite3_int64 *start, sqlite3_int64 *n)
{
    const void *b = sqlite3_column_blob(st, 1);
    size_t len = (size_t)sqlite3_column_bytes(st, 1);

    if (!shared_valid(b, len, sqlite3_column_int64(st, 2)))
        return false;
    if (len > d->shared_cap) {
        d->shared_cap = len * 2;
        free(d->shared);
        d->shared = agw_xmalloc(d->shared_cap);
    }
    if (len > 0)
        memcpy(d->shared, b, len);
    d->shared_len = len;
    *start = sqlite3_column_int64(st, 0);
    *n = sqlite3_column_int64(st, 2);
    return true;
}

/* Starts message <m> at <pos> from entry <e> of a shared row: its first piece in <d->buf>. */
static void start_from_entry(struct db *d, struct agw_store_msg *m, char **run, uint64_t pos,
                             const struct shared_entry *e)
{
    if (d->buf_cap < e->len + 1) {
        d->buf_cap = (e->len + 1) * 2;
        d->buf = agw_xrealloc(d->buf, d->buf_cap);
    }
    memcpy(d->buf, e->data, e->len);
    d->buf_len = e->len;
    m->pos = pos;
    m->text = e->text;
    m->part = 1;
    *run = e->run != NULL ? agw_xstrndup(e->run, e->run_len) : NULL;
}

/* Gives <fn> the messages at positions [*<next>, <upto>) the shared row in <d->shared> (beginning
 * at <start>, <n> messages) holds, and moves *<next> to <upto>. A position it does not hold has no
 * message (as one no row holds). */
static void give_shared(struct db *d, sqlite3_int64 start, sqlite3_int64 n, uint64_t *next,
                        uint64_t upto, agw_store_msg_fn *fn, void *arg)
{
    for (; *next < upto; (*next)++) {
        struct agw_store_msg m = {.part = 0};
        struct shared_entry e;
        char *run;
        if (!shared_entry_at(d->shared, d->shared_len, start, n, *next, &e))
            continue;
        start_from_entry(d, &m, &run, *next, &e);
        give(d, fn, arg, &m, run);
        free(run);
    }
}

static int db_load(void *self, const char *id, size_t max, struct agw_store_row *row,
                   agw_store_msg_fn *fn, void *arg)
{
    struct db *d = self;
    struct agw_store_msg m = {.part = 0};
    char *run = NULL;
    sqlite3_int64 from, key, sh_start = 0, sh_n = 0;
    uint64_t next, end;
    bool ok = true, past = false;
    int rc;

    sqlite3_reset(d->st_thread); /* the last row's strings go now */
    sqlite3_bind_text(d->st_thread, 1, id, -1, SQLITE_TRANSIENT);
    rc = sqlite3_step(d->st_thread);
    if (rc == SQLITE_DONE)
        return 0;
    if (rc != SQLITE_ROW)
        goto fail;
    *row = (struct agw_store_row){
        .id = id,
        .agents = (const char *)sqlite3_column_text(d->st_thread, 1),
        .updated_s = sqlite3_column_int64(d->st_thread, 2),
        .first = (uint64_t)sqlite3_column_int64(d->st_thread, 3),
        .count = (uint64_t)sqlite3_column_int64(d->st_thread, 4),
    };
    if (row->agents == NULL)
        row->agents = ",";
    /* the newest <max> only: a smaller history.max_messages_per_thread than when they were
     * written reads no more than it keeps */
    from = (sqlite3_int64)row->first;
    if (row->count > max)
        from += (sqlite3_int64)(row->count - max);
    next = (uint64_t)from;
    end = row->first + row->count;
    key = sqlite3_column_int64(d->st_thread, 0);
    /* a shared row that begins before <from> may hold it */
    sqlite3_bind_int64(d->st_shared_before, 1, key);
    sqlite3_bind_int64(d->st_shared_before, 2, from);
    rc = sqlite3_step(d->st_shared_before);
    if (rc == SQLITE_ROW && sqlite3_column_int64(d->st_shared_before, 0) +
                                    sqlite3_column_int64(d->st_shared_before, 2) >
                                from)
        ok = take_shared(d, d->st_shared_before, &sh_start, &sh_n);
    sqlite3_reset(d->st_shared_before);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        goto fail;
    sqlite3_bind_int64(d->st_messages, 1, key);
    sqlite3_bind_int64(d->st_messages, 2, from);
    /* A message's pieces come in order, and are put together in <buf>; the positions between the
     * rows of their own are those the last shared row holds. */
    while (ok && (rc = sqlite3_step(d->st_messages)) == SQLITE_ROW) {
        uint64_t pos = (uint64_t)sqlite3_column_int64(d->st_messages, 0);
        sqlite3_int64 part = sqlite3_column_int64(d->st_messages, 1);
        if (pos >= end) { /* (no row begins past the thread's end: its commit deleted them) */
            past = true;
            break;
        }
        if (m.part > 0 && pos != m.pos) {
            give(d, fn, arg, &m, run);
            free(run);
            run = NULL;
            m.part = 0;
        }
        if (m.part == 0)
            give_shared(d, sh_start, sh_n, &next, pos, fn, arg);
        if (part < 0) {
            sqlite3_int64 n = sqlite3_column_int64(d->st_messages, 8);
            const void *b = sqlite3_column_blob(d->st_messages, 4);
            size_t len = (size_t)sqlite3_column_bytes(d->st_messages, 4);
            if (!(ok = part == -1 && shared_valid(b, len, n)))
                break; /* a shared row that cannot be read: nor can its messages */
            if (len > d->shared_cap) {
                d->shared_cap = len * 2;
                free(d->shared);
                d->shared = agw_xmalloc(d->shared_cap);
            }
            memcpy(d->shared, b, len);
            d->shared_len = len;
            sh_start = (sqlite3_int64)pos;
            sh_n = n;
            continue;
        }
        if (m.part == 0 && part > 0) {
            /* pieces added to a message whose first piece a shared row holds */
            struct shared_entry e;
            if (!(ok = shared_entry_at(d->shared, d->shared_len, sh_start, sh_n, pos, &e)))
                break;
            start_from_entry(d, &m, &run, pos, &e);
        }
        ok = part == (sqlite3_int64)m.part;
        if (!ok)
            break; /* a piece missing: the message cannot be read */
        if (part == 0) {
            const char *r = (const char *)sqlite3_column_text(d->st_messages, 2);
            m.pos = pos;
            m.text = sqlite3_column_int(d->st_messages, 3) != 0;
            run = r != NULL ? agw_xstrdup(r) : NULL;
            d->buf_len = 0;
        }
        if (!(ok = add_piece(d, d->st_messages, 4, &d->buf, &d->buf_len, &d->buf_cap)))
            break; /* a piece that cannot be read: nor can the message */
        m.part++;
        next = pos + 1;
    }
    if (ok && (rc == SQLITE_DONE || past)) {
        rc = SQLITE_DONE;
        if (m.part > 0)
            give(d, fn, arg, &m, run);
        give_shared(d, sh_start, sh_n, &next, end, fn, arg);
    }
    agw_texts_reads_done(d->texts);
    free(run);
    sqlite3_reset(d->st_messages);
    sqlite3_clear_bindings(d->st_messages);
    if (!ok) {
        agw_log_error(
            "thread history: cannot read thread %s: a message's pieces are not all there, or "
            "cannot be read",
            id);
        return -1;
    }
    if (rc != SQLITE_DONE)
        goto fail;
    return 1;
fail:
    agw_log_error("thread history: cannot read thread %s: %s", id, sqlite3_errmsg(d->db));
    return -1;
}

/* The first piece of message <pos> of thread <id> from the shared row that holds it, in a new
 * block (*<b>, *<n> bytes, *<cap> allocated): false when none does. */
static bool shared_first_piece(struct db *d, const char *id, uint64_t pos, char **b, size_t *n,
                               size_t *cap)
{
    struct shared_entry e;
    bool found = false;

    sqlite3_bind_text(d->st_shared_at, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(d->st_shared_at, 2, (sqlite3_int64)pos);
    if (sqlite3_step(d->st_shared_at) == SQLITE_ROW &&
        shared_entry_at(sqlite3_column_blob(d->st_shared_at, 1),
                        (size_t)sqlite3_column_bytes(d->st_shared_at, 1),
                        sqlite3_column_int64(d->st_shared_at, 0),
                        sqlite3_column_int64(d->st_shared_at, 2), pos, &e)) {
        *cap = e.len + 1;
        *b = agw_xmalloc(*cap);
        memcpy(*b, e.data, e.len);
        *n = e.len;
        found = true;
    }
    sqlite3_reset(d->st_shared_at);
    sqlite3_clear_bindings(d->st_shared_at);
    return found;
}

static int db_load_message(void *self, const char *id, uint64_t pos, char **data, size_t *len)
{
    struct db *d = self;
    sqlite3_int64 want = 0;
    char *b = NULL;
    size_t n = 0, cap = 0;
    int rc;

    sqlite3_bind_text(d->st_message, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(d->st_message, 2, (sqlite3_int64)pos);
    while ((rc = sqlite3_step(d->st_message)) == SQLITE_ROW) {
        /* no row of its own for its first piece: a shared row holds it */
        if (want == 0 && sqlite3_column_int64(d->st_message, 0) != 0 &&
            shared_first_piece(d, id, pos, &b, &n, &cap))
            want = 1;
        if (sqlite3_column_int64(d->st_message, 0) != want++ ||
            !add_piece(d, d->st_message, 1, &b, &n, &cap))
            break; /* a piece missing, or that cannot be read */
    }
    if (rc == SQLITE_DONE && want == 0 && shared_first_piece(d, id, pos, &b, &n, &cap))
        want = 1;
    sqlite3_reset(d->st_message);
    sqlite3_clear_bindings(d->st_message);
    agw_texts_reads_done(d->texts);
    if (rc != SQLITE_DONE || want == 0) {
        agw_log_error("thread history: cannot read back message %llu of thread %s: %s",
                      (unsigned long long)pos, id,
                      rc == SQLITE_DONE || rc == SQLITE_ROW
                          ? "its pieces are not all there, or cannot be read"
                          : sqlite3_errmsg(d->db));
        free(b);
        return -1;
    }
    b[n] = '\0';
    *data = b;
    *len = n;
    return 0;
}

static bool step_done(sqlite3_stmt *st)
{
    bool ok = sqlite3_step(st) == SQLITE_DONE;

    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return ok;
}

/* ---- threads new to the database ----------------------------------------------------------- */

/* The filter's size: twice the threads the table may hold (its largest key bounds their number),
 * at least KNOWN_MIN, at most KNOWN_MAX members (8 MiB of bits; past that it answers "perhaps"
 * more often, about 2.5 % of new ids at twice the threads, and those are looked up as before). The
 * scan reads KNOWN_STEP ids after each commit: a few milliseconds of the writer's. */
#define KNOWN_MIN  16384
#define KNOWN_MAX  (4u << 20)
#define KNOWN_STEP 16384

/* Starts <building>, sized for twice the threads the table may hold or twice <known>'s capacity,
 * whichever is more, within [KNOWN_MIN, KNOWN_MAX] (the caller starts none for a <known> at
 * KNOWN_MAX). */
static void known_start(struct db *d)
{
    size_t want = d->known != NULL ? agw_bloom_capacity(d->known) : 0;

    if (sqlite3_step(d->st_max_key) == SQLITE_ROW &&
        (size_t)sqlite3_column_int64(d->st_max_key, 0) > want)
        want = (size_t)sqlite3_column_int64(d->st_max_key, 0);
    sqlite3_reset(d->st_max_key);
    want = want > KNOWN_MAX / 2 ? KNOWN_MAX : 2 * want;
    d->building = agw_bloom_new(want < KNOWN_MIN ? KNOWN_MIN : want);
    d->scan_key = 0;
}

/* Adds the next KNOWN_STEP ids to <building>; at the table's end, it becomes <known>. A failed read
 * leaves the scan where it was, to go on after the next commit. */
static void known_step(struct db *d)
{
    int rc, n = 0;

    sqlite3_bind_int64(d->st_scan_ids, 1, d->scan_key);
    sqlite3_bind_int(d->st_scan_ids, 2, KNOWN_STEP);
    while ((rc = sqlite3_step(d->st_scan_ids)) == SQLITE_ROW) {
        const char *id = (const char *)sqlite3_column_text(d->st_scan_ids, 1);
        if (id != NULL)
            agw_bloom_add(d->building, id, (size_t)sqlite3_column_bytes(d->st_scan_ids, 1));
        d->scan_key = sqlite3_column_int64(d->st_scan_ids, 0);
        n++;
    }
    sqlite3_reset(d->st_scan_ids);
    if (rc != SQLITE_DONE || n == KNOWN_STEP)
        return;
    agw_bloom_free(d->known);
    d->known = d->building;
    d->building = NULL;
    agw_log_debug("thread history: the %zu thread ids in the database are known (%zu KiB)",
                  agw_bloom_count(d->known), agw_bloom_bytes(d->known) / 1024);
}

/* After each commit: the scan goes on, or a filter past its capacity starts its successor. */
static void known_after_commit(struct db *d)
{
    if (d->building == NULL && d->known != NULL &&
        agw_bloom_count(d->known) > agw_bloom_capacity(d->known) &&
        agw_bloom_capacity(d->known) < KNOWN_MAX)
        known_start(d);
    if (d->building != NULL)
        known_step(d);
}

static void known_add(struct db *d, const char *id)
{
    size_t len = strlen(id);

    if (d->known != NULL)
        agw_bloom_add(d->known, id, len);
    if (d->building != NULL)
        agw_bloom_add(d->building, id, len);
}

static bool db_may_hold(void *self, const char *id)
{
    struct db *d = self;

    return d->known == NULL || agw_bloom_may_hold(d->known, id, strlen(id));
}

/* Thread rows looked up by id and written, for tests (agw_store_sqlite_counts()). */
static uint64_t n_lookups, n_row_writes;

void agw_store_sqlite_counts(uint64_t *lookups, uint64_t *row_writes)
{
    *lookups = __atomic_load_n(&n_lookups, __ATOMIC_RELAXED);
    *row_writes = __atomic_load_n(&n_row_writes, __ATOMIC_RELAXED);
}

/* Thread <r->id>'s number, or 0 when the database has no such thread; -1 on an error. */
static sqlite3_int64 thread_key(struct db *d, const struct agw_store_row *r)
{
    sqlite3_int64 key;

    __atomic_add_fetch(&n_lookups, 1, __ATOMIC_RELAXED);
    sqlite3_bind_text(d->st_thread_key, 1, r->id, -1, SQLITE_STATIC);
    switch (sqlite3_step(d->st_thread_key)) {
    case SQLITE_ROW:
        key = sqlite3_column_int64(d->st_thread_key, 0);
        break;
    case SQLITE_DONE:
        key = 0;
        break;
    default:
        key = -1;
    }
    sqlite3_reset(d->st_thread_key);
    sqlite3_clear_bindings(d->st_thread_key);
    return key;
}

/* Writes thread <r>'s row: updated when <key> (its number) is known, else inserted (numbered).
 * Returns its number, or -1. An update that finds no row (the thread went meanwhile) inserts it. */
static sqlite3_int64 write_thread_row(struct db *d, const struct agw_store_row *r,
                                      sqlite3_int64 key)
{
    sqlite3_stmt *st = key > 0 ? d->st_update_thread : d->st_insert_thread;

    __atomic_add_fetch(&n_row_writes, 1, __ATOMIC_RELAXED);
    if (key > 0)
        sqlite3_bind_int64(st, 1, key);
    else
        sqlite3_bind_text(st, 1, r->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, r->agents, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, r->updated_s);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)r->first);
    sqlite3_bind_int64(st, 5, (sqlite3_int64)r->count);
    if (key == 0)
        known_add(d, r->id); /* before the insert: a filter may say "perhaps", never "no" */
    if (!step_done(st))
        return -1;
    if (key == 0)
        return sqlite3_last_insert_rowid(d->db);
    return sqlite3_changes(d->db) > 0 ? key : write_thread_row(d, r, 0);
}

/* The entry of <pieces> for a piece apart just written at (<seg>, <off>), of the row (<thread>,
 * <pos>, <part>). */
static bool add_piece_entry(struct db *d, sqlite3_int64 seg, sqlite3_int64 off, sqlite3_int64 len,
                            sqlite3_int64 thread, sqlite3_int64 pos, sqlite3_int64 part)
{
    sqlite3_bind_int64(d->st_piece, 1, seg);
    sqlite3_bind_int64(d->st_piece, 2, off);
    sqlite3_bind_int64(d->st_piece, 3, len);
    sqlite3_bind_int64(d->st_piece, 4, thread);
    sqlite3_bind_int64(d->st_piece, 5, pos);
    sqlite3_bind_int64(d->st_piece, 6, part);
    return step_done(d->st_piece);
}

/* Whether message <m> of row <r> may share a row: a whole message (no piece) at a position no row
 * holds, not a long text (those are apart, in the segments). */
static bool shareable(const struct db *d, const struct agw_store_row *r,
                      const struct agw_store_msg *m)
{
    return m->part == 0 && !m->drop_parts && m->pos >= r->fresh_from &&
           !(m->data != NULL && m->len >= d->texts_min) &&
           (m->run_id == NULL || strlen(m->run_id) <= UINT16_MAX);
}

/* How many of <r>'s messages from <i> on share a row: 0, or 2 to SHARED_MAX side by side. */
static size_t shared_run(const struct db *d, const struct agw_store_row *r, size_t i)
{
    size_t k = 0;

    while (i + k < r->n_msgs && k < SHARED_MAX && shareable(d, r, &r->msgs[i + k]) &&
           (k == 0 || r->msgs[i + k].pos == r->msgs[i + k - 1].pos + 1))
        k++;
    return k >= 2 ? k : 0;
}

/* Writes messages <m>[0, <k>) of thread <key> as one shared row. */
static bool save_shared(struct db *d, sqlite3_int64 key, const struct agw_store_msg *m, size_t k)
{
    size_t need = 0, at = 0;

    for (size_t i = 0; i < k; i++)
        need += SHARED_HEAD + (m[i].run_id != NULL ? strlen(m[i].run_id) : 0) + m[i].len;
    if (need > d->shared_cap) {
        d->shared_cap = need * 2;
        free(d->shared);
        d->shared = agw_xmalloc(d->shared_cap);
    }
    for (size_t i = 0; i < k; i++) {
        size_t rl = m[i].run_id != NULL ? strlen(m[i].run_id) : 0;
        unsigned char *p = d->shared + at;
        put_le(p, m[i].len, 4);
        p[4] = (unsigned char)((m[i].text ? SHARED_TEXT : 0) | (m[i].run_id ? SHARED_RUN : 0));
        put_le(p + 5, rl, 2);
        memcpy(p + SHARED_HEAD, m[i].run_id != NULL ? m[i].run_id : "", rl);
        if (m[i].len > 0)
            memcpy(p + SHARED_HEAD + rl, m[i].data, m[i].len);
        at += SHARED_HEAD + rl + m[i].len;
    }
    sqlite3_bind_int64(d->st_save_shared, 1, key);
    sqlite3_bind_int64(d->st_save_shared, 2, (sqlite3_int64)m[0].pos);
    sqlite3_bind_blob(d->st_save_shared, 3, d->shared, (int)at, SQLITE_STATIC);
    sqlite3_bind_int64(d->st_save_shared, 4, (sqlite3_int64)k);
    return step_done(d->st_save_shared);
}

/* Writes one thread's row (unless it is as the database holds it), deletes its messages outside
 * [first, first + count), writes <msgs>; sets <r->key>. */
static bool save_thread(struct db *d, struct agw_store_row *r)
{
    sqlite3_int64 end = (sqlite3_int64)(r->first + r->count);
    /* The thread's number: known from an earlier commit, or looked up; its row then updated, or
     * inserted (numbered) when new. (An upsert ... RETURNING key would be one statement, but
     * measured three times the cost.) A thread that streams keeps its row and number from one
     * commit to the next: only its answer's new piece is written. */
    sqlite3_int64 key = r->key > 0 ? r->key : thread_key(d, r);
    bool ok;

    if (key >= 0 && !(r->key > 0 && r->row_same))
        key = write_thread_row(d, r, key);
    ok = key > 0;
    r->key = ok ? key : 0;
    if (ok && r->drop_before) {
        sqlite3_bind_int64(d->st_drop_before, 1, key);
        sqlite3_bind_int64(d->st_drop_before, 2, (sqlite3_int64)r->first);
        ok = step_done(d->st_drop_before);
    }
    if (ok && r->drop_after) {
        sqlite3_bind_int64(d->st_drop_from, 1, key);
        sqlite3_bind_int64(d->st_drop_from, 2, end);
        ok = step_done(d->st_drop_from);
    }
    for (size_t i = 0; ok && i < r->n_msgs; i++) {
        const struct agw_store_msg *m = &r->msgs[i];
        size_t k = shared_run(d, r, i);
        if (k > 0) {
            ok = save_shared(d, key, m, k);
            i += k - 1;
            continue;
        }
        sqlite3_bind_int64(d->st_save_message, 1, key);
        sqlite3_bind_int64(d->st_save_message, 2, (sqlite3_int64)m->pos);
        sqlite3_bind_int64(d->st_save_message, 3, (sqlite3_int64)m->part);
        if (m->run_id != NULL && m->part == 0)
            sqlite3_bind_text(d->st_save_message, 4, m->run_id, -1, SQLITE_STATIC);
        sqlite3_bind_int(d->st_save_message, 5, m->text);
        const bool apart = m->data != NULL && m->len >= d->texts_min; /* in the segments */
        uint64_t seg = 0, off = 0;
        if (apart) {
            if (agw_texts_append(d->texts, m->data, m->len, &seg, &off) != 0) {
                d->texts_errno = errno;
                sqlite3_reset(d->st_save_message);
                sqlite3_clear_bindings(d->st_save_message);
                ok = false;
                break;
            }
            sqlite3_bind_text(d->st_save_message, 6, "", 0, SQLITE_STATIC);
            sqlite3_bind_int64(d->st_save_message, 7, (sqlite3_int64)seg);
            sqlite3_bind_int64(d->st_save_message, 8, (sqlite3_int64)off);
            sqlite3_bind_int64(d->st_save_message, 9, (sqlite3_int64)m->len);
        } else {
            sqlite3_bind_text(d->st_save_message, 6, m->data != NULL ? m->data : "", (int)m->len,
                              SQLITE_STATIC);
        }
        ok = step_done(d->st_save_message);
        if (ok && apart)
            ok = add_piece_entry(d, (sqlite3_int64)seg, (sqlite3_int64)off, (sqlite3_int64)m->len,
                                 key, (sqlite3_int64)m->pos, m->part);
        if (ok && m->part == 0 && m->drop_parts) {
            sqlite3_bind_int64(d->st_drop_parts, 1, key);
            sqlite3_bind_int64(d->st_drop_parts, 2, (sqlite3_int64)m->pos);
            ok = step_done(d->st_drop_parts);
        }
    }
    return ok;
}

/* Lets the kernel drop the pages a commit appended, now on disk (synchronous=FULL) and clean:
 * written once and read back rarely (the threads in use are in the writer's cache, and SQLite's own
 * cache keeps the pages it works on), they would only fill the page cache while each new commit
 * took fresh pages. Dropped, they are the next commit's pages: on a virtual machine whose free
 * memory goes back to the host, a fresh page costs a fault in the host (about 8 us per 4 KiB here,
 * against 0.7 for a page the guest just freed). PostgreSQL advises the same for its WAL. The range
 * starts where the previous commit began appending: this commit rewrote in place the B-trees' last
 * leaves, which that one appended (below it, they would stay cached for good: a 64 KiB page for
 * every commit). */
static void db_shed(struct db *d)
{
    struct stat st;

    if (d->data_fd < 0 || fstat(d->data_fd, &st) != 0)
        return;
    if (st.st_size > d->shed_prev)
        (void)posix_fadvise(d->data_fd, d->shed_prev, st.st_size - d->shed_prev,
                            POSIX_FADV_DONTNEED);
    d->shed_prev = d->shed_from;
    d->shed_from = st.st_size;
}

/* The pieces this transaction appended to the segments: on the disk, and the segment's new size
 * in the transaction, before it commits (its rows refer to them). */
static bool texts_before_commit(struct db *d)
{
    uint64_t seg, size;

    if (!agw_texts_pending(d->texts, &seg, &size))
        return true;
    if (agw_texts_sync(d->texts) != 0) {
        d->texts_errno = errno;
        return false;
    }
    sqlite3_bind_int64(d->st_segment_size, 1, (sqlite3_int64)seg);
    sqlite3_bind_int64(d->st_segment_size, 2, (sqlite3_int64)size);
    return step_done(d->st_segment_size);
}

/* Ends the transaction: COMMIT when <ok>, else (or when the commit fails) ROLLBACK, the segments'
 * appends kept or forgotten with it. 0, or -1 with the cause in <err>. */
static int db_end(struct db *d, bool ok, char *err, size_t errlen)
{
    if (ok)
        ok = texts_before_commit(d) && sqlite3_exec(d->db, "COMMIT", NULL, NULL, NULL) == SQLITE_OK;
    if (!ok) {
        if (d->texts_errno != 0)
            snprintf(err, errlen, "history.texts: %s", strerror(d->texts_errno));
        else
            snprintf(err, errlen, "%s", sqlite3_errmsg(d->db));
        sqlite3_exec(d->db, "ROLLBACK", NULL, NULL, NULL);
        agw_texts_rolled_back(d->texts);
        d->texts_errno = 0;
        return -1;
    }
    agw_texts_committed(d->texts);
    return 0;
}

static void db_gc(struct db *d);

static int db_save(void *self, struct agw_store_row *rows, size_t n, char *err, size_t errlen)
{
    struct db *d = self;
    bool ok = sqlite3_exec(d->db, "BEGIN", NULL, NULL, NULL) == SQLITE_OK;

    for (size_t i = 0; ok && i < n; i++)
        ok = save_thread(d, &rows[i]);
    if (db_end(d, ok, err, errlen) != 0)
        return -1;
    db_shed(d);
    known_after_commit(d);
    db_gc(d);
    return 0;
}

/* ---- the segments' collection --------------------------------------------------------------- */

/* After a commit, once a second at most, the collection looks at one segment, the next after the
 * one it looked at last (round the list; the segment appended to aside): one that no piece refers
 * to any longer (its threads expired, its messages dropped by the cap or written again) is
 * deleted; one whose pieces are less than a quarter of its bytes is compacted, its pieces
 * appended to the current segment and their rows pointed there in one transaction, then deleted.
 * So the files hold at most four times the bytes in use, beside the current segment, and a step
 * copies at most a quarter of a segment (16 MiB). */
#define GC_INTERVAL_MS 1000
#define GC_SPARSE      4 /* compacted below a quarter in use */

/* Within a transaction: segment <seg>'s entries of <pieces> (every piece of it in use moved, or
 * none left) and its row go. */
static bool gc_forget(struct db *d, sqlite3_int64 seg)
{
    sqlite3_bind_int64(d->st_gc_forget, 1, seg);
    if (!step_done(d->st_gc_forget))
        return false;
    sqlite3_bind_int64(d->st_gc_drop, 1, seg);
    return step_done(d->st_gc_drop);
}

/* Moves the pieces of segment <seg> still in use to the current one and deletes it, in one
 * transaction. */
static void gc_compact(struct db *d, sqlite3_int64 seg, sqlite3_int64 live, sqlite3_int64 size)
{
    struct piece {
        sqlite3_int64 off, len, thread, pos, part;
    } *v = NULL;
    size_t n = 0, cap = 0, buf_cap = 0;
    char *buf = NULL, err[256];
    bool ok = sqlite3_exec(d->db, "BEGIN", NULL, NULL, NULL) == SQLITE_OK;
    int rc = SQLITE_DONE;

    /* the entries first: moving a piece changes the table the statement would walk */
    sqlite3_bind_int64(d->st_gc_rows, 1, seg);
    while (ok && (rc = sqlite3_step(d->st_gc_rows)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap > 0 ? 2 * cap : 64;
            v = agw_xrealloc(v, cap * sizeof(*v));
        }
        v[n++] = (struct piece){
            sqlite3_column_int64(d->st_gc_rows, 0), sqlite3_column_int64(d->st_gc_rows, 1),
            sqlite3_column_int64(d->st_gc_rows, 2), sqlite3_column_int64(d->st_gc_rows, 3),
            sqlite3_column_int64(d->st_gc_rows, 4)};
    }
    sqlite3_reset(d->st_gc_rows);
    ok = ok && rc == SQLITE_DONE;
    for (size_t i = 0; ok && i < n; i++) {
        uint64_t to, off;
        if (v[i].len < 0 || v[i].off < 0 || v[i].len > INT32_MAX) {
            ok = false;
            break;
        }
        if (buf_cap < (size_t)v[i].len + 1) {
            buf_cap = (size_t)v[i].len + 1;
            buf = agw_xrealloc(buf, buf_cap);
        }
        ok =
            agw_texts_read(d->texts, (uint64_t)seg, (uint64_t)v[i].off, (size_t)v[i].len, buf) == 0;
        if (ok && agw_texts_append(d->texts, buf, (size_t)v[i].len, &to, &off) != 0) {
            d->texts_errno = errno;
            ok = false;
        }
        if (!ok)
            break;
        /* the row, if it still points at these bytes (it did when selected) */
        sqlite3_bind_int64(d->st_gc_move, 1, v[i].thread);
        sqlite3_bind_int64(d->st_gc_move, 2, v[i].pos);
        sqlite3_bind_int64(d->st_gc_move, 3, v[i].part);
        sqlite3_bind_int64(d->st_gc_move, 4, (sqlite3_int64)to);
        sqlite3_bind_int64(d->st_gc_move, 5, (sqlite3_int64)off);
        sqlite3_bind_int64(d->st_gc_move, 6, seg);
        sqlite3_bind_int64(d->st_gc_move, 7, v[i].off);
        ok = step_done(d->st_gc_move);
        if (ok && sqlite3_changes(d->db) == 1)
            ok = add_piece_entry(d, (sqlite3_int64)to, (sqlite3_int64)off, v[i].len, v[i].thread,
                                 v[i].pos, v[i].part);
    }
    ok = ok && gc_forget(d, seg);
    agw_texts_reads_done(d->texts);
    if (db_end(d, ok, err, sizeof(err)) != 0) {
        agw_log_warn("thread history: segment %08lld not compacted: %s (tried again later)",
                     (long long)seg, err);
    } else {
        agw_texts_remove(d->texts, (uint64_t)seg, (uint64_t)size);
        agw_log_debug("thread history: segment %08lld compacted: %lld of its %lld bytes in use, "
                      "moved",
                      (long long)seg, (long long)live, (long long)size);
    }
    free(v);
    free(buf);
}

static void db_gc(struct db *d)
{
    int64_t now = agw_now_ms();
    sqlite3_int64 seg = 0, size = 0, count = 0, live = 0;
    bool found = false;

    if (!agw_store_texts_gc_every_commit() && now - d->gc_ms < GC_INTERVAL_MS)
        return;
    d->gc_ms = now;
    for (int round = 0; round < 2 && !found; round++) { /* after the last one, the first */
        sqlite3_bind_int64(d->st_gc_next, 1, (sqlite3_int64)d->gc_seg);
        sqlite3_bind_int64(d->st_gc_next, 2, (sqlite3_int64)agw_texts_current(d->texts));
        if ((found = sqlite3_step(d->st_gc_next) == SQLITE_ROW)) {
            seg = sqlite3_column_int64(d->st_gc_next, 0);
            size = sqlite3_column_int64(d->st_gc_next, 1);
        }
        sqlite3_reset(d->st_gc_next);
        if (!found && d->gc_seg == 0)
            return; /* no segment but the current one */
        d->gc_seg = 0;
    }
    if (!found)
        return;
    d->gc_seg = (uint64_t)seg;
    sqlite3_bind_int64(d->st_gc_count, 1, seg);
    found = sqlite3_step(d->st_gc_count) == SQLITE_ROW;
    if (found) {
        count = sqlite3_column_int64(d->st_gc_count, 0);
        live = sqlite3_column_int64(d->st_gc_count, 1);
    }
    sqlite3_reset(d->st_gc_count);
    if (!found)
        return;
    if (count == 0) { /* no row points into it: its entries, its row, its file */
        char err[256];
        bool ok = sqlite3_exec(d->db, "BEGIN", NULL, NULL, NULL) == SQLITE_OK && gc_forget(d, seg);
        if (db_end(d, ok, err, sizeof(err)) == 0)
            agw_texts_remove(d->texts, (uint64_t)seg, (uint64_t)size);
        else
            agw_log_warn("thread history: segment %08lld not deleted: %s (tried again later)",
                         (long long)seg, err);
    } else if (live < size / GC_SPARSE) {
        gc_compact(d, seg, live, size);
    }
}

/* The writer has been idle a while: the buffers of the commits' writes go (made again by the next
 * commit). */
static void db_trim(void *self)
{
    struct db *d = self;

    agw_store_vfs_trim(d->db);
    if (d->texts != NULL)
        agw_texts_trim(d->texts);
}

static uint64_t db_texts_bytes(void *self)
{
    struct db *d = self;

    return agw_texts_bytes(d->texts);
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

/* The statements, prepared at the open and finalized at the close. */
static const struct {
    size_t at; /* offsetof(struct db, the statement) */
    const char *sql;
} STATEMENTS[] = {
    {offsetof(struct db, st_thread), "SELECT key, agents, updated, dropped, n_messages FROM threads"
                                     " WHERE id = ?1"},
    {offsetof(struct db, st_messages),
     "SELECT pos, part, run_id, text, data, seg, off, len, n FROM messages"
     " WHERE thread = ?1 AND pos >= ?2 ORDER BY pos, part"},
    {offsetof(struct db, st_message),
     "SELECT part, data, seg, off, len FROM messages"
     " WHERE thread = (SELECT key FROM threads WHERE id = ?1) AND pos = ?2 AND part >= 0"
     " ORDER BY part"},
    {offsetof(struct db, st_thread_key), "SELECT key FROM threads WHERE id = ?1"},
    {offsetof(struct db, st_update_thread),
     "UPDATE threads SET agents = ?2, updated = ?3, dropped = ?4,"
     " n_messages = ?5 WHERE key = ?1"},
    {offsetof(struct db, st_insert_thread),
     "INSERT INTO threads (id, agents, updated, dropped, n_messages)"
     " VALUES (?1, ?2, ?3, ?4, ?5)"},
    {offsetof(struct db, st_drop_before), "DELETE FROM messages WHERE thread = ?1 AND pos < ?2"
                                          " AND (part >= 0 OR pos + n <= ?2)"},
    {offsetof(struct db, st_drop_from), "DELETE FROM messages WHERE thread = ?1 AND pos >= ?2"},
    {offsetof(struct db, st_save_message),
     "INSERT INTO messages (thread, pos, part, run_id, text, data, seg, off, len)"
     " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT(thread, pos, part) DO UPDATE"
     " SET run_id = excluded.run_id, text = excluded.text, data = excluded.data,"
     " seg = excluded.seg, off = excluded.off, len = excluded.len"},
    {offsetof(struct db, st_drop_parts),
     "DELETE FROM messages WHERE thread = ?1 AND pos = ?2 AND part > 0"},
    {offsetof(struct db, st_expire), "DELETE FROM threads WHERE key IN"
                                     " (SELECT key FROM threads WHERE updated < ?1 LIMIT ?2)"},
    {offsetof(struct db, st_max_key), "SELECT max(key) FROM threads"},
    {offsetof(struct db, st_scan_ids),
     "SELECT key, id FROM threads WHERE key > ?1 ORDER BY key LIMIT ?2"},
    {offsetof(struct db, st_segments), "SELECT seg, size FROM segments ORDER BY seg"},
    {offsetof(struct db, st_segment_size), "INSERT INTO segments (seg, size) VALUES (?1, ?2)"
                                           " ON CONFLICT(seg) DO UPDATE SET size = excluded.size"},
    {offsetof(struct db, st_gc_next), "SELECT seg, size FROM segments WHERE seg > ?1 AND seg <> ?2"
                                      " ORDER BY seg LIMIT 1"},
    {offsetof(struct db, st_gc_count),
     "SELECT count(*), coalesce(sum(p.len), 0) FROM pieces p JOIN messages m"
     " ON m.thread = p.thread AND m.pos = p.pos AND m.part = p.part"
     " WHERE p.seg = ?1 AND m.seg = p.seg AND m.off = p.off"},
    {offsetof(struct db, st_gc_drop), "DELETE FROM segments WHERE seg = ?1"},
    {offsetof(struct db, st_gc_rows),
     "SELECT p.off, p.len, p.thread, p.pos, p.part FROM pieces p JOIN"
     " messages m ON m.thread = p.thread AND m.pos = p.pos AND m.part = p.part"
     " WHERE p.seg = ?1 AND m.seg = p.seg AND m.off = p.off"},
    {offsetof(struct db, st_gc_move),
     "UPDATE messages SET seg = ?4, off = ?5 WHERE thread = ?1 AND pos = ?2"
     " AND part = ?3 AND seg = ?6 AND off = ?7"},
    {offsetof(struct db, st_gc_forget), "DELETE FROM pieces WHERE seg = ?1"},
    {offsetof(struct db, st_piece),
     "INSERT OR REPLACE INTO pieces (seg, off, len, thread, pos, part)"
     " VALUES (?1, ?2, ?3, ?4, ?5, ?6)"},
    {offsetof(struct db, st_save_shared),
     "INSERT INTO messages (thread, pos, part, text, data, n) VALUES (?1, ?2, -1, 0, ?3, ?4)"
     " ON CONFLICT(thread, pos, part) DO UPDATE SET data = excluded.data, n = excluded.n"},
    {offsetof(struct db, st_shared_before),
     "SELECT pos, data, n FROM messages WHERE thread = ?1 AND pos < ?2 AND pos >= ?2 "
     "- " SHARED_MAX_STR " AND part = -1 ORDER BY pos DESC LIMIT 1"},
    {offsetof(struct db, st_shared_at),
     "SELECT pos, data, n FROM messages WHERE thread = (SELECT key FROM threads WHERE id = ?1)"
     " AND pos <= ?2 AND pos > ?2 - " SHARED_MAX_STR " AND part = -1 ORDER BY pos DESC LIMIT 1"},
};

static sqlite3_stmt **statement(struct db *d, size_t i)
{
    return (sqlite3_stmt **)(void *)((char *)d + STATEMENTS[i].at);
}

static void db_close(void *self)
{
    struct db *d = self;

    for (size_t i = 0; i < AGW_ARRAY_LEN(STATEMENTS); i++)
        sqlite3_finalize(*statement(d, i));
    agw_bloom_free(d->known);
    agw_bloom_free(d->building);
    if (d->db != NULL)
        sqlite3_close(d->db);
    if (d->data_fd >= 0)
        close(d->data_fd);
    agw_texts_close(d->texts);
    if (d->lock_fd >= 0)
        close(d->lock_fd);
    free(d->buf);
    free(d->shared);
    free(d);
}

static bool exec_ok(struct db *d, const char *sql)
{
    return sqlite3_exec(d->db, sql, NULL, NULL, NULL) == SQLITE_OK;
}

/* Schema 1 kept a thread as one row whose data was the whole thread as one JSON text
 * (agw_history_dump()); each becomes a thread row and a row per message, inside the caller's
 * transaction. A thread whose data cannot be read (schema 1 ignored it too) is left out, logged. */
static bool migrate_v1(struct db *d, const char *file)
{
    sqlite3_stmt *rd = NULL, *th = NULL, *msg = NULL;
    uint64_t threads = 0, messages = 0, unreadable = 0;
    bool ok = false;
    int step;

    if (!exec_ok(d, "DROP INDEX IF EXISTS threads_updated;"
                    "ALTER TABLE threads RENAME TO threads_v1;") ||
        !exec_ok(d, SCHEMA) ||
        sqlite3_prepare_v2(d->db, "SELECT id, agents, updated, data FROM threads_v1", -1, &rd,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(d->db,
                           "INSERT INTO threads (id, agents, updated, dropped, n_messages)"
                           " VALUES (?1, ?2, ?3, ?4, ?5)",
                           -1, &th, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(d->db,
                           "INSERT INTO messages (thread, pos, part, run_id, text, data)"
                           " VALUES (?1, ?2, 0, ?3, 0, ?4)",
                           -1, &msg, NULL) != SQLITE_OK)
        goto out;
    while ((step = sqlite3_step(rd)) == SQLITE_ROW) {
        const char *id = (const char *)sqlite3_column_text(rd, 0);
        const char *agents = (const char *)sqlite3_column_text(rd, 1);
        const char *data = (const char *)sqlite3_column_text(rd, 3);
        struct agw_history *h =
            id != NULL && data != NULL
                ? agw_history_load(data, (size_t)sqlite3_column_bytes(rd, 3), SIZE_MAX)
                : NULL;
        uint64_t first;
        sqlite3_int64 key;
        bool row_ok;

        if (h == NULL) {
            agw_log_error("thread history: %s: thread %s: its stored data cannot be read: left out "
                          "of the migration",
                          file, id != NULL ? id : "(null)");
            unreadable++;
            continue;
        }
        first = agw_history_dropped(h);
        sqlite3_bind_text(th, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_text(th, 2, agents != NULL ? agents : ",", -1, SQLITE_STATIC);
        sqlite3_bind_int64(th, 3, sqlite3_column_int64(rd, 2));
        sqlite3_bind_int64(th, 4, (sqlite3_int64)first);
        sqlite3_bind_int64(th, 5, (sqlite3_int64)agw_history_count(h));
        row_ok = step_done(th);
        key = sqlite3_last_insert_rowid(d->db);
        for (size_t i = 0; row_ok && i < agw_history_count(h); i++) {
            size_t len;
            const char *json = agw_history_message_json(h, i, &len);
            const char *run = agw_history_run_id(h, i);
            sqlite3_bind_int64(msg, 1, key);
            sqlite3_bind_int64(msg, 2, (sqlite3_int64)(first + i));
            if (run != NULL)
                sqlite3_bind_text(msg, 3, run, -1, SQLITE_STATIC);
            sqlite3_bind_text(msg, 4, json, (int)len, SQLITE_STATIC);
            row_ok = step_done(msg);
            messages++;
        }
        agw_history_free(h);
        if (!row_ok)
            goto out;
        threads++;
    }
    if (step != SQLITE_DONE || !exec_ok(d, "DROP TABLE threads_v1"))
        goto out;
    agw_log_info("thread history: %s: migrated from schema version 1 to %d: %llu thread%s, %llu "
                 "message%s%s",
                 file, SCHEMA_VERSION, (unsigned long long)threads, threads == 1 ? "" : "s",
                 (unsigned long long)messages, messages == 1 ? "" : "s",
                 unreadable > 0 ? " (unreadable threads left out: see above)" : "");
    ok = true;
out:
    sqlite3_finalize(rd);
    sqlite3_finalize(th);
    sqlite3_finalize(msg);
    return ok;
}

/* Schema 2 keyed a thread's messages by its id: its tables are renamed, the new ones made and
 * filled (each thread numbered in the order of its rowid, that is of its first write), the old
 * ones dropped, inside the caller's transaction. */
static bool migrate_v2(struct db *d, const char *file)
{
    sqlite3_int64 threads, messages;

    if (!exec_ok(d, "DROP TRIGGER IF EXISTS threads_delete;"
                    "DROP INDEX IF EXISTS threads_updated;"
                    "ALTER TABLE threads RENAME TO threads_v2;"
                    "ALTER TABLE messages RENAME TO messages_v2;") ||
        !exec_ok(d, SCHEMA) ||
        !exec_ok(d, "INSERT INTO threads (id, agents, updated, dropped, n_messages)"
                    " SELECT id, agents, updated, dropped, n_messages FROM threads_v2"
                    " ORDER BY rowid"))
        return false;
    threads = sqlite3_changes(d->db);
    if (!exec_ok(d, "INSERT INTO messages (thread, pos, part, run_id, text, data)"
                    " SELECT t.key, m.pos, m.part, m.run_id, m.text, m.data"
                    " FROM messages_v2 m JOIN threads t ON t.id = m.thread"
                    " ORDER BY t.key, m.pos, m.part"))
        return false;
    messages = sqlite3_changes(d->db);
    if (!exec_ok(d, "DROP TABLE messages_v2; DROP TABLE threads_v2"))
        return false;
    agw_log_info("thread history: %s: migrated from schema version 2 to %d: %lld thread%s, %lld "
                 "message row%s",
                 file, SCHEMA_VERSION, (long long)threads, threads == 1 ? "" : "s",
                 (long long)messages, messages == 1 ? "" : "s");
    return true;
}

/* Reads the schema version in the open write transaction and brings the file to SCHEMA_VERSION:
 * 0 (a new file) gets the schema, 1, 2 and 3 are migrated. 0, or -AGW_E* with the cause in <err>.
 */
static int db_schema(struct db *d, const char *file, char *err, size_t errlen)
{
    sqlite3_stmt *st;
    int v;
    char sql[64];

    if (sqlite3_prepare_v2(d->db, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK)
        return db_fail(d, file, "cannot read it", err, errlen);
    v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
    sqlite3_finalize(st);
    switch (v) {
    case 0:
        if (!exec_ok(d, SCHEMA))
            return db_fail(d, file, "cannot write to it", err, errlen);
        break;
    case 1:
        if (!migrate_v1(d, file))
            return db_fail(d, file, "cannot migrate it from schema version 1", err, errlen);
        break;
    case 2:
        if (!migrate_v2(d, file))
            return db_fail(d, file, "cannot migrate it from schema version 2", err, errlen);
        break;
    case 3: /* long pieces apart: the rows made so far keep theirs */
        if (!exec_ok(d, "ALTER TABLE messages ADD COLUMN seg INTEGER;"
                        "ALTER TABLE messages ADD COLUMN off INTEGER;"
                        "ALTER TABLE messages ADD COLUMN len INTEGER;"
                        "ALTER TABLE messages ADD COLUMN n INTEGER;" SCHEMA_TEXTS))
            return db_fail(d, file, "cannot migrate it from schema version 3", err, errlen);
        agw_log_info("thread history: %s: migrated from schema version 3 to %d (long texts "
                     "in history.texts from now on)",
                     file, SCHEMA_VERSION);
        break;
    case 4: /* rows that several messages share: the rows made so far are one message each */
        if (!exec_ok(d, "ALTER TABLE messages ADD COLUMN n INTEGER;"))
            return db_fail(d, file, "cannot migrate it from schema version 4", err, errlen);
        agw_log_info("thread history: %s: migrated from schema version 4 to %d", file,
                     SCHEMA_VERSION);
        break;
    case SCHEMA_VERSION:
        return 0;
    default:
        snprintf(err, errlen, "store.path: %s: schema version %d, this gateway reads 1 to %d", file,
                 v, SCHEMA_VERSION);
        return -AGW_EINVAL;
    }
    snprintf(sql, sizeof(sql), "PRAGMA user_version=%d", SCHEMA_VERSION);
    if (!exec_ok(d, sql))
        return db_fail(d, file, "cannot write to it", err, errlen);
    return 0;
}

static int db_open(struct db *d, const char *dir, char *err, size_t errlen)
{
    char file[4096];
    int rc;

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
                        agw_store_vfs_name()) != SQLITE_OK)
        return db_fail(d, file, "cannot open", err, errlen);
    /* The schema read tells a file that is not a database; BEGIN IMMEDIATE (a write lock) tells a
     * read-only file or directory, before any client is served. */
    sqlite3_busy_timeout(d->db, 2000);
    if (!exec_ok(d, PAGE_SIZE_PRAGMA) || !exec_ok(d, "PRAGMA journal_mode=TRUNCATE"))
        return db_fail(d, file, "cannot use it", err, errlen);
    if (!exec_ok(d, "PRAGMA synchronous=FULL; BEGIN IMMEDIATE"))
        return db_fail(d, file, "cannot write to it", err, errlen);
    if ((rc = db_schema(d, file, err, errlen)) != 0) {
        exec_ok(d, "ROLLBACK");
        return rc;
    }
    if (!exec_ok(d, "COMMIT"))
        return db_fail(d, file, "cannot write to it", err, errlen);
    d->data_fd = open(file, O_RDONLY | O_CLOEXEC);
    if (d->data_fd >= 0) {
        struct stat st;

        d->shed_from = fstat(d->data_fd, &st) == 0 ? st.st_size : 0;
        d->shed_prev = d->shed_from;
    }
    for (size_t i = 0; i < AGW_ARRAY_LEN(STATEMENTS); i++)
        if (sqlite3_prepare_v2(d->db, STATEMENTS[i].sql, -1, statement(d, i), NULL) != SQLITE_OK)
            return db_fail(d, file, "cannot prepare its statements", err, errlen);
    /* the long texts: the segments the database lists must all be there */
    d->texts_min = agw_store_texts_min();
    if ((d->texts = agw_texts_open(dir, err, errlen)) == NULL)
        return -AGW_EIO;
    while ((rc = sqlite3_step(d->st_segments)) == SQLITE_ROW)
        if (agw_texts_adopt(d->texts, (uint64_t)sqlite3_column_int64(d->st_segments, 0),
                            (uint64_t)sqlite3_column_int64(d->st_segments, 1), err, errlen) != 0) {
            sqlite3_reset(d->st_segments);
            return -AGW_EIO;
        }
    sqlite3_reset(d->st_segments);
    if (rc != SQLITE_DONE)
        return db_fail(d, file, "cannot read it", err, errlen);
    if (agw_texts_ready(d->texts, err, errlen) != 0)
        return -AGW_EIO;
    /* the first step now: a table of fewer than KNOWN_STEP threads is known before the first
     * look-up */
    known_start(d);
    known_step(d);
    agw_log_info("thread history: %s (SQLite %s)", file, sqlite3_libversion());
    return 0;
}

/* SQLite counts every allocation it makes for sqlite3_memory_used() and the soft heap limit, under
 * a process-wide mutex: two lock/unlock pairs for each of its six or so malloc()/free() pairs per
 * stored run, about 3 % of the writer's instructions (callgrind, the benchmark's short runs), for
 * figures nothing here reads. Turned off before SQLite's first use in the process (sqlite3_config()
 * is refused after it, harmlessly: the counting then stays). */
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

static void config_sqlite(void)
{
    if (sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0) != SQLITE_OK)
        agw_log_debug("thread history: SQLite already in use: its memory statistics stay on");
}

int agw_store_sqlite_open(const char *dir, struct agw_store_backend *b, char *err, size_t errlen)
{
    struct db *d = agw_xcalloc(1, sizeof(*d));
    int rc;

    pthread_once(&config_once, config_sqlite);
    d->lock_fd = -1;
    d->data_fd = -1;
    if ((rc = db_open(d, dir, err, errlen)) != 0) {
        db_close(d);
        return rc;
    }
    *b = (struct agw_store_backend){.self = d,
                                    .may_hold = db_may_hold,
                                    .load = db_load,
                                    .load_message = db_load_message,
                                    .save = db_save,
                                    .texts_bytes = db_texts_bytes,
                                    .trim = db_trim,
                                    .expire = db_expire,
                                    .close = db_close};
    return 0;
}
