#include <criterion/criterion.h>

Test(agui, placeholder)
{
    cr_assert_eq(1, 1);
}
