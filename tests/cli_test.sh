#!/usr/bin/env bash
# cli_test.sh FSOFF — the fsoff command as a user meets it.
#
# Bad inputs: each must exit non-zero without crashing (status < 128) and
# print one error line that names the thing and the place. Good runs: the
# metrics file has the promised keys, two runs with one seed give identical
# losses, and a short run of a small model makes the loss fall.
set -u
FSOFF=${1:?usage: cli_test.sh path/to/fsoff}
SRC=${FSO_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0

ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; shift; for l in "$@"; do echo "     $l"; done; }

# expect_error NAME 'substring' 'substring' ... -- fsoff args...
expect_error() {
    local name=$1; shift
    local pats=()
    while [ "$1" != "--" ]; do pats+=("$1"); shift; done
    shift
    "$FSOFF" "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then
        bad "$name" "exit status $rc (want 1 or 2)" "$(head -c 400 "$TMP/err")"
        return
    fi
    local p
    for p in "${pats[@]}"; do
        if ! grep -qF -- "$p" "$TMP/err"; then
            bad "$name" "stderr lacks: $p" "stderr: $(head -c 400 "$TMP/err")"
            return
        fi
    done
    if [ "$(grep -c 'error' "$TMP/err")" -ne 1 ]; then
        bad "$name" "want exactly one error line" "$(cat "$TMP/err")"
        return
    fi
    ok "$name"
}

# small fast model for the good runs
SMALL=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=2
       --set data.seq_len=32 --set train_micro_batch_size_per_gpu=4)

# --- command line
expect_error "unknown option" "--bogus" -- --bogus
expect_error "unknown command" "unknown command 'trian'" -- trian
expect_error "steps not a number" "--steps abc" -- --steps abc
expect_error "devices unknown" "--devices tpu" -- --devices tpu
expect_error "set without =" "--set" "key.path=value" -- --set model.hidden_size
expect_error "missing option value" "--config" -- --config

# --- configuration
expect_error "missing config" "$TMP/nope.json" "No such file" -- --config "$TMP/nope.json"
printf '{\n  "seed": 1,\n  "model": { "hidden_size": 64,, }\n}\n' >"$TMP/malformed.json"
expect_error "malformed config" "$TMP/malformed.json:3:" -- --config "$TMP/malformed.json"
printf '{\n  "train": {\n    "stepz": 5\n  }\n}\n' >"$TMP/unknown.json"
expect_error "unknown key" "$TMP/unknown.json:3:" "train.stepz" -- --config "$TMP/unknown.json"
printf '{ "train_micro_batch_size_per_gpu": "eight" }\n' >"$TMP/type.json"
expect_error "wrong type" "train_micro_batch_size_per_gpu" "eight" -- --config "$TMP/type.json"
expect_error "heads must divide hidden" "num_attention_heads" "hidden_size" -- --set model.num_attention_heads=5
expect_error "kv heads must divide heads" "num_key_value_heads" -- --set model.num_key_value_heads=3
expect_error "seq_len beyond positions" "data.seq_len" "max_position_embeddings" -- --set data.seq_len=1000
expect_error "set of unknown key" "--set model.hidden_sise=3" "model.hidden_sise" -- --set model.hidden_sise=3

# --- data
expect_error "missing data" "$TMP/none.bin" -- --data "$TMP/none.bin"
printf 'M\x17\x35\x01' >"$TMP/short.bin"
expect_error "truncated header" "$TMP/short.bin" -- --data "$TMP/short.bin" --set data.format=tokens
# a valid v1 file of 600 tokens, then truncated
python_free_tokens() { # N MAX: header + N uint16 tokens i % MAX
    local n=$1 max=$2
    {
        printf '\x88\xd8\x34\x01\x01\x00\x00\x00'
        printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((n & 255)) $(((n >> 8) & 255)) $(((n >> 16) & 255)) $(((n >> 24) & 255)))"
        head -c $((1024 - 12)) /dev/zero
        local i
        for ((i = 0; i < n; i++)); do
            local t=$((i % max))
            printf "$(printf '\\x%02x\\x%02x' $((t & 255)) $((t >> 8)))"
        done
    }
}
python_free_tokens 600 200 >"$TMP/good.bin"
head -c $((1024 + 1000)) "$TMP/good.bin" >"$TMP/trunc.bin"
expect_error "truncated tokens" "$TMP/trunc.bin" "truncated" -- --data "$TMP/trunc.bin"
python_free_tokens 600 300 >"$TMP/big.bin"
expect_error "token beyond vocab" "$TMP/big.bin" ">= model.vocab_size" -- --data "$TMP/big.bin"
printf 'short text' >"$TMP/short.txt"
expect_error "corpus shorter than a sequence" "$TMP/short.txt" "seq_len" -- --data "$TMP/short.txt"
{ printf '\x88\xd8\x34\x01\x07\x00\x00\x00'; head -c 1100 /dev/zero; } >"$TMP/ver.bin"
expect_error "unsupported version" "$TMP/ver.bin" "version" -- --data "$TMP/ver.bin"
expect_error "metrics in missing folder" "$TMP/no/dir/m.jsonl" -- --steps 1 --metrics "$TMP/no/dir/m.jsonl" "${SMALL[@]}"

# --- devices and tiers
expect_error "devices cpu:0" "--devices cpu:0" -- --devices cpu:0
expect_error "device-mem not a size" "--device-mem lots" -- --device-mem lots
expect_error "device cap too small" "device memory" "--device-mem" -- --devices cpu:2 --device-mem 2M --steps 1
expect_error "nvme folder missing" "$TMP/nofolder" -- --nvme "$TMP/nofolder" --steps 1 "${SMALL[@]}"
printf '{ "zero_optimization": { "offload_param": { "device": "nvme" } } }\n' >"$TMP/nopath.json"
expect_error "nvme without a path" "nvme_path" "--nvme" -- --config "$TMP/nopath.json"
printf '{ "zero_optimization": { "offload_optimizer": { "device": "ssd" } } }\n' >"$TMP/ssd.json"
expect_error "offload device unknown" "$TMP/ssd.json:1:" "offload_optimizer.device" '"ssd"' -- --config "$TMP/ssd.json"
mkdir -p "$TMP/nv0" "$TMP/nv1"
if "$FSOFF" --steps 3 --devices cpu:2 --nvme "$TMP/nv0,$TMP/nv1" --metrics "$TMP/nv.jsonl" "${SMALL[@]}" >"$TMP/out" 2>"$TMP/err" &&
   grep -q '2 CPU devices' "$TMP/out" && grep -q 'on nvme' "$TMP/out" &&
   grep -q '"nvme_read_bytes": [1-9]' <(head -1 "$TMP/nv.jsonl") &&
   grep -q '"peak_device_bytes": [1-9]' <(tail -1 "$TMP/nv.jsonl") &&
   [ -z "$(ls -A "$TMP/nv0" "$TMP/nv1" | grep fsoff)" ]; then
    ok "two devices with state on NVMe, files cleaned up"
else
    bad "two devices with state on NVMe, files cleaned up" "$(cat "$TMP/err")" "$(ls -A "$TMP/nv0" "$TMP/nv1")"
fi

# --- Hugging Face folders (--init-from)
HF="$SRC/tests/fixtures/hf/llama3_tied_f16"
python_free_tokens 600 64 >"$TMP/tok64.bin"
mkdir -p "$TMP/hfnv"
if "$FSOFF" --init-from "$HF" --data "$TMP/tok64.bin" --steps 2 --devices cpu:2 --nvme "$TMP/hfnv" \
       --set data.seq_len=16 >"$TMP/out" 2>"$TMP/err" &&
   grep -q "parameters from Hugging Face folder $HF, rope_scaling llama3" "$TMP/out" &&
   grep -q 'vocab 64, tied head' "$TMP/out" && grep -q '^step     2/2 | loss' "$TMP/out"; then
    ok "init-from a sharded F16 folder on two devices with state on NVMe"
else
    bad "init-from a sharded F16 folder on two devices with state on NVMe" "$(cat "$TMP/err")" "$(head -5 "$TMP/out")"
fi
expect_error "init-from a disagreeing key" "--set model.num_hidden_layers=3" \
    "model.num_hidden_layers: 3 (number) disagrees with $HF/config.json:" -- \
    --init-from "$HF" --set model.num_hidden_layers=3
expect_error "init-from a missing folder" "--set model.init_from=" "$TMP/nohf/config.json: cannot read" -- \
    --init-from "$TMP/nohf"
mkdir -p "$TMP/noweights" && cp "$HF/config.json" "$TMP/noweights/"
expect_error "init-from a folder without weights" "$TMP/noweights: has no model.safetensors" -- \
    --init-from "$TMP/noweights" --data "$TMP/tok64.bin" --set data.seq_len=16 --steps 1

# --- good runs
if "$FSOFF" --steps 3 --data "$TMP/good.bin" --metrics "$TMP/m1.jsonl" "${SMALL[@]}" >"$TMP/out" 2>"$TMP/err"; then
    miss=""
    for k in '"step"' '"loss"' '"lr"' '"grad_norm"' '"step_ms"' '"tok_s"'; do
        grep -q "$k" <(head -1 "$TMP/m1.jsonl") || miss="$miss $k"
    done
    for k in '"event": "summary"' '"steps": 3' '"tokens"' '"final_loss"' '"peak_rss_bytes"'; do
        grep -qF "$k" <(tail -1 "$TMP/m1.jsonl") || miss="$miss $k"
    done
    [ "$(wc -l <"$TMP/m1.jsonl")" -eq 4 ] || miss="$miss (want 4 lines)"
    grep -q '^step     3/3 | loss' "$TMP/out" || miss="$miss (step line)"
    if [ -z "$miss" ]; then ok "token file run writes metrics"; else bad "token file run writes metrics" "missing:$miss"; fi
else
    bad "token file run writes metrics" "$(cat "$TMP/err")"
fi

losses() { grep -o '"loss": [^,]*' "$1"; }
"$FSOFF" --steps 4 --metrics "$TMP/d1.jsonl" "${SMALL[@]}" --set seed=7 >/dev/null 2>&1
"$FSOFF" --steps 4 --metrics "$TMP/d2.jsonl" "${SMALL[@]}" --set seed=7 >/dev/null 2>&1
"$FSOFF" --steps 4 --metrics "$TMP/d3.jsonl" "${SMALL[@]}" --set seed=8 >/dev/null 2>&1
if [ -s "$TMP/d1.jsonl" ] && [ "$(losses "$TMP/d1.jsonl")" = "$(losses "$TMP/d2.jsonl")" ] &&
   [ "$(losses "$TMP/d1.jsonl")" != "$(losses "$TMP/d3.jsonl")" ]; then
    ok "same seed, identical losses; other seed, other losses"
else
    bad "same seed, identical losses" "$(losses "$TMP/d1.jsonl" | tr '\n' ' ')" "$(losses "$TMP/d2.jsonl" | tr '\n' ' ')"
fi

# The loss must clearly fall on the built-in corpus within 60 small steps.
"$FSOFF" --steps 60 --metrics "$TMP/l.jsonl" "${SMALL[@]}" --set scheduler.params.warmup_num_steps=5 >/dev/null 2>"$TMP/err"
first=$(head -1 "$TMP/l.jsonl" | grep -o '"loss": [^,]*' | cut -d' ' -f2)
last=$(tail -1 "$TMP/l.jsonl" | grep -o '"final_loss": [^,]*' | cut -d' ' -f2)
if [ -n "$first" ] && [ -n "$last" ] && awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.5) }'; then
    ok "loss falls ($first -> $last)"
else
    bad "loss falls" "first ${first:-?} last ${last:-?}" "$(cat "$TMP/err")"
fi

# --- benchmarks: the list, bad usage, and the GPU ones skip cleanly without a GPU
expect_error "bench unknown" "bench nope" "nvme adam h2d allgather" -- bench nope
expect_error "bench allgather --bytes" "--bytes" -- bench allgather --bytes 1M
expect_error "bench h2d bad size" "--bytes 12Q" -- bench h2d --bytes 12Q
for b in h2d allgather; do
    "$FSOFF" bench $b --seconds 0.05 --json "$TMP/$b.json" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if { [ $rc -eq 77 ] && grep -q "fsoff bench $b: skipped: " "$TMP/out"; } ||
       { [ $rc -eq 0 ] && [ -s "$TMP/$b.json" ]; }; then
        ok "bench $b: measured, or skipped with the reason (status $rc)"
    else
        bad "bench $b" "status $rc" "$(head -c 400 "$TMP/out") $(head -c 400 "$TMP/err")"
    fi
done

# --- without a GPU or the CUDA libraries: help and a CPU run map no CUDA
# library; FSO_CUDA_MODULE at a missing file stands for a CUDA build whose
# module or libraries are absent: auto trains on the CPU saying why in its
# one devices line, --devices cuda fails saying why (in a build without CUDA
# the reason is that)
cuda_libs='file=lib(cudart|cublas|cublasLt|nccl)\.so'
if LD_DEBUG=files "$FSOFF" --help >/dev/null 2>"$TMP/ld1" &&
   LD_DEBUG=files "$FSOFF" --devices cpu --steps 1 "${SMALL[@]}" >/dev/null 2>"$TMP/ld2" &&
   ! grep -qE "$cuda_libs" "$TMP/ld1" "$TMP/ld2"; then
    ok "help and a CPU run load no CUDA library"
else
    bad "help and a CPU run load no CUDA library" "$(grep -hE "$cuda_libs" "$TMP/ld1" "$TMP/ld2" | head -3)"
fi
nomod="$TMP/none/libfso_cuda.so"
if FSO_CUDA_MODULE=$nomod "$FSOFF" --steps 1 "${SMALL[@]}" >"$TMP/out" 2>"$TMP/err" &&
   grep 'devices auto: 1 CPU device' "$TMP/out" |
       grep -qE "FSO_CUDA_MODULE=$nomod: No such file|built without CUDA"; then
    ok "devices auto without the CUDA module: the CPU, and why"
else
    bad "devices auto without the CUDA module" "$(cat "$TMP/out" "$TMP/err" | head -5)"
fi
FSO_CUDA_MODULE=$nomod expect_error "devices cuda without the CUDA module" \
    "--devices cuda: " "use --devices cpu" -- --devices cuda --steps 1
if ! grep -qE "FSO_CUDA_MODULE=$nomod: No such file|built without CUDA" "$TMP/err"; then
    bad "devices cuda without the CUDA module: the reason" "$(cat "$TMP/err")"
fi

# with the NVIDIA driver but no device it may use (a stand-in driver, built
# in CUDA builds): the CPU, the driver's reason, and no CUDA module loaded
stub="${FSO_BUILDDIR:-}/tests/driver_stub"
if [ -e "$stub/libcuda.so.1" ]; then
    if LD_LIBRARY_PATH="$stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" LD_DEBUG=files \
           "$FSOFF" --steps 1 "${SMALL[@]}" >"$TMP/out" 2>"$TMP/ld3" &&
       grep 'devices auto: 1 CPU device' "$TMP/out" |
           grep -q "the NVIDIA driver shows none to this process (cuInit: no CUDA-capable" &&
       grep -q "file=libcuda.so.1" "$TMP/ld3" &&
       ! grep -qE "$cuda_libs|libfso_cuda" "$TMP/ld3"; then
        ok "devices auto with a driver but no device: the CPU, why, and no CUDA module loaded"
    else
        bad "devices auto with a driver but no device" \
            "$(grep 'devices' "$TMP/out" | head -2) $(grep -hE "$cuda_libs|libfso_cuda" "$TMP/ld3" | head -2)"
    fi
fi

expect_help=$("$FSOFF" --help)
if echo "$expect_help" | grep -q -- '--metrics FILE' && "$FSOFF" --version | grep -q '^fsoff '; then
    ok "help and version"
else
    bad "help and version"
fi

echo "cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
