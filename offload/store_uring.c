/* store_uring.c — the NVMe store: io_uring over preallocated files, O_DIRECT,
 * fixed files and (when asked) registered buffers (store.h).
 *
 * Layout. One linear address space striped over the folders with stripe
 * unit block_bytes: address a lies in stripe k = a / block_bytes, in folder
 * k % ndirs, at offset (k / ndirs) * block_bytes + a % block_bytes of that
 * folder's file <dir>/<prefix>.<n>. Each file is created 0600 with
 * O_EXCL|O_NOFOLLOW (never through a symlink, never over another file),
 * preallocated to ceil(stripes / ndirs) * block_bytes, and removed by destroy
 * (kept with keep_files: a checkpoint's data file, one folder, its own name).
 * Each folder's <prefix>.lock is held (flock) while the store is open: a
 * second store with the prefix is refused while the first runs, and files
 * left by a run that ended without removing them (killed) are removed when
 * the next one takes the lock. A store of a file with its own name
 * (file_name) takes no lock and removes nothing it did not create: its
 * folder is its caller's (a checkpoint's temporary folder).
 *
 * Ending. destroy removes the files and then the locks. A process that must
 * die at once (a second SIGINT) calls fso_store_unlink_created from its
 * signal handler: every file the process created to remove goes, then every
 * lock file it holds, in that order, so no other run can take a lock and
 * create a file of the same name before ours is gone; the kernel lets go of
 * the locks as the process dies. A leftover removed by the lock's reclaim
 * was never this process's and is never on those lists.
 *
 * Requests. prep_* takes one of queue_depth request slots (no allocation on
 * the hot path) and splits the request at stripe boundaries into parts,
 * one SQE each, drawn from a pool of as many parts as the ring has SQEs; a
 * request whose parts do not all fit waits in a FIFO and is issued as parts
 * come back. submit hands the batch over two SQEs per io_uring_enter: with
 * three or more the kernel plugs the batch and the block layer merges
 * neighbouring parts into one device request (up to the device's limit), so
 * 4 requests of 128 KiB reach the drive as one of 512 KiB; the merged ones
 * complete together and are resubmitted together, and the drive sees one
 * request at a time (fio submits one per call and keeps qd in flight). A
 * part that completes short or with -EAGAIN is reissued for the rest; a read
 * that hits end of file fails with -EIO. A request completes, whole, when all
 * of its parts have, with the first error of any. */
#include "store.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#define URING_MAX_QD 1024
#define URING_MAX_BLOCK ((size_t)1 << 30)
#define URING_REG_CHUNK ((size_t)1 << 30) /* largest buffer io_uring registers */
#define URING_CQE_BATCH 64
#define URING_SUBMIT_GROUP 2 /* SQEs per io_uring_enter; the kernel plugs above 2 */

typedef struct uring_req {
    uint64_t user;
    char *buf;
    uint64_t off;      /* store address */
    size_t len;
    size_t issued;     /* bytes handed to parts (all of len once abandoned) */
    int64_t err;       /* first error, 0 if none */
    int parts;         /* parts in flight */
    bool write;
    bool fixed;        /* inside the registered buffer */
    bool cut_short;    /* test hook: serve the first transfer short */
} uring_req;

typedef struct uring_part {
    char *buf;
    uint64_t file_off;
    uint32_t len, done; /* len <= block_bytes <= 1 GiB */
    int req;
    int dir;           /* fixed-file index */
    int buf_index;     /* registered buffer, -1 for plain I/O */
    bool cut;
} uring_part;

typedef struct uring_ctx {
    struct io_uring ring;
    bool ring_up;
    int ndirs;
    int fds[FSO_STORE_MAX_DIRS];
    bool created[FSO_STORE_MAX_DIRS];
    bool keep;         /* the files stay at destroy */
    char path[FSO_STORE_MAX_DIRS][PATH_MAX];
    int lock_fds[FSO_STORE_MAX_DIRS];   /* each folder's <prefix>.lock, held while open */
    char lock_path[FSO_STORE_MAX_DIRS][PATH_MAX];
    size_t block_bytes;
    uint64_t file_bytes;

    char *reg_base;    /* registered buffer area, NULL if none */
    size_t reg_len;

    int qd;
    uring_req *reqs;
    int *free_reqs, nfree_reqs;
    int *pending, pend_head, pend_n; /* requests with bytes not yet in parts */
    int *done, done_head, done_n;    /* completed, not reaped */
    int nparts;
    uring_part *parts;
    int *free_parts, nfree_parts;
    int prepped;       /* since the last submit */
    int short_countdown;
} uring_ctx;


/* ---- the hot path ---- */

static void uring_issue(uring_ctx *c, int pi)
{
    uring_part *p = &c->parts[pi];
    const uring_req *r = &c->reqs[p->req];
    struct io_uring_sqe *sqe = io_uring_get_sqe(&c->ring);
    FSO_BUG_ON(!sqe, "no free SQ entry; parts in flight never exceed the SQ entries");
    unsigned len = p->len - p->done;
    if (p->cut) {
        p->cut = false;
        unsigned half = len / 2 / FSO_IO_PAGE * FSO_IO_PAGE;
        if (half)
            len = half;
    }
    char *buf = p->buf + p->done;
    uint64_t off = p->file_off + p->done;
    if (p->buf_index >= 0) {
        if (r->write)
            io_uring_prep_write_fixed(sqe, p->dir, buf, len, off, p->buf_index);
        else
            io_uring_prep_read_fixed(sqe, p->dir, buf, len, off, p->buf_index);
    } else {
        if (r->write)
            io_uring_prep_write(sqe, p->dir, buf, len, off);
        else
            io_uring_prep_read(sqe, p->dir, buf, len, off);
    }
    sqe->flags |= IOSQE_FIXED_FILE;
    sqe->user_data = (uint64_t)pi;
}

static void uring_push_done(uring_ctx *c, int ri)
{
    c->done[(c->done_head + c->done_n++) % c->qd] = ri;
}

static int uring_ring_submit(fso_store *s)
{
    uring_ctx *c = s->ctx;
    for (;;) {
        int rc = io_uring_submit(&c->ring);
        if (rc >= 0 || (rc != -EINTR && rc != -EAGAIN))
            return rc < 0 ? fso_store_fail(s, rc, "uring store: io_uring_submit: %s", strerror(-rc)) : 0;
    }
}

/* Cuts queued requests into parts while parts are free and hands them,
 * with any reissued parts, to the kernel URING_SUBMIT_GROUP at a time.
 * 0 or -errno. */
static int uring_fill(fso_store *s)
{
    uring_ctx *c = s->ctx;
    uint64_t b = c->block_bytes;
    while (c->pend_n > 0 && c->nfree_parts > 0) {
        int ri = c->pending[c->pend_head];
        uring_req *r = &c->reqs[ri];
        if (r->err) {
            r->issued = r->len; /* abandon the rest */
        } else {
            uint64_t a = r->off + r->issued;
            uint64_t k = a / b, within = a % b;
            size_t n = r->len - r->issued;
            if (n > b - within)
                n = (size_t)(b - within);
            int pi = c->free_parts[--c->nfree_parts];
            uring_part *p = &c->parts[pi];
            p->buf = r->buf + r->issued;
            p->file_off = (k / (uint64_t)c->ndirs) * b + within;
            p->len = (uint32_t)n;
            p->done = 0;
            p->req = ri;
            p->dir = (int)(k % (uint64_t)c->ndirs);
            p->buf_index = -1;
            if (r->fixed) {
                size_t rel = (size_t)(p->buf - c->reg_base);
                if (rel / URING_REG_CHUNK == (rel + n - 1) / URING_REG_CHUNK)
                    p->buf_index = (int)(rel / URING_REG_CHUNK);
            }
            p->cut = r->cut_short;
            r->cut_short = false;
            r->issued += n;
            r->parts++;
            uring_issue(c, pi);
            if (io_uring_sq_ready(&c->ring) >= URING_SUBMIT_GROUP) {
                int rc = uring_ring_submit(s);
                if (rc < 0)
                    return rc;
            }
        }
        if (r->issued == r->len) {
            c->pend_head = (c->pend_head + 1) % c->qd;
            c->pend_n--;
            if (r->parts == 0)
                uring_push_done(c, ri);
        }
    }
    return io_uring_sq_ready(&c->ring) ? uring_ring_submit(s) : 0;
}

static void uring_fail_req(fso_store *s, uring_req *r, const uring_part *p, int rc, const char *why)
{
    uring_ctx *c = s->ctx;
    if (r->err)
        return;
    r->err = rc;
    fso_store_fail(s, rc, "%s: %s of %" PRIu32 " bytes at offset %" PRIu64 ": %s",
                   c->path[p->dir], r->write ? "write" : "read", p->len - p->done,
                   p->file_off + p->done, why ? why : strerror(-rc));
}

static void uring_handle(fso_store *s, const struct io_uring_cqe *cqe)
{
    uring_ctx *c = s->ctx;
    int pi = (int)cqe->user_data;
    FSO_BUG_ON(pi < 0 || pi >= c->nparts, "completion of part %d of %d", pi, c->nparts);
    uring_part *p = &c->parts[pi];
    uring_req *r = &c->reqs[p->req];
    int res = cqe->res;
    if (res == -EAGAIN || res == -EINTR) {
        s->resubmits++;
        uring_issue(c, pi);
        return;
    }
    if (res > 0) {
        p->done += (uint32_t)res;
        if (p->done < p->len) {
            s->resubmits++;
            uring_issue(c, pi);
            return;
        }
    } else if (res == 0) {
        uring_fail_req(s, r, p, -EIO, r->write
                       ? "the write made no progress"
                       : "end of file: the store's files were truncated or replaced while in use");
    } else {
        uring_fail_req(s, r, p, res, NULL);
    }
    c->free_parts[c->nfree_parts++] = pi;
    if (--r->parts == 0 && r->issued == r->len)
        uring_push_done(c, p->req);
}

static int uring_prep(fso_store *s, bool write, void *buf, size_t len, uint64_t off, uint64_t user)
{
    uring_ctx *c = s->ctx;
    int rc = fso_store_check(s, write ? "write" : "read", buf, len, off);
    if (rc < 0)
        return rc;
    int ri = c->free_reqs[--c->nfree_reqs];
    uring_req *r = &c->reqs[ri];
    *r = (uring_req){.user = user, .buf = buf, .off = off, .len = len, .write = write};
    r->fixed = c->reg_base && (char *)buf >= c->reg_base &&
               (size_t)((char *)buf - c->reg_base) <= c->reg_len &&
               len <= c->reg_len - (size_t)((char *)buf - c->reg_base);
    if (!write && c->short_countdown > 0 && --c->short_countdown == 0)
        r->cut_short = true;
    c->pending[(c->pend_head + c->pend_n++) % c->qd] = ri;
    s->inflight++;
    c->prepped++;
    return 0;
}

static int uring_prep_read(fso_store *s, void *buf, size_t len, uint64_t off, uint64_t user)
{
    return uring_prep(s, false, buf, len, off, user);
}

static int uring_prep_write(fso_store *s, const void *buf, size_t len, uint64_t off, uint64_t user)
{
    return uring_prep(s, true, (void *)buf, len, off, user);
}

static int uring_submit(fso_store *s)
{
    uring_ctx *c = s->ctx;
    int rc = uring_fill(s);
    if (rc < 0)
        return rc;
    int n = c->prepped;
    c->prepped = 0;
    return n;
}

static int uring_reap(fso_store *s, fso_io *out, int max, int min_complete)
{
    uring_ctx *c = s->ctx;
    if (min_complete > max || min_complete > s->inflight)
        return fso_store_fail(s, -EINVAL, "uring store: reap: waiting for %d completions with "
                              "room for %d and %d requests in flight", min_complete, max, s->inflight);
    int n = 0;
    for (;;) {
        for (; n < max && c->done_n > 0; n++, c->done_n--, c->done_head = (c->done_head + 1) % c->qd) {
            int ri = c->done[c->done_head];
            uring_req *r = &c->reqs[ri];
            out[n] = (fso_io){r->user, r->err ? r->err : (int64_t)r->len};
            if (!r->err) {
                if (r->write)
                    s->write_bytes += r->len;
                else
                    s->read_bytes += r->len;
            }
            c->free_reqs[c->nfree_reqs++] = ri;
            s->inflight--;
        }
        if (n >= max)
            break;
        struct io_uring_cqe *cqes[URING_CQE_BATCH];
        unsigned got = io_uring_peek_batch_cqe(&c->ring, cqes, URING_CQE_BATCH);
        if (got) {
            for (unsigned i = 0; i < got; i++)
                uring_handle(s, cqes[i]);
            io_uring_cq_advance(&c->ring, got);
            continue;
        }
        /* Nothing ready: start what waits (retries, queued parts), then wait. */
        int rc = uring_fill(s);
        if (rc < 0)
            return rc;
        if (n >= min_complete)
            break;
        struct io_uring_cqe *cqe;
        rc = io_uring_wait_cqe(&c->ring, &cqe);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN)
            return fso_store_fail(s, rc, "uring store: io_uring_wait_cqe: %s", strerror(-rc));
    }
    return n;
}

static int uring_unregister(uring_ctx *c)
{
    if (!c->reg_base)
        return 0;
    c->reg_base = NULL;
    c->reg_len = 0;
    return io_uring_unregister_buffers(&c->ring);
}

static int uring_register_buffers(fso_store *s, void *base, size_t len)
{
    uring_ctx *c = s->ctx;
    if (s->inflight)
        return fso_store_fail(s, -EBUSY, "uring store: register_buffers with %d requests in "
                              "flight; reap them first", s->inflight);
    uring_unregister(c);
    if (!base || len == 0)
        return 0;
    size_t n = (len + URING_REG_CHUNK - 1) / URING_REG_CHUNK;
    struct iovec *iov = calloc(n, sizeof *iov);
    if (!iov)
        return fso_store_fail(s, -ENOMEM, "uring store: register_buffers: out of memory");
    for (size_t i = 0; i < n; i++) {
        iov[i].iov_base = (char *)base + i * URING_REG_CHUNK;
        iov[i].iov_len = i + 1 < n ? URING_REG_CHUNK : len - i * URING_REG_CHUNK;
    }
    int rc = io_uring_register_buffers(&c->ring, iov, (unsigned)n);
    free(iov);
    if (rc < 0) {
        char want[32], lim[32];
        struct rlimit rl;
        fso_human_bytes(want, sizeof want, (double)(len));
        if (rc == -ENOMEM && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
            fso_human_bytes(lim, sizeof lim, (double)(rl.rlim_cur));
            return fso_store_fail(s, rc, "uring store: registering %s of I/O buffers: RLIMIT_MEMLOCK "
                                  "is %s; raise it (ulimit -l unlimited) for fixed-buffer I/O", want, lim);
        }
        return fso_store_fail(s, rc, "uring store: registering %s of I/O buffers: %s",
                              want, strerror(-rc));
    }
    c->reg_base = base;
    c->reg_len = len;
    return 0;
}

static int uring_inject_short_read(fso_store *s, int nth)
{
    uring_ctx *c = s->ctx;
    if (nth < 0)
        return -EINVAL;
    c->short_countdown = nth;
    return 0;
}

static int uring_file_extent(fso_store *s, uint64_t off, size_t len, int *fd, uint64_t *file_off,
                             size_t *contig)
{
    uring_ctx *c = s->ctx;
    if (off > s->capacity_bytes || len > s->capacity_bytes - off)
        return -EINVAL;
    uint64_t k = off / c->block_bytes, within = off % c->block_bytes;
    *fd = c->fds[k % (uint64_t)c->ndirs];
    *file_off = (k / (uint64_t)c->ndirs) * c->block_bytes + within;
    /* one folder: the stripes follow each other in its file */
    uint64_t run = c->ndirs == 1 ? len : c->block_bytes - within;
    *contig = run < len ? (size_t)run : len;
    return 0;
}

static int uring_flush(fso_store *s)
{
    uring_ctx *c = s->ctx;
    for (int d = 0; d < c->ndirs; d++)
        if (fdatasync(c->fds[d]) != 0)
            return fso_store_fail(s, -errno, "%s: flushing to the drive: %s", c->path[d],
                                  strerror(errno));
    return 0;
}

/* ---- the files to remove when the process ends at once ---- */

/* Pointers to the paths (in their store's context) of the files created to
 * be removed (TRACK_FILES) and of the lock files held (TRACK_LOCKS); NULL
 * entries are free. A signal handler reads them. */
enum { TRACK_FILES, TRACK_LOCKS };
static char *tracked[2][FSO_STORE_MAX_TRACKED];

static void track(int list, char *path)
{
    for (int i = 0; i < FSO_STORE_MAX_TRACKED; i++) {
        char *none = NULL;
        if (__atomic_compare_exchange_n(&tracked[list][i], &none, path, false,
                                        __ATOMIC_RELEASE, __ATOMIC_RELAXED))
            return;
    }
}

static void untrack(int list, const char *path)
{
    for (int i = 0; i < FSO_STORE_MAX_TRACKED; i++) {
        char *p = (char *)path;
        if (__atomic_compare_exchange_n(&tracked[list][i], &p, NULL, false, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED))
            return;
    }
}

void fso_store_unlink_created(void)
{
    for (int list = TRACK_FILES; list <= TRACK_LOCKS; list++) /* the files first */
        for (int i = 0; i < FSO_STORE_MAX_TRACKED; i++) {
            char *p = __atomic_load_n(&tracked[list][i], __ATOMIC_ACQUIRE);
            if (p)
                unlink(p);
        }
}

/* ---- open and destroy ---- */

static void uring_teardown(uring_ctx *c)
{
    if (c->ring_up) {
        uring_unregister(c);
        io_uring_queue_exit(&c->ring); /* also drops the fixed files */
    }
    for (int i = 0; i < c->ndirs; i++) {
        if (c->fds[i] >= 0)
            close(c->fds[i]);
        if (c->created[i] && !c->keep) {
            untrack(TRACK_FILES, c->path[i]);
            unlink(c->path[i]);
        }
    }
    for (int i = 0; i < c->ndirs; i++) { /* the files first: see "Ending" */
        if (c->lock_fds[i] >= 0) { /* unlinked while held: a waiter re-checks the path */
            untrack(TRACK_LOCKS, c->lock_path[i]);
            unlink(c->lock_path[i]);
            close(c->lock_fds[i]);
        }
    }
    free(c->reqs);
    free(c->free_reqs);
    free(c->pending);
    free(c->done);
    free(c->parts);
    free(c->free_parts);
    free(c);
}

static void uring_destroy(fso_store *s)
{
    /* Let requests still in flight finish before their buffers go away. */
    fso_io sink[16];
    while (s->inflight > 0 && uring_reap(s, sink, 16, 1) > 0)
        ;
    uring_teardown(s->ctx);
    free(s);
}

static int uring_grow(fso_store *s, uint64_t capacity_bytes);

static const fso_store_ops uring_ops = {
    .name = "uring",
    .prep_read = uring_prep_read,
    .prep_write = uring_prep_write,
    .submit = uring_submit,
    .reap = uring_reap,
    .register_buffers = uring_register_buffers,
    .inject_short_read = uring_inject_short_read,
    .file_extent = uring_file_extent,
    .flush = uring_flush,
    .grow = uring_grow,
    .destroy = uring_destroy,
};

#define OPEN_FAIL(rc_, ...)                      \
    do {                                         \
        snprintf(err, errlen, __VA_ARGS__);      \
        return (rc_);                            \
    } while (0)

/* Space free for an unprivileged user under dir, or UINT64_MAX if unknown. */
static uint64_t dir_free_bytes(const char *dir)
{
    struct statvfs v;
    if (statvfs(dir, &v) != 0)
        return UINT64_MAX;
    return (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
}

static int space_error(char *err, size_t errlen, const char *dir, uint64_t need, uint64_t capacity,
                       int ndirs)
{
    char n[32], f[32], cap[32];
    fso_human_bytes(n, sizeof n, (double)(need));
    fso_human_bytes(cap, sizeof cap, (double)(capacity));
    uint64_t avail = dir_free_bytes(dir);
    if (avail == UINT64_MAX)
        snprintf(f, sizeof f, "unknown");
    else
        fso_human_bytes(f, sizeof f, (double)(avail));
    OPEN_FAIL(-ENOSPC, "%s: not enough space: the store needs %s here (%s over %d folder%s), %s is "
              "free; free some space, lower the capacity or add folders to --nvme",
              dir, n, cap, ndirs, ndirs == 1 ? "" : "s", f);
}

/* Preallocate [0, bytes) of folder i's file (it holds file_bytes now). */
static int uring_extend(uring_ctx *c, int i, const char *dir, uint64_t bytes, uint64_t capacity,
                        char *err, size_t errlen)
{
    uint64_t avail = dir_free_bytes(dir);
    uint64_t more = bytes > c->file_bytes ? bytes - c->file_bytes : 0;
    if ((avail != UINT64_MAX && more > avail) || bytes > (uint64_t)INT64_MAX)
        return space_error(err, errlen, dir, bytes, capacity, c->ndirs);
    int e = fallocate(c->fds[i], 0, 0, (off_t)bytes) == 0 ? 0 : errno;
    if (e == EOPNOTSUPP || e == ENOSYS)
        e = posix_fallocate(c->fds[i], 0, (off_t)bytes);
    if (e == ENOSPC || e == EDQUOT || e == EFBIG)
        return space_error(err, errlen, dir, bytes, capacity, c->ndirs);
    if (e)
        OPEN_FAIL(-e, "%s: preallocating %s: %s", dir, c->path[i], strerror(e));
    return 0;
}

/* The store's lock in folder i: <dir>/<prefix>.lock, created if need be
 * and held (flock) for the store's life, so one running fsoff tells
 * another that its files are in use. The kernel lets go of it when the
 * process ends however it ends; so with the lock taken, files <prefix>.<n>
 * in the folder are a run's that is not running any more: they are
 * removed, with one notice. A lock held by a live run is a refusal. */
static int lock_folder(uring_ctx *c, int i, const char *dir, const char *prefix, char *err,
                       size_t errlen)
{
    char *lp = c->lock_path[i];
    int len = snprintf(lp, sizeof c->lock_path[i], "%s/%s.lock", dir, prefix);
    if (len < 0 || (size_t)len >= sizeof c->lock_path[i])
        OPEN_FAIL(-ENAMETOOLONG, "%s: folder name too long", dir);
    for (;;) {
        int fd = open(lp, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) {
            int e = errno;
            if (e == EACCES || e == EPERM || e == EROFS)
                OPEN_FAIL(-e, "%s: folder not writable (%s); fix its permissions or choose "
                          "another --nvme folder", dir, strerror(e));
            OPEN_FAIL(-e, "%s: cannot create %s: %s", dir, lp, strerror(e));
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            close(fd);
            if (e == EWOULDBLOCK)
                OPEN_FAIL(-EBUSY, "%s: in use by an fsoff that is running (it holds %s); "
                          "let it finish, or give this run another --nvme folder", dir, lp);
            OPEN_FAIL(-e, "%s: cannot lock %s: %s", dir, lp, strerror(e));
        }
        /* the previous holder may have removed the file as it let go: the
         * lock counts only on the file that is still there */
        struct stat held, now;
        if (fstat(fd, &held) == 0 && stat(lp, &now) == 0 && held.st_dev == now.st_dev &&
            held.st_ino == now.st_ino) {
            c->lock_fds[i] = fd;
            track(TRACK_LOCKS, lp);
            break;
        }
        close(fd);
    }
    /* what a run that is gone left behind */
    DIR *d = opendir(dir);
    char removed[512] = "";
    size_t off = 0, plen = strlen(prefix);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        const char *name = de->d_name;
        struct stat st;
        if (strncmp(name, prefix, plen) != 0 || name[plen] != '.' || !name[plen + 1] ||
            strspn(name + plen + 1, "0123456789") != strlen(name + plen + 1))
            continue;
        /* only what fsoff makes: a regular file of this user (never a link) */
        if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
            st.st_uid != geteuid())
            continue;
        if (unlinkat(dirfd(d), name, 0) == 0) {
            n++;
            if (off < sizeof removed)
                off += (size_t)snprintf(removed + off, sizeof removed - off, "%s%s",
                                        off ? ", " : "", name);
        }
    }
    if (d)
        closedir(d);
    if (n)
        fprintf(stderr, "fsoff: notice: %s: removed %s, left by an fsoff run that is no longer "
                        "running\n", dir, removed);
    return 0;
}

static int uring_open_file(fso_store *s, uring_ctx *c, int i, const fso_store_opts *o,
                           char *err, size_t errlen)
{
    const char *dir = o->dirs[i];
    const char *prefix = o->file_prefix ? o->file_prefix : "fsoff-store";
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            OPEN_FAIL(-ENOENT, "%s: no such folder; create it or fix --nvme", dir);
        OPEN_FAIL(-errno, "%s: cannot use this folder: %s; fix its permissions or fix --nvme",
                  dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        OPEN_FAIL(-ENOTDIR, "%s: not a folder; --nvme takes folders (comma-separated)", dir);
    int len = o->file_name ? snprintf(c->path[i], sizeof c->path[i], "%s/%s", dir, o->file_name)
                           : snprintf(c->path[i], sizeof c->path[i], "%s/%s.%d", dir, prefix, i);
    if (len < 0 || (size_t)len >= sizeof c->path[i])
        OPEN_FAIL(-ENAMETOOLONG, "%s: folder name too long", dir);
    int rc = o->file_name ? 0 : lock_folder(c, i, dir, prefix, err, errlen);
    if (rc < 0)
        return rc;

    const bool existing = o->file_name && o->keep_files && o->existing;
    int fd = existing ? open(c->path[i], O_RDWR | O_NOFOLLOW | O_CLOEXEC)
                      : open(c->path[i], O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        if (e == EEXIST) /* not ours: the lock keeps fsoff's own away */
            OPEN_FAIL(-EEXIST, "%s: %s already exists and is not fsoff's; move it away or "
                      "choose another --nvme folder", dir, c->path[i]);
        if (e == EACCES || e == EPERM || e == EROFS)
            OPEN_FAIL(-e, "%s: folder not writable (%s); fix its permissions or choose another "
                      "--nvme folder", dir, strerror(e));
        if (e == ENOSPC || e == EDQUOT)
            return space_error(err, errlen, dir, c->file_bytes, s->capacity_bytes, c->ndirs);
        OPEN_FAIL(-e, "%s: cannot create %s: %s", dir, c->path[i], strerror(e));
    }
    c->fds[i] = fd;
    c->created[i] = !existing;
    if (!c->keep)
        track(TRACK_FILES, c->path[i]);

    if (o->direct) {
        /* Set after creating, so a refusal leaves nothing to clean up. */
        rc = o->refuse_direct ? -1 : fcntl(fd, F_SETFL, O_DIRECT);
        if (rc != 0 && (o->refuse_direct || errno == EINVAL)) {
            fprintf(stderr, "fsoff: warning: %s: the filesystem does not support O_DIRECT; using "
                    "buffered I/O (slower, uses page cache)\n", dir);
            s->direct = false;
        } else if (rc != 0) {
            OPEN_FAIL(-errno, "%s: cannot enable O_DIRECT on %s: %s", dir, c->path[i], strerror(errno));
        }
    }

    uint64_t want = c->file_bytes;
    c->file_bytes = 0; /* nothing preallocated yet */
    rc = uring_extend(c, i, dir, want, s->capacity_bytes, err, errlen);
    c->file_bytes = want;
    return rc;
}

static int uring_alloc_queues(uring_ctx *c)
{
    c->reqs = calloc((size_t)c->qd, sizeof *c->reqs);
    c->free_reqs = calloc((size_t)c->qd, sizeof *c->free_reqs);
    c->pending = calloc((size_t)c->qd, sizeof *c->pending);
    c->done = calloc((size_t)c->qd, sizeof *c->done);
    c->parts = calloc((size_t)c->nparts, sizeof *c->parts);
    c->free_parts = calloc((size_t)c->nparts, sizeof *c->free_parts);
    if (!c->reqs || !c->free_reqs || !c->pending || !c->done || !c->parts || !c->free_parts)
        return -ENOMEM;
    for (int i = c->qd - 1; i >= 0; i--)
        c->free_reqs[c->nfree_reqs++] = i;
    for (int i = c->nparts - 1; i >= 0; i--)
        c->free_parts[c->nfree_parts++] = i;
    return 0;
}

static int uring_setup_ring(uring_ctx *c, const fso_store_opts *o, char *err, size_t errlen)
{
    unsigned entries = 32;
    while (entries < (unsigned)c->qd * 4)
        entries *= 2;
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_CLAMP | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN;
    int rc = io_uring_queue_init_params(entries, &c->ring, &p);
    if (rc == -EINVAL) { /* kernels before 5.19 */
        memset(&p, 0, sizeof p);
        p.flags = IORING_SETUP_CLAMP;
        rc = io_uring_queue_init_params(entries, &c->ring, &p);
    }
    if (rc < 0)
        OPEN_FAIL(rc, "io_uring is not available (%s); check sysctl kernel.io_uring_disabled, "
                  "the container's seccomp profile and ulimit -l", strerror(-rc));
    c->ring_up = true;
    /* Every part in flight holds at most one SQE and one CQE. */
    c->nparts = (int)(p.sq_entries < p.cq_entries ? p.sq_entries : p.cq_entries);
    rc = io_uring_register_files(&c->ring, c->fds, (unsigned)c->ndirs);
    if (rc < 0)
        OPEN_FAIL(rc, "io_uring: registering the store's files: %s", strerror(-rc));
    /* Buffered I/O and O_DIRECT requests that cannot go inline run on the
     * ring's io-wq workers: near the drives (best effort: kernels before
     * 5.14 have no such call, and the ring works the same without it). */
    if (o->iowq_cpus)
        io_uring_register_iowq_aff(&c->ring, sizeof(cpu_set_t), o->iowq_cpus);
    return 0;
}

static int uring_open(fso_store *s, uring_ctx *c, const fso_store_opts *o, char *err, size_t errlen)
{
    if (o->ndirs < 1 || o->ndirs > FSO_STORE_MAX_DIRS)
        OPEN_FAIL(-EINVAL, "nvme store: %d folders; give 1 to %d", o->ndirs, FSO_STORE_MAX_DIRS);
    for (int i = 0; i < o->ndirs; i++)
        if (!o->dirs[i] || !o->dirs[i][0])
            OPEN_FAIL(-EINVAL, "nvme store: folder %d is empty; fix --nvme", i + 1);
    if (o->block_bytes == 0 || o->block_bytes % FSO_IO_PAGE || o->block_bytes > URING_MAX_BLOCK)
        OPEN_FAIL(-EINVAL, "nvme store: block size %zu: must be a multiple of %d up to 1 GiB "
                  "(aio.block_size)", o->block_bytes, FSO_IO_PAGE);
    if (o->queue_depth < 1 || o->queue_depth > URING_MAX_QD)
        OPEN_FAIL(-EINVAL, "nvme store: queue depth %d: must be 1 to %d (aio.queue_depth)",
                  o->queue_depth, URING_MAX_QD);
    if (o->capacity_bytes == 0)
        OPEN_FAIL(-EINVAL, "nvme store: capacity 0; nothing to store");
    if (o->file_prefix && (!o->file_prefix[0] || strchr(o->file_prefix, '/')))
        OPEN_FAIL(-EINVAL, "nvme store: file prefix \"%s\": must be a plain non-empty name",
                  o->file_prefix);
    if (o->file_name && (!o->file_name[0] || strchr(o->file_name, '/') || o->ndirs != 1))
        OPEN_FAIL(-EINVAL, "nvme store: file name \"%s\": must be a plain non-empty name, in "
                  "one folder", o->file_name);
    for (int i = 0; i < o->ndirs; i++)
        for (int j = 0; j < i; j++)
            if (strcmp(o->dirs[i], o->dirs[j]) == 0)
                OPEN_FAIL(-EINVAL, "%s: named twice in --nvme", o->dirs[i]);

    uint64_t stripes = (o->capacity_bytes + o->block_bytes - 1) / o->block_bytes;
    uint64_t per_dir = (stripes + (uint64_t)o->ndirs - 1) / (uint64_t)o->ndirs;
    c->ndirs = o->ndirs;
    c->keep = o->keep_files;
    c->block_bytes = o->block_bytes;
    c->file_bytes = per_dir * o->block_bytes;
    c->qd = o->queue_depth;

    int rc = 0;
    for (int i = 0; i < o->ndirs && rc == 0; i++)
        rc = uring_open_file(s, c, i, o, err, errlen);
    if (rc == 0)
        rc = uring_setup_ring(c, o, err, errlen);
    if (rc == 0 && uring_alloc_queues(c) < 0)
        OPEN_FAIL(-ENOMEM, "nvme store: out of memory for %d request slots", c->qd);
    return rc;
}

int fso_store_open_uring(fso_store **out, const fso_store_opts *opts, char *err, size_t errlen)
{
    char scratch[FSO_STORE_ERR_MAX];
    if (!err || errlen == 0) {
        err = scratch;
        errlen = sizeof scratch;
    }
    err[0] = '\0';
    *out = NULL;
    fso_store *s = calloc(1, sizeof *s);
    uring_ctx *c = calloc(1, sizeof *c);
    if (!s || !c) {
        free(s);
        free(c);
        snprintf(err, errlen, "nvme store: out of memory");
        return -ENOMEM;
    }
    for (int i = 0; i < FSO_STORE_MAX_DIRS; i++)
        c->fds[i] = c->lock_fds[i] = -1;
    s->ops = &uring_ops;
    s->ctx = c;
    s->capacity_bytes = opts->capacity_bytes;
    s->align = FSO_IO_PAGE;
    s->queue_depth = opts->queue_depth;
    s->direct = opts->direct;
    int rc = uring_open(s, c, opts, err, errlen);
    if (rc < 0) {
        uring_teardown(c); /* closes and unlinks what was created */
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* Files grow in place: the layout (stripe k in folder k % ndirs at
 * (k / ndirs) * block_bytes) does not depend on the capacity, so every
 * address keeps its bytes. */
static int uring_grow(fso_store *s, uint64_t capacity_bytes)
{
    uring_ctx *c = s->ctx;
    uint64_t stripes = (capacity_bytes + c->block_bytes - 1) / c->block_bytes;
    uint64_t per_dir = (stripes + (uint64_t)c->ndirs - 1) / (uint64_t)c->ndirs;
    uint64_t bytes = per_dir * c->block_bytes;
    char err[2 * PATH_MAX + 128];
    if (bytes > c->file_bytes) {
        for (int i = 0; i < c->ndirs; i++) {
            char dir[PATH_MAX];
            snprintf(dir, sizeof dir, "%s", c->path[i]);
            char *slash = strrchr(dir, '/');
            if (slash)
                *slash = 0;
            int rc = uring_extend(c, i, dir, bytes, capacity_bytes, err, sizeof err);
            if (rc < 0)
                return fso_store_fail(s, rc, "%s", err);
        }
        c->file_bytes = bytes;
    }
    s->capacity_bytes = capacity_bytes;
    return 0;
}
