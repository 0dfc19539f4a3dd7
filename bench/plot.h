/* plot.h — charts of benchmark results and training runs, drawn by gnuplot.
 *
 * Every `fsoff bench` result is one JSON object (what --json writes) whose
 * "bench" key names the benchmark; fso_plot_bench draws any of them, so a
 * saved result draws the same chart as the run that measured it. A training
 * run's --metrics file (JSON lines) is drawn by fso_plot_run. `fsoff plot`
 * (fso_plot_main) takes either kind of file.
 *
 * gnuplot runs as a subprocess on a script written to a temporary file, with
 * the pngcairo terminal, or the svg terminal for a name ending in .svg; a
 * missing gnuplot is an error that says how to install it. Charts are PNG
 * (or SVG) files of the size asked for, or of the kind's default size below;
 * a name with another extension is refused.
 */
#ifndef FSO_PLOT_H
#define FSO_PLOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

struct json_t; /* jansson */

/* Default sizes in pixels (width x height). */
#define FSO_PLOT_NVME_W 1200   /* nvme and tune: write and read side by side */
#define FSO_PLOT_NVME_H 520
#define FSO_PLOT_SMALL_W 900   /* adam, h2d, allgather, pipeline */
#define FSO_PLOT_SMALL_H 540
#define FSO_PLOT_RUN_W 1200    /* a training run: seven panels */
#define FSO_PLOT_RUN_H 1240

/* A chart being written: the gnuplot script goes to f. */
typedef struct fso_plot {
    FILE *f;
    char *text;
    size_t len;
    char png[4096];  /* the chart's file, PNG or SVG */
    bool svg;
} fso_plot;

/* 0 when path names a chart fsoff can write (.png, .svg, or no
 * extension: PNG), else -EINVAL with the message in err. */
int fso_plot_check_name(const char *path, char *err, size_t errlen);
/* Start a chart for png of width x height pixels: terminal (by the name:
 * .svg SVG, else PNG), output, common style. 0 or -errno (message in err;
 * -EINVAL for a name that is neither .png nor .svg). */
int fso_plot_begin(fso_plot *p, const char *png, int width, int height, char *err,
                   size_t errlen);
/* Write the printf-style text as a gnuplot string literal (single quotes;
 * a quote doubled, control characters dropped). */
void fso_plot_quote(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Draw: run gnuplot on the script and check that png is a PNG (an SVG). Frees p
 * either way. 0, -ENOENT when gnuplot is not installed, or -EIO (message in
 * err naming png and what gnuplot said). */
int fso_plot_finish(fso_plot *p, char *err, size_t errlen);
/* Drop a chart without drawing it. */
void fso_plot_discard(fso_plot *p);

/* "128K", "1M", "4G": a power-of-1024 size for tic labels. */
void fso_plot_size_label(char *buf, size_t len, double bytes);

/* A benchmark's JSON object, by its "bench" key (nvme, tune, adam, h2d,
 * allgather, pipeline). width/height 0: the kind's default. 0 or -errno (message in
 * err); -EINVAL for an object this fsoff cannot draw. */
int fso_plot_bench(const struct json_t *rec, const char *png, int width, int height, char *err,
                   size_t errlen);

/* A run's --metrics files, in order (one file, or one per segment of a run
 * resumed into new files): loss, gradient norm, learning rate, tokens/s,
 * NVMe GB/s read and written, stall and step time over steps. A resumed
 * segment (a "resume" event, or steps that start again below the last
 * drawn) replaces the steps from there on, and is marked. 0 or -errno
 * (message in err). */
int fso_plot_run(const char *const *metrics_paths, int n_paths, const char *png, int width,
                 int height, char *err, size_t errlen);

/* `fsoff plot FILE... -o FILE.png|FILE.svg [--size WxH]`; argv[0] is
 * "plot". The exit status: 0, 1 failed, 2 usage. */
int fso_plot_main(int argc, char **argv);

#endif
