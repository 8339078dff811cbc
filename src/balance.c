/* Balancing: see include/agw/balance.h. */
#include "config.h"

#include <assert.h>
#include <string.h>

#include "agw/balance.h"
#include "agw/limits.h"

uint64_t agw_balance_weight(const char *thread_id, const char *key)
{
    /* FNV-1a over thread, a separator, key; the final avalanche because FNV alone leaves related
     * keys' weights correlated */
    uint64_t h = agw_fnv1a(AGW_FNV_INIT, thread_id, strlen(thread_id));

    h = agw_fnv1a(h, "\xff", 1);
    return agw_hash_mix(agw_fnv1a(h, key, strlen(key)));
}

void agw_balance_order(enum agw_balance mode, const char *const *keys, size_t n,
                       const char *thread_id, size_t *rr, size_t *order)
{
    uint64_t w[AGW_MAX_UPSTREAMS];

    assert(n > 0 && n <= AGW_MAX_UPSTREAMS);
    if (n == 1) { /* one backend: nothing to weigh (two hashes of the thread's id a run, saved) */
        order[0] = 0;
        return;
    }
    if (mode == AGW_BALANCE_ROUND_ROBIN) {
        size_t first = (*rr)++ % n;
        for (size_t i = 0; i < n; i++)
            order[i] = (first + i) % n;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        order[i] = i;
        w[i] = agw_balance_weight(thread_id, keys[i]);
    }
    for (size_t i = 1; i < n; i++) { /* insertion sort, descending weight; n is small */
        for (size_t j = i; j > 0 && w[j] > w[j - 1]; j--) {
            uint64_t tw = w[j];
            size_t to = order[j];
            w[j] = w[j - 1];
            order[j] = order[j - 1];
            w[j - 1] = tw;
            order[j - 1] = to;
        }
    }
}

bool agw_health_failed(struct agw_health *h, uint64_t now_ms, unsigned max_fails,
                       uint32_t fail_timeout_ms)
{
    bool was_down = agw_health_down(h, now_ms);
    unsigned fails = h->fails;

    if (max_fails == 0)
        return false;
    if (fails == 0 || now_ms - h->since_ms >= fail_timeout_ms) { /* a new window */
        fails = 0;
        h->since_ms = now_ms;
    }
    if (++fails < max_fails) {
        __atomic_store_n(&h->fails, fails, __ATOMIC_RELAXED);
        return false;
    }
    __atomic_store_n(&h->fails, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&h->down_until_ms, now_ms + fail_timeout_ms, __ATOMIC_RELAXED);
    return !was_down;
}

bool agw_health_succeeded(struct agw_health *h)
{
    bool was_marked = h->down_until_ms != 0;

    __atomic_store_n(&h->down_until_ms, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&h->fails, 0, __ATOMIC_RELAXED);
    return was_marked;
}

void agw_balance_skip_down(size_t *order, size_t n, const struct agw_health *health,
                           uint64_t now_ms)
{
    size_t up[AGW_MAX_UPSTREAMS], down[AGW_MAX_UPSTREAMS], nu = 0, nd = 0;

    assert(n <= AGW_MAX_UPSTREAMS);
    for (size_t i = 0; i < n; i++) {
        if (agw_health_down(&health[order[i]], now_ms))
            down[nd++] = order[i];
        else
            up[nu++] = order[i];
    }
    if (nd == 0 || nu == 0)
        return;
    memcpy(order, up, nu * sizeof(*order));
    memcpy(order + nu, down, nd * sizeof(*order));
}
