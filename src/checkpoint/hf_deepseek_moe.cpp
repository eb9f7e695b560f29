#include "checkpoint/hf_deepseek_moe.h"

#include "checkpoint/hf_common.h"
#include "core/error.h"

namespace lattice::hf {

using json = nlohmann::json;

void deepseek_mlp_tensors(const TransformerConfig& c, int64_t l, const std::string& lat, const std::string& hf,
                          std::vector<TensorMap>& m, std::map<std::string, Shape>& shapes, const SafetensorsFile* file) {
  const int64_t C = c.hidden_size;
  // SwiGLU's linear_fc1: gate_proj's rows, then up_proj's
  auto mlp = [&](const std::string& lattice, const std::string& name, int64_t F) {
    m.push_back({lat + lattice + "linear_fc1.weight", {{hf + name + "gate_proj.weight"}, {hf + name + "up_proj.weight"}}});
    m.push_back({lat + lattice + "linear_fc2.weight", {{hf + name + "down_proj.weight"}}});
    shapes[hf + name + "gate_proj.weight"] = {F, C};
    shapes[hf + name + "up_proj.weight"] = {F, C};
    shapes[hf + name + "down_proj.weight"] = {C, F};
  };
  if (!c.moe_layer(l)) {
    mlp("mlp.", "mlp.", c.ffn_hidden_size);
    return;
  }
  m.push_back({lat + "mlp.router.weight", {{hf + "mlp.gate.weight"}}});
  shapes[hf + "mlp.gate.weight"] = {c.num_experts, C};
  if (c.moe_router_enable_expert_bias) {  // DeepSeek-V3's and GLM's; V2's router has none
    m.push_back({lat + "mlp.router.expert_bias", {{hf + "mlp.gate.e_score_correction_bias"}}});
    shapes[hf + "mlp.gate.e_score_correction_bias"] = {c.num_experts};
  }
  const int64_t E = c.num_experts, F = c.moe_ffn_hidden_size;
  if (file && file->has(hf + "mlp.experts.gate_up_proj")) {  // expert e's slabs: rows of C, then rows of F
    for (int64_t e = 0; e < E; ++e) {
      const std::string le = lat + "mlp.experts.local_experts." + std::to_string(e) + ".";
      m.push_back({le + "linear_fc1.weight", {{hf + "mlp.experts.gate_up_proj", e * 2 * F, 2 * F}}});
      m.push_back({le + "linear_fc2.weight", {{hf + "mlp.experts.down_proj", e * C, C}}});
    }
    shapes[hf + "mlp.experts.gate_up_proj"] = {E, 2 * F, C};
    shapes[hf + "mlp.experts.down_proj"] = {E, C, F};
  } else {
    for (int64_t e = 0; e < E; ++e)
      mlp("mlp.experts.local_experts." + std::to_string(e) + ".", "mlp.experts." + std::to_string(e) + ".", F);
  }
  mlp("mlp.shared_experts.", "mlp.shared_experts.", c.moe_shared_expert_intermediate_size);
}

std::vector<TensorMap> deepseek_layout_tensors(const TransformerConfig& c, const LayerTensors& layer, bool copies,
                                               std::map<std::string, Shape>& shapes) {
  const int64_t C = c.hidden_size, V = c.vocab_size;
  std::vector<TensorMap> m = {{"embedding.word_embeddings.weight", {{"model.embed_tokens.weight"}}, true}};
  shapes = {{"model.embed_tokens.weight", {V, C}}, {"model.norm.weight", {C}}};
  for (int64_t l = 0; l < c.num_layers; ++l) layer(l, "decoder.layers." + std::to_string(l) + ".", m, shapes);
  m.push_back({"decoder.final_layernorm.weight", {{"model.norm.weight"}}});
  const std::string out = c.untie_embeddings_and_output_weights ? "output_layer.weight" : "embedding.word_embeddings.weight";
  if (c.untie_embeddings_and_output_weights) {
    m.push_back({out, {{"lm_head.weight"}}, true});
    shapes["lm_head.weight"] = {V, C};
  }
  for (int64_t k = 0; k < c.mtp_num_layers; ++k) {
    const int64_t l = c.num_layers + k;
    const std::string lat = "mtp.layers." + std::to_string(k) + ".", hf = "model.layers." + std::to_string(l) + ".";
    for (const char* norm : {"enorm", "hnorm"}) {
      m.push_back({lat + norm + ".weight", {{hf + norm + ".weight"}}});
      shapes[hf + norm + ".weight"] = {C};
    }
    m.push_back({lat + "eh_proj.weight", {{hf + "eh_proj.weight"}}});
    shapes[hf + "eh_proj.weight"] = {C, 2 * C};
    layer(l, lat + "transformer_layer.", m, shapes);
    m.push_back({lat + "final_layernorm.weight", {{hf + "shared_head.norm.weight"}}});
    shapes[hf + "shared_head.norm.weight"] = {C};
    if (!copies) continue;
    m.push_back({"embedding.word_embeddings.weight", {{hf + "embed_tokens.weight"}}, true});
    shapes[hf + "embed_tokens.weight"] = {V, C};
    m.push_back({out, {{hf + "shared_head.head.weight"}}, true});
    shapes[hf + "shared_head.head.weight"] = {V, C};
  }
  return m;
}

std::vector<std::pair<std::string, std::string>> deepseek_mtp_copies(const TransformerConfig& c) {
  std::vector<std::pair<std::string, std::string>> copies;
  for (int64_t k = 0; k < c.mtp_num_layers; ++k) {
    const std::string hf = "model.layers." + std::to_string(c.num_layers + k) + ".";
    copies.emplace_back(hf + "embed_tokens.weight", "model.embed_tokens.weight");
    copies.emplace_back(hf + "shared_head.head.weight",
                        c.untie_embeddings_and_output_weights ? "lm_head.weight" : "model.embed_tokens.weight");
  }
  return copies;
}

void check_mtp_copies(const TransformerConfig& c, const SafetensorsFile& f) {
  for (const auto& [copy, original] : deepseek_mtp_copies(c))
    if (f.has(copy) && read_float_tensor(f, copy) != read_float_tensor(f, original))
      LATTICE_FAIL() << f.path() << ": " << copy << " differs from " << original
                     << " (lattice's prediction depths share the model's embedding and output layer)";
}

void check_deepseek_layout(const TransformerConfig& c, const SafetensorsFile& f,
                           const std::map<std::string, Shape>& shapes) {
  check_tensor_shapes(f, shapes);
  check_mtp_copies(c, f);
  std::map<std::string, std::string> copies;
  for (const auto& [copy, original] : deepseek_mtp_copies(c)) copies[copy] = original;
  for (const std::string& name : f.names()) {
    if (shapes.count(name) || copies.count(name)) continue;
    if (name == "lm_head.weight" && !c.untie_embeddings_and_output_weights &&
        f.get(name).shape == f.get("model.embed_tokens.weight").shape &&
        read_float_tensor(f, name) == read_float_tensor(f, "model.embed_tokens.weight"))
      continue;  // tied: a stored lm_head that is embed_tokens itself
    LATTICE_FAIL() << f.path() << ": unexpected tensor " << name << " (config.json has num_hidden_layers "
                   << c.num_layers << ", and the file " << c.mtp_num_layers << " multi-token prediction layers)";
  }
}

void read_deepseek_experts(const json& j, const std::string& what, TransformerConfig& c) {
  auto has = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  c.num_experts = config_int(j, what, has("n_routed_experts") || !has("num_experts") ? "n_routed_experts" : "num_experts");
  c.moe_router_topk = config_int(j, what, "num_experts_per_tok");
  c.moe_ffn_hidden_size = config_int(j, what, "moe_intermediate_size");
  c.moe_shared_expert_intermediate_size =
      c.moe_ffn_hidden_size * (has("n_shared_experts") ? config_int(j, what, "n_shared_experts") : 1);
  c.moe_router_topk_scaling_factor = float(config_positive(j, what, "routed_scaling_factor", 1.0));
}

void read_sigmoid_router(const json& j, const std::string& what, TransformerConfig& c, int64_t first_dense) {
  auto has = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  read_deepseek_experts(j, what, c);
  c.moe_router_score_function = "sigmoid";
  c.moe_router_enable_expert_bias = true;
  if (!config_bool(j, what, "norm_topk_prob", true) || c.moe_router_topk == 1)
    LATTICE_FAIL() << what << ": norm_topk_prob " << (config_bool(j, what, "norm_topk_prob", true) ? "true" : "false")
                   << " with num_experts_per_tok " << c.moe_router_topk
                   << " is not supported (lattice normalizes the sigmoid gates of more than one expert)";
  const int64_t groups = has("n_group") ? config_int(j, what, "n_group") : 1;
  const int64_t group_topk = has("topk_group") ? config_int(j, what, "topk_group") : 1;
  if (groups > 1 && group_topk < groups) {  // every group kept: no restriction
    if (c.moe_router_topk != 2 * group_topk)
      LATTICE_FAIL() << what << ": num_experts_per_tok " << c.moe_router_topk << " is not 2 x topk_group " << group_topk
                     << " (transformers scores a group by its 2 best experts, lattice by num_experts_per_tok / "
                        "topk_group)";
    c.moe_router_num_groups = groups;
    c.moe_router_group_topk = group_topk;
  }
  const int64_t freq = has("moe_layer_freq") ? config_int(j, what, "moe_layer_freq") : 1;
  if (freq != 1)
    LATTICE_FAIL() << what << ": moe_layer_freq " << freq
                   << " is not supported (transformers makes every layer after first_k_dense_replace an MoE layer)";
  const int64_t first = j.value("first_k_dense_replace", first_dense);
  if (first < 0 || first > c.num_layers)
    LATTICE_FAIL() << what << ": first_k_dense_replace " << first << " is not in [0, " << c.num_layers << "]";
  c.moe_layer_pattern = deepseek_moe_layers(c.num_layers, first, 1);
}

void write_sigmoid_router(const TransformerConfig& c, json& j) {
  j["first_k_dense_replace"] = deepseek_first_k_dense(c);  // sigmoid_router_mismatch refuses -1
  j["moe_intermediate_size"] = c.moe_ffn_hidden_size;
  j["n_group"] = c.moe_router_num_groups > 0 ? c.moe_router_num_groups : 1;
  j["n_routed_experts"] = c.num_experts;
  j["n_shared_experts"] = c.moe_shared_expert_intermediate_size / c.moe_ffn_hidden_size;
  j["norm_topk_prob"] = true;
  j["num_experts_per_tok"] = c.moe_router_topk;
  j["routed_scaling_factor"] = shortest_float(c.moe_router_topk_scaling_factor);
  j["topk_group"] = c.moe_router_num_groups > 0 ? c.moe_router_group_topk : 1;
}

const char* deepseek_experts_mismatch(const TransformerConfig& c) {
  const int64_t Fs = c.moe_shared_expert_intermediate_size;
  if (!c.moe()) return "no mixture of experts (HuggingFace DeepSeek's layers after first_k_dense_replace are MoE layers)";
  if (c.moe_apply_probs_on_input || c.moe_sinkhorn)
    return "gates other than DeepSeek's (--moe-apply-probs-on-input or sinkhorn routing)";
  if (Fs <= 0 || Fs % c.moe_ffn_hidden_size != 0 || c.moe_shared_expert_gate)
    return "shared experts other than DeepSeek's (ungated, n_shared_experts x --moe-ffn-hidden-size)";
  if (deepseek_first_k_dense(c) < 0)
    return "--moe-layer-freq with a dense layer after an MoE layer (HuggingFace DeepSeek's dense layers are its "
           "first_k_dense_replace first)";
  return nullptr;
}

const char* sigmoid_router_mismatch(const TransformerConfig& c) {
  if (const char* why = deepseek_experts_mismatch(c)) return why;
  if (!c.moe_router_sigmoid() || !c.moe_router_enable_expert_bias)
    return "a router other than DeepSeek-V3's (--moe-router-score-function sigmoid with --moe-router-enable-expert-bias)";
  if (c.moe_router_pre_softmax || c.moe_router_topk == 1)
    return "gates other than DeepSeek-V3's (the sigmoid scores of more than one expert, normalized)";
  if (c.moe_router_num_groups > 0 && c.moe_router_topk != 2 * c.moe_router_group_topk)
    return "--moe-router-topk other than 2 x --moe-router-group-topk (HuggingFace DeepSeek-V3 scores a group by its 2 "
           "best experts)";
  return nullptr;
}

}  // namespace lattice::hf
