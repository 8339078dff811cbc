/* Bearer authentication (doc/protocol.md#auth).
 *
 * The token is never compared or stored in clear: it is hashed with SHA-256 straight from the
 * header value (no copy is made) and the digest is compared with every configured key's digest
 * using CRYPTO_memcmp, always over all keys, so the time taken says nothing about which key or
 * which prefix matched. The digest is wiped from the stack before returning. */
#include "config.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "agw/auth.h"

#define TOKEN_MAX 4096 /* bytes; longer credentials are malformed, not looked up */

/* SHA-256 only fails when OpenSSL cannot allocate its context, which the out-of-memory policy of
 * agw/common.h turns into an abort: carrying on with an undefined digest could authenticate
 * someone. */
/* OpenSSL 3 looks the algorithm up and allocates a context on every EVP_Digest() call: the
 * algorithm is fetched once for the process, and each thread keeps one context, reset per use and
 * freed when the thread ends (the key's destructor). */
static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static pthread_key_t sha256_key;
static _Thread_local EVP_MD_CTX *sha256_ctx;

static void sha256_ctx_free(void *ctx)
{
    EVP_MD_CTX_free(ctx);
}

static void sha256_fetch(void)
{
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (pthread_key_create(&sha256_key, sha256_ctx_free) != 0)
        abort();
}

void agw_auth_prepare(void)
{
    pthread_once(&sha256_once, sha256_fetch);
}

static void sha256(const void *data, size_t len, uint8_t md[32])
{
    unsigned int mdlen = 0;

    pthread_once(&sha256_once, sha256_fetch);
    if (sha256_ctx == NULL) {
        sha256_ctx = EVP_MD_CTX_new();
        pthread_setspecific(sha256_key, sha256_ctx);
    }
    if (sha256_md == NULL || sha256_ctx == NULL ||
        EVP_DigestInit_ex2(sha256_ctx, sha256_md, NULL) != 1 ||
        EVP_DigestUpdate(sha256_ctx, data, len) != 1 ||
        EVP_DigestFinal_ex(sha256_ctx, md, &mdlen) != 1 || mdlen != 32) {
        fprintf(stderr, "agui-gateway: SHA-256 failed\n");
        abort();
    }
}

/* token68 (RFC 9110 §11.2): 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=" */
static bool token68_valid(const char *t, size_t n)
{
    size_t i = 0;

    while (i < n) {
        char c = t[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/'))
            break;
        i++;
    }
    if (i == 0)
        return false;
    while (i < n && t[i] == '=')
        i++;
    return i == n;
}

/* Finds the token in "Bearer <token>": the scheme is case-insensitive, one or more spaces separate
 * it from the token, and surrounding blanks (SP, HTAB) are ignored. Returns false for anything
 * else. */
static bool bearer_token(const char *h, const char **tok, size_t *toklen)
{
    static const char scheme[] = "Bearer";
    const size_t n = sizeof(scheme) - 1;
    const char *end;

    while (*h == ' ' || *h == '\t')
        h++;
    if (strlen(h) <= n || !agw_strieq_n(h, n, scheme) || h[n] != ' ')
        return false;
    h += n;
    while (*h == ' ')
        h++;
    end = h + strlen(h);
    while (end > h && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    if (end == h || (size_t)(end - h) > TOKEN_MAX || !token68_valid(h, (size_t)(end - h)))
        return false;
    *tok = h;
    *toklen = (size_t)(end - h);
    return true;
}

enum agw_auth_result agw_auth_check(const struct agw_auth_config *auth, const char *authorization,
                                    const char *agent_id, const struct agw_auth_key **key)
{
    const struct agw_auth_key *found = NULL;
    const char *tok = NULL;
    size_t toklen = 0;
    uint8_t md[32];

    assert(auth != NULL);
    if (key != NULL)
        *key = NULL;
    if (auth->mode == AGW_AUTH_NONE)
        return AGW_AUTH_OK;
    if (authorization == NULL || !bearer_token(authorization, &tok, &toklen))
        return AGW_AUTH_MISSING;

    sha256(tok, toklen, md);
    for (size_t i = 0; i < auth->n_keys; i++) {
        /* No break: every key is compared whatever the outcome. The first match wins on duplicates.
         */
        bool eq = CRYPTO_memcmp(md, auth->keys[i].sha256, sizeof(md)) == 0;
        if (eq && found == NULL)
            found = &auth->keys[i];
    }
    OPENSSL_cleanse(md, sizeof(md));

    if (found == NULL)
        return AGW_AUTH_UNKNOWN;
    if (key != NULL)
        *key = found;
    return agw_auth_key_allows(found, agent_id) ? AGW_AUTH_OK : AGW_AUTH_FORBIDDEN;
}

bool agw_auth_key_allows(const struct agw_auth_key *key, const char *agent_id)
{
    if (key == NULL)
        return false;
    if (agent_id == NULL || key->all_agents)
        return true;
    for (size_t i = 0; i < key->n_agents; i++) {
        if (key->agents[i] != NULL && strcmp(key->agents[i], agent_id) == 0)
            return true;
    }
    return false;
}

void agw_auth_hash_hex(const char *token, size_t len, char hex[65])
{
    static const char digits[] = "0123456789abcdef";
    uint8_t md[32];

    assert(token != NULL || len == 0);
    sha256(len > 0 ? token : "", len, md);
    for (size_t i = 0; i < sizeof(md); i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 0x0f];
    }
    hex[64] = '\0';
    OPENSSL_cleanse(md, sizeof(md));
}

int agw_auth_parse_hex(const char *hex, uint8_t out[32])
{
    return agw_hex_decode(hex, out, 32);
}
