/* Tests for src/cors.c: which origins are allowed, what a preflight may ask for, and the header
 * fields of each kind of answer. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "agw/cors.h"

static struct agw_config *load(const char *cors)
{
    char json[1024], err[AGW_CONFIG_ERR_MAX];
    struct agw_config *cfg;

    snprintf(json, sizeof(json),
             "{\"listen\":[{\"address\":\"127.0.0.1\",\"port\":0}],\"auth\":{\"mode\":\"none\"},"
             "\"agents\":{\"a\":{\"upstreams\":[\"http://127.0.0.1:9/\"]}}%s%s}",
             cors != NULL ? ",\"cors\":" : "", cors != NULL ? cors : "");
    cfg = agw_config_load_string(json, err, sizeof(err));
    cr_assert_not_null(cfg, "%s", err);
    return cfg;
}

struct fields {
    char text[1024];
};

static void collect(const char *name, const char *value, void *arg)
{
    struct fields *f = arg;
    size_t n = strlen(f->text);

    snprintf(f->text + n, sizeof(f->text) - n, "%s: %s\n", name, value);
}

Test(cors, origins)
{
    struct agw_config *off = load(NULL);
    struct agw_config *list =
        load("{\"allowed_origins\":[\"https://app.example.com\",\"http://127.0.0.1:5173\"]}");
    struct agw_config *any = load("{\"allowed_origins\":[\"*\"]}");

    cr_assert_eq(agw_cors_check_origin(&off->cors, NULL), AGW_CORS_NONE);
    cr_assert_eq(agw_cors_check_origin(&off->cors, "https://app.example.com"), AGW_CORS_DENIED,
                 "without a cors object, no origin is allowed");
    cr_assert_eq(agw_cors_check_origin(&list->cors, "https://app.example.com"), AGW_CORS_ALLOWED);
    cr_assert_eq(agw_cors_check_origin(&list->cors, "http://127.0.0.1:5173"), AGW_CORS_ALLOWED);
    cr_assert_eq(agw_cors_check_origin(&list->cors, "http://127.0.0.1:5174"), AGW_CORS_DENIED);
    cr_assert_eq(agw_cors_check_origin(&list->cors, "http://app.example.com"), AGW_CORS_DENIED,
                 "the scheme is part of the origin");
    cr_assert_eq(agw_cors_check_origin(&list->cors, "https://app.example.com.evil.test"),
                 AGW_CORS_DENIED, "exact match, not a prefix");
    cr_assert_eq(agw_cors_check_origin(&list->cors, "null"), AGW_CORS_DENIED);
    cr_assert_eq(agw_cors_check_origin(&list->cors, ""), AGW_CORS_DENIED);
    cr_assert_eq(agw_cors_check_origin(&any->cors, "https://anything.test"), AGW_CORS_ALLOWED);
    cr_assert_eq(agw_cors_check_origin(&any->cors, NULL), AGW_CORS_NONE);
    agw_config_free(off);
    agw_config_free(list);
    agw_config_free(any);
}

Test(cors, preflight_checks)
{
    struct agw_config *cfg = load("{\"allowed_origins\":[\"*\"]}");
    char err[512];

    cr_assert_eq(agw_cors_check_preflight(&cfg->cors, "POST", NULL, err, sizeof(err)), 0);
    cr_assert_eq(agw_cors_check_preflight(&cfg->cors, "POST", "authorization,content-type", err,
                                          sizeof(err)),
                 0, "%s", err);
    cr_assert_eq(agw_cors_check_preflight(&cfg->cors, "POST",
                                          " Authorization ,  Content-Type,traceparent", err,
                                          sizeof(err)),
                 0, "%s", err);
    cr_assert_eq(agw_cors_check_preflight(&cfg->cors, "POST", "", err, sizeof(err)), 0);
    cr_assert_eq(agw_cors_check_preflight(&cfg->cors, "DELETE", NULL, err, sizeof(err)),
                 -AGW_EINVAL);
    cr_assert_str_eq(err, "method 'DELETE' is not allowed (cors.allowed_methods: GET, POST, "
                          "OPTIONS)");
    cr_assert_eq(agw_cors_check_preflight(&cfg->cors, "post", NULL, err, sizeof(err)), -AGW_EINVAL,
                 "methods are case-sensitive");
    cr_assert_eq(agw_cors_check_preflight(&cfg->cors, NULL, NULL, err, sizeof(err)), -AGW_EINVAL);
    cr_assert_eq(
        agw_cors_check_preflight(&cfg->cors, "POST", "content-type,x-secret", err, sizeof(err)),
        -AGW_EINVAL);
    cr_assert(strncmp(err, "header 'x-secret' is not allowed", 32) == 0, "%s", err);
    cr_assert_eq(agw_cors_check_preflight(&cfg->cors, "POST", "content-typex", err, sizeof(err)),
                 -AGW_EINVAL, "a header name is matched whole");
    agw_config_free(cfg);
}

Test(cors, header_fields)
{
    struct agw_config *list = load("{\"allowed_origins\":[\"https://app.example.com\"],"
                                   "\"allow_credentials\":true,\"max_age\":\"2m\"}");
    struct agw_config *any =
        load("{\"allowed_origins\":[\"*\"],\"exposed_headers\":[],\"allowed_headers\":[]}");
    struct fields f = {""};

    agw_cors_headers(&list->cors, "https://app.example.com", true, collect, &f);
    cr_assert_str_eq(f.text, "Access-Control-Allow-Origin: https://app.example.com\n"
                             "Vary: Origin\n"
                             "Access-Control-Allow-Credentials: true\n"
                             "Access-Control-Allow-Methods: GET, POST, OPTIONS\n"
                             "Access-Control-Allow-Headers: Authorization, Content-Type, Accept, "
                             "X-Request-Id, traceparent\n"
                             "Access-Control-Max-Age: 120\n");
    f.text[0] = '\0';
    agw_cors_headers(&list->cors, "https://app.example.com", false, collect, &f);
    cr_assert_str_eq(f.text, "Access-Control-Allow-Origin: https://app.example.com\n"
                             "Vary: Origin\n"
                             "Access-Control-Allow-Credentials: true\n"
                             "Access-Control-Expose-Headers: X-Request-Id, Retry-After\n");
    f.text[0] = '\0';
    agw_cors_headers(&any->cors, "https://x.test", true, collect, &f);
    cr_assert_str_eq(f.text, "Access-Control-Allow-Origin: *\n"
                             "Access-Control-Allow-Methods: GET, POST, OPTIONS\n"
                             "Access-Control-Max-Age: 600\n");
    f.text[0] = '\0';
    agw_cors_headers(&any->cors, "https://x.test", false, collect, &f);
    cr_assert_str_eq(f.text, "Access-Control-Allow-Origin: *\n");
    agw_config_free(list);
    agw_config_free(any);
}
