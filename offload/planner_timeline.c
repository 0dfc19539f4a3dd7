/* planner_timeline.c — one placement's step on the pipelined timeline
 * (planner.h): the streams and their names, events placed on the streams'
 * lanes, SIM_STEPS steps laid out as the engine runs them (parameters in,
 * compute, gradients out, the global norm, the optimizer where the
 * schedule puts it) and the prediction read off the last one.
 *
 * Contract: pl_simulate fills only a plan's prediction (step_ms,
 * tokens_per_s, busy_ms, critical_ms, bottleneck, stall_ms) and depends on
 * nothing but its inputs. A transfer carries a device's share of a block's
 * elements at its kind's element size; the memory a placement takes is
 * planner.c's (footprint.h).
 */
#include "planner_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JOIN FSO_N_STREAMS  /* a zero-length event on no stream: waits for its inputs */
#define SIM_STEPS 3         /* the prediction is the last step's length */

static const char *const stream_names[FSO_N_STREAMS] = {
    "nvme-read", "h2d", "collectives", "compute", "d2h", "nvme-write", "optimizer", "network"};

const char *fso_stream_name(int stream)
{
    return stream >= 0 && stream < FSO_N_STREAMS ? stream_names[stream] : "?";
}

/* ------------------------------------------------------------------ transfers */

/* A transfer of kind k moves a device's share of a block's elements
 * (shard_elems) at k's element size: bytes moved, not the whole pages a
 * shard takes in memory (pl_shard_bytes). */
static int kind_bytes_per_elem(const fso_plan_input *in, int k)
{
    return (int)fso_dtype_size(in->engine.rules.dtype[k]);
}

static uint64_t shard_elems(const fso_plan_input *in, int b)
{
    uint64_t w = (uint64_t)in->machine.devices;
    return (in->model.block_elems[b] + w - 1) / w;
}

/* Block b is lent where its parameters live: no copy in, no gather. */
static bool aliased(const fso_plan_input *in, const fso_placement *pl, int b)
{
    const fso_fp_rules r = pl_rules_of(in);
    return fso_fp_lends_in_place(&r, (fso_tier)pl->tier[FSO_KIND_PARAM][b]);
}

/* ------------------------------------------------------------------ timeline */

typedef struct ev {
    double start, end;
    int crit;          /* the event whose end decided the start, or -1 */
    int stream;        /* fso_stream, or JOIN */
    int block;         /* for traces */
    const char *what;
    double bytes;      /* NVMe writes: what the event writes (the drain bound) */
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
    double tax[FSO_N_STREAMS]; /* per ms of an event: ms of the cores' work it brings (NVMe) */
    int tax_stream;            /* where that work goes: the cores' lane */
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
    /* the network card moves bytes whatever the cores do */
    if (t->shared && s != FSO_STREAM_NVME_READ && s != FSO_STREAM_NET)
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
    x->bytes = 0;
    if (stream != JOIN)
        t->last[stream] = t->n;
    const int id = t->n++;
    /* an NVMe transfer's work on the host's cores (planner.h
     * nvme_*_cpu_s_per_gb), as the bytes land: it delays what the cores do next */
    if (stream != JOIN && dur > 0 && t->tax[stream] > 0) {
        const char *what = t->what;
        t->what = stream == FSO_STREAM_NVME_READ ? "nvme reads on the cores"
                                                 : "nvme writes on the cores";
        tl_add(t, t->tax_stream, dur * t->tax[stream], &id, 1);
        t->what = what;
    }
    return id;
}

#define ADD(t, stream, dur, ...)                                                          \
    tl_add((t), (stream), (dur), (const int[]){__VA_ARGS__},                               \
           (int)(sizeof((const int[]){__VA_ARGS__}) / sizeof(int)))

static double ms_for(double bytes, double gbps)
{
    return gbps > 0 ? bytes / (gbps * 1e6) : (bytes > 0 ? INFINITY : 0);
}

/* An NVMe write of `bytes` (a device's) after dep: at the rate writes
 * complete at, its bytes counted for the drain bound (pl_simulate). */
static int add_write(tl *t, double bytes, double gbps, int dep)
{
    int e = ADD(t, FSO_STREAM_NVME_WRITE, ms_for(bytes, gbps), dep);
    if (e >= 0)
        t->e[e].bytes = bytes;
    return e;
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
    /* the kept activations on the host (lay_acts_*): per input of the
     * micro-batch, the copy down and the compute that last read it */
    int *act_dn, *act_rd;
    int n_acts;
} sim;

static double per_rank(double gbps, int W)
{
    return gbps / (double)W;
}

/* Boxes the optimizer's state is sliced over (planner.h machine.boxes). */
static int boxes_of(const fso_plan_input *in)
{
    return in->machine.boxes > 1 ? in->machine.boxes : 1;
}

/* One device's rail: its share of the box's network, at the rate the
 * collectives reach (FSO_PLAN_NET_EFFICIENCY). */
static double rail_gbps(const fso_plan_input *in)
{
    return per_rank(in->machine.net_gbps * FSO_PLAN_NET_EFFICIENCY, in->machine.devices);
}

/* A ring over the boxes' rail sends (boxes - 1)/boxes of a device's shard
 * of block b, at bytes_per_elem (footprint.h net_bytes). */
static double rail_ms(const fso_plan_input *in, int b, double bytes_per_elem)
{
    const int B = boxes_of(in);
    return ms_for((double)shard_elems(in, b) * bytes_per_elem * (B - 1) / B, rail_gbps(in));
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

/* The kept layer inputs on the host (placement.acts, planner.h
 * fso_plan_model's act_*): a forward's compute waits for the copy down of
 * the input act_ring before the one it writes (their slot), and its own
 * input goes down after it; a backward reader's input comes up after the
 * compute that last read its slot, and the reader waits for it. Returns
 * what visit v's compute waits for, -1 nothing. */
static int lay_acts_before(sim *s, const fso_plan_visit *v)
{
    const fso_plan_model *m = &s->in->model;
    if (s->pl->acts != FSO_TIER_HOST || !m->act_kept_bytes)
        return -1;
    const int R = m->act_ring, l = v->act_write - 1, j = v->act_read - 1;
    if (l >= R && l - R < m->act_host_inputs && l < s->n_acts)
        return s->act_dn[l - R];
    if (j < 0 || j >= m->act_host_inputs || j + R >= s->n_acts)
        return -1;
    LABEL(&s->t, "activation in", v->block);
    return dev_add(s, ADD(&s->t, FSO_STREAM_H2D,
                          ms_for((double)m->act_kept_bytes, s->in->machine.h2d_gbps),
                          s->act_rd[j + R], dev_dep(s)));
}

/* After visit v's compute C: its input down, and C as the last reader of
 * the input it read. */
static void lay_acts_after(sim *s, const fso_plan_visit *v, int C)
{
    const fso_plan_model *m = &s->in->model;
    if (s->pl->acts != FSO_TIER_HOST || !m->act_kept_bytes)
        return;
    const int l = v->act_write - 1, j = v->act_read - 1;
    if (j >= 0 && j < s->n_acts)
        s->act_rd[j] = C;
    if (l < 0 || l >= m->act_host_inputs || l >= s->n_acts)
        return;
    LABEL(&s->t, "activation out", v->block);
    s->act_dn[l] = dev_add(s, ADD(&s->t, FSO_STREAM_D2H,
                                  ms_for((double)m->act_kept_bytes, s->in->machine.d2h_gbps), C,
                                  dev_dep(s)));
}

/* One block's update: reads, AdamW, writes. On several boxes this box
 * updates its slice (1/boxes) of every device's shard, reading and writing
 * that much of the optimizer's state, and the updated working parameters
 * are all-gathered over the rail before they are written to their tier
 * (the next use of the block waits for them, as for any update). */
static void lay_optimizer(sim *s, int b, int trigger)
{
    const fso_plan_input *in = s->in;
    const fso_plan_machine *mc = &in->machine;
    const fso_placement *pl = s->pl;
    const int W = mc->devices;
    tl *t = &s->t;
    const double S = (double)shard_elems(in, b);
    const int B = boxes_of(in);
    const double U = S / B; /* the elements this box updates */
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
        int a = ADD(t, FSO_STREAM_COMPUTE, U / (mc->device_adam_gelems * 1e6), trigger);
        s->c.upd[b] = s->c.gread[b] = s->c.wr[b] = a;
        if (B > 1) {
            LABEL(t, "parameters across boxes", b);
            a = ADD(t, FSO_STREAM_NET, rail_ms(in, b, kind_bytes_per_elem(in, FSO_KIND_PARAM)), a);
            s->c.upd[b] = s->c.wr[b] = a;
        }
        if (pl->tier[FSO_KIND_PARAM][b] != FSO_TIER_DEVICE) { /* new working copy to its tier */
            double pb = S * kind_bytes_per_elem(in, FSO_KIND_PARAM);
            LABEL(t, "updated parameters out", b);
            int d = ADD(t, FSO_STREAM_D2H, ms_for(pb, mc->d2h_gbps), a);
            if (pl->tier[FSO_KIND_PARAM][b] == FSO_TIER_NVME)
                d = add_write(t, pb, per_rank(mc->nvme_write_gbps, W), d);
            s->c.upd[b] = s->c.wr[b] = d;
        }
        s->last_opt = s->c.wr[b];
        return;
    }
    double rd_nvme = 0, rd_dev = 0, wr_nvme = 0, wr_dev = 0;
    double pw_nvme = 0, pw_dev = 0; /* several boxes: the parameters, after their gather */
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++) {
        double bytes = U * kind_bytes_per_elem(in, k);
        if (pl->tier[k][b] == FSO_TIER_NVME)
            rd_nvme += bytes;
        else if (pl->tier[k][b] == FSO_TIER_DEVICE && !mc->cpu_devices)
            rd_dev += bytes;
    }
    for (int k = FSO_KIND_PARAM; k < FSO_KIND_GRAD; k++) {
        /* the working parameters are whole shards on every box */
        double bytes = (k == FSO_KIND_PARAM ? S : U) * kind_bytes_per_elem(in, k);
        const bool gathered = B > 1 && k == FSO_KIND_PARAM;
        if (pl->tier[k][b] == FSO_TIER_NVME)
            *(gathered ? &pw_nvme : &wr_nvme) += bytes;
        else if (pl->tier[k][b] == FSO_TIER_DEVICE && !mc->cpu_devices)
            *(gathered ? &pw_dev : &wr_dev) += bytes;
    }
    int r1 = -1, r2 = -1;
    LABEL(t, "optimizer state in", b);
    if (rd_nvme > 0)
        r1 = ADD(t, FSO_STREAM_NVME_READ, ms_for(rd_nvme, per_rank(mc->nvme_read_gbps, W)),
                 trigger, prev2);
    if (rd_dev > 0)
        r2 = ADD(t, FSO_STREAM_D2H, ms_for(rd_dev, mc->d2h_gbps), trigger, prev2);
    LABEL(t, "adamw", b);
    int a = ADD(t, FSO_STREAM_OPTIM, U / (per_rank(mc->adam_gelems, W) * 1e6), trigger, r1, r2,
                prev2, lag, th);
    if (own_thread)
        dev_add(s, a);
    LABEL(t, "optimizer state out", b);
    s->c.gread[b] = a;
    int w1 = -1, w2 = -1;
    if (wr_nvme > 0)
        w1 = add_write(t, wr_nvme, per_rank(mc->nvme_write_gbps, W), a);
    if (wr_dev > 0)
        w2 = ADD(t, FSO_STREAM_H2D, ms_for(wr_dev, mc->h2d_gbps), a);
    int pt = pl->tier[FSO_KIND_PARAM][b];
    if (B > 1) {
        LABEL(t, "parameters across boxes", b);
        const int ag = ADD(t, FSO_STREAM_NET,
                           rail_ms(in, b, kind_bytes_per_elem(in, FSO_KIND_PARAM)), a);
        LABEL(t, "updated parameters out", b);
        const int p1 = pw_nvme > 0 ? add_write(t, pw_nvme, per_rank(mc->nvme_write_gbps, W), ag)
                                   : -1;
        const int p2 = pw_dev > 0 ? ADD(t, FSO_STREAM_H2D, ms_for(pw_dev, mc->h2d_gbps), ag) : -1;
        s->c.upd[b] = pt == FSO_TIER_NVME ? p1 : (pt == FSO_TIER_DEVICE && p2 >= 0) ? p2 : ag;
        s->c.wr[b] = ADD(t, JOIN, 0, w1, w2, p1, p2, a, ag);
        s->last_opt = s->c.wr[b];
        return;
    }
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
                              /* bf16 where bf16 gradients are sent (footprint.h) */
                              ms_for(F * (double)fso_fp_reduce_elem_bytes(&en->rules) * (W - 1) / W,
                                     mc->coll_gbps),
                              C,
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
            land = add_write(t, gb, nvw, land);
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
        /* several boxes: the update needs the gradients reduced across the
         * boxes first, which lay_norm lays out */
        if (en->overlap == FSO_OVERLAP_BACKWARD && boxes_of(in) == 1) {
            lay_optimizer(s, b, land);
            s->c.opt_done[b] = true;
        }
    }
    return sync_wait;
}

/* The global norm once every block's gradients are in (an NVMe pass over
 * them where the engine takes one), then the optimizer as the schedule
 * lays it: returns the norm's event. On several boxes each device's
 * gradient shards are first reduce-scattered over its rail, block by
 * block once the last backward is done, in the open: the exact norm needs
 * them all (then one all-reduce of a number across the boxes). */
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
        if (boxes_of(s->in) > 1) {
            LABEL(t, "gradients across boxes", b);
            d = ADD(t, FSO_STREAM_NET, rail_ms(s->in, b, kind_bytes_per_elem(s->in, FSO_KIND_GRAD)),
                    d);
            if (en->overlap == FSO_OVERLAP_BACKWARD) { /* lay_grads left it */
                lay_optimizer(s, b, d);
                s->c.opt_done[b] = true;
            }
            LABEL(t, "global norm", -1);
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
            const int acts = lay_acts_before(s, v);
            if (v->params) {
                const int pt = pl->tier[FSO_KIND_PARAM][b];
                const bool wc = pl->whole_copy[b] && W > 1 && pt != FSO_TIER_DEVICE;
                int gfree = pv >= G ? s->comp[pv - G] : -1;
                if (!aliased(in, pl, b)) {
                    LABEL(t, "parameters in", b);
                    if (pt == FSO_TIER_NVME) {
                        int issue = pv - pl->prefetch - 1 >= 0 ? s->anchor[pv - pl->prefetch - 1]
                                                                : micro_start;
                        /* whole copies: every shard read by every device */
                        R = ADD(t, FSO_STREAM_NVME_READ,
                                ms_for((wc ? F : S) * kind_bytes_per_elem(in, FSO_KIND_PARAM), nvr),
                                issue, upd);
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
                                   H, R, upd, sync_wait, s->comp_last, acts, dev_dep(s)));
                s->anchor[pv] = H >= 0 ? H : Gt >= 0 ? Gt : C;
                s->comp[pv] = C;
                pv++;
            } else {
                LABEL(t, v->grads ? "backward" : "forward", b);
                C = dev_add(s, ADD(t, FSO_STREAM_COMPUTE, v->flops / (mc->device_gflops * 1e6),
                                   sync_wait, upd, s->comp_last, acts, dev_dep(s)));
            }
            lay_acts_after(s, v, C);
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

int pl_simulate(const fso_plan_input *in, const fso_placement *pl, fso_plan *out,
                FILE *trace)
{
    const int nb = in->model.n_blocks, V = in->model.n_visits;
    sim s = {.in = in, .pl = pl, .nb = nb, .last_opt = -1, .dev = -1, .comp_last = -1};
    int rc = 0;
    s.t.shared = in->machine.cpu_devices;
    s.t.floor_ev = -1;
    s.t.lat[FSO_STREAM_NVME_READ] = in->machine.nvme_read_lat_ms;
    s.t.lat[FSO_STREAM_NVME_WRITE] = in->machine.nvme_write_lat_ms;
    /* an event moves one device's share at 1/W of the machine's rate while
     * every device moves theirs: ms of it are the machine's rate x the cost
     * per GB of the cores' time (planner.h); on CPU devices that is the
     * devices' lane, else the CPU optimizer's */
    s.t.tax[FSO_STREAM_NVME_READ] = in->machine.nvme_read_gbps * in->machine.nvme_read_cpu_s_per_gb;
    s.t.tax[FSO_STREAM_NVME_WRITE] =
        in->machine.nvme_write_gbps * in->machine.nvme_write_cpu_s_per_gb;
    s.t.tax_stream = in->machine.cpu_devices ? FSO_STREAM_COMPUTE : FSO_STREAM_OPTIM;
    for (int i = 0; i < FSO_N_STREAMS; i++)
        s.t.last[i] = -1;
    s.c.upd = malloc(sizeof(int) * (size_t)nb);
    s.c.gread = malloc(sizeof(int) * (size_t)nb);
    s.c.wr = malloc(sizeof(int) * (size_t)nb);
    s.c.opt_done = calloc((size_t)nb, sizeof(bool));
    s.grad_done = malloc(sizeof(int) * (size_t)nb);
    s.anchor = malloc(sizeof(int) * (size_t)(V + 1));
    s.comp = malloc(sizeof(int) * (size_t)(V + 1));
    s.n_acts = in->model.act_kept_bytes ? in->model.act_host_inputs + in->model.act_ring : 0;
    s.act_dn = malloc(sizeof(int) * (size_t)(s.n_acts + 1));
    s.act_rd = malloc(sizeof(int) * (size_t)(s.n_acts + 1));
    if (!s.c.upd || !s.c.gread || !s.c.wr || !s.c.opt_done || !s.grad_done || !s.anchor ||
        !s.comp || !s.act_dn || !s.act_rd) {
        rc = -ENOMEM;
        goto out;
    }
    for (int b = 0; b < nb; b++)
        s.c.upd[b] = s.c.gread[b] = s.c.wr[b] = s.grad_done[b] = -1;
    for (int i = 0; i <= s.n_acts; i++)
        s.act_dn[i] = s.act_rd[i] = -1;

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
        double written = 0; /* a device's NVMe writes in the step */
        for (int i = 0; i < s.t.n; i++) {
            const ev *x = &s.t.e[i];
            if (x->stream == JOIN || x->end <= from || x->start >= to)
                continue;
            double a = x->start > from ? x->start : from, z = x->end < to ? x->end : to;
            out->busy_ms[x->stream] += z - a;
            if (x->end > x->start)
                written += x->bytes * (z - a) / (x->end - x->start);
        }
        attribute(&s.t, norm[SIM_STEPS - 1], from, out->critical_ms);
        /* the writes complete at the rate a cache in front of the drive takes
         * them, and it drains at its own: step after step, the drive cannot
         * take more than that rate over a step, so the step lasts at least
         * every device's writes at it; the rest is the writes' */
        const double drain = in->machine.nvme_drain_gbps;
        const double drain_ms = ms_for(written * in->machine.devices, drain);
        if (drain > 0 && drain_ms > out->step_ms) {
            out->critical_ms[FSO_STREAM_NVME_WRITE] += drain_ms - out->step_ms;
            out->step_ms = drain_ms;
        }
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
    free(s.act_dn);
    free(s.act_rd);
    return rc;
}
