// Gated DeltaNet (Megatron-Core's GatedDeltaNet, --experimental-attention-variant gated_delta_net; the
// linear attention of Qwen3-Next and Qwen3.5): the kernels of one GDN layer between its in_proj and its
// out_norm. Per token, from the in_proj's output row x [W] (GdnShape's layout: q, k, v, z, b, a):
//   u      = silu(causal depthwise conv1d over time of x[:Cc])            [Cc] (Cc = 2 Hk Dk + Hv Dv)
//   q, k   = u's first two Hk Dk, each key head l2-normalized (eps 1e-6 under the root), q times Dk^-1/2
//   v      = u's last Hv Dv
//   g[h]   = -exp(A_log[h]) softplus(a[h] + dt_bias[h]),   beta[h] = sigmoid(b[h])
// and per value head h (reading key head h / (Hv / Hk)), state S [Dk, Dv] from zeros at each sequence's
// start, the gated delta rule:
//   S = exp(g_t) S;  delta = beta_t (v_t - S^T k_t);  S = S + k_t delta^T;  o_t = S^T q_t      [Dv]
// With document ids (GdnShape::documents, --reset-attention-mask) each document of a sequence is a sequence
// of its own: the state starts from zeros at its first token (exp(g_t) taken as 0 there, so g_t has no
// gradient) and the convolution reads no row of another document.
// The out_norm of each o_t head (the model's LayerNorm or RMSNorm over Dv, kernels/layernorm.h) times
// silu(z) then goes to out_proj (gdn_output_gate_*).
//
// The state is kept column by column: S[:, j] is Dk contiguous floats ([Dv, Dk] per head). The forward
// saves the state every `chunk` tokens; the backward runs the sequence's chunks in reverse from these
// checkpoints. Both devices compute each chunk in closed form through products (the chunked algorithm,
// kernels/cpu/gated_delta_rule.cpp; on the GPU kernels/cuda/gated_delta_net.cu, chunk at most 64 there). The
// other kernels' row math and the chunks' decays are shared by both devices (math:: below); the CPU's
// other kernels are in kernels/cpu/gated_delta_net.cpp.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.h"
#include "kernels/activation_math.h"
#include "kernels/causal_conv_math.h"
#include "kernels/fast_math.h"

namespace lattice {

struct GdnShape {
  int64_t B = 0, T = 0;    // sequences, tokens each (rows n = b T + t)
  int64_t Hk = 0, Hv = 0;  // key heads, value heads (this rank's; Hv a multiple of Hk)
  int64_t Dk = 0, Dv = 0;  // key (query) and value head dims
  int64_t K = 4;           // the convolution's kernel width (--linear-conv-kernel-dim)
  int64_t chunk = 64;      // tokens between the forward's state checkpoints
  // [N] each row's document id, non-decreasing along a sequence (--reset-attention-mask; on the kernels'
  // device); null: each sequence one document.
  const int32_t* documents = nullptr;
  LATTICE_HD int64_t N() const { return B * T; }
  LATTICE_HD int64_t qk() const { return Hk * Dk; }
  LATTICE_HD int64_t v() const { return Hv * Dv; }
  LATTICE_HD int64_t conv() const { return 2 * qk() + v(); }       // Cc: the convolved channels q, k, v
  LATTICE_HD int64_t z_at() const { return conv(); }               // the output gate's Hv Dv
  LATTICE_HD int64_t b_at() const { return conv() + v(); }         // beta's Hv logits
  LATTICE_HD int64_t a_at() const { return b_at() + Hv; }          // the decay's Hv inputs
  LATTICE_HD int64_t width() const { return a_at() + Hv; }         // W: in_proj's output row
  LATTICE_HD int64_t chunks() const { return (T + chunk - 1) / chunk; }
  LATTICE_HD int64_t group() const { return Hv / Hk; }             // value heads per key head
  LATTICE_HD int64_t state() const { return Dv * Dk; }             // one head's state
  // Whether row n starts a document after the first of its sequence: the state before it is not carried.
  LATTICE_HD bool starts_document(int64_t n) const {
    return documents && n % T != 0 && documents[n] != documents[n - 1];
  }
  // Whether rows m <= n of one sequence are of one document (and so every row between them).
  LATTICE_HD bool same_document(int64_t n, int64_t m) const { return !documents || documents[n] == documents[m]; }
};

namespace math {
LATTICE_HD inline float silu(float x) { return x * sigmoid(x); }
LATTICE_HD inline float silu_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}
LATTICE_HD inline float softplus(float x) { return x > 20.0f ? x : log1pf(math::exp(x)); }
// The decay g = -exp(A_log) softplus(a + dt_bias), and its gradients times dg: with respect to a (and
// dt_bias) -exp(A_log) sigmoid(a + dt_bias) dg, with respect to A_log g dg.
LATTICE_HD inline float gdn_decay(float a, float A_log, float dt_bias) {
  return -math::exp(A_log) * softplus(a + dt_bias);
}

// The convolution's pre-activation at row n and channel c: x's rows are s.width() wide, w is [Cc, K].
LATTICE_HD inline float gdn_conv_pre(const float* x, const float* w, int64_t n, int64_t c, const GdnShape& s) {
  const int64_t K = s.K, W = s.width();
  float acc = 0.0f;
  for (int64_t j = causal_conv_first_tap(n, s); j < K; ++j) acc += w[c * K + j] * x[(n - K + 1 + j) * W + c];
  return acc;
}
// A head x [D] l2-normalized: out = x c / sqrt(|x|^2 + 1e-6) (c: the query's scale, else 1); and the
// gradient of that with respect to x from the output's dy: c r (dy - y (y . dy)) with r = 1 / sqrt(...), y = x r.
LATTICE_HD inline float gdn_inv_l2(const float* x, int64_t D) {
  float ss = 0.0f;
  for (int64_t d = 0; d < D; ++d) ss += x[d] * x[d];
  return 1.0f / sqrtf(ss + 1e-6f);
}
LATTICE_HD inline void gdn_l2norm_forward(float* out, const float* x, int64_t D, float c) {
  const float r = gdn_inv_l2(x, D) * c;
  for (int64_t d = 0; d < D; ++d) out[d] = x[d] * r;
}
LATTICE_HD inline void gdn_l2norm_backward(float* dx, const float* x, const float* dy, int64_t D, float c) {
  const float r = gdn_inv_l2(x, D);
  float dot = 0.0f;
  for (int64_t d = 0; d < D; ++d) dot += x[d] * r * dy[d];
  for (int64_t d = 0; d < D; ++d) dx[d] = c * r * (dy[d] - x[d] * r * dot);
}
// The gradients of the decay's input a (and of dt_bias) and of beta's logit b, from dg and dbeta.
LATTICE_HD inline float gdn_decay_grad(float a, float A_log, float dt_bias, float dg) {
  return -math::exp(A_log) * sigmoid(a + dt_bias) * dg;
}
LATTICE_HD inline float gdn_beta_grad(float b, float dbeta) {
  const float s = sigmoid(b);
  return dbeta * s * (1.0f - s);
}

// The chunked delta rule's decays (kernels/cpu/gated_delta_rule.cpp's formulas; the GPU's
// kernels/cuda/gated_delta_net.cu computes the same). One value head over the chunk of L tokens from row
// n0, its g at g[t * ldh]: doc[t] the documents started in the chunk up to token t, G[t] = g_0 + ... + g_t
// (summed in float). Returns doc[L - 1], the chunk's last document.
LATTICE_HD inline int32_t gdn_chunk_cumsum(float* G, int32_t* doc, const float* g, int64_t ldh, int64_t n0, int64_t L,
                                           const GdnShape& s) {
  float acc = 0.0f;
  int32_t d = 0;
  for (int64_t t = 0; t < L; ++t) {
    if (s.starts_document(n0 + t)) ++d;
    doc[t] = d;
    acc += g[t * ldh];
    G[t] = acc;
  }
  return d;
}
// Gm_tu = exp(G_t - G_u) for u <= t: the decay from token u to token t; 0 above the diagonal and across
// documents.
LATTICE_HD inline float gdn_chunk_decay(const float* G, const int32_t* doc, int64_t t, int64_t u) {
  return u <= t && doc[t] == doc[u] ? exp(G[t] - G[u]) : 0.0f;
}
// gamma_t = exp(G_t): the decay of the state before the chunk to token t, 0 from its first document on.
LATTICE_HD inline float gdn_chunk_entry_decay(const float* G, const int32_t* doc, int64_t t) {
  return doc[t] == 0 ? exp(G[t]) : 0.0f;
}

}  // namespace math

// Fails naming the kernel `what` unless every dimension is positive and Hv a multiple of Hk.
void gdn_check_shape(const GdnShape& s, const char* what);

// u [N, Cc] = silu(conv1d(x[:, :Cc])) with w [Cc, K] (Megatron's conv1d.weight [Cc, 1, K]):
// u[b, t, c] = silu(sum_j w[c, j] x[b, t - K + 1 + j, c]), zeros before each sequence's start.
void gdn_conv_forward(float* u, const float* x, const float* w, const GdnShape& s);
// From du [N, Cc] (the gradient of u): dx[:, :Cc] written (x's rows [N, W]; the other columns left as
// they are) and dw [Cc, K] accumulated.
void gdn_conv_backward(float* dx, float* dw, const float* du, const float* x, const float* w, const GdnShape& s);
// q, k [N, Hk, Dk] (normalized; q scaled), g, beta [N, Hv] from u and x's b and a slots.
void gdn_gates_forward(float* q, float* k, float* g, float* beta, const float* u, const float* x, const float* A_log,
                       const float* dt_bias, const GdnShape& s);
// From the gradients dq, dk [N, Hk, Dk], dg, dbeta [N, Hv]: du's q and k columns written (its v columns left
// as they are), dx's b and a slots written, dA_log and d_dt_bias [Hv] accumulated.
void gdn_gates_backward(float* du, float* dx, float* dA_log, float* d_dt_bias, const float* dq, const float* dk,
                        const float* dg, const float* dbeta, const float* u, const float* x, const float* A_log,
                        const float* dt_bias, const GdnShape& s);
// The gated delta rule: o [N, Hv, Dv] from q, k, the values in u's last Hv Dv columns, g and beta. state
// [B, Hv, Dv, Dk]: the states the sequences start from (from_state; zeros otherwise), the final states on
// return; checkpoints [B, Hv, chunks, Dv, Dk]: each chunk's starting state (null: not kept).
void gdn_delta_rule_forward(float* o, float* state, float* checkpoints, const float* q, const float* k, const float* u,
                            const float* g, const float* beta, const GdnShape& s, bool from_state = false);
// Its backward from d_o [N, Hv, Dv] and the forward's checkpoints: dq_v, dk_v [N, Hv, Dk] (each value head's
// share of its key head's gradients), du's v columns, dg and dbeta [N, Hv], all written. work:
// gdn_delta_rule_work(s) floats, the CUDA kernels'; the CPU's kernel ignores it (its chunk buffers are its
// threads' own), and it may then be null.
void gdn_delta_rule_backward(float* dq_v, float* dk_v, float* du, float* dg, float* dbeta, float* work,
                             const float* d_o, const float* checkpoints, const float* q, const float* k, const float* u,
                             const float* g, const float* beta, const GdnShape& s);
// The GPU backward's workspace: each chunk's Tm, K K^T and P ([3, B Hv chunks, chunk, chunk]), the gradient
// of each chunk's final state ([B Hv chunks, Dv, Dk], as large as the checkpoints), and K S0, Delta and their
// gradients per row ([4, N, Hv, Dv]).
inline int64_t gdn_delta_rule_work(const GdnShape& s) {
  const int64_t chunks = s.B * s.Hv * s.chunks();
  return chunks * (3 * s.chunk * s.chunk + s.state()) + 4 * s.N() * s.v();
}
// d [N, Hk, Dk] = the sum of d_v [N, Hv, Dk] over each key head's value heads (in head order).
void gdn_sum_key_heads(float* d, const float* d_v, const GdnShape& s);
// y [N, Hv, Dv] = n silu(z), z in x's z slot; and the backward: dn (may alias dy) and dx's z slot, written.
void gdn_output_gate_forward(float* y, const float* n, const float* x, const GdnShape& s);
void gdn_output_gate_backward(float* dn, float* dx, const float* dy, const float* n, const float* x,
                              const GdnShape& s);

}  // namespace lattice
