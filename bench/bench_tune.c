/* bench_tune.c — `fsoff bench tune`: the NVMe store's best request size,
 * queue depth and number of rings on these folders, in well under a minute,
 * and the `aio` section that gets them.
 *
 * tune_sweep.c measures (see there for how). The sweep's points are short,
 * so their writes land in whatever cache sits in front of the drive; the
 * planner takes a write rate timed through a flush to the drive instead.
 * So the choice is made with the rates the planner will use: at --devices
 * rings, each request size at its best queue depth by the sweep (a byte read
 * plus a byte written fastest) has its writes measured again, timed until
 * flushed to the drive (fso_tune_flushed_write); the aio section is the one
 * of them that moves a byte read (the sweep's rate) plus a byte written (the
 * flushed rate) fastest, and among those within 5% of it the one with the
 * least in flight (size x depth: pinned staging memory, waits). Training
 * reads and writes through one aio.block_size and aio.queue_depth. Those
 * rates go to the probe cache (probe.h), where the planner's NVMe figures
 * come from, and --write-config merges the section into a config.
 */
#include "bench.h"
#include "plot.h"
#include "probe.h"
#include "store.h"
#include "tune_sweep.h"
#include "util.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TN_NEAR 0.95          /* within 5% of the best counts as a tie */

typedef struct tn_args {
    const char *dirs[FSO_STORE_MAX_DIRS];
    int ndirs;
    char dirbuf[4096];
    char dirlist[4096];       /* as given, for the probe cache key */
    uint64_t size_bytes;      /* per ring */
    double seconds;           /* per point */
    double budget_s;          /* for the whole sweep's repeat samples */
    size_t blocks[FSO_TUNE_MAX_LIST];
    int nblocks;
    int qds[FSO_TUNE_MAX_LIST];
    int nqds;
    int rings[FSO_TUNE_MAX_LIST];
    int nrings;
    int devices;
    bool save;                /* record in the probe cache */
    const char *json, *plot, *config;
} tn_args;

/* ------------------------------------------------------------------ args */

static void tn_usage(FILE *f)
{
    fprintf(f,
            "usage: fsoff bench tune --nvme DIR[,DIR...] [options]\n"
            "\n"
            "Sweep the NVMe store's request size, queue depth and rings (one per training\n"
            "device) on these folders, print the best settings for reading and for writing and\n"
            "the aio section to use, and record the tuned rates for the planner. Under a\n"
            "minute with the defaults (35 to 50 s on a 1 GB/s disk).\n"
            "\n"
            "  --nvme DIR[,DIR...]    folders to stripe over, as for training (files\n"
            "                         fsoff-tune<ring>-<size>.N are created there, removed)\n"
            "  --devices N            devices you will train with: the aio section is chosen\n"
            "                         for N rings (default 1)\n"
            "  --rings LIST           ring counts to sweep (default 1,2; N is added)\n"
            "  --block-sizes LIST     request sizes (default 128K,256K,512K,1M,2M,4M)\n"
            "  --queue-depths LIST    requests in flight per ring, up to 32 (default\n"
            "                         1,2,4,8,16,32)\n"
            "  --seconds S            time per point (default 0.12)\n"
            "  --budget S             stop taking repeat samples of the contenders after S\n"
            "                         seconds in all (default 45; 0: no limit)\n"
            "  --size BYTES           region each ring reads and writes per request size\n"
            "                         (default 128M; the files take sizes x rings x this)\n"
            "  --write-config FILE    put the aio section into FILE (a JSON config; other keys\n"
            "                         are kept; created if missing)\n"
            "  --no-save              do not record the tuned rates in the probe cache\n"
            "  --json FILE            also write the results as one JSON object (\"-\": to\n"
            "                         stdout instead of the table)\n"
            "  --plot FILE.png        draw GB/s against request size: a row of panels per\n"
            "                         ring count, a line per queue depth, the writes timed\n"
            "                         through a flush, and the chosen setting marked\n"
            "  -h, --help             this help\n");
}

static int tn_parse(tn_args *a, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"nvme", required_argument, NULL, 'n'},
        {"devices", required_argument, NULL, 'd'},
        {"rings", required_argument, NULL, 'r'},
        {"block-sizes", required_argument, NULL, 'b'},
        {"queue-depths", required_argument, NULL, 'q'},
        {"seconds", required_argument, NULL, 's'},
        {"budget", required_argument, NULL, 'B'},
        {"size", required_argument, NULL, 'S'},
        {"write-config", required_argument, NULL, 'w'},
        {"no-save", no_argument, NULL, 'N'},
        {"json", required_argument, NULL, 'j'},
        {"plot", required_argument, NULL, 'p'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *blocks = "128K,256K,512K,1M,2M,4M", *qds = "1,2,4,8,16,32", *rings = "1,2";
    uint64_t v[FSO_TUNE_MAX_LIST];
    a->size_bytes = (uint64_t)128 << 20;
    a->seconds = 0.12;
    a->budget_s = 45;
    a->devices = 1;
    a->save = true;
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case 'n':
            a->ndirs = fso_bench_dirs("tune", optarg, a->dirbuf, sizeof a->dirbuf, a->dirs);
            if (a->ndirs < 0)
                return 2;
            snprintf(a->dirlist, sizeof a->dirlist, "%s", optarg);
            break;
        case 'd': {
            char *end;
            long d = strtol(optarg, &end, 10);
            if (!*optarg || *end || d < 1 || d > FSO_TUNE_MAX_RINGS)
                return fso_bench_bad("tune", "--devices %s: expected 1 to %d", optarg,
                                     FSO_TUNE_MAX_RINGS);
            a->devices = (int)d;
            break;
        }
        case 'r': rings = optarg; break;
        case 'b': blocks = optarg; break;
        case 'q': qds = optarg; break;
        case 's': {
            char *end;
            a->seconds = strtod(optarg, &end);
            if (!*optarg || *end || !(a->seconds >= 0.01 && a->seconds <= 10))
                return fso_bench_bad("tune", "--seconds %s: expected 0.01 to 10", optarg);
            break;
        }
        case 'B': {
            char *end;
            a->budget_s = strtod(optarg, &end);
            if (!*optarg || *end || !(a->budget_s >= 0 && a->budget_s <= 3600))
                return fso_bench_bad("tune", "--budget %s: expected 0 to 3600 seconds (0: no "
                                     "limit)", optarg);
            break;
        }
        case 'S':
            if (fso_parse_size(optarg, &a->size_bytes) < 0 || a->size_bytes < ((uint64_t)1 << 20))
                return fso_bench_bad("tune", "--size %s: expected a size of 1M or more (e.g. "
                                     "256M)", optarg);
            break;
        case 'w': a->config = optarg; break;
        case 'N': a->save = false; break;
        case 'j': a->json = optarg; break;
        case 'p': if (fso_bench_plot_arg("tune", optarg, &a->plot)) return 2; break;
        case 'h': tn_usage(stdout); return 0;
        case ':': return fso_bench_bad("tune", "%s needs a value", argv[optind - 1]);
        default: return fso_bench_bad("tune", "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return fso_bench_bad("tune", "unexpected argument '%s'", argv[optind]);
    if (a->ndirs == 0)
        return fso_bench_bad("tune", "--nvme DIR is required");
    a->nblocks = fso_bench_list(blocks, true, FSO_IO_PAGE, (uint64_t)1 << 30, v, FSO_TUNE_MAX_LIST);
    if (a->nblocks < 0)
        return fso_bench_bad("tune", "--block-sizes %s: expected up to %d multiples of 4K up to "
                             "1G", blocks, FSO_TUNE_MAX_LIST);
    for (int i = 0; i < a->nblocks; i++)
        a->blocks[i] = (size_t)v[i];
    a->nqds = fso_bench_list(qds, false, 1, FSO_TUNE_MAX_QD, v, FSO_TUNE_MAX_LIST);
    if (a->nqds < 0)
        return fso_bench_bad("tune", "--queue-depths %s: expected up to %d numbers from 1 to %d "
                             "(aio.queue_depth's range)", qds, FSO_TUNE_MAX_LIST, FSO_TUNE_MAX_QD);
    for (int i = 0; i < a->nqds; i++)
        a->qds[i] = (int)v[i];
    a->nrings = fso_bench_list(rings, false, 1, FSO_TUNE_MAX_RINGS, v, FSO_TUNE_MAX_LIST);
    if (a->nrings < 0)
        return fso_bench_bad("tune", "--rings %s: expected up to %d numbers from 1 to %d", rings,
                             FSO_TUNE_MAX_LIST, FSO_TUNE_MAX_RINGS);
    bool have = false;
    for (int i = 0; i < a->nrings; i++) {
        a->rings[i] = (int)v[i];
        have = have || a->rings[i] == a->devices;
    }
    if (!have) {
        if (a->nrings == FSO_TUNE_MAX_LIST)
            return fso_bench_bad("tune", "--rings %s: at most %d when --devices is not among "
                                 "them", rings, FSO_TUNE_MAX_LIST - 1);
        a->rings[a->nrings++] = a->devices;
    }
    size_t max_block = 0;
    for (int i = 0; i < a->nblocks; i++)
        max_block = a->blocks[i] > max_block ? a->blocks[i] : max_block;
    const uint64_t region = a->size_bytes / max_block * max_block;
    for (int i = 0; i < a->nblocks; i++)
        for (int j = 0; j < a->nqds; j++)
            if ((uint64_t)a->blocks[i] * (uint64_t)a->qds[j] > region)
                return fso_bench_bad("tune", "%zu x queue depth %d is more than --size; raise "
                                     "--size or lower the sizes or depths", a->blocks[i],
                                     a->qds[j]);
    return -1; /* go on */
}

/* ------------------------------------------------------------------ --write-config */

/* The config at path (an empty object when there is none), or NULL with an
 * error printed. */
static json_t *tn_config_load(const char *path)
{
    json_error_t je;
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            return json_object();
        fprintf(stderr, "fsoff: error: bench tune: --write-config %s: %s\n", path, strerror(errno));
        return NULL;
    }
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        fprintf(stderr, "fsoff: error: bench tune: --write-config %s:%d:%d: not valid JSON (%s); "
                "fix the file or give another one, it is left as it is\n", path, je.line,
                je.column, je.text);
        return NULL;
    }
    json_t *aio = json_object_get(root, "aio");
    if (!json_is_object(root) || (aio && !json_is_object(aio))) {
        fprintf(stderr, "fsoff: error: bench tune: --write-config %s: %s is not a JSON object; "
                "fix the file or give another one, it is left as it is\n", path,
                json_is_object(root) ? "\"aio\"" : "the file");
        json_decref(root);
        return NULL;
    }
    return root;
}

/* Sets aio.block_size and aio.queue_depth in the config at path, keeping
 * everything else; through a temporary file and a rename. 0 or 1. */
static int tn_config_write(const char *path, size_t block, int qd)
{
    json_t *root = tn_config_load(path);
    if (!root)
        return 1;
    json_t *aio = json_object_get(root, "aio");
    if (!aio) {
        aio = json_object();
        json_object_set_new(root, "aio", aio);
    }
    json_object_set_new(aio, "block_size", json_integer((json_int_t)block));
    json_object_set_new(aio, "queue_depth", json_integer(qd));
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.fsoff-tune.%d", path, (int)getpid());
    errno = 0;
    int rc = json_dump_file(root, tmp, JSON_INDENT(2)) == 0 && rename(tmp, path) == 0 ? 0 : 1;
    if (rc) {
        fprintf(stderr, "fsoff: error: bench tune: --write-config %s: cannot write it: %s\n", path,
                strerror(errno ? errno : EIO));
        unlink(tmp);
    }
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------ the choice */

/* The best point with `rings` under ranking k; among the points within
 * `near` of the top, the one with the least in flight (block x qd). -1 when
 * no point has those rings. */
static int tn_best(const fso_tune_point *pts, int n, int rings, fso_tune_rank k, double near)
{
    double top = 0;
    for (int i = 0; i < n; i++)
        if (pts[i].rings == rings && fso_tune_score(&pts[i], k) > top)
            top = fso_tune_score(&pts[i], k);
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (pts[i].rings != rings || fso_tune_score(&pts[i], k) < near * top)
            continue;
        if (best < 0 || pts[i].block * (size_t)pts[i].qd < pts[best].block * (size_t)pts[best].qd)
            best = i;
    }
    return best;
}

typedef struct tn_choice {
    int read, write;          /* the fastest reader and writer at --devices rings (sweep) */
    int ncand;                /* request sizes measured through a flush */
    int cand[FSO_TUNE_MAX_LIST]; /* each size's best point at --devices rings (sweep) */
    double flushed[FSO_TUNE_MAX_LIST]; /* its writes timed until flushed to the drive */
    int pick;                 /* the aio section's setting: an index into cand */
    double lat_ms[2];         /* [write]: one request alone, beyond its transfer time */
} tn_choice;

/* Seconds to read one GB at the sweep's rate and write one at the flushed
 * rate: what ranks a setting for the planner. */
static double tn_planner_cost(const fso_tune_point *p, double flushed)
{
    double r = fso_tune_rate(p, 0);
    return r > 0 && flushed > 0 ? 1 / r + 1 / flushed : INFINITY;
}

/* The candidates: at --devices rings, each request size's best point by the
 * sweep's read plus write; each measured again with its writes timed until
 * flushed. 0, or 1 after one error line. */
static int tn_flush_candidates(const tn_args *a, const fso_tune_sweep *sw, tn_choice *c)
{
    const fso_tune_point *pts = sw->pts;
    c->ncand = 0;
    for (int b = 0; b < a->nblocks; b++) {
        int best = -1;
        for (int i = 0; i < sw->npts; i++)
            if (pts[i].bi == b && pts[i].rings == a->devices &&
                (best < 0 || fso_tune_score(&pts[i], FSO_TUNE_BOTH) >
                                 fso_tune_score(&pts[best], FSO_TUNE_BOTH)))
                best = i;
        if (best < 0)
            continue;
        double f = fso_tune_flushed_write(sw, &pts[best]);
        if (f <= 0)
            return 1;
        c->cand[c->ncand] = best;
        c->flushed[c->ncand++] = f;
    }
    return c->ncand > 0 ? 0 : 1;
}

/* Chooses among the candidates by the planner's rates (tn_planner_cost);
 * within TN_NEAR of the best, the least in flight. */
static void tn_choose(const tn_args *a, const fso_tune_point *pts, int npts, tn_choice *c)
{
    c->read = tn_best(pts, npts, a->devices, FSO_TUNE_READ, 1);
    c->write = tn_best(pts, npts, a->devices, FSO_TUNE_WRITE, 1);
    double top = INFINITY;
    for (int i = 0; i < c->ncand; i++)
        top = fmin(top, tn_planner_cost(&pts[c->cand[i]], c->flushed[i]));
    c->pick = -1;
    for (int i = 0; i < c->ncand; i++) {
        const fso_tune_point *p = &pts[c->cand[i]];
        if (!(tn_planner_cost(p, c->flushed[i]) * TN_NEAR <= top))
            continue;
        if (c->pick < 0 || p->block * (size_t)p->qd <
                               pts[c->cand[c->pick]].block * (size_t)pts[c->cand[c->pick]].qd)
            c->pick = i;
    }
    if (c->pick < 0)
        c->pick = 0;
    /* the picked size at queue depth 1 on one ring: its time per request
     * beyond the transfer time at the picked rate */
    const fso_tune_point *pick = &pts[c->cand[c->pick]];
    c->lat_ms[0] = c->lat_ms[1] = 0;
    for (int i = 0; i < npts; i++)
        if (pts[i].block == pick->block && pts[i].qd == 1 && pts[i].rings == 1)
            for (int w = 0; w < 2; w++) {
                double one = fso_tune_rate(&pts[i], w), full = fso_tune_rate(pick, w);
                double ms = one > 0 && full > 0
                                ? ((double)pick->block / (one * 1e9) -
                                   (double)pick->block / (full * 1e9)) * 1e3 : 0;
                c->lat_ms[w] = ms > 0 ? ms : 0;
            }
}

/* The pick and its flushed write rate. */
static const fso_tune_point *tn_pick(const fso_tune_sweep *sw, const tn_choice *c)
{
    return &sw->pts[c->cand[c->pick]];
}

static double tn_pick_flushed(const tn_choice *c)
{
    return c->flushed[c->pick];
}

/* ------------------------------------------------------------------ output */

static void tn_print_grid(const tn_args *a, const fso_tune_point *pts, int npts, int write,
                          int rings)
{
    printf("# %s GB/s, %d ring%s (rows: request size; columns: queue depth per ring)\n",
           write ? "write" : "read", rings, rings == 1 ? "" : "s");
    printf("#  size");
    for (int q = 0; q < a->nqds; q++)
        printf(" %7d", a->qds[q]);
    printf("\n");
    for (int b = 0; b < a->nblocks; b++) {
        char l[32];
        fso_plot_size_label(l, sizeof l, (double)a->blocks[b]);
        printf("  %6s", l);
        for (int q = 0; q < a->nqds; q++)
            for (int i = 0; i < npts; i++)
                if (pts[i].bi == b && pts[i].qd == a->qds[q] && pts[i].rings == rings)
                    printf(" %7.3f", fso_tune_rate(&pts[i], write));
        printf("\n");
    }
}

static void tn_print(const tn_args *a, const fso_tune_sweep *sw, const tn_choice *c)
{
    const fso_tune_point *pts = sw->pts, *pick = tn_pick(sw, c);
    printf("# %s%s\n#\n", sw->direct ? "io_uring, O_DIRECT" : "io_uring, BUFFERED (the "
           "filesystem refused O_DIRECT: the page cache flatters these numbers)",
           sw->registered ? ", registered buffers, fixed files" : ", fixed files");
    for (int r = 0; r < a->nrings; r++)
        for (int w = 1; w >= 0; w--)
            tn_print_grid(a, pts, sw->npts, w, a->rings[r]);
    printf("#\n# medians; contenders (within %.0f%% of the best) measured %d times, the rest "
           "once%s\n", 100 * FSO_TUNE_CONTEND, FSO_TUNE_SAMPLES, sw->over_budget ?
           " (the time budget ran out first: some contenders have fewer samples; raise "
           "--budget)" : "");
    for (int r = 0; r < a->nrings; r++) {
        int br = tn_best(pts, sw->npts, a->rings[r], FSO_TUNE_READ, 1);
        int bw = tn_best(pts, sw->npts, a->rings[r], FSO_TUNE_WRITE, 1);
        char l1[32], l2[32];
        fso_plot_size_label(l1, sizeof l1, (double)pts[bw].block);
        fso_plot_size_label(l2, sizeof l2, (double)pts[br].block);
        printf("#   %d ring%s best write %s x qd %d: %.3f GB/s; best read %s x qd %d: "
               "%.3f GB/s\n", a->rings[r], a->rings[r] == 1 ? ": " : "s:", l1, pts[bw].qd,
               fso_tune_rate(&pts[bw], 1), l2, pts[br].qd, fso_tune_rate(&pts[br], 0));
    }
    printf("# writes timed until flushed to the drive, %d ring%s, each size at its best "
           "queue depth above (a cache in front of the drive takes bursts faster than it "
           "drains):\n", a->devices, a->devices == 1 ? "" : "s");
    for (int i = 0; i < c->ncand; i++) {
        const fso_tune_point *p = &pts[c->cand[i]];
        char l[32];
        fso_plot_size_label(l, sizeof l, (double)p->block);
        printf("#   %6s x qd %2d: flushed %.3f GB/s (the sweep's burst %.3f), read %.3f "
               "GB/s%s\n", l, p->qd, c->flushed[i], fso_tune_rate(p, 1), fso_tune_rate(p, 0),
               i == c->pick ? "  <- chosen" : "");
    }
    char l[32];
    fso_plot_size_label(l, sizeof l, (double)pick->block);
    printf("# for %d device%s (one ring each): request size %s, queue depth %d: read %.3f GB/s, "
           "write %.3f GB/s flushed (%.3f burst): chosen by the read rate and the flushed "
           "write rate, the rates the planner takes\n", a->devices, a->devices == 1 ? "" : "s",
           l, pick->qd, fso_tune_rate(pick, 0), tn_pick_flushed(c), fso_tune_rate(pick, 1));
    printf("# the aio section to use:\n\"aio\": {\"block_size\": %zu, \"queue_depth\": %d}\n",
           pick->block, pick->qd);
}

/* The tuned rates into the probe cache; 0 or 1. */
static int tn_record(const tn_args *a, const fso_tune_point *pick, const tn_choice *c,
                     bool table)
{
    char path[PATH_MAX], err[1024];
    fso_probe_tuned t;
    memset(&t, 0, sizeof t);
    fso_probe_key(t.key, sizeof t.key, a->dirlist);
    t.when = (int64_t)time(NULL);
    t.devices = a->devices;
    t.block_bytes = pick->block;
    t.queue_depth = pick->qd;
    t.read_gbps = fso_tune_rate(pick, 0);
    t.write_gbps = tn_pick_flushed(c) < fso_tune_rate(pick, 1) ? tn_pick_flushed(c)
                                                                : fso_tune_rate(pick, 1);
    t.read_lat_ms = c->lat_ms[0];
    t.write_lat_ms = c->lat_ms[1];
    if (fso_probe_cache_path(path, sizeof path) < 0) {
        fprintf(stderr, "fsoff: warning: bench tune: neither XDG_CACHE_HOME nor HOME is set; "
                "the tuned rates are not recorded for the planner\n");
        return 0;
    }
    if (fso_probe_tuned_save(path, &t, err, sizeof err) < 0) {
        fprintf(stderr, "fsoff: error: bench tune: %s\n", err);
        return 1;
    }
    if (table)
        printf("# tuned rates recorded for the planner in %s\n", path);
    return 0;
}

static json_t *tn_point_json(const fso_tune_point *p)
{
    return json_pack("{s:I, s:i, s:i, s:f, s:f}", "block_bytes", (json_int_t)p->block,
                     "queue_depth", p->qd, "rings", p->rings, "read_gbps", fso_tune_rate(p, 0),
                     "write_gbps", fso_tune_rate(p, 1));
}

static json_t *tn_json(const tn_args *a, const fso_tune_sweep *sw, const tn_choice *c,
                       double elapsed)
{
    const fso_tune_point *pts = sw->pts;
    json_t *dirs = json_array(), *rows = json_array();
    for (int i = 0; i < a->ndirs; i++)
        json_array_append_new(dirs, json_string(a->dirs[i]));
    for (int i = 0; i < sw->npts; i++)
        for (int w = 1; w >= 0; w--) {
            json_t *row = json_pack("{s:s, s:I, s:i, s:i, s:f, s:i}", "op",
                                    w ? "write" : "read", "block_bytes",
                                    (json_int_t)pts[i].block, "queue_depth", pts[i].qd, "rings",
                                    pts[i].rings, "gbps", fso_tune_rate(&pts[i], w), "samples",
                                    pts[i].n[w]);
            for (int j = 0; j < c->ncand && w; j++) /* writes timed through a flush */
                if (c->cand[j] == i)
                    json_object_set_new(row, "flushed_gbps", json_real(c->flushed[j]));
            json_array_append_new(rows, row);
        }
    const fso_tune_point *chosen = tn_pick(sw, c);
    json_t *pick = tn_point_json(chosen);
    json_object_set_new(pick, "read_lat_ms", json_real(c->lat_ms[0]));
    json_object_set_new(pick, "write_lat_ms", json_real(c->lat_ms[1]));
    json_object_set_new(pick, "flushed_write_gbps", json_real(tn_pick_flushed(c)));
    json_object_set_new(pick, "chosen_by", json_string("read_gbps and flushed_write_gbps"));
    return json_pack("{s:s, s:s, s:o, s:I, s:f, s:i, s:b, s:b, s:o, s:{s:o, s:o}, s:o, "
                     "s:{s:I, s:i}, s:f}", "bench", "tune", "tool", "fsoff", "folders", dirs,
                     "size_bytes", (json_int_t)sw->region_bytes, "seconds_per_point",
                     a->seconds, "devices", a->devices, "direct", sw->direct,
                     "registered_buffers", sw->registered, "results", rows, "best", "read",
                     tn_point_json(&pts[c->read]), "write", tn_point_json(&pts[c->write]),
                     "chosen", pick, "aio", "block_size", (json_int_t)chosen->block,
                     "queue_depth", chosen->qd, "elapsed_s", elapsed);
}

/* ------------------------------------------------------------------ main */

int fso_bench_tune(int argc, char **argv)
{
    tn_args a;
    memset(&a, 0, sizeof a);
    int rc = tn_parse(&a, argc, argv);
    if (rc >= 0)
        return rc;
    if (a.config) { /* a file that cannot take the section fails now, not after the sweep */
        json_t *cfg = tn_config_load(a.config);
        if (!cfg)
            return 2;
        json_decref(cfg);
    }
    const double t_start = fso_now_ms();
    const bool table = fso_bench_table(a.json);
    fso_tune_sweep sw = {.dirs = a.dirs, .ndirs = a.ndirs, .blocks = a.blocks,
                         .nblocks = a.nblocks, .seconds = a.seconds, .budget_s = a.budget_s};
    size_t max_block = 0;
    for (int i = 0; i < a.nrings; i++)
        sw.max_rings = a.rings[i] > sw.max_rings ? a.rings[i] : sw.max_rings;
    for (int i = 0; i < a.nblocks; i++)
        max_block = a.blocks[i] > max_block ? a.blocks[i] : max_block;
    sw.region_bytes = a.size_bytes / max_block * max_block;
    sw.npts = a.nblocks * a.nqds * a.nrings;
    sw.pts = calloc((size_t)sw.npts, sizeof *sw.pts);
    if (!sw.pts) {
        fprintf(stderr, "fsoff: error: bench tune: out of memory\n");
        return 1;
    }
    int k = 0; /* sizes change fastest: neighbours in a line are measured apart in time */
    for (int r = 0; r < a.nrings; r++)
        for (int q = 0; q < a.nqds; q++)
            for (int b = 0; b < a.nblocks; b++)
                sw.pts[k++] = (fso_tune_point){.bi = b, .block = a.blocks[b], .qd = a.qds[q],
                                               .rings = a.rings[r]};
    if (table) {
        char sz[32];
        fso_human_bytes(sz, sizeof sz, (double)sw.region_bytes);
        printf("# fsoff bench tune: %s; %d request sizes x %d queue depths x %d ring counts, "
               "%.2f s per point, %s per ring and size\n", a.dirlist, a.nblocks, a.nqds,
               a.nrings, a.seconds, sz);
        fflush(stdout);
    }
    int status = fso_tune_run(&sw);
    if (status) {
        free(sw.pts);
        return status;
    }
    tn_choice c;
    if (tn_flush_candidates(&a, &sw, &c) != 0) {
        free(sw.pts);
        return 1;
    }
    tn_choose(&a, sw.pts, sw.npts, &c);
    const fso_tune_point *pick = tn_pick(&sw, &c);
    const double elapsed = (fso_now_ms() - t_start) / 1e3;
    if (table)
        tn_print(&a, &sw, &c);
    if (a.save)
        status = tn_record(&a, pick, &c, table);
    if (a.config && status == 0) {
        status = tn_config_write(a.config, pick->block, pick->qd);
        if (status == 0 && table)
            printf("# aio section written to %s\n", a.config);
    }
    if (table) {
        printf("# done in %.1f s\n", elapsed);
        fflush(stdout);
    }
    if (a.json || a.plot) {
        json_t *rec = tn_json(&a, &sw, &c, elapsed);
        json_object_set_new(rec, "over_budget", json_boolean(sw.over_budget));
        int out = fso_bench_output("tune", rec, a.json, a.plot);
        status = status ? status : out;
    }
    free(sw.pts);
    return status;
}
