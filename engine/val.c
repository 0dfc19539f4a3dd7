/* val.c — the validation loss (val.h): the held-out batches, read once,
 * and a forward over them on the trainer's devices (fso_zero_eval). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"
#include "util.h"
#include "val.h"

int fso_val_init(fso_val *v, const fso_config *cfg)
{
    memset(v, 0, sizeof *v);
    if (!cfg->data.val_path[0])
        return 0;
    v->on = true;
    v->asked = cfg->data.val_batches;
    v->every = cfg->data.val_every;
    v->bt = (size_t)cfg->micro_batch * cfg->data.seq_len;
    fso_config *vc = malloc(sizeof *vc);
    if (!vc) {
        snprintf(v->err, sizeof v->err, "out of host memory");
        return -ENOMEM;
    }
    *vc = *cfg;
    memcpy(vc->data.path, cfg->data.val_path, sizeof vc->data.path);
    int rc = fso_data_init(&v->data, vc);
    free(vc);
    if (rc < 0) {
        snprintf(v->err, sizeof v->err, "data.val_path: %s", v->data.err);
        return rc;
    }
    /* whole windows from the start; a file shorter than one micro-batch
     * still gives one (its rows repeat tokens, as the training data's) */
    size_t fit = (v->data.n_tokens - 1) / v->bt;
    v->batches = fit < (size_t)v->asked ? (fit ? (int)fit : 1) : v->asked;
    const size_t n = v->bt * (size_t)v->batches;
    v->inputs = malloc(sizeof(int32_t) * n);
    v->targets = malloc(sizeof(int32_t) * n);
    v->pos = fso_data_documents(&v->data) ? malloc(sizeof(int32_t) * n) : NULL;
    if (!v->inputs || !v->targets || (fso_data_documents(&v->data) && !v->pos)) {
        snprintf(v->err, sizeof v->err, "out of host memory for %d validation batches of %zu "
                 "tokens; lower data.val_batches", v->batches, v->bt);
        return -ENOMEM;
    }
    for (size_t at = 0; at < n; at += v->bt)
        v->tokens += (int64_t)fso_data_next(&v->data, v->inputs + at, v->targets + at,
                                            v->pos ? v->pos + at : NULL);
    if (v->tokens == 0) {
        snprintf(v->err, sizeof v->err, "data.val_path: %s: no target of its first %d "
                 "micro-batches counts (every one is masked); give held-out data with targets, "
                 "or raise data.val_batches", v->data.desc, v->batches);
        return -ENODATA;
    }
    return 0;
}

void fso_val_free(fso_val *v)
{
    if (!v)
        return;
    fso_data_free(&v->data);
    free(v->inputs);
    free(v->targets);
    free(v->pos);
    memset(v, 0, sizeof *v);
}

bool fso_val_due(const fso_val *v, int64_t step)
{
    return v->on && (step == 0 || (v->every > 0 && step % v->every == 0));
}

int fso_val_run(fso_val *v, fso_trainer *tr, fso_val_result *res)
{
    double t0 = fso_now_ms(), sum = 0;
    int rc = fso_zero_eval(tr->zero, v->inputs, v->targets, v->pos, v->batches, &sum, v->err,
                           sizeof v->err);
    if (rc < 0)
        return rc;
    *res = (fso_val_result){
        .step = fso_zero_steps(tr->zero),
        .loss = sum / (double)v->tokens,
        .tokens = v->tokens,
        .batches = v->batches,
        .ms = fso_now_ms() - t0,
    };
    res->ppl = exp(fmin(20.0, res->loss));
    if (!isfinite(res->loss)) {
        snprintf(v->err, sizeof v->err, "validation loss at step %lld is %g: training diverged; "
                 "lower optimizer.params.lr", (long long)res->step, res->loss);
        return -ERANGE;
    }
    return 0;
}
