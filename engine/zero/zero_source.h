/* zero_source.h — private to engine/zero*.c (through zero_impl.h): the
 * block source lent to the model (zero_source.c): a device's compute side,
 * its clock, and the gathers and reduces CPU devices do in their shared
 * memory. The compute side is the device's compute thread's; what other
 * threads read of it says so field by field. Ownership words are
 * zero_impl.h's. */
#ifndef FSO_ZERO_SOURCE_H
#define FSO_ZERO_SOURCE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "zero.h"
#include "zero_io.h"
#include "zero_lock.h"

/* A device's compute side (zero_source.c, zero_step.c): the full-block
 * buffers the model reads and writes on the device, where the micro-step
 * is, and the step's inputs and results. Compute, except where a field
 * says otherwise. */
typedef struct rank_compute {
    void *gather[2];             /* setup: gathered parameters (max_padded) in their working
                                    type (bf16 or fp32), what the model reads; the other
                                    devices' compute threads write into them (shared_coll) */
    int gather_block[2], gather_refs[2];
    int64_t gather_lend[2];      /* shared windows: the lend each holds (shared_coll) */
    int64_t lends;               /* params() calls so far: the same sequence on every device */
    uint64_t gather_free[2];     /* backend mark: compute done with gather[g] (0: assume not) */
    float *grad_full[2];         /* setup: full-block gradients (max_padded), reduce-scattered;
                                    the other devices read them (shared_coll rs_src) */
    uint16_t *grad_send[2];      /* setup, with bf16 gradients on devices the CPU cannot
                                    address: grad_full[g] rounded to bf16 (max_padded), what
                                    the reduce-scatter sends (footprint.h
                                    fso_fp_grad_send_buffers); NULL otherwise */
    int grad_full_block[2];
    uint64_t grad_read[2];       /* backend mark after the reduce-scatter and copies that last
                                    read grad_full[g]: compute writes it again ordered after
                                    that (backend.h order_after); 0: nothing to wait for */
    int64_t grad_reduce[2];      /* shared reduces: the reduce that last read grad_full[g] */
    int pre_block;               /* the block gathered ahead by grads_done() (before its
                                    reduce-scatter), which the next params() returns; -1 none */
    const void *pre_params;      /* its parameters */
    int64_t reduces;             /* grads_done() calls so far: the same on every device */
    int order_pos;               /* written under io.pf_mu (the prefetch kick reads it): position
                                    in z->order of the next params() */
    int64_t pass_lend;           /* written under io.pf_mu: lends at the pass's start; with
                                    parameters on NVMe, order position i is lend pass_lend + i */
    int micro;                   /* micro-batch index within the step */
    const int32_t *inputs, *targets;
    const int32_t *pos;          /* positions in documents, or NULL (fso_zero_step_run) */
    int64_t counted;             /* the step's targets that count, all devices */
    float *logits;               /* forward_logits: where this rank's logits go */
    fso_zero_step st;
    double loss_sum;             /* the step's summed per-position losses (after sync) */
    double *grad_sq;             /* [block] squared norm of the rank's gradient shard; the
                                    optimizer thread reads block b's once its job is posted
                                    (opt.mu orders them) */
    errsink err;                 /* the compute thread's failure */
} rank_compute;

/* Where a device's step time went (zero_source.c): the step line's compute
 * and the re-plan's per-block timings. Compute; the caller reads block_ms
 * between steps. */
typedef struct rank_clock {
    double wait_ms;              /* this step: compute inside params() and grads_done() */
    double *block_ms;            /* [block] this step: computing on the block */
    int cur_block;               /* the block compute is on now, -1 none */
    double t_mark;               /* when the last callback returned */
} rank_clock;

/* Devices whose memory is this process's (CPU devices) gather and reduce
 * in that memory, without the collective (zero_source.c). Gathers: the
 * 2 * world windows of every device are one pool, the devices' lend i (the
 * same block on every device) is in window i % n, and each device writes
 * only its own shard there: the block is gathered once, one shard copied
 * per device instead of world. Reduce-scatters: each device posts its
 * full-block gradients and sums its shard of everyone's, taking the
 * shard's norm in the same pass (fso_host_reduce_sqnorm); a device's
 * gradient buffer is used again once every device has read it. */
typedef struct shared_coll {
    bool on;                     /* setup */
    int n;                       /* setup: windows in the pool */
    zr_mutex mu;                 /* the arrays' entries below */
    pthread_cond_t cv;           /* any entry moved: every wait for placed, released,
                                    rs_posted or rs_read is on it */
    int64_t *placed, *released;  /* mu: [window * world + device]: the lend whose shard the
                                    device last wrote into the window, the last it released
                                    there; -1 none */
    const float **rs_src;        /* mu: [device * 2 + reduce % 2]: the gradients it posted */
    int64_t *rs_posted, *rs_read; /* mu: [device]: its last reduce posted, and the last whose
                                    gradients it has finished reading; -1 none */
} shared_coll;

fso_block_source zr_rank_source(rank_state *rk);
/* Before a micro-batch: nothing lent, the prefetch order from its start. */
void zr_source_reset(rank_state *rk);
/* Gathers and reduce-scatters in the devices' shared memory when their
 * memory is this process's and there are several (shared_coll); free it. */
int zr_shared_coll_init(fso_zero *z);
void zr_shared_coll_free(fso_zero *z);
/* No device holds a shared window, whatever lends came before: the pool
 * in use again after the parameters were lent in place (a re-plan moved
 * them off the devices). */
void zr_windows_reset(fso_zero *z);
/* The optimizer thread, once it has updated a block for step `step`: the
 * reads of the parameter blocks compute needs next that waited for it
 * start now, not at compute's next params(). */
void zr_prefetch_kick(rank_state *rk, int64_t step);
/* The gradient shard on its way down lands in its tier (if any). */
void zr_grads_land(rank_state *rk);
/* Compute since the last callback belongs to the block lent last. */
void zr_clock_in(rank_state *rk, double now);

#endif
