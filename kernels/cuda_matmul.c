/* cuda_matmul.c — the CUDA backend's linear layers through cuBLAS.
 *
 * Row-major (N, Cin) activations and PyTorch-layout (Cout, Cin) weights are
 * read by cuBLAS as their column-major transposes, so every product below
 * is the transpose of the formula in backend.h:
 *   out^T (Cout, N)  = w^T' x^T          gemm(T, N)
 *   dx^T  (Cin, N)   = w^T  dout^T       gemm(N, N)
 *   dw^T  (Cin, Cout) += x^T dout        gemm(N, T)
 * The math is the backend's (cuda_backend.h): bf16 tensor cores with fp32
 * accumulation, or plain fp32.
 */
#include "cuda_impl.h"

void fso_cuda_gemm(fso_backend *be, int trans_a, int trans_b, int m, int n, int k, float alpha,
                   const float *A, int lda, long long stride_a, const float *B, int ldb,
                   long long stride_b, float beta, float *C, int ldc, long long stride_c,
                   int batch)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasComputeType_t ct = ctx->math == FSO_CUDA_MATH_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                                   : CUBLAS_COMPUTE_32F;
    cublasStatus_t st;
    if (batch == 1)
        st = cublasGemmEx(ctx->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F,
                          ldb, &beta, C, CUDA_R_32F, ldc, ct, CUBLAS_GEMM_DEFAULT);
    else
        st = cublasGemmStridedBatchedEx(ctx->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda,
                                        stride_a, B, CUDA_R_32F, ldb, stride_b, &beta, C,
                                        CUDA_R_32F, ldc, stride_c, batch, ct,
                                        CUBLAS_GEMM_DEFAULT);
    fso_cuda_check_blas(be, st, "cuBLAS gemm");
}

void fso_cuda_matmul_fwd(fso_backend *be, float *out, const float *x, const float *w, int N,
                         int Cin, int Cout)
{
    if (N <= 0 || Cout <= 0)
        return;
    fso_cuda_begin(be, FSO_CS_COMPUTE);
    fso_cuda_gemm(be, 1, 0, Cout, N, Cin, 1.0f, w, Cin, 0, x, Cin, 0, 0.0f, out, Cout, 0, 1);
    fso_cuda_end(be, FSO_CS_COMPUTE, "matmul_fwd");
}

void fso_cuda_matmul_bwd(fso_backend *be, float *dx, float *dw, const float *dout,
                         const float *x, const float *w, int N, int Cin, int Cout,
                         float dx_beta)
{
    if (N <= 0 || Cin <= 0 || Cout <= 0)
        return;
    fso_cuda_begin(be, FSO_CS_COMPUTE);
    if (dx) /* beta 0: dx is not read, as in the reference */
        fso_cuda_gemm(be, 0, 0, Cin, N, Cout, 1.0f, w, Cin, 0, dout, Cout, 0, dx_beta, dx, Cin,
                      0, 1);
    fso_cuda_gemm(be, 0, 1, Cin, Cout, N, 1.0f, x, Cin, 0, dout, Cout, 0, 1.0f, dw, Cin, 0, 1);
    fso_cuda_end(be, FSO_CS_COMPUTE, "matmul_bwd");
}
