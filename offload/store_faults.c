/* store_faults.c — a store that forwards to another and injects faults, so
 * I/O errors, a full disk and short reads are testable (tests/test_store.c, test_zero.c).
 *
 * Reads and writes are counted from 1 as they are prepared here. The Nth
 * read or write named by fso_fault_spec is not forwarded: it completes at the
 * next reap with -EIO or -ENOSPC, leaving the store's range (write) or the
 * buffer (read) untouched, which callers must treat as undefined.
 *
 * The short read exercises a real resubmission path. When the inner store
 * has the inject_short_read hook (io_uring), the wrapper arms it just before
 * forwarding the Nth read: the ring then serves that read's first transfer
 * short and the io_uring store's own short-transfer logic reissues the rest.
 * Otherwise (memory) the wrapper forwards the first half, and when that
 * completes resubmits the second half itself; the caller sees one completion
 * of the full length either way. */
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fault_slot {
    uint64_t user;
    char *buf;
    uint64_t off;
    size_t len;
    size_t first;      /* short read served here: bytes of the first half */
    int injected;      /* -EIO/-ENOSPC: not forwarded */
    int ordinal;       /* Nth read or write */
    bool write;
} fault_slot;

typedef struct fault_ctx {
    fso_store *inner;
    fso_fault_spec spec;
    int nreads, nwrites;
    int prepped;       /* since the last submit */
    int qd;
    fault_slot *slots; /* qd of them */
    int *free_slots, nfree;
    int *synth, synth_head, synth_n; /* FIFO of injected completions (slot ids) */
    fso_io *tmp;       /* qd inner completions */
    uint64_t own_resubmits;
} fault_ctx;

static int fault_take_slot(fault_ctx *c)
{
    return c->free_slots[--c->nfree];
}

static void fault_put_slot(fault_ctx *c, int i)
{
    c->free_slots[c->nfree++] = i;
}

static int fault_inner_error(fso_store *s, int rc)
{
    snprintf(s->err, sizeof s->err, "%s", ((fault_ctx *)s->ctx)->inner->err);
    return rc;
}

static int fault_prep(fso_store *s, bool write, void *buf, size_t len, uint64_t off, uint64_t user)
{
    fault_ctx *c = s->ctx;
    fso_store *in = c->inner;
    int rc = fso_store_check(s, write ? "write" : "read", buf, len, off);
    if (rc < 0)
        return rc;
    int ordinal = write ? c->nwrites + 1 : c->nreads + 1;
    int injected = 0;
    if (write && ordinal == c->spec.write_eio_at)
        injected = -EIO;
    else if (write && ordinal == c->spec.write_enospc_at)
        injected = -ENOSPC;
    else if (!write && ordinal == c->spec.read_eio_at)
        injected = -EIO;

    int i = fault_take_slot(c);
    fault_slot *sl = &c->slots[i];
    *sl = (fault_slot){.user = user, .buf = buf, .off = off, .len = len,
                       .injected = injected, .ordinal = ordinal, .write = write};
    if (injected) {
        c->synth[(c->synth_head + c->synth_n++) % c->qd] = i;
    } else if (write) {
        rc = in->ops->prep_write(in, buf, len, off, (uint64_t)i);
    } else {
        size_t send = len;
        if (ordinal == c->spec.short_read_at) {
            if (in->ops->inject_short_read) {
                rc = in->ops->inject_short_read(in, 1);
            } else {
                sl->first = len / 2 / s->align * s->align;
                if (sl->first)
                    send = sl->first;
            }
        }
        if (rc == 0)
            rc = in->ops->prep_read(in, buf, send, off, (uint64_t)i);
    }
    if (rc < 0) {
        fault_put_slot(c, i);
        return fault_inner_error(s, rc);
    }
    if (write)
        c->nwrites++;
    else
        c->nreads++;
    c->prepped++;
    s->inflight++;
    return 0;
}

static int fault_prep_read(fso_store *s, void *buf, size_t len, uint64_t off, uint64_t user)
{
    return fault_prep(s, false, buf, len, off, user);
}

static int fault_prep_write(fso_store *s, const void *buf, size_t len, uint64_t off, uint64_t user)
{
    return fault_prep(s, true, (void *)buf, len, off, user);
}

static int fault_submit(fso_store *s)
{
    fault_ctx *c = s->ctx;
    int rc = c->inner->ops->submit(c->inner);
    if (rc < 0)
        return fault_inner_error(s, rc);
    rc = c->prepped;
    c->prepped = 0;
    return rc;
}

/* Hands slot i's completion to the caller. */
static void fault_complete(fso_store *s, int i, int64_t res, fso_io *out)
{
    fault_ctx *c = s->ctx;
    fault_slot *sl = &c->slots[i];
    *out = (fso_io){sl->user, res};
    if (res >= 0) {
        if (sl->write)
            s->write_bytes += (uint64_t)res;
        else
            s->read_bytes += (uint64_t)res;
    }
    fault_put_slot(c, i);
    s->inflight--;
}

static int fault_reap(fso_store *s, fso_io *out, int max, int min_complete)
{
    fault_ctx *c = s->ctx;
    fso_store *in = c->inner;
    if (min_complete > max || min_complete > s->inflight)
        return fso_store_fail(s, -EINVAL, "faults store: reap: waiting for %d completions with "
                              "room for %d and %d requests in flight", min_complete, max, s->inflight);
    int n = 0;
    for (; n < max && c->synth_n > 0; n++, c->synth_n--, c->synth_head = (c->synth_head + 1) % c->qd) {
        int i = c->synth[c->synth_head];
        fault_slot *sl = &c->slots[i];
        fso_store_fail(s, 0, "faults store: injected %s on %s #%d (%zu bytes at offset %" PRIu64 ")",
                       sl->injected == -EIO ? "EIO" : "ENOSPC", sl->write ? "write" : "read",
                       sl->ordinal, sl->len, sl->off);
        fault_complete(s, i, sl->injected, &out[n]);
    }
    while (n < max && in->inflight > 0) {
        int lim = max - n < c->qd ? max - n : c->qd;
        int got = in->ops->reap(in, c->tmp, lim, n < min_complete ? 1 : 0);
        if (got < 0)
            return fault_inner_error(s, got);
        for (int k = 0; k < got; k++) {
            int i = (int)c->tmp[k].user;
            fault_slot *sl = &c->slots[i];
            int64_t res = c->tmp[k].res;
            if (sl->first && res == (int64_t)sl->first) {
                /* The first half of a short-served read: reissue the rest. */
                int rc = in->ops->prep_read(in, sl->buf + sl->first, sl->len - sl->first,
                                            sl->off + sl->first, (uint64_t)i);
                if (rc == 0) {
                    int sub = in->ops->submit(in);
                    rc = sub < 0 ? sub : 0;
                }
                c->own_resubmits++;
                sl->first = 0;
                if (rc == 0)
                    continue;
                fault_inner_error(s, rc);
                res = rc;
            } else if (res < 0) {
                fault_inner_error(s, (int)res);
            } else {
                res = (int64_t)sl->len; /* both halves of a short-served read */
            }
            fault_complete(s, i, res, &out[n++]);
        }
        if (got == 0 && n >= min_complete)
            break;
    }
    s->resubmits = c->own_resubmits + in->resubmits;
    return n;
}

static int fault_register_buffers(fso_store *s, void *base, size_t len)
{
    fault_ctx *c = s->ctx;
    if (!c->inner->ops->register_buffers)
        return 0;
    int rc = c->inner->ops->register_buffers(c->inner, base, len);
    return rc < 0 ? fault_inner_error(s, rc) : 0;
}

static int fault_file_extent(fso_store *s, uint64_t off, size_t len, int *fd, uint64_t *file_off,
                             size_t *contig)
{
    fso_store *in = ((fault_ctx *)s->ctx)->inner;
    return in->ops->file_extent ? in->ops->file_extent(in, off, len, fd, file_off, contig)
                                : -EOPNOTSUPP;
}

static int fault_flush(fso_store *s)
{
    fso_store *in = ((fault_ctx *)s->ctx)->inner;
    int rc = fso_store_flush(in);
    return rc < 0 ? fault_inner_error(s, rc) : 0;
}

static int fault_grow(fso_store *s, uint64_t capacity_bytes)
{
    fault_ctx *c = s->ctx;
    int rc = fso_store_grow(c->inner, capacity_bytes);
    if (rc < 0)
        return fault_inner_error(s, rc);
    s->capacity_bytes = c->inner->capacity_bytes;
    return 0;
}

/* The context's own arrays (the inner store is the caller's to close). */
static void fault_ctx_free(fault_ctx *c)
{
    if (!c)
        return;
    free(c->slots);
    free(c->free_slots);
    free(c->synth);
    free(c->tmp);
    free(c);
}

static void fault_destroy(fso_store *s)
{
    fault_ctx *c = s->ctx;
    if (c)
        fso_store_destroy(c->inner);
    fault_ctx_free(c);
    free(s);
}

static const fso_store_ops fault_ops = {
    .name = "faults",
    .prep_read = fault_prep_read,
    .prep_write = fault_prep_write,
    .submit = fault_submit,
    .reap = fault_reap,
    .register_buffers = fault_register_buffers,
    .inject_short_read = NULL,
    .file_extent = fault_file_extent,
    .flush = fault_flush,
    .grow = fault_grow,
    .destroy = fault_destroy,
};

int fso_store_wrap_faults(fso_store **out, fso_store *inner, const fso_fault_spec *spec)
{
    *out = NULL;
    if (!inner || !spec || inner->queue_depth < 1 || inner->inflight)
        return -EINVAL;
    fso_store *s = calloc(1, sizeof *s);
    fault_ctx *c = calloc(1, sizeof *c);
    int qd = inner->queue_depth;
    if (c) {
        c->slots = calloc((size_t)qd, sizeof *c->slots);
        c->free_slots = calloc((size_t)qd, sizeof *c->free_slots);
        c->synth = calloc((size_t)qd, sizeof *c->synth);
        c->tmp = calloc((size_t)qd, sizeof *c->tmp);
    }
    if (!s || !c || !c->slots || !c->free_slots || !c->synth || !c->tmp) {
        fault_ctx_free(c);
        free(s);
        return -ENOMEM;
    }
    c->inner = inner;
    c->spec = *spec;
    c->qd = qd;
    for (int i = qd - 1; i >= 0; i--)
        c->free_slots[c->nfree++] = i;
    s->ops = &fault_ops;
    s->ctx = c;
    s->capacity_bytes = inner->capacity_bytes;
    s->align = inner->align;
    s->queue_depth = qd;
    s->direct = inner->direct;
    *out = s;
    return 0;
}
