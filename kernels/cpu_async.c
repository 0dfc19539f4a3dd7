/* cpu_async.c — "cpu-async": a CPU device that behaves towards its caller
 * like a discrete GPU, so that the engine's GPU paths (staging copies,
 * marks, norms and losses delivered late, AdamW on the device) run and are
 * checked bit for bit on machines without one.
 *
 * What it enforces, as the CUDA backend's contract allows:
 *   - Device memory is not host memory. buf_alloc returns addresses with
 *     bit 62 set: not canonical on x86-64, so a host load or store through
 *     one faults at once. Ops and copies clear the bit. (Under AArch64's
 *     top-byte-ignore such an address would not fault; there only the rules
 *     below check.)
 *   - Work completes late. Ops, copies and the device's collectives
 *     (fso_coll_create_async) are queued and run only when the host waits:
 *     at sync(), at wait_mark() for the work before that mark, and when
 *     memory is freed. A host that reads a copy's destination, or refills
 *     its source, before waiting sees stale or new data, and a run compared
 *     with the "cpu" backend's bits differs. Ranks' collectives meet when
 *     each rank's host waits past them.
 *   - Collectives go before their devices. Destroying them checks that
 *     none of their work is still queued on any device, which reads every
 *     device: a teardown that frees a device first (on a GPU, NCCL's
 *     communicators outliving the streams they run on) reads freed memory
 *     here, which AddressSanitizer, in CI's sanitizer build, names.
 *   - sqnorm and sum results reach *out only at sync() or wait_mark() of a
 *     later full mark (not of a mark_copies one).
 *   - Work ordered after a mark only (copy_h2d_after, copy_d2h_after, a
 *     gather with `after`) runs as early as the contract allows: right
 *     after the work before that mark, its own stream's earlier work and
 *     the host-to-device copies queued so far, ahead of compute queued in
 *     between. A mark too early for what that compute still reads or
 *     writes shows up as wrong bits, as it would as a race on a GPU.
 *   - Compute is not ordered after device-to-host copies or
 *     reduce-scatters (backend.h order_after): it runs ahead of those
 *     queued since the last compute, host-to-device copy, all-gather or
 *     order_after point. Compute that overwrites what such a copy or
 *     reduce-scatter reads, or reads what a reduce-scatter writes, without
 *     order_after shows up as wrong bits (counted: `ahead`).
 * What it cannot check: the CUDA backend's own stream code (events, waits,
 * the order it gives); test_cuda covers that on a GPU, and the CUDA
 * runtime stand-in's clocks in tests. A race shows only in the
 * interleavings a test's run produces: compute runs ahead of a copy down
 * or reduce-scatter only until the next host-to-device copy, all-gather,
 * order_after or host wait (which runs the queue), and never in the middle
 * of one, so a missing order is caught where compute queued before that
 * point touches the buffer; what only costs overlap (a gather queued
 * behind a reduce-scatter, an order_after where none is needed) gives the
 * same bits and is not reported. And a mark taken between `after` and the
 * work placed early covers that work here (it now runs before the mark's
 * point), so a host that wrongly waits for such a mark to see that work is
 * not caught.
 *
 * The math is the fast CPU backend's ("cpu"), so results have its bits;
 * AdamW is adamw_elem.h's. One mutex serialises everything: any host thread
 * may use the device (the engine's optimizer thread copies and updates
 * while the rank thread computes).
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adamw_elem.h"
#include "backend.h"
#include "coll.h"
#include "cpu_async.h"
#include "cpu_common.h"
#include "util.h"

#define TAG ((uintptr_t)1 << 62)
#define MARKS 1024 /* marks kept, as the CUDA backend keeps; an older one is stale (counted)
                      and waits for everything */

typedef struct async_ctx async_ctx;

/* One queued piece of work: a copy, an op with its arguments as the CUDA
 * backend would capture them at launch, or a collective. */
/* The streams of the CUDA backend: the order rules follow them. */
enum { S_COMPUTE, S_H2D, S_D2H, S_COLL, S_N };

typedef struct work {
    void (*run)(async_ctx *x, const struct work *w);
    void *p[9];
    int i[5];
    fso_dtype dt[3];
    size_t n;
    float f;
    fso_adamw_consts c;
    fso_coll *coll;
} work;

typedef struct pending_sum {
    double *out;
    double value;
    uint64_t work;    /* the number of the work that computed it */
} pending_sum;

typedef struct async_mark {
    uint64_t ticket;
    uint64_t work;    /* work queued when it was taken */
    bool full;        /* not copies-only: waiting for it delivers the results before it */
} async_mark;

struct async_ctx {
    pthread_mutex_t mu;
    fso_backend *inner;      /* the fast CPU backend that does the math */
    work *queue;             /* queued, not yet run: numbers done .. queued-1 */
    size_t cap;
    uint64_t queued, done;
    pending_sum *sums;       /* computed, not yet delivered */
    size_t sums_cap;
    uint64_t sums_made, sums_given;
    async_mark marks[MARKS];
    uint64_t n_marks, n_copy_marks;
    uint64_t last[S_N];      /* 1 + the queue position of each stream's last work, 0 none */
    uint64_t last_gather;    /* 1 + the position of the last all-gather, 0 none */
    uint64_t fence;          /* compute goes at or after this position (order_after) */
    int rank;                /* in its collectives */
    fso_async_counts counts;
};

#define CTX(be) ((async_ctx *)(be)->ctx)
#define H(p) host_of(p)

/* The host address of a device pointer; host pointers and NULL pass. */
static void *host_of(const void *p)
{
    return (void *)((uintptr_t)p & ~TAG);
}

static void *device_of(void *p)
{
    return (void *)((uintptr_t)p | TAG);
}

void *fso_async_host_view(const void *device_ptr)
{
    return host_of(device_ptr);
}

/* Growing the queues is the only thing that can fail; it aborts, as a
 * test double out of memory has nothing sensible to report to. */
static void *grow(void *p, size_t *cap, size_t used, size_t elem)
{
    if (used < *cap)
        return p;
    size_t c = *cap ? 2 * *cap : 64;
    void *q = realloc(p, c * elem);
    if (!q)
        abort();
    *cap = c;
    return q;
}

/* Run the work numbered below upto, in order (lock held), for a host
 * that waits for it. */
static void run_work(async_ctx *x, uint64_t upto)
{
    size_t n = 0;
    while (x->done < upto && x->done < x->queued) {
        x->queue[n].run(x, &x->queue[n]);
        n++;
        x->done++;
    }
    if (n == 0)
        return;
    memmove(x->queue, x->queue + n, sizeof *x->queue * (size_t)(x->queued - x->done));
    if (x->done == x->queued)
        x->counts.drains++;
}

/* Deliver the results computed by work numbered below upto. */
static void deliver_sums(async_ctx *x, uint64_t upto)
{
    size_t n = 0;
    while (x->sums_given < x->sums_made && x->sums[n].work < upto) {
        *x->sums[n].out += x->sums[n].value;
        n++;
        x->sums_given++;
    }
    if (n > 0)
        memmove(x->sums, x->sums + n, sizeof *x->sums * (size_t)(x->sums_made - x->sums_given));
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/* Where compute goes (lock held): as early as backend.h's rule allows,
 * after the compute, the host-to-device copies and the all-gathers queued
 * so far and after the last order_after's point, so ahead of the
 * device-to-host copies and reduce-scatters queued since. An engine that
 * writes what such a copy or reduce-scatter still reads, or reads what a
 * reduce-scatter writes, without order_after gets wrong bits, as it would
 * get a race on a GPU. */
static uint64_t compute_at(const async_ctx *x)
{
    uint64_t at = max_u64(x->last[S_COMPUTE], x->last[S_H2D]);
    at = max_u64(at, max_u64(x->last_gather, x->fence));
    return max_u64(at, x->done);
}

/* Queue w on stream s (gather: an all-gather, which compute waits for).
 * Compute goes where compute_at says. Other work ordered after everything
 * (after 0) goes at the end. Work ordered after mark `after` only (the
 * _after copies and gathers) goes as early as its contract allows: after
 * the work before that mark, after its own stream's earlier work, and
 * after every host-to-device copy queued so far. So it runs before compute
 * queued between the mark and it, as it may on a GPU: a mark too early for
 * what that compute still reads shows up as wrong bits. */
static void push_on(fso_backend *be, const work *w, int s, uint64_t after, bool gather)
{
    async_ctx *x = CTX(be);
    pthread_mutex_lock(&x->mu);
    uint64_t at = s == S_COMPUTE ? compute_at(x) : x->queued;
    const async_mark *m = &x->marks[after % MARKS];
    if (after != 0 && m->ticket != after)
        x->counts.stale_marks++; /* gone from the ring: after everything */
    if (after != 0 && m->ticket == after) {
        at = m->work;
        if (at < x->last[s])
            at = x->last[s];
        if (at < x->last[S_H2D])
            at = x->last[S_H2D];
        if (at < x->done)
            at = x->done;
    }
    if (s == S_COMPUTE && at < x->queued)
        x->counts.ahead++;
    size_t used = (size_t)(x->queued - x->done), i = (size_t)(at - x->done);
    x->queue = grow(x->queue, &x->cap, used, sizeof *x->queue);
    memmove(x->queue + i + 1, x->queue + i, sizeof *x->queue * (used - i));
    x->queue[i] = *w;
    /* placed early, positions after it move up by one: marks taken after
     * that point now also cover w (only stricter) */
    if (at < x->queued) {
        for (int k = 0; k < MARKS; k++)
            if (x->marks[k].work > at)
                x->marks[k].work++;
        for (int t = 0; t < S_N; t++)
            if (x->last[t] > at)
                x->last[t]++;
        if (x->last_gather > at)
            x->last_gather++;
        if (x->fence > at)
            x->fence++;
    }
    x->queued++;
    x->last[s] = max_u64(x->last[s], at + 1);
    if (gather)
        x->last_gather = max_u64(x->last_gather, at + 1);
    pthread_mutex_unlock(&x->mu);
}

static void push_after(fso_backend *be, const work *w, int s, uint64_t after)
{
    push_on(be, w, s, after, false);
}

static void push(fso_backend *be, const work *w)
{
    push_on(be, w, S_COMPUTE, 0, false);
}

/* Everything queued so far has run and its results are delivered. */
static void catch_up(async_ctx *x)
{
    pthread_mutex_lock(&x->mu);
    run_work(x, x->queued);
    deliver_sums(x, x->queued);
    pthread_mutex_unlock(&x->mu);
}

/* ------------------------------------------------------------ memory */

static int as_buf_alloc(fso_backend *be, size_t bytes, void **out)
{
    async_ctx *x = CTX(be);
    void *p;
    int rc = fso_cpu_buf_alloc(be, bytes, &p);
    if (rc == 0)
        *out = device_of(p);
    pthread_mutex_lock(&x->mu);
    x->counts.allocs++;
    pthread_mutex_unlock(&x->mu);
    return rc;
}

static void as_buf_free(fso_backend *be, void *buf)
{
    if (!buf)
        return;
    catch_up(CTX(be)); /* nothing queued may still touch it */
    fso_cpu_buf_free(be, host_of(buf));
}

static void run_copy(async_ctx *x, const work *w)
{
    (void)x;
    if (w->p[0] != w->p[1])
        memmove(w->p[0], w->p[1], w->n);
}

static void as_copy_h2d_after(fso_backend *be, void *dst, const void *src, size_t bytes,
                              uint64_t after)
{
    if (bytes)
        push_after(be, &(work){.run = run_copy, .p = {H(dst), H(src)}, .n = bytes}, S_H2D, after);
}

static void as_copy_d2h_after(fso_backend *be, void *dst, const void *src, size_t bytes,
                              uint64_t after)
{
    if (bytes)
        push_after(be, &(work){.run = run_copy, .p = {H(dst), H(src)}, .n = bytes}, S_D2H, after);
}

static void as_copy_h2d(fso_backend *be, void *dst, const void *src, size_t bytes)
{
    as_copy_h2d_after(be, dst, src, bytes, 0);
}

static void as_copy_d2h(fso_backend *be, void *dst, const void *src, size_t bytes)
{
    as_copy_d2h_after(be, dst, src, bytes, 0);
}

static void run_memset0(async_ctx *x, const work *w)
{
    (void)x;
    memset(w->p[0], 0, w->n);
}

static void as_memset0(fso_backend *be, void *dst, size_t bytes)
{
    if (bytes)
        push(be, &(work){.run = run_memset0, .p = {H(dst)}, .n = bytes});
}

static int as_sync(fso_backend *be)
{
    async_ctx *x = CTX(be);
    catch_up(x);
    pthread_mutex_lock(&x->mu);
    x->counts.syncs++;
    int rc = x->inner->ops->sync(x->inner); /* the math's own failure: its working space */
    if (rc < 0)
        memcpy(be->err, x->inner->err, sizeof be->err);
    pthread_mutex_unlock(&x->mu);
    return rc;
}

static uint64_t take_mark(fso_backend *be, bool copies_only)
{
    async_ctx *x = CTX(be);
    pthread_mutex_lock(&x->mu);
    uint64_t t = ++x->n_marks;
    x->n_copy_marks += copies_only;
    /* a copies-only mark ends at the last copy queued (in either direction),
     * not at the compute queued after it */
    uint64_t end = x->queued;
    if (copies_only)
        end = x->last[S_H2D] > x->last[S_D2H] ? x->last[S_H2D] : x->last[S_D2H];
    x->marks[t % MARKS] = (async_mark){t, end, !copies_only};
    pthread_mutex_unlock(&x->mu);
    return t;
}

static uint64_t as_mark(fso_backend *be)
{
    return take_mark(be, false);
}

static uint64_t as_mark_copies(fso_backend *be)
{
    return take_mark(be, true);
}

static void as_wait_mark(fso_backend *be, uint64_t ticket)
{
    async_ctx *x = CTX(be);
    if (ticket == 0)
        return;
    pthread_mutex_lock(&x->mu);
    async_mark m = x->marks[ticket % MARKS];
    if (m.ticket != ticket) { /* gone from the ring: wait for everything */
        m = (async_mark){ticket, x->queued, true};
        x->counts.stale_marks++;
    }
    run_work(x, m.work);
    if (m.full)
        deliver_sums(x, m.work);
    pthread_mutex_unlock(&x->mu);
}

/* Later compute goes after the work before the mark (a stale one: after
 * everything queued). */
static void as_order_after(fso_backend *be, uint64_t ticket)
{
    async_ctx *x = CTX(be);
    if (ticket == 0)
        return;
    pthread_mutex_lock(&x->mu);
    const async_mark *m = &x->marks[ticket % MARKS];
    uint64_t at = m->work;
    if (m->ticket != ticket) {
        at = x->queued;
        x->counts.stale_marks++;
    }
    x->fence = max_u64(x->fence, at);
    pthread_mutex_unlock(&x->mu);
}

/* ------------------------------------------------------------ ops */

#define R(i) w->p[i]
#define FAST(op) fso_cpu_fast_ops.op

#define DT(i) w->dt[i]

static void run_embedding_fwd(async_ctx *x, const work *w)
{
    FAST(embedding_fwd)(x->inner, R(0), R(1), R(2), DT(0), w->i[0], w->i[1]);
}

static void as_embedding_fwd(fso_backend *be, float *out, const int32_t *tok, const void *wte,
                             fso_dtype dt, int N, int C)
{
    push(be, &(work){.run = run_embedding_fwd, .p = {H(out), H(tok), H(wte)}, .dt = {dt},
                     .i = {N, C}});
}

static void run_embedding_bwd(async_ctx *x, const work *w)
{
    FAST(embedding_bwd)(x->inner, R(0), R(1), R(2), w->i[0], w->i[1]);
}

static void as_embedding_bwd(fso_backend *be, float *dwte, const int32_t *tok, const float *dout,
                             int N, int C)
{
    push(be, &(work){.run = run_embedding_bwd, .p = {H(dwte), H(tok), H(dout)}, .i = {N, C}});
}

static void run_rmsnorm_fwd(async_ctx *x, const work *w)
{
    FAST(rmsnorm_fwd)(x->inner, R(0), R(1), R(2), R(3), DT(0), w->i[0], w->i[1], w->f);
}

static void as_rmsnorm_fwd(fso_backend *be, void *out, float *rstd, const float *x,
                           const void *w, fso_dtype dt, int N, int C, float eps)
{
    push(be, &(work){.run = run_rmsnorm_fwd, .p = {H(out), H(rstd), H(x), H(w)}, .dt = {dt},
                     .i = {N, C}, .f = eps});
}

static void run_rmsnorm_bwd(async_ctx *x, const work *w)
{
    FAST(rmsnorm_bwd)(x->inner, R(0), R(1), R(2), R(3), R(4), DT(0), R(5), w->i[0], w->i[1]);
}

static void as_rmsnorm_bwd(fso_backend *be, float *dx, float *dw, const float *dout,
                           const float *x, const void *w, fso_dtype dt, const float *rstd, int N,
                           int C)
{
    push(be, &(work){.run = run_rmsnorm_bwd, .p = {H(dx), H(dw), H(dout), H(x), H(w), H(rstd)},
                     .dt = {dt}, .i = {N, C}});
}

static void run_matmul_fwd(async_ctx *x, const work *w)
{
    FAST(matmul_fwd)(x->inner, R(0), DT(1), R(1), R(2), DT(0), w->i[0], w->i[1], w->i[2]);
}

static void as_matmul_fwd(fso_backend *be, void *out, fso_dtype out_dt, const void *x,
                          const void *w, fso_dtype dt, int N, int Cin, int Cout)
{
    push(be, &(work){.run = run_matmul_fwd, .p = {H(out), H(x), H(w)}, .dt = {dt, out_dt},
                     .i = {N, Cin, Cout}});
}

static void run_matmul_bwd(async_ctx *x, const work *w)
{
    FAST(matmul_bwd)(x->inner, R(0), DT(1), R(1), R(2), DT(2), R(3), R(4), DT(0), w->i[0],
                     w->i[1], w->i[2], w->f);
}

static void as_matmul_bwd(fso_backend *be, void *dx, fso_dtype dx_dt, float *dw, const void *dout,
                          fso_dtype dout_dt, const void *x, const void *w, fso_dtype dt, int N,
                          int Cin, int Cout, float beta)
{
    push(be, &(work){.run = run_matmul_bwd, .p = {H(dx), H(dw), H(dout), H(x), H(w)},
                     .dt = {dt, dx_dt, dout_dt}, .i = {N, Cin, Cout}, .f = beta});
}

static void run_rope(async_ctx *x, const work *w)
{
    FAST(rope)(x->inner, R(0), DT(0), R(1), R(2), R(3), w->i[0], w->i[1], w->i[2], w->i[3],
               w->i[4]);
}

static void as_rope(fso_backend *be, void *x, fso_dtype dt, const float *cos_t,
                    const float *sin_t, const int32_t *pos, int B, int T, int nh, int D,
                    int inverse)
{
    push(be, &(work){.run = run_rope, .p = {H(x), H(cos_t), H(sin_t), H(pos)}, .dt = {dt},
                     .i = {B, T, nh, D, inverse}});
}

static void run_attention_fwd(async_ctx *x, const work *w)
{
    FAST(attention_fwd)(x->inner, R(0), R(1), R(2), R(3), R(4), R(5), DT(0), w->i[0], w->i[1],
                        w->i[2], w->i[3], w->i[4]);
}

static void as_attention_fwd(fso_backend *be, void *out, void *probs, const void *q,
                             const void *k, const void *v, const int32_t *pos, fso_dtype dt,
                             int B, int T, int H, int Hkv, int D)
{
    push(be, &(work){.run = run_attention_fwd,
                     .p = {H(out), H(probs), H(q), H(k), H(v), H(pos)},
                     .dt = {dt}, .i = {B, T, H, Hkv, D}});
}

static void run_attention_bwd(async_ctx *x, const work *w)
{
    FAST(attention_bwd)(x->inner, R(0), R(1), R(2), R(3), R(4), R(5), R(6), R(7), R(8), DT(0),
                        w->i[0], w->i[1], w->i[2], w->i[3], w->i[4]);
}

static void as_attention_bwd(fso_backend *be, void *dq, void *dk, void *dv, const void *dout,
                             const void *probs, const void *q, const void *k, const void *v,
                             const int32_t *pos, fso_dtype dt, int B, int T, int H, int Hkv,
                             int D)
{
    push(be, &(work){.run = run_attention_bwd,
                     .p = {H(dq), H(dk), H(dv), H(dout), H(probs), H(q), H(k), H(v), H(pos)},
                     .dt = {dt}, .i = {B, T, H, Hkv, D}});
}

static void run_swiglu_fwd(async_ctx *x, const work *w)
{
    FAST(swiglu_fwd)(x->inner, R(0), R(1), R(2), DT(0), w->n);
}

static void as_swiglu_fwd(fso_backend *be, void *out, const void *gate, const void *up,
                          fso_dtype dt, size_t n)
{
    push(be, &(work){.run = run_swiglu_fwd, .p = {H(out), H(gate), H(up)}, .dt = {dt}, .n = n});
}

static void run_swiglu_bwd(async_ctx *x, const work *w)
{
    FAST(swiglu_bwd)(x->inner, R(0), R(1), R(2), R(3), R(4), DT(0), w->n);
}

static void as_swiglu_bwd(fso_backend *be, void *dgate, void *dup, const void *dout,
                          const void *gate, const void *up, fso_dtype dt, size_t n)
{
    push(be, &(work){.run = run_swiglu_bwd, .p = {H(dgate), H(dup), H(dout), H(gate), H(up)},
                     .dt = {dt}, .n = n});
}

static void run_bias_add(async_ctx *x, const work *w)
{
    FAST(bias_add)(x->inner, R(0), R(1), DT(0), w->i[0], w->i[1]);
}

static void as_bias_add(fso_backend *be, void *out, const void *b, fso_dtype dt, int N, int C)
{
    push(be, &(work){.run = run_bias_add, .p = {H(out), H(b)}, .dt = {dt}, .i = {N, C}});
}

static void run_bias_bwd(async_ctx *x, const work *w)
{
    FAST(bias_bwd)(x->inner, R(0), R(1), DT(0), w->i[0], w->i[1]);
}

static void as_bias_bwd(fso_backend *be, float *db, const void *dout, fso_dtype dt, int N, int C)
{
    push(be, &(work){.run = run_bias_bwd, .p = {H(db), H(dout)}, .dt = {dt}, .i = {N, C}});
}

static void run_add(async_ctx *x, const work *w)
{
    FAST(add)(x->inner, R(0), R(1), R(2), w->n);
}

static void as_add(fso_backend *be, float *out, const float *a, const float *b, size_t n)
{
    push(be, &(work){.run = run_add, .p = {H(out), H(a), H(b)}, .n = n});
}

static void run_cross_entropy(async_ctx *x, const work *w)
{
    FAST(cross_entropy)(x->inner, R(0), R(1), R(2), R(3), w->i[0], w->i[1], w->f);
}

static void as_cross_entropy(fso_backend *be, float *dlogits, float *losses, const float *logits,
                             const int32_t *targets, int N, int V, float dscale)
{
    push(be, &(work){.run = run_cross_entropy, .p = {H(dlogits), H(losses), H(logits), H(targets)},
                     .i = {N, V}, .f = dscale});
}

static void run_cast_bf16_f32(async_ctx *x, const work *w)
{
    FAST(cast_bf16_f32)(x->inner, R(0), R(1), w->n);
}

static void as_cast_bf16_f32(fso_backend *be, float *dst, const uint16_t *src, size_t n)
{
    push(be, &(work){.run = run_cast_bf16_f32, .p = {H(dst), H(src)}, .n = n});
}

static void run_cast_f32_bf16(async_ctx *x, const work *w)
{
    FAST(cast_f32_bf16)(x->inner, R(0), R(1), w->n);
}

static void as_cast_f32_bf16(fso_backend *be, uint16_t *dst, const float *src, size_t n)
{
    push(be, &(work){.run = run_cast_f32_bf16, .p = {H(dst), H(src)}, .n = n});
}

/* A result is computed when its turn comes and delivered at sync() or
 * wait_mark() of a later full mark. */
static void run_reduce(async_ctx *x, const work *w)
{
    double v = 0;
    if (w->i[0])
        FAST(sqnorm)(x->inner, &v, R(1), w->n);
    else
        FAST(sum)(x->inner, &v, R(1), w->n);
    size_t used = (size_t)(x->sums_made - x->sums_given);
    x->sums = grow(x->sums, &x->sums_cap, used, sizeof *x->sums);
    x->sums[used] = (pending_sum){R(0), v, x->done};
    x->sums_made++;
}

static void as_sqnorm(fso_backend *be, double *out, const float *x, size_t n)
{
    push(be, &(work){.run = run_reduce, .p = {out, H(x)}, .i = {1}, .n = n});
}

static void as_sum(fso_backend *be, double *out, const float *x, size_t n)
{
    push(be, &(work){.run = run_reduce, .p = {out, H(x)}, .i = {0}, .n = n});
}

static void run_adamw(async_ctx *x, const work *w)
{
    float *p = R(0), *m = R(2), *v = R(3);
    const float *g = R(1);
    for (size_t i = 0; i < w->n; i++)
        p[i] = fso_adamw_elem(p[i], g[i], &m[i], &v[i], &w->c);
    if (R(4) && w->i[0])
        FAST(cast_f32_bf16)(x->inner, R(4), p, w->n);
    else if (R(4))
        memcpy(R(4), p, sizeof(float) * w->n);
}

static void as_adamw(fso_backend *be, float *master, const float *grad, float *m, float *v,
                     void *out, int out_bf16, size_t n, const fso_adamw_consts *c)
{
    push(be, &(work){.run = run_adamw, .p = {H(master), H(grad), H(m), H(v), H(out)},
                     .i = {out_bf16}, .n = n, .c = *c});
}

static void as_destroy(fso_backend *be);
static uint64_t as_stale_marks(fso_backend *be);
static struct fso_pool *as_pool(fso_backend *be);
static int as_coll_create(fso_coll **out, int world, fso_backend **devs, char *err,
                          size_t errlen);

static const fso_backend_ops async_ops = {
    .name = "cpu-async",
    .host_addressable = 0,
    .buf_alloc = as_buf_alloc,
    .buf_free = as_buf_free,
    .memset0 = as_memset0,
    .copy_h2d = as_copy_h2d,
    .copy_d2h = as_copy_d2h,
    .sync = as_sync,
    .embedding_fwd = as_embedding_fwd,
    .embedding_bwd = as_embedding_bwd,
    .rmsnorm_fwd = as_rmsnorm_fwd,
    .rmsnorm_bwd = as_rmsnorm_bwd,
    .matmul_fwd = as_matmul_fwd,
    .matmul_bwd = as_matmul_bwd,
    .rope = as_rope,
    .attention_fwd = as_attention_fwd,
    .attention_bwd = as_attention_bwd,
    .swiglu_fwd = as_swiglu_fwd,
    .swiglu_bwd = as_swiglu_bwd,
    .bias_add = as_bias_add,
    .bias_bwd = as_bias_bwd,
    .add = as_add,
    .cross_entropy = as_cross_entropy,
    .sqnorm = as_sqnorm,
    .sum = as_sum,
    .mark = as_mark,
    .wait_mark = as_wait_mark,
    .order_after = as_order_after,
    .adamw = as_adamw,
    .copy_h2d_after = as_copy_h2d_after,
    .cast_bf16_f32 = as_cast_bf16_f32,
    .cast_f32_bf16 = as_cast_f32_bf16,
    .copy_d2h_after = as_copy_d2h_after,
    .mark_copies = as_mark_copies,
    .stale_marks = as_stale_marks,
    .destroy = as_destroy,
    .pool = as_pool,
    .coll_create = as_coll_create,
};

int fso_backend_create_async(fso_backend **out, int device, int threads, size_t mem_cap_bytes,
                             char *err, size_t errlen)
{
    fso_backend *be = calloc(1, sizeof *be);
    async_ctx *x = calloc(1, sizeof *x);
    if (!be || !x) {
        free(be);
        free(x);
        snprintf(err, errlen, "out of memory creating a cpu-async device");
        return -ENOMEM;
    }
    /* the inner backend computes for the device; the cap is the device's */
    int rc = fso_backend_create(&x->inner, FSO_BACKEND_CPU, device, threads, 0, err, errlen);
    if (rc < 0) {
        free(be);
        free(x);
        return rc;
    }
    pthread_mutex_init(&x->mu, NULL);
    be->ops = &async_ops;
    be->ctx = x;
    be->threads = x->inner->threads;
    be->device = device;
    be->mem_cap_bytes = mem_cap_bytes;
    *out = be;
    return 0;
}

int fso_backend_is_async(const fso_backend *be)
{
    return be && be->ops == &async_ops;
}

fso_async_counts fso_async_counts_of(fso_backend *be)
{
    async_ctx *x = CTX(be);
    pthread_mutex_lock(&x->mu);
    fso_async_counts c = x->counts;
    c.marks = x->n_marks;
    c.copy_marks = x->n_copy_marks;
    pthread_mutex_unlock(&x->mu);
    return c;
}

static uint64_t as_stale_marks(fso_backend *be)
{
    return fso_async_counts_of(be).stale_marks;
}

static struct fso_pool *as_pool(fso_backend *be)
{
    return fso_backend_pool(CTX(be)->inner);
}

static void as_destroy(fso_backend *be)
{
    async_ctx *x = CTX(be);
    fso_backend_destroy(x->inner);
    pthread_mutex_destroy(&x->mu);
    free(x->queue);
    free(x->sums);
    free(x);
    free(be);
}

/* ------------------------------------------------------------ collectives */

/* The threads collectives over the devices' memory, queued on each rank's
 * device like its other work: a rank's gather runs when that rank's host
 * waits for a later point, and meets the other ranks' there (every rank's
 * host reaches a wait before it needs another rank's result). */
typedef struct async_coll {
    fso_coll *inner;
    fso_backend **bes;
} async_coll;

static void run_all_gather(async_ctx *x, const work *w)
{
    async_coll *ac = w->coll->ctx;
    ac->inner->ops->all_gather(ac->inner, x->rank, R(0), R(1), w->n, (fso_dtype)w->i[0], 0);
    w->coll->busy_ms[x->rank] = ac->inner->busy_ms[x->rank];
}

static int ac_all_gather(fso_coll *c, int rank, const void *send, void *recv, size_t count,
                         fso_dtype dt, uint64_t after)
{
    async_coll *ac = c->ctx;
    push_on(ac->bes[rank], &(work){.run = run_all_gather, .p = {H(send), H(recv)}, .n = count,
                                   .i = {(int)dt}, .coll = c},
            S_COLL, after, true);
    return 0;
}

static void run_reduce_scatter(async_ctx *x, const work *w)
{
    async_coll *ac = w->coll->ctx;
    ac->inner->ops->reduce_scatter(ac->inner, x->rank, R(0), R(1), w->n);
    w->coll->busy_ms[x->rank] = ac->inner->busy_ms[x->rank];
}

static int ac_reduce_scatter(fso_coll *c, int rank, const float *send, float *recv, size_t count)
{
    async_coll *ac = c->ctx;
    push_after(ac->bes[rank], &(work){.run = run_reduce_scatter, .p = {H(send), H(recv)},
                                      .n = count, .coll = c},
               S_COLL, 0);
    return 0;
}

static void run_reduce_scatter_bf16(async_ctx *x, const work *w)
{
    async_coll *ac = w->coll->ctx;
    ac->inner->ops->reduce_scatter_bf16(ac->inner, x->rank, R(0), R(1), w->n);
    w->coll->busy_ms[x->rank] = ac->inner->busy_ms[x->rank];
}

static int ac_reduce_scatter_bf16(fso_coll *c, int rank, const uint16_t *send, float *recv,
                                  size_t count)
{
    async_coll *ac = c->ctx;
    push_after(ac->bes[rank], &(work){.run = run_reduce_scatter_bf16,
                                      .p = {H(send), H(recv)}, .n = count, .coll = c},
               S_COLL, 0);
    return 0;
}

static int ac_all_reduce_f64(fso_coll *c, int rank, double *buf, size_t count)
{
    async_coll *ac = c->ctx;
    return ac->inner->ops->all_reduce_f64(ac->inner, rank, buf, count);
}

static int ac_barrier(fso_coll *c, int rank)
{
    async_coll *ac = c->ctx;
    return ac->inner->ops->barrier(ac->inner, rank);
}

/* The collectives go before the devices they run on (coll.h), and none of
 * their work may still be queued on one: it would run later through the
 * freed collectives. Checking that reads every device, so destroying them
 * in the wrong order (the devices first) is a read of freed memory, which
 * AddressSanitizer reports wherever it happens, as it would be on a GPU
 * (NCCL's destroy making each device current). */
static void ac_destroy(fso_coll *c)
{
    async_coll *ac = c->ctx;
    for (int r = 0; r < c->world; r++) {
        async_ctx *x = CTX(ac->bes[r]);
        pthread_mutex_lock(&x->mu);
        size_t queued = 0;
        for (uint64_t i = 0; i < x->queued - x->done; i++)
            queued += x->queue[i].coll == c;
        pthread_mutex_unlock(&x->mu);
        FSO_BUG_ON(queued, "collectives destroyed with %zu of their calls still queued on "
                           "device %d; sync every device first", queued, r);
    }
    fso_coll_destroy(ac->inner);
    free(ac->bes);
    free(ac);
    free(c);
}

static const fso_coll_ops async_coll_ops = {
    .name = "cpu-async",
    .all_gather = ac_all_gather,
    .reduce_scatter = ac_reduce_scatter,
    .reduce_scatter_bf16 = ac_reduce_scatter_bf16,
    .all_reduce_f64 = ac_all_reduce_f64,
    .barrier = ac_barrier,
    .destroy = ac_destroy,
};

int fso_coll_create_async(fso_coll **out, int world, fso_backend *const *bes)
{
    fso_coll *c = calloc(1, sizeof *c);
    async_coll *ac = calloc(1, sizeof *ac);
    fso_backend **b = calloc((size_t)world, sizeof *b);
    int rc = -ENOMEM;
    if (c && ac && b)
        rc = fso_coll_create_threads(&ac->inner, world);
    if (rc < 0) {
        free(c);
        free(ac);
        free(b);
        return rc;
    }
    memcpy(b, bes, sizeof *b * (size_t)world);
    for (int r = 0; r < world; r++)
        CTX(b[r])->rank = r;
    ac->bes = b;
    c->ops = &async_coll_ops;
    c->ctx = ac;
    c->world = world;
    *out = c;
    return 0;
}

static int as_coll_create(fso_coll **out, int world, fso_backend **devs, char *err,
                          size_t errlen)
{
    int rc = fso_coll_create_async(out, world, devs);
    if (rc < 0)
        snprintf(err, errlen, "%s", strerror(-rc));
    return rc;
}
