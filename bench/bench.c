/* bench.c — `fsoff bench WHAT` dispatch. */
#include "bench.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *what;
} benches[] = {
    {"nvme", fso_bench_nvme, "sequential read/write GB/s of the NVMe store over block sizes and queue depths"},
    {"adam", fso_bench_adam, "fused CPU AdamW elements/s and GB/s against measured memory bandwidth"},
    {"h2d", fso_bench_h2d, "host<->device GB/s on the GPUs, pinned and pageable, each direction and both"},
    {"allgather", fso_bench_allgather, "NCCL all-gather and reduce-scatter bus bandwidth across the GPUs"},
};

static void bench_usage(FILE *f)
{
    fprintf(f, "usage: fsoff bench WHAT [options]   (fsoff bench WHAT --help for its options)\n\n");
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        fprintf(f, "  %-9s %s\n", benches[i].name, benches[i].what);
}

int fso_bench_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        bench_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (strcmp(argv[1], benches[i].name) == 0)
            return benches[i].run(argc - 1, argv + 1);
    fprintf(stderr, "fsoff: error: bench %s: unknown benchmark; choose one of:", argv[1]);
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        fprintf(stderr, " %s", benches[i].name);
    fprintf(stderr, "\n");
    return 2;
}
