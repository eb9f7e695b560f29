"""The PyTorch side of bench/mamba_scan_compare.sh: the scan of one Mamba-2 layer at kernel_bench's MambaScan shape
(B=2 sequences of T=1024, 16 heads of 64 reading 2 groups of B and C, state 128, fp32): per head h, reading group
g = h // (H / G), a state S [P, N] from zeros,
  S = exp(dt_t A) S + dt_t x_t B_t^T,   y_t = S C_t + D x_t,   A = -exp(A_log),
computed by chunks of 64 with the chunked SSD algorithm of the Mamba-2 paper (its ssd_minimal_discrete; written
anew, plain torch): forward under no_grad, and forward then backward with autograd (the gradients of x, dt,
A_log, B, C and D: those lattice's mamba_scan_backward writes). Prints one line per measured call: "torch forward
MS" or "torch forward_backward MS".

  python3 bench/mamba_scan_torch.py [--iters 5] [--threads 2]
  python3 bench/mamba_scan_torch.py --check    # the chunked form against the recurrence, float64, tiny sizes"""
import argparse
import time

import torch
import torch.nn.functional as F

B, T, H, P, G, N = 2, 1024, 16, 64, 2, 128
CHUNK = 64


def ssd_chunked(x, dt, A_log, Bm, Cm, D, chunk=CHUNK):
    """y [b, t, H, P] from x [b, t, H, P], dt [b, t, H], A_log [H], Bm, Cm [b, t, G, N], D [H], chunk by chunk. With
    a_t = dt_t A each step's log decay, time padded with zeros to whole chunks (a padded step: a 0, dt x 0, so the
    state stays) and, within a chunk, acs_l the cumulative log decay from the chunk's start to its step l:
      1. within the chunk (the quadratic form): y_l = sum_{s <= l} (C_l . B_s) exp(acs_l - acs_s) dt_s x_s, the
         segment sums acs_l - acs_s masked to -inf above the diagonal before the exp; C B^T once per group;
      2. each chunk's own contribution to the state at its end: sum_l exp(acs_last - acs_l) dt_l x_l B_l^T;
      3. the state entering each chunk, chunk after chunk (Mamba-2's state passing): h_{c+1} = exp(acs_last of c)
         h_c + chunk c's contribution, h_0 = 0;
      4. the entering state's output: y_l += exp(acs_l) h C_l;
    and y += D x. The heads of a group are kept together, so that the products with B and C run per (sequence,
    group, chunk) over all the group's heads at once."""
    b, t, nh, p = x.shape
    ng, n = Bm.shape[2], Bm.shape[3]
    j = nh // ng
    a = dt * -torch.exp(A_log)                                          # [b, t, H]
    xdt = x * dt.unsqueeze(-1)                                          # [b, t, H, P]
    skip = x * D[:, None]
    pad = (-t) % chunk
    if pad:
        a, xdt, skip, Bm, Cm = (F.pad(v, (0, 0) * (v.dim() - 2) + (0, pad)) for v in (a, xdt, skip, Bm, Cm))
    nc, L = (t + pad) // chunk, chunk
    acs = a.view(b, nc, L, ng, j).permute(0, 3, 4, 1, 2).contiguous().cumsum(-1)        # [b, G, J, c, l]
    xc = xdt.view(b, nc, L, ng, j, p).permute(0, 3, 4, 1, 2, 5)                         # [b, G, J, c, l, P]
    Bc = Bm.view(b, nc, L, ng, n).permute(0, 3, 1, 2, 4).contiguous()                   # [b, G, c, l, N]
    Cc = Cm.view(b, nc, L, ng, n).permute(0, 3, 1, 2, 4).contiguous()
    # 1.
    lower = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
    decay = (acs.unsqueeze(-1) - acs.unsqueeze(-2)).masked_fill(~lower, float("-inf")).exp()  # [b, G, J, c, l, s]
    cb = Cc @ Bc.transpose(-1, -2)                                                      # [b, G, c, l, s]
    y_diag = (decay * cb.unsqueeze(2)) @ xc                                             # [b, G, J, c, l, P]
    # 2.
    xw = xc * torch.exp(acs[..., -1:] - acs).unsqueeze(-1)
    states = torch.einsum("bgjclp,bgcln->bgcjpn", xw, Bc)                               # [b, G, c, J, P, N]
    # 3.
    last = torch.exp(acs[..., -1])                                                      # [b, G, J, c]
    h = [states.new_zeros(b, ng, j, p, n)]
    for c in range(1, nc):
        h.append(h[-1] * last[..., c - 1, None, None] + states[:, :, c - 1])
    h = torch.stack(h, dim=2)                                                           # [b, G, c, J, P, N]
    # 4.
    y_off = torch.einsum("bgcln,bgcjpn->bgcljp", Cc, h) * acs.exp().permute(0, 1, 3, 4, 2).unsqueeze(-1)
    # The sum in x's layout [b, c, l, G, J, P] (skip's, the first operand's).
    y = skip.view(b, nc, L, ng, j, p) + y_diag.permute(0, 3, 4, 1, 2, 5)
    y = y + y_off.permute(0, 2, 3, 1, 4, 5)
    return y.view(b, nc * L, nh, p)[:, :t]


def ssd_recurrent(x, dt, A_log, Bm, Cm, D):
    """The same scan token by token (for the self-check)."""
    b, t, nh, p = x.shape
    ng, n = Bm.shape[2], Bm.shape[3]
    group = torch.arange(nh) // (nh // ng)
    Bh, Ch = Bm[:, :, group], Cm[:, :, group]                           # [b, t, H, N]
    A = -torch.exp(A_log)
    S = x.new_zeros(b, nh, p, n)
    ys = []
    for s in range(t):
        dx = dt[:, s, :, None] * x[:, s]                                # [b, H, P]
        S = torch.exp(dt[:, s] * A)[..., None, None] * S + dx.unsqueeze(-1) * Bh[:, s, :, None]
        ys.append((S @ Ch[:, s, :, :, None]).squeeze(-1) + D[:, None] * x[:, s])
    return torch.stack(ys, dim=1)


def inputs(seed, b, t, dtype=torch.float32, nh=H, p=P, ng=G, n=N):
    """x, dt, A_log, B, C, D as kernel_bench's MambaScan makes them: x, B and C (the convolution's SiLU outputs)
    uniform in (-1, 1), dt uniform in (0.01, 0.1), A_log = log U(1, 16) (Megatron's initial), D ones."""
    gen = torch.Generator().manual_seed(seed)
    u = lambda *shape: torch.rand(*shape, generator=gen, dtype=dtype)  # noqa: E731
    x = 2 * u(b, t, nh, p) - 1
    dt = 0.01 + 0.09 * u(b, t, nh)
    A_log = torch.log(1 + 15 * u(nh))
    Bm, Cm = 2 * u(b, t, ng, n) - 1, 2 * u(b, t, ng, n) - 1
    D = torch.ones(nh, dtype=dtype)
    return x, dt, A_log, Bm, Cm, D


def check():
    """The chunked form against the recurrence in float64 (outputs and every input's gradient), tiny sizes: whole
    chunks and a padded last chunk, the group's heads more than one."""
    for b, t, nh, p, ng, n, chunk in ((2, 72, 4, 3, 2, 5, 16), (1, 128, 6, 4, 3, 8, 64), (2, 64, 4, 5, 1, 3, 64)):
        leaves = [v.requires_grad_() for v in inputs(3, b, t, torch.float64, nh, p, ng, n)]
        dy = torch.randn(b, t, nh, p, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        results = []
        for f in (lambda *v: ssd_chunked(*v, chunk=chunk), ssd_recurrent):
            y = f(*leaves)
            grads = torch.autograd.grad(y, leaves, dy)
            results.append((y,) + grads)
        err = max((u - v).abs().max().item() for u, v in zip(*results))
        scale = max(v.abs().max().item() for v in results[1])
        print(f"check b={b} t={t} H={nh} P={p} G={ng} N={n} chunk={chunk}: max error {err:.3g} "
              f"(values up to {scale:.3g})")
        assert err < 1e-10, err
    print("check passed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--check", action="store_true", help="the chunked form against the recurrence, then exit")
    ap.add_argument("--B", type=int, default=B, help=argparse.SUPPRESS)  # smaller sizes for a quick try
    ap.add_argument("--T", type=int, default=T, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.check:
        check()
        return
    leaves = inputs(0, args.B, args.T)
    with torch.no_grad():
        ssd_chunked(*leaves)  # warm-up
        for _ in range(args.iters):
            t0 = time.perf_counter()
            ssd_chunked(*leaves)
            print(f"torch forward {1e3 * (time.perf_counter() - t0):.2f}", flush=True)
    leaves = [v.clone().requires_grad_() for v in leaves]
    dy = torch.randn(args.B, args.T, H, P, generator=torch.Generator().manual_seed(1))
    for i in range(args.iters + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        ssd_chunked(*leaves).backward(dy)
        ms = 1e3 * (time.perf_counter() - t0)
        if i:
            print(f"torch forward_backward {ms:.2f}", flush=True)
        for v in leaves:
            v.grad = None


if __name__ == "__main__":
    main()
