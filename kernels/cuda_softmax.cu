/* cuda_softmax.cu — attention's row kernels: the causal softmax over the
 * scaled scores and its backward (cuda_attention.c runs the GEMMs around
 * them). One block per row of T; rows past the diagonal come out exactly 0.
 */
#include <math.h>

#include "cuda_common.cuh"

/* One block per row (b, h, t) of probs, holding scaled scores on entry. */
__global__ void causal_softmax_kernel(float *probs, int T)
{
    __shared__ float sh[32];
    const size_t row = blockIdx.x;
    const int t = (int)(row % T);
    float *p = probs + row * T;
    float mx = -INFINITY;
    for (int s = threadIdx.x; s <= t; s += blockDim.x)
        mx = fmaxf(mx, p[s]);
    mx = fso_block_max(mx, sh);
    float part = 0.0f;
    for (int s = threadIdx.x; s <= t; s += blockDim.x)
        part += expf(p[s] - mx);
    const float sum = fso_block_sum(part, sh);
    for (int s = threadIdx.x; s < T; s += blockDim.x)
        p[s] = s <= t ? expf(p[s] - mx) / sum : 0.0f;
}

/* dS = P * (dP - rowsum(P * dP)) * scale over one batch's H*T rows; dS
 * written over dP, zero above the diagonal. */
__global__ void causal_softmax_bwd_kernel(float *dp, const float *probs, int T, float scale)
{
    __shared__ float sh[32];
    const size_t row = blockIdx.x;
    const int t = (int)(row % T);
    const float *p = probs + row * T;
    float *d = dp + row * T;
    float part = 0.0f;
    for (int s = threadIdx.x; s <= t; s += blockDim.x)
        part += p[s] * d[s];
    const float rowsum = fso_block_sum(part, sh);
    for (int s = threadIdx.x; s < T; s += blockDim.x)
        d[s] = s <= t ? p[s] * (d[s] - rowsum) * scale : 0.0f;
}

extern "C" void fso_cuda_causal_softmax(fso_backend *be, float *probs, size_t rows, int T)
{
    cudaStream_t s = FSO_CUDA_CTX(be)->stream[FSO_CS_COMPUTE];
    causal_softmax_kernel<<<(unsigned)rows, fso_row_threads((size_t)T, 256), 0, s>>>(probs, T);
}

extern "C" void fso_cuda_causal_softmax_bwd(fso_backend *be, float *dp, const float *probs,
                                            size_t rows, int T, float scale)
{
    cudaStream_t s = FSO_CUDA_CTX(be)->stream[FSO_CS_COMPUTE];
    causal_softmax_bwd_kernel<<<(unsigned)rows, fso_row_threads((size_t)T, 256), 0, s>>>(
        dp, probs, T, scale);
}
