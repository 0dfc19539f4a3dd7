/* cuda_common.cuh — device helpers shared by the CUDA kernels (CUDA C++ only,
 * private to kernels/): block-wide reductions with a fixed combining order,
 * launch geometry. Every reduction here combines partial values in an order
 * fixed by the launch shape, so results are the same on every run. */
#ifndef FSO_CUDA_COMMON_CUH
#define FSO_CUDA_COMMON_CUH

#include <stddef.h>
#include <stdint.h>

#include "cuda_impl.h"

#define FSO_FULL_MASK 0xffffffffu

template <typename T> __device__ __forceinline__ T fso_warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(FSO_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float fso_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(FSO_FULL_MASK, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the result. sh: 32 elements of shared memory. */
template <typename T> __device__ T fso_block_sum(T v, T *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (int)(blockDim.x >> 5);
    v = fso_warp_sum(v);
    __syncthreads(); /* sh may still be read from a previous call */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? sh[lane] : (T)0;
        v = fso_warp_sum(v);
        if (lane == 0)
            sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

__device__ __forceinline__ float fso_block_max(float v, float *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (int)(blockDim.x >> 5);
    v = fso_warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? sh[lane] : -INFINITY;
        v = fso_warp_max(v);
        if (lane == 0)
            sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

/* Blocks for a grid-stride loop over n items with `threads` per block. */
static inline unsigned fso_grid_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

/* Threads per block for a row of `len` items: a multiple of 32, 32..max. */
static inline unsigned fso_row_threads(size_t len, unsigned max)
{
    unsigned t = 32;
    while (t < max && t < len)
        t <<= 1;
    return t;
}

#endif
