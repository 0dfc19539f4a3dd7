/* hf.h — Hugging Face Llama, Mistral and Qwen2 folders: reading one into
 * fsoff's blocks (`--init-from DIR`, model.init_from) and writing one
 * (export).
 *
 * A folder holds config.json (LlamaConfig, MistralConfig or Qwen2Config;
 * engine/config/config_hf.c reads it into the "model" section) and the
 * weights in safetensors (safetensors.h): model.safetensors, or shards
 * listed by model.safetensors.index.json. Tensor names and shapes are
 * transformers' LlamaForCausalLM ones (MistralForCausalLM's are the same;
 * Qwen2ForCausalLM adds q/k/v_proj.bias), in the order of model.h's block
 * tables ("Hugging Face order"): embed_tokens, per layer input_layernorm,
 * q/k/v_proj (each with its bias in Qwen2), o_proj, post_attention_layernorm,
 * gate/up/down_proj, model.norm, lm_head. With tie_word_embeddings there is
 * no lm_head.weight in the files, as transformers saves it.
 *
 * Neither direction holds the whole model in memory. Reading fills one
 * block's flat buffer at a time straight from the files (pread, converted
 * to fp32 in pieces), and the trainer moves it to the tier where that
 * block's shards live (zero_shard.c). Writing asks a source for each
 * tensor's fp32 values a piece at a time, rounds them to the chosen type
 * and appends them to the current shard.
 *
 * STABLE INTERFACE: fso_hf_source, fso_hf_export_opts and fso_hf_export are
 * what `fsoff export CKPT OUTDIR` builds on (a checkpoint reader is a
 * source). Change them only together with their users.
 */
#ifndef FSO_HF_H
#define FSO_HF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "config/config.h"
#include "model.h"

/* ------------------------------------------------------------------ export */

/* What an exported folder's shards hold. fp32 values are rounded to nearest
 * even; a finite value beyond fp16's range is an error naming the tensor. */
typedef enum fso_hf_dtype { FSO_HF_F32 = 0, FSO_HF_BF16, FSO_HF_F16 } fso_hf_dtype;

/* "fp32", "bf16", "fp16" (also "float32", "bfloat16", "float16"): 0, or
 * -EINVAL for anything else. */
int fso_hf_dtype_parse(const char *s, fso_hf_dtype *out);
/* "fp32", "bf16", "fp16". */
const char *fso_hf_dtype_name(fso_hf_dtype d);
/* torch's names, as config.json's torch_dtype: "float32", "bfloat16", "float16". */
const char *fso_hf_dtype_torch_name(fso_hf_dtype d);

/* Largest piece of a tensor one read() is asked for (16 MiB of fp32). */
#define FSO_HF_PIECE_ELEMS ((size_t)4 << 20)

/* Where the exported values come from: the live trainer's fp32 master
 * (fso_zero_export_hf, zero.h), or a checkpoint. */
typedef struct fso_hf_source {
    void *ctx;
    /* Put elements [first, first + n) of tensor t of block `block` into dst
     * as fp32, row-major as PyTorch stores the tensor. t is an entry of
     * fso_model_layout()'s table for the exported model: t->name is the
     * Hugging Face name, t->numel its size, t->offset_elems its place in
     * the block's flat buffer (the same for every world size). The writer
     * asks for the blocks 0 .. L+1 in order, each block's tensors in table
     * order, each tensor in pieces back to back from element 0, n at most
     * FSO_HF_PIECE_ELEMS: a source can stream block by block. Returns 0, or
     * a negative errno with a message in err; the writer then stops,
     * removes the files it wrote and returns that error. */
    int (*read)(void *ctx, int block, const fso_tensor_desc *t, size_t first, size_t n,
                float *dst, char *err, size_t errlen);
} fso_hf_source;

/* ------------------------------------------------------------------ carried files */

/* What a folder holds besides the weights that an exported folder should
 * carry from the folder a run started from (model.init_from): config.json's
 * fields fsoff does not model (the token ids bos_token_id, eos_token_id,
 * pad_token_id, transformers_version, ...), and the tokenizer's and the
 * generation config's files, each at most FSO_HF_CARRIED_MAX_BYTES. */
#define FSO_HF_CARRIED_MAX_BYTES ((size_t)64 << 20)

/* The files carried, in this order; NULL-terminated. */
extern const char *const fso_hf_carried_files[];
#define FSO_HF_CARRIED_FILES 6

/* Where a run's carried fields and files came from. */
typedef enum fso_hf_extras_origin {
    FSO_HF_EXTRAS_SCRATCH = 0, /* random parameters: no tokenizer, no token ids */
    FSO_HF_EXTRAS_FOLDER,      /* a Hugging Face folder (model.init_from) */
    FSO_HF_EXTRAS_UNRECORDED,  /* a checkpoint written before fsoff recorded them */
} fso_hf_extras_origin;

typedef struct fso_hf_file {
    const char *name;          /* an entry of fso_hf_carried_files */
    void *data;
    size_t bytes;
} fso_hf_file;

typedef struct fso_hf_extras {
    fso_hf_extras_origin origin;
    char from[4096];           /* the folder they were read from ("" unknown) */
    json_t *config;            /* config.json's keys that fso_hf_config_write does not
                                  write itself, as they were; NULL: none */
    fso_hf_file files[FSO_HF_CARRIED_FILES];
    int n_files;
} fso_hf_extras;

/* Read folder dir's carried fields and files into x (origin FOLDER): every
 * file of fso_hf_carried_files that exists; one larger than
 * FSO_HF_CARRIED_MAX_BYTES, or a config.json that is not a JSON object, is
 * refused naming the file. 0 or a negative errno with err. */
int fso_hf_extras_read(fso_hf_extras *x, const char *dir, char *err, size_t errlen);
/* Free what x holds; x becomes SCRATCH. A zeroed x is fine. */
void fso_hf_extras_free(fso_hf_extras *x);
/* The file of that name among x's, or NULL. */
const fso_hf_file *fso_hf_extras_file(const fso_hf_extras *x, const char *name);
/* One line for the user on what an export carries or cannot provide:
 * the token ids and files carried and the files the folder lacked, or why
 * there are none (SCRATCH, UNRECORDED) with what to do. */
void fso_hf_extras_describe(const fso_hf_extras *x, char *buf, size_t len);

typedef struct fso_hf_export_opts {
    fso_hf_dtype dtype;
    const fso_hf_extras *extras; /* written into config.json and beside it; NULL: none */
    uint64_t max_shard_bytes;   /* 0: FSO_HF_MAX_SHARD_BYTES; a tensor larger than the
                                   limit gets a shard of its own, as transformers does */
} fso_hf_export_opts;

#define FSO_HF_MAX_SHARD_BYTES ((uint64_t)5000000000) /* transformers' "5GB" */

/* Write a Hugging Face folder for model `mc` into outdir (created when
 * missing, mode 0755; refused when it already holds config.json or
 * model*.safetensors*): config.json, then model.safetensors, or shards
 * model-00001-of-0000N.safetensors of at most max_shard_bytes each (header
 * included) with model.safetensors.index.json, and o->extras' files (one
 * that outdir already holds is left as it is). Every safetensors file gets
 * {"format": "pt"} metadata, is written under a temporary name, fsynced
 * and renamed into place; the index comes last, so a folder with an index
 * is complete. Returns 0, or a negative errno with a message naming the
 * file (and the tensor) in err, having removed what it wrote. */
int fso_hf_export(const char *outdir, const fso_model_config *mc, const fso_hf_export_opts *o,
                  const fso_hf_source *src, char *err, size_t errlen);

/* config.json for model mc whose shards hold dtype (config_hf.c): the
 * architectures and model_type of mc's type, the configuration class's keys
 * (LlamaConfig's; MistralConfig's sliding_window; Qwen2Config's
 * use_sliding_window, sliding_window and max_window_layers), rope_scaling,
 * tie_word_embeddings, torch_dtype, and then carried's keys (NULL: none) as
 * they were. 0 or -EIO. */
int fso_hf_config_write(FILE *f, const fso_model_config *mc, fso_hf_dtype dtype,
                        const json_t *carried);
/* Whether fso_hf_config_write writes config.json's key itself (from the
 * model), rather than carrying it from the folder a run started from. */
bool fso_hf_config_writes_key(const char *key);

/* ------------------------------------------------------------------ import */

typedef struct fso_hf_folder fso_hf_folder;

/* Open the weights of folder dir for model mc (its "model" section, as
 * config_hf.c read it from dir/config.json): model.safetensors when it
 * exists, else model.safetensors.index.json and the shards it names. Every
 * file's header is checked as the safetensors reference implementation
 * does (safetensors.h), and every tensor the model needs must be there with
 * its shape and dtype F32, BF16 or F16; a tensor the model does not have is
 * refused by name (o_proj and MLP biases, other norms among them), except transformers' rotary
 * inv_freq buffers and, when tied, lm_head.weight, which are skipped as
 * transformers skips them. Nothing is read but headers. 0 or a negative
 * errno with a message naming the file and the tensor in err. */
int fso_hf_open(fso_hf_folder **out, const char *dir, const fso_model_config *mc, char *err,
                size_t errlen);
void fso_hf_close(fso_hf_folder *h);

/* Block b's tensors as fp32 into flat at their offsets (fso_model_layout's,
 * the same for every world size), zeros between them; flat's padding after
 * the last tensor is left as it is. Read straight from the files: 0 or a
 * negative errno with err (a short read names the file and offset). */
int fso_hf_read_block(fso_hf_folder *h, int block, float *flat, char *err, size_t errlen);

#endif
