/* standin_mem.c — the CUDA runtime stand-in's memory: device allocations
 * (first fit, 256-byte aligned, in a memfd the host cannot read at the
 * addresses handed out), pinned host memory (cudaHostAlloc blocks and
 * cudaHostRegister ranges), copies and memsets with the driver's rules:
 * a device side must lie in one live allocation; a host side in one
 * registration (pinned: the call returns at once), in none (pageable: the
 * call returns once the copy has run), never across (cudaErrorInvalidValue,
 * counted). Explicit kinds must match the sides. cudaMemcpy and cudaMemset
 * (no stream) run on the calling thread and are not recorded.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "standin.h"
#include "standin_rt.h"

#ifndef MPOL_F_ADDR
#define MPOL_F_ADDR (1 << 1)
#endif

typedef struct host_reg {
    char *p;
    size_t len;
    bool alloc;  /* cudaHostAlloc (unmapped by cudaFreeHost) */
} host_reg;

static struct {
    pthread_mutex_t mu;  /* every field */
    host_reg *reg;       /* sorted by p, disjoint */
    size_t n, cap;
    uint64_t registrations;
    int policy;
} H = {.mu = PTHREAD_MUTEX_INITIALIZER, .policy = -1};

static _Atomic uint64_t pageable_stalls, spanning_refused;

uint64_t si_mem_pageable_stalls(void)
{
    return atomic_load(&pageable_stalls);
}

uint64_t si_mem_spanning_refused(void)
{
    return atomic_load(&spanning_refused);
}

uint64_t si_mem_registrations(void)
{
    pthread_mutex_lock(&H.mu);
    uint64_t n = H.registrations;
    pthread_mutex_unlock(&H.mu);
    return n;
}

int si_mem_last_policy(void)
{
    pthread_mutex_lock(&H.mu);
    int p = H.policy;
    pthread_mutex_unlock(&H.mu);
    return p;
}

/* ------------------------------------------------------------ lookups */

static si_dev *dev_of(const void *p)
{
    const char *c = p;
    for (int i = 0; i < si_device_count(); i++) {
        si_dev *d = si_device(i);
        if (c >= d->base && c < d->base + d->bytes)
            return d;
    }
    return NULL;
}

/* The block holding offset off (d->mu held); -1: none. */
static long blk_at(const si_dev *d, size_t off)
{
    size_t lo = 0, hi = d->n_blk;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (d->blk[mid].off + d->blk[mid].len <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < d->n_blk && d->blk[lo].off <= off)
        return (long)lo;
    return -1;
}

/* The first registration ending after p (H.mu held). */
static size_t reg_from(const char *p)
{
    size_t lo = 0, hi = H.n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (H.reg[mid].p + H.reg[mid].len <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

enum si_where si_classify(const void *p, size_t n, si_dev **dev)
{
    const char *c = p;
    if (n == 0)
        n = 1;
    si_dev *d = dev_of(p);
    if (dev)
        *dev = d;
    if (d) {
        size_t off = (size_t)(c - d->base);
        pthread_mutex_lock(&d->mu);
        long b = blk_at(d, off);
        bool ok = b >= 0 && !d->blk[b].dying && off + n <= d->blk[b].off + d->blk[b].len;
        pthread_mutex_unlock(&d->mu);
        return ok ? SI_DEVICE : SI_BAD_DEVICE;
    }
    pthread_mutex_lock(&H.mu);
    size_t i = reg_from(c);
    enum si_where w = SI_PAGEABLE;
    if (i < H.n && H.reg[i].p < c + n)
        w = H.reg[i].p <= c && c + n <= H.reg[i].p + H.reg[i].len ? SI_PINNED : SI_SPANNING;
    pthread_mutex_unlock(&H.mu);
    return w;
}

void *si_view(const void *p)
{
    si_dev *d = p ? dev_of(p) : NULL;
    if (!d)
        return (void *)p;
    return d->view + ((const char *)p - d->base);
}

void *standin_view(const void *p)
{
    return si_view(p);
}

/* ------------------------------------------------------------ device memory */

static cudaError_t dev_alloc(si_dev *d, void **out, size_t bytes)
{
    size_t len = (bytes + SI_ALIGN - 1) & ~(size_t)(SI_ALIGN - 1);
    if (len < bytes)
        return cudaErrorMemoryAllocation;
    pthread_mutex_lock(&d->mu);
    size_t at = 0, i = 0;
    for (; i < d->n_blk; i++) {
        if (d->blk[i].off - at >= len)
            break;
        at = d->blk[i].off + d->blk[i].len;
    }
    cudaError_t e = cudaSuccess;
    if (at > d->bytes || d->bytes - at < len) {
        e = cudaErrorMemoryAllocation;
    } else if (d->n_blk == d->cap_blk) {
        size_t cap = d->cap_blk ? 2 * d->cap_blk : 64;
        si_blk *nb = realloc(d->blk, cap * sizeof *nb);
        if (!nb)
            e = cudaErrorMemoryAllocation;
        else {
            d->blk = nb;
            d->cap_blk = cap;
        }
    }
    if (e == cudaSuccess) {
        memmove(&d->blk[i + 1], &d->blk[i], (d->n_blk - i) * sizeof *d->blk);
        d->blk[i] = (si_blk){.off = at, .len = len};
        d->n_blk++;
        d->used += len;
        *out = d->base + at;
    }
    pthread_mutex_unlock(&d->mu);
    return e;
}

/* p starts a live block (d->mu held). */
static bool blk_start_locked(const si_dev *d, const void *p)
{
    size_t off = (size_t)((const char *)p - d->base);
    long b = blk_at(d, off);
    return b >= 0 && d->blk[b].off == off && !d->blk[b].dying;
}

static bool blk_start(si_dev *d, const void *p)
{
    pthread_mutex_lock(&d->mu);
    bool ok = blk_start_locked(d, p);
    pthread_mutex_unlock(&d->mu);
    return ok;
}

/* Drop the block starting at p (d->mu held) and give its pages back. */
static bool blk_drop_locked(si_dev *d, const void *p, bool only_dying)
{
    size_t off = (size_t)((const char *)p - d->base);
    long b = blk_at(d, off);
    if (b < 0 || d->blk[b].off != off || (only_dying && !d->blk[b].dying))
        return false;
    size_t len = d->blk[b].len;
    fallocate(d->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
    memmove(&d->blk[b], &d->blk[b + 1], (d->n_blk - (size_t)b - 1) * sizeof *d->blk);
    d->n_blk--;
    d->used -= len;
    return true;
}

/* cudaMalloc's and cudaMallocAsync's checks, then the allocation on d
 * (`none`: the error when there is no d). */
static cudaError_t malloc_on(si_dev *d, cudaError_t none, void **out, size_t bytes)
{
    if (!d)
        return si_set_last(none);
    if (!out)
        return si_set_last(cudaErrorInvalidValue);
    if (si_sticky(d))
        return si_set_last(si_sticky(d));
    if (bytes == 0) {
        *out = NULL;
        return cudaSuccess;
    }
    return si_set_last(dev_alloc(d, out, bytes));
}

cudaError_t cudaMalloc(void **out, size_t bytes)
{
    return malloc_on(si_device(si_current()), cudaErrorNoDevice, out, bytes);
}

cudaError_t cudaMallocAsync(void **out, size_t bytes, cudaStream_t s)
{
    return malloc_on(si_stream_dev(s), cudaErrorInvalidResourceHandle, out, bytes);
}

cudaError_t cudaFree(void *p)
{
    if (!p)
        return cudaSuccess;
    si_dev *d = dev_of(p);
    if (!d || !blk_start(d, p))
        return si_set_last(cudaErrorInvalidValue);
    si_dev_drain(d); /* as the real one: after the device's queued work */
    pthread_mutex_lock(&d->mu);
    bool ok = blk_start_locked(d, p) && blk_drop_locked(d, p, false);
    pthread_mutex_unlock(&d->mu);
    if (!ok) /* freed by another thread meanwhile */
        return si_set_last(cudaErrorInvalidValue);
    return si_set_last(si_sticky(d));
}

struct free_arg {
    si_dev *d;
    void *p;
};

static cudaError_t run_free(void *a)
{
    struct free_arg *f = a;
    pthread_mutex_lock(&f->d->mu);
    blk_drop_locked(f->d, f->p, true);
    pthread_mutex_unlock(&f->d->mu);
    return cudaSuccess;
}

/* The block is released when the stream reaches the free: work queued
 * before it may still use it. Not recorded. */
cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    si_dev *sd = si_stream_dev(s);
    if (!sd)
        return si_set_last(cudaErrorInvalidResourceHandle);
    if (!p)
        return cudaSuccess;
    si_dev *d = dev_of(p);
    if (!d)
        return si_set_last(cudaErrorInvalidValue);
    if (si_sticky(sd))
        return si_set_last(si_sticky(sd));
    pthread_mutex_lock(&d->mu);
    bool ok = blk_start_locked(d, p);
    if (ok)
        d->blk[blk_at(d, (size_t)((char *)p - d->base))].dying = true;
    pthread_mutex_unlock(&d->mu);
    if (!ok)
        return si_set_last(cudaErrorInvalidValue);
    struct free_arg *f = malloc(sizeof *f);
    if (!f)
        return si_set_last(cudaErrorMemoryAllocation);
    *f = (struct free_arg){d, p};
    /* runs after a fault too, so the memory comes back */
    cudaError_t e = si_enqueue(s, "free", run_free, f, NULL, SI_NO_RECORD | SI_ALWAYS_RUN, NULL);
    return si_set_last(e);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    si_dev *d = si_device(si_current());
    if (!d)
        return si_set_last(cudaErrorNoDevice);
    if (!free_bytes || !total_bytes)
        return si_set_last(cudaErrorInvalidValue);
    if (si_sticky(d))
        return si_set_last(si_sticky(d));
    pthread_mutex_lock(&d->mu);
    *free_bytes = d->bytes - d->used;
    *total_bytes = d->bytes;
    pthread_mutex_unlock(&d->mu);
    return cudaSuccess;
}

/* ------------------------------------------------------------ host memory */

/* Insert [p, p+len) unless it overlaps a registration (H.mu held). */
static cudaError_t reg_add_locked(char *p, size_t len, bool alloc)
{
    size_t i = reg_from(p);
    if (i < H.n && H.reg[i].p < p + len)
        return cudaErrorHostMemoryAlreadyRegistered;
    if (H.n == H.cap) {
        size_t cap = H.cap ? 2 * H.cap : 64;
        host_reg *nr = realloc(H.reg, cap * sizeof *nr);
        if (!nr)
            return cudaErrorMemoryAllocation;
        H.reg = nr;
        H.cap = cap;
    }
    memmove(&H.reg[i + 1], &H.reg[i], (H.n - i) * sizeof *H.reg);
    H.reg[i] = (host_reg){p, len, alloc};
    H.n++;
    return cudaSuccess;
}

/* Remove the registration starting at p of that kind (H.mu held). */
static bool reg_del_locked(const char *p, bool alloc, size_t *len)
{
    size_t i = reg_from(p);
    if (i >= H.n || H.reg[i].p != p || H.reg[i].alloc != alloc)
        return false;
    *len = H.reg[i].len;
    memmove(&H.reg[i], &H.reg[i + 1], (H.n - i - 1) * sizeof *H.reg);
    H.n--;
    return true;
}

cudaError_t cudaHostAlloc(void **out, size_t bytes, unsigned int flags)
{
    if (!out || bytes == 0 ||
        (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped |
                             cudaHostAllocWriteCombined)))
        return si_set_last(cudaErrorInvalidValue);
    if (!si_device_count())
        return si_set_last(cudaErrorNoDevice);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = (bytes + page - 1) & ~(page - 1);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return si_set_last(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&H.mu);
    cudaError_t e = reg_add_locked(p, len, true);
    pthread_mutex_unlock(&H.mu);
    if (e != cudaSuccess) {
        munmap(p, len);
        return si_set_last(e);
    }
    *out = p;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    if (!p)
        return cudaSuccess;
    size_t len = 0;
    pthread_mutex_lock(&H.mu);
    bool ok = reg_del_locked(p, true, &len);
    pthread_mutex_unlock(&H.mu);
    if (!ok)
        return si_set_last(cudaErrorInvalidValue);
    munmap(p, len);
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned int flags)
{
    if (!p || bytes == 0 ||
        (flags & ~(unsigned)(cudaHostRegisterPortable | cudaHostRegisterMapped |
                             cudaHostRegisterIoMemory | cudaHostRegisterReadOnly)))
        return si_set_last(cudaErrorInvalidValue);
    if (!si_device_count())
        return si_set_last(cudaErrorNoDevice);
    int mode = -1;
    if (syscall(SYS_get_mempolicy, &mode, NULL, 0UL, p, (unsigned long)MPOL_F_ADDR) != 0)
        mode = -1;
    pthread_mutex_lock(&H.mu);
    cudaError_t e = reg_add_locked(p, bytes, false);
    if (e == cudaSuccess) {
        H.registrations++;
        H.policy = mode;
    }
    pthread_mutex_unlock(&H.mu);
    return si_set_last(e);
}

cudaError_t cudaHostUnregister(void *p)
{
    size_t len;
    pthread_mutex_lock(&H.mu);
    bool ok = p && reg_del_locked(p, false, &len);
    pthread_mutex_unlock(&H.mu);
    return ok ? cudaSuccess : si_set_last(cudaErrorHostMemoryNotRegistered);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    if (!a)
        return si_set_last(cudaErrorInvalidValue);
    memset(a, 0, sizeof *a);
    si_dev *d;
    enum si_where w = si_classify(p, 1, &d);
    switch (w) {
    case SI_DEVICE:
        a->type = cudaMemoryTypeDevice;
        a->device = d->index;
        a->devicePointer = (void *)p;
        return cudaSuccess;
    case SI_BAD_DEVICE:
        return si_set_last(cudaErrorInvalidValue);
    case SI_PINNED:
        a->type = cudaMemoryTypeHost;
        a->device = si_current();
        a->devicePointer = (void *)p;
        a->hostPointer = (void *)p;
        return cudaSuccess;
    default:
        a->type = cudaMemoryTypeUnregistered;
        a->device = -2;
        return cudaSuccess;
    }
}

/* ------------------------------------------------------------ copies */

struct copy_arg {
    void *dst;
    const void *src;  /* NULL: a memset of `value` */
    int value;
    size_t n;
};

static cudaError_t run_copy(void *p)
{
    struct copy_arg *c = p;
    if (c->src)
        memmove(c->dst, c->src, c->n);
    else
        memset(c->dst, c->value, c->n);
    return cudaSuccess;
}

/* Check a copy's sides: the error, and the recorded name; *pageable when
 * a host side is pageable; *dev the device of a device side. */
static cudaError_t copy_check(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                              bool *pageable, si_dev **dev, const char **what)
{
    si_dev *dd, *sd;
    enum si_where wd = si_classify(dst, n, &dd), ws = si_classify(src, n, &sd);
    if (wd == SI_SPANNING || ws == SI_SPANNING) {
        atomic_fetch_add(&spanning_refused, 1);
        return cudaErrorInvalidValue;
    }
    if (wd == SI_BAD_DEVICE || ws == SI_BAD_DEVICE)
        return cudaErrorInvalidValue;
    const bool d_dev = wd == SI_DEVICE, s_dev = ws == SI_DEVICE;
    switch (kind) {
    case cudaMemcpyHostToHost:
        if (d_dev || s_dev)
            return cudaErrorInvalidValue;
        break;
    case cudaMemcpyHostToDevice:
        if (!d_dev || s_dev)
            return cudaErrorInvalidValue;
        break;
    case cudaMemcpyDeviceToHost:
        if (d_dev || !s_dev)
            return cudaErrorInvalidValue;
        break;
    case cudaMemcpyDeviceToDevice:
        if (!d_dev || !s_dev)
            return cudaErrorInvalidValue;
        break;
    case cudaMemcpyDefault:
        break;
    default:
        return cudaErrorInvalidValue;
    }
    *pageable = wd == SI_PAGEABLE || ws == SI_PAGEABLE;
    *dev = d_dev ? dd : s_dev ? sd : NULL;
    *what = d_dev && s_dev ? "copy d2d" : d_dev ? "copy h2d" : s_dev ? "copy d2h" : "copy h2h";
    return cudaSuccess;
}

static cudaError_t queue_copy(struct copy_arg *c, cudaStream_t s, const char *what,
                              bool pageable)
{
    uint64_t seq;
    cudaError_t e = si_enqueue(s, what, run_copy, c, NULL, SI_FAULT_COPY, &seq);
    if (e == cudaSuccess && pageable) { /* the driver stages it: the issuer waits */
        atomic_fetch_add(&pageable_stalls, 1);
        si_wait_seq(s, seq);
    }
    return e;
}

/* The checks an asynchronous copy or memset of n bytes on s makes first:
 * a bad stream, the device's sticky error; 0 bytes is done. Returns the
 * error to give back, with *done when there is nothing to queue. */
static cudaError_t async_precheck(cudaStream_t s, size_t n, bool *done)
{
    si_dev *sd = si_stream_dev(s);
    *done = true;
    if (!sd)
        return si_set_last(cudaErrorInvalidResourceHandle);
    if (si_sticky(sd))
        return si_set_last(si_sticky(sd));
    *done = n == 0;
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t s)
{
    bool done;
    cudaError_t pre = async_precheck(s, n, &done);
    if (done)
        return pre;
    bool pageable;
    si_dev *d;
    const char *what;
    cudaError_t e = copy_check(dst, src, n, kind, &pageable, &d, &what);
    if (e != cudaSuccess)
        return si_set_last(e);
    struct copy_arg *c = malloc(sizeof *c);
    if (!c)
        return si_set_last(cudaErrorMemoryAllocation);
    *c = (struct copy_arg){si_view(dst), si_view(src), 0, n};
    return si_set_last(queue_copy(c, s, what, pageable));
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    bool pageable;
    si_dev *d;
    const char *what;
    cudaError_t e = copy_check(dst, src, n, kind, &pageable, &d, &what);
    if (e != cudaSuccess)
        return si_set_last(e);
    if (!d)
        d = si_device(si_current());
    if (!d)
        return si_set_last(cudaErrorNoDevice);
    if (si_sticky(d))
        return si_set_last(si_sticky(d));
    if (n == 0)
        return cudaSuccess;
    if (si_sync_copy_faults(d))
        return si_set_last(si_sticky(d));
    memmove(si_view(dst), si_view(src), n);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s)
{
    bool done;
    cudaError_t pre = async_precheck(s, n, &done);
    if (done)
        return pre;
    if (si_classify(p, n, NULL) != SI_DEVICE)
        return si_set_last(cudaErrorInvalidValue);
    struct copy_arg *c = malloc(sizeof *c);
    if (!c)
        return si_set_last(cudaErrorMemoryAllocation);
    *c = (struct copy_arg){si_view(p), NULL, value, n};
    return si_set_last(si_enqueue(s, "memset", run_copy, c, NULL, SI_FAULT_COPY, NULL));
}

cudaError_t cudaMemset(void *p, int value, size_t n)
{
    si_dev *d;
    if (n == 0)
        return cudaSuccess;
    if (si_classify(p, n, &d) != SI_DEVICE)
        return si_set_last(cudaErrorInvalidValue);
    if (si_sticky(d))
        return si_set_last(si_sticky(d));
    if (si_sync_copy_faults(d))
        return si_set_last(si_sticky(d));
    memset(si_view(p), value, n);
    return cudaSuccess;
}
