/* zero_retier.c — a new placement while training (fso_zero_retier, the
 * re-plan): every moved shard is copied to its new place on every device
 * before any old place is let go, so a move that cannot be made leaves the
 * placement as it was. */
#include "zero_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* What phase 1 takes on one device. */
typedef struct retier_job {
    loc *fresh[FSO_N_KINDS];     /* per moved kind: the new place of every block that moves */
    void *gather[2];             /* the gather window, when lending in place stops */
    bool opened_store;
} retier_job;

/* The move: tiers per kind, and the buffers the new placement needs. */
typedef struct retier_plan {
    const fso_offload_config *o;
    fso_tier want[FSO_N_KINDS];
    fso_block_rule rule;         /* o's (config.h fso_offload_block_rule) */
    fso_fp_buffers zb;
    bool lend_in_place;
    size_t add[FSO_N_TIERS];     /* what each device gains on each tier (the same on all) */
} retier_plan;

/* The tier of block b's shards of kind k in the new placement. */
static fso_tier want_tier(const retier_plan *m, int b, fso_kind k)
{
    return fso_block_tier(&m->rule, k, b);
}

/* Whether block b's shards of kind k move. */
static bool moves(const fso_zero *z, const retier_plan *m, int b, fso_kind k)
{
    return want_tier(m, b, k) != zr_block_tier(z, b, k);
}

/* Whether any block's shards of kind k move. */
static bool kind_moves(const fso_zero *z, const retier_plan *m, fso_kind k)
{
    for (int b = 0; b < z->n_blocks; b++)
        if (moves(z, m, b, k))
            return true;
    return false;
}

/* What phase 1 took, given back when it fails. */
static void retier_undo(rank_state *rk, const retier_plan *m, retier_job *j)
{
    fso_backend *be = rk->be;
    for (int k = 0; k < FSO_N_KINDS; k++) {
        for (int b = 0; j->fresh[k] && b < rk->z->n_blocks; b++)
            if (moves(rk->z, m, b, (fso_kind)k))
                zr_release_shard(rk, b, (fso_kind)k, &j->fresh[k][b]);
        free(j->fresh[k]);
        j->fresh[k] = NULL;
    }
    for (int g = 0; g < 2; g++)
        be->ops->buf_free(be, j->gather[g]);
    if (j->opened_store) {
        fso_store_destroy(rk->io.store);
        rk->io.store = NULL;
    }
}

/* Copy shard (b, k) from where it is to `to` through the rank's staging
 * buffer; its bytes are added to *moved. */
static int retier_copy(rank_state *rk, int b, fso_kind k, const loc *to, uint64_t *moved)
{
    uint64_t io[FSO_N_KINDS] = {0};
    loc *l = zr_locate(rk, b, k);
    slot *s = &rk->io.grad_trip;
    const size_t lo = zr_kind_lo(rk->z, b, k), S = zr_kind_elems(rk->z, b, k);
    void *p;
    int rc = zr_xfer(rk, &rk->compute.err, io, b, k, lo, S, s, false, false, &p);
    if (rc == 0)
        rc = zr_slot_wait(rk, &rk->compute.err, s, fso_kind_name(k), b);
    if (rc < 0)
        return rc;
    loc old = *l;
    *l = *to;
    p = s->buf;
    rc = zr_xfer(rk, &rk->compute.err, io, b, k, lo, S, s, true, false, &p);
    if (rc == 0)
        rc = zr_slot_wait(rk, &rk->compute.err, s, fso_kind_name(k), b);
    *l = old;
    if (rc == 0)
        *moved += rk->z->elem_bytes[k] * S;
    return rc;
}

/* Between steps: no update running, no I/O in flight. */
static int quiesce(fso_zero *z, char *err, size_t errlen)
{
    zr_save_wait_idle(z); /* a save reads the shards where they are now */
    for (int r = 0; r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        rk->compute.err.rc = 0;
        if (zr_optim_wait_all(rk) < 0) {
            snprintf(err, errlen, "re-plan: %s", rk->compute.err.msg);
            return rk->compute.err.rc;
        }
        zr_drain_slots(rk, true);
    }
    return 0;
}

/* What each device gains on each tier: the shards of every kind that
 * moves, the gather window when lending in place stops, more slots of
 * the parameter ring, chunk buffers for kinds that now need them, landing
 * slots when the gradients now need them. */
static void growth(const fso_zero *z, retier_plan *m)
{
    memset(m->add, 0, sizeof m->add);
    for (int k = 0; k < FSO_N_KINDS; k++)
        for (int b = 0; b < z->n_blocks; b++)
            if (moves(z, m, b, (fso_kind)k))
                m->add[want_tier(m, b, (fso_kind)k)] += zr_shard_bytes(z, b, (fso_kind)k);
    if (z->lend_in_place && !m->lend_in_place)
        m->add[FSO_TIER_DEVICE] += m->zb.gather_bytes * (size_t)m->zb.gather;
    int more_slots = m->zb.prefetch_slots - z->ranks[0].io.n_prefetch_bufs;
    if (more_slots > 0)
        m->add[FSO_TIER_HOST] += m->zb.prefetch_slot_bytes * (size_t)more_slots;
    const rank_state *rk = &z->ranks[0];
    for (int k = 0; k < FSO_N_KINDS; k++)
        if (m->zb.chunked[k] && !rk->opt.chunk[0][k].buf)
            m->add[FSO_TIER_HOST] += m->zb.chunk_bytes * (size_t)rk->opt.n_sets;
    if (m->zb.landings && !rk->io.grad_down[0].buf)
        m->add[FSO_TIER_HOST] += m->zb.stage_slot_bytes * (size_t)m->zb.landing_slots;
}

/* Room for the growth on every device and in host memory; the arena grows. */
static int make_room(fso_zero *z, const retier_plan *m, char *err, size_t errlen)
{
    char h1[32], h2[32];
    for (int r = 0; r < z->world; r++) {
        fso_backend *be = z->ranks[r].be;
        if (be->mem_cap_bytes &&
            be->mem_used_bytes + m->add[FSO_TIER_DEVICE] > be->mem_cap_bytes) {
            fso_human_bytes(h1, sizeof h1, (double)m->add[FSO_TIER_DEVICE]);
            fso_human_bytes(h2, sizeof h2, (double)(be->mem_cap_bytes - be->mem_used_bytes));
            snprintf(err, errlen, "re-plan: device memory: device %d would need %s more and has "
                                  "%s free", r, h1, h2);
            return -ENOMEM;
        }
    }
    if (!m->add[FSO_TIER_HOST])
        return 0;
    size_t host = m->add[FSO_TIER_HOST] * (size_t)z->world;
    uint64_t avail = fso_mem_usable_bytes();
    if (avail && host > avail) {
        fso_human_bytes(h1, sizeof h1, (double)host);
        fso_human_bytes(h2, sizeof h2, (double)avail);
        snprintf(err, errlen, "re-plan: host memory: the move needs %s and %s is available", h1,
                 h2);
        return -ENOMEM;
    }
    return zr_arena_grow(z, fso_fp_round_page(z->arena.used) + host, err, errlen);
}

/* Phase 1 on one device: room on its store, a gather window if it needs
 * one, and a new place for every moved shard (nothing touched: the host
 * ones are bound to the device's node, pinned once every device has its
 * places, then filled by retier_fill). */
static int retier_place(rank_state *rk, const retier_plan *m, retier_job *j, char *err,
                        size_t errlen)
{
    fso_zero *z = rk->z;
    fso_backend *be = rk->be;
    int rc = 0;
    if (m->add[FSO_TIER_NVME]) {
        if (rk->io.store)
            rc = fso_store_grow(rk->io.store, rk->io.nvme_end + m->add[FSO_TIER_NVME]);
        else if ((rc = zr_open_store(z, rk, m->o, m->add[FSO_TIER_NVME], err, errlen)) == 0)
            j->opened_store = true;
        if (rc < 0) {
            if (rk->io.store && rk->io.store->err[0])
                snprintf(err, errlen, "NVMe: %s", rk->io.store->err);
            return rc;
        }
    }
    for (int g = 0; g < m->zb.gather && z->lend_in_place; g++)
        if ((rc = be->ops->buf_alloc(be, m->zb.gather_bytes, &j->gather[g])) < 0) {
            snprintf(err, errlen, "device memory: %s", be->err);
            return rc;
        }
    uint64_t nvme_off = rk->io.nvme_end;
    for (int k = 0; k < FSO_N_KINDS; k++) {
        if (!kind_moves(z, m, (fso_kind)k))
            continue;
        if (!(j->fresh[k] = calloc((size_t)z->n_blocks, sizeof(loc)))) {
            snprintf(err, errlen, "out of host memory");
            return -ENOMEM;
        }
        for (int b = 0; b < z->n_blocks; b++) {
            loc *to = &j->fresh[k][b];
            if (!moves(z, m, b, (fso_kind)k))
                continue;
            if ((rc = zr_place_shard(rk, b, (fso_kind)k, want_tier(m, b, (fso_kind)k),
                                     &nvme_off, to, err, errlen)) < 0)
                return rc;
        }
    }
    return 0;
}

/* Phase 1, after pinning: every moved shard copied to its new place. */
static int retier_fill(rank_state *rk, const retier_plan *m, retier_job *j,
                       uint64_t *bytes_moved, char *err, size_t errlen)
{
    fso_zero *z = rk->z;
    for (int k = 0; k < FSO_N_KINDS; k++)
        for (int b = 0; j->fresh[k] && b < z->n_blocks; b++) {
            if (!moves(z, m, b, (fso_kind)k))
                continue;
            int rc = retier_copy(rk, b, (fso_kind)k, &j->fresh[k][b], bytes_moved);
            if (rc < 0) {
                snprintf(err, errlen, "%s", rk->compute.err.msg);
                return rc;
            }
        }
    return 0;
}

/* Phase 2 on one device: the new places in, the old ones let go. */
static void retier_switch(rank_state *rk, const retier_plan *m, retier_job *j)
{
    fso_zero *z = rk->z;
    fso_backend *be = rk->be;
    for (int k = 0; k < FSO_N_KINDS; k++) {
        if (!j->fresh[k])
            continue;
        for (int b = 0; b < z->n_blocks; b++) {
            if (!moves(z, m, b, (fso_kind)k))
                continue;
            loc *l = zr_locate(rk, b, (fso_kind)k);
            zr_release_shard(rk, b, (fso_kind)k, l);
            *l = j->fresh[k][b];
        }
        free(j->fresh[k]);
    }
    rk->io.nvme_end += m->add[FSO_TIER_NVME];
    if (z->lend_in_place && !m->lend_in_place) {
        rk->compute.gather[0] = j->gather[0];
        rk->compute.gather[1] = j->gather[1];
    } else if (!z->lend_in_place && m->lend_in_place) {
        for (int g = 0; g < 2; g++) {
            be->ops->buf_free(be, rk->compute.gather[g]);
            rk->compute.gather[g] = NULL;
        }
    }
    for (int q = rk->io.n_prefetch_bufs; q < m->zb.prefetch_slots; q++) {
        rk->io.prefetch[q].buf = zr_rank_take(rk, m->zb.prefetch_slot_bytes);
        rk->io.prefetch[q].block = -1;
        rk->io.prefetch[q].lend = -1;
    }
    if (m->zb.prefetch_slots > rk->io.n_prefetch_bufs)
        rk->io.n_prefetch_bufs = m->zb.prefetch_slots;
    for (int k = 0; k < FSO_N_KINDS; k++) /* chunk buffers for kinds that now need them */
        for (int set = 0; set < rk->opt.n_sets && m->zb.chunked[k] && !rk->opt.chunk[set][k].buf;
             set++)
            rk->opt.chunk[set][k].buf = zr_rank_take(rk, m->zb.chunk_bytes);
    for (int i = 0; i < m->zb.landing_slots && m->zb.landings && !rk->io.grad_down[i].buf; i++)
        rk->io.grad_down[i].buf = zr_rank_take(rk, m->zb.stage_slot_bytes);
    rk->io.n_prefetch = m->zb.prefetch_slots;
    bool on_nvme = false;
    for (int b = 0; b < z->n_blocks; b++)
        for (int k = 0; k < FSO_N_KINDS; k++)
            on_nvme |= want_tier(m, b, (fso_kind)k) == FSO_TIER_NVME;
    if (!on_nvme && rk->io.store) { /* nothing left there: give the space back */
        fso_store_destroy(rk->io.store);
        rk->io.store = NULL;
        rk->io.nvme_end = 0;
    }
}

int fso_zero_retier(fso_zero *z, const fso_offload_config *o, uint64_t *bytes_moved, char *err,
                    size_t errlen)
{
    retier_plan m = {.o = o};
    for (int k = 0; k < FSO_N_KINDS; k++)
        m.want[k] = fso_offload_tier(o, (fso_kind)k);
    fso_offload_block_rule(o, z->n_blocks, &m.rule);
    char why[512];
    int rc = zr_check_rule(z, &m.rule, why, sizeof why);
    if (rc < 0) {
        snprintf(err, errlen, "re-plan: %s", why);
        return rc;
    }
    *bytes_moved = 0;
    zr_buffers_for(z, &m.rule, o->prefetch_blocks, &m.zb);
    if (o->prefetch_blocks < 0 || o->prefetch_blocks > m.zb.max_prefetch) {
        snprintf(err, errlen, "re-plan: prefetch depth %d: must be 0 to %d", o->prefetch_blocks,
                 m.zb.max_prefetch);
        return -EINVAL;
    }
    m.lend_in_place = m.zb.gather == 0;
    rc = quiesce(z, err, errlen);
    if (rc < 0)
        return rc;
    growth(z, &m);
    if (m.add[FSO_TIER_DEVICE] == 0 && m.add[FSO_TIER_HOST] == 0 && m.add[FSO_TIER_NVME] == 0 &&
        fso_block_rule_same(&m.rule, &z->rule)) {
        z->prefetch = o->prefetch_blocks;
        for (int r = 0; r < z->world; r++)
            z->ranks[r].io.n_prefetch = m.zb.prefetch_slots;
        return 0;
    }
    if ((rc = make_room(z, &m, err, errlen)) < 0)
        return rc;

    /* phase 1: every moved shard copied to its new place; nothing let go */
    retier_job *jobs = calloc((size_t)z->world, sizeof *jobs);
    if (!jobs) {
        snprintf(err, errlen, "re-plan: out of host memory");
        return -ENOMEM;
    }
    for (int r = 0; r < z->world && rc == 0; r++)
        rc = retier_place(&z->ranks[r], &m, &jobs[r], err, errlen);
    if (rc == 0)
        zr_arena_pin(z, false); /* every device's new host places bound, none touched yet */
    for (int r = 0; r < z->world && rc == 0; r++)
        rc = retier_fill(&z->ranks[r], &m, &jobs[r], bytes_moved, err, errlen);
    if (rc < 0) {
        for (int r = 0; r < z->world; r++) {
            zr_drain_slots(&z->ranks[r], true);
            retier_undo(&z->ranks[r], &m, &jobs[r]);
            z->ranks[r].compute.err.rc = 0;
        }
        free(jobs);
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, errlen, "re-plan: the placement stays as it was: %s", why);
        return rc;
    }
    /* phase 2: switch every device to the new places, let the old ones go */
    for (int r = 0; r < z->world; r++)
        retier_switch(&z->ranks[r], &m, &jobs[r]);
    free(jobs);
    zr_arena_pin(z, false); /* the slots retier_switch took */
    memcpy(z->tier, m.want, sizeof m.want);
    z->rule = m.rule;
    if (z->lend_in_place && !m.lend_in_place)
        zr_windows_reset(z);
    z->lend_in_place = m.lend_in_place;
    z->prefetch = o->prefetch_blocks;
    return 0;
}
