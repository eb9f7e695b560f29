// Multi-latent attention (model/multi_latent_attention.h): the fused layout's assembly, shared by
// training and decoding, and GPTModel's forward and backward of the latents.
//
// Tensor parallelism (Megatron's): the up projections are column-parallel (heads split), the down
// projections and the latents' norms replicated. The latents' gradients (the up projections' input
// gradients and the shared rotary key's) are all-reduced over the group, so the rest of the backward is
// the same on every rank, its weight gradients whole, with the same roundings in every layout.
#include "model/multi_latent_attention.h"

#include <algorithm>
#include <cmath>

#include "core/device.h"
#include "dist/comm.h"
#include "kernels/elementwise.h"
#include "kernels/layernorm.h"
#include "model/gpt_model.h"
#include "model/gpt_model_buffers.h"
#include "model/rotary_embedding.h"

namespace lattice {

MlaShape mla_shape(const TransformerConfig& c, int64_t heads) {
  MlaShape s;
  s.H = heads;
  s.D = c.kv_channels;
  s.Dn = c.qk_head_dim;
  s.Dr = c.qk_pos_emb_head_dim;
  s.Dv = c.v_head_dim;
  s.Rkv = c.kv_lora_rank;
  const double m = c.yarn() ? yarn_mscale(c.yarn_rotary_scaling_factor, c.yarn_mscale_all_dim) : 1.0;
  s.query_scale = float(m * m * std::sqrt(double(c.kv_channels) / double(c.mla_qk_dim())));
  return s;
}

// The fused layout [N, H, 3, D]: head h's query at slot 3h, key 3h + 1, value 3h + 2.
void mla_fuse_qkv(float* qkv, const float* q, const float* kv, const float* c, int64_t N, const MlaShape& s) {
  const int64_t H = s.H, D = s.D, Dn = s.Dn, Dr = s.Dr, Dv = s.Dv, Dq = s.Dq(), Dnv = s.Dnv();
  const int64_t row = 3 * H * D, head = 3 * D;
  float* k = qkv + D;
  float* v = qkv + 2 * D;
  copy_head_blocks(qkv, row, head, q + Dn, H * Dq, Dq, N, H, Dr, s.query_scale);
  copy_head_blocks(qkv + Dr, row, head, q, H * Dq, Dq, N, H, Dn, s.query_scale);
  copy_head_blocks(k, row, head, c + s.Rkv, s.latent(), 0, N, H, Dr);  // the shared rotary key, in every head
  copy_head_blocks(k + Dr, row, head, kv, H * Dnv, Dnv, N, H, Dn);
  copy_head_blocks(v, row, head, kv + Dn, H * Dnv, Dnv, N, H, Dv);
  if (D > Dq) {
    copy_head_blocks(qkv + Dq, row, head, nullptr, 0, 0, N, H, D - Dq);
    copy_head_blocks(k + Dq, row, head, nullptr, 0, 0, N, H, D - Dq);
  }
  if (D > Dv) copy_head_blocks(v + Dv, row, head, nullptr, 0, 0, N, H, D - Dv);
}

void mla_split_qkv_grad(float* dq, float* dkv, float* d_pe, const float* dqkv, int64_t N, const MlaShape& s) {
  const int64_t H = s.H, D = s.D, Dn = s.Dn, Dr = s.Dr, Dv = s.Dv, Dq = s.Dq(), Dnv = s.Dnv();
  const int64_t row = 3 * H * D, head = 3 * D;
  const float* dk = dqkv + D;
  const float* dv = dqkv + 2 * D;
  copy_head_blocks(dq + Dn, H * Dq, Dq, dqkv, row, head, N, H, Dr, s.query_scale);
  copy_head_blocks(dq, H * Dq, Dq, dqkv + Dr, row, head, N, H, Dn, s.query_scale);
  copy_head_blocks(d_pe, Dr, 0, dk, row, head, N, H, Dr);
  copy_head_blocks(dkv, H * Dnv, Dnv, dk + Dr, row, head, N, H, Dn);
  copy_head_blocks(dkv + Dn, H * Dnv, Dnv, dv, row, head, N, H, Dv);
}

void mla_values(float* attn_v, const float* attn, int64_t N, const MlaShape& s) {
  copy_head_blocks(attn_v, s.H * s.Dv, s.Dv, attn, s.H * s.D, s.D, N, s.H, s.Dv);
}

void mla_values_grad(float* d_attn, const float* d_attn_v, int64_t N, const MlaShape& s) {
  copy_head_blocks(d_attn, s.H * s.D, s.D, d_attn_v, s.H * s.Dv, s.Dv, N, s.H, s.Dv);
  if (s.D > s.Dv) copy_head_blocks(d_attn + s.Dv, s.H * s.D, s.D, nullptr, 0, 0, N, s.H, s.D - s.Dv);
}

void GPTModel::mla_qkv_forward(const LayerParams& p, Activations& a, size_t i, LinearInput x, int64_t N) {
  Activations::Layer& l = a.layers[i];
  Scratch& sc = *scratch_;
  const MlaShape s = mla_shape(cfg_, Hl_);
  const int64_t C = cfg_.hidden_size, H = s.H, Rq = cfg_.q_lora_rank, Rkv = s.Rkv, Wc = s.latent();
  const float eps = cfg_.mla_latent_eps();
  const bool norms = cfg_.mla_latent_norms();
  if (Rq > 0) {  // q [N, H Dq]
    linear_forward(l.mla_q_c, x, params_.param(p.q_down_w), nullptr, N, C, Rq, site(p.q_down_w));
    if (norms)
      layernorm_forward(l.mla_q_n, l.mla_q_mean, l.mla_q_rstd, l.mla_q_c, norm_weight(p.q_norm_w), bias(p.q_norm_b), N,
                        Rq, eps, normalization());
  } else {
    linear_forward(sc.mla_q, x, params_.param(p.q_proj_w), nullptr, N, C, H * s.Dq(), site(p.q_proj_w));
  }
  // c [N, Rkv + Dr]; its latent copied out (the norm and the up projection read rows of Rkv)
  linear_forward(l.mla_kv_c, x, params_.param(p.kv_down_w), nullptr, N, C, Wc, site(p.kv_down_w));
  copy_head_blocks(l.mla_kv_l, Rkv, Rkv, l.mla_kv_c, Wc, Wc, N, 1, Rkv);
  if (norms)
    layernorm_forward(l.mla_kv_n, l.mla_kv_mean, l.mla_kv_rstd, l.mla_kv_l, norm_weight(p.k_norm_w), bias(p.k_norm_b),
                      N, Rkv, eps, normalization());
  mla_up_forward(p, a, i, N);
}

void GPTModel::mla_up_forward(const LayerParams& p, Activations& a, size_t i, int64_t N) {
  Activations::Layer& l = a.layers[i];
  Scratch& sc = *scratch_;
  const MlaShape s = mla_shape(cfg_, Hl_);
  const int64_t H = s.H, Rq = cfg_.q_lora_rank;
  if (Rq > 0)
    linear_forward(sc.mla_q, l.mla_q_n, params_.param(p.q_up_w), nullptr, N, Rq, H * s.Dq(), site(p.q_up_w));
  linear_forward(sc.mla_kv, l.mla_kv_n, params_.param(p.kv_up_w), nullptr, N, s.Rkv, H * s.Dnv(), site(p.kv_up_w));
  mla_fuse_qkv(l.qkv, sc.mla_q, sc.mla_kv, l.mla_kv_c, N, s);
}

void GPTModel::mla_attention_output(Activations& a, size_t i, int64_t N) {
  Activations::Layer& l = a.layers[i];
  if (l.attn_v != l.attn) mla_values(l.attn_v, l.attn, N, mla_shape(cfg_, Hl_));
}

void GPTModel::mla_attention_output_backward(const float* d_attn_v, int64_t N) {
  mla_values_grad(scratch_->d_c2, d_attn_v, N, mla_shape(cfg_, Hl_));
}

void GPTModel::mla_qkv_backward(const LayerParams& p, Activations& a, size_t i, LinearInput x, int64_t N) {
  Activations::Layer& l = a.layers[i];
  Scratch& sc = *scratch_;
  const MlaShape s = mla_shape(cfg_, Hl_);
  const int64_t C = cfg_.hidden_size, H = s.H, Rq = cfg_.q_lora_rank, Rkv = s.Rkv, Wc = s.latent(), Dr = s.Dr;
  const int64_t Ns = tp_.shard_rows(N), row0 = tp_.shard_begin(N);
  const bool norms = cfg_.mla_latent_norms();
  // The latents' gradients are summed over the tensor-parallel group (every row on every rank, with or
  // without sequence parallelism), so the norms' and the down projections' backward is the same on
  // every rank and in every layout.
  TensorParallel all = tp_;
  all.sequence_parallel = false;
  // The fused layout's gradient (d_3c, rotated back) into dq [N, H Dq], dkv [N, H (Dn + Dv)] and the shared
  // rotary key's, summed over this rank's heads, d_pe [N, Dr] (after kv_up's input gradient d_kvn [N, Rkv]).
  float* d_kvn = sc.mla_d_kvn;
  float* d_pe = sc.mla_d_kvn + N * Rkv;
  mla_split_qkv_grad(sc.mla_q, sc.mla_kv, d_pe, sc.d_3c, N, s);
  GemmSite up = site(p.kv_up_w);
  up.partial_sum = true;
  linear_backward(d_kvn, params_.grad(p.kv_up_w), nullptr, sc.mla_kv, l.mla_kv_n, params_.param(p.kv_up_w), N, Rkv,
                  H * s.Dnv(), false, up);
  if (tp_.size() > 1) tp_.comm->all_reduce(d_kvn, N * (Rkv + Dr), ReduceOp::sum);  // d_kvn and d_pe at once
  if (up.policy) up.policy->round_result(d_kvn, N * (Rkv + Dr));
  if (norms) {
    zero_on_device(sc.mla_d_kvl, size_t(N * Rkv) * sizeof(float));
    layernorm_backward(sc.mla_d_kvl, params_.grad(p.k_norm_w), bias_grad(p.k_norm_b), LayerNormDout(d_kvn), l.mla_kv_l,
                       norm_weight(p.k_norm_w), l.mla_kv_mean, l.mla_kv_rstd, N, Rkv, {}, normalization());
  }
  copy_head_blocks(sc.mla_d_kvc, Wc, Wc, norms ? sc.mla_d_kvl : d_kvn, Rkv, Rkv, N, 1, Rkv);
  copy_head_blocks(sc.mla_d_kvc + Rkv, Wc, Wc, d_pe, Dr, Dr, N, 1, Dr);
  // The down projections' input gradient: every row, the same on every rank (d_c2 is free again: the
  // attention's backward read it). LN1's backward rounds it as it reads it (ln_dout).
  float* d_full = Rq > 0 ? sc.d_c1 : sc.d_c2;
  linear_backward(d_full, params_.grad(p.kv_down_w), nullptr, sc.mla_d_kvc, x, params_.param(p.kv_down_w), N, C, Wc,
                  false, site(p.kv_down_w).rounded_by_caller());
  if (Rq > 0) {
    column_parallel_linear_backward(all, sc.mla_d_qn, nullptr, params_.grad(p.q_up_w), nullptr, sc.mla_q, l.mla_q_n,
                                    params_.param(p.q_up_w), N, Rq, H * s.Dq(), site(p.q_up_w));
    if (norms) {
      zero_on_device(sc.mla_d_qc, size_t(N * Rq) * sizeof(float));
      layernorm_backward(sc.mla_d_qc, params_.grad(p.q_norm_w), bias_grad(p.q_norm_b), LayerNormDout(sc.mla_d_qn),
                         l.mla_q_c, norm_weight(p.q_norm_w), l.mla_q_mean, l.mla_q_rstd, N, Rq, {}, normalization());
    }
    linear_backward(d_full, params_.grad(p.q_down_w), nullptr, sc.mla_d_qc, x, params_.param(p.q_down_w), N, C, Rq,
                    true, site(p.q_down_w).rounded_by_caller());
    if (tp_.sp()) copy_on_device(sc.d_s, d_full + row0 * C, size_t(Ns * C) * sizeof(float));  // this rank's rows
    return;
  }
  // linear_q_proj is column-parallel: its input gradient is this rank's heads' partial sum, reduced as the
  // QKV layer's (into d_c1, or this rank's rows in d_s), then the key-value latent's rows added.
  GemmSite q = site(p.q_proj_w);
  q.partial_sum = true;
  linear_backward(sc.d_c1, params_.grad(p.q_proj_w), nullptr, sc.mla_q, x, params_.param(p.q_proj_w), N, C,
                  H * s.Dq(), false, q);
  float* d_ln = tp_.sp() ? sc.d_s : sc.d_c1;
  reduce_from_tensor_parallel_region(tp_, sc.d_c1, d_ln, N, C);
  accumulate(d_ln, d_full + row0 * C, Ns * C);
}

}  // namespace lattice
