/* zero_optim.h — private to engine/zero*.c (through zero_impl.h): a
 * device's optimizer (zero_optim.c): its thread and job queue, the chunk
 * buffers it streams state through, which step each block holds, and what
 * it measured. "The updater" is whichever thread runs the device's update:
 * its optimizer thread on the overlapped schedules, its compute thread on
 * train.optimizer_overlap "none". Ownership words are zero_impl.h's. */
#ifndef FSO_ZERO_OPTIM_H
#define FSO_ZERO_OPTIM_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "adamw.h"
#include "footprint.h"
#include "zero_io.h"
#include "zero_lock.h"

/* One job for the optimizer thread: the update of step as.t, over every
 * block in forward order (block -1) or over one block. */
typedef struct opt_job {
    fso_adamw_step as;
    int block;           /* -1: every block */
    uint64_t after;      /* the backend's mark when posted: the gradients (and a block's
                            norm) are complete at it; 0 none */
} opt_job;

#define OPT_QUEUE 256

typedef struct rank_optim {
    struct fso_optpool *pool;    /* setup; the updater runs its kernels on it */
    slot chunk[FSO_FP_MAX_CHUNK_SETS][FSO_N_KINDS]; /* the updater: a ring of chunk buffer
                                    sets, read ahead, updated, written behind (pending and err
                                    under io.mu) */
    int n_sets;                  /* setup: sets in the ring (fso_fp_buffers chunk_sets) */
    size_t chunk_elems;          /* setup */
    uint64_t after;              /* the updater: the running job's mark; its device copies
                                    wait for that work only, not for compute queued since */
    pthread_t tid;               /* setup */
    bool started;                /* setup */
    bool stop;                   /* mu */
    zr_mutex mu;                 /* the queue, which step each block holds, busy_ms */
    pthread_cond_t cv;           /* any of them moved: the optimizer thread waits for a job
                                    or stop, post for room in the queue, compute for a block's
                                    step (ready) or an empty queue, the saver for rest */
    opt_job queue[OPT_QUEUE];    /* mu */
    int head, tail;              /* mu */
    int64_t *ready;              /* mu: [block] the step whose parameters the block holds */
    int64_t *rest;               /* mu: [block] the step whose update of the block has landed:
                                    master, m and v written wherever they live (with the
                                    update on the device: queued before ready_mark) */
    uint64_t *ready_mark;        /* the updater writes block b's before b is marked ready (or
                                    landed), and readers read it after seeing that under mu:
                                    the backend's mark after its update was queued (a
                                    device-side update; 0: done when ready) */
    slot *unmarked[FSO_FP_MAX_CHUNK_SETS * FSO_N_KINDS]; /* the updater: chunk slots whose
                                    device copies are queued and not yet marked (copied
                                    ZR_MARK_LATER); one mark covers them all (zr_marks_take) */
    int n_unmarked;              /* the updater */
    errsink err;                 /* the updater: the optimizer's failure (rc read elsewhere
                                    with fso_first_error_rc) */
    double busy_ms;              /* mu while an optimizer thread runs (none: compute): time
                                    spent updating, since the last report */
    uint64_t read_kind[FSO_N_KINDS], write_kind[FSO_N_KINDS]; /* atomic: NVMe, since the last
                                    report (the updater and the prefetch kick add, compute
                                    takes them) */
    fso_adamw_step bwd_step;     /* compute: this step's update, for the backward schedule
                                    (copied into each job posted) */
} rank_optim;

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
