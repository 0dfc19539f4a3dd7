/* gpu_info.c — the table of GPU models, in every build (gpu_info.h).
 *
 * Peaks are dense (no 2:4 sparsity) bf16 tensor-core rates with fp32
 * accumulation, the math fsoff's matmuls use. Source: vendor datasheets,
 * dense bf16 (NVIDIA A100/A800, H100/H800 SXM, PCIe and NVL, H200 and
 * H200 NVL, GH200, L40S, L40, L4, A10, A30, A40 datasheets; the Ada and
 * Ampere GA102 whitepapers for the GeForce parts, whose fp32-accumulate rate
 * is half their fp16-accumulate rate). Datasheets quote the sparse figure
 * first; the dense one is half of it.
 *
 * The planner's figures are conservative achieved ones: a training step
 * reaches about 40% of the dense bf16 peak on these parts; copies and
 * collectives as measured on typical boxes, rounded down.
 */
#include "gpu_info.h"

#include <math.h>
#include <string.h>
#include <strings.h>

#include "util.h"

/* Planner figures: name, description, memory (GiB), achieved TFLOP/s, pinned
 * copies GB/s, all-gather GB/s, device AdamW Gelem/s. */
#define FIGURES(n, d, mem, tf, h2d, coll, adam)                                               \
    .name = (n), .desc = (d), .mem_gib = (mem), .tflops = (tf), .h2d_gbps = (h2d),           \
    .coll_gbps = (coll), .adam_gelems = (adam)

const fso_gpu_spec fso_gpu_specs[] = {
    {.words = {"H100", "NVL"}, .peak_tflops = 835.0},
    {.words = {"H100", "PCIe"}, .peak_tflops = 756.0},
    {.words = {"H100"}, .peak_tflops = 989.0, /* SXM5: "H100 80GB HBM3", "H100 SXM5 80GB" */
     FIGURES("h100", "NVIDIA H100 SXM 80 GB", 79.6, 400, 45, 300, 60)},
    {.words = {"H200", "NVL"}, .peak_tflops = 835.0},
    {.words = {"H200"}, .peak_tflops = 989.0,
     FIGURES("h200", "NVIDIA H200 SXM 141 GB", 140.4, 400, 45, 300, 85)},
    {.words = {"GH200"}, .peak_tflops = 989.0},
    {.words = {"H800", "PCIe"}, .peak_tflops = 756.0},
    {.words = {"H800"}, .peak_tflops = 989.0},
    {.words = {"A100"}, .peak_tflops = 312.0,
     FIGURES("a100", "NVIDIA A100 SXM 80 GB", 80, 125, 22, 180, 35)},
    {.words = {"A800"}, .peak_tflops = 312.0},
    {.words = {"L40S"}, .peak_tflops = 362.0,
     FIGURES("l40s", "NVIDIA L40S 48 GB (PCIe, no NVLink)", 45, 145, 22, 12, 15)},
    {.words = {"L40"}, .peak_tflops = 181.0},
    {.words = {"L4"}, .peak_tflops = 121.0},
    {.words = {"A10"}, .peak_tflops = 125.0}, /* not "A10G", a different part */
    {.words = {"A30"}, .peak_tflops = 165.0},
    {.words = {"A40"}, .peak_tflops = 149.7},
    {.words = {"RTX", "4090"}, .avoid = "D", .peak_tflops = 165.2,
     FIGURES("4090", "NVIDIA GeForce RTX 4090 24 GB (PCIe, no NVLink)", 24, 66, 22, 12, 15)},
    {.words = {"RTX", "3090"}, .avoid = "Ti", .peak_tflops = 71.0},
    {.words = {NULL}},
};

/* Is `word` one of the words of `name` (separated by space, '-', '_', '/', parentheses)? */
static int has_word(const char *name, const char *word)
{
    size_t wl = strlen(word);
    const char *p = name;
    while (*p) {
        while (*p && strchr(" -_/()", *p))
            p++;
        const char *b = p;
        while (*p && !strchr(" -_/()", *p))
            p++;
        if ((size_t)(p - b) == wl && strncasecmp(b, word, wl) == 0)
            return 1;
    }
    return 0;
}

const fso_gpu_spec *fso_gpu_spec_match(const char *name)
{
    if (!name)
        return NULL;
    for (const fso_gpu_spec *s = fso_gpu_specs; s->words[0]; s++) {
        int ok = 1;
        for (int w = 0; w < 3 && s->words[w] && ok; w++)
            ok = has_word(name, s->words[w]);
        if (ok && s->avoid && has_word(name, s->avoid))
            ok = 0;
        if (ok)
            return s;
    }
    return NULL;
}

double fso_gpu_bf16_peak_tflops(const char *name)
{
    const fso_gpu_spec *s = fso_gpu_spec_match(name);
    return s ? s->peak_tflops : 0;
}

const fso_gpu_spec *fso_gpu_spec_find(const char *name)
{
    for (const fso_gpu_spec *s = fso_gpu_specs; s->words[0]; s++)
        if (s->name && strcasecmp(s->name, name) == 0)
            return s;
    return NULL;
}

const fso_gpu_spec *fso_gpu_spec_nearest_mem(uint64_t mem_bytes)
{
    const fso_gpu_spec *best = NULL;
    for (const fso_gpu_spec *s = fso_gpu_specs; s->words[0]; s++)
        if (s->name && (!best || fabs(s->mem_gib * FSO_GIB - (double)mem_bytes) <
                                     fabs(best->mem_gib * FSO_GIB - (double)mem_bytes)))
            best = s;
    return best;
}

const fso_gpu_spec *fso_gpu_spec_for_device(const char *device_name, uint64_t mem_bytes)
{
    const fso_gpu_spec *s = fso_gpu_spec_match(device_name);
    return s && s->name ? s : fso_gpu_spec_nearest_mem(mem_bytes);
}
