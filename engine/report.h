/* report.h — what a person and a plotting script see of a run: the banner,
 * step lines (every step or an interval), the summary, and the same as JSON lines (--metrics). */
#ifndef FSO_REPORT_H
#define FSO_REPORT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "train.h"

typedef struct fso_report {
    FILE *out;               /* human lines (stdout) */
    FILE *metrics;           /* JSON lines, or NULL */
    const char *metrics_path;
    int64_t total_steps;
    int64_t print_every;     /* a step line every print_every steps */
    int64_t print_first;     /* and for each of the first print_first */
    double flops_per_token;  /* training FLOPs (forward + backward) per token */
    double peak_flops;       /* all devices' dense bf16 peak; 0: unknown, no MFU */
    /* running totals; the first step is excluded from the averages (when
     * there is more than one) */
    int64_t steps, tokens;
    double start_ms, first_step_ms; /* the clock when the first step began; its step_ms */
    double ms_sum_after_first;
    int64_t tokens_after_first;
    double last_loss, first_loss;
    double wall_ms;
    double stall_ms, optimizer_ms, optimizer_exposed_ms;             /* steps after the first */
    double first_stall_ms, first_optimizer_ms, first_optimizer_exposed_ms;
    uint64_t nvme_read_bytes, nvme_write_bytes;
    /* set by the caller before finish */
    uint64_t peak_device_bytes;
    double final_update_ms;    /* after the last step, waiting for its update (no step's) */
    int64_t first_step;        /* the step the run started from (a checkpoint's), else 0 */
    const char *stopped_by;    /* "SIGTERM"...: a signal stopped the run before its last step */
    bool failed;               /* the run stopped on an error: the summary says so */
    bool pin_refused;          /* host memory could not be pinned */
    uint64_t stale_marks;      /* the last step's count (set by fso_report_step) */
    int64_t val_passes;        /* validation passes reported (fso_report_val) */
    double first_val_loss, last_val_loss, val_ms;
} fso_report;

/* Step lines before the interval takes over, when none is given. */
#define FSO_REPORT_PRINT_FIRST 10

/* Open the metrics file when path is not NULL: truncating it, or with
 * append (a resumed run) adding to what is there. print_every: a step line
 * every N steps (the first and the last always); 0: every step up to
 * FSO_REPORT_PRINT_FIRST, then every total_steps / 100 rounded up to 1, 2
 * or 5 times a power of ten. Returns 0 or negative errno with a message in
 * err. */
int fso_report_init(fso_report *r, FILE *out, const char *metrics_path, bool append,
                    int64_t total_steps, int64_t print_every, double flops_per_token, char *err,
                    size_t errlen);
/* A resumed run's segment of the metrics file begins: {"event": "resume",
 * "step" (the checkpoint's: the next step line is step + 1), "checkpoint"
 * (its folder), "steps" (train.steps now)}. */
void fso_report_resume(fso_report *r, int64_t step, const char *checkpoint);
/* An event the report does not build (train.c's {"event": "plan"}): one
 * JSON object, written as it is on a line of its own. */
void fso_report_event(fso_report *r, const char *json);
void fso_report_step(fso_report *r, const fso_zero_step *st);
/* A validation pass (val.h): a line under the step lines ("val step N |
 * loss | ppl | tokens in batches | ms") and {"event": "val", "step",
 * "loss", "ppl", "tokens", "batches", "ms"}; the summary gives the first
 * and last. */
struct fso_val_result;
void fso_report_val(fso_report *r, const struct fso_val_result *v);
/* A save that finished: a line in the step lines ("checkpoint step N |
 * path | size in seconds, rate | exposed ms") and a {"event": "checkpoint",
 * "step", "path", "bytes", "seconds", "exposed_ms", "cloned_bytes"}
 * object; a failed one (error not NULL) only the {"event":
 * "checkpoint_failed", "step", "path", "error"} object (the run prints the
 * error). */
void fso_report_checkpoint(fso_report *r, int64_t step, const char *path, uint64_t bytes,
                           uint64_t cloned_bytes, double seconds, double exposed_ms,
                           const char *error);
/* Summary line(s) and the "summary" JSON object ("status" "failed" with
 * r->failed, else "stopped" with r->stopped_by, else "done"); closes the
 * metrics file. Returns 0 or negative errno if the metrics file could not
 * be written. */
int fso_report_finish(fso_report *r, char *err, size_t errlen);

/* Peak resident set size of this process, in bytes. */
uint64_t fso_peak_rss_bytes(void);

#endif
