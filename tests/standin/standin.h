/* standin.h — private to tests/standin: what the stand-in's runtime
 * (standin_rt.c, with standin_nccl.c and standin_blas.c) offers its kernel
 * launchers (standin_ops.c, which replace cuda_ops.cu and cuda_softmax.cu).
 * The public face is the CUDA runtime, cuBLAS and NCCL API as their headers
 * declare it, and fso_standin.h. */
#ifndef FSO_STANDIN_IMPL_H
#define FSO_STANDIN_IMPL_H

#include <stddef.h>

#include <cuda_runtime.h>

#include "backend.h"

/* Queue fn(arg) on stream s as one kernel named `what` (recorded as
 * "kernel WHAT"); arg's `bytes` are copied at the call. Returns the error
 * a launch would (a sticky device error, a bad stream) and sets the
 * calling thread's last error as a launch does, so cudaGetLastError after
 * it reports it. The kernel runs on the stream's worker thread, in order,
 * after the stream's earlier items and the events it waits for; it must
 * touch device memory only through standin_view. A kernel fault injected
 * with fail_kernel fails it there. */
cudaError_t standin_launch(cudaStream_t s, const char *what, void (*fn)(void *arg),
                           const void *arg, size_t bytes);

/* The address the worker threads use for p: for device memory its second,
 * readable view; for any other pointer (host memory, NULL) p itself. */
void *standin_view(const void *p);

/* The device a stream belongs to. */
int standin_stream_device(cudaStream_t s);

/* The device the calling thread has current (cudaSetDevice). */
int standin_current_device(void);

#endif
