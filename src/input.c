/* input: not written yet. */
#include "config.h"

int agw_input_placeholder_(void);
int agw_input_placeholder_(void)
{
    return 0;
}
