#!/usr/bin/env bash
# checkpoint_vs_fio.sh — fsoff's checkpoint save and load against fio's
# sequential write and read of the same bytes in the same folder, side by
# side in one run, and what a save costs the training it overlaps.
#
#   bench/checkpoint_vs_fio.sh DIR [ROUNDS]
#
# Each round (default 3), in DIR:
#   1. fsoff trains MODEL for 4 steps with --save-every 2: the save of step 2
#      runs while steps 3 and 4 train (its seconds and exposed_ms say what
#      it cost them), the save of step 4 at the end runs alone (its bytes /
#      seconds is the save throughput: from the start of the save to
#      `latest` naming it, fsyncs included);
#   2. fsoff --resume loads that checkpoint (every chunk checked): the load
#      throughput is state.bin's bytes over the time the resume line reports;
#   3. fio writes the same number of bytes to a new file in DIR (io_uring,
#      --direct=1, 8 MiB blocks, queue depth 32, fallocate'd, --end_fsync=1)
#      before fsoff trains and again after, and reads it back before fsoff
#      loads and again after: fsoff's side is compared with the mean of the
#      two, so a drive whose speed drifts (shared machines) drifts for both.
# Prints each round, then the median of the ratios fsoff/fio. The goal is a
# save at least 0.8 of fio's write. GB = 1e9 bytes.
#
# Environment:
#   FSOFF       the fsoff binary (default: build/fsoff next to this script)
#   MODEL       fsoff options for the model and placement (default: a 105M-
#               parameter Llama, 1.18 GiB of checkpoint, state on the device)
#   FSOFF_ARGS  more fsoff options (e.g. --nvme DIR2 for state on NVMe)
set -euo pipefail

usage() { echo "usage: $0 DIR [ROUNDS]   (see the comment at the top)" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
DIR=$1
ROUNDS=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
FSOFF=${FSOFF:-$here/../build/fsoff}
MODEL=${MODEL:---set model.vocab_size=32000 --set model.hidden_size=768 \
--set model.intermediate_size=2048 --set model.num_hidden_layers=8 \
--set model.num_attention_heads=12 --set model.num_key_value_heads=12 \
--set model.tie_word_embeddings=false --set model.max_position_embeddings=256 \
--set data.seq_len=128 --set train_micro_batch_size_per_gpu=1}
FSOFF_ARGS=${FSOFF_ARGS:-}

. "$here/fio_lib.sh"
fio_require checkpoint_vs_fio "$DIR"

work=$(mktemp -d)
ckpt="$DIR/checkpoint-bench"
fiofile="$DIR/fio-checkpoint-bench.0"
cleanup() { rm -rf "$work" "$ckpt"; rm -f "$fiofile"; }
trap cleanup EXIT
[ ! -e "$ckpt" ] && [ ! -e "$fiofile" ] || die "$ckpt or $fiofile exists, left over from an earlier run; remove it"

fio_gbps() { # RW BYTES -> GB/s
    fio --name=ckpt --filename="$fiofile" --size="$2" --bs=8M --iodepth=32 --rw="$1" \
        --direct=1 --ioengine=io_uring --fallocate=native --end_fsync=1 --numjobs=1 \
        --output-format=json --output="$work/fio.json" >/dev/null 2>"$work/fio.err" ||
        { cat "$work/fio.err" >&2; die "fio failed ($1)"; }
    python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
print("%.4f" % (j["jobs"][0][sys.argv[2]]["bw_bytes"] / 1e9))' "$work/fio.json" "$1"
}

read -r -a model <<<"$MODEL"
read -r -a extra <<<"$FSOFF_ARGS"
: >"$work/rows"
mean() { python3 -c 'import sys; print((float(sys.argv[1]) + float(sys.argv[2])) / 2)' "$1" "$2"; }
state=0
for ((r = 1; r <= ROUNDS; r++)); do
    rm -rf "$ckpt"
    if [ "$state" -gt 0 ]; then # the size is known after the first round's save
        rm -f "$fiofile"
        w1=$(fio_gbps write "$state")
        rm -f "$fiofile"
    fi
    "$FSOFF" "${model[@]}" "${extra[@]}" --steps 4 --save "$ckpt" --save-every 2 --keep 1 \
        --metrics "$work/m.jsonl" >"$work/train.out" 2>"$work/train.err" ||
        { cat "$work/train.err" >&2; die "fsoff failed training"; }
    state=$(stat -c %s "$ckpt/step-00000004/state.bin")
    w2=$(fio_gbps write "$state")
    [ "$r" -gt 1 ] || w1=$w2
    r1=$(fio_gbps read "$state")
    "$FSOFF" "${model[@]}" "${extra[@]}" --steps 4 --resume "$ckpt" >"$work/load.out" \
        2>"$work/load.err" || { cat "$work/load.err" >&2; die "fsoff failed loading"; }
    r2=$(fio_gbps read "$state")
    rm -f "$fiofile"
    w=$(mean "$w1" "$w2")
    rd=$(mean "$r1" "$r2")
    python3 - "$work/m.jsonl" "$work/load.out" "$state" "$w" "$rd" >>"$work/rows" <<'EOF'
import json, re, sys
ev = {}
steps = []
for l in open(sys.argv[1]):
    j = json.loads(l)
    if j.get("event") == "checkpoint":
        ev[j["step"]] = j
    elif "step_ms" in j:
        steps.append(j["step_ms"])
m = re.search(r"resume: step 4 from .* in ([0-9.]+) s", open(sys.argv[2]).read())
if not m or 2 not in ev or 4 not in ev:
    sys.exit("checkpoint_vs_fio: error: no checkpoint events or resume line")
state = int(sys.argv[3])
mid, end = ev[2], ev[4]
print(end["bytes"], end["bytes"] / end["seconds"] / 1e9, sys.argv[4],
      state / float(m.group(1)) / 1e9, sys.argv[5], mid["bytes"] / mid["seconds"] / 1e9,
      mid["seconds"], mid["exposed_ms"], sum(steps[2:]) / len(steps[2:]), end["cloned_bytes"])
EOF
done

python3 - "$work/rows" "$DIR" <<'EOF'
import statistics, sys
rows = [[float(x) for x in l.split()] for l in open(sys.argv[1])]
print("# checkpoint save and load vs fio in %s: %.2f GiB, fio: io_uring --direct=1 --bs=8M "
      "--iodepth=32 --end_fsync=1" % (sys.argv[2], rows[0][0] / 2**30))
print("# %5s %10s %10s %9s %10s %10s %9s | %14s %9s %11s %10s %8s" % (
    "round", "save", "fio write", "ratio", "load", "fio read", "ratio",
    "save in steps", "seconds", "exposed ms", "step ms", "exposed"))
print("# %5s %10s %10s %9s %10s %10s %9s | %14s %9s %11s %10s %8s" % (
    "", "GB/s", "GB/s", "", "GB/s", "GB/s", "", "GB/s", "s", "ms", "ms", "%"))
sr, lr, ex = [], [], []
for i, (b, save, w, load, rd, mid, secs, exposed, step, cloned) in enumerate(rows):
    sr.append(save / w)
    lr.append(load / rd)
    ex.append(exposed / (secs * 1e3))
    print("  %5d %10.3f %10.3f %9.2f %10.3f %10.3f %9.2f | %14.3f %9.2f %11.1f %10.1f %7.1f%%"
          % (i + 1, save, w, save / w, load, rd, load / rd, mid, secs, exposed, step,
             100 * exposed / (secs * 1e3)))
    if cloned:
        print("# round %d: %.2f GiB of the save shared with the NVMe store by reflink"
              % (i + 1, cloned / 2**30))
ok = statistics.median(sr) >= 0.8
print("# median: save/fio %.2f (goal 0.8: %s), load/fio %.2f; a save during training: "
      "exposed %.1f%% of its seconds" % (statistics.median(sr), "OK" if ok else "FAILED",
                                         statistics.median(lr), 100 * statistics.median(ex)))
EOF
