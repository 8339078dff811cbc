#include <criterion/criterion.h>

Test(http1, placeholder)
{
    cr_assert_eq(1, 1);
}
