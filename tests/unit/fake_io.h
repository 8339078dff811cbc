/* Fakes of the server and upstream modules for tests/unit/test_relay.c: the relay is linked with
 * these instead of src/http_server.c and src/upstream.c (a link-time seam), so that a test plays
 * the client and the backend by hand, call by call. */
#ifndef AGW_TEST_FAKE_IO_H
#define AGW_TEST_FAKE_IO_H

#include <event2/buffer.h>

#include "agw/http_server.h"
#include "agw/upstream.h"

/* The client's side of one request. */
struct agw_req {
    char id[32];
    int status;            /* 0, 200 for a stream, or an error's status */
    char error[512];       /* an error answer's body */
    struct evbuffer *body; /* stream bytes written, unchunked */
    bool streaming, finished;
    size_t pending; /* what agw_req_out_pending() answers */
    bool half_closed;
    agw_req_event_fn *on_close, *on_drain, *on_half_close;
    void *arg;
    int close_on_write; /* > 0: the Nth write finds the client gone (its close runs at once) */
    int writes;
    bool gone; /* on_close has run */
};

struct agw_upstream_pool {
    struct agw_url url;
};

/* One exchange the relay started. */
struct agw_upstream {
    struct agw_upstream_pool *pool;
    struct agw_upstream_callbacks cbs;
    void *arg;
    char *body; /* the request body sent */
    bool closed, released, paused;
    bool flowing; /* agw_upstream_set_flowing() was called */
};

#define FAKE_MAX_UPSTREAMS 16
extern struct agw_upstream *fake_ups[FAKE_MAX_UPSTREAMS];
extern int fake_n_ups;
/* Depth of upstream callbacks the test is running into the relay. */
extern int fake_in_upstream_cb;
/* Depth of a client close the fake server runs from inside one of the relay's calls (a write that
 * finds the client gone): the relay must not be freed there, only as its own callback unwinds. */
extern int fake_in_nested_close;
/* Hints the relay gave about its request (agw_req_prefetch(), agw_req_prefetch_output()). */
extern int fake_prefetches;
/* Writes of bytes the relay handed from where it read them (agw_req_stream_write_bytes()). */
extern int fake_direct_writes;
/* fake_up_body() hands its reads by bytes (on_bytes) when this is even, else by evbuffer (on_body);
 * each read adds one. */
extern unsigned fake_body_turn;

struct agw_req *fake_req_new(void);
void fake_req_free(struct agw_req *req);
/* The client goes away, or its answer was taken: the close callback runs. */
void fake_req_close(struct agw_req *req);
/* The output drained below the watermark. */
void fake_req_drain(struct agw_req *req);
void fake_req_half_close(struct agw_req *req);

void fake_pool_init(struct agw_upstream_pool *pool, const char *url);
void fake_pool_clear(struct agw_upstream_pool *pool);

/* Drive the last (or a given) exchange: each call runs one callback into the relay. */
void fake_up_head(struct agw_upstream *up, int status, const char *content_type);
void fake_up_body(struct agw_upstream *up, const char *bytes);
void fake_up_done(struct agw_upstream *up);
void fake_up_error(struct agw_upstream *up, enum agw_up_failure kind);
void fake_reset(void);

#endif
