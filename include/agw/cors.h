/* CORS for browser frontends (doc/protocol.md#cors): whether a request's Origin is allowed, whether
 * a preflight asks for what the configuration allows, and the header fields an allowed origin gets.
 * Pure: the gateway reads the request's fields and adds the answer's.
 *
 * Ownership: everything is borrowed from the configuration and the request; nothing is kept. */
#ifndef AGW_CORS_H
#define AGW_CORS_H

#include "agw/config.h"

enum agw_cors_origin {
    AGW_CORS_NONE = 0, /* no Origin: not a cross-origin request, nothing to add */
    AGW_CORS_ALLOWED,  /* listed (or "*"): the answer carries the CORS fields */
    AGW_CORS_DENIED,   /* not listed, or CORS is not configured: no CORS field; a preflight 403 */
};

/* <origin>: the request's Origin header, or NULL. */
enum agw_cors_origin agw_cors_check_origin(const struct agw_cors_config *c, const char *origin);

/* A preflight from an allowed origin: the method it announces (Access-Control-Request-Method) must
 * be in allowed_methods and every header it lists (Access-Control-Request-Headers, may be NULL) in
 * allowed_headers, compared without case. Returns 0, or -AGW_EINVAL with the reason in <err>
 * ("method 'PUT' is not allowed"). */
int agw_cors_check_preflight(const struct agw_cors_config *c, const char *method,
                             const char *headers, char *err, size_t errlen);

typedef void agw_cors_header_fn(const char *name, const char *value, void *arg);

/* The header fields of an answer to allowed <origin>, one <fn> call each: Access-Control-Allow-
 * Origin, Vary, Access-Control-Allow-Credentials when configured, and for a preflight the allowed
 * methods, headers and Max-Age, for any other answer the exposed headers. */
void agw_cors_headers(const struct agw_cors_config *c, const char *origin, bool preflight,
                      agw_cors_header_fn *fn, void *arg);

#endif
