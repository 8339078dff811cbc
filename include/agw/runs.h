/* The registry of active runs (doc/protocol.md#decisions): an entry per run, keyed
 * ag_ui:{agent}:{thread}:{run}, from the moment its upstream stream opens until its terminal event,
 * upstream EOF, client disconnect (unless the agent detaches), cancellation or shutdown. Each entry
 * knows the backend that serves the run, so that a decision arriving on a new request can be
 * forwarded to it, and the relay that owns it, so that the run can be cancelled.
 *
 * One registry per process, shared by every event loop (workers), in one part per loop: a relay
 * adds its run to its own loop's part and removes it from there, on the loop that runs it (the
 * entry's <home>), so that registering a run touches nothing the other loops use. Lookups
 * are hash-indexed three ways: the exact key, the thread (decisions.match = "thread") and the run
 * id (the cancel endpoint knows no thread). When a client reuses a key while a run with it is
 * active, both are registered and lookups return the newest.
 *
 * Threads: agw_runs_add() and agw_runs_remove() take their part's lock themselves,
 * agw_runs_count() each part's in turn. The lookups do not: call them between agw_runs_lock() and
 * agw_runs_unlock() (which hold every part), and use what they return only until the unlock (copy
 * what you need). An entry's <owner> may be touched only on its <home> loop.
 *
 * (A registry shared by several instances, doc/protocol.md#not-yet, will sit behind this same
 * interface.) */
#ifndef AGW_RUNS_H
#define AGW_RUNS_H

#include "agw/common.h"

struct agw_runs;

enum { AGW_RUNS_BY_KEY = 0, AGW_RUNS_BY_THREAD, AGW_RUNS_BY_RUN, AGW_RUNS_N_INDEXES };

struct agw_run_entry {
    char *key; /* "ag_ui:{agent}:{thread}:{run}" */
    char *agent_id, *thread_id, *run_id;
    char *backend_url; /* the backend serving the run, as configured */
    const void *home;  /* the event loop that runs it: the only one that may touch <owner> */
    void *owner;       /* the caller's handle on the run (its relay) */
    uint64_t seq;      /* registration order: higher is newer (in its part; across parts, the
                          time of registration in ns, ties broken by <part>) */
    unsigned part;     /* the part it is in */
    /* private: index links */
    struct agw_run_entry *next[AGW_RUNS_N_INDEXES];
    uint64_t hash[AGW_RUNS_N_INDEXES];
};

/* A registry of <n_parts> parts (one per event loop; 0 is taken as 1). */
struct agw_runs *agw_runs_new(unsigned n_parts);
/* Frees the registry and any entry still in it. */
void agw_runs_free(struct agw_runs *runs);
size_t agw_runs_count(struct agw_runs *runs);

/* Registers a run in part <part> (the caller's loop's; out of range: 0); the strings are copied.
 * Returns the entry, valid until agw_runs_remove(). */
struct agw_run_entry *agw_runs_add(struct agw_runs *runs, unsigned part, const char *agent_id,
                                   const char *thread_id, const char *run_id,
                                   const char *backend_url, const void *home, void *owner);
void agw_runs_remove(struct agw_runs *runs, struct agw_run_entry *e);

/* Holds the registry still for the lookups below. */
void agw_runs_lock(struct agw_runs *runs);
void agw_runs_unlock(struct agw_runs *runs);

/* The newest active run with exactly this key, or NULL. */
struct agw_run_entry *agw_runs_find(const struct agw_runs *runs, const char *agent_id,
                                    const char *thread_id, const char *run_id);
/* The newest active run of (agent, thread), or NULL. */
struct agw_run_entry *agw_runs_latest(const struct agw_runs *runs, const char *agent_id,
                                      const char *thread_id);
/* Stores up to <max> active runs of <agent_id> with run id <run_id> (any thread), newest first;
 * returns how many there are in all. */
size_t agw_runs_by_run_id(const struct agw_runs *runs, const char *agent_id, const char *run_id,
                          struct agw_run_entry **out, size_t max);

#endif
