/* footprint.h — what the sharded engine allocates and moves, by arithmetic
 * alone: the one owner of its memory rules. The engine (engine/zero*.c)
 * allocates by these functions, the planner (planner.h) predicts by them,
 * and test_zero holds the two equal byte for byte on every tier.
 *
 * The rules follow from a few facts (fso_fp_rules): how many devices share
 * each block, whether the CPU can address the devices' memory (CPU virtual
 * devices can; GPUs and cpu-async devices cannot), each kind's element type
 * and the aio settings. Everything else is derived here:
 *   - a shard: its block's padded elements / world, in whole I/O pages
 *     (util.h FSO_IO_PAGE); across several boxes (engine/boxes.h) the
 *     optimizer's kinds (master, m, v) hold 1/boxes of it on each box;
 *   - where parameters are lent in place (no gather, no gather window);
 *   - which tiers need the optimizer's chunk buffers and the gradient
 *     landing slots;
 *   - the buffers of each device (the gather window, the gradient buffers,
 *     the host staging: parameter ring, stage and landing slots, chunks);
 *   - a placement's bytes on each tier;
 *   - the NVMe and collective bytes one step moves.
 * Pure arithmetic: nothing is allocated, no engine or model is needed, and
 * every sum and product saturates at FSO_BYTES_OVERFLOW (util.h). */
#ifndef FSO_FOOTPRINT_H
#define FSO_FOOTPRINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "state.h"

/* The parameter ring: up to 16 blocks read ahead, plus the spare slots (the
 * one being copied to the device and the one being gathered from). */
#define FSO_FP_SPARE_SLOTS 2
#define FSO_FP_MAX_PARAM_SLOTS 18
#define FSO_FP_MAX_PREFETCH (FSO_FP_MAX_PARAM_SLOTS - FSO_FP_SPARE_SLOTS)
/* The gather window: two full-block buffers, one computed from while the
 * next is gathered. */
#define FSO_FP_GATHER_BUFFERS 2
/* The optimizer's ring of chunk buffer sets. */
#define FSO_FP_MAX_CHUNK_SETS 16

typedef struct fso_fp_rules {
    int world;                    /* devices sharing every block, 1 or more */
    int boxes;                    /* boxes the optimizer's state is sliced over (engine/boxes.h):
                                     each box holds 1/boxes of every shard's master, m and v;
                                     0 or 1: one box */
    bool host_addressable;        /* the CPU addresses the devices' memory (the backend's
                                     registry row, backend.h) */
    fso_dtype dtype[FSO_N_KINDS]; /* each kind's element type */
    size_t aio_block_bytes;       /* aio.block_size: the optimizer's chunk */
    int aio_queue_depth;          /* aio.queue_depth: sets the chunk ring */
    bool whole_copy;              /* train.whole_block_copies: streamed blocks copied whole to
                                     every device, no gather (fso_fp_copies_whole) */
    bool bf16_grads;              /* train.gradient_dtype "bf16": each block's working
                                     gradients rounded to bf16 before they are reduced (the
                                     shards stay in dtype[FSO_KIND_GRAD]) */
} fso_fp_rules;

/* Bytes of one element of kind k. */
size_t fso_fp_elem_bytes(const fso_fp_rules *r, fso_kind k);
/* x rounded up to whole I/O pages (saturating). */
uint64_t fso_fp_round_page(uint64_t x);
/* One device's shard of a block of padded_elems elements (a multiple of
 * world): its elements, and its bytes of kind k in whole pages. */
uint64_t fso_fp_shard_elems(const fso_fp_rules *r, uint64_t padded_elems);
uint64_t fso_fp_shard_bytes(const fso_fp_rules *r, uint64_t padded_elems, fso_kind k);
/* Boxes in the rules (at least 1). */
int fso_fp_boxes(const fso_fp_rules *r);
/* Whether kind k is sliced across boxes: the optimizer's (master, m, v);
 * working parameters and gradient accumulators are whole shards on every
 * box. */
bool fso_fp_sliced(fso_kind k);
/* Elements of kind k this box holds of a device's shard: the shard, or
 * 1/boxes of it for a sliced kind. Blocks are padded to world x boxes x
 * 2048 elements (model.h fso_model_layout), so a slice is whole pages in
 * either type. */
uint64_t fso_fp_kind_elems(const fso_fp_rules *r, uint64_t padded_elems, fso_kind k);

/* Parameters on param_tier are lent to the model where they live, with no
 * gather and no gather window: on the only device (its shard is the whole
 * block in the working type), and on devices the CPU addresses when they
 * live in memory (the device tier or the host arena: the block's buffer
 * their shards are parts of). */
bool fso_fp_lends_in_place(const fso_fp_rules *r, fso_tier param_tier);
/* Blocks whose parameters are on param_tier reach each device as whole
 * copies, every device's shard copied from host memory into its gather
 * window, instead of its own shard copied and then all-gathered: asked for
 * (whole_copy), on more than one device, the devices do not address host
 * memory (CPU devices lend in place: nothing to copy), and the parameters
 * are streamed (not on the device tier, which still gathers). The gather
 * window is the same; the collective moves none of these blocks; with
 * parameters on NVMe every device reads every device's shard of them. */
bool fso_fp_copies_whole(const fso_fp_rules *r, fso_tier param_tier);
/* Shards on tier t pass through the optimizer's chunk buffers: on NVMe,
 * or on a device the CPU cannot address; elsewhere AdamW works in place. */
bool fso_fp_chunks_needed(const fso_fp_rules *r, fso_tier t);
/* Gradient shards for tier t land in staging slots, copied down from the
 * devices first: on NVMe, or in host memory the devices cannot address.
 * Devices the CPU addresses reduce straight into the host tier. */
bool fso_fp_landing_needed(const fso_fp_rules *r, fso_tier t);
/* Whether the CPU works on a shard on tier t where it lies: host memory,
 * or a device tier the CPU addresses. */
bool fso_fp_cpu_reaches(const fso_fp_rules *r, fso_tier t);

/* With bf16 gradients, each device's bf16 send buffers: one per gradient
 * buffer (the fp32 full-block ones stay), which the block's gradients are
 * cast into where its backward ends and reduce-scattered from (coll.h
 * reduce_scatter_bf16). Devices the CPU addresses need none: they round
 * their gradients in place and the CPUs read them there. *bytes: each,
 * the largest block (max_padded) in bf16; 0 buffers without bf16
 * gradients. Returns how many. */
int fso_fp_grad_send_buffers(const fso_fp_rules *r, uint64_t max_padded, size_t *bytes);
/* Bytes of one gradient value as the reduce-scatter reads it: bf16 where
 * bf16 gradients are sent (fso_fp_grad_send_buffers), else the gradients'
 * type (CPU devices read the rounded values in place, in fp32). */
size_t fso_fp_reduce_elem_bytes(const fso_fp_rules *r);

/* The blocks, and the tier of each block's shards of each kind. */
typedef struct fso_fp_layout {
    int n_blocks;
    const uint64_t *padded_elems;   /* (n_blocks) all shards of the block */
    fso_tier (*tier)(const void *ctx, int block, fso_kind k);
    const void *ctx;
    int prefetch;                   /* blocks read ahead when parameters are on NVMe */
} fso_fp_layout;

/* A layout's tier function for ctx an fso_block_rule (state.h): the rule's
 * fso_block_tier. */
fso_tier fso_fp_rule_tier(const void *rule, int block, fso_kind k);

/* Each device's buffers for a layout: sized for its largest block, and
 * present when any block needs them (a layout whose blocks sit on
 * different tiers takes the union: the gather window when any block's
 * parameters are gathered, the ring when any block's parameters are on
 * NVMe, landing slots when any block's gradients land, chunk sets for every
 * kind that any block passes through them). */
typedef struct fso_fp_buffers {
    /* on each device */
    int gather;                  /* full-block parameter buffers (the gather window):
                                    FSO_FP_GATHER_BUFFERS, or 0 where every block's parameters
                                    are lent in place */
    size_t gather_bytes;         /* each: the largest block in the working type */
    int grad_full;               /* full-block gradient buffers (2) */
    size_t grad_full_bytes;      /* each: the largest block, in the gradients' type */
    /* host staging, in the host arena */
    int prefetch_slots;          /* parameter ring: prefetch + FSO_FP_SPARE_SLOTS when any
                                    block's parameters are on NVMe, else 0 */
    int prefetch_spare;          /* slots beyond the prefetch depth */
    int max_prefetch;            /* the deepest prefetch the engine takes */
    size_t prefetch_slot_bytes;  /* each: the largest shard in the working type, whole pages */
    int stage_slots;             /* a shard's round trip (retiers, whole-model copies) */
    int landing_slots;           /* gradient shards on their way down, where they land
                                    (fso_fp_landing_needed): counted when `landings` */
    bool landings;               /* some block's gradients land */
    size_t stage_slot_bytes;     /* each stage and landing slot: the largest shard, fp32,
                                    whole pages */
    int chunk_sets;              /* the optimizer's ring of chunk buffer sets: aio.queue_depth
                                    / 4, from 2 to 16, no more than the chunks of two shards;
                                    half of it reads ahead, the rest holds writes behind */
    size_t chunk_bytes;          /* each chunk: aio.block_size (bf16 parameters: a multiple of
                                    8 KiB, so that half a chunk is whole pages), at most a
                                    stage slot */
    bool chunked[FSO_N_KINDS];   /* kinds with chunk sets: some block's shard of the kind is
                                    on a tier that needs them (fso_fp_chunks_needed) */
    int chunk_kinds;             /* how many */
} fso_fp_buffers;
void fso_fp_buffers_for(const fso_fp_rules *r, const fso_fp_layout *l, fso_fp_buffers *b);
/* One device's host staging: the ring, the stage slots, the landing slots
 * when any, and the chunk sets of every kind that has them. */
uint64_t fso_fp_staging_bytes(const fso_fp_buffers *b);

/* What a placement takes on each tier, without the activations. */
typedef struct fso_fp_need {
    uint64_t kind_bytes[FSO_N_TIERS][FSO_N_KINDS]; /* shards: device tier per device; host
                                                      and NVMe all devices */
    uint64_t device_buffers;     /* per device: the gather window, gradient buffers and bf16
                                    gradient send buffers (fso_fp_grad_send_buffers) */
    uint64_t staging;            /* per device, in the host arena */
    uint64_t tier[FSO_N_TIERS];  /* device: per device (shards and buffers); host: every
                                    device's host shards and staging; NVMe: every device's */
    fso_fp_buffers buffers;      /* the buffers counted */
} fso_fp_need;
void fso_fp_need_for(const fso_fp_rules *r, const fso_fp_layout *l, fso_fp_need *n);

/* The uses of each block in one micro-batch. */
typedef struct fso_fp_uses {
    const int *param_visits;     /* (n_blocks) visits that use the block's parameters */
    const int *grad_visits;      /* (n_blocks) visits that end with its gradients */
    int grad_accum;              /* micro-batches per step */
} fso_fp_uses;

/* What one step moves, all devices together. NVMe, by kind: parameters on
 * NVMe are read at every visit that uses them in every micro-batch and
 * written once by AdamW; gradients are written by every micro-batch and
 * read by every one but the first (accumulation) and by AdamW; master, m
 * and v are read and written once; each shard in whole pages, as the drive
 * moves it; blocks copied whole (fso_fp_copies_whole) have their
 * parameters read by every device, W times the bytes. Collectives: every
 * device's share of every block gathered at a visit (none where parameters
 * are lent in place or copied whole) and of every block's gradients
 * reduced, in the working and gradient types. */
typedef struct fso_fp_traffic {
    uint64_t nvme_read[FSO_N_KINDS], nvme_write[FSO_N_KINDS];
    uint64_t gather_bytes, reduce_bytes;
    /* across boxes, what this box sends once per step over its rails: each
     * device's gradient shard reduce-scattered (fp32) and its working
     * parameters all-gathered, (boxes-1)/boxes of each, as a ring sends
     * them; 0 on one box */
    uint64_t net_bytes;
} fso_fp_traffic;
void fso_fp_step_traffic(const fso_fp_rules *r, const fso_fp_layout *l, const fso_fp_uses *u,
                         fso_fp_traffic *t);

#endif
