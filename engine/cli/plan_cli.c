/* plan_cli.c — `fsoff plan`: what a job needs and how fsoff would run it,
 * on this machine or on one described by options (plan_cli.h). Part of the
 * fsoff executable; the planner it drives is engine/plan.h. */
#include "plan_cli.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "boxes.h"
#include "devices.h"
#include "plan.h"
#include "probe.h"
#include "store.h"
#include "util.h"
#include "zero/zero.h"

/* The names --gpu takes, from the GPU table (gpu_info.c), sep between them. */
static void print_gpu_names(FILE *f, const char *sep)
{
    const char *before = "";
    for (const fso_gpu_spec *s = fso_gpu_specs; s->words[0]; s++)
        if (s->name) {
            fprintf(f, "%s%s", before, s->name);
            before = sep;
        }
}

static void plan_usage(FILE *f)
{
    fprintf(f,
            "usage: fsoff plan [--config FILE] [options]\n"
            "\n"
            "Print the memory each tier needs (parameters, gradients, optimizer state,\n"
            "activations with checkpointing), where fsoff would keep each kind of state, the\n"
            "predicted step time and tokens/s, and the bottleneck. Needs no GPU: describe the\n"
            "machine with the options below; numbers not given come from this machine's cached\n"
            "probes (measured once, in under a few seconds) or, with --gpus, from a table of\n"
            "conservative achieved GPU figures. Offload devices written in the config are kept\n"
            "(pinned); the planner chooses the rest.\n"
            "\n"
            "options:\n"
            "  -c, --config FILE     JSON configuration, as for fsoff train\n"
            "  -s, --set KEY=VALUE   override a configuration key (repeatable)\n"
            "      --nvme DIR[,DIR]  NVMe folders (probed for speed and free space)\n"
            "      --devices cpu:N   plan N CPU virtual devices (default: the config's, 1)\n"
            "      --device-mem SIZE memory per CPU virtual device\n"
            "      --gpus N          plan N GPUs of the kind --gpu names\n"
            "      --gpu KIND        ");
    print_gpu_names(f, ", ");
    fprintf(f,
            " (default: the one whose memory\n"
            "                        is nearest --gpu-mem, else h100)\n"
            "      --gpu-mem SIZE    memory per GPU, e.g. 140G (binary units: G = GiB)\n"
            "      --gpu-tflops X    achieved compute per device, TFLOP/s\n"
            "      --host-mem SIZE   host memory fsoff may use, e.g. 2T\n"
            "      --nvme-free SIZE  free NVMe space over all folders\n"
            "      --nvme-read GBPS  NVMe read rate over all folders, GB/s\n"
            "      --nvme-write GBPS NVMe write rate over all folders, GB/s\n"
            "      --h2d GBPS        host-to-device copy rate per device (and device-to-host)\n"
            "      --coll-gbps GBPS  all-gather bus bandwidth among the devices\n"
            "      --boxes B         plan B boxes, each the machine described (default 1): the\n"
            "                        global batch spreads over every box's devices, each box\n"
            "                        keeps 1/B of the optimizer's state and CPU AdamW work;\n"
            "                        under mpirun or srun, the launcher's boxes\n"
            "      --net-gbps GBPS   network between boxes, per box and direction, GB/s (all\n"
            "                        its devices' rails together; needed with --boxes above 1,\n"
            "                        measured when not given under mpirun or srun)\n"
            "      --adam-gelems X   CPU AdamW rate of the whole host, 1e9 elements/s\n"
            "      --probe           measure this machine again (refresh the probe cache)\n"
            "      --auto            ignore the config's offload devices: choose every tier\n"
            "      --auto-batch      choose the micro-batch x accumulation split of the global\n"
            "                        batch (train_batch_size stays): the fastest that fits\n"
            "      --json            one JSON object instead of the table\n"
            "      --trace           also print the predicted step's events, stream by stream\n"
            "  -h, --help            this help\n"
            "\n"
            "GPU figures assumed when not given (achieved, not peak: a training step reaches\n"
            "about 40%% of the dense bf16 peak; copies and all-gathers rounded down from\n"
            "typical measurements):\n");
    for (const fso_gpu_spec *s = fso_gpu_specs; s->words[0]; s++)
        if (s->name)
            fprintf(f, "  %-5s %-48s %4.0f TFLOP/s (peak %4.0f), %3.0f GiB, h2d %2.0f GB/s, "
                       "all-gather %3.0f GB/s\n",
                    s->name, s->desc, s->tflops, s->peak_tflops, s->mem_gib, s->h2d_gbps,
                    s->coll_gbps);
    fprintf(f, "\nexit status: 0 a plan fits, 1 no placement fits (the short tier and by how much),\n"
               "2 bad command line or configuration\n");
}

static int parse_pos(const char *opt, const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v > 0) || !isfinite(v)) {
        fprintf(stderr, "fsoff: error: %s %s: expected a positive number\n", opt, s);
        return -EINVAL;
    }
    *out = v;
    return 0;
}

static int parse_bytes(const char *opt, const char *s, uint64_t *out, bool zero_ok)
{
    if (fso_parse_size(s, out) < 0 || (!zero_ok && *out == 0)) {
        fprintf(stderr, "fsoff: error: %s %s: expected a size such as 512M, 80G or 2T\n", opt, s);
        return -EINVAL;
    }
    return 0;
}

/* Print the alternatives the planner weighed, as uniform placements. */
static void print_alternatives(FILE *f, const fso_plan_input *in)
{
    static const struct {
        int p, s;
        const char *what;
    } alts[] = {
        {FSO_TIER_DEVICE, FSO_TIER_DEVICE, "everything on the devices"},
        {FSO_TIER_DEVICE, FSO_TIER_HOST, "parameters on the devices, optimizer state on the host"},
        {FSO_TIER_HOST, FSO_TIER_HOST, "parameters and optimizer state on the host"},
        {FSO_TIER_HOST, FSO_TIER_NVME, "parameters on the host, optimizer state on NVMe"},
        {FSO_TIER_NVME, FSO_TIER_NVME, "everything on NVMe"},
    };
    fso_plan *alt = malloc(sizeof *alt);
    fso_placement *pl = malloc(sizeof *pl);
    if (!alt || !pl) {
        free(alt);
        free(pl);
        return;
    }
    fprintf(f, "plan: alternatives (one tier per kind, prefetch %d):\n",
            in->pins.prefetch >= 0 ? in->pins.prefetch : 2);
    for (size_t i = 0; i < sizeof alts / sizeof alts[0]; i++) {
        fso_placement_uniform(pl, in->model.n_blocks, alts[i].p, alts[i].s, alts[i].s,
                              in->pins.prefetch >= 0 ? in->pins.prefetch : 2);
        int rc = fso_plan_evaluate(in, pl, alt);
        if (rc == 0) {
            fprintf(f, "plan:   %-58s %10.1f ms/step, bottleneck %s\n", alts[i].what,
                    alt->step_ms, fso_stream_name(alt->bottleneck));
        } else if (rc == -ENOSPC) {
            char by[32];
            fso_human_bytes(by, sizeof by, (double)alt->short_bytes);
            fprintf(f, "plan:   %-58s %10s (%s short by %s)\n", alts[i].what, "no fit",
                    fso_tier_name(alt->short_tier), by);
        }
    }
    free(alt);
    free(pl);
}

/* The machine as the command line describes it; 0: not given. */
typedef struct given {
    int gpus;
    int boxes;                /* --boxes; 0: not given (one box) */
    double net_gbps;          /* --net-gbps */
    const char *gpu;
    uint64_t gpu_mem, host_mem, nvme_free, device_mem;
    double gpu_tflops, nvme_read, nvme_write, h2d, coll, adam;
    bool has_nvme_free;
} given;

typedef struct plan_args {
    const char *config_path;
    const char *nvme;         /* --nvme as given, NULL when not */
    char **sets;              /* --set, --nvme as assignments, in order */
    int nsets;
    bool refresh, autoplace, auto_batch, json, trace;
    given g;
} plan_args;

/* A numeric option's value into the machine description; 0 or -EINVAL
 * after one error line. */
static int parse_machine_option(int c, const char *arg, fso_config *cfg, given *g)
{
    switch (c) {
    case 'D': {
        char why[256];
        fso_devices d;
        if (fso_devices_parse(arg, true, &d, why, sizeof why) < 0) {
            fprintf(stderr, "fsoff: error: %s (for GPUs use --gpus N)\n", why);
            return -EINVAL;
        }
        cfg->world = d.count ? d.count : 1;
        return 0;
    }
    case 'M':
        return parse_bytes("--device-mem", arg, &g->device_mem, false);
    case 'g': {
        char *end;
        errno = 0;
        long n = strtol(arg, &end, 10);
        if (errno || end == arg || *end || n < 1 || n > FSO_MAX_DEVICES) {
            fprintf(stderr, "fsoff: error: --gpus %s: expected a GPU count from 1 to %d\n", arg,
                    FSO_MAX_DEVICES);
            return -EINVAL;
        }
        g->gpus = (int)n;
        return 0;
    }
    case 'b': {
        char *end;
        errno = 0;
        long n = strtol(arg, &end, 10);
        if (errno || end == arg || *end || n < 1 || n > FSO_PLAN_MAX_BOXES) {
            fprintf(stderr, "fsoff: error: --boxes %s: expected a box count from 1 to %d\n", arg,
                    FSO_PLAN_MAX_BOXES);
            return -EINVAL;
        }
        g->boxes = (int)n;
        return 0;
    }
    case 'n':
        return parse_pos("--net-gbps", arg, &g->net_gbps);
    case 'G':
        if (!fso_gpu_spec_find(arg)) {
            fprintf(stderr, "fsoff: error: --gpu %s: unknown GPU; choose one of ", arg);
            print_gpu_names(stderr, " ");
            fprintf(stderr, ", or give --gpu-mem, --gpu-tflops, --h2d and --coll-gbps\n");
            return -EINVAL;
        }
        g->gpu = arg;
        return 0;
    case 'm':
        return parse_bytes("--gpu-mem", arg, &g->gpu_mem, false);
    case 't':
        return parse_pos("--gpu-tflops", arg, &g->gpu_tflops);
    case 'H':
        return parse_bytes("--host-mem", arg, &g->host_mem, false);
    case 'f':
        g->has_nvme_free = true;
        return parse_bytes("--nvme-free", arg, &g->nvme_free, true);
    case 'r':
        return parse_pos("--nvme-read", arg, &g->nvme_read);
    case 'w':
        return parse_pos("--nvme-write", arg, &g->nvme_write);
    case 'x':
        return parse_pos("--h2d", arg, &g->h2d);
    case 'C':
        return parse_pos("--coll-gbps", arg, &g->coll);
    case 'a':
        return parse_pos("--adam-gelems", arg, &g->adam);
    default:
        return -EINVAL;
    }
}

/* The command line into a and cfg (whose world --devices sets). -1 to go
 * on, else the exit status (0 after --help). */
static int parse_args(int argc, char **argv, fso_config *cfg, plan_args *a)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},     {"set", required_argument, NULL, 's'},
        {"nvme", required_argument, NULL, 'N'},       {"devices", required_argument, NULL, 'D'},
        {"device-mem", required_argument, NULL, 'M'}, {"gpus", required_argument, NULL, 'g'},
        {"gpu", required_argument, NULL, 'G'},        {"gpu-mem", required_argument, NULL, 'm'},
        {"gpu-tflops", required_argument, NULL, 't'}, {"host-mem", required_argument, NULL, 'H'},
        {"nvme-free", required_argument, NULL, 'f'},  {"nvme-read", required_argument, NULL, 'r'},
        {"nvme-write", required_argument, NULL, 'w'}, {"h2d", required_argument, NULL, 'x'},
        {"coll-gbps", required_argument, NULL, 'C'},  {"adam-gelems", required_argument, NULL, 'a'},
        {"probe", no_argument, NULL, 'P'},            {"auto", no_argument, NULL, 'A'},
        {"json", no_argument, NULL, 'J'},             {"help", no_argument, NULL, 'h'},
        {"trace", no_argument, NULL, 'T'},           {"auto-batch", no_argument, NULL, 'B'},
        {"boxes", required_argument, NULL, 'b'},      {"net-gbps", required_argument, NULL, 'n'},
        {NULL, 0, NULL, 0},
    };
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":c:s:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'c':
            a->config_path = optarg;
            break;
        case 's':
            if (!(a->sets[a->nsets++] = strdup(optarg)))
                goto oom;
            break;
        case 'N': { /* a place for state: folders the planner may use, not a pin */
            char buf[4096], why[1024];
            const char *dirs[FSO_STORE_MAX_DIRS];
            /* folders not here are planned for when the drives are described
             * (missing_folders_described) */
            if (fso_nvme_folders_split("--nvme", optarg, false, buf, sizeof buf, dirs, why,
                                       sizeof why) < 0) {
                fprintf(stderr, "fsoff: error: %s\n", why);
                return 2;
            }
            a->nvme = optarg;
            char *lit = fso_json_quote(optarg);
            if (!lit ||
                asprintf(&a->sets[a->nsets++], "zero_optimization.offload_param.nvme_path=%s",
                         lit) < 0 ||
                asprintf(&a->sets[a->nsets++], "zero_optimization.offload_optimizer.nvme_path=%s",
                         lit) < 0) {
                free(lit);
                goto oom;
            }
            free(lit);
            break;
        }
        case 'P':
            a->refresh = true;
            break;
        case 'A':
            a->autoplace = true;
            break;
        case 'J':
            a->json = true;
            break;
        case 'B':
            a->auto_batch = true;
            break;
        case 'T':
            a->trace = true;
            break;
        case 'h':
            plan_usage(stdout);
            return 0;
        case ':':
            fprintf(stderr, "fsoff: error: plan: %s needs a value; see fsoff plan --help\n",
                    argv[optind - 1]);
            return 2;
        case '?':
            fprintf(stderr, "fsoff: error: plan: unknown option '%s'; see fsoff plan --help\n",
                    argv[optind - 1]);
            return 2;
        default:
            if (parse_machine_option(c, optarg, cfg, &a->g) < 0)
                return 2;
            break;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "fsoff: error: plan: unexpected argument '%s'; see fsoff plan --help\n",
                argv[optind]);
        return 2;
    }
    if (a->g.gpus && cfg->world > 1) {
        fprintf(stderr, "fsoff: error: --gpus and --devices cpu:N both give the device count; "
                        "use one\n");
        return 2;
    }
    if (!a->g.gpus && (a->g.gpu || a->g.gpu_mem || a->g.gpu_tflops > 0))
        a->g.gpus = 1;
    /* under mpirun or srun: the launcher's boxes, and the network between
     * them measured (the rail timing a run makes, boxes.h) unless given */
    if (fso_boxes_count() > 1) {
        if (a->g.boxes && a->g.boxes != fso_boxes_count()) {
            fprintf(stderr, "fsoff: error: --boxes %d, but the launcher started %d processes, "
                            "one per box: leave --boxes out under mpirun or srun\n",
                    a->g.boxes, fso_boxes_count());
            return 2;
        }
        a->g.boxes = fso_boxes_count();
        if (!(a->g.net_gbps > 0)) {
            fso_rails r;
            char err[1024];
            if (fso_boxes_rails(1, false, FSO_RAILS_MPI, &r, err, sizeof err) < 0) {
                fprintf(stderr, "fsoff: error: measuring the network between the boxes: %s\n",
                        err);
                return 1;
            }
            fso_boxes_rails_free(&r);
            a->g.net_gbps = fso_boxes_net_gbps();
            if (!a->json)
                printf("plan: network between the %d boxes: %.2f GB/s per box and direction, "
                       "measured now (an 8 MiB all-gather over MPI; --net-gbps sets it)\n",
                       a->g.boxes, a->g.net_gbps);
        }
    }
    if (a->g.boxes > 1 && !(a->g.net_gbps > 0)) {
        fprintf(stderr, "fsoff: error: --boxes %d: the boxes exchange gradients and parameters "
                        "every step, so the plan needs the network between them: give "
                        "--net-gbps GBPS (per box and direction, e.g. --net-gbps 50 for 400 "
                        "Gb/s)\n", a->g.boxes);
        return 2;
    }
    /* --boxes 1 with a rate is one box (a sweep over box counts); a rate
     * alone is a forgotten --boxes */
    if (a->g.net_gbps > 0 && !a->g.boxes) {
        fprintf(stderr, "fsoff: error: --net-gbps %g: the network between boxes, but no "
                        "--boxes: give --boxes B with it, or leave it out\n", a->g.net_gbps);
        return 2;
    }
    return -1;
oom:
    fprintf(stderr, "fsoff: error: out of memory\n");
    return 1;
}

/* The GPU table's entry the options name (--gpu, else the one nearest
 * --gpu-mem, else h100). */
static const fso_gpu_spec *given_gpu(const given *g)
{
    return g->gpu ? fso_gpu_spec_find(g->gpu)
           : g->gpu_mem ? fso_gpu_spec_nearest_mem(g->gpu_mem)
                        : fso_gpu_spec_find("h100");
}

/* What the machine holds, from the options and, for what they leave out,
 * this machine without probing it: devices, memory per device, host
 * memory, NVMe free space. */
static void given_capacities(const given *g, const fso_config *cfg, const char *dirs,
                             fso_plan_machine *m)
{
    m->devices = g->gpus ? g->gpus : fso_config_world(cfg);
    m->host_mem_bytes = g->host_mem ? g->host_mem : fso_mem_usable_bytes();
    m->device_mem_bytes = !g->gpus     ? fso_zero_cpu_device_mem(cfg, m->host_mem_bytes)
                          : g->gpu_mem ? g->gpu_mem
                                       : (uint64_t)(given_gpu(g)->mem_gib * FSO_GIB);
    m->nvme_free_bytes = g->has_nvme_free ? g->nvme_free
                         : dirs[0]        ? fso_plan_folders_free(dirs)
                                          : 0;
    m->boxes = g->boxes;
    m->net_gbps = g->net_gbps;
}

/* The machine: what the options give, the rest from the GPU table (--gpus)
 * or this machine's probes; dirs and missing: the configured NVMe folders
 * here and not here; *tuned_devices: the probed NVMe rates are those of
 * `fsoff bench tune` with that many devices (0: probed). -1 to go on, else
 * the exit status. */
static int describe_machine(const plan_args *a, const fso_config *cfg, fso_plan_machine *m,
                            const fso_gpu_spec **spec, char *dirs, char *missing,
                            int *tuned_devices)
{
    const given *g = &a->g;
    char err[1024];
    fso_plan_nvme_folders(cfg, dirs, 8192, missing, 8192);
    bool need_probe = !g->gpus || !g->host_mem || !(g->adam > 0) ||
                      (dirs[0] && (!(g->nvme_read > 0) || !(g->nvme_write > 0)));
    fso_probe pr = {0};
    if ((a->refresh || need_probe) &&
        fso_plan_probe(cfg, dirs, a->refresh, &pr, err, sizeof err) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", err);
        return 1;
    }
    *tuned_devices = pr.nvme_tuned ? pr.nvme_tuned_devices : 0;
    memset(m, 0, sizeof *m);
    if (g->gpus) {
        *spec = given_gpu(g);
        given_capacities(g, cfg, dirs, m);
        fso_plan_machine_gpu(m, *spec);
        if (g->gpu_tflops > 0)
            m->device_gflops = g->gpu_tflops * 1e3;
        if (g->coll > 0)
            m->coll_gbps = g->coll;
        m->adam_gelems = g->adam > 0 ? g->adam : pr.adam_gelems;
        m->host_copy_gbps = pr.host_copy_gbps > 0 ? pr.host_copy_gbps : 10;
    } else {
        fso_plan_machine_cpu(cfg, &pr, g->host_mem ? g->host_mem : fso_mem_usable_bytes(), m);
        if (g->coll > 0)
            m->coll_gbps = g->coll;
        if (g->adam > 0)
            m->adam_gelems = g->adam;
    }
    if (g->h2d > 0)
        m->h2d_gbps = m->d2h_gbps = g->h2d;
    /* a drive described by its rates: 0.1 ms per request beyond the transfer, as
     * datacenter NVMe drives take for 1 MiB */
    m->nvme_read_gbps = g->nvme_read > 0 ? g->nvme_read : pr.nvme_read_gbps;
    /* probed: writes at the rate they complete at, drained at the flushed rate (planner.h) */
    m->nvme_write_gbps = g->nvme_write > 0 ? g->nvme_write
                         : pr.nvme_write_burst_gbps > pr.nvme_write_gbps ? pr.nvme_write_burst_gbps
                                                                       : pr.nvme_write_gbps;
    m->nvme_drain_gbps = g->nvme_write > 0 ? 0 : pr.nvme_write_gbps;
    /* what the transfers cost the cores was measured on this machine's cores
     * and drives: not a described machine's or drive's */
    m->nvme_read_cpu_s_per_gb = g->gpus || g->nvme_read > 0 ? 0 : pr.nvme_read_cpu_s_per_gb;
    m->nvme_write_cpu_s_per_gb = g->gpus || g->nvme_write > 0 ? 0 : pr.nvme_write_cpu_s_per_gb;
    m->nvme_read_lat_ms = g->nvme_read > 0 ? 0.1 : pr.nvme_read_lat_ms;
    m->nvme_write_lat_ms = g->nvme_write > 0 ? 0.1 : pr.nvme_write_lat_ms;
    m->nvme_free_bytes = g->has_nvme_free ? g->nvme_free
                         : dirs[0]        ? fso_plan_folders_free(dirs)
                                          : 0;
    if (m->nvme_free_bytes && (!(m->nvme_read_gbps > 0) || !(m->nvme_write_gbps > 0))) {
        fprintf(stderr, "fsoff: error: --nvme-free without NVMe rates: give --nvme-read and "
                        "--nvme-write (GB/s), or --nvme DIR to measure a folder\n");
        return 2;
    }
    /* every box the machine described (planner.h) */
    m->boxes = g->boxes;
    m->net_gbps = g->net_gbps;
    return -1;
}

/* NVMe folders given with --nvme that do not exist here can be neither
 * measured nor sized: the drives must then be described (--nvme-free,
 * --nvme-read, --nvme-write). An error line naming what to give, and
 * false, when they are not. (A config's nvme_path not here is planned
 * without, with a note, unless the config pins state there:
 * nvme_pins_have_space.) */
static bool missing_folders_described(const plan_args *a, const char *missing)
{
    const given *g = &a->g;
    if (!missing[0] || !a->nvme || (g->has_nvme_free && g->nvme_read > 0 && g->nvme_write > 0))
        return true;
    char need[96] = "";
    size_t off = 0;
    if (!g->has_nvme_free)
        off += (size_t)snprintf(need + off, sizeof need - off, " --nvme-free SIZE");
    if (!(g->nvme_read > 0))
        off += (size_t)snprintf(need + off, sizeof need - off, " --nvme-read GBPS");
    if (!(g->nvme_write > 0))
        snprintf(need + off, sizeof need - off, " --nvme-write GBPS");
    fprintf(stderr, "fsoff: error: plan: --nvme %s: %s is not a folder on this machine, so "
                    "its speed and free space cannot be measured; to plan for drives "
                    "elsewhere, describe them with%s (e.g. --nvme-free 2T --nvme-read 6 "
                    "--nvme-write 4), or name a folder here\n", a->nvme, missing, need);
    return false;
}

/* State the config pins on NVMe needs NVMe space: an error line, false. */
static bool nvme_pins_have_space(const fso_plan_pins *pins, const fso_plan_machine *m,
                                 const char *missing)
{
    bool nvme_pinned = false;
    for (int k = 0; k < FSO_N_KINDS; k++)
        nvme_pinned = nvme_pinned || pins->tier[k] == FSO_TIER_NVME;
    if (!nvme_pinned || m->nvme_free_bytes)
        return true;
    if (missing[0])
        fprintf(stderr, "fsoff: error: the config keeps state on NVMe in %s (its nvme_path), "
                        "which is not a folder on this machine; give --nvme DIR for a folder "
                        "here, or describe drives elsewhere with --nvme-free SIZE, --nvme-read "
                        "GBPS and --nvme-write GBPS (or --auto to let fsoff choose the tiers)\n",
                missing);
    else
        fprintf(stderr, "fsoff: error: the config keeps state on NVMe but no NVMe space is "
                        "known; give --nvme DIR, or --nvme-free, --nvme-read and "
                        "--nvme-write\n");
    return false;
}

/* What a report shows besides the plan. */
typedef struct plan_report {
    const plan_args *a;
    const fso_config *cfg;
    const fso_plan_ctx *ctx;
    const fso_plan_machine *m;
    const fso_gpu_spec *spec;
    const char *dirs, *missing;
    bool calibrated;
    int tuned_devices;         /* the NVMe rates not given come from `fsoff bench tune` with
                                * this many devices (0: the probe's) */
    const fso_plan *plan;
    const fso_plan *unpinned;  /* the plan with no pins, when it is 5% faster; else NULL */
    const fso_plan_batch *batch; /* the split and where compute hides the optimizer; NULL */
    const char *batch_why;     /* what chose the split ("--auto-batch", "\"auto\""); NULL */
    const char *aio_auto;      /* what aio keys given "auto" became; "" */
} plan_report;

static void print_json(const plan_report *r)
{
    json_t *j = fso_plan_json(r->plan);
    json_object_set_new(j, "n_params", json_integer((json_int_t)r->ctx->n_params));
    json_object_set_new(j, "gpu", json_string(r->spec ? r->spec->name : "cpu"));
    if (r->unpinned)
        json_object_set_new(j, "unpinned_step_ms", json_real(r->unpinned->step_ms));
    if (r->batch)
        json_object_set_new(j, "batch", fso_plan_batch_json(r->batch, r->batch_why != NULL));
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
    if (s)
        printf("%s\n", s);
    free(s);
    json_decref(j);
}

/* A plan for another machine (--gpus) that takes some figures from this
 * one: one line naming each, and the option that gives the target's. */
static void print_borrowed(const plan_report *r)
{
    const given *g = &r->a->g;
    const fso_plan_machine *m = r->m;
    char line[1024], h[32];
    size_t off = 0;
    if (!g->gpus)
        return;
    if (!g->host_mem) {
        fso_human_bytes(h, sizeof h, (double)m->host_mem_bytes);
        off += (size_t)snprintf(line + off, sizeof line - off, "%shost memory %s (--host-mem)",
                                off ? ", " : "", h);
    }
    if (!(g->adam > 0))
        off += (size_t)snprintf(line + off, sizeof line - off, "%sCPU AdamW %.2f Gelem/s "
                                "(--adam-gelems)", off ? ", " : "", m->adam_gelems);
    if (r->dirs[0] && !g->has_nvme_free)
        off += (size_t)snprintf(line + off, sizeof line - off, "%sNVMe free space of %s "
                                "(--nvme-free)", off ? ", " : "", r->dirs);
    if (r->dirs[0] && !(g->nvme_read > 0 && g->nvme_write > 0))
        off += (size_t)snprintf(line + off, sizeof line - off, "%sNVMe rates of %s "
                                "(--nvme-read, --nvme-write)", off ? ", " : "", r->dirs);
    off += (size_t)snprintf(line + off, sizeof line - off, "%shost copies %.1f GB/s",
                            off ? ", " : "", m->host_copy_gbps);
    printf("plan: note: --gpus plans another machine, but these figures are this one's: %s; "
           "give the target's with the options named\n", line);
}

/* The job and the machine, one line each, as the plan table's heading. */
static void print_heading(const plan_report *r)
{
    const fso_config *cfg = r->cfg;
    const fso_model_config *mc = &cfg->model;
    const fso_plan_machine *m = r->m;
    const given *g = &r->a->g;
    const uint64_t n_params = r->ctx->n_params;
    char h1[32], h2[32], h3[32];
    printf("plan: model %s %.*f%s parameters: %d layers, hidden %d, ffn %d, heads %d/%d kv, "
           "vocab %d%s\n", fso_config_choice_name(fso_config_model_type_choices, mc->model_type),
           n_params >= 1e9 ? 2 : 1,
           n_params >= 1e9 ? n_params / 1e9 : n_params / 1e6, n_params >= 1e9 ? "B" : "M",
           mc->num_hidden_layers, mc->hidden_size, mc->intermediate_size,
           mc->num_attention_heads, mc->num_key_value_heads, mc->vocab_size,
           mc->tie_word_embeddings ? ", tied head" : "");
    char boxes[48] = "";
    if (m->boxes > 1)
        snprintf(boxes, sizeof boxes, " x %d boxes", m->boxes);
    printf("plan: batch %d x %d tokens x %d accumulation x %d devices%s = %.0f tokens/step; "
           "activation checkpointing %s; optimizer overlap %s\n",
           cfg->micro_batch, cfg->data.seq_len, cfg->grad_accum, m->devices, boxes,
           r->ctx->in.model.tokens_per_step, cfg->activation_checkpointing ? "on" : "off",
           fso_config_choice_name(fso_config_overlap_choices, r->ctx->in.engine.overlap));
    fso_human_bytes(h1, sizeof h1, (double)m->device_mem_bytes);
    fso_human_bytes(h2, sizeof h2, (double)m->host_mem_bytes);
    fso_human_bytes(h3, sizeof h3, (double)m->nvme_free_bytes);
    if (r->spec)
        printf("plan: machine %d x GPU (%s figures%s): %s each, %.0f TFLOP/s achieved, h2d "
               "%.0f GB/s, all-gather %.0f GB/s; working parameters %s, gradients %s\n",
               m->devices, r->spec->name,
               g->gpu_mem || g->gpu_tflops > 0 || g->h2d > 0 || g->coll > 0 ? " where not given"
                                                                            : "",
               h1, m->device_gflops / 1e3, m->h2d_gbps, m->coll_gbps,
               cfg->bf16 ? "bf16" : "fp32", cfg->bf16_grads ? "fp32, reduced in bf16" : "fp32");
    else
        printf("plan: machine %d CPU device%s (this machine's probes): %s each, %.0f GFLOP/s "
               "each (%s), copies %.1f GB/s, collectives %.1f GB/s; fp32\n",
               m->devices, m->devices == 1 ? "" : "s", h1, m->device_gflops,
               r->calibrated ? "one layer timed" : "sgemm probe", m->h2d_gbps, m->coll_gbps);
    /* the tuned rates are of as many rings as tune was told devices; a
     * plan for another count says so, and how to tune for it */
    char how[160] = "";
    if (g->nvme_read > 0 || !r->dirs[0])
        ;
    else if (!r->tuned_devices)
        snprintf(how, sizeof how, " (probed)");
    else if (r->tuned_devices == m->devices)
        snprintf(how, sizeof how, " (tuned: fsoff bench tune)");
    else
        snprintf(how, sizeof how,
                 " (tuned: fsoff bench tune with %d device%s; this plan has %d: tune again "
                 "with --devices %d)",
                 r->tuned_devices, r->tuned_devices == 1 ? "" : "s", m->devices, m->devices);
    char host_note[192];
    snprintf(host_note, sizeof host_note,
             " (%savailable now less %d%%, at least 1 GiB, left to the machine; --host-mem %s)",
             g->gpus ? "this machine's: " : "", FSO_HOST_HEADROOM_PCT,
             g->gpus ? "gives the target's" : "sets it");
    printf("plan: host %s%s, CPU AdamW %.2f Gelem/s%s; NVMe %s free%s, read %.2f GB/s, "
           "write %.2f GB/s%s\n",
           h2, g->host_mem ? "" : host_note, m->adam_gelems,
           g->adam > 0 ? "" : " (this machine's probe)", h3,
           g->has_nvme_free ? "" : r->dirs[0] ? " (statvfs)" : "", m->nvme_read_gbps,
           m->nvme_write_gbps, how);
    if (m->nvme_read_cpu_s_per_gb > 0 || m->nvme_write_cpu_s_per_gb > 0)
        printf("plan: NVMe on the cores: %.3f s of compute lost per GB read, %.3f per GB "
               "written (probed; the plan puts it on the %s)\n",
               m->nvme_read_cpu_s_per_gb, m->nvme_write_cpu_s_per_gb,
               m->cpu_devices ? "devices' time" : "CPU optimizer's time");
    print_borrowed(r);
    if (m->boxes > 1)
        printf("plan: boxes: %d x %d device%s, each box the machine above; network %.1f GB/s per "
               "box and direction, shared by its %d rail%s, collectives at %.0f%% of "
               "it; each box keeps 1/%d of the optimizer's state and AdamW work: the memory and "
               "times below are one box's\n",
               m->boxes, m->devices, m->devices == 1 ? "" : "s", m->net_gbps, m->devices,
               m->devices == 1 ? "" : "s", 100 * FSO_PLAN_NET_EFFICIENCY, m->boxes);
    if (r->missing[0])
        printf("plan: note: NVMe folder %s does not exist here; %s\n", r->missing,
               g->has_nvme_free ? "NVMe as given by --nvme-free, --nvme-read, --nvme-write"
                                : "planned without it");
}

static void print_text(const plan_report *r)
{
    print_heading(r);
    fso_plan_print(stdout, r->plan);
    if (r->batch)
        fso_plan_batch_print(stdout, r->batch, r->batch_why, r->batch_why != NULL);
    if (r->plan->fits)
        fso_plan_auto_print(stdout, r->cfg, r->plan);
    if (r->aio_auto[0])
        printf("plan: %s\n", r->aio_auto);
    if (r->plan->fits && r->unpinned) {
        char d[512];
        fso_plan_describe(r->unpinned, d, sizeof d);
        printf("plan: note: the config pins offload devices; left to choose, fsoff would "
               "take %s: %.1f ms/step (%.2fx faster); see --auto\n",
               d, r->unpinned->step_ms, r->plan->step_ms / r->unpinned->step_ms);
    }
    print_alternatives(stdout, &r->ctx->in);
    char words[1024];
    fso_plan_search_words(&r->ctx->in, r->plan, words, sizeof words);
    printf("plan: %s\n", words);
    fso_plan_unused_nvme(stdout, r->plan, r->dirs);
    if (r->a->trace)
        fso_plan_trace(&r->ctx->in, &r->plan->pl, stdout);
}

/* Choose, report, and say why when nothing fits: the exit status. */
static int plan_and_report(plan_report *r, const fso_plan_pins *pins)
{
    fso_plan *plan = malloc(sizeof *plan), *unpinned = malloc(sizeof *unpinned);
    int status = 1;
    if (!plan || !unpinned) {
        fprintf(stderr, "fsoff: error: out of memory\n");
        goto out;
    }
    int rc = fso_plan_choose(&r->ctx->in, plan);
    if (rc < 0 && rc != -ENOSPC) {
        fprintf(stderr, "fsoff: error: planner: %s\n", strerror(-rc));
        goto out;
    }
    bool pinned_any = pins->prefetch >= 0;
    for (int k = 0; k < FSO_N_KINDS; k++)
        pinned_any = pinned_any || pins->tier[k] >= 0;
    if (pinned_any) { /* what fsoff would take if left to choose */
        fso_plan_input free_in = r->ctx->in;
        fso_plan_pins_none(&free_in.pins);
        if (fso_plan_choose(&free_in, unpinned) == 0 && unpinned->step_ms < plan->step_ms * 0.95)
            r->unpinned = unpinned;
    }
    r->plan = plan;
    if (r->a->json)
        print_json(r);
    else
        print_text(r);
    fflush(stdout);
    status = 0;
    if (rc == -ENOSPC) {
        char err[2048];
        const given *g = &r->a->g;
        const fso_plan_origin o = {.other_machine = g->gpus > 0, .host_given = g->host_mem != 0,
                                   .device_given = g->device_mem || g->gpu_mem,
                                   .nvme_given = g->has_nvme_free, .nvme_dirs = r->dirs};
        fso_plan_nofit_message(&r->ctx->in, plan, &o, err, sizeof err);
        fprintf(stderr, "fsoff: error: no placement fits: %s\n", err);
        status = 1;
    }
out:
    free(plan);
    free(unpinned);
    return status;
}

int fso_plan_main(int argc, char **argv)
{
    plan_args a = {.sets = calloc(2 * (size_t)argc + 1, sizeof *a.sets)};
    fso_config cfg;
    fso_plan_ctx ctx = {0};
    fso_plan_machine m;
    const fso_gpu_spec *spec = NULL;
    char err[1024], dirs[8192], missing[8192];
    int status;

    fso_config_defaults(&cfg);
    /* across boxes, box 0 prints the plan (every box computes it) */
    if (fso_boxes_self() != 0 && !freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "fsoff: error: /dev/null: %s\n", strerror(errno));
        return 1;
    }
    if (!a.sets) {
        fprintf(stderr, "fsoff: error: out of memory\n");
        return 1;
    }
    if ((status = parse_args(argc, argv, &cfg, &a)) >= 0)
        goto out;
    status = 2;
    if (fso_config_load_all(&cfg, a.config_path, a.sets, a.nsets) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", cfg.err);
        goto out;
    }
    if (a.g.gpus && fso_config_set_world(&cfg, a.g.gpus) < 0) {
        fprintf(stderr, "fsoff: error: --gpus %d: %s\n", a.g.gpus, cfg.err);
        goto out;
    }
    /* the global batch over every box's devices, as the launcher's run has it */
    if (a.g.boxes > 1 && fso_config_set_boxes(&cfg, a.g.boxes, 0) < 0) {
        fprintf(stderr, "fsoff: error: --boxes %d: %s\n", a.g.boxes, cfg.err);
        goto out;
    }
    if (a.g.device_mem)
        cfg.device_mem_bytes = a.g.device_mem;
    char aio_auto[512];
    fso_plan_auto_aio(&cfg, aio_auto, sizeof aio_auto);
    fso_plan_pins pins;
    if (a.autoplace)
        fso_plan_pins_none(&pins);
    else
        fso_plan_pins_from_config(&cfg, &pins);
    /* by arithmetic, before any probe: a model too large for the planner */
    fso_plan_nvme_folders(&cfg, dirs, sizeof dirs, missing, sizeof missing);
    given_capacities(&a.g, &cfg, dirs, &m);
    if (fso_plan_check_size(&cfg, &pins, &m, a.g.gpus > 0, false, err, sizeof err) < 0) {
        fprintf(stderr, "fsoff: error: no placement fits: %s\n", err);
        status = 1;
        goto out;
    }
    int tuned_devices = 0;
    if ((status = describe_machine(&a, &cfg, &m, &spec, dirs, missing, &tuned_devices)) >= 0)
        goto out;
    status = 2;
    if (fso_plan_ctx_init(&ctx, &cfg, &m, a.g.gpus > 0, err, sizeof err) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", err);
        goto out;
    }
    bool calibrated = false;
    if (!a.g.gpus) {
        char cerr[256];
        calibrated = fso_plan_calibrate_cpu(&ctx, &cfg, a.refresh, cerr, sizeof cerr) == 0;
        m.device_gflops = ctx.in.machine.device_gflops;
    }
    ctx.in.pins = pins;
    if (!missing_folders_described(&a, missing) || !nvme_pins_have_space(&pins, &m, missing))
        goto out;
    /* the split of the global batch: advice, taken with --auto-batch or
     * when the config leaves it "auto" */
    fso_plan_batch batch;
    const char *batch_why = NULL;
    bool have_batch = fso_plan_batch_choose(&ctx, &cfg, &batch, err, sizeof err) == 0;
    if (!have_batch)
        fprintf(stderr, "fsoff: warning: plan: the batch split was not planned: %s\n", err);
    else if (batch.step_ms >= 0 && fso_plan_batch_is_free(&cfg, a.auto_batch, &batch_why)) {
        fso_plan_ctx split;
        if (fso_plan_ctx_for_split(&ctx, &cfg, batch.micro, batch.accum, &split, err,
                                   sizeof err) < 0) {
            fprintf(stderr, "fsoff: error: %s\n", err);
            goto out;
        }
        fso_plan_ctx_free(&ctx);
        ctx = split;
        fso_plan_batch_apply(&batch, &cfg);
    } else {
        batch_why = NULL;
    }
    plan_report r = {.a = &a, .cfg = &cfg, .ctx = &ctx, .m = &m, .spec = spec, .dirs = dirs,
                     .missing = missing, .calibrated = calibrated,
                     .tuned_devices = tuned_devices, .batch = have_batch ? &batch : NULL,
                     .batch_why = batch_why, .aio_auto = aio_auto};
    status = plan_and_report(&r, &pins);
out:
    for (int i = 0; i < a.nsets; i++)
        free(a.sets[i]);
    free(a.sets);
    fso_plan_ctx_free(&ctx);
    fso_config_free(&cfg);
    return status;
}
