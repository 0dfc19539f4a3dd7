/* cuda_loader.c — cuda_backend.h as the main program has it: every function
 * forwards to the CUDA module, libfso_cuda.so (cuda_module.h), which is
 * loaded with dlopen() on the first call that needs a GPU, so fsoff starts
 * where the CUDA libraries are absent and a CPU run maps none of them.
 *
 * Loading, once: the module is looked for in
 *   1. $FSO_CUDA_MODULE, when set (and then only there);
 *   2. the executable's folder;
 *   3. where `meson install` puts it, relative to the executable
 *      (<bindir>/../<libdir>/fsoff; absolute when bindir or libdir is);
 *   4. the build folder it was built in (build/fsoff and build/tests/
 *      run uninstalled).
 * The first file that exists is the one: if it cannot be loaded the
 * reason is reported, and no other is tried. The tests' stand-in module
 * (tests/standin; cuda_module.h's `standin`) is refused unless the program
 * defines fso_cuda_standin_allowed, which only test programs do. Before the module is loaded
 * (with cuBLAS, ~150 MB of RSS), the NVIDIA driver's libcuda.so.1 must load
 * and show this process at least one device: without a driver the CUDA
 * runtime would say only "driver version is insufficient", and without a
 * device (none installed, or CUDA_VISIBLE_DEVICES empty) the module would be
 * mapped for nothing.
 *
 * State: the one process-wide record below, written once under
 * pthread_once. It is global because what it stands for is: a dlopen()ed
 * library, the libraries it mapped and the CUDA runtime's state behind them
 * belong to the process, not to a caller, and a second copy could not be a
 * second module. The driver and the module stay loaded until the process
 * ends (fsoff never unloads them), so their handles are not kept.
 * fso_backend_is_cuda peeks at the table without loading (it is asked
 * about every backend, CPU ones included).
 */
#include "cuda/cuda_backend.h"
#include "cuda/cuda_module.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "fso_build.h"

#if !FSO_HAVE_CUDA

int fso_cuda_available(char *err, size_t errlen)
{
    snprintf(err, errlen, "built without CUDA: %s", FSO_NO_CUDA_WHY);
    return -ENOTSUP;
}

#else

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "fso_cuda_module_id.h"
#include "util.h"

#define DRIVER_LIB "libcuda.so.1"

static struct {
    pthread_once_t once;
    _Atomic(const fso_cuda_module_api *) api; /* NULL until loaded, and after a failure */
    int rc;                                   /* 0 or -errno of the load */
    char why[1024];                           /* its reason */
} mod = {.once = PTHREAD_ONCE_INIT};

/* This program's file, for messages and for finding the module beside it
 * ("" when /proc is not mounted). */
static void self_path(char *buf, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    buf[n > 0 ? n : 0] = 0;
}

int fso_cuda_module_open(const char *path, const fso_cuda_module_api **out, char *err,
                         size_t errlen)
{
    *out = NULL;
    if (access(path, R_OK) != 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -ENOENT;
    }
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(err, errlen, "cannot load the CUDA module %s: %s; install the CUDA %s runtime, "
                              "cuBLAS and NCCL it was built with, or add their folder to "
                              "LD_LIBRARY_PATH", path, e ? e : "(no reason given)",
                 FSO_CUDA_VERSION);
        return -ENOEXEC;
    }
    fso_cuda_module_get_api_fn get;
    *(void **)&get = dlsym(h, FSO_CUDA_MODULE_SYMBOL);
    const fso_cuda_module_api *api = get ? get() : NULL;
    const fso_cuda_module_layout here = FSO_CUDA_MODULE_LAYOUT_HERE;
    char self[PATH_MAX];
    self_path(self, sizeof self);
    const char *me = self[0] ? self : "this fsoff";
    if (!api) {
        snprintf(err, errlen, "%s is not an fsoff CUDA module (it has no %s); point "
                              "FSO_CUDA_MODULE at the " FSO_CUDA_MODULE_FILE " built with this "
                              "fsoff", path, FSO_CUDA_MODULE_SYMBOL);
    } else if (api->abi != FSO_CUDA_MODULE_ABI) {
        /* a table of another shape: nothing past `abi` means what it says here */
        snprintf(err, errlen, "%s is from another fsoff build: its module interface is number "
                              "%u, %s's is %u; rebuild or reinstall fsoff, or point "
                              "FSO_CUDA_MODULE at the " FSO_CUDA_MODULE_FILE " built with it",
                 path, api->abi, me, FSO_CUDA_MODULE_ABI);
        api = NULL;
    } else {
        const bool same_id = api->build_id && strcmp(api->build_id, FSO_CUDA_MODULE_ID) == 0;
        const bool same_version = api->version && strcmp(api->version, FSO_VERSION) == 0;
        const bool same_layout = memcmp(&api->layout, &here, sizeof here) == 0;
        if (!same_id || !same_version || !same_layout) {
            snprintf(err, errlen, "%s is from another fsoff build: its interface is %s (fsoff %s), "
                                  "%s's is %s (fsoff %s): %s; rebuild or reinstall fsoff, or point "
                                  "FSO_CUDA_MODULE at the " FSO_CUDA_MODULE_FILE " built with it",
                     path, api->build_id ? api->build_id : "(none)",
                     api->version ? api->version : "(none)", me, FSO_CUDA_MODULE_ID, FSO_VERSION,
                     !same_id        ? "the headers that define the module interface differ"
                     : !same_version ? "another version of fsoff"
                                     : "the structs that cross it differ in size (another "
                                       "compiler or other flags)");
            api = NULL;
        }
    }
    if (api && api->standin && !(&fso_cuda_standin_allowed && fso_cuda_standin_allowed)) {
        snprintf(err, errlen, "%s is the tests' CUDA stand-in, which runs on the CPU: %s does "
                              "not load it; unset FSO_CUDA_MODULE (or point it at the "
                              FSO_CUDA_MODULE_FILE " built with this fsoff)", path, me);
        api = NULL;
    }
    if (!api) {
        dlclose(h);
        return -ENOEXEC;
    }
    *out = api;
    return 0;
}

/* Append to buf (size len, holding a string) what fits of `s`. */
static void append(char *buf, size_t len, const char *s)
{
    size_t at = strlen(buf);
    if (at + 1 < len)
        snprintf(buf + at, len - at, "%s", s);
}

/* The module's file into path (PATH_MAX bytes): $FSO_CUDA_MODULE, or the
 * first candidate that exists; else -ENOENT with where it looked and the
 * fix. */
static int find_module(char *path, char *err, size_t errlen)
{
    const char *env = getenv("FSO_CUDA_MODULE");
    if (env && *env) {
        /* dlopen() searches the library path for a name without a slash */
        int w = snprintf(path, PATH_MAX, "%s%s", strchr(env, '/') ? "" : "./", env);
        if (w >= PATH_MAX || access(path, R_OK) != 0) {
            snprintf(err, errlen, "FSO_CUDA_MODULE=%s: %s; point it at the " FSO_CUDA_MODULE_FILE
                                  " built with this fsoff, or unset it", env,
                     w >= PATH_MAX ? strerror(ENAMETOOLONG) : strerror(errno));
            return -ENOENT;
        }
        return 0;
    }
    char exe[PATH_MAX], up[PATH_MAX];
    self_path(exe, sizeof exe);
    char *slash = strrchr(exe, '/');
    const char *dirs[3];
    int nd = 0;
    if (slash) {
        *slash = 0;
        dirs[nd++] = exe;
        if (FSO_CUDA_MODULE_INSTALL_DIR[0] == '/')
            dirs[nd++] = FSO_CUDA_MODULE_INSTALL_DIR;
        else if (snprintf(up, sizeof up, "%s/%s", exe, FSO_CUDA_MODULE_INSTALL_DIR) <
                 (int)sizeof up)
            dirs[nd++] = up;
    }
    dirs[nd++] = FSO_CUDA_MODULE_BUILD_DIR;
    char looked[1024] = "";
    for (int i = 0; i < nd; i++) {
        int w = snprintf(path, PATH_MAX, "%s/" FSO_CUDA_MODULE_FILE, dirs[i]);
        if (w < PATH_MAX && access(path, R_OK) == 0)
            return 0;
        append(looked, sizeof looked, i == 0 ? "" : i + 1 < nd ? ", " : " or ");
        append(looked, sizeof looked, dirs[i]);
    }
    snprintf(err, errlen, "the CUDA module " FSO_CUDA_MODULE_FILE " is not in %s; reinstall fsoff "
                          "(meson install puts it in <libdir>/fsoff) or set FSO_CUDA_MODULE=/path/"
                          "to/" FSO_CUDA_MODULE_FILE, looked);
    return -ENOENT;
}

/* How many devices the driver shows this process (CUDA_VISIBLE_DEVICES
 * applies), asked before the module is loaded: with none, the CUDA runtime
 * and cuBLAS would be mapped for nothing. 0 when there is one or more (or
 * the driver lacks the two calls: the runtime will say), else -ENODEV with
 * the reason in why. */
static int driver_devices(void *drv, char *why, size_t len)
{
    int (*init)(unsigned) = NULL, (*count)(int *) = NULL, (*name)(int, const char **) = NULL;
    *(void **)&init = dlsym(drv, "cuInit");
    *(void **)&count = dlsym(drv, "cuDeviceGetCount");
    *(void **)&name = dlsym(drv, "cuGetErrorString");
    if (!init || !count)
        return 0;
    int n = 0, e = init(0);
    if (e == 0)
        e = count(&n);
    if (e == 0 && n > 0)
        return 0;
    const char *s = NULL;
    if (e != 0 && name && name(e, &s) != 0)
        s = NULL;
    char detail[160];
    if (e == 0)
        snprintf(detail, sizeof detail, "it reports 0 devices");
    else
        snprintf(detail, sizeof detail, "cuInit: %s (error %d)", s ? s : "no description", e);
    snprintf(why, len, "no CUDA device: the NVIDIA driver shows none to this process (%s); check "
                       "nvidia-smi and CUDA_VISIBLE_DEVICES",
             detail);
    return -ENODEV;
}

static void load_once(void)
{
    char path[PATH_MAX];
    mod.rc = find_module(path, mod.why, sizeof mod.why);
    if (mod.rc < 0)
        return;
    const fso_cuda_module_api *api;
    /* a test program may be pointed at the stand-in (FSO_CUDA_MODULE), which
     * needs no driver: open it first to tell */
    if (&fso_cuda_standin_allowed && fso_cuda_standin_allowed && getenv("FSO_CUDA_MODULE") &&
        fso_cuda_module_open(path, &api, mod.why, sizeof mod.why) == 0 && api->standin) {
        atomic_store_explicit(&mod.api, api, memory_order_release);
        return;
    }
    /* Every kernel loaded when the runtime starts, not at its first launch:
     * a lazy load can need a context synchronization, which deadlocks
     * against NCCL kernels spinning on their peers (the CUDA programming
     * guide's lazy-loading hazards). A user's own setting wins. */
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    dlerror();
    void *drv = dlopen(DRIVER_LIB, RTLD_LAZY | RTLD_LOCAL);
    if (!drv) {
        const char *e = dlerror();
        snprintf(mod.why, sizeof mod.why, "no CUDA device: no NVIDIA driver: %s",
                 e ? e : DRIVER_LIB " cannot be loaded");
        mod.rc = -ENODEV;
        return;
    }
    if ((mod.rc = driver_devices(drv, mod.why, sizeof mod.why)) < 0)
        return;
    mod.rc = fso_cuda_module_open(path, &api, mod.why, sizeof mod.why);
    if (mod.rc < 0)
        return;
    atomic_store_explicit(&mod.api, api, memory_order_release);
}

int fso_cuda_module_load(const fso_cuda_module_api **out, char *err, size_t errlen)
{
    pthread_once(&mod.once, load_once);
    *out = atomic_load_explicit(&mod.api, memory_order_acquire);
    if (*out)
        return 0;
    snprintf(err, errlen, "%s", mod.why);
    return -ENODEV;
}

/* The table of a module that must already be loaded: a CUDA backend exists. */
static const fso_cuda_module_api *loaded(const char *fn)
{
    const fso_cuda_module_api *api = atomic_load_explicit(&mod.api, memory_order_acquire);
    FSO_BUG_ON(!api, "%s: not a CUDA backend (the CUDA module was never loaded)", fn);
    return api;
}

/* ------------------------------------------------------------ cuda_backend.h */

int fso_cuda_available(char *err, size_t errlen)
{
    const fso_cuda_module_api *api;
    if (fso_cuda_module_load(&api, err, errlen) < 0)
        return -ENODEV;
    return api->device_count(err, errlen) > 0 ? 0 : -ENODEV;
}

int fso_cuda_device_count(char *err, size_t errlen)
{
    const fso_cuda_module_api *api;
    if (fso_cuda_module_load(&api, err, errlen) < 0)
        return 0;
    return api->device_count(err, errlen);
}

int fso_gpu_info_query(int device, fso_gpu_info *out, char *err, size_t errlen)
{
    const fso_cuda_module_api *api;
    memset(out, 0, sizeof *out);
    if (fso_cuda_module_load(&api, err, errlen) < 0)
        return -ENODEV;
    int rc = api->gpu_info_query(device, out, err, errlen);
    if (rc == 0)
        out->bf16_peak_tflops = fso_gpu_bf16_peak_tflops(out->name);
    return rc;
}

int fso_backend_create_cuda(fso_backend **out, int device, size_t mem_cap_bytes, char *err,
                            size_t errlen)
{
    const fso_cuda_module_api *api;
    *out = NULL;
    if (fso_cuda_module_load(&api, err, errlen) < 0)
        return -ENODEV;
    return api->backend_create(out, device, mem_cap_bytes, err, errlen);
}

void fso_backend_destroy_cuda(fso_backend *be)
{
    if (be)
        loaded(__func__)->backend_destroy(be);
}

int fso_backend_is_cuda(const fso_backend *be)
{
    const fso_cuda_module_api *api = atomic_load_explicit(&mod.api, memory_order_acquire);
    return be && api && api->backend_is_cuda(be);
}

fso_cuda_math fso_cuda_get_math(const fso_backend *be)
{
    return loaded(__func__)->get_math(be);
}

void fso_cuda_set_math(fso_backend *be, fso_cuda_math math)
{
    loaded(__func__)->set_math(be, math);
}

int fso_cuda_host_register(void *ptr, size_t bytes, char *err, size_t errlen)
{
    const fso_cuda_module_api *api;
    if (fso_cuda_module_load(&api, err, errlen) < 0)
        return -ENODEV;
    return api->host_register(ptr, bytes, err, errlen);
}

int fso_cuda_host_unregister(void *ptr, size_t bytes)
{
    char why[8];
    const fso_cuda_module_api *api;
    if (fso_cuda_module_load(&api, why, sizeof why) < 0)
        return -ENODEV;
    return api->host_unregister(ptr, bytes);
}

int fso_coll_create_nccl(fso_coll **out, int world, fso_backend **devices, char *err,
                         size_t errlen)
{
    const fso_cuda_module_api *api;
    *out = NULL;
    if (fso_cuda_module_load(&api, err, errlen) < 0)
        return -ENODEV;
    return api->coll_create_nccl(out, world, devices, err, errlen);
}

int fso_nccl_rail_id(unsigned char id[FSO_NCCL_ID_BYTES], char *err, size_t errlen)
{
    const fso_cuda_module_api *api;
    if (fso_cuda_module_load(&api, err, errlen) < 0)
        return -ENODEV;
    return api->nccl_rail_id(id, err, errlen);
}

int fso_coll_create_nccl_rail(fso_coll **out, int device, int boxes, int box,
                              const unsigned char id[FSO_NCCL_ID_BYTES], double timeout_s,
                              fso_rail_describe_fn describe, char *err, size_t errlen)
{
    const fso_cuda_module_api *api;
    *out = NULL;
    if (fso_cuda_module_load(&api, err, errlen) < 0)
        return -ENODEV;
    return api->coll_create_nccl_rail(out, device, boxes, box, id, timeout_s, describe, err,
                                      errlen);
}

#endif /* FSO_HAVE_CUDA */
