/* coll.h — the collective interface (ARCHITECTURE.md, The seams): all-gather, reduce-scatter,
 * all-reduce and barrier among the `world` devices of one process.
 *
 * Called SPMD style, like NCCL: every rank calls the same collective with
 * its own rank, from its own host thread, in the same order. Buffers are
 * device pointers of that rank's backend. Sums run in rank order, so results
 * are the same on every run and on every rank.
 *
 * Implementations: "threads" (shared memory between the host threads that
 * drive the CPU backend's virtual devices); NCCL comes with the CUDA
 * backend and fits the same table. Across boxes (engine/boxes.h), a "rail"
 * is the same table over device g of every box, rank = the box: "mpi"
 * (coll_mpi.c; CPU devices, and GPUs without a rail communicator) or
 * NCCL's. A rail's calls are bounded: one that a box does not join within
 * the rail's timeout fails with -ETIMEDOUT, a peer's failure with its
 * errno, and err says which box and what it was doing.
 */
#ifndef FSO_COLL_H
#define FSO_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* The most devices one process drives: every per-device table in fsoff
 * is this long, and fso_zero_create refuses more. */
#define FSO_MAX_DEVICES 64

typedef struct fso_coll fso_coll;

typedef struct fso_coll_ops {
    const char *name;
    /* recv (world*count) = concat over ranks of send (count), elements of
     * type dt (backend.h: it copies bits and converts nothing, so bf16
     * working parameters move at half the bytes of fp32 ones); send may be
     * recv + rank*count elements (in place). On a device with streams it
     * is ordered after the rank backend's work before mark `after` and
     * after every host-to-device copy queued so far (send may have just been
     * copied in); 0: after all of its work. A gather into a buffer compute
     * finished with then overlaps later compute. Compute queued after it
     * runs after it (backend.h order_after): on a device whose collectives
     * share one in-order stream, so after every collective before it too,
     * which is why a gather compute will need is issued before a
     * reduce-scatter compute need not wait for. */
    int (*all_gather)(fso_coll *c, int rank, const void *send, void *recv, size_t count,
                      fso_dtype dt, uint64_t after);
    /* recv (count) = sum over ranks k of send_k[rank*count .. +count).
     * Ordered after all of the rank backend's queued work; compute queued
     * after it is not ordered after it (backend.h order_after): reading
     * recv or writing send again from compute needs a mark after it given
     * to order_after first. */
    int (*reduce_scatter)(fso_coll *c, int rank, const float *send, float *recv, size_t count);
    /* recv (count) fp32 = sum over ranks k of send_k[rank*count .. +count)
     * bf16, each value widened exactly and the sum taken in fp32 in rank
     * order 0..world-1 (the same bits on every run and every rank): bf16
     * working gradients (train.gradient_dtype) travel at half the bytes of
     * fp32 ones and are rounded once, where they were cast, never in the
     * sum. recv does not overlap send. Ordered as reduce_scatter. */
    int (*reduce_scatter_bf16)(fso_coll *c, int rank, const uint16_t *send, float *recv,
                               size_t count);
    /* buf (count) = sum over ranks of buf, in double: losses and norms */
    int (*all_reduce_f64)(fso_coll *c, int rank, double *buf, size_t count);
    int (*barrier)(fso_coll *c, int rank);
    void (*destroy)(fso_coll *c);
} fso_coll_ops;

struct fso_coll {
    const fso_coll_ops *ops;
    void *ctx;
    int world;
    double busy_ms[FSO_MAX_DEVICES];   /* per rank: time inside collectives, for reports */
    char err[512];                     /* why the last call failed (rails; "" otherwise) */
};

/* Shared-memory collectives among `world` threads of this process. */
int fso_coll_create_threads(fso_coll **out, int world);
/* A rail over an MPI communicator (comm: an MPI_Comm *, kept out of this
 * header) whose ranks are the boxes: world = its size, every call made with
 * rank = this box's, from one thread at a time per rail. Buffers are host
 * memory. Every wait polls against timeout_s and the boxes' heartbeats
 * (engine/boxes.h); -ENOTSUP in a build without MPI. */
int fso_coll_create_mpi(fso_coll **out, const void *comm, double timeout_s);
/* Free the collectives (NULL is fine). Collectives made over devices
 * (NCCL's over CUDA backends, cpu-async's) use those backends: destroy them
 * first, once no rank has a collective still queued, and the backends
 * after. */
void fso_coll_destroy(fso_coll *c);

#endif
