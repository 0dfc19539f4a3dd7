/* cuda_backend.c — the "cuda" backend: its context, device memory, copies,
 * stream ordering, errors and sync; the ops live in cuda_ops.cu,
 * cuda_matmul.c, cuda_attention.c and cuda_softmax.cu (contract: cuda_backend.h).
 *
 * Ordering: ctx->gen[s] counts what was queued on stream s. Before work is
 * queued on stream t, every other stream s with work t has not yet been
 * ordered after gets its tail event recorded (once per batch of work) and t
 * waits on it on the device. So work runs in the order it was issued, the
 * copy engines and the collectives run on their own streams, and the host
 * never waits except where cuda_backend.h says it does.
 *
 * The exceptions that make offload overlap:
 *   - a copy or a gather issued with an `after` mark (copy_h2d_after, the
 *     collectives' all_gather) waits only for the work queued before that
 *     mark. The engine marks when compute is done with a gather buffer (its
 *     release), so the next block's staging copy and gather run on their
 *     streams while the current block computes;
 *   - compute waits for the host-to-device copies and, on the collectives'
 *     stream, for the last all-gather only (gather_ev), never for the
 *     device-to-host copies or a reduce-scatter after that gather
 *     (backend.h order_after): a block's gradients go down and are reduced
 *     while the next block computes. The engine orders compute after a mark
 *     where it writes what those read (cu_order_after).
 */
#include "cuda_impl.h"
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALLOC_ROUND 64                    /* accounting, as the CPU backend */
#define SCRATCH_ROUND ((size_t)2 << 20)

/* ------------------------------------------------------------ errors */

int fso_cuda_errno(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return 0;
    case cudaErrorMemoryAllocation:
        return -ENOMEM;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidResourceHandle:
        return -EINVAL;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
        return -ENODEV;
    case cudaErrorNotSupported:
        return -ENOTSUP;
    case cudaErrorNotPermitted:
        return -EPERM;
    default:
        return -EIO;
    }
}

void fso_cuda_fail(fso_backend *be, int rc, const char *fmt, ...)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    pthread_mutex_lock(&ctx->mu);
    if (ctx->rc == 0) {
        ctx->rc = rc;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(be->err, sizeof be->err, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&ctx->mu);
}

int fso_cuda_status(fso_backend *be)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    pthread_mutex_lock(&ctx->mu);
    int rc = ctx->rc;
    pthread_mutex_unlock(&ctx->mu);
    return rc;
}

int fso_cuda_check(fso_backend *be, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    int rc = fso_cuda_errno(e);
    fso_cuda_fail(be, rc, "CUDA device %d: %s: %s (%s)", FSO_CUDA_CTX(be)->ordinal, what,
                  cudaGetErrorString(e), cudaGetErrorName(e));
    return rc;
}

int fso_cuda_check_blas(fso_backend *be, cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 0;
    int rc = s == CUBLAS_STATUS_ALLOC_FAILED     ? -ENOMEM
             : s == CUBLAS_STATUS_INVALID_VALUE  ? -EINVAL
             : s == CUBLAS_STATUS_NOT_SUPPORTED  ? -ENOTSUP
             : s == CUBLAS_STATUS_ARCH_MISMATCH  ? -ENOTSUP
                                                 : -EIO;
    /* A kernel or copy that failed earlier on this device leaves a sticky
     * error, and cuBLAS then reports only that its program failed: name the
     * device's error, the cause the user needs */
    cudaError_t e = s == CUBLAS_STATUS_EXECUTION_FAILED ? cudaPeekAtLastError() : cudaSuccess;
    if (e != cudaSuccess)
        fso_cuda_fail(be, fso_cuda_errno(e),
                      "CUDA device %d: %s: %s (%s): %s (%s), from work queued before it",
                      FSO_CUDA_CTX(be)->ordinal, what, cublasGetStatusString(s),
                      cublasGetStatusName(s), cudaGetErrorString(e), cudaGetErrorName(e));
    else
        fso_cuda_fail(be, rc, "CUDA device %d: %s: %s (%s)", FSO_CUDA_CTX(be)->ordinal, what,
                      cublasGetStatusString(s), cublasGetStatusName(s));
    return rc;
}

/* ------------------------------------------------------------ ordering */

cudaStream_t fso_cuda_begin(fso_backend *be, fso_cuda_stream t)
{
    return fso_cuda_begin_after(be, t, 0);
}

/* Stream t waits for stream s: for all its queued work (its tail event,
 * recorded once per batch), or with a mark only up to that mark. Host-to-
 * device copies are always waited for whole: staging copies feed what
 * follows them (a gather sends the shard just copied in). */
cudaStream_t fso_cuda_begin_after(fso_backend *be, fso_cuda_stream t, uint64_t after)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    cudaError_t e = cudaSetDevice(ctx->ordinal);
    const char *what = "cudaSetDevice";
    const int i = (int)((after >> 1) % FSO_CUDA_MARKS);
    pthread_mutex_lock(&ctx->mu);
    const bool marked = after != 0 && ctx->mark_ticket[i] == after; /* still in the ring */
    if (after != 0 && !marked)
        ctx->stale_marks++; /* after everything instead */
    for (int s = 0; s < FSO_CS_N && e == cudaSuccess; s++) {
        if (s == (int)t)
            continue;
        cudaEvent_t ev;
        uint64_t upto;
        if (t == FSO_CS_COMPUTE && s == FSO_CS_D2H)
            continue; /* backend.h order_after: not what compute reads */
        if (t == FSO_CS_COMPUTE && s == FSO_CS_COLL) {
            ev = ctx->gather_ev; /* the gathers' results only */
            upto = ctx->gather_gen;
        } else if (marked && s != FSO_CS_H2D) {
            if (!ctx->mark_set[i][s])
                continue;
            ev = ctx->mark_ev[i][s];
            upto = ctx->mark_gen[i][s];
        } else {
            if (ctx->recorded[s] != ctx->gen[s] && ctx->gen[s] > ctx->waited[t][s]) {
                what = "cudaEventRecord";
                if ((e = cudaEventRecord(ctx->tail[s], ctx->stream[s])) != cudaSuccess)
                    break;
                ctx->recorded[s] = ctx->gen[s];
            }
            ev = ctx->tail[s];
            upto = ctx->gen[s];
        }
        if (upto <= ctx->waited[t][s])
            continue;
        what = "cudaStreamWaitEvent";
        if ((e = cudaStreamWaitEvent(ctx->stream[t], ev, 0)) != cudaSuccess)
            break;
        ctx->waited[t][s] = upto;
    }
    pthread_mutex_unlock(&ctx->mu);
    fso_cuda_check(be, e, what);
    return ctx->stream[t];
}

void fso_cuda_end(fso_backend *be, fso_cuda_stream s, const char *what)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    pthread_mutex_lock(&ctx->mu);
    ctx->gen[s]++;
    pthread_mutex_unlock(&ctx->mu);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && ctx->sync_each)
        e = cudaStreamSynchronize(ctx->stream[s]);
    if (e != cudaSuccess)
        fso_cuda_check(be, e, what);
}

void fso_cuda_end_gather(fso_backend *be, const char *what)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    fso_cuda_end(be, FSO_CS_COLL, what);
    pthread_mutex_lock(&ctx->mu);
    cudaError_t e = cudaEventRecord(ctx->gather_ev, ctx->stream[FSO_CS_COLL]);
    if (e == cudaSuccess)
        ctx->gather_gen = ctx->gen[FSO_CS_COLL];
    pthread_mutex_unlock(&ctx->mu);
    fso_cuda_check(be, e, "all_gather: cudaEventRecord");
}

/* Later compute waits on the device for the work before the mark on the
 * other streams (a stale mark: for all their queued work); the host does
 * not block (backend.h order_after). */
static void cu_order_after(fso_backend *be, uint64_t ticket)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    const int t = FSO_CS_COMPUTE;
    if (ticket == 0)
        return;
    cudaError_t e = cudaSetDevice(ctx->ordinal);
    const char *what = "order_after: cudaStreamWaitEvent";
    const int i = (int)((ticket >> 1) % FSO_CUDA_MARKS);
    pthread_mutex_lock(&ctx->mu);
    const bool marked = ctx->mark_ticket[i] == ticket;
    if (!marked)
        ctx->stale_marks++; /* after everything instead */
    for (int s = 0; s < FSO_CS_N && e == cudaSuccess; s++) {
        if (s == t)
            continue;
        cudaEvent_t ev = ctx->mark_ev[i][s];
        uint64_t upto = ctx->mark_gen[i][s];
        if (!marked) {
            if (ctx->recorded[s] != ctx->gen[s] && ctx->gen[s] > ctx->waited[t][s]) {
                if ((e = cudaEventRecord(ctx->tail[s], ctx->stream[s])) != cudaSuccess) {
                    what = "order_after: cudaEventRecord";
                    break;
                }
                ctx->recorded[s] = ctx->gen[s];
            }
            ev = ctx->tail[s];
            upto = ctx->gen[s];
        } else if (!ctx->mark_set[i][s]) {
            continue;
        }
        if (upto <= ctx->waited[t][s])
            continue;
        if ((e = cudaStreamWaitEvent(ctx->stream[t], ev, 0)) != cudaSuccess)
            break;
        ctx->waited[t][s] = upto;
    }
    pthread_mutex_unlock(&ctx->mu);
    fso_cuda_check(be, e, what);
}

/* ------------------------------------------------------------ memory */

static void count_add(fso_backend *be, size_t bytes)
{
    be->mem_used_bytes += bytes;
    if (be->mem_used_bytes > be->mem_peak_bytes)
        be->mem_peak_bytes = be->mem_used_bytes;
}

void *fso_cuda_scratch(fso_backend *be, size_t bytes)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    if (bytes <= ctx->scratch_bytes)
        return ctx->scratch;
    /* exactly the need, rounded: the planner counts the widest op's
     * (fso_model_cuda_scratch_bytes_for); the few sizes a step asks for
     * grow it during the first step only */
    const size_t want = (bytes + SCRATCH_ROUND - 1) / SCRATCH_ROUND * SCRATCH_ROUND;
    cudaStream_t s = ctx->stream[FSO_CS_COMPUTE];
    void *p = NULL;
    cudaError_t e;
    if (ctx->mempools) { /* stream-ordered: the old one is freed after its last use */
        if (ctx->scratch)
            cudaFreeAsync(ctx->scratch, s);
        e = cudaMallocAsync(&p, want, s);
    } else {
        if (ctx->scratch) {
            cudaStreamSynchronize(s);
            cudaFree(ctx->scratch);
        }
        e = cudaMalloc(&p, want);
    }
    be->mem_used_bytes -= ctx->scratch_bytes;
    ctx->scratch = NULL;
    ctx->scratch_bytes = 0;
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        fso_cuda_fail(be, -ENOMEM, "CUDA device %d: cannot grow the scratch buffer to %zu MiB: %s "
                                   "(%zu MiB free of %zu MiB); shorten data.seq_len or the micro "
                                   "batch",
                      ctx->ordinal, want >> 20, cudaGetErrorString(e), fr >> 20, tot >> 20);
        return NULL;
    }
    ctx->scratch = p;
    ctx->scratch_bytes = want;
    count_add(be, want);
    return p;
}

static int cu_buf_alloc(fso_backend *be, size_t bytes, void **out)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    const size_t rounded = (bytes + ALLOC_ROUND - 1) & ~(size_t)(ALLOC_ROUND - 1);
    if (be->mem_cap_bytes && be->mem_used_bytes + rounded > be->mem_cap_bytes) {
        snprintf(be->err, sizeof be->err,
                 "device %d: %zu bytes more would exceed its memory cap (%zu of %zu bytes in use)",
                 be->device, rounded, be->mem_used_bytes, be->mem_cap_bytes);
        return -ENOMEM;
    }
    if (ctx->n_allocs == ctx->cap_allocs) {
        size_t cap = ctx->cap_allocs ? 2 * ctx->cap_allocs : 64;
        fso_cuda_alloc *a = realloc(ctx->allocs, cap * sizeof *a);
        if (!a) {
            snprintf(be->err, sizeof be->err, "out of host memory for the allocation table");
            return -ENOMEM;
        }
        ctx->allocs = a;
        ctx->cap_allocs = cap;
    }
    void *p = NULL;
    cudaSetDevice(ctx->ordinal);
    cudaError_t e = cudaMalloc(&p, rounded ? rounded : ALLOC_ROUND);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        snprintf(be->err, sizeof be->err,
                 "CUDA device %d: cannot allocate %zu bytes: %s (%zu MiB free of %zu MiB, %zu MiB "
                 "held by fsoff)",
                 ctx->ordinal, rounded, cudaGetErrorString(e), fr >> 20, tot >> 20,
                 be->mem_used_bytes >> 20);
        return fso_cuda_errno(e);
    }
    /* new buffers are zero, as on the CPU backends */
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    fso_cuda_check(be, cudaMemsetAsync(p, 0, rounded ? rounded : ALLOC_ROUND, s),
                   "buf_alloc: cudaMemsetAsync");
    fso_cuda_end(be, FSO_CS_COMPUTE, "buf_alloc");
    ctx->allocs[ctx->n_allocs++] = (fso_cuda_alloc){p, rounded};
    count_add(be, rounded);
    *out = p;
    return 0;
}

static void cu_buf_free(fso_backend *be, void *buf)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    if (!buf)
        return;
    size_t i = 0;
    while (i < ctx->n_allocs && ctx->allocs[i].ptr != buf)
        i++;
    FSO_BUG_ON(i == ctx->n_allocs, "CUDA device %d: buf_free of %p, which buf_alloc did not return",
               ctx->ordinal, buf);
    be->mem_used_bytes -= ctx->allocs[i].bytes;
    ctx->allocs[i] = ctx->allocs[--ctx->n_allocs];
    cudaSetDevice(ctx->ordinal);
    fso_cuda_check(be, cudaFree(buf), "cudaFree"); /* waits for the device */
}

static void cu_memset0(fso_backend *be, void *dst, size_t bytes)
{
    if (bytes == 0)
        return;
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    fso_cuda_check(be, cudaMemsetAsync(dst, 0, bytes, s), "memset0");
    fso_cuda_end(be, FSO_CS_COMPUTE, "memset0");
}

/* Either direction, and device to device: the runtime tells by the
 * pointers (unified addressing). Pageable host memory makes the call wait
 * until the host side is done with it; pinned memory does not. */
static void copy_on(fso_backend *be, fso_cuda_stream which, void *dst, const void *src,
                    size_t bytes, uint64_t after, const char *what)
{
    if (bytes == 0 || dst == src)
        return;
    cudaStream_t s = fso_cuda_begin_after(be, which, after);
    fso_cuda_check(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), what);
    fso_cuda_end(be, which, what);
}

static void cu_copy_h2d(fso_backend *be, void *dst, const void *src, size_t bytes)
{
    copy_on(be, FSO_CS_H2D, dst, src, bytes, 0, "copy_h2d");
}

static void cu_copy_h2d_after(fso_backend *be, void *dst, const void *src, size_t bytes,
                              uint64_t after)
{
    copy_on(be, FSO_CS_H2D, dst, src, bytes, after, "copy_h2d");
}

static void cu_copy_d2h(fso_backend *be, void *dst, const void *src, size_t bytes)
{
    copy_on(be, FSO_CS_D2H, dst, src, bytes, 0, "copy_d2h");
}

static void cu_copy_d2h_after(fso_backend *be, void *dst, const void *src, size_t bytes,
                              uint64_t after)
{
    copy_on(be, FSO_CS_D2H, dst, src, bytes, after, "copy_d2h");
}

/* Wait for every stream: the work queued before the call is done, and
 * later work need not wait for it on the device. */
static void drain_streams(fso_backend *be)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    uint64_t done[FSO_CS_N];
    pthread_mutex_lock(&ctx->mu);
    memcpy(done, ctx->gen, sizeof done);
    pthread_mutex_unlock(&ctx->mu);
    for (int s = 0; s < FSO_CS_N; s++)
        fso_cuda_check(be, cudaStreamSynchronize(ctx->stream[s]), "cudaStreamSynchronize");
    pthread_mutex_lock(&ctx->mu);
    for (int t = 0; t < FSO_CS_N; t++)
        for (int s = 0; s < FSO_CS_N; s++)
            if (ctx->waited[t][s] < done[s])
                ctx->waited[t][s] = done[s];
    pthread_mutex_unlock(&ctx->mu);
}

/* The sqnorm results queued before `upto` are back (the streams were
 * drained after reading it): add them where they go. */
static void fold_sqnorms(fso_cuda_ctx *ctx, uint64_t upto)
{
    pthread_mutex_lock(&ctx->mu);
    for (; ctx->sq_tail < upto; ctx->sq_tail++) {
        size_t i = ctx->sq_tail % FSO_CUDA_SQ_MAX;
        *ctx->sq_out[i] += ctx->host_sq[i];
    }
    pthread_mutex_unlock(&ctx->mu);
}

static uint64_t sq_queued(fso_cuda_ctx *ctx)
{
    pthread_mutex_lock(&ctx->mu);
    uint64_t h = ctx->sq_head;
    pthread_mutex_unlock(&ctx->mu);
    return h;
}

/* Every stream drained and the results queued before it delivered. */
static void drain_and_fold(fso_backend *be)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    uint64_t upto = sq_queued(ctx);
    drain_streams(be);
    fold_sqnorms(ctx, upto);
}

static int cu_sync(fso_backend *be)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    fso_cuda_check(be, cudaMemcpyAsync(ctx->host_flags, ctx->dev_flags, sizeof(unsigned),
                                       cudaMemcpyDeviceToHost, s),
                   "sync: reading the error flags");
    fso_cuda_end(be, FSO_CS_COMPUTE, "sync");
    drain_and_fold(be);
    fso_cuda_check(be, cudaGetLastError(), "sync");
    unsigned f = __atomic_load_n(ctx->host_flags, __ATOMIC_RELAXED);
    if (f)
        fso_cuda_fail(be, -EINVAL,
                      "CUDA device %d: %s; check the data against model.vocab_size", ctx->ordinal,
                      f & FSO_CUDA_FLAG_BAD_TARGET ? "a target token id is outside [0, vocab_size) "
                                                     "in cross_entropy"
                                                   : "a negative token id reached embedding");
    return fso_cuda_status(be);
}

/* [p, p + bytes) lies in a buffer of this backend. */
static bool owned(fso_cuda_ctx *ctx, const void *p, size_t bytes)
{
    const char *c = p;
    for (size_t i = 0; i < ctx->n_allocs; i++) {
        const char *b = ctx->allocs[i].ptr;
        if (c >= b && c + bytes <= b + ctx->allocs[i].bytes)
            return true;
    }
    return false;
}

/* *out += sum of x^2 (square) or of x, in order on the compute stream; the
 * double comes back to pinned memory asynchronously and is added at the
 * next sync (or wait_mark of a later full mark), so taking a block's norm
 * or a micro-batch's loss never stalls the host. Host memory the device
 * cannot read is summed on the CPU in the device's order (sum_order.h,
 * every backend's): the same bits, at once. */
static void reduce_to_host(fso_backend *be, double *out, const float *x, size_t n, int square,
                           const char *what)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    if (n == 0)
        return;
    fso_cuda_check(be, cudaSetDevice(ctx->ordinal), "cudaSetDevice");
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    a.type = cudaMemoryTypeDevice;
    /* the backend's own buffers without asking the driver (the hot path:
     * a norm per block, a loss per micro-batch) */
    if (!owned(ctx, x, n * sizeof *x) && cudaPointerGetAttributes(&a, x) != cudaSuccess) {
        cudaGetLastError();
        a.type = cudaMemoryTypeUnregistered;
    }
    const float *dx = x;
    if (a.type == cudaMemoryTypeHost)
        dx = a.devicePointer;
    if (a.type == cudaMemoryTypeUnregistered || !dx) {
        drain_streams(be); /* copies into x are done */
        *out += fso_cuda_reduce_host(x, n, square);
        return;
    }
    pthread_mutex_lock(&ctx->mu);
    bool full = ctx->sq_head - ctx->sq_tail == FSO_CUDA_SQ_MAX;
    pthread_mutex_unlock(&ctx->mu);
    if (full) /* rare: that many results without a sync */
        drain_and_fold(be);
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    double *scr = fso_cuda_scratch(be, sizeof(double) * fso_cuda_reduce_scratch_elems(n));
    if (scr) {
        fso_cuda_reduce_device(be, scr, dx, n, square);
        /* the slot is taken and its copy queued (before the scratch's next
         * use on this stream) under the lock, so a sync on another thread
         * either waits for the copy or leaves the slot for later */
        pthread_mutex_lock(&ctx->mu);
        size_t slot = ctx->sq_head % FSO_CUDA_SQ_MAX;
        ctx->sq_out[slot] = out;
        cudaError_t e = cudaMemcpyAsync(&ctx->host_sq[slot], scr, sizeof(double),
                                        cudaMemcpyDeviceToHost, s);
        if (e == cudaSuccess)
            ctx->sq_head++;
        pthread_mutex_unlock(&ctx->mu);
        fso_cuda_check(be, e, what);
    }
    fso_cuda_end(be, FSO_CS_COMPUTE, what);
}

static void cu_sqnorm(fso_backend *be, double *out, const float *x, size_t n)
{
    reduce_to_host(be, out, x, n, 1, "sqnorm");
}

static void cu_sum(fso_backend *be, double *out, const float *x, size_t n)
{
    reduce_to_host(be, out, x, n, 0, "sum");
}

/* A mark: events recorded on every stream with work (copies_only: on the
 * two copy streams). A full mark also notes the sqnorm and sum results
 * queued before it, which wait_mark then adds to their outputs. */
static uint64_t take_mark(fso_backend *be, bool copies_only)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    fso_cuda_check(be, cudaSetDevice(ctx->ordinal), "cudaSetDevice");
    pthread_mutex_lock(&ctx->mu);
    uint64_t n = ++ctx->n_marks, t = n << 1 | (copies_only ? 1 : 0);
    int i = (int)(n % FSO_CUDA_MARKS);
    cudaError_t e = cudaSuccess;
    ctx->mark_ticket[i] = t;
    ctx->mark_sq[i] = copies_only ? 0 : ctx->sq_head;
    for (int s = 0; s < FSO_CS_N && e == cudaSuccess; s++) {
        bool copy = s == FSO_CS_H2D || s == FSO_CS_D2H;
        ctx->mark_set[i][s] = ctx->gen[s] > 0 && (copy || !copies_only);
        ctx->mark_gen[i][s] = ctx->gen[s];
        if (ctx->mark_set[i][s])
            e = cudaEventRecord(ctx->mark_ev[i][s], ctx->stream[s]);
    }
    pthread_mutex_unlock(&ctx->mu);
    fso_cuda_check(be, e, "mark: cudaEventRecord");
    return t;
}

static uint64_t cu_mark(fso_backend *be)
{
    return take_mark(be, false);
}

static uint64_t cu_mark_copies(fso_backend *be)
{
    return take_mark(be, true);
}

static void cu_wait_mark(fso_backend *be, uint64_t ticket)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    if (ticket == 0)
        return;
    int i = (int)((ticket >> 1) % FSO_CUDA_MARKS);
    pthread_mutex_lock(&ctx->mu);
    uint64_t held = ctx->mark_ticket[i], sq = ctx->mark_sq[i];
    bool set[FSO_CS_N];
    memcpy(set, ctx->mark_set[i], sizeof set);
    if (held != ticket)
        ctx->stale_marks++; /* a later mark's events, or all of the work */
    pthread_mutex_unlock(&ctx->mu);
    if (held != ticket && (held & 1) && !(ticket & 1)) {
        drain_and_fold(be); /* a copies-only mark took this full one's slot: wait for all */
        return;
    }
    /* this mark, or a later one of at least its streams (a re-record in
     * between only moves the events later) */
    for (int s = 0; s < FSO_CS_N; s++)
        if (set[s])
            fso_cuda_check(be, cudaEventSynchronize(ctx->mark_ev[i][s]), "wait_mark");
    if (!(held & 1))
        fold_sqnorms(ctx, sq);
}

static uint64_t cu_stale_marks(fso_backend *be)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    pthread_mutex_lock(&ctx->mu);
    uint64_t n = ctx->stale_marks;
    pthread_mutex_unlock(&ctx->mu);
    return n;
}

static const fso_backend_ops cuda_ops = {
    .name = "cuda",
    .host_addressable = 0,
    .buf_alloc = cu_buf_alloc,
    .buf_free = cu_buf_free,
    .memset0 = cu_memset0,
    .copy_h2d = cu_copy_h2d,
    .copy_d2h = cu_copy_d2h,
    .sync = cu_sync,
    .mark = cu_mark,
    .mark_copies = cu_mark_copies,
    .wait_mark = cu_wait_mark,
    .order_after = cu_order_after,
    .stale_marks = cu_stale_marks,
    .copy_h2d_after = cu_copy_h2d_after,
    .copy_d2h_after = cu_copy_d2h_after,
    .embedding_fwd = fso_cuda_embedding_fwd,
    .embedding_bwd = fso_cuda_embedding_bwd,
    .rmsnorm_fwd = fso_cuda_rmsnorm_fwd,
    .rmsnorm_bwd = fso_cuda_rmsnorm_bwd,
    .matmul_fwd = fso_cuda_matmul_fwd,
    .matmul_bwd = fso_cuda_matmul_bwd,
    .rope = fso_cuda_rope,
    .attention_fwd = fso_cuda_attention_fwd,
    .attention_bwd = fso_cuda_attention_bwd,
    .swiglu_fwd = fso_cuda_swiglu_fwd,
    .swiglu_bwd = fso_cuda_swiglu_bwd,
    .bias_add = fso_cuda_bias_add,
    .bias_bwd = fso_cuda_bias_bwd,
    .add = fso_cuda_add,
    .cross_entropy = fso_cuda_cross_entropy,
    .sqnorm = cu_sqnorm,
    .sum = cu_sum,
    .cast_bf16_f32 = fso_cuda_cast_bf16_f32,
    .cast_f32_bf16 = fso_cuda_cast_f32_bf16,
    .adamw = fso_cuda_adamw,
    .destroy = fso_backend_destroy_cuda,
    .coll_create = fso_coll_create_nccl,
};

/* ------------------------------------------------------------ lifetime */

int fso_backend_is_cuda(const fso_backend *be)
{
    return be && be->ops == &cuda_ops;
}

fso_cuda_math fso_cuda_get_math(const fso_backend *be)
{
    return FSO_CUDA_CTX(be)->math;
}

void fso_cuda_set_math(fso_backend *be, fso_cuda_math math)
{
    FSO_CUDA_CTX(be)->math = math;
}


/* FSO_CUDA_WAIT: how the host waits for the device. "block" (the default):
 * on an OS primitive, leaving the core to the CPU AdamW, the NVMe reaper and
 * the other ranks' threads; "spin": busy-polling, the runtime's choice for a
 * process with few contexts: each wait returns sooner, holding a core. */
static int wait_from_env(bool *spin, char *err, size_t errlen)
{
    const char *w = getenv("FSO_CUDA_WAIT");
    *spin = false;
    if (!w || !*w || strcmp(w, "block") == 0)
        return 0;
    if (strcmp(w, "spin") == 0) {
        *spin = true;
        return 0;
    }
    snprintf(err, errlen, "FSO_CUDA_WAIT=%s: expected \"block\" (the default) or \"spin\"", w);
    return -EINVAL;
}

static int math_from_env(fso_cuda_math *out, char *err, size_t errlen)
{
    const char *m = getenv("FSO_CUDA_MATH");
    if (!m || !*m || strcmp(m, "bf16") == 0) {
        *out = FSO_CUDA_MATH_BF16;
        return 0;
    }
    if (strcmp(m, "fp32") == 0) {
        *out = FSO_CUDA_MATH_FP32;
        return 0;
    }
    snprintf(err, errlen, "FSO_CUDA_MATH=%s: expected \"bf16\" (the default) or \"fp32\"", m);
    return -EINVAL;
}

void fso_backend_destroy_cuda(fso_backend *be)
{
    if (!be)
        return;
    fso_cuda_ctx *ctx = be->ctx;
    if (ctx) {
        cudaSetDevice(ctx->ordinal);
        if (ctx->scratch && ctx->mempools)
            cudaFreeAsync(ctx->scratch, ctx->stream[FSO_CS_COMPUTE]);
        else if (ctx->scratch)
            cudaFree(ctx->scratch);
        for (int s = 0; s < FSO_CS_N; s++)
            if (ctx->stream[s])
                cudaStreamSynchronize(ctx->stream[s]);
        for (size_t i = 0; i < ctx->n_allocs; i++)
            cudaFree(ctx->allocs[i].ptr);
        free(ctx->allocs);
        if (ctx->blas)
            cublasDestroy(ctx->blas);
        cudaFree(ctx->blas_ws);
        cudaFree(ctx->dev_flags);
        cudaFreeHost(ctx->host_flags);
        cudaFreeHost(ctx->host_sq);
        for (int i = 0; i < FSO_CUDA_MARKS; i++)
            for (int s = 0; s < FSO_CS_N; s++)
                if (ctx->mark_ev[i][s])
                    cudaEventDestroy(ctx->mark_ev[i][s]);
        if (ctx->gather_ev)
            cudaEventDestroy(ctx->gather_ev);
        for (int s = 0; s < FSO_CS_N; s++) {
            if (ctx->tail[s])
                cudaEventDestroy(ctx->tail[s]);
            if (ctx->stream[s])
                cudaStreamDestroy(ctx->stream[s]);
        }
        cudaGetLastError();
        pthread_mutex_destroy(&ctx->mu);
        free(ctx);
    }
    free(be);
}

/* The host's waits (sync, wait_mark, NCCL's barrier) block rather than
 * spin: with a context or two per process the runtime would otherwise
 * poll, holding a core the optimizer's threads need. The device's
 * schedule flag covers stream waits; the mark events carry their own. */
static void set_host_wait(int device, bool spin)
{
    unsigned f = 0;
    cudaError_t fe = cudaGetDeviceFlags(&f);
    if (fe == cudaSuccess)
        fe = cudaSetDeviceFlags((f & cudaDeviceMask & ~(unsigned)cudaDeviceScheduleMask) |
                                (spin ? cudaDeviceScheduleSpin
                                      : cudaDeviceScheduleBlockingSync));
    if (fe != cudaSuccess) { /* not fatal: the waits keep the runtime's default */
        cudaGetLastError();
        fprintf(stderr, "fsoff: warning: CUDA device %d: cannot set how the host waits "
                        "(cudaSetDeviceFlags: %s); stream waits keep the runtime's default\n",
                device, cudaGetErrorString(fe));
    }
}

/* Read the device's attributes and create the context's streams, events,
 * error flags, host buffers and cuBLAS workspace on the current device.
 * Returns the first failure, with *what naming the call that failed. */
static cudaError_t ctx_create_resources(fso_cuda_ctx *ctx, int device, bool spin,
                                        const char **what)
{
    const unsigned mark_flags = cudaEventDisableTiming | (spin ? 0 : cudaEventBlockingSync);
    int cc_major = 0, pools = 0;
    *what = "cudaDeviceGetAttribute";
    cudaError_t e = cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&ctx->sm_count, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device);
    ctx->mempools = pools;
    for (int s = 0; s < FSO_CS_N && e == cudaSuccess; s++) {
        *what = "cudaStreamCreate";
        e = cudaStreamCreateWithFlags(&ctx->stream[s], cudaStreamNonBlocking);
        if (e == cudaSuccess) {
            *what = "cudaEventCreate";
            e = cudaEventCreateWithFlags(&ctx->tail[s], cudaEventDisableTiming);
        }
    }
    if (e == cudaSuccess) {
        *what = "cudaEventCreate";
        e = cudaEventCreateWithFlags(&ctx->gather_ev, cudaEventDisableTiming);
    }
    if (e == cudaSuccess) {
        *what = "cudaMalloc (error flags)";
        e = cudaMalloc((void **)&ctx->dev_flags, sizeof(unsigned));
    }
    if (e == cudaSuccess)
        e = cudaMemset(ctx->dev_flags, 0, sizeof(unsigned));
    if (e == cudaSuccess) {
        *what = "cudaHostAlloc";
        e = cudaHostAlloc((void **)&ctx->host_flags, sizeof(unsigned), cudaHostAllocPortable);
    }
    if (e == cudaSuccess)
        e = cudaHostAlloc((void **)&ctx->host_sq, sizeof(double) * FSO_CUDA_SQ_MAX,
                          cudaHostAllocPortable);
    for (int i = 0; i < FSO_CUDA_MARKS && e == cudaSuccess; i++)
        for (int s = 0; s < FSO_CS_N && e == cudaSuccess; s++) {
            *what = "cudaEventCreate (marks)";
            e = cudaEventCreateWithFlags(&ctx->mark_ev[i][s], mark_flags);
        }
    /* cuBLAS: its own workspace, so it never allocates inside an op */
    ctx->blas_ws_bytes = cc_major >= 9 ? (size_t)32 << 20 : (size_t)4 << 20;
    if (e == cudaSuccess) {
        *what = "cudaMalloc (cuBLAS workspace)";
        e = cudaMalloc(&ctx->blas_ws, ctx->blas_ws_bytes);
    }
    return e;
}

int fso_backend_create_cuda(fso_backend **out, int device, size_t mem_cap_bytes, char *err,
                            size_t errlen)
{
    char why[256] = "";
    fso_cuda_math math;
    *out = NULL;
    int n = fso_cuda_device_count(why, sizeof why);
    if (n == 0) {
        snprintf(err, errlen, "%s", why);
        return -ENODEV;
    }
    if (device < 0 || device >= n) {
        snprintf(err, errlen, "CUDA device %d: this machine has %d (0..%d; CUDA_VISIBLE_DEVICES "
                              "renumbers them)", device, n, n - 1);
        return -EINVAL;
    }
    bool spin;
    int rc = math_from_env(&math, err, errlen);
    if (rc == 0)
        rc = wait_from_env(&spin, err, errlen);
    if (rc < 0)
        return rc;

    fso_backend *be = calloc(1, sizeof *be);
    fso_cuda_ctx *ctx = calloc(1, sizeof *ctx);
    if (!be || !ctx) {
        free(be);
        free(ctx);
        snprintf(err, errlen, "out of host memory");
        return -ENOMEM;
    }
    pthread_mutex_init(&ctx->mu, NULL);
    be->ops = &cuda_ops;
    be->ctx = ctx;
    be->threads = 1;
    be->device = device;
    be->mem_cap_bytes = mem_cap_bytes;
    ctx->ordinal = device;
    ctx->math = math;
    ctx->spin = spin;
    /* FSO_CUDA_SYNC=1: wait after every queued item and check it, so a
     * failing kernel or copy is named (for debugging; slow) */
    const char *sync_each = getenv("FSO_CUDA_SYNC");
    ctx->sync_each = sync_each && strcmp(sync_each, "1") == 0;

    const char *what = "cudaSetDevice";
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) {
        set_host_wait(device, spin);
        e = ctx_create_resources(ctx, device, spin, &what);
    }
    if (e != cudaSuccess) {
        snprintf(err, errlen, "CUDA device %d: %s: %s", device, what, cudaGetErrorString(e));
        cudaGetLastError();
        fso_backend_destroy_cuda(be);
        return fso_cuda_errno(e);
    }
    count_add(be, ctx->blas_ws_bytes);
    cublasStatus_t bs = cublasCreate(&ctx->blas);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetStream(ctx->blas, ctx->stream[FSO_CS_COMPUTE]);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetWorkspace(ctx->blas, ctx->blas_ws, ctx->blas_ws_bytes);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "CUDA device %d: cuBLAS: %s", device, cublasGetStatusString(bs));
        fso_backend_destroy_cuda(be);
        return -EIO;
    }
    *out = be;
    return 0;
}
