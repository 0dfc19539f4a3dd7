/* adamw.c — the scalar AdamW reference, kernel selection and the threaded
 * driver (see adamw.h for the formula and the contract). Compiled with
 * -ffp-contract=off: the reference is the same bits with or without
 * -march=native. */
#include "adamw.h"
#include "adamw_elem.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fso_build.h"
#include "util.h"

void fso_adamw_consts_init(fso_adamw_consts *c, const fso_adamw_step *st)
{
    c->scale = (float)st->grad_scale;
    c->decay = (float)(1.0 - st->lr * st->weight_decay);
    c->beta1 = (float)st->beta1;
    c->beta2 = (float)st->beta2;
    c->one_minus_beta1 = 1.0f - c->beta1;
    c->one_minus_beta2 = 1.0f - c->beta2;
    c->step_size = (float)(st->lr / (1.0 - pow(st->beta1, (double)st->t)));
    c->bc2_sqrt = (float)sqrt(1.0 - pow(st->beta2, (double)st->t));
    c->eps = (float)st->eps;
}

void fso_adamw_fused_scalar(float *restrict master, const void *restrict grad,
                            fso_dtype grad_dtype, float *restrict m, float *restrict v,
                            uint16_t *restrict out, size_t n, const fso_adamw_consts *cp)
{
    const fso_adamw_consts cc = *cp, *c = &cc; /* a copy no store can alias */
    if (grad_dtype == FSO_DT_F32) {
        const float *g = grad;
        for (size_t i = 0; i < n; i++) {
            float p = fso_adamw_elem(master[i], g[i], &m[i], &v[i], c);
            master[i] = p;
            if (out)
                out[i] = fso_bf16_from_f32(p);
        }
    } else {
        const uint16_t *g = grad;
        for (size_t i = 0; i < n; i++) {
            float p = fso_adamw_elem(master[i], fso_f32_from_bf16(g[i]), &m[i], &v[i], c);
            master[i] = p;
            if (out)
                out[i] = fso_bf16_from_f32(p);
        }
    }
}

static const fso_adamw_kernel kernel_scalar = {FSO_ISA_SCALAR, "scalar", fso_adamw_fused_scalar};
#if FSO_HAVE_AVX2
static const fso_adamw_kernel kernel_avx2 = {FSO_ISA_AVX2, "avx2", fso_adamw_fused_avx2};
#endif
#if FSO_HAVE_AVX512
static const fso_adamw_kernel kernel_avx512 = {FSO_ISA_AVX512, "avx512", fso_adamw_fused_avx512};
#endif

int fso_adamw_select(fso_isa want, const fso_adamw_kernel **out)
{
    if ((unsigned)want >= FSO_ISA_COUNT)
        return -EINVAL;
    fso_isa isa = want == FSO_ISA_AUTO ? fso_isa_best() : want;
    if (!fso_isa_supported(isa))
        return -ENOTSUP;
    switch (isa) {
#if FSO_HAVE_AVX2
    case FSO_ISA_AVX2:
        *out = &kernel_avx2;
        return 0;
#endif
#if FSO_HAVE_AVX512
    case FSO_ISA_AVX512:
        *out = &kernel_avx512;
        return 0;
#endif
    default:
        *out = &kernel_scalar;
        return 0;
    }
}

static void check_args(const void *grad, fso_dtype grad_dtype)
{
    FSO_BUG_ON(grad_dtype != FSO_DT_F32 && grad_dtype != FSO_DT_BF16,
               "fso_adamw_fused: grad_dtype %d is neither FSO_DT_F32 nor FSO_DT_BF16",
               (int)grad_dtype);
    FSO_BUG_ON(grad_dtype == FSO_DT_BF16 && ((uintptr_t)grad & 1),
               "fso_adamw_fused: bf16 gradient at %p is not 2-byte aligned", grad);
}

void fso_adamw_fused(const fso_adamw_kernel *k, float *master, const void *grad,
                     fso_dtype grad_dtype, float *m, float *v, uint16_t *param_bf16_out,
                     size_t n, const fso_adamw_step *st)
{
    check_args(grad, grad_dtype);
    fso_adamw_consts c;
    fso_adamw_consts_init(&c, st);
    (k ? k->fused : fso_adamw_fused_scalar)(master, grad, grad_dtype, m, v, param_bf16_out, n,
                                            &c);
}

/* ---- threads ---------------------------------------------------------- */

/* The range is cut into units: unit 0 is [0, head + UNIT), unit u > 0 starts
 * at head + u * UNIT, where master + head is the first 128-byte boundary;
 * the last unit ends at n. */
#define UNIT_ELEMS 32 /* 128 bytes of fp32, 64 of bf16 */

typedef struct mt_job {
    fso_adamw_fused_fn fn;
    float *master, *m, *v;
    const void *grad;
    fso_dtype grad_dtype;
    uint16_t *out;
    size_t n, head;
    int64_t units;
    fso_adamw_consts c;
} mt_job;

static size_t unit_start(const mt_job *j, int64_t u)
{
    if (u <= 0)
        return 0;
    if (u >= j->units)
        return j->n;
    return j->head + (size_t)u * UNIT_ELEMS;
}

static void mt_range(void *ctx, int64_t ub, int64_t ue, int worker)
{
    (void)worker;
    const mt_job *j = ctx;
    size_t b = unit_start(j, ub), e = unit_start(j, ue);
    size_t gsize = j->grad_dtype == FSO_DT_F32 ? 4 : 2;
    j->fn(j->master + b, (const char *)j->grad + b * gsize, j->grad_dtype, j->m + b, j->v + b,
          j->out ? j->out + b : NULL, e - b, &j->c);
}

void fso_adamw_fused_mt(const fso_adamw_kernel *k, fso_pool *pool, float *master,
                        const void *grad, fso_dtype grad_dtype, float *m, float *v,
                        uint16_t *param_bf16_out, size_t n, const fso_adamw_step *st)
{
    if (!pool || fso_pool_threads(pool) <= 1 || n < 2 * (size_t)FSO_ADAMW_MT_GRAIN_ELEMS) {
        fso_adamw_fused(k, master, grad, grad_dtype, m, v, param_bf16_out, n, st);
        return;
    }
    check_args(grad, grad_dtype);
    mt_job j = {
        .fn = k ? k->fused : fso_adamw_fused_scalar,
        .master = master, .m = m, .v = v,
        .grad = grad, .grad_dtype = grad_dtype,
        .out = param_bf16_out,
        .n = n,
    };
    j.head = (size_t)((128 - ((uintptr_t)master & 127)) & 127) / sizeof(float);
    j.units = (int64_t)((n - j.head + UNIT_ELEMS - 1) / UNIT_ELEMS); /* n > head here */
    fso_adamw_consts_init(&j.c, st);
    fso_pool_for(pool, j.units, FSO_ADAMW_MT_GRAIN_ELEMS / UNIT_ELEMS, mt_range, &j);
}
