/* probe.h — short measurements of what this machine moves and computes per
 * second, for the planner (planner.h), and their cache.
 *
 * Each probe runs in a second or less (the NVMe's cost to the cores in two
 * or three):
 *   nvme        sequential write then read of 256 MiB per folder through the
 *               io_uring store (O_DIRECT where the filesystem allows), and of
 *               all folders striped together: rate with 16 requests in flight
 *               (writes twice: as they complete, the burst a step's writes
 *               see, and until flushed, the rate the drive drains them at),
 *               and the latency of a request alone; and what the transfers
 *               cost the cores: sgemm on all threads alone and while 1 GiB is
 *               written (and flushed) and read back, the compute lost per GB
 *               (the kernel's work and, on a virtual disk, the host's)
 *   h2d, d2h    the backend's host-to-device and device-to-host copies (on
 *               the CPU backend: memcpy on one thread)
 *   host copy   memcpy on one thread (staging copies, accumulation)
 *   collectives all-gather among threads (the CPU devices' collectives):
 *               bus bandwidth as nccl-tests reports it
 *   adam        the widest fused AdamW kernel over all cores
 *   compute     sgemm of a transformer-block-like shape through the backend
 *
 * The results are cached in one JSON file, $XDG_CACHE_HOME/fsoff/probe.json
 * (else ~/.cache/fsoff/probe.json), keyed by what each measures: the
 * machine's figures (copies, compute, collectives, AdamW) once per host
 * name and CPU model, the NVMe figures once per host, CPU model and set of
 * folders. A later run reuses what the cache has and measures only what it
 * lacks (a new folder: the folder alone).
 *
 * `fsoff bench tune` sweeps the store's request size, queue depth and rings
 * over a set of folders and records what it found in the same file, under
 * "tuned", one entry per host, CPU model and set of folders (the NVMe
 * entries' key). fso_probe_get takes the NVMe rates and latencies from that
 * entry when there is one (they are the rates at the aio settings tune
 * recommends, measured more thoroughly than the probe's one point), so the
 * planner plans with the tuned figures. NVMe and tuned entries for this
 * host's folders that no longer exist are dropped whenever the cache is
 * written.
 */
#ifndef FSO_PROBE_H
#define FSO_PROBE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"

typedef struct fso_probe_dir {
    char path[1024];
    double read_gbps, write_gbps; /* write: until flushed (the rate the drive drains at) */
    double write_burst_gbps;     /* the same writes as they complete, unflushed */
    double read_lat_ms, write_lat_ms; /* one 1 MiB request alone, beyond its transfer time */
    uint64_t free_bytes;
    bool direct;                 /* O_DIRECT held (false: buffered fallback, page cache) */
} fso_probe_dir;

typedef struct fso_probe {
    char key[2048];              /* host|cpu model|folders; the machine's part: host|cpu model */
    int64_t when;                /* seconds since the epoch */
    int threads;                 /* the cores the probes used */
    uint64_t host_mem_bytes;     /* MemAvailable when probed */
    int n_dirs;
    fso_probe_dir dirs[FSO_STORE_MAX_DIRS];
    double nvme_read_gbps, nvme_write_gbps; /* all folders striped; 0 with no folders;
                                               write: until flushed */
    double nvme_write_burst_gbps; /* the writes as they complete (probe_store) */
    double nvme_read_cpu_s_per_gb;  /* the compute the cores lose per GB read (all threads, */
    double nvme_write_cpu_s_per_gb; /* seconds) and per GB written and drained (probe_io_cost) */
    bool nvme_cpu_known;          /* the two above were measured (an older cache lacks them) */
    double nvme_read_lat_ms, nvme_write_lat_ms;
    uint64_t nvme_free_bytes;
    double h2d_gbps, d2h_gbps;
    double host_copy_gbps;
    double coll_gbps;            /* all-gather bus bandwidth among `threads` threads */
    double adam_gelems;          /* 1e9 elements/s, all threads, with adam_isa's kernel */
    char adam_isa[16];           /* the instruction set AdamW ran with (cpu_isa.h): FSO_ISA's,
                                    else the widest; a cached rate of another is measured
                                    again, alone */
    double gflops;               /* sgemm, all threads */
    bool nvme_tuned;             /* the nvme_* rates above come from `fsoff bench tune` */
    int nvme_tuned_devices;      /* ... measured with this many rings (devices) at once */
} fso_probe;

/* What `fsoff bench tune` found for one set of folders. */
typedef struct fso_probe_tuned {
    char key[2048];              /* fso_probe_key of the folders */
    int64_t when;                /* seconds since the epoch */
    int devices;                 /* rings (one per device) the figures are for */
    uint64_t block_bytes;        /* the recommended aio.block_size */
    int queue_depth;             /* the recommended aio.queue_depth */
    double read_gbps, write_gbps; /* all rings together, at those settings */
    double read_lat_ms, write_lat_ms; /* one request alone, beyond its transfer time */
} fso_probe_tuned;

/* One layer of a model timed on this machine's CPU (engine/plan.c,
 * fso_plan_calibrate_cpu): the layer's rate and the embedding's and head's
 * times, per what was timed. */
typedef struct fso_probe_layer {
    char key[2048];              /* "host|cpu|" and what was timed (fso_plan_calibrate_cpu) */
    int64_t when;                /* seconds since the epoch */
    double gflops;               /* the layer's forward and backward, GFLOP/s */
    double embed_fwd_ms, head_ms, embed_bwd_ms; /* per micro-batch */
} fso_probe_layer;

typedef struct fso_probe_opts {
    const char *dirs;            /* NVMe folders, comma-separated; NULL or "" for none */
    int threads;                 /* 0: the CPUs this process may use */
    uint64_t nvme_bytes;         /* per folder; 0: 256 MiB */
    bool quiet;                  /* no progress line on stderr */
} fso_probe_opts;

/* The machine key for these folders. */
void fso_probe_key(char *buf, size_t len, const char *dirs);

/* The cache file's path ($XDG_CACHE_HOME/fsoff/probe.json, else
 * $HOME/.cache/fsoff/probe.json). 0, or -ENOENT when neither is set. */
int fso_probe_cache_path(char *buf, size_t len);

/* The figures for `key` in the cache file at path, the machine's and the
 * folders': 0, -ENOENT when there is no file (or one an older fsoff wrote)
 * or either part is missing, -EINVAL for a file that is not a probe cache
 * or an entry that is incomplete or out of range (message in err). */
int fso_probe_cache_load(const char *path, const char *key, fso_probe *p, char *err,
                         size_t errlen);
/* Add or replace p's entries (the machine's by host|cpu, the folders' by
 * the whole key), dropping this host's entries for folders that no longer
 * exist; the folder is created, the file written to a temporary file and
 * renamed, so readers never see half a file. */
int fso_probe_cache_save(const char *path, const fso_probe *p, char *err, size_t errlen);

/* Add or replace t's entry (by key) under "tuned" in the cache file at
 * path, creating it if need be; the machine and NVMe entries stay, this
 * host's entries for folders that no longer exist go. 0 or -errno. */
int fso_probe_tuned_save(const char *path, const fso_probe_tuned *t, char *err, size_t errlen);
/* The tuned entry for `key`: 0, -ENOENT when there is none (or no file, or
 * one an older fsoff wrote), -EINVAL for a file that is not a probe cache
 * or an entry out of range (message in err). */
int fso_probe_tuned_load(const char *path, const char *key, fso_probe_tuned *t, char *err,
                         size_t errlen);

/* Add or replace l's entry (by key) under "layers" in the cache file at
 * path, as fso_probe_tuned_save does. 0 or -errno. */
int fso_probe_layer_save(const char *path, const fso_probe_layer *l, char *err, size_t errlen);
/* The layer entry for `key`: 0, -ENOENT when there is none (or no file, or
 * one an older fsoff wrote), -EINVAL for a file that is not a probe cache
 * or an entry out of range (message in err). */
int fso_probe_layer_load(const char *path, const char *key, fso_probe_layer *l, char *err,
                         size_t errlen);

/* The cached figures for this machine and these folders; what the cache
 * lacks is measured (a new folder alone, when the machine is known) and
 * saved; refresh measures everything. *probed tells whether anything was
 * measured. Either way, a tuned entry for the same folders replaces the
 * NVMe rates and latencies (nvme_tuned set). 0, or negative errno with a
 * message (a folder that cannot be written names the folder and the fix). */
int fso_probe_get(fso_probe *p, const fso_probe_opts *opts, bool refresh, bool *probed,
                  char *err, size_t errlen);

#endif
