/* plot_bench.c — the charts of `fsoff bench` results (plot.h), from the
 * JSON object each benchmark writes with --json:
 *
 *   nvme, tune   GB/s against request size, write and read side by side, a
 *                line per queue depth (and ring count); a "reference" object
 *                with results of the same shape (fio, from
 *                bench/nvme_vs_fio.sh) is drawn dashed beside them
 *   adam         elements/s against threads, with the memory roof (STREAM
 *                triad bandwidth / bytes per element) and the roof of
 *                AdamW's own access pattern
 *   h2d          GB/s per direction, pinned and pageable, bars
 *   allgather    bus bandwidth against message size, one line per collective
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

typedef struct nv_series {
    bool ref;          /* from "reference" */
    int qd, rings;
    int n;
    double block[MAX_POINTS], gbps[MAX_POINTS];
} nv_series;

static int nv_collect(const json_t *results, bool ref, const char *op, nv_series *s, int *ns,
                      double *blocks, int *nb)
{
    json_t *r;
    size_t i;
    json_array_foreach(results, i, r) {
        if (strcmp(str(r, "op", ""), op) != 0)
            continue;
        double b = num(r, "block_bytes"), g = num(r, "gbps"), q = num(r, "queue_depth"),
               rg = num(r, "rings");
        if (!(b > 0) || !(q > 0) || !isfinite(g))
            return -EINVAL;
        int qd = (int)q, rings = isfinite(rg) ? (int)rg : 1, k;
        for (k = 0; k < *ns; k++)
            if (s[k].ref == ref && s[k].qd == qd && s[k].rings == rings)
                break;
        if (k == *ns) {
            if (*ns == MAX_SERIES)
                return -E2BIG;
            s[k] = (nv_series){.ref = ref, .qd = qd, .rings = rings};
            (*ns)++;
        }
        if (s[k].n == MAX_POINTS)
            return -E2BIG;
        s[k].block[s[k].n] = b;
        s[k].gbps[s[k].n++] = g;
        int j;
        for (j = 0; j < *nb && blocks[j] != b; j++)
            ;
        if (j == *nb && *nb < MAX_POINTS)
            blocks[(*nb)++] = b;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
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

static int plot_nvme(const json_t *rec, fso_plot *p, const char *kind, char *err, size_t errlen)
{
    static const char *const ops[2] = {"write", "read"};
    json_t *ref = json_object_get(rec, "reference");
    const char *ref_tool = str(ref, "tool", "reference");
    nv_series *s = calloc(2 * MAX_SERIES, sizeof *s);
    double blocks[MAX_POINTS];
    int ns[2] = {0, 0}, nb = 0, rc = 0;
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    for (int o = 0; o < 2 && rc == 0; o++) {
        rc = nv_collect(json_object_get(rec, "results"), false, ops[o], s + o * MAX_SERIES,
                        &ns[o], blocks, &nb);
        if (rc == 0 && ref)
            rc = nv_collect(json_object_get(ref, "results"), true, ops[o], s + o * MAX_SERIES,
                            &ns[o], blocks, &nb);
    }
    if (rc == 0 && ns[0] + ns[1] == 0)
        rc = -EINVAL;
    if (rc < 0) {
        snprintf(err, errlen, "a bench %s result needs \"results\": [{\"op\": \"write\"|\"read\", "
                 "\"block_bytes\", \"queue_depth\", \"gbps\"}, ...]%s", kind,
                 rc == -E2BIG ? " (at most 64 lines of 256 points)" : "");
        free(s);
        return -EINVAL;
    }
    qsort(blocks, (size_t)nb, sizeof *blocks, cmp_double);
    /* one colour per queue depth, the same in both panels and for the reference */
    int qds[MAX_SERIES], nq = 0;
    for (int o = 0; o < 2; o++)
        for (int k = 0; k < ns[o]; k++) {
            int j;
            for (j = 0; j < nq && qds[j] != s[o * MAX_SERIES + k].qd; j++)
                ;
            if (j == nq && nq < MAX_SERIES)
                qds[nq++] = s[o * MAX_SERIES + k].qd;
        }
    for (int a = 1; a < nq; a++)
        for (int b = a; b > 0 && qds[b - 1] > qds[b]; b--) {
            int t = qds[b];
            qds[b] = qds[b - 1];
            qds[b - 1] = t;
        }
    bool many_rings = false;
    for (int o = 0; o < 2; o++)
        for (int k = 0; k < ns[o]; k++)
            many_rings = many_rings || s[o * MAX_SERIES + k].rings != 1;

    /* the key sits above the lines, in rows of up to three entries */
    int keyrows = ((ns[0] > ns[1] ? ns[0] : ns[1]) + 2) / 3;
    char fl[2048];
    folders(rec, fl, sizeof fl);
    fprintf(p->f, "set multiplot layout 1,2 title ");
    if (ref)
        fso_plot_quote(p->f, "fsoff bench %s on %s: fsoff solid, %s dashed", kind,
                       fl[0] ? fl : "?", ref_tool);
    else
        fso_plot_quote(p->f, "fsoff bench %s on %s (io_uring, O_DIRECT)", kind, fl[0] ? fl : "?");
    fprintf(p->f, "\nset logscale x 2\nset autoscale xfix\nset xlabel 'request size (bytes)'\n"
                  "set ylabel 'GB/s (1e9 B/s)'\nset yrange [0:*]\n"
                  "set key top left horizontal maxrows %d samplen 2 spacing 0.9 font ',9'\n"
                  "set offsets graph 0.04, graph 0.04, graph %.2f, 0\nset xtics (",
            keyrows, 0.1 + 0.07 * keyrows);
    for (int j = 0; j < nb; j++) {
        char l[32];
        fso_plot_size_label(l, sizeof l, blocks[j]);
        fprintf(p->f, "%s'%s' %.0f", j ? ", " : "", l, blocks[j]);
    }
    fprintf(p->f, ")\n");
    for (int o = 0; o < 2; o++) {
        nv_series *so = s + o * MAX_SERIES;
        qsort(so, (size_t)ns[o], sizeof *so, cmp_series);
        for (int k = 0; k < ns[o]; k++) {
            /* points in size order */
            for (int a = 1; a < so[k].n; a++)
                for (int b = a; b > 0 && so[k].block[b - 1] > so[k].block[b]; b--) {
                    double t = so[k].block[b], g = so[k].gbps[b];
                    so[k].block[b] = so[k].block[b - 1], so[k].gbps[b] = so[k].gbps[b - 1];
                    so[k].block[b - 1] = t, so[k].gbps[b - 1] = g;
                }
            fprintf(p->f, "$%s%d << EOD\n", ops[o], k);
            for (int i = 0; i < so[k].n; i++) {
                put(p->f, so[k].block[i]);
                put(p->f, so[k].gbps[i]);
                fputc('\n', p->f);
            }
            fprintf(p->f, "EOD\n");
        }
        fprintf(p->f, "set title '%s'\nplot ", ops[o]);
        for (int k = 0; k < ns[o]; k++) {
            int colour = 1;
            for (int j = 0; j < nq; j++)
                if (qds[j] == so[k].qd)
                    colour = j + 1;
            char label[128];
            int n = snprintf(label, sizeof label, "%s qd %d", so[k].ref ? ref_tool : "fsoff",
                             so[k].qd);
            if (many_rings)
                snprintf(label + n, sizeof label - (size_t)n, ", %d ring%s", so[k].rings,
                         so[k].rings == 1 ? "" : "s");
            fprintf(p->f, "%s$%s%d using 1:2 with linespoints lw 2 lc %d dt %d pt %d title ",
                    k ? ", " : "", ops[o], k, colour, so[k].ref ? 2 : 1,
                    so[k].ref ? 6 : 5 + 2 * (so[k].rings > 1));
            fso_plot_quote(p->f, "%s", label);
        }
        fprintf(p->f, "\n");
    }
    fprintf(p->f, "unset multiplot\n");
    free(s);
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

static int plot_allgather(const json_t *rec, fso_plot *p, char *err, size_t errlen)
{
    static const char *const ops[2] = {"all_gather", "reduce_scatter"};
    json_t *c = json_object_get(rec, "collectives");
    if (json_is_string(c)) {
        snprintf(err, errlen, "this bench allgather result has no measurements (collectives: "
                 "%s)", json_string_value(c));
        return -EINVAL;
    }
    double sizes[MAX_POINTS];
    int nsz = 0;
    for (int o = 0; o < 2; o++) {
        json_t *arr = json_object_get(c, ops[o]), *r;
        size_t i;
        if (!json_is_array(arr) || json_array_size(arr) == 0) {
            snprintf(err, errlen, "a bench allgather result needs \"collectives\": "
                     "{\"all_gather\": [{\"bytes\", \"busbw_gbps\"}, ...], \"reduce_scatter\": "
                     "[...]}");
            return -EINVAL;
        }
        fprintf(p->f, "$%s << EOD\n", ops[o]);
        json_array_foreach(arr, i, r) {
            double b = num(r, "bytes");
            if (!(b > 0)) {
                snprintf(err, errlen, "bench allgather %s result %zu: needs \"bytes\"", ops[o],
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
    fso_plot_quote(p->f, "fsoff bench allgather: %d x %s over NCCL, fp32", (int)num(c, "ranks"),
                   str(rec, "device", "?"));
    fprintf(p->f, "\nset logscale x 2\nset autoscale xfix\n"
                  "set offsets graph 0.04, graph 0.04, 0, 0\n"
                  "set xlabel 'size: the larger buffer per rank (bytes)'\n"
                  "set ylabel 'bus bandwidth GB/s (1e9 B/s, nccl-tests busbw)'\n"
                  "set yrange [0:*]\nset key top left\nset xtics (");
    for (int j = 0; j < nsz; j++) {
        char l[32];
        fso_plot_size_label(l, sizeof l, sizes[j]);
        fprintf(p->f, "%s'%s' %.0f", j ? ", " : "", l, sizes[j]);
    }
    fprintf(p->f, ")\nplot $all_gather using 1:2 with linespoints lw 2 pt 7 lc 1 title "
                  "'all-gather', $reduce_scatter using 1:2 with linespoints lw 2 pt 5 lc 2 "
                  "title 'reduce-scatter'\n");
    return 0;
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
        strcmp(kind, "allgather") != 0 && strcmp(kind, "pipeline") != 0) {
        snprintf(err, errlen, "\"bench\": \"%s\": not a result fsoff can draw (nvme, tune, adam, "
                 "h2d, allgather, pipeline)", kind);
        return -EINVAL;
    }
    fso_plot p;
    int rc = fso_plot_begin(&p, png, width ? width : wide ? FSO_PLOT_NVME_W : FSO_PLOT_SMALL_W,
                            height ? height : wide ? FSO_PLOT_NVME_H : FSO_PLOT_SMALL_H, err,
                            errlen);
    if (rc < 0)
        return rc;
    if (wide)
        rc = plot_nvme(rec, &p, kind, err, errlen);
    else if (strcmp(kind, "adam") == 0)
        rc = plot_adam(rec, &p, err, errlen);
    else if (strcmp(kind, "h2d") == 0)
        rc = plot_h2d(rec, &p, err, errlen);
    else if (strcmp(kind, "pipeline") == 0)
        rc = plot_pipeline(rec, &p, err, errlen);
    else
        rc = plot_allgather(rec, &p, err, errlen);
    if (rc < 0) {
        fso_plot_discard(&p);
        return rc;
    }
    return fso_plot_finish(&p, err, errlen);
}
