/* standin_ops.c — the stand-in's kernel launchers: cuda_ops.cu's and the
 * casts' C definitions. Each does what the real launcher does around its
 * kernels (fso_cuda_begin on the compute stream, the same scratch request,
 * fso_cuda_end), and its kernels are one item queued with standin_launch
 * that runs, on the stream's worker thread, the CPU backend's op of the
 * same meaning on the worker's views of device memory: the results are the
 * "cpu" backend's bits. Where the GPU kernel's contract goes past the CPU
 * op's, the item keeps the GPU's: a negative token or a target >= V sets
 * the device's error flag (FSO_CUDA_FLAG_*), which the backend's sync
 * reports, instead of reading out of bounds. attention's row kernels and
 * the fixed-order reduction are standin_rows.c's.
 *
 * One CPU backend per stand-in device, made by the first kernel that runs
 * there and kept until the process ends; kernels of a device's streams take
 * turns on it (its bf16 working space is one). */
#include <pthread.h>
#include <string.h>

#include "adamw_elem.h"
#include "cuda/cuda_impl.h"
#include "fso_standin.h"
#include "standin.h"
#include "standin_ops.h"
#include "util.h"

#define V(p) standin_view(p)

/* ------------------------------------------------------------ devices */

static struct standin_cpu {
    pthread_mutex_t mu; /* held while a kernel of the device runs */
    fso_backend *be;    /* made by the first kernel; guarded by mu */
} cpus[FSO_STANDIN_MAX_DEVICES] = {[0 ... FSO_STANDIN_MAX_DEVICES - 1] = {
                                       .mu = PTHREAD_MUTEX_INITIALIZER}};

/* The worker's side of every launch. */
static void kernel_run(void *arg)
{
    standin_kernel *k = arg;
    struct standin_cpu *c = &cpus[k->device];
    pthread_mutex_lock(&c->mu);
    if (!c->be) {
        char err[FSO_BACKEND_ERR_MAX] = "";
        int rc = fso_backend_create(&c->be, FSO_BACKEND_CPU, k->device, 1, 0, err, sizeof err);
        FSO_BUG_ON(rc < 0, "the CPU backend of stand-in device %d: %s", k->device, err);
    }
    k->body(c->be, k);
    pthread_mutex_unlock(&c->mu);
}

void standin_kernel_launch(cudaStream_t s, const char *what, standin_kernel *k, size_t bytes)
{
    const int dev = standin_stream_device(s);
    /* a bad stream: standin_launch refuses it below, before anything runs */
    k->device = dev >= 0 && dev < FSO_STANDIN_MAX_DEVICES ? dev : 0;
    (void)standin_launch(s, what, kernel_run, k, bytes);
}

void standin_kernel_flag(unsigned *dev_flags, unsigned bits)
{
    __atomic_fetch_or((unsigned *)V(dev_flags), bits, __ATOMIC_RELAXED);
}

#define LAUNCH(s, what, k) standin_kernel_launch((s), (what), &(k).k, sizeof(k))

/* Kernel k queued alone on be's compute stream, as a launcher of
 * cuda_ops.cu queues its one kernel: ordered (fso_cuda_begin), launched,
 * ended (fso_cuda_end, which checks the launch). */
static void compute_one(fso_backend *be, const char *what, standin_kernel *k,
                        size_t bytes)
{
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    standin_kernel_launch(s, what, k, bytes);
    fso_cuda_end(be, FSO_CS_COMPUTE, what);
}
#define COMPUTE(be, what, k) compute_one((be), (what), &(k).k, sizeof(k))

/* ------------------------------------------------------------ embedding */

struct k_embedding_fwd {
    standin_kernel k;
    float *out;
    const int32_t *tok;
    const void *wte;
    fso_dtype dt;
    int N, C;
    unsigned *flags;
};

/* Rows of valid tokens in runs through the CPU op; a negative token's row
 * is 0 and flagged, as the kernel does. */
static void embedding_fwd_body(fso_backend *cpu, const void *self)
{
    const struct k_embedding_fwd *a = self;
    float *out = V(a->out);
    const int32_t *tok = V(a->tok);
    const size_t C = (size_t)a->C;
    int n0 = 0;
    for (int n = 0; n <= a->N; n++) {
        if (n < a->N && tok[n] >= 0)
            continue;
        if (n > n0)
            cpu->ops->embedding_fwd(cpu, out + n0 * C, tok + n0, V(a->wte), a->dt, n - n0,
                                    a->C);
        if (n < a->N) {
            memset(out + n * C, 0, sizeof(float) * C);
            standin_kernel_flag(a->flags, FSO_CUDA_FLAG_BAD_TOKEN);
        }
        n0 = n + 1;
    }
}

void fso_cuda_embedding_fwd(fso_backend *be, float *out, const int32_t *tok, const void *wte,
                            fso_dtype dt, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    struct k_embedding_fwd k = {{embedding_fwd_body, 0}, out, tok, wte, dt, N, C,
                                FSO_CUDA_CTX(be)->dev_flags};
    COMPUTE(be, "embedding_fwd", k);
}

struct k_embedding_bwd {
    standin_kernel k;
    float *dwte;
    const int32_t *tok;
    const float *dout;
    int N, C;
    unsigned *flags;
};

/* Rows added in order, runs of valid tokens through the CPU op; a negative
 * token adds nothing and is flagged. */
static void embedding_bwd_body(fso_backend *cpu, const void *self)
{
    const struct k_embedding_bwd *a = self;
    const int32_t *tok = V(a->tok);
    const float *dout = V(a->dout);
    const size_t C = (size_t)a->C;
    int n0 = 0;
    for (int n = 0; n <= a->N; n++) {
        if (n < a->N && tok[n] >= 0)
            continue;
        if (n > n0)
            cpu->ops->embedding_bwd(cpu, V(a->dwte), tok + n0, dout + n0 * C, n - n0, a->C);
        if (n < a->N)
            standin_kernel_flag(a->flags, FSO_CUDA_FLAG_BAD_TOKEN);
        n0 = n + 1;
    }
}

void fso_cuda_embedding_bwd(fso_backend *be, float *dwte, const int32_t *tok, const float *dout,
                            int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    struct k_embedding_bwd k = {{embedding_bwd_body, 0}, dwte, tok, dout, N, C,
                                FSO_CUDA_CTX(be)->dev_flags};
    COMPUTE(be, "embedding_bwd", k);
}

/* ------------------------------------------------------------ rmsnorm */

struct k_rmsnorm_fwd {
    standin_kernel k;
    void *out;
    float *rstd;
    const float *x;
    const void *w;
    fso_dtype dt;
    int N, C;
    float eps;
};

static void rmsnorm_fwd_body(fso_backend *cpu, const void *self)
{
    const struct k_rmsnorm_fwd *a = self;
    cpu->ops->rmsnorm_fwd(cpu, V(a->out), V(a->rstd), V(a->x), V(a->w), a->dt, a->N, a->C,
                          a->eps);
}

void fso_cuda_rmsnorm_fwd(fso_backend *be, void *out, float *rstd, const float *x, const void *w,
                          fso_dtype dt, int N, int C, float eps)
{
    if (N <= 0 || C <= 0)
        return;
    struct k_rmsnorm_fwd k = {{rmsnorm_fwd_body, 0}, out, rstd, x, w, dt, N, C, eps};
    COMPUTE(be, "rmsnorm_fwd", k);
}

struct k_rmsnorm_bwd {
    standin_kernel k;
    float *dx, *dw;
    const float *dout, *x;
    const void *w;
    fso_dtype dt;
    const float *rstd;
    int N, C;
};

static void rmsnorm_bwd_body(fso_backend *cpu, const void *self)
{
    const struct k_rmsnorm_bwd *a = self;
    cpu->ops->rmsnorm_bwd(cpu, V(a->dx), V(a->dw), V(a->dout), V(a->x), V(a->w), a->dt,
                          V(a->rstd), a->N, a->C);
}

void fso_cuda_rmsnorm_bwd(fso_backend *be, float *dx, float *dw, const float *dout,
                          const float *x, const void *w, fso_dtype dt, const float *rstd, int N,
                          int C)
{
    if (N <= 0 || C <= 0)
        return;
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    /* the device's dw partials; the CPU op needs none, but the request (and
     * its failure) is the real launcher's */
    if (fso_cuda_scratch(be, fso_cuda_col_scratch_bytes(N, C))) {
        struct k_rmsnorm_bwd k = {{rmsnorm_bwd_body, 0}, dx, dw, dout, x, w, dt, rstd, N, C};
        LAUNCH(s, "rmsnorm_bwd", k);
    }
    fso_cuda_end(be, FSO_CS_COMPUTE, "rmsnorm_bwd");
}

/* ------------------------------------------------------------ rope */

struct k_rope {
    standin_kernel k;
    void *x;
    fso_dtype dt;
    const float *cos_t, *sin_t;
    const int32_t *pos;
    int B, T, nh, D, inverse;
};

static void rope_body(fso_backend *cpu, const void *self)
{
    const struct k_rope *a = self;
    cpu->ops->rope(cpu, V(a->x), a->dt, V(a->cos_t), V(a->sin_t), V(a->pos), a->B, a->T, a->nh,
                   a->D, a->inverse);
}

void fso_cuda_rope(fso_backend *be, void *x, fso_dtype dt, const float *cos_t,
                   const float *sin_t, const int32_t *pos, int B, int T, int nh, int D,
                   int inverse)
{
    const size_t pairs = (size_t)B * T * nh * (D / 2);
    if (pairs == 0)
        return;
    struct k_rope k = {{rope_body, 0}, x, dt, cos_t, sin_t, pos, B, T, nh, D, inverse};
    COMPUTE(be, "rope", k);
}

/* ------------------------------------------------------------ swiglu, add */

struct k_swiglu {
    standin_kernel k;
    void *out, *out2; /* fwd: out; bwd: dgate, dup */
    const void *dout, *gate, *up;
    fso_dtype dt;
    size_t n;
};

static void swiglu_fwd_body(fso_backend *cpu, const void *self)
{
    const struct k_swiglu *a = self;
    cpu->ops->swiglu_fwd(cpu, V(a->out), V(a->gate), V(a->up), a->dt, a->n);
}

static void swiglu_bwd_body(fso_backend *cpu, const void *self)
{
    const struct k_swiglu *a = self;
    cpu->ops->swiglu_bwd(cpu, V(a->out), V(a->out2), V(a->dout), V(a->gate), V(a->up), a->dt,
                         a->n);
}

void fso_cuda_swiglu_fwd(fso_backend *be, void *out, const void *gate, const void *up,
                         fso_dtype dt, size_t n)
{
    if (n == 0)
        return;
    struct k_swiglu k = {{swiglu_fwd_body, 0}, out, NULL, NULL, gate, up, dt, n};
    COMPUTE(be, "swiglu_fwd", k);
}

void fso_cuda_swiglu_bwd(fso_backend *be, void *dgate, void *dup, const void *dout,
                         const void *gate, const void *up, fso_dtype dt, size_t n)
{
    if (n == 0)
        return;
    struct k_swiglu k = {{swiglu_bwd_body, 0}, dgate, dup, dout, gate, up, dt, n};
    COMPUTE(be, "swiglu_bwd", k);
}

struct k_add {
    standin_kernel k;
    float *out;
    const float *a, *b;
    size_t n;
};

static void add_body(fso_backend *cpu, const void *self)
{
    const struct k_add *a = self;
    cpu->ops->add(cpu, V(a->out), V(a->a), V(a->b), a->n);
}

void fso_cuda_add(fso_backend *be, float *out, const float *a, const float *b, size_t n)
{
    if (n == 0)
        return;
    struct k_add k = {{add_body, 0}, out, a, b, n};
    COMPUTE(be, "add", k);
}

/* ------------------------------------------------------------ bias */

struct k_bias {
    standin_kernel k;
    void *out; /* add: out [dt]; bwd: db fp32 */
    const void *in; /* add: b [dt]; bwd: dout [dt] */
    fso_dtype dt;
    int N, C;
};

static void bias_add_body(fso_backend *cpu, const void *self)
{
    const struct k_bias *a = self;
    cpu->ops->bias_add(cpu, V(a->out), V(a->in), a->dt, a->N, a->C);
}

static void bias_bwd_body(fso_backend *cpu, const void *self)
{
    const struct k_bias *a = self;
    cpu->ops->bias_bwd(cpu, V(a->out), V(a->in), a->dt, a->N, a->C);
}

void fso_cuda_bias_add(fso_backend *be, void *out, const void *b, fso_dtype dt, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    struct k_bias k = {{bias_add_body, 0}, out, b, dt, N, C};
    COMPUTE(be, "bias_add", k);
}

void fso_cuda_bias_bwd(fso_backend *be, float *db, const void *dout, fso_dtype dt, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    if (fso_cuda_scratch(be, fso_cuda_col_scratch_bytes(N, C))) { /* the partials' */
        struct k_bias k = {{bias_bwd_body, 0}, db, dout, dt, N, C};
        LAUNCH(s, "bias_bwd", k);
    }
    fso_cuda_end(be, FSO_CS_COMPUTE, "bias_bwd");
}

/* ------------------------------------------------------------ cross-entropy */

struct k_cross_entropy {
    standin_kernel k;
    float *dlogits, *losses;
    const float *logits;
    const int32_t *targets;
    int N, V;
    float dscale;
    unsigned *flags;
};

/* Rows whose target is < V (a negative one does not count, as in the CPU
 * op) in runs through the CPU op; a target >= V is the kernel's: flagged,
 * loss NaN, its row of dlogits 0. */
static void cross_entropy_body(fso_backend *cpu, const void *self)
{
    const struct k_cross_entropy *a = self;
    float *dl = V(a->dlogits), *losses = V(a->losses);
    const float *logits = V(a->logits);
    const int32_t *tgt = V(a->targets);
    const size_t Vn = (size_t)a->V;
    int n0 = 0;
    for (int n = 0; n <= a->N; n++) {
        if (n < a->N && tgt[n] < a->V)
            continue;
        if (n > n0)
            cpu->ops->cross_entropy(cpu, dl + n0 * Vn, losses + n0, logits + n0 * Vn, tgt + n0,
                                    n - n0, a->V, a->dscale);
        if (n < a->N) {
            standin_kernel_flag(a->flags, FSO_CUDA_FLAG_BAD_TARGET);
            losses[n] = NAN;
            memset(dl + n * Vn, 0, sizeof(float) * Vn);
        }
        n0 = n + 1;
    }
}

void fso_cuda_cross_entropy(fso_backend *be, float *dlogits, float *losses, const float *logits,
                            const int32_t *targets, int N, int V, float dscale)
{
    if (N <= 0 || V <= 0)
        return;
    struct k_cross_entropy k = {{cross_entropy_body, 0}, dlogits, losses, logits, targets, N, V,
                                dscale, FSO_CUDA_CTX(be)->dev_flags};
    COMPUTE(be, "cross_entropy", k);
}

/* ------------------------------------------------------------ casts */

struct k_cast {
    standin_kernel k;
    void *dst;
    const void *src;
    size_t n;
};

static void widen_body(fso_backend *cpu, const void *self)
{
    const struct k_cast *a = self;
    cpu->ops->cast_bf16_f32(cpu, V(a->dst), V(a->src), a->n);
}

static void narrow_body(fso_backend *cpu, const void *self)
{
    const struct k_cast *a = self;
    cpu->ops->cast_f32_bf16(cpu, V(a->dst), V(a->src), a->n);
}

void fso_cuda_widen(fso_backend *be, float *dst, const uint16_t *src, size_t n)
{
    if (n == 0)
        return;
    struct k_cast k = {{widen_body, 0}, dst, src, n};
    LAUNCH(FSO_CUDA_CTX(be)->stream[FSO_CS_COMPUTE], "cast_bf16_f32", k);
}

void fso_cuda_narrow(fso_backend *be, uint16_t *dst, const float *src, size_t n)
{
    if (n == 0)
        return;
    struct k_cast k = {{narrow_body, 0}, dst, src, n};
    LAUNCH(FSO_CUDA_CTX(be)->stream[FSO_CS_COMPUTE], "cast_f32_bf16", k);
}

struct k_rows {
    standin_kernel k;
    float *dst;
    const uint16_t *src;
    int rows;
    size_t n;
};

/* the GPU kernel's loop: no CPU backend op sums bf16 rows */
static void sum_rows_body(fso_backend *cpu, const void *self)
{
    (void)cpu;
    const struct k_rows *a = self;
    float *dst = V(a->dst);
    const uint16_t *src = V(a->src);
    for (size_t i = 0; i < a->n; i++) {
        float s = fso_f32_from_bf16(src[i]);
        for (int k = 1; k < a->rows; k++)
            s += fso_f32_from_bf16(src[(size_t)k * a->n + i]);
        dst[i] = s;
    }
}

void fso_cuda_sum_bf16_rows(cudaStream_t s, float *dst, const uint16_t *src, int rows, size_t n)
{
    if (n == 0)
        return;
    struct k_rows k = {{sum_rows_body, 0}, dst, src, rows, n};
    LAUNCH(s, "sum_bf16_rows", k);
}

void fso_cuda_cast_bf16_f32(fso_backend *be, float *dst, const uint16_t *src, size_t n)
{
    if (n == 0)
        return;
    fso_cuda_begin(be, FSO_CS_COMPUTE);
    fso_cuda_widen(be, dst, src, n);
    fso_cuda_end(be, FSO_CS_COMPUTE, "cast_bf16_f32");
}

void fso_cuda_cast_f32_bf16(fso_backend *be, uint16_t *dst, const float *src, size_t n)
{
    if (n == 0)
        return;
    fso_cuda_begin(be, FSO_CS_COMPUTE);
    fso_cuda_narrow(be, dst, src, n);
    fso_cuda_end(be, FSO_CS_COMPUTE, "cast_f32_bf16");
}

/* ------------------------------------------------------------ AdamW */

struct k_adamw {
    standin_kernel k;
    float *master, *m, *v;
    const float *grad;
    void *out;
    int out_bf16;
    size_t n;
    fso_adamw_consts c;
};

/* adamw_elem.h's element, the one every AdamW kernel performs (this file
 * is compiled with -ffp-contract=off, as its other users): the CPU
 * reference's bits. The CPU backends have no adamw op (the host updates
 * their memory in place). */
static void adamw_body(fso_backend *cpu, const void *self)
{
    const struct k_adamw *a = self;
    float *master = V(a->master), *m = V(a->m), *v = V(a->v);
    const float *grad = V(a->grad);
    void *out = V(a->out);
    (void)cpu;
    for (size_t i = 0; i < a->n; i++) {
        const float p = fso_adamw_elem(master[i], grad[i], &m[i], &v[i], &a->c);
        master[i] = p;
        if (!out)
            continue;
        if (a->out_bf16)
            ((uint16_t *)out)[i] = fso_bf16_from_f32(p);
        else
            ((float *)out)[i] = p;
    }
}

void fso_cuda_adamw(fso_backend *be, float *master, const float *grad, float *m, float *v,
                    void *out, int out_bf16, size_t n, const fso_adamw_consts *c)
{
    if (n == 0)
        return;
    struct k_adamw k = {{adamw_body, 0}, master, m, v, grad, out, out_bf16, n, *c};
    COMPUTE(be, "adamw", k);
}
