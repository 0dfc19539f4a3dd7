/* train.h — the training step and the training run.
 *
 * A trainer holds the model, the AdamW state (fp32 m and v per block, laid
 * out like the parameters) and the step counter. One optimizer step runs
 * gradient_accumulation_steps micro-batches, takes the exact global gradient
 * norm, folds the clipping factor into AdamW (torch's clip_grad_norm_:
 * coef = clip / (norm + 1e-6), applied when below 1) and updates every tensor
 * with its own weight-decay flag, the learning rate coming from the scheduler.
 */
#ifndef FSO_TRAIN_H
#define FSO_TRAIN_H

#include <stdint.h>

#include "backend.h"
#include "config.h"
#include "model.h"

typedef struct fso_step_stats {
    int64_t step;            /* from 1 */
    double loss;             /* mean over the step's micro-batches */
    double lr;
    double grad_norm;        /* before clipping */
    double clip_coef;        /* applied factor, 1 when not clipped */
    double step_ms;
    int64_t tokens;          /* tokens in this step */
} fso_step_stats;

typedef struct fso_trainer {
    const fso_config *cfg;
    fso_backend *be;
    fso_model model;
    float **m, **v;          /* per block (padded_elems) */
    int64_t step;            /* optimizer steps taken */
    char err[512];
} fso_trainer;

/* Build the model for cfg on be, initialise the parameters from cfg->seed and
 * zero the optimizer state. Returns 0 or negative errno (tr->err). */
int fso_trainer_init(fso_trainer *tr, const fso_config *cfg, fso_backend *be);
void fso_trainer_free(fso_trainer *tr);

/* One optimizer step over grad_accum micro-batches: inputs and targets hold
 * grad_accum * B * T tokens. Returns 0, or -ERANGE (tr->err) when the loss
 * or the gradient norm is not finite; the update is then not applied. */
int fso_trainer_step(fso_trainer *tr, const int32_t *inputs, const int32_t *targets,
                     fso_step_stats *st);

typedef struct fso_run_opts {
    const char *metrics_path;   /* NULL: none */
    const char *devices;        /* "cpu" or "auto" */
} fso_run_opts;

/* The whole run: backend, data, trainer, step lines, metrics, summary.
 * Returns 0, or a negative errno after printing one error line. */
int fso_train_run(const fso_config *cfg, const fso_run_opts *opts);

#endif
