/* cpu_isa.h — the instruction sets of fsoff's hand-vectorized CPU kernels,
 * which of them this CPU and this build can run, and the choice at run time.
 *
 * A kernel with several ISA paths (today the fused AdamW of offload/adamw.h)
 * has one per set below, and every path gives the scalar path's bits. Which
 * one runs is the widest this CPU and build support, unless the environment
 * variable FSO_ISA names another:
 *
 *   FSO_ISA=scalar|avx2|avx512|auto     (unset or empty: auto)
 *
 * so every path can be run, and tested, on any host that has it. Asking for
 * a set the CPU or the build lacks is an error, never a quiet fallback.
 */
#ifndef FSO_CPU_ISA_H
#define FSO_CPU_ISA_H

#include <stdbool.h>
#include <stddef.h>

typedef enum fso_isa {
    FSO_ISA_AUTO,      /* the widest the CPU and the build support */
    FSO_ISA_SCALAR,    /* plain C */
    FSO_ISA_AVX2,      /* 8 fp32 lanes */
    FSO_ISA_AVX512,    /* 16 fp32 lanes: AVX-512 F, BW and VL */
} fso_isa;
#define FSO_ISA_COUNT 4

/* "auto", "scalar", "avx2", "avx512"; "?" for others. */
const char *fso_isa_name(fso_isa isa);
/* 0, or -EINVAL for a name not listed above. */
int fso_isa_parse(const char *name, fso_isa *out);

/* Whether this build compiled isa's kernels (its compiler had the flags). */
bool fso_isa_built(fso_isa isa);
/* Whether this CPU (and its OS) runs isa's instructions. */
bool fso_isa_cpu_has(fso_isa isa);
/* Both; always true for AUTO and SCALAR. */
bool fso_isa_supported(fso_isa isa);
/* The widest supported set (never AUTO). */
fso_isa fso_isa_best(void);

/* The set FSO_ISA asks for, AUTO resolved to fso_isa_best(): 0; -EINVAL for
 * an unknown name, -ENOTSUP for a set this CPU or build lacks, with a message
 * in err that names the value, what this machine can run, and the fix. */
int fso_isa_from_env(fso_isa *out, char *err, size_t errlen);

#endif
