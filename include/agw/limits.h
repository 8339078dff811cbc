/* Ceilings that more than one module relies on, each defined here once. A module's own limits
 * (a parser's line length, a pool's idle count) stay in that module. */
#ifndef AGW_LIMITS_H
#define AGW_LIMITS_H

#define AGW_MAX_LISTENERS           16    /* listen[] entries (the admin listener comes on top) */
#define AGW_MAX_WORKERS             64    /* event loops ("workers") */
#define AGW_MAX_BATCH_WINDOW_US     10000 /* "batch_window_us" */
#define AGW_DEFAULT_BATCH_WINDOW_US 100
#define AGW_MAX_UPSTREAMS           64 /* upstream URLs of one agent */
#define AGW_MAX_UPSTREAM_HEADERS    64 /* headers of one upstream request, all sources together */
/* A client's request line, and each of its header field lines, line end excluded: longer ones are
 * refused with 414 and 431 (as nginx's default large_client_header_buffers does). */
#define AGW_MAX_REQUEST_LINE 8192
/* Thread history: a change is committed within this (so a kill -9 loses at most that much), and
 * records waiting for the store past this many bytes are dropped rather than blocking a loop. */
#define AGW_STORE_COMMIT_MS       200
#define AGW_STORE_MAX_QUEUE_BYTES (256u * 1024 * 1024)
/* Records handed to the store and not yet applied past which runs that record stop reading their
 * upstreams until it is back under a quarter of it (agw_store_congested()). */
#define AGW_STORE_CONGESTED_BYTES (8u * 1024 * 1024)

#endif
