#include "checkpoint/hf_gpt_oss.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include "checkpoint/hf_rope_scaling.h"
#include "checkpoint/host_staging.h"
#include "core/error.h"

namespace lattice {
namespace {

using json = nlohmann::json;

// The FP4 (E2M1) values of the 16 codes.
constexpr float kFp4[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

std::string hf_layer(int64_t l) { return "model.layers." + std::to_string(l) + "."; }
std::string lattice_layer(int64_t l) { return "decoder.layers." + std::to_string(l) + "."; }
std::string expert(int64_t l, int64_t e, const char* rest) {
  return lattice_layer(l) + "mlp.experts.local_experts." + std::to_string(e) + "." + rest;
}

// The model's sizes in HF's terms.
struct Dims {
  int64_t C, H, G, D, E, I, V;
  int64_t per_group() const { return H / G; }
};
Dims dims(const TransformerConfig& c) {
  return {c.hidden_size, c.num_attention_heads, c.num_query_groups, c.kv_channels,
          c.num_experts, c.moe_ffn_hidden_size, c.vocab_size};
}

// Every HF tensor of the model with its shape (mxfp4: the experts' weights as blocks and scales).
std::map<std::string, Shape> hf_shapes(const TransformerConfig& c, bool mxfp4) {
  const Dims d = dims(c);
  std::map<std::string, Shape> s = {{"model.embed_tokens.weight", {d.V, d.C}}, {"model.norm.weight", {d.C}}};
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string hf = hf_layer(l);
    s[hf + "input_layernorm.weight"] = {d.C};
    s[hf + "self_attn.q_proj.weight"] = {d.H * d.D, d.C};
    s[hf + "self_attn.q_proj.bias"] = {d.H * d.D};
    s[hf + "self_attn.k_proj.weight"] = {d.G * d.D, d.C};
    s[hf + "self_attn.k_proj.bias"] = {d.G * d.D};
    s[hf + "self_attn.v_proj.weight"] = {d.G * d.D, d.C};
    s[hf + "self_attn.v_proj.bias"] = {d.G * d.D};
    s[hf + "self_attn.o_proj.weight"] = {d.C, d.H * d.D};
    s[hf + "self_attn.o_proj.bias"] = {d.C};
    s[hf + "self_attn.sinks"] = {d.H};
    s[hf + "post_attention_layernorm.weight"] = {d.C};
    s[hf + "mlp.router.weight"] = {d.E, d.C};
    s[hf + "mlp.router.bias"] = {d.E};
    const std::string x = hf + "mlp.experts.";
    if (mxfp4) {
      s[x + "gate_up_proj_blocks"] = {d.E, 2 * d.I, d.C / 32, 16};
      s[x + "gate_up_proj_scales"] = {d.E, 2 * d.I, d.C / 32};
      s[x + "down_proj_blocks"] = {d.E, d.C, d.I / 32, 16};
      s[x + "down_proj_scales"] = {d.E, d.C, d.I / 32};
    } else {
      s[x + "gate_up_proj"] = {d.E, d.C, 2 * d.I};
      s[x + "down_proj"] = {d.E, d.I, d.C};
    }
    s[x + "gate_up_proj_bias"] = {d.E, 2 * d.I};
    s[x + "down_proj_bias"] = {d.E, d.C};
  }
  if (c.untie_embeddings_and_output_weights) s["lm_head.weight"] = {d.V, d.C};
  return s;
}

// Moves values between a lattice parameter (host copy `dst`, `numel` floats) and HF tensors, one
// direction per Mapper: `pull` copies HF -> lattice (import), else lattice -> HF (export). Each
// call names a lattice element and an HF element by index.
struct Mapper {
  bool pull;
  void operator()(float* lattice, int64_t li, float* hf, int64_t hi) const {
    if (pull)
      lattice[li] = hf[hi];
    else
      hf[hi] = lattice[li];
  }
};

// Expert e of layer l, both ways: its four lattice parameters and their blocks of the HF experts' tensors
// ([E, ...]; hf_expert(name, e) is expert e's block); with `only` (an experts' tensor's name after
// "mlp.experts.": gate_up_proj, gate_up_proj_bias, down_proj or down_proj_bias), just that tensor's pair.
template <class Param, class HfExpert>
void map_expert(const TransformerConfig& c, int64_t l, int64_t e, const Mapper& move, Param param,
                HfExpert hf_expert, const std::string& only = "") {
  const Dims d = dims(c);
  const std::string x = hf_layer(l) + "mlp.experts.";
  auto wants = [&](const char* tensor) { return only.empty() || only == tensor; };
  // linear_fc1 [2I, C]: the gate rows are HF's even columns of gate_up_proj [C, 2I], the up rows its odd ones.
  auto fc1_row = [&](int64_t r) { return r < d.I ? 2 * r : 2 * (r - d.I) + 1; };
  if (wants("gate_up_proj")) {
    float* fc1 = param(expert(l, e, "linear_fc1.weight"));
    float* gu = hf_expert(x + "gate_up_proj", e);
    for (int64_t r = 0; r < 2 * d.I; ++r)
      for (int64_t ci = 0; ci < d.C; ++ci) move(fc1, r * d.C + ci, gu, ci * 2 * d.I + fc1_row(r));
  }
  if (wants("gate_up_proj_bias")) {
    float* fc1_b = param(expert(l, e, "linear_fc1.bias"));
    float* gu_b = hf_expert(x + "gate_up_proj_bias", e);
    for (int64_t r = 0; r < 2 * d.I; ++r) move(fc1_b, r, gu_b, fc1_row(r));
  }
  if (wants("down_proj")) {  // linear_fc2 [C, I], down_proj [I, C]
    float* fc2 = param(expert(l, e, "linear_fc2.weight"));
    float* dn = hf_expert(x + "down_proj", e);
    for (int64_t ci = 0; ci < d.C; ++ci)
      for (int64_t i = 0; i < d.I; ++i) move(fc2, ci * d.I + i, dn, i * d.C + ci);
  }
  if (wants("down_proj_bias")) {
    float* fc2_b = param(expert(l, e, "linear_fc2.bias"));
    float* dn_b = hf_expert(x + "down_proj_bias", e);
    for (int64_t ci = 0; ci < d.C; ++ci) move(fc2_b, ci, dn_b, ci);
  }
}

// One part of the model's correspondence, both ways: layer l's tensors but its experts' (l >= 0, expert -1) or
// expert `expert`'s alone (map_expert), or the ones outside the layers (l -1: the embedding, the final norm, the
// output layer; with `only`, just the one of that lattice or HF name). `param(name)` is the lattice parameter's
// host data, `hf(name)` the HF tensor's, `hf_expert(name, e)` expert e's block of an experts' tensor ([E, ...];
// dequantized experts under their float names).
template <class Param, class Hf, class HfExpert>
void map_part(const TransformerConfig& c, int64_t l, const Mapper& move, Param param, Hf hf, HfExpert hf_expert,
              const std::string& only = "", int64_t expert = -1) {
  const Dims d = dims(c);
  auto whole = [&](const std::string& lat, const std::string& name, int64_t n) {
    if (!only.empty() && only != lat && only != name) return;
    float* p = param(lat);
    float* h = hf(name);
    for (int64_t i = 0; i < n; ++i) move(p, i, h, i);
  };
  if (l < 0) {
    whole("embedding.word_embeddings.weight", "model.embed_tokens.weight", d.V * d.C);
    whole("decoder.final_layernorm.weight", "model.norm.weight", d.C);
    if (c.untie_embeddings_and_output_weights) whole("output_layer.weight", "lm_head.weight", d.V * d.C);
    return;
  }
  if (expert >= 0) {
    map_expert(c, l, expert, move, param, hf_expert);
    return;
  }
  const std::string hl = hf_layer(l), ll = lattice_layer(l);
  whole(ll + "input_layernorm.weight", hl + "input_layernorm.weight", d.C);
  // linear_qkv: per query group, its heads' q rows, then its k and v rows (weights and biases).
  for (const char* kind : {"weight", "bias"}) {
    const int64_t row = std::string(kind) == "weight" ? d.C : 1;
    float* qkv = param(ll + "self_attention.linear_qkv." + kind);
    float* q = hf(hl + "self_attn.q_proj." + kind);
    float* k = hf(hl + "self_attn.k_proj." + kind);
    float* v = hf(hl + "self_attn.v_proj." + kind);
    int64_t at = 0;
    for (int64_t g = 0; g < d.G; ++g) {
      for (int64_t i = 0; i < d.per_group() * d.D * row; ++i) move(qkv, at++, q, g * d.per_group() * d.D * row + i);
      for (int64_t i = 0; i < d.D * row; ++i) move(qkv, at++, k, g * d.D * row + i);
      for (int64_t i = 0; i < d.D * row; ++i) move(qkv, at++, v, g * d.D * row + i);
    }
  }
  whole(ll + "self_attention.linear_proj.weight", hl + "self_attn.o_proj.weight", d.C * d.H * d.D);
  whole(ll + "self_attention.linear_proj.bias", hl + "self_attn.o_proj.bias", d.C);
  whole(ll + "self_attention.core_attention.softmax_offset", hl + "self_attn.sinks", d.H);
  whole(ll + "pre_mlp_layernorm.weight", hl + "post_attention_layernorm.weight", d.C);
  whole(ll + "mlp.router.weight", hl + "mlp.router.weight", d.E * d.C);
  whole(ll + "mlp.router.bias", hl + "mlp.router.bias", d.E);
}

// The layer pattern of layer_types (1: "sliding_attention", 0: "full_attention"); GptOssConfig's
// default (absent): sliding on the even layers.
std::vector<int> layer_pattern(const json& j, const std::string& what, int64_t layers) {
  std::vector<int> p(static_cast<size_t>(layers));
  if (!j.contains("layer_types") || j["layer_types"].is_null()) {
    for (int64_t l = 0; l < layers; ++l) p[size_t(l)] = (l + 1) % 2 != 0;
    return p;
  }
  const json& t = j["layer_types"];
  if (!t.is_array() || int64_t(t.size()) != layers)
    LATTICE_FAIL() << what << ": layer_types must list num_hidden_layers " << layers << " layer types";
  for (int64_t l = 0; l < layers; ++l) {
    const std::string type = t[size_t(l)].is_string() ? t[size_t(l)].get<std::string>() : t[size_t(l)].dump();
    if (type != "sliding_attention" && type != "full_attention")
      LATTICE_FAIL() << what << ": layer_types[" << l << "] is '" << type
                     << "' (sliding_attention or full_attention)";
    p[size_t(l)] = type == "sliding_attention";
  }
  return p;
}

}  // namespace

bool is_hf_gpt_oss_config(const json& j) {
  if (j.value("model_type", std::string()) == "gpt_oss") return true;
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const json& a : j["architectures"])
      if (a.is_string() && a.get<std::string>() == "GptOssForCausalLM") return true;
  return false;
}

TransformerConfig hf_gpt_oss_config(const json& j, const std::string& what, int64_t divisible_by) {
  TransformerConfig c;
  c.num_layers = hf::config_int(j, what, "num_hidden_layers");
  c.hidden_size = hf::config_int(j, what, "hidden_size");
  c.num_attention_heads = hf::config_int(j, what, "num_attention_heads");
  c.num_query_groups = j.contains("num_key_value_heads") ? hf::config_int(j, what, "num_key_value_heads")
                                                         : c.num_attention_heads;
  c.kv_channels = j.contains("head_dim") && !j["head_dim"].is_null() ? hf::config_int(j, what, "head_dim") : 0;
  c.ffn_hidden_size = c.moe_ffn_hidden_size = hf::config_int(j, what, "intermediate_size");
  c.num_experts = hf::config_int(j, what, "num_local_experts");
  c.moe_router_topk = hf::config_int(j, what, j.contains("num_experts_per_tok") ? "num_experts_per_tok" : "experts_per_token");
  c.vocab_size = hf::config_int(j, what, "vocab_size");
  c.max_position_embeddings = hf::config_int(j, what, "max_position_embeddings");
  c.make_vocab_size_divisible_by = divisible_by;
  c.layernorm_epsilon = float(hf::config_positive(j, what, "rms_norm_eps", 1e-5));
  c.untie_embeddings_and_output_weights = !hf::config_bool(j, what, "tie_word_embeddings", false);
  if (!hf::config_bool(j, what, "attention_bias", true))
    LATTICE_FAIL() << what << ": attention_bias false is not supported (GPT-OSS's attention has biases)";
  if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
    const json& q = j["quantization_config"];
    const std::string method = q.is_object() ? q.value("quant_method", std::string()) : "";
    if (method != "mxfp4")
      LATTICE_FAIL() << what << ": quantization_config " << q.dump() << " is not supported (mxfp4 only)";
  }
  c.hidden_dropout = 0.0f;
  c.attention_dropout = j.contains("attention_dropout") && j["attention_dropout"].is_number()
                            ? float(j["attention_dropout"].get<double>())
                            : 0.0f;
  // Positions: the rotary embedding over every dim, plain or with YaRN's rope_scaling.
  c.position_embedding_type = "rope";
  c.rotary_percent = 1.0;
  c.rotary_base = float(hf::config_positive(j, what, "rope_theta", 150000.0));
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& s = j["rope_scaling"];
    const std::string type = s.is_object() ? s.value("rope_type", s.value("type", std::string())) : "";
    if (type != "yarn") LATTICE_FAIL() << what << ": rope_scaling " << s.dump() << " is not supported (none or yarn)";
    hf::read_yarn_rope_scaling(j, s, what, c);
  }
  // Attention: learnable sinks; sliding_window keys (the query's own among them) on the sliding layers.
  c.softmax_type = "learnable";
  const std::vector<int> pattern = layer_pattern(j, what, c.num_layers);
  if (std::find(pattern.begin(), pattern.end(), 1) != pattern.end()) {
    c.window_size = (j.contains("sliding_window") ? hf::config_int(j, what, "sliding_window") : 128) - 1;
    c.window_attn_pattern = pattern;
  }
  // The MLP: experts of GPT-OSS's clamped quick GEGLU, with biases; the router's softmax over the top k.
  c.normalization = "RMSNorm";
  c.add_bias_linear = true;
  c.quick_geglu = true;
  c.glu_linear_offset = 1.0f;
  c.activation_func_clamp_value = float(hf::config_positive(j, what, "swiglu_limit", 7.0));
  c.finalize();
  return c;
}

json hf_gpt_oss_config_json(const TransformerConfig& c, const std::string& tokenizer_type) {
  json layer_types = json::array();
  for (int64_t l = 0; l < c.num_layers; ++l)
    layer_types.push_back(c.attention_window(l) >= 0 ? "sliding_attention" : "full_attention");
  json j = {{"architectures", {"GptOssForCausalLM"}},
            {"attention_bias", true},
            {"attention_dropout", 0.0},
            {"experts_per_token", c.moe_router_topk},
            {"head_dim", c.kv_channels},
            {"hidden_act", "silu"},
            {"hidden_size", c.hidden_size},
            {"initializer_range", 0.02},
            {"intermediate_size", c.moe_ffn_hidden_size},
            {"layer_types", layer_types},
            {"max_position_embeddings", c.max_position_embeddings},
            {"model_type", "gpt_oss"},
            {"num_attention_heads", c.num_attention_heads},
            {"num_experts_per_tok", c.moe_router_topk},
            {"num_hidden_layers", c.num_layers},
            {"num_key_value_heads", c.num_query_groups},
            {"num_local_experts", c.num_experts},
            {"output_router_logits", false},
            {"rms_norm_eps", hf::shortest_float(c.layernorm_epsilon)},
            {"rope_scaling", nullptr},
            {"rope_theta", hf::shortest_float(c.rotary_base)},
            {"sliding_window", c.window_size >= 0 ? c.window_size + 1 : 128},
            {"swiglu_limit", hf::shortest_float(c.activation_func_clamp_value)},
            {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
            {"torch_dtype", "float32"},
            {"use_cache", true},
            {"vocab_size", c.vocab_size}};
  if (c.yarn()) {
    j["rope_scaling"] = hf::yarn_rope_scaling_json(c);
    j["initial_context_length"] = c.yarn_original_max_position_embeddings;
  }
  if (!tokenizer_type.empty()) j[kHfTokenizerKey] = tokenizer_type;
  return j;
}

std::string hf_gpt_oss_mismatch(const TransformerConfig& c) {
  if (c.attention_output_gate) return "the attention output gate (--attention-output-gate; HuggingFace GPT-OSS has none)";
  if (!c.moe() || !c.moe_layer_pattern.empty())
    return "dense MLP layers (HuggingFace GPT-OSS's every MLP is a mixture of experts: --num-experts without "
           "--moe-layer-freq)";
  if (!c.quick_geglu || c.glu_linear_offset != 1.0f || c.activation_func_clamp_value <= 0.0f)
    return "experts other than GPT-OSS's clamped quick GEGLU (--quick-geglu --glu-linear-offset 1 "
           "--activation-func-clamp-value)";
  if (!c.add_bias_linear) return "no linear biases (HuggingFace GPT-OSS's attention, router and experts have them)";
  if (!c.learnable_softmax_offset())
    return "no learnable attention sinks (--softmax-type learnable; HuggingFace GPT-OSS's self_attn.sinks)";
  if (!c.rmsnorm() || c.apply_layernorm_1p) return "a norm other than RMSNorm scaling by its weight";
  if (!c.rope() || c.rotary_percent != 1.0 || c.rotary_interleaved || c.use_rope_scaling ||
      c.rotary_seq_len_interpolation_factor > 0.0f)
    return "positions other than the rotary embedding over every dim, plain or with YaRN (--position-embedding-type "
           "rope or yarn, --rotary-percent 1)";
  if (!c.no_rope_pattern.empty()) return "--no-rope-freq (HuggingFace GPT-OSS rotates in every layer)";
  if (c.qk_layernorm) return "--qk-layernorm (HuggingFace GPT-OSS normalizes no query or key)";
  if (c.qk_l2_norm) return "--qk-l2-norm (HuggingFace GPT-OSS normalizes no query or key)";
  if (c.moe_shared_expert_intermediate_size > 0) return "shared experts (HuggingFace GPT-OSS has none)";
  if (c.moe_apply_probs_on_input) return "--moe-apply-probs-on-input (HuggingFace GPT-OSS weighs the experts' outputs)";
  if (c.moe_router_pre_softmax || c.moe_router_sigmoid() || c.moe_router_topk_scaling_factor != 1.0f ||
      c.moe_router_num_groups > 0 || c.moe_router_enable_expert_bias)
    return "routing other than the softmax over the top k logits (HuggingFace GPT-OSS's router)";
  return "";
}

std::vector<float> decode_mxfp4(const SafetensorsFile& f, const std::string& blocks, const std::string& scales) {
  return decode_mxfp4(f, blocks, scales, 0, f.get(scales).numel());
}

std::vector<float> decode_mxfp4(const SafetensorsFile& f, const std::string& blocks, const std::string& scales,
                                int64_t first, int64_t count) {
  const SafeTensor& b = f.get(blocks);
  const SafeTensor& s = f.get(scales);
  for (const auto& [t, name] : {std::pair<const SafeTensor*, const std::string*>{&b, &blocks}, {&s, &scales}})
    if (t->dtype != "U8")
      LATTICE_FAIL() << f.path() << ": tensor " << *name << " is " << t->dtype << ", MXFP4 needs U8";
  if (b.shape.size() < 2 || b.shape.back() != 16 ||
      Shape(b.shape.begin(), b.shape.end() - 1) != s.shape)
    LATTICE_FAIL() << f.path() << ": MXFP4 " << blocks << " " << shape_str(b.shape) << " and " << scales << " "
                   << shape_str(s.shape) << " do not pair (blocks [..., G, 16], scales [..., G])";
  LATTICE_CHECK(first >= 0 && count >= 0 && first + count <= s.numel())
      << f.path() << ": MXFP4 groups [" << first << ", " << first + count << ") of tensor " << scales << " ("
      << s.numel() << " groups)";
  std::vector<float> out(static_cast<size_t>(count * 32));
  for (int64_t k = 0; k < count; ++k) {
    const int64_t g = first + k;
    const float scale = std::ldexp(1.0f, int(s.bytes[size_t(g)]) - 127);
    for (int64_t i = 0; i < 16; ++i) {
      const uint8_t byte = b.bytes[size_t(g * 16 + i)];
      out[size_t(k * 32 + 2 * i)] = kFp4[byte & 0x0F] * scale;
      out[size_t(k * 32 + 2 * i + 1)] = kFp4[byte >> 4] * scale;
    }
  }
  return out;
}

namespace {

// The file's tensors against the config: every one there with its shape, no other; errors name the file and the
// tensor.
void check_file(const TransformerConfig& c, const SafetensorsFile& f, bool mxfp4) {
  const Dims d = dims(c);
  const std::string& path = f.path();
  if (mxfp4 && (d.C % 32 != 0 || d.I % 32 != 0))
    LATTICE_FAIL() << path << ": MXFP4 experts need hidden_size " << d.C << " and intermediate_size " << d.I
                   << " to be multiples of 32 (its blocks)";
  const std::map<std::string, Shape> shapes = hf_shapes(c, mxfp4);
  for (const auto& [name, shape] : shapes) {
    if (!f.has(name)) LATTICE_FAIL() << path << ": missing tensor " << name;
    if (f.get(name).shape != shape)
      LATTICE_FAIL() << path << ": tensor " << name << " has shape " << shape_str(f.get(name).shape)
                     << ", config.json implies " << shape_str(shape);
  }
  for (const std::string& name : f.names())
    if (!shapes.count(name))
      LATTICE_FAIL() << path << ": unexpected tensor " << name << " (config.json has num_hidden_layers "
                     << c.num_layers << (mxfp4 ? ", MXFP4 experts" : ", no quantization") << ")";
}

// The HF tensor `name` as fp32, its pages given back (not the experts' weights: read_expert reads those).
std::vector<float> read_tensor(const SafetensorsFile& f, const std::string& name) {
  std::vector<float> out = hf::read_float_tensor(f, name);
  f.release(name);
  return out;
}

// Expert e's block of a layer's experts' tensor `name` in HF's float layout (gate_up_proj [C, 2I], down_proj
// [I, C], or its bias), from MXFP4 where the file has the weights so, decoding that expert's groups alone; the
// pages read given back.
std::vector<float> read_expert(const TransformerConfig& c, const SafetensorsFile& f, bool mxfp4,
                               const std::string& name, int64_t e) {
  const Dims d = dims(c);
  auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  const bool gate_up = ends_with(".gate_up_proj"), down = ends_with(".down_proj");
  if (mxfp4 && (gate_up || down)) {  // decoded [2I, C] -> HF's [C, 2I]; [C, I] -> [I, C]
    const int64_t rows = gate_up ? 2 * d.I : d.C, cols = gate_up ? d.C : d.I, groups = rows * cols / 32;
    const std::vector<float> dec = decode_mxfp4(f, name + "_blocks", name + "_scales", e * groups, groups);
    std::vector<float> out(dec.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) out[size_t(k * rows + r)] = dec[size_t(r * cols + k)];
    f.release(name + "_blocks");
    f.release(name + "_scales");
    return out;
  }
  const int64_t per = f.get(name).numel() / d.E;
  std::vector<float> out(static_cast<size_t>(per));
  hf::read_float_elements(f, name, e * per, per, out.data());
  f.release(name);
  return out;
}

// A layer's parameters but its experts' (l >= 0, expert -1) or one expert's, or the one outside the layers
// named `only` (l -1), from f: name -> values (`numel(name)` floats each, zero where the file gives nothing: the
// padded vocabulary rows). With `into`, the one parameter is made there instead (and none returned).
std::map<std::string, std::vector<float>> read_part(const TransformerConfig& c, const SafetensorsFile& f, bool mxfp4,
                                                    int64_t l, const std::function<int64_t(const std::string&)>& numel,
                                                    const std::string& only, int64_t expert, float* into = nullptr) {
  std::map<std::string, std::vector<float>> params, data;  // data: each HF tensor (block) read once
  auto param = [&](const std::string& name) {
    if (into) {
      std::fill(into, into + numel(name), 0.0f);
      return into;
    }
    std::vector<float>& v = params[name];
    v.assign(size_t(numel(name)), 0.0f);
    return v.data();
  };
  auto hf = [&](const std::string& name) -> float* {
    auto it = data.find(name);
    return (it != data.end() ? it->second : data[name] = read_tensor(f, name)).data();
  };
  auto hf_expert = [&](const std::string& name, int64_t e) -> float* {
    return (data[name] = read_expert(c, f, mxfp4, name, e)).data();
  };
  map_part(c, l, Mapper{true}, param, hf, hf_expert, only, expert);
  return params;
}

// The layer a tensor belongs to (lattice's decoder.layers.<l>. or HF's model.layers.<l>.), or -1.
int64_t part_of(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  return std::stoll(name.substr(prefix.size()));
}
int64_t layer_of(const std::string& name) { return part_of(name, "decoder.layers."); }
// The expert a parameter belongs to (decoder.layers.<l>.mlp.experts.local_experts.<e>.), or -1.
int64_t expert_of(const std::string& name) {
  const std::string mark = ".mlp.experts.local_experts.";
  const size_t at = name.find(mark);
  return at == std::string::npos ? -1 : std::stoll(name.substr(at + mark.size()));
}
int64_t hf_layer_of(const std::string& name) { return part_of(name, "model.layers."); }

}  // namespace

SafetensorsWriter export_hf_gpt_oss_tensors(const GPTModel& model) {
  return export_hf_gpt_oss_tensors(hf::model_source(model));
}

SafetensorsWriter export_hf_gpt_oss_tensors(const hf::ExportSource& src) {
  const TransformerConfig& c = src.config;
  auto shapes = std::make_shared<const std::map<std::string, Shape>>(hf_shapes(c, false));
  // Each HF tensor made when written: a layer's experts' tensors ([E, ...]) in pieces of an expert, each from
  // the one parameter of that expert it comes from; a tensor outside the layers from its parameter; a layer's
  // other tensors made together once from their parameters (that part alone in memory).
  struct Part {
    std::string key;  // "model.layers.<l>."
    std::map<std::string, std::vector<float>> hf;
  };
  auto part = std::make_shared<Part>();
  auto unused = [](const std::string& name, const std::string& n) -> float* {
    LATTICE_FAIL() << "GPT-OSS export: " << name << " asked for " << n;
  };
  SafetensorsWriter w;
  for (const auto& [name, shape] : *shapes) {
    const size_t bytes = size_t(shape_numel(shape)) * sizeof(float);
    const int64_t l = hf_layer_of(name);
    const std::string experts = l >= 0 ? hf_layer(l) + "mlp.experts." : "";
    if (l >= 0 && name.compare(0, experts.size(), experts) == 0) {
      w.add_produced(name, "F32", shape, bytes, c.num_experts,
                     [src, l, tensor = name.substr(experts.size())](int64_t e, uint8_t* out) {
                       std::map<std::string, std::vector<float>> params;
                       auto param = [&](const std::string& n) { return (params[n] = hf::read_param(src, n)).data(); };
                       map_expert(src.config, l, e, Mapper{false}, param,
                                  [&](const std::string&, int64_t) { return reinterpret_cast<float*>(out); }, tensor);
                     });
      continue;
    }
    w.add_produced(name, "F32", shape, bytes, [src, shapes, part, unused, l, name = name](uint8_t* bytes_out) {
      float* out = reinterpret_cast<float*>(bytes_out);
      std::map<std::string, std::vector<float>> params;
      auto param = [&](const std::string& n) { return (params[n] = hf::read_param(src, n)).data(); };
      auto no_expert = [&](const std::string& n, int64_t) { return unused(name, n); };
      if (l < 0) {  // the embedding, the final norm or the output layer: this tensor alone
        map_part(src.config, l, Mapper{false}, param, [&](const std::string&) { return out; }, no_expert, name);
        return;
      }
      if (part->key != hf_layer(l)) {
        part->hf.clear();
        auto hf = [&](const std::string& n) -> float* {
          std::vector<float>& v = part->hf[n];
          if (v.empty()) v.assign(size_t(shape_numel(shapes->at(n))), 0.0f);
          return v.data();
        };
        map_part(src.config, l, Mapper{false}, param, hf, no_expert);
        part->key = hf_layer(l);
      }
      const std::vector<float>& v = part->hf.at(name);
      std::memcpy(out, v.data(), v.size() * sizeof(float));
    });
  }
  w.set_metadata("format", "pt");
  return w;
}

HfSource open_hf_gpt_oss(const std::string& dir, int64_t divisible_by) {
  hf::OpenedFolder o = hf::open_folder(dir, [divisible_by](const json& j, const std::string& what,
                                                           const SafetensorsFile&) {
    return hf_gpt_oss_config(j, what, divisible_by);
  });
  HfSource& out = o.source;
  const auto& f = o.file;
  const json& j = o.config_json;
  const bool mxfp4 = j.contains("quantization_config") && !j["quantization_config"].is_null();
  check_file(out.config, *f, mxfp4);
  // The part the parameter being written is in, read whole once: a layer's tensors but its experts', or an
  // expert's (decoded alone); one part in memory at a time, the checkpoint's parameters in layer order and a
  // layer's experts' together. A tensor outside the layers is made where the writer wants it.
  struct Part {
    std::string key;  // "decoder.layers.<l>.", or an expert's "...local_experts.<e>."
    std::map<std::string, std::vector<float>> params;
  };
  auto part = std::make_shared<Part>();
  auto registry = std::make_shared<const ParamBuffer>(
      GPTModel::parameter_registry(out.config, TensorParallel{}, ModelPlacement{}, 0, 1));
  out.fill = [f, part, registry, mxfp4, c = out.config](const ParamInfo& p, float* dst) {
    const int64_t l = layer_of(p.name), e = l >= 0 ? expert_of(p.name) : -1;
    auto numel = [&](const std::string& name) { return registry->info(name).numel; };
    if (l < 0) {  // a tensor outside the layers (the embedding, the output layer): made in dst
      read_part(c, *f, mxfp4, l, numel, p.name, -1, dst);
      return;
    }
    const std::string key = e < 0 ? lattice_layer(l) : expert(l, e, "");
    if (part->key != key) {
      part->params.clear();
      part->params = read_part(c, *f, mxfp4, l, numel, "", e);
      part->key = key;
    }
    const auto it = part->params.find(p.name);
    if (it == part->params.end()) {
      std::fill(dst, dst + p.numel, 0.0f);  // (a parameter the file does not give: zero)
      return;
    }
    std::copy(it->second.begin(), it->second.end(), dst);
  };
  return out;
}

HfModel load_hf_gpt_oss(const std::string& dir, int64_t divisible_by, int64_t seq_length, bool gradients) {
  return hf::load_source(open_hf_gpt_oss(dir, divisible_by), seq_length, gradients);
}

void save_hf_gpt_oss(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                     const hf::ExportOptions& options) {
  save_hf_gpt_oss(dir, hf::model_source(model), tokenizer_type, options);
}

void save_hf_gpt_oss(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                     const hf::ExportOptions& options) {
  const std::string why = hf_gpt_oss_mismatch(src.config);
  if (!why.empty()) LATTICE_FAIL() << "--to-hf " << dir << ": the checkpoint's model has " << why;
  hf::write_model_folder(dir, export_hf_gpt_oss_tensors(src), hf_gpt_oss_config_json(src.config, tokenizer_type),
                         options);
}

}  // namespace lattice
