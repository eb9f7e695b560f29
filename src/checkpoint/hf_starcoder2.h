// HuggingFace StarCoder2 (transformers' Starcoder2ForCausalLM, model_type "starcoder2": StarCoder2 3B, 7B,
// 15B; DIR/config.json + DIR/model.safetensors) <-> lattice's GPTModel with its settings: LayerNorm with
// biases (norm_epsilon: --norm-epsilon), every linear layer biased (use_bias: q_proj, k_proj, v_proj, o_proj,
// c_fc, c_proj), the GELU's tanh approximation (gelu_pytorch_tanh: --openai-gelu), the rotary embedding over
// whole heads (rotate_half pairs, --rotary-base = rope_theta), grouped-query attention (num_key_value_heads),
// Mistral's sliding_window (W: --window-size W - 1), usually tied embeddings.
//
// The tensors map as Llama's (checkpoint/hf_llama.h: q, k and v grouped into linear_qkv, their biases too)
// and GPT-2's for the rest (c_fc is linear_fc1, c_proj linear_fc2, the norms' weights and biases); the
// vocabulary is padded in lattice. HF -> lattice -> HF reproduces every tensor bit for bit.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/hf_common.h"
#include "model/gpt_model.h"

namespace lattice {

// model_type "starcoder2", or Starcoder2ForCausalLM among the architectures.
bool is_hf_starcoder2_config(const nlohmann::json& config);

// config.json -> TransformerConfig (finalized; vocabulary padded to a multiple of divisible_by). Settings
// lattice cannot reproduce (another activation, rope_scaling, use_bias false) are errors naming `what` (the
// file) and the key.
TransformerConfig hf_starcoder2_config(const nlohmann::json& config, const std::string& what, int64_t divisible_by = 128);

// TransformerConfig -> config.json as transformers writes Starcoder2Config (tokenizer_type under kHfTokenizerKey
// when non-empty).
nlohmann::json hf_starcoder2_config_json(const TransformerConfig& c, const std::string& tokenizer_type);

// Why a lattice model has no HF StarCoder2 form ("" when it has one).
std::string hf_starcoder2_mismatch(const TransformerConfig& c);

// Reads DIR into a model sized for 1 x seq_length tokens (0: max_position_embeddings); every problem (missing,
// misshapen or unexpected tensor, an lm_head.weight that differs from embed_tokens in a tied model) is an error
// naming the file and the tensor.
HfModel load_hf_starcoder2(const std::string& dir, int64_t divisible_by = 128, int64_t seq_length = 0,
                           bool gradients = true);
// The same folder opened for a streamed conversion (hf_common.h's HfSource; the same checks).
HfSource open_hf_starcoder2(const std::string& dir, int64_t divisible_by = 128);

// Writes DIR/model.safetensors and DIR/config.json; a model without the StarCoder2 form is an error naming DIR
// and the reason, and nothing is written.
void save_hf_starcoder2(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                        const hf::ExportOptions& options = {});
void save_hf_starcoder2(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                        const hf::ExportOptions& options = {});

}  // namespace lattice
