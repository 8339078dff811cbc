/* The agent's HTTP/1.1 server, on raw bufferevents (doc/demo-agent.md, "HTTP and resource
 * behaviour"). It accepts connections, parses requests (request line, header fields, a
 * Content-Length or chunked body; over a limit or malformed: 400, 413, 414, 431, 501 or 505, and
 * the connection closes) and hands each complete request to handle_request() (requests.h), one at a
 * time per connection: pipelined requests wait in the input. Whole responses are queued by
 * send_response() and its wrappers; a streamed response is written by stream.c through
 * conn_send*(), which honour the bytewise knob (one byte per write).
 *
 * A connection moves through head -> body -> (delay -> stream ->) head, or to closing. Its one
 * timer serves the current state: the first-byte delay and the pacing (stream.c), a pipelined
 * request parsed from the loop, the close.
 *
 * Lifetime: a struct conn is on the struct demo's list from on_accept() until conn_free(), which
 * runs only at the top of a bufferevent or timer callback (never from a nested helper) or at exit:
 * a helper that wants the connection gone calls conn_closing(), and the next callback frees it once
 * its output is flushed. The connection owns its request (method, target, headers, body, until the
 * response is queued) and its run (c->run, until run_end(), stream.h). */
#ifndef DEMO_HTTP_H
#define DEMO_HTTP_H

#include <jansson.h>

#include <event2/util.h>

#include "agw/common.h"

struct bufferevent;
struct event;
struct evbuffer;
struct evconnlistener;
struct sockaddr;
struct run;

/* Backpressure: a producer stops when this many bytes are queued for the client; the write
 * callback resumes it once fewer than OUT_LOW are. */
#define OUT_HIGH (64 * 1024) /* stop producing events above this many queued output bytes */
#define OUT_LOW  (16 * 1024) /* the write callback resumes production below this */

enum conn_state {
    CONN_ST_HEAD,    /* reading a request head (or idle between keep-alive requests) */
    CONN_ST_BODY,    /* reading its body */
    CONN_ST_DELAY,   /* run accepted, waiting first_byte_delay_ms before answering */
    CONN_ST_STREAM,  /* producing the response */
    CONN_ST_CLOSING, /* flushing the last bytes, then freed */
};

enum chunk_state { CHUNK_SIZE, CHUNK_DATA, CHUNK_DATA_END, CHUNK_TRAILER };

struct header {
    char *name; /* lowercased */
    char *value;
};

struct demo;

struct conn {
    struct demo *d;
    struct conn *prev, *next;
    uint64_t id;
    enum conn_state state;
    struct bufferevent *bev;
    struct event *timer; /* the current state's timer: delay, pacing, continuation or close */
    /* the request being read */
    char *method;
    char *target;
    int minor; /* HTTP/1.<minor> */
    struct header *hdrs;
    size_t nhdrs;
    size_t head_bytes;
    bool line_seen; /* the request line was parsed */
    bool keep_alive;
    bool chunked;
    enum chunk_state cst;
    uint64_t body_left; /* Content-Length bytes, or bytes left of the current chunk */
    struct evbuffer *body;
    /* the response */
    struct run *run;
    struct evbuffer
        *wire; /* bytewise: response bytes not yet handed to the socket, one per write */
    bool bytewise;
    bool hangup_next; /* hangup=next: close, unanswered, when the next request arrives */
};

/* Bytes queued for the client: the socket's output and, with bytewise, the bytes not yet handed to
 * it. */
size_t conn_queued(const struct conn *c);
/* Queues <src>'s bytes (drained) for the client, one byte per write with bytewise. */
void conn_send_buffer(struct conn *c, struct evbuffer *src);
void conn_send(struct conn *c, const void *data, size_t len);
/* write_each: hands <src> to the socket at once, in one write system call of its own, when nothing
 * is queued before it (not with bytewise); what the socket did not take, or all of it when output
 * is queued, goes to the output like conn_send_buffer(). <src> ends drained. Returns true when the
 * socket took all of it. */
bool conn_write_now(struct conn *c, struct evbuffer *src);
void set_state(struct conn *c, enum conn_state st);
/* (Re)arms the connection's timer: on_timer acts on the state then current. 0 = from the loop. */
void arm_timer(struct conn *c, uint64_t ms);
/* Ends the connection once its output is flushed (within 30 s). */
void conn_closing(struct conn *c);
/* The response is queued: the connection waits for the next request (keep-alive, and not <close>)
 * or closes. */
void response_done(struct conn *c, bool close);
/* Queues a whole response with Content-Length (no body for HEAD) and ends it (response_done).
 * <extra> is a block of header lines, or "". */
void send_response(struct conn *c, int status, const char *ctype, const char *body, size_t len,
                   const char *extra, bool close);
/* send_response() with <body> compact, as application/json. Takes the reference to <body>. */
void send_json(struct conn *c, int status, json_t *body, const char *extra, bool close);
/* send_json() of {"error": <msg>}, logged. */
void send_error(struct conn *c, int status, const char *msg, bool close);
/* Unlinks and frees the connection, its request and its run (not counted out: the caller does). */
void conn_free(struct conn *c);
/* The listener's accept callback; <arg> is the struct demo. */
void on_accept(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa, int salen,
               void *arg);

#endif
