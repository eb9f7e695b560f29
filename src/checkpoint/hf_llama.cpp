#include "checkpoint/hf_llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>
#include <vector>

#include "checkpoint/hf_rope_scaling.h"
#include "checkpoint/hf_tensor_map.h"
#include "core/error.h"

namespace lattice {
namespace {

using json = nlohmann::json;

using hf::RowBlock;
using hf::TensorMap;

// The HF names of a mixture-of-experts layer: Qwen3-MoE's (with --qk-layernorm), Qwen2-MoE's
// (with --add-qkv-bias) and DeepSeek-MoE's (with ungated shared experts), or Mixtral's.
struct MoeNames {
  const char *router, *experts, *gate, *up, *down;
};
MoeNames moe_names(const TransformerConfig& c) {
  if (c.qk_layernorm || c.add_qkv_bias || c.moe_shared_expert_intermediate_size > 0)
    return {"mlp.gate.weight", "mlp.experts.", "gate_proj.weight", "up_proj.weight", "down_proj.weight"};
  return {"block_sparse_moe.gate.weight", "block_sparse_moe.experts.", "w1.weight", "w3.weight", "w2.weight"};
}

// Phi-3's fused qkv_proj [(H + 2G) D, C] (q_proj's rows, then k_proj's, then v_proj's) as Megatron's grouped
// linear_qkv: per query group its heads' query rows, then its key and value rows.
TensorMap phi3_grouped_qkv(const TransformerConfig& c, const std::string& lattice, const std::string& qkv) {
  const int64_t D = c.kv_channels, G = c.num_query_groups, R = c.num_attention_heads / G;
  const int64_t Q = c.num_attention_heads * D, KV = G * D;
  TensorMap m{lattice, {}};
  for (int64_t g = 0; g < G; ++g) {
    m.blocks.push_back({qkv, g * R * D, R * D});
    m.blocks.push_back({qkv, Q + g * D, D});
    m.blocks.push_back({qkv, Q + KV + g * D, D});
  }
  return m;
}

// phi3: HuggingFace Phi-3's names (Phi3ForCausalLM: qkv_proj and gate_up_proj fused), else Llama's.
std::vector<TensorMap> tensor_map(const TransformerConfig& c, bool phi3) {
  std::vector<TensorMap> m = {{"embedding.word_embeddings.weight", {{"model.embed_tokens.weight"}}, true}};
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string lat = "decoder.layers." + std::to_string(l) + ".";
    const std::string hf = "model.layers." + std::to_string(l) + ".";
    m.push_back({lat + "input_layernorm.weight", {{hf + "input_layernorm.weight"}}});
    if (phi3) {  // a dense model without biases or norms of q and k (hf_llama_mismatch)
      const int64_t F = c.ffn_hidden_size;
      m.push_back(phi3_grouped_qkv(c, lat + "self_attention.linear_qkv.weight", hf + "self_attn.qkv_proj.weight"));
      m.push_back({lat + "self_attention.linear_proj.weight", {{hf + "self_attn.o_proj.weight"}}});
      m.push_back({lat + "pre_mlp_layernorm.weight", {{hf + "post_attention_layernorm.weight"}}});
      m.push_back({lat + "mlp.linear_fc1.weight", {{hf + "mlp.gate_up_proj.weight", 0, F}, {hf + "mlp.gate_up_proj.weight", F, F}}});
      m.push_back({lat + "mlp.linear_fc2.weight", {{hf + "mlp.down_proj.weight"}}});
      continue;
    }
    m.push_back(hf::grouped_qkv(c, lat + "self_attention.linear_qkv.weight", hf + "self_attn.", "weight"));
    if (c.add_qkv_bias)  // Qwen2: q_proj, k_proj and v_proj have biases, in the same grouped order
      m.push_back(hf::grouped_qkv(c, lat + "self_attention.linear_qkv.bias", hf + "self_attn.", "bias"));
    if (c.qk_layernorm) {  // Qwen3: q_norm and k_norm, RMSNorm weights [head_dim]
      m.push_back({lat + "self_attention.q_layernorm.weight", {{hf + "self_attn.q_norm.weight"}}});
      m.push_back({lat + "self_attention.k_layernorm.weight", {{hf + "self_attn.k_norm.weight"}}});
    }
    m.push_back({lat + "self_attention.linear_proj.weight", {{hf + "self_attn.o_proj.weight"}}});
    m.push_back({lat + "pre_mlp_layernorm.weight", {{hf + "post_attention_layernorm.weight"}}});
    if (c.moe_layer(l)) {  // Mixtral's block_sparse_moe (w1 gate, w3 up, w2 down) or Qwen3-MoE's mlp
      const MoeNames n = moe_names(c);
      m.push_back({lat + "mlp.router.weight", {{hf + n.router}}});
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string x = hf + n.experts + std::to_string(e) + ".";
        const std::string le = lat + "mlp.experts.local_experts." + std::to_string(e) + ".";
        m.push_back({le + "linear_fc1.weight", {{x + n.gate}, {x + n.up}}});
        m.push_back({le + "linear_fc2.weight", {{x + n.down}}});
      }
      if (c.moe_shared_expert_intermediate_size > 0) {  // Qwen2-MoE's gated shared_expert, DeepSeek's shared_experts
        const std::string x = hf + (c.moe_shared_expert_gate ? "mlp.shared_expert." : "mlp.shared_experts.");
        const std::string ls = lat + "mlp.shared_experts.";
        m.push_back({ls + "linear_fc1.weight", {{x + "gate_proj.weight"}, {x + "up_proj.weight"}}});
        m.push_back({ls + "linear_fc2.weight", {{x + "down_proj.weight"}}});
        if (c.moe_shared_expert_gate) m.push_back({ls + "gate_weight", {{hf + "mlp.shared_expert_gate.weight"}}});
      }
      continue;
    }
    m.push_back({lat + "mlp.linear_fc1.weight", {{hf + "mlp.gate_proj.weight"}, {hf + "mlp.up_proj.weight"}}});
    m.push_back({lat + "mlp.linear_fc2.weight", {{hf + "mlp.down_proj.weight"}}});
  }
  m.push_back({"decoder.final_layernorm.weight", {{"model.norm.weight"}}});
  if (c.untie_embeddings_and_output_weights) m.push_back({"output_layer.weight", {{"lm_head.weight"}}, true});
  return m;
}

// Every HF tensor of the model with the shape its config implies (phi3: Phi-3's names).
std::map<std::string, Shape> hf_shapes(const TransformerConfig& c, bool phi3) {
  const int64_t C = c.hidden_size, V = c.vocab_size, F = c.ffn_hidden_size;
  const int64_t Q = c.attention_width(), KV = c.kv_channels * c.num_query_groups;
  std::map<std::string, Shape> s = {{"model.embed_tokens.weight", {V, C}}, {"model.norm.weight", {C}}};
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string hf = "model.layers." + std::to_string(l) + ".";
    s[hf + "input_layernorm.weight"] = {C};
    if (phi3) {
      s[hf + "self_attn.qkv_proj.weight"] = {Q + 2 * KV, C};
      s[hf + "self_attn.o_proj.weight"] = {C, Q};
      s[hf + "post_attention_layernorm.weight"] = {C};
      s[hf + "mlp.gate_up_proj.weight"] = {2 * F, C};
      s[hf + "mlp.down_proj.weight"] = {C, F};
      continue;
    }
    s[hf + "self_attn.q_proj.weight"] = {Q, C};
    s[hf + "self_attn.k_proj.weight"] = {KV, C};
    s[hf + "self_attn.v_proj.weight"] = {KV, C};
    if (c.add_qkv_bias) {
      s[hf + "self_attn.q_proj.bias"] = {Q};
      s[hf + "self_attn.k_proj.bias"] = {KV};
      s[hf + "self_attn.v_proj.bias"] = {KV};
    }
    if (c.qk_layernorm) {
      s[hf + "self_attn.q_norm.weight"] = {c.kv_channels};
      s[hf + "self_attn.k_norm.weight"] = {c.kv_channels};
    }
    s[hf + "self_attn.o_proj.weight"] = {C, Q};
    s[hf + "post_attention_layernorm.weight"] = {C};
    if (c.moe_layer(l)) {
      const MoeNames n = moe_names(c);
      const int64_t Fe = c.moe_ffn_hidden_size;
      s[hf + n.router] = {c.num_experts, C};
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string x = hf + n.experts + std::to_string(e) + ".";
        s[x + n.gate] = {Fe, C};
        s[x + n.up] = {Fe, C};
        s[x + n.down] = {C, Fe};
      }
      if (const int64_t Fs = c.moe_shared_expert_intermediate_size; Fs > 0) {
        const std::string x = hf + (c.moe_shared_expert_gate ? "mlp.shared_expert." : "mlp.shared_experts.");
        s[x + "gate_proj.weight"] = {Fs, C};
        s[x + "up_proj.weight"] = {Fs, C};
        s[x + "down_proj.weight"] = {C, Fs};
        if (c.moe_shared_expert_gate) s[hf + "mlp.shared_expert_gate.weight"] = {1, C};
      }
      continue;
    }
    s[hf + "mlp.gate_proj.weight"] = {F, C};
    s[hf + "mlp.up_proj.weight"] = {F, C};
    s[hf + "mlp.down_proj.weight"] = {C, F};
  }
  if (c.untie_embeddings_and_output_weights) s["lm_head.weight"] = {V, C};
  return s;
}

bool ends_with(const std::string& s, const char* tail) {
  const size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

}  // namespace

namespace {

// "llama", "qwen2", "qwen3", "mistral", "smollm3", "phi3" ... from model_type (else architectures), "" for none of them.
std::string llama_family(const json& j) {
  if (!j.is_object()) return "";
  if (j.contains("model_type")) {
    for (const char* family :
         {"llama", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "mistral", "mixtral", "deepseek", "smollm3", "phi3"})
      if (j["model_type"] == family) return family;
    return "";
  }
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const json& a : j["architectures"]) {
      if (a == "LlamaForCausalLM") return "llama";
      if (a == "Qwen2ForCausalLM") return "qwen2";
      if (a == "Qwen3ForCausalLM") return "qwen3";
      if (a == "Qwen3MoeForCausalLM") return "qwen3_moe";
      if (a == "Qwen2MoeForCausalLM") return "qwen2_moe";
      if (a == "DeepseekForCausalLM") return "deepseek";
      if (a == "MixtralForCausalLM") return "mixtral";
      if (a == "MistralForCausalLM") return "mistral";
      if (a == "SmolLM3ForCausalLM") return "smollm3";
      if (a == "Phi3ForCausalLM") return "phi3";
    }
  return "";
}

// Sliding windows. HuggingFace's sliding_window W lets query i see keys j > i - W (transformers'
// sliding_window_overlay): W keys, lattice's (and Megatron's) window W - 1. Mistral and Mixtral have
// it on every layer (none when null or at least the context), and so has Phi-3; Qwen2 and Qwen3 (and their MoE forms)
// with use_sliding_window true on layers max_window_layers and after, or on the layers layer_types
// names "sliding_attention". DeepSeek-MoE has none.
void hf_sliding_window(const json& j, const std::string& what, const std::string& family, TransformerConfig& c) {
  const bool mistral = family == "mistral" || family == "mixtral" || family == "phi3";
  const bool qwen = family == "qwen2" || family == "qwen2_moe" || family == "qwen3" || family == "qwen3_moe";
  const bool sliding = mistral ? j.contains("sliding_window") && !j["sliding_window"].is_null()
                       : qwen  ? hf::config_bool(j, what, "use_sliding_window", false)
                               : false;
  if (!sliding) return;
  const int64_t W = hf::config_int(j, what, "sliding_window");  // a positive integer
  std::vector<int> pattern(size_t(c.num_layers), 1);
  if (qwen) {
    if (j.contains("layer_types") && !j["layer_types"].is_null()) {
      const json& types = j["layer_types"];
      if (!types.is_array() || int64_t(types.size()) != c.num_layers)
        LATTICE_FAIL() << what << ": layer_types is not a list of " << c.num_layers << " layer types";
      for (size_t l = 0; l < types.size(); ++l) {
        if (types[l] != "sliding_attention" && types[l] != "full_attention")
          LATTICE_FAIL() << what << ": layer_types entry " << types[l].dump()
                         << " is not supported (sliding_attention or full_attention)";
        pattern[l] = types[l] == "sliding_attention" ? 1 : 0;
      }
    } else {  // Qwen2Config's and Qwen3Config's default max_window_layers is 28
      const int64_t first = j.contains("max_window_layers") ? hf::config_int(j, what, "max_window_layers") : 28;
      if (first < 0) LATTICE_FAIL() << what << ": max_window_layers " << first << " is negative";
      for (int64_t l = 0; l < c.num_layers; ++l) pattern[size_t(l)] = l >= first ? 1 : 0;
    }
  } else if (W >= c.max_position_embeddings) {
    return;  // a window at least the context masks nothing
  }
  if (std::none_of(pattern.begin(), pattern.end(), [](int v) { return v == 1; })) return;
  c.window_size = W - 1;
  if (std::any_of(pattern.begin(), pattern.end(), [](int v) { return v == 0; })) c.window_attn_pattern = pattern;
}

// SmolLM3's NoPE layers (modeling_smollm3): no_rope_layers, one entry per layer, 1 for a layer with the
// rotary embedding and 0 for one without (the inverse of lattice's --no-rope-freq pattern); when it is
// absent or null, every no_rope_layer_interval-th layer (default 4) counting from 1 is a NoPE layer.
std::vector<int> smollm3_no_rope_pattern(const json& j, const std::string& what, int64_t layers) {
  std::vector<int> pattern(size_t(layers), 0);
  if (j.contains("no_rope_layers") && !j["no_rope_layers"].is_null()) {
    const json& rope = j["no_rope_layers"];
    if (!rope.is_array() || int64_t(rope.size()) < layers)
      LATTICE_FAIL() << what << ": no_rope_layers is not a list of at least " << layers << " entries";
    for (int64_t l = 0; l < layers; ++l) {
      const json& v = rope[size_t(l)];
      if (!v.is_number_integer() || (v != 0 && v != 1))
        LATTICE_FAIL() << what << ": no_rope_layers entry " << v.dump() << " is not 0 (NoPE) or 1 (rotary)";
      pattern[size_t(l)] = v == 0 ? 1 : 0;
    }
  } else {
    const int64_t n = j.contains("no_rope_layer_interval") ? hf::config_int(j, what, "no_rope_layer_interval") : 4;
    for (int64_t l = 0; l < layers; ++l) pattern[size_t(l)] = (l + 1) % n == 0 ? 1 : 0;
  }
  if (std::none_of(pattern.begin(), pattern.end(), [](int v) { return v == 1; })) pattern.clear();
  return pattern;
}

// LongRoPE's attention factor where rope_scaling gives none (transformers' _compute_longrope_parameters, for a
// config with original_max_position_embeddings, as Phi3Config always has): with s = max / original,
// sqrt(1 + ln s / ln original), 1 for s <= 1.
float longrope_default_attention_factor(int64_t max_positions, int64_t original) {
  const double s = double(max_positions) / double(original);
  return s <= 1.0 ? 1.0f : float(std::sqrt(1.0 + std::log(s) / std::log(double(original))));
}

// Phi-3's rope_scaling longrope (Phi3Config's "su" too): short_factor and long_factor, one per rotated pair;
// the original context is the config's original_max_position_embeddings (Phi3Config's default 4096).
void read_phi3_longrope(const json& j, const json& s, const std::string& what, TransformerConfig& c) {
  for (const char* key : {"short_factor", "long_factor"}) {
    if (!s.contains(key) || !s[key].is_array() || s[key].empty())
      LATTICE_FAIL() << what << ": rope_scaling longrope has no " << key << " list";
    std::vector<float>& out = std::string(key) == "short_factor" ? c.longrope_short_factor : c.longrope_long_factor;
    for (const json& v : s[key]) {
      if (!v.is_number()) LATTICE_FAIL() << what << ": rope_scaling longrope " << key << " holds " << v.dump();
      out.push_back(v.get<float>());
    }
  }
  c.longrope_original_max_position_embeddings =
      j.contains("original_max_position_embeddings") ? hf::config_int(j, what, "original_max_position_embeddings") : 4096;
  c.longrope_attention_factor =
      s.contains("attention_factor") && !s["attention_factor"].is_null()
          ? float(hf::config_positive(s, what + " rope_scaling", "attention_factor", 1.0))
          : longrope_default_attention_factor(c.max_position_embeddings, c.longrope_original_max_position_embeddings);
}

}  // namespace

bool is_hf_llama_config(const json& j) { return !llama_family(j).empty(); }

const char* hf_llama_family_name(const TransformerConfig& c, bool phi3) {
  if (phi3) return "Phi-3";
  if (!c.no_rope_pattern.empty()) return "SmolLM3";
  if (c.moe())
    return c.qk_layernorm                                ? "Qwen3-MoE"
           : c.add_qkv_bias                              ? "Qwen2-MoE"
           : c.moe_shared_expert_intermediate_size > 0   ? "DeepSeek-MoE"
                                                         : "Mixtral";
  return c.qk_layernorm ? "Qwen3" : c.add_qkv_bias ? "Qwen2" : c.window_size >= 0 ? "Mistral" : "Llama";
}

std::string hf_llama_family_name(const json& config) {
  const std::string f = llama_family(config);
  return f == "qwen2"       ? "Qwen2"
         : f == "qwen3"     ? "Qwen3"
         : f == "qwen3_moe" ? "Qwen3-MoE"
         : f == "qwen2_moe" ? "Qwen2-MoE"
         : f == "deepseek"  ? "DeepSeek-MoE"
         : f == "mistral"   ? "Mistral"
         : f == "mixtral"   ? "Mixtral"
         : f == "llama"     ? "Llama"
         : f == "smollm3"   ? "SmolLM3"
         : f == "phi3"      ? "Phi-3"
                            : "";
}

TransformerConfig hf_llama_config(const json& j, const std::string& what, int64_t divisible_by) {
  const std::string family = llama_family(j);
  if (family.empty())
    LATTICE_FAIL() << what << ": not a Llama, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE, Mistral, Mixtral, DeepSeek-MoE, SmolLM3 or Phi-3 config (model_type "
                   << j.value("model_type", json()).dump() << ")";
  const bool qwen2_moe = family == "qwen2_moe";
  const bool qwen2 = family == "qwen2" || qwen2_moe, qwen3 = family == "qwen3" || family == "qwen3_moe";
  const bool qwen3_moe = family == "qwen3_moe", mixtral = family == "mixtral", deepseek = family == "deepseek";
  const bool smollm3 = family == "smollm3", phi3 = family == "phi3";
  TransformerConfig c;
  hf::read_decoder_sizes(j, what, c);
  c.ffn_hidden_size = hf::config_int(j, what, "intermediate_size");
  hf::read_grouped_heads(j, what, c, !qwen2);  // Qwen2's heads are hidden / heads wide
  const std::string act = j.value("hidden_act", std::string("silu"));
  if (act != "silu") LATTICE_FAIL() << what << ": hidden_act \"" << act << "\" is not supported (silu: SwiGLU)";
  if (!qwen2 && hf::config_bool(j, what, "attention_bias", false))
    LATTICE_FAIL() << what << ": attention_bias true is not supported (lattice's Llama has no linear biases"
                   << (qwen3 ? "; Qwen3's also biases o_proj" : "") << ")";
  if (!qwen2 && hf::config_bool(j, what, "mlp_bias", false))
    LATTICE_FAIL() << what << ": mlp_bias true is not supported (lattice's Llama has no linear biases)";
  hf_sliding_window(j, what, family, c);
  if (smollm3) {
    if (hf::config_bool(j, what, "use_sliding_window", false))
      LATTICE_FAIL() << what << ": use_sliding_window true is not supported (SmolLM3's window on its NoPE layers)";
    c.no_rope_pattern = smollm3_no_rope_pattern(j, what, c.num_layers);
  }
  // Linear scaling (positions divided by its factor) is Megatron's --rotary-seq-len-interpolation-factor;
  // llama3 (Llama 3.1's frequency-dependent scaling) is --use-rope-scaling with its four values.
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& s = j["rope_scaling"];
    const std::string type = s.is_object() ? s.value("rope_type", s.value("type", std::string())) : "";
    const std::string where = what + " rope_scaling";
    if (type == "linear") {
      c.rotary_seq_len_interpolation_factor = float(hf::config_positive(s, where, "factor", 0.0));
      if (c.rotary_seq_len_interpolation_factor <= 0.0f) LATTICE_FAIL() << what << ": rope_scaling has no factor";
    } else if (type == "llama3") {
      for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
        if (!s.contains(key)) LATTICE_FAIL() << what << ": rope_scaling llama3 has no " << key;
      c.use_rope_scaling = true;
      c.rope_scaling_factor = float(hf::config_positive(s, where, "factor", 0.0));
      c.rope_scaling_low_freq_factor = float(hf::config_positive(s, where, "low_freq_factor", 0.0));
      c.rope_scaling_high_freq_factor = float(hf::config_positive(s, where, "high_freq_factor", 0.0));
      c.rope_scaling_original_max_position_embeddings = hf::config_int(s, where, "original_max_position_embeddings");
    } else if (type == "yarn") {
      hf::read_yarn_rope_scaling(j, s, what, c);
    } else if (phi3 && (type == "longrope" || type == "su")) {
      read_phi3_longrope(j, s, what, c);
    } else {
      LATTICE_FAIL() << what << ": rope_scaling " << s.dump().substr(0, 200) << " is not supported (none, linear, llama3 or yarn"
                     << (phi3 ? "; Phi-3's longrope" : "") << ")";
    }
  }
  c.position_embedding_type = c.position_embedding_type == "yarn" ? "yarn" : "rope";
  // Phi-3 rotates the first partial_rotary_factor of each head's dims (Phi-4-mini 0.75), rotate_half pairs.
  c.rotary_percent = phi3 ? hf::rope_value(j, what, "partial_rotary_factor", 1.0) : 1.0;
  if (c.rotary_percent > 1.0) LATTICE_FAIL() << what << ": partial_rotary_factor " << c.rotary_percent << " exceeds 1";
  c.rotary_interleaved = false;
  const int64_t head_dim = c.kv_channels > 0 ? c.kv_channels : c.hidden_size / c.num_attention_heads;
  if (const size_t pairs = size_t(double(head_dim) * c.rotary_percent) / 2;
      c.longrope() && (c.longrope_short_factor.size() != pairs || c.longrope_long_factor.size() != pairs))
    LATTICE_FAIL() << what << ": rope_scaling longrope has " << c.longrope_short_factor.size() << " short and "
                   << c.longrope_long_factor.size() << " long factors; the rotation has " << pairs << " pairs of dims";
  c.rotary_base = float(hf::config_positive(j, what, "rope_theta", smollm3 ? 2000000.0 : 10000.0));  // the configs' defaults
  c.normalization = "RMSNorm";
  c.layernorm_epsilon = float(hf::config_positive(j, what, "rms_norm_eps", phi3 ? 1e-5 : 1e-6));  // the configs' defaults
  c.swiglu = true;
  c.add_bias_linear = false;
  c.add_qkv_bias = qwen2;
  c.qk_layernorm = qwen3;  // q_norm, k_norm: RMSNorm of each head with rms_norm_eps
  if (mixtral) {  // every layer's MLP: num_local_experts experts of intermediate_size, top num_experts_per_tok
    c.num_experts = hf::config_int(j, what, "num_local_experts");
    c.moe_router_topk = hf::config_int(j, what, "num_experts_per_tok");
    c.moe_ffn_hidden_size = c.ffn_hidden_size;
  }
  if (qwen3_moe || qwen2_moe) {
    c.num_experts = hf::config_int(j, what, "num_experts");
    c.moe_router_topk = hf::config_int(j, what, "num_experts_per_tok");
    c.moe_ffn_hidden_size = hf::config_int(j, what, "moe_intermediate_size");
    // norm_topk_prob true: the chosen experts' probabilities renormalized (the softmax over their
    // logits, lattice's default); false: as the softmax over all experts gave them
    c.moe_router_pre_softmax = !hf::config_bool(j, what, "norm_topk_prob", false);
    c.moe_layer_pattern = hf::qwen_moe_layers(j, what, c.num_layers);
  }
  if (deepseek) {  // DeepSeek-MoE (v1): routed experts, ungated shared ones, the first layers dense
    if (j.value("scoring_func", std::string("softmax")) != "softmax")
      LATTICE_FAIL() << what << ": scoring_func " << j["scoring_func"].dump() << " is not supported (softmax)";
    c.num_experts = hf::config_int(j, what, "n_routed_experts");
    c.moe_router_topk = hf::config_int(j, what, "num_experts_per_tok");
    c.moe_ffn_hidden_size = hf::config_int(j, what, "moe_intermediate_size");
    c.moe_router_pre_softmax = !hf::config_bool(j, what, "norm_topk_prob", false);
    if (j.contains("n_shared_experts") && !j["n_shared_experts"].is_null())
      c.moe_shared_expert_intermediate_size = c.moe_ffn_hidden_size * hf::config_int(j, what, "n_shared_experts");
    // modeling_deepseek: layer l is an MoE layer when l >= first_k_dense_replace and l % moe_layer_freq == 0
    const int64_t first = j.contains("first_k_dense_replace") ? j.value("first_k_dense_replace", int64_t(0)) : 0;
    const int64_t freq = j.contains("moe_layer_freq") ? hf::config_int(j, what, "moe_layer_freq") : 1;
    if (first < 0) LATTICE_FAIL() << what << ": first_k_dense_replace " << first << " is negative";
    c.moe_layer_pattern = hf::deepseek_moe_layers(c.num_layers, std::min(first, c.num_layers), freq);
  }
  if (qwen2_moe) {  // every sparse layer's shared_expert (gated by shared_expert_gate) beside the routed ones
    c.moe_shared_expert_intermediate_size = hf::config_int(j, what, "shared_expert_intermediate_size");
    c.moe_shared_expert_gate = true;
  }
  c.untie_embeddings_and_output_weights = !hf::config_bool(j, what, "tie_word_embeddings", smollm3);  // SmolLM3Config ties
  c.make_vocab_size_divisible_by = divisible_by;
  c.hidden_dropout = c.attention_dropout = 0.0f;
  c.finalize();
  return c;
}

json hf_llama_config_json(const TransformerConfig& c, const std::string& tokenizer_type, bool phi3) {
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"head_dim", c.kv_channels},
            {"hidden_act", "silu"},
            {"hidden_size", c.hidden_size},
            {"initializer_range", 0.02},
            {"intermediate_size", c.ffn_hidden_size},
            {"max_position_embeddings", c.max_position_embeddings},
            {"mlp_bias", false},
            {"model_type", "llama"},
            {"num_attention_heads", c.num_attention_heads},
            {"num_hidden_layers", c.num_layers},
            {"num_key_value_heads", c.num_query_groups},
            {"pretraining_tp", 1},
            {"rms_norm_eps", hf::shortest_float(c.layernorm_epsilon)},
            {"rope_scaling", nullptr},  // or linear scaling, below
            {"rope_theta", hf::shortest_float(c.rotary_base)},
            {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
            {"torch_dtype", "float32"},
            {"use_cache", true},
            {"vocab_size", c.vocab_size}};
  if (c.rotary_seq_len_interpolation_factor > 0.0f)
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", hf::shortest_float(c.rotary_seq_len_interpolation_factor)}};
  if (c.yarn()) j["rope_scaling"] = hf::yarn_rope_scaling_json(c);
  if (c.use_rope_scaling)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", hf::shortest_float(c.rope_scaling_factor)},
                         {"low_freq_factor", hf::shortest_float(c.rope_scaling_low_freq_factor)},
                         {"high_freq_factor", hf::shortest_float(c.rope_scaling_high_freq_factor)},
                         {"original_max_position_embeddings", c.rope_scaling_original_max_position_embeddings}};
  if (c.add_qkv_bias) {
    // Qwen2Config: the biases are implied; head_dim is hidden / heads (hf_llama_mismatch checks it).
    for (const char* key : {"attention_bias", "head_dim", "mlp_bias", "pretraining_tp"}) j.erase(key);
    j["architectures"] = {"Qwen2ForCausalLM"};
    j["model_type"] = "qwen2";
    j["use_sliding_window"] = false;
    j["sliding_window"] = c.max_position_embeddings;
    j["max_window_layers"] = c.num_layers;
  }
  if (c.qk_layernorm) {  // Qwen3Config: head_dim and attention_bias kept
    for (const char* key : {"mlp_bias", "pretraining_tp"}) j.erase(key);
    j["architectures"] = {"Qwen3ForCausalLM"};
    j["model_type"] = "qwen3";
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  }
  if (c.moe() && (c.qk_layernorm || c.add_qkv_bias)) {
    // Qwen3MoeConfig, or Qwen2MoeConfig (on Qwen2's, with the shared expert): the experts' fields,
    // intermediate_size the dense layers'
    const bool qwen2 = !c.qk_layernorm;
    j["architectures"] = {qwen2 ? "Qwen2MoeForCausalLM" : "Qwen3MoeForCausalLM"};
    j["model_type"] = qwen2 ? "qwen2_moe" : "qwen3_moe";
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.moe_router_topk;
    j["moe_intermediate_size"] = c.moe_ffn_hidden_size;
    if (qwen2) j["shared_expert_intermediate_size"] = c.moe_shared_expert_intermediate_size;
    j["norm_topk_prob"] = !c.moe_router_pre_softmax;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = json::array();
    for (int64_t l = 0; l < c.num_layers; ++l)
      if (!c.moe_layer(l)) j["mlp_only_layers"].push_back(l);
    j["router_aux_loss_coef"] = 0.001;
    j["output_router_logits"] = false;
  } else if (c.moe() && c.moe_shared_expert_intermediate_size > 0) {  // DeepseekConfig (v1, DeepSeek-MoE)
    for (const char* key : {"head_dim", "mlp_bias"}) j.erase(key);
    const int64_t first = hf::deepseek_first_k_dense(c);  // hf_llama_mismatch refuses -1
    j["architectures"] = {"DeepseekForCausalLM"};
    j["model_type"] = "deepseek";
    j["n_routed_experts"] = c.num_experts;
    j["n_shared_experts"] = c.moe_shared_expert_intermediate_size / c.moe_ffn_hidden_size;
    j["num_experts_per_tok"] = c.moe_router_topk;
    j["moe_intermediate_size"] = c.moe_ffn_hidden_size;
    j["moe_layer_freq"] = 1;
    j["first_k_dense_replace"] = first;
    j["norm_topk_prob"] = !c.moe_router_pre_softmax;
    j["scoring_func"] = "softmax";
    j["aux_loss_alpha"] = 0.001;
    j["seq_aux"] = true;
  } else if (c.moe()) {  // MixtralConfig: intermediate_size is each expert's
    for (const char* key : {"attention_bias", "mlp_bias", "pretraining_tp"}) j.erase(key);
    j["architectures"] = {"MixtralForCausalLM"};
    j["model_type"] = "mixtral";
    j["num_local_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.moe_router_topk;
    j["intermediate_size"] = c.moe_ffn_hidden_size;
    j["sliding_window"] = nullptr;
    j["router_aux_loss_coef"] = 0.02;
    j["output_router_logits"] = false;
  }
  if (!c.no_rope_pattern.empty()) {  // SmolLM3Config: no_rope_layers 1 for a rotary layer, 0 for a NoPE one
    for (const char* key : {"pretraining_tp"}) j.erase(key);
    j["architectures"] = {"SmolLM3ForCausalLM"};
    j["model_type"] = "smollm3";
    j["no_rope_layers"] = json::array();
    for (int v : c.no_rope_pattern) j["no_rope_layers"].push_back(v == 0 ? 1 : 0);
    for (int64_t n = 1; n <= c.num_layers; ++n) {  // the interval that makes the same list, when one does
      bool same = true;
      for (int64_t l = 0; l < c.num_layers; ++l) same = same && (c.no_rope_pattern[size_t(l)] == 1) == ((l + 1) % n == 0);
      if (same) {
        j["no_rope_layer_interval"] = n;
        break;
      }
    }
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  }
  if (c.window_size >= 0) {  // HuggingFace's sliding_window counts the query's own key: W + 1
    const int64_t W = c.window_size + 1;
    if (c.qk_layernorm || c.add_qkv_bias) {  // Qwen: the window from max_window_layers on
      int64_t first = 0;
      while (first < c.num_layers && c.attention_window(first) < 0) ++first;
      j["use_sliding_window"] = true;
      j["sliding_window"] = W;
      j["max_window_layers"] = first;
    } else {  // Mistral (MixtralConfig already has the field)
      if (!c.moe()) {
        for (const char* key : {"attention_bias", "mlp_bias", "pretraining_tp"}) j.erase(key);
        j["architectures"] = {"MistralForCausalLM"};
        j["model_type"] = "mistral";
      }
      j["sliding_window"] = W;
    }
  }
  if (phi3) {  // Phi3Config: head_dim is hidden / heads; sliding_window as Mistral's
    for (const char* key : {"attention_bias", "head_dim", "mlp_bias", "pretraining_tp"}) j.erase(key);
    j["architectures"] = {"Phi3ForCausalLM"};
    j["model_type"] = "phi3";
    j["partial_rotary_factor"] = c.rotary_percent;
    j["original_max_position_embeddings"] = c.max_position_embeddings;
    if (c.longrope()) {  // the attention factor written when transformers would not make the same one
      const int64_t original = c.longrope_original_max_position_embeddings;
      j["original_max_position_embeddings"] = original;
      j["rope_scaling"] = {{"type", "longrope"},
                           {"short_factor", json::array()},
                           {"long_factor", json::array()}};
      for (float v : c.longrope_short_factor) j["rope_scaling"]["short_factor"].push_back(hf::shortest_float(v));
      for (float v : c.longrope_long_factor) j["rope_scaling"]["long_factor"].push_back(hf::shortest_float(v));
      if (longrope_default_attention_factor(c.max_position_embeddings, original) != c.longrope_attention_factor)
        j["rope_scaling"]["attention_factor"] = hf::shortest_float(c.longrope_attention_factor);
    }
    j["sliding_window"] = c.window_size >= 0 ? json(c.window_size + 1) : json(nullptr);
    j["resid_pdrop"] = j["embd_pdrop"] = 0.0;
  }
  if (!tokenizer_type.empty()) j[kHfTokenizerKey] = tokenizer_type;
  return j;
}

std::string hf_llama_mismatch(const TransformerConfig& c, bool phi3) {
  if (phi3) {  // Phi-3: a dense Llama with partial rotation and Mistral's window
    const std::string why =
        c.hybrid()              ? "--hybrid-override-pattern"
        : c.gated_delta_net()   ? "--experimental-attention-variant gated_delta_net"
        : c.multi_latent_attention ? "--multi-latent-attention"
        : c.moe()               ? "--num-experts"
        : c.add_qkv_bias        ? "--add-qkv-bias"
        : c.qk_layernorm        ? "--qk-layernorm"
        : !c.no_rope_pattern.empty() ? "--no-rope-freq"
        : !c.window_attn_pattern.empty() ? "--window-attn-skip-freq"
        : c.kv_channels * c.num_attention_heads != c.hidden_size ? "--kv-channels other than hidden / heads"
                                                                  : "";
    if (!why.empty()) return why + " (HuggingFace Phi-3 has no such setting; --hf-model-type phi3)";
    if (c.yarn() || c.use_rope_scaling || c.rotary_seq_len_interpolation_factor > 0.0f)
      return "rope scaling (lattice writes HuggingFace Phi-3 without rope_scaling; --hf-model-type phi3)";
  }  // then Llama's checks but the whole head's rotation and LongRoPE
  if (c.longrope() && !phi3)
    return "LongRoPE (--longrope-short-factor; HuggingFace Llama has none, Phi-3 has it: --hf-model-type phi3)";
  if (c.attention_output_gate)
    return "the attention output gate (--attention-output-gate; no HuggingFace Llama-family model has one)";
  if (!c.rope())
    return c.learned_positions() ? "learned absolute positions (HuggingFace Llama has the rotary embedding)"
                                 : "no position embedding (--position-embedding-type none; HuggingFace Llama has the "
                                   "rotary embedding)";
  if (c.rotary_percent != 1.0 && !phi3) {
    std::ostringstream s;
    s << "--rotary-percent " << c.rotary_percent
      << " (HuggingFace Llama rotates every dim; Phi-3 a part of each head: --hf-model-type phi3)";
    return s.str();
  }
  if (c.rotary_interleaved) return "--rotary-interleaved (HuggingFace Llama rotates rotate_half pairs)";
  if (!c.no_rope_pattern.empty() &&
      (c.moe() || c.qk_layernorm || c.add_qkv_bias || c.window_size >= 0 || c.qk_l2_norm || c.softmax_sink()))
    return "--no-rope-freq with " +
           std::string(c.moe()            ? "--num-experts"
                       : c.qk_layernorm   ? "--qk-layernorm"
                       : c.add_qkv_bias   ? "--add-qkv-bias"
                       : c.window_size >= 0 ? "--window-size"
                       : c.qk_l2_norm     ? "--qk-l2-norm"
                                          : "--softmax-type " + c.softmax_type) +
           " (HuggingFace SmolLM3, the Llama family's model with NoPE layers, is a dense Llama)";
  if (c.qk_l2_norm)
    return "--qk-l2-norm (no HuggingFace Llama-family model normalizes its queries and keys without weights before "
           "the rotary embedding)";
  if (!c.rmsnorm()) return "LayerNorm (HuggingFace Llama has RMSNorm)";
  if (c.quick_geglu) return "a quick GEGLU MLP (--quick-geglu; HuggingFace Llama's is SwiGLU)";
  if (!c.swiglu) return "a GELU MLP (HuggingFace Llama's is SwiGLU)";
  if (c.glu_linear_offset != 0.0f) return "--glu-linear-offset (HuggingFace Llama's SwiGLU has no offset)";
  if (c.activation_func_clamp_value > 0.0f)
    return "--activation-func-clamp-value (HuggingFace Llama's SwiGLU has no clamps)";
  if (c.apply_layernorm_1p)
    return "zero-centered norm weights (--apply-layernorm-1p; HuggingFace Llama's RMSNorm scales by its weight)";
  if (c.add_bias_linear)
    return "linear biases (HuggingFace Llama has none, Qwen2 QKV's only: --disable-bias-linear [--add-qkv-bias])";
  if (c.moe() && c.add_qkv_bias && !(c.moe_shared_expert_intermediate_size > 0 && c.moe_shared_expert_gate))
    return "--num-experts with --add-qkv-bias but without gated shared experts (HuggingFace Qwen2-MoE has them: "
           "--moe-shared-expert-intermediate-size with --moe-shared-expert-gate; Mixtral and Qwen3-MoE have no QKV "
           "biases)";
  const int64_t Fs = c.moe_shared_expert_intermediate_size;
  const bool deepseek = c.moe() && Fs > 0 && !c.moe_shared_expert_gate && !c.add_qkv_bias && !c.qk_layernorm;
  if (c.moe() && Fs > 0 && !(c.add_qkv_bias && c.moe_shared_expert_gate) && !deepseek)
    return "shared experts other than Qwen2-MoE's (gated, with --add-qkv-bias) or DeepSeek-MoE's (ungated, without "
           "--add-qkv-bias and --qk-layernorm)";
  if (deepseek && c.kv_channels * c.num_attention_heads != c.hidden_size)
    return "--kv-channels other than hidden / heads in a DeepSeek-MoE-style model (HuggingFace DeepSeek-MoE has no "
           "head_dim)";
  if (deepseek && Fs % c.moe_ffn_hidden_size != 0)
    return "--moe-shared-expert-intermediate-size not a multiple of --moe-ffn-hidden-size (HuggingFace DeepSeek-MoE's "
           "shared experts are n_shared_experts experts)";
  if (deepseek && hf::deepseek_first_k_dense(c) < 0)  // first_k_dense_replace dense layers, then MoE layers
    return "--moe-layer-freq with a dense layer after an MoE layer (HuggingFace DeepSeek-MoE's dense layers are "
           "its first_k_dense_replace first)";
  if (c.moe() && c.moe_router_num_groups > 0)
    return "--moe-router-num-groups (HuggingFace's MoE models route over every expert)";
  if (c.moe() && c.moe_router_sigmoid())
    return "--moe-router-score-function sigmoid (HuggingFace's MoE models route by the softmax)";
  if (c.moe() && c.moe_router_topk_scaling_factor != 1.0f)
    return "--moe-router-topk-scaling-factor (HuggingFace's MoE models do not scale the gates)";
  if (c.moe() && c.moe_apply_probs_on_input)
    return "--moe-apply-probs-on-input (HuggingFace's Mixtral, Qwen and DeepSeek MoE weigh the experts' outputs)";
  if (c.moe() && !c.moe_layer_pattern.empty() && !c.qk_layernorm && !c.add_qkv_bias && !deepseek)
    return "--moe-layer-freq in a Mixtral-style model (HuggingFace Mixtral's every layer is a mixture of experts; "
           "Qwen3-MoE's and Qwen2-MoE's mlp_only_layers need --qk-layernorm or --add-qkv-bias)";
  if (c.moe() && c.moe_router_pre_softmax && !c.qk_layernorm && !c.add_qkv_bias && !deepseek)
    return "--moe-router-pre-softmax in a Mixtral-style model (HuggingFace Mixtral renormalizes the chosen experts' "
           "probabilities; Qwen3-MoE's and Qwen2-MoE's norm_topk_prob false need --qk-layernorm or --add-qkv-bias)";
  if (c.qk_layernorm && c.add_qkv_bias)
    return "--qk-layernorm with --add-qkv-bias (HuggingFace Qwen3's attention_bias also biases o_proj)";
  if (c.add_qkv_bias && c.kv_channels * c.num_attention_heads != c.hidden_size)
    return "--kv-channels other than hidden / heads with --add-qkv-bias (HuggingFace Qwen2 has no head_dim)";
  if (c.use_rope_scaling && c.rotary_seq_len_interpolation_factor > 0.0f)
    return "--use-rope-scaling with --rotary-seq-len-interpolation-factor (HuggingFace's rope_scaling is one or the other)";
  if (c.softmax_sink())
    return "attention sinks (--softmax-type " + c.softmax_type + "; HuggingFace Llama's softmax has none)";
  if (c.window_size >= 0) {
    if (deepseek) return "--window-size in a DeepSeek-MoE-style model (HuggingFace DeepSeek-MoE has no sliding window)";
    if (c.qk_layernorm || c.add_qkv_bias) {  // Qwen: full layers first, then window layers
      int64_t first = 0;
      while (first < c.num_layers && c.attention_window(first) < 0) ++first;
      for (int64_t l = first; l < c.num_layers; ++l)
        if (c.attention_window(l) < 0)
          return "--window-attn-skip-freq with a full-attention layer after a window layer (HuggingFace Qwen2's and "
                 "Qwen3's window layers are those from max_window_layers on)";
    } else if (!c.window_attn_pattern.empty()) {
      return "--window-attn-skip-freq in a Mistral-style model (HuggingFace Mistral and Mixtral have the window on "
             "every layer; Qwen2's and Qwen3's max_window_layers need --add-qkv-bias or --qk-layernorm)";
    }
  }
  return "";
}

hf::ImportPlan hf_llama_import_plan(const TransformerConfig& c, const SafetensorsFile& f, bool phi3) {
  const std::map<std::string, Shape> shapes = hf_shapes(c, phi3);
  hf::check_tensor_shapes(f, shapes);
  hf::check_no_other_tensors(f, shapes, c,
                             [](const std::string& name) { return ends_with(name, ".self_attn.rotary_emb.inv_freq"); });
  return {tensor_map(c, phi3), shapes};
}

SafetensorsWriter export_hf_llama_tensors(const GPTModel& model, bool phi3) {
  const TransformerConfig& c = model.config();
  return hf::export_tensors(model, tensor_map(c, phi3), hf_shapes(c, phi3));
}

namespace {

hf::ConfigFn config_fn(int64_t divisible_by) {
  return [divisible_by](const json& j, const std::string& what, const SafetensorsFile&) {
    return hf_llama_config(j, what, divisible_by);
  };
}

hf::ImportPlan import_plan(const TransformerConfig& c, const SafetensorsFile& f, const json& config) {
  return hf_llama_import_plan(c, f, llama_family(config) == "phi3");
}

}  // namespace

HfModel load_hf_llama(const std::string& dir, int64_t divisible_by, int64_t seq_length, bool gradients) {
  return hf::load_source(open_hf_llama(dir, divisible_by), seq_length, gradients);
}

HfSource open_hf_llama(const std::string& dir, int64_t divisible_by) {
  return hf::open_planned_folder(dir, config_fn(divisible_by), import_plan);
}

void save_hf_llama(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                   const hf::ExportOptions& options) {
  save_hf_llama(dir, hf::model_source(model), tokenizer_type, options);
}

void save_hf_llama(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                   const hf::ExportOptions& options) {
  const TransformerConfig& c = src.config;
  if (!options.model_type.empty() && options.model_type != "phi3")
    LATTICE_FAIL() << "--hf-model-type " << options.model_type << ": a Llama-family model is written as its family "
                   << "(Llama, Qwen, Mistral, Mixtral, DeepSeek-MoE, SmolLM3) or, with phi3, as Phi-3";
  const bool phi3 = options.model_type == "phi3";
  const std::string why = hf_llama_mismatch(c, phi3);
  if (!why.empty()) LATTICE_FAIL() << "--to-hf " << dir << ": the checkpoint's model has " << why;
  hf::write_model_folder(dir, hf::export_tensors(*src.layout, src.rows, tensor_map(c, phi3), hf_shapes(c, phi3)),
                         hf_llama_config_json(c, tokenizer_type, phi3), options);
}

}  // namespace lattice
