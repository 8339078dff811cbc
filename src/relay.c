/* relay: not written yet. */
#include "config.h"

int agw_relay_placeholder_(void);
int agw_relay_placeholder_(void)
{
    return 0;
}
