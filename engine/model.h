/* model.h — a Llama-family decoder (Hugging Face LlamaConfig semantics;
 * Mistral's and Qwen2's too: config.h fso_model_type) over the backend
 * interface.
 *
 * Parameters are grouped in blocks: block 0 is the token embedding, blocks
 * 1..L the transformer layers, block L+1 the head (final RMSNorm and, unless
 * tied, the LM head); fso_model_n_blocks() counts them and
 * fso_model_visits() lists the order a micro-step uses them in. Each block's parameters are one flat
 * fp32 buffer with a table of named tensors at 64-element aligned offsets,
 * padded so it splits into `world` equal shards of whole 4 KiB pages: the unit
 * that sharding, streaming and offload work on. Walking the blocks in order
 * and their tables in order visits the tensors in Hugging Face's order.
 *
 * The model owns no parameters: a block source (fso_block_source) lends it
 * each block's full parameters and gradient buffer while it works on that
 * block, in a fixed order, so that the source can gather shards, stream them
 * from host memory or NVMe, and prefetch ahead (engine/zero/zero.c). One training
 * micro-step is fso_model_step(): forward over all blocks, the loss,
 * backward, each block's gradient handed back as soon as it is complete.
 * With activation checkpointing only each layer's input is kept and the
 * layer is recomputed during backward; those kept inputs have a tier
 * (fso_model_opts.acts): the device, or host memory the caller lends, where
 * the forward writes them behind its compute and the backward reads them
 * ahead of it on the copy streams, through a ring of FSO_ACT_RING device
 * slots.
 */
#ifndef FSO_MODEL_H
#define FSO_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "config/config.h"

/* Device slots the kept layer inputs cycle through on the host tier: the
 * copy of one layer's input down (or up) runs while the next layer computes. */
#define FSO_ACT_RING 2

typedef enum fso_tensor_kind {
    FSO_T_EMBED = 0,
    FSO_T_ATTN_NORM,
    FSO_T_Q,
    FSO_T_K,
    FSO_T_V,
    FSO_T_O,
    FSO_T_MLP_NORM,
    FSO_T_GATE,
    FSO_T_UP,
    FSO_T_DOWN,
    FSO_T_FINAL_NORM,
    FSO_T_LM_HEAD,
    FSO_T_Q_BIAS,           /* Qwen2's (fso_model_qkv_bias): each after its weight */
    FSO_T_K_BIAS,
    FSO_T_V_BIAS,
} fso_tensor_kind;

typedef enum fso_block_kind { FSO_BLOCK_EMBED = 0, FSO_BLOCK_LAYER, FSO_BLOCK_HEAD } fso_block_kind;

#define FSO_BLOCK_MAX_TENSORS 12

typedef struct fso_tensor_desc {
    fso_tensor_kind kind;
    char name[64];          /* Hugging Face name: model.layers.3.mlp.up_proj.weight */
    int rows, cols;         /* (rows, cols) row-major; cols = 1 for vectors */
    size_t offset_elems;    /* within the block's flat buffer */
    size_t numel;
    bool is_norm;           /* RMSNorm weight: initialised to 1 */
    bool is_bias;           /* a linear layer's bias: initialised to 0 */
    bool decay;             /* AdamW weight decay applies: linear weights only (not
                               norms, biases or the embedding, as transformers' Trainer) */
} fso_tensor_desc;

/* Dimensions of the tensor as PyTorch stores it: 1 for a norm's weight or
 * a bias, 2 for a matrix. */
static inline int fso_tensor_ndim(const fso_tensor_desc *t)
{
    return t->is_norm || t->is_bias ? 1 : 2;
}

typedef struct fso_block_layout {
    fso_block_kind kind;
    int layer;              /* FSO_BLOCK_LAYER: 0..L-1; else -1 */
    int n_tensors;
    fso_tensor_desc tensors[FSO_BLOCK_MAX_TENSORS];
    size_t used_elems;      /* end of the last tensor */
    size_t padded_elems;    /* multiple of world * 2048 */
} fso_block_layout;

/* Activations of one layer (N = B*T rows); [wt] ones are stored in the
 * model's working type, the rest in fp32 (backend.h, "Types"). */
typedef struct fso_layer_acts {
    void *h1;        /* (N,C) [wt] attention RMSNorm output */
    float *rstd1;    /* (N) */
    void *q;         /* (N,H*D) [wt] after RoPE */
    void *k, *v;     /* (N,Hkv*D) [wt], k after RoPE */
    void *probs;     /* (B,H,T,T) [wt] */
    void *att;       /* (N,H*D) [wt] */
    float *x2;       /* (N,C) residual after attention */
    void *h2;        /* (N,C) [wt] MLP RMSNorm output */
    float *rstd2;    /* (N) */
    void *gate, *up, *act; /* (N,F) [wt] */
} fso_layer_acts;

typedef struct fso_model {
    fso_model_config mc;
    fso_backend *be;
    int B, T, world;
    bool checkpointing;
    fso_dtype wt;                 /* working type: the lent weights and [wt] activations */

    int n_blocks;                 /* L + 2 */
    fso_block_layout *blocks;
    size_t n_params;              /* real parameters, padding excluded */
    /* Lent by the block source while a block is in use, else NULL. */
    const void **params;          /* per block, (padded_elems) device [wt] */
    float **grads;                /* per block, (padded_elems) device fp32 */

    /* activations (device) */
    int32_t *tokens, *targets;    /* (N) */
    int32_t *pos;                 /* (N) each token's position in its document */
    bool docs;                    /* this micro-batch has documents: pos is used */
    float **layer_in;             /* L+1 pointers (N,C): input of each layer, then the final x
                                     (NULL with bf16_acts); on the host tier, input l is
                                     ring slot l % FSO_ACT_RING (the pointers alias) */
    bool bf16_acts;               /* the kept layer inputs are bf16 (kept16), widened into the
                                     fp32 work buffers xa, xb when used */
    uint16_t **kept16;            /* L+1 (N,C) with bf16_acts, aliasing the ring as layer_in */
    /* The kept inputs' tier (FSO_TIER_DEVICE or FSO_TIER_HOST). On the host,
     * inputs 0 .. n_host-1 are copied down into host_acts as the forward
     * writes them and back up into their slot ahead of the backward; the
     * last FSO_ACT_RING (the final x among them) stay in their slots. */
    fso_tier acts_tier;
    void *ring[FSO_ACT_RING];     /* host tier: (N,C) fp32, or bf16 with bf16_acts */
    char *host_acts;              /* host tier: n_host kept inputs (N,C), lent by the caller */
    int n_host;                   /* L + 1 - FSO_ACT_RING, at least 0 */
    uint64_t slot_mark[FSO_ACT_RING]; /* mark after the last copy out of / read of each slot */
    uint64_t act_bytes;           /* bytes the kept inputs moved between device and host
                                     (both ways) since init or the caller last zeroed it:
                                     fso_model_act_bytes_per_step a fso_model_step */
    float *xa, *xb;               /* (N,C) with bf16_acts */
    fso_layer_acts *acts;         /* L sets, or 1 scratch set with checkpointing */
    int n_acts;
    float *rope_cos, *rope_sin;   /* (T, D/2) */
    void *xf;                     /* (N,C) [wt] final norm */
    float *rstdf;                 /* (N) */
    float *logits;                /* (chunk_rows, V) */
    float *losses;                /* (N) */
    int chunk_rows;
    /* backward scratch: the residual's gradient dres and dh (the sum of a
     * norm's output gradients) fp32, the rest [wt] */
    float *dres, *dh;
    void *dq, *dk, *dv, *datt, *dgate, *dup, *dact;

    size_t device_bytes;          /* everything allocated on the backend */
    /* NULL: compute. Else (FSO_N_PARTS) ms per part of a visit (fso_visit_part below):
     * fso_model_step waits that long in place of computing it, lending and
     * returning every block as it would (`fsoff bench pipeline`); the losses
     * are 0 and the gradients the zeros they were lent as. */
    const double *standin_ms;
    char err[512];
} fso_model;

/* The block source: who lends the model its parameters and gradient
 * buffers. The model calls, for every block it touches, in this order:
 *   forward:  params(0); embed; release(0); for each layer l: params(1+l),
 *             release(1+l); params(L+1) [and params(0) when tied]
 *   head:     grads(L+1) [and grads(0) when tied]; grads_done(L+1);
 *             release(L+1) [release(0)]
 *   backward: for l = L-1..0: params(1+l), grads(1+l), grads_done(1+l),
 *             release(1+l); grads(0) if not yet lent; grads_done(0)
 * A gradient buffer is zero when first lent in a micro-step; the model adds
 * into it. forward_logits uses params/release only. fso_model_visits()
 * lists this order. */
typedef struct fso_block_source {
    void *ctx;
    /* block's full parameters, (padded_elems) in the model's working type */
    const void *(*params)(void *ctx, int block);
    void (*release)(void *ctx, int block);
    float *(*grads)(void *ctx, int block);
    void (*grads_done)(void *ctx, int block);
} fso_block_source;

/* Blocks of a model: the embedding, the L layers, the head (L + 2). */
int fso_model_n_blocks(const fso_model_config *mc);

/* What a visit of a block computes. */
typedef enum fso_visit_part {
    FSO_PART_NONE = -1,   /* nothing: the head lends its block while the embedding computes */
    FSO_PART_EMBED_FWD,   /* the embedding's lookup */
    FSO_PART_LAYER_FWD,   /* a layer's forward */
    FSO_PART_HEAD,        /* the head: final norm, logits, loss and their backward */
    FSO_PART_LAYER_BWD,   /* a layer's backward (and its recomputation with checkpointing) */
    FSO_PART_EMBED_BWD,   /* the embedding's backward */
    FSO_N_PARTS,
} fso_visit_part;

/* One use of a block within a micro-step. */
typedef struct fso_block_visit {
    int block;
    fso_visit_part part;
    bool params;          /* the block's parameters are lent (params() ... release()) */
    bool grads;           /* ends with the block's gradients complete (grads_done()) */
} fso_block_visit;

/* The visits of one fso_model_step, in order: the block source's calls
 * above, as the planner times them and the trainer prefetches them (the
 * visits with params are the order of params()). out holds
 * fso_model_max_visits() entries; returns the count. */
int fso_model_max_visits(const fso_model_config *mc);
int fso_model_visits(const fso_model_config *mc, fso_block_visit *out);

/* Lay out blocks for cfg->model and allocate the activations for
 * micro-batch B x T on `be`. world sets the shard padding. bf16
 * (bf16.enabled) makes bf16 the working type: the block source lends bf16
 * weights and the activations inside a layer are stored in bf16 (backend.h,
 * "Types"); with checkpointing each layer's input is kept for backward as
 * bf16 too, and the forward goes on from the rounded value, so the
 * recomputation in backward sees exactly what the forward saw. Returns 0 or
 * negative errno (message in model->err). */
int fso_model_init(fso_model *model, const fso_model_config *mc, fso_backend *be, int B, int T,
                   int world, bool checkpointing, bool bf16);

/* fso_model_init's choices, and where the kept inputs live. */
typedef struct fso_model_opts {
    bool checkpointing, bf16;
    fso_tier acts;        /* FSO_TIER_DEVICE, or FSO_TIER_HOST (needs checkpointing) */
    void *host_acts;      /* FSO_TIER_HOST: fso_model_host_act_bytes_for() bytes of host memory
                             the caller owns and keeps until fso_model_free (pinned on GPUs:
                             copies from pageable memory stall); NULL when that is 0 */
} fso_model_opts;
/* fso_model_init with o's choices. -EINVAL with the reason in err for a
 * host tier without checkpointing or without host_acts. */
int fso_model_init_opts(fso_model *model, const fso_model_config *mc, fso_backend *be, int B,
                        int T, int world, const fso_model_opts *o);
/* Whether kept inputs may go to tier t: the device always; the host with
 * checkpointing (without it every layer's saved activations stay on the
 * device); never NVMe. */
bool fso_model_acts_tier_ok(fso_tier t, bool checkpointing);
void fso_model_free(fso_model *model);

/* Lay out blocks only (no allocation): used by init and by tools that only
 * need sizes. blocks must hold L+2 entries. Each block is padded to a
 * multiple of world x 2048 elements: world is every device that holds a
 * part of it (the devices of all boxes, boxes.h). Returns the number of
 * blocks. */
int fso_model_layout(fso_block_layout *blocks, const fso_model_config *mc, int world);

/* Fill the flat buffers of all blocks (host arrays of padded_elems, padding
 * zero) as Hugging Face Llama initialises: N(0, initializer_range) for linear
 * layers and the embedding, 1 for RMSNorm weights, 0 for biases (which draw
 * nothing); the random stream depends
 * only on the seed, tensor by tensor in HF order, not on the world size. */
void fso_model_init_flat(const fso_model *model, float **flat, uint64_t seed);
/* The same, one block at a time: call for blocks 0, 1, ... in order with one
 * rng seeded by fso_rng_seed(rng, seed); flat (padded_elems) host. */
struct fso_rng;
void fso_model_init_block(const fso_model *model, int block, float *flat, struct fso_rng *rng);

/* Between HF order (n_params floats, no padding) and flat block buffers
 * (host arrays). */
void fso_model_flat_from_hf(const fso_model *model, float **flat, const float *hf);
void fso_model_flat_to_hf(const fso_model *model, float *const *flat, float *hf);

/* The scale of each counted target's loss gradient in an optimizer step
 * of `micro` micro-batches (all devices) of n positions, `counted` of whose
 * targets count (>= 0): 1/counted, so the step's gradient is that of the
 * mean loss over its counted targets (torch's cross_entropy with
 * ignore_index). When every target counts it is computed as
 * (1/micro)/n in fp32, fsoff's arithmetic for data without masks, for its
 * bits. 0 when none counts. */
float fso_model_loss_scale(int64_t counted, int64_t n, int micro);

/* One micro-batch: forward, loss, backward, queued on the backend without
 * waiting for it. inputs and targets (B*T) host int32, read before the
 * next sync; a target < 0 does not count (its loss is 0). pos (B*T) host
 * int32, each token's position in its document (data.h), or NULL: no
 * documents, every row one stream (RoPE at 0..T-1, causal attention over
 * the row). Gradients of each counted target's loss * loss_scale
 * (fso_model_loss_scale) are added into the lent buffers. *loss_sum += the
 * loss summed over the B*T positions (unscaled; 0 for targets that do not
 * count), in place once the backend has synced (backend.h sum). */
void fso_model_step(fso_model *model, const fso_block_source *src, const int32_t *inputs,
                    const int32_t *targets, const int32_t *pos, float loss_scale,
                    double *loss_sum);

/* Forward only, for a validation loss: inputs, targets and pos as
 * fso_model_step's; *loss_sum += the loss summed over the B*T positions
 * (delivered as fso_model_step's), no gradients; the block source is asked
 * for parameters only. */
void fso_model_eval(fso_model *model, const fso_block_source *src, const int32_t *inputs,
                    const int32_t *targets, const int32_t *pos, double *loss_sum);

/* Forward only: logits (B*T, V) copied to host `logits`. */
void fso_model_forward_logits(fso_model *model, const fso_block_source *src,
                              const int32_t *inputs, float *logits);

/* Bytes of activations and scratch this model allocated on its device. */
size_t fso_model_activation_bytes(const fso_model *model);
/* What fso_model_init would allocate, without allocating: for planning. */
size_t fso_model_activation_bytes_for(const fso_model_config *mc, int B, int T,
                                      bool checkpointing, bool bf16);
/* The same with the kept inputs on tier `acts` (fso_model_init_opts). */
size_t fso_model_activation_bytes_tier(const fso_model_config *mc, int B, int T,
                                       bool checkpointing, bool bf16, fso_tier acts);
/* Host memory the kept inputs take on tier `acts` (0 on the device): what
 * fso_model_opts.host_acts must hold. */
size_t fso_model_host_act_bytes_for(const fso_model_config *mc, int B, int T,
                                    bool checkpointing, bool bf16, fso_tier acts);
/* Bytes the kept inputs move between device and host in one
 * fso_model_step on tier `acts`, both ways: each of the inputs that leave
 * the ring, down in the forward and up in the backward. 0 on the device. */
uint64_t fso_model_act_bytes_per_step(const fso_model_config *mc, int B, int T,
                                      bool checkpointing, bool bf16, fso_tier acts);

/* The fp32 working space the CPU backends hold for this model's bf16
 * tensors (kernels/cpu_dtype.c widens an op's bf16 arguments into it): the
 * most any one op of a step needs. 0 without bf16. */
size_t fso_model_cpu_widen_bytes_for(const fso_model_config *mc, int B, int T);

/* The scratch the CUDA backend grows to for this model's widest op, in
 * its 2 MiB steps (kernels/cuda/cuda_backend.c): for the planner. */
size_t fso_model_cuda_scratch_bytes_for(const fso_model_config *mc, int B, int T, bool bf16);

/* Forward FLOPs per token (2 per multiply-add, attention included, causal
 * half counted): for tok/s and MFU reporting. */
double fso_model_flops_per_token(const fso_model_config *mc, int T);

#endif
