/* util.h — small process-wide helpers every layer uses: the abort on a
 * broken invariant, the monotonic clock, memory available, byte counts for
 * people, sizes and lists on the command line, JSON string literals.
 * kernels/ is the lowest layer, so they live here. */
#ifndef FSO_UTIL_H
#define FSO_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Milliseconds on the monotonic clock (differences only). */
double fso_now_ms(void);

/* Room for n elements of elem bytes in the growing array *p of *cap:
 * *cap doubles (from first) until it holds n, and *p is reallocated. 0, or
 * -ENOMEM with *p and *cap unchanged. The one growth rule of fsoff's
 * appended arrays and buffers. */
int fso_reserve(void **p, size_t *cap, size_t n, size_t elem, size_t first);

/* A message into err (errlen bytes), as snprintf: the one formatter of
 * functions that report into a caller's buffer. */
void fso_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The first error wins: when *slot is 0, the message (fmt, ap) goes into
 * msg and *slot becomes rc; later errors leave both alone. Returns rc.
 * *slot is stored last, atomically: another thread that reads it with
 * fso_first_error_rc while the error is being recorded reads 0 or rc, and
 * the whole message once it reads rc. */
int fso_first_errorv(int *slot, char *msg, size_t len, int rc, const char *fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));
static inline int fso_first_error_rc(const int *rc_slot)
{
    return __atomic_load_n(rc_slot, __ATOMIC_ACQUIRE);
}

/* MemAvailable from /proc/meminfo in bytes, 0 when unknown. */
uint64_t fso_mem_available_bytes(void);
/* What fsoff takes of the host's memory when --host-mem does not say:
 * MemAvailable less a headroom for the rest of the machine (the page
 * cache, other processes, the kernel), FSO_HOST_HEADROOM_PCT percent of
 * it and at least FSO_HOST_HEADROOM_MIN_BYTES; 0 when unknown. A job that
 * would take every available byte invites the OOM killer on a shared box. */
#define FSO_HOST_HEADROOM_PCT 10
#define FSO_HOST_HEADROOM_MIN_BYTES ((uint64_t)1 << 30)
uint64_t fso_mem_usable_bytes(void);

/* I/O buffers: anonymous zeroed memory, FSO_IO_ALIGN-aligned and rounded up
 * to a multiple of it, in the kernel's transparent huge pages where it has
 * them (MADV_HUGEPAGE, a hint; with THP "never" the pages stay 4 KiB). A
 * request's buffer in huge pages reaches the drive as one DMA segment per
 * 2 MiB instead of one per 4 KiB page, so large requests are not split at the
 * queue's segment limit and a virtual disk's host copies 2 MiB at a time:
 * on a virtio disk O_DIRECT reads of 4 MiB at depth 32 went from 1.1 to
 * 4.4 GB/s, and of 128 KiB at depth 4 from 1.0 to 4.2. NULL on failure, with
 * errno set. fso_io_free takes the size given to fso_io_alloc. */
#define FSO_IO_ALIGN ((size_t)2 << 20)
/* O_DIRECT's unit, the I/O page: every shard, staging buffer, NVMe request
 * and checkpoint piece is a whole number of these, aligned to one. */
#define FSO_IO_PAGE 4096u
void *fso_io_alloc(size_t bytes);
/* An anonymous mapping of len bytes (a multiple of FSO_IO_ALIGN) starting
 * on an FSO_IO_ALIGN boundary, with mmap's prot and flags (MAP_ANONYMOUS
 * and MAP_PRIVATE added); munmap(p, len) frees it. NULL with errno set. */
void *fso_map_aligned(size_t len, int prot, int flags);
void fso_io_free(void *p, size_t bytes);
/* The same mapping with huge pages asked for only over the whole
 * FSO_IO_ALIGN pieces of [0, bytes): the rest, part of the last piece, stays
 * in 4 KiB pages and is committed only as far as it is touched (a buffer of
 * any size that commits what it uses). fso_io_free frees it. */
void *fso_io_alloc_lean(size_t bytes);
/* The same for an address range the caller already mapped (aligned to
 * FSO_IO_ALIGN for the hint to take): ask for huge pages there. */
void fso_io_advise(void *p, size_t bytes);

/* Up to n bytes from fd into buf, short reads and EINTR retried: the bytes
 * read (fewer than n only at end of file), or -errno. */
ssize_t fso_read_full(int fd, void *buf, size_t n);
/* All n bytes of buf to fd, short writes and EINTR retried: 0, or -errno
 * (-EIO for a write that makes no progress). */
int fso_write_full(int fd, const void *buf, size_t n);

/* A broken invariant is a bug in fsoff, not a failure the user can mend:
 * when cond holds, FSO_BUG_ON prints one line to stderr,
 *   fsoff: internal error at FILE:LINE in FUNCTION: MESSAGE [COND]
 * (MESSAGE from the printf format fmt and its arguments) and aborts. cond
 * is evaluated once; the message's arguments only when cond holds. */
#define FSO_BUG_ON(cond, ...)                                                                     \
    do {                                                                                          \
        if (__builtin_expect(!!(cond), 0))                                                        \
            fso_bug_at(__FILE__, __LINE__, __func__, #cond, __VA_ARGS__);                         \
    } while (0)
void fso_bug_at(const char *file, int line, const char *func, const char *cond, const char *fmt,
                ...) __attribute__((noreturn, cold, format(printf, 5, 6)));

/* Bytes in a GiB, as a double: for figures given in GiB (the GPU table's
 * memory sizes) and byte counts shown in GiB. */
#define FSO_GIB (1024.0 * 1024.0 * 1024.0)

/* "812 KiB", "812.0 MiB", "1.50 GiB", "3.20 TiB"; FSO_BYTES_OVERFLOW (and
 * anything as large) "more than 16777216 TiB". */
void fso_human_bytes(char *buf, size_t len, double bytes);

/* Byte counts computed from a configuration are checked: a sum or product
 * that does not fit in 64 bits saturates at FSO_BYTES_OVERFLOW, which is
 * more than any capacity, stays saturated through later sums and products,
 * and prints as such. */
#define FSO_BYTES_OVERFLOW UINT64_MAX
static inline uint64_t fso_sat_add(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? FSO_BYTES_OVERFLOW : r;
}
static inline uint64_t fso_sat_mul(uint64_t a, uint64_t b)
{
    uint64_t r;
    if (a == FSO_BYTES_OVERFLOW || b == FSO_BYTES_OVERFLOW)
        return a && b ? FSO_BYTES_OVERFLOW : 0;
    return __builtin_mul_overflow(a, b, &r) ? FSO_BYTES_OVERFLOW : r;
}
/* x rounded up to a multiple of m (m > 0); x / m. Both keep an overflow. */
static inline uint64_t fso_sat_round_up(uint64_t x, uint64_t m)
{
    if (x == FSO_BYTES_OVERFLOW || x > FSO_BYTES_OVERFLOW - (m - 1))
        return FSO_BYTES_OVERFLOW;
    return (x + m - 1) / m * m;
}
static inline uint64_t fso_sat_div(uint64_t x, uint64_t m)
{
    return x == FSO_BYTES_OVERFLOW ? x : x / m;
}

/* "512M", "4G", "1.5T", "64KiB", "1048576" into bytes (powers of 1024).
 * 0 or -EINVAL. */
int fso_parse_size(const char *s, uint64_t *out);

/* Split buf in place at sep into at most max non-empty items (pointers
 * into buf). The count, or -E2BIG when there are more than max (items then
 * holds the first max). */
int fso_split_list(char *buf, char sep, const char **items, int max);

/* `s` as a JSON string literal, quotes included ("a\"b"): '"' and '\\'
 * escaped, control characters as \u00XX, every other byte as it is.
 * Malloc'ed; NULL when out of memory. */
char *fso_json_quote(const char *s);

#endif
