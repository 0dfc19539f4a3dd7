/* zero_impl.h — private to engine/zero*.c: the per-device state of the
 * sharded trainer and what its parts share. Each part is one file:
 *   zero.c         setup: budgets, per-device allocation, stores, collectives,
 *                  initial values; teardown; what reports read
 *   zero_arena.c   the host arena
 *   zero_io.c      staging slots, the NVMe store, device copies
 *   zero_shard.c   where each shard lives, and moving its data
 *   zero_source.c  the block source lent to the model
 *   zero_step.c    the step, the devices' threads
 *   zero_optim.c   the optimizer and its schedules
 *   zero_hf.c      whole-model copies in Hugging Face's layout
 *   zero_retier.c  moving state between tiers while training
 *   zero_save.c    streaming the state out (checkpoints) and in */
#ifndef FSO_ZERO_IMPL_H
#define FSO_ZERO_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "adamw.h"
#include "footprint.h"
#include "zero.h"

/* A host staging buffer for one shard and the I/O outstanding on it. */
typedef struct slot {
    void *buf;           /* host, 4 KiB aligned: a shard or a chunk of one, in its kind's
                            element type (fso_zero.elem_bytes) */
    int pending;         /* requests in flight */
    int err;             /* first failure, negative errno */
    int block;           /* what it holds (param ring), -1 none */
    int64_t lend;        /* param ring, shared windows: the read went straight into this
                            device's part of the window of this lend (src_params), not
                            into buf; -1 none */
    uint64_t copied;     /* the backend's mark after the last copy out of it, 0 none */
} slot;

typedef struct loc {
    fso_tier tier;
    void *ptr;           /* DEVICE: the rank's device buffer; HOST: in the arena */
    uint64_t off;        /* NVME: byte offset in the rank's store */
} loc;

/* A gradient shard on its way from the device to its host or NVMe tier. */
typedef struct grad_pending {
    int block;           /* -1: none */
    int buf;             /* rank_state.gdown[buf] */
    uint64_t mark;       /* the backend's mark after the copy, 0 none */
    int micro;
    bool last;           /* the step's last micro-batch */
} grad_pending;

/* Where a thread records its first failure. */
typedef struct errsink {
    int rc;
    char msg[512];
} errsink;

/* One job for the optimizer thread: the update of step as.t, over every
 * block in forward order (block -1) or over one block. */
typedef struct opt_job {
    fso_adamw_step as;
    int block;           /* -1: every block */
    uint64_t after;      /* the backend's mark when posted: the gradients (and a block's
                            norm) are complete at it; 0 none */
} opt_job;

#define OPT_QUEUE 256

/* A device's compute side (zero_source.c, zero_step.c): the full-block
 * buffers the model reads and writes on the device, where the micro-step
 * is, and the step's inputs and results. */
typedef struct rank_compute {
    void *gather[2];             /* gathered parameters (max_padded) in their working type
                                    (bf16 or fp32), what the model reads */
    int gather_block[2], gather_refs[2];
    int64_t gather_lend[2];      /* shared windows: the lend each holds (shared_coll) */
    int64_t lends;               /* params() calls so far: the same sequence on every device */
    uint64_t gather_free[2];     /* backend mark: compute done with gather[g] (0: assume not) */
    float *grad_full[2];         /* full-block gradients (max_padded), reduce-scattered */
    int grad_full_block[2];
    int64_t grad_reduce[2];      /* shared reduces: the reduce that last read grad_full[g] */
    int64_t reduces;             /* grads_done() calls so far: the same on every device */
    int order_pos;               /* position in z->order of the next params() */
    int64_t pass_lend;           /* lends at the pass's start: with parameters on NVMe, order
                                    position i is lend pass_lend + i (under io.pf_mu) */
    int micro;                   /* micro-batch index within the step */
    const int32_t *inputs, *targets;
    float *logits;               /* forward_logits: where this rank's logits go */
    fso_zero_step st;
    double loss_sum;             /* the step's summed per-position losses (after sync) */
    double *grad_sq;             /* [block] squared norm of the rank's gradient shard */
    errsink err;                 /* the compute thread's failure */
} rank_compute;

/* A device's host staging and NVMe store (zero_io.c, zero_source.c). */
typedef struct rank_io {
    fso_store *store;            /* NULL: no state on NVMe */
    uint64_t nvme_end;           /* end of the store's extents in use */
    pthread_mutex_t mu;          /* the store's ring, shared with the optimizer thread */
    pthread_mutex_t pf_mu;       /* the prefetch ring's blocks and compute.order_pos: the
                                    optimizer thread starts reads too (zr_prefetch_kick) */
    slot prefetch[FSO_FP_MAX_PARAM_SLOTS]; /* parameter prefetch ring */
    int n_prefetch;              /* in use: prefetch + 2 when parameters are on NVMe */
    int n_prefetch_bufs;         /* with a buffer (a re-plan may use fewer) */
    slot grad_trip;              /* a gradient shard's round trip; whole-model copies */
    slot grad_down[2];           /* gradient shards copied down from the device; no buffers
                                    where none land (fso_fp_landing_needed) */
    grad_pending landing;        /* the block whose shard is on its way down (block -1 none) */
} rank_io;

/* A device's optimizer (zero_optim.c): its thread and job queue, the chunk
 * buffers it streams state through, and what it measured. */
typedef struct rank_optim {
    struct fso_optpool *pool;
    slot chunk[FSO_FP_MAX_CHUNK_SETS][FSO_N_KINDS]; /* a ring of chunk buffer sets: read ahead,
                                    updated, written behind */
    int n_sets;                  /* sets in the ring (fso_fp_buffers chunk_sets) */
    size_t chunk_elems;
    uint64_t after;              /* the running job's mark: its device copies wait for that
                                    work only, not for compute queued since */
    pthread_t tid;
    bool started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    opt_job queue[OPT_QUEUE];
    int head, tail;
    int busy;                    /* a job is running */
    int64_t *ready;              /* [block] the step whose parameters the block holds */
    int64_t *rest;               /* [block] the step whose update of the block has landed:
                                    master, m and v written wherever they live (with the
                                    update on the device: queued before ready_mark) */
    uint64_t *ready_mark;        /* [block] the backend's mark after its update was queued
                                    (a device-side update; 0: done when ready) */
    errsink err;                 /* the optimizer's failure */
    double busy_ms;              /* time spent updating, since the last report */
    uint64_t read_kind[FSO_N_KINDS], write_kind[FSO_N_KINDS]; /* NVMe, since the last report */
    fso_adamw_step bwd_step;     /* this step's update, for the backward schedule */
} rank_optim;

/* Where a device's step time went (zero_source.c): the step line's compute
 * and the re-plan's per-block timings. */
typedef struct rank_clock {
    double wait_ms;              /* this step: compute inside params() and grads_done() */
    double *block_ms;            /* [block] this step: computing on the block */
    int cur_block;               /* the block compute is on now, -1 none */
    double t_mark;               /* when the last callback returned */
} rank_clock;

/* One device of the trainer. */
typedef struct rank_state {
    int rank;
    int numa;                    /* the node this device's threads and host state use, -1 any */
    struct fso_zero *z;
    fso_backend *be;
    fso_model model;
    loc *locs;                   /* [block * FSO_N_KINDS + kind]: where each shard lives */
    bool sync_init;              /* the mutexes of io and opt exist */
    rank_compute compute;
    rank_io io;
    rank_optim opt;
    rank_clock clock;
} rank_state;

/* The host arena (zero_arena.c): `reserve` bytes of address space reserved
 * at start (nothing committed), of which [0, bytes) is usable (committed,
 * locked or registered with CUDA as asked) and [0, used) handed out. A
 * re-plan that moves state to the host grows `bytes` in place, so pointers
 * into it stay valid. */
typedef struct host_arena {
    void *base;
    size_t reserve, bytes, used;
    int n_pinned;                /* CUDA registrations: [pinned_at[i], pinned_at[i+1]) */
    size_t pinned_at[17];
    bool locked;                 /* [0, bytes) mlock'ed */
    char pin_refused[512];       /* why pinning was refused, and the fix; "" when it was not */
} host_arena;

/* The threads of devices 1..world-1, started once (device 0 runs on the
 * caller's thread): run_ranks hands each the same job and waits (zero_step.c). */
typedef struct rank_threads {
    pthread_t workers[FSO_MAX_DEVICES];
    int n_workers;
    pthread_mutex_t mu;
    pthread_cond_t run_cv, done_cv;
    bool init;
    void *(*job)(void *);
    uint64_t gen;
    int left;
    bool quit;
    bool caller_bound;           /* device 0's node applied to the caller's thread */
} rank_threads;

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
    bool on;
    int n;                       /* windows in the pool */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t *placed, *released;  /* [window * world + device]: the lend whose shard the device
                                    last wrote into the window, the last it released there;
                                    -1 none */
    const float **rs_src;        /* [device * 2 + reduce % 2]: the gradients it posted */
    int64_t *rs_posted, *rs_read; /* [device]: its last reduce posted, and the last whose
                                    gradients it has finished reading; -1 none */
} shared_coll;

/* CPU devices' parameters in memory (device tier or host arena): one
 * buffer per block and tier, the devices' shards its parts in rank order
 * (the gathered layout), lent to every device as it is (zero_shard.c
 * zr_block_shared). A re-plan between the two tiers holds both. */
typedef struct lent_block {
    void *base;                  /* NULL: none */
    size_t bytes;
    int refs;                    /* devices whose shard is placed there */
} lent_block;

/* The save in progress (zero_save.c): the state of step `step` streams
 * out block by block while training goes on; an update of a later step
 * waits until the saver is done with its block. */
typedef struct save_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool init;
    bool active;                 /* armed, and not every block is done */
    int64_t step;
    bool *done;                  /* [block] streamed out: a later update may change it */
    double *waited_ms;           /* [rank] updates waited for the saver, this save */
    double idle_waited_ms;       /* a re-plan waited for this save to stream out */
} save_gate;

struct fso_zero {
    const fso_config *cfg;
    int world, n_blocks;
    fso_block_layout *blocks;
    size_t max_padded, max_shard; /* elements */
    fso_fp_rules rules;          /* the footprint's rules (footprint.h): what is allocated
                                    and moved follows from them */
    size_t elem_bytes[FSO_N_KINDS]; /* per kind, the rules' (fso_fp_elem_bytes): 2 for bf16
                                     working parameters (bf16.enabled), else 4 (fp32) */
    fso_tier tier[FSO_N_KINDS];
    int state_host_blocks;       /* blocks below it keep NVMe kinds of optimizer state on the
                                    host (zr_block_tier) */
    bool lend_in_place;          /* parameters are lent where they live, no gather: on the
                                    only device, its shard; CPU devices, parameters in memory,
                                    the block's buffer their shards are parts of (lent) */
    lent_block *lent;            /* [block * FSO_N_TIERS + tier] */
    int prefetch;                /* blocks read ahead (train.prefetch_blocks, or the plan's) */
    int *order;                  /* blocks in the order params() asks for them */
    int n_order;
    int64_t step;                /* optimizer steps taken (AdamW t) */
    const fso_adamw_kernel *adamw; /* the widest AdamW kernel this CPU runs */
    bool cuda;                   /* devices are CUDA GPUs */
    fso_coll *coll;
    rank_state *ranks;
    host_arena arena;
    struct fso_topo *topo;       /* this machine, when it has more than one NUMA node */
    rank_threads threads;
    save_gate save;
    shared_coll sc;
};


/* The tier of block b's shards of kind k (config.h fso_offload_block_tier). */
static inline fso_tier zr_block_tier(const fso_zero *z, int b, fso_kind k)
{
    return fso_block_tier_rule(z->tier[k], k, b, z->state_host_blocks);
}

/* zero_arena.c: the host arena */
/* Reserve `reserve` bytes of address space and make [0, bytes) usable.
 * 0 or -ENOMEM with err. */
int zr_arena_init(fso_zero *z, size_t reserve, size_t bytes, char *err, size_t errlen);
/* Make [0, bytes) usable: commit the new part, lock or register it with
 * CUDA as the configuration asks (a refusal is one warning and pageable
 * memory), and tell the NVMe stores. 0 or -ENOMEM with err. */
int zr_arena_grow(fso_zero *z, size_t bytes, char *err, size_t errlen);
/* Give back the pages of [p, p+bytes) (state that moved elsewhere). */
void zr_arena_release(fso_zero *z, void *p, size_t bytes);
/* Host memory for device rk's state, on its NUMA node when the machine has
 * several (best effort); aborts past the usable part (a sizing bug). */
void *zr_rank_take(rank_state *rk, size_t bytes);
/* Unregister and unmap the whole arena. */
void zr_arena_free(fso_zero *z);

/* zero_io.c: staging slots, the NVMe store, device copies */
/* Record the thread's first failure in es (printf-style); returns rc. */
int zr_fail(errsink *es, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Queue one read or write of `bytes` at `off` of the rank's store on slot s. */
int zr_queue_io(rank_state *rk, errsink *es, slot *s, bool write, void *buf, size_t bytes,
                uint64_t off);
/* A mark of everything queued on be so far (0 where ops finish as they
 * return); a mark of the copies only (backend.h mark_copies, else a full
 * one); staging copies either way, ordered after mark `after`. */
uint64_t zr_mark(fso_backend *be);
uint64_t zr_mark_copies(fso_backend *be);
void zr_copy_in(fso_backend *be, void *dst, const void *src, size_t bytes, uint64_t after);
void zr_copy_out(fso_backend *be, void *dst, const void *src, size_t bytes, uint64_t after);
/* The slot's last device copy is done (its buffer may be reused). */
void zr_copies_wait(rank_state *rk, slot *s);
/* Wait for the slot's I/O and device copies; an error is final for the step. */
int zr_slot_wait(rank_state *rk, errsink *es, slot *s, const char *what, int block);
/* Drain the I/O this thread left in flight after a failure so its buffers
 * can be reused (with_optimizer: the optimizer's too, once it has stopped). */
void zr_drain_slots(rank_state *rk, bool with_optimizer);
/* Device rk's NVMe store over the folders o names, `capacity` bytes, its
 * buffers registered over the arena. 0 or negative errno with err. */
int zr_open_store(fso_zero *z, rank_state *rk, const fso_offload_config *o,
                  uint64_t capacity, char *err, size_t errlen);

/* zero_shard.c: where each shard lives */
size_t zr_shard_elems(const fso_zero *z, int b);
/* Bytes a shard of kind k of block b takes on its tier: whole pages. */
size_t zr_shard_bytes(const fso_zero *z, int b, fso_kind k);
loc *zr_locate(rank_state *rk, int b, fso_kind k);
/* A place for shard (b, k) of device rk on `tier`: device memory, host
 * memory from the arena, or the extent at *nvme_off of its store (*nvme_off
 * advances). 0, or negative errno with err (device memory short). */
int zr_place_shard(rank_state *rk, int b, fso_kind k, fso_tier tier, uint64_t *nvme_off,
                   loc *out, char *err, size_t errlen);
/* Whether shards of kind k on `tier` are parts of a block's shared buffer
 * (lent_block): parameters lent in place on more than one device. */
bool zr_block_shared(const fso_zero *z, fso_kind k, fso_tier tier);
/* Block b's shared buffer on `tier`. */
lent_block *zr_lent(fso_zero *z, int b, fso_tier tier);
/* Let go of the place l of shard (b, k); an NVMe extent stays the store's. */
void zr_release_shard(rank_state *rk, int b, fso_kind k, loc *l);
/* Move elements [c0, c0+n) of shard (b, k) between its tier and host
 * memory, in the kind's element type (elem_bytes[k] each). Reading, *ptr is
 * set to the data: in the shard itself when in_place and the CPU can
 * address it, else s->buf (filled; NVMe: once s's I/O is waited for).
 * Writing, *ptr's data goes into the shard (NVMe: asynchronously on s).
 * The bytes the drive moves are added to bytes_done[k]. */
int zr_xfer(rank_state *rk, errsink *es, uint64_t *bytes_done, int b, fso_kind k,
            size_t c0, size_t n, slot *s, bool write, bool in_place, void **ptr);
/* Where a writer of elements [c0, ...) of shard (b, k) should put them so
 * that zr_xfer(write) moves them once: the shard itself when in_place
 * and the CPU can address it, else s->buf. */
void *zr_xfer_dest(rank_state *rk, int b, fso_kind k, size_t c0, slot *s, bool in_place);
/* Whole shard (b, k) read into dst instead of s->buf (4 KiB aligned, the
 * shard's whole pages: zr_shard_bytes); s tracks the I/O. */
int zr_shard_read_to(rank_state *rk, errsink *es, uint64_t *bytes_done, int b, fso_kind k,
                     slot *s, void *dst);
/* Whole shard (b, k) into s->buf, and back (the compute thread). */
int zr_shard_fetch(rank_state *rk, int b, fso_kind k, slot *s);
int zr_shard_store(rank_state *rk, int b, fso_kind k, slot *s);
/* Kind k of block b on every device from (dir 0) or to (dir 1) the flat
 * fp32 host buffer (padded_elems), converting to and from the kind's
 * element type; on the caller's thread, synchronously. */
int zr_block_xfer(fso_zero *z, int b, float *flat, fso_kind k, int dir);

/* zero_source.c: the block source */
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

/* zero_step.c: the devices' threads */
/* Run fn on every device, device 0 on the caller's thread, and wait; the
 * first failure (another device's before -ECANCELED). */
int zr_run_ranks(fso_zero *z, void *(*fn)(void *));
int zr_start_workers(fso_zero *z, char *err, size_t errlen);
void zr_stop_workers(fso_zero *z);
/* The first device's failure message into err (one that caused the others'). */
void zr_first_error(const fso_zero *z, char *err, size_t errlen);

/* zero_save.c */
/* Before an update of step t changes block b on device rk: wait while a
 * save of an earlier step still needs the block. */
void zr_save_gate(rank_state *rk, int b, int64_t t);
/* Wait until no save is streaming (before state moves between tiers). */
void zr_save_wait_idle(fso_zero *z);
int zr_save_init(fso_zero *z);
void zr_save_free(fso_zero *z);

/* zero_optim.c */
int zr_optim_start(rank_state *rk);      /* the device's optimizer thread */
void zr_optim_stop(rank_state *rk);
/* Hand the update of step `t` to the optimizer thread: whole step (blocks in
 * forward order), or one block (the backward schedule). */
void zr_optim_post_step(rank_state *rk, const fso_adamw_step *as);
void zr_optim_post_block(rank_state *rk, const fso_adamw_step *as, int block);
/* Wait until block b holds the parameters of step `step` (counting from 1,
 * 0 = initial); returns 0 or the optimizer's error. Time waited goes to
 * rk->compute.st.optimizer_exposed_ms. */
int zr_optim_wait_block(rank_state *rk, int b, int64_t step);
/* The same for every other device's update of block b (a block lent from
 * the buffer the devices share): the time is rk's exposed optimizer time,
 * a failure there fails rk's step. */
int zr_optim_wait_peers(rank_state *rk, int b, int64_t step);
/* Wait until every posted update is done. */
int zr_optim_wait_all(rank_state *rk);
/* The serialized schedule: update every block now, on this thread. */
int zr_optim_run(rank_state *rk, const fso_adamw_step *as);

#endif
