/* train.c — optimizer steps and the training run (see train.h). */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <sys/stat.h>

#include "boxes.h"
#include "ckpt/checkpoint_run.h"
#include "config/config_json.h"
#include "data.h"
#include "plan.h"
#include "report.h"
#include "val.h"
#include "cuda/cuda_backend.h"
#include "util.h"


int fso_trainer_init(fso_trainer *tr, const fso_config *cfg)
{
    return fso_trainer_init_on(tr, cfg, NULL);
}

int fso_trainer_init_on(fso_trainer *tr, const fso_config *cfg, const struct fso_rails *rails)
{
    memset(tr, 0, sizeof *tr);
    tr->cfg = cfg;
    int rc = cfg->init_from[0] ? fso_hf_extras_read(&tr->hf, cfg->init_from, tr->err,
                                                    sizeof tr->err)
                               : 0;
    if (rc == 0)
        rc = fso_zero_create_on(&tr->zero, cfg, rails, tr->err, sizeof tr->err);
    return rc;
}

int fso_trainer_export_hf(fso_trainer *tr, const char *outdir, fso_hf_dtype dtype, char *said,
                          size_t saidlen, char *err, size_t errlen)
{
    fso_hf_export_opts o = {.dtype = dtype, .extras = &tr->hf};
    int rc = fso_zero_export_hf(tr->zero, outdir, &o, err, errlen);
    if (rc == 0)
        fso_hf_extras_describe(&tr->hf, said, saidlen);
    return rc;
}

void fso_trainer_free(fso_trainer *tr)
{
    if (!tr)
        return;
    fso_zero_destroy(tr->zero);
    tr->zero = NULL;
    fso_hf_extras_free(&tr->hf);
}

int fso_trainer_finish(fso_trainer *tr, double *waited_ms)
{
    return fso_zero_finish(tr->zero, waited_ms, tr->err, sizeof tr->err);
}

size_t fso_trainer_step_tokens(const fso_config *cfg)
{
    return (size_t)fso_config_ranks(cfg) * cfg->grad_accum * cfg->micro_batch *
           cfg->data.seq_len;
}

int fso_trainer_step(fso_trainer *tr, const int32_t *inputs, const int32_t *targets,
                     const int32_t *pos, fso_zero_step *st)
{
    return fso_zero_step_run(tr->zero, inputs, targets, pos, st, tr->err, sizeof tr->err);
}

/* The highest learning rate fine-tuning a pretrained model usually takes:
 * full fine-tuning runs at about 1e-5 to 2e-5, pre-training at 1e-3 and
 * more, which moves a pretrained model far from what it learned. */
#define FINE_TUNE_LR_MAX 1e-4

/* With model.init_from, a learning rate above FINE_TUNE_LR_MAX said in one
 * warning line with the keys to lower it. */
static void warn_pretraining_lr(FILE *out, const fso_config *cfg)
{
    const fso_sched_config *sc = &cfg->sched;
    const bool max_lr = sc->type == FSO_SCHED_WARMUP || sc->type == FSO_SCHED_WARMUP_DECAY;
    const double peak = max_lr ? sc->warmup_max_lr : cfg->optim.lr;
    if (!cfg->init_from[0] || peak <= FINE_TUNE_LR_MAX)
        return;
    const char *key = max_lr ? "scheduler.params.warmup_max_lr" : "optimizer.params.lr";
    char warmup[128] = "";
    if (sc->type != FSO_SCHED_CONSTANT)
        snprintf(warmup, sizeof warmup, " with a short warmup (scheduler.params.warmup_num_steps, "
                                        "%lld now)", (long long)sc->warmup_num_steps);
    fflush(out);
    fprintf(stderr, "fsoff: warning: learning rate %g (%s) is a pre-training rate: it will undo "
                    "much of what the model from %s learned; fine-tuning usually takes 1e-5 to "
                    "2e-5 (--set %s=2e-5)%s\n", peak, key, cfg->init_from, key, warmup);
}

static void print_banner(FILE *out, const fso_config *cfg, const fso_trainer *tr,
                         const fso_data *data, const char *devices_note)
{
    const fso_model_config *mc = &cfg->model;
    const fso_model *m = fso_zero_model(tr->zero);
    char placement[512];
    fprintf(out, "fsoff: %s\n", devices_note);
    fprintf(out, "fsoff: config %s\n",
            cfg->source[0] ? cfg->source : "built-in defaults (configs/tiny.json)");
    fprintf(out, "fsoff: model %s %.2fM params: %d layers, hidden %d, heads %d/%d kv, ffn %d, "
                 "vocab %d%s\n",
            fso_config_choice_name(fso_config_model_type_choices, mc->model_type),
            m->n_params / 1e6, mc->num_hidden_layers, mc->hidden_size, mc->num_attention_heads,
            mc->num_key_value_heads, mc->intermediate_size, mc->vocab_size,
            mc->tie_word_embeddings ? ", tied head" : "");
    if (cfg->init_from[0])
        fprintf(out, "fsoff: parameters from Hugging Face folder %s%s%s\n", cfg->init_from,
                mc->rope_scaling.type ? ", rope_scaling " : "",
                mc->rope_scaling.type ? fso_rope_type_name(mc->rope_scaling.type) : "");
    warn_pretraining_lr(out, cfg);
    fprintf(out, "fsoff: data %s\n", data->desc);
    char boxes[64] = "";
    if (fso_config_boxes(cfg) > 1)
        snprintf(boxes, sizeof boxes, " x %d boxes", fso_config_boxes(cfg));
    fprintf(out, "fsoff: batch %d x %d tokens x %d accumulation x %d devices%s = %zu "
                 "tokens/step, %lld steps, activation checkpointing %s\n",
            cfg->micro_batch, cfg->data.seq_len, cfg->grad_accum, cfg->world, boxes,
            fso_trainer_step_tokens(cfg), (long long)cfg->steps,
            !cfg->activation_checkpointing   ? "off"
            : m->acts_tier == FSO_TIER_HOST ? "on, kept inputs on the host"
                                            : "on");
    fso_zero_describe(tr->zero, placement, sizeof placement);
    fprintf(out, "fsoff: state %s\n", placement);
    const char *pin = fso_zero_pin_refused(tr->zero);
    if (pin) {
        fflush(out);
        fprintf(stderr, "fsoff: warning: %s\n", pin);
    }
    static const char *const overlap_how[] = {
        [FSO_OVERLAP_NONE] = "serialized after backward",
        [FSO_OVERLAP_FORWARD] = "per block, during the next forward",
        [FSO_OVERLAP_BACKWARD] = "per block, as gradients land",
    };
    fprintf(out, "fsoff: optimizer overlap %s (%s)\n",
            fso_config_choice_name(fso_config_overlap_choices, cfg->optimizer_overlap),
            overlap_how[cfg->optimizer_overlap]);
    const fso_sched_config *sc = &cfg->sched;
    int64_t total = sc->total_num_steps > 0 ? sc->total_num_steps : cfg->steps;
    if (sc->type != FSO_SCHED_CONSTANT && sc->warmup_num_steps >= total)
        fprintf(out, "fsoff: note: the scheduler warms up over %lld steps and the run has %lld: "
                     "the learning rate rises to %.3g of its peak and never decays\n",
                (long long)sc->warmup_num_steps, (long long)total,
                fso_config_lr_at(cfg, total) / (sc->type == FSO_SCHED_WARMUP_COSINE
                                                    ? cfg->optim.lr
                                                    : sc->warmup_max_lr));
    fflush(out);
}

/* ------------------------------------------------------------------ boxes */

/* Across boxes (boxes.h), before anything is planned or allocated: every
 * box runs the same build on the same resolved configuration and data (a
 * stale binary or configuration on one node is the commonest cluster
 * mistake: named, not trained on), then the rails that join each device
 * to the others. 0 or negative errno after one error line. */
/* The same configuration on every box: its resolved text compared, the
 * first differing line named. */
static int agree_config(const fso_config *cfg, const char *what, char *err, size_t errlen)
{
    json_t *j = fso_config_to_json(cfg);
    char *text = j ? json_dumps(j, JSON_SORT_KEYS | JSON_INDENT(1)) : NULL;
    json_decref(j);
    if (!text) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int rc = fso_boxes_check_bytes(what, text, strlen(text), err, errlen);
    free(text);
    return rc;
}

static int join_boxes(const fso_config *cfg, fso_rails *rails)
{
    char err[2048];
    fso_boxes_set_timeout(cfg->comm_timeout_s);
    int rc = fso_boxes_check_build(err, sizeof err);
    if (rc == 0)
        rc = agree_config(cfg, "the resolved configuration", err, sizeof err);
    const char *const files[2][2] = {{"data.path", cfg->data.path},
                                     {"data.val_path", cfg->data.val_path}};
    for (int i = 0; i < 2 && rc == 0; i++) {
        struct stat st;
        if (files[i][1][0] && stat(files[i][1], &st) == 0 && S_ISREG(st.st_mode))
            rc = fso_boxes_check_file(files[i][0], files[i][1], err, sizeof err);
    }
    if (rc == 0)
        rc = fso_boxes_rails(fso_config_world(cfg), cfg->backend == FSO_BACKEND_CUDA,
                             cfg->comm_rails, rails, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "fsoff: error: %s\n", err);
    return rc;
}

/* After each box planned its run on its own machine: the same placement
 * and batch split on every box, or the run stops naming the first
 * difference (each box's rails carry a shard where it lives, so boxes that
 * place alike stay in step, and their data must split alike). */
static int agree_plan(const fso_config *run_cfg)
{
    char err[2048];
    int rc = agree_config(run_cfg, "the planned configuration (each box planned on its own "
                          "machine; give the plan's keys in the configuration, `fsoff plan` "
                          "prints them, so that every box runs the same)", err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "fsoff: error: %s\n", err);
    return rc;
}

/* ------------------------------------------------------------------ devices */

/* What the run knows of its devices before it opens them. */
typedef struct run_devices {
    bool cuda;
    char name[256];            /* GPU 0's name, "GPU" when unknown */
    double peak_tflops;        /* all devices, dense bf16; 0: unknown (no MFU) */
    uint64_t gpu_free;         /* the least any of the GPUs has free; 0: unknown */
    char note[1536];           /* the banner's devices line */
} run_devices;

static void describe_devices(const fso_config *cfg, const fso_run_opts *opts, run_devices *d)
{
    memset(d, 0, sizeof *d);
    d->cuda = cfg->backend == FSO_BACKEND_CUDA;
    snprintf(d->name, sizeof d->name, "GPU");
    if (d->cuda) {
#if FSO_HAVE_CUDA
        fso_gpu_info gi;
        char gerr[256];
        if (fso_gpu_info_query(0, &gi, gerr, sizeof gerr) == 0) {
            snprintf(d->name, sizeof d->name, "%s", gi.name);
            d->peak_tflops = gi.bf16_peak_tflops * cfg->world;
            d->gpu_free = gi.mem_free_bytes;
        }
        for (int r = 1; r < cfg->world; r++)
            if (fso_gpu_info_query(r, &gi, gerr, sizeof gerr) == 0 &&
                gi.mem_free_bytes < d->gpu_free)
                d->gpu_free = gi.mem_free_bytes;
#endif
        snprintf(d->note, sizeof d->note, "devices %s: %d CUDA GPU%s (%s), bf16 matmuls, %s",
                 opts->devices, cfg->world, cfg->world > 1 ? "s" : "", d->name,
                 cfg->bf16 ? (cfg->activation_checkpointing
                                  ? "bf16 weights, activations and kept layer inputs, fp32 "
                                    "residual stream, master and gradients"
                                  : "bf16 weights and activations, fp32 residual stream, master "
                                    "and gradients")
                           : "fp32 storage");
        return;
    }
    int threads = cfg->threads > 0 ? cfg->threads : fso_cpu_count();
    char why[1040] = "";
    if (strcmp(opts->devices, "auto") == 0) {
        char reason[1024];
        fso_cuda_available(reason, sizeof reason);
        snprintf(why, sizeof why, " (%s)", reason);
    }
    snprintf(d->note, sizeof d->note, "devices %s: %d CPU device%s, %d thread%s each, fp32%s%s",
             opts->devices, cfg->world, cfg->world > 1 ? "s" : "",
             threads / cfg->world > 0 ? threads / cfg->world : 1,
             threads / cfg->world > 1 ? "s" : "",
             cfg->bf16 ? (cfg->activation_checkpointing
                              ? " compute, bf16 weights, activations and kept layer inputs"
                              : " compute, bf16 weights and activations")
                       : "",
             why);
    if (cfg->bf16)
        fprintf(stderr, "fsoff: warning: bf16.enabled: working parameters and the activations "
                        "inside layers%s are stored as bf16 (fp32 master and residual "
                        "stream); the CPU backend computes in fp32 from them\n",
                cfg->activation_checkpointing ? ", and the layer inputs kept for backward,"
                                              : "");
}

/* ------------------------------------------------------------------ the plan */

/* The run's plan and what the re-plan measures against it. */
typedef struct run_plan {
    fso_plan *plan;            /* NULL: not planned */
    fso_plan_pins pins;
    bool applied;              /* the run took the plan's placement */
    fso_plan_measured sums;    /* stall, optimizer and compute ms over the measured steps */
    double *block_ms;          /* per block, summed over the measured steps */
    uint64_t nvme_rd, nvme_wr;
    fso_plan_batch batch;      /* the split of the global batch (have_batch) */
    bool have_batch;
    const char *batch_why;     /* what chose the split the run takes; NULL: advice only */
    char aio_auto[512];        /* what aio keys given "auto" became; "" */
} run_plan;

/* Before anything is sized by them: the aio settings given "auto", and,
 * when the split of the global batch is the planner's (--auto-batch, or
 * "auto" in the config), the split, taken into *split (a copy of cfg, NULL
 * when nothing changes). 0, or -ENOMEM. */
static int split_batch(const fso_config *cfg, const fso_run_opts *opts, const run_devices *d,
                       run_plan *rp, fso_config **split)
{
    *split = NULL;
    const char *why;
    fso_config aio = *cfg;
    if (fso_plan_auto_aio(&aio, rp->aio_auto, sizeof rp->aio_auto) > 0) {
        if (!(*split = malloc(sizeof **split)))
            return -ENOMEM;
        **split = aio;
        cfg = *split;
    }
    if (!fso_plan_batch_is_free(cfg, opts->auto_batch, &why) || (d->cuda && !d->gpu_free))
        return 0;
    char err[1024];
    fso_plan_pins pins;
    fso_plan_pins_from_config(cfg, &pins);
    if (fso_plan_batch_for_config(cfg, &pins, d->cuda ? d->name : NULL, d->gpu_free, &rp->batch,
                                  err, sizeof err) < 0) {
        fprintf(stderr, "fsoff: warning: %s: the batch split was not planned (%s); the "
                        "configured split stands\n", why, err);
        return 0;
    }
    rp->have_batch = true;
    if (rp->batch.step_ms < 0) /* nothing fits: the plan says why */
        return 0;
    if (!*split && !(*split = malloc(sizeof **split)))
        return -ENOMEM;
    if (*split != cfg)
        **split = *cfg;
    fso_plan_batch_apply(&rp->batch, *split);
    rp->batch_why = why;
    return 0;
}

/* The budget, before anything is allocated: what the model needs on each
 * tier against what this machine holds, by arithmetic. The placement the
 * configuration leaves open is then chosen by predicted step time
 * (plan.h); on GPUs from the table of achieved figures for their model, on
 * CPU devices from one layer timed here. The plan goes into run_cfg when
 * the engine can take it. A budget that no placement meets is the run's
 * one error line (-ENOSPC); a plan the planner cannot make is a note, and
 * the engine's own budget decides. */
static int plan_run(const fso_config *cfg, const run_devices *d, fso_config *run_cfg,
                    run_plan *rp, FILE *out)
{
    char err[1024];
    fso_plan_machine caps;
    fso_plan_pins_from_config(cfg, &rp->pins);
    fso_plan_capacities_here(cfg, d->cuda, d->gpu_free, &caps);
    if (fso_plan_check_size(cfg, &rp->pins, &caps, d->cuda, true, err, sizeof err) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", err);
        return -ENOSPC;
    }
    if (d->cuda && !d->gpu_free)
        return 0; /* nothing to plan with: the engine reads each GPU's free memory */
    rp->plan = malloc(sizeof *rp->plan);
    if (!rp->plan)
        return 0;
    const fso_gpu_spec *spec = NULL;
    int prc = d->cuda ? fso_plan_for_config_gpus(cfg, &rp->pins, d->name, d->gpu_free, rp->plan,
                                                 &spec, err, sizeof err)
                      : fso_plan_for_config(cfg, &rp->pins, rp->plan, err, sizeof err);
    if (spec)
        fprintf(out, "plan: GPU figures assumed for %s: %s, %.0f TFLOP/s achieved, copies %.0f "
                     "GB/s, collectives %.0f GB/s (fsoff plan --help lists the table)\n",
                d->name, spec->desc, spec->tflops, spec->h2d_gbps, spec->coll_gbps);
    if (prc < 0) {
        if (prc == -ENOSPC) /* no placement fits: the budget fails */
            fprintf(stderr, "fsoff: error: %s\n", err);
        else /* the engine's own budget check decides; the planner's view is a note */
            fprintf(out, "fsoff: plan: %s\n", err);
        free(rp->plan);
        rp->plan = NULL;
        return prc == -ENOSPC ? prc : 0;
    }
    fso_plan_print(out, rp->plan);
    /* the batch split and where compute hides the optimizer: chosen before
     * (split_batch), or advice when compute does not hide the optimizer */
    if (!rp->have_batch && !fso_plan_optimizer_hidden(rp->plan))
        rp->have_batch = fso_plan_batch_for_config(cfg, &rp->pins, d->cuda ? d->name : NULL,
                                                   d->gpu_free, &rp->batch, err,
                                                   sizeof err) == 0;
    if (rp->have_batch)
        fso_plan_batch_print(out, &rp->batch, rp->batch_why, rp->batch_why != NULL);
    fso_plan_auto_print(out, cfg, rp->plan);
    if (rp->aio_auto[0])
        fprintf(out, "plan: %s\n", rp->aio_auto);
    char dirs[8192], missing[8192];
    fso_plan_nvme_folders(cfg, dirs, sizeof dirs, missing, sizeof missing);
    fso_plan_unused_nvme(out, rp->plan, dirs);
    if (fso_plan_apply(rp->plan, run_cfg, err, sizeof err) < 0) {
        fprintf(out, "fsoff: plan not applied (%s); running the configured placement\n", err);
    } else {
        rp->applied = true;
        rp->pins.acts = rp->plan->pl.acts; /* the activations stay where they start: a re-plan
                                              moves state, not the model's buffers */
    }
    return 0;
}

/* A step's measurements into the sums (the first step is excluded, as in
 * the report). */
static void measure(run_plan *rp, const fso_zero_step *st, const fso_trainer *tr, int n_blocks)
{
    rp->sums.stall_ms += st->stall_ms;
    rp->sums.optimizer_ms += st->optimizer_ms;
    rp->sums.compute_ms += st->compute_ms;
    rp->nvme_rd += st->nvme_read_bytes;
    rp->nvme_wr += st->nvme_write_bytes;
    const double *ms = fso_zero_block_compute_ms(tr->zero);
    for (int b = 0; b < n_blocks; b++)
        rp->block_ms[b] += ms[b];
}

/* The mean of the measured steps, what the planner can be corrected with. */
static fso_plan_measured measured_mean(run_plan *rp, const fso_config *cfg,
                                       const fso_report *rep)
{
    const double n = (double)(rep->steps - 1), ms_sum = rep->ms_sum_after_first;
    const int nb = fso_model_n_blocks(&cfg->model);
    for (int b = 0; b < nb; b++)
        rp->block_ms[b] /= n;
    fso_plan_measured meas = {.step_ms = ms_sum / n, .stall_ms = rp->sums.stall_ms / n,
                              .optimizer_ms = -1, .compute_ms = rp->sums.compute_ms / n,
                              .nvme_read_gbps = -1, .nvme_write_gbps = -1,
                              .block_compute_ms = rp->block_ms, .n_blocks = nb};
    if (!rp->plan->machine.cpu_devices) { /* on GPUs the host's clock sees launches, not compute */
        meas.compute_ms = -1;
        meas.block_compute_ms = NULL;
    }
    /* the optimizer's busy time is AdamW's only when it waits on no reads */
    bool opt_reads = false;
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        opt_reads = opt_reads || fso_offload_tier(&cfg->offload, (fso_kind)k) == FSO_TIER_NVME;
    if (!opt_reads)
        meas.optimizer_ms = rp->sums.optimizer_ms / n;
    /* NVMe rates only when the reads held compute up: otherwise bytes over
     * the step would understate what the drive can do */
    if (meas.stall_ms > 0.1 * meas.step_ms && rp->nvme_rd)
        meas.nvme_read_gbps = rp->nvme_rd / (ms_sum * 1e6);
    if (meas.stall_ms > 0.1 * meas.step_ms && rp->nvme_wr)
        meas.nvme_write_gbps = rp->nvme_wr / (ms_sum * 1e6);
    return meas;
}

/* Move the running state to the corrected plan's placement; cfg and the
 * plan follow when it moved. */
static void move_to(run_plan *rp, const fso_plan *corrected, fso_config *cfg, fso_trainer *tr,
                    FILE *out)
{
    char msg[512], err[512], h[32];
    fso_config *next = malloc(sizeof *next);
    if (!next) {
        fprintf(out, "fsoff: plan: the placement stays (out of memory)\n");
        return;
    }
    *next = *cfg;
    if (fso_plan_apply(corrected, next, err, sizeof err) < 0) {
        fprintf(out, "fsoff: plan: the placement stays (%s)\n", err);
        goto out;
    }
    double waited = 0, t0 = fso_now_ms();
    uint64_t moved = 0;
    if (fso_trainer_finish(tr, &waited) < 0) {
        fprintf(out, "fsoff: plan: the placement stays (%s)\n", tr->err);
        goto out;
    }
    if (fso_zero_retier(tr->zero, &next->offload, &moved, err, sizeof err) < 0) {
        fprintf(out, "fsoff: plan: %s\n", err);
        goto out;
    }
    cfg->offload = next->offload;
    *rp->plan = *corrected;
    fso_human_bytes(h, sizeof h, (double)moved);
    fso_zero_describe(tr->zero, msg, sizeof msg);
    fprintf(out, "fsoff: plan: moved %s in %.0f ms; state %s\n", h, fso_now_ms() - t0, msg);
out:
    free(next);
}

/* The re-plan, once, after a few steps: the mean of the measured steps
 * (the first excluded) against the plan. When the prediction was off by
 * more than 20% the planner chooses again with corrected rates; a
 * different placement is taken, moving the state between tiers, when the
 * saving repays the move within the steps left (on one box: across boxes
 * each would choose from its own measurements, so the placement stays). */
static void replan(run_plan *rp, fso_config *cfg, int64_t steps_left, fso_trainer *tr,
                   fso_report *rep, FILE *out)
{
    if (rep->steps - 1 < 1)
        return;
    fso_plan_measured meas = measured_mean(rp, cfg, rep);
    fso_plan *corrected = malloc(sizeof *corrected);
    char msg[768], h[32];
    if (!corrected)
        return;
    /* the batch advice of the start, again at the rates these steps ran */
    fso_plan_batch mb;
    if (rp->have_batch &&
        fso_plan_batch_measured(cfg, &rp->pins, rp->plan, &meas, &mb, msg, sizeof msg) == 0 &&
        mb.step_ms >= 0) {
        fso_plan_batch_hide_words(&mb, msg, sizeof msg);
        fprintf(out, "fsoff: plan: batch, at the rates measured: %s\n", msg);
    }
    if (fso_plan_check(cfg, &rp->pins, rp->plan, &meas, corrected, msg, sizeof msg) != 1)
        goto out;
    fso_plan_move mv;
    fso_plan_revision(rp->plan, corrected, meas.step_ms, steps_left, &mv);
    if (!mv.changes) /* the corrected plan places the state as it is: nothing to say */
        goto out;
    fprintf(out, "fsoff: %s\n", msg);
    if (!rp->applied) {
        fprintf(out, "fsoff: plan: the running placement is the configured one, not the "
                     "plan's; it stays\n");
        goto out;
    }
    /* each box measured its own steps, so each would choose on its own; a
     * box placing a shard elsewhere takes another rail (engine/boxes.h) */
    if (fso_config_boxes(cfg) > 1) {
        fprintf(out, "fsoff: plan: across boxes the placement stays (each box measures its own "
                     "steps); give the corrected plan's keys in the configuration to run it\n");
        goto out;
    }
    if (!mv.pays) {
        fso_human_bytes(h, sizeof h, (double)mv.bytes);
        fprintf(out, "fsoff: plan: the placement stays: %.0f ms/step saved over %lld steps left "
                     "does not repay moving %s (about %.0f ms)\n",
                mv.saving_ms, (long long)steps_left, h, mv.move_ms);
        goto out;
    }
    move_to(rp, corrected, cfg, tr, out);
out:
    free(corrected);
}

/* ------------------------------------------------------------------ the run */

/* The next step's batches into inputs, targets and pos (NULL: the data has
 * no documents). Batches in which no target counts (masked data) are
 * passed over with one warning line each, as long as one pass over the
 * data lasts; then -ENODATA after an error line. */
static int next_batches(fso_data *data, const fso_config *cfg, int64_t step, int32_t *inputs,
                        int32_t *targets, int32_t *pos)
{
    const size_t n = fso_trainer_step_tokens(cfg);
    const size_t bt = (size_t)cfg->micro_batch * cfg->data.seq_len;
    for (size_t tries = 0;; tries++) {
        size_t counted = 0;
        for (size_t a = 0; a < n / bt; a++)
            counted += fso_data_next(data, inputs + a * bt, targets + a * bt,
                                     pos ? pos + a * bt : NULL);
        if (counted > 0)
            return 0;
        if (tries * n > data->n_tokens) {
            fprintf(stderr, "fsoff: error: step %lld: no target of a whole pass over %s counts "
                    "(every one in the batches fsoff cuts is masked); give data with targets "
                    "to learn\n", (long long)step, data->desc);
            return -ENODATA;
        }
        fprintf(stderr, "fsoff: warning: step %lld: no target of its batches counts (every "
                "one is masked); they are passed over and the step takes the next batches\n",
                (long long)step);
    }
}

/* A validation pass and its line: 0 or negative errno after one error line. */
static int validate(fso_val *val, fso_trainer *tr, fso_report *rep)
{
    fso_val_result res;
    int rc = fso_val_run(val, tr, &res);
    if (rc < 0)
        fprintf(stderr, "fsoff: error: %s\n", val->err);
    else
        fso_report_val(rep, &res);
    return rc;
}

/* The steps: data, the step, its line, the measurements, and after five
 * steps the re-plan. 0 or negative errno after one error line. */
static int run_steps(fso_config *cfg, fso_data *data, fso_val *val, fso_trainer *tr,
                     fso_report *rep, run_plan *rp, fso_ckpt_run *ck, FILE *out)
{
    const size_t n = fso_trainer_step_tokens(cfg);
    int32_t *inputs = malloc(sizeof(int32_t) * n), *targets = malloc(sizeof(int32_t) * n);
    int32_t *pos = fso_data_documents(data) ? malloc(sizeof(int32_t) * n) : NULL;
    int rc = 0;
    if (!inputs || !targets || (fso_data_documents(data) && !pos)) {
        rc = -ENOMEM;
        fprintf(stderr, "fsoff: error: out of host memory for %zu batch tokens\n", n);
        goto out;
    }
    const int64_t s0 = fso_zero_steps(tr->zero); /* after a resume, the checkpoint's step */
    for (int64_t s = s0; s < cfg->steps && !fso_ckpt_run_stopping(ck); s++) {
        fso_zero_step st;
        if (fso_val_due(val, s) && (rc = validate(val, tr, rep)) < 0)
            goto out;
        if ((rc = next_batches(data, cfg, s + 1, inputs, targets, pos)) < 0)
            goto out;
        if ((rc = fso_trainer_step(tr, inputs, targets, pos, &st)) < 0) {
            fprintf(stderr, "fsoff: error: %s\n", tr->err);
            goto out;
        }
        fso_report_step(rep, &st);
        fso_ckpt_run_after_step(ck, rep);
        if (rp->plan && s > s0)
            measure(rp, &st, tr, fso_model_n_blocks(&cfg->model));
        /* after a few steps: was the prediction right? If not, plan again
         * from what was measured, and move the state when that pays. */
        if (rp->plan && s + 1 - s0 == (cfg->steps - s0 < 6 ? -1 : 5))
            replan(rp, cfg, cfg->steps - (s + 1), tr, rep, out);
    }
    if (rc == 0)
        rc = fso_ckpt_run_boxes_rc(ck); /* a box died: said already */
out:
    free(inputs);
    free(targets);
    free(pos);
    return rc;
}

int fso_train_run(const fso_config *cfg, const fso_run_opts *opts)
{
    FILE *out = opts->out ? opts->out : stdout;
    fso_data data = {0};
    fso_val val = {0};
    fso_trainer tr = {0};
    fso_report rep = {0};
    run_devices dev;
    run_plan rp = {0};
    fso_ckpt_run *ck = NULL;
    fso_rails rails = {.boxes = 1};
    char err[512] = "";
    int rc = -ENOMEM;

    describe_devices(cfg, opts, &dev);
    fso_plan_time_afresh(); /* CPU devices: the plan at this minute's speed */
    fso_config *split = NULL;
    if (split_batch(cfg, opts, &dev, &rp, &split) < 0) {
        fprintf(stderr, "fsoff: error: out of memory\n");
        return -ENOMEM;
    }
    if (split) /* the run as the split makes it: data, report and plan */
        cfg = split;
    fso_config *run_cfg = malloc(sizeof *run_cfg);
    if (!run_cfg) {
        fprintf(stderr, "fsoff: error: out of memory\n");
        free(split);
        return -ENOMEM;
    }
    *run_cfg = *cfg;
    /* what can be checked before planning: the data and the metrics file */
    if ((rc = fso_data_init(&data, cfg)) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", data.err);
        goto out;
    }
    if ((rc = fso_val_init(&val, cfg)) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", val.err);
        goto out;
    }
    if (fso_config_boxes(cfg) > 1 && (rc = join_boxes(cfg, &rails)) < 0)
        goto out;
    if ((rc = fso_ckpt_run_start(&ck, run_cfg, opts, out, err, sizeof err)) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", err);
        goto out;
    }
    double fpt = 3.0 * fso_model_flops_per_token(&cfg->model, cfg->data.seq_len);
    if ((rc = fso_report_init(&rep, out, opts->metrics_path, fso_ckpt_run_resuming(ck),
                              cfg->steps, cfg->steps_per_print, fpt, err, sizeof err)) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", err);
        goto out;
    }
    rep.peak_flops = dev.peak_tflops * 1e12;
    if ((rc = plan_run(cfg, &dev, run_cfg, &rp, out)) < 0)
        goto out;
    if (fso_config_boxes(cfg) > 1 && (rc = agree_plan(run_cfg)) < 0)
        goto out;
    cfg = run_cfg;
    if (rp.plan && !(rp.block_ms = calloc((size_t)fso_model_n_blocks(&cfg->model),
                                          sizeof *rp.block_ms))) {
        fprintf(stderr, "fsoff: error: out of memory\n");
        rc = -ENOMEM;
        goto out;
    }
    if ((rc = fso_trainer_init_on(&tr, cfg, &rails)) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", tr.err);
        goto out;
    }
    rep.pin_refused = fso_zero_pin_refused(tr.zero) != NULL;
    print_banner(out, cfg, &tr, &data, dev.note);
    if (rails.note[0])
        fprintf(out, "%s\n", rails.note);
    if ((rc = fso_ckpt_run_resume(ck, &tr, &data, &rep, err, sizeof err)) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", err);
        goto out;
    }
    if (rp.plan && rep.metrics) { /* the plan the run starts from, as fsoff plan --json */
        json_t *ev = json_pack("{s:s, s:o}", "event", "plan", "plan", fso_plan_json(rp.plan));
        char *s = ev ? json_dumps(ev, JSON_REAL_PRECISION(6)) : NULL;
        fso_report_event(&rep, s);
        free(s);
        json_decref(ev);
    }

    rc = run_steps(run_cfg, &data, &val, &tr, &rep, &rp, ck, out);
    double waited = 0;
    if (rc == 0 && (rc = fso_trainer_finish(&tr, &waited)) < 0)
        fprintf(stderr, "fsoff: error: the last update failed: %s\n", tr.err);
    rep.final_update_ms = waited;
    rc = fso_ckpt_run_finish(ck, &rep, rc);
    rep.first_step = fso_ckpt_run_first_step(ck);
    rep.stopped_by = fso_ckpt_run_stopped_by(ck);
    if (rc == 0 && !rep.stopped_by && val.on) /* after the last step (and its save) */
        rc = validate(&val, &tr, &rep);
    rep.failed = rc < 0;
    rep.peak_device_bytes = fso_zero_peak_device_bytes(tr.zero);
    rep.pin_refused = fso_zero_pin_refused(tr.zero) != NULL; /* a re-plan may have grown it */
    int frc = fso_report_finish(&rep, err, sizeof err);
    if (rc == 0 && (rc = frc) < 0)
        fprintf(stderr, "fsoff: error: %s\n", err);
    if (rc == 0 && rep.stopped_by)
        rc = FSO_RUN_STOPPED;

out:
    if (rep.metrics) /* refused before the first step */
        fclose(rep.metrics);
    free(rp.plan);
    free(rp.block_ms);
    fso_ckpt_run_free(ck); /* before the state it may still be saving */
    fso_trainer_free(&tr);
    fso_boxes_rails_free(&rails);
    fso_data_free(&data);
    fso_val_free(&val);
    free(run_cfg);
    free(split);
    return rc;
}
