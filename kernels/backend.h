/* backend.h — the compute backend interface (ARCHITECTURE.md, The seams).
 *
 * A backend owns device memory and runs the ops of a Llama block forward and
 * backward. It is a table of function pointers plus a context, like
 * ggml-backend or fio's ioengine_ops. Implementations:
 *   - "cpu-ref": plain loops, one thread, written to be read; the reference
 *     every other implementation is tested against;
 *   - "cpu": the fast CPU path (OpenBLAS sgemm in tiles on fsoff's own
 *     thread pool, kernels/pool.h), the default where there is no GPU;
 *   - "cuda" (cuda_backend.h): NVIDIA GPUs;
 *   - "cpu-async" (cpu_async.h): "cpu"'s math with a discrete GPU's rules
 *     (device memory the host cannot touch, work that completes only when
 *     the host waits), so tests hold the engine's GPU paths to "cpu"'s bits
 *     on machines without a GPU.
 *
 * Conventions:
 *   - Pointers passed to ops are device pointers from buf_alloc (on the CPU
 *     backends, host memory). Activations are row-major with N = B*T rows.
 *     Weights follow PyTorch's Linear layout: (out, in). "+=" in a comment
 *     means the op accumulates into its output, so gradients add up across
 *     micro-batches.
 *   - Types. Math is fp32 (accumulation included). What is stored is fp32
 *     or bf16 (fso_dtype): an op taking a `dt` reads and writes the tensors
 *     its comment marks [dt] in that type, the rest in fp32. A model runs
 *     with one working type: its weights as lent and the activations inside
 *     a layer (norm outputs, q/k/v, attention probabilities and output, MLP
 *     activations, and their gradients) are [dt]; the residual stream, its
 *     gradient, weight gradients, rstd, logits and losses stay fp32. Values
 *     read in bf16 widen exactly; an output stored in bf16 is rounded once,
 *     to nearest even. The CPU backends compute everything else in fp32 on
 *     the widened values, so they agree with each other to fp32 rounding.
 *     The CUDA backend's products run on tensor cores, which round their
 *     fp32 operands to bf16 (an fp32 dout, attention probabilities and
 *     their gradient inside attention); test_cuda's tolerances cover that.
 *   - Ops are asynchronous in principle: they return nothing and record any
 *     failure; sync() waits for all queued work and returns 0 or the first
 *     failure as a negative errno (the detail is in err). On the CPU backends
 *     ops run in place and cannot fail.
 */
#ifndef FSO_BACKEND_H
#define FSO_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FSO_BACKEND_ERR_MAX 256

/* How a tensor is stored. */
typedef enum fso_dtype { FSO_DT_F32 = 0, FSO_DT_BF16 = 1 } fso_dtype;

/* Bytes per element of dt. */
static inline size_t fso_dtype_size(fso_dtype dt)
{
    return dt == FSO_DT_BF16 ? 2 : 4;
}

/* fp32 to bf16 as every CPU path rounds (the backends' casts, AdamW's bf16
 * output, checkpoints and exports): round to nearest even of the fp32 bits,
 * denormals kept (no flush), overflow to +-Inf, a NaN kept NaN as
 * (bits >> 16) | 0x0040 (quiet, sign and top payload kept). Written without
 * a branch so a loop of it vectorizes. The GPU's device copy is
 * cuda_common.cuh's. */
static inline uint16_t fso_bf16_from_f32(float f)
{
    union { float f; uint32_t u; } x = {.f = f};
    const uint32_t rne = (x.u + 0x7fffu + ((x.u >> 16) & 1u)) >> 16;
    const uint32_t nan = (x.u >> 16) | 0x0040u;
    return (uint16_t)((x.u & 0x7fffffffu) > 0x7f800000u ? nan : rne);
}

/* bf16 to fp32: exact, the bits moved up (NaN payloads kept). */
static inline float fso_f32_from_bf16(uint16_t h)
{
    union { uint32_t u; float f; } x = {.u = (uint32_t)h << 16};
    return x.f;
}

typedef struct fso_backend fso_backend;
struct fso_coll;
struct fso_pool;

/* AdamW's per-step constants, as offload/adamw.h computes them
 * (fso_adamw_consts_init) for its CPU kernels and a device's. */
typedef struct fso_adamw_consts {
    float scale;           /* grad_scale */
    float decay;           /* 1 - lr * weight_decay */
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float step_size;       /* lr / (1 - beta1^t) */
    float bc2_sqrt;        /* sqrt(1 - beta2^t) */
    float eps;
} fso_adamw_consts;

typedef struct fso_backend_ops {
    const char *name;
    int host_addressable;   /* 1: device pointers are host memory the CPU may use */

    /* memory */
    int  (*buf_alloc)(fso_backend *be, size_t bytes, void **out);
    void (*buf_free)(fso_backend *be, void *buf);
    void (*memset0)(fso_backend *be, void *dst, size_t bytes);
    void (*copy_h2d)(fso_backend *be, void *dst, const void *src, size_t bytes);
    void (*copy_d2h)(fso_backend *be, void *dst, const void *src, size_t bytes);
    int  (*sync)(fso_backend *be);

    /* out (N,C) = wte[tok] ; tok (N) int32, wte (V,C) [dt] */
    void (*embedding_fwd)(fso_backend *be, float *out, const int32_t *tok, const void *wte,
                          fso_dtype dt, int N, int C);
    /* dwte (V,C) += scatter of dout (N,C) by tok */
    void (*embedding_bwd)(fso_backend *be, float *dwte, const int32_t *tok, const float *dout,
                          int N, int C);

    /* out (N,C) [dt] = x / rms(x) * w [dt] ; rstd (N) saved for backward */
    void (*rmsnorm_fwd)(fso_backend *be, void *out, float *rstd, const float *x, const void *w,
                        fso_dtype dt, int N, int C, float eps);
    /* dx (N,C) += ; dw (C) += ; w [dt] */
    void (*rmsnorm_bwd)(fso_backend *be, float *dx, float *dw, const float *dout, const float *x,
                        const void *w, fso_dtype dt, const float *rstd, int N, int C);

    /* out (N,Cout) [out_dt] = x (N,Cin) [dt] · w (Cout,Cin) [dt]^T */
    void (*matmul_fwd)(fso_backend *be, void *out, fso_dtype out_dt, const void *x, const void *w,
                       fso_dtype dt, int N, int Cin, int Cout);
    /* dx (N,Cin) [dx_dt] = dx_beta*dx + dout·w ; dw (Cout,Cin) += dout^T·x.
     * dout (N,Cout) [dout_dt]; x, w [dt]. dx may be NULL; its old value is
     * added in fp32 before the sum is stored. */
    void (*matmul_bwd)(fso_backend *be, void *dx, fso_dtype dx_dt, float *dw, const void *dout,
                       fso_dtype dout_dt, const void *x, const void *w, fso_dtype dt, int N,
                       int Cin, int Cout, float dx_beta);

    /* Rotate x (B,T,nh,D) [dt] in place by RoPE (rotate-half); cos, sin
     * (T, D/2). inverse=1 applies the transpose rotation (the backward).
     * pos (B,T) int32, each token's position (0 <= pos < T), or NULL: token
     * t of a row is at position t. */
    void (*rope)(fso_backend *be, void *x, fso_dtype dt, const float *cos, const float *sin,
                 const int32_t *pos, int B, int T, int nh, int D, int inverse);

    /* Causal attention with grouped-query heads, every tensor [dt]. q
     * (B,T,H,D), k and v (B,T,Hkv,D), out (B,T,H,D); probs (B,H,T,T) saved
     * for backward, 0 where a token does not attend. Scores and softmax are
     * computed in fp32. pos (B,T) int32, each token's position in its
     * document, or NULL (one document a row): token t attends to the tokens
     * s of its row with t - pos[t] <= s <= t, its document's so far
     * (block-diagonal causal). */
    void (*attention_fwd)(fso_backend *be, void *out, void *probs, const void *q, const void *k,
                          const void *v, const int32_t *pos, fso_dtype dt, int B, int T, int H,
                          int Hkv, int D);
    /* dq (B,T,H,D) = ; dk, dv (B,T,Hkv,D) = (overwritten); every tensor [dt];
     * pos as the forward's */
    void (*attention_bwd)(fso_backend *be, void *dq, void *dk, void *dv, const void *dout,
                          const void *probs, const void *q, const void *k, const void *v,
                          const int32_t *pos, fso_dtype dt, int B, int T, int H, int Hkv, int D);

    /* out (n) = silu(gate) * up, every tensor [dt] */
    void (*swiglu_fwd)(fso_backend *be, void *out, const void *gate, const void *up,
                       fso_dtype dt, size_t n);
    /* dgate, dup (n) = (overwritten), every tensor [dt] */
    void (*swiglu_bwd)(fso_backend *be, void *dgate, void *dup, const void *dout,
                       const void *gate, const void *up, fso_dtype dt, size_t n);

    /* A linear layer's bias (Qwen2's q/k/v projections): out (N,C) [dt] +=
     * b (C) [dt] on every row, the sum rounded once when out is bf16. */
    void (*bias_add)(fso_backend *be, void *out, const void *b, fso_dtype dt, int N, int C);
    /* db (C) += the sum over the N rows of dout (N,C) [dt]: the bias's
     * gradient, rows added in order. */
    void (*bias_bwd)(fso_backend *be, float *db, const void *dout, fso_dtype dt, int N, int C);

    /* out (n) = a + b (out may alias a) */
    void (*add)(fso_backend *be, float *out, const float *a, const float *b, size_t n);

    /* Softmax cross-entropy over logits (N,V) against targets (N).
     * losses (N) = -log softmax(logits)[target] ; dlogits (N,V) =
     * (softmax - onehot) * dscale, written over logits (in place allowed).
     * A target < 0 does not count: its loss and its row of dlogits are 0. */
    void (*cross_entropy)(fso_backend *be, float *dlogits, float *losses, const float *logits,
                          const int32_t *targets, int N, int V, float dscale);

    /* *out += sum of x[i]^2 in double (host scalar), in sum_order.h's order
     * on every backend (the same bits). The sum is taken in order with the
     * other ops; *out holds it once sync() has returned, or
     * wait_mark() of a mark taken after the call (the CPU backends add it at
     * once; the CUDA backend copies it back asynchronously, so a step takes
     * its norms without waiting per block). */
    void (*sqnorm)(fso_backend *be, double *out, const float *x, size_t n);
    /* *out += sum of x[i] in double, in the same order, delivered as
     * sqnorm's: the losses of a micro-batch reach the host without a wait. */
    void (*sum)(fso_backend *be, double *out, const float *x, size_t n);

    /* Marks, optional (NULL: the backend's work is done when an op returns,
     * as on the CPU backends). mark() returns a ticket for everything
     * queued so far on every stream; wait_mark() blocks the calling thread
     * until that work is done. A host buffer a copy reads can be reused
     * after its mark, without draining the device. */
    uint64_t (*mark)(fso_backend *be);
    void (*wait_mark)(fso_backend *be, uint64_t ticket);
    /* Order what compute is after (a device's streams: compute, copies
     * each way, collectives). Compute (every op above and below that is
     * not a copy, memset0 included) runs after
     *   - the compute queued before it (one stream, in order),
     *   - the host-to-device copies queued before it (copy_h2d, and
     *     copy_h2d_after once its mark is reached), device-to-device ones
     *     included, and
     *   - the all-gathers queued before it (coll.h): their results are
     *     what compute reads,
     * and NOT after the device-to-host copies (copy_d2h, copy_d2h_after)
     * nor the reduce-scatters queued before it: those read what compute
     * wrote and may still be reading it while later compute runs. So
     * compute that writes a buffer such a copy or reduce-scatter reads,
     * or reads what a reduce-scatter wrote, must first be ordered after
     * it: order_after(be, m) with m a mark taken after that copy or
     * collective makes all compute queued later wait, on the device, for
     * the work before m; the host does not block. Copies and collectives
     * themselves keep their own rules (copy_h2d/copy_d2h and
     * reduce_scatter after everything queued, the _after forms and
     * all_gather after their mark). Optional (NULL: the backend runs its
     * work in the order it was queued, as the CPU backends; call it
     * through fso_backend_order_after). m = 0 does nothing; a mark gone
     * from the window of recent marks orders after everything queued. */
    void (*order_after)(fso_backend *be, uint64_t ticket);
    /* AdamW on the device, in place: master, m, v (n) fp32 updated from
     * grad (n) fp32, each element exactly as offload/adamw.h's scalar
     * reference computes it (the same bits); out (n), when not NULL,
     * receives the new master as bf16 (out_bf16, round to nearest even) or
     * fp32. Optional: NULL where the CPU updates device memory in place
     * (host_addressable backends). */
    void (*adamw)(fso_backend *be, float *master, const float *grad, float *m, float *v,
                  void *out, int out_bf16, size_t n, const fso_adamw_consts *c);

    /* copy_h2d ordered after the work before mark `after` only, besides the
     * earlier copies of its own kind (0: after everything queued so far, as
     * copy_h2d): a copy into a buffer that compute finished with at that
     * mark runs while later compute does. Optional (NULL: copy_h2d). */
    void (*copy_h2d_after)(fso_backend *be, void *dst, const void *src, size_t bytes,
                           uint64_t after);
    /* copy_d2h ordered the same way (after the work before mark `after`,
     * and the host-to-device copies queued so far). Optional (NULL:
     * copy_d2h). */
    void (*copy_d2h_after)(fso_backend *be, void *dst, const void *src, size_t bytes,
                           uint64_t after);
    /* A mark of the copies queued so far in both directions, not of
     * compute: wait_mark() on it returns once those copies are done, which
     * is how a host staging buffer is reused without waiting for the
     * compute queued meanwhile. Optional (NULL: use mark). */
    uint64_t (*mark_copies)(fso_backend *be);
    /* How many marks were used, waited for or given as `after`, once they
     * had left the backend's window of recent marks, since it was made:
     * such a "stale" mark is still honoured, more strictly (a later mark,
     * or all queued work), so the overlap it was for is lost. Optional
     * (NULL: the backend keeps no window, so no mark goes stale). */
    uint64_t (*stale_marks)(fso_backend *be);

    /* dst (n) fp32 = src (n) bf16, exactly: the bf16 bits become the top
     * half of the fp32 bits, so ±0, denormals, Inf and NaN (payload and
     * sign) come through unchanged. dst and src do not overlap. */
    void (*cast_bf16_f32)(fso_backend *be, float *dst, const uint16_t *src, size_t n);
    /* dst (n) bf16 = src (n) fp32 rounded to nearest even (NaNs stay NaN,
     * quiet), as offload/adamw.h rounds: how activations kept for backward
     * are stored with bf16.enabled. dst and src do not overlap. */
    void (*cast_f32_bf16)(fso_backend *be, uint16_t *dst, const float *src, size_t n);

    /* Lifetime, and what comes with a device of this kind. */
    /* Free everything the backend holds, buffers not yet freed included
     * (fso_backend_destroy calls it). */
    void (*destroy)(fso_backend *be);
    /* The thread pool the backend's CPU math runs on, which host work on
     * its buffers may share; NULL (the op, or what it returns): none. */
    struct fso_pool *(*pool)(fso_backend *be);
    /* The collectives (coll.h) among `world` backends of this kind, devs[r]
     * being rank r's: shared memory among host threads for the CPU
     * backends, NCCL for CUDA. 0 or -errno with the reason in err. */
    int (*coll_create)(struct fso_coll **out, int world, fso_backend **devs, char *err,
                       size_t errlen);
} fso_backend_ops;

struct fso_backend {
    const fso_backend_ops *ops;
    void *ctx;
    int threads;
    int device;                 /* index among the process's devices */
    size_t mem_cap_bytes;       /* 0: no cap; else buf_alloc fails past it */
    size_t mem_used_bytes;      /* held now */
    size_t mem_peak_bytes;      /* most held at once */
    char err[FSO_BACKEND_ERR_MAX];
};

/* The backends fsoff knows, one row each: what is known of a backend before
 * one is created, and how to create one. Every capability question asks the
 * row, never the name; names exist for parsing and printing.
 * A row's host_addressable is its ops' (test_ops holds them equal). */
typedef enum fso_backend_kind {
    FSO_BACKEND_CPU = 0,  /* "cpu": the fast CPU backend, the default */
    FSO_BACKEND_CPU_REF,  /* "cpu-ref": the plain reference */
    FSO_BACKEND_CPU_ASYNC,/* "cpu-async": a CPU device with a discrete GPU's rules */
    FSO_BACKEND_CUDA,     /* "cuda": a GPU (the CUDA module, cuda/cuda_backend.h) */
    FSO_N_BACKENDS,
} fso_backend_kind;
/* Device `device` of a process, `threads` CPU threads (0: the CPUs this
 * process may use; cpu-ref always 1; a GPU ignores it), a memory cap in
 * bytes (0: none; a GPU's cap defaults to its memory). 0, or -errno with the
 * reason in err (err may be NULL): -ENOTSUP for a GPU in a build without
 * CUDA, -ENODEV when its module or device cannot be had. */
typedef int (*fso_backend_create_fn)(fso_backend **out, int device, int threads,
                                     size_t mem_cap_bytes, char *err, size_t errlen);
typedef struct fso_backend_row {
    fso_backend_kind kind;
    const char *name;
    bool host_addressable;  /* its buffers are host memory the CPU may use */
    bool gpu;               /* a GPU: its own memory, bf16 computed as bf16 (the CPU
                               backends widen bf16 tensors to fp32 working space) */
    fso_backend_create_fn create;
} fso_backend_row;
/* The row of backend `name` ("" is "cpu"); NULL for a name fsoff does not know. */
const fso_backend_row *fso_backend_find(const char *name);
/* The row of kind k. */
const fso_backend_row *fso_backend_row_of(fso_backend_kind k);
/* A backend of kind k: its row's create. */
int fso_backend_create(fso_backend **out, fso_backend_kind k, int device, int threads,
                       size_t mem_cap_bytes, char *err, size_t errlen);
/* Memory a host-addressable device holds outside buf_alloc: its part of a
 * buffer that several CPU devices share (the engine lends a block of
 * parameters from the one buffer its devices' shards are parts of).
 * Counted as buf_alloc counts, against the cap, in use and at peak;
 * -ENOMEM with the reason in be->err past the cap. fso_backend_uncharge
 * gives it back. */
int fso_backend_charge(fso_backend *be, size_t bytes);
void fso_backend_uncharge(fso_backend *be, size_t bytes);
/* ops->destroy; NULL is fine. */
void fso_backend_destroy(fso_backend *be);

/* ops->pool: the backend's thread pool (the fast CPU backend and
 * cpu-async's), or NULL. */
struct fso_pool *fso_backend_pool(fso_backend *be);

/* Later compute on `be` waits (on the device) for the work queued before
 * mark `ticket` (ops->order_after; nothing where the backend runs in order
 * or ticket is 0). */
static inline void fso_backend_order_after(fso_backend *be, uint64_t ticket)
{
    if (ticket && be->ops->order_after)
        be->ops->order_after(be, ticket);
}

/* A mark of everything queued so far and compute ordered after it: what a
 * device-to-host copy or a reduce-scatter queued before it reads may be
 * written again by compute, and what a reduce-scatter wrote be read. 0
 * where the backend runs in order. */
static inline uint64_t fso_backend_fence(fso_backend *be)
{
    if (!be->ops->order_after || !be->ops->mark)
        return 0;
    uint64_t t = be->ops->mark(be);
    be->ops->order_after(be, t);
    return t;
}

/* ops->stale_marks: the stale marks of `be` so far; 0 when it keeps no
 * window of marks. */
uint64_t fso_backend_stale_marks(fso_backend *be);

/* The collectives among `world` devices, devs[r] being rank r's, all of
 * one kind: devs[0]'s ops->coll_create. 0 or -errno with the reason in err. */
int fso_backend_coll_create(struct fso_coll **out, int world, fso_backend **devs, char *err,
                            size_t errlen);

/* *out += sum of x[i]^2 over host memory, in double, in sum_order.h's
 * order (a device's sqnorm gives the same bits), its chunks over the pool's
 * threads: the fast CPU backend's sqnorm, usable on host buffers whatever
 * the device backend (pool may be NULL). */
void fso_host_sqnorm(struct fso_pool *pool, double *out, const float *x, size_t n);
/* *out += sum of x[i], the same way: the CPU backends' sum. */
void fso_host_sum(struct fso_pool *pool, double *out, const float *x, size_t n);

/* dst (n) = the sum of the nsrc sources in their order, or dst + that sum
 * when accumulating; with sq, *sq += its squares as fso_host_sqnorm adds
 * them (the same bits), taken chunk by chunk while the sums are in cache:
 * a reduce-scatter in host memory and its norm in one pass. dst may be a
 * source. */
void fso_host_reduce_sqnorm(struct fso_pool *pool, float *dst, const float *const *src, int nsrc,
                            size_t n, bool accumulate, double *sq);

/* The CPUs this process may run on (sched_getaffinity), at least 1. */
int fso_cpu_count(void);

/* RoPE tables: cos, sin (T, D/2) for positions 0..T-1, HF's inv_freq unscaled
 * (rope.h builds them with rope_scaling). */
void fso_rope_tables(float *cos, float *sin, int T, int D, double theta);

#endif
