#!/usr/bin/python3
"""The planner's predicted step time against measured step time, on the CPU backend.

For each configuration of a matrix (where the state lives x CPU devices x prefetch
depth x model size; where the state lives includes per-block splits, some parameter
blocks resident and the rest streamed, pinned by train.resident_blocks and
device_state_blocks or chosen by the planner for devices capped below the state,
and the same cap forced to one tier per kind) this runs `fsoff --metrics` for a few steps and `fsoff plan
--json` with the same overrides (so the same placement, pinned), on this machine's
cached probes, and prints the predicted step time, the measured one (the median
step of a run, first step excluded; the fastest of --repeat runs) and their
ratio; and the time the device thread waits per step (predicted: idle time of
the device; measured: stall_ms + optimizer_exposed_ms, waits on parameter reads
and on the optimizer). Goal: every prediction within 20% of the measurement.

Expected misses: a 1-device row runs one process whose threads run at one of
two speeds (about 40% apart, for the life of the process) on a shared
two-core VM, and the plan's one-layer timing and the training run draw them
independently, so such a row may miss by up to 1.7x either way
(docs/planning.md). The table marks those misses "expected"; they do not make
the footer FAILED nor the exit status 1. A miss anywhere else does.

    /usr/bin/python3 bench/plan_vs_measured.py [--fsoff build/fsoff] [--nvme DIR]
                                               [--steps 8] [--repeat 3] [--quick]
                                               [--only ROW,...] [--json FILE]

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


def matrix(quick, only=None):
    rows = []
    for model in (["tiny"] if quick else ["tiny", "wide"]):
        for tier in (only or TIERS):
            for world in (1, 2):
                depths = (0, 2) if TIERS[tier][0] == "nvme" else (2,)
                for pf in depths:
                    rows.append((model, tier, world, pf))
    return rows


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
        p = json.loads(run([fsoff, "plan", "--json", "--nvme", nvme] + dev + args))
        need.append(p["tiers"]["device"])
    cap = need[0]["bytes"] + need[1]["parameters"] // 2
    return ["--device-mem", "%dK" % (cap // 1024 + 1)]


def device_blocks(plan):
    """'resident/state of blocks': parameter blocks and optimizer-state blocks on the devices."""
    pl = plan["placement"]
    n = sum(pl["parameters"].values())
    return "%d/%d of %d" % (pl["parameters"]["device"], pl["master"]["device"], n)


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd[:3]), r.returncode,
                                                r.stderr.strip().splitlines()[-1:]))
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fsoff", default="build/fsoff")
    ap.add_argument("--nvme", default=None, help="folder for the NVMe tier")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3,
                    help="training runs and plans per row; the fastest of each counts (noise only "
                         "slows)")
    ap.add_argument("--quick", action="store_true", help="the tiny model only")
    ap.add_argument("--only", default=None,
                    help="comma-separated placements (rows) to run, e.g. planned-cap,one-tier-cap: "
                         + ", ".join(TIERS))
    ap.add_argument("--json", metavar="FILE",
                    help='also write the results as one JSON object ("-": to stdout instead of the table)')
    a = ap.parse_args()
    only = a.only.split(",") if a.only else None
    for t in only or []:
        if t not in TIERS:
            ap.error("--only: no placement %r; choose from %s" % (t, ", ".join(TIERS)))

    own = a.nvme is None
    nvme = a.nvme or tempfile.mkdtemp(prefix="fsoff-plan-bench-", dir="/var/tmp")
    results = []
    try:
        # the probes once, outside the timed runs (cached afterwards)
        run([a.fsoff, "plan", "--json", "--nvme", nvme])
        for model, tier, world, pf in matrix(a.quick, only):
            sets = overrides(model, tier, pf, nvme)
            dev = ["--devices", "cpu:%d" % world]
            if TIERS[tier][3]:
                dev += cap_for(a.fsoff, model, world, nvme)
            best, meas = None, None
            for _ in range(max(a.repeat, 1)):
                with tempfile.NamedTemporaryFile(suffix=".jsonl") as mf:
                    run([a.fsoff, "--steps", str(a.steps), "--metrics", mf.name] + dev + sets)
                    lines = [json.loads(l) for l in open(mf.name) if l.strip()]
                steps = [l for l in lines if "step_ms" in l][1:]
                med = statistics.median(l["step_ms"] for l in steps)
                if meas is None or med < meas:
                    best, meas = steps, med
            steps = best
            # the plan times one layer on this machine: the fastest of as many tries
            plan = None
            for _ in range(max(a.repeat, 1)):
                p = json.loads(run([a.fsoff, "plan", "--json"] + dev + sets))
                if plan is None or p["predicted_step_ms"] < plan["predicted_step_ms"]:
                    plan = p
            pred = plan["predicted_step_ms"]
            # the device thread's waits: on parameter reads and on the optimizer
            stall = statistics.median(s.get("stall_ms", 0) + s.get("optimizer_exposed_ms", 0)
                                      for s in steps)
            results.append({"model": model, "tiers": tier, "devices": world, "prefetch": pf,
                            "predicted_ms": pred, "measured_ms": meas,
                            "ratio": pred / meas if meas > 0 else 0,
                            "bottleneck": plan["bottleneck"],
                            "placement": plan["placement_text"],
                            "device_blocks": device_blocks(plan),
                            "predicted_stall_ms": plan["stall_ms"], "measured_stall_ms": stall})
    finally:
        if own:
            shutil.rmtree(nvme, ignore_errors=True)

    for r in results:
        r["within_20pct"] = abs(r["ratio"] - 1) <= 0.20
        r["expected_miss"] = not r["within_20pct"] and r["devices"] == 1
    ok = all(r["within_20pct"] or r["expected_miss"] for r in results)
    rec = {"bench": "plan_vs_measured", "rows": results, "within_20pct": ok}
    if a.json == "-":
        print(json.dumps(rec))
        return 0 if ok else 1
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rec, f, indent=1)
    print("# planner prediction against measured step time (CPU backend: median step of %d, "
          "first excluded; fastest of %d runs; load average %.2f)" % (a.steps, a.repeat,
                                                                      os.getloadavg()[0]))
    print("# %-6s %-14s %7s %8s %11s %10s %10s %7s %10s %10s %-11s %8s" %
          ("model", "tiers", "devices", "prefetch", "on devices", "predicted", "measured",
           "ratio", "pred wait", "meas wait", "bottleneck", "within"))
    print("# %-6s %-14s %7s %8s %11s %10s %10s %7s %10s %10s %-11s %8s" %
          ("", "param/optim", "", "blocks", "param/state", "ms", "ms", "", "ms", "ms", "",
           "20%"))
    for r in results:
        print("  %-6s %-14s %7d %8d %11s %10.1f %10.1f %7.2f %10.1f %10.1f %-11s %8s" %
              (r["model"], r["tiers"], r["devices"], r["prefetch"], r["device_blocks"],
               r["predicted_ms"], r["measured_ms"], r["ratio"], r["predicted_stall_ms"],
               r["measured_stall_ms"], r["bottleneck"],
               "yes" if r["within_20pct"] else "expected" if r["expected_miss"] else "MISS"))
    err = sum(abs(r["ratio"] - 1) for r in results) / max(len(results), 1)
    hits = sum(1 for r in results if r["within_20pct"])
    expected = sum(1 for r in results if r["expected_miss"])
    print("# mean |predicted/measured - 1|: %.1f%%; within 20%%: %d of %d; expected misses "
          "(1 device: the process's speed is drawn at start): %d" %
          (100 * err, hits, len(results), expected))
    print("# %s" % ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
