/* adamw_avx512.c — the fused AdamW kernel, 16 fp32 lanes (AVX-512 F, BW, VL).
 *
 * Same operations in the same order as the scalar reference (adamw.c), one
 * correctly rounded mul/add/div/sqrt each, compiled with -ffp-contract=off:
 * the bits equal the reference's. A masked iteration brings master to a
 * 64-byte boundary (so the fp32 streams use whole cache lines when the
 * arrays are aligned alike), full iterations follow, and a masked iteration
 * takes the tail. Masked-off lanes compute on zeros and are never stored.
 * bf16 in: zero-extend and shift left by 16. bf16 out: integer round to
 * nearest even, NaN quieted, truncating 32 -> 16 bit narrow (vpmovdw); the
 * AVX512-BF16 convert instruction is not used because it flushes denormals.
 */
#include "adamw.h"

#include <immintrin.h>

typedef struct vconsts {
    __m512 scale, decay, beta1, omb1, beta2, omb2, step_size, bc2_sqrt, eps;
} vconsts;

#define FULL ((__mmask16)0xffff)

static inline __attribute__((always_inline)) __m512 load_grad(const void *grad, fso_dtype dt,
                                                              size_t i, __mmask16 k, int masked)
{
    if (dt == FSO_DT_F32)
        return masked ? _mm512_maskz_loadu_ps(k, (const float *)grad + i)
                      : _mm512_loadu_ps((const float *)grad + i);
    const uint16_t *g = (const uint16_t *)grad + i;
    __m256i h = masked ? _mm256_maskz_loadu_epi16(k, g) : _mm256_loadu_si256((const __m256i *)g);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __attribute__((always_inline)) __m512i to_bf16(__m512 p)
{
    __m512i u = _mm512_castps_si512(p);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 isnan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
    return _mm512_mask_or_epi32(r, isnan, hi, _mm512_set1_epi32(0x0040));
}

/* Elements [i, i + 16) under mask k (masked != 0) or all 16. */
static inline __attribute__((always_inline)) void step16(float *restrict master,
                                                         const void *restrict grad, fso_dtype dt,
                                                         float *restrict m, float *restrict v,
                                                         uint16_t *restrict out, size_t i,
                                                         __mmask16 k, int masked,
                                                         const vconsts *c)
{
    __m512 g = _mm512_mul_ps(load_grad(grad, dt, i, k, masked), c->scale);
    __m512 p0 = masked ? _mm512_maskz_loadu_ps(k, master + i) : _mm512_loadu_ps(master + i);
    __m512 m0 = masked ? _mm512_maskz_loadu_ps(k, m + i) : _mm512_loadu_ps(m + i);
    __m512 v0 = masked ? _mm512_maskz_loadu_ps(k, v + i) : _mm512_loadu_ps(v + i);
    __m512 p = _mm512_mul_ps(p0, c->decay);
    __m512 mi = _mm512_add_ps(_mm512_mul_ps(c->beta1, m0), _mm512_mul_ps(c->omb1, g));
    __m512 vi = _mm512_add_ps(_mm512_mul_ps(c->beta2, v0),
                              _mm512_mul_ps(_mm512_mul_ps(c->omb2, g), g));
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), c->bc2_sqrt), c->eps);
    p = _mm512_sub_ps(p, _mm512_mul_ps(c->step_size, _mm512_div_ps(mi, denom)));
    if (masked) {
        _mm512_mask_storeu_ps(m + i, k, mi);
        _mm512_mask_storeu_ps(v + i, k, vi);
        _mm512_mask_storeu_ps(master + i, k, p);
        if (out)
            _mm512_mask_cvtepi32_storeu_epi16(out + i, k, to_bf16(p));
    } else {
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        _mm512_storeu_ps(master + i, p);
        if (out)
            _mm256_storeu_si256((__m256i *)(out + i), _mm512_cvtepi32_epi16(to_bf16(p)));
    }
}

static inline __attribute__((always_inline)) void body(float *restrict master,
                                                       const void *restrict grad, fso_dtype dt,
                                                       float *restrict m, float *restrict v,
                                                       uint16_t *restrict out, size_t n,
                                                       const vconsts *c)
{
    size_t head = (size_t)((64 - ((uintptr_t)master & 63)) & 63) / sizeof(float);
    if (head > n)
        head = n;
    if (head)
        step16(master, grad, dt, m, v, out, 0, (__mmask16)((1u << head) - 1), 1, c);
    size_t i = head;
    for (; i + 16 <= n; i += 16)
        step16(master, grad, dt, m, v, out, i, FULL, 0, c);
    if (i < n)
        step16(master, grad, dt, m, v, out, i, (__mmask16)((1u << (n - i)) - 1), 1, c);
}

void fso_adamw_fused_avx512(float *restrict master, const void *restrict grad,
                            fso_dtype grad_dtype, float *restrict m, float *restrict v,
                            uint16_t *restrict out, size_t n, const fso_adamw_consts *c)
{
    vconsts k = {
        _mm512_set1_ps(c->scale), _mm512_set1_ps(c->decay),
        _mm512_set1_ps(c->beta1), _mm512_set1_ps(c->one_minus_beta1),
        _mm512_set1_ps(c->beta2), _mm512_set1_ps(c->one_minus_beta2),
        _mm512_set1_ps(c->step_size), _mm512_set1_ps(c->bc2_sqrt), _mm512_set1_ps(c->eps),
    };
    /* One instance per (dtype, output) pair so the loop has no branches. */
    if (grad_dtype == FSO_DT_F32) {
        if (out)
            body(master, grad, FSO_DT_F32, m, v, out, n, &k);
        else
            body(master, grad, FSO_DT_F32, m, v, NULL, n, &k);
    } else {
        if (out)
            body(master, grad, FSO_DT_BF16, m, v, out, n, &k);
        else
            body(master, grad, FSO_DT_BF16, m, v, NULL, n, &k);
    }
}
