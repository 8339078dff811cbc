/* Small text and JSON helpers shared by the modules. No state. */
#ifndef DEMO_UTIL_H
#define DEMO_UTIL_H

#include <jansson.h>

#include "agw/common.h"

char ascii_lower(char ch);
/* A lowercase (ASCII) copy of <s>; the caller frees it. */
char *str_lower(const char *s);
/* A new JSON string of <s> (length <len>), never NULL: bytes not valid UTF-8 become '?'. */
json_t *json_str_lossy(const char *s, size_t len);
/* The string value of <obj>'s member <key> (borrowed), or NULL, also when <obj> is no object. */
const char *str_field(const json_t *obj, const char *key);

#endif
