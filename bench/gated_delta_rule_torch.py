"""The PyTorch side of bench/gated_delta_rule_compare.sh: the gated delta rule of one Gated DeltaNet layer at
kernel_bench's GatedDeltaRule shape (B=2 sequences of T=1024, 4 key and 8 value heads of 128, fp32), computed by
chunks of 64 with the algorithm of HuggingFace's torch_chunk_gated_delta_rule (what transformers runs without
FLA's kernels), as tests/fixtures/make_gpt_fixture.py writes it: forward under no_grad, and forward then
backward with autograd. Prints one line per measured call: "torch forward MS" or "torch forward_backward MS".

  python3 bench/gated_delta_rule_torch.py [--iters 5] [--threads 2]"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))
from make_gpt_fixture import gated_delta_rule_chunked, l2norm  # noqa: E402

B, T, HK, HV, DK, DV = 2, 1024, 4, 8, 128, 128


def inputs(seed):
    """q, k [B, T, HV, DK] (l2-normalized per key head, repeated to the value heads; q times DK^-1/2), v [B, T,
    HV, DV], g and beta [B, T, HV] as a GDN layer makes them from random in_proj rows."""
    gen = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(B, T, HK, DK, generator=gen)).repeat_interleave(HV // HK, dim=2) * DK ** -0.5
    k = l2norm(torch.randn(B, T, HK, DK, generator=gen)).repeat_interleave(HV // HK, dim=2)
    v = torch.randn(B, T, HV, DV, generator=gen) * 0.3
    a_log = torch.rand(HV, generator=gen) * 2.77                      # A = exp(A_log) in [1, 16): Megatron's
    g = -a_log.exp() * F.softplus(torch.randn(B, T, HV, generator=gen) + 1.0)
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=gen))
    return q, k, v, g, beta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    q, k, v, g, beta = inputs(0)
    with torch.no_grad():
        gated_delta_rule_chunked(q, k, v, g, beta)  # warm-up
        for _ in range(args.iters):
            t0 = time.perf_counter()
            gated_delta_rule_chunked(q, k, v, g, beta)
            print(f"torch forward {1e3 * (time.perf_counter() - t0):.2f}", flush=True)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta)]
    d_o = torch.randn(B, T, HV, DV, generator=torch.Generator().manual_seed(1))
    for i in range(args.iters + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        gated_delta_rule_chunked(*leaves).backward(d_o)
        ms = 1e3 * (time.perf_counter() - t0)
        if i:
            print(f"torch forward_backward {ms:.2f}", flush=True)
        for x in leaves:
            x.grad = None


if __name__ == "__main__":
    main()
