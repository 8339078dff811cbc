/* agui-demo-agent: the command line, signals, the listener and the event loop (see demo.h for the
 * modules). */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <jansson.h>

#include "agw/common.h"
#include "agw/log.h"

#include "demo.h"
#include "http.h"

static void on_relisten(evutil_socket_t fd, short what, void *arg)
{
    struct demo *d = arg;
    (void)fd;
    (void)what;
    evconnlistener_enable(d->listener);
}

static void on_accept_error(struct evconnlistener *lis, void *arg)
{
    struct demo *d = arg;
    struct timeval tv = {0, 100000};
    int err = EVUTIL_SOCKET_ERROR();

    agw_log_warn("accept: %s; pausing the listener for 100 ms", evutil_socket_error_to_string(err));
    evconnlistener_disable(lis);
    evtimer_add(d->relisten, &tv);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct demo *d = arg;
    (void)what;
    agw_log_info("signal %d: exiting", (int)sig);
    event_base_loopexit(d->base, NULL);
}

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: agui-demo-agent [--listen ADDR:PORT] [--port-file FILE] "
        "[--log-level error|warn|info|debug]\n"
        "\n"
        "The AG-UI demo and test backend of agui-gateway.\n"
        "  -l, --listen ADDR:PORT   listen address (default 127.0.0.1:9001; port 0 = ephemeral)\n"
        "  -p, --port-file FILE     write the bound port and a newline to FILE once listening\n"
        "  -L, --log-level LEVEL    error, warn, info (default) or debug\n"
        "  -h, --help               this help\n"
        "  -V, --version            the version\n"
        "\n"
        "POST any path but /_demo/* with a RunAgentInput body to run the agent; GET /healthz,\n"
        "/_demo/stats and /_demo/last-request. Knobs: see doc/demo-agent.md.\n");
}

/* Parses "ADDR:PORT" or "[V6ADDR]:PORT" (numeric address; port 0..65535, 0 = ephemeral). */
static int parse_listen(const char *s, struct sockaddr_storage *ss, int *sslen)
{
    char host[64];
    const char *colon = strrchr(s, ':'), *h = s;
    size_t hl;
    char *end = NULL;
    long port;

    if (!colon)
        return -AGW_EINVAL;
    hl = (size_t)(colon - s);
    if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']') {
        h = s + 1;
        hl -= 2;
    }
    if (hl == 0 || hl >= sizeof(host))
        return -AGW_EINVAL;
    memcpy(host, h, hl);
    host[hl] = '\0';
    errno = 0;
    port = strtol(colon + 1, &end, 10);
    if (colon[1] < '0' || colon[1] > '9' || *end != '\0' || errno != 0 || port > 65535)
        return -AGW_EINVAL;
    memset(ss, 0, sizeof(*ss));
    if (evutil_inet_pton(AF_INET, host, &((struct sockaddr_in *)(void *)ss)->sin_addr) == 1) {
        struct sockaddr_in *sin = (struct sockaddr_in *)(void *)ss;
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)port);
        *sslen = (int)sizeof(*sin);
        return 0;
    }
    if (evutil_inet_pton(AF_INET6, host, &((struct sockaddr_in6 *)(void *)ss)->sin6_addr) == 1) {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)(void *)ss;
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t)port);
        *sslen = (int)sizeof(*sin6);
        return 0;
    }
    return -AGW_EINVAL;
}

static int write_port_file(const char *path, int port)
{
    char tmp[4096], line[16];
    int n = snprintf(line, sizeof(line), "%d\n", port);
    FILE *f;

    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
        return -AGW_EINVAL;
    f = fopen(tmp, "w");
    if (!f)
        return -AGW_EIO;
    if (fwrite(line, 1, (size_t)n, f) != (size_t)n || fclose(f) != 0) {
        unlink(tmp);
        return -AGW_EIO;
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return -AGW_EIO;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"listen", required_argument, NULL, 'l'},    {"port-file", required_argument, NULL, 'p'},
        {"log-level", required_argument, NULL, 'L'}, {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},         {NULL, 0, NULL, 0},
    };
    const char *listen_addr = "127.0.0.1:9001", *port_file = NULL;
    struct demo d;
    struct sockaddr_storage ss;
    struct event_config *cfg = NULL;
    int sslen = (int)sizeof(ss), ch, rc = 1;

    memset(&d, 0, sizeof(d));
    while ((ch = getopt_long(argc, argv, "l:p:L:hV", opts, NULL)) != -1) {
        enum agw_log_level lvl;
        switch (ch) {
        case 'l':
            listen_addr = optarg;
            break;
        case 'p':
            port_file = optarg;
            break;
        case 'L':
            if (agw_log_level_parse(optarg, &lvl) < 0) {
                fprintf(stderr,
                        "agui-demo-agent: --log-level: expects error|warn|info|debug, got '%s'\n",
                        optarg);
                return 2;
            }
            agw_log_set_level(lvl);
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("agui-demo-agent (%s) %s\n", PACKAGE_NAME, PACKAGE_VERSION);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return 2;
    }
    memset(&ss, 0, sizeof(ss));
    if (parse_listen(listen_addr, &ss, &sslen) < 0) {
        fprintf(stderr, "agui-demo-agent: --listen: expects ADDR:PORT, got '%s'\n", listen_addr);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);

    /* A precise clock for the timers: libevent's default reads CLOCK_MONOTONIC_COARSE, which ticks
     * every 4 ms on a 250 Hz kernel, and delay_ms=1 would pace events 4 ms apart. */
    cfg = event_config_new();
    if (cfg) {
        event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
        d.base = event_base_new_with_config(cfg);
        event_config_free(cfg);
    }
    if (!d.base) {
        agw_log_error("cannot create the event loop");
        goto out;
    }
    d.listener = evconnlistener_new_bind(
        d.base, on_accept, &d, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
        1024, (struct sockaddr *)&ss, sslen);
    if (!d.listener) {
        agw_log_error("cannot listen on %s: %s", listen_addr,
                      evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
        goto out;
    }
    evconnlistener_set_error_cb(d.listener, on_accept_error);
    d.relisten = evtimer_new(d.base, on_relisten, &d);
    d.sig_term = evsignal_new(d.base, SIGTERM, on_signal, &d);
    d.sig_int = evsignal_new(d.base, SIGINT, on_signal, &d);
    if (!d.relisten || !d.sig_term || !d.sig_int || evsignal_add(d.sig_term, NULL) < 0 ||
        evsignal_add(d.sig_int, NULL) < 0) {
        agw_log_error("cannot set up signal handling");
        goto out;
    }
    {
        struct sockaddr_storage bound;
        socklen_t blen = sizeof(bound);
        int port = 0;

        if (getsockname(evconnlistener_get_fd(d.listener), (struct sockaddr *)&bound, &blen) == 0)
            port = bound.ss_family == AF_INET6
                       ? ntohs(((struct sockaddr_in6 *)(void *)&bound)->sin6_port)
                       : ntohs(((struct sockaddr_in *)(void *)&bound)->sin_port);
        agw_log_info("agui-demo-agent %s listening on %s (port %d)", PACKAGE_VERSION, listen_addr,
                     port);
        if (port_file && write_port_file(port_file, port) < 0) {
            agw_log_error("--port-file %s: %s", port_file, strerror(errno));
            goto out;
        }
    }
    if (event_base_dispatch(d.base) < 0) {
        agw_log_error("event loop failed");
        goto out;
    }
    rc = 0;
out:
    while (d.conns) {
        if (d.conns->run)
            d.active_streams--;
        conn_free(d.conns);
    }
    if (d.listener)
        evconnlistener_free(d.listener);
    if (d.relisten)
        event_free(d.relisten);
    if (d.sig_term)
        event_free(d.sig_term);
    if (d.sig_int)
        event_free(d.sig_int);
    json_decref(d.last_request);
    if (d.base)
        event_base_free(d.base);
    libevent_global_shutdown();
    return rc;
}
