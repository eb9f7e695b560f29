#!/usr/bin/env bash
# lattice's gated delta rule (one Gated DeltaNet layer's: B=2 x T=1024, 8 value heads of 128, fp32, chunks of 64)
# against PyTorch running the same chunked algorithm (HuggingFace's torch_chunk_gated_delta_rule's, as
# bench/gated_delta_rule_torch.py computes it with autograd), side by side (bench/kernel_vs_torch.sh: rounds
# alternating, medians). lattice's side is build/kernel_bench's GatedDeltaRule (its backward recomputes each chunk
# from the forward's state checkpoints, as the model's does).
#
# usage: bench/gated_delta_rule_compare.sh   (environment: as bench/kernel_vs_torch.sh)
exec "$(dirname "${BASH_SOURCE[0]}")/kernel_vs_torch.sh" gated_delta_rule_compare GatedDeltaRule \
  bench/gated_delta_rule_torch.py "gated delta rule, B=2 T=1024 Hv=8 Dk=Dv=128"
