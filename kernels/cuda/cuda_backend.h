/* cuda_backend.h — NVIDIA GPUs: the "cuda" backend (backend.h), NCCL
 * collectives (coll.h), pinned host memory and device queries. A C header.
 *
 * Every build has fso_cuda_available() and the peak table (gpu_info.h).
 * The rest exists only when fsoff was built with nvcc (FSO_HAVE_CUDA 1 in
 * fso_build.h); callers guard with `#if FSO_HAVE_CUDA`, and a build without
 * CUDA reports why through fso_cuda_available().
 *
 * Loading: the implementation is the CUDA module, libfso_cuda.so, the only
 * part of fsoff linked with the CUDA runtime, cuBLAS and NCCL. These
 * functions forward to it (cuda_loader.c) and load it with dlopen() on the
 * first call that needs it: fso_cuda_available, fso_cuda_device_count,
 * fso_gpu_info_query, creating a backend or an NCCL communicator, and
 * pinning. Nothing else does, so a CPU run maps no CUDA library, and fsoff
 * starts where they are absent. Where the module is looked for is
 * cuda_loader.c's header ($FSO_CUDA_MODULE first). When it cannot be loaded
 * (no NVIDIA driver, the module or a library it needs missing, a module from
 * another build), each of them fails as "no device" does (-ENODEV, 0
 * devices) with that reason and its fix in err. fso_backend_is_cuda never
 * loads it.
 *
 * Precision: the ops store what backend.h's types say: with dt = FSO_DT_BF16
 * the weights as lent and the activations inside a layer are bf16 in
 * device memory (read widened exactly, written rounded once to nearest
 * even, NaNs kept), with fp32 math inside every op. Matmuls with bf16
 * operands run on the tensor cores with fp32 accumulation
 * (CUBLAS_COMPUTE_32F) into fp32 or bf16 results; an fp32 operand meeting
 * bf16 ones (the fp32 gradient of a residual branch or of the logits) is
 * rounded to bf16 first, in the backend's scratch. Attention computes its
 * scores and their gradient in fp32 (a scratch slice of Hkv heads) and
 * multiplies the stored bf16 probabilities and a bf16 rounding of dS
 * (cuda_attention.c). The rest (norms, RoPE, SwiGLU, cross-entropy, AdamW)
 * computes in fp32 with fp32 accumulation; sqnorm accumulates in double.
 * With dt = FSO_DT_F32 every buffer is fp32 and matmuls use the backend's
 * math: bf16 tensor cores with fp32 accumulation (cuBLAS
 * CUBLAS_COMPUTE_32F_FAST_16BF: inputs rounded to bf16, products summed in
 * fp32), or with FSO_CUDA_MATH=fp32 (read when a backend is created;
 * default bf16) plain fp32, so tests can hold the backend to the CPU
 * reference tightly.
 *
 * Streams: each backend has four, compute, host-to-device, device-to-host
 * and collectives. Ops run on compute; copy_h2d and copy_d2h on their copy
 * streams; NCCL on the collective stream. Work is ordered as issued: before
 * anything is queued on one stream it waits (cudaStreamWaitEvent, never the
 * host) for the work already queued on the others, except that the _after
 * forms of copies and gathers wait only for the work before a mark (and for
 * the host-to-device copies queued so far), which is how a staging copy
 * runs while earlier compute does, and that compute waits only for the
 * host-to-device copies and, on the collective stream, up to its last
 * all-gather: not for device-to-host copies or a reduce-scatter after that
 * gather, unless ordered after a mark (backend.h order_after, a wait on the
 * mark's events queued on the compute stream). Marks are events on every stream with
 * work (mark) or on the two copy streams (mark_copies), kept in a ring of
 * FSO_CUDA_MARKS (1024). A mark used after it left the ring (waited for, or
 * given as `after`) is "stale": the wait or the order is then stricter than
 * asked (a later mark, or all queued work), never wrong, but overlap is
 * lost; the backend's stale_marks op (fso_backend_stale_marks) counts them,
 * and the step line shows the count when it is not 0.
 *
 * The host waits only in sync(), in wait_mark() (for that mark's events),
 * in sqnorm and sum over host memory the device cannot read (summed on the
 * CPU once the copies into it are done), in all_reduce_f64 and barrier
 * (host buffers), in buf_free, and when a scratch buffer first grows on a
 * device without stream-ordered allocation. The scratch only grows, to the
 * largest need of an op (attention's score slices, a matmul's bf16 copy
 * of an fp32 gradient), so once a step has run, later steps allocate
 * nothing. sqnorm and sum results come back to pinned memory
 * asynchronously and are added to their outputs by sync() or by
 * wait_mark() of a later full mark, so a training step synchronises with
 * the device once, at its end.
 *
 * How the host waits: blocking, on an OS primitive (the device's
 * cudaDeviceScheduleBlockingSync for stream waits, cudaEventBlockingSync
 * for the marks' events), because fsoff's host has other work while it
 * waits: the CPU AdamW's threads, NVMe I/O, the other ranks' threads. With
 * a context or two per process the runtime's default would spin, holding a
 * core each. FSO_CUDA_WAIT=spin (read when a backend is created; "block" is
 * the default) makes the waits spin (sooner back, a core held) to
 * compare the two.
 *
 * Debugging: FSO_CUDA_SYNC=1 (read when a backend is created) makes every
 * op and copy wait for its stream and check it, so the first failing one
 * is named in be->err; everything is then serialised and slow.
 *
 * Errors: ops return nothing; the first failure is kept (be->err has the
 * detail) and every later sync() returns it as a negative errno. A negative
 * token id (embedding: it is not told the vocabulary size) or a target
 * outside [0, V) (cross-entropy) is such a failure, reported by the next
 * sync() as -EINVAL.
 *
 * sqnorm reads device memory and registered host memory on the GPU; other
 * host memory is summed on the CPU (one thread) in the GPU's order, so the
 * bits are the same wherever the values live.
 *
 * Threads: any host thread may drive a backend, not only the one that made
 * it. Copies and sync() may come from a second thread while the first
 * issues ops (the engine's optimizer thread with state on the device); work
 * is then ordered as the two threads happened to issue it, and each must
 * sync() before reading what it copied. Ops that compute (they share one
 * cuBLAS handle and the scratch buffer) come from one thread at a time.
 */
#ifndef FSO_CUDA_BACKEND_H
#define FSO_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "coll.h"
#include "fso_build.h"
#include "gpu_info.h"

/* Marks kept in the ring (as many as cpu-async keeps); a mark older than
 * that is "stale": waiting on it waits for a later mark of the same or
 * more streams (or, if a copies-only mark took the slot of a full one,
 * drains), and work ordered after it waits for everything queued. Only
 * stricter, never wrong, but it costs overlap: each is counted
 * (stale_marks) and the step line shows the count when it is not 0. */
#define FSO_CUDA_MARKS 1024

/* 0 when this build has CUDA and at least one device is visible. Otherwise
 * -ENOTSUP ("built without CUDA: ...") or -ENODEV ("no CUDA device: ...",
 * or why the CUDA module cannot be loaded) with the reason in err. */
int fso_cuda_available(char *err, size_t errlen);

#if FSO_HAVE_CUDA

/* Matmul math of a CUDA backend for fp32 operands (dt = FSO_DT_F32); bf16
 * operands always multiply on the tensor cores with fp32 sums. */
typedef enum fso_cuda_math {
    FSO_CUDA_MATH_BF16 = 0, /* bf16 tensor cores, fp32 accumulation (default) */
    FSO_CUDA_MATH_FP32 = 1, /* plain fp32 (no TF32) */
} fso_cuda_math;

/* Number of CUDA devices; 0 with the reason in err ("no CUDA device: no
 * NVIDIA driver: libcuda.so.1: cannot open shared object file ...") when
 * there is no driver, no GPU or no loadable CUDA module. Never negative. */
int fso_cuda_device_count(char *err, size_t errlen);

/* A backend named "cuda" on CUDA device `device` (an ordinal as
 * CUDA_VISIBLE_DEVICES numbers them; also be->device). host_addressable 0.
 * mem_cap_bytes 0: no cap beyond the device's memory; else buf_alloc fails
 * past it, as on the CPU backend; mem_used/peak count buffers (rounded to
 * 64 bytes like the CPU backend) and the backend's own scratch. The matmul
 * math comes from FSO_CUDA_MATH ("bf16" or "fp32"). 0 or -errno with the
 * reason in err. fso_backend_destroy() frees it (its ops->destroy is
 * fso_backend_destroy_cuda), and fso_backend_coll_create() makes its
 * collectives (fso_coll_create_nccl). */
int fso_backend_create_cuda(fso_backend **out, int device, size_t mem_cap_bytes, char *err,
                            size_t errlen);
/* Free everything the backend holds (buffers not yet freed included).
 * NULL is fine. The same as fso_backend_destroy() on a CUDA backend. */
void fso_backend_destroy_cuda(fso_backend *be);
/* 1 when `be` was made by fso_backend_create_cuda. */
int fso_backend_is_cuda(const fso_backend *be);

fso_cuda_math fso_cuda_get_math(const fso_backend *be);
void fso_cuda_set_math(fso_backend *be, fso_cuda_math math);

/* Facts about device `device`, bf16 peak from the table included.
 * 0 or -errno with the reason in err. */
int fso_gpu_info_query(int device, fso_gpu_info *out, char *err, size_t errlen);

/* Page-lock [ptr, ptr + bytes) for every device of the process (portable,
 * mapped: reduce_to_host's kernels read registered host memory through its
 * device pointer), as one registration: fast asynchronous copies, and
 * kernels (sqnorm) may read it. A copy whose host range spans two
 * registrations is refused, and the driver refuses registrations much
 * over 64 GiB: the host arena cuts its registrations (zero_arena.h,
 * ZR_ARENA_PIN_CHUNK). Use few, large ranges, not one per buffer.
 * Returns 0, or:
 *   -EPERM   pinning was refused (RLIMIT_MEMLOCK, the driver): err says why
 *            and what to do, e.g. "RLIMIT_MEMLOCK is 8 MiB; pinning 64 GiB
 *            needs `ulimit -l unlimited`"; warn once and continue with
 *            pageable memory, which works, only slower;
 *   -ENODEV  no CUDA device or driver;
 *   -EINVAL  a NULL or empty range, or one that overlaps a registered one.
 * RLIMIT_MEMLOCK is read first; the NVIDIA driver does not charge pinned
 * pages to it on current Linux drivers, so a low limit alone does not
 * refuse: it goes into the message when the driver refuses. */
int fso_cuda_host_register(void *ptr, size_t bytes, char *err, size_t errlen);
/* Undo fso_cuda_host_register on the same range. 0 or -errno. */
int fso_cuda_host_unregister(void *ptr, size_t bytes);

/* NCCL collectives among `world` CUDA backends of this process, devices[r]
 * being rank r's (one CUDA device each, all distinct). One communicator per
 * device (ncclCommInitAll); each rank's thread calls its collectives, as the
 * engine does. all_gather (fp32 or bf16) and reduce_scatter (fp32, sum) run
 * on each rank's collective stream, ordered after the work already queued on
 * its backend (all_gather: before its `after` mark) and before the copies
 * and collectives queued after them; compute queued after them waits for
 * an all_gather (and the collectives before it), not for a reduce_scatter
 * after the last gather (backend.h order_after). They return once
 * queued. A failure
 * is returned and also kept in the rank's backend, so its next sync() reports
 * it. all_reduce_f64 (host buffers, at most 64 values) gathers every rank's
 * values and sums them in rank order, so all ranks get the same bits;
 * barrier waits for the rank's queued work and for every rank to reach it.
 * reduce_scatter sums in NCCL's order, not rank order; reduce_scatter_bf16
 * exchanges the bf16 pieces (grouped ncclSend/ncclRecv into a row buffer
 * the collectives own, world * count bf16 per rank, kept at its largest)
 * and sums them in fp32 in rank order on the collective stream: the thread
 * implementation's bits. busy_ms counts host
 * time inside the calls. 0 or -errno with the reason in err. */
int fso_coll_create_nccl(fso_coll **out, int world, fso_backend **devices, char *err,
                         size_t errlen);

/* Across boxes (engine/boxes.h): NCCL's unique id, the bytes box 0 makes
 * (fso_nccl_rail_id) and MPI hands to every box before each makes its end of
 * the rail with it. */
#define FSO_NCCL_ID_BYTES 128

/* Called by a rail that waits too long: one line about box `box` (its
 * host, when it was last heard from and what it was doing), from the
 * boxes' heartbeat (engine/boxes.c). */
typedef void (*fso_rail_describe_fn)(int box, char *buf, size_t len);

/* A fresh NCCL unique id (ncclGetUniqueId) into id. 0 or -errno with the
 * reason in err (-ENODEV: no CUDA module or device). */
int fso_nccl_rail_id(unsigned char id[FSO_NCCL_ID_BYTES], char *err, size_t errlen);

/* This box's end of a rail (coll.h) over NCCL: one communicator of `boxes`
 * ranks, this box being rank `box`, on CUDA device `device`, made from the
 * id every box was given. Every box calls it at about the same time (NCCL
 * initialises collectively). The communicator is non-blocking
 * (ncclConfig_t blocking = 0), so that every wait on it is polled and
 * bounded by timeout_s (0: never), and on a timeout or an error it is
 * aborted (ncclCommAbort): the call fails with -ETIMEDOUT or the error,
 * c->err naming the call and, through describe (NULL: none), the other
 * boxes; later calls fail at once with -ECANCELED.
 *
 * Its calls take rank = box, buffers in device `device`'s memory (pointers
 * of any backend on that device), and are synchronous: each starts when
 * called (the caller has finished writing send on every stream) and
 * returns when recv is complete on this box, on the rail's own stream, so
 * it never queues behind or ahead of the in-box collectives. One thread at
 * a time per rail. all_reduce_f64's buffer is host memory; sums run in box
 * order (all_reduce_f64, reduce_scatter_bf16 as fso_coll_create_nccl's),
 * reduce_scatter in NCCL's order, which for two boxes is the one sum a+b.
 * busy_ms[box] counts the time inside calls. 0 or -errno with err. */
int fso_coll_create_nccl_rail(fso_coll **out, int device, int boxes, int box,
                              const unsigned char id[FSO_NCCL_ID_BYTES], double timeout_s,
                              fso_rail_describe_fn describe, char *err, size_t errlen);

#endif /* FSO_HAVE_CUDA */

#endif
