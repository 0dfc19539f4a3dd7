/* cpu_common.h — pieces shared by the two CPU backends (private to kernels/).
 * Memory is host memory: buffers are 64-byte aligned, copies are memcpy. */
#ifndef FSO_CPU_COMMON_H
#define FSO_CPU_COMMON_H

#include <stdbool.h>

#include "backend.h"

/* A CPU backend's ops on fp32 buffers (the signatures of backend.h with
 * every tensor fp32); cpu_dtype.c gives them the seam's types. */
typedef struct fso_cpu_kernels {
    void (*embedding_fwd)(fso_backend *be, float *out, const int32_t *tok, const float *wte,
                          int N, int C);
    void (*rmsnorm_fwd)(fso_backend *be, float *out, float *rstd, const float *x, const float *w,
                        int N, int C, float eps);
    void (*rmsnorm_bwd)(fso_backend *be, float *dx, float *dw, const float *dout, const float *x,
                        const float *w, const float *rstd, int N, int C);
    void (*matmul_fwd)(fso_backend *be, float *out, const float *x, const float *w, int N,
                       int Cin, int Cout);
    void (*matmul_bwd)(fso_backend *be, float *dx, float *dw, const float *dout, const float *x,
                       const float *w, int N, int Cin, int Cout, float dx_beta);
    void (*rope)(fso_backend *be, float *x, const float *cos, const float *sin,
                 const int32_t *pos, int B, int T, int nh, int D, int inverse);
    void (*attention_fwd)(fso_backend *be, float *out, float *probs, const float *q,
                          const float *k, const float *v, const int32_t *pos, int B, int T,
                          int H, int Hkv, int D);
    void (*attention_bwd)(fso_backend *be, float *dq, float *dk, float *dv, const float *dout,
                          const float *probs, const float *q, const float *k, const float *v,
                          const int32_t *pos, int B, int T, int H, int Hkv, int D);
    void (*swiglu_fwd)(fso_backend *be, float *out, const float *gate, const float *up, size_t n);
    void (*swiglu_bwd)(fso_backend *be, float *dgate, float *dup, const float *dout,
                       const float *gate, const float *up, size_t n);
    void (*bias_add)(fso_backend *be, float *out, const float *b, int N, int C);
    void (*bias_bwd)(fso_backend *be, float *db, const float *dout, int N, int C);
} fso_cpu_kernels;

/* be->ctx of a CPU backend. */
typedef struct fso_cpu_ctx {
    const fso_cpu_kernels *k;
    struct fso_pool *pool;   /* the fast backend's threads; NULL for cpu-ref */
    float *scratch;          /* fp32 space for bf16 tensors (cpu_dtype.c) */
    size_t scratch_elems;
    int rc;                  /* 0, or the first failure, for sync() */
} fso_cpu_ctx;

int  fso_cpu_buf_alloc(fso_backend *be, size_t bytes, void **out);
void fso_cpu_buf_free(fso_backend *be, void *buf);
void fso_cpu_memset0(fso_backend *be, void *dst, size_t bytes);
void fso_cpu_copy(fso_backend *be, void *dst, const void *src, size_t bytes);
int  fso_cpu_sync(fso_backend *be);
/* destroy, pool and coll_create of both CPU backends (threads collectives) */
void fso_cpu_destroy(fso_backend *be);
struct fso_pool *fso_cpu_pool(fso_backend *be);
int  fso_cpu_coll_create(struct fso_coll **out, int world, fso_backend **devs, char *err,
                         size_t errlen);

/* *out += sum of x (n) in double, in sum_order.h's order (fso_host_sum):
 * both CPU backends' sum op */
void fso_cpu_sum(fso_backend *be, double *out, const float *x, size_t n);

/* The typed ops (backend.h) over a backend's fso_cpu_kernels. */
void fso_cpu_embedding_fwd(fso_backend *be, float *out, const int32_t *tok, const void *wte,
                           fso_dtype dt, int N, int C);
void fso_cpu_rmsnorm_fwd(fso_backend *be, void *out, float *rstd, const float *x, const void *w,
                         fso_dtype dt, int N, int C, float eps);
void fso_cpu_rmsnorm_bwd(fso_backend *be, float *dx, float *dw, const float *dout, const float *x,
                         const void *w, fso_dtype dt, const float *rstd, int N, int C);
void fso_cpu_matmul_fwd(fso_backend *be, void *out, fso_dtype out_dt, const void *x,
                        const void *w, fso_dtype dt, int N, int Cin, int Cout);
void fso_cpu_matmul_bwd(fso_backend *be, void *dx, fso_dtype dx_dt, float *dw, const void *dout,
                        fso_dtype dout_dt, const void *x, const void *w, fso_dtype dt, int N,
                        int Cin, int Cout, float dx_beta);
void fso_cpu_rope(fso_backend *be, void *x, fso_dtype dt, const float *cos, const float *sin,
                  const int32_t *pos, int B, int T, int nh, int D, int inverse);
void fso_cpu_attention_fwd(fso_backend *be, void *out, void *probs, const void *q, const void *k,
                           const void *v, const int32_t *pos, fso_dtype dt, int B, int T, int H,
                           int Hkv, int D);
void fso_cpu_attention_bwd(fso_backend *be, void *dq, void *dk, void *dv, const void *dout,
                           const void *probs, const void *q, const void *k, const void *v,
                           const int32_t *pos, fso_dtype dt, int B, int T, int H, int Hkv, int D);
void fso_cpu_swiglu_fwd(fso_backend *be, void *out, const void *gate, const void *up,
                        fso_dtype dt, size_t n);
void fso_cpu_swiglu_bwd(fso_backend *be, void *dgate, void *dup, const void *dout,
                        const void *gate, const void *up, fso_dtype dt, size_t n);
void fso_cpu_bias_add(fso_backend *be, void *out, const void *b, fso_dtype dt, int N, int C);
void fso_cpu_bias_bwd(fso_backend *be, float *db, const void *dout, fso_dtype dt, int N, int C);

/* What the two CPU backends' tables share: host memory, copies that are
 * done when they return, the typed ops over their fso_cpu_kernels, the sum,
 * and their lifetime and collectives. */
#define FSO_CPU_SHARED_OPS                                                                 \
    .host_addressable = 1, .buf_alloc = fso_cpu_buf_alloc, .buf_free = fso_cpu_buf_free,   \
    .memset0 = fso_cpu_memset0, .copy_h2d = fso_cpu_copy, .copy_d2h = fso_cpu_copy,        \
    .sync = fso_cpu_sync, .sum = fso_cpu_sum, .destroy = fso_cpu_destroy,                  \
    .pool = fso_cpu_pool, .coll_create = fso_cpu_coll_create,                              \
    .embedding_fwd = fso_cpu_embedding_fwd, .rmsnorm_fwd = fso_cpu_rmsnorm_fwd,            \
    .rmsnorm_bwd = fso_cpu_rmsnorm_bwd, .matmul_fwd = fso_cpu_matmul_fwd,                  \
    .matmul_bwd = fso_cpu_matmul_bwd, .rope = fso_cpu_rope,                                \
    .attention_fwd = fso_cpu_attention_fwd, .attention_bwd = fso_cpu_attention_bwd,        \
    .swiglu_fwd = fso_cpu_swiglu_fwd, .swiglu_bwd = fso_cpu_swiglu_bwd,                    \
    .bias_add = fso_cpu_bias_add, .bias_bwd = fso_cpu_bias_bwd

extern const fso_cpu_kernels fso_cpu_ref_kernels;
extern const fso_cpu_kernels fso_cpu_fast_kernels;
extern const fso_backend_ops fso_cpu_ref_ops;
extern const fso_backend_ops fso_cpu_fast_ops;

#endif
