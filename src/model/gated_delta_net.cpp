// A Gated DeltaNet layer's core in GPTModel (--experimental-attention-variant gated_delta_net; Megatron-Core's
// GatedDeltaNet): between in_proj (the layer's column-parallel qkv_w, its output x.qkv) and out_proj (the
// row-parallel proj_w, its input x.attn), on this rank's heads:
//   u = silu(conv1d(x[:, :Cc])); q, k l2-normalized; g, beta from x's a and b slots; the gated delta rule
//   o; out_norm (the model's LayerNorm or RMSNorm over each head's Dv values); y = out_norm(o) silu(z).
// The kernels are kernels/gated_delta_net.h's. Only x.qkv and x.attn are kept per layer: the backward makes
// the core's buffers again (one shared copy, GdnScratch) before it runs.
#include "core/arena.h"
#include "kernels/gated_delta_net.h"
#include "kernels/layernorm.h"
#include "model/gated_delta_net.h"
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
  g.work = arena.alloc_f32(gdn_delta_rule_work(s), "gated delta net state");
}

GdnShape GPTModel::gdn_shape(int64_t B, int64_t T) const { return gdn_kernel_shape(cfg_, tp_.size(), B, T); }

void GPTModel::gdn_forward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T) {
  const GdnShape s = gdn_shape(B, T);
  GdnScratch& g = scratch_->gdn;
  Activations::Layer& x = a.layers[i];
  gdn_conv_forward(g.u, x.qkv, params_.param(p.conv_w), s);
  gdn_gates_forward(g.q, g.k, g.g, g.beta, g.u, x.qkv, params_.param(p.a_log), params_.param(p.dt_bias), s);
  gdn_delta_rule_forward(g.o, g.state, g.ckpt, g.q, g.k, g.u, g.g, g.beta, s);
  layernorm_forward(g.nrm, g.mean, g.rstd, g.o, norm_weight(p.out_norm_w), bias(p.out_norm_b), s.N() * s.Hv, s.Dv,
                    cfg_.layernorm_epsilon, normalization());
  gdn_output_gate_forward(x.attn, g.nrm, x.qkv, s);
}

void GPTModel::gdn_backward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T) {
  const GdnShape s = gdn_shape(B, T);
  GdnScratch& g = scratch_->gdn;
  Scratch& sc = *scratch_;
  Activations::Layer& x = a.layers[i];
  gdn_forward(p, a, i, B, T);  // the core's buffers again (x.attn rewritten with the same values)
  // y = nrm silu(z): nrm's gradient in place of y's (d_c2), z's into d_3c's z slot.
  gdn_output_gate_backward(sc.d_c2, sc.d_3c, sc.d_c2, g.nrm, x.qkv, s);
  zero_on_device(g.d_o, size_t(s.N() * s.v()) * sizeof(float));
  layernorm_backward(g.d_o, params_.grad(p.out_norm_w), bias_grad(p.out_norm_b), LayerNormDout(sc.d_c2), g.o,
                     norm_weight(p.out_norm_w), g.mean, g.rstd, s.N() * s.Hv, s.Dv, {}, normalization());
  gdn_delta_rule_backward(g.dq_v, g.dk_v, g.du, g.dg, g.dbeta, g.work, g.d_o, g.ckpt, g.q, g.k, g.u, g.g, g.beta, s);
  gdn_sum_key_heads(g.dq, g.dq_v, s);
  gdn_sum_key_heads(g.dk, g.dk_v, s);
  gdn_gates_backward(g.du, sc.d_3c, params_.grad(p.a_log), params_.grad(p.dt_bias), g.dq, g.dk, g.dg, g.dbeta, g.u,
                     x.qkv, params_.param(p.a_log), params_.param(p.dt_bias), s);
  gdn_conv_backward(sc.d_3c, params_.grad(p.conv_w), g.du, x.qkv, params_.param(p.conv_w), s);
}

}  // namespace lattice
