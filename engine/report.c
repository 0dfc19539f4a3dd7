/* report.c — step lines, summary and JSON-lines metrics (see report.h). */
#include "report.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "util.h"
#include "val.h"

uint64_t fso_peak_rss_bytes(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (uint64_t)ru.ru_maxrss * 1024u; /* Linux reports KiB */
}

/* The automatic interval: steps / 100 rounded up to 1, 2 or 5 times a
 * power of ten, so a run prints about 100 lines after its first ten. */
static int64_t auto_print_every(int64_t total_steps)
{
    const int64_t want = total_steps / 100;
    for (int64_t p = 1;; p *= 10)
        for (int i = 0; i < 3; i++) {
            const int64_t every = p * (int64_t[]){1, 2, 5}[i];
            if (every >= want || every > INT64_MAX / 10)
                return every;
        }
}

int fso_report_init(fso_report *r, FILE *out, const char *metrics_path, bool append,
                    int64_t total_steps, int64_t print_every, double flops_per_token, char *err,
                    size_t errlen)
{
    memset(r, 0, sizeof *r);
    r->out = out;
    r->total_steps = total_steps;
    r->print_every = print_every > 0 ? print_every : auto_print_every(total_steps);
    r->print_first = print_every > 0 ? 1 : FSO_REPORT_PRINT_FIRST;
    r->flops_per_token = flops_per_token;
    if (metrics_path) {
        r->metrics = fopen(metrics_path, append ? "a+" : "w");
        if (!r->metrics) {
            int e = errno;
            snprintf(err, errlen, "--metrics %s: cannot %s the file: %s", metrics_path,
                     append ? "open (to append to)" : "create", strerror(e));
            return -e;
        }
        r->metrics_path = metrics_path;
        /* a run killed in the middle of a line: the next object on a line of its own */
        if (append && fseek(r->metrics, -1, SEEK_END) == 0 && fgetc(r->metrics) != '\n')
            fputc('\n', r->metrics);
        fseek(r->metrics, 0, SEEK_END);
    }
    return 0;
}

void fso_report_resume(fso_report *r, int64_t step, const char *checkpoint)
{
    char *q = fso_json_quote(checkpoint);
    if (r->metrics && q) {
        fprintf(r->metrics, "{\"event\": \"resume\", \"step\": %lld, \"checkpoint\": %s, "
                            "\"steps\": %lld}\n",
                (long long)step, q, (long long)r->total_steps);
        fflush(r->metrics);
    }
    free(q);
}

void fso_report_event(fso_report *r, const char *json)
{
    if (r->metrics && json) {
        fprintf(r->metrics, "%s\n", json);
        fflush(r->metrics);
    }
}

/* A duration for the step line: "42.0 s", "4m05s", "3h07m". */
static void duration(char *buf, size_t len, double secs)
{
    if (secs < 59.95)
        snprintf(buf, len, "%.1f s", secs < 0 ? 0.0 : secs);
    else if (secs < 3599.5)
        snprintf(buf, len, "%dm%02ds", (int)(secs + 0.5) / 60, (int)(secs + 0.5) % 60);
    else
        snprintf(buf, len, "%lldh%02dm", (long long)(secs / 3600),
                 (int)((long long)(secs / 60 + 0.5) % 60));
}

/* Whether step's line is printed: the first few, every print_every-th, the
 * run's first and its last. */
static bool printed(const fso_report *r, int64_t step)
{
    return step <= r->print_first || step % r->print_every == 0 || r->steps == 1 ||
           step == r->total_steps;
}

/* {"parameters": N, ...} of per-kind bytes, for a metrics line. */
static void kind_bytes_json(char *buf, size_t len, const uint64_t *bytes)
{
    size_t off = 0;
    for (int k = 0; k < FSO_N_KINDS && off < len; k++)
        off += (size_t)snprintf(buf + off, len - off, "%s\"%s\": %llu", k ? ", " : "{",
                                fso_kind_key(k), (unsigned long long)bytes[k]);
    if (off < len)
        snprintf(buf + off, len - off, "}");
}

void fso_report_step(fso_report *r, const fso_zero_step *st)
{
    double tok_s = st->step_ms > 0 ? st->tokens / (st->step_ms / 1e3) : 0;
    double gflops = tok_s * r->flops_per_token / 1e9;
    if (r->steps == 0) {
        r->first_loss = st->loss;
        r->first_step_ms = st->step_ms;
        r->first_stall_ms = st->stall_ms;
        r->first_optimizer_ms = st->optimizer_ms;
        r->first_optimizer_exposed_ms = st->optimizer_exposed_ms;
    } else {
        r->ms_sum_after_first += st->step_ms;
        r->tokens_after_first += st->tokens;
        r->stall_ms += st->stall_ms;
        r->optimizer_ms += st->optimizer_ms;
        r->optimizer_exposed_ms += st->optimizer_exposed_ms;
    }
    r->steps++;
    r->tokens += st->tokens;
    r->last_loss = st->loss;
    r->wall_ms += st->step_ms;
    const double now = fso_now_ms();
    if (r->steps == 1)
        r->start_ms = now - st->step_ms;

    r->nvme_read_bytes += st->nvme_read_bytes;
    r->nvme_write_bytes += st->nvme_write_bytes;
    r->stale_marks = st->stale_marks;
    double secs = st->step_ms / 1e3;
    double rd_gbps = secs > 0 ? st->nvme_read_bytes / secs / 1e9 : 0;
    double wr_gbps = secs > 0 ? st->nvme_write_bytes / secs / 1e9 : 0;

    if (printed(r, st->step)) {
        char io[512] = "", el[32], eta[32];
        int n = 0;
        /* the time left, at the mean of the steps after the first (which warms up) */
        const double took = now - r->start_ms;
        const double per = r->steps > 1 ? (took - r->first_step_ms) / (double)(r->steps - 1)
                                        : st->step_ms;
        duration(el, sizeof el, took / 1e3);
        duration(eta, sizeof eta, per * (double)(r->total_steps - st->step) / 1e3);
        if (r->peak_flops > 0) /* model FLOPs only: recomputation is not counted as useful */
            n = snprintf(io, sizeof io, " | MFU %.1f%%", 100.0 * gflops * 1e9 / r->peak_flops);
        n += snprintf(io + n, sizeof io - (size_t)n, " | opt %.1f ms, %.1f exposed",
                      st->optimizer_ms, st->optimizer_exposed_ms);
        if (st->nvme_read_bytes || st->nvme_write_bytes) {
            n += snprintf(io + n, sizeof io - (size_t)n, " | NVMe %.2f/%.2f GB/s r/w, GB r/w",
                          rd_gbps, wr_gbps);
            for (int k = 0; k < FSO_N_KINDS; k++)
                if (st->nvme_kind_read[k] || st->nvme_kind_write[k])
                    n += snprintf(io + n, sizeof io - (size_t)n, " %s %.3g/%.3g", fso_kind_abbrev(k),
                                  st->nvme_kind_read[k] / 1e9, st->nvme_kind_write[k] / 1e9);
            n += snprintf(io + n, sizeof io - (size_t)n, " | stall %.1f ms", st->stall_ms);
        }
        if (st->net_bytes) /* across boxes: what this box sent over its rails */
            n += snprintf(io + n, sizeof io - (size_t)n, " | net %.3g GB sent, rails %.1f ms",
                          st->net_bytes / 1e9, st->net_ms);
        if (st->act_bytes) /* the kept activations' trips to the host and back */
            n += snprintf(io + n, sizeof io - (size_t)n, " | acts host %.3g GB d2h+h2d",
                          st->act_bytes / 1e9);
        if (st->stale_marks) /* waits that were stricter than asked (cuda_backend.h) */
            snprintf(io + n, sizeof io - (size_t)n, " | stale marks %llu",
                     (unsigned long long)st->stale_marks);
        fprintf(r->out,
                "step %5lld/%lld | loss %.4f | lr %.3e | norm %7.4f%s | %8.1f ms | %9.0f tok/s | "
                "%6.1f GFLOP/s | %s elapsed, ETA %s%s\n",
                (long long)st->step, (long long)r->total_steps, st->loss, st->lr, st->grad_norm,
                st->clip_coef < 1.0 ? " (clipped)" : "          ", st->step_ms, tok_s, gflops, el,
                eta, io);
        fflush(r->out);
    }
    char kr[256], kw[256];
    kind_bytes_json(kr, sizeof kr, st->nvme_kind_read);
    kind_bytes_json(kw, sizeof kw, st->nvme_kind_write);
    if (r->metrics)
        fprintf(r->metrics,
                "{\"step\": %lld, \"loss\": %.17g, \"lr\": %.9g, \"grad_norm\": %.17g, "
                "\"clip_coef\": %.9g, \"step_ms\": %.6g, \"tokens\": %lld, \"tok_s\": %.6g, "
                "\"gflops\": %.6g, \"mfu\": %.6g, \"stall_ms\": %.6g, \"compute_ms\": %.6g, "
                "\"optimizer_ms\": %.6g, \"optimizer_exposed_ms\": %.6g, "
                "\"nvme_read_bytes\": %llu, \"nvme_write_bytes\": %llu, \"nvme_read_by_kind\": %s, "
                "\"nvme_write_by_kind\": %s, \"act_bytes\": %llu, \"net_bytes\": %llu, "
                "\"net_ms\": %.6g, \"stale_marks\": %llu}\n",
                (long long)st->step, st->loss, st->lr, st->grad_norm, st->clip_coef, st->step_ms,
                (long long)st->tokens, tok_s, gflops,
                r->peak_flops > 0 ? gflops * 1e9 / r->peak_flops : 0.0, st->stall_ms,
                st->compute_ms, st->optimizer_ms,
                st->optimizer_exposed_ms,
                (unsigned long long)st->nvme_read_bytes, (unsigned long long)st->nvme_write_bytes,
                kr, kw, (unsigned long long)st->act_bytes, (unsigned long long)st->net_bytes,
                st->net_ms, (unsigned long long)st->stale_marks);
    if (r->metrics)
        fflush(r->metrics); /* a plot can follow the run */
}

void fso_report_val(fso_report *r, const fso_val_result *v)
{
    if (r->val_passes++ == 0)
        r->first_val_loss = v->loss;
    r->last_val_loss = v->loss;
    r->val_ms += v->ms;
    fprintf(r->out, "val  %5lld/%lld | loss %.4f | ppl %.2f | %lld tokens in %d batch%s | %.1f ms\n",
            (long long)v->step, (long long)r->total_steps, v->loss, v->ppl, (long long)v->tokens,
            v->batches, v->batches == 1 ? "" : "es", v->ms);
    fflush(r->out);
    if (r->metrics) {
        fprintf(r->metrics,
                "{\"event\": \"val\", \"step\": %lld, \"loss\": %.17g, \"ppl\": %.9g, "
                "\"tokens\": %lld, \"batches\": %d, \"ms\": %.6g}\n",
                (long long)v->step, v->loss, v->ppl, (long long)v->tokens, v->batches, v->ms);
        fflush(r->metrics);
    }
}

void fso_report_checkpoint(fso_report *r, int64_t step, const char *path, uint64_t bytes,
                           uint64_t cloned_bytes, double seconds, double exposed_ms,
                           const char *error)
{
    char *qpath = fso_json_quote(path), *qerr = error ? fso_json_quote(error) : NULL;
    if (!error) {
        char h[32], c[64] = "";
        fso_human_bytes(h, sizeof h, (double)bytes);
        if (cloned_bytes) {
            char hc[32];
            fso_human_bytes(hc, sizeof hc, (double)cloned_bytes);
            snprintf(c, sizeof c, " (%s by reflink)", hc);
        }
        fprintf(r->out, "checkpoint step %lld | %s | %s%s in %.2f s, %.1f MiB/s | exposed %.1f "
                        "ms\n",
                (long long)step, path, h, c, seconds,
                seconds > 0 ? bytes / seconds / 1048576.0 : 0.0, exposed_ms);
        fflush(r->out);
    }
    if (r->metrics && qpath && (!error || qerr)) {
        if (error)
            fprintf(r->metrics, "{\"event\": \"checkpoint_failed\", \"step\": %lld, \"path\": %s, "
                                "\"error\": %s}\n", (long long)step, qpath, qerr);
        else
            fprintf(r->metrics, "{\"event\": \"checkpoint\", \"step\": %lld, \"path\": %s, "
                                "\"bytes\": %llu, \"seconds\": %.6g, \"exposed_ms\": %.6g, "
                                "\"cloned_bytes\": %llu}\n",
                    (long long)step, qpath, (unsigned long long)bytes, seconds, exposed_ms,
                    (unsigned long long)cloned_bytes);
        fflush(r->metrics);
    }
    free(qpath);
    free(qerr);
}

int fso_report_finish(fso_report *r, char *err, size_t errlen)
{
    /* averages over the steps after the first, or the one step there is */
    const bool one = r->steps <= 1;
    const double n = one ? 1.0 : (double)(r->steps - 1);
    const double ms = one ? r->wall_ms : r->ms_sum_after_first;
    const double tokens = one ? (double)r->tokens : (double)r->tokens_after_first;
    const double avg_ms = r->steps > 0 ? ms / n : 0;
    const double avg_tok_s = ms > 0 ? tokens / (ms / 1e3) : 0;
    const double stall = (one ? r->first_stall_ms : r->stall_ms) / n;
    const double opt = (one ? r->first_optimizer_ms : r->optimizer_ms) / n;
    const double exposed = (one ? r->first_optimizer_exposed_ms : r->optimizer_exposed_ms) / n;
    uint64_t rss = fso_peak_rss_bytes();
    int rc = 0;

    /* steps are counted from where the run started: a resumed run's are the checkpoint's
     * and its own */
    const long long made = (long long)(r->first_step + r->steps), of = (long long)r->total_steps;
    const char *status = r->failed ? "failed" : r->stopped_by ? "stopped" : "done";
    char val[128] = "", val_json[160] = "";
    if (r->val_passes) {
        snprintf(val, sizeof val, " | val loss %.4f -> %.4f (%lld passes, %.1f s)",
                 r->first_val_loss, r->last_val_loss, (long long)r->val_passes, r->val_ms / 1e3);
        snprintf(val_json, sizeof val_json, ", \"first_val_loss\": %.9g, \"final_val_loss\": "
                 "%.9g, \"val_ms\": %.6g", r->first_val_loss, r->last_val_loss, r->val_ms);
    }
    if (r->steps > 0) {
        if (r->failed)
            fprintf(r->out, "fsoff: failed after %lld of %lld steps (the error above) | ", made,
                    of);
        else if (r->stopped_by)
            fprintf(r->out, "fsoff: stopped by %s after %lld of %lld steps | ", r->stopped_by,
                    made, of);
        else
            fprintf(r->out, "fsoff: done: ");
        fprintf(r->out,
                "%lld step%s, %lld tokens in %.1f s | loss %.4f -> %.4f%s | %.1f ms/step, %.0f "
                "tok/s %s | peak RSS %.1f MiB, device %.1f MiB\n",
                (long long)r->steps, r->steps == 1 ? "" : "s", (long long)r->tokens,
                r->wall_ms / 1e3, r->first_loss, r->last_loss, val, avg_ms, avg_tok_s,
                one ? "(one step: its warm-up included)" : "(first step excluded)",
                rss / 1048576.0, r->peak_device_bytes / 1048576.0);
    }
    fflush(r->out);
    if (r->metrics) {
        fprintf(r->metrics,
                "{\"event\": \"summary\", \"status\": \"%s\", \"steps\": %lld, "
                "\"tokens\": %lld, \"first_loss\": %.9g, \"final_loss\": %.9g, "
                "\"mean_step_ms\": %.6g, \"tok_s\": %.6g, \"wall_ms\": %.6g, "
                "\"stall_ms\": %.6g, \"optimizer_ms\": %.6g, \"optimizer_exposed_ms\": %.6g, "
                "\"final_update_ms\": %.6g, \"nvme_read_bytes\": %llu, "
                "\"nvme_write_bytes\": %llu, \"peak_device_bytes\": %llu, "
                "\"peak_rss_bytes\": %llu, \"pin_refused\": %s, \"stale_marks\": %llu%s}\n",
                status, (long long)r->steps, (long long)r->tokens,
                r->first_loss, r->last_loss, avg_ms, avg_tok_s, r->wall_ms, stall, opt, exposed,
                r->final_update_ms, (unsigned long long)r->nvme_read_bytes,
                (unsigned long long)r->nvme_write_bytes,
                (unsigned long long)r->peak_device_bytes, (unsigned long long)rss,
                r->pin_refused ? "true" : "false", (unsigned long long)r->stale_marks, val_json);
        if (ferror(r->metrics) | (fclose(r->metrics) != 0)) {
            int e = errno ? errno : EIO;
            snprintf(err, errlen, "--metrics %s: write failed: %s", r->metrics_path, strerror(e));
            rc = -e;
        }
        r->metrics = NULL;
    }
    return rc;
}
