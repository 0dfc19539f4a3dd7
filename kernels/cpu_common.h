/* cpu_common.h — pieces shared by the two CPU backends (private to kernels/).
 * Memory is host memory: buffers are 64-byte aligned, copies are memcpy. */
#ifndef FSO_CPU_COMMON_H
#define FSO_CPU_COMMON_H

#include "backend.h"

int  fso_cpu_buf_alloc(fso_backend *be, size_t bytes, void **out);
void fso_cpu_buf_free(fso_backend *be, void *buf);
void fso_cpu_memset0(fso_backend *be, void *dst, size_t bytes);
void fso_cpu_copy(fso_backend *be, void *dst, const void *src, size_t bytes);
int  fso_cpu_sync(fso_backend *be);
/* *out += sum of x (n) in double, in order: both CPU backends' sum op */
void fso_cpu_sum(fso_backend *be, double *out, const float *x, size_t n);

extern const fso_backend_ops fso_cpu_ref_ops;
extern const fso_backend_ops fso_cpu_fast_ops;

#endif
