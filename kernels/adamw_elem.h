/* adamw_elem.h — AdamW on one element: the operations, in their order, that
 * every AdamW kernel of fsoff performs (offload/adamw.c's scalar reference
 * and its SIMD kernels, the CUDA kernel, the simulated device of
 * cpu_async.c). Files that use it are compiled with -ffp-contract=off, so
 * nothing is fused and every kernel gives the same bits.
 */
#ifndef FSO_ADAMW_ELEM_H
#define FSO_ADAMW_ELEM_H

#include <math.h>

#include "backend.h"

/* Updates *m and *v; returns the new master value. */
static inline float fso_adamw_elem(float p, float g, float *restrict m, float *restrict v,
                                   const fso_adamw_consts *c)
{
    g = g * c->scale;
    p = p * c->decay;
    float mi = c->beta1 * *m + c->one_minus_beta1 * g;
    float vi = c->beta2 * *v + c->one_minus_beta2 * g * g;
    float denom = sqrtf(vi) / c->bc2_sqrt + c->eps;
    *m = mi;
    *v = vi;
    return p - c->step_size * (mi / denom);
}

#endif
