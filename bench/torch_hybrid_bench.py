#!/usr/bin/python3
"""Time a training step of a Nemotron-H-style hybrid (Mamba-2) model on CPU: the PyTorch side of
bench/compare_torch.sh's hybrid shape, as torch_gpt_bench.py is of its GPT shapes (fp32, dropout 0, AdamW, 2
threads, the same output line). Run with Debian's /usr/bin/python3 (python3-torch 1.13.1).

The model is lattice's with --hybrid-override-pattern PATTERN --normalization RMSNorm --squared-relu
--disable-bias-linear --position-embedding-type none (tests/fixtures/make_gpt_fixture.py's hybrid reference):
token embedding (tied to the output layer), then one pre-norm residual block per character of the pattern,
  M  x + out_proj(mixer(rmsnorm(x))): Megatron-Core's MambaMixer (Mamba-2), 2 C / P heads of P, G groups, state N
  *  x + proj(causal self-attention(rmsnorm(x)))         (no MLP)
  -  x + fc2(relu(fc1(rmsnorm(x)))^2), ffn hidden 4 C    (no attention)
then a final RMSNorm and the logits; no linear layer has a bias. The mixer: in_proj to z, x, B, C, dt; x, B, C
through a causal depthwise convolution of width 4 (with bias) and SiLU; dt = softplus(dt + dt_bias),
A = -exp(A_log); the scan by mamba_scan_torch.py's chunked SSD (chunks of 64); the gated grouped RMSNorm
w * v / sqrt(mean_group(v^2) + 1e-5), v = y silu(z); out_proj. The vocabulary is not padded (lattice pads it to a
multiple of 128) and block is accepted for torch_gpt_bench.py's argument order only (no position embedding).

usage: torch_hybrid_bench.py pattern n_head n_embd B T [vocab=50257] [block=1024] [steps=5] [warmup=2]
                             [mamba_head_dim=64] [mamba_groups=8] [mamba_state=128]"""
import math, statistics, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

from mamba_scan_torch import ssd_chunked  # this script's folder is on sys.path when it runs


class RMSNorm(nn.Module):  # torch 1.13 has no nn.RMSNorm
    def __init__(s, C, eps=1e-5):
        super().__init__()
        s.weight, s.eps = nn.Parameter(torch.ones(C)), eps
    def forward(s, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps) * s.weight


class MambaLayer(nn.Module):
    def __init__(s, C, P, G, N, K=4):
        super().__init__()
        s.H, s.P, s.G, s.N = 2 * C // P, P, G, N
        s.I, cc = s.H * P, s.H * P + 2 * G * N                     # d_inner, the convolved channels x, B, C
        s.norm = RMSNorm(C)
        s.in_proj = nn.Linear(C, s.I + cc + s.H, bias=False)      # z, x, B, C, dt
        s.conv1d = nn.Conv1d(cc, cc, K, groups=cc, padding=K - 1)  # depthwise, with bias
        dt = torch.exp(torch.empty(s.H).uniform_(math.log(1e-3), math.log(1e-1))).clamp(min=1e-4)
        s.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt (Megatron's init)
        s.A_log = nn.Parameter(torch.log(torch.empty(s.H).uniform_(1, 16)))
        s.D = nn.Parameter(torch.ones(s.H))
        s.gate_norm = nn.Parameter(torch.ones(s.I))               # the gated RMSNorm's weight
        s.out_proj = nn.Linear(s.I, C, bias=False)
    def forward(s, h):
        Bs, T, _ = h.shape
        H, P, G, N, I = s.H, s.P, s.G, s.N, s.I
        z, xbc, dt = s.in_proj(s.norm(h)).split([I, I + 2 * G * N, H], dim=-1)
        xbc = F.silu(s.conv1d(xbc.transpose(1, 2))[..., :T].transpose(1, 2))
        x, Bm, Cm = xbc.split([I, G * N, G * N], dim=-1)
        y = ssd_chunked(x.reshape(Bs, T, H, P), F.softplus(dt + s.dt_bias), s.A_log,
                        Bm.reshape(Bs, T, G, N), Cm.reshape(Bs, T, G, N), s.D)
        v = (y.reshape(Bs, T, I) * F.silu(z)).view(Bs, T, G, I // G)
        v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-5)
        return h + s.out_proj(v.view(Bs, T, I) * s.gate_norm)


class AttentionLayer(nn.Module):
    def __init__(s, C, nh):
        super().__init__()
        s.nh = nh
        s.norm = RMSNorm(C)
        s.attn, s.proj = nn.Linear(C, 3 * C, bias=False), nn.Linear(C, C, bias=False)
    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.attn(s.norm(x)).split(C, dim=2)
        q, k, v = [t.view(B, T, s.nh, C // s.nh).transpose(1, 2) for t in (q, k, v)]
        if hasattr(F, 'scaled_dot_product_attention'):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch 1.13 has no SDPA: explicit causal softmax attention (as torch_gpt_bench.py)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // s.nh)
            att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float('-inf')).softmax(-1)
            y = att @ v
        return x + s.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLPLayer(nn.Module):
    def __init__(s, C):
        super().__init__()
        s.norm = RMSNorm(C)
        s.fc, s.fc2 = nn.Linear(C, 4 * C, bias=False), nn.Linear(4 * C, C, bias=False)
    def forward(s, x):
        return x + s.fc2(F.relu(s.fc(s.norm(x))).square())


class Hybrid(nn.Module):
    def __init__(s, pattern, nh, C, V, P, G, N):
        super().__init__()
        make = {'M': lambda: MambaLayer(C, P, G, N), '*': lambda: AttentionLayer(C, nh), '-': lambda: MLPLayer(C)}
        s.wte = nn.Embedding(V, C)
        s.h = nn.ModuleList(make[c]() for c in pattern)
        s.lnf = RMSNorm(C)
        s.head = nn.Linear(C, V, bias=False)
        s.head.weight = s.wte.weight  # tied embeddings (lattice's default)
        for n, p in s.named_parameters():  # GPT-2 / Megatron init of the linear layers and the embedding
            if p.dim() == 2:
                scaled = n.endswith(('out_proj.weight', 'proj.weight', 'fc2.weight'))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * len(pattern)) if scaled else 0.02)
    def forward(s, idx, tgt):
        x = s.wte(idx)
        for b in s.h:
            x = b(x)
        logits = s.head(s.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))


def main():
    a = sys.argv[1:]
    if len(a) < 5 or any(c not in 'M*-' for c in a[0]):
        sys.exit(__doc__)
    pattern = a[0]
    H, C, B, T = map(int, a[1:5])
    V, blk, steps, warm, P, G, N = (int(a[i]) if len(a) > i else d
                                    for i, d in enumerate((50257, 1024, 5, 2, 64, 8, 128), start=5))
    torch.manual_seed(0)
    torch.set_num_threads(2)
    m = Hybrid(pattern, H, C, V, P, G, N)
    nparam = sum(p.numel() for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1)
    x = torch.randint(0, V, (B, T)); y = torch.randint(0, V, (B, T))
    ts, losses = [], []
    for i in range(warm + steps):
        t0 = time.perf_counter()
        loss = m(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if i >= warm:
            ts.append(dt)
    med = statistics.median(ts)
    print(f"torch {torch.__version__} threads={torch.get_num_threads()} pattern={pattern} L={len(pattern)} H={H} C={C} "
          f"mamba: heads={2 * C // P} P={P} G={G} N={N} V={V} B={B} T={T} "
          f"params={nparam/1e6:.2f}M ({nparam}) step_ms: median={med*1e3:.0f} all={[round(t*1e3) for t in ts]} "
          f"tokens/s={B*T/med:.0f} loss first={losses[0]:.3f} last={losses[-1]:.3f} (ln V={math.log(V):.3f})")

if __name__ == '__main__':
    main()
