// A Mamba layer's mixer in GPTModel (--hybrid-override-pattern's M; Megatron-Core's MambaMixer): between
// in_proj (the layer's column-parallel qkv_w, its output x.qkv [N, W / P]) and out_proj (the row-parallel
// proj_w, its input x.attn [N, I / P]), on this rank's heads and groups:
//   u = silu(conv1d(x's x, B, C) + bias); dt = softplus(x's dt + dt_bias); the scan y; the gated norm
//   x.attn = norm(y silu(z)) (kernels/mamba.h).
// With --reset-attention-mask the state and the convolution restart at each document. Only x.qkv and
// x.attn are kept per layer: the backward makes the core's buffers again (one shared copy, MambaScratch)
// before it runs, unless recomputation has just made them. Under context parallelism the scan runs through
// the whole sequences (MambaContextParallel): each rank runs the mixer for its share of the heads and groups
// over them, all-to-alls from the sequence split to a head split and back (Megatron's way).
#include "model/mamba_mixer.h"

#include <algorithm>
#include <vector>

#include "core/arena.h"
#include "core/device.h"
#include "kernels/elementwise.h"
#include "model/context_parallel.h"
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

namespace {

// One rank's share of s's heads and groups on a group of P.
MambaShape head_share(const MambaShape& s, int64_t P) {
  MambaShape h = s;
  h.H = s.H / P;
  h.G = s.G / P;
  return h;
}

// Rank r's columns of in_proj's output rows (its heads' z, x and dt, its groups' B and C) in its share's row;
// the middle three are its conv1d channels.
std::vector<ColumnBlock> head_columns(const MambaShape& s, int64_t P, int64_t r) {
  const MambaShape h = head_share(s, P);
  return {{r * h.inner(), 0, h.inner()},
          {s.x_at() + r * h.inner(), h.x_at(), h.inner()},
          {s.x_at() + s.b_at() + r * h.gn(), h.x_at() + h.b_at(), h.gn()},
          {s.x_at() + s.c_at() + r * h.gn(), h.x_at() + h.c_at(), h.gn()},
          {s.dt_at() + r * h.H, h.dt_at(), h.H}};
}

// Every rank's columns of in_proj's output rows and of out_proj's input rows (its heads' H P / P).
std::vector<std::vector<ColumnBlock>> input_columns(const MambaShape& s, int64_t P) {
  std::vector<std::vector<ColumnBlock>> c;
  for (int64_t r = 0; r < P; ++r) c.push_back(head_columns(s, P, r));
  return c;
}
std::vector<std::vector<ColumnBlock>> output_columns(const MambaShape& s, int64_t P) {
  return equal_column_shares(P, head_share(s, P).inner());
}

// The mixer of shape s with parameters w on rows x [N, W] into out [N, H P], m's buffers made.
void core_forward(const MambaCoreParams& w, MambaScratch& m, const float* x, float* out, const MambaShape& s) {
  mamba_conv_forward(m.u, x, w.conv_w, w.conv_b, s);
  mamba_dt_forward(m.dt, x, w.dt_bias, s);
  mamba_scan_forward(m.y, m.ckpt, m.u, m.dt, w.a_log, w.d_skip, s);
  mamba_gated_norm_forward(out, m.rstd, m.y, x, w.norm_w, s);
}

// Its backward from dout [N, H P] into dx [N, W] (every column written: z by the norm, x, B and C by the
// convolution, dt by softplus), the parameters' gradients added where w says; the forward made again first
// (out rewritten with the same values) unless `fresh`.
void core_backward(const MambaCoreParams& w, MambaScratch& m, const float* x, float* out, const float* dout, float* dx,
                   const MambaShape& s, bool fresh) {
  if (!fresh) core_forward(w, m, x, out, s);
  mamba_gated_norm_backward(m.dy, dx, w.d_norm_w, dout, m.y, x, w.norm_w, m.rstd, s);
  mamba_scan_backward(m.du, m.d_dt, w.d_a_log, w.d_d_skip, m.work, m.dy, m.ckpt, m.u, m.dt, w.a_log, w.d_skip, s);
  mamba_dt_backward(dx, w.d_dt_bias, m.d_dt, x, w.dt_bias, s);
  mamba_conv_backward(dx, w.d_conv_w, w.d_conv_b, m.du, x, w.conv_w, w.conv_b, s);
}

}  // namespace

bool mamba_context_splits_heads(const TransformerConfig& cfg, int64_t tp, int64_t cp) {
  return (cfg.mamba_heads() / tp) % cp == 0 && (cfg.mamba_num_groups / tp) % cp == 0;
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

void MambaContextParallel::carve(Arena& from, const TransformerConfig& cfg, int64_t tp, int64_t cp, int64_t B,
                                 int64_t T) {
  const MambaShape s = head_share(mamba_kernel_shape(cfg, tp, B, T), cp);
  const int64_t N = s.rows(), wide = std::max(s.width(), s.inner());
  mamba_scratch_carve(scratch, from, s);
  const char* what = "mamba (context parallel)";
  x = from.alloc_f32(N * s.width(), what);
  dx = from.alloc_f32(N * s.width(), what);
  y = from.alloc_f32(N * s.inner(), what);
  dy = from.alloc_f32(N * s.inner(), what);
  staging = from.alloc_f32(N * wide, what);
  recv = from.alloc_f32(N * wide, what);
  conv_w = from.alloc_f32(s.conv() * s.K, what);
  conv_b = from.alloc_f32(s.conv(), what);
  conv_dw = from.alloc_f32(s.conv() * s.K, what);
  conv_db = from.alloc_f32(s.conv(), what);
}

MambaShape GPTModel::mamba_shape(int64_t B, int64_t T, const Activations& a) const {
  MambaShape s = mamba_kernel_shape(cfg_, tp_.size(), B, T);
  if (docs_.reset_attention_mask) s.documents = cp_.on() ? a.key_ids.device() : a.document_ids();
  return s;
}

MambaCoreParams GPTModel::mamba_core_params(const LayerParams& p) {
  MambaCoreParams w;
  w.conv_w = params_.param(p.conv_w);
  w.conv_b = params_.param(p.conv_b);
  w.dt_bias = params_.param(p.dt_bias);
  w.a_log = params_.param(p.a_log);
  w.d_skip = params_.param(p.d_skip);
  w.norm_w = params_.param(p.out_norm_w);
  if (!params_.has_grads()) return w;
  w.d_conv_w = params_.grad(p.conv_w);
  w.d_conv_b = params_.grad(p.conv_b);
  w.d_dt_bias = params_.grad(p.dt_bias);
  w.d_a_log = params_.grad(p.a_log);
  w.d_d_skip = params_.grad(p.d_skip);
  w.d_norm_w = params_.grad(p.out_norm_w);
  return w;
}

MambaCoreParams GPTModel::mamba_head_share_params(const LayerParams& p, const MambaShape& s, bool grads) {
  MambaContextParallel& c = *mamba_cp_;
  const int64_t P = cp_.size(), r = cp_.rank(), K = s.K;
  const MambaShape h = head_share(s, P);
  const std::vector<ColumnBlock> columns = head_columns(s, P, r);
  for (int i = 1; i <= 3; ++i) {  // x, B, C: conv1d's rows (channels) of this rank's share
    const ColumnBlock& b = columns[size_t(i)];
    const int64_t from = b.from - s.x_at(), to = b.to - h.x_at();
    copy_on_device(c.conv_w + to * K, params_.param(p.conv_w) + from * K, size_t(b.width * K) * sizeof(float));
    copy_on_device(c.conv_b + to, params_.param(p.conv_b) + from, size_t(b.width) * sizeof(float));
  }
  MambaCoreParams w = mamba_core_params(p);
  w.conv_w = c.conv_w;
  w.conv_b = c.conv_b;
  w.dt_bias += r * h.H;
  w.a_log += r * h.H;
  w.d_skip += r * h.H;
  w.norm_w += r * h.inner();
  if (!grads) return w;
  zero_on_device(c.conv_dw, size_t(h.conv() * K) * sizeof(float));
  zero_on_device(c.conv_db, size_t(h.conv()) * sizeof(float));
  w.d_conv_w = c.conv_dw;
  w.d_conv_b = c.conv_db;
  w.d_dt_bias += r * h.H;
  w.d_a_log += r * h.H;
  w.d_d_skip += r * h.H;
  w.d_norm_w += r * h.inner();
  return w;
}

void GPTModel::mamba_forward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T) {
  Activations::Layer& x = a.layers[i];
  if (!cp_.on()) return core_forward(mamba_core_params(p), scratch_->mamba, x.qkv, x.attn, mamba_shape(B, T, a));
  // This rank's heads' columns of every token's in_proj rows, their mixer, its output back to the rows' ranks.
  MambaContextParallel& c = *mamba_cp_;
  const ContextSplit split = cp_.split(T * cp_.size());
  const int64_t P = cp_.size();
  const MambaShape s = mamba_shape(B, split.T, a), h = head_share(s, P);
  context_rows_to_columns(cp_, split, c.x, c.staging, c.recv, x.qkv, B, s.width(), input_columns(s, P), h.width());
  core_forward(mamba_head_share_params(p, s, false), c.scratch, c.x, c.y, h);
  context_columns_to_rows(cp_, split, x.attn, c.staging, c.recv, c.y, B, s.inner(), output_columns(s, P), h.inner());
}

void GPTModel::mamba_backward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T, bool fresh) {
  Scratch& sc = *scratch_;
  Activations::Layer& x = a.layers[i];
  // out_proj's input gradient in d_c2 -> in_proj's output gradient in d_3c.
  if (!cp_.on())
    return core_backward(mamba_core_params(p), sc.mamba, x.qkv, x.attn, sc.d_c2, sc.d_3c, mamba_shape(B, T, a), fresh);
  // This rank's heads: their columns of every token's in_proj rows (unless recomputation has just brought them)
  // and of out_proj's input gradient, their mixer's backward, in_proj's output gradient back to the rows' ranks.
  MambaContextParallel& c = *mamba_cp_;
  const ContextSplit split = cp_.split(T * cp_.size());
  const int64_t P = cp_.size();
  const MambaShape s = mamba_shape(B, split.T, a), h = head_share(s, P);
  const std::vector<std::vector<ColumnBlock>> in = input_columns(s, P);
  if (!fresh) context_rows_to_columns(cp_, split, c.x, c.staging, c.recv, x.qkv, B, s.width(), in, h.width());
  context_rows_to_columns(cp_, split, c.dy, c.staging, c.recv, sc.d_c2, B, s.inner(), output_columns(s, P), h.inner());
  core_backward(mamba_head_share_params(p, s, true), c.scratch, c.x, c.y, c.dy, c.dx, h, fresh);
  const std::vector<ColumnBlock>& mine = in[size_t(cp_.rank())];
  for (int j = 1; j <= 3; ++j) {  // conv1d's gradient rows of this rank's channels
    const ColumnBlock& b = mine[size_t(j)];
    const int64_t from = b.from - s.x_at(), to = b.to - h.x_at();
    accumulate(params_.grad(p.conv_w) + from * s.K, c.conv_dw + to * s.K, b.width * s.K);
    accumulate(params_.grad(p.conv_b) + from, c.conv_db + to, b.width);
  }
  context_columns_to_rows(cp_, split, sc.d_3c, c.staging, c.recv, c.dx, B, s.width(), in, h.width());
}

}  // namespace lattice
