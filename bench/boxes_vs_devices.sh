#!/usr/bin/env bash
# bench/boxes_vs_devices.sh [STEPS] [ROUNDS] — what crossing boxes costs, side by
# side on one machine: configs/small.json on two boxes of one CPU device
# (`mpirun -np 2`, over loopback TCP) against one box of two devices, the
# same global batch, the same threads in all; and the optimizer's time per
# box on two boxes against one box of one device (each box updates half),
# with the update serialized after the backward. Two boxes on one machine
# share its memory bus, where two real boxes have one each, and AdamW is
# bound by memory bandwidth: so the one-box reference runs as two
# independent trainings at once, each box's optimizer meeting the same
# contention as each of the two boxes' does.
#
# The runs alternate, ROUNDS times (default 3), so that the machine's load
# falls on both alike; the first step of each run is left out (it warms up).
# Prints each configuration's mean step time, the ratio of two boxes to two
# devices, what the rails sent and took per step, and the optimizer's time
# per box against one box's.
set -euo pipefail
STEPS=${1:-12}
ROUNDS=${2:-3}
FSOFF=${FSOFF:-build/fsoff}
[ -x "$FSOFF" ] || { echo "error: $FSOFF not found; build first (meson compile -C build) or set FSOFF" >&2; exit 1; }
command -v mpirun >/dev/null ||
    { echo "error: mpirun not found; install Open MPI (Debian: apt-get install openmpi-bin libopenmpi-dev) and build with it" >&2; exit 1; }
"$FSOFF" --version | grep -q 'mpi: yes' ||
    { echo "error: $FSOFF was built without MPI; install libopenmpi-dev and run meson setup --reconfigure -Dmpi=enabled" >&2; exit 1; }
command -v python3 >/dev/null || { echo "error: python3 is needed to read the metrics" >&2; exit 1; }
SRC=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# as root on one machine: Open MPI's loopback settings
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,tcp \
    OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo \
    OMPI_MCA_rmaps_base_oversubscribe=1
THREADS=$(nproc)
# the update serialized after the backward (train.optimizer_overlap "none"):
# the rails' cost is all in the step, and the optimizer's time is its own,
# not shared with a forward running beside it
JOB=(--config "$SRC/configs/small.json" --steps "$STEPS" --set steps_per_print=1000
     --set train.optimizer_overlap=none)

for ((r = 0; r < ROUNDS; r++)); do
    "$FSOFF" "${JOB[@]}" --devices cpu:2 --set train.threads="$THREADS" \
        --metrics "$TMP/devices.$r.jsonl" >/dev/null
    mpirun -np 2 --bind-to none "$FSOFF" "${JOB[@]}" --devices cpu:1 \
        --set train.threads=$((THREADS / 2 > 0 ? THREADS / 2 : 1)) \
        --metrics "$TMP/boxes.$r.jsonl" >/dev/null
    # the optimizer's work does not depend on the batch: half the batch, one
    # box, two of them at once (the bus shared as the two boxes share it)
    for twin in a b; do
        "$FSOFF" "${JOB[@]}" --devices cpu:1 --set train.threads=$((THREADS / 2 > 0 ? THREADS / 2 : 1)) \
            --metrics "$TMP/one$twin.$r.jsonl" >/dev/null &
    done
    wait
done

python3 - "$TMP" "$ROUNDS" <<'PY'
import json, os, sys
d, rounds = sys.argv[1], int(sys.argv[2])
def steps(name):
    out = []
    for r in range(rounds):
        rows = [json.loads(l) for l in open(os.path.join(d, f"{name}.{r}.jsonl"))]
        out += [x for x in rows if "step" in x and "event" not in x][1:]
    return out
def mean(rows, k):
    return sum(x[k] for x in rows) / len(rows)
dev, box, one = steps("devices"), steps("boxes"), steps("onea") + steps("oneb")
print("# configs/small.json: two boxes of one CPU device (mpirun -np 2, loopback TCP) against one")
print("# box of two devices; optimizer time per box against one box of one device (two such")
print("# boxes training at once, sharing the memory bus as the two boxes do)")
print("#  run              step_ms   optimizer_ms  net_bytes/step  rails_ms/step")
for label, rows in (("1 box x 2 dev", dev), ("2 boxes x 1 dev", box), ("1 box x 1 dev", one)):
    print(f"   {label:<16} {mean(rows, 'step_ms'):8.1f} {mean(rows, 'optimizer_ms'):13.1f} "
          f"{mean(rows, 'net_bytes'):15.0f} {mean(rows, 'net_ms'):14.1f}")
print(f"# step: 2 boxes / 2 devices = {mean(box, 'step_ms') / mean(dev, 'step_ms'):.3f}")
print(f"# optimizer per box: 2 boxes / 1 box = "
      f"{mean(box, 'optimizer_ms') / mean(one, 'optimizer_ms'):.3f}")
PY
