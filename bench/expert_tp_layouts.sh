#!/usr/bin/env bash
# The experts' tensor-parallel size on one machine: a mixture-of-experts model at TP 2 with sequence
# parallelism on 2 ranks, its experts split over the pair (--expert-tensor-parallel-size 2, the default)
# against whole experts over the pair (--expert-tensor-parallel-size 1 --expert-model-parallel-size 2).
# Runs alternate (split, whole, split, whole, ...) so both see the same noise; the table gives the median
# iteration time over the measured iterations of all rounds and the communication per iteration
# (--log-comm: bytes and calls by collective). Both layouts train the same model to the same losses
# (tests/dist/test_dist_expert_parallel.cpp).
#
# usage: bench/expert_tp_layouts.sh
# environment:
#   ROUNDS   runs of each layout (default 2)    ITERS  iterations per run (default 8; the first 2 unmeasured)
#   LATTICE  the binary (default build/lattice)  KEEP=1  keep the run logs (their folder is printed)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ROUNDS=${ROUNDS:-2}
ITERS=${ITERS:-8}
LATTICE=$(realpath "${LATTICE:-build/lattice}")
WORK=$(mktemp -d)
[ "${KEEP:-0}" = 1 ] && echo "logs in $WORK" || trap 'rm -rf "$WORK"' EXIT

# 4 layers (all MoE), C 256, 8 heads, 16 experts of 512 (top 2), T 256, 4 micro-batches of 2 per iteration.
MODEL=(--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 256 --max-position-embeddings 256
       --micro-batch-size 2 --global-batch-size 8 --mock-data --vocab-size 8192 --lr 1e-4 --log-interval 1
       --num-experts 16 --moe-router-topk 2 --moe-ffn-hidden-size 512 --moe-aux-loss-coeff 0.01
       --disable-bias-linear --tensor-model-parallel-size 2 --sequence-parallel --log-comm
       --train-iters "$ITERS" --eval-iters 0 --seed 1)
declare -A FLAGS=([split]="" [whole]="--expert-tensor-parallel-size 1 --expert-model-parallel-size 2")

for round in $(seq "$ROUNDS"); do
  for layout in split whole; do
    # shellcheck disable=SC2086
    mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$LATTICE" train "${MODEL[@]}" \
      ${FLAGS[$layout]} > "$WORK/$layout.$round.log" 2>&1 || { tail -3 "$WORK/$layout.$round.log"; exit 1; }
  done
done

printf '%-6s %-22s %-12s %s\n' layout "median iteration (ms)" "lm loss" "communication per iteration (last report)"
for layout in split whole; do
  ms=$(cat "$WORK"/$layout.*.log | grep -o 'iteration *[0-9]*/ *[0-9]* |.*elapsed time per iteration (ms): [0-9.]*' |
    awk -F'[/|]' '{ split($1, a, " "); if (a[2] > 2) print }' | grep -o '[0-9.]*$' | sort -g |
    awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
  loss=$(grep -o 'lm loss: [0-9.E+-]*' "$WORK/$layout.1.log" | tail -1 | awk '{print $3}')
  comm=$(grep '> communication per iteration' "$WORK/$layout.1.log" | tail -1 | sed 's/.*communication per iteration://')
  printf '%-6s %-22s %-12s %s\n' "$layout" "$ms" "$loss" "$comm"
done
