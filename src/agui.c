/* agui: not written yet. */
#include "config.h"

int agw_agui_placeholder_(void);
int agw_agui_placeholder_(void)
{
    return 0;
}
