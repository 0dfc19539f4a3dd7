/* cpu_dtype.c — the typed ops of the two CPU backends (backend.h, "Types").
 *
 * Each CPU backend implements its ops once, on fp32 buffers
 * (fso_cpu_kernels). The ops here give them the seam's types: a bf16
 * argument is widened exactly into the backend's scratch, the fp32 kernel
 * runs on the widened values, and a bf16 output is rounded once, to nearest
 * even, into its buffer. With every argument fp32 the kernel runs on the
 * buffers themselves. So both backends round at the same points, and their
 * results still agree to fp32 rounding whatever the types.
 *
 * The scratch belongs to the backend, grows to the largest op's need on
 * first use and is kept. It counts in the device's memory in use (and its
 * peak) but is not held to its cap: the planner reserves it
 * (fso_model_cpu_widen_bytes_for). Growing is the only thing that can
 * fail, and a failure is reported by the next sync(). Ops of one CPU backend are issued
 * by one thread at a time (the device's thread; cpu-async serialises its
 * own), so one scratch serves.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu_common.h"

#define K(be) (((fso_cpu_ctx *)(be)->ctx)->k)

/* The fp32 space for an op's bf16 arguments, carved in order from one
 * scratch of `total` floats. */
typedef struct carve {
    fso_backend *be;
    float *next;
} carve;

static bool carve_init(carve *c, fso_backend *be, size_t total)
{
    fso_cpu_ctx *x = be->ctx;
    c->be = be;
    if (total > x->scratch_elems) {
        float *p = NULL;
        if (posix_memalign((void **)&p, 64, sizeof(float) * total) != 0) {
            snprintf(be->err, sizeof be->err,
                     "%s backend: out of host memory for %.1f MiB of fp32 working space "
                     "for bf16 tensors", be->ops->name, sizeof(float) * total / 1048576.0);
            x->rc = -ENOMEM;
            c->next = NULL;
            return false;
        }
        free(x->scratch);
        be->mem_used_bytes += sizeof(float) * (total - x->scratch_elems);
        if (be->mem_used_bytes > be->mem_peak_bytes)
            be->mem_peak_bytes = be->mem_used_bytes;
        x->scratch = p;
        x->scratch_elems = total;
    }
    c->next = x->scratch;
    return true;
}

/* n fp32 elements to read p [dt] from: p itself, or widened. */
static const float *in(carve *c, const void *p, fso_dtype dt, size_t n)
{
    if (dt == FSO_DT_F32 || !p)
        return p;
    float *f = c->next;
    c->next += n;
    c->be->ops->cast_bf16_f32(c->be, f, p, n);
    return f;
}

/* n fp32 elements for the kernel to write p [dt] into: p itself, or space
 * that out_store() rounds into p afterwards. */
static float *out(carve *c, void *p, fso_dtype dt, size_t n)
{
    if (dt == FSO_DT_F32 || !p)
        return p;
    float *f = c->next;
    c->next += n;
    return f;
}

/* The same, for an output the kernel also reads (accumulates into, or
 * rotates in place): its old value widened first. */
static float *inout(carve *c, void *p, fso_dtype dt, size_t n)
{
    return (float *)in(c, p, dt, n);
}

static void out_store(carve *c, void *p, fso_dtype dt, const float *f, size_t n)
{
    if (dt != FSO_DT_F32 && p)
        c->be->ops->cast_f32_bf16(c->be, p, f, n);
}

/* Scratch floats for n elements when stored as dt. */
static size_t need(fso_dtype dt, size_t n)
{
    return dt == FSO_DT_F32 ? 0 : n;
}

void fso_cpu_embedding_fwd(fso_backend *be, float *o, const int32_t *tok, const void *wte,
                           fso_dtype dt, int N, int C)
{
    if (dt == FSO_DT_F32) {
        K(be)->embedding_fwd(be, o, tok, wte, N, C);
        return;
    }
    /* only the rows gathered are widened: the table may be the whole vocabulary */
    const uint16_t *w = wte;
    for (int n = 0; n < N; n++)
        be->ops->cast_bf16_f32(be, o + (size_t)n * C, w + (size_t)tok[n] * C, (size_t)C);
}

void fso_cpu_rmsnorm_fwd(fso_backend *be, void *o, float *rstd, const float *x, const void *w,
                         fso_dtype dt, int N, int C, float eps)
{
    const size_t nc = (size_t)N * C;
    carve c;
    if (!carve_init(&c, be, need(dt, nc) + need(dt, (size_t)C)))
        return;
    float *of = out(&c, o, dt, nc);
    K(be)->rmsnorm_fwd(be, of, rstd, x, in(&c, w, dt, (size_t)C), N, C, eps);
    out_store(&c, o, dt, of, nc);
}

void fso_cpu_rmsnorm_bwd(fso_backend *be, float *dx, float *dw, const float *dout, const float *x,
                         const void *w, fso_dtype dt, const float *rstd, int N, int C)
{
    carve c;
    if (!carve_init(&c, be, need(dt, (size_t)C)))
        return;
    K(be)->rmsnorm_bwd(be, dx, dw, dout, x, in(&c, w, dt, (size_t)C), rstd, N, C);
}

void fso_cpu_matmul_fwd(fso_backend *be, void *o, fso_dtype out_dt, const void *x, const void *w,
                        fso_dtype dt, int N, int Cin, int Cout)
{
    const size_t no = (size_t)N * Cout, nx = (size_t)N * Cin, nw = (size_t)Cout * Cin;
    carve c;
    if (!carve_init(&c, be, need(out_dt, no) + need(dt, nx) + need(dt, nw)))
        return;
    float *of = out(&c, o, out_dt, no);
    K(be)->matmul_fwd(be, of, in(&c, x, dt, nx), in(&c, w, dt, nw), N, Cin, Cout);
    out_store(&c, o, out_dt, of, no);
}

void fso_cpu_matmul_bwd(fso_backend *be, void *dx, fso_dtype dx_dt, float *dw, const void *dout,
                        fso_dtype dout_dt, const void *x, const void *w, fso_dtype dt, int N,
                        int Cin, int Cout, float dx_beta)
{
    const size_t ndx = dx ? (size_t)N * Cin : 0, nd = (size_t)N * Cout;
    const size_t nx = (size_t)N * Cin, nw = (size_t)Cout * Cin;
    carve c;
    if (!carve_init(&c, be, need(dx_dt, ndx) + need(dout_dt, nd) + need(dt, nx) + need(dt, nw)))
        return;
    /* with beta 0 the kernel does not read dx */
    float *dxf = dx_beta != 0.0f ? inout(&c, dx, dx_dt, ndx) : out(&c, dx, dx_dt, ndx);
    K(be)->matmul_bwd(be, dxf, dw, in(&c, dout, dout_dt, nd), in(&c, x, dt, nx),
                      in(&c, w, dt, nw), N, Cin, Cout, dx_beta);
    out_store(&c, dx, dx_dt, dxf, ndx);
}

void fso_cpu_rope(fso_backend *be, void *x, fso_dtype dt, const float *cos_t, const float *sin_t,
                  const int32_t *pos, int B, int T, int nh, int D, int inverse)
{
    const size_t n = (size_t)B * T * nh * D;
    carve c;
    if (!carve_init(&c, be, need(dt, n)))
        return;
    float *xf = inout(&c, x, dt, n);
    K(be)->rope(be, xf, cos_t, sin_t, pos, B, T, nh, D, inverse);
    out_store(&c, x, dt, xf, n);
}

void fso_cpu_attention_fwd(fso_backend *be, void *o, void *probs, const void *q, const void *k,
                           const void *v, const int32_t *pos, fso_dtype dt, int B, int T, int H,
                           int Hkv, int D)
{
    const size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * Hkv * D;
    const size_t np = (size_t)B * H * T * T;
    carve c;
    if (!carve_init(&c, be, need(dt, 2 * nq + 2 * nk + np)))
        return;
    float *of = out(&c, o, dt, nq), *pf = out(&c, probs, dt, np);
    K(be)->attention_fwd(be, of, pf, in(&c, q, dt, nq), in(&c, k, dt, nk), in(&c, v, dt, nk), pos,
                         B, T, H, Hkv, D);
    out_store(&c, o, dt, of, nq);
    out_store(&c, probs, dt, pf, np);
}

void fso_cpu_attention_bwd(fso_backend *be, void *dq, void *dk, void *dv, const void *dout,
                           const void *probs, const void *q, const void *k, const void *v,
                           const int32_t *pos, fso_dtype dt, int B, int T, int H, int Hkv, int D)
{
    const size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * Hkv * D;
    const size_t np = (size_t)B * H * T * T;
    carve c;
    if (!carve_init(&c, be, need(dt, 3 * nq + 4 * nk + np)))
        return;
    float *dqf = out(&c, dq, dt, nq), *dkf = out(&c, dk, dt, nk), *dvf = out(&c, dv, dt, nk);
    K(be)->attention_bwd(be, dqf, dkf, dvf, in(&c, dout, dt, nq), in(&c, probs, dt, np),
                         in(&c, q, dt, nq), in(&c, k, dt, nk), in(&c, v, dt, nk), pos, B, T, H,
                         Hkv, D);
    out_store(&c, dq, dt, dqf, nq);
    out_store(&c, dk, dt, dkf, nk);
    out_store(&c, dv, dt, dvf, nk);
}

void fso_cpu_swiglu_fwd(fso_backend *be, void *o, const void *gate, const void *up, fso_dtype dt,
                        size_t n)
{
    carve c;
    if (!carve_init(&c, be, need(dt, 3 * n)))
        return;
    float *of = out(&c, o, dt, n);
    K(be)->swiglu_fwd(be, of, in(&c, gate, dt, n), in(&c, up, dt, n), n);
    out_store(&c, o, dt, of, n);
}

void fso_cpu_swiglu_bwd(fso_backend *be, void *dgate, void *dup, const void *dout,
                        const void *gate, const void *up, fso_dtype dt, size_t n)
{
    carve c;
    if (!carve_init(&c, be, need(dt, 5 * n)))
        return;
    float *dg = out(&c, dgate, dt, n), *du = out(&c, dup, dt, n);
    K(be)->swiglu_bwd(be, dg, du, in(&c, dout, dt, n), in(&c, gate, dt, n), in(&c, up, dt, n),
                      n);
    out_store(&c, dgate, dt, dg, n);
    out_store(&c, dup, dt, du, n);
}

void fso_cpu_bias_add(fso_backend *be, void *o, const void *b, fso_dtype dt, int N, int C)
{
    const size_t nc = (size_t)N * C;
    carve c;
    if (!carve_init(&c, be, need(dt, nc) + need(dt, (size_t)C)))
        return;
    float *of = inout(&c, o, dt, nc);
    K(be)->bias_add(be, of, in(&c, b, dt, (size_t)C), N, C);
    out_store(&c, o, dt, of, nc);
}

void fso_cpu_bias_bwd(fso_backend *be, float *db, const void *dout, fso_dtype dt, int N, int C)
{
    const size_t nc = (size_t)N * C;
    carve c;
    if (!carve_init(&c, be, need(dt, nc)))
        return;
    K(be)->bias_bwd(be, db, in(&c, dout, dt, nc), N, C);
}
