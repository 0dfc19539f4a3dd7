/* gpu_info.h — what a GPU is: name, PCI bus id, memory, SMs; and fsoff's
 * one table of GPU models, which gives a device's dense bf16 tensor peak
 * (for MFU) and, for the models the planner has them for, the achieved
 * figures it assumes.
 *
 * The table is plain C and exists in every build (the planner uses it for
 * machines it is not running on); fso_gpu_info_query() asks the CUDA
 * runtime, through the CUDA module, and exists only where FSO_HAVE_CUDA is 1
 * (cuda_backend.h).
 */
#ifndef FSO_GPU_INFO_H
#define FSO_GPU_INFO_H

#include <stddef.h>
#include <stdint.h>

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

/* One GPU model. A device matches a row when every one of `words` is a
 * word of its name as the CUDA runtime reports it (case-insensitive; words
 * are separated by spaces, '-', '_', '/' and parentheses) and `avoid` is
 * not; the first row that matches is the device's, so specific rows come
 * before general ones. */
typedef struct fso_gpu_spec {
    const char *words[3];
    const char *avoid;          /* NULL: none */
    double peak_tflops;         /* dense bf16 tensor peak, fp32 accumulation, data sheet */
    /* The planner's figures (achieved, not peak); name is NULL where it has none. */
    const char *name;           /* --gpu: "h100", "h200", "a100", "l40s", "4090" */
    const char *desc;
    double mem_gib;
    double tflops;              /* assumed achieved in a training step */
    double h2d_gbps;            /* pinned copies, one direction */
    double coll_gbps;           /* all-gather bus bandwidth among 8 (NVLink) or over PCIe */
    double adam_gelems;         /* AdamW on the device, 1e9 elements/s */
} fso_gpu_spec;

/* The table, ended by a row without words. */
extern const fso_gpu_spec fso_gpu_specs[];

/* The row of a device name ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 PCIe",
 * "NVIDIA GeForce RTX 4090"), or NULL when no row matches (or name is NULL). */
const fso_gpu_spec *fso_gpu_spec_match(const char *name);
/* Its dense bf16 peak in TFLOP/s, or 0 when the name is not in the table. */
double fso_gpu_bf16_peak_tflops(const char *name);

/* The row the planner has figures for named `name` (--gpu, case-insensitive), else NULL. */
const fso_gpu_spec *fso_gpu_spec_find(const char *name);
/* Of the rows with planner figures, the one whose memory is nearest mem_bytes (the first of equals). */
const fso_gpu_spec *fso_gpu_spec_nearest_mem(uint64_t mem_bytes);
/* The planner's figures for a device: its row when that has them, else
 * the row whose memory is nearest mem_bytes. Never NULL. */
const fso_gpu_spec *fso_gpu_spec_for_device(const char *device_name, uint64_t mem_bytes);

#endif
