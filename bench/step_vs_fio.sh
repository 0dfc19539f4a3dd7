#!/usr/bin/env bash
# step_vs_fio.sh — a training step with state on NVMe against its bound,
# max(compute, the step's NVMe bytes at fio's rates), fio and fsoff side by
# side in one run on the same folder.
#
#   bench/step_vs_fio.sh [--steps N] [--size SIZE] [--json FILE] DIR [-- FSOFF OPTIONS...]
#
# In DIR:
#   1. fio writes a new file of SIZE (default 2G) sequentially and reads it
#      back (io_uring, O_DIRECT, 4 MiB requests, queue depth 32, plain
#      buffers, registered ones and, when the system has the huge pages
#      reserved, registered ones in huge pages as fsoff's are; the best
#      counts);
#   2. fsoff trains N steps (default 3) with --nvme DIR --metrics and the
#      options after `--` (the model, devices, budgets); the steps after the
#      first are the measurement: their mean step time, compute time (the
#      step line's compute_ms: forward and backward, waits excluded) and
#      NVMe bytes read and written;
#   3. fio again, as in 1: fsoff is compared with the mean of the two fio
#      runs, so a disk that drifts (shared and virtual disks move by 30%
#      between minutes) drifts for both.
# The bound is max(compute, read bytes / fio's read rate + write bytes /
# fio's write rate): the drive does one thing at a time, as fio measures
# it. Prints the measurements, the bound and step / bound; the goal is 1.10
# or less. It also sets the run's own plan (its "plan: predicted" line)
# against the measured step; the goal there is within 10%. A benchmark
# reports; it exits 0 whatever the ratios (1 when a run fails). GB = 1e9
# bytes.
#
#   --steps N     training steps (at least 2; default 3)
#   --size SIZE   fio's file (default 2G; larger than the drive's cache)
#   --json FILE   the results as one JSON object ("-": stdout instead of
#                 the table)
#
# Environment: FSOFF (default build/fsoff next to this script).
#
# The issue's 2.28B model, state 38 GiB, on two CPU devices:
#   bench/step_vs_fio.sh --steps 2 /var/tmp/nvme -- --devices cpu:2 --device-mem 2G \
#       --set model.vocab_size=32000 --set model.hidden_size=2560 \
#       --set model.intermediate_size=6912 --set model.num_hidden_layers=32 \
#       --set model.num_attention_heads=20 --set model.num_key_value_heads=4 \
#       --set bf16.enabled=true --set train_micro_batch_size_per_gpu=1
set -euo pipefail

usage() {
    echo "usage: $0 [--steps N] [--size SIZE] [--json FILE] DIR [-- FSOFF OPTIONS...]   (see the comment at the top)" >&2
    exit 2
}
STEPS=3
SIZE=2G
JSON=""
DIR=""
while [ $# -gt 0 ]; do
    case $1 in
    --steps) [ $# -ge 2 ] || usage; STEPS=$2; shift 2 ;;
    --size) [ $# -ge 2 ] || usage; SIZE=$2; shift 2 ;;
    --json) [ $# -ge 2 ] || usage; JSON=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) echo "step_vs_fio: error: unknown option $1" >&2; usage ;;
    *) [ -z "$DIR" ] || usage; DIR=$1; shift ;;
    esac
done
[ -n "$DIR" ] || usage
case $STEPS in
'' | *[!0-9]* | 0 | 1) echo "step_vs_fio: error: --steps $STEPS: expected a whole number of 2 or more (the first step is excluded)" >&2; exit 2 ;;
esac

here=$(cd "$(dirname "$0")" && pwd)
FSOFF=${FSOFF:-$here/../build/fsoff}
. "$here/fio_lib.sh"
fio_require step_vs_fio "$DIR"

work=$(mktemp -d)
fiofile="$DIR/fio-step-bench.0"
cleanup() { rm -rf "$work"; rm -f "$fiofile"; }
trap cleanup EXIT
[ ! -e "$fiofile" ] || { trap - EXIT; rm -rf "$work"; die "$fiofile exists, left over from an earlier run; remove it"; }

variants=(plain fixed)
fio_huge_pages $((32 << 22)) && variants+=(huge)

# fio_pass TAG: a new file written then read, with each variant's buffers;
# appends "TAG variant op gbps" rows
fio_pass() {
    local variant extra rw
    for variant in "${variants[@]}"; do
        extra=()
        [ $variant = fixed ] && extra=(--fixedbufs=1 --registerfiles=1)
        [ $variant = huge ] && extra=(--iomem=shmhuge --fixedbufs=1 --registerfiles=1)
        rm -f "$fiofile"
        for rw in write read; do
            fio --name=step --filename="$fiofile" --size="$SIZE" --bs=4M --iodepth=32 --rw=$rw \
                --direct=1 --ioengine=io_uring --fallocate=native --numjobs=1 "${extra[@]}" \
                --output-format=json --output="$work/fio.json" >/dev/null 2>"$work/fio.err" ||
                { cat "$work/fio.err" >&2; die "fio failed ($rw, $variant buffers, in $DIR)"; }
            python3 -c 'import json, sys; j = json.load(open(sys.argv[1]))["jobs"][0]; print(sys.argv[2], sys.argv[3], sys.argv[4], j[sys.argv[4]]["bw_bytes"] / 1e9)' \
                "$work/fio.json" "$1" $variant $rw >>"$work/fio.rows"
        done
    done
    rm -f "$fiofile"
}

load() { cut -d' ' -f1 /proc/loadavg; }
: >"$work/fio.rows"
echo "# fio before fsoff ($SIZE, 4 MiB requests, queue depth 32), load $(load)" >&2
fio_pass before
echo "# fsoff: $STEPS steps with --nvme $DIR $*, load $(load)" >&2
load_before=$(load)
t0=$(date +%s)
if ! "$FSOFF" --steps "$STEPS" --nvme "$DIR" --metrics "$work/run.jsonl" "$@" >"$work/run.out" 2>"$work/run.err"; then
    tail -5 "$work/run.err" >&2
    die "fsoff failed (its output: above)"
fi
secs=$(($(date +%s) - t0))
load_after=$(load)
echo "# fio after fsoff, load $(load)" >&2
fio_pass after

python3 - "$work/fio.rows" "$work/run.jsonl" "$work/run.out" "$DIR" "$SIZE" "$JSON" "$load_before" \
    "$load_after" "$secs" "$*" <<'EOF'
import json, sys
rows_path, metrics, run_out, folder, size, json_path, lb, la, secs, args = sys.argv[1:11]
fio = {}
for line in open(rows_path):
    tag, variant, op, g = line.split()
    fio.setdefault((tag, op), {})[variant] = float(g)
def best(tag, op):
    v = fio[(tag, op)]
    return max(v.values()), max(v, key=v.get)
rd = [best(t, "read") for t in ("before", "after")]
wr = [best(t, "write") for t in ("before", "after")]
fio_read = (rd[0][0] + rd[1][0]) / 2
fio_write = (wr[0][0] + wr[1][0]) / 2
steps = [json.loads(l) for l in open(metrics) if '"step"' in l and '"event"' not in l]
meas = steps[1:]
n = len(meas)
mean = lambda k: sum(s[k] for s in meas) / n
step_ms, compute_ms, stall_ms = mean("step_ms"), mean("compute_ms"), mean("stall_ms")
exposed_ms = mean("optimizer_exposed_ms")
rb, wb = mean("nvme_read_bytes"), mean("nvme_write_bytes")
io_ms = (rb / (fio_read * 1e9) + wb / (fio_write * 1e9)) * 1e3 if fio_read > 0 and fio_write > 0 else float("nan")
bound = max(compute_ms, io_ms)
ratio = step_ms / bound if bound > 0 else float("nan")
kinds = {}
for s in meas:
    for k, v in s.get("nvme_read_by_kind", {}).items():
        kinds.setdefault(k, [0, 0])[0] += v / n
    for k, v in s.get("nvme_write_by_kind", {}).items():
        kinds.setdefault(k, [0, 0])[1] += v / n
placement = predicted = ""
for line in open(run_out):
    if line.startswith("plan: placement: "):
        placement = line[len("plan: placement: "):].strip()
    if line.startswith("plan: predicted "):
        predicted = line.split()[2]
table = json_path != "-"
out = print if table else (lambda *a, **k: print(*a, file=sys.stderr, **k))
out("# a training step against max(compute, its NVMe bytes at fio's rates), in %s" % folder)
out("# fsoff %s" % args)
out("# placement: %s; the plan predicted %s ms/step" % (placement, predicted))
names = {"plain": "plain", "fixed": "registered", "huge": "huge-page"}
ran = [names[v] for v in names if any(v in d for d in fio.values())]
out("# fio (%s, 4 MiB, qd 32, the best of %s buffers): read %.3f GB/s (%s %.3f, after %.3f), "
    "write %.3f GB/s (%s %.3f, after %.3f)"
    % (size, ", ".join(ran), fio_read, "before", rd[0][0], rd[1][0], fio_write, "before",
       wr[0][0], wr[1][0]))
out("# load average %s before fsoff, %s after; fsoff ran %s s" % (lb, la, secs))
out("#  steps    step ms  compute ms    stall ms   read GB  write GB   I/O ms at fio    bound ms  step/bound")
out("  %6d  %9.0f  %10.0f  %10.0f  %8.2f  %8.2f  %14.0f  %10.0f  %10.2f"
    % (n, step_ms, compute_ms, stall_ms, rb / 1e9, wb / 1e9, io_ms, bound, ratio))
out("# by kind, GB read/written per step: " + ", ".join(
    "%s %.2f/%.2f" % (k, v[0] / 1e9, v[1] / 1e9) for k, v in kinds.items() if v[0] or v[1]))
out("# step / compute alone %.2f: beyond compute, %.0f ms waiting on NVMe reads (stall), %.0f ms on the "
    "optimizer (exposed), %.0f ms in copies, gathers and reduce-scatters"
    % (step_ms / compute_ms if compute_ms > 0 else float("nan"), stall_ms, exposed_ms,
       step_ms - compute_ms - stall_ms - exposed_ms))
out("# bound: %s; step/bound %.2f (goal 1.10 or less: %s)"
    % ("compute" if compute_ms >= io_ms else "I/O", ratio, "met" if ratio <= 1.10 else "not met"))
plan_ratio = float(predicted) / step_ms if predicted and step_ms > 0 else None
if plan_ratio is not None:
    out("# the run's plan: predicted %.0f ms/step, measured %.0f: predicted/measured %.2f (goal within "
        "10%%: %s)" % (float(predicted), step_ms, plan_ratio,
                       "met" if abs(plan_ratio - 1) <= 0.10 else "not met"))
rec = {"bench": "step_vs_fio", "folder": folder, "fsoff_args": args, "placement": placement,
       "predicted_step_ms": float(predicted) if predicted else None, "steps_measured": n,
       "step_ms": step_ms, "compute_ms": compute_ms, "stall_ms": stall_ms,
       "optimizer_exposed_ms": exposed_ms,
       "nvme_read_bytes": rb, "nvme_write_bytes": wb, "by_kind": kinds,
       "fio": {"size": size, "read_gbps": fio_read, "write_gbps": fio_write,
               "read": {"before": rd[0], "after": rd[1]}, "write": {"before": wr[0], "after": wr[1]}},
       "io_ms_at_fio": io_ms, "bound_ms": bound, "ratio": ratio, "plan_ratio": plan_ratio,
       "load": {"before": float(lb), "after": float(la)}}
if json_path:
    with (sys.stdout if not table else open(json_path, "w")) as f:
        json.dump(rec, f, indent=1)
        f.write("\n")
EOF
