/* CORS decisions and header fields: see include/agw/cors.h. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "agw/cors.h"

enum agw_cors_origin agw_cors_check_origin(const struct agw_cors_config *c, const char *origin)
{
    if (origin == NULL)
        return AGW_CORS_NONE;
    if (!c->enabled)
        return AGW_CORS_DENIED;
    if (c->any_origin)
        return AGW_CORS_ALLOWED;
    for (size_t i = 0; i < c->n_origins; i++)
        if (strcmp(c->origins[i], origin) == 0)
            return AGW_CORS_ALLOWED;
    return AGW_CORS_DENIED;
}

static bool listed(char *const *list, size_t n, const char *s, size_t len, bool nocase)
{
    for (size_t i = 0; i < n; i++) {
        if (nocase ? agw_strieq_n(s, len, list[i])
                   : strlen(list[i]) == len && memcmp(list[i], s, len) == 0)
            return true;
    }
    return false;
}

int agw_cors_check_preflight(const struct agw_cors_config *c, const char *method,
                             const char *headers, char *err, size_t errlen)
{
    const char *p = headers;

    if (method == NULL || !listed(c->methods, c->n_methods, method, strlen(method), false)) {
        snprintf(err, errlen, "method '%.32s' is not allowed (cors.allowed_methods: %s)",
                 method != NULL ? method : "", c->methods_value);
        return -AGW_EINVAL;
    }
    /* A comma-separated list of header names, with optional spaces (Fetch: "a, b"). */
    while (p != NULL && *p != '\0') {
        size_t len;
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        len = strcspn(p, ", \t");
        if (len == 0)
            break;
        if (!listed(c->headers, c->n_headers, p, len, true)) {
            snprintf(err, errlen, "header '%.*s' is not allowed (cors.allowed_headers: %s)",
                     (int)(len > 64 ? 64 : len), p, c->headers_value);
            return -AGW_EINVAL;
        }
        p += len;
    }
    return 0;
}

void agw_cors_headers(const struct agw_cors_config *c, const char *origin, bool preflight,
                      agw_cors_header_fn *fn, void *arg)
{
    char age[16];

    /* "*" answers "*" (never with credentials, the configuration refuses it); a list echoes the
     * origin, and caches must then key on it. */
    if (c->any_origin) {
        fn("Access-Control-Allow-Origin", "*", arg);
    } else {
        fn("Access-Control-Allow-Origin", origin, arg);
        fn("Vary", "Origin", arg);
    }
    if (c->allow_credentials)
        fn("Access-Control-Allow-Credentials", "true", arg);
    if (preflight) {
        snprintf(age, sizeof(age), "%u", c->max_age_s);
        fn("Access-Control-Allow-Methods", c->methods_value, arg);
        if (c->headers_value[0] != '\0')
            fn("Access-Control-Allow-Headers", c->headers_value, arg);
        fn("Access-Control-Max-Age", age, arg);
    } else if (c->expose_value[0] != '\0') {
        fn("Access-Control-Expose-Headers", c->expose_value, arg);
    }
}
