/* zero_impl.h — private to engine/zero*.c: the per-device state of the
 * sharded trainer and the I/O helpers its parts share. */
#ifndef FSO_ZERO_IMPL_H
#define FSO_ZERO_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "adamw.h"
#include "zero.h"

#define STAGE_ALIGN 4096
#define MAX_PARAM_SLOTS 18 /* prefetch ring: up to 16 blocks ahead */

/* A host staging buffer for one shard and the I/O outstanding on it. */
typedef struct slot {
    void *buf;           /* host, 4 KiB aligned: a shard or a chunk of one, in its kind's
                            element type (fso_zero.elem_bytes) */
    int pending;         /* requests in flight */
    int err;             /* first failure, negative errno */
    int block;           /* what it holds (param ring), -1 none */
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

typedef struct rank_state {
    int rank;
    int numa;                    /* the node this device's threads and host state use, -1 any */
    struct fso_zero *z;
    fso_backend *be;
    fso_model model;
    fso_store *store;
    uint64_t nvme_end;           /* end of the store's extents in use */
    loc *locs;                   /* [block * FSO_N_KINDS + kind] */
    /* device buffers */
    void *gbuf[2];               /* gathered parameters (max_padded) in their working type
                                    (bf16 or fp32), what the model reads */
    int gbuf_block[2], gbuf_refs[2];
    uint64_t gbuf_free[2];       /* backend mark: compute done with gbuf[g] (0: assume not) */
    float *gradbuf[2];           /* full-block gradients (max_padded) */
    int gradbuf_block[2];
    /* host staging */
    slot pslots[MAX_PARAM_SLOTS];/* parameter prefetch ring */
    int n_pslots;                /* in use: prefetch + 2 when parameters are on NVMe */
    int n_pslots_buf;            /* with a buffer (a re-plan may use fewer) */
    slot gslot;                  /* gradient shard round trips */
    int order_pos;               /* position in z->order of the next params() */
    int micro;                   /* micro-batch index within the step */
    /* per-step inputs and outputs */
    const int32_t *inputs, *targets;
    float *logits;               /* forward_logits: where this rank's logits go */
    fso_zero_step st;
    double loss_sum;              /* the step's summed per-position losses (after sync) */
    double wait_ms;              /* this step: compute inside params() and grads_done() */
    double *block_ms;            /* [block] this step: computing on the block (zero.c timing) */
    int cur_block;               /* the block compute is on now, -1 none */
    double t_mark;               /* when the last callback returned */
    errsink ce;                  /* the compute thread's failure */
    bool sync_init;              /* the mutexes below exist */
    pthread_mutex_t io_mu;       /* the store's ring, shared with the optimizer thread */
    /* the optimizer (zero_optim.c) */
    struct fso_optpool *opt_pool;
    slot ochunk[2][FSO_N_KINDS]; /* chunk buffers: read ahead, write behind */
    uint64_t opt_after;          /* the running job's mark: its device copies wait for that
                                    work only, not for compute queued since */
    size_t chunk_elems;
    slot gdown[2];               /* gradient shards copied down from the device */
    grad_pending gpend;          /* the block whose shard is on its way down (block -1 none) */
    double *block_sq;            /* [block] squared norm of the gradient shard */
    pthread_t opt_tid;
    bool opt_started, opt_stop;
    pthread_mutex_t opt_mu;
    pthread_cond_t opt_cv;
    opt_job queue[OPT_QUEUE];
    int q_head, q_tail;
    int busy;                    /* a job is running */
    int64_t *ready;              /* [block] the step whose parameters the block holds */
    uint64_t *ready_mark;        /* [block] the backend's mark after its update was queued
                                    (a device-side update; 0: done when ready) */
    errsink oe;                  /* the optimizer's failure */
    double opt_busy_ms;          /* time spent updating, since the last report */
    uint64_t opt_read_bytes, opt_write_bytes; /* NVMe, since the last report */
    fso_adamw_step bwd_as;       /* this step's update, for the backward schedule */
} rank_state;

struct fso_zero {
    const fso_config *cfg;
    int world, n_blocks;
    fso_block_layout *blocks;
    size_t max_padded, max_shard; /* elements */
    size_t elem_bytes[FSO_N_KINDS]; /* per kind: 2 for bf16 working parameters
                                     (bf16.enabled), else 4 (fp32) */
    fso_coll *coll;
    rank_state *ranks;
    fso_tier tier[FSO_N_KINDS];
    bool alias_params;           /* world 1, parameters on the device: lend the shard itself */
    /* The host arena: `arena_reserve` bytes of address space reserved at
     * start (nothing committed), of which [0, arena_bytes) is usable
     * (committed, locked or registered with CUDA as asked) and
     * [0, arena_used) handed out. A re-plan that moves state to the host
     * grows arena_bytes in place, so pointers into it stay valid. */
    void *arena;
    size_t arena_reserve, arena_bytes, arena_used;
    int n_pinned;                /* CUDA registrations: [pinned_at[i], pinned_at[i+1]) */
    size_t pinned_at[17];
    bool arena_locked;           /* [0, arena_bytes) mlock'ed */
    char pin_refused[512];       /* why pinning the arena was refused, and the fix; "" not */
    struct fso_topo *topo;       /* this machine, when it has more than one NUMA node */
    /* The threads of devices 1..world-1, started once (device 0 runs on the
     * caller's thread): run_ranks hands each the same job and waits. */
    pthread_t workers[64];
    int n_workers;
    pthread_mutex_t run_mu;
    pthread_cond_t run_cv, done_cv;
    bool run_init;
    void *(*job)(void *);
    uint64_t job_gen;
    int job_left;
    bool quit;
    bool caller_bound;           /* device 0's node applied to the caller's thread */
    int *order;                  /* blocks in the order params() asks for them */
    int n_order;
    int64_t step;                /* optimizer steps taken (AdamW t) */
    int prefetch;                /* blocks read ahead (train.prefetch_blocks, or the plan's) */
    const fso_adamw_kernel *adamw; /* the widest AdamW kernel this CPU runs */
    bool cuda;                   /* devices are CUDA GPUs */
};


/* zero.c */
size_t fso_zero_shard_elems(const fso_zero *z, int b);
loc *fso_zero_locate(rank_state *rk, int b, fso_kind k);
int fso_zero_fail(errsink *es, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Queue one read or write of `bytes` at `off` of the rank's store on slot s. */
int fso_zero_queue_io(rank_state *rk, errsink *es, slot *s, bool write, void *buf, size_t bytes,
                      uint64_t off);
/* Move elements [c0, c0+n) of shard (b, k) between its tier and host
 * memory, in the kind's element type (elem_bytes[k] each). Reading, *ptr is
 * set to the data: in the shard itself when in_place and the CPU can
 * address it, else s->buf (filled; NVMe: once s's I/O is waited for).
 * Writing, *ptr's data goes into the shard (NVMe: asynchronously on s).
 * NVMe bytes are added to *bytes_done. */
int fso_zero_xfer(rank_state *rk, errsink *es, uint64_t *bytes_done, int b, fso_kind k,
                  size_t c0, size_t n, slot *s, bool write, bool in_place, void **ptr);
/* Where a writer of elements [c0, ...) of shard (b, k) should put them so
 * that fso_zero_xfer(write) moves them once: the shard itself when in_place
 * and the CPU can address it, else s->buf. */
void *fso_zero_xfer_dest(rank_state *rk, int b, fso_kind k, size_t c0, slot *s, bool in_place);
/* Wait for the slot's I/O; an error is final for the step. */
int fso_zero_slot_wait(rank_state *rk, errsink *es, slot *s, const char *what, int block);
extern const char *const fso_zero_kind_names[FSO_N_KINDS];

/* zero_optim.c */
int fso_zero_optim_start(rank_state *rk);      /* the device's optimizer thread */
void fso_zero_optim_stop(rank_state *rk);
/* Hand the update of step `t` to the optimizer thread: whole step (blocks in
 * forward order), or one block (the backward schedule). */
void fso_zero_optim_post_step(rank_state *rk, const fso_adamw_step *as);
void fso_zero_optim_post_block(rank_state *rk, const fso_adamw_step *as, int block);
/* Wait until block b holds the parameters of step `step` (counting from 1,
 * 0 = initial); returns 0 or the optimizer's error. Time waited goes to
 * rk->st.optimizer_exposed_ms. */
int fso_zero_optim_wait_block(rank_state *rk, int b, int64_t step);
/* Wait until every posted update is done. */
int fso_zero_optim_wait_all(rank_state *rk);
/* The serialized schedule: update every block now, on this thread. */
int fso_zero_optim_run(rank_state *rk, const fso_adamw_step *as);

#endif
