#include "checkpoint/hf_qwen3_next.h"

#include <map>
#include <sstream>
#include <vector>

#include "checkpoint/hf_tensor_map.h"
#include "core/error.h"

namespace lattice {
namespace {

using json = nlohmann::json;
using hf::RowBlock;
using hf::TensorMap;

bool multimodal(const json& j) {
  const std::string type = j.value("model_type", std::string());
  return (type == "qwen3_5" || type == "qwen3_5_moe") && j.contains("text_config") && j["text_config"].is_object();
}

// "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text" or "" (Qwen3.5's multimodal qwen3_5 and qwen3_5_moe
// configs: their text_config's).
std::string family_of(const json& j) {
  const std::string type = j.value("model_type", std::string());
  if (type == "qwen3_next" || type == "qwen3_5_text" || type == "qwen3_5_moe_text") return type;
  if (multimodal(j)) return type + "_text";
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const json& a : j["architectures"]) {
      if (a == "Qwen3NextForCausalLM") return "qwen3_next";
      if (a == "Qwen3_5ForCausalLM") return "qwen3_5_text";
      if (a == "Qwen3_5MoeForCausalLM") return "qwen3_5_moe_text";
    }
  return "";
}

// How a family stores what lattice keeps in one tensor.
struct Layout {
  bool interleaved = false;        // Qwen3-Next's in_proj_qkvz / in_proj_ba (else Qwen3.5's four flat projections)
  bool fused_experts = false;      // the decoder layers' experts as 3-D tensors (Qwen3.5-MoE's): gate_up_proj
                                   // [E, 2 I, H] (each expert's gate rows, then its up rows), down_proj [E, H, I]
  bool fused_mtp_experts = false;  // the prediction module's experts so too (Qwen3.6's files; Qwen3.5-MoE's
                                   // keep them per expert, as Qwen3-Next's layers do)
};

Layout layout_of(const std::string& family) {
  Layout l;
  l.interleaved = family == "qwen3_next";
  l.fused_experts = family == "qwen3_5_moe_text";
  return l;
}

// The language model's config: Qwen3.5's multimodal configs nest it in text_config (the top level's
// tie_word_embeddings applying when the text config has none).
json text_config(const json& j) {
  if (!multimodal(j)) return j;
  json t = j["text_config"];
  if (!t.contains("tie_word_embeddings") && j.contains("tie_word_embeddings")) t["tie_word_embeddings"] = j["tie_word_embeddings"];
  return t;
}

// layer_types (linear_attention or full_attention per layer), else full_attention_interval N (every
// N-th layer from 1 full attention): 1 for a Gated DeltaNet layer.
std::vector<int> linear_layers(const json& j, const std::string& what, int64_t layers) {
  std::vector<int> pattern(size_t(layers), 0);
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& t = j["layer_types"];
    if (!t.is_array() || int64_t(t.size()) != layers)
      LATTICE_FAIL() << what << ": layer_types is not a list of num_hidden_layers " << layers << " entries";
    for (int64_t l = 0; l < layers; ++l) {
      if (t[size_t(l)] != "linear_attention" && t[size_t(l)] != "full_attention")
        LATTICE_FAIL() << what << ": layer_types entry " << t[size_t(l)].dump()
                       << " is neither linear_attention nor full_attention";
      pattern[size_t(l)] = t[size_t(l)] == "linear_attention" ? 1 : 0;
    }
    return pattern;
  }
  const int64_t n = j.contains("full_attention_interval") ? hf::config_int(j, what, "full_attention_interval") : 4;
  for (int64_t l = 0; l < layers; ++l) pattern[size_t(l)] = (l + 1) % n == 0 ? 0 : 1;
  return pattern;
}

// p: the language model's prefix, "model." (or Qwen3.5's multimodal files' "model.language_model.").
std::vector<TensorMap> tensor_map(const TransformerConfig& c, const Layout& L, const std::string& p = "model.") {
  const int64_t D = c.kv_channels, G = c.num_query_groups, R = c.num_attention_heads / G;
  const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads, Dk = c.linear_key_head_dim;
  const int64_t Dv = c.linear_value_head_dim, Rv = Hv / Hk, W = 2 * Dk + 2 * Rv * Dv;
  std::vector<TensorMap> m = {{"embedding.word_embeddings.weight", {{p + "embed_tokens.weight"}}, true}};
  // Layer l (a prediction depth's: num_layers, of the last layer's kind) with lattice's prefix lat, HF's hf.
  auto add_layer = [&](int64_t l, const std::string& lat, const std::string& hf) {
    const std::string a = lat + "self_attention.";
    m.push_back({lat + "input_layernorm.weight", {{hf + "input_layernorm.weight"}}});
    if (c.linear_attention_layer(l)) {
      const std::string x = hf + "linear_attn.";
      TensorMap in{a + "in_proj.weight", {}};
      if (L.interleaved) {  // in_proj_qkvz [Hk, (q Dk, k Dk, v R Dv, z R Dv)], in_proj_ba [Hk, (b R, a R)]
        const std::string qkvz = x + "in_proj_qkvz.weight", ba = x + "in_proj_ba.weight";
        for (int64_t i = 0; i < Hk; ++i) in.blocks.push_back({qkvz, i * W, Dk});
        for (int64_t i = 0; i < Hk; ++i) in.blocks.push_back({qkvz, i * W + Dk, Dk});
        for (int64_t h = 0; h < Hv; ++h) in.blocks.push_back({qkvz, h / Rv * W + 2 * Dk + h % Rv * Dv, Dv});
        for (int64_t h = 0; h < Hv; ++h) in.blocks.push_back({qkvz, h / Rv * W + 2 * Dk + (Rv + h % Rv) * Dv, Dv});
        for (int64_t h = 0; h < Hv; ++h) in.blocks.push_back({ba, h / Rv * 2 * Rv + h % Rv, 1});
        for (int64_t h = 0; h < Hv; ++h) in.blocks.push_back({ba, h / Rv * 2 * Rv + Rv + h % Rv, 1});
      } else {
        in.blocks = {{x + "in_proj_qkv.weight"}, {x + "in_proj_z.weight"}, {x + "in_proj_b.weight"},
                     {x + "in_proj_a.weight"}};
      }
      m.push_back(in);
      m.push_back({a + "conv1d.weight", {{x + "conv1d.weight"}}});
      m.push_back({a + "dt_bias", {{x + "dt_bias"}}});
      m.push_back({a + "A_log", {{x + "A_log"}}});
      m.push_back({a + "out_norm.weight", {{x + "norm.weight"}}, false, -1.0f});
      m.push_back({a + "out_proj.weight", {{x + "out_proj.weight"}}});
    } else {
      const std::string x = hf + "self_attn.";
      TensorMap qkv{a + "linear_qkv.weight", {}};
      for (int64_t g = 0; g < G; ++g) {  // the group's queries, their gates (q_proj: per head query then gate), k, v
        for (int64_t r = 0; r < R; ++r) qkv.blocks.push_back({x + "q_proj.weight", (g * R + r) * 2 * D, D});
        for (int64_t r = 0; r < R; ++r) qkv.blocks.push_back({x + "q_proj.weight", (g * R + r) * 2 * D + D, D});
        qkv.blocks.push_back({x + "k_proj.weight", g * D, D});
        qkv.blocks.push_back({x + "v_proj.weight", g * D, D});
      }
      m.push_back(qkv);
      m.push_back({a + "q_layernorm.weight", {{x + "q_norm.weight"}}});
      m.push_back({a + "k_layernorm.weight", {{x + "k_norm.weight"}}});
      m.push_back({a + "linear_proj.weight", {{x + "o_proj.weight"}}});
    }
    m.push_back({lat + "pre_mlp_layernorm.weight", {{hf + "post_attention_layernorm.weight"}}});
    if (c.moe_layer(l)) {  // router, experts, the gated shared expert (Qwen2-MoE's names)
      m.push_back({lat + "mlp.router.weight", {{hf + "mlp.gate.weight"}}});
      const bool fused = l < c.num_layers ? L.fused_experts : L.fused_mtp_experts;
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string x = hf + "mlp.experts." + std::to_string(e) + ".";
        const std::string le = lat + "mlp.experts.local_experts." + std::to_string(e) + ".";
        if (fused) {  // expert e's slab of the 3-D tensors (rows of H, rows of I): [gate; up] [2 I, H] is
                      // linear_fc1, [H, I] linear_fc2
          const int64_t Fe = c.moe_ffn_hidden_size, C = c.hidden_size;
          m.push_back({le + "linear_fc1.weight", {{hf + "mlp.experts.gate_up_proj", e * 2 * Fe, 2 * Fe}}});
          m.push_back({le + "linear_fc2.weight", {{hf + "mlp.experts.down_proj", e * C, C}}});
          continue;
        }
        m.push_back({le + "linear_fc1.weight", {{x + "gate_proj.weight"}, {x + "up_proj.weight"}}});
        m.push_back({le + "linear_fc2.weight", {{x + "down_proj.weight"}}});
      }
      if (c.moe_shared_expert_intermediate_size > 0) {
        const std::string x = hf + "mlp.shared_expert.", ls = lat + "mlp.shared_experts.";
        m.push_back({ls + "linear_fc1.weight", {{x + "gate_proj.weight"}, {x + "up_proj.weight"}}});
        m.push_back({ls + "linear_fc2.weight", {{x + "down_proj.weight"}}});
        m.push_back({ls + "gate_weight", {{hf + "mlp.shared_expert_gate.weight"}}});
      }
      return;
    }
    m.push_back({lat + "mlp.linear_fc1.weight", {{hf + "mlp.gate_proj.weight"}, {hf + "mlp.up_proj.weight"}}});
    m.push_back({lat + "mlp.linear_fc2.weight", {{hf + "mlp.down_proj.weight"}}});
  };
  for (int64_t l = 0; l < c.num_layers; ++l)
    add_layer(l, "decoder.layers." + std::to_string(l) + ".", p + "layers." + std::to_string(l) + ".");
  if (c.mtp()) {  // Qwen3.5's (Qwen3-Next's) multi-token prediction module: one depth of one layer
    const std::string d = "mtp.layers.0.";
    m.push_back({d + "enorm.weight", {{"mtp.pre_fc_norm_embedding.weight"}}});
    m.push_back({d + "hnorm.weight", {{"mtp.pre_fc_norm_hidden.weight"}}});
    m.push_back({d + "eh_proj.weight", {{"mtp.fc.weight"}}});
    add_layer(c.num_layers, d + "transformer_layer.", "mtp.layers.0.");
    m.push_back({d + "final_layernorm.weight", {{"mtp.norm.weight"}}});
  }
  m.push_back({"decoder.final_layernorm.weight", {{p + "norm.weight"}}});
  if (c.untie_embeddings_and_output_weights) m.push_back({"output_layer.weight", {{"lm_head.weight"}}, true});
  return m;
}

std::map<std::string, Shape> hf_shapes(const TransformerConfig& c, const Layout& L, const std::string& p = "model.") {
  const int64_t C = c.hidden_size, V = c.vocab_size, F = c.ffn_hidden_size, D = c.kv_channels;
  const int64_t Q = c.attention_width(), KV = D * c.num_query_groups;
  const int64_t QK = c.linear_num_key_heads * c.linear_key_head_dim, Vd = c.gdn_out_width();
  const int64_t Hv = c.linear_num_value_heads;
  std::map<std::string, Shape> s = {{p + "embed_tokens.weight", {V, C}}, {p + "norm.weight", {C}}};
  auto add_layer = [&](int64_t l, const std::string& hf) {
    s[hf + "input_layernorm.weight"] = {C};
    s[hf + "post_attention_layernorm.weight"] = {C};
    if (c.linear_attention_layer(l)) {
      const std::string x = hf + "linear_attn.";
      if (L.interleaved) {
        s[x + "in_proj_qkvz.weight"] = {2 * QK + 2 * Vd, C};
        s[x + "in_proj_ba.weight"] = {2 * Hv, C};
      } else {
        s[x + "in_proj_qkv.weight"] = {2 * QK + Vd, C};
        s[x + "in_proj_z.weight"] = {Vd, C};
        s[x + "in_proj_b.weight"] = {Hv, C};
        s[x + "in_proj_a.weight"] = {Hv, C};
      }
      s[x + "conv1d.weight"] = {c.gdn_conv_width(), 1, c.linear_conv_kernel_dim};
      s[x + "dt_bias"] = {Hv};
      s[x + "A_log"] = {Hv};
      s[x + "norm.weight"] = {c.linear_value_head_dim};
      s[x + "out_proj.weight"] = {C, Vd};
    } else {
      const std::string x = hf + "self_attn.";
      s[x + "q_proj.weight"] = {2 * Q, C};
      s[x + "k_proj.weight"] = {KV, C};
      s[x + "v_proj.weight"] = {KV, C};
      s[x + "q_norm.weight"] = {D};
      s[x + "k_norm.weight"] = {D};
      s[x + "o_proj.weight"] = {C, Q};
    }
    if (c.moe_layer(l)) {
      const int64_t Fe = c.moe_ffn_hidden_size;
      s[hf + "mlp.gate.weight"] = {c.num_experts, C};
      if (l < c.num_layers ? L.fused_experts : L.fused_mtp_experts) {
        s[hf + "mlp.experts.gate_up_proj"] = {c.num_experts, 2 * Fe, C};
        s[hf + "mlp.experts.down_proj"] = {c.num_experts, C, Fe};
      } else {
        for (int64_t e = 0; e < c.num_experts; ++e) {
          const std::string x = hf + "mlp.experts." + std::to_string(e) + ".";
          s[x + "gate_proj.weight"] = {Fe, C};
          s[x + "up_proj.weight"] = {Fe, C};
          s[x + "down_proj.weight"] = {C, Fe};
        }
      }
      if (const int64_t Fs = c.moe_shared_expert_intermediate_size; Fs > 0) {
        const std::string x = hf + "mlp.shared_expert.";
        s[x + "gate_proj.weight"] = {Fs, C};
        s[x + "up_proj.weight"] = {Fs, C};
        s[x + "down_proj.weight"] = {C, Fs};
        s[hf + "mlp.shared_expert_gate.weight"] = {1, C};
      }
      return;
    }
    s[hf + "mlp.gate_proj.weight"] = {F, C};
    s[hf + "mlp.up_proj.weight"] = {F, C};
    s[hf + "mlp.down_proj.weight"] = {C, F};
  };
  for (int64_t l = 0; l < c.num_layers; ++l) add_layer(l, p + "layers." + std::to_string(l) + ".");
  if (c.mtp()) {
    s["mtp.pre_fc_norm_embedding.weight"] = {C};
    s["mtp.pre_fc_norm_hidden.weight"] = {C};
    s["mtp.fc.weight"] = {C, 2 * C};
    add_layer(c.num_layers, "mtp.layers.0.");
    s["mtp.norm.weight"] = {C};
  }
  if (c.untie_embeddings_and_output_weights) s["lm_head.weight"] = {V, C};
  return s;
}

bool starts_with(const std::string& s, const char* head) { return s.rfind(head, 0) == 0; }

std::string family_name(const std::string& family) {
  return family == "qwen3_next"         ? "Qwen3-Next"
         : family == "qwen3_5_text"     ? "Qwen3.5"
         : family == "qwen3_5_moe_text" ? "Qwen3.5-MoE"
                                        : "";
}

// The text family a model_type names (qwen3_5 and qwen3_5_moe name the multimodal models around them).
std::string text_family(const std::string& model_type) {
  return model_type == "qwen3_5" || model_type == "qwen3_5_moe" ? model_type + "_text" : model_type;
}
// Whether a family's MLPs are experts (all but Qwen3.5's dense text model).
bool experts_family(const std::string& family) { return family != "qwen3_5_text"; }

// The family a model is written as: model_type's (--hf-model-type), else Qwen3-Next with experts and Qwen3.5
// without. An error names the flag when the model has not the family's kind of MLP.
std::string export_family(const TransformerConfig& c, const std::string& model_type) {
  if (model_type.empty()) return c.moe() ? "qwen3_next" : "qwen3_5_text";
  const std::string f = text_family(model_type);
  if (family_name(f).empty())
    LATTICE_FAIL() << "--hf-model-type " << model_type << ": a Gated DeltaNet model is written as qwen3_next, "
                   << "qwen3_5_text (qwen3_5) or qwen3_5_moe_text (qwen3_5_moe)";
  if (c.moe() != experts_family(f))
    LATTICE_FAIL() << "--hf-model-type " << model_type << ": " << family_name(f)
                   << (c.moe() ? " has dense MLPs, the checkpoint's model experts" : " has experts, the checkpoint's model none");
  return f;
}

// Why c has no form in `family` ("" when it has one).
std::string mismatch(const TransformerConfig& c, const std::string& family) {
  if (std::string why = hf_qwen3_next_mismatch(c); !why.empty()) return why;
  if (family != "qwen3_5_moe_text") return "";
  for (int64_t l = 0; l < c.num_layers; ++l)
    if (!c.moe_layer(l))
      return "a dense layer " + std::to_string(l) + " (every Qwen3.5-MoE layer is a mixture of experts)";
  if (c.moe_shared_expert_intermediate_size == 0) return "no shared expert (Qwen3.5-MoE's layers have a gated one)";
  if (c.moe_router_pre_softmax)
    return "--moe-router-pre-softmax (Qwen3.5-MoE renormalizes its top-k gates, always)";
  return "";
}

}  // namespace

bool is_hf_qwen3_next_config(const json& j) { return !family_of(j).empty(); }

std::string hf_qwen3_next_family_name(const json& j) { return family_name(family_of(j)); }

std::string hf_qwen3_next_family_name(const TransformerConfig& c, const std::string& model_type) {
  return family_name(export_family(c, model_type));
}

std::string hf_qwen3_next_recorded_type(const TransformerConfig& c, const std::string& recorded) {
  const std::string f = text_family(recorded);
  return !family_name(f).empty() && c.moe() == experts_family(f) ? recorded : "";
}

TransformerConfig hf_qwen3_next_config(const json& config, const std::string& what, const SafetensorsFile& file,
                                       int64_t divisible_by) {
  const std::string family = family_of(config);
  if (family.empty())
    LATTICE_FAIL() << what << ": not a Qwen3-Next or Qwen3.5 config (model_type "
                   << config.value("model_type", json()).dump() << ")";
  const json j = text_config(config);
  TransformerConfig c;
  hf::read_decoder_sizes(j, what, c);
  c.num_query_groups = j.contains("num_key_value_heads") ? hf::config_int(j, what, "num_key_value_heads")
                                                          : c.num_attention_heads;
  if (c.num_attention_heads % c.num_query_groups != 0)
    LATTICE_FAIL() << what << ": num_key_value_heads " << c.num_query_groups << " does not divide num_attention_heads "
                   << c.num_attention_heads;
  c.kv_channels = j.contains("head_dim") && !j["head_dim"].is_null() ? hf::config_int(j, what, "head_dim") : 256;
  const std::string act = j.value("hidden_act", std::string("silu"));
  if (act != "silu") LATTICE_FAIL() << what << ": hidden_act \"" << act << "\" is not supported (silu)";
  if (hf::config_bool(j, what, "attention_bias", false))
    LATTICE_FAIL() << what << ": attention_bias true is not supported (lattice's Qwen3-Next has no linear biases)";
  hf::read_partial_rope(j, what, 0.25, c);
  c.normalization = "RMSNorm";
  c.apply_layernorm_1p = true;  // Qwen3NextRMSNorm: (1 + weight)
  c.layernorm_epsilon = float(hf::config_positive(j, what, "rms_norm_eps", 1e-6));
  c.swiglu = true;
  c.add_bias_linear = false;
  c.qk_layernorm = true;
  c.attention_output_gate = true;
  c.experimental_attention_variant = "gated_delta_net";
  c.linear_attention_pattern = linear_layers(j, what, c.num_layers);
  auto linear = [&](const char* key, int64_t fallback) {
    return j.contains(key) && !j[key].is_null() ? hf::config_int(j, what, key) : fallback;
  };
  c.linear_num_key_heads = linear("linear_num_key_heads", 16);
  c.linear_num_value_heads = linear("linear_num_value_heads", 32);
  c.linear_key_head_dim = linear("linear_key_head_dim", 128);
  c.linear_value_head_dim = linear("linear_value_head_dim", 128);
  c.linear_conv_kernel_dim = linear("linear_conv_kernel_dim", 4);
  const bool moe_family = family != "qwen3_5_text";
  if (moe_family && j.value("num_experts", int64_t(0)) > 0) {
    c.num_experts = hf::config_int(j, what, "num_experts");
    c.moe_router_topk = hf::config_int(j, what, "num_experts_per_tok");
    c.moe_ffn_hidden_size = hf::config_int(j, what, "moe_intermediate_size");
    c.moe_router_pre_softmax = !hf::config_bool(j, what, "norm_topk_prob", true);
    c.moe_layer_pattern = hf::qwen_moe_layers(j, what, c.num_layers);
    if (j.value("shared_expert_intermediate_size", int64_t(0)) > 0) {
      c.moe_shared_expert_intermediate_size = hf::config_int(j, what, "shared_expert_intermediate_size");
      c.moe_shared_expert_gate = true;
    }
  } else if (moe_family) {
    LATTICE_FAIL() << what << ": num_experts 0 (lattice reads " << family_name(family)
                   << " with its experts; a dense model is Qwen3.5's qwen3_5_text)";
  }
  // The dense MLP's width (Qwen3.5-MoE's configs have none: every layer is a mixture of experts).
  bool dense_layer = false;
  for (int64_t l = 0; l < c.num_layers; ++l) dense_layer = dense_layer || !c.moe_layer(l);
  c.ffn_hidden_size = dense_layer || j.contains("intermediate_size") ? hf::config_int(j, what, "intermediate_size")
                                                                    : c.moe_ffn_hidden_size;
  // The multi-token prediction module (mtp.*): one depth of one full-attention layer, lattice's
  // --mtp-num-layers 1 (a module of several layers is one depth of several layers: not lattice's form), when the
  // file has it (transformers' models skip it on load and their save_pretrained writes none, though
  // config.json keeps mtp_num_hidden_layers).
  if (j.contains("mtp_num_hidden_layers") && !j["mtp_num_hidden_layers"].is_null()) {
    const int64_t n = j["mtp_num_hidden_layers"].is_number_integer() ? j["mtp_num_hidden_layers"].get<int64_t>() : -1;
    if (n < 0 || n > 1)
      LATTICE_FAIL() << what << ": mtp_num_hidden_layers " << j["mtp_num_hidden_layers"].dump()
                     << " is not supported (0 or 1: lattice's prediction depth has one layer)";
    if (n == 1 && c.linear_attention_pattern.back() != 0)
      LATTICE_FAIL() << what << ": mtp_num_hidden_layers 1 with a last layer of linear attention (the prediction "
                        "module's layer is a full-attention one, lattice's takes the last layer's kind)";
    c.mtp_num_layers = file.has("mtp.fc.weight") ? n : 0;
  }
  c.untie_embeddings_and_output_weights = !hf::config_bool(j, what, "tie_word_embeddings", false);
  c.make_vocab_size_divisible_by = divisible_by;
  c.hidden_dropout = c.attention_dropout = 0.0f;
  c.finalize();
  return c;
}

json hf_qwen3_next_config_json(const TransformerConfig& c, const std::string& tokenizer_type,
                               const std::string& model_type) {
  const std::string family = export_family(c, model_type);
  const bool next = family == "qwen3_next", moe35 = family == "qwen3_5_moe_text";
  json j = {{"architectures", {next ? "Qwen3NextForCausalLM" : moe35 ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM"}},
            {"model_type", family},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"head_dim", c.kv_channels},
            {"hidden_act", "silu"},
            {"hidden_size", c.hidden_size},
            {"initializer_range", 0.02},
            {"max_position_embeddings", c.max_position_embeddings},
            {"num_attention_heads", c.num_attention_heads},
            {"num_hidden_layers", c.num_layers},
            {"num_key_value_heads", c.num_query_groups},
            {"partial_rotary_factor", c.rotary_percent},
            {"rms_norm_eps", hf::shortest_float(c.layernorm_epsilon)},
            {"rope_scaling", nullptr},
            {"rope_theta", hf::shortest_float(c.rotary_base)},
            {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
            {"use_cache", true},
            {"vocab_size", c.vocab_size},
            {"linear_conv_kernel_dim", c.linear_conv_kernel_dim},
            {"linear_key_head_dim", c.linear_key_head_dim},
            {"linear_value_head_dim", c.linear_value_head_dim},
            {"linear_num_key_heads", c.linear_num_key_heads},
            {"linear_num_value_heads", c.linear_num_value_heads}};
  j["layer_types"] = json::array();
  for (int64_t l = 0; l < c.num_layers; ++l)
    j["layer_types"].push_back(c.linear_attention_layer(l) ? "linear_attention" : "full_attention");
  if (!moe35) j["intermediate_size"] = c.ffn_hidden_size;  // (Qwen3.5-MoE's have no dense MLP)
  if (!next)  // transformers 5's Qwen3.5 configs: the rotary parameters here too
    j["rope_parameters"] = {{"rope_type", "default"},
                            {"rope_theta", hf::shortest_float(c.rotary_base)},
                            {"partial_rotary_factor", c.rotary_percent}};
  if (next || moe35) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.moe_router_topk;
    j["moe_intermediate_size"] = c.moe_ffn_hidden_size;
    j["shared_expert_intermediate_size"] = c.moe_shared_expert_intermediate_size;
    j["router_aux_loss_coef"] = 0.001;
    j["output_router_logits"] = false;
  }
  if (next) {  // (Qwen3.5-MoE renormalizes always, and every layer has experts)
    j["norm_topk_prob"] = !c.moe_router_pre_softmax;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = json::array();
    for (int64_t l = 0; l < c.num_layers; ++l)
      if (!c.moe_layer(l)) j["mlp_only_layers"].push_back(l);
  }
  if (c.mtp()) j["mtp_num_hidden_layers"] = c.mtp_num_layers;
  if (!tokenizer_type.empty()) j[kHfTokenizerKey] = tokenizer_type;
  return j;
}

std::string hf_qwen3_next_mismatch(const TransformerConfig& c) {
  if (!c.gated_delta_net()) return "no Gated DeltaNet layers (--experimental-attention-variant gated_delta_net)";
  if (!c.attention_output_gate) return "attention layers without the output gate (Qwen3-Next's have --attention-output-gate)";
  if (!c.qk_layernorm) return "no --qk-layernorm (Qwen3-Next's attention normalizes its queries and keys)";
  if (!c.rmsnorm() || !c.apply_layernorm_1p)
    return "norms other than zero-centered RMSNorm (Qwen3-Next's: --normalization RMSNorm --apply-layernorm-1p)";
  if (!c.swiglu || c.glu_linear_offset != 0.0f || c.activation_func_clamp_value > 0.0f)
    return "an MLP other than SwiGLU (Qwen3-Next's)";
  if (c.add_bias_linear || c.add_qkv_bias) return "linear biases (Qwen3-Next has none)";
  if (!c.rope() || c.yarn() || c.use_rope_scaling || c.rotary_seq_len_interpolation_factor > 0.0f ||
      c.rotary_interleaved || !c.no_rope_pattern.empty())
    return "a position embedding other than the plain rotary one on every attention layer (rotate_half pairs)";
  if (c.window_size >= 0 || c.softmax_sink() || c.qk_l2_norm)
    return "--window-size, attention sinks or --qk-l2-norm (Qwen3-Next's attention has none)";
  if (c.mtp_num_layers > 1)
    return "--mtp-num-layers " + std::to_string(c.mtp_num_layers) + " (the HuggingFace form has one prediction depth)";
  if (c.mtp() && c.linear_attention_layer(c.num_layers))
    return "a Gated DeltaNet prediction depth (the HuggingFace form's is a full-attention layer)";
  if (c.moe()) {
    if (c.moe_shared_expert_intermediate_size > 0 && !c.moe_shared_expert_gate)
      return "ungated shared experts (Qwen3-Next's shared expert has shared_expert_gate: --moe-shared-expert-gate)";
    if (c.moe_router_sigmoid() || c.moe_router_num_groups > 0 || c.moe_router_topk_scaling_factor != 1.0f ||
        c.moe_apply_probs_on_input)
      return "a router other than the softmax over every expert (Qwen3-Next's)";
  }
  return "";
}

hf::ImportPlan hf_qwen3_next_import_plan(const TransformerConfig& c, const SafetensorsFile& f, const json& config) {
  // Qwen3.5's multimodal files keep the language model under model.language_model. beside model.visual.;
  // Qwen3.6's keep the prediction module's experts fused as their layers' are (Qwen3.5's per expert).
  const std::string p = f.has("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
  Layout layout = layout_of(family_of(config));
  layout.fused_mtp_experts = f.has("mtp.layers.0.mlp.experts.gate_up_proj");
  const std::map<std::string, Shape> shapes = hf_shapes(c, layout, p);
  hf::check_tensor_shapes(f, shapes);
  for (const std::string& name : f.names()) {
    // (the vision tower is not read, nor the multi-token prediction module of a config without it)
    if (shapes.count(name) || (!c.mtp() && starts_with(name, "mtp.")) || starts_with(name, "model.visual.")) continue;
    LATTICE_FAIL() << f.path() << ": unexpected tensor " << name << " (config.json has num_hidden_layers "
                   << c.num_layers << ")";
  }
  return {tensor_map(c, layout, p), shapes};
}

namespace {

hf::ConfigFn config_fn(int64_t divisible_by) {
  return [divisible_by](const json& j, const std::string& what, const SafetensorsFile& f) {
    return hf_qwen3_next_config(j, what, f, divisible_by);
  };
}

}  // namespace

HfModel load_hf_qwen3_next(const std::string& dir, int64_t divisible_by, int64_t seq_length, bool gradients) {
  return hf::load_source(open_hf_qwen3_next(dir, divisible_by), seq_length, gradients);
}

HfSource open_hf_qwen3_next(const std::string& dir, int64_t divisible_by) {
  return hf::open_planned_folder(dir, config_fn(divisible_by), hf_qwen3_next_import_plan);
}

void save_hf_qwen3_next(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                        const hf::ExportOptions& options) {
  save_hf_qwen3_next(dir, hf::model_source(model), tokenizer_type, options);
}

void save_hf_qwen3_next(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                        const hf::ExportOptions& options) {
  const TransformerConfig& c = src.config;
  const std::string family = export_family(c, options.model_type);
  const std::string why = mismatch(c, family);
  if (!why.empty()) LATTICE_FAIL() << "--to-hf " << dir << ": the checkpoint's model has " << why;
  const Layout layout = layout_of(family);
  hf::write_model_folder(dir, hf::export_tensors(*src.layout, src.rows, tensor_map(c, layout), hf_shapes(c, layout)),
                         hf_qwen3_next_config_json(c, tokenizer_type, family), options);
}

}  // namespace lattice
