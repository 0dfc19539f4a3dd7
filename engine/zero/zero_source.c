/* zero_source.c — the block source lent to the model (model.h): each
 * block's parameters gathered from the devices' shards (read ahead from
 * NVMe, staged onto the device) into a window the model reads, and each
 * block's gradients reduce-scattered back into the shards, landing on
 * their tier one block behind; with the time spent in each. With whole
 * copies (train.whole_block_copies) a streamed block's shards are all
 * copied to every device instead of gathered. CPU devices
 * gather and reduce in their shared memory instead of through the
 * collective (shared_coll, zero_source.h). */
#include "zero_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static void *window_part(rank_state *rk, int64_t q, size_t bytes);

/* Start reading parameter shards of the next blocks in the order, as far
 * as the ring allows: those the optimizer has updated for `step`. Each goes
 * into a slot of the ring, or on CPU devices straight into the device's
 * part of its lend's shared window when that window is free already (no
 * copy at the lend). Failures go to es, and the bytes read to bytes_done;
 * with io.pf_mu held (the compute thread and the optimizer's kick both
 * start reads). */
static int prefetch_params(rank_state *rk, errsink *es, uint64_t *bytes_done, int64_t step)
{
    fso_zero *z = rk->z;
    if (rk->io.n_prefetch == 0) /* no block's parameters on NVMe */
        return 0;
    int ahead = z->prefetch;
    const int from = rk->compute.order_pos;
    for (int i = from; i < from + 1 + ahead && i < z->n_order; i++) {
        int b = z->order[i];
        /* resident blocks and blocks on the host are not read ahead: they
         * hold positions in the order, no slot */
        if (zr_block_tier(z, b, FSO_KIND_PARAM) != FSO_TIER_NVME)
            continue;
        /* never read a block the optimizer has not finished writing */
        zr_lock(&rk->opt.mu);
        bool ready = rk->opt.ready[b] >= step;
        zr_unlock(&rk->opt.mu);
        if (!ready)
            break;
        bool have = false;
        for (int j = 0; j < rk->io.n_prefetch; j++)
            if (rk->io.prefetch[j].block == b)
                have = true;
        if (have)
            continue;
        /* a free slot: one whose block is not needed before position i;
         * of those, the one whose copy to the device is oldest (or done),
         * so that reusing it rarely waits */
        slot *s = NULL;
        zr_lock(&rk->io.mu); /* pending: either thread reaps */
        for (int j = 0; j < rk->io.n_prefetch; j++) {
            slot *c = &rk->io.prefetch[j];
            bool needed = false;
            for (int q = rk->compute.order_pos; q < i && c->block >= 0; q++)
                if (z->order[q] == c->block)
                    needed = true;
            if (!needed && c->pending == 0 && (!s || c->copied < s->copied))
                s = c;
        }
        zr_unlock(&rk->io.mu);
        if (!s)
            break;
        /* its last copy to the device is done (long since, as a rule) */
        zr_copies_wait(rk, s);
        const int64_t q = rk->compute.pass_lend + i;
        void *dst = window_part(rk, q, z->elem_bytes[FSO_KIND_PARAM] * zr_shard_elems(z, b));
        s->block = b;
        s->lend = dst ? q : -1;
        void *p;
        int rc = dst ? zr_shard_read_to(rk, es, bytes_done, b, FSO_KIND_PARAM, s, dst)
                     : zr_xfer(rk, es, bytes_done, b, FSO_KIND_PARAM, 0,
                               zr_shard_elems(z, b), s, false, false, &p);
        if (rc < 0) {
            zr_lock(&rk->io.mu);
            s->err = rc; /* whoever waits for the slot says so */
            zr_unlock(&rk->io.mu);
            return rc;
        }
    }
    return 0;
}

void zr_prefetch_kick(rank_state *rk, int64_t step)
{
    if (rk->io.n_prefetch == 0)
        return;
    errsink es = {0}; /* a failed read fails the slot, which compute waits for */
    zr_lock(&rk->io.pf_mu);
    prefetch_params(rk, &es, rk->opt.read_kind, step);
    zr_unlock(&rk->io.pf_mu);
}

/* ------------------------------------- gathers and reduces in shared memory */

static void free_arrays(shared_coll *sc)
{
    free(sc->placed);
    free(sc->released);
    free(sc->rs_src);
    free(sc->rs_posted);
    free(sc->rs_read);
    sc->placed = sc->released = sc->rs_posted = sc->rs_read = NULL;
    sc->rs_src = NULL;
}

int zr_shared_coll_init(fso_zero *z)
{
    shared_coll *sc = &z->sc;
    if (z->world < 2 || !z->ranks[0].be->ops->host_addressable)
        return 0;
    sc->n = 2 * z->world;
    const size_t cells = (size_t)sc->n * (size_t)z->world;
    sc->placed = malloc(sizeof *sc->placed * cells);
    sc->released = malloc(sizeof *sc->released * cells);
    sc->rs_src = calloc(2 * (size_t)z->world, sizeof *sc->rs_src);
    sc->rs_posted = malloc(sizeof *sc->rs_posted * (size_t)z->world);
    sc->rs_read = malloc(sizeof *sc->rs_read * (size_t)z->world);
    if (!sc->placed || !sc->released || !sc->rs_src || !sc->rs_posted || !sc->rs_read) {
        free_arrays(sc);
        return -ENOMEM;
    }
    for (size_t i = 0; i < cells; i++)
        sc->placed[i] = sc->released[i] = -1;
    for (int r = 0; r < z->world; r++) {
        sc->rs_posted[r] = sc->rs_read[r] = -1;
        z->ranks[r].compute.grad_reduce[0] = z->ranks[r].compute.grad_reduce[1] = -1;
    }
    zr_mutex_init(&sc->mu, ZR_LOCK_SC);
    pthread_cond_init(&sc->cv, NULL);
    sc->on = true;
    return 0;
}

void zr_shared_coll_free(fso_zero *z)
{
    shared_coll *sc = &z->sc;
    if (!sc->on)
        return;
    zr_mutex_destroy(&sc->mu);
    pthread_cond_destroy(&sc->cv);
    free_arrays(sc);
    sc->on = false;
}

void zr_windows_reset(fso_zero *z)
{
    shared_coll *sc = &z->sc;
    if (!sc->on)
        return;
    int64_t last = -1;
    for (int r = 0; r < z->world; r++)
        if (z->ranks[r].compute.lends - 1 > last)
            last = z->ranks[r].compute.lends - 1;
    zr_lock(&sc->mu);
    for (size_t i = 0; i < (size_t)sc->n * (size_t)z->world; i++)
        sc->released[i] = last;
    zr_unlock(&sc->mu);
}

/* Wait until every device's entry of window w in `seen` is at least lend q. */
static void sc_wait(shared_coll *sc, int world, const int64_t *seen, int w, int64_t q)
{
    zr_lock(&sc->mu);
    for (int k = 0; k < world; k++)
        while (seen[(size_t)w * world + k] < q)
            zr_cond_wait(&sc->cv, &sc->mu);
    zr_unlock(&sc->mu);
}

static void sc_set(shared_coll *sc, int world, int64_t *seen, int w, int rank, int64_t q)
{
    zr_lock(&sc->mu);
    seen[(size_t)w * world + rank] = q;
    pthread_cond_broadcast(&sc->cv);
    zr_unlock(&sc->mu);
}

static void *window_of(fso_zero *z, int64_t q)
{
    const int w = (int)(q % z->sc.n);
    return z->ranks[w % z->world].compute.gather[w / z->world];
}

/* The window of lend q: once every device has let go of the lend before it
 * there (q - n). Every device is past lend q - 1 by then, as a rule (the
 * previous lend waited for every shard), and holds no more than two, so
 * with n >= 3 this does not wait: it keeps the pool right whatever the
 * model does. */
static void *sc_window(rank_state *rk, int64_t q)
{
    fso_zero *z = rk->z;
    sc_wait(&z->sc, z->world, z->sc.released, (int)(q % z->sc.n), q - z->sc.n);
    return window_of(z, q);
}

/* Where a read of this device's shard of lend q (`bytes`) may go straight
 * into the shared window: its part there, when every device has let go of
 * the window's previous lend already and the part is whole pages (always,
 * in the layout of model.h, in buffers that start on a page); NULL
 * otherwise (the read goes through a slot). */
static void *window_part(rank_state *rk, int64_t q, size_t bytes)
{
    fso_zero *z = rk->z;
    shared_coll *sc = &z->sc;
    if (!sc->on)
        return NULL;
    const int w = (int)(q % sc->n);
    bool free_now = true;
    zr_lock(&sc->mu);
    for (int k = 0; k < z->world; k++)
        free_now = free_now && sc->released[(size_t)w * z->world + k] >= q - sc->n;
    zr_unlock(&sc->mu);
    char *part = (char *)window_of(z, q) + (size_t)rk->rank * bytes;
    return free_now && (uintptr_t)part % FSO_IO_PAGE == 0 && bytes % FSO_IO_PAGE == 0 ? part
                                                                                 : NULL;
}

/* The shared reduce-scatter of rank rk's gradients of block b in
 * grad_full[g]: post them, wait for everyone's, sum this rank's shard of
 * them into dst (added to it when accumulating; with sq, its norm taken in
 * the same pass), and say so. Every rank joins even after a failure. */
static void sc_reduce(rank_state *rk, int g, size_t S, float *dst, bool accumulate, double *sq)
{
    fso_zero *z = rk->z;
    shared_coll *sc = &z->sc;
    const int64_t p = rk->compute.reduces++;
    const float *src[FSO_MAX_DEVICES];
    zr_lock(&sc->mu);
    sc->rs_src[rk->rank * 2 + p % 2] = rk->compute.grad_full[g];
    sc->rs_posted[rk->rank] = p;
    pthread_cond_broadcast(&sc->cv);
    for (int k = 0; k < z->world; k++) {
        while (sc->rs_posted[k] < p)
            zr_cond_wait(&sc->cv, &sc->mu);
        src[k] = sc->rs_src[k * 2 + p % 2] + (size_t)rk->rank * S;
    }
    zr_unlock(&sc->mu);
    if (rk->compute.err.rc == 0)
        fso_host_reduce_sqnorm(fso_backend_pool(rk->be), dst, src, z->world, S, accumulate, sq);
    rk->compute.grad_reduce[g] = p;
    zr_lock(&sc->mu);
    sc->rs_read[rk->rank] = p;
    pthread_cond_broadcast(&sc->cv);
    zr_unlock(&sc->mu);
}

/* grad_full[g] may be written again: every rank has read it. */
static void sc_grads_free(rank_state *rk, int g)
{
    shared_coll *sc = &rk->z->sc;
    const int64_t p = rk->compute.grad_reduce[g];
    if (p < 0)
        return;
    zr_lock(&sc->mu);
    for (int k = 0; k < rk->z->world; k++)
        while (sc->rs_read[k] < p)
            zr_cond_wait(&sc->cv, &sc->mu);
    zr_unlock(&sc->mu);
}

static void sc_release(rank_state *rk, int g)
{
    fso_zero *z = rk->z;
    const int64_t q = rk->compute.gather_lend[g];
    sc_set(&z->sc, z->world, z->sc.released, (int)(q % z->sc.n), rk->rank, q);
}

/* A lend that uses no window (parameters lent in place) lets go of the
 * window its number would have used, once that window's previous lend is
 * let go of (sc_window), so that the windows' lends stay in step on every
 * device. */
static void sc_skip_window(rank_state *rk, int64_t q)
{
    fso_zero *z = rk->z;
    sc_window(rk, q);
    sc_set(&z->sc, z->world, z->sc.released, (int)(q % z->sc.n), rk->rank, q);
}

/* Block b, whose parameters are not read ahead (resident, or on the host),
 * is lent at the order's next position: the reads ahead of the blocks on
 * NVMe count positions from there. */
static void pass_position(rank_state *rk, int b)
{
    fso_zero *z = rk->z;
    if (rk->io.n_prefetch == 0 || rk->compute.err.rc != 0)
        return;
    zr_lock(&rk->io.pf_mu);
    FSO_BUG_ON(rk->compute.order_pos >= z->n_order || z->order[rk->compute.order_pos] != b,
               "block %d asked out of order", b);
    rk->compute.order_pos++;
    prefetch_params(rk, &rk->compute.err, rk->compute.st.nvme_kind_read, z->step);
    zr_unlock(&rk->io.pf_mu);
}

/* Whole copies (footprint.h fso_fp_copies_whole): the other devices' shards
 * of block b, each copied from host memory into its part of recv, this
 * device's own having been copied already: no all-gather. Their updates
 * must be in first (the peers' optimizers; a host shard is written, and an
 * NVMe one stored, before its block is marked ready). From NVMe this device
 * reads each peer's shard itself, from the peer's store, through its stage
 * slot (grad_trip, idle while a block is lent), one at a time: the simplest
 * correct sharing of the reads, with no new buffer and nothing held across
 * devices, at the cost of reads that are not prefetched. Failures go to the
 * compute thread's sink; no device waits on another here, so a failed one
 * leaves nobody behind. */
static void whole_from_peers(rank_state *rk, int b, char *recv, size_t shard_bytes,
                             uint64_t after)
{
    fso_zero *z = rk->z;
    slot *s = &rk->io.grad_trip;
    if (zr_optim_wait_peers(rk, b, z->step) < 0)
        return;
    for (int k = 0; k < z->world; k++) {
        rank_state *p = &z->ranks[k];
        if (p == rk)
            continue;
        const loc *pl = zr_locate(p, b, FSO_KIND_PARAM);
        const void *src = pl->ptr;
        if (pl->tier == FSO_TIER_NVME) {
            zr_copies_wait(rk, s); /* the previous peer's copy out of it is done; s->copied
                                      is 0 for the peer's zr_slot_wait */
            double t0 = fso_now_ms();
            int rc = zr_shard_read_to(p, &rk->compute.err, rk->compute.st.nvme_kind_read, b,
                                      FSO_KIND_PARAM, s, s->buf);
            if (rc == 0)
                rc = zr_slot_wait(p, &rk->compute.err, s, "parameters", b);
            rk->compute.st.stall_ms += fso_now_ms() - t0;
            if (rc < 0)
                return;
            src = s->buf;
        }
        zr_copy_in(rk->be, recv + (size_t)k * shard_bytes, src, shard_bytes, after);
        if (pl->tier == FSO_TIER_NVME)
            s->copied = zr_mark_copies(rk->be);
    }
    /* grads_land fetches into the stage slot without waiting for copies */
    zr_copies_wait(rk, s);
}

/* Lend block b's full parameters, in their working type (bf16 or fp32: the
 * model's). The rank's shard is gathered from where it lives when the
 * collective can read it there, else staged on the device first, into the
 * window the model reads. CPU devices gather into the shared pool instead:
 * each writes its own shard into the lend's window and waits for the
 * others'. A block whose parameters are lent in place (zr_lends_in_place,
 * by the block's own tier, resident or streamed) is lent where it lives:
 * world 1, the shard itself; CPU devices, the block's shared buffer, once
 * every device's update of its part is in. Every lend takes the order's
 * next position, which the reads ahead of the blocks on NVMe count from
 * (pass_position). Blocks copied whole (whole_from_peers) skip the
 * gather: every shard is copied into the window from host memory. */
static const void *src_params(void *ctx, int b)
{
    rank_state *rk = ctx;
    fso_zero *z = rk->z;
    fso_backend *be = rk->be;
    if (rk->compute.pre_block >= 0) { /* gathered ahead by grads_done() */
        FSO_BUG_ON(rk->compute.pre_block != b, "block %d asked, block %d gathered ahead", b,
                   rk->compute.pre_block);
        rk->compute.pre_block = -1;
        return rk->compute.pre_params;
    }
    size_t S = zr_shard_elems(z, b);
    const size_t eb = z->elem_bytes[FSO_KIND_PARAM], shard_bytes = eb * S;
    const int64_t q = rk->compute.lends++;

    /* the previous step's update of this block must be in (overlapped schedules) */
    if (rk->compute.err.rc == 0)
        zr_optim_wait_block(rk, b, z->step);
    loc *l = zr_locate(rk, b, FSO_KIND_PARAM);
    if (l->tier != FSO_TIER_NVME)
        pass_position(rk, b);
    if (zr_lends_in_place(z, b)) {
        if (z->sc.on) /* its window goes unused */
            sc_skip_window(rk, q);
        if (z->world == 1)
            return l->ptr;
        if (rk->compute.err.rc == 0)
            zr_optim_wait_peers(rk, b, z->step);
        return zr_lent(z, b, l->tier)->base;
    }
    int g = rk->compute.gather_refs[0] == 0 ? 0 : 1;
    FSO_BUG_ON(rk->compute.gather_refs[g] != 0, "more than two blocks lent at once");
    /* the gather's target and the mark after which compute is done with
     * it: the staging copy and the gather wait for that only, so on a GPU
     * they run while the previous block computes */
    void *recv = z->sc.on ? sc_window(rk, q) : rk->compute.gather[g];
    uint64_t after = rk->compute.gather_free[g];
    /* an update of the shard queued on the device (read only once the wait
     * above has ordered it after the updater's write; after a failure no
     * copy uses it) */
    if (rk->compute.err.rc == 0 && rk->opt.ready_mark[b] > after)
        after = rk->opt.ready_mark[b];
    void *mine = (char *)recv + (size_t)rk->rank * shard_bytes;
    const void *send = mine; /* this rank's shard, where the gather reads it */
    /* the same on every device: the block's tier is the placement's */
    const bool whole = fso_fp_copies_whole(&z->rules, l->tier);
    if (rk->compute.err.rc == 0) {
        if (l->tier == FSO_TIER_DEVICE ||
            (l->tier == FSO_TIER_HOST && be->ops->host_addressable)) {
            if (z->sc.on)
                zr_copy_in(be, mine, l->ptr, shard_bytes, after);
            else
                send = l->ptr; /* gathered straight from where it lives */
        } else if (l->tier == FSO_TIER_HOST) {
            zr_copy_in(be, mine, l->ptr, shard_bytes, after);
            if (whole)
                whole_from_peers(rk, b, recv, shard_bytes, after);
        } else {
            /* the order must match the model's: it is the same on every rank */
            FSO_BUG_ON(rk->compute.order_pos >= z->n_order || z->order[rk->compute.order_pos] != b,
                       "block %d asked out of order", b);
            uint64_t *counted = rk->compute.st.nvme_kind_read;
            zr_lock(&rk->io.pf_mu);
            prefetch_params(rk, &rk->compute.err, counted, z->step);
            slot *s = NULL;
            for (int j = 0; j < rk->io.n_prefetch; j++)
                if (rk->io.prefetch[j].block == b)
                    s = &rk->io.prefetch[j];
            zr_unlock(&rk->io.pf_mu);
            double t0 = fso_now_ms();
            int wrc = s ? zr_slot_wait(rk, &rk->compute.err, s, "parameters", b) : -EIO;
            rk->compute.st.stall_ms += fso_now_ms() - t0;
            FSO_BUG_ON(s && s->lend >= 0 && s->lend != q,
                       "lend %lld read into the window of lend %lld", (long long)q,
                       (long long)s->lend);
            const bool direct = s && s->lend == q; /* read into `mine` already */
            if (wrc == 0 && !direct)
                zr_copy_in(be, mine, s->buf, shard_bytes, after);
            zr_lock(&rk->io.pf_mu);
            if (s && wrc == 0 && !direct) /* the slot may be read into again once this copy
                                             is done: prefetch_params waits for that, not for
                                             compute */
                s->copied = zr_mark_copies(be);
            if (s) {
                s->block = -1;
                s->lend = -1;
            }
            rk->compute.order_pos++;
            prefetch_params(rk, &rk->compute.err, counted, z->step);
            zr_unlock(&rk->io.pf_mu);
            if (whole && wrc == 0)
                whole_from_peers(rk, b, recv, shard_bytes, after);
        }
    }
    /* Every rank joins the gather even after a failure, so no rank waits
     * forever; the step is discarded afterwards. Whole copies gather
     * nothing (on every rank alike). */
    if (!whole)
        rk->compute.st.gather_bytes += (uint64_t)z->world * S * eb; /* the whole block
                                                                       arrives */
    if (z->sc.on) {
        sc_set(&z->sc, z->world, z->sc.placed, (int)(q % z->sc.n), rk->rank, q);
        sc_wait(&z->sc, z->world, z->sc.placed, (int)(q % z->sc.n), q);
    } else if (!whole) { /* whole copies: compute runs after them (backend.h order_after) */
        z->coll->ops->all_gather(z->coll, rk->rank, send, recv, S,
                                 eb == sizeof(float) ? FSO_DT_F32 : FSO_DT_BF16, after);
    }
    rk->compute.gather_block[g] = b;
    rk->compute.gather_refs[g] = 1;
    rk->compute.gather_lend[g] = q;
    return recv;
}

static void src_release(void *ctx, int b)
{
    rank_state *rk = ctx;
    if (zr_lends_in_place(rk->z, b))
        return;
    for (int g = 0; g < 2; g++)
        if (rk->compute.gather_refs[g] && rk->compute.gather_block[g] == b) {
            if (rk->z->sc.on)
                sc_release(rk, g);
            rk->compute.gather_refs[g] = 0;
            rk->compute.gather_block[g] = -1;
            rk->compute.gather_free[g] = zr_mark(rk->be); /* compute with it is all queued */
            return;
        }
}

/* A block's gradient buffer: of the free two, the one read longest ago
 * (the older mark; 0 first), zeroed by compute ordered after the reduce-
 * scatter and copies that read it last (backend.h order_after), which on a
 * device with streams are then done as a rule: block b-1 computes while
 * block b's gradients are reduced and copied down. */
static float *src_grads(void *ctx, int b)
{
    rank_state *rk = ctx;
    int g = -1;
    for (int k = 0; k < 2; k++)
        if (rk->compute.grad_full_block[k] < 0 &&
            (g < 0 || rk->compute.grad_read[k] < rk->compute.grad_read[g]))
            g = k;
    FSO_BUG_ON(g < 0, "more than two blocks' gradients lent at once");
    rk->compute.grad_full_block[g] = b;
    if (rk->z->sc.on) { /* waiting for the other devices is not compute */
        double t0 = fso_now_ms();
        sc_grads_free(rk, g);
        rk->clock.wait_ms += fso_now_ms() - t0;
    }
    fso_backend_order_after(rk->be, rk->compute.grad_read[g]);
    rk->be->ops->memset0(rk->be, rk->compute.grad_full[g],
                         sizeof(float) * rk->z->blocks[b].padded_elems);
    return rk->compute.grad_full[g];
}

/* Gather the block the model asks for next (its params(), which returns
 * it) before block b's reduce-scatter is queued, into the free window:
 * compute waits for the gathers before it (backend.h order_after), and on
 * a device whose collectives run in order, for whatever precedes them, so
 * the gather goes first and the next block's backward does not wait for
 * this block's reduce-scatter. Only where compute is not ordered after
 * reduce-scatters anyway (a backend with order_after) and the collective
 * gathers (not CPU devices' shared windows, nor lent in place). Every rank
 * decides the same: the same order and windows. */
static void gather_ahead(rank_state *rk)
{
    fso_zero *z = rk->z;
    if (z->sc.on || !rk->be->ops->order_after || rk->compute.pre_block >= 0)
        return;
    if (rk->compute.gather_refs[0] && rk->compute.gather_refs[1])
        return;
    const int64_t i = rk->compute.lends - rk->compute.pass_lend;
    if (i >= z->n_order)
        return;
    const int next = z->order[i];
    if (zr_lends_in_place(z, next)) /* nothing to gather */
        return;
    rk->compute.pre_params = src_params(rk, next);
    rk->compute.pre_block = next;
}

/* A block's gradient shard, copied down from the device, lands in its tier:
 * added to what earlier micro-batches left there (the first micro-batch of
 * a step overwrites it), its squared norm taken after the step's last
 * micro-batch (the same chunked host sum on every tier, so the norm has the
 * same bits wherever the gradients live), stored, and with the backward
 * schedule the block's update started. Runs one block behind the copies,
 * so the host works while the device copies the next block's shard. */
void zr_grads_land(rank_state *rk)
{
    grad_pending gp = rk->io.landing;
    if (gp.block < 0)
        return;
    rk->io.landing.block = -1;
    if (rk->compute.err.rc)
        return;
    fso_zero *z = rk->z;
    fso_backend *be = rk->be;
    const int b = gp.block;
    const size_t S = zr_shard_elems(z, b);
    slot *in = &rk->io.grad_down[gp.buf], *s = in;
    if (gp.mark)
        be->ops->wait_mark(be, gp.mark); /* that copy only, not the device */
    if (gp.micro > 0) {
        s = &rk->io.grad_trip;
        if (zr_shard_fetch(rk, b, FSO_KIND_GRAD, s) < 0 ||
            zr_slot_wait(rk, &rk->compute.err, s, "gradients", b) < 0)
            return;
        float *acc = s->buf;
        const float *add = in->buf;
        for (size_t i = 0; i < S; i++)
            acc[i] += add[i];
    }
    if (gp.last && z->boxes == 1) { /* across boxes: the slice's, after the rail (zero_rail.h) */
        rk->compute.grad_sq[b] = 0;
        fso_host_sqnorm(fso_backend_pool(be), &rk->compute.grad_sq[b], s->buf, S);
    }
    if (zr_shard_store(rk, b, FSO_KIND_GRAD, s) < 0 ||
        zr_slot_wait(rk, &rk->compute.err, s, "gradients", b) < 0)
        return;
    if (z->cfg->optimizer_overlap == FSO_OVERLAP_BACKWARD && gp.last)
        zr_optim_post_block(rk, &rk->opt.bwd_step, b);
}

/* fp32 values [begin, end) of ctx rounded to bf16 and kept as fp32 */
static void round_range(void *ctx, int64_t begin, int64_t end, int worker)
{
    (void)worker;
    float *full = ctx;
    for (int64_t i = begin; i < end; i++)
        full[i] = fso_f32_from_bf16(fso_bf16_from_f32(full[i]));
}

/* With bf16 gradients (train.gradient_dtype), the one place they are
 * rounded: a block's complete fp32 gradients in grad_full[g] (n values),
 * each to the nearest bf16 (ties to even), before any device adds them.
 * Where the reduce-scatter sends bf16 (grad_send[g], coll.h
 * reduce_scatter_bf16) the backend casts them there; devices the CPU
 * addresses compute on this thread and their reduces read grad_full[g] in
 * place, so it is rounded in place: an fp32 sum of those values in rank
 * order has the bits reduce_scatter_bf16 gives. */
static void round_grads(rank_state *rk, int g, size_t n)
{
    float *full = rk->compute.grad_full[g];
    if (rk->compute.grad_send[g]) {
        rk->be->ops->cast_f32_bf16(rk->be, rk->compute.grad_send[g], full, n);
        return;
    }
    fso_pool_for(fso_backend_pool(rk->be), (int64_t)n, 1 << 14, round_range, full);
}

/* Reduce-scatter the block's gradients so this rank keeps its shard. On a
 * device whose memory the CPU addresses (which computes on the caller's
 * thread), with the shard's tier in memory too, the shard is reduced
 * straight into its tier (the first micro-batch) or added there: no
 * staging copy, and its norm is taken where it lands. Otherwise it is
 * copied down and lands (grads_land) while the next block computes, or on
 * the device tier is added there at once. */
static void src_grads_done(void *ctx, int b)
{
    rank_state *rk = ctx;
    fso_zero *z = rk->z;
    fso_backend *be = rk->be;
    int g = rk->compute.grad_full_block[0] == b ? 0 : 1;
    size_t S = zr_shard_elems(z, b);
    float *mine = rk->compute.grad_full[g] + (size_t)rk->rank * S;
    const bool last = rk->compute.micro == z->cfg->grad_accum - 1;
    loc *l = zr_locate(rk, b, FSO_KIND_GRAD);
    const bool direct = z->rules.host_addressable && l->tier != FSO_TIER_NVME;

    /* shared reduces (CPU devices) add into the tier themselves, and take
     * the norm of a host-tier shard as they go */
    bool fused_norm = false;
    /* the whole block leaves */
    rk->compute.st.reduce_bytes += (uint64_t)z->world * S * fso_fp_reduce_elem_bytes(&z->rules);
    if (z->cfg->bf16_grads)
        round_grads(rk, g, (size_t)z->world * S);
    gather_ahead(rk);
    if (z->sc.on) {
        fused_norm = direct && last && l->tier == FSO_TIER_HOST && z->boxes == 1;
        if (fused_norm)
            rk->compute.grad_sq[b] = 0;
        sc_reduce(rk, g, S, direct ? l->ptr : mine, direct && rk->compute.micro > 0,
                  fused_norm ? &rk->compute.grad_sq[b] : NULL);
    } else if (rk->compute.grad_send[g]) {
        z->coll->ops->reduce_scatter_bf16(z->coll, rk->rank, rk->compute.grad_send[g],
                                          direct && rk->compute.micro == 0 ? l->ptr : mine, S);
    } else {
        z->coll->ops->reduce_scatter(z->coll, rk->rank, rk->compute.grad_full[g],
                                     direct && rk->compute.micro == 0 ? l->ptr : mine, S);
    }
    rk->compute.grad_full_block[g] = -1;
    /* what reads grad_full[g] from here on is before this mark (or, the
     * copy to the device tier, before all later compute) */
    rk->compute.grad_read[g] = zr_mark(be);
    if (rk->compute.err.rc)
        return;
    if (l->tier != FSO_TIER_DEVICE && !direct) {
        /* the staging buffer the pending block does not hold */
        int i = rk->io.landing.block >= 0 ? 1 - rk->io.landing.buf : 0;
        be->ops->copy_d2h(be, rk->io.grad_down[i].buf, mine, sizeof(float) * S);
        uint64_t m = zr_mark(be);
        rk->compute.grad_read[g] = m;
        zr_grads_land(rk);
        rk->io.landing = (grad_pending){.block = b, .buf = i, .mark = m, .micro = rk->compute.micro,
                                   .last = last};
        return;
    }
    if (rk->compute.micro > 0 && !z->sc.on) {
        /* compute reading what the reduce-scatter wrote: ordered after it
         * (backend.h order_after), which makes the next block's compute
         * wait for it too */
        fso_backend_order_after(be, rk->compute.grad_read[g]);
        be->ops->add(be, l->ptr, l->ptr, mine, S);
    } else if (!direct)
        be->ops->copy_h2d(be, l->ptr, mine, sizeof(float) * S);
    /* on the host, the host's sum, as grads_land takes it: the device's bits
     * (kernels/sum_order.h) */
    if (last && !fused_norm && z->boxes == 1) { /* across boxes: zr_rail_reduce_grads */
        rk->compute.grad_sq[b] = 0;
        if (l->tier == FSO_TIER_HOST)
            fso_host_sqnorm(fso_backend_pool(be), &rk->compute.grad_sq[b], l->ptr, S);
        else
            be->ops->sqnorm(be, &rk->compute.grad_sq[b], l->ptr, S);
    }
    /* the backward schedule: the update starts once the norm and the shard
     * are in, which the optimizer thread waits for (the job's mark), not
     * this one */
    if (z->cfg->optimizer_overlap == FSO_OVERLAP_BACKWARD && last && rk->compute.err.rc == 0)
        zr_optim_post_block(rk, &rk->opt.bwd_step, b);
}

/* Timing for the step report and the re-plan. The time inside params()
 * and grads_done() (reads, copies, gathers, gradients on their way) is
 * waiting, not compute. Compute between two callbacks belongs to the block
 * lent last, except that the head's visit also lends the embedding (tied
 * heads): that compute is the head's. */
void zr_clock_in(rank_state *rk, double now)
{
    if (rk->clock.cur_block >= 0)
        rk->clock.block_ms[rk->clock.cur_block] += now - rk->clock.t_mark;
}

static void clock_out(rank_state *rk, double now, int lent)
{
    const int head = rk->z->n_blocks - 1;
    if (lent >= 0 && !(lent == 0 && rk->clock.cur_block == head))
        rk->clock.cur_block = lent;
    rk->clock.t_mark = now;
}

static const void *timed_params(void *ctx, int b)
{
    rank_state *rk = ctx;
    double t0 = fso_now_ms();
    zr_clock_in(rk, t0);
    const void *p = src_params(ctx, b);
    double t1 = fso_now_ms();
    rk->clock.wait_ms += t1 - t0;
    clock_out(rk, t1, b);
    return p;
}

static void timed_release(void *ctx, int b)
{
    rank_state *rk = ctx;
    double t0 = fso_now_ms();
    zr_clock_in(rk, t0);
    src_release(ctx, b);
    clock_out(rk, fso_now_ms(), -1);
}

static float *timed_grads(void *ctx, int b)
{
    rank_state *rk = ctx;
    double t0 = fso_now_ms();
    zr_clock_in(rk, t0);
    float *g = src_grads(ctx, b);
    clock_out(rk, fso_now_ms(), b);
    return g;
}

static void timed_grads_done(void *ctx, int b)
{
    rank_state *rk = ctx;
    double t0 = fso_now_ms();
    zr_clock_in(rk, t0);
    src_grads_done(ctx, b);
    double t1 = fso_now_ms();
    rk->clock.wait_ms += t1 - t0;
    clock_out(rk, t1, -1);
}

fso_block_source zr_rank_source(rank_state *rk)
{
    fso_block_source s = {.ctx = rk, .params = timed_params, .release = timed_release,
                          .grads = timed_grads, .grads_done = timed_grads_done};
    return s;
}

void zr_source_reset(rank_state *rk)
{
    for (int g = 0; g < 2 && rk->z->sc.on; g++)
        if (rk->compute.gather_refs[g])
            sc_release(rk, g); /* a pass that ended holding a window lets go of it */
    rk->compute.gather_refs[0] = rk->compute.gather_refs[1] = 0;
    rk->compute.gather_block[0] = rk->compute.gather_block[1] = -1;
    rk->compute.grad_full_block[0] = rk->compute.grad_full_block[1] = -1;
    rk->compute.pre_block = -1;
    zr_lock(&rk->io.pf_mu);
    /* A forward-only pass ends with reads of the backward's blocks in flight,
     * into slots and window parts the next pass hands out again (the same
     * lend numbers): a late one would overwrite the new pass's block. */
    zr_drain_prefetch(rk);
    rk->compute.order_pos = 0;
    rk->compute.pass_lend = rk->compute.lends;
    for (int j = 0; j < rk->io.n_prefetch; j++) {
        rk->io.prefetch[j].block = -1;
        rk->io.prefetch[j].lend = -1;
    }
    zr_unlock(&rk->io.pf_mu);
}
