#!/usr/bin/env bash
# gpu_check.sh — fsoff on this machine's NVIDIA GPUs, in one go: build, the
# GPU tests (a failure run again, synchronised and under memcheck, to name
# its cause), host<->device and collective bandwidth (fsoff bench h2d and
# allgather), and training tok/s and MFU of a 1.01B-parameter model with its
# state on the GPU, in host memory and on NVMe.
#
#   bench/gpu_check.sh
#
# Writes one JSON report to $OUT/gpu_check.json when $OUT is set, else to
# ./gpu_check.json, and prints a short summary. Every part has a time box and
# the whole run fits in about 8 minutes on one H100/H200; a part that fails or
# runs out of time is recorded as such ("not run: <reason>") and the rest go
# on. Exit status: 0 the build and the GPU tests passed, 1 they did not,
# 77 no NVIDIA GPU here.
#
# Environment:
#   BUILD          build folder (default: build-gpu next to this script's parent)
#   NVME_DIR       folder for the NVMe run (default: $BUILD/gpu-check-nvme)
#   BUDGET_S       total seconds (default 470)
#   MODEL_LAYERS   layers of the training model (default 21: 1.01B parameters)
#   FSO_CUDA_WAIT  how fsoff's host waits for the GPU: block (default) or spin;
#                  recorded in the report, so two runs compare the two
#   GPU_CHECK_FORCE=1  run every part even without a GPU (to test this script)
set -euo pipefail

SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$SRC/build-gpu}
REPORT=${OUT:-$PWD}/gpu_check.json
NVME_DIR=${NVME_DIR:-$BUILD/gpu-check-nvme}
BUDGET_S=${BUDGET_S:-470}
MODEL_LAYERS=${MODEL_LAYERS:-21}
export PATH=$PATH:/usr/local/cuda/bin
START=$(date +%s)

say() { echo "gpu_check: $*"; }
left() { echo $((BUDGET_S - ($(date +%s) - START))); }
# box WANT: seconds for the next part, at most WANT and what the budget has left
box() {
    local l
    l=$(left)
    if [ "$l" -lt "$1" ]; then echo $((l > 5 ? l : 5)); else echo "$1"; fi
}

# ---------------------------------------------------------------- a GPU?
gpus=""
if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi --query-gpu=name,memory.total,pci.bus_id --format=csv,noheader 2>/dev/null || true)
fi
if [ -z "$gpus" ] && ! ls /dev/nvidia[0-9]* >/dev/null 2>&1 && [ "${GPU_CHECK_FORCE:-0}" != 1 ]; then
    echo "gpu_check: skipped: no NVIDIA GPU here (nvidia-smi lists none and there is no /dev/nvidia0)"
    exit 77
fi
for tool in meson ninja python3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "gpu_check: error: $tool not found; install it (Debian: sudo apt-get install meson ninja-build python3)" >&2
        exit 1
    fi
done
if ! command -v nvcc >/dev/null 2>&1; then
    echo "gpu_check: error: nvcc not found on PATH or in /usr/local/cuda/bin; install the CUDA toolkit" >&2
    exit 1
fi
mkdir -p "$(dirname "$REPORT")"
WORK=$(mktemp -d)
# shellcheck disable=SC2317  # (called by the trap)
cleanup() { rm -rf "$WORK" "$NVME_DIR/fsoff-dev"*; }
trap cleanup EXIT
say "GPUs: ${gpus:-(nvidia-smi unavailable)}"

# Results, as files python3 assembles at the end.
echo "$gpus" >"$WORK/gpus.txt"
echo "not run" >"$WORK/build.status"
echo "not run" >"$WORK/tests.status"

# ---------------------------------------------------------------- build
build_ok=0
t=$(box 300)
say "building in $BUILD (time box ${t}s)"
if [ -f "$BUILD/build.ninja" ]; then
    setup=(meson setup --reconfigure "$BUILD" "$SRC" -Dcuda=enabled)
else
    setup=(meson setup "$BUILD" "$SRC" -Dcuda=enabled)
fi
if ! timeout "$t" "${setup[@]}" >"$WORK/build.log" 2>&1; then
    echo "failed: meson setup (see the log tail)" >"$WORK/build.status"
elif ! timeout "$(box 300)" ninja -C "$BUILD" >>"$WORK/build.log" 2>&1; then
    echo "failed: ninja (see the log tail)" >"$WORK/build.status"
else
    echo "ok" >"$WORK/build.status"
    build_ok=1
fi
tail -n 30 "$WORK/build.log" >"$WORK/build.tail"
say "build: $(cat "$WORK/build.status")"

# ---------------------------------------------------------------- GPU tests
tests_ok=0
if [ "$build_ok" = 1 ]; then
    t=$(box 150)
    say "GPU tests (time box ${t}s)"
    set +e
    timeout "$t" meson test -C "$BUILD" test_cuda --print-errorlogs --timeout-multiplier 1 \
        >"$WORK/tests.log" 2>&1
    rc=$?
    set -e
    if [ $rc -eq 0 ] && grep -q "^Ok: *1" "$WORK/tests.log"; then
        echo "ok" >"$WORK/tests.status"
        tests_ok=1
    elif grep -q "^Skipped: *1" "$WORK/tests.log"; then
        why=$(grep -m1 'test_cuda: skipped:' "$BUILD/meson-logs/testlog.txt" 2>/dev/null || true)
        echo "skipped: ${why#test_cuda: skipped: }" >"$WORK/tests.status"
    elif [ $rc -eq 124 ]; then
        echo "failed: timed out after ${t}s" >"$WORK/tests.status"
    else
        echo "failed (exit $rc)" >"$WORK/tests.status"
    fi
    # the test's own output: device line, failures
    cp "$BUILD/meson-logs/testlog.txt" "$WORK/testlog.txt" 2>/dev/null || true
fi
say "GPU tests: $(cat "$WORK/tests.status")"

# A failure is run again to name its cause: every CUDA call waited for and
# checked (FSO_CUDA_SYNC=1), under compute-sanitizer's memcheck when the
# toolkit has it (out-of-bounds and misaligned accesses, with the kernel).
echo "not run: the GPU tests did not fail" >"$WORK/rerun.status"
if [ "$build_ok" = 1 ] && [ "$tests_ok" = 0 ] && ! grep -q '^skipped' "$WORK/tests.status"; then
    t=$(box 120)
    sanitizer=$(command -v compute-sanitizer || true)
    say "GPU tests again, synchronised${sanitizer:+, under memcheck} (time box ${t}s)"
    set +e
    FSO_CUDA_SYNC=1 FSO_SRCDIR="$SRC" timeout "$t" \
        ${sanitizer:+"$sanitizer" --tool memcheck --print-limit 20} "$BUILD/tests/test_cuda" \
        >"$WORK/rerun.log" 2>&1
    rc=$?
    set -e
    echo "exit $rc${sanitizer:+ under memcheck}$([ $rc -eq 124 ] && echo ", timed out after ${t}s")" \
        >"$WORK/rerun.status"
    say "GPU tests again: $(cat "$WORK/rerun.status")"
fi

# ---------------------------------------------------------------- bandwidth
# fsoff bench h2d and allgather, each in its time box, into one object
bench_part() { # NAME BOX: $WORK/NAME.json (the bench's object, or why not)
    local name=$1 t rc why
    echo '"not run"' >"$WORK/$name.json"
    [ "$build_ok" = 1 ] || return 0
    t=$(box "$2")
    say "fsoff bench $name (time box ${t}s)"
    set +e
    timeout "$t" "$BUILD/fsoff" bench "$name" --seconds 0.3 --json "$WORK/$name.json.tmp" \
        >"$WORK/$name.txt" 2>&1
    rc=$?
    set -e
    if [ $rc -eq 0 ] && [ -s "$WORK/$name.json.tmp" ]; then
        mv "$WORK/$name.json.tmp" "$WORK/$name.json"
    elif [ $rc -eq 77 ]; then # the bench says why it skipped
        python3 -c 'import json,sys; print(json.dumps("not run: " + sys.argv[1]))' \
            "$(tail -n 1 "$WORK/$name.txt")" >"$WORK/$name.json"
    else
        why="exit $rc"
        [ $rc -eq 124 ] && why="timed out after ${t}s"
        python3 -c 'import json,sys; print(json.dumps("failed: " + sys.argv[1] + ": " + sys.argv[2]))' \
            "$why" "$(tail -n 3 "$WORK/$name.txt" | tr '\n' ' ')" >"$WORK/$name.json"
    fi
    cat "$WORK/$name.txt"
}
bench_part h2d 45
bench_part allgather 50
python3 - "$WORK" <<'PY'
import json, os, sys
w = sys.argv[1]
h = json.load(open(os.path.join(w, "h2d.json")))
a = json.load(open(os.path.join(w, "allgather.json")))
if isinstance(h, dict):
    h["collectives"] = a.get("collectives") if isinstance(a, dict) else a
    out = h
else:
    out = {"copies": h, "collectives": a.get("collectives") if isinstance(a, dict) else a}
json.dump(out, open(os.path.join(w, "copy.json"), "w"))
PY

# ---------------------------------------------------------------- training tok/s
# A Llama of 1.01B parameters (MODEL_LAYERS=21): hidden 2048, 16 heads
# (4 kv), MLP 5632, vocab 32000, 8 x 1024 tokens per step and GPU; bf16
# storage (weights and activations), as one trains on GPUs.
cat >"$WORK/model_1b.json" <<EOF
{
  "model": {
    "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
    "num_hidden_layers": $MODEL_LAYERS, "num_attention_heads": 16, "num_key_value_heads": 4,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "initializer_range": 0.02, "tie_word_embeddings": true
  },
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "optimizer": { "type": "AdamW",
                 "params": { "lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1 } },
  "zero_optimization": { "stage": 3 },
  "bf16": { "enabled": true },
  "data": { "seq_len": 1024 },
  "train": { "activation_checkpointing": true }
}
EOF

# train_run NAME STEPS BOX ARGS...: tok/s and MFU (first step excluded), whether
# pinning was refused and how many marks went stale, into $WORK/train_NAME.json
train_run() {
    local name=$1 steps=$2 want=$3
    shift 3
    local out=$WORK/train_$name
    if [ "$build_ok" != 1 ]; then
        echo '"not run: the build failed"' >"$out.json"
        return
    fi
    local t
    t=$(box "$want")
    if [ "$t" -lt 20 ]; then
        echo '"not run: out of time"' >"$out.json"
        return
    fi
    say "training, state on $name: $steps steps (time box ${t}s)"
    set +e
    timeout "$t" "$BUILD/fsoff" --devices cuda --config "$WORK/model_1b.json" --steps "$steps" \
        --metrics "$out.jsonl" "$@" >"$out.out" 2>"$out.err"
    local rc=$?
    set -e
    python3 - "$out" "$rc" "$t" <<'PY'
import json, sys
out, rc, box = sys.argv[1], int(sys.argv[2]), sys.argv[3]
steps, summary = [], None
try:
    for line in open(out + ".jsonl"):
        try:
            o = json.loads(line)
        except ValueError:
            continue
        if o.get("event") == "summary":
            summary = o
        elif "tok_s" in o:
            steps.append(o)
except OSError:
    pass
err = [l.strip() for l in open(out + ".err", errors="replace") if l.strip()]
why = next((l for l in err if "error" in l), err[-1] if err else "")
res = {"exit": rc}
timed = steps[1:] if len(steps) >= 2 else steps
if timed and any(s.get("mfu") for s in timed):
    res["mfu"] = sum(s.get("mfu", 0) for s in timed) / len(timed)
if steps:
    res["stale_marks"] = steps[-1].get("stale_marks")
if summary:
    res["pin_refused"] = summary.get("pin_refused")
if summary and summary.get("tok_s"):
    res.update(tok_s=summary["tok_s"], steps=len(steps), mean_step_ms=summary.get("mean_step_ms"),
               peak_device_bytes=summary.get("peak_device_bytes"))
elif len(steps) >= 2:
    res.update(tok_s=sum(s["tok_s"] for s in steps[1:]) / (len(steps) - 1), steps=len(steps),
               note="partial: %s" % ("timed out after %ss" % box if rc == 124 else "exit %d" % rc))
elif steps:
    res.update(tok_s=steps[0]["tok_s"], steps=1, note="first step only (includes warm-up)")
elif rc == 124:
    res = "not run: no step finished within %ss" % box
else:
    res = "not run: " + (why or "fsoff exited with status %d" % rc)
json.dump(res, open(out + ".json", "w"))
print("gpu_check:   -> %s" % (json.dumps(res)[:300]))
PY
}

mkdir -p "$NVME_DIR"
train_run device 8 110 \
    --set zero_optimization.offload_param.device=none \
    --set zero_optimization.offload_optimizer.device=none
train_run host 6 110 \
    --set zero_optimization.offload_param.device=cpu \
    --set zero_optimization.offload_optimizer.device=cpu \
    --set zero_optimization.offload_param.pin_memory=true
train_run nvme 3 120 --nvme "$NVME_DIR"

# ---------------------------------------------------------------- report
python3 - "$WORK" "$REPORT" "$(( $(date +%s) - START ))" "$NVME_DIR" "$MODEL_LAYERS" \
    "${FSO_CUDA_WAIT:-block}" <<'PY'
import json, os, sys
work, report, elapsed, nvme_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
layers, wait = int(sys.argv[5]), sys.argv[6]
rd = lambda n: open(os.path.join(work, n), errors="replace").read().strip()
def rj(n):
    try:
        return json.load(open(os.path.join(work, n)))
    except (OSError, ValueError) as e:
        return "not run: %s" % e
gpus = [l.strip() for l in rd("gpus.txt").splitlines() if l.strip()]
r = {
    "gpus": gpus,
    "build": rd("build.status"),
    "tests": rd("tests.status"),
    "bandwidth": rj("copy.json"),
    "training": {
        "model": "Llama %.2fB (hidden 2048, %d layers, 16/4 heads, MLP 5632, vocab 32000, tied), "
                 "8 x 1024 tokens per step and GPU" % ((65536000 + layers * 45092864) / 1e9, layers),
        "device": rj("train_device.json"),
        "host": rj("train_host.json"),
        "nvme": rj("train_nvme.json"),
        "nvme_dir": nvme_dir,
        "host_waits": wait,
    },
    "elapsed_s": elapsed,
}
if r["build"] != "ok":
    r["build_log_tail"] = rd("build.tail")
if r["tests"] != "ok" and os.path.exists(os.path.join(work, "testlog.txt")):
    lines = [l for l in rd("testlog.txt").splitlines() if not l.startswith("Inherited environment")]
    r["tests_log_tail"] = "\n".join(lines[-40:])
r["tests_rerun"] = rd("rerun.status")
if os.path.exists(os.path.join(work, "rerun.log")):
    r["tests_rerun_log_tail"] = "\n".join(rd("rerun.log").splitlines()[-60:])
tmp = report + ".tmp"
json.dump(r, open(tmp, "w"), indent=2)
os.replace(tmp, report)

def gb(x):
    return "%.1f" % x if isinstance(x, (int, float)) else "-"
print()
print("gpu_check summary (%d s)" % elapsed)
print("  GPUs:      %s" % ("; ".join(gpus) or "?"))
print("  build:     %s" % r["build"])
print("  GPU tests: %s" % r["tests"])
if not r["tests_rerun"].startswith("not run"):
    print("  rerun:     %s (tail in the report)" % r["tests_rerun"])
b = r["bandwidth"]
if isinstance(b, dict):
    c = b.get("copies_gbps", {})
    if "copies" in b:
        print("  copies:    %s" % b["copies"])
    for mem in ("pinned", "pageable") if c else ():
        d = c.get(mem, {})
        print("  %-9s  h2d %s, d2h %s, both %s GB/s" % (mem + ":", gb(d.get("h2d")), gb(d.get("d2h")),
                                                      gb(d.get("both"))))
    if b.get("pinned_note"):
        print("  pinning:   %s" % b["pinned_note"])
    col = b.get("collectives")
    if isinstance(col, dict):
        for op in ("all_gather", "reduce_scatter"):
            rows = col.get(op) or []
            if rows:
                top = rows[-1]
                print("  %-15s busbw %s GB/s at %d MiB (%d ranks)" % (op, gb(top["busbw_gbps"]),
                                                                    top["bytes"] >> 20, col["ranks"]))
    else:
        print("  collectives: %s" % col)
else:
    print("  bandwidth: %s" % b)
print("  waits:     %s (FSO_CUDA_WAIT)" % wait)
for tier in ("device", "host", "nvme"):
    t = r["training"][tier]
    if isinstance(t, dict) and "tok_s" in t:
        flags = [t["note"]] if t.get("note") else []
        if t.get("pin_refused"):
            flags.append("pinning refused")
        if t.get("stale_marks"):
            flags.append("%d stale marks" % t["stale_marks"])
        mfu = " MFU %4.1f%%" % (100 * t["mfu"]) if t.get("mfu") else ""
        print("  train %-6s %8.0f tok/s%s%s" % (tier + ":", t["tok_s"], mfu,
                                              "  (" + "; ".join(flags) + ")" if flags else ""))
    else:
        print("  train %-6s %s" % (tier + ":", t))
print("  report:    %s" % report)
PY

if [ "$build_ok" = 1 ] && [ "$tests_ok" = 1 ]; then
    exit 0
fi
exit 1
