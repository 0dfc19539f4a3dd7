/* rope.c — rotary frequencies and tables (rope.h). */
#include "rope.h"

#include <math.h>
#include <stddef.h>

const char *fso_rope_type_name(fso_rope_type t)
{
    switch (t) {
    case FSO_ROPE_LINEAR: return "linear";
    case FSO_ROPE_LLAMA3: return "llama3";
    case FSO_ROPE_DEFAULT: break;
    }
    return "default";
}

/* inv_freq of pair i. */
static double inv_freq_at(int i, int D, double theta, const fso_rope_scaling *s)
{
    double f = 1.0 / pow(theta, (2.0 * i) / D);
    if (!s || s->type == FSO_ROPE_DEFAULT)
        return f;
    if (s->type == FSO_ROPE_LINEAR)
        return f / s->factor;
    const double n = s->original_max_position_embeddings;
    const double wavelen = 2 * M_PI / f;
    if (wavelen < n / s->high_freq_factor)
        return f;
    if (wavelen > n / s->low_freq_factor)
        return f / s->factor;
    double sm = (n / wavelen - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
    return (1 - sm) * f / s->factor + sm * f;
}

void fso_rope_inv_freq(double *inv_freq, int D, double theta, const fso_rope_scaling *s)
{
    for (int i = 0; i < D / 2; i++)
        inv_freq[i] = inv_freq_at(i, D, theta, s);
}

void fso_rope_tables_scaled(float *cos_t, float *sin_t, int T, int D, double theta,
                            const fso_rope_scaling *s)
{
    const int half = D / 2;
    for (int i = 0; i < half; i++) {
        const double f = inv_freq_at(i, D, theta, s);
        for (int t = 0; t < T; t++) {
            double a = t * f;
            cos_t[(size_t)t * half + i] = (float)cos(a);
            sin_t[(size_t)t * half + i] = (float)sin(a);
        }
    }
}
