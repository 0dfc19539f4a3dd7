/* planner.c — a placement and what it takes (planner.h): pins that pin
 * nothing and uniform placements; the memory a placement needs on each tier,
 * as the engine allocates it (footprint.h); the checks of the inputs; one
 * placement sized and predicted (fso_plan_evaluate, fso_plan_trace: the
 * timeline is planner_timeline.c); a plan in words (fso_plan_describe,
 * fso_plan_why). Choosing and re-planning are planner_search.c; what the
 * parts share, planner_impl.h.
 *
 * Contract: every size comes from footprint.h, so what the planner counts
 * is what the engine allocates (test_footprint holds them equal); nothing
 * here chooses a placement.
 */
#include "planner_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fso_plan_pins_none(fso_plan_pins *p)
{
    for (int k = 0; k < FSO_N_KINDS; k++)
        p->tier[k] = -1;
    p->prefetch = -1;
    p->resident_blocks = p->device_state_blocks = p->device_state_first = -1;
    p->whole_copy = -1;
    p->acts = -1;
}

void fso_placement_uniform(fso_placement *pl, int n_blocks, int param_tier, int state_tier,
                           int grad_tier, int prefetch)
{
    memset(pl, 0, sizeof *pl);
    pl->n_blocks = n_blocks;
    pl->prefetch = prefetch;
    pl->acts = FSO_TIER_DEVICE;
    for (int b = 0; b < n_blocks && b < FSO_PLAN_MAX_BLOCKS; b++) {
        pl->tier[FSO_KIND_PARAM][b] = (uint8_t)param_tier;
        pl->tier[FSO_KIND_MASTER][b] = pl->tier[FSO_KIND_M][b] = pl->tier[FSO_KIND_V][b] =
            (uint8_t)state_tier;
        pl->tier[FSO_KIND_GRAD][b] = (uint8_t)grad_tier;
    }
}

/* ------------------------------------------------------------------ sizes */

/* The engine's footprint rules on this machine's devices. */
fso_fp_rules pl_rules_of(const fso_plan_input *in)
{
    fso_fp_rules r = in->engine.rules;
    r.world = in->machine.devices;
    /* the machine's boxes slice the optimizer's state (footprint.h) */
    r.boxes = in->machine.boxes > 1 ? in->machine.boxes : 1;
    return r;
}

/* Bytes of one shard of kind k of block b, as the engine allocates it. */
uint64_t pl_shard_bytes(const fso_plan_input *in, int b, int k)
{
    const fso_fp_rules r = pl_rules_of(in);
    return fso_fp_shard_bytes(&r, in->model.block_elems[b], (fso_kind)k);
}

static fso_tier placement_tier(const void *ctx, int b, fso_kind k)
{
    const fso_placement *pl = ctx;
    return (fso_tier)pl->tier[k][b];
}

/* Fills the memory fields of out, as the engine allocates for the
 * placement (footprint.h); returns true when everything fits. */
bool pl_size_placement(const fso_plan_input *in, const fso_placement *pl, fso_plan *out)
{
    const fso_plan_model *m = &in->model;
    const fso_plan_machine *mc = &in->machine;
    const uint64_t W = (uint64_t)mc->devices;
    const fso_fp_rules r = pl_rules_of(in);
    const fso_fp_layout l = {.n_blocks = m->n_blocks, .padded_elems = m->block_elems,
                             .tier = placement_tier, .ctx = pl, .prefetch = pl->prefetch};
    fso_fp_need fp;
    fso_fp_need_for(&r, &l, &fp);
    memcpy(out->kind_bytes, fp.kind_bytes, sizeof out->kind_bytes);
    const bool acts_host = pl->acts == FSO_TIER_HOST && m->act_kept_bytes;
    out->activation_bytes = acts_host ? m->act_host_device_bytes : m->activation_bytes;
    out->act_copy_bytes =
        acts_host ? fso_sat_mul(m->act_kept_bytes, (uint64_t)m->act_host_inputs) : 0;
    out->act_host_bytes = fso_sat_mul(out->act_copy_bytes, W);
    out->buffer_bytes[FSO_TIER_DEVICE] = fp.device_buffers + in->engine.device_reserve_bytes;
    out->buffer_bytes[FSO_TIER_HOST] = fp.staging * W + in->engine.host_reserve_bytes;
    out->buffer_bytes[FSO_TIER_NVME] = 0;

    /* the margin is never planned into: what the allocator, NCCL and the
     * libraries take beyond what the engine counts */
    const double margin = mc->device_margin > 0 && mc->device_margin < 1 ? mc->device_margin : 0;
    out->margin_bytes = (uint64_t)((double)mc->device_mem_bytes * margin);
    out->have_bytes[FSO_TIER_DEVICE] = mc->device_mem_bytes - out->margin_bytes;
    out->have_bytes[FSO_TIER_HOST] = mc->host_mem_bytes;
    out->have_bytes[FSO_TIER_NVME] = mc->nvme_free_bytes;
    out->short_tier = -1;
    out->short_bytes = 0;
    for (int t = 0; t < FSO_N_TIERS; t++) {
        uint64_t need = out->buffer_bytes[t] + (t == FSO_TIER_DEVICE ? out->activation_bytes
                                                : t == FSO_TIER_HOST ? out->act_host_bytes
                                                                     : 0);
        for (int k = 0; k < FSO_N_KINDS; k++)
            need += out->kind_bytes[t][k];
        out->need_bytes[t] = need;
    }
    /* CPU devices' memory is the host's: what they hold is not the arena's */
    if (mc->cpu_devices) {
        uint64_t dev = out->need_bytes[FSO_TIER_DEVICE] * W;
        out->have_bytes[FSO_TIER_HOST] = dev < mc->host_mem_bytes ? mc->host_mem_bytes - dev : 0;
    }
    for (int t = 0; t < FSO_N_TIERS; t++) {
        uint64_t need = out->need_bytes[t];
        if (need > out->have_bytes[t] && need - out->have_bytes[t] > out->short_bytes) {
            out->short_bytes = need - out->have_bytes[t];
            out->short_tier = t;
        }
    }
    out->fits = out->short_tier < 0;
    return out->fits;
}

/* The inputs in the ranges planner.h gives: 0, else -EINVAL. */
int pl_check_input(const fso_plan_input *in)
{
    const fso_plan_model *m = &in->model;
    const fso_plan_machine *mc = &in->machine;
    if (mc->devices < 1 || m->n_blocks < 1 || m->n_blocks > FSO_PLAN_MAX_BLOCKS ||
        m->n_visits < 1 || !m->block_elems || !m->visits || m->grad_accum < 1 ||
        mc->device_gflops <= 0 ||
        mc->adam_gelems <= 0)
        return -EINVAL;
    for (int k = 0; k < m->n_visits; k++)
        if (m->visits[k].block < 0 || m->visits[k].block >= m->n_blocks)
            return -EINVAL;
    if (m->act_kept_bytes && (m->act_ring < 1 || m->act_host_inputs < 0))
        return -EINVAL;
    /* several boxes talk over a network of a known rate */
    if (mc->boxes < 0 || mc->boxes > FSO_PLAN_MAX_BOXES || (mc->boxes > 1 && !(mc->net_gbps > 0)))
        return -EINVAL;
    return 0;
}

/* What one box sends to the others per step (footprint.h net_bytes): it
 * depends on the blocks alone, not on how often they are used. 0 on one
 * box, or when out of memory. */
static uint64_t net_bytes_of(const fso_plan_input *in, const fso_placement *pl)
{
    const int nb = in->model.n_blocks;
    if (in->machine.boxes <= 1)
        return 0;
    int *zeros = calloc((size_t)nb, sizeof *zeros);
    if (!zeros)
        return 0;
    const fso_fp_rules r = pl_rules_of(in);
    const fso_fp_layout l = {.n_blocks = nb, .padded_elems = in->model.block_elems,
                             .tier = placement_tier, .ctx = pl, .prefetch = pl->prefetch};
    const fso_fp_uses u = {.param_visits = zeros, .grad_visits = zeros, .grad_accum = 1};
    fso_fp_traffic t;
    fso_fp_step_traffic(&r, &l, &u, &t);
    free(zeros);
    return t.net_bytes;
}

int fso_plan_evaluate(const fso_plan_input *in, const fso_placement *pl, fso_plan *out)
{
    int rc = pl_check_input(in);
    if (rc < 0)
        return rc;
    if (pl->n_blocks != in->model.n_blocks || pl->prefetch < 0 ||
        pl->prefetch > FSO_PLAN_MAX_PREFETCH)
        return -EINVAL;
    memset(out, 0, sizeof *out);
    out->pl = *pl;
    out->machine = in->machine;
    out->overlap = in->engine.overlap;
    out->rules = pl_rules_of(in);
    out->grad_accum = in->model.grad_accum;
    out->tokens_per_step = in->model.tokens_per_step;
    for (int b = 0; b < in->model.n_blocks; b++)
        out->model_elems += in->model.block_elems[b];
    bool fits = pl_size_placement(in, pl, out);
    if ((rc = pl_simulate(in, pl, out, NULL)) < 0)
        return rc;
    out->evaluated = 1;
    out->net_bytes = net_bytes_of(in, pl);
    out->net_ms = out->busy_ms[FSO_STREAM_NET];
    /* tokens_per_step counts every box's devices: so does the peak */
    const double peak = in->machine.peak_gflops * 1e9 *
                        (in->machine.devices > 0 ? in->machine.devices : 1) *
                        (in->machine.boxes > 1 ? in->machine.boxes : 1);
    out->mfu = peak > 0 ? out->tokens_per_s * in->model.flops_per_token / peak : 0;
    return fits ? 0 : -ENOSPC;
}

int fso_plan_trace(const fso_plan_input *in, const fso_placement *pl, FILE *f)
{
    fso_plan *tmp = malloc(sizeof *tmp);
    int rc = tmp ? fso_plan_evaluate(in, pl, tmp) : -ENOMEM;
    if (rc == 0 || rc == -ENOSPC)
        rc = pl_simulate(in, pl, tmp, f);
    free(tmp);
    return rc;
}

/* ------------------------------------------------------------------ description */

int fso_plan_state_host_blocks(const fso_plan *p, int kind)
{
    const int nb = p->pl.n_blocks;
    int h = 0;
    if (kind < FSO_KIND_MASTER || kind > FSO_KIND_V || nb == 0 ||
        p->pl.tier[kind][nb - 1] != FSO_TIER_NVME)
        return 0;
    while (h < nb && p->pl.tier[kind][h] == FSO_TIER_HOST)
        h++;
    return h;
}

int fso_plan_main_tier(const fso_plan *p, int kind)
{
    if (fso_plan_state_host_blocks(p, kind) > 0)
        return FSO_TIER_NVME;
    int count[FSO_N_TIERS] = {0}, best = 0;
    for (int b = 0; b < p->pl.n_blocks; b++)
        count[p->pl.tier[kind][b]]++;
    for (int t = 1; t < FSO_N_TIERS; t++)
        if (count[t] > count[best])
            best = t;
    return best;
}

static size_t describe_kind(const fso_plan *p, int k, char *buf, size_t len)
{
    int count[FSO_N_TIERS] = {0};
    size_t off = 0;
    for (int b = 0; b < p->pl.n_blocks; b++)
        count[p->pl.tier[k][b]]++;
    int used = 0;
    for (int t = 0; t < FSO_N_TIERS; t++)
        if (count[t])
            used++;
    for (int t = 0; t < FSO_N_TIERS && off < len; t++) {
        if (!count[t])
            continue;
        if (used == 1)
            off += (size_t)snprintf(buf + off, len - off, "%s", fso_tier_name(t));
        else
            off += (size_t)snprintf(buf + off, len - off, "%s%s (%d of %d blocks)",
                                    off ? " + " : "", fso_tier_name(t), count[t], p->pl.n_blocks);
    }
    return off;
}

void fso_plan_describe(const fso_plan *p, char *buf, size_t len)
{
    char a[128], b[128], c[128], d[128], g[128];
    describe_kind(p, FSO_KIND_PARAM, a, sizeof a);
    describe_kind(p, FSO_KIND_MASTER, b, sizeof b);
    describe_kind(p, FSO_KIND_M, c, sizeof c);
    describe_kind(p, FSO_KIND_V, d, sizeof d);
    describe_kind(p, FSO_KIND_GRAD, g, sizeof g);
    bool wc = false, nvme = false, gathered = false;
    for (int i = 0; i < p->pl.n_blocks; i++) {
        const int pt = p->pl.tier[FSO_KIND_PARAM][i];
        wc = wc || (p->pl.whole_copy[i] && pt != FSO_TIER_DEVICE);
        nvme = nvme || pt == FSO_TIER_NVME;
        gathered = gathered || !fso_fp_lends_in_place(&p->rules, (fso_tier)pt);
    }
    char pf[48] = "";
    if (nvme)
        snprintf(pf, sizeof pf, "; prefetch %d", p->pl.prefetch);
    const char *mv = p->machine.devices < 2 ? ""
                     : wc                   ? "; whole-block copies"
                     : gathered             ? "; gather"
                                            : "; lent in place";
    if (strcmp(b, c) == 0 && strcmp(c, d) == 0)
        snprintf(buf, len, "parameters %s; master, m, v %s; gradients %s%s%s", a, b, g, pf, mv);
    else
        snprintf(buf, len, "parameters %s; master %s; m %s; v %s; gradients %s%s%s", a, b, c, d, g,
                 pf, mv);
}

/* ------------------------------------------------------------------ reasons */

static void reason_text(const fso_plan *p, int k, char *buf, size_t len)
{
    static const char *const where[FSO_N_TIERS] = {"on the devices", "on the host", "on NVMe"};
    static const char *const memory[FSO_N_TIERS] = {"device memory", "host memory", "NVMe"};
    const fso_plan_reason *r = &p->why[k];
    char h[32], lead[96] = "";
    size_t off = 0;
    if (r->split) /* the blocks on the fastest tier, and why not all of them */
        off = (size_t)snprintf(lead, sizeof lead, "%d of %d blocks %s; all %d there, ",
                               r->split, p->pl.n_blocks, where[r->alt_tier], p->pl.n_blocks);
    if (r->pinned)
        snprintf(buf, len, "pinned by the configuration");
    else if (r->alt_tier < 0)
        snprintf(buf, len, "fits");
    else if (!r->alt_fits && r->short_tier >= 0) {
        fso_human_bytes(h, sizeof h, (double)r->short_bytes);
        snprintf(buf, len, "%s%s%s would be short by %s", off ? lead : where[r->alt_tier],
                 off ? "" : ", ", memory[r->short_tier], h);
    } else if (r->alt_step_ms > p->step_ms * 1.005)
        snprintf(buf, len, "%s%s%.1f%% slower", off ? lead : where[r->alt_tier], off ? "" : ", ",
                 100 * (r->alt_step_ms / p->step_ms - 1));
    else
        snprintf(buf, len, "%s%s", off ? lead : where[r->alt_tier],
                 off ? "no faster" : ", no faster");
    /* optimizer state whose first blocks took the host memory left */
    const int hb = fso_plan_state_host_blocks(p, k);
    off = strlen(buf);
    if (hb == 1)
        snprintf(buf + off, len - off, "; block 0 in the host memory left");
    else if (hb > 1)
        snprintf(buf + off, len - off, "; blocks 0-%d in the host memory left", hb - 1);
}

/* The tiers kind k's blocks sit on: "host", or "device + host" when split. */
static void reason_tiers(const fso_plan *p, int k, char *buf, size_t len)
{
    int count[FSO_N_TIERS] = {0};
    size_t off = 0;
    buf[0] = 0;
    if (!p->why[k].split) {
        snprintf(buf, len, "%s", fso_tier_name(p->why[k].tier));
        return;
    }
    for (int b = 0; b < p->pl.n_blocks; b++)
        count[p->pl.tier[k][b]]++;
    for (int t = 0; t < FSO_N_TIERS && off < len; t++)
        if (count[t])
            off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? " + " : "",
                                    fso_tier_name(t));
}

void fso_plan_why(const fso_plan *p, char *buf, size_t len)
{
    size_t off = 0;
    bool done[FSO_N_KINDS] = {false};
    buf[0] = 0;
    if (!p->explained)
        return;
    for (int k = 0; k < FSO_N_KINDS && off < len; k++) {
        if (done[k])
            continue;
        char rk[192], rj[192], tk[64], tj[64];
        reason_text(p, k, rk, sizeof rk);
        reason_tiers(p, k, tk, sizeof tk);
        off += (size_t)snprintf(buf + off, off < len ? len - off : 0, "%s%s", off ? "; " : "",
                                fso_kind_name(k));
        for (int j = k + 1; j < FSO_N_KINDS; j++) {
            reason_text(p, j, rj, sizeof rj);
            reason_tiers(p, j, tj, sizeof tj);
            if (strcmp(tj, tk) == 0 && strcmp(rj, rk) == 0) {
                done[j] = true;
                off += (size_t)snprintf(buf + off, off < len ? len - off : 0, ", %s",
                                        fso_kind_name(j));
            }
        }
        off += (size_t)snprintf(buf + off, off < len ? len - off : 0, " %s (%s)", tk, rk);
    }
    char ra[192];
    fso_plan_acts_why(p, ra, sizeof ra);
    if (ra[0] && off < len)
        snprintf(buf + off, len - off, "; activations %s (%s)", fso_tier_name(p->pl.acts), ra);
}

void fso_plan_acts_why(const fso_plan *p, char *buf, size_t len)
{
    static const char *const where[FSO_N_TIERS] = {"on the devices", "on the host", "on NVMe"};
    static const char *const memory[FSO_N_TIERS] = {"device memory", "host memory", "NVMe"};
    char h[32];
    buf[0] = 0;
    if (p->acts_pinned)
        snprintf(buf, len, "pinned by the configuration");
    else if (p->acts_alt < 0)
        return; /* no other tier offered (no checkpointing): nothing to say */
    else if (!p->acts_alt_fits && p->acts_short_tier >= 0) {
        fso_human_bytes(h, sizeof h, (double)p->acts_short_bytes);
        snprintf(buf, len, "%s, %s would be short by %s", where[p->acts_alt],
                 memory[p->acts_short_tier], h);
    } else if (p->acts_alt_fits && p->acts_alt_ms > p->step_ms * 1.005)
        snprintf(buf, len, "%s, %.1f%% slower", where[p->acts_alt],
                 100 * (p->acts_alt_ms / p->step_ms - 1));
    else
        snprintf(buf, len, "%s, no faster", where[p->acts_alt]);
}
