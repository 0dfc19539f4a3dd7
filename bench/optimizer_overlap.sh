#!/usr/bin/env bash
# bench/optimizer_overlap.sh [STEPS] — exposed optimizer time as a fraction of
# step time, serialized vs overlapped, on a model where the optimizer is a
# large part of the step (many parameters, few tokens per step).
#
# Runs fsoff with train.optimizer_overlap none, forward and (with clipping
# off) backward on the same model and prints, from the metrics summaries,
# the mean step time, the optimizer time, the part of it compute waited for,
# and that part as a fraction of the step. On a GPU box the optimizer (CPU)
# and compute (GPU) run on different processors; on the CPU backend they
# share the cores, so the overlap hides less here than it will there.
set -euo pipefail
STEPS=${1:-12}
FSOFF=${FSOFF:-build/fsoff}
[ -x "$FSOFF" ] || { echo "error: $FSOFF not found; build first (meson compile -C build) or set FSOFF" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
MODEL=(--set model.hidden_size=512 --set model.intermediate_size=1536 --set model.num_hidden_layers=6
       --set model.num_attention_heads=8 --set model.num_key_value_heads=4
       --set data.seq_len=16 --set train_micro_batch_size_per_gpu=1
       --set scheduler.params.warmup_num_steps=2 --steps "$STEPS")

run() { # name, extra args...
    local name=$1; shift
    "$FSOFF" "${MODEL[@]}" "$@" --metrics "$TMP/$name.jsonl" >/dev/null
}
run none --set train.optimizer_overlap=none
run forward --set train.optimizer_overlap=forward
run none_noclip --set train.optimizer_overlap=none --set gradient_clipping=0
run backward --set train.optimizer_overlap=backward --set gradient_clipping=0

python3 - "$TMP" <<'PY'
import json, sys, os
d = sys.argv[1]
def load(name):
    rows = [json.loads(l) for l in open(os.path.join(d, name + ".jsonl"))]
    steps = [r for r in rows if "step" in r and r.get("event") != "summary"][1:]  # first excluded
    n = len(steps)
    return (sum(r["step_ms"] for r in steps) / n, sum(r["optimizer_ms"] for r in steps) / n,
            sum(r["optimizer_exposed_ms"] for r in steps) / n)
print("# exposed optimizer time: serialized vs overlapped (same model, same data)")
print("#  schedule        clip   step_ms   opt_ms  exposed_ms  exposed/step")
print("#                         (ms)      (ms)    (ms)        (fraction)")
res = {}
for name, label, clip in (("none", "serialized", "1.0"), ("forward", "forward", "1.0"),
                          ("none_noclip", "serialized", "0"), ("backward", "backward", "0")):
    s, o, e = load(name)
    res[name] = (s, e)
    print(f"   {label:<14} {clip:>4} {s:9.1f} {o:8.1f} {e:11.1f} {e / s:13.3f}")
for a, b in (("none", "forward"), ("none_noclip", "backward")):
    print(f"# {b}: exposed optimizer time {res[b][1]:.1f} ms vs {res[a][1]:.1f} ms serialized; "
          f"step time ratio {res[b][0] / res[a][0]:.2f}")
PY
