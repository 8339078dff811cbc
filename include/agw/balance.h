/* Balancing: the order in which a run tries an agent's backends. Pure: no sockets, no state but the
 * round-robin cursor the caller keeps.
 *
 * - thread_affinity (the default): rendezvous hashing. Each backend's weight is a hash of
 * (threadId, the backend's key — its URL); the heaviest comes first and the others follow by
 * weight, for retries. The same thread always goes to the same backend while it is up, and adding
 * or removing a backend moves only the threads that hash to that backend (about 1/n of them), so
 * backends that keep per-thread state keep their threads.
 * - round_robin: each run starts one backend further, the rest follow in order. */
#ifndef AGW_BALANCE_H
#define AGW_BALANCE_H

#include "agw/common.h"
#include "agw/config.h"

/* Writes into <order> the indices 0..<n>-1 of the backends named by <keys> in the order to try them
 * for a run of <thread_id>. <rr> is the agent's round-robin cursor (advanced for round_robin
 * with 2+ backends, unused otherwise). <n> is 1..AGW_MAX_UPSTREAMS. */
void agw_balance_order(enum agw_balance mode, const char *const *keys, size_t n,
                       const char *thread_id, size_t *rr, size_t *order);

/* The rendezvous weight of (<thread_id>, <key>): a 64-bit hash, for tests and tools. */
uint64_t agw_balance_weight(const char *thread_id, const char *key);

/* Passive health of one backend: <max_fails> failures before the first byte within <fail_timeout>
 * of the first of them mark it down for <fail_timeout>; a run that gets its answer brings it back
 * at once. Zeroed: up, no failure. Shared by the event loops: agw_health_down() and
 * agw_health_clean() read it from any thread at any time; agw_health_failed() and
 * agw_health_succeeded() change it, one caller at a time (the caller's lock). */
struct agw_health {
    uint64_t down_until_ms; /* 0: not marked (up); read atomically */
    unsigned fails;         /* failures counted since <since_ms>; read atomically */
    uint64_t since_ms;
};

static inline bool agw_health_down(const struct agw_health *h, uint64_t now_ms)
{
    return __atomic_load_n(&h->down_until_ms, __ATOMIC_RELAXED) > now_ms;
}

/* Neither marked nor failing: a success has nothing to change (no need to take the lock). */
static inline bool agw_health_clean(const struct agw_health *h)
{
    return __atomic_load_n(&h->down_until_ms, __ATOMIC_RELAXED) == 0 &&
           __atomic_load_n(&h->fails, __ATOMIC_RELAXED) == 0;
}

/* A failure at <now_ms>. True when it marks the backend down (it was not down). <max_fails> 0:
 * never marked. */
bool agw_health_failed(struct agw_health *h, uint64_t now_ms, unsigned max_fails,
                       uint32_t fail_timeout_ms);

/* The backend answered. True when it had been marked down (it is back). */
bool agw_health_succeeded(struct agw_health *h);

/* Moves the backends of <order> (<n> indices into <health>) that are down at <now_ms> after the
 * others, each group in its order; when all are down, the order stays (they are all tried). */
void agw_balance_skip_down(size_t *order, size_t n, const struct agw_health *health,
                           uint64_t now_ms);

#endif
