#include "checkpoint/hf_nemotron_h.h"

#include <algorithm>
#include <map>
#include <vector>

#include "checkpoint/hf_deepseek_moe.h"
#include "checkpoint/hf_tensor_map.h"
#include "core/error.h"
#include "model/hybrid_layer_allocation.h"

namespace lattice {
namespace {

using json = nlohmann::json;
using hf::TensorMap;

// The layer kinds of a config: the string `pattern_key` (hybrid_override_pattern), else the list `list_key`'s
// names (layers_block_type: transformers 5's linear_attention and full_attention, or mamba and attention).
std::string layer_pattern(const json& j, const std::string& what, const char* pattern_key = "hybrid_override_pattern",
                          const char* list_key = "layers_block_type") {
  if (j.contains(pattern_key) && !j[pattern_key].is_null()) {
    if (!j[pattern_key].is_string()) LATTICE_FAIL() << what << ": " << pattern_key << " must be a string";
    return j[pattern_key].get<std::string>();
  }
  if (!j.contains(list_key) || !j[list_key].is_array())
    LATTICE_FAIL() << what << ": neither " << pattern_key << " nor " << list_key << " gives the layers' kinds";
  std::string p;
  for (const json& t : j[list_key]) {
    const std::string kind = t.is_string() ? t.get<std::string>() : t.dump();
    p += kind == "mamba" || kind == "linear_attention"   ? 'M'
         : kind == "attention" || kind == "full_attention" ? '*'
         : kind == "mlp"                                   ? '-'
         : kind == "moe"                                   ? 'E'
                                                           : '?';
    if (p.back() == '?') LATTICE_FAIL() << what << ": " << list_key << " has an unknown kind " << t.dump();
  }
  return p;
}

// The prediction depths HF's form holds: one for depths that repeat one layer (--mtp-use-repeated-layer), as NVIDIA
// publishes Nemotron-3 (trained with two depths of one layer, num_nextn_predict_layers 1).
int64_t hf_mtp_depths(const TransformerConfig& c) {
  return c.mtp_use_repeated_layer ? std::min<int64_t>(c.mtp_num_layers, 1) : c.mtp_num_layers;
}

// The HF prefix of the model's tensors: the Hub's backbone., or transformers 5's model.
std::string prefix_of(const SafetensorsFile* file) {
  return file && !file->has("backbone.embeddings.weight") && file->has("model.embeddings.weight") ? "model." : "backbone.";
}

// A lattice parameter that is the HF tensor `hf` whole, of shape `shape`.
void same_as(std::vector<TensorMap>& m, std::map<std::string, Shape>& s, const std::string& lat, const std::string& hf,
             const Shape& shape) {
  m.push_back({lat, {{hf}}});
  s[hf] = shape;
}

std::vector<TensorMap> tensor_map(const TransformerConfig& c, std::map<std::string, Shape>& s,
                                  const SafetensorsFile* file) {
  const std::string root = prefix_of(file);
  const int64_t C = c.hidden_size, V = c.vocab_size, Q = c.attention_width(), KV = c.kv_channels * c.num_query_groups;
  const int64_t F = c.ffn_hidden_size, I = c.mamba_inner(), H = c.mamba_heads(), Cc = c.mamba_conv_width();
  std::vector<TensorMap> m;
  m.push_back({"embedding.word_embeddings.weight", {{root + "embeddings.weight"}}, true});
  s[root + "embeddings.weight"] = {V, C};
  // One block of kind `kind` (M, *, - or E): lattice's names under `lat`, HF's norm and mixer under `hf`.
  auto add_block = [&](char kind, const std::string& lat, const std::string& hf) {
    const std::string mx = hf + "mixer.";
    s[hf + "norm.weight"] = {C};
    auto same = [&](const std::string& name, const Shape& shape) {  // a mixer tensor under lattice's name
      m.push_back({lat + "mixer." + name, {{mx + name}}});
      s[mx + name] = shape;
    };
    switch (kind) {
      case 'M':
        m.push_back({lat + "norm.weight", {{hf + "norm.weight"}}});
        same("in_proj.weight", {c.mamba_in_proj_width(), C});
        same("conv1d.weight", {Cc, 1, TransformerConfig::kMambaConvKernel});
        same("conv1d.bias", {Cc});
        same("dt_bias", {H});
        same("A_log", {H});
        same("D", {H});
        same("norm.weight", {I});
        same("out_proj.weight", {C, I});
        break;
      case '*':
        m.push_back({lat + "input_layernorm.weight", {{hf + "norm.weight"}}});
        m.push_back(hf::grouped_qkv(c, lat + "self_attention.linear_qkv.weight", mx, "weight"));
        s[mx + "q_proj.weight"] = {Q, C};
        s[mx + "k_proj.weight"] = {KV, C};
        s[mx + "v_proj.weight"] = {KV, C};
        m.push_back({lat + "self_attention.linear_proj.weight", {{mx + "o_proj.weight"}}});
        s[mx + "o_proj.weight"] = {C, Q};
        break;
      case 'E': {  // an MoE layer: the sigmoid router with its choice's bias, ungated relu2 experts, a shared expert
        const int64_t E = c.num_experts, Fe = c.moe_ffn_hidden_size, Fs = c.moe_shared_expert_intermediate_size;
        const int64_t Ce = c.moe_expert_width();  // the routed experts' rows: C, or moe_latent_size
        m.push_back({lat + "pre_mlp_layernorm.weight", {{hf + "norm.weight"}}});
        same_as(m, s, lat + "mlp.router.weight", mx + "gate.weight", {E, C});
        same_as(m, s, lat + "mlp.router.expert_bias", mx + "gate.e_score_correction_bias", {E});
        // The routed experts per expert (the Hub's, what export writes), or fused as transformers 5 saves them:
        // experts.up_proj [E, Fe, Ce] and experts.down_proj [E, Ce, Fe], expert e the e-th [Fe, Ce] and [Ce, Fe] of
        // each (a block's rows are the lattice tensor's).
        const bool fused = file && file->has(mx + "experts.up_proj");
        for (int64_t e = 0; e < E; ++e) {
          const std::string le = lat + "mlp.experts.local_experts." + std::to_string(e) + ".";
          const std::string he = mx + "experts." + std::to_string(e) + ".";
          if (fused) {
            m.push_back({le + "linear_fc1.weight", {{mx + "experts.up_proj", e * Fe, Fe}}});
            m.push_back({le + "linear_fc2.weight", {{mx + "experts.down_proj", e * Ce, Ce}}});
          } else {
            same_as(m, s, le + "linear_fc1.weight", he + "up_proj.weight", {Fe, Ce});
            same_as(m, s, le + "linear_fc2.weight", he + "down_proj.weight", {Ce, Fe});
          }
        }
        if (fused) {
          s[mx + "experts.up_proj"] = {E, Fe, Ce};
          s[mx + "experts.down_proj"] = {E, Ce, Fe};
        }
        if (const int64_t L = c.moe_latent_size; L > 0) {  // Nemotron-3-Super's LatentMoE
          same_as(m, s, lat + "mlp.fc1_latent_proj.weight", mx + "fc1_latent_proj.weight", {L, C});
          same_as(m, s, lat + "mlp.fc2_latent_proj.weight", mx + "fc2_latent_proj.weight", {C, L});
        }
        same_as(m, s, lat + "mlp.shared_experts.linear_fc1.weight", mx + "shared_experts.up_proj.weight", {Fs, C});
        same_as(m, s, lat + "mlp.shared_experts.linear_fc2.weight", mx + "shared_experts.down_proj.weight", {C, Fs});
        break;
      }
      default:  // '-': an MLP layer
        m.push_back({lat + "pre_mlp_layernorm.weight", {{hf + "norm.weight"}}});
        m.push_back({lat + "mlp.linear_fc1.weight", {{mx + "up_proj.weight"}}});
        s[mx + "up_proj.weight"] = {F, C};
        m.push_back({lat + "mlp.linear_fc2.weight", {{mx + "down_proj.weight"}}});
        s[mx + "down_proj.weight"] = {C, F};
    }
  };
  for (int64_t l = 0; l < c.num_layers; ++l)
    add_block(c.hybrid_layer(l), "decoder.layers." + std::to_string(l) + ".", root + "layers." + std::to_string(l) + ".");
  // The multi-token prediction depths (Nemotron-3's, num_nextn_predict_layers and mtp_hybrid_override_pattern): one
  // flat list mtp.layers.<i> of P-block depths, depth k's block j at i = k P + j; a depth's first block also holds
  // enorm, hnorm and eh_proj, its last final_layernorm. A repeated layer (--mtp-use-repeated-layer) is one depth.
  const std::string& mp = c.mtp_hybrid_pattern;
  const int64_t P = int64_t(mp.size());
  for (int64_t k = 0; k < hf_mtp_depths(c); ++k) {
    const std::string d = "mtp.layers." + std::to_string(k) + ".";
    for (int64_t j = 0; j < P; ++j) {
      const std::string hf = "mtp.layers." + std::to_string(k * P + j) + ".";
      if (j == 0) {
        same_as(m, s, d + "enorm.weight", hf + "enorm.weight", {C});
        same_as(m, s, d + "hnorm.weight", hf + "hnorm.weight", {C});
        same_as(m, s, d + "eh_proj.weight", hf + "eh_proj.weight", {C, 2 * C});
      }
      add_block(mp[size_t(j)], d + "mtp_model_layer.layers." + std::to_string(j) + ".", hf);
      if (j == P - 1) same_as(m, s, d + "final_layernorm.weight", hf + "final_layernorm.weight", {C});
    }
  }
  m.push_back({"decoder.final_layernorm.weight", {{root + "norm_f.weight"}}});
  s[root + "norm_f.weight"] = {C};
  if (c.untie_embeddings_and_output_weights) {
    m.push_back({"output_layer.weight", {{"lm_head.weight"}}, true});
    s["lm_head.weight"] = {V, C};
  }
  return m;
}

// A config value that must be what lattice computes (`want`), when given.
void expect_value(const json& j, const std::string& what, const char* key, const json& want) {
  if (j.contains(key) && !j[key].is_null() && j[key] != want)
    LATTICE_FAIL() << what << ": " << key << " " << j[key].dump() << " is not supported (lattice's Nemotron-H has "
                   << want.dump() << ")";
}

}  // namespace

bool is_hf_nemotron_h_config(const json& j) {
  if (!j.is_object()) return false;
  if (j.contains("model_type")) return j["model_type"] == "nemotron_h";
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const json& a : j["architectures"])
      if (a == "NemotronHForCausalLM") return true;
  return false;
}

TransformerConfig hf_nemotron_h_config(const json& j, const std::string& what, int64_t divisible_by,
                                       const SafetensorsFile* file) {
  if (!is_hf_nemotron_h_config(j))
    LATTICE_FAIL() << what << ": not a Nemotron-H config (model_type " << j.value("model_type", json()).dump() << ")";
  TransformerConfig c;
  c.hybrid_layer_pattern = layer_pattern(j, what);
  json sizes = j;  // num_hidden_layers is the pattern's length (transformers 5 derives it so)
  sizes["num_hidden_layers"] = int64_t(c.hybrid_layer_pattern.size());
  if (!j.contains("head_dim") && j.contains("attention_head_dim"))  // NVIDIA's remote-code configs' name
    sizes["head_dim"] = j["attention_head_dim"];
  if (j.contains("num_hidden_layers") && j["num_hidden_layers"] != sizes["num_hidden_layers"])
    LATTICE_FAIL() << what << ": num_hidden_layers " << j["num_hidden_layers"].dump() << " is not the "
                   << c.hybrid_layer_pattern.size() << " layers of hybrid_override_pattern";
  hf::read_decoder_sizes(sizes, what, c);
  c.ffn_hidden_size = hf::config_int(j, what, "intermediate_size");
  hf::read_grouped_heads(sizes, what, c, true);
  // Nemotron-3's multi-token prediction: num_nextn_predict_layers depths of the blocks mtp_hybrid_override_pattern
  // (or transformers 5's mtp_layers_block_type, ["attention", "moe"] by default) gives, read when the file holds
  // them (transformers' save_pretrained drops them: the main model alone then).
  if (j.contains("num_nextn_predict_layers") && !j["num_nextn_predict_layers"].is_null()) {
    const json& n = j["num_nextn_predict_layers"];
    if (!n.is_number_integer() || n.get<int64_t>() < 0)
      LATTICE_FAIL() << what << ": num_nextn_predict_layers " << n.dump() << " is not a count of layers";
    if (n.get<int64_t>() > 0 && (!file || file->has("mtp.layers.0.eh_proj.weight"))) {
      c.mtp_num_layers = n.get<int64_t>();
      json mtp = j;
      if (!j.contains("mtp_hybrid_override_pattern") && !j.contains("mtp_layers_block_type"))
        mtp["mtp_layers_block_type"] = {"attention", "moe"};
      c.mtp_hybrid_pattern = layer_pattern(mtp, what, "mtp_hybrid_override_pattern", "mtp_layers_block_type");
      if (!is_mtp_depth_form(c.mtp_hybrid_pattern))
        LATTICE_FAIL() << what << ": the prediction layers' pattern '" << c.mtp_hybrid_pattern
                       << "' is not a mixer (M or *) and/or an MLP (- or E) in that order (lattice runs a prediction "
                          "depth as one layer)";
    }
  }
  if (c.hybrid_layer_pattern.find('E') != std::string::npos ||
      c.mtp_hybrid_pattern.find('E') != std::string::npos) {  // Nemotron-3's MoE layers: DeepSeek-V3's router
    if (j.contains("moe_latent_size") && !j["moe_latent_size"].is_null())  // LatentMoE (Nemotron-3-Super's)
      c.moe_latent_size = hf::config_int(j, what, "moe_latent_size");
    hf::read_sigmoid_router(sizes, what, c, 0);  // (the MoE layers are the pattern's E layers)
    const int64_t shared = j.contains("n_shared_experts") ? hf::config_int(j, what, "n_shared_experts") : 1;
    if (shared != 1)
      LATTICE_FAIL() << what << ": n_shared_experts " << shared << " is not supported (Nemotron-H has one shared expert)";
    c.moe_shared_expert_intermediate_size = hf::config_int(j, what, "moe_shared_expert_intermediate_size");
  }
  c.mamba_num_heads = hf::config_int(j, what, "mamba_num_heads");
  c.mamba_head_dim = hf::config_int(j, what, "mamba_head_dim");
  c.mamba_num_groups = hf::config_int(j, what, "n_groups");
  c.mamba_state_dim = hf::config_int(j, what, "ssm_state_size");
  expect_value(j, what, "mlp_hidden_act", "relu2");
  expect_value(j, what, "mamba_hidden_act", "silu");
  expect_value(j, what, "conv_kernel", TransformerConfig::kMambaConvKernel);
  expect_value(j, what, "use_conv_bias", true);
  for (const char* bias : {"use_bias", "mlp_bias", "attention_bias", "mamba_proj_bias"}) expect_value(j, what, bias, false);
  if (j.contains("time_step_limit") && j["time_step_limit"].is_array() && j["time_step_limit"].size() == 2 &&
      (j["time_step_limit"][0] != 0.0 || j["time_step_limit"][1].get<double>() < 1e300))
    LATTICE_FAIL() << what << ": time_step_limit " << j["time_step_limit"].dump()
                   << " clamps the Mamba layers' dt, which lattice does not (it takes [0.0, Infinity])";
  // The Mamba layers' gated norm uses layer_norm_epsilon too; lattice's is Megatron's 1e-5.
  c.layernorm_epsilon = float(hf::config_positive(j, what, "layer_norm_epsilon", 1e-5));
  if (c.layernorm_epsilon != 1e-5f && c.hybrid_layer_pattern.find('M') != std::string::npos)
    LATTICE_FAIL() << what << ": layer_norm_epsilon " << j["layer_norm_epsilon"].dump()
                   << " is not supported with Mamba layers (their gated norm's epsilon is 1e-5 in lattice)";
  c.normalization = "RMSNorm";
  c.gelu = GeluKind::squared_relu;
  c.add_bias_linear = false;
  c.position_embedding_type = "none";
  c.untie_embeddings_and_output_weights = !hf::config_bool(j, what, "tie_word_embeddings", false);
  c.make_vocab_size_divisible_by = divisible_by;
  c.hidden_dropout = c.attention_dropout = 0.0f;
  c.finalize();
  return c;
}

json hf_nemotron_h_config_json(const TransformerConfig& c, const std::string& tokenizer_type) {
  json j = {{"architectures", {"NemotronHForCausalLM"}},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"chunk_size", 128},
            {"conv_kernel", TransformerConfig::kMambaConvKernel},
            {"expand", 2},
            {"head_dim", c.kv_channels},
            {"hidden_dropout", 0.0},
            {"hidden_size", c.hidden_size},
            {"hybrid_override_pattern", c.hybrid_layer_pattern},
            {"initializer_range", 0.02},
            {"intermediate_size", c.ffn_hidden_size},
            {"layer_norm_epsilon", hf::shortest_float(c.layernorm_epsilon)},
            {"mamba_head_dim", c.mamba_head_dim},
            {"mamba_hidden_act", "silu"},
            {"mamba_num_heads", c.mamba_heads()},
            {"mamba_proj_bias", false},
            {"max_position_embeddings", c.max_position_embeddings},
            {"mlp_bias", false},
            {"mlp_hidden_act", "relu2"},
            {"model_type", "nemotron_h"},
            {"n_groups", c.mamba_num_groups},
            {"num_attention_heads", c.num_attention_heads},
            {"num_hidden_layers", c.num_layers},
            {"num_key_value_heads", c.num_query_groups},
            {"rescale_prenorm_residual", true},
            {"residual_in_fp32", false},
            {"ssm_state_size", c.mamba_state_dim},
            {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
            {"torch_dtype", "float32"},
            {"use_bias", false},
            {"use_cache", true},
            {"use_conv_bias", true},
            {"vocab_size", c.vocab_size}};
  if (c.moe()) {
    j["n_routed_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.moe_router_topk;
    j["moe_intermediate_size"] = c.moe_ffn_hidden_size;
    j["moe_shared_expert_intermediate_size"] = c.moe_shared_expert_intermediate_size;
    j["n_shared_experts"] = 1;
    j["n_group"] = c.moe_router_num_groups > 0 ? c.moe_router_num_groups : 1;
    j["topk_group"] = c.moe_router_num_groups > 0 ? c.moe_router_group_topk : 1;
    j["norm_topk_prob"] = true;
    j["routed_scaling_factor"] = hf::shortest_float(c.moe_router_topk_scaling_factor);
    j["moe_latent_size"] = c.moe_latent_size > 0 ? json(c.moe_latent_size) : json(nullptr);
  }
  if (c.mtp()) {
    j["num_nextn_predict_layers"] = hf_mtp_depths(c);
    j["mtp_hybrid_override_pattern"] = c.mtp_hybrid_pattern;
  }
  if (!tokenizer_type.empty()) j[kHfTokenizerKey] = tokenizer_type;
  return j;
}

std::string hf_nemotron_h_mismatch(const TransformerConfig& c) {
  const char* why =
      !c.hybrid() ? "no --hybrid-override-pattern (HuggingFace Nemotron-H is a hybrid: each layer a Mamba, an "
                    "attention or an MLP block)"
      : c.moe() && (c.moe_apply_probs_on_input || c.moe_sinkhorn || c.moe_router_pre_softmax || c.moe_router_topk == 1)
          ? "gates other than Nemotron-H's (the sigmoid scores of more than one expert, normalized)"
      : c.moe() && (!c.moe_router_sigmoid() || !c.moe_router_enable_expert_bias)
          ? "a router other than Nemotron-H's (--moe-router-score-function sigmoid with --moe-router-enable-expert-bias)"
      : c.moe() && (c.moe_shared_expert_intermediate_size <= 0 || c.moe_shared_expert_gate)
          ? "shared experts other than Nemotron-H's (one ungated shared expert: --moe-shared-expert-intermediate-size)"
      : c.moe() && c.moe_router_num_groups > 0 && c.moe_router_topk != 2 * c.moe_router_group_topk
          ? "--moe-router-topk other than 2 x --moe-router-group-topk (HuggingFace Nemotron-H scores a group by its 2 "
            "best experts)"
      : c.position_embedding_type != "none"
          ? "a position embedding (HuggingFace Nemotron-H has none: --position-embedding-type none)"
      : !c.rmsnorm()             ? "LayerNorm (HuggingFace Nemotron-H has RMSNorm)"
      : c.apply_layernorm_1p     ? "zero-centered norm weights (--apply-layernorm-1p)"
      : c.add_bias_linear || c.add_qkv_bias ? "linear biases (HuggingFace Nemotron-H has none: --disable-bias-linear)"
      : c.gated_linear_unit() || c.gelu != GeluKind::squared_relu
          ? "an MLP other than squared ReLU (HuggingFace Nemotron-H's is relu2: --squared-relu)"
      : c.qk_norm()              ? "query and key norms (HuggingFace Nemotron-H has none)"
      : c.attention_output_gate  ? "the attention output gate (--attention-output-gate)"
      : c.softmax_sink()         ? "attention sinks (--softmax-type)"
      : c.window_size >= 0       ? "sliding-window attention (HuggingFace Nemotron-H has none)"
      : c.layernorm_epsilon != 1e-5f
          ? "--norm-epsilon other than 1e-5 (HuggingFace Nemotron-H's Mamba norms use layer_norm_epsilon, lattice's 1e-5)"
          : nullptr;
  return why ? why : "";
}

namespace {

hf::ConfigFn config_fn(int64_t divisible_by) {
  return [divisible_by](const json& j, const std::string& what, const SafetensorsFile& f) {
    return hf_nemotron_h_config(j, what, divisible_by, &f);
  };
}

hf::ImportPlan import_plan(const TransformerConfig& c, const SafetensorsFile& f, const json&) {
  hf::ImportPlan p;
  p.map = tensor_map(c, p.shapes, &f);
  hf::check_tensor_shapes(f, p.shapes);
  for (const std::string& name : f.names())
    if (!p.shapes.count(name))  // (a tied model's file has no lm_head.weight)
      LATTICE_FAIL() << f.path() << ": unexpected tensor " << name << " (config.json's hybrid_override_pattern "
                     << c.hybrid_layer_pattern << ", tie_word_embeddings "
                     << (c.untie_embeddings_and_output_weights ? "false" : "true") << ")";
  return p;
}

}  // namespace

HfModel load_hf_nemotron_h(const std::string& dir, int64_t divisible_by, int64_t seq_length, bool gradients) {
  return hf::load_source(open_hf_nemotron_h(dir, divisible_by), seq_length, gradients);
}

HfSource open_hf_nemotron_h(const std::string& dir, int64_t divisible_by) {
  return hf::open_planned_folder(dir, config_fn(divisible_by), import_plan);
}

void save_hf_nemotron_h(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                        const hf::ExportOptions& options) {
  save_hf_nemotron_h(dir, hf::model_source(model), tokenizer_type, options);
}

void save_hf_nemotron_h(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                        const hf::ExportOptions& options) {
  const TransformerConfig& c = src.config;
  const std::string why = hf_nemotron_h_mismatch(c);
  if (!why.empty()) LATTICE_FAIL() << "--to-hf " << dir << ": the checkpoint's model has " << why;
  std::map<std::string, Shape> shapes;
  const std::vector<TensorMap> map = tensor_map(c, shapes, nullptr);
  hf::write_model_folder(dir, hf::export_tensors(*src.layout, src.rows, map, shapes),
                         hf_nemotron_h_config_json(c, tokenizer_type), options);
}

}  // namespace lattice
