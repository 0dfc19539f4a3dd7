#!/usr/bin/env bash
# nvme_vs_fio.sh — fsoff's NVMe store against fio, side by side, interleaved.
#
#   bench/nvme_vs_fio.sh [--rounds N] [--json FILE] [--plot FILE.png] DIR [SIZE]
#
# Every point (request size x queue depth) is measured by three or four
# contenders in turn: `fsoff bench nvme` (one point per call, --json), fio
# with plain buffers, fio with registered buffers and files (--fixedbufs=1
# --registerfiles=1), and, when the system has enough huge pages reserved
# (vm.nr_hugepages; the script says how many), fio with registered buffers in
# huge pages (--iomem=shmhuge), as fsoff's I/O buffers are (transparent huge
# pages): a disk takes a buffer in huge pages in far fewer DMA segments, and
# on a virtual disk that alone moved 4 MiB reads from 2 to 4.3 GB/s. Each one
# does the same to a new file of SIZE:
# writes it whole untimed (a new file's first write also converts its
# extents, which training's writes never pay), then writes it sequentially
# and reads it back, timed (io_uring, O_DIRECT, GB = 1e9 bytes on both
# sides). A new file for every point and contender matters on virtual
# disks: a file read over and over stays in the host's cache and reads at
# several times the disk's rate. A round visits every point; the order of the
# contenders rotates from round to round, so a disk that drifts from minute
# to minute (cloud disks move by +-30%) is spread over all of them. The table
# gives each contender's median over the rounds, fsoff / the best fio
# variant, and the spread of fsoff's rounds ((max - min) / median), so the
# noise is in view. The footer counts points at 0.97 or better; the script
# reports, it does not fail on a low ratio.
#
#   --rounds N       rounds (default 3; odd numbers give a true median)
#   --json FILE      the medians as one JSON object ("-": stdout), fsoff's in
#                    "results" and the better fio's in "reference", which
#                    `fsoff plot` draws
#   --plot FILE.png  draw fsoff (solid) and fio (dashed), GB/s against request
#                    size, a line per queue depth
#
# Environment: FSOFF (default build/fsoff next to this script), BLOCK_SIZES
# (default 128K,1M,4M), QUEUE_DEPTHS (default 1,4,16,32).
set -euo pipefail

usage() {
    echo "usage: $0 [--rounds N] [--json FILE] [--plot FILE.png] DIR [SIZE]   (SIZE default 256M; see the comment at the top)" >&2
    exit 2
}
ROUNDS=3
JSON=""
PLOT=""
args=()
while [ $# -gt 0 ]; do
    case $1 in
    --rounds) [ $# -ge 2 ] || usage; ROUNDS=$2; shift 2 ;;
    --json) [ $# -ge 2 ] || usage; JSON=$2; shift 2 ;;
    --plot) [ $# -ge 2 ] || usage; PLOT=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "nvme_vs_fio: error: unknown option $1" >&2; usage ;;
    *) args+=("$1"); shift ;;
    esac
done
[ ${#args[@]} -ge 1 ] && [ ${#args[@]} -le 2 ] || usage
DIR=${args[0]}
SIZE=${args[1]:-256M}
BLOCK_SIZES=${BLOCK_SIZES:-128K,1M,4M}
QUEUE_DEPTHS=${QUEUE_DEPTHS:-1,4,16,32}
case $ROUNDS in
'' | *[!0-9]* | 0) echo "nvme_vs_fio: error: --rounds $ROUNDS: expected a positive whole number" >&2; exit 2 ;;
esac

here=$(cd "$(dirname "$0")" && pwd)
FSOFF=${FSOFF:-$here/../build/fsoff}
. "$here/fio_lib.sh"
fio_require nvme_vs_fio "$DIR"

work=$(mktemp -d)
fiofile="$DIR/fio-bench.0"
cleanup() { rm -rf "$work"; rm -f "$fiofile"; }
trap cleanup EXIT
if [ -e "$fiofile" ]; then
    echo "nvme_vs_fio: error: $fiofile exists, left over from an earlier run; remove it (rm $fiofile)" >&2
    trap - EXIT
    rm -rf "$work"
    exit 1
fi

# fio_gbps RW BS QD EXTRA... -> GB/s (1e9 bytes)
fio_gbps() {
    local rw=$1 bs=$2 qd=$3
    shift 3
    fio --name=cmp --filename="$fiofile" --size="$SIZE" --bs="$bs" --iodepth="$qd" --rw="$rw" \
        --direct=1 --ioengine=io_uring --invalidate=1 --numjobs=1 \
        --output-format=json --output="$work/fio.json" "$@" >/dev/null 2>"$work/fio.err" || {
        echo "nvme_vs_fio: error: fio failed ($rw bs=$bs qd=$qd $*):" >&2
        cat "$work/fio.err" >&2
        exit 1
    }
    python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print("%.4f" % (j["jobs"][0][sys.argv[2]]["bw_bytes"] / 1e9))' \
        "$work/fio.json" "$rw"
}

# run_one ROUND CONTENDER BS QD: appends "round contender op bs qd gbps" rows
run_one() {
    local round=$1 who=$2 bs=$3 q=$4
    case $who in
    fsoff)
        "$FSOFF" bench nvme --nvme "$DIR" --size "$SIZE" --block-sizes "$bs" --queue-depths "$q" \
            --json "$work/fsoff.json" >/dev/null
        python3 - "$work/fsoff.json" "$round" >>"$work/rows" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
if not j["correct"]:
    sys.exit("nvme_vs_fio: error: fsoff read back wrong data")
if not j["direct"]:
    print("# warning: fsoff fell back to buffered I/O here; its numbers include the page cache", file=sys.stderr)
for r in j["results"]:
    print(sys.argv[2], "fsoff", r["op"], r["block_bytes"], r["queue_depth"], r["gbps"])
EOF
        ;;
    fio-plain | fio-fixed | fio-huge)
        local extra=()
        [ "$who" = fio-fixed ] && extra=(--fixedbufs=1 --registerfiles=1)
        [ "$who" = fio-huge ] && extra=(--iomem=shmhuge --fixedbufs=1 --registerfiles=1)
        rm -f "$fiofile"
        fio --name=fill --filename="$fiofile" --size="$SIZE" --bs=1M --iodepth=16 --rw=write \
            --direct=1 --ioengine=io_uring --fallocate=native --output="$work/fill.txt" \
            >/dev/null 2>"$work/fio.err" || {
            echo "nvme_vs_fio: error: fio could not write $fiofile:" >&2
            cat "$work/fio.err" >&2
            exit 1
        }
        local bytes
        bytes=$(python3 -c 'import sys; u = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}; s = sys.argv[1].upper().rstrip("IB"); print(int(float(s[:-1]) * u[s[-1]]) if s[-1] in u else int(s))' "$bs")
        for rw in write read; do
            echo "$round $who $rw $bytes $q $(fio_gbps "$rw" "$bs" "$q" "${extra[@]}")" >>"$work/rows"
        done
        ;;
    esac
}

: >"$work/rows"
IFS=, read -r -a blocks <<<"$BLOCK_SIZES"
IFS=, read -r -a qds <<<"$QUEUE_DEPTHS"
contenders=(fsoff fio-plain fio-fixed)
# fsoff's buffers are in huge pages (THP), which a disk takes in far fewer
# DMA segments; fio's are too with --iomem=shmhuge, from the huge pages the
# system has reserved. With enough of them fio runs a third way.
buf_bytes=$(python3 -c 'import sys
u = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
def b(s):
    s = s.upper().rstrip("IB")
    return int(float(s[:-1]) * u[s[-1]]) if s[-1] in u else int(s)
print(max(map(b, sys.argv[1].split(","))) * max(map(int, sys.argv[2].split(","))))' \
    "$BLOCK_SIZES" "$QUEUE_DEPTHS")
fio_huge_pages "$buf_bytes" && contenders+=(fio-huge)
nc=${#contenders[@]}
start=$(date +%s)
for ((r = 0; r < ROUNDS; r++)); do
    echo "# round $((r + 1)) of $ROUNDS ($(($(date +%s) - start)) s so far)" >&2
    k=0
    for b in "${blocks[@]}"; do
        for q in "${qds[@]}"; do
            for ((c = 0; c < nc; c++)); do
                run_one "$r" "${contenders[$(((c + r + k) % nc))]}" "$b" "$q"
            done
            k=$((k + 1))
        done
    done
done

python3 - "$work/rows" "$DIR" "$SIZE" "$ROUNDS" "$JSON" "$work/plot.json" <<'EOF'
import json, math, statistics, sys
rows_path, folder, size, rounds, json_path, plot_json = sys.argv[1:7]
vals = {}
for line in open(rows_path):
    rnd, who, op, bs, qd, g = line.split()
    vals.setdefault((who, op, int(bs), int(qd)), []).append(float(g))
points = sorted({k[1:] for k in vals if k[0] == "fsoff"}, key=lambda p: (p[1], p[2], p[0] != "write"))
med = {k: statistics.median(v) for k, v in vals.items()}
def spread(v):
    m = statistics.median(v)
    return (max(v) - min(v)) / m if m > 0 else float("nan")
table = json_path != "-"
out = print if table else (lambda *a, **k: print(*a, file=sys.stderr, **k))
out("# fsoff NVMe store vs fio (io_uring, O_DIRECT), %s per point, sequential, in %s;" % (size, folder))
huge = any(k[0] == "fio-huge" for k in vals)
out("# median of %s interleaved rounds; ratio = fsoff / the best fio (%s buffers)"
    % (rounds, "plain, registered or huge-page" if huge else "plain or registered"))
out("#    op       block    qd    fsoff  fio-plain  fio-fixed%s  fsoff/fio  fsoff spread  fio spread"
    % ("   fio-huge" if huge else ""))
out("#            (bytes)        (GB/s)     (GB/s)     (GB/s)%s                (max-min)/median"
    % ("     (GB/s)" if huge else ""))
ratios, results, ref, per_point = [], [], [], []
for op, bs, qd in points:
    f = med[("fsoff", op, bs, qd)]
    fio = {v: med.get((v, op, bs, qd), 0.0) for v in ("fio-plain", "fio-fixed", "fio-huge")}
    better = max(fio, key=lambda v: fio[v])
    best = fio[better]
    r = f / best if best > 0 else float("nan")
    ratios.append(r)
    sf = spread(vals[("fsoff", op, bs, qd)])
    so = spread(vals[(better, op, bs, qd)])
    out("  %5s  %10d  %4d  %7.3f  %9.3f  %9.3f%s  %9.2f  %12.2f  %10.2f"
        % (op, bs, qd, f, fio["fio-plain"], fio["fio-fixed"],
           "  %9.3f" % fio["fio-huge"] if huge else "", r, sf, so))
    results.append({"op": op, "block_bytes": bs, "queue_depth": qd, "gbps": f})
    ref.append({"op": op, "block_bytes": bs, "queue_depth": qd, "gbps": best, "variant": better})
    pp = {"op": op, "block_bytes": bs, "queue_depth": qd, "fsoff_gbps": f,
          "fio_plain_gbps": fio["fio-plain"], "fio_fixed_gbps": fio["fio-fixed"], "ratio": r,
          "fsoff_spread": sf, "fio_spread": so, "fsoff_rounds": vals[("fsoff", op, bs, qd)]}
    if huge:
        pp["fio_huge_gbps"] = fio["fio-huge"]
    per_point.append(pp)
good = [r for r in ratios if r == r]
gm = math.exp(sum(math.log(r) for r in good) / len(good)) if good else float("nan")
at_goal = sum(1 for r in good if r >= 0.97)
def gmean_vs(variant):
    r = [p["fsoff_gbps"] / p[variant] for p in per_point if p[variant] > 0]
    return math.exp(sum(math.log(x) for x in r) / len(r)) if r else float("nan")
out("# fsoff/fio: geometric mean %.3f, lowest %.3f; %d of %d points at 0.97 or better"
    % (gm, min(good) if good else float("nan"), at_goal, len(ratios)))
out("# geometric mean against each variant alone: fio-plain %.3f, fio-fixed %.3f%s"
    % (gmean_vs("fio_plain_gbps"), gmean_vs("fio_fixed_gbps"),
       ", fio-huge %.3f" % gmean_vs("fio_huge_gbps") if huge else ""))
rec = {"bench": "nvme", "tool": "fsoff", "folders": [folder], "size": size, "rounds": int(rounds),
       "results": results, "reference": {"tool": "fio", "results": ref},
       "points": per_point, "ratio_geomean": gm, "points_at_0_97": at_goal}
if json_path:
    with (sys.stdout if not table else open(json_path, "w")) as f:
        json.dump(rec, f, indent=1)
        f.write("\n")
json.dump(rec, open(plot_json, "w"))
EOF
if [ -n "$PLOT" ]; then
    "$FSOFF" plot "$work/plot.json" -o "$PLOT" >/dev/null
    [ "$JSON" = "-" ] || echo "# chart: $PLOT"
fi
