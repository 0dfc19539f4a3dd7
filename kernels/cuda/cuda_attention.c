/* cuda_attention.c — causal attention with grouped-query heads: cuBLAS
 * strided-batched GEMMs for the products, row kernels for the softmax
 * (cuda_softmax.cu).
 *
 * Layouts (backend.h): q, out (B,T,H,D); k, v (B,T,Hkv,D); probs (B,H,T,T)
 * with zeros above the diagonal. Query head h reads kv head h / group. For
 * a fixed batch b and a fixed position j inside the group, the heads
 * h = hk*group + j (hk = 0..Hkv-1) are evenly spaced in q, k, v and probs, so
 * one strided-batched GEMM over hk covers them; the ops loop over (b, j).
 *
 * fp32 (every tensor fp32; the backend's matmul math):
 * Forward:  S = q k^T / sqrt(D) (the whole square; the softmax masks it),
 *           P = causal softmax(S) in place in probs, out = P v. With
 *           documents (pos) the softmax also masks the keys before a
 *           token's document, so P is block-diagonal causal.
 * Backward (per batch b, dP in the backend's scratch, H*T*T floats):
 *           dP = dO v^T, dS = P * (dP - rowsum(P * dP)) / sqrt(D),
 *           dq = dS k, dk = sum over the group of dS^T q, dv = sum of P^T dO
 *           (the group's sums by GEMM accumulation, j in order: beta 0, 1, 1..).
 *
 * bf16 (every tensor bf16; products on the tensor cores, fp32 sums), per
 * (b, j), i.e. Hkv heads at a time, with fp32 scores:
 * Forward:  S (Hkv,T,T) fp32 in the scratch = q k^T / sqrt(D); the softmax
 *           reads it and stores P in bf16 to probs, rounded once; out = P v
 *           from the stored P, rounded once.
 * Backward: dP (Hkv,T,T) fp32 in the scratch = dO v^T; dS from it and the
 *           stored P, in fp32, then rounded to bf16 in the scratch (Hkv,T,T)
 *           as the operand of dq = dS k (rounded once) and of dk; dv = P^T dO.
 *           The group's dk and dv sums accumulate in fp32 in the scratch
 *           ((T, Hkv, D) each; beta 0, 1, 1..) and are rounded once per batch;
 *           without groups (H == Hkv) they are stored directly.
 *           Scratch: Hkv*T*T*6 bytes, plus T*Hkv*D*8 with groups.
 *
 * The square products waste the half above the diagonal; a fused kernel
 * (flash attention) is the next step, not a different result.
 */
#include <math.h>

#include "cuda_impl.h"

static void attention_fwd_f32(fso_backend *be, float *out, float *probs, const float *q,
                              const float *k, const float *v, const int32_t *pos, int B, int T,
                              int H, int Hkv, int D)
{
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
            fso_cuda_gemm(be, FSO_DT_F32, FSO_DT_F32, 1, 0, T, T, D, scale, kb, ks, D, qb, qs,
                          (long long)group * D, 0.0f, pb, T, group * TT, Hkv);
        }
    fso_cuda_causal_softmax(be, probs, FSO_DT_F32, (size_t)TT, probs, (size_t)B * H * T, T, pos,
                            H);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < group; j++) {
            const float *vb = v + (size_t)b * T * ks;
            const float *pb = probs + ((size_t)b * H + j) * TT;
            float *ob = out + (size_t)b * T * qs + (size_t)j * D;
            /* out^T (d, t) = sum_s v (s, d) P (t, s) */
            fso_cuda_gemm(be, FSO_DT_F32, FSO_DT_F32, 0, 0, D, T, T, 1.0f, vb, ks, D, pb, T,
                          group * TT, 0.0f, ob, qs, (long long)group * D, Hkv);
        }
}

/* bf16 tensors are uint16_t bits here. */
static void attention_fwd_bf16(fso_backend *be, uint16_t *out, uint16_t *probs, const uint16_t *q,
                               const uint16_t *k, const uint16_t *v, const int32_t *pos, int B,
                               int T, int H, int Hkv, int D)
{
    const int group = H / Hkv;
    const int qs = H * D, ks = Hkv * D;
    const long long TT = (long long)T * T;
    const float scale = 1.0f / sqrtf((float)D);
    float *S = fso_cuda_scratch(be, sizeof(float) * (size_t)Hkv * TT);
    if (!S)
        return;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < group; j++) {
            const uint16_t *qb = q + (size_t)b * T * qs + (size_t)j * D;
            const uint16_t *kb = k + (size_t)b * T * ks, *vb = v + (size_t)b * T * ks;
            uint16_t *pb = probs + ((size_t)b * H + j) * TT;
            uint16_t *ob = out + (size_t)b * T * qs + (size_t)j * D;
            /* S_hk^T (s, t) = k_hk (s, :) . q_h (t, :), fp32 */
            fso_cuda_gemm(be, FSO_DT_BF16, FSO_DT_F32, 1, 0, T, T, D, scale, kb, ks, D, qb, qs,
                          (long long)group * D, 0.0f, S, T, TT, Hkv);
            /* S's head hk is query head hk*group + j: group*T*T apart in probs */
            fso_cuda_causal_softmax(be, pb, FSO_DT_BF16, (size_t)group * TT, S, (size_t)Hkv * T, T,
                                    pos ? pos + (size_t)b * T : NULL, Hkv);
            /* out^T (d, t) = sum_s v (s, d) P (t, s) */
            fso_cuda_gemm(be, FSO_DT_BF16, FSO_DT_BF16, 0, 0, D, T, T, 1.0f, vb, ks, D, pb, T,
                          group * TT, 0.0f, ob, qs, (long long)group * D, Hkv);
        }
}

void fso_cuda_attention_fwd(fso_backend *be, void *out, void *probs, const void *q,
                            const void *k, const void *v, const int32_t *pos, fso_dtype dt,
                            int B, int T, int H, int Hkv, int D)
{
    if (B <= 0 || T <= 0 || H <= 0 || Hkv <= 0 || D <= 0)
        return;
    fso_cuda_begin(be, FSO_CS_COMPUTE);
    if (dt == FSO_DT_BF16)
        attention_fwd_bf16(be, out, probs, q, k, v, pos, B, T, H, Hkv, D);
    else
        attention_fwd_f32(be, out, probs, q, k, v, pos, B, T, H, Hkv, D);
    fso_cuda_end(be, FSO_CS_COMPUTE, "attention_fwd");
}

static void attention_bwd_f32(fso_backend *be, float *dq, float *dk, float *dv, const float *dout,
                              const float *probs, const float *q, const float *k, const float *v,
                              int B, int T, int H, int Hkv, int D)
{
    const int group = H / Hkv;
    const int qs = H * D, ks = Hkv * D;
    const long long TT = (long long)T * T;
    const float scale = 1.0f / sqrtf((float)D);
    float *dp = fso_cuda_scratch(be, sizeof(float) * (size_t)H * TT);
    if (!dp)
        return;
    for (int b = 0; b < B; b++) {
        const float *pb = probs + (size_t)b * H * TT;
        const float *qb = q + (size_t)b * T * qs, *dob = dout + (size_t)b * T * qs;
        const float *kb = k + (size_t)b * T * ks, *vb = v + (size_t)b * T * ks;
        float *dqb = dq + (size_t)b * T * qs;
        float *dkb = dk + (size_t)b * T * ks, *dvb = dv + (size_t)b * T * ks;
        /* dP^T (s, t) = v (s, :) . dO (t, :) */
        for (int j = 0; j < group; j++)
            fso_cuda_gemm(be, FSO_DT_F32, FSO_DT_F32, 1, 0, T, T, D, 1.0f, vb, ks, D,
                          dob + (size_t)j * D, qs, (long long)group * D, 0.0f,
                          dp + (size_t)j * TT, T, group * TT, Hkv);
        fso_cuda_causal_softmax_bwd(be, dp, FSO_DT_F32, dp, pb, (size_t)TT, (size_t)H * T, T,
                                    scale);
        for (int j = 0; j < group; j++) {
            const float beta = j == 0 ? 0.0f : 1.0f;
            const long long gD = (long long)group * D;
            /* dq^T (d, t) = sum_s k (s, d) dS (t, s) */
            fso_cuda_gemm(be, FSO_DT_F32, FSO_DT_F32, 0, 0, D, T, T, 1.0f, kb, ks, D,
                          dp + (size_t)j * TT, T, group * TT, 0.0f, dqb + (size_t)j * D, qs, gD,
                          Hkv);
            /* dk^T (d, s) += sum_t q (t, d) dS (t, s) */
            fso_cuda_gemm(be, FSO_DT_F32, FSO_DT_F32, 0, 1, D, T, T, 1.0f, qb + (size_t)j * D, qs,
                          gD, dp + (size_t)j * TT, T, group * TT, beta, dkb, ks, D, Hkv);
            /* dv^T (d, s) += sum_t dO (t, d) P (t, s) */
            fso_cuda_gemm(be, FSO_DT_F32, FSO_DT_F32, 0, 1, D, T, T, 1.0f, dob + (size_t)j * D, qs,
                          gD, pb + (size_t)j * TT, T, group * TT, beta, dvb, ks, D, Hkv);
        }
    }
}

static void attention_bwd_bf16(fso_backend *be, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                               const uint16_t *dout, const uint16_t *probs, const uint16_t *q,
                               const uint16_t *k, const uint16_t *v, int B, int T, int H,
                               int Hkv, int D)
{
    const int group = H / Hkv;
    const int qs = H * D, ks = Hkv * D;
    const long long TT = (long long)T * T, gD = (long long)group * D;
    const float scale = 1.0f / sqrtf((float)D);
    const size_t sq = (size_t)Hkv * TT, kv = (size_t)T * ks; /* a slice's elements */
    const size_t acc_bytes = group > 1 ? sizeof(float) * kv : 0;
    char *cur = fso_cuda_scratch(be, fso_cuda_scratch_round(sizeof(float) * sq) +
                                         fso_cuda_scratch_round(sizeof(uint16_t) * sq) +
                                         2 * fso_cuda_scratch_round(acc_bytes));
    if (!cur)
        return;
    float *dp = fso_cuda_scratch_part(&cur, sizeof(float) * sq);
    uint16_t *ds = fso_cuda_scratch_part(&cur, sizeof(uint16_t) * sq);
    float *dk_acc = fso_cuda_scratch_part(&cur, acc_bytes);
    float *dv_acc = fso_cuda_scratch_part(&cur, acc_bytes);
    /* where the group's dk, dv sums go: fp32 accumulators, or the outputs */
    const fso_dtype acc_dt = group > 1 ? FSO_DT_F32 : FSO_DT_BF16;
    for (int b = 0; b < B; b++) {
        const uint16_t *qb = q + (size_t)b * T * qs, *dob = dout + (size_t)b * T * qs;
        const uint16_t *kb = k + (size_t)b * T * ks, *vb = v + (size_t)b * T * ks;
        uint16_t *dqb = dq + (size_t)b * T * qs;
        uint16_t *dkb = dk + (size_t)b * T * ks, *dvb = dv + (size_t)b * T * ks;
        void *dk_to = group > 1 ? (void *)dk_acc : (void *)dkb;
        void *dv_to = group > 1 ? (void *)dv_acc : (void *)dvb;
        for (int j = 0; j < group; j++) {
            const uint16_t *pb = probs + ((size_t)b * H + j) * TT; /* head j; hk group*TT apart */
            const float beta = j == 0 ? 0.0f : 1.0f;
            /* dP_hk^T (s, t) = v (s, :) . dO (t, :), fp32 */
            fso_cuda_gemm(be, FSO_DT_BF16, FSO_DT_F32, 1, 0, T, T, D, 1.0f, vb, ks, D,
                          dob + (size_t)j * D, qs, gD, 0.0f, dp, T, TT, Hkv);
            fso_cuda_causal_softmax_bwd(be, ds, FSO_DT_BF16, dp, pb, (size_t)group * TT,
                                        (size_t)Hkv * T, T, scale);
            /* dq^T (d, t) = sum_s k (s, d) dS (t, s) */
            fso_cuda_gemm(be, FSO_DT_BF16, FSO_DT_BF16, 0, 0, D, T, T, 1.0f, kb, ks, D, ds, T, TT,
                          0.0f, dqb + (size_t)j * D, qs, gD, Hkv);
            /* dk^T (d, s) += sum_t q (t, d) dS (t, s) */
            fso_cuda_gemm(be, FSO_DT_BF16, acc_dt, 0, 1, D, T, T, 1.0f, qb + (size_t)j * D, qs, gD,
                          ds, T, TT, beta, dk_to, ks, D, Hkv);
            /* dv^T (d, s) += sum_t dO (t, d) P (t, s) */
            fso_cuda_gemm(be, FSO_DT_BF16, acc_dt, 0, 1, D, T, T, 1.0f, dob + (size_t)j * D, qs, gD,
                          pb, T, group * TT, beta, dv_to, ks, D, Hkv);
        }
        if (group > 1) {
            fso_cuda_narrow(be, dkb, dk_acc, kv);
            fso_cuda_narrow(be, dvb, dv_acc, kv);
        }
    }
}

/* Documents need nothing of their own here: the probabilities the forward
 * stored are 0 outside a token's document, so every product below adds 0
 * for those keys (pos is the forward's, for the contract). */
void fso_cuda_attention_bwd(fso_backend *be, void *dq, void *dk, void *dv, const void *dout,
                            const void *probs, const void *q, const void *k, const void *v,
                            const int32_t *pos, fso_dtype dt, int B, int T, int H, int Hkv,
                            int D)
{
    (void)pos;
    if (B <= 0 || T <= 0 || H <= 0 || Hkv <= 0 || D <= 0)
        return;
    fso_cuda_begin(be, FSO_CS_COMPUTE);
    if (dt == FSO_DT_BF16)
        attention_bwd_bf16(be, dq, dk, dv, dout, probs, q, k, v, B, T, H, Hkv, D);
    else
        attention_bwd_f32(be, dq, dk, dv, dout, probs, q, k, v, B, T, H, Hkv, D);
    fso_cuda_end(be, FSO_CS_COMPUTE, "attention_bwd");
}
