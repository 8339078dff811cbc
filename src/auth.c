/* auth: not written yet. */
#include "config.h"

int agw_auth_placeholder_(void);
int agw_auth_placeholder_(void)
{
    return 0;
}
