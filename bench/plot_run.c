/* plot_run.c — a training run's --metrics file as one chart (plot.h): six
 * panels over steps: loss, learning rate, tokens/s, NVMe GB/s read and
 * written, stall, and step time next to compute time.
 *
 * The file holds one JSON object per step ("step", "loss", "lr", "tok_s",
 * "step_ms", "compute_ms", "stall_ms", "nvme_read_bytes", "nvme_write_bytes")
 * and a summary object ("event": "summary"), which is skipped. A value
 * missing from a line is a gap in its curve; a run that diverged wrote its
 * loss as nan, which is read as a gap too. */
#include "plot.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum { COL_STEP, COL_LOSS, COL_LR, COL_TOKS, COL_RD, COL_WR, COL_STALL, COL_MS, COL_COMPUTE,
       N_COLS };

/* line with bare nan, -nan, inf and -inf (printf's spelling of non-finite
 * values, not JSON) outside strings replaced by null, in out (twice line's
 * length at least). */
static void nonfinite_to_null(const char *line, char *out)
{
    bool in_str = false;
    for (const char *p = line; *p; p++) {
        if (!in_str) {
            const char *t = p + (*p == '-');
            if (strncmp(t, "nan", 3) == 0 || strncmp(t, "inf", 3) == 0) {
                out = stpcpy(out, "null");
                p = t + 2;
                continue;
            }
            in_str = *p == '"';
        } else if (*p == '\\' && p[1]) {
            *out++ = *p++;
        } else if (*p == '"') {
            in_str = false;
        }
        *out++ = *p;
    }
    *out = 0;
}

static double field(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static void put(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, " %.9g", v);
    else
        fprintf(f, " nan");
}

int fso_plot_run(const char *path, const char *png, int width, int height, char *err,
                 size_t errlen)
{
    FILE *in = fopen(path, "r");
    if (!in) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? -EINVAL : -errno;
    }
    fso_plot p;
    int rc = fso_plot_begin(&p, png, width ? width : FSO_PLOT_RUN_W,
                            height ? height : FSO_PLOT_RUN_H, err, errlen);
    if (rc < 0) {
        fclose(in);
        return rc;
    }
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0, steps = 0;
    bool have_nvme = false;
    fprintf(p.f, "$run << EOD\n");
    while (getline(&line, &cap, in) > 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == strlen(line))
            continue;
        char *clean = malloc(2 * strlen(line) + 8);
        if (!clean) {
            snprintf(err, errlen, "%s: out of memory", path);
            rc = -ENOMEM;
            break;
        }
        nonfinite_to_null(line, clean);
        json_error_t je;
        json_t *o = json_loads(clean, 0, &je);
        free(clean);
        if (!o || !json_is_object(o)) {
            snprintf(err, errlen, "%s:%ld:%d: not a --metrics line (%s); give the file that "
                     "fsoff --metrics wrote, or a bench --json result", path, lineno,
                     o ? 1 : je.column, o ? "not a JSON object" : je.text);
            json_decref(o);
            rc = -EINVAL;
            break;
        }
        if (json_object_get(o, "event") || !json_is_number(json_object_get(o, "step"))) {
            json_decref(o);
            continue;
        }
        double ms = field(o, "step_ms"), v[N_COLS];
        v[COL_STEP] = field(o, "step");
        v[COL_LOSS] = field(o, "loss");
        v[COL_LR] = field(o, "lr");
        v[COL_TOKS] = field(o, "tok_s");
        v[COL_RD] = field(o, "nvme_read_bytes") / (ms * 1e6);
        v[COL_WR] = field(o, "nvme_write_bytes") / (ms * 1e6);
        v[COL_STALL] = field(o, "stall_ms");
        v[COL_MS] = ms;
        v[COL_COMPUTE] = field(o, "compute_ms");
        have_nvme = have_nvme || v[COL_RD] > 0 || v[COL_WR] > 0;
        for (int c = 0; c < N_COLS; c++)
            put(p.f, v[c]);
        fputc('\n', p.f);
        steps++;
        json_decref(o);
    }
    free(line);
    fclose(in);
    if (rc == 0 && steps == 0) {
        snprintf(err, errlen, "%s: no step lines; give the file that fsoff --metrics wrote "
                 "(one JSON object per step)", path);
        rc = -EINVAL;
    }
    if (rc < 0) {
        fso_plot_discard(&p);
        return rc;
    }
    fprintf(p.f, "EOD\n");
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    fprintf(p.f, "set multiplot layout 3,2 title ");
    fso_plot_quote(p.f, "fsoff training run: %s, %ld step%s", base, steps, steps == 1 ? "" : "s");
    fprintf(p.f, "\nset xlabel 'step'\nset key top right\n"
                 "set ylabel 'loss'\n"
                 "plot $run using 1:2 with linespoints pt 7 ps 0.4 lc 1 title 'loss'\n"
                 "set ylabel 'learning rate'\nset format y '%%.1e'\n"
                 "plot $run using 1:3 with lines lw 2 lc 2 title 'learning rate'\n"
                 "set format y '%%g'\nset ylabel 'tokens/s'\n"
                 "plot $run using 1:4 with linespoints pt 7 ps 0.4 lc 3 title 'tokens/s'\n"
                 "set ylabel 'NVMe GB/s (1e9 B/s)'\nset yrange [0:*]\n");
    if (have_nvme)
        fprintf(p.f, "plot $run using 1:5 with linespoints pt 7 ps 0.4 lc 4 title 'read', "
                     "$run using 1:6 with linespoints pt 5 ps 0.4 lc 7 title 'written'\n");
    else
        fprintf(p.f, "set label 1 'no NVMe traffic in this run' at graph 0.5,0.5 center\n"
                     "plot $run using 1:5 with lines lc 4 title 'read', "
                     "$run using 1:6 with lines lc 7 title 'written'\nunset label 1\n");
    fprintf(p.f, "set ylabel 'stall (ms per step)'\n"
                 "plot $run using 1:7 with linespoints pt 7 ps 0.4 lc 6 title 'stall: compute "
                 "waiting for data'\n"
                 "set ylabel 'time (ms per step)'\n"
                 "plot $run using 1:8 with linespoints pt 7 ps 0.4 lc 1 title 'step', "
                 "$run using 1:9 with linespoints pt 5 ps 0.4 lc 2 title 'compute'\n"
                 "unset multiplot\n");
    return fso_plot_finish(&p, err, errlen);
}
