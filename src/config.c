/* Configuration loading: JSON (jansson) → plain C structs, with a table of known keys per object so
 * that unknown keys are errors and every error names its key path. See include/agw/config.h and
 * doc/configuration.md. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "agw/config.h"
#include "agw/limits.h"
#include "agw/log.h"
#include "agw/router.h"

/* Error reporting: the first error wins; <path> is the key path of the value being read. */
struct ctx {
    char *err;
    size_t errlen;
    bool failed;
};

static int fail(struct ctx *c, const char *path, const char *fmt, ...) AGW_PRINTF(3, 4);

static int fail(struct ctx *c, const char *path, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (c->failed)
        return -AGW_EINVAL;
    c->failed = true;
    n = snprintf(c->err, c->errlen, "%s: ", path[0] ? path : "(top level)");
    if (n < 0 || (size_t)n >= c->errlen)
        return -AGW_EINVAL;
    va_start(ap, fmt);
    vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return -AGW_EINVAL;
}

/* Bounded string building for key paths (a path that does not fit is shown cut, never overflowed).
 */
static void append(char *out, size_t len, size_t *n, const char *s)
{
    size_t k = strlen(s);

    if (*n + 1 >= len)
        return;
    if (k > len - 1 - *n)
        k = len - 1 - *n;
    memcpy(out + *n, s, k);
    *n += k;
    out[*n] = '\0';
}

static void join(char *out, size_t len, const char *path, const char *key)
{
    size_t n = 0;

    out[0] = '\0';
    append(out, len, &n, path);
    if (path[0] != '\0')
        append(out, len, &n, ".");
    append(out, len, &n, key);
}

static void join_index(char *out, size_t len, const char *path, size_t i)
{
    char idx[32];
    size_t n = 0;

    snprintf(idx, sizeof(idx), "[%zu]", i);
    out[0] = '\0';
    append(out, len, &n, path);
    append(out, len, &n, idx);
}

/* Shows a short, printable excerpt of a value in error messages. */
static const char *excerpt(const char *s, char *buf, size_t len)
{
    size_t i = 0;

    for (; s[i] && i + 4 < len && i < 60; i++)
        buf[i] = (unsigned char)s[i] < 0x20 ? '?' : s[i];
    if (s[i] && i + 4 < len) {
        memcpy(buf + i, "...", 3);
        i += 3;
    }
    buf[i] = '\0';
    return buf;
}

/* Every key of <obj> must be in <known> (NULL-terminated). */
static int check_keys(struct ctx *c, const char *path, json_t *obj, const char *const *known)
{
    const char *key;
    json_t *v;
    char p[256];

    json_object_foreach(obj, key, v)
    {
        bool ok = false;
        for (size_t i = 0; known[i] != NULL; i++)
            ok |= strcmp(key, known[i]) == 0;
        if (!ok) {
            join(p, sizeof(p), path, key);
            return fail(c, p, "unknown key");
        }
    }
    return 0;
}

static int want_object(struct ctx *c, const char *path, json_t *v)
{
    return json_is_object(v) ? 0 : fail(c, path, "expects an object");
}

static int get_string(struct ctx *c, const char *path, json_t *v, char **out)
{
    if (!json_is_string(v) || json_string_length(v) == 0)
        return fail(c, path, "expects a non-empty string");
    if (strlen(json_string_value(v)) != json_string_length(v))
        return fail(c, path, "must not contain NUL characters");
    free(*out);
    *out = agw_xstrdup(json_string_value(v));
    return 0;
}

static int get_enum(struct ctx *c, const char *path, json_t *v, const char *const *names, int *out)
{
    char list[256] = "";
    char ex[80];

    if (json_is_string(v)) {
        for (int i = 0; names[i] != NULL; i++) {
            if (strcmp(json_string_value(v), names[i]) == 0) {
                *out = i;
                return 0;
            }
        }
    }
    for (int i = 0; names[i] != NULL; i++) {
        size_t n = strlen(list);
        snprintf(list + n, sizeof(list) - n, "%s\"%s\"", i ? ", " : "", names[i]);
    }
    return fail(c, path, "expects one of %s, got '%s'", list,
                json_is_string(v) ? excerpt(json_string_value(v), ex, sizeof(ex))
                                  : "(not a string)");
}

/* A duration at <x>: integer milliseconds, or a string like "5s" (agw_parse_duration()). */
static int get_duration(struct ctx *c, const char *path, const json_t *x, uint32_t *ms)
{
    char ex[80];

    if (json_is_integer(x) && json_integer_value(x) >= 0 && json_integer_value(x) <= UINT32_MAX) {
        *ms = (uint32_t)json_integer_value(x);
        return 0;
    }
    if (json_is_string(x) && agw_parse_duration(json_string_value(x), ms) == 0)
        return 0;
    return fail(c, path, "expects a duration like \"5s\" or \"500ms\", got '%s'",
                json_is_string(x) ? excerpt(json_string_value(x), ex, sizeof(ex))
                                  : "(not a string)");
}

static int get_uint(struct ctx *c, const char *path, json_t *v, long long min, long long max,
                    unsigned *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
        return fail(c, path, "expects an integer %lld..%lld", min, max);
    *out = (unsigned)json_integer_value(v);
    return 0;
}

/* ---- durations, sizes, URLs ------------------------------------------------------------------ */

int agw_parse_duration(const char *s, uint32_t *ms)
{
    static const struct {
        const char *unit;
        uint64_t mult;
    } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"", 1}};
    uint64_t n = 0;
    const char *p = s;

    if (*p < '0' || *p > '9')
        return -AGW_EINVAL;
    for (; *p >= '0' && *p <= '9'; p++) {
        n = n * 10 + (uint64_t)(*p - '0');
        if (n > UINT32_MAX)
            return -AGW_EINVAL;
    }
    for (size_t i = 0; i < AGW_ARRAY_LEN(units); i++) {
        if (strcmp(p, units[i].unit) == 0) {
            if (n * units[i].mult > UINT32_MAX)
                return -AGW_EINVAL;
            *ms = (uint32_t)(n * units[i].mult);
            return 0;
        }
    }
    return -AGW_EINVAL;
}

int agw_parse_ttl(const char *s, uint64_t *seconds)
{
    uint64_t n = 0, mult;
    const char *p = s;

    if (strcmp(s, "0") == 0) {
        *seconds = 0;
        return 0;
    }
    if (*p < '1' || *p > '9')
        return -AGW_EINVAL;
    for (; *p >= '0' && *p <= '9'; p++) {
        n = n * 10 + (uint64_t)(*p - '0');
        if (n > 100000000000ULL)
            return -AGW_EINVAL;
    }
    if (strcmp(p, "s") == 0)
        mult = 1;
    else if (strcmp(p, "m") == 0)
        mult = 60;
    else if (strcmp(p, "h") == 0)
        mult = 3600;
    else if (strcmp(p, "d") == 0)
        mult = 86400;
    else
        return -AGW_EINVAL;
    *seconds = n * mult;
    return 0;
}

int agw_parse_size(const char *s, size_t *bytes)
{
    static const struct {
        const char *unit;
        uint64_t mult;
    } units[] = {{"", 1},
                 {"b", 1},
                 {"k", 1024},
                 {"kb", 1024},
                 {"kib", 1024},
                 {"m", 1024 * 1024},
                 {"mb", 1024 * 1024},
                 {"mib", 1024 * 1024},
                 {"g", 1024ULL * 1024 * 1024},
                 {"gb", 1024ULL * 1024 * 1024},
                 {"gib", 1024ULL * 1024 * 1024}};
    uint64_t n = 0;
    const char *p = s;

    if (*p < '0' || *p > '9')
        return -AGW_EINVAL;
    for (; *p >= '0' && *p <= '9'; p++) {
        n = n * 10 + (uint64_t)(*p - '0');
        if (n > (uint64_t)1 << 40)
            return -AGW_EINVAL;
    }
    while (*p == ' ')
        p++;
    for (size_t i = 0; i < AGW_ARRAY_LEN(units); i++) {
        if (strcasecmp(p, units[i].unit) == 0) {
            if (n > ((uint64_t)1 << 40) / units[i].mult)
                return -AGW_EINVAL;
            *bytes = (size_t)(n * units[i].mult);
            return 0;
        }
    }
    return -AGW_EINVAL;
}

void agw_url_clear(struct agw_url *u)
{
    free(u->text);
    free(u->host);
    free(u->target);
    free(u->authority);
    memset(u, 0, sizeof(*u));
}

static bool host_char_ok(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '-' || ch == '.' || ch == '_';
}

int agw_url_parse(const char *s, struct agw_url *u, char *err, size_t errlen)
{
    const char *p, *host, *host_end, *auth_end;
    size_t scheme_len;
    long port = 0;

    memset(u, 0, sizeof(*u));
    for (p = s; *p; p++) {
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f) {
            snprintf(err, errlen, "spaces, control and non-ASCII characters are not allowed");
            return -AGW_EINVAL;
        }
    }
    if (strncmp(s, "http://", 7) == 0) {
        scheme_len = 7;
    } else if (strncmp(s, "https://", 8) == 0) {
        scheme_len = 8;
        u->tls = true;
    } else {
        snprintf(err, errlen, "expects an http(s) URL");
        return -AGW_EINVAL;
    }
    host = s + scheme_len;
    auth_end = host + strcspn(host, "/?#");
    if (memchr(host, '@', (size_t)(auth_end - host)) != NULL) {
        snprintf(err, errlen, "credentials in the URL are not allowed (use upstream_headers)");
        return -AGW_EINVAL;
    }
    if (strchr(s, '#') != NULL) {
        snprintf(err, errlen, "a URL fragment ('#') is not allowed");
        return -AGW_EINVAL;
    }
    if (*host == '[') {
        host_end = memchr(host, ']', (size_t)(auth_end - host));
        if (host_end == NULL || host_end == host + 1) {
            snprintf(err, errlen, "bad IPv6 address");
            return -AGW_EINVAL;
        }
        for (const char *q = host + 1; q < host_end; q++) {
            if (!((*q >= '0' && *q <= '9') || (*q >= 'a' && *q <= 'f') ||
                  (*q >= 'A' && *q <= 'F') || *q == ':' || *q == '.')) {
                snprintf(err, errlen, "bad IPv6 address");
                return -AGW_EINVAL;
            }
        }
        u->host = agw_xstrndup(host + 1, (size_t)(host_end - host - 1));
        p = host_end + 1;
    } else {
        host_end = host;
        while (host_end < auth_end && *host_end != ':')
            host_end++;
        if (host_end == host) {
            snprintf(err, errlen, "the host is missing");
            return -AGW_EINVAL;
        }
        for (const char *q = host; q < host_end; q++) {
            if (!host_char_ok(*q)) {
                snprintf(err, errlen, "bad host name");
                return -AGW_EINVAL;
            }
        }
        u->host = agw_xstrndup(host, (size_t)(host_end - host));
        p = host_end;
    }
    if (p < auth_end && *p == ':') {
        char *end = NULL;
        if (p + 1 == auth_end || p[1] < '0' || p[1] > '9') {
            agw_url_clear(u);
            snprintf(err, errlen, "bad port");
            return -AGW_EINVAL;
        }
        errno = 0;
        port = strtol(p + 1, &end, 10);
        if (errno != 0 || end != auth_end || port < 1 || port > 65535) {
            agw_url_clear(u);
            snprintf(err, errlen, "the port must be 1..65535");
            return -AGW_EINVAL;
        }
    } else if (p != auth_end) {
        agw_url_clear(u);
        snprintf(err, errlen, "bad host");
        return -AGW_EINVAL;
    }
    u->port = (uint16_t)(port ? port : (u->tls ? 443 : 80));
    u->text = agw_xstrdup(s);
    u->authority = agw_xstrndup(host, (size_t)(auth_end - host));
    if (*auth_end == '/') {
        u->target = agw_xstrdup(auth_end);
    } else {
        /* "http://h?x" → "/?x" */
        size_t n = strlen(auth_end);
        u->target = agw_xmalloc(n + 2);
        u->target[0] = '/';
        memcpy(u->target + 1, auth_end, n + 1);
    }
    return 0;
}

/* ---- sections -------------------------------------------------------------------------------- */

static int inet_pton_any(const char *s, unsigned char *buf)
{
    return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1 ? 0 : -AGW_EINVAL;
}

static int get_address(struct ctx *c, const char *path, json_t *v, char **out)
{
    char p[256], ex[80];
    json_t *a = json_object_get(v, "address");
    unsigned char buf[16];

    join(p, sizeof(p), path, "address");
    if (a == NULL)
        return fail(c, p, "required");
    if (get_string(c, p, a, out) != 0)
        return -AGW_EINVAL;
    if (inet_pton_any(*out, buf) != 0)
        return fail(c, p, "expects a numeric IPv4 or IPv6 address, got '%s'",
                    excerpt(*out, ex, sizeof(ex)));
    return 0;
}

static int get_port(struct ctx *c, const char *path, json_t *v, uint16_t *out)
{
    char p[256];
    json_t *pv = json_object_get(v, "port");
    unsigned port;

    join(p, sizeof(p), path, "port");
    if (pv == NULL)
        return fail(c, p, "required");
    if (get_uint(c, p, pv, 0, 65535, &port) != 0)
        return -AGW_EINVAL;
    *out = (uint16_t)port;
    return 0;
}

static int parse_cert_pair(struct ctx *c, const char *path, json_t *v, char **cert, char **key)
{
    char q[320];

    join(q, sizeof(q), path, "cert");
    if (json_object_get(v, "cert") == NULL)
        return fail(c, q, "required");
    if (get_string(c, q, json_object_get(v, "cert"), cert))
        return -AGW_EINVAL;
    join(q, sizeof(q), path, "key");
    if (json_object_get(v, "key") == NULL)
        return fail(c, q, "required");
    return get_string(c, q, json_object_get(v, "key"), key);
}

static int parse_tls(struct ctx *c, const char *path, json_t *tls, struct agw_tls_config *t)
{
    static const char *const tls_keys[] = {"cert",      "key",    "certificates",
                                           "client_ca", "verify", NULL};
    static const char *const pair_keys[] = {"cert", "key", NULL};
    static const char *const verifies[] = {"none", "optional", "require", NULL};
    char q[320], r[340];
    json_t *x, *e;
    size_t i;
    int v;

    if (want_object(c, path, tls) || check_keys(c, path, tls, tls_keys) ||
        parse_cert_pair(c, path, tls, &t->cert, &t->key))
        return -AGW_EINVAL;
    if ((x = json_object_get(tls, "certificates")) != NULL) {
        join(q, sizeof(q), path, "certificates");
        if (!json_is_array(x) || json_array_size(x) > 64)
            return fail(c, q, "expects an array of up to 64 {\"cert\", \"key\"} chosen by SNI");
        t->sni = agw_xcalloc(json_array_size(x) + 1, sizeof(*t->sni));
        json_array_foreach(x, i, e)
        {
            join_index(r, sizeof(r), q, i);
            t->n_sni = i + 1;
            if (want_object(c, r, e) || check_keys(c, r, e, pair_keys) ||
                parse_cert_pair(c, r, e, &t->sni[i].cert, &t->sni[i].key))
                return -AGW_EINVAL;
        }
    }
    if ((x = json_object_get(tls, "client_ca")) != NULL) {
        join(q, sizeof(q), path, "client_ca");
        if (get_string(c, q, x, &t->client_ca))
            return -AGW_EINVAL;
        t->verify = AGW_TLS_VERIFY_REQUIRE;
    }
    if ((x = json_object_get(tls, "verify")) != NULL) {
        join(q, sizeof(q), path, "verify");
        if (get_enum(c, q, x, verifies, &v))
            return -AGW_EINVAL;
        t->verify = (enum agw_tls_verify)v;
        if (t->verify != AGW_TLS_VERIFY_NONE && t->client_ca == NULL)
            return fail(c, q, "client certificates need \"client_ca\"");
    }
    return 0;
}

static int parse_listener(struct ctx *c, const char *path, json_t *v, struct agw_listener_config *l,
                          bool allow_tls)
{
    static const char *const keys[] = {"address", "port", "tls", NULL};
    static const char *const admin_keys[] = {"address", "port", NULL};
    char p[256];
    json_t *tls;

    if (want_object(c, path, v) || check_keys(c, path, v, allow_tls ? keys : admin_keys) ||
        get_address(c, path, v, &l->address) || get_port(c, path, v, &l->port))
        return -AGW_EINVAL;
    tls = json_object_get(v, "tls");
    if (tls != NULL) {
        join(p, sizeof(p), path, "tls");
        return parse_tls(c, p, tls, &l->tls);
    }
    return 0;
}

static bool header_name_ok(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              strchr("!#$%&'*+-.^_`|~", ch) != NULL))
            return false;
    }
    return true;
}

/* Headers the gateway sets itself or that describe one hop only: never configurable. */
static const char *const hop_headers[] = {"host",
                                          "content-length",
                                          "transfer-encoding",
                                          "connection",
                                          "keep-alive",
                                          "upgrade",
                                          "te",
                                          "trailer",
                                          "proxy-authorization",
                                          "proxy-authenticate",
                                          "proxy-connection",
                                          NULL};

/* <allow_authorization>: an agent may send its own credentials upstream (upstream_headers), but a
 * client's Authorization is never forwarded (forward_headers). */
static bool reserved_header(const char *name, bool allow_authorization)
{
    if (!allow_authorization && strcasecmp(name, "authorization") == 0)
        return true;
    for (size_t i = 0; hop_headers[i] != NULL; i++)
        if (strcasecmp(name, hop_headers[i]) == 0)
            return true;
    return false;
}

/* Replaces every "${NAME}" in <in> by the environment variable NAME, so secrets need not sit in the
 * file. An unset variable is an error (naming the variable, never a value). *<out> is owned by the
 * caller. */
static int expand_env(struct ctx *c, const char *path, const char *in, char **out)
{
    size_t cap = strlen(in) + 1, n = 0;
    char *buf = agw_xmalloc(cap);

    while (*in) {
        const char *end, *val;
        char var[128];
        size_t vl, add;
        if (in[0] != '$' || in[1] != '{') {
            buf[n++] = *in++;
            continue;
        }
        end = strchr(in + 2, '}');
        vl = end != NULL ? (size_t)(end - in - 2) : 0;
        if (end == NULL || vl == 0 || vl >= sizeof(var)) {
            free(buf);
            return fail(c, path, "bad environment variable reference (write ${NAME})");
        }
        memcpy(var, in + 2, vl);
        var[vl] = '\0';
        val = getenv(var);
        if (val == NULL) {
            free(buf);
            return fail(c, path, "environment variable %s is not set", var);
        }
        add = strlen(val);
        cap += add;
        buf = agw_xrealloc(buf, cap);
        memcpy(buf + n, val, add);
        n += add;
        in = end + 1;
    }
    buf[n] = '\0';
    *out = buf;
    return 0;
}

static int parse_agent(struct ctx *c, const char *path, const char *id, json_t *v,
                       struct agw_agent_config *a)
{
    static const char *const keys[] = {"upstreams",
                                       "protocol",
                                       "balance",
                                       "retries",
                                       "on_client_disconnect",
                                       "upstream_headers",
                                       "forward_headers",
                                       "ca_file",
                                       "decisions",
                                       "max_fails",
                                       "fail_timeout",
                                       NULL};
    static const char *const decision_keys[] = {"forward", NULL};
    static const char *const forwards[] = {"auto", "never", "live", NULL};
    static const char *const protocols[] = {"ag-ui", "ag-kit", NULL};
    static const char *const balances[] = {"thread_affinity", "round_robin", NULL};
    static const char *const disconnects[] = {"cancel", "detach", NULL};
    char p[256], q[320], ex[80], why[160];
    json_t *ups, *x;
    size_t i;
    int e;

    a->id = agw_xstrdup(id);
    a->retries = 1;
    a->max_fails = 1;
    a->fail_timeout_ms = 10000;
    if (want_object(c, path, v) || check_keys(c, path, v, keys))
        return -AGW_EINVAL;
    join(p, sizeof(p), path, "upstreams");
    ups = json_object_get(v, "upstreams");
    if (ups == NULL)
        return fail(c, p, "required: the backend URLs of this agent");
    if (json_is_string(ups)) {
        a->upstreams = agw_xcalloc(1, sizeof(*a->upstreams));
        if (agw_url_parse(json_string_value(ups), &a->upstreams[0], why, sizeof(why)) != 0)
            return fail(c, p, "%s, got '%s'", why, excerpt(json_string_value(ups), ex, sizeof(ex)));
        a->n_upstreams = 1;
    } else if (json_is_array(ups) && json_array_size(ups) > 0 &&
               json_array_size(ups) <= AGW_MAX_UPSTREAMS) {
        a->upstreams = agw_xcalloc(json_array_size(ups), sizeof(*a->upstreams));
        json_array_foreach(ups, i, x)
        {
            join_index(q, sizeof(q), p, i);
            if (!json_is_string(x))
                return fail(c, q, "expects an http(s) URL string");
            if (agw_url_parse(json_string_value(x), &a->upstreams[i], why, sizeof(why)) != 0)
                return fail(c, q, "%s, got '%s'", why,
                            excerpt(json_string_value(x), ex, sizeof(ex)));
            a->n_upstreams = i + 1;
        }
    } else {
        return fail(c, p, "expects a URL or an array of 1..%d URLs", AGW_MAX_UPSTREAMS);
    }
    if ((x = json_object_get(v, "protocol")) != NULL) {
        join(p, sizeof(p), path, "protocol");
        if (get_enum(c, p, x, protocols, &e))
            return -AGW_EINVAL;
        a->protocol = (enum agw_protocol)e;
    }
    if ((x = json_object_get(v, "balance")) != NULL) {
        join(p, sizeof(p), path, "balance");
        if (get_enum(c, p, x, balances, &e))
            return -AGW_EINVAL;
        a->balance = (enum agw_balance)e;
    }
    if ((x = json_object_get(v, "on_client_disconnect")) != NULL) {
        join(p, sizeof(p), path, "on_client_disconnect");
        if (get_enum(c, p, x, disconnects, &e))
            return -AGW_EINVAL;
        a->on_client_disconnect = (enum agw_on_disconnect)e;
    }
    if ((x = json_object_get(v, "decisions")) != NULL) {
        json_t *f;

        join(p, sizeof(p), path, "decisions");
        if (want_object(c, p, x) || check_keys(c, p, x, decision_keys))
            return -AGW_EINVAL;
        if ((f = json_object_get(x, "forward")) != NULL) {
            join(q, sizeof(q), p, "forward");
            if (get_enum(c, q, f, forwards, &e))
                return -AGW_EINVAL;
            a->decisions_forward = (enum agw_decision_forward)e;
        }
    }
    if ((x = json_object_get(v, "ca_file")) != NULL) {
        join(p, sizeof(p), path, "ca_file");
        if (get_string(c, p, x, &a->ca_file))
            return -AGW_EINVAL;
    }
    if ((x = json_object_get(v, "retries")) != NULL) {
        join(p, sizeof(p), path, "retries");
        if (get_uint(c, p, x, 0, 10, &a->retries))
            return -AGW_EINVAL;
    }
    if ((x = json_object_get(v, "max_fails")) != NULL) {
        join(p, sizeof(p), path, "max_fails");
        if (get_uint(c, p, x, 0, 1000, &a->max_fails))
            return -AGW_EINVAL;
    }
    if ((x = json_object_get(v, "fail_timeout")) != NULL) {
        uint32_t ms;
        join(p, sizeof(p), path, "fail_timeout");
        if (get_duration(c, p, x, &ms))
            return -AGW_EINVAL;
        if (ms == 0 || ms > 3600000)
            return fail(c, p, "must be from 1ms to 1h");
        a->fail_timeout_ms = ms;
    }
    if ((x = json_object_get(v, "upstream_headers")) != NULL) {
        const char *name;
        json_t *hv;
        join(p, sizeof(p), path, "upstream_headers");
        if (want_object(c, p, x))
            return -AGW_EINVAL;
        a->upstream_headers = agw_xcalloc(json_object_size(x) + 1, sizeof(*a->upstream_headers));
        json_object_foreach(x, name, hv)
        {
            char *expanded = NULL;
            join(q, sizeof(q), p, name);
            if (!header_name_ok(name))
                return fail(c, q, "not a valid header name");
            if (reserved_header(name, true))
                return fail(c, q, "the gateway sets this header itself; it cannot be configured");
            if (!json_is_string(hv))
                return fail(c, q, "expects a string value");
            if (expand_env(c, q, json_string_value(hv), &expanded) != 0)
                return -AGW_EINVAL;
            if (strpbrk(expanded, "\r\n") != NULL || strlen(expanded) > 8192) {
                free(expanded);
                return fail(c, q, "the value must be one line of at most 8192 bytes");
            }
            a->upstream_headers[a->n_upstream_headers].name = agw_xstrdup(name);
            a->upstream_headers[a->n_upstream_headers].value = expanded;
            a->n_upstream_headers++;
        }
    }
    if ((x = json_object_get(v, "forward_headers")) != NULL) {
        json_t *hv;
        join(p, sizeof(p), path, "forward_headers");
        if (!json_is_array(x))
            return fail(c, p, "expects an array of header names");
        a->forward_headers = agw_xcalloc(json_array_size(x) + 1, sizeof(char *));
        json_array_foreach(x, i, hv)
        {
            join_index(q, sizeof(q), p, i);
            if (!json_is_string(hv) || !header_name_ok(json_string_value(hv)))
                return fail(c, q, "expects a header name");
            if (reserved_header(json_string_value(hv), false))
                return fail(c, q,
                            "'%s' is never forwarded (hop-by-hop or the client's credentials)",
                            json_string_value(hv));
            a->forward_headers[a->n_forward_headers++] = agw_xstrdup(json_string_value(hv));
        }
    }
    return 0;
}

/* "rate_limit": {"runs_per_minute", "burst", "concurrent_runs"}, each field overriding <rl>'s. */
static int parse_rate_limit(struct ctx *c, const char *path, json_t *v, struct agw_rate_limit *rl)
{
    static const char *const keys[] = {"runs_per_minute", "burst", "concurrent_runs", NULL};
    const struct {
        const char *name;
        uint32_t *field;
        long long min;
    } fields[] = {{"runs_per_minute", &rl->runs_per_minute, 0},
                  {"burst", &rl->burst, 1},
                  {"concurrent_runs", &rl->concurrent_runs, 0}};
    char p[256];
    json_t *x;

    if (v == NULL)
        return 0;
    if (want_object(c, path, v) || check_keys(c, path, v, keys))
        return -AGW_EINVAL;
    for (size_t i = 0; i < AGW_ARRAY_LEN(fields); i++) {
        unsigned n;
        if ((x = json_object_get(v, fields[i].name)) == NULL)
            continue;
        join(p, sizeof(p), path, fields[i].name);
        if (get_uint(c, p, x, fields[i].min, 1000000, &n))
            return -AGW_EINVAL;
        *fields[i].field = n;
    }
    if (json_object_get(v, "burst") != NULL && rl->runs_per_minute == 0) {
        join(p, sizeof(p), path, "burst");
        return fail(c, p, "needs runs_per_minute");
    }
    return 0;
}

/* After the merge: no rate, no bucket; a bucket defaults to one minute's worth. */
static void finish_rate_limit(struct agw_rate_limit *rl)
{
    if (rl->runs_per_minute == 0)
        rl->burst = 0;
    else if (rl->burst == 0)
        rl->burst = rl->runs_per_minute;
}

/* An origin as a browser sends it in Origin: scheme "://" host [":" port], lower case, no path. */
static bool origin_ok(const char *s)
{
    const char *h;
    size_t port_digits = 0;

    if (strncmp(s, "http://", 7) == 0)
        h = s + 7;
    else if (strncmp(s, "https://", 8) == 0)
        h = s + 8;
    else
        return false;
    if (*h == '[') { /* an IPv6 literal */
        h++;
        while (*h != '\0' && (strchr("0123456789abcdef:.", *h) != NULL))
            h++;
        if (*h++ != ']')
            return false;
    } else {
        const char *start = h;
        while ((*h >= 'a' && *h <= 'z') || (*h >= '0' && *h <= '9') || *h == '.' || *h == '-')
            h++;
        if (h == start)
            return false;
    }
    if (*h == ':') {
        for (h++; *h >= '0' && *h <= '9'; h++)
            port_digits++;
        if (port_digits == 0 || port_digits > 5)
            return false;
    }
    return *h == '\0';
}

/* A list of strings checked by <ok>, into a NULL-terminated array and one header value. */
static int get_list(struct ctx *c, const char *path, json_t *v, bool (*ok)(const char *),
                    const char *what, char ***out, size_t *n, char **joined)
{
    size_t i, total = 1;
    json_t *x;
    char q[320];

    if (!json_is_array(v))
        return fail(c, path, "expects an array of %s", what);
    *out = agw_xcalloc(json_array_size(v) + 1, sizeof(char *));
    json_array_foreach(v, i, x)
    {
        join_index(q, sizeof(q), path, i);
        if (!json_is_string(x) || !ok(json_string_value(x)))
            return fail(c, q, "expects %s", what);
        (*out)[(*n)++] = agw_xstrdup(json_string_value(x));
        total += json_string_length(x) + 2;
    }
    if (joined != NULL) {
        char *j = agw_xmalloc(total);
        size_t len = 0;
        for (i = 0; i < *n; i++) {
            size_t k = strlen((*out)[i]);
            if (i > 0) {
                memcpy(j + len, ", ", 2);
                len += 2;
            }
            memcpy(j + len, (*out)[i], k);
            len += k;
        }
        j[len] = '\0';
        *joined = j;
    }
    return 0;
}

static bool method_ok(const char *s)
{
    if (*s == '\0' || strlen(s) > 32)
        return false;
    for (; *s; s++)
        if (!((*s >= 'A' && *s <= 'Z') || *s == '-' || *s == '_'))
            return false;
    return true;
}

static bool cors_origin_ok(const char *s)
{
    return strcmp(s, "*") == 0 || origin_ok(s);
}

static void free_list(char **list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(list[i]);
    free(list);
}

static int parse_cors(struct ctx *c, json_t *v, struct agw_cors_config *cors)
{
    static const char *const keys[] = {"allowed_origins",
                                       "allowed_methods",
                                       "allowed_headers",
                                       "exposed_headers",
                                       "max_age",
                                       "allow_credentials",
                                       NULL};
    static const char *const default_methods = "[\"GET\", \"POST\", \"OPTIONS\"]";
    static const char *const default_headers =
        "[\"Authorization\", \"Content-Type\", \"Accept\", \"X-Request-Id\", \"traceparent\"]";
    static const char *const default_expose = "[\"X-Request-Id\", \"Retry-After\"]";
    char **expose = NULL;
    size_t n_expose = 0;
    json_t *x, *def;
    char ex[80];
    int rc;

    if (v == NULL)
        return 0;
    if (want_object(c, "cors", v) || check_keys(c, "cors", v, keys))
        return -AGW_EINVAL;
    cors->enabled = true;
    x = json_object_get(v, "allowed_origins");
    if (x == NULL || (json_is_array(x) && json_array_size(x) == 0))
        return fail(c, "cors.allowed_origins",
                    "required: the origins allowed to call the gateway, e.g. "
                    "[\"https://app.example.com\"] (or [\"*\"])");
    if (get_list(c, "cors.allowed_origins", x, cors_origin_ok,
                 "an origin as browsers send it: http(s)://host[:port], lower case, no path; or "
                 "\"*\"",
                 &cors->origins, &cors->n_origins, NULL))
        return -AGW_EINVAL;
    for (size_t i = 0; i < cors->n_origins; i++)
        cors->any_origin |= strcmp(cors->origins[i], "*") == 0;

    x = json_object_get(v, "allowed_methods");
    def = x != NULL ? json_incref(x) : json_loads(default_methods, 0, NULL);
    rc = get_list(c, "cors.allowed_methods", def, method_ok, "an HTTP method in upper case",
                  &cors->methods, &cors->n_methods, &cors->methods_value);
    json_decref(def);
    if (rc != 0)
        return rc;
    if (cors->n_methods == 0)
        return fail(c, "cors.allowed_methods", "expects at least one method");

    x = json_object_get(v, "allowed_headers");
    def = x != NULL ? json_incref(x) : json_loads(default_headers, 0, NULL);
    rc = get_list(c, "cors.allowed_headers", def, header_name_ok, "a header name", &cors->headers,
                  &cors->n_headers, &cors->headers_value);
    json_decref(def);
    if (rc != 0)
        return rc;

    x = json_object_get(v, "exposed_headers");
    def = x != NULL ? json_incref(x) : json_loads(default_expose, 0, NULL);
    rc = get_list(c, "cors.exposed_headers", def, header_name_ok, "a header name", &expose,
                  &n_expose, &cors->expose_value);
    free_list(expose, n_expose);
    json_decref(def);
    if (rc != 0)
        return rc;

    cors->max_age_s = 600;
    if ((x = json_object_get(v, "max_age")) != NULL) {
        uint32_t ms;
        if (json_is_integer(x) && json_integer_value(x) >= 0 &&
            json_integer_value(x) <= UINT32_MAX) {
            ms = (uint32_t)json_integer_value(x);
        } else if (!json_is_string(x) || agw_parse_duration(json_string_value(x), &ms) != 0) {
            return fail(c, "cors.max_age", "expects a duration like \"10m\", got '%s'",
                        json_is_string(x) ? excerpt(json_string_value(x), ex, sizeof(ex))
                                          : "(not a string)");
        }
        cors->max_age_s = ms / 1000;
    }
    if ((x = json_object_get(v, "allow_credentials")) != NULL) {
        if (!json_is_boolean(x))
            return fail(c, "cors.allow_credentials", "expects true or false");
        cors->allow_credentials = json_is_true(x);
    }
    if (cors->allow_credentials && cors->any_origin)
        return fail(c, "cors.allowed_origins",
                    "\"*\" cannot be used with allow_credentials: list the origins");
    return 0;
}

static int parse_auth(struct ctx *c, json_t *v, struct agw_config *cfg)
{
    static const char *const keys[] = {"mode", "keys", NULL};
    static const char *const key_keys[] = {"id", "sha256", "agents", "rate_limit", NULL};
    static const char *const modes[] = {"bearer", "none", NULL};
    json_t *x, *k;
    size_t i, j;
    int e;
    char p[256], q[320];

    if (v == NULL)
        return fail(c, "auth",
                    "required (write {\"mode\": \"none\"} to run without authentication)");
    if (want_object(c, "auth", v) || check_keys(c, "auth", v, keys))
        return -AGW_EINVAL;
    if ((x = json_object_get(v, "mode")) != NULL) {
        if (get_enum(c, "auth.mode", x, modes, &e))
            return -AGW_EINVAL;
        cfg->auth.mode = (enum agw_auth_mode)e;
    }
    x = json_object_get(v, "keys");
    if (cfg->auth.mode == AGW_AUTH_NONE) {
        if (x != NULL)
            return fail(c, "auth.keys", "not allowed with \"mode\": \"none\"");
        return 0;
    }
    if (!json_is_array(x) || json_array_size(x) == 0)
        return fail(c, "auth.keys", "expects a non-empty array of keys (or \"mode\": \"none\")");
    cfg->auth.keys = agw_xcalloc(json_array_size(x), sizeof(*cfg->auth.keys));
    json_array_foreach(x, i, k)
    {
        struct agw_auth_key *key = &cfg->auth.keys[i];
        json_t *f, *ag;
        cfg->auth.n_keys = i + 1;
        join_index(p, sizeof(p), "auth.keys", i);
        if (want_object(c, p, k) || check_keys(c, p, k, key_keys))
            return -AGW_EINVAL;
        join(q, sizeof(q), p, "id");
        if ((f = json_object_get(k, "id")) == NULL)
            return fail(c, q, "required");
        if (get_string(c, q, f, &key->id))
            return -AGW_EINVAL;
        for (j = 0; j < i; j++)
            if (strcmp(cfg->auth.keys[j].id, key->id) == 0)
                return fail(c, q, "duplicate key id '%s'", key->id);
        join(q, sizeof(q), p, "sha256");
        f = json_object_get(k, "sha256");
        if (f == NULL)
            return fail(c, q, "required");
        /* The message never repeats the value: it could be a token pasted by mistake. */
        if (!json_is_string(f) ||
            agw_hex_decode(json_string_value(f), key->sha256, sizeof(key->sha256)) != 0)
            return fail(c, q, "expects 64 hex characters (the SHA-256 of the token)");
        join(q, sizeof(q), p, "agents");
        ag = json_object_get(k, "agents");
        if (!json_is_array(ag) || json_array_size(ag) == 0)
            return fail(c, q, "expects a non-empty array of agent ids, or [\"*\"] for all");
        key->agents = agw_xcalloc(json_array_size(ag), sizeof(char *));
        json_array_foreach(ag, j, f)
        {
            char r[340];
            join_index(r, sizeof(r), q, j);
            if (!json_is_string(f))
                return fail(c, r, "expects an agent id or \"*\"");
            if (strcmp(json_string_value(f), "*") == 0) {
                key->all_agents = true;
                continue;
            }
            if (agw_config_find_agent(cfg, json_string_value(f)) == NULL)
                return fail(c, r, "no agent '%s' in agents", json_string_value(f));
            key->agents[key->n_agents++] = agw_xstrdup(json_string_value(f));
        }
        join(q, sizeof(q), p, "rate_limit");
        key->rate_limit = cfg->rate_limit;
        if (parse_rate_limit(c, q, json_object_get(k, "rate_limit"), &key->rate_limit))
            return -AGW_EINVAL;
        finish_rate_limit(&key->rate_limit);
    }
    return 0;
}

struct size_key {
    const char *name;
    size_t offset;
    size_t min, max;
};

static int parse_limits(struct ctx *c, json_t *v, struct agw_limits *l)
{
    static const struct size_key sizes[] = {
        {"max_body_bytes", offsetof(struct agw_limits, max_body_bytes), 64, (size_t)1 << 30},
        {"stream_buffer_bytes", offsetof(struct agw_limits, stream_buffer_bytes), 1024,
         (size_t)1 << 30},
        {"max_frame_bytes", offsetof(struct agw_limits, max_frame_bytes), 256, (size_t)1 << 30},
        {"max_header_bytes", offsetof(struct agw_limits, max_header_bytes), 1024, (size_t)1 << 20},
        {"max_request_header_bytes", offsetof(struct agw_limits, max_request_header_bytes),
         AGW_MAX_REQUEST_LINE + 2, (size_t)1 << 20},
    };
    static const char *const keys[] = {"max_body_bytes",
                                       "stream_buffer_bytes",
                                       "max_frame_bytes",
                                       "max_header_bytes",
                                       "max_json_depth",
                                       "max_request_header_bytes",
                                       "max_request_header_fields",
                                       "upstream_idle_connections",
                                       NULL};
    char p[256];
    json_t *x;

    if (v == NULL)
        return 0;
    if (want_object(c, "limits", v) || check_keys(c, "limits", v, keys))
        return -AGW_EINVAL;
    for (size_t i = 0; i < AGW_ARRAY_LEN(sizes); i++) {
        size_t n;
        if ((x = json_object_get(v, sizes[i].name)) == NULL)
            continue;
        join(p, sizeof(p), "limits", sizes[i].name);
        if (json_is_integer(x) && json_integer_value(x) >= 0) {
            n = (size_t)json_integer_value(x);
        } else if (!json_is_string(x) || agw_parse_size(json_string_value(x), &n) != 0) {
            return fail(c, p, "expects a size like \"1MiB\", \"256KiB\" or a number of bytes");
        }
        if (n < sizes[i].min || n > sizes[i].max)
            return fail(c, p, "expects %zu..%zu bytes", sizes[i].min, sizes[i].max);
        *(size_t *)(void *)((char *)l + sizes[i].offset) = n;
    }
    if ((x = json_object_get(v, "max_json_depth")) != NULL &&
        get_uint(c, "limits.max_json_depth", x, 1, 1000, &l->max_json_depth))
        return -AGW_EINVAL;
    if ((x = json_object_get(v, "max_request_header_fields")) != NULL &&
        get_uint(c, "limits.max_request_header_fields", x, 1, 10000, &l->max_request_header_fields))
        return -AGW_EINVAL;
    if ((x = json_object_get(v, "upstream_idle_connections")) != NULL &&
        get_uint(c, "limits.upstream_idle_connections", x, 0, 100000,
                 &l->upstream_idle_connections))
        return -AGW_EINVAL;
    return 0;
}

struct duration_key {
    const char *name;
    size_t offset;
    bool zero_ok; /* 0 means "never" */
};

static int parse_timeouts(struct ctx *c, json_t *v, struct agw_timeouts *t)
{
    static const struct duration_key durations[] = {
        {"connect", offsetof(struct agw_timeouts, connect_ms), false},
        {"first_byte", offsetof(struct agw_timeouts, first_byte_ms), false},
        {"idle", offsetof(struct agw_timeouts, idle_ms), true},
        {"run", offsetof(struct agw_timeouts, run_ms), true},
        {"heartbeat", offsetof(struct agw_timeouts, heartbeat_ms), true},
        {"drain", offsetof(struct agw_timeouts, drain_ms), false},
        {"request", offsetof(struct agw_timeouts, request_ms), false},
    };
    static const char *const keys[] = {"connect",   "first_byte", "idle",    "run",
                                       "heartbeat", "drain",      "request", NULL};
    char p[256];
    json_t *x;

    if (v == NULL)
        return 0;
    if (want_object(c, "timeouts", v) || check_keys(c, "timeouts", v, keys))
        return -AGW_EINVAL;
    for (size_t i = 0; i < AGW_ARRAY_LEN(durations); i++) {
        uint32_t ms;
        if ((x = json_object_get(v, durations[i].name)) == NULL)
            continue;
        join(p, sizeof(p), "timeouts", durations[i].name);
        if (get_duration(c, p, x, &ms))
            return -AGW_EINVAL;
        if (ms == 0 && !durations[i].zero_ok)
            return fail(c, p, "must be greater than 0");
        *(uint32_t *)(void *)((char *)t + durations[i].offset) = ms;
    }
    return 0;
}

static int parse_store(struct ctx *c, json_t *v, struct agw_store_config *s)
{
    static const char *const keys[] = {"kind", "path", "url", NULL};
    static const char *const kinds[] = {"embedded", "memory", "redis", NULL};
    json_t *x;
    int e;

    if (v == NULL)
        goto defaults;
    if (want_object(c, "store", v) || check_keys(c, "store", v, keys))
        return -AGW_EINVAL;
    if ((x = json_object_get(v, "kind")) != NULL) {
        if (get_enum(c, "store.kind", x, kinds, &e))
            return -AGW_EINVAL;
        s->kind = (enum agw_store_kind)e;
    }
    if ((x = json_object_get(v, "path")) != NULL) {
        if (s->kind != AGW_STORE_EMBEDDED)
            return fail(c, "store.path", "only for \"kind\": \"embedded\"");
        if (get_string(c, "store.path", x, &s->path))
            return -AGW_EINVAL;
    }
    if ((x = json_object_get(v, "url")) != NULL) {
        if (s->kind != AGW_STORE_REDIS)
            return fail(c, "store.url", "only for \"kind\": \"redis\"");
        if (get_string(c, "store.url", x, &s->url))
            return -AGW_EINVAL;
        if (strncmp(s->url, "redis://", 8) != 0)
            return fail(c, "store.url", "expects a redis:// URL");
    }
    if (s->kind == AGW_STORE_REDIS && s->url == NULL)
        return fail(c, "store.url", "required with \"kind\": \"redis\"");
defaults:
    if (s->kind == AGW_STORE_EMBEDDED && s->path == NULL)
        s->path = agw_xstrdup("var/agui-gateway");
    return 0;
}

static int parse_history(struct ctx *c, json_t *v, struct agw_history_config *h)
{
    static const char *const keys[] = {"enabled", "max_messages_per_thread", "ttl", "cache_threads",
                                       NULL};
    json_t *x;
    char ex[64];

    h->enabled = true;
    h->max_messages_per_thread = 1000;
    h->cache_threads = 10000;
    if (v == NULL)
        return 0;
    if (want_object(c, "history", v) || check_keys(c, "history", v, keys))
        return -AGW_EINVAL;
    if ((x = json_object_get(v, "enabled")) != NULL) {
        if (!json_is_boolean(x))
            return fail(c, "history.enabled", "expects true or false");
        h->enabled = json_is_true(x);
    }
    if ((x = json_object_get(v, "max_messages_per_thread")) != NULL &&
        get_uint(c, "history.max_messages_per_thread", x, 1, 1000000, &h->max_messages_per_thread))
        return -AGW_EINVAL;
    if ((x = json_object_get(v, "cache_threads")) != NULL &&
        get_uint(c, "history.cache_threads", x, 1, 10000000, &h->cache_threads))
        return -AGW_EINVAL;
    if ((x = json_object_get(v, "ttl")) != NULL &&
        (!json_is_string(x) || agw_parse_ttl(json_string_value(x), &h->ttl_s) != 0))
        return fail(
            c, "history.ttl",
            "expects \"0\" (keep) or a period like \"30d\", \"12h\", \"90m\", \"3600s\", got '%s'",
            json_is_string(x) ? excerpt(json_string_value(x), ex, sizeof(ex)) : "(not a string)");
    return 0;
}

static int parse_decisions(struct ctx *c, json_t *v, struct agw_decisions_config *d)
{
    static const char *const keys[] = {"match", "no_active_run", NULL};
    static const char *const matches[] = {"run", "thread", NULL};
    static const char *const nars[] = {"new_run", "reject", NULL};
    json_t *x;
    int e;

    if (v == NULL)
        return 0;
    if (want_object(c, "decisions", v) || check_keys(c, "decisions", v, keys))
        return -AGW_EINVAL;
    if ((x = json_object_get(v, "match")) != NULL) {
        if (get_enum(c, "decisions.match", x, matches, &e))
            return -AGW_EINVAL;
        d->match = (enum agw_decision_match)e;
    }
    if ((x = json_object_get(v, "no_active_run")) != NULL) {
        if (get_enum(c, "decisions.no_active_run", x, nars, &e))
            return -AGW_EINVAL;
        d->no_active_run = (enum agw_no_active_run)e;
    }
    return 0;
}

static int parse_log(struct ctx *c, json_t *v, struct agw_log_config *l)
{
    static const char *const keys[] = {"level", "access", NULL};
    static const char *const levels[] = {"error", "warn", "info", "debug", NULL};
    json_t *x;

    if (v != NULL) {
        if (want_object(c, "log", v) || check_keys(c, "log", v, keys))
            return -AGW_EINVAL;
        if ((x = json_object_get(v, "level")) != NULL &&
            get_enum(c, "log.level", x, levels, &l->level))
            return -AGW_EINVAL;
        if ((x = json_object_get(v, "access")) != NULL &&
            get_string(c, "log.access", x, &l->access))
            return -AGW_EINVAL;
    }
    if (l->access == NULL)
        l->access = agw_xstrdup("stderr");
    return 0;
}

static int cmp_agent(const void *a, const void *b)
{
    return strcmp(((const struct agw_agent_config *)a)->id,
                  ((const struct agw_agent_config *)b)->id);
}

static int parse_root(struct ctx *c, json_t *root, struct agw_config *cfg)
{
    static const char *const keys[] = {
        "listen",   "admin", "auth",       "agents",          "limits",
        "timeouts", "store", "history",    "decisions",       "log",
        "workers",  "cors",  "rate_limit", "batch_window_us", NULL};
    json_t *x, *v;
    const char *id;
    size_t i;
    char p[256];

    if (want_object(c, "", root) || check_keys(c, "", root, keys))
        return -AGW_EINVAL;

    x = json_object_get(root, "listen");
    if (!json_is_array(x) || json_array_size(x) == 0 || json_array_size(x) > AGW_MAX_LISTENERS)
        return fail(c, "listen", "required: an array of 1..16 listeners {\"address\", \"port\"}");
    cfg->listeners = agw_xcalloc(json_array_size(x), sizeof(*cfg->listeners));
    json_array_foreach(x, i, v)
    {
        cfg->n_listeners = i + 1;
        join_index(p, sizeof(p), "listen", i);
        if (parse_listener(c, p, v, &cfg->listeners[i], true))
            return -AGW_EINVAL;
    }
    if ((x = json_object_get(root, "admin")) != NULL) {
        cfg->admin = agw_xcalloc(1, sizeof(*cfg->admin));
        if (parse_listener(c, "admin", x, cfg->admin, false))
            return -AGW_EINVAL;
    }

    x = json_object_get(root, "agents");
    if (!json_is_object(x) || json_object_size(x) == 0)
        return fail(
            c, "agents",
            "required: an object of agents by id, e.g. {\"weather\": {\"upstreams\": [...]}}");
    cfg->agents = agw_xcalloc(json_object_size(x), sizeof(*cfg->agents));
    json_object_foreach(x, id, v)
    {
        join(p, sizeof(p), "agents", id);
        if (!agw_agent_id_valid(id))
            return fail(c, p, "an agent id is 1..64 of letters, digits, '.', '_' and '-'");
        cfg->n_agents++;
        if (parse_agent(c, p, id, v, &cfg->agents[cfg->n_agents - 1]))
            return -AGW_EINVAL;
    }
    qsort(cfg->agents, cfg->n_agents, sizeof(*cfg->agents), cmp_agent);

    /* The top-level rate limit first: each key starts from it. */
    if (parse_rate_limit(c, "rate_limit", json_object_get(root, "rate_limit"), &cfg->rate_limit))
        return -AGW_EINVAL;
    if (parse_auth(c, json_object_get(root, "auth"), cfg) ||
        parse_cors(c, json_object_get(root, "cors"), &cfg->cors) ||
        parse_limits(c, json_object_get(root, "limits"), &cfg->limits) ||
        parse_timeouts(c, json_object_get(root, "timeouts"), &cfg->timeouts) ||
        parse_store(c, json_object_get(root, "store"), &cfg->store) ||
        parse_history(c, json_object_get(root, "history"), &cfg->history) ||
        parse_decisions(c, json_object_get(root, "decisions"), &cfg->decisions) ||
        parse_log(c, json_object_get(root, "log"), &cfg->log))
        return -AGW_EINVAL;
    finish_rate_limit(&cfg->rate_limit);
    if ((x = json_object_get(root, "workers")) != NULL &&
        get_uint(c, "workers", x, 0, AGW_MAX_WORKERS, &cfg->workers))
        return -AGW_EINVAL;
    if ((x = json_object_get(root, "batch_window_us")) != NULL &&
        get_uint(c, "batch_window_us", x, 0, AGW_MAX_BATCH_WINDOW_US, &cfg->batch_window_us))
        return -AGW_EINVAL;
    return 0;
}

static struct agw_config *config_new(void)
{
    struct agw_config *cfg = agw_xcalloc(1, sizeof(*cfg));

    cfg->limits.max_body_bytes = 1024 * 1024;
    cfg->limits.stream_buffer_bytes = 256 * 1024;
    cfg->limits.upstream_idle_connections = 256;
    cfg->limits.max_frame_bytes = 1024 * 1024;
    cfg->limits.max_header_bytes = 16 * 1024;
    cfg->limits.max_json_depth = 64;
    cfg->limits.max_request_header_bytes = 32 * 1024;
    cfg->limits.max_request_header_fields = 100;
    cfg->timeouts.connect_ms = 5000;
    cfg->timeouts.first_byte_ms = 60000;
    cfg->timeouts.idle_ms = 300000;
    cfg->timeouts.run_ms = 0;
    cfg->timeouts.heartbeat_ms = 15000;
    cfg->timeouts.drain_ms = 30000;
    cfg->timeouts.request_ms = 30000;
    cfg->log.level = AGW_LOG_INFO;
    cfg->batch_window_us = AGW_DEFAULT_BATCH_WINDOW_US;
    return cfg;
}

static struct agw_config *load(json_t *root, char *err, size_t errlen)
{
    struct ctx c = {err, errlen, false};
    struct agw_config *cfg = config_new();

    if (parse_root(&c, root, cfg) != 0) {
        agw_config_free(cfg);
        cfg = NULL;
    }
    json_decref(root);
    return cfg;
}

struct agw_config *agw_config_load_string(const char *json, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &je);

    if (root == NULL) {
        snprintf(err, errlen, "invalid JSON at line %d, column %d: %s", je.line, je.column,
                 je.text);
        return NULL;
    }
    return load(root, err, errlen);
}

struct agw_config *agw_config_load_file(const char *path, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root;
    FILE *f = fopen(path, "r");

    if (f == NULL) {
        snprintf(err, errlen, "cannot open the file: %s", strerror(errno));
        return NULL;
    }
    root = json_loadf(f, JSON_REJECT_DUPLICATES, &je);
    fclose(f);
    if (root == NULL) {
        snprintf(err, errlen, "invalid JSON at line %d, column %d: %s", je.line, je.column,
                 je.text);
        return NULL;
    }
    return load(root, err, errlen);
}

static void free_listener(struct agw_listener_config *l)
{
    free(l->address);
    free(l->tls.cert);
    free(l->tls.key);
    for (size_t i = 0; i < l->tls.n_sni; i++) {
        free(l->tls.sni[i].cert);
        free(l->tls.sni[i].key);
    }
    free(l->tls.sni);
    free(l->tls.client_ca);
}

void agw_config_free(struct agw_config *cfg)
{
    if (cfg == NULL)
        return;
    for (size_t i = 0; i < cfg->n_listeners; i++)
        free_listener(&cfg->listeners[i]);
    free(cfg->listeners);
    if (cfg->admin != NULL)
        free_listener(cfg->admin);
    free(cfg->admin);
    for (size_t i = 0; i < cfg->auth.n_keys; i++) {
        struct agw_auth_key *k = &cfg->auth.keys[i];
        free(k->id);
        for (size_t j = 0; j < k->n_agents; j++)
            free(k->agents[j]);
        free(k->agents);
    }
    free(cfg->auth.keys);
    for (size_t i = 0; i < cfg->n_agents; i++) {
        struct agw_agent_config *a = &cfg->agents[i];
        free(a->id);
        for (size_t j = 0; j < a->n_upstreams; j++)
            agw_url_clear(&a->upstreams[j]);
        free(a->upstreams);
        for (size_t j = 0; j < a->n_upstream_headers; j++) {
            free(a->upstream_headers[j].name);
            free(a->upstream_headers[j].value);
        }
        free(a->upstream_headers);
        for (size_t j = 0; j < a->n_forward_headers; j++)
            free(a->forward_headers[j]);
        free(a->forward_headers);
        free(a->ca_file);
    }
    free(cfg->agents);
    free(cfg->store.path);
    free(cfg->store.url);
    free(cfg->log.access);
    free_list(cfg->cors.origins, cfg->cors.n_origins);
    free_list(cfg->cors.methods, cfg->cors.n_methods);
    free_list(cfg->cors.headers, cfg->cors.n_headers);
    free(cfg->cors.methods_value);
    free(cfg->cors.headers_value);
    free(cfg->cors.expose_value);
    free(cfg);
}

const struct agw_agent_config *agw_config_find_agent(const struct agw_config *cfg, const char *id)
{
    struct agw_agent_config key = {.id = (char *)(uintptr_t)id};

    if (cfg->n_agents == 0 || cfg->agents == NULL)
        return NULL;
    return bsearch(&key, cfg->agents, cfg->n_agents, sizeof(*cfg->agents), cmp_agent);
}
