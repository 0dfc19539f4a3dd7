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
run_case stalled_box_named timeout
run_case config_text_differs check_bytes
run_case shared_dir_private_refused shared_dir "$TMP/ckpt"
run_case same_build_and_file same
# box 1 runs a copy with one more byte: another build
cp "$TEST_BOXES" "$TMP/test_boxes_other" && printf x >>"$TMP/test_boxes_other"
if timeout 60 mpirun -np 1 "$TEST_BOXES" other_build : -np 1 "$TMP/test_boxes_other" other_build \
        >"$TMP/other.log" 2>&1 && grep -q "^ok other_build\$" "$TMP/other.log"; then
    ok stale_build_named
else
    bad stale_build_named "$(tail -n 15 "$TMP/other.log")"
fi

echo "# $pass passed, $fail failed"
[ "$fail" -eq 0 ]
