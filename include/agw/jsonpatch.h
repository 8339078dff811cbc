/* JSON Patch (RFC 6902) on jansson values, for the activity messages of thread history: an
 * ACTIVITY_DELTA carries a patch that @ag-ui/client applies to the message's content with its
 * library's checks on (doc/internals/history.md#activity-messages). Pure: no I/O, no logging.
 *
 * Read as the client's library reads a patch, checks on:
 * - the patch is an array of objects, each with an "op" among add, remove, replace, move, copy,
 * test and a string "path" that is "" or starts with '/'; add, replace and test need a "value",
 * move and copy a string "from" of the same form;
 * - a path's tokens are unescaped ("~1" is '/', "~0" is '~'; any other '~' is an error); in an
 * array a token is an index of decimal digits only (leading zeros allowed), or "-" (past the end,
 * for add only); "__proto__" is refused as a key;
 * - add puts a member (replacing one of that name) or inserts an array element (index 0..length);
 * remove and replace need what they name to exist; move removes then adds (not into itself), copy
 * adds a deep copy; test compares by value (numbers as numbers: 1 equals 1.0);
 * - "" names the whole document: add and replace put the value in its place, remove makes it
 * null, move and copy put the value at "from", test compares the whole.
 * Operations apply in order; the first that fails stops the patch.
 * One bound the client's library does not have: the values that "copy" operations make, together,
 * may not outnumber those of the document and the patch plus AGW_JSON_PATCH_COPY_MARGIN (a patch
 * that copies the document into itself again and again would double it each time: thirty copies,
 * a billion values); past that the copy fails. */
#ifndef AGW_JSONPATCH_H
#define AGW_JSONPATCH_H

#include <jansson.h>

#include "agw/common.h"

#define AGW_JSON_PATCH_COPY_MARGIN 65536

/* Applies <patch> to *<doc> (owned; may be replaced). Returns 0, or -AGW_EINVAL when the patch
 * is not one or an operation fails: *<doc> is then part-way patched, so callers patch a copy and
 * keep the original on failure, as the client does. Aborts on out-of-memory. */
int agw_json_patch(json_t **doc, const json_t *patch);

#endif
