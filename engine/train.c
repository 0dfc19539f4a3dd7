/* train.c — optimizer steps and the training run (see train.h). */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "adamw.h"
#include "data.h"
#include "report.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int fso_trainer_init(fso_trainer *tr, const fso_config *cfg, fso_backend *be)
{
    memset(tr, 0, sizeof *tr);
    tr->cfg = cfg;
    tr->be = be;
    int rc = fso_model_init(&tr->model, &cfg->model, be, cfg->micro_batch, cfg->data.seq_len, 1,
                            cfg->activation_checkpointing);
    if (rc < 0) {
        snprintf(tr->err, sizeof tr->err, "%s", tr->model.err);
        return rc;
    }
    fso_model_init_params(&tr->model, cfg->seed);

    int nb = tr->model.n_blocks;
    tr->m = calloc((size_t)nb, sizeof *tr->m);
    tr->v = calloc((size_t)nb, sizeof *tr->v);
    if (!tr->m || !tr->v) {
        rc = -ENOMEM;
        snprintf(tr->err, sizeof tr->err, "out of host memory for the optimizer tables");
        goto fail;
    }
    for (int i = 0; i < nb; i++) {
        size_t bytes = sizeof(float) * tr->model.blocks[i].padded_elems;
        if ((rc = be->ops->buf_alloc(be, bytes, (void **)&tr->m[i])) < 0 ||
            (rc = be->ops->buf_alloc(be, bytes, (void **)&tr->v[i])) < 0) {
            snprintf(tr->err, sizeof tr->err,
                     "%s backend: cannot allocate AdamW state (%.1f MiB per block): %s",
                     be->ops->name, 2 * bytes / 1048576.0, be->err);
            goto fail;
        }
        be->ops->memset0(be, tr->m[i], bytes);
        be->ops->memset0(be, tr->v[i], bytes);
    }
    return 0;
fail:
    fso_trainer_free(tr);
    return rc;
}

void fso_trainer_free(fso_trainer *tr)
{
    if (!tr || !tr->be)
        return;
    for (int i = 0; i < tr->model.n_blocks; i++) {
        if (tr->m)
            tr->be->ops->buf_free(tr->be, tr->m[i]);
        if (tr->v)
            tr->be->ops->buf_free(tr->be, tr->v[i]);
    }
    free(tr->m);
    free(tr->v);
    fso_model_free(&tr->model);
    tr->m = tr->v = NULL;
    tr->be = NULL;
}

static bool tensor_decays(const fso_optim_config *o, const fso_tensor_desc *t)
{
    if (t->is_norm)
        return o->decay_norms;
    if (t->kind == FSO_T_EMBED)
        return o->decay_embeddings;
    return t->decay;
}

int fso_trainer_step(fso_trainer *tr, const int32_t *inputs, const int32_t *targets,
                     fso_step_stats *st)
{
    const fso_config *cfg = tr->cfg;
    fso_model *m = &tr->model;
    const size_t bt = (size_t)cfg->micro_batch * cfg->data.seq_len;
    double t0 = now_ms();

    memset(st, 0, sizeof *st);
    st->step = tr->step + 1;
    fso_model_zero_grads(m);
    double loss = 0;
    for (int a = 0; a < cfg->grad_accum; a++)
        loss += fso_model_step(m, inputs + a * bt, targets + a * bt, 1.0f / cfg->grad_accum);
    st->loss = loss / cfg->grad_accum;
    st->tokens = (int64_t)(bt * cfg->grad_accum);

    st->grad_norm = sqrt(fso_model_grad_sqnorm(m));
    if (!isfinite(st->loss) || !isfinite(st->grad_norm)) {
        snprintf(tr->err, sizeof tr->err,
                 "step %lld: loss %g, gradient norm %g: training diverged and the update was "
                 "not applied; lower optimizer.params.lr or set gradient_clipping",
                 (long long)st->step, st->loss, st->grad_norm);
        return -ERANGE;
    }
    st->clip_coef = 1.0;
    if (cfg->grad_clip > 0) {
        double coef = cfg->grad_clip / (st->grad_norm + 1e-6);
        if (coef < 1.0)
            st->clip_coef = coef;
    }
    st->lr = fso_config_lr_at(cfg, st->step);

    fso_adamw_step as = {
        .lr = st->lr,
        .beta1 = cfg->optim.beta1,
        .beta2 = cfg->optim.beta2,
        .eps = cfg->optim.eps,
        .grad_scale = st->clip_coef,
        .t = st->step,
    };
    for (int i = 0; i < m->n_blocks; i++)
        for (int t = 0; t < m->blocks[i].n_tensors; t++) {
            const fso_tensor_desc *d = &m->blocks[i].tensors[t];
            as.weight_decay = tensor_decays(&cfg->optim, d) ? cfg->optim.weight_decay : 0.0;
            size_t off = d->offset_elems;
            fso_adamw_update(m->params[i] + off, m->grads[i] + off, tr->m[i] + off,
                             tr->v[i] + off, d->numel, &as);
        }
    tr->step++;
    st->step_ms = now_ms() - t0;
    return 0;
}

static void print_banner(const fso_config *cfg, const fso_trainer *tr, const fso_data *data,
                         const char *devices_note)
{
    const fso_model_config *mc = &cfg->model;
    const fso_model *m = &tr->model;
    printf("fsoff: %s\n", devices_note);
    printf("fsoff: config %s\n", cfg->source[0] ? cfg->source : "built-in defaults (configs/tiny.json)");
    printf("fsoff: model llama %.2fM params: %d layers, hidden %d, heads %d/%d kv, ffn %d, "
           "vocab %d%s\n",
           m->n_params / 1e6, mc->num_hidden_layers, mc->hidden_size, mc->num_attention_heads,
           mc->num_key_value_heads, mc->intermediate_size, mc->vocab_size,
           mc->tie_word_embeddings ? ", tied head" : "");
    printf("fsoff: data %s\n", data->desc);
    printf("fsoff: batch %d x %d tokens x %d accumulation = %d tokens/step, %lld steps, "
           "activation checkpointing %s\n",
           cfg->micro_batch, cfg->data.seq_len, cfg->grad_accum,
           cfg->micro_batch * cfg->data.seq_len * cfg->grad_accum, (long long)cfg->steps,
           cfg->activation_checkpointing ? "on" : "off");
    printf("fsoff: memory %.1f MiB of parameters, gradients and activations, %.1f MiB of "
           "AdamW state\n",
           m->device_bytes / 1048576.0, tr->model.n_params * 8.0 / 1048576.0);
    const fso_sched_config *sc = &cfg->sched;
    int64_t total = sc->total_num_steps > 0 ? sc->total_num_steps : cfg->steps;
    if (sc->type != FSO_SCHED_CONSTANT && sc->warmup_num_steps >= total)
        printf("fsoff: note: the scheduler warms up over %lld steps and the run has %lld: the "
               "learning rate rises to %.3g of its peak and never decays\n",
               (long long)sc->warmup_num_steps, (long long)total,
               fso_config_lr_at(cfg, total) / (sc->type == FSO_SCHED_WARMUP_COSINE
                                                   ? cfg->optim.lr
                                                   : sc->warmup_max_lr));
    fflush(stdout);
}

int fso_train_run(const fso_config *cfg, const fso_run_opts *opts)
{
    fso_backend *be = NULL;
    fso_data data = {0};
    fso_trainer tr = {0};
    fso_report rep = {0};
    int32_t *inputs = NULL, *targets = NULL;
    char err[512] = "";
    char note[256];
    int rc;

    if (strcmp(opts->devices, "cpu") != 0 && strcmp(opts->devices, "auto") != 0) {
        fprintf(stderr, "fsoff: error: --devices %s: this build has the CPU backend only; "
                        "use --devices cpu or auto\n", opts->devices);
        return -EINVAL;
    }
    if ((rc = fso_backend_create(&be, "cpu", cfg->threads)) < 0) {
        fprintf(stderr, "fsoff: error: cannot create the CPU backend: %s\n", strerror(-rc));
        return rc;
    }
    snprintf(note, sizeof note, "devices %s: CPU backend, %d threads, fp32%s", opts->devices,
             be->threads, strcmp(opts->devices, "auto") == 0 ? " (no GPU backend in this build)" : "");
    if (cfg->bf16)
        fprintf(stderr, "fsoff: warning: bf16.enabled: the CPU backend computes in fp32; "
                        "bf16 applies on GPUs\n");

    if ((rc = fso_data_init(&data, cfg)) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", data.err);
        goto out;
    }
    if ((rc = fso_trainer_init(&tr, cfg, be)) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", tr.err);
        goto out;
    }
    size_t n = (size_t)cfg->grad_accum * cfg->micro_batch * cfg->data.seq_len;
    inputs = malloc(sizeof(int32_t) * n);
    targets = malloc(sizeof(int32_t) * n);
    if (!inputs || !targets) {
        rc = -ENOMEM;
        fprintf(stderr, "fsoff: error: out of host memory for %zu batch tokens\n", n);
        goto out;
    }
    double fpt = 3.0 * fso_model_flops_per_token(&cfg->model, cfg->data.seq_len);
    if ((rc = fso_report_init(&rep, stdout, opts->metrics_path, cfg->steps, cfg->steps_per_print,
                              fpt, err, sizeof err)) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", err);
        goto out;
    }
    print_banner(cfg, &tr, &data, note);

    size_t bt = (size_t)cfg->micro_batch * cfg->data.seq_len;
    for (int64_t s = 0; s < cfg->steps; s++) {
        fso_step_stats st;
        for (int a = 0; a < cfg->grad_accum; a++)
            fso_data_next(&data, inputs + a * bt, targets + a * bt);
        if ((rc = fso_trainer_step(&tr, inputs, targets, &st)) < 0) {
            fprintf(stderr, "fsoff: error: %s\n", tr.err);
            fso_report_finish(&rep, err, sizeof err);
            goto out;
        }
        fso_report_step(&rep, &st);
    }
    if ((rc = fso_report_finish(&rep, err, sizeof err)) < 0)
        fprintf(stderr, "fsoff: error: %s\n", err);

out:
    free(inputs);
    free(targets);
    fso_trainer_free(&tr);
    fso_data_free(&data);
    fso_backend_destroy(be);
    return rc;
}
