/* state.h — the kinds of per-shard training state, the tiers each can live
 * on, and when the optimizer updates them: one set of names for the
 * configuration (engine/config/config.h), the sharded trainer (engine/zero/zero.h) and
 * the planner (planner.h).
 *
 * Every block's flat parameter buffer is split into one shard per device;
 * per shard there are FSO_N_KINDS kinds of state, and each kind lives on
 * one tier. */
#ifndef FSO_STATE_H
#define FSO_STATE_H

#include <stdbool.h>

typedef enum fso_kind {
    FSO_KIND_PARAM = 0,   /* working parameters: gathered for compute; fp32, or bf16 */
    FSO_KIND_MASTER,      /* fp32 master weights */
    FSO_KIND_M,           /* AdamW first moment */
    FSO_KIND_V,           /* AdamW second moment */
    FSO_KIND_GRAD,        /* gradient accumulator */
    FSO_N_KINDS,
} fso_kind;

/* The tiers; zero_optimization.offload_*.device names them (its strings, with
 * the tier each names, are engine/config/config_enums.c's). */
typedef enum fso_tier {
    FSO_TIER_DEVICE = 0,  /* "none": on the device */
    FSO_TIER_HOST,        /* "cpu": the process's host arena */
    FSO_TIER_NVME,        /* "nvme": the NVMe store */
    FSO_N_TIERS,
} fso_tier;

/* When the optimizer updates a block: train.optimizer_overlap (its strings
 * are engine/config/config_enums.c's). */
typedef enum fso_overlap {
    FSO_OVERLAP_NONE = 0, /* every block updated after backward, before the next forward */
    FSO_OVERLAP_FORWARD,  /* blocks updated in forward order while the next forward runs; a
                             block is used as soon as it is updated */
    FSO_OVERLAP_BACKWARD, /* clipping off: each block updated as its last gradients land */
} fso_overlap;

/* Where each block's shards live: the rule the configuration, the trainer,
 * the footprint and the planner all apply (one function, so that they
 * agree block by block).
 *   - Parameters: the first resident_blocks blocks of the residency order
 *     (fso_residency_rank) are resident, on the devices across steps and
 *     updated in place; the others are streamed from tier[PARAM] (host or
 *     NVMe) each time they are used. resident_blocks < 0: none beyond
 *     tier[PARAM] (every block there).
 *   - Optimizer state and gradients (master, m, v, gradients): the
 *     device_state_blocks blocks counted from the last block down (or from
 *     block 0 up, device_state_first) live on the devices and are updated
 *     there; of the others, the first state_host_blocks keep the kinds
 *     whose tier is NVMe (master, m, v) in host memory; the rest follow
 *     tier[k]. */
typedef struct fso_block_rule {
    int n_blocks;
    fso_tier tier[FSO_N_KINDS];   /* each kind's tier for the blocks no count below moves */
    int resident_blocks;          /* parameter blocks on the devices; < 0: none */
    int device_state_blocks;      /* blocks whose state and gradients are on the devices */
    bool device_state_first;      /* device_state_blocks from block 0 up, else from the last */
    int state_host_blocks;        /* blocks whose NVMe state kinds stay on the host */
} fso_block_rule;

/* Whether a and b place every block's shards alike (every field equal). */
bool fso_block_rule_same(const fso_block_rule *a, const fso_block_rule *b);
/* The tier of block b's shards of kind k under r. */
fso_tier fso_block_tier(const fso_block_rule *r, int kind, int b);
/* Block b's place in the order in which parameter blocks are kept on the
 * devices (0 first): block 0 (the embedding: no compute before it to hide
 * its copy behind), then the rest spread evenly over the schedule
 * (bit-reversed positions), so that every streamed block's copy has
 * resident blocks' compute before it to hide behind. */
int fso_residency_rank(int n_blocks, int b);
/* The blocks in that order: order[i] is the block of rank i. */
void fso_residency_order(int n_blocks, int *order);

/* Each kind's names, "?" out of range: in messages, "parameters",
 * "master weights", "AdamW m", "AdamW v", "gradients". */
const char *fso_kind_name(int kind);
/* As a key of a JSON object with a member per kind (--metrics lines, the
 * plan's placement, bench results; files that scripts read, so fixed):
 * "parameters", "master", "m", "v", "gradients". */
const char *fso_kind_key(int kind);
/* Short, in one-line summaries (the step line, bench pipeline): "params",
 * "master", "m", "v", "grads". */
const char *fso_kind_abbrev(int kind);
/* A checkpoint's manifest names the kinds it saves in a format of its own
 * ("master", "adam_m", "adam_v": fso_ckpt_kind_names, engine/ckpt/checkpoint.h). */

/* "device", "host", "nvme"; "?" out of range: in messages, and as the keys
 * and values of the plan's JSON and a checkpoint's manifest. */
const char *fso_tier_name(int tier);

#endif
