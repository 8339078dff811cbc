/* A small incremental HTTP/1.1 response parser for the upstream side. Pure: reads from an evbuffer,
 * never touches a socket. Status line and headers are capped at <max_head> bytes; bodies are
 * delimited by Content-Length, chunked transfer coding (hex size, ";ext", trailers) or the
 * connection's close. */
#ifndef AGW_HTTP1_H
#define AGW_HTTP1_H

#include "agw/common.h"

struct evbuffer;
struct agw_http1_parser;

enum agw_http1_body {
    AGW_HTTP1_BODY_NONE = 0, /* 1xx/204/304 or HEAD: no body */
    AGW_HTTP1_BODY_LENGTH,   /* Content-Length */
    AGW_HTTP1_BODY_CHUNKED,  /* Transfer-Encoding: chunked */
    AGW_HTTP1_BODY_CLOSE,    /* read until the connection closes */
};

struct agw_http1_response {
    int status;         /* 100..599 */
    int minor_version;  /* HTTP/1.<minor> */
    char *content_type; /* owned, NULL when absent */
    enum agw_http1_body body;
    uint64_t content_length; /* for AGW_HTTP1_BODY_LENGTH */
    bool keep_alive;         /* the connection may be reused after the body */
};

/* Owned by the caller. <max_head>: ceiling for status line + headers (and for one chunk-size line).
 */
struct agw_http1_parser *agw_http1_parser_new(size_t max_head);
void agw_http1_parser_free(struct agw_http1_parser *p);
/* Forget everything (before the next response on a kept-alive connection). */
void agw_http1_parser_reset(struct agw_http1_parser *p);

/* Consumes the response head from <in>. Returns 0 when it is complete (<resp> filled, the head
 * drained from <in>), AGW_AGAIN when more bytes are needed, -AGW_ETOOBIG over max_head, -AGW_EPROTO
 * when malformed. Interim 1xx responses are skipped. <resp> owns its strings:
 * agw_http1_response_clear(). */
int agw_http1_parse_head(struct agw_http1_parser *p, struct evbuffer *in,
                         struct agw_http1_response *resp);
void agw_http1_response_clear(struct agw_http1_response *resp);

/* Moves decoded body bytes from <in> to <out> (moved, not copied, where the framing allows).
 * Returns 1 when the body is complete, 0 when more bytes are needed, -AGW_EPROTO on bad chunk
 * framing, -AGW_ETOOBIG on an over-long chunk-size line. Bytes after the end of the body stay in
 * <in>. */
int agw_http1_parse_body(struct agw_http1_parser *p, struct evbuffer *in, struct evbuffer *out);

/* The connection closed. Returns 1 when that completes the body (close-delimited), -AGW_EPROTO when
 * the body was cut short. */
int agw_http1_parse_eof(struct agw_http1_parser *p);

#endif
