#!/usr/bin/env bash
# --rampup-batch-size START INCREMENT SAMPLES (Megatron's batch-size ramp-up) as a user runs it:
# each iteration's global batch and consumed samples (4 -> 8 by 2 over 16 samples: batches
# 4 4 6 6 8 8 for 40 samples), the learning rate stepped by each batch (lattice schedule prints
# the same), data parallel and pipeline parallel runs equal to one process, a run stopped and
# resumed mid-ramp equal to the straight run, and the flag's errors.
#   bash tests/e2e/test_batch_rampup.sh <lattice> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

BASE=(train --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16
      --global-batch-size 8 --lr 1e-3 --log-interval 1 --seed 1234 --peak-tflops 1 --mock-data --vocab-size 64
      --eval-iters 0 --hidden-dropout 0.1 --attention-dropout 0.1)
RAMP=("${BASE[@]}" --micro-batch-size 1 --train-samples 40 --lr-warmup-samples 8 --rampup-batch-size 4 2 16)
# field FILE KEY: the values of "KEY" in a JSONL file, one per line, as written
field() { grep -o "\"$2\":[^,}]*" "$1" | cut -d: -f2; }

if "$LATTICE" "${RAMP[@]}" --metrics-file one.jsonl >one.log 2>&1; then
  batches=$(grep -o 'global batch size: *[0-9]*' one.log | awk '{print $NF}' | tr '\n' ' ')
  consumed=$(field one.jsonl consumed_samples | tr '\n' ' ')
  [ "$batches" = "4 4 6 6 8 8 " ] && pass "global batch sizes $batches" || fail "global batch sizes '$batches', want 4 4 6 6 8 8"
  [ "$consumed" = "4 8 14 20 28 36 " ] && pass "consumed samples $consumed" ||
    fail "consumed samples '$consumed', want 4 8 14 20 28 36"
  grep -qF "global batch size ramps from 4 to 8 in steps of 2 over 16 samples: 6 iterations for 40 samples" one.log ||
    fail "the ramp is not announced"
  "$LATTICE" schedule "${RAMP[@]:1}" >schedule.csv 2>schedule.err || fail "lattice schedule: $(cat schedule.err)"
  want=$(field one.jsonl learning_rate | head -n 6 | tr '\n' ' ')
  got=$(sed -n '3,8p' schedule.csv | cut -d, -f3 | tr '\n' ' ')
  node -e 'const [a, b] = process.argv.slice(1).map((s) => s.trim().split(/ +/).map(Number));
           process.exit(a.length === 6 && a.every((x, i) => Math.abs(x - b[i]) <= 1e-6 * Math.abs(b[i])) ? 0 : 1)' \
       "$got" "$want" 2>/dev/null &&
    pass "lattice schedule gives the run's learning rates ($got)" ||
    fail "lattice schedule's learning rates '$got', the run's '$want'"
  [ "$(sed -n '2,8p' schedule.csv | cut -d, -f2 | tr '\n' ' ')" = "0 4 8 14 20 28 36 " ] ||
    fail "lattice schedule's consumed samples: $(sed -n '2,8p' schedule.csv | cut -d, -f2 | tr '\n' ' ')"
else
  fail "the ramp-up run failed: $(tail -n 3 one.log)"
fi

# ---- --dry-run shows the ramp's micro-batches ----
if "$LATTICE" "${RAMP[@]}" --dry-run >dry.out 2>&1 &&
   grep -qF "micro-batches per rank and iteration along the ramp: 4, 6, 8" dry.out; then
  pass "--dry-run: micro-batches along the ramp 4, 6, 8"
else
  fail "--dry-run with a ramp: $(head -n 3 dry.out)"
fi

# ---- layouts: the same losses and gradient norms as one process ----
same_run() {  # NAME: NAME.jsonl against one.jsonl, 1e-5 relative
  for key in lm_loss grad_norm; do
    worst=$(paste <(field one.jsonl $key) <(field "$1.jsonl" $key) |
      awk 'NF != 2 { bad = 1 } { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > w) w = r; n++ }
           END { if (bad || n != 6) print "mismatch"; else printf "%.2e", w }')
    if [ "$worst" != mismatch ] && awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }'; then
      pass "$1: $key of the 6 iterations within $worst of one process"
    else
      fail "$1: $key differs from one process ($worst)"
    fi
  done
}
if command -v mpirun >/dev/null 2>&1; then
  MPI=(mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$LATTICE")
  "${MPI[@]}" "${RAMP[@]}" --metrics-file dp2.jsonl --use-distributed-optimizer >dp2.log 2>&1 && same_run dp2 ||
    fail "DP=2 ramp-up run failed: $(tail -n 3 dp2.log)"
  "${MPI[@]}" "${RAMP[@]}" --metrics-file pp2.jsonl --pipeline-model-parallel-size 2 >pp2.log 2>&1 && same_run pp2 ||
    fail "PP=2 ramp-up run failed: $(tail -n 3 pp2.log)"
  # (every rank reports it, mpirun adds its own lines)
  if "${MPI[@]}" "${BASE[@]}" --micro-batch-size 2 --train-samples 40 --rampup-batch-size 4 2 16 >dp_bad.log 2>&1; then
    fail "DP=2 with micro-batch 2 accepted the ramp's batch of 6"
  elif grep -q "^lattice train: error: --rampup-batch-size: the global batch size 6 is not a multiple of --micro-batch-size 2 x data-parallel size 2$" dp_bad.log; then
    pass "DP=2, micro-batch 2: the ramp's batch of 6 is refused, naming the flag"
  else
    fail "DP=2 bad ramp: $(grep error dp_bad.log | head -n 1)"
  fi
  # A constant global batch the data-parallel ranks' micro-batches do not divide: refused (micro-batches of 8 over 2
  # ranks once made no micro-batch at all, a NaN loss; 4 over 3 ranks trained 3 samples an iteration, counting 4).
  if "${MPI[@]}" "${BASE[@]}" --micro-batch-size 8 --train-iters 1 >dp_odd.log 2>&1; then
    fail "DP=2 accepted a global batch of 8 in micro-batches of 8"
  elif grep -q "^lattice train: error: --global-batch-size 8 is not a multiple of --micro-batch-size 8 x data-parallel size 2$" dp_odd.log; then
    pass "DP=2: a global batch of 8 in micro-batches of 8 is refused, naming the flags"
  else
    fail "DP=2, micro-batch 8: $(grep error dp_odd.log | head -n 1)"
  fi
fi

# ---- stopped mid-ramp (after iteration 3, batch 6 next) and resumed: the straight run's numbers ----
if "$LATTICE" "${RAMP[@]}" --metrics-file resumed.jsonl --save ckpt --exit-interval 3 >part1.log 2>&1 &&
   "$LATTICE" "${RAMP[@]}" --metrics-file resumed.jsonl --load ckpt >part2.log 2>&1; then
  if [ "$(field resumed.jsonl lm_loss)" = "$(field one.jsonl lm_loss)" ] &&
     [ "$(field resumed.jsonl consumed_samples)" = "$(field one.jsonl consumed_samples)" ]; then
    pass "stopped after iteration 3 and resumed: every loss and consumed-samples count of the straight run"
  else
    fail "the resumed run differs: $(field resumed.jsonl lm_loss | tr '\n' ' ') vs $(field one.jsonl lm_loss | tr '\n' ' ')"
  fi
else
  fail "stop/resume failed: $(tail -n 3 part1.log part2.log)"
fi

# ---- errors ----
expect_error "ramp-up with --train-iters" "--rampup-batch-size|--train-samples" -- \
  "$LATTICE" "${BASE[@]}" --micro-batch-size 1 --train-iters 6 --rampup-batch-size 4 2 16
expect_error "two values" "--rampup-batch-size|3 values" -- \
  "$LATTICE" "${BASE[@]}" --micro-batch-size 1 --train-samples 40 --rampup-batch-size 4 2
expect_error "increment not dividing" "--rampup-batch-size|increment 3" -- \
  "$LATTICE" "${BASE[@]}" --micro-batch-size 1 --train-samples 40 --rampup-batch-size 4 3 16
expect_error "not a number" "--rampup-batch-size|x" -- \
  "$LATTICE" "${BASE[@]}" --micro-batch-size 1 --train-samples 40 --rampup-batch-size 4 x 16

e2e_finish
