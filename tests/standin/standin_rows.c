/* standin_rows.c — the stand-in's kernels whose GPU contract has no CPU op
 * of the same shape: attention's row kernels (cuda_softmax.cu; the CPU
 * backends fuse the softmax into their attention) and sqnorm's and sum's
 * fixed-order reduction (cuda_impl.h). The softmax rows follow
 * cuda_softmax.cu's formula and layout (fso_cuda_causal_softmax's comment)
 * in fp32, one row after another; the reduction is fso_cuda_reduce_host
 * (kernels/sum_order.c), the device order's one host definition.
 * Queued on the compute stream inside an op, as the real ones. */
#include <math.h>

#include "cuda/cuda_impl.h"
#include "standin.h"
#include "standin_ops.h"

#define V(p) standin_view(p)

static float load(const void *p, fso_dtype dt, size_t i)
{
    return dt == FSO_DT_BF16 ? fso_f32_from_bf16(((const uint16_t *)p)[i])
                             : ((const float *)p)[i];
}

static void store(void *p, fso_dtype dt, size_t i, float v)
{
    if (dt == FSO_DT_BF16)
        ((uint16_t *)p)[i] = fso_bf16_from_f32(v);
    else
        ((float *)p)[i] = v;
}

/* ------------------------------------------------------------ causal softmax */

struct k_softmax {
    standin_kernel k;
    void *out; /* fwd: P [dt]; bwd: dS [dt] */
    fso_dtype dt;
    size_t head_elems; /* fwd: out's; bwd: probs' */
    const float *in;   /* fwd: scaled scores; bwd: dP */
    const void *probs; /* bwd: P [dt] */
    size_t rows;
    int T;
    const int32_t *pos; /* fwd */
    int heads;          /* fwd */
    float scale;        /* bwd */
};

/* Row r: keys s0..t of position t = r % T, s0 = t - pos[b * T + t] for the
 * row's batch b = (r / T) / heads, or 0; probabilities to row (r / T) *
 * head_elems + t * T of out, zero outside s0..t. Every element of a row is
 * read before it is written (in place when out is the scores, fp32). */
static void softmax_fwd_body(fso_backend *cpu, const void *self)
{
    const struct k_softmax *a = self;
    const float *in = V(a->in);
    const int32_t *pos = V(a->pos);
    void *out = V(a->out);
    const int T = a->T;
    (void)cpu;
    for (size_t r = 0; r < a->rows; r++) {
        const int t = (int)(r % T);
        const int s0 = pos ? t - pos[(r / T / (size_t)a->heads) * T + t] : 0;
        const float *x = in + r * T;
        const size_t p = (r / T) * a->head_elems + (size_t)t * T;
        float mx = -INFINITY, sum = 0.0f;
        for (int s = s0; s <= t; s++)
            mx = fmaxf(mx, x[s]);
        for (int s = s0; s <= t; s++)
            sum += expf(x[s] - mx);
        for (int s = 0; s < T; s++)
            store(out, a->dt, p + s, s >= s0 && s <= t ? expf(x[s] - mx) / sum : 0.0f);
    }
}

void fso_cuda_causal_softmax(fso_backend *be, void *out, fso_dtype dt, size_t out_head_elems,
                             const float *in, size_t rows, int T, const int32_t *pos, int heads)
{
    if (rows == 0)
        return;
    struct k_softmax k = {.k = {softmax_fwd_body, 0}, .out = out, .dt = dt,
                          .head_elems = out_head_elems, .in = in, .rows = rows, .T = T,
                          .pos = pos, .heads = heads};
    standin_kernel_launch(FSO_CUDA_CTX(be)->stream[FSO_CS_COMPUTE], "causal_softmax", &k.k,
                          sizeof k);
}

/* Row r: dS = P * (dP - rowsum(P * dP)) * scale over s <= t, zero above the
 * diagonal; P's row at (r / T) * head_elems + t * T. In place when dS is
 * dP (fp32): the row sum is taken before any element is written. */
static void softmax_bwd_body(fso_backend *cpu, const void *self)
{
    const struct k_softmax *a = self;
    const float *dp = V(a->in);
    const void *probs = V(a->probs);
    void *ds = V(a->out);
    const int T = a->T;
    (void)cpu;
    for (size_t r = 0; r < a->rows; r++) {
        const int t = (int)(r % T);
        const size_t p = (r / T) * a->head_elems + (size_t)t * T;
        const float *d = dp + r * T;
        float rowsum = 0.0f;
        for (int s = 0; s <= t; s++)
            rowsum += load(probs, a->dt, p + s) * d[s];
        for (int s = 0; s < T; s++)
            store(ds, a->dt, r * T + s,
                  s <= t ? load(probs, a->dt, p + s) * (d[s] - rowsum) * a->scale : 0.0f);
    }
}

void fso_cuda_causal_softmax_bwd(fso_backend *be, void *ds, fso_dtype dt, const float *dp,
                                 const void *probs, size_t probs_head_elems, size_t rows, int T,
                                 float scale)
{
    if (rows == 0)
        return;
    struct k_softmax k = {.k = {softmax_bwd_body, 0}, .out = ds, .dt = dt,
                          .head_elems = probs_head_elems, .in = dp, .probs = probs,
                          .rows = rows, .T = T, .scale = scale};
    standin_kernel_launch(FSO_CUDA_CTX(be)->stream[FSO_CS_COMPUTE], "causal_softmax_bwd", &k.k,
                          sizeof k);
}

/* ------------------------------------------------------------ reduction */

struct k_reduce {
    standin_kernel k;
    double *scratch;
    const float *x;
    size_t n;
    int square;
};

static void reduce_body(fso_backend *cpu, const void *self)
{
    const struct k_reduce *a = self;
    (void)cpu;
    *(double *)V(a->scratch) = fso_cuda_reduce_host(V(a->x), a->n, a->square);
}

void fso_cuda_reduce_device(fso_backend *be, double *scratch, const float *x, size_t n,
                            int square)
{
    struct k_reduce k = {{reduce_body, 0}, scratch, x, n, square};
    standin_kernel_launch(FSO_CUDA_CTX(be)->stream[FSO_CS_COMPUTE], square ? "sqnorm" : "sum",
                          &k.k, sizeof k);
}
