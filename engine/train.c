/* train.c — optimizer steps and the training run (see train.h). */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data.h"
#include "plan.h"
#include "report.h"
#include "cuda_backend.h"
#include "util.h"


int fso_trainer_init(fso_trainer *tr, const fso_config *cfg)
{
    memset(tr, 0, sizeof *tr);
    tr->cfg = cfg;
    return fso_zero_create(&tr->zero, cfg, tr->err, sizeof tr->err);
}

void fso_trainer_free(fso_trainer *tr)
{
    if (!tr)
        return;
    fso_zero_destroy(tr->zero);
    tr->zero = NULL;
}

int fso_trainer_finish(fso_trainer *tr, double *waited_ms)
{
    return fso_zero_finish(tr->zero, waited_ms, tr->err, sizeof tr->err);
}

size_t fso_trainer_step_tokens(const fso_config *cfg)
{
    return (size_t)(cfg->world > 0 ? cfg->world : 1) * cfg->grad_accum * cfg->micro_batch *
           cfg->data.seq_len;
}

int fso_trainer_step(fso_trainer *tr, const int32_t *inputs, const int32_t *targets,
                     fso_step_stats *st)
{
    fso_zero_step zs;
    double t0 = fso_now_ms();
    memset(st, 0, sizeof *st);
    st->step = tr->step + 1;
    int rc = fso_zero_step_run(tr->zero, st->step, inputs, targets, &zs, tr->err, sizeof tr->err);
    st->loss = zs.loss;
    st->grad_norm = zs.grad_norm;
    if (rc < 0)
        return rc;
    st->lr = zs.lr;
    st->clip_coef = zs.clip_coef;
    st->stall_ms = zs.stall_ms;
    st->compute_ms = zs.compute_ms;
    st->optimizer_ms = zs.optimizer_ms;
    st->optimizer_exposed_ms = zs.optimizer_exposed_ms;
    st->nvme_read_bytes = zs.nvme_read_bytes;
    st->nvme_write_bytes = zs.nvme_write_bytes;
    st->tokens = (int64_t)fso_trainer_step_tokens(tr->cfg);
    st->stale_marks = fso_zero_stale_marks(tr->zero);
    tr->step++;
    st->step_ms = fso_now_ms() - t0;
    return 0;
}

static void print_banner(const fso_config *cfg, const fso_trainer *tr, const fso_data *data,
                         const char *devices_note)
{
    const fso_model_config *mc = &cfg->model;
    const fso_model *m = fso_zero_model(tr->zero);
    char placement[512];
    printf("fsoff: %s\n", devices_note);
    printf("fsoff: config %s\n", cfg->source[0] ? cfg->source : "built-in defaults (configs/tiny.json)");
    printf("fsoff: model llama %.2fM params: %d layers, hidden %d, heads %d/%d kv, ffn %d, "
           "vocab %d%s\n",
           m->n_params / 1e6, mc->num_hidden_layers, mc->hidden_size, mc->num_attention_heads,
           mc->num_key_value_heads, mc->intermediate_size, mc->vocab_size,
           mc->tie_word_embeddings ? ", tied head" : "");
    printf("fsoff: data %s\n", data->desc);
    printf("fsoff: batch %d x %d tokens x %d accumulation x %d devices = %zu tokens/step, "
           "%lld steps, activation checkpointing %s\n",
           cfg->micro_batch, cfg->data.seq_len, cfg->grad_accum, cfg->world,
           fso_trainer_step_tokens(cfg), (long long)cfg->steps,
           cfg->activation_checkpointing ? "on" : "off");
    fso_zero_describe(tr->zero, placement, sizeof placement);
    printf("fsoff: state %s\n", placement);
    const char *pin = fso_zero_pin_refused(tr->zero);
    if (pin) {
        fflush(stdout);
        fprintf(stderr, "fsoff: warning: %s\n", pin);
    }
    static const char *const overlap[] = {"none (serialized after backward)",
                                          "forward (per block, during the next forward)",
                                          "backward (per block, as gradients land)"};
    printf("fsoff: optimizer overlap %s\n", overlap[cfg->optimizer_overlap]);
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

/* The re-plan (DESIGN §6), once, after a few steps: the mean of the
 * measured steps (the first excluded) against the plan. When the prediction
 * was off by more than 20% the planner chooses again with corrected rates;
 * a different placement is taken, moving the state between tiers, when the
 * saving repays the move within the steps left. */
static void replan(fso_config *cfg, const fso_plan_pins *pins, fso_plan *plan, bool applied,
                   const fso_plan_measured *sums, double *block_ms, uint64_t nvme_rd,
                   uint64_t nvme_wr, int64_t nsteps, double ms_sum, int64_t steps_left,
                   fso_trainer *tr, fso_report *rep)
{
    if (nsteps < 1)
        return;
    double n = (double)nsteps;
    const int nb = cfg->model.num_hidden_layers + 2;
    for (int b = 0; b < nb; b++)
        block_ms[b] /= n;
    fso_plan_measured meas = {.step_ms = ms_sum / n, .stall_ms = sums->stall_ms / n,
                              .optimizer_ms = -1, .compute_ms = sums->compute_ms / n,
                              .nvme_read_gbps = -1, .nvme_write_gbps = -1,
                              .block_compute_ms = block_ms, .n_blocks = nb};
    if (!plan->machine.cpu_devices) { /* on GPUs the host's clock sees launches, not compute */
        meas.compute_ms = -1;
        meas.block_compute_ms = NULL;
    }
    /* the optimizer's busy time is AdamW's only when it waits on no reads */
    if (cfg->offload.optim_tier != FSO_TIER_NVME)
        meas.optimizer_ms = sums->optimizer_ms / n;
    /* NVMe rates only when the reads held compute up: otherwise bytes over
     * the step would understate what the drive can do */
    if (meas.stall_ms > 0.1 * meas.step_ms && nvme_rd)
        meas.nvme_read_gbps = nvme_rd / (ms_sum * 1e6);
    if (meas.stall_ms > 0.1 * meas.step_ms && nvme_wr)
        meas.nvme_write_gbps = nvme_wr / (ms_sum * 1e6);
    static fso_plan corrected;
    char msg[512], err[512], h[32];
    if (fso_plan_check(cfg, pins, plan, &meas, &corrected, msg, sizeof msg) != 1)
        return;
    printf("fsoff: %s\n", msg);
    fso_plan_move mv;
    fso_plan_revision(plan, &corrected, meas.step_ms, steps_left, &mv);
    if (!mv.changes || !applied) {
        if (mv.changes)
            printf("fsoff: plan: the running placement is the configured one, not the plan's; "
                   "it stays\n");
        return;
    }
    fso_human_bytes(h, sizeof h, (double)mv.bytes);
    if (!mv.pays) {
        printf("fsoff: plan: the placement stays: %.0f ms/step saved over %lld steps left does "
               "not repay moving %s (about %.0f ms)\n",
               mv.saving_ms, (long long)steps_left, h, mv.move_ms);
        return;
    }
    fso_config next = *cfg;
    if (fso_plan_apply(&corrected, &next, err, sizeof err) < 0) {
        printf("fsoff: plan: the placement stays (%s)\n", err);
        return;
    }
    double waited = 0, t0 = fso_now_ms();
    uint64_t moved = 0;
    if (fso_trainer_finish(tr, &waited) < 0) {
        printf("fsoff: plan: the placement stays (%s)\n", tr->err);
        return;
    }
    rep->optimizer_exposed_ms += waited;
    if (fso_zero_retier(tr->zero, &next.offload, &moved, err, sizeof err) < 0) {
        printf("fsoff: plan: %s\n", err);
        return;
    }
    cfg->offload = next.offload;
    *plan = corrected;
    fso_human_bytes(h, sizeof h, (double)moved);
    fso_zero_describe(tr->zero, msg, sizeof msg);
    printf("fsoff: plan: moved %s in %.0f ms; state %s\n", h, fso_now_ms() - t0, msg);
}

int fso_train_run(const fso_config *cfg, const fso_run_opts *opts)
{
    fso_data data = {0};
    fso_trainer tr = {0};
    fso_report rep = {0};
    int32_t *inputs = NULL, *targets = NULL;
    char err[512] = "";
    char note[1536];
    int rc;

    double peak_tflops = 0; /* all devices, dense bf16; 0: unknown (no MFU) */
    const bool cuda = strcmp(cfg->backend, "cuda") == 0;
    char name[256] = "GPU";
    uint64_t gpu_free = 0; /* the least any of the GPUs has free */
    if (cuda) {
#if FSO_HAVE_CUDA
        fso_gpu_info gi;
        char gerr[256];
        if (fso_gpu_info_query(0, &gi, gerr, sizeof gerr) == 0) {
            snprintf(name, sizeof name, "%s", gi.name);
            peak_tflops = gi.bf16_peak_tflops * cfg->world;
            gpu_free = gi.mem_free_bytes;
        }
        for (int r = 1; r < cfg->world; r++)
            if (fso_gpu_info_query(r, &gi, gerr, sizeof gerr) == 0 && gi.mem_free_bytes < gpu_free)
                gpu_free = gi.mem_free_bytes;
#endif
        snprintf(note, sizeof note, "devices %s: %d CUDA GPU%s (%s), bf16 matmuls, %s",
                 opts->devices, cfg->world, cfg->world > 1 ? "s" : "", name,
                 cfg->bf16 ? (cfg->activation_checkpointing
                                  ? "bf16 weights, activations and kept layer inputs, fp32 "
                                    "residual stream, master and gradients"
                                  : "bf16 weights and activations, fp32 residual stream, master "
                                    "and gradients")
                           : "fp32 storage");
    } else {
        int threads = cfg->threads > 0 ? cfg->threads : fso_cpu_count();
        char why[1040] = "";
        if (strcmp(opts->devices, "auto") == 0) {
            char reason[1024];
            fso_cuda_available(reason, sizeof reason);
            snprintf(why, sizeof why, " (%s)", reason);
        }
        snprintf(note, sizeof note, "devices %s: %d CPU device%s, %d thread%s each, fp32%s%s",
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

    /* The plan: the placement the configuration leaves open is chosen by
     * predicted step time (DESIGN §6); on GPUs from the table of achieved
     * figures for their model, on CPU devices from one layer timed here. */
    static fso_plan plan;
    fso_plan_pins pins;
    bool planned = false, applied = false;
    fso_plan_measured measured = {0};
    uint64_t nvme_rd = 0, nvme_wr = 0;
    double *block_ms = NULL; /* per block, summed over the measured steps */
    fso_config *run_cfg = malloc(sizeof *run_cfg);
    if (!run_cfg) {
        fprintf(stderr, "fsoff: error: out of memory\n");
        return -ENOMEM;
    }
    *run_cfg = *cfg;
    if (!cuda || gpu_free) {
        fso_plan_pins_from_config(cfg, opts->sets, opts->nsets, &pins);
        const fso_gpu_spec *spec = NULL;
        int prc = cuda ? fso_plan_for_config_gpus(cfg, &pins, name, gpu_free, &plan, &spec, err,
                                                  sizeof err)
                       : fso_plan_for_config(cfg, &pins, &plan, err, sizeof err);
        if (spec)
            printf("plan: GPU figures assumed for %s: %s, %.0f TFLOP/s achieved, copies %.0f GB/s, "
                   "collectives %.0f GB/s (fsoff plan --help lists the table)\n",
                   name, spec->desc, spec->tflops, spec->h2d_gbps, spec->coll_gbps);
        if (prc == 0) {
            planned = true;
            fso_plan_print(stdout, &plan);
            if (fso_plan_apply(&plan, run_cfg, err, sizeof err) < 0)
                printf("fsoff: plan not applied (%s); running the configured placement\n", err);
            else
                applied = true;
        } else {
            /* the engine's own budget check below decides; the planner's view is a note */
            printf("fsoff: plan: %s\n", err);
        }
    }
    cfg = run_cfg;

    if ((rc = fso_data_init(&data, cfg)) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", data.err);
        goto out;
    }
    if ((rc = fso_trainer_init(&tr, cfg)) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", tr.err);
        goto out;
    }
    size_t n = fso_trainer_step_tokens(cfg);
    inputs = malloc(sizeof(int32_t) * n);
    targets = malloc(sizeof(int32_t) * n);
    block_ms = calloc((size_t)cfg->model.num_hidden_layers + 2, sizeof *block_ms);
    if (!inputs || !targets || !block_ms) {
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
    rep.peak_flops = peak_tflops * 1e12;
    rep.pin_refused = fso_zero_pin_refused(tr.zero) != NULL;
    print_banner(cfg, &tr, &data, note);

    size_t bt = (size_t)cfg->micro_batch * cfg->data.seq_len;
    size_t nmb = n / bt;
    for (int64_t s = 0; s < cfg->steps; s++) {
        fso_step_stats st;
        for (size_t a = 0; a < nmb; a++)
            fso_data_next(&data, inputs + a * bt, targets + a * bt);
        if ((rc = fso_trainer_step(&tr, inputs, targets, &st)) < 0) {
            fprintf(stderr, "fsoff: error: %s\n", tr.err);
            rep.peak_device_bytes = fso_zero_peak_device_bytes(tr.zero);
            fso_report_finish(&rep, err, sizeof err);
            goto out;
        }
        fso_report_step(&rep, &st);
        if (s > 0) { /* the first step is excluded, as in the report */
            measured.stall_ms += st.stall_ms;
            measured.optimizer_ms += st.optimizer_ms;
            measured.compute_ms += st.compute_ms;
            nvme_rd += st.nvme_read_bytes;
            nvme_wr += st.nvme_write_bytes;
            const double *ms = fso_zero_block_compute_ms(tr.zero);
            for (int b = 0; b < cfg->model.num_hidden_layers + 2; b++)
                block_ms[b] += ms[b];
        }
        /* after a few steps: was the prediction right? If not, plan again
         * from what was measured, and move the state when that pays. */
        if (planned && s + 1 == (cfg->steps < 6 ? -1 : 5))
            replan(run_cfg, &pins, &plan, applied, &measured, block_ms, nvme_rd, nvme_wr,
                   rep.steps - 1, rep.ms_sum_after_first, cfg->steps - (s + 1), &tr, &rep);
    }
    double waited = 0;
    if ((rc = fso_trainer_finish(&tr, &waited)) < 0) {
        fprintf(stderr, "fsoff: error: the last update failed: %s\n", tr.err);
        fso_report_finish(&rep, err, sizeof err);
        goto out;
    }
    rep.optimizer_exposed_ms += waited;
    rep.peak_device_bytes = fso_zero_peak_device_bytes(tr.zero);
    rep.pin_refused = fso_zero_pin_refused(tr.zero) != NULL; /* a re-plan may have grown it */
    if ((rc = fso_report_finish(&rep, err, sizeof err)) < 0)
        fprintf(stderr, "fsoff: error: %s\n", err);

out:
    free(inputs);
    free(targets);
    free(block_ms);
    fso_trainer_free(&tr);
    fso_data_free(&data);
    free(run_cfg);
    return rc;
}
