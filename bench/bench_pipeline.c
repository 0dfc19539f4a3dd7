/* bench_pipeline.c — `fsoff bench pipeline`: one configuration's offload
 * data path on the real store, with the model's compute replaced by timed
 * waits of the planner's predicted length, against the store's own rates
 * measured in the same run.
 *
 * The job is planned as `fsoff train` plans it (the same flags: --config,
 * --set, --nvme as a place, --devices, --device-mem, --host-mem), and the
 * trainer runs its steps for real — parameter reads from NVMe ahead of
 * compute, host-device copies, all-gathers, reduce-scatters, gradients
 * landing on their tier, the optimizer streaming its chunks, every write —
 * except that each visit's compute is a wait (model.h standin_ms). Two
 * rounds of steps, the first step of each excluded:
 *
 *   pipeline   each visit waits the plan's predicted compute for it: the
 *              step as training would run it, against its bound,
 *              max(compute waited, I/O time at the store's rates);
 *   data path  no wait at all: what is left is the data path, whose step
 *              time, when its bytes are on NVMe, is the step's I/O time,
 *              against the same bytes at the store's rates.
 *
 * The store alone, before and after (their mean is the reference): one
 * ring per device moving sequential data at the configuration's aio
 * settings (tune_sweep.h). Per step: NVMe bytes read and written, by kind,
 * against the derivation for the placement (docs/offload.md)
 * (fso_zero_step_traffic); GB/s over the step of each stream (NVMe reads
 * and writes; all-gathers and reduce-scatters, their bytes the same
 * derivation's); the optimizer's time. GB = 1e9 bytes.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "config/config.h"
#include "devices.h"
#include "model.h"
#include "plan.h"
#include "store.h"
#include "tune_sweep.h"
#include "util.h"
#include "zero/zero.h"

#define PL_MAX_STEPS 64

typedef struct pl_args {
    const char *config, *nvme, *json, *plot;
    char **sets;
    int nsets, world, steps;
    uint64_t device_mem, host_mem;
    double store_seconds;
} pl_args;

typedef struct pl_step {
    double ms, optimizer_ms;
    double stall_ms, exposed_ms;     /* device 0 waited on NVMe reads, on the optimizer */
    uint64_t rd[FSO_N_KINDS], wr[FSO_N_KINDS];
} pl_step;

/* A round of steps and their means (the first step excluded). */
typedef struct pl_round {
    pl_step st[PL_MAX_STEPS];
    double ms, optimizer_ms, rd, wr, stall_ms, exposed_ms; /* means */
    uint64_t krd[FSO_N_KINDS], kwr[FSO_N_KINDS]; /* per step, means */
    bool as_derived;                  /* every step after the first moved the derivation */
} pl_round;

static void pl_usage(FILE *f)
{
    fprintf(f,
            "usage: fsoff bench pipeline [--config FILE] [--set KEY=VALUE]... [--nvme DIR[,DIR]]\n"
            "                            [--devices cpu:N] [--device-mem SIZE] [--host-mem SIZE]\n"
            "                            [--steps N] [--store-seconds S] [--json FILE]\n"
            "                            [--plot FILE.png] [--help]\n\n"
            "Runs one configuration's offload data path on the real store: the placement\n"
            "fsoff train would take, its steps with every read, copy, gather, reduce-scatter,\n"
            "optimizer stream and write, and the model's compute replaced by timed waits of\n"
            "the planner's predicted length; then again with no compute at all, which leaves\n"
            "the step's I/O time. Reports GB/s per stream, the step's NVMe bytes (by kind,\n"
            "against their derivation), that I/O time against the store's own rates measured\n"
            "in the same run, and how near the step with compute is its bound.\n\n"
            "  --config FILE, --set KEY=VALUE, --nvme DIR[,DIR], --devices cpu:N,\n"
            "  --device-mem SIZE, --host-mem SIZE   as for fsoff train\n"
            "  --steps N          steps of each round (at least 2: the first is excluded;\n"
            "                     default 4)\n"
            "  --store-seconds S  how long the store alone is timed per direction, before\n"
            "                     and after the steps (default 1.5)\n"
            "  --json FILE        also write the results as one JSON object (\"-\": to stdout\n"
            "                     instead of the table)\n"
            "  --plot FILE.png    draw GB/s per stream against the store's own rates\n");
}

/* 0 ok, 2 usage error (printed), -1 --help printed. */
static int pl_parse(int argc, char **argv, pl_args *a)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},     {"set", required_argument, NULL, 's'},
        {"nvme", required_argument, NULL, 'N'},       {"devices", required_argument, NULL, 'D'},
        {"device-mem", required_argument, NULL, 'M'}, {"host-mem", required_argument, NULL, 'H'},
        {"steps", required_argument, NULL, 'n'},      {"store-seconds", required_argument, NULL, 'S'},
        {"json", required_argument, NULL, 'j'},       {"plot", required_argument, NULL, 'p'},
        {"help", no_argument, NULL, 'h'},             {NULL, 0, NULL, 0},
    };
    a->world = 1;
    a->steps = 4;
    a->store_seconds = 1.5;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":c:s:h", longopts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'c':
            a->config = optarg;
            break;
        case 's':
            a->sets[a->nsets++] = optarg;
            break;
        case 'N':
            a->nvme = optarg;
            break;
        case 'D': {
            char why[256];
            fso_devices d;
            if (fso_devices_parse(optarg, true, &d, why, sizeof why) < 0)
                return fso_bench_bad("pipeline", "%s", why);
            a->world = d.count ? d.count : 1;
            break;
        }
        case 'M':
        case 'H': {
            uint64_t *v = c == 'M' ? &a->device_mem : &a->host_mem;
            if (fso_parse_size(optarg, v) < 0 || *v == 0)
                return fso_bench_bad("pipeline", "%s %s: expected a size such as 512M or 8G",
                                     c == 'M' ? "--device-mem" : "--host-mem", optarg);
            break;
        }
        case 'n':
            a->steps = (int)strtol(optarg, &end, 10);
            if (*end || end == optarg || a->steps < 2 || a->steps > PL_MAX_STEPS)
                return fso_bench_bad("pipeline", "--steps %s: expected 2 to %d (the first step "
                                                 "is excluded)", optarg, PL_MAX_STEPS);
            break;
        case 'S':
            a->store_seconds = strtod(optarg, &end);
            if (*end || end == optarg || !(a->store_seconds >= 0.2 && a->store_seconds <= 60))
                return fso_bench_bad("pipeline", "--store-seconds %s: expected 0.2 to 60",
                                     optarg);
            break;
        case 'j':
            a->json = optarg;
            break;
        case 'p':
            if (fso_bench_plot_arg("pipeline", optarg, &a->plot))
                return 2;
            break;
        case 'h':
            pl_usage(stdout);
            return -1;
        case ':':
            return fso_bench_bad("pipeline", "%s needs a value", argv[optind - 1]);
        default:
            return fso_bench_bad("pipeline", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return fso_bench_bad("pipeline", "unexpected argument '%s'", argv[optind]);
    return 0;
}

/* The configuration as fsoff train reads it: the file, the --set
 * overrides, --nvme as the folders of both offload sections (a place, not
 * a pin). 0, or 1 or 2 after one error line with cfg freed. */
static int pl_config(const pl_args *a, fso_config *cfg)
{
    char **sets = calloc((size_t)a->nsets + 2, sizeof *sets);
    int n = 0, rc = 2;
    fso_config_defaults(cfg);
    cfg->world = a->world;
    cfg->device_mem_bytes = a->device_mem;
    cfg->host_mem_bytes = a->host_mem;
    if (a->nvme) { /* as train checks it: before anything is planned or opened */
        char buf[4096], why[1024];
        const char *dirs[FSO_STORE_MAX_DIRS];
        if (fso_nvme_folders_split("--nvme", a->nvme, true, buf, sizeof buf, dirs, why,
                                   sizeof why) < 0) {
            fprintf(stderr, "fsoff: error: bench pipeline: %s\n", why);
            fso_config_free(cfg);
            free(sets);
            return 2;
        }
    }
    if (!sets) {
        fprintf(stderr, "fsoff: error: bench pipeline: out of memory\n");
        fso_config_free(cfg);
        return 1;
    }
    for (int i = 0; i < a->nsets; i++)
        sets[n++] = a->sets[i];
    char *lit = a->nvme ? fso_json_quote(a->nvme) : NULL;
    if (lit && (asprintf(&sets[n++], "zero_optimization.offload_param.nvme_path=%s", lit) < 0 ||
                asprintf(&sets[n++], "zero_optimization.offload_optimizer.nvme_path=%s", lit) <
                    0)) {
        fprintf(stderr, "fsoff: error: bench pipeline: out of memory\n");
        n = a->nsets;
        goto out;
    }
    if (fso_config_load_all(cfg, a->config, sets, n) < 0)
        fprintf(stderr, "fsoff: error: bench pipeline: %s\n", cfg->err);
    else
        rc = 0;
out:
    if (rc != 0)
        fso_config_free(cfg);
    for (int i = a->nsets; i < n; i++)
        free(sets[i]);
    free(sets);
    free(lit);
    return rc;
}

/* The store alone at cfg's aio settings, one ring per device, over the
 * folders the plan writes to: write and read GB/s into w, r. 0 or 1 (the
 * sweep printed its error). */
static int pl_store_rates(const fso_config *cfg, double seconds, double *w, double *r)
{
    char buf[4096];
    const char *dirs[FSO_STORE_MAX_DIRS];
    bool optim = false;
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        optim = optim || fso_offload_tier(&cfg->offload, (fso_kind)k) == FSO_TIER_NVME;
    snprintf(buf, sizeof buf, "%s",
             optim ? cfg->offload.optim_nvme_path : cfg->offload.param_nvme_path);
    int nd = fso_split_list(buf, ',', dirs, FSO_STORE_MAX_DIRS);
    size_t block = (size_t)cfg->offload.aio_block_bytes;
    fso_tune_point pt = {.bi = 0, .block = block, .qd = cfg->offload.aio_queue_depth,
                         .rings = cfg->world};
    fso_tune_sweep sw = {.dirs = dirs, .ndirs = nd, .blocks = &block, .nblocks = 1,
                         .max_rings = cfg->world,
                         .region_bytes = (uint64_t)256 << 20 > block * (uint64_t)pt.qd
                                             ? (uint64_t)256 << 20
                                             : block * (uint64_t)pt.qd,
                         .seconds = seconds, .pts = &pt, .npts = 1};
    if (nd <= 0 || fso_tune_run(&sw) != 0)
        return 1;
    *w = fso_tune_rate(&pt, 1);
    *r = fso_tune_rate(&pt, 0);
    return 0;
}

/* A number, or null when it is not finite (NaN has no JSON). */
static json_t *jnum(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

static json_t *kinds_json(const uint64_t *b)
{
    json_t *o = json_object();
    for (int k = 0; k < FSO_N_KINDS; k++)
        json_object_set_new(o, fso_kind_key(k), json_integer((json_int_t)b[k]));
    return o;
}

/* The milliseconds the store alone takes for rd bytes read and wr written,
 * one after the other. */
static double pl_io_ms(double rd, double wr, double store_r, double store_w)
{
    if (rd + wr == 0)
        return 0;
    return (rd / (store_r * 1e9) + wr / (store_w * 1e9)) * 1e3;
}

/* A round of `steps` steps on z with compute replaced by part_ms; the
 * means of the steps after the first, and whether they moved drd/dwr. 0 or
 * -1 after one error line. */
static int pl_round_run(fso_zero *z, const double *part_ms, int steps, const int32_t *tokens,
                        const uint64_t *drd, const uint64_t *dwr, pl_round *ro)
{
    char err[1024];
    double waited;
    memset(ro, 0, sizeof *ro);
    ro->as_derived = true;
    fso_zero_standin(z, part_ms);
    for (int s = 0; s < steps; s++) {
        fso_zero_step zs;
        pl_step *p = &ro->st[s];
        double t0 = fso_now_ms();
        if (fso_zero_step_run(z, tokens, tokens, NULL, &zs, err, sizeof err) < 0) {
            fprintf(stderr, "fsoff: error: bench pipeline: step %d: %s\n", s + 1, err);
            return -1;
        }
        p->ms = fso_now_ms() - t0;
        p->optimizer_ms = zs.optimizer_ms;
        p->stall_ms = zs.stall_ms;
        p->exposed_ms = zs.optimizer_exposed_ms;
        memcpy(p->rd, zs.nvme_kind_read, sizeof p->rd);
        memcpy(p->wr, zs.nvme_kind_write, sizeof p->wr);
        if (s == 0)
            continue;
        ro->ms += p->ms / (steps - 1);
        ro->optimizer_ms += p->optimizer_ms / (steps - 1);
        ro->stall_ms += p->stall_ms / (steps - 1);
        ro->exposed_ms += p->exposed_ms / (steps - 1);
        for (int k = 0; k < FSO_N_KINDS; k++) {
            ro->krd[k] += p->rd[k] / (uint64_t)(steps - 1);
            ro->kwr[k] += p->wr[k] / (uint64_t)(steps - 1);
            ro->rd += (double)p->rd[k] / (steps - 1);
            ro->wr += (double)p->wr[k] / (steps - 1);
            ro->as_derived = ro->as_derived && p->rd[k] == drd[k] && p->wr[k] == dwr[k];
        }
    }
    /* the last update, so the next round starts from a quiet store */
    if (fso_zero_finish(z, &waited, err, sizeof err) < 0) {
        fprintf(stderr, "fsoff: error: bench pipeline: the last update: %s\n", err);
        return -1;
    }
    return 0;
}

/* One run of the bench: the job as planned, what it measured, and what the
 * report derives from both. */
typedef struct pl_job {
    const fso_config *cfg, *run;      /* as read; as the plan applied it */
    char place[512];                  /* the placement, described */
    double part_ms[FSO_N_PARTS];      /* the planner's predicted compute per part */
    double compute_ms;                /* ... per step */
    uint64_t drd[FSO_N_KINDS], dwr[FSO_N_KINDS]; /* NVMe bytes per step, derived */
    bool nvme;                        /* the derivation moves bytes through the store */
    double sw[2], sr[2];              /* the store alone, before and after: GB/s */
    double store_w, store_r;          /* their means */
    pl_round rounds[2];               /* pipeline, data path */
    double gather_b, reduce_b;        /* bytes a step all-gathers, reduce-scatters */
    double io_ms[2];                  /* each round's mean NVMe bytes at the store's rates */
    double r_bound, r_io;             /* pipeline over its bound, data path over io_ms[1] */
    bool exact;                       /* every step of both rounds moved the derivation */
} pl_job;

/* The plan fsoff train would take for cfg, applied to run, and what it
 * predicts: the compute per part and per step, the placement, the NVMe
 * bytes of a step. 0, or 1 after one error line. */
static int pl_plan(const fso_config *cfg, fso_plan_ctx *ctx, fso_plan *plan, fso_config *run,
                   pl_job *j)
{
    char err[1024];
    int rc;
    fso_plan_pins pins;
    fso_plan_pins_from_config(cfg, &pins);
    if ((rc = fso_plan_ctx_here(ctx, cfg, err, sizeof err)) < 0) {
        fprintf(stderr, "fsoff: error: bench pipeline: %s\n", err);
        return 1;
    }
    ctx->in.pins = pins;
    if ((rc = fso_plan_choose(&ctx->in, plan)) < 0) {
        if (rc == -ENOSPC)
            fso_plan_shortfall_message(plan, &pins, true, err, sizeof err);
        else
            snprintf(err, sizeof err, "planner: %s", strerror(-rc));
        fprintf(stderr, "fsoff: error: bench pipeline: no placement fits: %s\n", err);
        return 1;
    }
    *run = *cfg;
    if (fso_plan_apply(plan, run, err, sizeof err) < 0) {
        fprintf(stderr, "fsoff: error: bench pipeline: %s\n", err);
        return 1;
    }
    fso_plan_part_ms(ctx, j->part_ms);
    j->compute_ms = 0;
    for (int k = 0; k < ctx->in.model.n_visits; k++)
        if (ctx->visit_part[k] >= 0)
            j->compute_ms += j->part_ms[ctx->visit_part[k]] * cfg->grad_accum;
    fso_plan_describe(plan, j->place, sizeof j->place);
    uint64_t drd_all = 0, dwr_all = 0;
    fso_fp_traffic tr;
    if (fso_zero_step_traffic(run, &tr) < 0) {
        fprintf(stderr, "fsoff: error: bench pipeline: out of memory\n");
        return 1;
    }
    memcpy(j->drd, tr.nvme_read, sizeof j->drd);
    memcpy(j->dwr, tr.nvme_write, sizeof j->dwr);
    j->gather_b = (double)tr.gather_bytes;
    j->reduce_b = (double)tr.reduce_bytes;
    for (int k = 0; k < FSO_N_KINDS; k++) {
        drd_all += j->drd[k];
        dwr_all += j->dwr[k];
    }
    j->nvme = drd_all + dwr_all > 0;
    return 0;
}

/* The two rounds of `steps` steps on the planned job: compute as the
 * plan's waits, then none. 0, or 1 after one error line. */
static int pl_rounds(pl_job *j, int steps)
{
    static const double none[FSO_N_PARTS] = {0};
    char err[1024];
    fso_zero *z = NULL;
    int32_t *tokens = NULL;
    int status = 1;
    if (fso_zero_create(&z, j->run, err, sizeof err) < 0) {
        fprintf(stderr, "fsoff: error: bench pipeline: %s\n", err);
        goto out;
    }
    const fso_config *run = j->run;
    size_t ntok = (size_t)run->world * run->grad_accum * run->micro_batch * run->data.seq_len;
    if (!(tokens = calloc(ntok, sizeof *tokens))) {
        fprintf(stderr, "fsoff: error: bench pipeline: out of memory\n");
        goto out;
    }
    for (int r = 0; r < 2; r++)
        if (pl_round_run(z, r == 0 ? j->part_ms : none, steps, tokens, j->drd, j->dwr,
                         &j->rounds[r]) < 0)
            goto out;
    status = 0;
out:
    fso_zero_destroy(z);
    free(tokens);
    return status;
}

/* The store alone before, the rounds, the store alone after. 0, or 1 after
 * one error line. */
static int pl_measure(pl_job *j, int steps, double store_seconds)
{
    if (j->nvme && pl_store_rates(j->run, store_seconds, &j->sw[0], &j->sr[0]) != 0)
        return 1;
    if (pl_rounds(j, steps) != 0)
        return 1;
    if (j->nvme && pl_store_rates(j->run, store_seconds, &j->sw[1], &j->sr[1]) != 0)
        return 1;
    j->store_w = (j->sw[0] + j->sw[1]) / 2;
    j->store_r = (j->sr[0] + j->sr[1]) / 2;
    return 0;
}

/* The collective bytes and the ratios the report states. */
static void pl_derive(pl_job *j)
{
    const pl_round *pipe = &j->rounds[0], *data = &j->rounds[1];
    for (int r = 0; r < 2; r++)
        j->io_ms[r] = pl_io_ms(j->rounds[r].rd, j->rounds[r].wr, j->store_r, j->store_w);
    const double bound = j->io_ms[0] > j->compute_ms ? j->io_ms[0] : j->compute_ms;
    j->r_bound = pipe->ms / bound;
    j->r_io = j->io_ms[1] > 0 ? data->ms / j->io_ms[1] : NAN;
    j->exact = pipe->as_derived && data->as_derived;
}

/* A step's NVMe bytes, all kinds together. */
static void pl_step_bytes(const pl_step *p, uint64_t *rd, uint64_t *wr)
{
    *rd = *wr = 0;
    for (int k = 0; k < FSO_N_KINDS; k++) {
        *rd += p->rd[k];
        *wr += p->wr[k];
    }
}

/* The table: the job and the store alone, a line per step, the summary. */
static void pl_print(FILE *out, const pl_job *j, int steps)
{
    const fso_config *run = j->run;
    char aio[32];
    fso_human_bytes(aio, sizeof aio, (double)run->offload.aio_block_bytes);
    fprintf(out, "# fsoff bench pipeline: %s on %d CPU device%s\n",
            j->cfg->source[0] ? j->cfg->source : "built-in defaults (configs/tiny.json)",
            run->world, run->world == 1 ? "" : "s");
    fprintf(out, "# placement: %s\n", j->place);
    if (j->nvme)
        fprintf(out, "# the store alone (aio %s, queue depth %d, %d ring%s): read %.3f GB/s, write "
                     "%.3f GB/s (before %.3f/%.3f, after %.3f/%.3f)\n",
                aio, run->offload.aio_queue_depth, run->world, run->world == 1 ? "" : "s",
                j->store_r, j->store_w, j->sr[0], j->sw[0], j->sr[1], j->sw[1]);
    else
        fprintf(out, "# no state on NVMe: the steps move nothing through the store\n");
    fprintf(out, "#     round  step  compute    step  stall  opt wait   read  write    read   "
                 "write  gather  reduce  optimizer  I/O at store\n");
    fprintf(out, "#                     (ms)    (ms)   (ms)      (ms)   (GB)   (GB)  (GB/s)  "
                 "(GB/s)  (GB/s)  (GB/s)       (ms)          (ms)\n");
    for (int r = 0; r < 2; r++) {
        for (int s = 0; s < steps; s++) {
            const pl_step *p = &j->rounds[r].st[s];
            uint64_t rd, wr;
            pl_step_bytes(p, &rd, &wr);
            const double secs = p->ms / 1e3;
            fprintf(out, "  %9s  %4d  %7.0f  %6.0f  %5.0f  %8.0f  %5.2f  %5.2f  %6.3f  %6.3f  "
                         "%6.2f  %6.2f  %9.0f  %12.0f%s\n",
                    r == 0 ? "pipeline" : "data path", s + 1, r == 0 ? j->compute_ms : 0.0, p->ms,
                    p->stall_ms, p->exposed_ms, rd / 1e9, wr / 1e9, rd / secs / 1e9,
                    wr / secs / 1e9, j->gather_b / secs / 1e9, j->reduce_b / secs / 1e9,
                    p->optimizer_ms, pl_io_ms(rd, wr, j->store_r, j->store_w),
                    s == 0 ? "  (first: excluded)" : "");
        }
    }
    const pl_round *pipe = &j->rounds[0], *data = &j->rounds[1];
    const double secs = pipe->ms / 1e3;
    char gathers[64] = "none (parameters lent in place)";
    if (j->gather_b > 0)
        snprintf(gathers, sizeof gathers, "%.2f GB/s", j->gather_b / secs / 1e9);
    fprintf(out, "# pipeline, steps 2-%d: %.0f ms per step: compute %.0f, waiting on NVMe reads "
                 "%.0f, on the optimizer %.0f, the rest (copies, gathers, gradients landing) "
                 "%.0f; NVMe %.3f GB/s read, %.3f GB/s written over the step; all-gathers %s, "
                 "reduce-scatters %.2f GB/s; the optimizer %.0f ms\n",
            steps, pipe->ms, j->compute_ms, pipe->stall_ms, pipe->exposed_ms,
            pipe->ms - j->compute_ms - pipe->stall_ms - pipe->exposed_ms, pipe->rd / secs / 1e9,
            pipe->wr / secs / 1e9, gathers, j->reduce_b / secs / 1e9, pipe->optimizer_ms);
    fprintf(out, "# NVMe GB read/written per step by kind (the derivation for this placement):");
    for (int k = 0; k < FSO_N_KINDS; k++)
        if (pipe->krd[k] || pipe->kwr[k] || j->drd[k] || j->dwr[k])
            fprintf(out, " %s %.3g/%.3g (%.3g/%.3g)", fso_kind_abbrev(k), pipe->krd[k] / 1e9,
                    pipe->kwr[k] / 1e9, j->drd[k] / 1e9, j->dwr[k] / 1e9);
    fprintf(out, "%s\n",
            j->nvme ? (j->exact ? "; every step as derived" : "; NOT as derived") : " none");
    if (j->nvme) {
        fprintf(out, "# I/O: the data path alone takes %.0f ms per step for bytes the store alone "
                     "moves in %.0f ms: %.2fx\n", data->ms, j->io_ms[1], j->r_io);
        fprintf(out, "# the step with compute: %.2fx its bound, max(compute %.0f ms, I/O %.0f ms): "
                     "%s-bound\n", j->r_bound, j->compute_ms, j->io_ms[0],
                j->io_ms[0] > j->compute_ms ? "I/O" : "compute");
    } else {
        fprintf(out, "# the step with compute: %.2fx its compute\n", j->r_bound);
    }
}

/* The JSON object: the job, the store alone, a row per step, the summary. */
static json_t *pl_json(const pl_job *j, int steps)
{
    const fso_config *run = j->run;
    json_t *rows = json_array();
    for (int r = 0; r < 2; r++) {
        for (int s = 0; s < steps; s++) {
            const pl_step *p = &j->rounds[r].st[s];
            uint64_t rd, wr;
            pl_step_bytes(p, &rd, &wr);
            json_t *row = json_object();
            json_object_set_new(row, "round", json_string(r == 0 ? "pipeline" : "data path"));
            json_object_set_new(row, "step", json_integer(s + 1));
            json_object_set_new(row, "step_ms", jnum(p->ms));
            json_object_set_new(row, "nvme_read_bytes", json_integer((json_int_t)rd));
            json_object_set_new(row, "nvme_write_bytes", json_integer((json_int_t)wr));
            json_object_set_new(row, "optimizer_ms", jnum(p->optimizer_ms));
            json_object_set_new(row, "stall_ms", jnum(p->stall_ms));
            json_object_set_new(row, "optimizer_exposed_ms", jnum(p->exposed_ms));
            json_object_set_new(row, "nvme_read_by_kind", kinds_json(p->rd));
            json_object_set_new(row, "nvme_write_by_kind", kinds_json(p->wr));
            json_array_append_new(rows, row);
        }
    }
    const pl_round *pipe = &j->rounds[0], *data = &j->rounds[1];
    const double secs = pipe->ms / 1e3;
    json_t *rec = json_object(), *store = json_object();
    json_object_set_new(rec, "bench", json_string("pipeline"));
    json_object_set_new(rec, "config", json_string(j->cfg->source));
    json_object_set_new(rec, "devices", json_integer(run->world));
    json_object_set_new(rec, "placement", json_string(j->place));
    json_object_set_new(rec, "compute_ms", jnum(j->compute_ms));
    json_object_set_new(store, "read_gbps", jnum(j->store_r));
    json_object_set_new(store, "write_gbps", jnum(j->store_w));
    json_object_set_new(store, "read_gbps_before", jnum(j->sr[0]));
    json_object_set_new(store, "write_gbps_before", jnum(j->sw[0]));
    json_object_set_new(store, "read_gbps_after", jnum(j->sr[1]));
    json_object_set_new(store, "write_gbps_after", jnum(j->sw[1]));
    json_object_set_new(store, "block_bytes", json_integer(run->offload.aio_block_bytes));
    json_object_set_new(store, "queue_depth", json_integer(run->offload.aio_queue_depth));
    json_object_set_new(rec, "store", store);
    json_object_set_new(rec, "steps", rows);
    json_object_set_new(rec, "step_ms", jnum(pipe->ms));
    json_object_set_new(rec, "io_ms_at_store", jnum(j->io_ms[0]));
    json_object_set_new(rec, "step_over_bound", jnum(j->r_bound));
    json_object_set_new(rec, "data_path_ms", jnum(data->ms));
    json_object_set_new(rec, "data_path_io_ms_at_store", jnum(j->io_ms[1]));
    json_object_set_new(rec, "data_path_over_store", jnum(j->r_io));
    json_object_set_new(rec, "nvme_read_gbps", jnum(pipe->rd / secs / 1e9));
    json_object_set_new(rec, "nvme_write_gbps", jnum(pipe->wr / secs / 1e9));
    json_object_set_new(rec, "data_path_read_gbps", jnum(data->rd / (data->ms * 1e6)));
    json_object_set_new(rec, "data_path_write_gbps", jnum(data->wr / (data->ms * 1e6)));
    json_object_set_new(rec, "gather_gbps", jnum(j->gather_b / secs / 1e9));
    json_object_set_new(rec, "reduce_scatter_gbps", jnum(j->reduce_b / secs / 1e9));
    json_object_set_new(rec, "optimizer_ms", jnum(pipe->optimizer_ms));
    json_object_set_new(rec, "stall_ms", jnum(pipe->stall_ms));
    json_object_set_new(rec, "optimizer_exposed_ms", jnum(pipe->exposed_ms));
    json_object_set_new(rec, "derived_read_by_kind", kinds_json(j->drd));
    json_object_set_new(rec, "derived_write_by_kind", kinds_json(j->dwr));
    json_object_set_new(rec, "as_derived", json_boolean(j->exact));
    return rec;
}

int fso_bench_pipeline(int argc, char **argv)
{
    pl_args a = {.sets = calloc((size_t)argc + 1, sizeof(char *))};
    fso_config cfg, *run = malloc(sizeof *run);
    fso_plan_ctx ctx = {0};
    fso_plan *plan = malloc(sizeof *plan);
    pl_job *j = calloc(1, sizeof *j);
    int status = 1;
    bool have_cfg = false;
    if (!a.sets || !run || !plan || !j) {
        fprintf(stderr, "fsoff: error: bench pipeline: out of memory\n");
        goto out;
    }
    if ((status = pl_parse(argc, argv, &a)) != 0) {
        status = status < 0 ? 0 : status;
        goto out;
    }
    if ((status = pl_config(&a, &cfg)) != 0)
        goto out;
    have_cfg = true;
    j->cfg = &cfg;
    j->run = run;
    if (pl_plan(&cfg, &ctx, plan, run, j) != 0 || pl_measure(j, a.steps, a.store_seconds) != 0) {
        status = 1;
        goto out;
    }
    pl_derive(j);
    pl_print(fso_bench_table(a.json) ? stdout : stderr, j, a.steps);
    status = fso_bench_output("pipeline", pl_json(j, a.steps), a.json, a.plot);
out:
    fso_plan_ctx_free(&ctx);
    if (have_cfg)
        fso_config_free(&cfg);
    free(j);
    free(plan);
    free(run);
    free(a.sets);
    return status;
}
