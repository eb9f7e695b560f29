// TransformerConfig: the model's shape and numerics, with Megatron-Core's field names.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/activation.h"
#include "model/hybrid_layer_allocation.h"

namespace lattice {

struct TransformerConfig {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t ffn_hidden_size = 0;        // 0 -> 4 * hidden_size (with swiglu: int(8 hidden / 3 / 64) * 64)
  int64_t kv_channels = 0;            // head dim; 0 -> hidden_size / num_attention_heads
  // The attention's width: q, k and v each [heads x kv_channels] (Megatron's
  // query_projection_size); the hidden size unless --kv-channels says otherwise.
  int64_t attention_width() const { return kv_channels * num_attention_heads; }
  // Grouped-query attention (--group-query-attention --num-query-groups): the heads share
  // num_query_groups keys and values, heads / groups query heads per group (kernels/qkv_layout.h);
  // 0 -> num_attention_heads, every head its own key and value.
  int64_t num_query_groups = 0;
  bool grouped_query_attention() const { return num_query_groups != num_attention_heads; }
  // --attention-output-gate (Megatron's attention_output_gate; Qwen3-Next's gated attention): the QKV
  // layer makes a gate vector per query head beside the queries, and each head's attention output is
  // scaled by sigmoid of it before linear_proj (kernels/attention_gate.h, kernels/qkv_layout.h).
  bool attention_output_gate = false;
  // The QKV layer's output: q for every head, k and v for every group (Megatron's
  // query_projection_size + 2 kv_projection_size; 3 attention_width() without grouping), and with
  // the output gate one more attention_width() of gates.
  int64_t qkv_width() const {
    return kv_channels * ((attention_output_gate ? 2 : 1) * num_attention_heads + 2 * num_query_groups);
  }
  // linear_qkv's rows per query group, kind by kind (kernels/qkv_layout.h): its R = heads / groups queries'
  // R kv_channels, with the output gate the gates' R kv_channels, then the key's and the value's
  // kv_channels each (Megatron's qkv_split_shapes, which --muon-split-qkv splits by); empty with
  // multi-latent attention (no linear_qkv). Finalized configs only.
  std::vector<int64_t> qkv_group_rows() const {
    if (multi_latent_attention) return {};
    const int64_t q = num_attention_heads / num_query_groups * kv_channels;
    if (attention_output_gate) return {q, q, kv_channels, kv_channels};
    return {q, kv_channels, kv_channels};
  }
  // Sliding-window attention (Megatron's --window-size W,0 and --window-attn-skip-freq): a
  // window layer's query at position p attends keys p - W .. p only (Megatron-Core's
  // window_size (W, 0), as TransformerEngine and FlashAttention count it: W + 1 keys). -1: none,
  // every layer attends every earlier key. window_attn_pattern: which layers have the window (1)
  // and which attend fully (0), one entry per layer; empty: every layer.
  int64_t window_size = -1;
  std::vector<int> window_attn_pattern;
  // --softmax-type (Megatron-Core's softmax_type): vanilla; off-by-one, every head's softmax with one
  // more logit of 0 and no value (its probabilities sum to less than 1); learnable, that logit a
  // parameter per head (self_attention.core_attention.softmax_offset [heads], GPT-OSS's sinks).
  std::string softmax_type = "vanilla";
  bool softmax_sink() const { return softmax_type != "vanilla"; }
  bool learnable_softmax_offset() const { return softmax_type == "learnable"; }
  // --no-rope-freq (Megatron's no_rope_freq; Llama 4's and SmolLM3's NoPE layers): with the rotary
  // embedding, which layers do not rotate their queries and keys (1) and which do (0), one entry per
  // layer; empty: every layer rotates.
  std::vector<int> no_rope_pattern;
  // Whether layer `layer` (0-based) rotates its queries and keys.
  bool rotary_layer(int64_t layer) const {
    return rope() && (no_rope_pattern.empty() || no_rope_pattern[size_t(layer)] == 0);
  }
  // --experimental-attention-variant gated_delta_net (Megatron-Core's; the hybrid of Qwen3-Next and
  // Qwen3.5): the layers marked 1 in linear_attention_pattern (--linear-attention-freq, one entry per
  // layer) are Gated DeltaNet layers (kernels/gated_delta_net.h, model/gated_delta_net.cpp) in place of
  // the self-attention, the others attention layers. Its shape: --linear-num-key-heads Hk and
  // --linear-num-value-heads Hv heads of --linear-key-head-dim Dk and --linear-value-head-dim Dv, and the
  // convolution's --linear-conv-kernel-dim (Megatron's defaults).
  std::string experimental_attention_variant;  // "" or gated_delta_net
  std::vector<int> linear_attention_pattern;
  int64_t linear_conv_kernel_dim = 4, linear_key_head_dim = 128, linear_value_head_dim = 128;
  int64_t linear_num_key_heads = 16, linear_num_value_heads = 32;
  bool gated_delta_net() const { return experimental_attention_variant == "gated_delta_net"; }
  bool linear_attention_layer(int64_t layer) const {
    return gated_delta_net() && !linear_attention_pattern.empty() &&
           linear_attention_pattern[size_t(std::min<int64_t>(layer, num_layers - 1))] != 0;
  }
  // --hybrid-override-pattern (Megatron-Core's MambaModel, Nemotron-H's hybrid): one character per layer,
  // M a Mamba-2 layer (its norm and MambaMixer, kernels/mamba.h, model/mamba_mixer.cpp), * a self-attention
  // layer (input_layernorm and self_attention, no MLP), - an MLP layer (pre_mlp_layernorm and mlp, no
  // attention), E an MoE layer (pre_mlp_layernorm and the MoE mlp); empty: every layer attention and MLP.
  // The Mamba mixer's shape: --mamba-num-heads H of --mamba-head-dim P (H = 2 hidden / P when 0: Megatron's
  // expand 2), --mamba-num-groups G of B and C, each --mamba-state-dim N wide; a width-4 convolution.
  std::string hybrid_layer_pattern;
  // A hybrid's multi-token prediction depths (--mtp-num-layers; Megatron's unified pattern "main/mtp/mtp...",
  // the part after each '/'): each depth's layers, a mixer (M or *) and/or an MLP (- or E) in that order, e.g.
  // Nemotron-3's "*E". lattice runs them as the depth's one layer (MTP layers are numbered from num_layers).
  std::string mtp_hybrid_pattern;
  int64_t mamba_state_dim = 128, mamba_head_dim = 64, mamba_num_groups = 8, mamba_num_heads = 0;
  static constexpr int64_t kMambaConvKernel = 4;
  bool hybrid() const { return !hybrid_layer_pattern.empty(); }
  // --hybrid-override-pattern as given: the decoder's layers, then "/" and the MTP layers once per depth.
  std::string hybrid_override_pattern() const {
    return HybridPattern{hybrid_layer_pattern, mtp_hybrid_pattern, mtp_hybrid_pattern.empty() ? 0 : mtp_num_layers}
        .unified();
  }
  char hybrid_layer(int64_t layer) const {
    return hybrid() ? hybrid_layer_pattern[size_t(std::min<int64_t>(layer, num_layers - 1))] : 0;
  }
  // Whether a hybrid's layer `layer` has the block kind `kind` (M, *, - or E): its pattern character, or for an
  // MTP layer one of the MTP pattern's.
  bool hybrid_has(int64_t layer, char kind) const {
    if (!hybrid()) return false;
    if (layer >= num_layers) return mtp_hybrid_pattern.find(kind) != std::string::npos;
    return hybrid_layer(layer) == kind;
  }
  bool mamba_layer(int64_t layer) const { return hybrid_has(layer, 'M'); }
  // Any Mamba layer, the MTP depths' included.
  bool has_mamba_layers() const {
    return hybrid_layer_pattern.find('M') != std::string::npos || mtp_hybrid_pattern.find('M') != std::string::npos;
  }
  // Whether layer `layer` has the attention block (its mixer: attention, GDN or Mamba) and the MLP block.
  bool attention_block(int64_t layer) const { return !hybrid() || mamba_layer(layer) || hybrid_has(layer, '*'); }
  bool mlp_block(int64_t layer) const { return !hybrid() || hybrid_has(layer, '-') || hybrid_has(layer, 'E'); }
  int64_t mamba_heads() const { return mamba_num_heads > 0 ? mamba_num_heads : 2 * hidden_size / mamba_head_dim; }
  int64_t mamba_inner() const { return mamba_heads() * mamba_head_dim; }  // d_inner
  int64_t mamba_conv_width() const { return mamba_inner() + 2 * mamba_num_groups * mamba_state_dim; }
  int64_t mamba_in_proj_width() const { return mamba_inner() + mamba_conv_width() + mamba_heads(); }
  // A GDN layer's widths: in_proj's output (q and k Hk Dk each, v and the output gate z Hv Dv each, then
  // beta's and the decay's Hv) and out_proj's input (Hv Dv).
  int64_t gdn_in_proj_width() const {
    return 2 * linear_num_key_heads * linear_key_head_dim + 2 * linear_num_value_heads * linear_value_head_dim +
           2 * linear_num_value_heads;
  }
  int64_t gdn_conv_width() const {
    return 2 * linear_num_key_heads * linear_key_head_dim + linear_num_value_heads * linear_value_head_dim;
  }
  int64_t gdn_out_width() const { return linear_num_value_heads * linear_value_head_dim; }
  // Layer `layer`'s input projection's output (linear_qkv's or in_proj's) and linear_proj's or out_proj's
  // input, and their largest over the layers (the buffers' sizes).
  int64_t layer_qkv_width(int64_t layer) const {
    if (!attention_block(layer)) return 0;
    if (mamba_layer(layer)) return mamba_in_proj_width();
    return linear_attention_layer(layer) ? gdn_in_proj_width() : qkv_width();
  }
  int64_t layer_proj_width(int64_t layer) const {
    if (!attention_block(layer)) return 0;
    if (mamba_layer(layer)) return mamba_inner();
    return linear_attention_layer(layer) ? gdn_out_width() : attention_output_width();
  }
  int64_t max_qkv_width() const {
    int64_t w = 0;
    for (int64_t l = 0; l < num_layers + mtp_num_layers; ++l) w = std::max(w, layer_qkv_width(l));
    return w;
  }
  int64_t max_proj_width() const {
    int64_t w = 0;
    for (int64_t l = 0; l < num_layers + mtp_num_layers; ++l) w = std::max(w, layer_proj_width(l));
    return w;
  }
  // The window of layer `layer` (0-based): window_size, or -1 for a full-attention layer.
  int64_t attention_window(int64_t layer) const {
    if (window_size < 0) return -1;
    return window_attn_pattern.empty() || window_attn_pattern[size_t(layer)] != 0 ? window_size : -1;
  }
  int64_t vocab_size = 0;             // real (unpadded) vocabulary
  int64_t padded_vocab_size = 0;      // 0 -> padded by make_vocab_size_divisible_by
  int64_t make_vocab_size_divisible_by = 128;
  int64_t max_position_embeddings = 0;
  float hidden_dropout = 0.1f;
  float attention_dropout = 0.1f;
  float layernorm_epsilon = 1e-5f;
  // --apply-layernorm-1p (Megatron's layernorm_zero_centered_gamma): every norm (input, pre-MLP,
  // final, the query and key norms; LayerNorm or RMSNorm) scales by 1 + weight, its weight
  // initialized to 0 and saved so.
  bool apply_layernorm_1p = false;
  float init_method_std = 0.02f;
  bool init_method_xavier_uniform = false;  // --init-method-xavier-uniform: U(-a, a) weights (optim/param_buffer.h)
  // --embedding-init-method-std (Megatron's embedding_init_method): the word and position embeddings
  // N(0, s^2), Xavier or not; < 0 (not given): initialized as every weight.
  float embedding_init_method_std = -1.0f;
  GeluKind gelu = GeluKind::erf;      // --openai-gelu -> tanh, --squared-relu -> relu(x)^2
  // --swiglu: the MLP's activation is silu(gate) * up (Megatron's gated_linear_unit with
  // silu) instead of GELU; fc1 makes both, so it is [2 ffn, hidden] (kernels/swiglu.h).
  bool swiglu = false;
  // --quick-geglu (Megatron's quick_geglu): the gated linear unit with quick GELU x sigmoid(1.702 x)
  // in SiLU's place (GPT-OSS's MLP); fc1 [2 ffn, hidden] as SwiGLU's.
  bool quick_geglu = false;
  // Either gated unit's options: --glu-linear-offset b adds b to the up projection (GPT-OSS's 1);
  // --activation-func-clamp-value c (0: none) clamps the gate to at most c and the up projection to
  // [-c, c] before the unit (GPT-OSS's 7).
  float glu_linear_offset = 0.0f;
  float activation_func_clamp_value = 0.0f;
  bool gated_linear_unit() const { return swiglu || quick_geglu; }
  GluForm glu_form() const {
    return GluForm{quick_geglu ? kQuickGeluAlpha : 1.0f, glu_linear_offset, activation_func_clamp_value};
  }
  // fc1's output width: ffn_hidden_size, or both projections of a gated unit.
  int64_t fc1_width() const { return gated_linear_unit() ? 2 * ffn_hidden_size : ffn_hidden_size; }
  // Positions: a learned table added to the embedding (learned_absolute), the rotary embedding of q
  // and k in every layer (rope; model/rotary_embedding.h, kernels/rope.h), or none (NoPE: the causal
  // mask is the only order the model sees).
  std::string position_embedding_type = "learned_absolute";
  double rotary_percent = 1.0;        // share of each head's dims rotated (double: Megatron's int(D * percent))
  float rotary_base = 10000.0f;
  bool rotary_interleaved = false;    // pairs (2d, 2d+1) instead of (d, d + R/2)
  float rotary_seq_len_interpolation_factor = 0.0f;  // 0: none (positions divided by it)
  // Llama 3.1's frequency-dependent scaling of the rotary frequencies (Megatron's --use-rope-scaling
  // --rope-scaling-factor; model/rotary_embedding.h). Megatron fixes the other three at Llama 3.1's
  // values; lattice takes them as flags too, for HuggingFace models with others.
  bool use_rope_scaling = false;
  float rope_scaling_factor = 8.0f;
  float rope_scaling_low_freq_factor = 1.0f, rope_scaling_high_freq_factor = 4.0f;
  int64_t rope_scaling_original_max_position_embeddings = 8192;
  // --position-embedding-type yarn (Megatron-Core's GPT position_embedding_type yarn and its yarn_*
  // fields, HuggingFace's rope_scaling "yarn"; GPT-OSS's, long-context Qwen's): the rotary embedding
  // with YaRN's frequencies, each pair's between the original (extrapolated) and the factor-divided
  // (interpolated) one by a ramp over the dims from beta_fast to beta_slow rotations in the original
  // context, and cos and sin times the attention factor (model/rotary_embedding.h).
  float yarn_rotary_scaling_factor = 1.0f;
  int64_t yarn_original_max_position_embeddings = 4096;
  float yarn_beta_fast = 32.0f, yarn_beta_slow = 1.0f;
  float yarn_mscale = 1.0f, yarn_mscale_all_dim = 0.0f;
  bool yarn_correction_range_round_to_int = true;
  bool yarn() const { return position_embedding_type == "yarn"; }
  // LongRoPE (HuggingFace's rope_scaling "longrope": Phi-3's 128k models, Phi-3.5, Phi-4-mini; lattice's
  // --longrope-* flags, Megatron has none): each rotated pair d's frequency divided by short_factor[d] in a
  // sequence of at most original_max_position_embeddings positions, by long_factor[d] in a longer one, and
  // cos and sin times attention_factor (model/rotary_embedding.h). Empty factors: none.
  std::vector<float> longrope_short_factor, longrope_long_factor;
  int64_t longrope_original_max_position_embeddings = 4096;
  float longrope_attention_factor = 1.0f;
  bool longrope() const { return !longrope_short_factor.empty(); }
  // Whether a sequence of `length` positions rotates by the long factors.
  bool longrope_long(int64_t length) const { return longrope() && length > longrope_original_max_position_embeddings; }
  // The rotary embedding, plain or with YaRN's frequencies.
  bool rope() const { return position_embedding_type == "rope" || yarn(); }
  bool learned_positions() const { return position_embedding_type == "learned_absolute"; }
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;        // --disable-bias-linear: no biases in QKV, proj, fc1, fc2
  bool add_qkv_bias = false;          // --add-qkv-bias: QKV's bias even without the others (Qwen2)
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  std::string normalization = "LayerNorm";  // or RMSNorm (weight only), Megatron's --normalization
  bool rmsnorm() const { return normalization == "RMSNorm"; }
  // --qk-layernorm: each query and key head normalized over its kv_channels values before the
  // rotary embedding (q_layernorm, k_layernorm: the normalization above; model/qk_layernorm.h).
  bool qk_layernorm = false;
  // --qk-l2-norm: each query and key head times 1 / sqrt(mean(x^2) + layernorm_epsilon), with no
  // weights, before the rotary embedding (Megatron-Core's L2Norm as q_layernorm and k_layernorm,
  // Llama 4's; the kernels of --qk-layernorm with RMSNorm, unit weights and no gradient for them).
  bool qk_l2_norm = false;
  // With --multi-latent-attention --qk-layernorm normalizes the latents instead (mla_latent_norms()).
  bool qk_norm() const { return (qk_layernorm && !multi_latent_attention) || qk_l2_norm; }  // qkv's q and k normalized
  // --multi-latent-attention (Megatron-Core's MLA, DeepSeek-V2/V3's attention; model/multi_latent_attention.h):
  // per layer the queries come from linear_q_proj [H Dq, C] (--q-lora-rank 0) or through a latent,
  // linear_q_up_proj [H Dq, Rq] . q_layernorm . linear_q_down_proj [Rq, C]; the keys' and values'
  // latent and one shared rotary key from linear_kv_down_proj [Rkv + Dr, C], then per head
  // k_nope and v from linear_kv_up_proj [H (Dn + Dv), Rkv] . kv_layernorm. Each head's query and key:
  // Dn unrotated dims and Dr rotated ones (Dq = Dn + Dr), its value Dv dims; linear_proj [C, H Dv].
  // The latent norms (the model's normalization) exist with --qk-layernorm. The rotary embedding
  // (rope or yarn) turns the Dr dims by pairs (2d, 2d + 1), as Megatron's MLA does; the softmax
  // scale is m^2 / sqrt(Dq) (m = yarn's mscale with --yarn-mscale-all-dim, else 1). finalize() sets
  // kv_channels to the attention's head dim max(Dq, Dv) (the shorter part zero-padded) and
  // num_query_groups to the heads.
  bool multi_latent_attention = false;
  int64_t q_lora_rank = 0;             // Rq (--q-lora-rank; 0: Megatron's None, no query latent)
  int64_t kv_lora_rank = 32;           // Rkv (--kv-lora-rank)
  int64_t qk_head_dim = 128;           // Dn (--qk-head-dim)
  int64_t qk_pos_emb_head_dim = 64;    // Dr (--qk-pos-emb-head-dim)
  int64_t v_head_dim = 128;            // Dv (--v-head-dim)
  // The latent norms' epsilon (--mla-latent-norm-epsilon; 0: --norm-epsilon, as Megatron's). HuggingFace's
  // DeepSeek-V3 attention normalizes its latents with 1e-6 whatever rms_norm_eps the other norms take
  // (GLM-4.7-Flash's 1e-5).
  float mla_latent_norm_epsilon = 0.0f;
  float mla_latent_eps() const { return mla_latent_norm_epsilon > 0.0f ? mla_latent_norm_epsilon : layernorm_epsilon; }
  bool mla_latent_norms() const { return multi_latent_attention && qk_layernorm; }
  int64_t mla_qk_dim() const { return qk_head_dim + qk_pos_emb_head_dim; }  // Dq
  // The core attention's output per token, linear_proj's input: heads x kv_channels, or H Dv with MLA.
  int64_t attention_output_width() const {
    return multi_latent_attention ? num_attention_heads * v_head_dim : attention_width();
  }
  // The multi-latent attention fields' part of finalize() (before the head dim is derived).
  void check_mla();
  // Mixture of experts (--num-experts E; 0: the dense MLP): every layer's MLP is E experts, each
  // token sent to its moe_router_topk best (model/moe_layer.h), experts of moe_ffn_hidden_size
  // (0 -> ffn_hidden_size); moe_aux_loss_coeff weighs the load-balancing loss's gradient (aux_loss's).
  int64_t num_experts = 0;
  int64_t moe_router_topk = 2;
  int64_t moe_ffn_hidden_size = 0;
  float moe_aux_loss_coeff = 0.0f;
  // --expert-tensor-parallel-size (Megatron's; 0: the tensor-parallel size): 1 keeps every expert whole
  // on its rank under tensor parallelism. The tensor-parallel ranks then route their own
  // sequence-parallel rows and join the expert-parallel group instead of splitting each expert
  // (model/moe_layer.h, dist/parallel_state.h); the other values are the tensor-parallel size's.
  int64_t expert_tensor_parallel_size = 0;
  // The experts' tensor-parallel size under tp tensor-parallel ranks, and whether the experts are then
  // whole while the rest is split (the layout GPTModel, the memory estimate and the groups follow).
  int64_t expert_tp(int64_t tp) const { return expert_tensor_parallel_size == 1 ? 1 : tp; }
  bool experts_whole(int64_t tp) const { return moe() && tp > 1 && expert_tp(tp) == 1; }
  // --moe-z-loss-coeff z (0: none; ST-MoE's router z-loss, Megatron's z_loss_func): z mean_t
  // logsumexp(logits_t)^2 over a micro-batch's tokens, its gradient added to the router's.
  float moe_z_loss_coeff = 0.0f;
  // --moe-input-jitter-eps eps (0: none; Megatron's, Switch Transformer's): in training forwards the
  // router reads its input times noise uniform in [1 - eps, 1 + eps) per element (MoeShape::input_jitter_eps).
  float moe_input_jitter_eps = 0.0f;
  // --moe-router-force-load-balancing (Megatron's, for benchmarks): training and evaluation forwards route
  // by random logits (MoeShape::force_balance), the experts evenly loaded whatever the router learns.
  bool moe_router_force_load_balancing = false;
  // --mtp-num-layers K (0: none; Megatron-Core's multi-token prediction, DeepSeek-V3's): after the
  // final LayerNorm, K depths each predict one token further: depth k (from 1) embeds the inputs
  // shifted k to the left, joins its enorm to the hnorm of the previous depth's output (the final
  // LayerNorm's for depth 1) through eh_proj [C, 2C], runs one transformer layer (of the last decoder
  // layer's kind, dense or MoE: moe_layer(num_layers + k - 1); a hybrid's of its MTP pattern's blocks) and its own
  // final_layernorm, and scores the targets shifted k with the shared output layer. Training adds
  // mtp_loss_scaling_factor / K times the sum of the depths' mean losses; the reported loss, the
  // evaluation and generation are the main model's alone.
  int64_t mtp_num_layers = 0;
  float mtp_loss_scaling_factor = 0.1f;  // --mtp-loss-scaling-factor
  // --mtp-use-repeated-layer (Megatron's; Nemotron-3-Super's): one depth's parameters (mtp.layers.0.*) serve
  // every depth, their gradient the sum of the depths'.
  bool mtp_use_repeated_layer = false;
  bool mtp() const { return mtp_num_layers > 0; }
  // The router's gates (Megatron's topk_softmax_with_capacity): by default softmax over the k
  // largest logits; --moe-router-pre-softmax: softmax over all E, then the k largest of those
  // probabilities, not renormalized (HuggingFace's norm_topk_prob false); either way times
  // --moe-router-topk-scaling-factor (1: none).
  bool moe_router_pre_softmax = false;
  float moe_router_topk_scaling_factor = 1.0f;
  // --moe-apply-probs-on-input (Megatron's, top-1 only): each token's gate multiplies its row
  // before the expert instead of the expert's output after it (Llama 4's MoE).
  bool moe_apply_probs_on_input = false;
  // --moe-router-dtype fp32: the router's GEMM (and the shared experts' gate's) in fp32 under
  // --bf16 / --fp16 (default "": the model's format, as Megatron's; never fp8).
  std::string moe_router_dtype;
  // --moe-router-score-function sigmoid: scores sigmoid(logits), the top k of them (plus the
  // expert bias when on) chosen, their scores normalized to sum 1 (k > 1) as the gates; the
  // load-balancing loss over the scores normalized over all E (Megatron's, DeepSeek-V3's).
  // --moe-router-enable-expert-bias: a per-expert bias (mlp.router.expert_bias, not trained by the
  // optimizer) added to the scores for the choice only, moved after every iteration by
  // --moe-router-bias-update-rate towards even loads (the aux-loss-free balancing).
  // --moe-router-load-balancing-type seq_aux_loss: the load-balancing loss of each sequence,
  // averaged over the micro-batch's (DeepSeek-V2's), weighted by moe_seq_aux_loss_coeff.
  // global_aux_loss: the loss with the expert counts of the step's micro-batches so far over every
  // data- and context-parallel rank (Megatron's global-batch balancing; model/moe_layer.h), weighted by
  // moe_global_aux_loss_coeff. A list of types weighs each by its own coefficient; a type's losses
  // are computed and logged whenever it is listed.
  bool moe_seq_aux_loss = false;
  float moe_seq_aux_loss_coeff = 0.0f;
  bool moe_global_aux_loss = false;
  float moe_global_aux_loss_coeff = 0.0f;
  // --moe-router-load-balancing-type sinkhorn (Megatron's sinkhorn_load_balancing, BASE layers'
  // balanced assignment): a training forward chooses each token's k experts by the top k of the
  // micro-batch's logits normalized by Sinkhorn's iteration (rows and columns scaled in turn until
  // the column scales settle: each expert's total share near even); evaluation and generation by the
  // top k of the gates. The gates are sigmoid(logit) with k = 1, else the softmax over all E at the
  // chosen experts, not renormalized (finalize() sets the score function or pre-softmax so). No
  // load-balancing loss (--moe-aux-loss-coeff 0), capacity, expert bias or groups.
  bool moe_sinkhorn = false;
  // Group-limited routing (--moe-router-num-groups G --moe-router-group-topk g; 0: none): the
  // experts are G equal groups, each token's k experts come from its g best groups (a group's
  // score: the sum of its k / g largest routing scores; DeepSeek-V3's device- or node-limited routing).
  int64_t moe_router_num_groups = 0;
  int64_t moe_router_group_topk = 0;
  // --moe-expert-capacity-factor f (0: none, dropless): each expert takes at most
  // ceil(N k / E f) of a micro-batch's N tokens in training forwards, the others dropped (their
  // slot left out of the token's sum), by --moe-token-drop-policy: probs (keep the largest gates)
  // or position (keep the first tokens). Evaluation drops alike (Megatron's does); generation is dropless.
  double moe_expert_capacity_factor = 0.0;
  std::string moe_token_drop_policy = "probs";
  std::string moe_router_score_function = "softmax";
  bool moe_router_sigmoid() const { return moe_router_score_function == "sigmoid"; }
  bool moe_router_enable_expert_bias = false;
  float moe_router_bias_update_rate = 1e-3f;
  // Shared experts (--moe-shared-expert-intermediate-size S; 0: none): an MLP of width S every
  // token goes through, added to the routed experts' output (Megatron-Core's SharedExpertMLP);
  // --moe-shared-expert-gate scales it by sigmoid(x . g) per token (Qwen2-MoE).
  int64_t moe_shared_expert_intermediate_size = 0;
  bool moe_shared_expert_gate = false;
  // --moe-latent-size L (0: none; Megatron-Core's latent MoE, Nemotron-3-Super's): the routed experts run in
  // an L-wide latent space, between mlp.fc1_latent_proj [L, C] (applied to the layer's input after the router
  // has read it) and mlp.fc2_latent_proj [C, L] (applied to the experts' weighted sum); the router and the
  // shared experts read the full hidden rows.
  int64_t moe_latent_size = 0;
  // The routed experts' input and output width: the latent size, or the hidden size.
  int64_t moe_expert_width() const { return moe_latent_size > 0 ? moe_latent_size : hidden_size; }
  // --moe-layer-freq: which layers are MoE layers (1) and which have the dense MLP (0), one
  // entry per layer; empty: every layer (parse_moe_layer_freq reads Megatron's forms).
  std::vector<int> moe_layer_pattern;
  bool moe() const { return num_experts > 0; }
  // A prediction depth's layer (--mtp-num-layers, numbered from num_layers) is of the last decoder
  // layer's kind, as Megatron-Core's MTP block takes the decoder's last layer spec; a hybrid's has its MTP
  // pattern's blocks.
  bool moe_layer(int64_t layer) const {
    if (hybrid() && layer >= num_layers) return moe() && hybrid_has(layer, 'E');  // a hybrid's MTP layer
    if (!moe() || moe_layer_pattern.empty()) return moe();
    return moe_layer_pattern[size_t(std::min<int64_t>(layer, int64_t(moe_layer_pattern.size()) - 1))] != 0;
  }
  // The MoE part of finalize().
  void check_moe();
  // Activation recomputation (docs/memory.md). It changes memory and time, never the
  // math, so checkpoints do not record it.
  //   full + uniform: each chunk's layers in groups of recompute_num_layers; only a
  //                   group's input is kept, its forward reruns in backward
  //   full + block:   the first recompute_num_layers layers of each chunk recomputed
  //   selective:      the modules of recompute_modules (Megatron's --recompute-modules; empty:
  //                   core_attn): core_attn, the core attention's output and statistics;
  //                   moe, every MoE layer's routing, dispatch and experts from its kept input
  //                   (one shared copy of their buffers), before its backward; mlp, every
  //                   dense MLP's fc1 output and activation from its kept input (LN2's output);
  //                   layernorm, the outputs of every layer's input_layernorm and
  //                   pre_mlp_layernorm from their kept inputs and statistics; moe_act, the
  //                   routed experts' activation from their kept fc1 outputs; shared_experts,
  //                   the shared experts' outputs (and gate) from the MoE layer's kept input;
  //                   mla_up_proj, the multi-latent attention's fused, rotated qkv (one shared copy)
  //                   from its kept latents (the up projections and the rotation rerun)
  // --moe-layer-recompute (Megatron's older flag) recomputes the MoE layers with or without
  // selective recomputation. recompute_num_layers is clamped to each chunk's layers (a pipeline
  // stage may hold fewer than num_layers).
  std::string recompute_granularity;  // "" | full | selective
  std::string recompute_method;       // "" | uniform | block (full only)
  int64_t recompute_num_layers = 0;   // >= 1 with full
  std::vector<std::string> recompute_modules;  // selective: core_attn | moe | mlp | layernorm | moe_act | shared_experts
                                               // | mla_up_proj
                                               // (empty: core_attn)
  bool moe_layer_recompute = false;
  bool recompute_core_attention() const;
  bool recompute_moe() const;
  bool recompute_mlp() const;
  bool recompute_layernorm() const;
  bool recompute_mla_up_proj() const;
  bool recompute_moe_act() const;
  bool recompute_shared_experts() const;

  // Fills the derived fields (ffn, kv_channels, padded vocab) and checks the
  // combination; errors name the flag (e.g. --num-attention-heads).
  void finalize(int64_t tensor_model_parallel_size = 1);
  // --moe-layer-freq's value for num_layers layers: an integer N (every N-th layer, from layer 0,
  // is an MoE layer), or a Python list expression of 0s and 1s, one per layer, such as
  // "[1,0,1,1]" or "([0]*1+[1]*23)" (lists, `+`, `*` and parentheses; quotes around it are
  // dropped). Returns the pattern, empty when every layer is an MoE layer; errors name the flag.
  static std::vector<int> parse_moe_layer_freq(const std::string& value, int64_t num_layers);
  // --window-size's value: "W" or "W,R" (parentheses allowed, Megatron's tuple form), W >= -1 the
  // keys before the query (-1: unlimited), R the keys after it, which a causal GPT requires to be
  // 0. Returns W; errors name the flag.
  static int64_t parse_window_size(const std::string& value);
  // --window-attn-skip-freq's value for num_layers layers: an integer N (every N-th layer counting
  // from 1, i.e. layers N-1, 2N-1, ... from 0, attends fully; Megatron's (N-1):1 ratio), or a list
  // expression as --moe-layer-freq's, 1 for a window layer and 0 for a full one. Returns the
  // pattern, empty when every layer has the window.
  static std::vector<int> parse_window_attn_skip_freq(const std::string& value, int64_t num_layers);
  // --no-rope-freq's value for num_layers layers: an integer N dividing num_layers (every N-th layer
  // counting from 1 skips the rotation: ([0] * (N-1) + [1]) * (num_layers / N), Megatron's), or a list
  // expression as --moe-layer-freq's, 1 for a layer without the rotation. Returns the pattern, empty
  // when every layer rotates.
  static std::vector<int> parse_no_rope_freq(const std::string& value, int64_t num_layers);
  // --linear-attention-freq's value for num_layers layers: an integer N (every N-th layer counting from 1
  // is an attention layer, the others GDN layers: ([1] * (N-1) + [0]) repeated, Megatron's), or a list
  // expression as --moe-layer-freq's, 1 for a GDN layer. Returns the whole pattern.
  static std::vector<int> parse_linear_attention_freq(const std::string& value, int64_t num_layers);
  // --hybrid-override-pattern's part of finalize() (the MoE layers are its E layers).
  void check_hybrid(int64_t tp);
  // The Gated DeltaNet fields' part of finalize().
  void check_gated_delta_net(int64_t tp) const;
  // The multi-token prediction fields' part of finalize().
  void check_mtp() const;
  // --no-rope-freq's part of finalize().
  void check_no_rope() const;
  // The recompute fields' part of finalize().
  void check_recompute() const;
  // The YaRN fields' part of finalize() (with --position-embedding-type yarn).
  void check_yarn() const;
  void check_longrope() const;
  // The gated linear unit fields' part of finalize().
  void check_gated_linear_unit() const;
  // The position embedding fields' part of finalize().
  void check_position_embedding() const;
};

// Heads, ffn columns and padded vocabulary split evenly over `tp` ranks, or an error
// naming the flag.
void check_tensor_parallel_split(const TransformerConfig& config, int64_t tp);

// Megatron's padding: ceil(V / (divisible_by * tp)) * (divisible_by * tp).
int64_t pad_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tensor_model_parallel_size);

}  // namespace lattice
