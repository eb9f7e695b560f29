// A Gated DeltaNet layer's core in GPTModel (--experimental-attention-variant gated_delta_net; Megatron-Core's
// GatedDeltaNet): between in_proj (the layer's column-parallel qkv_w, its output x.qkv) and out_proj (the
// row-parallel proj_w, its input x.attn), on this rank's heads:
//   u = silu(conv1d(x[:, :Cc])); q, k l2-normalized; g, beta from x's a and b slots; the gated delta rule
//   o; out_norm (the model's LayerNorm or RMSNorm over each head's Dv values); y = out_norm(o) silu(z).
// With --reset-attention-mask the state and the convolution restart at each document (the documents of
// the attention's mask). The kernels are kernels/gated_delta_net.h's. Only x.qkv and x.attn are kept per
// layer: the backward makes the core's buffers again (one shared copy, GdnScratch) before it runs. Under context parallelism the state
// runs through the whole sequences (GdnContextParallel): each rank runs the core for its share of the heads
// over them (all-to-alls from the sequence split to a head split and back, Megatron's way), or, when the
// group's size does not divide the key heads, every rank the whole core over the gathered sequences.
#include "model/gated_delta_net.h"

#include <algorithm>
#include <vector>

#include "core/arena.h"
#include "core/device.h"
#include "kernels/elementwise.h"
#include "kernels/gated_delta_net.h"
#include "kernels/layernorm.h"
#include "model/context_parallel.h"
#include "model/gpt_model.h"
#include "model/gpt_model_buffers.h"

namespace lattice {

GdnShape gdn_kernel_shape(const TransformerConfig& cfg, int64_t tp, int64_t B, int64_t T) {
  GdnShape s;
  s.B = B;
  s.T = T;
  s.Hk = cfg.linear_num_key_heads / tp;
  s.Hv = cfg.linear_num_value_heads / tp;
  s.Dk = cfg.linear_key_head_dim;
  s.Dv = cfg.linear_value_head_dim;
  s.K = cfg.linear_conv_kernel_dim;
  s.chunk = std::min<int64_t>(64, T);
  return s;
}

bool gdn_context_splits_heads(const TransformerConfig& cfg, int64_t tp, int64_t cp) {
  return cp > 1 && (cfg.linear_num_key_heads / tp) % cp == 0;
}

namespace {

// One rank's share of s's heads on a group of P: Hk / P key heads and their value heads.
GdnShape head_share(const GdnShape& s, int64_t P) {
  GdnShape h = s;
  h.Hk = s.Hk / P;
  h.Hv = s.Hv / P;
  return h;
}

// Rank r's columns of in_proj's output rows (its heads' q, k, v, z, b and a) in its share's row; the first
// three are its conv1d channels (rows of conv1d's weight).
std::vector<ColumnBlock> head_columns(const GdnShape& s, int64_t P, int64_t r) {
  const GdnShape h = head_share(s, P);
  return {{r * h.qk(), 0, h.qk()},
          {s.qk() + r * h.qk(), h.qk(), h.qk()},
          {2 * s.qk() + r * h.v(), 2 * h.qk(), h.v()},
          {s.z_at() + r * h.v(), h.z_at(), h.v()},
          {s.b_at() + r * h.Hv, h.b_at(), h.Hv},
          {s.a_at() + r * h.Hv, h.a_at(), h.Hv}};
}

// Every rank's columns of in_proj's output rows and of out_proj's input rows (its heads' Hv Dv / P).
std::vector<std::vector<ColumnBlock>> input_columns(const GdnShape& s, int64_t P) {
  std::vector<std::vector<ColumnBlock>> c;
  for (int64_t r = 0; r < P; ++r) c.push_back(head_columns(s, P, r));
  return c;
}
std::vector<std::vector<ColumnBlock>> output_columns(const GdnShape& s, int64_t P) {
  return equal_column_shares(P, head_share(s, P).v());
}

}  // namespace

void gdn_scratch_carve(GdnScratch& g, Arena& arena, const GdnShape& s) {
  const int64_t N = s.N(), S = s.state();
  g.u = arena.alloc_f32(N * s.conv(), "gated delta net");
  g.q = arena.alloc_f32(N * s.qk(), "gated delta net");
  g.k = arena.alloc_f32(N * s.qk(), "gated delta net");
  g.g = arena.alloc_f32(N * s.Hv, "gated delta net");
  g.beta = arena.alloc_f32(N * s.Hv, "gated delta net");
  g.o = arena.alloc_f32(N * s.v(), "gated delta net");
  g.nrm = arena.alloc_f32(N * s.v(), "gated delta net");
  g.mean = arena.alloc_f32(N * s.Hv, "gated delta net");
  g.rstd = arena.alloc_f32(N * s.Hv, "gated delta net");
  g.state = arena.alloc_f32(s.B * s.Hv * S, "gated delta net state");
  g.ckpt = arena.alloc_f32(s.B * s.Hv * s.chunks() * S, "gated delta net state");
  g.du = arena.alloc_f32(N * s.conv(), "grad");
  g.d_o = arena.alloc_f32(N * s.v(), "grad");
  g.dq_v = arena.alloc_f32(N * s.Hv * s.Dk, "grad");
  g.dk_v = arena.alloc_f32(N * s.Hv * s.Dk, "grad");
  g.dq = arena.alloc_f32(N * s.qk(), "grad");
  g.dk = arena.alloc_f32(N * s.qk(), "grad");
  g.dg = arena.alloc_f32(N * s.Hv, "grad");
  g.dbeta = arena.alloc_f32(N * s.Hv, "grad");
  // The delta rule backward's workspace is the GPU kernel's: the CPU's chunk buffers are its threads' own.
  g.work = arena.alloc_f32(kernels_on_gpu() ? gdn_delta_rule_work(s) : 0, "gated delta net state");
}

void GdnContextParallel::carve(Arena& from, const TransformerConfig& cfg, int64_t tp, int64_t cp, int64_t B,
                               int64_t T) {
  split_heads = gdn_context_splits_heads(cfg, tp, cp);
  const GdnShape all = gdn_kernel_shape(cfg, tp, B, T), s = split_heads ? head_share(all, cp) : all;
  const int64_t N = s.N(), wide = std::max(s.width(), s.v());
  gdn_scratch_carve(scratch, from, s);
  const char* what = "gated delta net (context parallel)";
  x = from.alloc_f32(N * s.width(), what);
  dx = from.alloc_f32(N * s.width(), what);
  y = from.alloc_f32(N * s.v(), what);
  dy = from.alloc_f32(N * s.v(), what);
  staging = from.alloc_f32(N * wide, what);
  if (split_heads) {
    recv = from.alloc_f32(N * wide, what);
    conv_w = from.alloc_f32(s.conv() * s.K, what);
    conv_dw = from.alloc_f32(s.conv() * s.K, what);
  } else {
    sink = from.alloc_f32(std::max({s.conv() * s.K, s.Hv, s.Dv}), what);
  }
}

GdnShape GPTModel::gdn_shape(int64_t B, int64_t T, const Activations& a) const {
  GdnShape s = gdn_kernel_shape(cfg_, tp_.size(), B, T);
  if (docs_.reset_attention_mask) s.documents = cp_.on() ? a.key_ids.device() : a.document_ids();
  return s;
}

GdnCoreParams GPTModel::gdn_core_params(const LayerParams& p, float* sink) {
  GdnCoreParams w;
  w.conv_w = params_.param(p.conv_w);
  w.a_log = params_.param(p.a_log);
  w.dt_bias = params_.param(p.dt_bias);
  if (!params_.has_grads()) return w;
  w.d_conv_w = sink ? sink : params_.grad(p.conv_w);
  w.d_a_log = sink ? sink : params_.grad(p.a_log);
  w.d_dt_bias = sink ? sink : params_.grad(p.dt_bias);
  w.d_norm_w = sink ? sink : params_.grad(p.out_norm_w);
  w.d_norm_b = sink ? sink : bias_grad(p.out_norm_b);
  return w;
}

GdnCoreParams GPTModel::gdn_head_share_params(const LayerParams& p, const GdnShape& s, bool grads) {
  GdnContextParallel& c = *gdn_cp_;
  const int64_t P = cp_.size(), r = cp_.rank(), hv = s.Hv / P, K = s.K;
  const std::vector<ColumnBlock> columns = head_columns(s, P, r);
  for (int i = 0; i < 3; ++i)  // q, k, v: conv1d's rows of this rank's channels
    copy_on_device(c.conv_w + columns[size_t(i)].to * K, params_.param(p.conv_w) + columns[size_t(i)].from * K,
                   size_t(columns[size_t(i)].width * K) * sizeof(float));
  GdnCoreParams w = gdn_core_params(p);
  w.conv_w = c.conv_w;
  w.a_log += r * hv;
  w.dt_bias += r * hv;
  if (!grads) return w;
  zero_on_device(c.conv_dw, size_t(head_share(s, P).conv() * K) * sizeof(float));
  w.d_conv_w = c.conv_dw;
  w.d_a_log += r * hv;
  w.d_dt_bias += r * hv;
  return w;
}

void GPTModel::gdn_core_forward(const LayerParams& p, const GdnCoreParams& w, GdnScratch& g, const float* x,
                                float* y, const GdnShape& s) {
  gdn_conv_forward(g.u, x, w.conv_w, s);
  gdn_gates_forward(g.q, g.k, g.g, g.beta, g.u, x, w.a_log, w.dt_bias, s);
  gdn_delta_rule_forward(g.o, g.state, g.ckpt, g.q, g.k, g.u, g.g, g.beta, s);
  layernorm_forward(g.nrm, g.mean, g.rstd, g.o, norm_weight(p.out_norm_w), bias(p.out_norm_b), s.N() * s.Hv, s.Dv,
                    cfg_.layernorm_epsilon, normalization());
  gdn_output_gate_forward(y, g.nrm, x, s);
}

void GPTModel::gdn_core_backward(const LayerParams& p, const GdnCoreParams& w, GdnScratch& g, const float* x,
                                 float* y, float* dy, float* dx, const GdnShape& s, bool fresh) {
  if (!fresh) gdn_core_forward(p, w, g, x, y, s);  // the core's buffers again (y rewritten with the same values)
  // y = nrm silu(z): nrm's gradient in place of y's, z's into dx's z slot.
  gdn_output_gate_backward(dy, dx, dy, g.nrm, x, s);
  zero_on_device(g.d_o, size_t(s.N() * s.v()) * sizeof(float));
  layernorm_backward(g.d_o, w.d_norm_w, w.d_norm_b, LayerNormDout(dy), g.o, norm_weight(p.out_norm_w), g.mean, g.rstd,
                     s.N() * s.Hv, s.Dv, {}, normalization());
  gdn_delta_rule_backward(g.dq_v, g.dk_v, g.du, g.dg, g.dbeta, g.work, g.d_o, g.ckpt, g.q, g.k, g.u, g.g, g.beta, s);
  gdn_sum_key_heads(g.dq, g.dq_v, s);
  gdn_sum_key_heads(g.dk, g.dk_v, s);
  gdn_gates_backward(g.du, dx, w.d_a_log, w.d_dt_bias, g.dq, g.dk, g.dg, g.dbeta, g.u, x, w.a_log, w.dt_bias, s);
  gdn_conv_backward(dx, w.d_conv_w, g.du, x, w.conv_w, s);
}

void GPTModel::gdn_forward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T) {
  Activations::Layer& x = a.layers[i];
  if (!cp_.on()) return gdn_core_forward(p, gdn_core_params(p), scratch_->gdn, x.qkv, x.attn, gdn_shape(B, T, a));
  GdnContextParallel& c = *gdn_cp_;
  const ContextSplit split = cp_.split(T * cp_.size());
  const GdnShape s = gdn_shape(B, split.T, a);
  if (!c.split_heads) {  // every token's in_proj rows, the core over the whole sequences, this rank's rows of its output
    gather_context_rows(cp_, split, c.x, c.staging, x.qkv, B, s.width());
    gdn_core_forward(p, gdn_core_params(p), c.scratch, c.x, c.y, s);
    return context_local_rows(split, x.attn, c.y, B, s.v());
  }
  // This rank's heads' columns of every token's in_proj rows, their core, its output back to the rows' ranks.
  const int64_t P = cp_.size();
  const GdnShape h = head_share(s, P);
  context_rows_to_columns(cp_, split, c.x, c.staging, c.recv, x.qkv, B, s.width(), input_columns(s, P), h.width());
  gdn_core_forward(p, gdn_head_share_params(p, s, false), c.scratch, c.x, c.y, h);
  context_columns_to_rows(cp_, split, x.attn, c.staging, c.recv, c.y, B, s.v(), output_columns(s, P), h.v());
}

void GPTModel::gdn_backward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T, bool fresh) {
  Scratch& sc = *scratch_;
  Activations::Layer& x = a.layers[i];
  if (!cp_.on())
    return gdn_core_backward(p, gdn_core_params(p), sc.gdn, x.qkv, x.attn, sc.d_c2, sc.d_3c, gdn_shape(B, T, a), fresh);
  GdnContextParallel& c = *gdn_cp_;
  const ContextSplit split = cp_.split(T * cp_.size());
  const GdnShape s = gdn_shape(B, split.T, a);
  if (!c.split_heads) {
    // Every token's in_proj rows and out_proj input gradients gathered; the whole sequences' backward on
    // every rank, this rank's rows of in_proj's output gradient kept; the parameters' gradients (the whole
    // sequences') added by the group's first rank alone.
    if (!fresh) gather_context_rows(cp_, split, c.x, c.staging, x.qkv, B, s.width());
    gather_context_rows(cp_, split, c.dy, c.staging, sc.d_c2, B, s.v());
    gdn_core_backward(p, gdn_core_params(p, cp_.rank() == 0 ? nullptr : c.sink), c.scratch, c.x, c.y, c.dy, c.dx, s,
                      fresh);
    return context_local_rows(split, sc.d_3c, c.dx, B, s.width());
  }
  // This rank's heads: their columns of every token's in_proj rows (unless recomputation has just brought
  // them) and of out_proj's input gradient, their core's backward (its parameters' gradients its heads'
  // share: the context-parallel sum adds the shares), in_proj's output gradient back to the rows' ranks.
  const int64_t P = cp_.size();
  const GdnShape h = head_share(s, P);
  const std::vector<std::vector<ColumnBlock>> in = input_columns(s, P);
  if (!fresh) context_rows_to_columns(cp_, split, c.x, c.staging, c.recv, x.qkv, B, s.width(), in, h.width());
  context_rows_to_columns(cp_, split, c.dy, c.staging, c.recv, sc.d_c2, B, s.v(), output_columns(s, P), h.v());
  gdn_core_backward(p, gdn_head_share_params(p, s, true), c.scratch, c.x, c.y, c.dy, c.dx, h, fresh);
  const std::vector<ColumnBlock>& mine = in[size_t(cp_.rank())];
  for (int j = 0; j < 3; ++j)  // conv1d's gradient rows of this rank's channels
    accumulate(params_.grad(p.conv_w) + mine[size_t(j)].from * s.K, c.conv_dw + mine[size_t(j)].to * s.K,
               mine[size_t(j)].width * s.K);
  context_columns_to_rows(cp_, split, sc.d_3c, c.staging, c.recv, c.dx, B, s.width(), in, h.width());
}

}  // namespace lattice
