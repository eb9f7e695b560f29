// A Mamba layer's mixer in GPTModel (--hybrid-override-pattern's M; Megatron-Core's MambaMixer): between
// in_proj (the layer's column-parallel qkv_w, its output x.qkv [N, W / P]) and out_proj (the row-parallel
// proj_w, its input x.attn [N, I / P]), on this rank's heads and groups:
//   u = silu(conv1d(x's x, B, C) + bias); dt = softplus(x's dt + dt_bias); the scan y; the gated norm
//   x.attn = norm(y silu(z)) (kernels/mamba.h).
// With --reset-attention-mask the state and the convolution restart at each document. Only x.qkv and
// x.attn are kept per layer: the backward makes the core's buffers again (one shared copy, MambaScratch)
// before it runs, unless recomputation has just made them.
#include "model/mamba_mixer.h"

#include <algorithm>

#include "core/arena.h"
#include "core/device.h"
#include "model/gpt_model.h"
#include "model/gpt_model_buffers.h"

namespace lattice {

MambaShape mamba_kernel_shape(const TransformerConfig& cfg, int64_t tp, int64_t B, int64_t T) {
  MambaShape s;
  s.B = B;
  s.T = T;
  s.H = cfg.mamba_heads() / tp;
  s.P = cfg.mamba_head_dim;
  s.G = cfg.mamba_num_groups / tp;
  s.N = cfg.mamba_state_dim;
  s.K = TransformerConfig::kMambaConvKernel;
  s.chunk = std::min<int64_t>(64, T);
  return s;
}

void mamba_scratch_carve(MambaScratch& m, Arena& arena, const MambaShape& s) {
  const int64_t N = s.rows();
  m.u = arena.alloc_f32(N * s.conv(), "mamba");
  m.dt = arena.alloc_f32(N * s.H, "mamba");
  m.y = arena.alloc_f32(N * s.inner(), "mamba");
  m.rstd = arena.alloc_f32(N * s.G, "mamba");
  m.ckpt = arena.alloc_f32(s.B * s.H * s.chunks() * s.state(), "mamba state");
  m.du = arena.alloc_f32(N * s.conv(), "grad");
  m.d_dt = arena.alloc_f32(N * s.H, "grad");
  m.dy = arena.alloc_f32(N * s.inner(), "grad");
  // The scan backward's workspace is the GPU kernel's: the CPU's buffers are its threads' own.
  m.work = arena.alloc_f32(kernels_on_gpu() ? mamba_scan_work(s) : 0, "mamba state");
}

MambaShape GPTModel::mamba_shape(int64_t B, int64_t T, const Activations& a) const {
  MambaShape s = mamba_kernel_shape(cfg_, tp_.size(), B, T);
  if (docs_.reset_attention_mask) s.documents = a.document_ids();
  return s;
}

void GPTModel::mamba_core_forward(const LayerParams& p, const float* x, float* out, const MambaShape& s) {
  MambaScratch& m = scratch_->mamba;
  mamba_conv_forward(m.u, x, params_.param(p.conv_w), params_.param(p.conv_b), s);
  mamba_dt_forward(m.dt, x, params_.param(p.dt_bias), s);
  mamba_scan_forward(m.y, m.ckpt, m.u, m.dt, params_.param(p.a_log), params_.param(p.d_skip), s);
  mamba_gated_norm_forward(out, m.rstd, m.y, x, params_.param(p.out_norm_w), s);
}

void GPTModel::mamba_forward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T) {
  Activations::Layer& x = a.layers[i];
  mamba_core_forward(p, x.qkv, x.attn, mamba_shape(B, T, a));
}

void GPTModel::mamba_backward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T, bool fresh) {
  Scratch& sc = *scratch_;
  MambaScratch& m = sc.mamba;
  Activations::Layer& x = a.layers[i];
  const MambaShape s = mamba_shape(B, T, a);
  // The core's buffers again (x.attn rewritten with the same values).
  if (!fresh) mamba_core_forward(p, x.qkv, x.attn, s);
  // out_proj's input gradient in d_c2 -> in_proj's output gradient in d_3c, every column: z by the norm,
  // x, B and C by the convolution, dt by softplus.
  mamba_gated_norm_backward(m.dy, sc.d_3c, params_.grad(p.out_norm_w), sc.d_c2, m.y, x.qkv,
                            params_.param(p.out_norm_w), m.rstd, s);
  mamba_scan_backward(m.du, m.d_dt, params_.grad(p.a_log), params_.grad(p.d_skip), m.work, m.dy, m.ckpt, m.u, m.dt,
                      params_.param(p.a_log), params_.param(p.d_skip), s);
  mamba_dt_backward(sc.d_3c, params_.grad(p.dt_bias), m.d_dt, x.qkv, params_.param(p.dt_bias), s);
  mamba_conv_backward(sc.d_3c, params_.grad(p.conv_w), params_.grad(p.conv_b), m.du, x.qkv, params_.param(p.conv_w),
                      params_.param(p.conv_b), s);
}

}  // namespace lattice
