// HuggingFace Qwen3-Next (transformers' Qwen3NextForCausalLM, model_type qwen3_next) and Qwen3.5's text
// model (Qwen3_5ForCausalLM, qwen3_5_text) <-> lattice's GPTModel with Gated DeltaNet layers
// (--experimental-attention-variant gated_delta_net where layer_types says linear_attention), gated
// attention with q/k norms and a partial rotary embedding (--attention-output-gate --qk-layernorm
// --rotary-percent partial_rotary_factor) in the others, zero-centered RMSNorm (--apply-layernorm-1p),
// SwiGLU, no biases; Qwen3-Next's mixture of experts with the gated shared expert (Qwen2-MoE's form),
// Qwen3.5's dense MLP.
//
// The layouts (hf_qwen3_next.cpp's tensor map, as blocks of rows):
//  - in_proj [q; k; v; z; b; a] (Megatron's order) from Qwen3-Next's in_proj_qkvz and in_proj_ba, which
//    interleave them by key head (per key head i: its q, its k, then its R = Hv / Hk value heads' v and
//    z; in_proj_ba: its value heads' b, then their a), or from Qwen3.5's flat in_proj_qkv, in_proj_z,
//    in_proj_b and in_proj_a; conv1d, A_log, dt_bias and out_proj as they are;
//  - out_norm: HF's gated RMSNorm scales by its weight, lattice's zero-centered one by 1 + weight
//    (lattice's = HF's - 1); every other norm is zero-centered in both;
//  - linear_qkv per query group: its heads' queries, their gates (q_proj interleaves them per head:
//    query then gate), its key and value, as Megatron's gated layout.
// HF -> lattice -> HF reproduces every tensor (the out_norm weights up to the rounding of w - 1 + 1).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/hf_common.h"
#include "checkpoint/safetensors.h"
#include "model/gpt_model.h"

namespace lattice {

// Whether config.json describes Qwen3-Next (model_type qwen3_next, or Qwen3NextForCausalLM among its
// architectures) or Qwen3.5's text model (qwen3_5_text, Qwen3_5ForCausalLM).
bool is_hf_qwen3_next_config(const nlohmann::json& config);
// "Qwen3-Next" or "Qwen3.5".
std::string hf_qwen3_next_family_name(const nlohmann::json& config);
const char* hf_qwen3_next_family_name(const TransformerConfig& c);

// config.json -> TransformerConfig (finalized). Settings lattice cannot reproduce are errors naming
// `what` (the file) and the key.
TransformerConfig hf_qwen3_next_config(const nlohmann::json& config, const std::string& what,
                                       int64_t divisible_by = 128);
// TransformerConfig -> config.json as transformers writes Qwen3NextConfig (with experts) or
// Qwen3_5TextConfig (dense).
nlohmann::json hf_qwen3_next_config_json(const TransformerConfig& c, const std::string& tokenizer_type);
// Why a lattice model has no Qwen3-Next / Qwen3.5 form ("" when it has one).
std::string hf_qwen3_next_mismatch(const TransformerConfig& c);

void import_hf_qwen3_next_tensors(GPTModel& model, const SafetensorsFile& file);
SafetensorsWriter export_hf_qwen3_next_tensors(const GPTModel& model);

// Reads DIR into a model sized for 1 x seq_length tokens (0: max_position_embeddings).
HfModel load_hf_qwen3_next(const std::string& dir, int64_t divisible_by = 128, int64_t seq_length = 0);
// Writes DIR's model and config.json; a model without the form is an error naming DIR, nothing written.
void save_hf_qwen3_next(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                        const hf::ExportOptions& options = {});

}  // namespace lattice
