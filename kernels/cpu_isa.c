/* cpu_isa.c — instruction sets: names, what the CPU and build support, FSO_ISA
 * (cpu_isa.h). FSO_HAVE_AVX2 and FSO_HAVE_AVX512 come from fso_build.h: the
 * build compiles a set's kernels only when its compiler takes the flags. */
#include "cpu_isa.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fso_build.h"

static const char *const names[FSO_ISA_COUNT] = {
    [FSO_ISA_AUTO] = "auto",
    [FSO_ISA_SCALAR] = "scalar",
    [FSO_ISA_AVX2] = "avx2",
    [FSO_ISA_AVX512] = "avx512",
};

const char *fso_isa_name(fso_isa isa)
{
    return (unsigned)isa < FSO_ISA_COUNT ? names[isa] : "?";
}

int fso_isa_parse(const char *name, fso_isa *out)
{
    for (int i = 0; i < FSO_ISA_COUNT; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (fso_isa)i;
            return 0;
        }
    return -EINVAL;
}

bool fso_isa_built(fso_isa isa)
{
    switch (isa) {
    case FSO_ISA_AUTO:
    case FSO_ISA_SCALAR:
        return true;
    case FSO_ISA_AVX2:
        return FSO_HAVE_AVX2;
    case FSO_ISA_AVX512:
        return FSO_HAVE_AVX512;
    }
    return false;
}

bool fso_isa_cpu_has(fso_isa isa)
{
    switch (isa) {
    case FSO_ISA_AUTO:
    case FSO_ISA_SCALAR:
        return true;
#if defined(__x86_64__) || defined(__i386__)
    case FSO_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2");
    case FSO_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
#endif
    default:
        return false;
    }
}

bool fso_isa_supported(fso_isa isa)
{
    return fso_isa_built(isa) && fso_isa_cpu_has(isa);
}

fso_isa fso_isa_best(void)
{
    if (fso_isa_supported(FSO_ISA_AVX512))
        return FSO_ISA_AVX512;
    if (fso_isa_supported(FSO_ISA_AVX2))
        return FSO_ISA_AVX2;
    return FSO_ISA_SCALAR;
}

/* "scalar and avx2": the sets this machine runs. */
static void list_supported(char *buf, size_t len)
{
    int n = 0, k = 0;
    for (int i = FSO_ISA_SCALAR; i < FSO_ISA_COUNT; i++)
        n += fso_isa_supported((fso_isa)i);
    buf[0] = '\0';
    for (int i = FSO_ISA_SCALAR; i < FSO_ISA_COUNT; i++) {
        if (!fso_isa_supported((fso_isa)i))
            continue;
        size_t used = strlen(buf);
        snprintf(buf + used, len - used, "%s%s", k == 0 ? "" : k == n - 1 ? " and " : ", ",
                 names[i]);
        k++;
    }
}

int fso_isa_from_env(fso_isa *out, char *err, size_t errlen)
{
    const char *v = getenv("FSO_ISA");
    fso_isa isa = FSO_ISA_AUTO;
    char has[64];
    list_supported(has, sizeof has);
    if (v && *v && fso_isa_parse(v, &isa) < 0) {
        snprintf(err, errlen, "FSO_ISA=%s: unknown instruction set; expected scalar, avx2, "
                              "avx512 or auto (this machine runs %s)", v, has);
        return -EINVAL;
    }
    if (!fso_isa_built(isa)) {
        snprintf(err, errlen, "FSO_ISA=%s: this build of fsoff has no %s kernels (its compiler "
                              "lacked the flags); it runs %s: unset FSO_ISA or pick one of those",
                 v, v, has);
        return -ENOTSUP;
    }
    if (!fso_isa_cpu_has(isa)) {
        snprintf(err, errlen, "FSO_ISA=%s: this CPU lacks %s; it runs %s: unset FSO_ISA or pick "
                              "one of those", v,
                 isa == FSO_ISA_AVX512 ? "AVX-512 (F, BW and VL)" : "AVX2", has);
        return -ENOTSUP;
    }
    *out = isa == FSO_ISA_AUTO ? fso_isa_best() : isa;
    return 0;
}
