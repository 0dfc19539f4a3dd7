/* zero_io.c — moving a shard through a host staging slot: the NVMe store's
 * requests and completions (shared by a device's compute and optimizer
 * threads), the device copies and their marks, waiting for a slot, and
 * opening a device's store. */
#include "zero_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_backend.h"
#include "topology.h"
#include "util.h"

int zr_fail(errsink *es, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fso_first_errorv(&es->rc, es->msg, sizeof es->msg, rc, fmt, ap);
    va_end(ap);
    return rc;
}

/* Reap at least one completion and account it to its slot. Called with
 * io.mu held: the compute and optimizer threads share the store's ring, and
 * either may reap the other's completions. */
static int reap_some(rank_state *rk, errsink *es)
{
    fso_io done[16];
    int n = rk->io.store->ops->reap(rk->io.store, done, 16, 1);
    if (n < 0)
        return zr_fail(es, n, "device %d: NVMe store: %s", rk->rank, rk->io.store->err);
    for (int i = 0; i < n; i++) {
        slot *s = (slot *)(uintptr_t)done[i].user;
        s->pending--;
        if (done[i].res < 0 && s->err == 0)
            s->err = (int)done[i].res;
    }
    return 0;
}

int zr_queue_io(rank_state *rk, errsink *es, slot *s, bool write, void *buf, size_t bytes,
                uint64_t off)
{
    int rc = 0;
    zr_lock(&rk->io.mu);
    for (;;) {
        rc = write ? rk->io.store->ops->prep_write(rk->io.store, buf, bytes, off, (uintptr_t)s)
                   : rk->io.store->ops->prep_read(rk->io.store, buf, bytes, off, (uintptr_t)s);
        if (rc == 0)
            break;
        if (rc != -EBUSY) {
            zr_fail(es, rc, "device %d: NVMe %s of %zu bytes at %llu: %s", rk->rank,
                    write ? "write" : "read", bytes, (unsigned long long)off,
                    rk->io.store->err[0] ? rk->io.store->err : strerror(-rc));
            goto out;
        }
        int sr = rk->io.store->ops->submit(rk->io.store);
        if (sr < 0) {
            rc = zr_fail(es, sr, "device %d: NVMe submit: %s", rk->rank, strerror(-sr));
            goto out;
        }
        if ((rc = reap_some(rk, es)) < 0)
            goto out;
    }
    s->pending++;
    int sr = rk->io.store->ops->submit(rk->io.store);
    if (sr < 0)
        rc = zr_fail(es, sr, "device %d: NVMe submit: %s", rk->rank, strerror(-sr));
out:
    zr_unlock(&rk->io.mu);
    return rc;
}

/* A mark of everything queued on be so far (0 where ops finish as they
 * return); a mark of the copies only (backend.h mark_copies, else a full
 * one); staging copies either way ordered after mark `after`. */
uint64_t zr_mark(fso_backend *be)
{
    return be->ops->mark ? be->ops->mark(be) : 0;
}

void zr_pinned_free(zr_pinned *p)
{
#if FSO_HAVE_CUDA
    if (p->pinned)
        fso_cuda_host_unregister(p->buf, p->bytes);
#endif
    fso_io_free(p->buf, p->bytes);
    *p = (zr_pinned){.warned = p->warned};
}

void *zr_pinned_get(zr_pinned *p, size_t bytes, bool cuda, const char *what, const char *cost)
{
    if (p->buf && p->bytes >= bytes)
        return p->buf;
    zr_pinned_free(p);
    if (!(p->buf = fso_io_alloc(bytes)))
        return NULL;
    p->bytes = bytes;
#if FSO_HAVE_CUDA
    char cerr[256] = "";
    if (cuda)
        p->pinned = fso_cuda_host_register(p->buf, bytes, cerr, sizeof cerr) == 0;
    if (cuda && !p->pinned && !p->warned) {
        p->warned = true;
        fprintf(stderr, "fsoff: warning: %s are pageable, not pinned: %s; %s\n", what, cerr, cost);
    }
#else
    (void)cuda;
    (void)what;
    (void)cost;
#endif
    return p->buf;
}

uint64_t zr_mark_copies(fso_backend *be)
{
    return be->ops->mark_copies ? be->ops->mark_copies(be) : zr_mark(be);
}

void zr_copy_in(fso_backend *be, void *dst, const void *src, size_t bytes, uint64_t after)
{
    if (be->ops->copy_h2d_after)
        be->ops->copy_h2d_after(be, dst, src, bytes, after);
    else
        be->ops->copy_h2d(be, dst, src, bytes);
}

void zr_copy_out(fso_backend *be, void *dst, const void *src, size_t bytes, uint64_t after)
{
    if (be->ops->copy_d2h_after)
        be->ops->copy_d2h_after(be, dst, src, bytes, after);
    else
        be->ops->copy_d2h(be, dst, src, bytes);
}

void zr_marks_defer(rank_state *rk, slot *s)
{
    rank_optim *o = &rk->opt;
    const int most = (int)(sizeof o->unmarked / sizeof o->unmarked[0]);
    if (s->copied == ZR_MARK_LATER)
        return;
    if (o->n_unmarked == most)
        zr_marks_take(rk);
    s->copied = ZR_MARK_LATER;
    o->unmarked[o->n_unmarked++] = s;
}

void zr_marks_take(rank_state *rk)
{
    rank_optim *o = &rk->opt;
    if (o->n_unmarked == 0)
        return;
    const uint64_t m = zr_mark_copies(rk->be);
    for (int i = 0; i < o->n_unmarked; i++)
        o->unmarked[i]->copied = m;
    o->n_unmarked = 0;
}

/* The slot's last device copy is done (its buffer may be reused). */
void zr_copies_wait(rank_state *rk, slot *s)
{
    if (s->copied == ZR_MARK_LATER)
        zr_marks_take(rk);
    if (s->copied) {
        rk->be->ops->wait_mark(rk->be, s->copied);
        s->copied = 0;
    }
}

/* Wait for the slot's I/O and device copies; an error is final for the
 * step: never compute from a partial or stale shard. */
int zr_slot_wait(rank_state *rk, errsink *es, slot *s, const char *what, int block)
{
    int rc = 0;
    zr_copies_wait(rk, s);
    if (!rk->io.store)
        return 0;
    zr_lock(&rk->io.mu);
    while (s->pending > 0 && rc == 0)
        rc = reap_some(rk, es);
    if (rc == 0 && s->err) {
        int e = s->err;
        s->err = 0;
        rc = zr_fail(es, e, "device %d: NVMe I/O for block %d's %s failed: %s; the step "
                                  "was not applied (check the drive and `dmesg`)",
                     rk->rank, block, what, strerror(-e));
    }
    zr_unlock(&rk->io.mu);
    return rc;
}

/* Wait until none of the n slots has I/O in flight, dropping their errors
 * (what they held is not used). */
static void drain_list(rank_state *rk, slot *const *all, int n)
{
    errsink ignore = {0};
    zr_lock(&rk->io.mu);
    for (int i = 0; i < n; i++) {
        while (all[i]->pending > 0)
            if (reap_some(rk, &ignore) < 0)
                break;
        all[i]->err = 0;
    }
    zr_unlock(&rk->io.mu);
}

void zr_drain_slots(rank_state *rk, bool with_optimizer)
{
    if (!rk->io.store)
        return;
    slot *all[FSO_FP_MAX_PARAM_SLOTS + FSO_FP_MAX_CHUNK_SETS * FSO_N_KINDS + 1];
    int n = 0;
    for (int j = 0; j < rk->io.n_prefetch; j++)
        all[n++] = &rk->io.prefetch[j];
    all[n++] = &rk->io.grad_trip;
    if (with_optimizer)
        for (int set = 0; set < rk->opt.n_sets; set++)
            for (int k = 0; k < FSO_N_KINDS; k++)
                all[n++] = &rk->opt.chunk[set][k];
    drain_list(rk, all, n);
}

void zr_drain_prefetch(rank_state *rk)
{
    if (!rk->io.store)
        return;
    slot *all[FSO_FP_MAX_PARAM_SLOTS];
    for (int j = 0; j < rk->io.n_prefetch; j++)
        all[j] = &rk->io.prefetch[j];
    drain_list(rk, all, rk->io.n_prefetch);
}

/* Device rk's NVMe store over the folders the offload settings name,
 * `capacity` bytes, its buffers registered over the arena. */
int zr_open_store(fso_zero *z, rank_state *rk, const fso_offload_config *o,
                      uint64_t capacity, char *err, size_t errlen)
{
    char paths[4096], prefix[64], serr[512] = "";
    bool optim_nvme = false; /* some of the optimizer's kinds live there: its folders */
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        optim_nvme = optim_nvme || fso_offload_tier(o, (fso_kind)k) == FSO_TIER_NVME;
    const char *src = optim_nvme ? o->optim_nvme_path : o->param_nvme_path;
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
    /* boxes sharing a folder (two on one machine, a shared filesystem)
     * each keep files of their own */
    if (z->boxes > 1)
        snprintf(prefix, sizeof prefix, "fsoff-box%d-dev%d", z->box, rk->rank);
    else
        snprintf(prefix, sizeof prefix, "fsoff-dev%d", rk->rank);
    so.file_prefix = prefix;
    int rc = fso_store_open_uring(&rk->io.store, &so, serr, sizeof serr);
    if (rc < 0) {
        snprintf(err, errlen, "NVMe: %s", serr);
        return rc;
    }
    if (rk->io.store->ops->register_buffers && z->arena.pinned &&
        rk->io.store->ops->register_buffers(rk->io.store, z->arena.base, z->arena.pinned) < 0 &&
        rk->rank == 0)
        fprintf(stderr, "fsoff: warning: NVMe: %s; continuing with unregistered buffers "
                        "(slower)\n", rk->io.store->err);
    return 0;
}
