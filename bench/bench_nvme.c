/* bench_nvme.c — `fsoff bench nvme`: sequential write and read GB/s of the
 * NVMe store (offload/store_uring.c) over block sizes and queue depths.
 *
 * For each block size a store of --size bytes is created over the folders
 * (O_DIRECT, stripe unit = block size) with one registered buffer area of
 * max(qd) blocks. The store is first written whole, untimed: a new file's
 * extents are "unwritten" to the filesystem, and a first write into them
 * also converts them, which a training step's writes (into state written at
 * start) never pay. Then, for each queue depth, the whole store is written,
 * keeping qd requests of one block in flight, and read back the same way. Every
 * 4 KiB page written carries its address and a hash of it (mixed with a
 * per-run seed); the read pass checks both, so the "correct" column catches
 * misplaced, stale, zero or torn pages. GB are 1e9 bytes, like fio.
 *
 * A write pass has two rates. "speed" is timed to its last completion: what
 * a burst of that size takes, which a cache in front of the drive (a virtual
 * disk's host page cache, a drive's DRAM) absorbs at several times the rate
 * the drive drains. "flushed" is timed through a final fsync of the store
 * (store.h flush; fio's --end_fsync): what the drive itself takes, and what
 * a training step that writes more than the cache holds gets. Before each
 * write pass the store is flushed untimed, so no pass pays for what an
 * earlier one left in the cache.
 *
 * --json and --plot as every benchmark (bench.h): the object has "results":
 * [{"op", "block_bytes", "queue_depth", "gbps", ...}], write rows also
 * "flushed_gbps" and "flushed_seconds", which bench/nvme_vs_fio.sh and
 * `fsoff plot` read. */
#include "bench.h"
#include "store.h"
#include "util.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NV_MAX_LIST 16
#define NV_MAX_QD 1024

typedef struct nv_args {
    const char *dirs[FSO_STORE_MAX_DIRS];
    int ndirs;
    uint64_t size_bytes;
    size_t blocks[NV_MAX_LIST];
    int nblocks;
    int qds[NV_MAX_LIST];
    int nqds;
    const char *json, *plot;
    char dirbuf[4096];
} nv_args;

typedef struct nv_result {
    bool write;
    size_t block_bytes;
    int queue_depth;
    uint64_t bytes;
    double seconds;             /* to the last completion */
    double flushed_seconds;     /* writes: through the final flush */
    bool correct;
} nv_result;

static void nv_usage(FILE *f)
{
    fprintf(f,
            "usage: fsoff bench nvme --nvme DIR[,DIR...] [options]\n"
            "\n"
            "Sequential write, then read, of the NVMe store (io_uring, O_DIRECT, striped over\n"
            "the folders), for every block size and queue depth; reads are checked page by page.\n"
            "\n"
            "  --nvme DIR[,DIR...]    folders to stripe over (files fsoff-bench.N are created\n"
            "                         there and removed at the end)\n"
            "  --size BYTES           bytes written and read per point (default 256M; K/M/G/T)\n"
            "  --block-sizes LIST     request sizes, also the stripe unit (default 128K,1M,4M)\n"
            "  --queue-depths LIST    requests in flight (default 1,4,16,32)\n"
            "  --json FILE            also write the results as one JSON object (\"-\": to\n"
            "                         stdout instead of the table)\n"
            "  --plot FILE.png        draw GB/s against request size, a line per queue depth:\n"
            "                         writes timed to completion, writes timed through a\n"
            "                         final flush, reads\n"
            "  -h, --help             this help\n"
            "\n"
            "Writes are timed twice: to their last completion (a burst, which a write cache\n"
            "takes) and through a final fsync of the files (what the drive itself takes).\n");
}

static int nv_parse_args(nv_args *a, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"nvme", required_argument, NULL, 'n'},
        {"size", required_argument, NULL, 's'},
        {"block-sizes", required_argument, NULL, 'b'},
        {"queue-depths", required_argument, NULL, 'q'},
        {"json", required_argument, NULL, 'j'},
        {"plot", required_argument, NULL, 'p'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *blocks = "128K,1M,4M", *qds = "1,4,16,32";
    uint64_t v[NV_MAX_LIST];
    a->size_bytes = (uint64_t)256 << 20;
    optind = 0; /* glibc: start over, whoever parsed before */
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case 'n':
            a->ndirs = fso_bench_dirs("nvme", optarg, a->dirbuf, sizeof a->dirbuf, a->dirs);
            if (a->ndirs < 0)
                return 2;
            break;
        case 's':
            if (fso_parse_size(optarg, &a->size_bytes) < 0 || a->size_bytes == 0 ||
                a->size_bytes % FSO_IO_PAGE)
                return fso_bench_bad("nvme", "--size %s: expected a positive multiple of 4K "
                                     "(e.g. 256M, 1G)", optarg);
            break;
        case 'b': blocks = optarg; break;
        case 'q': qds = optarg; break;
        case 'j': a->json = optarg; break;
        case 'p': if (fso_bench_plot_arg("nvme", optarg, &a->plot)) return 2; break;
        case 'h': nv_usage(stdout); return 0;
        case ':': return fso_bench_bad("nvme", "%s needs a value", argv[optind - 1]);
        default: return fso_bench_bad("nvme", "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return fso_bench_bad("nvme", "unexpected argument '%s'", argv[optind]);
    if (a->ndirs == 0)
        return fso_bench_bad("nvme", "--nvme DIR is required");
    a->nblocks = fso_bench_list(blocks, true, FSO_IO_PAGE, (uint64_t)1 << 30, v, NV_MAX_LIST);
    if (a->nblocks < 0)
        return fso_bench_bad("nvme", "--block-sizes %s: expected up to %d multiples of 4K up to "
                             "1G", blocks, NV_MAX_LIST);
    for (int i = 0; i < a->nblocks; i++) {
        if (v[i] > a->size_bytes)
            return fso_bench_bad("nvme", "--block-sizes %s: %" PRIu64 " is larger than --size",
                                 blocks, v[i]);
        a->blocks[i] = (size_t)v[i];
    }
    a->nqds = fso_bench_list(qds, false, 1, NV_MAX_QD, v, NV_MAX_LIST);
    if (a->nqds < 0)
        return fso_bench_bad("nvme", "--queue-depths %s: expected up to %d numbers from 1 to %d",
                             qds, NV_MAX_LIST, NV_MAX_QD);
    for (int i = 0; i < a->nqds; i++)
        a->qds[i] = (int)v[i];
    return -1; /* go on */
}

static uint64_t nv_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Every page of a block written at addr carries addr ^ seed first and its hash last. */
static void nv_stamp(char *buf, size_t len, uint64_t addr, uint64_t seed)
{
    for (size_t p = 0; p < len; p += FSO_IO_PAGE) {
        uint64_t tag = (addr + p) ^ seed, h = nv_mix(tag);
        memcpy(buf + p, &tag, 8);
        memcpy(buf + p + FSO_IO_PAGE - 8, &h, 8);
    }
}

static uint64_t nv_check(const char *buf, size_t len, uint64_t addr, uint64_t seed)
{
    uint64_t bad = 0;
    for (size_t p = 0; p < len; p += FSO_IO_PAGE) {
        uint64_t tag, h;
        memcpy(&tag, buf + p, 8);
        memcpy(&h, buf + p + FSO_IO_PAGE - 8, 8);
        bad += tag != ((addr + p) ^ seed) || h != nv_mix(tag);
    }
    return bad;
}


/* One sequential pass over the store; a write pass is also timed through
 * the flush that follows its last completion. 0 or -errno (message in
 * s->err). */
static int nv_pass(fso_store *s, nv_result *r, char *area, uint64_t seed, uint64_t *bad_pages)
{
    size_t bs = r->block_bytes;
    int qd = r->queue_depth;
    uint64_t n = r->bytes / bs, next = 0, done = 0;
    int free_slots[NV_MAX_QD], nfree = 0;
    fso_io io[NV_MAX_QD];
    for (int i = qd - 1; i >= 0; i--)
        free_slots[nfree++] = i;
    double t0 = (fso_now_ms() / 1e3);
    while (done < n) {
        while (nfree > 0 && next < n) {
            int slot = free_slots[--nfree];
            char *buf = area + (size_t)slot * bs;
            uint64_t user = next * NV_MAX_QD + (uint64_t)slot;
            int rc;
            if (r->write) {
                nv_stamp(buf, bs, next * bs, seed);
                rc = s->ops->prep_write(s, buf, bs, next * bs, user);
            } else {
                rc = s->ops->prep_read(s, buf, bs, next * bs, user);
            }
            if (rc < 0)
                return rc;
            next++;
        }
        int rc = s->ops->submit(s);
        if (rc < 0)
            return rc;
        int got = s->ops->reap(s, io, qd, 1);
        if (got < 0)
            return got;
        for (int i = 0; i < got; i++) {
            int slot = (int)(io[i].user % NV_MAX_QD);
            uint64_t blk = io[i].user / NV_MAX_QD;
            if (io[i].res < 0) {
                /* let the rest finish so the store can be destroyed cleanly */
                fso_io sink[NV_MAX_QD];
                while (s->inflight > 0 && s->ops->reap(s, sink, NV_MAX_QD, 1) > 0)
                    ;
                return (int)io[i].res;
            }
            if (!r->write)
                *bad_pages += nv_check(area + (size_t)slot * bs, bs, blk * bs, seed);
            free_slots[nfree++] = slot;
            done++;
        }
    }
    r->seconds = (fso_now_ms() / 1e3) - t0;
    if (r->write) {
        int rc = fso_store_flush(s);
        if (rc < 0)
            return rc;
        r->flushed_seconds = (fso_now_ms() / 1e3) - t0;
    }
    return 0;
}

static double nv_gbps(const nv_result *r)
{
    return r->seconds > 0 ? (double)r->bytes / r->seconds / 1e9 : 0;
}

static double nv_flushed_gbps(const nv_result *r)
{
    return r->flushed_seconds > 0 ? (double)r->bytes / r->flushed_seconds / 1e9 : 0;
}

static void nv_print_row(const nv_result *r)
{
    char fl[16] = "-";
    if (r->write)
        snprintf(fl, sizeof fl, "%.3f", nv_flushed_gbps(r));
    printf("  %5s  %10zu  %4d  %12" PRIu64 "  %9.2f  %8.3f  %8s  %7s\n",
           r->write ? "write" : "read", r->block_bytes, r->queue_depth, r->bytes,
           r->seconds * 1e3, nv_gbps(r), fl, r->correct ? "OK" : "FAILED");
    fflush(stdout);
}

/* A run over the block sizes: the I/O buffer area (max block x max qd),
 * the data seed, the results so far and what the stores could do. */
typedef struct nv_run {
    char *area;
    size_t area_bytes;
    int max_qd;
    uint64_t seed;
    nv_result *res;
    int nres;
    bool direct, registered, header;
    uint64_t total_bad;
} nv_run;

/* Maps the buffer area with random contents and allocates the results.
 * 0, or 1 after one error line (nothing left to free). */
static int nv_run_init(nv_run *r, const nv_args *a)
{
    size_t max_block = 0;
    memset(r, 0, sizeof *r);
    for (int i = 0; i < a->nblocks; i++)
        if (a->blocks[i] > max_block)
            max_block = a->blocks[i];
    for (int i = 0; i < a->nqds; i++)
        if (a->qds[i] > r->max_qd)
            r->max_qd = a->qds[i];
    r->area_bytes = max_block * (size_t)r->max_qd;
    r->area = fso_io_alloc(r->area_bytes);
    if (!r->area) {
        char b[32];
        fso_human_bytes(b, sizeof b, (double)r->area_bytes);
        fprintf(stderr, "fsoff: error: bench nvme: cannot map %s of I/O buffers; lower "
                "--block-sizes or --queue-depths\n", b);
        return 1;
    }
    /* Random contents once; each write stamps its pages. */
    uint64_t x = nv_mix((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32));
    r->seed = nv_mix(x);
    for (size_t i = 0; i < r->area_bytes; i += 8) {
        x = nv_mix(x);
        memcpy(r->area + i, &x, 8);
    }
    r->res = calloc((size_t)(2 * a->nblocks * a->nqds), sizeof *r->res);
    if (!r->res) {
        fso_io_free(r->area, r->area_bytes);
        fprintf(stderr, "fsoff: error: bench nvme: out of memory\n");
        return 1;
    }
    r->direct = r->registered = true;
    return 0;
}

/* The table's header, once the first store says whether it got O_DIRECT
 * and registered buffers. */
static void nv_print_header(const nv_args *a, const nv_run *r)
{
    char sz[32];
    fso_human_bytes(sz, sizeof sz, (double)a->size_bytes);
    printf("# fsoff bench nvme: %s per point over %d folder%s:", sz, a->ndirs,
           a->ndirs == 1 ? "" : "s");
    for (int i = 0; i < a->ndirs; i++)
        printf("%s%s", i ? "," : " ", a->dirs[i]);
    printf("\n# io_uring, O_DIRECT: %s, registered buffers: %s, fixed files, stripe unit = "
           "block;\n"
           "# each store written once before the timed passes; speed: timed to the last\n"
           "# completion (a burst, which a write cache takes); flushed: writes timed through\n"
           "# a final fsync (fio's --end_fsync: what the drive takes), the store flushed\n"
           "# untimed before each write pass\n",
           r->direct ? "yes" : "NO (buffered: the page cache flatters these numbers)",
           r->registered ? "yes" : "no");
    printf("#\n#    op       block    qd         bytes       time     speed   flushed  correct\n");
    printf("#            (bytes)                (B)       (ms)    (GB/s)    (GB/s)\n");
}

/* The points of block size a->blocks[bi] on their own store: the store
 * created and written once untimed, then a write and a read pass per queue
 * depth, each checked against its own seed. 0, or 1 after one error line. */
static int nv_block(nv_run *r, const nv_args *a, int bi)
{
    fso_store_opts o;
    memset(&o, 0, sizeof o);
    for (int i = 0; i < a->ndirs; i++)
        o.dirs[i] = a->dirs[i];
    o.ndirs = a->ndirs;
    o.capacity_bytes = a->size_bytes;
    o.block_bytes = a->blocks[bi];
    o.queue_depth = r->max_qd;
    o.direct = true;
    o.file_prefix = "fsoff-bench";
    fso_store *s = NULL;
    char err[FSO_STORE_ERR_MAX];
    if (fso_store_open_uring(&s, &o, err, sizeof err) < 0) {
        fprintf(stderr, "fsoff: error: bench nvme: %s\n", err);
        return 1;
    }
    r->direct = r->direct && s->direct;
    if (r->registered && s->ops->register_buffers(s, r->area, r->area_bytes) < 0) {
        fprintf(stderr, "fsoff: warning: bench nvme: %s; measuring without registered "
                "buffers\n", s->err);
        r->registered = false;
    }
    const uint64_t bytes = a->size_bytes / a->blocks[bi] * a->blocks[bi];
    nv_result fill = {true, a->blocks[bi], r->max_qd, bytes, 0, 0, true};
    uint64_t unused = 0;
    int status = 0;
    if (nv_pass(s, &fill, r->area, r->seed, &unused) < 0) {
        fprintf(stderr, "fsoff: error: bench nvme: %s\n", s->err);
        fso_store_destroy(s);
        return 1;
    }
    if (!r->header && fso_bench_table(a->json)) {
        nv_print_header(a, r);
        r->header = true;
    }
    for (int qi = 0; qi < a->nqds; qi++) {
        nv_result *w = &r->res[r->nres], *rd = &r->res[r->nres + 1];
        *w = (nv_result){true, a->blocks[bi], a->qds[qi], bytes, 0, 0, true};
        *rd = (nv_result){false, a->blocks[bi], a->qds[qi], bytes, 0, 0, true};
        uint64_t bad = 0;
        r->seed = nv_mix(r->seed); /* each point checks its own data */
        /* what earlier passes left in a cache is drained first, untimed */
        int rc = fso_store_flush(s);
        if (rc == 0)
            rc = nv_pass(s, w, r->area, r->seed, &bad);
        if (rc == 0)
            rc = nv_pass(s, rd, r->area, r->seed, &bad);
        if (rc < 0) {
            fprintf(stderr, "fsoff: error: bench nvme: %s\n", s->err);
            status = 1;
            break;
        }
        w->correct = rd->correct = bad == 0;
        r->total_bad += bad;
        r->nres += 2;
        if (fso_bench_table(a->json)) {
            nv_print_row(w);
            nv_print_row(rd);
        }
    }
    fso_store_destroy(s);
    return status;
}

/* The table's footer and the JSON object; the exit status. */
static int nv_report(const nv_args *a, const nv_run *r)
{
    double sum[2] = {0, 0}, flushed = 0;
    int cnt[2] = {0, 0};
    for (int i = 0; i < r->nres; i++) {
        sum[r->res[i].write] += nv_gbps(&r->res[i]);
        flushed += nv_flushed_gbps(&r->res[i]);
        cnt[r->res[i].write]++;
    }
    bool ok = r->total_bad == 0;
    if (fso_bench_table(a->json)) {
        printf("# Pages read back wrong: %" PRIu64 "\n", r->total_bad);
        printf("# Avg bandwidth: write %.3f GB/s (flushed %.3f GB/s), read %.3f GB/s%s\n",
               cnt[1] ? sum[1] / cnt[1] : 0.0, cnt[1] ? flushed / cnt[1] : 0.0,
               cnt[0] ? sum[0] / cnt[0] : 0.0, r->direct ? "" : " (buffered I/O: not disk speed)");
        printf("# %s\n", ok ? "OK" : "FAILED");
    }
    int out = 0;
    if (a->json || a->plot) {
        const nv_result *res = r->res;
        json_t *dirs = json_array(), *rows = json_array();
        for (int i = 0; i < a->ndirs; i++)
            json_array_append_new(dirs, json_string(a->dirs[i]));
        for (int i = 0; i < r->nres; i++) {
            json_t *row = json_pack("{s:s, s:I, s:i, s:f, s:I, s:f, s:b}", "op",
                                    res[i].write ? "write" : "read", "block_bytes",
                                    (json_int_t)res[i].block_bytes, "queue_depth",
                                    res[i].queue_depth, "gbps", nv_gbps(&res[i]), "bytes",
                                    (json_int_t)res[i].bytes, "seconds", res[i].seconds,
                                    "correct", res[i].correct);
            if (res[i].write) {
                json_object_set_new(row, "flushed_gbps", json_real(nv_flushed_gbps(&res[i])));
                json_object_set_new(row, "flushed_seconds", json_real(res[i].flushed_seconds));
            }
            json_array_append_new(rows, row);
        }
        json_t *rec = json_pack("{s:s, s:s, s:o, s:I, s:b, s:b, s:b, s:o}", "bench", "nvme",
                                "tool", "fsoff", "folders", dirs, "size_bytes",
                                (json_int_t)a->size_bytes, "direct", r->direct,
                                "registered_buffers", r->registered, "correct", ok, "results",
                                rows);
        out = fso_bench_output("nvme", rec, a->json, a->plot);
    }
    return ok ? out : 1;
}

int fso_bench_nvme(int argc, char **argv)
{
    nv_args a;
    nv_run r;
    memset(&a, 0, sizeof a);
    int rc = nv_parse_args(&a, argc, argv);
    if (rc >= 0)
        return rc;
    if (nv_run_init(&r, &a) != 0)
        return 1;
    int status = 0;
    for (int bi = 0; bi < a.nblocks && status == 0; bi++)
        status = nv_block(&r, &a, bi);
    fso_io_free(r.area, r.area_bytes);
    if (status == 0)
        status = nv_report(&a, &r);
    free(r.res);
    return status;
}
