#!/usr/bin/env python3
"""GPT-2 training throughput in PyTorch on one GPU: the baseline bench/gpu_bench.sh puts beside
`lattice train --device cuda`.

The model is the one lattice trains: learned absolute positions, pre-LayerNorm blocks (fused
QKV -> causal attention -> projection, MLP 4C with erf GELU), final LayerNorm, output layer tied
to the word embedding, the vocabulary padded to a multiple of 128 (50257 -> 50304). Dropout 0
(as the lattice runs of the benchmark). Training as a tuned PyTorch user runs it: bf16 autocast
(fp32 master weights), fused AdamW, scaled_dot_product_attention restricted to the flash
backend, TF32 allowed for the fp32 remainder; eager by default, --compile for torch.compile.

Prints one line per measured step and a summary:
    torch: tokens/s 123456.7 | TFLOP/s 234.5 | MFU 23.7% | step ms 66.4 | peak memory 12.3 GB
with Megatron's model-FLOP count (the same formula lattice logs, src/train/flops.h).

usage: torch_gpt_bench_cuda.py --layers 12 --heads 12 --hidden 768 [--seq 1024] [--batch 8]
                               [--vocab 50257] [--warmup 3] [--steps 10] [--peak-tflops 989] [--compile]
"""
import argparse
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(c, eps=1e-5)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c, eps=1e-5)
        self.fc1 = nn.Linear(c, 4 * c)
        self.fc2 = nn.Linear(4 * c, c)

    def forward(self, x):  # x: [B, T, C]
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        # [B, H, T, D]
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers, heads, c, vocab, block):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(block, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(c, eps=1e-5)
        # Megatron's init: N(0, 0.02), output projections 0.02 / sqrt(2L), zero biases.
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.zeros_(p) if name.endswith("bias") else nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):  # idx, targets: [B, T]
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.lnf(x), self.wte.weight)  # tied output layer, [B, T, Vp]
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def megatron_flops_per_iteration(layers, c, vocab_padded, batch, seq):
    # src/train/flops.h: per_token = L*(6*h*ffn*2 + 6*(h*(q+k+v) + q*h)) + 6*h*Vp,
    # FLOPs = B*s*per_token + B*s*s*6*q*L (causal attention, already halved).
    h, q, ffn = c, c, 4 * c
    per_token = layers * (6 * h * ffn * 2 + 6 * (h * 3 * q + q * h)) + 6 * h * vocab_padded
    return batch * seq * per_token + batch * seq * seq * 6 * q * layers


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_gpt_bench_cuda: torch sees no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(1234)
    dev = torch.device("cuda")
    vp = (a.vocab + 127) // 128 * 128
    model = GPT(a.layers, a.heads, a.hidden, vp, a.seq).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.999), eps=1e-8, fused=True)
    step_fn = torch.compile(model) if a.compile else model
    gen = torch.Generator(device=dev).manual_seed(1234)
    flops = megatron_flops_per_iteration(a.layers, a.hidden, vp, a.batch, a.seq)
    tokens_per_step = a.batch * a.seq
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}: {nparams / 1e6:.1f}M parameters, "
          f"B={a.batch} T={a.seq}, bf16 autocast, fused AdamW, flash SDPA, {'compiled' if a.compile else 'eager'}",
          flush=True)
    times = []
    for step in range(a.warmup + a.steps):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=dev, generator=gen)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(idx[:, :-1], idx[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = loss.item()  # synchronizes, as lattice's logged loss does
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
        print(f"step {step + 1}{' (warm-up)' if step < a.warmup else ''}: loss {lv:.4f}, {dt * 1e3:.1f} ms",
              flush=True)
    ms = sum(times) / len(times) * 1e3
    tflops = flops / (ms / 1e3) / 1e12
    print(f"torch: tokens/s {tokens_per_step / (ms / 1e3):.1f} | TFLOP/s {tflops:.1f} | "
          f"MFU {100 * tflops / a.peak_tflops:.1f}% | step ms {ms:.1f} | "
          f"peak memory {torch.cuda.max_memory_allocated() / 1e9:.1f} GB", flush=True)


if __name__ == "__main__":
    main()
