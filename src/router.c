/* Routing (doc/protocol.md#routing): method + path → route, by exact match of the whole path.
 *
 * There is no prefix matching and no normalisation: "/healthz/", "/healthzx",
 * "/v1/ag-ui/agents/a/runs/" and
 * "//healthz" are all unknown paths (404). A trailing slash is a different resource in HTTP, and
 * answering it would make two URLs for one run endpoint (and two cache keys in front of the
 * gateway). Ids are one path segment each, percent-decoded and validated by agw_path_id_decode();
 * an id is checked before the method, so a malformed id is reported whatever the method. */
#include "config.h"

#include <assert.h>
#include <string.h>

#include "agw/router.h"

#define AGENT_ID_MAX 64

/* Consumes the literal <lit> at *<p>; true on a match. */
static bool eat(const char **p, const char *lit)
{
    size_t n = strlen(lit);

    if (strncmp(*p, lit, n) != 0)
        return false;
    *p += n;
    return true;
}

/* Consumes one segment (up to the next '/' or the end) at *<p> and decodes it into <out>. Returns 0
 * or -AGW_EINVAL. */
static int eat_id(const char **p, char out[AGW_ID_MAX + 1])
{
    const char *start = *p;
    size_t n = strcspn(start, "/");
    int rc;

    *p += n;
    rc = agw_path_id_decode(start, n, out, AGW_ID_MAX + 1);
    return rc < 0 ? rc : 0;
}

int agw_path_id_decode(const char *in, size_t len, char *out, size_t outlen)
{
    size_t n = 0;

    assert(in != NULL || len == 0);
    assert(out != NULL && outlen > 0);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)in[i];
        if (c == '%') {
            int hi, lo;
            if (len - i < 3 || (hi = agw_hexval(in[i + 1])) < 0 || (lo = agw_hexval(in[i + 2])) < 0)
                goto bad;
            c = (unsigned char)(hi << 4 | lo);
            i += 2;
        }
        /* Controls (NUL included), DEL and '/' are refused whether they came raw or encoded. */
        if (c < 0x20 || c == 0x7f || c == '/')
            goto bad;
        if (n >= AGW_ID_MAX || n + 1 >= outlen)
            goto bad;
        out[n++] = (char)c;
    }
    out[n] = '\0';
    /* "." and ".." are dot-segments: clients resolve them before sending, so only a crafted request
     * carries one, and an id spelled like a directory is never useful to a store. */
    if (n == 0 || strcmp(out, ".") == 0 || strcmp(out, "..") == 0 || !agw_utf8_valid(out, n))
        goto bad;
    return (int)n;
bad:
    out[0] = '\0'; /* never a partial id */
    return -AGW_EINVAL;
}

bool agw_agent_id_valid(const char *id)
{
    size_t n = 0;

    if (id == NULL)
        return false;
    for (; id[n] != '\0'; n++) {
        char c = id[n];
        if (n >= AGENT_ID_MAX)
            return false;
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return n > 0;
}

static bool method_allowed(enum agw_route_id id, enum agw_method m)
{
    switch (id) {
    case AGW_ROUTE_HEALTHZ:
    case AGW_ROUTE_METRICS:
        return m == AGW_METHOD_GET || m == AGW_METHOD_HEAD;
    case AGW_ROUTE_RUNS:
    case AGW_ROUTE_CANCEL:
    case AGW_ROUTE_AGKIT_SEND:
        return m == AGW_METHOD_POST || m == AGW_METHOD_OPTIONS;
    case AGW_ROUTE_THREAD_MESSAGES:
        return m == AGW_METHOD_GET || m == AGW_METHOD_HEAD || m == AGW_METHOD_OPTIONS;
    case AGW_ROUTE_NONE:
        break;
    }
    return false;
}

/* The path without its leading "/v1/ag-ui/agents/": "{agent_id}/runs" or
 * "{agent_id}/runs/{run_id}/cancel". */
static int match_agents(const char *p, struct agw_route *r)
{
    if (eat_id(&p, r->agent_id) != 0 || !agw_agent_id_valid(r->agent_id))
        return -AGW_EINVAL;
    if (!eat(&p, "/runs"))
        return -AGW_ENOTFOUND;
    if (*p == '\0') {
        r->id = AGW_ROUTE_RUNS;
        return 0;
    }
    if (!eat(&p, "/"))
        return -AGW_ENOTFOUND;
    if (eat_id(&p, r->run_id) != 0)
        return -AGW_EINVAL;
    if (!eat(&p, "/cancel") || *p != '\0')
        return -AGW_ENOTFOUND;
    r->id = AGW_ROUTE_CANCEL;
    return 0;
}

/* The path without its leading "/v1/ag-ui/threads/": "{thread_id}/messages". */
static int match_threads(const char *p, struct agw_route *r)
{
    if (eat_id(&p, r->thread_id) != 0)
        return -AGW_EINVAL;
    if (!eat(&p, "/messages") || *p != '\0')
        return -AGW_ENOTFOUND;
    r->id = AGW_ROUTE_THREAD_MESSAGES;
    return 0;
}

/* Shapes are checked before ids: an id is only validated once the rest of the path names a known
 * route, so
 * "/v1/ag-ui/agents/%zz/nope" is 404, not 400. */
static bool shape_agents(const char *p)
{
    const char *slash = strchr(p, '/');

    if (slash == NULL)
        return false;
    if (strcmp(slash, "/runs") == 0)
        return true;
    if (strncmp(slash, "/runs/", 6) != 0)
        return false;
    slash = strchr(slash + 6, '/');
    return slash != NULL && strcmp(slash, "/cancel") == 0;
}

/* "/v1/ag-kit/agents/" + "{agent_id}/send-message". */
static int match_agkit(const char *p, struct agw_route *r)
{
    const char *slash = strchr(p, '/');

    if (slash == NULL || strcmp(slash, "/send-message") != 0)
        return -AGW_ENOTFOUND;
    if (eat_id(&p, r->agent_id) != 0 || !agw_agent_id_valid(r->agent_id))
        return -AGW_EINVAL;
    r->id = AGW_ROUTE_AGKIT_SEND;
    return 0;
}

static bool shape_threads(const char *p)
{
    const char *slash = strchr(p, '/');
    return slash != NULL && strcmp(slash, "/messages") == 0;
}

int agw_router_match(const char *path, enum agw_method method, struct agw_route *r)
{
    const char *p = path;
    int rc;

    assert(r != NULL);
    memset(r, 0, sizeof(*r));
    if (p == NULL)
        return -AGW_ENOTFOUND;

    if (strcmp(p, "/healthz") == 0) {
        r->id = AGW_ROUTE_HEALTHZ;
    } else if (strcmp(p, "/metrics") == 0) {
        r->id = AGW_ROUTE_METRICS;
    } else if (eat(&p, "/v1/ag-ui/agents/")) {
        if (!shape_agents(p))
            return -AGW_ENOTFOUND;
        rc = match_agents(p, r);
        if (rc != 0)
            goto fail;
    } else if (eat(&p, "/v1/ag-kit/agents/")) {
        rc = match_agkit(p, r);
        if (rc == -AGW_ENOTFOUND)
            return rc;
        if (rc != 0)
            goto fail;
    } else if (eat(&p, "/v1/ag-ui/threads/")) {
        if (!shape_threads(p))
            return -AGW_ENOTFOUND;
        rc = match_threads(p, r);
        if (rc != 0)
            goto fail;
    } else {
        return -AGW_ENOTFOUND;
    }
    r->method_allowed = method_allowed(r->id, method);
    return 0;
fail:
    memset(r, 0, sizeof(*r));
    return rc;
}

const char *agw_route_allow(enum agw_route_id id)
{
    switch (id) {
    case AGW_ROUTE_HEALTHZ:
    case AGW_ROUTE_METRICS:
        return "GET, HEAD";
    case AGW_ROUTE_RUNS:
    case AGW_ROUTE_CANCEL:
    case AGW_ROUTE_AGKIT_SEND:
        return "POST, OPTIONS";
    case AGW_ROUTE_THREAD_MESSAGES:
        return "GET, HEAD, OPTIONS";
    case AGW_ROUTE_NONE:
        break;
    }
    return "";
}

enum agw_method agw_method_parse(const char *s)
{
    if (s == NULL)
        return AGW_METHOD_OTHER;
    if (strcmp(s, "GET") == 0)
        return AGW_METHOD_GET;
    if (strcmp(s, "HEAD") == 0)
        return AGW_METHOD_HEAD;
    if (strcmp(s, "POST") == 0)
        return AGW_METHOD_POST;
    if (strcmp(s, "OPTIONS") == 0)
        return AGW_METHOD_OPTIONS;
    return AGW_METHOD_OTHER;
}
