#!/usr/bin/env bash
# readme_samples.sh FSOFF [--write] — the sample output in README.md, made by
# running fsoff.
#
# README.md marks each sample: a line <!-- sample: NAME ... -->, the sample's
# ``` block, and <!-- end sample -->. This script runs what each sample shows
# (the default job's plan, a step and the summary; the errors of three bad
# inputs) and, with --write, puts the output there. Without it, it checks
# that the README's samples are what fsoff prints now: every word and number
# the same, except timings (ms, tok/s, GFLOP/s, seconds, the critical path's
# shares), which are masked, and the peak RSS, which must be within a factor
# of 1.5. A sample that drifted fails, with the fix: run this
# script with --write and commit README.md.
set -u
FSOFF=$(realpath "${1:?usage: readme_samples.sh path/to/fsoff [--write]}")
MODE=${2:-check}
. "$(dirname "$0")/lib.sh"
README=$SRC/README.md

# --- the samples, each into $TMP/NAME
cd "$TMP" || exit 1
# A probe cache of its own, filled first: a run that probes holds the probes'
# buffers too, and the sample is of a run that finds the cache.
export XDG_CACHE_HOME=$TMP/cache
"$FSOFF" plan >/dev/null 2>&1
# The default job (README, Quick start): its plan, step 40 and the summary.
if ! "$FSOFF" >"$TMP/job.out" 2>"$TMP/job.err"; then
    echo "FAIL the default job: $(tail -c 600 "$TMP/job.err")"
    exit 1
fi
grep -E '^plan: (placement|predicted)' "$TMP/job.out" >"$TMP/output"
grep -E '^step +40/' "$TMP/job.out" >>"$TMP/output"
grep -E '^fsoff: done:' "$TMP/job.out" >>"$TMP/output"

# Three bad inputs: an unknown key in a file, a bad --set, a truncated token file.
printf '{\n  "train": {\n    "stepz": 5\n  }\n}\n' >job.json
mkdir -p data
write_tokens 600 1 200 | head -c $((1024 + 1000)) >data/x.bin
: >"$TMP/errors"
for args in "--config job.json" "--set model.num_attention_heads=5" "--data data/x.bin"; do
    # shellcheck disable=SC2086
    "$FSOFF" $args >/dev/null 2>"$TMP/e"
    grep '^fsoff: error: ' "$TMP/e" >>"$TMP/errors"
done

# --- README: write, or check
block() { # NAME FILE: the sample's block in FILE (without the fences)
    awk -v name="$1" '
        $0 ~ "^<!-- sample: " name "[ ;]" { f = 1; next }
        f && /^<!-- end sample -->/ { f = 0 }
        f && !/^```/ { print }' "$2"
}
mask() { # timings out (the critical path's shares too), runs of spaces squeezed
    sed -E -e 's/[0-9][0-9.]* (ms\/step|ms|tok\/s|GFLOP\/s|s |exposed)/# \1/g' \
           -e 's/\(critical path: [^)]*\)/(critical path: #)/' \
           -e 's/peak RSS [0-9.]+ MiB/peak RSS # MiB/' -e 's/ +/ /g'
}
rss() { grep -o 'peak RSS [0-9.]*' | awk '{ print $3 }'; }

names="output errors"
if [ "$MODE" = --write ]; then
    cp "$README" "$TMP/readme"
    for name in $names; do
        [ -n "$(block "$name" "$TMP/readme")" ] || grep -q "^<!-- sample: $name" "$TMP/readme" ||
            { echo "README.md has no sample named $name"; exit 1; }
        awk -v name="$name" -v file="$TMP/$name" '
            $0 ~ "^<!-- sample: " name "[ ;]" { print; print "```"; while ((getline l < file) > 0) print l
                                               print "```"; skip = 1; next }
            skip && /^<!-- end sample -->/ { skip = 0 }
            !skip { print }' "$TMP/readme" >"$TMP/readme.new" && mv "$TMP/readme.new" "$TMP/readme"
    done
    cp "$TMP/readme" "$README"
    echo "README.md: samples written ($names)"
    exit 0
fi

for name in $names; do
    block "$name" "$README" >"$TMP/$name.readme"
    if ! diff <(mask <"$TMP/$name.readme") <(mask <"$TMP/$name") >"$TMP/diff"; then
        bad "README sample '$name' is not what fsoff prints now (timings masked):" \
            "$(cat "$TMP/diff")"
        continue
    fi
    a=$(rss <"$TMP/$name.readme")
    b=$(rss <"$TMP/$name")
    if [ -n "$a$b" ] && ! awk -v a="$a" -v b="$b" 'BEGIN { exit !(a > 0 && b > 0 && b < 1.5 * a && a < 1.5 * b) }'; then
        bad "README sample '$name': peak RSS $a MiB in the README, $b MiB now"
        continue
    fi
    ok "README sample '$name'"
done
[ $fail -eq 0 ] || echo "     to update: tests/readme_samples.sh build/fsoff --write, then commit README.md"
[ $fail -eq 0 ]
