#include <criterion/criterion.h>

Test(auth, placeholder)
{
    cr_assert_eq(1, 1);
}
