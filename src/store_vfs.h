/* The SQLite VFS the embedded store opens its database with: SQLite's own ("unix"), except that
 * the database file's page writes go to the disk directly (O_DIRECT), gathered, not through the
 * page cache (src/store_vfs.c, doc/internals/store.md). Private to the store. */
#ifndef AGW_STORE_VFS_H
#define AGW_STORE_VFS_H

#include <stdbool.h>
#include <stdint.h>

#include <sqlite3.h>

/* The VFS's name for sqlite3_open_v2(), registered on the first call (not as the default); NULL
 * when it cannot be (SQLite's default VFS is then used as it is). */
const char *agw_store_vfs_name(void);

/* Frees the buffer database <db>'s writes were gathered in (made again by the next commit that
 * writes): for a writer that has been idle a while after a burst. Between transactions only. */
void agw_store_vfs_trim(sqlite3 *db);
/* The bytes of the gathering buffers held, every file's. */
uint64_t agw_store_vfs_stage_bytes(void);

/* Test hook: whether files opened from now on may write directly (true by default). */
void agw_store_vfs_set_direct(bool on);

/* Bytes written directly and the writes that wrote them, and the writes of pages that went through
 * the page cache instead (not in whole blocks, or the file system refused direct I/O), by every
 * database opened with the VFS since the process started. */
uint64_t agw_store_vfs_direct_bytes(void);
uint64_t agw_store_vfs_direct_writes(void);
uint64_t agw_store_vfs_buffered_writes(void);

#endif
