/* The process's heap (doc/internals/http_server.md, "Memory of an idle stream"): which allocator
 * the build uses, a heap of its own for the objects a library keeps for a short while per
 * connection, and giving freed memory back to the system.
 *
 * With jemalloc (the default build, configure --with-jemalloc), the process's malloc() is
 * jemalloc's and the separate heap is a jemalloc arena: objects allocated there never share a page
 * with the rest, so that when they are freed while the connection lives on, whole pages fall
 * empty and go back to the system. With the C library's malloc (--without-jemalloc, and the
 * sanitized builds, whose malloc belongs to AddressSanitizer) there is one heap for everything.
 *
 * Thread-safe. No state to set up or free: the separate heap is created on first use and lives as
 * long as the process. */
#ifndef AGW_MEM_H
#define AGW_MEM_H

#include <stdbool.h>
#include <stddef.h>

typedef void *agw_malloc_fn(size_t n);
typedef void *agw_realloc_fn(void *p, size_t n);
typedef void agw_free_fn(void *p);

/* The allocation functions of the separate heap, for a library's allocation hook: they behave as
 * malloc(), realloc() and free() (malloc of 0 bytes and realloc to 0 bytes included), and the free
 * function also takes any block that malloc() returned, since a library may free through its hook
 * a block it did not allocate through it. A block they return may also be freed with free().
 * Returns false, setting nothing, when the build has no separate heap. */
bool agw_mem_separate_heap(agw_malloc_fn **malloc_fn, agw_realloc_fn **realloc_fn,
                           agw_free_fn **free_fn);

/* A block of <n> bytes on the separate heap (malloc()'s without one), for an object of ours that
 * dies while the stream it serves goes on; aborts when memory is out, as agw_xmalloc() does. Free
 * it with agw_mem_separate_free() (free() works too, through the thread's default cache: see
 * below). */
void *agw_mem_separate_alloc(size_t n);
void agw_mem_separate_free(void *p);

/* libevent's allocation functions, for event_set_mem_functions(), with which the sections below
 * work: outside a section they are malloc(), realloc() and free(); inside one (on the calling
 * thread) new blocks come from the separate heap, and blocks are freed through the separate heap's
 * own per-thread cache (never the thread's default cache, from which a later malloc() would take a
 * block of the separate heap for a long-lived object). Returns false, setting nothing, when the
 * build has no separate heap. */
bool agw_mem_libevent_functions(agw_malloc_fn **malloc_fn, agw_realloc_fn **realloc_fn,
                                agw_free_fn **free_fn);

/* A section: what libevent allocates and frees between enter and leave, on this thread, is an
 * object that dies while the connection it serves goes on (a request's buffers, the gate's
 * assembly buffer, the request sent upstream): it goes to the separate heap, and is freed inside
 * a section again (a block of the separate heap freed outside one still works, through the cache).
 * Sections nest. A callback out of a section into code that allocates long-lived objects runs
 * between suspend and resume. No-ops without a separate heap. */
void agw_mem_separate_enter(void);
void agw_mem_separate_leave(void);
unsigned agw_mem_separate_suspend(void); /* returns what resume takes */
void agw_mem_separate_resume(unsigned saved);

/* Hands the pages that freed memory left empty back to the system, in every heap (jemalloc: the
 * calling thread's separate cache is flushed and every arena's dirty pages are purged; the C
 * library: malloc_trim()). It walks the heap: call it from a timer after many objects were freed
 * (a burst of connections closed), never per request. */
void agw_mem_release(void);

/* The same for the separate heap and the calling thread's own arena (jemalloc; the C library,
 * which has neither: agw_mem_release()), for what shed streams freed on a loop. The other threads'
 * arenas are left to jemalloc's decay: a thread that has just freed a block (the store's writer, a
 * streamed answer's text buffer) takes its pages again at once, and would fault each in anew after
 * a purge. */
void agw_mem_release_own(void);

/* The same for the calling thread's arena alone, its cache emptied first (jemalloc; the C library:
 * agw_mem_release()): for a thread with an arena of its own (agw_mem_own_arena()) that has been
 * idle a while after a burst, the store's writer. */
void agw_mem_release_arena(void);

/* Gives the calling thread an arena of its own (jemalloc; nothing with the C library): its freed
 * pages are then its own, whatever the loops purge (agw_mem_release_own()). jemalloc gives threads
 * arenas in turn, four per CPU, but one for all when the process starts with one CPU (a cpuset, or
 * taskset as the benchmarks pin it): the store's writer shared the loops' then. */
void agw_mem_own_arena(void);

/* Moves the heap's return of freed pages to the system off the calling threads, at start, before
 * the event loops run: with jemalloc, its background threads (at nice 19) purge what decayed, and
 * no thread of ours calls madvise() for it any more (agw_mem_release() still purges at once, on
 * the thread that calls it). Returns whether they run: false with the C library's malloc, under
 * valgrind, or when jemalloc cannot start them. Call it once. */
bool agw_mem_purge_in_background(void);

/* The allocator, for logs and metrics: "jemalloc 5.3.0-…" or "libc". Static storage. */
const char *agw_mem_allocator(void);

#endif
