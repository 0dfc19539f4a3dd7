#!/usr/bin/env bash
# boxes_train_test.sh FSOFF — training across boxes as a user runs it: two
# fsoff processes under `mpirun -np 2`, one box each, over loopback TCP.
#
#  - two boxes of one CPU device end with one box of two devices' losses and
#    gradient norms, digit for digit, and its checkpoint's state.bin byte for
#    byte, with the state on the device, in host memory and on NVMe, fp32
#    and bf16 (one micro-batch a step: the same two fp32 values summed);
#  - two boxes of two devices agree with one box of four within rounding
#    (two micro-batches a step);
#  - a checkpoint saved on two boxes resumes on one and one saved on one
#    resumes on two, each ending with the uninterrupted run's state.bin;
#  - every step after the first sends the same net_bytes, which
#    `fsoff plan --boxes 2 --json` predicts;
#  - box 1 killed (SIGKILL) or stopped (SIGSTOP) while box 0 waits on it:
#    the run ends non-zero within the timeout, box 0 naming box 1, and the
#    last checkpoint resumes;
#  - SIGTERM to mpirun stops both boxes after the same step, saved once
#    (the checkpoint holds both boxes' slices);
#  - boxes with different configurations, boxes whose plans differ (each
#    plans on its own machine), or a save folder each box sees on its own,
#    are refused at the start naming box 1.
#
# Skipped (77) without mpirun or in a build without MPI.
set -u
FSOFF=$(realpath "${1:?usage: boxes_train_test.sh path/to/fsoff}")
. "$(dirname "$0")/lib.sh"

command -v mpirun >/dev/null || { echo "mpirun not found (Debian: apt-get install openmpi-bin)"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,tcp \
    OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo \
    OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIRUN=(mpirun -np 2 --bind-to none)
if ! "$FSOFF" --version | grep -q 'mpi: yes'; then
    echo "this fsoff was built without MPI (meson setup -Dmpi=enabled with libopenmpi-dev)"
    exit 77
fi

cd "$TMP" || exit 1
SMALL=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=2
       --set data.seq_len=32 --set train.threads=1 --set comm.timeout_s=20)
NVME=(--set zero_optimization.offload_param.nvme_path="$TMP"
      --set zero_optimization.offload_optimizer.nvme_path="$TMP")
steps_of() { grep '^{"step"' "$1" | sed -E 's/.*"step": ([0-9]+), "loss": ([^,]*),.*"grad_norm": ([^,]*),.*/\1 \2 \3/'; }
net_of() { grep '^{"step"' "$1" | sed -E 's/.*"net_bytes": ([0-9]+),.*/\1/'; }
latest_state() { echo "$1/$(tr -d '\n' < "$1/latest")/state.bin"; }
# boxes CMD...: CMD on two boxes (wrapper scripts below tell the boxes
# apart by OMPI_COMM_WORLD_RANK)
boxes() { "${MPIRUN[@]}" "$@"; }

# ---------------------------------------------------------------- bits
for tiers in "none none" "cpu cpu" "nvme nvme"; do
    set -- $tiers
    for bf16 in false true; do
        name="2 boxes x 1 device = 1 box x 2 devices ($1/$2, bf16 $bf16)"
        args=("${SMALL[@]}" "${NVME[@]}" --steps 4 --set train_micro_batch_size_per_gpu=2
              --set gradient_accumulation_steps=1 --set bf16.enabled=$bf16
              --set zero_optimization.offload_param.device=$1
              --set zero_optimization.offload_optimizer.device=$2)
        rm -rf one two
        "$FSOFF" --devices cpu:2 "${args[@]}" --metrics one.jsonl --save one >one.out 2>&1 ||
            { bad "$name" "one box failed" "$(tail -5 one.out)"; continue; }
        boxes "$FSOFF" --devices cpu:1 "${args[@]}" --metrics two.jsonl --save two >two.out 2>&1 ||
            { bad "$name" "two boxes failed" "$(tail -8 two.out)"; continue; }
        if [ "$(steps_of one.jsonl)" != "$(steps_of two.jsonl)" ]; then
            bad "$name" "losses or norms differ" "$(diff <(steps_of one.jsonl) <(steps_of two.jsonl) | head -6)"
        elif ! cmp -s "$(latest_state one)" "$(latest_state two)"; then
            bad "$name" "state.bin differs" "$(cmp "$(latest_state one)" "$(latest_state two)" 2>&1)"
        else
            ok "$name"
        fi
    done
done

# ---------------------------------------------------------------- rounding
name="2 boxes x 2 devices agree with 1 box x 4 devices (2 micro-batches a step)"
args=("${SMALL[@]}" --steps 4 --set train_micro_batch_size_per_gpu=1
      --set gradient_accumulation_steps=2)
"$FSOFF" --devices cpu:4 "${args[@]}" --metrics four.jsonl >four.out 2>&1 &&
    boxes "$FSOFF" --devices cpu:2 "${args[@]}" --metrics twotwo.jsonl >twotwo.out 2>&1
if [ $? -ne 0 ]; then
    bad "$name" "a run failed" "$(tail -5 four.out twotwo.out)"
elif ! paste -d' ' <(steps_of four.jsonl) <(steps_of twotwo.jsonl) | awk '
        function rel(a, b) { d = a - b; if (d < 0) d = -d; if (b < 0) b = -b; return d / (b > 1e-12 ? b : 1e-12) }
        NF != 6 || rel($2, $5) > 1e-5 || rel($3, $6) > 1e-4 { bad = 1 } END { exit bad }'; then
    bad "$name" "beyond rounding" "$(paste -d' ' <(steps_of four.jsonl) <(steps_of twotwo.jsonl))"
else
    ok "$name"
fi

# ---------------------------------------------------------------- net bytes
name="net_bytes: every step after the first sends what fsoff plan --boxes 2 predicts"
mapfile -t nets < <(net_of twotwo.jsonl)
want=$("$FSOFF" plan --devices cpu:2 --boxes 2 --net-gbps 1 "${args[@]}" --json 2>/dev/null |
       tr ',{' '\n\n' | sed -nE 's/.*"net_bytes": *([0-9]+).*/\1/p' | head -1)
if [ ${#nets[@]} -ne 4 ] || [ "${nets[1]}" = 0 ] || [ "${nets[1]}" != "${nets[2]}" ] ||
   [ "${nets[2]}" != "${nets[3]}" ]; then
    bad "$name" "net_bytes per step: ${nets[*]}"
elif [ -n "$want" ] && [ "$want" != "${nets[1]}" ]; then
    bad "$name" "sent ${nets[1]}, the plan says $want"
else
    ok "$name (${nets[1]} bytes a step${want:+, as planned})"
fi

# ---------------------------------------------------------------- stop, save, resume
# A run of 6 steps (its schedule is the 6 steps') held after step 3 by the
# test hook on every box, SIGTERM while held, then released: every box stops
# after step 3 and saves it once. The checkpoint then resumes on the other
# box count.
args=("${SMALL[@]}" --set train_micro_batch_size_per_gpu=2 --set gradient_accumulation_steps=1
      --set checkpoint.every_steps=2 --steps 6)
cat > holder.sh <<EOF
#!/usr/bin/env bash
export FSOFF_TEST_STEP_PAUSE=3:$TMP/hold.\$OMPI_COMM_WORLD_RANK
exec "$FSOFF" "\$@"
EOF
chmod +x holder.sh
stopped_at_3() { # BOXES ARGS...: the status of the run stopped after step 3
    local n=$1 i p rc; shift
    rm -f hold.*
    # signalled, mpirun sends every box SIGCONT, odls_base_sigkill_timeout
    # seconds later SIGTERM, and as long again later SIGKILL: released 2 s
    # after the SIGTERM, the boxes have 3 s to save and end
    if [ "$n" = 2 ]; then
        OMPI_MCA_odls_base_sigkill_timeout=5 "${MPIRUN[@]}" ./holder.sh "$@" & # $!: mpirun
    else
        OMPI_COMM_WORLD_RANK=0 ./holder.sh "$@" &
    fi
    p=$!
    for ((i = 0; i < 600; i++)); do
        [ -e hold.0 ] && { [ "$n" = 1 ] || [ -e hold.1 ]; } && break
        sleep 0.1
    done
    kill -TERM $p
    if [ "$n" = 2 ]; then sleep 7; else sleep 1; fi
    rm -f hold.0 hold.1
    wait $p
}
rm -rf ref b2 b1
"$FSOFF" --devices cpu:2 "${args[@]}" --save ref >ref.out 2>&1 || bad "reference run" "$(tail -5 ref.out)"

name="SIGTERM to mpirun: both boxes stop after step 3, save it once"
t0=$SECONDS
stopped_at_3 2 --devices cpu:1 "${args[@]}" --save b2 --metrics b2.jsonl >b2.out 2>&1
mrc=$?
took=$((SECONDS - t0))
# box 0 speaks for the run; box 1's slices are in the checkpoint only if it
# stopped after the same step and saved
if [ "$(tr -d '\n' < b2/latest 2>/dev/null)" != step-00000003 ]; then
    bad "$name" "latest: $(cat b2/latest 2>/dev/null) (want step-00000003)" "$(tail -6 b2.out)"
elif [ "$(grep -c '^{"step"' b2.jsonl)" -ne 3 ] || [ "$(grep -c '"checkpoint"' b2.jsonl)" -ne 2 ] ||
     ! grep -q '"status": "stopped"' b2.jsonl; then
    bad "$name" "metrics: $(grep -c '^{"step"' b2.jsonl) steps, $(grep -c '"checkpoint"' b2.jsonl) saves, $(grep -o '"status": "[a-z]*"' b2.jsonl) (want 3, 2: steps 2 and 3, stopped)"
else
    ok "$name (${took} s; mpirun's status $mrc)"
fi
name="saved on 2 boxes at step 3, resumed on 1 box of 2 devices: the uninterrupted run's state"
if "$FSOFF" --devices cpu:2 "${args[@]}" --save b2 --resume >b2r.out 2>&1; then
    cmp -s "$(latest_state ref)" "$(latest_state b2)" && ok "$name" ||
        bad "$name" "state.bin differs from the uninterrupted run's"
else
    bad "$name" "the resume failed" "$(tail -5 b2r.out)"
fi
name="saved on 1 box of 2 devices at step 3, resumed on 2 boxes: the uninterrupted run's state"
stopped_at_3 1 --devices cpu:2 "${args[@]}" --save b1 >b1.out 2>&1
rc=$?
if [ $rc -ne 3 ] || [ "$(tr -d '\n' < b1/latest 2>/dev/null)" != step-00000003 ]; then
    bad "$name" "the run stopped with status $rc, latest $(cat b1/latest 2>/dev/null) (want 3, step 3)" "$(tail -5 b1.out)"
elif boxes "$FSOFF" --devices cpu:1 "${args[@]}" --save b1 --resume >b1r.out 2>&1; then
    cmp -s "$(latest_state ref)" "$(latest_state b1)" && ok "$name" ||
        bad "$name" "state.bin differs from the uninterrupted run's"
else
    bad "$name" "the resume failed" "$(tail -5 b1r.out)"
fi

# ---------------------------------------------------------------- a box dies or stalls
# box 1 holds after step 5 (the test hook; steps 2 and 4 saved), box 0 goes on
# and waits for it in step 6's rails; then box 1 is killed or stopped
cat > box.sh <<EOF
#!/usr/bin/env bash
echo \$\$ > "$TMP/pid.\$OMPI_COMM_WORLD_RANK"
[ "\$OMPI_COMM_WORLD_RANK" = 1 ] && export FSOFF_TEST_STEP_PAUSE=5:$TMP/hold
exec "$FSOFF" "\$@"
EOF
chmod +x box.sh
dead_box() { # NAME SIGNAL PATTERN: the output names box 1 so
    local name=$1 sig=$2 want=$3
    rm -rf dead hold pid.* dead.out
    local t0=$SECONDS
    "${MPIRUN[@]}" ./box.sh --devices cpu:1 "${args[@]}" --set comm.timeout_s=5 --save dead \
        >dead.out 2>&1 &
    local mp=$! i
    for ((i = 0; i < 600; i++)); do [ -e hold ] && break; sleep 0.1; done
    if [ ! -e hold ]; then
        kill -KILL $mp 2>/dev/null
        bad "$name" "box 1 never reached step 5" "$(tail -5 dead.out)"
        return
    fi
    sleep 1 # box 0 is in step 6 now, waiting on box 1
    kill -"$sig" "$(cat pid.1)"
    local rc=0 waited=0
    while kill -0 $mp 2>/dev/null && [ $waited -lt 60 ]; do sleep 1; waited=$((waited + 1)); done
    if kill -0 $mp 2>/dev/null; then
        kill -KILL $mp; kill -KILL "$(cat pid.1)" "$(cat pid.0)" 2>/dev/null
        bad "$name" "still running 60 s later" "$(tail -5 dead.out)"
        return
    fi
    wait $mp; rc=$?
    kill -KILL "$(cat pid.1)" 2>/dev/null
    if [ $rc -eq 0 ]; then
        bad "$name" "exit status 0" "$(tail -5 dead.out)"
    elif ! grep -Eq "$want" dead.out; then
        bad "$name" "nothing names box 1 ($want)" "$(tail -8 dead.out)"
    elif ! "$FSOFF" --devices cpu:2 "${args[@]}" --save dead --resume >deadr.out 2>&1 ||
         ! cmp -s "$(latest_state ref)" "$(latest_state dead)"; then
        bad "$name" "the last checkpoint does not resume to the uninterrupted run's state" \
            "$(tail -5 deadr.out)"
    else
        ok "$name (exit $rc after $((SECONDS - t0)) s)"
    fi
}
# a process that dies is mpirun's to see first: it ends the job at once,
# naming its rank (the box); a box that stalls is fsoff's to name
dead_box "box 1 killed mid-step: the run ends naming it, the last checkpoint resumes" KILL \
    'box 1|rank 1'
dead_box "box 1 stopped mid-step: box 0 fails naming it within the timeout" STOP \
    'box 1 [(]host [^)]*[)]: no heartbeat'


# ---------------------------------------------------------------- refusals
name="boxes with different configurations are refused, naming box 1 and the difference"
cat > differ.sh <<EOF
#!/usr/bin/env bash
steps=4; [ "\$OMPI_COMM_WORLD_RANK" = 1 ] && steps=5
exec "$FSOFF" "\$@" --steps \$steps
EOF
chmod +x differ.sh
if boxes ./differ.sh --devices cpu:1 "${SMALL[@]}" >differ.out 2>&1; then
    bad "$name" "it trained"
elif ! grep -q 'box 1' differ.out || ! grep -q 'steps' differ.out; then
    bad "$name" "the message does not name box 1 and the key" "$(grep -i error differ.out | head -3)"
else
    ok "$name"
fi
name="boxes whose plans differ (box 1 has less device memory) are refused, naming box 1"
cat > plans.sh <<EOF
#!/usr/bin/env bash
extra=(); [ "\$OMPI_COMM_WORLD_RANK" = 1 ] && extra=(--device-mem 1600K)
exec "$FSOFF" "\$@" "\${extra[@]}"
EOF
chmod +x plans.sh
if boxes ./plans.sh --devices cpu:1 "${SMALL[@]}" --steps 2 >plans.out 2>&1; then
    bad "$name" "it trained"
elif ! grep -q 'planned configuration.*box 1.*resident_blocks' plans.out; then
    bad "$name" "the message does not name box 1 and the planned key" "$(grep -i error plans.out | head -3)"
else
    ok "$name"
fi
name="a save folder that each box sees on its own is refused, naming box 1"
cat > private.sh <<EOF
#!/usr/bin/env bash
mkdir -p "$TMP/private.\$OMPI_COMM_WORLD_RANK"
cd "$TMP/private.\$OMPI_COMM_WORLD_RANK" && exec "$FSOFF" "\$@"
EOF
chmod +x private.sh
if boxes ./private.sh --devices cpu:1 "${SMALL[@]}" --steps 2 --save saves >private.out 2>&1; then
    bad "$name" "it trained"
elif ! grep -q 'box 1' private.out || ! grep -q 'checkpoint.dir' private.out; then
    bad "$name" "the message does not name box 1 and checkpoint.dir" "$(grep -i error private.out | head -3)"
else
    ok "$name"
fi

echo "boxes_train_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
