/* http_server: not written yet. */
#include "config.h"

int agw_http_server_placeholder_(void);
int agw_http_server_placeholder_(void)
{
    return 0;
}
