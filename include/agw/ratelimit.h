/* Rate limits per key (doc/configuration.md#rate-limits): a token bucket of runs per minute with a
 * burst, and a ceiling on concurrent runs. One object per process, shared by every worker loop
 * under a mutex (one lock per run start and one per run end, never per event).
 *
 * Ownership: the gateway owns the object. Each key's entry lives as long as the object: a run keeps
 * a pointer to its entry until it ends, whatever reloads happen meanwhile. */
#ifndef AGW_RATELIMIT_H
#define AGW_RATELIMIT_H

#include "agw/config.h"

struct evbuffer;
struct agw_ratelimit;
struct agw_rl_entry;

enum agw_rl_verdict {
    AGW_RL_OK = 0,
    AGW_RL_RATE,        /* runs_per_minute: the bucket is empty */
    AGW_RL_CONCURRENCY, /* concurrent_runs: that many runs of the key are streaming */
};

struct agw_ratelimit *agw_ratelimit_new(void);
void agw_ratelimit_free(struct agw_ratelimit *rl);

/* Applies the limits of <cfg>: each key's, by id (with auth off, the top-level rate_limit for every
 * client, under the id ""). A key that stays keeps its bucket and its running runs; a key that goes
 * keeps its entry with no limit, for the runs it still has. A new or raised limit starts full. */
void agw_ratelimit_configure(struct agw_ratelimit *rl, const struct agw_config *cfg,
                             uint64_t now_ms);

/* Before a run of key <key_id> ("" with auth off) at <now_ms>: takes a token and a concurrent slot
 * and returns AGW_RL_OK with *<entry> set (give it to agw_ratelimit_release when the run ends), or
 * returns the limit that refuses the run, *<retry_after_s> the seconds after which it would pass
 * (at least 1) and *<entry> NULL. */
enum agw_rl_verdict agw_ratelimit_acquire(struct agw_ratelimit *rl, const char *key_id,
                                          uint64_t now_ms, uint32_t *retry_after_s,
                                          struct agw_rl_entry **entry);
/* The run that took <e> ended (NULL: nothing). */
void agw_ratelimit_release(struct agw_ratelimit *rl, struct agw_rl_entry *e);

/* Runs of <key_id> running now (for tests and metrics). */
unsigned agw_ratelimit_active(struct agw_ratelimit *rl, const char *key_id);

/* Prometheus text: agw_rate_limited_total{key,limit} and agw_key_active_runs{key}. */
void agw_ratelimit_write_metrics(struct agw_ratelimit *rl, struct evbuffer *out);

#endif
