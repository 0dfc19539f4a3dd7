#!/usr/bin/env bash
# boxes_test.sh FSOFF TEST_BOXES — several boxes as two processes under
# mpirun on this machine (engine/boxes.h): the rails' collectives and their
# sums, a stalled box named by the box that waits for it, the checks that
# every box runs the same thing, and `fsoff bench net`. Exit 77 (skipped)
# without mpirun or in a build without MPI.
set -u
FSOFF=${1:?usage: boxes_test.sh path/to/fsoff path/to/test_boxes}
TEST_BOXES=${2:?usage: boxes_test.sh path/to/fsoff path/to/test_boxes}
. "$(dirname "$0")/lib.sh"

if [ "${FSO_HAVE_MPI:-1}" != 1 ]; then
    echo "skip: this fsoff was built without MPI (meson setup -Dmpi=enabled)"
    exit 77
fi
if ! command -v mpirun >/dev/null; then
    echo "skip: no mpirun (apt-get install openmpi-bin libopenmpi-dev)"
    exit 77
fi
# two processes on one machine, over TCP on loopback, as root if need be
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,tcp \
    OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo \
    OMPI_MCA_rmaps_base_oversubscribe=1
# Under AddressSanitizer: Open MPI keeps allocations until the process ends
# (its own, not fsoff's), which LeakSanitizer would report at exit.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
mpi2() { timeout 60 mpirun -np 2 "$@"; }

# run_case NAME ARGS...: test_boxes's case under two boxes; its output in $TMP/NAME.log
run_case() {
    local name=$1
    shift
    if mpi2 "$TEST_BOXES" "$@" >"$TMP/$name.log" 2>&1 && grep -q "^ok $1\$" "$TMP/$name.log"; then
        ok "$name"
    else
        bad "$name" "$(tail -n 15 "$TMP/$name.log")"
    fi
}

run_case rails_sum_in_box_order sums
run_case rails_at_once_from_threads threads
run_case stalled_box_named timeout
run_case config_text_differs check_bytes
run_case shared_dir_private_refused shared_dir "$TMP/ckpt"
run_case same_build_and_file same
run_case data_file_differs other_file "$TMP/data"
# box 1 stops the run: mpirun ends every box with a failure, and box 1's line
# is on stderr, well before box 0's 20 s wait would end
start=$(date +%s)
mpi2 "$TEST_BOXES" abort >"$TMP/abort.log" 2>&1
rc=$?
took=$(($(date +%s) - start))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -lt 15 ] &&
   grep -q "box 1: test_boxes stops the run" "$TMP/abort.log"; then
    ok abort_ends_every_box
else
    bad abort_ends_every_box "exit $rc after $took s" "$(tail -n 15 "$TMP/abort.log")"
fi
# box 1 runs a copy with one more byte: another build
cp "$TEST_BOXES" "$TMP/test_boxes_other" && printf x >>"$TMP/test_boxes_other"
if timeout 60 mpirun -np 1 "$TEST_BOXES" other_build : -np 1 "$TMP/test_boxes_other" other_build \
        >"$TMP/other.log" 2>&1 && grep -q "^ok other_build\$" "$TMP/other.log"; then
    ok stale_build_named
else
    bad stale_build_named "$(tail -n 15 "$TMP/other.log")"
fi

# fsoff bench net: one JSON object from box 0, the three collectives with
# busbw > 0 at each size and nothing wrong; the table printed once
if mpi2 "$FSOFF" bench net --sizes 4K,1M --iters 3 --json "$TMP/net.json" >"$TMP/net.out" \
        2>"$TMP/net.err" &&
   python3 - "$TMP/net.json" <<'EOF2'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["bench"] == "net" and r["boxes"] == 2 and len(r["hosts"]) == 2, r
for op in ("all_reduce", "reduce_scatter", "all_gather"):
    rows = r["collectives"][op]
    assert [x["bytes"] for x in rows] == [4096, 1 << 20], (op, rows)
    for x in rows:
        assert x["busbw_gbps"] > 0 and x["algbw_gbps"] > 0 and x["wrong"] == 0, (op, x)
EOF2
then
    ok bench_net_json
else
    bad bench_net_json "$(cat "$TMP/net.err")" "$(head -c 600 "$TMP/net.json" 2>/dev/null)"
fi
if [ "$(grep -c '^# average bus bandwidth' "$TMP/net.out")" = 1 ] &&
   [ "$(grep -c 'reduce_scatter' "$TMP/net.out")" = 2 ] && grep -q 'OK$' "$TMP/net.out"; then
    ok bench_net_table_once
else
    bad bench_net_table_once "$(cat "$TMP/net.out")"
fi
# --json -: the object alone on stdout, from box 0 alone
if mpi2 "$FSOFF" bench net --sizes 8K --iters 2 --json - >"$TMP/net2.out" 2>"$TMP/net2.err" &&
   python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["bench"] == "net"' \
        "$TMP/net2.out" 2>/dev/null; then
    ok bench_net_json_stdout
else
    bad bench_net_json_stdout "$(head -c 600 "$TMP/net2.out")" "$(cat "$TMP/net2.err")"
fi
# --plot: box 0 draws the chart
if command -v gnuplot >/dev/null; then
    if mpi2 "$FSOFF" bench net --sizes 4K,64K --iters 2 --plot "$TMP/net.png" >/dev/null \
            2>"$TMP/net3.err" && [ "$(od -An -tx1 -N4 "$TMP/net.png" | tr -d ' ')" = 89504e47 ]; then
        ok bench_net_plot
    else
        bad bench_net_plot "$(cat "$TMP/net3.err")"
    fi
fi
# one box: how to start it, exit 2 (a usage error, not a crash)
if fails_saying bench_net_one_box "under mpirun or srun" "mpirun -np 2" -- \
        env -u OMPI_COMM_WORLD_SIZE "$FSOFF" bench net; then
    ok bench_net_one_box
fi

# `fsoff plan` under mpirun: the launcher's boxes, the network between them
# measured, the plan printed once (by box 0)
CFG=$SRC/configs/small.json
if mpi2 "$FSOFF" plan --config "$CFG" >"$TMP/plan.out" 2>"$TMP/plan.err" &&
        grep -q '^plan: network between the 2 boxes: .* GB/s per box and direction, measured now' "$TMP/plan.out" &&
        grep -q '^plan: boxes: 2 x 1 device' "$TMP/plan.out" &&
        [ "$(grep -c '^plan: predicted' "$TMP/plan.out")" = 1 ]; then
    ok plan_measures_the_network
else
    bad plan_measures_the_network "$(head -c 600 "$TMP/plan.err")" "$(grep -E 'network|boxes|predicted' "$TMP/plan.out" | head -5)"
fi
# a --boxes that is not the launcher's: every box says so, exit 2
mpi2 "$FSOFF" plan --config "$CFG" --boxes 3 --net-gbps 10 >/dev/null 2>"$TMP/plan3.err"
rc=$?
if [ $rc -ne 0 ] && [ $rc -lt 128 ] &&
        [ "$(grep -c 'error: --boxes 3, but the launcher started 2 processes.*leave --boxes out' "$TMP/plan3.err")" = 2 ]; then
    ok plan_boxes_disagree_with_launcher
else
    bad plan_boxes_disagree_with_launcher "exit $rc" "$(head -c 600 "$TMP/plan3.err")"
fi

echo "# $pass passed, $fail failed"
[ "$fail" -eq 0 ]
