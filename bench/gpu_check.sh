#!/usr/bin/env bash
# gpu_check.sh — fsoff on this machine's NVIDIA GPUs, in one go, for a short
# loan of a GPU machine: what the machine is, the GPU tests (a failing test
# run again alone, synchronised, under memcheck when the toolkit has it),
# host<->device and collective bandwidth, and training tok/s, MFU and
# per-step loss of a 1.01B-parameter model with its state pinned on the GPU,
# in host memory and on NVMe (the three must agree bit for bit).
#
#   bench/gpu_check.sh            on a GPU machine (exit 77 without a GPU)
#   bench/gpu_check.sh --dry-run  on the CPU, against the CUDA stand-in
#
# Evidence comes back from any window, even one cut short: every step runs
# under `timeout -k` (SIGTERM, then SIGKILL KILL_S seconds later: fsoff's
# first SIGTERM only asks it to stop after the step), every part is written
# into the report as soon as it ends, and every log stays under
# $OUT/gpu_check/ (build.log, test.out, testlog.txt, the rerun's log, each
# fsoff run's .out, .err and .jsonl).
#
# Report: $OUT/gpu_check.json ($OUT unset: ./gpu_check.json), one JSON
# object, rewritten as each part ends, its keys in this order:
#   mode          "gpu" or "dry run"
#   environment   driver_version (recorded first; below R580 the run stops
#                 here, as the CUDA 13 runtime needs it), CUDA runtime and
#                 driver and NCCL versions, the GPUs, their PCIe link, clocks,
#                 power limit and ECC, nvidia-smi topo -m, ulimit -l, THP,
#                 io_uring (the kernel's and fsoff's NVMe probe), hwloc
#   build         "ok" or why not, with the log's tail
#   correctness   test_cuda: status, per-test results, and the rerun
#   copies        fsoff bench h2d; allgather ("not run: 1 GPU" with one)
#   hang          (--dry-run only) a step that ignores SIGTERM, killed
#   training      device, host, nvme: tok/s, MFU, step times, peak device
#                 bytes, stale marks, the banner's state line, per-step loss
#                 and grad_norm; then "agreement": whether the three agree bit
#                 for bit and the first step where they differ
#   boxes         two boxes of one GPU each under mpirun (on GPU 0, so over MPI
#                 rails: NCCL refuses two ranks on one GPU) against one box with
#                 two micro-batches a step: the rails line, losses, norms,
#                 net_bytes, tok/s, and whether they agree ("not run: ..."
#                 without mpirun or an MPI build)
#   cannot_test   what this machine cannot show (NCCL across GPUs on one GPU)
#   elapsed_s
# Time boxes (seconds, each followed by at most KILL_S of grace): nvidia-smi
# and the other environment probes 10 each, meson setup 40, ninja 130,
# fsoff's NVMe probe 15, test_cuda 75, the failed test again 30, bench h2d
# 20, bench allgather 20, training on device 45, host 50, NVMe 75, boxes 40
# and 50: 590 at most, and the graces, and BUDGET_S caps the whole run (a box shrinks to what is left).
# A part that fails or runs out of time says so ("not run: ...", "timed out
# after N s", "killed after N s") and the rest go on. Exit status: 0 the
# build and the GPU tests passed, 1 they did not (or the driver is too old),
# 77 no NVIDIA GPU here.
#
# --dry-run: no GPU and no nvidia-smi needed. Builds, in BUILD (default
# build/, the tests' build; it must exist), only the stand-in's targets:
# tests/standin/libfso_cuda_standin.so, tests/standin/fsoff-standin and the
# executable of the test test_cuda_standin; runs test_cuda_standin in place
# of test_cuda and fsoff-standin (FSO_CUDA_MODULE=the stand-in) in place of
# fsoff, with one stand-in device (GPU_CHECK_DEVICES; test_cuda_standin keeps
# the stand-in's two), a 2-layer model and a few steps, and one
# part made to hang (a step that ignores SIGTERM) that must be killed. About
# 3 minutes on 2 cores.
#
# Environment:
#   BUILD          build folder (default: build-gpu beside the sources; --dry-run: build)
#   NVME_DIR       folder for the NVMe run (default: $BUILD/gpu-check-nvme)
#   BUDGET_S       total seconds, kill graces included (default 510)
#   KILL_S         seconds from SIGTERM to SIGKILL (default 3)
#   MODEL_LAYERS   layers of the training model (default 21: 1.01B parameters)
#   FSO_CUDA_WAIT  how fsoff's host waits for the GPU: block (default) or spin;
#                  recorded in the report, so two runs compare the two
#   GPU_CHECK_FORCE=1  run every part even without a GPU (to test this script)
set -uo pipefail

SRC=$(cd "$(dirname "$0")/.." && pwd)
DRY=0
case "${1:-}" in
"") ;;
--dry-run) DRY=1 ;;
-h | --help)
    sed -n '2,/^set -uo/p' "$0" | sed -e '/^set -uo/d' -e 's/^# \{0,1\}//'
    exit 0
    ;;
*)
    echo "gpu_check: error: unknown argument '$1'; usage: bench/gpu_check.sh [--dry-run]" >&2
    exit 2
    ;;
esac
if [ "$DRY" = 1 ]; then
    BUILD=${BUILD:-$SRC/build}
    MODE="dry run"
else
    BUILD=${BUILD:-$SRC/build-gpu}
    MODE=gpu
fi
OUTDIR=${OUT:-$PWD}
REPORT=$OUTDIR/gpu_check.json
LOG=$OUTDIR/gpu_check
NVME_DIR=${NVME_DIR:-$BUILD/gpu-check-nvme}
BUDGET_S=${BUDGET_S:-510}
KILL_S=${KILL_S:-3}
MODEL_LAYERS=${MODEL_LAYERS:-21}
export PATH=/usr/local/cuda/bin:$PATH # the toolkit's nvcc, before any older one
START=$(date +%s)

say() { echo "gpu_check: $*"; }
left() { echo $((BUDGET_S - ($(date +%s) - START))); }
# box WANT: seconds for the next step: WANT, less when the budget (less the
# kill grace) has less left; 0 when under 5 s are left
box() {
    local l
    l=$(($(left) - KILL_S))
    if [ "$l" -lt 5 ]; then echo 0; elif [ "$l" -lt "$1" ]; then echo "$l"; else echo "$1"; fi
}
# boxed SECONDS CMD...: CMD under timeout -k; sets rc, and why to "" or to
# how it ended: "timed out after N s" (it stopped on SIGTERM) or "killed
# after N s" (SIGTERM ignored, SIGKILL KILL_S seconds later)
boxed() {
    local t=$1 t0
    shift
    t0=$(date +%s)
    timeout -k "$KILL_S" "$t" "$@"
    rc=$?
    local took=$(($(date +%s) - t0))
    why=""
    if [ $rc -eq 124 ]; then
        why="timed out after $took s (stopped on SIGTERM at $t s)"
    elif [ $rc -eq 137 ] && [ "$took" -ge "$t" ]; then
        why="killed after $took s (SIGTERM at $t s ignored, SIGKILL $KILL_S s later)"
    fi
}
# put KEY[.SUB] FILE: FILE's JSON (or its text, as a string) as the report's
# KEY (or KEY's SUB), the report rewritten at once
put() {
    python3 - "$REPORT" "$1" "$2" <<'PY'
import json, os, sys
rep, key, f = sys.argv[1:4]
try:
    r = json.load(open(rep))
except (OSError, ValueError):
    r = {}
try:
    v = json.load(open(f))
except ValueError:
    v = open(f, errors="replace").read().strip()
except OSError as e:
    v = "not run: %s" % e
k, _, sub = key.partition(".")
if sub:
    if not isinstance(r.get(k), dict):
        r[k] = {}
    r[k][sub] = v
else:
    r[k] = v
tmp = rep + ".tmp"
with open(tmp, "w") as out:
    json.dump(r, out, indent=2)
os.replace(tmp, rep)
PY
}
# put_text KEY[.SUB] TEXT
put_text() {
    printf '%s' "$2" >"$LOG/.text"
    python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read()))' "$LOG/.text" \
        >"$LOG/.text.json"
    put "$1" "$LOG/.text.json"
}

# ---------------------------------------------------------------- a GPU?
gpus=""
if [ "$DRY" = 0 ]; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        gpus=$(timeout -k 2 10 nvidia-smi --query-gpu=name,memory.total,pci.bus_id \
            --format=csv,noheader 2>/dev/null || true)
    fi
    if [ -z "$gpus" ] && ! ls /dev/nvidia[0-9]* >/dev/null 2>&1 && [ "${GPU_CHECK_FORCE:-0}" != 1 ]; then
        echo "gpu_check: skipped: no NVIDIA GPU here (nvidia-smi lists none and there is no /dev/nvidia0)"
        exit 77
    fi
fi
for tool in meson ninja python3 timeout; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "gpu_check: error: $tool not found; install it (Debian: sudo apt-get install meson ninja-build python3 coreutils)" >&2
        exit 1
    fi
done
if [ "$DRY" = 0 ] && ! command -v nvcc >/dev/null 2>&1; then
    echo "gpu_check: error: nvcc not found on PATH or in /usr/local/cuda/bin; install the CUDA toolkit" >&2
    exit 1
fi
if [ "$DRY" = 1 ] && [ ! -f "$BUILD/build.ninja" ]; then
    echo "gpu_check: error: --dry-run builds in an existing build folder; $BUILD has no build.ninja (meson setup $BUILD first, or set BUILD)" >&2
    exit 1
fi
mkdir -p "$LOG" "$NVME_DIR"
rm -f "$REPORT"
# shellcheck disable=SC2317  # (called by the trap)
cleanup() { rm -rf "$NVME_DIR/fsoff-"* "$LOG/.text" "$LOG/.text.json"; }
trap cleanup EXIT
python3 -c 'import json,sys; print(json.dumps({"mode": sys.argv[1]}))' "$MODE" >"$LOG/mode.json"
put mode "$LOG/mode.json"
say "$MODE; report $REPORT, logs in $LOG"

if [ "$DRY" = 1 ]; then
    STANDIN=$BUILD/tests/standin/libfso_cuda_standin.so
    FSOFF=$BUILD/tests/standin/fsoff-standin
    TEST=test_cuda_standin
    export FSO_CUDA_MODULE=$STANDIN # fsoff-standin's CUDA
    # fsoff-standin sees one device, as the loaned machine; test_cuda_standin
    # keeps the stand-in's default (two), for its NCCL tests
    NGPU=${GPU_CHECK_DEVICES:-1}
    # 4 GiB: fsoff keeps 2 GiB of a GPU for the CUDA context, cuBLAS and
    # NCCL (the stand-in's memory is sparse: only what is used is real)
    FSOFF_RUN=(env "FSO_STANDIN_DEVICES=$NGPU" FSO_STANDIN_MEM_MIB=4096 "$FSOFF")
else
    FSOFF=$BUILD/fsoff
    TEST=test_cuda
    NGPU=$(printf '%s\n' "$gpus" | grep -c . || true)
    FSOFF_RUN=("$FSOFF")
fi
export XDG_CACHE_HOME=$LOG/cache # this run's probes, never the user's cache

# ---------------------------------------------------------------- 1. environment
env_file=$LOG/environment.txt
: >"$env_file"
# field NAME CMD...: one field of the environment, the command's output (boxed)
field() {
    local name=$1 out
    shift
    out=$(timeout -k 2 10 "$@" 2>&1)
    printf '%s\t%s\n' "$name" "$(printf '%s' "$out" | tr '\n' '\r')" >>"$env_file"
}
if [ "$DRY" = 0 ] && command -v nvidia-smi >/dev/null 2>&1; then
    field driver_version nvidia-smi --query-gpu=driver_version --format=csv,noheader
    field gpus nvidia-smi --query-gpu=name,memory.total,pci.bus_id --format=csv,noheader
    field gpu_link_clocks_power_ecc nvidia-smi \
        --query-gpu=pcie.link.gen.current,pcie.link.width.current,clocks.max.sm,power.limit,ecc.mode.current \
        --format=csv
    field cuda_driver_from_smi sh -c "nvidia-smi | grep -o 'CUDA Version: *[0-9.]*'"
    field topo nvidia-smi topo -m
elif [ "$DRY" = 1 ]; then
    field driver_version echo "dry run: no driver (the CUDA stand-in, $NGPU device(s))"
else
    field driver_version echo "unknown: nvidia-smi not found"
fi
# the CUDA runtime fsoff builds against, the driver's CUDA version, NCCL's
field cuda_versions python3 - "$DRY" <<'PY'
import ctypes, glob, sys
if sys.argv[1] == "1":
    print("dry run: the stand-in replaces the CUDA runtime and NCCL"); sys.exit()
def load(names):
    for n in names:
        for p in [n] + sorted(glob.glob("/usr/local/cuda/lib64/" + n + "*")):
            try:
                return ctypes.CDLL(p), p
            except OSError:
                pass
    return None, None
out = []
rt, p = load(["libcudart.so", "libcudart.so.13"])
if rt:
    v = ctypes.c_int(0)
    rt.cudaRuntimeGetVersion(ctypes.byref(v)); out.append("runtime %d.%d (%s)" % (v.value // 1000, v.value % 1000 // 10, p))
    v = ctypes.c_int(0)
    rt.cudaDriverGetVersion(ctypes.byref(v)); out.append("driver supports CUDA %d.%d" % (v.value // 1000, v.value % 1000 // 10))
else:
    out.append("runtime: libcudart not found")
nc, p = load(["libnccl.so.2", "libnccl.so"])
if nc:
    v = ctypes.c_int(0)
    nc.ncclGetVersion(ctypes.byref(v)); n = v.value
    out.append("NCCL %d.%d.%d (%s)" % (n // 10000, n // 100 % 100, n % 100, p))
else:
    out.append("NCCL: libnccl not found")
print("; ".join(out))
PY
field ulimit_l sh -c 'ulimit -l'
field thp cat /sys/kernel/mm/transparent_hugepage/enabled
field io_uring_kernel python3 - <<'PY'
import ctypes, os
try:
    d = open("/proc/sys/kernel/io_uring_disabled").read().strip()
except OSError:
    d = "(no sysctl)"
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 4, params)  # io_uring_setup(4 entries)
if fd >= 0:
    os.close(fd); print("io_uring_setup works; kernel.io_uring_disabled=%s" % d)
else:
    e = ctypes.get_errno(); print("io_uring_setup refused: %s; kernel.io_uring_disabled=%s" % (os.strerror(e), d))
PY
if command -v lstopo-no-graphics >/dev/null 2>&1; then
    field hwloc sh -c 'lstopo-no-graphics --of console --no-io --no-caches | head -n 40'
elif command -v hwloc-ls >/dev/null 2>&1; then
    field hwloc sh -c 'hwloc-ls --of console --no-io --no-caches | head -n 40'
else
    field hwloc sh -c 'echo "hwloc tools not installed; lscpu:"; lscpu | head -n 20; ls -d /sys/devices/system/node/node* 2>/dev/null'
fi
field nproc nproc
field host_waits echo "${FSO_CUDA_WAIT:-block} (FSO_CUDA_WAIT)"
# env_part: environment.txt as an object; prints it
env_part() {
    python3 - "$env_file" "$LOG/environment.json" "$MODE" <<'PY'
import json, sys
src, dst, mode = sys.argv[1:4]
r = {"mode": mode}
for line in open(src, errors="replace", newline="\n"):
    k, _, v = line.rstrip("\n").partition("\t")
    r[k] = v.replace("\r", "\n").strip()
json.dump(r, open(dst, "w"))
for k, v in r.items():
    print("gpu_check:   %-26s %s" % (k + ":", v.splitlines()[0] if v else ""))
PY
    put environment "$LOG/environment.json"
}
say "1. environment"
env_part

# L4: the module needs the CUDA 13 runtime, which needs an R580+ driver
if [ "$DRY" = 0 ]; then
    drv=$(grep '^driver_version' "$env_file" | cut -f2 | tr '\r' '\n' | head -n 1)
    major=${drv%%.*}
    if [[ "$major" =~ ^[0-9]+$ ]] && [ "$major" -lt 580 ]; then
        msg="stopped: NVIDIA driver '${drv:-unknown}' is older than R580; fsoff's CUDA module needs the CUDA 13 runtime, which needs driver 580 or later: every GPU part would only skip. Install NVIDIA driver 580 or later"
        put_text stopped "$msg"
        say "$msg"
        exit 1
    fi
fi

# ---------------------------------------------------------------- build
build_ok=0
: >"$LOG/build.log"
if [ "$DRY" = 1 ]; then
    # the stand-in's targets and the test executable of test_cuda_standin
    test_exe=$(python3 - "$BUILD" "$TEST" <<'PY'
import json, os, sys
build, name = sys.argv[1:3]
try:
    tests = json.load(open(os.path.join(build, "meson-info", "intro-tests.json")))
except (OSError, ValueError):
    tests = []
for t in tests:
    if t["name"] == name:
        print(os.path.relpath(t["cmd"][0], build)); break
PY
)
    targets=(tests/standin/libfso_cuda_standin.so tests/standin/fsoff-standin ${test_exe:+"$test_exe"})
else
    targets=(fsoff libfso_cuda.so tests/test_cuda)
fi
t=$(box 130)
say "build: ${targets[*]} in $BUILD (time box ${t}s)"
if [ "$DRY" = 0 ] && [ ! -f "$BUILD/build.ninja" ]; then
    boxed "$(box 40)" meson setup "$BUILD" "$SRC" -Dcuda=enabled >>"$LOG/build.log" 2>&1
    [ $rc -eq 0 ] || echo "failed: meson setup${why:+, $why} (exit $rc)" >"$LOG/build.status"
    t=$(box 130)
fi
if [ ! -s "$LOG/build.status" ]; then
    boxed "$t" ninja -C "$BUILD" "${targets[@]}" >>"$LOG/build.log" 2>&1
    if [ $rc -eq 0 ]; then
        echo ok >"$LOG/build.status"
        build_ok=1
    else
        echo "failed: ninja${why:+, $why} (exit $rc)" >"$LOG/build.status"
    fi
fi
if [ "$DRY" = 1 ] && [ -z "$test_exe" ]; then
    echo "failed: the build in $BUILD has no test '$TEST' (configured with CUDA and the stand-in?)" >"$LOG/build.status"
    build_ok=0
fi
python3 - "$LOG" <<'PY'
import json, os, sys
d = sys.argv[1]
st = open(os.path.join(d, "build.status")).read().strip()
r = {"status": st}
if st != "ok":
    r["log_tail"] = open(os.path.join(d, "build.log"), errors="replace").read().splitlines()[-30:]
json.dump(r, open(os.path.join(d, "build.json"), "w"))
PY
put build "$LOG/build.json"
say "build: $(cat "$LOG/build.status")"
# fsoff's NVMe probe (the io_uring store, O_DIRECT where allowed) into the environment
if [ "$build_ok" = 1 ] && [ "$(box 15)" -gt 0 ]; then
    boxed "$(box 15)" "${FSOFF_RUN[@]}" plan --config "$SRC/configs/tiny.json" --nvme "$NVME_DIR" --probe \
        >"$LOG/probe.out" 2>&1
    probe=$( (grep -E 'NVMe .*(probed|free)|uring|error' "$LOG/probe.out" || tail -n 2 "$LOG/probe.out") |
        head -n 3 | tr '\n' '\r')
    printf 'io_uring_fsoff_probe\t%s\n' "fsoff plan --probe: exit $rc${why:+ ($why)}: $probe" >>"$env_file"
    env_part >/dev/null
    say "   io_uring (fsoff plan --probe): $(grep '^io_uring_fsoff_probe' "$env_file" | cut -f2 | tr '\r' ' ' | head -c 300)"
fi

# ---------------------------------------------------------------- 2. correctness
# The test's command and environment, as meson runs it (intro-tests.json),
# run here line-buffered so that a killed run still leaves its lines.
test_cmd() { # TEST [WRAPPER...]: prints "cd WORKDIR && exec env K=V... [WRAPPER...] CMD..."
    python3 - "$BUILD" "$@" <<'PY'
import json, os, shlex, sys
build, name, wrap = sys.argv[1], sys.argv[2], sys.argv[3:]
for t in json.load(open(os.path.join(build, "meson-info", "intro-tests.json"))):
    if t["name"] == name:
        env = ["%s=%s" % kv for kv in sorted((t.get("env") or {}).items())]
        q = lambda a: " ".join(shlex.quote(x) for x in a)
        print("cd %s && exec %s" % (shlex.quote(t.get("workdir") or build),
                                    q(["env"] + env + wrap + t["cmd"])))
        break
PY
}
# linebuf: the prefix that runs a test with its stdout and stderr
# line-buffered (stdbuf), so that a killed test still leaves the lines it
# printed. stdbuf preloads a library, and a build under AddressSanitizer
# refuses to start behind any preload unless told the order does not matter.
linebuf=(env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" stdbuf -oL -eL)
# test_part: correctness.json from test.out (and the rerun's log)
test_part() {
    python3 - "$LOG" "$1" "$2" "$3" <<'PY'
import json, os, re, sys
d, status, rerun, name = sys.argv[1:5]
res, order = {}, []
for line in open(os.path.join(d, "test.out"), errors="replace"):
    m = re.match(r"\[\s*(RUN|OK|FAILED|SKIPPED|ERROR)\s*\]\s+(\S+)", line)
    if not m or m.group(2).startswith("test(s)") or m.group(2).isdigit():
        continue
    what, t = m.group(1), m.group(2)
    if t not in res:
        order.append(t)
    res[t] = {"RUN": "started, no result (killed or crashed in it)", "OK": "ok",
              "FAILED": "failed", "SKIPPED": "skipped", "ERROR": "error"}[what]
r = {"test": name, "status": status, "tests": {t: res[t] for t in order}}
skip = [l.strip() for l in open(os.path.join(d, "test.out"), errors="replace") if "skipped:" in l]
if skip:
    r["skipped_because"] = skip[0]
if status != "ok":
    r["failed_tests"] = [t for t in order if res[t] != "ok" and res[t] != "skipped"]
    lines = open(os.path.join(d, "test.out"), errors="replace").read().splitlines()
    r["log_tail"] = lines[-40:]
r["rerun"] = rerun
p = os.path.join(d, "rerun.log")
if os.path.exists(p):
    r["rerun_log_tail"] = open(p, errors="replace").read().splitlines()[-60:]
json.dump(r, open(os.path.join(d, "correctness.json"), "w"))
for t in order:
    print("gpu_check:   %-52s %s" % (t, res[t]))
PY
    put correctness "$LOG/correctness.json"
}
tests_ok=0
: >"$LOG/test.out"
tstatus="not run: the build failed"
rerun="not run: the tests did not fail"
if [ "$build_ok" = 1 ]; then
    t=$(box 75)
    say "2. correctness: $TEST (time box ${t}s)"
    cmd=$(test_cmd "$TEST")
    if [ -z "$cmd" ]; then
        tstatus="not run: no test '$TEST' in $BUILD"
    elif [ "$t" = 0 ]; then
        tstatus="not run: out of time"
    else
        echo "$cmd" >"$LOG/test.cmd"
        boxed "$t" "${linebuf[@]}" bash -c "$cmd" >"$LOG/test.out" 2>&1
        echo "$rc $why" >"$LOG/test.rc"
        read -r trc twhy <"$LOG/test.rc"
        if [ "$trc" = 0 ]; then
            tstatus=ok
            tests_ok=1
        elif [ "$trc" = 77 ]; then
            tstatus=$(grep -m1 -o 'skipped: .*' "$LOG/test.out" || echo 'skipped: (no reason printed)')
        else
            tstatus="failed (exit $trc)${twhy:+: $twhy}"
        fi
    fi
    # the first failing test again, alone: every CUDA call waited for and
    # checked (FSO_CUDA_SYNC=1), under compute-sanitizer's memcheck when the
    # toolkit has it (and not on the stand-in)
    first=$(grep -m1 -oE '^\[ *FAILED *\] +test_[A-Za-z0-9_]+' "$LOG/test.out" | awk '{print $NF}')
    if [ -z "$first" ] && [ "$tests_ok" = 0 ]; then # killed or crashed inside a test
        first=$(grep -oE '^\[ *RUN *\] +test_[A-Za-z0-9_]+' "$LOG/test.out" | tail -n 1 | awk '{print $NF}')
    fi
    if [ -n "$first" ] && [ "$tests_ok" = 0 ]; then
        t=$(box 30)
        sanitizer=""
        [ "$DRY" = 0 ] && sanitizer=$(command -v compute-sanitizer || true)
        say "   $first again, synchronised${sanitizer:+, under memcheck} (time box ${t}s)"
        if [ "$t" = 0 ]; then
            rerun="not run: out of time"
        else
            rcmd=$(test_cmd "$TEST" ${sanitizer:+"$sanitizer" --tool memcheck --print-limit 20})
            echo "FSO_TEST_FILTER=$first FSO_CUDA_SYNC=1 $rcmd" >"$LOG/rerun.cmd"
            FSO_TEST_FILTER=$first FSO_CUDA_SYNC=1 boxed "$t" "${linebuf[@]}" bash -c "$rcmd" \
                >"$LOG/rerun.log" 2>&1
            rerun="$first alone, FSO_CUDA_SYNC=1${sanitizer:+, under memcheck}: exit $rc${why:+, $why}"
        fi
    fi
fi
test_part "$tstatus" "$rerun" "$TEST"
say "$TEST: $tstatus"

# ---------------------------------------------------------------- 3. copies
# bench_part NAME BOX: copies.NAME, the bench's JSON object or why not
bench_part() {
    local name=$1 t
    echo '"not run: the build failed"' >"$LOG/bench_$name.json"
    if [ "$build_ok" = 1 ]; then
        t=$(box "$2")
        if [ "$name" = allgather ] && [ "$NGPU" -lt 2 ]; then
            echo "\"not run: $NGPU GPU (NCCL across GPUs needs two)\"" >"$LOG/bench_$name.json"
        elif [ "$t" = 0 ]; then
            echo '"not run: out of time"' >"$LOG/bench_$name.json"
        else
            say "3. copies: fsoff bench $name (time box ${t}s)"
            rm -f "$LOG/bench_$name.tmp"
            boxed "$t" "${FSOFF_RUN[@]}" bench "$name" --seconds "$3" --json "$LOG/bench_$name.tmp" \
                >"$LOG/bench_$name.out" 2>"$LOG/bench_$name.err"
            python3 - "$LOG" "$name" "$rc" "$why" <<'PY'
import json, os, sys
d, name, rc, why = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
p = lambda e: os.path.join(d, "bench_" + name + e)
tail = lambda e, n: " ".join(open(p(e), errors="replace").read().split("\n")[-n - 1:]).strip()
try:
    r = json.load(open(p(".tmp")))
except (OSError, ValueError):
    r = None
if rc == 0 and r is not None:
    pass
elif rc == 77:
    r = "not run: " + (tail(".err", 1) or tail(".out", 1))
else:
    r = "failed: %s: %s" % (why or "exit %d" % rc, tail(".err", 3))
json.dump(r, open(p(".json"), "w"))
PY
        fi
    fi
    put "copies.$name" "$LOG/bench_$name.json"
    say "   $name: $(head -c 300 "$LOG/bench_$name.json")"
}
if [ "$DRY" = 1 ]; then
    bench_part h2d 30 0.05
    bench_part allgather 30 0.05
else
    bench_part h2d 20 0.3
    bench_part allgather 20 0.3
fi

# ---------------------------------------------------------------- the hang (dry run)
# One step made to hang: it ignores SIGTERM, as a step of fsoff does (its
# first SIGTERM only asks for a stop after the step); -k must kill it.
if [ "$DRY" = 1 ]; then
    say "hang: a step that ignores SIGTERM (time box 3s, then SIGKILL)"
    boxed 3 bash -c 'trap "" TERM; echo "step 1 hangs"; exec sleep 300' >"$LOG/hang.out" 2>&1
    python3 -c 'import json,sys; print(json.dumps({"what": "a step that ignores SIGTERM (sleep, SIGTERM ignored)", "exit": int(sys.argv[1]), "status": sys.argv[2] or "not killed (exit %s)" % sys.argv[1]}))' \
        "$rc" "$why" >"$LOG/hang.json"
    put hang "$LOG/hang.json"
    say "   hang: ${why:-not killed (exit $rc)}"
fi

# ---------------------------------------------------------------- 4. training
if [ "$DRY" = 1 ]; then
    # a 2-layer model, a few steps: the stand-in computes on the CPU
    HID=64 FFN=172 HEADS=4 KV=2 VOCAB=512 BATCH=2 SEQ=64 MODEL_LAYERS=2
    STEPS_DEVICE=3 STEPS_HOST=3 STEPS_NVME=3 STEPS_BOXES=3
    MODEL_DESC="Llama, 2 layers, hidden 64 (dry run)"
else
    # a Llama of 1.01B parameters (MODEL_LAYERS=21): hidden 2048, 16 heads (4
    # kv), MLP 5632, vocab 32000, 8 x 1024 tokens per step and GPU; bf16
    HID=2048 FFN=5632 HEADS=16 KV=4 VOCAB=32000 BATCH=8 SEQ=1024
    STEPS_DEVICE=8 STEPS_HOST=6 STEPS_NVME=3 STEPS_BOXES=4
    MODEL_DESC=$(python3 -c 'import sys; l=int(sys.argv[1]); print("Llama %.2fB (hidden 2048, %d layers, 16/4 heads, MLP 5632, vocab 32000, tied), 8 x 1024 tokens per step and GPU" % ((65536000 + l * 45092864) / 1e9, l))' "$MODEL_LAYERS")
fi
cat >"$LOG/model.json" <<EOF
{
  "model": {
    "vocab_size": $VOCAB, "hidden_size": $HID, "intermediate_size": $FFN,
    "num_hidden_layers": $MODEL_LAYERS, "num_attention_heads": $HEADS, "num_key_value_heads": $KV,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "initializer_range": 0.02, "tie_word_embeddings": true
  },
  "train_micro_batch_size_per_gpu": $BATCH,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "optimizer": { "type": "AdamW",
                 "params": { "lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1 } },
  "zero_optimization": { "stage": 3 },
  "bf16": { "enabled": true },
  "data": { "seq_len": $SEQ },
  "train": { "activation_checkpointing": true }
}
EOF
put_text training.model "$MODEL_DESC"

# train_run TIER STEPS BOX ARGS...: training.TIER from the run's metrics and
# banner; its state line must put the state where the --set pinned it
train_run() {
    local tier=$1 steps=$2 want=$3 t
    shift 3
    local out=$LOG/train_$tier
    rm -f "$out.jsonl" "$out.out" "$out.err"
    : >"$out.out"
    : >"$out.err"
    if [ "$build_ok" != 1 ]; then
        echo '"not run: the build failed"' >"$out.json"
    elif [ "$(box "$want")" -lt 20 ]; then
        echo '"not run: out of time"' >"$out.json"
    else
        t=$(box "$want")
        say "4. training, state pinned on $tier: $steps steps (time box ${t}s)"
        boxed "$t" "${FSOFF_RUN[@]}" --devices cuda --config "$LOG/model.json" --steps "$steps" \
            --metrics "$out.jsonl" "$@" >"$out.out" 2>"$out.err"
        python3 - "$out" "$tier" "$rc" "$why" <<'PY'
import json, sys
out, tier, rc, why = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
steps, summary = [], None
try:
    for line in open(out + ".jsonl"):
        try:
            o = json.loads(line)
        except ValueError:
            continue
        if o.get("event") == "summary":
            summary = o
        elif "step" in o and "loss" in o and "event" not in o:
            steps.append(o)
except OSError:
    pass
state = next((l.strip()[len("fsoff: state "):] for l in open(out + ".out", errors="replace")
              if l.startswith("fsoff: state ")), None)
err = [l.strip() for l in open(out + ".err", errors="replace") if l.strip()]
res = {"exit": rc}
if why:
    res["ended"] = why
if state is None:
    res["state"] = None
    res["pinned"] = "no state line in the banner"
else:
    res["state"] = state
    want = {"device": lambda s: " on host" not in s and " on nvme" not in s,
            "host": lambda s: " on host" in s and " on nvme" not in s,
            "nvme": lambda s: " on nvme" in s}[tier]
    res["pinned"] = "yes" if want(state) else \
        "NO: the state line does not put the state on %s" % tier
timed = steps[1:] if len(steps) >= 2 else steps
if timed:
    res["tok_s"] = sum(s["tok_s"] for s in timed) / len(timed)
    res["tok_s_note"] = "first step excluded" if len(steps) >= 2 else "one step: warm-up included"
    res["mfu"] = sum(s.get("mfu", 0) for s in timed) / len(timed)
res["steps"] = len(steps)
res["step_ms"] = [s.get("step_ms") for s in steps]
res["stale_marks"] = steps[-1].get("stale_marks") if steps else None
if summary:
    res["peak_device_bytes"] = summary.get("peak_device_bytes")
    res["pin_refused"] = summary.get("pin_refused")
    res["mean_step_ms"] = summary.get("mean_step_ms")
# bit for bit: the printed %.17g values, as strings
res["loss"] = [repr(s["loss"]) for s in steps]
res["grad_norm"] = [repr(s.get("grad_norm")) for s in steps]
if not steps:
    e = next((l for l in err if "error" in l), None)
    res["why"] = e or (why and "no step finished: " + why) or (err[-1] if err else "") \
        or "fsoff exited with status %d" % rc
json.dump(res, open(out + ".json", "w"))
print("gpu_check:   %s: %s" % (tier, ", ".join(
    "%s %s" % (k, res[k]) for k in ("exit", "ended", "pinned", "tok_s", "mfu", "steps", "stale_marks",
                                    "peak_device_bytes", "why") if k in res)))
print("gpu_check:   %s: state %s" % (tier, res["state"]))
for i, s in enumerate(steps):
    print("gpu_check:   %s: step %d loss %s grad_norm %s" % (tier, i + 1, res["loss"][i], res["grad_norm"][i]))
PY
    fi
    put "training.$tier" "$out.json"
    [ -s "$out.json" ] && head -c 200 "$out.json" | grep -q '^"' && say "   $tier: $(cat "$out.json")"
}

train_run device "$STEPS_DEVICE" 45 \
    --set zero_optimization.offload_param.device=none \
    --set zero_optimization.offload_optimizer.device=none
train_run host "$STEPS_HOST" 50 \
    --set zero_optimization.offload_param.device=cpu \
    --set zero_optimization.offload_optimizer.device=cpu \
    --set zero_optimization.offload_param.pin_memory=true
train_run nvme "$STEPS_NVME" 75 --nvme "$NVME_DIR" \
    --set zero_optimization.offload_param.device=nvme \
    --set zero_optimization.offload_optimizer.device=nvme

# the three placements compute the same numbers: loss and grad_norm bit for
# bit, step by step, over the steps all three ran
python3 - "$LOG" "$NGPU" <<'PY' >"$LOG/agreement.json"
import json, os, sys
d, ngpu = sys.argv[1], sys.argv[2]
runs = {}
for tier in ("device", "host", "nvme"):
    try:
        r = json.load(open(os.path.join(d, "train_%s.json" % tier)))
    except (OSError, ValueError):
        r = None
    if isinstance(r, dict) and r.get("loss"):
        runs[tier] = r
res = {"devices": int(ngpu), "compared": sorted(runs)}
if len(runs) < 2:
    res["agree"] = None
    res["status"] = "not compared: %d of the 3 runs have steps" % len(runs)
else:
    n = min(len(r["loss"]) for r in runs.values())
    res["steps_compared"] = n
    first = None
    for i in range(n):
        for key in ("loss", "grad_norm"):
            vals = {t: runs[t][key][i] for t in runs}
            if len(set(vals.values())) > 1:
                first = {"step": i + 1, "value": key, "values": vals}
                break
        if first:
            break
    res["agree"] = first is None and len(runs) == 3
    if first:
        res["first_difference"] = first
        res["status"] = "DIFFER: first at step %d (%s): %s" % (
            first["step"], first["value"], ", ".join("%s %s" % kv for kv in first["values"].items()))
    else:
        res["status"] = "%s bit for bit over %d step%s at %s device%s%s" % (
            "agree" if len(runs) == 3 else "agree (only %s ran)" % ", ".join(sorted(runs)),
            n, "" if n == 1 else "s", ngpu, "" if ngpu == "1" else "s",
            "" if len(runs) == 3 else "; not a full comparison")
print(json.dumps(res))
PY
put training.agreement "$LOG/agreement.json"
say "   loss and grad_norm across device/host/nvme: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' "$LOG/agreement.json")"

# ---------------------------------------------------------------- 5. boxes
# Two boxes of one GPU each (B=2 x G=1) under mpirun, both processes on GPU 0
# of this machine, the state in host memory (the CPU optimizer's half on each
# box): NCCL refuses two ranks of a communicator on one GPU, so comm.rails
# "auto" carries the rails over MPI through host memory, and the banner's
# rails: line says so. Against one box of one GPU with two micro-batches a
# step (the same global batch, the same sequences): losses and norms, equal
# bit for bit or within rounding (the norm's sums may group differently).
boxes_part() {
    local out=$LOG/boxes t
    rm -f "$out".*
    if [ "$build_ok" != 1 ]; then
        echo '"not run: the build failed"' >"$out.json"
    elif ! command -v mpirun >/dev/null; then
        echo '"not run: mpirun not found (Debian: apt-get install openmpi-bin libopenmpi-dev, then build again)"' >"$out.json"
    elif ! "${FSOFF_RUN[@]}" --version 2>/dev/null | grep -q 'mpi: yes'; then
        echo '"not run: this fsoff was built without MPI (install libopenmpi-dev, then meson setup --reconfigure)"' >"$out.json"
    elif [ "$(box 90)" -lt 30 ]; then
        echo '"not run: out of time"' >"$out.json"
    else
        local args=(--devices cuda:1 --config "$LOG/model.json" --steps "$STEPS_BOXES"
                    --set zero_optimization.offload_param.device=cpu
                    --set zero_optimization.offload_optimizer.device=cpu)
        t=$(box 40)
        say "5. boxes: 1 box x 1 GPU, 2 micro-batches a step: $STEPS_BOXES steps (time box ${t}s)"
        boxed "$t" "${FSOFF_RUN[@]}" "${args[@]}" --set gradient_accumulation_steps=2 \
            --metrics "$out.one.jsonl" >"$out.one.out" 2>"$out.one.err"
        local rc_one=$rc why_one=$why
        t=$(box 50)
        say "5. boxes: 2 boxes x 1 GPU under mpirun, one micro-batch a step (time box ${t}s)"
        # as root on one machine: Open MPI's loopback settings; under
        # AddressSanitizer (the tests' dry run), no leak report for what Open
        # MPI keeps until the process ends
        boxed "$t" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
            OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo \
            OMPI_MCA_rmaps_base_oversubscribe=1 \
            ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
            mpirun -np 2 --bind-to none "${FSOFF_RUN[@]}" "${args[@]}" \
            --set gradient_accumulation_steps=1 --metrics "$out.two.jsonl" \
            >"$out.two.out" 2>"$out.two.err"
        python3 - "$out" "$rc_one" "$why_one" "$rc" "$why" <<'PY' >"$out.json"
import json, sys
out, rc1, why1, rc2, why2 = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
def steps(f):
    r = []
    try:
        for line in open(f):
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if "step" in o and "loss" in o and "event" not in o:
                r.append(o)
    except OSError:
        pass
    return r
def lines(f, pred):
    try:
        return [l.strip() for l in open(f, errors="replace") if pred(l)]
    except OSError:
        return []
one, two = steps(out + ".one.jsonl"), steps(out + ".two.jsonl")
res = {"one_box": {"exit": rc1, "steps": len(one)}, "two_boxes": {"exit": rc2, "steps": len(two)}}
if why1:
    res["one_box"]["ended"] = why1
if why2:
    res["two_boxes"]["ended"] = why2
rails = lines(out + ".two.out", lambda l: l.startswith("rails:"))
res["rails"] = rails[0] if rails else None
for key, run in (("one_box", one), ("two_boxes", two)):
    timed = run[1:] if len(run) >= 2 else run
    if timed:
        res[key]["tok_s"] = sum(s["tok_s"] for s in timed) / len(timed)
    res[key]["loss"] = [repr(s["loss"]) for s in run]
    res[key]["grad_norm"] = [repr(s.get("grad_norm")) for s in run]
    if not run:
        err = lines(out + (".one.err" if key == "one_box" else ".two.err"), lambda l: "error" in l)
        res[key]["why"] = err[0] if err else "no step finished"
if two:
    res["two_boxes"]["net_bytes"] = [s.get("net_bytes") for s in two]
    res["two_boxes"]["net_ms"] = [s.get("net_ms") for s in two]
n = min(len(one), len(two))
if n:
    rel = max(max(abs(a["loss"] - b["loss"]) / max(abs(a["loss"]), 1e-12),
                  abs(a["grad_norm"] - b["grad_norm"]) / max(abs(a["grad_norm"]), 1e-12))
              for a, b in zip(one[:n], two[:n]))
    bits = all(repr(a["loss"]) == repr(b["loss"]) and repr(a["grad_norm"]) == repr(b["grad_norm"])
               for a, b in zip(one[:n], two[:n]))
    res["steps_compared"] = n
    res["max_rel_diff"] = rel
    res["status"] = ("bit for bit" if bits else "within rounding (max relative difference %.2g)" % rel
                     if rel < 1e-4 else "DIFFER (max relative difference %.2g)" % rel) + \
        " over %d step%s" % (n, "" if n == 1 else "s")
else:
    res["status"] = "not compared: a run has no steps"
print(json.dumps(res))
PY
        say "   boxes: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["status"], "|", r.get("rails"))' "$out.json")"
    fi
    put boxes "$out.json"
}
boxes_part

# ---------------------------------------------------------------- what this cannot test
if [ "$NGPU" -lt 2 ]; then
    put_text cannot_test "with $NGPU GPU: NCCL across GPUs (all-gather and reduce-scatter bandwidth, the 2-GPU training placements of test_cuda, agreement across device counts, the NCCL watchdog ending a stalled or failed rank) cannot run here"
else
    put_text cannot_test "NCCL across machines (fsoff runs in one process)"
fi
[ "$DRY" = 1 ] && put_text cannot_test "dry run: nothing ran on a GPU; the CUDA stand-in ran fsoff's CUDA host code on the CPU, with $NGPU device"
echo $(($(date +%s) - START)) >"$LOG/elapsed.json"
put elapsed_s "$LOG/elapsed.json"
say "done in $(cat "$LOG/elapsed.json") s; report $REPORT"

if [ "$build_ok" = 1 ] && [ "$tests_ok" = 1 ]; then
    exit 0
fi
exit 1
