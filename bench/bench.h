/* bench.h — `fsoff bench WHAT`: the offload bandwidth benchmarks.
 *
 * Every benchmark prints an nccl-tests-style table on stdout (a '#' header
 * with units on a second row, one row per measurement, a footer) and takes
 * the same two output options:
 *
 *   --json FILE    also write the results to FILE as one JSON object whose
 *                  "bench" key names the benchmark; FILE "-" writes the
 *                  object to stdout instead of the table
 *   --plot FILE    draw the results into a PNG with gnuplot (plot.h); the
 *                  saved JSON draws the same chart with `fsoff plot`
 *
 * Each returns the process exit status (0, 1 failed, 2 usage, 77 skipped:
 * the hardware is not there). */
#ifndef FSO_BENCH_H
#define FSO_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct json_t; /* jansson */

/* argv[0] is "bench"; argv[1] names the benchmark. */
int fso_bench_main(int argc, char **argv);

int fso_bench_nvme(int argc, char **argv); /* argv[0] = "nvme" */
int fso_bench_tune(int argc, char **argv); /* argv[0] = "tune" (bench_tune.c) */
int fso_bench_adam(int argc, char **argv); /* argv[0] = "adam" */
int fso_bench_pipeline(int argc, char **argv); /* argv[0] = "pipeline" (bench_pipeline.c) */
/* GPUs (bench_gpu.c); 77 where there is none or the build has no CUDA. */
int fso_bench_h2d(int argc, char **argv);       /* argv[0] = "h2d" */
int fso_bench_allgather(int argc, char **argv); /* argv[0] = "allgather" */
/* Between boxes (bench_net.c), under mpirun or srun; 2 with one box. */
int fso_bench_net(int argc, char **argv);       /* argv[0] = "net" */

/* Whether the table goes to stdout: not when --json writes there. */
static inline bool fso_bench_table(const char *json_path)
{
    return !json_path || json_path[0] != '-' || json_path[1] != '\0';
}

/* A usage error of benchmark `me`: one line, "fsoff: error: bench ME: ...;
 * see fsoff bench ME --help". Returns 2 (the exit status). */
int fso_bench_bad(const char *me, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* --nvme DIR[,DIR...]: arg copied into buf and split into dirs (at most
 * FSO_STORE_MAX_DIRS), each checked to be a folder (fso_nvme_folders_split,
 * devices.h). The count, or -2 with the usage error printed. */
int fso_bench_dirs(const char *me, const char *arg, char *buf, size_t buflen, const char **dirs);
/* --plot FILE of benchmark `me`, checked before the benchmark runs: *out =
 * file and 0, or 2 after one error line (a name fsoff does not draw). */
int fso_bench_plot_arg(const char *me, const char *file, const char **out);

/* A comma-separated list of whole numbers from lo to hi (sizes like 128K
 * and multiples of 4 KiB when bytes) into out: the count (1 to max), or -1. */
int fso_bench_list(const char *s, bool bytes, uint64_t lo, uint64_t hi, uint64_t *out, int max);

/* The --json and --plot of benchmark `me`: writes rec to json_path and draws
 * it to plot_path (either may be NULL), and drops rec. 0, or 1 with one error
 * line printed. */
int fso_bench_output(const char *me, struct json_t *rec, const char *json_path,
                     const char *plot_path);

#endif
