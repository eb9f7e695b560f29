#!/usr/bin/env bash
# The pipeline bubble, measured against the theory: an 8-layer, 512-hidden GPT (T=128, B=1, vocab 256
# per micro-batch) on P pipeline stages under mpirun, one thread per rank, for several
# micro-batch counts M, in 1F1B and interleaved (2 chunks per stage). Stage 0 measures
# the fraction of its schedule's time spent outside forward and backward steps
# (--log-comm); the table puts its median beside (P-1)/(M+P-1) and (P-1)/(V*M+P-1).
# usage: bench/pipeline_bubble.sh    env: P (default 2), ITERS (default 6), VOCAB (256), LATTICE (build/lattice)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
LATTICE=${LATTICE:-build/lattice}
P=${P:-2}
ITERS=${ITERS:-6}
VOCAB=${VOCAB:-256}  # small: the output layer would otherwise make the last stage the slowest
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
run() {  # M, extra flags: prints "measured theory step_ms" (medians, first 2 iterations skipped)
  local m=$1; shift
  local log
  log=$(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -np "$P" "$LATTICE" train --mock-data \
    --vocab-size "$VOCAB" --num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 128 \
    --micro-batch-size 1 --global-batch-size "$m" --train-iters "$ITERS" --log-interval 1 --log-comm \
    --hidden-dropout 0 --attention-dropout 0 --eval-iters 0 --pipeline-model-parallel-size "$P" "$@" 2>&1)
  local measured theory step
  measured=$(grep -o "idle / schedule time): [0-9.]*" <<<"$log" | awk 'NR>2 {print $5}' | median)
  theory=$(grep -o "theory [0-9.]*" <<<"$log" | head -1 | awk '{print $2}')
  step=$(grep -o "elapsed time per iteration (ms): [0-9.]*" <<<"$log" | awk 'NR>2 {print $6}' | median)
  echo "$measured $theory $step"
}
echo "| P=$P, 8 layers, h=512, T=128, B=1 | M | measured bubble (stage 0) | theory | step ms |"
echo "|---|---:|---:|---:|---:|"
for m in 2 4 8 16; do
  read -r meas th st < <(run "$m")
  echo "| 1F1B | $m | $meas | $th | $st |"
done
for m in 2 4 8 16; do
  read -r meas th st < <(run "$m" --num-layers-per-virtual-pipeline-stage $((8 / (2 * P))))
  echo "| interleaved, 2 chunks per stage | $m | $meas | $th | $st |"
done
