/* zero_step.c — one optimizer step on every device: the micro-batches
 * through the model, the exact global norm and mean loss, clipping, and the
 * update on the schedule train.optimizer_overlap asks for (zero_optim.c);
 * the devices' threads that run it; the forward for logits. */
#include "zero_impl.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topology.h"
#include "util.h"

static void drain(rank_state *rk)
{
    zr_drain_slots(rk, false);
}

static fso_adamw_step step_hparams(const fso_zero *z, double clip_coef)
{
    const fso_config *cfg = z->cfg;
    fso_adamw_step as = {
        .lr = fso_config_lr_at(cfg, z->step + 1),
        .beta1 = cfg->optim.beta1,
        .beta2 = cfg->optim.beta2,
        .eps = cfg->optim.eps,
        .grad_scale = clip_coef,
        .t = z->step + 1,
    };
    return as;
}

/* What the optimizer did since the last step took it, into this step's
 * figures: its time updating (across boxes AdamW's alone: its rails'
 * all-gathers are the net time's), its NVMe bytes, and what its rails
 * sent. */
static void take_optimizer(rank_state *rk)
{
    zr_lock(&rk->opt.mu);
    rk->compute.st.optimizer_ms = rk->opt.busy_ms - rk->rail.param_ms;
    rk->compute.st.net_ms += rk->rail.param_ms;
    rk->opt.busy_ms = rk->rail.param_ms = 0;
    zr_unlock(&rk->opt.mu);
    rk->compute.st.net_bytes += __atomic_exchange_n(&rk->rail.net_bytes, 0, __ATOMIC_RELAXED);
    for (int k = 0; k < FSO_N_KINDS; k++) {
        rk->compute.st.nvme_kind_read[k] +=
            __atomic_exchange_n(&rk->opt.read_kind[k], 0, __ATOMIC_RELAXED);
        rk->compute.st.nvme_kind_write[k] +=
            __atomic_exchange_n(&rk->opt.write_kind[k], 0, __ATOMIC_RELAXED);
    }
}

static void *rank_step(void *arg)
{
    rank_state *rk = arg;
    fso_zero *z = rk->z;
    const fso_config *cfg = z->cfg;
    const size_t bt = (size_t)cfg->micro_batch * cfg->data.seq_len;
    fso_block_source src = zr_rank_source(rk);
    const int ranks = z->world * z->boxes; /* every box's devices */
    const int micro = cfg->grad_accum * ranks;
    const float loss_scale = fso_model_loss_scale(rk->compute.counted, (int64_t)bt, micro);

    memset(&rk->compute.st, 0, sizeof rk->compute.st);
    rk->compute.loss_sum = 0;
    rk->clock.wait_ms = 0;
    rk->opt.bwd_step = step_hparams(z, 1.0); /* clipping is off in the backward schedule */
    memset(rk->clock.block_ms, 0, sizeof *rk->clock.block_ms * (size_t)z->n_blocks);
    double t0 = fso_now_ms();
    for (int a = 0; a < cfg->grad_accum; a++) {
        zr_source_reset(rk);
        rk->compute.micro = a;
        rk->clock.cur_block = -1;
        rk->clock.t_mark = fso_now_ms();
        size_t mb = (size_t)a * ranks + (size_t)z->box * z->world + rk->rank;
        fso_model_step(&rk->model, &src, rk->compute.inputs + mb * bt,
                       rk->compute.targets + mb * bt,
                       rk->compute.pos ? rk->compute.pos + mb * bt : NULL, loss_scale,
                       &rk->compute.loss_sum);
        zr_clock_in(rk, fso_now_ms()); /* the last block's compute */
        /* the micro-batch's last gradients land while the next one's
         * forward runs (the next landing comes first), or now at the end */
    }
    zr_grads_land(rk);
    rk->compute.st.compute_ms = fso_now_ms() - t0 - rk->clock.wait_ms;

    /* exact global norm and mean loss: one all-reduce (also carries
     * failures); block norms are added in block order on every schedule.
     * The norms taken on the device are in once the backend has synced:
     * the step's one wait for the device. */
    int drc = rk->compute.err.rc == 0 ? rk->be->ops->sync(rk->be) : 0;
    if (drc < 0)
        zr_fail(&rk->compute.err, drc, "device %d: %s", rk->rank, rk->be->err);
    /* across boxes: the gradient shards summed over the rails, each box
     * keeping its slice and that slice's norm (zero_rail.h) */
    if (z->boxes > 1)
        zr_rail_reduce_grads(rk);
    double sq = 0;
    for (int b = 0; b < z->n_blocks && rk->compute.err.rc == 0; b++)
        sq += rk->compute.grad_sq[b];
    double red[3] = {rk->compute.loss_sum, sq, rk->compute.err.rc ? 1.0 : 0.0};
    z->coll->ops->all_reduce_f64(z->coll, rk->rank, red, 3);
    if (z->boxes > 1 && zr_rail_sum(rk, red, 3) < 0)
        red[2] = 1; /* the rails failed: nobody updates */
    rk->compute.st.loss = red[0] / (double)rk->compute.counted; /* the mean over them */
    rk->compute.st.grad_norm = sqrt(red[1]);
    if (red[2] != 0) { /* some rank failed: nobody updates */
        if (rk->compute.err.rc == 0)
            zr_fail(&rk->compute.err, -ECANCELED, "device %d: another device failed",
                    rk->rank);
        drain(rk);
        return NULL;
    }
    if (!isfinite(rk->compute.st.loss) || !isfinite(rk->compute.st.grad_norm)) {
        if (cfg->optimizer_overlap == FSO_OVERLAP_BACKWARD) {
            /* blocks were updated as their gradients came in: say which
             * was not, as the optimizer thread found it */
            if (zr_optim_wait_all(rk) == 0)
                zr_fail(&rk->compute.err, -ERANGE,
                        "step %lld: loss %g, gradient norm %g: training diverged; "
                        "train.optimizer_overlap \"backward\" had already updated every "
                        "block; lower optimizer.params.lr",
                        (long long)(z->step + 1), rk->compute.st.loss,
                        rk->compute.st.grad_norm);
            return NULL;
        }
        zr_fail(&rk->compute.err, -ERANGE,
                "step %lld: loss %g, gradient norm %g: training diverged and the update was "
                "not applied; lower optimizer.params.lr or set gradient_clipping",
                (long long)(z->step + 1), rk->compute.st.loss, rk->compute.st.grad_norm);
        return NULL;
    }
    rk->compute.st.clip_coef = 1.0;
    if (cfg->grad_clip > 0) {
        double coef = cfg->grad_clip / (rk->compute.st.grad_norm + 1e-6);
        if (coef < 1.0)
            rk->compute.st.clip_coef = coef;
    }
    fso_adamw_step as = step_hparams(z, rk->compute.st.clip_coef);
    rk->compute.st.lr = as.lr;
    /* The step's line counts one whole update: the one that ran during it
     * (overlapped: the previous step's, which this step's forward waited
     * for block by block; backward: this step's). Its last writes may still
     * be in flight: wait for them before the next update is posted, as the
     * next forward's first block would. */
    if (cfg->optimizer_overlap != FSO_OVERLAP_NONE && zr_optim_wait_all(rk) < 0) {
        drain(rk);
        return NULL;
    }
    take_optimizer(rk);
    if (cfg->optimizer_overlap == FSO_OVERLAP_NONE) {
        if (zr_optim_run(rk, &as) < 0)
            drain(rk);
        take_optimizer(rk);
    } else if (cfg->optimizer_overlap == FSO_OVERLAP_FORWARD) {
        zr_optim_post_step(rk, &as);
    }
    return NULL;
}

int fso_zero_finish(fso_zero *z, double *waited_ms, char *err, size_t errlen)
{
    int rc = 0;
    *waited_ms = 0;
    for (int r = 0; r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        rk->compute.err.rc = 0;
        rk->compute.st.optimizer_exposed_ms = 0;
        int e = zr_optim_wait_all(rk);
        if (r == 0)
            *waited_ms = rk->compute.st.optimizer_exposed_ms;
        if (e < 0 && rc == 0) {
            rc = e;
            snprintf(err, errlen, "%s", rk->compute.err.msg);
        }
    }
    return rc;
}

/* A device's thread: bound near its device once, then one job per call of
 * run_ranks until the trainer goes away. */
typedef struct worker_arg {
    fso_zero *z;
    int rank;
} worker_arg;

static void *worker_main(void *arg)
{
    fso_zero *z = ((worker_arg *)arg)->z;
    rank_state *rk = &z->ranks[((worker_arg *)arg)->rank];
    free(arg);
    if (z->topo && rk->numa >= 0)
        fso_topo_bind_thread(z->topo, rk->numa);
    uint64_t seen = 0;
    zr_lock(&z->threads.mu);
    for (;;) {
        while (!z->threads.quit && z->threads.gen == seen)
            zr_cond_wait(&z->threads.run_cv, &z->threads.mu);
        if (z->threads.quit)
            break;
        seen = z->threads.gen;
        void *(*fn)(void *) = z->threads.job;
        zr_unlock(&z->threads.mu);
        fn(rk);
        zr_lock(&z->threads.mu);
        if (--z->threads.left == 0)
            pthread_cond_signal(&z->threads.done_cv);
    }
    zr_unlock(&z->threads.mu);
    return NULL;
}

int zr_start_workers(fso_zero *z, char *err, size_t errlen)
{
    zr_mutex_init(&z->threads.mu, ZR_LOCK_THREADS);
    pthread_cond_init(&z->threads.run_cv, NULL);
    pthread_cond_init(&z->threads.done_cv, NULL);
    z->threads.init = true;
    for (int r = 1; r < z->world; r++) {
        worker_arg *a = malloc(sizeof *a);
        int e = a ? 0 : ENOMEM;
        if (a) {
            *a = (worker_arg){z, r};
            e = pthread_create(&z->threads.workers[r], NULL, worker_main, a);
            if (e)
                free(a);
        }
        if (e) {
            snprintf(err, errlen, "cannot start the thread of device %d: %s", r, strerror(e));
            return -e;
        }
        z->threads.n_workers = r;
    }
    return 0;
}

void zr_stop_workers(fso_zero *z)
{
    if (!z->threads.init)
        return;
    zr_lock(&z->threads.mu);
    z->threads.quit = true;
    pthread_cond_broadcast(&z->threads.run_cv);
    zr_unlock(&z->threads.mu);
    for (int r = 1; r <= z->threads.n_workers; r++)
        pthread_join(z->threads.workers[r], NULL);
    pthread_cond_destroy(&z->threads.run_cv);
    pthread_cond_destroy(&z->threads.done_cv);
    zr_mutex_destroy(&z->threads.mu);
    z->threads.init = false;
}

/* Run fn on every device, device 0 on the caller's thread, and wait. */
int zr_run_ranks(fso_zero *z, void *(*fn)(void *))
{
    int rc = 0;
    for (int r = 0; r < z->world; r++)
        z->ranks[r].compute.err.rc = 0;
    if (!z->threads.caller_bound && z->topo && z->ranks[0].numa >= 0)
        fso_topo_bind_thread(z->topo, z->ranks[0].numa);
    z->threads.caller_bound = true;
    zr_lock(&z->threads.mu);
    z->threads.job = fn;
    z->threads.left = z->world - 1;
    z->threads.gen++;
    pthread_cond_broadcast(&z->threads.run_cv);
    zr_unlock(&z->threads.mu);
    fn(&z->ranks[0]);
    zr_lock(&z->threads.mu);
    while (z->threads.left > 0)
        zr_cond_wait(&z->threads.done_cv, &z->threads.mu);
    zr_unlock(&z->threads.mu);
    for (int r = 0; r < z->world; r++)
        if (z->ranks[r].compute.err.rc && (rc == 0 || rc == -ECANCELED))
            rc = z->ranks[r].compute.err.rc;
    return rc;
}

void zr_first_error(const fso_zero *z, char *err, size_t errlen)
{
    for (int r = 0; r < z->world; r++)
        if (z->ranks[r].compute.err.rc && z->ranks[r].compute.err.rc != -ECANCELED) {
            snprintf(err, errlen, "%s", z->ranks[r].compute.err.msg);
            return;
        }
    snprintf(err, errlen, "%s", z->ranks[0].compute.err.msg);
}

void zr_batch_pin(fso_zero *z, const int32_t **inputs, const int32_t **targets,
                  const int32_t **pos, size_t n)
{
    if (!z->cuda)
        return;
    int32_t *in = zr_pinned_get(&z->batch, sizeof(int32_t) * n * 3, true,
                                "the batches' host buffers",
                                "each copy of a micro-batch's tokens to a GPU waits for it");
    if (!in)
        return; /* the caller's buffers: pageable, but right */
    int32_t *tg = in + n, *ps = tg + n;
    memcpy(in, *inputs, sizeof(int32_t) * n);
    memcpy(tg, *targets, sizeof(int32_t) * n);
    *inputs = in;
    *targets = tg;
    if (*pos) {
        memcpy(ps, *pos, sizeof(int32_t) * n);
        *pos = ps;
    }
}

int fso_zero_step_run(fso_zero *z, const int32_t *inputs, const int32_t *targets,
                      const int32_t *pos, fso_zero_step *st, char *err, size_t errlen)
{
    const fso_config *cfg = z->cfg;
    const double t0 = fso_now_ms();
    const int64_t step = z->step + 1;
    /* every box's micro-batches: each box computes its own and counts them all */
    const size_t n = (size_t)z->world * z->boxes * cfg->grad_accum * cfg->micro_batch *
                     cfg->data.seq_len;
    int64_t counted = 0;
    for (size_t i = 0; i < n; i++)
        counted += targets[i] >= 0;
    if (counted == 0) {
        *st = (fso_zero_step){.step = step};
        snprintf(err, errlen, "step %lld: none of its %zu targets counts (every one is "
                 "masked), so it has no loss to learn from; it was not run: give it batches "
                 "with at least one target", (long long)step, n);
        return -ENODATA;
    }
    zr_batch_pin(z, &inputs, &targets, &pos, n);
    for (int r = 0; r < z->world; r++) {
        z->ranks[r].compute.inputs = inputs;
        z->ranks[r].compute.targets = targets;
        z->ranks[r].compute.pos = pos;
        z->ranks[r].compute.counted = counted;
    }
    int rc = zr_run_ranks(z, rank_step);
    if (rc < 0) {
        const fso_zero_step *r0 = &z->ranks[0].compute.st;
        *st = (fso_zero_step){.step = step, .loss = r0->loss, .grad_norm = r0->grad_norm};
        zr_first_error(z, err, errlen);
        return rc;
    }
    *st = z->ranks[0].compute.st;
    st->nvme_read_bytes = st->nvme_write_bytes = 0;
    memset(st->nvme_kind_read, 0, sizeof st->nvme_kind_read);
    memset(st->nvme_kind_write, 0, sizeof st->nvme_kind_write);
    st->gather_bytes = st->reduce_bytes = st->act_bytes = st->net_bytes = 0;
    for (int r = 0; r < z->world; r++) {
        st->net_bytes += z->ranks[r].compute.st.net_bytes;
        for (int k = 0; k < FSO_N_KINDS; k++) {
            st->nvme_kind_read[k] += z->ranks[r].compute.st.nvme_kind_read[k];
            st->nvme_kind_write[k] += z->ranks[r].compute.st.nvme_kind_write[k];
        }
        st->gather_bytes += z->ranks[r].compute.st.gather_bytes;
        st->reduce_bytes += z->ranks[r].compute.st.reduce_bytes;
        st->act_bytes += z->ranks[r].model.act_bytes; /* the rank's thread is done */
        z->ranks[r].model.act_bytes = 0;
    }
    for (int k = 0; k < FSO_N_KINDS; k++) {
        st->nvme_read_bytes += st->nvme_kind_read[k];
        st->nvme_write_bytes += st->nvme_kind_write[k];
    }
    st->step = step;
    st->tokens = (int64_t)z->world * z->boxes * cfg->grad_accum * cfg->micro_batch *
                 cfg->data.seq_len;
    st->stale_marks = fso_zero_stale_marks(z);
    z->step++;
    st->step_ms = fso_now_ms() - t0;
    return 0;
}

int64_t fso_zero_steps(const fso_zero *z)
{
    return z->step;
}

/* One round of a validation: this rank's micro-batch (compute.micro) of
 * the pass's inputs, its losses into compute.loss_sum. */
static void *rank_eval(void *arg)
{
    rank_state *rk = arg;
    const fso_config *cfg = rk->z->cfg;
    const size_t bt = (size_t)cfg->micro_batch * cfg->data.seq_len;
    fso_block_source src = zr_rank_source(rk);
    zr_source_reset(rk);
    rk->compute.loss_sum = 0;
    const size_t at = (size_t)rk->compute.micro * bt;
    fso_model_eval(&rk->model, &src, rk->compute.inputs + at, rk->compute.targets + at,
                   rk->compute.pos ? rk->compute.pos + at : NULL, &rk->compute.loss_sum);
    int rc = rk->compute.err.rc == 0 ? rk->be->ops->sync(rk->be) : 0;
    if (rc < 0)
        zr_fail(&rk->compute.err, rc, "device %d: %s", rk->rank, rk->be->err);
    return NULL;
}

int fso_zero_eval(fso_zero *z, const int32_t *inputs, const int32_t *targets,
                  const int32_t *pos, int n_micro, double *loss_sum, char *err, size_t errlen)
{
    double waited;
    int rc = fso_zero_finish(z, &waited, err, errlen);
    *loss_sum = 0;
    const fso_config *cfg = z->cfg;
    zr_batch_pin(z, &inputs, &targets, &pos,
                 (size_t)n_micro * cfg->micro_batch * cfg->data.seq_len);
    for (int i = 0; rc == 0 && i < n_micro; i += z->world) {
        for (int r = 0; r < z->world; r++) {
            z->ranks[r].compute.inputs = inputs;
            z->ranks[r].compute.targets = targets;
            z->ranks[r].compute.pos = pos;
            z->ranks[r].compute.micro = i + r < n_micro ? i + r : n_micro - 1;
        }
        if ((rc = zr_run_ranks(z, rank_eval)) < 0) {
            zr_first_error(z, err, errlen);
            break;
        }
        for (int r = 0; r < z->world && i + r < n_micro; r++)
            *loss_sum += z->ranks[r].compute.loss_sum;
    }
    return rc;
}

static void *rank_logits(void *arg)
{
    rank_state *rk = arg;
    fso_block_source src = zr_rank_source(rk);
    zr_source_reset(rk);
    fso_model_forward_logits(&rk->model, &src, rk->compute.inputs, rk->compute.logits);
    return NULL;
}

int fso_zero_forward_logits(fso_zero *z, const int32_t *inputs, float *logits, char *err,
                            size_t errlen)
{
    double waited;
    int wrc = fso_zero_finish(z, &waited, err, errlen);
    if (wrc < 0)
        return wrc;
    /* Every rank must join the gathers; ranks other than 0 write their
     * logits to scratch. */
    const fso_model *m = &z->ranks[0].model;
    size_t n = (size_t)m->B * m->T * m->mc.vocab_size;
    float *scratch = z->world > 1 ? malloc(sizeof(float) * n) : NULL;
    if (z->world > 1 && !scratch) {
        snprintf(err, errlen, "out of host memory for logits");
        return -ENOMEM;
    }
    for (int r = 0; r < z->world; r++) {
        z->ranks[r].compute.inputs = inputs;
        z->ranks[r].compute.logits = r == 0 ? logits : scratch;
    }
    int rc = zr_run_ranks(z, rank_logits);
    free(scratch);
    if (rc < 0)
        zr_first_error(z, err, errlen);
    return rc;
}
