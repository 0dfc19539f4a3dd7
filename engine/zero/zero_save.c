/* zero_save.c — the training state streamed out for a checkpoint while
 * training goes on, and loaded back in (zero.h, "checkpoints").
 *
 * The gate. fso_zero_save_arm marks a save of step N; from then on an
 * update of a later step waits, before it changes block b, until the saver
 * is done with b (zr_save_gate, called by zero_optim.c). The saver
 * takes block b once every device's update of step N has landed there
 * (rank_optim.rest), so it reads exactly step N's master, m and v, and
 * training waits for it only where it would otherwise overtake it.
 *
 * The stream. Per block, in the order the next update visits them, per
 * device, per kind: the shard's saved part in pieces of at most
 * spec->piece_bytes. A piece in host memory (the arena, or a device the CPU
 * addresses) is checksummed and written to the checkpoint straight from
 * there when page-aligned; otherwise it goes through one of a few staging
 * buffers: read from the NVMe store (through the device's store, shared
 * with its compute and optimizer threads), copied from a GPU after the
 * update's mark, or copied from unaligned host memory. A piece on NVMe is
 * cloned into the checkpoint (FICLONERANGE) instead of written when both
 * files are on one filesystem that shares blocks; it is still read once,
 * for its checksum. Writes go out through the checkpoint's own store
 * (io_uring, O_DIRECT), several in flight; staging buffers are reused as
 * their writes complete, so a save holds a few pieces, never a block. */
#include "zero_impl.h"

#include <errno.h>
#include <linux/fs.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>

#include "ckpt/crc32c.h"
#include "cuda/cuda_backend.h"
#include "util.h"

#define STAGES FSO_ZERO_SAVE_STAGES
#define DIRECT_TAG ((uint64_t)STAGES) /* + block: a write straight from that block's shard */

/* ------------------------------------------------------------------ the gate */

int zr_save_init(fso_zero *z)
{
    save_gate *g = &z->save;
    g->done = calloc((size_t)z->n_blocks, sizeof *g->done);
    g->waited_ms = calloc((size_t)z->world, sizeof *g->waited_ms);
    if (!g->done || !g->waited_ms)
        return -ENOMEM;
    zr_mutex_init(&g->mu, ZR_LOCK_SAVE);
    pthread_cond_init(&g->cv, NULL);
    g->init = true;
    return 0;
}

/* The saver's STAGES buffers of piece_bytes (zr_pinned). */
static void *stages_for(fso_zero *z, size_t piece_bytes)
{
    return zr_pinned_get(&z->save.stages, piece_bytes * STAGES, z->cuda,
                         "checkpoint: the saver's staging buffers",
                         "copies from the GPUs go through the driver's bounce buffer and wait "
                         "for the host");
}

void zr_save_free(fso_zero *z)
{
    save_gate *g = &z->save;
    zr_pinned_free(&g->stages);
    if (g->init) {
        zr_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
    }
    free(g->done);
    free(g->waited_ms);
    memset(g, 0, sizeof *g);
}

int fso_zero_save_arm(fso_zero *z)
{
    save_gate *g = &z->save;
    zr_lock(&g->mu);
    if (g->active) {
        zr_unlock(&g->mu);
        return -EBUSY;
    }
    g->active = true;
    g->step = z->step;
    memset(g->done, 0, sizeof *g->done * (size_t)z->n_blocks);
    memset(g->waited_ms, 0, sizeof *g->waited_ms * (size_t)z->world);
    g->idle_waited_ms = 0;
    zr_unlock(&g->mu);
    return 0;
}

static void block_out(fso_zero *z, int b)
{
    zr_lock(&z->save.mu);
    z->save.done[b] = true;
    pthread_cond_broadcast(&z->save.cv);
    zr_unlock(&z->save.mu);
}

void fso_zero_save_disarm(fso_zero *z)
{
    zr_lock(&z->save.mu);
    z->save.active = false;
    pthread_cond_broadcast(&z->save.cv);
    zr_unlock(&z->save.mu);
}

/* While an update waits here, its thread keeps its device's queue moving:
 * the saver may be waiting for a copy out of another device that is queued
 * behind a collective, and a device whose queued work completes only while
 * a host thread of its own waits for it (cpu-async, backend.h) would
 * otherwise never meet that collective, its compute thread waiting for this
 * update. On a GPU the queue moves by itself and the wait costs nothing. */
#define GATE_PUMP_NS 2000000 /* 2 ms */

/* Whether an update of step t must wait before it changes block b: a save
 * of an earlier step still needs it. Asked again at every wake-up: the save
 * waited for may have ended (failed) and the next one, of step t itself,
 * been armed before this thread ran, and that save waits for this update. */
static bool gate_closed(const save_gate *g, int b, int64_t t)
{
    return g->active && t > g->step && !g->done[b];
}

void zr_save_gate(rank_state *rk, int b, int64_t t)
{
    save_gate *g = &rk->z->save;
    fso_backend *be = rk->be;
    const bool pump = be->ops->mark && rk->z->world > 1;
    zr_lock(&g->mu);
    if (gate_closed(g, b, t)) {
        double t0 = fso_now_ms();
        while (gate_closed(g, b, t)) {
            if (!pump) {
                zr_cond_wait(&g->cv, &g->mu);
                continue;
            }
            zr_unlock(&g->mu);
            be->ops->wait_mark(be, be->ops->mark(be));
            zr_lock(&g->mu);
            if (gate_closed(g, b, t)) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += GATE_PUMP_NS;
                if (ts.tv_nsec >= 1000000000) {
                    ts.tv_sec++;
                    ts.tv_nsec -= 1000000000;
                }
                zr_cond_timedwait(&g->cv, &g->mu, &ts);
            }
        }
        g->waited_ms[rk->rank] += fso_now_ms() - t0;
    }
    zr_unlock(&g->mu);
}

void zr_save_wait_idle(fso_zero *z)
{
    double t0 = fso_now_ms();
    zr_lock(&z->save.mu);
    while (z->save.active)
        zr_cond_wait(&z->save.cv, &z->save.mu);
    z->save.idle_waited_ms += fso_now_ms() - t0;
    zr_unlock(&z->save.mu);
}

double fso_zero_save_waited_ms(fso_zero *z)
{
    zr_lock(&z->save.mu);
    const double idle = z->save.idle_waited_ms; /* a re-plan waiting for the save */
    double dev = 0;
    for (int r = 0; r < z->world; r++)
        if (z->save.waited_ms[r] > dev)
            dev = z->save.waited_ms[r];
    zr_unlock(&z->save.mu);
    return idle + dev;
}

/* ------------------------------------------------------------------ the stream */

/* A staging buffer and the piece it carries. */
typedef struct stage {
    void *buf;             /* piece_bytes, 4 KiB aligned */
    slot io;               /* its NVMe read or device copy */
    enum { FREE, FETCHING, WRITING } state;
    rank_state *rk;        /* whose store or device it is read from */
    int b;
    fso_kind k;
    size_t bytes;          /* the piece */
    uint64_t dst;          /* its offset in the checkpoint */
    uint64_t nvme_off;     /* NVMe: its offset in the device's store; else UINT64_MAX */
} stage;

typedef struct saver {
    fso_zero *z;
    fso_zero_save_spec *spec;
    errsink es;            /* NVMe reads of the state */
    stage st[STAGES];
    int fetch[STAGES];     /* stages in FETCHING, oldest first */
    int head, n_fetch;
    int *direct;           /* [block] writes straight from its shards in flight */
    bool *queued;          /* [block] every piece asked for, its staged ones copied out */
    int blocks_out;
    size_t cap_pieces;
    bool reflink;
} saver;

static int fail(saver *sv, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(saver *sv, int rc, const char *fmt, ...)
{
    if (!sv->spec->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sv->spec->err, sizeof sv->spec->err, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* Block b is out: a later update may change it. */
static void block_done(saver *sv, int b)
{
    block_out(sv->z, b);
    sv->blocks_out++;
    if (sv->spec->after_block)
        sv->spec->after_block(sv->spec->ctx, sv->blocks_out, sv->z->n_blocks);
}

/* Collect at least min of the checkpoint's write completions. */
static int reap(saver *sv, int min)
{
    fso_store *out = sv->spec->out;
    fso_io done[16];
    while (min > 0 && out->inflight > 0) {
        int want = min < 16 ? min : 16;
        if (want > out->inflight)
            want = out->inflight;
        int n = out->ops->reap(out, done, 16, want);
        if (n < 0)
            return fail(sv, n, "%s", out->err);
        int rc = 0;
        for (int i = 0; i < n; i++) {
            if (done[i].res < 0 && rc == 0)
                rc = fail(sv, (int)done[i].res, "%s", out->err);
            if (done[i].user < DIRECT_TAG) {
                sv->st[done[i].user].state = FREE;
                continue;
            }
            const int b = (int)(done[i].user - DIRECT_TAG);
            if (--sv->direct[b] == 0 && sv->queued[b] && rc == 0 && !sv->spec->err[0])
                block_done(sv, b);
        }
        if (rc < 0)
            return rc;
        min -= n;
    }
    return 0;
}

static int write_out(saver *sv, const void *buf, size_t bytes, uint64_t off, uint64_t tag)
{
    fso_store *out = sv->spec->out;
    int rc;
    while ((rc = out->ops->prep_write(out, buf, bytes, off, tag)) == -EBUSY)
        if ((rc = reap(sv, 1)) < 0)
            return rc;
    if (rc < 0)
        return fail(sv, rc, "%s", out->err);
    rc = out->ops->submit(out);
    return rc < 0 ? fail(sv, rc, "%s", out->err) : 0;
}

static int record(saver *sv, uint64_t off, size_t bytes, const void *data)
{
    fso_zero_save_spec *sp = sv->spec;
    if (sp->n_pieces == sv->cap_pieces) {
        size_t cap = sv->cap_pieces ? 2 * sv->cap_pieces : 256;
        fso_zero_save_piece *p = realloc(sp->pieces, cap * sizeof *p);
        if (!p)
            return fail(sv, -ENOMEM, "out of host memory for the checkpoint's checksums");
        sp->pieces = p;
        sv->cap_pieces = cap;
    }
    sp->pieces[sp->n_pieces++] = (fso_zero_save_piece){off, bytes, fso_crc32c(0, data, bytes)};
    sp->bytes += bytes;
    return 0;
}

/* Share the piece's NVMe blocks with the checkpoint instead of writing
 * them: true when done. The first refusal (another filesystem, one that
 * cannot share blocks) turns cloning off for the rest of the save. */
static bool clone_piece(saver *sv, const stage *s)
{
    fso_store *src = s->rk->io.store, *out = sv->spec->out;
    int sfd, dfd;
    uint64_t soff, doff;
    size_t scont, dcont;
    if (!sv->reflink || !src->ops->file_extent || !out->ops->file_extent ||
        src->ops->file_extent(src, s->nvme_off, s->bytes, &sfd, &soff, &scont) < 0 ||
        out->ops->file_extent(out, s->dst, s->bytes, &dfd, &doff, &dcont) < 0 ||
        scont < s->bytes || dcont < s->bytes) {
        sv->reflink = false;
        return false;
    }
    struct file_clone_range r = {.src_fd = sfd, .src_offset = soff, .src_length = s->bytes,
                                 .dest_offset = doff};
    if (ioctl(dfd, FICLONERANGE, &r) != 0) {
        sv->reflink = false;
        return false;
    }
    sv->spec->cloned_bytes += s->bytes;
    return true;
}

/* The oldest fetch in: checksum, then clone or write it. */
static int finish_fetch(saver *sv)
{
    stage *s = &sv->st[sv->fetch[sv->head]];
    sv->head = (sv->head + 1) % STAGES;
    sv->n_fetch--;
    int rc = zr_slot_wait(s->rk, &sv->es, &s->io, fso_kind_name(s->k), s->b);
    if (rc < 0)
        return fail(sv, rc, "%s", sv->es.msg);
    if ((rc = record(sv, s->dst, s->bytes, s->buf)) < 0)
        return rc;
    if (s->nvme_off != UINT64_MAX && clone_piece(sv, s)) {
        s->state = FREE;
        return 0;
    }
    s->state = WRITING;
    return write_out(sv, s->buf, s->bytes, s->dst, (uint64_t)(s - sv->st));
}

static int take_stage(saver *sv, stage **out)
{
    for (;;) {
        for (int i = 0; i < STAGES; i++)
            if (sv->st[i].state == FREE) {
                *out = &sv->st[i];
                return 0;
            }
        int rc = sv->n_fetch ? finish_fetch(sv) : reap(sv, 1);
        if (rc < 0)
            return rc;
    }
}

/* Elements [c0, c0+n) of what device rk holds of shard (b, k) (this box's
 * slice across boxes) to offset dst. */
static int save_piece(saver *sv, rank_state *rk, int b, fso_kind k, size_t c0, size_t n,
                      uint64_t dst)
{
    const size_t bytes = sizeof(float) * n;
    loc *l = zr_locate(rk, b, k);
    const bool addressable = fso_fp_cpu_reaches(&rk->z->rules, l->tier);
    const char *src = addressable ? (const char *)l->ptr + sizeof(float) * c0 : NULL;
    int rc;
    if (src && (uintptr_t)src % FSO_IO_PAGE == 0) {
        if ((rc = record(sv, dst, bytes, src)) < 0)
            return rc;
        sv->direct[b]++;
        return write_out(sv, src, bytes, dst, DIRECT_TAG + (uint64_t)b);
    }
    stage *s;
    if ((rc = take_stage(sv, &s)) < 0)
        return rc;
    *s = (stage){.buf = s->buf, .state = FETCHING, .rk = rk, .b = b, .k = k, .bytes = bytes,
                 .dst = dst, .nvme_off = UINT64_MAX};
    if (src) {
        memcpy(s->buf, src, bytes);
    } else if (l->tier == FSO_TIER_NVME) {
        s->nvme_off = l->off + sizeof(float) * c0;
        if ((rc = zr_queue_io(rk, &sv->es, &s->io, false, s->buf, bytes, s->nvme_off)) < 0)
            return fail(sv, rc, "%s", sv->es.msg);
    } else { /* a GPU's memory: after the update that made it step N's */
        zr_copy_out(rk->be, s->buf, (const char *)l->ptr + sizeof(float) * c0, bytes,
                    rk->opt.ready_mark[b]);
        s->io.copied = zr_mark_copies(rk->be);
    }
    sv->fetch[(sv->head + sv->n_fetch++) % STAGES] = (int)(s - sv->st);
    return 0;
}

/* Device rk's update of the saved step has landed on block b. */
static int wait_landed(saver *sv, rank_state *rk, int b, int64_t step)
{
    int rc = 0;
    zr_lock(&rk->opt.mu);
    while (rk->opt.rest[b] < step && fso_first_error_rc(&rk->opt.err.rc) == 0)
        zr_cond_wait(&rk->opt.cv, &rk->opt.mu);
    if (rk->opt.rest[b] < step)
        rc = fail(sv, rk->opt.err.rc, "device %d's update of step %lld failed: %s", rk->rank,
                  (long long)step, rk->opt.err.msg);
    zr_unlock(&rk->opt.mu);
    return rc;
}

static int save_block(saver *sv, int b, int64_t step)
{
    fso_zero *z = sv->z;
    const fso_zero_save_spec *sp = sv->spec;
    /* this box's part of each device's shard: the whole shard on one box,
     * its slice across several (the other boxes write theirs) */
    const size_t S = zr_shard_elems(z, b), E = sp->block_elems[b];
    const size_t slo = zr_opt_lo(z, b), sn = zr_opt_elems(z, b);
    int rc;
    /* devices whose part is only padding (lo >= E) have nothing to save */
    for (int r = 0; r < z->world && (size_t)r * S + slo < E; r++)
        if ((rc = wait_landed(sv, &z->ranks[r], b, step)) < 0)
            return rc;
    /* kind by kind, device by device: front to back in the file */
    for (int i = 0; i < FSO_ZERO_SAVED_KINDS; i++)
        for (int r = 0; r < z->world && (size_t)r * S + slo < E; r++) {
            const size_t lo = (size_t)r * S + slo, n = E - lo < sn ? E - lo : sn;
            const uint64_t base = sp->block_off[(size_t)i * z->n_blocks + b] + sizeof(float) * lo;
            for (size_t c0 = 0, k; c0 < n; c0 += k) {
                /* up to the next multiple of piece_bytes in the file: every write
                 * whole in one of the store's stripes */
                const uint64_t at = base + sizeof(float) * c0;
                k = (sp->piece_bytes - at % sp->piece_bytes) / sizeof(float);
                if (k > n - c0)
                    k = n - c0;
                if ((rc = save_piece(sv, &z->ranks[r], b, (fso_kind)(FSO_KIND_MASTER + i), c0, k,
                                     at)) < 0)
                    return rc;
            }
        }
    /* the block may change once its data is in staging and its writes
     * straight from the shards are done: now, or as they complete */
    while (sv->n_fetch)
        if ((rc = finish_fetch(sv)) < 0)
            return rc;
    sv->queued[b] = true;
    if (sv->direct[b] == 0)
        block_done(sv, b);
    return 0;
}

/* After a failure: what is still in flight lands before buffers go. */
static void drain(saver *sv)
{
    fso_store *out = sv->spec->out;
    fso_io sink[16];
    while (out->inflight > 0 && out->ops->reap(out, sink, 16, 1) > 0)
        ;
    for (int i = 0; i < STAGES; i++) {
        stage *s = &sv->st[i];
        if (s->state == FETCHING && s->rk) {
            errsink ignore = {0};
            zr_slot_wait(s->rk, &ignore, &s->io, "", s->b);
        }
    }
}

int fso_zero_save_stream(fso_zero *z, fso_zero_save_spec *spec)
{
    saver sv = {.z = z, .spec = spec, .reflink = spec->reflink};
    const int64_t step = z->save.step;
    const bool backward = z->cfg->optimizer_overlap == FSO_OVERLAP_BACKWARD;
    int rc = 0;
    spec->pieces = NULL;
    spec->n_pieces = 0;
    spec->bytes = spec->cloned_bytes = 0;
    spec->err[0] = '\0';
    if (spec->piece_bytes == 0 || spec->piece_bytes % FSO_IO_PAGE) {
        fso_zero_save_disarm(z);
        return fail(&sv, -EINVAL, "checkpoint pieces of %zu bytes: must be whole 4 KiB pages",
                    spec->piece_bytes);
    }
    sv.direct = calloc((size_t)z->n_blocks, sizeof *sv.direct);
    sv.queued = calloc((size_t)z->n_blocks, sizeof *sv.queued);
    if (!sv.direct || !sv.queued)
        rc = fail(&sv, -ENOMEM, "out of host memory for the saver");
    char *stages = rc == 0 ? stages_for(z, spec->piece_bytes) : NULL;
    if (rc == 0 && !stages)
        rc = fail(&sv, -ENOMEM, "out of host memory for the saver's buffers");
    for (int i = 0; i < STAGES && rc == 0; i++)
        sv.st[i].buf = stages + (size_t)i * spec->piece_bytes;
    /* the order the next update takes the blocks in, so it waits the least */
    for (int j = 0; j < z->n_blocks && rc == 0; j++)
        rc = save_block(&sv, backward ? z->n_blocks - 1 - j : j, step);
    if (rc == 0)
        rc = reap(&sv, spec->out->inflight);
    if (rc < 0)
        drain(&sv);
    fso_zero_save_disarm(z);
    free(sv.direct);
    free(sv.queued);
    return rc;
}

/* ------------------------------------------------------------------ loading */

int fso_zero_load_block(fso_zero *z, int b, fso_kind k, float *flat, char *err, size_t errlen)
{
    int rc = zr_block_xfer(z, b, flat, k, 0);
    if (rc == 0 && k == FSO_KIND_MASTER)
        rc = zr_block_xfer(z, b, flat, FSO_KIND_PARAM, 0);
    if (rc < 0)
        zr_first_error(z, err, errlen);
    return rc;
}

void fso_zero_set_steps(fso_zero *z, int64_t steps)
{
    z->step = steps;
    for (int r = 0; r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        zr_lock(&rk->opt.mu);
        for (int b = 0; b < z->n_blocks; b++)
            rk->opt.ready[b] = rk->opt.rest[b] = steps;
        zr_unlock(&rk->opt.mu);
    }
}
