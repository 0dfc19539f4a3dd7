/* cuda_module.c — the one export of libfso_cuda.so: its table of entry
 * points (contract: cuda_module.h). Built into the module only; the
 * functions it lists are the real ones of cuda_backend.c, cuda_device.c,
 * coll_nccl.c, coll_nccl_rail.c and cuda_copy_rates.c, which keep the public names of
 * cuda_backend.h inside the module (its other symbols are local: the
 * version script, cuda_module.map, exports this one alone). */
#include "cuda_module.h"

#include "fso_build.h"
#include "fso_cuda_module_id.h"

static const fso_cuda_module_api api = {
    .abi = FSO_CUDA_MODULE_ABI,
    .build_id = FSO_CUDA_MODULE_ID,
    .version = FSO_VERSION,
    .layout = FSO_CUDA_MODULE_LAYOUT_HERE,
#ifdef FSO_CUDA_STANDIN
    .standin = 1, /* built into tests/standin's module */
#endif
    .device_count = fso_cuda_device_count,
    .gpu_info_query = fso_gpu_info_query,
    .backend_create = fso_backend_create_cuda,
    .backend_destroy = fso_backend_destroy_cuda,
    .backend_is_cuda = fso_backend_is_cuda,
    .get_math = fso_cuda_get_math,
    .set_math = fso_cuda_set_math,
    .host_register = fso_cuda_host_register,
    .host_unregister = fso_cuda_host_unregister,
    .coll_create_nccl = fso_coll_create_nccl,
    .nccl_rail_id = fso_nccl_rail_id,
    .coll_create_nccl_rail = fso_coll_create_nccl_rail,
    .copy_rates = fso_cuda_copy_rates,
};

const fso_cuda_module_api *fso_cuda_module_get_api(void);

const fso_cuda_module_api *fso_cuda_module_get_api(void)
{
    return &api;
}
