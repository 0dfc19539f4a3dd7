#!/usr/bin/env bash
# ds_corpus.sh — load every DeepSpeed config under a folder with fsoff and
# say what became of each: it loads; it is refused naming a DeepSpeed
# feature fsoff lacks (fp16, progressive layer drop, 1-bit Adam, ...); it is
# not JSON (a template whose placeholders a script fills in); or another
# error, which is a defect of fsoff's loader (exit status 1 when any).
#
# usage: bench/ds_corpus.sh DIR [FSOFF [OPTION...]]
#   DIR     a folder to search, e.g. a checkout of microsoft/DeepSpeedExamples
#   FSOFF   the fsoff binary (default: build/fsoff)
#   OPTION  passed to fsoff plan after --config FILE, e.g. --set fp16.enabled=false
#           to see what else the fp16 configs would meet
#
# A file counts as a DeepSpeed config when it is a .json file naming one of
# DeepSpeed's batch, precision or ZeRO keys. Each is loaded by
# `fsoff plan --config FILE`, which validates the whole configuration and
# plans the default model on this machine (no GPU needed, well under a
# second a file).
set -u

dir=${1:?usage: bench/ds_corpus.sh DIR [FSOFF [OPTION...]]}
fsoff=${2:-build/fsoff}
shift $(($# < 2 ? $# : 2))
if [ ! -x "$fsoff" ]; then
    echo "ds_corpus: $fsoff is not an executable; build fsoff (meson compile -C build) or name it" >&2
    exit 2
fi
pattern='"(train_batch_size|train_micro_batch_size_per_gpu|gradient_accumulation_steps|zero_optimization|steps_per_print|fp16|bf16|gradient_clipping)"'

loads=0 refused=0 notjson=0 other=0
printf '%-90s %-8s %s\n' FILE RESULT DETAIL
while IFS= read -r f; do
    err=$("$fsoff" plan --config "$f" "$@" 2>&1 >/dev/null | grep '^fsoff: error: ' | head -n 1)
    rc=${PIPESTATUS[0]}
    rel=${f#"$dir"/}
    msg=${err#fsoff: error: }
    if [ -z "$err" ] && [ "$rc" -eq 0 ]; then
        result=loads detail=""
        loads=$((loads + 1))
    elif [[ $msg == *"fsoff does not implement DeepSpeed's "* ]]; then
        detail=${msg#*"fsoff does not implement DeepSpeed's "}
        detail=${detail%%[,;(]*}
        result=refused detail="${detail% }"
        refused=$((refused + 1))
    elif [[ $msg == *"fp16 loss scaling is not supported"* ]]; then
        result=refused detail="fp16 (loss scaling)"
        refused=$((refused + 1))
    elif ! /usr/bin/python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$f" 2>/dev/null; then
        result=notjson detail="not JSON: ${msg#"$f":}"
        notjson=$((notjson + 1))
    else
        result=OTHER detail="${msg:-exit status $rc}"
        other=$((other + 1))
    fi
    printf '%-90s %-8s %s\n' "$rel" "$result" "$detail"
done < <(grep -rlE --include='*.json' "$pattern" "$dir" | LC_ALL=C sort)

total=$((loads + refused + notjson + other))
echo
echo "configs: $total; loads: $loads; refused naming a DeepSpeed feature: $refused;" \
     "not JSON: $notjson; other errors: $other"
[ "$other" -eq 0 ]
