/* libFuzzer driver for the configuration loader (src/config.c, agw_config_load_string()). The
 * input is the configuration text itself (cut at its first NUL, as a C string is), so the seeds are
 * plain configuration files: conf/agui-gateway.example.json and the ones tests/integration/ writes.
 *
 * Checks (besides ASan/UBSan/LSan: no crash, no leak): a refused text gets an error that names a
 * key path, "<path>: <reason>", whose first segment is "(top level)", a top-level key the loader
 * knows or a key of the text's own top-level object (an unknown one), or an "invalid JSON at line
 * L, column C: ..." for what jansson refuses; a small error buffer gets the same verdict and the
 * start of the same message. A loaded configuration holds what the loader promises: 1..16
 * listeners, at least one agent, agents sorted by a valid unique id and each found by
 * agw_config_find_agent(), each with at least one upstream URL whose target starts with '/', keys
 * when auth is "bearer", non-zero limits.
 *
 *   tests/fuzz/build.sh _build-fuzz config     (or by hand, with every library source:)
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -I_build tests/fuzz/fuzz_config.c \
 *       $(find src -name '*.c' ! -name main.c) \
 *       $(pkg-config --cflags --libs evhtp libevent_openssl libevent_pthreads openssl jansson)
 *   ./a.out tests/fuzz/corpus/config */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "agw/config.h"
#include "agw/log.h"
#include "agw/router.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const top_keys[] = {"listen", "admin",    "auth",  "agents",
                                       "limits", "timeouts", "store", "decisions",
                                       "log",    "workers",  NULL};

static void fatal(const char *what, const char *err)
{
    fprintf(stderr, "fuzz_config: %s%s%s\n", what, err ? ": " : "", err ? err : "");
    abort();
}

/* Key paths are built in 256-byte buffers: a longer one is shown cut. */
#define PATH_MAX_SHOWN 255

/* <err> starts with <key> followed by the end of the path's first segment, or with the start of
 * a key too long to be shown whole. */
static bool names(const char *err, const char *key)
{
    size_t n = strlen(key);

    if (n >= PATH_MAX_SHOWN && strncmp(err, key, PATH_MAX_SHOWN) == 0 && err[PATH_MAX_SHOWN] == ':')
        return true;
    return strncmp(err, key, n) == 0 && (err[n] == '.' || err[n] == '[' || err[n] == ':');
}

static void check_error(const char *text, const char *err)
{
    json_t *root;
    bool named = false;

    if (err[0] == '\0')
        fatal("refused without a message", NULL);
    /* jansson's verdict decides which kind of message is due: a key may itself read "invalid JSON
     * at line ", so the message's start cannot. */
    root = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
    if (root == NULL) {
        if (strncmp(err, "invalid JSON at line ", 21) != 0)
            fatal("a text jansson refuses, without \"invalid JSON at line …\"", err);
        return;
    }
    if (strstr(err, ": ") == NULL || strstr(err, ": ")[2] == '\0') {
        json_decref(root);
        fatal("an error that is not \"<path>: <reason>\"", err);
    }
    if (strncmp(err, "(top level): ", 13) == 0) {
        json_decref(root);
        return;
    }
    for (size_t i = 0; top_keys[i] != NULL && !named; i++)
        named = names(err, top_keys[i]);
    if (!named && json_is_object(root)) {
        const char *key;
        json_t *v;
        json_object_foreach(root, key, v)
        {
            if (names(err, key)) {
                named = true;
                break;
            }
        }
    }
    json_decref(root);
    if (!named)
        fatal("an error that names no key path", err);
}

static void check_config(const struct agw_config *cfg)
{
    if (cfg->n_listeners < 1 || cfg->n_listeners > 16 || cfg->listeners == NULL)
        fatal("loaded without 1..16 listeners", NULL);
    for (size_t i = 0; i < cfg->n_listeners; i++)
        if (cfg->listeners[i].address == NULL)
            fatal("a listener without an address", NULL);
    if (cfg->n_agents < 1 || cfg->agents == NULL)
        fatal("loaded without agents", NULL);
    for (size_t i = 0; i < cfg->n_agents; i++) {
        const struct agw_agent_config *a = &cfg->agents[i];

        if (!agw_agent_id_valid(a->id))
            fatal("an agent with an invalid id", a->id);
        if (i > 0 && strcmp(cfg->agents[i - 1].id, a->id) >= 0)
            fatal("agents not sorted by a unique id", a->id);
        if (agw_config_find_agent(cfg, a->id) != a)
            fatal("agw_config_find_agent() does not find an agent", a->id);
        if (a->n_upstreams < 1)
            fatal("an agent without upstreams", a->id);
        for (size_t j = 0; j < a->n_upstreams; j++) {
            const struct agw_url *u = &a->upstreams[j];
            if (u->text == NULL || u->host == NULL || u->host[0] == '\0' || u->target == NULL ||
                u->target[0] != '/' || u->authority == NULL || u->port == 0)
                fatal("an upstream URL without host, port or target", a->id);
        }
        for (size_t j = 0; j < a->n_upstream_headers; j++)
            if (a->upstream_headers[j].name == NULL || a->upstream_headers[j].value == NULL)
                fatal("an upstream header without name or value", a->id);
    }
    if (cfg->auth.mode == AGW_AUTH_BEARER && cfg->auth.n_keys == 0)
        fatal("bearer auth without keys", NULL);
    if (cfg->limits.max_body_bytes == 0 || cfg->limits.max_frame_bytes == 0 ||
        cfg->limits.max_header_bytes == 0 || cfg->limits.stream_buffer_bytes == 0 ||
        cfg->limits.max_json_depth == 0)
        fatal("a zero limit", NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool quiet;
    char err[AGW_CONFIG_ERR_MAX], small[48];
    size_t small_len = 1 + size % sizeof(small);
    struct agw_config *cfg, *cfg2;
    char *text;

    if (!quiet) {
        agw_log_set_level(AGW_LOG_ERROR);
        quiet = true;
    }
    text = agw_xstrndup((const char *)data, size);
    err[0] = '\0';
    cfg = agw_config_load_string(text, err, sizeof(err));
    if (cfg == NULL)
        check_error(text, err);
    else
        check_config(cfg);

    memset(small, 'X', sizeof(small));
    small[0] = '\0';
    cfg2 = agw_config_load_string(text, small, small_len);
    if ((cfg2 == NULL) != (cfg == NULL))
        fatal("the verdict depends on the error buffer's size", NULL);
    if (cfg2 == NULL &&
        (memchr(small, '\0', small_len) == NULL || strncmp(small, err, strlen(small)) != 0))
        fatal("a small error buffer does not hold the start of the message", small);
    agw_config_free(cfg2);
    agw_config_free(cfg);
    free(text);
    return 0;
}
