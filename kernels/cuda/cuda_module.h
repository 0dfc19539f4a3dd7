/* cuda_module.h — the seam between fsoff and its CUDA module, libfso_cuda.so.
 * Private to fsoff (kernels/, bench/, tests/); only in builds with CUDA.
 *
 * Everything that needs the CUDA runtime, cuBLAS or NCCL (the "cuda"
 * backend, NCCL collectives, device queries, pinning, the copy rates that
 * `fsoff bench h2d` reports) is built into a shared module that the main
 * program loads with dlopen() the first time a GPU path is taken
 * (cuda_loader.c), so
 * fsoff itself needs none of those libraries to start, and a CPU-only run
 * never maps them. The module exports one symbol, FSO_CUDA_MODULE_SYMBOL,
 * which returns its table of entry points; the public functions of
 * cuda_backend.h in the main program forward through that table.
 *
 * Compatibility: the loader accepts a module only if
 *   1. its `abi` is FSO_CUDA_MODULE_ABI. It is read first and alone: the
 *      rest of a table of another shape is not read at all;
 *   2. its build identity is this program's: FSO_CUDA_MODULE_ID, a hash of
 *      this header and of every header of fsoff it includes (backend.h,
 *      coll.h, ...), generated at build time by cuda_module_id.py from the
 *      compiler's own list, and compiled into both. Any edit to them, a
 *      reordered backend table or a changed fso_adamw_consts (passed by
 *      pointer, so no size shows it), makes a module built before it
 *      refused, the message naming both identities and both files;
 *   3. its fsoff version and the sizes of the structs that cross the seam
 *      are this program's (a check that costs nothing).
 * Bump FSO_CUDA_MODULE_ABI when `abi` or `build_id` move or change
 * meaning; any other change to the table shows in the identity.
 */
#ifndef FSO_CUDA_MODULE_H
#define FSO_CUDA_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "coll.h"
#include "cuda_backend.h"
#include "gpu_info.h"

#if FSO_HAVE_CUDA

#define FSO_CUDA_MODULE_ABI 3
#define FSO_CUDA_MODULE_FILE "libfso_cuda.so"
#define FSO_CUDA_MODULE_SYMBOL "fso_cuda_module_get_api"

/* Directions of a copy-rate measurement. */
enum { FSO_CUDA_COPY_H2D, FSO_CUDA_COPY_D2H, FSO_CUDA_COPY_BOTH, FSO_CUDA_COPY_DIRS };

/* Host<->device copy rates on the GPUs (cuda_copy_rates.c), what `fsoff
 * bench h2d` reports. */
typedef struct fso_cuda_copy_report {
    double gbps[2][FSO_CUDA_COPY_DIRS]; /* [pinned, pageable][dir] on device 0; < 0: not run */
    double all_gbps[FSO_CUDA_COPY_DIRS]; /* pinned, every device at once; < 0: not run */
    char pin_note[512];                 /* why pinned copies were not measured, or "" */
} fso_cuda_copy_report;

/* The sizes of what crosses the seam, as each side was compiled. */
typedef struct fso_cuda_module_layout {
    uint32_t api_bytes, backend_bytes, backend_ops_bytes, coll_bytes, coll_ops_bytes,
        gpu_info_bytes, copy_report_bytes;
} fso_cuda_module_layout;

typedef struct fso_cuda_module_api {
    uint32_t abi;                  /* FSO_CUDA_MODULE_ABI; nothing below is read when it differs */
    const char *build_id;          /* FSO_CUDA_MODULE_ID of the build that made the module */
    const char *version;           /* FSO_VERSION of that build */
    fso_cuda_module_layout layout; /* FSO_CUDA_MODULE_LAYOUT_HERE, in the module */
    /* 1 in the tests' CUDA runtime stand-in (tests/standin: the real
     * orchestration code of this module over a CPU imitation of the
     * runtime, cuBLAS and NCCL), 0 in the real module. The loader accepts
     * a stand-in only in a program linked with FSO_CUDA_STANDIN_ALLOWED
     * defined (the tests, never fsoff itself), and then without asking the
     * NVIDIA driver. */
    int standin;

    /* The functions of cuda_backend.h, same contracts, except that
     * gpu_info_query leaves bf16_peak_tflops 0 (the peak table is the main
     * program's, gpu_info.h; the forwarder fills it in). */
    int (*device_count)(char *err, size_t errlen);
    int (*gpu_info_query)(int device, fso_gpu_info *out, char *err, size_t errlen);
    int (*backend_create)(fso_backend **out, int device, size_t mem_cap_bytes, char *err,
                          size_t errlen);
    void (*backend_destroy)(fso_backend *be);
    int (*backend_is_cuda)(const fso_backend *be);
    fso_cuda_math (*get_math)(const fso_backend *be);
    void (*set_math)(fso_backend *be, fso_cuda_math math);
    int (*host_register)(void *ptr, size_t bytes, char *err, size_t errlen);
    int (*host_unregister)(void *ptr, size_t bytes);
    int (*coll_create_nccl)(fso_coll **out, int world, fso_backend **devices, char *err,
                            size_t errlen);
    int (*nccl_rail_id)(unsigned char id[FSO_NCCL_ID_BYTES], char *err, size_t errlen);
    int (*coll_create_nccl_rail)(fso_coll **out, int device, int boxes, int box,
                                 const unsigned char id[FSO_NCCL_ID_BYTES], double timeout_s,
                                 fso_rail_describe_fn describe, char *err, size_t errlen);
    /* Host<->device copies of `bytes` for about `seconds` each, pinned and
     * pageable on device 0, pinned on all `ndev` at once. */
    void (*copy_rates)(fso_cuda_copy_report *rep, int ndev, size_t bytes, double seconds);
} fso_cuda_module_api;

/* The layout as the including file sees it: an initializer for
 * fso_cuda_module_layout. */
#define FSO_CUDA_MODULE_LAYOUT_HERE                                                            \
    {                                                                                          \
        .api_bytes = sizeof(fso_cuda_module_api), .backend_bytes = sizeof(fso_backend),        \
        .backend_ops_bytes = sizeof(fso_backend_ops), .coll_bytes = sizeof(fso_coll),          \
        .coll_ops_bytes = sizeof(fso_coll_ops), .gpu_info_bytes = sizeof(fso_gpu_info),        \
        .copy_report_bytes = sizeof(fso_cuda_copy_report),                                     \
    }

/* Defined (as 1) only by the tests' programs (tests/standin/allow.c): a
 * program without it refuses a stand-in module, whatever FSO_CUDA_MODULE
 * says. Weak, so that fsoff links without it. */
extern const int fso_cuda_standin_allowed __attribute__((weak));

/* The module's one export (FSO_CUDA_MODULE_SYMBOL). */
typedef const fso_cuda_module_api *(*fso_cuda_module_get_api_fn)(void);

/* Inside the module: the copy_rates entry (cuda_copy_rates.c). */
void fso_cuda_copy_rates(fso_cuda_copy_report *rep, int ndev, size_t bytes, double seconds);

/* The loaded module's table, loading it on the first call (process-wide,
 * once; later calls return the first outcome). 0, or -ENODEV with the
 * reason and its fix in err: no NVIDIA driver, the module not found, a
 * library it needs missing (dlerror's text), or a module from another
 * build. */
int fso_cuda_module_load(const fso_cuda_module_api **out, char *err, size_t errlen);

/* dlopen() the module file at `path` and check its table against this
 * program; what fso_cuda_module_load does with the file it picks, without
 * the driver check and without keeping the result. The handle stays open
 * on success (the table lives in it). 0, -ENOENT (no such file), -ENOEXEC
 * (cannot be loaded, not a module, or from another build), err says which. */
int fso_cuda_module_open(const char *path, const fso_cuda_module_api **out, char *err,
                         size_t errlen);

#endif /* FSO_HAVE_CUDA */

#endif
