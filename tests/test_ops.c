/* test_ops.c — every backend op: the fast CPU path against the reference
 * (NaN/Inf check, normalized error, guard regions around outputs), and the
 * reference's backward ops against central finite differences of
 * L = sum(out * R) for a random R.
 *
 * Tolerances: fast vs reference 2e-5 normalized error (float vs
 * double accumulation); finite differences 2e-3 of the gradient's scale
 * (float forward, step 1e-2 of the input scale).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "adamw.h"
#include "backend.h"
#include "coll.h"
#include "cpu_async.h"
#include "fso_build.h"
#include "pool.h"
#include "rng.h"
#include "sum_order.h"
#include "test_util.h"

#define FAST_TOL 2e-5
#define FD_TOL 2e-3

static fso_backend *ref, *fast;
static fso_rng rng;

static float *randbuf(size_t n, double scale)
{
    float *p = gbuf(n);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(scale * fso_rng_normal(&rng));
    return p;
}

static float *copybuf(const float *src, size_t n)
{
    float *p = gbuf(n);
    memcpy(p, src, sizeof(float) * n);
    return p;
}

/* compare() (test_util.h), then the guards around got, a gbuf. */
static void compare_guarded(const char *what, const float *got, const float *want, size_t n,
                            double tol)
{
    compare(what, got, want, n, tol);
    guard_check(got, n, what);
}

static double dot_r(const float *out, const float *R, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)out[i] * R[i];
    return s;
}

/* Central differences of loss() w.r.t. x[idx] for a sample of indices,
 * against the analytic gradient g. */
typedef double (*loss_fn)(void *ctx);
static void fd_check(const char *what, float *x, size_t n, const float *g, loss_fn loss, void *ctx)
{
    double gscale = 0;
    for (size_t i = 0; i < n; i++)
        gscale = fmax(gscale, fabs(g[i]));
    int samples = n < 24 ? (int)n : 24;
    for (int s = 0; s < samples; s++) {
        size_t i = n < 24 ? (size_t)s : (size_t)(fso_rng_u64(&rng) % n);
        float keep = x[i];
        float h = 1e-2f * fmaxf(1.0f, fabsf(keep));
        x[i] = keep + h;
        double lp = loss(ctx);
        x[i] = keep - h;
        double lm = loss(ctx);
        x[i] = keep;
        double num = (lp - lm) / (2.0 * h);
        if (fabs(num - g[i]) > FD_TOL * (gscale + 1e-6) + 1e-3 * fabs(num))
            fail_msg("%s: d/dx[%zu]: analytic %.8g, finite difference %.8g (scale %.3g)", what, i,
                     g[i], num, gscale);
    }
}

/* ---------------------------------------------------------------- matmul */

struct mm_ctx { float *x, *w, *out, *R; int N, Ci, Co; };
static double mm_loss(void *c_)
{
    struct mm_ctx *c = c_;
    ref->ops->matmul_fwd(ref, c->out, FSO_DT_F32, c->x, c->w, FSO_DT_F32, c->N, c->Ci, c->Co);
    return dot_r(c->out, c->R, (size_t)c->N * c->Co);
}

static void test_matmul(void **state)
{
    (void)state;
    int N = 37, Ci = 45, Co = 29;
    float *x = randbuf((size_t)N * Ci, 1), *w = randbuf((size_t)Co * Ci, 0.3);
    float *o1 = gbuf((size_t)N * Co), *o2 = gbuf((size_t)N * Co), *R = randbuf((size_t)N * Co, 1);
    ref->ops->matmul_fwd(ref, o1, FSO_DT_F32, x, w, FSO_DT_F32, N, Ci, Co);
    fast->ops->matmul_fwd(fast, o2, FSO_DT_F32, x, w, FSO_DT_F32, N, Ci, Co);
    compare_guarded("matmul_fwd out", o2, o1, (size_t)N * Co, FAST_TOL);

    float *dx0 = randbuf((size_t)N * Ci, 1), *dw0 = randbuf((size_t)Co * Ci, 1);
    float *dx1 = copybuf(dx0, (size_t)N * Ci), *dw1 = copybuf(dw0, (size_t)Co * Ci);
    float *dx2 = copybuf(dx0, (size_t)N * Ci), *dw2 = copybuf(dw0, (size_t)Co * Ci);
    ref->ops->matmul_bwd(ref, dx1, FSO_DT_F32, dw1, R, FSO_DT_F32, x, w, FSO_DT_F32, N, Ci, Co,
                         1.0f);
    fast->ops->matmul_bwd(fast, dx2, FSO_DT_F32, dw2, R, FSO_DT_F32, x, w, FSO_DT_F32, N, Ci, Co,
                          1.0f);
    compare_guarded("matmul_bwd dx (accumulate)", dx2, dx1, (size_t)N * Ci, FAST_TOL);
    compare_guarded("matmul_bwd dw", dw2, dw1, (size_t)Co * Ci, FAST_TOL);

    /* finite differences: gradients from zero */
    memset(dx1, 0, sizeof(float) * N * Ci);
    memset(dw1, 0, sizeof(float) * Co * Ci);
    ref->ops->matmul_bwd(ref, dx1, FSO_DT_F32, dw1, R, FSO_DT_F32, x, w, FSO_DT_F32, N, Ci, Co,
                         0.0f);
    struct mm_ctx c = {x, w, o1, R, N, Ci, Co};
    fd_check("matmul dx", x, (size_t)N * Ci, dx1, mm_loss, &c);
    fd_check("matmul dw", w, (size_t)Co * Ci, dw1, mm_loss, &c);
    float *bufs[] = {x, w, o1, o2, R, dx0, dw0, dx1, dw1, dx2, dw2};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        gfree(bufs[i]);
}

/* The fast backend's matmuls are tiles of single-threaded sgemm whose shapes
 * depend only on the matrices: forward and both backward products give the
 * same bits on 1 to 7 threads, and on two backends running them at once
 * from two threads (two devices), as on one alone. The shapes are chosen to
 * cut into many tiles with partial ones at both edges. */
#define MMT_N 300
#define MMT_CI 200
#define MMT_CO 330

typedef struct mm_outs {
    float *out, *dx, *dx0, *dw; /* fwd; bwd with dx_beta 1, with dx_beta 0; dw accumulated */
} mm_outs;

static const float *mmt_x, *mmt_w, *mmt_dout, *mmt_dx_init, *mmt_dw_init;

static void mm_outs_alloc(mm_outs *o)
{
    o->out = gbuf((size_t)MMT_N * MMT_CO);
    o->dx = copybuf(mmt_dx_init, (size_t)MMT_N * MMT_CI);
    o->dx0 = gbuf((size_t)MMT_N * MMT_CI);
    o->dw = copybuf(mmt_dw_init, (size_t)MMT_CO * MMT_CI);
}

static void mm_outs_free(mm_outs *o)
{
    gfree(o->out);
    gfree(o->dx);
    gfree(o->dx0);
    gfree(o->dw);
}

static void mm_run(fso_backend *be, mm_outs *o)
{
    be->ops->matmul_fwd(be, o->out, FSO_DT_F32, mmt_x, mmt_w, FSO_DT_F32, MMT_N, MMT_CI, MMT_CO);
    be->ops->matmul_bwd(be, o->dx, FSO_DT_F32, o->dw, mmt_dout, FSO_DT_F32, mmt_x, mmt_w,
                        FSO_DT_F32, MMT_N, MMT_CI, MMT_CO, 1.0f);
    be->ops->matmul_bwd(be, o->dx0, FSO_DT_F32, o->dw, mmt_dout, FSO_DT_F32, mmt_x, mmt_w,
                        FSO_DT_F32, MMT_N, MMT_CI, MMT_CO, 0.0f);
}

/* The first element where a and b differ, or -1. */
static long mm_first_diff(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            return (long)i;
    return -1;
}

static void mm_same_bits(const mm_outs *a, const mm_outs *b, const char *what)
{
    const struct { const char *name; const float *x, *y; size_t n; } t[] = {
        {"matmul_fwd out", a->out, b->out, (size_t)MMT_N * MMT_CO},
        {"matmul_bwd dx (accumulate)", a->dx, b->dx, (size_t)MMT_N * MMT_CI},
        {"matmul_bwd dx (beta 0)", a->dx0, b->dx0, (size_t)MMT_N * MMT_CI},
        {"matmul_bwd dw", a->dw, b->dw, (size_t)MMT_CO * MMT_CI},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        long d = mm_first_diff(t[i].x, t[i].y, t[i].n);
        if (d >= 0)
            fail_msg("%s: %s[%ld] differs: %.9g vs %.9g", what, t[i].name, d, t[i].x[d],
                     t[i].y[d]);
        guard_check(t[i].y, t[i].n, t[i].name);
    }
}

typedef struct mm_thread {
    fso_backend *be;
    mm_outs o;
} mm_thread;

static void *mm_thread_main(void *arg)
{
    mm_thread *t = arg;
    mm_run(t->be, &t->o);
    return NULL;
}

/* CPU device buffers, small and large (mapped on 2 MiB boundaries, huge
 * pages where whole ones fit): on a page, zeroed, all of them writable,
 * counted against the cap while held and not after. */
static void test_cpu_buffers_are_page_aligned_zeroed_and_counted(void **state)
{
    (void)state;
    fso_backend *be = NULL;
    assert_int_equal(fso_backend_create(&be, FSO_BACKEND_CPU, 0, 1, 0, NULL, 0), 0);
    static const size_t sizes[] = {1, 4096, (2u << 20) - 8192, (2u << 20) - 4096, 2u << 20,
                                   (5u << 20) + 100};
    enum { N = sizeof sizes / sizeof sizes[0] };
    uint8_t *p[N];
    size_t held = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(be->ops->buf_alloc(be, sizes[i], (void **)&p[i]), 0);
        assert_int_equal((uintptr_t)p[i] % 4096, 0);
        for (size_t j = 0; j < sizes[i]; j += 997)
            assert_int_equal(p[i][j], 0);
        assert_int_equal(p[i][sizes[i] - 1], 0);
        memset(p[i], i + 1, sizes[i]);
        held += (sizes[i] + 63) & ~(size_t)63;
        assert_int_equal(be->mem_used_bytes, held);
    }
    for (int i = 0; i < N; i++) { /* nothing overlaps */
        assert_int_equal(p[i][0], i + 1);
        assert_int_equal(p[i][sizes[i] - 1], i + 1);
    }
    for (int i = N - 1; i >= 0; i--)
        be->ops->buf_free(be, p[i]);
    assert_int_equal(be->mem_used_bytes, 0);
    assert_int_equal(be->mem_peak_bytes, held);
    fso_backend_destroy(be);
}

static void test_matmul_bits_do_not_depend_on_threads_or_devices(void **state)
{
    (void)state;
    float *x = randbuf((size_t)MMT_N * MMT_CI, 1), *w = randbuf((size_t)MMT_CO * MMT_CI, 0.3);
    float *dout = randbuf((size_t)MMT_N * MMT_CO, 1);
    float *dx_init = randbuf((size_t)MMT_N * MMT_CI, 1), *dw_init = randbuf((size_t)MMT_CO * MMT_CI, 1);
    mmt_x = x, mmt_w = w, mmt_dout = dout, mmt_dx_init = dx_init, mmt_dw_init = dw_init;

    /* one thread, checked against the reference */
    fso_backend *one = NULL;
    assert_int_equal(fso_backend_create(&one, FSO_BACKEND_CPU, 0, 1, 0, NULL, 0), 0);
    mm_outs base, want;
    mm_outs_alloc(&base);
    mm_outs_alloc(&want);
    mm_run(one, &base);
    mm_run(ref, &want);
    compare_guarded("matmul_fwd out", base.out, want.out, (size_t)MMT_N * MMT_CO, FAST_TOL);
    compare_guarded("matmul_bwd dx (accumulate)", base.dx, want.dx, (size_t)MMT_N * MMT_CI,
                    FAST_TOL);
    compare_guarded("matmul_bwd dx (beta 0)", base.dx0, want.dx0, (size_t)MMT_N * MMT_CI,
                    FAST_TOL);
    compare_guarded("matmul_bwd dw", base.dw, want.dw, (size_t)MMT_CO * MMT_CI, FAST_TOL);
    mm_outs_free(&want);

    for (int threads = 2; threads <= 7; threads++) {
        fso_backend *be = NULL;
        char what[64];
        assert_int_equal(fso_backend_create(&be, FSO_BACKEND_CPU, 0, threads, 0, NULL, 0), 0);
        mm_outs o;
        mm_outs_alloc(&o);
        mm_run(be, &o);
        snprintf(what, sizeof what, "1 thread vs %d threads", threads);
        mm_same_bits(&base, &o, what);
        mm_outs_free(&o);
        fso_backend_destroy(be);
    }

    /* two devices of 3 threads each at once, several times over */
    for (int round = 0; round < 4; round++) {
        mm_thread t[2];
        pthread_t tid[2];
        for (int i = 0; i < 2; i++) {
            assert_int_equal(fso_backend_create(&t[i].be, FSO_BACKEND_CPU, 0, 3, 0, NULL, 0), 0);
            mm_outs_alloc(&t[i].o);
        }
        for (int i = 0; i < 2; i++)
            assert_int_equal(pthread_create(&tid[i], NULL, mm_thread_main, &t[i]), 0);
        for (int i = 0; i < 2; i++)
            pthread_join(tid[i], NULL);
        for (int i = 0; i < 2; i++) {
            mm_same_bits(&base, &t[i].o, "1 thread vs two devices at once");
            mm_outs_free(&t[i].o);
            fso_backend_destroy(t[i].be);
        }
    }
    mm_outs_free(&base);
    fso_backend_destroy(one);
    float *bufs[] = {x, w, dout, dx_init, dw_init};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        gfree(bufs[i]);
}

/* ---------------------------------------------------------------- rmsnorm */

struct rn_ctx { float *x, *w, *out, *rstd, *R; int N, C; };
static double rn_loss(void *c_)
{
    struct rn_ctx *c = c_;
    ref->ops->rmsnorm_fwd(ref, c->out, c->rstd, c->x, c->w, FSO_DT_F32, c->N, c->C, 1e-5f);
    return dot_r(c->out, c->R, (size_t)c->N * c->C);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    int N = 19, C = 70;
    float *x = randbuf((size_t)N * C, 1.5), *w = randbuf(C, 1);
    float *o1 = gbuf((size_t)N * C), *o2 = gbuf((size_t)N * C), *r1 = gbuf(N), *r2 = gbuf(N);
    float *R = randbuf((size_t)N * C, 1);
    ref->ops->rmsnorm_fwd(ref, o1, r1, x, w, FSO_DT_F32, N, C, 1e-5f);
    fast->ops->rmsnorm_fwd(fast, o2, r2, x, w, FSO_DT_F32, N, C, 1e-5f);
    compare_guarded("rmsnorm_fwd out", o2, o1, (size_t)N * C, FAST_TOL);
    compare_guarded("rmsnorm_fwd rstd", r2, r1, N, FAST_TOL);

    float *dx1 = randbuf((size_t)N * C, 1), *dx2 = copybuf(dx1, (size_t)N * C);
    float *dw1 = randbuf(C, 1), *dw2 = copybuf(dw1, C);
    ref->ops->rmsnorm_bwd(ref, dx1, dw1, R, x, w, FSO_DT_F32, r1, N, C);
    fast->ops->rmsnorm_bwd(fast, dx2, dw2, R, x, w, FSO_DT_F32, r1, N, C);
    compare_guarded("rmsnorm_bwd dx", dx2, dx1, (size_t)N * C, FAST_TOL);
    compare_guarded("rmsnorm_bwd dw", dw2, dw1, C, FAST_TOL);

    memset(dx1, 0, sizeof(float) * N * C);
    memset(dw1, 0, sizeof(float) * C);
    ref->ops->rmsnorm_bwd(ref, dx1, dw1, R, x, w, FSO_DT_F32, r1, N, C);
    struct rn_ctx c = {x, w, o1, r1, R, N, C};
    fd_check("rmsnorm dx", x, (size_t)N * C, dx1, rn_loss, &c);
    fd_check("rmsnorm dw", w, C, dw1, rn_loss, &c);
    float *bufs[] = {x, w, o1, o2, r1, r2, R, dx1, dx2, dw1, dw2};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        gfree(bufs[i]);
}

/* ---------------------------------------------------------------- embedding */

static void test_embedding(void **state)
{
    (void)state;
    int N = 50, C = 130, V = 17;
    int32_t tok[50];
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)(fso_rng_u64(&rng) % V);
    tok[3] = tok[7] = tok[11] = 5; /* repeated ids accumulate */
    float *wte = randbuf((size_t)V * C, 1), *o1 = gbuf((size_t)N * C), *o2 = gbuf((size_t)N * C);
    ref->ops->embedding_fwd(ref, o1, tok, wte, FSO_DT_F32, N, C);
    fast->ops->embedding_fwd(fast, o2, tok, wte, FSO_DT_F32, N, C);
    compare_guarded("embedding_fwd", o2, o1, (size_t)N * C, 0);
    for (int c = 0; c < C; c++)
        assert_true(o1[(size_t)4 * C + c] == wte[(size_t)tok[4] * C + c]);

    float *dout = randbuf((size_t)N * C, 1);
    float *d1 = randbuf((size_t)V * C, 1), *d2 = copybuf(d1, (size_t)V * C);
    float *d0 = copybuf(d1, (size_t)V * C);
    ref->ops->embedding_bwd(ref, d1, tok, dout, N, C);
    fast->ops->embedding_bwd(fast, d2, tok, dout, N, C);
    compare_guarded("embedding_bwd", d2, d1, (size_t)V * C, FAST_TOL);
    /* dwte[5] gained the sum of the rows that used token 5 */
    for (int c = 0; c < C; c++) {
        double s = d0[(size_t)5 * C + c];
        for (int n = 0; n < N; n++)
            if (tok[n] == 5)
                s += dout[(size_t)n * C + c];
        assert_true(fabs(s - d1[(size_t)5 * C + c]) < 1e-4);
    }
    float *bufs[] = {wte, o1, o2, dout, d1, d2, d0};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        gfree(bufs[i]);
}

/* ---------------------------------------------------------------- rope */

struct rope_ctx { float *x, *work, *R, *cs, *sn; int B, T, nh, D; };
static double rope_loss(void *c_)
{
    struct rope_ctx *c = c_;
    size_t n = (size_t)c->B * c->T * c->nh * c->D;
    memcpy(c->work, c->x, sizeof(float) * n);
    ref->ops->rope(ref, c->work, FSO_DT_F32, c->cs, c->sn, NULL, c->B, c->T, c->nh, c->D, 0);
    return dot_r(c->work, c->R, n);
}

static void test_rope(void **state)
{
    (void)state;
    int B = 2, T = 11, nh = 3, D = 10;
    size_t n = (size_t)B * T * nh * D;
    float *cs = gbuf((size_t)T * D / 2), *sn = gbuf((size_t)T * D / 2);
    fso_rope_tables(cs, sn, T, D, 10000.0);
    /* position 0 is the identity; position t, pair 0 rotates by angle t */
    assert_true(cs[0] == 1.0f && sn[0] == 0.0f);
    assert_true(fabsf(cs[(size_t)3 * D / 2] - cosf(3.0f)) < 1e-6f);
    float *x = randbuf(n, 1), *a = copybuf(x, n), *b = copybuf(x, n);
    ref->ops->rope(ref, a, FSO_DT_F32, cs, sn, NULL, B, T, nh, D, 0);
    fast->ops->rope(fast, b, FSO_DT_F32, cs, sn, NULL, B, T, nh, D, 0);
    compare_guarded("rope", b, a, n, FAST_TOL);
    /* the inverse undoes it */
    fast->ops->rope(fast, b, FSO_DT_F32, cs, sn, NULL, B, T, nh, D, 1);
    compare_guarded("rope inverse", b, x, n, 1e-6);
    /* backward: dx = R^T dy, the inverse rotation of dy */
    float *R = randbuf(n, 1), *g = copybuf(R, n), *work = gbuf(n);
    ref->ops->rope(ref, g, FSO_DT_F32, cs, sn, NULL, B, T, nh, D, 1);
    struct rope_ctx c = {x, work, R, cs, sn, B, T, nh, D};
    fd_check("rope dx", x, n, g, rope_loss, &c);
    float *bufs[] = {cs, sn, x, a, b, R, g, work};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        gfree(bufs[i]);
}

/* ---------------------------------------------------------------- attention */

struct att_ctx { float *q, *k, *v, *out, *probs, *R; int B, T, H, Hkv, D; };
static double att_loss(void *c_)
{
    struct att_ctx *c = c_;
    ref->ops->attention_fwd(ref, c->out, c->probs, c->q, c->k, c->v, NULL, FSO_DT_F32, c->B, c->T,
                            c->H, c->Hkv, c->D);
    return dot_r(c->out, c->R, (size_t)c->B * c->T * c->H * c->D);
}

static void run_attention(int B, int T, int H, int Hkv, int D)
{
    size_t nq = (size_t)B * T * H * D, nkv = (size_t)B * T * Hkv * D, np = (size_t)B * H * T * T;
    float *q = randbuf(nq, 1), *k = randbuf(nkv, 1), *v = randbuf(nkv, 1);
    float *o1 = gbuf(nq), *o2 = gbuf(nq), *p1 = gbuf(np), *p2 = gbuf(np), *R = randbuf(nq, 1);
    ref->ops->attention_fwd(ref, o1, p1, q, k, v, NULL, FSO_DT_F32, B, T, H, Hkv, D);
    fast->ops->attention_fwd(fast, o2, p2, q, k, v, NULL, FSO_DT_F32, B, T, H, Hkv, D);
    compare_guarded("attention_fwd out", o2, o1, nq, FAST_TOL);
    compare_guarded("attention_fwd probs", p2, p1, np, FAST_TOL);
    /* causal: nothing attends to the future, rows sum to 1 */
    for (int bh = 0; bh < B * H; bh++)
        for (int t = 0; t < T; t++) {
            double s = 0;
            for (int u = 0; u < T; u++) {
                float pv = p1[((size_t)bh * T + t) * T + u];
                if (u > t)
                    assert_true(pv == 0.0f);
                s += pv;
            }
            assert_true(fabs(s - 1.0) < 1e-5);
        }

    float *dq1 = gbuf(nq), *dk1 = gbuf(nkv), *dv1 = gbuf(nkv);
    float *dq2 = gbuf(nq), *dk2 = gbuf(nkv), *dv2 = gbuf(nkv);
    ref->ops->attention_bwd(ref, dq1, dk1, dv1, R, p1, q, k, v, NULL, FSO_DT_F32, B, T, H, Hkv, D);
    fast->ops->attention_bwd(fast, dq2, dk2, dv2, R, p1, q, k, v, NULL, FSO_DT_F32, B, T, H, Hkv,
                             D);
    compare_guarded("attention_bwd dq", dq2, dq1, nq, FAST_TOL);
    compare_guarded("attention_bwd dk", dk2, dk1, nkv, FAST_TOL);
    compare_guarded("attention_bwd dv", dv2, dv1, nkv, FAST_TOL);
    struct att_ctx c = {q, k, v, o1, p1, R, B, T, H, Hkv, D};
    fd_check("attention dq", q, nq, dq1, att_loss, &c);
    fd_check("attention dk", k, nkv, dk1, att_loss, &c);
    fd_check("attention dv", v, nkv, dv1, att_loss, &c);
    float *bufs[] = {q, k, v, o1, o2, p1, p2, R, dq1, dk1, dv1, dq2, dk2, dv2};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        gfree(bufs[i]);
}

static void test_attention_gqa(void **state)
{
    (void)state;
    run_attention(2, 13, 6, 2, 8); /* 3 query heads per kv head */
}

static void test_attention_mha(void **state)
{
    (void)state;
    run_attention(1, 9, 4, 4, 6);
}

/* ---------------------------------------------------------------- swiglu, add */

struct sw_ctx { float *g, *u, *out, *R; size_t n; };
static double sw_loss(void *c_)
{
    struct sw_ctx *c = c_;
    ref->ops->swiglu_fwd(ref, c->out, c->g, c->u, FSO_DT_F32, c->n);
    return dot_r(c->out, c->R, c->n);
}

static void test_swiglu(void **state)
{
    (void)state;
    size_t n = 1001;
    float *g = randbuf(n, 2), *u = randbuf(n, 1), *o1 = gbuf(n), *o2 = gbuf(n), *R = randbuf(n, 1);
    ref->ops->swiglu_fwd(ref, o1, g, u, FSO_DT_F32, n);
    fast->ops->swiglu_fwd(fast, o2, g, u, FSO_DT_F32, n);
    compare_guarded("swiglu_fwd", o2, o1, n, FAST_TOL);
    float *dg1 = gbuf(n), *du1 = gbuf(n), *dg2 = gbuf(n), *du2 = gbuf(n);
    ref->ops->swiglu_bwd(ref, dg1, du1, R, g, u, FSO_DT_F32, n);
    fast->ops->swiglu_bwd(fast, dg2, du2, R, g, u, FSO_DT_F32, n);
    compare_guarded("swiglu_bwd dgate", dg2, dg1, n, FAST_TOL);
    compare_guarded("swiglu_bwd dup", du2, du1, n, FAST_TOL);
    struct sw_ctx c = {g, u, o1, R, n};
    fd_check("swiglu dgate", g, n, dg1, sw_loss, &c);
    fd_check("swiglu dup", u, n, du1, sw_loss, &c);

    float *s1 = gbuf(n), *s2 = gbuf(n);
    ref->ops->add(ref, s1, g, u, n);
    fast->ops->add(fast, s2, g, u, n);
    compare_guarded("add", s2, s1, n, 0);
    assert_true(s1[17] == g[17] + u[17]);
    float *bufs[] = {g, u, o1, o2, R, dg1, du1, dg2, du2, s1, s2};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        gfree(bufs[i]);
}

/* ---------------------------------------------------------------- bias */

struct bias_ctx { float *x, *b, *out, *R; int N, C; };
static double bias_loss(void *c_)
{
    struct bias_ctx *c = c_;
    memcpy(c->out, c->x, sizeof(float) * (size_t)c->N * c->C);
    ref->ops->bias_add(ref, c->out, c->b, FSO_DT_F32, c->N, c->C);
    return dot_r(c->out, c->R, (size_t)c->N * c->C);
}

static void test_bias(void **state)
{
    (void)state;
    int N = 301, C = 133; /* columns past two 64-wide ranges; rows past a pool chunk */
    size_t nc = (size_t)N * C;
    float *x = randbuf(nc, 1), *b = randbuf((size_t)C, 0.5), *R = randbuf(nc, 1);
    float *o1 = copybuf(x, nc), *o2 = copybuf(x, nc);
    ref->ops->bias_add(ref, o1, b, FSO_DT_F32, N, C);
    fast->ops->bias_add(fast, o2, b, FSO_DT_F32, N, C);
    compare_guarded("bias_add", o2, o1, nc, 0);
    assert_true(o1[2 * C + 5] == x[2 * C + 5] + b[5]);

    /* the gradient adds into db */
    float *db0 = randbuf((size_t)C, 1);
    float *db1 = copybuf(db0, (size_t)C), *db2 = copybuf(db0, (size_t)C);
    ref->ops->bias_bwd(ref, db1, R, FSO_DT_F32, N, C);
    fast->ops->bias_bwd(fast, db2, R, FSO_DT_F32, N, C);
    compare_guarded("bias_bwd db (accumulate)", db2, db1, (size_t)C, FAST_TOL);
    for (int c = 0; c < C; c++) {
        double s = db0[c];
        for (int n = 0; n < N; n++)
            s += R[(size_t)n * C + c];
        if (fabs(s - db1[c]) > 1e-5 * (1 + fabs(s)))
            fail_msg("bias_bwd db[%d]: %.9g, column sum %.9g", c, db1[c], s);
    }
    memset(db1, 0, sizeof(float) * C);
    ref->ops->bias_bwd(ref, db1, R, FSO_DT_F32, N, C);
    struct bias_ctx c = {x, b, o1, R, N, C};
    fd_check("bias db", b, (size_t)C, db1, bias_loss, &c);

    /* the same bits whatever the fast backend's thread count */
    fso_backend *one = NULL;
    assert_int_equal(fso_backend_create(&one, FSO_BACKEND_CPU, 0, 1, 0, NULL, 0), 0);
    float *db3 = copybuf(db0, (size_t)C);
    one->ops->bias_bwd(one, db3, R, FSO_DT_F32, N, C);
    assert_memory_equal(db3, db2, sizeof(float) * C);
    fso_backend_destroy(one);
    float *bufs[] = {x, b, R, o1, o2, db0, db1, db2, db3};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        gfree(bufs[i]);
}

/* ---------------------------------------------------------------- cross-entropy */

struct ce_ctx { float *logits, *work, *losses; int32_t *tgt; int N, V; };
static double ce_loss(void *c_)
{
    struct ce_ctx *c = c_;
    ref->ops->cross_entropy(ref, c->work, c->losses, c->logits, c->tgt, c->N, c->V, 1.0f);
    double s = 0;
    for (int i = 0; i < c->N; i++)
        s += c->losses[i];
    return s;
}

static void test_cross_entropy(void **state)
{
    (void)state;
    int N = 21, V = 77;
    int32_t tgt[21];
    for (int i = 0; i < N; i++)
        tgt[i] = (int32_t)(fso_rng_u64(&rng) % V);
    size_t n = (size_t)N * V;
    float *lg = randbuf(n, 3), *d1 = gbuf(n), *d2 = gbuf(n), *l1 = gbuf(N), *l2 = gbuf(N);
    ref->ops->cross_entropy(ref, d1, l1, lg, tgt, N, V, 0.25f);
    fast->ops->cross_entropy(fast, d2, l2, lg, tgt, N, V, 0.25f);
    compare_guarded("cross_entropy losses", l2, l1, N, FAST_TOL);
    compare_guarded("cross_entropy dlogits", d2, d1, n, FAST_TOL);
    /* uniform logits: loss is log V */
    float *flat = gbuf(V), *fd = gbuf(V), *fl = gbuf(1);
    for (int j = 0; j < V; j++)
        flat[j] = 0.5f;
    ref->ops->cross_entropy(ref, fd, fl, flat, tgt, 1, V, 1.0f);
    assert_true(fabs(fl[0] - log((double)V)) < 1e-5);
    /* in place: dlogits written over the logits */
    float *inpl = copybuf(lg, n), *li = gbuf(N);
    fast->ops->cross_entropy(fast, inpl, li, inpl, tgt, N, V, 0.25f);
    compare_guarded("cross_entropy in place", inpl, d1, n, FAST_TOL);

    float *g = gbuf(n), *work = gbuf(n);
    ref->ops->cross_entropy(ref, g, l1, lg, tgt, N, V, 1.0f);
    struct ce_ctx c = {lg, work, l1, tgt, N, V};
    fd_check("cross_entropy dlogits", lg, n, g, ce_loss, &c);
    float *bufs[] = {lg, d1, d2, l1, l2, flat, fd, fl, inpl, li, g, work};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        gfree(bufs[i]);
}

/* ------------------------------------------------- documents in a window */

/* Positions of B rows of T with documents starting at row b's starts[b]
 * (besides the row's first token), as fso_data_next gives them. */
static void doc_positions(int32_t *pos, int B, int T, const int starts[][3])
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            bool start = t == 0;
            for (int i = 0; i < 3; i++)
                start = start || starts[b][i] == t;
            pos[b * T + t] = start ? 0 : pos[b * T + t - 1] + 1;
        }
}

struct doc_att_ctx { float *q, *k, *v, *out, *probs, *R; const int32_t *pos; int B, T, H, Hkv, D; };
static double doc_att_loss(void *c_)
{
    struct doc_att_ctx *c = c_;
    ref->ops->attention_fwd(ref, c->out, c->probs, c->q, c->k, c->v, c->pos, FSO_DT_F32, c->B,
                            c->T, c->H, c->Hkv, c->D);
    return dot_r(c->out, c->R, (size_t)c->B * c->T * c->H * c->D);
}

/* Attention and RoPE with documents packed in a window: the fast backend
 * agrees with the reference (fp32, and bf16 through the seam's types), a
 * token attends only to its document so far (probabilities 0 elsewhere),
 * the gradients match finite differences, and each document gives what it
 * gives run apart (a row of its own, positions from 0). */
static void test_attention_and_rope_keep_documents_apart(void **state)
{
    (void)state;
    enum { B = 2, T = 13, H = 4, Hkv = 2, D = 8 };
    static const int starts[B][3] = {{4, 9, -1}, {1, 2, 12}};
    int32_t pos[B * T];
    doc_positions(pos, B, T, starts);
    const size_t nq = (size_t)B * T * H * D, nkv = (size_t)B * T * Hkv * D;
    const size_t np = (size_t)B * H * T * T;
    float *cs = gbuf((size_t)T * D / 2), *sn = gbuf((size_t)T * D / 2);
    fso_rope_tables(cs, sn, T, D, 10000.0);

    /* rope: row positions from pos; the inverse undoes it */
    float *x = randbuf(nq, 1), *a = copybuf(x, nq), *b2 = copybuf(x, nq);
    ref->ops->rope(ref, a, FSO_DT_F32, cs, sn, pos, B, T, H, D, 0);
    fast->ops->rope(fast, b2, FSO_DT_F32, cs, sn, pos, B, T, H, D, 0);
    compare_guarded("rope with positions", b2, a, nq, FAST_TOL);
    fast->ops->rope(fast, b2, FSO_DT_F32, cs, sn, pos, B, T, H, D, 1);
    compare_guarded("rope with positions, inverse", b2, x, nq, 1e-6);

    float *q = randbuf(nq, 1), *k = randbuf(nkv, 1), *v = randbuf(nkv, 1), *R = randbuf(nq, 1);
    float *o1 = gbuf(nq), *o2 = gbuf(nq), *p1 = gbuf(np), *p2 = gbuf(np);
    ref->ops->attention_fwd(ref, o1, p1, q, k, v, pos, FSO_DT_F32, B, T, H, Hkv, D);
    fast->ops->attention_fwd(fast, o2, p2, q, k, v, pos, FSO_DT_F32, B, T, H, Hkv, D);
    compare_guarded("attention_fwd out, documents", o2, o1, nq, FAST_TOL);
    compare_guarded("attention_fwd probs, documents", p2, p1, np, FAST_TOL);
    for (int bh = 0; bh < B * H; bh++)
        for (int t = 0; t < T; t++) {
            const int s0 = t - pos[(bh / H) * T + t];
            double sum = 0;
            for (int u = 0; u < T; u++) {
                const float pv = p1[((size_t)bh * T + t) * T + u];
                if (u < s0 || u > t)
                    assert_true(pv == 0.0f);
                sum += pv;
            }
            assert_true(fabs(sum - 1.0) < 1e-5);
        }
    float *dq1 = gbuf(nq), *dk1 = gbuf(nkv), *dv1 = gbuf(nkv);
    float *dq2 = gbuf(nq), *dk2 = gbuf(nkv), *dv2 = gbuf(nkv);
    ref->ops->attention_bwd(ref, dq1, dk1, dv1, R, p1, q, k, v, pos, FSO_DT_F32, B, T, H, Hkv, D);
    fast->ops->attention_bwd(fast, dq2, dk2, dv2, R, p1, q, k, v, pos, FSO_DT_F32, B, T, H, Hkv,
                             D);
    compare_guarded("attention_bwd dq, documents", dq2, dq1, nq, FAST_TOL);
    compare_guarded("attention_bwd dk, documents", dk2, dk1, nkv, FAST_TOL);
    compare_guarded("attention_bwd dv, documents", dv2, dv1, nkv, FAST_TOL);
    struct doc_att_ctx c = {q, k, v, o1, p1, R, pos, B, T, H, Hkv, D};
    fd_check("attention dq, documents", q, nq, dq1, doc_att_loss, &c);
    fd_check("attention dk, documents", k, nkv, dk1, doc_att_loss, &c);
    fd_check("attention dv, documents", v, nkv, dv1, doc_att_loss, &c);

    /* Row 1's document [2, 12) run apart: a row of 10 from position 0 */
    enum { S = 2, L = 10 };
    const size_t lq = (size_t)L * H * D, lkv = (size_t)L * Hkv * D;
    float *aq = copybuf(q + ((size_t)T + S) * H * D, lq);
    float *ak = copybuf(k + ((size_t)T + S) * Hkv * D, lkv);
    float *av = copybuf(v + ((size_t)T + S) * Hkv * D, lkv);
    float *ao = gbuf(lq), *ap = gbuf((size_t)H * L * L);
    float *aR = copybuf(R + ((size_t)T + S) * H * D, lq);
    float *adq = gbuf(lq), *adk = gbuf(lkv), *adv = gbuf(lkv);
    fast->ops->attention_fwd(fast, ao, ap, aq, ak, av, NULL, FSO_DT_F32, 1, L, H, Hkv, D);
    compare_guarded("a packed document's out as apart", ao, o2 + ((size_t)T + S) * H * D, lq,
                    1e-6);
    fast->ops->attention_bwd(fast, adq, adk, adv, aR, ap, aq, ak, av, NULL, FSO_DT_F32, 1, L, H,
                             Hkv, D);
    compare_guarded("a packed document's dq as apart", adq, dq2 + ((size_t)T + S) * H * D, lq,
                    1e-6);
    compare_guarded("a packed document's dk as apart", adk, dk2 + ((size_t)T + S) * Hkv * D, lkv,
                    1e-6);
    compare_guarded("a packed document's dv as apart", adv, dv2 + ((size_t)T + S) * Hkv * D, lkv,
                    1e-6);
    float *ax = copybuf(x + ((size_t)T + S) * H * D, lq);
    fast->ops->rope(fast, ax, FSO_DT_F32, cs, sn, NULL, 1, L, H, D, 0);
    compare_guarded("a packed document's rope as apart", ax, a + ((size_t)T + S) * H * D, lq,
                    1e-6);

    /* bf16 through the seam's types: fast against the reference */
    uint16_t *q16 = malloc(nq * 2), *k16 = malloc(nkv * 2), *v16 = malloc(nkv * 2);
    uint16_t *oa = malloc(nq * 2), *ob = malloc(nq * 2), *pa = malloc(np * 2), *pb = malloc(np * 2);
    assert_true(q16 && k16 && v16 && oa && ob && pa && pb);
    for (size_t i = 0; i < nq; i++)
        q16[i] = fso_bf16_from_f32(q[i]);
    for (size_t i = 0; i < nkv; i++) {
        k16[i] = fso_bf16_from_f32(k[i]);
        v16[i] = fso_bf16_from_f32(v[i]);
    }
    ref->ops->attention_fwd(ref, oa, pa, q16, k16, v16, pos, FSO_DT_BF16, B, T, H, Hkv, D);
    fast->ops->attention_fwd(fast, ob, pb, q16, k16, v16, pos, FSO_DT_BF16, B, T, H, Hkv, D);
    float *fa = gbuf(nq), *fb = gbuf(nq);
    for (size_t i = 0; i < nq; i++) {
        fa[i] = fso_f32_from_bf16(oa[i]);
        fb[i] = fso_f32_from_bf16(ob[i]);
    }
    compare_guarded("attention_fwd bf16, documents", fb, fa, nq, 1e-2);
    free(q16), free(k16), free(v16), free(oa), free(ob), free(pa), free(pb);

    float *bufs[] = {cs, sn, x, a, b2, q, k, v, R, o1, o2, p1, p2, dq1, dk1, dv1, dq2, dk2, dv2,
                     aq, ak, av, ao, ap, aR, adq, adk, adv, ax, fa, fb};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        gfree(bufs[i]);
}

/* A target < 0 does not count: loss 0 and a zero row of dlogits, on both
 * backends, the other rows as without it. */
static void test_cross_entropy_skips_negative_targets(void **state)
{
    (void)state;
    int N = 9, V = 31;
    int32_t tgt[9], all[9];
    for (int i = 0; i < N; i++)
        all[i] = tgt[i] = (int32_t)(fso_rng_u64(&rng) % V);
    tgt[0] = tgt[4] = tgt[8] = -1;
    size_t n = (size_t)N * V;
    float *lg = randbuf(n, 3), *d1 = gbuf(n), *d2 = gbuf(n), *l1 = gbuf(N), *l2 = gbuf(N);
    float *d0 = gbuf(n), *l0 = gbuf(N);
    ref->ops->cross_entropy(ref, d0, l0, lg, all, N, V, 0.5f);
    ref->ops->cross_entropy(ref, d1, l1, lg, tgt, N, V, 0.5f);
    float *inpl = copybuf(lg, n);
    fast->ops->cross_entropy(fast, inpl, l2, inpl, tgt, N, V, 0.5f);
    memcpy(d2, inpl, sizeof(float) * n);
    compare_guarded("cross_entropy losses, masked", l2, l1, N, FAST_TOL);
    compare_guarded("cross_entropy dlogits, masked", d2, d1, n, FAST_TOL);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < V; j++) {
            const size_t e = (size_t)i * V + j;
            if (tgt[i] < 0) {
                assert_true(d1[e] == 0.0f && d2[e] == 0.0f && l1[i] == 0.0f && l2[i] == 0.0f);
            } else {
                assert_true(d1[e] == d0[e]); /* the same bits as without the masked rows */
                assert_true(l1[i] == l0[i]);
            }
        }
    float *bufs[] = {lg, d1, d2, l1, l2, d0, l0, inpl};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        gfree(bufs[i]);
}

/* ---------------------------------------------------------------- sqnorm */

static void test_sqnorm_is_exact_and_thread_independent(void **state)
{
    (void)state;
    size_t n = 300000; /* several chunks */
    float *x = randbuf(n, 1);
    double a = 0, b = 0, exact = 0;
    ref->ops->sqnorm(ref, &a, x, n);
    fast->ops->sqnorm(fast, &b, x, n);
    for (size_t i = 0; i < n; i++)
        exact += (double)x[i] * x[i];
    assert_true(fabs(a - exact) <= 1e-12 * exact);
    assert_true(fabs(b - exact) <= 1e-12 * exact);
    /* same bits with one thread */
    fso_backend *one = NULL;
    assert_int_equal(fso_backend_create(&one, FSO_BACKEND_CPU, 0, 1, 0, NULL, 0), 0);
    double c = 0;
    one->ops->sqnorm(one, &c, x, n);
    assert_true(memcmp(&b, &c, sizeof b) == 0);
    fso_backend_destroy(one);
    gfree(x);
}

/* The device's reduction as its kernels run it (cuda_ops.cu), one thread
 * of a block at a time: lane t of a chunk adds elements t, t + 256, ...;
 * the halving tree; slot t of the final block adds chunks t, t + 256, ...
 * from 0.0; the tree again. sum_order.h's definition, written plainly. */
static double tree256(double *v)
{
    for (int w = 128; w > 0; w >>= 1)
        for (int t = 0; t < w; t++)
            v[t] = v[t] + v[t + w];
    return v[0];
}

static double device_order(const float *x, size_t n, bool square)
{
    const size_t chunks = (n + 65535) / 65536;
    double part_slot[256];
    for (int t = 0; t < 256; t++) {
        double s = 0.0;
        for (size_t b = (size_t)t; b < chunks; b += 256) {
            const size_t base = b * 65536, end = base + 65536 < n ? base + 65536 : n;
            double lane[256];
            for (int l = 0; l < 256; l++) {
                double ls = 0.0;
                for (size_t i = base + (size_t)l; i < end; i += 256)
                    ls += square ? (double)x[i] * x[i] : (double)x[i];
                lane[l] = ls;
            }
            s += tree256(lane);
        }
        part_slot[t] = s;
    }
    return tree256(part_slot);
}

/* Every CPU path of sqnorm and sum takes sum_order.h's order, bit for bit,
 * on 1 and 2 threads, around a lane row's and a chunk's edges and past 256
 * chunks (a slot's second chunk); fso_sum_ordered is the device's order. */
static void test_sqnorm_and_sum_take_the_one_order(void **state)
{
    (void)state;
    const size_t sizes[] = {1, 255, 256, 257, 1023, 65535, 65536, 65537, 9 * 65536 + 1001,
                            (size_t)256 * 65536 + 3};
    fso_backend *be[2] = {NULL, NULL};
    fso_pool *pool[2] = {NULL, NULL};
    for (int t = 0; t < 2; t++) {
        assert_int_equal(fso_backend_create(&be[t], FSO_BACKEND_CPU, 0, t + 1, 0, NULL, 0), 0);
        assert_int_equal(fso_pool_create(&pool[t], t + 1), 0);
    }
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        const size_t n = sizes[k];
        float *x = randbuf(n, 3);
        for (int square = 0; square < 2; square++) {
            const double want = 0.25 + fso_sum_ordered(x, n, square);
            if (n < 2 * 65536) { /* the plain replay is slow: strided over a chunk */
                const double dev = 0.25 + device_order(x, n, square);
                if (memcmp(&dev, &want, sizeof want) != 0)
                    fail_msg("n %zu %s: fso_sum_ordered %.17g, the device's order %.17g", n,
                             square ? "sqnorm" : "sum", want, dev);
            }
            double got[5];
            for (int t = 0; t < 2; t++) {
                got[2 * t] = got[2 * t + 1] = 0.25;
                if (square) {
                    be[t]->ops->sqnorm(be[t], &got[2 * t], x, n);
                    fso_host_sqnorm(pool[t], &got[2 * t + 1], x, n);
                } else {
                    be[t]->ops->sum(be[t], &got[2 * t], x, n);
                    fso_host_sum(pool[t], &got[2 * t + 1], x, n);
                }
            }
            got[4] = 0.25; /* cpu-ref */
            if (square)
                ref->ops->sqnorm(ref, &got[4], x, n);
            else
                ref->ops->sum(ref, &got[4], x, n);
            static const char *const what[5] = {"cpu backend, 1 thread", "fso_host_*, 1 thread",
                                                "cpu backend, 2 threads", "fso_host_*, 2 threads",
                                                "cpu-ref"};
            for (int i = 0; i < 5; i++)
                if (memcmp(&got[i], &want, sizeof want) != 0)
                    fail_msg("n %zu %s, %s: %.17g, the order gives %.17g", n,
                             square ? "sqnorm" : "sum", what[i], got[i], want);
        }
        gfree(x);
    }
    for (int t = 0; t < 2; t++) {
        fso_backend_destroy(be[t]);
        fso_pool_destroy(pool[t]);
    }
}

/* A reduce-scatter in host memory with its norm: the sum of the sources
 * in their order (added to dst when accumulating), and the norm
 * fso_host_sqnorm takes of the result, bit for bit, on any thread count;
 * dst may be one of the sources (the device's own part of its gradients). */
static void test_reduce_sqnorm_is_sum_then_sqnorm(void **state)
{
    (void)state;
    /* whole chunks and a part, split among one and three threads */
    const size_t n = 9 * 65536 + 1001;
    const int threads[2] = {1, 3};
    for (int nsrc = 2; nsrc <= 3; nsrc++)
        for (int mode = 0; mode < 3; mode++) /* into dst, accumulated in dst, into a source */
            for (int t = 0; t < 2; t++) {
                fso_pool *pool = NULL;
                assert_int_equal(fso_pool_create(&pool, threads[t]), 0);
                float *src[3];
                for (int k = 0; k < nsrc; k++)
                    src[k] = randbuf(n, 1.0 + k);
                float *dst = mode == 2 ? src[1] : randbuf(n, 0.5);
                float *want = copybuf(dst, n);
                for (size_t i = 0; i < n; i++) {
                    float sum = src[0][i];
                    for (int k = 1; k < nsrc; k++)
                        sum += src[k][i];
                    want[i] = mode == 1 ? want[i] + sum : sum;
                }
                double sq_want = 0.25, sq_got = 0.25;
                fso_host_sqnorm(NULL, &sq_want, want, n);
                fso_host_reduce_sqnorm(pool, dst, (const float *const *)src, nsrc, n, mode == 1,
                                       &sq_got);
                char what[96];
                snprintf(what, sizeof what, "%d sources, mode %d, %d threads", nsrc, mode,
                         threads[t]);
                guard_check(dst, n, what);
                if (memcmp(dst, want, sizeof(float) * n) != 0)
                    fail_msg("%s: the sums differ", what);
                if (memcmp(&sq_got, &sq_want, sizeof sq_got) != 0)
                    fail_msg("%s: norm %.17g, want %.17g", what, sq_got, sq_want);
                if (mode == 0) { /* without sq: the same sums */
                    float *again = randbuf(n, 0.5);
                    fso_host_reduce_sqnorm(pool, again, (const float *const *)src, nsrc, n,
                                           false, NULL);
                    if (memcmp(again, want, sizeof(float) * n) != 0)
                        fail_msg("%s, no norm: the sums differ", what);
                    gfree(again);
                }
                gfree(want);
                if (mode != 2)
                    gfree(dst);
                for (int k = 0; k < nsrc; k++)
                    gfree(src[k]);
                fso_pool_destroy(pool);
            }
}

/* ---------------------------------------------------------------- sum */

static void test_sum_is_exact_in_double(void **state)
{
    (void)state;
    size_t n = 300001;
    float *x = randbuf(n, 1);
    double a = 1, b = 1, exact = 1, mag = 0;
    ref->ops->sum(ref, &a, x, n);
    fast->ops->sum(fast, &b, x, n);
    for (size_t i = 0; i < n; i++) {
        exact += x[i];
        mag += fabs(x[i]);
    }
    assert_true(fabs(a - exact) <= 1e-13 * mag);
    assert_true(memcmp(&a, &b, sizeof a) == 0);
    gfree(x);
}

/* ---------------------------------------------------------------- cpu-async */

/* The simulated discrete device keeps a GPU's rules: its memory is not the
 * host's (a host store through a device pointer faults); copies, ops and
 * results happen only when the host waits for them; work ordered after a
 * mark runs as early as the mark allows. */
static void test_async_device_keeps_a_gpus_rules(void **state)
{
    (void)state;
    fso_backend *be = NULL;
    assert_int_equal(fso_backend_create(&be, FSO_BACKEND_CPU_ASYNC, 0, 2, 0, NULL, 0), 0);
    assert_int_equal(be->ops->host_addressable, 0);
    /* what the budgets assume of each backend before creating one */
    assert_int_equal(fso_backend_find("cpu-async")->host_addressable, be->ops->host_addressable);
    assert_false(fso_backend_find("cuda")->host_addressable);
    for (fso_backend_kind k = FSO_BACKEND_CPU; k <= FSO_BACKEND_CPU_REF; k++) {
        fso_backend *cpu = NULL;
        assert_int_equal(fso_backend_create(&cpu, k, 0, 1, 0, NULL, 0), 0);
        assert_int_equal(fso_backend_row_of(k)->host_addressable, cpu->ops->host_addressable);
        fso_backend_destroy(cpu);
    }
    const size_t n = 1000;
    float *d = NULL, *d2 = NULL;
    assert_int_equal(be->ops->buf_alloc(be, sizeof(float) * n, (void **)&d), 0);
    assert_int_equal(be->ops->buf_alloc(be, sizeof(float) * n, (void **)&d2), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* the host touching device memory must fault */
        signal(SIGSEGV, SIG_DFL); /* not CMocka's handler */
        signal(SIGBUS, SIG_DFL);
        d[0] = 1.0f;
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_false(WIFEXITED(st) && WEXITSTATUS(st) == 0);

    float *x = randbuf(n, 1), *back = gbuf(n);
    float src[4] = {1, 2, 3, 4}, out[4] = {0};
    be->ops->copy_h2d(be, d, src, sizeof src);
    src[0] = 10; /* refilled before any wait: the copy takes the new value */
    be->ops->copy_d2h(be, out, d, sizeof out);
    assert_true(out[0] == 0 && out[3] == 0); /* not there before a wait */
    uint64_t copies = be->ops->mark_copies(be);
    be->ops->wait_mark(be, copies);
    assert_true(out[0] == 10 && out[3] == 4);

    double total = 0, exact = 0;
    be->ops->copy_h2d(be, d2, x, sizeof(float) * n);
    be->ops->sum(be, &total, d2, n);
    uint64_t after_sum = be->ops->mark_copies(be);
    be->ops->add(be, d2, d2, d2, n);
    be->ops->wait_mark(be, after_sum);
    assert_true(total == 0); /* a copies-only mark does not deliver results */
    be->ops->wait_mark(be, be->ops->mark(be));
    for (size_t i = 0; i < n; i++)
        exact += x[i];
    assert_true(memcmp(&total, &exact, sizeof total) == 0);
    be->ops->copy_d2h(be, back, d2, sizeof(float) * n);
    assert_int_equal(be->ops->sync(be), 0);
    for (size_t i = 0; i < n; i++)
        assert_true(back[i] == x[i] + x[i]);
    /* a copy ordered after a mark runs ahead of compute queued after the
     * mark: that compute sees the copy, as it may on a GPU */
    float one[4] = {1, 1, 1, 1}, two[4] = {2, 2, 2, 2}, seen[4];
    be->ops->copy_h2d(be, d, one, sizeof one);
    uint64_t m = be->ops->mark(be);
    be->ops->add(be, d2, d, d, 4); /* queued after the mark: not protected by it */
    be->ops->copy_h2d_after(be, d, two, sizeof two, m);
    be->ops->copy_d2h(be, seen, d2, sizeof seen);
    assert_int_equal(be->ops->sync(be), 0);
    assert_true(seen[0] == 4 && seen[3] == 4);
    be->ops->buf_free(be, d);
    be->ops->buf_free(be, d2);
    assert_int_equal(be->mem_used_bytes, 0);
    fso_backend_destroy(be);
    gfree(x);
    gfree(back);
}

/* A mark used after 1024 later ones (the CUDA backend's window too) is
 * stale: waiting for it, or ordering a copy after it, then waits for all
 * the device's work, which is still right but loses overlap, and each such
 * use is counted for the step line (the backend's stale_marks op, as the
 * trainer reads it). A recent mark is not; a backend without marks keeps
 * no window and reports none. */
static void test_async_stale_marks_are_counted_and_still_right(void **state)
{
    (void)state;
    fso_backend *be = NULL;
    assert_int_equal(fso_backend_create(&be, FSO_BACKEND_CPU_ASYNC, 0, 1, 0, NULL, 0), 0);
    float *d = NULL, src[4] = {1, 2, 3, 4}, two[4] = {2, 2, 2, 2}, back[4] = {0};
    assert_int_equal(be->ops->buf_alloc(be, sizeof src, (void **)&d), 0);
    be->ops->copy_h2d(be, d, src, sizeof src);
    const uint64_t old = be->ops->mark(be);
    be->ops->wait_mark(be, old);
    assert_int_equal(fso_backend_stale_marks(be), 0);
    for (int i = 0; i < 1024; i++)
        be->ops->mark(be);
    be->ops->add(be, d, d, d, 4); /* queued after the old mark */
    be->ops->wait_mark(be, old);   /* stale: waits for the add too */
    assert_int_equal(fso_backend_stale_marks(be), 1);
    be->ops->copy_h2d_after(be, d, two, sizeof two, old); /* stale: after the add */
    be->ops->copy_d2h(be, back, d, sizeof back);
    assert_int_equal(be->ops->sync(be), 0);
    assert_int_equal(fso_backend_stale_marks(be), 2);
    assert_true(back[0] == 2 && back[3] == 2);
    be->ops->wait_mark(be, be->ops->mark(be));
    assert_int_equal(fso_backend_stale_marks(be), 2);
    assert_int_equal(fso_async_counts_of(be).stale_marks, 2);
    be->ops->buf_free(be, d);
    fso_backend_destroy(be);
    assert_null(fast->ops->stale_marks);
    assert_int_equal(fso_backend_stale_marks(fast), 0);
}

/* ---------------------------------------------------------------- casts */

/* The plain reference: bf16 is the top half of an fp32. */
static float bf16_widened(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* cast_bf16_f32 on backend be over src (n): bit-exact against the plain
 * reference (NaN included: payload and sign kept), nothing written past n. */
static void check_cast(fso_backend *be, const uint16_t *src, size_t n, const char *what)
{
    float *dst = gbuf(n);
    be->ops->cast_bf16_f32(be, dst, src, n);
    guard_check(dst, n, what);
    for (size_t i = 0; i < n; i++) {
        float want = bf16_widened(src[i]);
        if (memcmp(&dst[i], &want, sizeof want))
            fail_msg("%s (%s), n %zu: element %zu (bf16 0x%04x): %a, want %a", what,
                     be->ops->name, n, i, src[i], dst[i], want);
    }
    gfree(dst);
}

static void test_cast_bf16_f32_is_exact(void **state)
{
    (void)state;
    /* every bf16 value: ±0, denormals, normals, ±Inf, quiet and signalling NaNs */
    size_t n_all = 65536;
    uint16_t *all = malloc(sizeof(uint16_t) * n_all);
    assert_non_null(all);
    for (size_t i = 0; i < n_all; i++)
        all[i] = (uint16_t)i;
    assert_true(bf16_widened(0x0001) > 0 && bf16_widened(0x0001) < 1.2e-38f); /* a denormal */
    assert_true(isinf(bf16_widened(0xff80)) && bf16_widened(0xff80) < 0);
    assert_true(isnan(bf16_widened(0x7fc1)));
    check_cast(ref, all, n_all, "all bf16 values");
    check_cast(fast, all, n_all, "all bf16 values");
    /* odd lengths and offsets, and one long enough to split over threads */
    static const size_t lens[] = {0, 1, 3, 7, 1023, 32769, 100003};
    for (size_t l = 0; l < sizeof lens / sizeof *lens; l++) {
        size_t n = lens[l];
        uint16_t *src = malloc(sizeof(uint16_t) * (n + 1));
        assert_non_null(src);
        for (size_t i = 0; i <= n; i++)
            src[i] = (uint16_t)(fso_rng_u64(&rng) >> 48);
        check_cast(ref, src + 1, n, "random bits, odd offset");
        check_cast(fast, src + 1, n, "random bits, odd offset");
        free(src);
    }
    free(all);
}

/* cast_f32_bf16: round to nearest even, as the AdamW kernels round
 * (fso_bf16_from_f32), on both backends, over the bf16 rounding edges, the
 * specials and random bits; nothing written past n. */
static void check_narrow(fso_backend *be, const float *src, size_t n, const char *what)
{
    uint16_t *dst = malloc(sizeof(uint16_t) * (n + 8));
    assert_non_null(dst);
    for (size_t i = 0; i < n + 8; i++)
        dst[i] = 0xA5A5;
    be->ops->cast_f32_bf16(be, dst, src, n);
    for (size_t i = 0; i < n; i++)
        if (dst[i] != fso_bf16_from_f32(src[i]))
            fail_msg("%s (%s): element %zu (%a): 0x%04x, want 0x%04x", what, be->ops->name, i,
                     src[i], dst[i], fso_bf16_from_f32(src[i]));
    for (size_t i = n; i < n + 8; i++)
        if (dst[i] != 0xA5A5)
            fail_msg("%s (%s): written past the end at %zu", what, be->ops->name, i);
    free(dst);
}

/* ------------------------------------------------------ bf16 reduce-scatter */

struct rs16_job {
    fso_coll *c;
    fso_backend *be;      /* cpu-async device, or NULL: host memory (threads) */
    int rank;
    size_t count;
    const uint16_t *send; /* (world * count) bf16, host */
    float *got;           /* (count) */
    int rc;
};

static void *rs16_rank(void *arg)
{
    struct rs16_job *j = arg;
    const size_t all = (size_t)j->c->world * j->count;
    if (!j->be) {
        j->rc = j->c->ops->reduce_scatter_bf16(j->c, j->rank, j->send, j->got, j->count);
        return NULL;
    }
    fso_backend *be = j->be;
    uint16_t *d_send = NULL;
    float *d_recv = NULL;
    j->rc = be->ops->buf_alloc(be, sizeof(uint16_t) * all, (void **)&d_send);
    if (j->rc == 0)
        j->rc = be->ops->buf_alloc(be, sizeof(float) * j->count, (void **)&d_recv);
    if (j->rc == 0) {
        be->ops->copy_h2d(be, d_send, j->send, sizeof(uint16_t) * all);
        j->rc = j->c->ops->reduce_scatter_bf16(j->c, j->rank, d_send, d_recv, j->count);
        be->ops->copy_d2h(be, j->got, d_recv, sizeof(float) * j->count);
    }
    if (j->rc == 0)
        j->rc = be->ops->sync(be);
    be->ops->buf_free(be, d_send);
    be->ops->buf_free(be, d_recv);
    return NULL;
}

/* reduce_scatter_bf16 (coll.h) on the threads collectives and on cpu-async
 * devices: each rank's part is the fp32 sum, in rank order, of the bf16
 * values widened, bit for bit. The values mix magnitudes so that another
 * order or a bf16 sum would give other bits (checked below). */
static void test_reduce_scatter_bf16_sums_in_fp32_in_rank_order(void **state)
{
    (void)state;
    const size_t count = 1031;
    for (int async = 0; async < 2; async++)
        for (int W = 1; W <= 4; W++) {
            uint16_t *send[4];
            float *got[4];
            fso_backend *bes[4] = {NULL};
            for (int r = 0; r < W; r++) {
                send[r] = malloc(sizeof(uint16_t) * W * count);
                got[r] = calloc(count, sizeof(float));
                assert_true(send[r] && got[r]);
                for (size_t i = 0; i < (size_t)W * count; i++) {
                    float v = (float)(fso_rng_normal(&rng) * ldexp(1.0, (int)(i % 7) * 3 - 9));
                    send[r][i] = fso_bf16_from_f32(r == 0 && i % 5 == 0 ? v * 0x1p20f : v);
                }
                if (async)
                    assert_int_equal(fso_backend_create(&bes[r], FSO_BACKEND_CPU_ASYNC, r, 1, 0,
                                                        NULL, 0), 0);
            }
            fso_coll *c = NULL;
            if (async)
                assert_int_equal(fso_coll_create_async(&c, W, bes), 0);
            else
                assert_int_equal(fso_coll_create_threads(&c, W), 0);
            struct rs16_job jobs[4];
            pthread_t th[4];
            for (int r = 0; r < W; r++) {
                jobs[r] = (struct rs16_job){c, bes[r], r, count, send[r], got[r], 0};
                assert_int_equal(pthread_create(&th[r], NULL, rs16_rank, &jobs[r]), 0);
            }
            for (int r = 0; r < W; r++) {
                pthread_join(th[r], NULL);
                assert_int_equal(jobs[r].rc, 0);
            }
            size_t other_order = 0;
            for (int r = 0; r < W; r++)
                for (size_t i = 0; i < count; i++) {
                    const size_t at = (size_t)r * count + i;
                    float want = fso_f32_from_bf16(send[0][at]), back = 0;
                    for (int k = 1; k < W; k++)
                        want += fso_f32_from_bf16(send[k][at]);
                    for (int k = W - 1; k >= 0; k--)
                        back += fso_f32_from_bf16(send[k][at]);
                    other_order += memcmp(&back, &want, sizeof want) != 0;
                    if (memcmp(&got[r][i], &want, sizeof want) != 0)
                        fail_msg("%s, %d ranks: rank %d element %zu: %a, want %a",
                                 async ? "cpu-async" : "threads", W, r, i, got[r][i], want);
                }
            if (W >= 3) /* the test tells rank order from the reverse */
                assert_true(other_order > 0);
            fso_coll_destroy(c);
            for (int r = 0; r < W; r++) {
                fso_backend_destroy(bes[r]);
                free(send[r]);
                free(got[r]);
            }
        }
}

static void test_cast_f32_bf16_rounds_to_nearest_even(void **state)
{
    (void)state;
    /* every bf16 value with each low half that decides the rounding: exact,
     * just below, at (ties to even) and just above the halfway point */
    static const uint32_t lows[] = {0x0000, 0x7fff, 0x8000, 0x8001, 0xffff};
    const size_t n = 65536 * 5;
    float *src = malloc(sizeof(float) * n);
    assert_non_null(src);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = ((uint32_t)(i / 5) << 16) | lows[i % 5];
        memcpy(&src[i], &bits, sizeof bits);
    }
    uint32_t half_up = 0x3f808000u; /* 1.00390625: a tie, rounds to the even 0x3f80 */
    float tie;
    memcpy(&tie, &half_up, sizeof tie);
    assert_int_equal(fso_bf16_from_f32(tie), 0x3f80);
    check_narrow(ref, src, n, "rounding edges");
    check_narrow(fast, src, n, "rounding edges");
    for (size_t len = 0; len < 40; len += 13) {
        check_narrow(ref, src + 1, len, "short, odd offset");
        check_narrow(fast, src + 1, len, "short, odd offset");
    }
    free(src);
}

/* ---------------------------------------------------------------- bf16 tensors */

/* One typed op call (backend.h, "Types"), its float tensors in order: what
 * each is to the op and whether it is stored [dt]. */
enum { T_IN, T_OUT, T_INOUT };
#define TMAX 9
typedef struct tcase {
    const char *name;
    int n;
    size_t len[TMAX];
    int role[TMAX];
    bool typed[TMAX];
    int d[5];                 /* the op's sizes */
    float beta;
    /* call the op on be with tensors t (fp32 or bf16 as typed and dt say) */
    void (*call)(fso_backend *be, void **t, fso_dtype dt, const struct tcase *c);
    /* optional: make the fp32 inputs what the op expects (probabilities) */
    void (*init)(float **t, const struct tcase *c);
} tcase;

static int32_t emb_tok[8] = {3, 0, 7, 7, 1, 6, 2, 5};

static void call_mm_fwd(fso_backend *be, void **t, fso_dtype dt, const tcase *c)
{
    be->ops->matmul_fwd(be, t[0], c->typed[0] ? dt : FSO_DT_F32, t[1], t[2], dt, c->d[0],
                        c->d[1], c->d[2]);
}
static void call_mm_bwd(fso_backend *be, void **t, fso_dtype dt, const tcase *c)
{
    be->ops->matmul_bwd(be, t[0], c->typed[0] ? dt : FSO_DT_F32, t[1], t[2],
                        c->typed[2] ? dt : FSO_DT_F32, t[3], t[4], dt, c->d[0], c->d[1], c->d[2],
                        c->beta);
}
static void call_rms_fwd(fso_backend *be, void **t, fso_dtype dt, const tcase *c)
{
    be->ops->rmsnorm_fwd(be, t[0], t[1], t[2], t[3], dt, c->d[0], c->d[1], 1e-5f);
}
static void call_rms_bwd(fso_backend *be, void **t, fso_dtype dt, const tcase *c)
{
    be->ops->rmsnorm_bwd(be, t[0], t[1], t[2], t[3], t[4], dt, t[5], c->d[0], c->d[1]);
}
static void call_emb_fwd(fso_backend *be, void **t, fso_dtype dt, const tcase *c)
{
    be->ops->embedding_fwd(be, t[0], emb_tok, t[1], dt, c->d[0], c->d[1]);
}
static void call_rope(fso_backend *be, void **t, fso_dtype dt, const tcase *c)
{
    be->ops->rope(be, t[0], dt, t[1], t[2], NULL, c->d[0], c->d[1], c->d[2], c->d[3], c->d[4]);
}
static void call_att_fwd(fso_backend *be, void **t, fso_dtype dt, const tcase *c)
{
    be->ops->attention_fwd(be, t[0], t[1], t[2], t[3], t[4], NULL, dt, c->d[0], c->d[1], c->d[2],
                           c->d[3], c->d[4]);
}
static void call_att_bwd(fso_backend *be, void **t, fso_dtype dt, const tcase *c)
{
    be->ops->attention_bwd(be, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], NULL, dt, c->d[0],
                           c->d[1], c->d[2], c->d[3], c->d[4]);
}
static void call_swiglu_fwd(fso_backend *be, void **t, fso_dtype dt, const tcase *c)
{
    be->ops->swiglu_fwd(be, t[0], t[1], t[2], dt, (size_t)c->d[0]);
}
static void call_swiglu_bwd(fso_backend *be, void **t, fso_dtype dt, const tcase *c)
{
    be->ops->swiglu_bwd(be, t[0], t[1], t[2], t[3], t[4], dt, (size_t)c->d[0]);
}
static void call_bias_add(fso_backend *be, void **t, fso_dtype dt, const tcase *c)
{
    be->ops->bias_add(be, t[0], t[1], dt, c->d[0], c->d[1]);
}
static void call_bias_bwd(fso_backend *be, void **t, fso_dtype dt, const tcase *c)
{
    be->ops->bias_bwd(be, t[0], t[1], dt, c->d[0], c->d[1]);
}
/* attention_bwd reads the probabilities of q, k, v (tensors 5..7 -> 4) */
static void init_probs(float **t, const tcase *c)
{
    size_t nq = (size_t)c->d[0] * c->d[1] * c->d[2] * c->d[4];
    float *out = gbuf(nq);
    ref->ops->attention_fwd(ref, out, t[4], t[5], t[6], t[7], NULL, FSO_DT_F32, c->d[0], c->d[1],
                            c->d[2], c->d[3], c->d[4]);
    gfree(out);
}
/* rope's tables */
static void init_rope(float **t, const tcase *c)
{
    fso_rope_tables(t[1], t[2], c->d[1], c->d[3], 10000.0);
}

/* A bf16 buffer of n elements with GUARD sentinels on both sides. */
static const uint16_t guard_bf16 = 0x7f7fu;
static uint16_t *gbuf16(size_t n)
{
    uint16_t *p = malloc(sizeof(uint16_t) * (n + 2 * GUARD));
    assert_non_null(p);
    guard_fill_es(p, n, sizeof *p, &guard_bf16);
    return p + GUARD;
}

/* Run case c on be with dt bf16 against the cpu-ref backend in fp32 on the
 * same (bf16-exact) values: each [dt] output must be the fp32 result
 * rounded once (exactly for cpu-ref, within tol for the others: they differ
 * from cpu-ref in fp32 rounding, which may move a value across a bf16
 * rounding boundary), each fp32 output the fp32 result. */
static void run_typed(fso_backend *be, const tcase *c, double tol)
{
    float *f[TMAX], *want[TMAX];
    void *t[TMAX], *r[TMAX];
    for (int i = 0; i < c->n; i++) {
        f[i] = randbuf(c->len[i], c->role[i] == T_OUT ? 0 : 1);
        if (c->role[i] == T_OUT)
            for (size_t e = 0; e < c->len[i]; e++)
                f[i][e] = NAN; /* outputs are written, not read */
    }
    if (c->init)
        c->init(f, c);
    for (int i = 0; i < c->n; i++) {
        if (c->typed[i]) /* the values as bf16 holds them */
            for (size_t e = 0; e < c->len[i]; e++)
                f[i][e] = fso_f32_from_bf16(fso_bf16_from_f32(f[i][e]));
        want[i] = copybuf(f[i], c->len[i]);
        r[i] = want[i];
        if (c->typed[i]) {
            uint16_t *h = gbuf16(c->len[i]);
            for (size_t e = 0; e < c->len[i]; e++)
                h[e] = fso_bf16_from_f32(f[i][e]);
            t[i] = h;
        } else {
            t[i] = copybuf(f[i], c->len[i]);
        }
    }
    c->call(ref, r, FSO_DT_F32, c);
    c->call(be, t, FSO_DT_BF16, c);
    assert_int_equal(be->ops->sync(be), 0);
    for (int i = 0; i < c->n; i++) {
        char what[96];
        snprintf(what, sizeof what, "%s (%s) tensor %d", c->name, be->ops->name, i);
        if (c->role[i] == T_IN) {
            /* inputs are left as they were */
            if (c->typed[i]) {
                for (size_t e = 0; e < c->len[i]; e++)
                    if (((uint16_t *)t[i])[e] != fso_bf16_from_f32(f[i][e]))
                        fail_msg("%s: input element %zu changed", what, e);
            } else if (memcmp(t[i], f[i], sizeof(float) * c->len[i]) != 0) {
                fail_msg("%s: input changed", what);
            }
        } else if (c->typed[i]) {
            const uint16_t *h = t[i];
            float *got = gbuf(c->len[i]), *exp = gbuf(c->len[i]);
            for (size_t e = 0; e < c->len[i]; e++) {
                got[e] = fso_f32_from_bf16(h[e]);
                exp[e] = fso_f32_from_bf16(fso_bf16_from_f32(want[i][e]));
                if (tol == 0 && h[e] != fso_bf16_from_f32(want[i][e]))
                    fail_msg("%s[%zu]: 0x%04x, want 0x%04x (fp32 %.8g rounded once)", what, e,
                             h[e], fso_bf16_from_f32(want[i][e]), want[i][e]);
            }
            compare_guarded(what, got, exp, c->len[i], tol);
            guard_check_es(h, c->len[i], sizeof *h, &guard_bf16, what);
            gfree(got);
            gfree(exp);
        } else {
            compare_guarded(what, t[i], want[i], c->len[i], tol == 0 ? 0 : FAST_TOL);
        }
    }
    for (int i = 0; i < c->n; i++) {
        gfree(f[i]);
        gfree(want[i]);
        if (c->typed[i])
            free((uint16_t *)t[i] - GUARD);
        else
            gfree(t[i]);
    }
}

static void test_bf16_tensors_round_once(void **state)
{
    (void)state;
    enum { N = 13, Ci = 24, Co = 17, B = 2, T = 7, H = 4, Hkv = 2, D = 8, V = 8, F = 45 };
    const size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * Hkv * D;
    const size_t np = (size_t)B * H * T * T, half = (size_t)T * D / 2;
    const tcase cases[] = {
        {"matmul_fwd, bf16 out", 3, {N * Co, N * Ci, Co * Ci}, {T_OUT, T_IN, T_IN},
         {true, true, true}, {N, Ci, Co}, 0, call_mm_fwd, NULL},
        {"matmul_fwd, fp32 out", 3, {N * Co, N * Ci, Co * Ci}, {T_OUT, T_IN, T_IN},
         {false, true, true}, {N, Ci, Co}, 0, call_mm_fwd, NULL},
        {"matmul_bwd, bf16 dx, fp32 dout", 5, {N * Ci, Co * Ci, N * Co, N * Ci, Co * Ci},
         {T_OUT, T_INOUT, T_IN, T_IN, T_IN}, {true, false, false, true, true}, {N, Ci, Co}, 0,
         call_mm_bwd, NULL},
        {"matmul_bwd, fp32 dx accumulated, bf16 dout", 5,
         {N * Ci, Co * Ci, N * Co, N * Ci, Co * Ci}, {T_INOUT, T_INOUT, T_IN, T_IN, T_IN},
         {false, false, true, true, true}, {N, Ci, Co}, 1.0f, call_mm_bwd, NULL},
        {"matmul_bwd, bf16 dx accumulated", 5, {N * Ci, Co * Ci, N * Co, N * Ci, Co * Ci},
         {T_INOUT, T_INOUT, T_IN, T_IN, T_IN}, {true, false, true, true, true}, {N, Ci, Co},
         0.5f, call_mm_bwd, NULL},
        {"rmsnorm_fwd", 4, {N * Ci, N, N * Ci, Ci}, {T_OUT, T_OUT, T_IN, T_IN},
         {true, false, false, true}, {N, Ci}, 0, call_rms_fwd, NULL},
        {"rmsnorm_bwd", 6, {N * Ci, Ci, N * Ci, N * Ci, Ci, N},
         {T_INOUT, T_INOUT, T_IN, T_IN, T_IN, T_IN}, {false, false, false, false, true, false},
         {N, Ci}, 0, call_rms_bwd, NULL},
        {"embedding_fwd", 2, {8 * Ci, V * Ci}, {T_OUT, T_IN}, {false, true}, {8, Ci}, 0,
         call_emb_fwd, NULL},
        {"rope", 3, {nq, half, half}, {T_INOUT, T_IN, T_IN}, {true, false, false},
         {B, T, H, D, 0}, 0, call_rope, init_rope},
        {"rope inverse", 3, {nq, half, half}, {T_INOUT, T_IN, T_IN}, {true, false, false},
         {B, T, H, D, 1}, 0, call_rope, init_rope},
        {"attention_fwd", 5, {nq, np, nq, nk, nk}, {T_OUT, T_OUT, T_IN, T_IN, T_IN},
         {true, true, true, true, true}, {B, T, H, Hkv, D}, 0, call_att_fwd, NULL},
        {"attention_bwd", 8, {nq, nk, nk, nq, np, nq, nk, nk},
         {T_OUT, T_OUT, T_OUT, T_IN, T_IN, T_IN, T_IN, T_IN},
         {true, true, true, true, true, true, true, true}, {B, T, H, Hkv, D}, 0, call_att_bwd,
         init_probs},
        {"swiglu_fwd", 3, {N * F, N * F, N * F}, {T_OUT, T_IN, T_IN}, {true, true, true},
         {N * F}, 0, call_swiglu_fwd, NULL},
        {"swiglu_bwd", 5, {N * F, N * F, N * F, N * F, N * F},
         {T_OUT, T_OUT, T_IN, T_IN, T_IN}, {true, true, true, true, true}, {N * F}, 0,
         call_swiglu_bwd, NULL},
        {"bias_add", 2, {N * Co, Co}, {T_INOUT, T_IN}, {true, true}, {N, Co}, 0, call_bias_add,
         NULL},
        {"bias_bwd", 2, {Co, N * Co}, {T_INOUT, T_IN}, {false, true}, {N, Co}, 0, call_bias_bwd,
         NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        run_typed(ref, &cases[i], 0);
        run_typed(fast, &cases[i], 4e-3);
    }
}

/* The registry: each row found by its name and by its kind; a name fsoff
 * does not know is no row; each CPU row creates its device with the
 * number, threads and cap asked for. */
static void test_backend_registry(void **state)
{
    (void)state;
    assert_null(fso_backend_find("tpu"));
    assert_null(fso_backend_find("CPU"));
    assert_ptr_equal(fso_backend_find(""), fso_backend_row_of(FSO_BACKEND_CPU));
    for (int k = 0; k < FSO_N_BACKENDS; k++) {
        const fso_backend_row *row = fso_backend_row_of(k);
        assert_int_equal(row->kind, k);
        assert_ptr_equal(fso_backend_find(row->name), row);
        fso_backend *be = NULL;
        char err[200] = "";
        if (row->gpu) { /* test_cuda and test_cuda_loader open GPUs */
            if (!FSO_HAVE_CUDA) {
                assert_int_equal(fso_backend_create(&be, k, 0, 0, 0, err, sizeof err), -ENOTSUP);
                assert_null(be);
                assert_non_null(strstr(err, "built without CUDA"));
            }
            continue;
        }
        assert_int_equal(fso_backend_create(&be, k, 3, 2, 1 << 20, err, sizeof err), 0);
        assert_int_equal(be->device, 3);
        assert_int_equal(be->mem_cap_bytes, 1 << 20);
        assert_int_equal(be->threads, k == FSO_BACKEND_CPU_REF ? 1 : 2);
        assert_int_equal(be->ops->host_addressable, row->host_addressable);
        fso_backend_destroy(be);
    }
}

static int setup(void **state)
{
    (void)state;
    fso_rng_seed(&rng, 42);
    if (fso_backend_create(&ref, FSO_BACKEND_CPU_REF, 0, 1, 0, NULL, 0) < 0 || fso_backend_create(&fast, FSO_BACKEND_CPU, 0, 2, 0, NULL, 0) < 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fso_backend_destroy(ref);
    fso_backend_destroy(fast);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_buffers_are_page_aligned_zeroed_and_counted),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_bits_do_not_depend_on_threads_or_devices),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention_gqa),
        cmocka_unit_test(test_attention_mha),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_bias),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_attention_and_rope_keep_documents_apart),
        cmocka_unit_test(test_cross_entropy_skips_negative_targets),
        cmocka_unit_test(test_sqnorm_is_exact_and_thread_independent),
        cmocka_unit_test(test_sqnorm_and_sum_take_the_one_order),
        cmocka_unit_test(test_reduce_sqnorm_is_sum_then_sqnorm),
        cmocka_unit_test(test_sum_is_exact_in_double),
        cmocka_unit_test(test_async_device_keeps_a_gpus_rules),
        cmocka_unit_test(test_async_stale_marks_are_counted_and_still_right),
        cmocka_unit_test(test_cast_bf16_f32_is_exact),
        cmocka_unit_test(test_cast_f32_bf16_rounds_to_nearest_even),
        cmocka_unit_test(test_reduce_scatter_bf16_sums_in_fp32_in_rank_order),
        cmocka_unit_test(test_bf16_tensors_round_once),
        cmocka_unit_test(test_backend_registry),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
