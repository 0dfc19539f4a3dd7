#!/usr/bin/env bash
# checkpoint_cli_test.sh FSOFF — checkpoints and signals as a user meets them.
#
# A reference run saves its last step. Runs killed with SIGKILL after a step
# the seed picks (held there by the test hook FSOFF_TEST_STEP_PAUSE=N:FILE,
# its saves going on) and during a save paused halfway (FSOFF_TEST_SAVE_PAUSE)
# and resumed with --resume end with the reference's state.bin byte for byte,
# and the losses and gradient norms of every step after the resume are the
# reference's, digit for digit. The first SIGTERM or SIGINT (sent while the
# run is held after step 3) is acknowledged at once, while the run is still
# held, then finishes the step, saves and exits 3 (stopped) with a metrics
# file whose every line is JSON, status "stopped", and no NVMe file or lock
# left; a second one dies at once, removing the NVMe files and their locks.
# --resume auto starts a job in an empty save folder and resumes it from the
# same command line, appending to its metrics file (a "resume" event between
# the segments); a damaged checkpoint there is an error, never a fresh start. A failed save of the last step (its temporary folder removed while
# the save is paused) fails the run: status 1, "failed after N of M steps",
# summary "failed", latest as it was. Every moment a signal lands is one the
# run is held at, so no outcome depends on the host's speed; the steps and
# saves chosen come from a seed printed first (CKPT_TEST_SEED=N reruns one).
set -u
FSOFF=${1:?usage: checkpoint_cli_test.sh path/to/fsoff}
. "$(dirname "$0")/lib.sh"

SEED=${CKPT_TEST_SEED:-$$}
RANDOM=$SEED
echo "seed $SEED"

SMALL=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=2
       --set data.seq_len=32 --set train_micro_batch_size_per_gpu=4 --set train.threads=1)
STEPS=24
# --nvme is a place the planner fills; these runs' state is pinned there, so
# that there are NVMe files for a signal to leave or remove
ON_NVME=(--set zero_optimization.offload_param.device=nvme
         --set zero_optimization.offload_optimizer.device=nvme)

# lines of step metrics: "step loss grad_norm", all digits
steps_of() { grep '^{"step"' "$1" | sed -E 's/.*"step": ([0-9]+), "loss": ([^,]*),.*"grad_norm": ([^,]*),.*/\1 \2 \3/'; }
count_steps() { grep -c '^{"step"' "$1" 2>/dev/null || true; }
wait_for() { # FILE-TEST PATH SECONDS
    local i
    for ((i = 0; i < $3 * 50; i++)); do
        test "$1" "$2" && return 0
        sleep 0.02
    done
    return 1
}
wait_line() { # FIXED-STRING FILE SECONDS: until FILE has the string
    local i
    for ((i = 0; i < $3 * 50; i++)); do
        grep -qF -- "$1" "$2" 2>/dev/null && return 0
        sleep 0.02
    done
    return 1
}
json_lines() { # every line of FILE is one JSON value (when python3 is there to say)
    command -v python3 >/dev/null || return 0
    python3 -c 'import json, sys
for l in open(sys.argv[1]): json.loads(l)' "$1"
}
final_state() { echo "$1/step-$(printf %08d $STEPS)/state.bin"; }

# the reference: uninterrupted, one save at the end
if "$FSOFF" "${SMALL[@]}" -n $STEPS --save "$TMP/ref" -m "$TMP/ref.jsonl" >"$TMP/out" 2>"$TMP/err" &&
   [ -s "$(final_state "$TMP/ref")" ] && grep -q '"event": "checkpoint"' "$TMP/ref.jsonl" &&
   grep -qE "^checkpoint step $STEPS \| $TMP/ref/step-0+$STEPS \| [0-9.]+ (KiB|MiB|GiB) in [0-9.]+ s, [0-9.]+ MiB/s \| exposed" "$TMP/out"; then
    ok "a run saves at its end: the event, the line (its size and rate in one unit family)"
else
    bad "a run saves at its end" "$(cat "$TMP/err")"
fi
steps_of "$TMP/ref.jsonl" >"$TMP/ref.steps"

# resume DIR NAME: continue the run in DIR to the end; compare with the reference
resume_and_compare() {
    local dir=$1 name=$2 from
    rm -f "$TMP/res.jsonl" # a resumed run appends to its metrics file
    if [ -e "$dir/latest" ]; then
        from=$(sed 's/step-0*//' "$dir/latest")
        "$FSOFF" "${SMALL[@]}" -n $STEPS --save "$dir" --save-every 3 --resume -m "$TMP/res.jsonl" \
            >"$TMP/out" 2>"$TMP/err"
    else # killed before its first save completed
        from=0
        "$FSOFF" "${SMALL[@]}" -n $STEPS --save "$dir" --save-every 3 -m "$TMP/res.jsonl" \
            >"$TMP/out" 2>"$TMP/err"
    fi
    local rc=$?
    if [ $rc -ne 0 ]; then
        bad "$name" "resume from step ${from:-0}: status $rc" "$(cat "$TMP/err")"
        return
    fi
    if [ "$from" -ge $STEPS ]; then
        bad "$name" "the run had ended before the kill: its save of step $from, the last, was" \
            "complete, so the resume trained nothing to compare"
        return
    fi
    if ! cmp -s "$(final_state "$dir")" "$(final_state "$TMP/ref")"; then
        bad "$name" "resumed from step $from: the final state differs from the reference's"
        return
    fi
    steps_of "$TMP/res.jsonl" >"$TMP/res.steps"
    if [ "$(head -1 "$TMP/res.steps" | cut -d' ' -f1)" != "$((from + 1))" ] ||
       ! grep -qxFf "$TMP/res.steps" "$TMP/ref.steps" ||
       [ "$(grep -cxFf "$TMP/res.steps" "$TMP/ref.steps")" -ne $((STEPS - from)) ]; then
        bad "$name" "resumed from step $from: losses or norms differ" "$(diff "$TMP/res.steps" <(tail -n $((STEPS - from)) "$TMP/ref.steps") | head -4)"
        return
    fi
    ok "$name (resumed from step $from: bit for bit)"
}

# --- kill -9 while training (and saving every 3 steps), after a step the
# seed picks: the run holds there (FSOFF_TEST_STEP_PAUSE), its saves going on
# on their own thread, and is killed. A kill after a delay lands wherever the
# host's speed put the run, after its last save on a fast one; this one lands
# after the same step on every host, and the seed reproduces it.
for k in 1 2 3; do
    dir="$TMP/k$k"
    at=$((RANDOM % (STEPS - 1) + 1))
    rm -f "$TMP/pause"
    FSOFF_TEST_STEP_PAUSE="$at:$TMP/pause" "$FSOFF" "${SMALL[@]}" -n $STEPS --save "$dir" \
        --save-every 3 >/dev/null 2>"$TMP/err" &
    pid=$!
    if ! wait_for -e "$TMP/pause" 60; then
        kill -9 $pid 2>/dev/null
        wait $pid 2>/dev/null
        bad "kill -9 after step $at" "the run did not hold after step $at (status $?)" \
            "$(tail -3 "$TMP/err")"
        continue
    fi
    kill -9 $pid
    wait $pid 2>/dev/null
    killed=$?
    rm -f "$TMP/pause"
    if [ $killed -ne 137 ]; then
        bad "kill -9 after step $at" "status $killed, not 137: the kill did not end the run"
        continue
    fi
    resume_and_compare "$dir" "kill -9 after step $at"
done

# --- kill -9 in the middle of a save (paused halfway by the test hook)
dir="$TMP/kp"
FSOFF_TEST_SAVE_PAUSE="$TMP/pause" "$FSOFF" "${SMALL[@]}" -n $STEPS --save "$dir" --save-every 3 \
    >/dev/null 2>&1 &
pid=$!
saves=$((RANDOM % 4 + 1)) # let the first ones through
for ((i = 1; i < saves; i++)); do
    wait_for -e "$TMP/pause" 20 && rm -f "$TMP/pause"
done
if wait_for -e "$TMP/pause" 20; then
    kill -9 $pid
    wait $pid 2>/dev/null
    rm -f "$TMP/pause"
    if [ -d "$dir/.tmp-step-$(printf %08d $((saves * 3)))" ]; then
        resume_and_compare "$dir" "kill -9 in the middle of save $saves"
    else
        bad "kill -9 in the middle of save $saves" "no half-written checkpoint: $(ls -A "$dir")"
    fi
else
    kill -9 $pid 2>/dev/null
    bad "kill -9 in the middle of a save" "the save never paused"
fi

# --- SIGTERM and SIGINT: said at once; finish the step, save, exit 3, nothing left behind
for sig in TERM INT; do
    dir="$TMP/s$sig"
    mkdir -p "$TMP/nv$sig"
    rm -f "$TMP/pause"
    FSOFF_TEST_STEP_PAUSE="3:$TMP/pause" "$FSOFF" "${SMALL[@]}" -n $STEPS --save "$dir" \
        --nvme "$TMP/nv$sig" "${ON_NVME[@]}" -m "$TMP/s.jsonl" >"$TMP/out" 2>"$TMP/err" &
    pid=$!
    wait_for -e "$TMP/pause" 60 # held after step 3: the signal comes before step 4
    kill -$sig $pid
    # said while the run is still held: the handler's own line, not the step's end
    ack="fsoff: SIG$sig: stopping after the step in progress, then saving it in $dir; a second SIGINT or SIGTERM stops at once without saving"
    acked=yes
    wait_line "$ack" "$TMP/err" 30 && [ -e "$TMP/pause" ] || acked=no
    rm -f "$TMP/pause"
    wait $pid
    rc=$?
    last=$(tail -1 "$TMP/s.jsonl")
    if [ $acked = no ]; then
        bad "SIG$sig: acknowledged at once" "while held after step 3, stderr: $(cat "$TMP/err")"
    else
        ok "SIG$sig: acknowledged at once, while the step is held"
    fi
    if [ $rc -eq 3 ] && json_lines "$TMP/s.jsonl" && [[ $last == '{"event": "summary"'* ]] &&
       [[ $last == *'"status": "stopped"'* ]] &&
       grep -q "fsoff: SIG$sig: stopping after step 3 of $STEPS, saving it first" "$TMP/out" &&
       tail -1 "$TMP/out" | grep -q "^fsoff: stopped by SIG$sig after 3 of $STEPS steps | " &&
       [ -z "$(ls -A "$TMP/nv$sig")" ] && [ -e "$dir/latest" ] &&
       grep -q '"event": "checkpoint"' "$TMP/s.jsonl"; then
        resume_and_compare "$dir" "SIG$sig: status 3, metrics whole, NVMe files gone, saved"
    else
        bad "SIG$sig: finish the step, save, exit 3" "status $rc, last line: ${last:0:60}" \
            "NVMe: $(ls -A "$TMP/nv$sig")" "$(tail -2 "$TMP/err")"
    fi
    rm -f "$TMP/s.jsonl"
done

# --- a second signal: at once, NVMe files removed, the last complete checkpoint intact
dir="$TMP/twice"
mkdir -p "$TMP/nv2"
FSOFF_TEST_SAVE_PAUSE="$TMP/pause" "$FSOFF" "${SMALL[@]}" -n $STEPS --save "$dir" --save-every 3 \
    --nvme "$TMP/nv2" "${ON_NVME[@]}" >"$TMP/out" 2>"$TMP/err" &
pid=$!
wait_for -e "$TMP/pause" 30 && rm -f "$TMP/pause" # the first save goes through
if wait_for -e "$TMP/pause" 30 && [ -e "$dir/latest" ]; then
    kill -TERM $pid
    sleep 0.2 # the run now waits for the paused save
    kill -TERM $pid
    wait $pid
    rc=$?
    rm -f "$TMP/pause"
    if [ $rc -eq $((128 + 15)) ] && [ -z "$(ls -A "$TMP/nv2")" ] &&
       [ "$(cat "$dir/latest")" = "step-00000003" ] && grep -q "second signal" "$TMP/err"; then
        resume_and_compare "$dir" "a second SIGTERM: dies at once, NVMe files gone, latest complete"
    else
        bad "a second SIGTERM" "status $rc, NVMe: $(ls -A "$TMP/nv2")" "latest: $(cat "$dir/latest" 2>&1)" "$(cat "$TMP/err")"
    fi
else
    kill -9 $pid 2>/dev/null
    bad "a second SIGTERM" "the second save never paused"
fi

# --- without --save: stopped, saying nothing is saved
mkdir -p "$TMP/nvn"
rm -f "$TMP/pause"
FSOFF_TEST_STEP_PAUSE="2:$TMP/pause" "$FSOFF" "${SMALL[@]}" -n $STEPS --nvme "$TMP/nvn" \
    "${ON_NVME[@]}" -m "$TMP/n.jsonl" >"$TMP/out" 2>"$TMP/err" &
pid=$!
wait_for -e "$TMP/pause" 60
kill -TERM $pid
rm -f "$TMP/pause"
wait $pid
rc=$?
if [ $rc -eq 3 ] && grep -q "stopping after step 2 of $STEPS (no --save DIR: nothing is saved)" "$TMP/out" &&
   grep -q "^fsoff: SIGTERM: stopping after the step in progress (no --save DIR: nothing is saved); " "$TMP/err" &&
   tail -1 "$TMP/n.jsonl" | grep -q '"status": "stopped"' && [ -z "$(ls -A "$TMP/nvn")" ]; then
    ok "SIGTERM without --save: status 3, stopped, nothing saved, said so"
else
    bad "SIGTERM without --save" "status $rc" "$(tail -3 "$TMP/out")" "$(tail -1 "$TMP/n.jsonl")"
fi

# --- --resume auto: one command line starts the job and restarts it. The
# first run finds no checkpoint and starts from step 0; held after step 5,
# once its save of step 3 is complete, it is killed; the same command line
# then resumes from step 3, its metrics appended after a resume event
dir="$TMP/auto"
AUTO=("${SMALL[@]}" -n 8 --save "$dir" --save-every 3 --resume auto -m "$TMP/auto.jsonl")
rm -f "$TMP/pause"
FSOFF_TEST_STEP_PAUSE="5:$TMP/pause" "$FSOFF" "${AUTO[@]}" >"$TMP/out" 2>"$TMP/err" &
pid=$!
if wait_for -e "$TMP/pause" 60 && wait_line step-00000003 "$dir/latest" 30; then
    kill -9 $pid
    wait $pid 2>/dev/null
    rm -f "$TMP/pause"
    first=$(cat "$TMP/out")
    "$FSOFF" "${AUTO[@]}" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    segs=$(grep -oE '^\{"step": [0-9]+|^\{"event": "resume", "step": [0-9]+' "$TMP/auto.jsonl" |
           sed -E 's/.*"resume", "step": /r/; s/.*"step": //' | tr '\n' ' ')
    if [ $rc -eq 0 ] &&
       grep -qx "fsoff: resume: no checkpoint in $dir yet: starting from step 0 (--resume auto)" <<<"$first" &&
       grep -q "^fsoff: resume: step 3 from $dir/step-00000003 " "$TMP/out" &&
       [ "$segs" = "1 2 3 4 5 r3 4 5 6 7 8 " ] && json_lines "$TMP/auto.jsonl" &&
       grep -qx '{"event": "resume", "step": 3, "checkpoint": "'"$dir"'/step-00000003", "steps": 8}' "$TMP/auto.jsonl" &&
       tail -1 "$TMP/auto.jsonl" | grep -q '"status": "done"'; then
        ok "--resume auto: starts fresh, then resumes; one metrics file, both segments"
    else
        bad "--resume auto: starts fresh, then resumes" "status $rc, steps: $segs" "$first" "$(cat "$TMP/err")"
    fi
    if ! command -v gnuplot >/dev/null; then
        ok "plot of the resumed run's metrics (skipped: gnuplot not installed)"
    elif "$FSOFF" plot "$TMP/auto.jsonl" -o "$TMP/auto.svg" >/dev/null 2>"$TMP/err" &&
         grep -q 'auto.jsonl, 8 steps, resumed 1 time' "$TMP/auto.svg"; then
        ok "plot of the resumed run's metrics: 8 steps, 1 resume"
    else
        bad "plot of the resumed run's metrics" "$(cat "$TMP/err")" "$(grep -o 'fsoff training run[^<]*' "$TMP/auto.svg")"
    fi
else
    kill -9 $pid 2>/dev/null
    rm -f "$TMP/pause"
    bad "--resume auto: starts fresh, then resumes" "the run never held at step 5 with step 3 saved"
fi
# a save folder with a damaged or half-published checkpoint is an error, never a fresh start
cp -r "$TMP/ref" "$TMP/trunc"
truncate -s 4096 "$(final_state "$TMP/trunc")"
cp -r "$TMP/ref" "$TMP/nolatest"
rm "$TMP/nolatest/latest"
for d in trunc:truncated nolatest:"no checkpoint here"; do
    "$FSOFF" "${SMALL[@]}" -n $STEPS --save "$TMP/${d%%:*}" --resume auto >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ $rc -eq 1 ] && grep -q "^fsoff: error: .*${d#*:}" "$TMP/err" && ! grep -q "starting from step 0" "$TMP/out" &&
       ! grep -q '^step ' "$TMP/out"; then
        ok "--resume auto in a folder whose checkpoint is damaged (${d%%:*}): an error, no fresh start"
    else
        bad "--resume auto in a damaged folder (${d%%:*})" "status $rc" "$(cat "$TMP/err")" "$(head -3 "$TMP/out")"
    fi
done

# --- a failed save of the last step fails the run; latest stays as it was
# fail_last_save NAME SIGNAL: a run saving every 12 steps whose save of its
# last step (the end, or the one SIGNAL asks for while step 12's is paused)
# loses its temporary folder while paused
fail_last_save() {
    local name=$1 sig=$2 dir="$TMP/fail$2" n
    FSOFF_TEST_SAVE_PAUSE="$TMP/pause" "$FSOFF" "${SMALL[@]}" -n $STEPS --save "$dir" \
        --save-every 12 -m "$TMP/f.jsonl" >"$TMP/out" 2>"$TMP/err" &
    local pid=$!
    wait_for -e "$TMP/pause" 30 # step 12's save, halfway: the next update waits for it
    [ "$sig" != END ] && kill -"$sig" $pid
    rm -f "$TMP/pause" # it goes through
    if ! wait_for -e "$TMP/pause" 30; then
        kill -9 $pid 2>/dev/null
        bad "$name" "the last save never paused"
        return
    fi
    rm -rf "$dir"/.tmp-step-*
    rm -f "$TMP/pause"
    wait $pid
    local rc=$?
    n=$(count_steps "$TMP/f.jsonl")
    if [ $rc -eq 1 ] && tail -1 "$TMP/out" | grep -q "^fsoff: failed after $n of $STEPS steps (the error above)" &&
       { [ "$sig" = END ] || [ "$n" -lt $STEPS ]; } &&
       grep -q "fsoff: error: checkpoint of step $n: " "$TMP/err" &&
       grep -q '"event": "checkpoint_failed"' "$TMP/f.jsonl" &&
       tail -1 "$TMP/f.jsonl" | grep -q '"status": "failed"' &&
       [ "$(cat "$dir/latest")" = "step-00000012" ]; then
        ok "$name: status 1, failed after $n of $STEPS steps, latest step 12"
    else
        bad "$name" "status $rc, latest: $(cat "$dir/latest" 2>&1)" "$(tail -1 "$TMP/out")" "$(cat "$TMP/err")"
    fi
    rm -f "$TMP/f.jsonl"
}
fail_last_save "a failed save at the end" END
fail_last_save "a failed save asked for by SIGTERM" TERM

# --- what resuming refuses, and bad options
expect_error() { # NAME 'substring'... -- fsoff args
    local name=$1; shift
    local pats=()
    while [ "$1" != "--" ]; do pats+=("$1"); shift; done
    shift
    fails_saying "$name" "${pats[@]}" -- "$FSOFF" "$@" && ok "$name"
}
expect_error "resume another shape" "model.hidden_size is 32" "another shape" -- \
    "${SMALL[@]}" --set model.hidden_size=64 -n $STEPS --resume "$TMP/ref"
expect_error "resume another vocabulary" "model.vocab_size" "vocabulary" -- \
    "${SMALL[@]}" --set model.vocab_size=300 -n $STEPS --resume "$TMP/ref"
expect_error "resume without a folder" "--resume" "--save DIR" -- "${SMALL[@]}" --resume
expect_error "resume auto without a folder" "--resume auto: needs --save DIR" -- "${SMALL[@]}" --resume auto
for how in "" auto; do # nowhere to resume from is a bad command line, said before planning
    "$FSOFF" "${SMALL[@]}" --resume $how >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ $rc -eq 2 ] && ! grep -q '^plan:' "$TMP/out"; then
        ok "--resume${how:+ $how} without --save: status 2, before the plan"
    else
        bad "--resume${how:+ $how} without --save: status 2, before the plan" "status $rc" "$(head -c 300 "$TMP/out")"
    fi
done
mkdir -p "$TMP/empty"
expect_error "resume from nothing" "$TMP/empty" "no checkpoint here" -- "${SMALL[@]}" --resume "$TMP/empty" --save "$TMP/empty"
expect_error "keep 0" "--keep 0" -- --keep 0
expect_error "save-every not a number" "--save-every x" -- --save-every x
touch "$TMP/afile"
expect_error "save into a file" "$TMP/afile" "not a folder" -- "${SMALL[@]}" -n 1 --save "$TMP/afile"

# --- fsoff export: a Hugging Face folder that --init-from reads back; damage named
if "$FSOFF" export "$TMP/ref" "$TMP/hf" --dtype bf16 >"$TMP/out" 2>"$TMP/err" &&
   grep -q "^fsoff: export: step $STEPS of $TMP/ref/step-" "$TMP/out" &&
   grep -q "^fsoff: export: the run started from scratch (no --init-from): there are no token ids" "$TMP/out" &&
   [ -s "$TMP/hf/config.json" ] && [ -s "$TMP/hf/model.safetensors" ] &&
   "$FSOFF" --init-from "$TMP/hf" -n 1 --set data.seq_len=32 >"$TMP/out" 2>"$TMP/err" &&
   grep -q "parameters from Hugging Face folder $TMP/hf" "$TMP/out"; then
    ok "export a checkpoint (bf16) and train from the folder"
else
    bad "export a checkpoint and train from the folder" "$(cat "$TMP/err")"
fi
expect_error "export into a folder that has one" "$TMP/hf" -- export "$TMP/ref" "$TMP/hf"
expect_error "export --dtype" "--dtype fp8" -- export "$TMP/ref" "$TMP/hf2" --dtype fp8
expect_error "export without OUTDIR" "expected CKPT and OUTDIR" -- export "$TMP/ref"
cp -r "$TMP/ref" "$TMP/bad"
state="$(final_state "$TMP/bad")"
printf "QQQQ" | dd of="$state" bs=1 seek=5000 conv=notrunc 2>/dev/null # not what is there
expect_error "export of a corrupted checkpoint" "$state: offset 0: checksum mismatch" -- \
    export "$TMP/bad" "$TMP/hf3"
[ -e "$TMP/hf3" ] && bad "export of a corrupted checkpoint leaves no folder" "$(ls -A "$TMP/hf3")"

# harmless changes are said in one line
if "$FSOFF" "${SMALL[@]}" -n $((STEPS + 2)) --devices cpu:2 --set train_micro_batch_size_per_gpu=2 \
       --resume "$TMP/ref" >"$TMP/out" 2>"$TMP/err" &&
   grep "^fsoff: resume: step $STEPS from $TMP/ref/step-" "$TMP/out" |
       grep -q 'changed since it was saved: devices 1 -> 2, .*train.steps 24 -> 26'; then
    ok "steps and devices changed: accepted, said in one line"
else
    bad "steps and devices changed" "$(grep resume "$TMP/out")" "$(cat "$TMP/err")"
fi

echo "checkpoint cli: $pass passed, $fail failed (seed $SEED)"
[ $fail -eq 0 ]
