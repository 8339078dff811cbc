/* Logging to stderr and the JSON access log. Each line is formatted into one buffer and written
 * with a single write(2), so lines from several threads never interleave. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "agw/log.h"

static volatile int log_level = AGW_LOG_INFO;
static int access_fd = 2; /* -1 = off */
static char *access_path; /* the file's path, when the access log is a file */

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void agw_log_set_level(enum agw_log_level level)
{
    log_level = (int)level;
}

enum agw_log_level agw_log_get_level(void)
{
    return (enum agw_log_level)log_level;
}

int agw_log_level_parse(const char *s, enum agw_log_level *out)
{
    for (size_t i = 0; i < AGW_ARRAY_LEN(level_names); i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (enum agw_log_level)i;
            return 0;
        }
    }
    return -AGW_EINVAL;
}

static size_t format_time(char *buf, size_t len)
{
    struct timespec ts;
    struct tm tm;
    size_t n;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(buf + n, len - n, ".%03ldZ", ts.tv_nsec / 1000000L);
    return n;
}

static void write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, buf, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        buf += w;
        len -= (size_t)w;
    }
}

void agw_log(enum agw_log_level level, const char *fmt, ...)
{
    char line[4096];
    size_t n;
    int m;
    va_list ap;

    if ((int)level > log_level)
        return;
    n = format_time(line, sizeof(line));
    n += (size_t)snprintf(line + n, sizeof(line) - n, " %-5s ", level_names[level]);
    va_start(ap, fmt);
    m = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    n += (size_t)m;
    if (n > sizeof(line) - 2) {
        /* Say that the line was cut rather than cutting it silently. */
        n = sizeof(line) - 5;
        memcpy(line + n, "...", 3);
        n += 3;
    }
    line[n++] = '\n';
    write_all(2, line, n);
}

int agw_log_access_open(const char *where)
{
    int fd;

    if (where == NULL || strcmp(where, "stderr") == 0) {
        fd = 2;
    } else if (strcmp(where, "off") == 0) {
        fd = -1;
    } else {
        fd = open(where, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
        if (fd < 0)
            return -AGW_EIO;
    }
    agw_log_access_close();
    access_fd = fd;
    if (fd > 2)
        access_path = agw_xstrdup(where);
    return 0;
}

/* The new file takes the old descriptor's number (dup2 replaces it in one step), so that a thread
 * writing a line at that moment writes it whole to one file or the other, never to a closed or
 * reused descriptor. */
int agw_log_access_reopen(void)
{
    int fd;

    if (access_path == NULL)
        return 1;
    fd = open(access_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0)
        return -AGW_EIO;
    if (dup3(fd, access_fd, O_CLOEXEC) < 0) {
        close(fd);
        return -AGW_EIO;
    }
    close(fd);
    return 0;
}

const char *agw_log_access_path(void)
{
    return access_path;
}

bool agw_log_access_enabled(void)
{
    return access_fd >= 0;
}

void agw_log_access(const char *json_line)
{
    size_t len;
    char buf[2048];

    if (access_fd < 0)
        return;
    len = strlen(json_line);
    if (len + 1 <= sizeof(buf)) {
        memcpy(buf, json_line, len);
        buf[len] = '\n';
        write_all(access_fd, buf, len + 1);
    } else {
        /* One system call for the line and its newline, so that lines written by several event
         * loops at once never interleave. */
        char *whole = malloc(len + 1);
        if (whole == NULL)
            return;
        memcpy(whole, json_line, len);
        whole[len] = '\n';
        write_all(access_fd, whole, len + 1);
        free(whole);
    }
}

void agw_log_access_close(void)
{
    if (access_fd > 2)
        close(access_fd);
    access_fd = 2;
    free(access_path);
    access_path = NULL;
}

void agw_log_access_record(const struct agw_access_record *r)
{
    json_t *o;
    char *line;

    if (!agw_log_access_enabled())
        return;
    o = json_object();
    json_object_set_new(o, "time", json_integer((json_int_t)agw_wall_ms()));
    json_object_set_new(o, "request_id", json_string(r->request_id ? r->request_id : ""));
    json_object_set_new(o, "client", json_string(r->client ? r->client : ""));
    json_object_set_new(o, "method", json_string(r->method ? r->method : ""));
    /* The path may hold ids a client chose: jansson refuses invalid UTF-8, so it is logged only
     * when valid. */
    json_object_set_new(o, "path",
                        json_string(r->path ? r->path : "") ?: json_string("(invalid utf-8)"));
    if (r->agent != NULL)
        json_object_set_new(o, "agent", json_string(r->agent));
    if (r->thread != NULL)
        json_object_set_new(o, "thread", json_string(r->thread));
    if (r->run != NULL)
        json_object_set_new(o, "run", json_string(r->run));
    if (r->key != NULL)
        json_object_set_new(o, "key", json_string(r->key));
    json_object_set_new(o, "status", json_integer(r->status));
    json_object_set_new(o, "events", json_integer((json_int_t)r->events));
    json_object_set_new(o, "bytes", json_integer((json_int_t)r->bytes));
    json_object_set_new(o, "duration_ms", json_integer((json_int_t)r->duration_ms));
    if (r->upstream != NULL)
        json_object_set_new(o, "upstream", json_string(r->upstream));
    if (r->outcome != NULL)
        json_object_set_new(o, "outcome", json_string(r->outcome));
    if (r->detached)
        json_object_set_new(o, "detached", json_true());
    json_object_set_new(o, "worker", json_integer(r->worker));
    line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (line != NULL)
        agw_log_access(line);
    free(line);
    json_decref(o);
}
