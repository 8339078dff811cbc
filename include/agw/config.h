/* Configuration: one JSON file loaded into plain C structs. No json_t survives loading.
 * Every key is documented in doc/configuration.md; unknown keys are errors; every error names the
 * key path and the reason, e.g. "agents.weather.upstreams[0]: expects an http(s) URL, got 'foo'".
 *
 * Ownership: agw_config_load_*() returns a config owned by the caller, freed with
 * agw_config_free(). Every string and array inside belongs to it. A loaded config is immutable; a
 * reload builds a new one. */
#ifndef AGW_CONFIG_H
#define AGW_CONFIG_H

#include "agw/common.h"

#define AGW_CONFIG_ERR_MAX 512

enum agw_protocol {
    AGW_PROTO_AGUI = 0, /* "ag-ui": the official protocol (plus CloudBase dialect fixes) */
    AGW_PROTO_AGKIT,    /* "ag-kit": the legacy AG-Kit send-message protocol */
};

enum agw_balance {
    AGW_BALANCE_THREAD_AFFINITY = 0, /* "thread_affinity": consistent hash of threadId */
    AGW_BALANCE_ROUND_ROBIN,         /* "round_robin" */
};

enum agw_on_disconnect {
    AGW_DISCONNECT_CANCEL = 0, /* "cancel": close the upstream when the client goes */
    AGW_DISCONNECT_DETACH,     /* "detach": let the run finish and record it */
};

enum agw_auth_mode {
    AGW_AUTH_BEARER = 0, /* "bearer": the default, needs keys */
    AGW_AUTH_NONE,       /* "none": only when written explicitly */
};

enum agw_store_kind {
    AGW_STORE_EMBEDDED = 0, /* "embedded": files under store.path */
    AGW_STORE_MEMORY,       /* "memory": nothing survives a restart (tests) */
    AGW_STORE_REDIS,        /* "redis": shared by several instances */
};

enum agw_decision_match {
    AGW_MATCH_RUN = 0, /* "run": exact agent+thread+run key */
    AGW_MATCH_THREAD,  /* "thread": latest active run of agent+thread */
};

/* What a decision-only request for an active run becomes (per agent, decisions.forward). */
enum agw_decision_forward {
    AGW_FORWARD_AUTO = 0, /* "auto": forwarded; the backend's answer decides (202, a new stream, an
                             error) */
    AGW_FORWARD_NEVER,    /* "never": always a new run (backends that take no live decisions) */
    AGW_FORWARD_LIVE,     /* "live": forwarded; only a 202/204 is success, anything else an error */
};

enum agw_no_active_run {
    AGW_NO_ACTIVE_RUN_NEW_RUN = 0, /* "new_run": start a run like any other request */
    AGW_NO_ACTIVE_RUN_REJECT,      /* "reject": 400 */
};

/* A parsed upstream URL: http://host[:port]/path?query or https://… */
struct agw_url {
    char *text;      /* the URL as written */
    bool tls;        /* https */
    char *host;      /* host name or address, without brackets */
    uint16_t port;   /* explicit or the scheme's default */
    char *target;    /* request target: path plus query, always starts with '/' */
    char *authority; /* Host header value: host[:port] as written */
};

struct agw_header {
    char *name;
    char *value; /* already expanded when written as "${ENV_VAR}" */
};

enum agw_tls_verify {
    AGW_TLS_VERIFY_NONE = 0, /* no client certificate asked for */
    AGW_TLS_VERIFY_OPTIONAL, /* "optional": asked for; a presented certificate must verify */
    AGW_TLS_VERIFY_REQUIRE,  /* "require": a valid client certificate is mandatory */
};

struct agw_tls_cert {
    char *cert; /* PEM chain file */
    char *key;  /* PEM private key file */
};

struct agw_tls_config {
    char *cert; /* the default certificate chain; NULL = no TLS on this listener */
    char *key;
    struct agw_tls_cert *sni; /* further certificates, chosen by the client's SNI name */
    size_t n_sni;
    char *client_ca; /* CA file for client certificates (mTLS), or NULL */
    enum agw_tls_verify verify;
};

struct agw_listener_config {
    char *address; /* numeric IPv4/IPv6 address */
    uint16_t port; /* 0 = pick a free port */
    struct agw_tls_config tls;
};

struct agw_agent_config {
    char *id;
    struct agw_url *upstreams; /* at least one */
    size_t n_upstreams;
    enum agw_protocol protocol;
    enum agw_balance balance;
    unsigned retries; /* extra attempts on other backends before the first byte (default 1) */
    /* Passive health: a backend that fails <max_fails> times (default 1; 0: never marked) within
     * <fail_timeout_ms> (default 10 s) is tried after the others for that long. */
    unsigned max_fails;
    uint32_t fail_timeout_ms;
    enum agw_on_disconnect on_client_disconnect;
    struct agw_header *upstream_headers; /* sent to the upstream on every request */
    size_t n_upstream_headers;
    char **forward_headers; /* allow-list of client header names forwarded upstream */
    size_t n_forward_headers;
    char *ca_file; /* CA file to verify https upstreams; NULL = the system trust store */
    enum agw_decision_forward decisions_forward;
};

/* Rate limits of one key (doc/configuration.md#rate-limits); 0 = no limit. */
struct agw_rate_limit {
    uint32_t runs_per_minute; /* the token bucket's refill rate */
    uint32_t burst;           /* the bucket's size: runs a key may start at once (default: one
                                 minute's worth) */
    uint32_t concurrent_runs; /* runs of the key streaming at the same time */
};

struct agw_auth_key {
    char *id;
    struct agw_rate_limit rate_limit; /* the top-level rate_limit, overridden field by field */
    uint8_t sha256[32];               /* digest of the token; the token itself is never stored */
    char **agents;                    /* agent ids this key may use */
    size_t n_agents;
    bool all_agents; /* "*" was listed */
};

struct agw_auth_config {
    enum agw_auth_mode mode;
    struct agw_auth_key *keys;
    size_t n_keys;
};

/* CORS for browser frontends (doc/configuration.md#cors). */
struct agw_cors_config {
    bool enabled;   /* a "cors" object was given; without one no origin is allowed */
    char **origins; /* exact origins, as browsers send them ("https://app.example.com") */
    size_t n_origins;
    bool any_origin; /* "*" was listed (never with allow_credentials) */
    char **methods;  /* allowed_methods, upper case */
    size_t n_methods;
    char **headers; /* allowed_headers */
    size_t n_headers;
    char *methods_value; /* the lists as header values: "GET, POST, OPTIONS" */
    char *headers_value;
    char *expose_value; /* exposed_headers ("" for none) */
    uint32_t max_age_s;
    bool allow_credentials;
};

struct agw_limits {
    size_t max_body_bytes;      /* request body (default 1 MiB) */
    size_t stream_buffer_bytes; /* queued output per client stream before the upstream is paused
                                   (256 KiB) */
    size_t max_frame_bytes;     /* one SSE frame from an upstream (1 MiB) */
    size_t max_header_bytes;    /* an upstream response's status line + headers (16 KiB) */
    unsigned max_json_depth;    /* nesting depth of a request body (64) */
    size_t max_request_header_bytes;    /* a client's request line + header fields (32 KiB) */
    unsigned max_request_header_fields; /* header fields in a client's request (100) */
    unsigned upstream_idle_connections; /* kept-alive idle connections per backend and event loop
                                           (256); 0 = a connection per run */
};

struct agw_timeouts {
    uint32_t connect_ms;    /* upstream connect, DNS included (5 s) */
    uint32_t first_byte_ms; /* request sent → first response byte (60 s) */
    uint32_t idle_ms;       /* between upstream frames while streaming (300 s); 0 = never */
    uint32_t run_ms;        /* whole run; 0 = unlimited (default) */
    uint32_t heartbeat_ms;  /* idle client stream → ": ping" (15 s); 0 = never */
    uint32_t drain_ms;      /* SIGTERM → end remaining runs (30 s) */
    uint32_t request_ms;    /* client must send headers and body within this (30 s) */
};

struct agw_store_config {
    enum agw_store_kind kind;
    char *path; /* embedded: directory (default "var/agui-gateway") */
    char *url;  /* redis: redis://host:port[/db] */
};

/* Thread history (doc/configuration.md#history). */
struct agw_history_config {
    bool enabled;                     /* record threads and serve them (true) */
    unsigned max_messages_per_thread; /* the oldest go beyond it (1000) */
    uint64_t ttl_s;                   /* threads idle this long are deleted; 0 = kept (default) */
    unsigned cache_threads;           /* threads held in memory (10000) */
};

struct agw_decisions_config {
    enum agw_decision_match match;
    enum agw_no_active_run no_active_run;
};

struct agw_log_config {
    int level;    /* enum agw_log_level; default info */
    char *access; /* "stderr" (default), "off", or a file path */
};

struct agw_config {
    struct agw_listener_config *listeners; /* at least one */
    size_t n_listeners;
    struct agw_listener_config *admin; /* NULL = /metrics on the main listeners */
    struct agw_auth_config auth;
    struct agw_agent_config *agents; /* sorted by id */
    size_t n_agents;
    struct agw_limits limits;
    struct agw_timeouts timeouts;
    struct agw_store_config store;
    struct agw_history_config history;
    struct agw_decisions_config decisions;
    struct agw_log_config log;
    struct agw_cors_config cors;
    struct agw_rate_limit rate_limit; /* every key's default; with auth off, every client's */
    unsigned workers;                 /* event loops (threads); 0 = one per core (default) */
    unsigned batch_window_us; /* wake-up batching of a busy loop (include/agw/loop.h); 0 = off */
};

/* Loads and validates. On error returns NULL and writes "<key path>: <reason>" into <err>. */
struct agw_config *agw_config_load_file(const char *path, char *err, size_t errlen);
struct agw_config *agw_config_load_string(const char *json, char *err, size_t errlen);
void agw_config_free(struct agw_config *cfg);

/* Borrowed pointer into <cfg>, or NULL. */
const struct agw_agent_config *agw_config_find_agent(const struct agw_config *cfg, const char *id);

/* "5s", "500ms", "2m", "1h" or a bare integer of milliseconds → ms. Returns 0 or -AGW_EINVAL. */
int agw_parse_duration(const char *s, uint32_t *ms);
/* "1MiB", "256KiB", "512k", "1m", "100" → bytes. Returns 0 or -AGW_EINVAL. */
int agw_parse_size(const char *s, size_t *bytes);
/* A retention period: a positive integer followed by s, m, h or d ("30d"), or "0" (never).
 * Returns 0 and the seconds in *<seconds>, or -AGW_EINVAL. */
int agw_parse_ttl(const char *s, uint64_t *seconds);
/* Parses an http:// or https:// URL. Returns 0 or -AGW_EINVAL with a reason in <err>. <u> owns its
 * strings. */
int agw_url_parse(const char *s, struct agw_url *u, char *err, size_t errlen);
void agw_url_clear(struct agw_url *u);

#endif
