/* http1: not written yet. */
#include "config.h"

int agw_http1_placeholder_(void);
int agw_http1_placeholder_(void)
{
    return 0;
}
