#!/usr/bin/env bash
# lattice's Mamba-2 scan (one Mamba layer's on a rank at a Nemotron-H-like per-rank shape: B=2 x T=1024, 16 heads
# of 64 reading 2 groups of B and C, state 128, fp32, checkpoints every 64 tokens) against PyTorch running the
# chunked SSD algorithm of the Mamba-2 paper (chunks of 64, as bench/mamba_scan_torch.py computes it with
# autograd), side by side: rounds alternate (lattice, torch, ...), and the table gives the medians over every
# measured call of every round, forward alone and forward plus backward. lattice's side is build/kernel_bench's
# MambaScan (its backward recomputes each chunk's states from the forward's checkpoints, as the model's does).
#
# usage: bench/mamba_scan_compare.sh
# environment:
#   ROUNDS  runs of each system (default 3)          ITERS  measured calls per run and direction (default 5)
#   KERNEL_BENCH  default build/kernel_bench          PYTHON  an interpreter with torch (default /usr/bin/python3)
#   THREADS  both systems' threads (default 2)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-5}
THREADS=${THREADS:-2}
KERNEL_BENCH=${KERNEL_BENCH:-build/kernel_bench}
PYTHON=${PYTHON:-/usr/bin/python3}

die() { echo "mamba_scan_compare: $*" >&2; exit 1; }
[[ -x $KERNEL_BENCH ]] || die "$KERNEL_BENCH not found (make build)"
"$PYTHON" -c 'import torch' 2>/dev/null || die "$PYTHON cannot import torch (apt-get install python3-torch)"
torch_blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo unknown)
[[ $torch_blas == */blas/libblas.so.3* ]] &&
  echo "mamba_scan_compare: warning: PyTorch's BLAS is the reference BLAS ($torch_blas): scripts/install-deps.sh --bench installs OpenBLAS" >&2

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for round in $(seq "$ROUNDS"); do
  OMP_NUM_THREADS=$THREADS "$KERNEL_BENCH" --benchmark_filter='^MambaScan/' --benchmark_repetitions="$ITERS" \
    --benchmark_min_time=0.05 --benchmark_format=csv 2>/dev/null |
    awk -F, '/^"MambaScan\/backward:[01]\/real_time"/ {
               split($1, a, ":"); d = substr(a[2], 1, 1); print "lattice", (d == "1" ? "backward" : "forward"), $3 }' \
      >>"$work/lattice.txt"
  OMP_WAIT_POLICY=PASSIVE "$PYTHON" bench/mamba_scan_torch.py --iters "$ITERS" --threads "$THREADS" >>"$work/torch.txt"
done

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
lf=$(awk '$2 == "forward" { print $3 }' "$work/lattice.txt" | median)
lb=$(awk '$2 == "backward" { print $3 }' "$work/lattice.txt" | median)
tf=$(awk '$2 == "forward" { print $3 }' "$work/torch.txt" | median)
tfb=$(awk '$2 == "forward_backward" { print $3 }' "$work/torch.txt" | median)
printf '| Mamba-2 scan, B=2 T=1024 H=16 P=64 G=2 N=128 (medians, ms) | lattice | PyTorch | PyTorch / lattice |\n|---|---:|---:|---:|\n'
awk -v lf="$lf" -v lb="$lb" -v tf="$tf" -v tfb="$tfb" 'BEGIN {
  printf "| forward | %.1f | %.1f | %.2fx |\n", lf, tf, tf / lf
  printf "| forward + backward | %.1f | %.1f | %.2fx |\n", lf + lb, tfb, tfb / (lf + lb) }'
