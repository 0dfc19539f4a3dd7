/* cpu_ref.c — the reference backend: every op as plain loops, one thread.
 *
 * This is the definition every other backend is tested against, so it is
 * written to be read, not to be fast: one loop nest per formula, reductions
 * accumulated in double. The formulas are those of PyTorch's Llama
 * (RMSNorm, rotate-half RoPE, causal softmax attention with grouped-query
 * heads, SwiGLU, softmax cross-entropy).
 */
#include <math.h>
#include <string.h>

#include "cpu_common.h"
#include "sum_order.h"

static void ref_embedding_fwd(fso_backend *be, float *out, const int32_t *tok, const float *wte,
                              int N, int C)
{
    (void)be;
    for (int n = 0; n < N; n++)
        memcpy(out + (size_t)n * C, wte + (size_t)tok[n] * C, sizeof(float) * C);
}

static void ref_embedding_bwd(fso_backend *be, float *dwte, const int32_t *tok, const float *dout,
                              int N, int C)
{
    (void)be;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            dwte[(size_t)tok[n] * C + c] += dout[(size_t)n * C + c];
}

static void ref_rmsnorm_fwd(fso_backend *be, float *out, float *rstd, const float *x,
                            const float *w, int N, int C, float eps)
{
    (void)be;
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        double ss = 0;
        for (int c = 0; c < C; c++)
            ss += (double)xr[c] * xr[c];
        float r = (float)(1.0 / sqrt(ss / C + eps));
        rstd[n] = r;
        for (int c = 0; c < C; c++)
            out[(size_t)n * C + c] = xr[c] * r * w[c];
    }
}

/* y = x * r * w with r = (mean(x^2) + eps)^-1/2:
 * dx = r * (w*dy) - x * r^3 / C * sum(w*dy*x) ; dw = sum_n dy * x * r */
static void ref_rmsnorm_bwd(fso_backend *be, float *dx, float *dw, const float *dout,
                            const float *x, const float *w, const float *rstd, int N, int C)
{
    (void)be;
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C, *dy = dout + (size_t)n * C;
        double r = rstd[n], dot = 0;
        for (int c = 0; c < C; c++)
            dot += (double)w[c] * dy[c] * xr[c];
        for (int c = 0; c < C; c++) {
            dx[(size_t)n * C + c] += (float)(r * w[c] * dy[c] - xr[c] * r * r * r * dot / C);
            dw[c] += (float)(dy[c] * xr[c] * r);
        }
    }
}

static void ref_matmul_fwd(fso_backend *be, float *out, const float *x, const float *w,
                           int N, int Cin, int Cout)
{
    (void)be;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < Cout; o++) {
            double s = 0;
            for (int i = 0; i < Cin; i++)
                s += (double)x[(size_t)n * Cin + i] * w[(size_t)o * Cin + i];
            out[(size_t)n * Cout + o] = (float)s;
        }
}

static void ref_matmul_bwd(fso_backend *be, float *dx, float *dw, const float *dout,
                           const float *x, const float *w, int N, int Cin, int Cout, float dx_beta)
{
    (void)be;
    if (dx)
        for (int n = 0; n < N; n++)
            for (int i = 0; i < Cin; i++) {
                double s = 0;
                for (int o = 0; o < Cout; o++)
                    s += (double)dout[(size_t)n * Cout + o] * w[(size_t)o * Cin + i];
                float prev = dx_beta != 0.0f ? dx_beta * dx[(size_t)n * Cin + i] : 0.0f;
                dx[(size_t)n * Cin + i] = prev + (float)s;
            }
    for (int o = 0; o < Cout; o++)
        for (int i = 0; i < Cin; i++) {
            double s = 0;
            for (int n = 0; n < N; n++)
                s += (double)dout[(size_t)n * Cout + o] * x[(size_t)n * Cin + i];
            dw[(size_t)o * Cin + i] += (float)s;
        }
}

static void ref_rope(fso_backend *be, float *x, const float *cos_t, const float *sin_t,
                     const int32_t *pos, int B, int T, int nh, int D, int inverse)
{
    (void)be;
    int half = D / 2;
    float sgn = inverse ? -1.0f : 1.0f;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < nh; h++) {
                float *v = x + (((size_t)b * T + t) * nh + h) * D;
                const size_t p = pos ? (size_t)pos[(size_t)b * T + t] : (size_t)t;
                for (int i = 0; i < half; i++) {
                    float c = cos_t[p * half + i], s = sgn * sin_t[p * half + i];
                    float x1 = v[i], x2 = v[i + half];
                    v[i] = x1 * c - x2 * s;
                    v[i + half] = x2 * c + x1 * s;
                }
            }
}

/* The first key token t attends to: its document's first (pos NULL: the row's). */
static int first_key(const int32_t *pos, int b, int T, int t)
{
    return pos ? t - pos[(size_t)b * T + t] : 0;
}

static void ref_attention_fwd(fso_backend *be, float *out, float *probs, const float *q,
                              const float *k, const float *v, const int32_t *pos, int B, int T,
                              int H, int Hkv, int D)
{
    (void)be;
    int group = H / Hkv;
    double scale = 1.0 / sqrt((double)D);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int hk = h / group;
            for (int t = 0; t < T; t++) {
                const float *qt = q + (((size_t)b * T + t) * H + h) * D;
                float *p = probs + (((size_t)b * H + h) * T + t) * T;
                const int s0 = first_key(pos, b, T, t);
                double mx = -INFINITY;
                for (int s = s0; s <= t; s++) {
                    const float *ks = k + (((size_t)b * T + s) * Hkv + hk) * D;
                    double dot = 0;
                    for (int d = 0; d < D; d++)
                        dot += (double)qt[d] * ks[d];
                    p[s] = (float)(dot * scale);
                    if (p[s] > mx)
                        mx = p[s];
                }
                double sum = 0;
                for (int s = s0; s <= t; s++)
                    sum += exp(p[s] - mx);
                for (int s = 0; s < T; s++)
                    p[s] = s >= s0 && s <= t ? (float)(exp(p[s] - mx) / sum) : 0.0f;
                float *ot = out + (((size_t)b * T + t) * H + h) * D;
                for (int d = 0; d < D; d++) {
                    double acc = 0;
                    for (int s = s0; s <= t; s++)
                        acc += (double)p[s] * v[(((size_t)b * T + s) * Hkv + hk) * D + d];
                    ot[d] = (float)acc;
                }
            }
        }
}

/* P = softmax(S), S = q k^T * scale, O = P v:
 * dP = dO v^T ; dS = P * (dP - rowsum(P * dP)) ; dq = dS k * scale ;
 * dk = dS^T q * scale ; dv = P^T dO  (dk, dv summed over the heads of a group) */
static void ref_attention_bwd(fso_backend *be, float *dq, float *dk, float *dv, const float *dout,
                              const float *probs, const float *q, const float *k, const float *v,
                              const int32_t *pos, int B, int T, int H, int Hkv, int D)
{
    (void)be;
    int group = H / Hkv;
    double scale = 1.0 / sqrt((double)D);
    memset(dq, 0, sizeof(float) * (size_t)B * T * H * D);
    memset(dk, 0, sizeof(float) * (size_t)B * T * Hkv * D);
    memset(dv, 0, sizeof(float) * (size_t)B * T * Hkv * D);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int hk = h / group;
            for (int t = 0; t < T; t++) {
                const float *p = probs + (((size_t)b * H + h) * T + t) * T;
                const float *dot_ = dout + (((size_t)b * T + t) * H + h) * D;
                const float *qt = q + (((size_t)b * T + t) * H + h) * D;
                double dp[T > 0 ? T : 1];
                double rowsum = 0;
                const int s0 = first_key(pos, b, T, t);
                for (int s = s0; s <= t; s++) {
                    const float *vs = v + (((size_t)b * T + s) * Hkv + hk) * D;
                    double acc = 0;
                    for (int d = 0; d < D; d++)
                        acc += (double)dot_[d] * vs[d];
                    dp[s] = acc;
                    rowsum += p[s] * acc;
                }
                for (int s = s0; s <= t; s++) {
                    double ds = p[s] * (dp[s] - rowsum) * scale;
                    float *dqt = dq + (((size_t)b * T + t) * H + h) * D;
                    const float *ks = k + (((size_t)b * T + s) * Hkv + hk) * D;
                    float *dks = dk + (((size_t)b * T + s) * Hkv + hk) * D;
                    float *dvs = dv + (((size_t)b * T + s) * Hkv + hk) * D;
                    for (int d = 0; d < D; d++) {
                        dqt[d] += (float)(ds * ks[d]);
                        dks[d] += (float)(ds * qt[d]);
                        dvs[d] += (float)(p[s] * dot_[d]);
                    }
                }
            }
        }
}

static void ref_swiglu_fwd(fso_backend *be, float *out, const float *gate, const float *up,
                           size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++) {
        double g = gate[i];
        out[i] = (float)(g / (1.0 + exp(-g)) * up[i]);
    }
}

/* silu(g) = g*sig(g) ; silu'(g) = sig(g) * (1 + g*(1 - sig(g))) */
static void ref_swiglu_bwd(fso_backend *be, float *dgate, float *dup, const float *dout,
                           const float *gate, const float *up, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++) {
        double g = gate[i], sg = 1.0 / (1.0 + exp(-g));
        double dy = dout[i];
        dup[i] = (float)(dy * g * sg);
        dgate[i] = (float)(dy * up[i] * sg * (1.0 + g * (1.0 - sg)));
    }
}

static void ref_bias_add(fso_backend *be, float *out, const float *b, int N, int C)
{
    (void)be;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            out[(size_t)n * C + c] += b[c];
}

/* db = sum over rows of dout, per column, in double */
static void ref_bias_bwd(fso_backend *be, float *db, const float *dout, int N, int C)
{
    (void)be;
    for (int c = 0; c < C; c++) {
        double s = 0;
        for (int n = 0; n < N; n++)
            s += dout[(size_t)n * C + c];
        db[c] += (float)s;
    }
}

static void ref_add(fso_backend *be, float *out, const float *a, const float *b, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

static void ref_cross_entropy(fso_backend *be, float *dlogits, float *losses, const float *logits,
                              const int32_t *targets, int N, int V, float dscale)
{
    (void)be;
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V;
        float *dl = dlogits + (size_t)n * V;
        if (targets[n] < 0) { /* does not count */
            losses[n] = 0.0f;
            memset(dl, 0, sizeof(float) * (size_t)V);
            continue;
        }
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < V; j++)
            if (l[j] > mx)
                mx = l[j];
        for (int j = 0; j < V; j++)
            sum += exp(l[j] - mx);
        double lse = mx + log(sum);
        losses[n] = (float)(lse - l[targets[n]]);
        for (int j = 0; j < V; j++) {
            double p = exp(l[j] - lse);
            dl[j] = (float)((p - (j == targets[n])) * dscale);
        }
    }
}

/* The one order of every backend (sum_order.h), on one thread. */
static void ref_sqnorm(fso_backend *be, double *out, const float *x, size_t n)
{
    (void)be;
    if (n)
        *out += fso_sum_ordered(x, n, true);
}

/* bf16 is the top half of an fp32: widening is a shift, exact for every
 * value (no rounding, no flush, NaN payloads kept). */
static void ref_cast_bf16_f32(fso_backend *be, float *dst, const uint16_t *src, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        dst[i] = fso_f32_from_bf16(src[i]);
}

/* Round to nearest even on the fp32 bits (fso_bf16_from_f32); a NaN keeps
 * its sign and top payload bits and is made quiet. */
static void ref_cast_f32_bf16(fso_backend *be, uint16_t *dst, const float *src, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        dst[i] = fso_bf16_from_f32(src[i]);
}

const fso_cpu_kernels fso_cpu_ref_kernels = {
    .embedding_fwd = ref_embedding_fwd,
    .rmsnorm_fwd = ref_rmsnorm_fwd,
    .rmsnorm_bwd = ref_rmsnorm_bwd,
    .matmul_fwd = ref_matmul_fwd,
    .matmul_bwd = ref_matmul_bwd,
    .rope = ref_rope,
    .attention_fwd = ref_attention_fwd,
    .attention_bwd = ref_attention_bwd,
    .swiglu_fwd = ref_swiglu_fwd,
    .swiglu_bwd = ref_swiglu_bwd,
    .bias_add = ref_bias_add,
    .bias_bwd = ref_bias_bwd,
};

const fso_backend_ops fso_cpu_ref_ops = {
    .name = "cpu-ref",
    FSO_CPU_SHARED_OPS,
    .embedding_bwd = ref_embedding_bwd,
    .add = ref_add,
    .cross_entropy = ref_cross_entropy,
    .sqnorm = ref_sqnorm,
    .cast_bf16_f32 = ref_cast_bf16_f32,
    .cast_f32_bf16 = ref_cast_f32_bf16,
};
