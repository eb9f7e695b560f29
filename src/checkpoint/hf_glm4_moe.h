// HuggingFace GLM-4.5 (transformers' Glm4MoeForCausalLM, model_type "glm4_moe": GLM-4.5, GLM-4.5-Air,
// GLM-4.6, GLM-4.7; DIR/config.json + DIR/model.safetensors) <-> lattice's GPTModel with Megatron's GLM-4.5
// settings: grouped-query attention with q/k/v biases (attention_bias: --add-qkv-bias) and optionally each
// head's q and k RMS-normalized (use_qk_norm: --qk-layernorm), the rotary embedding on the first
// partial_rotary_factor of each head's dims (--rotary-percent, rotate_half pairs, --rotary-base =
// rope_theta), RMSNorm, SwiGLU, and DeepSeek-V3's mixture of experts (checkpoint/hf_deepseek_moe.h): dense
// first_k_dense_replace layers, then sigmoid routing with the expert bias, normalized gates times
// routed_scaling_factor, shared experts; num_nextn_predict_layers multi-token prediction layers (enorm,
// hnorm, eh_proj, a decoder layer, shared_head.norm) as lattice's prediction depths, read when the file has
// them (transformers' save_pretrained writes none) and written.
//
// The attention's tensors map as Llama's (checkpoint/hf_llama.h: the grouped linear_qkv, its bias too), the
// MLPs as DeepSeek-V3's. HF -> lattice -> HF reproduces every tensor bit for bit; copies of the embedding
// and lm_head inside a prediction layer, when a file has them, must equal the model's and are not written.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/hf_common.h"
#include "model/gpt_model.h"

namespace lattice {

// model_type "glm4_moe", or Glm4MoeForCausalLM among the architectures.
bool is_hf_glm4_moe_config(const nlohmann::json& config);

// config.json -> TransformerConfig (finalized; vocabulary padded to a multiple of divisible_by); `file`
// (the model's tensors) says whether the prediction layers are there (hf::nextn_predict_layers). Settings
// lattice cannot reproduce are errors naming `what` (the file) and the key.
TransformerConfig hf_glm4_moe_config(const nlohmann::json& config, const std::string& what,
                                     const SafetensorsFile& file, int64_t divisible_by = 128);

// TransformerConfig -> config.json as transformers writes Glm4MoeConfig (tokenizer_type under
// kHfTokenizerKey when non-empty).
nlohmann::json hf_glm4_moe_config_json(const TransformerConfig& c, const std::string& tokenizer_type);

// Why a lattice model has no HF GLM-4.5 form ("" when it has one).
std::string hf_glm4_moe_mismatch(const TransformerConfig& c);

// Reads DIR into a model sized for 1 x seq_length tokens (0: max_position_embeddings); every problem
// (missing, misshapen or unexpected tensor) is an error naming the file and the tensor.
HfModel load_hf_glm4_moe(const std::string& dir, int64_t divisible_by = 128, int64_t seq_length = 0,
                         bool gradients = true);
// The same folder opened for a streamed conversion (hf_common.h's HfSource; the same checks).
HfSource open_hf_glm4_moe(const std::string& dir, int64_t divisible_by = 128);

// Writes DIR/model.safetensors and DIR/config.json; a model without the GLM-4.5 form is an error naming
// DIR and the reason, and nothing is written.
void save_hf_glm4_moe(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                      const hf::ExportOptions& options = {});
// The same from a model's parameters wherever they are (a checkpoint read tensor by tensor).
void save_hf_glm4_moe(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                      const hf::ExportOptions& options = {});

}  // namespace lattice
