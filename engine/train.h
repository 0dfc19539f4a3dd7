/* train.h — the training step and the training run.
 *
 * A trainer owns the sharded training state (zero.h) across the process's
 * devices. One optimizer step runs gradient_accumulation_steps micro-batches
 * on every device, takes the exact global gradient norm, folds the clipping
 * factor into AdamW (torch's clip_grad_norm_: coef = clip / (norm + 1e-6),
 * applied when below 1) and updates every tensor with its own weight-decay
 * flag, the learning rate coming from the scheduler.
 */
#ifndef FSO_TRAIN_H
#define FSO_TRAIN_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "config/config.h"
#include "hf/hf.h"
#include "model.h"
#include "zero/zero.h"

typedef struct fso_trainer {
    const fso_config *cfg;
    fso_zero *zero;          /* the state; fso_zero_steps() counts the steps taken */
    fso_hf_extras hf;        /* what an export carries: model.init_from's token ids and
                                tokenizer files, or a resumed checkpoint's */
    char err[512];
} fso_trainer;

/* Build the sharded state for cfg (cfg->world devices), initialise the
 * parameters from cfg->seed (or model.init_from's folder, whose carried
 * fields and files go into tr->hf) and zero the optimizer state. Returns 0
 * or negative errno (tr->err). */
int fso_trainer_init(fso_trainer *tr, const fso_config *cfg);
/* The same on box cfg->box of several (boxes.h; zero.h fso_zero_create_on):
 * rails joins each device to the other boxes; NULL on one box. */
struct fso_rails;
int fso_trainer_init_on(fso_trainer *tr, const fso_config *cfg, const struct fso_rails *rails);
/* The fp32 master as a Hugging Face folder (fso_zero_export_hf) with
 * tr->hf's fields and files; said gets one line on what was carried or
 * cannot be (fso_hf_extras_describe). 0 or negative errno with err. */
int fso_trainer_export_hf(fso_trainer *tr, const char *outdir, fso_hf_dtype dtype, char *said,
                          size_t saidlen, char *err, size_t errlen);
void fso_trainer_free(fso_trainer *tr);
/* Wait for the last update (overlapped schedules); waited_ms is the time
 * that update was exposed. 0 or negative errno (tr->err). */
int fso_trainer_finish(fso_trainer *tr, double *waited_ms);

/* Tokens one step consumes: world * boxes * grad_accum micro-batches of
 * B*T (every box reads them all and computes its own). */
size_t fso_trainer_step_tokens(const fso_config *cfg);

/* One optimizer step: inputs and targets (and pos, or NULL) hold
 * fso_trainer_step_tokens() tokens as fso_data_next() gives them,
 * micro-batch a of device r of box k at number a * world * boxes + k *
 * world + r; its statistics into
 * *st (zero.h, fso_zero_step). Returns 0, or negative errno (tr->err):
 * -ERANGE when the loss or the gradient norm is not finite, -ENODATA when
 * no target counts, an I/O error; the update is then not applied. */
int fso_trainer_step(fso_trainer *tr, const int32_t *inputs, const int32_t *targets,
                     const int32_t *pos, fso_zero_step *st);

typedef struct fso_run_opts {
    const char *metrics_path;   /* NULL: none */
    const char *devices;        /* as given to --devices */
    FILE *out;                  /* the plan, banner, step lines and summary; NULL: stdout
                                   (errors and warnings go to stderr) */
    const char *resume;         /* NULL: from step 0; "": from the latest checkpoint in
                                   checkpoint.dir; else a checkpoint or a save folder */
    bool resume_auto;           /* with resume "": from step 0 when no save has completed
                                   in checkpoint.dir yet (one notice line) */
    bool auto_batch;            /* --auto-batch: the planner splits the global batch into
                                   micro-batch x accumulation (plan.h fso_plan_batch) */
    volatile sig_atomic_t *stop;/* set to a signal's number when one asks the run to stop:
                                   it finishes the step in progress, saves (with
                                   checkpoint.dir) and returns FSO_RUN_STOPPED; NULL: never */
    /* Tests hold the run at a known moment (fso_pause_at): halfway through
     * each save when pause_save is set, and after step pause_step's line,
     * metrics and due save began when pause_step_file is set. fsoff reads
     * them from FSOFF_TEST_SAVE_PAUSE=FILE and FSOFF_TEST_STEP_PAUSE=N:FILE
     * (cli.c); NULL: never. */
    const char *pause_save;
    const char *pause_step_file;
    int64_t pause_step;
} fso_run_opts;

/* fso_train_run's answer when a signal stopped the run before its last step
 * (its save, with checkpoint.dir, made). */
#define FSO_RUN_STOPPED 1

/* The whole run: the plan (the placement chosen where the configuration
 * does not pin it, checked against the measured steps after five), data,
 * trainer, step lines, metrics, summary. Holds no state between calls:
 * several runs may go on at once in one process. Returns 0 (done),
 * FSO_RUN_STOPPED, or a negative errno after printing one error line. */
int fso_train_run(const fso_config *cfg, const fso_run_opts *opts);

#endif
