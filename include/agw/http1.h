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
    AGW_HTTP1_BODY_NONE = 0, /* 204/304: no body (1xx heads are skipped; no HEAD is sent) */
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

/* Owned by the caller. <max_head> (> 0): ceiling for status line + headers, and for a chunked
 * body's trailer section; a chunk-size line is capped at 1024 bytes. */
struct agw_http1_parser *agw_http1_parser_new(size_t max_head);
void agw_http1_parser_free(struct agw_http1_parser *p);
/* Forget everything (before the next response on a kept-alive connection, or to leave the error
 * state). */
void agw_http1_parser_reset(struct agw_http1_parser *p);

/* Consumes the response head from <in>. Returns 0 when it is complete (<resp> filled, the head
 * drained from <in>), AGW_AGAIN when more bytes are needed, -AGW_ETOOBIG over max_head, -AGW_EPROTO
 * when malformed. Interim 1xx responses are skipped (101, or more than 32 of them, are
 * -AGW_EPROTO). <resp> is overwritten, not freed, and owns its strings afterwards:
 * agw_http1_response_clear(). Until it returns 0, <in> may only grow at its end between calls (the
 * parser remembers how far it has looked). Called after a complete body, it starts the next
 * response. Errors are sticky: later parse_head()/parse_body() calls return the same code until a
 * reset. */
int agw_http1_parse_head(struct agw_http1_parser *p, struct evbuffer *in,
                         struct agw_http1_response *resp);
void agw_http1_response_clear(struct agw_http1_response *resp);

/* Moves decoded body bytes from <in> to <out> (moved, not copied, where the framing allows).
 * Returns 1 when the body is complete, 0 when more bytes are needed, -AGW_EPROTO on bad chunk
 * framing, -AGW_ETOOBIG on an over-long chunk-size line or trailer section. Bytes after the end of
 * the body stay in <in>. Only after parse_head() returned 0. */
int agw_http1_parse_body(struct agw_http1_parser *p, struct evbuffer *in, struct evbuffer *out);

/* The same for a memory block, decoded in place: the body bytes among the <len> bytes of <buf> are
 * moved to its front (*<body_len> of them, maybe 0). *<used> is the number of bytes of <buf> that
 * belonged to the response: all of them unless the body ended inside the block (then the rest
 * follows the response). Returns as agw_http1_parse_body(). Blocks of one response may be mixed
 * with agw_http1_parse_body() calls; lines cut between blocks are kept by the parser. */
int agw_http1_decode_body(struct agw_http1_parser *p, char *buf, size_t len, size_t *used,
                          size_t *body_len);

/* The connection closed. Returns 1 when the body is complete (or close-delimited, which the close
 * completes), -AGW_EPROTO when the head or the body was cut short. */
int agw_http1_parse_eof(struct agw_http1_parser *p);

#endif
