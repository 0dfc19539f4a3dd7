/* placeholder until the nvme benchmark lands */
#include <stdio.h>
#include "bench.h"
int fso_bench_nvme(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "fsoff: error: bench nvme: not built\n"); return 1; }
