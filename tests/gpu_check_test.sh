#!/usr/bin/env bash
# gpu_check_test.sh — bench/gpu_check.sh --dry-run against the CUDA stand-in
# (tests/standin), in this build (FSO_BUILDDIR), its report in a temporary
# $OUT: every part present in order and written, the part made to hang
# killed and reported as such, each training run pinned where its --set put
# it, the three runs' per-step loss and grad_norm equal bit for bit, and two
# boxes under mpirun on the one stand-in GPU meeting over MPI rails.
# The dry run itself checks nothing; this test reads what it wrote.
set -u
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"
BUILD=${FSO_BUILDDIR:?run through meson test (FSO_BUILDDIR names the build)}

OUT=$TMP/out BUILD=$BUILD bash "$SRC/bench/gpu_check.sh" --dry-run >"$TMP/stdout" 2>"$TMP/stderr"
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 1 ]; then
    ok "the dry run ends with 0 or 1 (exit $rc: test_cuda_standin $([ $rc -eq 0 ] && echo passed || echo did not pass))"
else
    bad "the dry run ends with 0 or 1" "exit $rc" "$(tail -n 20 "$TMP/stdout")" "$(tail -n 20 "$TMP/stderr")"
fi

# check NAME PYTHON-EXPR: the expression, over the report r, is true
check() {
    local name=$1 expr=$2 got
    local rc
    got=$(python3 - "$TMP/out/gpu_check.json" "$expr" 2>&1 <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print("no report: %s" % e); sys.exit(1)
t = r.get("training") if isinstance(r.get("training"), dict) else {}
try:
    v = eval("(" + sys.argv[2] + ")", {"r": r, "t": t})
except Exception as e:
    print("%s: %s" % (type(e).__name__, e)); sys.exit(1)
if not v:
    print("false; the report's keys: %s" % list(r)); sys.exit(1)
PY
)
    rc=$?
    if [ $rc -eq 0 ]; then ok "$name"; else bad "$name" "$expr" "$got"; fi
}

check "every part is in the report, in order" \
    'list(r) == ["mode", "environment", "build", "correctness", "copies", "hang", "training",
                 "boxes", "cannot_test", "elapsed_s"] and r["mode"] == {"mode": "dry run"}'
check "the environment says dry run" '"dry run" in r["environment"]["driver_version"]'
check "the stand-in's targets built" 'r["build"]["status"] == "ok"'
check "correctness lists test_cuda_standin's tests one by one" \
    'r["correctness"]["test"] == "test_cuda_standin" and len(r["correctness"]["tests"]) > 0'
check "copies: h2d ran or says why; allgather is not run on 1 device" \
    'set(r["copies"]) == {"h2d", "allgather"} and
     r["copies"]["allgather"].startswith("not run: 1 GPU")'
check "the part made to hang is killed and reported" \
    'r["hang"]["exit"] == 137 and r["hang"]["status"].startswith("killed after ")'
for tier in device host nvme; do
    check "training on $tier: steps, its state pinned there (the banner's state line)" \
        "isinstance(t['$tier'], dict) and t['$tier']['steps'] >= 2 and t['$tier']['pinned'] == 'yes'
         and ' on $tier' in t['$tier']['state'] and len(t['$tier']['loss']) == t['$tier']['steps']"
done
check "device, host and nvme agree bit for bit, loss and grad_norm" \
    't["agreement"]["agree"] is True and t["agreement"]["compared"] == ["device", "host", "nvme"]'
# two boxes on the one stand-in GPU: over MPI rails (NCCL refuses two ranks
# on one GPU), agreeing with one box of two micro-batches
if command -v mpirun >/dev/null && "$BUILD/fsoff" --version | grep -q 'mpi: yes'; then
    check "two boxes on one GPU: MPI rails, said so, agreeing with one box" \
        'r["boxes"]["two_boxes"]["exit"] == 0 and r["boxes"]["two_boxes"]["steps"] >= 2 and
         r["boxes"]["rails"].startswith("rails: MPI") and "share GPU" in r["boxes"]["rails"] and
         (r["boxes"]["status"].startswith("bit for bit") or
          r["boxes"]["status"].startswith("within rounding"))'
else
    check "without mpirun or MPI, the boxes part says why it did not run" \
        'r["boxes"].startswith("not run: ")'
fi
check "what one device cannot test is said" '"NCCL" in r["cannot_test"] or "dry run" in r["cannot_test"]'
for f in build.log test.out train_device.jsonl train_nvme.out train_nvme.err hang.out; do
    if [ -e "$TMP/out/gpu_check/$f" ]; then ok "log kept: gpu_check/$f"; else bad "log kept: gpu_check/$f" "missing"; fi
done
if grep -q "hang: killed after" "$TMP/stdout"; then ok "stdout reports the kill"; else
    bad "stdout reports the kill" "$(grep hang "$TMP/stdout")"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
