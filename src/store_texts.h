/* The embedded store's long texts, kept out of SQLite's pages: pieces of messages of
 * AGW_TEXTS_MIN bytes or more (a streamed answer, mostly) are appended to segment files,
 * <store>/history.texts/<n>, and the database's message rows hold where (segment, offset, length).
 * The database says how many bytes of each segment are committed; this module owns the files
 * (src/store_texts.c, doc/internals/store.md). Used by the store's writer thread alone. Private to
 * the store. */
#ifndef AGW_STORE_TEXTS_H
#define AGW_STORE_TEXTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Pieces of at least this many bytes go to the segments (tunable for tests:
 * agw_store_texts_tune()). */
#define AGW_TEXTS_MIN 4096
/* Appends move to a new segment once the one appended to holds this much. */
#define AGW_TEXTS_SEGMENT_BYTES (64u << 20)

struct agw_texts;

/* Opens <store_dir>/history.texts, made when missing. NULL with the cause in <err>. */
struct agw_texts *agw_texts_open(const char *store_dir, char *err, size_t errlen);
void agw_texts_close(struct agw_texts *t);

/* At start, each segment the database lists, in increasing order, with the bytes it says are
 * committed: its file must hold them (else -1, the cause in <err>: a file lost or cut). The last
 * one adopted is appended to: what its file holds past <size> (a commit that did not happen) is
 * cut. */
int agw_texts_adopt(struct agw_texts *t, uint64_t seg, uint64_t size, char *err, size_t errlen);
/* After the adoptions: deletes the directory's segment files that were not adopted (made for
 * commits that did not happen, or left by a compaction cut short), and, when none was adopted,
 * starts segment 1. 0, or -1 with the cause in <err>. */
int agw_texts_ready(struct agw_texts *t, char *err, size_t errlen);

/* Within a transaction: appends <n> bytes to the segment appended to; its number in *<seg>, the
 * bytes' offset in *<off>. 0, or -1 (errno) when a write failed (the transaction must fail). */
int agw_texts_append(struct agw_texts *t, const char *p, size_t n, uint64_t *seg, uint64_t *off);
/* Whether this transaction appended anything, and the size the segment appended to will have. */
bool agw_texts_pending(const struct agw_texts *t, uint64_t *seg, uint64_t *size);
/* Writes what this transaction appended and waits for the disk (before the database's commit,
 * which refers to it). 0, or -1 (errno). */
int agw_texts_sync(struct agw_texts *t);
/* The transaction committed: its appends are part of the segment. Moves appends to a new segment
 * (<seg> + 1) once the segment is full; a failure to make it is logged and retried at the next
 * commit. */
void agw_texts_committed(struct agw_texts *t);
/* The transaction failed: its appends are forgotten (the next ones go where they went). */
void agw_texts_rolled_back(struct agw_texts *t);
/* Between transactions: frees the buffer appends are gathered in (1 MiB, made again by the next
 * append), for a writer that has been idle a while. */
void agw_texts_trim(struct agw_texts *t);

/* Reads <len> bytes at <off> of segment <seg> into <out>. 0, or -1 (logged). The segment stays
 * open for the next read until agw_texts_reads_done(), which the caller calls once it read what it
 * needed (a thread, a message): at rest the texts hold two descriptors, the directory and the
 * segment appended to. */
int agw_texts_read(struct agw_texts *t, uint64_t seg, uint64_t off, size_t len, char *out);
void agw_texts_reads_done(struct agw_texts *t);
/* The segment appended to. */
uint64_t agw_texts_current(const struct agw_texts *t);
/* Deletes segment <seg>'s file (the database no longer lists it; it held <size> bytes). */
void agw_texts_remove(struct agw_texts *t, uint64_t seg, uint64_t size);
/* The bytes committed in every segment: what the texts take on the disk. */
uint64_t agw_texts_bytes(const struct agw_texts *t);

/* Test hooks, for stores opened from now on: pieces of at least <min> bytes go to the segments,
 * which hold <segment_bytes> each, written directly unless <no_direct>; the segments are looked
 * at for deletion or compaction after every commit with <gc_every_commit> (else once a second at
 * most); zeros and falses restore the defaults. */
void agw_store_texts_tune(size_t min, uint64_t segment_bytes, bool no_direct, bool gc_every_commit);
size_t agw_store_texts_min(void);
bool agw_store_texts_gc_every_commit(void);
/* Bytes appended, and of them written with O_DIRECT, since the process started. */
void agw_store_texts_counts(uint64_t *appended, uint64_t *direct);
/* The bytes of the append buffers held, every store's. */
uint64_t agw_store_texts_buffer_bytes(void);

#endif
