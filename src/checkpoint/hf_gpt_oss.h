// HuggingFace GPT-OSS (transformers' GptOssForCausalLM, OpenAI's gpt-oss models: DIR/config.json +
// DIR/model.safetensors) <-> lattice's GPTModel with GPT-OSS's settings: RMSNorm, linear biases,
// grouped-query attention with learnable sinks (--softmax-type learnable, self_attn.sinks), a window
// of sliding_window keys on the "sliding_attention" layers of layer_types (--window-size
// sliding_window - 1 and its pattern), the rotary embedding with YaRN's rope_scaling
// (--position-embedding-type yarn; checkpoint/hf_rope_scaling.h), and every MLP a mixture of
// experts (--num-experts num_local_experts, --moe-router-topk num_experts_per_tok, softmax over
// the top k of logits with the router's bias) whose experts are GPT-OSS's clamped quick GEGLU
// (--quick-geglu --glu-linear-offset 1 --activation-func-clamp-value swiglu_limit) with biases.
//
// Layouts: q_proj, k_proj, v_proj and their biases go into linear_qkv as for Llama (per query group,
// its heads' queries, then its key and value); the experts are fused 3-D tensors, input-major:
// gate_up_proj [E, C, 2I] whose output columns interleave the gate (even) and the up projection
// (odd), lattice's linear_fc1 [2I, C] (the gate's rows, then up's) of each expert, and down_proj
// [E, I, C], each expert's linear_fc2 [C, I] transposed; their biases gate_up_proj_bias [E, 2I]
// (interleaved too) and down_proj_bias [E, C]. OpenAI's checkpoints store the experts' weights as
// MXFP4 (quantization_config quant_method mxfp4): gate_up_proj_blocks [E, 2I, C/32, 16] and
// down_proj_blocks [E, C, I/32, 16] U8, two FP4 E2M1 codes a byte (low nibble first), with
// _scales [E, rows, blocks] U8, each block's power of two 2^(s - 127); import decodes them exactly
// (transformers' dequantization). Export writes the dequantized F32 form (no quantization_config).
// HF -> lattice -> HF reproduces every tensor bit for bit (of the dequantized form).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/hf_common.h"
#include "checkpoint/safetensors.h"
#include "model/gpt_model.h"

namespace lattice {

// Whether config.json describes a GPT-OSS model (model_type "gpt_oss", or GptOssForCausalLM among its
// architectures).
bool is_hf_gpt_oss_config(const nlohmann::json& config);

// config.json -> TransformerConfig (finalized; vocabulary padded to a multiple of divisible_by).
// Settings lattice cannot reproduce (attention_bias false, another rope_scaling or quantization) are
// errors naming `what` (the file) and the key.
TransformerConfig hf_gpt_oss_config(const nlohmann::json& config, const std::string& what, int64_t divisible_by = 128);

// TransformerConfig -> config.json as transformers writes GptOssConfig (tokenizer_type stored under
// kHfTokenizerKey when non-empty).
nlohmann::json hf_gpt_oss_config_json(const TransformerConfig& c, const std::string& tokenizer_type);

// Why a lattice model has no HF GPT-OSS form ("" when it has one).
std::string hf_gpt_oss_mismatch(const TransformerConfig& c);

// MXFP4 blocks [..., G, 16] U8 and scales [..., G] U8 (named `blocks`, `scales` in `f`) decoded to
// fp32 [..., G * 32]; a wrong dtype or shape is an error naming the file and the tensor. With a range, only the
// scale groups [first, first + count) (32 values each, in the same order).
std::vector<float> decode_mxfp4(const SafetensorsFile& f, const std::string& blocks, const std::string& scales);
std::vector<float> decode_mxfp4(const SafetensorsFile& f, const std::string& blocks, const std::string& scales,
                                int64_t first, int64_t count);

// DIR opened for a streamed conversion (hf_common.h's HfSource): the file checked first (every problem, a
// missing, misshapen or unexpected tensor, an error naming the file and the tensor; mxfp4: the experts as blocks
// and scales), then each parameter read when asked: a layer's tensors but its experts' in memory at a time, and
// each expert's (decoded alone) when its parameters are.
HfSource open_hf_gpt_oss(const std::string& dir, int64_t divisible_by = 128);

// The model's parameters as HF tensors (F32, vocabulary trimmed to vocab_size, the experts
// dequantized, lm_head.weight only when untied).
SafetensorsWriter export_hf_gpt_oss_tensors(const GPTModel& model);
// The same from a model's parameters wherever they are: each HF tensor made when written (an experts' tensor
// in pieces of an expert, a layer's other tensors together).
SafetensorsWriter export_hf_gpt_oss_tensors(const hf::ExportSource& src);

// Reads DIR into a model sized for 1 x seq_length tokens (0: max_position_embeddings).
HfModel load_hf_gpt_oss(const std::string& dir, int64_t divisible_by = 128, int64_t seq_length = 0,
                        bool gradients = true);

// Writes DIR/model.safetensors and DIR/config.json; a model without a GPT-OSS form is an error naming
// DIR and the reason, and nothing is written.
void save_hf_gpt_oss(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                     const hf::ExportOptions& options = {});
// The same from a model's parameters wherever they are (a checkpoint read as each HF tensor is written).
void save_hf_gpt_oss(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                     const hf::ExportOptions& options = {});

}  // namespace lattice
