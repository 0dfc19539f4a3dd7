/* checkpoint_run.c — checkpoints in a training run (checkpoint_run.h). */
#include "checkpoint_run.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "boxes.h"
#include "checkpoint.h"
#include "util.h"

struct fso_ckpt_run {
    const fso_config *cfg;
    const fso_run_opts *opts;
    FILE *out;
    fso_ckpt *resume;         /* until loaded */
    char said[1024];          /* what changed since the checkpoint was saved */
    fso_ckpt_saver *saver;    /* NULL: no checkpoint.dir */
    fso_trainer *tr;
    fso_data *data;
    int64_t first_step;       /* the step the run started from */
    int64_t last_begun;       /* the step of the last save started, or the one the run
                                 started from */
    bool stop_said;           /* a signal stopped the run before its last step */
    int stop_sig;             /* the signal that stopped it: this box's, or across boxes
                                 another's (then SIGTERM's name: mpirun forwards it) */
    int boxes_rc;             /* across boxes: the boxes could not agree whether to stop
                                 (one died or stalled), negative errno; 0 */
};

static const char *signal_name(int sig)
{
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}

int fso_ckpt_resume_check(const fso_config *cfg, const fso_run_opts *opts, char *err,
                          size_t errlen)
{
    if (opts->resume_auto && !cfg->checkpoint.dir[0]) {
        snprintf(err, errlen, "--resume auto: needs --save DIR (checkpoint.dir), the folder to "
                              "continue from, or to save in when it has no checkpoint yet");
        return -EINVAL;
    }
    if (opts->resume && !opts->resume_auto && !opts->resume[0] && !cfg->checkpoint.dir[0]) {
        snprintf(err, errlen, "--resume: which checkpoint? give --resume PATH, or --save DIR "
                              "(checkpoint.dir) to continue from its latest");
        return -EINVAL;
    }
    return 0;
}

int fso_ckpt_run_start(fso_ckpt_run **out, fso_config *cfg, const fso_run_opts *opts, FILE *o,
                       char *err, size_t errlen)
{
    fso_ckpt_run *r = calloc(1, sizeof *r);
    *out = r;
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    r->cfg = cfg;
    r->opts = opts;
    r->out = o;
    int rc = 0;
    if ((rc = fso_ckpt_resume_check(cfg, opts, err, errlen)) < 0)
        return rc;
    if (opts->resume_auto &&
        (rc = fso_ckpt_dir_has_saves(cfg->checkpoint.dir, err, errlen)) <= 0) {
        if (rc < 0)
            return rc;
        fprintf(o, "fsoff: resume: no checkpoint in %s yet: starting from step 0 (--resume "
                   "auto)\n", cfg->checkpoint.dir);
        fflush(o);
    } else if (opts->resume) {
        const char *from = opts->resume[0] ? opts->resume : cfg->checkpoint.dir;
        if ((rc = fso_ckpt_open(&r->resume, from, err, errlen)) < 0 ||
            (rc = fso_ckpt_check_config(r->resume, cfg, r->said, sizeof r->said, err,
                                        errlen)) < 0)
            return rc;
        cfg->init_from[0] = '\0'; /* the checkpoint's parameters, not the folder's */
    }
    if (cfg->checkpoint.dir[0])
        rc = fso_ckpt_saver_create(&r->saver, cfg->checkpoint.dir, cfg->checkpoint.keep, err,
                                   errlen);
    /* across boxes every box writes into it: one folder that all of them see */
    if (rc == 0 && r->saver && fso_boxes_count() > 1)
        rc = fso_boxes_check_shared_dir(cfg->checkpoint.dir, err, errlen);
    if (rc == 0 && r->saver)
        fso_ckpt_saver_pause_halfway(r->saver, opts->pause_save);
    return rc;
}

bool fso_ckpt_run_resuming(const fso_ckpt_run *r)
{
    return r && r->resume;
}

int fso_ckpt_run_resume(fso_ckpt_run *r, fso_trainer *tr, fso_data *data, fso_report *rep,
                        char *err, size_t errlen)
{
    r->tr = tr;
    r->data = data;
    r->first_step = r->last_begun = fso_zero_steps(tr->zero); /* step 0 is the seed's */
    if (!r->resume)
        return 0;
    double t0 = fso_now_ms();
    int rc = fso_ckpt_load(r->resume, tr->zero, err, errlen);
    if (rc == 0) { /* the token ids and tokenizer files the run started with */
        fso_hf_extras_free(&tr->hf);
        rc = fso_ckpt_hf_extras(r->resume, &tr->hf, err, errlen);
    }
    if (rc == 0) {
        data->pos = (size_t)fso_ckpt_data_position(r->resume);
        r->first_step = r->last_begun = fso_zero_steps(tr->zero); /* saved already */
        fprintf(r->out, "fsoff: resume: step %lld from %s in %.2f s; %s%s\n",
                (long long)fso_ckpt_step(r->resume), fso_ckpt_path(r->resume),
                (fso_now_ms() - t0) / 1e3,
                r->said[0] ? "changed since it was saved: " : "the configuration is as saved",
                r->said);
        if (fso_ckpt_step(r->resume) >= r->cfg->steps)
            fprintf(r->out, "fsoff: resume: the checkpoint is at step %lld and train.steps is "
                            "%lld: nothing left to train (raise --steps to go on)\n",
                    (long long)fso_ckpt_step(r->resume), (long long)r->cfg->steps);
        fflush(r->out);
        fso_report_resume(rep, fso_ckpt_step(r->resume), fso_ckpt_path(r->resume));
    }
    fso_ckpt_close(r->resume);
    r->resume = NULL;
    return rc;
}

bool fso_ckpt_run_stopping(fso_ckpt_run *r)
{
    int sig = r->opts->stop ? *r->opts->stop : 0;
    if (fso_boxes_count() > 1 && !r->stop_said) {
        /* every box stops after the same step: a signal any box caught */
        double v = sig ? 1 : 0;
        char err[512];
        if ((r->boxes_rc = fso_boxes_sum("the stop flags", &v, 1, err, sizeof err)) < 0) {
            fprintf(stderr, "fsoff: error: %s\n", err);
            return true;
        }
        if (v > 0 && !sig)
            sig = SIGTERM;
    }
    if (!sig)
        return false;
    r->stop_sig = sig;
    if (!r->stop_said) {
        const int64_t step = fso_zero_steps(r->tr->zero);
        fprintf(r->out, "fsoff: %s: stopping after step %lld of %lld%s; a second one stops at "
                        "once\n",
                signal_name(sig), (long long)step, (long long)r->cfg->steps,
                !r->saver                 ? " (no --save DIR: nothing is saved)"
                : step != r->last_begun ? ", saving it first"
                                        : "");
        fflush(r->out);
        r->stop_said = true;
    }
    return true;
}

static void report(fso_ckpt_run *r, fso_report *rep, const fso_ckpt_result *res)
{
    if (res->rc < 0)
        fprintf(stderr, "fsoff: error: checkpoint of step %lld: %s; %s\n", (long long)res->step,
                res->err,
                fso_ckpt_saver_last_step(r->saver) >= 0
                    ? "the save was abandoned; the latest complete checkpoint stays as it was"
                    : "the save was abandoned");
    fso_report_checkpoint(rep, res->step, res->path, res->bytes, res->cloned_bytes, res->seconds,
                          res->exposed_ms, res->rc < 0 ? res->err : NULL);
}

/* Start a save of the current step, after reporting the one before. 0, or
 * negative errno after an error line when it could not start. */
static int begin(fso_ckpt_run *r, fso_report *rep)
{
    fso_ckpt_result res;
    char err[512];
    if (fso_ckpt_save_poll(r->saver, true, &res) == 1)
        report(r, rep, &res);
    fso_ckpt_meta meta = {.cfg = r->cfg, .data_position = (int64_t)r->data->pos,
                          .data_tokens = r->data->n_tokens, .hf = &r->tr->hf};
    int64_t step = fso_zero_steps(r->tr->zero);
    int rc = fso_ckpt_save_begin(r->saver, r->tr->zero, &meta, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "fsoff: error: checkpoint of step %lld: %s\n", (long long)step, err);
    r->last_begun = step;
    return rc;
}

void fso_ckpt_run_after_step(fso_ckpt_run *r, fso_report *rep)
{
    const int64_t step = fso_zero_steps(r->tr->zero), every = r->cfg->checkpoint.every_steps;
    if (r->saver) {
        fso_ckpt_result res;
        if (fso_ckpt_save_poll(r->saver, false, &res) == 1)
            report(r, rep, &res);
        if (every > 0 && step % every == 0 && step < r->cfg->steps && step != r->last_begun)
            begin(r, rep);
    }
    if (r->opts->pause_step_file && step == r->opts->pause_step)
        fso_pause_at(r->opts->pause_step_file);
}

int fso_ckpt_run_finish(fso_ckpt_run *r, fso_report *rep, int rc)
{
    if (!r || !r->saver)
        return rc;
    const int64_t step = fso_zero_steps(r->tr->zero);
    if (rc == 0 && step != r->last_begun) {
        int brc = begin(r, rep);
        if (brc < 0)
            return brc;
    }
    fso_ckpt_result res;
    if (fso_ckpt_save_poll(r->saver, true, &res) == 1) {
        report(r, rep, &res);
        if (rc == 0 && res.rc < 0 && res.step == step)
            return res.rc;
    }
    return rc;
}

int64_t fso_ckpt_run_first_step(const fso_ckpt_run *r)
{
    return r ? r->first_step : 0;
}

const char *fso_ckpt_run_stopped_by(const fso_ckpt_run *r)
{
    return r && r->stop_said ? signal_name(r->stop_sig) : NULL;
}

int fso_ckpt_run_boxes_rc(const fso_ckpt_run *r)
{
    return r ? r->boxes_rc : 0;
}

void fso_ckpt_run_free(fso_ckpt_run *r)
{
    if (!r)
        return;
    fso_ckpt_close(r->resume);
    fso_ckpt_saver_destroy(r->saver);
    free(r);
}
