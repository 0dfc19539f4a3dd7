/* config.h — the training job's configuration.
 *
 * One JSON file (docs/configuration.md): DeepSpeed's names where they mean the same thing
 * (train_micro_batch_size_per_gpu, gradient_accumulation_steps, gradient_clipping,
 * optimizer, scheduler, bf16, steps_per_print, seed), a "model" section with
 * Hugging Face LlamaConfig names, and fsoff's own "data" and "train" sections.
 * Every field has a built-in default, so an empty object is the default job.
 *
 * Loading: fso_config_defaults(), then fso_config_load_file() and any number of
 * fso_config_set() overrides, then fso_config_finish() which validates the whole.
 * Each returns 0 or a negative errno; on failure the message (file:line:col or
 * "--set ..." and the key path, what was wrong, what to do) is in cfg->err.
 */
#ifndef FSO_CONFIG_H
#define FSO_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rope.h"
#include "backend.h"
#include "state.h"

#define FSO_CONFIG_ERR_MAX 512
#define FSO_CONFIG_MAX_GIVEN 256  /* more than fsoff has keys */

/* DeepSpeed's "auto" (a Hugging Face DeepSpeed config's placeholder) is
 * taken where a choice is fsoff's to make, and its key's origin is then
 * FSO_ORIGIN_AUTO (fso_config_origin_of), so the planner chooses:
 *   train_micro_batch_size_per_gpu, gradient_accumulation_steps: the
 *     split of the global batch. Given a train_batch_size number, the
 *     provisional values hold it (both "auto": micro-batch train_batch_size
 *     / devices, one accumulation step; one "auto": the other divides it,
 *     as DeepSpeed's rule). The micro-batch "auto" without
 *     train_batch_size (DeepSpeed's autotuner's shape): the default
 *     micro-batch, and the global batch follows it (train_batch_size is
 *     then not pinned). gradient_accumulation_steps "auto" needs a
 *     train_batch_size number.
 *   zero_optimization.stage3_prefetch_bucket_size, stage3_max_live_parameters
 *     (and their unprefixed spellings): train.prefetch_blocks, provisionally
 *     its library default.
 *   aio.block_size, aio.queue_depth: provisionally their library defaults;
 *     aio's other keys are ignored whatever their value.
 *   fp16.enabled: false (fsoff has no fp16), with a warning.
 * Any key fsoff ignores with its warning takes "auto" with it. Elsewhere
 * (train_batch_size, the global batch being the user's hyperparameter;
 * the optimizer's and scheduler's parameters; gradient_clipping;
 * bf16.enabled; ...) "auto" is refused naming the key and the Hugging Face
 * Trainer argument whose value to write (config_values.c). */

/* Where a key's value came from. */
typedef enum fso_config_origin {
    FSO_ORIGIN_DEFAULT = 0,       /* the built-in defaults or a library default */
    FSO_ORIGIN_FILE,              /* the config file */
    FSO_ORIGIN_SET,               /* a --set (or an option that is one: --data, --steps, --nvme) */
    FSO_ORIGIN_AUTO,              /* the file or a --set gave "auto" (DeepSpeed's placeholder):
                                     the planner chooses, as for a default, and says what */
} fso_config_origin;

/* The keys the user gave a value, as fso_config_finish() found them; every
 * other key holds its default. Keys are leaves of the document (an array is
 * one key), named by their dotted path, stored as a 64-bit FNV-1a hash of it
 * so the struct copies by value. */
typedef struct fso_config_given {
    int n;
    uint64_t key_hash[FSO_CONFIG_MAX_GIVEN];
    uint8_t origin[FSO_CONFIG_MAX_GIVEN];   /* fso_config_origin */
} fso_config_given;

/* model.model_type: the Hugging Face architecture (config_enums.c spells
 * them). Mistral is Llama with sliding_window; Qwen2 adds biases to the
 * q, k and v projections. */
typedef enum fso_model_type {
    FSO_MODEL_LLAMA = 0,          /* LlamaForCausalLM */
    FSO_MODEL_MISTRAL,            /* MistralForCausalLM */
    FSO_MODEL_QWEN2,              /* Qwen2ForCausalLM */
} fso_model_type;

/* transformers' defaults of MistralConfig's and Qwen2Config's window keys */
#define FSO_SLIDING_WINDOW_DEFAULT 4096
#define FSO_MAX_WINDOW_LAYERS_DEFAULT 28

typedef struct fso_model_config {
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;
    int head_dim;                 /* head_dim, else hidden_size / num_attention_heads */
    int max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;
    fso_rope_scaling rope_scaling; /* rope_scaling: none, linear or llama3 */
    double initializer_range;
    bool tie_word_embeddings;
    fso_model_type model_type;    /* model_type */
    int sliding_window;           /* sliding_window (mistral, qwen2); 0: null */
    bool use_sliding_window;      /* qwen2: whether sliding_window applies at all */
    int max_window_layers;        /* qwen2: the layers below this one attend in full */
} fso_model_config;

/* Whether the q, k and v projections have biases (Qwen2's; model.h's
 * FSO_T_Q_BIAS, FSO_T_K_BIAS, FSO_T_V_BIAS). */
static inline bool fso_model_qkv_bias(const fso_model_config *mc)
{
    return mc->model_type == FSO_MODEL_QWEN2;
}

/* The window of the layers that attend through one, as transformers
 * decides it for the type; 0 when every layer attends to every earlier
 * position: mistral's sliding_window; qwen2's when use_sliding_window and
 * some layer is at or past max_window_layers; never llama's. fsoff's
 * attention is full causal attention, which is the same model when the
 * window is at least data.seq_len (config_keys.c checks it). */
static inline int fso_model_window(const fso_model_config *mc)
{
    if (mc->model_type == FSO_MODEL_MISTRAL)
        return mc->sliding_window;
    if (mc->model_type == FSO_MODEL_QWEN2 && mc->use_sliding_window &&
        mc->max_window_layers < mc->num_hidden_layers)
        return mc->sliding_window;
    return 0;
}

typedef enum fso_sched_type {
    FSO_SCHED_CONSTANT = 0,       /* no "scheduler" section: optimizer lr throughout */
    FSO_SCHED_WARMUP_COSINE,      /* DeepSpeed WarmupCosineLR */
    FSO_SCHED_WARMUP,             /* DeepSpeed WarmupLR */
    FSO_SCHED_WARMUP_DECAY,       /* DeepSpeed WarmupDecayLR */
} fso_sched_type;

typedef enum fso_warmup_type { FSO_WARMUP_LINEAR = 0, FSO_WARMUP_LOG } fso_warmup_type;

typedef struct fso_sched_config {
    fso_sched_type type;
    fso_warmup_type warmup_type;
    int64_t warmup_num_steps;
    int64_t total_num_steps;      /* 0: train.steps */
    double warmup_min_ratio;      /* WarmupCosineLR */
    double cos_min_ratio;         /* WarmupCosineLR */
    double warmup_min_lr;         /* WarmupLR, WarmupDecayLR */
    double warmup_max_lr;         /* WarmupLR, WarmupDecayLR */
} fso_sched_config;

typedef struct fso_optim_config {
    double lr;
    double beta1, beta2;
    double eps;
    double weight_decay;
    bool decay_norms;             /* train.weight_decay_norms */
    bool decay_embeddings;        /* train.weight_decay_embeddings */
} fso_optim_config;

typedef enum fso_data_format {
    FSO_DATA_AUTO = 0,            /* token file if the magic matches or the name ends .bin */
    FSO_DATA_TOKENS,              /* llm.c token file (uint16 v1, uint32 v2) */
    FSO_DATA_TEXT,                /* plain text, one token per byte */
    FSO_DATA_BYTES,               /* the same, also for a model whose vocabulary is not bytes */
} fso_data_format;

/* data.val_batches when the user gives none. */
#define FSO_VAL_BATCHES_DEFAULT 20
/* data.documents: what a token file's documents (data.h) do */
typedef enum fso_data_docs {
    FSO_DATA_DOCS_ISOLATE = 0,    /* a token sees only its document; positions restart */
    FSO_DATA_DOCS_STREAM,         /* ignored: every window one stream, as llm.c */
} fso_data_docs;

typedef struct fso_data_config {
    char path[4096];              /* "" = the built-in synthetic corpus */
    fso_data_format format;
    int seq_len;
    char val_path[4096];          /* data.val_path (--val-data): held-out tokens; "" = none */
    int64_t val_every;            /* data.val_every (--val-every): also every N steps; 0: only
                                     before the first step and after the last */
    int val_batches;              /* data.val_batches (--val-batches): micro-batches per pass */
    fso_data_docs documents;
} fso_data_config;

typedef struct fso_offload_config {
    int stage;                    /* zero_optimization.stage (fsoff partitions as stage 3) */
    fso_tier param_tier;          /* zero_optimization.offload_param.device */
    fso_tier optim_tier;          /* zero_optimization.offload_optimizer.device: master, m, v
                                     and gradients */
    /* A placement with a tier of its own for each kind (a plan's, plan.h
     * fso_plan_apply, or a test's): when per_kind is set, kind_tier holds
     * every kind's tier (param_tier and optim_tier then say the parameters'
     * and the master weights'); fso_offload_tier() reads whichever holds. */
    bool per_kind;
    fso_tier kind_tier[FSO_N_KINDS];
    /* Blocks 0 .. state_host_blocks - 1 keep the optimizer's kinds that live
     * on NVMe (master, m, v) in host memory instead: the next forward needs
     * block 0's update first (a plan's choice where host memory is left;
     * 0: none). fso_offload_block_tier() applies it. */
    int state_host_blocks;
    /* Per-block residency (state.h fso_block_rule), from the train.* keys,
     * else a plan's choice (plan.h fso_plan_apply):
     * resident_blocks: train.resident_blocks, parameter blocks kept on the
     * devices (the first in fso_residency_rank's order), the others
     * streamed from the parameters' tier; -1 when neither gave it (none).
     * device_state_blocks: train.device_state_blocks, blocks whose master,
     * m, v and gradients stay on the devices and are updated there; -1
     * when neither gave it (none). device_state_first: train.
     * device_state_from "first" (from block 0 up; else from the last
     * block down). */
    int resident_blocks;
    int device_state_blocks;
    bool device_state_first;
    /* train.whole_block_copies: a streamed block is copied whole from the
     * host to every device instead of each device copying its shard and
     * all-gathering (faster where the host links beat the devices' links) */
    bool whole_copy;
    char param_nvme_path[4096];   /* folders, comma-separated */
    char optim_nvme_path[4096];
    bool pin_memory;              /* either section's pin_memory */
    int64_t aio_block_bytes;      /* aio.block_size */
    int aio_queue_depth;          /* aio.queue_depth */
    int prefetch_blocks;          /* train.prefetch_blocks: blocks read ahead of compute */
} fso_offload_config;

/* checkpoint.keep when the user gives none; fsoff train's --help prints it. */
#define FSO_CHECKPOINT_KEEP_DEFAULT 2

typedef struct fso_checkpoint_config {
    char dir[4096];               /* checkpoint.dir (--save): "" = no checkpoints */
    int64_t every_steps;          /* checkpoint.every_steps (--save-every): 0 = at the end only */
    int keep;                     /* checkpoint.keep (--keep): complete checkpoints kept */
} fso_checkpoint_config;

/* comm.rails: what carries the rails across boxes of GPUs (engine/boxes.h).
 * auto: NCCL where no GPU serves two boxes, else MPI; CPU devices always
 * use MPI. */
typedef enum { FSO_RAILS_AUTO, FSO_RAILS_NCCL, FSO_RAILS_MPI } fso_rails_kind;

typedef struct fso_config {
    fso_model_config model;
    fso_optim_config optim;
    fso_sched_config sched;
    fso_data_config data;

    int micro_batch;              /* train_micro_batch_size_per_gpu */
    int grad_accum;               /* gradient_accumulation_steps */
    int64_t global_batch;         /* train_batch_size: sequences per optimizer step over all
                                     devices, micro_batch * grad_accum * devices, as
                                     DeepSpeed resolves the three (any two give the third;
                                     config_ds.c) for the device count at loading */
    double grad_clip;             /* gradient_clipping; 0 = off */
    int64_t steps;                /* train.steps */
    int64_t steps_per_print;
    uint64_t seed;
    bool bf16;                    /* bf16.enabled */
    int threads;                  /* train.threads; 0 = the CPUs this process may use */
    bool activation_checkpointing;/* train.activation_checkpointing */
    int activations;              /* where the layer inputs kept for backward live (model.h):
                                     FSO_TIER_DEVICE or FSO_TIER_HOST, from train.activations
                                     or activation_checkpointing.cpu_checkpointing, else a
                                     plan's choice; -1 when none gave it (the device) */
    fso_offload_config offload;
    fso_overlap optimizer_overlap;/* train.optimizer_overlap */
    bool bf16_grads;              /* train.gradient_dtype "bf16": each block's working
                                     gradients rounded to bf16 where its backward ends, reduced
                                     and accumulated in fp32 (needs bf16.enabled) */
    double device_margin;         /* train.device_margin: the fraction of each device's memory
                                     a plan leaves free (fragmentation, NCCL, cuBLAS
                                     workspaces); -1 when not given: the default
                                     (FSO_DEVICE_MARGIN_GPU on GPUs, 0 on CPU devices) */
    fso_checkpoint_config checkpoint;
    double comm_timeout_s;        /* comm.timeout_s: the longest wait across boxes (boxes.h) */
    fso_rails_kind comm_rails;    /* comm.rails: what the rails across boxes run on (boxes.h) */
    char init_from[4096];         /* model.init_from (--init-from): a Hugging Face folder the
                                     parameters start from, "" for the seed (hf.h) */

    /* From the command line only (--devices, --device-mem, --host-mem). */
    int world;                    /* devices (fso_config_world): --devices cpu:N, cuda:N, auto */
    /* From the launcher only (boxes.h): the boxes of the run, each with
     * `world` devices, and this process's; 0/0 counts as one box. */
    int boxes, box;
    fso_backend_kind backend;     /* the devices' backend (backend.h's registry): cpu, the
                                     default; cuda; cpu-ref and cpu-async in tests */
    uint64_t device_mem_bytes;    /* cap per device; 0 = the default */
    uint64_t host_mem_bytes;      /* host memory fsoff may use (the host arena, and CPU devices'
                                     memory); 0 = the memory available at start */

    char source[4096];            /* config file path, "" for built-in defaults */
    fso_config_given given;       /* which keys the file or a --set gave */
    char err[FSO_CONFIG_ERR_MAX];
    struct fso_config_doc *doc;   /* merged JSON document until fso_config_finish() */
} fso_config;

/* The device count: cfg->world, which fso_config_defaults sets to 1 and
 * --devices raises; a configuration filled without the defaults (world 0)
 * counts as one device. The one place that rule is spelled. */
static inline int fso_config_world(const fso_config *cfg)
{
    return cfg->world > 0 ? cfg->world : 1;
}

/* Boxes in the run (boxes.h): cfg->boxes, 1 when unset. */
static inline int fso_config_boxes(const fso_config *cfg)
{
    return cfg->boxes > 0 ? cfg->boxes : 1;
}

/* Devices in the whole run, every box's: what the batch triple and the
 * global batch count (micro_batch x grad_accum x ranks sequences a step). */
static inline int fso_config_ranks(const fso_config *cfg)
{
    return fso_config_world(cfg) * fso_config_boxes(cfg);
}

/* The device count changed after loading (fsoff plan --gpus N, a plan's
 * world): cfg->world = world, and the batch triple resolved again by
 * DeepSpeed's rule from the keys the user gave (fso_config_pinned):
 * train_batch_size given keeps the global batch and re-derives the
 * micro-batch or accumulation; otherwise the global batch follows the
 * devices. 0, or -EINVAL with the contradiction in cfg->err (a
 * train_batch_size the new count does not divide). */
int fso_config_set_world(fso_config *cfg, int world);
/* The run has `boxes` boxes and this process is box `box` (boxes.h): the
 * batch triple resolved again over fso_config_ranks, as by
 * fso_config_set_world. 0, or -EINVAL with the contradiction in cfg->err. */
int fso_config_set_boxes(fso_config *cfg, int boxes, int box);

/* Built-in defaults: the tiny default job. Never fails. */
void fso_config_defaults(fso_config *cfg);
/* Merge a JSON file over the current document. */
int fso_config_load_file(fso_config *cfg, const char *path);
/* Apply one "key.path=value" override; value is JSON, or a bare string. */
int fso_config_set(fso_config *cfg, const char *assignment);
/* The same for an option that is one (--init-from DIR is model.init_from="DIR"):
 * errors quote `written`, the option as the user wrote it; NULL: "--set
 * ASSIGNMENT". */
int fso_config_set_as(fso_config *cfg, const char *assignment, const char *written);
/* Validate the merged document and fill the struct; prints warnings for keys
 * that are understood but ignored. Releases the document. */
int fso_config_finish(fso_config *cfg);
/* The whole sequence: the file (path may be NULL), the overrides in order,
 * finish. 0 or negative errno with the message in cfg->err. */
int fso_config_load_all(fso_config *cfg, const char *path, char *const *sets, int nsets);
/* The same with written[i] (or NULL) how the user wrote sets[i]
 * (fso_config_set_as); written NULL: every one a --set. */
int fso_config_load_written(fso_config *cfg, const char *path, char *const *sets,
                            char *const *written, int nsets);
/* Release whatever fso_config_load_file/set allocated (safe after finish). */
void fso_config_free(fso_config *cfg);

/* Where the value of `key` ("train.prefetch_blocks",
 * "zero_optimization.offload_param.device") came from: what the planner
 * keeps as the user's choice and what it may choose itself. */
fso_config_origin fso_config_origin_of(const fso_config *cfg, const char *key);
/* Whether the user chose `key`'s value (a file or a --set gave a value, not
 * "auto"): the planner keeps it; otherwise the planner may choose. */
static inline bool fso_config_pinned(const fso_config *cfg, const char *key)
{
    fso_config_origin o = fso_config_origin_of(cfg, key);
    return o == FSO_ORIGIN_FILE || o == FSO_ORIGIN_SET;
}

/* The tier kind k lives on: o->kind_tier[k] when o->per_kind, else
 * param_tier for the parameters and optim_tier for the other kinds. */
fso_tier fso_offload_tier(const fso_offload_config *o, fso_kind k);
/* o's placement of a model of n_blocks blocks as state.h's rule: each
 * kind's tier (fso_offload_tier), the resident parameter blocks, the blocks
 * whose state is on the devices, those whose NVMe state stays on the host. */
void fso_offload_block_rule(const fso_offload_config *o, int n_blocks, fso_block_rule *r);
/* The tier of block b's shards of kind k under that rule (state.h
 * fso_block_tier). */
fso_tier fso_offload_block_tier(const fso_offload_config *o, fso_kind k, int b, int n_blocks);

/* The tier of the kept activations: cfg->activations, the device when
 * nothing chose it. */
static inline fso_tier fso_config_acts_tier(const fso_config *cfg)
{
    return cfg->activations == FSO_TIER_HOST ? FSO_TIER_HOST : FSO_TIER_DEVICE;
}
/* Whether the user chose that tier (train.activations or
 * activation_checkpointing.cpu_checkpointing): a plan keeps it. */
bool fso_config_acts_pinned(const fso_config *cfg);

/* train.device_margin's default on GPUs: the fraction of each GPU's memory
 * a plan leaves free. */
#define FSO_DEVICE_MARGIN_GPU 0.05

/* A key that takes one of a few strings: each string with the value it
 * names, in the order messages list them, ended by {0, NULL}. These tables
 * (config_enums.c) are the one place each string is spelled: the parser,
 * fso_config_to_json and the messages read them. */
typedef struct fso_config_choice {
    int value;
    const char *name;
} fso_config_choice;
extern const fso_config_choice fso_config_model_type_choices[];  /* model.model_type */
extern const fso_config_choice fso_config_optimizer_choices[];   /* optimizer.type */
extern const fso_config_choice fso_config_tier_choices[];        /* offload_*.device */
extern const fso_config_choice fso_config_overlap_choices[];     /* train.optimizer_overlap */
extern const fso_config_choice fso_config_state_from_choices[];  /* train.device_state_from */
extern const fso_config_choice fso_config_grad_dtype_choices[];  /* train.gradient_dtype */
extern const fso_config_choice fso_config_acts_choices[];        /* train.activations */
extern const fso_config_choice fso_config_data_format_choices[]; /* data.format */
extern const fso_config_choice fso_config_data_docs_choices[];   /* data.documents */
extern const fso_config_choice fso_config_rails_choices[];       /* comm.rails */
extern const fso_config_choice fso_config_sched_type_choices[];  /* scheduler.type */
extern const fso_config_choice fso_config_warmup_type_choices[]; /* scheduler.params.warmup_type */
/* The string of `value` in table; "?" when it has none. */
const char *fso_config_choice_name(const fso_config_choice *table, int value);
/* The index in table of s (exact, or case-insensitive when nocase), or -1. */
int fso_config_choice_find(const fso_config_choice *table, const char *s, bool nocase);
/* The strings, quoted, for a message: "a"; "a" or "b"; "a", "b" or "c". */
void fso_config_choice_list(const fso_config_choice *table, char *buf, size_t len);

/* The learning rate of optimizer step `step` (counting from 1). */
double fso_config_lr_at(const fso_config *cfg, int64_t step);

#endif
