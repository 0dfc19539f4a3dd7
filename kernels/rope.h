/* rope.h — rotary position embeddings: the frequencies, as Hugging Face's
 * Llama computes them, with the rope_scaling types fsoff implements.
 *
 * Pair i of a head (i < D/2; the rotate-half layout pairs element i with
 * i + D/2) turns by position * inv_freq[i], inv_freq[i] = theta^(-2i/D):
 *   - linear (rope_scaling {"type": "linear", "factor": f}): inv_freq / f;
 *   - llama3 (Llama 3.1 and later: factor f, low_freq_factor lo,
 *     high_freq_factor hi, original_max_position_embeddings n): with
 *     wavelen = 2 pi / inv_freq, pairs with wavelen < n / hi keep their
 *     frequency, those with wavelen > n / lo take inv_freq / f, and those
 *     between blend the two: (1 - s) inv_freq / f + s inv_freq with
 *     s = (n / wavelen - lo) / (hi - lo).
 * Neither changes the attention scale. Every backend takes the tables
 * fso_rope_tables_scaled builds (the model copies them to the device).
 */
#ifndef FSO_ROPE_H
#define FSO_ROPE_H

typedef enum fso_rope_type {
    FSO_ROPE_DEFAULT = 0,         /* no scaling */
    FSO_ROPE_LINEAR,
    FSO_ROPE_LLAMA3,
} fso_rope_type;

typedef struct fso_rope_scaling {
    fso_rope_type type;
    double factor;                /* linear, llama3: > 0 */
    double low_freq_factor;       /* llama3: > 0 */
    double high_freq_factor;      /* llama3: > low_freq_factor */
    int original_max_position_embeddings; /* llama3: >= 1 */
} fso_rope_scaling;

/* "default", "linear", "llama3". */
const char *fso_rope_type_name(fso_rope_type t);

/* The D/2 inverse frequencies (s NULL: no scaling). */
void fso_rope_inv_freq(double *inv_freq, int D, double theta, const fso_rope_scaling *s);

/* cos, sin (T, D/2) for positions 0..T-1, angles in double, stored fp32. */
void fso_rope_tables_scaled(float *cos, float *sin, int T, int D, double theta,
                            const fso_rope_scaling *s);

#endif
