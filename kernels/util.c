/* util.c — see util.h. */
#include "util.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

double fso_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int fso_reserve(void **p, size_t *cap, size_t n, size_t elem, size_t first)
{
    if (n <= *cap)
        return 0;
    size_t nc = *cap ? *cap : first;
    while (nc < n)
        nc *= 2;
    void *q = realloc(*p, nc * elem);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = nc;
    return 0;
}

void fso_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int fso_first_errorv(int *slot, char *msg, size_t len, int rc, const char *fmt, va_list ap)
{
    if (__atomic_load_n(slot, __ATOMIC_RELAXED) == 0) {
        vsnprintf(msg, len, fmt, ap);
        __atomic_store_n(slot, rc, __ATOMIC_RELEASE);
    }
    return rc;
}

void fso_bug_at(const char *file, int line, const char *func, const char *cond, const char *fmt,
                ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* one call, so the line is not interleaved with another thread's output */
    fprintf(stderr, "fsoff: internal error at %s:%d in %s: %s [%s]\n", file, line, func, msg, cond);
    abort();
}

uint64_t fso_mem_available_bytes(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

uint64_t fso_mem_usable_bytes(void)
{
    const uint64_t avail = fso_mem_available_bytes();
    uint64_t keep = avail / 100 * FSO_HOST_HEADROOM_PCT;
    if (keep < FSO_HOST_HEADROOM_MIN_BYTES)
        keep = FSO_HOST_HEADROOM_MIN_BYTES;
    return avail > keep ? avail - keep : avail / 2; /* a small box: half of what is there */
}

void fso_io_advise(void *p, size_t bytes)
{
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE); /* a hint: refused is fine */
#else
    (void)p;
    (void)bytes;
#endif
}

static size_t io_round(size_t bytes)
{
    return (bytes + FSO_IO_ALIGN - 1) / FSO_IO_ALIGN * FSO_IO_ALIGN;
}

void *fso_map_aligned(size_t len, int prot, int flags)
{
    if (len + FSO_IO_ALIGN < len) {
        errno = ENOMEM;
        return NULL;
    }
    /* map one alignment more, then give back the ends around an aligned start */
    char *map = mmap(NULL, len + FSO_IO_ALIGN, prot, flags | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        return NULL;
    char *p = (char *)(((uintptr_t)map + FSO_IO_ALIGN - 1) & ~(uintptr_t)(FSO_IO_ALIGN - 1));
    if (p > map)
        munmap(map, (size_t)(p - map));
    munmap(p + len, (size_t)(map + FSO_IO_ALIGN - p)); /* never 0: p < map + FSO_IO_ALIGN */
    return p;
}

/* The mapping of fso_io_alloc, huge pages asked for over all of it, or
 * (whole_only) over the whole FSO_IO_ALIGN pieces of [0, bytes). */
static void *io_map(size_t bytes, bool whole_only)
{
    const size_t len = io_round(bytes ? bytes : 1);
    if (len < bytes) {
        errno = ENOMEM;
        return NULL;
    }
    char *p = fso_map_aligned(len, PROT_READ | PROT_WRITE, 0);
    if (p)
        fso_io_advise(p, whole_only ? bytes / FSO_IO_ALIGN * FSO_IO_ALIGN : len);
    return p;
}

void *fso_io_alloc(size_t bytes)
{
    return io_map(bytes, false);
}

void *fso_io_alloc_lean(size_t bytes)
{
    return io_map(bytes, true);
}

void fso_io_free(void *p, size_t bytes)
{
    if (p)
        munmap(p, io_round(bytes ? bytes : 1));
}

void fso_human_bytes(char *buf, size_t len, double bytes)
{
    const double k = 1024.0;
    if (bytes >= (double)FSO_BYTES_OVERFLOW)
        snprintf(buf, len, "more than %.0f TiB", (double)FSO_BYTES_OVERFLOW / (k * k * k * k));
    else if (bytes >= k * k * k * k)
        snprintf(buf, len, "%.2f TiB", bytes / (k * k * k * k));
    else if (bytes >= k * k * k)
        snprintf(buf, len, "%.2f GiB", bytes / (k * k * k));
    else if (bytes >= k * k)
        snprintf(buf, len, "%.1f MiB", bytes / (k * k));
    else
        snprintf(buf, len, "%.0f KiB", bytes / k);
}

int fso_parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -EINVAL;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' && mul > 1)
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end || v * mul > 1.8e19)
        return -EINVAL;
    *out = (uint64_t)(v * mul);
    return 0;
}

int fso_split_list(char *buf, char sep, const char **items, int max)
{
    int n = 0;
    char *p = buf;
    while (p) {
        char *next = strchr(p, sep);
        if (next)
            *next++ = '\0';
        if (*p) {
            if (n == max)
                return -E2BIG;
            items[n++] = p;
        }
        p = next;
    }
    return n;
}

char *fso_json_quote(const char *s)
{
    char *out = malloc(strlen(s) * 6 + 3), *o = out;
    if (!out)
        return NULL;
    *o++ = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            *o++ = '\\';
            *o++ = (char)*p;
        } else if (*p < 0x20) {
            o += sprintf(o, "\\u%04x", *p);
        } else {
            *o++ = (char)*p;
        }
    }
    *o++ = '"';
    *o = 0;
    return out;
}

ssize_t fso_read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

int fso_write_full(int fd, const void *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, (const char *)buf + done, n - done);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (w == 0)
            return -EIO;
        done += (size_t)w;
    }
    return 0;
}
