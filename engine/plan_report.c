/* plan_report.c — a plan as people and scripts read it (plan.h
 * fso_plan_print, fso_plan_json): the table and its lines, and the JSON
 * object `fsoff plan --json` prints. */
#include "plan.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static void cell(char *buf, size_t len, uint64_t bytes)
{
    if (bytes == 0)
        snprintf(buf, len, "-");
    else
        fso_human_bytes(buf, len, (double)bytes);
}

/* Several boxes: what crosses between them, and when the network bounds
 * the step, what moves it. */
static void print_boxes(FILE *f, const fso_plan *p, int boxes)
{
    const double g = (double)fso_fp_elem_bytes(&p->rules, FSO_KIND_GRAD);
    const double w = (double)fso_fp_elem_bytes(&p->rules, FSO_KIND_PARAM);
    char all[32], rs[32], ag[32];
    fso_human_bytes(all, sizeof all, (double)p->net_bytes);
    fso_human_bytes(rs, sizeof rs, (double)p->net_bytes * g / (g + w));
    fso_human_bytes(ag, sizeof ag, (double)p->net_bytes * w / (g + w));
    fprintf(f, "plan: between boxes: %s sent per box and step (%d boxes x %d device%s): the "
               "gradients reduce-scattered, %s, in the open before the global norm, and the "
               "updated parameters all-gathered, %s, block by block in the optimizer's path; "
               "the network busy %.1f ms of the %.1f ms step (%.1f ms of it on the critical "
               "path)\n",
            all, boxes, p->machine.devices, p->machine.devices == 1 ? "" : "s", rs, ag,
            p->net_ms, p->step_ms, p->critical_ms[FSO_STREAM_NET]);
    if (p->fits && p->bottleneck == FSO_STREAM_NET)
        fprintf(f, "plan: bound: the network between boxes, not the optimizer (%.0f%% of the "
                   "critical path): a faster network (--net-gbps), fewer boxes (--boxes), or a "
                   "larger global batch (more accumulation sends the same bytes for more "
                   "tokens) moves it\n",
                p->step_ms > 0 ? 100 * p->critical_ms[FSO_STREAM_NET] / p->step_ms : 0);
}

void fso_plan_print(FILE *f, const fso_plan *p)
{
    static const char *const rows[FSO_N_TIERS] = {"device (each)", "host (all)", "nvme (all)"};
    static const char *const box_rows[FSO_N_TIERS] = {"device (each)", "host (box)",
                                                      "nvme (box)"};
    const int boxes = p->machine.boxes > 1 ? p->machine.boxes : 1;
    char desc[512];
    fprintf(f, "plan: %-14s %11s %11s %11s %11s %11s %11s %11s\n", "memory", "parameters",
            "gradients", "optimizer", "activations", "buffers", "need", "capacity");
    for (int t = 0; t < FSO_N_TIERS; t++) {
        char c[7][32];
        uint64_t opt = p->kind_bytes[t][FSO_KIND_MASTER] + p->kind_bytes[t][FSO_KIND_M] +
                       p->kind_bytes[t][FSO_KIND_V];
        cell(c[0], 32, p->kind_bytes[t][FSO_KIND_PARAM]);
        cell(c[1], 32, p->kind_bytes[t][FSO_KIND_GRAD]);
        cell(c[2], 32, opt);
        cell(c[3], 32, t == FSO_TIER_DEVICE ? p->activation_bytes
                       : t == FSO_TIER_HOST ? p->act_host_bytes
                                            : 0);
        cell(c[4], 32, p->buffer_bytes[t]);
        cell(c[5], 32, p->need_bytes[t]);
        cell(c[6], 32, p->have_bytes[t]);
        fprintf(f, "plan:   %-12s %11s %11s %11s %11s %11s %11s %11s%s\n",
                boxes > 1 ? box_rows[t] : rows[t], c[0], c[1],
                c[2], c[3], c[4], c[5], c[6],
                p->need_bytes[t] > p->have_bytes[t] ? "  SHORT" : "");
    }
    if (p->margin_bytes > 0) {
        char mb[32], all[32];
        fso_human_bytes(mb, sizeof mb, (double)p->margin_bytes);
        fso_human_bytes(all, sizeof all, (double)p->machine.device_mem_bytes);
        fprintf(f, "plan: device margin: %s of each device's %s kept free (train.device_margin "
                   "%.2g); the device capacity above is what is left\n",
                mb, all, p->machine.device_margin);
    } else {
        fprintf(f, "plan: device margin: none (train.device_margin 0)\n");
    }
    fso_plan_describe(p, desc, sizeof desc);
    fprintf(f, "plan: placement: %s\n", desc);
    if (p->pl.acts == FSO_TIER_HOST) {
        char hb[32], cb[32];
        fso_human_bytes(hb, sizeof hb, (double)p->act_host_bytes);
        fso_human_bytes(cb, sizeof cb, (double)p->act_copy_bytes);
        fprintf(f, "plan: activations: kept layer inputs on the host (%s, all devices; a ring "
                   "of slots on each device), %s down and up per micro-batch and device\n",
                hb, cb);
    }
    char why[1024];
    fso_plan_why(p, why, sizeof why);
    if (why[0])
        fprintf(f, "plan: why: %s\n", why);
    if (!p->fits) {
        fprintf(f, "plan: does not fit (see the SHORT row)\n");
        return;
    }
    double crit = 0;
    for (int s = 0; s < FSO_N_STREAMS; s++)
        crit += p->critical_ms[s];
    fprintf(f, "plan: predicted %.1f ms/step, %.0f tok/s; bottleneck: %s (critical path:",
            p->step_ms, p->tokens_per_s, fso_stream_name(p->bottleneck));
    int shown = 0;
    /* largest first */
    double c[FSO_N_STREAMS];
    memcpy(c, p->critical_ms, sizeof c);
    for (;;) {
        int best = -1;
        for (int s = 0; s < FSO_N_STREAMS; s++)
            if (c[s] > 0.005 * crit && (best < 0 || c[s] > c[best]))
                best = s;
        if (best < 0)
            break;
        fprintf(f, "%s %s %.0f%%", shown++ ? "," : "", fso_stream_name(best),
                crit > 0 ? 100 * c[best] / crit : 0);
        c[best] = 0;
    }
    fprintf(f, ")\n");
    fprintf(f, "plan: busy per step and device (ms):");
    for (int s = 0; s < FSO_N_STREAMS; s++)
        if (s != FSO_STREAM_NET || boxes > 1) /* one box: no network */
            fprintf(f, "%s %s %.1f", s ? " |" : "", fso_stream_name(s), p->busy_ms[s]);
    fprintf(f, "; compute waits %.1f ms\n", p->stall_ms);
    if (p->mfu > 0)
        fprintf(f, "plan: MFU %.1f%% (model FLOPs, 3 x the forward's per token, recomputation not "
                   "counted, over %d x %.0f TFLOP/s dense bf16 peak)\n",
                100 * p->mfu, p->machine.devices * boxes, p->machine.peak_gflops / 1e3);
    if (boxes > 1)
        print_boxes(f, p, boxes);
}

static json_t *tier_json(const fso_plan *p, int t)
{
    uint64_t opt = p->kind_bytes[t][FSO_KIND_MASTER] + p->kind_bytes[t][FSO_KIND_M] +
                   p->kind_bytes[t][FSO_KIND_V];
    /* capacity_bytes: what the plan may use; on the devices, their memory
     * less margin_bytes */
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b}", "bytes",
                     (json_int_t)p->need_bytes[t], "capacity_bytes", (json_int_t)p->have_bytes[t],
                     "margin_bytes", (json_int_t)(t == FSO_TIER_DEVICE ? p->margin_bytes : 0),
                     "parameters", (json_int_t)p->kind_bytes[t][FSO_KIND_PARAM], "gradients",
                     (json_int_t)p->kind_bytes[t][FSO_KIND_GRAD], "optimizer_state",
                     (json_int_t)opt, "activations",
                     (json_int_t)(t == FSO_TIER_DEVICE ? p->activation_bytes
                                  : t == FSO_TIER_HOST ? p->act_host_bytes
                                                       : 0),
                     "buffers",
                     (json_int_t)p->buffer_bytes[t], "fits",
                     p->need_bytes[t] <= p->have_bytes[t]);
}

json_t *fso_plan_json(const fso_plan *p)
{
    char desc[512];
    json_t *tiers = json_object(), *placement = json_object(), *busy = json_object(),
           *crit = json_object();
    for (int t = 0; t < FSO_N_TIERS; t++)
        json_object_set_new(tiers, fso_tier_name(t), tier_json(p, t));
    for (int k = 0; k < FSO_N_KINDS; k++) {
        int count[FSO_N_TIERS] = {0};
        for (int b = 0; b < p->pl.n_blocks; b++)
            count[p->pl.tier[k][b]]++;
        json_t *at = json_object();
        for (int t = 0; t < FSO_N_TIERS; t++)
            json_object_set_new(at, fso_tier_name(t), json_integer(count[t]));
        json_object_set_new(placement, fso_kind_key(k), at);
    }
    for (int s = 0; s < FSO_N_STREAMS; s++) {
        json_object_set_new(busy, fso_stream_name(s), json_real(p->busy_ms[s]));
        json_object_set_new(crit, fso_stream_name(s), json_real(p->critical_ms[s]));
    }
    bool wc = false;
    for (int b = 0; b < p->pl.n_blocks; b++)
        wc = wc || (p->pl.whole_copy[b] && p->pl.tier[FSO_KIND_PARAM][b] != FSO_TIER_DEVICE);
    json_t *why = json_object();
    for (int k = 0; k < FSO_N_KINDS && p->explained; k++) {
        const fso_plan_reason *r = &p->why[k];
        json_t *o = json_pack("{s:s, s:b}", "tier", fso_tier_name(r->tier), "pinned", r->pinned);
        if (!r->pinned && r->alt_tier >= 0) {
            json_object_set_new(o, "instead", json_string(fso_tier_name(r->alt_tier)));
            json_object_set_new(o, "fits", json_boolean(r->alt_fits));
            if (r->alt_fits)
                json_object_set_new(o, "step_ms", json_real(r->alt_step_ms));
            else if (r->short_tier >= 0)
                json_object_set_new(o, "short", json_pack("{s:s, s:I}", "tier",
                                                          fso_tier_name(r->short_tier), "bytes",
                                                          (json_int_t)r->short_bytes));
        }
        json_object_set_new(why, fso_kind_key(k), o);
    }
    fso_plan_describe(p, desc, sizeof desc);
    const fso_plan_machine *m = &p->machine;
    json_t *mj = json_pack(
        "{s:i, s:b, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "devices",
        m->devices, "cpu_devices", m->cpu_devices, "device_mem_bytes",
        (json_int_t)m->device_mem_bytes, "host_mem_bytes", (json_int_t)m->host_mem_bytes,
        "nvme_free_bytes", (json_int_t)m->nvme_free_bytes, "nvme_read_gbps", m->nvme_read_gbps,
        "nvme_write_gbps", m->nvme_write_gbps, "h2d_gbps", m->h2d_gbps, "d2h_gbps", m->d2h_gbps,
        "coll_gbps", m->coll_gbps, "device_gflops", m->device_gflops, "adam_gelems",
        m->adam_gelems, "device_adam_gelems", m->device_adam_gelems, "host_copy_gbps",
        m->host_copy_gbps);
    json_object_set_new(mj, "device_margin", json_real(m->device_margin));
    json_object_set_new(mj, "nvme_read_cpu_s_per_gb", json_real(m->nvme_read_cpu_s_per_gb));
    json_object_set_new(mj, "nvme_write_cpu_s_per_gb", json_real(m->nvme_write_cpu_s_per_gb));
    json_object_set_new(mj, "nvme_drain_gbps", json_real(m->nvme_drain_gbps > 0 ? m->nvme_drain_gbps
                                                                            : m->nvme_write_gbps));
    json_t *j = json_pack(
        "{s:b, s:f, s:f, s:s, s:f, s:s, s:o, s:i, s:b, s:o, s:o, s:o, s:o, s:i}", "fits",
        p->fits, "predicted_step_ms", p->step_ms, "tokens_per_s", p->tokens_per_s, "bottleneck",
        fso_stream_name(p->bottleneck), "stall_ms", p->stall_ms, "placement_text", desc,
        "placement", placement, "prefetch_blocks", p->pl.prefetch, "whole_copy", wc, "tiers",
        tiers, "busy_ms", busy, "critical_ms", crit, "machine", mj, "evaluated", p->evaluated);
    json_object_set_new(j, "why", why);
    /* several boxes (planner.h): per box and step */
    json_object_set_new(j, "boxes", json_integer(p->machine.boxes > 1 ? p->machine.boxes : 1));
    json_object_set_new(j, "net_gbps", json_real(p->machine.net_gbps));
    json_object_set_new(j, "net_bytes", json_integer((json_int_t)p->net_bytes));
    json_object_set_new(j, "net_ms", json_real(p->net_ms));
    /* null where no peak is known (CPU devices) */
    json_object_set_new(j, "mfu", p->mfu > 0 ? json_real(p->mfu) : json_null());
    char aw[192];
    fso_plan_acts_why(p, aw, sizeof aw);
    json_object_set_new(j, "activations",
                        json_pack("{s:s, s:I, s:I, s:I, s:s}", "tier", fso_tier_name(p->pl.acts),
                                  "device_bytes", (json_int_t)p->activation_bytes, "host_bytes",
                                  (json_int_t)p->act_host_bytes, "copy_bytes_per_micro_batch",
                                  (json_int_t)p->act_copy_bytes, "why", aw));
    json_t *sh = json_object(), *least = json_object();
    for (int t = 0; t < FSO_N_TIERS; t++) {
        json_object_set_new(sh, fso_tier_name(t), json_integer(p->search.short_on[t]));
        json_object_set_new(least, fso_tier_name(t),
                            json_integer((json_int_t)p->search.least_short[t]));
    }
    json_object_set_new(j, "search", json_pack("{s:i, s:i, s:o, s:o}", "considered",
                                               p->search.considered, "fit", p->search.fit,
                                               "short", sh, "least_short_bytes", least));
    return j;
}

void fso_plan_print_json(FILE *f, const fso_plan *p)
{
    json_t *j = fso_plan_json(p);
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
    if (s)
        fprintf(f, "%s\n", s);
    free(s);
    json_decref(j);
}
