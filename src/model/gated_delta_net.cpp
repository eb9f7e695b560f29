// A Gated DeltaNet layer's core in GPTModel (--experimental-attention-variant gated_delta_net; Megatron-Core's
// GatedDeltaNet): between in_proj (the layer's column-parallel qkv_w, its output x.qkv) and out_proj (the
// row-parallel proj_w, its input x.attn), on this rank's heads:
//   u = silu(conv1d(x[:, :Cc])); q, k l2-normalized; g, beta from x's a and b slots; the gated delta rule
//   o; out_norm (the model's LayerNorm or RMSNorm over each head's Dv values); y = out_norm(o) silu(z).
// The kernels are kernels/gated_delta_net.h's. Only x.qkv and x.attn are kept per layer: the backward makes
// the core's buffers again (one shared copy, GdnScratch) before it runs. Under context parallelism every
// rank runs the core over the whole sequences, gathered (GdnContextParallel).
#include "model/gated_delta_net.h"

#include <algorithm>

#include "core/arena.h"
#include "core/device.h"
#include "kernels/gated_delta_net.h"
#include "kernels/layernorm.h"
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

void gdn_scratch_carve(GdnScratch& g, Arena& arena, const TransformerConfig& cfg, int64_t tp, int64_t B, int64_t T) {
  const GdnShape s = gdn_kernel_shape(cfg, tp, B, T);
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

void GdnContextParallel::carve(Arena& from, const TransformerConfig& cfg, int64_t tp, int64_t B, int64_t T) {
  const GdnShape s = gdn_kernel_shape(cfg, tp, B, T);
  const int64_t N = s.N();
  gdn_scratch_carve(scratch, from, cfg, tp, B, T);
  x = from.alloc_f32(N * s.width(), "gated delta net (context parallel)");
  dx = from.alloc_f32(N * s.width(), "gated delta net (context parallel)");
  y = from.alloc_f32(N * s.v(), "gated delta net (context parallel)");
  dy = from.alloc_f32(N * s.v(), "gated delta net (context parallel)");
  staging = from.alloc_f32(N * std::max(s.width(), s.v()), "gated delta net (context parallel)");
  sink = from.alloc_f32(std::max({s.conv() * s.K, s.Hv, s.Dv}), "gated delta net (context parallel)");
}

GdnShape GPTModel::gdn_shape(int64_t B, int64_t T) const { return gdn_kernel_shape(cfg_, tp_.size(), B, T); }

void GPTModel::gdn_core_forward(const LayerParams& p, GdnScratch& g, const float* x, float* y, const GdnShape& s) {
  gdn_conv_forward(g.u, x, params_.param(p.conv_w), s);
  gdn_gates_forward(g.q, g.k, g.g, g.beta, g.u, x, params_.param(p.a_log), params_.param(p.dt_bias), s);
  gdn_delta_rule_forward(g.o, g.state, g.ckpt, g.q, g.k, g.u, g.g, g.beta, s);
  layernorm_forward(g.nrm, g.mean, g.rstd, g.o, norm_weight(p.out_norm_w), bias(p.out_norm_b), s.N() * s.Hv, s.Dv,
                    cfg_.layernorm_epsilon, normalization());
  gdn_output_gate_forward(y, g.nrm, x, s);
}

void GPTModel::gdn_core_backward(const LayerParams& p, GdnScratch& g, const float* x, float* y, float* dy, float* dx,
                                 const GdnShape& s, float* sink, bool fresh) {
  if (!fresh) gdn_core_forward(p, g, x, y, s);  // the core's buffers again (y rewritten with the same values)
  auto grad = [&](int w) { return sink ? sink : params_.grad(w); };
  // y = nrm silu(z): nrm's gradient in place of y's, z's into dx's z slot.
  gdn_output_gate_backward(dy, dx, dy, g.nrm, x, s);
  zero_on_device(g.d_o, size_t(s.N() * s.v()) * sizeof(float));
  layernorm_backward(g.d_o, grad(p.out_norm_w), sink ? sink : bias_grad(p.out_norm_b), LayerNormDout(dy), g.o,
                     norm_weight(p.out_norm_w), g.mean, g.rstd, s.N() * s.Hv, s.Dv, {}, normalization());
  gdn_delta_rule_backward(g.dq_v, g.dk_v, g.du, g.dg, g.dbeta, g.work, g.d_o, g.ckpt, g.q, g.k, g.u, g.g, g.beta, s);
  gdn_sum_key_heads(g.dq, g.dq_v, s);
  gdn_sum_key_heads(g.dk, g.dk_v, s);
  gdn_gates_backward(g.du, dx, grad(p.a_log), grad(p.dt_bias), g.dq, g.dk, g.dg, g.dbeta, g.u, x,
                     params_.param(p.a_log), params_.param(p.dt_bias), s);
  gdn_conv_backward(dx, grad(p.conv_w), g.du, x, params_.param(p.conv_w), s);
}

void GPTModel::gdn_forward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T) {
  Activations::Layer& x = a.layers[i];
  if (!cp_.on()) return gdn_core_forward(p, scratch_->gdn, x.qkv, x.attn, gdn_shape(B, T));
  // Every token's in_proj rows, the core over the whole sequences, this rank's rows of its output.
  GdnContextParallel& c = *gdn_cp_;
  const ContextSplit split = cp_.split(T * cp_.size());
  const GdnShape s = gdn_shape(B, split.T);
  gather_context_rows(cp_, split, c.x, c.staging, x.qkv, B, s.width());
  gdn_core_forward(p, c.scratch, c.x, c.y, s);
  context_local_rows(split, x.attn, c.y, B, s.v());
}

void GPTModel::gdn_backward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T, bool fresh) {
  Scratch& sc = *scratch_;
  Activations::Layer& x = a.layers[i];
  if (!cp_.on())
    return gdn_core_backward(p, sc.gdn, x.qkv, x.attn, sc.d_c2, sc.d_3c, gdn_shape(B, T), nullptr, fresh);
  // Every token's in_proj rows and out_proj input gradients gathered; the whole sequences' backward on
  // every rank, this rank's rows of in_proj's output gradient kept; the parameters' gradients (the whole
  // sequences') added by the group's first rank alone.
  GdnContextParallel& c = *gdn_cp_;
  const ContextSplit split = cp_.split(T * cp_.size());
  const GdnShape s = gdn_shape(B, split.T);
  if (!fresh) gather_context_rows(cp_, split, c.x, c.staging, x.qkv, B, s.width());
  gather_context_rows(cp_, split, c.dy, c.staging, sc.d_c2, B, s.v());
  gdn_core_backward(p, c.scratch, c.x, c.y, c.dy, c.dx, s, cp_.rank() == 0 ? nullptr : c.sink, fresh);
  context_local_rows(split, sc.d_3c, c.dx, B, s.width());
}

}  // namespace lattice
