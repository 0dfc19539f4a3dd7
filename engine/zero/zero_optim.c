/* zero_optim.c — AdamW over one device's shards, streamed chunk by chunk
 * from wherever they live, and the schedules that take it off the critical
 * path (ARCHITECTURE.md, One step).
 *
 * The update of a block reads master, m, v and the gradient accumulator,
 * runs the fused AdamW kernel, and writes master, m, v and the working
 * parameters: a copy of the master when they are fp32; with bf16 ones the
 * kernel rounds the new master to bf16 in the same pass, straight into the
 * shard when the CPU addresses it. Shards are cut into chunks of
 * aio.block_size; with state on NVMe the chunks stream through a ring of
 * buffer sets (aio.queue_depth / 4 of them): the next chunks are read while
 * this one is updated and the previous ones are written, and a set's writes
 * are waited for only when it is read into again. Shards on the host (or on
 * a device whose memory the CPU addresses) are updated in place.
 *
 * Blocks whose optimizer state and gradients are all on a GPU (memory the
 * CPU cannot address; state.h fso_block_rule's device_state_blocks, or
 * every block with the optimizer's tier "none") are updated on the GPU
 * instead (update_blocks_on_device), with the same operations and so the
 * same bits; the other blocks of the same step on the CPU, under the same
 * clipped scale.
 *
 * Schedules (train.optimizer_overlap):
 *   none      the compute thread updates every block after the global norm;
 *   forward   the device's optimizer thread updates blocks in forward order
 *             while the next step's forward starts; block b's parameters are
 *             used as soon as block b is updated (per-block readiness);
 *   backward  with gradient_clipping 0, each block's update starts as soon as
 *             its last gradients land, during backward.
 * All three run the same kernel over the same values in the same order per
 * element, so they give the same bits.
 */
#include "zero_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optpool.h"
#include "util.h"

static const fso_kind reads[] = {FSO_KIND_MASTER, FSO_KIND_M, FSO_KIND_V, FSO_KIND_GRAD};

typedef struct unit {
    int b;
    size_t c0, n; /* elements [c0, c0 + n) of the shard */
} unit;

static bool decays(const fso_optim_config *o, const fso_tensor_desc *t)
{
    if (t->is_norm)
        return o->decay_norms;
    if (t->kind == FSO_T_EMBED)
        return o->decay_embeddings;
    return t->decay;
}

/* The part [*a, *e) of tensor d within elements [lo, hi) of its block, and
 * its weight decay into as; false when they do not meet. */
static bool tensor_part(const fso_zero *z, const fso_tensor_desc *d, size_t lo, size_t hi,
                        size_t *a, size_t *e, fso_adamw_step *as)
{
    *a = d->offset_elems > lo ? d->offset_elems : lo;
    *e = d->offset_elems + d->numel < hi ? d->offset_elems + d->numel : hi;
    as->weight_decay = decays(&z->cfg->optim, d) ? z->cfg->optim.weight_decay : 0.0;
    return *a < *e;
}

/* Data of kind k for the unit: in place when the CPU can address the shard,
 * else through the slot (an NVMe read, or a device copy). */
static int unit_fetch(rank_state *rk, const unit *u, fso_kind k, slot *s, float **ptr)
{
    void *p;
    int rc = zr_xfer(rk, &rk->opt.err, rk->opt.read_kind, u->b, k, u->c0, u->n, s, false,
                     true, &p);
    *ptr = p;
    return rc;
}

static int unit_store(rank_state *rk, const unit *u, fso_kind k, slot *s, void *ptr)
{
    return zr_xfer(rk, &rk->opt.err, rk->opt.write_kind, u->b, k, u->c0, u->n, s, true, true,
                   &ptr);
}

static int set_wait(rank_state *rk, slot *set, int block)
{
    for (int k = 0; k < FSO_N_KINDS; k++) {
        int rc = zr_slot_wait(rk, &rk->opt.err, &set[k], fso_kind_name(k), block);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* bf16 of the master over [a, e) of the unit: the padding between and
 * after tensors, which no update touches (it stays 0). */
static void round_padding(uint16_t *out, const float *master, size_t a, size_t e)
{
    for (size_t i = a; i < e; i++)
        out[i] = fso_bf16_from_f32(master[i]);
}

/* AdamW over elements [c0, c0+n) of the rank's shard of block b, tensor by
 * tensor (each with its decay flag). With bf16 working parameters, out (n)
 * receives bf16 of the whole updated master, padding included. */
static void update_unit(rank_state *rk, const unit *u, float *master, const float *grad,
                        float *m, float *v, uint16_t *out, fso_adamw_step as)
{
    const fso_zero *z = rk->z;
    const fso_block_layout *bl = &z->blocks[u->b];
    size_t lo = (size_t)rk->rank * zr_shard_elems(z, u->b) + u->c0, hi = lo + u->n;
    size_t done = lo; /* out is written up to here (tensors are in offset order) */
    fso_pool *pool = fso_optpool_pool(rk->opt.pool);
    for (int t = 0; t < bl->n_tensors; t++) {
        const fso_tensor_desc *d = &bl->tensors[t];
        size_t a, e;
        if (!tensor_part(z, d, lo, hi, &a, &e, &as))
            continue;
        if (out && a > done)
            round_padding(out, master, done - lo, a - lo);
        fso_adamw_fused_mt(z->adamw, pool, master + (a - lo), grad + (a - lo), FSO_DT_F32,
                           m + (a - lo), v + (a - lo), out ? out + (a - lo) : NULL, e - a, &as);
        done = e;
    }
    if (out && hi > done)
        round_padding(out, master, done - lo, hi - lo);
}

/* Block b holds step's parameters: compute may use it, and reads of it
 * (parameters on NVMe) that waited for the update start. */
static void mark_ready(rank_state *rk, int b, int64_t step)
{
    zr_lock(&rk->opt.mu);
    rk->opt.ready[b] = step;
    pthread_cond_broadcast(&rk->opt.cv);
    zr_unlock(&rk->opt.mu);
    zr_prefetch_kick(rk, step);
}

/* Blocks [b0, b1) hold step's master, m and v wherever they live: a save
 * may read them (zero_save.c). */
static void mark_rest(rank_state *rk, int b0, int b1, int64_t step)
{
    if (b0 >= b1)
        return;
    zr_lock(&rk->opt.mu);
    for (int b = b0; b < b1; b++)
        rk->opt.rest[b] = step;
    pthread_cond_broadcast(&rk->opt.cv);
    zr_unlock(&rk->opt.mu);
}

/* The optimizer state on a GPU: the update runs there, one kernel per
 * tensor range queued on the device (the same bits as on the CPU), instead
 * of the state crossing PCIe twice. Working parameters on the device are
 * written by the same kernel; elsewhere they are copied out of the new
 * master chunk by chunk (bf16: rounded on the way). A block is ready once
 * its update is queued: the backend's mark after it orders the gathers
 * that read the block behind it. */
static bool device_update(const rank_state *rk, int b)
{
    const fso_backend *be = rk->be;
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        if (zr_block_tier(rk->z, b, (fso_kind)k) != FSO_TIER_DEVICE)
            return false; /* the CPU updates, copying what lives on the device */
    return !be->ops->host_addressable && be->ops->adamw && be->ops->mark;
}

/* The working parameters of block b from its new master on the device:
 * chunk by chunk, copied down and written where the parameters live (bf16:
 * rounded), the next chunk's copy in flight while this one is written. */
static int params_from_master(rank_state *rk, int b)
{
    const fso_zero *z = rk->z;
    /* this box's slice of the shard: [lo, S) */
    const size_t lo = zr_opt_lo(z, b), S = lo + zr_opt_elems(z, b), ch = rk->opt.chunk_elems;
    const bool bf16 = z->elem_bytes[FSO_KIND_PARAM] == sizeof(uint16_t);
    unit u[2] = {{b, lo, S - lo < ch ? S - lo : ch}};
    float *master[2];
    int k = 0;
    int rc = unit_fetch(rk, &u[0], FSO_KIND_MASTER, &rk->opt.chunk[0][FSO_KIND_MASTER], &master[0]);
    for (size_t c0 = lo; rc == 0 && c0 < S; c0 += ch, k ^= 1) {
        slot *o = rk->opt.chunk[k], *next = rk->opt.chunk[k ^ 1];
        if (c0 + ch < S) {
            /* the other set's last write must be done before it is reused */
            u[k ^ 1] = (unit){b, c0 + ch, S - (c0 + ch) < ch ? S - (c0 + ch) : ch};
            if ((rc = set_wait(rk, next, b)) < 0 ||
                (rc = unit_fetch(rk, &u[k ^ 1], FSO_KIND_MASTER, &next[FSO_KIND_MASTER],
                                 &master[k ^ 1])) < 0)
                break;
        }
        if ((rc = zr_slot_wait(rk, &rk->opt.err, &o[FSO_KIND_MASTER],
                               fso_kind_name(FSO_KIND_MASTER), b)) < 0)
            break;
        void *param = master[k], *rail = zr_rail_param_dest(rk, b, c0);
        if (bf16) {
            param = rail ? rail
                         : zr_xfer_dest(rk, b, FSO_KIND_PARAM, c0, &o[FSO_KIND_PARAM], true);
            round_padding(param, master[k], 0, u[k].n);
        } else if (rail) {
            memcpy(rail, master[k], sizeof(float) * u[k].n);
        }
        if (!rail) /* else the rail's all-gather stores the whole shard */
            rc = unit_store(rk, &u[k], FSO_KIND_PARAM, &o[FSO_KIND_PARAM], param);
    }
    for (int set = 0; set < 2 && rc == 0; set++)
        rc = set_wait(rk, rk->opt.chunk[set], b);
    return rc;
}

/* Block b's AdamW kernels, one per tensor range, queued on the device;
 * parameters on the device are written by the same kernels. */
static void launch_block_update(rank_state *rk, const fso_adamw_step *as, int b)
{
    const fso_zero *z = rk->z;
    fso_backend *be = rk->be;
    const fso_block_layout *bl = &z->blocks[b];
    /* this box's slice of the rank's shard, in the block's elements: the
     * master, m and v hold only it, the gradients and parameters the whole
     * shard from `shard` on */
    const size_t S = zr_shard_elems(z, b), shard = (size_t)rk->rank * S;
    const size_t lo = shard + zr_opt_lo(z, b), hi = lo + zr_opt_elems(z, b);
    float *master = zr_locate(rk, b, FSO_KIND_MASTER)->ptr;
    float *m = zr_locate(rk, b, FSO_KIND_M)->ptr;
    float *v = zr_locate(rk, b, FSO_KIND_V)->ptr;
    const float *grad = zr_locate(rk, b, FSO_KIND_GRAD)->ptr;
    const loc *pl = zr_locate(rk, b, FSO_KIND_PARAM);
    const size_t eb = z->elem_bytes[FSO_KIND_PARAM];
    for (int t = 0; t < bl->n_tensors; t++) {
        fso_adamw_step st = *as;
        size_t a, e;
        if (!tensor_part(z, &bl->tensors[t], lo, hi, &a, &e, &st))
            continue;
        fso_adamw_consts c;
        fso_adamw_consts_init(&c, &st);
        /* padding between tensors stays 0 in the master and so in the parameters */
        void *out = pl->tier == FSO_TIER_DEVICE ? (char *)pl->ptr + eb * (a - shard) : NULL;
        be->ops->adamw(be, master + (a - lo), grad + (a - shard), m + (a - lo), v + (a - lo), out,
                       eb == sizeof(uint16_t), e - a, &c);
    }
}

/* Blocks b0..b1 on the device, one ahead: block b+1's kernels are queued
 * before block b's new master is copied down (parameters off the device),
 * so the device computes while the host writes parameters. */
static int update_blocks_on_device(rank_state *rk, const fso_adamw_step *as, int b0, int b1)
{
    fso_backend *be = rk->be;
    zr_save_gate(rk, b0, as->t);
    launch_block_update(rk, as, b0);
    for (int b = b0; b <= b1; b++) {
        const uint64_t updated = be->ops->mark(be); /* block b's kernels are before it */
        if (b < b1) {
            zr_save_gate(rk, b + 1, as->t);
            launch_block_update(rk, as, b + 1);
        }
        const bool off_device = zr_locate(rk, b, FSO_KIND_PARAM)->tier != FSO_TIER_DEVICE;
        rk->opt.after = updated; /* the copies down wait for b's kernels only */
        int rc = off_device ? params_from_master(rk, b) : 0;
        /* across boxes: off the device, the slice went where the rail
         * gathers; on it, the gather copies it out first */
        if (rc == 0 && rk->z->boxes > 1)
            rc = zr_rail_gather_params(rk, b, as->t, off_device);
        if (rc < 0)
            return rc;
        rk->opt.ready_mark[b] = updated;
        mark_ready(rk, b, as->t);
        mark_rest(rk, b, b + 1, as->t); /* a save copies out after ready_mark */
    }
    return 0;
}

/* The unit after u: the rest of its shard in chunks of ch elements, then
 * the next block's first; its block is past b1 when there is none. */
static unit next_unit(const fso_zero *z, unit u, size_t ch, int b1)
{
    u.c0 += u.n;
    if (u.c0 >= zr_opt_lo(z, u.b) + zr_opt_elems(z, u.b)) {
        u.b++;
        u.c0 = u.b <= b1 ? zr_opt_lo(z, u.b) : 0;
    }
    if (u.b <= b1) {
        size_t left = zr_opt_lo(z, u.b) + zr_opt_elems(z, u.b) - u.c0;
        u.n = left < ch ? left : ch;
    }
    return u;
}

/* Update blocks [b0, b1] in order, unit by unit (a chunk of a shard)
 * through the ring of chunk buffer sets: unit i in set i % n_sets. Reads
 * run `ahead` units ahead of the update (half the ring), the other sets
 * hold writes in flight; a set's writes are waited for only when the set is
 * read into again. Each block is marked ready for step as.t once its
 * working parameters are written: on NVMe, once the writes of its units
 * still in flight have landed (the next forward reads them). */
static int update_blocks_on_cpu(rank_state *rk, const fso_adamw_step *as, int b0, int b1)
{
    const fso_zero *z = rk->z;
    const size_t ch = rk->opt.chunk_elems;
    const int K = rk->opt.n_sets, ahead = K / 2 > 0 ? K / 2 : 1;
    slot(*const ring)[FSO_N_KINDS] = rk->opt.chunk;
    unit u[FSO_FP_MAX_CHUNK_SETS];
    float *p[FSO_FP_MAX_CHUNK_SETS][FSO_N_KINDS];
    int64_t issued = 0, done = 0, block_first = 0;
    unit next = {b0, zr_opt_lo(z, b0), 0}; /* this box's slice of each shard */
    next.n = zr_opt_elems(z, b0) < ch ? zr_opt_elems(z, b0) : ch;
    int rc;

    int rested = b0; /* blocks below `rested` have landed: a save may read them */
    for (;;) {
        /* reads for the units ahead, each into a set whose writes have landed */
        while (next.b <= b1 && issued <= done + ahead) {
            const int s = (int)(issued % K);
            /* the set's writes are those of unit issued - K, if any */
            if ((rc = set_wait(rk, ring[s], issued >= K ? u[s].b : next.b)) < 0)
                return rc;
            /* every unit up to issued - K has landed now (each set is waited
             * for before it is read into again), so every block below the
             * block of unit issued - K + 1, which is done, has */
            if (issued >= K - 1) {
                const int landed = u[(issued - K + 1) % K].b;
                mark_rest(rk, rested, landed, as->t);
                if (landed > rested)
                    rested = landed;
            }
            u[s] = next;
            for (int i = 0; i < 4; i++)
                if ((rc = unit_fetch(rk, &next, reads[i], &ring[s][reads[i]], &p[s][reads[i]])) < 0)
                    return rc;
            issued++;
            next = next_unit(z, next, ch, b1);
        }
        if (done == issued)
            break;
        const int s = (int)(done % K);
        const unit cur = u[s];
        slot *o = ring[s];
        const bool first = cur.c0 == zr_opt_lo(z, cur.b);
        if (first)
            block_first = done;
        for (int i = 0; i < 4; i++)
            if ((rc = zr_slot_wait(rk, &rk->opt.err, &o[reads[i]], fso_kind_name(reads[i]),
                                   cur.b)) < 0)
                return rc;
        /* working parameters: fp32 ones are the master copied; bf16 ones
         * come out of the update, in the shard itself when the CPU
         * addresses it, else in the chunk buffer that carries them there */
        float **q = p[s];
        void *param = q[FSO_KIND_MASTER], *rail = zr_rail_param_dest(rk, cur.b, cur.c0);
        uint16_t *param_bf16 = NULL;
        if (z->elem_bytes[FSO_KIND_PARAM] == sizeof(uint16_t))
            param = param_bf16 = rail ? rail
                                      : zr_xfer_dest(rk, cur.b, FSO_KIND_PARAM, cur.c0,
                                                     &o[FSO_KIND_PARAM], true);
        if (first) /* a save of the step before may still need the block */
            zr_save_gate(rk, cur.b, as->t);
        update_unit(rk, &cur, q[FSO_KIND_MASTER], q[FSO_KIND_GRAD], q[FSO_KIND_M],
                    q[FSO_KIND_V], param_bf16, *as);
        if (rail && !param_bf16) /* fp32 parameters: the master's copy */
            memcpy(rail, q[FSO_KIND_MASTER], sizeof(float) * cur.n);
        /* across boxes the rail's all-gather stores a rail-gathered shard whole */
        if ((!rail && (rc = unit_store(rk, &cur, FSO_KIND_PARAM, &o[FSO_KIND_PARAM], param)) < 0) ||
            (rc = unit_store(rk, &cur, FSO_KIND_MASTER, &o[FSO_KIND_MASTER],
                             q[FSO_KIND_MASTER])) < 0 ||
            (rc = unit_store(rk, &cur, FSO_KIND_M, &o[FSO_KIND_M], q[FSO_KIND_M])) < 0 ||
            (rc = unit_store(rk, &cur, FSO_KIND_V, &o[FSO_KIND_V], q[FSO_KIND_V])) < 0)
            return rc;
        if (cur.c0 + cur.n == zr_opt_lo(z, cur.b) + zr_opt_elems(z, cur.b)) {
            /* block done: its parameters must be written before a forward
             * reads them (on a device, the copies in are ordered before any
             * use there, so the host need not wait for them); units read
             * into again since have had theirs waited for */
            if (zr_locate(rk, cur.b, FSO_KIND_PARAM)->tier != FSO_TIER_DEVICE)
                for (int64_t j = done - K + 1 > block_first ? done - K + 1 : block_first;
                     j <= done; j++)
                    if ((rc = zr_slot_wait(rk, &rk->opt.err, &ring[j % K][FSO_KIND_PARAM],
                                           fso_kind_name(FSO_KIND_PARAM), cur.b)) < 0)
                        return rc;
            if (z->boxes > 1 && (rc = zr_rail_gather_params(rk, cur.b, as->t, true)) < 0)
                return rc;
            mark_ready(rk, cur.b, as->t);
        }
        done++;
    }
    for (int k = 0; k < K && k < issued; k++)
        if ((rc = set_wait(rk, ring[k], u[k].b)) < 0)
            return rc;
    mark_rest(rk, rested, b1 + 1, as->t);
    return 0;
}

/* Update blocks [b0, b1] in order: each run of blocks whose state is on a
 * GPU there (update_blocks_on_device), the others on the CPU
 * (update_blocks_on_cpu). Both apply the same clipped step (the one global
 * norm over every block, in as->grad_scale). */
static int update_blocks(rank_state *rk, const fso_adamw_step *as, int b0, int b1)
{
    const uint64_t after = rk->opt.after; /* the job's: a device run moves it along */
    for (int b = b0; b <= b1;) {
        const bool dev = device_update(rk, b);
        int e = b;
        while (e < b1 && device_update(rk, e + 1) == dev)
            e++;
        rk->opt.after = after;
        int rc = dev ? update_blocks_on_device(rk, as, b, e) : update_blocks_on_cpu(rk, as, b, e);
        if (rc < 0)
            return rc;
        b = e + 1;
    }
    return 0;
}

int zr_optim_run(rank_state *rk, const fso_adamw_step *as)
{
    double t0 = fso_now_ms();
    __atomic_store_n(&rk->opt.err.rc, 0, __ATOMIC_RELAXED); /* a saver may be reading it */
    rk->opt.after = 0; /* after the step's sync: the device is idle */
    int rc = update_blocks(rk, as, 0, rk->z->n_blocks - 1);
    double dt = fso_now_ms() - t0;
    rk->opt.busy_ms += dt;
    rk->compute.st.optimizer_exposed_ms += dt;
    if (rc < 0) {
        rk->compute.err = rk->opt.err;
        __atomic_store_n(&rk->opt.err.rc, 0, __ATOMIC_RELAXED);
    }
    return rc;
}

/* The backward schedule updates a block as soon as its gradients are in,
 * before the global norm is known: only if they are finite. A norm taken
 * on the device arrives with the job's mark; waiting for it here keeps the
 * compute thread from waiting. */
static int block_finite(rank_state *rk, const opt_job *job)
{
    const int b = job->block;
    if (job->after)
        rk->be->ops->wait_mark(rk->be, job->after);
    if (isfinite(rk->compute.grad_sq[b]))
        return 0;
    return zr_fail(&rk->opt.err, -ERANGE,
                   "step %lld: block %d's gradients are not finite: training diverged; "
                   "lower optimizer.params.lr (blocks after it in backward order were "
                   "already updated: train.optimizer_overlap \"backward\" cannot hold "
                   "them back)",
                   (long long)job->as.t, b);
}

static void *opt_main(void *arg)
{
    rank_state *rk = arg;
    zr_lock(&rk->opt.mu);
    for (;;) {
        while (rk->opt.head == rk->opt.tail && !rk->opt.stop)
            zr_cond_wait(&rk->opt.cv, &rk->opt.mu);
        if (rk->opt.head == rk->opt.tail)
            break;
        opt_job job = rk->opt.queue[rk->opt.head % OPT_QUEUE];
        int failed = rk->opt.err.rc != 0;
        zr_unlock(&rk->opt.mu);

        double t0 = fso_now_ms();
        rk->opt.after = job.after;
        if (!failed && job.block >= 0) /* the backward schedule: one block, if finite */
            failed = block_finite(rk, &job) < 0;
        if (!failed) /* after a failure nothing more is applied */
            update_blocks(rk, &job.as, job.block < 0 ? 0 : job.block,
                          job.block < 0 ? rk->z->n_blocks - 1 : job.block);
        double dt = fso_now_ms() - t0;

        zr_lock(&rk->opt.mu);
        rk->opt.busy_ms += dt;
        rk->opt.head++;
        pthread_cond_broadcast(&rk->opt.cv);
    }
    zr_unlock(&rk->opt.mu);
    return NULL;
}

int zr_optim_start(rank_state *rk)
{
    int rc = pthread_create(&rk->opt.tid, NULL, opt_main, rk);
    if (rc != 0)
        return -rc;
    rk->opt.started = true;
    return 0;
}

void zr_optim_stop(rank_state *rk)
{
    if (!rk->opt.started)
        return;
    zr_lock(&rk->opt.mu);
    rk->opt.stop = true;
    pthread_cond_broadcast(&rk->opt.cv);
    zr_unlock(&rk->opt.mu);
    pthread_join(rk->opt.tid, NULL);
    rk->opt.started = false;
}

static void post(rank_state *rk, const fso_adamw_step *as, int block)
{
    fso_backend *be = rk->be;
    const uint64_t after = be->ops->mark ? be->ops->mark(be) : 0;
    zr_lock(&rk->opt.mu);
    while (rk->opt.tail - rk->opt.head >= OPT_QUEUE)
        zr_cond_wait(&rk->opt.cv, &rk->opt.mu);
    rk->opt.queue[rk->opt.tail % OPT_QUEUE] = (opt_job){.as = *as, .block = block, .after = after};
    rk->opt.tail++;
    pthread_cond_broadcast(&rk->opt.cv);
    zr_unlock(&rk->opt.mu);
}

void zr_optim_post_step(rank_state *rk, const fso_adamw_step *as)
{
    post(rk, as, -1);
}

void zr_optim_post_block(rank_state *rk, const fso_adamw_step *as, int block)
{
    post(rk, as, block);
}

/* With p's optimizer lock held: wait until p's block b holds the
 * parameters of `step`; false when p's optimizer failed first (it records
 * the failure without the lock). */
static bool block_ready(rank_state *p, int b, int64_t step)
{
    while (p->opt.ready[b] < step && fso_first_error_rc(&p->opt.err.rc) == 0)
        zr_cond_wait(&p->opt.cv, &p->opt.mu);
    return p->opt.ready[b] >= step;
}

/* Wait until block b holds the parameters of `step` (b >= 0), or until
 * every posted update is done (b < 0); the time waited is exposed
 * optimizer time. 0, or the optimizer's error, recorded for the compute
 * thread too. */
static int opt_wait(rank_state *rk, int b, int64_t step)
{
    int rc = 0;
    double t0 = fso_now_ms();
    zr_lock(&rk->opt.mu);
    if (b >= 0) {
        if (!block_ready(rk, b, step))
            rc = rk->opt.err.rc;
    } else {
        while (rk->opt.head != rk->opt.tail)
            zr_cond_wait(&rk->opt.cv, &rk->opt.mu);
        rc = rk->opt.err.rc;
    }
    zr_unlock(&rk->opt.mu);
    rk->compute.st.optimizer_exposed_ms += fso_now_ms() - t0;
    if (rc < 0)
        zr_fail(&rk->compute.err, rc, "%s", rk->opt.err.msg);
    return rc;
}

int zr_optim_wait_block(rank_state *rk, int b, int64_t step)
{
    return opt_wait(rk, b, step);
}

int zr_optim_wait_peers(rank_state *rk, int b, int64_t step)
{
    double t0 = fso_now_ms();
    int rc = 0, failed = -1;
    for (int r = 0; r < rk->z->world && rc == 0; r++) {
        rank_state *p = &rk->z->ranks[r];
        if (p == rk)
            continue;
        zr_lock(&p->opt.mu);
        if (!block_ready(p, b, step)) {
            rc = -ECANCELED;
            failed = r;
        }
        zr_unlock(&p->opt.mu);
    }
    rk->compute.st.optimizer_exposed_ms += fso_now_ms() - t0;
    if (rc < 0)
        zr_fail(&rk->compute.err, rc, "device %d: device %d's update of block %d failed",
                rk->rank, failed, b);
    return rc;
}

int zr_optim_wait_all(rank_state *rk)
{
    return opt_wait(rk, -1, 0);
}
