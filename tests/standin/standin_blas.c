/* standin_blas.c — the cuBLAS entry points fsoff's CUDA module calls, on
 * the CPU: a handle bound to a stream, cublasGemmEx and
 * cublasGemmStridedBatchedEx (column-major; A and B both CUDA_R_32F or both
 * CUDA_R_16BF, C CUDA_R_32F or CUDA_R_16BF, not fp32 operands into a bf16
 * C). Each call is one "gemm" item on the handle's stream (fail_kernel
 * counts it): bf16 is widened exactly, the product is OpenBLAS's sgemm per
 * batch, beta scales the widened old C, a bf16 C is rounded to nearest
 * even once. CUBLAS_COMPUTE_32F_FAST_16BF rounds fp32 operands to bf16
 * first (as the tensor cores do); the other fp32 compute types are plain
 * fp32. alpha and beta are read from host memory at the call. An operand
 * outside device memory or one pinned host range fails the item with
 * cudaErrorIllegalAddress (sticky), as a real kernel's bad access does.
 */
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <cublas_v2.h>

#include "standin_rt.h"

#define BLAS_MAGIC 0x424c4153u

struct cublasContext {
    uint32_t magic;
    int device;
    cudaStream_t stream;
    void *ws;
    size_t ws_bytes;
};

cublasStatus_t cublasCreate_v2(cublasHandle_t *out)
{
    if (!out)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!si_device(si_current()))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    struct cublasContext *h = calloc(1, sizeof *h);
    if (!h)
        return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = BLAS_MAGIC;
    h->device = si_current();
    *out = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
    if (!h || h->magic != BLAS_MAGIC)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->magic = 0;
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    if (!h || h->magic != BLAS_MAGIC)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    si_dev *d = si_stream_dev(s);
    if (s && (!d || d->index != h->device))
        return CUBLAS_STATUS_INVALID_VALUE;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

/* The stand-in needs no workspace; the range is checked and kept. */
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t bytes)
{
    if (!h || h->magic != BLAS_MAGIC)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && si_classify(ws, bytes, NULL) != SI_DEVICE)
        return CUBLAS_STATUS_INVALID_VALUE;
    h->ws = ws;
    h->ws_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

static const struct {
    cublasStatus_t s;
    const char *name, *text;
} status_tab[] = {
    {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "the operation completed successfully"},
    {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED",
     "the library was not initialized"},
    {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "the resource allocation failed"},
    {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE",
     "an invalid numeric value was used as an argument"},
    {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH",
     "an absent device architectural feature is required"},
    {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED",
     "the GPU program failed to execute"},
    {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR",
     "an internal operation failed"},
    {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED",
     "the functionality requested is not supported (by the fsoff CUDA stand-in)"},
};

const char *cublasGetStatusName(cublasStatus_t s)
{
    for (size_t i = 0; i < sizeof status_tab / sizeof status_tab[0]; i++)
        if (status_tab[i].s == s)
            return status_tab[i].name;
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    for (size_t i = 0; i < sizeof status_tab / sizeof status_tab[0]; i++)
        if (status_tab[i].s == s)
            return status_tab[i].text;
    return "unknown status";
}

/* ------------------------------------------------------------ gemm */

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

struct gemm_arg {
    bool bad_address;
    bool round16;           /* FAST_16BF: fp32 operands rounded to bf16 */
    CBLAS_TRANSPOSE ta, tb;
    int m, n, k, lda, ldb, ldc, batch;
    long long sa, sb, sc;   /* strides, elements */
    float alpha, beta;
    bool a16, c16;          /* A/B bf16; C bf16 */
    const void *A, *B;      /* worker views */
    void *C;
};

/* rows x cols of an operand stored with leading dimension ld, as compact
 * fp32 (ld = rows): widened bf16 or, with round16, fp32 rounded to bf16. */
static float *compact(const void *src, bool bf16, bool round16, int rows, int cols, int ld)
{
    float *out = malloc(sizeof(float) * (size_t)rows * (size_t)cols + 1);
    if (!out)
        return NULL;
    for (int j = 0; j < cols; j++)
        for (int i = 0; i < rows; i++) {
            size_t at = (size_t)j * (size_t)ld + (size_t)i;
            float v = bf16 ? bf16_to_f32(((const uint16_t *)src)[at]) : ((const float *)src)[at];
            if (round16 && !bf16)
                v = bf16_to_f32(f32_to_bf16(v));
            out[(size_t)j * (size_t)rows + (size_t)i] = v;
        }
    return out;
}

static cudaError_t gemm_one(const struct gemm_arg *g, const void *A, const void *B, void *C)
{
    const int ra = g->ta == CblasNoTrans ? g->m : g->k, ca = g->ta == CblasNoTrans ? g->k : g->m;
    const int rb = g->tb == CblasNoTrans ? g->k : g->n, cb = g->tb == CblasNoTrans ? g->n : g->k;
    const bool conv_ab = g->a16 || g->round16;
    float *a = conv_ab ? compact(A, g->a16, g->round16, ra, ca, g->lda) : (float *)A;
    float *b = conv_ab ? compact(B, g->a16, g->round16, rb, cb, g->ldb) : (float *)B;
    float *c = g->c16 ? malloc(sizeof(float) * (size_t)g->m * (size_t)g->n + 1) : C;
    const int lda = conv_ab ? ra : g->lda, ldb = conv_ab ? rb : g->ldb;
    const int ldc = g->c16 ? g->m : g->ldc;
    cudaError_t e = cudaErrorMemoryAllocation;
    if (!a || !b || !c)
        goto out;
    for (int j = 0; j < g->n; j++) /* C = beta C, never reading C when beta is 0 */
        for (int i = 0; i < g->m; i++) {
            size_t at = (size_t)j * (size_t)g->ldc + (size_t)i;
            float old = g->beta == 0.0f ? 0.0f
                        : g->c16    ? bf16_to_f32(((const uint16_t *)C)[at])
                                    : ((float *)C)[at];
            c[(size_t)j * (size_t)ldc + (size_t)i] = g->beta == 0.0f ? 0.0f : g->beta * old;
        }
    if (g->k > 0)
        cblas_sgemm(CblasColMajor, g->ta, g->tb, g->m, g->n, g->k, g->alpha, a, lda ? lda : 1, b,
                    ldb ? ldb : 1, 1.0f, c, ldc ? ldc : 1);
    if (g->c16)
        for (int j = 0; j < g->n; j++)
            for (int i = 0; i < g->m; i++)
                ((uint16_t *)C)[(size_t)j * (size_t)g->ldc + (size_t)i] =
                    f32_to_bf16(c[(size_t)j * (size_t)ldc + (size_t)i]);
    e = cudaSuccess;
out:
    if (conv_ab) {
        free(a);
        free(b);
    }
    if (g->c16)
        free(c);
    return e;
}

static cudaError_t run_gemm(void *p)
{
    const struct gemm_arg *g = p;
    if (g->bad_address)
        return cudaErrorIllegalAddress;
    const size_t ea = g->a16 ? 2 : 4, ec = g->c16 ? 2 : 4;
    for (int i = 0; i < g->batch; i++) {
        cudaError_t e = gemm_one(g, (const char *)g->A + (size_t)(i * g->sa) * ea,
                                 (const char *)g->B + (size_t)(i * g->sb) * ea,
                                 (char *)g->C + (size_t)(i * g->sc) * ec);
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

/* The bytes an operand spans: batch matrices rows x cols, ld apart. */
static size_t span_bytes(int rows, int cols, int ld, long long stride, int batch, size_t elem)
{
    if (rows == 0 || cols == 0 || batch == 0)
        return 0;
    size_t one = (size_t)(cols - 1) * (size_t)ld + (size_t)rows;
    return ((size_t)(batch - 1) * (size_t)stride + one) * elem;
}

static bool addressable(const void *p, size_t bytes)
{
    if (bytes == 0)
        return true;
    enum si_where w = si_classify(p, bytes, NULL);
    return w == SI_DEVICE || w == SI_PINNED;
}

static cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb,
                           int m, int n, int k, const void *alpha, const void *A,
                           cudaDataType Atype, int lda, long long sa, const void *B,
                           cudaDataType Btype, int ldb, long long sb, const void *beta, void *C,
                           cudaDataType Ctype, int ldc, long long sc, int batch,
                           cublasComputeType_t ct)
{
    if (!h || h->magic != BLAS_MAGIC)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (Atype != Btype || (Atype != CUDA_R_32F && Atype != CUDA_R_16BF) ||
        (Ctype != CUDA_R_32F && Ctype != CUDA_R_16BF) ||
        (Atype == CUDA_R_32F && Ctype == CUDA_R_16BF))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (ct != CUBLAS_COMPUTE_32F && ct != CUBLAS_COMPUTE_32F_PEDANTIC &&
        ct != CUBLAS_COMPUTE_32F_FAST_16BF && ct != CUBLAS_COMPUTE_32F_FAST_TF32)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!h->stream) /* the legacy default stream: not imitated */
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const bool op_ok = (transa == CUBLAS_OP_N || transa == CUBLAS_OP_T || transa == CUBLAS_OP_C) &&
                       (transb == CUBLAS_OP_N || transb == CUBLAS_OP_T || transb == CUBLAS_OP_C);
    if (!op_ok || m < 0 || n < 0 || k < 0 || batch < 0 || sa < 0 || sb < 0 || sc < 0 || !alpha ||
        !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    const int ra = transa == CUBLAS_OP_N ? m : k, ca = transa == CUBLAS_OP_N ? k : m;
    const int rb = transb == CUBLAS_OP_N ? k : n, cb = transb == CUBLAS_OP_N ? n : k;
    if (lda < (ra > 1 ? ra : 1) || ldb < (rb > 1 ? rb : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0 || batch == 0)
        return CUBLAS_STATUS_SUCCESS;
    struct gemm_arg *g = calloc(1, sizeof *g);
    if (!g)
        return CUBLAS_STATUS_ALLOC_FAILED;
    g->ta = transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
    g->tb = transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
    g->m = m;
    g->n = n;
    g->k = k;
    g->lda = lda;
    g->ldb = ldb;
    g->ldc = ldc;
    g->sa = sa;
    g->sb = sb;
    g->sc = sc;
    g->batch = batch;
    g->alpha = *(const float *)alpha;
    g->beta = *(const float *)beta;
    g->a16 = Atype == CUDA_R_16BF;
    g->c16 = Ctype == CUDA_R_16BF;
    g->round16 = !g->a16 && ct == CUBLAS_COMPUTE_32F_FAST_16BF;
    const size_t ea = g->a16 ? 2 : 4, ec = g->c16 ? 2 : 4;
    g->bad_address = !(k == 0 || (addressable(A, span_bytes(ra, ca, lda, sa, batch, ea)) &&
                                  addressable(B, span_bytes(rb, cb, ldb, sb, batch, ea)))) ||
                     !addressable(C, span_bytes(m, n, ldc, sc, batch, ec));
    g->A = si_view(A);
    g->B = si_view(B);
    g->C = si_view(C);
    cudaError_t e = si_enqueue(h->stream, "gemm", run_gemm, g, NULL, SI_FAULT_KERNEL, NULL);
    if (e == cudaErrorInvalidResourceHandle)
        return CUBLAS_STATUS_INVALID_VALUE;
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb,
                            int m, int n, int k, const void *alpha, const void *A,
                            cudaDataType Atype, int lda, const void *B, cudaDataType Btype,
                            int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    return gemm(h, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C,
                Ctype, ldc, 0, 1, computeType);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B,
                                          cudaDataType Btype, int ldb, long long int strideB,
                                          const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    return gemm(h, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB,
                beta, C, Ctype, ldc, strideC, batchCount, computeType);
}
