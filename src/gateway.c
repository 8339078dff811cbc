/* gateway: not written yet. */
#include "config.h"

int agw_gateway_placeholder_(void);
int agw_gateway_placeholder_(void)
{
    return 0;
}
