/* test_store.c — the storage interface (offload/store.h): io_uring over real
 * files, memory, and the fault-injecting wrapper.
 *
 * Each test gets three mkdtemp folders under /tmp (a disk filesystem, where
 * O_DIRECT works) and its teardown fails the test if a store left anything
 * in them. The O_DIRECT fallback uses /dev/shm (tmpfs; it refuses O_DIRECT
 * before Linux 6.6, accepts it since) plus the store's refuse_direct hook so
 * the fallback runs on every kernel. The read-only folder case uses a folder
 * with mode 0500 when not root; root writes through any mode, so as root it
 * uses /sys/kernel (sysfs refuses new files even to root) and skips when that
 * is missing. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cmocka.h>

#include "store.h"
#include "util.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

typedef struct fx {
    char dirs[3][256];
} fx;

static int setup_dirs(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    for (int i = 0; i < 3; i++) {
        snprintf(f->dirs[i], sizeof f->dirs[i], "/tmp/fso_test_store.XXXXXX");
        if (!mkdtemp(f->dirs[i]))
            return -1;
    }
    *state = f;
    return 0;
}

/* Fails the test when a folder is not empty: a store left something behind. */
static int teardown_dirs(void **state)
{
    fx *f = *state;
    int bad = 0;
    for (int i = 0; i < 3; i++) {
        DIR *d = opendir(f->dirs[i]);
        if (!d)
            continue;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                fprintf(stderr, "FAIL: %s/%s left behind\n", f->dirs[i], e->d_name);
                char p[600];
                snprintf(p, sizeof p, "%s/%s", f->dirs[i], e->d_name);
                unlink(p);
                bad = 1;
            }
        }
        closedir(d);
        rmdir(f->dirs[i]);
    }
    free(f);
    return bad ? -1 : 0;
}

static void fill_random(void *buf, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    uint8_t *p = buf;
    for (size_t i = 0; i < n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, n - i < 8 ? n - i : 8);
    }
}

static void *xalloc(size_t n)
{
    void *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    assert_non_null(p);
    return p;
}

static fso_store_opts opts_for(const fx *f, int ndirs, uint64_t cap, size_t block, int qd)
{
    fso_store_opts o;
    memset(&o, 0, sizeof o);
    for (int i = 0; i < ndirs; i++)
        o.dirs[i] = f->dirs[i];
    o.ndirs = ndirs;
    o.capacity_bytes = cap;
    o.block_bytes = block;
    o.queue_depth = qd;
    o.direct = true;
    return o;
}

static fso_store *open_uring(const fso_store_opts *o)
{
    fso_store *s = NULL;
    char err[FSO_STORE_ERR_MAX];
    int rc = fso_store_open_uring(&s, o, err, sizeof err);
    if (rc != 0)
        fail_msg("fso_store_open_uring: %d: %s", rc, err);
    assert_non_null(s);
    return s;
}

/* Moves [0, n) between buf and the store in requests of the given sizes
 * (cycled, clipped at the end), keeping up to queue_depth in flight. */
static void transfer(fso_store *s, bool write, uint8_t *buf, size_t n, const size_t *sizes,
                     int nsizes)
{
    size_t lens[4096];
    uint64_t offs[4096];
    int nreq = 0;
    for (size_t off = 0; off < n; nreq++) {
        assert_true(nreq < 4096);
        size_t len = sizes[nreq % nsizes];
        if (len > n - off)
            len = n - off;
        offs[nreq] = off;
        lens[nreq] = len;
        off += len;
    }
    int next = 0, done = 0;
    fso_io io[64];
    while (done < nreq) {
        while (next < nreq && s->inflight < s->queue_depth) {
            int rc = write ? s->ops->prep_write(s, buf + offs[next], lens[next], offs[next], (uint64_t)next)
                           : s->ops->prep_read(s, buf + offs[next], lens[next], offs[next], (uint64_t)next);
            if (rc != 0)
                fail_msg("prep %s #%d: %d: %s", write ? "write" : "read", next, rc, s->err);
            next++;
        }
        assert_true(s->ops->submit(s) >= 0);
        int got = s->ops->reap(s, io, 64, 1);
        if (got < 1)
            fail_msg("reap: %d: %s", got, s->err);
        for (int i = 0; i < got; i++) {
            int k = (int)io[i].user;
            assert_true(k >= 0 && k < nreq);
            if (io[i].res != (int64_t)lens[k])
                fail_msg("request #%d (%zu bytes at %" PRIu64 "): res %" PRId64 ": %s", k, lens[k],
                         offs[k], io[i].res, s->err);
            done++;
        }
    }
    assert_int_equal(s->inflight, 0);
}

/* Random data in, read back with other request sizes (crossing stripes), same bytes out. */
static void check_round_trip(fso_store *s, size_t n)
{
    static const size_t wsizes[] = {8 * KiB, 60 * KiB, 128 * KiB, 4 * KiB, 200 * KiB, 64 * KiB};
    static const size_t rsizes[] = {68 * KiB, 4 * KiB, 300 * KiB, 12 * KiB, 64 * KiB};
    uint8_t *src = xalloc(n), *dst = xalloc(n);
    fill_random(src, n, 42);
    memset(dst, 0xA5, n);
    uint64_t w0 = s->write_bytes, r0 = s->read_bytes;
    transfer(s, true, src, n, wsizes, 6);
    transfer(s, false, dst, n, rsizes, 5);
    assert_memory_equal(src, dst, n);
    assert_int_equal(s->write_bytes - w0, n);
    assert_int_equal(s->read_bytes - r0, n);

    /* One blocking request across a stripe boundary (64 KiB stripes). */
    fill_random(src, 8 * KiB, 7);
    assert_int_equal(fso_store_write(s, src, 8 * KiB, 60 * KiB), 0);
    assert_int_equal(fso_store_read(s, dst, 8 * KiB, 60 * KiB), 0);
    assert_memory_equal(src, dst, 8 * KiB);
    free(src);
    free(dst);
}

/* ---- io_uring ---- */

static void test_uring_round_trip_one_folder(void **state)
{
    fx *f = *state;
    fso_store_opts o = opts_for(f, 1, 2 * MiB, 64 * KiB, 8);
    fso_store *s = open_uring(&o);
    assert_string_equal(s->ops->name, "uring");
    assert_true(s->direct); /* /tmp is a disk filesystem */
    assert_int_equal(s->align, 4096);
    check_round_trip(s, 2 * MiB);
    fso_store_destroy(s);
}

/* The I/O workers may be kept near the drives: a store with a worker CPU
 * set works the same. */
static void test_uring_with_io_workers_bound(void **state)
{
    fx *f = *state;
    cpu_set_t cpus;
    assert_int_equal(sched_getaffinity(0, sizeof cpus, &cpus), 0);
    fso_store_opts o = opts_for(f, 1, 2 * MiB, 64 * KiB, 8);
    o.iowq_cpus = &cpus;
    fso_store *s = open_uring(&o);
    check_round_trip(s, 2 * MiB);
    fso_store_destroy(s);
}

static void test_uring_stripes_over_three_folders(void **state)
{
    fx *f = *state;
    const size_t B = 64 * KiB, n = 2 * MiB + 3 * B; /* 35 stripes: 12, 12, 11 */
    fso_store_opts o = opts_for(f, 3, n, B, 16);
    fso_store *s = open_uring(&o);
    check_round_trip(s, n);

    /* The layout on disk: stripe k in folder k % 3 at (k / 3) * B. */
    uint8_t *src = xalloc(n), *chunk = xalloc(B);
    fill_random(src, n, 99);
    size_t sizes[] = {n};
    transfer(s, true, src, n, sizes, 1);
    for (size_t k = 0; k < n / B; k++) {
        char p[600];
        snprintf(p, sizeof p, "%s/fsoff-store.%zu", f->dirs[k % 3], k % 3);
        int fd = open(p, O_RDONLY);
        assert_true(fd >= 0);
        struct stat st;
        assert_int_equal(fstat(fd, &st), 0);
        assert_int_equal(st.st_size, 12 * B);
        assert_int_equal(pread(fd, chunk, B, (off_t)((k / 3) * B)), (ssize_t)B);
        close(fd);
        if (memcmp(chunk, src + k * B, B) != 0)
            fail_msg("stripe %zu is not at %s offset %zu", k, p, (k / 3) * B);
    }
    free(src);
    free(chunk);
    fso_store_destroy(s);
}

/* Growing keeps every byte where it was and makes the new range usable;
 * a capacity the folders cannot hold fails naming the folder, and the
 * store goes on as it was. */
static void check_grow(fso_store *s, const char *dir)
{
    const size_t n = s->capacity_bytes;
    uint8_t *src = xalloc(3 * n), *dst = xalloc(3 * n);
    fill_random(src, 3 * n, 5);
    size_t sizes[] = {64 * KiB};
    transfer(s, true, src, n, sizes, 1);
    assert_int_equal(fso_store_grow(s, 3 * n), 0);
    assert_int_equal(s->capacity_bytes, 3 * n);
    transfer(s, true, src + n, 2 * n, sizes, 1); /* written as [0, 2n) ... */
    transfer(s, false, dst, n, sizes, 1);        /* ... so [0, n) is the second part */
    assert_memory_equal(dst, src + n, n);
    /* the new range, at its own addresses */
    assert_int_equal(fso_store_write(s, src, 64 * KiB, 2 * n), 0);
    assert_int_equal(fso_store_read(s, dst, 64 * KiB, 2 * n), 0);
    assert_memory_equal(dst, src, 64 * KiB);
    assert_int_equal(fso_store_grow(s, n), 0); /* never shrinks */
    assert_int_equal(s->capacity_bytes, 3 * n);
    if (dir) {
        struct statvfs v;
        assert_int_equal(statvfs(dir, &v), 0);
        uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize;
        assert_int_equal(fso_store_grow(s, avail + ((uint64_t)1 << 40)), -ENOSPC);
        assert_non_null(strstr(s->err, dir));
        assert_non_null(strstr(s->err, "not enough space"));
        assert_int_equal(s->capacity_bytes, 3 * n);
        assert_int_equal(fso_store_read(s, dst, 64 * KiB, 2 * n), 0);
        assert_memory_equal(dst, src, 64 * KiB);
    }
    free(src);
    free(dst);
}

static void test_uring_grows_in_place(void **state)
{
    fx *f = *state;
    fso_store_opts o = opts_for(f, 2, 1 * MiB, 64 * KiB, 8);
    fso_store *s = open_uring(&o);
    check_grow(s, f->dirs[0]);
    fso_store_destroy(s);
}

/* The checks every store makes, whatever it is. */
static void check_rejects_bad_requests(fso_store *s)
{
    uint8_t *buf = xalloc(64 * KiB);
    uint64_t cap = s->capacity_bytes;
    assert_int_equal(s->ops->prep_read(s, buf + 512, 4096, 0, 0), -EINVAL);
    assert_non_null(strstr(s->err, "multiples of 4096"));
    assert_int_equal(s->ops->prep_read(s, buf, 4000, 0, 0), -EINVAL);
    assert_int_equal(s->ops->prep_write(s, buf, 4096, 100, 0), -EINVAL);
    assert_int_equal(s->ops->prep_write(s, buf, 0, 0, 0), -EINVAL);
    assert_int_equal(s->ops->prep_read(s, buf, 8192, cap - 4096, 0), -EINVAL);
    assert_non_null(strstr(s->err, "capacity"));
    assert_int_equal(s->ops->prep_write(s, buf, 4096, cap, 0), -EINVAL);
    assert_int_equal(s->ops->prep_write(s, buf, 4096, UINT64_MAX - 4095, 0), -EINVAL);
    assert_int_equal(s->inflight, 0);
    /* The last block is fine. */
    assert_int_equal(fso_store_write(s, buf, 4096, cap - 4096), 0);
    free(buf);
}

/* queue_depth requests in flight, then -EBUSY until one is reaped. */
static void check_queue_depth(fso_store *s)
{
    int qd = s->queue_depth;
    uint8_t *buf = xalloc((size_t)(qd + 1) * 4096);
    fso_io io[1024];
    for (int i = 0; i < qd; i++)
        assert_int_equal(s->ops->prep_read(s, buf + (size_t)i * 4096, 4096, (uint64_t)i * 4096, (uint64_t)i), 0);
    assert_int_equal(s->ops->prep_read(s, buf + (size_t)qd * 4096, 4096, 0, 999), -EBUSY);
    assert_non_null(strstr(s->err, "reap"));
    assert_int_equal(fso_store_read(s, buf, 4096, 0), -EBUSY); /* blocking needs an idle store */
    assert_int_equal(s->ops->submit(s), qd);
    assert_int_equal(s->ops->reap(s, io, 1024, qd + 1), -EINVAL); /* more than in flight */
    int got = 0;
    while (got < 1)
        got = s->ops->reap(s, io, 1, 1);
    assert_int_equal(got, 1);
    assert_int_equal(io[0].res, 4096);
    assert_int_equal(s->ops->prep_read(s, buf + (size_t)qd * 4096, 4096, 0, 999), 0);
    assert_true(s->ops->submit(s) >= 0);
    int left = qd;
    while (left > 0) {
        got = s->ops->reap(s, io, 1024, 1);
        assert_true(got >= 1);
        for (int i = 0; i < got; i++)
            assert_int_equal(io[i].res, 4096);
        left -= got;
    }
    assert_int_equal(s->inflight, 0);
    assert_int_equal(s->ops->reap(s, io, 1024, 0), 0);
    free(buf);
}

static void test_uring_rejects_misaligned_and_out_of_range(void **state)
{
    fx *f = *state;
    fso_store_opts o = opts_for(f, 2, 1 * MiB, 64 * KiB, 4);
    fso_store *s = open_uring(&o);
    check_rejects_bad_requests(s);
    fso_store_destroy(s);
}

static void test_uring_queue_depth_bounds_requests_in_flight(void **state)
{
    fx *f = *state;
    fso_store_opts o = opts_for(f, 1, 1 * MiB, 64 * KiB, 6);
    fso_store *s = open_uring(&o);
    check_queue_depth(s);
    fso_store_destroy(s);
}

static void test_uring_registered_buffers_round_trip(void **state)
{
    fx *f = *state;
    const size_t n = 1 * MiB;
    fso_store_opts o = opts_for(f, 2, n, 64 * KiB, 8);
    fso_store *s = open_uring(&o);
    /* Register the first half of src and the second half of dst, so
     * requests of both kinds go fixed and plain, some straddling the edge. */
    uint8_t *area = xalloc(2 * n);
    uint8_t *src = area, *dst = area + n;
    uint8_t *other = xalloc(n);
    int rc = s->ops->register_buffers(s, area + n / 2, n);
    if (rc != 0)
        fail_msg("register_buffers: %d: %s", rc, s->err);
    fill_random(src, n, 5);
    static const size_t sizes[] = {100 * KiB, 36 * KiB, 256 * KiB};
    transfer(s, true, src, n, sizes, 3);
    transfer(s, false, dst, n, sizes, 3);
    assert_memory_equal(src, dst, n);
    transfer(s, false, other, n, sizes, 3); /* none registered */
    assert_memory_equal(src, other, n);
    /* Re-registering and unregistering work too. */
    assert_int_equal(s->ops->register_buffers(s, other, n), 0);
    memset(other, 0, n);
    transfer(s, false, other, n, sizes, 3);
    assert_memory_equal(src, other, n);
    assert_int_equal(s->ops->register_buffers(s, NULL, 0), 0);
    fso_store_destroy(s);
    free(area);
    free(other);
}

/* The smaps entry of the mapping holding p: whether THP may back it
 * ("THPeligible: 1"); -1 when the kernel does not say. */
static int thp_eligible(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int in = 0, r = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) /* a mapping's first line */
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (in && sscanf(line, "THPeligible: %d", &r) == 1)
            break;
    }
    fclose(f);
    return r;
}

/* I/O buffers (util.h): aligned to 2 MiB, zeroed, the size rounded up,
 * asked to be in huge pages (wherever THP is not off), and usable as the
 * store's registered buffers. */
static void test_io_buffers_are_aligned_huge_and_usable(void **state)
{
    fx *f = *state;
    const size_t n = 3 * MiB + 4096;
    uint8_t *p = fso_io_alloc(n);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % FSO_IO_ALIGN, 0);
    for (size_t i = 0; i < 4 * MiB; i += 4096) /* the rounded size is ours */
        assert_int_equal(p[i], 0);
    char mode[128] = "";
    FILE *m = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (m) {
        if (!fgets(mode, sizeof mode, m))
            mode[0] = '\0';
        fclose(m);
    }
    if (mode[0] && !strstr(mode, "[never]") && thp_eligible(p) >= 0)
        assert_int_equal(thp_eligible(p), 1);
    fso_store_opts o = opts_for(f, 1, 2 * MiB, 1 * MiB, 4);
    fso_store *s = open_uring(&o);
    assert_int_equal(s->ops->register_buffers(s, p, 4 * MiB), 0);
    fill_random(p, 2 * MiB, 9);
    static const size_t sizes[] = {1 * MiB};
    transfer(s, true, p, 2 * MiB, sizes, 1);
    transfer(s, false, p + 2 * MiB, 2 * MiB, sizes, 1);
    assert_memory_equal(p, p + 2 * MiB, 2 * MiB);
    assert_int_equal(s->ops->flush(s), 0); /* the writes made durable */
    fso_store_destroy(s);
    fso_io_free(p, n);
    assert_null(fso_io_alloc(SIZE_MAX));
}

static void test_uring_read_past_truncated_file_is_eio(void **state)
{
    fx *f = *state;
    fso_store_opts o = opts_for(f, 1, 1 * MiB, 64 * KiB, 4);
    fso_store *s = open_uring(&o);
    uint8_t *buf = xalloc(64 * KiB);
    char p[600];
    snprintf(p, sizeof p, "%s/fsoff-store.0", f->dirs[0]);
    assert_int_equal(truncate(p, 128 * KiB), 0);
    assert_int_equal(fso_store_read(s, buf, 64 * KiB, 64 * KiB), 0);
    assert_int_equal(fso_store_read(s, buf, 64 * KiB, 512 * KiB), -EIO);
    assert_non_null(strstr(s->err, "end of file"));
    assert_non_null(strstr(s->err, p));
    fso_store_destroy(s);
    free(buf);
}

static void test_uring_files_are_0600_and_removed_by_destroy(void **state)
{
    fx *f = *state;
    mode_t old = umask(0); /* the store must ask for 0600 itself */
    fso_store_opts o = opts_for(f, 3, 3 * MiB + 4096, 1 * MiB, 2);
    fso_store *s = open_uring(&o);
    umask(old);
    for (int i = 0; i < 3; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/fsoff-store.%d", f->dirs[i], i);
        struct stat st;
        assert_int_equal(lstat(p, &st), 0);
        assert_true(S_ISREG(st.st_mode));
        assert_int_equal(st.st_mode & 07777, 0600);
        /* 4 stripes of 1 MiB over 3 folders: 2 stripes each, preallocated. */
        assert_int_equal(st.st_size, 2 * MiB);
        assert_true((uint64_t)st.st_blocks * 512 >= 2 * MiB);
    }
    fso_store_destroy(s);
    for (int i = 0; i < 3; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/fsoff-store.%d", f->dirs[i], i);
        assert_int_equal(access(p, F_OK), -1);
    }
    fso_store_destroy(NULL);
}

static void test_uring_destroy_waits_for_requests_in_flight(void **state)
{
    fx *f = *state;
    fso_store_opts o = opts_for(f, 2, 2 * MiB, 64 * KiB, 8);
    fso_store *s = open_uring(&o);
    uint8_t *buf = xalloc(2 * MiB);
    fill_random(buf, 2 * MiB, 1);
    for (int i = 0; i < 8; i++)
        assert_int_equal(s->ops->prep_write(s, buf + (size_t)i * 256 * KiB, 256 * KiB,
                                            (uint64_t)i * 256 * KiB, (uint64_t)i), 0);
    assert_int_equal(s->ops->submit(s), 8);
    fso_store_destroy(s); /* no reap: destroy finishes them, then removes the files */
    free(buf);
}

/* ---- opening: real-filesystem errors ---- */

static int open_expect_error(const fso_store_opts *o, char *err, size_t errlen)
{
    fso_store *s = (fso_store *)0x1;
    int rc = fso_store_open_uring(&s, o, err, errlen);
    assert_true(rc < 0);
    assert_null(s);
    assert_true(strlen(err) > 0);
    assert_null(strchr(err, '\n'));
    return rc;
}

static void test_open_missing_folder_says_create_it(void **state)
{
    fx *f = *state;
    char missing[300], err[FSO_STORE_ERR_MAX];
    snprintf(missing, sizeof missing, "%s/nope", f->dirs[1]);
    fso_store_opts o = opts_for(f, 2, 1 * MiB, 64 * KiB, 4);
    o.dirs[1] = missing;
    assert_int_equal(open_expect_error(&o, err, sizeof err), -ENOENT);
    assert_non_null(strstr(err, missing));
    assert_non_null(strstr(err, "no such folder; create it or fix --nvme"));
    /* folder 0 was fine; its file must be gone (teardown checks) */
}

static void test_open_not_a_folder(void **state)
{
    fx *f = *state;
    char file[300], err[FSO_STORE_ERR_MAX];
    snprintf(file, sizeof file, "%s/plain", f->dirs[2]);
    int fd = open(file, O_CREAT | O_WRONLY, 0600);
    assert_true(fd >= 0);
    close(fd);
    fso_store_opts o = opts_for(f, 1, 1 * MiB, 64 * KiB, 4);
    o.dirs[0] = file;
    assert_int_equal(open_expect_error(&o, err, sizeof err), -ENOTDIR);
    assert_non_null(strstr(err, file));
    assert_non_null(strstr(err, "not a folder"));
    unlink(file);
}

static void test_open_read_only_folder(void **state)
{
    fx *f = *state;
    char ro[300], err[FSO_STORE_ERR_MAX];
    bool root = geteuid() == 0;
    struct stat st;
    if (root) {
        if (stat("/sys/kernel", &st) != 0 || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "SKIP read-only case: running as root (modes do not stop root) "
                    "and /sys/kernel is missing\n");
            skip();
        }
        snprintf(ro, sizeof ro, "/sys/kernel");
    } else {
        snprintf(ro, sizeof ro, "%s/ro", f->dirs[0]);
        assert_int_equal(mkdir(ro, 0500), 0);
    }
    fso_store_opts o = opts_for(f, 1, 1 * MiB, 64 * KiB, 4);
    o.dirs[0] = ro;
    int rc = open_expect_error(&o, err, sizeof err);
    assert_true(rc == -EACCES || rc == -EROFS || rc == -EPERM);
    assert_non_null(strstr(err, ro));
    assert_non_null(strstr(err, "not writable"));
    assert_int_equal(access("/sys/kernel/fsoff-store.0", F_OK), -1);
    if (!root)
        assert_int_equal(rmdir(ro), 0);
}

static void test_open_without_space_fails_cleanly(void **state)
{
    fx *f = *state;
    char err[FSO_STORE_ERR_MAX];
    struct statvfs v;
    assert_int_equal(statvfs(f->dirs[0], &v), 0);
    uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize;
    fso_store_opts o = opts_for(f, 1, avail + ((uint64_t)1 << 40), 1 * MiB, 4);
    assert_int_equal(open_expect_error(&o, err, sizeof err), -ENOSPC);
    assert_non_null(strstr(err, f->dirs[0]));
    assert_non_null(strstr(err, "not enough space"));
    assert_non_null(strstr(err, "free"));
    /* teardown checks that no file is left */
}

/* A run's files are locked while it runs: a second store in the same
 * folders is refused, and files a run left when it was killed (no lock
 * held any more) are removed by the next one. */
static void test_open_reclaims_a_dead_runs_files(void **state)
{
    fx *f = *state;
    char left[300], err[FSO_STORE_ERR_MAX];
    snprintf(left, sizeof left, "%s/fsoff-store.1", f->dirs[1]);
    int fd = open(left, O_CREAT | O_WRONLY, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "left", 4), 4);
    close(fd);
    fso_store_opts o = opts_for(f, 2, 1 * MiB, 64 * KiB, 4);
    fso_store *a = NULL, *b = NULL;
    if (fso_store_open_uring(&a, &o, err, sizeof err) < 0)
        fail_msg("a leftover with no lock held is reclaimed: %s", err);
    struct stat st;
    assert_int_equal(stat(left, &st), 0);
    assert_true(st.st_size > 4); /* the new store's file, not the leftover */

    /* a live run's files: refused, untouched */
    assert_int_equal(fso_store_open_uring(&b, &o, err, sizeof err), -EBUSY);
    assert_null(b);
    assert_non_null(strstr(err, "in use by an fsoff that is running"));
    assert_non_null(strstr(err, f->dirs[0]));
    assert_int_equal(stat(left, &st), 0);
    assert_true(st.st_size > 4);
    fso_store_destroy(a);
    assert_int_equal(fso_store_open_uring(&b, &o, err, sizeof err), 0);
    fso_store_destroy(b);

    /* A symlink in the file's place is neither followed nor removed. */
    char link[300], target[300];
    snprintf(link, sizeof link, "%s/fsoff-store.0", f->dirs[0]);
    snprintf(target, sizeof target, "%s/target", f->dirs[2]);
    assert_int_equal(symlink(target, link), 0);
    assert_int_equal(open_expect_error(&o, err, sizeof err), -EEXIST);
    assert_non_null(strstr(err, link));
    assert_int_equal(access(target, F_OK), -1);
    assert_int_equal(lstat(link, &st), 0);
    unlink(link);
}

/* A process that must die at once (a second SIGINT) removes what its
 * stores made to remove: their files and their lock files. Not a leftover
 * its lock reclaimed (that path is another run's to create), not a
 * keep_files store's file (a checkpoint's), not another prefix's files.
 * Once they are gone the folders are free: another store opens there. */
static void test_unlink_created_removes_files_and_locks_only(void **state)
{
    fx *f = *state;
    char err[FSO_STORE_ERR_MAX], left[300], kept[300], other[300], lock[300], data[300];
    snprintf(left, sizeof left, "%s/fsoff-store.1", f->dirs[1]);
    snprintf(kept, sizeof kept, "%s/state.bin", f->dirs[2]);
    snprintf(other, sizeof other, "%s/fsoff-other.0", f->dirs[0]);
    snprintf(lock, sizeof lock, "%s/fsoff-store.lock", f->dirs[0]);
    snprintf(data, sizeof data, "%s/fsoff-store.0", f->dirs[0]);
    int fd = open(left, O_CREAT | O_WRONLY, 0600);
    assert_true(fd >= 0);
    close(fd);
    fd = open(other, O_CREAT | O_WRONLY, 0600);
    assert_true(fd >= 0);
    close(fd);

    fso_store_opts o = opts_for(f, 2, 1 * MiB, 64 * KiB, 4);
    fso_store *a = open_uring(&o); /* reclaims the leftover, then makes fsoff-store.1 again */
    fso_store_opts ko = opts_for(f, 1, 1 * MiB, 64 * KiB, 4);
    ko.dirs[0] = f->dirs[2];
    ko.file_name = "state.bin";
    ko.keep_files = true;
    fso_store *k = open_uring(&ko);
    struct stat st;
    char klock[300];
    snprintf(klock, sizeof klock, "%s/fsoff-store.lock", f->dirs[2]);
    assert_int_equal(stat(klock, &st), -1); /* a file of its own name takes no lock */
    assert_int_equal(stat(lock, &st), 0);

    fso_store_unlink_created();
    assert_int_equal(stat(data, &st), -1);
    assert_int_equal(stat(left, &st), -1); /* a's own file of that name */
    assert_int_equal(stat(lock, &st), -1);
    assert_int_equal(stat(kept, &st), 0);
    assert_int_equal(stat(other, &st), 0);
    /* the folders are free: another run opens there while a lives on */
    fso_store *b = NULL;
    if (fso_store_open_uring(&b, &o, err, sizeof err) != 0)
        fail_msg("after unlink_created the folders are free: %s", err);
    fso_store_destroy(b);
    fso_store_destroy(k);
    assert_int_equal(stat(kept, &st), 0);
    assert_int_equal(unlink(kept), 0);
    assert_int_equal(unlink(other), 0);
    fso_store_destroy(a); /* its files are gone already: nothing of b's is left to remove */
}

static void test_open_rejects_bad_options(void **state)
{
    fx *f = *state;
    char err[FSO_STORE_ERR_MAX];
    fso_store_opts o = opts_for(f, 1, 1 * MiB, 1000, 4);
    assert_int_equal(open_expect_error(&o, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "block size"));
    o = opts_for(f, 1, 1 * MiB, 64 * KiB, 0);
    assert_int_equal(open_expect_error(&o, err, sizeof err), -EINVAL);
    o = opts_for(f, 0, 1 * MiB, 64 * KiB, 4);
    assert_int_equal(open_expect_error(&o, err, sizeof err), -EINVAL);
    o = opts_for(f, 2, 1 * MiB, 64 * KiB, 4);
    o.dirs[1] = o.dirs[0];
    assert_int_equal(open_expect_error(&o, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "twice"));
}

/* stderr into a temporary file while a store opens. */
typedef struct capture {
    int saved;
    FILE *tmp;
} capture;

static capture capture_begin(void)
{
    capture c;
    fflush(stderr);
    c.tmp = tmpfile();
    assert_non_null(c.tmp);
    c.saved = dup(2);
    assert_true(c.saved >= 0);
    assert_true(dup2(fileno(c.tmp), 2) >= 0);
    return c;
}

static char *capture_end(capture c)
{
    fflush(stderr);
    dup2(c.saved, 2);
    close(c.saved);
    static char text[4096];
    rewind(c.tmp);
    size_t n = fread(text, 1, sizeof text - 1, c.tmp);
    text[n] = '\0';
    fclose(c.tmp);
    return text;
}

static int count_lines_with(const char *text, const char *what)
{
    int n = 0;
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[1024];
        snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf - 1 ? len : sizeof buf - 1), line);
        if (strstr(buf, what))
            n++;
        line = end ? end + 1 : NULL;
    }
    return n;
}

static void test_tmpfs_falls_back_to_buffered_with_one_warning(void **state)
{
    (void)state;
    char dir[64];
    snprintf(dir, sizeof dir, "/dev/shm/fso_test_store.XXXXXX");
    if (!mkdtemp(dir)) {
        snprintf(dir, sizeof dir, "/tmp/fso_test_store.XXXXXX");
        assert_non_null(mkdtemp(dir));
    }
    fso_store_opts o;
    memset(&o, 0, sizeof o);
    o.dirs[0] = dir;
    o.ndirs = 1;
    o.capacity_bytes = 1 * MiB;
    o.block_bytes = 64 * KiB;
    o.queue_depth = 8;
    o.direct = true;

    /* The filesystem as it is: tmpfs refuses O_DIRECT before Linux 6.6. */
    capture c = capture_begin();
    fso_store *s = NULL;
    char err[FSO_STORE_ERR_MAX];
    int rc = fso_store_open_uring(&s, &o, err, sizeof err);
    char *text = capture_end(c);
    if (rc != 0)
        fail_msg("open on %s: %s", dir, err);
    assert_int_equal(count_lines_with(text, "warning"), s->direct ? 0 : 1);
    fso_store_destroy(s);

    /* Refused (the hook makes it happen on every kernel): one warning line
     * naming the folder, then buffered I/O that works. */
    o.refuse_direct = true;
    c = capture_begin();
    rc = fso_store_open_uring(&s, &o, err, sizeof err);
    text = capture_end(c);
    if (rc != 0)
        fail_msg("open on %s: %s", dir, err);
    assert_false(s->direct);
    assert_int_equal(count_lines_with(text, "warning"), 1);
    char want[256];
    snprintf(want, sizeof want, "fsoff: warning: %s: the filesystem does not support O_DIRECT; "
             "using buffered I/O (slower, uses page cache)\n", dir);
    assert_string_equal(text, want);
    check_round_trip(s, 1 * MiB);
    fso_store_destroy(s);

    /* Buffered by request: no warning. */
    o.refuse_direct = false;
    o.direct = false;
    c = capture_begin();
    rc = fso_store_open_uring(&s, &o, err, sizeof err);
    text = capture_end(c);
    assert_int_equal(rc, 0);
    assert_false(s->direct);
    assert_string_equal(text, "");
    fso_store_destroy(s);
    if (rmdir(dir) != 0)
        fail_msg("%s: not empty after destroy", dir);
}

/* ---- memory ---- */

static void test_mem_round_trip(void **state)
{
    (void)state;
    fso_store *s = NULL;
    assert_int_equal(fso_store_open_mem(&s, 2 * MiB, 4096), 0);
    assert_string_equal(s->ops->name, "mem");
    check_round_trip(s, 2 * MiB);
    fso_store_destroy(s);
}

static void test_mem_grows_in_place(void **state)
{
    (void)state;
    fso_store *s = NULL;
    assert_int_equal(fso_store_open_mem(&s, 1 * MiB, 4096), 0);
    check_grow(s, NULL);
    fso_store_destroy(s);
}

static void test_mem_rejects_like_uring(void **state)
{
    (void)state;
    fso_store *s = NULL;
    assert_int_equal(fso_store_open_mem(&s, 1 * MiB, 4096), 0);
    check_rejects_bad_requests(s);
    check_queue_depth(s);
    fso_store_destroy(s);
    assert_int_equal(fso_store_open_mem(&s, 1 * MiB, 3000), -EINVAL);
    assert_null(s);
    assert_int_equal(fso_store_open_mem(&s, 0, 4096), -EINVAL);
}

static void test_mem_completes_at_reap_not_before(void **state)
{
    (void)state;
    fso_store *s = NULL;
    assert_int_equal(fso_store_open_mem(&s, 64 * KiB, 4096), 0);
    uint8_t *a = xalloc(4096), *b = xalloc(4096);
    memset(a, 1, 4096);
    memset(b, 0, 4096);
    assert_int_equal(s->ops->prep_write(s, a, 4096, 0, 7), 0);
    assert_int_equal(s->ops->prep_read(s, b, 4096, 8192, 8), 0);
    fso_io io[4];
    /* reap submits what is queued when it must wait */
    int got = s->ops->reap(s, io, 4, 2);
    assert_int_equal(got, 2);
    assert_int_equal(io[0].user, 7);
    assert_int_equal(io[1].user, 8);
    assert_int_equal(s->inflight, 0);
    free(a);
    free(b);
    fso_store_destroy(s);
}

/* ---- faults ---- */

static fso_store *wrap(fso_store *inner, fso_fault_spec spec)
{
    fso_store *s = NULL;
    assert_int_equal(fso_store_wrap_faults(&s, inner, &spec), 0);
    assert_string_equal(s->ops->name, "faults");
    return s;
}

static void test_faults_read_eio(void **state)
{
    fx *f = *state;
    fso_store *mem = NULL;
    assert_int_equal(fso_store_open_mem(&mem, 1 * MiB, 4096), 0);
    fso_store *s = wrap(mem, (fso_fault_spec){.read_eio_at = 2});
    uint8_t *buf = xalloc(64 * KiB);
    assert_int_equal(fso_store_read(s, buf, 64 * KiB, 0), 0);
    assert_int_equal(fso_store_read(s, buf, 64 * KiB, 0), -EIO);
    assert_non_null(strstr(s->err, "injected EIO on read #2"));
    assert_int_equal(fso_store_read(s, buf, 64 * KiB, 0), 0);
    fso_store_destroy(s); /* destroys mem too */

    /* In a batch, over io_uring: only the named request fails. */
    fso_store_opts o = opts_for(f, 2, 1 * MiB, 64 * KiB, 8);
    s = wrap(open_uring(&o), (fso_fault_spec){.read_eio_at = 3});
    uint8_t *big = xalloc(4 * 64 * KiB);
    fill_random(big, 4 * 64 * KiB, 3);
    assert_int_equal(fso_store_write(s, big, 4 * 64 * KiB, 0), 0);
    assert_int_equal(fso_store_read(s, buf, 64 * KiB, 0), 0); /* read #1 */
    for (int i = 0; i < 4; i++)                               /* reads #2..#5 */
        assert_int_equal(s->ops->prep_read(s, big + (size_t)i * 64 * KiB, 64 * KiB,
                                           (uint64_t)i * 64 * KiB, (uint64_t)(100 + i)), 0);
    assert_int_equal(s->ops->submit(s), 4);
    fso_io io[8];
    int seen = 0;
    while (seen < 4) {
        int got = s->ops->reap(s, io, 8, 1);
        assert_true(got >= 1);
        for (int i = 0; i < got; i++) {
            assert_true(io[i].user >= 100 && io[i].user <= 103);
            assert_int_equal(io[i].res, io[i].user == 101 ? -EIO : (int64_t)(64 * KiB));
        }
        seen += got;
    }
    assert_int_equal(s->inflight, 0);
    fso_store_destroy(s);
    free(buf);
    free(big);
}

static void test_faults_write_eio_and_enospc(void **state)
{
    (void)state;
    fso_store *mem = NULL;
    assert_int_equal(fso_store_open_mem(&mem, 1 * MiB, 4096), 0);
    fso_store *s = wrap(mem, (fso_fault_spec){.write_eio_at = 2, .write_enospc_at = 3});
    uint8_t *a = xalloc(8192), *b = xalloc(8192);
    memset(a, 1, 8192);
    assert_int_equal(fso_store_write(s, a, 8192, 0), 0);       /* #1 */
    memset(a, 2, 8192);
    assert_int_equal(fso_store_write(s, a, 8192, 0), -EIO);    /* #2 */
    assert_non_null(strstr(s->err, "injected EIO on write #2"));
    assert_int_equal(fso_store_write(s, a, 8192, 0), -ENOSPC); /* #3 */
    assert_non_null(strstr(s->err, "ENOSPC"));
    /* Not performed: the range still holds write #1. */
    assert_int_equal(fso_store_read(s, b, 8192, 0), 0);
    memset(a, 1, 8192);
    assert_memory_equal(a, b, 8192);
    memset(a, 4, 8192);
    assert_int_equal(fso_store_write(s, a, 8192, 0), 0);       /* #4 */
    assert_int_equal(fso_store_read(s, b, 8192, 0), 0);
    assert_memory_equal(a, b, 8192);
    assert_int_equal(s->write_bytes, 2 * 8192);
    fso_store_destroy(s);
    free(a);
    free(b);
}

static void check_short_read(fso_store *s)
{
    const size_t n = 512 * KiB;
    uint8_t *src = xalloc(n), *dst = xalloc(n);
    fill_random(src, n, 11);
    assert_int_equal(fso_store_write(s, src, n, 0), 0);
    memset(dst, 0, n);
    assert_int_equal(fso_store_read(s, dst, 64 * KiB, 0), 0); /* read #1 */
    assert_int_equal(s->resubmits, 0);
    /* read #2 spans stripes; its first transfer (32 KiB up to the first
     * boundary at 64 KiB stripes) is served short and resubmitted. */
    assert_int_equal(fso_store_read(s, dst + 32 * KiB, 160 * KiB, 32 * KiB), 0);
    assert_true(s->resubmits >= 1);
    assert_memory_equal(src, dst, 192 * KiB);
    memset(dst, 0, n);
    assert_int_equal(fso_store_read(s, dst, n, 0), 0); /* read #3: no fault */
    assert_memory_equal(src, dst, n);
    assert_int_equal(s->read_bytes, 64 * KiB + 160 * KiB + n);
    free(src);
    free(dst);
}

static void test_faults_short_read_is_resubmitted_by_uring(void **state)
{
    fx *f = *state;
    fso_store_opts o = opts_for(f, 3, 512 * KiB, 64 * KiB, 4);
    fso_store *inner = open_uring(&o);
    fso_store *s = wrap(inner, (fso_fault_spec){.short_read_at = 2});
    check_short_read(s);
    assert_int_equal(inner->resubmits, 1); /* the io_uring store's own path ran */
    fso_store_destroy(s);
}

static void test_faults_short_read_is_resubmitted_over_mem(void **state)
{
    (void)state;
    fso_store *mem = NULL;
    assert_int_equal(fso_store_open_mem(&mem, 512 * KiB, 4096), 0);
    fso_store *s = wrap(mem, (fso_fault_spec){.short_read_at = 2});
    check_short_read(s);
    assert_int_equal(s->resubmits, 1);
    fso_store_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_uring_round_trip_one_folder, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_uring_stripes_over_three_folders, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_uring_with_io_workers_bound, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_uring_rejects_misaligned_and_out_of_range, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_uring_queue_depth_bounds_requests_in_flight, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_uring_registered_buffers_round_trip, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_io_buffers_are_aligned_huge_and_usable, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_uring_read_past_truncated_file_is_eio, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_uring_files_are_0600_and_removed_by_destroy, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_uring_destroy_waits_for_requests_in_flight, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_open_missing_folder_says_create_it, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_open_not_a_folder, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_open_read_only_folder, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_open_without_space_fails_cleanly, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_open_reclaims_a_dead_runs_files, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_unlink_created_removes_files_and_locks_only, setup_dirs, teardown_dirs),
        cmocka_unit_test_setup_teardown(test_open_rejects_bad_options, setup_dirs, teardown_dirs),
        cmocka_unit_test(test_tmpfs_falls_back_to_buffered_with_one_warning),
        cmocka_unit_test(test_mem_round_trip),
        cmocka_unit_test(test_mem_grows_in_place),
        cmocka_unit_test_setup_teardown(test_uring_grows_in_place, setup_dirs, teardown_dirs),
        cmocka_unit_test(test_mem_rejects_like_uring),
        cmocka_unit_test(test_mem_completes_at_reap_not_before),
        cmocka_unit_test_setup_teardown(test_faults_read_eio, setup_dirs, teardown_dirs),
        cmocka_unit_test(test_faults_write_eio_and_enospc),
        cmocka_unit_test_setup_teardown(test_faults_short_read_is_resubmitted_by_uring, setup_dirs, teardown_dirs),
        cmocka_unit_test(test_faults_short_read_is_resubmitted_over_mem),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
