/* store.h — the storage interface (ARCHITECTURE.md, The seams): where offloaded shards live
 * when they are not in memory.
 *
 * A store is one linear byte address space [0, capacity_bytes) backed by
 * files (NVMe), by memory, or by another store with faults injected. Callers
 * queue reads and writes of whole aligned ranges, submit them in batches and
 * reap completions, like io_uring:
 *
 *   prep_read / prep_write   queue one request (buf, len and off multiples of
 *                            store->align; buf stays valid until reaped)
 *   submit                   hand everything queued to the kernel
 *   reap                     collect finished requests, waiting for at
 *                            least min_complete of them
 *
 * A request completes whole: the implementation resubmits short transfers
 * and -EAGAIN itself, so fso_io.res is the full length or a negative errno.
 * Requests are independent; a caller that needs ordering (write then read of
 * one range) waits for the first before queueing the second.
 */
#ifndef FSO_STORE_H
#define FSO_STORE_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FSO_STORE_ERR_MAX 512
#define FSO_STORE_MAX_DIRS 16

typedef struct fso_store fso_store;

typedef struct fso_io {
    uint64_t user;          /* the caller's tag from prep_* */
    int64_t res;            /* bytes transferred (the full length) or -errno */
} fso_io;

typedef struct fso_store_ops {
    const char *name;       /* "uring", "mem", "faults" */
    /* 0, -EBUSY when queue_depth requests are already in flight (reap
     * first), -EINVAL for a misaligned or out-of-range request. */
    int (*prep_read)(fso_store *s, void *buf, size_t len, uint64_t off, uint64_t user);
    int (*prep_write)(fso_store *s, const void *buf, size_t len, uint64_t off, uint64_t user);
    /* Number of requests handed over, or -errno. */
    int (*submit)(fso_store *s);
    /* Up to max completions into out; blocks until min_complete are there
     * (requests still queued are submitted first). -EINVAL when
     * min_complete exceeds max or the requests in flight. Returns the
     * count, or -errno if the store itself failed. */
    int (*reap)(fso_store *s, fso_io *out, int max, int min_complete);
    /* Tell the store that [base, base+len) will be used for I/O buffers
     * (io_uring registers it and uses fixed-buffer reads and writes).
     * Optional: may be NULL. Returns 0 or -errno. */
    int (*register_buffers)(fso_store *s, void *base, size_t len);
    /* Make [0, capacity_bytes) usable, keeping what [0, old capacity) holds
     * (a re-plan that moves more state here). The store must be idle.
     * 0, or -errno with the message in s->err (-ENOSPC names the folder and
     * what is free). */
    int (*grow)(fso_store *s, uint64_t capacity_bytes);
    /* Test hook, optional (NULL where the store has no resubmission path):
     * the nth read prepared from now has its first transfer cut short, so
     * the store's own short-transfer resubmission runs. Returns 0 or -errno. */
    int (*inject_short_read)(fso_store *s, int nth);
    /* Where the store's bytes [off, off+len) lie: the file descriptor and
     * offset of the first byte, and in *contig how many bytes from there
     * are contiguous in that file (at most len). What a reflink (an
     * ioctl FICLONERANGE between two stores' files) needs. Optional: NULL
     * where the store is not files (memory). 0 or -errno. */
    int (*file_extent)(fso_store *s, uint64_t off, size_t len, int *fd, uint64_t *file_off,
                       size_t *contig);
    /* Make the writes completed so far durable (fdatasync of every file):
     * what a write rate is timed to when it must be the rate the drive
     * drains at, not a cache's in front of it. Optional: NULL where there is
     * nothing to flush (memory). 0 or -errno (message in s->err). */
    int (*flush)(fso_store *s);
    void (*destroy)(fso_store *s);
} fso_store_ops;

struct fso_store {
    const fso_store_ops *ops;
    void *ctx;
    uint64_t capacity_bytes;
    size_t align;           /* 4096 for O_DIRECT stores */
    int queue_depth;        /* requests in flight at most */
    int inflight;           /* requests prepared and not yet reaped */
    bool direct;            /* O_DIRECT on every file (false after the fallback) */
    uint64_t read_bytes, write_bytes; /* completed, for reports */
    uint64_t resubmits;     /* short transfers and -EAGAIN retried */
    char err[FSO_STORE_ERR_MAX];
};

typedef struct fso_store_opts {
    const char *dirs[FSO_STORE_MAX_DIRS]; /* NVMe folders; striped in order */
    int ndirs;
    uint64_t capacity_bytes;  /* preallocated, split evenly over the folders */
    size_t block_bytes;       /* stripe unit and largest single I/O (aio.block_size) */
    int queue_depth;          /* aio.queue_depth */
    bool direct;              /* O_DIRECT; falls back to buffered with one warning */
    const char *file_prefix;  /* file names: <dir>/<prefix>.<n>; "fsoff-store" if NULL */
    const char *file_name;    /* with one folder: the file's exact name instead */
    bool keep_files;          /* the files outlive the store (a checkpoint's data): destroy
                                 closes them without removing them, and a fatal signal's
                                 fso_store_unlink_created leaves them */
    bool existing;            /* with file_name and keep_files: open the file another
                                 process made (box 0 of several writing one checkpoint,
                                 engine/boxes.h) instead of creating it */
    const cpu_set_t *iowq_cpus; /* where the kernel's I/O workers for this store run (the
                                 drives' NUMA node); NULL: anywhere. Best effort. */
    bool refuse_direct;       /* test hook: act as if every folder refused O_DIRECT
                                 (tmpfs before Linux 6.6) so the fallback runs */
} fso_store_opts;

/* io_uring over preallocated files, one or more per folder. Errors name the
 * folder and the fix (missing, not a directory, read-only, no space for
 * capacity_bytes, in use by a running fsoff: -EBUSY). Files are created 0600
 * with O_NOFOLLOW and removed by destroy unless keep_files. While open, the
 * store holds a lock file per folder, <prefix>.lock (flock); files
 * <prefix>.<n> of this user found under a lock nobody holds are a finished
 * run's and are removed, with one notice on stderr. A store with file_name
 * takes no lock and removes nothing but its own file. */
int fso_store_open_uring(fso_store **out, const fso_store_opts *opts, char *err, size_t errlen);
/* Remove every file an io_uring store of this process created to remove
 * and has not removed yet, then every lock file its stores hold (up to
 * FSO_STORE_MAX_TRACKED of each): what a signal handler that ends the
 * process at once calls, so no store file outlives it. Leftovers removed by
 * a lock's reclaim were never this process's and are not touched. The
 * kernel lets go of the locks as the process dies. Async-signal-safe: it
 * only reads the lists and calls unlink(2). */
#define FSO_STORE_MAX_TRACKED 1024
void fso_store_unlink_created(void);
/* Memory: the host tier and tests. align is a power of two; queue_depth is
 * FSO_STORE_MEM_QUEUE_DEPTH. Data moves at submit; requests complete at reap. */
#define FSO_STORE_MEM_QUEUE_DEPTH 128
int fso_store_open_mem(fso_store **out, uint64_t capacity_bytes, size_t align);

/* Faults injected into another store's completions, counted per operation
 * kind from 1 (requests prepared through the wrapper). A zero field injects
 * nothing. An injected EIO or ENOSPC is not forwarded: a failed write leaves
 * the range as it was, a failed read leaves the buffer as it was (callers
 * must treat both as undefined). short_read_at uses the inner store's
 * inject_short_read hook when it has one (io_uring: its real resubmission
 * path runs); otherwise the wrapper reads the first half, then resubmits the
 * rest itself. On success the wrapper owns inner: destroy destroys both. */
typedef struct fso_fault_spec {
    int read_eio_at;          /* the Nth read completes with -EIO */
    int write_eio_at;         /* the Nth write completes with -EIO */
    int write_enospc_at;      /* the Nth write completes with -ENOSPC */
    int short_read_at;        /* the Nth read is first served short (the store must resubmit) */
} fso_fault_spec;
int fso_store_wrap_faults(fso_store **out, fso_store *inner, const fso_fault_spec *spec);

void fso_store_destroy(fso_store *s);

/* Blocking helpers over the queue: one request, submitted and reaped. The
 * store must be idle (no requests in flight; -EBUSY otherwise).
 * Return 0 or -errno (message in s->err). */
int fso_store_read(fso_store *s, void *buf, size_t len, uint64_t off);
/* Grow to capacity_bytes (no-op when already that large); the store must
 * be idle. 0 or -errno (message in s->err). */
int fso_store_grow(fso_store *s, uint64_t capacity_bytes);
int fso_store_write(fso_store *s, const void *buf, size_t len, uint64_t off);
/* ops->flush where the store has one (else there is nothing to flush): 0 or
 * -errno (message in s->err). */
int fso_store_flush(fso_store *s);

/* For implementations (store.c). */
/* Formats the message into s->err and returns rc. */
int fso_store_fail(fso_store *s, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The checks every prep_* makes: -EINVAL for a misaligned, empty or
 * out-of-range request, -EBUSY when queue_depth requests are in flight. */
int fso_store_check(fso_store *s, const char *op, const void *buf, size_t len, uint64_t off);

#endif
