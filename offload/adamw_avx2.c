/* adamw_avx2.c — the fused AdamW kernel, 8 fp32 lanes (AVX2).
 *
 * Same operations in the same order as the scalar reference (adamw.c), one
 * correctly rounded mul/add/div/sqrt each, compiled with -ffp-contract=off:
 * the bits equal the reference's. The head (until master is 32-byte
 * aligned) and the tail (under 8 elements) go through the scalar kernel.
 * bf16 in: zero-extend and shift left by 16. bf16 out: integer round to
 * nearest even, NaN quieted, then a saturating pack (no value exceeds
 * 0xffff, so it never saturates).
 */
#include "adamw.h"

#include <immintrin.h>

typedef struct vconsts {
    __m256 scale, decay, beta1, omb1, beta2, omb2, step_size, bc2_sqrt, eps;
} vconsts;

static inline __attribute__((always_inline)) __m256 load_grad(const void *grad, fso_dtype dt,
                                                              size_t i)
{
    if (dt == FSO_DT_F32)
        return _mm256_loadu_ps((const float *)grad + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)grad + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __attribute__((always_inline)) __m128i to_bf16(__m256 p)
{
    __m256i u = _mm256_castps_si256(p);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    r = _mm256_srli_epi32(r, 16);
    __m256i qnan = _mm256_or_si256(hi, _mm256_set1_epi32(0x0040));
    __m256 isnan = _mm256_cmp_ps(p, p, _CMP_UNORD_Q);
    r = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(qnan), isnan));
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

static inline __attribute__((always_inline)) void body(float *restrict master,
                                                       const void *restrict grad, fso_dtype dt,
                                                       float *restrict m, float *restrict v,
                                                       uint16_t *restrict out, size_t n,
                                                       const vconsts *k)
{
    for (size_t i = 0; i + 8 <= n; i += 8) {
        __m256 g = _mm256_mul_ps(load_grad(grad, dt, i), k->scale);
        __m256 p = _mm256_mul_ps(_mm256_loadu_ps(master + i), k->decay);
        __m256 mi = _mm256_add_ps(_mm256_mul_ps(k->beta1, _mm256_loadu_ps(m + i)),
                                  _mm256_mul_ps(k->omb1, g));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(k->beta2, _mm256_loadu_ps(v + i)),
                                  _mm256_mul_ps(_mm256_mul_ps(k->omb2, g), g));
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), k->bc2_sqrt), k->eps);
        p = _mm256_sub_ps(p, _mm256_mul_ps(k->step_size, _mm256_div_ps(mi, denom)));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(master + i, p);
        if (out)
            _mm_storeu_si128((__m128i *)(out + i), to_bf16(p));
    }
}

void fso_adamw_fused_avx2(float *restrict master, const void *restrict grad,
                          fso_dtype grad_dtype, float *restrict m, float *restrict v,
                          uint16_t *restrict out, size_t n, const fso_adamw_consts *c)
{
    size_t gsize = grad_dtype == FSO_DT_F32 ? 4 : 2;
    size_t head = (size_t)((32 - ((uintptr_t)master & 31)) & 31) / sizeof(float);
    if (head > n)
        head = n;
    if (head) {
        fso_adamw_fused_scalar(master, grad, grad_dtype, m, v, out, head, c);
        master += head, m += head, v += head;
        grad = (const char *)grad + head * gsize;
        out = out ? out + head : NULL;
        n -= head;
    }
    vconsts k = {
        _mm256_set1_ps(c->scale), _mm256_set1_ps(c->decay),
        _mm256_set1_ps(c->beta1), _mm256_set1_ps(c->one_minus_beta1),
        _mm256_set1_ps(c->beta2), _mm256_set1_ps(c->one_minus_beta2),
        _mm256_set1_ps(c->step_size), _mm256_set1_ps(c->bc2_sqrt), _mm256_set1_ps(c->eps),
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
    size_t done = n & ~(size_t)7;
    if (done < n)
        fso_adamw_fused_scalar(master + done, (const char *)grad + done * gsize, grad_dtype,
                               m + done, v + done, out ? out + done : NULL, n - done, c);
}
