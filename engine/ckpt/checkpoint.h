/* checkpoint.h — crash-safe checkpoints of a training run, and reading them
 * back: to resume on any device count and tiers, or to hand out the
 * parameters in Hugging Face's order (export).
 *
 * A save directory (checkpoint.dir, --save) holds:
 *   step-00000020/          one complete checkpoint per folder
 *     state.bin             per block, its master weights, AdamW m and AdamW v
 *     manifest.json         what a resume needs besides the tensors, and where
 *                           every tensor and checksummed chunk lies in state.bin
 *     tokenizer.json, ...   with --init-from: the folder's tokenizer and generation
 *                           files an export carries (the manifest's "hf")
 *   latest                  "step-00000020\n": the newest complete checkpoint
 *   .lock                   held (flock) by the run saving here
 *
 * state.bin. The blocks in order (the embedding, the layers, the head), and
 * for each its master, m and v one after the other, each the block's flat
 * buffer: its tensors at their offsets and the padding between them,
 * rounded up to whole 4 KiB pages. These are the same bytes at any device
 * count, with tensors in Hugging Face's order. A device's shard of a block
 * is one contiguous page-aligned range of each kind, so the saver writes
 * each shard with large O_DIRECT writes straight from where it lives (or
 * clones it from the NVMe store), front to back as it goes block by block,
 * and a load at another device count reads the same ranges cut differently.
 *
 * manifest.json: the format and its version, the step, the data position,
 * the random state, the device count and tiers it ran on (with the
 * per-block split: resident_blocks, device_state_blocks, device_state_from,
 * state.h fso_block_rule; any other split resumes from it), the resolved
 * configuration (a configuration file that loads back to it), every
 * tensor's name, shape and place, and a CRC-32C of every chunk of
 * state.bin (chunks tile the file; each is a piece of one device's shard of
 * one block, at most 8 MiB).
 *
 * Crash safety: a save writes into DIR/.tmp-step-N, fsyncs state.bin,
 * manifest.json and the folder, renames it to DIR/step-N and fsyncs DIR,
 * then replaces `latest` (write latest.tmp, fsync, rename, fsync DIR). Only
 * then are checkpoints beyond checkpoint.keep deleted, oldest step first,
 * never the one `latest` names, following no symlinks. A kill at any moment
 * leaves `latest` naming a complete checkpoint (or no `latest` before the
 * first save completes). */
#ifndef FSO_CHECKPOINT_H
#define FSO_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "hf/hf.h"
#include "zero/zero.h"

#define FSO_CKPT_FORMAT "fsoff-checkpoint"
#define FSO_CKPT_VERSION 1
#define FSO_CKPT_DATA "state.bin"
#define FSO_CKPT_MANIFEST "manifest.json"
#define FSO_CKPT_LATEST "latest"
#define FSO_CKPT_ERR_MAX 1024

/* The saved kinds in the order a block holds them, as the manifest names
 * them: "master", "adam_m", "adam_v". The manifest's own spelling, not
 * state.h's fso_kind_key ("m", "v"): checkpoints already written name them
 * so. */
extern const char *const fso_ckpt_kind_names[FSO_ZERO_SAVED_KINDS];

/* Where each block's kinds lie in state.bin for a model: the same at any
 * device count. */
typedef struct fso_ckpt_layout {
    int n_blocks;
    size_t *elems;            /* [b]: saved elements of block b (used, rounded to 1024) */
    uint64_t *off;            /* [i * n_blocks + b]: byte offset of saved kind i of block b */
    uint64_t total_bytes;     /* the whole file */
} fso_ckpt_layout;
int fso_ckpt_layout_init(fso_ckpt_layout *l, const fso_model_config *mc);
void fso_ckpt_layout_free(fso_ckpt_layout *l);

/* ------------------------------------------------------------------ saving */

/* What a checkpoint records besides the state. */
typedef struct fso_ckpt_meta {
    const fso_config *cfg;    /* the run's configuration as it runs (tiers included) */
    int64_t data_position;    /* the token the next batch starts at (fso_data.pos) */
    uint64_t data_tokens;     /* the data set's size in tokens */
    const fso_hf_extras *hf;  /* what an export carries (the trainer's, fso_trainer.hf),
                                 saved beside state.bin and in the manifest's "hf"; NULL:
                                 the run started from scratch. Valid until the save ends. */
} fso_ckpt_meta;

/* The outcome of one save. */
typedef struct fso_ckpt_result {
    int rc;                   /* 0, or negative errno (err says why) */
    int64_t step;
    char path[4200];          /* the checkpoint folder (on failure: the save dir) */
    uint64_t bytes;           /* state.bin and manifest.json */
    uint64_t cloned_bytes;    /* of which shared with the NVMe store by reflink */
    double seconds;           /* from the start of the save to `latest` naming it */
    double exposed_ms;        /* what it added to training: the run's own waits for it and
                                 the longest any device's optimizer waited for it */
    char err[FSO_CKPT_ERR_MAX];
} fso_ckpt_result;

typedef struct fso_ckpt_saver fso_ckpt_saver;

/* Saves into dir, keeping `keep` complete checkpoints: creates dir when its
 * parent exists, takes its lock (another fsoff saving there is an error),
 * removes temporary folders a killed save left. 0 or negative errno with
 * err. */
int fso_ckpt_saver_create(fso_ckpt_saver **out, const char *dir, int keep, char *err,
                          size_t errlen);
/* Waits for a save still running, releases the lock. NULL is fine. */
void fso_ckpt_saver_destroy(fso_ckpt_saver *sv);
/* Tests: every later save pauses halfway through its data (fso_pause_at
 * file); NULL: never. The saver keeps the pointer. */
void fso_ckpt_saver_pause_halfway(fso_ckpt_saver *sv, const char *file);

/* A test's hold on a run: creates file and waits until the test removes
 * it, so that the test acts (a kill, a signal) at a moment it chose. */
void fso_pause_at(const char *file);

/* Between steps: save the state of step fso_zero_steps(z) on the saver's
 * own thread while training goes on (fso_zero_save_arm). A save still
 * running is waited for first. 0, or negative errno with err when it could
 * not start (nothing was changed on disk). */
int fso_ckpt_save_begin(fso_ckpt_saver *sv, fso_zero *z, const fso_ckpt_meta *meta, char *err,
                        size_t errlen);
/* 1 and *res when a save has finished since the last call (successful or
 * not), 0 when none has (wait: block until the running one finishes). */
int fso_ckpt_save_poll(fso_ckpt_saver *sv, bool wait, fso_ckpt_result *res);
/* The step of the newest complete checkpoint this saver wrote, -1 none. */
int64_t fso_ckpt_saver_last_step(const fso_ckpt_saver *sv);

/* ------------------------------------------------------------------ reading */

typedef struct fso_ckpt fso_ckpt;

/* path: a checkpoint folder, or a save dir (its `latest`). Reads and checks
 * the manifest and the data file's size; chunks are checked as they are
 * read. 0 or negative errno with err naming the file (and the offset). */
int fso_ckpt_open(fso_ckpt **out, const char *path, char *err, size_t errlen);
/* Whether a save folder holds anything of a completed save: 0 when it does
 * not exist or holds neither a manifest, a `latest` nor a step-N folder (a
 * killed save's temporary folder is not a checkpoint), so a run may start
 * from step 0 there; 1 when it does (fso_ckpt_open then says whether it is
 * whole); negative errno with err when it cannot be read. */
int fso_ckpt_dir_has_saves(const char *dir, char *err, size_t errlen);
void fso_ckpt_close(fso_ckpt *ck);

const char *fso_ckpt_path(const fso_ckpt *ck);     /* the checkpoint folder */
int64_t fso_ckpt_step(const fso_ckpt *ck);
int64_t fso_ckpt_data_position(const fso_ckpt *ck);
/* The model the checkpoint holds (its configuration's model section). */
const fso_model_config *fso_ckpt_model(const fso_ckpt *ck);

/* Whether cfg (on cfg->world devices) may continue from ck: a change that
 * makes the checkpoint meaningless (the model's shape or vocabulary) is
 * refused naming the key (-EINVAL, err); every other change (steps,
 * devices, tiers, save dir, schedule length, ...) is accepted and listed in
 * `said`, one line ("" when nothing changed). */
int fso_ckpt_check_config(const fso_ckpt *ck, const fso_config *cfg, char *said, size_t saidlen,
                          char *err, size_t errlen);

/* Load master, m and v into z (created for a configuration that passed
 * fso_ckpt_check_config), block by block with one block in memory,
 * checking every chunk's checksum; the working parameters follow the
 * master; z's step becomes the checkpoint's. 0 or negative errno with err
 * (a corrupted chunk names the file and the offset). */
int fso_ckpt_load(fso_ckpt *ck, fso_zero *z, char *err, size_t errlen);

/* The fp32 master in Hugging Face's order, streamed: tensor by tensor, each
 * in slices of about slice_bytes (0: whole tensors), every chunk checked.
 * What `fsoff export` converts. */
typedef struct fso_ckpt_tensor {
    const char *name;         /* Hugging Face name: "model.layers.0.mlp.up_proj.weight" */
    int rows, cols;           /* row-major; cols = 1 for a vector */
    size_t numel;
    size_t first, n;          /* this slice: elements [first, first + n) of the tensor */
    const float *data;        /* n values, valid until the next call */
} fso_ckpt_tensor;
typedef struct fso_ckpt_iter fso_ckpt_iter;
int fso_ckpt_tensors_begin(fso_ckpt *ck, size_t slice_bytes, fso_ckpt_iter **out, char *err,
                           size_t errlen);
/* 1 with the next slice in *t, 0 after the last, negative errno with err. */
int fso_ckpt_tensors_next(fso_ckpt_iter *it, fso_ckpt_tensor *t, char *err, size_t errlen);
void fso_ckpt_tensors_end(fso_ckpt_iter *it);

/* What an export of ck carries (hf.h): the token ids and files the run
 * recorded from the folder it started from, read from the checkpoint
 * folder and checked against the manifest's sizes and CRCs (origin
 * FOLDER), or none: the run started from scratch (SCRATCH), or an earlier
 * fsoff wrote the checkpoint (UNRECORDED). 0 or negative errno with err
 * naming the file; x is then empty. */
int fso_ckpt_hf_extras(const fso_ckpt *ck, fso_hf_extras *x, char *err, size_t errlen);

/* The master as a Hugging Face folder (hf.h, fso_hf_export): config.json
 * and safetensors of o->dtype, streamed from the checkpoint, with
 * o->extras, or when that is NULL the checkpoint's own (fso_ckpt_hf_extras).
 * 0 or negative errno with err. */
int fso_ckpt_export_hf(fso_ckpt *ck, const char *outdir, const fso_hf_export_opts *o,
                       char *err, size_t errlen);

#endif
