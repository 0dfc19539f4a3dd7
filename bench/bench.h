/* bench.h — `fsoff bench WHAT`: the offload bandwidth benchmarks.
 *
 * Each benchmark prints an nccl-tests-style table (a '#' header with units
 * on a second row, one row per size, a footer) or, with --json, one JSON
 * object. Each returns the process exit status (0, 1 failed, 2 usage, 77
 * skipped: the hardware is not there). */
#ifndef FSO_BENCH_H
#define FSO_BENCH_H

/* argv[0] is "bench"; argv[1] names the benchmark. */
int fso_bench_main(int argc, char **argv);

int fso_bench_nvme(int argc, char **argv); /* argv[0] = "nvme" */
int fso_bench_adam(int argc, char **argv); /* argv[0] = "adam" */
/* GPUs (bench_gpu.c); 77 where there is none or the build has no CUDA. */
int fso_bench_h2d(int argc, char **argv);       /* argv[0] = "h2d" */
int fso_bench_allgather(int argc, char **argv); /* argv[0] = "allgather" */

#endif
