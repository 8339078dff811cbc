#include <criterion/criterion.h>

Test(input, placeholder)
{
    cr_assert_eq(1, 1);
}
