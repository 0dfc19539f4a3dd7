#!/usr/bin/env bash
# nvme_vs_fio.sh — fsoff's NVMe store against fio, side by side in one run.
#
#   bench/nvme_vs_fio.sh DIR [SIZE]
#
# For each block size, `fsoff bench nvme --json` writes then reads a fresh,
# preallocated SIZE-byte store in DIR at every queue depth; then fio does the
# same on a fresh file of the same size in DIR (sequential write, then read,
# --direct=1 --ioengine=io_uring with registered files and fixed buffers like
# fsoff, fallocate'd like fsoff), so both see the same disk state in the same
# minutes. Prints fsoff GB/s, fio GB/s and fsoff/fio per point and the
# geometric mean of the ratios. GB = 1e9 bytes on both sides.
#
# Environment:
#   FSOFF          the fsoff binary (default: build/fsoff next to this script)
#   BLOCK_SIZES    default 128K,1M,4M
#   QUEUE_DEPTHS   default 1,4,16,32
#   FIO_LIBAIO=1   add a fio libaio column (ratio is still against io_uring)
#   FIO_ARGS       extra fio arguments for the io_uring runs
#                  (default: --fixedbufs=1 --registerfiles=1)
set -euo pipefail

usage() { echo "usage: $0 DIR [SIZE]   (SIZE default 256M; see the comment at the top)" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
DIR=$1
SIZE=${2:-256M}
BLOCK_SIZES=${BLOCK_SIZES:-128K,1M,4M}
QUEUE_DEPTHS=${QUEUE_DEPTHS:-1,4,16,32}
FIO_ARGS=${FIO_ARGS:---fixedbufs=1 --registerfiles=1}

here=$(cd "$(dirname "$0")" && pwd)
FSOFF=${FSOFF:-$here/../build/fsoff}
if [ ! -x "$FSOFF" ]; then
    echo "nvme_vs_fio: error: $FSOFF: no fsoff binary; build it (meson setup build && ninja -C build) or set FSOFF" >&2
    exit 1
fi
if ! command -v fio >/dev/null; then
    echo "nvme_vs_fio: error: fio not found; install it: sudo apt-get install fio (Debian/Ubuntu), sudo dnf install fio (Fedora)" >&2
    exit 1
fi
if ! command -v python3 >/dev/null; then
    echo "nvme_vs_fio: error: python3 not found (it reads the JSON); install it: sudo apt-get install python3" >&2
    exit 1
fi
if [ ! -d "$DIR" ]; then
    echo "nvme_vs_fio: error: $DIR: no such folder; create it or pass another" >&2
    exit 1
fi

work=$(mktemp -d)
fiofile="$DIR/fio-bench.0"
cleanup() { rm -rf "$work"; rm -f "$fiofile"; }
trap cleanup EXIT
if [ -e "$fiofile" ]; then
    echo "nvme_vs_fio: error: $fiofile exists, left over from an earlier run; remove it (rm $fiofile)" >&2
    exit 1
fi

# fio_gbps ENGINE RW BS QD BYTES EXTRA... -> GB/s (1e9 bytes)
fio_gbps() {
    local engine=$1 rw=$2 bs=$3 qd=$4 bytes=$5
    shift 5
    fio --name=cmp --filename="$fiofile" --size="$bytes" --bs="$bs" --iodepth="$qd" --rw="$rw" \
        --direct=1 --ioengine="$engine" --fallocate=native --invalidate=1 --numjobs=1 \
        --output-format=json --output="$work/fio.json" "$@" >/dev/null 2>"$work/fio.err" || {
        echo "nvme_vs_fio: error: fio failed ($engine $rw bs=$bs qd=$qd):" >&2
        cat "$work/fio.err" >&2
        exit 1
    }
    python3 - "$work/fio.json" "$rw" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
print("%.4f" % (j["jobs"][0][sys.argv[2]]["bw_bytes"] / 1e9))
EOF
}

: >"$work/rows"
IFS=, read -r -a blocks <<<"$BLOCK_SIZES"
IFS=, read -r -a qds <<<"$QUEUE_DEPTHS"
for b in "${blocks[@]}"; do
    # fsoff: all queue depths of this block size, a fresh store
    "$FSOFF" bench nvme --nvme "$DIR" --size "$SIZE" --block-sizes "$b" \
        --queue-depths "$QUEUE_DEPTHS" --json >"$work/fsoff.json"
    python3 - "$work/fsoff.json" >>"$work/rows" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
if not j["correct"]:
    sys.exit("nvme_vs_fio: error: fsoff read back wrong data")
if not j["direct"]:
    print("# warning: fsoff fell back to buffered I/O here; its numbers include the page cache", file=sys.stderr)
for r in j["results"]:
    print("fsoff", r["op"], r["block_bytes"], r["queue_depth"], r["gbps"], j["size_bytes"])
EOF
    bs=$(awk 'END { print $3 }' "$work/rows")
    bytes=$(awk 'END { print $6 }' "$work/rows")
    # fio: the same points on a fresh file
    for engine in io_uring ${FIO_LIBAIO:+libaio}; do
        rm -f "$fiofile"
        extra=()
        [ "$engine" = io_uring ] && read -r -a extra <<<"$FIO_ARGS"
        for q in "${qds[@]}"; do
            for rw in write read; do
                echo "fio-$engine $rw $bs $q $(fio_gbps "$engine" "$rw" "$bs" "$q" "$bytes" "${extra[@]}") $bytes" >>"$work/rows"
            done
        done
    done
    rm -f "$fiofile"
done

python3 - "$work/rows" "$DIR" "${FIO_LIBAIO:+1}" "$FIO_ARGS" <<'EOF'
import math, sys
rows = [l.split() for l in open(sys.argv[1])]
libaio = sys.argv[3] == "1"
v = {}
for tool, op, bs, qd, gbps, size in rows:
    v[(tool, op, int(bs), int(qd))] = float(gbps)
size = int(rows[0][5])
points = sorted({k[1:] for k in v if k[0] == "fsoff"}, key=lambda p: (p[1], p[2], p[0] != "write"))
print("# fsoff NVMe store vs fio (io_uring, --direct=1 %s), %d MiB per point, sequential, in %s"
      % (sys.argv[4], size >> 20, sys.argv[2]))
print("#    op       block    qd    fsoff      fio  fsoff/fio" + ("   libaio" if libaio else ""))
print("#            (bytes)        (GB/s)   (GB/s)           " + ("   (GB/s)" if libaio else ""))
ratios = {"write": [], "read": []}
for op, bs, qd in points:
    f, o = v[("fsoff", op, bs, qd)], v[("fio-io_uring", op, bs, qd)]
    r = f / o if o > 0 else float("nan")
    ratios[op].append(r)
    line = "  %5s  %10d  %4d  %7.3f  %7.3f  %9.2f" % (op, bs, qd, f, o, r)
    if libaio:
        line += "  %7.3f" % v[("fio-libaio", op, bs, qd)]
    print(line)
def gmean(x):
    return math.exp(sum(math.log(r) for r in x) / len(x)) if x else float("nan")
allr = ratios["write"] + ratios["read"]
print("# mean fsoff/fio (geometric): write %.2f, read %.2f, all %.2f over %d points"
      % (gmean(ratios["write"]), gmean(ratios["read"]), gmean(allr), len(allr)))
EOF
