/* cuda_matmul.c — the CUDA backend's linear layers through cuBLAS.
 *
 * Row-major (N, Cin) activations and PyTorch-layout (Cout, Cin) weights are
 * read by cuBLAS as their column-major transposes, so every product below
 * is the transpose of the formula in backend.h:
 *   out^T (Cout, N)  = w^T' x^T          gemm(T, N)
 *   dx^T  (Cin, N)   = w^T  dout^T       gemm(N, N)
 *   dw^T  (Cin, Cout) += x^T dout        gemm(N, T)
 *
 * Types (backend.h): x and w are stored in dt, out in out_dt, dout in
 * dout_dt, dx in dx_dt; dw is fp32. cuBLAS multiplies two operands of one
 * type, so with dt bf16 every operand is bf16 and the sums are fp32
 * (CUBLAS_COMPUTE_32F) into an fp32 or bf16 C, rounded once; an fp32 dout
 * is first rounded to bf16 in the scratch (the tensor cores would round it
 * anyway). With dt fp32 the math is the backend's (cuda_backend.h): bf16
 * tensor cores with fp32 accumulation, or plain fp32; the combinations the
 * model does not use (a bf16 dout or output with fp32 operands) widen the
 * bf16 operand exactly, and compute a bf16 result in fp32 in the scratch
 * before rounding it once.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_impl.h"
#include "util.h"

static cudaDataType_t blas_type(fso_dtype dt)
{
    return dt == FSO_DT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

void fso_cuda_gemm(fso_backend *be, fso_dtype ab_dt, fso_dtype c_dt, int trans_a, int trans_b,
                   int m, int n, int k, float alpha, const void *A, int lda, long long stride_a,
                   const void *B, int ldb, long long stride_b, float beta, void *C, int ldc,
                   long long stride_c, int batch)
{
    fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
    FSO_BUG_ON(ab_dt != FSO_DT_BF16 && c_dt == FSO_DT_BF16,
               "fso_cuda_gemm: fp32 operands with a bf16 C (cuBLAS has no such GEMM; narrow an "
               "fp32 result instead)");
    const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    /* bf16 operands: exact in fp32, so either math is plain fp32 sums */
    const cublasComputeType_t ct = ab_dt == FSO_DT_BF16 || ctx->math == FSO_CUDA_MATH_FP32
                                       ? CUBLAS_COMPUTE_32F
                                       : CUBLAS_COMPUTE_32F_FAST_16BF;
    const cudaDataType_t abt = blas_type(ab_dt), ctt = blas_type(c_dt);
    cublasStatus_t st;
    if (batch == 1)
        st = cublasGemmEx(ctx->blas, ta, tb, m, n, k, &alpha, A, abt, lda, B, abt, ldb, &beta, C,
                          ctt, ldc, ct, CUBLAS_GEMM_DEFAULT);
    else
        st = cublasGemmStridedBatchedEx(ctx->blas, ta, tb, m, n, k, &alpha, A, abt, lda,
                                        stride_a, B, abt, ldb, stride_b, &beta, C, ctt, ldc,
                                        stride_c, batch, ct, CUBLAS_GEMM_DEFAULT);
    fso_cuda_check_blas(be, st, "cuBLAS gemm");
}

void fso_cuda_matmul_fwd(fso_backend *be, void *out, fso_dtype out_dt, const void *x,
                         const void *w, fso_dtype dt, int N, int Cin, int Cout)
{
    if (N <= 0 || Cout <= 0)
        return;
    fso_cuda_begin(be, FSO_CS_COMPUTE);
    if (dt == FSO_DT_BF16 || out_dt != FSO_DT_BF16) {
        fso_cuda_gemm(be, dt, out_dt, 1, 0, Cout, N, Cin, 1.0f, w, Cin, 0, x, Cin, 0, 0.0f, out,
                      Cout, 0, 1);
    } else { /* fp32 operands, bf16 out: an fp32 result rounded once */
        const size_t n = (size_t)N * Cout;
        float *tmp = fso_cuda_scratch(be, sizeof(float) * n);
        if (tmp) {
            fso_cuda_gemm(be, dt, FSO_DT_F32, 1, 0, Cout, N, Cin, 1.0f, w, Cin, 0, x, Cin, 0, 0.0f,
                          tmp, Cout, 0, 1);
            fso_cuda_narrow(be, out, tmp, n);
        }
    }
    fso_cuda_end(be, FSO_CS_COMPUTE, "matmul_fwd");
}

void fso_cuda_matmul_bwd(fso_backend *be, void *dx, fso_dtype dx_dt, float *dw, const void *dout,
                         fso_dtype dout_dt, const void *x, const void *w, fso_dtype dt, int N,
                         int Cin, int Cout, float dx_beta)
{
    if (N <= 0 || Cin <= 0 || Cout <= 0)
        return;
    fso_cuda_begin(be, FSO_CS_COMPUTE);
    const size_t n_out = (size_t)N * Cout, n_in = (size_t)N * Cin;
    /* scratch: dout in dt when it comes in the other type; an fp32 dx when
     * fp32 operands must give a bf16 one */
    const bool conv_dout = dout_dt != dt;
    const bool dx_via_f32 = dx && dt != FSO_DT_BF16 && dx_dt == FSO_DT_BF16;
    const size_t dout_bytes = conv_dout ? fso_dtype_size(dt) * n_out : 0;
    const size_t dx_bytes = dx_via_f32 ? sizeof(float) * n_in : 0;
    const void *g = dout;
    float *dx32 = NULL;
    if (dout_bytes + dx_bytes > 0) {
        char *cur = fso_cuda_scratch(be, fso_cuda_scratch_round(dout_bytes) +
                                             fso_cuda_scratch_round(dx_bytes));
        if (!cur) {
            fso_cuda_end(be, FSO_CS_COMPUTE, "matmul_bwd");
            return;
        }
        void *gconv = fso_cuda_scratch_part(&cur, dout_bytes);
        dx32 = fso_cuda_scratch_part(&cur, dx_bytes);
        if (conv_dout && dt == FSO_DT_BF16)
            fso_cuda_narrow(be, gconv, dout, n_out);
        else if (conv_dout)
            fso_cuda_widen(be, gconv, dout, n_out);
        if (conv_dout)
            g = gconv;
    }
    if (dx && !dx_via_f32) { /* beta 0: dx is not read, as in the reference */
        fso_cuda_gemm(be, dt, dx_dt, 0, 0, Cin, N, Cout, 1.0f, w, Cin, 0, g, Cout, 0, dx_beta,
                      dx, Cin, 0, 1);
    } else if (dx) { /* dx = round(dx_beta * widen(dx) + dout w), the sum in fp32 */
        if (dx_beta != 0.0f)
            fso_cuda_widen(be, dx32, dx, n_in);
        fso_cuda_gemm(be, dt, FSO_DT_F32, 0, 0, Cin, N, Cout, 1.0f, w, Cin, 0, g, Cout, 0, dx_beta,
                      dx32, Cin, 0, 1);
        fso_cuda_narrow(be, dx, dx32, n_in);
    }
    fso_cuda_gemm(be, dt, FSO_DT_F32, 0, 1, Cin, Cout, N, 1.0f, x, Cin, 0, g, Cout, 0, 1.0f, dw,
                  Cin, 0, 1);
    fso_cuda_end(be, FSO_CS_COMPUTE, "matmul_bwd");
}
