/* upstream: not written yet. */
#include "config.h"

int agw_upstream_placeholder_(void);
int agw_upstream_placeholder_(void)
{
    return 0;
}
