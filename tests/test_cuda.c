/* test_cuda.c — the CUDA backend op by op against the CPU reference, NCCL
 * collectives against the thread implementation, pinned host memory.
 *
 * Every op runs on the reference and on the CUDA backend from the same
 * random inputs, in both matmul maths: fp32 (normalized error 1e-5) and
 * bf16 tensor cores (2e-2 for the ops built on matmuls; the others compute
 * in fp32 either way and keep 1e-5). Outputs live in device buffers with
 * sentinel guard regions on both sides, checked after each op; results are
 * checked for NaN/Inf (except the bf16 cast, which must keep them: it is
 * compared bit for bit). The typed ops run again with bf16 storage (dt =
 * FSO_DT_BF16) against the reference's bf16 path on the same bf16 inputs,
 * with bf16 guard regions and the tolerances declared with them. Without a
 * CUDA device (or in a build without
 * CUDA) the program prints why and exits 77 (skipped) before CMocka starts.
 * NCCL rails across boxes (boxes as threads, one device each) give exact
 * results, and a box that stalls or never joins ends in a bounded error.
 * Last, a few training steps end to end on the GPUs against the CPU
 * backend, at several placements, within declared tolerances, with no mark
 * used after it left the backend's window, and shut down cleanly.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
#include "coll.h"
#include "config/config.h"
#include "cuda/cuda_backend.h"
#include "data.h"
#include "fso_build.h"
#include "adamw.h"
#include "gpu_info.h"
#include "rng.h"
#include "test_util.h"
#include "train.h"
#include "util.h"
#include "zero/zero.h"

/* The peak table is plain C: checked in every build, GPU or not. */
static int peak_table_ok(void)
{
    static const struct {
        const char *name;
        double want;
    } cases[] = {
        {"NVIDIA A100-SXM4-80GB", 312}, {"NVIDIA A100 80GB PCIe", 312},
        {"NVIDIA H100 80GB HBM3", 989}, {"NVIDIA H100 PCIe", 756},
        {"NVIDIA H100 NVL", 835},       {"NVIDIA H200", 989},
        {"NVIDIA L40S", 362},           {"NVIDIA L4", 121},
        {"NVIDIA GeForce RTX 4090", 165.2}, {"NVIDIA A10G", 0},
        {"NVIDIA GeForce RTX 4090 D", 0}, {"Tesla V100-SXM2-16GB", 0},
        {"", 0},
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double got = fso_gpu_bf16_peak_tflops(cases[i].name);
        if (fabs(got - cases[i].want) > 1e-9) {
            fprintf(stderr, "peak table: \"%s\": got %g TFLOP/s, want %g\n", cases[i].name, got,
                    cases[i].want);
            ok = 0;
        }
    }
    return ok && fso_gpu_bf16_peak_tflops(NULL) == 0;
}

#if FSO_HAVE_CUDA

#define TOL_FP32 1e-5
#define TOL_BF16 2e-2

static fso_backend *ref;
static fso_backend *cu[2]; /* [0] fp32 math, [1] bf16 math */
static const char *const math_name[2] = {"fp32", "bf16"};
static fso_rng rng;

/* ---------------------------------------------------------------- host buffers */

static float *hbuf(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    assert_non_null(p);
    return p;
}

static float *hrand(size_t n, double scale)
{
    float *p = hbuf(n);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(scale * fso_rng_normal(&rng));
    return p;
}

static float *hcopy(const float *src, size_t n)
{
    float *p = hbuf(n);
    memcpy(p, src, sizeof(float) * n);
    return p;
}

/* ---------------------------------------------------------------- device buffers */

/* n elements of es bytes on the device between two sentinel regions of
 * GUARD elements, each `guard`. */
static void *dnew_es(fso_backend *be, size_t n, size_t es, const void *guard)
{
    void *base = NULL;
    assert_int_equal(be->ops->buf_alloc(be, es * (n + 2 * GUARD), &base), 0);
    char *fill = malloc(es * (n + 2 * GUARD));
    assert_non_null(fill);
    guard_fill_es(fill, n, es, guard);
    be->ops->copy_h2d(be, base, fill, es * (n + 2 * GUARD));
    assert_int_equal(be->ops->sync(be), 0);
    free(fill);
    return (char *)base + es * GUARD;
}

static void dfree_es(fso_backend *be, const void *d, size_t es)
{
    if (d)
        be->ops->buf_free(be, (char *)d - es * GUARD);
}

/* Copy n elements of es bytes back (after everything queued), check the
 * guards and return the elements (host, malloc'd). */
static void *dget_es(fso_backend *be, const void *d, size_t n, size_t es, const void *guard,
                     const char *what)
{
    char *h = malloc(es * (n + 2 * GUARD));
    assert_non_null(h);
    be->ops->copy_d2h(be, h, (const char *)d - es * GUARD, es * (n + 2 * GUARD));
    int rc = be->ops->sync(be);
    if (rc != 0)
        fail_msg("%s: sync failed: %s", what, be->err);
    guard_check_es(h + es * GUARD, n, es, guard, what);
    memmove(h, h + es * GUARD, es * n);
    return h;
}

static const float guard_f32 = GUARD_VAL;

/* n floats on the device between two GUARD-float sentinel regions. */
static float *dnew(fso_backend *be, size_t n)
{
    return dnew_es(be, n, sizeof(float), &guard_f32);
}

static void dfree(fso_backend *be, float *d)
{
    dfree_es(be, d, sizeof(float));
}

static float *dput(fso_backend *be, const float *h, size_t n)
{
    float *d = dnew(be, n);
    be->ops->copy_h2d(be, d, h, sizeof(float) * n);
    return d;
}

static int32_t *dput_i32(fso_backend *be, const int32_t *h, size_t n)
{
    void *d = NULL;
    assert_int_equal(be->ops->buf_alloc(be, sizeof(int32_t) * n, &d), 0);
    be->ops->copy_h2d(be, d, h, sizeof(int32_t) * n);
    return d;
}

/* Copy n floats back (after everything queued) and check the guards. */
static float *dget(fso_backend *be, const float *d, size_t n, const char *what)
{
    return dget_es(be, d, n, sizeof(float), &guard_f32, what);
}

/* compare() (test_util.h), the math named in its messages. */
static void compare_math(const char *what, int m, const float *got, const float *want, size_t n,
                         double tol)
{
    char label[256];
    snprintf(label, sizeof label, "%s (%s)", what, math_name[m]);
    compare(label, got, want, n, tol);
}

/* Device result against a host reference; frees the copy. */
static void check(fso_backend *be, int m, const char *what, const float *d, const float *want,
                  size_t n, double tol)
{
    float *got = dget(be, d, n, what);
    compare_math(what, m, got, want, n, tol);
    free(got);
}

static double mm_tol(int m)
{
    return m == 0 ? TOL_FP32 : TOL_BF16;
}

/* ---------------------------------------------------------------- bf16 buffers */

/* The typed ops with dt = FSO_DT_BF16 run on the reference and on the CUDA
 * backend from the same bf16 inputs. Declared tolerances (normalized
 * error), besides TOL_FP32 for fp32 results of identical operands:
 *   TOL_BF16_STORE: a bf16 output both compute in fp32 from the same
 *     values and round once. They differ only where fp32 rounding noise
 *     crosses a rounding boundary (rare); truncating instead of rounding
 *     to nearest would give about 4e-3, rounding a group's partial sums
 *     (attention's dk, dv) about 2e-3.
 *   TOL_BF16_OPERAND: the CUDA backend's products round an fp32 operand
 *     to bf16 (an fp32 dout, attention's probabilities and dS; backend.h),
 *     half an ulp of bf16 (2^-9) per element at most. */
#define GUARD16 0x4640u  /* bf16 sentinel (12288) */
#define TOL_BF16_STORE 1e-3
#define TOL_BF16_OPERAND 1e-2
/* fp32 results of the same bf16 operands: fp32 sums on the tensor cores
 * against the reference's (operand rounding would show as 1e-3) */
#define TOL_BF16_SUM 1e-4

/* Host bf16 from fp32 and back, by the reference's casts (host memory). */
static uint16_t *hround(const float *src, size_t n)
{
    uint16_t *p = calloc(n ? n : 1, sizeof(uint16_t));
    assert_non_null(p);
    ref->ops->cast_f32_bf16(ref, p, src, n);
    return p;
}

static float *hwiden(const uint16_t *src, size_t n)
{
    float *p = hbuf(n);
    ref->ops->cast_bf16_f32(ref, p, src, n);
    return p;
}

static uint16_t *hrand16(size_t n, double scale)
{
    float *f = hrand(n, scale);
    uint16_t *p = hround(f, n);
    free(f);
    return p;
}

static uint16_t *hbuf16(size_t n)
{
    uint16_t *p = calloc(n ? n : 1, sizeof(uint16_t));
    assert_non_null(p);
    return p;
}

static const uint16_t guard_bf16 = GUARD16;

/* n bf16 values on the device between two GUARD-element sentinel regions. */
static uint16_t *dnew16(fso_backend *be, size_t n)
{
    return dnew_es(be, n, sizeof(uint16_t), &guard_bf16);
}

static void dfree16(fso_backend *be, uint16_t *d)
{
    dfree_es(be, d, sizeof(uint16_t));
}

static uint16_t *dput16(fso_backend *be, const uint16_t *h, size_t n)
{
    uint16_t *d = dnew16(be, n);
    be->ops->copy_h2d(be, d, h, sizeof(uint16_t) * n);
    return d;
}

/* Copy n bf16 values back (after everything queued), check the guards and
 * return them widened. */
static float *dget16(fso_backend *be, const uint16_t *d, size_t n, const char *what)
{
    uint16_t *h = dget_es(be, d, n, sizeof(uint16_t), &guard_bf16, what);
    float *f = hwiden(h, n);
    free(h);
    return f;
}

/* A bf16 device result against the reference's bf16 host result. */
static void check16(fso_backend *be, int m, const char *what, const uint16_t *d,
                    const uint16_t *want, size_t n, double tol)
{
    float *got = dget16(be, d, n, what), *w = hwiden(want, n);
    compare_math(what, m, got, w, n, tol);
    free(got);
    free(w);
}

/* ---------------------------------------------------------------- matmul */

static void run_matmul(int m, int N, int Ci, int Co)
{
    fso_backend *be = cu[m];
    float *x = hrand((size_t)N * Ci, 1), *w = hrand((size_t)Co * Ci, 0.3);
    float *R = hrand((size_t)N * Co, 1), *o = hbuf((size_t)N * Co);
    float *dx0 = hrand((size_t)N * Ci, 1), *dw0 = hrand((size_t)Co * Ci, 1);
    float *dx = hcopy(dx0, (size_t)N * Ci), *dw = hcopy(dw0, (size_t)Co * Ci);
    float *dx_d = dput(be, x, (size_t)N * Ci), *dw_d = dput(be, w, (size_t)Co * Ci);
    float *dR = dput(be, R, (size_t)N * Co), *dout = dnew(be, (size_t)N * Co);
    float *ddx = dput(be, dx0, (size_t)N * Ci), *ddw = dput(be, dw0, (size_t)Co * Ci);

    ref->ops->matmul_fwd(ref, o, FSO_DT_F32, x, w, FSO_DT_F32, N, Ci, Co);
    be->ops->matmul_fwd(be, dout, FSO_DT_F32, dx_d, dw_d, FSO_DT_F32, N, Ci, Co);
    check(be, m, "matmul_fwd out", dout, o, (size_t)N * Co, mm_tol(m));

    ref->ops->matmul_bwd(ref, dx, FSO_DT_F32, dw, R, FSO_DT_F32, x, w, FSO_DT_F32, N, Ci, Co, 1.0f);
    be->ops->matmul_bwd(be, ddx, FSO_DT_F32, ddw, dR, FSO_DT_F32, dx_d, dw_d, FSO_DT_F32, N, Ci,
                        Co, 1.0f);
    check(be, m, "matmul_bwd dx (accumulate)", ddx, dx, (size_t)N * Ci, mm_tol(m));
    check(be, m, "matmul_bwd dw", ddw, dw, (size_t)Co * Ci, mm_tol(m));

    /* dx NULL: only dw, accumulated again */
    ref->ops->matmul_bwd(ref, NULL, FSO_DT_F32, dw, R, FSO_DT_F32, x, w, FSO_DT_F32, N, Ci, Co,
                         0.0f);
    be->ops->matmul_bwd(be, NULL, FSO_DT_F32, ddw, dR, FSO_DT_F32, dx_d, dw_d, FSO_DT_F32, N, Ci,
                        Co, 0.0f);
    check(be, m, "matmul_bwd dw (dx NULL)", ddw, dw, (size_t)Co * Ci, mm_tol(m));
    /* beta 0 overwrites dx, even holding NaN */
    float *nan = hbuf((size_t)N * Ci);
    for (size_t i = 0; i < (size_t)N * Ci; i++)
        nan[i] = NAN;
    be->ops->copy_h2d(be, ddx, nan, sizeof(float) * (size_t)N * Ci);
    memset(dx, 0, sizeof(float) * (size_t)N * Ci);
    ref->ops->matmul_bwd(ref, dx, FSO_DT_F32, dw, R, FSO_DT_F32, x, w, FSO_DT_F32, N, Ci, Co, 0.0f);
    be->ops->matmul_bwd(be, ddx, FSO_DT_F32, ddw, dR, FSO_DT_F32, dx_d, dw_d, FSO_DT_F32, N, Ci,
                        Co, 0.0f);
    check(be, m, "matmul_bwd dx (overwrite)", ddx, dx, (size_t)N * Ci, mm_tol(m));

    float *h[] = {x, w, R, o, dx0, dw0, dx, dw, nan};
    for (size_t i = 0; i < sizeof h / sizeof *h; i++)
        free(h[i]);
    float *d[] = {dx_d, dw_d, dR, dout, ddx, ddw};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        dfree(be, d[i]);
}

static void test_matmul_matches_reference(void **state)
{
    (void)state;
    for (int m = 0; m < 2; m++) {
        run_matmul(m, 37, 45, 29);
        run_matmul(m, 130, 256, 96);
    }
}

/* ---------------------------------------------------------------- rmsnorm */

static void run_rmsnorm(int m, int N, int C, double dw_tol)
{
    fso_backend *be = cu[m];
    size_t n = (size_t)N * C;
    float *x = hrand(n, 1.5), *w = hrand((size_t)C, 1), *R = hrand(n, 1);
    float *o = hbuf(n), *r = hbuf((size_t)N), *dx = hrand(n, 1), *dw = hrand((size_t)C, 1);
    float *d_x = dput(be, x, n), *d_w = dput(be, w, (size_t)C), *d_R = dput(be, R, n);
    float *d_o = dnew(be, n), *d_r = dnew(be, (size_t)N);
    float *d_dx = dput(be, dx, n), *d_dw = dput(be, dw, (size_t)C);

    ref->ops->rmsnorm_fwd(ref, o, r, x, w, FSO_DT_F32, N, C, 1e-5f);
    be->ops->rmsnorm_fwd(be, d_o, d_r, d_x, d_w, FSO_DT_F32, N, C, 1e-5f);
    check(be, m, "rmsnorm_fwd out", d_o, o, n, TOL_FP32);
    check(be, m, "rmsnorm_fwd rstd", d_r, r, (size_t)N, TOL_FP32);

    ref->ops->rmsnorm_bwd(ref, dx, dw, R, x, w, FSO_DT_F32, r, N, C);
    be->ops->rmsnorm_bwd(be, d_dx, d_dw, d_R, d_x, d_w, FSO_DT_F32, d_r, N, C);
    check(be, m, "rmsnorm_bwd dx (accumulate)", d_dx, dx, n, TOL_FP32);
    check(be, m, "rmsnorm_bwd dw (accumulate)", d_dw, dw, (size_t)C, dw_tol);

    float *h[] = {x, w, R, o, r, dx, dw};
    for (size_t i = 0; i < sizeof h / sizeof *h; i++)
        free(h[i]);
    float *d[] = {d_x, d_w, d_R, d_o, d_r, d_dx, d_dw};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        dfree(be, d[i]);
}

static void test_rmsnorm_matches_reference(void **state)
{
    (void)state;
    for (int m = 0; m < 2; m++) {
        run_rmsnorm(m, 19, 70, TOL_FP32);
        run_rmsnorm(m, 150, 1000, TOL_FP32); /* several row chunks for dw, many threads per row */
    }
    /* 8.4M rows: dw's 131070 row chunks are twice what one grid.y holds.
     * The reference sums the rows one by one in fp32, so dw agrees to about
     * 1e-4 only; rows left out would miss by far more. */
    run_rmsnorm(0, 2 * 65535 * 64, 2, 2e-3);
}

/* ---------------------------------------------------------------- embedding */

static void run_embedding(int m, int N, int C, int V)
{
    fso_backend *be = cu[m];
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)N);
    assert_non_null(tok);
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)(fso_rng_u64(&rng) % (uint64_t)V);
    tok[3 % N] = tok[7 % N] = tok[11 % N] = V - 1; /* repeated ids accumulate */
    size_t n = (size_t)N * C, nv = (size_t)V * C;
    float *wte = hrand(nv, 1), *o = hbuf(n), *dout = hrand(n, 1), *dw = hrand(nv, 1);
    int32_t *d_tok = dput_i32(be, tok, (size_t)N);
    float *d_wte = dput(be, wte, nv), *d_o = dnew(be, n), *d_dout = dput(be, dout, n);
    float *d_dw = dput(be, dw, nv);

    ref->ops->embedding_fwd(ref, o, tok, wte, FSO_DT_F32, N, C);
    be->ops->embedding_fwd(be, d_o, d_tok, d_wte, FSO_DT_F32, N, C);
    check(be, m, "embedding_fwd", d_o, o, n, 0);
    /* rows added in order: the same bits as the reference */
    ref->ops->embedding_bwd(ref, dw, tok, dout, N, C);
    be->ops->embedding_bwd(be, d_dw, d_tok, d_dout, N, C);
    check(be, m, "embedding_bwd", d_dw, dw, nv, 0);

    free(tok);
    float *h[] = {wte, o, dout, dw};
    for (size_t i = 0; i < sizeof h / sizeof *h; i++)
        free(h[i]);
    be->ops->buf_free(be, d_tok);
    float *d[] = {d_wte, d_o, d_dout, d_dw};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        dfree(be, d[i]);
}

static void test_embedding_matches_reference_bit_for_bit(void **state)
{
    (void)state;
    for (int m = 0; m < 2; m++) {
        run_embedding(m, 50, 130, 17);
        run_embedding(m, 300, 200, 1000); /* more ids than the kernel's groups */
    }
}

/* ---------------------------------------------------------------- rope */

/* Positions of B rows of T with a document starting every `every` tokens
 * from row b's offset 3b (the positions the data layer gives, data.h). */
static int32_t *doc_positions(int B, int T, int every)
{
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)B * T);
    assert_non_null(pos);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            pos[b * T + t] = t == 0 || (t + 3 * b) % every == 0 ? 0 : pos[b * T + t - 1] + 1;
    return pos;
}


static void test_rope_matches_reference(void **state)
{
    (void)state;
    const int B = 2, T = 11, nh = 3, D = 10;
    const size_t n = (size_t)B * T * nh * D, nt = (size_t)T * D / 2;
    float *cs = hbuf(nt), *sn = hbuf(nt);
    fso_rope_tables(cs, sn, T, D, 10000.0);
    for (int m = 0; m < 2; m++) {
        fso_backend *be = cu[m];
        float *x = hrand(n, 1), *a = hcopy(x, n);
        float *d_x = dput(be, x, n), *d_cs = dput(be, cs, nt), *d_sn = dput(be, sn, nt);
        ref->ops->rope(ref, a, FSO_DT_F32, cs, sn, NULL, B, T, nh, D, 0);
        be->ops->rope(be, d_x, FSO_DT_F32, d_cs, d_sn, NULL, B, T, nh, D, 0);
        check(be, m, "rope", d_x, a, n, TOL_FP32);
        be->ops->rope(be, d_x, FSO_DT_F32, d_cs, d_sn, NULL, B, T, nh, D, 1);
        check(be, m, "rope inverse", d_x, x, n, 1e-6);
        /* each token at its position in its document */
        int32_t *pos = doc_positions(B, T, 4), *d_pos = dput_i32(be, pos, (size_t)B * T);
        memcpy(a, x, sizeof(float) * n);
        ref->ops->rope(ref, a, FSO_DT_F32, cs, sn, pos, B, T, nh, D, 0);
        be->ops->rope(be, d_x, FSO_DT_F32, d_cs, d_sn, d_pos, B, T, nh, D, 0);
        check(be, m, "rope with positions", d_x, a, n, TOL_FP32);
        free(pos);
        be->ops->buf_free(be, d_pos);
        free(x);
        free(a);
        dfree(be, d_x);
        dfree(be, d_cs);
        dfree(be, d_sn);
    }
    free(cs);
    free(sn);
}

/* ---------------------------------------------------------------- attention */

/* pos: documents in the rows (host), or NULL. */
static void run_attention(int m, int B, int T, int H, int Hkv, int D, const int32_t *pos)
{
    fso_backend *be = cu[m];
    int32_t *d_pos = pos ? dput_i32(be, pos, (size_t)B * T) : NULL;
    size_t nq = (size_t)B * T * H * D, nkv = (size_t)B * T * Hkv * D, np = (size_t)B * H * T * T;
    float *q = hrand(nq, 1), *k = hrand(nkv, 1), *v = hrand(nkv, 1), *R = hrand(nq, 1);
    float *o = hbuf(nq), *p = hbuf(np), *dq = hbuf(nq), *dk = hbuf(nkv), *dv = hbuf(nkv);
    float *d_q = dput(be, q, nq), *d_k = dput(be, k, nkv), *d_v = dput(be, v, nkv);
    float *d_R = dput(be, R, nq), *d_o = dnew(be, nq), *d_p = dnew(be, np);
    float *d_dq = dnew(be, nq), *d_dk = dnew(be, nkv), *d_dv = dnew(be, nkv);

    ref->ops->attention_fwd(ref, o, p, q, k, v, pos, FSO_DT_F32, B, T, H, Hkv, D);
    be->ops->attention_fwd(be, d_o, d_p, d_q, d_k, d_v, d_pos, FSO_DT_F32, B, T, H, Hkv, D);
    check(be, m, "attention_fwd out", d_o, o, nq, mm_tol(m));
    float *got_p = dget(be, d_p, np, "attention_fwd probs");
    compare_math("attention_fwd probs", m, got_p, p, np, mm_tol(m));
    for (int bh = 0; bh < B * H; bh++) /* causal: exact zeros past the diagonal */
        for (int t = 0; t < T; t++)   /* and before the document's start */
            for (int s = 0; s < T; s++)
                if (s > t || (pos && s < t - pos[(bh / H) * T + t]))
                    assert_true(got_p[((size_t)bh * T + t) * T + s] == 0.0f);
    free(got_p);

    /* backward from the reference's probabilities, so both see the same P */
    be->ops->copy_h2d(be, d_p, p, sizeof(float) * np);
    ref->ops->attention_bwd(ref, dq, dk, dv, R, p, q, k, v, pos, FSO_DT_F32, B, T, H, Hkv, D);
    be->ops->attention_bwd(be, d_dq, d_dk, d_dv, d_R, d_p, d_q, d_k, d_v, d_pos, FSO_DT_F32, B, T,
                           H, Hkv, D);
    check(be, m, "attention_bwd dq", d_dq, dq, nq, mm_tol(m));
    check(be, m, "attention_bwd dk", d_dk, dk, nkv, mm_tol(m));
    check(be, m, "attention_bwd dv", d_dv, dv, nkv, mm_tol(m));

    float *h[] = {q, k, v, R, o, p, dq, dk, dv};
    for (size_t i = 0; i < sizeof h / sizeof *h; i++)
        free(h[i]);
    float *d[] = {d_q, d_k, d_v, d_R, d_o, d_p, d_dq, d_dk, d_dv};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        dfree(be, d[i]);
    if (d_pos)
        be->ops->buf_free(be, d_pos);
}

static void test_attention_gqa_matches_reference(void **state)
{
    (void)state;
    for (int m = 0; m < 2; m++) {
        run_attention(m, 2, 13, 6, 2, 8, NULL); /* 3 query heads per kv head */
        run_attention(m, 2, 70, 8, 2, 16, NULL); /* rows longer than a warp */
    }
}

static void test_attention_mha_matches_reference(void **state)
{
    (void)state;
    for (int m = 0; m < 2; m++)
        run_attention(m, 1, 9, 4, 4, 6, NULL);
}

/* Documents packed in the rows: block-diagonal causal attention. */
static void test_attention_with_documents_matches_reference(void **state)
{
    (void)state;
    int32_t *p13 = doc_positions(2, 13, 5), *p70 = doc_positions(2, 70, 23);
    for (int m = 0; m < 2; m++) {
        run_attention(m, 2, 13, 6, 2, 8, p13);
        run_attention(m, 2, 70, 8, 2, 16, p70);
    }
    free(p13);
    free(p70);
}

/* ---------------------------------------------------------------- swiglu, add */

static void test_swiglu_and_add_match_reference(void **state)
{
    (void)state;
    const size_t n = 100003;
    for (int m = 0; m < 2; m++) {
        fso_backend *be = cu[m];
        float *g = hrand(n, 2), *u = hrand(n, 1), *R = hrand(n, 1), *o = hbuf(n);
        float *dg = hbuf(n), *du = hbuf(n), *s = hbuf(n);
        float *d_g = dput(be, g, n), *d_u = dput(be, u, n), *d_R = dput(be, R, n);
        float *d_o = dnew(be, n), *d_dg = dnew(be, n), *d_du = dnew(be, n), *d_s = dnew(be, n);
        ref->ops->swiglu_fwd(ref, o, g, u, FSO_DT_F32, n);
        be->ops->swiglu_fwd(be, d_o, d_g, d_u, FSO_DT_F32, n);
        check(be, m, "swiglu_fwd", d_o, o, n, TOL_FP32);
        ref->ops->swiglu_bwd(ref, dg, du, R, g, u, FSO_DT_F32, n);
        be->ops->swiglu_bwd(be, d_dg, d_du, d_R, d_g, d_u, FSO_DT_F32, n);
        check(be, m, "swiglu_bwd dgate", d_dg, dg, n, TOL_FP32);
        check(be, m, "swiglu_bwd dup", d_du, du, n, TOL_FP32);
        ref->ops->add(ref, s, g, u, n);
        be->ops->add(be, d_s, d_g, d_u, n);
        check(be, m, "add", d_s, s, n, 0);
        be->ops->add(be, d_g, d_g, d_u, n); /* out aliases a */
        check(be, m, "add in place", d_g, s, n, 0);
        float *h[] = {g, u, R, o, dg, du, s};
        for (size_t i = 0; i < sizeof h / sizeof *h; i++)
            free(h[i]);
        float *d[] = {d_g, d_u, d_R, d_o, d_dg, d_du, d_s};
        for (size_t i = 0; i < sizeof d / sizeof *d; i++)
            dfree(be, d[i]);
    }
}

/* ---------------------------------------------------------------- bias */

/* A linear bias and its gradient (column sums over more rows than one
 * chunk of partials), fp32 and then bf16 storage, against the reference. */
static void test_bias_matches_reference(void **state)
{
    (void)state;
    const int N = 301, C = 133;
    const size_t nc = (size_t)N * C;
    for (int m = 0; m < 2; m++) {
        fso_backend *be = cu[m];
        float *x = hrand(nc, 1), *b = hrand((size_t)C, 0.5), *db = hrand((size_t)C, 1);
        float *d_x = dput(be, x, nc), *d_b = dput(be, b, (size_t)C);
        float *d_db = dput(be, db, (size_t)C);
        ref->ops->bias_add(ref, x, b, FSO_DT_F32, N, C);
        be->ops->bias_add(be, d_x, d_b, FSO_DT_F32, N, C);
        check(be, m, "bias_add", d_x, x, nc, TOL_FP32);
        ref->ops->bias_bwd(ref, db, x, FSO_DT_F32, N, C);
        be->ops->bias_bwd(be, d_db, d_x, FSO_DT_F32, N, C);
        check(be, m, "bias_bwd (accumulated)", d_db, db, (size_t)C, TOL_FP32);

        uint16_t *x16 = hrand16(nc, 1), *b16 = hrand16((size_t)C, 0.5);
        uint16_t *d_x16 = dput16(be, x16, nc), *d_b16 = dput16(be, b16, (size_t)C);
        be->ops->bias_bwd(be, d_db, d_x16, FSO_DT_BF16, N, C);
        ref->ops->bias_bwd(ref, db, x16, FSO_DT_BF16, N, C);
        check(be, m, "bias_bwd bf16 dout", d_db, db, (size_t)C, TOL_FP32);
        ref->ops->bias_add(ref, x16, b16, FSO_DT_BF16, N, C);
        be->ops->bias_add(be, d_x16, d_b16, FSO_DT_BF16, N, C);
        check16(be, m, "bias_add bf16", d_x16, x16, nc, TOL_BF16_STORE);
        free(x);
        free(b);
        free(db);
        free(x16);
        free(b16);
        dfree(be, d_x);
        dfree(be, d_b);
        dfree(be, d_db);
        dfree16(be, d_x16);
        dfree16(be, d_b16);
    }
}

/* ---------------------------------------------------------------- bf16 storage */

static const uint16_t bf16_nan = 0x7fc0;

/* Fill n bf16 values at d with NaN: an output that must not be read. */
static void dnan16(fso_backend *be, uint16_t *d, size_t n)
{
    uint16_t *h = hbuf16(n);
    for (size_t i = 0; i < n; i++)
        h[i] = bf16_nan;
    be->ops->copy_h2d(be, d, h, sizeof(uint16_t) * n);
    assert_int_equal(be->ops->sync(be), 0);
    free(h);
}

/* bf16 operands with fp32 and bf16 outputs, from an fp32 dout (rounded by
 * the backend: the residual gradient, dlogits) and from a bf16 one; dx
 * accumulated in fp32 or overwritten in bf16 (its old NaNs unread). dx and
 * dw start from the same values on both sides before each backward. */
static void run_matmul_bf16(int m, int N, int Ci, int Co)
{
    fso_backend *be = cu[m];
    const size_t nx = (size_t)N * Ci, nw = (size_t)Co * Ci, no = (size_t)N * Co;
    uint16_t *x = hrand16(nx, 1), *w = hrand16(nw, 0.3), *R16 = hrand16(no, 1);
    float *R = hrand(no, 1), *o = hbuf(no), *dx0 = hrand(nx, 1), *dw0 = hrand(nw, 1);
    float *dx = hbuf(nx), *dw = hbuf(nw);
    uint16_t *o16 = hbuf16(no), *dx16 = hbuf16(nx);
    uint16_t *d_x = dput16(be, x, nx), *d_w = dput16(be, w, nw), *d_R16 = dput16(be, R16, no);
    uint16_t *d_o16 = dnew16(be, no), *d_dx16 = dnew16(be, nx);
    float *d_R = dput(be, R, no), *d_o = dnew(be, no), *d_dx = dnew(be, nx), *d_dw = dnew(be, nw);
#define RESET_GRADS()                                                                          \
    do {                                                                                       \
        memcpy(dx, dx0, sizeof(float) * nx);                                                   \
        memcpy(dw, dw0, sizeof(float) * nw);                                                   \
        be->ops->copy_h2d(be, d_dx, dx0, sizeof(float) * nx);                                  \
        be->ops->copy_h2d(be, d_dw, dw0, sizeof(float) * nw);                                  \
        dnan16(be, d_dx16, nx);                                                                \
    } while (0)

    ref->ops->matmul_fwd(ref, o, FSO_DT_F32, x, w, FSO_DT_BF16, N, Ci, Co);
    be->ops->matmul_fwd(be, d_o, FSO_DT_F32, d_x, d_w, FSO_DT_BF16, N, Ci, Co);
    check(be, m, "matmul_fwd bf16 -> fp32 out", d_o, o, no, TOL_BF16_SUM);
    ref->ops->matmul_fwd(ref, o16, FSO_DT_BF16, x, w, FSO_DT_BF16, N, Ci, Co);
    be->ops->matmul_fwd(be, d_o16, FSO_DT_BF16, d_x, d_w, FSO_DT_BF16, N, Ci, Co);
    check16(be, m, "matmul_fwd bf16 -> bf16 out", d_o16, o16, no, TOL_BF16_STORE);

    /* fp32 dout, fp32 dx accumulated (a residual branch's input gradient) */
    RESET_GRADS();
    ref->ops->matmul_bwd(ref, dx, FSO_DT_F32, dw, R, FSO_DT_F32, x, w, FSO_DT_BF16, N, Ci, Co,
                         1.0f);
    be->ops->matmul_bwd(be, d_dx, FSO_DT_F32, d_dw, d_R, FSO_DT_F32, d_x, d_w, FSO_DT_BF16, N, Ci,
                        Co, 1.0f);
    check(be, m, "matmul_bwd bf16, fp32 dout: dx (accumulate)", d_dx, dx, nx, TOL_BF16_OPERAND);
    check(be, m, "matmul_bwd bf16, fp32 dout: dw", d_dw, dw, nw, TOL_BF16_OPERAND);

    /* fp32 dout, bf16 dx overwritten (down_proj's input gradient) */
    RESET_GRADS();
    ref->ops->matmul_bwd(ref, dx16, FSO_DT_BF16, dw, R, FSO_DT_F32, x, w, FSO_DT_BF16, N, Ci, Co,
                         0.0f);
    be->ops->matmul_bwd(be, d_dx16, FSO_DT_BF16, d_dw, d_R, FSO_DT_F32, d_x, d_w, FSO_DT_BF16, N,
                        Ci, Co, 0.0f);
    check16(be, m, "matmul_bwd bf16, fp32 dout: bf16 dx", d_dx16, dx16, nx, TOL_BF16_OPERAND);
    check(be, m, "matmul_bwd bf16, fp32 dout: dw (bf16 dx)", d_dw, dw, nw, TOL_BF16_OPERAND);

    /* bf16 dout, bf16 dx overwritten */
    RESET_GRADS();
    ref->ops->matmul_bwd(ref, dx16, FSO_DT_BF16, dw, R16, FSO_DT_BF16, x, w, FSO_DT_BF16, N, Ci, Co,
                         0.0f);
    be->ops->matmul_bwd(be, d_dx16, FSO_DT_BF16, d_dw, d_R16, FSO_DT_BF16, d_x, d_w, FSO_DT_BF16, N,
                        Ci, Co, 0.0f);
    check16(be, m, "matmul_bwd bf16, bf16 dout: bf16 dx", d_dx16, dx16, nx, TOL_BF16_STORE);
    check(be, m, "matmul_bwd bf16, bf16 dout: dw", d_dw, dw, nw, TOL_BF16_SUM);

    /* bf16 dout, fp32 dx accumulated; then dx NULL, dw accumulated again */
    RESET_GRADS();
    ref->ops->matmul_bwd(ref, dx, FSO_DT_F32, dw, R16, FSO_DT_BF16, x, w, FSO_DT_BF16, N, Ci, Co,
                         1.0f);
    be->ops->matmul_bwd(be, d_dx, FSO_DT_F32, d_dw, d_R16, FSO_DT_BF16, d_x, d_w, FSO_DT_BF16, N,
                        Ci, Co, 1.0f);
    check(be, m, "matmul_bwd bf16, bf16 dout: dx (accumulate)", d_dx, dx, nx, TOL_BF16_SUM);
    ref->ops->matmul_bwd(ref, NULL, FSO_DT_F32, dw, R16, FSO_DT_BF16, x, w, FSO_DT_BF16, N, Ci, Co,
                         0.0f);
    be->ops->matmul_bwd(be, NULL, FSO_DT_F32, d_dw, d_R16, FSO_DT_BF16, d_x, d_w, FSO_DT_BF16, N,
                        Ci, Co, 0.0f);
    check(be, m, "matmul_bwd bf16, bf16 dout: dw (twice, dx NULL)", d_dw, dw, nw, TOL_BF16_SUM);
#undef RESET_GRADS

    void *h[] = {x, w, R16, R, o, dx0, dw0, dx, dw, o16, dx16};
    for (size_t i = 0; i < sizeof h / sizeof *h; i++)
        free(h[i]);
    uint16_t *d16[] = {d_x, d_w, d_R16, d_o16, d_dx16};
    for (size_t i = 0; i < sizeof d16 / sizeof *d16; i++)
        dfree16(be, d16[i]);
    float *d[] = {d_R, d_o, d_dx, d_dw};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        dfree(be, d[i]);
}

static void test_matmul_bf16_matches_reference(void **state)
{
    (void)state;
    for (int m = 0; m < 2; m++) {
        run_matmul_bf16(m, 37, 45, 29); /* odd sizes: unaligned rows of bf16 */
        run_matmul_bf16(m, 130, 256, 96);
    }
}

/* bf16 w and out; x, dout, dx, dw and rstd fp32. */
static void run_rmsnorm_bf16(int m, int N, int C)
{
    fso_backend *be = cu[m];
    const size_t n = (size_t)N * C;
    float *x = hrand(n, 1.5), *R = hrand(n, 1), *r = hbuf((size_t)N);
    float *dx = hrand(n, 1), *dw = hrand((size_t)C, 1);
    uint16_t *w = hrand16((size_t)C, 1), *o = hbuf16(n);
    float *d_x = dput(be, x, n), *d_R = dput(be, R, n), *d_r = dnew(be, (size_t)N);
    float *d_dx = dput(be, dx, n), *d_dw = dput(be, dw, (size_t)C);
    uint16_t *d_w = dput16(be, w, (size_t)C), *d_o = dnew16(be, n);

    ref->ops->rmsnorm_fwd(ref, o, r, x, w, FSO_DT_BF16, N, C, 1e-5f);
    be->ops->rmsnorm_fwd(be, d_o, d_r, d_x, d_w, FSO_DT_BF16, N, C, 1e-5f);
    check16(be, m, "rmsnorm_fwd bf16 out", d_o, o, n, TOL_BF16_STORE);
    check(be, m, "rmsnorm_fwd bf16 rstd", d_r, r, (size_t)N, TOL_FP32);

    ref->ops->rmsnorm_bwd(ref, dx, dw, R, x, w, FSO_DT_BF16, r, N, C);
    be->ops->rmsnorm_bwd(be, d_dx, d_dw, d_R, d_x, d_w, FSO_DT_BF16, d_r, N, C);
    check(be, m, "rmsnorm_bwd bf16 w: dx (accumulate)", d_dx, dx, n, TOL_FP32);
    check(be, m, "rmsnorm_bwd bf16 w: dw (accumulate)", d_dw, dw, (size_t)C, TOL_FP32);

    void *h[] = {x, R, r, dx, dw, w, o};
    for (size_t i = 0; i < sizeof h / sizeof *h; i++)
        free(h[i]);
    float *d[] = {d_x, d_R, d_r, d_dx, d_dw};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        dfree(be, d[i]);
    dfree16(be, d_w);
    dfree16(be, d_o);
}

static void test_rmsnorm_bf16_matches_reference(void **state)
{
    (void)state;
    for (int m = 0; m < 2; m++) {
        run_rmsnorm_bf16(m, 19, 70);
        run_rmsnorm_bf16(m, 150, 1000);
    }
}

/* A bf16 table gathered into fp32 rows: exact, so bit for bit. */
static void test_embedding_bf16_matches_reference_bit_for_bit(void **state)
{
    (void)state;
    const int N = 300, C = 200, V = 1000;
    int32_t *tok = malloc(sizeof(int32_t) * N);
    assert_non_null(tok);
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)(fso_rng_u64(&rng) % (uint64_t)V);
    const size_t n = (size_t)N * C, nv = (size_t)V * C;
    uint16_t *wte = hrand16(nv, 1);
    float *o = hbuf(n);
    ref->ops->embedding_fwd(ref, o, tok, wte, FSO_DT_BF16, N, C);
    for (int m = 0; m < 2; m++) {
        fso_backend *be = cu[m];
        int32_t *d_tok = dput_i32(be, tok, (size_t)N);
        uint16_t *d_wte = dput16(be, wte, nv);
        float *d_o = dnew(be, n);
        be->ops->embedding_fwd(be, d_o, d_tok, d_wte, FSO_DT_BF16, N, C);
        check(be, m, "embedding_fwd bf16 table", d_o, o, n, 0);
        be->ops->buf_free(be, d_tok);
        dfree16(be, d_wte);
        dfree(be, d_o);
    }
    free(tok);
    free(wte);
    free(o);
}

/* RoPE over bf16 in place, forward and inverse. */
static void test_rope_bf16_matches_reference(void **state)
{
    (void)state;
    const int B = 2, T = 11, nh = 3, D = 10;
    const size_t n = (size_t)B * T * nh * D, nt = (size_t)T * D / 2;
    float *cs = hbuf(nt), *sn = hbuf(nt);
    fso_rope_tables(cs, sn, T, D, 10000.0);
    for (int m = 0; m < 2; m++) {
        fso_backend *be = cu[m];
        uint16_t *x = hrand16(n, 1), *a = hbuf16(n);
        memcpy(a, x, sizeof(uint16_t) * n);
        uint16_t *d_x = dput16(be, x, n);
        float *d_cs = dput(be, cs, nt), *d_sn = dput(be, sn, nt);
        ref->ops->rope(ref, a, FSO_DT_BF16, cs, sn, NULL, B, T, nh, D, 0);
        be->ops->rope(be, d_x, FSO_DT_BF16, d_cs, d_sn, NULL, B, T, nh, D, 0);
        check16(be, m, "rope bf16", d_x, a, n, TOL_BF16_STORE);
        ref->ops->rope(ref, a, FSO_DT_BF16, cs, sn, NULL, B, T, nh, D, 1);
        be->ops->rope(be, d_x, FSO_DT_BF16, d_cs, d_sn, NULL, B, T, nh, D, 1);
        check16(be, m, "rope bf16 inverse", d_x, a, n, TOL_BF16_STORE);
        /* back to the start within two roundings of bf16 */
        check16(be, m, "rope bf16 round trip", d_x, x, n, TOL_BF16_OPERAND);
        free(x);
        free(a);
        dfree16(be, d_x);
        dfree(be, d_cs);
        dfree(be, d_sn);
    }
    free(cs);
    free(sn);
}

/* Every tensor bf16; the backward starts from the reference's probs. */
static void run_attention_bf16(int m, int B, int T, int H, int Hkv, int D, const int32_t *pos)
{
    fso_backend *be = cu[m];
    int32_t *d_pos = pos ? dput_i32(be, pos, (size_t)B * T) : NULL;
    size_t nq = (size_t)B * T * H * D, nkv = (size_t)B * T * Hkv * D, np = (size_t)B * H * T * T;
    uint16_t *q = hrand16(nq, 1), *k = hrand16(nkv, 1), *v = hrand16(nkv, 1), *R = hrand16(nq, 1);
    uint16_t *o = hbuf16(nq), *p = hbuf16(np), *dq = hbuf16(nq), *dk = hbuf16(nkv);
    uint16_t *dv = hbuf16(nkv);
    uint16_t *d_q = dput16(be, q, nq), *d_k = dput16(be, k, nkv), *d_v = dput16(be, v, nkv);
    uint16_t *d_R = dput16(be, R, nq), *d_o = dnew16(be, nq), *d_p = dnew16(be, np);
    uint16_t *d_dq = dnew16(be, nq), *d_dk = dnew16(be, nkv), *d_dv = dnew16(be, nkv);

    ref->ops->attention_fwd(ref, o, p, q, k, v, pos, FSO_DT_BF16, B, T, H, Hkv, D);
    be->ops->attention_fwd(be, d_o, d_p, d_q, d_k, d_v, d_pos, FSO_DT_BF16, B, T, H, Hkv, D);
    check16(be, m, "attention_fwd bf16 out", d_o, o, nq, TOL_BF16_OPERAND);
    /* fp32 scores and softmax on both sides: P differs by its rounding only */
    float *got_p = dget16(be, d_p, np, "attention_fwd bf16 probs"), *want_p = hwiden(p, np);
    compare_math("attention_fwd bf16 probs", m, got_p, want_p, np, TOL_BF16_STORE);
    for (int bh = 0; bh < B * H; bh++)
        for (int t = 0; t < T; t++)
            for (int s = 0; s < T; s++)
                if (s > t || (pos && s < t - pos[(bh / H) * T + t]))
                    assert_true(got_p[((size_t)bh * T + t) * T + s] == 0.0f);
    free(got_p);
    free(want_p);

    be->ops->copy_h2d(be, d_p, p, sizeof(uint16_t) * np);
    ref->ops->attention_bwd(ref, dq, dk, dv, R, p, q, k, v, pos, FSO_DT_BF16, B, T, H, Hkv, D);
    be->ops->attention_bwd(be, d_dq, d_dk, d_dv, d_R, d_p, d_q, d_k, d_v, d_pos, FSO_DT_BF16, B, T,
                           H, Hkv, D);
    check16(be, m, "attention_bwd bf16 dq", d_dq, dq, nq, TOL_BF16_OPERAND);
    check16(be, m, "attention_bwd bf16 dk", d_dk, dk, nkv, TOL_BF16_OPERAND);
    /* P^T dO from the same bf16 values, the group summed in fp32, rounded once */
    check16(be, m, "attention_bwd bf16 dv", d_dv, dv, nkv, TOL_BF16_STORE);

    uint16_t *h[] = {q, k, v, R, o, p, dq, dk, dv};
    for (size_t i = 0; i < sizeof h / sizeof *h; i++)
        free(h[i]);
    uint16_t *d[] = {d_q, d_k, d_v, d_R, d_o, d_p, d_dq, d_dk, d_dv};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        dfree16(be, d[i]);
    if (d_pos)
        be->ops->buf_free(be, d_pos);
}

static void test_attention_bf16_matches_reference(void **state)
{
    (void)state;
    int32_t *p13 = doc_positions(2, 13, 5), *p9 = doc_positions(1, 9, 4);
    for (int m = 0; m < 2; m++) {
        run_attention_bf16(m, 2, 13, 6, 2, 8, NULL);  /* 3 query heads per kv head */
        run_attention_bf16(m, 2, 70, 8, 2, 16, NULL); /* rows longer than a warp */
        run_attention_bf16(m, 1, 9, 4, 4, 6, NULL);   /* no groups: dk, dv stored directly */
        run_attention_bf16(m, 2, 13, 6, 2, 8, p13);   /* documents packed in the rows */
        run_attention_bf16(m, 1, 9, 4, 4, 6, p9);
    }
    free(p13);
    free(p9);
}

/* SwiGLU over bf16: aligned (vector loads) and from an odd element offset. */
static void run_swiglu_bf16(int m, const uint16_t *g, const uint16_t *u, const uint16_t *R,
                            size_t n)
{
    fso_backend *be = cu[m];
    uint16_t *o = hbuf16(n), *dg = hbuf16(n), *du = hbuf16(n);
    uint16_t *d_g = dput16(be, g, n + 1), *d_u = dput16(be, u, n + 1), *d_R = dput16(be, R, n + 1);
    uint16_t *d_o = dnew16(be, n), *d_dg = dnew16(be, n), *d_du = dnew16(be, n);
    /* inputs from element 1 of their buffers, not four-aligned: the
     * kernels' one-at-a-time path */
    ref->ops->swiglu_fwd(ref, o, g + 1, u + 1, FSO_DT_BF16, n);
    be->ops->swiglu_fwd(be, d_o, d_g + 1, d_u + 1, FSO_DT_BF16, n);
    check16(be, m, "swiglu_fwd bf16 (unaligned)", d_o, o, n, TOL_BF16_STORE);
    ref->ops->swiglu_bwd(ref, dg, du, R + 1, g + 1, u + 1, FSO_DT_BF16, n);
    be->ops->swiglu_bwd(be, d_dg, d_du, d_R + 1, d_g + 1, d_u + 1, FSO_DT_BF16, n);
    check16(be, m, "swiglu_bwd bf16 dgate (unaligned)", d_dg, dg, n, TOL_BF16_STORE);
    check16(be, m, "swiglu_bwd bf16 dup (unaligned)", d_du, du, n, TOL_BF16_STORE);
    /* again from element 0, four-aligned: vector loads */
    ref->ops->swiglu_fwd(ref, o, g, u, FSO_DT_BF16, n);
    be->ops->swiglu_fwd(be, d_o, d_g, d_u, FSO_DT_BF16, n);
    check16(be, m, "swiglu_fwd bf16", d_o, o, n, TOL_BF16_STORE);
    ref->ops->swiglu_bwd(ref, dg, du, R, g, u, FSO_DT_BF16, n);
    be->ops->swiglu_bwd(be, d_dg, d_du, d_R, d_g, d_u, FSO_DT_BF16, n);
    check16(be, m, "swiglu_bwd bf16 dgate", d_dg, dg, n, TOL_BF16_STORE);
    check16(be, m, "swiglu_bwd bf16 dup", d_du, du, n, TOL_BF16_STORE);
    free(o);
    free(dg);
    free(du);
    uint16_t *d[] = {d_g, d_u, d_R, d_o, d_dg, d_du};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        dfree16(be, d[i]);
}

static void test_swiglu_bf16_matches_reference(void **state)
{
    (void)state;
    const size_t n = 100003;
    uint16_t *g = hrand16(n + 1, 2), *u = hrand16(n + 1, 1), *R = hrand16(n + 1, 1);
    for (int m = 0; m < 2; m++)
        run_swiglu_bf16(m, g, u, R, n);
    free(g);
    free(u);
    free(R);
}

/* ---------------------------------------------------------------- casts */

/* Every bf16 value (±0, denormals, Inf, NaNs) and a random odd-length tail,
 * read from an odd element offset: the same bits as the reference. */
static void test_cast_bf16_f32_matches_reference_bit_for_bit(void **state)
{
    (void)state;
    const size_t n = 65536 + 4099;
    uint16_t *src = malloc(sizeof(uint16_t) * (n + 1));
    assert_non_null(src);
    for (size_t i = 0; i < n + 1; i++)
        src[i] = i <= 65536 ? (uint16_t)(i - 1) : (uint16_t)(fso_rng_u64(&rng) >> 48);
    float *want = hbuf(n);
    ref->ops->cast_bf16_f32(ref, want, src + 1, n);
    for (int m = 0; m < 2; m++) {
        fso_backend *be = cu[m];
        void *d_src = NULL;
        assert_int_equal(be->ops->buf_alloc(be, sizeof(uint16_t) * (n + 1), &d_src), 0);
        be->ops->copy_h2d(be, d_src, src, sizeof(uint16_t) * (n + 1));
        float *d_dst = dnew(be, n);
        be->ops->cast_bf16_f32(be, d_dst, (const uint16_t *)d_src + 1, n);
        float *got = dget(be, d_dst, n, "cast_bf16_f32");
        for (size_t i = 0; i < n; i++)
            if (memcmp(&got[i], &want[i], sizeof(float)))
                fail_msg("cast_bf16_f32 (%s): element %zu (bf16 0x%04x): %a, want %a",
                         math_name[m], i, src[i + 1], got[i], want[i]);
        free(got);
        dfree(be, d_dst);
        be->ops->buf_free(be, d_src);
    }
    free(want);
    free(src);
}

/* fp32 to bf16 on the device: the CPU reference's bits (round to nearest
 * even, NaNs quiet), over every bf16 value with the low halves that decide
 * the rounding. */
static void test_cast_f32_bf16_matches_reference_bit_for_bit(void **state)
{
    (void)state;
    static const uint32_t lows[] = {0x0000, 0x7fff, 0x8000, 0x8001, 0xffff};
    const size_t n = 65536 * 5;
    float *src = hbuf(n);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = ((uint32_t)(i / 5) << 16) | lows[i % 5];
        memcpy(&src[i], &bits, sizeof bits);
    }
    uint16_t *want = malloc(sizeof(uint16_t) * n), *got = malloc(sizeof(uint16_t) * n);
    ref->ops->cast_f32_bf16(ref, want, src, n);
    fso_backend *be = cu[0];
    float *d_src = dput(be, src, n);
    void *d_dst = NULL;
    assert_int_equal(be->ops->buf_alloc(be, sizeof(uint16_t) * n, &d_dst), 0);
    be->ops->cast_f32_bf16(be, d_dst, d_src, n);
    be->ops->copy_d2h(be, got, d_dst, sizeof(uint16_t) * n);
    assert_int_equal(be->ops->sync(be), 0);
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            fail_msg("cast_f32_bf16: element %zu (%a): 0x%04x, want 0x%04x", i, src[i], got[i],
                     want[i]);
    be->ops->buf_free(be, d_dst);
    dfree(be, d_src);
    free(want);
    free(got);
    free(src);
}

/* ---------------------------------------------------------------- AdamW */

/* The device update is the CPU scalar reference, bit for bit: master, m, v
 * and the bf16, fp32 or no parameter output, including a clipped gradient
 * and weight decay, over steps where the bias corrections still matter. */
static void test_adamw_matches_the_cpu_reference_bit_for_bit(void **state)
{
    (void)state;
    fso_backend *be = cu[0];
    const size_t n = 300007;
    float *master = hrand(n, 0.5), *grad = hrand(n, 2.0), *m = hbuf(n), *v = hbuf(n);
    memset(m, 0, sizeof(float) * n);
    memset(v, 0, sizeof(float) * n);
    float *d_master = dput(be, master, n), *d_grad = dput(be, grad, n);
    float *d_m = dput(be, m, n), *d_v = dput(be, v, n), *d_out32 = dnew(be, n);
    void *d_out16 = NULL;
    assert_int_equal(be->ops->buf_alloc(be, sizeof(uint16_t) * n, &d_out16), 0);
    uint16_t *want16 = malloc(sizeof(uint16_t) * n), *got16 = malloc(sizeof(uint16_t) * n);
    for (int t = 1; t <= 3; t++) {
        fso_adamw_step st = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                             .weight_decay = 0.1, .grad_scale = 0.37, .t = t};
        fso_adamw_consts c;
        fso_adamw_consts_init(&c, &st);
        fso_adamw_fused_scalar(master, grad, FSO_DT_F32, m, v, want16, n, &c);
        be->ops->adamw(be, d_master, d_grad, d_m, d_v, t == 1 ? NULL : t == 2 ? d_out16 : d_out32,
                       t == 2, n, &c);
        float *gm = dget(be, d_master, n, "adamw master");
        float *gmm = dget(be, d_m, n, "adamw m"), *gv = dget(be, d_v, n, "adamw v");
        for (size_t i = 0; i < n; i++)
            if (memcmp(&gm[i], &master[i], 4) || memcmp(&gmm[i], &m[i], 4) ||
                memcmp(&gv[i], &v[i], 4))
                fail_msg("adamw step %d, element %zu: master %a/%a m %a/%a v %a/%a", t, i,
                         gm[i], master[i], gmm[i], m[i], gv[i], v[i]);
        if (t == 2) {
            be->ops->copy_d2h(be, got16, d_out16, sizeof(uint16_t) * n);
            assert_int_equal(be->ops->sync(be), 0);
            assert_memory_equal(got16, want16, sizeof(uint16_t) * n);
        } else if (t == 3) {
            float *g32 = dget(be, d_out32, n, "adamw fp32 out");
            assert_memory_equal(g32, master, sizeof(float) * n);
            free(g32);
        }
        free(gm);
        free(gmm);
        free(gv);
    }
    free(want16);
    free(got16);
    be->ops->buf_free(be, d_out16);
    dfree(be, d_out32);
    dfree(be, d_master);
    dfree(be, d_grad);
    dfree(be, d_m);
    dfree(be, d_v);
    free(master);
    free(grad);
    free(m);
    free(v);
}

/* ---------------------------------------------------------------- cross-entropy */

static void run_cross_entropy(int m, int N, int V)
{
    fso_backend *be = cu[m];
    int32_t *tgt = malloc(sizeof(int32_t) * (size_t)N);
    assert_non_null(tgt);
    for (int i = 0; i < N; i++) /* every third target does not count */
        tgt[i] = i % 3 == 1 ? -1 : (int32_t)(fso_rng_u64(&rng) % (uint64_t)V);
    size_t n = (size_t)N * V;
    float *lg = hrand(n, 3), *dl = hbuf(n), *loss = hbuf((size_t)N);
    int32_t *d_t = dput_i32(be, tgt, (size_t)N);
    float *d_lg = dput(be, lg, n), *d_dl = dnew(be, n), *d_loss = dnew(be, (size_t)N);
    ref->ops->cross_entropy(ref, dl, loss, lg, tgt, N, V, 0.25f);
    be->ops->cross_entropy(be, d_dl, d_loss, d_lg, d_t, N, V, 0.25f);
    check(be, m, "cross_entropy losses", d_loss, loss, (size_t)N, TOL_FP32);
    check(be, m, "cross_entropy dlogits", d_dl, dl, n, TOL_FP32);
    /* in place: dlogits over the logits */
    be->ops->cross_entropy(be, d_lg, d_loss, d_lg, d_t, N, V, 0.25f);
    check(be, m, "cross_entropy in place", d_lg, dl, n, TOL_FP32);
    free(tgt);
    free(lg);
    free(dl);
    free(loss);
    be->ops->buf_free(be, d_t);
    dfree(be, d_lg);
    dfree(be, d_dl);
    dfree(be, d_loss);
}

static void test_cross_entropy_matches_reference(void **state)
{
    (void)state;
    for (int m = 0; m < 2; m++) {
        run_cross_entropy(m, 21, 77);
        run_cross_entropy(m, 5, 50257); /* many values per thread */
    }
}

/* Pinned host memory for a test whose point is asynchronous copies: the
 * test is skipped when pinning is refused, as it would mean nothing. */
static float *pinned_or_skip(size_t bytes)
{
    char err[256];
    float *h = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(h != MAP_FAILED);
    if (fso_cuda_host_register(h, bytes, err, sizeof err) < 0) {
        printf("pinning refused: %s\n", err);
        munmap(h, bytes);
        skip();
    }
    return h;
}

static void pinned_free(float *h, size_t bytes)
{
    assert_int_equal(fso_cuda_host_unregister(h, bytes), 0);
    munmap(h, bytes);
}

/* ---------------------------------------------------------------- sqnorm */

static void test_sqnorm_is_exact_and_the_same_bits_from_host_memory(void **state)
{
    (void)state;
    fso_backend *be = cu[0];
    const size_t n = 3000017; /* many chunks, a ragged end */
    float *x = hrand(n, 1);
    float *d_x = dput(be, x, n);
    double exact = 0, dev = 0, host = 0, twice = 5.0;
    for (size_t i = 0; i < n; i++)
        exact += (double)x[i] * x[i];
    be->ops->sqnorm(be, &dev, d_x, n);
    assert_int_equal(be->ops->sync(be), 0);
    assert_true(fabs(dev - exact) <= 1e-12 * exact);
    be->ops->sqnorm(be, &host, x, n); /* pageable host memory: summed on the CPU */
    assert_true(memcmp(&dev, &host, sizeof dev) == 0);
    be->ops->sqnorm(be, &twice, d_x, n); /* += , there once sync() returns */
    assert_int_equal(be->ops->sync(be), 0);
    assert_true(fabs(twice - (5.0 + dev)) <= 1e-12 * exact);
    /* many norms queued before one sync: each lands where it belongs */
    double many[1500];
    for (int i = 0; i < 1500; i++) {
        many[i] = i;
        be->ops->sqnorm(be, &many[i], d_x, 1000 + (size_t)i);
    }
    assert_int_equal(be->ops->sync(be), 0);
    for (int i = 0; i < 1500; i++) { /* against one norm at a time */
        double want = i;
        be->ops->sqnorm(be, &want, d_x, 1000 + (size_t)i);
        assert_int_equal(be->ops->sync(be), 0);
        if (memcmp(&want, &many[i], sizeof want) != 0)
            fail_msg("norm %d: %.17g, expected %.17g", i, many[i], want);
    }
    double empty = 1.5;
    be->ops->sqnorm(be, &empty, d_x, 0);
    assert_true(empty == 1.5);
    free(x);
    dfree(be, d_x);
}

/* sum: a micro-batch's losses reach the host without a wait, in double,
 * the same bits from device and host memory, delivered by sync() or by
 * wait_mark() of a later mark. */
static void test_sum_is_exact_and_delivered_by_a_later_mark(void **state)
{
    (void)state;
    fso_backend *be = cu[0];
    const size_t n = 1000003;
    float *x = hrand(n, 9);
    float *d_x = dput(be, x, n);
    double exact = 0, dev = 0, host = 0, marked = 0.25;
    for (size_t i = 0; i < n; i++)
        exact += x[i];
    be->ops->sum(be, &dev, d_x, n);
    assert_int_equal(be->ops->sync(be), 0);
    assert_true(fabs(dev - exact) <= 1e-9 * fabs(exact) + 1e-9);
    be->ops->sum(be, &host, x, n); /* pageable host memory: summed on the CPU */
    assert_true(memcmp(&dev, &host, sizeof dev) == 0);
    be->ops->sum(be, &marked, d_x, n);
    be->ops->add(be, d_x, d_x, d_x, n); /* later work: the mark below is after the sum */
    be->ops->wait_mark(be, be->ops->mark(be));
    assert_true(marked == 0.25 + dev);
    assert_int_equal(be->ops->sync(be), 0);
    free(x);
    dfree(be, d_x);
}

/* copy_d2h_after waits for the compute before its mark, and a copies-only
 * mark tells the host when that copy (not later compute) is done; a full
 * mark overwritten in the ring by copies-only ones still waits for all. */
static void test_copy_marks_wait_for_copies(void **state)
{
    (void)state;
    fso_backend *be = cu[0];
    const size_t n = 1 << 22, bytes = sizeof(float) * n;
    float *h = pinned_or_skip(bytes);
    float *x = hrand(n, 11);
    float *d_a = dput(be, x, n), *d_b = dnew(be, n);
    assert_int_equal(be->ops->sync(be), 0);
    be->ops->add(be, d_b, d_a, d_a, n); /* b = 2x */
    uint64_t m = be->ops->mark(be);
    be->ops->copy_d2h_after(be, h, d_b, bytes, m);
    uint64_t c = be->ops->mark_copies(be);
    for (int i = 0; i < 8; i++)
        be->ops->add(be, d_a, d_a, d_a, n); /* later compute the wait need not cover */
    be->ops->wait_mark(be, c);
    for (size_t i = 0; i < n; i++)
        if (h[i] != x[i] + x[i])
            fail_msg("element %zu: %g, want %g", i, h[i], x[i] + x[i]);
    double norm = 0;
    be->ops->sqnorm(be, &norm, d_b, n);
    uint64_t full = be->ops->mark(be);
    const uint64_t stale = fso_backend_stale_marks(be);
    for (int i = 0; i < FSO_CUDA_MARKS + 1; i++)
        be->ops->mark_copies(be);
    be->ops->wait_mark(be, full); /* its slot now holds a copies-only mark: a drain */
    assert_int_equal(fso_backend_stale_marks(be), stale + 1);
    assert_true(norm > 0); /* the drain folded the norm queued before the full mark */
    assert_int_equal(be->ops->sync(be), 0);
    free(x);
    dfree(be, d_a);
    dfree(be, d_b);
    pinned_free(h, bytes);
}

/* ---------------------------------------------------------------- streams, memory, errors */

/* A copy ordered after a mark waits for the compute before it (so it never
 * overwrites what compute still reads) and compute after it sees the copy. */
static void test_copy_after_a_mark_keeps_the_order(void **state)
{
    (void)state;
    fso_backend *be = cu[0];
    const size_t n = 1 << 22;
    float *x = hrand(n, 3), *y = hrand(n, 4), *z = hrand(n, 5);
    float *d_a = dput(be, x, n), *d_b = dput(be, y, n);
    float *d_c = dnew(be, n), *d_d = dnew(be, n);
    assert_int_equal(be->ops->sync(be), 0);
    be->ops->add(be, d_c, d_a, d_b, n);       /* reads a (old) */
    uint64_t m = be->ops->mark(be);
    be->ops->copy_h2d_after(be, d_a, z, sizeof(float) * n, m); /* a := z, after the add */
    be->ops->add(be, d_d, d_a, d_b, n);       /* reads a (new) */
    float *c = malloc(sizeof(float) * n), *d = malloc(sizeof(float) * n);
    be->ops->copy_d2h(be, c, d_c, sizeof(float) * n);
    be->ops->copy_d2h(be, d, d_d, sizeof(float) * n);
    assert_int_equal(be->ops->sync(be), 0);
    for (size_t i = 0; i < n; i++) {
        if (c[i] != x[i] + y[i])
            fail_msg("element %zu: the copy overtook the add that read the old value", i);
        if (d[i] != z[i] + y[i])
            fail_msg("element %zu: the add after the copy did not see it", i);
    }
    /* 0, and a mark long gone from the ring: ordered after everything */
    be->ops->copy_h2d_after(be, d_a, x, sizeof(float) * n, 0);
    be->ops->copy_h2d_after(be, d_a, x, sizeof(float) * n, 1);
    assert_int_equal(be->ops->sync(be), 0);

    /* a gather after a mark still sees the staging copy queued after that
     * mark (as the engine stages a shard, then gathers it) */
    fso_coll *coll = NULL;
    char err[256];
    fso_backend *one[1] = {be};
    if (fso_coll_create_nccl(&coll, 1, one, err, sizeof err) != 0)
        fail_msg("fso_coll_create_nccl: %s", err);
    be->ops->add(be, d_c, d_b, d_b, n);      /* compute before the mark, on other buffers */
    uint64_t m2 = be->ops->mark(be);
    be->ops->copy_h2d_after(be, d_a, z, sizeof(float) * n, m2);
    assert_int_equal(coll->ops->all_gather(coll, 0, d_a, d_d, n, FSO_DT_F32, m2), 0);
    be->ops->copy_d2h(be, d, d_d, sizeof(float) * n);
    assert_int_equal(be->ops->sync(be), 0);
    assert_memory_equal(d, z, sizeof(float) * n);
    fso_coll_destroy(coll);
    free(c);
    free(d);
    free(x);
    free(y);
    free(z);
    dfree(be, d_a);
    dfree(be, d_b);
    dfree(be, d_c);
    dfree(be, d_d);
}

/* A mark 1024 marks old has left the ring: waiting for it, or ordering a
 * copy after it, then covers all queued work (stricter, still right) and
 * is counted as stale; a recent mark is not. Both FSO_CUDA_WAIT modes
 * (blocking and spinning host waits) keep the order; another value is
 * refused naming the variable. */
static void test_stale_marks_are_counted_in_both_wait_modes(void **state)
{
    (void)state;
    char err[256] = "";
    const size_t n = 1 << 20;
    float *x = hrand(n, 3), *y = hrand(n, 4), *z = hrand(n, 5);
    float *c = malloc(sizeof(float) * n);
    assert_non_null(c);
    for (int spin = 0; spin < 2; spin++) {
        setenv("FSO_CUDA_WAIT", spin ? "spin" : "block", 1);
        fso_backend *be = NULL;
        if (fso_backend_create_cuda(&be, 0, 0, err, sizeof err) != 0)
            fail_msg("FSO_CUDA_WAIT=%s: %s", spin ? "spin" : "block", err);
        float *d_a = dput(be, x, n), *d_b = dput(be, y, n), *d_c = dnew(be, n);
        assert_int_equal(be->ops->sync(be), 0);
        const uint64_t old = be->ops->mark(be);
        be->ops->wait_mark(be, old);
        assert_int_equal(fso_backend_stale_marks(be), 0);
        for (int i = 0; i < 1024; i++)
            be->ops->mark(be);
        be->ops->add(be, d_c, d_a, d_b, n);   /* reads a */
        be->ops->wait_mark(be, old);           /* stale: waits for more */
        be->ops->copy_h2d_after(be, d_a, z, sizeof(float) * n, old); /* stale: after the add */
        be->ops->copy_d2h(be, c, d_c, sizeof(float) * n);
        assert_int_equal(be->ops->sync(be), 0);
        assert_int_equal(fso_backend_stale_marks(be), 2);
        for (size_t i = 0; i < n; i++)
            if (c[i] != x[i] + y[i])
                fail_msg("element %zu: a copy after a stale mark overtook the add before it", i);
        be->ops->wait_mark(be, be->ops->mark(be));
        assert_int_equal(fso_backend_stale_marks(be), 2);
        dfree(be, d_a);
        dfree(be, d_b);
        dfree(be, d_c);
        fso_backend_destroy_cuda(be);
    }
    setenv("FSO_CUDA_WAIT", "poll", 1);
    fso_backend *be = NULL;
    assert_int_equal(fso_backend_create_cuda(&be, 0, 0, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "FSO_CUDA_WAIT=poll"));
    unsetenv("FSO_CUDA_WAIT");
    free(x);
    free(y);
    free(z);
    free(c);
}

/* A host buffer a copy reads may be reused once the copy's mark is
 * reached, without a sync. */
static void test_mark_frees_a_copy_source(void **state)
{
    (void)state;
    fso_backend *be = cu[0];
    const size_t n = 1 << 22, bytes = sizeof(float) * n;
    float *h = pinned_or_skip(bytes);
    float *d = dnew(be, n);
    for (size_t i = 0; i < n; i++)
        h[i] = (float)i;
    be->ops->copy_h2d(be, d, h, sizeof(float) * n);
    uint64_t t = be->ops->mark(be);
    assert_true(t > 0);
    be->ops->wait_mark(be, t);
    memset(h, 0xff, sizeof(float) * n); /* reused: the copy must have read it already */
    float *back = malloc(sizeof(float) * n);
    be->ops->copy_d2h(be, back, d, sizeof(float) * n);
    assert_int_equal(be->ops->sync(be), 0);
    for (size_t i = 0; i < n; i++)
        if (back[i] != (float)i)
            fail_msg("element %zu: %g", i, back[i]);
    /* marks far older than the ring still wait correctly (for later work) */
    uint64_t first = be->ops->mark(be);
    for (int i = 0; i < 200; i++)
        be->ops->mark(be);
    be->ops->wait_mark(be, first);
    free(back);
    dfree(be, d);
    pinned_free(h, bytes);
}

/* h2d, compute and d2h on three streams, no sync in between: each waits for
 * the previous (and a copy into a buffer waits for the copy out of it). */
static void test_copies_and_ops_run_in_issue_order(void **state)
{
    (void)state;
    fso_backend *be = cu[1];
    const size_t n = (size_t)16 << 20;
    float *a = hrand(n, 1), *b = hrand(n, 1), *out1 = hbuf(n), *out2 = hbuf(n);
    float *d = dnew(be, n), *d2 = dnew(be, n);
    be->ops->copy_h2d(be, d, a, sizeof(float) * n);
    be->ops->add(be, d, d, d, n);
    be->ops->copy_d2h(be, out1, d, sizeof(float) * n);
    be->ops->copy_h2d(be, d, b, sizeof(float) * n); /* must wait for the copy out */
    be->ops->copy_h2d(be, d2, d, sizeof(float) * n); /* device to device */
    be->ops->memset0(be, d, sizeof(float) * n);
    be->ops->copy_d2h(be, out2, d2, sizeof(float) * n);
    assert_int_equal(be->ops->sync(be), 0);
    for (size_t i = 0; i < n; i++)
        if (out1[i] != a[i] + a[i] || out2[i] != b[i])
            fail_msg("element %zu: %g, %g; want %g, %g", i, out1[i], out2[i], a[i] + a[i], b[i]);
    float *z = dget(be, d, n, "memset0");
    for (size_t i = 0; i < n; i++)
        assert_true(z[i] == 0.0f);
    free(z);
    free(a);
    free(b);
    free(out1);
    free(out2);
    dfree(be, d);
    dfree(be, d2);
}

static void test_memory_is_counted_and_capped(void **state)
{
    (void)state;
    char err[256] = "";
    fso_backend *be = NULL;
    assert_int_equal(fso_backend_create_cuda(&be, 0, (size_t)64 << 20, err, sizeof err), 0);
    assert_true(fso_backend_is_cuda(be));
    assert_string_equal(be->ops->name, "cuda");
    assert_int_equal(be->ops->host_addressable, 0);
    size_t base = be->mem_used_bytes; /* the backend's own workspace */
    void *p = NULL, *q = NULL;
    assert_int_equal(be->ops->buf_alloc(be, 1000, &p), 0);
    assert_int_equal(be->mem_used_bytes, base + 1024);
    float zero[250];
    be->ops->copy_d2h(be, zero, p, sizeof zero);
    assert_int_equal(be->ops->sync(be), 0);
    for (int i = 0; i < 250; i++)
        assert_true(zero[i] == 0.0f); /* new buffers are zero */
    assert_int_equal(be->ops->buf_alloc(be, (size_t)64 << 20, &q), -ENOMEM);
    assert_non_null(strstr(be->err, "memory cap"));
    be->ops->buf_free(be, p);
    assert_int_equal(be->mem_used_bytes, base);
    assert_true(be->mem_peak_bytes >= base + 1024);
    fso_backend_destroy_cuda(be);
    fso_backend_destroy_cuda(NULL);

    /* an unknown math is refused with the variable's name */
    setenv("FSO_CUDA_MATH", "fp64", 1);
    assert_int_equal(fso_backend_create_cuda(&be, 0, 0, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "FSO_CUDA_MATH"));
    setenv("FSO_CUDA_MATH", "fp32", 1);
    assert_int_equal(fso_backend_create_cuda(&be, 0, 0, err, sizeof err), 0);
    assert_int_equal(fso_cuda_get_math(be), FSO_CUDA_MATH_FP32);
    fso_backend_destroy_cuda(be);
    unsetenv("FSO_CUDA_MATH");
    assert_int_equal(fso_backend_create_cuda(&be, 1000, 0, err, sizeof err), -EINVAL);
    assert_null(be);
}

static void test_bad_token_is_reported_by_sync(void **state)
{
    (void)state;
    char err[256] = "";
    fso_backend *be = NULL;
    assert_int_equal(fso_backend_create_cuda(&be, 0, 0, err, sizeof err), 0);
    int32_t tok[4] = {0, 1, 2, 3}, bad[4] = {0, 1, 9, 3};
    float *wte = hrand(4 * 8, 1), *lg = hrand(4 * 9, 1);
    int32_t *d_tok = dput_i32(be, tok, 4), *d_bad = dput_i32(be, bad, 4);
    float *d_wte = dput(be, wte, 32), *d_o = dnew(be, 32), *d_lg = dput(be, lg, 36);
    float *d_loss = dnew(be, 4);
    be->ops->embedding_fwd(be, d_o, d_tok, d_wte, FSO_DT_F32, 4, 8);
    assert_int_equal(be->ops->sync(be), 0);
    be->ops->cross_entropy(be, d_lg, d_loss, d_lg, d_bad, 4, 9, 1.0f); /* 9 >= V */
    assert_int_equal(be->ops->sync(be), -EINVAL);
    assert_non_null(strstr(be->err, "vocab_size"));
    assert_int_equal(be->ops->sync(be), -EINVAL); /* the failure stays */
    free(wte);
    free(lg);
    fso_backend_destroy_cuda(be); /* frees the buffers it still holds */
}

static void test_gpu_info_describes_device_0(void **state)
{
    (void)state;
    char err[256] = "";
    fso_gpu_info gi;
    assert_int_equal(fso_gpu_info_query(0, &gi, err, sizeof err), 0);
    assert_true(gi.name[0] != 0 && gi.pci_bus_id[0] != 0);
    assert_true(gi.sm_count > 0 && gi.mem_total_bytes > 0 && gi.cc_major >= 7);
    assert_true(gi.bf16_peak_tflops == fso_gpu_bf16_peak_tflops(gi.name));
    printf("device 0: %s, %s, sm_%d%d, %d SMs, %.1f GiB, bf16 peak %.0f TFLOP/s%s\n", gi.name,
           gi.pci_bus_id, gi.cc_major, gi.cc_minor, gi.sm_count,
           gi.mem_total_bytes / 1073741824.0, gi.bf16_peak_tflops,
           gi.bf16_peak_tflops ? "" : " (not in the table)");
    assert_int_equal(fso_gpu_info_query(-1, &gi, err, sizeof err), -EINVAL);
}

/* ---------------------------------------------------------------- pinned memory */

static void test_pinned_registration_round_trip(void **state)
{
    (void)state;
    char err[256] = "";
    fso_backend *be = cu[0];
    const size_t bytes = (size_t)64 << 20, n = bytes / sizeof(float);
    float *h = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(h != MAP_FAILED);
    assert_int_equal(fso_cuda_host_register(NULL, bytes, err, sizeof err), -EINVAL);
    int rc = fso_cuda_host_register(h, bytes, err, sizeof err);
    if (rc == -EPERM) { /* the environment refuses: a warning, not a failure */
        printf("pinning refused, as a caller would warn: %s\n", err);
        munmap(h, bytes);
        skip();
    }
    assert_int_equal(rc, 0);
    assert_int_equal(fso_cuda_host_register(h, bytes, err, sizeof err), -EINVAL); /* twice */
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(i % 1000) * 0.5f;
    double on_device = 0;
    be->ops->sqnorm(be, &on_device, h, n); /* registered: read by the device */
    float *d = dnew(be, n);
    be->ops->copy_h2d(be, d, h, bytes);
    assert_int_equal(be->ops->sync(be), 0);
    memset(h, 0, bytes);
    be->ops->copy_d2h(be, h, d, bytes);
    assert_int_equal(be->ops->sync(be), 0);
    for (size_t i = 0; i < n; i++)
        if (h[i] != (float)(i % 1000) * 0.5f)
            fail_msg("pinned round trip: element %zu is %g", i, h[i]);
    assert_int_equal(fso_cuda_host_unregister(h, bytes), 0);
    double pageable = 0;
    be->ops->sqnorm(be, &pageable, h, n); /* now pageable: summed on the CPU */
    assert_true(memcmp(&on_device, &pageable, sizeof pageable) == 0);
    dfree(be, d);
    munmap(h, bytes);
}

/* ---------------------------------------------------------------- NCCL */

#define MAXR 8
struct rank_job {
    int rank, world;
    fso_coll *nccl, *threads;
    fso_backend *be;
    size_t count;
    float *send, *host_gather, *host_scatter;  /* threads implementation, host memory */
    float *dev_gather, *dev_scatter;           /* NCCL results copied back */
    uint16_t *host_gather16, *dev_gather16;    /* bf16 gathers of send's first 2*count bytes */
    uint16_t *send16;                          /* send rounded to bf16 */
    float *host_scatter16, *dev_scatter16;     /* reduce_scatter_bf16 of send16 */
    double f64[3], f64_threads[3];
    int rc;
    char err[FSO_BACKEND_ERR_MAX];
};

static void *rank_main(void *arg)
{
    struct rank_job *j = arg;
    fso_backend *be = j->be;
    const size_t cnt = j->count, W = (size_t)j->world;
    int rc = 0;
    /* the reference: threads over host memory */
    j->threads->ops->all_gather(j->threads, j->rank, j->send, j->host_gather, cnt, FSO_DT_F32, 0);
    j->threads->ops->reduce_scatter(j->threads, j->rank, j->send, j->host_scatter, cnt / W);
    j->threads->ops->all_gather(j->threads, j->rank, j->send, j->host_gather16, cnt,
                                FSO_DT_BF16, 0);
    j->threads->ops->reduce_scatter_bf16(j->threads, j->rank, j->send16, j->host_scatter16,
                                         cnt / W);
    memcpy(j->f64_threads, j->f64, sizeof j->f64);
    j->threads->ops->all_reduce_f64(j->threads, j->rank, j->f64_threads, 3);

    void *d_send = NULL, *d_gather = NULL, *d_scatter = NULL, *d_gather16 = NULL;
    void *d_send16 = NULL, *d_scatter16 = NULL;
    rc = be->ops->buf_alloc(be, sizeof(float) * cnt, &d_send);
    if (rc == 0)
        rc = be->ops->buf_alloc(be, sizeof(float) * cnt * W, &d_gather);
    if (rc == 0)
        rc = be->ops->buf_alloc(be, sizeof(float) * cnt, &d_scatter);
    if (rc == 0)
        rc = be->ops->buf_alloc(be, sizeof(uint16_t) * cnt * W, &d_gather16);
    if (rc == 0)
        rc = be->ops->buf_alloc(be, sizeof(uint16_t) * cnt, &d_send16);
    if (rc == 0)
        rc = be->ops->buf_alloc(be, sizeof(float) * (cnt / W), &d_scatter16);
    /* every rank joins every collective, even after a failure */
    if (d_send)
        be->ops->copy_h2d(be, d_send, j->send, sizeof(float) * cnt);
    int r1 = j->nccl->ops->all_gather(j->nccl, j->rank, d_send, d_gather, cnt, FSO_DT_F32, 0);
    int r2 = j->nccl->ops->reduce_scatter(j->nccl, j->rank, d_send, d_scatter, cnt / W);
    if (d_gather)
        be->ops->copy_d2h(be, j->dev_gather, d_gather, sizeof(float) * cnt * W);
    if (d_scatter)
        be->ops->copy_d2h(be, j->dev_scatter, d_scatter, sizeof(float) * (cnt / W));
    /* in place: rank r's part of the gather buffer is its send buffer */
    if (d_gather)
        be->ops->copy_h2d(be, (float *)d_gather + (size_t)j->rank * cnt, j->send,
                          sizeof(float) * cnt);
    int r3 = j->nccl->ops->all_gather(j->nccl, j->rank, (float *)d_gather + (size_t)j->rank * cnt,
                                      d_gather, cnt, FSO_DT_F32, 0);
    int r6 = j->nccl->ops->all_gather(j->nccl, j->rank, d_send, d_gather16, cnt, FSO_DT_BF16, 0);
    if (d_gather16)
        be->ops->copy_d2h(be, j->dev_gather16, d_gather16, sizeof(uint16_t) * cnt * W);
    /* half the pieces first, then all: the second call grows the rows the
     * first left, after the first is done with them */
    if (d_send16)
        be->ops->copy_h2d(be, d_send16, j->send16, sizeof(uint16_t) * cnt);
    int r7 = j->nccl->ops->reduce_scatter_bf16(j->nccl, j->rank, d_send16, d_scatter16,
                                               cnt / W / 2);
    int r8 = j->nccl->ops->reduce_scatter_bf16(j->nccl, j->rank, d_send16, d_scatter16, cnt / W);
    if (d_scatter16)
        be->ops->copy_d2h(be, j->dev_scatter16, d_scatter16, sizeof(float) * (cnt / W));
    int r4 = j->nccl->ops->all_reduce_f64(j->nccl, j->rank, j->f64, 3);
    int r5 = j->nccl->ops->barrier(j->nccl, j->rank);
    int rs = be->ops->sync(be);
    if (rc == 0)
        rc = r1 ? r1 : r2 ? r2 : r3 ? r3 : r4 ? r4 : r5 ? r5 : r6 ? r6 : r7 ? r7 : r8 ? r8 : rs;
    if (rc == 0 && d_gather) { /* the in-place gather equals the first */
        float *again = malloc(sizeof(float) * cnt * W);
        be->ops->copy_d2h(be, again, d_gather, sizeof(float) * cnt * W);
        rc = be->ops->sync(be);
        if (rc == 0 && memcmp(again, j->dev_gather, sizeof(float) * cnt * W) != 0)
            rc = -EBADMSG;
        free(again);
    }
    snprintf(j->err, sizeof j->err, "%s", be->err);
    be->ops->buf_free(be, d_send);
    be->ops->buf_free(be, d_gather);
    be->ops->buf_free(be, d_scatter);
    be->ops->buf_free(be, d_gather16);
    be->ops->buf_free(be, d_send16);
    be->ops->buf_free(be, d_scatter16);
    j->rc = rc;
    return NULL;
}

static void test_nccl_matches_the_thread_collectives(void **state)
{
    (void)state;
    char err[512] = "";
    int world = fso_cuda_device_count(err, sizeof err);
    if (world > MAXR)
        world = MAXR;
    if (world == 1)
        printf("NCCL: 1 GPU: the collectives run with one rank; the comparison across devices "
               "needs 2 or more\n");
    fso_backend *bes[MAXR] = {0};
    for (int r = 0; r < world; r++)
        assert_int_equal(fso_backend_create_cuda(&bes[r], r, 0, err, sizeof err), 0);
    fso_coll *nccl = NULL, *threads = NULL;
    if (fso_coll_create_nccl(&nccl, world, bes, err, sizeof err) != 0)
        fail_msg("fso_coll_create_nccl: %s", err);
    assert_string_equal(nccl->ops->name, "nccl");
    assert_int_equal(fso_coll_create_threads(&threads, world), 0);

    const size_t count = (size_t)world * 12345;
    struct rank_job jobs[MAXR];
    pthread_t tids[MAXR];
    for (int r = 0; r < world; r++) {
        struct rank_job *j = &jobs[r];
        memset(j, 0, sizeof *j);
        j->rank = r;
        j->world = world;
        j->nccl = nccl;
        j->threads = threads;
        j->be = bes[r];
        j->count = count;
        j->send = hrand(count, 1);
        j->host_gather = hbuf(count * world);
        j->host_scatter = hbuf(count / world);
        j->dev_gather = hbuf(count * world);
        j->dev_scatter = hbuf(count / world);
        j->host_gather16 = calloc(count * world, sizeof(uint16_t));
        j->dev_gather16 = calloc(count * world, sizeof(uint16_t));
        j->send16 = calloc(count, sizeof(uint16_t));
        j->host_scatter16 = hbuf(count / world);
        j->dev_scatter16 = hbuf(count / world);
        for (size_t i = 0; i < count; i++) /* rank order matters at these magnitudes */
            j->send16[i] = fso_bf16_from_f32(i % 3 == 0 && r == 0 ? j->send[i] * 0x1p20f
                                                                    : j->send[i]);
        j->f64[0] = 0.1 * (r + 1);
        j->f64[1] = 1e16 + r; /* rank order matters at this magnitude */
        j->f64[2] = -3.0 * r;
    }
    for (int r = 0; r < world; r++)
        assert_int_equal(pthread_create(&tids[r], NULL, rank_main, &jobs[r]), 0);
    for (int r = 0; r < world; r++)
        pthread_join(tids[r], NULL);
    for (int r = 0; r < world; r++) {
        struct rank_job *j = &jobs[r];
        if (j->rc != 0)
            fail_msg("rank %d: %s (%s)", r, strerror(-j->rc), j->err);
        compare_math("all_gather", 0, j->dev_gather, j->host_gather, count * world, 0);
        compare_math("reduce_scatter", 0, j->dev_scatter, j->host_scatter, count / world, 1e-6);
        if (memcmp(j->dev_gather16, j->host_gather16, sizeof(uint16_t) * count * world))
            fail_msg("rank %d: bf16 all_gather: NCCL and the thread collectives differ", r);
        /* the sum of bf16 pieces in fp32 in rank order: the same bits */
        for (size_t i = 0; i < count / world; i++)
            if (memcmp(&j->dev_scatter16[i], &j->host_scatter16[i], sizeof(float)))
                fail_msg("rank %d: reduce_scatter_bf16 element %zu: NCCL %a, threads %a", r, i,
                         j->dev_scatter16[i], j->host_scatter16[i]);
        assert_true(memcmp(j->f64, j->f64_threads, sizeof j->f64) == 0);
        assert_true(nccl->busy_ms[r] >= 0);
    }
    for (int r = 0; r < world; r++) {
        struct rank_job *j = &jobs[r];
        float *h[] = {j->send,        j->host_gather,    j->host_scatter,  j->dev_gather,
                      j->dev_scatter, j->host_scatter16, j->dev_scatter16};
        for (size_t i = 0; i < sizeof h / sizeof *h; i++)
            free(h[i]);
        free(j->host_gather16);
        free(j->dev_gather16);
        free(j->send16);
    }
    fso_coll_destroy(nccl);
    fso_coll_destroy(threads);
    for (int r = 0; r < world; r++)
        fso_backend_destroy_cuda(bes[r]);
}

/* ---------------------------------------------------------------- NCCL rails */

/* Boxes as threads of this process, box b on CUDA device b (the stand-in
 * shows two): each makes its end of the rail from the id box 0 made and
 * handed over, as MPI hands it between boxes (engine/boxes.h). */
#define RAIL_N 1000                 /* elements per box */
#define RAIL_BOXES_MAX 2
/* The stalled call's timeout: the rail's one timeout bounds its init too,
 * which on GPUs (NCCL's bootstrap and topology) takes a second or more. */
#define RAIL_STALL_TIMEOUT_S 3.0

struct rail_hand {                  /* box 0's id, handed to the others */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int made;                       /* 1: id is valid; -1: making it failed */
    unsigned char id[FSO_NCCL_ID_BYTES];
    int box0_done;                  /* the stall case: box 0 came back from its calls */
};

struct rail_job {
    int box, boxes;
    struct rail_hand *hand;
    double timeout_s;
    fso_rail_describe_fn describe;
    /* inputs, made by the test's thread */
    float *send;                    /* RAIL_N: all_gather's */
    float *send_rs;                 /* boxes * RAIL_N: reduce_scatter's */
    uint16_t *send16;               /* RAIL_N: bf16 all_gather's, in place */
    uint16_t *send_rs16;            /* boxes * RAIL_N: reduce_scatter_bf16's */
    double f64[3];
    /* results */
    float *gather, *scatter, *scatter16; /* boxes * RAIL_N, RAIL_N, RAIL_N */
    uint16_t *gather16;             /* boxes * RAIL_N */
    double busy_ms;
    int rc;                         /* first failure */
    double stall_ms;                /* the stall case: how long box 0's all_gather took */
    int stall_rc, after_rc;         /* its result and the next call's */
    char err[1024], stall_err[512], after_err[512]; /* err: the call's text and a message */
};

static float rail_widen(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Box 0 makes the id and hands it over; the others wait for it. */
static int rail_get_id(struct rail_job *j, unsigned char id[FSO_NCCL_ID_BYTES])
{
    struct rail_hand *h = j->hand;
    int rc = 0;
    if (j->box == 0)
        rc = fso_nccl_rail_id(id, j->err, sizeof j->err);
    pthread_mutex_lock(&h->mu);
    if (j->box == 0) {
        if (rc == 0)
            memcpy(h->id, id, FSO_NCCL_ID_BYTES);
        h->made = rc == 0 ? 1 : -1;
        pthread_cond_broadcast(&h->cv);
    }
    while (h->made == 0)
        pthread_cond_wait(&h->cv, &h->mu);
    if (h->made < 0 && j->box != 0) {
        snprintf(j->err, sizeof j->err, "box 0 could not make the rail's id");
        rc = -EIO;
    } else if (j->box != 0) {
        memcpy(id, h->id, FSO_NCCL_ID_BYTES);
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* Box j->box's backend on its own device and its end of the rail (NULL
 * when it could not be made). 0 or the first failure, with j->err. */
static int rail_open(struct rail_job *j, fso_backend **be, fso_coll **rail)
{
    unsigned char id[FSO_NCCL_ID_BYTES];
    int rc = fso_backend_create_cuda(be, j->box, 0, j->err, sizeof j->err);
    if (rc == 0)
        rc = rail_get_id(j, id);
    if (rc == 0 && (rc = fso_coll_create_nccl_rail(rail, j->box, j->boxes, j->box, id,
                                                   j->timeout_s, j->describe, j->err,
                                                   sizeof j->err)) != 0)
        *rail = NULL;
    return rc;
}

#define RAIL_TRY(call)                                                                         \
    do {                                                                                       \
        if (rc == 0 && (rc = (call)) != 0)                                                     \
            snprintf(j->err, sizeof j->err, "%s: %s", #call,                                   \
                     rail && rail->err[0] ? rail->err : be->err);                              \
    } while (0)

static void *rail_box_main(void *arg)
{
    struct rail_job *j = arg;
    const size_t N = RAIL_N, B = (size_t)j->boxes;
    fso_backend *be = NULL;
    fso_coll *rail = NULL;
    void *d_send = NULL, *d_gather = NULL, *d_rs = NULL, *d_scatter = NULL, *d_gather16 = NULL;
    void *d_rs16 = NULL, *d_scatter16 = NULL;
    int rc = rail_open(j, &be, &rail);
    RAIL_TRY(be->ops->buf_alloc(be, sizeof(float) * N, &d_send));
    RAIL_TRY(be->ops->buf_alloc(be, sizeof(float) * N * B, &d_gather));
    RAIL_TRY(be->ops->buf_alloc(be, sizeof(float) * N * B, &d_rs));
    RAIL_TRY(be->ops->buf_alloc(be, sizeof(float) * N, &d_scatter));
    RAIL_TRY(be->ops->buf_alloc(be, sizeof(uint16_t) * N * B, &d_gather16));
    RAIL_TRY(be->ops->buf_alloc(be, sizeof(uint16_t) * N * B, &d_rs16));
    RAIL_TRY(be->ops->buf_alloc(be, sizeof(float) * N, &d_scatter16));
    if (rc == 0) { /* the rail's calls start when called: send is written first */
        be->ops->copy_h2d(be, d_send, j->send, sizeof(float) * N);
        be->ops->copy_h2d(be, d_rs, j->send_rs, sizeof(float) * N * B);
        be->ops->copy_h2d(be, (uint16_t *)d_gather16 + (size_t)j->box * N, j->send16,
                          sizeof(uint16_t) * N);
        be->ops->copy_h2d(be, d_rs16, j->send_rs16, sizeof(uint16_t) * N * B);
    }
    RAIL_TRY(be->ops->sync(be));
    RAIL_TRY(rail->ops->all_gather(rail, j->box, d_send, d_gather, N, FSO_DT_F32, 0));
    RAIL_TRY(rail->ops->all_gather(rail, j->box, (uint16_t *)d_gather16 + (size_t)j->box * N,
                                   d_gather16, N, FSO_DT_BF16, 0));
    RAIL_TRY(rail->ops->reduce_scatter(rail, j->box, d_rs, d_scatter, N));
    /* half first, then all: the second call grows the rows */
    RAIL_TRY(rail->ops->reduce_scatter_bf16(rail, j->box, d_rs16, d_scatter16, N / 2));
    RAIL_TRY(rail->ops->reduce_scatter_bf16(rail, j->box, d_rs16, d_scatter16, N));
    RAIL_TRY(rail->ops->all_reduce_f64(rail, j->box, j->f64, 3));
    RAIL_TRY(rail->ops->barrier(rail, j->box));
    if (rc == 0) { /* a caller's mistake is refused, and the rail goes on */
        double many[65] = {0};
        if (rail->ops->all_reduce_f64(rail, j->box, many, 65) != -EINVAL ||
            !strstr(rail->err, "65 values") ||
            rail->ops->barrier(rail, (j->box + 1) % j->boxes) != (j->boxes > 1 ? -EINVAL : 0)) {
            snprintf(j->err, sizeof j->err, "bad arguments: %s", rail->err);
            rc = -EBADMSG;
        }
    }
    RAIL_TRY(rail->ops->barrier(rail, j->box));
    if (rc == 0) {
        be->ops->copy_d2h(be, j->gather, d_gather, sizeof(float) * N * B);
        be->ops->copy_d2h(be, j->gather16, d_gather16, sizeof(uint16_t) * N * B);
        be->ops->copy_d2h(be, j->scatter, d_scatter, sizeof(float) * N);
        be->ops->copy_d2h(be, j->scatter16, d_scatter16, sizeof(float) * N);
    }
    RAIL_TRY(be->ops->sync(be));
    if (rail)
        j->busy_ms = rail->busy_ms[j->box];
    j->rc = rc;
    fso_coll_destroy(rail);
    if (be) {
        void *bufs[] = {d_send, d_gather, d_rs, d_scatter, d_gather16, d_rs16, d_scatter16};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            be->ops->buf_free(be, bufs[i]);
        fso_backend_destroy_cuda(be);
    }
    return NULL;
}

static int rail_boxes(void)
{
    char err[256];
    int n = fso_cuda_device_count(err, sizeof err);
    return n >= RAIL_BOXES_MAX ? RAIL_BOXES_MAX : n;
}

static void test_nccl_rail_between_boxes_gives_exact_results(void **state)
{
    (void)state;
    const int boxes = rail_boxes();
    if (boxes == 1)
        printf("NCCL rail: 1 GPU: the rail runs with one box; across boxes needs 2 or more\n");
    const size_t N = RAIL_N, B = (size_t)boxes;
    struct rail_hand hand = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct rail_job jobs[RAIL_BOXES_MAX];
    pthread_t tids[RAIL_BOXES_MAX];
    for (int b = 0; b < boxes; b++) {
        struct rail_job *j = &jobs[b];
        *j = (struct rail_job){.box = b, .boxes = boxes, .hand = &hand, .timeout_s = 60};
        j->send = hrand(N, 1);
        j->send_rs = hrand(N * B, 1);
        j->send16 = hrand16(N, 1);
        j->send_rs16 = hrand16(N * B, b == 0 ? 0x1p20 : 1.0); /* the sum rounds */
        j->f64[0] = 0.1 * (b + 1);
        j->f64[1] = 1e16 + b;
        j->f64[2] = -3.0 * b;
        j->gather = hbuf(N * B);
        j->gather16 = hbuf16(N * B);
        j->scatter = hbuf(N);
        j->scatter16 = hbuf(N);
    }
    for (int b = 0; b < boxes; b++)
        assert_int_equal(pthread_create(&tids[b], NULL, rail_box_main, &jobs[b]), 0);
    for (int b = 0; b < boxes; b++)
        pthread_join(tids[b], NULL);
    for (int b = 0; b < boxes; b++) {
        struct rail_job *j = &jobs[b];
        if (j->rc != 0)
            fail_msg("box %d: %s (%s)", b, strerror(-j->rc), j->err);
        for (int k = 0; k < boxes; k++)
            for (size_t i = 0; i < N; i++) {
                if (memcmp(&j->gather[(size_t)k * N + i], &jobs[k].send[i], sizeof(float)))
                    fail_msg("box %d: all_gather element %zu of box %d: %a, sent %a", b, i, k,
                             j->gather[(size_t)k * N + i], jobs[k].send[i]);
                if (j->gather16[(size_t)k * N + i] != jobs[k].send16[i])
                    fail_msg("box %d: bf16 all_gather in place, element %zu of box %d: %04x, "
                             "sent %04x", b, i, k, j->gather16[(size_t)k * N + i],
                             jobs[k].send16[i]);
            }
        for (size_t i = 0; i < N; i++) {
            const size_t at = (size_t)b * N + i;
            float want = jobs[0].send_rs[at], want16 = rail_widen(jobs[0].send_rs16[at]);
            for (int k = 1; k < boxes; k++) { /* box order; for two boxes NCCL's one a+b */
                want += jobs[k].send_rs[at];
                want16 += rail_widen(jobs[k].send_rs16[at]);
            }
            if (memcmp(&j->scatter[i], &want, sizeof want))
                fail_msg("box %d: reduce_scatter element %zu: %a, want %a", b, i, j->scatter[i],
                         want);
            if (memcmp(&j->scatter16[i], &want16, sizeof want16))
                fail_msg("box %d: reduce_scatter_bf16 element %zu: %a, want %a (box order)", b,
                         i, j->scatter16[i], want16);
        }
        for (int v = 0; v < 3; v++) {
            double want = 0;
            for (int k = 0; k < boxes; k++)
                want += v == 0 ? 0.1 * (k + 1) : v == 1 ? 1e16 + k : -3.0 * k;
            if (memcmp(&j->f64[v], &want, sizeof want))
                fail_msg("box %d: all_reduce_f64 value %d: %.17g, want %.17g (box order)", b, v,
                         j->f64[v], want);
        }
        assert_true(j->busy_ms > 0);
    }
    for (int b = 0; b < boxes; b++) {
        struct rail_job *j = &jobs[b];
        free(j->send);
        free(j->send_rs);
        free(j->send16);
        free(j->send_rs16);
        free(j->gather);
        free(j->gather16);
        free(j->scatter);
        free(j->scatter16);
    }
}

/* What the boxes' heartbeat would say of a box (engine/boxes.c). */
static void rail_test_describe(int box, char *buf, size_t len)
{
    snprintf(buf, len, "box %d on host test-node: last heard 0.2 s ago, in its backward", box);
}

/* Box 0 calls all_gather, box 1 never does (it waits for box 0 to come
 * back, then destroys its end). */
static void *rail_stall_main(void *arg)
{
    struct rail_job *j = arg;
    struct rail_hand *h = j->hand;
    fso_backend *be = NULL;
    fso_coll *rail = NULL;
    void *d_send = NULL, *d_gather = NULL;
    int rc = rail_open(j, &be, &rail);
    RAIL_TRY(be->ops->buf_alloc(be, sizeof(float) * RAIL_N, &d_send));
    RAIL_TRY(be->ops->buf_alloc(be, sizeof(float) * RAIL_N * 2, &d_gather));
    if (rc == 0 && j->box == 0) {
        double t0 = fso_now_ms();
        j->stall_rc = rail->ops->all_gather(rail, 0, d_send, d_gather, RAIL_N, FSO_DT_F32, 0);
        j->stall_ms = fso_now_ms() - t0;
        snprintf(j->stall_err, sizeof j->stall_err, "%s", rail->err);
        j->after_rc = rail->ops->barrier(rail, 0);
        snprintf(j->after_err, sizeof j->after_err, "%s", rail->err);
    }
    pthread_mutex_lock(&h->mu); /* box 1 stays away until box 0 came back */
    if (j->box == 0 || rc != 0) {
        h->box0_done = 1;
        pthread_cond_broadcast(&h->cv);
    }
    while (!h->box0_done)
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    j->rc = rc;
    fso_coll_destroy(rail); /* box 1's end of a rail box 0 aborted: must not hang */
    if (be) {
        be->ops->buf_free(be, d_send);
        be->ops->buf_free(be, d_gather);
        fso_backend_destroy_cuda(be);
    }
    return NULL;
}

static void test_nccl_rail_stall_times_out_names_the_call_and_the_other_box(void **state)
{
    (void)state;
    if (rail_boxes() < 2) {
        printf("NCCL rail: a stalled box needs 2 GPUs; skipped\n");
        skip();
    }
    struct rail_hand hand = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct rail_job jobs[2];
    pthread_t tids[2];
    for (int b = 0; b < 2; b++) {
        jobs[b] = (struct rail_job){.box = b, .boxes = 2, .hand = &hand,
                                    .timeout_s = RAIL_STALL_TIMEOUT_S,
                                    .describe = rail_test_describe};
        assert_int_equal(pthread_create(&tids[b], NULL, rail_stall_main, &jobs[b]), 0);
    }
    for (int b = 0; b < 2; b++)
        pthread_join(tids[b], NULL);
    for (int b = 0; b < 2; b++)
        if (jobs[b].rc != 0)
            fail_msg("box %d: %s (%s)", b, strerror(-jobs[b].rc), jobs[b].err);
    const struct rail_job *j = &jobs[0];
    if (j->stall_rc != -ETIMEDOUT)
        fail_msg("box 0's all_gather that box 1 never joined: %d (%s), want -ETIMEDOUT",
                 j->stall_rc, j->stall_err);
    /* about the timeout: polled every millisecond, slower under sanitizers */
    const double want_ms = RAIL_STALL_TIMEOUT_S * 1000;
    if (j->stall_ms < want_ms * 0.9 || j->stall_ms > want_ms + 5000)
        fail_msg("the stalled all_gather returned after %.0f ms; timeout %.0f ms", j->stall_ms,
                 want_ms);
    if (!strstr(j->stall_err, "rail all_gather on CUDA device 0 (box 0 of 2)") ||
        !strstr(j->stall_err, "no progress") ||
        !strstr(j->stall_err, "box 1 on host test-node: last heard 0.2 s ago"))
        fail_msg("the stall's message names the call, the box and what box 1 was doing: %s",
                 j->stall_err);
    printf("NCCL rail: the stall's message: %s\n", j->stall_err);
    if (j->after_rc != -ECANCELED || !strstr(j->after_err, "rail barrier") ||
        !strstr(j->after_err, "aborted before"))
        fail_msg("the call after the stall: %d (%s), want -ECANCELED saying the rail was "
                 "aborted", j->after_rc, j->after_err);
}

static void test_nccl_rail_init_times_out_when_a_box_never_joins(void **state)
{
    (void)state;
    char err[512] = "";
    unsigned char id[FSO_NCCL_ID_BYTES];
    assert_int_equal(fso_nccl_rail_id(id, err, sizeof err), 0);
    fso_coll *rail = (fso_coll *)1;
    double t0 = fso_now_ms();
    int rc = fso_coll_create_nccl_rail(&rail, 0, 2, 0, id, 0.5, rail_test_describe, err,
                                       sizeof err); /* box 1 never makes its end */
    double ms = fso_now_ms() - t0;
    if (rc != -ETIMEDOUT)
        fail_msg("box 0 alone: %d (%s), want -ETIMEDOUT", rc, err);
    assert_null(rail);
    if (ms < 450 || ms > 20000) /* NCCL's own bootstrap may take a while to give up */
        fail_msg("box 0 alone gave up after %.0f ms; timeout 500 ms", ms);
    if (!strstr(err, "rail init on CUDA device 0 (box 0 of 2)") || !strstr(err, "no progress") ||
        !strstr(err, "box 1 on host test-node") || !strstr(err, "same id"))
        fail_msg("the message names the init, the box, what box 1 was doing and the fix: %s",
                 err);
    printf("NCCL rail: the init's message: %s\n", err);
    /* bad arguments say what was wrong before anything is made */
    assert_int_equal(fso_coll_create_nccl_rail(&rail, 0, 2, 2, id, 0.5, NULL, err, sizeof err),
                     -EINVAL);
    assert_non_null(strstr(err, "box 2 of 2"));
    assert_int_equal(fso_coll_create_nccl_rail(&rail, 0, 2, 0, id, -1, NULL, err, sizeof err),
                     -EINVAL);
    assert_non_null(strstr(err, "timeout"));
}

/* ---------------------------------------------------------------- training end to end */

/* Three steps of the small job (test_util.h) on `world` GPUs against the CPU
 * backend: same seed, data and placement. Declared tolerances on each
 * step's loss and gradient norm, relative: 1e-4 with fp32 matmuls, 3e-2 with
 * bf16 tensor cores (bf16 math, or bf16 parameters in either math). */
typedef struct train_trace {
    double loss[3], norm[3];
} train_trace;

static void train_small(const char *backend, int world, fso_tier param, fso_tier optim,
                        bool bf16, const char *nvme, fso_model_type type, train_trace *out)
{
    fso_config cfg;
    fso_test_small_model(&cfg, world, 4);
    cfg.model.model_type = type; /* qwen2: the q/k/v biases too */
    cfg.bf16 = bf16;
    cfg.offload.param_tier = param;
    cfg.offload.optim_tier = optim;
    snprintf(cfg.offload.param_nvme_path, sizeof cfg.offload.param_nvme_path, "%s", nvme);
    snprintf(cfg.offload.optim_nvme_path, sizeof cfg.offload.optim_nvme_path, "%s", nvme);
    cfg.backend = fso_backend_find(backend)->kind;
    if (strcmp(backend, "cuda") == 0)
        cfg.device_mem_bytes = 0; /* the GPU's free memory */
    fso_data data = {0};
    fso_trainer tr;
    if (fso_data_init(&data, &cfg) < 0)
        fail_msg("data: %s", data.err);
    if (fso_trainer_init(&tr, &cfg) < 0)
        fail_msg("%s, %d devices: %s", backend, world, tr.err);
    size_t bt = (size_t)cfg.micro_batch * cfg.data.seq_len, n = fso_trainer_step_tokens(&cfg);
    int32_t *in = malloc(sizeof(int32_t) * n), *tg = malloc(sizeof(int32_t) * n);
    for (int st = 0; st < 3; st++) {
        for (size_t a = 0; a < n / bt; a++)
            fso_data_next(&data, in + a * bt, tg + a * bt, NULL);
        fso_zero_step ss;
        if (fso_trainer_step(&tr, in, tg, NULL, &ss) < 0)
            fail_msg("%s, %d devices, step %d: %s", backend, world, st + 1, tr.err);
        out->loss[st] = ss.loss;
        out->norm[st] = ss.grad_norm;
        if (ss.stale_marks) /* the mark window holds a step, overlap is kept */
            fail_msg("%s, %d devices, step %d: %llu stale marks", backend, world, st + 1,
                     (unsigned long long)ss.stale_marks);
    }
    free(in);
    free(tg);
    fso_trainer_free(&tr);
    fso_data_free(&data);
}

static void test_training_matches_the_cpu_backend(void **state)
{
    (void)state;
    static const fso_tier tiers[][2] = {
        {FSO_TIER_DEVICE, FSO_TIER_DEVICE},
        {FSO_TIER_DEVICE, FSO_TIER_HOST},
        {FSO_TIER_HOST, FSO_TIER_HOST},
        {FSO_TIER_NVME, FSO_TIER_NVME},
    };
    char nvme[] = "/tmp/fso_test_cuda_XXXXXX";
    assert_non_null(mkdtemp(nvme));
    char err[256];
    int gpus = fso_cuda_device_count(err, sizeof err);
    for (int w = 1; w <= (gpus >= 2 ? 2 : 1); w++)
        for (size_t t = 0; t < sizeof tiers / sizeof tiers[0]; t++)
            for (int math = t == 0 ? 0 : 1; math < 2; math++) /* fp32 math once */
                for (int bf16 = 0; bf16 < 4; bf16++) { /* 2, 3: Qwen2, on the first tiers */
                    if (bf16 >= 2 && t != 0)
                        continue;
                    const fso_model_type type = bf16 >= 2 ? FSO_MODEL_QWEN2 : FSO_MODEL_LLAMA;
                    train_trace cpu, gpu;
                    setenv("FSO_CUDA_MATH", math == 0 ? "fp32" : "bf16", 1);
                    train_small("cpu", w, tiers[t][0], tiers[t][1], bf16 % 2, nvme, type, &cpu);
                    train_small("cuda", w, tiers[t][0], tiers[t][1], bf16 % 2, nvme, type, &gpu);
                    /* bf16 parameters multiply on the tensor cores whatever the
                     * math (cuda_matmul.c: bf16 operands, an fp32 dout rounded to
                     * bf16; attention's P and dS stored bf16): bf16's tolerance */
                    const double tol = math == 0 && bf16 % 2 == 0 ? 1e-4 : 3e-2;
                    for (int st = 0; st < 3; st++) {
                        double el = fabs(gpu.loss[st] - cpu.loss[st]) / fabs(cpu.loss[st]);
                        double en = fabs(gpu.norm[st] - cpu.norm[st]) / fabs(cpu.norm[st]);
                        if (!(el <= tol) || !(en <= tol))
                            fail_msg("%s%d GPUs, tiers %d/%d, %s matmuls, %s parameters, step "
                                     "%d: loss %.6f vs CPU %.6f, norm %.6f vs %.6f (tolerance %g)",
                                     bf16 >= 2 ? "Qwen2, " : "", w, tiers[t][0], tiers[t][1],
                                     math == 0 ? "fp32" : "bf16", bf16 % 2 ? "bf16" : "fp32",
                                     st + 1, gpu.loss[st], cpu.loss[st], gpu.norm[st],
                                     cpu.norm[st], tol);
                    }
                }
    unsetenv("FSO_CUDA_MATH");
    rmdir(nvme);
}

/* ---------------------------------------------------------------- setup */

static int setup(void **state)
{
    (void)state;
    char err[256] = "";
    fso_rng_seed(&rng, 42);
    unsetenv("FSO_CUDA_MATH");
    if (fso_backend_create(&ref, FSO_BACKEND_CPU_REF, 0, 1, 0, NULL, 0) < 0)
        return -1;
    for (int m = 0; m < 2; m++) {
        if (fso_backend_create_cuda(&cu[m], 0, 0, err, sizeof err) < 0) {
            fprintf(stderr, "test_cuda: %s\n", err);
            return -1;
        }
        fso_cuda_set_math(cu[m], m == 0 ? FSO_CUDA_MATH_FP32 : FSO_CUDA_MATH_BF16);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fso_backend_destroy(ref);
    fso_backend_destroy_cuda(cu[0]);
    fso_backend_destroy_cuda(cu[1]);
    return 0;
}

static int run_cuda_tests(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_matches_reference),
        cmocka_unit_test(test_rmsnorm_matches_reference),
        cmocka_unit_test(test_embedding_matches_reference_bit_for_bit),
        cmocka_unit_test(test_rope_matches_reference),
        cmocka_unit_test(test_attention_gqa_matches_reference),
        cmocka_unit_test(test_attention_mha_matches_reference),
        cmocka_unit_test(test_attention_with_documents_matches_reference),
        cmocka_unit_test(test_swiglu_and_add_match_reference),
        cmocka_unit_test(test_bias_matches_reference),
        cmocka_unit_test(test_matmul_bf16_matches_reference),
        cmocka_unit_test(test_rmsnorm_bf16_matches_reference),
        cmocka_unit_test(test_embedding_bf16_matches_reference_bit_for_bit),
        cmocka_unit_test(test_rope_bf16_matches_reference),
        cmocka_unit_test(test_attention_bf16_matches_reference),
        cmocka_unit_test(test_swiglu_bf16_matches_reference),
        cmocka_unit_test(test_cast_bf16_f32_matches_reference_bit_for_bit),
        cmocka_unit_test(test_cross_entropy_matches_reference),
        cmocka_unit_test(test_sqnorm_is_exact_and_the_same_bits_from_host_memory),
        cmocka_unit_test(test_sum_is_exact_and_delivered_by_a_later_mark),
        cmocka_unit_test(test_copy_marks_wait_for_copies),
        cmocka_unit_test(test_mark_frees_a_copy_source),
        cmocka_unit_test(test_adamw_matches_the_cpu_reference_bit_for_bit),
        cmocka_unit_test(test_cast_f32_bf16_matches_reference_bit_for_bit),
        cmocka_unit_test(test_copy_after_a_mark_keeps_the_order),
        cmocka_unit_test(test_stale_marks_are_counted_in_both_wait_modes),
        cmocka_unit_test(test_copies_and_ops_run_in_issue_order),
        cmocka_unit_test(test_memory_is_counted_and_capped),
        cmocka_unit_test(test_bad_token_is_reported_by_sync),
        cmocka_unit_test(test_gpu_info_describes_device_0),
        cmocka_unit_test(test_pinned_registration_round_trip),
        cmocka_unit_test(test_nccl_matches_the_thread_collectives),
        cmocka_unit_test(test_nccl_rail_between_boxes_gives_exact_results),
        cmocka_unit_test(test_nccl_rail_stall_times_out_names_the_call_and_the_other_box),
        cmocka_unit_test(test_nccl_rail_init_times_out_when_a_box_never_joins),
        cmocka_unit_test(test_training_matches_the_cpu_backend),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

#endif /* FSO_HAVE_CUDA */

int main(void)
{
    char why[512] = "";
    fso_test_filter_from_env();
    if (!peak_table_ok())
        return 1;
    if (fso_cuda_available(why, sizeof why) < 0) {
        printf("test_cuda: skipped: %s\n", why);
        return 77;
    }
#if FSO_HAVE_CUDA
    return run_cuda_tests();
#else
    return 77;
#endif
}
