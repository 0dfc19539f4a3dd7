/* coll_nccl_rail.c — one box's end of a rail across boxes over NCCL: the
 * collective interface (coll.h) over one communicator whose ranks are the
 * boxes, on one CUDA device (contract: cuda_backend.h,
 * fso_coll_create_nccl_rail; the in-box collectives are coll_nccl.c).
 *
 * Every wait is polled. The communicator is non-blocking (ncclConfig_t
 * blocking = 0): its creation and each call may return ncclInProgress, and
 * ncclCommGetAsyncError says when the work is issued or has failed; the
 * rail's own stream (cudaStreamQuery) says when it is complete. Each call
 * polls both about every POLL_US until done, failed, or past timeout_s from
 * its start; a failure aborts the communicator (ncclCommAbort, which ends
 * the NCCL kernels still waiting on the stream), marks the rail broken and
 * writes one line into c->err: the call, the device and box, why, and what
 * the boxes' heartbeat says of each other box (describe). Later calls fail
 * at once with -ECANCELED.
 *
 * One thread at a time per rail (coll.h): nothing here is locked.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nccl.h>

#include "cuda_impl.h"
#include "nccl_rows.h"
#include "util.h"

_Static_assert(FSO_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES,
               "cuda_backend.h's FSO_NCCL_ID_BYTES is ncclUniqueId's size");

#define MAX_F64 64      /* all_reduce_f64's values (losses and norms) */
#define POLL_US 1000    /* between two looks at the communicator and the stream */

struct rail {
    ncclComm_t comm;         /* NULL: never made; aborted ones are freed by NCCL */
    cudaStream_t stream;     /* the rail's own, non-blocking, on `device` */
    int device, boxes, box;
    double timeout_ms;       /* 0: never */
    fso_rail_describe_fn describe;
    bool broken;             /* aborted: every later call fails at once */
    char why[256];           /* the failure that broke it */
    double *dev_f64;         /* MAX_F64 in, then boxes * MAX_F64 gathered */
    double *host_f64;        /* pinned, the same layout */
    float *dev_one;          /* barrier's all-reduce */
    uint16_t *dev_rows;      /* reduce_scatter_bf16's boxes pieces received, */
    size_t rows_elems;       /* grown to the largest call */
};

static void sleep_poll(void)
{
    struct timespec ts = {0, POLL_US * 1000L};
    nanosleep(&ts, NULL);
}

/* "rail WHAT on CUDA device D (box B of N): " into buf; its length. */
static int rail_prefix(const struct rail *x, const char *what, char *buf, size_t len)
{
    int n = snprintf(buf, len, "rail %s on CUDA device %d (box %d of %d): ", what, x->device,
                     x->box, x->boxes);
    return n < 0 ? 0 : n >= (int)len ? (int)len - 1 : n;
}

/* Abort the communicator and break the rail: c->err says what failed (fmt),
 * then what the heartbeat says of each other box. Returns rc. */
static int rail_break(fso_coll *c, const char *what, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int rail_break(fso_coll *c, const char *what, int rc, const char *fmt, ...)
{
    struct rail *x = c->ctx;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->why, sizeof x->why, fmt, ap);
    va_end(ap);
    if (x->comm && !x->broken) {
        cudaSetDevice(x->device);
        ncclCommAbort(x->comm); /* blocking whatever the config; frees the communicator */
        cudaGetLastError();
    }
    x->broken = true;
    size_t len = sizeof c->err;
    int off = rail_prefix(x, what, c->err, len);
    off += snprintf(c->err + off, len - (size_t)off, "%s, so the rail was aborted", x->why);
    for (int k = 0; k < x->boxes && x->describe && off < (int)len - 1; k++) {
        if (k == x->box)
            continue;
        char line[256] = "";
        x->describe(k, line, sizeof line);
        off += snprintf(c->err + off, len - (size_t)off, "; %s", line);
    }
    return rc;
}

/* An NCCL failure of `what`: its text and NCCL's last error. */
static int rail_nccl_fail(fso_coll *c, const char *what, ncclResult_t r)
{
    struct rail *x = c->ctx;
    const char *last = x->comm ? ncclGetLastError(x->comm) : ncclGetLastError(NULL);
    return rail_break(c, what, fso_nccl_errno(r), "NCCL: %s%s%s", ncclGetErrorString(r),
                      last && *last ? ": " : "", last ? last : "");
}

/* Poll until what was issued with result r is issued (the communicator's
 * state is no longer ncclInProgress) and, with `idle`, the rail's stream
 * has completed it; bounded by the timeout from t0. 0 or the rail broken. */
static int rail_wait(fso_coll *c, const char *what, ncclResult_t r, bool idle, double t0)
{
    struct rail *x = c->ctx;
    if (r != ncclSuccess && r != ncclInProgress)
        return rail_nccl_fail(c, what, r);
    for (;;) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(x->comm, &state);
        if (q != ncclSuccess)
            state = q;
        if (state != ncclSuccess && state != ncclInProgress)
            return rail_nccl_fail(c, what, state);
        if (state == ncclSuccess) {
            if (!idle)
                return 0;
            cudaError_t e = cudaStreamQuery(x->stream);
            if (e == cudaSuccess)
                return 0;
            if (e != cudaErrorNotReady) {
                cudaGetLastError();
                return rail_break(c, what, fso_cuda_errno(e), "CUDA: %s", cudaGetErrorString(e));
            }
        }
        double waited = fso_now_ms() - t0;
        if (x->timeout_ms > 0 && waited >= x->timeout_ms)
            return rail_break(c, what, -ETIMEDOUT, "no progress for %.1f s (the rail's "
                              "timeout, comm.timeout_s, is %g s)", waited / 1000.0,
                              x->timeout_ms / 1000.0);
        sleep_poll();
    }
}

/* Before a call: 0, or -ECANCELED on a broken rail and -EINVAL for a call
 * made as another box, with c->err saying so. Makes the device current. */
static int rail_enter(fso_coll *c, int rank, const char *what)
{
    struct rail *x = c->ctx;
    if (x->broken) {
        int off = rail_prefix(x, what, c->err, sizeof c->err);
        snprintf(c->err + off, sizeof c->err - (size_t)off,
                 "the rail was aborted before (%s); the boxes are out of step and the run has "
                 "to stop", x->why);
        return -ECANCELED;
    }
    if (rank != x->box) {
        int off = rail_prefix(x, what, c->err, sizeof c->err);
        snprintf(c->err + off, sizeof c->err - (size_t)off, "called as box %d", rank);
        return -EINVAL;
    }
    c->err[0] = 0;
    cudaError_t e = cudaSetDevice(x->device);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return rail_break(c, what, fso_cuda_errno(e), "cudaSetDevice: %s",
                          cudaGetErrorString(e));
    }
    return 0;
}

static int rail_all_gather(fso_coll *c, int rank, const void *send, void *recv, size_t count,
                           fso_dtype dt, uint64_t after)
{
    (void)after; /* synchronous: send is complete when called */
    struct rail *x = c->ctx;
    double t0 = fso_now_ms();
    int rc = rail_enter(c, rank, "all_gather");
    if (rc == 0 && dt != FSO_DT_F32 && dt != FSO_DT_BF16) {
        int off = rail_prefix(x, "all_gather", c->err, sizeof c->err);
        snprintf(c->err + off, sizeof c->err - (size_t)off, "dtype %d is neither fp32 nor bf16",
                 (int)dt);
        rc = -EINVAL;
    }
    if (rc == 0) {
        ncclResult_t r = ncclAllGather(send, recv, count, dt == FSO_DT_BF16 ? ncclBfloat16
                                                                            : ncclFloat,
                                       x->comm, x->stream);
        rc = rail_wait(c, "all_gather", r, true, t0);
    }
    c->busy_ms[x->box] += fso_now_ms() - t0;
    return rc;
}

static int rail_reduce_scatter(fso_coll *c, int rank, const float *send, float *recv,
                               size_t count)
{
    struct rail *x = c->ctx;
    double t0 = fso_now_ms();
    int rc = rail_enter(c, rank, "reduce_scatter");
    if (rc == 0) {
        ncclResult_t r = ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, x->comm,
                                           x->stream);
        rc = rail_wait(c, "reduce_scatter", r, true, t0);
    }
    c->busy_ms[x->box] += fso_now_ms() - t0;
    return rc;
}

/* Every box's bf16 piece for this box into the row buffer (grouped sends
 * and receives), then fso_cuda_sum_bf16_rows adds the rows in box order in
 * fp32 on the rail's stream: fso_coll_create_nccl's bits. */
static int rail_reduce_scatter_bf16(fso_coll *c, int rank, const uint16_t *send, float *recv,
                                    size_t count)
{
    struct rail *x = c->ctx;
    const char *what = "reduce_scatter_bf16";
    const size_t need = (size_t)x->boxes * count;
    double t0 = fso_now_ms();
    int rc = rail_enter(c, rank, what);
    if (rc == 0 && need > x->rows_elems) {
        /* the stream is idle between calls: the old rows are free */
        cudaFree(x->dev_rows);
        x->dev_rows = NULL;
        x->rows_elems = 0;
        cudaError_t e = cudaMalloc((void **)&x->dev_rows, sizeof(uint16_t) * need);
        if (e != cudaSuccess) {
            x->dev_rows = NULL;
            cudaGetLastError();
            rc = rail_break(c, what, fso_cuda_errno(e), "the receive rows (%zu bytes): %s",
                            sizeof(uint16_t) * need, cudaGetErrorString(e));
        } else {
            x->rows_elems = need;
        }
    }
    if (rc == 0) {
        ncclResult_t r =
            fso_nccl_exchange_rows(send, x->dev_rows, count, x->boxes, x->comm, x->stream);
        rc = rail_wait(c, what, r, false, t0); /* issued: the sum goes after it */
    }
    if (rc == 0) {
        fso_cuda_sum_bf16_rows(x->stream, recv, x->dev_rows, x->boxes, count);
        cudaError_t e = cudaGetLastError();
        rc = e == cudaSuccess ? rail_wait(c, what, ncclSuccess, true, t0)
                              : rail_break(c, what, fso_cuda_errno(e), "the sum's kernel: %s",
                                           cudaGetErrorString(e));
    }
    c->busy_ms[x->box] += fso_now_ms() - t0;
    return rc;
}

/* Gather every box's values and add them in box order on the host: the
 * same bits on every box. */
static int rail_all_reduce_f64(fso_coll *c, int rank, double *buf, size_t count)
{
    struct rail *x = c->ctx;
    const char *what = "all_reduce_f64";
    double t0 = fso_now_ms();
    int rc = rail_enter(c, rank, what);
    if (rc == 0 && count > MAX_F64) {
        int off = rail_prefix(x, what, c->err, sizeof c->err);
        snprintf(c->err + off, sizeof c->err - (size_t)off, "%zu values; at most %d", count,
                 MAX_F64);
        rc = -EINVAL;
    }
    double *h = x->host_f64, *d = x->dev_f64;
    cudaError_t e = cudaSuccess;
    if (rc == 0) {
        memset(h, 0, sizeof(double) * MAX_F64);
        memcpy(h, buf, sizeof(double) * count);
        e = cudaMemcpyAsync(d, h, sizeof(double) * MAX_F64, cudaMemcpyHostToDevice, x->stream);
        if (e == cudaSuccess) {
            ncclResult_t r = ncclAllGather(d, d + MAX_F64, MAX_F64, ncclDouble, x->comm,
                                           x->stream);
            rc = rail_wait(c, what, r, false, t0);
        }
    }
    if (rc == 0 && e == cudaSuccess) {
        e = cudaMemcpyAsync(h + MAX_F64, d + MAX_F64, sizeof(double) * MAX_F64 * (size_t)x->boxes,
                            cudaMemcpyDeviceToHost, x->stream);
        if (e == cudaSuccess)
            rc = rail_wait(c, what, ncclSuccess, true, t0);
    }
    if (rc == 0 && e != cudaSuccess) {
        cudaGetLastError();
        rc = rail_break(c, what, fso_cuda_errno(e), "a copy: %s", cudaGetErrorString(e));
    }
    if (rc == 0)
        for (size_t i = 0; i < count; i++) {
            double sum = 0;
            for (int k = 0; k < x->boxes; k++)
                sum += h[MAX_F64 + (size_t)k * MAX_F64 + i];
            buf[i] = sum;
        }
    c->busy_ms[x->box] += fso_now_ms() - t0;
    return rc;
}

/* A one-float all-reduce: complete once every box has reached it. */
static int rail_barrier(fso_coll *c, int rank)
{
    struct rail *x = c->ctx;
    double t0 = fso_now_ms();
    int rc = rail_enter(c, rank, "barrier");
    if (rc == 0) {
        ncclResult_t r = ncclAllReduce(x->dev_one, x->dev_one, 1, ncclFloat, ncclSum, x->comm,
                                       x->stream);
        rc = rail_wait(c, "barrier", r, true, t0);
    }
    c->busy_ms[x->box] += fso_now_ms() - t0;
    return rc;
}

/* A healthy rail is finalized (flushing its work, bounded by the timeout)
 * and destroyed; one that cannot finish in time, or was broken, is aborted
 * (NCCL frees an aborted communicator). */
static void rail_destroy(fso_coll *c)
{
    struct rail *x = c->ctx;
    if (x) {
        cudaSetDevice(x->device);
        if (x->comm && !x->broken) {
            double t0 = fso_now_ms();
            ncclResult_t r = ncclCommFinalize(x->comm);
            if (rail_wait(c, "destroy", r, false, t0) == 0)
                ncclCommDestroy(x->comm);
        }
        if (x->stream)
            cudaStreamDestroy(x->stream);
        cudaFree(x->dev_f64);
        cudaFree(x->dev_one);
        cudaFree(x->dev_rows);
        cudaFreeHost(x->host_f64);
        cudaGetLastError();
        free(x);
    }
    free(c);
}

static const fso_coll_ops rail_ops = {
    .name = "nccl-rail",
    .all_gather = rail_all_gather,
    .reduce_scatter = rail_reduce_scatter,
    .reduce_scatter_bf16 = rail_reduce_scatter_bf16,
    .all_reduce_f64 = rail_all_reduce_f64,
    .barrier = rail_barrier,
    .destroy = rail_destroy,
};

int fso_nccl_rail_id(unsigned char id[FSO_NCCL_ID_BYTES], char *err, size_t errlen)
{
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess) {
        const char *last = ncclGetLastError(NULL);
        snprintf(err, errlen, "NCCL rail: ncclGetUniqueId: %s%s%s (NCCL_SOCKET_IFNAME chooses "
                 "the network interface NCCL's bootstrap listens on)", ncclGetErrorString(r),
                 last && *last ? ": " : "", last ? last : "");
        return fso_nccl_errno(r);
    }
    memcpy(id, uid.internal, FSO_NCCL_ID_BYTES);
    return 0;
}

/* The rail's stream and buffers on the current device; 0 or a CUDA error. */
static cudaError_t rail_alloc(struct rail *x)
{
    const size_t f64_bytes = sizeof(double) * MAX_F64 * (size_t)(x->boxes + 1);
    cudaError_t e = cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        x->stream = NULL;
        return e;
    }
    e = cudaMalloc((void **)&x->dev_f64, f64_bytes);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&x->dev_one, sizeof(float));
    if (e == cudaSuccess)
        e = cudaMemset(x->dev_one, 0, sizeof(float));
    if (e == cudaSuccess)
        e = cudaHostAlloc((void **)&x->host_f64, f64_bytes, cudaHostAllocPortable);
    if (e == cudaSuccess)
        memset(x->host_f64, 0, f64_bytes);
    return e;
}

int fso_coll_create_nccl_rail(fso_coll **out, int device, int boxes, int box,
                              const unsigned char id[FSO_NCCL_ID_BYTES], double timeout_s,
                              fso_rail_describe_fn describe, char *err, size_t errlen)
{
    *out = NULL;
    if (boxes < 1 || boxes > FSO_MAX_DEVICES || box < 0 || box >= boxes) {
        snprintf(err, errlen, "NCCL rail on CUDA device %d: box %d of %d; 1 to %d boxes, and "
                 "the box one of them", device, box, boxes, FSO_MAX_DEVICES);
        return -EINVAL;
    }
    if (!(timeout_s >= 0) || isinf(timeout_s)) {
        snprintf(err, errlen, "NCCL rail on CUDA device %d: timeout %g s; expected 0 (never) "
                 "or more seconds", device, timeout_s);
        return -EINVAL;
    }
    fso_coll *c = calloc(1, sizeof *c);
    struct rail *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c);
        free(x);
        snprintf(err, errlen, "out of host memory");
        return -ENOMEM;
    }
    *x = (struct rail){.device = device, .boxes = boxes, .box = box,
                       .timeout_ms = timeout_s * 1000.0, .describe = describe};
    c->ops = &rail_ops;
    c->ctx = x;
    c->world = boxes;
    double t0 = fso_now_ms();
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = rail_alloc(x);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "NCCL rail on CUDA device %d (box %d of %d): %s", device, box,
                 boxes, cudaGetErrorString(e));
        cudaGetLastError();
        rail_destroy(c);
        return fso_cuda_errno(e);
    }
    ncclUniqueId uid;
    memcpy(uid.internal, id, FSO_NCCL_ID_BYTES);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0; /* every wait polled, so bounded by the timeout */
    ncclResult_t r = ncclCommInitRankConfig(&x->comm, boxes, uid, box, &config);
    int rc;
    if (x->comm)
        rc = rail_wait(c, "init", r, false, t0);
    else /* nothing to poll or abort */
        rc = rail_nccl_fail(c, "init", r == ncclSuccess || r == ncclInProgress ? ncclInternalError
                                                                               : r);
    if (rc < 0) {
        snprintf(err, errlen, "%s%s", c->err,
                 rc == -ETIMEDOUT ? "; every box must make its end of the rail with the same id "
                                    "at about the same time" : "");
        rail_destroy(c);
        return rc;
    }
    c->err[0] = 0;
    *out = c;
    return 0;
}
