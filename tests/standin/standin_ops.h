/* standin_ops.h — private to the stand-in's kernel launchers (standin_ops.c,
 * standin_rows.c): a kernel is a struct that starts with standin_kernel,
 * copied at the launch and run on the stream's worker thread with the CPU
 * backend of the stream's device. */
#ifndef FSO_STANDIN_OPS_H
#define FSO_STANDIN_OPS_H

#include <stddef.h>

#include <cuda_runtime.h>

#include "backend.h"

typedef struct standin_kernel {
    /* The kernel's work: `self` is the launched struct (a copy); its device
     * pointers are read through standin_view. cpu is the device's CPU
     * backend ("cpu", one thread), held by this kernel alone meanwhile. */
    void (*body)(fso_backend *cpu, const void *self);
    int device; /* set by standin_kernel_launch */
} standin_kernel;

/* Queue k (a struct of `bytes` beginning with a standin_kernel) on s as the
 * kernel `what`, as a <<<...>>> launch would: errors come back through
 * cudaGetLastError (fso_cuda_end reads it). */
void standin_kernel_launch(cudaStream_t s, const char *what, standin_kernel *k, size_t bytes);

/* Set bits of the backend's device error word (FSO_CUDA_FLAG_*), as a
 * kernel's atomicOr does, from a kernel's body. */
void standin_kernel_flag(unsigned *dev_flags, unsigned bits);

#endif
