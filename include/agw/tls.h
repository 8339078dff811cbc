/* TLS contexts: the only module that builds OpenSSL SSL_CTXs (doc/security.md).
 *
 * Server side, per listener: TLS 1.2 minimum (1.3 preferred), AEAD ciphers with forward secrecy
 * only, ALPN "http/1.1", SNI choosing among several certificates, session resumption (cache and
 * tickets), optional client certificate verification. Client side (https upstreams): peer
 * verification against the system store or a CA file; SNI and host name checks are set per
 * connection by agw_tls_client_prepare().
 *
 * Ownership: the SSL_CTX returned is the caller's reference (SSL_CTX_free() it). The extra SNI
 * contexts hang off the default one and are freed with it, so a context replaced on reload lives
 * exactly as long as the connections that still use it. */
#ifndef AGW_TLS_H
#define AGW_TLS_H

#include <openssl/ssl.h>

#include "agw/config.h"

/* Builds a listener's context from <tls> (cert, key, extra certificates, client CA). Returns NULL
 * with
 * "<key path>: <reason>" in <err>, e.g. "listen[1].tls.key: cannot load 'k.pem': No such file or
 * directory". <path> is the listener's key path for messages ("listen[1].tls"). */
SSL_CTX *agw_tls_server_ctx_new(const struct agw_tls_config *tls, const char *path, char *err,
                                size_t errlen);

/* A client context for https upstreams: <ca_file> NULL = the system trust store. */
SSL_CTX *agw_tls_client_ctx_new(const char *ca_file, char *err, size_t errlen);

/* Sets SNI (for names) and host name or IP address verification on a new client SSL. Returns 0 or
 * -AGW_EINVAL. */
int agw_tls_client_prepare(SSL *ssl, const char *host);

/* A short reason for a failed handshake on <ssl> (verification result first, then the OpenSSL error
 * queue, which it clears). */
void agw_tls_error(SSL *ssl, unsigned long err_code, char *out, size_t len);

#endif
