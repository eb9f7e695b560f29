#include "model/moe_layer.h"

#include <algorithm>
#include <cmath>

#include "core/device.h"
#include "core/error.h"
#include "dist/comm.h"
#include "kernels/dropout.h"
#include "kernels/moe.h"
#include "kernels/swiglu.h"

namespace lattice {
namespace {

// Pieces of a carved buffer start at multiples of 16 floats (64 bytes).
int64_t padded(int64_t n) { return (n + 15) / 16 * 16; }

// Hands out consecutive padded pieces of a buffer.
struct Carver {
  float* at;
  float* take(int64_t n) {
    float* p = at;
    at += padded(n);
    return p;
  }
  int32_t* take_ints(int64_t n) { return reinterpret_cast<int32_t*>(take(n)); }
};

// The MLP activation of rows [n, F] from fc1's outputs [n, F1] (GELU, or a gated unit's halves).
void activation_forward(float* act, float* h, int64_t n, int64_t F, const MoeShape& s) {
  if (s.glu)
    bias_swiglu_forward(h, act, h, nullptr, n, F, Rounding::none, s.glu_form);
  else
    gelu_forward(act, h, n * F, s.gelu);
}
// The same activation again from kept fc1 outputs h (moe_act), h untouched: a gated unit's
// pre-activation copy goes to scratch [n, F1].
void activation_again(float* act, const float* h, float* scratch, int64_t n, int64_t F, const MoeShape& s) {
  if (s.glu)
    bias_swiglu_forward(scratch, act, h, nullptr, n, F, Rounding::none, s.glu_form);
  else
    gelu_forward(act, h, n * F, s.gelu);
}
void activation_backward(float* d_h, const float* h, const float* d_act, int64_t n, int64_t F, const MoeShape& s) {
  if (s.glu)
    swiglu_backward(d_h, h, d_act, n, F, Rounding::none, s.glu_form);
  else
    gelu_backward(d_h, h, d_act, n * F, s.gelu);
}

// order[0, k): the k experts of the largest keys [E], the largest first (ties: the lower expert).
// Group-limited (s.groups > 0, Megatron's group_limited_topk): the experts are G equal groups, a
// group scores the sum of its k / group_topk largest keys, and the k come from the group_topk
// best groups (ties: the lower group).
void top_k_experts(std::vector<int32_t>& order, const std::vector<float>& key, const MoeShape& s) {
  const int64_t E = s.E, k = s.k;
  auto before = [&](int32_t a, int32_t b) { return key[size_t(a)] > key[size_t(b)] || (key[size_t(a)] == key[size_t(b)] && a < b); };
  order.clear();
  if (s.groups <= 0) {
    for (int64_t e = 0; e < E; ++e) order.push_back(int32_t(e));
    std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
    return;
  }
  const int64_t G = s.groups, per = E / G, kg = k / s.group_topk;
  std::vector<double> score(static_cast<size_t>(G));
  std::vector<int32_t> members(static_cast<size_t>(per)), groups(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t i = 0; i < per; ++i) members[size_t(i)] = int32_t(g * per + i);
    std::partial_sort(members.begin(), members.begin() + kg, members.end(), before);
    double sum = 0.0;
    for (int64_t i = 0; i < kg; ++i) sum += double(key[size_t(members[size_t(i)])]);
    score[size_t(g)] = sum;
    groups[size_t(g)] = int32_t(g);
  }
  std::partial_sort(groups.begin(), groups.begin() + s.group_topk, groups.end(), [&](int32_t a, int32_t b) {
    return score[size_t(a)] > score[size_t(b)] || (score[size_t(a)] == score[size_t(b)] && a < b);
  });
  for (int64_t i = 0; i < s.group_topk; ++i)
    for (int64_t e = 0; e < per; ++e) order.push_back(int32_t(groups[size_t(i)] * per + e));
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
}

// seq_aux_loss's sequences over N rows (0: none).
int64_t sequences(int64_t N, const MoeShape& s) {
  if (s.aux_group <= 0) return 0;
  return s.aux_sequences > 0 ? s.aux_sequences : N / s.aux_group;
}

// The shared experts' fc1 outputs, activation and outputs of x [N, C], and their gate.
void shared_experts_compute(const float* x, MoeState& st, const MoeWeights& w, int64_t N, const MoeShape& s) {
  const int64_t C = s.C;
  if (st.ident_rows < N) {  // a longer identity serves too
    std::vector<int32_t> ident(static_cast<size_t>(N));
    for (int64_t t = 0; t < N; ++t) ident[size_t(t)] = int32_t(t);
    copy_to_device(st.ident, ident.data(), ident.size() * sizeof(int32_t));
    st.ident_rows = N;
  }
  linear_forward(st.hs, x, w.shared_fc1, nullptr, N, C, s.Fs1(), w.shared_fc1_site);
  activation_forward(st.acts, st.hs, N, s.Fs, s);
  linear_forward(st.ys, st.acts, w.shared_fc2, nullptr, N, s.Fs, C, w.shared_fc2_site);
  if (s.shared_gate) {  // sigmoid(x . g) per token, in fp32 on the host
    linear_forward(st.sgate, x, w.shared_gate, nullptr, N, C, 1, w.shared_gate_site);
    std::vector<float> g(static_cast<size_t>(N));
    copy_to_host(g.data(), st.sgate, g.size() * sizeof(float));
    for (float& v : g) v = 1.0f / (1.0f + std::exp(-v));
    copy_to_device(st.sgate, g.data(), g.size() * sizeof(float));
  }
}

// y [N, C] += s[t] shared(x[t]) (s = 1 without the gate).
void shared_experts_forward(float* y, const float* x, MoeState& st, const MoeWeights& w, int64_t N, const MoeShape& s) {
  shared_experts_compute(x, st, w, N, s);
  moe_combine(y, st.ys, st.ident, s.shared_gate ? st.sgate : nullptr, N, 1, s.C, true);
}

// The shared experts' backward from dy [N, C]: dx [N, C] accumulates their input gradient (the
// gate's on the router_input_grad rank only), g their weights' gradients.
void shared_experts_backward(float* dx, const float* dy, const float* x, const MoeState& st, const MoeWeights& w,
                             MoeGrads& g, const MoeScratch& sc, int64_t N, const MoeShape& s, Comm* tp,
                             bool router_input_grad) {
  const int64_t C = s.C;
  const float* d_ys = dy;
  if (s.shared_gate) {  // d ys = s dy; d s = dot(dy, ys) (partial sums under TP); d logit = d s s (1 - s)
    moe_combine_backward(sc.d_ys, sc.d_sgate, dy, st.ys, st.sgate, st.ident, N, C);
    if (tp && tp->size() > 1) tp->all_reduce(sc.d_sgate, N, ReduceOp::sum);
    std::vector<float> gate(static_cast<size_t>(N)), d(static_cast<size_t>(N));
    copy_to_host(gate.data(), st.sgate, gate.size() * sizeof(float));
    copy_to_host(d.data(), sc.d_sgate, d.size() * sizeof(float));
    for (int64_t t = 0; t < N; ++t) d[size_t(t)] *= gate[size_t(t)] * (1.0f - gate[size_t(t)]);
    copy_to_device(sc.d_sgate, d.data(), d.size() * sizeof(float));
    d_ys = sc.d_ys;
  }
  linear_backward(sc.d_acts, g.shared_fc2, nullptr, d_ys, st.acts, w.shared_fc2, N, s.Fs, C, false, w.shared_fc2_site);
  activation_backward(sc.d_hs, st.hs, sc.d_acts, N, s.Fs, s);
  linear_backward(dx, g.shared_fc1, nullptr, sc.d_hs, x, w.shared_fc1, N, C, s.Fs1(), true, w.shared_fc1_site);
  if (s.shared_gate)
    linear_backward(router_input_grad ? dx : nullptr, g.shared_gate, nullptr, sc.d_sgate, x, w.shared_gate, N, C, 1,
                    true, w.shared_gate_site);
}

}  // namespace

MoeShape moe_shape(const TransformerConfig& c, int64_t tp, int64_t ep) {
  MoeShape s;
  s.ep = ep;
  s.E = c.num_experts;
  s.k = c.moe_router_topk;
  s.C = c.hidden_size;
  s.F = c.moe_ffn_hidden_size / c.expert_tp(tp);
  s.glu = c.gated_linear_unit();
  s.glu_form = c.glu_form();
  s.gelu = c.gelu;
  s.aux_loss_coeff = c.moe_aux_loss_coeff;
  s.seq_aux_loss_coeff = c.moe_seq_aux_loss ? c.moe_seq_aux_loss_coeff : 0.0f;
  s.global_aux_loss_coeff = c.moe_global_aux_loss ? c.moe_global_aux_loss_coeff : 0.0f;
  s.z_loss_coeff = c.moe_z_loss_coeff;
  s.pre_softmax = c.moe_router_pre_softmax;
  s.sigmoid = c.moe_router_sigmoid();
  s.groups = c.moe_router_num_groups;
  s.group_topk = c.moe_router_group_topk;
  s.expert_bias = c.moe_router_enable_expert_bias;
  s.scale = c.moe_router_topk_scaling_factor;
  s.L = c.moe_latent_size;
  s.Fs = c.moe_shared_expert_intermediate_size / tp;
  s.shared_apart = s.Fs > 0 && c.experts_whole(tp);
  s.shared_gate = c.moe_shared_expert_gate;
  s.probs_on_input = c.moe_apply_probs_on_input;
  s.recompute_act = c.recompute_moe_act();
  s.recompute_shared = c.recompute_shared_experts();
  s.input_jitter_eps = c.moe_input_jitter_eps;
  s.force_balance = c.moe_router_force_load_balancing;
  return s;
}

int64_t moe_shared_experts_floats(int64_t N, const MoeShape& s) {
  return s.Fs > 0 ? padded(N * s.Fs1()) + padded(N * s.Fs) + padded(N * s.C) + padded(N) : 0;
}

void moe_shared_experts_carve(MoeState& st, float* buf, int64_t N, const MoeShape& s) {
  if (s.Fs == 0) return;
  Carver c{buf};
  st.hs = c.take(N * s.Fs1());
  st.acts = c.take(N * s.Fs);
  st.ys = c.take(N * s.C);
  st.sgate = c.take(N);
}

int64_t moe_shared_state_floats(int64_t N, const MoeShape& s) {
  // the shared experts' buffers (unless shared between the layers) and their identity rows
  return s.Fs > 0 ? (s.recompute_shared ? 0 : moe_shared_experts_floats(N, s)) + padded(N) : 0;
}

void moe_shared_state_carve(MoeState& st, float* buf, int64_t N, const MoeShape& s) {
  if (s.Fs == 0) return;
  Carver c{buf};
  if (!s.recompute_shared) {
    moe_shared_experts_carve(st, c.take(moe_shared_experts_floats(N, s)), N, s);
  } else {
    st.hs = st.acts = st.ys = st.sgate = nullptr;
  }
  st.ident = c.take_ints(N);
  st.ident_rows = 0;
}

int64_t moe_state_floats(int64_t N, const MoeShape& s) {
  const int64_t S = N * s.k;
  const int64_t shared = s.shared_apart ? 0 : moe_shared_state_floats(N, s);
  // the rows' fc1 and activation
  const int64_t experts = s.ep > 1 ? 0 : padded(S * s.F1()) + (s.recompute_act ? 0 : padded(S * s.F));
  const int64_t jitter = s.input_jitter_eps > 0.0f ? padded(N * s.C) : 0;
  const int64_t latent = s.L > 0 ? 2 * padded(N * s.L) : 0;
  return padded(N * s.E) + 2 * padded(S) + padded(N * s.k) + 2 * padded(S * s.Ce()) + experts + shared + jitter +
         latent;
}

void moe_state_carve(MoeState& st, float* buf, int64_t N, const MoeShape& s) {
  const int64_t S = N * s.k;
  Carver c{buf};
  st.logits = c.take(N * s.E);
  st.rows = c.take_ints(S);
  st.slot_of = c.take_ints(N * s.k);
  st.gate = c.take(S);
  st.xe = c.take(S * s.Ce());
  st.h = s.ep > 1 ? nullptr : c.take(S * s.F1());
  st.act = s.ep > 1 || s.recompute_act ? nullptr : c.take(S * s.F);
  st.ye = c.take(S * s.Ce());
  if (!s.shared_apart) moe_shared_state_carve(st, c.take(moe_shared_state_floats(N, s)), N, s);
  st.xj = s.input_jitter_eps > 0.0f ? c.take(N * s.C) : nullptr;
  st.xl = s.L > 0 ? c.take(N * s.L) : nullptr;
  st.yl = s.L > 0 ? c.take(N * s.L) : nullptr;
}

int64_t moe_shared_scratch_floats(int64_t N, const MoeShape& s) {
  return s.Fs > 0 ? padded(N * s.C) + padded(N * s.Fs) + padded(N * s.Fs1()) + padded(N) : 0;
}

void moe_shared_scratch_carve(MoeScratch& sc, float* buf, int64_t N, const MoeShape& s) {
  if (s.Fs == 0) return;
  Carver c{buf};
  sc.d_ys = c.take(N * s.C);
  sc.d_acts = c.take(N * s.Fs);
  sc.d_hs = c.take(N * s.Fs1());
  sc.d_sgate = c.take(N);
}

namespace {
// MoeScratch::d_ye's floats: the slots' expert rows, and with input_jitter_eps the router's jittered input's
// gradient [N, C] (which goes there too).
int64_t d_ye_floats(int64_t N, const MoeShape& s) {
  return std::max(N * s.k * s.Ce(), s.input_jitter_eps > 0.0f ? N * s.C : 0);
}
}  // namespace

int64_t moe_scratch_floats(int64_t N, const MoeShape& s) {
  const int64_t S = N * s.k;
  const int64_t shared = s.shared_apart ? 0 : moe_shared_scratch_floats(N, s);
  const int64_t experts = s.ep > 1 ? 0 : padded(S * s.F) + padded(S * s.F1());
  return padded(d_ye_floats(N, s)) + experts + padded(S) + padded(N * s.E) + shared + (s.L > 0 ? padded(N * s.L) : 0);
}

void moe_scratch_carve(MoeScratch& sc, float* buf, int64_t N, const MoeShape& s) {
  const int64_t S = N * s.k;
  Carver c{buf};
  sc.d_ye = c.take(d_ye_floats(N, s));
  sc.d_act = s.ep > 1 ? nullptr : c.take(S * s.F);
  sc.d_h = s.ep > 1 ? nullptr : c.take(S * s.F1());
  sc.d_gate = c.take(S);
  sc.d_logits = c.take(N * s.E);
  if (!s.shared_apart) moe_shared_scratch_carve(sc, c.take(moe_shared_scratch_floats(N, s)), N, s);
  sc.d_yl = s.L > 0 ? c.take(N * s.L) : nullptr;
}

namespace {

// The routing's steps (moe_route), in order.

// st.scores [N, E]: the softmax over every expert (the load-balancing loss's, and the gates with
// pre_softmax); with sigmoid scores st.sig, the sigmoids, and st.scores them normalized.
void router_scores(MoeState& st, const float* logits, int64_t N, const MoeShape& s) {
  const int64_t E = s.E;
  for (int64_t t = 0; t < N; ++t)
    for (int64_t e = 0; e < E; ++e)
      if (!std::isfinite(logits[t * E + e]))
        LATTICE_FAIL() << "MoE router: logit " << logits[t * E + e] << " of token " << t << " for expert " << e
                       << " (the layer's input or the router's weight is not finite)";
  st.scores.resize(size_t(N * E));
  if (s.sigmoid) st.sig.resize(size_t(N * E));
  for (int64_t t = 0; t < N; ++t) {
    const float* l = logits + t * E;
    float* p = st.scores.data() + t * E;
    if (s.sigmoid) {
      float* q = st.sig.data() + t * E;
      float sum = 0.0f;
      for (int64_t e = 0; e < E; ++e) sum += (p[e] = q[e] = 1.0f / (1.0f + std::exp(-l[e])));
      for (int64_t e = 0; e < E; ++e) p[e] /= sum + 1e-20f;
      continue;
    }
    const float m = *std::max_element(l, l + E);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - m));
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
  }
}

// st.choice and st.gate_host [N, k]: each token's k experts, best first, and their gates.
void choose_experts(MoeState& st, const float* logits, int64_t N, const MoeShape& s, const float* bias) {
  const int64_t E = s.E, k = s.k;
  st.choice.resize(size_t(N * k));
  st.gate_host.resize(size_t(N * k));
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::vector<float> key(static_cast<size_t>(E));
  const std::vector<float> balanced = s.sinkhorn ? sinkhorn(logits, N, E) : std::vector<float>();
  for (int64_t t = 0; t < N; ++t) {
    const float* l = logits + t * E;
    // What the top-k ranks, as Megatron's compute_topk gets it: the sigmoid scores (plus the
    // bias), the softmax's probabilities (pre-softmax) or the logits; in a sinkhorn training
    // forward the Sinkhorn-normalized logits.
    for (int64_t e = 0; e < E; ++e)
      key[size_t(e)] = s.sinkhorn      ? balanced[size_t(t * E + e)]
                       : s.sigmoid     ? st.sig[size_t(t * E + e)] + (bias ? bias[e] : 0.0f)
                       : s.pre_softmax ? st.scores[size_t(t * E + e)]
                                       : l[e];
    top_k_experts(order, key, s);
    float m = 0.0f, sum = 0.0f;
    if (s.sigmoid) {  // the chosen scores, normalized
      for (int64_t j = 0; j < k; ++j) sum += st.sig[size_t(t * E + order[size_t(j)])];
    } else {  // the softmax over the chosen logits, in fp32 (the largest first)
      m = l[order[0]];
      for (int64_t j = 0; j < k; ++j) sum += std::exp(l[order[size_t(j)]] - m);
    }
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[size_t(j)];
      float g;
      if (s.sigmoid) {
        const float q = st.sig[size_t(t * E + e)];
        g = k > 1 ? q / (sum + 1e-20f) : q;
      } else {
        g = s.pre_softmax ? st.scores[size_t(t * E + e)] : std::exp(l[e] - m) / sum;
      }
      st.choice[size_t(t * k + j)] = e;
      st.gate_host[size_t(t * k + j)] = s.scale == 1.0f ? g : g * s.scale;
    }
  }
}

// Which of the N k (token, expert) pairs the experts keep: all, or with a capacity each expert's
// first ceil(N k / E f) by gate (ties: the earlier token) or by position.
std::vector<bool> kept_pairs(const MoeState& st, int64_t N, const MoeShape& s) {
  const int64_t E = s.E, S = N * s.k;
  std::vector<bool> kept(static_cast<size_t>(S), true);
  if (s.capacity_factor <= 0.0) return kept;
  const int64_t cap = int64_t(std::ceil(double(S) / double(E) * s.capacity_factor));
  std::vector<std::vector<int64_t>> pairs(static_cast<size_t>(E));  // t k + j, token order
  for (int64_t i = 0; i < S; ++i) pairs[size_t(st.choice[size_t(i)])].push_back(i);
  for (std::vector<int64_t>& p : pairs) {
    if (int64_t(p.size()) <= cap) continue;
    if (!s.drop_by_position)
      std::stable_sort(p.begin(), p.end(),
                       [&](int64_t a, int64_t b) { return st.gate_host[size_t(a)] > st.gate_host[size_t(b)]; });
    for (size_t r = size_t(cap); r < p.size(); ++r) kept[size_t(p[r])] = false;
  }
  return kept;
}

// The kept pairs' slots, grouped by expert (tokens in order within one): st.offsets, and the
// device index buffers rows, slot_of (-1: dropped) and gate.
void assign_slots(MoeState& st, const std::vector<bool>& kept, int64_t N, const MoeShape& s) {
  const int64_t E = s.E, k = s.k, S = N * k;
  std::vector<int64_t> counts(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < S; ++i)
    if (kept[size_t(i)]) ++counts[size_t(st.choice[size_t(i)])];
  st.offsets.assign(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) st.offsets[size_t(e + 1)] = st.offsets[size_t(e)] + counts[size_t(e)];
  const int64_t kept_slots = st.offsets[size_t(E)];
  std::vector<int32_t> rows(static_cast<size_t>(kept_slots)), slot_of(static_cast<size_t>(S), -1);
  std::vector<float> gate(static_cast<size_t>(kept_slots));
  std::vector<int64_t> cursor(st.offsets.begin(), st.offsets.end() - 1);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < k; ++j) {
      if (!kept[size_t(t * k + j)]) continue;
      const int64_t slot = cursor[size_t(st.choice[size_t(t * k + j)])]++;
      rows[size_t(slot)] = int32_t(t);
      slot_of[size_t(t * k + j)] = int32_t(slot);
      gate[size_t(slot)] = st.gate_host[size_t(t * k + j)];
    }
  copy_to_device(st.rows, rows.data(), size_t(kept_slots) * sizeof(int32_t));
  copy_to_device(st.slot_of, slot_of.data(), size_t(S) * sizeof(int32_t));
  copy_to_device(st.gate, gate.data(), size_t(kept_slots) * sizeof(float));
  st.slot_of_host = std::move(slot_of);
}

// The load-balancing losses (st.counts, st.group_counts, st.balance, st.seq_balance, st.aux_loss):
// the probabilities weighted by the experts' token counts over the micro-batch and over each
// sequence of aux_group rows (seq_aux_loss), the latter averaged over the sequences; with this rank's
// own counts and probability sums (global_aux_loss's, moe_global_balance); and the z-loss's
// logsumexps (st.lse, st.z; in double: lse^2 sums many). The counts are those of each token's
// plain top k of the probabilities (Megatron's compute_routing_scores_for_aux_loss): before any
// drop, without the expert bias or the group limit (with neither, the routing's own choice).
void router_losses(MoeState& st, const float* logits, int64_t N, const MoeShape& s, Comm* cp) {
  const int64_t E = s.E, k = s.k;
  const int64_t Ng = s.aux_group, G = sequences(N, s), r0 = s.aux_row0;
  LATTICE_CHECK(Ng == 0 || s.aux_sequences > 0 || N % Ng == 0)
      << "moe_route: " << N << " rows are no whole sequences of " << Ng;
  LATTICE_CHECK(Ng == 0 || r0 + N <= G * Ng) << "moe_route: rows " << r0 << " + " << N << " beyond " << G
                                              << " sequences of " << Ng;
  // One buffer for the reduction: [E] the micro-batch's counts, then [G, E] the sequences'.
  std::vector<double> counts(size_t((1 + G) * E), 0.0);
  st.prob_sums.assign(size_t(E), 0.0);
  const bool own_choice = !s.expert_bias && s.groups <= 0;
  MoeShape plain = s;
  plain.groups = plain.group_topk = 0;
  std::vector<int32_t> order;
  std::vector<float> key(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    if (!own_choice) {
      key.assign(st.scores.begin() + t * E, st.scores.begin() + (t + 1) * E);
      top_k_experts(order, key, plain);
    }
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = own_choice ? st.choice[size_t(t * k + j)] : order[size_t(j)];
      counts[size_t(e)] += 1.0;
      if (G > 0) counts[size_t(E + (r0 + t) / Ng * E + e)] += 1.0;
    }
    for (int64_t e = 0; e < E; ++e) st.prob_sums[size_t(e)] += double(st.scores[size_t(t * E + e)]);
  }
  st.local_counts.assign(counts.begin(), counts.begin() + E);
  // Context parallelism: the micro-batch's and each sequence's other tokens are on the other ranks.
  const int R = cp ? cp->size() : 1;
  st.stat_ranks = R;
  if (R > 1) cp->all_reduce(counts.data(), int64_t(counts.size()), ReduceOp::sum);
  st.counts.assign(counts.begin(), counts.begin() + E);
  st.group_counts.assign(counts.begin() + E, counts.end());
  // The micro-batch's share: its tokens on every rank.
  const double Nr = double(N) * double(R);
  double balance = 0.0;
  for (int64_t e = 0; e < E; ++e) balance += st.prob_sums[size_t(e)] * st.counts[size_t(e)];
  st.balance = N > 0 ? balance * double(E) / (double(k) * Nr * Nr) : 0.0;
  double seq = 0.0;
  const double Ngr = double(Ng) * double(R) / double(s.aux_split);  // a sequence's tokens on all the ranks
  for (int64_t g = 0; g < G; ++g) {
    double group = 0.0;
    for (int64_t t = std::max<int64_t>(g * Ng - r0, 0); t < std::min((g + 1) * Ng - r0, N); ++t)
      for (int64_t e = 0; e < E; ++e) group += double(st.scores[size_t(t * E + e)]) * st.group_counts[size_t(g * E + e)];
    seq += group * double(E) / (double(k) * Ngr * Ngr);
  }
  st.seq_balance = G > 0 ? seq / double(G) : 0.0;
  st.lse.resize(size_t(N));
  double z = 0.0;
  for (int64_t t = 0; t < N; ++t) {
    const float* l = logits + t * E;
    const double m = double(*std::max_element(l, l + E));
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(double(l[e]) - m);
    const double lse = m + std::log(sum);
    st.lse[size_t(t)] = float(lse);
    z += lse * lse;
  }
  st.z = N > 0 ? z / (double(N) * double(R)) : 0.0;
  if (R > 1) {  // this rank's shares of the losses, summed: the whole micro-batch's, as reported
    double shares[3] = {st.balance, st.seq_balance, st.z};
    cp->all_reduce(shares, 3, ReduceOp::sum);
    st.balance = shares[0];
    st.seq_balance = shares[1];
    st.z = shares[2];
  }
  st.aux_loss = st.balance * double(s.aux_loss_coeff) + st.seq_balance * double(s.seq_aux_loss_coeff);
}

}  // namespace

void moe_route(MoeState& st, const float* logits, int64_t N, const MoeShape& s, const float* bias, Comm* cp) {
  LATTICE_CHECK(s.k >= 1 && s.k <= s.E) << "moe_route: top-" << s.k << " of " << s.E << " experts";
  LATTICE_CHECK(!s.expert_bias || bias) << "moe_route: the expert bias is missing";
  router_scores(st, logits, N, s);
  choose_experts(st, logits, N, s, bias);
  assign_slots(st, kept_pairs(st, N, s), N, s);
  router_losses(st, logits, N, s, cp);
}

double moe_global_balance(std::vector<double>& avg, double& tokens, const MoeState& st, MoeGlobalBalance& g,
                          int64_t N, const MoeShape& s, Comm* cp, Comm* dp) {
  const int64_t E = s.E;
  LATTICE_CHECK(int64_t(st.local_counts.size()) == E && int64_t(st.prob_sums.size()) == E)
      << "moe_global_balance: no routing to count";
  // [E] counts, [E] probability sums, summed over every rank holding other tokens of the step.
  std::vector<double> v(st.local_counts);
  v.insert(v.end(), st.prob_sums.begin(), st.prob_sums.end());
  int64_t ranks = 1;
  for (Comm* c : {cp, dp})
    if (c && c->size() > 1) {
      c->all_reduce(v.data(), int64_t(v.size()), ReduceOp::sum);
      ranks *= c->size();
    }
  if (g.counts.empty()) g.counts.assign(size_t(E), 0.0);
  for (int64_t e = 0; e < E; ++e) g.counts[size_t(e)] += v[size_t(e)];
  g.steps += 1;
  avg.resize(size_t(E));
  for (int64_t e = 0; e < E; ++e) avg[size_t(e)] = g.counts[size_t(e)] / double(g.steps);
  tokens = double(N) * double(ranks);
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) sum += v[size_t(E + e)] * avg[size_t(e)];
  return tokens > 0 ? sum * double(E) / (double(s.k) * tokens * tokens) : 0.0;
}

std::vector<float> sinkhorn(const float* logits, int64_t N, int64_t E) {
  std::vector<float> c(static_cast<size_t>(N * E)), d0(static_cast<size_t>(N), 1.0f), d1(static_cast<size_t>(E), 1.0f);
  for (size_t i = 0; i < c.size(); ++i) c[i] = std::exp(logits[i]);
  const float eps = 1e-8f;
  float error = 1e9f;
  std::vector<float> d1_old = d1;
  while (error > 1e-4f) {
    for (int64_t t = 0; t < N; ++t) {
      float sum = 0.0f;
      for (int64_t e = 0; e < E; ++e) sum += d1[size_t(e)] * c[size_t(t * E + e)];
      d0[size_t(t)] = (1.0f / float(N)) * 1.0f / (sum + eps);
    }
    for (int64_t e = 0; e < E; ++e) {
      float sum = 0.0f;
      for (int64_t t = 0; t < N; ++t) sum += d0[size_t(t)] * c[size_t(t * E + e)];
      d1[size_t(e)] = (1.0f / float(E)) * 1.0f / (sum + eps);
    }
    float change = 0.0f;
    for (int64_t e = 0; e < E; ++e) change += std::fabs(d1_old[size_t(e)] - d1[size_t(e)]);
    error = change / float(E);
    d1_old = d1;
  }
  for (int64_t t = 0; t < N; ++t)
    for (int64_t e = 0; e < E; ++e) c[size_t(t * E + e)] *= d1[size_t(e)] * d0[size_t(t)];
  return c;
}

int MoeExpertParallel::size() const { return comm ? comm->size() : 1; }
int MoeExpertParallel::rank() const { return comm ? comm->rank() : 0; }

namespace {

// The local experts' MLPs over rows grouped by expert (offsets [El + 1]): xe [R, C] -> h [R, F1],
// act [R, F], ye [R, C] (C the experts' width, Ce).
void experts_forward(float* ye, float* h, float* act, const float* xe, const std::vector<int64_t>& offsets,
                     const MoeWeights& w, const MoeShape& s) {
  const int64_t El = int64_t(offsets.size()) - 1, C = s.Ce(), F = s.F, F1 = s.F1(), R = offsets.back();
  const bool biases = !w.fc1_bias.empty();
  for (int64_t e = 0; e < El; ++e) {
    const int64_t o = offsets[size_t(e)], n = offsets[size_t(e + 1)] - o;
    if (n > 0)
      linear_forward(h + o * F1, xe + o * C, w.fc1[size_t(e)], biases ? w.fc1_bias[size_t(e)] : nullptr, n, C, F1,
                     w.fc1_site[size_t(e)]);
  }
  activation_forward(act, h, R, F, s);
  for (int64_t e = 0; e < El; ++e) {
    const int64_t o = offsets[size_t(e)], n = offsets[size_t(e + 1)] - o;
    if (n > 0)
      linear_forward(ye + o * C, act + o * F, w.fc2[size_t(e)],
                     biases && w.add_fc2_bias ? w.fc2_bias[size_t(e)] : nullptr, n, F, C, w.fc2_site[size_t(e)]);
  }
}

// Their backward from d_ye [R, C]: d_xe [R, C] (written; may be d_ye, read first), the weights'
// gradients accumulated; d_act [R, F] and d_h [R, F1] scratch.
void experts_backward(float* d_xe, float* d_act, float* d_h, const float* d_ye, const float* xe, const float* h,
                      const float* act, const std::vector<int64_t>& offsets, const MoeWeights& w, MoeGrads& g,
                      const MoeShape& s) {
  const int64_t El = int64_t(offsets.size()) - 1, C = s.Ce(), F = s.F, F1 = s.F1(), R = offsets.back();
  const bool biases = !g.fc1_bias.empty();
  for (int64_t e = 0; e < El; ++e) {
    const int64_t o = offsets[size_t(e)], n = offsets[size_t(e + 1)] - o;
    if (n > 0)
      linear_backward(d_act + o * F, g.fc2[size_t(e)], biases ? g.fc2_bias[size_t(e)] : nullptr, d_ye + o * C,
                      act + o * F, w.fc2[size_t(e)], n, F, C, false, w.fc2_site[size_t(e)]);
  }
  activation_backward(d_h, h, d_act, R, F, s);
  for (int64_t e = 0; e < El; ++e) {
    const int64_t o = offsets[size_t(e)], n = offsets[size_t(e + 1)] - o;
    if (n > 0)
      linear_backward(d_xe + o * C, g.fc1[size_t(e)], biases ? g.fc1_bias[size_t(e)] : nullptr, d_h + o * F1,
                      xe + o * C, w.fc1[size_t(e)], n, C, F1, false, w.fc1_site[size_t(e)]);
  }
}

// The dispatch's plan (expert parallelism): every rank's token count per expert (one all-reduce
// over the group), then the rows this rank sends to and receives from each rank, its local
// experts' row offsets and the permutation between received and expert order (uploaded).
// Returns R, the rows received.
int64_t plan_dispatch(MoeState& st, const MoeExpertParallel& ep, const MoeShape& s) {
  const int P = ep.size(), me = ep.rank();
  const int64_t E = s.E, El = E / P;
  std::vector<double> counts(size_t(P * E), 0.0);  // [P, E] rows of each rank's tokens per expert
  for (int64_t e = 0; e < E; ++e) counts[size_t(me * E + e)] = double(st.offsets[size_t(e + 1)] - st.offsets[size_t(e)]);
  ep.comm->all_reduce(counts.data(), int64_t(counts.size()), ReduceOp::sum);
  auto count = [&](int q, int64_t e) { return int64_t(counts[size_t(q * E + e)]); };
  st.ep_send.assign(size_t(P), 0);
  st.ep_recv.assign(size_t(P), 0);
  for (int p = 0; p < P; ++p) {
    st.ep_send[size_t(p)] = st.offsets[size_t((p + 1) * El)] - st.offsets[size_t(p * El)];
    for (int64_t j = 0; j < El; ++j) st.ep_recv[size_t(p)] += count(p, me * El + j);
  }
  // Received: source rank, then local expert; expert order: local expert, then source rank.
  std::vector<int64_t> recv_first(size_t(P * El));  // [P, El] the first received row of (q, j)
  int64_t r = 0;
  for (int q = 0; q < P; ++q)
    for (int64_t j = 0; j < El; ++j) {
      recv_first[size_t(q * El + j)] = r;
      r += count(q, me * El + j);
    }
  const int64_t R = r;
  std::vector<int32_t> perm(size_t(2 * R));
  st.ep_offsets.assign(size_t(El + 1), 0);
  int64_t i = 0;
  for (int64_t j = 0; j < El; ++j) {
    st.ep_offsets[size_t(j)] = i;
    for (int q = 0; q < P; ++q)
      for (int64_t n = 0; n < count(q, me * El + j); ++n, ++i) {
        const int64_t from = recv_first[size_t(q * El + j)] + n;
        perm[size_t(i)] = int32_t(from);
        perm[size_t(R + from)] = int32_t(i);
      }
  }
  st.ep_offsets[size_t(El)] = R;
  int32_t* d = st.ep_perm.resize(size_t(2 * R));
  if (R > 0) copy_to_device(d, perm.data(), perm.size() * sizeof(int32_t));
  return R;
}

// Rows to elements: each rank's row count times the row width.
std::vector<int64_t> elements(const std::vector<int64_t>& rows, int64_t width) {
  std::vector<int64_t> e(rows);
  for (int64_t& x : e) x *= width;
  return e;
}

// The experts' part of the forward under expert parallelism: st.xe [S, C] (grouped by expert, so
// by rank) out to the experts' ranks, their outputs back into st.ye [S, C] (C the experts' width, Ce).
void dispatched_experts_forward(MoeState& st, const MoeWeights& w, const MoeShape& s) {
  const int64_t C = s.Ce(), F = s.F, F1 = s.F1();
  const int64_t R = plan_dispatch(st, w.ep, s);
  const int64_t kept_act = s.recompute_act ? 0 : F;  // moe_act: the activation in the scratch, after b
  float* rows = st.ep_rows.resize(size_t(R * (C + F1 + kept_act)));
  float* a = w.ep.scratch->resize(size_t(R * (2 * C + F - kept_act)));
  float* b = a + R * C;
  float *xs = rows, *h = rows + R * C, *act = s.recompute_act ? b + R * C : h + R * F1;
  const int32_t* to_expert_order = st.ep_perm.data();
  const int32_t* to_received_order = to_expert_order + R;
  w.ep.comm->all_to_all(st.xe, elements(st.ep_send, C), a, elements(st.ep_recv, C));
  moe_gather_rows(xs, a, to_expert_order, R, C);
  experts_forward(b, h, act, xs, st.ep_offsets, w, s);
  moe_gather_rows(a, b, to_received_order, R, C);
  w.ep.comm->all_to_all(a, elements(st.ep_recv, C), st.ye, elements(st.ep_send, C));
}

// Its backward: the output gradients d_ye [S, C] out to the experts' ranks, the input gradients
// back into d_xe [S, C] (may be d_ye).
void dispatched_experts_backward(float* d_xe, const float* d_ye, const MoeState& st, const MoeWeights& w, MoeGrads& g,
                                 const MoeShape& s) {
  const int64_t C = s.Ce(), F = s.F, F1 = s.F1(), R = st.ep_offsets.back();
  const float* xs = st.ep_rows.data();
  const float* h = xs + R * C;
  float* a = w.ep.scratch->resize(size_t(R * (2 * C + F + F1 + (s.recompute_act ? F : 0))));
  float *b = a + R * C, *d_act = b + R * C, *d_h = d_act + R * F;
  const float* act = h + R * F1;
  if (s.recompute_act) {  // moe_act: the activation again from the kept fc1 outputs, after d_h
    float* again = d_h + R * F1;
    activation_again(again, h, d_h, R, F, s);
    act = again;
  }
  const int32_t* to_expert_order = st.ep_perm.data();
  const int32_t* to_received_order = to_expert_order + R;
  w.ep.comm->all_to_all(d_ye, elements(st.ep_send, C), a, elements(st.ep_recv, C));
  moe_gather_rows(b, a, to_expert_order, R, C);
  experts_backward(a, d_act, d_h, b, xs, h, act, st.ep_offsets, w, g, s);
  moe_gather_rows(b, a, to_received_order, R, C);
  w.ep.comm->all_to_all(b, elements(st.ep_recv, C), d_xe, elements(st.ep_send, C));
}

// The token runs cover rows [0, N) in order (input jitter, forced balance).
void token_runs_check(const MoeWeights& w, int64_t N) {
  int64_t next = 0;
  for (const MoeWeights::TokenRun& r : w.token_runs) {
    LATTICE_CHECK(r.row == next && r.rows >= 0 && r.token >= 0)
        << "moe token runs: a run at row " << r.row << " (token " << r.token << "), expected row " << next;
    next += r.rows;
  }
  LATTICE_CHECK(next == N) << "moe token runs: they cover " << next << " of " << N << " rows";
}

}  // namespace

void moe_forward(float* y, const float* x, MoeState& st, const MoeWeights& w, int64_t N, const MoeShape& s) {
  const int64_t E = s.E, C = s.C;
  const int P = w.ep.size();
  LATTICE_CHECK(P == s.ep) << "moe_forward: buffers carved for " << s.ep << " expert-parallel ranks, " << P << " in the group";
  LATTICE_CHECK(E % P == 0 && int64_t(w.fc1.size()) == E / P && int64_t(w.fc2.size()) == E / P)
      << "moe_forward: " << E / P << " experts' weights on each of " << P << " expert-parallel ranks";
  LATTICE_CHECK(P == 1 || w.ep.scratch) << "moe_forward: expert parallelism without its scratch";
  LATTICE_CHECK(w.fc1_bias.size() == w.fc2_bias.size() && (w.fc1_bias.empty() || w.fc1_bias.size() == w.fc1.size()))
      << "moe_forward: " << w.fc1_bias.size() << " fc1 and " << w.fc2_bias.size() << " fc2 biases for " << w.fc1.size()
      << " experts";
  const float* router_in = x;
  if (s.input_jitter_eps > 0.0f) {  // the router's noisy copy of x
    token_runs_check(w, N);
    LATTICE_CHECK(st.xj) << "moe input jitter: the state was carved without its buffer (input_jitter_eps 0)";
    for (const MoeWeights::TokenRun& r : w.token_runs)
      input_jitter_forward(st.xj + r.row * C, x + r.row * C, r.rows * C, s.input_jitter_eps, w.jitter_stream,
                           uint64_t(r.token * C));
    router_in = st.xj;
  }
  linear_forward(st.logits, router_in, w.router, w.router_bias, N, C, E, w.router_site);
  std::vector<float>& logits = st.logits_host;
  std::vector<float> bias;
  logits.resize(size_t(N * E));
  copy_to_host(logits.data(), st.logits, logits.size() * sizeof(float));
  if (s.force_balance) {  // the routing reads standard normal draws instead (the router's GEMM stays: its backward)
    token_runs_check(w, N);
    for (const MoeWeights::TokenRun& r : w.token_runs)
      for (int64_t i = 0; i < r.rows * E; ++i)
        logits[size_t(r.row * E + i)] = float(w.balance_stream.normal(uint64_t(r.token * E + i)));
  }
  if (s.expert_bias) {
    LATTICE_CHECK(w.expert_bias) << "moe_forward: the expert bias is missing";
    bias.resize(size_t(E));
    copy_to_host(bias.data(), w.expert_bias, bias.size() * sizeof(float));
  }
  moe_route(st, logits.data(), N, s, s.expert_bias ? bias.data() : nullptr, w.token_group);
  const int64_t S = st.offsets[size_t(E)];  // the slots kept (N k without a capacity)
  // --moe-latent-size: the experts' rows from the latent input, their weighted sum in the latent space.
  const int64_t Ce = s.Ce();
  const float* xin = x;
  if (s.L > 0) {
    linear_forward(st.xl, x, w.latent_fc1, nullptr, N, C, s.L, w.latent_fc1_site);
    xin = st.xl;
  }
  // --moe-apply-probs-on-input: the gates weigh the experts' input rows, not their outputs.
  moe_gather_rows(st.xe, xin, st.rows, S, Ce, s.probs_on_input ? st.gate : nullptr);
  if (P > 1)
    dispatched_experts_forward(st, w, s);
  else
    experts_forward(st.ye, st.h, st.act, st.xe, st.offsets, w, s);
  moe_combine(s.L > 0 ? st.yl : y, st.ye, st.slot_of, s.probs_on_input ? nullptr : st.gate, N, s.k, Ce, false);
  if (s.L > 0) linear_forward(y, st.yl, w.latent_fc2, nullptr, N, s.L, C, w.latent_fc2_site);
  if (s.Fs > 0 && !s.shared_apart) shared_experts_forward(y, x, st, w, N, s);
}

void moe_shared_forward(float* y, const float* x, MoeState& st, const MoeWeights& w, int64_t N, const MoeShape& s) {
  if (s.Fs > 0) shared_experts_forward(y, x, st, w, N, s);
}

void moe_shared_backward(float* dx, const float* dy, const float* x, MoeState& st, const MoeWeights& w, MoeGrads& g,
                         const MoeScratch& sc, int64_t N, const MoeShape& s, Comm* tp, bool gate_input_grad) {
  if (s.Fs == 0) return;
  // shared_experts: their buffers again from the kept input (into the buffer the layers share).
  if (s.recompute_shared) shared_experts_compute(x, st, w, N, s);
  shared_experts_backward(dx, dy, x, st, w, g, sc, N, s, tp, gate_input_grad);
}

void moe_backward(float* dx, const float* dy, const float* x, MoeState& st, const MoeWeights& w, MoeGrads& g,
                  const MoeScratch& sc, int64_t N, const MoeShape& s, float aux_grad_scale, Comm* tp,
                  bool router_input_grad) {
  const int64_t E = s.E, k = s.k, C = s.C, Ce = s.Ce(), S = st.offsets[size_t(E)];  // slots kept
  // --moe-latent-size: fc2_latent_proj's backward first; the experts' sum's gradient d_yl [N, L].
  const float* dye = dy;
  if (s.L > 0) {
    linear_backward(sc.d_yl, g.latent_fc2, nullptr, dy, st.yl, w.latent_fc2, N, s.L, C, false, w.latent_fc2_site);
    dye = sc.d_yl;
  }
  if (s.probs_on_input) {
    moe_gather_rows(sc.d_ye, dye, st.rows, S, Ce);  // the unweighted sum's gradient; the gates' come below
  } else {
    moe_combine_backward(sc.d_ye, sc.d_gate, dye, st.ye, st.gate, st.rows, S, Ce);
    if (tp && tp->size() > 1) tp->all_reduce(sc.d_gate, S, ReduceOp::sum);
  }
  float* d_xe = sc.d_ye;  // fc2's output gradients are read: the experts' input gradients go there
  if (w.ep.size() > 1)
    dispatched_experts_backward(d_xe, sc.d_ye, st, w, g, s);
  else {
    // moe_act: the activation again from the kept fc1 outputs (into the buffer the layers share).
    if (s.recompute_act) activation_again(st.act, st.h, sc.d_h, S, s.F, s);
    experts_backward(d_xe, sc.d_act, sc.d_h, sc.d_ye, st.xe, st.h, st.act, st.offsets, w, g, s);
  }
  // The experts' input rows' gradient summed per token: dx, or with the latent xl's (into d_yl, read by now).
  float* dxin = s.L > 0 ? sc.d_yl : dx;
  if (s.probs_on_input) {
    // xe = gate x[rows]: d gate = dot(x[rows], d xe) (a tensor-parallel rank's part of d xe: summed
    // over the group), dx = the gates times d xe, summed per token.
    moe_combine_backward(nullptr, sc.d_gate, s.L > 0 ? st.xl : x, d_xe, nullptr, st.rows, S, Ce);
    if (tp && tp->size() > 1) tp->all_reduce(sc.d_gate, S, ReduceOp::sum);
    moe_combine(dxin, d_xe, st.slot_of, st.gate, N, k, Ce, false);
  } else {
    moe_combine(dxin, d_xe, st.slot_of, nullptr, N, k, Ce, false);
  }
  if (s.L > 0)  // fc1_latent_proj: dx written from xl's gradient
    linear_backward(dx, g.latent_fc1, nullptr, sc.d_yl, x, w.latent_fc1, N, C, s.L, false, w.latent_fc1_site);
  if (!s.shared_apart) moe_shared_backward(dx, dy, x, st, w, g, sc, N, s, tp, router_input_grad);
  // The router: the gates' softmax's backward (over each token's k experts, or with
  // pre_softmax over all E, only the chosen ones' probabilities having a gradient), and the
  // load-balancing loss's through the softmax over all E. q = gate / scale, dq = d_gate scale:
  // q dq = gate d_gate. Sigmoid scores: the gradients with respect to the scores s first
  // (gate_j = scale s_j / S, S their sum: d s_i = (scale d gate_i - sum_j gate_j d gate_j) / S; the
  // load-balancing loss's through p = s / sum_all s), then through the sigmoid, s (1 - s).
  std::vector<float> d_gate(static_cast<size_t>(S)), d_logits(static_cast<size_t>(N * E), 0.0f);
  copy_to_host(d_gate.data(), sc.d_gate, d_gate.size() * sizeof(float));
  auto dgate = [&](int64_t i) {  // the gradient of pair i's gate; 0 for a dropped pair
    const int32_t slot = st.slot_of_host[size_t(i)];
    return slot < 0 ? 0.0f : d_gate[size_t(slot)];
  };
  for (int64_t t = 0; t < N; ++t) {
    float dot = 0.0f;
    for (int64_t j = 0; j < k; ++j)
      dot += st.gate_host[size_t(t * k + j)] * dgate(t * k + j);
    if (s.sigmoid) {
      const float* q = st.sig.data() + t * E;
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) sum += q[st.choice[size_t(t * k + j)]];
      for (int64_t j = 0; j < k; ++j) {
        const float dg = dgate(t * k + j);
        d_logits[size_t(t * E + st.choice[size_t(t * k + j)])] =
            k > 1 ? (s.scale * dg - dot) / (sum + 1e-20f) : s.scale * dg;
      }
      continue;
    }
    if (s.pre_softmax) {  // d l_e = p_e (dp_e - sum_chosen p dp), dp_e = 0 unless e is chosen
      const float* p = st.scores.data() + t * E;
      for (int64_t e = 0; e < E; ++e) d_logits[size_t(t * E + e)] = -p[e] * dot;
    }
    for (int64_t j = 0; j < k; ++j) {
      const float g = st.gate_host[size_t(t * k + j)], dg = dgate(t * k + j);
      d_logits[size_t(t * E + st.choice[size_t(t * k + j)])] += g * dg - (s.pre_softmax ? 0.0f : g * dot / s.scale);
    }
  }
  const bool global = s.global_aux_loss_coeff > 0.0f;
  if ((s.aux_loss_coeff > 0.0f || s.seq_aux_loss_coeff > 0.0f || global) && N > 0) {
    // d aux / d p[t, e] = ge_e = ca count_e + cs count_e of t's sequence + cg avg_e: the micro-batch's,
    // the sequences' (each averaged over G) and the global loss's terms.
    LATTICE_CHECK(!global || (st.global_counts && st.global_tokens > 0))
        << "moe_backward: global_aux_loss without the step's averaged counts (moe_global_balance)";
    const double R = double(st.stat_ranks), Nr = double(N) * R;  // the tokens on every context-parallel rank
    const double base = double(aux_grad_scale) * double(E) / double(k);
    const double ca = base * double(s.aux_loss_coeff) / (Nr * Nr);
    const int64_t Ng = s.aux_group, G = sequences(N, s);
    const double Ngr = double(Ng) * R / double(s.aux_split);
    const double cs = G > 0 ? base * double(s.seq_aux_loss_coeff) / (Ngr * Ngr) / double(G) : 0.0;
    const double cg = global ? base * double(s.global_aux_loss_coeff) / (st.global_tokens * st.global_tokens) : 0.0;
    std::vector<double> ge(static_cast<size_t>(E));
    for (int64_t t = 0; t < N; ++t) {
      const float* p = st.scores.data() + t * E;
      const double* seq = G > 0 ? st.group_counts.data() + (s.aux_row0 + t) / Ng * E : nullptr;
      double pg = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        double g = ca * st.counts[size_t(e)];
        if (seq) g += cs * seq[e];
        if (global) g += cg * st.global_counts[e];
        ge[size_t(e)] = g;
        pg += double(p[e]) * g;
      }
      double sum = 0.0;  // sigmoid: the normalization's sum
      if (s.sigmoid)
        for (int64_t e = 0; e < E; ++e) sum += double(st.sig[size_t(t * E + e)]);
      for (int64_t e = 0; e < E; ++e)
        d_logits[size_t(t * E + e)] +=
            s.sigmoid ? float((ge[size_t(e)] - pg) / (sum + 1e-20)) : float(double(p[e]) * (ge[size_t(e)] - pg));
    }
  }
  if (s.sigmoid)
    for (size_t i = 0; i < d_logits.size(); ++i) d_logits[i] *= st.sig[i] * (1.0f - st.sig[i]);
  if (s.z_loss_coeff > 0.0f && N > 0) {  // d z / d l_te = 2 coeff lse_t softmax(l_t)_e / N
    const std::vector<float>& logits = st.logits_host;
    const double c = 2.0 * double(aux_grad_scale) * double(s.z_loss_coeff) / (double(N) * double(st.stat_ranks));
    for (int64_t t = 0; t < N; ++t) {
      const double lse = double(st.lse[size_t(t)]);
      for (int64_t e = 0; e < E; ++e)
        d_logits[size_t(t * E + e)] += float(c * lse * std::exp(double(logits[size_t(t * E + e)]) - lse));
    }
  }
  copy_to_device(sc.d_logits, d_logits.data(), d_logits.size() * sizeof(float));
  if (s.input_jitter_eps > 0.0f) {
    // d xj [N, C] into d_ye (free now, S >= N rows), then dx += the noise times it.
    token_runs_check(w, N);
    linear_backward(router_input_grad ? sc.d_ye : nullptr, g.router, w.router_bias ? g.router_bias : nullptr,
                    sc.d_logits, st.xj, w.router, N, C, E, false, w.router_site);
    if (router_input_grad)
      for (const MoeWeights::TokenRun& r : w.token_runs)
        input_jitter_backward(dx + r.row * C, sc.d_ye + r.row * C, r.rows * C, s.input_jitter_eps, w.jitter_stream,
                              uint64_t(r.token * C));
    return;
  }
  linear_backward(router_input_grad ? dx : nullptr, g.router, w.router_bias ? g.router_bias : nullptr, sc.d_logits, x,
                  w.router, N, C, E, true, w.router_site);
}

}  // namespace lattice
