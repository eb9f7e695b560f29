#include "checkpoint/hf_glm4_moe.h"

#include <map>
#include <sstream>
#include <vector>

#include "checkpoint/hf_deepseek_moe.h"
#include "checkpoint/hf_tensor_map.h"
#include "core/error.h"

namespace lattice {
namespace {

using json = nlohmann::json;
using hf::TensorMap;

// The HF tensors of decoder layer l (model.layers.<l>.) and the lattice parameters they make, under `lat`
// (decoder.layers.<l>., or a prediction depth's transformer layer), with every HF tensor's shape.
void layer_tensors(const TransformerConfig& c, int64_t l, const std::string& lat, std::vector<TensorMap>& m,
                   std::map<std::string, Shape>& s, const SafetensorsFile* file) {
  const int64_t C = c.hidden_size, D = c.kv_channels, Q = c.attention_width(), KV = D * c.num_query_groups;
  const std::string hf = "model.layers." + std::to_string(l) + ".";
  m.push_back({lat + "input_layernorm.weight", {{hf + "input_layernorm.weight"}}});
  s[hf + "input_layernorm.weight"] = {C};
  m.push_back(hf::grouped_qkv(c, lat + "self_attention.linear_qkv.weight", hf + "self_attn.", "weight"));
  s[hf + "self_attn.q_proj.weight"] = {Q, C};
  s[hf + "self_attn.k_proj.weight"] = {KV, C};
  s[hf + "self_attn.v_proj.weight"] = {KV, C};
  if (c.add_qkv_bias) {  // attention_bias: q_proj, k_proj and v_proj (o_proj has none)
    m.push_back(hf::grouped_qkv(c, lat + "self_attention.linear_qkv.bias", hf + "self_attn.", "bias"));
    s[hf + "self_attn.q_proj.bias"] = {Q};
    s[hf + "self_attn.k_proj.bias"] = {KV};
    s[hf + "self_attn.v_proj.bias"] = {KV};
  }
  if (c.qk_layernorm) {  // use_qk_norm: RMSNorm weights [head_dim] of every query and key head
    m.push_back({lat + "self_attention.q_layernorm.weight", {{hf + "self_attn.q_norm.weight"}}});
    m.push_back({lat + "self_attention.k_layernorm.weight", {{hf + "self_attn.k_norm.weight"}}});
    s[hf + "self_attn.q_norm.weight"] = {D};
    s[hf + "self_attn.k_norm.weight"] = {D};
  }
  m.push_back({lat + "self_attention.linear_proj.weight", {{hf + "self_attn.o_proj.weight"}}});
  s[hf + "self_attn.o_proj.weight"] = {C, Q};
  m.push_back({lat + "pre_mlp_layernorm.weight", {{hf + "post_attention_layernorm.weight"}}});
  s[hf + "post_attention_layernorm.weight"] = {C};
  hf::deepseek_mlp_tensors(c, l, lat, hf, m, s, file);
}

// file: the file being read (its experts' layout), or null (export: per expert). GLM's prediction layers have
// no copies of the embedding and lm_head.
std::vector<TensorMap> tensor_map(const TransformerConfig& c, std::map<std::string, Shape>& shapes,
                                  const SafetensorsFile* file) {
  return hf::deepseek_layout_tensors(
      c, [&](int64_t l, const std::string& lat, auto& m, auto& s) { layer_tensors(c, l, lat, m, s, file); }, false,
      shapes);
}

hf::ImportPlan import_plan(const TransformerConfig& c, const SafetensorsFile& f, const json&) {
  hf::ImportPlan p;
  p.map = tensor_map(c, p.shapes, &f);
  hf::check_deepseek_layout(c, f, p.shapes);  // DeepSeek-V3-style copies in a depth: accepted if exact
  return p;
}

hf::ConfigFn config_fn(int64_t divisible_by) {
  return [divisible_by](const json& j, const std::string& what, const SafetensorsFile& f) {
    return hf_glm4_moe_config(j, what, f, divisible_by);
  };
}

}  // namespace

bool is_hf_glm4_moe_config(const json& j) {
  if (!j.is_object()) return false;
  if (j.contains("model_type")) return j["model_type"] == "glm4_moe";
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const json& a : j["architectures"])
      if (a == "Glm4MoeForCausalLM") return true;
  return false;
}

TransformerConfig hf_glm4_moe_config(const json& j, const std::string& what, const SafetensorsFile& file,
                                     int64_t divisible_by) {
  if (!is_hf_glm4_moe_config(j))
    LATTICE_FAIL() << what << ": not a GLM-4.5 config (model_type " << j.value("model_type", json()).dump() << ")";
  TransformerConfig c;
  hf::read_decoder_sizes(j, what, c);
  c.ffn_hidden_size = hf::config_int(j, what, "intermediate_size");
  hf::read_grouped_heads(j, what, c, true);
  const std::string act = j.value("hidden_act", std::string("silu"));
  if (act != "silu") LATTICE_FAIL() << what << ": hidden_act \"" << act << "\" is not supported (silu: SwiGLU)";
  hf::read_partial_rope(j, what, 0.5, c);  // Glm4MoeConfig's default: half of each head rotated
  c.normalization = "RMSNorm";
  c.layernorm_epsilon = float(hf::config_positive(j, what, "rms_norm_eps", 1e-5));
  c.swiglu = true;
  c.add_bias_linear = false;
  c.add_qkv_bias = hf::config_bool(j, what, "attention_bias", false);  // q, k and v only: o_proj has none
  c.qk_layernorm = hf::config_bool(j, what, "use_qk_norm", false);
  hf::read_sigmoid_router(j, what, c, 1);  // Glm4MoeConfig's first_k_dense_replace default: 1
  c.mtp_num_layers = hf::nextn_predict_layers(j, what, file);
  c.untie_embeddings_and_output_weights = !hf::config_bool(j, what, "tie_word_embeddings", false);
  c.make_vocab_size_divisible_by = divisible_by;
  c.hidden_dropout = c.attention_dropout = 0.0f;
  c.finalize();
  return c;
}

json hf_glm4_moe_config_json(const TransformerConfig& c, const std::string& tokenizer_type) {
  json j = {{"architectures", {"Glm4MoeForCausalLM"}},
            {"attention_bias", c.add_qkv_bias},
            {"attention_dropout", 0.0},
            {"head_dim", c.kv_channels},
            {"hidden_act", "silu"},
            {"hidden_size", c.hidden_size},
            {"initializer_range", 0.02},
            {"intermediate_size", c.ffn_hidden_size},
            {"max_position_embeddings", c.max_position_embeddings},
            {"model_type", "glm4_moe"},
            {"num_attention_heads", c.num_attention_heads},
            {"num_hidden_layers", c.num_layers},
            {"num_key_value_heads", c.num_query_groups},
            {"num_nextn_predict_layers", c.mtp_num_layers},
            {"partial_rotary_factor", c.rotary_percent},
            {"rms_norm_eps", hf::shortest_float(c.layernorm_epsilon)},
            {"rope_scaling", nullptr},
            {"rope_theta", hf::shortest_float(c.rotary_base)},
            {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
            {"torch_dtype", "float32"},
            {"use_cache", true},
            {"use_qk_norm", c.qk_layernorm},
            {"vocab_size", c.vocab_size}};
  hf::write_sigmoid_router(c, j);
  if (!tokenizer_type.empty()) j[kHfTokenizerKey] = tokenizer_type;
  return j;
}

std::string hf_glm4_moe_mismatch(const TransformerConfig& c) {
  const char* why =
      c.multi_latent_attention ? "multi-latent attention (HuggingFace GLM-4.5's attention is grouped-query)"
      : c.gated_delta_net()    ? "Gated DeltaNet layers (HuggingFace GLM-4.5's layers are all attention)"
      : c.attention_output_gate ? "the attention output gate (--attention-output-gate; HuggingFace GLM-4.5 has none)"
      : !c.rope()              ? "no rotary embedding (HuggingFace GLM-4.5 rotates the first partial_rotary_factor of "
                                 "each head)"
      : c.rotary_interleaved   ? "--rotary-interleaved (HuggingFace GLM-4.5 rotates rotate_half pairs)"
      : c.yarn() || c.use_rope_scaling || c.rotary_seq_len_interpolation_factor > 0.0f
          ? "rotary scaling (YaRN, --use-rope-scaling or --rotary-seq-len-interpolation-factor; HuggingFace GLM-4.5's "
            "rope_scaling is null)"
      : !c.no_rope_pattern.empty() ? "--no-rope-freq (HuggingFace GLM-4.5 rotates every layer)"
      : c.qk_l2_norm               ? "--qk-l2-norm (HuggingFace GLM-4.5's q/k norms are RMSNorms with weights)"
      : !c.rmsnorm()               ? "LayerNorm (HuggingFace GLM-4.5 has RMSNorm)"
      : c.apply_layernorm_1p       ? "zero-centered norm weights (--apply-layernorm-1p)"
      : !c.swiglu || c.quick_geglu ? "an MLP other than SwiGLU (HuggingFace GLM-4.5's is SwiGLU)"
      : c.glu_linear_offset != 0.0f || c.activation_func_clamp_value > 0.0f
          ? "--glu-linear-offset or --activation-func-clamp-value (HuggingFace GLM-4.5's SwiGLU has neither)"
      : c.add_bias_linear ? "linear biases (HuggingFace GLM-4.5 biases q, k and v only: --disable-bias-linear "
                            "[--add-qkv-bias])"
      : c.softmax_sink()   ? "attention sinks (--softmax-type)"
      : c.window_size >= 0 ? "sliding-window attention (HuggingFace GLM-4.5 has none)"
                           : hf::sigmoid_router_mismatch(c);
  return why ? why : "";
}

HfModel load_hf_glm4_moe(const std::string& dir, int64_t divisible_by, int64_t seq_length, bool gradients) {
  return hf::load_source(open_hf_glm4_moe(dir, divisible_by), seq_length, gradients);
}

HfSource open_hf_glm4_moe(const std::string& dir, int64_t divisible_by) {
  return hf::open_planned_folder(dir, config_fn(divisible_by), import_plan);
}

void save_hf_glm4_moe(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                      const hf::ExportOptions& options) {
  save_hf_glm4_moe(dir, hf::model_source(model), tokenizer_type, options);
}

void save_hf_glm4_moe(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                      const hf::ExportOptions& options) {
  const TransformerConfig& c = src.config;
  const std::string why = hf_glm4_moe_mismatch(c);
  if (!why.empty()) LATTICE_FAIL() << "--to-hf " << dir << ": the checkpoint's model has " << why;
  std::map<std::string, Shape> shapes;
  const std::vector<TensorMap> map = tensor_map(c, shapes, nullptr);
  hf::write_model_folder(dir, hf::export_tensors(*src.layout, src.rows, map, shapes),
                         hf_glm4_moe_config_json(c, tokenizer_type), options);
}

}  // namespace lattice
