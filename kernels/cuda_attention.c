/* cuda_attention.c — causal attention with grouped-query heads: cuBLAS
 * strided-batched GEMMs for the products, a row kernel for the softmax
 * (cuda_softmax.cu).
 *
 * Layouts (backend.h): q, out (B,T,H,D); k, v (B,T,Hkv,D); probs (B,H,T,T)
 * with zeros above the diagonal. Query head h reads kv head h / group. For
 * a fixed batch b and a fixed position j inside the group, the heads
 * h = hk*group + j (hk = 0..Hkv-1) are evenly spaced in q, k, v and probs, so
 * one strided-batched GEMM over hk covers them; the ops loop over (b, j).
 *
 * Forward:  S = q k^T / sqrt(D) (the whole square; the softmax masks it),
 *           P = causal softmax(S) in place in probs, out = P v.
 * Backward (per batch b, dP in the backend's scratch, H*T*T floats):
 *           dP = dO v^T, dS = P * (dP - rowsum(P * dP)) / sqrt(D),
 *           dq = dS k, dk = sum over the group of dS^T q, dv = sum of P^T dO
 *           (the group's sums by GEMM accumulation, j in order: beta 0, 1, 1..).
 * The square products waste the half above the diagonal; a fused kernel
 * (flash attention) is the next step, not a different result.
 */
#include <math.h>

#include "cuda_impl.h"

void fso_cuda_attention_fwd(fso_backend *be, float *out, float *probs, const float *q,
                            const float *k, const float *v, int B, int T, int H, int Hkv, int D)
{
    if (B <= 0 || T <= 0 || H <= 0 || Hkv <= 0 || D <= 0)
        return;
    fso_cuda_begin(be, FSO_CS_COMPUTE);
    const int group = H / Hkv;
    const int qs = H * D, ks = Hkv * D; /* row strides */
    const long long TT = (long long)T * T;
    const float scale = 1.0f / sqrtf((float)D);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < group; j++) {
            const float *qb = q + (size_t)b * T * qs + (size_t)j * D;
            const float *kb = k + (size_t)b * T * ks;
            float *pb = probs + ((size_t)b * H + j) * TT;
            /* S^T (s, t) = k_hk (s, :) . q_h (t, :) */
            fso_cuda_gemm(be, 1, 0, T, T, D, scale, kb, ks, D, qb, qs, (long long)group * D,
                          0.0f, pb, T, group * TT, Hkv);
        }
    fso_cuda_causal_softmax(be, probs, (size_t)B * H * T, T);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < group; j++) {
            const float *vb = v + (size_t)b * T * ks;
            const float *pb = probs + ((size_t)b * H + j) * TT;
            float *ob = out + (size_t)b * T * qs + (size_t)j * D;
            /* out^T (d, t) = sum_s v (s, d) P (t, s) */
            fso_cuda_gemm(be, 0, 0, D, T, T, 1.0f, vb, ks, D, pb, T, group * TT, 0.0f, ob, qs,
                          (long long)group * D, Hkv);
        }
    fso_cuda_end(be, FSO_CS_COMPUTE, "attention_fwd");
}

void fso_cuda_attention_bwd(fso_backend *be, float *dq, float *dk, float *dv, const float *dout,
                            const float *probs, const float *q, const float *k, const float *v,
                            int B, int T, int H, int Hkv, int D)
{
    if (B <= 0 || T <= 0 || H <= 0 || Hkv <= 0 || D <= 0)
        return;
    fso_cuda_begin(be, FSO_CS_COMPUTE);
    const int group = H / Hkv;
    const int qs = H * D, ks = Hkv * D;
    const long long TT = (long long)T * T;
    const float scale = 1.0f / sqrtf((float)D);
    float *dp = (float *)fso_cuda_scratch(be, sizeof(float) * (size_t)H * TT);
    if (!dp) {
        fso_cuda_end(be, FSO_CS_COMPUTE, "attention_bwd");
        return;
    }
    for (int b = 0; b < B; b++) {
        const float *pb = probs + (size_t)b * H * TT;
        const float *qb = q + (size_t)b * T * qs, *dob = dout + (size_t)b * T * qs;
        const float *kb = k + (size_t)b * T * ks, *vb = v + (size_t)b * T * ks;
        float *dqb = dq + (size_t)b * T * qs;
        float *dkb = dk + (size_t)b * T * ks, *dvb = dv + (size_t)b * T * ks;
        /* dP^T (s, t) = v (s, :) . dO (t, :) */
        for (int j = 0; j < group; j++)
            fso_cuda_gemm(be, 1, 0, T, T, D, 1.0f, vb, ks, D, dob + (size_t)j * D, qs,
                          (long long)group * D, 0.0f, dp + (size_t)j * TT, T, group * TT, Hkv);
        fso_cuda_causal_softmax_bwd(be, dp, pb, (size_t)H * T, T, scale);
        for (int j = 0; j < group; j++) {
            const float beta = j == 0 ? 0.0f : 1.0f;
            const long long gD = (long long)group * D;
            /* dq^T (d, t) = sum_s k (s, d) dS (t, s) */
            fso_cuda_gemm(be, 0, 0, D, T, T, 1.0f, kb, ks, D, dp + (size_t)j * TT, T, group * TT,
                          0.0f, dqb + (size_t)j * D, qs, gD, Hkv);
            /* dk^T (d, s) += sum_t q (t, d) dS (t, s) */
            fso_cuda_gemm(be, 0, 1, D, T, T, 1.0f, qb + (size_t)j * D, qs, gD,
                          dp + (size_t)j * TT, T, group * TT, beta, dkb, ks, D, Hkv);
            /* dv^T (d, s) += sum_t dO (t, d) P (t, s) */
            fso_cuda_gemm(be, 0, 1, D, T, T, 1.0f, dob + (size_t)j * D, qs, gD,
                          pb + (size_t)j * TT, T, group * TT, beta, dvb, ks, D, Hkv);
        }
    }
    fso_cuda_end(be, FSO_CS_COMPUTE, "attention_bwd");
}
