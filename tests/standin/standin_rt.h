/* standin_rt.h — private to the stand-in's runtime files (standin_rt.c,
 * standin_mem.c, standin_blas.c, standin_nccl.c): devices, stream items and
 * the classification of addresses they share. The launchers use standin.h.
 *
 * Locks: one nesting only. A device's mu, the registrations'
 * (standin_mem.c), an event's, a clique's, the fault countdowns', the
 * record's and the aborted communicators' are each taken alone, and nothing
 * is called while one is held that could take another; the exception is
 * standin_nccl.c's open cliques' list, whose lock is taken before one
 * clique's mu (a rank joining, an abort, a destroy). A worker waiting for an event or a
 * collective holds only that device's or clique's mu, in pthread_cond_wait.
 */
#ifndef FSO_STANDIN_RT_H
#define FSO_STANDIN_RT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "fso_standin.h"

#define SI_MAX_DEV FSO_STANDIN_MAX_DEVICES
#define SI_MAX_STREAMS FSO_STANDIN_MAX_STREAMS
#define SI_ALIGN 256

typedef struct si_blk {
    size_t off, len;  /* bytes from the device's base; len a multiple of SI_ALIGN */
    bool dying;       /* cudaFreeAsync queued: no longer a valid operand */
} si_blk;

typedef struct si_dev {
    int index;
    size_t bytes;
    char *base;       /* PROT_NONE: the device addresses handed out */
    char *view;       /* read-write view of the same memfd, for the workers */
    int fd;
    pthread_mutex_t mu;          /* every field below */
    pthread_cond_t done_cv;      /* broadcast when an item of any slot finished */
    si_blk *blk;                 /* live allocations, sorted by off */
    size_t n_blk, cap_blk, used;
    struct CUstream_st *slot[SI_MAX_STREAMS]; /* live streams by index */
    uint64_t issued[SI_MAX_STREAMS];          /* seq of the slot's last queued item */
    uint64_t done[SI_MAX_STREAMS];            /* seq of the slot's last finished item */
    unsigned flags;                           /* cudaSetDeviceFlags */
    _Atomic int sticky;                       /* cudaError_t; 0: none */
} si_dev;

/* How an item behaves (flags of si_enqueue). */
#define SI_FAULT_KERNEL 1u  /* counts for fail_kernel */
#define SI_FAULT_COPY 2u    /* counts for fail_copy */
#define SI_ALWAYS_RUN 4u    /* runs on a device with a sticky error (collectives) */
#define SI_NO_RECORD 8u     /* not in the record (stream-ordered frees) */

typedef cudaError_t (*si_item_fn)(void *arg);

void si_init(void);
int si_device_count(void);
si_dev *si_device(int index);  /* NULL outside 0..count-1 */
int si_current(void);          /* the calling thread's device */

/* Queue fn(arg) on s as `what`; the item owns arg and calls fini(arg) (or
 * free) when done, also when the call fails. A non-success `err` means
 * nothing was queued: a bad stream (cudaErrorInvalidResourceHandle) or the
 * device's sticky error. *seq (optional) gets the item's sequence. */
cudaError_t si_enqueue(cudaStream_t s, const char *what, si_item_fn fn, void *arg,
                       void (*fini)(void *), unsigned flags, uint64_t *seq);
/* Block until s's item `seq` has finished. */
void si_wait_seq(cudaStream_t s, uint64_t seq);
si_dev *si_stream_dev(cudaStream_t s);  /* NULL: not a live stream */
cudaError_t si_sticky(const si_dev *d);
cudaError_t si_set_last(cudaError_t e); /* sets the thread's last error; returns e */
/* Wait for all streams of d. */
void si_dev_drain(si_dev *d);

/* Where [p, p+n) lies. */
enum si_where { SI_PAGEABLE, SI_PINNED, SI_DEVICE, SI_BAD_DEVICE, SI_SPANNING };
enum si_where si_classify(const void *p, size_t n, si_dev **dev);
void *si_view(const void *p);

/* stall_rank: true once for the device's next collective. */
bool si_take_stall(int device);
/* reset()'s part in standin_nccl.c: frees the aborted communicators. */
void si_nccl_reset(void);
/* fail_copy for a copy run on the calling thread: true (and the device's
 * error made sticky) when this one fails. */
bool si_sync_copy_faults(si_dev *d);

/* standin_mem.c's counters, for the controls. */
uint64_t si_mem_pageable_stalls(void);
uint64_t si_mem_spanning_refused(void);
uint64_t si_mem_registrations(void);
int si_mem_last_policy(void);

#endif
