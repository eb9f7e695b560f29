#!/usr/bin/env bash
# A lattice kernel against PyTorch, side by side: rounds alternate (lattice, torch, ...), and the table gives the
# medians over every measured call of every round, forward alone and forward plus backward. lattice's side is
# build/kernel_bench's BENCHMARK (its arguments backward:0 and backward:1); PyTorch's a script printing
# "torch forward <ms>" and "torch forward_backward <ms>" lines for --iters and --threads.
# The callers: bench/gated_delta_rule_compare.sh, bench/mamba_scan_compare.sh.
#
# usage: bench/kernel_vs_torch.sh NAME BENCHMARK TORCH_SCRIPT TITLE
# environment:
#   ROUNDS  runs of each system (default 3)          ITERS  measured calls per run and direction (default 5)
#   KERNEL_BENCH  default build/kernel_bench          PYTHON  an interpreter with torch (default /usr/bin/python3)
#   THREADS  both systems' threads (default 2)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

NAME=$1 BENCHMARK=$2 TORCH_SCRIPT=$3 TITLE=$4

ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-5}
THREADS=${THREADS:-2}
KERNEL_BENCH=${KERNEL_BENCH:-build/kernel_bench}
PYTHON=${PYTHON:-/usr/bin/python3}

die() { echo "$NAME: $*" >&2; exit 1; }
[[ -x $KERNEL_BENCH ]] || die "$KERNEL_BENCH not found (make build)"
"$PYTHON" -c 'import torch' 2>/dev/null || die "$PYTHON cannot import torch (apt-get install python3-torch)"
torch_blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo unknown)
[[ $torch_blas == */blas/libblas.so.3* ]] &&
  echo "$NAME: warning: PyTorch's BLAS is the reference BLAS ($torch_blas): scripts/install-deps.sh --bench installs OpenBLAS" >&2

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for round in $(seq "$ROUNDS"); do
  OMP_NUM_THREADS=$THREADS "$KERNEL_BENCH" --benchmark_filter="^$BENCHMARK/" --benchmark_repetitions="$ITERS" \
    --benchmark_min_time=0.05 --benchmark_format=csv 2>/dev/null |
    awk -F, -v bench="$BENCHMARK" '$1 ~ "^\"" bench "/backward:[01]/real_time\"$" {
               split($1, a, ":"); d = substr(a[2], 1, 1); print "lattice", (d == "1" ? "backward" : "forward"), $3 }' \
      >>"$work/lattice.txt"
  OMP_WAIT_POLICY=PASSIVE "$PYTHON" "$TORCH_SCRIPT" --iters "$ITERS" --threads "$THREADS" >>"$work/torch.txt"
done

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
lf=$(awk '$2 == "forward" { print $3 }' "$work/lattice.txt" | median)
lb=$(awk '$2 == "backward" { print $3 }' "$work/lattice.txt" | median)
tf=$(awk '$2 == "forward" { print $3 }' "$work/torch.txt" | median)
tfb=$(awk '$2 == "forward_backward" { print $3 }' "$work/torch.txt" | median)
printf '| %s (medians, ms) | lattice | PyTorch | PyTorch / lattice |\n|---|---:|---:|---:|\n' "$TITLE"
awk -v lf="$lf" -v lb="$lb" -v tf="$tf" -v tfb="$tfb" 'BEGIN {
  printf "| forward | %.1f | %.1f | %.2fx |\n", lf, tf, tf / lf
  printf "| forward + backward | %.1f | %.1f | %.2fx |\n", lf + lb, tfb, tfb / (lf + lb) }'
