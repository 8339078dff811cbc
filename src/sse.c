/* sse: not written yet. */
#include "config.h"

int agw_sse_placeholder_(void);
int agw_sse_placeholder_(void)
{
    return 0;
}
