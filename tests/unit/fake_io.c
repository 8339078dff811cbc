/* Fakes of src/http_server.c and src/upstream.c for the relay's unit tests: see fake_io.h. */
#include <criterion/criterion.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_io.h"

struct agw_upstream *fake_ups[FAKE_MAX_UPSTREAMS];
int fake_n_ups;
int fake_in_upstream_cb;
int fake_in_nested_close;
int fake_prefetches;
int fake_direct_writes;

/* ---- the server side ---------------------------------------------------------------------- */

struct agw_req *fake_req_new(void)
{
    static int n;
    struct agw_req *req = calloc(1, sizeof(*req));

    snprintf(req->id, sizeof(req->id), "req-%d", ++n);
    req->body = evbuffer_new();
    return req;
}

void fake_req_free(struct agw_req *req)
{
    evbuffer_free(req->body);
    free(req);
}

void fake_req_close(struct agw_req *req)
{
    agw_req_event_fn *fn = req->on_close;

    cr_assert(!req->gone, "the request closed twice");
    req->gone = true;
    req->on_close = req->on_drain = req->on_half_close = NULL;
    if (fn != NULL)
        fn(req, req->arg);
}

void fake_req_drain(struct agw_req *req)
{
    if (req->on_drain != NULL && !req->gone)
        req->on_drain(req, req->arg);
}

void fake_req_half_close(struct agw_req *req)
{
    req->half_closed = true;
    if (req->on_half_close != NULL)
        req->on_half_close(req, req->arg);
}

const char *agw_req_id(const struct agw_req *req)
{
    return req->id;
}

void agw_req_on_close(struct agw_req *req, agw_req_event_fn *on_close, void *arg)
{
    req->on_close = on_close;
    req->arg = arg;
}

void agw_req_on_half_close(struct agw_req *req, agw_req_event_fn *on_half_close)
{
    req->on_half_close = on_half_close;
}

bool agw_req_half_closed(const struct agw_req *req)
{
    return req->half_closed;
}

void agw_req_add_header(struct agw_req *req, const char *name, const char *value)
{
    cr_assert(!req->gone && req->status == 0, "a header after the answer started");
    (void)name;
    (void)value;
}

void agw_req_stream_start(struct agw_req *req, int status, const char *fields, size_t low_watermark,
                          agw_req_event_fn *on_drain)
{
    (void)fields;
    (void)low_watermark;
    cr_assert(!req->gone && req->status == 0, "stream_start on an answered request");
    req->status = status;
    req->streaming = true;
    req->on_drain = on_drain;
}

static void written(struct agw_req *req)
{
    if (req->close_on_write > 0 && ++req->writes == req->close_on_write) {
        /* The write found the client gone: the server ends the request at once, from inside the
         * relay's own call (a nested close). */
        fake_in_nested_close++;
        fake_req_close(req);
        fake_in_nested_close--;
    }
}

void agw_req_stream_write(struct agw_req *req, struct evbuffer *buf)
{
    cr_assert(!req->gone && req->streaming && !req->finished, "a write after the end");
    evbuffer_add_buffer(req->body, buf);
    written(req);
}

void agw_req_stream_write_bytes(struct agw_req *req, const char *p, size_t n)
{
    cr_assert(!req->gone && req->streaming && !req->finished, "a write after the end");
    evbuffer_add(req->body, p, n);
    fake_direct_writes++;
    written(req);
}

/* The hints read the request (agw_req_prefetch_output() its output's address): a relay must give
 * them only a request it still holds. */
void agw_req_prefetch(const struct agw_req *req)
{
    cr_assert(!req->gone, "a hint for a request that is gone");
    fake_prefetches++;
}

void agw_req_prefetch_output(const struct agw_req *req)
{
    cr_assert(!req->gone, "a hint for a request that is gone");
    fake_prefetches++;
}

void agw_req_stream_finish(struct agw_req *req, struct evbuffer *buf)
{
    cr_assert(!req->gone && req->streaming && !req->finished, "finished twice");
    evbuffer_add_buffer(req->body, buf);
    req->finished = true;
}

size_t agw_req_out_pending(const struct agw_req *req)
{
    return req->pending;
}

void agw_req_reply_error(struct agw_req *req, int status, const char *fmt, ...)
{
    va_list ap;

    cr_assert(!req->gone && req->status == 0, "an error answer after the answer started");
    req->status = status;
    va_start(ap, fmt);
    vsnprintf(req->error, sizeof(req->error), fmt, ap);
    va_end(ap);
    req->finished = true;
}

/* ---- the upstream side -------------------------------------------------------------------- */

void fake_pool_init(struct agw_upstream_pool *pool, const char *url)
{
    char err[128];

    cr_assert_eq(agw_url_parse(url, &pool->url, err, sizeof(err)), 0, "%s", err);
}

void fake_pool_clear(struct agw_upstream_pool *pool)
{
    agw_url_clear(&pool->url);
}

const struct agw_url *agw_upstream_pool_url(const struct agw_upstream_pool *pool)
{
    return &pool->url;
}

const char *agw_up_failure_name(enum agw_up_failure f)
{
    return f == AGW_UP_OK ? "" : "failure";
}

struct agw_upstream *agw_upstream_start(struct agw_upstream_pool *pool,
                                        const struct agw_upstream_header *headers, size_t n_headers,
                                        const char *body, size_t body_len,
                                        const struct agw_upstream_callbacks *cbs, void *arg)
{
    struct agw_upstream *up = calloc(1, sizeof(*up));

    (void)headers;
    (void)n_headers;
    cr_assert_lt(fake_n_ups, FAKE_MAX_UPSTREAMS);
    up->pool = pool;
    up->cbs = *cbs;
    up->arg = arg;
    up->body = agw_xstrndup(body, body_len);
    fake_ups[fake_n_ups++] = up;
    return up;
}

void agw_upstream_set_callbacks(struct agw_upstream *up, const struct agw_upstream_callbacks *cbs,
                                void *arg)
{
    up->cbs = *cbs;
    up->arg = arg;
}

void agw_upstream_set_flowing(struct agw_upstream *up)
{
    up->flowing = true;
}

void agw_upstream_pause(struct agw_upstream *up)
{
    up->paused = true;
}

void agw_upstream_resume(struct agw_upstream *up)
{
    up->paused = false;
}

void agw_upstream_close(struct agw_upstream *up)
{
    if (up == NULL)
        return;
    cr_assert(!up->closed && !up->released, "the exchange ended twice");
    up->closed = true;
}

void agw_upstream_release(struct agw_upstream *up)
{
    if (up == NULL)
        return;
    cr_assert(!up->closed && !up->released, "the exchange ended twice");
    up->released = true;
}

uint64_t agw_upstream_connect_us(const struct agw_upstream *up)
{
    (void)up;
    return 1;
}

uint64_t agw_upstream_first_byte_us(const struct agw_upstream *up)
{
    (void)up;
    return 2;
}

/* An ended exchange delivers nothing more (the real one guarantees it). */
static bool live(const struct agw_upstream *up)
{
    return !up->closed && !up->released;
}

void fake_up_head(struct agw_upstream *up, int status, const char *content_type)
{
    struct agw_http1_response resp = {.status = status,
                                      .minor_version = 1,
                                      .content_type = (char *)(uintptr_t)content_type,
                                      .body = AGW_HTTP1_BODY_CHUNKED,
                                      .keep_alive = true};

    cr_assert(live(up), "driving an ended exchange");
    fake_in_upstream_cb++;
    up->cbs.on_head(up->arg, &resp);
    fake_in_upstream_cb--;
}

/* Body bytes are given through on_bytes() and on_body() in turn when the callee has both, as a
 * plain TCP connection's reads and a TLS one's come. */
unsigned fake_body_turn;

void fake_up_body(struct agw_upstream *up, const char *bytes)
{
    unsigned turn = fake_body_turn++;
    struct evbuffer *b;

    if (!live(up)) /* the real exchange reads no more once closed */
        return;
    fake_in_upstream_cb++;
    if (up->cbs.on_readable != NULL) /* as a plain TCP connection's read does */
        up->cbs.on_readable(up->arg);
    if (up->cbs.on_bytes != NULL && turn % 2 == 0) {
        size_t n = strlen(bytes);
        char *copy = malloc(n + 1); /* valid during the call only: poisoned after it */

        cr_assert_not_null(copy);
        memcpy(copy, bytes, n + 1);

        up->cbs.on_bytes(up->arg, copy, n);
        memset(copy, 0xdb, n);
        free(copy);
    } else {
        b = evbuffer_new();
        evbuffer_add(b, bytes, strlen(bytes));
        up->cbs.on_body(up->arg, b);
        evbuffer_free(b);
    }
    fake_in_upstream_cb--;
}

void fake_up_done(struct agw_upstream *up)
{
    if (!live(up))
        return;
    fake_in_upstream_cb++;
    up->cbs.on_done(up->arg);
    fake_in_upstream_cb--;
}

void fake_up_error(struct agw_upstream *up, enum agw_up_failure kind)
{
    if (!live(up))
        return;
    fake_in_upstream_cb++;
    up->cbs.on_error(up->arg, kind, "fake failure");
    fake_in_upstream_cb--;
}

void fake_reset(void)
{
    for (int i = 0; i < fake_n_ups; i++) {
        free(fake_ups[i]->body);
        free(fake_ups[i]);
        fake_ups[i] = NULL;
    }
    fake_n_ups = 0;
    fake_in_upstream_cb = 0;
    fake_in_nested_close = 0;
}
