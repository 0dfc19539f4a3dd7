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
 * --json and --plot as every benchmark (bench.h): the object has "results":
 * [{"op", "block_bytes", "queue_depth", "gbps", ...}], which
 * bench/nvme_vs_fio.sh and `fsoff plot` read. */
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
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define NV_MAX_LIST 16
#define NV_MAX_QD 1024
#define NV_PAGE 4096

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
    double seconds;
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
            "  --plot FILE.png        draw GB/s against request size, a line per queue depth\n"
            "  -h, --help             this help\n");
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
                a->size_bytes % NV_PAGE)
                return fso_bench_bad("nvme", "--size %s: expected a positive multiple of 4K "
                                     "(e.g. 256M, 1G)", optarg);
            break;
        case 'b': blocks = optarg; break;
        case 'q': qds = optarg; break;
        case 'j': a->json = optarg; break;
        case 'p': a->plot = optarg; break;
        case 'h': nv_usage(stdout); return 0;
        case ':': return fso_bench_bad("nvme", "%s needs a value", argv[optind - 1]);
        default: return fso_bench_bad("nvme", "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return fso_bench_bad("nvme", "unexpected argument '%s'", argv[optind]);
    if (a->ndirs == 0)
        return fso_bench_bad("nvme", "--nvme DIR is required");
    a->nblocks = fso_bench_list(blocks, true, NV_PAGE, (uint64_t)1 << 30, v, NV_MAX_LIST);
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
    for (size_t p = 0; p < len; p += NV_PAGE) {
        uint64_t tag = (addr + p) ^ seed, h = nv_mix(tag);
        memcpy(buf + p, &tag, 8);
        memcpy(buf + p + NV_PAGE - 8, &h, 8);
    }
}

static uint64_t nv_check(const char *buf, size_t len, uint64_t addr, uint64_t seed)
{
    uint64_t bad = 0;
    for (size_t p = 0; p < len; p += NV_PAGE) {
        uint64_t tag, h;
        memcpy(&tag, buf + p, 8);
        memcpy(&h, buf + p + NV_PAGE - 8, 8);
        bad += tag != ((addr + p) ^ seed) || h != nv_mix(tag);
    }
    return bad;
}


/* One sequential pass over the store; 0 or -errno (message in s->err). */
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
    return 0;
}

static double nv_gbps(const nv_result *r)
{
    return r->seconds > 0 ? (double)r->bytes / r->seconds / 1e9 : 0;
}

static void nv_print_row(const nv_result *r)
{
    printf("  %5s  %10zu  %4d  %12" PRIu64 "  %9.2f  %8.3f  %7s\n", r->write ? "write" : "read",
           r->block_bytes, r->queue_depth, r->bytes, r->seconds * 1e3, nv_gbps(r),
           r->correct ? "OK" : "FAILED");
    fflush(stdout);
}

int fso_bench_nvme(int argc, char **argv)
{
    nv_args a;
    memset(&a, 0, sizeof a);
    int rc = nv_parse_args(&a, argc, argv);
    if (rc >= 0)
        return rc;

    size_t max_block = 0;
    int max_qd = 0;
    for (int i = 0; i < a.nblocks; i++)
        if (a.blocks[i] > max_block)
            max_block = a.blocks[i];
    for (int i = 0; i < a.nqds; i++)
        if (a.qds[i] > max_qd)
            max_qd = a.qds[i];
    size_t area_bytes = max_block * (size_t)max_qd;
    char *area = mmap(NULL, area_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED) {
        char b[32];
        fso_human_bytes(b, sizeof b, (double)area_bytes);
        fprintf(stderr, "fsoff: error: bench nvme: cannot map %s of I/O buffers; lower "
                "--block-sizes or --queue-depths\n", b);
        return 1;
    }
    /* Random contents once; each write stamps its pages. */
    uint64_t x = nv_mix((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32));
    uint64_t seed = nv_mix(x);
    for (size_t i = 0; i < area_bytes; i += 8) {
        x = nv_mix(x);
        memcpy(area + i, &x, 8);
    }

    nv_result *res = calloc((size_t)(2 * a.nblocks * a.nqds), sizeof *res);
    if (!res) {
        munmap(area, area_bytes);
        fprintf(stderr, "fsoff: error: bench nvme: out of memory\n");
        return 1;
    }
    int nres = 0, status = 0;
    bool direct = true, registered = true, header = false;
    uint64_t total_bad = 0;
    char sz[32];
    fso_human_bytes(sz, sizeof sz, (double)a.size_bytes);

    for (int bi = 0; bi < a.nblocks && status == 0; bi++) {
        fso_store_opts o;
        memset(&o, 0, sizeof o);
        for (int i = 0; i < a.ndirs; i++)
            o.dirs[i] = a.dirs[i];
        o.ndirs = a.ndirs;
        o.capacity_bytes = a.size_bytes;
        o.block_bytes = a.blocks[bi];
        o.queue_depth = max_qd;
        o.direct = true;
        o.file_prefix = "fsoff-bench";
        fso_store *s = NULL;
        char err[FSO_STORE_ERR_MAX];
        rc = fso_store_open_uring(&s, &o, err, sizeof err);
        if (rc < 0) {
            fprintf(stderr, "fsoff: error: bench nvme: %s\n", err);
            status = 1;
            break;
        }
        direct = direct && s->direct;
        if (registered && s->ops->register_buffers(s, area, area_bytes) < 0) {
            fprintf(stderr, "fsoff: warning: bench nvme: %s; measuring without registered "
                    "buffers\n", s->err);
            registered = false;
        }
        nv_result fill = {true, a.blocks[bi], max_qd, a.size_bytes / a.blocks[bi] * a.blocks[bi],
                          0, true};
        uint64_t unused = 0;
        if (nv_pass(s, &fill, area, seed, &unused) < 0) {
            fprintf(stderr, "fsoff: error: bench nvme: %s\n", s->err);
            fso_store_destroy(s);
            status = 1;
            break;
        }
        if (!header && fso_bench_table(a.json)) {
            printf("# fsoff bench nvme: %s per point over %d folder%s:", sz, a.ndirs,
                   a.ndirs == 1 ? "" : "s");
            for (int i = 0; i < a.ndirs; i++)
                printf("%s%s", i ? "," : " ", a.dirs[i]);
            printf("\n# io_uring, O_DIRECT: %s, registered buffers: %s, fixed files, stripe unit = "
                   "block;\n"
                   "# each store written once before the timed passes\n",
                   direct ? "yes" : "NO (buffered: the page cache flatters these numbers)",
                   registered ? "yes" : "no");
            printf("#\n#    op       block    qd         bytes       time     speed  correct\n");
            printf("#            (bytes)                (B)       (ms)    (GB/s)\n");
            header = true;
        }
        for (int qi = 0; qi < a.nqds && status == 0; qi++) {
            nv_result *w = &res[nres], *r = &res[nres + 1];
            uint64_t bytes = a.size_bytes / a.blocks[bi] * a.blocks[bi];
            *w = (nv_result){true, a.blocks[bi], a.qds[qi], bytes, 0, true};
            *r = (nv_result){false, a.blocks[bi], a.qds[qi], bytes, 0, true};
            uint64_t bad = 0;
            seed = nv_mix(seed); /* each point checks its own data */
            rc = nv_pass(s, w, area, seed, &bad);
            if (rc == 0)
                rc = nv_pass(s, r, area, seed, &bad);
            if (rc < 0) {
                fprintf(stderr, "fsoff: error: bench nvme: %s\n", s->err);
                status = 1;
                break;
            }
            w->correct = r->correct = bad == 0;
            total_bad += bad;
            nres += 2;
            if (fso_bench_table(a.json)) {
                nv_print_row(w);
                nv_print_row(r);
            }
        }
        fso_store_destroy(s);
    }
    munmap(area, area_bytes);
    if (status) {
        free(res);
        return status;
    }

    double sum[2] = {0, 0};
    int cnt[2] = {0, 0};
    for (int i = 0; i < nres; i++) {
        sum[res[i].write] += nv_gbps(&res[i]);
        cnt[res[i].write]++;
    }
    bool ok = total_bad == 0;
    if (fso_bench_table(a.json)) {
        printf("# Pages read back wrong: %" PRIu64 "\n", total_bad);
        printf("# Avg bandwidth: write %.3f GB/s, read %.3f GB/s%s\n",
               cnt[1] ? sum[1] / cnt[1] : 0.0, cnt[0] ? sum[0] / cnt[0] : 0.0,
               direct ? "" : " (buffered I/O: not disk speed)");
        printf("# %s\n", ok ? "OK" : "FAILED");
    }
    int out = 0;
    if (a.json || a.plot) {
        json_t *dirs = json_array(), *rows = json_array();
        for (int i = 0; i < a.ndirs; i++)
            json_array_append_new(dirs, json_string(a.dirs[i]));
        for (int i = 0; i < nres; i++)
            json_array_append_new(rows, json_pack("{s:s, s:I, s:i, s:f, s:I, s:f, s:b}", "op",
                                                  res[i].write ? "write" : "read", "block_bytes",
                                                  (json_int_t)res[i].block_bytes, "queue_depth",
                                                  res[i].queue_depth, "gbps", nv_gbps(&res[i]),
                                                  "bytes", (json_int_t)res[i].bytes, "seconds",
                                                  res[i].seconds, "correct", res[i].correct));
        json_t *rec = json_pack("{s:s, s:s, s:o, s:I, s:b, s:b, s:b, s:o}", "bench", "nvme",
                                "tool", "fsoff", "folders", dirs, "size_bytes",
                                (json_int_t)a.size_bytes, "direct", direct, "registered_buffers",
                                registered, "correct", ok, "results", rows);
        out = fso_bench_output("nvme", rec, a.json, a.plot);
    }
    free(res);
    return ok ? out : 1;
}
