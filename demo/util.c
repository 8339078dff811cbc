/* Small text and JSON helpers shared by the modules (see util.h). */
#include "config.h"

#include <stdlib.h>

#include "agw/common.h"

#include "util.h"

char ascii_lower(char ch)
{
    return (ch >= 'A' && ch <= 'Z') ? (char)(ch - 'A' + 'a') : ch;
}

char *str_lower(const char *s)
{
    char *out = agw_xstrdup(s);
    for (char *p = out; *p; p++)
        *p = ascii_lower(*p);
    return out;
}

/* A JSON string of <s> (length <len>); bytes that are not valid UTF-8 become '?' so that request
 * text (targets, header values) can always be shown. */
json_t *json_str_lossy(const char *s, size_t len)
{
    json_t *j = json_stringn(s, len);
    char *copy;

    if (j)
        return j;
    copy = agw_xstrndup(s, len);
    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)copy[i] >= 0x80 || copy[i] == '\0')
            copy[i] = '?';
    }
    j = json_stringn(copy, len);
    free(copy);
    if (!j)
        abort(); /* out of memory, the daemon's policy */
    return j;
}

const char *str_field(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}
