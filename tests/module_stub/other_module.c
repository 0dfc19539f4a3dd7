/* other_module.c — stand-ins for a libfso_cuda.so from another fsoff build,
 * for test_cuda_loader: the loader must refuse each, and say why.
 *
 *   STUB_OTHER_ID:  this build's interface number, version and struct
 *                   sizes, but another build identity: a module whose
 *                   interface headers changed in a way no size shows (a
 *                   reordered backend table, a struct passed by pointer).
 *   STUB_OTHER_ABI: another interface number, and a table that is nothing
 *                   but that number: a loader that read on past `abi` would
 *                   read outside it, which AddressSanitizer reports.
 * Nothing here is ever called.
 */
#include "cuda/cuda_module.h"

#include "fso_build.h"

#define STUB_ID "0123456789abcdef" /* not a hash of anything */

const fso_cuda_module_api *fso_cuda_module_get_api(void);

#if defined(STUB_OTHER_ID)

static const fso_cuda_module_api api = {
    .abi = FSO_CUDA_MODULE_ABI,
    .build_id = STUB_ID,
    .version = FSO_VERSION,
    .layout = FSO_CUDA_MODULE_LAYOUT_HERE,
};

const fso_cuda_module_api *fso_cuda_module_get_api(void)
{
    return &api;
}

#elif defined(STUB_OTHER_ABI)

static const uint32_t abi_only = FSO_CUDA_MODULE_ABI + 1;

const fso_cuda_module_api *fso_cuda_module_get_api(void)
{
    return (const fso_cuda_module_api *)(const void *)&abi_only;
}

#else
#error "define STUB_OTHER_ID or STUB_OTHER_ABI"
#endif
