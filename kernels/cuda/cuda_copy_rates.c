/* cuda_copy_rates.c — host<->device copy rates: host to device, device to
 * host and both at once, from pinned and from pageable memory, timed with
 * the CUDA runtime directly on two streams per device. Built into the CUDA
 * module, libfso_cuda.so, and called through its table (cuda_module.h:
 * copy_rates, fso_cuda_copy_report) by `fsoff bench h2d` (bench/bench_gpu.c),
 * so the main program needs no CUDA library for it.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include <cuda_runtime.h>

#include "cuda_backend.h"
#include "cuda_module.h"
#include "util.h"

#define MAX_DEV 16

enum { H2D = FSO_CUDA_COPY_H2D, D2H = FSO_CUDA_COPY_D2H, BOTH = FSO_CUDA_COPY_BOTH,
       N_DIRS = FSO_CUDA_COPY_DIRS };

#define CK(call)                                                                               \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "fsoff bench: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,        \
                    cudaGetErrorString(e_));                                                   \
            return -1.0;                                                                       \
        }                                                                                      \
    } while (0)

struct copy_set {
    int dev;
    void *dev_in, *dev_out;   /* bytes each */
    void *host_in, *host_out; /* bytes each */
    cudaStream_t s[2];
};

/* GB/s (1e9 bytes) moved by `dir` copies of `bytes` for about `seconds`. */
static double time_copies(struct copy_set *cs, int ncs, int dir, size_t bytes, double seconds)
{
    int reps = 1;
    double t = 0;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < ncs; i++) {
            CK(cudaSetDevice(cs[i].dev));
            CK(cudaDeviceSynchronize());
        }
        double t0 = (fso_now_ms() / 1e3);
        for (int r = 0; r < reps; r++)
            for (int i = 0; i < ncs; i++) {
                CK(cudaSetDevice(cs[i].dev));
                if (dir == H2D || dir == BOTH)
                    CK(cudaMemcpyAsync(cs[i].dev_in, cs[i].host_in, bytes, cudaMemcpyHostToDevice,
                                       cs[i].s[0]));
                if (dir == D2H || dir == BOTH)
                    CK(cudaMemcpyAsync(cs[i].host_out, cs[i].dev_out, bytes,
                                       cudaMemcpyDeviceToHost, cs[i].s[1]));
            }
        for (int i = 0; i < ncs; i++) {
            CK(cudaSetDevice(cs[i].dev));
            CK(cudaDeviceSynchronize());
        }
        t = (fso_now_ms() / 1e3) - t0;
        if (round == 0) { /* calibrate: the measured round lasts about `seconds` */
            int want = (int)(seconds / (t > 1e-6 ? t : 1e-6));
            reps = want < 2 ? 2 : want > 200 ? 200 : want;
        }
    }
    double moved = (double)bytes * reps * ncs * (dir == BOTH ? 2 : 1);
    return moved / t / 1e9;
}


static int setup_copy_set(struct copy_set *cs, int dev, size_t bytes, int pinned, char *note,
                          size_t notelen)
{
    memset(cs, 0, sizeof *cs);
    cs->dev = dev;
    if (cudaSetDevice(dev) != cudaSuccess || cudaMalloc(&cs->dev_in, bytes) != cudaSuccess ||
        cudaMalloc(&cs->dev_out, bytes) != cudaSuccess ||
        cudaMemset(cs->dev_out, 1, bytes) != cudaSuccess ||
        cudaStreamCreateWithFlags(&cs->s[0], cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&cs->s[1], cudaStreamNonBlocking) != cudaSuccess) {
        snprintf(note, notelen, "device %d: cannot allocate 2 x %zu bytes", dev, bytes);
        return -ENOMEM;
    }
    cs->host_in = mmap(NULL, 2 * bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (cs->host_in == MAP_FAILED) {
        cs->host_in = NULL;
        snprintf(note, notelen, "cannot map 2 x %zu bytes of host memory", bytes);
        return -ENOMEM;
    }
    memset(cs->host_in, 1, 2 * bytes); /* fault the pages in */
    cs->host_out = (char *)cs->host_in + bytes;
    if (pinned) {
        int rc = fso_cuda_host_register(cs->host_in, 2 * bytes, note, notelen);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static void free_copy_set(struct copy_set *cs, size_t bytes, int pinned)
{
    cudaSetDevice(cs->dev);
    if (cs->host_in) {
        if (pinned)
            fso_cuda_host_unregister(cs->host_in, 2 * bytes);
        munmap(cs->host_in, 2 * bytes);
    }
    cudaFree(cs->dev_in);
    cudaFree(cs->dev_out);
    for (int i = 0; i < 2; i++)
        if (cs->s[i])
            cudaStreamDestroy(cs->s[i]);
}

void fso_cuda_copy_rates(fso_cuda_copy_report *rep, int ndev, size_t bytes, double seconds)
{
    if (ndev > MAX_DEV)
        ndev = MAX_DEV;
    for (int p = 0; p < 2; p++)
        for (int d = 0; d < N_DIRS; d++)
            rep->gbps[p][d] = rep->all_gbps[d] = -1;
    for (int pinned = 1; pinned >= 0; pinned--) {
        struct copy_set cs;
        char note[512] = "";
        if (setup_copy_set(&cs, 0, bytes, pinned, note, sizeof note) == 0)
            for (int d = 0; d < N_DIRS; d++)
                rep->gbps[pinned ? 0 : 1][d] = time_copies(&cs, 1, d, bytes, seconds);
        else if (pinned)
            snprintf(rep->pin_note, sizeof rep->pin_note, "%s", note);
        else
            fprintf(stderr, "fsoff bench h2d: pageable copies: %s\n", note);
        free_copy_set(&cs, bytes, pinned);
    }
    if (ndev > 1 && !rep->pin_note[0]) {
        struct copy_set cs[MAX_DEV];
        int ok = 1, n = 0;
        char note[512] = "";
        for (; n < ndev && ok; n++)
            ok = setup_copy_set(&cs[n], n, bytes, 1, note, sizeof note) == 0;
        if (ok)
            for (int d = 0; d < N_DIRS; d++)
                rep->all_gbps[d] = time_copies(cs, ndev, d, bytes, seconds);
        else
            fprintf(stderr, "fsoff bench h2d: all-device copies: %s\n", note);
        for (int i = 0; i < n; i++)
            free_copy_set(&cs[i], bytes, 1);
    }
}
