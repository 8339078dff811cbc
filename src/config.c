/* config: not written yet. */
#include "config.h"

int agw_config_placeholder_(void);
int agw_config_placeholder_(void)
{
    return 0;
}
