/* A thin SQLite VFS over its default one ("unix"): the journal, the reads, the locks and the syncs
 * are SQLite's own; only the database file's page writes differ. They are gathered in one aligned
 * buffer of up to 2 MiB, as runs of adjoining pages (a commit writes mostly new pages at the
 * file's end: a streamed answer's chain of overflow pages), and written with a pwritev() per run,
 * in the file's order, on a second descriptor of the file opened with O_DIRECT, before SQLite does
 * anything with the file that could see them: a sync, a lock, a truncation, its size, the close,
 * a read of gathered bytes that the buffer cannot answer whole. A read of other pages (SQLite's
 * cache of 31 pages lets go of the B-trees' pages while a commit writes, and reads them again
 * between two writes) and a size hint (it only ever grows the file) leave them gathered; a page
 * written again is written over in the buffer. Pages written at distinct places commute, so only
 * the order of operations on the same bytes is kept, which is SQLite's.
 *
 * Why: through the page cache the kernel copies every byte into a cache page it allocates (with
 * the delayed allocation's bookkeeping per page), and the commit's fdatasync() then writes those
 * pages out in the writer's thread; a streamed answer passed through all of it once, to be dropped
 * from the cache again at once (posix_fadvise(), store_sqlite.c). Written directly, the device
 * reads the buffer itself: measured with the writer's pattern (64 KiB pages, 7.5 MB a commit,
 * fdatasync() each; doc/internals/store.md) the process's CPU fell from 0.42 to 0.11 ns a byte in
 * writes of 2 MiB, the whole machine's likewise (none of it moves to the kernel's threads). Page
 * by page (each its own direct write) it costs more than the page cache (0.66 ns): the gathering
 * is the point.
 *
 * A write that is not in whole blocks of 4 KiB (a page size below 4 KiB) goes through SQLite's
 * descriptor, as does every write of a file system that refuses O_DIRECT (tmpfs: at the open; any
 * other: EINVAL at a write, from then on). A gathered write that fails is reported by the call
 * that made it (SQLITE_FULL for a full disk, else SQLITE_IOERR_WRITE), and SQLite rolls the
 * transaction back from its journal as after any failed write. The second descriptor is closed
 * after SQLite's own: closing any descriptor of a file drops the process's POSIX locks on it. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "store_vfs.h"

#define VFS_NAME     "agw-direct"
#define DIRECT_ALIGN 4096u /* offsets, lengths and the buffer's address */
#define STAGE_MIN    (256u << 10)
#define STAGE_MAX    (2u << 20) /* gathered at most; the buffer is kept at its size until trimmed */
#define SEGS_MAX     64         /* runs of pages gathered at most */

/* A run of pages gathered: the file's [off, off + len), at <at> in the buffer. */
struct seg {
    sqlite3_int64 off;
    size_t len, at;
};

struct dfile {
    sqlite3_file base; /* pMethods = &methods */
    sqlite3_file *real;
    int fd;       /* the file again, O_DIRECT; -1 = none */
    bool direct;  /* writes go to <fd> (false once the file system refused one) */
    bool main_db; /* the database (the journal and the others are SQLite's as they are) */
    char *stage;  /* the gathered pages: <used> bytes, in <segs> */
    size_t used, cap;
    struct seg segs[SEGS_MAX]; /* apart from one another (no two overlap) */
    unsigned n_segs;
};

static sqlite3_vfs *real_vfs;
static sqlite3_vfs vfs;
static const char *vfs_name;
static pthread_once_t vfs_once = PTHREAD_ONCE_INIT;
static bool allow_direct = true;                                    /* atomic */
static uint64_t n_direct_bytes, n_direct_writes, n_buffered_writes; /* atomic */
static uint64_t stage_bytes; /* atomic: the buffers' sizes, every file's */

/* The default VFS's file follows ours, at a multiple of 8. */
#define REAL_OFFSET ((sizeof(struct dfile) + 7) & ~(size_t)7)

static int real_write(struct dfile *f, const void *buf, size_t amt, sqlite3_int64 off)
{
    if (f->main_db)
        __atomic_add_fetch(&n_buffered_writes, 1, __ATOMIC_RELAXED);
    return f->real->pMethods->xWrite(f->real, buf, (int)amt, off);
}

/* Writes <iov>'s <n> pieces at <off>, one after the other in the file. */
static int write_run(struct dfile *f, struct iovec *iov, int n, sqlite3_int64 off)
{
    while (n > 0) {
        ssize_t k = f->direct ? pwritev(f->fd, iov, n > IOV_MAX ? IOV_MAX : n, (off_t)off) : -1;
        if (k > 0) {
            __atomic_add_fetch(&n_direct_bytes, (uint64_t)k, __ATOMIC_RELAXED);
            __atomic_add_fetch(&n_direct_writes, 1, __ATOMIC_RELAXED);
            off += k;
            for (; n > 0 && (size_t)k >= iov->iov_len; iov++, n--)
                k -= (ssize_t)iov->iov_len;
            if (n > 0) {
                iov->iov_base = (char *)iov->iov_base + k;
                iov->iov_len -= (size_t)k;
            }
            continue;
        }
        if (k < 0 && f->direct && errno == EINTR)
            continue;
        if (k < 0 && f->direct && errno != EINVAL)
            return errno == ENOSPC || errno == EDQUOT ? SQLITE_FULL : SQLITE_IOERR_WRITE;
        /* the file system will not (or, after a short write, the rest is not aligned): the rest
         * through SQLite's descriptor, and every write from now on */
        f->direct = false;
        for (; n > 0; iov++, n--) {
            int rc = real_write(f, iov->iov_base, iov->iov_len, off);
            if (rc != SQLITE_OK)
                return rc;
            off += (sqlite3_int64)iov->iov_len;
        }
    }
    return SQLITE_OK;
}

/* Writes what is gathered, in the file's order, a write per run of adjoining pages. */
static int flush(struct dfile *f)
{
    struct iovec iov[SEGS_MAX];
    int rc = SQLITE_OK;
    unsigned i, j;

    for (i = 1; i < f->n_segs; i++) { /* by offset (a handful: insertion) */
        struct seg t = f->segs[i];
        for (j = i; j > 0 && f->segs[j - 1].off > t.off; j--)
            f->segs[j] = f->segs[j - 1];
        f->segs[j] = t;
    }
    for (i = 0; i < f->n_segs && rc == SQLITE_OK; i = j) {
        sqlite3_int64 end = f->segs[i].off;
        int n = 0;
        for (j = i; j < f->n_segs && f->segs[j].off == end; j++, n++) {
            iov[n] = (struct iovec){f->stage + f->segs[j].at, f->segs[j].len};
            end += (sqlite3_int64)f->segs[j].len;
        }
        rc = write_run(f, iov, n, f->segs[i].off);
    }
    f->n_segs = 0;
    f->used = 0;
    return rc;
}

/* Room for <more> gathered bytes; false when the buffer cannot grow (the caller writes what is
 * gathered, and then the rest). */
static bool stage_room(struct dfile *f, size_t more)
{
    size_t cap = f->cap != 0 ? f->cap : STAGE_MIN;
    void *p;

    if (f->used + more <= f->cap)
        return true;
    while (cap < f->used + more)
        cap *= 2;
    if (cap > STAGE_MAX || posix_memalign(&p, DIRECT_ALIGN, cap) != 0)
        return false;
    if (f->used > 0)
        memcpy(p, f->stage, f->used);
    free(f->stage);
    __atomic_add_fetch(&stage_bytes, (uint64_t)(cap - f->cap), __ATOMIC_RELAXED);
    f->stage = p;
    f->cap = cap;
    return true;
}

/* The run that holds all of [off, off + amt), or NULL; *<overlap>: whether any run holds part of
 * it. */
static struct seg *find(struct dfile *f, sqlite3_int64 off, size_t amt, bool *overlap)
{
    *overlap = false;
    for (unsigned i = 0; i < f->n_segs; i++) {
        struct seg *g = &f->segs[i];
        if (off < g->off + (sqlite3_int64)g->len && off + (sqlite3_int64)amt > g->off) {
            *overlap = true;
            if (off >= g->off && off + (sqlite3_int64)amt <= g->off + (sqlite3_int64)g->len)
                return g;
            return NULL;
        }
    }
    return NULL;
}

/* Gathers [off, off + amt) (aligned); false when it cannot (the caller writes it at once). */
static bool gather(struct dfile *f, const void *buf, size_t amt, sqlite3_int64 off)
{
    struct seg *g, *last = f->n_segs > 0 ? &f->segs[f->n_segs - 1] : NULL;
    bool overlap;

    if ((g = find(f, off, amt, &overlap)) != NULL) { /* a page written again */
        memcpy(f->stage + g->at + (size_t)(off - g->off), buf, amt);
        return true;
    }
    if (overlap || !stage_room(f, amt))
        return false;
    if (last != NULL && last->off + (sqlite3_int64)last->len == off &&
        last->at + last->len == f->used) { /* the next page of the last run */
        last->len += amt;
    } else {
        if (f->n_segs == SEGS_MAX)
            return false;
        f->segs[f->n_segs++] = (struct seg){off, amt, f->used};
    }
    memcpy(f->stage + f->used, buf, amt);
    f->used += amt;
    return true;
}

static void free_stage(struct dfile *f)
{
    free(f->stage);
    __atomic_sub_fetch(&stage_bytes, (uint64_t)f->cap, __ATOMIC_RELAXED);
    f->stage = NULL;
    f->cap = 0;
}

static int d_write(sqlite3_file *file, const void *buf, int amt, sqlite3_int64 off)
{
    struct dfile *f = (struct dfile *)file;
    int rc;

    if (f->direct && amt > 0 && (size_t)amt % DIRECT_ALIGN == 0 && off % DIRECT_ALIGN == 0 &&
        (size_t)amt <= STAGE_MAX) {
        if (gather(f, buf, (size_t)amt, off))
            return SQLITE_OK;
        if ((rc = flush(f)) != SQLITE_OK)
            return rc;
        if (f->direct && gather(f, buf, (size_t)amt, off))
            return SQLITE_OK;
    }
    if ((rc = flush(f)) != SQLITE_OK)
        return rc;
    return real_write(f, buf, (size_t)amt, off);
}

static int d_close(sqlite3_file *file)
{
    struct dfile *f = (struct dfile *)file;
    int rc = flush(f);
    int rc2 = f->real->pMethods->xClose(f->real);

    if (f->fd >= 0)
        close(f->fd); /* after SQLite's: see the top */
    f->fd = -1;
    free_stage(f);
    return rc != SQLITE_OK ? rc : rc2;
}

/* The other methods: what is gathered is written first (but for the pure questions), then
 * SQLite's own method does the rest. */
#define FLUSH_OR_RETURN(f)                                                                         \
    do {                                                                                           \
        int rc_ = flush(f);                                                                        \
        if (rc_ != SQLITE_OK)                                                                      \
            return rc_;                                                                            \
    } while (0)

/* A read of pages not gathered leaves the gathered ones be (SQLite's page cache is small: 2 MiB by
 * default, 31 pages of 64 KiB, and while a commit writes a streamed answer's new pages it reads
 * again the B-tree pages it let go, between two of them); one of gathered pages is answered from
 * them. */
static int d_read(sqlite3_file *file, void *buf, int amt, sqlite3_int64 off)
{
    struct dfile *f = (struct dfile *)file;
    bool overlap;
    struct seg *g = amt > 0 ? find(f, off, (size_t)amt, &overlap) : NULL;

    if (g != NULL) {
        memcpy(buf, f->stage + g->at + (size_t)(off - g->off), (size_t)amt);
        return SQLITE_OK;
    }
    if (amt > 0 && overlap)
        FLUSH_OR_RETURN(f);
    return f->real->pMethods->xRead(f->real, buf, amt, off);
}

/* A method of one argument that writes what is gathered first. */
#define FLUSHED(name, method, type)                                                                \
    static int name(sqlite3_file *file, type arg)                                                  \
    {                                                                                              \
        struct dfile *f = (struct dfile *)file;                                                    \
                                                                                                   \
        FLUSH_OR_RETURN(f);                                                                        \
        return f->real->pMethods->method(f->real, arg);                                            \
    }

FLUSHED(d_truncate, xTruncate, sqlite3_int64)
FLUSHED(d_sync, xSync, int)
FLUSHED(d_file_size, xFileSize, sqlite3_int64 *)
FLUSHED(d_lock, xLock, int)
FLUSHED(d_unlock, xUnlock, int)
FLUSHED(d_check_reserved, xCheckReservedLock, int *)

static int d_file_control(sqlite3_file *file, int op, void *arg)
{
    struct dfile *f = (struct dfile *)file;

    if (op == SQLITE_FCNTL_VFSNAME) { /* "agw-direct/unix", as SQLite's shims answer */
        int rc = f->real->pMethods->xFileControl(f->real, op, arg);
        if (rc == SQLITE_OK && arg != NULL && *(char **)arg != NULL) {
            char *both = sqlite3_mprintf("%s/%s", VFS_NAME, *(char **)arg);
            sqlite3_free(*(char **)arg);
            *(char **)arg = both;
        }
        return rc;
    }
    /* a size hint (made while a commit writes, before each write past the file's end) only
     * ever grows the file: the pages gathered may be written after it */
    if (op != SQLITE_FCNTL_SIZE_HINT)
        FLUSH_OR_RETURN(f);
    return f->real->pMethods->xFileControl(f->real, op, arg);
}

static int d_sector_size(sqlite3_file *file)
{
    struct dfile *f = (struct dfile *)file;

    return f->real->pMethods->xSectorSize(f->real);
}

static int d_device_characteristics(sqlite3_file *file)
{
    struct dfile *f = (struct dfile *)file;

    return f->real->pMethods->xDeviceCharacteristics(f->real);
}

/* Shared memory (WAL only, unused by the store: forwarded) and memory maps (mmap_size, 0 here). */
static int d_shm_map(sqlite3_file *file, int pg, int pgsz, int extend, void volatile **pp)
{
    struct dfile *f = (struct dfile *)file;

    FLUSH_OR_RETURN(f);
    if (f->real->pMethods->iVersion < 2)
        return SQLITE_IOERR_SHMMAP;
    return f->real->pMethods->xShmMap(f->real, pg, pgsz, extend, pp);
}

static int d_shm_lock(sqlite3_file *file, int offset, int n, int flags)
{
    struct dfile *f = (struct dfile *)file;

    if (f->real->pMethods->iVersion < 2)
        return SQLITE_IOERR_SHMLOCK;
    return f->real->pMethods->xShmLock(f->real, offset, n, flags);
}

static void d_shm_barrier(sqlite3_file *file)
{
    struct dfile *f = (struct dfile *)file;

    if (f->real->pMethods->iVersion >= 2)
        f->real->pMethods->xShmBarrier(f->real);
}

static int d_shm_unmap(sqlite3_file *file, int delete_flag)
{
    struct dfile *f = (struct dfile *)file;

    if (f->real->pMethods->iVersion < 2)
        return SQLITE_OK;
    return f->real->pMethods->xShmUnmap(f->real, delete_flag);
}

static int d_fetch(sqlite3_file *file, sqlite3_int64 off, int amt, void **pp)
{
    struct dfile *f = (struct dfile *)file;

    *pp = NULL;
    FLUSH_OR_RETURN(f);
    if (f->real->pMethods->iVersion < 3)
        return SQLITE_OK; /* no map: SQLite reads instead */
    return f->real->pMethods->xFetch(f->real, off, amt, pp);
}

static int d_unfetch(sqlite3_file *file, sqlite3_int64 off, void *p)
{
    struct dfile *f = (struct dfile *)file;

    if (f->real->pMethods->iVersion < 3)
        return SQLITE_OK;
    return f->real->pMethods->xUnfetch(f->real, off, p);
}

/* Version 3 whatever SQLite's file has: the methods it lacks answer as a file without them. */
static const sqlite3_io_methods methods = {
    .iVersion = 3,
    .xClose = d_close,
    .xRead = d_read,
    .xWrite = d_write,
    .xTruncate = d_truncate,
    .xSync = d_sync,
    .xFileSize = d_file_size,
    .xLock = d_lock,
    .xUnlock = d_unlock,
    .xCheckReservedLock = d_check_reserved,
    .xFileControl = d_file_control,
    .xSectorSize = d_sector_size,
    .xDeviceCharacteristics = d_device_characteristics,
    .xShmMap = d_shm_map,
    .xShmLock = d_shm_lock,
    .xShmBarrier = d_shm_barrier,
    .xShmUnmap = d_shm_unmap,
    .xFetch = d_fetch,
    .xUnfetch = d_unfetch,
};

/* The database file is wrapped; the journal and any other file are SQLite's own, as they are. */
static int v_open(sqlite3_vfs *v, const char *name, sqlite3_file *file, int flags, int *out)
{
    struct dfile *f = (struct dfile *)file;
    int rc;

    (void)v;
    memset(f, 0, sizeof(*f));
    f->fd = -1;
    f->real = (sqlite3_file *)((char *)file + REAL_OFFSET);
    rc = real_vfs->xOpen(real_vfs, name, f->real, flags, out);
    if (rc != SQLITE_OK || f->real->pMethods == NULL) {
        f->base.pMethods = NULL; /* nothing to close */
        return rc != SQLITE_OK ? rc : SQLITE_CANTOPEN;
    }
    f->main_db = (flags & SQLITE_OPEN_MAIN_DB) != 0;
    if (f->main_db && name != NULL && __atomic_load_n(&allow_direct, __ATOMIC_RELAXED)) {
        f->fd = open(name, O_WRONLY | O_DIRECT | O_CLOEXEC);
        f->direct = f->fd >= 0;
    }
    f->base.pMethods = &methods;
    return SQLITE_OK;
}

/* The VFS's other methods are the default one's. */
static int v_delete(sqlite3_vfs *v, const char *name, int sync_dir)
{
    (void)v;
    return real_vfs->xDelete(real_vfs, name, sync_dir);
}

static int v_access(sqlite3_vfs *v, const char *name, int flags, int *out)
{
    (void)v;
    return real_vfs->xAccess(real_vfs, name, flags, out);
}

static int v_full_pathname(sqlite3_vfs *v, const char *name, int n, char *out)
{
    (void)v;
    return real_vfs->xFullPathname(real_vfs, name, n, out);
}

static void *v_dl_open(sqlite3_vfs *v, const char *name)
{
    (void)v;
    return real_vfs->xDlOpen(real_vfs, name);
}

static void v_dl_error(sqlite3_vfs *v, int n, char *msg)
{
    (void)v;
    real_vfs->xDlError(real_vfs, n, msg);
}

static void (*v_dl_sym(sqlite3_vfs *v, void *h, const char *sym))(void)
{
    (void)v;
    return real_vfs->xDlSym(real_vfs, h, sym);
}

static void v_dl_close(sqlite3_vfs *v, void *h)
{
    (void)v;
    real_vfs->xDlClose(real_vfs, h);
}

static int v_randomness(sqlite3_vfs *v, int n, char *out)
{
    (void)v;
    return real_vfs->xRandomness(real_vfs, n, out);
}

static int v_sleep(sqlite3_vfs *v, int us)
{
    (void)v;
    return real_vfs->xSleep(real_vfs, us);
}

static int v_current_time(sqlite3_vfs *v, double *t)
{
    (void)v;
    return real_vfs->xCurrentTime(real_vfs, t);
}

static int v_last_error(sqlite3_vfs *v, int n, char *msg)
{
    (void)v;
    return real_vfs->xGetLastError(real_vfs, n, msg);
}

static int v_current_time64(sqlite3_vfs *v, sqlite3_int64 *t)
{
    (void)v;
    return real_vfs->xCurrentTimeInt64(real_vfs, t);
}

static void vfs_init(void)
{
    real_vfs = sqlite3_vfs_find(NULL);
    if (real_vfs == NULL || real_vfs->iVersion < 2 || real_vfs->xCurrentTimeInt64 == NULL)
        return;
    vfs = (sqlite3_vfs){
        .iVersion = 2,
        .szOsFile = (int)(REAL_OFFSET + (size_t)real_vfs->szOsFile),
        .mxPathname = real_vfs->mxPathname,
        .zName = VFS_NAME,
        .xOpen = v_open,
        .xDelete = v_delete,
        .xAccess = v_access,
        .xFullPathname = v_full_pathname,
        .xDlOpen = v_dl_open,
        .xDlError = v_dl_error,
        .xDlSym = v_dl_sym,
        .xDlClose = v_dl_close,
        .xRandomness = v_randomness,
        .xSleep = v_sleep,
        .xCurrentTime = v_current_time,
        .xGetLastError = v_last_error,
        .xCurrentTimeInt64 = v_current_time64,
    };
    if (sqlite3_vfs_register(&vfs, 0) == SQLITE_OK)
        vfs_name = VFS_NAME;
}

const char *agw_store_vfs_name(void)
{
    pthread_once(&vfs_once, vfs_init);
    return vfs_name;
}

void agw_store_vfs_set_direct(bool on)
{
    __atomic_store_n(&allow_direct, on, __ATOMIC_RELAXED);
}

void agw_store_vfs_trim(sqlite3 *db)
{
    sqlite3_file *file = NULL;
    struct dfile *f;

    if (sqlite3_file_control(db, "main", SQLITE_FCNTL_FILE_POINTER, &file) != SQLITE_OK ||
        file == NULL || file->pMethods != &methods)
        return; /* not opened with this VFS */
    f = (struct dfile *)file;
    if (f->used == 0) /* nothing gathered: between two transactions, always */
        free_stage(f);
}

uint64_t agw_store_vfs_stage_bytes(void)
{
    return __atomic_load_n(&stage_bytes, __ATOMIC_RELAXED);
}

uint64_t agw_store_vfs_direct_bytes(void)
{
    return __atomic_load_n(&n_direct_bytes, __ATOMIC_RELAXED);
}

uint64_t agw_store_vfs_direct_writes(void)
{
    return __atomic_load_n(&n_direct_writes, __ATOMIC_RELAXED);
}

uint64_t agw_store_vfs_buffered_writes(void)
{
    return __atomic_load_n(&n_buffered_writes, __ATOMIC_RELAXED);
}
