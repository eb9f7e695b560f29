#include "checkpoint/hf_deepseek_mla.h"

#include <cmath>
#include <map>
#include <sstream>
#include <vector>

#include "checkpoint/hf_deepseek_moe.h"
#include "checkpoint/hf_rope_scaling.h"
#include "checkpoint/hf_tensor_map.h"
#include "core/error.h"
#include "model/rotary_embedding.h"

namespace lattice {
namespace {

using json = nlohmann::json;
using hf::TensorMap;

constexpr const char* kKimiK2 = "kimi_k2";
// GLM-4.7-Flash (Glm4MoeLiteForCausalLM): DeepSeek-V3's attention and experts, GLM's config (mlp_layer_types, the
// rotary parameters in rope_parameters, rms_norm_eps 1e-5 beside the latents' 1e-6), prediction layers without
// copies of the embedding and lm_head.
constexpr const char* kGlmLite = "glm4_moe_lite";

// Whether config.json is GLM-4.7-Flash's (model_type, else the architectures).
bool glm_lite(const json& j) {
  if (!j.is_object()) return false;
  if (j.contains("model_type")) return j["model_type"] == kGlmLite;
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const json& a : j["architectures"])
      if (a == "Glm4MoeLiteForCausalLM") return true;
  return false;
}

// transformers' DeepseekV3RMSNorm of the latents (q_a_layernorm, kv_a_layernorm) keeps its default eps whatever
// rms_norm_eps is (lattice's --mla-latent-norm-epsilon).
constexpr double kLatentNormEps = 1e-6;

bool has(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

// The HF tensors of layer l (model.layers.<l>.) and the lattice parameters they make, under `lat`
// (decoder.layers.<l>., or a prediction depth's transformer layer); shapes: every HF tensor's.
void layer_tensors(const TransformerConfig& c, int64_t l, const std::string& lat, std::vector<TensorMap>& m,
                   std::map<std::string, Shape>& s, const SafetensorsFile* file) {
  const int64_t C = c.hidden_size, H = c.num_attention_heads, Dq = c.mla_qk_dim(), Rq = c.q_lora_rank;
  const int64_t Rkv = c.kv_lora_rank, Dr = c.qk_pos_emb_head_dim, Dnv = c.qk_head_dim + c.v_head_dim;
  const std::string hf = "model.layers." + std::to_string(l) + ".";
  auto one = [&](const std::string& lattice, const std::string& name, const Shape& shape) {
    m.push_back({lat + lattice, {{hf + name}}});
    s[hf + name] = shape;
  };
  one("input_layernorm.weight", "input_layernorm.weight", {C});
  if (Rq == 0) {
    one("self_attention.linear_q_proj.weight", "self_attn.q_proj.weight", {H * Dq, C});
  } else {
    one("self_attention.linear_q_down_proj.weight", "self_attn.q_a_proj.weight", {Rq, C});
    one("self_attention.q_layernorm.weight", "self_attn.q_a_layernorm.weight", {Rq});
    one("self_attention.linear_q_up_proj.weight", "self_attn.q_b_proj.weight", {H * Dq, Rq});
  }
  one("self_attention.linear_kv_down_proj.weight", "self_attn.kv_a_proj_with_mqa.weight", {Rkv + Dr, C});
  one("self_attention.kv_layernorm.weight", "self_attn.kv_a_layernorm.weight", {Rkv});
  one("self_attention.linear_kv_up_proj.weight", "self_attn.kv_b_proj.weight", {H * Dnv, Rkv});
  one("self_attention.linear_proj.weight", "self_attn.o_proj.weight", {C, H * c.v_head_dim});
  one("pre_mlp_layernorm.weight", "post_attention_layernorm.weight", {C});
  hf::deepseek_mlp_tensors(c, l, lat, hf, m, s, file);
}

// copies: the prediction layers' copies of the embedding and the output layer too (DeepSeek-V3's files have them,
// GLM-4.7-Flash's not; a file's are read only to check them, hf::check_mtp_copies).
// file: the file being read (its experts' layout), or null (export: per expert).
std::vector<TensorMap> tensor_map(const TransformerConfig& c, std::map<std::string, Shape>& shapes, bool copies,
                                  const SafetensorsFile* file) {
  return hf::deepseek_layout_tensors(
      c, [&](int64_t l, const std::string& lat, auto& m, auto& s) { layer_tensors(c, l, lat, m, s, file); }, copies,
      shapes);
}

// "deepseek_v3" (with Kimi-K2's "kimi_k2": DeepSeek-V3's architecture under its own model_type, so that serving
// engines tell them apart; and GLM-4.7-Flash's), "deepseek_v2" (model_type, else the architectures), or "".
std::string deepseek_family(const json& j) {
  if (!j.is_object()) return "";
  if (glm_lite(j)) return "deepseek_v3";
  if (j.contains("model_type"))
    return j["model_type"] == "deepseek_v3" || j["model_type"] == kKimiK2 ? "deepseek_v3"
           : j["model_type"] == "deepseek_v2"                            ? "deepseek_v2"
                                                                         : "";
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const json& a : j["architectures"]) {
      if (a == "DeepseekV3ForCausalLM") return "deepseek_v3";
      if (a == "DeepseekV2ForCausalLM") return "deepseek_v2";
    }
  return "";
}

}  // namespace

bool is_hf_deepseek_mla_config(const json& j) { return !deepseek_family(j).empty(); }

const char* hf_deepseek_family_name(const TransformerConfig& c, const std::string& model_type) {
  return model_type == kKimiK2 ? "Kimi-K2" : model_type == kGlmLite ? "GLM-4.7-Flash"
         : c.moe_router_sigmoid() ? "DeepSeek-V3" : "DeepSeek-V2";
}

std::string hf_deepseek_recorded_type(const TransformerConfig& c, const std::string& recorded) {
  return c.moe_router_sigmoid() && (recorded == kKimiK2 || recorded == kGlmLite) ? recorded : "";
}

std::string hf_deepseek_family_name(const json& config) {
  const std::string f = deepseek_family(config);
  if (f == "deepseek_v3" && config.value("model_type", "") == kKimiK2) return "Kimi-K2";
  if (glm_lite(config)) return "GLM-4.7-Flash";
  return f == "deepseek_v3" ? "DeepSeek-V3" : f == "deepseek_v2" ? "DeepSeek-V2" : "";
}

std::string hf_deepseek_model_type(const TransformerConfig& c, const std::string& model_type) {
  const bool v3 = c.moe_router_sigmoid();
  if (model_type.empty()) return v3 ? "deepseek_v3" : "deepseek_v2";
  if (model_type == (v3 ? "deepseek_v3" : "deepseek_v2") || (v3 && (model_type == kKimiK2 || model_type == kGlmLite)))
    return model_type;
  LATTICE_FAIL() << "--hf-model-type " << model_type << ": the checkpoint's model is written as "
                 << (v3 ? "deepseek_v3, kimi_k2 or glm4_moe_lite (its sigmoid router is DeepSeek-V3's)"
                        : "deepseek_v2 (its softmax router is DeepSeek-V2's)");
}

TransformerConfig hf_deepseek_mla_config(const json& j, const std::string& what, const SafetensorsFile& file,
                                         int64_t divisible_by) {
  const std::string family = deepseek_family(j);
  if (family.empty())
    LATTICE_FAIL() << what << ": not a DeepSeek-V2 or DeepSeek-V3 config (model_type " << j.value("model_type", json()).dump()
                   << ")";
  const bool v3 = family == "deepseek_v3";
  TransformerConfig c;
  hf::read_decoder_sizes(j, what, c);
  c.ffn_hidden_size = hf::config_int(j, what, "intermediate_size");
  if (has(j, "num_key_value_heads") && hf::config_int(j, what, "num_key_value_heads") != c.num_attention_heads)
    LATTICE_FAIL() << what << ": num_key_value_heads " << j["num_key_value_heads"].dump()
                   << " is not num_attention_heads (multi-latent attention has a key and a value per head)";
  const std::string act = j.value("hidden_act", std::string("silu"));
  if (act != "silu") LATTICE_FAIL() << what << ": hidden_act \"" << act << "\" is not supported (silu: SwiGLU)";
  if (hf::config_bool(j, what, "attention_bias", false))
    LATTICE_FAIL() << what << ": attention_bias true is not supported (DeepSeek's projections have no biases)";
  if (!hf::config_bool(j, what, "rope_interleave", true))
    LATTICE_FAIL() << what << ": rope_interleave false is not supported (lattice's MLA turns the pairs (2d, 2d + 1))";
  // Multi-latent attention with its latents' norms (q_a_layernorm with a query latent, kv_a_layernorm).
  c.multi_latent_attention = true;
  c.qk_layernorm = true;
  c.q_lora_rank = has(j, "q_lora_rank") ? hf::config_int(j, what, "q_lora_rank") : 0;
  c.kv_lora_rank = hf::config_int(j, what, "kv_lora_rank");
  c.qk_head_dim = hf::config_int(j, what, "qk_nope_head_dim");
  c.qk_pos_emb_head_dim = hf::config_int(j, what, "qk_rope_head_dim");
  c.v_head_dim = hf::config_int(j, what, "v_head_dim");
  if (has(j, "qk_head_dim") && hf::config_int(j, what, "qk_head_dim") != c.mla_qk_dim())
    LATTICE_FAIL() << what << ": qk_head_dim " << j["qk_head_dim"].dump() << " is not qk_nope_head_dim + qk_rope_head_dim "
                   << c.mla_qk_dim();
  c.position_embedding_type = "rope";
  // transformers 5 keeps the rotary settings in rope_parameters (rope_type, rope_theta, YaRN's keys), 4 in
  // rope_scaling and rope_theta.
  const bool params = j.contains("rope_parameters") && j["rope_parameters"].is_object();
  const json* scaling = has(j, "rope_scaling") ? &j["rope_scaling"]
                        : params && j["rope_parameters"].value("rope_type", std::string("default")) != "default"
                            ? &j["rope_parameters"]
                            : nullptr;
  if (scaling) {
    const json& s = *scaling;
    const std::string type = s.is_object() ? s.value("rope_type", s.value("type", std::string())) : "";
    if (type != "yarn")
      LATTICE_FAIL() << what << ": rope_scaling " << s.dump() << " is not supported (none or yarn)";
    if (has(s, "attention_factor"))
      LATTICE_FAIL() << what << ": rope_scaling attention_factor is not supported with DeepSeek (give mscale and "
                        "mscale_all_dim)";
    const double mscale = s.value("mscale", 0.0), all_dim = s.value("mscale_all_dim", 0.0);
    if (all_dim != 0.0 && mscale == 0.0)
      LATTICE_FAIL() << what << ": rope_scaling mscale_all_dim without mscale is not supported (lattice's attention "
                        "factor is m(s, mscale) / m(s, mscale_all_dim))";
    if (mscale != 0.0 && mscale != 1.0 && all_dim == 0.0)
      LATTICE_FAIL() << what << ": rope_scaling mscale " << mscale
                     << " without mscale_all_dim is not supported (transformers then ignores mscale)";
    hf::read_yarn_rope_scaling(j, s, what, c);
  }
  c.rotary_base = float(hf::rope_value(j, what, "rope_theta", 10000.0));
  c.normalization = "RMSNorm";
  // The model's norms take rms_norm_eps (GLM-4.7-Flash's default 1e-5), the latents' always 1e-6.
  const double eps = hf::config_positive(j, what, "rms_norm_eps", glm_lite(j) ? 1e-5 : kLatentNormEps);
  c.layernorm_epsilon = float(eps);
  if (c.layernorm_epsilon != float(kLatentNormEps)) c.mla_latent_norm_epsilon = float(kLatentNormEps);
  c.swiglu = true;
  c.add_bias_linear = false;
  // DeepSeek-V3's mixture of experts: sigmoid scores, the bias in the choice only, the chosen scores
  // normalized and scaled, groups, shared experts; the first first_k_dense_replace layers dense.
  // DeepSeek-V2's: the softmax over every expert, its top k (greedy), renormalized with norm_topk_prob
  // (lattice's default routing) or not (--moe-router-pre-softmax), and scaled.
  const std::string scoring = j.value("scoring_func", std::string(v3 ? "sigmoid" : "softmax"));
  const std::string topk_method = j.value("topk_method", std::string(v3 ? "noaux_tc" : "greedy"));
  if (scoring != (v3 ? "sigmoid" : "softmax"))
    LATTICE_FAIL() << what << ": scoring_func \"" << scoring << "\" is not supported (" << (v3 ? "sigmoid" : "softmax")
                   << " in " << family << ")";
  if (topk_method != (v3 ? "noaux_tc" : "greedy"))
    LATTICE_FAIL() << what << ": topk_method \"" << topk_method << "\" is not supported (" << (v3 ? "noaux_tc" : "greedy")
                   << " in " << family << "; DeepSeek-V2's group_limited_greedy scores a group by its best expert)";
  if (v3) {
    hf::read_sigmoid_router(j, what, c, glm_lite(j) ? 1 : 0);  // Glm4MoeLiteConfig: the first layer dense
    if (has(j, "mlp_layer_types")) {  // GLM-4.7-Flash's: "dense" or "sparse" per layer
      const json& types = j["mlp_layer_types"];
      if (!types.is_array() || int64_t(types.size()) != c.num_layers)
        LATTICE_FAIL() << what << ": mlp_layer_types is not a list of " << c.num_layers << " layer types";
      for (size_t l = 0; l < types.size(); ++l) {
        if (types[l] != "dense" && types[l] != "sparse")
          LATTICE_FAIL() << what << ": mlp_layer_types entry " << types[l].dump() << " is not \"dense\" or \"sparse\"";
        c.moe_layer_pattern[l] = types[l] == "sparse" ? 1 : 0;
      }
    }
    // DeepSeek-V3's multi-token prediction modules: lattice's prediction depths (--mtp-num-layers).
    c.mtp_num_layers = hf::nextn_predict_layers(j, what, file);
  } else {  // one expert: its probability (DeepSeek-V2 renormalizes more than one only)
    hf::read_deepseek_experts(j, what, c);
    const bool normalized = hf::config_bool(j, what, "norm_topk_prob", false);
    c.moe_router_pre_softmax = !normalized || c.moe_router_topk == 1;
    if (normalized && c.moe_router_topk > 1 && c.moe_router_topk_scaling_factor != 1.0f)
      LATTICE_FAIL() << what << ": norm_topk_prob true with routed_scaling_factor "
                     << c.moe_router_topk_scaling_factor
                     << " is not supported (DeepSeek-V2's versions differ on whether the renormalized gates are scaled)";
    // Layer l is an MoE layer from first_k_dense_replace on when l % moe_layer_freq == 0.
    const int64_t freq = has(j, "moe_layer_freq") ? hf::config_int(j, what, "moe_layer_freq") : 1;
    const int64_t first = j.value("first_k_dense_replace", int64_t(0));
    if (first < 0 || first > c.num_layers)
      LATTICE_FAIL() << what << ": first_k_dense_replace " << first << " is not in [0, " << c.num_layers << "]";
    c.moe_layer_pattern = hf::deepseek_moe_layers(c.num_layers, first, freq);
  }
  c.untie_embeddings_and_output_weights = !hf::config_bool(j, what, "tie_word_embeddings", false);
  c.make_vocab_size_divisible_by = divisible_by;
  c.hidden_dropout = c.attention_dropout = 0.0f;
  c.finalize();
  return c;
}

json hf_deepseek_mla_config_json(const TransformerConfig& c, const std::string& tokenizer_type,
                                 const std::string& model_type) {
  json j = {{"architectures", {"DeepseekV3ForCausalLM"}},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"head_dim", c.qk_pos_emb_head_dim},  // DeepseekV3Config's: the rotary dims
            {"hidden_act", "silu"},
            {"hidden_size", c.hidden_size},
            {"initializer_range", 0.02},
            {"intermediate_size", c.ffn_hidden_size},
            {"kv_lora_rank", c.kv_lora_rank},
            {"max_position_embeddings", c.max_position_embeddings},
            {"model_type", "deepseek_v3"},
            {"moe_layer_freq", 1},
            {"num_attention_heads", c.num_attention_heads},
            {"num_hidden_layers", c.num_layers},
            {"num_key_value_heads", c.num_attention_heads},
            {"num_nextn_predict_layers", c.mtp_num_layers},
            {"q_lora_rank", c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr)},
            {"qk_head_dim", c.mla_qk_dim()},
            {"qk_nope_head_dim", c.qk_head_dim},
            {"qk_rope_head_dim", c.qk_pos_emb_head_dim},
            {"rms_norm_eps", hf::shortest_float(c.layernorm_epsilon)},
            {"rope_interleave", true},
            {"rope_scaling", nullptr},
            {"rope_theta", hf::shortest_float(c.rotary_base)},
            {"scoring_func", "sigmoid"},
            {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
            {"topk_method", "noaux_tc"},
            {"torch_dtype", "float32"},
            {"use_cache", true},
            {"v_head_dim", c.v_head_dim},
            {"vocab_size", c.vocab_size}};
  hf::write_sigmoid_router(c, j);  // the experts' fields (DeepSeek-V2's gates below)
  if (!c.moe_router_sigmoid()) {  // DeepseekV2Config: the softmax over every expert, its top k; no MTP modules
    for (const char* key : {"head_dim", "rope_interleave", "qk_head_dim", "num_nextn_predict_layers"}) j.erase(key);
    j["architectures"] = {"DeepseekV2ForCausalLM"};
    j["model_type"] = "deepseek_v2";
    j["scoring_func"] = "softmax";
    j["topk_method"] = "greedy";
    j["norm_topk_prob"] = !c.moe_router_pre_softmax;
    j["aux_loss_alpha"] = 0.001;
    j["seq_aux"] = true;
    j["ep_size"] = 1;
  }
  if (model_type == kKimiK2) j["model_type"] = kKimiK2;  // Kimi-K2 keeps DeepSeek-V3's architecture and keys
  if (model_type == kGlmLite) {  // Glm4MoeLiteConfig: mlp_layer_types, the rotary parameters in rope_parameters
    for (const char* key : {"moe_layer_freq", "scoring_func", "topk_method", "rope_scaling", "rope_theta"}) j.erase(key);
    j["architectures"] = {"Glm4MoeLiteForCausalLM"};
    j["model_type"] = kGlmLite;
    j["mlp_layer_types"] = json::array();
    for (int64_t l = 0; l < c.num_layers; ++l) j["mlp_layer_types"].push_back(c.moe_layer(l) ? "sparse" : "dense");
    j["rope_parameters"] = {{"rope_theta", hf::shortest_float(c.rotary_base)}, {"rope_type", "default"}};
  }
  if (c.yarn()) {  // DeepSeek's keys: the attention factor (and the softmax's) from mscale and mscale_all_dim
    json s = hf::yarn_rope_scaling_json(c);
    s.erase("attention_factor");
    s["type"] = "yarn";
    s["mscale"] = hf::shortest_float(c.yarn_mscale);
    s["mscale_all_dim"] = hf::shortest_float(c.yarn_mscale_all_dim);
    j["rope_scaling"] = s;
  }
  if (!tokenizer_type.empty()) j[kHfTokenizerKey] = tokenizer_type;
  return j;
}

std::string hf_deepseek_mla_mismatch(const TransformerConfig& c) {
  std::ostringstream eps;
  eps << "the latents' norms at epsilon " << c.mla_latent_eps() << " (HuggingFace DeepSeek normalizes its latents with "
      << "1e-6: train with --mla-latent-norm-epsilon 1e-6, or --norm-epsilon 1e-6)";
  const std::string latent_eps = eps.str();
  const char* why = !c.multi_latent_attention ? "no multi-latent attention (HuggingFace DeepSeek-V2's and V3's attention is MLA)"
                    : !c.mla_latent_norms()   ? "multi-latent attention without --qk-layernorm (HuggingFace DeepSeek "
                                                "normalizes its latents)"
                    : !c.rmsnorm()            ? "LayerNorm (HuggingFace DeepSeek has RMSNorm)"
                    : c.mla_latent_eps() != float(kLatentNormEps) ? latent_eps.c_str()
                    : !c.swiglu || c.quick_geglu ? "an MLP other than SwiGLU (HuggingFace DeepSeek's is SwiGLU)"
                    : c.glu_linear_offset != 0.0f || c.activation_func_clamp_value > 0.0f
                        ? "--glu-linear-offset or --activation-func-clamp-value (HuggingFace DeepSeek's SwiGLU has "
                          "neither)"
                    : c.add_bias_linear || c.add_qkv_bias ? "linear biases (HuggingFace DeepSeek has none)"
                    : c.apply_layernorm_1p ? "zero-centered norm weights (--apply-layernorm-1p)"
                    : c.softmax_sink()     ? "attention sinks (--softmax-type)"
                    : c.window_size >= 0   ? "sliding-window attention (HuggingFace DeepSeek has none)"
                    : c.moe() && c.moe_router_sigmoid() != c.moe_router_enable_expert_bias
                        ? "a router neither DeepSeek-V3's (--moe-router-score-function sigmoid with "
                          "--moe-router-enable-expert-bias) nor DeepSeek-V2's (the softmax, no expert bias)"
                    : c.moe_router_sigmoid() ? hf::sigmoid_router_mismatch(c)
                    : hf::deepseek_experts_mismatch(c) ? hf::deepseek_experts_mismatch(c)
                    : c.moe_router_topk == 1 && !c.moe_router_pre_softmax
                        ? "one expert's gate of 1 (DeepSeek-V2 weighs a single expert by its probability: "
                          "--moe-router-pre-softmax)"
                    : !c.moe_router_pre_softmax && c.moe_router_topk_scaling_factor != 1.0f
                        ? "--moe-router-topk-scaling-factor with renormalized softmax gates (DeepSeek-V2's versions "
                          "differ on whether those are scaled)"
                    : c.mtp() ? "prediction depths (--mtp-num-layers) with the softmax router (HuggingFace DeepSeek-V2 "
                                "has no multi-token prediction modules)"
                    : c.moe_router_num_groups > 0
                        ? "--moe-router-num-groups with the softmax (DeepSeek-V2's group_limited_greedy scores a group "
                          "by its best expert)"
                        : nullptr;
  if (why) return why;
  if (c.yarn()) {
    if (c.yarn_mscale_all_dim == 0.0f && c.yarn_mscale != 1.0f)
      return "--yarn-mscale without --yarn-mscale-all-dim (HuggingFace then ignores mscale)";
    if (double(c.max_position_embeddings) !=
        double(c.yarn_rotary_scaling_factor) * double(c.yarn_original_max_position_embeddings))
      return "YaRN with --max-position-embeddings other than --yarn-rotary-scaling-factor x "
             "--yarn-original-max-position-embeddings (transformers versions take the factor from either)";
  }
  return "";
}

namespace {

hf::ConfigFn config_fn(int64_t divisible_by) {
  return [divisible_by](const json& j, const std::string& what, const SafetensorsFile& f) {
    return hf_deepseek_mla_config(j, what, f, divisible_by);
  };
}

hf::ImportPlan import_plan(const TransformerConfig& c, const SafetensorsFile& f, const json&) {
  return hf_deepseek_mla_import_plan(c, f);
}

}  // namespace

HfModel load_hf_deepseek_mla(const std::string& dir, int64_t divisible_by, int64_t seq_length, bool gradients) {
  return hf::load_source(open_hf_deepseek_mla(dir, divisible_by), seq_length, gradients);
}

HfSource open_hf_deepseek_mla(const std::string& dir, int64_t divisible_by) {
  return hf::open_planned_folder(dir, config_fn(divisible_by), import_plan);
}

hf::ImportPlan hf_deepseek_mla_import_plan(const TransformerConfig& c, const SafetensorsFile& f) {
  hf::ImportPlan p;
  p.map = tensor_map(c, p.shapes, false, &f);  // copies checked where f has them
  hf::check_deepseek_layout(c, f, p.shapes);
  return p;
}

void save_hf_deepseek_mla(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                         const hf::ExportOptions& options) {
  save_hf_deepseek_mla(dir, hf::model_source(model), tokenizer_type, options);
}

void save_hf_deepseek_mla(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                         const hf::ExportOptions& options) {
  const TransformerConfig& c = src.config;
  const std::string why = hf_deepseek_mla_mismatch(c);
  if (!why.empty()) LATTICE_FAIL() << "--to-hf " << dir << ": the checkpoint's model has " << why;
  const std::string model_type = hf_deepseek_model_type(c, options.model_type);
  const json config = hf_deepseek_mla_config_json(c, tokenizer_type, model_type);
  std::map<std::string, Shape> shapes;
  const std::vector<TensorMap> map = tensor_map(c, shapes, model_type != kGlmLite, nullptr);
  hf::write_model_folder(dir, hf::export_tensors(*src.layout, src.rows, map, shapes), config, options);
}

}  // namespace lattice
