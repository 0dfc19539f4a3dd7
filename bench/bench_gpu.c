/* bench_gpu.c — `fsoff bench h2d` and `fsoff bench allgather`: what the
 * offload tiers can move on this box's GPUs.
 *
 *   fsoff bench h2d [--bytes SIZE] [--seconds S] [--json FILE] [--plot FILE.png]
 *       host<->device GB/s from pinned and from pageable memory, each
 *       direction and both at once, on device 0 and on all devices at once
 *   fsoff bench allgather [--seconds S] [--json FILE] [--plot FILE.png]
 *       NCCL all-gather and reduce-scatter bus bandwidth across all GPUs,
 *       1 MiB to 512 MiB, each result checked
 *
 * Copies use the CUDA runtime directly on two streams, so "both" is what
 * the hardware does with both directions busy; that part is
 * kernels/cuda/cuda_copy_rates.c, built into the CUDA module (cuda_module.h) and
 * called through its table.
 * Pinned memory is registered the way the engine does it
 * (fso_cuda_host_register over an mmap'd range).
 * Collectives go through fso_coll_create_nccl and the CUDA backend, one host
 * thread per GPU, as in training; bus bandwidth is nccl-tests' definition:
 * algbw = bytes / time with bytes the larger buffer, busbw = algbw (n-1)/n.
 * --json and --plot as every benchmark (bench.h); plot_bench.c draws the
 * JSON these write.
 * Exit status: 0 measured, 1 failed, 2 bad arguments, 77 no CUDA device (or
 * a build without CUDA). bench/gpu_check.sh runs both.
 */
#include "bench.h"
#include "fso_build.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_backend.h"
#include "util.h"

static int parse_size(const char *s, size_t *out)
{
    uint64_t v;
    if (fso_parse_size(s, &v) < 0 || v == 0)
        return -EINVAL;
    *out = (size_t)v;
    return 0;
}

static void usage(FILE *f, bool h2d)
{
    if (h2d)
        fprintf(f, "usage: fsoff bench h2d [--bytes SIZE] [--seconds S] [--json FILE]\n"
                   "                       [--plot FILE.png]\n"
                   "  host<->device GB/s, pinned and pageable, each direction and both\n"
                   "  --bytes SIZE   bytes per copy (default 256M)\n");
    else
        fprintf(f, "usage: fsoff bench allgather [--seconds S] [--json FILE] [--plot FILE.png]\n"
                   "  NCCL all-gather and reduce-scatter bus bandwidth across all GPUs\n");
    fprintf(f, "  --seconds S      time per measurement (default 0.4)\n"
               "  --json FILE      also write the results as one JSON object (\"-\": to stdout\n"
               "                   instead of the table)\n"
               "  --plot FILE.png  draw %s\n", h2d ? "GB/s per direction, pinned and pageable"
                                                    : "bus bandwidth against size");
}

static int parse_args(int argc, char **argv, bool h2d, size_t *bytes, double *seconds,
                      const char **json, const char **plot)
{
    static const struct option opts[] = {{"bytes", required_argument, NULL, 'b'},
                                         {"seconds", required_argument, NULL, 's'},
                                         {"json", required_argument, NULL, 'j'},
                                         {"plot", required_argument, NULL, 'p'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *me = h2d ? "h2d" : "allgather";
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'b':
            if (!h2d) {
                fprintf(stderr, "fsoff: error: bench allgather: --bytes: not an option here "
                                "(the sizes are fixed: 1M to 512M)\n");
                return 2;
            }
            if (parse_size(optarg, bytes) < 0) {
                fprintf(stderr, "fsoff: error: bench h2d: --bytes %s: expected a size like "
                                "256M\n", optarg);
                return 2;
            }
            break;
        case 's':
            *seconds = atof(optarg);
            if (*seconds <= 0 || *seconds > 60) {
                fprintf(stderr, "fsoff: error: bench %s: --seconds %s: expected 0 < S <= 60\n",
                        me, optarg);
                return 2;
            }
            break;
        case 'j':
            *json = optarg;
            break;
        case 'p':
            if (fso_bench_plot_arg(me, optarg, plot))
                return 2;
            break;
        case 'h':
            usage(stdout, h2d);
            return 0;
        default:
            usage(stderr, h2d);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "fsoff: error: bench %s: unexpected argument \"%s\"\n", me, argv[optind]);
        return 2;
    }
    return -1; /* go on */
}

#if FSO_HAVE_CUDA
#include "backend.h"
#include "coll.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_module.h"

#define MAX_DEV 16

#define N_DIRS FSO_CUDA_COPY_DIRS
static const char *const dir_names[N_DIRS] = {"h2d", "d2h", "both"}; /* FSO_CUDA_COPY_* */

/* ---------------------------------------------------------------- collectives */

#define N_SIZES 5
static const size_t coll_sizes[N_SIZES] = {(size_t)1 << 20, (size_t)8 << 20, (size_t)32 << 20,
                                           (size_t)128 << 20, (size_t)512 << 20};

struct coll_shared {
    fso_coll *coll;
    fso_backend *be[MAX_DEV];
    int world;
    double seconds;
    size_t max_bytes;
    double time_ms[2][N_SIZES]; /* [all_gather, reduce_scatter][size], rank 0's */
    size_t errors[2][N_SIZES];  /* wrong elements, all ranks */
    int rc[MAX_DEV];
};

struct coll_rank {
    struct coll_shared *sh;
    int rank;
};

/* One op, `iters` times, timed on this rank between two barriers. */
static double coll_round(struct coll_shared *sh, int rank, int op, float *big, float *small,
                         size_t count, int iters, int *rc)
{
    fso_coll *c = sh->coll;
    fso_backend *be = sh->be[rank];
    c->ops->barrier(c, rank);
    double t0 = (fso_now_ms() / 1e3);
    for (int i = 0; i < iters; i++) {
        int r = op == 0 ? c->ops->all_gather(c, rank, small, big, count, FSO_DT_F32, 0)
                        : c->ops->reduce_scatter(c, rank, big, small, count);
        if (r < 0 && *rc == 0)
            *rc = r;
    }
    int r = be->ops->sync(be);
    if (r < 0 && *rc == 0)
        *rc = r;
    c->ops->barrier(c, rank);
    return (fso_now_ms() / 1e3) - t0;
}

/* Inputs with known sums: all-gather sends rank + 1, reduce-scatter sends
 * 1.0 everywhere. Returns the wrong elements after the op ran. */
static size_t coll_fill(fso_backend *be, int op, int rank, int W, float *big, float *small,
                        float *host, size_t count)
{
    const size_t n = op == 0 ? count : count * (size_t)W;
    for (size_t i = 0; i < n; i++)
        host[i] = op == 0 ? (float)(rank + 1) : 1.0f;
    be->ops->copy_h2d(be, op == 0 ? small : big, host, sizeof(float) * n);
    return be->ops->sync(be) < 0 ? n : 0;
}

static size_t coll_verify(fso_backend *be, int op, int W, const float *big, const float *small,
                          float *host, size_t count)
{
    const size_t n = op == 0 ? count * (size_t)W : count;
    size_t bad = 0;
    be->ops->copy_d2h(be, host, op == 0 ? big : small, sizeof(float) * n);
    if (be->ops->sync(be) < 0)
        return n;
    for (size_t i = 0; i < n; i++)
        if (host[i] != (op == 0 ? (float)(i / count + 1) : (float)W))
            bad++;
    return bad;
}

static void *coll_thread(void *arg)
{
    struct coll_rank *cr = arg;
    struct coll_shared *sh = cr->sh;
    const int rank = cr->rank, W = sh->world;
    fso_backend *be = sh->be[rank];
    void *big = NULL, *small = NULL;
    float *host = malloc(sh->max_bytes);
    int rc = host ? 0 : -ENOMEM;
    if (!host)
        snprintf(be->err, sizeof be->err, "out of host memory");
    if (rc == 0)
        rc = be->ops->buf_alloc(be, sh->max_bytes, &big);
    if (rc == 0)
        rc = be->ops->buf_alloc(be, sh->max_bytes / (size_t)W, &small);
    /* every rank runs the same rounds: all of them or, if any rank could
     * not allocate, none */
    double failed[1] = {rc < 0 ? 1.0 : 0.0};
    sh->coll->ops->all_reduce_f64(sh->coll, rank, failed, 1);
    for (int op = 0; op < 2 && failed[0] == 0; op++)
        for (int si = 0; si < N_SIZES; si++) {
            size_t count = coll_sizes[si] / sizeof(float) / (size_t)W;
            if (coll_sizes[si] > sh->max_bytes)
                continue;
            size_t bad = coll_fill(be, op, rank, W, big, small, host, count);
            coll_round(sh, rank, op, big, small, count, 2, &rc); /* warm up */
            double t = coll_round(sh, rank, op, big, small, count, 1, &rc);
            /* the same count on every rank: rank 0 decides, all read it */
            int iters = (int)(sh->seconds / (t > 1e-6 ? t : 1e-6));
            iters = iters < 3 ? 3 : iters > 100 ? 100 : iters;
            double buf[1] = {rank == 0 ? iters : 0};
            sh->coll->ops->all_reduce_f64(sh->coll, rank, buf, 1);
            iters = (int)buf[0];
            t = coll_round(sh, rank, op, big, small, count, iters, &rc);
            bad += coll_verify(be, op, W, big, small, host, count);
            /* wrong elements summed over ranks */
            double nb[1] = {(double)bad};
            sh->coll->ops->all_reduce_f64(sh->coll, rank, nb, 1);
            if (rank == 0) {
                sh->time_ms[op][si] = t * 1e3 / iters;
                sh->errors[op][si] = (size_t)nb[0];
            }
        }
    be->ops->buf_free(be, big);
    be->ops->buf_free(be, small);
    free(host);
    sh->rc[rank] = rc;
    return NULL;
}

static int run_collectives(struct coll_shared *sh, int ndev, double seconds, char *err,
                           size_t errlen)
{
    memset(sh, 0, sizeof *sh);
    sh->world = ndev;
    sh->seconds = seconds;
    sh->max_bytes = coll_sizes[N_SIZES - 1];
    int rc = 0;
    for (int r = 0; r < ndev && rc == 0; r++) {
        fso_gpu_info gi;
        size_t fr = fso_gpu_info_query(r, &gi, err, errlen) == 0 ? gi.mem_free_bytes : 0;
        while (sh->max_bytes > coll_sizes[0] && 3 * sh->max_bytes > fr)
            sh->max_bytes /= 2;
        rc = fso_backend_create_cuda(&sh->be[r], r, 0, err, errlen);
    }
    if (rc == 0)
        rc = fso_coll_create_nccl(&sh->coll, ndev, sh->be, err, errlen);
    if (rc == 0) {
        pthread_t tids[MAX_DEV];
        struct coll_rank cr[MAX_DEV];
        for (int r = 0; r < ndev; r++) {
            cr[r] = (struct coll_rank){sh, r};
            if (pthread_create(&tids[r], NULL, coll_thread, &cr[r]) != 0) {
                fprintf(stderr, "fsoff bench allgather: cannot start thread %d\n", r);
                abort(); /* the others would wait in a collective forever */
            }
        }
        for (int r = 0; r < ndev; r++)
            pthread_join(tids[r], NULL);
        for (int r = 0; r < ndev && rc == 0; r++)
            if (sh->rc[r] < 0) {
                rc = sh->rc[r];
                snprintf(err, errlen, "rank %d: %s", r, sh->be[r]->err);
            }
    }
    fso_coll_destroy(sh->coll);
    for (int r = 0; r < ndev; r++)
        fso_backend_destroy_cuda(sh->be[r]);
    return rc;
}

/* ---------------------------------------------------------------- output */

/* A rate, or null where it was not measured (negative). */
static json_t *rate_json(double v)
{
    return v < 0 ? json_null() : json_real(v);
}

/* Device 0's name and the device count, or 77 (no device) / 1. */
static int gpus_here(const char *me, fso_gpu_info *gi, int *ndev)
{
    char err[512] = "";
    if (fso_cuda_available(err, sizeof err) < 0) {
        printf("fsoff bench %s: skipped: %s\n", me, err);
        return 77;
    }
    *ndev = fso_cuda_device_count(err, sizeof err);
    if (*ndev > MAX_DEV)
        *ndev = MAX_DEV;
    if (fso_gpu_info_query(0, gi, err, sizeof err) < 0) {
        fprintf(stderr, "fsoff: error: bench %s: %s\n", me, err);
        return 1;
    }
    return 0;
}

int fso_bench_h2d(int argc, char **argv)
{
    size_t bytes = (size_t)256 << 20;
    double seconds = 0.4;
    const char *json = NULL, *plot = NULL;
    int rc = parse_args(argc, argv, true, &bytes, &seconds, &json, &plot);
    if (rc >= 0)
        return rc;
    fso_gpu_info gi;
    int ndev = 0;
    if ((rc = gpus_here("h2d", &gi, &ndev)) != 0)
        return rc;

    const fso_cuda_module_api *api;
    char err[512] = "";
    if (fso_cuda_module_load(&api, err, sizeof err) < 0) { /* gpus_here loaded it already */
        fprintf(stderr, "fsoff: error: bench h2d: %s\n", err);
        return 1;
    }
    fso_cuda_copy_report rep;
    memset(&rep, 0, sizeof rep);
    api->copy_rates(&rep, ndev, bytes, seconds);
    if (fso_bench_table(json)) {
        printf("# host<->device copies: device 0 (%s, %s), %zu MiB per copy\n", gi.name,
               gi.pci_bus_id, bytes >> 20);
        printf("# %-10s %-6s %10s\n", "memory", "dir", "GB/s");
        for (int p = 0; p < 2; p++)
            for (int d = 0; d < N_DIRS; d++)
                if (rep.gbps[p][d] >= 0)
                    printf("  %-10s %-6s %10.2f\n", p ? "pageable" : "pinned", dir_names[d],
                           rep.gbps[p][d]);
        if (rep.pin_note[0])
            printf("# pinned: not measured: %s\n", rep.pin_note);
        for (int d = 0; d < N_DIRS; d++)
            if (rep.all_gbps[d] >= 0)
                printf("  %-10s %-6s %10.2f   (all %d devices at once, total)\n", "pinned",
                       dir_names[d], rep.all_gbps[d], ndev);
    }
    if (!json && !plot)
        return 0;
    json_t *copies = json_object(), *all = json_object();
    for (int p = 0; p < 2; p++) {
        json_t *o = json_object();
        for (int d = 0; d < N_DIRS; d++)
            json_object_set_new(o, dir_names[d], rate_json(rep.gbps[p][d]));
        json_object_set_new(copies, p ? "pageable" : "pinned", o);
    }
    for (int d = 0; d < N_DIRS; d++)
        json_object_set_new(all, dir_names[d], rate_json(rep.all_gbps[d]));
    json_t *rec = json_pack("{s:s, s:s, s:i, s:I, s:o, s:o, s:s}", "bench", "h2d", "device",
                            gi.name, "devices", ndev, "copy_bytes", (json_int_t)bytes,
                            "copies_gbps", copies, "pinned_all_devices", all, "pinned_note",
                            rep.pin_note);
    return fso_bench_output("h2d", rec, json, plot);
}

int fso_bench_allgather(int argc, char **argv)
{
    size_t bytes = 0;
    double seconds = 0.4;
    const char *json = NULL, *plot = NULL;
    int rc = parse_args(argc, argv, false, &bytes, &seconds, &json, &plot);
    if (rc >= 0)
        return rc;
    fso_gpu_info gi;
    int ndev = 0;
    if ((rc = gpus_here("allgather", &gi, &ndev)) != 0)
        return rc;

    struct coll_shared *sh = calloc(1, sizeof *sh);
    char err[512] = "", coll_note[sizeof err + 16] = "";
    int coll_rc = -1, coll_wrong = 0;
    if (!sh) {
        snprintf(coll_note, sizeof coll_note, "out of host memory");
    } else if (ndev < 2) {
        snprintf(coll_note, sizeof coll_note, "not run: 1 GPU");
    } else {
        coll_rc = run_collectives(sh, ndev, seconds / 2, err, sizeof err);
        if (coll_rc < 0)
            snprintf(coll_note, sizeof coll_note, "failed: %s", err);
    }
    static const char *const op_names[2] = {"all_gather", "reduce_scatter"};
    const bool table = fso_bench_table(json);
    if (coll_rc == 0) {
        const double bus = (double)(ndev - 1) / ndev;
        if (table) {
            printf("# collectives: %d ranks over NCCL, fp32; size = the larger buffer per rank\n",
                   ndev);
            printf("# %12s %-15s %10s %10s %10s %8s\n", "size", "op", "time", "algbw", "busbw",
                   "#wrong");
            printf("# %12s %-15s %10s %10s %10s %8s\n", "(B)", "", "(us)", "(GB/s)", "(GB/s)",
                   "");
        }
        double sum = 0;
        int n = 0;
        size_t wrong = 0;
        for (int op = 0; op < 2; op++)
            for (int si = 0; si < N_SIZES; si++) {
                if (coll_sizes[si] > sh->max_bytes)
                    continue;
                double t = sh->time_ms[op][si] / 1e3, alg = coll_sizes[si] / t / 1e9;
                if (table)
                    printf("  %12zu %-15s %10.1f %10.2f %10.2f %8zu\n", coll_sizes[si],
                           op_names[op], t * 1e6, alg, alg * bus, sh->errors[op][si]);
                sum += alg * bus;
                wrong += sh->errors[op][si];
                n++;
            }
        if (table)
            printf("# average bus bandwidth: %.2f GB/s  %s\n", n ? sum / n : 0.0,
                   wrong ? "FAILED" : "OK");
        coll_wrong = wrong != 0;
    } else if (table) {
        printf("# collectives: %s\n", coll_note);
    }
    int out = coll_wrong || (coll_rc < 0 && ndev > 1) ? 1 : 0;
    if (json || plot) {
        json_t *coll;
        if (coll_rc == 0) {
            coll = json_pack("{s:i}", "ranks", ndev);
            for (int op = 0; op < 2; op++) {
                json_t *arr = json_array();
                for (int si = 0; si < N_SIZES; si++) {
                    if (coll_sizes[si] > sh->max_bytes)
                        continue;
                    double t = sh->time_ms[op][si] / 1e3, alg = coll_sizes[si] / t / 1e9;
                    json_array_append_new(arr, json_pack("{s:I, s:f, s:f, s:f, s:I}", "bytes",
                                                         (json_int_t)coll_sizes[si], "time_us",
                                                         t * 1e6, "algbw_gbps", alg,
                                                         "busbw_gbps", alg * (ndev - 1) / ndev,
                                                         "wrong", (json_int_t)sh->errors[op][si]));
                }
                json_object_set_new(coll, op_names[op], arr);
            }
        } else {
            coll = json_string(coll_note);
        }
        json_t *rec = json_pack("{s:s, s:s, s:i, s:o}", "bench", "allgather", "device", gi.name,
                                "devices", ndev, "collectives", coll);
        if (fso_bench_output("allgather", rec, json, plot))
            out = 1;
    }
    free(sh);
    return out;
}

#else /* no CUDA in this build */

static int no_cuda(const char *me)
{
    char why[512];
    fso_cuda_available(why, sizeof why);
    printf("fsoff bench %s: skipped: this fsoff was %s\n", me, why);
    return 77;
}

int fso_bench_h2d(int argc, char **argv)
{
    size_t bytes = 0;
    double seconds = 0;
    const char *json = NULL, *plot = NULL;
    int rc = parse_args(argc, argv, true, &bytes, &seconds, &json, &plot);
    return rc >= 0 ? rc : no_cuda("h2d");
}

int fso_bench_allgather(int argc, char **argv)
{
    size_t bytes = 0;
    double seconds = 0;
    const char *json = NULL, *plot = NULL;
    int rc = parse_args(argc, argv, false, &bytes, &seconds, &json, &plot);
    return rc >= 0 ? rc : no_cuda("allgather");
}

#endif
