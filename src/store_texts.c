/* The embedded store's long texts (src/store_texts.h): pieces of messages appended to segment
 * files, <store>/history.texts/<n>, out of SQLite's pages.
 *
 * Why: a streamed answer written into SQLite is copied five times on its way to the disk (bound
 * into a record, the record into the B-tree's overflow pages, which are zeroed first, the pages
 * gathered for the direct write: doc/internals/store.md); appended here it is copied once, into an
 * aligned buffer that the device reads itself (O_DIRECT). The benchmark's streamed answers (400
 * KB each) took the writer's CPU from 0.27 to 0.13 s per million events with the texts not
 * written at all: that is the part SQLite's copies were.
 *
 * How a commit stays whole: the pieces a transaction appends are written and synced
 * (agw_texts_sync()) before the database commits the rows that point at them and the segment's new
 * size. What a segment holds past the size the database says is a commit that did not happen: cut
 * at start, written over by the next appends. A segment's last block, partly filled, is written
 * again whole by the next commit (direct writes are whole blocks): its committed bytes are
 * written again as they were, so a write torn by a crash leaves them intact whichever of its
 * sectors reached the disk.
 *
 * A file system that refuses O_DIRECT (tmpfs at the open, any other with EINVAL at a write) gets
 * plain writes, and what they leave in the page cache is let go after each sync. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agw/common.h"
#include "agw/log.h"
#include "store_texts.h"

#define BLOCK     4096u      /* direct writes: offsets, lengths and the buffer's address */
#define BUF_BYTES (1u << 20) /* appends gathered before a write; a multiple of BLOCK */

struct agw_texts {
    char *dir; /* <store>/history.texts */
    int dir_fd;
    uint64_t segment_bytes;
    bool allow_direct;
    /* the segment appended to (0 before agw_texts_ready()) */
    uint64_t seg;
    int wfd; /* its descriptor for writes: O_DIRECT when <direct> */
    bool direct;
    uint64_t committed; /* its bytes the database counts */
    uint64_t bytes;     /* committed in every segment */
    /* <buf> holds the segment's bytes [base, base + len): base is a multiple of BLOCK, the bytes
     * before <committed> in it are the committed last block's (written again with what follows).
     * Between transactions it may be NULL (none made yet, or trimmed): <tail> holds those bytes. */
    uint64_t base;
    char *buf;
    size_t len;
    bool dirty;        /* appended to in this transaction */
    uint64_t from;     /* where its writes began (<base> at its first append) */
    char tail[BLOCK];  /* the committed bytes of the segment's last block */
    size_t tail_len;   /* committed - base when nothing is pending */
    uint64_t *adopted; /* the segments the database lists, in increasing order (until ready) */
    size_t n_adopted, cap_adopted;
    uint64_t rseg; /* the segment <rfd> reads; 0 = none */
    int rfd;
};

static size_t tune_min;
static uint64_t tune_segment_bytes;
static bool tune_no_direct, tune_gc_every_commit;
static uint64_t n_appended, n_direct; /* atomic */
static uint64_t n_buffer_bytes;       /* atomic: the append buffers held, every store's */

void agw_store_texts_tune(size_t min, uint64_t segment_bytes, bool no_direct, bool gc_every_commit)
{
    tune_min = min;
    tune_segment_bytes = segment_bytes;
    tune_no_direct = no_direct;
    tune_gc_every_commit = gc_every_commit;
}

bool agw_store_texts_gc_every_commit(void)
{
    return tune_gc_every_commit;
}

size_t agw_store_texts_min(void)
{
    return tune_min > 0 ? tune_min : AGW_TEXTS_MIN;
}

void agw_store_texts_counts(uint64_t *appended, uint64_t *direct)
{
    *appended = __atomic_load_n(&n_appended, __ATOMIC_RELAXED);
    *direct = __atomic_load_n(&n_direct, __ATOMIC_RELAXED);
}

static uint64_t block_down(uint64_t x)
{
    return x & ~(uint64_t)(BLOCK - 1);
}

static void name_of(uint64_t seg, char name[24])
{
    snprintf(name, 24, "%08" PRIu64, seg);
}

struct agw_texts *agw_texts_open(const char *store_dir, char *err, size_t errlen)
{
    struct agw_texts *t = agw_xcalloc(1, sizeof(*t));
    size_t n = strlen(store_dir) + sizeof("/history.texts");

    t->dir = agw_xmalloc(n);
    snprintf(t->dir, n, "%s/history.texts", store_dir);
    t->dir_fd = t->wfd = t->rfd = -1;
    t->segment_bytes = tune_segment_bytes > 0 ? tune_segment_bytes : AGW_TEXTS_SEGMENT_BYTES;
    t->allow_direct = !tune_no_direct;
    if (mkdir(t->dir, 0750) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "store.path: cannot create the directory %s: %s", t->dir,
                 strerror(errno));
        agw_texts_close(t);
        return NULL;
    }
    t->dir_fd = open(t->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (t->dir_fd < 0) {
        snprintf(err, errlen, "store.path: %s: cannot open: %s", t->dir, strerror(errno));
        agw_texts_close(t);
        return NULL;
    }
    return t;
}

void agw_texts_close(struct agw_texts *t)
{
    if (t == NULL)
        return;
    if (t->wfd >= 0)
        close(t->wfd);
    if (t->rfd >= 0)
        close(t->rfd);
    if (t->dir_fd >= 0)
        close(t->dir_fd);
    free(t->adopted);
    t->dirty = false;
    agw_texts_trim(t);
    free(t->dir);
    free(t);
}

int agw_texts_adopt(struct agw_texts *t, uint64_t seg, uint64_t size, char *err, size_t errlen)
{
    char name[24];
    struct stat st;

    name_of(seg, name);
    if (fstatat(t->dir_fd, name, &st, 0) != 0) {
        snprintf(err, errlen,
                 "store.path: %s/%s: %s, but the database keeps %" PRIu64
                 " bytes of texts in it (a file of the store was lost)",
                 t->dir, name, strerror(errno), size);
        return -1;
    }
    if ((uint64_t)st.st_size < size) {
        snprintf(err, errlen,
                 "store.path: %s/%s holds %lld bytes, but the database keeps %" PRIu64
                 " in it (the file was cut)",
                 t->dir, name, (long long)st.st_size, size);
        return -1;
    }
    if (t->n_adopted == t->cap_adopted) {
        t->cap_adopted = t->cap_adopted > 0 ? 2 * t->cap_adopted : 16;
        t->adopted = agw_xrealloc(t->adopted, t->cap_adopted * sizeof(*t->adopted));
    }
    t->adopted[t->n_adopted++] = seg;
    t->seg = seg;
    t->committed = size;
    t->bytes += size;
    return 0;
}

static bool was_adopted(const struct agw_texts *t, uint64_t seg)
{
    size_t lo = 0, hi = t->n_adopted;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->adopted[mid] == seg)
            return true;
        if (t->adopted[mid] < seg)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

/* Opens segment <seg> for appends (made empty when <create>): <t->wfd>, direct when allowed and
 * the file system takes it. */
static int open_for_writes(struct agw_texts *t, uint64_t seg, bool create)
{
    char name[24];
    int flags = O_WRONLY | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0), fd = -1;

    name_of(seg, name);
#ifdef O_DIRECT
    if (t->allow_direct)
        fd = openat(t->dir_fd, name, flags | O_DIRECT, 0640);
#endif
    t->direct = fd >= 0;
    if (fd < 0 && (fd = openat(t->dir_fd, name, flags, 0640)) < 0)
        return -1;
    if (create && fsync(t->dir_fd) != 0) { /* the file's name must outlive a crash too */
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (t->wfd >= 0)
        close(t->wfd);
    t->wfd = fd;
    return 0;
}

/* Reads <len> bytes at <off> of segment <seg>, through the descriptor kept for reads. */
static int read_at(struct agw_texts *t, uint64_t seg, uint64_t off, size_t len, char *out)
{
    if (t->rseg != seg) {
        char name[24];

        if (t->rfd >= 0)
            close(t->rfd);
        name_of(seg, name);
        t->rfd = openat(t->dir_fd, name, O_RDONLY | O_CLOEXEC);
        t->rseg = t->rfd >= 0 ? seg : 0;
        if (t->rfd < 0)
            return -1;
    }
    while (len > 0) {
        ssize_t n = pread(t->rfd, out, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = EIO; /* past the file's end */
            return -1;
        }
        out += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

/* The segment appended to starts at its committed size: its last block's committed bytes held. */
static int start_at_committed(struct agw_texts *t)
{
    t->base = block_down(t->committed);
    t->tail_len = (size_t)(t->committed - t->base);
    if (t->tail_len > 0 && read_at(t, t->seg, t->base, t->tail_len, t->tail) != 0)
        return -1;
    if (t->buf != NULL)
        memcpy(t->buf, t->tail, t->tail_len);
    t->len = t->tail_len;
    t->dirty = false;
    agw_texts_reads_done(t);
    return 0;
}

int agw_texts_ready(struct agw_texts *t, char *err, size_t errlen)
{
    DIR *d;
    struct dirent *e;
    int fd = dup(t->dir_fd);

    /* the files of segments the database does not list: nothing refers to them */
    if (fd < 0 || (d = fdopendir(fd)) == NULL) {
        if (fd >= 0)
            close(fd);
        snprintf(err, errlen, "store.path: %s: cannot list: %s", t->dir, strerror(errno));
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        char *end;
        unsigned long long seg;

        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        seg = strtoull(e->d_name, &end, 10);
        if (*end != '\0' || was_adopted(t, seg))
            continue;
        if (unlinkat(t->dir_fd, e->d_name, 0) != 0)
            agw_log_warn("thread history: %s/%s: cannot delete: %s", t->dir, e->d_name,
                         strerror(errno));
    }
    closedir(d);
    free(t->adopted); /* needed for the sweep alone */
    t->adopted = NULL;
    t->n_adopted = t->cap_adopted = 0;
    if (t->seg == 0) {
        t->seg = 1;
        t->committed = 0;
        if (open_for_writes(t, t->seg, true) != 0)
            goto fail;
    } else if (open_for_writes(t, t->seg, false) != 0 ||
               ftruncate(t->wfd, (off_t)t->committed) != 0) {
        goto fail;
    }
    if (start_at_committed(t) != 0)
        goto fail;
    return 0;
fail:
    snprintf(err, errlen, "store.path: %s/%08" PRIu64 ": cannot write to it: %s", t->dir, t->seg,
             strerror(errno));
    return -1;
}

/* Writes <n> bytes of the buffer at the segment's <off>: directly when it can (whole blocks), else
 * through the page cache. */
static int write_out(struct agw_texts *t, size_t n, uint64_t off)
{
    size_t done = 0;

    while (done < n) {
        ssize_t k = pwrite(t->wfd, t->buf + done, n - done, (off_t)(off + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno == EINVAL && t->direct) {
            /* a file system that takes O_DIRECT at the open but not this write: plain from now */
            agw_log_info("thread history: %s: direct writes refused, the page cache is used",
                         t->dir);
            t->allow_direct = false;
            if (open_for_writes(t, t->seg, false) != 0)
                return -1;
            t->direct = false;
            continue;
        }
        if (k <= 0) {
            if (k == 0)
                errno = EIO;
            return -1;
        }
        if (t->direct)
            __atomic_add_fetch(&n_direct, (uint64_t)k, __ATOMIC_RELAXED);
        done += (size_t)k;
    }
    return 0;
}

/* The buffer is full: its blocks are written, and it starts again past them. */
static int flush_full(struct agw_texts *t)
{
    if (write_out(t, t->len, t->base) != 0)
        return -1;
    t->base += t->len;
    t->len = 0;
    return 0;
}

/* A segment that is full: appends move to the next, made now (between two transactions: nothing
 * is pending). Kept on the full one when the next cannot be made. */
static void roll(struct agw_texts *t)
{
    uint64_t next = t->seg + 1;

    if (open_for_writes(t, next, true) != 0) {
        agw_log_error("thread history: %s/%08" PRIu64 ": cannot create: %s (texts go on in the "
                      "segment before)",
                      t->dir, next, strerror(errno));
        return;
    }
    t->seg = next;
    t->committed = t->base = 0;
    t->len = t->tail_len = 0;
}

int agw_texts_append(struct agw_texts *t, const char *p, size_t n, uint64_t *seg, uint64_t *off)
{
    if (!t->dirty) {
        if (t->committed >= t->segment_bytes)
            roll(t);
        t->dirty = true;
        t->from = t->base;
        if (t->buf == NULL) {
            t->buf = agw_xaligned_alloc(BLOCK, BUF_BYTES);
            __atomic_add_fetch(&n_buffer_bytes, BUF_BYTES, __ATOMIC_RELAXED);
            memcpy(t->buf, t->tail, t->tail_len);
        }
    }
    *seg = t->seg;
    *off = t->base + t->len;
    __atomic_add_fetch(&n_appended, (uint64_t)n, __ATOMIC_RELAXED);
    while (n > 0) {
        size_t k = BUF_BYTES - t->len;

        if (k == 0) {
            if (flush_full(t) != 0)
                return -1;
            continue;
        }
        if (k > n)
            k = n;
        memcpy(t->buf + t->len, p, k);
        t->len += k;
        p += k;
        n -= k;
    }
    return 0;
}

bool agw_texts_pending(const struct agw_texts *t, uint64_t *seg, uint64_t *size)
{
    *seg = t->seg;
    *size = t->base + t->len;
    return t->dirty;
}

int agw_texts_sync(struct agw_texts *t)
{
    size_t n = t->len, keep;

    if (!t->dirty)
        return 0;
    if (t->direct) { /* whole blocks: the last one padded (written again by the next commit) */
        size_t whole = (n + BLOCK - 1) & ~(size_t)(BLOCK - 1);
        memset(t->buf + n, 0, whole - n);
        n = whole;
    }
    if (write_out(t, n, t->base) != 0 || fdatasync(t->wfd) != 0)
        return -1;
    if (!t->direct) /* on the disk now, and read back rarely */
        (void)posix_fadvise(t->wfd, (off_t)t->from, (off_t)(t->base + t->len - t->from),
                            POSIX_FADV_DONTNEED);
    /* the last block, partly filled, stays at the buffer's start */
    keep = t->len - (size_t)block_down(t->len);
    memmove(t->buf, t->buf + (t->len - keep), keep);
    t->base += t->len - keep;
    t->len = keep;
    return 0;
}

void agw_texts_committed(struct agw_texts *t)
{
    if (!t->dirty)
        return;
    t->bytes += t->base + t->len - t->committed;
    t->committed = t->base + t->len;
    memcpy(t->tail, t->buf, t->len);
    t->tail_len = t->len;
    t->dirty = false;
}

void agw_texts_trim(struct agw_texts *t)
{
    if (t->dirty || t->buf == NULL)
        return;
    free(t->buf);
    t->buf = NULL;
    __atomic_sub_fetch(&n_buffer_bytes, BUF_BYTES, __ATOMIC_RELAXED);
}

uint64_t agw_store_texts_buffer_bytes(void)
{
    return __atomic_load_n(&n_buffer_bytes, __ATOMIC_RELAXED);
}

void agw_texts_rolled_back(struct agw_texts *t)
{
    if (!t->dirty)
        return;
    t->base = block_down(t->committed);
    memcpy(t->buf, t->tail, t->tail_len);
    t->len = t->tail_len;
    t->dirty = false;
}

int agw_texts_read(struct agw_texts *t, uint64_t seg, uint64_t off, size_t len, char *out)
{
    char name[24];

    if (read_at(t, seg, off, len, out) == 0)
        return 0;
    name_of(seg, name);
    agw_log_error("thread history: %s/%s: cannot read %zu bytes at %" PRIu64 ": %s", t->dir, name,
                  len, off, strerror(errno));
    return -1;
}

void agw_texts_reads_done(struct agw_texts *t)
{
    if (t->rfd >= 0)
        close(t->rfd);
    t->rfd = -1;
    t->rseg = 0;
}

uint64_t agw_texts_bytes(const struct agw_texts *t)
{
    return t->bytes;
}

uint64_t agw_texts_current(const struct agw_texts *t)
{
    return t->seg;
}

void agw_texts_remove(struct agw_texts *t, uint64_t seg, uint64_t size)
{
    char name[24];

    t->bytes -= size <= t->bytes ? size : t->bytes;
    if (t->rseg == seg)
        agw_texts_reads_done(t);
    name_of(seg, name);
    if (unlinkat(t->dir_fd, name, 0) != 0 && errno != ENOENT)
        agw_log_warn("thread history: %s/%s: cannot delete: %s", t->dir, name, strerror(errno));
}
