/* planner.c — capacities, the pipelined step timeline and the placement
 * search (planner.h). */
#include "planner.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JOIN FSO_N_STREAMS  /* a zero-length event on no stream: waits for its inputs */
#define SIM_STEPS 3         /* the prediction is the last step's length */

static const char *const stream_names[FSO_N_STREAMS] = {
    "nvme-read", "h2d", "collectives", "compute", "d2h", "nvme-write", "optimizer"};

const char *fso_stream_name(int stream)
{
    return stream >= 0 && stream < FSO_N_STREAMS ? stream_names[stream] : "?";
}


void fso_plan_pins_none(fso_plan_pins *p)
{
    for (int k = 0; k < FSO_N_KINDS; k++)
        p->tier[k] = -1;
    p->prefetch = -1;
}

void fso_placement_uniform(fso_placement *pl, int n_blocks, int param_tier, int state_tier,
                           int grad_tier, int prefetch)
{
    memset(pl, 0, sizeof *pl);
    pl->n_blocks = n_blocks;
    pl->prefetch = prefetch;
    for (int b = 0; b < n_blocks && b < FSO_PLAN_MAX_BLOCKS; b++) {
        pl->tier[FSO_KIND_PARAM][b] = (uint8_t)param_tier;
        pl->tier[FSO_KIND_MASTER][b] = pl->tier[FSO_KIND_M][b] = pl->tier[FSO_KIND_V][b] =
            (uint8_t)state_tier;
        pl->tier[FSO_KIND_GRAD][b] = (uint8_t)grad_tier;
    }
}

/* ------------------------------------------------------------------ sizes */

/* The engine's footprint rules on this machine's devices. */
static fso_fp_rules rules_of(const fso_plan_input *in)
{
    fso_fp_rules r = in->engine.rules;
    r.world = in->machine.devices;
    return r;
}

static int kind_bytes_per_elem(const fso_plan_input *in, int k)
{
    return (int)fso_dtype_size(in->engine.rules.dtype[k]);
}

/* Bytes of one shard of kind k of block b, as the engine allocates it. */
static uint64_t shard_bytes(const fso_plan_input *in, int b, int k)
{
    const fso_fp_rules r = rules_of(in);
    return fso_fp_shard_bytes(&r, in->model.block_elems[b], (fso_kind)k);
}

static uint64_t shard_elems(const fso_plan_input *in, int b)
{
    uint64_t w = (uint64_t)in->machine.devices;
    return (in->model.block_elems[b] + w - 1) / w;
}

/* Block b is lent where its parameters live: no copy in, no gather. */
static bool aliased(const fso_plan_input *in, const fso_placement *pl, int b)
{
    const fso_fp_rules r = rules_of(in);
    return fso_fp_lends_in_place(&r, (fso_tier)pl->tier[FSO_KIND_PARAM][b]);
}

static fso_tier placement_tier(const void *ctx, int b, fso_kind k)
{
    const fso_placement *pl = ctx;
    return (fso_tier)pl->tier[k][b];
}

/* Fills the memory fields of out, as the engine allocates for the
 * placement (footprint.h); returns true when everything fits. */
static bool size_placement(const fso_plan_input *in, const fso_placement *pl, fso_plan *out)
{
    const fso_plan_model *m = &in->model;
    const fso_plan_machine *mc = &in->machine;
    const uint64_t W = (uint64_t)mc->devices;
    const fso_fp_rules r = rules_of(in);
    const fso_fp_layout l = {.n_blocks = m->n_blocks, .padded_elems = m->block_elems,
                             .tier = placement_tier, .ctx = pl, .prefetch = pl->prefetch};
    fso_fp_need fp;
    fso_fp_need_for(&r, &l, &fp);
    memcpy(out->kind_bytes, fp.kind_bytes, sizeof out->kind_bytes);
    out->activation_bytes = m->activation_bytes;
    out->buffer_bytes[FSO_TIER_DEVICE] = fp.device_buffers + in->engine.device_reserve_bytes;
    out->buffer_bytes[FSO_TIER_HOST] = fp.staging * W;
    out->buffer_bytes[FSO_TIER_NVME] = 0;

    out->have_bytes[FSO_TIER_DEVICE] = mc->device_mem_bytes;
    out->have_bytes[FSO_TIER_HOST] = mc->host_mem_bytes;
    out->have_bytes[FSO_TIER_NVME] = mc->nvme_free_bytes;
    out->short_tier = -1;
    out->short_bytes = 0;
    for (int t = 0; t < FSO_N_TIERS; t++) {
        uint64_t need = out->buffer_bytes[t] + (t == FSO_TIER_DEVICE ? m->activation_bytes : 0);
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

/* ------------------------------------------------------------------ timeline */

typedef struct ev {
    double start, end;
    int crit;          /* the event whose end decided the start, or -1 */
    int stream;        /* fso_stream, or JOIN */
    int block;         /* for traces */
    const char *what;
} ev;

/* A stream's busy time: disjoint spans in time order, each remembering the
 * event that ends it. */
typedef struct span {
    double s, e;
    int last;
} span;

typedef struct lane {
    span *v;
    int n, cap;
} lane;

typedef struct tl {
    ev *e;
    int n, cap;
    lane lanes[FSO_N_STREAMS]; /* per physical stream */
    int last[FSO_N_STREAMS];   /* the last event added on each logical stream */
    bool shared;               /* CPU devices: everything but NVMe on one lane */
    double floor;              /* nothing starts before (a barrier) */
    int floor_ev;
    double lat[FSO_N_STREAMS]; /* per event: completion this much after the stream frees up */
    const char *what;          /* label of the events being added */
    int block;
    int oom;
} tl;

#define LABEL(t, w, b)                                                                     \
    do {                                                                                   \
        (t)->what = (w);                                                                   \
        (t)->block = (b);                                                                  \
    } while (0)

/* The lane an event of stream s occupies. Reads and writes of the NVMe
 * folders share one: a drive does one thing at a time, and a mix of reads
 * and writes moves each at its own rate only in its share of the time. */
static int phys(const tl *t, int s)
{
    if (s == JOIN)
        return -1;
    if (s == FSO_STREAM_NVME_WRITE)
        return FSO_STREAM_NVME_READ;
    if (t->shared && s != FSO_STREAM_NVME_READ)
        return FSO_STREAM_COMPUTE;
    return s;
}

/* The earliest start >= ready at which the lane is free for dur; occupies
 * it. *blocker: the event whose end the start waited for, or -1. */
static int lane_place(lane *L, double ready, double dur, double *start, int *blocker, int id)
{
    *blocker = -1;
    if (dur <= 0) {
        *start = ready;
        return 0;
    }
    /* first span ending after ready (ends increase: spans are disjoint) */
    int lo = 0, hi = L->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (L->v[mid].e > ready)
            hi = mid;
        else
            lo = mid + 1;
    }
    double c = ready;
    int i = lo;
    for (; i < L->n; i++) {
        if (L->v[i].s >= c + dur)
            break;
        if (L->v[i].e > c) {
            c = L->v[i].e;
            *blocker = L->v[i].last;
        }
    }
    *start = c;
    const double eps = 1e-9;
    bool join_prev = i > 0 && fabs(L->v[i - 1].e - c) <= eps;
    bool join_next = i < L->n && fabs(L->v[i].s - (c + dur)) <= eps;
    if (join_prev && join_next) {
        L->v[i - 1].e = L->v[i].e;
        L->v[i - 1].last = L->v[i].last;
        memmove(&L->v[i], &L->v[i + 1], sizeof(span) * (size_t)(L->n - i - 1));
        L->n--;
    } else if (join_prev) {
        L->v[i - 1].e = c + dur;
        L->v[i - 1].last = id;
    } else if (join_next) {
        L->v[i].s = c;
    } else {
        if (L->n == L->cap) {
            int cap = L->cap ? 2 * L->cap : 64;
            span *v = realloc(L->v, sizeof *v * (size_t)cap);
            if (!v)
                return -ENOMEM;
            L->v = v;
            L->cap = cap;
        }
        memmove(&L->v[i + 1], &L->v[i], sizeof(span) * (size_t)(L->n - i));
        L->v[i] = (span){c, c + dur, id};
        L->n++;
    }
    return 0;
}

/* Add an event of `dur` ms on `stream` after the events in deps (-1: none),
 * at the earliest time its stream is free that long. */
static int tl_add(tl *t, int stream, double dur, const int *deps, int ndeps)
{
    if (t->oom)
        return -1;
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 1024;
        ev *e = realloc(t->e, sizeof *e * (size_t)cap);
        if (!e) {
            t->oom = 1;
            return -1;
        }
        t->e = e;
        t->cap = cap;
    }
    double ready = t->floor;
    int crit = t->floor_ev;
    for (int i = 0; i < ndeps; i++)
        if (deps[i] >= 0 && t->e[deps[i]].end > ready) {
            ready = t->e[deps[i]].end;
            crit = deps[i];
        }
    double start = ready;
    int p = phys(t, stream), blocker = -1;
    if (p >= 0 && lane_place(&t->lanes[p], ready, dur, &start, &blocker, t->n) < 0) {
        t->oom = 1;
        return -1;
    }
    if (blocker >= 0)
        crit = blocker;
    ev *x = &t->e[t->n];
    x->start = start;
    x->end = start + (dur > 0 ? dur : 0) + (p >= 0 && dur > 0 ? t->lat[stream] : 0);
    x->crit = crit;
    x->stream = stream;
    x->what = t->what;
    x->block = t->block;
    if (stream != JOIN)
        t->last[stream] = t->n;
    return t->n++;
}

#define ADD(t, stream, dur, ...)                                                          \
    tl_add((t), (stream), (dur), (const int[]){__VA_ARGS__},                               \
           (int)(sizeof((const int[]){__VA_ARGS__}) / sizeof(int)))

static double ms_for(double bytes, double gbps)
{
    return gbps > 0 ? bytes / (gbps * 1e6) : (bytes > 0 ? INFINITY : 0);
}

/* What a step needs to remember of the previous one. */
typedef struct carry {
    int *upd;        /* (n_blocks) block b's parameters are updated (at their tier) */
    int *gread;      /* (n_blocks) the optimizer has read block b's gradients */
    int *wr;         /* (n_blocks) the optimizer's writes of block b are done */
    bool *opt_done;  /* (n_blocks) the previous step's update of b is laid out */
} carry;

typedef struct sim {
    const fso_plan_input *in;
    const fso_placement *pl;
    tl t;
    carry c;
    int *grad_done;  /* (n_blocks) last micro-batch: block b's gradients are on their tier */
    int *anchor;     /* (n_visits) where the device took the pv-th parameter visit's block */
    int *comp;       /* (n_visits) compute of the pv-th parameter visit */
    int last_opt;    /* the last optimizer event laid out */
    int dev;         /* the device thread's last event (CPU devices: program order) */
    int comp_last;   /* the last compute event (the next one needs its output) */
    int nb;
} sim;

static double per_rank(double gbps, int W)
{
    return gbps / (double)W;
}

/* The dependency that keeps the device thread's events in program order
 * (CPU devices run copies, collectives and compute on one thread each). */
static int dev_dep(const sim *s)
{
    return s->in->machine.cpu_devices ? s->dev : -1;
}

static int dev_add(sim *s, int e)
{
    if (s->in->machine.cpu_devices && e >= 0)
        s->dev = e;
    return e;
}

/* One block's update: reads, AdamW, writes. */
static void lay_optimizer(sim *s, int b, int trigger)
{
    const fso_plan_input *in = s->in;
    const fso_plan_machine *mc = &in->machine;
    const fso_placement *pl = s->pl;
    const int W = mc->devices;
    tl *t = &s->t;
    const double S = (double)shard_elems(in, b);
    /* the serialized schedule runs the update on the device's own thread */
    const bool own_thread = in->engine.overlap == FSO_OVERLAP_NONE;
    const int th = own_thread ? dev_dep(s) : -1;
    bool on_device = !mc->cpu_devices && mc->device_adam_gelems > 0;
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        if (pl->tier[k][b] != FSO_TIER_DEVICE)
            on_device = false;
    int prev2 = b >= 2 ? s->c.wr[b - 2] : -1; /* two buffer sets */
    /* opt_write_lag 1: a block's new parameters are written to NVMe before the
     * next block is updated (the forward may read them as soon as it is done) */
    int lag = in->engine.opt_write_lag == 1 && b >= 1 &&
                      pl->tier[FSO_KIND_PARAM][b - 1] == FSO_TIER_NVME
                  ? s->c.upd[b - 1] : -1;

    if (on_device) {
        LABEL(t, "adamw (device)", b);
        int a = ADD(t, FSO_STREAM_COMPUTE, S / (mc->device_adam_gelems * 1e6), trigger);
        s->c.upd[b] = s->c.gread[b] = s->c.wr[b] = a;
        if (pl->tier[FSO_KIND_PARAM][b] != FSO_TIER_DEVICE) { /* new working copy to its tier */
            double pb = S * kind_bytes_per_elem(in, FSO_KIND_PARAM);
            LABEL(t, "updated parameters out", b);
            int d = ADD(t, FSO_STREAM_D2H, ms_for(pb, mc->d2h_gbps), a);
            if (pl->tier[FSO_KIND_PARAM][b] == FSO_TIER_NVME)
                d = ADD(t, FSO_STREAM_NVME_WRITE, ms_for(pb, per_rank(mc->nvme_write_gbps, W)), d);
            s->c.upd[b] = s->c.wr[b] = d;
        }
        s->last_opt = s->c.wr[b];
        return;
    }
    double rd_nvme = 0, rd_dev = 0, wr_nvme = 0, wr_dev = 0;
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++) {
        double bytes = S * kind_bytes_per_elem(in, k);
        if (pl->tier[k][b] == FSO_TIER_NVME)
            rd_nvme += bytes;
        else if (pl->tier[k][b] == FSO_TIER_DEVICE && !mc->cpu_devices)
            rd_dev += bytes;
    }
    for (int k = FSO_KIND_PARAM; k < FSO_KIND_GRAD; k++) {
        double bytes = S * kind_bytes_per_elem(in, k);
        if (pl->tier[k][b] == FSO_TIER_NVME)
            wr_nvme += bytes;
        else if (pl->tier[k][b] == FSO_TIER_DEVICE && !mc->cpu_devices)
            wr_dev += bytes;
    }
    int r1 = -1, r2 = -1;
    LABEL(t, "optimizer state in", b);
    if (rd_nvme > 0)
        r1 = ADD(t, FSO_STREAM_NVME_READ, ms_for(rd_nvme, per_rank(mc->nvme_read_gbps, W)),
                 trigger, prev2);
    if (rd_dev > 0)
        r2 = ADD(t, FSO_STREAM_D2H, ms_for(rd_dev, mc->d2h_gbps), trigger, prev2);
    LABEL(t, "adamw", b);
    int a = ADD(t, FSO_STREAM_OPTIM, S / (per_rank(mc->adam_gelems, W) * 1e6), trigger, r1, r2,
                prev2, lag, th);
    if (own_thread)
        dev_add(s, a);
    LABEL(t, "optimizer state out", b);
    s->c.gread[b] = a;
    int w1 = -1, w2 = -1;
    if (wr_nvme > 0)
        w1 = ADD(t, FSO_STREAM_NVME_WRITE, ms_for(wr_nvme, per_rank(mc->nvme_write_gbps, W)), a);
    if (wr_dev > 0)
        w2 = ADD(t, FSO_STREAM_H2D, ms_for(wr_dev, mc->h2d_gbps), a);
    int pt = pl->tier[FSO_KIND_PARAM][b];
    s->c.upd[b] = pt == FSO_TIER_NVME ? w1 : (pt == FSO_TIER_DEVICE && w2 >= 0) ? w2 : a;
    s->c.wr[b] = (w1 >= 0 || w2 >= 0) ? ADD(t, JOIN, 0, w1, w2, a) : a;
    s->last_opt = s->c.wr[b];
}

/* Lay out the previous step's updates of blocks up to b (forward overlap). */
static void catch_up_optimizer(sim *s, int upto, int trigger)
{
    for (int b = 0; b <= upto && b < s->nb; b++)
        if (!s->c.opt_done[b]) {
            lay_optimizer(s, b, trigger);
            s->c.opt_done[b] = true;
        }
}

/* A visit's gradients, computed by event C: reduce-scattered, landed on
 * their tier (accumulated after the first micro-batch), their norm, and on
 * the backward schedule the block's update. Returns the event the next
 * compute waits for (the engine's synchronous gradient writes), or -1. */
static int lay_grads(sim *s, int step, int a, int b, int C, bool last_micro, int *prev_norm)
{
    const fso_plan_input *in = s->in;
    const fso_plan_machine *mc = &in->machine;
    const fso_plan_model *m = &in->model;
    const fso_plan_engine *en = &in->engine;
    const fso_placement *pl = s->pl;
    const int W = mc->devices;
    const double nvr = per_rank(mc->nvme_read_gbps, W), nvw = per_rank(mc->nvme_write_gbps, W);
    const bool cpu = mc->cpu_devices;
    const double S = (double)shard_elems(in, b), F = (double)m->block_elems[b];
    tl *t = &s->t;
    int sync_wait = -1;
    const int gt = pl->tier[FSO_KIND_GRAD][b];
    const double gb = S * kind_bytes_per_elem(in, FSO_KIND_GRAD);
    int land = C;
    if (step > 0 && a == 0 && en->overlap == FSO_OVERLAP_FORWARD &&
        !s->c.opt_done[b])
        catch_up_optimizer(s, b, *prev_norm);
    LABEL(t, "gradients out", b);
    if (W > 1)
        land = dev_add(s, ADD(t, FSO_STREAM_COLL,
                              ms_for(F * kind_bytes_per_elem(in, FSO_KIND_GRAD) * (W - 1) / W, mc->coll_gbps), C,
                              dev_dep(s)));
    int prev_read = step > 0 && a == 0 ? s->c.gread[b] : -1;
    if (cpu && gt != FSO_TIER_NVME) { /* reduced straight into its tier, later ones added */
        if (a > 0)
            land = dev_add(s, ADD(t, FSO_STREAM_COMPUTE, ms_for(3 * gb, mc->host_copy_gbps), land,
                                  prev_read, dev_dep(s)));
        else
            land = ADD(t, JOIN, 0, land, prev_read);
    } else if (gt == FSO_TIER_DEVICE) {
        land = ADD(t, JOIN, 0, land, prev_read);
    } else {
        land = dev_add(s, ADD(t, FSO_STREAM_D2H, ms_for(gb, mc->d2h_gbps), land,
                              prev_read, dev_dep(s)));
        if (a > 0) {
            int old = -1;
            if (gt == FSO_TIER_NVME)
                old = ADD(t, FSO_STREAM_NVME_READ, ms_for(gb, nvr), land);
            land = dev_add(s, ADD(t, cpu ? FSO_STREAM_COMPUTE : FSO_STREAM_OPTIM,
                                  ms_for(3 * gb, mc->host_copy_gbps), land, old,
                                  dev_dep(s)));
        }
        if (gt == FSO_TIER_NVME)
            land = ADD(t, FSO_STREAM_NVME_WRITE, ms_for(gb, nvw), land);
        if (en->sync_grad_writes) {
            sync_wait = land;
            if (cpu) /* the thread waits for the write */
                s->dev = dev_add(s, ADD(t, JOIN, 0, land, dev_dep(s)));
        }
    }
    if (last_micro && !en->norm_pass && cpu) /* the block's norm */
        land = dev_add(s, ADD(t, FSO_STREAM_COMPUTE, ms_for(gb, mc->host_copy_gbps), land,
                              dev_dep(s)));
    if (last_micro) {
        s->grad_done[b] = land;
        if (en->overlap == FSO_OVERLAP_BACKWARD) {
            lay_optimizer(s, b, land);
            s->c.opt_done[b] = true;
        }
    }
    return sync_wait;
}

/* The global norm once every block's gradients are in (an NVMe pass over
 * them where the engine takes one), then the optimizer as the schedule
 * lays it: returns the norm's event. */
static int lay_norm(sim *s, int sync_wait, int *prev_norm)
{
    const fso_plan_engine *en = &s->in->engine;
    const fso_plan_machine *mc = &s->in->machine;
    const fso_placement *pl = s->pl;
    tl *t = &s->t;

    /* the global norm */
    LABEL(t, "global norm", -1);
    int norm = ADD(t, JOIN, 0, s->comp_last, dev_dep(s), sync_wait);
    bool nvme_grads = false;
    for (int b = 0; b < s->nb; b++)
        if (pl->tier[FSO_KIND_GRAD][b] == FSO_TIER_NVME)
            nvme_grads = true;
    for (int b = 0; b < s->nb; b++) {
        const double gb = (double)shard_elems(s->in, b) * kind_bytes_per_elem(s->in, FSO_KIND_GRAD);
        int d = ADD(t, JOIN, 0, s->grad_done[b], norm);
        if (en->norm_pass && nvme_grads && pl->tier[FSO_KIND_GRAD][b] == FSO_TIER_NVME) {
            int r = ADD(t, FSO_STREAM_NVME_READ,
                        ms_for(gb, per_rank(mc->nvme_read_gbps, mc->devices)), d, dev_dep(s));
            d = dev_add(s, ADD(t, JOIN, 0, r, dev_dep(s)));
        } else if (en->norm_pass && mc->cpu_devices) {
            d = dev_add(s, ADD(t, FSO_STREAM_COMPUTE, ms_for(gb, mc->host_copy_gbps), d,
                               dev_dep(s)));
        }
        norm = ADD(t, JOIN, 0, norm, d);
    }
    if (mc->devices > 1)
        norm = ADD(t, JOIN, 0, norm); /* the all-reduce of a few numbers */
    norm = dev_add(s, norm);
    *prev_norm = norm;

    /* the optimizer */
    if (en->overlap == FSO_OVERLAP_BACKWARD) {
        /* laid out during backward; the next step waits for nothing more */
    } else {
        for (int b = 0; b < s->nb; b++)
            s->c.opt_done[b] = false;
        if (en->overlap == FSO_OVERLAP_NONE) {
            catch_up_optimizer(s, s->nb - 1, norm);
            int bar = ADD(t, JOIN, 0, s->last_opt, norm);
            for (int b = 0; b < s->nb; b++)
                bar = ADD(t, JOIN, 0, bar, s->c.wr[b]);
            t->floor = t->e[bar].end;
            t->floor_ev = bar;
        }
    }
    return norm;
}

/* One step; returns the event at which the global norm is known. */
static int lay_step(sim *s, int step, int *prev_norm)
{
    const fso_plan_input *in = s->in;
    const fso_plan_machine *mc = &in->machine;
    const fso_plan_model *m = &in->model;
    const fso_plan_engine *en = &in->engine;
    const fso_placement *pl = s->pl;
    const int W = mc->devices, G = FSO_FP_GATHER_BUFFERS;
    const double nvr = per_rank(mc->nvme_read_gbps, W);
    const bool cpu = mc->cpu_devices;
    tl *t = &s->t;
    const int V = m->n_visits;
    int sync_wait = -1;

    for (int a = 0; a < m->grad_accum; a++) {
        /* reads for a micro-batch start when the device reaches it */
        int micro_start = cpu ? s->dev : s->comp_last;
        int pv = 0; /* parameter visits so far in this micro-batch */
        const bool last_micro = a == m->grad_accum - 1;
        for (int k = 0; k < V; k++) {
            const fso_plan_visit *v = &m->visits[k];
            const int b = v->block;
            const double S = (double)shard_elems(in, b), F = (double)m->block_elems[b];
            int upd = -1;
            if (step > 0 && a == 0) {
                if (en->overlap == FSO_OVERLAP_FORWARD && !s->c.opt_done[b])
                    catch_up_optimizer(s, b, *prev_norm);
                upd = s->c.upd[b];
            }
            int H = -1, R = -1, Gt = -1, C;
            if (v->params) {
                const int pt = pl->tier[FSO_KIND_PARAM][b];
                const bool wc = pl->whole_copy[b] && W > 1 && pt != FSO_TIER_DEVICE;
                int gfree = pv >= G ? s->comp[pv - G] : -1;
                if (!aliased(in, pl, b)) {
                    LABEL(t, "parameters in", b);
                    if (pt == FSO_TIER_NVME) {
                        int issue = pv - pl->prefetch - 1 >= 0 ? s->anchor[pv - pl->prefetch - 1]
                                                                : micro_start;
                        R = ADD(t, FSO_STREAM_NVME_READ, ms_for(S * kind_bytes_per_elem(in, FSO_KIND_PARAM), nvr), issue,
                                upd);
                    }
                    if (pt != FSO_TIER_DEVICE || cpu) {
                        double bytes = (wc ? F : S) * kind_bytes_per_elem(in, FSO_KIND_PARAM);
                        H = dev_add(s, ADD(t, FSO_STREAM_H2D, ms_for(bytes, mc->h2d_gbps), R,
                                           gfree, upd, dev_dep(s)));
                    }
                    LABEL(t, "all-gather", b);
                    if (W > 1 && !wc)
                        Gt = dev_add(s, ADD(t, FSO_STREAM_COLL,
                                            ms_for(F * kind_bytes_per_elem(in, FSO_KIND_PARAM) * (W - 1) / W, mc->coll_gbps),
                                            H, gfree, upd, dev_dep(s)));
                }
                LABEL(t, v->grads ? "backward" : "forward", b);
                C = dev_add(s, ADD(t, FSO_STREAM_COMPUTE, v->flops / (mc->device_gflops * 1e6), Gt,
                                   H, R, upd, sync_wait, s->comp_last, dev_dep(s)));
                s->anchor[pv] = H >= 0 ? H : Gt >= 0 ? Gt : C;
                s->comp[pv] = C;
                pv++;
            } else {
                LABEL(t, v->grads ? "backward" : "forward", b);
                C = dev_add(s, ADD(t, FSO_STREAM_COMPUTE, v->flops / (mc->device_gflops * 1e6),
                                   sync_wait, upd, s->comp_last, dev_dep(s)));
            }
            s->comp_last = C;
            sync_wait = -1;
            if (!v->grads)
                continue;
            sync_wait = lay_grads(s, step, a, b, C, last_micro, prev_norm);
        }
    }

    return lay_norm(s, sync_wait, prev_norm);
}

/* Critical path of the window (from, to]: time by stream. */
static void attribute(const tl *t, int last, double from, double *crit_ms)
{
    for (int i = last; i >= 0; i = t->e[i].crit) {
        const ev *x = &t->e[i];
        if (x->end <= from)
            break;
        double s = x->start > from ? x->start : from;
        if (x->stream != JOIN)
            crit_ms[x->stream] += x->end - s;
    }
}

static int simulate(const fso_plan_input *in, const fso_placement *pl, fso_plan *out,
                    FILE *trace)
{
    const int nb = in->model.n_blocks, V = in->model.n_visits;
    sim s = {.in = in, .pl = pl, .nb = nb, .last_opt = -1, .dev = -1, .comp_last = -1};
    int rc = 0;
    s.t.shared = in->machine.cpu_devices;
    s.t.floor_ev = -1;
    s.t.lat[FSO_STREAM_NVME_READ] = in->machine.nvme_read_lat_ms;
    s.t.lat[FSO_STREAM_NVME_WRITE] = in->machine.nvme_write_lat_ms;
    for (int i = 0; i < FSO_N_STREAMS; i++)
        s.t.last[i] = -1;
    s.c.upd = malloc(sizeof(int) * (size_t)nb);
    s.c.gread = malloc(sizeof(int) * (size_t)nb);
    s.c.wr = malloc(sizeof(int) * (size_t)nb);
    s.c.opt_done = calloc((size_t)nb, sizeof(bool));
    s.grad_done = malloc(sizeof(int) * (size_t)nb);
    s.anchor = malloc(sizeof(int) * (size_t)(V + 1));
    s.comp = malloc(sizeof(int) * (size_t)(V + 1));
    if (!s.c.upd || !s.c.gread || !s.c.wr || !s.c.opt_done || !s.grad_done || !s.anchor ||
        !s.comp) {
        rc = -ENOMEM;
        goto out;
    }
    for (int b = 0; b < nb; b++)
        s.c.upd[b] = s.c.gread[b] = s.c.wr[b] = s.grad_done[b] = -1;

    int norm[SIM_STEPS], prev_norm = -1;
    for (int st = 0; st < SIM_STEPS && rc == 0; st++) {
        norm[st] = lay_step(&s, st, &prev_norm);
        if (s.t.oom)
            rc = -ENOMEM;
    }
    if (rc == 0) {
        /* updates of the last step still to lay out (forward overlap): not in the window */
        double from = s.t.e[norm[SIM_STEPS - 2]].end, to = s.t.e[norm[SIM_STEPS - 1]].end;
        out->step_ms = to - from;
        memset(out->busy_ms, 0, sizeof out->busy_ms);
        memset(out->critical_ms, 0, sizeof out->critical_ms);
        for (int i = 0; i < s.t.n; i++) {
            const ev *x = &s.t.e[i];
            if (x->stream == JOIN || x->end <= from || x->start >= to)
                continue;
            double a = x->start > from ? x->start : from, z = x->end < to ? x->end : to;
            out->busy_ms[x->stream] += z - a;
        }
        attribute(&s.t, norm[SIM_STEPS - 1], from, out->critical_ms);
        if (trace) {
            fprintf(trace, "# %10s %10s  %-11s %-24s %s\n", "start ms", "end ms", "stream", "what",
                    "block");
            for (int i = 0; i < s.t.n; i++) {
                const ev *x = &s.t.e[i];
                if (x->stream == JOIN || x->end <= from || x->start >= to || x->end == x->start)
                    continue;
                fprintf(trace, "  %10.3f %10.3f  %-11s %-24s %d\n", x->start - from, x->end - from,
                        fso_stream_name(x->stream), x->what ? x->what : "", x->block);
            }
        }
        int best = FSO_STREAM_COMPUTE;
        for (int i = 0; i < FSO_N_STREAMS; i++)
            if (out->critical_ms[i] > out->critical_ms[best] + 1e-9)
                best = i;
        out->bottleneck = (fso_stream)best;
        double dev_busy = out->busy_ms[FSO_STREAM_COMPUTE];
        if (in->machine.cpu_devices)
            dev_busy += out->busy_ms[FSO_STREAM_H2D] + out->busy_ms[FSO_STREAM_COLL] +
                        out->busy_ms[FSO_STREAM_D2H] + out->busy_ms[FSO_STREAM_OPTIM];
        out->stall_ms = out->step_ms > dev_busy ? out->step_ms - dev_busy : 0;
        out->tokens_per_s = out->step_ms > 0 ? in->model.tokens_per_step * 1e3 / out->step_ms : 0;
    }
out:
    free(s.t.e);
    for (int i = 0; i < FSO_N_STREAMS; i++)
        free(s.t.lanes[i].v);
    free(s.c.upd);
    free(s.c.gread);
    free(s.c.wr);
    free(s.c.opt_done);
    free(s.grad_done);
    free(s.anchor);
    free(s.comp);
    return rc;
}

static int check_input(const fso_plan_input *in)
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
    return 0;
}

int fso_plan_evaluate(const fso_plan_input *in, const fso_placement *pl, fso_plan *out)
{
    int rc = check_input(in);
    if (rc < 0)
        return rc;
    if (pl->n_blocks != in->model.n_blocks || pl->prefetch < 0 ||
        pl->prefetch > FSO_PLAN_MAX_PREFETCH)
        return -EINVAL;
    memset(out, 0, sizeof *out);
    out->pl = *pl;
    out->machine = in->machine;
    out->overlap = in->engine.overlap;
    out->rules = rules_of(in);
    out->grad_accum = in->model.grad_accum;
    out->tokens_per_step = in->model.tokens_per_step;
    for (int b = 0; b < in->model.n_blocks; b++)
        out->model_elems += in->model.block_elems[b];
    bool fits = size_placement(in, pl, out);
    if ((rc = simulate(in, pl, out, NULL)) < 0)
        return rc;
    out->evaluated = 1;
    return fits ? 0 : -ENOSPC;
}

int fso_plan_trace(const fso_plan_input *in, const fso_placement *pl, FILE *f)
{
    fso_plan *tmp = malloc(sizeof *tmp);
    int rc = tmp ? fso_plan_evaluate(in, pl, tmp) : -ENOMEM;
    if (rc == 0 || rc == -ENOSPC)
        rc = simulate(in, pl, tmp, f);
    free(tmp);
    return rc;
}

/* ------------------------------------------------------------------ search */

typedef struct cand {
    int param_tier;       /* tier of the parameter blocks not kept on the device (of every
                             block when !per_block_tiers); FSO_TIER_DEVICE: all on the device */
    int device_params;    /* parameter blocks kept on the device, in residency_order
                             (per-block mode) */
    int device_state;     /* blocks whose optimizer state and gradients stay on the device,
                             updated there (per-block mode; which ones: state_block) */
    bool device_state_from_first; /* device_state counts from block 0 up, else from the last
                             block down (state_block) */
    bool state_residency_first; /* fill_resident gives the device's room to device_state
                             before device_params */
    int host_state;       /* blocks from the first whose state kinds on NVMe stay on the host
                             (engine.state_host_blocks) */
    int state_tier[3];    /* master, m, v tiers */
    int grad_tier;        /* gradient tier */
    bool whole_copy;      /* blocks copied whole to every device instead of gathered */
    int prefetch;         /* visits read ahead of compute */
    double step_ms;       /* the predicted step (candidates that fit) */
    int tier_sum;         /* the tiers chosen, summed: lower is higher tiers (tie-break) */
    int prefetch_key;     /* the prefetch depth where it matters (parameters on NVMe), else 0 */
} cand;

/* Blocks in the order they are worth keeping on the device: those with the
 * least compute to hide their copies behind first, then the rest spread
 * evenly over the schedule so the stream gets slack at regular intervals. */
static void residency_order(const fso_plan_input *in, int *order)
{
    const fso_plan_model *m = &in->model;
    const int nb = m->n_blocks;
    double *cost = calloc((size_t)nb, sizeof *cost);
    int n = 0;
    if (!cost) {
        for (int b = 0; b < nb; b++)
            order[b] = b;
        return;
    }
    for (int k = 0; k < m->n_visits; k++)
        cost[m->visits[k].block] += m->visits[k].flops;
    /* flops per parameter byte; the median marks "ordinary" blocks */
    double *ratio = malloc(sizeof(double) * (size_t)nb);
    bool *taken = calloc((size_t)nb, sizeof(bool));
    if (!ratio || !taken) {
        free(cost);
        free(ratio);
        free(taken);
        for (int b = 0; b < nb; b++)
            order[b] = b;
        return;
    }
    double med = 0;
    for (int b = 0; b < nb; b++)
        ratio[b] = cost[b] / ((double)m->block_elems[b] + 1);
    {
        double *tmp = malloc(sizeof(double) * (size_t)nb);
        if (tmp) {
            memcpy(tmp, ratio, sizeof(double) * (size_t)nb);
            for (int i = 1; i < nb; i++) /* insertion sort: n is small */
                for (int j = i; j > 0 && tmp[j - 1] > tmp[j]; j--) {
                    double x = tmp[j];
                    tmp[j] = tmp[j - 1];
                    tmp[j - 1] = x;
                }
            med = tmp[nb / 2];
            free(tmp);
        }
    }
    /* first: blocks well below the median, lowest ratio first */
    for (;;) {
        int pick = -1;
        for (int b = 0; b < nb; b++)
            if (!taken[b] && ratio[b] < 0.5 * med && (pick < 0 || ratio[b] < ratio[pick]))
                pick = b;
        if (pick < 0)
            break;
        taken[pick] = true;
        order[n++] = pick;
    }
    /* then the ordinary ones, spread: bit-reversed positions among them */
    int m2 = 0, rest[FSO_PLAN_MAX_BLOCKS];
    for (int b = 0; b < nb; b++)
        if (!taken[b] && ratio[b] <= 2 * med)
            rest[m2++] = b;
    int bits = 0;
    while ((1 << bits) < m2)
        bits++;
    for (int i = 0; i < (1 << bits); i++) {
        int r = 0;
        for (int j = 0; j < bits; j++)
            if (i & (1 << j))
                r |= 1 << (bits - 1 - j);
        if (r < m2) {
            taken[rest[r]] = true;
            order[n++] = rest[r];
        }
    }
    /* last: compute-heavy blocks, whose copies hide best */
    for (int b = 0; b < nb; b++)
        if (!taken[b])
            order[n++] = b;
    free(cost);
    free(ratio);
    free(taken);
}

/* The i-th block to keep its optimizer state on the device, from the last
 * block down (the CPU updates first what the next forward needs first) or
 * from block 0 up (the device's quick updates let the forward start at
 * once): the search tries both. */
static int state_block(const fso_plan_input *in, const cand *c, int i)
{
    return c->device_state_from_first ? i : in->model.n_blocks - 1 - i;
}

static void build_placement(const fso_plan_input *in, const cand *c, const int *order,
                            fso_placement *pl)
{
    const int nb = in->model.n_blocks;
    fso_placement_uniform(pl, nb, c->param_tier, c->state_tier[0], c->grad_tier, c->prefetch);
    for (int b = 0; b < nb; b++) {
        pl->tier[FSO_KIND_M][b] = (uint8_t)c->state_tier[1];
        pl->tier[FSO_KIND_V][b] = (uint8_t)c->state_tier[2];
        pl->whole_copy[b] = c->whole_copy;
    }
    for (int i = 0; i < c->device_params && i < nb; i++)
        pl->tier[FSO_KIND_PARAM][order[i]] = FSO_TIER_DEVICE;
    for (int i = 0; i < c->device_state && i < nb; i++)
        for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
            pl->tier[k][state_block(in, c, i)] = FSO_TIER_DEVICE;
    for (int b = 0; b < c->host_state && b < nb; b++)
        for (int i = 0; i < 3; i++)
            if (c->state_tier[i] == FSO_TIER_NVME)
                pl->tier[FSO_KIND_MASTER + i][b] = FSO_TIER_HOST;
}

/* engine.state_host_blocks: the host memory a placement leaves, filled
 * from block 0 up with the blocks' state kinds that are on NVMe, all but
 * the last block; none where a pin names the state's tier. */
static void fill_host_state(const fso_plan_input *in, cand *c, const int *order, fso_plan *tmp,
                            fso_placement *pl)
{
    const int nb = in->model.n_blocks;
    const uint64_t W = (uint64_t)in->machine.devices;
    c->host_state = 0;
    if (!in->engine.state_host_blocks ||
        (c->state_tier[0] != FSO_TIER_NVME && c->state_tier[1] != FSO_TIER_NVME &&
         c->state_tier[2] != FSO_TIER_NVME))
        return;
    for (int k = FSO_KIND_MASTER; k <= FSO_KIND_V; k++)
        if (in->pins.tier[k] >= 0)
            return;
    build_placement(in, c, order, pl);
    if (!size_placement(in, pl, tmp))
        return;
    uint64_t room = tmp->have_bytes[FSO_TIER_HOST] - tmp->need_bytes[FSO_TIER_HOST];
    while (c->host_state < nb - 1) {
        uint64_t add = 0;
        for (int i = 0; i < 3; i++)
            if (c->state_tier[i] == FSO_TIER_NVME)
                add += shard_bytes(in, c->host_state, FSO_KIND_MASTER + i) * W;
        if (add > room)
            break;
        room -= add;
        c->host_state++;
    }
}

static bool tier_ok(const fso_plan_input *in, int t)
{
    return t != FSO_TIER_NVME || in->machine.nvme_free_bytes > 0;
}

static bool pin_ok(const fso_plan_input *in, int k, int t)
{
    return in->pins.tier[k] < 0 || in->pins.tier[k] == t;
}

/* Per-block mode: fill the device memory left after the uniform choices
 * with parameter blocks (in residency order) and with blocks whose optimizer
 * state and gradients stay on the device (state_block order), one kind of
 * residency first (c->state_residency_first), then the other. */
static void fill_resident(const fso_plan_input *in, cand *c, const int *order, fso_plan *tmp,
                          fso_placement *pl)
{
    const int nb = in->model.n_blocks;
    const bool state_first = c->state_residency_first;
    const bool params_free =
        in->pins.tier[FSO_KIND_PARAM] < 0 && c->param_tier != FSO_TIER_DEVICE;
    bool state_free = c->state_tier[0] != FSO_TIER_DEVICE ||
                      c->state_tier[1] != FSO_TIER_DEVICE ||
                      c->state_tier[2] != FSO_TIER_DEVICE || c->grad_tier != FSO_TIER_DEVICE;
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        state_free = state_free && in->pins.tier[k] < 0;
    c->device_params = c->param_tier == FSO_TIER_DEVICE ? nb : 0;
    c->device_state = 0;
    if (!in->engine.per_block_tiers)
        return;
    build_placement(in, c, order, pl);
    size_placement(in, pl, tmp);
    int64_t room = (int64_t)tmp->have_bytes[FSO_TIER_DEVICE] - (int64_t)tmp->need_bytes[FSO_TIER_DEVICE];
    for (int pass = 0; pass < 2; pass++) {
        bool state = (pass == 0) == state_first;
        if (state && state_free) {
            while (c->device_state < nb) {
                int64_t add = 0;
                for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++) {
                    int t = k == FSO_KIND_GRAD ? c->grad_tier
                                               : c->state_tier[k - FSO_KIND_MASTER];
                    if (t != FSO_TIER_DEVICE)
                        add += (int64_t)shard_bytes(in, state_block(in, c, c->device_state), k);
                }
                if (add > room)
                    break;
                room -= add;
                c->device_state++;
            }
        } else if (!state && params_free) {
            while (c->device_params < nb) {
                int64_t add = (int64_t)shard_bytes(in, order[c->device_params], FSO_KIND_PARAM);
                if (add > room)
                    break;
                room -= add;
                c->device_params++;
            }
        }
    }
}

/* The choices a candidate is made of, outermost first: candidates come in
 * the order these would as nested loops, the innermost varying fastest
 * (among equals the tie-break keeps the first). */
enum {
    CHOICE_PARAM_TIER,  /* cand.param_tier */
    CHOICE_MASTER_TIER, /* cand.state_tier[0] */
    CHOICE_M_TIER,      /* cand.state_tier[1]: the master's tier or a slower one */
    CHOICE_V_TIER,      /* cand.state_tier[2]: m's tier or a slower one */
    CHOICE_GRAD_TIER,   /* cand.grad_tier */
    CHOICE_WHOLE_COPY,  /* cand.whole_copy: 0 gathers, 1 whole copies */
    CHOICE_PREFETCH,    /* cand.prefetch */
    CHOICE_FILL,        /* bit 0: cand.state_residency_first; bit 1:
                           cand.device_state_from_first */
    N_CHOICES,
};

/* Where the enumeration of candidates stands. */
typedef struct cand_iter {
    int at[N_CHOICES];    /* the value of each choice */
    int max_prefetch;     /* the deepest prefetch tried where the depth matters */
    int default_prefetch; /* the depth where it does not, or the pinned one */
    bool started;         /* at[] holds a candidate */
} cand_iter;

static void cand_iter_start(const fso_plan_input *in, cand_iter *it)
{
    memset(it, 0, sizeof *it);
    int max_pf = FSO_FP_MAX_PREFETCH < FSO_PLAN_MAX_PREFETCH ? FSO_FP_MAX_PREFETCH
                                                             : FSO_PLAN_MAX_PREFETCH;
    if (max_pf > 8)
        max_pf = 8; /* deeper rarely pays; a pin may still ask for more */
    it->max_prefetch = max_pf;
    it->default_prefetch = in->pins.prefetch >= 0 ? in->pins.prefetch : 2 <= max_pf ? 2 : max_pf;
}

/* The prefetch depth is searched only where it matters (parameters on
 * NVMe) and is not pinned. */
static bool prefetch_searched(const fso_plan_input *in, const cand_iter *it)
{
    return in->pins.prefetch < 0 && it->at[CHOICE_PARAM_TIER] == FSO_TIER_NVME;
}

/* The first and the last value of choice l, given the choices before it. */
static int choice_first(const fso_plan_input *in, const cand_iter *it, int l)
{
    switch (l) {
    case CHOICE_M_TIER:
        return it->at[CHOICE_MASTER_TIER];
    case CHOICE_V_TIER:
        return it->at[CHOICE_M_TIER];
    case CHOICE_PREFETCH:
        return prefetch_searched(in, it) ? 0 : it->default_prefetch;
    default:
        return 0;
    }
}

static int choice_last(const fso_plan_input *in, const cand_iter *it, int l)
{
    switch (l) {
    case CHOICE_WHOLE_COPY:
        return 1;
    case CHOICE_PREFETCH:
        return prefetch_searched(in, it) ? it->max_prefetch : it->default_prefetch;
    case CHOICE_FILL:
        return in->engine.per_block_tiers ? 3 : 0;
    default:
        return FSO_N_TIERS - 1;
    }
}

/* Whether the engine, the machine and the pins allow the choices. */
static bool choices_allowed(const fso_plan_input *in, const cand_iter *it)
{
    const int *at = it->at;
    const int pt = at[CHOICE_PARAM_TIER], g = at[CHOICE_GRAD_TIER];
    if (!tier_ok(in, pt) || !pin_ok(in, FSO_KIND_PARAM, pt))
        return false;
    /* without per-kind tiers, one tier for master, m, v and gradients */
    if (!in->engine.per_kind_tiers &&
        (at[CHOICE_M_TIER] != at[CHOICE_MASTER_TIER] ||
         at[CHOICE_V_TIER] != at[CHOICE_MASTER_TIER] || g != at[CHOICE_MASTER_TIER]))
        return false;
    if (!tier_ok(in, g) || !pin_ok(in, FSO_KIND_GRAD, g))
        return false;
    for (int i = 0; i < 3; i++)
        if (!tier_ok(in, at[CHOICE_MASTER_TIER + i]) ||
            !pin_ok(in, FSO_KIND_MASTER + i, at[CHOICE_MASTER_TIER + i]))
            return false;
    return !at[CHOICE_WHOLE_COPY] || (in->engine.whole_copy && in->machine.devices > 1 &&
                                      pt != FSO_TIER_DEVICE);
}

/* Steps it to the next allowed choices and fills c with them (residency
 * not yet filled: fill_resident, fill_host_state). false when none is
 * left. */
static bool next_candidate(const fso_plan_input *in, cand_iter *it, cand *c)
{
    do {
        int l = 0;
        if (it->started) {
            for (l = N_CHOICES - 1; l >= 0 && it->at[l] >= choice_last(in, it, l); l--)
                ;
            if (l < 0)
                return false;
            it->at[l++]++;
        }
        it->started = true;
        for (; l < N_CHOICES; l++)
            it->at[l] = choice_first(in, it, l);
    } while (!choices_allowed(in, it));
    const int *at = it->at;
    *c = (cand){.param_tier = at[CHOICE_PARAM_TIER],
                .state_tier = {at[CHOICE_MASTER_TIER], at[CHOICE_M_TIER], at[CHOICE_V_TIER]},
                .grad_tier = at[CHOICE_GRAD_TIER],
                .whole_copy = at[CHOICE_WHOLE_COPY] != 0,
                .prefetch = at[CHOICE_PREFETCH],
                .state_residency_first = (at[CHOICE_FILL] & 1) != 0,
                .device_state_from_first = at[CHOICE_FILL] >= 2};
    c->tier_sum = c->param_tier + c->state_tier[0] + c->state_tier[1] + c->state_tier[2] +
                  c->grad_tier;
    c->prefetch_key = c->param_tier == FSO_TIER_NVME ? c->prefetch : 0;
    return true;
}

/* What the search keeps while it runs. */
typedef struct plan_search {
    const fso_plan_input *in;
    int *order;             /* (n_blocks) residency_order */
    fso_plan *tmp;          /* sizes and prediction of the candidate at hand */
    fso_placement *pl;      /* the candidate at hand */
    cand *fit;              /* the candidates that fit, in enumeration order */
    size_t n_fit, cap_fit;
    cand closest;           /* of those that do not fit, the first least short */
    uint64_t closest_short; /* its shortfall; UINT64_MAX: none seen */
    int evaluated;          /* candidates predicted */
} plan_search;

/* Fills candidate c's residency, sizes it and, when it fits, predicts its
 * step and keeps it in sr->fit (else in sr->closest when closer to
 * fitting). 0, or an error. */
static int evaluate_candidate(plan_search *sr, cand c)
{
    const fso_plan_input *in = sr->in;
    fill_resident(in, &c, sr->order, sr->tmp, sr->pl);
    if (c.device_state_from_first && c.device_state == 0)
        return 0; /* the same as counting from the last block */
    fill_host_state(in, &c, sr->order, sr->tmp, sr->pl);
    build_placement(in, &c, sr->order, sr->pl);
    if (!size_placement(in, sr->pl, sr->tmp)) {
        if (sr->tmp->short_bytes < sr->closest_short) {
            sr->closest_short = sr->tmp->short_bytes;
            sr->closest = c;
        }
        return 0;
    }
    int rc = simulate(in, sr->pl, sr->tmp, NULL);
    if (rc < 0)
        return rc;
    sr->evaluated++;
    c.step_ms = sr->tmp->step_ms;
    if (sr->n_fit == sr->cap_fit) {
        cand *n2 = realloc(sr->fit, sizeof(cand) * sr->cap_fit * 2);
        if (!n2)
            return -ENOMEM;
        sr->fit = n2;
        sr->cap_fit *= 2;
    }
    sr->fit[sr->n_fit++] = c;
    return 0;
}

/* Of the ncand candidates that fit, the one to take: the least predicted
 * step; among those within 1% of it, the shallower prefetch, then the
 * higher tiers, then the faster; of equals the first. */
static size_t pick_candidate(const cand *cands, size_t ncand)
{
    double best = INFINITY;
    for (size_t i = 0; i < ncand; i++)
        if (cands[i].step_ms < best)
            best = cands[i].step_ms;
    size_t pick = 0;
    bool have = false;
    for (size_t i = 0; i < ncand; i++) {
        const cand *c = &cands[i];
        if (c->step_ms > best * 1.01 + 1e-9)
            continue;
        if (!have) {
            pick = i;
            have = true;
            continue;
        }
        const cand *p = &cands[pick];
        /* shallower prefetch, then higher tiers, then faster */
        if (c->prefetch_key < p->prefetch_key ||
            (c->prefetch_key == p->prefetch_key &&
             (c->tier_sum < p->tier_sum ||
              (c->tier_sum == p->tier_sum && c->step_ms < p->step_ms))))
            pick = i;
    }
    return pick;
}

/* No candidate fits: out is the one closest to fitting, or where the pins
 * left none, every kind on the host but pinned parameters. -ENOSPC, or an
 * error. */
static int choose_closest(const plan_search *sr, int default_prefetch, fso_plan *out)
{
    const fso_plan_input *in = sr->in;
    if (sr->closest_short == UINT64_MAX) { /* nothing even considered: pins exclude all */
        fso_placement_uniform(sr->pl, in->model.n_blocks, in->pins.tier[FSO_KIND_PARAM] >= 0
                                  ? in->pins.tier[FSO_KIND_PARAM] : FSO_TIER_HOST,
                              FSO_TIER_HOST, FSO_TIER_HOST, default_prefetch);
    } else {
        build_placement(in, &sr->closest, sr->order, sr->pl);
    }
    int rc = fso_plan_evaluate(in, sr->pl, out);
    if (rc == 0) /* cannot happen: it did not fit above */
        rc = -ENOSPC;
    out->evaluated = sr->evaluated;
    return rc;
}

int fso_plan_choose(const fso_plan_input *in, fso_plan *out)
{
    int rc = check_input(in);
    if (rc < 0)
        return rc;
    plan_search sr = {.in = in, .cap_fit = 256, .closest_short = UINT64_MAX};
    cand_iter it;
    cand c;
    sr.order = malloc(sizeof(int) * (size_t)in->model.n_blocks);
    sr.tmp = malloc(sizeof *sr.tmp);
    sr.pl = malloc(sizeof *sr.pl);
    sr.fit = malloc(sizeof(cand) * sr.cap_fit);
    if (!sr.order || !sr.tmp || !sr.pl || !sr.fit) {
        rc = -ENOMEM;
        goto out;
    }
    residency_order(in, sr.order);

    cand_iter_start(in, &it);
    while (next_candidate(in, &it, &c))
        if ((rc = evaluate_candidate(&sr, c)) < 0)
            goto out;
    if (sr.n_fit == 0) {
        rc = choose_closest(&sr, it.default_prefetch, out);
        goto out;
    }
    build_placement(in, &sr.fit[pick_candidate(sr.fit, sr.n_fit)], sr.order, sr.pl);
    rc = fso_plan_evaluate(in, sr.pl, out);
    out->evaluated = sr.evaluated;
    if (rc == 0)
        rc = fso_plan_explain(in, out);
out:
    free(sr.order);
    free(sr.tmp);
    free(sr.pl);
    free(sr.fit);
    return rc;
}

/* ------------------------------------------------------------------ re-planning */

/* Per block: a copy of in's visits in which each block's visits take the
 * compute time measured on them (what a visit costs differs between the
 * embedding, the layers and the head, and from what FLOPs alone say), and
 * the compute over the measured blocks as in predicted it (*pred_all) and
 * as measured (*meas_all). NULL (nothing to free) when meas has no time
 * for any block of in. */
static fso_plan_visit *measured_block_visits(const fso_plan_input *in,
                                             const fso_plan_measured *meas, double *pred_all,
                                             double *meas_all)
{
    const fso_plan_machine *mc = &in->machine;
    fso_plan_visit *visits = NULL;
    bool per_block = false;
    if (meas->block_compute_ms && meas->n_blocks == in->model.n_blocks &&
        (visits = malloc(sizeof *visits * (size_t)in->model.n_visits))) {
        memcpy(visits, in->model.visits, sizeof *visits * (size_t)in->model.n_visits);
        for (int b = 0; b < in->model.n_blocks; b++) {
            double pred = 0;
            for (int k = 0; k < in->model.n_visits; k++)
                if (visits[k].block == b)
                    pred += visits[k].flops / (mc->device_gflops * 1e6) * in->model.grad_accum;
            double got = meas->block_compute_ms[b];
            if (pred <= 0 || got <= 0)
                continue;
            for (int k = 0; k < in->model.n_visits; k++)
                if (visits[k].block == b)
                    visits[k].flops *= got / pred;
            *pred_all += pred;
            *meas_all += got;
            per_block = true;
        }
    }
    if (!per_block) {
        free(visits);
        visits = NULL;
    }
    return visits;
}

int fso_plan_replan(const fso_plan_input *in, const fso_plan *cur, const fso_plan_measured *meas,
                    fso_plan *out, fso_plan_machine *corrected, char *msg, size_t msglen)
{
    if (!meas || meas->step_ms <= 0 || cur->step_ms <= 0)
        return -EINVAL;
    double ratio = meas->step_ms / cur->step_ms;
    if (msglen)
        msg[0] = 0;
    if (fabs(ratio - 1.0) <= 0.20) {
        *out = *cur;
        if (corrected)
            *corrected = in->machine;
        return 0;
    }
    fso_plan_input x = *in;
    fso_plan_machine *mc = &x.machine;
    char what[256] = "";
    size_t wl = 0;
#define NOTE(...)                                                                          \
    do {                                                                                   \
        if (wl < sizeof what)                                                              \
            wl += (size_t)snprintf(what + wl, sizeof what - wl, __VA_ARGS__);              \
    } while (0)
    if (meas->nvme_read_gbps > 0 && cur->busy_ms[FSO_STREAM_NVME_READ] > 0) {
        NOTE("%sNVMe reads ran at %.2f GB/s (assumed %.2f)", wl ? "; " : "",
             meas->nvme_read_gbps, mc->nvme_read_gbps);
        mc->nvme_read_gbps = meas->nvme_read_gbps;
    }
    if (meas->nvme_write_gbps > 0 && cur->busy_ms[FSO_STREAM_NVME_WRITE] > 0) {
        NOTE("%sNVMe writes ran at %.2f GB/s (assumed %.2f)", wl ? "; " : "",
             meas->nvme_write_gbps, mc->nvme_write_gbps);
        mc->nvme_write_gbps = meas->nvme_write_gbps;
    }
    if (meas->optimizer_ms > 0 && cur->busy_ms[FSO_STREAM_OPTIM] > 0) {
        double f = cur->busy_ms[FSO_STREAM_OPTIM] / meas->optimizer_ms;
        if (fabs(f - 1) > 0.1) {
            NOTE("%sAdamW ran at %.2f Gelem/s (assumed %.2f)", wl ? "; " : "",
                 mc->adam_gelems * f, mc->adam_gelems);
            mc->adam_gelems *= f;
        }
    }
    double pred_all = 0, meas_all = 0;
    fso_plan_visit *visits = measured_block_visits(&x, meas, &pred_all, &meas_all);
    const bool per_block = visits != NULL;
    if (per_block) {
        x.model.visits = visits;
        if (fabs(meas_all / pred_all - 1) > 0.1)
            NOTE("%scompute took %.0f ms per step over the blocks (assumed %.0f)",
                 wl ? "; " : "", meas_all, pred_all);
    }
    if (!per_block && meas->compute_ms > 0 && cur->busy_ms[FSO_STREAM_COMPUTE] > 0) {
        double f = cur->busy_ms[FSO_STREAM_COMPUTE] / meas->compute_ms;
        if (fabs(f - 1) > 0.1) {
            NOTE("%scompute ran at %.0f GFLOP/s (assumed %.0f)", wl ? "; " : "",
                 mc->device_gflops * f, mc->device_gflops);
            mc->device_gflops *= f;
        }
    }
    /* What the named corrections do not explain: scale every rate alike. */
    fso_plan *tmp = malloc(sizeof *tmp);
    if (!tmp) {
        free(visits);
        return -ENOMEM;
    }
    int rc = fso_plan_evaluate(&x, &cur->pl, tmp);
    if (rc < 0 && rc != -ENOSPC) {
        free(tmp);
        free(visits);
        return rc;
    }
    double rest = meas->step_ms / tmp->step_ms;
    if (fabs(rest - 1) > 0.05) {
        NOTE("%sthe rest ran %.2fx %s than assumed", wl ? "; " : "", rest > 1 ? rest : 1 / rest,
             rest > 1 ? "slower" : "faster");
        mc->nvme_read_gbps /= rest;
        mc->nvme_write_gbps /= rest;
        mc->nvme_read_lat_ms *= rest;
        mc->nvme_write_lat_ms *= rest;
        mc->h2d_gbps /= rest;
        mc->d2h_gbps /= rest;
        mc->coll_gbps /= rest;
        mc->device_gflops /= rest;
        mc->adam_gelems /= rest;
        mc->device_adam_gelems /= rest;
        mc->host_copy_gbps /= rest;
    }
#undef NOTE
    free(tmp);
    rc = fso_plan_choose(&x, out);
    free(visits);
    if (rc < 0 && rc != -ENOSPC)
        return rc;
    if (corrected)
        *corrected = x.machine;
    char was[256], now[256];
    fso_plan_describe(cur, was, sizeof was);
    fso_plan_describe(out, now, sizeof now);
    snprintf(msg, msglen,
             "plan: measured %.0f ms/step, predicted %.0f ms (%+.0f%%): %s; re-planned: %s%s, "
             "predicted %.0f ms/step",
             meas->step_ms, cur->step_ms, (ratio - 1) * 100, what[0] ? what : "rates corrected",
             strcmp(was, now) == 0 ? "placement unchanged: " : "", now, out->step_ms);
    return 1;
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

int fso_plan_explain(const fso_plan_input *in, fso_plan *p)
{
    fso_placement *pl = malloc(sizeof *pl);
    fso_plan *alt = malloc(sizeof *alt);
    if (!pl || !alt) {
        free(pl);
        free(alt);
        return -ENOMEM;
    }
    for (int k = 0; k < FSO_N_KINDS; k++) {
        fso_plan_reason *r = &p->why[k];
        memset(r, 0, sizeof *r);
        r->tier = fso_plan_main_tier(p, k);
        r->pinned = in->pins.tier[k] >= 0 && in->pins.tier[k] == r->tier;
        r->alt_tier = r->tier - 1;
        r->short_tier = -1;
        if (r->pinned || r->alt_tier < 0)
            continue;
        *pl = p->pl;
        for (int b = 0; b < pl->n_blocks; b++)
            pl->tier[k][b] = (uint8_t)r->alt_tier;
        int rc = fso_plan_evaluate(in, pl, alt);
        if (rc < 0 && rc != -ENOSPC) {
            free(pl);
            free(alt);
            return rc;
        }
        r->alt_fits = rc == 0;
        r->short_tier = alt->short_tier;
        r->short_bytes = alt->short_bytes;
        r->alt_step_ms = alt->step_ms;
    }
    p->explained = true;
    free(pl);
    free(alt);
    return 0;
}

static void reason_text(const fso_plan *p, int k, char *buf, size_t len)
{
    static const char *const where[FSO_N_TIERS] = {"on the devices", "on the host", "on NVMe"};
    static const char *const memory[FSO_N_TIERS] = {"device memory", "host memory", "NVMe"};
    const fso_plan_reason *r = &p->why[k];
    char h[32];
    if (r->pinned)
        snprintf(buf, len, "pinned by the configuration");
    else if (r->alt_tier < 0)
        snprintf(buf, len, "fits");
    else if (!r->alt_fits && r->short_tier >= 0) {
        fso_human_bytes(h, sizeof h, (double)r->short_bytes);
        snprintf(buf, len, "%s, %s would be short by %s", where[r->alt_tier],
                 memory[r->short_tier], h);
    } else if (r->alt_step_ms > p->step_ms * 1.005)
        snprintf(buf, len, "%s, %.1f%% slower", where[r->alt_tier],
                 100 * (r->alt_step_ms / p->step_ms - 1));
    else
        snprintf(buf, len, "%s, no faster", where[r->alt_tier]);
    /* optimizer state whose first blocks took the host memory left */
    const int hb = fso_plan_state_host_blocks(p, k);
    const size_t off = strlen(buf);
    if (hb == 1)
        snprintf(buf + off, len - off, "; block 0 in the host memory left");
    else if (hb > 1)
        snprintf(buf + off, len - off, "; blocks 0-%d in the host memory left", hb - 1);
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
        char rk[160], rj[160];
        reason_text(p, k, rk, sizeof rk);
        off += (size_t)snprintf(buf + off, off < len ? len - off : 0, "%s%s", off ? "; " : "",
                                fso_kind_name(k));
        for (int j = k + 1; j < FSO_N_KINDS; j++) {
            reason_text(p, j, rj, sizeof rj);
            if (p->why[j].tier == p->why[k].tier && strcmp(rj, rk) == 0) {
                done[j] = true;
                off += (size_t)snprintf(buf + off, off < len ? len - off : 0, ", %s",
                                        fso_kind_name(j));
            }
        }
        off += (size_t)snprintf(buf + off, off < len ? len - off : 0, " %s (%s)",
                                fso_tier_name(p->why[k].tier), rk);
    }
}
