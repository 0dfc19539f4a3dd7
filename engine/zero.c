/* zero.c — sharded training state on device, host and NVMe tiers (zero.h). */
#include "zero.h"
#include "zero_impl.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "adamw.h"
#include "cpu_async.h"
#include "cuda_backend.h"
#include "optpool.h"
#include "pool.h"
#include "rng.h"
#include "topology.h"
#include "util.h"

#define MIB (1024.0 * 1024.0)
#define ARENA_ROUND ((size_t)2 << 20)

const char *const fso_zero_kind_names[FSO_N_KINDS] = {"parameters", "master weights", "AdamW m",
                                                    "AdamW v", "gradients"};
static const char *const tier_names[] = {"device", "host", "nvme"};


size_t fso_zero_shard_elems(const fso_zero *z, int b)
{
    return z->blocks[b].padded_elems / (size_t)z->world;
}

loc *fso_zero_locate(rank_state *rk, int b, fso_kind k)
{
    return &rk->locs[b * FSO_N_KINDS + k];
}

static void *arena_take(fso_zero *z, size_t bytes)
{
    size_t off = (z->arena_used + STAGE_ALIGN - 1) & ~(size_t)(STAGE_ALIGN - 1);
    if (off + bytes > z->arena_bytes) {
        fprintf(stderr, "%s:%d: host arena overrun (%zu + %zu > %zu)\n", __FILE__, __LINE__, off,
                bytes, z->arena_bytes);
        abort();
    }
    z->arena_used = off + bytes;
    return (char *)z->arena + off;
}

static size_t round_page(size_t b)
{
    return (b + STAGE_ALIGN - 1) & ~(size_t)(STAGE_ALIGN - 1);
}

/* Make [0, bytes) of the arena usable: commit the new part, lock or
 * register it with CUDA as the configuration asks (a refusal is one warning
 * and pageable memory), and tell the NVMe stores, whose registered buffers
 * cover the arena. */
static int arena_grow(fso_zero *z, size_t bytes, char *err, size_t errlen)
{
    char h1[32], h2[32];
    bytes = (bytes + ARENA_ROUND - 1) / ARENA_ROUND * ARENA_ROUND;
    if (bytes <= z->arena_bytes)
        return 0;
    if (bytes > z->arena_reserve) {
        fso_human_bytes(h1, sizeof h1, (double)bytes);
        fso_human_bytes(h2, sizeof h2, (double)z->arena_reserve);
        snprintf(err, errlen, "host memory: the host arena would need %s, more than the %s "
                              "reserved at start; restart with the new placement set in the "
                              "configuration", h1, h2);
        return -ENOMEM;
    }
    char *from = (char *)z->arena + z->arena_bytes;
    size_t len = bytes - z->arena_bytes;
    if (mprotect(from, len, PROT_READ | PROT_WRITE) != 0) {
        fso_human_bytes(h1, sizeof h1, (double)len);
        snprintf(err, errlen, "host memory: cannot commit %s more of the host arena: %s", h1,
                 strerror(errno));
        return -ENOMEM;
    }
    const bool first = z->arena_bytes == 0;
#if FSO_HAVE_CUDA
    if (z->cuda) {
        char cerr[256] = "";
        if (z->n_pinned + 1 < (int)(sizeof z->pinned_at / sizeof z->pinned_at[0]) &&
            (first || z->pinned_at[z->n_pinned] == z->arena_bytes) &&
            fso_cuda_host_register(from, len, cerr, sizeof cerr) == 0) {
            z->pinned_at[z->n_pinned] = z->arena_bytes;
            z->pinned_at[++z->n_pinned] = bytes;
        } else if (first || z->pinned_at[z->n_pinned] == z->arena_bytes) {
            fprintf(stderr, "fsoff: warning: pinning the host arena: %s; using pageable memory "
                            "(slower copies)\n", cerr[0] ? cerr : "too many registrations");
        }
    } else
#endif
    if (z->cfg->offload.pin_memory && (first || z->arena_locked)) {
        z->arena_locked = mlock(from, len) == 0;
        if (!z->arena_locked) {
            struct rlimit rl = {0};
            getrlimit(RLIMIT_MEMLOCK, &rl);
            fso_human_bytes(h1, sizeof h1, (double)rl.rlim_cur);
            fso_human_bytes(h2, sizeof h2, (double)bytes);
            fprintf(stderr, "fsoff: warning: pin_memory: RLIMIT_MEMLOCK is %s; pinning %s needs "
                            "`ulimit -l unlimited` (or a larger limit); using pageable memory\n",
                    rl.rlim_cur == RLIM_INFINITY ? "unlimited" : h1, h2);
            if (!first)
                munlock(z->arena, z->arena_bytes);
        }
    }
    z->arena_bytes = bytes;
    for (int r = 0; r < z->world && z->ranks; r++) {
        fso_store *st = z->ranks[r].store;
        if (st && st->ops->register_buffers &&
            st->ops->register_buffers(st, z->arena, z->arena_bytes) < 0 && r == 0)
            fprintf(stderr, "fsoff: warning: NVMe: %s; continuing with unregistered buffers "
                            "(slower)\n", st->err);
    }
    return 0;
}

/* Give back the pages of [p, p+bytes) of the arena (state that moved
 * elsewhere); CUDA-registered memory stays as it is. */
static void arena_release(fso_zero *z, void *p, size_t bytes)
{
    if (z->n_pinned)
        return;
    if (z->arena_locked)
        munlock(p, bytes);
    madvise(p, bytes, MADV_DONTNEED);
}

/* Host memory for device rk's state, on its NUMA node when the machine has
 * several (best effort). */
static void *rank_take(rank_state *rk, size_t bytes)
{
    void *p = arena_take(rk->z, bytes);
    if (rk->z->topo && rk->numa >= 0)
        fso_topo_bind_memory(rk->z->topo, p, bytes, rk->numa);
    return p;
}

/* ------------------------------------------------------------------ I/O */

int fso_zero_fail(errsink *es, int rc, const char *fmt, ...)
{
    if (es->rc == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(es->msg, sizeof es->msg, fmt, ap);
        va_end(ap);
        es->rc = rc;
    }
    return rc;
}

/* Reap at least one completion and account it to its slot. Called with
 * io_mu held: the compute and optimizer threads share the store's ring, and
 * either may reap the other's completions. */
static int reap_some(rank_state *rk, errsink *es)
{
    fso_io done[16];
    int n = rk->store->ops->reap(rk->store, done, 16, 1);
    if (n < 0)
        return fso_zero_fail(es, n, "device %d: NVMe store: %s", rk->rank, rk->store->err);
    for (int i = 0; i < n; i++) {
        slot *s = (slot *)(uintptr_t)done[i].user;
        s->pending--;
        if (done[i].res < 0 && s->err == 0)
            s->err = (int)done[i].res;
    }
    return 0;
}

int fso_zero_queue_io(rank_state *rk, errsink *es, slot *s, bool write, void *buf, size_t bytes,
                      uint64_t off)
{
    int rc = 0;
    pthread_mutex_lock(&rk->io_mu);
    for (;;) {
        rc = write ? rk->store->ops->prep_write(rk->store, buf, bytes, off, (uintptr_t)s)
                   : rk->store->ops->prep_read(rk->store, buf, bytes, off, (uintptr_t)s);
        if (rc == 0)
            break;
        if (rc != -EBUSY) {
            fso_zero_fail(es, rc, "device %d: NVMe %s of %zu bytes at %llu: %s", rk->rank,
                          write ? "write" : "read", bytes, (unsigned long long)off,
                          rk->store->err[0] ? rk->store->err : strerror(-rc));
            goto out;
        }
        int sr = rk->store->ops->submit(rk->store);
        if (sr < 0) {
            rc = fso_zero_fail(es, sr, "device %d: NVMe submit: %s", rk->rank, strerror(-sr));
            goto out;
        }
        if ((rc = reap_some(rk, es)) < 0)
            goto out;
    }
    s->pending++;
    int sr = rk->store->ops->submit(rk->store);
    if (sr < 0)
        rc = fso_zero_fail(es, sr, "device %d: NVMe submit: %s", rk->rank, strerror(-sr));
out:
    pthread_mutex_unlock(&rk->io_mu);
    return rc;
}

/* A mark of everything queued on be so far (0 where ops finish as they
 * return); a mark of the copies only (backend.h mark_copies, else a full
 * one); staging copies either way ordered after mark `after`. */
static uint64_t mark(fso_backend *be)
{
    return be->ops->mark ? be->ops->mark(be) : 0;
}

static uint64_t mark_copies(fso_backend *be)
{
    return be->ops->mark_copies ? be->ops->mark_copies(be) : mark(be);
}

static void copy_in(fso_backend *be, void *dst, const void *src, size_t bytes, uint64_t after)
{
    if (be->ops->copy_h2d_after)
        be->ops->copy_h2d_after(be, dst, src, bytes, after);
    else
        be->ops->copy_h2d(be, dst, src, bytes);
}

static void copy_out(fso_backend *be, void *dst, const void *src, size_t bytes, uint64_t after)
{
    if (be->ops->copy_d2h_after)
        be->ops->copy_d2h_after(be, dst, src, bytes, after);
    else
        be->ops->copy_d2h(be, dst, src, bytes);
}

/* The slot's last device copy is done (its buffer may be reused). */
static void copies_wait(rank_state *rk, slot *s)
{
    if (s->copied) {
        rk->be->ops->wait_mark(rk->be, s->copied);
        s->copied = 0;
    }
}

/* Wait for the slot's I/O and device copies; an error is final for the
 * step: never compute from a partial or stale shard. */
int fso_zero_slot_wait(rank_state *rk, errsink *es, slot *s, const char *what, int block)
{
    int rc = 0;
    copies_wait(rk, s);
    if (!rk->store)
        return 0;
    pthread_mutex_lock(&rk->io_mu);
    while (s->pending > 0 && rc == 0)
        rc = reap_some(rk, es);
    if (rc == 0 && s->err) {
        int e = s->err;
        s->err = 0;
        rc = fso_zero_fail(es, e, "device %d: NVMe I/O for block %d's %s failed: %s; the step "
                                  "was not applied (check the drive and `dmesg`)",
                           rk->rank, block, what, strerror(-e));
    }
    pthread_mutex_unlock(&rk->io_mu);
    return rc;
}

static bool addressable(const rank_state *rk, const loc *l)
{
    return l->tier == FSO_TIER_HOST || (l->tier == FSO_TIER_DEVICE && rk->be->ops->host_addressable);
}

void *fso_zero_xfer_dest(rank_state *rk, int b, fso_kind k, size_t c0, slot *s, bool in_place)
{
    loc *l = fso_zero_locate(rk, b, k);
    if (in_place && addressable(rk, l))
        return (char *)l->ptr + rk->z->elem_bytes[k] * c0;
    return s->buf;
}

int fso_zero_xfer(rank_state *rk, errsink *es, uint64_t *bytes_done, int b, fso_kind k,
                  size_t c0, size_t n, slot *s, bool write, bool in_place, void **ptr)
{
    loc *l = fso_zero_locate(rk, b, k);
    const size_t eb = rk->z->elem_bytes[k];
    size_t bytes = eb * n;
    void *shard = l->ptr ? (char *)l->ptr + eb * c0 : NULL;
    if (in_place && addressable(rk, l)) {
        if (!write)
            *ptr = shard;
        else if (*ptr != shard)
            memcpy(shard, *ptr, bytes);
        return 0;
    }
    if (!write)
        *ptr = s->buf;
    else if (*ptr != s->buf)
        memcpy(s->buf, *ptr, bytes);
    switch (l->tier) {
    case FSO_TIER_NVME:
        /* O_DIRECT: whole pages at page offsets. Chunks start at a multiple
         * of 4 KiB of the kind's bytes (see chunk_bytes in fso_zero_create);
         * a shard's last page may be part padding (bf16 shards are 2 KiB
         * multiples), and what the drive moves is what is counted */
        __atomic_fetch_add(bytes_done, round_page(bytes), __ATOMIC_RELAXED);
        return fso_zero_queue_io(rk, es, s, write, s->buf, round_page(bytes), l->off + eb * c0);
    case FSO_TIER_HOST:
        if (write)
            memcpy(shard, s->buf, bytes);
        else
            memcpy(s->buf, shard, bytes);
        return 0;
    case FSO_TIER_DEVICE: {
        fso_backend *be = rk->be;
        if (!be->ops->mark) { /* copies are done when they return */
            if (write)
                be->ops->copy_h2d(be, shard, s->buf, bytes);
            else
                be->ops->copy_d2h(be, s->buf, shard, bytes);
            return be->ops->sync(be);
        }
        /* ordered after the optimizer job's work only, and waited for by
         * fso_zero_slot_wait before the host touches s->buf again */
        const uint64_t after = es == &rk->oe ? rk->opt_after : 0;
        if (write)
            copy_in(be, shard, s->buf, bytes, after);
        else
            copy_out(be, s->buf, shard, bytes, after);
        s->copied = mark_copies(be);
        return 0;
    }
    }
    return -EINVAL;
}

/* Whole shard (b, k) into s->buf, and back (compute thread). */
static int shard_fetch(rank_state *rk, int b, fso_kind k, slot *s)
{
    void *p;
    return fso_zero_xfer(rk, &rk->ce, &rk->st.nvme_read_bytes, b, k, 0,
                         fso_zero_shard_elems(rk->z, b), s, false, false, &p);
}

static int shard_store(rank_state *rk, int b, fso_kind k, slot *s)
{
    void *p = s->buf;
    return fso_zero_xfer(rk, &rk->ce, &rk->st.nvme_write_bytes, b, k, 0,
                         fso_zero_shard_elems(rk->z, b), s, true, false, &p);
}

/* ------------------------------------------------------------------ block source */

/* Start reading parameter shards of the next blocks in the order, as far
 * as the ring allows. */
static int prefetch_params(rank_state *rk)
{
    fso_zero *z = rk->z;
    if (z->tier[FSO_KIND_PARAM] != FSO_TIER_NVME)
        return 0;
    int ahead = z->prefetch;
    for (int i = rk->order_pos; i < rk->order_pos + 1 + ahead && i < z->n_order; i++) {
        int b = z->order[i];
        /* never read a block the optimizer has not finished writing */
        pthread_mutex_lock(&rk->opt_mu);
        bool ready = rk->ready[b] >= z->step;
        pthread_mutex_unlock(&rk->opt_mu);
        if (!ready)
            break;
        bool have = false;
        for (int j = 0; j < rk->n_pslots; j++)
            if (rk->pslots[j].block == b)
                have = true;
        if (have)
            continue;
        /* a free slot: one whose block is not needed before position i;
         * of those, the one whose copy to the device is oldest (or done),
         * so that reusing it rarely waits */
        slot *s = NULL;
        for (int j = 0; j < rk->n_pslots; j++) {
            slot *c = &rk->pslots[j];
            bool needed = false;
            for (int q = rk->order_pos; q < i && c->block >= 0; q++)
                if (z->order[q] == c->block)
                    needed = true;
            if (!needed && c->pending == 0 && (!s || c->copied < s->copied))
                s = c;
        }
        if (!s)
            break;
        copies_wait(rk, s); /* its last copy to the device is done (long since, as a rule) */
        s->block = b;
        int rc = shard_fetch(rk, b, FSO_KIND_PARAM, s);
        if (rc < 0)
            return rc;
    }
    return 0;
}


/* Lend block b's full parameters, in their working type (bf16 or fp32: the
 * model's). The rank's shard is gathered from where it lives when the
 * collective can read it there, else staged on the device first, into the
 * window the model reads (world 1 on the device: the shard itself is
 * lent). */
static const void *src_params(void *ctx, int b)
{
    rank_state *rk = ctx;
    fso_zero *z = rk->z;
    fso_backend *be = rk->be;
    size_t S = fso_zero_shard_elems(z, b);
    const size_t eb = z->elem_bytes[FSO_KIND_PARAM], shard_bytes = eb * S;

    /* the previous step's update of this block must be in (overlapped schedules) */
    if (rk->ce.rc == 0)
        fso_zero_optim_wait_block(rk, b, z->step);
    if (z->alias_params)
        return fso_zero_locate(rk, b, FSO_KIND_PARAM)->ptr;
    int g = rk->gbuf_refs[0] == 0 ? 0 : 1;
    if (rk->gbuf_refs[g] != 0) {
        fprintf(stderr, "%s:%d: more than two blocks lent at once\n", __FILE__, __LINE__);
        abort();
    }
    /* the gather's target and the mark after which compute is done with
     * it: the staging copy and the gather wait for that only, so on a GPU
     * they run while the previous block computes */
    void *recv = rk->gbuf[g];
    uint64_t after = rk->gbuf_free[g];
    if (rk->ready_mark[b] > after) /* an update of the shard queued on the device */
        after = rk->ready_mark[b];
    void *mine = (char *)recv + (size_t)rk->rank * shard_bytes;
    const void *send = mine; /* this rank's shard, where the gather reads it */
    loc *l = fso_zero_locate(rk, b, FSO_KIND_PARAM);
    if (rk->ce.rc == 0) {
        if (l->tier == FSO_TIER_DEVICE ||
            (l->tier == FSO_TIER_HOST && be->ops->host_addressable)) {
            send = l->ptr; /* gathered straight from where it lives */
        } else if (l->tier == FSO_TIER_HOST) {
            copy_in(be, mine, l->ptr, shard_bytes, after);
        } else {
            /* the order must match the model's: it is the same on every rank */
            if (rk->order_pos >= z->n_order || z->order[rk->order_pos] != b) {
                fprintf(stderr, "%s:%d: block %d asked out of order\n", __FILE__, __LINE__, b);
                abort();
            }
            prefetch_params(rk);
            slot *s = NULL;
            for (int j = 0; j < rk->n_pslots; j++)
                if (rk->pslots[j].block == b)
                    s = &rk->pslots[j];
            double t0 = fso_now_ms();
            int wrc = s ? fso_zero_slot_wait(rk, &rk->ce, s, "parameters", b) : -EIO;
            rk->st.stall_ms += fso_now_ms() - t0;
            if (wrc == 0) {
                copy_in(be, mine, s->buf, shard_bytes, after);
                /* the slot may be read into again once this copy is done:
                 * prefetch_params waits for that, not for compute */
                s->copied = mark_copies(be);
            }
            if (s)
                s->block = -1;
            rk->order_pos++;
            prefetch_params(rk);
        }
    }
    /* Every rank joins the gather even after a failure, so no rank waits
     * forever; the step is discarded afterwards. */
    z->coll->ops->all_gather(z->coll, rk->rank, send, recv, S,
                             eb == sizeof(float) ? FSO_COLL_F32 : FSO_COLL_BF16, after);
    rk->gbuf_block[g] = b;
    rk->gbuf_refs[g] = 1;
    return rk->gbuf[g];
}

static void src_release(void *ctx, int b)
{
    rank_state *rk = ctx;
    if (rk->z->alias_params)
        return;
    for (int g = 0; g < 2; g++)
        if (rk->gbuf_refs[g] && rk->gbuf_block[g] == b) {
            rk->gbuf_refs[g] = 0;
            rk->gbuf_block[g] = -1;
            rk->gbuf_free[g] = mark(rk->be); /* compute with it is all queued */
            return;
        }
}

static float *src_grads(void *ctx, int b)
{
    rank_state *rk = ctx;
    int g = rk->gradbuf_block[0] < 0 ? 0 : 1;
    rk->gradbuf_block[g] = b;
    rk->be->ops->memset0(rk->be, rk->gradbuf[g], sizeof(float) * rk->z->blocks[b].padded_elems);
    return rk->gradbuf[g];
}

/* A block's gradient shard, copied down from the device, lands in its tier:
 * added to what earlier micro-batches left there (the first micro-batch of
 * a step overwrites it), its squared norm taken after the step's last
 * micro-batch (the same chunked host sum on every tier, so the norm has the
 * same bits wherever the gradients live), stored, and with the backward
 * schedule the block's update started. Runs one block behind the copies,
 * so the host works while the device copies the next block's shard. */
static void grads_land(rank_state *rk)
{
    grad_pending gp = rk->gpend;
    if (gp.block < 0)
        return;
    rk->gpend.block = -1;
    if (rk->ce.rc)
        return;
    fso_zero *z = rk->z;
    fso_backend *be = rk->be;
    const int b = gp.block;
    const size_t S = fso_zero_shard_elems(z, b);
    slot *in = &rk->gdown[gp.buf], *s = in;
    if (gp.mark)
        be->ops->wait_mark(be, gp.mark); /* that copy only, not the device */
    if (gp.micro > 0) {
        s = &rk->gslot;
        if (shard_fetch(rk, b, FSO_KIND_GRAD, s) < 0 ||
            fso_zero_slot_wait(rk, &rk->ce, s, "gradients", b) < 0)
            return;
        float *acc = s->buf;
        const float *add = in->buf;
        for (size_t i = 0; i < S; i++)
            acc[i] += add[i];
    }
    if (gp.last) {
        rk->block_sq[b] = 0;
        fso_host_sqnorm(fso_backend_pool(be), &rk->block_sq[b], s->buf, S);
    }
    if (shard_store(rk, b, FSO_KIND_GRAD, s) < 0 ||
        fso_zero_slot_wait(rk, &rk->ce, s, "gradients", b) < 0)
        return;
    if (z->cfg->optimizer_overlap == FSO_OVERLAP_BACKWARD && gp.last)
        fso_zero_optim_post_block(rk, &rk->bwd_as, b);
}

/* Reduce-scatter the block's gradients so this rank keeps its shard; on
 * the device tier add it there at once, else copy it down and let it land
 * (grads_land) while the next block computes. */
static void src_grads_done(void *ctx, int b)
{
    rank_state *rk = ctx;
    fso_zero *z = rk->z;
    fso_backend *be = rk->be;
    int g = rk->gradbuf_block[0] == b ? 0 : 1;
    size_t S = fso_zero_shard_elems(z, b);
    float *mine = rk->gradbuf[g] + (size_t)rk->rank * S;
    const bool last = rk->micro == z->cfg->grad_accum - 1;

    z->coll->ops->reduce_scatter(z->coll, rk->rank, rk->gradbuf[g], mine, S);
    rk->gradbuf_block[g] = -1;
    if (rk->ce.rc)
        return;
    loc *l = fso_zero_locate(rk, b, FSO_KIND_GRAD);
    if (l->tier != FSO_TIER_DEVICE) {
        /* the staging buffer the pending block does not hold */
        int i = rk->gpend.block >= 0 ? 1 - rk->gpend.buf : 0;
        be->ops->copy_d2h(be, rk->gdown[i].buf, mine, sizeof(float) * S);
        uint64_t m = mark(be);
        grads_land(rk);
        rk->gpend = (grad_pending){.block = b, .buf = i, .mark = m, .micro = rk->micro,
                                   .last = last};
        return;
    }
    if (rk->micro == 0)
        be->ops->copy_h2d(be, l->ptr, mine, sizeof(float) * S);
    else
        be->ops->add(be, l->ptr, l->ptr, mine, S);
    if (last) {
        rk->block_sq[b] = 0;
        be->ops->sqnorm(be, &rk->block_sq[b], l->ptr, S);
    }
    /* the backward schedule: the update starts once the norm and the shard
     * are in, which the optimizer thread waits for (the job's mark), not
     * this one */
    if (z->cfg->optimizer_overlap == FSO_OVERLAP_BACKWARD && last && rk->ce.rc == 0)
        fso_zero_optim_post_block(rk, &rk->bwd_as, b);
}

/* Timing for the step report and the re-plan. The time inside params()
 * and grads_done() (reads, copies, gathers, gradients on their way) is
 * waiting, not compute. Compute between two callbacks belongs to the block
 * lent last, except that the head's visit also lends the embedding (tied
 * heads): that compute is the head's. */
static void clock_in(rank_state *rk, double now)
{
    if (rk->cur_block >= 0)
        rk->block_ms[rk->cur_block] += now - rk->t_mark;
}

static void clock_out(rank_state *rk, double now, int lent)
{
    const int head = rk->z->n_blocks - 1;
    if (lent >= 0 && !(lent == 0 && rk->cur_block == head))
        rk->cur_block = lent;
    rk->t_mark = now;
}

static const void *timed_params(void *ctx, int b)
{
    rank_state *rk = ctx;
    double t0 = fso_now_ms();
    clock_in(rk, t0);
    const void *p = src_params(ctx, b);
    double t1 = fso_now_ms();
    rk->wait_ms += t1 - t0;
    clock_out(rk, t1, b);
    return p;
}

static void timed_release(void *ctx, int b)
{
    rank_state *rk = ctx;
    double t0 = fso_now_ms();
    clock_in(rk, t0);
    src_release(ctx, b);
    clock_out(rk, fso_now_ms(), -1);
}

static float *timed_grads(void *ctx, int b)
{
    rank_state *rk = ctx;
    double t0 = fso_now_ms();
    clock_in(rk, t0);
    float *g = src_grads(ctx, b);
    clock_out(rk, fso_now_ms(), b);
    return g;
}

static void timed_grads_done(void *ctx, int b)
{
    rank_state *rk = ctx;
    double t0 = fso_now_ms();
    clock_in(rk, t0);
    src_grads_done(ctx, b);
    double t1 = fso_now_ms();
    rk->wait_ms += t1 - t0;
    clock_out(rk, t1, -1);
}

static fso_block_source rank_source(rank_state *rk)
{
    fso_block_source s = {.ctx = rk, .params = timed_params, .release = timed_release,
                          .grads = timed_grads, .grads_done = timed_grads_done};
    return s;
}

/* ------------------------------------------------------------------ steps */

static void reset_rank_step(rank_state *rk)
{
    rk->order_pos = 0;
    rk->gbuf_refs[0] = rk->gbuf_refs[1] = 0;
    rk->gbuf_block[0] = rk->gbuf_block[1] = -1;
    rk->gradbuf_block[0] = rk->gradbuf_block[1] = -1;
    for (int j = 0; j < rk->n_pslots; j++)
        rk->pslots[j].block = -1;
}

/* Drain the I/O this thread left in flight after a failure so its buffers
 * can be reused (with_optimizer: the optimizer's too, once it has stopped). */
static void drain_slots(rank_state *rk, bool with_optimizer)
{
    if (!rk->store)
        return;
    slot *all[MAX_PARAM_SLOTS + 2 * FSO_N_KINDS + 1];
    int n = 0;
    for (int j = 0; j < rk->n_pslots; j++)
        all[n++] = &rk->pslots[j];
    all[n++] = &rk->gslot;
    if (with_optimizer)
        for (int set = 0; set < 2; set++)
            for (int k = 0; k < FSO_N_KINDS; k++)
                all[n++] = &rk->ochunk[set][k];
    errsink ignore = {0};
    pthread_mutex_lock(&rk->io_mu);
    for (int i = 0; i < n; i++) {
        while (all[i]->pending > 0)
            if (reap_some(rk, &ignore) < 0)
                break;
        all[i]->err = 0;
    }
    pthread_mutex_unlock(&rk->io_mu);
}

static void drain(rank_state *rk)
{
    drain_slots(rk, false);
}

static fso_adamw_step step_hparams(const fso_zero *z, double clip_coef)
{
    const fso_config *cfg = z->cfg;
    fso_adamw_step as = {
        .lr = fso_config_lr_at(cfg, z->step + 1),
        .beta1 = cfg->optim.beta1,
        .beta2 = cfg->optim.beta2,
        .eps = cfg->optim.eps,
        .grad_scale = clip_coef,
        .t = z->step + 1,
    };
    return as;
}

static void *rank_step(void *arg)
{
    rank_state *rk = arg;
    fso_zero *z = rk->z;
    const fso_config *cfg = z->cfg;
    const size_t bt = (size_t)cfg->micro_batch * cfg->data.seq_len;
    fso_block_source src = rank_source(rk);
    float grad_scale = 1.0f / (float)(cfg->grad_accum * z->world);

    memset(&rk->st, 0, sizeof rk->st);
    rk->loss_sum = 0;
    rk->wait_ms = 0;
    rk->bwd_as = step_hparams(z, 1.0); /* clipping is off in the backward schedule */
    memset(rk->block_ms, 0, sizeof *rk->block_ms * (size_t)z->n_blocks);
    double t0 = fso_now_ms();
    for (int a = 0; a < cfg->grad_accum; a++) {
        reset_rank_step(rk);
        rk->micro = a;
        rk->cur_block = -1;
        rk->t_mark = fso_now_ms();
        size_t mb = (size_t)a * z->world + rk->rank;
        fso_model_step(&rk->model, &src, rk->inputs + mb * bt, rk->targets + mb * bt,
                       grad_scale, &rk->loss_sum);
        clock_in(rk, fso_now_ms()); /* the last block's compute */
        /* the micro-batch's last gradients land while the next one's
         * forward runs (the next landing comes first), or now at the end */
    }
    grads_land(rk);
    rk->st.compute_ms = fso_now_ms() - t0 - rk->wait_ms;

    /* exact global norm and mean loss: one all-reduce (also carries
     * failures); block norms are added in block order on every schedule.
     * The norms taken on the device are in once the backend has synced:
     * the step's one wait for the device. */
    int drc = rk->ce.rc == 0 ? rk->be->ops->sync(rk->be) : 0;
    if (drc < 0)
        fso_zero_fail(&rk->ce, drc, "device %d: %s", rk->rank, rk->be->err);
    double sq = 0;
    for (int b = 0; b < z->n_blocks && rk->ce.rc == 0; b++)
        sq += rk->block_sq[b];
    double red[3] = {rk->loss_sum, sq, rk->ce.rc ? 1.0 : 0.0};
    z->coll->ops->all_reduce_f64(z->coll, rk->rank, red, 3);
    rk->st.loss = red[0] / ((double)bt * cfg->grad_accum * z->world);
    rk->st.grad_norm = sqrt(red[1]);
    if (red[2] != 0) { /* some rank failed: nobody updates */
        if (rk->ce.rc == 0)
            fso_zero_fail(&rk->ce, -ECANCELED, "device %d: another device failed", rk->rank);
        drain(rk);
        return NULL;
    }
    if (!isfinite(rk->st.loss) || !isfinite(rk->st.grad_norm)) {
        if (cfg->optimizer_overlap == FSO_OVERLAP_BACKWARD) {
            /* blocks were updated as their gradients came in: say which
             * was not, as the optimizer thread found it */
            if (fso_zero_optim_wait_all(rk) == 0)
                fso_zero_fail(&rk->ce, -ERANGE,
                              "step %lld: loss %g, gradient norm %g: training diverged; "
                              "train.optimizer_overlap \"backward\" had already updated every "
                              "block; lower optimizer.params.lr",
                              (long long)(z->step + 1), rk->st.loss, rk->st.grad_norm);
            return NULL;
        }
        fso_zero_fail(&rk->ce, -ERANGE,
                      "step %lld: loss %g, gradient norm %g: training diverged and the update was "
                      "not applied; lower optimizer.params.lr or set gradient_clipping",
                      (long long)(z->step + 1), rk->st.loss, rk->st.grad_norm);
        return NULL;
    }
    rk->st.clip_coef = 1.0;
    if (cfg->grad_clip > 0) {
        double coef = cfg->grad_clip / (rk->st.grad_norm + 1e-6);
        if (coef < 1.0)
            rk->st.clip_coef = coef;
    }
    fso_adamw_step as = step_hparams(z, rk->st.clip_coef);
    rk->st.lr = as.lr;
    if (cfg->optimizer_overlap == FSO_OVERLAP_NONE) {
        if (fso_zero_optim_run(rk, &as) < 0)
            drain(rk);
    } else if (cfg->optimizer_overlap == FSO_OVERLAP_FORWARD) {
        fso_zero_optim_post_step(rk, &as);
    }
    pthread_mutex_lock(&rk->opt_mu);
    rk->st.optimizer_ms = rk->opt_busy_ms;
    rk->st.nvme_read_bytes += __atomic_exchange_n(&rk->opt_read_bytes, 0, __ATOMIC_RELAXED);
    rk->st.nvme_write_bytes += __atomic_exchange_n(&rk->opt_write_bytes, 0, __ATOMIC_RELAXED);
    rk->opt_busy_ms = 0;
    pthread_mutex_unlock(&rk->opt_mu);
    return NULL;
}

int fso_zero_finish(fso_zero *z, double *waited_ms, char *err, size_t errlen)
{
    int rc = 0;
    *waited_ms = 0;
    for (int r = 0; r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        rk->ce.rc = 0;
        rk->st.optimizer_exposed_ms = 0;
        int e = fso_zero_optim_wait_all(rk);
        if (r == 0)
            *waited_ms = rk->st.optimizer_exposed_ms;
        if (e < 0 && rc == 0) {
            rc = e;
            snprintf(err, errlen, "%s", rk->ce.msg);
        }
    }
    return rc;
}

/* A device's thread: bound near its device once, then one job per call of
 * run_ranks until the trainer goes away. */
typedef struct worker_arg {
    fso_zero *z;
    int rank;
} worker_arg;

static void *worker_main(void *arg)
{
    fso_zero *z = ((worker_arg *)arg)->z;
    rank_state *rk = &z->ranks[((worker_arg *)arg)->rank];
    free(arg);
    if (z->topo && rk->numa >= 0)
        fso_topo_bind_thread(z->topo, rk->numa);
    uint64_t seen = 0;
    pthread_mutex_lock(&z->run_mu);
    for (;;) {
        while (!z->quit && z->job_gen == seen)
            pthread_cond_wait(&z->run_cv, &z->run_mu);
        if (z->quit)
            break;
        seen = z->job_gen;
        void *(*fn)(void *) = z->job;
        pthread_mutex_unlock(&z->run_mu);
        fn(rk);
        pthread_mutex_lock(&z->run_mu);
        if (--z->job_left == 0)
            pthread_cond_signal(&z->done_cv);
    }
    pthread_mutex_unlock(&z->run_mu);
    return NULL;
}

static int start_workers(fso_zero *z, char *err, size_t errlen)
{
    pthread_mutex_init(&z->run_mu, NULL);
    pthread_cond_init(&z->run_cv, NULL);
    pthread_cond_init(&z->done_cv, NULL);
    z->run_init = true;
    for (int r = 1; r < z->world; r++) {
        worker_arg *a = malloc(sizeof *a);
        int e = a ? 0 : ENOMEM;
        if (a) {
            *a = (worker_arg){z, r};
            e = pthread_create(&z->workers[r], NULL, worker_main, a);
            if (e)
                free(a);
        }
        if (e) {
            snprintf(err, errlen, "cannot start the thread of device %d: %s", r, strerror(e));
            return -e;
        }
        z->n_workers = r;
    }
    return 0;
}

static void stop_workers(fso_zero *z)
{
    if (!z->run_init)
        return;
    pthread_mutex_lock(&z->run_mu);
    z->quit = true;
    pthread_cond_broadcast(&z->run_cv);
    pthread_mutex_unlock(&z->run_mu);
    for (int r = 1; r <= z->n_workers; r++)
        pthread_join(z->workers[r], NULL);
    pthread_cond_destroy(&z->run_cv);
    pthread_cond_destroy(&z->done_cv);
    pthread_mutex_destroy(&z->run_mu);
    z->run_init = false;
}

/* Run fn on every device, device 0 on the caller's thread, and wait. */
static int run_ranks(fso_zero *z, void *(*fn)(void *))
{
    int rc = 0;
    for (int r = 0; r < z->world; r++)
        z->ranks[r].ce.rc = 0;
    if (!z->caller_bound && z->topo && z->ranks[0].numa >= 0)
        fso_topo_bind_thread(z->topo, z->ranks[0].numa);
    z->caller_bound = true;
    pthread_mutex_lock(&z->run_mu);
    z->job = fn;
    z->job_left = z->world - 1;
    z->job_gen++;
    pthread_cond_broadcast(&z->run_cv);
    pthread_mutex_unlock(&z->run_mu);
    fn(&z->ranks[0]);
    pthread_mutex_lock(&z->run_mu);
    while (z->job_left > 0)
        pthread_cond_wait(&z->done_cv, &z->run_mu);
    pthread_mutex_unlock(&z->run_mu);
    for (int r = 0; r < z->world; r++)
        if (z->ranks[r].ce.rc && (rc == 0 || rc == -ECANCELED))
            rc = z->ranks[r].ce.rc;
    return rc;
}

static void first_error(const fso_zero *z, char *err, size_t errlen)
{
    for (int r = 0; r < z->world; r++)
        if (z->ranks[r].ce.rc && z->ranks[r].ce.rc != -ECANCELED) {
            snprintf(err, errlen, "%s", z->ranks[r].ce.msg);
            return;
        }
    snprintf(err, errlen, "%s", z->ranks[0].ce.msg);
}

int fso_zero_step_run(fso_zero *z, int64_t step, const int32_t *inputs, const int32_t *targets,
                      fso_zero_step *st, char *err, size_t errlen)
{
    (void)step;
    for (int r = 0; r < z->world; r++) {
        z->ranks[r].inputs = inputs;
        z->ranks[r].targets = targets;
    }
    int rc = run_ranks(z, rank_step);
    *st = z->ranks[0].st;
    st->nvme_read_bytes = st->nvme_write_bytes = 0;
    /* the optimizer thread counts NVMe bytes into the same fields */
    for (int r = 0; r < z->world; r++) {
        st->nvme_read_bytes += z->ranks[r].st.nvme_read_bytes;
        st->nvme_write_bytes += z->ranks[r].st.nvme_write_bytes;
    }
    if (rc < 0) {
        first_error(z, err, errlen);
        return rc;
    }
    z->step++;
    return 0;
}

/* ------------------------------------------------------------------ whole-model copies */

/* Host copies of every block's flat buffer (padded_elems each). */
static float **flat_alloc(const fso_zero *z)
{
    float **flat = calloc((size_t)z->n_blocks, sizeof *flat);
    if (!flat)
        return NULL;
    for (int b = 0; b < z->n_blocks; b++)
        if (!(flat[b] = calloc(z->blocks[b].padded_elems, sizeof(float)))) {
            for (int i = 0; i < b; i++)
                free(flat[i]);
            free(flat);
            return NULL;
        }
    return flat;
}

static void flat_free(const fso_zero *z, float **flat)
{
    for (int b = 0; flat && b < z->n_blocks; b++)
        free(flat[b]);
    free(flat);
}

/* n fp32 values into elements of elem_bytes (4: fp32, 2: bf16 rounded to
 * nearest even, as the optimizer writes them), and back (exact). */
static void narrow(void *dst, size_t elem_bytes, const float *src, size_t n)
{
    if (elem_bytes == sizeof(float)) {
        memcpy(dst, src, sizeof(float) * n);
        return;
    }
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++)
        d[i] = fso_bf16_from_f32(src[i]);
}

static void widen(float *dst, const void *src, size_t elem_bytes, size_t n)
{
    if (elem_bytes == sizeof(float)) {
        memcpy(dst, src, sizeof(float) * n);
        return;
    }
    const uint16_t *h = src;
    for (size_t i = 0; i < n; i++)
        dst[i] = fso_f32_from_bf16(h[i]);
}

/* Copy kind k of block b's shards on every rank from (dir 0) or to (dir 1)
 * the flat fp32 host buffer, converting to and from the kind's element
 * type. Runs on the caller's thread, synchronously. */
static int block_xfer(fso_zero *z, int b, float *flat, fso_kind k, int dir)
{
    size_t S = fso_zero_shard_elems(z, b);
    for (int r = 0; r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        slot *s = &rk->gslot;
        int rc;
        rk->ce.rc = 0;
        if (dir == 0) {
            narrow(s->buf, z->elem_bytes[k], flat + (size_t)r * S, S);
            rc = shard_store(rk, b, k, s);
            if (rc == 0)
                rc = fso_zero_slot_wait(rk, &rk->ce, s, fso_zero_kind_names[k], b);
        } else {
            rc = shard_fetch(rk, b, k, s);
            if (rc == 0)
                rc = fso_zero_slot_wait(rk, &rk->ce, s, fso_zero_kind_names[k], b);
            if (rc == 0)
                widen(flat + (size_t)r * S, s->buf, z->elem_bytes[k], S);
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int shards_xfer(fso_zero *z, float **flat, fso_kind k, int dir)
{
    for (int b = 0; b < z->n_blocks; b++) {
        int rc = block_xfer(z, b, flat[b], k, dir);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int load_flat(fso_zero *z, float **flat, char *err, size_t errlen)
{
    int rc;
    if ((rc = shards_xfer(z, flat, FSO_KIND_PARAM, 0)) < 0 ||
        (rc = shards_xfer(z, flat, FSO_KIND_MASTER, 0)) < 0)
        first_error(z, err, errlen);
    return rc;
}

/* Before a whole-model copy: every update in, and host buffers for all
 * blocks. NULL with err set on failure (*rc says why). */
static float **whole_copy_begin(fso_zero *z, const char *what, int *rc, char *err, size_t errlen)
{
    double waited;
    if ((*rc = fso_zero_finish(z, &waited, err, errlen)) < 0)
        return NULL;
    float **flat = flat_alloc(z);
    if (!flat) {
        snprintf(err, errlen, "out of host memory copying %s", what);
        *rc = -ENOMEM;
    }
    return flat;
}

int fso_zero_load_hf(fso_zero *z, const float *hf, char *err, size_t errlen)
{
    int rc;
    float **flat = whole_copy_begin(z, "parameters", &rc, err, errlen);
    if (!flat)
        return rc;
    fso_model_flat_from_hf(&z->ranks[0].model, flat, hf);
    rc = load_flat(z, flat, err, errlen);
    flat_free(z, flat);
    return rc;
}

static int store_kind_hf(fso_zero *z, fso_kind k, float *hf, char *err, size_t errlen)
{
    int rc;
    float **flat = whole_copy_begin(z, fso_zero_kind_names[k], &rc, err, errlen);
    if (!flat)
        return rc;
    rc = shards_xfer(z, flat, k, 1);
    if (rc < 0)
        first_error(z, err, errlen);
    else
        fso_model_flat_to_hf(&z->ranks[0].model, flat, hf);
    flat_free(z, flat);
    return rc;
}

int fso_zero_store_hf(fso_zero *z, float *hf, char *err, size_t errlen)
{
    return store_kind_hf(z, FSO_KIND_MASTER, hf, err, errlen);
}

int fso_zero_store_grads_hf(fso_zero *z, float *hf, char *err, size_t errlen)
{
    return store_kind_hf(z, FSO_KIND_GRAD, hf, err, errlen);
}

int fso_zero_store_working_hf(fso_zero *z, float *hf, char *err, size_t errlen)
{
    return store_kind_hf(z, FSO_KIND_PARAM, hf, err, errlen);
}

static void *rank_logits(void *arg)
{
    rank_state *rk = arg;
    fso_block_source src = rank_source(rk);
    reset_rank_step(rk);
    fso_model_forward_logits(&rk->model, &src, rk->inputs, rk->logits);
    return NULL;
}

int fso_zero_forward_logits(fso_zero *z, const int32_t *inputs, float *logits, char *err,
                            size_t errlen)
{
    double waited;
    int wrc = fso_zero_finish(z, &waited, err, errlen);
    if (wrc < 0)
        return wrc;
    /* Every rank must join the gathers; ranks other than 0 write their
     * logits to scratch. */
    const fso_model *m = &z->ranks[0].model;
    size_t n = (size_t)m->B * m->T * m->mc.vocab_size;
    float *scratch = z->world > 1 ? malloc(sizeof(float) * n) : NULL;
    if (z->world > 1 && !scratch) {
        snprintf(err, errlen, "out of host memory for logits");
        return -ENOMEM;
    }
    for (int r = 0; r < z->world; r++) {
        z->ranks[r].inputs = inputs;
        z->ranks[r].logits = r == 0 ? logits : scratch;
    }
    int rc = run_ranks(z, rank_logits);
    free(scratch);
    if (rc < 0)
        first_error(z, err, errlen);
    return rc;
}

/* ------------------------------------------------------------------ setup */

int fso_zero_inject_faults(fso_zero *z, int rank, const fso_fault_spec *spec)
{
    rank_state *rk = &z->ranks[rank];
    if (!rk->store)
        return -ENOENT;
    fso_store *wrapped = NULL;
    int rc = fso_store_wrap_faults(&wrapped, rk->store, spec);
    if (rc == 0)
        rk->store = wrapped;
    return rc;
}

uint64_t fso_zero_host_arena_bytes(const fso_zero *z)
{
    return z->arena_bytes;
}

const double *fso_zero_block_compute_ms(const fso_zero *z)
{
    return z->ranks[0].block_ms;
}

const fso_model *fso_zero_model(const fso_zero *z)
{
    return &z->ranks[0].model;
}

uint64_t fso_zero_peak_device_bytes(const fso_zero *z)
{
    uint64_t peak = 0;
    for (int r = 0; r < z->world; r++)
        if (z->ranks[r].be && z->ranks[r].be->mem_peak_bytes > peak)
            peak = z->ranks[r].be->mem_peak_bytes;
    return peak;
}


void fso_zero_describe(const fso_zero *z, char *buf, size_t len)
{
    size_t per_kind[FSO_N_KINDS] = {0};
    for (int b = 0; b < z->n_blocks; b++)
        for (int k = 0; k < FSO_N_KINDS; k++)
            per_kind[k] += z->elem_bytes[k] * z->blocks[b].padded_elems;
    size_t off = 0;
    for (int k = 0; k < FSO_N_KINDS && off < len; k++) {
        char h[32];
        fso_human_bytes(h, sizeof h, (double)per_kind[k]);
        off += (size_t)snprintf(buf + off, len - off, "%s%s %s on %s", k ? ", " : "",
                                fso_zero_kind_names[k], h, tier_names[z->tier[k]]);
    }
    if (z->tier[FSO_KIND_PARAM] == FSO_TIER_NVME && off < len)
        off += (size_t)snprintf(buf + off, len - off, ", %d block%s read ahead", z->prefetch,
                                z->prefetch == 1 ? "" : "s");
    for (int r = 0; z->topo && r < z->world && off < len; r++)
        off += (size_t)snprintf(buf + off, len - off, "%s%d", r ? "," : "; NUMA node per device ",
                                z->ranks[r].numa);
}



/* On a machine with several NUMA nodes, the node of each device (a GPU's
 * by its PCI bus id, CPU devices spread over the nodes): its thread, its
 * optimizer threads and its share of the host arena go there. */
static void place_near_devices(fso_zero *z)
{
    fso_topo *t = NULL;
    char terr[256];
    if (z->world > 64 || fso_topo_node_count() < 2 ||
        fso_topo_create(&t, NULL, terr, sizeof terr) < 0)
        return;
    if (t->n_numa > 1) {
        int nodes[64];
        const char *bus[64] = {NULL};
#if FSO_HAVE_CUDA
        fso_gpu_info gi[64];
        for (int r = 0; z->cuda && r < z->world; r++)
            if (fso_gpu_info_query(r, &gi[r], terr, sizeof terr) == 0)
                bus[r] = gi[r].pci_bus_id;
#endif
        fso_topo_home_nodes(t, z->world, z->cuda ? bus : NULL, nodes);
        for (int r = 0; r < z->world; r++)
            z->ranks[r].numa = nodes[r];
        z->topo = t;
        t = NULL;
    }
    fso_topo_destroy(t);
}

/* Device rk's NVMe store over the folders the offload settings name,
 * `capacity` bytes, its buffers registered over the arena. */
static int open_store(fso_zero *z, rank_state *rk, const fso_offload_config *o,
                      uint64_t capacity, char *err, size_t errlen)
{
    char paths[4096], prefix[64], serr[512] = "";
    const char *src = o->optim_tier == FSO_TIER_NVME ? o->optim_nvme_path : o->param_nvme_path;
    if (!src[0])
        src = o->optim_nvme_path[0] ? o->optim_nvme_path : o->param_nvme_path;
    fso_store_opts so = {0};
    snprintf(paths, sizeof paths, "%s", src);
    so.ndirs = fso_split_list(paths, ',', so.dirs, FSO_STORE_MAX_DIRS);
    if (so.ndirs < 0) {
        snprintf(err, errlen, "NVMe: %s: more than %d folders; stripe over at most %d", src,
                 FSO_STORE_MAX_DIRS, FSO_STORE_MAX_DIRS);
        return -E2BIG;
    }
    if (so.ndirs == 0) {
        snprintf(err, errlen, "NVMe: state goes to NVMe but no folder is named; give --nvme DIR");
        return -EINVAL;
    }
    cpu_set_t near; /* the I/O workers near the first folder's drive */
    fso_topo_disk disk;
    char derr[256];
    if (z->topo && fso_topo_disk_of_path(z->topo, so.dirs[0], &disk, derr, sizeof derr) == 0 &&
        disk.numa >= 0 && fso_topo_node_cpus(z->topo, disk.numa, &near) > 0)
        so.iowq_cpus = &near;
    so.capacity_bytes = capacity;
    so.block_bytes = (size_t)o->aio_block_bytes;
    so.queue_depth = o->aio_queue_depth;
    so.direct = true;
    snprintf(prefix, sizeof prefix, "fsoff-dev%d", rk->rank);
    so.file_prefix = prefix;
    int rc = fso_store_open_uring(&rk->store, &so, serr, sizeof serr);
    if (rc < 0) {
        snprintf(err, errlen, "NVMe: %s", serr);
        return rc;
    }
    if (rk->store->ops->register_buffers && z->arena_bytes &&
        rk->store->ops->register_buffers(rk->store, z->arena, z->arena_bytes) < 0 &&
        rk->rank == 0)
        fprintf(stderr, "fsoff: warning: NVMe: %s; continuing with unregistered buffers "
                        "(slower)\n", rk->store->err);
    return 0;
}

int fso_zero_create(fso_zero **out, const fso_config *cfg, char *err, size_t errlen)
{
    fso_zero *z = calloc(1, sizeof *z);
    int rc = 0;
    char h1[32], h2[32], h3[32], h4[32], h5[32];
    if (!z) {
        snprintf(err, errlen, "out of host memory");
        return -ENOMEM;
    }
    z->cfg = cfg;
    z->world = cfg->world > 0 ? cfg->world : 1;
    z->tier[FSO_KIND_PARAM] = cfg->offload.param_tier;
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        z->tier[k] = cfg->offload.optim_tier;
    for (int k = 0; k < FSO_N_KINDS; k++)
        z->elem_bytes[k] = sizeof(float);
    if (cfg->bf16)
        z->elem_bytes[FSO_KIND_PARAM] = sizeof(uint16_t);
    z->alias_params = z->world == 1 && z->tier[FSO_KIND_PARAM] == FSO_TIER_DEVICE;
    z->prefetch = cfg->offload.prefetch_blocks;
    fso_isa isa; /* FSO_ISA, else the widest the CPU has */
    if ((rc = fso_isa_from_env(&isa, err, errlen)) < 0 ||
        (rc = fso_adamw_select(isa, &z->adamw)) < 0) {
        free(z);
        return rc;
    }
    if (cfg->offload.prefetch_blocks + 2 > MAX_PARAM_SLOTS) {
        snprintf(err, errlen, "train.prefetch_blocks: at most %d, got %d", MAX_PARAM_SLOTS - 2,
                 cfg->offload.prefetch_blocks);
        free(z);
        return -EINVAL;
    }

    const int L = cfg->model.num_hidden_layers;
    z->n_blocks = L + 2;
    z->blocks = calloc((size_t)z->n_blocks, sizeof *z->blocks);
    z->ranks = calloc((size_t)z->world, sizeof *z->ranks);
    z->order = calloc((size_t)(2 * L + 4), sizeof *z->order);
    if (!z->blocks || !z->ranks || !z->order) {
        snprintf(err, errlen, "out of host memory");
        rc = -ENOMEM;
        goto fail;
    }
    fso_model_layout(z->blocks, &cfg->model, z->world);
    for (int b = 0; b < z->n_blocks; b++) {
        if (z->blocks[b].padded_elems > z->max_padded)
            z->max_padded = z->blocks[b].padded_elems;
        if (fso_zero_shard_elems(z, b) > z->max_shard)
            z->max_shard = fso_zero_shard_elems(z, b);
    }
    /* params() order of one micro-step (model.h) */
    z->order[z->n_order++] = 0;
    for (int l = 0; l < L; l++)
        z->order[z->n_order++] = 1 + l;
    z->order[z->n_order++] = L + 1;
    if (cfg->model.tie_word_embeddings)
        z->order[z->n_order++] = 0;
    for (int l = L - 1; l >= 0; l--)
        z->order[z->n_order++] = 1 + l;

    /* ---- budgets, before any large allocation */
    size_t per_tier[3] = {0}, all_kinds_bytes = 0; /* one rank */
    for (int b = 0; b < z->n_blocks; b++)
        for (int k = 0; k < FSO_N_KINDS; k++) {
            size_t bytes = round_page(z->elem_bytes[k] * fso_zero_shard_elems(z, b));
            per_tier[z->tier[k]] += bytes;
            all_kinds_bytes += bytes;
        }
    const size_t slot_bytes = round_page(sizeof(float) * z->max_shard); /* any kind */
    const size_t pslot_bytes = round_page(z->elem_bytes[FSO_KIND_PARAM] * z->max_shard);
    const bool nvme = per_tier[FSO_TIER_NVME] > 0;
    const int n_pslots = z->tier[FSO_KIND_PARAM] == FSO_TIER_NVME
                             ? cfg->offload.prefetch_blocks + 2 : 0;
    /* optimizer chunks: aio.block_size, at most a shard. A chunk of bf16
     * parameters takes half a chunk's bytes and must start 4 KiB aligned in
     * the file (O_DIRECT), so with bf16 a chunk that splits a shard is a
     * multiple of 8 KiB. */
    size_t chunk_bytes = (size_t)cfg->offload.aio_block_bytes;
    if (z->elem_bytes[FSO_KIND_PARAM] < sizeof(float))
        chunk_bytes = (chunk_bytes + 2 * STAGE_ALIGN - 1) & ~(size_t)(2 * STAGE_ALIGN - 1);
    if (chunk_bytes > slot_bytes)
        chunk_bytes = slot_bytes;
    const size_t stage_per_rank = pslot_bytes * (size_t)n_pslots + slot_bytes * 3 +
                                  chunk_bytes * 2 * FSO_N_KINDS;
    z->arena_bytes = (per_tier[FSO_TIER_HOST] + stage_per_rank) * (size_t)z->world;

    z->cuda = strcmp(cfg->backend, "cuda") == 0;
    uint64_t cap = cfg->device_mem_bytes;
    if (cap == 0 && !z->cuda) { /* CPU default: an equal share of half the available memory */
        uint64_t avail = fso_mem_available_bytes();
        cap = avail ? avail / 2 / (uint64_t)z->world : (uint64_t)8 << 30;
    }
    const size_t window = (z->alias_params ? 0 : 2) * z->elem_bytes[FSO_KIND_PARAM] * z->max_padded;
    const size_t gradbufs = 2 * sizeof(float) * z->max_padded;

    int threads = cfg->threads > 0 ? cfg->threads : fso_cpu_count();
    int per_dev = threads / z->world > 0 ? threads / z->world : 1;
    for (int r = 0; r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        rk->rank = r;
        rk->numa = -1;
        rk->z = z;
        pthread_mutex_init(&rk->io_mu, NULL);
        pthread_mutex_init(&rk->opt_mu, NULL);
        pthread_cond_init(&rk->opt_cv, NULL);
        rk->sync_init = true;
        if (z->cuda) {
#if FSO_HAVE_CUDA
            char cerr[256] = "";
            if ((rc = fso_backend_create_cuda(&rk->be, r, cfg->device_mem_bytes, cerr,
                                              sizeof cerr)) < 0) {
                snprintf(err, errlen, "cannot open CUDA device %d: %s", r, cerr);
                goto fail;
            }
            if (cfg->device_mem_bytes == 0) { /* the budget: what the GPU has free */
                fso_gpu_info gi;
                cap = fso_gpu_info_query(r, &gi, cerr, sizeof cerr) == 0 ? gi.mem_free_bytes
                                                                          : (uint64_t)1 << 40;
            }
#endif
        } else if ((rc = fso_backend_create_virtual(&rk->be, cfg->backend[0] ? cfg->backend : "cpu",
                                                    r, per_dev, cap)) < 0) {
            snprintf(err, errlen, "cannot create device %d: %s", r, strerror(-rc));
            goto fail;
        }
        if ((rc = fso_model_init(&rk->model, &cfg->model, rk->be, cfg->micro_batch,
                                 cfg->data.seq_len, z->world, cfg->activation_checkpointing,
                                 cfg->bf16)) < 0) {
            fso_human_bytes(h1, sizeof h1, (double)cap);
            snprintf(err, errlen, "device memory: the activations alone do not fit the %s cap "
                                  "(--device-mem) of device %d (%s); shorten data.seq_len or "
                                  "train_micro_batch_size_per_gpu, or raise --device-mem",
                     h1, r, rk->model.err);
            goto fail;
        }
        size_t need = rk->be->mem_used_bytes + per_tier[FSO_TIER_DEVICE] + window + gradbufs;
        if (need > cap) {
            fso_human_bytes(h1, sizeof h1, (double)need);
            fso_human_bytes(h2, sizeof h2, (double)per_tier[FSO_TIER_DEVICE]);
            fso_human_bytes(h3, sizeof h3, (double)(window + gradbufs));
            fso_human_bytes(h4, sizeof h4, (double)rk->be->mem_used_bytes);
            fso_human_bytes(h5, sizeof h5, (double)cap);
            char short_by[32];
            fso_human_bytes(short_by, sizeof short_by, (double)(need - cap));
            snprintf(err, errlen,
                     "device memory: each of the %d devices needs %s (resident shards %s, "
                     "gather window and gradient buffers %s, activations %s) but holds %s; "
                     "short by %s: offload state (zero_optimization.offload_param / "
                     "offload_optimizer device \"cpu\" or \"nvme\", or --nvme DIR), add "
                     "devices, or raise --device-mem",
                     z->world, h1, h2, h3, h4, h5, short_by);
            rc = -ENOMEM;
            goto fail;
        }
    }
    place_near_devices(z);
    uint64_t avail = fso_mem_available_bytes();
    if (avail && z->arena_bytes > avail) {
        fso_human_bytes(h1, sizeof h1, (double)z->arena_bytes);
        fso_human_bytes(h2, sizeof h2, (double)avail);
        fso_human_bytes(h3, sizeof h3, (double)(z->arena_bytes - avail));
        snprintf(err, errlen,
                 "host memory: the host tier and staging buffers need %s but %s is available; "
                 "short by %s: put the optimizer state on NVMe (--nvme DIR or "
                 "zero_optimization.offload_optimizer.device \"nvme\")",
                 h1, h2, h3);
        rc = -ENOMEM;
        goto fail;
    }

    /* ---- the host arena: one for all devices. Twice what every kind on
     * the host would need is reserved (address space only), so that
     * re-plans can grow it in place. */
    z->arena_reserve = 2 * ((all_kinds_bytes + slot_bytes * (MAX_PARAM_SLOTS + 3) +
                             chunk_bytes * 2 * FSO_N_KINDS) * (size_t)z->world) + ARENA_ROUND;
    z->arena_reserve = (z->arena_reserve + ARENA_ROUND - 1) / ARENA_ROUND * ARENA_ROUND;
    z->arena = mmap(NULL, z->arena_reserve, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (z->arena == MAP_FAILED) {
        z->arena = NULL;
        fso_human_bytes(h1, sizeof h1, (double)z->arena_reserve);
        snprintf(err, errlen, "host memory: cannot reserve %s of address space for the host "
                              "arena: %s; check ulimit -v", h1, strerror(errno));
        rc = -ENOMEM;
        goto fail;
    }
    {
        size_t want = z->arena_bytes;
        z->arena_bytes = 0;
        if ((rc = arena_grow(z, want, err, errlen)) < 0)
            goto fail;
    }

    /* ---- per rank: shards, buffers, store */
    for (int r = 0; r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        fso_backend *be = rk->be;
        rk->locs = calloc((size_t)z->n_blocks * FSO_N_KINDS, sizeof *rk->locs);
        if (!rk->locs) {
            snprintf(err, errlen, "out of host memory");
            rc = -ENOMEM;
            goto fail;
        }
        uint64_t nvme_off = 0;
        for (int b = 0; b < z->n_blocks; b++)
            for (int k = 0; k < FSO_N_KINDS; k++) {
                loc *l = fso_zero_locate(rk, b, k);
                size_t bytes = round_page(z->elem_bytes[k] * fso_zero_shard_elems(z, b));
                l->tier = z->tier[k];
                if (l->tier == FSO_TIER_DEVICE) {
                    if ((rc = be->ops->buf_alloc(be, bytes, (void **)&l->ptr)) < 0) {
                        snprintf(err, errlen, "device memory: %s", be->err);
                        goto fail;
                    }
                } else if (l->tier == FSO_TIER_HOST) {
                    l->ptr = rank_take(rk, bytes);
                } else {
                    l->off = nvme_off;
                    nvme_off += bytes;
                }
            }
        if (!z->alias_params)
            for (int g = 0; g < 2; g++)
                if ((rc = be->ops->buf_alloc(be, z->elem_bytes[FSO_KIND_PARAM] * z->max_padded,
                                             &rk->gbuf[g])) < 0) {
                    snprintf(err, errlen, "device memory: %s", be->err);
                    goto fail;
                }
        for (int g = 0; g < 2; g++)
            if ((rc = be->ops->buf_alloc(be, sizeof(float) * z->max_padded,
                                         (void **)&rk->gradbuf[g])) < 0) {
                snprintf(err, errlen, "device memory: %s", be->err);
                goto fail;
            }
        rk->n_pslots = rk->n_pslots_buf = n_pslots;
        for (int j = 0; j < n_pslots; j++) {
            rk->pslots[j].buf = rank_take(rk, pslot_bytes);
            rk->pslots[j].block = -1;
        }
        for (int set = 0; set < 2; set++)
            for (int k = 0; k < FSO_N_KINDS; k++)
                rk->ochunk[set][k].buf = rank_take(rk, chunk_bytes);
        rk->chunk_elems = chunk_bytes / sizeof(float);
        rk->gslot.buf = rank_take(rk, slot_bytes);
        rk->gdown[0].buf = rank_take(rk, slot_bytes);
        rk->gdown[1].buf = rank_take(rk, slot_bytes);
        rk->gpend.block = -1;
        rk->block_sq = calloc((size_t)z->n_blocks, sizeof *rk->block_sq);
        rk->ready = calloc((size_t)z->n_blocks, sizeof *rk->ready);
        rk->ready_mark = calloc((size_t)z->n_blocks, sizeof *rk->ready_mark);
        rk->block_ms = calloc((size_t)z->n_blocks, sizeof *rk->block_ms);
        if (!rk->block_sq || !rk->ready || !rk->ready_mark || !rk->block_ms ||
            (rc = fso_optpool_create(&rk->opt_pool, per_dev)) < 0) {
            snprintf(err, errlen, "out of host memory for the optimizer");
            rc = -ENOMEM;
            goto fail;
        }
        /* the optimizer's threads near the memory they update (best effort):
         * the device's node, where its host state is */
        if (rk->numa >= 0)
            fso_optpool_bind(rk->opt_pool, rk->numa, false);
        else if (z->arena_bytes)
            fso_optpool_bind(rk->opt_pool,
                             fso_optpool_node_of(rk->opt_pool, z->arena, z->arena_bytes), false);
        if (cfg->optimizer_overlap != FSO_OVERLAP_NONE && (rc = fso_zero_optim_start(rk)) < 0) {
            snprintf(err, errlen, "cannot start the optimizer thread of device %d: %s", r,
                     strerror(-rc));
            goto fail;
        }

        rk->nvme_end = nvme_off;
        if (nvme && (rc = open_store(z, rk, &cfg->offload, nvme_off, err, errlen)) < 0)
            goto fail;
    }
    if (z->cuda) {
#if FSO_HAVE_CUDA
        fso_backend *devs[64];
        char cerr[256] = "";
        for (int r = 0; r < z->world; r++)
            devs[r] = z->ranks[r].be;
        if ((rc = fso_coll_create_nccl(&z->coll, z->world, devs, cerr, sizeof cerr)) < 0) {
            snprintf(err, errlen, "NCCL: %s", cerr);
            goto fail;
        }
#endif
    } else {
        fso_backend *devs[64];
        for (int r = 0; r < z->world && r < 64; r++)
            devs[r] = z->ranks[r].be;
        rc = fso_backend_is_async(devs[0]) ? fso_coll_create_async(&z->coll, z->world, devs)
                                           : fso_coll_create_threads(&z->coll, z->world);
        if (rc < 0) {
            snprintf(err, errlen, "cannot create the collectives: %s", strerror(-rc));
            goto fail;
        }
    }
    if ((rc = start_workers(z, err, errlen)) < 0)
        goto fail;

    /* ---- initial state, one block at a time (host memory stays bounded):
     * parameters from the seed, optimizer state zero */
    {
        float *flat = malloc(sizeof(float) * z->max_padded);
        fso_rng rng;
        if (!flat) {
            snprintf(err, errlen, "out of host memory initialising parameters");
            rc = -ENOMEM;
            goto fail;
        }
        fso_rng_seed(&rng, cfg->seed);
        for (int b = 0; b < z->n_blocks && rc == 0; b++) {
            fso_model_init_block(&z->ranks[0].model, b, flat, &rng);
            for (int k = 0; k < FSO_N_KINDS && rc == 0; k++) {
                if (k == FSO_KIND_M)
                    memset(flat, 0, sizeof(float) * z->blocks[b].padded_elems);
                rc = block_xfer(z, b, flat, (fso_kind)k, 0);
            }
        }
        free(flat);
        if (rc < 0) {
            first_error(z, err, errlen);
            goto fail;
        }
    }
    *out = z;
    return 0;

fail:
    fso_zero_destroy(z);
    return rc < 0 ? rc : -ENOMEM;
}

/* ------------------------------------------------------------------ re-plan */

typedef struct retier_job {
    loc *fresh[FSO_N_KINDS];     /* per moved kind: the new place of every block */
    void *gbuf[2];               /* gather window allocated for leaving the alias */
    bool opened_store;
} retier_job;

/* What phase 1 took, given back when it fails. */
static void retier_undo(rank_state *rk, retier_job *j)
{
    fso_backend *be = rk->be;
    for (int k = 0; k < FSO_N_KINDS; k++) {
        for (int b = 0; j->fresh[k] && b < rk->z->n_blocks; b++) {
            loc *l = &j->fresh[k][b];
            if (l->tier == FSO_TIER_DEVICE)
                be->ops->buf_free(be, l->ptr);
            else if (l->tier == FSO_TIER_HOST && l->ptr)
                arena_release(rk->z, l->ptr,
                              round_page(rk->z->elem_bytes[k] * fso_zero_shard_elems(rk->z, b)));
        }
        free(j->fresh[k]);
        j->fresh[k] = NULL;
    }
    for (int g = 0; g < 2; g++)
        be->ops->buf_free(be, j->gbuf[g]);
    if (j->opened_store) {
        fso_store_destroy(rk->store);
        rk->store = NULL;
    }
}

/* Copy shard (b, k) from where it is to `to` through the rank's staging
 * buffer; its bytes are added to *moved. */
static int retier_copy(rank_state *rk, int b, fso_kind k, const loc *to, uint64_t *moved)
{
    uint64_t io = 0;
    loc *l = fso_zero_locate(rk, b, k);
    slot *s = &rk->gslot;
    size_t S = fso_zero_shard_elems(rk->z, b);
    void *p;
    int rc = fso_zero_xfer(rk, &rk->ce, &io, b, k, 0, S, s, false, false, &p);
    if (rc == 0)
        rc = fso_zero_slot_wait(rk, &rk->ce, s, fso_zero_kind_names[k], b);
    if (rc < 0)
        return rc;
    loc old = *l;
    *l = *to;
    p = s->buf;
    rc = fso_zero_xfer(rk, &rk->ce, &io, b, k, 0, S, s, true, false, &p);
    if (rc == 0)
        rc = fso_zero_slot_wait(rk, &rk->ce, s, fso_zero_kind_names[k], b);
    *l = old;
    if (rc == 0)
        *moved += rk->z->elem_bytes[k] * S;
    return rc;
}

int fso_zero_retier(fso_zero *z, const fso_offload_config *o, uint64_t *bytes_moved, char *err,
                    size_t errlen)
{
    char h1[32], h2[32];
    fso_tier want[FSO_N_KINDS];
    want[FSO_KIND_PARAM] = o->param_tier;
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        want[k] = o->optim_tier;
    *bytes_moved = 0;
    if (o->prefetch_blocks < 0 || o->prefetch_blocks + 2 > MAX_PARAM_SLOTS) {
        snprintf(err, errlen, "re-plan: prefetch depth %d: must be 0 to %d", o->prefetch_blocks,
                 MAX_PARAM_SLOTS - 2);
        return -EINVAL;
    }
    const bool alias = z->world == 1 && want[FSO_KIND_PARAM] == FSO_TIER_DEVICE &&
                       z->elem_bytes[FSO_KIND_PARAM] == sizeof(float);
    const int n_ps = want[FSO_KIND_PARAM] == FSO_TIER_NVME ? o->prefetch_blocks + 2 : 0;
    const size_t pslot_bytes = round_page(z->elem_bytes[FSO_KIND_PARAM] * z->max_shard);

    /* between steps: no update running, no I/O in flight */
    for (int r = 0; r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        rk->ce.rc = 0;
        if (fso_zero_optim_wait_all(rk) < 0) {
            snprintf(err, errlen, "re-plan: %s", rk->ce.msg);
            return rk->ce.rc;
        }
        drain_slots(rk, true);
    }

    /* what each device gains on each tier (the same on every device) */
    size_t add[3] = {0};
    for (int k = 0; k < FSO_N_KINDS; k++)
        if (want[k] != z->tier[k])
            for (int b = 0; b < z->n_blocks; b++)
                add[want[k]] += round_page(z->elem_bytes[k] * fso_zero_shard_elems(z, b));
    if (z->alias_params && !alias)
        add[FSO_TIER_DEVICE] += 2 * z->elem_bytes[FSO_KIND_PARAM] * z->max_padded;
    int more_slots = n_ps - z->ranks[0].n_pslots_buf;
    if (more_slots > 0)
        add[FSO_TIER_HOST] += pslot_bytes * (size_t)more_slots;
    if (add[FSO_TIER_DEVICE] == 0 && add[FSO_TIER_HOST] == 0 && add[FSO_TIER_NVME] == 0 &&
        memcmp(want, z->tier, sizeof want) == 0) {
        z->prefetch = o->prefetch_blocks;
        for (int r = 0; r < z->world; r++)
            z->ranks[r].n_pslots = n_ps;
        return 0;
    }
    for (int r = 0; r < z->world; r++) {
        fso_backend *be = z->ranks[r].be;
        if (be->mem_cap_bytes && be->mem_used_bytes + add[FSO_TIER_DEVICE] > be->mem_cap_bytes) {
            fso_human_bytes(h1, sizeof h1, (double)add[FSO_TIER_DEVICE]);
            fso_human_bytes(h2, sizeof h2, (double)(be->mem_cap_bytes - be->mem_used_bytes));
            snprintf(err, errlen, "re-plan: device memory: device %d would need %s more and has "
                                  "%s free", r, h1, h2);
            return -ENOMEM;
        }
    }
    if (add[FSO_TIER_HOST]) {
        size_t host = add[FSO_TIER_HOST] * (size_t)z->world;
        uint64_t avail = fso_mem_available_bytes();
        if (avail && host > avail) {
            fso_human_bytes(h1, sizeof h1, (double)host);
            fso_human_bytes(h2, sizeof h2, (double)avail);
            snprintf(err, errlen, "re-plan: host memory: the move needs %s and %s is available",
                     h1, h2);
            return -ENOMEM;
        }
        size_t used = (z->arena_used + STAGE_ALIGN - 1) & ~(size_t)(STAGE_ALIGN - 1);
        int rc = arena_grow(z, used + host, err, errlen);
        if (rc < 0)
            return rc;
    }

    /* phase 1: every moved shard copied to its new place; nothing let go */
    retier_job *jobs = calloc((size_t)(z->world > 0 ? z->world : 1), sizeof *jobs);
    if (!jobs) {
        snprintf(err, errlen, "re-plan: out of host memory");
        return -ENOMEM;
    }
    int rc = 0;
    for (int r = 0; r < z->world && rc == 0; r++) {
        rank_state *rk = &z->ranks[r];
        fso_backend *be = rk->be;
        retier_job *j = &jobs[r];
        if (add[FSO_TIER_NVME]) {
            if (rk->store)
                rc = fso_store_grow(rk->store, rk->nvme_end + add[FSO_TIER_NVME]);
            else if ((rc = open_store(z, rk, o, add[FSO_TIER_NVME], err, errlen)) == 0)
                j->opened_store = true;
            if (rc < 0) {
                if (!j->opened_store && rk->store && rk->store->err[0])
                    snprintf(err, errlen, "NVMe: %s", rk->store->err);
                j->opened_store = false;
                break;
            }
        }
        for (int g = 0; g < 2 && z->alias_params && !alias && rc == 0; g++)
            if ((rc = be->ops->buf_alloc(be, z->elem_bytes[FSO_KIND_PARAM] * z->max_padded,
                                         &j->gbuf[g])) < 0)
                snprintf(err, errlen, "device memory: %s", be->err);
        uint64_t nvme_off = rk->nvme_end;
        for (int k = 0; k < FSO_N_KINDS && rc == 0; k++) {
            if (want[k] == z->tier[k])
                continue;
            if (!(j->fresh[k] = calloc((size_t)z->n_blocks, sizeof(loc)))) {
                snprintf(err, errlen, "out of host memory");
                rc = -ENOMEM;
                break;
            }
            for (int b = 0; b < z->n_blocks && rc == 0; b++) {
                loc *to = &j->fresh[k][b];
                size_t bytes = round_page(z->elem_bytes[k] * fso_zero_shard_elems(z, b));
                to->tier = want[k];
                if (to->tier == FSO_TIER_DEVICE) {
                    if ((rc = be->ops->buf_alloc(be, bytes, (void **)&to->ptr)) < 0) {
                        snprintf(err, errlen, "device memory: %s", be->err);
                        break;
                    }
                } else if (to->tier == FSO_TIER_HOST) {
                    to->ptr = rank_take(rk, bytes);
                } else {
                    to->off = nvme_off;
                    nvme_off += bytes;
                }
                if ((rc = retier_copy(rk, b, (fso_kind)k, to, bytes_moved)) < 0)
                    snprintf(err, errlen, "%s", rk->ce.msg);
            }
        }
    }
    if (rc < 0) {
        for (int r = 0; r < z->world; r++) {
            drain_slots(&z->ranks[r], true);
            retier_undo(&z->ranks[r], &jobs[r]);
            z->ranks[r].ce.rc = 0;
        }
        free(jobs);
        char why[512];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, errlen, "re-plan: the placement stays as it was: %s", why);
        return rc;
    }

    /* phase 2: switch every device to the new places, let the old ones go */
    for (int r = 0; r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        fso_backend *be = rk->be;
        retier_job *j = &jobs[r];
        for (int k = 0; k < FSO_N_KINDS; k++) {
            if (!j->fresh[k])
                continue;
            for (int b = 0; b < z->n_blocks; b++) {
                loc *l = fso_zero_locate(rk, b, k);
                size_t bytes = round_page(z->elem_bytes[k] * fso_zero_shard_elems(z, b));
                if (l->tier == FSO_TIER_DEVICE)
                    be->ops->buf_free(be, l->ptr);
                else if (l->tier == FSO_TIER_HOST)
                    arena_release(z, l->ptr, bytes);
                *l = j->fresh[k][b];
            }
            free(j->fresh[k]);
        }
        rk->nvme_end += add[FSO_TIER_NVME];
        if (z->alias_params && !alias) {
            rk->gbuf[0] = j->gbuf[0];
            rk->gbuf[1] = j->gbuf[1];
        } else if (!z->alias_params && alias) {
            for (int g = 0; g < 2; g++) {
                be->ops->buf_free(be, rk->gbuf[g]);
                rk->gbuf[g] = NULL;
            }
        }
        for (int q = rk->n_pslots_buf; q < n_ps; q++) {
            rk->pslots[q].buf = rank_take(rk, pslot_bytes);
            rk->pslots[q].block = -1;
        }
        if (n_ps > rk->n_pslots_buf)
            rk->n_pslots_buf = n_ps;
        rk->n_pslots = n_ps;
        bool on_nvme = false;
        for (int k = 0; k < FSO_N_KINDS; k++)
            on_nvme |= want[k] == FSO_TIER_NVME;
        if (!on_nvme && rk->store) { /* nothing left there: give the space back */
            fso_store_destroy(rk->store);
            rk->store = NULL;
            rk->nvme_end = 0;
        }
    }
    free(jobs);
    memcpy(z->tier, want, sizeof want);
    z->alias_params = alias;
    z->prefetch = o->prefetch_blocks;
    return 0;
}

void fso_zero_destroy(fso_zero *z)
{
    if (!z)
        return;
    stop_workers(z);
    for (int r = 0; z->ranks && r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        fso_zero_optim_stop(rk);
        if (rk->sync_init) {
            drain_slots(rk, true);
            pthread_mutex_destroy(&rk->io_mu);
            pthread_mutex_destroy(&rk->opt_mu);
            pthread_cond_destroy(&rk->opt_cv);
        }
        fso_optpool_destroy(rk->opt_pool);
        free(rk->block_sq);
        free(rk->ready);
        free(rk->ready_mark);
        free(rk->block_ms);
        if (!rk->be)
            continue;
        for (int b = 0; rk->locs && b < z->n_blocks; b++)
            for (int k = 0; k < FSO_N_KINDS; k++)
                if (fso_zero_locate(rk, b, k)->tier == FSO_TIER_DEVICE)
                    rk->be->ops->buf_free(rk->be, fso_zero_locate(rk, b, k)->ptr);
        for (int g = 0; g < 2; g++) {
            rk->be->ops->buf_free(rk->be, rk->gbuf[g]);
            rk->be->ops->buf_free(rk->be, rk->gradbuf[g]);
        }
        fso_store_destroy(rk->store);
        fso_model_free(&rk->model);
        free(rk->locs);
        fso_backend_destroy(rk->be);
    }
#if FSO_HAVE_CUDA
    for (int i = 0; i < z->n_pinned; i++)
        fso_cuda_host_unregister((char *)z->arena + z->pinned_at[i],
                                 z->pinned_at[i + 1] - z->pinned_at[i]);
#endif
    if (z->arena)
        munmap(z->arena, z->arena_reserve);
    fso_topo_destroy(z->topo);
    fso_coll_destroy(z->coll);
    free(z->ranks);
    free(z->blocks);
    free(z->order);
    free(z);
}
