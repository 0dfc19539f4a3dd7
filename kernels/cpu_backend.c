/* cpu_backend.c — the fast CPU backend: OpenBLAS sgemm for the linear layers,
 * OpenMP threads over rows or heads for everything else.
 *
 * Contract: the same results as cpu_ref.c within float rounding, and
 * bit-identical from run to run for a given thread count. Every parallel loop
 * partitions work statically so that no sum depends on thread timing; where
 * threads would race on an output (embedding and norm-weight gradients, the
 * key/value gradients of a head group) the partition is chosen so each
 * output element has exactly one writer. sqnorm sums fixed-size chunks in
 * order, so its result does not even depend on the thread count.
 *
 * OpenBLAS runs its own threads; it is only ever called from the driving
 * thread, never inside an OpenMP region.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "cpu_common.h"

static void fast_embedding_fwd(fso_backend *be, float *out, const int32_t *tok, const float *wte,
                               int N, int C)
{
#pragma omp parallel for schedule(static) num_threads(be->threads)
    for (int n = 0; n < N; n++)
        memcpy(out + (size_t)n * C, wte + (size_t)tok[n] * C, sizeof(float) * C);
}

/* Threads split the columns: each dwte element has one writer, rows in order. */
static void fast_embedding_bwd(fso_backend *be, float *dwte, const int32_t *tok, const float *dout,
                               int N, int C)
{
    int nchunks = (C + 63) / 64;
#pragma omp parallel for schedule(static) num_threads(be->threads)
    for (int ch = 0; ch < nchunks; ch++) {
        int c0 = ch * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
        for (int n = 0; n < N; n++) {
            float *dst = dwte + (size_t)tok[n] * C;
            const float *src = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++)
                dst[c] += src[c];
        }
    }
}

static void fast_rmsnorm_fwd(fso_backend *be, float *out, float *rstd, const float *x,
                             const float *w, int N, int C, float eps)
{
#pragma omp parallel for schedule(static) num_threads(be->threads)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++)
            ss += xr[c] * xr[c];
        float r = 1.0f / sqrtf(ss / C + eps);
        rstd[n] = r;
#pragma omp simd
        for (int c = 0; c < C; c++)
            o[c] = xr[c] * r * w[c];
    }
}

static void fast_rmsnorm_bwd(fso_backend *be, float *dx, float *dw, const float *dout,
                             const float *x, const float *w, const float *rstd, int N, int C)
{
#pragma omp parallel num_threads(be->threads)
    {
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *xr = x + (size_t)n * C, *dy = dout + (size_t)n * C;
            float *dxr = dx + (size_t)n * C;
            float r = rstd[n], dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int c = 0; c < C; c++)
                dot += w[c] * dy[c] * xr[c];
            float k = r * r * r * dot / C;
#pragma omp simd
            for (int c = 0; c < C; c++)
                dxr[c] += r * w[c] * dy[c] - xr[c] * k;
        }
        /* dw: threads split the columns, rows summed in order */
        int nchunks = (C + 63) / 64;
#pragma omp for schedule(static)
        for (int ch = 0; ch < nchunks; ch++) {
            int c0 = ch * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
            float acc[64] = {0};
            for (int n = 0; n < N; n++) {
                const float *xr = x + (size_t)n * C, *dy = dout + (size_t)n * C;
                float r = rstd[n];
                for (int c = c0; c < c1; c++)
                    acc[c - c0] += dy[c] * xr[c] * r;
            }
            for (int c = c0; c < c1; c++)
                dw[c] += acc[c - c0];
        }
    }
}

static void fast_matmul_fwd(fso_backend *be, float *out, const float *x, const float *w,
                            int N, int Cin, int Cout)
{
    (void)be;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, Cout, Cin, 1.0f, x, Cin, w, Cin, 0.0f, out, Cout);
}

static void fast_matmul_bwd(fso_backend *be, float *dx, float *dw, const float *dout,
                            const float *x, const float *w, int N, int Cin, int Cout, float dx_beta)
{
    (void)be;
    if (dx)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, Cin, Cout, 1.0f, dout, Cout, w, Cin,
                    dx_beta, dx, Cin);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Cout, Cin, N, 1.0f, dout, Cout, x, Cin, 1.0f, dw, Cin);
}

static void fast_rope(fso_backend *be, float *x, const float *cos_t, const float *sin_t,
                      int B, int T, int nh, int D, int inverse)
{
    int half = D / 2;
    float sgn = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static) collapse(2) num_threads(be->threads)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *ct = cos_t + (size_t)t * half, *st = sin_t + (size_t)t * half;
            for (int h = 0; h < nh; h++) {
                float *v = x + (((size_t)b * T + t) * nh + h) * D;
#pragma omp simd
                for (int i = 0; i < half; i++) {
                    float c = ct[i], s = sgn * st[i];
                    float x1 = v[i], x2 = v[i + half];
                    v[i] = x1 * c - x2 * s;
                    v[i + half] = x2 * c + x1 * s;
                }
            }
        }
}

static inline float dotf(const float *a, const float *b, int D)
{
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < D; d++)
        s += a[d] * b[d];
    return s;
}

/* One (batch, query head) per task; rows of probs past the diagonal are 0. */
static void fast_attention_fwd(fso_backend *be, float *out, float *probs, const float *q,
                               const float *k, const float *v, int B, int T, int H, int Hkv,
                               int D)
{
    int group = H / Hkv;
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel for schedule(static) collapse(2) num_threads(be->threads)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int hk = h / group;
            for (int t = 0; t < T; t++) {
                const float *qt = q + (((size_t)b * T + t) * H + h) * D;
                float *p = probs + (((size_t)b * H + h) * T + t) * T;
                float mx = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    float sc = dotf(qt, k + (((size_t)b * T + s) * Hkv + hk) * D, D) * scale;
                    p[s] = sc;
                    mx = sc > mx ? sc : mx;
                }
                float sum = 0;
                for (int s = 0; s <= t; s++) {
                    p[s] = expf(p[s] - mx);
                    sum += p[s];
                }
                float inv = 1.0f / sum;
                for (int s = 0; s <= t; s++)
                    p[s] *= inv;
                if (t + 1 < T)
                    memset(p + t + 1, 0, sizeof(float) * (size_t)(T - t - 1));
                float *ot = out + (((size_t)b * T + t) * H + h) * D;
                memset(ot, 0, sizeof(float) * D);
                for (int s = 0; s <= t; s++) {
                    const float *vs = v + (((size_t)b * T + s) * Hkv + hk) * D;
                    float ps = p[s];
#pragma omp simd
                    for (int d = 0; d < D; d++)
                        ot[d] += ps * vs[d];
                }
            }
        }
}

/* One (batch, kv head) per task, so the group's dk and dv have one writer. */
static void fast_attention_bwd(fso_backend *be, float *dq, float *dk, float *dv, const float *dout,
                               const float *probs, const float *q, const float *k, const float *v,
                               int B, int T, int H, int Hkv, int D)
{
    int group = H / Hkv;
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel num_threads(be->threads)
    {
        float dp[T]; /* T is bounded by max_position_embeddings */
#pragma omp for schedule(static) collapse(2)
        for (int b = 0; b < B; b++)
            for (int hk = 0; hk < Hkv; hk++) {
                for (int s = 0; s < T; s++) {
                    memset(dk + (((size_t)b * T + s) * Hkv + hk) * D, 0, sizeof(float) * D);
                    memset(dv + (((size_t)b * T + s) * Hkv + hk) * D, 0, sizeof(float) * D);
                }
                for (int h = hk * group; h < (hk + 1) * group; h++)
                    for (int t = 0; t < T; t++) {
                        const float *p = probs + (((size_t)b * H + h) * T + t) * T;
                        const float *dot_ = dout + (((size_t)b * T + t) * H + h) * D;
                        const float *qt = q + (((size_t)b * T + t) * H + h) * D;
                        float *dqt = dq + (((size_t)b * T + t) * H + h) * D;
                        float rowsum = 0;
                        for (int s = 0; s <= t; s++) {
                            dp[s] = dotf(dot_, v + (((size_t)b * T + s) * Hkv + hk) * D, D);
                            rowsum += p[s] * dp[s];
                        }
                        memset(dqt, 0, sizeof(float) * D);
                        for (int s = 0; s <= t; s++) {
                            float ds = p[s] * (dp[s] - rowsum) * scale, ps = p[s];
                            const float *ks = k + (((size_t)b * T + s) * Hkv + hk) * D;
                            float *dks = dk + (((size_t)b * T + s) * Hkv + hk) * D;
                            float *dvs = dv + (((size_t)b * T + s) * Hkv + hk) * D;
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
}

static void fast_swiglu_fwd(fso_backend *be, float *out, const float *gate, const float *up,
                            size_t n)
{
#pragma omp parallel for simd schedule(static) num_threads(be->threads)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static void fast_swiglu_bwd(fso_backend *be, float *dgate, float *dup, const float *dout,
                            const float *gate, const float *up, size_t n)
{
#pragma omp parallel for simd schedule(static) num_threads(be->threads)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], sg = 1.0f / (1.0f + expf(-g)), dy = dout[i];
        float u = up[i];
        dup[i] = dy * g * sg;
        dgate[i] = dy * u * sg * (1.0f + g * (1.0f - sg));
    }
}

static void fast_add(fso_backend *be, float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for simd schedule(static) num_threads(be->threads)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

static void fast_cross_entropy(fso_backend *be, float *dlogits, float *losses, const float *logits,
                               const int32_t *targets, int N, int V, float dscale)
{
#pragma omp parallel for schedule(static) num_threads(be->threads)
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V;
        float *dl = dlogits + (size_t)n * V;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++)
            mx = l[j] > mx ? l[j] : mx;
        double sum = 0;
        for (int j = 0; j < V; j++)
            sum += expf(l[j] - mx);
        float lse = mx + (float)log(sum);
        int tgt = targets[n];
        losses[n] = lse - l[tgt];
        for (int j = 0; j < V; j++)
            dl[j] = expf(l[j] - lse) * dscale;
        dl[tgt] -= dscale;
    }
}

#define SQNORM_CHUNK 65536

static void fast_sqnorm(fso_backend *be, double *out, const float *x, size_t n)
{
    size_t nchunks = (n + SQNORM_CHUNK - 1) / SQNORM_CHUNK;
    if (nchunks <= 1) {
        double s = 0;
        for (size_t i = 0; i < n; i++)
            s += (double)x[i] * x[i];
        *out += s;
        return;
    }
    double *part = malloc(sizeof(double) * nchunks);
    if (!part) { /* no memory for partials: same sums, one thread */
        for (size_t c = 0; c < nchunks; c++) {
            size_t i1 = (c + 1) * SQNORM_CHUNK < n ? (c + 1) * SQNORM_CHUNK : n;
            double s = 0;
            for (size_t i = c * SQNORM_CHUNK; i < i1; i++)
                s += (double)x[i] * x[i];
            *out += s;
        }
        return;
    }
#pragma omp parallel for schedule(static) num_threads(be->threads)
    for (size_t c = 0; c < nchunks; c++) {
        size_t i1 = (c + 1) * SQNORM_CHUNK < n ? (c + 1) * SQNORM_CHUNK : n;
        double s = 0;
        for (size_t i = c * SQNORM_CHUNK; i < i1; i++)
            s += (double)x[i] * x[i];
        part[c] = s;
    }
    for (size_t c = 0; c < nchunks; c++)
        *out += part[c];
    free(part);
}

const fso_backend_ops fso_cpu_fast_ops = {
    .name = "cpu",
    .buf_alloc = fso_cpu_buf_alloc,
    .buf_free = fso_cpu_buf_free,
    .memset0 = fso_cpu_memset0,
    .copy_h2d = fso_cpu_copy,
    .copy_d2h = fso_cpu_copy,
    .sync = fso_cpu_sync,
    .embedding_fwd = fast_embedding_fwd,
    .embedding_bwd = fast_embedding_bwd,
    .rmsnorm_fwd = fast_rmsnorm_fwd,
    .rmsnorm_bwd = fast_rmsnorm_bwd,
    .matmul_fwd = fast_matmul_fwd,
    .matmul_bwd = fast_matmul_bwd,
    .rope = fast_rope,
    .attention_fwd = fast_attention_fwd,
    .attention_bwd = fast_attention_bwd,
    .swiglu_fwd = fast_swiglu_fwd,
    .swiglu_bwd = fast_swiglu_bwd,
    .add = fast_add,
    .cross_entropy = fast_cross_entropy,
    .sqnorm = fast_sqnorm,
};
