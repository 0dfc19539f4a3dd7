/* tune_sweep.h — the measurements behind `fsoff bench tune` (bench_tune.c):
 * the NVMe store's read and write rates over request size x queue depth x
 * rings, each a median of noisy samples.
 *
 * The stores. Per ring and request size, one store (offload/store_uring.c)
 * over the folders, with that size as its stripe unit (as aio.block_size is
 * in training), all open for the whole sweep and each written whole before
 * timing starts: every timed write then overwrites data, as training's
 * writes do, and no read is served from unwritten extents. A ring is what
 * each training device has (fsoff runs one store per device), so the ring
 * count is the number of devices sharing the folders.
 *
 * A point (request size, queue depth, rings; read or write): every ring runs
 * on its own thread with its own registered buffers and keeps qd requests
 * in flight over its region (wrapping around); once a queue's worth has
 * completed, the bytes completed in the next `seconds` give its rate, and
 * the point's rate is the sum over the rings.
 *
 * The passes. The first visits every point. Shared disks stall and burst,
 * so the contenders (points within FSO_TUNE_CONTEND of their ring count's
 * best read, write or read-plus-write rate) are measured twice more, in
 * other orders, as long as the time budget lasts; every rate reported is
 * the median of a point's samples.
 */
#ifndef FSO_TUNE_SWEEP_H
#define FSO_TUNE_SWEEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FSO_TUNE_MAX_LIST 16
#define FSO_TUNE_MAX_RINGS 16
#define FSO_TUNE_MAX_QD 32      /* aio.queue_depth's limit */
#define FSO_TUNE_SAMPLES 3      /* the first pass and two over the contenders */
#define FSO_TUNE_CONTEND 0.75   /* a contender reaches this fraction of the best */

typedef enum fso_tune_rank {
    FSO_TUNE_READ,              /* read GB/s */
    FSO_TUNE_WRITE,             /* write GB/s */
    FSO_TUNE_BOTH,              /* 1 / (seconds to read and write one GB) */
} fso_tune_rank;

typedef struct fso_tune_point {
    int bi;                     /* index of block in the sweep's list */
    size_t block;
    int qd, rings;
    double gbps[2][FSO_TUNE_SAMPLES]; /* [write][sample] */
    int n[2];
} fso_tune_point;

typedef struct fso_tune_sweep {
    /* in */
    const char *const *dirs;
    int ndirs;
    const size_t *blocks;       /* the request sizes, each a multiple of 4 KiB */
    int nblocks;
    int max_rings;
    uint64_t region_bytes;      /* per ring and size; >= block x qd of every point */
    double seconds;             /* per point */
    double budget_s;            /* no more contender samples after this long; 0: none */
    fso_tune_point *pts;        /* the points to measure (bi, block, qd, rings set) */
    int npts;
    /* out */
    bool direct;                /* O_DIRECT held on every store */
    bool registered;            /* registered buffers on every store */
    bool over_budget;           /* some contenders have fewer samples */
} fso_tune_sweep;

/* Measures every point (samples into pts). 0, or 1 with one error line
 * printed (a store that cannot be created or fails). */
int fso_tune_run(fso_tune_sweep *sw);

/* Point p's write rate to the drive itself: each of its rings writes its
 * region once untimed and flushes it (what earlier writes left in a cache
 * goes too), then writes it once more at p's request size and depth, timed
 * until the store is flushed (store.h flush), the rings together. What the
 * planner takes as the write rate: the sweep's rates include what a cache in
 * front of the drive absorbs. GB/s, or 0 with one error line printed. */
double fso_tune_flushed_write(const fso_tune_sweep *sw, const fso_tune_point *p);

/* A point's median rate for write (1) or read (0), 0 with no samples. */
double fso_tune_rate(const fso_tune_point *p, int write);
/* Its score under a ranking: higher is better. */
double fso_tune_score(const fso_tune_point *p, fso_tune_rank k);

#endif
