#include "checkpoint/hf_starcoder2.h"

#include <map>
#include <vector>

#include "checkpoint/hf_tensor_map.h"
#include "core/error.h"

namespace lattice {
namespace {

using json = nlohmann::json;
using hf::TensorMap;

// Each lattice parameter's HF tensor and every HF tensor's shape.
std::vector<TensorMap> tensor_map(const TransformerConfig& c, std::map<std::string, Shape>& s) {
  const int64_t C = c.hidden_size, V = c.vocab_size, F = c.ffn_hidden_size;
  const int64_t Q = c.attention_width(), KV = c.kv_channels * c.num_query_groups;
  std::vector<TensorMap> m = {{"embedding.word_embeddings.weight", {{"model.embed_tokens.weight"}}, true}};
  s["model.embed_tokens.weight"] = {V, C};
  auto same = [&](const std::string& lat, const std::string& hf, Shape shape) {
    m.push_back({lat, {{hf}}});
    s[hf] = std::move(shape);
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string lat = "decoder.layers." + std::to_string(l) + ".";
    const std::string hf = "model.layers." + std::to_string(l) + ".";
    same(lat + "input_layernorm.weight", hf + "input_layernorm.weight", {C});
    same(lat + "input_layernorm.bias", hf + "input_layernorm.bias", {C});
    for (const char* kind : {"weight", "bias"}) {
      m.push_back(hf::grouped_qkv(c, lat + "self_attention.linear_qkv." + kind, hf + "self_attn.", kind));
      const bool w = std::string(kind) == "weight";
      s[hf + "self_attn.q_proj." + kind] = w ? Shape{Q, C} : Shape{Q};
      s[hf + "self_attn.k_proj." + kind] = w ? Shape{KV, C} : Shape{KV};
      s[hf + "self_attn.v_proj." + kind] = w ? Shape{KV, C} : Shape{KV};
    }
    same(lat + "self_attention.linear_proj.weight", hf + "self_attn.o_proj.weight", {C, Q});
    same(lat + "self_attention.linear_proj.bias", hf + "self_attn.o_proj.bias", {C});
    same(lat + "pre_mlp_layernorm.weight", hf + "post_attention_layernorm.weight", {C});
    same(lat + "pre_mlp_layernorm.bias", hf + "post_attention_layernorm.bias", {C});
    same(lat + "mlp.linear_fc1.weight", hf + "mlp.c_fc.weight", {F, C});
    same(lat + "mlp.linear_fc1.bias", hf + "mlp.c_fc.bias", {F});
    same(lat + "mlp.linear_fc2.weight", hf + "mlp.c_proj.weight", {C, F});
    same(lat + "mlp.linear_fc2.bias", hf + "mlp.c_proj.bias", {C});
  }
  same("decoder.final_layernorm.weight", "model.norm.weight", {C});
  same("decoder.final_layernorm.bias", "model.norm.bias", {C});
  if (c.untie_embeddings_and_output_weights) {
    m.push_back({"output_layer.weight", {{"lm_head.weight"}}, true});
    s["lm_head.weight"] = {V, C};
  }
  return m;
}

hf::ImportPlan import_plan(const TransformerConfig& c, const SafetensorsFile& f, const json&) {
  hf::ImportPlan p;
  p.map = tensor_map(c, p.shapes);
  hf::check_tensor_shapes(f, p.shapes);
  hf::check_no_other_tensors(f, p.shapes, c);
  return p;
}

hf::ConfigFn config_fn(int64_t divisible_by) {
  return [divisible_by](const json& j, const std::string& what, const SafetensorsFile&) {
    return hf_starcoder2_config(j, what, divisible_by);
  };
}

}  // namespace

bool is_hf_starcoder2_config(const json& j) {
  if (!j.is_object()) return false;
  if (j.contains("model_type")) return j["model_type"] == "starcoder2";
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const json& a : j["architectures"])
      if (a == "Starcoder2ForCausalLM") return true;
  return false;
}

TransformerConfig hf_starcoder2_config(const json& j, const std::string& what, int64_t divisible_by) {
  if (!is_hf_starcoder2_config(j))
    LATTICE_FAIL() << what << ": not a StarCoder2 config (model_type " << j.value("model_type", json()).dump() << ")";
  TransformerConfig c;
  hf::read_decoder_sizes(j, what, c);
  c.ffn_hidden_size = hf::config_int(j, what, "intermediate_size");
  hf::read_grouped_heads(j, what, c, false);  // Starcoder2Config's heads are hidden / heads wide
  const std::string act = j.value("hidden_act", std::string("gelu_pytorch_tanh"));
  if (act != "gelu_pytorch_tanh" && act != "gelu_new")
    LATTICE_FAIL() << what << ": hidden_act \"" << act << "\" is not supported (gelu_pytorch_tanh)";
  c.gelu = GeluKind::tanh;
  if (!hf::config_bool(j, what, "use_bias", true))
    LATTICE_FAIL() << what << ": use_bias false is not supported (lattice's StarCoder2 biases every linear layer)";
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    LATTICE_FAIL() << what << ": rope_scaling " << j["rope_scaling"].dump().substr(0, 200)
                   << " is not supported (StarCoder2's is null)";
  c.position_embedding_type = "rope";
  c.rotary_percent = 1.0;
  c.rotary_interleaved = false;
  c.rotary_base = float(hf::config_positive(j, what, "rope_theta", 10000.0));
  c.normalization = "LayerNorm";
  c.layernorm_epsilon = float(hf::config_positive(j, what, "norm_epsilon", 1e-5));  // Starcoder2Config's defaults
  c.add_bias_linear = true;
  // Mistral's window: query i sees keys j > i - W (W keys), lattice's window W - 1; none at least the context.
  if (j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    const int64_t W = hf::config_int(j, what, "sliding_window");
    if (W < c.max_position_embeddings) c.window_size = W - 1;
  }
  c.untie_embeddings_and_output_weights = !hf::config_bool(j, what, "tie_word_embeddings", true);
  c.make_vocab_size_divisible_by = divisible_by;
  c.hidden_dropout = c.attention_dropout = 0.0f;
  c.finalize();
  return c;
}

json hf_starcoder2_config_json(const TransformerConfig& c, const std::string& tokenizer_type) {
  json j = {{"architectures", {"Starcoder2ForCausalLM"}},
            {"attention_dropout", 0.0},
            {"embedding_dropout", 0.0},
            {"hidden_act", "gelu_pytorch_tanh"},
            {"hidden_size", c.hidden_size},
            {"initializer_range", 0.02},
            {"intermediate_size", c.ffn_hidden_size},
            {"max_position_embeddings", c.max_position_embeddings},
            {"model_type", "starcoder2"},
            {"norm_epsilon", hf::shortest_float(c.layernorm_epsilon)},
            {"num_attention_heads", c.num_attention_heads},
            {"num_hidden_layers", c.num_layers},
            {"num_key_value_heads", c.num_query_groups},
            {"residual_dropout", 0.0},
            {"rope_theta", hf::shortest_float(c.rotary_base)},
            {"sliding_window", c.window_size >= 0 ? json(c.window_size + 1) : json(nullptr)},
            {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
            {"torch_dtype", "float32"},
            {"use_bias", true},
            {"use_cache", true},
            {"vocab_size", c.vocab_size}};
  if (!tokenizer_type.empty()) j[kHfTokenizerKey] = tokenizer_type;
  return j;
}

std::string hf_starcoder2_mismatch(const TransformerConfig& c) {
  const char* why =
      c.hybrid() || c.gated_delta_net() || c.multi_latent_attention || c.moe() || c.mtp()
          ? "layers other than dense attention and MLP ones (HuggingFace StarCoder2's are all dense)"
      : c.attention_output_gate ? "the attention output gate (--attention-output-gate; HuggingFace StarCoder2 has none)"
      : !c.rope()               ? "no rotary embedding (HuggingFace StarCoder2 rotates whole heads)"
      : c.rotary_percent != 1.0 ? "--rotary-percent below 1 (HuggingFace StarCoder2 rotates whole heads)"
      : c.rotary_interleaved    ? "--rotary-interleaved (HuggingFace StarCoder2 rotates rotate_half pairs)"
      : c.yarn() || c.use_rope_scaling || c.rotary_seq_len_interpolation_factor > 0.0f || c.longrope()
          ? "rope scaling (HuggingFace StarCoder2's rope_scaling is null)"
      : !c.no_rope_pattern.empty() ? "--no-rope-freq (HuggingFace StarCoder2 rotates every layer)"
      : c.qk_norm()                ? "query and key norms (HuggingFace StarCoder2 has none)"
      : c.rmsnorm()                ? "RMSNorm (HuggingFace StarCoder2 has LayerNorm with biases)"
      : c.apply_layernorm_1p       ? "zero-centered norm weights (--apply-layernorm-1p)"
      : c.gated_linear_unit()      ? "a gated MLP (HuggingFace StarCoder2's is c_fc -> GELU -> c_proj)"
      : c.gelu != GeluKind::tanh   ? "a GELU other than the tanh approximation (HuggingFace StarCoder2's "
                                     "gelu_pytorch_tanh: --openai-gelu)"
      : !c.add_bias_linear         ? "no linear biases (HuggingFace StarCoder2 biases every linear layer)"
      : c.kv_channels * c.num_attention_heads != c.hidden_size
          ? "--kv-channels other than hidden / heads (HuggingFace StarCoder2 has no head_dim)"
      : c.softmax_sink()                ? "attention sinks (--softmax-type)"
      : !c.window_attn_pattern.empty() ? "--window-attn-skip-freq (HuggingFace StarCoder2's window is on every layer)"
                                        : nullptr;
  return why ? why : "";
}

HfModel load_hf_starcoder2(const std::string& dir, int64_t divisible_by, int64_t seq_length, bool gradients) {
  return hf::load_source(open_hf_starcoder2(dir, divisible_by), seq_length, gradients);
}

HfSource open_hf_starcoder2(const std::string& dir, int64_t divisible_by) {
  return hf::open_planned_folder(dir, config_fn(divisible_by), import_plan);
}

void save_hf_starcoder2(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                        const hf::ExportOptions& options) {
  save_hf_starcoder2(dir, hf::model_source(model), tokenizer_type, options);
}

void save_hf_starcoder2(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                        const hf::ExportOptions& options) {
  const TransformerConfig& c = src.config;
  const std::string why = hf_starcoder2_mismatch(c);
  if (!why.empty()) LATTICE_FAIL() << "--to-hf " << dir << ": the checkpoint's model has " << why;
  std::map<std::string, Shape> shapes;
  const std::vector<TensorMap> map = tensor_map(c, shapes);
  hf::write_model_folder(dir, hf::export_tensors(*src.layout, src.rows, map, shapes),
                         hf_starcoder2_config_json(c, tokenizer_type), options);
}

}  // namespace lattice
