/* agui-gateway: command line, process set-up and wiring only (see include/agw/gateway.h). */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "agw/auth.h"
#include "agw/config.h"
#include "agw/gateway.h"
#include "agw/limits.h"
#include "agw/log.h"
#include "agw/mem.h"

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: agui-gateway -c FILE [--port-file FILE] [--workers N]\n"
            "       agui-gateway --check -c FILE\n"
            "       agui-gateway hash-token < token-file\n"
            "       agui-gateway --version | --help\n"
            "\n"
            "  -c, --config FILE     the JSON configuration (doc/configuration.md)\n"
            "      --check           validate the configuration and exit (0 = valid)\n"
            "      --port-file FILE  once listening, write the bound ports there, one per line\n"
            "                        (listeners in order, then the admin listener)\n"
            "      --workers N       event loops (threads), instead of the configuration's\n"
            "                        \"workers\" (0 = one per core)\n"
            "  hash-token            print the SHA-256 hex digest of the token read from stdin,\n"
            "                        for auth.keys[].sha256\n");
}

/* Reads a token from stdin (one trailing newline removed) and prints its digest. The token is
 * checked against the bearer token grammar (RFC 6750 token68) so that a digest printed here can
 * authenticate, and it is never echoed. */
static int hash_token(void)
{
    char buf[4096 + 3];
    size_t n = fread(buf, 1, sizeof(buf), stdin);
    char hex[65];
    int rc = 1;

    if (n > 0 && buf[n - 1] == '\n')
        n--;
    if (n > 0 && buf[n - 1] == '\r')
        n--;
    if (n == 0) {
        fprintf(stderr, "agui-gateway: no token on stdin\n");
        goto out;
    }
    if (n > 4096) {
        fprintf(stderr, "agui-gateway: token longer than 4096 bytes\n");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)buf[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  strchr("-._~+/", c) != NULL || (c == '=' && i > 0);
        if (!ok || (i > 0 && buf[i - 1] == '=' && c != '=')) {
            fprintf(stderr,
                    "agui-gateway: the token has a character a bearer token cannot carry (allowed: "
                    "letters, digits, - . _ ~ + / and trailing =)\n");
            goto out;
        }
    }
    agw_auth_hash_hex(buf, n, hex);
    printf("%s\n", hex);
    rc = 0;
out:
    OPENSSL_cleanse(buf, sizeof(buf));
    return rc;
}

static int write_port_file(const char *path, const uint16_t *ports, size_t n)
{
    char tmp[4096];
    FILE *f;

    /* Written under a temporary name and renamed, so a reader never sees half a file. */
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "w");
    if (f == NULL)
        return -1;
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%u\n", ports[i]);
    if (fclose(f) != 0)
        return -1;
    return rename(tmp, path);
}

/* The kernel grows a process's descriptor table by doubling it when a descriptor past its end is
 * needed, and in a process with several threads (worker loops, the store's writer) each growth
 * waits for an RCU grace period in the thread that asked: an event loop's socket() or accept()
 * stalled 10 to 25 ms at its 257th, 513th, ... descriptor. Growing the table once at start, to the
 * limit (at most AGW_FD_TABLE_MAX), costs the kernel 8 bytes per descriptor and no stall later.
 * Tables never shrink: a descriptor placed at the top and closed again leaves it grown. */
#define AGW_FD_TABLE_MAX (1 << 20)

static void grow_fd_table(rlim_t limit)
{
    int top =
        (int)((limit == RLIM_INFINITY || limit > AGW_FD_TABLE_MAX ? AGW_FD_TABLE_MAX : limit) - 1);

    if (top > 2 && fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, top) == top)
        close(top);
}

/* Each relayed stream holds two descriptors: take every descriptor the system lets this process
 * have (the soft limit up to the hard one), and say what that allows. */
static void raise_fd_limit(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t want = rl.rlim_max;

        rl.rlim_cur = want;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            getrlimit(RLIMIT_NOFILE, &rl);
    }
    grow_fd_table(rl.rlim_cur);
    if (rl.rlim_cur == RLIM_INFINITY)
        agw_log_info("open files: no limit");
    else
        agw_log_info("open files: at most %llu, about %llu concurrent streams",
                     (unsigned long long)rl.rlim_cur,
                     (unsigned long long)(rl.rlim_cur > 64 ? (rl.rlim_cur - 64) / 2 : 0));
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"check", no_argument, NULL, 'k'},
        {"port-file", required_argument, NULL, 'p'},
        {"workers", required_argument, NULL, 'w'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *config_path = NULL, *port_file = NULL;
    bool check = false, bg_purge;
    char err[AGW_CONFIG_ERR_MAX];
    struct agw_config *cfg = NULL;
    struct agw_gateway *gw = NULL;
    uint16_t ports[32];
    size_t n_ports;
    int c, status = 1;
    long workers = -1;
    char *end;

    if (argc == 2 && strcmp(argv[1], "hash-token") == 0)
        return hash_token();
    while ((c = getopt_long(argc, argv, "c:hV", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            config_path = optarg;
            break;
        case 'k':
            check = true;
            break;
        case 'p':
            port_file = optarg;
            break;
        case 'w':
            errno = 0;
            workers = strtol(optarg, &end, 10);
            if (errno != 0 || end == optarg || *end != '\0' || workers < 0 ||
                workers > AGW_MAX_WORKERS) {
                fprintf(stderr, "agui-gateway: --workers: expected 0 to %d, got '%s'\n",
                        AGW_MAX_WORKERS, optarg);
                return 2;
            }
            break;
        case 'V':
            printf("agui-gateway %s\n", PACKAGE_VERSION);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc || config_path == NULL) {
        usage(stderr);
        return 2;
    }

    cfg = agw_config_load_file(config_path, err, sizeof(err));
    if (cfg == NULL) {
        fprintf(stderr, "agui-gateway: %s: %s\n", config_path, err);
        return 1;
    }
    if (check) {
        printf("%s: configuration is valid (%zu agents, %zu listeners)\n", config_path,
               cfg->n_agents, cfg->n_listeners);
        agw_config_free(cfg);
        return 0;
    }
    agw_log_set_level((enum agw_log_level)cfg->log.level);
    if (agw_log_access_open(cfg->log.access) != 0) {
        fprintf(stderr, "agui-gateway: log.access: cannot open '%s': %s\n", cfg->log.access,
                strerror(errno));
        goto out;
    }
    /* A client that disconnects mid-write must not kill the process (libevent writes with writev).
     */
    signal(SIGPIPE, SIG_IGN);
    /* A file-size limit (ulimit -f) reached by the store's database is a write that fails (the
     * commit is retried, doc/internals/store.md), not a signal that kills the relay. */
    signal(SIGXFSZ, SIG_IGN);
    raise_fd_limit();
    bg_purge = agw_mem_purge_in_background();

    struct agw_gateway_options go = {.config_path = config_path, .workers = (int)workers};
    agw_auth_prepare();
    gw = agw_gateway_new(cfg, &go, err, sizeof(err));
    cfg = NULL; /* the gateway's now */
    if (gw == NULL) {
        agw_log_error("%s", err);
        goto out;
    }
    n_ports = agw_gateway_ports(gw, ports, AGW_ARRAY_LEN(ports));
    if (port_file != NULL && write_port_file(port_file, ports, n_ports) != 0) {
        agw_log_error("--port-file %s: %s", port_file, strerror(errno));
        goto out;
    }
    agw_log_info("agui-gateway %s ready (malloc: %s%s)", PACKAGE_VERSION, agw_mem_allocator(),
                 bg_purge ? ", purging in background threads" : "");
    agw_gateway_run(gw);
    status = 0;
out:
    agw_gateway_free(gw);
    agw_config_free(cfg);
    agw_log_access_close();
    return status;
}
