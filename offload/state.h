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
