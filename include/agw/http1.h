/* Small incremental HTTP/1.1 parsers: responses for the upstream side, requests for the server
 * side. Pure: they read from an evbuffer or a memory block, never touch a socket. A head is capped
 * at <max_head> bytes; bodies are delimited by Content-Length, chunked transfer coding (hex size,
 * ";ext", trailers) or, for responses, the connection's close.
 *
 * The request side follows RFC 9112's strict reading, as a server on the public edge must: what
 * would let two parsers disagree about where a request ends is refused (see
 * agw_http1_parse_request_head()). */
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
/* Frees what <p> holds, not <p> itself (a parser made by agw_http1_request_parser_init()), and
 * leaves it unusable until initialised again. NULL is a no-op. */
void agw_http1_parser_clear(struct agw_http1_parser *p);
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

/* ---- requests (the server side) ---- */

/* The longest method a request may name (a longer one is a 400). */
#define AGW_HTTP1_MAX_METHOD 32

struct agw_http1_request_limits {
    size_t max_line;     /* the request line and each field line, line end excluded */
    unsigned max_fields; /* header fields */
    size_t max_body;     /* body bytes: a larger Content-Length or chunk is refused at once */
};

struct agw_http1_request {
    size_t head_len;          /* request line, fields and blank line: the first bytes of <in> */
    enum agw_http1_body body; /* NONE, LENGTH or CHUNKED */
    uint64_t content_length;  /* for AGW_HTTP1_BODY_LENGTH */
    bool expect_continue;     /* "Expect: 100-continue" */
    bool close;               /* "Connection: close" */
    bool head_method;         /* the method is HEAD (an answer carries no body) */
    char method[AGW_HTTP1_MAX_METHOD + 1]; /* the method, as sent (a token: no NUL in it) */
    /* The Origin field's value (the last one): <origin_len> bytes at <origin_at> from the head's
     * start (0: none, or not reached before an error); checked like any value (no control byte). */
    uint32_t origin_at, origin_len;
    /* The head says Transfer-Encoding (chunked): the body is decoded as it comes. */
    bool rewrite;
    uint32_t n_fields; /* header fields */
    /* Errors: the status to answer (400, 413, 414, 417, 431, 501, 505) and why. */
    int status;
    const char *error; /* static text, for the client: "bad request: …" */
};

/* A parser for requests (the server side). <max_head> caps the whole head, and a chunked body's
 * trailer section. */
struct agw_http1_parser *agw_http1_request_parser_new(size_t max_head,
                                                      const struct agw_http1_request_limits *lim);
/* The same parser in <mem>, agw_http1_request_parser_size() bytes aligned as malloc() aligns,
 * which the caller allocated and frees (after agw_http1_parser_clear(); never
 * agw_http1_parser_free()): for a caller that keeps its parsers on a heap of its own. */
size_t agw_http1_request_parser_size(void);
struct agw_http1_parser *agw_http1_request_parser_init(void *mem, size_t max_head,
                                                       const struct agw_http1_request_limits *lim);

/* Looks for a complete request head at the start of <in> (empty lines before it are drained, as
 * RFC 9112 §2.2 allows) and checks it. Returns 0 when it is complete and valid: <req> describes it,
 * and its req->head_len bytes are still at the start of <in> (the caller takes them); the body, if
 * any, follows through agw_http1_parse_body(). AGW_AGAIN when more bytes are needed: every line is
 * checked against the limits as it arrives, so a head over a limit fails as soon as it shows.
 * Otherwise a negative code with req->status and req->error set:
 *   400  malformed request line, bare LF, obs-fold, a field name that is not a token (a space
 *        before the colon), a control byte (NUL, CR) in a value, no Host or several, several
 *        Authorization fields, an invalid or repeated Content-Length, Content-Length together with
 *        Transfer-Encoding, a lowercase or otherwise invalid method
 *   413  Content-Length over max_body
 *   414  a request line over max_line
 *   417  an Expect other than 100-continue
 *   431  a field line over max_line, more than max_fields fields, a head over max_head
 *   501  a Transfer-Encoding other than a single "chunked" (any case, OWS around it)
 *   505  a well-formed version other than HTTP/1.1
 * Errors are sticky until agw_http1_parser_reset(), which also readies the parser for the next
 * request once a body is complete. For request parsers, agw_http1_parse_body() requires CRLF
 * after chunk data and refuses (-AGW_ETOOBIG, agw_http1_body_over_limit() true) a chunk that would
 * take the body past max_body, as soon as its size line arrives. */
int agw_http1_parse_request_head(struct agw_http1_parser *p, struct evbuffer *in,
                                 struct agw_http1_request *req);

/* True when the last -AGW_ETOOBIG of agw_http1_parse_body() was the body limit (413), not an
 * over-long chunk line or trailer section (400). */
bool agw_http1_body_over_limit(const struct agw_http1_parser *p);

/* One field of a request head, as agw_http1_request_fields() splits it: its name and its value
 * without the OWS around it, each a NUL-terminated string within the head. */
struct agw_http1_field {
    const char *name, *value;
    uint32_t name_len, value_len;
};

/* Splits the head of a request that agw_http1_parse_request_head() accepted (<head>, its
 * req->head_len bytes, a copy the caller owns) in place: each field's name and value become
 * NUL-terminated strings (the colon and the byte after the value are overwritten). Writes the
 * fields in order into <f> (req->n_fields of them; <max> at most) and returns how many. */
size_t agw_http1_request_fields(char *head, size_t head_len, struct agw_http1_field *f, size_t max);

#endif
