/* bench_adam.c — `fsoff bench adam`: the fused CPU AdamW pass (offload/adamw.h)
 * in elements/s and GB/s, next to the memory bandwidth of a STREAM triad
 * measured in the same run with the same threads.
 *
 * For each thread count, `reps` rounds of: the triad a[i] = b[i] + s * c[i]
 * over three fp32 arrays, a "touch" pass with AdamW's reads and writes and
 * no arithmetic (the bound for its access pattern), and one AdamW step over
 * `elems` elements; the best (shortest) time of each is reported, as STREAM
 * does. Taking turns spreads a noisy neighbour over all three. Bytes are
 * counted as STREAM counts them: bytes read plus bytes written, no
 * write-allocate traffic. The correctness column counts the elements of a
 * sample (8 windows of 4096, the first and last included) where the first
 * step's output differs from the scalar reference kernel's (it must be
 * bit-identical).
 *
 * Arrays are 2 MiB aligned (transparent huge pages requested) and first
 * touched by the benchmark's own threads, split evenly like the kernel; threads are
 * bound with hwloc to the NUMA node given by --node (default 0), a quiet
 * no-op where binding is not possible.
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
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "adamw.h"
#include "bench.h"
#include "optpool.h"
#include "util.h"

#define DEFAULT_ELEMS ((size_t)32 << 20)
#define DEFAULT_REPS 5
#define MAX_THREAD_COUNTS 32
#define SAMPLE_WINDOWS 8
#define SAMPLE_ELEMS 4096
#define INIT_GRAIN 65536

typedef struct adam_opts {
    size_t elems;
    int threads[MAX_THREAD_COUNTS];
    int n_threads;
    fso_isa isa;
    fso_dtype grad;
    bool out;
    int reps;
    int node;
    const char *json, *plot;
} adam_opts;

typedef struct adam_arrays {
    size_t n;
    float *master, *m, *v;
    void *grad;
    uint16_t *out;
    float *sa, *sb, *sc; /* STREAM */
} adam_arrays;

typedef struct adam_row {
    int threads, bound;
    double ms, elems_per_s, gbps, stream_gbps, fraction, touch_gbps, of_touch;
    long wrong;
} adam_row;

static void adam_usage(FILE *f)
{
    fprintf(f,
            "usage: fsoff bench adam [--elems N] [--threads LIST] [--isa auto|scalar|avx2|avx512]\n"
            "                        [--grad bf16|fp32] [--out bf16|none] [--reps R] [--node N]\n"
            "                        [--json FILE] [--plot FILE.png] [--help]\n\n"
            "Times one fused AdamW pass (gradient in, fp32 master, m and v updated, bf16\n"
            "parameter out) over N elements, and a STREAM triad with the same threads.\n\n"
            "  --elems N        elements (suffix k, M, G: powers of 2; default 32M)\n"
            "  --threads LIST   comma-separated thread counts (default 1,2,... up to the cores)\n"
            "  --isa ISA        kernel (default auto: the widest the CPU has)\n"
            "  --grad TYPE      gradient type (default bf16)\n"
            "  --out TYPE       bf16 parameter output or none (default bf16)\n"
            "  --reps R         timed rounds; the best of each kernel is reported (default %d)\n"
            "  --node N         bind threads to NUMA node N (hwloc); -1: no binding (default 0)\n"
            "  --json FILE      also write the results as one JSON object (\"-\": to stdout\n"
            "                   instead of the table)\n"
            "  --plot FILE.png  draw elements/s against threads, with the memory roof\n",
            DEFAULT_REPS);
}


/* A positive element count up to 2^40, with K/M/G suffixes (powers of 2). */
static int parse_size(const char *s, size_t *out)
{
    uint64_t v;
    if (fso_parse_size(s, &v) < 0 || v == 0 || v > (1ull << 40))
        return -EINVAL;
    *out = (size_t)v;
    return 0;
}

static int parse_threads(const char *s, adam_opts *o)
{
    o->n_threads = 0;
    while (*s) {
        char *end;
        long t = strtol(s, &end, 10);
        if (end == s || t < 1 || t > 1024 || (*end && *end != ','))
            return -EINVAL;
        if (o->n_threads == MAX_THREAD_COUNTS)
            return -E2BIG;
        o->threads[o->n_threads++] = (int)t;
        s = *end ? end + 1 : end;
    }
    return o->n_threads ? 0 : -EINVAL;
}

/* 0 ok, 2 usage error (message printed), -1 --help printed. */
static int parse_opts(int argc, char **argv, adam_opts *o)
{
    static const struct option longopts[] = {
        {"elems", required_argument, NULL, 'n'}, {"threads", required_argument, NULL, 't'},
        {"isa", required_argument, NULL, 'i'},   {"grad", required_argument, NULL, 'g'},
        {"out", required_argument, NULL, 'o'},   {"reps", required_argument, NULL, 'r'},
        {"node", required_argument, NULL, 'N'},  {"json", required_argument, NULL, 'j'},
        {"plot", required_argument, NULL, 'p'},  {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (adam_opts){.elems = DEFAULT_ELEMS, .isa = FSO_ISA_AUTO, .grad = FSO_DT_BF16,
                     .out = true, .reps = DEFAULT_REPS, .node = 0};
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    for (int t = 1; t <= (cores > 0 ? cores : 1) && o->n_threads < MAX_THREAD_COUNTS; t *= 2)
        o->threads[o->n_threads++] = t;
    if (cores > 1 && o->threads[o->n_threads - 1] != cores && o->n_threads < MAX_THREAD_COUNTS)
        o->threads[o->n_threads++] = (int)cores;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'n':
            if (parse_size(optarg, &o->elems) < 0) {
                fprintf(stderr, "fsoff: error: bench adam --elems %s: expected a positive count "
                                "such as 33554432 or 32M\n", optarg);
                return 2;
            }
            break;
        case 't':
            if (parse_threads(optarg, o) < 0) {
                fprintf(stderr, "fsoff: error: bench adam --threads %s: expected a comma-separated "
                                "list of 1..1024 (at most %d entries), e.g. 1,2\n",
                        optarg, MAX_THREAD_COUNTS);
                return 2;
            }
            break;
        case 'i':
            if (fso_isa_parse(optarg, &o->isa) < 0) {
                fprintf(stderr, "fsoff: error: bench adam --isa %s: expected auto, scalar, avx2 "
                                "or avx512\n", optarg);
                return 2;
            }
            break;
        case 'g':
            if (strcmp(optarg, "bf16") == 0)
                o->grad = FSO_DT_BF16;
            else if (strcmp(optarg, "fp32") == 0)
                o->grad = FSO_DT_F32;
            else {
                fprintf(stderr, "fsoff: error: bench adam --grad %s: expected bf16 or fp32\n",
                        optarg);
                return 2;
            }
            break;
        case 'o':
            if (strcmp(optarg, "bf16") == 0)
                o->out = true;
            else if (strcmp(optarg, "none") == 0)
                o->out = false;
            else {
                fprintf(stderr, "fsoff: error: bench adam --out %s: expected bf16 or none\n",
                        optarg);
                return 2;
            }
            break;
        case 'r':
            o->reps = (int)strtol(optarg, &end, 10);
            if (*end || end == optarg || o->reps < 1 || o->reps > 1000) {
                fprintf(stderr, "fsoff: error: bench adam --reps %s: expected 1..1000\n", optarg);
                return 2;
            }
            break;
        case 'N':
            o->node = (int)strtol(optarg, &end, 10);
            if (*end || end == optarg || o->node < -1) {
                fprintf(stderr, "fsoff: error: bench adam --node %s: expected a NUMA node number "
                                "or -1\n", optarg);
                return 2;
            }
            break;
        case 'j':
            o->json = optarg;
            break;
        case 'p':
            if (fso_bench_plot_arg("adam", optarg, &o->plot))
                return 2;
            break;
        case 'h':
            adam_usage(stdout);
            return -1;
        default:
            fprintf(stderr, "fsoff: error: bench adam: unknown option or missing value '%s'; "
                            "see fsoff bench adam --help\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "fsoff: error: bench adam: unexpected argument '%s'; see fsoff bench "
                        "adam --help\n", argv[optind]);
        return 2;
    }
    return 0;
}

/* ---- memory ------------------------------------------------------------- */

static void *big_alloc(size_t bytes)
{
    void *p = NULL;
    size_t align = (size_t)2 << 20;
    bytes = (bytes + align - 1) & ~(align - 1);
    if (posix_memalign(&p, align, bytes) != 0)
        return NULL;
    (void)madvise(p, bytes, MADV_HUGEPAGE); /* a hint; fine if refused */
    return p;
}

static uint32_t hash32(uint64_t i)
{
    i = (i ^ (i >> 33)) * 0xff51afd7ed558ccdull;
    i = (i ^ (i >> 33)) * 0xc4ceb9fe1a85ec53ull;
    return (uint32_t)(i ^ (i >> 33));
}

static float unit_float(uint64_t i) /* [-1, 1) */
{
    return (float)((double)hash32(i) * 0x1.0p-31 - 1.0);
}

typedef struct init_job {
    adam_arrays *a;
    fso_dtype grad;
} init_job;

/* First touch by the benchmark's threads: same split as the kernels. */
static void init_range(void *ctx, int64_t b, int64_t e, int worker)
{
    (void)worker;
    init_job *j = ctx;
    adam_arrays *a = j->a;
    for (int64_t i = b; i < e; i++) {
        float g = 0.01f * unit_float((uint64_t)i * 4 + 1);
        a->master[i] = 0.05f * unit_float((uint64_t)i * 4);
        a->m[i] = 0.1f * g;
        a->v[i] = 0.001f * g * g + 1e-12f;
        if (j->grad == FSO_DT_F32)
            ((float *)a->grad)[i] = g;
        else
            ((uint16_t *)a->grad)[i] = fso_bf16_from_f32(g);
        if (a->out)
            a->out[i] = 0;
        a->sa[i] = 0.0f;
        a->sb[i] = 1.0f;
        a->sc[i] = 2.0f;
    }
}

static void arrays_free(adam_arrays *a)
{
    free(a->master), free(a->m), free(a->v), free(a->grad), free(a->out);
    free(a->sa), free(a->sb), free(a->sc);
    memset(a, 0, sizeof *a);
}

static int arrays_alloc(adam_arrays *a, size_t n, const adam_opts *o)
{
    memset(a, 0, sizeof *a);
    a->n = n;
    size_t f = n * sizeof(float);
    a->master = big_alloc(f), a->m = big_alloc(f), a->v = big_alloc(f);
    a->grad = big_alloc(o->grad == FSO_DT_F32 ? f : n * 2);
    a->out = o->out ? big_alloc(n * 2) : NULL;
    a->sa = big_alloc(f), a->sb = big_alloc(f), a->sc = big_alloc(f);
    if (!a->master || !a->m || !a->v || !a->grad || (o->out && !a->out) || !a->sa || !a->sb ||
        !a->sc) {
        arrays_free(a);
        return -ENOMEM;
    }
    return 0;
}

/* ---- STREAM triad ------------------------------------------------------- */

typedef struct triad_job {
    float *a;
    const float *b, *c;
    float s;
} triad_job;

static void triad_range(void *ctx, int64_t b, int64_t e, int worker)
{
    (void)worker;
    triad_job *j = ctx;
    float *restrict a = j->a;
    const float *restrict x = j->b, *restrict y = j->c;
    const float s = j->s;
    for (int64_t i = b; i < e; i++)
        a[i] = x[i] + s * y[i];
}

/* Seconds one pass of fn over the arrays took. */
static double time_pass(fso_pool *pool, int64_t n, fso_pool_fn fn, void *ctx)
{
    double t0 = (fso_now_ms() / 1e3);
    fso_pool_for(pool, n, INIT_GRAIN, fn, ctx);
    return (fso_now_ms() / 1e3) - t0;
}

/* ---- the same streams without the arithmetic ---------------------------- */

/* Reads and writes exactly what the fused kernel does (gradient in, master,
 * m and v read and written, bf16 out) with one add each: the fastest this
 * access pattern can go on this machine, so adam / touch says how much of
 * the achievable bandwidth the kernel reaches. */
static inline uint16_t trunc_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

typedef struct touch_job {
    adam_arrays *a;
    fso_dtype grad;
} touch_job;

static void touch_range(void *ctx, int64_t b, int64_t e, int worker)
{
    (void)worker;
    touch_job *j = ctx;
    float *restrict master = j->a->master, *restrict m = j->a->m, *restrict v = j->a->v;
    uint16_t *restrict out = j->a->out;
    if (j->grad == FSO_DT_F32) {
        const float *restrict g = j->a->grad;
        if (out)
            for (int64_t i = b; i < e; i++) {
                float p = master[i] + g[i];
                master[i] = p, m[i] += g[i], v[i] += g[i];
                out[i] = (uint16_t)(trunc_bf16(p));
            }
        else
            for (int64_t i = b; i < e; i++)
                master[i] += g[i], m[i] += g[i], v[i] += g[i];
    } else {
        const uint16_t *restrict g = j->a->grad;
        if (out)
            for (int64_t i = b; i < e; i++) {
                float gi = fso_f32_from_bf16(g[i]), p = master[i] + gi;
                master[i] = p, m[i] += gi, v[i] += gi;
                out[i] = (uint16_t)(trunc_bf16(p));
            }
        else
            for (int64_t i = b; i < e; i++) {
                float gi = fso_f32_from_bf16(g[i]);
                master[i] += gi, m[i] += gi, v[i] += gi;
            }
    }
}

/* ---- correctness sample ------------------------------------------------- */

typedef struct sample {
    size_t start[SAMPLE_WINDOWS];
    float master[SAMPLE_WINDOWS][SAMPLE_ELEMS], m[SAMPLE_WINDOWS][SAMPLE_ELEMS],
        v[SAMPLE_WINDOWS][SAMPLE_ELEMS];
    uint16_t out[SAMPLE_WINDOWS][SAMPLE_ELEMS];
    size_t len[SAMPLE_WINDOWS];
} sample;

static void sample_take(sample *s, const adam_arrays *a)
{
    for (int w = 0; w < SAMPLE_WINDOWS; w++) {
        size_t len = a->n < SAMPLE_ELEMS ? a->n : SAMPLE_ELEMS;
        size_t start = w == SAMPLE_WINDOWS - 1 ? a->n - len
                                               : (a->n - len) / (SAMPLE_WINDOWS - 1) * (size_t)w;
        s->start[w] = start, s->len[w] = len;
        memcpy(s->master[w], a->master + start, len * 4);
        memcpy(s->m[w], a->m + start, len * 4);
        memcpy(s->v[w], a->v + start, len * 4);
    }
}

static bool same_f32(float x, float y)
{
    return memcmp(&x, &y, 4) == 0 || (isnan(x) && isnan(y));
}

/* Run the scalar reference on the saved inputs; count elements that differ. */
static long sample_check(sample *s, const adam_arrays *a, fso_dtype grad,
                         const fso_adamw_step *st)
{
    long wrong = 0;
    for (int w = 0; w < SAMPLE_WINDOWS; w++) {
        size_t b = s->start[w], len = s->len[w];
        const void *g = grad == FSO_DT_F32 ? (const void *)((const float *)a->grad + b)
                                           : (const void *)((const uint16_t *)a->grad + b);
        fso_adamw_fused(NULL, s->master[w], g, grad, s->m[w], s->v[w],
                        a->out ? s->out[w] : NULL, len, st);
        for (size_t i = 0; i < len; i++) {
            bool ok = same_f32(s->master[w][i], a->master[b + i]) &&
                      same_f32(s->m[w][i], a->m[b + i]) && same_f32(s->v[w][i], a->v[b + i]);
            if (a->out && s->out[w][i] != a->out[b + i])
                ok = false;
            wrong += !ok;
        }
    }
    return wrong;
}

/* ---- the benchmark ------------------------------------------------------ */

static int run_row(const adam_opts *o, const fso_adamw_kernel *k, adam_arrays *a, bool first,
                   int64_t *step, sample *smp, adam_row *row, int threads, char *note,
                   size_t note_len)
{
    fso_optpool *op = NULL;
    int rc = fso_optpool_create(&op, threads);
    if (rc < 0) {
        snprintf(note, note_len, "cannot start %d threads: %s", threads, strerror(-rc));
        return rc;
    }
    row->threads = threads;
    row->bound = 0;
    if (o->node >= 0) {
        rc = fso_optpool_bind(op, o->node, true);
        if (rc == -EINVAL) {
            snprintf(note, note_len, "--node %d: no such NUMA node (this machine has %d)",
                     o->node, fso_optpool_nodes(op));
            fso_optpool_destroy(op);
            return rc;
        }
        row->bound = rc;
    }
    fso_pool *pool = fso_optpool_pool(op);
    if (first) {
        init_job ij = {a, o->grad};
        fso_pool_for(pool, (int64_t)a->n, INIT_GRAIN, init_range, &ij);
    }
    /* The three kernels take turns, rep by rep, so that a noisy neighbour
     * slows all of them alike; each keeps its best time. */
    triad_job trj = {a->sa, a->sb, a->sc, 3.0f};
    touch_job tj = {a, o->grad};
    double best = INFINITY, stream_s = INFINITY, touch_s = INFINITY;
    row->wrong = 0;
    for (int r = 0; r < o->reps; r++) {
        double dt = time_pass(pool, (int64_t)a->n, triad_range, &trj);
        stream_s = dt < stream_s ? dt : stream_s;
        dt = time_pass(pool, (int64_t)a->n, touch_range, &tj);
        touch_s = dt < touch_s ? dt : touch_s;

        fso_adamw_step st = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                             .weight_decay = 0.1, .grad_scale = 0.8, .t = ++*step};
        if (r == 0)
            sample_take(smp, a);
        double t0 = (fso_now_ms() / 1e3);
        fso_adamw_fused_mt(k, pool, a->master, a->grad, o->grad, a->m, a->v, a->out, a->n, &st);
        dt = (fso_now_ms() / 1e3) - t0;
        best = dt < best ? dt : best;
        if (r == 0)
            row->wrong = sample_check(smp, a, o->grad, &st);
    }
    row->stream_gbps = 12.0 * (double)a->n / stream_s / 1e9;
    double bytes = (o->grad == FSO_DT_F32 ? 4 : 2) + 24 + (o->out ? 2 : 0);
    row->ms = best * 1e3;
    row->elems_per_s = (double)a->n / best;
    row->gbps = bytes * row->elems_per_s / 1e9;
    row->fraction = row->gbps / row->stream_gbps;
    row->touch_gbps = bytes * (double)a->n / touch_s / 1e9;
    row->of_touch = row->gbps / row->touch_gbps;
    fso_optpool_destroy(op);
    return 0;
}

/* The table's comment lines: what each column measures, and the column heads. */
static void print_table_header(const adam_opts *o, const fso_adamw_kernel *k, const char *gname,
                               int bytes, int gbytes, double mib, size_t sampled)
{
    printf("# fsoff bench adam: fused AdamW, kernel %s, grad %s, out %s, %zu elements, "
           "best of %d\n", k->name, gname, o->out ? "bf16" : "none", o->elems, o->reps);
    printf("# bytes/elem %d = grad %d + master 4+4 + m 4+4 + v 4+4%s (read + written, no "
           "write-allocate)\n", bytes, gbytes, o->out ? " + bf16 out 2" : "");
    printf("# stream: triad a[i] = b[i] + s*c[i], 3 x %zu fp32, 12 B/elem, same threads, "
           "best of %d; arrays %.0f MiB in all\n", o->elems, o->reps, mib);
    printf("# touch: the same reads and writes with one add per element instead of AdamW "
           "(the bound for this access pattern), %d B/elem\n", bytes);
    printf("# fraction = bw / stream; of_touch = bw / touch; wrong: elements of a "
           "%zu-element sample that differ from the scalar kernel\n", sampled);
    if (o->node >= 0)
        printf("# threads bound to NUMA node %d with hwloc (bound: how many; 0 where binding "
               "is not possible)\n", o->node);
    else
        printf("# threads not bound (--node -1)\n");
    printf("#\n");
    printf("# %7s %12s %9s %9s %8s %8s %8s %8s %8s %6s %6s\n", "threads", "elems", "time",
           "elems/s", "bw", "stream", "fraction", "touch", "of_touch", "bound", "wrong");
    printf("# %7s %12s %9s %9s %8s %8s %8s %8s %8s %6s %6s\n", "", "", "ms", "G/s", "GB/s",
           "GB/s", "", "GB/s", "", "", "");
    fflush(stdout);
}

/* The JSON record of a run: its settings and one object per row measured. */
static json_t *rows_record(const adam_opts *o, const fso_adamw_kernel *k, const char *gname,
                           int bytes, bool ok, const adam_row *rows, int done)
{
    json_t *res = json_array();
    for (int t = 0; t < done; t++) {
        const adam_row *r = &rows[t];
        json_array_append_new(res, json_pack("{s:i, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, "
                                             "s:i, s:I}", "threads", r->threads, "elems",
                                             (json_int_t)o->elems, "elems_per_s",
                                             r->elems_per_s, "gbps", r->gbps, "stream_gbps",
                                             r->stream_gbps, "fraction", r->fraction,
                                             "touch_gbps", r->touch_gbps, "of_touch",
                                             r->of_touch, "ms", r->ms, "bound", r->bound,
                                             "wrong", (json_int_t)r->wrong));
    }
    return json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:b, s:o}", "bench", "adam",
                     "kernel", k->name, "grad", gname, "out", o->out ? "bf16" : "none",
                     "bytes_per_elem", bytes, "reps", o->reps, "node", o->node, "ok", ok,
                     "results", res);
}

int fso_bench_adam(int argc, char **argv)
{
    adam_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;

    const fso_adamw_kernel *k;
    rc = fso_adamw_select(o.isa, &k);
    if (rc < 0) {
        fprintf(stderr, "fsoff: error: bench adam --isa %s: %s; choose --isa auto\n",
                fso_isa_name(o.isa),
                rc == -ENOTSUP ? "this CPU (or this build) does not have it" : strerror(-rc));
        return 2;
    }
    if (o.node >= 0) { /* a node that does not exist is a usage error, found before any output */
        fso_optpool *probe = NULL;
        rc = fso_optpool_create(&probe, 1);
        if (rc == 0 && fso_optpool_bind(probe, o.node, false) == -EINVAL) {
            fprintf(stderr, "fsoff: error: bench adam --node %d: no such NUMA node (this machine "
                            "has %d); use --node -1 for no binding\n", o.node,
                    fso_optpool_nodes(probe));
            fso_optpool_destroy(probe);
            return 2;
        }
        fso_optpool_destroy(probe);
    }
    int gbytes = o.grad == FSO_DT_F32 ? 4 : 2, obytes = o.out ? 2 : 0;
    int bytes = gbytes + 24 + obytes;
    double mib = (double)o.elems * (12 + gbytes + obytes + 12) / (1 << 20);

    adam_arrays a;
    if (arrays_alloc(&a, o.elems, &o) < 0) {
        fprintf(stderr, "fsoff: error: bench adam: cannot allocate %.0f MiB for %zu elements; "
                        "use a smaller --elems\n", mib, o.elems);
        return 1;
    }
    sample *smp = malloc(sizeof *smp);
    adam_row *rows = calloc((size_t)o.n_threads, sizeof *rows);
    if (!smp || !rows) {
        free(smp), free(rows), arrays_free(&a);
        fprintf(stderr, "fsoff: error: bench adam: out of memory\n");
        return 1;
    }

    const char *gname = o.grad == FSO_DT_F32 ? "fp32" : "bf16";
    size_t sampled = SAMPLE_WINDOWS * (o.elems < SAMPLE_ELEMS ? o.elems : SAMPLE_ELEMS);
    const bool table = fso_bench_table(o.json);
    if (table)
        print_table_header(&o, k, gname, bytes, gbytes, mib, sampled);

    int64_t step = 0;
    long wrong = 0;
    int done = 0;
    char note[256] = "";
    for (int t = 0; t < o.n_threads; t++) {
        adam_row *r = &rows[t];
        if (run_row(&o, k, &a, t == 0, &step, smp, r, o.threads[t], note, sizeof note) < 0)
            break;
        done++;
        wrong += r->wrong;
        if (table) {
            printf("  %7d %12zu %9.2f %9.3f %8.2f %8.2f %8.3f %8.2f %8.3f %6d %6ld\n", r->threads,
                   o.elems, r->ms, r->elems_per_s / 1e9, r->gbps, r->stream_gbps, r->fraction,
                   r->touch_gbps, r->of_touch, r->bound, r->wrong);
            fflush(stdout);
        }
    }
    bool ok = done == o.n_threads && wrong == 0;
    if (table) {
        double avg = 0.0, avg_touch = 0.0;
        for (int t = 0; t < done; t++)
            avg += rows[t].fraction, avg_touch += rows[t].of_touch;
        printf("# Avg fraction of STREAM: %.3f, of touch: %.3f\n", done ? avg / done : 0.0,
               done ? avg_touch / done : 0.0);
        printf("# Correctness: %s (%ld wrong of %zu sampled per row, bit for bit against scalar)\n",
               ok ? "OK" : "FAILED", wrong, sampled);
    }
    int out = 0;
    if (o.json || o.plot)
        out = fso_bench_output("adam", rows_record(&o, k, gname, bytes, ok, rows, done), o.json,
                               o.plot);
    if (done < o.n_threads)
        fprintf(stderr, "fsoff: error: bench adam: %s\n", note);
    free(smp);
    free(rows);
    arrays_free(&a);
    return ok ? out : 1;
}
