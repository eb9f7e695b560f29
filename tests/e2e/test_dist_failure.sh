#!/usr/bin/env bash
# Failure under mpirun: a rank that stops answering ends the job within the timeout with a
# message naming the rank; a killed rank ends the job; ranks with different flags are
# refused at start-up. Each case is bounded in time.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
TRAIN=(train --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2
       --global-batch-size 4 --mock-data --vocab-size 64 --log-interval 1 --eval-iters 0)

# Runs a job in the background, waits for its first log line, signals rank 1, and checks
# the job ends within `limit` seconds, non-zero, with `pattern` in its output. Further
# arguments go to lattice train.
signal_rank1() {
  local sig=$1 limit=$2 pattern=$3 name=$4
  local log=$TMP/$name.log
  "${MPIRUN[@]}" -np 2 "$LATTICE" "${TRAIN[@]}" --train-iters 1000000 --distributed-timeout-minutes 0.1 "${@:5}" \
    > "$log" 2>&1 &
  local job=$!
  wait_for "$log" " iteration " 30
  # The ranks are mpirun's children (never pkill by name: other tests run lattice too);
  # rank 1 is the later of the two.
  local victim
  victim=$(pgrep -P "$job" -f "train --num-layers 2" | sort -n | tail -1)
  [[ -n $victim ]] || { fail "$name: no rank process found under mpirun $job"; kill -KILL $job; wait $job; return; }
  kill -"$sig" "$victim"
  local start=$SECONDS rc=0
  for _ in $(seq 1 $((limit * 10))); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
  if kill -0 $job 2>/dev/null; then
    fail "$name: the job still runs $limit s after SIG$sig to one rank"
    pkill -KILL -P "$job"; kill -KILL "$job"; wait $job
    return
  fi
  wait $job || rc=$?
  [[ $rc -ne 0 ]] || fail "$name: the job exited 0"
  grep -Eq "$pattern" "$log" || fail "$name: no '$pattern' in the output: $(tail -3 "$log")"
  pass "$name: job ended in $((SECONDS - start)) s, exit $rc"
  kill -KILL "$victim" 2>/dev/null; true
}

signal_rank1 STOP 60 "rank 0: timed out .* waiting in .* on the .* group" hung-rank
signal_rank1 KILL 60 "rank 1|process rank" killed-rank
# A pipeline stage that stops answering: the other stage names itself, the micro-batch
# and the transfer it waits for.
signal_rank1 STOP 60 "rank [01]: timed out .* waiting in [a-z_]+ on the (pp|embedding) group \(stage [01][,:] " \
  hung-pipeline-stage --pipeline-model-parallel-size 2

# Different flags on different ranks are refused before training (mpirun adds its own
# banner to stderr, so the check is for lattice's line in it).
rc=0
"${MPIRUN[@]}" -np 1 "$LATTICE" "${TRAIN[@]}" --train-iters 2 --seed 1 : \
  -np 1 "$LATTICE" "${TRAIN[@]}" --train-iters 2 --seed 2 > "$TMP/mismatch.log" 2>&1 || rc=$?
if [[ $rc -ne 0 ]] && grep -q "rank 1 runs --seed 2 but rank 0 runs 1: every rank must get the same flags" "$TMP/mismatch.log" \
   && ! grep -q " iteration " "$TMP/mismatch.log"; then
  pass "mismatched flags refused: $(grep -m1 'every rank' "$TMP/mismatch.log")"
else
  fail "mismatched flags: exit $rc, output: $(tail -5 "$TMP/mismatch.log")"
fi
# SIGTERM with --exit-signal-handler under mpirun: every rank stops after the same
# iteration, rank 0 saves, and the job exits 0 (no rank left waiting in a collective).
"${MPIRUN[@]}" -np 2 "$LATTICE" "${TRAIN[@]}" --train-iters 1000000 --exit-signal-handler --save "$TMP/sigckpt" \
  > "$TMP/sigterm.log" 2>&1 &
job=$!
wait_for "$TMP/sigterm.log" " iteration " 30
kill -TERM "$(pgrep -P "$job" -f "train --num-layers 2" | sort -n | tail -1)"
rc=0
for _ in $(seq 1 300); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
if kill -0 $job 2>/dev/null; then
  fail "sigterm: the job still runs 30 s after SIGTERM to rank 1"; pkill -KILL -P "$job"; kill -KILL "$job"
fi
wait $job || rc=$?
if [[ $rc -eq 0 ]] && grep -q "exiting after iteration" "$TMP/sigterm.log" && [[ -f $TMP/sigckpt/latest_checkpointed_iteration.txt ]]; then
  pass "sigterm to one rank: all ranks stopped together, checkpoint at iteration $(cat "$TMP/sigckpt/latest_checkpointed_iteration.txt")"
else
  fail "sigterm: exit $rc, output: $(tail -3 "$TMP/sigterm.log")"
fi

# --check-weight-hash-across-dp-replicas-interval: DP 2 with the distributed optimizer matches at
# every check; with one replica's final norm nudged (the test hook) both ranks stop at the check,
# non-zero, naming the parameter and the two ranks, and write no checkpoint of the diverged model.
if timeout 120 "${MPIRUN[@]}" -np 2 "$LATTICE" "${TRAIN[@]}" --train-iters 4 --use-distributed-optimizer \
     --check-weight-hash-across-dp-replicas-interval 2 > "$TMP/hash.log" 2>&1 &&
   [[ $(grep -c "weight hashes match across data-parallel replicas after iteration [24]$" "$TMP/hash.log") -eq 2 ]]; then
  pass "weight hashes: DP 2 replicas match at iterations 2 and 4"
else
  fail "weight hashes: $(tail -3 "$TMP/hash.log")"
fi
rc=0
timeout 120 "${MPIRUN[@]}" -np 2 -x LATTICE_TEST_PERTURB_REPLICA=1 "$LATTICE" "${TRAIN[@]}" --train-iters 4 \
  --check-weight-hash-across-dp-replicas-interval 2 --save "$TMP/hashckpt" --save-interval 2 > "$TMP/hash_bad.log" 2>&1 || rc=$?
if [[ $rc -ne 0 && $rc -ne 124 ]] &&
   grep -q "after iteration 2 parameter decoder.final_layernorm.bias differs between its data-parallel replicas on ranks 0 (CRC-32 [0-9a-f]*) and 1" "$TMP/hash_bad.log" &&
   ! grep -q "iteration        3/" "$TMP/hash_bad.log" && [[ ! -e $TMP/hashckpt/latest_checkpointed_iteration.txt ]]; then
  pass "weight hashes: a nudged replica stops both ranks at the check (exit $rc), named, nothing saved"
else
  fail "weight hashes with a nudged replica: exit $rc, output: $(grep -v '^ *iteration' "$TMP/hash_bad.log" | tail -4)"
fi
e2e_finish
