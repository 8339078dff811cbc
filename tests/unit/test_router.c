#include <criterion/criterion.h>

Test(router, placeholder)
{
    cr_assert_eq(1, 1);
}
