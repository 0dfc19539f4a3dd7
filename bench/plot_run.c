/* plot_run.c — a training run's --metrics files as one chart (plot.h):
 * seven panels over steps: loss, gradient norm, learning rate, tokens/s,
 * NVMe GB/s read and written, stall, and step time next to compute time.
 *
 * A file holds one JSON object per step ("step", "loss", "grad_norm", "lr",
 * "tok_s", "step_ms", "compute_ms", "stall_ms", "nvme_read_bytes",
 * "nvme_write_bytes") and event objects ("event"): a summary and
 * checkpoints, which are skipped, validation passes ("val": "step",
 * "loss"), drawn in the loss panel, and "resume" ({"step": N}), where a
 * resumed run's segment begins: the steps after N drawn before it (those
 * the killed run made past its checkpoint) give way to the segment's. Files
 * given in order are read as one, and steps that start again at or below
 * the last one read are a segment too. A value missing from a line is a gap
 * in its curve; a run that diverged wrote its loss as nan, which is read as
 * a gap too. */
#include "plot.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum { COL_STEP, COL_LOSS, COL_LR, COL_TOKS, COL_RD, COL_WR, COL_STALL, COL_MS, COL_COMPUTE,
       COL_NORM, N_COLS };

/* The rows drawn and where segments begin. */
typedef struct run_rows {
    double (*row)[N_COLS];
    long n, cap;
    double resumed_at[64];  /* the first 64 segments' starts, marked */
    int n_resumes;
    double (*val)[2];       /* validation passes: step, loss */
    long n_val, cap_val;
} run_rows;

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

/* A segment begins after step: the rows past it give way. */
static void resume_at(run_rows *r, double step)
{
    while (r->n > 0 && r->row[r->n - 1][COL_STEP] > step)
        r->n--;
    while (r->n_val > 0 && r->val[r->n_val - 1][0] >= step) /* the segment passes again */
        r->n_val--;
    if (r->n_resumes < (int)(sizeof r->resumed_at / sizeof r->resumed_at[0]))
        r->resumed_at[r->n_resumes++] = step;
}

/* One step object into the rows. 0, or -ENOMEM. */
static int add_step(run_rows *r, json_t *o)
{
    const double step = field(o, "step"), ms = field(o, "step_ms");
    if (r->n > 0 && r->row[r->n - 1][COL_STEP] >= step) /* a new segment without its event */
        resume_at(r, step - 1);
    if (r->n == r->cap) {
        long cap = r->cap ? 2 * r->cap : 1024;
        void *row = realloc(r->row, (size_t)cap * sizeof *r->row);
        if (!row)
            return -ENOMEM;
        r->row = row;
        r->cap = cap;
    }
    double *v = r->row[r->n++];
    v[COL_STEP] = step;
    v[COL_LOSS] = field(o, "loss");
    v[COL_LR] = field(o, "lr");
    v[COL_TOKS] = field(o, "tok_s");
    v[COL_RD] = field(o, "nvme_read_bytes") / (ms * 1e6);
    v[COL_WR] = field(o, "nvme_write_bytes") / (ms * 1e6);
    v[COL_STALL] = field(o, "stall_ms");
    v[COL_MS] = ms;
    v[COL_COMPUTE] = field(o, "compute_ms");
    v[COL_NORM] = field(o, "grad_norm");
    return 0;
}

/* One validation pass into the rows. 0, or -ENOMEM. */
static int add_val(run_rows *r, json_t *o)
{
    if (r->n_val == r->cap_val) {
        long cap = r->cap_val ? 2 * r->cap_val : 64;
        void *val = realloc(r->val, (size_t)cap * sizeof *r->val);
        if (!val)
            return -ENOMEM;
        r->val = val;
        r->cap_val = cap;
    }
    r->val[r->n_val][0] = field(o, "step");
    r->val[r->n_val++][1] = field(o, "loss");
    return 0;
}

/* One metrics file's objects into the rows. 0 or -errno (message in err). */
static int read_file(run_rows *r, const char *path, char *err, size_t errlen)
{
    FILE *in = fopen(path, "r");
    if (!in) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? -EINVAL : -errno;
    }
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    int rc = 0;
    while (rc == 0 && getline(&line, &cap, in) > 0) {
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
        json_t *ev = o ? json_object_get(o, "event") : NULL;
        if (!o || !json_is_object(o)) {
            snprintf(err, errlen, "%s:%ld:%d: not a --metrics line (%s); give the file that "
                     "fsoff --metrics wrote, or a bench --json result", path, lineno,
                     o ? 1 : je.column, o ? "not a JSON object" : je.text);
            rc = -EINVAL;
        } else if (json_is_string(ev) && strcmp(json_string_value(ev), "resume") == 0 &&
                   json_is_number(json_object_get(o, "step"))) {
            resume_at(r, field(o, "step"));
        } else if (json_is_string(ev) && strcmp(json_string_value(ev), "val") == 0 &&
                   json_is_number(json_object_get(o, "step")) && add_val(r, o) < 0) {
            snprintf(err, errlen, "%s: out of memory", path);
            rc = -ENOMEM;
        } else if (!ev && json_is_number(json_object_get(o, "step")) && add_step(r, o) < 0) {
            snprintf(err, errlen, "%s: out of memory", path);
            rc = -ENOMEM;
        }
        json_decref(o);
    }
    free(line);
    fclose(in);
    return rc;
}

/* The panels, drawn from $run, with each resume marked by a dashed line. */
static void panels(FILE *f, const run_rows *r, bool have_nvme, bool have_norm)
{
    for (int i = 0; i < r->n_resumes; i++)
        fprintf(f, "set arrow from %.9g, graph 0 to %.9g, graph 1 nohead dt 2 lc rgb 'gray40'\n",
                r->resumed_at[i], r->resumed_at[i]);
    fprintf(f, "set xlabel 'step'\nset key top right\n"
               "set ylabel 'loss'\n"
               "plot $run using 1:2 with linespoints pt 7 ps 0.4 lc 1 title 'loss'%s\n"
               "set ylabel 'gradient norm (before clipping)'\n",
            r->n_val ? ", $val using 1:2 with linespoints pt 9 ps 0.8 lc 7 title "
                       "'validation loss'" : "");
    if (have_norm)
        fprintf(f, "plot $run using 1:10 with linespoints pt 7 ps 0.4 lc 5 title 'grad norm'\n");
    else /* an older file: the panel says so */
        fprintf(f, "set label 1 'no gradient norms in this file' at graph 0.5,0.5 center\n"
                   "plot $run using 1:(0) with lines lc 5 title 'grad norm'\nunset label 1\n");
    fprintf(f, "set ylabel 'learning rate'\nset format y '%%.1e'\n"
               "plot $run using 1:3 with lines lw 2 lc 2 title 'learning rate'\n"
               "set format y '%%g'\nset ylabel 'tokens/s'\n"
               "plot $run using 1:4 with linespoints pt 7 ps 0.4 lc 3 title 'tokens/s'\n"
               "set ylabel 'NVMe GB/s (1e9 B/s)'\nset yrange [0:*]\n");
    if (have_nvme)
        fprintf(f, "plot $run using 1:5 with linespoints pt 7 ps 0.4 lc 4 title 'read', "
                   "$run using 1:6 with linespoints pt 5 ps 0.4 lc 7 title 'written'\n");
    else
        fprintf(f, "set label 1 'no NVMe traffic in this run' at graph 0.5,0.5 center\n"
                   "plot $run using 1:5 with lines lc 4 title 'read', "
                   "$run using 1:6 with lines lc 7 title 'written'\nunset label 1\n");
    fprintf(f, "set ylabel 'stall (ms per step)'\n"
               "plot $run using 1:7 with linespoints pt 7 ps 0.4 lc 6 title 'stall: compute "
               "waiting for data'\n"
               "set ylabel 'time (ms per step)'\n"
               "plot $run using 1:8 with linespoints pt 7 ps 0.4 lc 1 title 'step', "
               "$run using 1:9 with linespoints pt 5 ps 0.4 lc 2 title 'compute'\n"
               "unset multiplot\n");
}

int fso_plot_run(const char *const *paths, int n_paths, const char *png, int width, int height,
                 char *err, size_t errlen)
{
    run_rows r = {0};
    int rc = 0;
    for (int i = 0; i < n_paths && rc == 0; i++)
        rc = read_file(&r, paths[i], err, errlen);
    if (rc == 0 && r.n == 0) {
        snprintf(err, errlen, "%s: no step lines; give the file that fsoff --metrics wrote "
                 "(one JSON object per step)", paths[n_paths - 1]);
        rc = -EINVAL;
    }
    fso_plot p;
    if (rc == 0)
        rc = fso_plot_begin(&p, png, width ? width : FSO_PLOT_RUN_W,
                            height ? height : FSO_PLOT_RUN_H, err, errlen);
    if (rc < 0) {
        free(r.row);
        free(r.val);
        return rc;
    }
    bool have_nvme = false, have_norm = false;
    fprintf(p.f, "$run << EOD\n");
    for (long i = 0; i < r.n; i++) {
        have_nvme = have_nvme || r.row[i][COL_RD] > 0 || r.row[i][COL_WR] > 0;
        have_norm = have_norm || isfinite(r.row[i][COL_NORM]);
        for (int c = 0; c < N_COLS; c++)
            put(p.f, r.row[i][c]);
        fputc('\n', p.f);
    }
    fprintf(p.f, "EOD\n$val << EOD\n");
    for (long i = 0; i < r.n_val; i++) {
        put(p.f, r.val[i][0]);
        put(p.f, r.val[i][1]);
        fputc('\n', p.f);
    }
    fprintf(p.f, "EOD\n");
    const char *base = strrchr(paths[0], '/') ? strrchr(paths[0], '/') + 1 : paths[0];
    char more[64] = "", resumed[64] = "";
    if (n_paths > 1)
        snprintf(more, sizeof more, " and %d more file%s", n_paths - 1, n_paths > 2 ? "s" : "");
    if (r.n_resumes)
        snprintf(resumed, sizeof resumed, ", resumed %d time%s (dashed)", r.n_resumes,
                 r.n_resumes > 1 ? "s" : "");
    fprintf(p.f, "set multiplot layout 4,2 title ");
    fso_plot_quote(p.f, "fsoff training run: %s%s, %ld step%s%s", base, more, r.n,
                   r.n == 1 ? "" : "s", resumed);
    fputc('\n', p.f);
    panels(p.f, &r, have_nvme, have_norm);
    free(r.row);
    free(r.val);
    return fso_plot_finish(&p, err, errlen);
}
