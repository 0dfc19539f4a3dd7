/* cpu_backend.c — the fast CPU backend: OpenBLAS sgemm for the linear layers,
 * the backend's thread pool (pool.h) over rows or heads for everything else.
 *
 * Contract: the same results as cpu_ref.c within float rounding, and
 * bit-identical from run to run and for every thread count. Every loop splits
 * its work statically; where threads could race on an output (embedding and
 * norm-weight gradients, the key/value gradients of a head group) the split
 * is chosen so that each output element has exactly one writer and sums run
 * in a fixed order.
 *
 * Matmuls too: fsoff owns their decomposition (see "matmul" below). OpenBLAS
 * runs single-threaded (backend.c) inside the pool's workers, each call on a
 * tile whose shape depends only on the matrices, so no sum depends on how
 * many threads there are.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "cpu_common.h"
#include "pool.h"
#include "sum_order.h"

#define POOL(be) (((fso_cpu_ctx *)(be)->ctx)->pool)

/* ------------------------------------------------------------ embedding */

struct emb_args {
    float *out;
    const int32_t *tok;
    const float *w, *dout;
    int N, C;
};

static void emb_fwd_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct emb_args *a = a_;
    (void)worker;
    for (int64_t n = b; n < e; n++)
        memcpy(a->out + (size_t)n * a->C, a->w + (size_t)a->tok[n] * a->C, sizeof(float) * a->C);
}

static void fast_embedding_fwd(fso_backend *be, float *out, const int32_t *tok, const float *wte,
                               int N, int C)
{
    struct emb_args a = {.out = out, .tok = tok, .w = wte, .N = N, .C = C};
    fso_pool_for(POOL(be), N, 64, emb_fwd_range, &a);
}

/* Ranges of columns: each dwte element has one writer, rows in order. */
static void emb_bwd_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct emb_args *a = a_;
    (void)worker;
    for (int n = 0; n < a->N; n++) {
        float *dst = a->out + (size_t)a->tok[n] * a->C;
        const float *src = a->dout + (size_t)n * a->C;
        for (int64_t c = b; c < e; c++)
            dst[c] += src[c];
    }
}

static void fast_embedding_bwd(fso_backend *be, float *dwte, const int32_t *tok, const float *dout,
                               int N, int C)
{
    struct emb_args a = {.out = dwte, .tok = tok, .dout = dout, .N = N, .C = C};
    fso_pool_for(POOL(be), C, 64, emb_bwd_range, &a);
}

/* ------------------------------------------------------------ rmsnorm */

struct rms_args {
    float *out, *rstd, *dx, *dw;
    const float *x, *w, *dout, *rstd_in;
    int N, C;
    float eps;
};

static void rms_fwd_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct rms_args *a = a_;
    const int C = a->C;
    (void)worker;
    for (int64_t n = b; n < e; n++) {
        const float *xr = a->x + (size_t)n * C;
        float *o = a->out + (size_t)n * C;
        float ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++)
            ss += xr[c] * xr[c];
        float r = 1.0f / sqrtf(ss / C + a->eps);
        a->rstd[n] = r;
        for (int c = 0; c < C; c++)
            o[c] = xr[c] * r * a->w[c];
    }
}

static void fast_rmsnorm_fwd(fso_backend *be, float *out, float *rstd, const float *x,
                             const float *w, int N, int C, float eps)
{
    struct rms_args a = {.out = out, .rstd = rstd, .x = x, .w = w, .N = N, .C = C, .eps = eps};
    fso_pool_for(POOL(be), N, 16, rms_fwd_range, &a);
}

static void rms_bwd_dx_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct rms_args *a = a_;
    const int C = a->C;
    const float *w = a->w;
    (void)worker;
    for (int64_t n = b; n < e; n++) {
        const float *xr = a->x + (size_t)n * C, *dy = a->dout + (size_t)n * C;
        float *dxr = a->dx + (size_t)n * C;
        float r = a->rstd_in[n], dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < C; c++)
            dot += w[c] * dy[c] * xr[c];
        float k = r * r * r * dot / C;
        for (int c = 0; c < C; c++)
            dxr[c] += r * w[c] * dy[c] - xr[c] * k;
    }
}

/* Ranges of columns, rows summed in order. */
static void rms_bwd_dw_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct rms_args *a = a_;
    const int C = a->C;
    (void)worker;
    for (int64_t c0 = b; c0 < e; c0 += 64) {
        int64_t c1 = c0 + 64 < e ? c0 + 64 : e;
        float acc[64] = {0};
        for (int n = 0; n < a->N; n++) {
            const float *xr = a->x + (size_t)n * C, *dy = a->dout + (size_t)n * C;
            float r = a->rstd_in[n];
            for (int64_t c = c0; c < c1; c++)
                acc[c - c0] += dy[c] * xr[c] * r;
        }
        for (int64_t c = c0; c < c1; c++)
            a->dw[c] += acc[c - c0];
    }
}

static void fast_rmsnorm_bwd(fso_backend *be, float *dx, float *dw, const float *dout,
                             const float *x, const float *w, const float *rstd, int N, int C)
{
    struct rms_args a = {.dx = dx, .dw = dw, .x = x, .w = w, .dout = dout, .rstd_in = rstd,
                         .N = N, .C = C};
    fso_pool_for(POOL(be), N, 16, rms_bwd_dx_range, &a);
    fso_pool_for(POOL(be), C, 64, rms_bwd_dw_range, &a);
}

/* ------------------------------------------------------------ matmul */

/* A row-major C (M, N) = op(A) op(B) + beta C, alpha 1, is cut into tiles of
 * at most tm x tn output elements; each tile is one cblas_sgemm over the
 * whole K on single-threaded OpenBLAS, and the pool's static split hands the
 * tiles to the threads. The tile shape is a function of (M, N) alone, so
 * every output element is computed by the same call, with the same shape and
 * the same operands, whatever the thread count: its sum has one order.
 *
 * OpenBLAS's own threading gives no such promise: its threaded driver blocks
 * K differently from its single-threaded one and splits the columns by its
 * thread count (measured: 1 and 3 threads gave different losses), and it
 * serialises concurrent callers (several virtual devices) on one lock.
 *
 * The shape: up to TILE_M_MAX x TILE_N_MAX (a single-threaded call within a
 * few percent of one call over the whole matrix), halved, larger side first,
 * while the matrix gives fewer than TILES_WANTED tiles and both sides stay
 * at least TILE_MIN, so small matrices still spread over several threads.
 * Each tile packs its own operands, so more tiles cost more: on one thread
 * the default job took 5% more CPU time with TILES_WANTED 8 than untiled (16:
 * 8%, 4: 1.5%); 8 keeps 2, 4 and 8 threads evenly loaded on small matrices.
 * Sides are multiples of TILE_ALIGN (OpenBLAS's register blocks). */
#define TILE_M_MAX 256
#define TILE_N_MAX 1024
#define TILE_MIN 64
#define TILE_ALIGN 16
#define TILES_WANTED 8

static int ceil_div(int a, int b)
{
    return (a + b - 1) / b;
}

/* Half of side, rounded up to TILE_ALIGN; side itself when that is under TILE_MIN. */
static int half_side(int side)
{
    int h = ceil_div(ceil_div(side, 2), TILE_ALIGN) * TILE_ALIGN;
    return h >= TILE_MIN && h < side ? h : side;
}

static void tile_shape(int M, int N, int *tm, int *tn)
{
    int a = M < TILE_M_MAX ? M : TILE_M_MAX, b = N < TILE_N_MAX ? N : TILE_N_MAX;
    while ((int64_t)ceil_div(M, a) * ceil_div(N, b) < TILES_WANTED) {
        int ha = half_side(a), hb = half_side(b);
        if (hb < b && (b >= a || ha == a))
            b = hb;
        else if (ha < a)
            a = ha;
        else
            break;
    }
    *tm = a;
    *tn = b;
}

struct gemm_args {
    enum CBLAS_TRANSPOSE ta, tb;
    int M, N, K, tm, tn, tiles_n;
    const float *A, *B;
    float *C;
    int lda, ldb, ldc;
    float beta;
};

static void gemm_tile_range(void *a_, int64_t t0, int64_t t1, int worker)
{
    const struct gemm_args *g = a_;
    (void)worker;
    for (int64_t t = t0; t < t1; t++) {
        int m0 = (int)(t / g->tiles_n) * g->tm, n0 = (int)(t % g->tiles_n) * g->tn;
        int m = g->M - m0 < g->tm ? g->M - m0 : g->tm, n = g->N - n0 < g->tn ? g->N - n0 : g->tn;
        const float *a = g->ta == CblasNoTrans ? g->A + (size_t)m0 * g->lda : g->A + m0;
        const float *b = g->tb == CblasNoTrans ? g->B + n0 : g->B + (size_t)n0 * g->ldb;
        cblas_sgemm(CblasRowMajor, g->ta, g->tb, m, n, g->K, 1.0f, a, g->lda, b, g->ldb,
                    g->beta, g->C + (size_t)m0 * g->ldc + n0, g->ldc);
    }
}

/* C (M, N) = op(A) (M, K) op(B) (K, N) + beta C, every matrix row-major with
 * leading dimensions as for cblas_sgemm. */
static void tiled_sgemm(fso_pool *pool, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M,
                        int N, int K, const float *A, int lda, const float *B, int ldb, float beta,
                        float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    struct gemm_args g = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .A = A, .B = B, .C = C,
                          .lda = lda, .ldb = ldb, .ldc = ldc, .beta = beta};
    tile_shape(M, N, &g.tm, &g.tn);
    g.tiles_n = ceil_div(N, g.tn);
    fso_pool_for(pool, (int64_t)ceil_div(M, g.tm) * g.tiles_n, 1, gemm_tile_range, &g);
}

static void fast_matmul_fwd(fso_backend *be, float *out, const float *x, const float *w,
                            int N, int Cin, int Cout)
{
    tiled_sgemm(POOL(be), CblasNoTrans, CblasTrans, N, Cout, Cin, x, Cin, w, Cin, 0.0f, out,
                Cout);
}

static void fast_matmul_bwd(fso_backend *be, float *dx, float *dw, const float *dout,
                            const float *x, const float *w, int N, int Cin, int Cout,
                            float dx_beta)
{
    if (dx)
        tiled_sgemm(POOL(be), CblasNoTrans, CblasNoTrans, N, Cin, Cout, dout, Cout, w, Cin,
                    dx_beta, dx, Cin);
    tiled_sgemm(POOL(be), CblasTrans, CblasNoTrans, Cout, Cin, N, dout, Cout, x, Cin, 1.0f, dw,
                Cin);
}

/* ------------------------------------------------------------ rope */

struct rope_args {
    float *x;
    const float *cos, *sin;
    const int32_t *pos;   /* (B*T) or NULL: t */
    int T, nh, D;
    float sgn;
};

static void rope_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct rope_args *a = a_;
    const int half = a->D / 2;
    (void)worker;
    for (int64_t bt = b; bt < e; bt++) { /* row = (batch, position) */
        int t = a->pos ? a->pos[bt] : (int)(bt % a->T);
        const float *ct = a->cos + (size_t)t * half, *st = a->sin + (size_t)t * half;
        for (int h = 0; h < a->nh; h++) {
            float *v = a->x + ((size_t)bt * a->nh + h) * a->D;
            for (int i = 0; i < half; i++) {
                float c = ct[i], s = a->sgn * st[i];
                float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * c - x2 * s;
                v[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

static void fast_rope(fso_backend *be, float *x, const float *cos_t, const float *sin_t,
                      const int32_t *pos, int B, int T, int nh, int D, int inverse)
{
    struct rope_args a = {.x = x, .cos = cos_t, .sin = sin_t, .pos = pos, .T = T, .nh = nh,
                          .D = D, .sgn = inverse ? -1.0f : 1.0f};
    fso_pool_for(POOL(be), (int64_t)B * T, 16, rope_range, &a);
}

/* ------------------------------------------------------------ attention */

struct att_args {
    float *out, *probs, *dq, *dk, *dv;
    const float *q, *k, *v, *dout, *probs_in;
    const int32_t *pos;   /* (B*T) or NULL: one document a row */
    int B, T, H, Hkv, D;
};

/* The first key token t of row b attends to: its document's first. */
static inline int att_first(const struct att_args *a, int b, int t)
{
    return a->pos ? t - a->pos[(size_t)b * a->T + t] : 0;
}

static inline float dotf(const float *a, const float *b, int D)
{
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < D; d++)
        s += a[d] * b[d];
    return s;
}

/* One (batch, query head) per item; rows of probs past the diagonal are 0. */
static void att_fwd_range(void *a_, int64_t b0, int64_t e0, int worker)
{
    struct att_args *a = a_;
    const int T = a->T, H = a->H, Hkv = a->Hkv, D = a->D, group = H / Hkv;
    const float scale = 1.0f / sqrtf((float)D);
    (void)worker;
    for (int64_t bh = b0; bh < e0; bh++) {
        int b = (int)(bh / H), h = (int)(bh % H), hk = h / group;
        for (int t = 0; t < T; t++) {
            const float *qt = a->q + (((size_t)b * T + t) * H + h) * D;
            float *p = a->probs + (((size_t)b * H + h) * T + t) * T;
            const int s0 = att_first(a, b, t);
            float mx = -INFINITY;
            if (s0 > 0)
                memset(p, 0, sizeof(float) * (size_t)s0);
            for (int s = s0; s <= t; s++) {
                float sc = dotf(qt, a->k + (((size_t)b * T + s) * Hkv + hk) * D, D) * scale;
                p[s] = sc;
                mx = sc > mx ? sc : mx;
            }
            float sum = 0;
            for (int s = s0; s <= t; s++) {
                p[s] = expf(p[s] - mx);
                sum += p[s];
            }
            float inv = 1.0f / sum;
            for (int s = s0; s <= t; s++)
                p[s] *= inv;
            if (t + 1 < T)
                memset(p + t + 1, 0, sizeof(float) * (size_t)(T - t - 1));
            float *ot = a->out + (((size_t)b * T + t) * H + h) * D;
            memset(ot, 0, sizeof(float) * D);
            for (int s = s0; s <= t; s++) {
                const float *vs = a->v + (((size_t)b * T + s) * Hkv + hk) * D;
                float ps = p[s];
#pragma omp simd
                for (int d = 0; d < D; d++)
                    ot[d] += ps * vs[d];
            }
        }
    }
}

static void fast_attention_fwd(fso_backend *be, float *out, float *probs, const float *q,
                               const float *k, const float *v, const int32_t *pos, int B, int T,
                               int H, int Hkv, int D)
{
    struct att_args a = {.out = out, .probs = probs, .q = q, .k = k, .v = v, .pos = pos,
                         .B = B, .T = T, .H = H, .Hkv = Hkv, .D = D};
    fso_pool_for(POOL(be), (int64_t)B * H, 1, att_fwd_range, &a);
}

/* One (batch, kv head) per item, so the group's dk and dv have one writer. */
static void att_bwd_range(void *a_, int64_t b0, int64_t e0, int worker)
{
    struct att_args *a = a_;
    const int T = a->T, H = a->H, Hkv = a->Hkv, D = a->D, group = H / Hkv;
    const float scale = 1.0f / sqrtf((float)D);
    float dp[T]; /* T is bounded by max_position_embeddings */
    (void)worker;
    for (int64_t bk = b0; bk < e0; bk++) {
        int b = (int)(bk / Hkv), hk = (int)(bk % Hkv);
        for (int s = 0; s < T; s++) {
            memset(a->dk + (((size_t)b * T + s) * Hkv + hk) * D, 0, sizeof(float) * D);
            memset(a->dv + (((size_t)b * T + s) * Hkv + hk) * D, 0, sizeof(float) * D);
        }
        for (int h = hk * group; h < (hk + 1) * group; h++)
            for (int t = 0; t < T; t++) {
                const float *p = a->probs_in + (((size_t)b * H + h) * T + t) * T;
                const float *dot_ = a->dout + (((size_t)b * T + t) * H + h) * D;
                const float *qt = a->q + (((size_t)b * T + t) * H + h) * D;
                float *dqt = a->dq + (((size_t)b * T + t) * H + h) * D;
                const int s0 = att_first(a, b, t);
                float rowsum = 0;
                for (int s = s0; s <= t; s++) {
                    dp[s] = dotf(dot_, a->v + (((size_t)b * T + s) * Hkv + hk) * D, D);
                    rowsum += p[s] * dp[s];
                }
                memset(dqt, 0, sizeof(float) * D);
                for (int s = s0; s <= t; s++) {
                    float ds = p[s] * (dp[s] - rowsum) * scale, ps = p[s];
                    const float *ks = a->k + (((size_t)b * T + s) * Hkv + hk) * D;
                    float *dks = a->dk + (((size_t)b * T + s) * Hkv + hk) * D;
                    float *dvs = a->dv + (((size_t)b * T + s) * Hkv + hk) * D;
#pragma omp simd
                    for (int d = 0; d < D; d++) {
                        dqt[d] += ds * ks[d];
                        dks[d] += ds * qt[d];
                        dvs[d] += ps * dot_[d];
                    }
                }
            }
    }
}

static void fast_attention_bwd(fso_backend *be, float *dq, float *dk, float *dv, const float *dout,
                               const float *probs, const float *q, const float *k, const float *v,
                               const int32_t *pos, int B, int T, int H, int Hkv, int D)
{
    struct att_args a = {.dq = dq, .dk = dk, .dv = dv, .dout = dout, .probs_in = probs,
                         .pos = pos,
                         .q = q, .k = k, .v = v, .B = B, .T = T, .H = H, .Hkv = Hkv, .D = D};
    fso_pool_for(POOL(be), (int64_t)B * Hkv, 1, att_bwd_range, &a);
}

/* ------------------------------------------------------------ elementwise */

struct ew_args {
    float *o1, *o2;
    const float *a, *b, *c;
};

static void swiglu_fwd_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct ew_args *a = a_;
    (void)worker;
    for (int64_t i = b; i < e; i++) {
        float g = a->a[i];
        a->o1[i] = g / (1.0f + expf(-g)) * a->b[i];
    }
}

static void fast_swiglu_fwd(fso_backend *be, float *out, const float *gate, const float *up,
                            size_t n)
{
    struct ew_args a = {.o1 = out, .a = gate, .b = up};
    fso_pool_for(POOL(be), (int64_t)n, 4096, swiglu_fwd_range, &a);
}

static void swiglu_bwd_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct ew_args *a = a_;
    (void)worker;
    for (int64_t i = b; i < e; i++) {
        float g = a->b[i], sg = 1.0f / (1.0f + expf(-g)), dy = a->a[i], u = a->c[i];
        a->o2[i] = dy * g * sg;
        a->o1[i] = dy * u * sg * (1.0f + g * (1.0f - sg));
    }
}

static void fast_swiglu_bwd(fso_backend *be, float *dgate, float *dup, const float *dout,
                            const float *gate, const float *up, size_t n)
{
    struct ew_args a = {.o1 = dgate, .o2 = dup, .a = dout, .b = gate, .c = up};
    fso_pool_for(POOL(be), (int64_t)n, 4096, swiglu_bwd_range, &a);
}

/* ------------------------------------------------------------ bias */

struct bias_args {
    float *out;
    const float *b;
    int N, C;
};

static void bias_add_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct bias_args *a = a_;
    (void)worker;
    for (int64_t n = b; n < e; n++) {
        float *o = a->out + (size_t)n * a->C;
#pragma omp simd
        for (int c = 0; c < a->C; c++)
            o[c] += a->b[c];
    }
}

static void fast_bias_add(fso_backend *be, float *out, const float *b, int N, int C)
{
    struct bias_args a = {.out = out, .b = b, .N = N, .C = C};
    fso_pool_for(POOL(be), N, 64, bias_add_range, &a);
}

/* Ranges of columns, rows summed in order: each db element has one writer. */
static void bias_bwd_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct bias_args *a = a_;
    (void)worker;
    for (int64_t c0 = b; c0 < e; c0 += 64) {
        int64_t c1 = c0 + 64 < e ? c0 + 64 : e;
        float acc[64] = {0};
        for (int n = 0; n < a->N; n++) {
            const float *dy = a->b + (size_t)n * a->C;
            for (int64_t c = c0; c < c1; c++)
                acc[c - c0] += dy[c];
        }
        for (int64_t c = c0; c < c1; c++)
            a->out[c] += acc[c - c0];
    }
}

static void fast_bias_bwd(fso_backend *be, float *db, const float *dout, int N, int C)
{
    struct bias_args a = {.out = db, .b = dout, .N = N, .C = C};
    fso_pool_for(POOL(be), C, 64, bias_bwd_range, &a);
}

static void add_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct ew_args *a = a_;
    (void)worker;
    for (int64_t i = b; i < e; i++)
        a->o1[i] = a->a[i] + a->b[i];
}

static void fast_add(fso_backend *be, float *out, const float *x, const float *y, size_t n)
{
    struct ew_args a = {.o1 = out, .a = x, .b = y};
    fso_pool_for(POOL(be), (int64_t)n, 16384, add_range, &a);
}

/* ------------------------------------------------------------ cross-entropy */

struct ce_args {
    float *dl, *losses;
    const float *logits;
    const int32_t *targets;
    int V;
    float dscale;
};

static void ce_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct ce_args *a = a_;
    const int V = a->V;
    (void)worker;
    for (int64_t n = b; n < e; n++) {
        const float *l = a->logits + (size_t)n * V;
        float *dl = a->dl + (size_t)n * V;
        if (a->targets[n] < 0) { /* does not count */
            a->losses[n] = 0.0f;
            memset(dl, 0, sizeof(float) * (size_t)V);
            continue;
        }
        float mx = -INFINITY;
        for (int j = 0; j < V; j++)
            mx = l[j] > mx ? l[j] : mx;
        double sum = 0;
        for (int j = 0; j < V; j++)
            sum += expf(l[j] - mx);
        float lse = mx + (float)log(sum);
        int tgt = a->targets[n];
        a->losses[n] = lse - l[tgt];
        for (int j = 0; j < V; j++)
            dl[j] = expf(l[j] - lse) * a->dscale;
        dl[tgt] -= a->dscale;
    }
}

static void fast_cross_entropy(fso_backend *be, float *dlogits, float *losses, const float *logits,
                               const int32_t *targets, int N, int V, float dscale)
{
    struct ce_args a = {.dl = dlogits, .losses = losses, .logits = logits, .targets = targets,
                        .V = V, .dscale = dscale};
    fso_pool_for(POOL(be), N, 4, ce_range, &a);
}

/* ------------------------------------------------------------ sqnorm, sum */

/* The order of sum_order.h, its chunks spread over the pool: the result
 * does not depend on the thread count. */
#define SUM_BATCH FSO_SUM_LANES /* chunks per pass: partial sums on the stack */

/* One pass over up to SUM_BATCH chunks from chunk first_chunk of n
 * elements: each chunk's sum lands in part (NULL: none taken). The first
 * member of every chunked loop's arguments. */
struct chunk_pass {
    size_t n, first_chunk;
    double *part;
};

struct sq_args {
    struct chunk_pass c;
    const float *x;
    bool square;
};

/* elements of a chunk taken at a time: a multiple of FSO_SUM_LANES */
#define SUM_SLICE 2048

/* Four whole chunks side by side, a slice of each in turn, each into its
 * own lanes (the bits of fso_sum_chunk): four streams from memory keep more
 * reads in flight than one, as the old front-to-back sums did. */
static void sum_four_chunks(const float *x, bool square, double part[4])
{
    double lane[4][FSO_SUM_LANES] = {{0}};
    for (size_t o = 0; o < FSO_SUM_CHUNK; o += SUM_SLICE)
        for (int k = 0; k < 4; k++)
            fso_sum_lanes_add(lane[k], x + (size_t)k * FSO_SUM_CHUNK + o, SUM_SLICE, square);
    for (int k = 0; k < 4; k++)
        part[k] = fso_sum_tree(lane[k]);
}

static void sq_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct sq_args *a = a_;
    (void)worker;
    for (int64_t c = b; c < e;) {
        const size_t i0 = (a->c.first_chunk + (size_t)c) * FSO_SUM_CHUNK;
        if (c + 4 <= e && i0 + 4 * FSO_SUM_CHUNK <= a->c.n) {
            sum_four_chunks(a->x + i0, a->square, &a->c.part[c]);
            c += 4;
            continue;
        }
        const size_t len = a->c.n - i0 < FSO_SUM_CHUNK ? a->c.n - i0 : FSO_SUM_CHUNK;
        a->c.part[c++] = fso_sum_chunk(a->x + i0, len, a->square);
    }
}

/* Every chunk of n elements, SUM_BATCH at a time, through fn (args begins
 * with a chunk_pass); with out, *out += the chunks' sums combined in
 * sum_order.h's order. A pass starts at a multiple of FSO_SUM_LANES chunks,
 * so its chunk c goes to slot c. */
static void chunk_passes(fso_pool *pool, size_t n, fso_pool_fn fn, void *args, double *out)
{
    struct chunk_pass *cp = args;
    const size_t nchunks = fso_sum_chunks(n);
    double part[SUM_BATCH], slot[FSO_SUM_LANES] = {0};
    for (size_t c0 = 0; c0 < nchunks; c0 += SUM_BATCH) {
        const size_t m = nchunks - c0 < SUM_BATCH ? nchunks - c0 : SUM_BATCH;
        *cp = (struct chunk_pass){.n = n, .first_chunk = c0, .part = out ? part : NULL};
        fso_pool_for(pool, (int64_t)m, 1, fn, args);
        for (size_t c = 0; out && c < m; c++)
            slot[c] += part[c];
    }
    if (out && nchunks)
        *out += fso_sum_tree(slot);
}

void fso_host_sqnorm(fso_pool *pool, double *out, const float *x, size_t n)
{
    struct sq_args a = {.x = x, .square = true};
    chunk_passes(pool, n, sq_range, &a, out);
}

void fso_host_sum(fso_pool *pool, double *out, const float *x, size_t n)
{
    struct sq_args a = {.x = x, .square = false};
    chunk_passes(pool, n, sq_range, &a, out);
}

struct rsq_args {
    struct chunk_pass c;
    float *dst;
    const float *const *src;
    int nsrc;
    bool accumulate;
};

/* Elements [i0, i1) of dst: the sum of the sources in their order, added
 * to dst when accumulating. dst may be one of the sources: element i is
 * read before it is written. */
static void rsq_sum(const struct rsq_args *a, size_t i0, size_t i1)
{
    float *d = a->dst;
    if (a->nsrc == 2) {
        const float *x = a->src[0], *y = a->src[1];
        if (a->accumulate)
            for (size_t i = i0; i < i1; i++)
                d[i] = d[i] + (x[i] + y[i]);
        else
            for (size_t i = i0; i < i1; i++)
                d[i] = x[i] + y[i];
        return;
    }
    for (size_t i = i0; i < i1; i++) {
        float t = a->src[0][i];
        for (int k = 1; k < a->nsrc; k++)
            t += a->src[k][i];
        d[i] = a->accumulate ? d[i] + t : t;
    }
}


/* Chunk by chunk: the sources summed into dst (rsq_sum), then, with part,
 * the chunk's squares into its lanes a slice at a time while the slice is
 * in L1: the bits of fso_sum_chunk. */
static void rsq_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct rsq_args *a = a_;
    (void)worker;
    for (int64_t c = b; c < e; c++) {
        const size_t i0 = (a->c.first_chunk + (size_t)c) * FSO_SUM_CHUNK;
        const size_t i1 = i0 + FSO_SUM_CHUNK < a->c.n ? i0 + FSO_SUM_CHUNK : a->c.n;
        if (!a->c.part) {
            rsq_sum(a, i0, i1);
            continue;
        }
        double lane[FSO_SUM_LANES] = {0};
        for (size_t from = i0; from < i1; from += SUM_SLICE) {
            const size_t to = from + SUM_SLICE < i1 ? from + SUM_SLICE : i1;
            rsq_sum(a, from, to);
            fso_sum_lanes_add(lane, a->dst + from, to - from, true);
        }
        a->c.part[c] = fso_sum_tree(lane);
    }
}

void fso_host_reduce_sqnorm(struct fso_pool *pool, float *dst, const float *const *src, int nsrc,
                            size_t n, bool accumulate, double *sq)
{
    struct rsq_args a = {.dst = dst, .src = src, .nsrc = nsrc, .accumulate = accumulate};
    chunk_passes(pool, n, rsq_range, &a, sq);
}

static void fast_sqnorm(fso_backend *be, double *out, const float *x, size_t n)
{
    fso_host_sqnorm(POOL(be), out, x, n);
}

/* ------------------------------------------------------------ casts */

struct cast_args {
    float *dst;
    const uint16_t *src;
};

static void cast_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct cast_args *a = a_;
    (void)worker;
#pragma omp simd
    for (int64_t i = b; i < e; i++)
        a->dst[i] = fso_f32_from_bf16(a->src[i]);
}

/* A whole block's parameters per call: worth the pool above a few pages. */
static void fast_cast_bf16_f32(fso_backend *be, float *dst, const uint16_t *src, size_t n)
{
    struct cast_args a = {.dst = dst, .src = src};
    fso_pool_for(POOL(be), (int64_t)n, 32768, cast_range, &a);
}

struct narrow_args {
    uint16_t *dst;
    const float *src;
};

/* Round to nearest even, NaNs kept and made quiet (fso_bf16_from_f32, as
 * the reference). */
static void narrow_range(void *a_, int64_t b, int64_t e, int worker)
{
    struct narrow_args *a = a_;
    (void)worker;
#pragma omp simd
    for (int64_t i = b; i < e; i++)
        a->dst[i] = fso_bf16_from_f32(a->src[i]);
}

static void fast_cast_f32_bf16(fso_backend *be, uint16_t *dst, const float *src, size_t n)
{
    struct narrow_args a = {.dst = dst, .src = src};
    fso_pool_for(POOL(be), (int64_t)n, 32768, narrow_range, &a);
}

const fso_cpu_kernels fso_cpu_fast_kernels = {
    .embedding_fwd = fast_embedding_fwd,
    .rmsnorm_fwd = fast_rmsnorm_fwd,
    .rmsnorm_bwd = fast_rmsnorm_bwd,
    .matmul_fwd = fast_matmul_fwd,
    .matmul_bwd = fast_matmul_bwd,
    .rope = fast_rope,
    .attention_fwd = fast_attention_fwd,
    .attention_bwd = fast_attention_bwd,
    .swiglu_fwd = fast_swiglu_fwd,
    .swiglu_bwd = fast_swiglu_bwd,
    .bias_add = fast_bias_add,
    .bias_bwd = fast_bias_bwd,
};

const fso_backend_ops fso_cpu_fast_ops = {
    .name = "cpu",
    FSO_CPU_SHARED_OPS,
    .embedding_bwd = fast_embedding_bwd,
    .add = fast_add,
    .cross_entropy = fast_cross_entropy,
    .sqnorm = fast_sqnorm,
    .cast_bf16_f32 = fast_cast_bf16_f32,
    .cast_f32_bf16 = fast_cast_f32_bf16,
};
