#include <criterion/criterion.h>

Test(config, placeholder)
{
    cr_assert_eq(1, 1);
}
