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
 * This is the scalar reference; the optimizer issue adds vectorized paths
 * that must agree with it.
 */
#ifndef FSO_ADAMW_H
#define FSO_ADAMW_H

#include <stddef.h>
#include <stdint.h>

typedef struct fso_adamw_step {
    double lr;
    double beta1, beta2;
    double eps;
    double weight_decay;   /* 0 for tensors without decay */
    double grad_scale;     /* clip factor (and 1/loss scale), 1 when off */
    int64_t t;             /* step number, from 1 */
} fso_adamw_step;

/* param, m, v (n) fp32 updated in place; grad (n) fp32 read. */
void fso_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                      const fso_adamw_step *st);

#endif
