/* The thread-history store (doc/internals/store.md): every thread's messages, kept by one writer
 * thread so that no event loop ever waits on a disk or on another loop.
 *
 * Event loops hand it records and never block: the run's input (its RunAgentInput body) when a run
 * starts, what the run produced (the JSON Lines of agw_capture_take()) as it streams and when it
 * ends, and read requests (one page of a thread), whose answers come back on the asking loop
 * through that loop's mailbox (include/agw/loop.h). The writer thread applies the records in the
 * order they were handed over (struct agw_history does the rebuilding), keeps the threads it
 * touched last in a bounded cache, and, for the embedded kind, writes the threads that changed to
 * SQLite in one transaction at most every commit interval. So a read sees every record handed over
 * before it, and a kill -9 loses at most the last interval's writes.
 *
 * Kinds: "embedded" (SQLite file <path>/history.db; survives restarts), "memory" (the cache is the
 * store: nothing survives a restart, and past <cache_threads> threads the least recently used are
 * forgotten). Another kind (a shared server) would stand beside them behind the same functions.
 *
 * Thread-safety: agw_store_run_input(), agw_store_run_events() and agw_store_read() may be called
 * from any thread; open and close from one. */
#ifndef AGW_STORE_H
#define AGW_STORE_H

#include "agw/common.h"
#include "agw/config.h"
#include "agw/history.h"

struct agw_store;
struct agw_loop_mailbox;

struct agw_store_options {
    enum agw_store_kind kind;
    const char *path;       /* embedded: the directory (created if missing) */
    size_t max_messages;    /* per thread (history.max_messages_per_thread) */
    uint64_t ttl_s;         /* threads not updated for this long are deleted; 0 = never */
    size_t cache_threads;   /* threads held in memory */
    uint32_t commit_ms;     /* the longest a change waits before its commit (embedded) */
    size_t max_queue_bytes; /* records waiting beyond this are dropped, counted and logged */
    size_t congested_bytes; /* agw_store_congested() past this many bytes not yet applied, until
                               they are under a quarter of it; 0 = never */
};

/* Opens the store and starts its writer thread. On failure (a directory that cannot be created, a
 * file that is not a database, a read-only path, an unsupported kind) returns NULL with a message
 * naming the path and the cause in <err>. */
struct agw_store *agw_store_open(const struct agw_store_options *o, char *err, size_t errlen);
/* Applies every record handed over, commits, stops the writer thread and frees the store. Read
 * requests still waiting are answered into their inboxes (free the inboxes after this). NULL is a
 * no-op. */
void agw_store_close(struct agw_store *s);

/* A run started on thread <thread_id> (agent <agent_id>, run <run_id>): the messages of its
 * RunAgentInput <body> (<len> bytes, copied) join the thread. <msgs> (<n_msgs>, copied): the
 * input's reading of them (struct agw_input's messages, when messages_read), which spares the
 * writer reading the body again; NULL: the writer reads it. */
void agw_store_run_input(struct agw_store *s, const char *agent_id, const char *thread_id,
                         const char *run_id, const char *body, size_t len,
                         const struct agw_input_message *msgs, size_t n_msgs);
/* Events run <run_id> of thread <thread_id> produced: <lines> (<len> bytes of JSON Lines, one event
 * per line, from agw_capture_take()) is taken over by the store, which frees it, or keeps it for
 * reuse when <chunk> says it is a capture chunk (include/agw/capture.h). */
void agw_store_run_events(struct agw_store *s, const char *thread_id, const char *run_id,
                          char *lines, size_t len, bool chunk);
/* The same with <lines> copied, not taken over: for a short run's few lines, which so stay in the
 * memory of the loop that made them (a block freed by the writer goes to the writer's thread cache,
 * and the loop's cache would refill from the shared arena for every run). */
void agw_store_run_events_copy(struct agw_store *s, const char *thread_id, const char *run_id,
                               const char *lines, size_t len);
/* Whether the writer is behind: more than <congested_bytes> of records handed over and not yet
 * applied, and not yet back under a quarter of that. Runs that record stop reading their upstreams
 * while it is (as they do for a slow client), so that a writer sharing a saturated core with the
 * loops, or a slow disk, slows the streams down instead of letting records pile up and be
 * dropped. Any thread; an atomic read. */
bool agw_store_congested(const struct agw_store *s);

/* A capture chunk (AGW_CAPTURE_CHUNK_BYTES, for agw_capture_use_chunks(); <store> is the struct
 * agw_store): one the writer handed back after applying its records, or a new one. Any thread. */
char *agw_store_chunk(void *store);

/* ---- reading ------------------------------------------------------------------------------- */

/* The answer to a read: <status> 200 with <body> the page ({"messages":…}, compact JSON, <len>
 * bytes) and <agents> the agents that served the thread (",a,b," with a comma before and after
 * each id, for strstr()), 404 (the store does not know the thread; <body> NULL), or 500 (a saved
 * message of the page could not be read back from the database: logged). Owned by the
 * callback's caller: valid during the callback only. */
struct agw_store_page {
    int status;
    char *body;
    size_t len;
    char *agents;
};

/* Called once per read on the loop that owns the mailbox it was asked with, with the answer; or
 * with NULL when the answer could not be made (the mailbox was freed with it still in it: free a
 * mailbox after agw_store_close(), which answers every read still waiting). */
typedef void agw_store_read_fn(void *arg, const struct agw_store_page *page);

/* Asks for one page of thread <thread_id>; <done>(<arg>, page) runs later on <inbox>'s loop. */
void agw_store_read(struct agw_store *s, const char *thread_id, const struct agw_history_query *q,
                    struct agw_loop_mailbox *inbox, agw_store_read_fn *done, void *arg);

/* ---- for tests and operators --------------------------------------------------------------- */

struct agw_store_stats {
    uint64_t records; /* records applied */
    uint64_t dropped; /* records dropped: the queue was over max_queue_bytes */
    uint64_t commits; /* transactions committed */
    uint64_t
        commit_errors;  /* transactions that failed (their threads stay dirty and are retried) */
    uint64_t expired;   /* threads deleted by the ttl */
    uint64_t malformed; /* input bodies and event lines that could not be read */
    uint64_t max_commit_us; /* the longest commit */
    size_t cached;          /* threads in memory */
    size_t queued_bytes;    /* records waiting */
    uint64_t congestions;   /* times the store became congested (agw_store_congested()) */
    uint64_t thread_reads;  /* threads not in memory looked up in the database */
    uint64_t reads_spared;  /* look-ups of threads new to the database that read nothing */
    uint64_t unsaved;     /* threads let go with changes unwritten: the database refused commits and
                             the cache was full of threads waiting for it */
    uint64_t texts_bytes; /* long texts in the embedded store's segment files (history.texts) */
    uint64_t trims;       /* times the writer, idle, began to give back what its bursts left */
};
void agw_store_get_stats(struct agw_store *s, struct agw_store_stats *st);

#endif
