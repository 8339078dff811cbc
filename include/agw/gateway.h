/* The gateway: wires a loaded configuration to the server, the upstream pools and the relays, and
 * answers every route of doc/protocol.md#endpoints. main.c only parses the command line and calls
 * these.
 *
 * Ownership: the gateway owns its event loop objects, server, pools and relays, and the
 * configuration it is given (and each one SIGHUP loads in its place). */
#ifndef AGW_GATEWAY_H
#define AGW_GATEWAY_H

#include "agw/config.h"

struct agw_gateway;

struct agw_gateway_options {
    const char *config_path; /* the file SIGHUP reads again (copied); NULL: reloads are refused */
    int workers;             /* --workers: replaces every configuration's "workers"; -1 = none */
};

/* Builds the gateway and binds every listener. Takes <cfg>, even when it fails. Returns NULL with
 * a reason in <err> (e.g. a port in use). */
struct agw_gateway *agw_gateway_new(struct agw_config *cfg, const struct agw_gateway_options *o,
                                    char *err, size_t errlen);
void agw_gateway_free(struct agw_gateway *gw);

/* Bound ports, in the order of cfg->listeners, then the admin listener's when configured. */
size_t agw_gateway_ports(const struct agw_gateway *gw, uint16_t *ports, size_t max);

/* Runs the event loop until a drain triggered by SIGTERM/SIGINT has completed. Returns 0. */
int agw_gateway_run(struct agw_gateway *gw);

#endif
