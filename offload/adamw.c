/* adamw.c — scalar AdamW reference (see adamw.h for the formula). */
#include "adamw.h"

#include <math.h>

void fso_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                      const fso_adamw_step *st)
{
    const float beta1 = (float)st->beta1, beta2 = (float)st->beta2;
    const float decay = (float)(1.0 - st->lr * st->weight_decay);
    const float step_size = (float)(st->lr / (1.0 - pow(st->beta1, (double)st->t)));
    const float bc2_sqrt = (float)sqrt(1.0 - pow(st->beta2, (double)st->t));
    const float eps = (float)st->eps, scale = (float)st->grad_scale;

    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * scale;
        float p = param[i] * decay;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        param[i] = p - step_size * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}
