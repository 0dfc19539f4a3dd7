/* sum_order.h — the one order in which fsoff sums floats in double: the sum
 * of squares behind sqnorm (gradient norms, hence clipping) and the plain
 * sum behind sum (a micro-batch's loss), on every backend and every tier,
 * so one job gives the same bits wherever its gradients live.
 *
 * The order is the CUDA device's reduction (kernels/cuda/cuda_ops.cu), made
 * of FSO_SUM_CHUNK-element chunks:
 *   - a chunk is summed by FSO_SUM_LANES strided lanes: lane t adds x[t],
 *     x[t + LANES], x[t + 2 LANES], ... of the chunk, from 0.0, in double
 *     (squares: (double)x * x, exact, so a fused multiply-add gives the
 *     same bits); the lanes are then added by fso_sum_tree;
 *   - chunk b's sum is added to slot b % LANES, chunks in order, the slots
 *     starting at 0.0; the slots are added by fso_sum_tree;
 *   - that total is added to the caller's *out once.
 * It does not depend on the thread count: chunks are independent, and only
 * their combination (cheap) is sequential.
 *
 * Compiled into fsoff (the CPU backends, the engine) and into the CUDA
 * module and its stand-in, whose host code sums host memory the device
 * cannot read with it. */
#ifndef FSO_SUM_ORDER_H
#define FSO_SUM_ORDER_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FSO_SUM_LANES 256
#define FSO_SUM_CHUNK 65536

/* The chunks of n elements: ceil(n / FSO_SUM_CHUNK). */
static inline size_t fso_sum_chunks(size_t n)
{
    return (n + FSO_SUM_CHUNK - 1) / FSO_SUM_CHUNK;
}

/* The halving tree over FSO_SUM_LANES values: v[t] = v[t] + v[t + w] for
 * w = LANES/2, ..., 1; returns v[0] (v is overwritten). */
double fso_sum_tree(double v[FSO_SUM_LANES]);

/* lane[t] += x[t], x[t + LANES], ... over the next n elements of a chunk
 * (squares when square), element i of x going to lane i % LANES: x starts
 * at a multiple of LANES into its chunk, and n is a multiple of LANES unless
 * these are the chunk's last. Contiguous lanes: vectorized. */
void fso_sum_lanes_add(double lane[FSO_SUM_LANES], const float *x, size_t n, bool square);

/* One chunk's sum (n <= FSO_SUM_CHUNK): its lanes, then their tree. */
double fso_sum_chunk(const float *x, size_t n, bool square);

/* The whole order over n floats, one thread: the sum *out gets added.
 * 0.0 for n == 0. */
double fso_sum_ordered(const float *x, size_t n, bool square);

#ifdef __cplusplus
}
#endif

#endif
