/* router: not written yet. */
#include "config.h"

int agw_router_placeholder_(void);
int agw_router_placeholder_(void)
{
    return 0;
}
