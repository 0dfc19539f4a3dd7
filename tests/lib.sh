# lib.sh — sourced by the shell tests (cli_test.sh, checkpoint_cli_test.sh, tokenize_test.sh,
# readme_*.sh): the source folder, a temporary folder removed on exit,
# pass/fail counts, and llm.c token files without Python.
SRC=${FSO_SRCDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# doc_files [FILE.md...]: the documentation the readme tests read, as paths
# from the source folder in `files`: the ones given, else README.md and
# every docs/*.md page.
doc_files() {
    local f
    files=()
    if [ $# -gt 0 ]; then
        for f in "$@"; do files+=("$(realpath --relative-to="$SRC" "$f")"); done
    else
        files=(README.md)
        for f in "$SRC"/docs/*.md; do [ -e "$f" ] && files+=("docs/${f##*/}"); done
    fi
}
pass=0
fail=0

ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; shift; for l in "$@"; do echo "     $l"; done; }

# fails_saying NAME 'substring'... -- COMMAND...: COMMAND must fail without
# crashing (exit 1 to 127), its stderr ($TMP/err; stdout in $TMP/out) hold
# every substring and exactly one error line. 0, or 1 after a FAIL line;
# the caller says ok (it may check more first).
fails_saying() {
    local name=$1; shift
    local pats=() p
    while [ "$1" != "--" ]; do pats+=("$1"); shift; done
    shift
    "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then
        bad "$name" "exit status $rc (want 1 or 2)" "$(head -c 400 "$TMP/err")"
        return 1
    fi
    for p in "${pats[@]}"; do
        if ! grep -qF -- "$p" "$TMP/err"; then
            bad "$name" "stderr lacks: $p" "stderr: $(head -c 600 "$TMP/err")"
            return 1
        fi
    done
    if [ "$(grep -c 'error' "$TMP/err")" -ne 1 ]; then
        bad "$name" "want exactly one error line" "$(cat "$TMP/err")"
        return 1
    fi
    return 0
}

# write_tokens N MUL MOD: a version 1 file (uint16 tokens) of N tokens,
# token i being (i * MUL + 3) % MOD, on stdout.
write_tokens() {
    local n=$1 mul=$2 mod=$3 i t
    printf '\x88\xd8\x34\x01\x01\x00\x00\x00'
    printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((n & 255)) $(((n >> 8) & 255)) \
        $(((n >> 16) & 255)) $(((n >> 24) & 255)))"
    head -c $((1024 - 12)) /dev/zero
    for ((i = 0; i < n; i++)); do
        t=$(((i * mul + 3) % mod))
        printf "$(printf '\\x%02x\\x%02x' $((t & 255)) $((t >> 8)))"
    done
}
