/* cpu_async.h — the "cpu-async" backend (cpu_async.c): a CPU device with a
 * discrete GPU's rules (device memory the host cannot touch, copies and
 * reductions that complete late), for running the engine's GPU paths
 * without a GPU. fso_backend_create(FSO_BACKEND_CPU_ASYNC, ...) makes one;
 * fso_backend_destroy frees it, fso_backend_coll_create makes its
 * collectives (fso_coll_create_async).
 */
#ifndef FSO_CPU_ASYNC_H
#define FSO_CPU_ASYNC_H

#include <stddef.h>

#include "backend.h"
#include "coll.h"

/* Its registry row's create (backend.h), wrapping a fast CPU backend. */
int fso_backend_create_async(fso_backend **out, int device, int threads, size_t mem_cap_bytes,
                             char *err, size_t errlen);
/* 1 when `be` is a cpu-async device (tests). */
int fso_backend_is_async(const fso_backend *be);
/* What a cpu-async device saw so far: sync() calls; drains, waits of any
 * kind that ran the device dry (on a GPU, the host and the device taking
 * turns; the simulation runs work in one queue, so a wait for a copy counts
 * as one when nothing was queued after it, where a GPU would wait for the
 * copy stream alone); buffer allocations; and stale marks, marks waited for
 * or given as `after` once they had left the ring of the last 1024 (the
 * CUDA backend's window too): the wait or the order is then for everything
 * queued; and compute queued ahead of a device-to-host copy or a
 * reduce-scatter queued before it (backend.h order_after), so run before
 * it. */
typedef struct fso_async_counts {
    uint64_t syncs, drains, allocs, stale_marks, ahead;
    uint64_t marks;      /* marks taken (full or copies-only) */
    uint64_t copy_marks; /* of which copies-only (mark_copies) */
} fso_async_counts;
fso_async_counts fso_async_counts_of(fso_backend *be);

/* The host address of a cpu-async device address (host memory passes
 * through): what a GPU's own transport (NCCL) reaches directly, for tests
 * that stand in for it. */
void *fso_async_host_view(const void *device_ptr);

/* The threads collectives (coll.h) among `world` cpu-async devices, bes[r]
 * being rank r's: each call first completes the rank's queued copies, as a
 * gather on a GPU is ordered after them. Destroy them before the devices,
 * with none of their calls still queued (it aborts, naming the device). */
int fso_coll_create_async(fso_coll **out, int world, fso_backend *const *bes);

#endif
