#include <criterion/criterion.h>

Test(common, placeholder)
{
    cr_assert_eq(1, 1);
}
