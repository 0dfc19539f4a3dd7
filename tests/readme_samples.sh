#!/usr/bin/env bash
# readme_samples.sh FSOFF [--write] [FILE.md...] — the sample output in the
# documentation, made by running fsoff: in README.md and every page of docs/,
# or in the files given.
#
# A file marks each sample: a line <!-- sample: NAME ... -->, the sample's
# ``` block, and <!-- end sample -->. This script runs what each sample shows
# (the default job's plan, a step and the summary; the errors of three bad
# inputs), once, and with --write puts the output into every file that marks
# the sample. Without it, it checks that each file's samples are what fsoff
# prints now: every word and number
# the same, except timings (ms, tok/s, GFLOP/s, seconds, the step line's elapsed
# time and ETA, the critical path's
# shares), which are masked; the peak RSS, which must be within a factor
# of 1.5; and the losses and gradient norms, which must agree within the
# tolerances below. A sample that drifted fails, naming its file, with the
# fix: run this script with --write and commit the file. A sample name this
# script does not make fails, and so does a sample no file shows.
#
# Why the losses have tolerances. fsoff's bits do not depend on threads or
# FSO_ISA, but they do on the CPU: OpenBLAS picks its kernels for the CPU it
# runs on (AVX2 or AVX-512, with or without FMA), and a last bit that
# differs in one matmul grows over the steps, as training amplifies any
# perturbation. Measured on the default job, one host, OpenBLAS's Haswell
# kernels against its Sandybridge ones (OPENBLAS_CORETYPE): the loss differs
# by 2e-9 (relative) at step 1, 6e-7 at step 40, 4e-5 at step 75, 2e-3 at
# step 150 and at most 1.5% on any step after that, where the trajectories
# scatter as far as batch-to-batch noise lets them; at step 300, 0.5276
# against 0.5286. Samples of this job from three hosts agree at step 40 to
# the printed digits (loss 2.1831; norm 1.0522 or 1.0523, a rounding of the
# last digit) and end at 0.5222, 0.5227 and 0.5284: 1.2% apart. So:
#   - step 1 and step 40 (the first loss, the step line's loss and norm):
#     one unit of the printed last digit (1e-4: the rounding) plus 2e-4 of
#     the value, 300 times the divergence measured at step 40;
#   - the final loss: 2.5% of the value, twice the spread across hosts.
# What a real change does, measured: 3% less lr moves step 40's loss by
# 0.8% and its norm by 89%; weight decay 0.09 instead of 0.1 moves step
# 40's loss by 1.4e-3 (2.6 times its tolerance) and its norm by 3%; either
# fails here, as does a file whose sample is another job's.
TOL_ABS=1e-4
TOL_EARLY=2e-4
TOL_FINAL=0.025
set -u
FSOFF=$(realpath "${1:?usage: readme_samples.sh path/to/fsoff [--write] [FILE.md...]}")
shift
MODE=check
if [ "${1:-}" = --write ]; then
    MODE=--write
    shift
fi
. "$(dirname "$0")/lib.sh"

doc_files "$@" # the files, as paths from the source folder
for f in "${files[@]}"; do
    [ -r "$SRC/$f" ] || { echo "FAIL $f: cannot read it"; exit 1; }
done

# The samples this script makes; every sample a file marks must be one of
# them, and (over the whole documentation) each must be in some file.
# marked FILE: the names of the samples FILE marks, one a line
marked() { sed -n -E 's/^<!-- sample: ([A-Za-z0-9_-]+)[ ;].*$/\1/p' "$1"; }
names="output errors"
shown=""
for f in "${files[@]}"; do
    for name in $(marked "$SRC/$f"); do
        case " $names " in
        *" $name "*) shown="$shown $name" ;;
        *) bad "$f: sample '$name': not one this script makes ($names)" ;;
        esac
    done
done
for name in $names; do # (the whole documentation: every sample has its place)
    case " $shown " in
    *" $name "*) ;;
    *) [ $# -gt 0 ] || bad "sample '$name': no file marks it (${files[*]})" ;;
    esac
done
[ $fail -eq 0 ] || exit 1

# --- the samples, each into $TMP/NAME
cd "$TMP" || exit 1
# A probe cache of its own, filled first: a run that probes holds the probes'
# buffers too, and the sample is of a run that finds the cache.
export XDG_CACHE_HOME=$TMP/cache
"$FSOFF" plan >/dev/null 2>&1
# The default job (README.md, Quick start): its plan, step 40 and the summary.
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

# --- the files: write, or check
block() { # NAME FILE: the sample's block in FILE (without the fences)
    awk -v name="$1" '
        $0 ~ "^<!-- sample: " name "[ ;]" { f = 1; next }
        f && /^<!-- end sample -->/ { f = 0 }
        f && !/^```/ { print }' "$2"
}
mask() { # timings out (the critical path's shares too), losses and norms (compared
         # by losses() below), runs of spaces squeezed
    sed -E -e 's/[0-9][0-9.]* (ms\/step|ms|tok\/s|GFLOP\/s|s |exposed)/# \1/g' \
           -e 's/[0-9]+(h[0-9]{2}m|m[0-9]{2}s)( |$)/# s\2/g' \
           -e 's/\(critical path: [^)]*\)/(critical path: #)/' \
           -e 's/peak RSS [0-9.]+ MiB/peak RSS # MiB/' \
           -e 's/(loss|norm) +[0-9][0-9.]*/\1 #/g' -e 's/-> [0-9][0-9.]*/-> #/g' -e 's/ +/ /g'
}
rss() { grep -o 'peak RSS [0-9.]*' | awk '{ print $3 }'; }
# losses: "WHAT VALUE" per line for each loss and norm, in order; WHAT is
# "final" for the summary's last loss (-> X), else "early"
losses() {
    grep -oE '(loss|norm) +[0-9][0-9.]*|-> [0-9][0-9.]*' |
        awk '{ print ($1 == "->" ? "final" : "early"), $2 }'
}
# within A B: the file's losses (A) against now's (B), pair by pair; the
# pairs outside their tolerance on stdout
within() {
    paste -d ' ' "$1" "$2" | awk -v abs="$TOL_ABS" -v early="$TOL_EARLY" -v final="$TOL_FINAL" '
        { d = $2 - $4; if (d < 0) d = -d
          m = $2 > $4 ? $2 : $4
          tol = $1 == "final" ? final * m : abs + early * m
          if ($1 != $3 || d > tol)
              printf "%s loss or norm: %s in the file, %s now (tolerance %.3g)\n", $1, $2, $4, tol }'
}

if [ "$MODE" = --write ]; then
    for f in "${files[@]}"; do
        here=$(marked "$SRC/$f")
        [ -n "$here" ] || continue
        cp "$SRC/$f" "$TMP/doc"
        for name in $here; do
            awk -v name="$name" -v file="$TMP/$name" '
                $0 ~ "^<!-- sample: " name "[ ;]" { print; print "```"; while ((getline l < file) > 0) print l
                                                   print "```"; skip = 1; next }
                skip && /^<!-- end sample -->/ { skip = 0 }
                !skip { print }' "$TMP/doc" >"$TMP/doc.new" && mv "$TMP/doc.new" "$TMP/doc"
        done
        cp "$TMP/doc" "$SRC/$f"
        echo "$f: samples written ($(echo $here))"
    done
    exit 0
fi

for f in "${files[@]}"; do
    for name in $(marked "$SRC/$f"); do
        block "$name" "$SRC/$f" >"$TMP/$name.doc"
        if ! diff <(mask <"$TMP/$name.doc") <(mask <"$TMP/$name") >"$TMP/diff"; then
            bad "$f: sample '$name' is not what fsoff prints now (timings masked):" \
                "$(cat "$TMP/diff")"
            continue
        fi
        losses <"$TMP/$name.doc" >"$TMP/$name.doc.losses"
        losses <"$TMP/$name" >"$TMP/$name.losses"
        off=$(within "$TMP/$name.doc.losses" "$TMP/$name.losses")
        if [ -n "$off" ] || [ "$(wc -l <"$TMP/$name.doc.losses")" -ne "$(wc -l <"$TMP/$name.losses")" ]; then
            bad "$f: sample '$name': losses beyond the tolerances for another CPU" "$off"
            continue
        fi
        a=$(rss <"$TMP/$name.doc")
        b=$(rss <"$TMP/$name")
        if [ -n "$a$b" ] && ! awk -v a="$a" -v b="$b" 'BEGIN { exit !(a > 0 && b > 0 && b < 1.5 * a && a < 1.5 * b) }'; then
            bad "$f: sample '$name': peak RSS $a MiB in the file, $b MiB now"
            continue
        fi
        ok "$f: sample '$name'"
    done
done
[ $fail -eq 0 ] || echo "     to update: tests/readme_samples.sh build/fsoff --write, then commit the files"
[ $fail -eq 0 ]
