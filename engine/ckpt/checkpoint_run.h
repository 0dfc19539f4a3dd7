/* checkpoint_run.h — checkpoints in a training run (train.c): resuming
 * before the first step, saving every checkpoint.every_steps steps while
 * training goes on, stopping after the step in progress when a signal asks,
 * and the save at the end, each reported as a line and a metrics event. */
#ifndef FSO_CHECKPOINT_RUN_H
#define FSO_CHECKPOINT_RUN_H

#include <stdio.h>

#include "data.h"
#include "report.h"
#include "train.h"

typedef struct fso_ckpt_run fso_ckpt_run;

/* Whether the run's resume options can be followed with cfg: -EINVAL with
 * the fix in err for --resume or --resume auto with nowhere to resume from
 * (a bad command line: fsoff checks it before planning). */
int fso_ckpt_resume_check(const fso_config *cfg, const fso_run_opts *opts, char *err,
                          size_t errlen);
/* Before the trainer is built: the checkpoint to resume from, opened and
 * its configuration compared with cfg (a change of the model's shape is
 * refused here, before anything large is allocated), and the save dir
 * locked. cfg is the run's own (it may change as the run re-plans); when
 * resuming, its model.init_from is cleared: the checkpoint holds the
 * parameters. 0 or negative errno with err. */
int fso_ckpt_run_start(fso_ckpt_run **out, fso_config *cfg, const fso_run_opts *opts, FILE *o,
                       char *err, size_t errlen);
/* Between start and resume: whether the run continues from a checkpoint
 * (its metrics file is then appended to). With --resume auto
 * (fso_run_opts.resume_auto) and no save in checkpoint.dir yet, start said
 * so in one line and the run starts from step 0. */
bool fso_ckpt_run_resuming(const fso_ckpt_run *r);
/* After the trainer and the data: load the checkpoint (when resuming), say
 * so in one line with what changed, and mark the metrics file's new segment
 * (fso_report_resume). 0 or negative errno with err. */
int fso_ckpt_run_resume(fso_ckpt_run *r, fso_trainer *tr, fso_data *data, fso_report *rep,
                        char *err, size_t errlen);
/* Before each step: true when a signal asked the run to stop (said once).
 * Across boxes (boxes.h) every box calls it before every step and they
 * agree: a signal on any box stops all after the same step; when they
 * cannot agree (a box died or stalled), true after an error line, and
 * fso_ckpt_run_boxes_rc says so. */
bool fso_ckpt_run_stopping(fso_ckpt_run *r);
/* Negative errno when the boxes could not agree whether to stop; 0. */
int fso_ckpt_run_boxes_rc(const fso_ckpt_run *r);
/* After each step: report saves that finished, start one when due. */
void fso_ckpt_run_after_step(fso_ckpt_run *r, fso_report *rep);
/* After the last step, with rc the run's status so far (0: every step and
 * update succeeded, or a signal stopped it between steps): the save at the
 * end unless the last step is saved already (only when rc is 0), and any
 * save still running, waited for and reported. Returns rc, or when rc is 0
 * and the save of the last step failed, that save's negative errno (after
 * an error line): a run whose last state is not kept has failed, though
 * every step trained. A failed save of an earlier step does not fail the
 * run: training went on, and a later save kept a later state. */
int fso_ckpt_run_finish(fso_ckpt_run *r, fso_report *rep, int rc);
/* The step the run started from: 0, or the checkpoint's it resumed. */
int64_t fso_ckpt_run_first_step(const fso_ckpt_run *r);
/* "SIGINT" or "SIGTERM" when a signal stopped the run before its last
 * step; NULL when it was not stopped. */
const char *fso_ckpt_run_stopped_by(const fso_ckpt_run *r);
/* Waits for a save still running. NULL is fine. */
void fso_ckpt_run_free(fso_ckpt_run *r);

#endif
