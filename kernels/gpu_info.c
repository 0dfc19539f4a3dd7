/* gpu_info.c — the bf16 peak table, in every build.
 *
 * The table holds dense (no 2:4 sparsity) bf16 tensor-core peaks with fp32
 * accumulation, the math fsoff's matmuls use. Source: vendor datasheets,
 * dense bf16 (NVIDIA A100/A800, H100/H800 SXM, PCIe and NVL, H200 and
 * H200 NVL, GH200, L40S, L40, L4, A10, A30, A40 datasheets; the Ada and
 * Ampere GA102 whitepapers for the GeForce parts, whose fp32-accumulate rate
 * is half their fp16-accumulate rate). Datasheets quote the sparse figure
 * first; the dense one is half of it.
 */
#include "gpu_info.h"

#include <string.h>
#include <strings.h>

struct peak {
    const char *need[3];   /* every one of these words is in the name */
    const char *avoid;     /* and this one is not (NULL: none) */
    double tflops;
};

/* First match wins: the more specific rows come first. */
static const struct peak peaks[] = {
    {{"GH200"}, NULL, 989.0},
    {{"H200", "NVL"}, NULL, 835.0},
    {{"H200"}, NULL, 989.0},
    {{"H100", "NVL"}, NULL, 835.0},
    {{"H100", "PCIe"}, NULL, 756.0},
    {{"H100"}, NULL, 989.0},          /* SXM5: "H100 80GB HBM3", "H100 SXM5 80GB" */
    {{"H800", "PCIe"}, NULL, 756.0},
    {{"H800"}, NULL, 989.0},
    {{"A100"}, NULL, 312.0},
    {{"A800"}, NULL, 312.0},
    {{"L40S"}, NULL, 362.0},
    {{"L40"}, NULL, 181.0},
    {{"L4"}, NULL, 121.0},
    {{"A10"}, NULL, 125.0},           /* not "A10G", a different part */
    {{"A30"}, NULL, 165.0},
    {{"A40"}, NULL, 149.7},
    {{"RTX", "4090"}, "D", 165.2},
    {{"RTX", "3090"}, "Ti", 71.0},
};

/* Is `word` one of the words of `name` (separated by space, '-', '_', '/')? */
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

double fso_gpu_bf16_peak_tflops(const char *name)
{
    if (!name)
        return 0;
    for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++) {
        const struct peak *pk = &peaks[i];
        int ok = 1;
        for (int w = 0; w < 3 && pk->need[w] && ok; w++)
            ok = has_word(name, pk->need[w]);
        if (ok && pk->avoid && has_word(name, pk->avoid))
            ok = 0;
        if (ok)
            return pk->tflops;
    }
    return 0;
}
