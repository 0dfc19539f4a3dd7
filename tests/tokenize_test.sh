#!/usr/bin/env bash
# tokenize_test.sh FSOFF — `fsoff tokenize` as a user meets it, with the
# small byte-level tokenizers of tests/fixtures/tokenize (a text's ids are
# its UTF-8 bytes, special tokens from 256; gen_fake_tokenizers.py): token
# files' headers, ids and flags against what the formats and the chat
# templates say; the validation split; one output for every thread count;
# and every bad input refused with one error line naming the place, and no
# output file left behind.
set -u
FSOFF=${1:?usage: tokenize_test.sh path/to/fsoff}
. "$(dirname "$0")/lib.sh"
FIX=$SRC/tests/fixtures/tokenize
OUT=$TMP/outputs
mkdir -p "$OUT"

# header FILE: the first five header ints
header() { od -An -td4 -N20 -v "$1" | tr -s ' \n' '  ' | sed 's/^ //;s/ $//'; }
# elem FILE: bytes per token
elem() {
    local h
    read -ra h <<<"$(header "$1")"
    case ${h[0]} in 20240520) echo 2 ;; 20240801) echo 4 ;; *) echo "${h[4]}" ;; esac
}
# ids FILE / flags FILE: one line, space-separated
ids() {
    local h e
    read -ra h <<<"$(header "$1")"
    e=$(elem "$1")
    od -An -tu"$e" -j1024 -N$((h[2] * e)) -v "$1" | tr -s ' \n' '  ' | sed 's/^ //;s/ $//'
}
flags() {
    local h e
    read -ra h <<<"$(header "$1")"
    e=$(elem "$1")
    od -An -tu1 -j$((1024 + h[2] * e)) -v "$1" | tr -s ' \n' '  ' | sed 's/^ //;s/ $//'
}

# the expected ids and flags, built piece by piece: sp ID [FLAG], tx TEXT [FLAG]
want_ids=()
want_flags=()
reset_want() { want_ids=(); want_flags=(); }
sp() { want_ids+=("$1"); want_flags+=("${2:-0}"); }
tx() {
    local b
    for b in $(printf '%s' "$1" | od -An -tu1 -v); do
        want_ids+=("$b")
        want_flags+=("${2:-0}")
    done
}
# doc_start: the last document's first token: DOC_START, never a target
doc_start() { want_flags[$1]=2; }

check_eq() {
    local name=$1 got=$2 want=$3
    if [ "$got" = "$want" ]; then ok "$name"; else bad "$name" "got:  $got" "want: $want"; fi
}

run_ok() {
    local name=$1; shift
    "$FSOFF" tokenize "$@" >"$TMP/stdout" 2>"$TMP/stderr"
    local rc=$?
    if [ $rc -ne 0 ]; then
        bad "$name" "exit status $rc" "$(cat "$TMP/stderr")"
        return 1
    fi
    return 0
}

# --- text: documents separated by two blank lines, the delimiter prepended
printf 'Hello world.\n\n\nSecond doc.\nsame doc\n\nstill\n' >"$TMP/a.txt"
if run_ok "text" -t "$FIX/bytes" "$TMP/a.txt" -o "$OUT/a.bin"; then
    check_eq "text: header (llm.c v1, <|endoftext|> + 1 in header[3])" "$(header "$OUT/a.bin")" \
        "20240520 1 43 257 0"
    reset_want; sp 256; tx $'Hello world.\n'; sp 256; tx $'Second doc.\nsame doc\n\nstill\n'
    check_eq "text: ids" "$(ids "$OUT/a.bin")" "${want_ids[*]}"
    grep -q "2 documents, 43 tokens" "$TMP/stdout" && grep -q "as text (by its extension .txt)" \
        "$TMP/stdout" && grep -q "vocabulary 257" "$TMP/stdout" && ok "text: summary" ||
        bad "text: summary" "$(cat "$TMP/stdout")"
fi

# --- jsonl: each "text" a document; a tokenizer that adds BOS starts each with it
printf '{"text": "A\\u00e9"}\n\n{"text": "<|eot_id|>"}\n' >"$TMP/b.jsonl"
if run_ok "jsonl" -t "$FIX/llama3" "$TMP/b.jsonl" -o "$OUT/b.bin"; then
    check_eq "jsonl: header (BOS as the delimiter)" "$(header "$OUT/b.bin")" "20240520 1 15 257 0"
    # special-token text in the data is plain text
    reset_want; sp 256; tx 'Aé'; sp 256; tx '<|eot_id|>'
    check_eq "jsonl: ids (special-token text stays text)" "$(ids "$OUT/b.bin")" "${want_ids[*]}"
    grep -q 'as jsonl (by its extension .jsonl and the "text" key of line 1)' "$TMP/stdout" &&
        ok "jsonl: summary names the format" || bad "jsonl: summary" "$(cat "$TMP/stdout")"
fi

# --- a real tokenizer: GPT-2 (tests/fixtures/tokenizer), its golden vectors as a JSONL input
# (each line's "text" a document; the other keys are ignored): every document is
# <|endoftext|> (50256) then the ids tiktoken gave for the text
GPT2=$SRC/tests/fixtures/tokenizer/gpt2
mkdir -p "$TMP/gpt2"
gzip -dc "$GPT2/tokenizer.json.gz" >"$TMP/gpt2/tokenizer.json"
cp "$GPT2/tokenizer_config.json" "$TMP/gpt2/"
tail -n +2 "$SRC/tests/fixtures/tokenizer/gpt2.jsonl" >"$TMP/vec.jsonl"
if run_ok "GPT-2" -t "$TMP/gpt2" --threads 2 "$TMP/vec.jsonl" -o "$OUT/g.bin"; then
    want=$(grep -o '"ids":\[[^]]*\]' "$TMP/vec.jsonl" | sed 's/"ids":\[//; s/\]//; s/,/ /g' |
        while read -r l; do echo "50256 $l"; done | tr -s ' \n' '  ' | sed 's/ $//')
    check_eq "GPT-2: the golden vectors' ids, each after <|endoftext|>" "$(ids "$OUT/g.bin")" "$want"
    n=$(wc -l <"$TMP/vec.jsonl")
    check_eq "GPT-2: header (v1, 50256 + 1 in header[3])" "$(header "$OUT/g.bin" | cut -d' ' -f1,2,4,5)" \
        "20240520 1 50257 0"
    grep -q "wrote $OUT/g.bin: $n documents" "$TMP/stdout" && grep -q "vocabulary 50257" "$TMP/stdout" &&
        ok "GPT-2: summary" || bad "GPT-2: summary" "$(cat "$TMP/stdout")"
fi

# --- a real tokenizer with merges: Qwen2.5's vocabulary (the Qwen3 tokenizer.json of
# tests/fixtures/tokenizer) and Qwen2.5's tokenizer_config.json (the chatml fixture's):
# ids and loss mask of the ChatML conversations in qwen_chat.txt, made by a reference
# implementation (gen_chat_expected.mjs), spans straddling the prompt and the answer included
mkdir -p "$TMP/qwen"
gzip -dc "$SRC/tests/fixtures/tokenizer/qwen3/tokenizer.json.gz" >"$TMP/qwen/tokenizer.json"
cp "$FIX/chatml/tokenizer_config.json" "$TMP/qwen/"
sed -n '1~3p' "$FIX/qwen_chat.txt" >"$TMP/q.jsonl"
if run_ok "Qwen chat" -t "$TMP/qwen" "$TMP/q.jsonl" -o "$OUT/q.bin"; then
    check_eq "Qwen chat: the reference's ids" "$(ids "$OUT/q.bin")" \
        "$(sed -n '2~3p' "$FIX/qwen_chat.txt" | tr '\n' ' ' | sed 's/ $//')"
    check_eq "Qwen chat: the reference's loss mask" "$(flags "$OUT/q.bin")" \
        "$(sed -n '3~3p' "$FIX/qwen_chat.txt" | tr '\n' ' ' | sed 's/ $//')"
    check_eq "Qwen chat: header (flagged, 4-byte tokens)" "$(header "$OUT/q.bin" | cut -d' ' -f1,2,4,5)" \
        "20261202 1 0 4"
fi

# --- chat: each template's exact text, its trained tokens flagged
CONV='{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "More"}, {"role": "assistant", "content": "Ok"}]}'
printf '%s\n%s\n' "$CONV" '{"prompt": "Q:", "completion": " A"}' >"$TMP/c.jsonl"

if run_ok "chat llama3" -t "$FIX/llama3" "$TMP/c.jsonl" -o "$OUT/l3.bin"; then
    # 256 <|begin_of_text|> 257 <|end_of_text|> 258 <|start_header_id|> 259 <|end_header_id|> 260 <|eot_id|>
    reset_want
    sp 256; sp 258; tx system; sp 259
    tx $'\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.'; sp 260
    sp 258; tx user; sp 259; tx $'\n\nHi'; sp 260
    sp 258; tx assistant; sp 259; tx $'\n\n'; tx 'Hello!' 1; sp 260 1
    sp 258; tx user; sp 259; tx $'\n\nMore'; sp 260
    sp 258; tx assistant; sp 259; tx $'\n\n'; tx 'Ok' 1; sp 260 1
    doc_start 0
    n1=${#want_ids[@]}
    # a prompt-completion pair: BOS, prompt, completion and EOS (<|eot_id|>) trained
    sp 256; tx 'Q:'; tx ' A' 1; sp 260 1
    doc_start "$n1"
    check_eq "chat llama3: header (flagged, 2-byte, no delimiter)" "$(header "$OUT/l3.bin")" \
        "20261202 1 ${#want_ids[@]} 0 2"
    check_eq "chat llama3: ids (3.1's dated system block)" "$(ids "$OUT/l3.bin")" "${want_ids[*]}"
    check_eq "chat llama3: flags" "$(flags "$OUT/l3.bin")" "${want_flags[*]}"
    grep -q "llama3 template from tokenizer_config.json's chat_template, dated" "$TMP/stdout" &&
        grep -q "of its tokens are trained on" "$TMP/stdout" && ok "chat llama3: summary" ||
        bad "chat llama3: summary" "$(cat "$TMP/stdout")"
fi

if run_ok "chat chatml" -t "$FIX/chatml" "$TMP/c.jsonl" -o "$OUT/cm.bin"; then
    # 256 <|endoftext|> 257 <|im_start|> 258 <|im_end|>; no BOS; EOS <|im_end|>
    reset_want
    sp 257; tx $'system\nBe brief.'; sp 258; tx $'\n'
    sp 257; tx $'user\n Hi '; sp 258; tx $'\n'
    sp 257; tx $'assistant\n'; tx 'Hello!' 1; sp 258 1; tx $'\n'
    sp 257; tx $'user\nMore'; sp 258; tx $'\n'
    sp 257; tx $'assistant\n'; tx 'Ok' 1; sp 258 1; tx $'\n'
    doc_start 0
    n1=${#want_ids[@]}
    tx 'Q:'; tx ' A' 1; sp 258 1
    doc_start "$n1"
    check_eq "chat chatml: ids" "$(ids "$OUT/cm.bin")" "${want_ids[*]}"
    check_eq "chat chatml: flags" "$(flags "$OUT/cm.bin")" "${want_flags[*]}"
fi
# the default system message when a conversation has none
printf '%s\n' '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}' \
    >"$TMP/d.jsonl"
if run_ok "chat chatml default system" -t "$FIX/chatml" "$TMP/d.jsonl" -o "$OUT/cd.bin"; then
    reset_want
    sp 257; tx $'system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.'
    sp 258; tx $'\n'; sp 257; tx $'user\nq'; sp 258; tx $'\n'
    sp 257; tx $'assistant\n'; tx a 1; sp 258 1; tx $'\n'
    doc_start 0
    check_eq "chat chatml: the default system message" "$(ids "$OUT/cd.bin") / $(flags "$OUT/cd.bin")" \
        "${want_ids[*]} / ${want_flags[*]}"
fi

if run_ok "chat inst" -t "$FIX/inst" "$TMP/c.jsonl" -o "$OUT/in.bin"; then
    # 256 <s> 257 </s>
    reset_want
    sp 256; tx $'[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST]'; tx ' Hello! ' 1; sp 257 1
    sp 256; tx '[INST] More [/INST]'; tx ' Ok ' 1; sp 257 1
    doc_start 0
    n1=${#want_ids[@]}
    sp 256; tx 'Q:'; tx ' A' 1; sp 257 1
    doc_start "$n1"
    check_eq "chat inst: ids (system folded into the first user message)" "$(ids "$OUT/in.bin")" \
        "${want_ids[*]}"
    check_eq "chat inst: flags" "$(flags "$OUT/in.bin")" "${want_flags[*]}"
fi

# --- validation split: one document in every 1/F, in input order
: >"$TMP/v.jsonl"
for i in 0 1 2 3 4 5 6 7 8 9; do printf '{"text": "d%d"}\n' "$i" >>"$TMP/v.jsonl"; done
if run_ok "val split" -t "$FIX/bytes" --val-fraction 0.3 "$TMP/v.jsonl" -o "$OUT/v.bin"; then
    reset_want; for i in 0 1 2 4 5 7 8; do sp 256; tx "d$i"; done
    check_eq "val split: training documents" "$(ids "$OUT/v.bin")" "${want_ids[*]}"
    reset_want; for i in 3 6 9; do sp 256; tx "d$i"; done
    check_eq "val split: held-out documents 3, 6, 9" "$(ids "$OUT/v.val.bin")" "${want_ids[*]}"
    grep -q "wrote $OUT/v.bin: 7 documents" "$TMP/stdout" &&
        grep -q "wrote $OUT/v.val.bin: 3 documents" "$TMP/stdout" && ok "val split: both counts" ||
        bad "val split: both counts" "$(cat "$TMP/stdout")"
fi

# --- threads: several batches (about 1 MB each), one output whatever the count
seq 1 150000 | awk '{ print "document " $1 " of the big input"; if ($1 % 13 == 0) print "\n" }' \
    >"$TMP/big.txt"
if run_ok "threads 1" -t "$FIX/bytes" --threads 1 "$TMP/big.txt" -o "$OUT/t1.bin" &&
    run_ok "threads 2" -t "$FIX/bytes" --threads 2 "$TMP/big.txt" -o "$OUT/t2.bin" &&
    run_ok "threads 3" -t "$FIX/bytes" --threads 3 "$TMP/big.txt" -o "$OUT/t3.bin"; then
    if cmp -s "$OUT/t1.bin" "$OUT/t2.bin" && cmp -s "$OUT/t1.bin" "$OUT/t3.bin"; then
        ok "threads 1, 2 and 3 write the same file"
    else
        bad "threads 1, 2 and 3 write the same file" "$(cmp "$OUT/t1.bin" "$OUT/t2.bin")"
    fi
    docs=$(grep -o 'wrote [^:]*: [0-9]* documents' "$TMP/stdout" | grep -o '[0-9]* documents')
    check_eq "threads: documents of the big input" "$docs" "11539 documents"
fi

# --- bad input: one error line naming the place, exit 1 or 2, nothing left behind
expect_error() {
    local name=$1; shift
    local pats=()
    while [ "$1" != "--" ]; do pats+=("$1"); shift; done
    shift
    rm -rf "$OUT"; mkdir -p "$OUT"
    fails_saying "$name" "${pats[@]}" -- "$FSOFF" tokenize "$@" || return
    if [ -n "$(ls -A "$OUT")" ]; then
        bad "$name" "files left behind: $(ls -A "$OUT")"
        return
    fi
    ok "$name"
}

printf 'fine\nthen caf\xe9 latin-1\n' >"$TMP/latin1.txt"
expect_error "invalid UTF-8" "$TMP/latin1.txt:2: byte 13: invalid UTF-8 (byte 0xe9)" "iconv" \
    -- -t "$FIX/bytes" "$TMP/latin1.txt" -o "$OUT/x.bin"
# a bad line far into a large input, past the first batches and threads
{ cat "$TMP/big.txt"; printf 'late \xff byte\n'; } >"$TMP/late.txt"
expect_error "invalid UTF-8 late in a large input" \
    "$TMP/late.txt:$(($(wc -l <"$TMP/big.txt") + 1)): byte $(($(stat -c %s "$TMP/big.txt") + 5)): invalid UTF-8" \
    -- -t "$FIX/bytes" --threads 2 "$TMP/late.txt" -o "$OUT/x.bin"
printf '{"text": "a"}\n[1, 2]\n' >"$TMP/arr.jsonl"
expect_error "JSONL line not an object" "$TMP/arr.jsonl:2: byte 14: the line is an array" \
    -- -t "$FIX/bytes" "$TMP/arr.jsonl" -o "$OUT/x.bin"
printf '{"text": "a"}\n{"txt": "b"}\n' >"$TMP/field.jsonl"
expect_error "missing field" "$TMP/field.jsonl:2: byte 14: no \"text\" key" \
    -- -t "$FIX/bytes" "$TMP/field.jsonl" -o "$OUT/x.bin"
printf '{"text": "a"\n' >"$TMP/broken.jsonl"
expect_error "JSONL line not JSON" "$TMP/broken.jsonl:1:" "not JSON" \
    -- -t "$FIX/bytes" --format jsonl "$TMP/broken.jsonl" -o "$OUT/x.bin"
printf '%s\n' '{"messages": [{"role": "tool", "content": "x"}]}' >"$TMP/role.jsonl"
expect_error "unknown role" "$TMP/role.jsonl:1: byte 0: messages[0].role is \"tool\"" \
    -- -t "$FIX/chatml" "$TMP/role.jsonl" -o "$OUT/x.bin"
# an [INST] template that is not Llama 2's (Mistral's spacing): refused unless --template says
mkdir -p "$TMP/mistral-like"
cp "$FIX/inst/tokenizer.json" "$TMP/mistral-like/"
printf '%s\n' '{"bos_token": "<s>", "eos_token": "</s>", "chat_template": "{{ bos_token }}{% for message in messages %}{% if message['"'"'role'"'"'] == '"'"'user'"'"' %}{{ '"'"'[INST] '"'"' + message['"'"'content'"'"'] + '"'"' [/INST]'"'"' }}{% else %}{{ message['"'"'content'"'"'] + eos_token }}{% endif %}{% endfor %}"}' \
    >"$TMP/mistral-like/tokenizer_config.json"
printf '%s\n' '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}' \
    >"$TMP/one.jsonl"
expect_error "an [INST] template other than Llama 2's" "an [INST] template other than Llama 2's" \
    "give --template inst" -- -t "$TMP/mistral-like" "$TMP/one.jsonl" -o "$OUT/x.bin"
run_ok "an [INST] template other than Llama 2's, with --template inst" -t "$TMP/mistral-like" \
    --template inst "$TMP/one.jsonl" -o "$OUT/ml.bin" &&
    ok "an [INST] template other than Llama 2's, with --template inst"
printf '%s\n' '{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}' \
    >"$TMP/turns.jsonl"
expect_error "inst roles out of turn" "$TMP/turns.jsonl:1: byte 0: messages[1] is a user message" \
    -- -t "$FIX/inst" "$TMP/turns.jsonl" -o "$OUT/x.bin"
expect_error "no chat template" "no chat template fsoff has fits" "--template" \
    -- -t "$FIX/bytes" --format chat "$TMP/d.jsonl" -o "$OUT/x.bin"
printf '\n\n\n\n' >"$TMP/empty.txt"
expect_error "empty input" "$TMP/empty.txt: no documents" \
    -- -t "$FIX/bytes" "$TMP/empty.txt" -o "$OUT/x.bin"
: >"$TMP/empty.jsonl"
expect_error "empty JSONL input" "$TMP/empty.jsonl: empty" \
    -- -t "$FIX/bytes" "$TMP/empty.jsonl" -o "$OUT/x.bin"
expect_error "val fraction holds out nothing" "--val-fraction 0.1 holds out none of the 2 documents" \
    -- -t "$FIX/bytes" --val-fraction 0.1 "$TMP/a.txt" -o "$OUT/x.bin"
mkdir -p "$TMP/notok"
expect_error "tokenizer folder without tokenizer.json" "$TMP/notok" "tokenizer.json" \
    -- -t "$TMP/notok" "$TMP/a.txt" -o "$OUT/x.bin"
mkdir -p "$TMP/badtok"
printf '{"model": {"type": "BPE",, }}\n' >"$TMP/badtok/tokenizer.json"
expect_error "malformed tokenizer.json" "$TMP/badtok/tokenizer.json:1:" \
    -- -t "$TMP/badtok" "$TMP/a.txt" -o "$OUT/x.bin"
expect_error "-o missing" "-o OUT.bin is missing" -- -t "$FIX/bytes" "$TMP/a.txt"
expect_error "--tokenizer missing" "--tokenizer DIR is missing" -- "$TMP/a.txt" -o "$OUT/x.bin"
expect_error "no inputs" "no input files" -- -t "$FIX/bytes" -o "$OUT/x.bin"
expect_error "missing input" "$TMP/nope.txt: cannot open: No such file" \
    -- -t "$FIX/bytes" "$TMP/a.txt" "$TMP/nope.txt" -o "$OUT/x.bin"
expect_error "folder as input" "$TMP/notok: is a folder" \
    -- -t "$FIX/bytes" "$TMP/notok" -o "$OUT/x.bin"
expect_error "output in a missing folder" "$OUT/no/x.bin: cannot create" "create the folder" \
    -- -t "$FIX/bytes" "$TMP/a.txt" -o "$OUT/no/x.bin"
expect_error "--template for text" "--template is for chat data" "as text" \
    -- -t "$FIX/llama3" --template llama3 "$TMP/a.txt" -o "$OUT/x.bin"
expect_error "bad --format" "--format xml: expected text, jsonl or chat" \
    -- -t "$FIX/bytes" --format xml "$TMP/a.txt" -o "$OUT/x.bin"
expect_error "bad --val-fraction" "--val-fraction 1.5" -- -t "$FIX/bytes" --val-fraction 1.5 \
    "$TMP/a.txt" -o "$OUT/x.bin"
expect_error "bad --threads" "--threads 0" -- -t "$FIX/bytes" --threads 0 "$TMP/a.txt" -o "$OUT/x.bin"
expect_error "unknown option" "unknown option '--bogus'" -- --bogus

# an existing output stays as it was when a run fails
rm -rf "$OUT"; mkdir -p "$OUT"
printf 'old' >"$OUT/keep.bin"
"$FSOFF" tokenize -t "$FIX/bytes" "$TMP/latin1.txt" -o "$OUT/keep.bin" >/dev/null 2>&1
check_eq "a failed run leaves the old output as it was" "$(cat "$OUT/keep.bin") $(ls "$OUT")" \
    "old keep.bin"

"$FSOFF" tokenize --help >"$TMP/help" 2>&1 && grep -q "usage: fsoff tokenize" "$TMP/help" &&
    ok "tokenize --help" || bad "tokenize --help" "$(cat "$TMP/help")"
"$FSOFF" --help 2>&1 | grep -q "fsoff tokenize" && ok "fsoff --help lists tokenize" ||
    bad "fsoff --help lists tokenize"

echo "tokenize_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
