/* bench.c — `fsoff bench WHAT` dispatch and the output options every
 * benchmark shares (bench.h). */
#include "bench.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices.h"
#include "plot.h"
#include "util.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *what;
} benches[] = {
    {"nvme", fso_bench_nvme, "sequential read/write GB/s of the NVMe store over request sizes and queue depths"},
    {"adam", fso_bench_adam, "fused CPU AdamW elements/s and GB/s against measured memory bandwidth"},
    {"h2d", fso_bench_h2d, "host<->device GB/s on the GPUs, pinned and pageable, each direction and both"},
    {"allgather", fso_bench_allgather, "NCCL all-gather and reduce-scatter bus bandwidth across the GPUs"},
    {"net", fso_bench_net, "all-reduce, reduce-scatter and all-gather bus bandwidth between boxes, under mpirun"},
    {"tune", fso_bench_tune, "the NVMe store's best request size, queue depth and rings; the aio section"},
    {"pipeline", fso_bench_pipeline, "one configuration's offload data path, compute replaced by the plan's waits, against the store's own rates"},
};

static void bench_usage(FILE *f)
{
    fprintf(f, "usage: fsoff bench WHAT [options]   (fsoff bench WHAT --help for its options)\n\n");
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        fprintf(f, "  %-9s %s\n", benches[i].name, benches[i].what);
    fprintf(f, "\nEvery benchmark prints a table and takes --json FILE (one JSON object;\n"
               "\"-\" for stdout instead of the table) and --plot FILE.png (a chart, drawn by\n"
               "gnuplot).\n");
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

int fso_bench_output(const char *me, json_t *rec, const char *json_path, const char *plot_path)
{
    int status = 0;
    if (!rec) {
        fprintf(stderr, "fsoff: error: bench %s: out of memory for the results\n", me);
        return 1;
    }
    if (json_path) {
        bool out = !fso_bench_table(json_path);
        FILE *f = out ? stdout : fopen(json_path, "w");
        bool bad = !f;
        if (f) {
            bad = json_dumpf(rec, f, JSON_INDENT(1) | JSON_REAL_PRECISION(6)) != 0 ||
                  fputc('\n', f) == EOF;
            bad = (out ? fflush(f) : fclose(f)) != 0 || bad;
        }
        if (bad) {
            fprintf(stderr, "fsoff: error: bench %s: --json %s: %s\n", me, json_path,
                    strerror(errno ? errno : EIO));
            status = 1;
        }
    }
    if (plot_path) {
        char err[4200];
        if (fso_plot_bench(rec, plot_path, 0, 0, err, sizeof err) < 0) {
            fprintf(stderr, "fsoff: error: bench %s: --plot: %s\n", me, err);
            status = 1;
        } else if (fso_bench_table(json_path)) {
            printf("# chart: %s\n", plot_path);
        }
    }
    json_decref(rec);
    return status;
}

int fso_bench_bad(const char *me, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "fsoff: error: bench %s: ", me);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "; see fsoff bench %s --help\n", me);
    return 2;
}

int fso_bench_dirs(const char *me, const char *arg, char *buf, size_t buflen, const char **dirs)
{
    char why[1024];
    int n = fso_nvme_folders_split("--nvme", arg, true, buf, buflen, dirs, why, sizeof why);
    if (n < 0) {
        fso_bench_bad(me, "%s", why);
        return -2;
    }
    return n;
}

int fso_bench_plot_arg(const char *me, const char *file, const char **out)
{
    char why[1200];
    if (fso_plot_check_name(file, why, sizeof why) < 0)
        return fso_bench_bad(me, "--plot %s", why);
    *out = file;
    return 0;
}

int fso_bench_list(const char *s, bool bytes, uint64_t lo, uint64_t hi, uint64_t *out, int max)
{
    char buf[256];
    int n = 0;
    if (strlen(s) >= sizeof buf)
        return -1;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        uint64_t v = 0;
        char *end = NULL;
        if (bytes ? fso_parse_size(t, &v) < 0 : ((v = strtoull(t, &end, 10)), *end != '\0'))
            return -1;
        if (v < lo || v > hi || (bytes && v % FSO_IO_PAGE) || n == max)
            return -1;
        out[n++] = v;
    }
    return n > 0 ? n : -1;
}
