#!/usr/bin/env bash
# readme_examples.sh FSOFF [FILE.md...] — every `build/fsoff` example in the
# documentation, run: README.md and every page of docs/ (in name order), or
# the files given.
#
# The examples are read from the files' ```sh blocks, so a changed example
# is tested as it now reads. An example that several files show (the same
# command, comments aside) runs once, where it first appears, and is
# reported with every file that shows it. Files are read in order and their
# examples run in that order, so an example may use what an earlier one
# made (a metrics file, a checkpoint). Short versions: training runs 2
# steps, benchmark sizes are small; placeholders become real files and
# folders: /mnt/nvme* folders here, tokens.bin GPT-2-range tokens, book.txt text, FILE and F
# temporary files, charts (*.png) and configs written (*.json without a
# folder) here, the probe cache here too, checkpoints (ckpt, and
# ckpt/step-N as the one the 2-step runs saved, step 2) and exported
# folders (hf-out, one per example) here; a Qwen folder given to
# --tokenizer or --init-from becomes a small Qwen2 model made here with the
# committed Qwen tokenizer (the fine-tuning walk: its token files NAME.bin
# after --data and --val-data, its checkpoints ft-ckpt and export qwen-ft
# here; configs/finetune.json runs with 64-token windows of 2 sequences),
# another tokenizer folder models/NAME a small byte-level one of
# tests/fixtures/tokenize, chats.jsonl 400 conversations, an output -o
# NAME.bin here; a Hugging Face folder given
# to --init-from becomes the small fixture tests/fixtures/hf/llama3_tied_f16,
# and that command's tokens.bin tokens in its vocabulary (64). Each must
# exit 0: 77 is also right for the GPU benchmarks without a GPU, 1 for a
# plan that answers "no placement fits" for this machine (its documented
# status: a folder here may hold less than the drive the example means), and
# 1 for a chart on a machine without gnuplot when the error says to install
# it. Examples that need PyTorch or fio (python3 and bench/*.sh lines) are
# not run here. A failure names the file (or files) the example is in.
set -u
FSOFF=$(realpath "${1:?usage: readme_examples.sh path/to/fsoff [FILE.md...]}")
shift
. "$(dirname "$0")/lib.sh"

doc_files "$@" # the files, as paths from the source folder

export XDG_CACHE_HOME="$TMP/cache" # the probes and tune's figures: not the user's cache
write_tokens 1200 97 50257 >"$TMP/tokens.bin"
write_tokens 1200 1 64 >"$TMP/tokens64.bin"
HF="$SRC/tests/fixtures/hf/llama3_tied_f16"
for i in $(seq 40); do echo "The quick brown fox jumps over the lazy dog, line $i."; done >"$TMP/book.txt"
mkdir -p "$TMP/nvme" "$TMP/nvme0" "$TMP/nvme1"
# chat data for `fsoff tokenize` examples (a tokenizer folder models/NAME becomes one of
# tests/fixtures/tokenize: chatml for a Qwen name, llama3 for a Llama name, else bytes)
for i in $(seq 400); do
    printf '{"messages": [{"role": "user", "content": "What is %d plus %d?"}, {"role": "assistant", "content": "%d plus %d is %d."}]}\n' "$i" "$i" "$i" "$i" $((2 * i))
done >"$TMP/chats.jsonl"
# the fine-tuning walk's model: Qwen2-shaped, small, with Qwen's own tokenizer (the committed
# one is Qwen3's: Qwen2.5's vocabulary, merges and pre-tokenizer) and no chat_template, so
# ChatML is picked by its special tokens
QWEN="$TMP/qwen-small"
if ! "$FSOFF" --set model.model_type=qwen2 --set model.vocab_size=151936 --set model.hidden_size=32 \
        --set model.intermediate_size=64 --set model.num_hidden_layers=2 \
        --set model.num_attention_heads=4 --set model.num_key_value_heads=2 --set data.seq_len=32 \
        --steps 1 --save "$TMP/qwen-ck" >"$TMP/out" 2>&1 ||
   ! "$FSOFF" export "$TMP/qwen-ck" "$QWEN" >"$TMP/out" 2>&1 ||
   ! gzip -dc "$SRC/tests/fixtures/tokenizer/qwen3/tokenizer.json.gz" >"$QWEN/tokenizer.json"; then
    echo "FAIL making the small Qwen model: $(tail -c 600 "$TMP/out")"
    exit 1
fi
printf '{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}\n' >"$QWEN/tokenizer_config.json"

# Each file's commands: ```sh blocks, continuation lines joined, comments
# cut; "FILE<TAB>COMMAND" lines, in file order
for f in "${files[@]}"; do
    [ -r "$SRC/$f" ] || { echo "FAIL $f: cannot read it"; exit 1; }
    awk '/^```sh/ { f = 1; next } /^```/ { f = 0 } f' "$SRC/$f" |
        sed -e ':a' -e '/\\$/N; s/\\\n[[:space:]]*/ /; ta' |
        sed -E 's/[[:space:]]+#.*$//' | grep -E '(^|&& )build/fsoff( |$)' |
        sed -E 's/^.*&& (build\/fsoff)/\1/' | sed "s#^#$f\t#"
done >"$TMP/found"
[ -s "$TMP/found" ] || { echo "FAIL no build/fsoff examples found in ${files[*]}"; exit 1; }
# One line per distinct command, where it first appears: "FILES<TAB>COMMAND",
# FILES every file that shows it, comma-separated
examples=$(awk -F '\t' '
    !($2 in where) { order[n++] = $2; where[$2] = $1; next }
    index(", " where[$2] ", ", ", " $1 ", ") == 0 { where[$2] = where[$2] ", " $1 }
    END { for (i = 0; i < n; i++) print where[order[i]] "\t" order[i] }' "$TMP/found")

cd "$SRC" || exit 1
n=0
while IFS=$'\t' read -r where ex; do
    n=$((n + 1))
    # [--opt a|b] -> --opt a; placeholders; short versions
    cmd=$(echo "$ex" | sed -E \
        -e 's/\[([^]|]*)\|[^]]*\]/\1/g' -e 's/\[([^]]*)\]/\1/g' \
        -e "s#^build/fsoff#$FSOFF#" \
        -e "s#(--tokenizer|--init-from) [^ ]*(Qwen|qwen)[^ ]*#\\1 $QWEN#g" \
        -e "s#(^| )ft-ckpt( |$)#\\1$TMP/ft-ckpt\\2#g" -e "s#(^| )qwen-ft( |$)#\\1$TMP/qwen-ft\\2#g" \
        -e "/configs\\/finetune\\.json/s#\$# --set data.seq_len=64 --set train_micro_batch_size_per_gpu=2#" \
        -e "/--init-from [^ ]*qwen-small/!{/--init-from /{s#--init-from [^ ]*#--init-from $HF#; s#(^| )tokens\\.bin#\\1tokens64.bin#g}}" \
        -e "s#/mnt/nvme([0-9]*)#$TMP/nvme\\1#g" \
        -e "s#(^| )tokens(64)?\\.bin#\\1$TMP/tokens\\2.bin#g" -e "s#(^| )book\\.txt#\\1$TMP/book.txt#g" \
        -e "s#(^| )([A-Za-z0-9_-]+\\.(png|svg|json))( |$)#\\1$TMP/\\2\\4#g" \
        -e "s#(^| )run\\.jsonl#\\1$TMP/run.jsonl#g" \
        -e "s#(^| )ckpt/step-[0-9]+( |$)#\\1$TMP/ckpt/step-00000002\\2#g" \
        -e "s#(^| )ckpt( |$)#\\1$TMP/ckpt\\2#g" -e "s#(^| )hf-out( |$)#\\1$TMP/hf-out$n\\2#g" \
        -e "s#--json (F|FILE)( |$)#--json $TMP/ex$n.json\\2#g" \
        -e "s#--tokenizer (~/)?models/[^ ]*(Llama|llama)[^ ]*#--tokenizer $SRC/tests/fixtures/tokenize/llama3#g" \
        -e "s#--tokenizer (~/)?models/[^ ]*#--tokenizer $SRC/tests/fixtures/tokenize/bytes#g" \
        -e "s#(^| )chats\\.jsonl#\\1$TMP/chats.jsonl#g" -e "s#-o ([A-Za-z0-9_-]+\\.bin)#-o $TMP/\\1#g" \
        -e "s#(--data|--val-data) ([A-Za-z0-9_.-]+\\.bin)#\\1 $TMP/\\2#g" \
        -e 's#--seconds S#--seconds 0.05#g' -e 's#--size [0-9]+[KMGT]#--size 16M#g')
    sub=$(echo "$cmd" | awk '{ print $2 }')
    if [ "$sub" != plan ] && [ "$sub" != bench ] && [ "$sub" != plot ] && [ "$sub" != export ] &&
        [ "$sub" != tokenize ]; then
        if echo "$cmd" | grep -qE -- '--steps [0-9]+'; then
            cmd=$(echo "$cmd" | sed -E 's/--steps [0-9]+/--steps 2/')
        else
            cmd="$cmd --steps 2"
        fi
    fi
    eval "$cmd" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ $rc -eq 0 ] || { [ $rc -eq 77 ] && echo "$ex" | grep -qE 'bench (h2d|allgather)'; } ||
       { [ $rc -eq 1 ] && [ "$sub" = plan ] && [ -s "$TMP/out" ] &&
         [ "$(grep -c 'error' "$TMP/err")" -eq 1 ] && grep -q 'no placement fits' "$TMP/err"; } ||
       { [ $rc -eq 1 ] && ! command -v gnuplot >/dev/null &&
         grep -q 'gnuplot is not installed' "$TMP/err"; }; then
        ok "$where: $ex"
    else
        bad "$where: $ex" "ran: $cmd" "exit status $rc: $(tail -c 600 "$TMP/err")"
    fi
done <<<"$examples"

echo "examples of ${files[*]}: $pass passed, $fail failed"
[ $fail -eq 0 ]
