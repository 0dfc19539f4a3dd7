/* zero_step.h — private to engine/zero*.c (through zero_impl.h): the
 * devices' compute threads and running one job on all of them
 * (zero_step.c). Device 0 computes on the caller's thread (the one that
 * creates the trainer, runs its steps and destroys it); devices 1..world-1
 * on worker threads started once. Handing a job over and collecting it
 * under threads.mu orders everything the caller wrote before it with the
 * workers, and everything they wrote with the caller after it. */
#ifndef FSO_ZERO_STEP_H
#define FSO_ZERO_STEP_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zero.h"
#include "zero_lock.h"

/* The worker threads: run_ranks hands each the same job and waits. */
typedef struct rank_threads {
    pthread_t workers[FSO_MAX_DEVICES]; /* the caller's thread */
    int n_workers;               /* the caller's thread */
    zr_mutex mu;                 /* job, gen, left, quit */
    pthread_cond_t run_cv;       /* workers wait for a new gen or quit */
    pthread_cond_t done_cv;      /* the caller waits for left to reach 0 */
    bool init;                   /* the caller's thread */
    void *(*job)(void *);        /* mu */
    uint64_t gen;                /* mu: jobs handed out so far */
    int left;                    /* mu: workers still running the job */
    bool quit;                   /* mu */
    bool caller_bound;           /* the caller's thread: device 0's node applied to it */
} rank_threads;


/* Run fn on every device, device 0 on the caller's thread, and wait; the
 * first failure (another device's before -ECANCELED). */
int zr_run_ranks(fso_zero *z, void *(*fn)(void *));
int zr_start_workers(fso_zero *z, char *err, size_t errlen);
void zr_stop_workers(fso_zero *z);
/* The first device's failure message into err (one that caused the others'). */
void zr_first_error(const fso_zero *z, char *err, size_t errlen);
/* inputs, targets and pos (n elements each; pos may be NULL) as the ranks
 * should read them: on CUDA devices, copies in z->batch (zr_pinned), so
 * that copying them to a device does not stall its rank until the device
 * has caught up; else the caller's own. Reused from job to job: every job
 * ends with a device sync, so no copy of the last one still reads it. Out
 * of memory: the caller's own. */
void zr_batch_pin(fso_zero *z, const int32_t **inputs, const int32_t **targets,
                  const int32_t **pos, size_t n);

#endif
