/* zero_rail.h — private to engine/zero*.c (through zero_impl.h): the
 * trainer across several boxes (zero_rail.c; engine/boxes.h has the
 * scheme). Device g of every box shares rail g, an fso_coll whose ranks are
 * the boxes: its compute thread reduce-scatters the step's gradient shards
 * there and sums the step's scalars, its updater all-gathers each block's
 * updated working parameters. Of every device shard, box k holds slice k of
 * the optimizer's kinds (footprint.h fso_fp_kind_elems): elements
 * [k S/B, (k+1) S/B) of the shard's S. Ownership words are zero_impl.h's. */
#ifndef FSO_ZERO_RAIL_H
#define FSO_ZERO_RAIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coll.h"
#include "zero.h"
#include "zero_io.h"

typedef struct rank_rail {
    fso_coll *grad;              /* setup: the compute thread's rail (NULL: one box) */
    fso_coll *param;             /* setup: the updater's rail */
    fso_coll *grad_dev, *param_dev; /* setup: the same over device memory (NCCL, GPUs), for
                                    the shards that live on the device; NULL: none, the
                                    shards meet through host memory */
    slot io;                     /* the updater: io.buf (setup) a whole parameter shard
                                    (max_shard, the working type), where it gathers a block
                                    whose parameters live where the CPU cannot write them
                                    (NVMe, a GPU) before they are stored whole; NULL when no
                                    block's do. The slot tracks that I/O */
    size_t buf_bytes;            /* setup: io.buf's size */
    uint64_t net_bytes;          /* atomic: bytes the updater's all-gathers sent since the last
                                    step took them (the compute thread counts its own in
                                    compute.st) */
    double param_ms;             /* opt.mu: the updater's rail time since the last step took
                                    it */
    bool broken;                 /* a call on this device's rails failed (a box died, stalled
                                    or disagreed): no later call waits on them again */
} rank_rail;

typedef struct rank_state rank_state;

/* The first element of a device shard that this box holds of kind k, and
 * how many: [lo, lo + n) of the shard's elements (zr_shard_elems). */
size_t zr_kind_lo(const fso_zero *z, int b, fso_kind k);
size_t zr_kind_elems(const fso_zero *z, int b, fso_kind k);
/* The elements of a device shard the optimizer updates on this box (the
 * optimizer's slice; the whole shard on one box). */
static inline size_t zr_opt_lo(const fso_zero *z, int b)
{
    return zr_kind_lo(z, b, FSO_KIND_MASTER);
}
static inline size_t zr_opt_elems(const fso_zero *z, int b)
{
    return zr_kind_elems(z, b, FSO_KIND_MASTER);
}

/* After the step's last micro-batch, on the compute thread: every block's
 * gradient shard reduce-scattered over the rail (this box keeps the sum of
 * its slice, in box order), and each block's squared norm taken over that
 * slice. Every box calls it whether or not its step failed, so that no box
 * waits for it: a failure is carried by the scalars' sum that follows.
 * 0, or negative errno recorded in compute.err. */
int zr_rail_reduce_grads(rank_state *rk);
/* The step's scalars (loss sum, squared norm, failures) summed over the
 * boxes, in box order, on the compute thread. 0 or negative errno
 * recorded in compute.err. */
int zr_rail_sum(rank_state *rk, double *v, int n);
/* Where the updater writes the new working parameters of elements [c0,
 * ...) of block b: the rail buffer when the block's parameters are
 * gathered there (rail.buf, NVMe or a GPU), else NULL (the usual place). */
void *zr_rail_param_dest(rank_state *rk, int b, size_t c0);
/* The updater, once block b's slice of working parameters is written
 * (in_buf: into the rail buffer, zr_rail_param_dest; else where the
 * parameters live): every box's slice all-gathered over the rail into the
 * whole shard, wherever it lives; `step` the update's. 0 or negative
 * errno recorded in opt.err. */
int zr_rail_gather_params(rank_state *rk, int b, int64_t step, bool in_buf);
/* Kind k (a sliced one) of block b on every device, gathered from every box
 * into the flat fp32 block (padded_elems), on the caller's thread between
 * steps: exports and checkpoints see the whole master. */
int zr_rail_gather_block(fso_zero *z, int b, fso_kind k, float *flat);

#endif
