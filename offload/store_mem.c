/* store_mem.c — the memory store: the host tier and the reference the other
 * stores are tested against.
 *
 * One anonymous mapping of capacity_bytes (pages appear on first touch).
 * prep_* queues a request, submit copies every queued request and moves it to
 * the completed list, reap hands completions out, so a caller sees the same
 * life cycle as with io_uring: data is only guaranteed moved at reap. */
#include "store.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct mem_req {
    uint64_t user;
    char *buf;
    uint64_t off;
    size_t len;
    bool write;
} mem_req;

typedef struct mem_ctx {
    char *base;
    size_t map_bytes;
    mem_req queued[FSO_STORE_MEM_QUEUE_DEPTH]; /* FIFO: prepared, not submitted */
    int q_head, q_n;
    fso_io done[FSO_STORE_MEM_QUEUE_DEPTH];   /* FIFO: completed, not reaped */
    bool done_write[FSO_STORE_MEM_QUEUE_DEPTH];
    int d_head, d_n;
} mem_ctx;

enum { MEM_QD = FSO_STORE_MEM_QUEUE_DEPTH };

static int mem_prep(fso_store *s, bool write, void *buf, size_t len, uint64_t off, uint64_t user)
{
    mem_ctx *c = s->ctx;
    int rc = fso_store_check(s, write ? "write" : "read", buf, len, off);
    if (rc < 0)
        return rc;
    c->queued[(c->q_head + c->q_n) % MEM_QD] = (mem_req){user, buf, off, len, write};
    c->q_n++;
    s->inflight++;
    return 0;
}

static int mem_prep_read(fso_store *s, void *buf, size_t len, uint64_t off, uint64_t user)
{
    return mem_prep(s, false, buf, len, off, user);
}

static int mem_prep_write(fso_store *s, const void *buf, size_t len, uint64_t off, uint64_t user)
{
    return mem_prep(s, true, (void *)buf, len, off, user);
}

static int mem_submit(fso_store *s)
{
    mem_ctx *c = s->ctx;
    int n = c->q_n;
    for (; c->q_n > 0; c->q_n--, c->q_head = (c->q_head + 1) % MEM_QD) {
        mem_req *r = &c->queued[c->q_head];
        if (r->write)
            memcpy(c->base + r->off, r->buf, r->len);
        else
            memcpy(r->buf, c->base + r->off, r->len);
        int d = (c->d_head + c->d_n++) % MEM_QD;
        c->done[d] = (fso_io){r->user, (int64_t)r->len};
        c->done_write[d] = r->write;
    }
    return n;
}

static int mem_reap(fso_store *s, fso_io *out, int max, int min_complete)
{
    mem_ctx *c = s->ctx;
    if (min_complete > max || min_complete > s->inflight)
        return fso_store_fail(s, -EINVAL, "mem store: reap: waiting for %d completions with "
                              "room for %d and %d requests in flight", min_complete, max, s->inflight);
    if (c->d_n < min_complete)
        mem_submit(s);
    int n = 0;
    for (; n < max && c->d_n > 0; n++, c->d_n--, c->d_head = (c->d_head + 1) % MEM_QD) {
        out[n] = c->done[c->d_head];
        if (c->done_write[c->d_head])
            s->write_bytes += (uint64_t)out[n].res;
        else
            s->read_bytes += (uint64_t)out[n].res;
    }
    s->inflight -= n;
    return n;
}

static int mem_grow(fso_store *s, uint64_t capacity_bytes)
{
    mem_ctx *c = s->ctx;
    if (capacity_bytes > SIZE_MAX - 4096)
        return fso_store_fail(s, -EINVAL, "mem store: capacity %llu is too large",
                              (unsigned long long)capacity_bytes);
    size_t bytes = ((size_t)capacity_bytes + 4095) & ~(size_t)4095;
    if (bytes > c->map_bytes) {
        void *p = mremap(c->base, c->map_bytes, bytes, MREMAP_MAYMOVE);
        if (p == MAP_FAILED)
            return fso_store_fail(s, -ENOMEM, "mem store: growing to %zu bytes: %s", bytes,
                                  strerror(errno));
        c->base = p;
        c->map_bytes = bytes;
    }
    s->capacity_bytes = capacity_bytes;
    return 0;
}

static void mem_destroy(fso_store *s)
{
    mem_ctx *c = s->ctx;
    if (c && c->base)
        munmap(c->base, c->map_bytes);
    free(c);
    free(s);
}

static const fso_store_ops mem_ops = {
    .name = "mem",
    .prep_read = mem_prep_read,
    .prep_write = mem_prep_write,
    .submit = mem_submit,
    .reap = mem_reap,
    .register_buffers = NULL,
    .inject_short_read = NULL,
    .grow = mem_grow,
    .destroy = mem_destroy,
};

int fso_store_open_mem(fso_store **out, uint64_t capacity_bytes, size_t align)
{
    *out = NULL;
    if (capacity_bytes == 0 || capacity_bytes > SIZE_MAX - 4096 || align == 0 || (align & (align - 1)))
        return -EINVAL;
    fso_store *s = calloc(1, sizeof *s);
    mem_ctx *c = calloc(1, sizeof *c);
    if (!s || !c) {
        free(s);
        free(c);
        return -ENOMEM;
    }
    c->map_bytes = (size_t)(capacity_bytes + 4095) & ~(size_t)4095;
    c->base = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (c->base == MAP_FAILED) {
        free(c);
        free(s);
        return -ENOMEM;
    }
    s->ops = &mem_ops;
    s->ctx = c;
    s->capacity_bytes = capacity_bytes;
    s->align = align;
    s->queue_depth = MEM_QD;
    s->direct = false;
    *out = s;
    return 0;
}
