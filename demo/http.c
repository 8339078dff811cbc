/* The HTTP/1.1 server of the demo agent (see http.h): connections, the request parser, whole
 * responses and the write path. It does not use evhttp, because evhttp cannot produce
 * close-delimited bodies or drop a connection mid-body, and cannot write one byte per write. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>
#include <jansson.h>

#include "agw/common.h"
#include "agw/log.h"

#include "demo.h"
#include "http.h"
#include "requests.h"
#include "run.h"
#include "stream.h"
#include "util.h"

#define HEAD_MAX_LINE   8192              /* request line or one header line */
#define HEAD_MAX_BYTES  (64 * 1024)       /* the whole request head */
#define HEAD_MAX_FIELDS 100               /* header fields per request */
#define BODY_MAX_BYTES  (8 * 1024 * 1024) /* request body (Content-Length or chunked) */
#define IN_MAX_BYTES    (256 * 1024) /* stop reading the socket above this much unparsed input */
#define IDLE_TIMEOUT_S  120          /* keep-alive connection waiting for a request */
#define CLOSE_TIMEOUT_S 30           /* flushing the last bytes before a close */

static const char *const conn_state_names[] = {"head", "body", "delay", "stream", "closing"};

static void conn_process(struct conn *c);

/* RFC 9110 token characters (header names, methods). */
static bool is_tchar(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch != '\0' && strchr("!#$%&'*+-.^_`|~", ch) != NULL);
}

static const char *reason_phrase(int status)
{
    static const struct {
        int status;
        const char *text;
    } phrases[] = {
        {100, "Continue"},
        {200, "OK"},
        {201, "Created"},
        {202, "Accepted"},
        {204, "No Content"},
        {400, "Bad Request"},
        {401, "Unauthorized"},
        {403, "Forbidden"},
        {404, "Not Found"},
        {405, "Method Not Allowed"},
        {408, "Request Timeout"},
        {409, "Conflict"},
        {413, "Content Too Large"},
        {415, "Unsupported Media Type"},
        {422, "Unprocessable Content"},
        {429, "Too Many Requests"},
        {431, "Request Header Fields Too Large"},
        {500, "Internal Server Error"},
        {501, "Not Implemented"},
        {502, "Bad Gateway"},
        {503, "Service Unavailable"},
        {504, "Gateway Timeout"},
        {505, "HTTP Version Not Supported"},
    };
    for (size_t i = 0; i < AGW_ARRAY_LEN(phrases); i++) {
        if (phrases[i].status == status)
            return phrases[i].text;
    }
    return "Status";
}

/* The header's value, or NULL. <name> is lowercase. */
static const char *header_get(const struct conn *c, const char *name)
{
    for (size_t i = 0; i < c->nhdrs; i++) {
        if (strcmp(c->hdrs[i].name, name) == 0)
            return c->hdrs[i].value;
    }
    return NULL;
}

/* ---- connection output ----------------------------------------------------------------------- */

size_t conn_queued(const struct conn *c)
{
    return evbuffer_get_length(bufferevent_get_output(c->bev)) + evbuffer_get_length(c->wire);
}

/* bytewise: hands the socket one more byte once it has written the previous one. */
static void trickle(struct conn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (evbuffer_get_length(c->wire) > 0 && evbuffer_get_length(out) == 0)
        evbuffer_remove_buffer(c->wire, out, 1);
}

/* Queues <src>'s bytes (drained) for the client, through the bytewise trickle when it is on or
 * busy. */
void conn_send_buffer(struct conn *c, struct evbuffer *src)
{
    if (c->bytewise || evbuffer_get_length(c->wire) > 0) {
        evbuffer_add_buffer(c->wire, src);
        trickle(c);
    } else {
        evbuffer_add_buffer(bufferevent_get_output(c->bev), src);
    }
}

bool conn_write_now(struct conn *c, struct evbuffer *src)
{
    /* Only with nothing queued: bytes written here must not overtake queued ones. An error (EAGAIN,
     * or a reset the bufferevent will report) leaves the bytes to the output. */
    if (!c->bytewise && conn_queued(c) == 0)
        (void)evbuffer_write(src, bufferevent_getfd(c->bev));
    if (evbuffer_get_length(src) == 0)
        return true;
    conn_send_buffer(c, src);
    return false;
}

void conn_send(struct conn *c, const void *data, size_t len)
{
    if (c->bytewise || evbuffer_get_length(c->wire) > 0) {
        evbuffer_add(c->wire, data, len);
        trickle(c);
    } else {
        evbuffer_add(bufferevent_get_output(c->bev), data, len);
    }
}

void set_state(struct conn *c, enum conn_state st)
{
    agw_log_debug("conn %" PRIu64 ": %s -> %s", c->id, conn_state_names[c->state],
                  conn_state_names[st]);
    c->state = st;
}

void arm_timer(struct conn *c, uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    evtimer_add(c->timer, &tv);
}

/* Ends the connection once its output is flushed; the write callback or the timer frees it. */
void conn_closing(struct conn *c)
{
    struct timeval tv = {CLOSE_TIMEOUT_S, 0};

    set_state(c, CONN_ST_CLOSING);
    bufferevent_set_timeouts(c->bev, NULL, &tv);
    evtimer_del(c->timer);
    if (conn_queued(c) == 0)
        arm_timer(c, 0);
}

static void request_reset(struct conn *c)
{
    free(c->method);
    free(c->target);
    c->method = c->target = NULL;
    for (size_t i = 0; i < c->nhdrs; i++) {
        free(c->hdrs[i].name);
        free(c->hdrs[i].value);
    }
    free(c->hdrs);
    c->hdrs = NULL;
    c->nhdrs = 0;
    c->head_bytes = 0;
    c->line_seen = false;
    c->keep_alive = false;
    c->chunked = false;
    c->cst = CHUNK_SIZE;
    c->body_left = 0;
    evbuffer_drain(c->body, evbuffer_get_length(c->body));
}

/* The response is queued: wait for the next request, or close. */
void response_done(struct conn *c, bool close)
{
    if (close || !c->keep_alive) {
        conn_closing(c);
        return;
    }
    request_reset(c);
    c->bytewise = false;
    set_state(c, CONN_ST_HEAD);
    {
        struct timeval tv = {IDLE_TIMEOUT_S, 0};
        bufferevent_set_timeouts(c->bev, &tv, NULL);
    }
    if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
        arm_timer(c, 0); /* a pipelined request: parse it from the loop, not from here */
}

/* Queues a complete response with a body and Content-Length. <extra> is a block of header lines or
 * "". */
void send_response(struct conn *c, int status, const char *ctype, const char *body, size_t len,
                   const char *extra, bool close)
{
    struct evbuffer *b = evbuffer_new();
    bool keep = c->keep_alive && !close;

    evbuffer_add_printf(b,
                        "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                        "Cache-Control: no-cache\r\n%sConnection: %s\r\n\r\n",
                        status, reason_phrase(status), ctype, len, extra,
                        keep ? "keep-alive" : "close");
    if (c->method == NULL || strcmp(c->method, "HEAD") != 0)
        evbuffer_add(b, body, len);
    conn_send_buffer(c, b);
    evbuffer_free(b);
    response_done(c, !keep);
}

void send_json(struct conn *c, int status, json_t *body, const char *extra, bool close)
{
    char *txt = json_dumps(body, JSON_COMPACT);
    if (!txt)
        abort();
    send_response(c, status, "application/json", txt, strlen(txt), extra, close);
    free(txt);
    json_decref(body);
}

void send_error(struct conn *c, int status, const char *msg, bool close)
{
    agw_log_info("conn %" PRIu64 ": %s %s -> %d %s", c->id, c->method ? c->method : "-",
                 c->target ? c->target : "-", status, msg);
    json_t *body = json_object();
    json_object_set_new(body, "error", json_str_lossy(msg, strlen(msg)));
    send_json(c, status, body, "", close);
}

/* ---- parsing requests ------------------------------------------------------------------------ */

/* Parses head lines from the input. Returns 0 when the head is complete, AGW_AGAIN, or an HTTP
 * status for an error (with the message in <err>). */
static int parse_head(struct conn *c, const char **err)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);

    for (;;) {
        size_t len = 0;
        char *line;
        struct evbuffer_ptr eol = evbuffer_search_eol(in, NULL, NULL, EVBUFFER_EOL_CRLF);

        if (eol.pos < 0) {
            if (evbuffer_get_length(in) > HEAD_MAX_LINE) {
                *err = "request line or header line too long";
                return c->line_seen ? 431 : 414;
            }
            return AGW_AGAIN;
        }
        line = evbuffer_readln(in, &len, EVBUFFER_EOL_CRLF);
        if (!line)
            return AGW_AGAIN;
        c->head_bytes += len + 2;
        if (len > HEAD_MAX_LINE || c->head_bytes > HEAD_MAX_BYTES) {
            free(line);
            *err = "request head too large";
            return 431;
        }
        if (!c->line_seen) {
            char *sp1, *sp2;
            if (len == 0) { /* tolerated empty lines before a request */
                free(line);
                continue;
            }
            sp1 = strchr(line, ' ');
            sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
            if (!sp1 || !sp2 || sp1 == line || sp2 == sp1 + 1 || strchr(sp2 + 1, ' ')) {
                free(line);
                *err = "malformed request line";
                return 400;
            }
            if (strcmp(sp2 + 1, "HTTP/1.1") == 0) {
                c->minor = 1;
            } else if (strcmp(sp2 + 1, "HTTP/1.0") == 0) {
                c->minor = 0;
            } else {
                bool http = strncmp(sp2 + 1, "HTTP/", 5) == 0;
                free(line);
                *err = http ? "HTTP version not supported" : "malformed request line";
                return http ? 505 : 400;
            }
            for (const char *t = line; t < sp1; t++) {
                if (!is_tchar(*t)) {
                    free(line);
                    *err = "malformed request method";
                    return 400;
                }
            }
            c->method = agw_xstrndup(line, (size_t)(sp1 - line));
            {
                /* absolute-form (http://host/path) is routed by its path */
                const char *t = sp1 + 1;
                if (strncmp(t, "http://", 7) == 0 || strncmp(t, "https://", 8) == 0) {
                    const char *slash =
                        memchr(t + 8, '/', (size_t)(sp2 - t) > 8 ? (size_t)(sp2 - t) - 8 : 0);
                    t = slash ? slash : sp2;
                }
                c->target = t == sp2 ? agw_xstrdup("/") : agw_xstrndup(t, (size_t)(sp2 - t));
            }
            c->line_seen = true;
            free(line);
            continue;
        }
        if (len == 0) {
            free(line);
            return 0;
        }
        {
            char *colon = strchr(line, ':');
            char *v, *e, *ws = strpbrk(line, " \t");
            if (!colon || colon == line || (ws && ws < colon)) {
                free(line);
                *err = "malformed header line";
                return 400;
            }
            if (c->nhdrs == HEAD_MAX_FIELDS) {
                free(line);
                *err = "too many header fields";
                return 431;
            }
            *colon = '\0';
            for (const char *t = line; *t; t++) {
                if (!is_tchar(*t)) {
                    free(line);
                    *err = "malformed header name";
                    return 400;
                }
            }
            v = colon + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            e = v + strlen(v);
            while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
                *--e = '\0';
            if (c->nhdrs == 0)
                c->hdrs = agw_xcalloc(HEAD_MAX_FIELDS, sizeof(*c->hdrs));
            c->hdrs[c->nhdrs].name = str_lower(line);
            c->hdrs[c->nhdrs].value = agw_xstrdup(v);
            c->nhdrs++;
            free(line);
        }
    }
}

/* The head is complete: decide the body's framing and the connection's persistence. Returns 0 or an
 * HTTP status with <err>. */
static int head_done(struct conn *c, const char **err)
{
    const char *te = header_get(c, "transfer-encoding");
    const char *conn = header_get(c, "connection");
    const char *expect = header_get(c, "expect");
    bool has_cl = false;

    c->keep_alive = c->minor == 1 ? !agw_header_has_token(conn, "close")
                                  : agw_header_has_token(conn, "keep-alive");
    for (size_t i = 0; i < c->nhdrs; i++) {
        char *end = NULL;
        unsigned long long v;
        if (strcmp(c->hdrs[i].name, "content-length") != 0)
            continue;
        errno = 0;
        v = strtoull(c->hdrs[i].value, &end, 10);
        if (c->hdrs[i].value[0] < '0' || c->hdrs[i].value[0] > '9' || *end != '\0' || errno != 0 ||
            (has_cl && v != c->body_left)) {
            *err = "invalid Content-Length";
            return 400;
        }
        if (v > BODY_MAX_BYTES) {
            *err = "request body too large";
            return 413;
        }
        c->body_left = v;
        has_cl = true;
    }
    if (te) {
        if (has_cl) {
            *err = "both Content-Length and Transfer-Encoding";
            return 400;
        }
        if (!agw_strieq_n(te, strlen(te), "chunked")) {
            *err = "unsupported Transfer-Encoding";
            return 501;
        }
        c->chunked = true;
        c->cst = CHUNK_SIZE;
    }
    if (expect && agw_strieq_n(expect, strlen(expect), "100-continue") && c->minor == 1 &&
        (c->chunked || c->body_left > 0) && evbuffer_get_length(bufferevent_get_input(c->bev)) == 0)
        conn_send(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    return 0;
}

/* Moves body bytes from the input into c->body. Returns 0 when the body is complete, AGW_AGAIN, or
 * an HTTP status with <err>. */
static int read_body(struct conn *c, const char **err)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);

    if (!c->chunked) {
        size_t n = evbuffer_get_length(in);
        if (n > c->body_left)
            n = (size_t)c->body_left;
        evbuffer_remove_buffer(in, c->body, n);
        c->body_left -= n;
        return c->body_left == 0 ? 0 : AGW_AGAIN;
    }
    for (;;) {
        size_t len = 0, n;
        char *line, *end = NULL;
        unsigned long long v;

        switch (c->cst) {
        case CHUNK_SIZE:
        case CHUNK_DATA_END:
        case CHUNK_TRAILER:
            line = evbuffer_readln(in, &len, EVBUFFER_EOL_CRLF);
            if (!line) {
                if (evbuffer_get_length(in) > HEAD_MAX_LINE) {
                    *err = "chunk line too long";
                    return 400;
                }
                return AGW_AGAIN;
            }
            if (c->cst == CHUNK_SIZE) {
                errno = 0;
                v = strtoull(line, &end, 16);
                if (agw_hexval(line[0]) < 0 || errno != 0 ||
                    (*end != '\0' && *end != ';' && *end != ' ' && *end != '\t')) {
                    free(line);
                    *err = "malformed chunk size";
                    return 400;
                }
                free(line);
                if (v > BODY_MAX_BYTES || evbuffer_get_length(c->body) + v > BODY_MAX_BYTES) {
                    *err = "request body too large";
                    return 413;
                }
                c->body_left = v;
                c->cst = v == 0 ? CHUNK_TRAILER : CHUNK_DATA;
            } else if (c->cst == CHUNK_DATA_END) {
                free(line);
                if (len != 0) {
                    *err = "malformed chunk end";
                    return 400;
                }
                c->cst = CHUNK_SIZE;
            } else {
                free(line);
                c->head_bytes += len + 2;
                if (c->head_bytes > HEAD_MAX_BYTES) {
                    *err = "trailers too large";
                    return 431;
                }
                if (len == 0)
                    return 0;
            }
            break;
        case CHUNK_DATA:
            n = evbuffer_get_length(in);
            if (n == 0)
                return AGW_AGAIN;
            if (n > c->body_left)
                n = (size_t)c->body_left;
            evbuffer_remove_buffer(in, c->body, n);
            c->body_left -= n;
            if (c->body_left == 0)
                c->cst = CHUNK_DATA_END;
            break;
        }
    }
}

/* Parses and answers as many complete requests as the input holds, until one starts a stream. */
static void conn_process(struct conn *c)
{
    const char *err = NULL;
    int rc;

    if (c->hangup_next && c->state == CONN_ST_HEAD &&
        evbuffer_get_length(bufferevent_get_input(c->bev)) > 0) {
        agw_log_debug("conn %" PRIu64 ": hangup=next: closing on the next request", c->id);
        evbuffer_drain(bufferevent_get_input(c->bev),
                       evbuffer_get_length(bufferevent_get_input(c->bev)));
        conn_closing(c);
        return;
    }
    while (c->state == CONN_ST_HEAD || c->state == CONN_ST_BODY) {
        if (c->state == CONN_ST_HEAD) {
            rc = parse_head(c, &err);
            if (rc == AGW_AGAIN)
                return;
            if (rc == 0)
                rc = head_done(c, &err);
            if (rc != 0) {
                c->keep_alive = false;
                send_error(c, rc, err, true);
                return;
            }
            set_state(c, CONN_ST_BODY);
        }
        rc = read_body(c, &err);
        if (rc == AGW_AGAIN)
            return;
        if (rc != 0) {
            c->keep_alive = false;
            send_error(c, rc, err, true);
            return;
        }
        handle_request(c);
    }
}

/* ---- connection callbacks -------------------------------------------------------------------- */

void conn_free(struct conn *c)
{
    struct demo *d = c->d;

    if (c->prev)
        c->prev->next = c->next;
    else
        d->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    d->connections--;
    request_reset(c);
    run_free(c->run);
    /* libevent defers the bufferevent's destruction past its running callback, so this is safe from
     * one */
    bufferevent_free(c->bev);
    event_free(c->timer);
    evbuffer_free(c->wire);
    evbuffer_free(c->body);
    free(c);
}

static void on_read(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;

    if (c->state == CONN_ST_HEAD || c->state == CONN_ST_BODY) {
        conn_process(c);
    } else if (c->state == CONN_ST_CLOSING) {
        struct evbuffer *in = bufferevent_get_input(bev);
        evbuffer_drain(in, evbuffer_get_length(in));
    }
    /* while a response is under way, a pipelined request waits in the input (bounded by
     * IN_MAX_BYTES) */
}

static void on_write(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;

    (void)bev;
    if (evbuffer_get_length(c->wire) > 0) {
        trickle(c);
        return;
    }
    if (c->state == CONN_ST_STREAM && c->run &&
        (c->run->blocked || (c->run->k.delay_ms == 0 && !c->run->stalled && !c->run->waiting)))
        pump(c);
    else if (c->state == CONN_ST_CLOSING && conn_queued(c) == 0)
        conn_free(c);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;

    (void)bev;
    if (c->run) {
        agw_log_info("conn %" PRIu64 ": client went away during run %s (%" PRIu64 " events sent)",
                     c->id, c->run->run_id, c->run->emitted);
        c->d->client_closed++;
        run_end(c);
    } else if (what & BEV_EVENT_TIMEOUT) {
        agw_log_debug("conn %" PRIu64 ": timeout in state %s", c->id, conn_state_names[c->state]);
    }
    conn_free(c);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;

    (void)fd;
    (void)what;
    switch (c->state) {
    case CONN_ST_DELAY:
        start_response(c);
        break;
    case CONN_ST_STREAM:
        pump(c);
        break;
    case CONN_ST_HEAD:
    case CONN_ST_BODY:
        conn_process(c);
        break;
    case CONN_ST_CLOSING:
        if (conn_queued(c) == 0)
            conn_free(c);
        break;
    }
}

void on_accept(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa, int salen,
               void *arg)
{
    struct demo *d = arg;
    struct conn *c;
    struct timeval idle = {IDLE_TIMEOUT_S, 0};
    int one = 1;

    (void)lis;
    (void)sa;
    (void)salen;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c = agw_xcalloc(1, sizeof(*c));
    c->d = d;
    c->id = ++d->next_id;
    c->bev = bufferevent_socket_new(d->base, fd, BEV_OPT_CLOSE_ON_FREE);
    c->timer = evtimer_new(d->base, on_timer, c);
    if (!c->bev || !c->timer) {
        agw_log_error("accept: cannot allocate a connection");
        if (c->bev)
            bufferevent_free(c->bev);
        else
            evutil_closesocket(fd);
        if (c->timer)
            event_free(c->timer);
        free(c);
        return;
    }
    c->wire = evbuffer_new();
    c->body = evbuffer_new();
    c->next = d->conns;
    if (d->conns)
        d->conns->prev = c;
    d->conns = c;
    d->connections++;
    d->accepted++;
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    bufferevent_setwatermark(c->bev, EV_READ, 0, IN_MAX_BYTES);
    bufferevent_setwatermark(c->bev, EV_WRITE, OUT_LOW, 0);
    bufferevent_set_timeouts(c->bev, &idle, NULL);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    agw_log_debug("conn %" PRIu64 ": accepted", c->id);
}
