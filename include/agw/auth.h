/* Bearer authentication (doc/protocol.md#auth): tokens are compared by their SHA-256 digest, in
 * constant time, against the configured keys. Pure. */
#ifndef AGW_AUTH_H
#define AGW_AUTH_H

#include "agw/config.h"

enum agw_auth_result {
    AGW_AUTH_OK = 0,
    AGW_AUTH_MISSING,   /* no or malformed Authorization header → 401 */
    AGW_AUTH_UNKNOWN,   /* no key with that digest → 401 */
    AGW_AUTH_FORBIDDEN, /* valid key, agent not in its list → 403 */
};

/* Checks <authorization> (the header value or NULL) for <agent_id> (NULL: any agent will do).
 * The header must be "Bearer <token>": scheme case-insensitive, one or more spaces, a token68 of at
 * most 4096 bytes; surrounding blanks are ignored. Anything else is AGW_AUTH_MISSING. The token's
 * SHA-256 is compared with every key in constant time; on duplicates the first key wins. On
 * AGW_AUTH_OK and AGW_AUTH_FORBIDDEN, *<key> points at the matching key (borrowed from <auth>),
 * otherwise it is set to NULL; <key> itself may be NULL. In mode "none" every request is
 * AGW_AUTH_OK with
 * *<key> = NULL. */
enum agw_auth_result agw_auth_check(const struct agw_auth_config *auth, const char *authorization,
                                    const char *agent_id, const struct agw_auth_key **key);

/* True when <key> may use <agent_id>: all_agents, or listed (exact, case-sensitive). NULL
 * <agent_id>: true; NULL <key>: false. */
bool agw_auth_key_allows(const struct agw_auth_key *key, const char *agent_id);

/* Fetches SHA-256 from OpenSSL now rather than at the first token checked. The first fetch loads
 * OpenSSL's default provider, about 2 MB of code and tables paged in: once, at start, not in the
 * first request (its latency, and the memory an open stream seems to cost). Thread-safe; any
 * number of calls. */
void agw_auth_prepare(void);

/* SHA-256 of <token> as 64 lowercase hex characters + NUL in <hex>. */
void agw_auth_hash_hex(const char *token, size_t len, char hex[65]);
/* Parses exactly 64 hex characters (either case) followed by NUL. Returns 0, or -AGW_EINVAL leaving
 * <out> untouched. */
int agw_auth_parse_hex(const char *hex, uint8_t out[32]);

#endif
