#!/usr/bin/python3
"""The planner's predicted step time against measured step time, on the CPU backend.

For each configuration of a matrix (where the state lives x CPU devices x prefetch
depth x model size; where the state lives includes per-block splits, some parameter
blocks resident and the rest streamed, pinned by train.resident_blocks and
device_state_blocks or chosen by the planner for devices capped below the state,
and the same cap forced to one tier per kind) this runs `fsoff --metrics` for a few
steps, on this machine's cached probes, and sets each run's measured step (the median
step, first step excluded) against its own plan: the one it made at its start and
wrote to the metrics ({"event": "plan"}, the object `fsoff plan --json` prints), with
the overrides pinning the placement. It prints the predicted step time, the measured
one and their ratio; and the time the device thread waits per step (predicted: idle
time of the device; measured: stall_ms + optimizer_exposed_ms, waits on parameter
reads and on the optimizer). Goal: every prediction within 10% of the measurement.

A second table splits each row by component, predicted against measured,
so a miss can be traced to what the model got wrong: compute (the plan's
compute stream busy against the metrics' compute_ms), the optimizer (its
stream against optimizer_ms), the waits (as above), NVMe reads and writes
and collectives. The engine does not time its NVMe transfers or its
collectives, so their measured side is the step's NVMe bytes at the probed
rates (the volume the plan should have moved, in the plan's units); the
collectives have no measured side. --fresh-cache runs everything with an
empty probe cache of its own (XDG_CACHE_HOME in a temporary folder; the
user's cache is not touched), so the probes are measured anew, as on a
first plan (the runs time their layers themselves either way).

Noise: a shared machine's speed drifts. Here ten runs of the tiny model in a
row went from 89 to 70 ms a step, one half minute to the next. A plan and a
run minutes apart measure two machines, so each run is set against its own
plan, made seconds before its steps: fsoff train times its layer itself at
its start rather than read another minute's timing from the probe cache.
Of --repeat runs per row, the one with the median ratio counts, so one run
that straddles a change of speed does not decide. A row beyond 10% either way is run --retry
times more at the end, and the median of all its runs counts (the table
marks each rerun with a '*'). A run that wrote 1 GB or more to NVMe (the
--sizes rows, and the probe of a new cache's folder) is followed by --settle
seconds of nothing: on a virtual disk the host drains its cache behind the
guest, which runs slower meanwhile. Run it in a quiet minute; the header prints
the load average. Any row beyond 10% prints FAILED and exits 1.

--sizes adds bench/step_vs_fio.sh's three models (168M, 787M and 2.28B,
bf16, two CPU devices, the planner placing their state under the budgets
given, NVMe at --nvme), one run each of their own steps.

    /usr/bin/python3 bench/plan_vs_measured.py [--fsoff build/fsoff] [--nvme DIR]
                                               [--steps 8] [--repeat 3] [--retry 2] [--quick]
                                               [--only ROW,...] [--sizes | --sizes-only]
                                               [--json FILE] [--fresh-cache] [--settle 60]

--nvme defaults to a fresh folder under /var/tmp (a disk; tmpfs has no O_DIRECT,
and the store falls back to the page cache there). Machines here are shared and
noisy: a row that misses once may hit the next time; run twice before believing
a miss. The table follows nccl-tests: '#' header, units, one row per case, a
footer with the mean absolute error and OK/FAILED.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = {
    # name: overrides
    "tiny": [],
    "wide": ["model.hidden_size=256", "model.intermediate_size=768",
             "model.num_attention_heads=8", "model.num_key_value_heads=4",
             "model.num_hidden_layers=6", "train_micro_batch_size_per_gpu=4"],
}

TIERS = {
    # name: (param device, optimizer device, per-block keys (state.h's rule), device cap);
    # a device None: the planner's choice (--nvme gives it the folder); cap "half": each
    # CPU device holds its activations and buffers and half of its parameters (cap_for)
    "device": ("none", "none", [], None),
    "host": ("cpu", "cpu", [], None),
    "p-host/o-nvme": ("cpu", "nvme", [], None),
    "nvme": ("nvme", "nvme", [], None),
    # residency split: some parameter blocks resident, the rest streamed; the last
    # blocks' state on the devices, the rest on the tier
    "split-host": ("cpu", "cpu", ["train.resident_blocks=3", "train.device_state_blocks=2"],
                   None),
    "split-nvme": ("nvme", "nvme", ["train.resident_blocks=3", "train.device_state_blocks=2",
                                    'train.device_state_from="first"'], None),
    # capped devices, the planner choosing: a plan that keeps what fits resident and streams
    # the rest; and the same cap forced to one tier per kind (no block counts)
    "planned-cap": (None, None, [], "half"),
    "one-tier-cap": (None, None, ["train.resident_blocks=0", "train.device_state_blocks=0"],
                     "half"),
}


# --sizes: bench/step_vs_fio.sh's three models, state on NVMe, the planner choosing the
# placement and depth under the budgets given (docs/benchmarks.md), as a user runs them
LLAMA = ["model.vocab_size=32000", "model.num_attention_heads=16",
         "model.num_key_value_heads=4", "bf16.enabled=true", "train_micro_batch_size_per_gpu=1"]
SIZES = {
    # name: (model overrides, budgets, steps)
    "168M": (LLAMA + ["model.hidden_size=1024", "model.intermediate_size=2816",
                      "model.num_hidden_layers=12"],
             ["--device-mem", "1G", "--host-mem", "3G"], 4),
    "787M": (LLAMA + ["model.hidden_size=2048", "model.intermediate_size=5632",
                      "model.num_hidden_layers=16"],
             ["--device-mem", "2G", "--host-mem", "8G"], 3),
    "2.28B": (LLAMA + ["model.hidden_size=2560", "model.intermediate_size=6912",
                       "model.num_hidden_layers=32", "model.num_attention_heads=20"],
              ["--device-mem", "2G"], 3),
}


def matrix(quick, only=None):
    """Rows: (model, placement, devices, prefetch depth or None for the planner's)."""
    rows = []
    for model in (["tiny"] if quick else ["tiny", "wide"]):
        for tier in (only or TIERS):
            for world in (1, 2):
                depths = (0, 2) if TIERS[tier][0] == "nvme" else (2,)
                for pf in depths:
                    rows.append((model, tier, world, pf))
    return rows


def size_args(model, nvme):
    """A --sizes row's options: two CPU devices, its budgets, NVMe, its model."""
    sets, budgets, _ = SIZES[model]
    args = ["--devices", "cpu:2", "--nvme", nvme] + budgets
    for s in sets:
        args += ["--set", s]
    return args


def overrides(model, tier, pf, nvme):
    p, o, keys, _ = TIERS[tier]
    sets = list(MODELS[model])
    if p:
        sets.append('zero_optimization.offload_param={"device": "%s"%s}'
                    % (p, ', "nvme_path": "%s"' % nvme if p == "nvme" else ""))
    if o:
        sets.append('zero_optimization.offload_optimizer={"device": "%s"%s}'
                    % (o, ', "nvme_path": "%s"' % nvme if o == "nvme" else ""))
    sets.append("train.prefetch_blocks=%d" % pf)
    sets += keys
    args = ["--nvme", nvme] if not p or not o else []
    for s in sets:
        args += ["--set", s]
    return args


def cap_for(fsoff, model, world, nvme):
    """--device-mem for a capped row: each device's activations and buffers (the plan with
    every kind on the host) and half of its parameter shards (the plan with every kind on
    the devices), in KiB: some parameter blocks fit, not all."""
    dev = ["--devices", "cpu:%d" % world]
    need = []
    for where in ("cpu", "none"):
        sets = list(MODELS[model]) + [
            'zero_optimization.offload_param={"device": "%s"}' % where,
            'zero_optimization.offload_optimizer={"device": "%s"}' % where]
        args = []
        for s in sets:
            args += ["--set", s]
        p = json.loads(run([fsoff, "plan", "--json", "--nvme", nvme] + dev + args).stdout)
        need.append(p["tiers"]["device"])
    cap = need[0]["bytes"] + need[1]["parameters"] // 2
    return ["--device-mem", "%dK" % (cap // 1024 + 1)]


ENV = None  # the environment of every run (--fresh-cache: a cache folder of its own)

# components: (name, the plan's stream, the metrics' field or None)
COMPONENTS = (("compute", "compute"), ("optimizer", "optimizer"), ("nvme-read", "nvme-read"),
              ("nvme-write", "nvme-write"), ("collectives", "collectives"))


def components(plan, steps):
    """Per component (predicted ms, measured ms or None): the plan's streams' busy time in
    its step against the metrics' medians; NVMe at the probed rates (bytes / rate, the time
    the plan's rate gives the volume the run moved: a gap is the plan's volume, the rest of a
    step's miss is its rate); the waits."""
    busy = plan["busy_ms"]
    m = plan["machine"]
    med = lambda f: statistics.median(f(s) for s in steps)
    out = {}
    out["compute"] = (busy["compute"], med(lambda s: s.get("compute_ms", 0)))
    out["optimizer"] = (busy["optimizer"], med(lambda s: s.get("optimizer_ms", 0)))
    for name, rate, field in (("nvme-read", "nvme_read_gbps", "nvme_read_bytes"),
                              ("nvme-write", "nvme_write_gbps", "nvme_write_bytes")):
        g = m.get(rate, 0)
        out[name] = (busy[name], med(lambda s: s.get(field, 0)) / (g * 1e6) if g > 0 else None)
    out["collectives"] = (busy["collectives"], None)
    out["waits"] = (plan["stall_ms"], med(lambda s: s.get("stall_ms", 0) +
                                          s.get("optimizer_exposed_ms", 0)))
    return out


def err_of(pm):
    """pred/meas - 1, or None where there is no measured side (or nothing measured and
    nothing predicted: no error to speak of)."""
    p, m = pm
    if m is None or (m < 0.05 and p < 0.05):
        return None
    return p / m - 1 if m > 0 else float("inf")


def device_blocks(plan):
    """'resident/state of blocks': parameter blocks and optimizer-state blocks on the devices."""
    pl = plan["placement"]
    n = sum(pl["parameters"].values())
    return "%d/%d of %d" % (pl["parameters"]["device"], pl["master"]["device"], n)


def run(cmd):
    """cmd run to its end (its stdout and stderr kept); an error where it failed."""
    r = subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd[:3]), r.returncode,
                                                r.stderr.strip().splitlines()[-1:]))
    return r


def settle(written, seconds):
    """After a run that wrote `written` bytes to NVMe: wait `seconds` when that is 1 GB or
    more. On a virtual machine the host drains the disk's cache behind the guest, and the
    guest's cores run slower meanwhile: after the 2.28B model's runs (160 GB written) the next
    six runs, of the tiny model, ran 14-41% slower than their own plans, made seconds before
    their steps, and the same rows half a minute on within 3%."""
    if written >= 1e9 and seconds > 0:
        print("# waiting %d s after %.0f GB of NVMe writes" % (seconds, written / 1e9),
              file=sys.stderr, flush=True)
        time.sleep(seconds)


def measure(fsoff, args, steps, repeat, settle_s):
    """`repeat` training runs of `steps` steps, each against its own plan: a list of
    (ratio, median step ms, the steps after the first as --metrics gives them, the plan).
    After a run that wrote much to NVMe, waits settle_s seconds (settle)."""
    out = []
    for _ in range(max(repeat, 1)):
        with tempfile.NamedTemporaryFile(suffix=".jsonl") as mf:
            run([fsoff, "--steps", str(steps), "--metrics", mf.name] + args)
            lines = [json.loads(l) for l in open(mf.name) if l.strip()]
        settle(sum(l.get("nvme_write_bytes", 0) for l in lines if "step_ms" in l), settle_s)
        plan = [l["plan"] for l in lines if l.get("event") == "plan"]
        if not plan:
            raise RuntimeError("%s: the run wrote no plan to its metrics" % " ".join(args))
        kept = [l for l in lines if "step_ms" in l][1:]
        med = statistics.median(l["step_ms"] for l in kept)
        out.append((plan[0]["predicted_step_ms"] / med, med, kept, plan[0]))
    return out


def median_run(runs):
    """Of runs (measure's), the one with the median ratio (the lower middle of an even count)."""
    return sorted(runs, key=lambda r: r[0])[(len(runs) - 1) // 2]


def row_of(r, runs):
    """Fill row r from its runs: the median run's plan, step and components."""
    ratio, meas, steps, plan = median_run(runs)
    r.update({"predicted_ms": plan["predicted_step_ms"], "measured_ms": meas, "ratio": ratio,
              "bottleneck": plan["bottleneck"], "placement": plan["placement_text"],
              "device_blocks": device_blocks(plan), "predicted_stall_ms": plan["stall_ms"],
              # the device thread's waits: on parameter reads and on the optimizer
              "measured_stall_ms": statistics.median(
                  s.get("stall_ms", 0) + s.get("optimizer_exposed_ms", 0) for s in steps),
              "components": components(plan, steps), "runs": len(runs)})
    if r["prefetch"] is None:
        r["prefetch"] = plan["prefetch_blocks"]


def print_components(results):
    """The second table: each row's components, predicted/measured ms and the error."""
    names = ["step"] + [c[0] for c in COMPONENTS] + ["waits"]
    print("# by component: predicted/measured ms (error); nvme-* measured: the run's bytes at "
          "the probed rate; collectives: not measured")
    print("# %-6s %-14s %3s %2s " % ("model", "tiers", "dev", "pf") +
          " ".join("%-20s" % n for n in names))
    sums = {n: [] for n in names}
    for r in results:
        cells = []
        comp = dict(r["components"])
        comp["step"] = (r["predicted_ms"], r["measured_ms"])
        for n in names:
            p, m = comp[n]
            e = err_of((p, m))
            if e is not None:
                sums[n].append(abs(e))
            cells.append("%-20s" % ("%.1f/%s%s" % (p, "-" if m is None else "%.1f" % m,
                                                     "" if e is None else " (%+.0f%%)" % (100 * e)
                                                     if abs(e) < 100 else " (>100x)")))
        print("  %-6s %-14s %3d %2d " % (r["model"], r["tiers"], r["devices"], r["prefetch"]) +
              " ".join(cells))
    print("# mean |error|: " + "; ".join(
        "%s %.1f%% of %d" % (n, 100 * statistics.mean(v), len(v)) for n, v in sums.items()
        if v and all(x != float("inf") for x in v)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fsoff", default="build/fsoff")
    ap.add_argument("--nvme", default=None, help="folder for the NVMe tier")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3,
                    help="training runs per row, each against its own plan; the one with the "
                         "median ratio counts")
    ap.add_argument("--retry", type=int, default=2,
                    help="runs again, at the end, of a row beyond 10%% either way (default 2); "
                         "the median of all its runs counts; the footer counts them")
    ap.add_argument("--quick", action="store_true", help="the tiny model only")
    ap.add_argument("--only", default=None,
                    help="comma-separated placements (rows) to run, e.g. planned-cap,one-tier-cap: "
                         + ", ".join(TIERS))
    ap.add_argument("--json", metavar="FILE",
                    help='also write the results as one JSON object ("-": to stdout instead of the table)')
    ap.add_argument("--sizes", action="store_true",
                    help="also the 168M, 787M and 2.28B models of bench/step_vs_fio.sh, state on "
                         "NVMe (about 40 GB free in --nvme's folder; 10 minutes), one run each")
    ap.add_argument("--sizes-only", action="store_true", help="those three rows alone")
    ap.add_argument("--settle", type=int, default=60, metavar="S",
                    help="seconds to wait after a run that wrote 1 GB or more to NVMe, before "
                         "the next (default 60; 0: none)")
    ap.add_argument("--fresh-cache", action="store_true",
                    help="an empty probe cache of its own: the probes measured anew")
    a = ap.parse_args()
    global ENV
    cache = None
    if a.fresh_cache:
        cache = tempfile.mkdtemp(prefix="fsoff-plan-bench-cache-", dir="/var/tmp")
        ENV = dict(os.environ, XDG_CACHE_HOME=cache)
    only = a.only.split(",") if a.only else None
    for t in only or []:
        if t not in TIERS:
            ap.error("--only: no placement %r; choose from %s" % (t, ", ".join(TIERS)))

    own = a.nvme is None
    nvme = a.nvme or tempfile.mkdtemp(prefix="fsoff-plan-bench-", dir="/var/tmp")
    results = []
    try:
        # the probes once, outside the timed runs (cached afterwards); an NVMe folder's
        # probe writes over 1 GB
        if "probing" in run([a.fsoff, "plan", "--json", "--nvme", nvme]).stderr:
            settle(1e9, a.settle)
        rows = [] if a.sizes_only else matrix(a.quick, only)
        if a.sizes or a.sizes_only:
            rows += [(m, "planned", 2, None) for m in SIZES]
        for model, tier, world, pf in rows:
            if model in SIZES:
                dev, sets, nsteps, repeat = size_args(model, nvme), [], SIZES[model][2], 1
            else:
                sets = overrides(model, tier, pf, nvme)
                dev = ["--devices", "cpu:%d" % world]
                if TIERS[tier][3]:
                    dev += cap_for(a.fsoff, model, world, nvme)
                nsteps, repeat = a.steps, a.repeat
            r = {"model": model, "tiers": tier, "devices": world, "prefetch": pf,
                 "args": dev + sets, "steps": nsteps, "remeasured": 0}
            r["all_runs"] = measure(a.fsoff, r["args"], nsteps, repeat, a.settle)
            row_of(r, r["all_runs"])
            results.append(r)
        # a row beyond the goal either way is run again, later: the median of all its runs
        for r in results:
            for _ in range(a.retry):
                if abs(r["ratio"] - 1) <= 0.10:
                    break
                r["all_runs"] += measure(a.fsoff, r["args"], r["steps"], 1, a.settle)
                r["remeasured"] += 1
                row_of(r, r["all_runs"])
    finally:
        if own:
            shutil.rmtree(nvme, ignore_errors=True)
        if cache:
            shutil.rmtree(cache, ignore_errors=True)

    for r in results:
        r["within_10pct"] = abs(r["ratio"] - 1) <= 0.10
        r["within_20pct"] = abs(r["ratio"] - 1) <= 0.20
        r["run_ratios"] = [x[0] for x in r["all_runs"]]
        del r["all_runs"], r["args"], r["steps"]
    ok = all(r["within_10pct"] for r in results)
    rec = {"bench": "plan_vs_measured", "rows": results, "within_10pct": ok,
           "load_average": os.getloadavg()[0]}
    if a.json == "-":
        print(json.dumps(rec))
        return 0 if ok else 1
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rec, f, indent=1)
    print("# planner prediction against measured step time (CPU backend: median step of %d, "
          "first excluded; each run against its own plan, the median of %d runs, the --sizes "
          "rows' one; load average %.2f)"
          % (a.steps, a.repeat, os.getloadavg()[0]))
    print("# %-6s %-14s %7s %8s %11s %10s %10s %7s %10s %10s %-11s %8s" %
          ("model", "tiers", "devices", "prefetch", "on devices", "predicted", "measured",
           "ratio", "pred wait", "meas wait", "bottleneck", "within"))
    print("# %-6s %-14s %7s %8s %11s %10s %10s %7s %10s %10s %-11s %8s" %
          ("", "param/optim", "", "blocks", "param/state", "ms", "ms", "", "ms", "ms", "",
           "10%"))
    for r in results:
        print("  %-6s %-14s %7d %8d %11s %10.1f %10.1f %7.2f %10.1f %10.1f %-11s %8s" %
              (r["model"], r["tiers"], r["devices"], r["prefetch"], r["device_blocks"],
               r["predicted_ms"], r["measured_ms"], r["ratio"], r["predicted_stall_ms"],
               r["measured_stall_ms"], r["bottleneck"],
               ("yes" if r["within_10pct"] else "MISS") +
               ("*" * r["remeasured"])))
    err = sum(abs(r["ratio"] - 1) for r in results) / max(len(results), 1)
    print("# mean |predicted/measured - 1|: %.1f%%; within 10%%: %d of %d (within 20%%: %d); "
          "re-measured (*: each run again, beyond 10%%): %d "
          "rows" % (100 * err, sum(1 for r in results if r["within_10pct"]), len(results),
                    sum(1 for r in results if r["within_20pct"]),
                    sum(1 for r in results if r["remeasured"])))
    print_components(results)
    print("# %s" % ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
