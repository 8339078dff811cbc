/* Logging: one line per event on stderr, "<ISO time> <level> <message>". The access log (one JSON
 * line per request) is written by agw_log_access(). Thread-safe: each line is written with one
 * write(2). */
#ifndef AGW_LOG_H
#define AGW_LOG_H

#include "agw/common.h"

enum agw_log_level {
    AGW_LOG_ERROR = 0,
    AGW_LOG_WARN,
    AGW_LOG_INFO,
    AGW_LOG_DEBUG,
};

void agw_log_set_level(enum agw_log_level level);
enum agw_log_level agw_log_get_level(void);
/* Parses "error|warn|info|debug"; returns 0 or -AGW_EINVAL. */
int agw_log_level_parse(const char *s, enum agw_log_level *out);

void agw_log(enum agw_log_level level, const char *fmt, ...) AGW_PRINTF(2, 3);

/* Writes <json_line> (no trailing newline) as one line to the access log: stderr, a file opened by
 * agw_log_access_open(), or nowhere when it was opened with "off". */
int agw_log_access_open(const char *where);
/* Opens the access log's file again by its path (SIGUSR1, after logrotate moved it): lines go to
 * the new file from now on. Returns 0, 1 when the access log is not a file (stderr, off), or
 * -AGW_EIO with errno set. */
int agw_log_access_reopen(void);
/* The access log file's path, or NULL when it is stderr or off. */
const char *agw_log_access_path(void);
void agw_log_access(const char *json_line);
/* False when the access log was opened with "off": callers need not build their lines. */
bool agw_log_access_enabled(void);

/* One request, as the access log records it: never a token or a body. NULL strings are left out
 * (request_id, client, method and path always appear). */
struct agw_access_record {
    const char *request_id, *client, *method, *path;
    const char *agent, *thread, *run, *key; /* key: the bearer key's id */
    int status;                             /* 0: the client left before any answer */
    uint64_t events, bytes, duration_ms;
    const char *upstream; /* authority of the backend */
    const char *outcome;  /* "RUN_FINISHED", "RUN_ERROR:<code>", "client_closed", "error", … */
    bool detached;
    int worker; /* the event loop that took the request (0, 1, …) */
};

/* Writes <r> as one JSON line (no-op when the access log is off). */
void agw_log_access_record(const struct agw_access_record *r);
void agw_log_access_close(void);

#define agw_log_error(...) agw_log(AGW_LOG_ERROR, __VA_ARGS__)
#define agw_log_warn(...)  agw_log(AGW_LOG_WARN, __VA_ARGS__)
#define agw_log_info(...)  agw_log(AGW_LOG_INFO, __VA_ARGS__)
#define agw_log_debug(...)                                                                         \
    do {                                                                                           \
        if (agw_log_get_level() >= AGW_LOG_DEBUG)                                                  \
            agw_log(AGW_LOG_DEBUG, __VA_ARGS__);                                                   \
    } while (0)

#endif
