/* fso_standin.h — the controls of the CUDA runtime stand-in
 * (libfso_cuda_standin.so), for tests: faults to inject and the record of
 * what ran on which stream after what. The module exports
 * FSO_STANDIN_SYMBOL beside the CUDA module's table getter; a test that
 * loaded the module (FSO_CUDA_MODULE) finds it with
 * dlopen(path, RTLD_NOLOAD) + dlsym.
 *
 * What the stand-in is (README in this folder): the CUDA runtime, cuBLAS
 * and NCCL entry points fsoff's CUDA module calls, on the CPU, so the
 * module's real orchestration code (cuda_backend.c, coll_nccl.c, ...) runs
 * here. Streams are worker threads that run their queue late, with random
 * delays; events are (stream, sequence); device memory is a mapping the
 * host cannot read (a read faults), the worker threads use a second view
 * of it; copies obey the driver's rules (a pageable copy stalls its
 * issuer, a host range across two pinned registrations is
 * cudaErrorInvalidValue); kernels run the CPU backend's ops; collectives
 * block until every rank has arrived.
 *
 * Environment, read when the module loads:
 *   FSO_STANDIN_DEVICES   devices shown (default 2, at most 8)
 *   FSO_STANDIN_MEM_MIB   memory per device (default 1024)
 *   FSO_STANDIN_DELAY_US  longest random delay before an item runs (default 50; 0: none)
 *   FSO_STANDIN_SEED      seed of the delays (default: fixed)
 */
#ifndef FSO_STANDIN_H
#define FSO_STANDIN_H

#include <stddef.h>
#include <stdint.h>

#define FSO_STANDIN_SYMBOL "fso_standin_control"
#define FSO_STANDIN_MAX_DEVICES 8
#define FSO_STANDIN_MAX_STREAMS 16 /* live at once per device: a CUDA backend makes 4, and
                                    test_cuda keeps two on device 0 while it makes more */

/* One item a stream ran: a kernel, a cuBLAS call, a copy, a memset, a
 * collective, or a wait on an event. */
typedef struct fso_standin_item {
    int device;     /* 0..devices-1 */
    int stream;     /* index on its device, in creation order (the CUDA backend
                       creates compute, h2d, d2h, collectives: 0, 1, 2, 3) */
    uint64_t seq;   /* 1, 2, ... on its stream, in issue order */
    char what[40];  /* "kernel rmsnorm_fwd", "gemm", "copy h2d", "copy d2h",
                       "copy d2d", "memset", "all_gather", "reduce_scatter",
                       "all_reduce", "wait" */
    /* Vector clock: after[j] is the last item of stream j (same device) this
     * item is ordered after, through the stream's order and event waits;
     * after[stream] == seq. Item A happens before item B of another stream
     * exactly when B.after[A.stream] >= A.seq. */
    uint64_t after[FSO_STANDIN_MAX_STREAMS];
    /* A process-wide counter when it was queued, began and ended: issue
     * order across streams, and what ran beside what. */
    uint64_t issue_tick, start_tick, end_tick;
} fso_standin_item;

typedef struct fso_standin_api {
    /* Faults, counted from the call (0: off). The nth kernel (or cuBLAS
     * call) launched from now fails when it runs: the device's error is
     * then sticky, cudaErrorLaunchFailure, as after a real kernel fault. The
     * nth copy issued from now fails the same way (cudaErrorIllegalAddress).
     * stall_rank(d): device d's next collective never arrives; its peers
     * block in theirs until the communicator is aborted (-1: off). */
    void (*fail_kernel)(uint64_t nth);
    void (*fail_copy)(uint64_t nth);
    void (*stall_rank)(int device);
    /* Clear the faults above and the devices' sticky errors: between
     * tests, once every backend and communicator is destroyed. */
    void (*reset)(void);
    /* Start recording items (clearing the record), up to `cap` of them;
     * 0 stops recording. */
    void (*record)(size_t cap);
    /* The items recorded so far, in the order they finished; valid until
     * the next record(). */
    size_t (*recorded)(const fso_standin_item **items);
    /* Counters since load: copies that stalled their issuer (pageable),
     * copies refused for spanning registrations, host registrations made,
     * and the NUMA policy mode (get_mempolicy, MPOL_*) of the first page of
     * the last registration, when it was made (-1: unknown). */
    uint64_t (*pageable_stalls)(void);
    uint64_t (*spanning_refused)(void);
    uint64_t (*registrations)(void);
    int (*last_registration_policy)(void);
} fso_standin_api;

typedef const fso_standin_api *(*fso_standin_control_fn)(void);

#endif
