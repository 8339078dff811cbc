/* agw-probe: the loop probe in an event loop that does nothing else, the reference for the
 * gateway's (bench/run.sh --stall runs one beside each gateway, on the same CPU). Whatever makes
 * this loop late — the host pausing the virtual CPU, the kernel's own work — is not the gateway's
 * doing; a lateness the gateway's loop shows and this one does not at the same moment is.
 *
 * usage: agw-probe [--period-ms N] [--report-ms X]
 *   Runs until SIGTERM or SIGINT, then prints every lateness of at least X ms (default 2), a line
 *   each in the gateway's format (include/agw/loop_probe.h), and a last line with the maxima:
 *   "loop probe: max late L ms, own O ms, running R ms; kept K, lost M". */
#include "config.h"
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/event.h>
#include "agw/common.h"
#include "agw/loop_probe.h"

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)sig;
    (void)what;
    event_base_loopbreak(arg);
}

int main(int argc, char **argv)
{
    double period_ms = 1, report_ms = 2;
    struct event_base *base;
    struct event *sigterm, *sigint;
    struct agw_loop_probe *p;
    struct agw_loop_probe_maxima m;
    const struct agw_loop_lateness *l;
    size_t n;
    uint64_t lost;
    char line[160];

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--period-ms") == 0 && i + 1 < argc)
            period_ms = strtod(argv[++i], NULL);
        else if (strcmp(argv[i], "--report-ms") == 0 && i + 1 < argc)
            report_ms = strtod(argv[++i], NULL);
        else {
            fprintf(stderr, "usage: agw-probe [--period-ms N] [--report-ms X]\n");
            return 2;
        }
    }
    base = event_base_new();
    if (base == NULL || event_base_priority_init(base, AGW_N_PRIORITIES) != 0) {
        fprintf(stderr, "agw-probe: no event loop\n");
        return 1;
    }
    p = agw_loop_probe_new(base, (uint64_t)(period_ms * 1000), (uint64_t)(report_ms * 1000));
    if (p == NULL) {
        perror("agw-probe: no probe");
        return 1;
    }
    sigterm = evsignal_new(base, SIGTERM, on_signal, base);
    sigint = evsignal_new(base, SIGINT, on_signal, base);
    event_add(sigterm, NULL);
    event_add(sigint, NULL);
    event_base_dispatch(base);

    l = agw_loop_probe_records(p, &n, &lost);
    for (size_t i = 0; i < n; i++) {
        agw_loop_probe_format(&l[i], line, sizeof(line));
        printf("%s\n", line);
    }
    agw_loop_probe_maxima(p, &m);
    printf("loop probe: max late %.3f ms, own %.3f ms, running %.3f ms; kept %zu, lost %" PRIu64
           "\n",
           m.late_us / 1e3, m.own_us / 1e3, m.running_us / 1e3, n, lost);
    agw_loop_probe_free(p);
    event_free(sigterm);
    event_free(sigint);
    event_base_free(base);
    return 0;
}
