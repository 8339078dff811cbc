/* TLS contexts (see include/agw/tls.h): the only file that builds SSL_CTXs. */
#include "config.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "agw/log.h"
#include "agw/tls.h"

/* TLS 1.2: ECDHE or DHE key exchange with AEAD ciphers only. TLS 1.3 suites are all AEAD. */
static const char tls12_ciphers[] = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
                                    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
                                    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:"
                                    "DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384";
static const char tls13_suites[] =
    "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";

/* The SNI contexts of a default context, freed with it (ex_data free callback). */
struct sni_set {
    SSL_CTX **ctx;
    size_t n;
};

static int sni_index = -1;

static void sni_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp)
{
    struct sni_set *set = ptr;

    (void)parent;
    (void)ad;
    (void)idx;
    (void)argl;
    (void)argp;
    if (set == NULL)
        return;
    for (size_t i = 0; i < set->n; i++)
        SSL_CTX_free(set->ctx[i]);
    free(set->ctx);
    free(set);
}

static void openssl_reason(char *out, size_t len)
{
    unsigned long e = ERR_get_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;

    snprintf(out, len, "%s", r ? r : "unknown error");
    ERR_clear_error();
}

/* Selects the certificate whose names match the client's SNI name; unknown names keep the default
 * one. */
static int servername_cb(SSL *ssl, int *alert, void *arg)
{
    const char *name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
    struct sni_set *set = arg;

    (void)alert;
    if (name == NULL || set == NULL)
        return SSL_TLSEXT_ERR_OK;
    if (X509_check_host(SSL_CTX_get0_certificate(SSL_get_SSL_CTX(ssl)), name, 0, 0, NULL) == 1)
        return SSL_TLSEXT_ERR_OK;
    for (size_t i = 0; i < set->n; i++) {
        if (X509_check_host(SSL_CTX_get0_certificate(set->ctx[i]), name, 0, 0, NULL) == 1) {
            SSL_set_SSL_CTX(ssl, set->ctx[i]);
            return SSL_TLSEXT_ERR_OK;
        }
    }
    return SSL_TLSEXT_ERR_OK;
}

/* ALPN: HTTP/1.1 is what this server speaks; a client that offers only other protocols is refused
 * with no_application_protocol (RFC 7301) rather than answered in a protocol it did not ask for. */
static int alpn_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                   const unsigned char *in, unsigned int inlen, void *arg)
{
    static const unsigned char h11[] = "\x08http/1.1";

    (void)ssl;
    (void)arg;
    if (SSL_select_next_proto((unsigned char **)(uintptr_t)out, outlen, h11, sizeof(h11) - 1, in,
                              inlen) == OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_OK;
    return SSL_TLSEXT_ERR_ALERT_FATAL;
}

static SSL_CTX *base_ctx(const SSL_METHOD *method, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(method);

    if (ctx == NULL) {
        snprintf(err, errlen, "cannot create a TLS context");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                                 SSL_OP_CIPHER_SERVER_PREFERENCE);
    /* Idle connections give their read/write buffers back: most streams are idle most of the time.
     */
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    if (SSL_CTX_set_cipher_list(ctx, tls12_ciphers) != 1 ||
        SSL_CTX_set_ciphersuites(ctx, tls13_suites) != 1) {
        SSL_CTX_free(ctx);
        snprintf(err, errlen, "cannot set the cipher list");
        return NULL;
    }
    return ctx;
}

static SSL_CTX *server_ctx(const char *cert, const char *key, const char *path, char *err,
                           size_t errlen)
{
    char why[160];
    SSL_CTX *ctx = base_ctx(TLS_server_method(), err, errlen);

    if (ctx == NULL)
        return NULL;
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        openssl_reason(why, sizeof(why));
        snprintf(err, errlen, "%s.cert: cannot load '%s': %s", path, cert, why);
        goto err;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        openssl_reason(why, sizeof(why));
        snprintf(err, errlen, "%s.key: cannot load '%s': %s", path, key, why);
        goto err;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        ERR_clear_error();
        snprintf(err, errlen, "%s.key: '%s' does not match the certificate '%s'", path, key, cert);
        goto err;
    }
    SSL_CTX_set_alpn_select_cb(ctx, alpn_cb, NULL);
    /* Session resumption: the server-side cache (TLS 1.2 session ids) and tickets (both versions).
     */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
    SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"agui-gateway", 12);
    return ctx;
err:
    SSL_CTX_free(ctx);
    return NULL;
}

SSL_CTX *agw_tls_server_ctx_new(const struct agw_tls_config *tls, const char *path, char *err,
                                size_t errlen)
{
    SSL_CTX *ctx = server_ctx(tls->cert, tls->key, path, err, errlen);
    struct sni_set *set = NULL;
    char p[128];

    if (ctx == NULL)
        return NULL;
    if (tls->client_ca != NULL && tls->verify != AGW_TLS_VERIFY_NONE) {
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(tls->client_ca);
        if (names == NULL || SSL_CTX_load_verify_locations(ctx, tls->client_ca, NULL) != 1) {
            char why[160];
            sk_X509_NAME_pop_free(names, X509_NAME_free);
            openssl_reason(why, sizeof(why));
            snprintf(err, errlen, "%s.client_ca: cannot load '%s': %s", path, tls->client_ca, why);
            goto err;
        }
        SSL_CTX_set_client_CA_list(ctx, names);
        SSL_CTX_set_verify(ctx,
                           tls->verify == AGW_TLS_VERIFY_REQUIRE
                               ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT
                               : SSL_VERIFY_PEER,
                           NULL);
    }
    if (tls->n_sni > 0) {
        if (sni_index < 0)
            sni_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, sni_free);
        set = agw_xcalloc(1, sizeof(*set));
        set->ctx = agw_xcalloc(tls->n_sni, sizeof(SSL_CTX *));
        /* Attached first, so that every error path below frees it with the context. */
        SSL_CTX_set_ex_data(ctx, sni_index, set);
        for (size_t i = 0; i < tls->n_sni; i++) {
            snprintf(p, sizeof(p), "%s.certificates[%zu]", path, i);
            set->ctx[i] = server_ctx(tls->sni[i].cert, tls->sni[i].key, p, err, errlen);
            if (set->ctx[i] == NULL)
                goto err;
            set->n = i + 1;
            /* Client verification follows the listener's setting whichever certificate is chosen.
             */
            SSL_CTX_set_verify(set->ctx[i], SSL_CTX_get_verify_mode(ctx), NULL);
        }
    }
    SSL_CTX_set_tlsext_servername_callback(ctx, servername_cb);
    SSL_CTX_set_tlsext_servername_arg(ctx, set);
    return ctx;
err:
    SSL_CTX_free(ctx);
    return NULL;
}

SSL_CTX *agw_tls_client_ctx_new(const char *ca_file, char *err, size_t errlen)
{
    char why[160];
    SSL_CTX *ctx = base_ctx(TLS_client_method(), err, errlen);

    if (ctx == NULL)
        return NULL;
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (ca_file != NULL ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL) != 1
                        : SSL_CTX_set_default_verify_paths(ctx) != 1) {
        openssl_reason(why, sizeof(why));
        snprintf(err, errlen, "cannot load the CA file '%s': %s", ca_file ? ca_file : "(system)",
                 why);
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

static bool inet_pton_ok(const char *host, unsigned char *addr)
{
    return inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;
}

int agw_tls_client_prepare(SSL *ssl, const char *host)
{
    unsigned char addr[16];
    bool is_ip = inet_pton_ok(host, addr);

    if (is_ip) {
        /* IP literals get no SNI (RFC 6066) and are checked against the certificate's IP addresses.
         */
        if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) != 1)
            return -AGW_EINVAL;
        return 0;
    }
    {
        /* SSL_set_tlsext_host_name() is a macro that casts its argument to a non-const pointer
         * (OpenSSL copies the name): hand it a copy of ours rather than cast the const away. */
        char name[256];

        if (strlen(host) >= sizeof(name))
            return -AGW_EINVAL;
        snprintf(name, sizeof(name), "%s", host);
        if (SSL_set_tlsext_host_name(ssl, name) != 1 || SSL_set1_host(ssl, host) != 1)
            return -AGW_EINVAL;
    }
    return 0;
}

void agw_tls_error(SSL *ssl, unsigned long err_code, char *out, size_t len)
{
    long vr = ssl != NULL ? SSL_get_verify_result(ssl) : X509_V_OK;

    if (vr != X509_V_OK) {
        snprintf(out, len, "certificate verify failed: %s", X509_verify_cert_error_string(vr));
    } else if (err_code != 0) {
        const char *r = ERR_reason_error_string(err_code);
        snprintf(out, len, "%s", r ? r : "TLS error");
    } else {
        openssl_reason(out, len);
    }
    ERR_clear_error();
}
