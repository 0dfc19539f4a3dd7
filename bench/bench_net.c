/* bench_net.c — `fsoff bench net`: the rails between boxes (engine/boxes.h),
 * measured as the training step uses them, under mpirun or srun.
 *
 *   mpirun -np B [--host a,b,...] fsoff bench net [--sizes LIST] [--iters N]
 *                                                 [--json FILE] [--plot FILE.png]
 *
 * Over device 0's gradient rail, for each size S (total bytes, as
 * nccl-tests counts them): all-reduce of S/8 doubles (the step's norm and
 * loss, here at any size), reduce-scatter of fp32 (S the whole send
 * buffer: the gradient shard) and all-gather of fp32 (S the whole receive
 * buffer: the parameters). Time per call is the mean over boxes of each
 * box's mean over `iters` calls after one untimed call; algbw = S / time,
 * busbw = algbw x 2(B-1)/B for all-reduce and x (B-1)/B for the others
 * (nccl-tests' bus bandwidth: what each box's link carries). Every result is
 * checked after the timed calls (#wrong: elements that differ from the
 * exact sum). Box 0 alone prints and writes files; with one box it says how
 * to start it.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "boxes.h"
#include "util.h"

#define MAX_SIZES 32
#define N_OPS 3

static const char *const op_names[N_OPS] = {"all_reduce", "reduce_scatter", "all_gather"};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np B fsoff bench net [--sizes LIST] [--iters N] [--json FILE]\n"
            "                                    [--plot FILE.png] [--help]\n\n"
            "Times the collectives between boxes over a rail (MPI), as nccl-tests does:\n"
            "all-reduce (doubles), reduce-scatter and all-gather (fp32), one row per size.\n"
            "Run one process per box under mpirun or srun; box 0 prints.\n\n"
            "  --sizes LIST     total bytes per collective, comma-separated, suffixes K, M, G\n"
            "                   (default 1K,4K,16K,...,256M)\n"
            "  --iters N        timed calls per size (default: 256 MiB / size, 3 to 50)\n"
            "  --json FILE      also write the results as one JSON object (\"-\": to stdout\n"
            "                   instead of the table)\n"
            "  --plot FILE.png  draw bus bandwidth against size, a line per collective\n");
}

/* One call of collective op (0 all-reduce of d, 1 reduce-scatter of f
 * into out, 2 all-gather of f) of n elements a box. */
static int call_op(fso_coll *c, int op, int me, double *d, float *f, float *out, size_t n)
{
    if (op == 0)
        return c->ops->all_reduce_f64(c, me, d, n);
    if (op == 1)
        return c->ops->reduce_scatter(c, me, f, out, n);
    return c->ops->all_gather(c, me, f + (size_t)me * n, f, n, FSO_DT_F32, 0);
}

/* One collective at one size on this box: seconds per call, and how many
 * elements of a checked call were wrong. */
static int run_one(fso_coll *c, int op, uint64_t bytes, int iters, double *secs, size_t *wrong,
                   char *err, size_t errlen)
{
    const int B = c->world, me = fso_boxes_self();
    size_t n; /* elements: per box slice (rs, ag) or the whole vector (ar) */
    if (op == 0)
        n = bytes / sizeof(double);
    else
        n = bytes / sizeof(float) / (size_t)B;
    if (n == 0)
        n = 1;
    size_t total = op == 0 ? n : n * (size_t)B;
    void *buf = malloc(total * (op == 0 ? sizeof(double) : sizeof(float)));
    float *out = op == 1 ? malloc(n * sizeof(float)) : NULL;
    if (!buf || (op == 1 && !out)) {
        free(buf);
        free(out);
        snprintf(err, errlen, "out of host memory for %llu bytes", (unsigned long long)bytes);
        return -ENOMEM;
    }
    double *d = buf;
    float *f = buf;
    /* box k holds k + 1 everywhere: sums are exact */
    for (size_t i = 0; i < total; i++) {
        if (op == 0)
            d[i] = me + 1;
        else
            f[i] = (float)(me + 1);
    }
    int rc = 0;
    double t0 = 0;
    for (int it = -1; it <= iters && !rc; it++) {
        if (it == 0) {
            rc = c->ops->barrier(c, me);
            t0 = fso_now_ms();
        }
        if (it == iters || rc)
            break;
        rc = call_op(c, op, me, d, f, out, n);
    }
    double t = (fso_now_ms() - t0) / 1e3 / iters;
    /* one more call, checked */
    for (size_t i = 0; i < total && !rc; i++) {
        if (op == 0)
            d[i] = me + 1;
        else
            f[i] = (float)(me + 1);
    }
    if (!rc)
        rc = call_op(c, op, me, d, f, out, n);
    size_t bad = 0;
    const double sum = (double)B * (B + 1) / 2;
    for (size_t i = 0; i < n && !rc && op == 0; i++)
        bad += d[i] != sum;
    for (size_t i = 0; i < n && !rc && op == 1; i++)
        bad += out[i] != (float)sum;
    for (size_t i = 0; i < total && !rc && op == 2; i++)
        bad += f[i] != (float)(i / n + 1);
    if (rc)
        snprintf(err, errlen, "%s of %llu bytes: %.440s", op_names[op], (unsigned long long)bytes,
                 c->err[0] ? c->err : strerror(-rc));
    free(buf);
    free(out);
    /* the mean over boxes, and every box's wrong elements */
    double v[2] = {t, (double)bad};
    if (!rc)
        rc = c->ops->all_reduce_f64(c, me, v, 2);
    if (rc && !err[0])
        snprintf(err, errlen, "%s", c->err);
    *secs = v[0] / B;
    *wrong = (size_t)v[1];
    return rc;
}

static int parse_sizes(const char *s, uint64_t *out, int max)
{
    char buf[512];
    int n = 0;
    if (strlen(s) >= sizeof buf)
        return -1;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        uint64_t v = 0;
        if (fso_parse_size(t, &v) < 0 || v < 8 || v > (4ull << 30) || n == max)
            return -1;
        out[n++] = v;
    }
    return n > 0 ? n : -1;
}

int fso_bench_net(int argc, char **argv)
{
    static const struct option opts[] = {{"sizes", required_argument, NULL, 's'},
                                         {"iters", required_argument, NULL, 'i'},
                                         {"json", required_argument, NULL, 'j'},
                                         {"plot", required_argument, NULL, 'p'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    uint64_t sizes[MAX_SIZES];
    int nsizes = 0, iters = 0;
    for (uint64_t s = 1024; s <= (256ull << 20); s *= 4)
        sizes[nsizes++] = s;
    const char *json = NULL, *plot = NULL;
    int o;
    optind = 1;
    opterr = 0;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 's':
            if ((nsizes = parse_sizes(optarg, sizes, MAX_SIZES)) < 0)
                return fso_bench_bad("net", "--sizes %s: expected up to %d sizes from 8 to 4G, "
                                     "like 4K,1M", optarg, MAX_SIZES);
            break;
        case 'i': {
            char *end = NULL;
            long v = strtol(optarg, &end, 10);
            if (end == optarg || *end || v < 1 || v > 100000)
                return fso_bench_bad("net", "--iters %s: expected 1 to 100000", optarg);
            iters = (int)v;
            break;
        }
        case 'j':
            json = optarg;
            break;
        case 'p':
            if (fso_bench_plot_arg("net", optarg, &plot))
                return 2;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            return fso_bench_bad("net", "%s: unknown option", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return fso_bench_bad("net", "unexpected argument \"%s\"", argv[optind]);
    if (fso_boxes_count() < 2) {
        fprintf(stderr, "fsoff: error: bench net: measures the rails between boxes, and this "
                "is one box; start one fsoff per box under mpirun or srun: mpirun -np 2 --host "
                "a,b fsoff bench net\n");
        return 2;
    }
    char err[512] = "";
    fso_rails r;
    if (fso_boxes_rails(1, false, FSO_RAILS_AUTO, &r, err, sizeof err) != 0) {
        fprintf(stderr, "fsoff: error: bench net: %s\n", err);
        return 1;
    }
    const int B = r.boxes, me = r.box;
    fso_coll *c = r.grad[0];
    double secs[N_OPS][MAX_SIZES];
    size_t wrong[N_OPS][MAX_SIZES];
    int rc = 0;
    for (int si = 0; si < nsizes && !rc; si++)
        for (int op = 0; op < N_OPS && !rc; op++) {
            int n = iters;
            if (!n) {
                uint64_t k = (256ull << 20) / sizes[si];
                n = k < 3 ? 3 : k > 50 ? 50 : (int)k;
            }
            fso_boxes_phase(op_names[op], -1, -1);
            rc = run_one(c, op, sizes[si], n, &secs[op][si], &wrong[op][si], err, sizeof err);
        }
    fso_boxes_rails_free(&r);
    if (rc) {
        fprintf(stderr, "fsoff: error: bench net: box %d: %s\n", me, err);
        return 1;
    }
    if (me != 0)
        return 0;
    const double bus[N_OPS] = {2.0 * (B - 1) / B, (double)(B - 1) / B, (double)(B - 1) / B};
    const bool table = fso_bench_table(json);
    size_t bad = 0;
    double sum = 0;
    if (table) {
        printf("# rails: %d boxes over MPI (", B);
        for (int k = 0; k < B; k++)
            printf("%s%s", k ? ", " : "", fso_boxes_host(k));
        printf("); size = total bytes (all-reduce: doubles; others: fp32)\n");
        printf("# %12s %-15s %10s %10s %10s %8s\n", "size", "op", "time", "algbw", "busbw",
               "#wrong");
        printf("# %12s %-15s %10s %10s %10s %8s\n", "(B)", "", "(us)", "(GB/s)", "(GB/s)", "");
    }
    json_t *colls = json_object();
    for (int op = 0; op < N_OPS; op++) {
        json_t *arr = json_array();
        for (int si = 0; si < nsizes; si++) {
            double t = secs[op][si], alg = (double)sizes[si] / t / 1e9;
            if (table)
                printf("  %12llu %-15s %10.1f %10.3f %10.3f %8zu\n",
                       (unsigned long long)sizes[si], op_names[op], t * 1e6, alg, alg * bus[op],
                       wrong[op][si]);
            sum += alg * bus[op];
            bad += wrong[op][si];
            json_array_append_new(arr, json_pack("{s:I, s:f, s:f, s:f, s:I}", "bytes",
                                                 (json_int_t)sizes[si], "time_us", t * 1e6,
                                                 "algbw_gbps", alg, "busbw_gbps", alg * bus[op],
                                                 "wrong", (json_int_t)wrong[op][si]));
        }
        json_object_set_new(colls, op_names[op], arr);
    }
    if (table)
        printf("# average bus bandwidth: %.3f GB/s  %s\n", sum / (N_OPS * nsizes),
               bad ? "FAILED" : "OK");
    int out = bad ? 1 : 0;
    if (json || plot) {
        json_t *hosts = json_array();
        for (int k = 0; k < B; k++)
            json_array_append_new(hosts, json_string(fso_boxes_host(k)));
        json_t *rec = json_pack("{s:s, s:s, s:i, s:o, s:o}", "bench", "net", "transport", "mpi",
                                "boxes", B, "hosts", hosts, "collectives", colls);
        if (fso_bench_output("net", rec, json, plot))
            out = 1;
    } else {
        json_decref(colls);
    }
    return out;
}
