#!/usr/bin/env bash
# How much of the data-parallel gradient reduction hides behind backward: GPT-2 124M shape
# (12 layers, 12 heads, 768 hidden, vocab 50257, B=4 per rank, T=64), DP=2 under mpirun,
# with and without --overlap-grad-reduce. Prints the median exposed reduction time per
# step (the wait after backward) for both, and the fraction hidden by the overlap.
# usage: bench/dp_overlap.sh    env: ITERS (default 8), NP (default 2), LATTICE (build/lattice)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
LATTICE=${LATTICE:-build/lattice}
ITERS=${ITERS:-8}
NP=${NP:-2}
ARGS=(train --mock-data --vocab-size 50257 --num-layers 12 --hidden-size 768 --num-attention-heads 12
      --seq-length 64 --max-position-embeddings 1024 --micro-batch-size 4 --global-batch-size $((4 * NP))
      --train-iters "$ITERS" --log-interval 1 --log-comm --hidden-dropout 0 --attention-dropout 0 --eval-iters 0)
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
run() {  # prints: median exposed ms, median all-reduce ms, median step ms (skipping 2 warm-up steps)
  local log
  log=$(mpirun --allow-run-as-root --oversubscribe -np "$NP" "$LATTICE" "${ARGS[@]}" "$@" 2>&1)
  local exposed allreduce step
  exposed=$(grep -o "not hidden by backward: [0-9.]* ms" <<<"$log" | awk 'NR>2 {print $5}' | median)
  allreduce=$(grep -o "all_reduce [0-9.]* MB in [0-9.]* ms" <<<"$log" | awk 'NR>2 {print $5}' | median)
  step=$(grep -o "elapsed time per iteration (ms): [0-9.]*" <<<"$log" | awk 'NR>2 {print $6}' | median)
  echo "$exposed $allreduce $step"
}
read -r e0 a0 s0 < <(run)
read -r e1 a1 s1 < <(run --overlap-grad-reduce)
echo "| DP=$NP, 124M, B=4 T=64 per rank | step ms | all-reduce time ms (inside calls) | reduction exposed after backward ms |"
echo "|---|---:|---:|---:|"
echo "| no overlap | $s0 | $a0 | $e0 |"
echo "| --overlap-grad-reduce | $s1 | $a1 | $e1 |"
awk -v a="$e0" -v b="$e1" 'BEGIN { printf "fraction of the reduction hidden behind backward: %.0f%%\n", (a > 0 ? 100 * (1 - b / a) : 0) }'
