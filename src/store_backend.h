/* What the thread-history store (src/store.c) needs of a durable backend: a thread kept as one row
 * (agents, last change, where its messages start and how many there are) and rows per message (its
 * position in the thread's life, its run, its JSON in one piece or, for a text that grew over
 * several commits, several), read one thread at a time, written in batches of changes, expired by
 * age. The embedded kind is src/store_sqlite.c; the memory kind has
 * none; a shared store (Redis) would be another. Called from the store's writer thread only.
 * Private to the store. */
#ifndef AGW_STORE_BACKEND_H
#define AGW_STORE_BACKEND_H

#include "agw/common.h"

/* One message as stored, in one or more pieces: the message's JSON is its pieces' bytes in order,
 * followed by '"}' when <text> (a text message still open to content deltas: what it grows by is
 * written as its next piece, see agw_history_message_row()). */
struct agw_store_msg {
    uint64_t pos;       /* in the thread's life: messages dropped before it + its index */
    const char *run_id; /* NULL = none (written with piece 0) */
    const char *data;   /* save: the piece; load: the pieces put together */
    size_t len;
    unsigned part;   /* save: 0 = the whole message, k > 0 = its k-th piece; load: pieces read */
    bool text;       /* the bytes lack the closing '"}' */
    bool drop_parts; /* save, piece 0: the message's other pieces go */
};

/* One thread as stored: its messages are the positions [first, first + count). */
struct agw_store_row {
    const char *id;
    const char *agents; /* ",a,b," */
    int64_t updated_s;  /* Unix seconds of the last change */
    uint64_t first;     /* messages dropped before the first one (agw_history_dropped()) */
    uint64_t count;     /* messages held */
    /* save: the messages or pieces to write (new, changed or moved), by position; the others stay
     * as stored. Unused by load. */
    const struct agw_store_msg *msgs;
    size_t n_msgs;
    /* save: whether rows may lie before <first> / at or after <first> + <count> (false when the
     * store knows there are none: a thread new to the database, or one whose last commit left its
     * rows in a range it still covers), so that a commit of a thread that only grew deletes
     * nothing. */
    bool drop_before, drop_after;
    /* save: no row holds a message at this position or after it (the thread never had one there,
     * or its rows were deleted): the messages written there may share a row. UINT64_MAX: not
     * known. */
    uint64_t fresh_from;
    /* save: the thread's number in the database when the store knows it from an earlier commit (0:
     * looked up), and set to it by a save that succeeds. <row_same>: its row (agents, updated_s,
     * first, count) is as that commit wrote it: only its messages are written. */
    int64_t key;
    bool row_same;
};

/* Called by load for each message of a thread, oldest first; the strings are valid during the
 * call. */
typedef void agw_store_msg_fn(void *arg, const struct agw_store_msg *m);

struct agw_store_backend {
    void *self; /* NULL: no backend (the memory kind) */
    /* false when the database certainly holds no thread <id> (load would return 0 without
     * reading anything); true when it may. NULL: always true. */
    bool (*may_hold)(void *self, const char *id);
    /* Thread <id>: fills <row> (its strings valid until the next call; msgs unused) and gives <fn>
     * its newest <max> messages, oldest first, each with its pieces put together; returns 1; 0 when
     * unknown, -1 when it cannot be read (logged). */
    int (*load)(void *self, const char *id, size_t max, struct agw_store_row *row,
                agw_store_msg_fn *fn, void *arg);
    /* The message thread <id> holds at position <pos>: its pieces put together, in a new block
     * (*<data>, *<len> bytes, from malloc(); the caller frees it). 0, or -1 when it is not there or
     * cannot be read (logged). For a thread that shed its saved texts (agw_history_shed()). */
    int (*load_message)(void *self, const char *id, uint64_t pos, char **data, size_t *len);
    /* Writes <n> threads in one transaction: each row replaces its thread's, its messages outside
     * [first, first + count) are deleted and its <msgs> written at their positions (a piece 0
     * replacing the message, another piece added to it). 0, or -1 with nothing written and the
     * cause in <err>. Sets each row's <key>. */
    int (*save)(void *self, struct agw_store_row *rows, size_t n, char *err, size_t errlen);
    /* The bytes of long texts kept apart from the rows (segment files), as of the last commit.
     * NULL: none are. */
    uint64_t (*texts_bytes)(void *self);
    /* The writer has been idle a while: gives back what the last commits' bursts left allocated
     * (buffers of their writes), made again when needed. NULL: nothing to give back. */
    void (*trim)(void *self);
    /* Deletes at most <max> threads (and their messages) last changed before <cutoff_s>: how
     * many, or -1. */
    int64_t (*expire)(void *self, int64_t cutoff_s, unsigned max);
    void (*close)(void *self);
};

/* The embedded kind: <dir>/history.db (SQLite, rollback journal), <dir> made when missing,
 * <dir>/history.lock held (one gateway per directory); a store of an older schema is migrated. 0,
 * or -AGW_E* with a message naming the file in <err>. */
int agw_store_sqlite_open(const char *dir, struct agw_store_backend *b, char *err, size_t errlen);

/* Since the process started: the threads the embedded kind's saves looked up by id, and the thread
 * rows they wrote (for tests). */
void agw_store_sqlite_counts(uint64_t *lookups, uint64_t *row_writes);

#endif
