#!/usr/bin/env bash
# lattice's Mamba-2 scan (one Mamba layer's on a rank at a Nemotron-H-like per-rank shape: B=2 x T=1024, 16 heads
# of 64 reading 2 groups of B and C, state 128, fp32, chunks of 64) against PyTorch running the chunked SSD
# algorithm of the Mamba-2 paper (chunks of 64, as bench/mamba_scan_torch.py computes it with autograd), side by
# side (bench/kernel_vs_torch.sh: rounds alternating, medians). lattice's side is build/kernel_bench's MambaScan
# (its backward runs each chunk from the forward's state checkpoints, as the model's does).
#
# usage: bench/mamba_scan_compare.sh   (environment: as bench/kernel_vs_torch.sh)
exec "$(dirname "${BASH_SOURCE[0]}")/kernel_vs_torch.sh" mamba_scan_compare MambaScan bench/mamba_scan_torch.py \
  "Mamba-2 scan, B=2 T=1024 H=16 P=64 G=2 N=128"
