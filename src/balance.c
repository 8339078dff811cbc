/* Balancing: see include/agw/balance.h. */
#include "config.h"

#include <assert.h>

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
