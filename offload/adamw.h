/* adamw.h — AdamW over a flat range of fp32 parameters, exactly as
 * torch.optim.AdamW (decoupled weight decay, bias correction), with the
 * gradient clipping factor folded into the read of the gradient:
 *
 *   g  = grad * grad_scale
 *   p *= 1 - lr * weight_decay
 *   m  = beta1 * m + (1 - beta1) * g
 *   v  = beta2 * v + (1 - beta2) * g * g
 *   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 *
 * Every per-element operation is a separately rounded fp32 mul, add, div or
 * sqrt, in the order written above ((1 - beta2) * g first, then * g); the
 * per-step constants are computed once in double and rounded to float, and
 * 1 - beta1, 1 - beta2 are computed in float from the rounded betas. The
 * translation units are compiled with -ffp-contract=off, so no FMA
 * contraction changes the result with the build flags.
 *
 * The fused kernel (fso_adamw_fused) does the whole update in one pass over
 * memory: it reads an fp32 or bf16 gradient, updates the fp32 master weight
 * and moments in place and, when asked, writes the new bf16 working copy of
 * the parameter. Kernels for several instruction sets share one contract:
 *
 *   scalar   the reference, plain C
 *   avx2     8 lanes (AVX2), scalar head and tail
 *   avx512   16 lanes (AVX-512 F + BW + VL), masked head and tail
 *
 * (cpu_isa.h: the widest the CPU has runs, or the one FSO_ISA names), and
 * every one produces the same bits as the scalar reference (IEEE mul,
 * add, div and sqrt are correctly rounded in every lane; only which NaN
 * payload survives when two NaNs meet may differ, so NaN compares as NaN).
 *
 * bf16 output: fso_bf16_from_f32 (backend.h) on every element: round to
 * nearest even of the fp32 bits, denormals kept (no flush), overflow to
 * +-Inf, NaN stays NaN: (bits >> 16) | 0x0040 (quiet, sign and top payload
 * kept).
 */
#ifndef FSO_ADAMW_H
#define FSO_ADAMW_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "cpu_isa.h"
#include "pool.h"

typedef struct fso_adamw_step {
    double lr;
    double beta1, beta2;
    double eps;
    double weight_decay;   /* 0 for tensors without decay */
    double grad_scale;     /* clip factor (and 1/loss scale), 1 when off */
    int64_t t;             /* step number, from 1 */
} fso_adamw_step;

/* ---- fused kernels ---------------------------------------------------- */

/* The per-step constants every kernel uses (fso_adamw_consts, in
 * backend.h: the CUDA backend's kernel takes them too), from
 * fso_adamw_consts_init. */

/* One ISA's fused loop over [0, n): master, m, v (n) fp32 in place; grad (n)
 * fp32 or bf16 read; out (n) bf16 written when non-NULL. No two arrays
 * overlap. Any alignment of the element pointers is accepted. */
typedef void (*fso_adamw_fused_fn)(float *restrict master, const void *restrict grad,
                                   fso_dtype grad_dtype, float *restrict m, float *restrict v,
                                   uint16_t *restrict out, size_t n, const fso_adamw_consts *c);

typedef struct fso_adamw_kernel {
    fso_isa isa;           /* never FSO_ISA_AUTO */
    const char *name;      /* "scalar", "avx2", "avx512" */
    fso_adamw_fused_fn fused;
} fso_adamw_kernel;

/* The kernel for `want` (AUTO: the widest this CPU and build support,
 * fso_isa_best(); FSO_ISA is read by fso_isa_from_env, not here). 0,
 * -ENOTSUP when the CPU or the build lacks `want` (*out is then left
 * untouched: nothing falls back silently), or -EINVAL for an unknown value.
 * The kernels are static and never freed. */
int fso_adamw_select(fso_isa want, const fso_adamw_kernel **out);

void fso_adamw_consts_init(fso_adamw_consts *c, const fso_adamw_step *st);

/* One AdamW step over n elements with kernel k (NULL: the scalar reference):
 *   master, m, v  (n) fp32, updated in place
 *   grad          (n) fp32 or bf16 as grad_dtype, read
 *   param_bf16_out (n) bf16, written when non-NULL
 */
void fso_adamw_fused(const fso_adamw_kernel *k, float *master, const void *grad,
                     fso_dtype grad_dtype, float *m, float *v, uint16_t *param_bf16_out,
                     size_t n, const fso_adamw_step *st);

/* Same, split over the threads of `pool` (NULL: the calling thread only).
 * Split points fall where master + i is 128-byte aligned (64-byte aligned
 * for bf16 arrays aligned like master), so no two threads write one cache
 * line; ranges under FSO_ADAMW_MT_GRAIN_ELEMS are not split. The result
 * does not depend on the thread count. */
#define FSO_ADAMW_MT_GRAIN_ELEMS 16384
void fso_adamw_fused_mt(const fso_adamw_kernel *k, fso_pool *pool, float *master,
                        const void *grad, fso_dtype grad_dtype, float *m, float *v,
                        uint16_t *param_bf16_out, size_t n, const fso_adamw_step *st);

/* The kernels themselves, for tests and benchmarks that call one directly.
 * The avx2 and avx512 ones exist only when the build has them and must only
 * run on a CPU that fso_adamw_select accepts them for. */
void fso_adamw_fused_scalar(float *restrict master, const void *restrict grad,
                            fso_dtype grad_dtype, float *restrict m, float *restrict v,
                            uint16_t *restrict out, size_t n, const fso_adamw_consts *c);
void fso_adamw_fused_avx2(float *restrict master, const void *restrict grad,
                          fso_dtype grad_dtype, float *restrict m, float *restrict v,
                          uint16_t *restrict out, size_t n, const fso_adamw_consts *c);
void fso_adamw_fused_avx512(float *restrict master, const void *restrict grad,
                            fso_dtype grad_dtype, float *restrict m, float *restrict v,
                            uint16_t *restrict out, size_t n, const fso_adamw_consts *c);

#endif
