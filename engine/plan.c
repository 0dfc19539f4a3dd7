/* plan.c — the planner applied to a configuration (plan.h). */
#include "plan.h"

#include <errno.h>
#include <limits.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "adamw.h"
#include "boxes.h"
#include "model.h"
#include "probe.h"
#include "topology.h"
#include "util.h"
#include "zero/zero.h"

void fso_plan_machine_gpu(fso_plan_machine *m, const fso_gpu_spec *spec)
{
    m->cpu_devices = false;
    m->device_gflops = spec->tflops * 1e3;
    m->peak_gflops = spec->peak_tflops * 1e3;
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
    /* the machine's boxes (planner.h): each of W devices; the global batch
     * is over all of them (fso_config_ranks) */
    const int B = m->boxes > 1 ? m->boxes : 1;
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
    /* padded for every box's devices, as the engine lays them out (model.h) */
    fso_model_layout(bl, mc, W * B);
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
        const int l = mv[k].block - 1; /* a layer's */
        ctx->visit_part[k] = p;
        ctx->visits[k] = (fso_plan_visit){
            .block = mv[k].block, .params = mv[k].params, .grads = mv[k].grads,
            .flops = p == FSO_PART_LAYER_FWD ? layer_fwd
                     : p == FSO_PART_LAYER_BWD ? layer_bwd
                     : p == FSO_PART_HEAD      ? 3 * head_fwd
                                               : 0,
            /* the kept inputs (model.h): the embedding writes input 0, layer l
             * input l + 1; the head reads input L first, layer l's backward
             * input l (as 1 + the input) */
            .act_write = p == FSO_PART_EMBED_FWD ? 1 : p == FSO_PART_LAYER_FWD ? l + 2 : 0,
            .act_read = p == FSO_PART_HEAD ? L + 1 : p == FSO_PART_LAYER_BWD ? l + 1 : 0};
    }
    free(mv);
    for (int k = 0; k < n; k++)
        ctx->true_flops[k] = ctx->visits[k].flops;

    fso_plan_input *in = &ctx->in;
    in->machine = *m;
    ctx->probe_gflops = m->device_gflops;
    in->machine.devices = W;
    in->machine.boxes = B;
    in->model.n_blocks = nb;
    in->model.block_elems = ctx->block_elems;
    in->model.n_visits = n;
    in->model.visits = ctx->visits;
    in->model.grad_accum = cfg->grad_accum;
    in->model.tokens_per_step =
        (double)W * B * cfg->grad_accum * cfg->micro_batch * cfg->data.seq_len;
    in->model.flops_per_token = 3.0 * fso_model_flops_per_token(mc, cfg->data.seq_len);
    /* what the engine allocates, on GPUs as on the CPU: with bf16.enabled
     * the activations inside a layer and the kept layer inputs in bf16 */
    in->model.activation_bytes = fso_model_activation_bytes_for(
        mc, cfg->micro_batch, cfg->data.seq_len, cfg->activation_checkpointing, cfg->bf16);
    /* the kept inputs on the host: offered with checkpointing (model.h) */
    if (fso_model_acts_tier_ok(FSO_TIER_HOST, cfg->activation_checkpointing)) {
        const int mb = cfg->micro_batch, sl = cfg->data.seq_len;
        const bool ck = cfg->activation_checkpointing;
        in->model.act_ring = FSO_ACT_RING;
        in->model.act_host_device_bytes =
            fso_model_activation_bytes_tier(mc, mb, sl, ck, cfg->bf16, FSO_TIER_HOST);
        in->model.act_host_inputs = L + 1 > FSO_ACT_RING ? L + 1 - FSO_ACT_RING : 0;
        in->model.act_kept_bytes =
            in->model.act_host_inputs
                ? fso_model_host_act_bytes_for(mc, mb, sl, ck, cfg->bf16, FSO_TIER_HOST) /
                      (uint64_t)in->model.act_host_inputs
                : 0;
    }

    fso_plan_engine *en = &in->engine;
    en->overlap = cfg->optimizer_overlap;
    /* The engine as it runs (engine/zero/), one description for CPU and GPU
     * devices: its rules (zero.h fso_zero_fp_rules_on: working parameters
     * bf16 only with bf16.enabled; gradient shards fp32, their reduce in
     * bf16 with train.gradient_dtype "bf16", a user's choice the plan
     * follows and does not make: it changes the arithmetic);
     * per-block tiers (state.h's fso_block_rule: resident parameter blocks,
     * device-state blocks, the first blocks' NVMe state on the host); shards
     * gathered, or streamed blocks copied whole (train.whole_block_copies); a
     * gradient shard stored and waited for before the next block's
     * (zero_source.c); a block's new parameters on NVMe landed before the
     * forward reads them (zero_optim.c); each block's norm as its gradients
     * land. */
    if (gpu) /* GPUs the CPU cannot address, whatever cfg's backend says */
        fso_zero_fp_rules_on(cfg, fso_backend_row_of(FSO_BACKEND_CUDA), &en->rules);
    else /* cfg's CPU backend (cpu, or cpu-async in tests: its row says how it is addressed) */
        fso_zero_fp_rules(cfg, &en->rules);
    en->rules.world = W;
    en->rules.boxes = B;
    en->per_block_tiers = true;
    /* whole-block copies where the engine makes them: devices the CPU
     * cannot address (the search adds: more than one, streamed blocks) */
    en->whole_copy = !en->rules.host_addressable;
    en->state_host_blocks = true;
    en->sync_grad_writes = true;
    en->norm_pass = false;
    en->opt_write_lag = 1;
    if (gpu) /* CUDA context, cuBLAS, NCCL; the backend's scratch */
        en->device_reserve_bytes = ((uint64_t)2 << 30) + fso_model_cuda_scratch_bytes_for(
            mc, cfg->micro_batch, cfg->data.seq_len, cfg->bf16);
    else /* engine/zero/zero.c on the CPU backend */
        en->device_reserve_bytes = fso_zero_widen_bytes(cfg, fso_backend_row_of(FSO_BACKEND_CPU));
    /* train.device_margin, else config.h's default for the devices */
    in->machine.device_margin = cfg->device_margin >= 0 ? cfg->device_margin
                                : gpu                   ? FSO_DEVICE_MARGIN_GPU
                                                        : 0;
    en->host_reserve_bytes = fso_zero_saver_bytes(cfg);
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

/* ------------------------------------------------------------------ pins */

void fso_plan_pins_from_config(const fso_config *cfg, fso_plan_pins *pins)
{
    const bool pparam =
        fso_config_pinned(cfg, "zero_optimization.offload_param.device");
    const bool poptim = fso_config_pinned(cfg, "zero_optimization.offload_optimizer.device");
    /* a DeepSpeed prefetch key given "auto" frees the depth */
    const bool ppf =
        fso_config_pinned(cfg, "train.prefetch_blocks") && !fso_plan_prefetch_auto(cfg);
    fso_plan_pins_none(pins);
    if (pparam)
        pins->tier[FSO_KIND_PARAM] = (int)cfg->offload.param_tier;
    if (poptim)
        for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
            pins->tier[k] = (int)cfg->offload.optim_tier;
    if (ppf)
        pins->prefetch = cfg->offload.prefetch_blocks;
    /* the per-block counts (state.h fso_block_rule) the user wrote */
    if (fso_config_pinned(cfg, "train.resident_blocks") &&
        cfg->offload.resident_blocks >= 0)
        pins->resident_blocks = cfg->offload.resident_blocks;
    if (fso_config_pinned(cfg, "train.device_state_blocks") &&
        cfg->offload.device_state_blocks >= 0)
        pins->device_state_blocks = cfg->offload.device_state_blocks;
    if (fso_config_pinned(cfg, "train.device_state_from"))
        pins->device_state_first = cfg->offload.device_state_first;
    if (fso_config_pinned(cfg, "train.whole_block_copies"))
        pins->whole_copy = cfg->offload.whole_copy;
    if (fso_config_acts_pinned(cfg))
        pins->acts = (int)fso_config_acts_tier(cfg);
}

/* ------------------------------------------------------------------ this machine */


void fso_plan_nvme_folders(const fso_config *cfg, char *buf, size_t len, char *missing,
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

uint64_t fso_plan_folders_free(const char *dirs)
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

int fso_plan_probe(const fso_config *cfg, const char *dirs, bool refresh, fso_probe *p,
                   char *err, size_t errlen)
{
    fso_probe_opts po = {.dirs = dirs, .threads = cfg->threads};
    bool probed = false;
    return fso_probe_get(p, &po, refresh, &probed, err, errlen);
}

/* A run across boxes (boxes.h) plans one box of several, at the rate its
 * rails measured when they were made. */
static void machine_boxes(const fso_config *cfg, fso_plan_machine *m)
{
    m->boxes = fso_config_boxes(cfg);
    m->net_gbps = m->boxes > 1 ? fso_boxes_net_gbps() : 0;
}

void fso_plan_machine_cpu(const fso_config *cfg, const fso_probe *p, uint64_t host_mem_bytes,
                          fso_plan_machine *m)
{
    const int W = fso_config_world(cfg);
    const int threads = cfg->threads > 0 ? cfg->threads : fso_cpu_count();
    const double scale = p->threads > 0 ? (double)threads / p->threads : 1.0;
    memset(m, 0, sizeof *m);
    m->devices = W;
    m->cpu_devices = true;
    m->host_mem_bytes = host_mem_bytes;
    m->device_mem_bytes = fso_zero_cpu_device_mem(cfg, host_mem_bytes);
    m->nvme_read_gbps = p->nvme_read_gbps;
    /* writes at the rate they complete at, the drive draining them at the
     * flushed rate behind (planner.h); tuned rates are flushed ones */
    m->nvme_write_gbps = p->nvme_write_burst_gbps > p->nvme_write_gbps ? p->nvme_write_burst_gbps
                                                                       : p->nvme_write_gbps;
    m->nvme_drain_gbps = p->nvme_write_gbps;
    m->nvme_read_cpu_s_per_gb = p->nvme_read_cpu_s_per_gb;
    m->nvme_write_cpu_s_per_gb = p->nvme_write_cpu_s_per_gb;
    m->nvme_read_lat_ms = p->nvme_read_lat_ms;
    m->nvme_write_lat_ms = p->nvme_write_lat_ms;
    m->h2d_gbps = p->h2d_gbps;
    m->d2h_gbps = p->d2h_gbps;
    m->host_copy_gbps = p->host_copy_gbps;
    m->coll_gbps = p->coll_gbps;
    m->device_gflops = p->gflops * scale / W;
    /* the probe's rate is all its threads'; the devices' optimizers run
     * fso_zero_optimizer_threads each */
    m->adam_gelems = p->adam_gelems * scale * W * fso_zero_optimizer_threads(cfg) / threads;
    m->device_adam_gelems = 0;
    machine_boxes(cfg, m);
}

void fso_plan_capacities_here(const fso_config *cfg, bool gpu, uint64_t gpu_free_bytes,
                              fso_plan_machine *m)
{
    char dirs[8192], missing[8192];
    memset(m, 0, sizeof *m);
    fso_plan_nvme_folders(cfg, dirs, sizeof dirs, missing, sizeof missing);
    m->devices = fso_config_world(cfg);
    m->host_mem_bytes = cfg->host_mem_bytes ? cfg->host_mem_bytes : fso_mem_usable_bytes();
    m->device_mem_bytes = !gpu                  ? fso_zero_cpu_device_mem(cfg, m->host_mem_bytes)
                          : cfg->device_mem_bytes ? cfg->device_mem_bytes
                                                  : gpu_free_bytes;
    m->nvme_free_bytes = dirs[0] ? fso_plan_folders_free(dirs) : 0;
    machine_boxes(cfg, m);
}

int fso_plan_machine_here(const fso_config *cfg, bool refresh, fso_plan_machine *m, char *err,
                          size_t errlen)
{
    char dirs[8192], missing[8192];
    fso_probe p;
    fso_plan_nvme_folders(cfg, dirs, sizeof dirs, missing, sizeof missing);
    int rc = fso_plan_probe(cfg, dirs, refresh, &p, err, errlen);
    if (rc < 0)
        return rc;
    uint64_t host = cfg->host_mem_bytes ? cfg->host_mem_bytes : fso_mem_usable_bytes();
    fso_plan_machine_cpu(cfg, &p, host ? host : p.host_mem_bytes, m);
    m->nvme_free_bytes = dirs[0] ? fso_plan_folders_free(dirs) : 0;
    if (m->nvme_read_gbps <= 0 || m->nvme_write_gbps <= 0)
        m->nvme_free_bytes = 0;
    return 0;
}

/* ------------------------------------------------------------------ sizes */

int fso_plan_check_size(const fso_config *cfg, const fso_plan_pins *pins,
                        const fso_plan_machine *m, bool gpu, bool train, char *err,
                        size_t errlen)
{
    const uint64_t W = (uint64_t)(m->devices > 0 ? m->devices : 1);
    fso_config *c = malloc(sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    /* the least the devices and the host hold whatever the placement: with
     * the parameters on the devices (lent in place, no gather window) or
     * elsewhere (no parameter ring in the host arena) */
    fso_zero_need lend, gather;
    const fso_backend_row *on = gpu ? fso_backend_row_of(FSO_BACKEND_CUDA)
                                    : fso_backend_row_of(cfg->backend);
    *c = *cfg;
    (void)fso_config_set_world(c, (int)W); /* a count it cannot split: the loaded split */
    c->offload.param_tier = FSO_TIER_DEVICE;
    fso_zero_need_on(c, on, &lend);
    c->offload.param_tier = FSO_TIER_HOST;
    fso_zero_need_on(c, on, &gather);
    free(c);
    uint64_t state = 0, pinned[FSO_N_TIERS] = {0};
    for (int k = 0; k < FSO_N_KINDS; k++) {
        state = fso_sat_add(state, gather.kind_bytes[k]);
        if (pins && pins->tier[k] >= 0)
            pinned[pins->tier[k]] = fso_sat_add(pinned[pins->tier[k]], gather.kind_bytes[k]);
    }
    const uint64_t buffers = lend.device_buffers < gather.device_buffers ? lend.device_buffers
                                                                         : gather.device_buffers;
    const uint64_t fixed[FSO_N_TIERS] = {fso_sat_add(gather.activations, buffers),
                                         fso_sat_add(fso_sat_mul(gather.staging, W),
                                                     gather.saver), 0};
    if (state != FSO_BYTES_OVERFLOW && fixed[0] != FSO_BYTES_OVERFLOW &&
        fixed[1] != FSO_BYTES_OVERFLOW && fso_model_n_blocks(&cfg->model) <= FSO_PLAN_MAX_BLOCKS)
        return 0; /* the planner sizes it placement by placement */

    /* each tier: what it holds whatever the placement (device: per device),
     * and what is left for the state no configuration key pins */
    const uint64_t have[FSO_N_TIERS] = {m->device_mem_bytes, m->host_mem_bytes,
                                        m->nvme_free_bytes};
    const uint64_t times[FSO_N_TIERS] = {W, 1, 1};
    uint64_t least[FSO_N_TIERS], room = 0, deficit = 0;
    bool known = true;
    for (int t = 0; t < FSO_N_TIERS; t++) {
        least[t] = fso_sat_add(fixed[t], t == FSO_TIER_DEVICE ? fso_sat_div(pinned[t], W)
                                                               : pinned[t]);
        if (have[t] == 0 && t != FSO_TIER_NVME) /* not known here: not counted */
            known = false;
        else if (least[t] <= have[t])
            room = fso_sat_add(room, fso_sat_mul(have[t] - least[t], times[t]));
        else
            deficit = fso_sat_add(deficit, fso_sat_mul(least[t] == FSO_BYTES_OVERFLOW
                                                           ? least[t]
                                                           : least[t] - have[t],
                                                       times[t]));
    }
    const uint64_t loose =
        state == FSO_BYTES_OVERFLOW
            ? state
            : state - fso_sat_add(fso_sat_add(pinned[0], pinned[1]), pinned[2]);
    if (loose == FSO_BYTES_OVERFLOW || (known && loose > room))
        deficit = fso_sat_add(deficit, loose == FSO_BYTES_OVERFLOW ? loose : loose - room);
    if (deficit == 0)
        return 0;

    /* one line: every tier's need against what it holds, the state, the total short */
    static const char *const what[FSO_N_TIERS] = {"activations and buffers", "staging", ""};
    char tiers[3][256], n[48], h[48], pn[48], hs[48], hp[48], hg[48], ho[48], by[48];
    static const char *const who[FSO_N_TIERS] = {"each device", "the host", "NVMe"};
    static const char *const holds[FSO_N_TIERS] = {"holds %s", "%s is available",
                                                   "has %s free"};
    for (int t = 0; t < FSO_N_TIERS; t++) {
        fso_human_bytes(n, sizeof n, (double)least[t]);
        fso_human_bytes(h, sizeof h, (double)have[t]);
        fso_human_bytes(pn, sizeof pn, (double)(least[t] - fixed[t]));
        int o = snprintf(tiers[t], sizeof tiers[t], "%s needs %s", who[t], n);
        if (least[t] && fixed[t])
            o += snprintf(tiers[t] + o, sizeof tiers[t] - (size_t)o, " (%s%s", what[t],
                          least[t] > fixed[t] ? ", " : ")");
        if (least[t] > fixed[t])
            o += snprintf(tiers[t] + o, sizeof tiers[t] - (size_t)o, "%sstate pinned there %s)",
                          fixed[t] ? "" : " (", pn);
        if (!have[t] && t != FSO_TIER_NVME)
            snprintf(h, sizeof h, "an unknown amount");
        o += snprintf(tiers[t] + o, sizeof tiers[t] - (size_t)o, " and ");
        snprintf(tiers[t] + o, sizeof tiers[t] - (size_t)o, holds[t], h);
    }
    const uint64_t opt = fso_sat_add(fso_sat_add(gather.kind_bytes[FSO_KIND_MASTER],
                                                 gather.kind_bytes[FSO_KIND_M]),
                                     gather.kind_bytes[FSO_KIND_V]);
    char loose_part[128] = "";
    fso_human_bytes(hs, sizeof hs, (double)state);
    fso_human_bytes(hp, sizeof hp, (double)gather.kind_bytes[FSO_KIND_PARAM]);
    fso_human_bytes(hg, sizeof hg, (double)gather.kind_bytes[FSO_KIND_GRAD]);
    fso_human_bytes(ho, sizeof ho, (double)opt);
    fso_human_bytes(h, sizeof h, (double)room);
    fso_human_bytes(by, sizeof by, (double)deficit);
    if (loose < state) {
        fso_human_bytes(n, sizeof n, (double)loose);
        snprintf(loose_part, sizeof loose_part, ", of which %s is not pinned to a tier", n);
    }
    snprintf(err, errlen,
             "too large for this machine: %s; %s; %s; and the training state, %s (parameters "
             "%s, gradients %s, master, m and v %s)%s, has %s left for it; short by %s: shrink "
             "the model (model.num_hidden_layers, model.hidden_size), lower "
             "train_micro_batch_size_per_gpu or data.seq_len, or give NVMe folders with room "
             "(--nvme DIR%s)",
             tiers[0], tiers[1], tiers[2], hs, hp, hg, ho, loose_part,
             known ? h : "an unknown amount", by, train ? "" : ", or --nvme-free");
    return -ENOSPC;
}

/* ------------------------------------------------------------------ for train */

/* The choice for ctx keeping pins (NULL: none), the shortfall named when
 * nothing fits; ctx is freed. */
static int choose_and_free(fso_plan_ctx *ctx, const fso_config *cfg, const fso_plan_pins *pins,
                           fso_plan *out, char *err, size_t errlen)
{
    if (pins)
        ctx->in.pins = *pins;
    int rc = fso_plan_choose(&ctx->in, out);
    if (rc == -ENOSPC) {
        char dirs[8192], missing[8192];
        fso_plan_nvme_folders(cfg, dirs, sizeof dirs, missing, sizeof missing);
        const fso_plan_origin o = {.train = true, .host_given = cfg->host_mem_bytes != 0,
                                   .device_given = cfg->device_mem_bytes != 0,
                                   .nvme_dirs = dirs};
        fso_plan_nofit_message(&ctx->in, out, &o, err, errlen);
    }
    else if (rc < 0)
        snprintf(err, errlen, "planner: %s", strerror(-rc));
    fso_plan_ctx_free(ctx);
    return rc;
}

int fso_plan_ctx_here(fso_plan_ctx *ctx, const fso_config *cfg, char *err, size_t errlen)
{
    fso_plan_machine m;
    int rc = fso_plan_machine_here(cfg, false, &m, err, errlen);
    if (rc < 0)
        return rc;
    if ((rc = fso_plan_ctx_init(ctx, cfg, &m, false, err, errlen)) < 0)
        return rc;
    char cerr[256];
    fso_plan_calibrate_cpu(ctx, cfg, false, cerr, sizeof cerr); /* else the sgemm rate stands */
    return 0;
}

void fso_plan_part_ms(const fso_plan_ctx *ctx, double *part_ms)
{
    int count[FSO_N_PARTS] = {0};
    const fso_plan_input *in = &ctx->in;
    for (int p = 0; p < FSO_N_PARTS; p++)
        part_ms[p] = 0;
    for (int k = 0; k < in->model.n_visits; k++)
        if (ctx->visit_part[k] >= 0) {
            part_ms[ctx->visit_part[k]] += in->model.visits[k].flops / (in->machine.device_gflops * 1e6);
            count[ctx->visit_part[k]]++;
        }
    for (int p = 0; p < FSO_N_PARTS; p++)
        if (count[p])
            part_ms[p] /= count[p];
}

/* Whether any placement fits is a question of capacities alone, asked
 * before this machine is probed (seconds, the first time) or a layer is
 * timed: -ENOSPC with the shortfall, else 0. The rates are placeholders;
 * they rank placements and decide nothing here. */
static int fits_here(const fso_config *cfg, const fso_plan_pins *pins, bool gpu,
                     uint64_t gpu_free_bytes, fso_plan *out, char *err, size_t errlen)
{
    fso_plan_machine m;
    fso_plan_ctx ctx;
    fso_plan_capacities_here(cfg, gpu, gpu_free_bytes, &m);
    m.cpu_devices = !gpu;
    m.nvme_read_gbps = m.nvme_write_gbps = m.h2d_gbps = m.d2h_gbps = m.coll_gbps = 1;
    m.host_copy_gbps = m.device_gflops = m.adam_gelems = 1;
    if (m.boxes > 1) /* sizes only: any rate */
        m.net_gbps = 1;
    int rc = fso_plan_ctx_init(&ctx, cfg, &m, gpu, err, errlen);
    if (rc < 0)
        return 0; /* the full plan reports it */
    rc = choose_and_free(&ctx, cfg, pins, out, err, errlen);
    return rc == -ENOSPC ? rc : 0;
}

int fso_plan_for_config(const fso_config *cfg, const fso_plan_pins *pins, fso_plan *out,
                        char *err, size_t errlen)
{
    fso_plan_ctx ctx;
    int rc;
    if ((rc = fits_here(cfg, pins, false, 0, out, err, errlen)) < 0 ||
        (rc = fso_plan_ctx_here(&ctx, cfg, err, errlen)) < 0)
        return rc;
    return choose_and_free(&ctx, cfg, pins, out, err, errlen);
}

int fso_plan_for_config_gpus(const fso_config *cfg, const fso_plan_pins *pins,
                             const char *gpu_name, uint64_t gpu_free_bytes, fso_plan *out,
                             const fso_gpu_spec **spec_used, char *err, size_t errlen)
{
    fso_plan_machine m;
    fso_plan_ctx ctx;
    int rc;
    if ((rc = fits_here(cfg, pins, true, gpu_free_bytes, out, err, errlen)) < 0 ||
        (rc = fso_plan_machine_here(cfg, false, &m, err, errlen)) < 0) /* host, NVMe, AdamW */
        return rc;
    const fso_gpu_spec *spec = fso_gpu_spec_for_device(gpu_name, gpu_free_bytes);
    if (spec_used)
        *spec_used = spec;
    fso_plan_machine_gpu(&m, spec);
    m.device_mem_bytes = cfg->device_mem_bytes ? cfg->device_mem_bytes : gpu_free_bytes;
    if ((rc = fso_plan_ctx_init(&ctx, cfg, &m, true, err, errlen)) < 0)
        return rc;
    return choose_and_free(&ctx, cfg, pins, out, err, errlen);
}

/* Blocks from block 0 up (first) or from the last block down whose
 * master, m, v and gradients are all on the devices. */
static int device_state_run(const fso_placement *pl, bool first)
{
    const int nb = pl->n_blocks;
    int n = 0;
    for (; n < nb; n++) {
        const int b = first ? n : nb - 1 - n;
        bool dev = true;
        for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
            dev = dev && pl->tier[k][b] == FSO_TIER_DEVICE;
        if (!dev)
            break;
    }
    return n;
}

/* The rule (state.h) that places the blocks as pl does, if one does:
 * each kind's tier from a block no count moves, the counts from the
 * placement. Whether it does is fso_plan_apply's check. */
static void rule_of_placement(const fso_placement *pl, fso_block_rule *r)
{
    const int nb = pl->n_blocks;
    int order[FSO_PLAN_MAX_BLOCKS];
    fso_residency_order(nb, order);
    memset(r, 0, sizeof *r);
    r->n_blocks = nb;
    /* parameters: the tier of the last block in residency order, the
     * resident blocks counted */
    r->tier[FSO_KIND_PARAM] = (fso_tier)pl->tier[FSO_KIND_PARAM][order[nb - 1]];
    r->resident_blocks = -1;
    if (r->tier[FSO_KIND_PARAM] != FSO_TIER_DEVICE) {
        int n = 0;
        for (int b = 0; b < nb; b++)
            n += pl->tier[FSO_KIND_PARAM][b] == FSO_TIER_DEVICE;
        r->resident_blocks = n > 0 ? n : -1;
    }
    /* state: a run of device blocks at one end; every kind's tier from the
     * block furthest from block 0 outside it (the first blocks' NVMe state
     * may be on the host) */
    const int last = device_state_run(pl, false), first = device_state_run(pl, true);
    int S = last;
    r->device_state_first = last == 0 && first > 0;
    if (r->device_state_first)
        S = first;
    if (S >= nb)
        S = 0; /* every block's state on the devices: their tier */
    r->device_state_blocks = S > 0 ? S : -1;
    const int ref = r->device_state_first || S == 0 ? nb - 1 : nb - 1 - S;
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        r->tier[k] = (fso_tier)pl->tier[k][ref];
    for (int k = FSO_KIND_MASTER; k <= FSO_KIND_V; k++)
        if (r->tier[k] == FSO_TIER_NVME)
            for (int b = 0; b < nb; b++)
                if (pl->tier[k][b] == FSO_TIER_HOST && b + 1 > r->state_host_blocks)
                    r->state_host_blocks = b + 1;
}

int fso_plan_apply(const fso_plan *p, fso_config *cfg, char *err, size_t errlen)
{
    const int nb = p->pl.n_blocks;
    fso_block_rule rule;
    if (nb < 1 || nb > FSO_PLAN_MAX_BLOCKS) {
        snprintf(err, errlen, "internal error: a plan of %d blocks (1 to %d)", nb,
                 FSO_PLAN_MAX_BLOCKS);
        return -ENOTSUP;
    }
    rule_of_placement(&p->pl, &rule);
    const fso_tier *tier = rule.tier;
    bool nvme = false, wc = false;
    for (int k = 0; k < FSO_N_KINDS; k++)
        for (int b = 0; b < nb; b++)
            nvme = nvme || p->pl.tier[k][b] == FSO_TIER_NVME;
    /* the engine places blocks by the rule alone: it must give the plan's
     * placement, block by block (the planner makes no other) */
    for (int b = 0; b < nb; b++) {
        for (int k = 0; k < FSO_N_KINDS; k++) {
            const fso_tier want = (fso_tier)p->pl.tier[k][b], got = fso_block_tier(&rule, k, b);
            if (want != got) {
                snprintf(err, errlen,
                         "internal error: the plan puts block %d's %s on %s, but the "
                         "per-block rule it gives (resident_blocks %d, device_state_blocks "
                         "%d from the %s, state_host_blocks %d) puts them on %s; please report "
                         "it with the fsoff plan command",
                         b, fso_kind_name(k), fso_tier_name(want), rule.resident_blocks,
                         rule.device_state_blocks, rule.device_state_first ? "first" : "last",
                         rule.state_host_blocks, fso_tier_name(got));
                return -ENOTSUP;
            }
        }
        wc = wc || (p->pl.whole_copy[b] && p->pl.tier[FSO_KIND_PARAM][b] != FSO_TIER_DEVICE);
    }
    fso_offload_config *o = &cfg->offload;
    if (nvme) {
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
    o->per_kind = true;
    memcpy(o->kind_tier, tier, sizeof o->kind_tier);
    o->state_host_blocks = rule.state_host_blocks;
    o->resident_blocks = rule.resident_blocks;
    o->device_state_blocks = rule.device_state_blocks;
    if (rule.device_state_blocks > 0) /* else the configuration's stands */
        o->device_state_first = rule.device_state_first;
    o->param_tier = tier[FSO_KIND_PARAM];
    o->optim_tier = tier[FSO_KIND_MASTER];
    o->prefetch_blocks = p->pl.prefetch;
    cfg->activations = p->pl.acts; /* the engine's model places them at its start */
    /* whole-block copies: the plan's where it makes them, else the user's key
     * stands (a no-op where the engine makes none) */
    if (wc)
        o->whole_copy = true;
    else if (!fso_config_pinned(cfg, "train.whole_block_copies"))
        o->whole_copy = false;
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
