/* plot_bench.c — the charts of `fsoff bench` results (plot.h), from the
 * JSON object each benchmark writes with --json:
 *
 *   nvme         GB/s against request size, a line per queue depth, three
 *                panels on one y range: writes timed to completion, writes
 *                timed through a final flush, reads; a "reference" object
 *                with results of the same shape (fio, from
 *                bench/nvme_vs_fio.sh) is drawn dashed beside them
 *   tune         the same, a row of panels (write, read) per ring count, the
 *                writes timed through a flush as one line, the chosen setting
 *                ringed
 *   adam         elements/s against threads, with the memory roof (STREAM
 *                triad bandwidth / bytes per element) and the roof of
 *                AdamW's own access pattern
 *   h2d          GB/s per direction, pinned and pageable, bars
 *   allgather    bus bandwidth against message size, one line per collective
 *   net          the same for the rails between boxes (all-reduce too)
 *   pipeline     NVMe read and write GB/s of a training step's data path: over
 *                the step with compute, over the data path alone, and the
 *                store alone, bars
 */
#include "plot.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SERIES 64
#define MAX_POINTS 256
#define TUNE_ROW_H 400   /* bench tune: pixels per ring count beyond the first */

static double num(const json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static const char *str(const json_t *o, const char *k, const char *dflt)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : dflt;
}

static void put(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, " %.6g", v);
    else
        fprintf(f, " nan");
}

/* The folders of a result, comma-separated. */
static void folders(const json_t *rec, char *buf, size_t len)
{
    json_t *d = json_object_get(rec, "folders"), *v;
    size_t i, off = 0;
    buf[0] = 0;
    json_array_foreach(d, i, v)
        if (json_is_string(v) && off < len)
            off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? "," : "",
                                    json_string_value(v));
}

/* ------------------------------------------------------------ nvme, tune */

/* The three views of a store's rates: writes timed to their last
 * completion (a burst, which a cache in front of the drive takes), writes
 * timed through a final flush (the drive), reads. */
enum { NV_WRITE, NV_FLUSHED, NV_READ, NV_VIEWS };
static const char *const nv_view_name[NV_VIEWS] = {"write", "flushed", "read"};

typedef struct nv_series {
    bool ref;          /* from "reference" */
    int qd, rings;     /* qd 0: each size at its own depth (tune's flushed writes) */
    int n;
    double block[MAX_POINTS], gbps[MAX_POINTS];
} nv_series;

/* What a chart of nvme or tune results is drawn from: the series of each
 * view, the request sizes, the highest rate. */
typedef struct nv_data {
    nv_series *s;      /* [view * MAX_SERIES + i] */
    int ns[NV_VIEWS];
    double blocks[MAX_POINTS];
    int nb;
    double ymax;
    int qds[MAX_SERIES], nq; /* the queue depths, ascending: one colour each */
} nv_data;

/* The rows of `results` for view v into d: one series per queue depth and
 * ring count (tune's flushed writes, measured at each size's own depth: one
 * per ring count). */
static int nv_collect(const json_t *results, bool ref, int v, bool any_qd, nv_data *d)
{
    nv_series *s = d->s + v * MAX_SERIES;
    json_t *r;
    size_t i;
    json_array_foreach(results, i, r) {
        if (strcmp(str(r, "op", ""), v == NV_READ ? "read" : "write") != 0)
            continue;
        double b = num(r, "block_bytes"), q = num(r, "queue_depth"), rg = num(r, "rings");
        double g = num(r, v == NV_FLUSHED ? "flushed_gbps" : "gbps");
        if (v == NV_FLUSHED && !isfinite(g))
            continue; /* a point not timed through a flush */
        if (!(b > 0) || !(q > 0) || !isfinite(g))
            return -EINVAL;
        int qd = any_qd ? 0 : (int)q, rings = isfinite(rg) ? (int)rg : 1, k;
        for (k = 0; k < d->ns[v]; k++)
            if (s[k].ref == ref && s[k].qd == qd && s[k].rings == rings)
                break;
        if (k == d->ns[v]) {
            if (d->ns[v] == MAX_SERIES)
                return -E2BIG;
            s[k] = (nv_series){.ref = ref, .qd = qd, .rings = rings};
            d->ns[v]++;
        }
        if (s[k].n == MAX_POINTS)
            return -E2BIG;
        s[k].block[s[k].n] = b;
        s[k].gbps[s[k].n++] = g;
        d->ymax = g > d->ymax ? g : d->ymax;
        int j;
        for (j = 0; j < d->nb && d->blocks[j] != b; j++)
            ;
        if (j == d->nb && d->nb < MAX_POINTS)
            d->blocks[d->nb++] = b;
        for (j = 0; j < d->nq && d->qds[j] != qd; j++)
            ;
        if (qd > 0 && j == d->nq && d->nq < MAX_SERIES)
            d->qds[d->nq++] = qd;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int cmp_series(const void *a, const void *b)
{
    const nv_series *x = a, *y = b;
    if (x->ref != y->ref)
        return x->ref - y->ref;
    if (x->rings != y->rings)
        return x->rings - y->rings;
    return x->qd - y->qd;
}

/* Every view of rec (and of its "reference") into d, sorted, and each
 * series written as the data block $<view><i>, its points in size order.
 * 0 or -EINVAL with err. */
static int nv_load(const json_t *rec, fso_plot *p, const char *kind, nv_data *d, char *err,
                   size_t errlen)
{
    json_t *ref = json_object_get(rec, "reference");
    const bool tune = strcmp(kind, "tune") == 0;
    int rc = 0;
    memset(d, 0, sizeof *d);
    if (!(d->s = calloc(NV_VIEWS * MAX_SERIES, sizeof *d->s))) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    for (int v = 0; v < NV_VIEWS && rc == 0; v++) {
        rc = nv_collect(json_object_get(rec, "results"), false, v, tune && v == NV_FLUSHED, d);
        if (rc == 0 && ref)
            rc = nv_collect(json_object_get(ref, "results"), true, v, false, d);
    }
    if (rc == 0 && d->ns[NV_WRITE] + d->ns[NV_READ] == 0)
        rc = -EINVAL;
    if (rc < 0) {
        snprintf(err, errlen, "a bench %s result needs \"results\": [{\"op\": \"write\"|\"read\", "
                 "\"block_bytes\", \"queue_depth\", \"gbps\"}, ...]%s", kind,
                 rc == -E2BIG ? " (at most 64 lines of 256 points)" : "");
        free(d->s);
        d->s = NULL;
        return -EINVAL;
    }
    qsort(d->blocks, (size_t)d->nb, sizeof *d->blocks, cmp_double);
    qsort(d->qds, (size_t)d->nq, sizeof *d->qds, cmp_int);
    for (int v = 0; v < NV_VIEWS; v++) {
        nv_series *so = d->s + v * MAX_SERIES;
        qsort(so, (size_t)d->ns[v], sizeof *so, cmp_series);
        for (int k = 0; k < d->ns[v]; k++) {
            for (int a = 1; a < so[k].n; a++)
                for (int b = a; b > 0 && so[k].block[b - 1] > so[k].block[b]; b--) {
                    double t = so[k].block[b], g = so[k].gbps[b];
                    so[k].block[b] = so[k].block[b - 1], so[k].gbps[b] = so[k].gbps[b - 1];
                    so[k].block[b - 1] = t, so[k].gbps[b - 1] = g;
                }
            fprintf(p->f, "$%s%d << EOD\n", nv_view_name[v], k);
            for (int i = 0; i < so[k].n; i++) {
                put(p->f, so[k].block[i]);
                put(p->f, so[k].gbps[i]);
                fputc('\n', p->f);
            }
            fprintf(p->f, "EOD\n");
        }
    }
    return 0;
}

/* The axes every panel shares: request sizes on a log scale, one y range
 * for all (so a panel's height compares with the others'), room above the
 * lines for a key of keyrows rows. */
static void nv_axes(fso_plot *p, const nv_data *d, int keyrows)
{
    fprintf(p->f, "set logscale x 2\nset autoscale xfix\nset xlabel 'request size (bytes)'\n"
                  "set ylabel 'GB/s (1e9 B/s)'\nset yrange [0:%.4g]\n"
                  "set key top left horizontal maxrows %d samplen 2 spacing 0.9 font ',8'\n"
                  "set offsets graph 0.04, graph 0.04, 0, 0\nset xtics (",
            (d->ymax > 0 ? d->ymax : 1) * (1.08 + 0.09 * keyrows), keyrows);
    for (int j = 0; j < d->nb; j++) {
        char l[32];
        fso_plot_size_label(l, sizeof l, d->blocks[j]);
        fprintf(p->f, "%s'%s' %.0f", j ? ", " : "", l, d->blocks[j]);
    }
    fprintf(p->f, ")\n");
}

/* The lines of view v with `rings` (0: any), a colour per queue depth;
 * *first: no line plotted yet in this plot command. */
static void nv_lines(fso_plot *p, const nv_data *d, int v, int rings, const char *ref_tool,
                     bool label_rings, bool *first)
{
    const nv_series *so = d->s + v * MAX_SERIES;
    for (int k = 0; k < d->ns[v]; k++) {
        if (rings && so[k].rings != rings)
            continue;
        int colour = 1;
        for (int j = 0; j < d->nq; j++)
            if (d->qds[j] == so[k].qd)
                colour = j + 1;
        char label[128];
        int n = snprintf(label, sizeof label, "%s qd %d", so[k].ref ? ref_tool : "fsoff",
                         so[k].qd);
        if (label_rings)
            snprintf(label + n, sizeof label - (size_t)n, ", %d ring%s", so[k].rings,
                     so[k].rings == 1 ? "" : "s");
        fprintf(p->f, "%s$%s%d using 1:2 with linespoints lw 2 lc %d dt %d pt %d title ",
                *first ? "" : ", ", nv_view_name[v], k, colour, so[k].ref ? 2 : 1,
                so[k].ref ? 6 : 7);
        fso_plot_quote(p->f, "%s", label);
        *first = false;
    }
}

/* The range of view v's rates, for a panel title. */
static void nv_range(const nv_data *d, int v, char *buf, size_t len)
{
    double lo = INFINITY, hi = 0;
    for (int k = 0; k < d->ns[v]; k++)
        for (int i = 0; i < d->s[v * MAX_SERIES + k].n; i++) {
            double g = d->s[v * MAX_SERIES + k].gbps[i];
            lo = g < lo ? g : lo;
            hi = g > hi ? g : hi;
        }
    if (hi > 0)
        snprintf(buf, len, ": %.3g-%.3g GB/s", lo, hi);
    else
        buf[0] = 0;
}

/* bench nvme: three panels side by side, one y range: writes to completion,
 * writes through a flush, reads. */
static int plot_nvme(const json_t *rec, fso_plot *p, char *err, size_t errlen)
{
    static const char *const titles[NV_VIEWS] = {
        "write, to completion (a burst)", "write, through fsync (the drive)", "read"};
    json_t *ref = json_object_get(rec, "reference");
    const char *ref_tool = str(ref, "tool", "reference");
    nv_data d;
    int rc = nv_load(rec, p, "nvme", &d, err, errlen);
    if (rc < 0)
        return rc;
    const int panels = d.ns[NV_FLUSHED] ? 3 : 2;
    int most = 0;
    for (int v = 0; v < NV_VIEWS; v++)
        most = d.ns[v] > most ? d.ns[v] : most;
    char fl[2048];
    folders(rec, fl, sizeof fl);
    fprintf(p->f, "set multiplot layout 1,%d title ", panels);
    if (ref)
        fso_plot_quote(p->f, "fsoff bench nvme on %s: fsoff solid, %s dashed", fl[0] ? fl : "?",
                       ref_tool);
    else
        fso_plot_quote(p->f, "fsoff bench nvme on %s (io_uring, O_DIRECT)", fl[0] ? fl : "?");
    fprintf(p->f, "\n");
    nv_axes(p, &d, (most + 1) / 2);
    for (int v = 0; v < NV_VIEWS; v++) {
        if (v == NV_FLUSHED && !d.ns[NV_FLUSHED])
            continue;
        char range[64];
        nv_range(&d, v, range, sizeof range);
        fprintf(p->f, "set title ");
        fso_plot_quote(p->f, "%s%s", titles[v], v == NV_FLUSHED ? range : "");
        fprintf(p->f, "\nplot ");
        bool first = true;
        nv_lines(p, &d, v, 0, ref_tool, false, &first);
        fprintf(p->f, "\n");
    }
    fprintf(p->f, "unset multiplot\n");
    free(d.s);
    return 0;
}

/* The ring counts of a tune result, ascending; how many. */
static int tune_rings(const json_t *rec, int *rings, int max)
{
    json_t *r;
    size_t i;
    int n = 0;
    json_array_foreach(json_object_get(rec, "results"), i, r) {
        double v = num(r, "rings");
        int rg = isfinite(v) && v >= 1 ? (int)v : 1, j;
        for (j = 0; j < n && rings[j] != rg; j++)
            ;
        if (j == n && n < max)
            rings[n++] = rg;
    }
    qsort(rings, (size_t)n, sizeof *rings, cmp_int);
    return n;
}

/* The chosen setting's point in a tune panel: a ring around it. */
static void tune_mark(fso_plot *p, const json_t *chosen, const char *rate)
{
    char l[32];
    fso_plot_size_label(l, sizeof l, num(chosen, "block_bytes"));
    fprintf(p->f, ", '+' using (%.0f):(%.6g) every ::0::0 with points pt 6 ps 3.5 lw 3 lc "
                  "rgb 'black' title ", num(chosen, "block_bytes"), num(chosen, rate));
    fso_plot_quote(p->f, "chosen: %s x qd %d", l, (int)num(chosen, "queue_depth"));
}

/* bench tune: small multiples, a row per ring count: writes (a line per
 * queue depth, and the writes timed through a flush at each size's best
 * depth) and reads; the chosen setting ringed where the planner's rates
 * are, one y range for all. */
static int plot_tune(const json_t *rec, fso_plot *p, char *err, size_t errlen)
{
    json_t *chosen = json_object_get(rec, "chosen");
    int rings[MAX_SERIES];
    const int nr = tune_rings(rec, rings, MAX_SERIES);
    nv_data d;
    int rc = nv_load(rec, p, "tune", &d, err, errlen);
    if (rc < 0)
        return rc;
    char fl[2048];
    folders(rec, fl, sizeof fl);
    fprintf(p->f, "set multiplot layout %d,2 title ", nr);
    fso_plot_quote(p->f, "fsoff bench tune on %s: the aio section for %d device%s is ringed "
                   "(chosen by the read rate and the flushed write rate, the planner's)",
                   fl[0] ? fl : "?", (int)num(rec, "devices"),
                   num(rec, "devices") == 1 ? "" : "s");
    fprintf(p->f, "\n");
    nv_axes(p, &d, (d.nq + 2 + 3) / 4);
    const double chosen_rings = num(chosen, "rings");
    for (int r = 0; r < nr; r++)
        for (int v = NV_WRITE; v <= NV_READ; v += NV_READ - NV_WRITE) {
            bool first = true, mark = json_is_object(chosen) && chosen_rings == rings[r];
            fprintf(p->f, "set title ");
            fso_plot_quote(p->f, "%s, %d ring%s", v == NV_READ ? "read" : "write", rings[r],
                           rings[r] == 1 ? "" : "s");
            fprintf(p->f, "\nplot ");
            nv_lines(p, &d, v, rings[r], "", false, &first);
            for (int k = 0; v == NV_WRITE && k < d.ns[NV_FLUSHED]; k++)
                if (d.s[NV_FLUSHED * MAX_SERIES + k].rings == rings[r]) {
                    fprintf(p->f, "%s$flushed%d using 1:2 with linespoints lw 3 lc rgb 'black' "
                                  "pt 5 title 'flushed, best qd'",
                            first ? "" : ", ", k);
                    first = false;
                }
            if (mark && !first)
                tune_mark(p, chosen, v == NV_READ ? "read_gbps" : "flushed_write_gbps");
            fprintf(p->f, "\n");
        }
    fprintf(p->f, "unset multiplot\n");
    free(d.s);
    return 0;
}

/* ------------------------------------------------------------ adam */

static int plot_adam(const json_t *rec, fso_plot *p, char *err, size_t errlen)
{
    json_t *results = json_object_get(rec, "results"), *r;
    double bpe = num(rec, "bytes_per_elem");
    size_t i;
    if (!json_is_array(results) || json_array_size(results) == 0 || !(bpe > 0)) {
        snprintf(err, errlen, "a bench adam result needs \"bytes_per_elem\" and \"results\": "
                 "[{\"threads\", \"elems_per_s\", \"stream_gbps\", \"touch_gbps\"}, ...]");
        return -EINVAL;
    }
    fprintf(p->f, "$adam << EOD\n");
    json_array_foreach(results, i, r) {
        double t = num(r, "threads"), e = num(r, "elems_per_s");
        if (!(t > 0) || !isfinite(e)) {
            snprintf(err, errlen, "bench adam result %zu: needs \"threads\" and "
                     "\"elems_per_s\"", i + 1);
            return -EINVAL;
        }
        put(p->f, t);
        put(p->f, e / 1e9);
        put(p->f, num(r, "stream_gbps") / bpe);
        put(p->f, num(r, "touch_gbps") / bpe);
        fputc('\n', p->f);
    }
    fprintf(p->f, "EOD\n");
    fprintf(p->f, "set title ");
    fso_plot_quote(p->f, "fsoff bench adam: fused AdamW (%s kernel, %s gradients), %.0f bytes "
                   "per element", str(rec, "kernel", "?"), str(rec, "grad", "?"), bpe);
    fprintf(p->f, "\nset xlabel 'threads'\nset ylabel 'elements/s (1e9)'\nset yrange [0:*]\n"
                  "set xtics 1\nset offsets graph 0.05, graph 0.05, graph 0.1, 0\nset key below\n"
                  "plot $adam using 1:2 with linespoints lw 2 pt 7 lc 1 title 'fused AdamW', "
                  "$adam using 1:3 with linespoints lw 2 dt 2 pt 6 lc 7 title "
                  "'memory roof: STREAM triad GB/s / bytes per element', "
                  "$adam using 1:4 with linespoints lw 2 dt 3 pt 4 lc 3 title "
                  "'roof of AdamW''s reads and writes (touch pass)'\n");
    return 0;
}

/* ------------------------------------------------------------ h2d */

static int plot_h2d(const json_t *rec, fso_plot *p, char *err, size_t errlen)
{
    static const char *const dirs[3] = {"h2d", "d2h", "both"};
    json_t *c = json_object_get(rec, "copies_gbps");
    json_t *pin = json_object_get(c, "pinned"), *page = json_object_get(c, "pageable");
    json_t *all = json_object_get(rec, "pinned_all_devices");
    if (!json_is_object(pin) || !json_is_object(page)) {
        snprintf(err, errlen, "a bench h2d result needs \"copies_gbps\": {\"pinned\": {\"h2d\", "
                 "\"d2h\", \"both\"}, \"pageable\": {...}}");
        return -EINVAL;
    }
    int devices = (int)num(rec, "devices");
    fprintf(p->f, "$h2d << EOD\n");
    for (int d = 0; d < 3; d++) {
        fprintf(p->f, "%s", dirs[d]);
        put(p->f, num(pin, dirs[d]));
        put(p->f, num(page, dirs[d]));
        put(p->f, devices > 1 ? num(all, dirs[d]) : NAN);
        fputc('\n', p->f);
    }
    fprintf(p->f, "EOD\n");
    double mib = num(rec, "copy_bytes") / 1048576.0;
    fprintf(p->f, "set title ");
    fso_plot_quote(p->f, "fsoff bench h2d: %s, %.0f MiB per copy", str(rec, "device", "?"),
                   isfinite(mib) ? mib : 0.0);
    fprintf(p->f, "\nset style data histograms\nset style histogram clustered gap 1\n"
                  "set style fill solid 0.8 border -1\nset boxwidth 0.9\n"
                  "set xlabel 'direction (both: h2d and d2h at once, summed)'\n"
                  "set ylabel 'GB/s (1e9 B/s)'\nset yrange [0:*]\nset key top left\n"
                  "plot $h2d using 2:xtic(1) lc 1 title 'pinned, device 0', "
                  "'' using 3 lc 2 title 'pageable, device 0'");
    if (devices > 1) {
        fprintf(p->f, ", '' using 4 lc 3 title ");
        fso_plot_quote(p->f, "pinned, all %d devices at once (total)", devices);
    }
    fprintf(p->f, "\n");
    return 0;
}

/* ------------------------------------------------------------ allgather */

/* Bus bandwidth against size, a line per collective: "collectives" holds
 * an array of {bytes, busbw_gbps, algbw_gbps} per op (bench allgather's
 * two, bench net's three). */
static int plot_busbw(const json_t *rec, fso_plot *p, const char *kind, const char *const *ops,
                      const char *const *labels, int nops, char *err, size_t errlen)
{
    json_t *c = json_object_get(rec, "collectives");
    if (json_is_string(c)) {
        snprintf(err, errlen, "this bench %s result has no measurements (collectives: %s)",
                 kind, json_string_value(c));
        return -EINVAL;
    }
    double sizes[MAX_POINTS];
    int nsz = 0;
    for (int o = 0; o < nops; o++) {
        json_t *arr = json_object_get(c, ops[o]), *r;
        size_t i;
        if (!json_is_array(arr) || json_array_size(arr) == 0) {
            snprintf(err, errlen, "a bench %s result needs \"collectives\": {\"%s\": "
                     "[{\"bytes\", \"busbw_gbps\"}, ...], ...}", kind, ops[o]);
            return -EINVAL;
        }
        fprintf(p->f, "$%s << EOD\n", ops[o]);
        json_array_foreach(arr, i, r) {
            double b = num(r, "bytes");
            if (!(b > 0)) {
                snprintf(err, errlen, "bench %s %s result %zu: needs \"bytes\"", kind, ops[o],
                         i + 1);
                return -EINVAL;
            }
            put(p->f, b);
            put(p->f, num(r, "busbw_gbps"));
            put(p->f, num(r, "algbw_gbps"));
            fputc('\n', p->f);
            int j;
            for (j = 0; j < nsz && sizes[j] != b; j++)
                ;
            if (j == nsz && nsz < MAX_POINTS)
                sizes[nsz++] = b;
        }
        fprintf(p->f, "EOD\n");
    }
    qsort(sizes, (size_t)nsz, sizeof *sizes, cmp_double);
    fprintf(p->f, "set title ");
    if (strcmp(kind, "net") == 0)
        fso_plot_quote(p->f, "fsoff bench net: %d boxes over %s", (int)num(rec, "boxes"),
                       str(rec, "transport", "?"));
    else
        fso_plot_quote(p->f, "fsoff bench allgather: %d x %s over NCCL, fp32",
                       (int)num(c, "ranks"), str(rec, "device", "?"));
    fprintf(p->f, "\nset logscale x 2\nset autoscale xfix\n"
                  "set offsets graph 0.04, graph 0.04, 0, 0\n"
                  "set xlabel '%s'\n"
                  "set ylabel 'bus bandwidth GB/s (1e9 B/s, nccl-tests busbw)'\n"
                  "set yrange [0:*]\nset key top left\nset xtics (",
            strcmp(kind, "net") == 0 ? "size: total bytes per collective"
                                     : "size: the larger buffer per rank (bytes)");
    for (int j = 0; j < nsz; j++) {
        char l[32];
        fso_plot_size_label(l, sizeof l, sizes[j]);
        fprintf(p->f, "%s'%s' %.0f", j ? ", " : "", l, sizes[j]);
    }
    fprintf(p->f, ")\nplot ");
    static const int pts[] = {7, 5, 9};
    for (int o = 0; o < nops; o++)
        fprintf(p->f, "%s$%s using 1:2 with linespoints lw 2 pt %d lc %d title '%s'",
                o ? ", " : "", ops[o], pts[o % 3], o + 1, labels[o]);
    fprintf(p->f, "\n");
    return 0;
}

static int plot_allgather(const json_t *rec, fso_plot *p, char *err, size_t errlen)
{
    static const char *const ops[2] = {"all_gather", "reduce_scatter"};
    static const char *const labels[2] = {"all-gather", "reduce-scatter"};
    return plot_busbw(rec, p, "allgather", ops, labels, 2, err, errlen);
}

static int plot_net(const json_t *rec, fso_plot *p, char *err, size_t errlen)
{
    static const char *const ops[3] = {"all_reduce", "reduce_scatter", "all_gather"};
    static const char *const labels[3] = {"all-reduce (doubles)", "reduce-scatter",
                                          "all-gather"};
    return plot_busbw(rec, p, "net", ops, labels, 3, err, errlen);
}

/* ------------------------------------------------------------ pipeline */

static int plot_pipeline(const json_t *rec, fso_plot *p, char *err, size_t errlen)
{
    json_t *store = json_object_get(rec, "store");
    if (!json_is_object(store) || !json_is_number(json_object_get(rec, "step_ms"))) {
        snprintf(err, errlen, "a bench pipeline result needs \"store\": {\"read_gbps\", "
                 "\"write_gbps\"} and \"step_ms\"");
        return -EINVAL;
    }
    fprintf(p->f, "$rates << EOD\n");
    static const char *const ops[2] = {"read", "write"};
    for (int o = 0; o < 2; o++) {
        char k[64];
        fprintf(p->f, "\"NVMe %s\"", ops[o]);
        snprintf(k, sizeof k, "nvme_%s_gbps", ops[o]);
        put(p->f, num(rec, k));
        snprintf(k, sizeof k, "data_path_%s_gbps", ops[o]);
        put(p->f, num(rec, k));
        snprintf(k, sizeof k, "%s_gbps", ops[o]);
        put(p->f, num(store, k));
        fputc('\n', p->f);
    }
    fprintf(p->f, "EOD\nset title ");
    fso_plot_quote(p->f, "fsoff bench pipeline: %s", str(rec, "placement", "?"));
    fprintf(p->f, " . \"\\n\" . ");
    fso_plot_quote(p->f, "the step %.2fx its bound; the data path alone %.2fx the store's time",
                   num(rec, "step_over_bound"), num(rec, "data_path_over_store"));
    fprintf(p->f, "\nset style data histograms\nset style histogram clustered gap 1\n"
                  "set style fill solid 0.8 border -1\nset boxwidth 0.9\n"
                  "set ylabel 'GB/s (1e9 B/s)'\nset yrange [0:*]\nset key top left\n"
                  "plot $rates using 2:xtic(1) lc 1 title 'over the step, compute as waits', "
                  "'' using 3 lc 2 title 'over the data path alone', "
                  "'' using 4 lc 3 title 'the store alone (sequential)'\n");
    return 0;
}

int fso_plot_bench(const json_t *rec, const char *png, int width, int height, char *err,
                   size_t errlen)
{
    const char *kind = str(rec, "bench", "");
    bool wide = strcmp(kind, "nvme") == 0 || strcmp(kind, "tune") == 0;
    if (!wide && strcmp(kind, "adam") != 0 && strcmp(kind, "h2d") != 0 &&
        strcmp(kind, "allgather") != 0 && strcmp(kind, "pipeline") != 0 &&
        strcmp(kind, "net") != 0) {
        snprintf(err, errlen, "\"bench\": \"%s\": not a result fsoff can draw (nvme, tune, adam, "
                 "h2d, allgather, net, pipeline)", kind);
        return -EINVAL;
    }
    fso_plot p;
    int rings[MAX_SERIES], rows = 1;
    if (strcmp(kind, "tune") == 0 && (rows = tune_rings(rec, rings, MAX_SERIES)) < 1)
        rows = 1;
    int rc = fso_plot_begin(&p, png, width ? width : wide ? FSO_PLOT_NVME_W : FSO_PLOT_SMALL_W,
                            height ? height
                            : wide ? FSO_PLOT_NVME_H + (rows - 1) * TUNE_ROW_H
                                   : FSO_PLOT_SMALL_H,
                            err, errlen);
    if (rc < 0)
        return rc;
    if (strcmp(kind, "tune") == 0)
        rc = plot_tune(rec, &p, err, errlen);
    else if (wide)
        rc = plot_nvme(rec, &p, err, errlen);
    else if (strcmp(kind, "adam") == 0)
        rc = plot_adam(rec, &p, err, errlen);
    else if (strcmp(kind, "h2d") == 0)
        rc = plot_h2d(rec, &p, err, errlen);
    else if (strcmp(kind, "pipeline") == 0)
        rc = plot_pipeline(rec, &p, err, errlen);
    else if (strcmp(kind, "net") == 0)
        rc = plot_net(rec, &p, err, errlen);
    else
        rc = plot_allgather(rec, &p, err, errlen);
    if (rc < 0) {
        fso_plot_discard(&p);
        return rc;
    }
    return fso_plot_finish(&p, err, errlen);
}
