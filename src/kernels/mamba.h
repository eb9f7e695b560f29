// Mamba-2 (Megatron-Core's MambaMixer, the Mamba layers of --hybrid-override-pattern; the state space
// duality paper of Dao and Gu): the kernels of one Mamba layer between its in_proj and its out_proj. Per
// token, from the in_proj's output row x [W] (MambaShape's layout: z, x, B, C, dt; Megatron's zxBCdt):
//   u      = silu(causal depthwise conv1d over time of x's x, B, C columns + conv1d.bias)    [Cc = HP + 2GN]
//   xs     = u's first H P (the heads' inputs), Bg, Cg = u's next G N and the last G N (per group)
//   dt[h]  = softplus(x's dt[h] + dt_bias[h]),   A[h] = -exp(A_log[h])
// and per head h (reading group g = h / (H / G)), state S [P, N] from zeros at each sequence's start:
//   S = exp(dt_t A) S + dt_t xs_t Bg_t^T;   y_t = S Cg_t + D[h] xs_t                                [P]
// With document ids (MambaShape::documents, --reset-attention-mask) each document of a sequence is a
// sequence of its own: the state starts from zeros at its first token and the convolution reads no row of
// another document.
// Then the gated, grouped RMSNorm (Megatron's RMSNormGated, norm_before_gate false, eps 1e-5):
//   out = w * v / sqrt(mean over the group's H P / G values of v^2 + eps),  v = y silu(z)
// which goes to out_proj.
//
// The state is kept row by row ([P, N] per head, N contiguous). The scan's forward saves the state every
// `chunk` tokens; the backward runs each sequence's chunks in reverse from these checkpoints. The CPU kernels
// are kernels/cpu/mamba.cpp: the scan runs each chunk in closed form through GEMMs (the Mamba-2 paper's chunked
// "state space duality" algorithm), `chunk` its chunk length too, so that its results depend on `chunk`
// through rounding; its backward needs no state but the chunk's checkpoint. The GPU's are kernels/cuda/mamba.cu,
// the same chunked formulas with the chunks in parallel (chunk at most 64 there). The row math and the chunks'
// decays both share are math:: below.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.h"
#include "kernels/causal_conv_math.h"
#include "kernels/gated_delta_net.h"  // math::silu, silu_grad, softplus

namespace lattice {

struct MambaShape {
  int64_t B = 0, T = 0;  // sequences, tokens each (rows n = b T + t)
  int64_t H = 0, P = 0;  // heads (this rank's), head dim (--mamba-head-dim)
  int64_t G = 0, N = 0;  // groups of B and C (this rank's; H a multiple of G), state dim (--mamba-state-dim)
  int64_t K = 4;         // the convolution's kernel width (Megatron's d_conv)
  int64_t chunk = 64;    // tokens between the scan forward's state checkpoints
  float norm_eps = 1e-5f;
  // [rows] each row's document id, non-decreasing along a sequence (--reset-attention-mask; on the
  // kernels' device); null: each sequence one document.
  const int32_t* documents = nullptr;
  LATTICE_HD int64_t rows() const { return B * T; }
  LATTICE_HD int64_t inner() const { return H * P; }              // d_inner (this rank's)
  LATTICE_HD int64_t gn() const { return G * N; }
  LATTICE_HD int64_t conv() const { return inner() + 2 * gn(); }  // Cc: the convolved channels x, B, C
  LATTICE_HD int64_t x_at() const { return inner(); }             // in x's row: z at 0, then x, B, C, dt
  LATTICE_HD int64_t dt_at() const { return x_at() + conv(); }
  LATTICE_HD int64_t width() const { return dt_at() + H; }        // W: in_proj's output row
  LATTICE_HD int64_t b_at() const { return inner(); }             // in u's row: xs at 0, then B, C
  LATTICE_HD int64_t c_at() const { return inner() + gn(); }
  LATTICE_HD int64_t heads_per_group() const { return H / G; }
  LATTICE_HD int64_t group_width() const { return inner() / G; }  // the norm's group
  LATTICE_HD int64_t state() const { return P * N; }              // one head's state
  LATTICE_HD int64_t chunks() const { return (T + chunk - 1) / chunk; }
  LATTICE_HD bool starts_document(int64_t n) const {
    return documents && n % T != 0 && documents[n] != documents[n - 1];
  }
  LATTICE_HD bool same_document(int64_t n, int64_t m) const { return !documents || documents[n] == documents[m]; }
};

namespace math {
// The convolution's pre-activation at row n and channel c (of the Cc): bias + the taps in order.
LATTICE_HD inline float mamba_conv_pre(const float* x, const float* w, const float* bias, int64_t n, int64_t c,
                                       const MambaShape& s) {
  const int64_t K = s.K, W = s.width(), at = s.x_at();
  float acc = 0.0f;
  for (int64_t j = causal_conv_first_tap(n, s); j < K; ++j) acc += w[c * K + j] * x[(n - K + 1 + j) * W + at + c];
  return acc + bias[c];
}
// One RMS over a group of D gated values v = y silu(z): 1 / sqrt(mean(v^2) + eps).
LATTICE_HD inline float mamba_gated_rstd(const float* y, const float* z, int64_t D, float eps) {
  float ss = 0.0f;
  for (int64_t d = 0; d < D; ++d) {
    const float v = y[d] * silu(z[d]);
    ss += v * v;
  }
  return 1.0f / sqrtf(ss / float(D) + eps);
}

// The chunked scan's decays (kernels/cpu/mamba.cpp's formulas; the GPU's kernels/cuda/mamba.cu computes the
// same). One head over the chunk of L tokens from row n0, its dt at dt[t * ldh], A < 0: doc[t] the documents
// started in the chunk up to token t, acum[t] = a_0 + ... + a_t (a = dt A, summed in double). Returns
// doc[L - 1], the chunk's last document.
LATTICE_HD inline int32_t mamba_chunk_cumsum(double* acum, int32_t* doc, const float* dt, int64_t ldh, float A,
                                             int64_t n0, int64_t L, const MambaShape& s) {
  double acc = 0.0;
  int32_t d = 0;
  for (int64_t t = 0; t < L; ++t) {
    if (s.starts_document(n0 + t)) ++d;
    doc[t] = d;
    acc += double(dt[t * ldh] * A);
    acum[t] = acc;
  }
  return d;
}
// Dec_tu = exp(Acum_t - Acum_u) for u <= t: the decay from token u to token t, 0 across documents.
LATTICE_HD inline float mamba_chunk_decay(const double* acum, const int32_t* doc, int64_t t, int64_t u) {
  return doc[u] == doc[t] ? exp(float(acum[t] - acum[u])) : 0.0f;
}
// e_t = exp(Acum_t): the decay of the state before the chunk to token t, 0 from the chunk's first document on.
LATTICE_HD inline float mamba_chunk_entry_decay(const double* acum, const int32_t* doc, int64_t t) {
  return doc[t] == 0 ? exp(float(acum[t])) : 0.0f;
}
}  // namespace math

// Fails naming the kernel `what` unless every dimension is positive and H a multiple of G.
void mamba_check_shape(const MambaShape& s, const char* what);

// u [rows, Cc] = silu(conv1d(x's x, B, C columns) + bias), w [Cc, K] (Megatron's conv1d.weight [Cc, 1, K]),
// bias [Cc]: u[b, t, c] = silu(bias[c] + sum_j w[c, j] x[b, t - K + 1 + j, x_at + c]), zeros before each
// sequence's (document's) start.
void mamba_conv_forward(float* u, const float* x, const float* w, const float* bias, const MambaShape& s);
// From du [rows, Cc]: dx's x, B, C columns written (the others left as they are); dw [Cc, K] and dbias [Cc]
// accumulated.
void mamba_conv_backward(float* dx, float* dw, float* dbias, const float* du, const float* x, const float* w,
                         const float* bias, const MambaShape& s);
// dt [rows, H] = softplus(x's dt columns + dt_bias).
void mamba_dt_forward(float* dt, const float* x, const float* dt_bias, const MambaShape& s);
// From d_dt [rows, H]: dx's dt columns written, d_dt_bias [H] accumulated.
void mamba_dt_backward(float* dx, float* d_dt_bias, const float* d_dt, const float* x, const float* dt_bias,
                       const MambaShape& s);
// The scan: y [rows, H, P] from u (xs, B, C), dt, A_log and D [H]. checkpoints [B, H, chunks, P, N]: each
// chunk's starting state (null: not kept). state [B, H, P, N]: where given, the states the sequences start
// from (instead of zeros), and their final states on return (decoding's carried state, model/gpt_inference.h;
// the backward does not take one).
void mamba_scan_forward(float* y, float* checkpoints, const float* u, const float* dt, const float* A_log,
                        const float* D, const MambaShape& s, float* state = nullptr);
// Its backward from dy [rows, H, P] and the forward's checkpoints: du (every column: xs, B, C) and d_dt
// [rows, H] written, dA_log and dD [H] accumulated. work: mamba_scan_work(s) floats, the GPU kernels'
// (the CPU's buffers are its threads' own; null there).
void mamba_scan_backward(float* du, float* d_dt, float* dA_log, float* dD, float* work, const float* dy,
                         const float* checkpoints, const float* u, const float* dt, const float* A_log, const float* D,
                         const MambaShape& s);
// The GPU scan backward's workspace: the gradient of each (sequence, head)'s state after each chunk
// ([B H chunks, P N], as large as the checkpoints), each chunk's decay of the state before it and its
// A_log and D gradients before the sums over the chunks and sequences ([3, B H chunks]), and each head's B
// and C gradients before the sum over the group's heads ([rows, H, 2, N]).
inline int64_t mamba_scan_work(const MambaShape& s) {
  return s.B * s.H * s.chunks() * (s.state() + 3) + s.rows() * s.H * 2 * s.N;
}
// out [rows, HP] = w * v * rstd, v = y silu(z) (z: x's z columns), rstd [rows, G] kept.
void mamba_gated_norm_forward(float* out, float* rstd, const float* y, const float* x, const float* w,
                              const MambaShape& s);
// From dout [rows, HP]: dy [rows, HP] and dx's z columns written, dw [HP] accumulated.
void mamba_gated_norm_backward(float* dy, float* dx, float* dw, const float* dout, const float* y, const float* x,
                               const float* w, const float* rstd, const MambaShape& s);

}  // namespace lattice
