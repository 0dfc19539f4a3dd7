/* coll_threads.c — collectives among the host threads of one process.
 *
 * Each call: every rank publishes its buffer pointers in its slot, a
 * barrier, every rank reads what it needs from the others' buffers into its
 * own output, a second barrier so no buffer is reused while another rank
 * still reads it. Reductions add in rank order 0..world-1.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll.h"
#include "util.h"

#define MAX_WORLD FSO_MAX_DEVICES

struct slot {
    const void *gather;   /* all-gather's send, any element type */
    const float *send;    /* reduce-scatter's */
    const uint16_t *send16; /* reduce_scatter_bf16's */
    float *recv;
    double *dbuf;
};

struct ctx {
    pthread_barrier_t bar;
    struct slot slots[MAX_WORLD];
    double scratch[MAX_WORLD][16]; /* all-reduce of small double vectors */
};


static void wait_all(struct ctx *x)
{
    pthread_barrier_wait(&x->bar);
}

static int th_all_gather(fso_coll *c, int rank, const void *send, void *recv, size_t count,
                         fso_dtype dt, uint64_t after)
{
    (void)after; /* threads on the host: done in order already */
    struct ctx *x = c->ctx;
    const size_t bytes = fso_dtype_size(dt) * count;
    double t0 = fso_now_ms();
    x->slots[rank].gather = send;
    wait_all(x);
    for (int k = 0; k < c->world; k++) {
        char *dst = (char *)recv + (size_t)k * bytes;
        if (dst != x->slots[k].gather)
            memcpy(dst, x->slots[k].gather, bytes);
    }
    wait_all(x);
    c->busy_ms[rank] += fso_now_ms() - t0;
    return 0;
}

static int th_reduce_scatter(fso_coll *c, int rank, const float *send, float *recv, size_t count)
{
    struct ctx *x = c->ctx;
    double t0 = fso_now_ms();
    x->slots[rank].send = send;
    wait_all(x);
    const size_t off = (size_t)rank * count;
    /* recv may alias this rank's own send region: read rank 0 first into a
     * register, accumulate in order, then store. */
    for (size_t i = 0; i < count; i++) {
        float s = x->slots[0].send[off + i];
        for (int k = 1; k < c->world; k++)
            s += x->slots[k].send[off + i];
        recv[i] = s;
    }
    wait_all(x);
    c->busy_ms[rank] += fso_now_ms() - t0;
    return 0;
}

static int th_reduce_scatter_bf16(fso_coll *c, int rank, const uint16_t *send, float *recv,
                                 size_t count)
{
    struct ctx *x = c->ctx;
    double t0 = fso_now_ms();
    x->slots[rank].send16 = send;
    wait_all(x);
    const size_t off = (size_t)rank * count;
    for (size_t i = 0; i < count; i++) {
        float s = fso_f32_from_bf16(x->slots[0].send16[off + i]);
        for (int k = 1; k < c->world; k++)
            s += fso_f32_from_bf16(x->slots[k].send16[off + i]);
        recv[i] = s;
    }
    wait_all(x);
    c->busy_ms[rank] += fso_now_ms() - t0;
    return 0;
}

static int th_all_reduce_f64(fso_coll *c, int rank, double *buf, size_t count)
{
    struct ctx *x = c->ctx;
    if (count > 16)
        return -EINVAL;
    double t0 = fso_now_ms();
    memcpy(x->scratch[rank], buf, sizeof(double) * count);
    wait_all(x);
    for (size_t i = 0; i < count; i++) {
        double s = 0;
        for (int k = 0; k < c->world; k++)
            s += x->scratch[k][i];
        buf[i] = s;
    }
    wait_all(x);
    c->busy_ms[rank] += fso_now_ms() - t0;
    return 0;
}

static int th_barrier(fso_coll *c, int rank)
{
    (void)rank;
    wait_all(c->ctx);
    return 0;
}

static void th_destroy(fso_coll *c)
{
    struct ctx *x = c->ctx;
    pthread_barrier_destroy(&x->bar);
    free(x);
    free(c);
}

static const fso_coll_ops threads_ops = {
    .name = "threads",
    .all_gather = th_all_gather,
    .reduce_scatter = th_reduce_scatter,
    .reduce_scatter_bf16 = th_reduce_scatter_bf16,
    .all_reduce_f64 = th_all_reduce_f64,
    .barrier = th_barrier,
    .destroy = th_destroy,
};

int fso_coll_create_threads(fso_coll **out, int world)
{
    if (world < 1 || world > MAX_WORLD)
        return -EINVAL;
    fso_coll *c = calloc(1, sizeof *c);
    struct ctx *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c);
        free(x);
        return -ENOMEM;
    }
    int rc = pthread_barrier_init(&x->bar, NULL, (unsigned)world);
    if (rc != 0) {
        free(c);
        free(x);
        return -rc;
    }
    c->ops = &threads_ops;
    c->ctx = x;
    c->world = world;
    *out = c;
    return 0;
}

void fso_coll_destroy(fso_coll *c)
{
    if (c)
        c->ops->destroy(c);
}
