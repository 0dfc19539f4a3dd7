/* zero_rail.c — the trainer across several boxes (zero_rail.h): each
 * device's gradient shard reduce-scattered over its rail after the step's
 * last micro-batch, the norm of this box's slice, the step's scalars summed
 * over the boxes, and each block's updated working parameters all-gathered
 * over the rail before the block is used again. A shard on a GPU meets the
 * other boxes on the device's NCCL rail where it lives; one in host memory
 * or on NVMe on the MPI rail, through host memory (engine/boxes.h).
 *
 * Sums over boxes run in box order (coll.h), so two boxes of one device
 * give the bits of one box of two devices when each step has one
 * micro-batch: both add the same two fp32 values (engine/boxes.h). */
#include "zero_impl.h"

#include <errno.h>
#include <string.h>

#include "boxes.h"
#include "util.h"

/* What this box does now, for a peer's timeout message (boxes.h). */
static void phase(const fso_zero *z, const char *what, int64_t step, int b)
{
    if (z->boxes > 1)
        fso_boxes_phase(what, step, b);
}

/* Whether the CPU writes block b's parameter shard where it lives. */
static bool params_reached(rank_state *rk, int b)
{
    return fso_fp_cpu_reaches(&rk->z->rules, zr_locate(rk, b, FSO_KIND_PARAM)->tier);
}

/* Whether shard l meets the other boxes where it lives, on the device rail
 * dev (NCCL over GPU memory; NULL: none): a shard on the device that the
 * CPU cannot address. Every box places its shards alike (the resolved
 * configuration they agree on carries the placement), so every box takes
 * the same rail for the same shard. */
static bool on_device_rail(const fso_zero *z, const fso_coll *dev, const loc *l)
{
    return dev && l->tier == FSO_TIER_DEVICE && !fso_fp_cpu_reaches(&z->rules, l->tier);
}

/* Bytes this box sends of an all-gather or reduce-scatter whose slices are
 * `slice` bytes: (B-1) slices, as a ring sends them (footprint.h
 * net_bytes). */
static uint64_t sent(const fso_zero *z, size_t slice)
{
    return (uint64_t)slice * (uint64_t)(z->boxes - 1);
}

int zr_rail_reduce_grads(rank_state *rk)
{
    fso_zero *z = rk->z;
    const double t0 = fso_now_ms();
    bool dev_norms = false; /* norms queued on the device: in once it syncs */
    for (int b = 0; b < z->n_blocks; b++) {
        const size_t lo = zr_opt_lo(z, b), n = zr_opt_elems(z, b);
        loc *l = zr_locate(rk, b, FSO_KIND_GRAD);
        const bool dev = on_device_rail(z, rk->rail.grad_dev, l);
        const bool home = dev || fso_fp_cpu_reaches(&z->rules, l->tier);
        fso_coll *c = dev ? rk->rail.grad_dev : rk->rail.grad;
        slot *s = &rk->io.grad_trip;
        float *buf = home ? l->ptr : s->buf; /* the device has synced: the shard is whole */
        /* a box whose step failed still joins, so that no other box waits
         * for it: the failure travels in the scalars' sum */
        if (!home && rk->compute.err.rc == 0 &&
            zr_shard_fetch(rk, b, FSO_KIND_GRAD, s) == 0)
            zr_slot_wait(rk, &rk->compute.err, s, "gradients", b);
        phase(z, "the gradients' reduce-scatter", z->step + 1, b);
        int rc = __atomic_load_n(&rk->rail.broken, __ATOMIC_RELAXED) ? -ECANCELED
                                 : c->ops->reduce_scatter(c, z->box, buf, buf + lo, n);
        if (rc < 0) {
            __atomic_store_n(&rk->rail.broken, true, __ATOMIC_RELAXED);
            rk->compute.st.net_ms += fso_now_ms() - t0;
            return zr_fail(&rk->compute.err, rc, "device %d: %s", rk->rank, c->err);
        }
        rk->compute.st.net_bytes += sent(z, sizeof(float) * n);
        rk->compute.grad_sq[b] = 0;
        if (dev) { /* the same bits as the host's (backend.h sqnorm) */
            rk->be->ops->sqnorm(rk->be, &rk->compute.grad_sq[b], buf + lo, n);
            dev_norms = true;
        } else {
            fso_host_sqnorm(fso_backend_pool(rk->be), &rk->compute.grad_sq[b], buf + lo, n);
        }
        if (!home && rk->compute.err.rc == 0) {
            void *p = buf + lo;
            if (zr_xfer(rk, &rk->compute.err, rk->compute.st.nvme_kind_write, b, FSO_KIND_GRAD,
                        lo, n, s, true, false, &p) == 0)
                zr_slot_wait(rk, &rk->compute.err, s, "gradients", b);
        }
    }
    if (dev_norms && rk->compute.err.rc == 0) {
        int drc = rk->be->ops->sync(rk->be);
        if (drc < 0)
            zr_fail(&rk->compute.err, drc, "device %d: %s", rk->rank, rk->be->err);
    }
    rk->compute.st.net_ms += fso_now_ms() - t0;
    return rk->compute.err.rc;
}

int zr_rail_sum(rank_state *rk, double *v, int n)
{
    fso_coll *c = rk->rail.grad;
    const double t0 = fso_now_ms();
    phase(rk->z, "the sum of the step's norm and loss", rk->z->step + 1, -1);
    /* a failed reduce-scatter before has said why */
    if (__atomic_load_n(&rk->rail.broken, __ATOMIC_RELAXED))
        return rk->compute.err.rc ? rk->compute.err.rc : -ECANCELED;
    int rc = c->ops->all_reduce_f64(c, rk->z->box, v, (size_t)n);
    rk->compute.st.net_ms += fso_now_ms() - t0;
    if (rc < 0) {
        __atomic_store_n(&rk->rail.broken, true, __ATOMIC_RELAXED);
        return zr_fail(&rk->compute.err, rc, "device %d: %s", rk->rank, c->err);
    }
    return 0;
}

void *zr_rail_param_dest(rank_state *rk, int b, size_t c0)
{
    if (rk->z->boxes <= 1 || params_reached(rk, b))
        return NULL;
    return (char *)rk->rail.io.buf + rk->z->elem_bytes[FSO_KIND_PARAM] * c0;
}

int zr_rail_gather_params(rank_state *rk, int b, int64_t step, bool in_buf)
{
    fso_zero *z = rk->z;
    const size_t S = zr_shard_elems(z, b), lo = zr_opt_lo(z, b), n = zr_opt_elems(z, b);
    const size_t eb = z->elem_bytes[FSO_KIND_PARAM];
    const loc *l = zr_locate(rk, b, FSO_KIND_PARAM);
    const bool dev = on_device_rail(z, rk->rail.param_dev, l);
    const bool home = dev || params_reached(rk, b);
    fso_coll *c = dev ? rk->rail.param_dev : rk->rail.param;
    char *base = home ? l->ptr : rk->rail.io.buf;
    const double t0 = fso_now_ms();
    int rc = 0;
    void *p;
    if (dev && in_buf) { /* the slice up from the rail buffer, to its place in the shard */
        p = (char *)rk->rail.io.buf + eb * lo;
        if ((rc = zr_xfer_via(rk, &rk->opt.err, rk->opt.write_kind, b, FSO_KIND_PARAM, lo, n,
                              &rk->rail.io, p, true, false, &p)) == 0)
            rc = zr_slot_wait(rk, &rk->opt.err, &rk->rail.io, "parameters", b);
    } else if (dev && rk->be->ops->wait_mark) { /* the device's update wrote the slice */
        rk->be->ops->wait_mark(rk->be, rk->opt.after);
    }
    if (!home && !in_buf && /* the slice is where the update wrote it (a GPU's) */
        (rc = zr_xfer_via(rk, &rk->opt.err, rk->opt.read_kind, b, FSO_KIND_PARAM, lo, n,
                          &rk->rail.io, base + eb * lo, false, false, &p)) == 0)
        rc = zr_slot_wait(rk, &rk->opt.err, &rk->rail.io, "parameters", b);
    phase(z, "the parameters' all-gather", step, b);
    int crc = -ECANCELED;
    if (!__atomic_load_n(&rk->rail.broken, __ATOMIC_RELAXED))
        crc = c->ops->all_gather(c, z->box, base + eb * lo, base, n,
                                 eb == sizeof(uint16_t) ? FSO_DT_BF16 : FSO_DT_F32, 0);
    if (crc < 0) {
        __atomic_store_n(&rk->rail.broken, true, __ATOMIC_RELAXED);
        if (rc == 0)
            rc = zr_fail(&rk->opt.err, crc, "device %d: %s", rk->rank,
                         crc == -ECANCELED ? "the rails failed before" : c->err);
    }
    if (crc == 0)
        __atomic_fetch_add(&rk->rail.net_bytes, sent(z, eb * n), __ATOMIC_RELAXED);
    if (rc == 0 && !home) {
        p = base;
        if ((rc = zr_xfer_via(rk, &rk->opt.err, rk->opt.write_kind, b, FSO_KIND_PARAM, 0, S,
                              &rk->rail.io, base, true, false, &p)) == 0)
            rc = zr_slot_wait(rk, &rk->opt.err, &rk->rail.io, "parameters", b);
    }
    zr_lock(&rk->opt.mu);
    rk->rail.param_ms += fso_now_ms() - t0;
    zr_unlock(&rk->opt.mu);
    return rc;
}

int zr_rail_gather_block(fso_zero *z, int b, fso_kind k, float *flat)
{
    const size_t S = zr_shard_elems(z, b), lo = zr_kind_lo(z, b, k), n = zr_kind_elems(z, b, k);
    for (int r = 0; r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        slot *s = &rk->io.grad_trip;
        fso_coll *c = rk->rail.param;
        float *dev = flat + (size_t)r * S;
        rk->compute.err.rc = 0;
        int rc = zr_shard_fetch(rk, b, k, s);
        if (rc == 0)
            rc = zr_slot_wait(rk, &rk->compute.err, s, fso_kind_name(k), b);
        if (rc == 0)
            memcpy(dev + lo, s->buf, sizeof(float) * n); /* sliced kinds are fp32 */
        /* every box joins, failed or not */
        phase(z, "gathering the master", z->step, b);
        int crc = c->ops->all_gather(c, z->box, dev + lo, dev, n, FSO_DT_F32, 0);
        if (crc < 0 && rc == 0)
            rc = zr_fail(&rk->compute.err, crc, "device %d: %s", r, c->err);
        if (rc < 0)
            return rc;
    }
    return 0;
}
