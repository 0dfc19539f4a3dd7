/* plan.c — the planner applied to a configuration; `fsoff plan` (plan.h). */
#include "plan.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>

#include "cli.h"
#include "adamw.h"
#include "model.h"
#include "probe.h"
#include "topology.h"
#include "util.h"
#include "zero.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* A GPU's achieved figures from the table into m. */
static void machine_gpu_figures(fso_plan_machine *m, const fso_gpu_spec *spec)
{
    m->cpu_devices = false;
    m->device_gflops = spec->tflops * 1e3;
    m->h2d_gbps = m->d2h_gbps = spec->h2d_gbps;
    m->coll_gbps = spec->coll_gbps;
    m->device_adam_gelems = spec->adam_gelems;
}

/* ------------------------------------------------------------------ inputs */

int fso_plan_ctx_init(fso_plan_ctx *ctx, const fso_config *cfg, const fso_plan_machine *m,
                      bool gpu, char *err, size_t errlen)
{
    const fso_model_config *mc = &cfg->model;
    const int L = mc->num_hidden_layers, nb = fso_model_n_blocks(mc);
    const int nv = fso_model_max_visits(mc), W = m->devices > 0 ? m->devices : 1;
    memset(ctx, 0, sizeof *ctx);
    if (nb > FSO_PLAN_MAX_BLOCKS) {
        snprintf(err, errlen, "model.num_hidden_layers: the planner takes at most %d layers, got %d",
                 FSO_PLAN_MAX_BLOCKS - 2, L);
        return -EINVAL;
    }
    fso_block_layout *bl = calloc((size_t)nb, sizeof *bl);
    ctx->block_elems = calloc((size_t)nb, sizeof *ctx->block_elems);
    ctx->visits = calloc((size_t)nv, sizeof *ctx->visits);
    ctx->true_flops = calloc((size_t)nv, sizeof *ctx->true_flops);
    ctx->visit_part = calloc((size_t)nv, sizeof *ctx->visit_part);
    if (!bl || !ctx->block_elems || !ctx->visits || !ctx->true_flops || !ctx->visit_part) {
        free(bl);
        fso_plan_ctx_free(ctx);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    fso_model_layout(bl, mc, W);
    for (int b = 0; b < nb; b++) {
        ctx->block_elems[b] = bl[b].padded_elems;
        for (int t = 0; t < bl[b].n_tensors; t++)
            ctx->n_params += bl[b].tensors[t].numel;
    }
    free(bl);

    /* FLOPs of one micro-batch, as fso_model_flops_per_token counts them */
    const double N = (double)cfg->micro_batch * cfg->data.seq_len, T = cfg->data.seq_len;
    const double C = mc->hidden_size, F = mc->intermediate_size, V = mc->vocab_size;
    const double qd = (double)mc->num_attention_heads * mc->head_dim;
    const double kvd = (double)mc->num_key_value_heads * mc->head_dim;
    const double layer_fwd = N * (2 * (C * qd + 2 * C * kvd + qd * C + 3 * C * F) + 2 * qd * (T + 1));
    const double head_fwd = N * 2 * C * V;
    const double layer_bwd = (cfg->activation_checkpointing ? 3 : 2) * layer_fwd;
    /* the model's visits of a micro-batch, each with its compute */
    fso_block_visit *mv = calloc((size_t)fso_model_max_visits(mc), sizeof *mv);
    if (!mv) {
        fso_plan_ctx_free(ctx);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    const int n = fso_model_visits(mc, mv);
    for (int k = 0; k < n; k++) {
        const fso_visit_part p = mv[k].part;
        ctx->visit_part[k] = p;
        ctx->visits[k] = (fso_plan_visit){
            .block = mv[k].block, .params = mv[k].params, .grads = mv[k].grads,
            .flops = p == FSO_PART_LAYER_FWD ? layer_fwd
                     : p == FSO_PART_LAYER_BWD ? layer_bwd
                     : p == FSO_PART_HEAD      ? 3 * head_fwd
                                               : 0};
    }
    free(mv);
    for (int k = 0; k < n; k++)
        ctx->true_flops[k] = ctx->visits[k].flops;

    fso_plan_input *in = &ctx->in;
    in->machine = *m;
    ctx->probe_gflops = m->device_gflops;
    in->machine.devices = W;
    in->model.n_blocks = nb;
    in->model.block_elems = ctx->block_elems;
    in->model.n_visits = n;
    in->model.visits = ctx->visits;
    in->model.grad_accum = cfg->grad_accum;
    in->model.tokens_per_step = (double)W * cfg->grad_accum * cfg->micro_batch * cfg->data.seq_len;
    in->model.param_bytes = gpu || cfg->bf16 ? 2 : 4; /* CPU: bf16 working parameters */
    in->model.grad_bytes = gpu ? 2 : 4;
    in->model.state_bytes = 4;
    /* what the engine allocates, on GPUs as on the CPU: with bf16.enabled
     * the activations inside a layer and the kept layer inputs in bf16 */
    in->model.activation_bytes = fso_model_activation_bytes_for(
        mc, cfg->micro_batch, cfg->data.seq_len, cfg->activation_checkpointing, cfg->bf16);

    fso_plan_engine *en = &in->engine;
    en->overlap = cfg->optimizer_overlap;
    en->gather_buffers = 2;
    en->max_prefetch = 16;
    en->stage_slots = 3;
    uint64_t maxe = 0;
    for (int b = 0; b < nb; b++)
        if (ctx->block_elems[b] > maxe)
            maxe = ctx->block_elems[b];
    uint64_t slot = ((maxe / (uint64_t)W) * 4 + 4095) / 4096 * 4096;
    uint64_t chunk = (uint64_t)cfg->offload.aio_block_bytes;
    en->stage_fixed_bytes = 2 * FSO_N_KINDS * (chunk < slot ? chunk : slot);
    if (gpu) { /* the GPU engine as DESIGN §5 lays it out */
        en->per_block_tiers = true;
        en->per_kind_tiers = true;
        en->whole_copy = true;
        en->sync_grad_writes = false;
        en->opt_write_lag = 2;
        /* CUDA context, cuBLAS, NCCL; the backend's scratch */
        en->device_reserve_bytes = ((uint64_t)2 << 30) + fso_model_cuda_scratch_bytes_for(
            mc, cfg->micro_batch, cfg->data.seq_len, cfg->bf16);
    } else { /* engine/zero.c on the CPU backend */
        en->sync_grad_writes = true;
        en->opt_write_lag = 1;
        if (cfg->bf16) /* the CPU backend's fp32 working space for bf16 tensors */
            en->device_reserve_bytes = fso_model_cpu_widen_bytes_for(
                mc, cfg->micro_batch, cfg->data.seq_len);
    }
    fso_plan_pins_none(&in->pins);
    return 0;
}

void fso_plan_ctx_free(fso_plan_ctx *ctx)
{
    free(ctx->block_elems);
    free(ctx->visits);
    free(ctx->true_flops);
    free(ctx->visit_part);
    ctx->block_elems = NULL;
    ctx->visits = NULL;
    ctx->true_flops = NULL;
    ctx->visit_part = NULL;
}

/* ------------------------------------------------------------------ CPU compute */

typedef struct calib {
    float **flat, **grad;
    const fso_model *m;
    double t_open[3];    /* when block b's parameters were lent */
    double ms[8];        /* embed fwd, layer fwd, head, layer bwd, embed bwd */
    int layer_visits;
    double t_last_release;
} calib;


static const void *calib_params(void *ctx, int b)
{
    calib *c = ctx;
    c->t_open[b] = fso_now_ms();
    return c->flat[b];
}

static void calib_release(void *ctx, int b)
{
    calib *c = ctx;
    double dt = fso_now_ms() - c->t_open[b];
    c->t_last_release = fso_now_ms();
    if (b == 0 && c->ms[0] == 0)
        c->ms[0] = dt;
    else if (b == 1)
        c->ms[c->layer_visits++ == 0 ? 1 : 3] += dt;
    else if (b == 2)
        c->ms[2] += dt;
}

static float *calib_grads(void *ctx, int b)
{
    calib *c = ctx;
    memset(c->grad[b], 0, sizeof(float) * c->m->blocks[b].padded_elems);
    return c->grad[b];
}

static void calib_grads_done(void *ctx, int b)
{
    calib *c = ctx;
    if (b == 0 && c->ms[4] == 0) /* the embedding's backward follows the last release */
        c->ms[4] = fso_now_ms() - c->t_last_release;
}

int fso_plan_calibrate_cpu(fso_plan_ctx *ctx, const fso_config *cfg, char *err, size_t errlen)
{
    const fso_plan_machine *mc = &ctx->in.machine;
    const int W = mc->devices;
    fso_model_config one = cfg->model;
    one.num_hidden_layers = 1;
    const int T = cfg->data.seq_len;
    double layer_flops = 0, head_flops = 0; /* one layer's forward and backward; the head */
    for (int k = 0; k < ctx->in.model.n_visits; k++) {
        const fso_visit_part p = ctx->visit_part[k];
        if ((p == FSO_PART_LAYER_FWD || p == FSO_PART_LAYER_BWD) && ctx->visits[k].block == 1)
            layer_flops += ctx->true_flops[k];
        else if (p == FSO_PART_HEAD)
            head_flops += ctx->true_flops[k];
    }
    /* time at the configured micro-batch if it is quick, else one sequence */
    int B = cfg->micro_batch;
    double est_ms = 4 * 2.5 * (layer_flops + head_flops) / (ctx->probe_gflops * 1e6);
    if (est_ms > 400 && B > 1) {
        est_ms /= B;
        B = 1;
    }
    if (est_ms > 400) {
        snprintf(err, errlen, "the model is too large to time one layer quickly");
        return -E2BIG;
    }
    const double scale = (double)cfg->micro_batch / B;
    int threads = cfg->threads > 0 ? cfg->threads : fso_cpu_count();
    int per_dev = threads / W > 0 ? threads / W : 1;
    fso_backend *be = NULL;
    fso_model m;
    calib c = {0};
    int32_t *tok = NULL;
    int rc = fso_backend_create(&be, cfg->backend[0] ? cfg->backend : "cpu", per_dev);
    if (rc < 0) {
        snprintf(err, errlen, "cannot create the CPU backend: %s", strerror(-rc));
        return rc;
    }
    if ((rc = fso_model_init(&m, &one, be, B, T, 1, cfg->activation_checkpointing, cfg->bf16)) <
        0) {
        snprintf(err, errlen, "%s", m.err);
        fso_backend_destroy(be);
        return rc;
    }
    c.m = &m;
    c.flat = calloc(3, sizeof *c.flat);
    c.grad = calloc(3, sizeof *c.grad);
    tok = malloc(sizeof(int32_t) * (size_t)B * T * 2);
    rc = c.flat && c.grad && tok ? 0 : -ENOMEM;
    for (int b = 0; b < 3 && rc == 0; b++) {
        c.flat[b] = calloc(m.blocks[b].padded_elems, sizeof(float));
        c.grad[b] = calloc(m.blocks[b].padded_elems, sizeof(float));
        if (!c.flat[b] || !c.grad[b])
            rc = -ENOMEM;
    }
    if (rc == 0) {
        fso_model_init_flat(&m, c.flat, 1);
        if (m.wt == FSO_DT_BF16) /* lent as bf16: narrowed in place, front to back */
            for (int b = 0; b < 3; b++)
                for (size_t i = 0; i < m.blocks[b].padded_elems; i++)
                    ((uint16_t *)c.flat[b])[i] = fso_bf16_from_f32(c.flat[b][i]);
        for (size_t i = 0; i < (size_t)B * T * 2; i++)
            tok[i] = (int32_t)((i * 2654435761u) % (uint32_t)one.vocab_size);
        fso_block_source src = {.ctx = &c, .params = calib_params, .release = calib_release,
                                .grads = calib_grads, .grads_done = calib_grads_done};
        /* the first run pays the page faults; then the best of three (other work on the
         * machine only ever slows a run down) */
        double runs[3][5];
        for (int rep = 0; rep < 4; rep++) {
            memset(c.ms, 0, sizeof c.ms);
            c.layer_visits = 0;
            double loss = 0;
            fso_model_step(&m, &src, tok, tok + (size_t)B * T, 1.0f, &loss);
            m.be->ops->sync(m.be);
            if (rep > 0)
                memcpy(runs[rep - 1], c.ms, sizeof runs[0]);
        }
        for (int i = 0; i < 5; i++) {
            double a = runs[0][i], b = runs[1][i], d = runs[2][i];
            c.ms[i] = a < b ? (a < d ? a : d) : (b < d ? b : d);
        }
        double layer_ms = (c.ms[1] + c.ms[3]) * scale;
        if (layer_ms <= 0) {
            rc = -EIO;
        } else {
            /* One layer's rate for every layer; the head's and the embedding's visits
             * take their measured time at that rate. */
            double rate = layer_flops / layer_ms / 1e6; /* GFLOP/s */
            ctx->in.machine.device_gflops = rate;
            for (int k = 0; k < ctx->in.model.n_visits; k++) {
                const fso_visit_part p = ctx->visit_part[k];
                const int ms = p == FSO_PART_EMBED_FWD ? 0 : p == FSO_PART_HEAD ? 2 : 4;
                ctx->visits[k].flops = p == FSO_PART_NONE ? 0
                                       : p == FSO_PART_LAYER_FWD || p == FSO_PART_LAYER_BWD
                                           ? ctx->true_flops[k]
                                           : c.ms[ms] * scale * rate * 1e6;
            }
        }
    }
    if (rc == -ENOMEM)
        snprintf(err, errlen, "out of memory timing a layer");
    else if (rc == -EIO)
        snprintf(err, errlen, "timing a layer gave no time");
    for (int b = 0; b < 3; b++) {
        if (c.flat)
            free(c.flat[b]);
        if (c.grad)
            free(c.grad[b]);
    }
    free(c.flat);
    free(c.grad);
    free(tok);
    fso_model_free(&m);
    fso_backend_destroy(be);
    return rc;
}

/* ------------------------------------------------------------------ pins */

void fso_plan_pins_from_config(const fso_config *cfg, fso_plan_pins *pins)
{
    const bool pparam =
        fso_config_origin_of(cfg, "zero_optimization.offload_param.device") != FSO_ORIGIN_DEFAULT;
    const bool poptim = fso_config_origin_of(cfg, "zero_optimization.offload_optimizer.device") !=
                        FSO_ORIGIN_DEFAULT;
    const bool ppf = fso_config_origin_of(cfg, "train.prefetch_blocks") != FSO_ORIGIN_DEFAULT;
    fso_plan_pins_none(pins);
    if (pparam)
        pins->tier[FSO_KIND_PARAM] = (int)cfg->offload.param_tier;
    if (poptim)
        for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
            pins->tier[k] = (int)cfg->offload.optim_tier;
    if (ppf)
        pins->prefetch = cfg->offload.prefetch_blocks;
}

/* ------------------------------------------------------------------ this machine */


/* The configured NVMe folders (both offload sections, each once) that exist
 * here, comma-separated into buf; the missing ones into missing. */
static void nvme_folders(const fso_config *cfg, char *buf, size_t len, char *missing,
                         size_t mlen)
{
    char all[8192], *save = NULL;
    size_t off = 0, moff = 0;
    buf[0] = missing[0] = 0;
    snprintf(all, sizeof all, "%s,%s", cfg->offload.param_nvme_path, cfg->offload.optim_nvme_path);
    for (char *t = strtok_r(all, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!*t)
            continue;
        /* each once */
        bool dup = false;
        char tmp[8192];
        snprintf(tmp, sizeof tmp, "%s", buf);
        char *s2 = NULL;
        for (char *u = strtok_r(tmp, ",", &s2); u; u = strtok_r(NULL, ",", &s2))
            if (strcmp(u, t) == 0)
                dup = true;
        if (dup)
            continue;
        snprintf(tmp, sizeof tmp, "%s", missing);
        for (char *u = strtok_r(tmp, ",", &s2); u; u = strtok_r(NULL, ",", &s2))
            if (strcmp(u, t) == 0)
                dup = true;
        if (dup)
            continue;
        struct stat st;
        if (stat(t, &st) == 0 && S_ISDIR(st.st_mode)) {
            if (off < len)
                off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? "," : "", t);
        } else if (moff < mlen) {
            moff += (size_t)snprintf(missing + moff, mlen - moff, "%s%s", moff ? "," : "", t);
        }
    }
}

static uint64_t folders_free(const char *dirs)
{
    char tmp[8192], *save = NULL;
    uint64_t sum = 0;
    snprintf(tmp, sizeof tmp, "%s", dirs);
    for (char *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        struct statvfs sv;
        if (statvfs(t, &sv) == 0)
            sum += (uint64_t)sv.f_bavail * sv.f_frsize;
    }
    return sum;
}

static int probe_here(const fso_config *cfg, const char *dirs, bool refresh, fso_probe *p,
                      char *err, size_t errlen)
{
    fso_probe_opts po = {.dirs = dirs, .threads = cfg->threads};
    bool probed = false;
    return fso_probe_get(p, &po, refresh, &probed, err, errlen);
}

int fso_plan_machine_here(const fso_config *cfg, bool refresh, fso_plan_machine *m, char *err,
                          size_t errlen)
{
    char dirs[8192], missing[8192];
    fso_probe p;
    nvme_folders(cfg, dirs, sizeof dirs, missing, sizeof missing);
    int rc = probe_here(cfg, dirs, refresh, &p, err, errlen);
    if (rc < 0)
        return rc;
    const int W = cfg->world > 0 ? cfg->world : 1;
    const int threads = cfg->threads > 0 ? cfg->threads : fso_cpu_count();
    const double scale = p.threads > 0 ? (double)threads / p.threads : 1.0;
    memset(m, 0, sizeof *m);
    m->devices = W;
    m->cpu_devices = true;
    m->host_mem_bytes = fso_mem_available_bytes();
    if (!m->host_mem_bytes)
        m->host_mem_bytes = p.host_mem_bytes;
    m->device_mem_bytes = fso_zero_cpu_device_mem(cfg, m->host_mem_bytes);
    m->nvme_free_bytes = dirs[0] ? folders_free(dirs) : 0;
    m->nvme_read_gbps = p.nvme_read_gbps;
    m->nvme_write_gbps = p.nvme_write_gbps;
    m->nvme_read_lat_ms = p.nvme_read_lat_ms;
    m->nvme_write_lat_ms = p.nvme_write_lat_ms;
    if (m->nvme_read_gbps <= 0 || m->nvme_write_gbps <= 0)
        m->nvme_free_bytes = 0;
    m->h2d_gbps = p.h2d_gbps;
    m->d2h_gbps = p.d2h_gbps;
    m->host_copy_gbps = p.host_copy_gbps;
    m->coll_gbps = p.coll_gbps;
    m->device_gflops = p.gflops * scale / W;
    m->adam_gelems = p.adam_gelems * scale;
    m->device_adam_gelems = 0;
    return 0;
}

/* ------------------------------------------------------------------ reports */

static const char *fix_for(int tier)
{
    switch (tier) {
    case FSO_TIER_DEVICE:
        return "move state off the devices (host or NVMe), add devices, or give each more "
               "memory (--device-mem / --gpu-mem)";
    case FSO_TIER_HOST:
        return "add NVMe folders for the state (--nvme DIR), or more host memory (--host-mem)";
    default:
        return "free space on the NVMe folders or add folders (--nvme DIR1,DIR2)";
    }
}

void fso_plan_shortfall_message(const fso_plan *p, const fso_plan_pins *pins, char *buf,
                                size_t len)
{
    char need[32], have[32], by[32], act[32], pinned[256] = "";
    const int t = p->short_tier < 0 ? FSO_TIER_HOST : p->short_tier;
    fso_human_bytes(need, sizeof need, (double)p->need_bytes[t]);
    fso_human_bytes(have, sizeof have, (double)p->have_bytes[t]);
    fso_human_bytes(by, sizeof by, (double)p->short_bytes);
    fso_human_bytes(act, sizeof act, (double)p->activation_bytes);
    if (pins) {
        size_t off = 0;
        for (int k = 0; k < FSO_N_KINDS; k++)
            if (pins->tier[k] >= 0 && off < sizeof pinned &&
                (k == FSO_KIND_PARAM || k == FSO_KIND_MASTER))
                off += (size_t)snprintf(pinned + off, sizeof pinned - off, "%s%s on %s",
                                        off ? ", " : " (the config pins ",
                                        k == FSO_KIND_PARAM ? "parameters" : "optimizer state",
                                        fso_tier_name(pins->tier[k]));
        if (off && off < sizeof pinned)
            snprintf(pinned + off, sizeof pinned - off, "; --auto lets fsoff choose)");
    }
    if (t == FSO_TIER_DEVICE) {
        uint64_t fixed = p->activation_bytes + p->buffer_bytes[FSO_TIER_DEVICE];
        if (fixed > p->have_bytes[FSO_TIER_DEVICE]) {
            char fx[32];
            fso_human_bytes(fx, sizeof fx, (double)fixed);
            snprintf(buf, len,
                     "device memory: the activations (%s with checkpointing) and buffers alone "
                     "need %s per device, which holds %s; short by %s: lower "
                     "train_micro_batch_size_per_gpu or data.seq_len, or use devices with more "
                     "memory%s",
                     act, fx, have, by, pinned);
            return;
        }
        snprintf(buf, len, "device memory: each device needs %s but holds %s; short by %s: %s%s",
                 need, have, by, fix_for(t), pinned);
    } else if (t == FSO_TIER_HOST) {
        snprintf(buf, len, "host memory: the host tier and staging need %s but %s is usable; "
                           "short by %s: %s%s", need, have, by, fix_for(t), pinned);
    } else {
        snprintf(buf, len, "NVMe: the NVMe tier needs %s but %s is free; short by %s: %s%s", need,
                 have, by, p->have_bytes[FSO_TIER_NVME] ? fix_for(t)
                 : "give NVMe folders (--nvme DIR) or, to plan for drives elsewhere, "
                   "--nvme-free, --nvme-read and --nvme-write",
                 pinned);
    }
}

static void cell(char *buf, size_t len, uint64_t bytes)
{
    if (bytes == 0)
        snprintf(buf, len, "-");
    else
        fso_human_bytes(buf, len, (double)bytes);
}

void fso_plan_print(FILE *f, const fso_plan *p)
{
    static const char *const rows[FSO_N_TIERS] = {"device (each)", "host (all)", "nvme (all)"};
    char desc[512];
    fprintf(f, "plan: %-14s %11s %11s %11s %11s %11s %11s %11s\n", "memory", "parameters",
            "gradients", "optimizer", "activations", "buffers", "need", "capacity");
    for (int t = 0; t < FSO_N_TIERS; t++) {
        char c[7][32];
        uint64_t opt = p->kind_bytes[t][FSO_KIND_MASTER] + p->kind_bytes[t][FSO_KIND_M] +
                       p->kind_bytes[t][FSO_KIND_V];
        cell(c[0], 32, p->kind_bytes[t][FSO_KIND_PARAM]);
        cell(c[1], 32, p->kind_bytes[t][FSO_KIND_GRAD]);
        cell(c[2], 32, opt);
        cell(c[3], 32, t == FSO_TIER_DEVICE ? p->activation_bytes : 0);
        cell(c[4], 32, p->buffer_bytes[t]);
        cell(c[5], 32, p->need_bytes[t]);
        cell(c[6], 32, p->have_bytes[t]);
        fprintf(f, "plan:   %-12s %11s %11s %11s %11s %11s %11s %11s%s\n", rows[t], c[0], c[1],
                c[2], c[3], c[4], c[5], c[6],
                p->need_bytes[t] > p->have_bytes[t] ? "  SHORT" : "");
    }
    fso_plan_describe(p, desc, sizeof desc);
    fprintf(f, "plan: placement: %s\n", desc);
    if (!p->fits) {
        fprintf(f, "plan: does not fit (see the SHORT row)\n");
        return;
    }
    double crit = 0;
    for (int s = 0; s < FSO_N_STREAMS; s++)
        crit += p->critical_ms[s];
    fprintf(f, "plan: predicted %.1f ms/step, %.0f tok/s; bottleneck: %s (critical path:",
            p->step_ms, p->tokens_per_s, fso_stream_name(p->bottleneck));
    int shown = 0;
    /* largest first */
    double c[FSO_N_STREAMS];
    memcpy(c, p->critical_ms, sizeof c);
    for (;;) {
        int best = -1;
        for (int s = 0; s < FSO_N_STREAMS; s++)
            if (c[s] > 0.005 * crit && (best < 0 || c[s] > c[best]))
                best = s;
        if (best < 0)
            break;
        fprintf(f, "%s %s %.0f%%", shown++ ? "," : "", fso_stream_name(best),
                crit > 0 ? 100 * c[best] / crit : 0);
        c[best] = 0;
    }
    fprintf(f, ")\n");
    fprintf(f, "plan: busy per step and device (ms):");
    for (int s = 0; s < FSO_N_STREAMS; s++)
        fprintf(f, "%s %s %.1f", s ? " |" : "", fso_stream_name(s), p->busy_ms[s]);
    fprintf(f, "; compute waits %.1f ms\n", p->stall_ms);
}

static json_t *tier_json(const fso_plan *p, int t)
{
    uint64_t opt = p->kind_bytes[t][FSO_KIND_MASTER] + p->kind_bytes[t][FSO_KIND_M] +
                   p->kind_bytes[t][FSO_KIND_V];
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b}", "bytes",
                     (json_int_t)p->need_bytes[t], "capacity_bytes", (json_int_t)p->have_bytes[t],
                     "parameters", (json_int_t)p->kind_bytes[t][FSO_KIND_PARAM], "gradients",
                     (json_int_t)p->kind_bytes[t][FSO_KIND_GRAD], "optimizer_state",
                     (json_int_t)opt, "activations",
                     (json_int_t)(t == FSO_TIER_DEVICE ? p->activation_bytes : 0), "buffers",
                     (json_int_t)p->buffer_bytes[t], "fits",
                     p->need_bytes[t] <= p->have_bytes[t]);
}

static json_t *plan_json(const fso_plan *p)
{
    static const char *const keys[FSO_N_KINDS] = {"parameters", "master", "m", "v", "gradients"};
    char desc[512];
    json_t *tiers = json_object(), *placement = json_object(), *busy = json_object(),
           *crit = json_object();
    for (int t = 0; t < FSO_N_TIERS; t++)
        json_object_set_new(tiers, fso_tier_name(t), tier_json(p, t));
    for (int k = 0; k < FSO_N_KINDS; k++) {
        int count[FSO_N_TIERS] = {0};
        for (int b = 0; b < p->pl.n_blocks; b++)
            count[p->pl.tier[k][b]]++;
        json_object_set_new(placement, keys[k],
                            json_pack("{s:i, s:i, s:i}", "device", count[0], "host", count[1],
                                      "nvme", count[2]));
    }
    for (int s = 0; s < FSO_N_STREAMS; s++) {
        json_object_set_new(busy, fso_stream_name(s), json_real(p->busy_ms[s]));
        json_object_set_new(crit, fso_stream_name(s), json_real(p->critical_ms[s]));
    }
    bool wc = false;
    for (int b = 0; b < p->pl.n_blocks; b++)
        wc = wc || (p->pl.whole_copy[b] && p->pl.tier[FSO_KIND_PARAM][b] != FSO_TIER_DEVICE);
    fso_plan_describe(p, desc, sizeof desc);
    const fso_plan_machine *m = &p->machine;
    json_t *mj = json_pack(
        "{s:i, s:b, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "devices",
        m->devices, "cpu_devices", m->cpu_devices, "device_mem_bytes",
        (json_int_t)m->device_mem_bytes, "host_mem_bytes", (json_int_t)m->host_mem_bytes,
        "nvme_free_bytes", (json_int_t)m->nvme_free_bytes, "nvme_read_gbps", m->nvme_read_gbps,
        "nvme_write_gbps", m->nvme_write_gbps, "h2d_gbps", m->h2d_gbps, "d2h_gbps", m->d2h_gbps,
        "coll_gbps", m->coll_gbps, "device_gflops", m->device_gflops, "adam_gelems",
        m->adam_gelems, "device_adam_gelems", m->device_adam_gelems, "host_copy_gbps",
        m->host_copy_gbps);
    return json_pack("{s:b, s:f, s:f, s:s, s:f, s:s, s:o, s:i, s:b, s:o, s:o, s:o, s:o, s:i}",
                     "fits", p->fits, "predicted_step_ms", p->step_ms, "tokens_per_s",
                     p->tokens_per_s, "bottleneck", fso_stream_name(p->bottleneck), "stall_ms",
                     p->stall_ms, "placement_text", desc, "placement", placement,
                     "prefetch_blocks", p->pl.prefetch, "whole_copy", wc, "tiers", tiers,
                     "busy_ms", busy, "critical_ms", crit, "machine", mj, "evaluated",
                     p->evaluated);
}

void fso_plan_print_json(FILE *f, const fso_plan *p)
{
    json_t *j = plan_json(p);
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
    if (s)
        fprintf(f, "%s\n", s);
    free(s);
    json_decref(j);
}

/* ------------------------------------------------------------------ for train */

/* The choice for ctx keeping pins (NULL: none), the shortfall named when
 * nothing fits; ctx is freed. */
static int choose_and_free(fso_plan_ctx *ctx, const fso_plan_pins *pins, fso_plan *out,
                           char *err, size_t errlen)
{
    if (pins)
        ctx->in.pins = *pins;
    int rc = fso_plan_choose(&ctx->in, out);
    if (rc == -ENOSPC)
        fso_plan_shortfall_message(out, pins, err, errlen);
    else if (rc < 0)
        snprintf(err, errlen, "planner: %s", strerror(-rc));
    fso_plan_ctx_free(ctx);
    return rc;
}

int fso_plan_for_config(const fso_config *cfg, const fso_plan_pins *pins, fso_plan *out,
                        char *err, size_t errlen)
{
    fso_plan_machine m;
    fso_plan_ctx ctx;
    int rc = fso_plan_machine_here(cfg, false, &m, err, errlen);
    if (rc < 0)
        return rc;
    if ((rc = fso_plan_ctx_init(&ctx, cfg, &m, false, err, errlen)) < 0)
        return rc;
    char cerr[256];
    fso_plan_calibrate_cpu(&ctx, cfg, cerr, sizeof cerr); /* else the sgemm rate stands */
    return choose_and_free(&ctx, pins, out, err, errlen);
}

/* GPUs, the engine as it is (engine/zero.c) rather than DESIGN §5's: one
 * tier per kind, gathers, fp32 gradients, working parameters bf16 only with
 * bf16.enabled. */
static void gpu_engine_as_built(fso_plan_ctx *ctx, const fso_config *cfg)
{
    fso_plan_engine *en = &ctx->in.engine;
    en->per_block_tiers = en->per_kind_tiers = en->whole_copy = false;
    ctx->in.model.grad_bytes = 4;
    ctx->in.model.param_bytes = cfg->bf16 ? 2 : 4;
}

int fso_plan_for_config_gpus(const fso_config *cfg, const fso_plan_pins *pins,
                             const char *gpu_name, uint64_t gpu_free_bytes, fso_plan *out,
                             const fso_gpu_spec **spec_used, char *err, size_t errlen)
{
    fso_plan_machine m;
    fso_plan_ctx ctx;
    int rc = fso_plan_machine_here(cfg, false, &m, err, errlen); /* host, NVMe, CPU AdamW */
    if (rc < 0)
        return rc;
    const fso_gpu_spec *spec = fso_gpu_spec_for_device(gpu_name, gpu_free_bytes);
    if (spec_used)
        *spec_used = spec;
    machine_gpu_figures(&m, spec);
    m.device_mem_bytes = cfg->device_mem_bytes ? cfg->device_mem_bytes : gpu_free_bytes;
    if ((rc = fso_plan_ctx_init(&ctx, cfg, &m, true, err, errlen)) < 0)
        return rc;
    gpu_engine_as_built(&ctx, cfg);
    return choose_and_free(&ctx, pins, out, err, errlen);
}

int fso_plan_apply(const fso_plan *p, fso_config *cfg, char *err, size_t errlen)
{
    const int nb = p->pl.n_blocks;
    int pt = p->pl.tier[FSO_KIND_PARAM][0], st = p->pl.tier[FSO_KIND_MASTER][0];
    for (int b = 0; b < nb; b++) {
        if (p->pl.tier[FSO_KIND_PARAM][b] != pt) {
            snprintf(err, errlen, "the plan keeps some blocks' parameters on the device and "
                                  "streams others; this engine takes one tier per kind");
            return -ENOTSUP;
        }
        for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
            if (p->pl.tier[k][b] != st) {
                snprintf(err, errlen, "the plan splits the optimizer state over tiers; this "
                                      "engine keeps master, m, v and gradients on one tier");
                return -ENOTSUP;
            }
        if (p->pl.whole_copy[b] && pt != FSO_TIER_DEVICE && p->machine.devices > 1) {
            snprintf(err, errlen, "the plan copies blocks whole; this engine gathers shards");
            return -ENOTSUP;
        }
    }
    fso_offload_config *o = &cfg->offload;
    if (pt == FSO_TIER_NVME || st == FSO_TIER_NVME) {
        const char *any = o->optim_nvme_path[0] ? o->optim_nvme_path : o->param_nvme_path;
        if (!any[0]) {
            snprintf(err, errlen, "the plan puts state on NVMe but the configuration names no "
                                  "NVMe folder; give --nvme DIR");
            return -EINVAL;
        }
        if (!o->param_nvme_path[0])
            snprintf(o->param_nvme_path, sizeof o->param_nvme_path, "%s", any);
        if (!o->optim_nvme_path[0])
            snprintf(o->optim_nvme_path, sizeof o->optim_nvme_path, "%s", any);
    }
    o->param_tier = (fso_tier)pt;
    o->optim_tier = (fso_tier)st;
    o->prefetch_blocks = p->pl.prefetch;
    return 0;
}

int fso_plan_check(const fso_config *cfg, const fso_plan_pins *pins, const fso_plan *plan,
                   const fso_plan_measured *meas, fso_plan *out, char *msg, size_t msglen)
{
    fso_plan_ctx ctx;
    char err[256];
    int rc = fso_plan_ctx_init(&ctx, cfg, &plan->machine, !plan->machine.cpu_devices, err,
                               sizeof err);
    if (rc < 0) {
        snprintf(msg, msglen, "%s", err);
        return rc;
    }
    if (!plan->machine.cpu_devices) /* a running engine: as built */
        gpu_engine_as_built(&ctx, cfg);
    if (pins)
        ctx.in.pins = *pins;
    rc = fso_plan_replan(&ctx.in, plan, meas, out, NULL, msg, msglen);
    fso_plan_ctx_free(&ctx);
    return rc;
}

/* GB/s at which tier t gives up (read) or takes (write) state when a
 * re-plan moves it, at the machine's rates. */
static double tier_gbps(const fso_plan_machine *m, int t, bool write)
{
    double g = t == FSO_TIER_NVME   ? (write ? m->nvme_write_gbps : m->nvme_read_gbps)
               : t == FSO_TIER_HOST ? m->host_copy_gbps
                                  : (write ? m->h2d_gbps : m->d2h_gbps);
    return g > 0 ? g : 1.0;
}

int fso_plan_revision(const fso_plan *cur, const fso_plan *next, double measured_ms,
                      int64_t steps_left, fso_plan_move *mv)
{
    memset(mv, 0, sizeof *mv);
    const fso_plan_machine *m = &next->machine;
    const int devs = m->devices > 0 ? m->devices : 1;
    for (int k = 0; k < FSO_N_KINDS; k++) {
        int from = fso_plan_main_tier(cur, k), to = fso_plan_main_tier(next, k);
        if (from == to)
            continue;
        uint64_t bytes = cur->kind_bytes[from][k] * (from == FSO_TIER_DEVICE ? (uint64_t)devs : 1);
        mv->bytes += bytes;
        mv->move_ms += bytes / 1e6 / tier_gbps(m, from, false) + bytes / 1e6 / tier_gbps(m, to, true);
    }
    mv->changes = mv->bytes > 0 || cur->pl.prefetch != next->pl.prefetch;
    mv->saving_ms = measured_ms - next->step_ms;
    /* worth it: 5% faster at least, and the steps left pay for the move */
    mv->pays = mv->changes && mv->saving_ms > 0.05 * measured_ms &&
               mv->saving_ms * (double)steps_left > mv->move_ms;
    return mv->pays;
}

/* ------------------------------------------------------------------ fsoff plan */

static void plan_usage(FILE *f)
{
    fprintf(f,
            "usage: fsoff plan [--config FILE] [options]\n"
            "\n"
            "Print the memory each tier needs (parameters, gradients, optimizer state,\n"
            "activations with checkpointing), where fsoff would keep each kind of state, the\n"
            "predicted step time and tokens/s, and the bottleneck. Needs no GPU: describe the\n"
            "machine with the options below; numbers not given come from this machine's cached\n"
            "probes (measured once, in under a few seconds) or, with --gpus, from a table of\n"
            "conservative achieved GPU figures. Offload devices written in the config are kept\n"
            "(pinned); the planner chooses the rest.\n"
            "\n"
            "options:\n"
            "  -c, --config FILE     JSON configuration, as for fsoff train\n"
            "  -s, --set KEY=VALUE   override a configuration key (repeatable)\n"
            "      --nvme DIR[,DIR]  NVMe folders (probed for speed and free space)\n"
            "      --devices cpu:N   plan N CPU virtual devices (default: the config's, 1)\n"
            "      --device-mem SIZE memory per CPU virtual device\n"
            "      --gpus N          plan N GPUs of the kind --gpu names\n"
            "      --gpu KIND        h100, h200, a100, l40s, 4090 (default: the one whose memory\n"
            "                        is nearest --gpu-mem, else h100)\n"
            "      --gpu-mem SIZE    memory per GPU, e.g. 140G (binary units: G = GiB)\n"
            "      --gpu-tflops X    achieved compute per device, TFLOP/s\n"
            "      --host-mem SIZE   host memory fsoff may use, e.g. 2T\n"
            "      --nvme-free SIZE  free NVMe space over all folders\n"
            "      --nvme-read GBPS  NVMe read rate over all folders, GB/s\n"
            "      --nvme-write GBPS NVMe write rate over all folders, GB/s\n"
            "      --h2d GBPS        host-to-device copy rate per device (and device-to-host)\n"
            "      --coll-gbps GBPS  all-gather bus bandwidth among the devices\n"
            "      --adam-gelems X   CPU AdamW rate of the whole host, 1e9 elements/s\n"
            "      --probe           measure this machine again (refresh the probe cache)\n"
            "      --auto            ignore the config's offload devices: choose every tier\n"
            "      --json            one JSON object instead of the table\n"
            "      --trace           also print the predicted step's events, stream by stream\n"
            "  -h, --help            this help\n"
            "\n"
            "GPU figures assumed when not given (achieved, not peak: a training step reaches\n"
            "about 40%% of the dense bf16 peak; copies and all-gathers rounded down from\n"
            "typical measurements):\n");
    for (const fso_gpu_spec *s = fso_gpu_specs; s->words[0]; s++)
        if (s->name)
            fprintf(f, "  %-5s %-48s %4.0f TFLOP/s (peak %4.0f), %3.0f GiB, h2d %2.0f GB/s, "
                       "all-gather %3.0f GB/s\n",
                    s->name, s->desc, s->tflops, s->peak_tflops, s->mem_gib, s->h2d_gbps,
                    s->coll_gbps);
    fprintf(f, "\nexit status: 0 a plan fits, 1 no placement fits (the short tier and by how much),\n"
               "2 bad command line or configuration\n");
}

static int parse_pos(const char *opt, const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v > 0) || !isfinite(v)) {
        fprintf(stderr, "fsoff: error: %s %s: expected a positive number\n", opt, s);
        return -EINVAL;
    }
    *out = v;
    return 0;
}

static int parse_bytes(const char *opt, const char *s, uint64_t *out, bool zero_ok)
{
    if (fso_parse_size(s, out) < 0 || (!zero_ok && *out == 0)) {
        fprintf(stderr, "fsoff: error: %s %s: expected a size such as 512M, 80G or 2T\n", opt, s);
        return -EINVAL;
    }
    return 0;
}

typedef struct given {
    int gpus;
    const char *gpu;
    uint64_t gpu_mem, host_mem, nvme_free, device_mem;
    double gpu_tflops, nvme_read, nvme_write, h2d, coll, adam;
    bool has_nvme_free;
} given;

/* Print the alternatives the planner weighed, as uniform placements. */
static void print_alternatives(FILE *f, const fso_plan_input *in)
{
    static const struct {
        int p, s;
        const char *what;
    } alts[] = {
        {FSO_TIER_DEVICE, FSO_TIER_DEVICE, "everything on the devices"},
        {FSO_TIER_DEVICE, FSO_TIER_HOST, "parameters on the devices, optimizer state on the host"},
        {FSO_TIER_HOST, FSO_TIER_HOST, "parameters and optimizer state on the host"},
        {FSO_TIER_HOST, FSO_TIER_NVME, "parameters on the host, optimizer state on NVMe"},
        {FSO_TIER_NVME, FSO_TIER_NVME, "everything on NVMe"},
    };
    fso_plan *alt = malloc(sizeof *alt);
    fso_placement *pl = malloc(sizeof *pl);
    if (!alt || !pl) {
        free(alt);
        free(pl);
        return;
    }
    fprintf(f, "plan: alternatives (one tier per kind, prefetch %d):\n",
            in->pins.prefetch >= 0 ? in->pins.prefetch : 2);
    for (size_t i = 0; i < sizeof alts / sizeof alts[0]; i++) {
        fso_placement_uniform(pl, in->model.n_blocks, alts[i].p, alts[i].s, alts[i].s,
                              in->pins.prefetch >= 0 ? in->pins.prefetch : 2);
        int rc = fso_plan_evaluate(in, pl, alt);
        if (rc == 0) {
            fprintf(f, "plan:   %-58s %10.1f ms/step, bottleneck %s\n", alts[i].what,
                    alt->step_ms, fso_stream_name(alt->bottleneck));
        } else if (rc == -ENOSPC) {
            char by[32];
            fso_human_bytes(by, sizeof by, (double)alt->short_bytes);
            fprintf(f, "plan:   %-58s %10s (%s short by %s)\n", alts[i].what, "no fit",
                    fso_tier_name(alt->short_tier), by);
        }
    }
    free(alt);
    free(pl);
}

int fso_plan_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},     {"set", required_argument, NULL, 's'},
        {"nvme", required_argument, NULL, 'N'},       {"devices", required_argument, NULL, 'D'},
        {"device-mem", required_argument, NULL, 'M'}, {"gpus", required_argument, NULL, 'g'},
        {"gpu", required_argument, NULL, 'G'},        {"gpu-mem", required_argument, NULL, 'm'},
        {"gpu-tflops", required_argument, NULL, 't'}, {"host-mem", required_argument, NULL, 'H'},
        {"nvme-free", required_argument, NULL, 'f'},  {"nvme-read", required_argument, NULL, 'r'},
        {"nvme-write", required_argument, NULL, 'w'}, {"h2d", required_argument, NULL, 'x'},
        {"coll-gbps", required_argument, NULL, 'C'},  {"adam-gelems", required_argument, NULL, 'a'},
        {"probe", no_argument, NULL, 'P'},            {"auto", no_argument, NULL, 'A'},
        {"json", no_argument, NULL, 'J'},             {"help", no_argument, NULL, 'h'},
        {"trace", no_argument, NULL, 'T'},
        {NULL, 0, NULL, 0},
    };
    const char *config_path = NULL;
    char **sets = calloc(2 * (size_t)argc + 1, sizeof *sets);
    int nsets = 0, status = 2, c;
    bool refresh = false, autoplace = false, json = false, trace = false;
    given g = {0};
    fso_config cfg;
    fso_plan_ctx ctx = {0};
    fso_plan *plan = NULL, *freeplan = NULL;
    char err[1024];

    fso_config_defaults(&cfg);
    if (!sets) {
        fprintf(stderr, "fsoff: error: out of memory\n");
        return 1;
    }
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":c:s:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'c':
            config_path = optarg;
            break;
        case 's':
            if (!(sets[nsets++] = strdup(optarg)))
                goto oom;
            break;
        case 'N': {
            char *lit = fso_json_quote(optarg);
            if (!lit || asprintf(&sets[nsets++], "zero_optimization.offload_param.nvme_path=%s",
                                 lit) < 0 ||
                asprintf(&sets[nsets++], "zero_optimization.offload_optimizer.nvme_path=%s",
                         lit) < 0) {
                free(lit);
                goto oom;
            }
            free(lit);
            break;
        }
        case 'D': {
            char *end = NULL;
            long n = 1;
            if (strncmp(optarg, "cpu:", 4) == 0) {
                errno = 0;
                n = strtol(optarg + 4, &end, 10);
            }
            if ((strncmp(optarg, "cpu:", 4) == 0 && (errno || end == optarg + 4 || *end)) ||
                (strncmp(optarg, "cpu:", 4) != 0 && strcmp(optarg, "cpu") != 0) || n < 1 ||
                n > 64) {
                fprintf(stderr, "fsoff: error: --devices %s: expected cpu or cpu:N with N from 1 "
                                "to 64 (for GPUs use --gpus N)\n", optarg);
                goto out;
            }
            cfg.world = (int)n;
            break;
        }
        case 'M':
            if (parse_bytes("--device-mem", optarg, &g.device_mem, false) < 0)
                goto out;
            break;
        case 'g': {
            char *end;
            errno = 0;
            long n = strtol(optarg, &end, 10);
            if (errno || end == optarg || *end || n < 1 || n > 64) {
                fprintf(stderr, "fsoff: error: --gpus %s: expected a GPU count from 1 to 64\n",
                        optarg);
                goto out;
            }
            g.gpus = (int)n;
            break;
        }
        case 'G':
            if (!fso_gpu_spec_find(optarg)) {
                fprintf(stderr, "fsoff: error: --gpu %s: unknown GPU; choose one of", optarg);
                for (const fso_gpu_spec *s = fso_gpu_specs; s->words[0]; s++)
                    if (s->name)
                        fprintf(stderr, " %s", s->name);
                fprintf(stderr, ", or give --gpu-mem, --gpu-tflops, --h2d and --coll-gbps\n");
                goto out;
            }
            g.gpu = optarg;
            break;
        case 'm':
            if (parse_bytes("--gpu-mem", optarg, &g.gpu_mem, false) < 0)
                goto out;
            break;
        case 't':
            if (parse_pos("--gpu-tflops", optarg, &g.gpu_tflops) < 0)
                goto out;
            break;
        case 'H':
            if (parse_bytes("--host-mem", optarg, &g.host_mem, false) < 0)
                goto out;
            break;
        case 'f':
            if (parse_bytes("--nvme-free", optarg, &g.nvme_free, true) < 0)
                goto out;
            g.has_nvme_free = true;
            break;
        case 'r':
            if (parse_pos("--nvme-read", optarg, &g.nvme_read) < 0)
                goto out;
            break;
        case 'w':
            if (parse_pos("--nvme-write", optarg, &g.nvme_write) < 0)
                goto out;
            break;
        case 'x':
            if (parse_pos("--h2d", optarg, &g.h2d) < 0)
                goto out;
            break;
        case 'C':
            if (parse_pos("--coll-gbps", optarg, &g.coll) < 0)
                goto out;
            break;
        case 'a':
            if (parse_pos("--adam-gelems", optarg, &g.adam) < 0)
                goto out;
            break;
        case 'P':
            refresh = true;
            break;
        case 'A':
            autoplace = true;
            break;
        case 'J':
            json = true;
            break;
        case 'T':
            trace = true;
            break;
        case 'h':
            plan_usage(stdout);
            status = 0;
            goto out;
        case ':':
            fprintf(stderr, "fsoff: error: plan: %s needs a value; see fsoff plan --help\n",
                    argv[optind - 1]);
            goto out;
        default:
            fprintf(stderr, "fsoff: error: plan: unknown option '%s'; see fsoff plan --help\n",
                    argv[optind - 1]);
            goto out;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "fsoff: error: plan: unexpected argument '%s'; see fsoff plan --help\n",
                argv[optind]);
        goto out;
    }
    if (g.gpus && cfg.world > 1) {
        fprintf(stderr, "fsoff: error: --gpus and --devices cpu:N both give the device count; "
                        "use one\n");
        goto out;
    }
    if (!g.gpus && (g.gpu || g.gpu_mem || g.gpu_tflops > 0))
        g.gpus = 1;
    if (fso_config_load_all(&cfg, config_path, sets, nsets) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", cfg.err);
        goto out;
    }
    if (g.gpus)
        cfg.world = g.gpus;
    if (g.device_mem)
        cfg.device_mem_bytes = g.device_mem;

    /* ---- the machine */
    fso_plan_machine m = {0};
    const fso_gpu_spec *spec = NULL;
    char dirs[8192], missing[8192];
    nvme_folders(&cfg, dirs, sizeof dirs, missing, sizeof missing);
    bool need_probe = !g.gpus || !g.host_mem || !(g.adam > 0) ||
                      (dirs[0] && (!(g.nvme_read > 0) || !(g.nvme_write > 0)));
    fso_probe pr = {0};
    if (refresh || need_probe) {
        if (probe_here(&cfg, dirs, refresh, &pr, err, sizeof err) < 0) {
            fprintf(stderr, "fsoff: error: %s\n", err);
            status = 1;
            goto out;
        }
    }
    if (g.gpus) {
        if (g.gpu)
            spec = fso_gpu_spec_find(g.gpu);
        else if (g.gpu_mem)
            spec = fso_gpu_spec_nearest_mem(g.gpu_mem);
        else
            spec = fso_gpu_spec_find("h100");
        m.devices = g.gpus;
        machine_gpu_figures(&m, spec);
        m.device_mem_bytes = g.gpu_mem ? g.gpu_mem : (uint64_t)(spec->mem_gib * GIB);
        if (g.gpu_tflops > 0)
            m.device_gflops = g.gpu_tflops * 1e3;
        if (g.h2d > 0)
            m.h2d_gbps = m.d2h_gbps = g.h2d;
        if (g.coll > 0)
            m.coll_gbps = g.coll;
        m.host_mem_bytes = g.host_mem ? g.host_mem : fso_mem_available_bytes();
        m.adam_gelems = g.adam > 0 ? g.adam : pr.adam_gelems;
        m.host_copy_gbps = pr.host_copy_gbps > 0 ? pr.host_copy_gbps : 10;
    } else {
        int threads = cfg.threads > 0 ? cfg.threads : fso_cpu_count();
        double scale = pr.threads > 0 ? (double)threads / pr.threads : 1.0;
        const int W = cfg.world > 0 ? cfg.world : 1;
        m.devices = W;
        m.cpu_devices = true;
        m.host_mem_bytes = g.host_mem ? g.host_mem : fso_mem_available_bytes();
        m.device_mem_bytes = fso_zero_cpu_device_mem(&cfg, m.host_mem_bytes);
        m.device_gflops = g.gpu_tflops > 0 ? g.gpu_tflops * 1e3 : pr.gflops * scale / W;
        m.h2d_gbps = m.d2h_gbps = g.h2d > 0 ? g.h2d : pr.h2d_gbps;
        m.coll_gbps = g.coll > 0 ? g.coll : pr.coll_gbps;
        m.adam_gelems = g.adam > 0 ? g.adam : pr.adam_gelems * scale;
        m.host_copy_gbps = pr.host_copy_gbps;
    }
    /* a drive described by its rates: 0.1 ms per request beyond the transfer, as
     * datacenter NVMe drives take for 1 MiB */
    m.nvme_read_gbps = g.nvme_read > 0 ? g.nvme_read : pr.nvme_read_gbps;
    m.nvme_write_gbps = g.nvme_write > 0 ? g.nvme_write : pr.nvme_write_gbps;
    m.nvme_read_lat_ms = g.nvme_read > 0 ? 0.1 : pr.nvme_read_lat_ms;
    m.nvme_write_lat_ms = g.nvme_write > 0 ? 0.1 : pr.nvme_write_lat_ms;
    m.nvme_free_bytes = g.has_nvme_free ? g.nvme_free : dirs[0] ? folders_free(dirs) : 0;
    if (m.nvme_free_bytes && (!(m.nvme_read_gbps > 0) || !(m.nvme_write_gbps > 0))) {
        fprintf(stderr, "fsoff: error: --nvme-free without NVMe rates: give --nvme-read and "
                        "--nvme-write (GB/s), or --nvme DIR to measure a folder\n");
        goto out;
    }

    /* ---- inputs, pins */
    if (fso_plan_ctx_init(&ctx, &cfg, &m, g.gpus > 0, err, sizeof err) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", err);
        goto out;
    }
    bool calibrated = false;
    if (!g.gpus && !(g.gpu_tflops > 0)) {
        char cerr[256];
        calibrated = fso_plan_calibrate_cpu(&ctx, &cfg, cerr, sizeof cerr) == 0;
        m.device_gflops = ctx.in.machine.device_gflops;
    }
    fso_plan_pins pins;
    if (autoplace)
        fso_plan_pins_none(&pins);
    else
        fso_plan_pins_from_config(&cfg, &pins);
    ctx.in.pins = pins;
    bool nvme_pinned = false;
    for (int k = 0; k < FSO_N_KINDS; k++)
        nvme_pinned = nvme_pinned || pins.tier[k] == FSO_TIER_NVME;
    if (nvme_pinned && m.nvme_free_bytes == 0) {
        if (missing[0])
            fprintf(stderr, "fsoff: error: the config keeps state on NVMe in %s, which does not "
                            "exist here; give --nvme DIR, or --nvme-free, --nvme-read and "
                            "--nvme-write to plan for drives elsewhere (or --auto to let fsoff "
                            "choose the tiers)\n", missing);
        else
            fprintf(stderr, "fsoff: error: the config keeps state on NVMe but no NVMe space is "
                            "known; give --nvme DIR, or --nvme-free, --nvme-read and "
                            "--nvme-write\n");
        goto out;
    }

    plan = malloc(sizeof *plan);
    freeplan = malloc(sizeof *freeplan);
    if (!plan || !freeplan)
        goto oom;
    int rc = fso_plan_choose(&ctx.in, plan);
    if (rc < 0 && rc != -ENOSPC) {
        fprintf(stderr, "fsoff: error: planner: %s\n", strerror(-rc));
        status = 1;
        goto out;
    }
    bool pinned_any = pins.prefetch >= 0;
    for (int k = 0; k < FSO_N_KINDS; k++)
        pinned_any = pinned_any || pins.tier[k] >= 0;
    bool have_free = false;
    if (pinned_any) {
        fso_plan_input fin = ctx.in;
        fso_plan_pins_none(&fin.pins);
        have_free = fso_plan_choose(&fin, freeplan) == 0;
    }

    if (json) {
        json_t *j = plan_json(plan);
        json_object_set_new(j, "n_params", json_integer((json_int_t)ctx.n_params));
        json_object_set_new(j, "gpu", json_string(spec ? spec->name : "cpu"));
        if (have_free && freeplan->step_ms < plan->step_ms * 0.95)
            json_object_set_new(j, "unpinned_step_ms", json_real(freeplan->step_ms));
        char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
        if (s)
            printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        const fso_model_config *mc = &cfg.model;
        char h1[32], h2[32], h3[32];
        printf("plan: model llama %.*f%s parameters: %d layers, hidden %d, ffn %d, heads %d/%d kv, "
               "vocab %d%s\n", ctx.n_params >= 1e9 ? 2 : 1,
               ctx.n_params >= 1e9 ? ctx.n_params / 1e9 : ctx.n_params / 1e6,
               ctx.n_params >= 1e9 ? "B" : "M", mc->num_hidden_layers, mc->hidden_size,
               mc->intermediate_size, mc->num_attention_heads, mc->num_key_value_heads,
               mc->vocab_size, mc->tie_word_embeddings ? ", tied head" : "");
        printf("plan: batch %d x %d tokens x %d accumulation x %d devices = %.0f tokens/step; "
               "activation checkpointing %s; optimizer overlap %s\n",
               cfg.micro_batch, cfg.data.seq_len, cfg.grad_accum, m.devices,
               ctx.in.model.tokens_per_step, cfg.activation_checkpointing ? "on" : "off",
               ctx.in.engine.overlap == FSO_OVERLAP_FORWARD    ? "forward"
               : ctx.in.engine.overlap == FSO_OVERLAP_BACKWARD ? "backward"
                                                                    : "none");
        fso_human_bytes(h1, sizeof h1, (double)m.device_mem_bytes);
        fso_human_bytes(h2, sizeof h2, (double)m.host_mem_bytes);
        fso_human_bytes(h3, sizeof h3, (double)m.nvme_free_bytes);
        if (spec)
            printf("plan: machine %d x GPU (%s figures%s): %s each, %.0f TFLOP/s achieved, h2d "
                   "%.0f GB/s, all-gather %.0f GB/s; working parameters and gradients bf16\n",
                   m.devices, spec->name, g.gpu_mem || g.gpu_tflops > 0 || g.h2d > 0 || g.coll > 0
                                             ? " where not given" : "",
                   h1, m.device_gflops / 1e3, m.h2d_gbps, m.coll_gbps);
        else
            printf("plan: machine %d CPU device%s (this machine's probes): %s each, %.0f GFLOP/s "
                   "each (%s), copies %.1f GB/s, collectives %.1f GB/s; fp32\n",
                   m.devices, m.devices == 1 ? "" : "s", h1, m.device_gflops,
                   g.gpu_tflops > 0 ? "given" : calibrated ? "one layer timed" : "sgemm probe",
                   m.h2d_gbps, m.coll_gbps);
        printf("plan: host %s%s, CPU AdamW %.2f Gelem/s%s; NVMe %s free%s, read %.2f GB/s, "
               "write %.2f GB/s%s\n",
               h2, g.host_mem ? "" : " (available now)", m.adam_gelems,
               g.adam > 0 ? "" : " (this machine's probe)", h3,
               g.has_nvme_free ? "" : dirs[0] ? " (statvfs)" : "", m.nvme_read_gbps,
               m.nvme_write_gbps, g.nvme_read > 0 ? "" : dirs[0] ? " (probed)" : "");
        if (missing[0])
            printf("plan: note: NVMe folder %s does not exist here; %s\n", missing,
                   g.has_nvme_free ? "NVMe as given by --nvme-free, --nvme-read, --nvme-write"
                                   : "planned without it");
        fso_plan_print(stdout, plan);
        if (plan->fits && have_free && freeplan->step_ms < plan->step_ms * 0.95) {
            char d[512];
            fso_plan_describe(freeplan, d, sizeof d);
            printf("plan: note: the config pins offload devices; left to choose, fsoff would "
                   "take %s: %.1f ms/step (%.2fx faster); see --auto\n",
                   d, freeplan->step_ms, plan->step_ms / freeplan->step_ms);
        }
        print_alternatives(stdout, &ctx.in);
        printf("plan: %d placements predicted\n", plan->evaluated);
        if (trace)
            fso_plan_trace(&ctx.in, &plan->pl, stdout);
    }
    fflush(stdout);
    if (rc == -ENOSPC) {
        fso_plan_shortfall_message(plan, &pins, err, sizeof err);
        fprintf(stderr, "fsoff: error: no placement fits: %s\n", err);
        status = 1;
        goto out;
    }
    status = 0;
    goto out;
oom:
    fprintf(stderr, "fsoff: error: out of memory\n");
    status = 1;
out:
    for (int i = 0; i < nsets; i++)
        free(sets[i]);
    free(sets);
    free(plan);
    free(freeplan);
    fso_plan_ctx_free(&ctx);
    fso_config_free(&cfg);
    return status;
}
