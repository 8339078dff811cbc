/* Routing: method + path → route (doc/protocol.md#routing). Exact matches only (no prefix
 * matching); path ids are percent-decoded and validated here. Pure. */
#ifndef AGW_ROUTER_H
#define AGW_ROUTER_H

#include "agw/common.h"

enum agw_route_id {
    AGW_ROUTE_NONE = 0,
    AGW_ROUTE_HEALTHZ,         /* GET /healthz */
    AGW_ROUTE_METRICS,         /* GET /metrics */
    AGW_ROUTE_RUNS,            /* POST /v1/ag-ui/agents/{agent_id}/runs */
    AGW_ROUTE_CANCEL,          /* POST /v1/ag-ui/agents/{agent_id}/runs/{run_id}/cancel */
    AGW_ROUTE_THREAD_MESSAGES, /* GET /v1/ag-ui/threads/{thread_id}/messages */
    AGW_ROUTE_AGKIT_SEND,      /* POST /v1/ag-kit/agents/{agent_id}/send-message (legacy clients) */
};

#define AGW_ID_MAX 256 /* decoded bytes of one path id */

struct agw_route {
    enum agw_route_id id;
    bool method_allowed;            /* false → 405 with agw_route_allow() */
    char agent_id[AGW_ID_MAX + 1];  /* decoded, for RUNS, CANCEL and AGKIT_SEND */
    char run_id[AGW_ID_MAX + 1];    /* decoded, for CANCEL */
    char thread_id[AGW_ID_MAX + 1]; /* decoded, for THREAD_MESSAGES */
};

/* Matches <path> (the request target without query string, still percent-encoded). Returns 0 with
 * <r> filled (check r->method_allowed), -AGW_ENOTFOUND for an unknown path, -AGW_EINVAL when an id
 * is badly encoded or invalid (empty, too long, control characters, invalid UTF-8, a '/' once
 * decoded, "." or "..", or an agent id failing agw_agent_id_valid()). No normalisation: a trailing
 * slash or an empty segment elsewhere is an unknown path. Ids are checked before the method, so a
 * bad id is -AGW_EINVAL whatever the method. <r> is zeroed on every error. */
int agw_router_match(const char *path, enum agw_method method, struct agw_route *r);

/* The Allow header value for a route, e.g. "POST, OPTIONS"; "" for AGW_ROUTE_NONE. */
const char *agw_route_allow(enum agw_route_id id);
/* "GET" → AGW_METHOD_GET, …; case-sensitive (RFC 9110), anything else (and NULL) →
 * AGW_METHOD_OTHER. */
enum agw_method agw_method_parse(const char *s);

/* Percent-decodes <in> (<len> bytes) into <out> (at most <outlen>-1 bytes plus NUL) and validates
 * it as a path id: %XX in either case ('+' is literal), 1..AGW_ID_MAX bytes once decoded, valid
 * UTF-8, no control byte, DEL or '/', not "." or "..". Returns the decoded length, or -AGW_EINVAL
 * with <out> set to "". */
int agw_path_id_decode(const char *in, size_t len, char *out, size_t outlen);

/* Agent ids in config and paths: 1..64 of [A-Za-z0-9._-]. */
bool agw_agent_id_valid(const char *id);

#endif
