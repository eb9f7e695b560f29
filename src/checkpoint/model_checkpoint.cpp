#include "checkpoint/model_checkpoint.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/host_staging.h"
#include "checkpoint/tensor_parts.h"
#include "core/error.h"
#include "model/hybrid_layer_allocation.h"

namespace lattice {
namespace {

using json = nlohmann::json;

// The recorded fields with the flag that sets each.
struct ConfigField {
  const char* name;
  const char* flag;
};
constexpr ConfigField kConfigFields[] = {
    {"num_layers", "--num-layers"},
    {"hidden_size", "--hidden-size"},
    {"num_attention_heads", "--num-attention-heads"},
    {"ffn_hidden_size", "--ffn-hidden-size"},
    {"kv_channels", "--kv-channels"},
    {"vocab_size", "--vocab-size / --tokenizer-type"},
    {"padded_vocab_size", "--make-vocab-size-divisible-by"},
    {"max_position_embeddings", "--max-position-embeddings"},
    {"layernorm_epsilon", "--norm-epsilon"},
    {"openai_gelu", "--openai-gelu"},
    {"untie_embeddings_and_output_weights", "--untie-embeddings-and-output-weights"},
};

// Fields added later, with the value a checkpoint without them had.
struct OptionalField {
  const char* name;
  const char* flag;
  json fallback;
};
const std::vector<OptionalField>& optional_fields() {
  static const std::vector<OptionalField> fields = {
      {"position_embedding_type", "--position-embedding-type", "learned_absolute"},
      {"rotary_percent", "--rotary-percent", 1.0},
      {"rotary_base", "--rotary-base", 10000.0},
      {"rotary_interleaved", "--rotary-interleaved", false},
      {"rotary_seq_len_interpolation_factor", "--rotary-seq-len-interpolation-factor", 0.0},
      {"add_bias_linear", "--disable-bias-linear", true},
      {"add_qkv_bias", "--add-qkv-bias", false},
      {"qk_layernorm", "--qk-layernorm", false},
      {"qk_l2_norm", "--qk-l2-norm", false},
      {"attention_output_gate", "--attention-output-gate", false},
      {"squared_relu", "--squared-relu", false},
      {"apply_layernorm_1p", "--apply-layernorm-1p", false},
      {"num_experts", "--num-experts", 0},
      {"moe_router_topk", "--moe-router-topk", 2},
      {"moe_ffn_hidden_size", "--moe-ffn-hidden-size", 0},
      {"moe_router_pre_softmax", "--moe-router-pre-softmax", false},
      {"moe_apply_probs_on_input", "--moe-apply-probs-on-input", false},
      {"moe_layer_freq", "--moe-layer-freq", json::array()},
      {"moe_router_score_function", "--moe-router-score-function", "softmax"},
      {"moe_router_num_groups", "--moe-router-num-groups", 0},
      {"moe_router_group_topk", "--moe-router-group-topk", 0},
      {"moe_router_enable_expert_bias", "--moe-router-enable-expert-bias", false},
      {"moe_shared_expert_intermediate_size", "--moe-shared-expert-intermediate-size", 0},
      {"moe_shared_expert_gate", "--moe-shared-expert-gate", false},
      {"moe_latent_size", "--moe-latent-size", 0},
      {"mtp_num_layers", "--mtp-num-layers", 0},
      {"mtp_use_repeated_layer", "--mtp-use-repeated-layer", false},
      {"moe_router_topk_scaling_factor", "--moe-router-topk-scaling-factor", 1.0},
      {"normalization", "--normalization", "LayerNorm"},
      {"swiglu", "--swiglu", false},
      {"num_query_groups", "--num-query-groups", nullptr},  // null: as many as the saved heads
      {"use_rope_scaling", "--use-rope-scaling", false},
      {"rope_scaling_factor", "--rope-scaling-factor", 8.0},
      {"rope_scaling_low_freq_factor", "--rope-scaling-low-freq-factor", 1.0},
      {"rope_scaling_high_freq_factor", "--rope-scaling-high-freq-factor", 4.0},
      {"rope_scaling_original_max_position_embeddings", "--rope-scaling-original-max-position-embeddings", 8192},
      {"window_size", "--window-size", -1},
      {"window_attn_skip_freq", "--window-attn-skip-freq", json::array()},
      {"no_rope_freq", "--no-rope-freq", json::array()},
      {"experimental_attention_variant", "--experimental-attention-variant", ""},
      {"linear_attention_freq", "--linear-attention-freq", json::array()},
      {"linear_conv_kernel_dim", "--linear-conv-kernel-dim", 4},
      {"linear_key_head_dim", "--linear-key-head-dim", 128},
      {"linear_value_head_dim", "--linear-value-head-dim", 128},
      {"linear_num_key_heads", "--linear-num-key-heads", 16},
      {"linear_num_value_heads", "--linear-num-value-heads", 32},
      {"hybrid_override_pattern", "--hybrid-override-pattern", ""},
      {"mamba_state_dim", "--mamba-state-dim", 128},
      {"mamba_head_dim", "--mamba-head-dim", 64},
      {"mamba_num_groups", "--mamba-num-groups", 8},
      {"mamba_num_heads", "--mamba-num-heads", 0},
      {"softmax_type", "--softmax-type", "vanilla"},
      {"quick_geglu", "--quick-geglu", false},
      {"glu_linear_offset", "--glu-linear-offset", 0.0},
      {"activation_func_clamp_value", "--activation-func-clamp-value", 0.0},
      {"yarn_rotary_scaling_factor", "--yarn-rotary-scaling-factor", 1.0},
      {"yarn_original_max_position_embeddings", "--yarn-original-max-position-embeddings", 4096},
      {"yarn_beta_fast", "--yarn-beta-fast", 32.0},
      {"yarn_beta_slow", "--yarn-beta-slow", 1.0},
      {"yarn_mscale", "--yarn-mscale", 1.0},
      {"yarn_mscale_all_dim", "--yarn-mscale-all-dim", 0.0},
      {"longrope_short_factor", "--longrope-short-factor", json::array()},
      {"longrope_long_factor", "--longrope-long-factor", json::array()},
      {"longrope_original_max_position_embeddings", "--longrope-original-max-position-embeddings", 4096},
      {"longrope_attention_factor", "--longrope-attention-factor", 1.0},
      {"yarn_correction_range_round_to_int", "--no-yarn-correction-range-round-to-int", true},
      {"multi_latent_attention", "--multi-latent-attention", false},
      {"q_lora_rank", "--q-lora-rank", 0},
      {"mla_latent_norm_epsilon", "--mla-latent-norm-epsilon", 0.0},
      {"kv_lora_rank", "--kv-lora-rank", 32},
      {"qk_head_dim", "--qk-head-dim", 128},
      {"qk_pos_emb_head_dim", "--qk-pos-emb-head-dim", 64},
      {"v_head_dim", "--v-head-dim", 128},
  };
  return fields;
}

json field_or_fallback(const json& j, const OptionalField& f) {
  if (j.contains(f.name)) return j.at(f.name);
  // Before grouped-query attention every head had its own key and value.
  if (f.fallback.is_null() && std::string(f.name) == "num_query_groups" && j.contains("num_attention_heads"))
    return j.at("num_attention_heads");
  return f.fallback;
}
// The same, by the field's name.
json optional_field(const json& j, const std::string& name) {
  for (const OptionalField& f : optional_fields())
    if (name == f.name) return field_or_fallback(j, f);
  LATTICE_FAIL() << "model_config: no optional field '" << name << "'";
}

// Two recorded values the same (floats compared as floats: the JSON holds their double widening).
bool same_value(const json& a, const json& b) {
  if (a.is_number() && b.is_number() && (a.is_number_float() || b.is_number_float()))
    return float(a.get<double>()) == float(b.get<double>());
  return a == b;
}

}  // namespace

json model_config_json(const TransformerConfig& c) {
  return {{"num_layers", c.num_layers},
          {"hidden_size", c.hidden_size},
          {"num_attention_heads", c.num_attention_heads},
          {"ffn_hidden_size", c.ffn_hidden_size},
          {"kv_channels", c.kv_channels},
          {"vocab_size", c.vocab_size},
          {"padded_vocab_size", c.padded_vocab_size},
          {"max_position_embeddings", c.max_position_embeddings},
          {"layernorm_epsilon", c.layernorm_epsilon},
          {"openai_gelu", c.gelu == GeluKind::tanh},
          {"untie_embeddings_and_output_weights", c.untie_embeddings_and_output_weights},
          {"position_embedding_type", c.position_embedding_type},
          {"rotary_percent", c.rotary_percent},
          {"rotary_base", c.rotary_base},
          {"rotary_interleaved", c.rotary_interleaved},
          {"rotary_seq_len_interpolation_factor", c.rotary_seq_len_interpolation_factor},
          {"add_bias_linear", c.add_bias_linear},
          {"add_qkv_bias", c.add_qkv_bias},
          {"qk_layernorm", c.qk_layernorm},
          {"qk_l2_norm", c.qk_l2_norm},
          {"attention_output_gate", c.attention_output_gate},
          {"squared_relu", c.gelu == GeluKind::squared_relu},
          {"apply_layernorm_1p", c.apply_layernorm_1p},
          {"num_experts", c.num_experts},
          {"moe_router_topk", c.moe_router_topk},
          {"moe_ffn_hidden_size", c.moe_ffn_hidden_size},
          {"moe_router_pre_softmax", c.moe_router_pre_softmax},
          {"moe_apply_probs_on_input", c.moe_apply_probs_on_input},
          {"moe_layer_freq", c.moe_layer_pattern},
          {"moe_router_score_function", c.moe_router_score_function},
          {"moe_router_num_groups", c.moe_router_num_groups},
          {"moe_router_group_topk", c.moe_router_group_topk},
          {"moe_router_enable_expert_bias", c.moe_router_enable_expert_bias},
          {"moe_shared_expert_intermediate_size", c.moe_shared_expert_intermediate_size},
          {"moe_shared_expert_gate", c.moe_shared_expert_gate},
          {"moe_latent_size", c.moe_latent_size},
          {"mtp_num_layers", c.mtp_num_layers},
          {"mtp_use_repeated_layer", c.mtp_use_repeated_layer},
          {"moe_router_topk_scaling_factor", c.moe_router_topk_scaling_factor},
          {"normalization", c.normalization},
          {"swiglu", c.swiglu},
          {"num_query_groups", c.num_query_groups},
          {"use_rope_scaling", c.use_rope_scaling},
          {"rope_scaling_factor", c.rope_scaling_factor},
          {"rope_scaling_low_freq_factor", c.rope_scaling_low_freq_factor},
          {"rope_scaling_high_freq_factor", c.rope_scaling_high_freq_factor},
          {"rope_scaling_original_max_position_embeddings", c.rope_scaling_original_max_position_embeddings},
          {"window_size", c.window_size},
          {"window_attn_skip_freq", c.window_attn_pattern},
          {"no_rope_freq", c.no_rope_pattern},
          {"experimental_attention_variant", c.experimental_attention_variant},
          {"linear_attention_freq", c.linear_attention_pattern},
          {"linear_conv_kernel_dim", c.linear_conv_kernel_dim},
          {"linear_key_head_dim", c.linear_key_head_dim},
          {"linear_value_head_dim", c.linear_value_head_dim},
          {"linear_num_key_heads", c.linear_num_key_heads},
          {"linear_num_value_heads", c.linear_num_value_heads},
          {"hybrid_override_pattern", c.hybrid_override_pattern()},
          {"mamba_state_dim", c.mamba_state_dim},
          {"mamba_head_dim", c.mamba_head_dim},
          {"mamba_num_groups", c.mamba_num_groups},
          {"mamba_num_heads", c.mamba_num_heads},
          {"softmax_type", c.softmax_type},
          {"quick_geglu", c.quick_geglu},
          {"glu_linear_offset", c.glu_linear_offset},
          {"activation_func_clamp_value", c.activation_func_clamp_value},
          {"yarn_rotary_scaling_factor", c.yarn_rotary_scaling_factor},
          {"yarn_original_max_position_embeddings", c.yarn_original_max_position_embeddings},
          {"yarn_beta_fast", c.yarn_beta_fast},
          {"yarn_beta_slow", c.yarn_beta_slow},
          {"yarn_mscale", c.yarn_mscale},
          {"yarn_mscale_all_dim", c.yarn_mscale_all_dim},
          {"longrope_short_factor", c.longrope_short_factor},
          {"longrope_long_factor", c.longrope_long_factor},
          {"longrope_original_max_position_embeddings", c.longrope_original_max_position_embeddings},
          {"longrope_attention_factor", c.longrope_attention_factor},
          {"yarn_correction_range_round_to_int", c.yarn_correction_range_round_to_int},
          {"multi_latent_attention", c.multi_latent_attention},
          {"q_lora_rank", c.q_lora_rank},
          {"mla_latent_norm_epsilon", c.mla_latent_norm_epsilon},
          {"kv_lora_rank", c.kv_lora_rank},
          {"qk_head_dim", c.qk_head_dim},
          {"qk_pos_emb_head_dim", c.qk_pos_emb_head_dim},
          {"v_head_dim", c.v_head_dim}};
}

TransformerConfig model_config_from_json(const json& j, const std::string& where) {
  for (const ConfigField& f : kConfigFields)
    if (!j.contains(f.name)) LATTICE_FAIL() << where << ": model_config has no '" << f.name << "'";
  TransformerConfig c;
  try {
    c.num_layers = j.at("num_layers");
    c.hidden_size = j.at("hidden_size");
    c.num_attention_heads = j.at("num_attention_heads");
    c.ffn_hidden_size = j.at("ffn_hidden_size");
    c.kv_channels = j.at("kv_channels");
    c.vocab_size = j.at("vocab_size");
    c.padded_vocab_size = j.at("padded_vocab_size");
    c.max_position_embeddings = j.at("max_position_embeddings");
    c.layernorm_epsilon = j.at("layernorm_epsilon");
    c.gelu = j.at("openai_gelu").get<bool>() ? GeluKind::tanh : GeluKind::erf;
    c.untie_embeddings_and_output_weights = j.at("untie_embeddings_and_output_weights");
    c.position_embedding_type = optional_field(j, "position_embedding_type").get<std::string>();
    c.rotary_percent = optional_field(j, "rotary_percent").get<double>();
    c.rotary_base = optional_field(j, "rotary_base").get<float>();
    c.rotary_interleaved = optional_field(j, "rotary_interleaved").get<bool>();
    c.rotary_seq_len_interpolation_factor = optional_field(j, "rotary_seq_len_interpolation_factor").get<float>();
    c.add_bias_linear = optional_field(j, "add_bias_linear").get<bool>();
    c.add_qkv_bias = optional_field(j, "add_qkv_bias").get<bool>();
    c.qk_layernorm = optional_field(j, "qk_layernorm").get<bool>();
    c.qk_l2_norm = optional_field(j, "qk_l2_norm").get<bool>();
    c.attention_output_gate = optional_field(j, "attention_output_gate").get<bool>();
    if (optional_field(j, "squared_relu").get<bool>()) c.gelu = GeluKind::squared_relu;
    c.apply_layernorm_1p = optional_field(j, "apply_layernorm_1p").get<bool>();
    c.num_experts = optional_field(j, "num_experts").get<int64_t>();
    c.moe_router_topk = optional_field(j, "moe_router_topk").get<int64_t>();
    c.moe_ffn_hidden_size = optional_field(j, "moe_ffn_hidden_size").get<int64_t>();
    c.moe_router_pre_softmax = optional_field(j, "moe_router_pre_softmax").get<bool>();
    c.moe_apply_probs_on_input = optional_field(j, "moe_apply_probs_on_input").get<bool>();
    c.moe_layer_pattern = optional_field(j, "moe_layer_freq").get<std::vector<int>>();
    c.moe_router_score_function = optional_field(j, "moe_router_score_function").get<std::string>();
    c.moe_router_num_groups = optional_field(j, "moe_router_num_groups").get<int64_t>();
    c.moe_router_group_topk = optional_field(j, "moe_router_group_topk").get<int64_t>();
    c.moe_router_enable_expert_bias = optional_field(j, "moe_router_enable_expert_bias").get<bool>();
    c.moe_shared_expert_intermediate_size = optional_field(j, "moe_shared_expert_intermediate_size").get<int64_t>();
    c.moe_shared_expert_gate = optional_field(j, "moe_shared_expert_gate").get<bool>();
    c.moe_latent_size = optional_field(j, "moe_latent_size").get<int64_t>();
    c.mtp_num_layers = optional_field(j, "mtp_num_layers").get<int64_t>();
    c.mtp_use_repeated_layer = optional_field(j, "mtp_use_repeated_layer").get<bool>();
    c.moe_router_topk_scaling_factor = optional_field(j, "moe_router_topk_scaling_factor").get<float>();
    c.normalization = optional_field(j, "normalization").get<std::string>();
    c.swiglu = optional_field(j, "swiglu").get<bool>();
    c.num_query_groups = optional_field(j, "num_query_groups").get<int64_t>();
    c.use_rope_scaling = optional_field(j, "use_rope_scaling").get<bool>();
    c.rope_scaling_factor = optional_field(j, "rope_scaling_factor").get<float>();
    c.rope_scaling_low_freq_factor = optional_field(j, "rope_scaling_low_freq_factor").get<float>();
    c.rope_scaling_high_freq_factor = optional_field(j, "rope_scaling_high_freq_factor").get<float>();
    c.rope_scaling_original_max_position_embeddings =
        optional_field(j, "rope_scaling_original_max_position_embeddings").get<int64_t>();
    c.window_size = optional_field(j, "window_size").get<int64_t>();
    c.window_attn_pattern = optional_field(j, "window_attn_skip_freq").get<std::vector<int>>();
    c.no_rope_pattern = optional_field(j, "no_rope_freq").get<std::vector<int>>();
    c.experimental_attention_variant = optional_field(j, "experimental_attention_variant").get<std::string>();
    c.linear_attention_pattern = optional_field(j, "linear_attention_freq").get<std::vector<int>>();
    c.linear_conv_kernel_dim = optional_field(j, "linear_conv_kernel_dim").get<int64_t>();
    c.linear_key_head_dim = optional_field(j, "linear_key_head_dim").get<int64_t>();
    c.linear_value_head_dim = optional_field(j, "linear_value_head_dim").get<int64_t>();
    c.linear_num_key_heads = optional_field(j, "linear_num_key_heads").get<int64_t>();
    c.linear_num_value_heads = optional_field(j, "linear_num_value_heads").get<int64_t>();
    const HybridPattern hybrid = parse_hybrid_pattern(optional_field(j, "hybrid_override_pattern").get<std::string>());
    c.hybrid_layer_pattern = hybrid.main;  // (its MTP depths, if any, are the mtp_num_layers read above)
    c.mtp_hybrid_pattern = hybrid.mtp;
    c.mamba_state_dim = optional_field(j, "mamba_state_dim").get<int64_t>();
    c.mamba_head_dim = optional_field(j, "mamba_head_dim").get<int64_t>();
    c.mamba_num_groups = optional_field(j, "mamba_num_groups").get<int64_t>();
    c.mamba_num_heads = optional_field(j, "mamba_num_heads").get<int64_t>();
    c.softmax_type = optional_field(j, "softmax_type").get<std::string>();
    c.quick_geglu = optional_field(j, "quick_geglu").get<bool>();
    c.glu_linear_offset = optional_field(j, "glu_linear_offset").get<float>();
    c.activation_func_clamp_value = optional_field(j, "activation_func_clamp_value").get<float>();
    c.yarn_rotary_scaling_factor = optional_field(j, "yarn_rotary_scaling_factor").get<float>();
    c.yarn_original_max_position_embeddings = optional_field(j, "yarn_original_max_position_embeddings").get<int64_t>();
    c.yarn_beta_fast = optional_field(j, "yarn_beta_fast").get<float>();
    c.yarn_beta_slow = optional_field(j, "yarn_beta_slow").get<float>();
    c.yarn_mscale = optional_field(j, "yarn_mscale").get<float>();
    c.yarn_mscale_all_dim = optional_field(j, "yarn_mscale_all_dim").get<float>();
    c.longrope_short_factor = optional_field(j, "longrope_short_factor").get<std::vector<float>>();
    c.longrope_long_factor = optional_field(j, "longrope_long_factor").get<std::vector<float>>();
    c.longrope_original_max_position_embeddings =
        optional_field(j, "longrope_original_max_position_embeddings").get<int64_t>();
    c.longrope_attention_factor = optional_field(j, "longrope_attention_factor").get<float>();
    c.yarn_correction_range_round_to_int = optional_field(j, "yarn_correction_range_round_to_int").get<bool>();
    c.multi_latent_attention = optional_field(j, "multi_latent_attention").get<bool>();
    c.q_lora_rank = optional_field(j, "q_lora_rank").get<int64_t>();
    c.mla_latent_norm_epsilon = optional_field(j, "mla_latent_norm_epsilon").get<float>();
    c.kv_lora_rank = optional_field(j, "kv_lora_rank").get<int64_t>();
    c.qk_head_dim = optional_field(j, "qk_head_dim").get<int64_t>();
    c.qk_pos_emb_head_dim = optional_field(j, "qk_pos_emb_head_dim").get<int64_t>();
    c.v_head_dim = optional_field(j, "v_head_dim").get<int64_t>();
  } catch (const json::exception& e) {
    LATTICE_FAIL() << where << ": model_config has a field of the wrong type (" << e.what() << ")";
  }
  c.hidden_dropout = c.attention_dropout = 0;
  c.finalize();
  return c;
}

namespace {

// A run whose prediction depths have one depth's parameters (one depth, or --mtp-use-repeated-layer) reads a
// checkpoint whose depths have them too, of the same layers, whatever the two runs' numbers of depths: the
// parameters are the same (mtp.layers.0.*). NVIDIA publishes Nemotron-3 with one depth, which Megatron's recipe
// trains as two repeated ones. `saved` with this run's depths then, else as it is.
json with_run_depths(json saved, const json& now) {
  auto one_depth_of_parameters = [](const json& j) {
    const int64_t depths = j.value("mtp_num_layers", int64_t(0));
    return depths == 1 || (depths > 1 && j.value("mtp_use_repeated_layer", false));
  };
  if (!one_depth_of_parameters(saved) || !one_depth_of_parameters(now)) return saved;
  const std::string was = saved.value("hybrid_override_pattern", ""), is = now.value("hybrid_override_pattern", "");
  if (!was.empty() && !is.empty()) {  // a hybrid's depths: the same decoder and depth layers (else the pattern's
    const HybridPattern a = parse_hybrid_pattern(was), b = parse_hybrid_pattern(is);  // comparison names them)
    if (a.main == b.main && a.mtp == b.mtp) saved["hybrid_override_pattern"] = is;
  }
  saved["mtp_num_layers"] = now["mtp_num_layers"];
  saved["mtp_use_repeated_layer"] = now["mtp_use_repeated_layer"];
  return saved;
}

}  // namespace

void check_model_config(const json& checkpoint, const TransformerConfig& c, const std::string& where) {
  const json now = model_config_json(c);
  const json saved = with_run_depths(checkpoint, now);
  auto expect_same = [&](const json& a, const json& b, const char* name, const char* flag) {
    if (!same_value(a, b))
      LATTICE_FAIL() << where << ": the checkpoint's " << name << " is " << a.dump() << ", this run's is " << b.dump()
                     << " (" << flag << ")";
  };
  // The attention's kind first: with multi-latent attention it sets the head dim and the query groups.
  for (const OptionalField& f : optional_fields())
    if (std::string(f.name) == "multi_latent_attention")
      expect_same(field_or_fallback(saved, f), now[f.name], f.name, f.flag);
  for (const ConfigField& f : kConfigFields) {
    if (!saved.contains(f.name)) LATTICE_FAIL() << where << ": model_config has no '" << f.name << "'";
    // The padding depends on the tensor-parallel size. With the same vocab_size (compared
    // before it) the padding rows never affect a result: loading reads the rows both have
    // and zeroes the rest.
    if (std::string(f.name) == "padded_vocab_size") continue;
    expect_same(saved[f.name], now[f.name], f.name, f.flag);
  }
  for (const OptionalField& f : optional_fields()) expect_same(field_or_fallback(saved, f), now[f.name], f.name, f.flag);
}

void load_model_tensors(const CheckpointReader& r, GPTModel& model) {
  // Every parameter's box is read; the staged copy keeps the buffer's alignment padding.
  HostStaging params(model.params().params(), model.params().numel(), true);
  for (const ParamInfo& p : model.params().infos()) read_param_part(r, p.name, p, params.data() + p.offset);
  params.upload(model.params().params());
}

std::string save_model_checkpoint(const std::string& dir, int64_t iteration, const GPTModel& model,
                                  const std::string& args_json) {
  // The parameters are written from the staged host copy (the model's own buffer on the CPU), which lives
  // until the save returns: a model of any size costs no second copy here.
  const HostStaging params(model.params().params(), model.params().numel(), true);
  CheckpointWriter w;
  add_parts(w, kModelFile, param_parts(model.params().infos(), params.data(), model.tensor_parallel().rank()), true);
  CheckpointState s;
  s.iteration = iteration;
  s.model_config = model_config_json(model.config());
  s.args = json::parse(args_json);
  w.set_state(s);
  return w.save(dir);
}

std::string save_model_checkpoint(const std::string& dir, int64_t iteration, const TransformerConfig& config,
                                  const std::function<void(const ParamInfo&, float*)>& fill,
                                  const std::string& args_json) {
  CheckpointState s;
  s.iteration = iteration;
  s.args = json::parse(args_json);
  return save_streamed_checkpoint(dir, s, config, fill);
}

std::string save_streamed_checkpoint(const std::string& dir, CheckpointState state, const TransformerConfig& config,
                                     const std::function<void(const ParamInfo&, float*)>& fill,
                                     const std::vector<StreamedTensors>& more) {
  const ParamBuffer registry = GPTModel::parameter_registry(config, TensorParallel{}, ModelPlacement{}, 0, 1);
  CheckpointWriter w;
  std::vector<StreamedTensors> sets{{kModelFile, "", fill}};
  sets.insert(sets.end(), more.begin(), more.end());
  for (const StreamedTensors& set : sets)
    for (const TensorPart& t : param_parts(registry.infos(), nullptr, 0)) {  // (the tensors a model's save writes)
      const ParamInfo& p = registry.info(t.name);
      LATTICE_CHECK(t.lengths == p.global_shape) << t.name << ": not whole in a one-process model";
      w.add_produced_piece(set.file, set.prefix + t.name, "F32", t.global_shape, t.offsets, t.lengths,
                           [p, &set](uint8_t* out) { set.fill(p, reinterpret_cast<float*>(out)); });
    }
  state.model_config = model_config_json(config);
  w.set_state(state);
  return w.save(dir);
}

LoadedModel load_model_checkpoint(const std::string& dir, int64_t B) {
  LoadedModel out = open_model_checkpoint(dir);
  load_model(out, B);
  return out;
}

LoadedModel open_model_checkpoint(const std::string& dir) {
  auto r = std::make_shared<const CheckpointReader>(CheckpointReader::open(dir));
  const CheckpointState& s = r->state();
  LoadedModel out;
  out.config = model_config_from_json(s.model_config, r->iter_dir());
  out.reader = r;
  out.seq_length = s.args.value("seq-length", int64_t(0));
  out.tokenizer_type = s.args.value("tokenizer-type", std::string());
  out.tokenizer = {out.tokenizer_type, s.args.value("vocab-file", std::string()),
                   s.args.value("merge-file", std::string()), s.args.value("tokenizer-model", std::string()),
                   s.args.value("vocab-size", int64_t(0)), s.args.value("vocab-extra-ids", int64_t(0)),
                   s.args.value("tiktoken-pattern", std::string()), s.args.value("tiktoken-num-special-tokens", int64_t(0)),
                   s.args.value("tiktoken-special-tokens", std::vector<std::string>())};
  out.iteration = s.iteration;
  out.hf_model_type = s.args.value("hf-model-type", std::string());
  return out;
}

void load_model(LoadedModel& lm, int64_t B) {
  const TransformerConfig& c = lm.config;
  // For inference (generate, convert): the weights without a gradient buffer.
  lm.model = std::make_unique<GPTModel>(c, B, c.max_position_embeddings, TensorParallel{}, ModelPlacement{}, nullptr,
                                        ContextParallel{}, /*gradients=*/false);
  load_model_tensors(*lm.reader, *lm.model);
}

std::function<void(const ParamInfo&, int64_t, int64_t, float*)> checkpoint_param_rows(
    std::shared_ptr<const CheckpointReader> reader) {
  return [reader](const ParamInfo& p, int64_t row0, int64_t rows, float* out) {
    std::vector<int64_t> offsets(p.global_shape.size(), 0), lengths = p.global_shape;
    if (!lengths.empty()) {
      offsets[0] = row0;
      lengths[0] = rows;
    }
    reader->read_slice(p.name, "F32", offsets, lengths, out);
    reader->release(p.name);
  };
}

void load_parameters(GPTModel& model, const std::string& path) {
  load_parameters(model, SafetensorsFile::read(path));
}

void load_parameters(GPTModel& model, const SafetensorsFile& f) {
  const std::string& path = f.path();
  HostStaging params(model.params().params(), model.params().numel(), true);
  for (const ParamInfo& p : model.params().infos()) {
    if (!f.has(p.name)) LATTICE_FAIL() << path << ": missing tensor " << p.name;
    const SafeTensor& t = f.get(p.name);
    if (t.shape != p.shape)
      LATTICE_FAIL() << path << ": tensor " << p.name << " has shape " << shape_str(t.shape)
                     << ", the model expects " << shape_str(p.shape);
    std::vector<float> v = f.get_f32(p.name);
    std::memcpy(params.data() + p.offset, v.data(), v.size() * sizeof(float));
  }
  params.upload(model.params().params());
}

}  // namespace lattice
