// What the HuggingFace formats (checkpoint/hf_gpt2.h, checkpoint/hf_llama.h) share: reading
// config.json values and float tensors of any HF dtype, writing config.json atomically, and the
// model folder's two files.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/hf_tensor_map.h"
#include "checkpoint/safetensors.h"
#include "model/gpt_model.h"

namespace lattice {

// Config key written by export (and read by import) so that a lattice model's tokenizer
// survives the round trip; transformers keeps unknown config keys as attributes.
inline constexpr const char* kHfTokenizerKey = "lattice_tokenizer_type";

// A model read from a HuggingFace folder.
struct HfModel {
  std::unique_ptr<GPTModel> model;
  std::string tokenizer_type;  // from kHfTokenizerKey, else "" (the caller decides)
};

// A HuggingFace folder opened for a streamed conversion: the model's configuration and each parameter's values
// read from the folder's files only when asked (fill(p, dst): p's [numel] into dst; the files stay mapped while
// this lives), so no model's worth of memory is ever held.
struct HfSource {
  TransformerConfig config;
  std::string tokenizer_type;  // as HfModel's
  std::function<void(const ParamInfo&, float*)> fill;
};

namespace hf {

// A floating-point HF tensor as fp32 (F16 and BF16 widen exactly); another dtype is an error
// naming the file and the tensor.
std::vector<float> read_float_tensor(const SafetensorsFile& f, const std::string& name);
// Elements [first, first + count) of the tensor `name` (row-major) as fp32 into out: only those are read.
void read_float_elements(const SafetensorsFile& f, const std::string& name, int64_t first, int64_t count, float* out);

// config.json values: a positive integer (required), a boolean (fallback when absent or null),
// a positive number (fallback when absent). Errors name `what` (the file) and the key.
int64_t config_int(const nlohmann::json& j, const std::string& what, const char* key);
bool config_bool(const nlohmann::json& j, const std::string& what, const char* key, bool fallback);
double config_positive(const nlohmann::json& j, const std::string& what, const char* key, double fallback);

// The shortest decimal that reads back as the same float (1e-5f is written as 1e-05, not as
// its double expansion 9.99999974738e-06), as a JSON number.
double shortest_float(float v);

// The tensors `data` (name -> fp32 values) with `shapes` as an F32 file with transformers' "format"
// metadata (it refuses files without it), in name order.
SafetensorsWriter f32_model_tensors(const std::map<std::string, Shape>& shapes,
                                    std::map<std::string, std::vector<float>>&& data);

// How --to-hf writes the tensors: their dtype (config.json's torch_dtype: float32, bfloat16 or
// float16; the F32 values rounded to nearest even) and the largest file, as transformers'
// save_pretrained shards a model (model-00001-of-0000N.safetensors and
// model.safetensors.index.json; one file when it fits: model.safetensors).
struct ExportOptions {
  std::string dtype = "float32";
  uint64_t max_shard_bytes = 5'000'000'000;  // save_pretrained's default max_shard_size, "5GB"
  std::string model_type;  // --hf-model-type: the family, where a model has more than one ("": the default)
};
// --hf-dtype (float32 | bfloat16 | float16, or fp32 | bf16 | fp16) and --max-shard-size (bytes, or
// a number with KB, MB, GB (powers of 1000) or KiB, MiB, GiB, as transformers reads it); ""
// keeps the default. Errors name the flag.
ExportOptions parse_export_options(const std::string& dtype, const std::string& max_shard_size);

// The sizes every decoder's config.json gives (num_hidden_layers, hidden_size, num_attention_heads,
// vocab_size, max_position_embeddings: positive integers, or an error naming `what` and the key).
void read_decoder_sizes(const nlohmann::json& j, const std::string& what, TransformerConfig& c);
// Grouped-query attention's heads: num_key_value_heads (default: one per head; it must divide the heads) and,
// when `head_dim` is read and given, the head width (--kv-channels), else hidden / heads (which must divide).
void read_grouped_heads(const nlohmann::json& j, const std::string& what, TransformerConfig& c, bool head_dim);

// A positive value of the rotary embedding's (rope_theta, partial_rotary_factor, ...): in rope_parameters
// (transformers 5, which prefers it), else at the top level, else the fallback.
double rope_value(const nlohmann::json& j, const std::string& what, const char* key, double fallback);
// The rotary embedding without scaling (rope_scaling null, rope_parameters' rope_type "default"; another is an
// error naming `what` and the key) on the first partial_rotary_factor (default `partial`, at most 1) of each
// head's dims, rotate_half pairs: c's position_embedding_type, rotary_base (rope_theta, default 10000) and
// rotary_percent. Each value from rope_parameters (transformers 5, which prefers it), else the top level.
void read_partial_rope(const nlohmann::json& j, const std::string& what, double partial, TransformerConfig& c);

// DeepSeek's MoE layers (DeepSeek-MoE, V2, V3): layer l is an MoE layer when l >= first_k_dense_replace and
// l % moe_layer_freq == 0, as a --moe-layer-freq pattern (first_k_dense_replace in [0, layers]).
std::vector<int> deepseek_moe_layers(int64_t layers, int64_t first_k_dense_replace, int64_t moe_layer_freq);
// The first_k_dense_replace of c: its first MoE layer (num_layers when none), or -1 when a dense layer follows
// an MoE layer (no DeepSeek form).
int64_t deepseek_first_k_dense(const TransformerConfig& c);

// The multi-token prediction modules a DeepSeek-V3-layout file holds (DeepSeek-V3, GLM-4.5: layers
// num_hidden_layers on, each with an eh_proj): config.json's num_nextn_predict_layers (0 when absent or
// null) when `f` has the first module's eh_proj, else 0. transformers' models skip the modules on load and
// their save_pretrained writes none, though config.json keeps the count. A negative count is an error
// naming `what`.
int64_t nextn_predict_layers(const nlohmann::json& j, const std::string& what, const SafetensorsFile& f);

// Qwen-MoE's sparse layers (modeling_qwen2_moe, qwen3_moe, qwen3_next): layer l is a mixture of experts
// unless it is in mlp_only_layers, when (l + 1) % decoder_sparse_step == 0 (default 1), as a
// --moe-layer-freq pattern (errors name `what` and the key).
std::vector<int> qwen_moe_layers(const nlohmann::json& j, const std::string& what, int64_t layers);

// JSON text as Python's json module writes it (transformers' config.json) made standard: the bare
// Infinity, -Infinity and NaN outside strings become 1e308, -1e308 and null (a Mamba config's
// time_step_limit [0.0, Infinity]).
std::string python_json_numbers(const std::string& text);
// DIR/config.json parsed (Python's Infinity and NaN read as python_json_numbers says; errors name the file).
nlohmann::json read_config(const std::string& dir);
// The tokenizer a lattice export recorded in config.json, else "".
std::string recorded_tokenizer(const nlohmann::json& config, const std::string& what);
// DIR/model.safetensors, or a model sharded as transformers' save_pretrained shards it
// (DIR/model.safetensors.index.json, whose weight_map names each tensor's file) as one view;
// a missing or inconsistent file is an error naming it.
SafetensorsFile read_model_file(const std::string& dir);
// The folder's configuration and the plan of its tensors (`plan`: checks the file's tensors against the
// configuration, every error naming the file and the tensor, and says which HF rows make each parameter).
using ConfigFn = std::function<TransformerConfig(const nlohmann::json&, const std::string&, const SafetensorsFile&)>;
using PlanFn = std::function<ImportPlan(const TransformerConfig&, const SafetensorsFile&, const nlohmann::json&)>;
// A model folder opened: its config.json, its tensors (shared: a fill keeps them mapped), and `source` with the
// TransformerConfig `config` makes of config.json (given the parsed file, its path, for errors, and the tensors,
// for what config.json does not say) and the tokenizer a lattice export recorded; source.fill is the family's.
struct OpenedFolder {
  nlohmann::json config_json;
  std::shared_ptr<const SafetensorsFile> file;
  HfSource source;
};
OpenedFolder open_folder(const std::string& dir, const ConfigFn& config);
// A folder of a family whose parameters are rows of its tensors opened for conversion: open_folder, the tensors
// checked by `plan` before it returns.
HfSource open_planned_folder(const std::string& dir, const ConfigFn& config, const PlanFn& plan);
// A folder's model: sized for 1 x seq_length tokens (0: max_position_embeddings), each parameter from src.fill.
// gradients false: the model has no gradient buffer (inference needs none; a model's worth of memory saved).
HfModel load_source(const HfSource& src, int64_t seq_length, bool gradients = true);

// Writes DIR/model.safetensors (or its shards and their index) and DIR/config.json with
// torch_dtype set, each file atomically; DIR is created. The tensors are cast before anything is
// written (a value float16 cannot hold fails then).
void write_model_folder(const std::string& dir, SafetensorsWriter tensors, nlohmann::json config,
                        const ExportOptions& options = {});

}  // namespace hf
}  // namespace lattice
