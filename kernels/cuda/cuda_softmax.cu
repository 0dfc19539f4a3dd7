/* cuda_softmax.cu — attention's row kernels: the causal softmax over the
 * scaled scores and its backward (cuda_attention.c runs the GEMMs around
 * them). One block per row of T; the scores and their gradient come in
 * fp32, probabilities and their gradient go out stored as the op's type
 * (float or bf16 bits, cuda_common.cuh), zeros above the diagonal included.
 * In place when both are fp32: every thread reads an element before it
 * writes it, and no other thread touches it.
 */
#include <math.h>

#include "cuda_common.cuh"

/* Block r: the scaled scores in row r of `in`, its probabilities to row
 * (r / T) * out_head + (r % T) * T of out (in elements). Keys s0..t count:
 * s0 = t - pos[b * T + t] for the row's batch b = (r / T) / heads (its
 * document's first token), or 0 without pos. */
template <typename E>
__global__ void causal_softmax_kernel(E *out, size_t out_head, const float *in, int T,
                                      const int32_t *pos, int heads)
{
    __shared__ float sh[32];
    const size_t row = blockIdx.x;
    const int t = (int)(row % T);
    const int s0 = pos ? t - pos[(row / T / (size_t)heads) * T + t] : 0;
    const float *x = in + row * T;
    E *p = out + (row / T) * out_head + (size_t)t * T;
    float mx = -INFINITY;
    for (int s = s0 + (int)threadIdx.x; s <= t; s += blockDim.x)
        mx = fmaxf(mx, x[s]);
    mx = fso_block_max(mx, sh);
    float part = 0.0f;
    for (int s = s0 + (int)threadIdx.x; s <= t; s += blockDim.x)
        part += expf(x[s] - mx);
    const float sum = fso_block_sum(part, sh);
    for (int s = threadIdx.x; s < T; s += blockDim.x)
        fso_store(p + s, s >= s0 && s <= t ? expf(x[s] - mx) / sum : 0.0f);
}

/* Block r: dS = P * (dP - rowsum(P * dP)) * scale from row r of dp and the
 * probabilities at row (r / T) * probs_head + (r % T) * T, to row r of ds;
 * zero above the diagonal, and zero before a document's start (documents,
 * backend.h) because P is stored 0 there. */
template <typename E>
__global__ void causal_softmax_bwd_kernel(E *ds, const float *dp, const E *probs,
                                          size_t probs_head, int T, float scale)
{
    __shared__ float sh[32];
    const size_t row = blockIdx.x;
    const int t = (int)(row % T);
    const E *p = probs + (row / T) * probs_head + (size_t)t * T;
    const float *d = dp + row * T;
    E *o = ds + row * T;
    float part = 0.0f;
    for (int s = threadIdx.x; s <= t; s += blockDim.x)
        part += fso_load(p + s) * d[s];
    const float rowsum = fso_block_sum(part, sh);
    for (int s = threadIdx.x; s < T; s += blockDim.x)
        fso_store(o + s, s <= t ? fso_load(p + s) * (d[s] - rowsum) * scale : 0.0f);
}

extern "C" void fso_cuda_causal_softmax(fso_backend *be, void *out, fso_dtype dt,
                                        size_t out_head_elems, const float *in, size_t rows,
                                        int T, const int32_t *pos, int heads)
{
    cudaStream_t s = FSO_CUDA_CTX(be)->stream[FSO_CS_COMPUTE];
    const unsigned threads = fso_row_threads((size_t)T, 256);
    if (dt == FSO_DT_BF16)
        causal_softmax_kernel<<<(unsigned)rows, threads, 0, s>>>((uint16_t *)out, out_head_elems,
                                                                 in, T, pos, heads);
    else
        causal_softmax_kernel<<<(unsigned)rows, threads, 0, s>>>((float *)out, out_head_elems, in,
                                                                 T, pos, heads);
}

extern "C" void fso_cuda_causal_softmax_bwd(fso_backend *be, void *ds, fso_dtype dt,
                                            const float *dp, const void *probs,
                                            size_t probs_head_elems, size_t rows, int T,
                                            float scale)
{
    cudaStream_t s = FSO_CUDA_CTX(be)->stream[FSO_CS_COMPUTE];
    const unsigned threads = fso_row_threads((size_t)T, 256);
    if (dt == FSO_DT_BF16)
        causal_softmax_bwd_kernel<<<(unsigned)rows, threads, 0, s>>>(
            (uint16_t *)ds, dp, (const uint16_t *)probs, probs_head_elems, T, scale);
    else
        causal_softmax_bwd_kernel<<<(unsigned)rows, threads, 0, s>>>(
            (float *)ds, dp, (const float *)probs, probs_head_elems, T, scale);
}
