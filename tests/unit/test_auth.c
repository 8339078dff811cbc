/* Unit tests for src/auth.c: bearer tokens checked by SHA-256 digest (doc/protocol.md#auth). The
 * configuration is built by hand, so these tests do not depend on src/config.c. */
#include <criterion/criterion.h>

#include <string.h>

#include "agw/auth.h"

/* echo -n abc | sha256sum */
#define ABC_SHA256 "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
/* echo -n '' | sha256sum */
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* Mutable storage: the config structs hold char *, and -Wwrite-strings makes literals const. */
static char weather[] = "weather", travel[] = "travel";
static char id_web[] = "web", id_ops[] = "ops", id_partner[] = "partner", id_other[] = "other";
static char *weather_only[] = {weather};
static char *two_agents[] = {weather, travel};

static struct agw_auth_key keys[3];
static struct agw_auth_config bearer = {.mode = AGW_AUTH_BEARER, .keys = keys, .n_keys = 3};

static void set_digest(struct agw_auth_key *k, const char *token)
{
    char hex[65];

    agw_auth_hash_hex(token, strlen(token), hex);
    cr_assert_eq(agw_auth_parse_hex(hex, k->sha256), 0);
}

static void setup(void)
{
    memset(keys, 0, sizeof(keys));
    keys[0].id = id_web;
    set_digest(&keys[0], "tok-web-123");
    keys[0].agents = weather_only;
    keys[0].n_agents = 1;
    keys[1].id = id_ops;
    set_digest(&keys[1], "tok-ops-456");
    keys[1].all_agents = true;
    keys[2].id = id_partner;
    set_digest(&keys[2], "tok.partner~7+/==");
    keys[2].agents = two_agents;
    keys[2].n_agents = 2;
}

TestSuite(auth, .init = setup);

Test(auth, hash_known_vectors)
{
    char hex[65];

    agw_auth_hash_hex("abc", 3, hex);
    cr_assert_str_eq(hex, ABC_SHA256);
    agw_auth_hash_hex("", 0, hex);
    cr_assert_str_eq(hex, EMPTY_SHA256);
    agw_auth_hash_hex(NULL, 0, hex);
    cr_assert_str_eq(hex, EMPTY_SHA256);
    /* only <len> bytes are hashed */
    agw_auth_hash_hex("abcdef", 3, hex);
    cr_assert_str_eq(hex, ABC_SHA256);
}

Test(auth, parse_hex)
{
    static const uint8_t abc[32] = {0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea,
                                    0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23,
                                    0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c,
                                    0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
    uint8_t out[32];

    cr_assert_eq(agw_auth_parse_hex(ABC_SHA256, out), 0);
    cr_assert_arr_eq(out, abc, 32);
    cr_assert_eq(
        agw_auth_parse_hex("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD", out),
        0);
    cr_assert_arr_eq(out, abc, 32);
    cr_assert_eq(
        agw_auth_parse_hex("Ba7816bF8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015aD", out),
        0);
    cr_assert_arr_eq(out, abc, 32);
}

Test(auth, parse_hex_errors)
{
    static const char *const bad[] = {
        NULL,
        "",
        "ba",
        /* 63 */
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015a",
        /* 65 */
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015add",
        /* 128 */
        ABC_SHA256 ABC_SHA256,
        /* a non-hex character at the start, middle and end */
        "xa7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        "ba7816bf8f01cfea414140de5dae2223g00361a396177a9cb410ff61f20015ad",
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015aZ",
        /* spaces, prefixes */
        " ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad ",
        "0xba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015",
        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f2",
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(bad); i++) {
        uint8_t out[32];
        memset(out, 0x5a, sizeof(out));
        cr_assert_eq(agw_auth_parse_hex(bad[i], out), -AGW_EINVAL, "case %zu", i);
        for (size_t k = 0; k < sizeof(out); k++)
            cr_assert_eq(out[k], 0x5a, "case %zu: output written on error", i);
    }
}

Test(auth, check_table)
{
    static const struct {
        const char *header;
        const char *agent;
        enum agw_auth_result want;
        int key; /* index into keys[], -1 = NULL */
    } cases[] = {
        /* missing or malformed */
        {NULL, "weather", AGW_AUTH_MISSING, -1},
        {"", "weather", AGW_AUTH_MISSING, -1},
        {"tok-web-123", "weather", AGW_AUTH_MISSING, -1},
        {"Basic dXNlcjpwYXNz", "weather", AGW_AUTH_MISSING, -1},
        {"Basic tok-web-123", "weather", AGW_AUTH_MISSING, -1},
        {"Bearer", "weather", AGW_AUTH_MISSING, -1},
        {"Bearer ", "weather", AGW_AUTH_MISSING, -1},
        {"Bearer    ", "weather", AGW_AUTH_MISSING, -1},
        {"Bearertok-web-123", "weather", AGW_AUTH_MISSING, -1},
        {"Bearer\ttok-web-123", "weather", AGW_AUTH_MISSING, -1},
        {"Bearer: tok-web-123", "weather", AGW_AUTH_MISSING, -1},
        {"Token tok-web-123", "weather", AGW_AUTH_MISSING, -1},
        {"Bearer tok web", "weather", AGW_AUTH_MISSING, -1},
        {"Bearer tok-web-123,", "weather", AGW_AUTH_MISSING, -1},
        {"Bearer \"tok-web-123\"", "weather", AGW_AUTH_MISSING, -1},
        {"Bearer ==abc", "weather", AGW_AUTH_MISSING, -1},
        {"Bearer abc=def", "weather", AGW_AUTH_MISSING, -1},
        {"Bearer tok\x01", "weather", AGW_AUTH_MISSING, -1},
        {"Bearer caf\xc3\xa9", "weather", AGW_AUTH_MISSING, -1},
        /* the right token */
        {"Bearer tok-web-123", "weather", AGW_AUTH_OK, 0},
        {"bearer tok-web-123", "weather", AGW_AUTH_OK, 0},
        {"BEARER tok-web-123", "weather", AGW_AUTH_OK, 0},
        {"bEaReR tok-web-123", "weather", AGW_AUTH_OK, 0},
        {"Bearer   tok-web-123", "weather", AGW_AUTH_OK, 0},
        {" Bearer tok-web-123 ", "weather", AGW_AUTH_OK, 0},
        {"Bearer tok-web-123\t", "weather", AGW_AUTH_OK, 0},
        /* a token68 with every allowed character class */
        {"Bearer tok.partner~7+/==", "travel", AGW_AUTH_OK, 2},
        /* wrong tokens: well-formed, but no key has that digest */
        {"Bearer tok-web-124", "weather", AGW_AUTH_UNKNOWN, -1},
        {"Bearer tok-web-12", "weather", AGW_AUTH_UNKNOWN, -1},
        {"Bearer TOK-WEB-123", "weather", AGW_AUTH_UNKNOWN, -1},
        {"Bearer tok-web-123=", "weather", AGW_AUTH_UNKNOWN, -1},
        {"Bearer " ABC_SHA256, "weather", AGW_AUTH_UNKNOWN, -1},
        /* the token is right, the agent is not in the key's list */
        {"Bearer tok-web-123", "travel", AGW_AUTH_FORBIDDEN, 0},
        {"Bearer tok-web-123", "Weather", AGW_AUTH_FORBIDDEN, 0},
        {"Bearer tok-web-123", "weatherx", AGW_AUTH_FORBIDDEN, 0},
        {"Bearer tok.partner~7+/==", "ops", AGW_AUTH_FORBIDDEN, 2},
        /* no agent asked for: any valid key will do */
        {"Bearer tok-web-123", NULL, AGW_AUTH_OK, 0},
        /* "*" */
        {"Bearer tok-ops-456", "weather", AGW_AUTH_OK, 1},
        {"Bearer tok-ops-456", "anything-at-all", AGW_AUTH_OK, 1},
        {"Bearer tok-ops-456", NULL, AGW_AUTH_OK, 1},
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(cases); i++) {
        const struct agw_auth_key *key = &keys[1]; /* must be overwritten */
        enum agw_auth_result rc = agw_auth_check(&bearer, cases[i].header, cases[i].agent, &key);
        cr_assert_eq(rc, cases[i].want, "case %zu ('%s' for %s): %d", i,
                     cases[i].header ? cases[i].header : "(null)",
                     cases[i].agent ? cases[i].agent : "(any)", rc);
        if (cases[i].key < 0)
            cr_assert_null(key, "case %zu", i);
        else
            cr_assert_eq(key, &keys[cases[i].key], "case %zu", i);
    }
}

Test(auth, token_length_limit)
{
    static char header[7 + 4097 + 1];
    const struct agw_auth_key *key = NULL;
    struct agw_auth_key k = {.id = id_other, .all_agents = true};
    struct agw_auth_config cfg = {.mode = AGW_AUTH_BEARER, .keys = &k, .n_keys = 1};

    memcpy(header, "Bearer ", 7);
    memset(header + 7, 'a', 4096);
    header[7 + 4096] = '\0';
    set_digest(&k, header + 7);
    cr_assert_eq(agw_auth_check(&cfg, header, "x", &key), AGW_AUTH_OK);
    cr_assert_eq(key, &k);
    header[7 + 4096] = 'a';
    header[7 + 4097] = '\0';
    cr_assert_eq(agw_auth_check(&cfg, header, "x", &key), AGW_AUTH_MISSING);
    cr_assert_null(key);
}

Test(auth, mode_none)
{
    struct agw_auth_config none = {.mode = AGW_AUTH_NONE, .keys = keys, .n_keys = 3};
    static const char *const headers[] = {NULL, "", "Basic x", "Bearer nope", "Bearer tok-web-123"};

    for (size_t i = 0; i < AGW_ARRAY_LEN(headers); i++) {
        const struct agw_auth_key *key = &keys[0];
        cr_assert_eq(agw_auth_check(&none, headers[i], "travel", &key), AGW_AUTH_OK, "case %zu", i);
        cr_assert_null(key, "case %zu", i);
    }
}

Test(auth, no_keys_and_null_key_out)
{
    struct agw_auth_config empty = {.mode = AGW_AUTH_BEARER, .keys = NULL, .n_keys = 0};
    const struct agw_auth_key *key = &keys[0];

    cr_assert_eq(agw_auth_check(&empty, "Bearer tok-web-123", "weather", &key), AGW_AUTH_UNKNOWN);
    cr_assert_null(key);
    cr_assert_eq(agw_auth_check(&empty, NULL, "weather", &key), AGW_AUTH_MISSING);
    /* <key> may be NULL when the caller does not need it */
    cr_assert_eq(agw_auth_check(&bearer, "Bearer tok-web-123", "weather", NULL), AGW_AUTH_OK);
    cr_assert_eq(agw_auth_check(&bearer, "Bearer tok-web-123", "travel", NULL), AGW_AUTH_FORBIDDEN);
}

Test(auth, duplicate_digests_first_wins)
{
    struct agw_auth_key dup[2];
    struct agw_auth_config cfg = {.mode = AGW_AUTH_BEARER, .keys = dup, .n_keys = 2};
    const struct agw_auth_key *key = NULL;

    memset(dup, 0, sizeof(dup));
    dup[0].id = id_web;
    dup[0].agents = weather_only;
    dup[0].n_agents = 1;
    set_digest(&dup[0], "same");
    dup[1].id = id_ops;
    dup[1].all_agents = true;
    set_digest(&dup[1], "same");
    cr_assert_eq(agw_auth_check(&cfg, "Bearer same", "travel", &key), AGW_AUTH_FORBIDDEN);
    cr_assert_eq(key, &dup[0]);
}

Test(auth, key_allows)
{
    cr_assert(agw_auth_key_allows(&keys[0], "weather"));
    cr_assert_not(agw_auth_key_allows(&keys[0], "travel"));
    cr_assert_not(agw_auth_key_allows(&keys[0], ""));
    cr_assert(agw_auth_key_allows(&keys[0], NULL));
    cr_assert(agw_auth_key_allows(&keys[1], "travel"));
    cr_assert(agw_auth_key_allows(&keys[1], "anything"));
    cr_assert(agw_auth_key_allows(&keys[2], "weather"));
    cr_assert(agw_auth_key_allows(&keys[2], "travel"));
    cr_assert_not(agw_auth_key_allows(&keys[2], "ops"));
    cr_assert_not(agw_auth_key_allows(NULL, "weather"));

    struct agw_auth_key none = {.id = id_other};
    cr_assert_not(agw_auth_key_allows(&none, "weather"));
}
