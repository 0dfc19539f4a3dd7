/* zero_impl.h — private to engine/zero*.c: the sharded trainer's
 * per-device state and what its parts share. Each part is one file, and
 * the state and functions other parts use are in its header:
 *   zero.c         setup: budgets, per-device allocation, stores, collectives,
 *                  initial values; teardown; what reports read
 *   zero_arena.c   the host arena                          (zero_arena.h)
 *   zero_io.c      staging slots, the NVMe store, device copies (zero_io.h)
 *   zero_shard.c   where each shard lives, and moving its data (zero_shard.h)
 *   zero_source.c  the block source lent to the model      (zero_source.h)
 *   zero_step.c    the step, the devices' threads          (zero_step.h)
 *   zero_optim.c   the optimizer and its schedules         (zero_optim.h)
 *   zero_hf.c      whole-model copies in Hugging Face's layout
 *   zero_retier.c  moving state between tiers while training
 *   zero_save.c    streaming the state out (checkpoints) and in (zero_save.h)
 *   zero_bytes.c   a configuration's footprint (public only: zero.h)
 *   zero_lock.c    the six mutexes, their order, its check   (zero_lock.h)
 *   zero_rail.c    several boxes: the rails' reduce-scatter, norm and
 *                  all-gather, and the master's slices      (zero_rail.h)
 * Every file of the trainer includes this one, which includes the part
 * headers. Private functions are named zr_*; the trainer's public ones are
 * zero.h's fso_zero_*.
 *
 * Who may touch a field (ARCHITECTURE.md, "Threads and locks"), as the
 * comments on the fields say it:
 *   setup     written by fso_zero_create, fso_zero_destroy or a re-plan
 *             (fso_zero_retier: between steps, every update finished, no
 *             save streaming), on the caller's thread; read-only otherwise
 *   compute   the device's compute thread during a job (device 0: the
 *             caller's thread; the others: its worker), the caller's thread
 *             between jobs (zr_run_ranks orders the two)
 *   updater   whichever thread runs the device's update (zero_optim.h)
 *   a lock    written (and read by other threads) only with it held:
 *             io.mu, io.pf_mu, opt.mu, sc.mu, save.mu, threads.mu, taken
 *             in zero_lock.h's order */
#ifndef FSO_ZERO_IMPL_H
#define FSO_ZERO_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "adamw.h"
#include "footprint.h"
#include "zero.h"
#include "zero_arena.h"
#include "zero_io.h"
#include "zero_optim.h"
#include "zero_rail.h"
#include "zero_save.h"
#include "zero_shard.h"
#include "zero_source.h"
#include "zero_step.h"

/* One device of the trainer. */
struct rank_state {
    int rank;                    /* setup */
    int numa;                    /* setup: the node this device's threads and host state use,
                                    -1 any */
    struct fso_zero *z;          /* setup */
    fso_backend *be;             /* setup; its ops are called from the device's compute and
                                    optimizer threads and the saver (backend.h) */
    fso_model model;             /* setup; compute runs it */
    zr_pinned acts_host;         /* setup: the model's kept inputs on the host tier (model.h
                                    fso_model_opts.host_acts), pinned on GPUs */
    loc *locs;                   /* setup: [block * FSO_N_KINDS + kind]: where each shard
                                    lives */
    bool sync_init;              /* setup: the mutexes of io and opt exist */
    rank_rail rail;              /* several boxes (zero_rail.h) */
    rank_compute compute;
    rank_io io;
    rank_optim opt;
    rank_clock clock;
};

struct fso_zero {
    const fso_config *cfg;       /* setup, like every field down to `step` */
    int world, n_blocks;
    fso_block_layout *blocks;
    size_t max_padded, max_shard; /* elements */
    fso_fp_rules rules;          /* the footprint's rules (footprint.h): what is allocated
                                    and moved follows from them */
    size_t elem_bytes[FSO_N_KINDS]; /* per kind, the rules' (fso_fp_elem_bytes): 2 for bf16
                                     working parameters (bf16.enabled), else 4 (fp32) */
    fso_tier tier[FSO_N_KINDS];  /* each kind's tier for the blocks the rule's counts leave
                                    (the streamed parameters', the host state's) */
    fso_block_rule rule;         /* where each block's shards live (state.h; zr_block_tier) */
    bool lend_in_place;          /* every block's parameters are lent where they live (no
                                    gather window; per block: zr_lends_in_place): on the only
                                    device, its shard; CPU devices, parameters in memory, the
                                    block's buffer their shards are parts of (lent) */
    lent_block *lent;            /* [block * FSO_N_TIERS + tier] */
    int prefetch;                /* blocks read ahead (train.prefetch_blocks, or the plan's) */
    int *order;                  /* blocks in the order params() asks for them */
    int n_order;
    const fso_adamw_kernel *adamw; /* the widest AdamW kernel this CPU runs */
    bool cuda;                   /* devices are CUDA GPUs */
    fso_coll *coll;              /* the compute threads' collectives (SPMD, coll.h) */
    int box, boxes;              /* this box of the run's (boxes.h); boxes 1: no rails */
    rank_state *ranks;
    struct fso_topo *topo;       /* this machine, when it has more than one NUMA node */
    int64_t step;                /* the caller's thread, between jobs: optimizer steps taken
                                    (AdamW t); the compute threads read it */
    host_arena arena;            /* setup (zero_arena.h) */
    rank_threads threads;        /* zero_step.h */
    save_gate save;              /* zero_save.h */
    shared_coll sc;              /* zero_source.h */
    zr_pinned batch;             /* zero_step.h zr_batch_pin: the caller's tokens, pinned */
};

/* The tier of block b's shards of kind k (state.h fso_block_tier). */
static inline fso_tier zr_block_tier(const fso_zero *z, int b, fso_kind k)
{
    return fso_block_tier(&z->rule, k, b);
}

#endif
