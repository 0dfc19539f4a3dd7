#!/usr/bin/env bash
# bench_test.sh FSOFF — the benchmarks' shared output options, their charts,
# `fsoff plot`, and `fsoff bench tune` as a user meets them.
#
# Charts: each must be a PNG whose IHDR says the expected width and height
# (an SVG, its svg element's, for a name ending in .svg).
# The GPU benchmarks' charts are drawn from saved results (tests/fixtures),
# so their plot code runs without a GPU. tune: a small sweep must leave its
# aio section in a config without losing the config's other keys, refuse a
# malformed config before sweeping, and give the planner its rates, which
# `fsoff plan` labels as tuned (probed before the sweep). Without
# gnuplot the chart checks are skipped (exit 77) after checking that fsoff
# says how to install it.
set -u
FSOFF=${1:?usage: bench_test.sh path/to/fsoff}
SRC=${FSO_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export XDG_CACHE_HOME="$TMP/cache" # the probe cache of this test alone
pass=0
fail=0

ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; shift; for l in "$@"; do echo "     $l"; done; }

# png_size FILE -> "WIDTHxHEIGHT" from the IHDR chunk, or "not a PNG"
png_size() {
    local head
    head=$(od -An -tx1 -N24 "$1" 2>/dev/null | tr -d ' \n')
    if [ "${head:0:16}" != "89504e470d0a1a0a" ] || [ "${head:24:8}" != "49484452" ]; then
        echo "not a PNG"
        return
    fi
    echo "$((16#${head:32:8}))x$((16#${head:40:8}))"
}

# expect_png NAME FILE WxH -- fsoff args...
expect_png() {
    local name=$1 file=$2 size=$3
    shift 4
    rm -f "$file"
    "$FSOFF" "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$? got
    got=$(png_size "$file")
    if [ $rc -eq 0 ] && [ "$got" = "$size" ]; then
        ok "$name ($size)"
    else
        bad "$name" "status $rc, $file: $got (want $size)" "$(head -c 600 "$TMP/err")"
    fi
}

# expect_fail NAME STATUS 'substring' -- fsoff args...
expect_fail() {
    local name=$1 want=$2 pat=$3
    shift 4
    "$FSOFF" "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc -eq "$want" ] && grep -qF -- "$pat" "$TMP/err" && [ "$(grep -c error "$TMP/err")" -eq 1 ]; then
        ok "$name"
    else
        bad "$name" "status $rc (want $want), stderr lacks '$pat' or has more than one error" \
            "$(head -c 600 "$TMP/err")"
    fi
}

# --- without gnuplot: the error names the fix
PATH=/nonexistent "$FSOFF" plot "$SRC/tests/fixtures/bench_h2d.json" -o "$TMP/x.png" \
    >"$TMP/out" 2>"$TMP/err"
rc=$?
if [ $rc -eq 1 ] && grep -q "gnuplot is not installed" "$TMP/err" &&
   grep -q "apt-get install gnuplot-nox" "$TMP/err" && [ ! -e "$TMP/x.png" ]; then
    ok "plot without gnuplot says how to install it"
else
    bad "plot without gnuplot says how to install it" "status $rc" "$(head -c 400 "$TMP/err")"
fi

# --- fsoff plot: usage and bad input
expect_fail "plot without -o" 2 "-o FILE.png" -- plot "$SRC/tests/fixtures/bench_h2d.json"
expect_fail "plot of a missing file" 2 "$TMP/none.jsonl" -- plot "$TMP/none.jsonl" -o "$TMP/x.png"
printf 'step 1 loss 2.3\n' >"$TMP/text.log"
expect_fail "plot of a file that is no metrics file" 2 "$TMP/text.log:1:" -- \
    plot "$TMP/text.log" -o "$TMP/x.png"
printf '{"bench": "nope"}\n' >"$TMP/nope.json"
expect_fail "plot of an unknown bench result" 2 '"bench": "nope"' -- \
    plot "$TMP/nope.json" -o "$TMP/x.png"
expect_fail "plot --size malformed" 2 "--size 12" -- \
    plot "$SRC/tests/fixtures/bench_h2d.json" -o "$TMP/x.png" --size 12
expect_fail "plot -o of another image type" 2 "$TMP/x.pdf: fsoff draws PNG or SVG charts" -- \
    plot "$SRC/tests/fixtures/bench_h2d.json" -o "$TMP/x.pdf"
expect_fail "plot of a bench result with another file" 2 "drawn alone" -- \
    plot "$SRC/tests/fixtures/bench_h2d.json" "$SRC/tests/fixtures/bench_allgather.json" \
    -o "$TMP/x.png"

# --- one --json convention: FILE, or "-" for the object alone on stdout
"$FSOFF" bench nvme --nvme "$TMP" --size 4M --block-sizes 128K --queue-depths 2 --json - \
    >"$TMP/nv.out" 2>"$TMP/err"
rc=$?
if [ $rc -eq 0 ] && [ "$(head -c 1 "$TMP/nv.out")" = "{" ] && ! grep -q '^#' "$TMP/nv.out" &&
   grep -q '"bench": "nvme"' "$TMP/nv.out"; then
    ok "bench nvme --json -: the object alone on stdout"
else
    bad "bench nvme --json -" "status $rc" "$(head -c 300 "$TMP/nv.out") $(head -c 300 "$TMP/err")"
fi
"$FSOFF" bench nvme --nvme "$TMP" --size 4M --block-sizes 128K --queue-depths 2 \
    --json "$TMP/nv.json" >"$TMP/out" 2>"$TMP/err"
if [ $? -eq 0 ] && grep -q '^# OK' "$TMP/out" && grep -q '"gbps"' "$TMP/nv.json"; then
    ok "bench nvme --json FILE: the table on stdout, the object in FILE"
else
    bad "bench nvme --json FILE" "$(head -c 300 "$TMP/out") $(head -c 300 "$TMP/err")"
fi
# writes timed twice: to completion (a burst a cache takes) and through a final
# fsync (the drive); the second is never faster, as it ends later
if grep -q '^#    op .* speed   flushed  correct$' "$TMP/out" &&
   grep -q '^  write .*[0-9] *OK$' "$TMP/out" && grep -q '^   read .* - *OK$' "$TMP/out" &&
   python3 - "$TMP/nv.json" <<'EOF2'
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
w = [r for r in rows if r["op"] == "write"]
ok = (w and all(0 < r["flushed_gbps"] <= r["gbps"] and r["flushed_seconds"] >= r["seconds"]
                for r in w)
      and all("flushed_gbps" not in r for r in rows if r["op"] == "read"))
sys.exit(0 if ok else 1)
EOF2
then
    ok "bench nvme: writes timed to completion and through a flush, table and JSON"
else
    bad "bench nvme: writes timed to completion and through a flush" "$(cat "$TMP/out")" \
        "$(head -c 600 "$TMP/nv.json")"
fi
expect_fail "bench adam --json needs a value" 2 "--json" -- bench adam --json
expect_fail "bench tune --json needs a value" 2 "--json" -- bench tune --nvme "$TMP" --json
expect_fail "bench tune without --nvme" 2 "--nvme DIR is required" -- bench tune
expect_fail "bench tune on a missing folder" 2 "$TMP/none: no such folder" -- \
    bench tune --nvme "$TMP/none"
expect_fail "bench tune --queue-depths beyond aio's range" 2 "--queue-depths 64" -- \
    bench tune --nvme "$TMP" --queue-depths 64

# --- tune: --write-config refuses what it cannot merge into, before sweeping
printf '{\n  "train": {"steps": 5},\n  "aio": [1, 2\n}\n' >"$TMP/broken.json"
cp "$TMP/broken.json" "$TMP/broken.orig"
expect_fail "tune --write-config refuses a malformed file" 2 "$TMP/broken.json:4:" -- \
    bench tune --nvme "$TMP" --write-config "$TMP/broken.json"
if ! cmp -s "$TMP/broken.json" "$TMP/broken.orig"; then
    bad "tune leaves a malformed config as it was" "$(cat "$TMP/broken.json")"
fi
printf '{"aio": 4}\n' >"$TMP/aio4.json"
expect_fail "tune --write-config refuses a non-object aio" 2 '"aio" is not a JSON object' -- \
    bench tune --nvme "$TMP" --write-config "$TMP/aio4.json"

if ! command -v gnuplot >/dev/null; then
    echo "bench: $pass passed, $fail failed; gnuplot not installed: charts skipped (sudo apt-get install gnuplot-nox)"
    [ $fail -eq 0 ] || exit 1
    exit 77
fi

# --- tune: a small sweep, merged into a config, recorded for the planner
printf '{\n  "train": {"steps": 5},\n  "aio": {"single_submit": false, "queue_depth": 2}\n}\n' \
    >"$TMP/cfg.json"
mkdir -p "$TMP/nvme"
# plan_label: `fsoff plan`'s NVMe line for $TMP/nvme
plan_label() { "$FSOFF" plan --nvme "$TMP/nvme" 2>"$TMP/err" | grep '^plan: host .* NVMe '; }
# (before the sweep, in a cache of its own, so the one tune writes holds tune's entry alone)
if XDG_CACHE_HOME="$TMP/cache-untuned" plan_label | grep -q 'write [0-9.]* GB/s (probed)$'; then
    ok "plan labels untuned NVMe rates (probed)"
else
    bad "plan labels untuned NVMe rates (probed)" "$(XDG_CACHE_HOME="$TMP/cache-untuned" plan_label)" \
        "$(head -c 300 "$TMP/err")"
fi
"$FSOFF" bench tune --nvme "$TMP/nvme" --block-sizes 128K,512K --queue-depths 1,4 --rings 1 \
    --seconds 0.02 --size 4M --write-config "$TMP/cfg.json" --json "$TMP/tune.json" \
    --plot "$TMP/tune.png" >"$TMP/tune.out" 2>"$TMP/err"
rc=$?
if [ $rc -eq 0 ] && grep -q '^"aio": {"block_size": [0-9]*, "queue_depth": [0-9]*}$' "$TMP/tune.out" &&
   grep -q '^# done in' "$TMP/tune.out"; then
    ok "bench tune: the best settings and the aio section"
else
    bad "bench tune" "status $rc" "$(cat "$TMP/tune.out" "$TMP/err" | head -20)"
fi
# the choice is made with the planner's rates: the sweep's read and the write
# timed through a flush, measured for each size at its best depth
if grep -q 'chosen by the read rate and the flushed write rate' "$TMP/tune.out" &&
   grep -q '^#  *[0-9]*[KM] x qd  *[0-9]*: flushed [0-9.]* GB/s (the sweep.s burst [0-9.]*), read .*<- chosen$' "$TMP/tune.out" &&
   python3 - "$TMP/tune.json" <<'EOF2'
import json, sys
j = json.load(open(sys.argv[1]))
c = j["chosen"]
fl = [r for r in j["results"] if "flushed_gbps" in r]
cost = lambda r, f: 1 / r + 1 / f
reads = {(r["block_bytes"], r["queue_depth"], r["rings"]): r["gbps"]
         for r in j["results"] if r["op"] == "read"}
best = min(cost(reads[(r["block_bytes"], r["queue_depth"], r["rings"])], r["flushed_gbps"])
           for r in fl)
ok = (c["chosen_by"] == "read_gbps and flushed_write_gbps" and c["flushed_write_gbps"] > 0
      and len(fl) == 2 and all(r["op"] == "write" and r["rings"] == 1 for r in fl)
      and any(r["block_bytes"] == c["block_bytes"] and r["queue_depth"] == c["queue_depth"]
              and r["flushed_gbps"] == c["flushed_write_gbps"] for r in fl)
      and cost(c["read_gbps"], c["flushed_write_gbps"]) * 0.95 <= best
      and j["aio"]["block_size"] == c["block_bytes"])
sys.exit(0 if ok else 1)
EOF2
then
    ok "bench tune: the aio section chosen by the read and flushed write rates"
else
    bad "bench tune: the aio section chosen by the read and flushed write rates" \
        "$(grep -A4 '^# writes timed' "$TMP/tune.out")" "$(head -c 400 "$TMP/tune.json")"
fi
if [ "$(png_size "$TMP/tune.png")" = "1200x520" ]; then
    ok "bench tune --plot (1200x520)"
else
    bad "bench tune --plot" "$(png_size "$TMP/tune.png")"
fi
aio=$(grep '^"aio"' "$TMP/tune.out")
bs=$(echo "$aio" | sed 's/.*"block_size": \([0-9]*\).*/\1/')
qd=$(echo "$aio" | sed 's/.*"queue_depth": \([0-9]*\).*/\1/')
if grep -q '"steps": 5' "$TMP/cfg.json" && grep -q '"single_submit": false' "$TMP/cfg.json" &&
   grep -q "\"block_size\": $bs" "$TMP/cfg.json" && grep -q "\"queue_depth\": $qd" "$TMP/cfg.json" &&
   "$FSOFF" plan --config "$TMP/cfg.json" --json >/dev/null 2>"$TMP/err"; then
    ok "tune --write-config: the aio section merged, the other keys kept, fsoff takes the file"
else
    bad "tune --write-config" "$(cat "$TMP/cfg.json")" "$(head -c 300 "$TMP/err")"
fi
# the tuned entry's read rate: the first after "tuned" (the nvme entries hold the probe's)
tuned=$(sed -n '/"tuned"/,$p' "$XDG_CACHE_HOME/fsoff/probe.json" 2>/dev/null |
    grep -o '"read_gbps": *[0-9.e+-]*' | head -1 | sed 's/.*: *//')
planned=$("$FSOFF" plan --nvme "$TMP/nvme" --json 2>"$TMP/err" | grep -o '"nvme_read_gbps": *[0-9.e+-]*' | sed 's/.*: *//')
if [ -n "$tuned" ] && [ -n "$planned" ] &&
   awk -v a="$tuned" -v b="$planned" 'BEGIN { exit !(a > 0 && (a - b) ^ 2 < (a * 1e-4) ^ 2) }'; then
    ok "the planner plans with the tuned read rate ($tuned GB/s)"
else
    bad "the planner plans with the tuned read rate" "tuned ${tuned:-none}, planned ${planned:-none}" \
        "$(head -c 300 "$TMP/err")"
fi

if plan_label | grep -q 'write [0-9.]* GB/s (tuned: fsoff bench tune)$'; then
    ok "plan labels tuned NVMe rates (tuned: fsoff bench tune)"
else
    bad "plan labels tuned NVMe rates" "$(plan_label)" "$(head -c 300 "$TMP/err")"
fi
# tuned with one device (the sweep's default), planned with two: the plan says how to tune for two
two=$("$FSOFF" plan --nvme "$TMP/nvme" --devices cpu:2 2>"$TMP/err" | grep '^plan: host .* NVMe ')
if echo "$two" | grep -q '(tuned: fsoff bench tune with 1 device; this plan has 2: tune again with --devices 2)$'; then
    ok "a plan for more devices than tune measured says to tune again"
else
    bad "a plan for more devices than tune measured" "$two" "$(head -c 300 "$TMP/err")"
fi

# --- charts of every bench, from a run or from saved results
expect_png "bench nvme --plot" "$TMP/nv.png" 1200x520 -- bench nvme --nvme "$TMP" --size 4M \
    --block-sizes 128K,512K --queue-depths 1,2 --plot "$TMP/nv.png"
expect_png "plot of a saved bench nvme result" "$TMP/nv2.png" 1200x520 -- \
    plot "$TMP/nv.json" -o "$TMP/nv2.png"
expect_png "bench adam --plot" "$TMP/adam.png" 900x540 -- bench adam --elems 64K --threads 1,2 \
    --reps 1 --json "$TMP/adam.json" --plot "$TMP/adam.png"
expect_png "plot of a saved bench h2d result" "$TMP/h2d.png" 900x540 -- \
    plot "$SRC/tests/fixtures/bench_h2d.json" -o "$TMP/h2d.png"
expect_png "plot of a saved bench allgather result" "$TMP/ag.png" 900x540 -- \
    plot "$SRC/tests/fixtures/bench_allgather.json" -o "$TMP/ag.png"
expect_png "plot --size" "$TMP/ag2.png" 640x400 -- \
    plot "$SRC/tests/fixtures/bench_allgather.json" -o "$TMP/ag2.png" --size 640x400
expect_png "plot of a saved bench net result" "$TMP/net.png" 900x540 -- \
    plot "$SRC/tests/fixtures/bench_net.json" -o "$TMP/net.png"
printf '{"bench": "allgather", "device": "x", "devices": 1, "collectives": "not run: 1 GPU"}\n' \
    >"$TMP/ag1.json"
expect_fail "plot of an allgather result without measurements" 2 "not run: 1 GPU" -- \
    plot "$TMP/ag1.json" -o "$TMP/x.png"

# --- a training run
SMALL=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=2
       --set data.seq_len=32 --set train_micro_batch_size_per_gpu=4)
if "$FSOFF" --steps 4 --nvme "$TMP/nvme" --metrics "$TMP/run.jsonl" "${SMALL[@]}" \
       >"$TMP/out" 2>"$TMP/err"; then
    expect_png "plot of a training run" "$TMP/run.png" 1200x1240 -- \
        plot "$TMP/run.jsonl" -o "$TMP/run.png"
else
    bad "a short training run for the plot" "$(tail -3 "$TMP/err")"
fi
# --- bench pipeline: the small job's data path with its state pinned on NVMe,
# compute as the plan's waits and then none: the steps move the derived bytes
# of every kind, the result has its ratios, and its chart is drawn (and drawn
# again from the saved JSON)
ON_NVME=(--set zero_optimization.offload_param.device=nvme --set zero_optimization.offload_optimizer.device=nvme)
expect_png "bench pipeline --json --plot" "$TMP/pl.png" 900x540 -- \
    bench pipeline --nvme "$TMP/nvme" "${SMALL[@]}" "${ON_NVME[@]}" --devices cpu:2 --steps 2 \
    --store-seconds 0.2 --json "$TMP/pl.json" --plot "$TMP/pl.png"
if python3 - "$TMP/pl.json" <<'EOF2'
import json, sys
j = json.load(open(sys.argv[1]))
ok = (j["bench"] == "pipeline" and j["as_derived"] and j["step_over_bound"] > 0
      and j["data_path_over_store"] > 0 and j["store"]["read_gbps"] > 0
      and all(j["derived_read_by_kind"][k] > 0 for k in ("parameters", "master", "m", "v", "gradients"))
      and len(j["steps"]) == 4 and "nvme" in j["placement"])
sys.exit(0 if ok else 1)
EOF2
then
    ok "bench pipeline --json: the derived bytes of every kind, the ratios"
else
    bad "bench pipeline --json: the derived bytes of every kind, the ratios" "$(head -c 600 "$TMP/pl.json")"
fi
expect_png "plot of a saved pipeline result" "$TMP/pl2.png" 900x540 -- plot "$TMP/pl.json" -o "$TMP/pl2.png"
expect_fail "bench pipeline --steps 1" 2 "--steps 1" -- bench pipeline --steps 1
expect_fail "bench pipeline --nvme of a missing folder" 2 "$TMP/no-such-dir" -- \
    bench pipeline --nvme "$TMP/no-such-dir" --steps 2
# a chart fsoff cannot draw is refused before the benchmark runs (nothing measured on stdout)
for b in adam "nvme --nvme $TMP/nvme" "tune --nvme $TMP/nvme" pipeline h2d; do
    expect_fail "bench ${b%% *} --plot x.pdf" 2 "--plot x.pdf: fsoff draws PNG or SVG" -- \
        bench $b --plot x.pdf
    [ -s "$TMP/out" ] && bad "bench ${b%% *} --plot x.pdf: refused before measuring" "$(head -c 300 "$TMP/out")"
done
[ -z "$(ls -A "$TMP/nvme" | grep fsoff)" ] && ok "bench pipeline leaves no NVMe files" ||
    bad "bench pipeline leaves no NVMe files" "$(ls -A "$TMP/nvme")"

# -o FILE.svg: an SVG of the size asked for, never PNG bytes under that name
rm -f "$TMP/run.svg"
if "$FSOFF" plot "$TMP/run.jsonl" -o "$TMP/run.svg" --size 800x600 >"$TMP/out" 2>"$TMP/err" &&
   head -c 5 "$TMP/run.svg" | grep -q '^<?xml' && grep -q '<svg' "$TMP/run.svg" &&
   grep -q 'width="800" height="600"' "$TMP/run.svg" && [ "$(png_size "$TMP/run.svg")" = "not a PNG" ]; then
    ok "plot -o FILE.svg writes an SVG (800x600)"
else
    bad "plot -o FILE.svg writes an SVG" "$(head -c 80 "$TMP/run.svg" | od -c | head -2)" "$(head -c 400 "$TMP/err")"
fi

# a run resumed into the same file (a "resume" event) or into a second file:
# drawn whole, the killed segment's steps past the checkpoint replaced, each
# resume marked; grad norm has its panel
step_line() { echo "{\"step\": $1, \"loss\": $2, \"grad_norm\": 1.5, \"lr\": 0.001, \"tok_s\": 900, \"step_ms\": 20, \"stall_ms\": 0, \"compute_ms\": 19, \"nvme_read_bytes\": 0, \"nvme_write_bytes\": 0}"; }
{
    for i in 1 2 3 4 5; do step_line $i 5.$i; done
    echo '{"event": "resume", "step": 3, "checkpoint": "ck/step-00000003", "steps": 8}'
    for i in 4 5 6; do step_line $i 4.$i; done
} >"$TMP/seg.jsonl"
{ for i in 7 8; do step_line $i 3.$i; done; echo '{"event": "summary", "steps": 5}'; } >"$TMP/seg2.jsonl"
expect_png "plot of a resumed run: one file, two segments, and its next file" "$TMP/seg.png" \
    1200x1240 -- plot "$TMP/seg.jsonl" "$TMP/seg2.jsonl" -o "$TMP/seg.png"
# the SVG's text says what was drawn: steps 1 to 8 once each, one resume
if "$FSOFF" plot "$TMP/seg.jsonl" "$TMP/seg2.jsonl" -o "$TMP/seg.svg" >"$TMP/out" 2>"$TMP/err" &&
   grep -q 'seg.jsonl and 1 more file, 8 steps, resumed 1 time' "$TMP/seg.svg" &&
   grep -q 'gradient norm' "$TMP/seg.svg"; then
    ok "a resumed run is drawn whole: 8 steps, 1 resume, the gradient norm"
else
    bad "a resumed run is drawn whole" "$(grep -o 'fsoff training run[^<]*' "$TMP/seg.svg")" "$(head -c 400 "$TMP/err")"
fi
expect_fail "plot of a second file that is no metrics file" 2 "$TMP/text.log:1:" -- \
    plot "$TMP/seg.jsonl" "$TMP/text.log" -o "$TMP/x.png"

# a run that diverged wrote its loss as nan; the chart shows a gap there
{
    echo '{"step": 1, "loss": 5.5, "lr": 0.001, "tok_s": 900, "step_ms": 20, "stall_ms": 0, "compute_ms": 19, "nvme_read_bytes": 0, "nvme_write_bytes": 0}'
    echo '{"step": 2, "loss": -nan, "lr": 0.001, "tok_s": 950, "step_ms": 19, "stall_ms": 0, "compute_ms": 18, "nvme_read_bytes": 0, "nvme_write_bytes": 0}'
    echo '{"event": "summary", "steps": 2}'
} >"$TMP/nan.jsonl"
expect_png "plot of a run that diverged" "$TMP/nan.png" 1200x1240 -- \
    plot "$TMP/nan.jsonl" -o "$TMP/nan.png"

echo "bench: $pass passed, $fail failed"
[ $fail -eq 0 ]
