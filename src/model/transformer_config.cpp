#include "model/transformer_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "core/error.h"

namespace lattice {

int64_t pad_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tp) {
  int64_t multiple = divisible_by * tp;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

void check_tensor_parallel_split(const TransformerConfig& c, int64_t tp) {
  if (c.moe() && c.moe_shared_expert_intermediate_size % tp != 0)
    LATTICE_FAIL() << "--moe-shared-expert-intermediate-size " << c.moe_shared_expert_intermediate_size
                   << " is not divisible by --tensor-model-parallel-size " << tp;
  if (c.moe() && c.moe_ffn_hidden_size % c.expert_tp(tp) != 0)
    LATTICE_FAIL() << "--moe-ffn-hidden-size " << c.moe_ffn_hidden_size
                   << " is not divisible by --tensor-model-parallel-size " << tp;
  if (c.num_attention_heads % tp != 0)
    LATTICE_FAIL() << "--num-attention-heads " << c.num_attention_heads
                   << " is not divisible by --tensor-model-parallel-size " << tp;
  if (c.num_query_groups % tp != 0)
    LATTICE_FAIL() << "--num-query-groups " << c.num_query_groups << " is not divisible by --tensor-model-parallel-size "
                   << tp;
  if (c.ffn_hidden_size % tp != 0)
    LATTICE_FAIL() << "--ffn-hidden-size " << c.ffn_hidden_size << " is not divisible by --tensor-model-parallel-size "
                   << tp;
  if (c.padded_vocab_size % tp != 0)
    LATTICE_FAIL() << "the padded vocabulary " << c.padded_vocab_size
                   << " is not divisible by --tensor-model-parallel-size " << tp << " (--make-vocab-size-divisible-by)";
}

void TransformerConfig::finalize(int64_t tp) {
  if (num_layers <= 0) LATTICE_FAIL() << "--num-layers must be positive, got " << num_layers;
  if (hidden_size <= 0) LATTICE_FAIL() << "--hidden-size must be positive, got " << hidden_size;
  if (num_attention_heads <= 0)
    LATTICE_FAIL() << "--num-attention-heads must be positive, got " << num_attention_heads;
  check_mla();
  if (kv_channels == 0) {
    if (hidden_size % num_attention_heads != 0)
      LATTICE_FAIL() << "--num-attention-heads " << num_attention_heads
                     << " does not divide --hidden-size " << hidden_size;
    kv_channels = hidden_size / num_attention_heads;
  }
  if (kv_channels <= 0) LATTICE_FAIL() << "--kv-channels must be positive, got " << kv_channels;
  if (num_query_groups == 0) num_query_groups = num_attention_heads;
  if (num_query_groups < 0 || num_attention_heads % num_query_groups != 0)
    LATTICE_FAIL() << "--num-query-groups " << num_query_groups << " does not divide --num-attention-heads "
                   << num_attention_heads;
  // Megatron's default; with SwiGLU two thirds of it, rounded down to a multiple of 64, so that
  // the MLP has about as many parameters with its three matrices.
  if (ffn_hidden_size == 0) {
    ffn_hidden_size = swiglu ? 4 * hidden_size * 2 / 3 / 64 * 64 : 4 * hidden_size;
    if (ffn_hidden_size == 0)
      LATTICE_FAIL() << "--swiglu's default --ffn-hidden-size (8/3 of --hidden-size " << hidden_size
                     << ", rounded down to a multiple of 64) is 0; give --ffn-hidden-size";
  }
  if (ffn_hidden_size <= 0) LATTICE_FAIL() << "--ffn-hidden-size must be positive";
  check_gated_linear_unit();
  if (tp < 1) LATTICE_FAIL() << "--tensor-model-parallel-size must be >= 1, got " << tp;
  if (vocab_size <= 0) LATTICE_FAIL() << "vocabulary size must be positive (--vocab-size or a tokenizer)";
  if (make_vocab_size_divisible_by <= 0)
    LATTICE_FAIL() << "--make-vocab-size-divisible-by must be positive";
  if (padded_vocab_size == 0)
    padded_vocab_size = pad_vocab_size(vocab_size, make_vocab_size_divisible_by, tp);
  if (padded_vocab_size < vocab_size) LATTICE_FAIL() << "padded vocabulary smaller than the vocabulary";
  check_hybrid(tp);
  check_moe();
  check_mtp();
  check_tensor_parallel_split(*this, tp);
  if (expert_tensor_parallel_size != 0 && expert_tensor_parallel_size != 1 && expert_tensor_parallel_size != tp)
    LATTICE_FAIL() << "--expert-tensor-parallel-size " << expert_tensor_parallel_size << " is neither 1 nor "
                   << "--tensor-model-parallel-size " << tp << " (the experts are whole or split as the dense MLP)";
  if (max_position_embeddings <= 0)
    LATTICE_FAIL() << "--max-position-embeddings must be positive, got " << max_position_embeddings;
  check_position_embedding();
  if (attention_output_gate && multi_latent_attention)
    LATTICE_FAIL() << "--attention-output-gate does not go with --multi-latent-attention (its gates come from "
                      "linear_qkv, which MLA does not have)";
  if (qk_layernorm && qk_l2_norm)
    LATTICE_FAIL() << "--qk-layernorm and --qk-l2-norm are exclusive (each is the query and key norm; pick one)";
  if (softmax_type != "vanilla" && softmax_type != "off-by-one" && softmax_type != "learnable")
    LATTICE_FAIL() << "--softmax-type must be vanilla, off-by-one or learnable, got '" << softmax_type << "'";
  if (window_size < -1) LATTICE_FAIL() << "--window-size must be -1 (none) or >= 0 keys, got " << window_size;
  if (!window_attn_pattern.empty() && int64_t(window_attn_pattern.size()) != num_layers)
    LATTICE_FAIL() << "--window-attn-skip-freq has " << window_attn_pattern.size() << " entries for --num-layers "
                   << num_layers;
  check_no_rope();
  if (gated_delta_net() && linear_attention_pattern.empty()) linear_attention_pattern.assign(size_t(num_layers), 1);
  check_gated_delta_net(tp);
  if (normalization != "LayerNorm" && normalization != "RMSNorm")
    LATTICE_FAIL() << "--normalization must be LayerNorm or RMSNorm, got '" << normalization << "'";
  if (hidden_dropout < 0 || hidden_dropout >= 1)
    LATTICE_FAIL() << "--hidden-dropout must be in [0, 1), got " << hidden_dropout;
  if (attention_dropout < 0 || attention_dropout >= 1)
    LATTICE_FAIL() << "--attention-dropout must be in [0, 1), got " << attention_dropout;
  check_recompute();
}

void TransformerConfig::check_hybrid(int64_t tp) {
  if (!hybrid()) return;
  const std::string& p = hybrid_layer_pattern;
  if (int64_t(p.size()) != num_layers)
    LATTICE_FAIL() << "--hybrid-override-pattern '" << p << "' has " << p.size() << " layers for --num-layers "
                   << num_layers;
  if (size_t bad = p.find_first_not_of("M*-E"); bad != std::string::npos)
    LATTICE_FAIL() << "--hybrid-override-pattern '" << p << "': '" << p[bad] << "' at layer " << bad
                   << " is not M (Mamba), * (attention), - (MLP) or E (MoE)";
  const std::string& m = mtp_hybrid_pattern;
  if (mtp_num_layers > 0 && m.empty())
    LATTICE_FAIL() << "--mtp-num-layers with --hybrid-override-pattern needs the prediction depths' layers after '/' "
                      "in the pattern (Megatron's form, e.g. '"
                   << p << "/*-' for one depth of an attention and an MLP block)";
  if (!m.empty() && mtp_num_layers == 0)
    LATTICE_FAIL() << "--hybrid-override-pattern's MTP layers '" << m << "' need --mtp-num-layers";
  if (!m.empty() && !is_mtp_depth_form(m))
    LATTICE_FAIL() << "--hybrid-override-pattern: the MTP layers '" << m << "' are not a mixer (M or *) and/or an MLP "
                   << "(- or E) in that order (lattice runs a prediction depth as one layer)";
  const bool experts = p.find('E') != std::string::npos || m.find('E') != std::string::npos;
  if (experts != (num_experts > 0))
    LATTICE_FAIL() << (experts ? "--hybrid-override-pattern's E layers need --num-experts"
                               : "--num-experts needs E (MoE) layers in --hybrid-override-pattern");
  if (experts) {  // the MoE layers are the pattern's E layers (an MTP layer's: moe_layer)
    moe_layer_pattern.clear();
    for (char c : p) moe_layer_pattern.push_back(c == 'E' ? 1 : 0);
  }
  if (gated_delta_net() || multi_latent_attention)
    LATTICE_FAIL() << "--hybrid-override-pattern does not go with "
                   << (gated_delta_net() ? "--experimental-attention-variant" : "--multi-latent-attention") << " yet";
  if (!has_mamba_layers()) return;
  const struct {
    const char* flag;
    int64_t value;
  } dims[] = {{"--mamba-state-dim", mamba_state_dim},
              {"--mamba-head-dim", mamba_head_dim},
              {"--mamba-num-groups", mamba_num_groups}};
  for (const auto& d : dims)
    if (d.value <= 0) LATTICE_FAIL() << d.flag << " must be positive, got " << d.value;
  if (mamba_num_heads < 0) LATTICE_FAIL() << "--mamba-num-heads must be positive (or 0: 2 x --hidden-size / --mamba-head-dim)";
  if (mamba_num_heads == 0 && (2 * hidden_size) % mamba_head_dim != 0)
    LATTICE_FAIL() << "--mamba-head-dim " << mamba_head_dim << " does not divide 2 x --hidden-size " << 2 * hidden_size
                   << " (the Mamba layers' d_inner; or give --mamba-num-heads)";
  const int64_t H = mamba_heads();
  if (H % mamba_num_groups != 0)
    LATTICE_FAIL() << "--mamba-num-groups " << mamba_num_groups << " does not divide the Mamba heads " << H;
  if (H % tp != 0 || mamba_num_groups % tp != 0)
    LATTICE_FAIL() << "the Mamba heads " << H << " and --mamba-num-groups " << mamba_num_groups
                   << " must be divisible by --tensor-model-parallel-size " << tp;
}

void TransformerConfig::check_gated_delta_net(int64_t tp) const {
  if (experimental_attention_variant.empty()) {
    if (!linear_attention_pattern.empty())
      LATTICE_FAIL() << "--linear-attention-freq needs --experimental-attention-variant gated_delta_net";
    return;
  }
  if (!gated_delta_net())
    LATTICE_FAIL() << "--experimental-attention-variant must be gated_delta_net, got '"
                   << experimental_attention_variant << "'";
  if (int64_t(linear_attention_pattern.size()) != num_layers)
    LATTICE_FAIL() << "--linear-attention-freq has " << linear_attention_pattern.size() << " entries for --num-layers "
                   << num_layers;
  const struct {
    const char* flag;
    int64_t value;
  } dims[] = {{"--linear-conv-kernel-dim", linear_conv_kernel_dim},
              {"--linear-key-head-dim", linear_key_head_dim},
              {"--linear-value-head-dim", linear_value_head_dim},
              {"--linear-num-key-heads", linear_num_key_heads},
              {"--linear-num-value-heads", linear_num_value_heads}};
  for (const auto& d : dims)
    if (d.value <= 0) LATTICE_FAIL() << d.flag << " must be positive, got " << d.value;
  if (linear_key_head_dim > 1024 || linear_value_head_dim > 1024)
    LATTICE_FAIL() << "--linear-key-head-dim and --linear-value-head-dim must be at most 1024, got "
                   << linear_key_head_dim << " and " << linear_value_head_dim;
  if (linear_num_value_heads % linear_num_key_heads != 0)
    LATTICE_FAIL() << "--linear-num-key-heads " << linear_num_key_heads << " does not divide --linear-num-value-heads "
                   << linear_num_value_heads;
  if (linear_num_key_heads % tp != 0 || linear_num_value_heads % tp != 0)
    LATTICE_FAIL() << "--linear-num-key-heads " << linear_num_key_heads << " and --linear-num-value-heads "
                   << linear_num_value_heads << " must be divisible by --tensor-model-parallel-size " << tp;
  if (!swiglu)
    LATTICE_FAIL() << "--experimental-attention-variant gated_delta_net needs --swiglu (its convolution and output "
                      "gate apply the model's activation, which lattice's GDN layer takes to be SiLU)";
  if (multi_latent_attention)
    LATTICE_FAIL() << "--experimental-attention-variant gated_delta_net does not go with --multi-latent-attention yet";
}

void TransformerConfig::check_no_rope() const {
  if (no_rope_pattern.empty()) return;
  if (int64_t(no_rope_pattern.size()) != num_layers)
    LATTICE_FAIL() << "--no-rope-freq has " << no_rope_pattern.size() << " entries for --num-layers " << num_layers;
  if (!rope())
    LATTICE_FAIL() << "--no-rope-freq needs the rotary embedding (--position-embedding-type rope or yarn), got "
                   << position_embedding_type;
  if (multi_latent_attention)
    LATTICE_FAIL() << "--no-rope-freq does not go with --multi-latent-attention (its shared rotary key is rotated in "
                      "every layer)";
  if (mtp())  // the pattern has one entry per decoder layer
    LATTICE_FAIL() << "--mtp-num-layers with --no-rope-freq is not supported yet";
}

void TransformerConfig::check_mla() {
  if (!multi_latent_attention) {
    if (mla_latent_norm_epsilon != 0.0f)
      LATTICE_FAIL() << "--mla-latent-norm-epsilon needs --multi-latent-attention (the latents' norms)";
    return;
  }
  const struct {
    const char* flag;
    int64_t value, least;
  } dims[] = {{"--q-lora-rank", q_lora_rank, 0},
              {"--kv-lora-rank", kv_lora_rank, 1},
              {"--qk-head-dim", qk_head_dim, 1},
              {"--qk-pos-emb-head-dim", qk_pos_emb_head_dim, 2},
              {"--v-head-dim", v_head_dim, 1}};
  for (const auto& d : dims)
    if (d.value < d.least)
      LATTICE_FAIL() << d.flag << " must be >= " << d.least << " with --multi-latent-attention, got " << d.value;
  if (qk_pos_emb_head_dim % 2 != 0)
    LATTICE_FAIL() << "--qk-pos-emb-head-dim " << qk_pos_emb_head_dim << " must be even (the rotation turns pairs)";
  if (!(mla_latent_norm_epsilon >= 0.0f) || !std::isfinite(mla_latent_norm_epsilon))
    LATTICE_FAIL() << "--mla-latent-norm-epsilon must be a finite number >= 0 (0: --norm-epsilon), got "
                   << mla_latent_norm_epsilon;
  if (mla_latent_norm_epsilon > 0.0f && !qk_layernorm)
    LATTICE_FAIL() << "--mla-latent-norm-epsilon needs --qk-layernorm (the latents' norms)";
  if (!rope())
    LATTICE_FAIL() << "--multi-latent-attention needs --position-embedding-type rope or yarn (its keys' Dr dims are "
                      "rotated), got "
                   << position_embedding_type;
  if (num_query_groups != 0 && num_query_groups != num_attention_heads)
    LATTICE_FAIL() << "--num-query-groups " << num_query_groups
                   << " does not go with --multi-latent-attention (every head has its own key and value)";
  const char* other = qk_l2_norm                                 ? "--qk-l2-norm"
                      : rotary_percent != 1.0                    ? "--rotary-percent (MLA rotates the Dr dims)"
                      : rotary_interleaved                       ? "--rotary-interleaved (MLA's pairs are interleaved)"
                      : use_rope_scaling                         ? "--use-rope-scaling"
                      : rotary_seq_len_interpolation_factor > 0  ? "--rotary-seq-len-interpolation-factor"
                                                                 : nullptr;
  if (other) LATTICE_FAIL() << other << " does not go with --multi-latent-attention";
  // The attention's head dim: q and k of Dq dims, v of Dv, the shorter zero-padded (--kv-channels is not used).
  kv_channels = std::max(mla_qk_dim(), v_head_dim);
  num_query_groups = num_attention_heads;
}

void TransformerConfig::check_mtp() const {
  if (mtp_num_layers < 0) LATTICE_FAIL() << "--mtp-num-layers must be >= 0, got " << mtp_num_layers;
  if (!(mtp_loss_scaling_factor >= 0.0f && mtp_loss_scaling_factor < 1e30f))
    LATTICE_FAIL() << "--mtp-loss-scaling-factor must be a finite number >= 0, got " << mtp_loss_scaling_factor;
  if (!mtp()) return;
  if (!window_attn_pattern.empty())  // a pattern has one entry per decoder layer
    LATTICE_FAIL() << "--mtp-num-layers with --window-attn-skip-freq is not supported yet";
}

void TransformerConfig::check_moe() {
  if (num_experts < 0) LATTICE_FAIL() << "--num-experts must be positive, got " << num_experts;
  if (moe_apply_probs_on_input && !moe()) LATTICE_FAIL() << "--moe-apply-probs-on-input needs --num-experts";
  if (moe_input_jitter_eps != 0.0f && !moe())
    LATTICE_FAIL() << "--moe-input-jitter-eps is the MoE router's: it needs --num-experts";
  if (moe_router_force_load_balancing && !moe())
    LATTICE_FAIL() << "--moe-router-force-load-balancing is the MoE router's: it needs --num-experts";
  if (!moe()) {
    moe_layer_pattern.clear();
    return;
  }
  if (moe_ffn_hidden_size == 0) moe_ffn_hidden_size = ffn_hidden_size;
  if (moe_ffn_hidden_size < 0) LATTICE_FAIL() << "--moe-ffn-hidden-size must be positive, got " << moe_ffn_hidden_size;
  if (moe_router_topk < 1 || moe_router_topk > num_experts)
    LATTICE_FAIL() << "--moe-router-topk must be in [1, --num-experts " << num_experts << "], got " << moe_router_topk;
  for (float coeff : {moe_aux_loss_coeff, moe_seq_aux_loss_coeff, moe_global_aux_loss_coeff})
    if (!(coeff >= 0.0f && std::isfinite(coeff)))
      LATTICE_FAIL() << "--moe-aux-loss-coeff must be a finite number >= 0, got " << coeff;
  if ((moe_router_num_groups > 0) != (moe_router_group_topk > 0) || moe_router_num_groups < 0 ||
      moe_router_group_topk < 0)
    LATTICE_FAIL() << "--moe-router-num-groups and --moe-router-group-topk go together (positive), got "
                   << moe_router_num_groups << " and " << moe_router_group_topk;
  if (moe_router_num_groups > 0) {
    if (num_experts % moe_router_num_groups != 0)
      LATTICE_FAIL() << "--moe-router-num-groups " << moe_router_num_groups << " does not divide --num-experts "
                     << num_experts;
    if (moe_router_group_topk > moe_router_num_groups)
      LATTICE_FAIL() << "--moe-router-group-topk " << moe_router_group_topk << " is above --moe-router-num-groups "
                     << moe_router_num_groups;
    if (moe_router_topk < moe_router_group_topk ||
        moe_router_topk > moe_router_group_topk * (num_experts / moe_router_num_groups))
      LATTICE_FAIL() << "--moe-router-topk " << moe_router_topk << " must be between --moe-router-group-topk "
                     << moe_router_group_topk << " and the experts of that many groups ("
                     << moe_router_group_topk * (num_experts / moe_router_num_groups) << ")";
  }
  if (moe_sinkhorn) {  // Megatron's sinkhorn routing uses none of these: refused rather than ignored
    const char* unused = moe_aux_loss_coeff > 0.0f              ? "--moe-aux-loss-coeff (must be 0)"
                         : moe_expert_capacity_factor > 0.0     ? "--moe-expert-capacity-factor"
                         : moe_router_enable_expert_bias        ? "--moe-router-enable-expert-bias"
                         : moe_router_num_groups > 0            ? "--moe-router-num-groups"
                         : moe_router_topk_scaling_factor != 1  ? "--moe-router-topk-scaling-factor"
                         : moe_router_topk == 1 && moe_router_pre_softmax ? "--moe-router-pre-softmax (k = 1: sigmoid gates)"
                         : moe_router_topk > 1 && moe_router_sigmoid()    ? "--moe-router-score-function sigmoid (k > 1: softmax gates)"
                                                                          : nullptr;
    if (unused) LATTICE_FAIL() << unused << " does not go with --moe-router-load-balancing-type sinkhorn";
    // The gates sinkhorn routing gives: sigmoid of the chosen logit, or the softmax over all E.
    if (moe_router_topk == 1) moe_router_score_function = "sigmoid";
    else moe_router_pre_softmax = true;
  }
  if (moe_apply_probs_on_input && moe_router_topk != 1)  // Megatron's assertion
    LATTICE_FAIL() << "--moe-apply-probs-on-input needs --moe-router-topk 1, got " << moe_router_topk;
  if (!(moe_expert_capacity_factor >= 0.0 && std::isfinite(moe_expert_capacity_factor)))
    LATTICE_FAIL() << "--moe-expert-capacity-factor must be a finite number > 0, got " << moe_expert_capacity_factor;
  if (moe_token_drop_policy != "probs" && moe_token_drop_policy != "position")
    LATTICE_FAIL() << "--moe-token-drop-policy must be probs or position, got '" << moe_token_drop_policy << "'";
  if (!moe_router_dtype.empty() && moe_router_dtype != "fp32")
    LATTICE_FAIL() << "--moe-router-dtype must be fp32, got '" << moe_router_dtype << "'";
  if (moe_router_score_function != "softmax" && moe_router_score_function != "sigmoid")
    LATTICE_FAIL() << "--moe-router-score-function must be softmax or sigmoid, got '" << moe_router_score_function << "'";
  if (moe_router_enable_expert_bias && !moe_router_sigmoid())
    LATTICE_FAIL() << "--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid";
  if (!(moe_router_bias_update_rate >= 0.0f && std::isfinite(moe_router_bias_update_rate)))
    LATTICE_FAIL() << "--moe-router-bias-update-rate must be a finite number >= 0, got " << moe_router_bias_update_rate;
  if (moe_shared_expert_intermediate_size < 0)
    LATTICE_FAIL() << "--moe-shared-expert-intermediate-size must be positive, got "
                   << moe_shared_expert_intermediate_size;
  if (moe_shared_expert_gate && moe_shared_expert_intermediate_size == 0)
    LATTICE_FAIL() << "--moe-shared-expert-gate needs --moe-shared-expert-intermediate-size";
  if (!(moe_input_jitter_eps >= 0.0f && moe_input_jitter_eps < 1.0f))
    LATTICE_FAIL() << "--moe-input-jitter-eps must be in [0, 1) (the noise is uniform in [1 - eps, 1 + eps)), got "
                   << moe_input_jitter_eps;
  if (!(moe_z_loss_coeff >= 0.0f && std::isfinite(moe_z_loss_coeff)))
    LATTICE_FAIL() << "--moe-z-loss-coeff must be a finite number >= 0, got " << moe_z_loss_coeff;
  if (!(moe_router_topk_scaling_factor > 0.0f && std::isfinite(moe_router_topk_scaling_factor)))
    LATTICE_FAIL() << "--moe-router-topk-scaling-factor must be a finite number > 0, got "
                   << moe_router_topk_scaling_factor;
  if (moe_latent_size < 0) LATTICE_FAIL() << "--moe-latent-size must be positive, got " << moe_latent_size;
  if (moe_latent_size > 0 && !moe())
    LATTICE_FAIL() << "--moe-latent-size needs --num-experts (the latent projections wrap the routed experts)";
  if (moe_latent_size > 0 && add_bias_linear)
    LATTICE_FAIL() << "--moe-latent-size needs --disable-bias-linear (the latent projections and their experts "
                      "have no biases here)";
  if (add_bias_linear && moe_shared_expert_intermediate_size > 0)
    LATTICE_FAIL() << "--moe-shared-expert-intermediate-size needs --disable-bias-linear (shared experts have no "
                      "biases, as Megatron-Core's SharedExpertMLP)";
  if (!moe_layer_pattern.empty() && int64_t(moe_layer_pattern.size()) != num_layers)
    LATTICE_FAIL() << "--moe-layer-freq has " << moe_layer_pattern.size() << " entries for --num-layers " << num_layers;
  for (int v : moe_layer_pattern)
    if (v != 0 && v != 1) LATTICE_FAIL() << "--moe-layer-freq entries must be 0 or 1, got " << v;
  if (std::all_of(moe_layer_pattern.begin(), moe_layer_pattern.end(), [](int v) { return v == 1; }))
    moe_layer_pattern.clear();  // every layer: the canonical empty pattern
}

void TransformerConfig::check_yarn() const {
  if (!(yarn_rotary_scaling_factor >= 1.0f && std::isfinite(yarn_rotary_scaling_factor)))
    LATTICE_FAIL() << "--yarn-rotary-scaling-factor must be a finite number >= 1, got " << yarn_rotary_scaling_factor;
  if (yarn_original_max_position_embeddings < 1)
    LATTICE_FAIL() << "--yarn-original-max-position-embeddings must be positive, got "
                   << yarn_original_max_position_embeddings;
  if (!(yarn_beta_fast > 0.0f && yarn_beta_slow > 0.0f && std::isfinite(yarn_beta_fast) && yarn_beta_fast > yarn_beta_slow))
    LATTICE_FAIL() << "--yarn-beta-fast " << yarn_beta_fast << " and --yarn-beta-slow " << yarn_beta_slow
                   << " must be finite and positive, beta-fast the larger";
  if (!std::isfinite(yarn_mscale) || !std::isfinite(yarn_mscale_all_dim))
    LATTICE_FAIL() << "--yarn-mscale and --yarn-mscale-all-dim must be finite, got " << yarn_mscale << " and "
                   << yarn_mscale_all_dim;
  const char* other = rotary_percent != 1.0                     ? "--rotary-percent (YaRN rotates every dim)"
                      : rotary_interleaved                       ? "--rotary-interleaved"
                      : use_rope_scaling                         ? "--use-rope-scaling"
                      : rotary_seq_len_interpolation_factor > 0  ? "--rotary-seq-len-interpolation-factor"
                                                                 : nullptr;
  if (other) LATTICE_FAIL() << other << " does not go with --position-embedding-type yarn";
}

void TransformerConfig::check_longrope() const {
  const char* other = !rope() || yarn()                          ? "--position-embedding-type other than rope"
                      : rotary_interleaved                       ? "--rotary-interleaved"
                      : use_rope_scaling                         ? "--use-rope-scaling"
                      : rotary_seq_len_interpolation_factor > 0  ? "--rotary-seq-len-interpolation-factor"
                      : multi_latent_attention                   ? "--multi-latent-attention"
                                                                 : nullptr;
  if (other) LATTICE_FAIL() << "--longrope-short-factor does not go with " << other;
  const size_t pairs = size_t(double(kv_channels) * rotary_percent) / 2;
  for (const auto* f : {&longrope_short_factor, &longrope_long_factor}) {
    const char* flag = f == &longrope_short_factor ? "--longrope-short-factor" : "--longrope-long-factor";
    if (f->size() != pairs)
      LATTICE_FAIL() << flag << " has " << f->size() << " factors; the rotation has " << pairs
                     << " pairs of dims (--kv-channels x --rotary-percent / 2)";
    for (float v : *f)
      if (!(v > 0.0f && std::isfinite(v))) LATTICE_FAIL() << flag << ": factor " << v << " is not a finite number > 0";
  }
  if (longrope_original_max_position_embeddings < 1)
    LATTICE_FAIL() << "--longrope-original-max-position-embeddings must be positive, got "
                   << longrope_original_max_position_embeddings;
  if (!(longrope_attention_factor > 0.0f && std::isfinite(longrope_attention_factor)))
    LATTICE_FAIL() << "--longrope-attention-factor must be a finite number > 0, got " << longrope_attention_factor;
}

void TransformerConfig::check_gated_linear_unit() const {
  if (swiglu && quick_geglu) LATTICE_FAIL() << "--swiglu and --quick-geglu: the MLP has one gated unit; give one of them";
  if (!std::isfinite(glu_linear_offset))
    LATTICE_FAIL() << "--glu-linear-offset must be a finite number, got " << glu_linear_offset;
  if (!(activation_func_clamp_value >= 0.0f && std::isfinite(activation_func_clamp_value)))
    LATTICE_FAIL() << "--activation-func-clamp-value must be a finite number > 0, got " << activation_func_clamp_value;
  if (!gated_linear_unit() && (glu_linear_offset != 0.0f || activation_func_clamp_value > 0.0f))
    LATTICE_FAIL() << (glu_linear_offset != 0.0f ? "--glu-linear-offset" : "--activation-func-clamp-value")
                   << " needs a gated MLP (--swiglu or --quick-geglu)";
}

void TransformerConfig::check_position_embedding() const {
  if (position_embedding_type != "learned_absolute" && position_embedding_type != "rope" &&
      position_embedding_type != "none" && position_embedding_type != "yarn")
    LATTICE_FAIL() << "--position-embedding-type must be learned_absolute, rope, yarn or none, got '"
                   << position_embedding_type << "'";
  if (yarn()) check_yarn();
  if (!longrope_long_factor.empty() && !longrope())
    LATTICE_FAIL() << "--longrope-long-factor needs --longrope-short-factor";
  if (longrope()) check_longrope();
  if (use_rope_scaling && !rope())
    LATTICE_FAIL() << "--use-rope-scaling needs --position-embedding-type rope";
  if (!rope()) return;
  if (!(rotary_percent > 0.0 && rotary_percent <= 1.0))
    LATTICE_FAIL() << "--rotary-percent must be in (0, 1], got " << rotary_percent;
  const int64_t dims = multi_latent_attention ? qk_pos_emb_head_dim : int64_t(double(kv_channels) * rotary_percent);
  if (dims < 2 || dims % 2 != 0)
    LATTICE_FAIL() << "--rotary-percent " << rotary_percent << " of --kv-channels " << kv_channels << " rotates "
                   << dims << " dims per head; the rotation needs an even number, at least 2";
  if (!(rotary_base > 1.0f && std::isfinite(rotary_base)))
    LATTICE_FAIL() << "--rotary-base must be a finite number greater than 1, got " << rotary_base;
  if (rotary_seq_len_interpolation_factor < 0.0f || !std::isfinite(rotary_seq_len_interpolation_factor))
    LATTICE_FAIL() << "--rotary-seq-len-interpolation-factor must be positive, got "
                   << rotary_seq_len_interpolation_factor;
  if (!use_rope_scaling) return;
  if (!(rope_scaling_factor > 0.0f && std::isfinite(rope_scaling_factor)))
    LATTICE_FAIL() << "--rope-scaling-factor must be a finite positive number, got " << rope_scaling_factor;
  if (!(rope_scaling_low_freq_factor > 0.0f && std::isfinite(rope_scaling_high_freq_factor) &&
        rope_scaling_high_freq_factor > rope_scaling_low_freq_factor))
    LATTICE_FAIL() << "--rope-scaling-low-freq-factor " << rope_scaling_low_freq_factor
                   << " and --rope-scaling-high-freq-factor " << rope_scaling_high_freq_factor
                   << ": both positive, the high one greater";
  if (rope_scaling_original_max_position_embeddings < 1)
    LATTICE_FAIL() << "--rope-scaling-original-max-position-embeddings must be positive, got "
                   << rope_scaling_original_max_position_embeddings;
}

// Megatron's rules: full needs a method and 1 <= recompute_num_layers <= num_layers;
// selective takes neither a method nor a layer count.
void TransformerConfig::check_recompute() const {
  const std::string& g = recompute_granularity;
  const std::string& m = recompute_method;
  if (!g.empty() && g != "full" && g != "selective")
    LATTICE_FAIL() << "--recompute-granularity must be full or selective, got '" << g << "'";
  if (!m.empty() && m != "uniform" && m != "block")
    LATTICE_FAIL() << "--recompute-method must be uniform or block, got '" << m << "'";
  if (g == "full" && m.empty())
    LATTICE_FAIL() << "--recompute-granularity full needs --recompute-method uniform or block";
  if (g != "full" && !m.empty())
    LATTICE_FAIL() << "--recompute-method " << m << " needs --recompute-granularity full";
  if (g != "full" && recompute_num_layers != 0)
    LATTICE_FAIL() << "--recompute-num-layers needs --recompute-granularity full";
  if (g == "full" && (recompute_num_layers < 1 || recompute_num_layers > num_layers))
    LATTICE_FAIL() << "--recompute-num-layers must be in [1, --num-layers " << num_layers << "] with --recompute-method "
                   << m << ", got " << recompute_num_layers;
  if (!recompute_modules.empty() && g != "selective")
    LATTICE_FAIL() << "--recompute-modules needs --recompute-granularity selective";
  for (const std::string& module : recompute_modules)
    if (module != "core_attn" && module != "moe" && module != "mlp" && module != "layernorm" && module != "moe_act" &&
        module != "shared_experts" && module != "mla_up_proj")
      LATTICE_FAIL() << "--recompute-modules " << module
                     << " is not implemented (core_attn, moe, mlp, layernorm, moe_act, shared_experts and mla_up_proj are)";
  if (recompute_mla_up_proj() && !multi_latent_attention)
    LATTICE_FAIL() << "--recompute-modules mla_up_proj needs --multi-latent-attention";
  if (recompute_mla_up_proj() && q_lora_rank == 0)
    LATTICE_FAIL() << "--recompute-modules mla_up_proj needs --q-lora-rank > 0 (linear_q_proj reads the layer's input, "
                      "not a kept latent)";
  if (recompute_moe_act() && !moe()) LATTICE_FAIL() << "--recompute-modules moe_act needs --num-experts";
  if (recompute_shared_experts() && (!moe() || moe_shared_expert_intermediate_size <= 0))
    LATTICE_FAIL() << "--recompute-modules shared_experts needs --moe-shared-expert-intermediate-size";
  if (recompute_moe() && g == "full")
    LATTICE_FAIL() << "--moe-layer-recompute does not go with --recompute-granularity full (which recomputes them)";
  if (recompute_moe() && !moe())
    LATTICE_FAIL() << (moe_layer_recompute ? "--moe-layer-recompute" : "--recompute-modules moe") << " needs --num-experts";
}

bool TransformerConfig::recompute_core_attention() const {
  return recompute_granularity == "selective" &&
         (recompute_modules.empty() ||
          std::find(recompute_modules.begin(), recompute_modules.end(), "core_attn") != recompute_modules.end());
}

bool TransformerConfig::recompute_mlp() const {
  return recompute_granularity == "selective" &&
         std::find(recompute_modules.begin(), recompute_modules.end(), "mlp") != recompute_modules.end();
}

bool TransformerConfig::recompute_mla_up_proj() const {
  return recompute_granularity == "selective" &&
         std::find(recompute_modules.begin(), recompute_modules.end(), "mla_up_proj") != recompute_modules.end();
}

bool TransformerConfig::recompute_layernorm() const {
  return recompute_granularity == "selective" &&
         std::find(recompute_modules.begin(), recompute_modules.end(), "layernorm") != recompute_modules.end();
}

bool TransformerConfig::recompute_moe_act() const {
  return recompute_granularity == "selective" &&
         std::find(recompute_modules.begin(), recompute_modules.end(), "moe_act") != recompute_modules.end();
}

bool TransformerConfig::recompute_shared_experts() const {
  return recompute_granularity == "selective" &&
         std::find(recompute_modules.begin(), recompute_modules.end(), "shared_experts") != recompute_modules.end();
}

bool TransformerConfig::recompute_moe() const {
  return moe_layer_recompute || (recompute_granularity == "selective" &&
                                 std::find(recompute_modules.begin(), recompute_modules.end(), "moe") !=
                                     recompute_modules.end());
}

namespace {

// A recursive-descent reader of --moe-layer-freq's list expressions:
//   expr := term ('+' term)*    term := atom ('*' integer)*    atom := '[' [integer (',' integer)*] ']' | '(' expr ')'
class LayerFreqParser {
 public:
  LayerFreqParser(const std::string& s, const char* flag) : s_(s), flag_(flag) {}
  std::vector<int> parse() {
    std::vector<int> v = expr();
    skip();
    if (i_ != s_.size()) fail("unexpected '" + s_.substr(i_, 1) + "'");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    LATTICE_FAIL() << flag_ << " '" << s_ << "': " << why << " at character " << i_ + 1
                   << " (an integer, or a list expression such as [1,0,1] or ([0]*1+[1]*23))";
  }
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  int64_t integer() {
    skip();
    const size_t start = i_;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (i_ == start || i_ - start > 9) fail("expected a non-negative integer");
    return std::stoll(s_.substr(start, i_ - start));
  }
  std::vector<int> expr() {
    std::vector<int> v = term();
    while (eat('+')) {
      const std::vector<int> w = term();
      v.insert(v.end(), w.begin(), w.end());
    }
    return v;
  }
  std::vector<int> term() {
    std::vector<int> v = atom();
    while (eat('*')) {
      const int64_t n = integer();
      if (n * int64_t(v.size()) > 1000000) fail("a list longer than 1000000 layers");
      std::vector<int> r;
      for (int64_t j = 0; j < n; ++j) r.insert(r.end(), v.begin(), v.end());
      v = std::move(r);
    }
    return v;
  }
  std::vector<int> atom() {
    if (eat('(')) {
      std::vector<int> v = expr();
      if (!eat(')')) fail("expected ')'");
      return v;
    }
    if (!eat('[')) fail("expected '[' or '('");
    std::vector<int> v;
    if (eat(']')) return v;
    do {
      const int64_t x = integer();
      if (x > 1) fail("an entry other than 0 or 1");
      v.push_back(int(x));
    } while (eat(','));
    if (!eat(']')) fail("expected ']'");
    return v;
  }

  const std::string& s_;
  const char* flag_;
  size_t i_ = 0;
};

// A per-layer 0/1 pattern: an integer N (layer l is 1 when at(l, N)) or a list expression.
// `empty_when`: the value every entry must have for the pattern to come back empty (every layer alike).
template <typename At>
std::vector<int> parse_layer_pattern(const std::string& value, int64_t num_layers, const char* flag, At at,
                                     int empty_when = 1) {
  std::string s = value;
  while (s.size() >= 2 && (s.front() == '\'' || s.front() == '"') && s.back() == s.front()) s = s.substr(1, s.size() - 2);
  std::vector<int> pattern;
  const bool integer = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  if (integer) {
    if (s.size() > 9 || std::stoll(s) < 1) LATTICE_FAIL() << flag << " must be a positive integer or a list, got '" << value << "'";
    const int64_t n = std::stoll(s);
    for (int64_t l = 0; l < num_layers; ++l) pattern.push_back(at(l, n) ? 1 : 0);
  } else {
    pattern = LayerFreqParser(s, flag).parse();
    if (int64_t(pattern.size()) != num_layers)
      LATTICE_FAIL() << flag << " '" << value << "' has " << pattern.size() << " entries for --num-layers "
                     << num_layers;
  }
  if (std::all_of(pattern.begin(), pattern.end(), [&](int v) { return v == empty_when; })) pattern.clear();
  return pattern;
}

}  // namespace

std::vector<int> TransformerConfig::parse_moe_layer_freq(const std::string& value, int64_t num_layers) {
  return parse_layer_pattern(value, num_layers, "--moe-layer-freq", [](int64_t l, int64_t n) { return l % n == 0; });
}

std::vector<int> TransformerConfig::parse_window_attn_skip_freq(const std::string& value, int64_t num_layers) {
  return parse_layer_pattern(value, num_layers, "--window-attn-skip-freq",
                             [](int64_t l, int64_t n) { return (l + 1) % n != 0; });
}

std::vector<int> TransformerConfig::parse_linear_attention_freq(const std::string& value, int64_t num_layers) {
  return parse_layer_pattern(
      value, num_layers, "--linear-attention-freq", [](int64_t l, int64_t n) { return (l + 1) % n != 0; }, 2);
}

std::vector<int> TransformerConfig::parse_no_rope_freq(const std::string& value, int64_t num_layers) {
  std::string s = value;
  while (s.size() >= 2 && (s.front() == '\'' || s.front() == '"') && s.back() == s.front()) s = s.substr(1, s.size() - 2);
  if (!s.empty() && s.size() <= 9 &&
      std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) &&
      std::stoll(s) > 0 && num_layers % std::stoll(s) != 0)
    LATTICE_FAIL() << "--no-rope-freq " << s << " does not divide --num-layers " << num_layers
                   << " (the integer form repeats [0] * (N - 1) + [1] over the layers; give a list for another "
                      "pattern)";
  return parse_layer_pattern(
      value, num_layers, "--no-rope-freq", [](int64_t l, int64_t n) { return (l + 1) % n == 0; }, 0);
}

int64_t TransformerConfig::parse_window_size(const std::string& value) {
  std::string s;
  for (char c : value)
    if (!std::isspace(static_cast<unsigned char>(c)) && c != '(' && c != ')' && c != '\'' && c != '"') s += c;
  const auto bad = [&]() -> int64_t {
    LATTICE_FAIL() << "--window-size '" << value
                   << "': expected W or W,0 (W >= -1 keys before each query, -1 unlimited; a causal GPT sees none after it)";
  };
  const size_t comma = s.find(',');
  const std::string left = s.substr(0, comma), right = comma == std::string::npos ? "0" : s.substr(comma + 1);
  const auto number = [&](const std::string& t) -> int64_t {
    const bool negative = !t.empty() && t[0] == '-';
    const std::string digits = negative ? t.substr(1) : t;
    if (digits.empty() || digits.size() > 12 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      return bad();
    return negative ? -std::stoll(digits) : std::stoll(digits);
  };
  const int64_t w = number(left), r = number(right);
  if (w < -1) return bad();
  if (r != 0)
    LATTICE_FAIL() << "--window-size '" << value << "': a right window of " << r
                   << " keys after the query; lattice's GPT is causal (use W,0)";
  return w;
}

}  // namespace lattice
