#include <criterion/criterion.h>

Test(sse, placeholder)
{
    cr_assert_eq(1, 1);
}
