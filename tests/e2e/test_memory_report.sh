#!/usr/bin/env bash
# --log-memory: in six layouts (one process; DP 2 with the distributed optimizer, in fp32 and
# with --bf16 --grad-reduce-in-bf16; TP 2; PP 2 with 4 micro-batches; TP 2 x PP 2) every rank's measured peak resident memory
# (VmHWM) after the first iterations is within 10% of its estimate, on a model whose
# parameters, gradients and Adam state dominate the process baseline. --dry-run prints
# the same estimate for every rank without training.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
cd "$TMP"

MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
# About 29.5M parameters: 472 MB of model state (16 bytes per parameter) in one process.
# TP 2 x PP 2 splits the model four ways, so it runs WIDE (4 layers of 1024, ~59M
# parameters) to keep each rank's model state well above the process baseline.
WIDE=(--num-layers 4 --hidden-size 1024)
TRAIN=(train --num-attention-heads 8 --seq-length 128
       --max-position-embeddings 128 --vocab-size 8192 --mock-data --micro-batch-size 1 --train-iters 2
       --log-interval 1 --eval-iters 0 --lr 1e-4 --peak-tflops 1 --log-memory)

# check_layout NAME RANKS LOG: the estimate table and the measured lines name every rank,
# and each measured peak is within 10% of its estimate.
check_layout() {
  local name=$1 ranks=$2 log=$3
  local est got
  est=$(grep -c "^  rank [0-9]* (tp [0-9]*, pp [0-9]*, dp [0-9]*): .* | peak [0-9.]* MB$" "$log")
  got=$(grep -c "^  rank [0-9]*: peak resident [0-9.]* MB, estimate [0-9.]* MB" "$log")
  if [ "$est" -ne "$ranks" ] || [ "$got" -ne "$ranks" ]; then
    fail "$name: $est estimate and $got measured lines, expected $ranks of each: $(tail -3 "$log")"
    return
  fi
  local worst
  if worst=$(awk '/^  rank [0-9]*: peak resident/ {
                    peak = $5; est = $8; d = (peak - est) / est; if (d < 0) d = -d
                    if (d > w) w = d; if (d > 0.10) bad = bad " rank " $2 " " peak "/" est
                  }
                  END { if (bad != "") { print bad; exit 1 } printf "%.1f%%", 100 * w }' "$log"); then
    pass "$name: every rank's peak within 10% of its estimate (worst $worst)"
  else
    fail "$name: peak resident MB / estimate MB off by more than 10% on$worst"
    sed 's/^/    /' "$log" >&2
  fi
}

run() {  # NAME RANKS FLAGS... (default model: 8 layers of 512)
  local name=$1 ranks=$2
  shift 2
  local log="$TMP/$name.log" cmd
  if [ "$ranks" -eq 1 ]; then cmd=(env OMP_NUM_THREADS=1 "$LATTICE"); else cmd=("${MPIRUN[@]}" -np "$ranks" "$LATTICE"); fi
  local model=(--num-layers 8 --hidden-size 512)
  [[ " $* " == *" --hidden-size "* ]] && model=()
  if "${cmd[@]}" "${TRAIN[@]}" "${model[@]}" "$@" > "$log" 2>&1; then
    check_layout "$name" "$ranks" "$log"
  else
    fail "$name: run failed: $(tail -3 "$log")"
  fi
}

run one 1 --global-batch-size 1
run dp2_distopt 2 --global-batch-size 2 --use-distributed-optimizer
# bf16 weight copies, and the buckets' bf16 copies of --grad-reduce-in-bf16.
run dp2_bf16_reduce 2 --global-batch-size 2 --use-distributed-optimizer --bf16 --grad-reduce-in-bf16
run tp2 2 --global-batch-size 1 --tensor-model-parallel-size 2
run pp2 2 --global-batch-size 4 --pipeline-model-parallel-size 2
run tp2_pp2 4 "${WIDE[@]}" --global-batch-size 2 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel

# The distributed optimizer halves Adam's state: rank 0 of DP 2 owns half the parameters.
if grep -q "^  rank 0 (tp 0, pp 0, dp 0): .* optimizer state [0-9.]* ([0-9.]*M owned), gradient staging" dp2_distopt.log; then
  pass "dp2_distopt: the estimate counts the sharded Adam state and the gradient staging"
else
  fail "dp2_distopt: no sharded optimizer state in the estimate: $(grep '^  rank 0 (' dp2_distopt.log)"
fi

# --dry-run: one estimate line per rank (DP from mpirun's world size), nothing trained.
if "${MPIRUN[@]}" -np 4 "$LATTICE" "${TRAIN[@]}" "${WIDE[@]}" --global-batch-size 4 --pipeline-model-parallel-size 2 \
     --dry-run > dry.log 2>&1; then
  n=$(grep -c "^  rank [0-9]* (tp 0, pp [01], dp [01]): .* | peak [0-9.]* MB$" dry.log)
  if [ "$n" -eq 4 ] && ! grep -q "iteration " dry.log; then
    pass "dry run: an estimate for each of the 4 ranks, no training"
  else
    fail "dry run: $n estimate lines, expected 4 (and no iterations): $(cat dry.log)"
  fi
else
  fail "dry run failed: $(tail -3 dry.log)"
fi

e2e_finish
