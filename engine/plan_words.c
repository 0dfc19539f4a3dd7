/* plan_words.c — a plan that does not fit, and the planner's search, in
 * words (plan.h): every short tier with its amount, and fixes the command
 * did not already take, each sized by planning again with that tier
 * unbounded; what the search looked at and why none of it fits.
 *
 * Contract: one line each, naming the thing, the place and the fix; a fix
 * names only options the command has (fsoff train's or fsoff plan's), and
 * never one that was given with the value that falls short unless it says
 * what value would do.
 */
#include "plan.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* The generic fix for a short tier, in the options of the command asking
 * (fsoff train's or fsoff plan's): what is said when planning again does
 * not size one. */
static const char *fix_for(int tier, bool train)
{
    switch (tier) {
    case FSO_TIER_DEVICE:
        return train ? "move state off the devices (host or NVMe), add devices (--devices), or "
                       "raise --device-mem"
                     : "move state off the devices (host or NVMe), add devices, or give each "
                       "more memory (--device-mem / --gpu-mem)";
    case FSO_TIER_HOST:
        return train ? "add NVMe folders for the state (--nvme DIR)"
                     : "add NVMe folders for the state (--nvme DIR), or more host memory "
                       "(--host-mem)";
    default:
        return "free space on the NVMe folders or add folders (--nvme DIR1,DIR2)";
    }
}

/* What the configuration pins, and how to let fsoff choose, as a
 * parenthesis; "" when nothing is pinned. */
static void pinned_note(const fso_plan_pins *pins, bool train, char *buf, size_t len)
{
    static const char *const keys[] = {"zero_optimization.offload_param.device",
                                       "zero_optimization.offload_optimizer.device"};
    size_t off = 0;
    int npinned = 0;
    const char *key = NULL;
    buf[0] = 0;
    for (int k = 0; pins && k < FSO_N_KINDS; k++)
        if (pins->tier[k] >= 0 && off < len && (k == FSO_KIND_PARAM || k == FSO_KIND_MASTER)) {
            off += (size_t)snprintf(buf + off, len - off, "%s%s on %s",
                                    off ? ", " : " (the configuration pins ",
                                    k == FSO_KIND_PARAM ? "parameters" : "optimizer state",
                                    fso_tier_name(pins->tier[k]));
            key = keys[k != FSO_KIND_PARAM];
            npinned++;
        }
    if (off && off < len && !train)
        snprintf(buf + off, len - off, "; --auto lets fsoff choose)");
    else if (off && off < len)
        snprintf(buf + off, len - off, "; leave %s out to let fsoff choose)",
                 npinned > 1 ? "zero_optimization's offload devices" : key);
}

/* CPU devices whose memory is their share of the host's (no --device-mem):
 * a device shortfall is host memory's. */
static bool device_is_host_share(const fso_plan *p, const fso_plan_origin *o)
{
    return p->machine.cpu_devices && o && !o->device_given;
}

/* One short tier of p, with its amount, into buf. */
static void short_words(const fso_plan *p, const fso_plan_origin *o, int t, char *buf, size_t len)
{
    char need[32], have[32], by[32], act[32], fx[32];
    const uint64_t W = (uint64_t)(p->machine.devices > 0 ? p->machine.devices : 1);
    fso_human_bytes(need, sizeof need, (double)p->need_bytes[t]);
    fso_human_bytes(have, sizeof have, (double)p->have_bytes[t]);
    fso_human_bytes(by, sizeof by, (double)(p->need_bytes[t] - p->have_bytes[t]));
    fso_human_bytes(act, sizeof act, (double)p->activation_bytes);
    /* another machine planned with this one's host memory */
    const bool borrowed_host = o && o->other_machine && !o->host_given;
    if (t == FSO_TIER_DEVICE) {
        const uint64_t fixed = p->activation_bytes + p->buffer_bytes[FSO_TIER_DEVICE];
        fso_human_bytes(fx, sizeof fx, (double)fixed);
        if (device_is_host_share(p, o)) {
            char hb[32], sh[32];
            fso_human_bytes(hb, sizeof hb, (double)p->machine.host_mem_bytes);
            fso_human_bytes(sh, sizeof sh,
                            (double)((p->need_bytes[t] - p->have_bytes[t]) * 2 * W));
            snprintf(buf, len, "host memory: each CPU device gets %s (half of %s%s, shared by %d "
                     "device%s) and needs %s%s; short by %s of host memory", have, hb,
                     o->host_given ? " given by --host-mem" : " available", (int)W,
                     W == 1 ? "" : "s", need,
                     fixed > p->have_bytes[t] ? " for its activations and buffers alone" : "",
                     sh);
        } else if (fixed > p->have_bytes[t])
            snprintf(buf, len, "device memory: the activations (%s with checkpointing) and "
                     "buffers alone need %s per device, which holds %s; short by %s", act, fx,
                     have, by);
        else
            snprintf(buf, len, "device memory: each device needs %s but holds %s; short by %s",
                     need, have, by);
    } else if (t == FSO_TIER_HOST) {
        snprintf(buf, len, "host memory: the host tier and staging need %s but %s is available%s;"
                 " short by %s", need, have, borrowed_host ? " on this machine" : "", by);
    } else {
        const char *dirs = o && o->nvme_dirs && o->nvme_dirs[0] ? o->nvme_dirs : NULL;
        snprintf(buf, len, "NVMe: the NVMe tier needs %s but %s is free%s%s; short by %s", need,
                 have, dirs ? " on " : "", dirs ? dirs : "", by);
    }
}

/* Plans `in` again with tier t unbounded: the least any placement that fits
 * then needs there, into *need; false when none fits even so. */
static bool least_with(const fso_plan_input *in, int t, uint64_t *need)
{
    fso_plan_input x = *in;
    fso_plan *out = malloc(sizeof *out);
    const uint64_t lots = (uint64_t)1 << 60;
    if (!out)
        return false;
    if (t == FSO_TIER_DEVICE) {
        x.machine.device_mem_bytes = lots;
        /* with room for everything the search keeps every block on the
         * devices; the least a placement needs there is one without
         * per-block residency (which only adds to it) */
        x.engine.per_block_tiers = false;
    }
    else if (t == FSO_TIER_HOST)
        x.machine.host_mem_bytes = lots;
    else {
        x.machine.nvme_free_bytes = lots;
        if (!(x.machine.nvme_read_gbps > 0)) /* a drive to come: its rates rank, not decide */
            x.machine.nvme_read_gbps = x.machine.nvme_write_gbps = 1;
    }
    bool fits = fso_plan_choose(&x, out) == 0;
    *need = out->search.least_need[t];
    free(out);
    return fits;
}

/* CPU devices whose memory is half the host's, shared: the least host
 * memory with which a placement fits (the devices' share growing with
 * it), to about 1%, into *need; false when none fits with any. */
static bool least_host_share(const fso_plan_input *in, uint64_t *need)
{
    fso_plan_input x = *in;
    fso_plan *out = malloc(sizeof *out);
    const uint64_t W = (uint64_t)(in->machine.devices > 0 ? in->machine.devices : 1);
    uint64_t lo = in->machine.host_mem_bytes, hi = lo ? lo : (uint64_t)1 << 20;
    bool fits = false;
    if (!out)
        return false;
    while (!fits && hi < (uint64_t)1 << 60) { /* doubling until one fits: lo does not */
        hi *= 2;
        x.machine.host_mem_bytes = hi;
        x.machine.device_mem_bytes = hi / 2 / W;
        fits = fso_plan_choose(&x, out) == 0;
        if (!fits)
            lo = hi;
    }
    while (fits && hi - lo > hi / 128) { /* bisect down to 1% */
        const uint64_t mid = lo + (hi - lo) / 2;
        x.machine.host_mem_bytes = mid;
        x.machine.device_mem_bytes = mid / 2 / W;
        if (fso_plan_choose(&x, out) == 0)
            hi = mid;
        else
            lo = mid;
    }
    free(out);
    *need = hi;
    return fits;
}

/* The device memory whose share left after the plan's margin
 * (planner.h fso_plan_machine.device_margin) holds need. */
static uint64_t device_with_margin(const fso_plan_machine *m, uint64_t need)
{
    const double margin = m->device_margin > 0 && m->device_margin < 1 ? m->device_margin : 0;
    return margin > 0 ? (uint64_t)((double)need / (1 - margin)) + 1 : need;
}

/* A size as an option takes it, rounded up: "148G", "45M". */
static void opt_size(char *buf, size_t len, uint64_t bytes)
{
    static const char units[] = "KMGT";
    int u = 0;
    uint64_t unit = 1024;
    while (u < 3 && bytes > unit * 1024 * 10)
        u++, unit *= 1024;
    snprintf(buf, len, "%llu%c", (unsigned long long)((bytes + unit - 1) / unit), units[u]);
}

/* Appends one fix to buf (", or " between fixes). */
static void add_fix(char *buf, size_t len, size_t *off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void add_fix(char *buf, size_t len, size_t *off, const char *fmt, ...)
{
    va_list ap;
    if (*off >= len)
        return;
    if (*off)
        *off += (size_t)snprintf(buf + *off, len - *off, "; or ");
    if (*off >= len)
        return;
    va_start(ap, fmt);
    *off += (size_t)vsnprintf(buf + *off, len - *off, fmt, ap);
    va_end(ap);
}

/* The fixes planning again sizes, new for the command: NVMe space, host
 * memory, device memory. Empty when none would do. */
static void sized_fixes(const fso_plan_input *in, const fso_plan *p, const fso_plan_origin *o,
                        char *buf, size_t len)
{
    char n[32], h[32], f[32];
    size_t off = 0;
    uint64_t need;
    buf[0] = 0;
    /* another machine whose host memory was not given: this one's was taken */
    if (o->other_machine && !o->host_given && least_with(in, FSO_TIER_HOST, &need)) {
        fso_human_bytes(n, sizeof n, (double)need);
        fso_human_bytes(h, sizeof h, (double)p->machine.host_mem_bytes);
        opt_size(f, sizeof f, need);
        add_fix(buf, len, &off, "give the target's host memory with --host-mem (%s or more; "
                "%s is this machine's)", f, h);
    }
    if (least_with(in, FSO_TIER_NVME, &need) && need > p->machine.nvme_free_bytes) {
        const uint64_t have = p->machine.nvme_free_bytes;
        fso_human_bytes(n, sizeof n, (double)need);
        opt_size(f, sizeof f, need);
        fso_human_bytes(h, sizeof h, (double)(need > have ? need - have : 0));
        if (o->nvme_dirs && o->nvme_dirs[0] && !o->nvme_given)
            add_fix(buf, len, &off, "free %s on %s, or add a folder (--nvme %s,DIR)", h,
                    o->nvme_dirs, o->nvme_dirs);
        else if (o->nvme_given)
            add_fix(buf, len, &off, "describe drives with %s free (--nvme-free %s)", n, f);
        else if (o->train)
            add_fix(buf, len, &off, "add NVMe folders with %s free (--nvme DIR)", n);
        else
            add_fix(buf, len, &off, "add NVMe folders with %s free (--nvme DIR), or describe "
                    "drives elsewhere (--nvme-free %s --nvme-read GBPS --nvme-write GBPS)", n, f);
    }
    if (o->host_given && !device_is_host_share(p, o) && least_with(in, FSO_TIER_HOST, &need) &&
        need > p->machine.host_mem_bytes) {
        opt_size(f, sizeof f, need);
        add_fix(buf, len, &off, "raise --host-mem to %s", f);
    }
    if (device_is_host_share(p, o)) {
        if (o->host_given && least_host_share(in, &need)) {
            opt_size(f, sizeof f, need);
            add_fix(buf, len, &off, "raise --host-mem to %s (each CPU device gets half of it, "
                    "shared)", f);
        }
    } else if (least_with(in, FSO_TIER_DEVICE, &need) &&
               (need = device_with_margin(&p->machine, need)) > p->machine.device_mem_bytes) {
        opt_size(f, sizeof f, need);
        if (p->machine.cpu_devices || o->train)
            add_fix(buf, len, &off, "raise --device-mem to %s", f);
        else
            add_fix(buf, len, &off, "GPUs with %s each (--gpu-mem %s), or more of them (--gpus)",
                    f, f);
    }
}

void fso_plan_nofit_message(const fso_plan_input *in, const fso_plan *p,
                            const fso_plan_origin *o, char *buf, size_t len)
{
    const fso_plan_origin none = {.train = o ? o->train : false};
    const fso_plan_pins *pins = in ? &in->pins : NULL;
    char tiers[1024] = "", fixes[1024] = "", pinned[384];
    size_t off = 0;
    int first_short = -1;
    if (!o)
        o = &none;
    /* CPU devices short of their share of the host: the host tier's room is
     * what they leave, so their line says it */
    const bool share_short = device_is_host_share(p, o) &&
                             p->need_bytes[FSO_TIER_DEVICE] > p->have_bytes[FSO_TIER_DEVICE];
    for (int t = 0; t < FSO_N_TIERS && off < sizeof tiers; t++)
        if (p->need_bytes[t] > p->have_bytes[t] && !(share_short && t == FSO_TIER_HOST)) {
            char w[384];
            short_words(p, o, t, w, sizeof w);
            off += (size_t)snprintf(tiers + off, sizeof tiers - off, "%s%s", off ? "; " : "", w);
            first_short = first_short < 0 ? t : first_short;
        }
    if (first_short < 0) /* nothing short: the tier the planner named */
        short_words(p, o, p->short_tier < 0 ? FSO_TIER_HOST : p->short_tier, tiers,
                    sizeof tiers);
    const int t = first_short >= 0 ? first_short : p->short_tier < 0 ? FSO_TIER_HOST
                                                                      : p->short_tier;
    if (in)
        sized_fixes(in, p, o, fixes, sizeof fixes);
    if (!fixes[0]) { /* the generic fix, or what to give when there is no NVMe at all */
        if (t == FSO_TIER_NVME && !p->have_bytes[FSO_TIER_NVME])
            snprintf(fixes, sizeof fixes, "%s", o->train ? "give NVMe folders (--nvme DIR)"
                     : "give NVMe folders (--nvme DIR) or, to plan for drives elsewhere, "
                       "--nvme-free, --nvme-read and --nvme-write");
        else
            snprintf(fixes, sizeof fixes, "%s", fix_for(t, o->train));
    }
    const uint64_t fixed = p->activation_bytes + p->buffer_bytes[FSO_TIER_DEVICE];
    pinned_note(pins, o->train, pinned, sizeof pinned);
    snprintf(buf, len, "%s: %s%s%s", tiers,
             fixed > p->have_bytes[FSO_TIER_DEVICE]
                 ? "lower train_micro_batch_size_per_gpu or data.seq_len, or " : "",
             fixes, pinned);
}

void fso_plan_shortfall_message(const fso_plan *p, const fso_plan_pins *pins, bool train,
                                char *buf, size_t len)
{
    const fso_plan_origin o = {.train = train};
    char tiers[1024], pinned[384];
    const int t = p->short_tier < 0 ? FSO_TIER_HOST : p->short_tier;
    short_words(p, &o, t, tiers, sizeof tiers);
    pinned_note(pins, train, pinned, sizeof pinned);
    const uint64_t fixed = p->activation_bytes + p->buffer_bytes[FSO_TIER_DEVICE];
    if (t == FSO_TIER_DEVICE && fixed > p->have_bytes[t])
        snprintf(buf, len, "%s: lower train_micro_batch_size_per_gpu or data.seq_len, or %s%s",
                 tiers, train ? "raise --device-mem"
                              : "give each device more memory (--device-mem / --gpu-mem)",
                 pinned);
    else if (t == FSO_TIER_NVME && !p->have_bytes[FSO_TIER_NVME])
        snprintf(buf, len, "%s: %s%s", tiers, train ? "give NVMe folders (--nvme DIR)"
                 : "give NVMe folders (--nvme DIR) or, to plan for drives elsewhere, "
                   "--nvme-free, --nvme-read and --nvme-write", pinned);
    else
        snprintf(buf, len, "%s: %s%s", tiers, fix_for(t, train), pinned);
}

void fso_plan_search_words(const fso_plan_input *in, const fso_plan *p, char *buf, size_t len)
{
    static const char *const memory[FSO_N_TIERS] = {"device memory", "host memory", "NVMe"};
    const fso_plan_search *s = &p->search;
    size_t off = (size_t)snprintf(
        buf, len, "searched %d placement%s (a tier for each kind of state%s%s, the prefetch "
        "depth where parameters come from NVMe): ", s->considered, s->considered == 1 ? "" : "s",
        in->engine.per_block_tiers ? ", blocks kept on the devices" : "",
        in->engine.whole_copy && in->machine.devices > 1 ? ", gathers or whole-block copies"
                                                         : "");
    if (off >= len)
        return;
    if (s->fit) {
        snprintf(buf + off, len - off, "%d fit, the fastest taken", s->fit);
        return;
    }
    off += (size_t)snprintf(buf + off, len - off, "none fits:");
    bool any = false;
    for (int t = 0; t < FSO_N_TIERS && off < len; t++) {
        if (!s->short_on[t])
            continue;
        char by[32];
        fso_human_bytes(by, sizeof by, (double)s->least_short[t]);
        off += (size_t)snprintf(buf + off, len - off, "%s %d short of %s (by %s at least%s)",
                                any ? "," : "", s->short_on[t], memory[t], by,
                                t == FSO_TIER_DEVICE ? ", per device" : "");
        any = true;
    }
}

void fso_plan_unused_nvme(FILE *f, const fso_plan *p, const char *dirs)
{
    if (dirs && dirs[0] && p->fits && p->need_bytes[FSO_TIER_NVME] == 0)
        fprintf(f, "plan: NVMe folder %s: not used, everything fits in memory\n", dirs);
}
