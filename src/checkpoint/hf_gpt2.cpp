#include "checkpoint/hf_gpt2.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "checkpoint/host_staging.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace lattice {
namespace {

using json = nlohmann::json;
using hf::config_bool;
using hf::config_int;
using hf::read_float_tensor;

// How a lattice parameter is stored in the HF file.
enum class Layout {
  same,        // identical shape and order (LayerNorm, position embeddings, biases)
  transposed,  // Conv1D: HF [in, out] is lattice's [out, in] transposed
  qkv_weight,  // HF [C, 3C] with columns [q | k | v]; lattice [3C, C] with rows [H, 3, D]
  qkv_bias,    // HF [3C] as [q | k | v]; lattice [3C] as [H, 3, D]
  vocab_rows,  // HF [V, C]; lattice [Vp, C], rows V..Vp-1 zero on import, dropped on export
};

struct TensorMap {
  std::string lattice;  // Megatron-Core name
  std::string hf;       // HF name without the "transformer." prefix (lm_head.weight has none)
  Layout layout;
};

std::vector<TensorMap> tensor_map(const TransformerConfig& c) {
  std::vector<TensorMap> m = {
      {"embedding.word_embeddings.weight", "wte.weight", Layout::vocab_rows},
      {"embedding.position_embeddings.weight", "wpe.weight", Layout::same},
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string lat = "decoder.layers." + std::to_string(l) + ".";
    const std::string hf = "h." + std::to_string(l) + ".";
    m.push_back({lat + "input_layernorm.weight", hf + "ln_1.weight", Layout::same});
    m.push_back({lat + "input_layernorm.bias", hf + "ln_1.bias", Layout::same});
    m.push_back({lat + "self_attention.linear_qkv.weight", hf + "attn.c_attn.weight", Layout::qkv_weight});
    m.push_back({lat + "self_attention.linear_qkv.bias", hf + "attn.c_attn.bias", Layout::qkv_bias});
    m.push_back({lat + "self_attention.linear_proj.weight", hf + "attn.c_proj.weight", Layout::transposed});
    m.push_back({lat + "self_attention.linear_proj.bias", hf + "attn.c_proj.bias", Layout::same});
    m.push_back({lat + "pre_mlp_layernorm.weight", hf + "ln_2.weight", Layout::same});
    m.push_back({lat + "pre_mlp_layernorm.bias", hf + "ln_2.bias", Layout::same});
    m.push_back({lat + "mlp.linear_fc1.weight", hf + "mlp.c_fc.weight", Layout::transposed});
    m.push_back({lat + "mlp.linear_fc1.bias", hf + "mlp.c_fc.bias", Layout::same});
    m.push_back({lat + "mlp.linear_fc2.weight", hf + "mlp.c_proj.weight", Layout::transposed});
    m.push_back({lat + "mlp.linear_fc2.bias", hf + "mlp.c_proj.bias", Layout::same});
  }
  m.push_back({"decoder.final_layernorm.weight", "ln_f.weight", Layout::same});
  m.push_back({"decoder.final_layernorm.bias", "ln_f.bias", Layout::same});
  if (c.untie_embeddings_and_output_weights)
    m.push_back({"output_layer.weight", "lm_head.weight", Layout::vocab_rows});
  return m;
}

// The HF shape of a lattice parameter of shape `s`.
Shape hf_shape(const Shape& s, Layout layout, int64_t vocab_size) {
  switch (layout) {
    case Layout::transposed:
    case Layout::qkv_weight: return {s[1], s[0]};
    case Layout::vocab_rows: return {vocab_size, s[1]};
    default: return s;
  }
}

// Lattice linear_qkv row of HF c_attn output column col (C = H * D).
int64_t qkv_row(int64_t col, int64_t C, int64_t D) {
  const int64_t j = col / C, h = (col % C) / D, d = col % D;  // j: 0 q, 1 k, 2 v
  return (h * 3 + j) * D + d;
}

// HF tensor `name` of f (hf_shape layout) -> lattice parameter `dst` of shape s, read straight into dst
// where the layout is the same and a row at a time where it moves the elements (no copy of the tensor).
void to_lattice(float* dst, const SafetensorsFile& f, const std::string& name, const Shape& s, Layout layout,
                int64_t vocab_size, int64_t D) {
  std::vector<float> row;
  const auto read_row = [&](int64_t i, int64_t width) {  // HF row i of `width` elements
    row.resize(size_t(width));
    hf::read_float_elements(f, name, i * width, width, row.data());
  };
  switch (layout) {
    case Layout::same: hf::read_float_elements(f, name, 0, shape_numel(s), dst); break;
    case Layout::vocab_rows:
      hf::read_float_elements(f, name, 0, vocab_size * s[1], dst);
      std::memset(dst + vocab_size * s[1], 0, size_t((s[0] - vocab_size) * s[1]) * sizeof(float));
      break;
    case Layout::transposed:  // HF [in = s[1], out = s[0]]
      for (int64_t i = 0; i < s[1]; ++i) {
        read_row(i, s[0]);
        for (int64_t o = 0; o < s[0]; ++o) dst[o * s[1] + i] = row[size_t(o)];
      }
      break;
    case Layout::qkv_weight: {  // HF [C, 3C], dst [3C, C]
      const int64_t C = s[1];
      for (int64_t i = 0; i < C; ++i) {
        read_row(i, 3 * C);
        for (int64_t col = 0; col < 3 * C; ++col) dst[qkv_row(col, C, D) * C + i] = row[size_t(col)];
      }
      break;
    }
    case Layout::qkv_bias: {
      const int64_t C = s[0] / 3;
      read_row(0, 3 * C);
      for (int64_t col = 0; col < 3 * C; ++col) dst[qkv_row(col, C, D)] = row[size_t(col)];
      break;
    }
  }
}

// Lattice parameter `name` of src (shape s) -> HF tensor data (hf_shape layout) in dst: its rows read straight
// into dst where the layout is the same, through one copy where it moves the elements.
void to_hf(float* dst, const hf::ExportSource& src, const std::string& name, const Shape& s, Layout layout, int64_t D) {
  if (layout == Layout::same || layout == Layout::vocab_rows) {
    hf::read_param_rows(src, name, dst);
    return;
  }
  const std::vector<float> param = hf::read_param(src, name);
  const float* from = param.data();
  switch (layout) {
    case Layout::same:
    case Layout::vocab_rows: break;
    case Layout::transposed:
      for (int64_t o = 0; o < s[0]; ++o)
        for (int64_t i = 0; i < s[1]; ++i) dst[i * s[0] + o] = from[o * s[1] + i];
      break;
    case Layout::qkv_weight: {
      const int64_t C = s[1];
      for (int64_t i = 0; i < C; ++i)
        for (int64_t col = 0; col < 3 * C; ++col) dst[i * 3 * C + col] = from[qkv_row(col, C, D) * C + i];
      break;
    }
    case Layout::qkv_bias: {
      const int64_t C = s[0] / 3;
      for (int64_t col = 0; col < 3 * C; ++col) dst[col] = from[qkv_row(col, C, D)];
      break;
    }
  }
}

// Buffers older transformers versions save: the causal mask and its fill value.
bool is_attention_buffer(const std::string& name) {
  auto ends_with = [&](const char* s) {
    const size_t n = std::strlen(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias");
}

}  // namespace

TransformerConfig hf_gpt2_config(const json& j, const std::string& what, int64_t divisible_by) {
  if (!j.is_object()) LATTICE_FAIL() << what << ": not a JSON object";
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    LATTICE_FAIL() << what << ": model_type " << j["model_type"].dump() << " is not supported (gpt2)";
  TransformerConfig c;
  c.num_layers = config_int(j, what, "n_layer");
  c.hidden_size = config_int(j, what, "n_embd");
  c.num_attention_heads = config_int(j, what, "n_head");
  c.max_position_embeddings = config_int(j, what, "n_positions");
  c.vocab_size = config_int(j, what, "vocab_size");
  if (j.contains("n_inner") && !j["n_inner"].is_null()) c.ffn_hidden_size = config_int(j, what, "n_inner");
  if (c.hidden_size % c.num_attention_heads != 0)
    LATTICE_FAIL() << what << ": n_head " << c.num_attention_heads << " does not divide n_embd " << c.hidden_size;
  const std::string act = j.value("activation_function", std::string("gelu_new"));
  // gelu_new and gelu_pytorch_tanh are the same tanh formula; gelu is the exact erf form.
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") c.gelu = GeluKind::tanh;
  else if (act == "gelu") c.gelu = GeluKind::erf;
  else if (act == "relu2") c.gelu = GeluKind::squared_relu;  // HuggingFace's ReLUSquaredActivation
  else LATTICE_FAIL() << what << ": activation_function \"" << act
                      << "\" is not supported (gelu_new, gelu_pytorch_tanh, gelu, relu2)";
  if (j.contains("layer_norm_epsilon")) {
    if (!j["layer_norm_epsilon"].is_number() || !(j["layer_norm_epsilon"].get<double>() > 0))
      LATTICE_FAIL() << what << ": layer_norm_epsilon must be a positive number, got " << j["layer_norm_epsilon"].dump();
    c.layernorm_epsilon = float(j["layer_norm_epsilon"].get<double>());
  }
  if (!config_bool(j, what, "scale_attn_weights", true))
    LATTICE_FAIL() << what << ": scale_attn_weights false is not supported (lattice scales by 1/sqrt(head dim))";
  if (config_bool(j, what, "scale_attn_by_inverse_layer_idx", false))
    LATTICE_FAIL() << what << ": scale_attn_by_inverse_layer_idx true is not supported";
  if (config_bool(j, what, "add_cross_attention", false))
    LATTICE_FAIL() << what << ": add_cross_attention true is not supported";
  c.untie_embeddings_and_output_weights = !config_bool(j, what, "tie_word_embeddings", true);
  c.make_vocab_size_divisible_by = divisible_by;
  c.hidden_dropout = c.attention_dropout = 0.0f;
  c.finalize();
  return c;
}

json hf_gpt2_config_json(const TransformerConfig& c, const std::string& tokenizer_type) {
  const char* act = c.gelu == GeluKind::tanh ? "gelu_new" : c.gelu == GeluKind::squared_relu ? "relu2" : "gelu";
  json j = {{"activation_function", act},
            {"architectures", {"GPT2LMHeadModel"}},
            {"attn_pdrop", 0.1},
            {"bos_token_id", c.vocab_size - 1},
            {"embd_pdrop", 0.1},
            {"eos_token_id", c.vocab_size - 1},
            {"initializer_range", 0.02},
            {"layer_norm_epsilon", hf::shortest_float(c.layernorm_epsilon)},
            {"model_type", "gpt2"},
            {"n_ctx", c.max_position_embeddings},
            {"n_embd", c.hidden_size},
            {"n_head", c.num_attention_heads},
            {"n_inner", nullptr},
            {"n_layer", c.num_layers},
            {"n_positions", c.max_position_embeddings},
            {"reorder_and_upcast_attn", false},
            {"resid_pdrop", 0.1},
            {"scale_attn_by_inverse_layer_idx", false},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
            {"torch_dtype", "float32"},
            {"use_cache", true},
            {"vocab_size", c.vocab_size}};
  if (c.ffn_hidden_size != 4 * c.hidden_size) j["n_inner"] = c.ffn_hidden_size;
  if (!tokenizer_type.empty()) j[kHfTokenizerKey] = tokenizer_type;
  return j;
}

namespace {

// The file's name of HF tensor `hf`: files saved from GPT2LMHeadModel name the body "transformer.*"; GPT-2's
// original checkpoints (saved from GPT2Model) have no prefix.
std::string file_name(const SafetensorsFile& f, const std::string& hf) {
  return hf == "lm_head.weight" || !f.has("transformer.wte.weight") ? hf : "transformer." + hf;
}

// Checks f against a model of `c` (every tensor there with its shape, no other but the attention buffers and a
// tied model's lm_head that is wte); errors name the file and the tensor. layout: the model's parameters.
void check_file(const TransformerConfig& c, const SafetensorsFile& f, const ParamBuffer& layout) {
  const std::string& path = f.path();
  if (!f.has("transformer.wte.weight") && !f.has("wte.weight"))
    LATTICE_FAIL() << path << ": missing tensor transformer.wte.weight (not a GPT-2 file?)";
  std::set<std::string> used;
  for (const TensorMap& m : tensor_map(c)) {
    const std::string name = file_name(f, m.hf);
    if (!f.has(name)) LATTICE_FAIL() << path << ": missing tensor " << name;
    const Shape want = hf_shape(layout.info(m.lattice).shape, m.layout, c.vocab_size);
    if (f.get(name).shape != want)
      LATTICE_FAIL() << path << ": tensor " << name << " has shape " << shape_str(f.get(name).shape)
                     << ", config.json implies " << shape_str(want);
    used.insert(name);
  }
  auto full = [&](const std::string& hf) { return file_name(f, hf); };
  for (const std::string& name : f.names()) {
    if (used.count(name) || is_attention_buffer(name)) continue;
    if (name == "lm_head.weight" && !c.untie_embeddings_and_output_weights) {
      // Tied: a stored lm_head must be wte itself, or the model is not the one config.json describes.
      if (f.get(name).shape != f.get(full("wte.weight")).shape ||
          read_float_tensor(f, name) != read_float_tensor(f, full("wte.weight")))
        LATTICE_FAIL() << path << ": lm_head.weight differs from " << full("wte.weight")
                       << " but config.json ties them (set tie_word_embeddings false)";
      continue;
    }
    LATTICE_FAIL() << path << ": unexpected tensor " << name << " (config.json has n_layer " << c.num_layers << ")";
  }
}

// Parameter p's values [p.numel] from its HF tensor (m), the tensor's pages given back after.
void fill_param(const TransformerConfig& c, const SafetensorsFile& f, const TensorMap& m, const ParamInfo& p,
                float* dst) {
  const std::string name = file_name(f, m.hf);
  to_lattice(dst, f, name, p.shape, m.layout, c.vocab_size, c.kv_channels);
  f.release(name);
}

}  // namespace

HfSource open_hf_gpt2(const std::string& dir, int64_t divisible_by) {
  hf::OpenedFolder o = hf::open_folder(dir, [divisible_by](const json& j, const std::string& what,
                                                           const SafetensorsFile&) {
    return hf_gpt2_config(j, what, divisible_by);
  });
  HfSource& out = o.source;
  const auto& f = o.file;
  check_file(out.config, *f, GPTModel::parameter_registry(out.config, TensorParallel{}, ModelPlacement{}, 0, 1));
  auto by_name = std::make_shared<std::map<std::string, TensorMap>>();
  for (const TensorMap& m : tensor_map(out.config)) (*by_name)[m.lattice] = m;
  out.fill = [f, by_name, c = out.config](const ParamInfo& p, float* dst) {
    const auto it = by_name->find(p.name);
    if (it == by_name->end()) {
      std::fill(dst, dst + p.numel, 0.0f);  // (a parameter the file does not give: zero)
      return;
    }
    fill_param(c, *f, it->second, p, dst);
  };
  return out;
}

SafetensorsWriter export_hf_gpt2_tensors(const GPTModel& model) {
  return export_hf_gpt2_tensors(hf::model_source(model));
}

SafetensorsWriter export_hf_gpt2_tensors(const hf::ExportSource& src) {
  const TransformerConfig& c = src.config;
  SafetensorsWriter w;
  for (const TensorMap& m : tensor_map(c)) {
    const ParamInfo& p = src.layout->info(m.lattice);
    const Shape shape = hf_shape(p.shape, m.layout, c.vocab_size);
    const std::string name = m.hf == "lm_head.weight" ? m.hf : "transformer." + m.hf;
    w.add_produced(name, "F32", shape, size_t(shape_numel(shape)) * sizeof(float), [src, m, p](uint8_t* out) {
      to_hf(reinterpret_cast<float*>(out), src, m.lattice, p.shape, m.layout, src.config.kv_channels);
    });
  }
  w.set_metadata("format", "pt");  // transformers refuses safetensors files without it
  return w;
}

HfGpt2Model load_hf_gpt2(const std::string& dir, int64_t divisible_by, int64_t seq_length, bool gradients) {
  return hf::load_source(open_hf_gpt2(dir, divisible_by), seq_length, gradients);
}

std::string hf_gpt2_mismatch(const TransformerConfig& c) {
  std::ostringstream why;
  if (c.attention_output_gate)
    why << "the attention output gate (--attention-output-gate; HuggingFace GPT-2's attention has none)";
  else if (c.attention_width() != c.hidden_size)
    why << "--kv-channels " << c.kv_channels << " x " << c.num_attention_heads << " heads, not its hidden size "
        << c.hidden_size << " (HuggingFace GPT-2's attention is as wide as its hidden size)";
  else if (c.rmsnorm())
    why << "RMSNorm (--normalization RMSNorm; HuggingFace GPT-2 has LayerNorm)";
  else if (!c.add_bias_linear)
    why << "no linear biases (--disable-bias-linear; HuggingFace GPT-2 has them)";
  else if (c.grouped_query_attention())
    why << "grouped-query attention (--num-query-groups " << c.num_query_groups
        << "; HuggingFace GPT-2 gives every head its own key and value)";
  else if (c.gated_linear_unit())
    why << "a gated MLP (" << (c.swiglu ? "--swiglu" : "--quick-geglu")
        << "; HuggingFace GPT-2's MLP is fc -> GELU -> proj)";
  else if (c.rope())
    why << "the rotary embedding (--position-embedding-type rope; HuggingFace GPT-2 has learned absolute positions "
           "only)";
  else if (!c.learned_positions())
    why << "no position embedding (--position-embedding-type none; HuggingFace GPT-2 has learned absolute positions)";
  else if (c.apply_layernorm_1p)
    why << "zero-centered norm weights (--apply-layernorm-1p; HuggingFace GPT-2's LayerNorm scales by its weight)";
  else if (c.window_size >= 0)
    why << "sliding-window attention (--window-size; HuggingFace GPT-2 attends to every earlier token)";
  else if (c.softmax_sink())
    why << "attention sinks (--softmax-type " << c.softmax_type << "; HuggingFace GPT-2's softmax has none)";
  else if (c.qk_norm())
    why << (c.qk_layernorm ? "--qk-layernorm" : "--qk-l2-norm") << " (HuggingFace GPT-2 normalizes no query or key)";
  return why.str();
}

void save_hf_gpt2(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                  const hf::ExportOptions& options) {
  save_hf_gpt2(dir, hf::model_source(model), tokenizer_type, options);
}

void save_hf_gpt2(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                  const hf::ExportOptions& options) {
  const std::string why = hf_gpt2_mismatch(src.config);
  if (!why.empty()) LATTICE_FAIL() << "--to-hf " << dir << ": the checkpoint's model has " << why;
  hf::write_model_folder(dir, export_hf_gpt2_tensors(src), hf_gpt2_config_json(src.config, tokenizer_type), options);
}

}  // namespace lattice
