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
 * for a run of <thread_id>. <rr> is the agent's round-robin cursor (advanced for round_robin,
 * unused otherwise). <n> is 1..AGW_MAX_UPSTREAMS. */
void agw_balance_order(enum agw_balance mode, const char *const *keys, size_t n,
                       const char *thread_id, size_t *rr, size_t *order);

/* The rendezvous weight of (<thread_id>, <key>): a 64-bit hash, for tests and tools. */
uint64_t agw_balance_weight(const char *thread_id, const char *key);

#endif
