#include "model/gpt_inference.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/device.h"
#include "core/error.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/gated_delta_net.h"
#include "kernels/attention_gate.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "model/bf16_decode_policy.h"
#include "model/gated_delta_net.h"
#include "model/linear.h"
#include "model/mamba_mixer.h"
#include "model/multi_latent_attention.h"
#include "model/qk_layernorm.h"

namespace lattice {
namespace {

// Generation's MoE layers: a forward outside training, so no input jitter (MoeShape::input_jitter_eps)
// and the router's own logits (no forced balance).
MoeShape generation_moe_shape(const TransformerConfig& c) {
  MoeShape s = moe_shape(c);
  s.input_jitter_eps = 0.0f;
  s.force_balance = false;
  return s;
}

}  // namespace

GPTInference::GPTInference(const GPTModel& model, int64_t capacity, bool bf16_weights, int64_t sequences)
    : cfg_(model.config()) {
  LATTICE_CHECK(sequences >= 1) << "GPTInference: " << sequences << " sequences";
  lengths_.assign(size_t(sequences), 0);
  if (bf16_weights) policy_ = std::make_unique<Bf16DecodePolicy>();
  site_ = GemmSite{policy_.get(), 0};  // (the policy keeps each weight by its address)
  const ParamBuffer& pb = model.params();
  auto p = [&](const std::string& name) -> const float* { return pb.params() + pb.info(name).offset; };
  // A linear layer's bias, or null without biases (--disable-bias-linear): linear_forward adds none.
  auto bias = [&](const std::string& name) -> const float* { return cfg_.add_bias_linear ? p(name) : nullptr; };
  capacity_ = capacity > 0 ? capacity : cfg_.max_position_embeddings;
  LATTICE_CHECK(capacity_ <= cfg_.max_position_embeddings)
      << "KV cache of " << capacity_ << " tokens exceeds max_position_embeddings " << cfg_.max_position_embeddings;
  wte_ = p("embedding.word_embeddings.weight");
  wpe_ = cfg_.learned_positions() ? p("embedding.position_embeddings.weight") : nullptr;
  rope_ = model.rope_table(1);
  rope_long_ = model.rope_table(cfg_.max_position_embeddings);  // LongRoPE's long table (else rope_)
  // A norm's weight as the kernels apply it: with --apply-layernorm-1p, 1 + the parameter (made
  // here, in norm_1p_: the final norm's, then each layer's input, pre-MLP and query/key norms').
  const int64_t C = cfg_.hidden_size, D = cfg_.kv_channels;
  int64_t norm_at = 0;
  if (cfg_.apply_layernorm_1p) {
    const int64_t qk = !cfg_.qk_layernorm              ? 0
                       : cfg_.multi_latent_attention ? (cfg_.q_lora_rank > 0 ? cfg_.q_lora_rank : 0) + cfg_.kv_lora_rank
                                                     : 2 * D;
    norm_1p_.resize(size_t(C + cfg_.num_layers * (2 * C + qk + cfg_.linear_value_head_dim)));
    const std::vector<float> ones(
        size_t(std::max({C, D, cfg_.q_lora_rank, cfg_.kv_lora_rank, cfg_.linear_value_head_dim})), 1.0f);
    copy_to_device(norm_ones_.resize(ones.size()), ones.data(), ones.size() * sizeof(float));
  }
  auto norm_weight = [&](const std::string& name, int64_t n) -> const float* {
    if (!cfg_.apply_layernorm_1p) return p(name);
    float* w = norm_1p_.data() + norm_at;
    add_forward(w, p(name), norm_ones_.data(), n);
    norm_at += n;
    return w;
  };
  lnf_w_ = norm_weight("decoder.final_layernorm.weight", C);
  if (cfg_.rmsnorm()) {  // no norm biases: zeros for the LayerNorm kernel
    zero_bias_.resize(size_t(std::max({cfg_.hidden_size, cfg_.kv_channels, cfg_.q_lora_rank,  // the final norm's,
                                       cfg_.kv_lora_rank, cfg_.linear_value_head_dim})));  // GDN's out_norm  // q and k norms', MLA's latent norms'
    lnf_b_ = zero_bias_.data();
  } else {
    lnf_b_ = p("decoder.final_layernorm.bias");
  }
  auto norm_bias = [&](const std::string& name) -> const float* { return cfg_.rmsnorm() ? lnf_b_ : p(name); };
  if (cfg_.qk_l2_norm) {  // --qk-l2-norm: RMSNorm with unit weights and zero biases [D]
    const std::vector<float> ones(size_t(D), 1.0f);
    copy_to_device(qk_l2_ones_.resize(ones.size()), ones.data(), ones.size() * sizeof(float));
    qk_l2_zeros_.resize(size_t(D));
  }
  out_w_ = cfg_.untie_embeddings_and_output_weights ? p("output_layer.weight") : wte_;
  int64_t attention_layers = 0, gdn_layers = 0, mamba_layers = 0;  // each kind's cache or state slots
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const std::string s = "decoder.layers." + std::to_string(l) + ".";
    const std::string a = s + "self_attention.";
    Layer& m = layers_.emplace_back();
    m.attention = cfg_.attention_block(l);
    m.mlp = cfg_.mlp_block(l);
    m.mamba = cfg_.mamba_layer(l);
    m.linear = cfg_.linear_attention_layer(l);  // a Gated DeltaNet layer: no attention's parameters
    if (m.mamba) {  // the layer's norm and MambaMixer (model/mamba_mixer.cpp; no linear biases)
      const std::string x = s + "mixer.";
      m.slot = mamba_layers++;
      m.ln1_w = norm_weight(s + "norm.weight", C);
      m.ln1_b = norm_bias(s + "norm.bias");
      m.qkv_w = p(x + "in_proj.weight");
      m.conv_w = p(x + "conv1d.weight");
      m.conv_b = p(x + "conv1d.bias");
      m.dt_bias = p(x + "dt_bias");
      m.a_log = p(x + "A_log");
      m.d_skip = p(x + "D");
      m.out_norm_w = p(x + "norm.weight");
      m.proj_w = p(x + "out_proj.weight");
    } else if (m.linear) {  // GatedDeltaNet (model/gated_delta_net.h; no linear biases)
      m.slot = gdn_layers++;
      m.ln1_w = norm_weight(s + "input_layernorm.weight", C);
      m.ln1_b = norm_bias(s + "input_layernorm.bias");
      m.qkv_w = p(a + "in_proj.weight");
      m.proj_w = p(a + "out_proj.weight");
      m.conv_w = p(a + "conv1d.weight");
      m.a_log = p(a + "A_log");
      m.dt_bias = p(a + "dt_bias");
      m.out_norm_w = norm_weight(a + "out_norm.weight", cfg_.linear_value_head_dim);
      m.out_norm_b = norm_bias(a + "out_norm.bias");
    } else if (m.attention) {
      m.slot = attention_layers++;
      m.ln1_w = norm_weight(s + "input_layernorm.weight", C);
      m.ln1_b = norm_bias(s + "input_layernorm.bias");
      if (cfg_.qk_l2_norm)
        m.qk_norm = {qk_l2_ones_.data(), qk_l2_zeros_.data(), qk_l2_ones_.data(), qk_l2_zeros_.data()};
      else if (cfg_.qk_layernorm && !cfg_.multi_latent_attention)
        m.qk_norm = {norm_weight(a + "q_layernorm.weight", D), norm_bias(a + "q_layernorm.bias"),
                     norm_weight(a + "k_layernorm.weight", D), norm_bias(a + "k_layernorm.bias")};
      m.proj_w = p(a + "linear_proj.weight");
      m.proj_b = bias(a + "linear_proj.bias");
      if (!cfg_.multi_latent_attention) {
        m.qkv_w = p(a + "linear_qkv.weight");
        if (cfg_.qkv_bias()) m.qkv_b = p(a + "linear_qkv.bias");
      } else {
        const bool norms = cfg_.mla_latent_norms();
        if (cfg_.q_lora_rank == 0) {
          m.q_proj_w = p(a + "linear_q_proj.weight");
        } else {
          m.q_down_w = p(a + "linear_q_down_proj.weight");
          m.q_up_w = p(a + "linear_q_up_proj.weight");
          if (norms) {
            m.q_norm_w = norm_weight(a + "q_layernorm.weight", cfg_.q_lora_rank);
            m.q_norm_b = norm_bias(a + "q_layernorm.bias");
          }
        }
        m.kv_down_w = p(a + "linear_kv_down_proj.weight");
        m.kv_up_w = p(a + "linear_kv_up_proj.weight");
        if (norms) {
          m.kv_norm_w = norm_weight(a + "kv_layernorm.weight", cfg_.kv_lora_rank);
          m.kv_norm_b = norm_bias(a + "kv_layernorm.bias");
        }
      }
      if (cfg_.learnable_softmax_offset())
        m.softmax_offset = p(a + "core_attention.softmax_offset");
      else if (cfg_.softmax_sink())  // off-by-one: zeros, made once
        m.softmax_offset = zero_offsets_.resize(size_t(cfg_.num_attention_heads));
    }
    if (!m.mlp) continue;
    m.ln2_w = norm_weight(s + "pre_mlp_layernorm.weight", C);
    m.ln2_b = norm_bias(s + "pre_mlp_layernorm.bias");
    if (!cfg_.moe_layer(l)) {
      m.fc1_w = p(s + "mlp.linear_fc1.weight");
      m.fc1_b = bias(s + "mlp.linear_fc1.bias");
      m.fc2_w = p(s + "mlp.linear_fc2.weight");
      m.fc2_b = bias(s + "mlp.linear_fc2.bias");
      continue;
    }
    MoeWeights& moe = m.moe;
    moe.router = p(s + "mlp.router.weight");
    if (cfg_.moe_router_enable_expert_bias) moe.expert_bias = p(s + "mlp.router.expert_bias");
    if (cfg_.add_bias_linear) moe.router_bias = p(s + "mlp.router.bias");
    for (int64_t e = 0; e < cfg_.num_experts; ++e) {
      const std::string x = s + "mlp.experts.local_experts." + std::to_string(e) + ".";
      moe.fc1.push_back(p(x + "linear_fc1.weight"));
      moe.fc2.push_back(p(x + "linear_fc2.weight"));
      if (!cfg_.add_bias_linear) continue;
      moe.fc1_bias.push_back(p(x + "linear_fc1.bias"));
      moe.fc2_bias.push_back(p(x + "linear_fc2.bias"));
    }
    moe.fc1_site.assign(moe.fc1.size(), site_);
    moe.fc2_site.assign(moe.fc2.size(), site_);
    moe.shared_fc1_site = moe.shared_fc2_site = moe.latent_fc1_site = moe.latent_fc2_site = site_;
    // --moe-router-dtype fp32: the router's GEMM (and the shared experts' gate's) stays fp32, as in training.
    moe.router_site = moe.shared_gate_site = cfg_.moe_router_dtype == "fp32" ? GemmSite{} : site_;
    if (cfg_.moe_shared_expert_intermediate_size > 0) {
      moe.shared_fc1 = p(s + "mlp.shared_experts.linear_fc1.weight");
      moe.shared_fc2 = p(s + "mlp.shared_experts.linear_fc2.weight");
      if (cfg_.moe_shared_expert_gate) moe.shared_gate = p(s + "mlp.shared_experts.gate_weight");
    }
    if (cfg_.moe_latent_size > 0) {
      moe.latent_fc1 = p(s + "mlp.fc1_latent_proj.weight");
      moe.latent_fc2 = p(s + "mlp.fc2_latent_proj.weight");
    }
  }
  // One cache row per key/value head and attention layer: grouped-query attention keeps G, not H, keys per
  // token; the GDN and Mamba layers keep no cache but their convolution's history and their state.
  const size_t S = size_t(sequences);
  const size_t cache = size_t(attention_layers * cfg_.num_query_groups * cfg_.kv_channels * capacity_);
  k_cache_.resize(S * cache);
  v_cache_.resize(S * cache);
  if (gdn_layers > 0) {
    const GdnShape g = gdn_kernel_shape(cfg_, 1, 1, 1);
    gdn_hist_.resize(S * size_t(gdn_layers * (g.K - 1) * g.width()));
    gdn_state_.resize(S * size_t(gdn_layers * g.Hv * g.state()));
  }
  if (mamba_layers > 0) {
    const MambaShape s = mamba_kernel_shape(cfg_, 1, 1, 1);
    mamba_hist_.resize(S * size_t(mamba_layers * (s.K - 1) * s.width()));
    mamba_state_.resize(S * size_t(mamba_layers * s.H * s.state()));
  }
}

void GPTInference::reserve_rows(int64_t n) {
  if (n <= rows_) return;
  const size_t C = size_t(cfg_.hidden_size), F = size_t(cfg_.ffn_hidden_size), N = size_t(n);
  const size_t Q = size_t(cfg_.attention_width());
  if (cfg_.multi_latent_attention) {
    const size_t H = size_t(cfg_.num_attention_heads);
    mla_q_.resize(N * H * size_t(cfg_.mla_qk_dim()));
    mla_kv_.resize(N * H * size_t(cfg_.qk_head_dim + cfg_.v_head_dim));
    mla_c_.resize(N * size_t(cfg_.kv_lora_rank + cfg_.qk_pos_emb_head_dim));
    mla_lat_.resize(N * size_t(std::max(cfg_.q_lora_rank, cfg_.kv_lora_rank)));
    mla_latn_.resize(N * size_t(std::max(cfg_.q_lora_rank, cfg_.kv_lora_rank)));
    attn_v_.resize(N * H * size_t(cfg_.v_head_dim));
  }
  x_.resize(N * C);
  ln_.resize(N * C);
  attn_.resize(N * Q);
  tmp_.resize(N * C);
  qkv_.resize(N * size_t(cfg_.qkv_width()));
  fc_.resize(N * size_t(cfg_.fc1_width()));
  if (cfg_.gated_linear_unit()) act_.resize(N * F);
  if (cfg_.moe()) {
    const MoeShape s = generation_moe_shape(cfg_);
    moe_state_carve(moe_, moe_buf_.resize(size_t(moe_state_floats(n, s))), n, s);
  }
  if (cfg_.qk_norm()) {
    const size_t rows = N * size_t(cfg_.num_attention_heads + cfg_.num_query_groups);
    qk_raw_.resize(rows * size_t(cfg_.kv_channels));
    qk_out_.resize(rows * size_t(cfg_.kv_channels));
    qk_mean_.resize(rows);
    qk_rstd_.resize(rows);
  }
  mean_.resize(N);
  rstd_.resize(N);
  ids_.resize(2 * N);
  if (cfg_.gated_delta_net()) {
    const GdnShape g = gdn_kernel_shape(cfg_, 1, 1, n);
    const size_t rows = N + size_t(g.K - 1);
    gdn_x_.resize(rows * size_t(g.width()));
    gdn_u_.resize(rows * size_t(g.conv()));
    gdn_q_.resize(N * size_t(g.qk()));
    gdn_k_.resize(N * size_t(g.qk()));
    gdn_g_.resize(N * size_t(g.Hv));
    gdn_beta_.resize(N * size_t(g.Hv));
    gdn_o_.resize(N * size_t(g.v()));
    gdn_n_.resize(N * size_t(g.v()));
    gdn_mean_.resize(N * size_t(g.Hv));
    gdn_rstd_.resize(N * size_t(g.Hv));
    attn_.resize(N * size_t(std::max(cfg_.attention_width(), g.v())));
  }
  if (mamba_state_.size() > 0) {
    const MambaShape s = mamba_kernel_shape(cfg_, 1, 1, n);
    const size_t rows = N + size_t(s.K - 1);
    mamba_x_.resize(rows * size_t(s.width()));
    mamba_u_.resize(rows * size_t(s.conv()));
    mamba_dt_.resize(N * size_t(s.H));
    mamba_y_.resize(N * size_t(s.inner()));
    mamba_rstd_.resize(N * size_t(s.G));
    attn_.resize(N * size_t(std::max(cfg_.attention_width(), s.inner())));
  }
  rows_ = n;
}

void GPTInference::mla_qkv(float* qkv, const Layer& p, const float* ln, int64_t n) {
  const MlaShape s = mla_shape(cfg_, cfg_.num_attention_heads);
  const int64_t C = cfg_.hidden_size, H = s.H, Rq = cfg_.q_lora_rank, Rkv = s.Rkv;
  const float eps = cfg_.mla_latent_eps();
  const Normalization norm = cfg_.rmsnorm() ? Normalization::rmsnorm : Normalization::layernorm;
  float *lat = mla_lat_.data(), *latn = mla_latn_.data(), *c = mla_c_.data();
  if (Rq > 0) {
    linear_forward(lat, ln, p.q_down_w, nullptr, n, C, Rq, site_);
    if (p.q_norm_w) layernorm_forward(latn, mean_.data(), rstd_.data(), lat, p.q_norm_w, p.q_norm_b, n, Rq, eps, norm);
    linear_forward(mla_q_.data(), p.q_norm_w ? latn : lat, p.q_up_w, nullptr, n, Rq, H * s.Dq(), site_);
  } else {
    linear_forward(mla_q_.data(), ln, p.q_proj_w, nullptr, n, C, H * s.Dq(), site_);
  }
  linear_forward(c, ln, p.kv_down_w, nullptr, n, C, s.latent(), site_);
  copy_head_blocks(lat, Rkv, Rkv, c, s.latent(), s.latent(), n, 1, Rkv);
  if (p.kv_norm_w) layernorm_forward(latn, mean_.data(), rstd_.data(), lat, p.kv_norm_w, p.kv_norm_b, n, Rkv, eps, norm);
  linear_forward(mla_kv_.data(), p.kv_norm_w ? latn : lat, p.kv_up_w, nullptr, n, Rkv, H * s.Dnv(), site_);
  mla_fuse_qkv(qkv, mla_q_.data(), mla_kv_.data(), c, n, s);
}

void GPTInference::gdn_layer(float* out, const Layer& p, const float* ln, int64_t n, int64_t seq) {
  const GdnShape conv = gdn_kernel_shape(cfg_, 1, 1, cfg_.linear_conv_kernel_dim - 1 + n);  // history, then the tokens
  const GdnShape s = gdn_kernel_shape(cfg_, 1, 1, n);
  const int64_t W = s.width(), Km = s.K - 1, C = cfg_.hidden_size;
  float* hist = gdn_hist_.data() + seq * int64_t(gdn_hist_.size()) / sequences() + p.slot * Km * W;
  float* state = gdn_state_.data() + seq * int64_t(gdn_state_.size()) / sequences() + p.slot * s.Hv * s.state();
  float* xin = gdn_x_.data();
  float* x = xin + Km * W;  // the tokens' in_proj rows
  float* u = gdn_u_.data() + Km * s.conv();
  copy_on_device(xin, hist, size_t(Km * W) * sizeof(float));
  linear_forward(x, ln, p.qkv_w, nullptr, n, C, W, site_);
  gdn_conv_forward(gdn_u_.data(), xin, p.conv_w, conv);  // (the history's own rows are not used)
  gdn_gates_forward(gdn_q_.data(), gdn_k_.data(), gdn_g_.data(), gdn_beta_.data(), u, x, p.a_log, p.dt_bias, s);
  gdn_delta_rule_forward(gdn_o_.data(), state, nullptr, gdn_q_.data(),
                         gdn_k_.data(), u, gdn_g_.data(), gdn_beta_.data(), s, true);
  layernorm_forward(gdn_n_.data(), gdn_mean_.data(), gdn_rstd_.data(), gdn_o_.data(), p.out_norm_w, p.out_norm_b,
                    n * s.Hv, s.Dv, cfg_.layernorm_epsilon,
                    cfg_.rmsnorm() ? Normalization::rmsnorm : Normalization::layernorm);
  gdn_output_gate_forward(attn_.data(), gdn_n_.data(), x, s);
  linear_forward(out, attn_.data(), p.proj_w, nullptr, n, s.v(), C, site_);
  copy_on_device(hist, xin + n * W, size_t(Km * W) * sizeof(float));  // the last K - 1 rows
}

void GPTInference::mamba_layer(float* out, const Layer& p, const float* ln, int64_t n, int64_t seq) {
  const int64_t Km = TransformerConfig::kMambaConvKernel - 1, C = cfg_.hidden_size;
  const MambaShape conv = mamba_kernel_shape(cfg_, 1, 1, Km + n);  // the history, then the tokens
  const MambaShape s = mamba_kernel_shape(cfg_, 1, 1, n);
  const int64_t W = s.width();
  float* hist = mamba_hist_.data() + seq * int64_t(mamba_hist_.size()) / sequences() + p.slot * Km * W;
  float* state = mamba_state_.data() + seq * int64_t(mamba_state_.size()) / sequences() + p.slot * s.H * s.state();
  float* xin = mamba_x_.data();
  float* x = xin + Km * W;                         // the tokens' in_proj rows
  const float* u = mamba_u_.data() + Km * s.conv();  // their convolution's rows
  copy_on_device(xin, hist, size_t(Km * W) * sizeof(float));
  linear_forward(x, ln, p.qkv_w, nullptr, n, C, W, site_);
  mamba_conv_forward(mamba_u_.data(), xin, p.conv_w, p.conv_b, conv);  // (the history's own rows are not used)
  mamba_dt_forward(mamba_dt_.data(), x, p.dt_bias, s);
  mamba_scan_forward(mamba_y_.data(), nullptr, u, mamba_dt_.data(), p.a_log, p.d_skip, s, state);
  mamba_gated_norm_forward(attn_.data(), mamba_rstd_.data(), mamba_y_.data(), x, p.out_norm_w, s);
  linear_forward(out, attn_.data(), p.proj_w, nullptr, n, s.inner(), C, site_);
  copy_on_device(hist, xin + n * W, size_t(Km * W) * sizeof(float));  // the last K - 1 rows
}

void GPTInference::attention_layer(float* out, const Layer& p, int64_t l, const float* ln, int64_t n,
                                   const std::vector<Segment>& segments) {
  const int64_t C = cfg_.hidden_size, H = cfg_.num_attention_heads, D = cfg_.kv_channels, Tmax = capacity_;
  const int64_t Q = cfg_.attention_width();
  const QkvLayout layout{H, cfg_.num_query_groups, D, cfg_.attention_output_gate};
  const Normalization norm = cfg_.rmsnorm() ? Normalization::rmsnorm : Normalization::layernorm;
  float *qkv = qkv_.data(), *attn = attn_.data();
  if (cfg_.multi_latent_attention)
    mla_qkv(qkv, p, ln, n);
  else
    linear_forward(qkv, ln, p.qkv_w, p.qkv_b, n, C, layout.width(), site_);  // [n, G, H/G + 2, D] (gated: 2H/G + 2)
  if (cfg_.qk_norm())
    qk_layernorm_forward(qkv, qk_raw_.data(), qk_mean_.data(), qk_rstd_.data(), qk_out_.data(), p.qk_norm, n, layout,
                         cfg_.layernorm_epsilon, cfg_.qk_l2_norm ? Normalization::rmsnorm : norm);
  // Each segment's rows: q and k rotated to their positions in its sequence, its keys and values
  // appended to the sequence's cache, its queries attending to it.
  const int64_t W = layout.width();
  for (const Segment& g : segments) {
    float* q = qkv + g.row0 * W;
    // (a LongRoPE model's table: the long one once the context passes the original length)
    if (rope_ && cfg_.rotary_layer(l))
      rope_forward(q, cfg_.longrope_long(g.past + g.rows) ? *rope_long_ : *rope_, g.rows, g.rows, g.past, layout);
    const int64_t cache = g.seq * int64_t(k_cache_.size()) / sequences() + p.slot * layout.G * Tmax * D;
    kv_cache_append(k_cache_.data() + cache, v_cache_.data() + cache, q, g.rows, g.past, layout, Tmax);
    cached_attention_forward(attn + g.row0 * H * D, q, k_cache_.data() + cache, v_cache_.data() + cache, g.rows,
                             g.past, layout, Tmax, cfg_.attention_window(l), p.softmax_offset);
  }
  if (cfg_.attention_output_gate) attention_output_gate_forward(attn, attn, qkv, n, layout);  // in place
  if (cfg_.multi_latent_attention) {  // linear_proj reads the values' dims of each head
    mla_values(attn_v_.data(), attn, n, mla_shape(cfg_, H));
    linear_forward(out, attn_v_.data(), p.proj_w, p.proj_b, n, cfg_.attention_output_width(), C, site_);
  } else {
    linear_forward(out, attn, p.proj_w, p.proj_b, n, Q, C, site_);
  }
}

void GPTInference::append(const int32_t* tokens, int64_t n, float* logits, bool all_positions, int64_t seq) {
  LATTICE_CHECK(n > 0) << "append: no tokens";
  LATTICE_CHECK(seq >= 0 && seq < sequences()) << "append: sequence " << seq << " of " << sequences();
  forward(tokens, n, {Segment{seq, 0, n, lengths_[size_t(seq)]}}, logits, {{all_positions ? 0 : n - 1, n}});
}

void GPTInference::append(const std::vector<Part>& parts, float* logits) {
  LATTICE_CHECK(!parts.empty()) << "append: no sequences";
  std::vector<Segment> segments;
  std::vector<std::pair<int64_t, int64_t>> logit_rows;
  std::vector<int32_t> tokens;
  std::vector<bool> seen(size_t(sequences()), false);
  for (const Part& p : parts) {
    LATTICE_CHECK(p.n > 0) << "append: no tokens for sequence " << p.seq;
    LATTICE_CHECK(p.seq >= 0 && p.seq < sequences() && !seen[size_t(p.seq)])
        << "append: sequence " << p.seq << " is not one of the " << sequences() << " or comes twice";
    seen[size_t(p.seq)] = true;
    const int64_t row0 = int64_t(tokens.size());
    segments.push_back(Segment{p.seq, row0, p.n, lengths_[size_t(p.seq)]});
    logit_rows.emplace_back(p.all_positions ? row0 : row0 + p.n - 1, row0 + p.n);
    tokens.insert(tokens.end(), p.tokens, p.tokens + p.n);
  }
  forward(tokens.data(), int64_t(tokens.size()), segments, logits, logit_rows);
}

void GPTInference::step(const int32_t* tokens, const int64_t* seqs, int64_t count, float* logits) {
  LATTICE_CHECK(count > 0) << "step: no sequences";
  std::vector<Segment> segments;
  std::vector<bool> seen(size_t(sequences()), false);
  for (int64_t i = 0; i < count; ++i) {
    LATTICE_CHECK(seqs[i] >= 0 && seqs[i] < sequences() && !seen[size_t(seqs[i])])
        << "step: sequence " << seqs[i] << " is not one of the " << sequences() << " or comes twice";
    seen[size_t(seqs[i])] = true;
    segments.push_back(Segment{seqs[i], i, 1, lengths_[size_t(seqs[i])]});
  }
  forward(tokens, count, segments, logits, {{0, count}});
}

void GPTInference::forward(const int32_t* tokens, int64_t n, const std::vector<Segment>& segments, float* logits,
                           const std::vector<std::pair<int64_t, int64_t>>& logit_rows) {
  const int64_t C = cfg_.hidden_size, F = cfg_.ffn_hidden_size, Vp = cfg_.padded_vocab_size;
  const float eps = cfg_.layernorm_epsilon;
  const Normalization norm = cfg_.rmsnorm() ? Normalization::rmsnorm : Normalization::layernorm;
  for (const Segment& g : segments)
    if (g.past + g.rows > capacity_)
      LATTICE_FAIL() << "KV cache full: " << g.past << " + " << g.rows << " tokens exceed its " << capacity_
                     << " positions (max_position_embeddings " << cfg_.max_position_embeddings << ")";
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab_size)
      LATTICE_FAIL() << "token id " << tokens[i] << " is outside the model's vocabulary [0, "
                     << cfg_.vocab_size << ")";
  reserve_rows(n);
  float *x = x_.data(), *ln = ln_.data(), *tmp = tmp_.data(), *fc = fc_.data();
  int32_t* ids = ids_.host();  // [tokens | positions]
  for (const Segment& g : segments)
    for (int64_t i = 0; i < g.rows; ++i) {
      ids[g.row0 + i] = tokens[g.row0 + i];
      ids[n + g.row0 + i] = int32_t(g.past + i);
    }
  ids_.upload(size_t(2 * n));
  embedding_forward(x, ids_.device(), ids_.device() + n, wte_, wpe_, n, C);  // x: [n, C]
  for (const Segment& g : segments)
    if (g.past == 0)  // a new sequence: no history, zero states
      for (DeviceArray<float>* a : {&gdn_hist_, &gdn_state_, &mamba_hist_, &mamba_state_})
        if (a->size() > 0) {
          const size_t per = a->size() / size_t(sequences());
          zero_on_device(a->data() + size_t(g.seq) * per, per * sizeof(float));
        }

  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const Layer& p = layers_[l];
    if (p.attention) {
      layernorm_forward(ln, mean_.data(), rstd_.data(), x, p.ln1_w, p.ln1_b, n, C, eps, norm);
      if (p.mamba || p.linear) {  // a Mamba or Gated DeltaNet layer: its state is the sequence's
        for (const Segment& g : segments) {
          if (p.mamba) mamba_layer(tmp + g.row0 * C, p, ln + g.row0 * C, g.rows, g.seq);
          else gdn_layer(tmp + g.row0 * C, p, ln + g.row0 * C, g.rows, g.seq);
        }
      } else {
        attention_layer(tmp, p, l, ln, n, segments);
      }
      add_forward(x, x, tmp, n * C);
    }
    if (!p.mlp) continue;
    layernorm_forward(ln, mean_.data(), rstd_.data(), x, p.ln2_w, p.ln2_b, n, C, eps, norm);
    if (cfg_.moe_layer(l)) {
      const MoeShape shape = generation_moe_shape(cfg_);
      if (shape.capacity_factor > 0) {  // an expert's capacity counts the tokens routed with it: each
        for (const Segment& g : segments)  // sequence's alone, as when it is decoded alone
          moe_forward(tmp + g.row0 * C, ln + g.row0 * C, moe_, p.moe, g.rows, shape);
      } else {
        moe_forward(tmp, ln, moe_, p.moe, n, shape);
      }
      add_forward(x, x, tmp, n * C);
      continue;
    }
    linear_forward(fc, ln, p.fc1_w, p.fc1_b, n, C, cfg_.fc1_width(), site_);
    float* act = fc;
    if (cfg_.gated_linear_unit()) {  // fc [n, 2F] (with its bias) -> act [n, F]
      act = act_.data();
      bias_swiglu_forward(fc, act, fc, nullptr, n, F, Rounding::none, cfg_.glu_form());
    } else {
      gelu_forward(fc, fc, n * F, cfg_.gelu);
    }
    linear_forward(tmp, act, p.fc2_w, p.fc2_b, n, F, C, site_);
    add_forward(x, x, tmp, n * C);
  }
  for (const Segment& g : segments) lengths_[size_t(g.seq)] += g.rows;
  // Only the rows whose logits are wanted go through the final norm and the output layer (gathered
  // into tmp when they are not one run).
  int64_t rows = 0;
  for (const auto& [begin, end] : logit_rows) rows += end - begin;
  const float* wanted = x + logit_rows.front().first * C;
  if (logit_rows.size() > 1) {
    int64_t at = 0;
    for (const auto& [begin, end] : logit_rows) {
      copy_on_device(tmp + at * C, x + begin * C, size_t((end - begin) * C) * sizeof(float));
      at += end - begin;
    }
    wanted = tmp;
  }
  layernorm_forward(ln, mean_.data(), rstd_.data(), wanted, lnf_w_, lnf_b_, rows, C, eps, norm);
  if (current_device() == Device::cpu) {
    linear_forward(logits, ln, out_w_, nullptr, rows, C, Vp, site_);  // [rows, Vp]
    return;
  }
  float* out = logits_.resize(size_t(rows * Vp));
  linear_forward(out, ln, out_w_, nullptr, rows, C, Vp, site_);
  copy_to_host(logits, out, size_t(rows * Vp) * sizeof(float));
}

}  // namespace lattice
