/* cuda_impl.h — private to kernels/: the CUDA backend's context, its stream
 * ordering and error recording, and the op launchers of the .cu files.
 * C-compatible: included by cuda_backend.c, coll_nccl.c, coll_nccl_rail.c and
 * the .cu files.
 */
#ifndef FSO_CUDA_IMPL_H
#define FSO_CUDA_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "backend.h"
#include "cuda_backend.h"
#include "sum_order.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fso_cuda_stream {
    FSO_CS_COMPUTE,
    FSO_CS_H2D,
    FSO_CS_D2H,
    FSO_CS_COLL,
    FSO_CS_N
} fso_cuda_stream;

/* Bits of the device error word that kernels set (read back by sync). */
#define FSO_CUDA_FLAG_BAD_TOKEN 1u   /* embedding: token id outside [0, V) */
#define FSO_CUDA_FLAG_BAD_TARGET 2u  /* cross-entropy: target outside [0, V) */

#define FSO_CUDA_SQ_MAX 1024  /* sqnorm results awaiting a sync; more forces one */

typedef struct fso_cuda_alloc {
    void *ptr;
    size_t bytes;   /* as counted in mem_used_bytes */
} fso_cuda_alloc;

typedef struct fso_cuda_ctx {
    pthread_mutex_t mu;               /* the ordering state and rc, when two host
                                         threads share the backend (the engine's
                                         optimizer thread copies while its rank
                                         thread computes) */
    int ordinal;
    int sm_count;
    fso_cuda_math math;
    bool sync_each;                   /* FSO_CUDA_SYNC=1: wait and check after every item */
    bool spin;                        /* FSO_CUDA_WAIT=spin: host waits spin (else block) */
    cudaStream_t stream[FSO_CS_N];
    cudaEvent_t tail[FSO_CS_N];       /* recorded at the end of a stream's queued work */
    uint64_t gen[FSO_CS_N];           /* items queued on each stream */
    uint64_t recorded[FSO_CS_N];      /* gen[s] when tail[s] was last recorded */
    uint64_t waited[FSO_CS_N][FSO_CS_N]; /* [t][s]: stream t is ordered after gen s */
    cudaEvent_t gather_ev;            /* recorded after the last all-gather */
    uint64_t gather_gen;              /* gen[FSO_CS_COLL] then, 0: none yet */
    cublasHandle_t blas;
    void *blas_ws;
    size_t blas_ws_bytes;
    void *scratch;                    /* compute-stream scratch, grown rarely */
    size_t scratch_bytes;
    int mempools;                     /* cudaMallocAsync available */
    unsigned *dev_flags;              /* FSO_CUDA_FLAG_* set by kernels */
    unsigned *host_flags;             /* pinned copy, read by sync */
    double *host_sq;                  /* pinned ring: sqnorm results, FSO_CUDA_SQ_MAX */
    double *sq_out[FSO_CUDA_SQ_MAX];  /* where each goes */
    uint64_t sq_head, sq_tail;        /* results queued / added to their outputs */
    cudaEvent_t mark_ev[FSO_CUDA_MARKS][FSO_CS_N]; /* a ring of marks, per stream */
    bool mark_set[FSO_CUDA_MARKS][FSO_CS_N];
    uint64_t mark_gen[FSO_CUDA_MARKS][FSO_CS_N]; /* gen[s] when recorded */
    uint64_t mark_ticket[FSO_CUDA_MARKS]; /* (n << 1) | 1 for a copies-only mark */
    uint64_t mark_sq[FSO_CUDA_MARKS]; /* sq_head when a full mark was taken */
    uint64_t n_marks;                 /* marks handed out */
    uint64_t stale_marks;             /* marks used after they left the ring */
    fso_cuda_alloc *allocs;
    size_t n_allocs, cap_allocs;
    int rc;                           /* first failure, sticky; detail in be->err */
} fso_cuda_ctx;

#define FSO_CUDA_CTX(be) ((fso_cuda_ctx *)(be)->ctx)

/* Keep the first failure: rc (negative errno) with a message. */
void fso_cuda_fail(fso_backend *be, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The kept failure: 0 or a negative errno. */
int fso_cuda_status(fso_backend *be);
/* Record a CUDA error (if any) of `what`; returns 0 or the negative errno. */
int fso_cuda_check(fso_backend *be, cudaError_t e, const char *what);
int fso_cuda_check_blas(fso_backend *be, cublasStatus_t s, const char *what);
/* A CUDA error as a negative errno. */
int fso_cuda_errno(cudaError_t e);
/* An NCCL result (ncclResult_t; an int here, nccl.h being only the
 * collectives' include) as a negative errno, 0 for ncclSuccess: coll_nccl.c,
 * coll_nccl_rail.c. */
int fso_nccl_errno(int result);

/* Make `be`'s device current and order stream s after the work queued on
 * the backend's other streams; returns the stream to queue on. Compute
 * (s = FSO_CS_COMPUTE) is ordered as backend.h's order_after says: after
 * the host-to-device copies and the all-gathers (fso_cuda_end_gather), not
 * after the device-to-host copies or the other collectives, short of an
 * order_after. */
cudaStream_t fso_cuda_begin(fso_backend *be, fso_cuda_stream s);
/* The same, ordered only after the work queued before mark `after` on the
 * other streams, and after every host-to-device copy queued so far (what a
 * gather sends may have just been copied in). 0, or a mark gone from the
 * ring: after all of it, as fso_cuda_begin. */
cudaStream_t fso_cuda_begin_after(fso_backend *be, fso_cuda_stream s, uint64_t after);
/* Work was queued on s: later work on other streams must wait for it.
 * Checks for a launch error of `what`. */
void fso_cuda_end(fso_backend *be, fso_cuda_stream s, const char *what);
/* fso_cuda_end of an all-gather on FSO_CS_COLL: compute queued later waits
 * for it (and, the stream being in order, for the collectives before it). */
void fso_cuda_end_gather(fso_backend *be, const char *what);

/* At least `bytes` of device scratch on the compute stream, valid until
 * the next call (ops run one after another on that stream); NULL after a
 * recorded failure. It only grows, to exactly the request rounded up to
 * 2 MiB (the planner reserves the widest op's need), so a training step's
 * ops stop growing it after the first step. An op that needs
 * several regions asks once for their total and splits it
 * (fso_cuda_scratch_part), never twice: a second call may move the first
 * region. */
void *fso_cuda_scratch(fso_backend *be, size_t bytes);

/* Splitting one scratch request: each part starts on a 256-byte boundary.
 * Add up the sizes with fso_cuda_scratch_round, then take the parts in the
 * same order from the base with fso_cuda_scratch_part. */
static inline size_t fso_cuda_scratch_round(size_t bytes)
{
    return (bytes + 255) & ~(size_t)255;
}

static inline void *fso_cuda_scratch_part(char **cursor, size_t bytes)
{
    void *p = *cursor;
    *cursor += fso_cuda_scratch_round(bytes);
    return p;
}

/* The column sums of rmsnorm_bwd's dw and bias_bwd's db: partial sums over
 * chunks of FSO_CUDA_COL_CHUNK_ROWS rows in compute-stream scratch, then
 * the partials in chunk order. The scratch one such op asks for. */
#define FSO_CUDA_COL_CHUNK_ROWS 64
static inline size_t fso_cuda_col_scratch_bytes(int N, int C)
{
    const size_t chunks = ((size_t)N + FSO_CUDA_COL_CHUNK_ROWS - 1) / FSO_CUDA_COL_CHUNK_ROWS;
    return sizeof(float) * chunks * (size_t)C;
}

/* cuBLAS: C = alpha op(A) op(B) + beta C, column-major; batch > 1 uses the
 * strides (in elements). A and B are stored in ab_dt, C in c_dt. fp32
 * operands use the backend's math (fp32 C only); bf16 operands run on the
 * tensor cores with fp32 accumulation (CUBLAS_COMPUTE_32F) into an fp32 C,
 * or a bf16 C rounded once (beta != 0 adds its widened value first). */
void fso_cuda_gemm(fso_backend *be, fso_dtype ab_dt, fso_dtype c_dt, int trans_a, int trans_b,
                   int m, int n, int k, float alpha, const void *A, int lda, long long stride_a,
                   const void *B, int ldb, long long stride_b, float beta, void *C, int ldc,
                   long long stride_c, int batch);

/* The ops (backend.h), defined in cuda_ops.cu, cuda_matmul.c and
 * cuda_attention.c. */
void fso_cuda_embedding_fwd(fso_backend *be, float *out, const int32_t *tok, const void *wte,
                            fso_dtype dt, int N, int C);
void fso_cuda_embedding_bwd(fso_backend *be, float *dwte, const int32_t *tok, const float *dout,
                            int N, int C);
void fso_cuda_rmsnorm_fwd(fso_backend *be, void *out, float *rstd, const float *x, const void *w,
                          fso_dtype dt, int N, int C, float eps);
void fso_cuda_rmsnorm_bwd(fso_backend *be, float *dx, float *dw, const float *dout,
                          const float *x, const void *w, fso_dtype dt, const float *rstd, int N,
                          int C);
void fso_cuda_matmul_fwd(fso_backend *be, void *out, fso_dtype out_dt, const void *x,
                         const void *w, fso_dtype dt, int N, int Cin, int Cout);
void fso_cuda_matmul_bwd(fso_backend *be, void *dx, fso_dtype dx_dt, float *dw, const void *dout,
                         fso_dtype dout_dt, const void *x, const void *w, fso_dtype dt, int N,
                         int Cin, int Cout, float dx_beta);
void fso_cuda_rope(fso_backend *be, void *x, fso_dtype dt, const float *cos_t,
                   const float *sin_t, const int32_t *pos, int B, int T, int nh, int D,
                   int inverse);
void fso_cuda_attention_fwd(fso_backend *be, void *out, void *probs, const void *q,
                            const void *k, const void *v, const int32_t *pos, fso_dtype dt,
                            int B, int T, int H, int Hkv, int D);
void fso_cuda_attention_bwd(fso_backend *be, void *dq, void *dk, void *dv, const void *dout,
                            const void *probs, const void *q, const void *k, const void *v,
                            const int32_t *pos, fso_dtype dt, int B, int T, int H, int Hkv,
                            int D);
void fso_cuda_swiglu_fwd(fso_backend *be, void *out, const void *gate, const void *up,
                         fso_dtype dt, size_t n);
void fso_cuda_swiglu_bwd(fso_backend *be, void *dgate, void *dup, const void *dout,
                         const void *gate, const void *up, fso_dtype dt, size_t n);
void fso_cuda_bias_add(fso_backend *be, void *out, const void *b, fso_dtype dt, int N, int C);
void fso_cuda_bias_bwd(fso_backend *be, float *db, const void *dout, fso_dtype dt, int N, int C);
void fso_cuda_add(fso_backend *be, float *out, const float *a, const float *b, size_t n);
void fso_cuda_cross_entropy(fso_backend *be, float *dlogits, float *losses, const float *logits,
                            const int32_t *targets, int N, int V, float dscale);
void fso_cuda_cast_bf16_f32(fso_backend *be, float *dst, const uint16_t *src, size_t n);
void fso_cuda_cast_f32_bf16(fso_backend *be, uint16_t *dst, const float *src, size_t n);
void fso_cuda_adamw(fso_backend *be, float *master, const float *grad, float *m, float *v,
                    void *out, int out_bf16, size_t n, const fso_adamw_consts *c);

/* The casts' kernels queued on the compute stream inside an op (no
 * ordering of their own): narrow rounds to nearest even as cast_f32_bf16,
 * widen is exact. */
void fso_cuda_narrow(fso_backend *be, uint16_t *dst, const float *src, size_t n);
void fso_cuda_widen(fso_backend *be, float *dst, const uint16_t *src, size_t n);
/* dst (n) fp32 = sum over rows k = 0..rows-1, in that order, of src[k*n + i]
 * bf16 widened, added in fp32, queued on stream s: reduce_scatter_bf16's
 * sum (coll_nccl.c). dst and src do not overlap. */
void fso_cuda_sum_bf16_rows(cudaStream_t s, float *dst, const uint16_t *src, int rows, size_t n);

/* Attention's row kernels (cuda_softmax.cu), queued on the compute stream
 * inside an op. Both take `rows` rows of T fp32 values, contiguous, row r
 * being position r % T of head r / T; probabilities and their gradient
 * are stored in dt, zero above the diagonal.
 *   causal_softmax: in (rows, T) scaled scores -> out = causal softmax,
 *     out's row r at out + (r / T) * out_head_elems + (r % T) * T; out may
 *     be in (fp32, out_head_elems T*T). With pos (attention's, backend.h),
 *     row r is of batch (r / T) / heads, counted from pos's first row, and
 *     attends from key t - pos[batch * T + t] on (its document); NULL:
 *     from key 0.
 *   causal_softmax_bwd: dp (rows, T) = dP -> ds (rows, T) = P * (dP -
 *     rowsum(P * dP)) * scale, P's row r at probs + (r / T) *
 *     probs_head_elems + (r % T) * T; ds may be dp (fp32). */
void fso_cuda_causal_softmax(fso_backend *be, void *out, fso_dtype dt, size_t out_head_elems,
                             const float *in, size_t rows, int T, const int32_t *pos,
                             int heads);
void fso_cuda_causal_softmax_bwd(fso_backend *be, void *ds, fso_dtype dt, const float *dp,
                                 const void *probs, size_t probs_head_elems, size_t rows, int T,
                                 float scale);

/* sqnorm's and sum's reduction is fsoff's one order (sum_order.h): a block
 * of FSO_CUDA_REDUCE_THREADS threads per chunk of FSO_CUDA_REDUCE_CHUNK
 * elements (thread t a lane), then one block over the chunk sums (thread t
 * a slot: chunks t, t + THREADS, ... in order). */
#define FSO_CUDA_REDUCE_THREADS FSO_SUM_LANES
#define FSO_CUDA_REDUCE_CHUNK FSO_SUM_CHUNK

/* sqnorm's and sum's device part (cuda_ops.cu): scratch[0] = sum of x^2
 * (square) or of x over n device-readable floats, in double, in that order,
 * which does not depend on the GPU. scratch holds
 * fso_cuda_reduce_scratch_elems(n) doubles: the total, then a chunk's sum
 * each. */
void fso_cuda_reduce_device(fso_backend *be, double *scratch, const float *x, size_t n,
                            int square);
static inline size_t fso_cuda_reduce_scratch_elems(size_t n)
{
    return 1 + fso_sum_chunks(n);
}
/* The same sum of n host floats on the CPU, bit for bit the device's. */
static inline double fso_cuda_reduce_host(const float *x, size_t n, int square)
{
    return fso_sum_ordered(x, n, square);
}

#ifdef __cplusplus
}
#endif

#endif
