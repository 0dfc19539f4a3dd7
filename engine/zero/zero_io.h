/* zero_io.h — private to engine/zero*.c (through zero_impl.h): a device's
 * host staging slots and NVMe store, and moving a shard through a slot
 * (zero_io.c). A slot's requests go to the device's store, whose ring the
 * device's compute and optimizer threads and the checkpoint saver share
 * under io.mu; its device copies are ordered by the backend's marks.
 * Ownership words (setup, compute, updater) are zero_impl.h's. */
#ifndef FSO_ZERO_IO_H
#define FSO_ZERO_IO_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "footprint.h"
#include "zero.h"
#include "zero_lock.h"

typedef struct rank_state rank_state;

/* Where a thread records its first failure. One thread writes it (the
 * compute thread its rank_compute.err, the updater rank_optim.err, the
 * saver its own): msg first, then rc with a release store
 * (fso_first_errorv), so another thread reads rc with fso_first_error_rc
 * and then msg. */
typedef struct errsink {
    int rc;
    char msg[512];
} errsink;

/* A host staging buffer for one shard and the I/O outstanding on it. */
typedef struct slot {
    void *buf;           /* setup. Host, 4 KiB aligned: a shard or a chunk of one, in its
                            kind's element type (fso_zero.elem_bytes) */
    int pending;         /* io.mu: requests in flight (either thread reaps the other's) */
    int err;             /* io.mu: first failure, negative errno */
    int block;           /* io.pf_mu (param ring): what it holds, -1 none */
    int64_t lend;        /* io.pf_mu (param ring), shared windows: the read went straight into
                            this device's part of the window of this lend (src_params), not
                            into buf; -1 none */
    uint64_t copied;     /* the slot's user: the backend's mark after the last copy out of it,
                            0 none (param ring: under io.pf_mu, or the compute thread while
                            the slot holds the block it lends next, which no reader takes) */
} slot;

/* A gradient shard on its way from the device to its host or NVMe tier
 * (compute). */
typedef struct grad_pending {
    int block;           /* -1: none */
    int buf;             /* rank_io.grad_down[buf] */
    uint64_t mark;       /* the backend's mark after the copy, 0 none */
    int micro;
    bool last;           /* the step's last micro-batch */
} grad_pending;

/* A device's host staging and NVMe store (zero_io.c, zero_source.c). */
typedef struct rank_io {
    fso_store *store;            /* setup; its requests and completions under mu. NULL: no
                                    state on NVMe */
    uint64_t nvme_end;           /* setup: end of the store's extents in use */
    zr_mutex mu;                 /* the store's ring and every slot's pending and err: the
                                    compute and optimizer threads and the saver share it */
    zr_mutex pf_mu;              /* the prefetch ring's blocks and compute.order_pos: the
                                    optimizer thread starts reads too (zr_prefetch_kick) */
    slot prefetch[FSO_FP_MAX_PARAM_SLOTS]; /* parameter prefetch ring (fields: slot) */
    int n_prefetch;              /* setup: in use: prefetch + 2 when parameters are on NVMe */
    int n_prefetch_bufs;         /* setup: with a buffer (a re-plan may use fewer) */
    slot grad_trip;              /* compute: a gradient shard's round trip; whole-model
                                    copies; the other devices' parameter shards read from
                                    NVMe for whole-block copies (zero_source.c) */
    slot grad_down[2];           /* compute: gradient shards copied down from the device; no
                                    buffers where none land (fso_fp_landing_needed) */
    grad_pending landing;        /* compute: the block whose shard is on its way down (block
                                    -1 none) */
} rank_io;

/* A host buffer the engine copies to and from the devices, kept from use
 * to use and, for CUDA devices, pinned once (registered with the driver):
 * copies from pageable memory would stall their caller until the device
 * caught up. fso_io_alloc'd (aligned for O_DIRECT too). */
typedef struct zr_pinned {
    void *buf;                   /* NULL: none yet */
    size_t bytes;
    bool pinned;                 /* registered with the CUDA driver */
    bool warned;                 /* a refused pin was said once */
} zr_pinned;

/* At least `bytes` in p->buf (grown when smaller), pinned when `cuda`: a
 * refusal warns once, "WHAT are pageable, not pinned: REASON; COST", and
 * leaves it pageable. NULL when out of memory. */
void *zr_pinned_get(zr_pinned *p, size_t bytes, bool cuda, const char *what, const char *cost);
/* Unpinned and freed; p zeroed but for `warned`. NULL-safe on a zeroed p. */
void zr_pinned_free(zr_pinned *p);

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
/* The optimizer's device copies are marked in batches, not one mark per
 * chunk (the backend keeps a window of 1024 marks; a step at 7-13B moves
 * tens of thousands of chunks): a slot its copy left unmarked holds
 * ZR_MARK_LATER, and the first wait for any of them takes one mark for all
 * (zr_marks_take). */
#define ZR_MARK_LATER UINT64_MAX
/* s's copies are queued and to be covered by the next batch mark of rk's
 * optimizer (its thread, or the caller once it has stopped). */
void zr_marks_defer(rank_state *rk, slot *s);
/* One mark of the copies queued so far, given to every slot deferred. */
void zr_marks_take(rank_state *rk);
/* The slot's last device copy is done (its buffer may be reused). */
void zr_copies_wait(rank_state *rk, slot *s);
/* Wait for the slot's I/O and device copies; an error is final for the step. */
int zr_slot_wait(rank_state *rk, errsink *es, slot *s, const char *what, int block);
/* Drain the I/O this thread left in flight after a failure so its buffers
 * can be reused (with_optimizer: the optimizer's too, once it has stopped). */
void zr_drain_slots(rank_state *rk, bool with_optimizer);
/* Wait for the parameter reads in flight in the prefetch ring (a pass that
 * ended before the order did: validation's forward, logits), their data
 * dropped; with io.pf_mu held, so that the optimizer's kick starts none
 * meanwhile. */
void zr_drain_prefetch(rank_state *rk);
/* Device rk's NVMe store over the folders o names, `capacity` bytes, its
 * buffers registered over the arena. 0 or negative errno with err. */
int zr_open_store(fso_zero *z, rank_state *rk, const fso_offload_config *o,
                  uint64_t capacity, char *err, size_t errlen);

#endif
