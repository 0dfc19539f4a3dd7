/* store.c — what every store shares: the request checks, error messages,
 * destroy, and the blocking read/write helpers over the queue (store.h). */
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

int fso_store_fail(fso_store *s, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
    return rc;
}

int fso_store_check(fso_store *s, const char *op, const void *buf, size_t len, uint64_t off)
{
    size_t a = s->align;
    if (len == 0 || len % a || off % a || (uintptr_t)buf % a)
        return fso_store_fail(s, -EINVAL, "%s store: %s of %zu bytes at offset %" PRIu64
                              " from %p: buffer, length and offset must be non-zero multiples of %zu",
                              s->ops->name, op, len, off, buf, a);
    if (off > s->capacity_bytes || len > s->capacity_bytes - off)
        return fso_store_fail(s, -EINVAL, "%s store: %s of %zu bytes at offset %" PRIu64
                              " runs past the capacity of %" PRIu64 " bytes",
                              s->ops->name, op, len, off, s->capacity_bytes);
    if (s->inflight >= s->queue_depth)
        return fso_store_fail(s, -EBUSY, "%s store: %s: %d requests in flight already "
                              "(the queue depth); reap some first", s->ops->name, op, s->inflight);
    return 0;
}

int fso_store_flush(fso_store *s)
{
    return s->ops->flush ? s->ops->flush(s) : 0;
}

void fso_store_destroy(fso_store *s)
{
    if (s && s->ops && s->ops->destroy)
        s->ops->destroy(s);
}

static int store_wait_one(fso_store *s, const char *op, void *buf, size_t len, uint64_t off)
{
    if (s->inflight)
        return fso_store_fail(s, -EBUSY, "%s store: blocking %s while %d requests are in "
                              "flight; reap them first", s->ops->name, op, s->inflight);
    int rc = op[0] == 'w' ? s->ops->prep_write(s, buf, len, off, 0)
                          : s->ops->prep_read(s, buf, len, off, 0);
    if (rc < 0)
        return rc;
    rc = s->ops->submit(s);
    if (rc < 0)
        return rc;
    fso_io io;
    do
        rc = s->ops->reap(s, &io, 1, 1);
    while (rc == 0);
    if (rc < 0)
        return rc;
    if (io.res < 0)
        return (int)io.res; /* the store wrote the message */
    if ((uint64_t)io.res != len)
        return fso_store_fail(s, -EIO, "%s store: %s of %zu bytes at offset %" PRIu64
                              " completed with %" PRId64 " bytes", s->ops->name, op, len, off, io.res);
    return 0;
}

int fso_store_read(fso_store *s, void *buf, size_t len, uint64_t off)
{
    return store_wait_one(s, "read", buf, len, off);
}

int fso_store_write(fso_store *s, const void *buf, size_t len, uint64_t off)
{
    return store_wait_one(s, "write", (void *)buf, len, off);
}

int fso_store_grow(fso_store *s, uint64_t capacity_bytes)
{
    if (capacity_bytes <= s->capacity_bytes)
        return 0;
    if (s->inflight)
        return fso_store_fail(s, -EBUSY, "%s store: growing while %d requests are in flight; "
                              "reap them first", s->ops->name, s->inflight);
    return s->ops->grow(s, capacity_bytes);
}
