/* plan_batch.c — the batch split and where compute hides the optimizer
 * (plan.h fso_plan_batch_choose and its words).
 *
 * The global batch (sequences per optimizer step) is the user's
 * hyperparameter and never changes here. How it is split into micro-batches
 * per device and accumulation steps is the engine's business: a larger
 * micro-batch computes at a better rate and makes fewer parameter passes,
 * but needs more activation memory. Each split is planned by the planner's
 * own entry point (fso_plan_choose) from the inputs that split gives, so
 * whatever the planner learns to place (activations included) joins the
 * choice by itself. */
#include "plan.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe.h"
#include "util.h"

/* Whether the NVMe streams carry the optimizer's traffic alone: its state
 * there, and neither the parameters nor the gradients, whose reads and
 * writes come with every micro-batch. */
static bool nvme_is_optimizers(const fso_plan *p)
{
    bool state_nvme = false;
    for (int k = FSO_KIND_MASTER; k < FSO_KIND_GRAD; k++)
        state_nvme = state_nvme || fso_plan_main_tier(p, k) == FSO_TIER_NVME;
    return state_nvme && fso_plan_main_tier(p, FSO_KIND_PARAM) != FSO_TIER_NVME &&
           fso_plan_main_tier(p, FSO_KIND_GRAD) != FSO_TIER_NVME;
}

/* The optimizer's share of a plan's critical path: the CPU AdamW, and the
 * NVMe streams when they carry its traffic alone. */
static double optimizer_critical_ms(const fso_plan *p)
{
    double ms = p->critical_ms[FSO_STREAM_OPTIM];
    if (nvme_is_optimizers(p))
        ms += p->critical_ms[FSO_STREAM_NVME_READ] + p->critical_ms[FSO_STREAM_NVME_WRITE];
    return ms;
}

bool fso_plan_optimizer_bound(const fso_plan *p)
{
    if (p->bottleneck == FSO_STREAM_OPTIM)
        return true;
    return (p->bottleneck == FSO_STREAM_NVME_READ || p->bottleneck == FSO_STREAM_NVME_WRITE) &&
           nvme_is_optimizers(p);
}

bool fso_plan_optimizer_hidden(const fso_plan *p)
{
    return p->step_ms > 0 && optimizer_critical_ms(p) <= FSO_PLAN_HIDDEN_SHARE * p->step_ms;
}

/* The devices the global batch is spread over: every box's
 * (config.h fso_config_ranks). */
static int plan_ranks(const fso_plan_machine *m)
{
    return (m->devices > 0 ? m->devices : 1) * (m->boxes > 1 ? m->boxes : 1);
}

int fso_plan_ctx_for_split(const fso_plan_ctx *base, const fso_config *cfg, int micro,
                           int accum, fso_plan_ctx *out, char *err, size_t errlen)
{
    if (micro < 1 || accum < 1 || cfg->micro_batch < 1) {
        snprintf(err, errlen, "internal error: a split of %d x %d (micro-batch x accumulation)",
                 micro, accum);
        return -EINVAL;
    }
    fso_config *c = malloc(sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    *c = *cfg;
    c->micro_batch = micro;
    c->grad_accum = accum;
    const fso_plan_machine *m = &base->in.machine;
    int rc = fso_plan_ctx_init(out, c, m, !m->cpu_devices, err, errlen);
    if (rc < 0) {
        free(c);
        return rc;
    }
    out->in.machine = base->in.machine;
    out->probe_gflops = base->probe_gflops;
    out->in.pins = base->in.pins;
    char cerr[256];
    if (!base->calibrated || micro == cfg->micro_batch ||
        fso_plan_calibrate_cpu(out, c, false, cerr, sizeof cerr) < 0) {
        /* base's rate, every visit's compute scaled to the micro-batch: each
         * counts tokens, as calibration does */
        out->in.machine.device_gflops = base->in.machine.device_gflops;
        const double scale = (double)micro / cfg->micro_batch;
        for (int k = 0; k < out->in.model.n_visits && k < base->in.model.n_visits; k++)
            out->visits[k].flops = base->visits[k].flops * scale;
    }
    free(c);
    return 0;
}

/* The plan of one split; 0, -ENOSPC (nothing fits), or negative errno. */
static int plan_split(const fso_plan_ctx *base, const fso_config *cfg, int micro, int accum,
                      fso_plan *out, char *err, size_t errlen)
{
    fso_plan_ctx c;
    int rc = fso_plan_ctx_for_split(base, cfg, micro, accum, &c, err, errlen);
    if (rc < 0)
        return rc;
    rc = fso_plan_choose(&c.in, out);
    if (rc < 0 && rc != -ENOSPC)
        snprintf(err, errlen, "planner: %s", strerror(-rc));
    fso_plan_ctx_free(&c);
    return rc;
}

/* The same placement (p's) at accum accumulation steps of micro: 0 and
 * *out, -ENOSPC when it no longer fits, or negative errno. */
static int at_accum(fso_plan_ctx *c, const fso_placement *pl, int accum, fso_plan *out)
{
    const double seq = c->in.model.tokens_per_step / c->in.model.grad_accum; /* per micro-step */
    c->in.model.grad_accum = accum;
    c->in.model.tokens_per_step = seq * accum;
    return fso_plan_evaluate(&c->in, pl, out);
}

/* The smallest accumulation in [lo, cap] at which placement pl of c's
 * micro-batch hides the optimizer (pl's plan at lo: p): *found and *best,
 * or *found 0 for none; *last: the plan at the largest accumulation laid
 * out. 0 or negative errno. Doubling, then halving the gap: hiding grows with accumulation. */
static int accum_hiding(fso_plan_ctx *c, const fso_plan *p, int lo, int cap, fso_plan *q,
                        fso_plan *best, fso_plan *last, int *found)
{
    *found = 0;
    *last = *p;
    if (fso_plan_optimizer_hidden(p)) {
        *best = *p;
        *found = lo;
        return 0;
    }
    int hi = 0, rc = 0;
    for (int a = lo; a < cap && !hi;) {
        a = a > cap / 2 ? cap : a * 2;
        if ((rc = at_accum(c, &p->pl, a, q)) < 0)
            return rc == -ENOSPC ? 0 : rc;
        *last = *q;
        if (fso_plan_optimizer_hidden(q)) {
            hi = a;
            *best = *q;
        } else {
            lo = a;
        }
    }
    while (hi && hi - lo > 1) { /* the smallest hidden accumulation between */
        const int mid = lo + (hi - lo) / 2;
        if ((rc = at_accum(c, &p->pl, mid, q)) < 0)
            return rc == -ENOSPC ? 0 : rc;
        if (fso_plan_optimizer_hidden(q)) {
            hi = mid;
            *best = *q;
        } else {
            lo = mid;
        }
    }
    *found = hi;
    return 0;
}

/* The most accumulation searched at c's micro-batch: a timeline of
 * accum x visits events per step, as far as that stays quick to lay out. */
static int max_accum(const fso_plan_ctx *c)
{
    const int64_t visits = c->in.model.n_visits > 0 ? c->in.model.n_visits : 1;
    const int64_t most = FSO_PLAN_HIDE_MAX_VISITS / visits;
    return (int)(most < FSO_PLAN_HIDE_MAX_ACCUM ? most : FSO_PLAN_HIDE_MAX_ACCUM);
}

/* What keeps the optimizer exposed in plan q (the largest batch searched):
 * work that comes with every micro-batch grows with accumulation as compute
 * does, so only compute per micro-batch could cover it. */
static fso_plan_hide_stop stop_of(const fso_plan *q)
{
    bool nvme = false, host = false;
    for (int blk = 0; blk < q->pl.n_blocks; blk++) {
        nvme = nvme || q->pl.tier[FSO_KIND_GRAD][blk] == FSO_TIER_NVME;
        host = host || q->pl.tier[FSO_KIND_GRAD][blk] == FSO_TIER_HOST;
    }
    if (q->grad_accum > 1 && nvme)
        return FSO_PLAN_HIDE_STOP_GRAD_NVME;
    if (q->grad_accum > 1 && host && !q->machine.cpu_devices)
        return FSO_PLAN_HIDE_STOP_GRAD_HOST;
    return nvme_is_optimizers(q) ? FSO_PLAN_HIDE_STOP_NVME : FSO_PLAN_HIDE_STOP_ADAM;
}

/* Compute hides the optimizer in plan q, micro x accum x W: the advice. */
static void take_hide(fso_plan_batch *b, int micro, int accum, int W, const fso_plan *q)
{
    b->hide_batch = (int64_t)micro * accum * W;
    b->hide_micro = micro;
    b->hide_accum = accum;
    b->hide_acts_host = q->pl.acts == FSO_TIER_HOST;
    b->hide_step_ms = q->step_ms;
    b->hide_tokens_per_s = q->tokens_per_s;
    b->hide_optimizer_ms = optimizer_critical_ms(q);
}

/* The smallest global batch, at or above p's, at which compute hides the
 * optimizer: more accumulation of p's micro-batch (p's placement), and
 * larger micro-batches (each planned by fso_plan_choose, so that the
 * activations' tier joins the choice) until one no longer fits. Ties: the
 * smaller micro-batch. b->hide_*; hide_batch 0 when none. */
static int find_hide(const fso_plan_ctx *base, const fso_config *cfg, const fso_plan *p,
                     int micro, fso_plan_batch *b, char *err, size_t errlen)
{
    fso_plan_ctx c;
    fso_plan *q = malloc(sizeof *q), *best = malloc(sizeof *best), *at = malloc(sizeof *at),
             *last = malloc(sizeof *last);
    int rc = -ENOMEM;
    if (!q || !best || !at || !last) {
        snprintf(err, errlen, "out of memory");
        goto out_mem;
    }
    const int64_t per = (int64_t)micro * p->grad_accum; /* sequences per device */
    b->hide_batch = 0;
    b->hide_max_micro = micro;
    b->hide_no_fit_micro = 0;
    for (int64_t m = micro; m == micro || m <= FSO_PLAN_HIDE_MAX_MICRO; m *= 2) {
        const int64_t lo = m == micro ? p->grad_accum : (per + m - 1) / m;
        if ((rc = fso_plan_ctx_for_split(base, cfg, (int)m, (int)lo, &c, err, errlen)) < 0)
            goto out_mem;
        const int W = plan_ranks(&c.in.machine);
        if (b->hide_batch && m * lo * W >= b->hide_batch) {
            fso_plan_ctx_free(&c); /* no larger micro-batch needs fewer sequences */
            break;
        }
        if (m == micro) {
            *at = *p;
        } else if ((rc = fso_plan_choose(&c.in, at)) == -ENOSPC) {
            b->hide_no_fit_micro = (int)m;
            fso_plan_ctx_free(&c);
            break;
        } else if (rc < 0) {
            snprintf(err, errlen, "planner: %s", strerror(-rc));
            fso_plan_ctx_free(&c);
            goto out_mem;
        }
        /* no more sequences per device than the chosen micro-batch searched:
         * a timeline's events grow with them, and this runs at every plan */
        int64_t cap = max_accum(&c) * micro / m;
        if (m == micro)
            b->hide_max_accum = (int)(cap > lo ? cap : lo);
        if (b->hide_batch && (b->hide_batch - 1) / (m * W) < cap)
            cap = (b->hide_batch - 1) / (m * W); /* fewer sequences than the best so far */
        int found = 0;
        rc = accum_hiding(&c, at, (int)lo, (int)(cap > lo ? cap : lo), q, best, last, &found);
        fso_plan_ctx_free(&c);
        if (rc < 0) {
            snprintf(err, errlen, "planner: %s", strerror(-rc));
            goto out_mem;
        }
        b->hide_max_micro = (int)m;
        if (found)
            take_hide(b, (int)m, found, W, best);
        else if (!b->hide_batch)
            b->hide_stop = stop_of(last);
    }
    /* a micro-batch alone hides it: the smallest one between the last two
     * doublings that does at one accumulation step (hiding grows with the
     * micro-batch; the one below hid nothing at one step) */
    if (b->hide_batch && b->hide_micro > micro && b->hide_accum == 1) {
        int64_t lo = b->hide_micro / 2 > per ? b->hide_micro / 2 : per, hi = b->hide_micro;
        while (hi - lo > 1) {
            const int64_t mid = lo + (hi - lo) / 2;
            if ((rc = fso_plan_ctx_for_split(base, cfg, (int)mid, 1, &c, err, errlen)) < 0)
                goto out_mem;
            const int W = plan_ranks(&c.in.machine);
            rc = fso_plan_choose(&c.in, at);
            fso_plan_ctx_free(&c);
            if (rc < 0 && rc != -ENOSPC) {
                snprintf(err, errlen, "planner: %s", strerror(-rc));
                goto out_mem;
            }
            if (rc == 0 && fso_plan_optimizer_hidden(at)) {
                take_hide(b, (int)mid, 1, W, at);
                hi = mid;
            } else {
                lo = mid;
            }
        }
    }
    rc = 0;
out_mem:
    free(q);
    free(best);
    free(at);
    free(last);
    return rc;
}

int fso_plan_batch_choose(const fso_plan_ctx *ctx, const fso_config *cfg, fso_plan_batch *b,
                          char *err, size_t errlen)
{
    const int W = plan_ranks(&ctx->in.machine);
    const int64_t per = (int64_t)cfg->micro_batch * cfg->grad_accum; /* sequences per device */
    memset(b, 0, sizeof *b);
    b->devices = W;
    b->global_batch = per * W;
    b->user_micro = b->micro = cfg->micro_batch;
    b->user_accum = b->accum = cfg->grad_accum;
    b->user_step_ms = b->step_ms = -1;
    fso_plan *p = malloc(sizeof *p), *best = malloc(sizeof *best);
    if (!p || !best) {
        free(p);
        free(best);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int rc = 0;
    bool have = false;
    /* the user's split first: it keeps a tie; then every micro-batch that
     * divides the sequences per device, smallest first (the next in a tie) */
    for (int64_t i = 0; i <= per && b->splits < FSO_PLAN_BATCH_MAX_SPLITS; i++) {
        const int64_t micro = i == 0 ? cfg->micro_batch : i;
        if (micro < 1 || per % micro || (i > 0 && micro == cfg->micro_batch))
            continue;
        rc = plan_split(ctx, cfg, (int)micro, (int)(per / micro), p, err, errlen);
        if (rc < 0 && rc != -ENOSPC)
            goto out;
        b->splits++;
        if (rc == -ENOSPC)
            continue;
        b->splits_fit++;
        if (i == 0) {
            b->user_step_ms = p->step_ms;
            b->user_bound = fso_plan_optimizer_bound(p);
            b->user_optimizer_ms = optimizer_critical_ms(p);
        }
        if (!have || p->step_ms < best->step_ms * (1 - FSO_PLAN_BATCH_TIE)) {
            *best = *p;
            have = true;
            b->micro = (int)micro;
            b->accum = (int)(per / micro);
            b->step_ms = p->step_ms;
        }
    }
    rc = 0;
    if (!have) /* nothing fits at any split: the plan itself says why */
        goto out;
    b->optimizer_bound = fso_plan_optimizer_bound(best);
    b->optimizer_ms = optimizer_critical_ms(best);
    b->bottleneck = best->bottleneck;
    rc = find_hide(ctx, cfg, best, b->micro, b, err, errlen);
out:
    free(p);
    free(best);
    return rc;
}

bool fso_plan_batch_is_free(const fso_config *cfg, bool auto_batch, const char **why)
{
    static const char *const keys[2] = {"train_micro_batch_size_per_gpu",
                                        "gradient_accumulation_steps"};
    if (auto_batch) {
        *why = "--auto-batch";
        return true;
    }
    bool any_auto = false;
    for (int i = 0; i < 2; i++) {
        if (fso_config_pinned(cfg, keys[i])) {
            *why = NULL;
            return false;
        }
        any_auto = any_auto || fso_config_origin_of(cfg, keys[i]) == FSO_ORIGIN_AUTO;
    }
    *why = any_auto ? "\"auto\"" : NULL;
    return any_auto;
}

void fso_plan_batch_apply(const fso_plan_batch *b, fso_config *cfg)
{
    cfg->micro_batch = b->micro;
    cfg->grad_accum = b->accum;
    cfg->global_batch = b->global_batch; /* unchanged: the split's product */
}

void fso_plan_batch_split_words(const fso_plan_batch *b, const char *why, bool applied,
                                char *buf, size_t len)
{
    if (b->micro == b->user_micro) {
        snprintf(buf, len, "%s: micro-batch %d x accumulation %d kept, global batch %" PRId64
                           ": no other split of it is faster%s",
                 why, b->micro, b->accum, b->global_batch,
                 b->splits_fit < b->splits ? " among those that fit" : "");
        return;
    }
    char was[64] = "";
    if (b->user_step_ms >= 0)
        snprintf(was, sizeof was, ", was %.0f", b->user_step_ms);
    else
        snprintf(was, sizeof was, "; the configured split does not fit");
    snprintf(buf, len, "%s: micro-batch %d x accumulation %d (%s %d x %d), same global batch %"
                       PRId64 ": predicted %.0f ms/step%s",
             why, b->micro, b->accum, applied ? "was" : "configured", b->user_micro,
             b->user_accum, b->global_batch, b->step_ms, was);
}

void fso_plan_batch_hide_words(const fso_plan_batch *b, char *buf, size_t len)
{
    if (b->step_ms < 0) {
        snprintf(buf, len, "no split of the global batch fits");
        return;
    }
    char bound[160];
    snprintf(bound, sizeof bound, "global batch %" PRId64 " is %s (optimizer %.1f ms of the "
                                  "%.0f ms step on the critical path)",
             b->global_batch, b->optimizer_bound ? "optimizer-bound" : "not optimizer-bound",
             b->optimizer_ms, b->step_ms);
    if (b->hide_batch == b->global_batch)
        snprintf(buf, len, "the optimizer is hidden at global batch %" PRId64
                           " (optimizer %.1f ms of the %.0f ms step on the critical path)",
                 b->global_batch, b->hide_optimizer_ms, b->hide_step_ms);
    else if (b->hide_batch > 0)
        snprintf(buf, len, "%s; compute would hide it at a global batch of %" PRId64
                           " sequences/step (micro-batch %d x accumulation %d x %d device%s)%s: "
                           "%.0f ms/step, %.0f tok/s predicted (train_batch_size is yours to "
                           "change)",
                 bound, b->hide_batch, b->hide_micro, b->hide_accum, b->devices,
                 b->devices == 1 ? "" : "s",
                 b->hide_acts_host ? ", activations on the host" : "", b->hide_step_ms,
                 b->hide_tokens_per_s);
    else {
        static const char *const stops[] = {
            [FSO_PLAN_HIDE_STOP_ADAM] = "the CPU AdamW of a step outlasts the compute of every "
                                        "batch searched",
            [FSO_PLAN_HIDE_STOP_NVME] = "the optimizer state's NVMe reads and writes outlast the "
                                        "compute of every batch searched",
            [FSO_PLAN_HIDE_STOP_GRAD_HOST] = "the gradients are copied down and accumulated on "
                                             "the host each micro-batch, so more accumulation "
                                             "adds as much of that as of compute",
            [FSO_PLAN_HIDE_STOP_GRAD_NVME] = "the NVMe reads and writes of the gradients are per "
                                             "micro-batch, so more accumulation adds as much of "
                                             "them as of compute",
        };
        char micros[96] = "";
        if (b->hide_max_micro > b->micro)
            snprintf(micros, sizeof micros, ", nor at a larger micro-batch up to %d",
                     b->hide_max_micro);
        char fit[64] = "";
        if (b->hide_no_fit_micro)
            snprintf(fit, sizeof fit, " (micro-batch %d does not fit)", b->hide_no_fit_micro);
        snprintf(buf, len, "%s; compute would not hide it at any accumulation up to %d of "
                           "micro-batch %d%s%s: %s", bound, b->hide_max_accum, b->micro, micros,
                 fit, stops[b->hide_stop]);
    }
}

void fso_plan_batch_print(FILE *f, const fso_plan_batch *b, const char *why, bool applied)
{
    char line[768];
    if (why) {
        fso_plan_batch_split_words(b, why, applied, line, sizeof line);
        fprintf(f, "plan: %s\n", line);
    } else if (b->micro != b->user_micro) {
        fso_plan_batch_split_words(b, "batch split", false, line, sizeof line);
        fprintf(f, "plan: %s; --auto-batch takes it\n", line);
    }
    fso_plan_batch_hide_words(b, line, sizeof line);
    fprintf(f, "plan: batch: %s\n", line);
}

json_t *fso_plan_batch_json(const fso_plan_batch *b, bool applied)
{
    json_t *j = json_pack("{s:I, s:i, s:i, s:i, s:i, s:b, s:f, s:b, s:f, s:i, s:i}",
                          "global_batch", (json_int_t)b->global_batch, "micro_batch", b->micro,
                          "grad_accum", b->accum, "configured_micro_batch", b->user_micro,
                          "configured_grad_accum", b->user_accum, "applied", applied,
                          "step_ms", b->step_ms, "optimizer_bound", b->optimizer_bound,
                          "optimizer_critical_ms", b->optimizer_ms, "splits", b->splits,
                          "splits_fit", b->splits_fit);
    if (!j)
        return NULL;
    json_object_set_new(j, "configured_step_ms",
                        b->user_step_ms >= 0 ? json_real(b->user_step_ms) : json_null());
    if (b->hide_batch > 0) {
        json_object_set_new(j, "hide_global_batch", json_integer((json_int_t)b->hide_batch));
        json_object_set_new(j, "hide_micro_batch", json_integer(b->hide_micro));
        json_object_set_new(j, "hide_grad_accum", json_integer(b->hide_accum));
        json_object_set_new(j, "hide_activations",
                            json_string(b->hide_acts_host ? "host" : "device"));
        json_object_set_new(j, "hide_step_ms", json_real(b->hide_step_ms));
        json_object_set_new(j, "hide_tokens_per_s", json_real(b->hide_tokens_per_s));
    } else {
        json_object_set_new(j, "hide_global_batch", json_null());
    }
    return j;
}

int fso_plan_batch_for_config(const fso_config *cfg, const fso_plan_pins *pins,
                              const char *gpu_name, uint64_t gpu_free_bytes, fso_plan_batch *b,
                              char *err, size_t errlen)
{
    fso_plan_ctx ctx;
    int rc;
    if (!gpu_name) {
        rc = fso_plan_ctx_here(&ctx, cfg, err, errlen);
    } else { /* as fso_plan_for_config_gpus: the table's figures, this host's */
        fso_plan_machine m;
        if ((rc = fso_plan_machine_here(cfg, false, &m, err, errlen)) < 0)
            return rc;
        fso_plan_machine_gpu(&m, fso_gpu_spec_for_device(gpu_name, gpu_free_bytes));
        m.device_mem_bytes = cfg->device_mem_bytes ? cfg->device_mem_bytes : gpu_free_bytes;
        rc = fso_plan_ctx_init(&ctx, cfg, &m, true, err, errlen);
    }
    if (rc < 0)
        return rc;
    if (pins)
        ctx.in.pins = *pins;
    rc = fso_plan_batch_choose(&ctx, cfg, b, err, errlen);
    fso_plan_ctx_free(&ctx);
    return rc;
}

/* ------------------------------------------------------------------ "auto" keys */

/* The DeepSpeed keys that say how far ahead parameters are fetched: "auto"
 * leaves fsoff's prefetch depth (train.prefetch_blocks) to the planner. */
static const char *const prefetch_keys[] = {
    "train.prefetch_blocks",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_max_live_parameters",
    "zero_optimization.prefetch_bucket_size", /* the unprefixed spellings (config.h) */
    "zero_optimization.max_live_parameters",
};
#define N_PREFETCH_KEYS (sizeof prefetch_keys / sizeof prefetch_keys[0])

bool fso_plan_prefetch_auto(const fso_config *cfg)
{
    for (size_t i = 0; i < N_PREFETCH_KEYS; i++)
        if (fso_config_origin_of(cfg, prefetch_keys[i]) == FSO_ORIGIN_AUTO)
            return true;
    return false;
}

void fso_plan_auto_print(FILE *f, const fso_config *cfg, const fso_plan *p)
{
    for (size_t i = 0; i < N_PREFETCH_KEYS; i++)
        if (fso_config_origin_of(cfg, prefetch_keys[i]) == FSO_ORIGIN_AUTO)
            fprintf(f, "plan: auto: %s \"auto\" -> train.prefetch_blocks %d (the plan's "
                       "prefetch depth)\n", prefetch_keys[i], p->pl.prefetch);
}

int fso_plan_auto_aio(fso_config *cfg, char *line, size_t len)
{
    const bool bs = fso_config_origin_of(cfg, "aio.block_size") == FSO_ORIGIN_AUTO;
    const bool qd = fso_config_origin_of(cfg, "aio.queue_depth") == FSO_ORIGIN_AUTO;
    line[0] = '\0';
    if (!bs && !qd)
        return 0;
    char dirs[8192], missing[8192], path[4096], key[2048], e[256];
    fso_probe_tuned t;
    fso_plan_nvme_folders(cfg, dirs, sizeof dirs, missing, sizeof missing);
    bool tuned = false;
    if (dirs[0] && fso_probe_cache_path(path, sizeof path) == 0) {
        fso_probe_key(key, sizeof key, dirs);
        tuned = fso_probe_tuned_load(path, key, &t, e, sizeof e) == 0;
    }
    if (tuned) {
        if (bs)
            cfg->offload.aio_block_bytes = (int64_t)t.block_bytes;
        if (qd)
            cfg->offload.aio_queue_depth = t.queue_depth;
    }
    char h[32], took[96] = "";
    fso_human_bytes(h, sizeof h, (double)cfg->offload.aio_block_bytes);
    size_t off = 0;
    if (bs)
        off += (size_t)snprintf(took + off, sizeof took - off, "aio.block_size %s", h);
    if (qd)
        snprintf(took + off, sizeof took - off, "%saio.queue_depth %d", bs ? ", " : "",
                 cfg->offload.aio_queue_depth);
    snprintf(line, len, "auto: \"auto\" -> %s: %s", took,
             tuned     ? "what fsoff bench tune found for these folders"
             : dirs[0] ? "the defaults (fsoff bench tune has not measured these folders; run "
                         "it to tune them)"
                       : "the defaults (no NVMe folder)");
    return tuned ? 1 : 0;
}

int fso_plan_batch_measured(const fso_config *cfg, const fso_plan_pins *pins,
                            const fso_plan *plan, const fso_plan_measured *meas,
                            fso_plan_batch *b, char *err, size_t errlen)
{
    fso_plan_ctx ctx;
    int rc = fso_plan_ctx_init(&ctx, cfg, &plan->machine, !plan->machine.cpu_devices, err,
                               errlen);
    if (rc < 0)
        return rc;
    if (pins)
        ctx.in.pins = *pins;
    fso_plan *p = malloc(sizeof *p);
    if (!p) {
        fso_plan_ctx_free(&ctx);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    /* the running placement as these inputs predict it, against the steps */
    rc = fso_plan_evaluate(&ctx.in, &plan->pl, p);
    if (rc == 0 || rc == -ENOSPC) {
        fso_plan_machine *m = &ctx.in.machine;
        if (meas->optimizer_ms > 0 && p->busy_ms[FSO_STREAM_OPTIM] > 0)
            m->adam_gelems *= p->busy_ms[FSO_STREAM_OPTIM] / meas->optimizer_ms;
        if (meas->compute_ms > 0 && p->busy_ms[FSO_STREAM_COMPUTE] > 0)
            m->device_gflops *= p->busy_ms[FSO_STREAM_COMPUTE] / meas->compute_ms;
        rc = fso_plan_batch_choose(&ctx, cfg, b, err, errlen);
    } else {
        snprintf(err, errlen, "planner: %s", strerror(-rc));
    }
    free(p);
    fso_plan_ctx_free(&ctx);
    return rc;
}
