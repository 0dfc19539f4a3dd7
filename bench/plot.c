/* plot.c — the gnuplot driver (plot.h) and `fsoff plot`. */
#include "plot.h"

#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define PLOT_INSTALL "install gnuplot (Debian/Ubuntu: sudo apt-get install gnuplot-nox; " \
                     "Fedora: sudo dnf install gnuplot)"

void fso_plot_quote(FILE *f, const char *fmt, ...)
{
    char text[4200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    fputc('\'', f);
    for (const char *s = text; *s; s++) {
        if (*s == '\'')
            fputc('\'', f);
        if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
    }
    fputc('\'', f);
}

void fso_plot_size_label(char *buf, size_t len, double bytes)
{
    static const char *const units[] = {"", "K", "M", "G", "T"};
    int u = 0;
    while (bytes >= 1024 && u < 4) {
        bytes /= 1024;
        u++;
    }
    if (bytes == (double)(long long)bytes)
        snprintf(buf, len, "%lld%s", (long long)bytes, units[u]);
    else
        snprintf(buf, len, "%.3g%s", bytes, units[u]);
}

/* The chart's format, from its name: 1 SVG (.svg), 0 PNG (.png, or no
 * extension), -1 another extension, which fsoff does not write. */
static int svg_by_name(const char *path)
{
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    const char *dot = strrchr(base, '.');
    if (!dot || dot == base || strcasecmp(dot, ".png") == 0)
        return 0;
    return strcasecmp(dot, ".svg") == 0 ? 1 : -1;
}

int fso_plot_check_name(const char *path, char *err, size_t errlen)
{
    if (svg_by_name(path) >= 0)
        return 0;
    snprintf(err, errlen, "%s: fsoff draws PNG or SVG charts; name the file FILE.png or "
                          "FILE.svg", path);
    return -EINVAL;
}

int fso_plot_begin(fso_plot *p, const char *png, int width, int height, char *err,
                   size_t errlen)
{
    memset(p, 0, sizeof *p);
    if (!png || !png[0] || strlen(png) >= sizeof p->png) {
        snprintf(err, errlen, "plot: the output file name is empty or too long");
        return -EINVAL;
    }
    if (fso_plot_check_name(png, err, errlen) < 0)
        return -EINVAL;
    p->svg = svg_by_name(png) == 1;
    snprintf(p->png, sizeof p->png, "%s", png);
    p->f = open_memstream(&p->text, &p->len);
    if (!p->f) {
        snprintf(err, errlen, "plot %s: out of memory", png);
        return -ENOMEM;
    }
    if (p->svg) /* gnuplot's svg terminal; white, as the PNGs are */
        fprintf(p->f, "set terminal svg size %d,%d noenhanced font 'sans,10' background "
                      "'white'\nset output ", width, height);
    else
        fprintf(p->f, "set terminal pngcairo size %d,%d noenhanced font 'sans,10'\nset output ",
                width, height);
    fso_plot_quote(p->f, "%s", png);
    fprintf(p->f, "\nset grid\nset key box opaque\nset datafile missing 'nan'\n");
    return 0;
}

void fso_plot_discard(fso_plot *p)
{
    if (p->f)
        fclose(p->f);
    free(p->text);
    memset(p, 0, sizeof *p);
}

/* The first line of what gnuplot said, from fd, into buf. */
static void first_line(int fd, char *buf, size_t len)
{
    char text[1024];
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    text[n > 0 ? n : 0] = 0;
    char *s = text;
    while (*s == '\n' || *s == ' ')
        s++;
    s[strcspn(s, "\n")] = 0;
    snprintf(buf, len, "%.400s", s[0] ? s : "no message");
}

/* Whether path begins as a PNG does, or with svg an SVG (an XML
 * declaration or the svg element). */
static bool is_chart(const char *path, bool svg)
{
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    unsigned char head[8];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, head, sizeof head);
    close(fd);
    if (svg)
        return n >= 5 && (memcmp(head, "<?xml", 5) == 0 || memcmp(head, "<svg", 4) == 0);
    return n == (ssize_t)sizeof head && memcmp(head, sig, sizeof sig) == 0;
}

int fso_plot_finish(fso_plot *p, char *err, size_t errlen)
{
    char script[] = "/tmp/fsoff-plot-XXXXXX.gp", errfile[] = "/tmp/fsoff-plot-XXXXXX.err";
    const char *tmpdir = getenv("TMPDIR");
    char sbuf[4096], ebuf[4096];
    int rc = 0, sfd = -1, efd = -1;
    if (fclose(p->f) != 0) {
        p->f = NULL;
        snprintf(err, errlen, "plot %s: out of memory", p->png);
        rc = -ENOMEM;
        goto out;
    }
    p->f = NULL;
    if (tmpdir && tmpdir[0] == '/' && strlen(tmpdir) < 3000) {
        snprintf(sbuf, sizeof sbuf, "%s/fsoff-plot-XXXXXX.gp", tmpdir);
        snprintf(ebuf, sizeof ebuf, "%s/fsoff-plot-XXXXXX.err", tmpdir);
    } else {
        snprintf(sbuf, sizeof sbuf, "%s", script);
        snprintf(ebuf, sizeof ebuf, "%s", errfile);
    }
    sfd = mkstemps(sbuf, 3);
    efd = mkstemps(ebuf, 4);
    if (sfd < 0 || efd < 0) {
        rc = -errno;
        snprintf(err, errlen, "plot %s: cannot create a temporary file in %s: %s; set TMPDIR "
                 "to a writable folder", p->png, tmpdir ? tmpdir : "/tmp", strerror(errno));
        goto out;
    }
    unlink(ebuf);
    if (write(sfd, p->text, p->len) != (ssize_t)p->len) {
        rc = -EIO;
        snprintf(err, errlen, "plot %s: cannot write the gnuplot script %s: %s", p->png, sbuf,
                 strerror(errno));
        goto out;
    }

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, efd, 2);
    char *argv[] = {"gnuplot", sbuf, NULL};
    pid_t pid;
    int e = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e == ENOENT) {
        snprintf(err, errlen, "plot %s: gnuplot is not installed (not found on PATH); %s",
                 p->png, PLOT_INSTALL);
        rc = -ENOENT;
        goto out;
    }
    if (e) {
        snprintf(err, errlen, "plot %s: cannot run gnuplot: %s", p->png, strerror(e));
        rc = -e;
        goto out;
    }
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char said[512];
        first_line(efd, said, sizeof said);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
            snprintf(err, errlen, "plot %s: gnuplot could not be started (%s); %s", p->png,
                     said, PLOT_INSTALL);
        else if (p->svg && strstr(said, "unknown or ambiguous terminal"))
            snprintf(err, errlen, "plot %s: this gnuplot has no svg terminal (%s); write a "
                                  ".png instead, or install a gnuplot built with it", p->png,
                     said);
        else
            snprintf(err, errlen, "plot %s: gnuplot failed (%s %d): %s", p->png,
                     WIFEXITED(status) ? "exit status" : "signal",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), said);
        unlink(p->png);
        rc = -EIO;
        goto out;
    }
    if (!is_chart(p->png, p->svg)) {
        char said[512];
        first_line(efd, said, sizeof said);
        snprintf(err, errlen, "plot %s: gnuplot wrote no %s there (%s); check that the folder "
                 "exists and is writable", p->png, p->svg ? "SVG" : "PNG", said);
        unlink(p->png);
        rc = -EIO;
    }
out:
    if (sfd >= 0) {
        close(sfd);
        unlink(sbuf);
    }
    if (efd >= 0)
        close(efd);
    fso_plot_discard(p);
    return rc;
}

/* ------------------------------------------------------------ fsoff plot */

static void plot_usage(FILE *f)
{
    fprintf(f,
            "usage: fsoff plot FILE... -o FILE.png|FILE.svg [--size WxH]\n"
            "\n"
            "Draw a training run from its --metrics file (loss, gradient norm, learning rate,\n"
            "tokens/s, NVMe GB/s read and written, stall and step time over steps), or a\n"
            "benchmark result from `fsoff bench ... --json FILE` (the chart its --plot draws).\n"
            "A run resumed from a checkpoint is drawn whole: its file with every segment, or\n"
            "its files in order; each resume is marked. Needs gnuplot.\n"
            "\n"
            "  -o, --output FILE      the chart to write: FILE.png, or FILE.svg for an SVG\n"
            "      --size WxH         pixels (default %dx%d for a run, %dx%d for nvme and\n"
            "                         tune, %dx%d for the other benchmarks)\n"
            "  -h, --help             this help\n",
            FSO_PLOT_RUN_W, FSO_PLOT_RUN_H, FSO_PLOT_NVME_W, FSO_PLOT_NVME_H, FSO_PLOT_SMALL_W,
            FSO_PLOT_SMALL_H);
}

static int plot_bad(const char *what)
{
    fprintf(stderr, "fsoff: error: plot: %s; see fsoff plot --help\n", what);
    return 2;
}

int fso_plot_main(int argc, char **argv)
{
    static const struct option opts[] = {{"output", required_argument, NULL, 'o'},
                                         {"size", required_argument, NULL, 's'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *out = NULL;
    int w = 0, h = 0, c;
    char msg[4200];
    optind = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            out = optarg;
            break;
        case 's': {
            char x;
            if (sscanf(optarg, "%d%c%d", &w, &x, &h) != 3 || (x != 'x' && x != 'X') || w < 64 ||
                h < 64 || w > 10000 || h > 10000) {
                snprintf(msg, sizeof msg, "--size %s: expected WIDTHxHEIGHT in pixels, 64 to "
                         "10000 each (e.g. 1200x800)", optarg);
                return plot_bad(msg);
            }
            break;
        }
        case 'h':
            plot_usage(stdout);
            return 0;
        case ':':
            snprintf(msg, sizeof msg, "%s needs a value", argv[optind - 1]);
            return plot_bad(msg);
        default:
            snprintf(msg, sizeof msg, "unknown option %s", argv[optind - 1]);
            return plot_bad(msg);
        }
    }
    if (optind >= argc)
        return plot_bad("give the file to draw: a --metrics file or a bench --json result");
    if (!out)
        return plot_bad("give the chart's file name with -o FILE.png (or FILE.svg)");
    if (fso_plot_check_name(out, msg, sizeof msg) < 0)
        return plot_bad(msg);
    const char *const *in = (const char *const *)argv + optind;
    const int n_in = argc - optind;
    struct stat st;
    for (int i = 0; i < n_in; i++)
        if (stat(in[i], &st) != 0 || !S_ISREG(st.st_mode)) {
            fprintf(stderr, "fsoff: error: plot: %s: %s\n", in[i],
                    errno == 0 || S_ISDIR(st.st_mode) ? "not a file" : strerror(errno));
            return 2;
        }

    char err[4200] = "";
    int rc;
    json_error_t je;
    json_t *rec = json_load_file(in[0], JSON_DISABLE_EOF_CHECK, &je);
    if (rec && json_is_object(rec) && json_is_string(json_object_get(rec, "bench"))) {
        if (n_in > 1) {
            json_decref(rec);
            snprintf(msg, sizeof msg, "%s is a bench result, drawn alone; unexpected \"%s\" "
                     "(several files are the segments of one training run)", in[0], in[1]);
            return plot_bad(msg);
        }
        rc = fso_plot_bench(rec, out, w, h, err, sizeof err);
        if (rc == -EINVAL) {
            json_decref(rec);
            fprintf(stderr, "fsoff: error: plot: %s: %s\n", in[0], err);
            return 2;
        }
    } else {
        rc = fso_plot_run(in, n_in, out, w, h, err, sizeof err);
        if (rc == -EINVAL) {
            json_decref(rec);
            fprintf(stderr, "fsoff: error: plot: %s\n", err);
            return 2;
        }
    }
    json_decref(rec);
    if (rc < 0) {
        fprintf(stderr, "fsoff: error: %s\n", err);
        return 1;
    }
    printf("fsoff: plot: wrote %s\n", out);
    return 0;
}
