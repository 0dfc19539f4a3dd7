/* coll_nccl.c — the collective interface (coll.h) over NCCL, for the CUDA
 * backends of one process: one communicator per device from
 * ncclCommInitAll, each rank's collectives issued by that rank's thread on
 * its backend's collective stream (contract: cuda_backend.h).
 *
 * Lifetime: the collectives use the backends and must be destroyed before
 * them (coll.h). Destroying needs only what the collectives own (the
 * devices' ordinals, saved at creation, and their own buffers), never a
 * backend, so a wrong order elsewhere cannot turn into a read of freed
 * memory here.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nccl.h>

#include "cuda_impl.h"
#include "util.h"

#define MAX_WORLD FSO_MAX_DEVICES
#define MAX_F64 64

struct nccl_ctx {
    ncclComm_t comm[MAX_WORLD];
    fso_backend *be[MAX_WORLD];   /* for issuing work only; not touched by nc_destroy */
    int ordinal[MAX_WORLD];       /* each rank's CUDA device, saved at creation */
    double *dev_f64[MAX_WORLD];   /* per rank: MAX_F64 in, world * MAX_F64 gathered */
    double *host_f64[MAX_WORLD];  /* pinned, the same layout */
    float *dev_one[MAX_WORLD];    /* barrier */
};


static int nccl_errno(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess:
        return 0;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
        return -EINVAL;
    case ncclInProgress:
        return -EINPROGRESS;
    default:
        return -EIO;
    }
}

/* Record an NCCL failure in the rank's backend (its next sync reports it). */
static int nccl_fail(struct nccl_ctx *x, int rank, ncclResult_t r, const char *what)
{
    if (r == ncclSuccess)
        return 0;
    int rc = nccl_errno(r);
    const char *last = x->comm[rank] ? ncclGetLastError(x->comm[rank]) : NULL;
    fso_cuda_fail(x->be[rank], rc, "NCCL %s on rank %d (CUDA device %d): %s%s%s", what, rank,
                  x->ordinal[rank], ncclGetErrorString(r),
                  last && *last ? ": " : "", last ? last : "");
    return rc;
}

static int rank_status(struct nccl_ctx *x, int rank)
{
    return fso_cuda_status(x->be[rank]);
}

static int nc_all_gather(fso_coll *c, int rank, const void *send, void *recv, size_t count,
                         fso_dtype dt, uint64_t after)
{
    struct nccl_ctx *x = c->ctx;
    fso_backend *be = x->be[rank];
    const ncclDataType_t type = dt == FSO_DT_BF16 ? ncclBfloat16 : ncclFloat;
    double t0 = fso_now_ms();
    cudaStream_t s = fso_cuda_begin_after(be, FSO_CS_COLL, after);
    ncclResult_t r = ncclAllGather(send, recv, count, type, x->comm[rank], s);
    fso_cuda_end_gather(be, "all_gather"); /* compute reads what it gathers */
    int rc = nccl_fail(x, rank, r, "all_gather");
    c->busy_ms[rank] += fso_now_ms() - t0;
    return rc ? rc : rank_status(x, rank);
}

static int nc_reduce_scatter(fso_coll *c, int rank, const float *send, float *recv, size_t count)
{
    struct nccl_ctx *x = c->ctx;
    fso_backend *be = x->be[rank];
    double t0 = fso_now_ms();
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COLL);
    ncclResult_t r = ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, x->comm[rank], s);
    fso_cuda_end(be, FSO_CS_COLL, "reduce_scatter");
    int rc = nccl_fail(x, rank, r, "reduce_scatter");
    c->busy_ms[rank] += fso_now_ms() - t0;
    return rc ? rc : rank_status(x, rank);
}

/* Gather every rank's values and add them in rank order on the host: the
 * same bits on every rank and every run, as the thread implementation. */
static int nc_all_reduce_f64(fso_coll *c, int rank, double *buf, size_t count)
{
    struct nccl_ctx *x = c->ctx;
    fso_backend *be = x->be[rank];
    if (count > MAX_F64)
        return -EINVAL;
    double t0 = fso_now_ms();
    double *h = x->host_f64[rank], *d = x->dev_f64[rank];
    memcpy(h, buf, sizeof(double) * count);
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COLL);
    fso_cuda_check(be, cudaMemcpyAsync(d, h, sizeof(double) * MAX_F64, cudaMemcpyHostToDevice, s),
                   "all_reduce_f64: copy in");
    ncclResult_t r = ncclAllGather(d, d + MAX_F64, MAX_F64, ncclDouble, x->comm[rank], s);
    fso_cuda_check(be, cudaMemcpyAsync(h + MAX_F64, d + MAX_F64,
                                       sizeof(double) * MAX_F64 * (size_t)c->world,
                                       cudaMemcpyDeviceToHost, s),
                   "all_reduce_f64: copy out");
    fso_cuda_end(be, FSO_CS_COLL, "all_reduce_f64");
    int rc = nccl_fail(x, rank, r, "all_reduce_f64");
    if (fso_cuda_check(be, cudaStreamSynchronize(s), "all_reduce_f64") < 0 && rc == 0)
        rc = rank_status(x, rank);
    if (rc == 0)
        for (size_t i = 0; i < count; i++) {
            double sum = 0;
            for (int k = 0; k < c->world; k++)
                sum += h[MAX_F64 + (size_t)k * MAX_F64 + i];
            buf[i] = sum;
        }
    c->busy_ms[rank] += fso_now_ms() - t0;
    return rc;
}

/* A one-float all-reduce after the rank's queued work, then wait for it:
 * every rank has reached the barrier when it completes. */
static int nc_barrier(fso_coll *c, int rank)
{
    struct nccl_ctx *x = c->ctx;
    fso_backend *be = x->be[rank];
    double t0 = fso_now_ms();
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COLL);
    ncclResult_t r = ncclAllReduce(x->dev_one[rank], x->dev_one[rank], 1, ncclFloat, ncclSum,
                                   x->comm[rank], s);
    fso_cuda_end(be, FSO_CS_COLL, "barrier");
    int rc = nccl_fail(x, rank, r, "barrier");
    if (fso_cuda_check(be, cudaStreamSynchronize(s), "barrier") < 0 && rc == 0)
        rc = rank_status(x, rank);
    c->busy_ms[rank] += fso_now_ms() - t0;
    return rc;
}

static void nc_destroy(fso_coll *c)
{
    struct nccl_ctx *x = c->ctx;
    for (int r = 0; x && r < c->world; r++) {
        cudaSetDevice(x->ordinal[r]);
        if (x->comm[r])
            ncclCommDestroy(x->comm[r]);
        cudaFree(x->dev_f64[r]);
        cudaFree(x->dev_one[r]);
        cudaFreeHost(x->host_f64[r]);
    }
    cudaGetLastError();
    free(x);
    free(c);
}

static const fso_coll_ops nccl_ops = {
    .name = "nccl",
    .all_gather = nc_all_gather,
    .reduce_scatter = nc_reduce_scatter,
    .all_reduce_f64 = nc_all_reduce_f64,
    .barrier = nc_barrier,
    .destroy = nc_destroy,
};

int fso_coll_create_nccl(fso_coll **out, int world, fso_backend **devices, char *err,
                         size_t errlen)
{
    int devs[MAX_WORLD];
    *out = NULL;
    if (world < 1 || world > MAX_WORLD) {
        snprintf(err, errlen, "NCCL: %d devices; 1 to %d are supported", world, MAX_WORLD);
        return -EINVAL;
    }
    for (int r = 0; r < world; r++) {
        if (!fso_backend_is_cuda(devices[r])) {
            snprintf(err, errlen, "NCCL: rank %d's backend is \"%s\", not \"cuda\"", r,
                     devices[r] ? devices[r]->ops->name : "(none)");
            return -EINVAL;
        }
        devs[r] = FSO_CUDA_CTX(devices[r])->ordinal;
        for (int q = 0; q < r; q++)
            if (devs[q] == devs[r]) {
                snprintf(err, errlen, "NCCL: ranks %d and %d are both CUDA device %d; one device "
                                      "per rank", q, r, devs[r]);
                return -EINVAL;
            }
    }
    fso_coll *c = calloc(1, sizeof *c);
    struct nccl_ctx *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c);
        free(x);
        snprintf(err, errlen, "out of host memory");
        return -ENOMEM;
    }
    c->ops = &nccl_ops;
    c->ctx = x;
    c->world = world;
    for (int r = 0; r < world; r++) {
        x->be[r] = devices[r];
        x->ordinal[r] = devs[r];
    }

    ncclResult_t nr = ncclCommInitAll(x->comm, world, devs);
    if (nr != ncclSuccess) {
        snprintf(err, errlen, "NCCL: cannot create the communicators of %d devices: %s%s%s", world,
                 ncclGetErrorString(nr), *ncclGetLastError(NULL) ? ": " : "",
                 ncclGetLastError(NULL));
        memset(x->comm, 0, sizeof x->comm);
        nc_destroy(c);
        return nccl_errno(nr);
    }
    for (int r = 0; r < world; r++) {
        cudaError_t e = cudaSetDevice(devs[r]);
        if (e == cudaSuccess)
            e = cudaMalloc((void **)&x->dev_f64[r], sizeof(double) * MAX_F64 * (size_t)(world + 1));
        if (e == cudaSuccess)
            e = cudaMalloc((void **)&x->dev_one[r], sizeof(float));
        if (e == cudaSuccess)
            e = cudaMemset(x->dev_one[r], 0, sizeof(float));
        if (e == cudaSuccess)
            e = cudaHostAlloc((void **)&x->host_f64[r],
                              sizeof(double) * MAX_F64 * (size_t)(world + 1),
                              cudaHostAllocPortable);
        if (e != cudaSuccess) {
            snprintf(err, errlen, "NCCL: CUDA device %d: %s", devs[r], cudaGetErrorString(e));
            cudaGetLastError();
            nc_destroy(c);
            return fso_cuda_errno(e);
        }
        memset(x->host_f64[r], 0, sizeof(double) * MAX_F64 * (size_t)(world + 1));
    }
    *out = c;
    return 0;
}
