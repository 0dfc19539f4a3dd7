/* cuda_common.cuh — device helpers shared by the CUDA kernels (CUDA C++ only,
 * private to kernels/): loads and stores of the storage types, block-wide
 * reductions with a fixed combining order, launch geometry. Every reduction
 * here combines partial values in an order fixed by the launch shape, so
 * results are the same on every run. */
#ifndef FSO_CUDA_COMMON_CUH
#define FSO_CUDA_COMMON_CUH

#include <stddef.h>
#include <stdint.h>

#include "cuda_impl.h"

#define FSO_FULL_MASK 0xffffffffu

/* Storage types (backend.h's fso_dtype): kernels are templates over the
 * element type, float or uint16_t holding bf16 bits, and compute in fp32.
 * A bf16 load widens exactly (the bits become the top half of an fp32); a
 * store rounds to nearest even, a NaN keeping its sign and top payload
 * bits and made quiet: cast_f32_bf16's rule, cpu_ref.c's and
 * offload/adamw.h's bits. */
__device__ __forceinline__ uint16_t fso_bf16_of(float f)
{
    unsigned u = __float_as_uint(f);
    return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x0040u)
                                           : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float fso_f32_of(uint16_t b)
{
    return __uint_as_float((unsigned)b << 16);
}

__device__ __forceinline__ float fso_load(const float *p)
{
    return *p;
}

__device__ __forceinline__ float fso_load(const uint16_t *p)
{
    return fso_f32_of(*p);
}

__device__ __forceinline__ void fso_store(float *p, float v)
{
    *p = v;
}

__device__ __forceinline__ void fso_store(uint16_t *p, float v)
{
    *p = fso_bf16_of(v);
}

/* Four consecutive elements at once (p aligned to four of them): one
 * 16-byte load of fp32, one 8-byte load of bf16. */
__device__ __forceinline__ void fso_load4(const float *p, float v[4])
{
    const float4 f = *(const float4 *)p;
    v[0] = f.x;
    v[1] = f.y;
    v[2] = f.z;
    v[3] = f.w;
}

__device__ __forceinline__ void fso_load4(const uint16_t *p, float v[4])
{
    const uint2 u = *(const uint2 *)p;
    v[0] = __uint_as_float(u.x << 16);
    v[1] = __uint_as_float(u.x & 0xffff0000u);
    v[2] = __uint_as_float(u.y << 16);
    v[3] = __uint_as_float(u.y & 0xffff0000u);
}

__device__ __forceinline__ void fso_store4(float *p, const float v[4])
{
    *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
}

__device__ __forceinline__ void fso_store4(uint16_t *p, const float v[4])
{
    uint2 u;
    u.x = (unsigned)fso_bf16_of(v[0]) | (unsigned)fso_bf16_of(v[1]) << 16;
    u.y = (unsigned)fso_bf16_of(v[2]) | (unsigned)fso_bf16_of(v[3]) << 16;
    *(uint2 *)p = u;
}

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

/* p is aligned to `bytes`. */
static inline bool fso_aligned(const void *p, size_t bytes)
{
    return ((uintptr_t)p & (bytes - 1)) == 0;
}

#endif
