/* boxes.h — several boxes: one fsoff process per box, started by mpirun or
 * srun (ARCHITECTURE.md, "Several boxes").
 *
 * Inside a box nothing changes: its devices run ZeRO-3 among themselves
 * (zero.h). Across B boxes the fp32 master, AdamW m and v and the CPU
 * AdamW work are sharded: box k owns slice k of every device shard. The
 * boxes meet on rails: rail g joins device g of every box, an fso_coll
 * (coll.h) whose ranks are the boxes, over MPI on CPU devices and NCCL on
 * GPUs. Per step a device reduce-scatters its gradient shard over its rail
 * (each box gets the sum of its slice), the global norm is one more
 * all-reduce, each box updates its slice, and the updated working
 * parameters are all-gathered over the rail.
 *
 * MPI is initialised only when an MPI launcher started the process (Open
 * MPI's OMPI_COMM_WORLD_SIZE, PMI's PMI_SIZE, Slurm's SLURM_NTASKS); a run
 * without one is one box and behaves as if MPI were not there. Every wait
 * across boxes is bounded (comm.timeout_s), and each box's heartbeat says
 * what it was doing, so a box that dies or stalls is named, never waited
 * for forever.
 *
 * The process-wide state here is MPI's own: these functions are called from
 * the main thread, except the rails' collectives (each rail from one thread
 * at a time) and fso_boxes_phase (any thread).
 */
#ifndef FSO_BOXES_H
#define FSO_BOXES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coll.h"
#include "config/config.h"

/* The rails of this process's devices. Every device has a pair over MPI,
 * whose buffers are host memory; GPUs also have a pair over NCCL, whose
 * buffers are device memory: the trainer moves a shard over the NCCL rail
 * when it lives on the GPU and over the MPI one otherwise (host memory,
 * NVMe), so nothing crosses PCIe to meet another box. */
typedef struct fso_rails {
    int box, boxes;                   /* this box, and how many (1: one box, no rails) */
    int devices;                      /* rails made: one pair per device */
    fso_coll *grad[FSO_MAX_DEVICES];  /* device g's rail for its gradients and the step's
                                         scalars (loss, norm, failures): its compute thread's */
    fso_coll *param[FSO_MAX_DEVICES]; /* device g's rail for its working parameters and the
                                         master's slices (export): its updater's */
    fso_coll *grad_dev[FSO_MAX_DEVICES];  /* the NCCL pair (coll.h: buffers on device g), the
                                             same threads' */
    fso_coll *param_dev[FSO_MAX_DEVICES]; /* NULL: none (CPU devices, comm.rails "mpi", a GPU
                                             that serves two boxes) */
    char note[320];                   /* what carries the GPUs' rails and why, for the banner
                                         ("" on CPU devices) */
    void *impl;                       /* the implementation's (communicators) */
} fso_rails;

/* Start of main, before anything else: when an MPI launcher started this
 * process, initialise MPI (threads: every rail from its own thread) and
 * start the heartbeat; else nothing. A build without MPI started by a
 * launcher with more than one process refuses, saying how to build with
 * MPI (it would run that many independent trainings). 0, or negative errno
 * with the message in err. */
int fso_boxes_init(int *argc, char ***argv, char *err, size_t errlen);
/* Finalize MPI (when initialised). */
void fso_boxes_finalize(void);

int fso_boxes_count(void);          /* boxes in the run: 1 without a launcher */
int fso_boxes_self(void);           /* this box, 0 .. count-1 */
const char *fso_boxes_host(int box); /* its host name, for messages */

/* comm.timeout_s: the longest any wait across boxes may take before the
 * run fails naming the quiet box (default FSO_BOXES_TIMEOUT_S). */
#define FSO_BOXES_TIMEOUT_S 600.0
void fso_boxes_set_timeout(double seconds);
double fso_boxes_timeout_s(void);

/* Make the rails for `devices` devices (every box the same count and kind
 * of device, checked, naming the box that differs): MPI rails over host
 * memory, and on GPUs (cuda) NCCL rails over device memory as well, unless
 * rails is FSO_RAILS_MPI or, with FSO_RAILS_AUTO, one GPU serves two boxes
 * (NCCL refuses two ranks of a communicator on one GPU; FSO_RAILS_NCCL then
 * refuses, naming the GPU and the boxes). Box 0 makes NCCL's ids, and MPI
 * hands them to every box. Box and boxes filled, and the rate they send at
 * timed (fso_boxes_net_gbps). With one box: boxes = 1 and no rails. 0, or
 * negative errno with err. */
int fso_boxes_rails(int devices, bool cuda, fso_rails_kind rails, fso_rails *out, char *err,
                    size_t errlen);
void fso_boxes_rails_free(fso_rails *r);
/* What leaves a box per second over its rails, GB/s, one direction: the
 * all-gather fso_boxes_rails timed on device 0's rail as it made them (the
 * planner's net_gbps for the run's own plan); 0 before, or on one box. */
double fso_boxes_net_gbps(void);

/* Every box holds the same `len` bytes of `what` (a digest of the build,
 * the resolved configuration, the data files): 0, or -EINVAL with err
 * naming what differs, the first box that differs from box 0 and its host. */
int fso_boxes_agree(const char *what, const void *buf, size_t len, char *err, size_t errlen);
/* Across boxes on the main thread, bounded like the rails: sum n doubles
 * into v on every box; broadcast len bytes from box 0; a barrier. `what`
 * names the wait in a timeout's message. 0, or negative errno with err. */
int fso_boxes_sum(const char *what, double *v, int n, char *err, size_t errlen);
int fso_boxes_bcast(const char *what, void *buf, size_t len, char *err, size_t errlen);
int fso_boxes_barrier(const char *what, char *err, size_t errlen);

/* What this box is doing now, carried by its heartbeat: a peer that times
 * out waiting for it says so ("box 1 (host h): no heartbeat for 31 s; last
 * at step 12, reduce-scatter of block 3"). Any thread; cheap. */
void fso_boxes_phase(const char *what, int64_t step, int block);
/* Fail the whole run: print `why` as one line on stderr (NULL: the error
 * was said already), remove this process's NVMe store files, and MPI_Abort
 * with status `code` (every box exits non-zero; a process's GPU work ends
 * with it). A rail's NCCL communicator has aborted itself already when one
 * of its calls failed or timed out (cuda_backend.h). Without MPI:
 * exit(code). */
_Noreturn void fso_boxes_abort(const char *why, int code);

/* The launcher's process count from an environment (envp, as environ): 1
 * without a launcher, 0 for PMIx (MPI will say), the count otherwise; a
 * count above 1 with have_mpi false refuses (-ENOTSUP, err saying how to
 * build fsoff with MPI), as does a count that is not a number (-EINVAL).
 * fso_boxes_init's first step, pure so that it can be tested. */
int fso_boxes_launcher_check(char *const *envp, bool have_mpi, char *err, size_t errlen);

/* 128 bits of buf (two FNV-1a 64 lanes), continued from h (h = {0, 0} to
 * start): telling builds and files apart, not security. */
void fso_boxes_hash(const void *buf, size_t len, uint64_t h[2]);

/* Checks that every box runs the same thing (boxes_check.c); each is a wait
 * across boxes on the main thread, every box calls it, every box gets the
 * same answer. 0 with one box.
 *
 * The same fsoff on every box: a digest of /proc/self/exe and FSO_VERSION;
 * a box with another build is named. */
int fso_boxes_check_build(char *err, size_t errlen);
/* The same bytes of `what` (a resolved configuration's text, a digest):
 * the first box that differs is named, and when the bytes are text short
 * enough to exchange (64 KiB), the first line that differs. */
int fso_boxes_check_bytes(const char *what, const void *buf, size_t len, char *err,
                          size_t errlen);
/* The same file at `path` (`what` names it: "data.train"): its size and a
 * hash (the whole file up to 64 MiB; else its first and last 16 MiB, its
 * size and mtime). A box that cannot read it is named with the reason. */
int fso_boxes_check_file(const char *what, const char *path, char *err, size_t errlen);
/* dir is one folder every box sees (checkpoints): box 0 writes a token file
 * there, every box reads it back, box 0 removes it. A box that does not see
 * it is named. */
int fso_boxes_check_shared_dir(const char *dir, char *err, size_t errlen);

#endif
