/* One run: the client's streaming response ↔ one upstream exchange (doc/protocol.md#relaying).
 * Explicit states:
 *   CONNECTING  the upstream is being reached; the client has no answer yet (errors → 502/504 JSON;
 *               failures before the first byte are retried on the next backend)
 *   STREAMING   200 text/event-stream sent; upstream frames are parsed (sse), normalised (agui) and
 *               written; backpressure pauses the upstream while the client's queue is above the
 *               limit. The run is in the active-run registry (runs.h) while it streams.
 *   FINISHING   the terminal event is written and the chunked body ended; waiting for the client
 *               to take it
 *   CLOSED      the client's request is gone
 * A run ends when the client's request is gone (normal end or disconnect): the upstream is closed
 * at once, the on_end callback reports the summary, and the relay is freed. A *detached* run (the
 * agent's on_client_disconnect = "detach") outlives its client: it goes on reading the upstream to
 * the run's end (events are normalised and counted, then dropped) and frees itself there.
 *
 * Ownership: relays belong to their struct agw_relay_set (one per event loop). */
#ifndef AGW_RELAY_H
#define AGW_RELAY_H

#include "agw/common.h"
#include "agw/config.h"
#include "agw/http_server.h"
#include "agw/runs.h"
#include "agw/store.h"
#include "agw/upstream.h"

struct agw_relay;
struct agw_relay_set;

struct agw_relay_summary {
    const char *request_id;
    const char *agent_id;
    const char *thread_id;
    const char *run_id;
    int status;      /* HTTP status sent to the client (0: none, the client left first) */
    uint64_t events; /* events written to the client */
    uint64_t bytes;  /* body bytes written to the client */
    uint64_t duration_ms;
    const char *upstream; /* authority of the last backend tried, or NULL */
    const char
        *outcome; /* "RUN_FINISHED", "RUN_ERROR:<code>", "client_closed", "upstream_error", … */
    enum agw_up_failure upstream_error; /* the last upstream failure, or AGW_UP_OK */
    /* The last backend attempt's connect and first-byte times in µs (AGW_UP_NOT_MEASURED: a reused
     * connection has no connect; no byte came, or no backend was tried) */
    uint64_t connect_us, first_byte_us;
    bool detached; /* the client left and the run went on without it */
};

typedef void agw_relay_end_fn(void *arg, const struct agw_relay_summary *s);
/* What became of an attempt on backends[<attempt>]: <answered> (a head under 500), or not (it
 * could not be reached, did not answer in time, answered 5xx or a head that cannot be read). */
typedef void agw_relay_backend_fn(void *arg, size_t attempt, bool answered);

struct agw_relay_params {
    struct agw_req *req;
    const char *agent_id;
    const char *thread_id;
    const char *run_id;
    enum agw_protocol protocol;
    struct agw_upstream_pool *const *backends; /* in the order to try them; copied */
    size_t n_backends;
    unsigned retries;                          /* extra backends to try before the first byte */
    const struct agw_upstream_header *headers; /* upstream request headers; copied */
    size_t n_headers;
    const char *body; /* the client's body, forwarded byte for byte; copied */
    size_t body_len;
    size_t stream_buffer_bytes;
    size_t max_frame_bytes;
    uint32_t heartbeat_ms; /* 0 = none */
    uint32_t run_ms;       /* 0 = unlimited */
    struct agw_runs *runs; /* the active-run registry the run joins while it streams; or NULL */
    unsigned runs_part;    /* its part there: the loop's (include/agw/runs.h) */
    bool detach;           /* the run goes on when the client disconnects */
    bool legacy_client;    /* the client reads legacy AG-Kit events (agw_agkit_to_legacy) */
    /* thread history: the events the client gets (or would get, detached) go there, to the run's
     * end; NULL = none */
    struct agw_store *store;
    agw_relay_end_fn *on_end;
    agw_relay_backend_fn *on_backend; /* or NULL */
    void *arg;
};

struct agw_relay_set *agw_relay_set_new(struct event_base *base);
/* Relays still attached to a client must have ended (free the server first); detached runs still
 * going are closed here, their on_end reporting outcome "closed". */
void agw_relay_set_free(struct agw_relay_set *set);
size_t agw_relay_set_count(const struct agw_relay_set *set);
/* Runs of the set holding a capture for thread history (events kept and not yet handed to the
 * store, or handed over less than a tick of the capture's age timer ago); from the set's loop. */
size_t agw_relay_set_captures(const struct agw_relay_set *set);
/* Ends every running stream with RUN_ERROR {code:"SHUTDOWN"} and fails runs still connecting with
 * 503. */
void agw_relay_set_shutdown(struct agw_relay_set *set);

/* Starts a run. Everything is reported through the client's response and <on_end>. */
struct agw_relay *agw_relay_start(struct agw_relay_set *set, const struct agw_relay_params *p);
/* Starts a run on an exchange that is already under way: its response head <resp> (2xx, an event
 * stream) has just arrived, and the caller — inside that exchange's on_head — hands it over (a
 * decision the backend answered by starting a new run). <p> names the exchange's backend as its
 * only one. The client's 200 waits for the first event: an empty stream, or a failure before any
 * event, is answered with 502 instead. Everything is then reported as for agw_relay_start(). */
struct agw_relay *agw_relay_adopt(struct agw_relay_set *set, const struct agw_relay_params *p,
                                  struct agw_upstream *up, const struct agw_http1_response *resp);
/* Cancels a streaming run (its registry entry's owner): the upstream connection is closed at once
 * and the client's stream ends with RUN_ERROR {code:"CANCELLED"}. The relay may be freed before
 * this returns (a detached run). */
void agw_relay_cancel(struct agw_relay *r);

#endif
