#!/usr/bin/env bash
# Megatron's result checks with --rerun-mode disabled: --check-for-spiky-loss and --check-for-large-grads
# stop training before the update of a step whose micro-batch loss or gradient norm is 10 or more times
# the largest of the first 100 samples (carried by the checkpoint, so a resumed run checks as an
# uninterrupted one), the same under data, pipeline and context parallelism as in one process;
# --result-rejected-tracker-filename records each rejection in Megatron's line format, and an
# iteration it shows rejected twice is skipped by the next run, as --iterations-to-skip skips one
# (its samples consumed, no update and no scheduler step); bad input is a one-line error (a damaged
# checkpoint's samples: tests/unit/test_result_validation.cpp).
#   bash tests/e2e/test_result_validation.sh <lattice> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

BASE=(train --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16
      --micro-batch-size 1 --global-batch-size 2 --eval-iters 0 --mock-data --vocab-size 64 --log-interval 1
      --hidden-dropout 0 --attention-dropout 0)
# 100 steps at learning rate 0: 200 micro-batch losses and 100 gradient norms, the first 100 of each
# sampled (the largest about 70 and 3).
if ! run warm "$LATTICE" "${BASE[@]}" --lr 0 --train-iters 100 --save ck --check-for-spiky-loss --check-for-large-grads; then
  e2e_finish
fi
python3 - ck/iter_0000100/checkpoint.json <<'EOF' && pass "the checkpoint carries the 100 samples of each check" || fail "rerun_state_machine: $(grep -o '"rerun_state_machine":{[^}]*}[^}]*}' ck/iter_0000100/checkpoint.json)"
import json, sys
s = json.load(open(sys.argv[1]))["rerun_state_machine"]
assert s["large_value_counts"] == {"loss": 100, "grads": 100}, s
assert 20 < s["max_values"]["loss"] < 200 and 0 < s["max_values"]["grads"] < 20, s
EOF
# Resumed at learning rate 100: iteration 101's update throws the weights far, and iteration 102's
# losses and gradients are thousands of times the samples'.
SPIKE=("${BASE[@]}" --lr 100 --lr-decay-style constant --override-opt_param-scheduler --train-iters 104 --load ck)
expect_error "a spiky loss" "iteration 102: micro-batch 0's loss|10 or more times the largest of the first 100|--check-for-spiky-loss" -- \
  "$LATTICE" "${SPIKE[@]}" --check-for-spiky-loss --result-rejected-tracker-filename tracker.txt
expect_error "large gradients" "iteration 102: the gradient norm|first 100 steps'|--check-for-large-grads" -- \
  "$LATTICE" "${SPIKE[@]}" --check-for-large-grads --result-rejected-tracker-filename tracker.txt
[ "$(cat ck/latest_checkpointed_iteration.txt)" = 100 ] && pass "the rejected steps left the checkpoints as they were" ||
  fail "latest checkpoint after the rejections: $(cat ck/latest_checkpointed_iteration.txt)"
# Megatron's tracker line, the 0-based step index (101 = the iteration logged as 102).
re="^ts=[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:.]+ node=[^ ]+ device=0 jobID=[^ ]+ rank=0 iteration=101 status=rerun_disabled result=[0-9.e+]+ message='"
if [ "$(grep -Ec "${re}Spiky loss'$" tracker.txt)" = 1 ] && [ "$(grep -Ec "${re}found unexpected large grads'$" tracker.txt)" = 1 ] &&
   [ "$(wc -l <tracker.txt)" = 2 ]; then
  pass "each rejection is one tracker line in Megatron's format"
else
  fail "tracker file: $(cat tracker.txt)"
fi
# Without the checks the same run trains on through the spike.
run nocheck "$LATTICE" "${SPIKE[@]}" && grep -q "iteration      104/" nocheck.out && pass "without the checks the run trains on"

# The same decision under data, pipeline and context parallelism: the same iteration and micro-batch
# (the values agree to rounding; the learning rate of 100 magnifies it).
one=$( "$LATTICE" "${SPIKE[@]}" --check-for-spiky-loss 2>&1 | grep -o "iteration [0-9]*: micro-batch [0-9]*'s loss (the sum of its token losses) [0-9.e+]*")
if command -v mpirun >/dev/null 2>&1 && [ -n "$one" ]; then
  for layout in "" "--pipeline-model-parallel-size 2" "--context-parallel-size 2"; do
    name="layout ${layout:-data parallel 2}"
    got=$(mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$LATTICE" "${SPIKE[@]}" $layout \
            --check-for-spiky-loss 2>&1 | grep -o "iteration [0-9]*: micro-batch [0-9]*'s loss (the sum of its token losses) [0-9.e+]*" | sort -u)
    if [ "$(echo "$got" | wc -l)" = 1 ] && [ "${got% *}" = "${one% *}" ] &&
       awk -v a="${got##* }" -v b="${one##* }" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-3 * b) }'; then
      pass "$name: every rank rejects as one process does ($got)"
    else
      fail "$name: '$got' against one process's '$one'"
    fi
  done
fi

# The tracker shows iteration index 101 rejected twice: the next run skips it (consuming its samples)
# and meets the spike of the update made at iteration 101 one iteration later.
expect_error "the skipped iteration" "iteration 103: the gradient norm" -- \
  "$LATTICE" "${SPIKE[@]}" --check-for-large-grads --result-rejected-tracker-filename tracker.txt
grep -q "> iteration 102 skipped (step index 101 of --iterations-to-skip or --result-rejected-tracker-filename): its 2 samples consumed without a step" \
  "$TMP/.stdout" && pass "the iteration the tracker shows rejected twice is skipped" || fail "no skip line: $(grep '> iteration' "$TMP/.stdout")"

# --iterations-to-skip 1 3: the iterations logged as 2 and 4 consume their samples without a step; the
# scheduler does not step for them, so iteration 5's learning rate is an unskipped run's third.
SKIP=("${BASE[@]}" --lr 1e-2 --lr-decay-style linear --lr-decay-iters 10 --train-iters 5)
if run skip "$LATTICE" "${SKIP[@]}" --iterations-to-skip 1 3 && run plain "$LATTICE" "${SKIP[@]}"; then
  logged=$(grep -o "iteration *[0-9]*/" skip.out | tr -d ' /' | sed 's/iteration//' | tr '\n' ' ')
  lr5=$(grep "iteration        5/" skip.out | grep -o "learning rate: [0-9.E+-]*")
  lr3=$(grep "iteration        3/" plain.out | grep -o "learning rate: [0-9.E+-]*")
  consumed=$(grep "iteration        5/" skip.out | grep -o "consumed samples: *[0-9]*" | tr -s ' ')
  if [ "$logged" = "1 3 5 " ] && [ "$lr5" = "$lr3" ] && [ "$consumed" = "consumed samples: 10" ] &&
     [ "$(grep -c '> iteration [24] skipped' skip.out)" = 2 ]; then
    pass "--iterations-to-skip 1 3: iterations 2 and 4 skipped, $consumed, iteration 5's $lr5 = an unskipped run's third"
  else
    fail "--iterations-to-skip: logged '$logged', '$lr5' against '$lr3', '$consumed'"
  fi
fi

# Bad input.
expect_error "an iteration that is not a number" "--iterations-to-skip: invalid value 'x'" -- \
  "$LATTICE" "${SKIP[@]}" --iterations-to-skip 1 x
expect_error "a negative iteration" "--iterations-to-skip: -2 is not an iteration index" -- \
  "$LATTICE" "${SKIP[@]}" --iterations-to-skip=-2
printf 'ts=2026-01-01 00:00:00.0 node=n device=0 jobID=N/A rank=0 iteration=4 status=rerun_disabled result=1 message=\x27x\x27\nnot a record\n' >bad_tracker.txt
expect_error "a tracker line that is not a record" "--result-rejected-tracker-filename bad_tracker.txt line 2: not a result-rejected record" -- \
  "$LATTICE" "${SKIP[@]}" --result-rejected-tracker-filename bad_tracker.txt
expect_error "a tracker file in a missing directory" "--result-rejected-tracker-filename no/such/dir/t.txt: cannot be appended to" -- \
  "$LATTICE" "${SKIP[@]}" --result-rejected-tracker-filename no/such/dir/t.txt
expect_error "an unknown error injection type" "--error-injection-type must be one of correct_result, transient_error, persistent_error" -- \
  "$LATTICE" "${SKIP[@]}" --error-injection-type sometimes
e2e_finish
