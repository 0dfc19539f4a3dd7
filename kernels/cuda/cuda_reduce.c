/* cuda_reduce.c — sqnorm's and sum's fixed order on the host: the sum the
 * device reduction (cuda_ops.cu's reduce kernels, FSO_CUDA_REDUCE_* in
 * cuda_impl.h) computes, replayed bit for bit on the CPU, and the scratch
 * it needs. Compiled by the C compiler into the CUDA module and into the
 * tests' stand-in (tests/standin), so there is one host definition: the
 * backend sums host memory the device cannot read with it, and the
 * stand-in's reduce "kernel" is it. */
#include "cuda_impl.h"

#define SQ_THREADS FSO_CUDA_REDUCE_THREADS
#define SQ_CHUNK FSO_CUDA_REDUCE_CHUNK

size_t fso_cuda_reduce_scratch_elems(size_t n)
{
    return 1 + (n + SQ_CHUNK - 1) / SQ_CHUNK;
}

/* The device's halving tree over SQ_THREADS partial sums (sq_tree). */
static double sq_tree_host(double *sh)
{
    for (int w = SQ_THREADS / 2; w > 0; w >>= 1)
        for (int t = 0; t < w; t++)
            sh[t] = sh[t] + sh[t + w];
    return sh[0];
}

double fso_cuda_reduce_host(const float *x, size_t n, int square)
{
    const size_t chunks = (n + SQ_CHUNK - 1) / SQ_CHUNK;
    double sh[SQ_THREADS], tot[SQ_THREADS] = {0};
    /* chunk sums go straight into the final pass's per-thread sums:
     * thread t of the final pass adds chunks t, t + SQ_THREADS, ... in order */
    for (size_t b = 0; b < chunks; b++) {
        const size_t base = b * SQ_CHUNK, end = base + SQ_CHUNK < n ? base + SQ_CHUNK : n;
        for (int t = 0; t < SQ_THREADS; t++) {
            double s = 0.0;
            for (size_t i = base + t; i < end; i += SQ_THREADS) {
                const double v = x[i];
                s += square ? v * v : v;
            }
            sh[t] = s;
        }
        tot[b % SQ_THREADS] += sq_tree_host(sh);
    }
    return sq_tree_host(tot);
}
