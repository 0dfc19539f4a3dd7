/* sqnorm_speed.c — how fast the CPU backend's sum of squares
 * (fso_host_sqnorm, kernels/backend.h) reads host memory: GB/s of fp32
 * input over --elems floats, best of --reps, for each thread count given,
 * with the result's bits, which must not depend on the thread count.
 *
 *   sqnorm_speed [--elems N] [--reps R] [THREADS...]     (default 256M, 5, 1 2)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "pool.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    size_t n = (size_t)256 << 20;
    int reps = 5, nthr = 0, thr[16];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--elems") && i + 1 < argc)
            n = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (nthr < 16 && atoi(argv[i]) > 0)
            thr[nthr++] = atoi(argv[i]);
        else {
            fprintf(stderr, "usage: %s [--elems N] [--reps R] [THREADS...]\n", argv[0]);
            return 2;
        }
    }
    if (!nthr) {
        thr[nthr++] = 1;
        thr[nthr++] = 2;
    }
    float *x = malloc(n * sizeof *x);
    if (!x) {
        fprintf(stderr, "sqnorm_speed: %zu floats: out of memory\n", n);
        return 1;
    }
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((int32_t)(s >> 32)) * 0x1p-31f;
    }
    printf("# sqnorm_speed: fso_host_sqnorm over %zu fp32, best of %d\n", n, reps);
    printf("#%8s %10s %10s  %s\n", "threads", "time", "rate", "result");
    printf("#%8s %10s %10s  %s\n", "", "(ms)", "(GB/s)", "");
    double first = 0;
    int ok = 1;
    for (int k = 0; k < nthr; k++) {
        fso_pool *pool = NULL;
        if (fso_pool_create(&pool, thr[k]) != 0)
            return 1;
        double best = 1e30, r = 0;
        for (int rep = 0; rep < reps; rep++) {
            r = 0;
            double t0 = now_s();
            fso_host_sqnorm(pool, &r, x, n);
            double dt = now_s() - t0;
            best = dt < best ? dt : best;
        }
        fso_pool_destroy(pool);
        if (k == 0)
            first = r;
        ok &= r == first;
        printf(" %8d %10.2f %10.2f  %.17g\n", thr[k], best * 1e3, n * 4.0 / best / 1e9, r);
    }
    printf("# result %s across thread counts\n", ok ? "OK (same bits)" : "FAILED (bits differ)");
    free(x);
    return ok ? 0 : 1;
}
