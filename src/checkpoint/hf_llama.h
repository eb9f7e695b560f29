// HuggingFace Llama (transformers' LlamaForCausalLM: DIR/config.json + DIR/model.safetensors),
// Qwen2 (Qwen2ForCausalLM: Llama with q/k/v biases, --add-qkv-bias), Qwen3 (Qwen3ForCausalLM:
// Llama with q_norm and k_norm, --qk-layernorm), Mistral (MistralForCausalLM: Llama's model, its
// sliding_window W lattice's --window-size W - 1) and the mixtures of experts Mixtral
// (MixtralForCausalLM: block_sparse_moe's router and experts w1 w3 w2, --num-experts) and
// Qwen3-MoE (Qwen3MoeForCausalLM: Qwen3 with mlp.gate and mlp.experts, norm_topk_prob true), Phi-3
// (Phi3ForCausalLM, Phi-4 too: Llama with qkv_proj and gate_up_proj fused, the first partial_rotary_factor
// of each head rotated (--rotary-percent), Mistral's sliding_window; without rope_scaling),
// <-> lattice's GPTModel with Megatron's Llama settings: --position-embedding-type rope
// (rotate_half over the whole head, --rotary-base = rope_theta), --normalization RMSNorm,
// --swiglu, --disable-bias-linear, grouped-query attention (num_key_value_heads), usually
// --untie-embeddings-and-output-weights.
//
// HF's Linear weights are [out, in] like lattice's, so the layouts differ only where lattice
// fuses tensors (each handled in hf_llama.cpp's tensor map, as blocks of rows):
//  - linear_qkv [(H + 2G) D, C] is, per query group g, the rows of q_proj for the group's
//    H/G heads, then k_proj's and v_proj's rows for the group (Megatron's grouped layout);
//  - linear_fc1 [2F, C] is gate_proj's rows, then up_proj's;
//  - the vocabulary is unpadded in HF (embed_tokens [V, C]) and padded in lattice (zero rows,
//    dropped on export), as for GPT-2 (checkpoint/hf_gpt2.h).
// HF -> lattice -> HF reproduces every tensor bit for bit (the rotary_emb.inv_freq buffers some
// files carry are a function of the config and are not kept).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/hf_common.h"
#include "checkpoint/safetensors.h"
#include "model/gpt_model.h"

namespace lattice {

// Whether config.json describes a Llama model (model_type "llama", or LlamaForCausalLM among
// its architectures), a Qwen2 one ("qwen2", Qwen2ForCausalLM): Llama with biases on q_proj,
// k_proj and v_proj (lattice's --add-qkv-bias), head_dim hidden / heads; a Qwen3 one ("qwen3",
// Qwen3ForCausalLM): Llama with q_norm and k_norm (--qk-layernorm), no attention biases; a Mistral,
// Mixtral, Qwen2-MoE, Qwen3-MoE or DeepSeek-MoE one. Sliding windows (Mistral's sliding_window, Qwen's
// use_sliding_window with max_window_layers or layer_types) are --window-size and its layers.
bool is_hf_llama_config(const nlohmann::json& config);

// "Mixtral" for a model with --num-experts ("Qwen3-MoE" with --qk-layernorm too), "Qwen3" for one
// with --qk-layernorm, "Qwen2" for one with --add-qkv-bias, "Mistral" for one with --window-size,
// else "Llama": the form export writes.
// With phi3 (--hf-model-type phi3): "Phi-3".
const char* hf_llama_family_name(const TransformerConfig& c, bool phi3 = false);
// "Llama", "Qwen2", "Qwen3", "Qwen3-MoE", "Mistral", "Mixtral", "Phi-3", ...: the family config.json describes
// ("" for none of them).
std::string hf_llama_family_name(const nlohmann::json& config);

// config.json -> TransformerConfig (finalized; vocabulary padded to a multiple of divisible_by).
// rope_scaling linear is --rotary-seq-len-interpolation-factor. Settings lattice cannot reproduce
// (another rope_scaling, attention or MLP biases, another activation) are errors naming `what`
// (the file) and the key.
TransformerConfig hf_llama_config(const nlohmann::json& config, const std::string& what, int64_t divisible_by = 128);

// TransformerConfig -> config.json as transformers writes LlamaConfig (tokenizer_type stored under
// kHfTokenizerKey when non-empty).
// phi3: as Phi3Config writes it (partial_rotary_factor, sliding_window).
nlohmann::json hf_llama_config_json(const TransformerConfig& c, const std::string& tokenizer_type, bool phi3 = false);

// Why a lattice model has no HF Llama form ("" when it has one): the settings above, all of
// them, with rotary_percent 1 and the pairs not interleaved. phi3: why it has no HF Phi-3 form (a dense
// model, head_dim hidden / heads, any rotary_percent, the window on every layer or none, no rope scaling).
std::string hf_llama_mismatch(const TransformerConfig& c, bool phi3 = false);

// Which HF tensors make each parameter of a model of `c` (the file's config), after checking the file:
// F32/F16/BF16 data; every problem (missing, misshapen or unexpected tensor, an lm_head.weight that
// differs from embed_tokens in a tied model) is an error naming the file and the tensor.
// phi3: the file has Phi-3's names (qkv_proj, gate_up_proj).
hf::ImportPlan hf_llama_import_plan(const TransformerConfig& c, const SafetensorsFile& file, bool phi3 = false);

// The model's parameters as HF tensors (F32, vocabulary trimmed to vocab_size, lm_head.weight
// only when untied).
SafetensorsWriter export_hf_llama_tensors(const GPTModel& model, bool phi3 = false);

// Reads DIR into a model sized for 1 x seq_length tokens (0: max_position_embeddings).
HfModel load_hf_llama(const std::string& dir, int64_t divisible_by = 128, int64_t seq_length = 0,
                      bool gradients = true);
// The same folder opened for a streamed conversion (hf_common.h's HfSource; the same checks).
HfSource open_hf_llama(const std::string& dir, int64_t divisible_by = 128);

// Writes DIR/model.safetensors and DIR/config.json; a model without a Llama form
// (hf_llama_mismatch) is an error naming DIR and the reason, and nothing is written.
void save_hf_llama(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                   const hf::ExportOptions& options = {});
// The same from a model's parameters wherever they are (a checkpoint read tensor by tensor).
void save_hf_llama(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                   const hf::ExportOptions& options = {});

}  // namespace lattice
