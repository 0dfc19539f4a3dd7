/* cuda_device.c — CUDA devices as the rest of fsoff sees them: how many,
 * what each is (gpu_info.h), and pinning host memory (cuda_backend.h). In
 * the CUDA module: fso_gpu_info_query here leaves bf16_peak_tflops 0, and
 * the main program's forwarder looks the name up in the peak table
 * (cuda_module.h). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "cuda_impl.h"
#include "gpu_info.h"

int fso_cuda_device_count(char *err, size_t errlen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "no CUDA device: %s", cudaGetErrorString(e));
        return 0;
    }
    if (n <= 0) {
        snprintf(err, errlen, "no CUDA device: the driver reports none");
        return 0;
    }
    return n;
}

int fso_gpu_info_query(int device, fso_gpu_info *out, char *err, size_t errlen)
{
    char why[256] = "";
    memset(out, 0, sizeof *out);
    int n = fso_cuda_device_count(why, sizeof why);
    if (n == 0) {
        snprintf(err, errlen, "%s", why);
        return -ENODEV;
    }
    if (device < 0 || device >= n) {
        snprintf(err, errlen, "CUDA device %d: this machine has %d", device, n);
        return -EINVAL;
    }
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e == cudaSuccess)
        e = cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof out->pci_bus_id, device);
    if (e == cudaSuccess) {
        int prev = 0;
        cudaGetDevice(&prev);
        e = cudaSetDevice(device);
        if (e == cudaSuccess)
            e = cudaMemGetInfo(&out->mem_free_bytes, &out->mem_total_bytes);
        cudaSetDevice(prev);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "CUDA device %d: %s", device, cudaGetErrorString(e));
        return fso_cuda_errno(e);
    }
    out->device = device;
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->sm_count = p.multiProcessorCount;
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    if (out->mem_total_bytes == 0)
        out->mem_total_bytes = p.totalGlobalMem;
    return 0;
}

static void human(char *buf, size_t len, double bytes)
{
    const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    if (u == 0 || bytes == (double)(uint64_t)bytes)
        snprintf(buf, len, "%.0f %s", bytes, unit[u]);
    else
        snprintf(buf, len, "%.1f %s", bytes, unit[u]);
}

int fso_cuda_host_unregister(void *ptr, size_t bytes)
{
    if (!ptr || bytes == 0)
        return 0;
    cudaError_t e = cudaHostUnregister(ptr);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fso_cuda_errno(e);
    }
    return 0;
}

int fso_cuda_host_register(void *ptr, size_t bytes, char *err, size_t errlen)
{
    char want[32], lim[32] = "unlimited";
    if (!ptr || bytes == 0) {
        snprintf(err, errlen, "pinning: an empty range (%p, %zu bytes)", ptr, bytes);
        return -EINVAL;
    }
    human(want, sizeof want, (double)bytes);
    struct rlimit rl = {RLIM_INFINITY, RLIM_INFINITY};
    getrlimit(RLIMIT_MEMLOCK, &rl);
    const int low = rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < bytes;
    if (rl.rlim_cur != RLIM_INFINITY)
        human(lim, sizeof lim, (double)rl.rlim_cur);

    char why[256] = "";
    if (fso_cuda_device_count(why, sizeof why) == 0) {
        snprintf(err, errlen, "pinning %s: %s", want, why);
        return -ENODEV;
    }
    /* mapped: reduce_to_host (cuda_backend.c) sums registered host memory
     * on the device through its device pointer */
    cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (e == cudaErrorHostMemoryAlreadyRegistered || e == cudaErrorInvalidValue) {
            snprintf(err, errlen, "pinning %s at %p: %s (a range registered twice or not "
                                  "mapped)", want, ptr, cudaGetErrorString(e));
            return -EINVAL;
        }
        if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
            snprintf(err, errlen, "pinning %s: no CUDA device: %s", want, cudaGetErrorString(e));
            return -ENODEV;
        }
        if (low)
            snprintf(err, errlen, "RLIMIT_MEMLOCK is %s; pinning %s needs `ulimit -l unlimited` "
                                  "(in a container: docker run --ulimit memlock=-1; the driver "
                                  "said: %s)", lim, want, cudaGetErrorString(e));
        else
            snprintf(err, errlen, "pinning %s was refused by the CUDA driver: %s (RLIMIT_MEMLOCK "
                                  "is %s; check free memory, `ulimit -l` and, in a container, "
                                  "docker run --ulimit memlock=-1)",
                     want, cudaGetErrorString(e), lim);
        return -EPERM;
    }
    return 0;
}
