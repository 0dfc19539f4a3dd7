/* gpu_info.h — what a GPU is: name, PCI bus id, memory, SMs, and its dense
 * bf16 tensor peak for MFU.
 *
 * fso_gpu_bf16_peak_tflops() is plain C and exists in every build (the
 * planner uses it for machines it is not running on); fso_gpu_info_query()
 * asks the CUDA runtime, through the CUDA module, and exists only where
 * FSO_HAVE_CUDA is 1 (cuda_backend.h).
 */
#ifndef FSO_GPU_INFO_H
#define FSO_GPU_INFO_H

#include <stddef.h>

typedef struct fso_gpu_info {
    int device;                 /* CUDA ordinal */
    char name[256];             /* "NVIDIA H100 80GB HBM3" */
    char pci_bus_id[32];        /* "0000:1b:00.0" */
    size_t mem_total_bytes;
    size_t mem_free_bytes;      /* when queried */
    int sm_count;
    int cc_major, cc_minor;     /* compute capability */
    double bf16_peak_tflops;    /* dense, fp32 accumulation; 0: not in the table */
} fso_gpu_info;

/* Dense bf16 tensor-core peak in TFLOP/s (fp32 accumulation, no sparsity)
 * for a device name as the CUDA runtime reports it ("NVIDIA A100-SXM4-80GB",
 * "NVIDIA H100 PCIe", "NVIDIA GeForce RTX 4090"), or 0 when the name is not
 * in the table. Case-insensitive; matches whole words of the name. */
double fso_gpu_bf16_peak_tflops(const char *name);

#endif
