/* libFuzzer driver for the CORS checks (src/cors.c), which read three request fields a client
 * chooses: Origin, Access-Control-Request-Method and Access-Control-Request-Headers. The input is
 * split on its first two NUL bytes into those three values (missing parts are NULL); they are
 * checked against a configuration with an origin list and one with "*".
 *
 * Checks: an origin is allowed exactly when it is byte for byte one of the list's (or with "*"
 * whenever it is present); a preflight passes only when the method is one of GET, POST, OPTIONS and
 * every comma- or space-separated name is an allowed header (compared without case), and a refusal
 * says which in a bounded message; the header fields of an answer echo only a listed origin.
 *
 *   tests/fuzz/build.sh _build-fuzz cors
 *   ./_build-fuzz/fuzz_cors tests/fuzz/corpus/cors */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "agw/cors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct agw_config *list_cfg, *any_cfg;

static struct agw_config *load(const char *cors)
{
    char json[1024], err[AGW_CONFIG_ERR_MAX];
    struct agw_config *cfg;

    snprintf(json, sizeof(json),
             "{\"listen\":[{\"address\":\"127.0.0.1\",\"port\":0}],\"auth\":{\"mode\":\"none\"},"
             "\"agents\":{\"a\":{\"upstreams\":[\"http://127.0.0.1:9/\"]}},\"cors\":%s}",
             cors);
    cfg = agw_config_load_string(json, err, sizeof(err));
    if (cfg == NULL) {
        fprintf(stderr, "fuzz_cors: %s\n", err);
        abort();
    }
    return cfg;
}

static const char *const origins[] = {"https://app.example.com", "http://127.0.0.1:5173"};
static const char *const methods[] = {"GET", "POST", "OPTIONS"};
static const char *const headers[] = {"authorization", "content-type", "accept", "x-request-id",
                                      "traceparent"};

/* The reference reading of Access-Control-Request-Headers. */
static bool headers_allowed(const char *list)
{
    char *copy = strdup(list), *save = NULL;
    bool ok = true;

    for (char *t = strtok_r(copy, ", \t", &save); t != NULL && ok;
         t = strtok_r(NULL, ", \t", &save)) {
        bool found = false;
        for (size_t i = 0; i < sizeof(headers) / sizeof(headers[0]); i++)
            found |= strcasecmp(t, headers[i]) == 0;
        ok = found;
    }
    free(copy);
    return ok;
}

struct seen {
    const char *origin;
    bool bad;
};

static void check_field(const char *name, const char *value, void *arg)
{
    struct seen *s = arg;

    if (strcmp(name, "Access-Control-Allow-Origin") == 0 && strcmp(value, "*") != 0 &&
        strcmp(value, s->origin) != 0)
        s->bad = true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1), *part[3] = {NULL, NULL, NULL}, err[512];
    size_t n = 0;
    bool listed = false, method_ok = false;

    if (list_cfg == NULL) {
        list_cfg = load("{\"allowed_origins\":[\"https://app.example.com\","
                        "\"http://127.0.0.1:5173\"]}");
        any_cfg = load("{\"allowed_origins\":[\"*\"]}");
    }
    memcpy(buf, data, size);
    buf[size] = '\0';
    part[n++] = buf;
    for (size_t i = 0; i < size && n < 3; i++)
        if (buf[i] == '\0')
            part[n++] = buf + i + 1;
    for (size_t i = 0; part[0] != NULL && i < 2; i++)
        listed |= strcmp(part[0], origins[i]) == 0;
    if (agw_cors_check_origin(&list_cfg->cors, part[0]) !=
        (listed ? AGW_CORS_ALLOWED : AGW_CORS_DENIED))
        abort();
    if (agw_cors_check_origin(&any_cfg->cors, part[0]) != AGW_CORS_ALLOWED)
        abort();
    for (size_t i = 0; part[1] != NULL && i < 3; i++)
        method_ok |= strcmp(part[1], methods[i]) == 0;
    int rc = agw_cors_check_preflight(&list_cfg->cors, part[1], part[2], err, sizeof(err));
    bool expect = method_ok && (part[2] == NULL || headers_allowed(part[2]));
    if ((rc == 0) != expect || (rc != 0 && (strlen(err) == 0 || strlen(err) >= sizeof(err))))
        abort();
    if (listed) {
        struct seen s = {part[0], false};
        agw_cors_headers(&list_cfg->cors, part[0], part[1] != NULL, check_field, &s);
        if (s.bad)
            abort();
    }
    free(buf);
    return 0;
}
