#!/usr/bin/env bash
# tokenize_speed.sh — fsoff's tokenizer beside tiktoken, on the same text, one
# core each: MB/s of UTF-8 input per core, side by side, and their ratio.
#
#   bench/tokenize_speed.sh [--tokenizer DIR] [--text FILE] [--seconds S] [--build DIR]
#
# --tokenizer  a Hugging Face tokenizer folder (tokenizer.json); default
#              $FSO_LLAMA3_TOKENIZER when set, else the GPT-2 tokenizer of the
#              test fixtures (decompressed by the build)
# --text       UTF-8 text; default: this repository's Markdown and the
#              system's licence texts, repeated to 4 MB (English prose)
# --build      the meson build folder (default: build)
# The peer is node with npm's tiktoken (its Rust core as WASM) in
# $FSO_NPM_DIR (default ~/.cache/fsoff/npm); without it only fsoff runs and
# the script says how to install it. The token counts of both must agree
# (the correctness column).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
tok="${FSO_LLAMA3_TOKENIZER:-}"
text=""
seconds=3
build="$repo/build"
while [ $# -gt 0 ]; do
    case "$1" in
        --tokenizer) tok="$2"; shift 2 ;;
        --text) text="$2"; shift 2 ;;
        --seconds) seconds="$2"; shift 2 ;;
        --build) build="$2"; shift 2 ;;
        *) echo "tokenize_speed.sh: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
    esac
done
bin="$build/bench/tokenize_speed"
if [ ! -x "$bin" ]; then
    echo "tokenize_speed.sh: $bin is missing; build it first: meson compile -C $build bench/tokenize_speed" >&2
    exit 1
fi
work=$(mktemp -d /tmp/fso_tokenize_speed.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [ -z "$tok" ]; then
    gpt2="$build/tests/tokenizer_gpt2.json"
    if [ ! -f "$gpt2" ]; then
        echo "tokenize_speed.sh: no --tokenizer and no $gpt2; build it (meson compile -C $build tests/tokenizer_gpt2.json) or pass --tokenizer DIR" >&2
        exit 1
    fi
    mkdir "$work/gpt2"
    ln -s "$gpt2" "$work/gpt2/tokenizer.json"
    tok="$work/gpt2"
fi
if [ -z "$text" ]; then
    text="$work/text.txt"
    cat "$repo"/*.md "$repo"/docs/*.md /usr/share/common-licenses/* 2>/dev/null > "$work/one.txt"
    while [ "$(stat -c %s "$text" 2>/dev/null || echo 0)" -lt 4000000 ]; do cat "$work/one.txt" >> "$text"; done
fi

ours=$("$bin" --tokenizer "$tok" --text "$text" --seconds "$seconds" --json)
field() { sed -n "s/.*\"$1\": *\"\{0,1\}\([^,\"}]*\).*/\1/p" <<<"$2"; }
our_mbps=$(field mb_per_s "$ours")
our_tokens=$(field tokens "$ours")
bytes=$(field bytes "$ours")

npm_dir="${FSO_NPM_DIR:-$HOME/.cache/fsoff/npm}"
peer=""
if ! command -v node >/dev/null; then
    why="node is not installed (Debian: apt-get install nodejs npm)"
elif [ ! -d "$npm_dir/node_modules/tiktoken" ]; then
    why="tiktoken is not installed in $npm_dir; install it with: mkdir -p $npm_dir && cd $npm_dir && npm init -y && npm install tiktoken"
else
    peer=$(cd "$npm_dir" && node "$here/tokenize_peer.mjs" "$tok" "$text" "$seconds")
    if grep -q '"error"' <<<"$peer"; then
        why=$(field error "$peer")
        peer=""
    fi
fi

printf '# tokenize_speed: %s, %s bytes of text, one core each\n' "$tok" "$bytes"
printf '# %-10s %12s %10s %8s\n' "tokenizer" "tokens" "MB/s" "ratio"
printf '# %-10s %12s %10s %8s\n' "" "(count)" "(1e6 B/s)" "(x peer)"
if [ -n "$peer" ]; then
    peer_mbps=$(sed -n 's/.*"mb_per_s":\([0-9.]*\).*/\1/p' <<<"$peer")
    peer_tokens=$(sed -n 's/.*"tokens":\([0-9]*\).*/\1/p' <<<"$peer")
    ratio=$(awk -v a="$our_mbps" -v b="$peer_mbps" 'BEGIN { printf "%.2f", a / b }')
    printf '  %-10s %12s %10.2f %8s\n' "fsoff" "$our_tokens" "$our_mbps" "$ratio"
    printf '  %-10s %12s %10.2f %8s\n' "tiktoken" "$peer_tokens" "$peer_mbps" "1.00"
    if [ "$our_tokens" = "$peer_tokens" ]; then ok=OK; else ok="FAILED (token counts differ)"; fi
    printf '# fsoff %.2f MB/s per core, tiktoken (WASM) %.2f: %sx; %s\n' "$our_mbps" "$peer_mbps" "$ratio" "$ok"
    [ "$ok" = OK ]
else
    printf '  %-10s %12s %10.2f %8s\n' "fsoff" "$our_tokens" "$our_mbps" "-"
    printf '# no peer: %s\n' "$why"
fi
