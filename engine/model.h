/* model.h — a Llama-family decoder (Hugging Face LlamaConfig semantics) over
 * the backend interface.
 *
 * Parameters are grouped in blocks (DESIGN §4): block 0 is the token
 * embedding, blocks 1..L the transformer layers, block L+1 the head (final
 * RMSNorm and, unless tied, the LM head). Each block's parameters are one flat
 * fp32 buffer with a table of named tensors at 64-element aligned offsets,
 * padded so it splits into `world` equal shards of whole 4 KiB pages: the unit
 * that sharding, streaming and offload work on. Walking the blocks in order
 * and their tables in order visits the tensors in Hugging Face's order.
 *
 * One training micro-step is fso_model_step(): forward over all blocks, the
 * loss, backward, gradients accumulated into each block's flat gradient
 * buffer. With activation checkpointing only each layer's input is kept and
 * the layer is recomputed during backward.
 */
#ifndef FSO_MODEL_H
#define FSO_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "config.h"

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
} fso_tensor_kind;

typedef enum fso_block_kind { FSO_BLOCK_EMBED = 0, FSO_BLOCK_LAYER, FSO_BLOCK_HEAD } fso_block_kind;

#define FSO_BLOCK_MAX_TENSORS 9

typedef struct fso_tensor_desc {
    fso_tensor_kind kind;
    char name[64];          /* Hugging Face name: model.layers.3.mlp.up_proj.weight */
    int rows, cols;         /* (rows, cols) row-major; cols = 1 for vectors */
    size_t offset_elems;    /* within the block's flat buffer */
    size_t numel;
    bool is_norm;           /* RMSNorm weight: initialised to 1 */
    bool decay;             /* AdamW weight decay applies */
} fso_tensor_desc;

typedef struct fso_block_layout {
    fso_block_kind kind;
    int layer;              /* FSO_BLOCK_LAYER: 0..L-1; else -1 */
    int n_tensors;
    fso_tensor_desc tensors[FSO_BLOCK_MAX_TENSORS];
    size_t used_elems;      /* end of the last tensor */
    size_t padded_elems;    /* multiple of world * 1024 */
} fso_block_layout;

/* Activations of one layer (N = B*T rows). */
typedef struct fso_layer_acts {
    float *h1;       /* (N,C) attention RMSNorm output */
    float *rstd1;    /* (N) */
    float *q;        /* (N,H*D) after RoPE */
    float *k, *v;    /* (N,Hkv*D), k after RoPE */
    float *probs;    /* (B,H,T,T) */
    float *att;      /* (N,H*D) */
    float *x2;       /* (N,C) residual after attention */
    float *h2;       /* (N,C) MLP RMSNorm output */
    float *rstd2;    /* (N) */
    float *gate, *up, *act; /* (N,F) */
} fso_layer_acts;

typedef struct fso_model {
    fso_model_config mc;
    fso_backend *be;
    int B, T, world;
    bool checkpointing;

    int n_blocks;                 /* L + 2 */
    fso_block_layout *blocks;
    float **params;               /* per block, (padded_elems) device fp32 */
    float **grads;                /* per block, (padded_elems) device fp32 */
    size_t n_params;              /* real parameters, padding excluded */

    /* activations (device) */
    int32_t *tokens, *targets;    /* (N) */
    float **layer_in;             /* L+1 pointers (N,C): input of each layer, then the final x */
    fso_layer_acts *acts;         /* L sets, or 1 scratch set with checkpointing */
    int n_acts;
    float *rope_cos, *rope_sin;   /* (T, D/2) */
    float *xf, *rstdf;            /* (N,C), (N) final norm */
    float *logits;                /* (chunk_rows, V) */
    float *losses;                /* (N) */
    int chunk_rows;
    /* backward scratch */
    float *dres, *dh, *dq, *dk, *dv, *datt, *dgate, *dup, *dact;
    float *losses_host;           /* (N) host */

    size_t device_bytes;          /* everything allocated on the backend */
    char err[512];
} fso_model;

/* Lay out blocks for cfg->model and allocate parameters, gradients and
 * activations for micro-batch B x T on `be`. Returns 0 or negative errno
 * (message in model->err). */
int fso_model_init(fso_model *model, const fso_model_config *mc, fso_backend *be, int B, int T,
                   int world, bool checkpointing);
void fso_model_free(fso_model *model);

/* Lay out blocks only (no allocation): used by init and by tools that only
 * need sizes. blocks must hold L+2 entries. Returns the number of blocks. */
int fso_model_layout(fso_block_layout *blocks, const fso_model_config *mc, int world);

/* Initialise parameters as Hugging Face Llama does: N(0, initializer_range)
 * for linear layers and the embedding, 1 for RMSNorm weights; the stream of
 * random numbers depends only on the seed, tensor by tensor in HF order. */
void fso_model_init_params(fso_model *model, uint64_t seed);

/* Copy all parameters (or gradients) from/to a host array in HF order
 * (n_params floats, no padding). */
void fso_model_load_params(fso_model *model, const float *hf);
void fso_model_store_params(const fso_model *model, float *hf);
void fso_model_store_grads(const fso_model *model, float *hf);

void fso_model_zero_grads(fso_model *model);

/* One micro-batch: forward, loss, backward. inputs and targets (B*T) host
 * int32; gradients of loss * grad_scale are added into model->grads.
 * Returns the mean loss over the B*T positions (before grad_scale). */
double fso_model_step(fso_model *model, const int32_t *inputs, const int32_t *targets,
                      float grad_scale);

/* Forward only: logits (B*T, V) copied to host `logits`. */
void fso_model_forward_logits(fso_model *model, const int32_t *inputs, float *logits);

/* Global squared L2 norm of all gradients, accumulated in double. */
double fso_model_grad_sqnorm(fso_model *model);

/* Forward FLOPs per token (2 per multiply-add, attention included, causal
 * half counted): for tok/s and MFU reporting. */
double fso_model_flops_per_token(const fso_model_config *mc, int T);

#endif
