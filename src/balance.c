/* Balancing: see include/agw/balance.h. */
#include "config.h"

#include <assert.h>

#include "agw/balance.h"
#include "agw/limits.h"

uint64_t agw_balance_weight(const char *thread_id, const char *key)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a over thread, a separator, key */

    for (const char *a = thread_id; *a; a++)
        h = (h ^ (unsigned char)*a) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL;
    for (const char *b = key; *b; b++)
        h = (h ^ (unsigned char)*b) * 1099511628211ULL;
    /* final avalanche (splitmix64): FNV alone leaves related keys' weights correlated */
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 31;
    return h;
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
