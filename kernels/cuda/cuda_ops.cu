/* cuda_ops.cu — the CUDA backend's non-matmul ops: embedding, RMSNorm,
 * RoPE, SwiGLU, linear biases, residual add, cross-entropy, squared norm
 * and sum, the bf16 casts and AdamW.
 *
 * Each op mirrors the formula of cpu_ref.c in fp32 with fp32 accumulation
 * (sqnorm and sum: double). The typed ops (embedding_fwd, RMSNorm, RoPE,
 * SwiGLU) are templates over the element type their [dt] tensors are stored
 * in (cuda_common.cuh): bf16 values widen exactly on load, the math is the
 * fp32 path's, and a bf16 output is rounded once, when stored. Ops are
 * queued on the compute stream and never wait on the host. Reductions that
 * cross threads (RMSNorm's weight gradient, a bias's gradient, the embedding
 * gradient, sqnorm)
 * give every output element one writer and add in an order fixed by the
 * sizes, so results repeat bit for bit; no atomics on floats.
 */
#include <math.h>

#include "cuda_common.cuh"

#define EW_THREADS 256

/* ------------------------------------------------------------ embedding */

template <typename W>
__global__ void embedding_fwd_kernel(float *out, const int32_t *tok, const W *wte, int N, int C,
                                     unsigned *flags)
{
    const size_t total = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / C, c = i % C;
        int32_t t = tok[n];
        if (t < 0) {
            if (c == 0)
                atomicOr(flags, FSO_CUDA_FLAG_BAD_TOKEN);
            out[i] = 0.0f;
        } else {
            out[i] = fso_load(wte + (size_t)t * C + c);
        }
    }
}

extern "C" void fso_cuda_embedding_fwd(fso_backend *be, float *out, const int32_t *tok,
                                       const void *wte, fso_dtype dt, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    const unsigned grid = fso_grid_for((size_t)N * C, EW_THREADS);
    unsigned *flags = FSO_CUDA_CTX(be)->dev_flags;
    if (dt == FSO_DT_BF16)
        embedding_fwd_kernel<<<grid, EW_THREADS, 0, s>>>(out, tok, (const uint16_t *)wte, N, C,
                                                         flags);
    else
        embedding_fwd_kernel<<<grid, EW_THREADS, 0, s>>>(out, tok, (const float *)wte, N, C,
                                                         flags);
    fso_cuda_end(be, FSO_CS_COMPUTE, "embedding_fwd");
}

/* dwte[tok[n]] += dout[n] for n in order. Thread (column c, group g) owns
 * the rows of dwte whose token id is g modulo EMB_GROUPS: one writer per
 * element, rows added in order n = 0, 1, ... The group test depends only on
 * the token, so a warp never diverges. */
#define EMB_GROUPS 64

__global__ void embedding_bwd_kernel(float *dwte, const int32_t *tok, const float *dout, int N,
                                     int C, unsigned *flags)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int g = blockIdx.y;
    if (c >= C)
        return;
    for (int n = 0; n < N; n++) {
        int32_t t = tok[n];
        if (t < 0) {
            if (g == 0 && c == 0)
                atomicOr(flags, FSO_CUDA_FLAG_BAD_TOKEN);
            continue;
        }
        if (t % EMB_GROUPS != g)
            continue;
        dwte[(size_t)t * C + c] += dout[(size_t)n * C + c];
    }
}

extern "C" void fso_cuda_embedding_bwd(fso_backend *be, float *dwte, const int32_t *tok,
                                       const float *dout, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    const unsigned threads = C < 128 ? 32 : 128;
    dim3 grid((unsigned)((C + threads - 1) / threads), EMB_GROUPS);
    embedding_bwd_kernel<<<grid, threads, 0, s>>>(dwte, tok, dout, N, C,
                                                  FSO_CUDA_CTX(be)->dev_flags);
    fso_cuda_end(be, FSO_CS_COMPUTE, "embedding_bwd");
}

/* ------------------------------------------------------------ rmsnorm */

/* One block per row: rstd = (mean(x^2) + eps)^-1/2, out = x * rstd * w,
 * out and w stored as E. */
template <typename E>
__global__ void rmsnorm_fwd_kernel(E *out, float *rstd, const float *x, const E *w, int C,
                                   float eps)
{
    __shared__ float sh[32];
    const size_t row = blockIdx.x;
    const float *xr = x + row * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        ss += xr[c] * xr[c];
    ss = fso_block_sum(ss, sh);
    const float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0)
        rstd[row] = r;
    E *o = out + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        fso_store(o + c, xr[c] * r * fso_load(w + c));
}

extern "C" void fso_cuda_rmsnorm_fwd(fso_backend *be, void *out, float *rstd, const float *x,
                                     const void *w, fso_dtype dt, int N, int C, float eps)
{
    if (N <= 0 || C <= 0)
        return;
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    const unsigned threads = fso_row_threads((size_t)C, 512);
    if (dt == FSO_DT_BF16)
        rmsnorm_fwd_kernel<<<(unsigned)N, threads, 0, s>>>((uint16_t *)out, rstd, x,
                                                           (const uint16_t *)w, C, eps);
    else
        rmsnorm_fwd_kernel<<<(unsigned)N, threads, 0, s>>>((float *)out, rstd, x,
                                                           (const float *)w, C, eps);
    fso_cuda_end(be, FSO_CS_COMPUTE, "rmsnorm_fwd");
}

/* dx += r * w*dy - x * r^3 / C * sum(w*dy*x), one block per row; w stored
 * as E. */
template <typename E>
__global__ void rmsnorm_bwd_dx_kernel(float *dx, const float *dout, const float *x, const E *w,
                                      const float *rstd, int C)
{
    __shared__ float sh[32];
    const size_t row = blockIdx.x;
    const float *xr = x + row * C, *dy = dout + row * C;
    float dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dot += fso_load(w + c) * dy[c] * xr[c];
    dot = fso_block_sum(dot, sh);
    const float r = rstd[row];
    const float k = r * r * r * dot / (float)C;
    float *d = dx + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        d[c] += r * fso_load(w + c) * dy[c] - xr[c] * k;
}

/* dw partials: part[chunk][c] = sum over the chunk's rows, in order. The
 * chunks are spread over grid.y, which stops at 65535 (past 4.19M rows):
 * each block row takes every gridDim.y-th chunk. */
#define RN_ROWS_PER_CHUNK FSO_CUDA_COL_CHUNK_ROWS
#define RN_GRID_Y_MAX 65535

__global__ void rmsnorm_bwd_dw_partial_kernel(float *part, const float *dout, const float *x,
                                              const float *rstd, int N, int C, int chunks)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    for (int chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
        const int n0 = chunk * RN_ROWS_PER_CHUNK;
        const int n1 = min(N, n0 + RN_ROWS_PER_CHUNK);
        float acc = 0.0f;
        for (int n = n0; n < n1; n++)
            acc += dout[(size_t)n * C + c] * x[(size_t)n * C + c] * rstd[n];
        part[(size_t)chunk * C + c] = acc;
    }
}

__global__ void rmsnorm_bwd_dw_sum_kernel(float *dw, const float *part, int chunks, int C)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float acc = 0.0f;
    for (int k = 0; k < chunks; k++)
        acc += part[(size_t)k * C + c];
    dw[c] += acc;
}

extern "C" void fso_cuda_rmsnorm_bwd(fso_backend *be, float *dx, float *dw, const float *dout,
                                     const float *x, const void *w, fso_dtype dt,
                                     const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    const int chunks = (N + RN_ROWS_PER_CHUNK - 1) / RN_ROWS_PER_CHUNK;
    float *part = (float *)fso_cuda_scratch(be, fso_cuda_col_scratch_bytes(N, C));
    if (part) {
        const unsigned row_threads = fso_row_threads((size_t)C, 512);
        if (dt == FSO_DT_BF16)
            rmsnorm_bwd_dx_kernel<<<(unsigned)N, row_threads, 0, s>>>(
                dx, dout, x, (const uint16_t *)w, rstd, C);
        else
            rmsnorm_bwd_dx_kernel<<<(unsigned)N, row_threads, 0, s>>>(dx, dout, x,
                                                                      (const float *)w, rstd, C);
        const unsigned threads = C < 256 ? 32 : 256;
        dim3 grid((unsigned)((C + threads - 1) / threads),
                  (unsigned)(chunks < RN_GRID_Y_MAX ? chunks : RN_GRID_Y_MAX));
        rmsnorm_bwd_dw_partial_kernel<<<grid, threads, 0, s>>>(part, dout, x, rstd, N, C,
                                                               chunks);
        rmsnorm_bwd_dw_sum_kernel<<<(unsigned)((C + threads - 1) / threads), threads, 0, s>>>(
            dw, part, chunks, C);
    }
    fso_cuda_end(be, FSO_CS_COMPUTE, "rmsnorm_bwd");
}

/* ------------------------------------------------------------ rope */

/* Rotate-half RoPE in place: one thread per (row, head, pair i < D/2), x
 * stored as E; a token's position is pos[b*T + t], or t without pos. */
template <typename E>
__global__ void rope_kernel(E *x, const float *cos_t, const float *sin_t, const int32_t *pos,
                            int T, int nh, int D, float sgn, size_t pairs)
{
    const int half = D / 2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < pairs;
         i += (size_t)gridDim.x * blockDim.x) {
        const int p = (int)(i % half);
        const size_t rest = i / half; /* (b*T + t) * nh + h */
        const int t = pos ? pos[rest / nh] : (int)((rest / nh) % T);
        E *v = x + rest * D;
        const float c = cos_t[(size_t)t * half + p], sn = sgn * sin_t[(size_t)t * half + p];
        const float x1 = fso_load(v + p), x2 = fso_load(v + p + half);
        fso_store(v + p, x1 * c - x2 * sn);
        fso_store(v + p + half, x2 * c + x1 * sn);
    }
}

extern "C" void fso_cuda_rope(fso_backend *be, void *x, fso_dtype dt, const float *cos_t,
                              const float *sin_t, const int32_t *pos, int B, int T, int nh,
                              int D, int inverse)
{
    const size_t pairs = (size_t)B * T * nh * (D / 2);
    if (pairs == 0)
        return;
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    const unsigned grid = fso_grid_for(pairs, EW_THREADS);
    const float sgn = inverse ? -1.0f : 1.0f;
    if (dt == FSO_DT_BF16)
        rope_kernel<<<grid, EW_THREADS, 0, s>>>((uint16_t *)x, cos_t, sin_t, pos, T, nh, D, sgn,
                                                pairs);
    else
        rope_kernel<<<grid, EW_THREADS, 0, s>>>((float *)x, cos_t, sin_t, pos, T, nh, D, sgn,
                                                pairs);
    fso_cuda_end(be, FSO_CS_COMPUTE, "rope");
}

/* ------------------------------------------------------------ elementwise */

/* The SwiGLU kernels visit quads of elements with one vector load per
 * tensor where every pointer is aligned to four elements (n4 = n / 4
 * quads), the rest one at a time; each element's inputs are read before
 * its outputs are written, so an output may alias an input. */
__device__ __forceinline__ float swiglu_of(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

/* silu'(g) = sig(g) * (1 + g * (1 - sig(g))) */
__device__ __forceinline__ void swiglu_grad(float dy, float g, float u, float *dg, float *du)
{
    const float sg = 1.0f / (1.0f + expf(-g));
    *du = dy * g * sg;
    *dg = dy * u * sg * (1.0f + g * (1.0f - sg));
}

template <typename E>
__global__ void swiglu_fwd_kernel(E *out, const E *gate, const E *up, size_t n, size_t n4)
{
    const size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = first; i < n4; i += stride) {
        float g[4], u[4], o[4];
        fso_load4(gate + 4 * i, g);
        fso_load4(up + 4 * i, u);
        for (int j = 0; j < 4; j++)
            o[j] = swiglu_of(g[j], u[j]);
        fso_store4(out + 4 * i, o);
    }
    for (size_t i = 4 * n4 + first; i < n; i += stride)
        fso_store(out + i, swiglu_of(fso_load(gate + i), fso_load(up + i)));
}

template <typename E>
__global__ void swiglu_bwd_kernel(E *dgate, E *dup, const E *dout, const E *gate, const E *up,
                                  size_t n, size_t n4)
{
    const size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = first; i < n4; i += stride) {
        float dy[4], g[4], u[4], dg[4], du[4];
        fso_load4(dout + 4 * i, dy);
        fso_load4(gate + 4 * i, g);
        fso_load4(up + 4 * i, u);
        for (int j = 0; j < 4; j++)
            swiglu_grad(dy[j], g[j], u[j], &dg[j], &du[j]);
        fso_store4(dgate + 4 * i, dg);
        fso_store4(dup + 4 * i, du);
    }
    for (size_t i = 4 * n4 + first; i < n; i += stride) {
        float dg, du;
        swiglu_grad(fso_load(dout + i), fso_load(gate + i), fso_load(up + i), &dg, &du);
        fso_store(dgate + i, dg);
        fso_store(dup + i, du);
    }
}

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

/* Quads when every pointer is aligned to four elements of es bytes. */
static size_t quads(size_t n, size_t es, const void *a, const void *b, const void *c,
                    const void *d, const void *e)
{
    const size_t al = 4 * es;
    const bool ok = fso_aligned(a, al) && fso_aligned(b, al) && fso_aligned(c, al) &&
                    (!d || fso_aligned(d, al)) && (!e || fso_aligned(e, al));
    return ok ? n / 4 : 0;
}

extern "C" void fso_cuda_swiglu_fwd(fso_backend *be, void *out, const void *gate, const void *up,
                                    fso_dtype dt, size_t n)
{
    if (n == 0)
        return;
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    const size_t n4 = quads(n, fso_dtype_size(dt), out, gate, up, NULL, NULL);
    const unsigned grid = fso_grid_for(n4 ? n4 : n, EW_THREADS);
    if (dt == FSO_DT_BF16)
        swiglu_fwd_kernel<<<grid, EW_THREADS, 0, s>>>((uint16_t *)out, (const uint16_t *)gate,
                                                      (const uint16_t *)up, n, n4);
    else
        swiglu_fwd_kernel<<<grid, EW_THREADS, 0, s>>>((float *)out, (const float *)gate,
                                                      (const float *)up, n, n4);
    fso_cuda_end(be, FSO_CS_COMPUTE, "swiglu_fwd");
}

extern "C" void fso_cuda_swiglu_bwd(fso_backend *be, void *dgate, void *dup, const void *dout,
                                    const void *gate, const void *up, fso_dtype dt, size_t n)
{
    if (n == 0)
        return;
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    const size_t n4 = quads(n, fso_dtype_size(dt), dgate, dup, dout, gate, up);
    const unsigned grid = fso_grid_for(n4 ? n4 : n, EW_THREADS);
    if (dt == FSO_DT_BF16)
        swiglu_bwd_kernel<<<grid, EW_THREADS, 0, s>>>(
            (uint16_t *)dgate, (uint16_t *)dup, (const uint16_t *)dout, (const uint16_t *)gate,
            (const uint16_t *)up, n, n4);
    else
        swiglu_bwd_kernel<<<grid, EW_THREADS, 0, s>>>((float *)dgate, (float *)dup,
                                                      (const float *)dout, (const float *)gate,
                                                      (const float *)up, n, n4);
    fso_cuda_end(be, FSO_CS_COMPUTE, "swiglu_bwd");
}

extern "C" void fso_cuda_add(fso_backend *be, float *out, const float *a, const float *b,
                             size_t n)
{
    if (n == 0)
        return;
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    add_kernel<<<fso_grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(out, a, b, n);
    fso_cuda_end(be, FSO_CS_COMPUTE, "add");
}

/* ------------------------------------------------------------ bias */

/* out[n][c] += b[c], both stored as E: widened, added in fp32, rounded once. */
template <typename E>
__global__ void bias_add_kernel(E *out, const E *b, int C, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        fso_store(out + i, fso_load(out + i) + fso_load(b + i % C));
}

extern "C" void fso_cuda_bias_add(fso_backend *be, void *out, const void *b, fso_dtype dt, int N,
                                  int C)
{
    const size_t total = (size_t)N * C;
    if (N <= 0 || C <= 0)
        return;
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    const unsigned grid = fso_grid_for(total, EW_THREADS);
    if (dt == FSO_DT_BF16)
        bias_add_kernel<<<grid, EW_THREADS, 0, s>>>((uint16_t *)out, (const uint16_t *)b, C,
                                                    total);
    else
        bias_add_kernel<<<grid, EW_THREADS, 0, s>>>((float *)out, (const float *)b, C, total);
    fso_cuda_end(be, FSO_CS_COMPUTE, "bias_add");
}

/* db partials as RMSNorm's weight gradient takes them: part[chunk][c] = the
 * sum of dout's column c over the chunk's RN_ROWS_PER_CHUNK rows, in order;
 * then db[c] += the partials in chunk order. One writer per element. */
template <typename E>
__global__ void bias_bwd_partial_kernel(float *part, const E *dout, int N, int C, int chunks)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    for (int chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
        const int n0 = chunk * RN_ROWS_PER_CHUNK;
        const int n1 = min(N, n0 + RN_ROWS_PER_CHUNK);
        float acc = 0.0f;
        for (int n = n0; n < n1; n++)
            acc += fso_load(dout + (size_t)n * C + c);
        part[(size_t)chunk * C + c] = acc;
    }
}

extern "C" void fso_cuda_bias_bwd(fso_backend *be, float *db, const void *dout, fso_dtype dt,
                                  int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    const int chunks = (N + RN_ROWS_PER_CHUNK - 1) / RN_ROWS_PER_CHUNK;
    float *part = (float *)fso_cuda_scratch(be, fso_cuda_col_scratch_bytes(N, C));
    if (part) {
        const unsigned threads = C < 256 ? 32 : 256;
        dim3 grid((unsigned)((C + threads - 1) / threads),
                  (unsigned)(chunks < RN_GRID_Y_MAX ? chunks : RN_GRID_Y_MAX));
        if (dt == FSO_DT_BF16)
            bias_bwd_partial_kernel<<<grid, threads, 0, s>>>(part, (const uint16_t *)dout, N, C,
                                                             chunks);
        else
            bias_bwd_partial_kernel<<<grid, threads, 0, s>>>(part, (const float *)dout, N, C,
                                                             chunks);
        rmsnorm_bwd_dw_sum_kernel<<<(unsigned)((C + threads - 1) / threads), threads, 0, s>>>(
            db, part, chunks, C);
    }
    fso_cuda_end(be, FSO_CS_COMPUTE, "bias_bwd");
}

/* ------------------------------------------------------------ casts */

/* One element per thread and step: a warp reads 64 contiguous bytes and
 * writes 128, both coalesced. A shift, as cpu_ref.c: exact for every value. */
__global__ void cast_bf16_f32_kernel(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = fso_f32_of(src[i]);
}

__global__ void cast_f32_bf16_kernel(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = fso_bf16_of(src[i]);
}

/* One element per thread step, the rows added in order with a plain fp32
 * add (nothing to contract): the threads collectives' bits. */
__global__ void sum_bf16_rows_kernel(float *dst, const uint16_t *src, int rows, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = fso_f32_of(src[i]);
        for (int k = 1; k < rows; k++)
            s = __fadd_rn(s, fso_f32_of(src[(size_t)k * n + i]));
        dst[i] = s;
    }
}

extern "C" void fso_cuda_sum_bf16_rows(cudaStream_t s, float *dst, const uint16_t *src,
                                       int rows, size_t n)
{
    if (n == 0)
        return;
    sum_bf16_rows_kernel<<<fso_grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(dst, src, rows, n);
}

extern "C" void fso_cuda_widen(fso_backend *be, float *dst, const uint16_t *src, size_t n)
{
    if (n == 0)
        return;
    cudaStream_t s = FSO_CUDA_CTX(be)->stream[FSO_CS_COMPUTE];
    cast_bf16_f32_kernel<<<fso_grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(dst, src, n);
}

extern "C" void fso_cuda_narrow(fso_backend *be, uint16_t *dst, const float *src, size_t n)
{
    if (n == 0)
        return;
    cudaStream_t s = FSO_CUDA_CTX(be)->stream[FSO_CS_COMPUTE];
    cast_f32_bf16_kernel<<<fso_grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(dst, src, n);
}

extern "C" void fso_cuda_cast_bf16_f32(fso_backend *be, float *dst, const uint16_t *src,
                                       size_t n)
{
    if (n == 0)
        return;
    fso_cuda_begin(be, FSO_CS_COMPUTE);
    fso_cuda_widen(be, dst, src, n);
    fso_cuda_end(be, FSO_CS_COMPUTE, "cast_bf16_f32");
}

extern "C" void fso_cuda_cast_f32_bf16(fso_backend *be, uint16_t *dst, const float *src,
                                       size_t n)
{
    if (n == 0)
        return;
    fso_cuda_begin(be, FSO_CS_COMPUTE);
    fso_cuda_narrow(be, dst, src, n);
    fso_cuda_end(be, FSO_CS_COMPUTE, "cast_f32_bf16");
}

/* ------------------------------------------------------------ AdamW */

/* One element per thread step, in offload/adamw.c's order with IEEE
 * round-to-nearest intrinsics (no contraction into FMAs, correctly rounded
 * sqrt and division): the CPU reference's bits. */
__global__ void adamw_kernel(float *master, const float *grad, float *m, float *v, void *out,
                             int out_bf16, size_t n, fso_adamw_consts c)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = __fmul_rn(grad[i], c.scale);
        float p = __fmul_rn(master[i], c.decay);
        float mi = __fadd_rn(__fmul_rn(c.beta1, m[i]), __fmul_rn(c.one_minus_beta1, g));
        float vi = __fadd_rn(__fmul_rn(c.beta2, v[i]),
                             __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
        p = __fsub_rn(p, __fmul_rn(c.step_size, __fdiv_rn(mi, denom)));
        m[i] = mi;
        v[i] = vi;
        master[i] = p;
        if (!out)
            continue;
        if (!out_bf16)
            ((float *)out)[i] = p;
        else
            ((uint16_t *)out)[i] = fso_bf16_of(p);
    }
}

extern "C" void fso_cuda_adamw(fso_backend *be, float *master, const float *grad, float *m,
                               float *v, void *out, int out_bf16, size_t n,
                               const fso_adamw_consts *c)
{
    if (n == 0)
        return;
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    adamw_kernel<<<fso_grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(master, grad, m, v, out,
                                                                     out_bf16, n, *c);
    fso_cuda_end(be, FSO_CS_COMPUTE, "adamw");
}

/* ------------------------------------------------------------ cross-entropy */

/* One block per row: lse = max + log(sum exp(l - max)); loss = lse - l[tgt];
 * dl = (softmax - onehot) * dscale, written after every read of the row's
 * logits it depends on (dl may be the logits). A target < 0 does not count:
 * loss 0, dl 0 (the whole block returns at once). */
__global__ void cross_entropy_kernel(float *dl_all, float *losses, const float *logits,
                                     const int32_t *targets, int V, float dscale,
                                     unsigned *flags)
{
    __shared__ float shf[32];
    __shared__ double shd[32];
    const size_t row = blockIdx.x;
    const float *l = logits + row * V;
    float *dl = dl_all + row * V;
    const int32_t tgt = targets[row];
    if (tgt < 0) {
        if (threadIdx.x == 0)
            losses[row] = 0.0f;
        for (int j = threadIdx.x; j < V; j += blockDim.x)
            dl[j] = 0.0f;
        return;
    }
    const bool bad = tgt >= V;
    const float lt = bad ? 0.0f : l[tgt]; /* read before anything is written */

    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        mx = fmaxf(mx, l[j]);
    mx = fso_block_max(mx, shf);
    float part = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        part += expf(l[j] - mx);
    const double sum = fso_block_sum((double)part, shd);
    const float lse = (float)((double)mx + log(sum));
    if (bad) {
        if (threadIdx.x == 0) {
            atomicOr(flags, FSO_CUDA_FLAG_BAD_TARGET);
            losses[row] = NAN;
        }
        for (int j = threadIdx.x; j < V; j += blockDim.x)
            dl[j] = 0.0f;
        return;
    }
    if (threadIdx.x == 0)
        losses[row] = lse - lt;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float p = expf(l[j] - lse);
        dl[j] = (p - (j == tgt ? 1.0f : 0.0f)) * dscale;
    }
}

extern "C" void fso_cuda_cross_entropy(fso_backend *be, float *dlogits, float *losses,
                                       const float *logits, const int32_t *targets, int N, int V,
                                       float dscale)
{
    if (N <= 0 || V <= 0)
        return;
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COMPUTE);
    cross_entropy_kernel<<<(unsigned)N, fso_row_threads((size_t)V, 512), 0, s>>>(
        dlogits, losses, logits, targets, V, dscale, FSO_CUDA_CTX(be)->dev_flags);
    fso_cuda_end(be, FSO_CS_COMPUTE, "cross_entropy");
}

/* ------------------------------------------------------------ sqnorm, sum */

/* fsoff's one order (kernels/sum_order.h; FSO_CUDA_REDUCE_* in
 * cuda_impl.h): chunks of SQ_CHUNK elements, SQ_THREADS threads (lanes) each
 * summing a strided share (of x^2, or of x) in double, then a halving tree;
 * the chunk sums reduced the same way by one block, thread t (slot t) adding
 * chunks t, t + SQ_THREADS, ... in order. The CPU backends and the host
 * (fso_sum_ordered, fso_host_sqnorm) compute the same bits (every product of
 * two floats is exact in double, so fused or not, the bits are the same). */
#define SQ_THREADS FSO_CUDA_REDUCE_THREADS
#define SQ_CHUNK FSO_CUDA_REDUCE_CHUNK

__device__ double sq_tree(double s, double *sh)
{
    sh[threadIdx.x] = s;
    for (int w = SQ_THREADS / 2; w > 0; w >>= 1) {
        __syncthreads();
        if (threadIdx.x < w)
            sh[threadIdx.x] = sh[threadIdx.x] + sh[threadIdx.x + w];
    }
    __syncthreads();
    return sh[0];
}

template <bool SQUARE>
__global__ void reduce_chunk_kernel(double *part, const float *x, size_t n)
{
    __shared__ double sh[SQ_THREADS];
    const size_t base = (size_t)blockIdx.x * SQ_CHUNK;
    const size_t end = base + SQ_CHUNK < n ? base + SQ_CHUNK : n;
    double s = 0.0;
    for (size_t i = base + threadIdx.x; i < end; i += SQ_THREADS) {
        const double v = x[i];
        s += SQUARE ? v * v : v;
    }
    s = sq_tree(s, sh);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

__global__ void reduce_total_kernel(double *result, const double *part, size_t chunks)
{
    __shared__ double sh[SQ_THREADS];
    double s = 0.0;
    for (size_t i = threadIdx.x; i < chunks; i += SQ_THREADS)
        s += part[i];
    s = sq_tree(s, sh);
    if (threadIdx.x == 0)
        *result = s;
}

extern "C" void fso_cuda_reduce_device(fso_backend *be, double *scratch, const float *x, size_t n,
                                       int square)
{
    cudaStream_t s = FSO_CUDA_CTX(be)->stream[FSO_CS_COMPUTE];
    const size_t chunks = (n + SQ_CHUNK - 1) / SQ_CHUNK;
    if (chunks > 0) {
        if (square)
            reduce_chunk_kernel<true><<<(unsigned)chunks, SQ_THREADS, 0, s>>>(scratch + 1, x, n);
        else
            reduce_chunk_kernel<false><<<(unsigned)chunks, SQ_THREADS, 0, s>>>(scratch + 1, x, n);
    }
    reduce_total_kernel<<<1, SQ_THREADS, 0, s>>>(scratch, scratch + 1, chunks);
}
