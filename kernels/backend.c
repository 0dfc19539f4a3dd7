/* backend.c — backend registry, what the CPU backends share (memory, lifetime,
 * collectives), RoPE tables. */
#include "backend.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "coll.h"
#include "cpu_async.h"
#include "cuda/cuda_backend.h"
#include "fso_build.h"
#include "rope.h"
#include "cpu_common.h"
#include "pool.h"
#include "util.h"


int fso_cpu_count(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return n;
    }
    return 1;
}

/* The fast CPU backend or the reference (ops), as device `device`. */
static int create_cpu(fso_backend **out, const fso_backend_ops *ops, int device, int threads,
                      size_t mem_cap_bytes, char *err, size_t errlen)
{
    fso_backend *be = calloc(1, sizeof *be);
    fso_cpu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!be || !ctx) {
        free(be);
        free(ctx);
        snprintf(err, errlen, "out of memory creating a CPU backend");
        return -ENOMEM;
    }
    be->ops = ops;
    be->ctx = ctx;
    be->device = device;
    be->mem_cap_bytes = mem_cap_bytes;
    ctx->k = ops == &fso_cpu_ref_ops ? &fso_cpu_ref_kernels : &fso_cpu_fast_kernels;
    be->threads = ops == &fso_cpu_ref_ops ? 1 : threads > 0 ? threads : fso_cpu_count();
    if (ops == &fso_cpu_fast_ops) {
        int rc = fso_pool_create(&ctx->pool, be->threads);
        if (rc < 0) {
            snprintf(err, errlen, "cannot start %d threads for the CPU backend: %s",
                     be->threads, strerror(-rc));
            free(ctx);
            free(be);
            return rc;
        }
        /* The backend's pool splits every matmul into tiles and calls
         * OpenBLAS on each from its own threads (cpu_backend.c): OpenBLAS
         * itself runs single-threaded, in whichever thread calls it. The
         * setting is process-wide and the same for every backend. */
        openblas_set_num_threads(1);
    }
    *out = be;
    return 0;
}

static int create_fast(fso_backend **out, int device, int threads, size_t mem_cap_bytes,
                       char *err, size_t errlen)
{
    return create_cpu(out, &fso_cpu_fast_ops, device, threads, mem_cap_bytes, err, errlen);
}

static int create_ref(fso_backend **out, int device, int threads, size_t mem_cap_bytes,
                      char *err, size_t errlen)
{
    return create_cpu(out, &fso_cpu_ref_ops, device, threads, mem_cap_bytes, err, errlen);
}

static int create_cuda(fso_backend **out, int device, int threads, size_t mem_cap_bytes,
                       char *err, size_t errlen)
{
    *out = NULL;
#if FSO_HAVE_CUDA
    return fso_backend_create_cuda(out, device, mem_cap_bytes, err, errlen);
#else
    char why[256];
    int rc = fso_cuda_available(why, sizeof why);
    snprintf(err, errlen, "%s", why);
    return rc;
#endif
}

static const fso_backend_row rows[FSO_N_BACKENDS] = {
    {FSO_BACKEND_CPU, "cpu", true, false, create_fast},
    {FSO_BACKEND_CPU_REF, "cpu-ref", true, false, create_ref},
    {FSO_BACKEND_CPU_ASYNC, "cpu-async", false, false, fso_backend_create_async},
    {FSO_BACKEND_CUDA, "cuda", false, true, create_cuda},
};

const fso_backend_row *fso_backend_find(const char *name)
{
    if (!name[0])
        return &rows[FSO_BACKEND_CPU];
    for (int i = 0; i < FSO_N_BACKENDS; i++)
        if (strcmp(name, rows[i].name) == 0)
            return &rows[i];
    return NULL;
}

const fso_backend_row *fso_backend_row_of(fso_backend_kind k)
{
    FSO_BUG_ON(k < 0 || k >= FSO_N_BACKENDS, "backend kind %d", (int)k);
    return &rows[k];
}

int fso_backend_create(fso_backend **out, fso_backend_kind k, int device, int threads,
                       size_t mem_cap_bytes, char *err, size_t errlen)
{
    return fso_backend_row_of(k)->create(out, device, threads, mem_cap_bytes, err, errlen);
}

void fso_backend_destroy(fso_backend *be)
{
    if (be)
        be->ops->destroy(be);
}

struct fso_pool *fso_backend_pool(fso_backend *be)
{
    return be && be->ops->pool ? be->ops->pool(be) : NULL;
}

uint64_t fso_backend_stale_marks(fso_backend *be)
{
    return be->ops->stale_marks ? be->ops->stale_marks(be) : 0;
}

int fso_backend_coll_create(fso_coll **out, int world, fso_backend **devs, char *err,
                            size_t errlen)
{
    return devs[0]->ops->coll_create(out, world, devs, err, errlen);
}

/* ------------------------------------------------------------ the CPU backends */

void fso_cpu_destroy(fso_backend *be)
{
    fso_cpu_ctx *ctx = be->ctx;
    fso_pool_destroy(ctx->pool);
    free(ctx->scratch);
    free(ctx);
    free(be);
}

struct fso_pool *fso_cpu_pool(fso_backend *be)
{
    return ((fso_cpu_ctx *)be->ctx)->pool;
}

int fso_cpu_coll_create(fso_coll **out, int world, fso_backend **devs, char *err, size_t errlen)
{
    (void)devs;
    int rc = fso_coll_create_threads(out, world);
    if (rc < 0)
        snprintf(err, errlen, "%s", strerror(-rc));
    return rc;
}

/* Each buffer carries a header with its size, one I/O page (FSO_IO_PAGE), so
 * frees are counted against the device's memory cap. Buffers start on a page: a shard there can be
 * written to a checkpoint with O_DIRECT as it is (engine/zero/zero_save.c), and
 * NVMe reads land in a gather window directly (engine/zero/zero_source.c). Those
 * of FSO_IO_ALIGN and more (header included) are I/O buffers in huge pages
 * where whole ones fit, committing no more than they use (util.h
 * fso_io_alloc_lean): O_DIRECT into them is fast. */

static bool buf_mapped(size_t rounded)
{
    return rounded + FSO_IO_PAGE >= FSO_IO_ALIGN;
}

int fso_backend_charge(fso_backend *be, size_t bytes)
{
    if (be->mem_cap_bytes && be->mem_used_bytes + bytes > be->mem_cap_bytes) {
        snprintf(be->err, sizeof be->err,
                 "device %d: %zu bytes more would exceed its memory cap (%zu of %zu bytes in use)",
                 be->device, bytes, be->mem_used_bytes, be->mem_cap_bytes);
        return -ENOMEM;
    }
    be->mem_used_bytes += bytes;
    if (be->mem_used_bytes > be->mem_peak_bytes)
        be->mem_peak_bytes = be->mem_used_bytes;
    return 0;
}

void fso_backend_uncharge(fso_backend *be, size_t bytes)
{
    be->mem_used_bytes -= bytes;
}

int fso_cpu_buf_alloc(fso_backend *be, size_t bytes, void **out)
{
    void *p = NULL;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    int rc = fso_backend_charge(be, rounded);
    if (rc < 0)
        return rc;
    if (buf_mapped(rounded) ? !(p = fso_io_alloc_lean(rounded + FSO_IO_PAGE))
                            : posix_memalign(&p, FSO_IO_PAGE, rounded + FSO_IO_PAGE) != 0) {
        fso_backend_uncharge(be, rounded);
        snprintf(be->err, sizeof be->err, "out of host memory allocating %zu bytes", bytes);
        return -ENOMEM;
    }
    memset(p, 0, rounded + FSO_IO_PAGE);
    *(size_t *)p = rounded;
    *out = (char *)p + FSO_IO_PAGE;
    return 0;
}

void fso_cpu_buf_free(fso_backend *be, void *buf)
{
    if (!buf)
        return;
    void *p = (char *)buf - FSO_IO_PAGE;
    const size_t rounded = *(size_t *)p;
    fso_backend_uncharge(be, rounded);
    if (buf_mapped(rounded))
        fso_io_free(p, rounded + FSO_IO_PAGE);
    else
        free(p);
}

void fso_cpu_memset0(fso_backend *be, void *dst, size_t bytes)
{
    (void)be;
    memset(dst, 0, bytes);
}

void fso_cpu_copy(fso_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (dst != src)
        memmove(dst, src, bytes);
}

/* Ops run in place; the only failure is growing the scratch (cpu_dtype.c). */
int fso_cpu_sync(fso_backend *be)
{
    return ((fso_cpu_ctx *)be->ctx)->rc;
}

void fso_cpu_sum(fso_backend *be, double *out, const float *x, size_t n)
{
    fso_host_sum(fso_cpu_pool(be), out, x, n);
}

void fso_rope_tables(float *cos_t, float *sin_t, int T, int D, double theta)
{
    fso_rope_tables_scaled(cos_t, sin_t, T, D, theta, NULL);
}
