/* val.h — the validation loss: a forward of held-out tokens (data.val_path)
 * under the run's placement, no gradients and no update, so it costs
 * compute only.
 *
 * A pass reads the same micro-batches every time: the first data.val_batches
 * windows of B x T tokens from the file's start (fewer when the file holds
 * fewer), so the curve compares like with like. Its loss is the mean over
 * the targets that count (a token file's loss mask, data.h), weighted by
 * tokens; the perplexity is exp(min(20, loss)).
 *
 * Schedule: before step 0, before every step that is a multiple of
 * data.val_every, and after the last step; the step numbers are the run's,
 * so a resumed run keeps the schedule of the run it continues.
 */
#ifndef FSO_VAL_H
#define FSO_VAL_H

#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "data.h"

struct fso_trainer;

typedef struct fso_val_result {
    int64_t step;            /* optimizer steps taken before the pass */
    double loss;             /* mean over the counted targets */
    double ppl;              /* exp(min(20, loss)) */
    int64_t tokens;          /* counted targets */
    int batches;             /* micro-batches read */
    double ms;               /* the pass's wall time, the wait for a pending update included */
} fso_val_result;

typedef struct fso_val {
    bool on;                 /* data.val_path is set */
    fso_data data;
    int batches;             /* micro-batches a pass reads: data.val_batches, or what the
                                file holds */
    int asked;               /* data.val_batches */
    int64_t every;           /* data.val_every */
    size_t bt;               /* tokens per micro-batch */
    int32_t *inputs, *targets; /* (batches * bt) host, read once: a pass is the same batches */
    int32_t *pos;            /* (batches * bt) positions in documents, or NULL (data.h) */
    int64_t tokens;          /* counted targets of a pass */
    char err[FSO_DATA_ERR_MAX + 64];
} fso_val;

/* Read data.val_path (the training data's format rules) and cut its
 * batches. Nothing to do without one (v->on false). 0 or negative errno
 * with v->err naming the file and the fix. */
int fso_val_init(fso_val *v, const fso_config *cfg);
void fso_val_free(fso_val *v);

/* Is a pass due before step `step` (the steps taken so far)? The pass
 * after the last step is the caller's. */
bool fso_val_due(const fso_val *v, int64_t step);

/* One pass on the trainer's state. 0 or negative errno with v->err. */
int fso_val_run(fso_val *v, struct fso_trainer *tr, fso_val_result *res);

#endif
