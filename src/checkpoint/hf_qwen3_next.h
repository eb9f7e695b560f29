// HuggingFace Qwen3-Next (transformers' Qwen3NextForCausalLM, model_type qwen3_next), Qwen3.5's text
// model (Qwen3_5ForCausalLM, qwen3_5_text) and Qwen3.5-MoE's (Qwen3_5MoeForCausalLM, qwen3_5_moe_text; the
// multimodal qwen3_5 and qwen3_5_moe folders read too) <-> lattice's GPTModel with Gated DeltaNet layers
// (--experimental-attention-variant gated_delta_net where layer_types says linear_attention), gated
// attention with q/k norms and a partial rotary embedding (--attention-output-gate --qk-layernorm
// --rotary-percent partial_rotary_factor) in the others, zero-centered RMSNorm (--apply-layernorm-1p),
// SwiGLU, no biases; Qwen3-Next's and Qwen3.5-MoE's mixture of experts with the gated shared expert
// (Qwen2-MoE's form), Qwen3.5's dense MLP.
//
// The layouts (hf_qwen3_next.cpp's tensor map, as blocks of rows):
//  - in_proj [q; k; v; z; b; a] (Megatron's order) from Qwen3-Next's in_proj_qkvz and in_proj_ba, which
//    interleave them by key head (per key head i: its q, its k, then its R = Hv / Hk value heads' v and
//    z; in_proj_ba: its value heads' b, then their a), or from Qwen3.5's flat in_proj_qkv, in_proj_z,
//    in_proj_b and in_proj_a; conv1d, A_log, dt_bias and out_proj as they are;
//  - out_norm: HF's gated RMSNorm scales by its weight, lattice's zero-centered one by 1 + weight
//    (lattice's = HF's - 1); every other norm is zero-centered in both;
//  - linear_qkv per query group: its heads' queries, their gates (q_proj interleaves them per head:
//    query then gate), its key and value, as Megatron's gated layout;
//  - experts: Qwen3-Next's per expert (experts.{e}.gate_proj / up_proj / down_proj), Qwen3.5-MoE's fused
//    3-D tensors (experts.gate_up_proj [E, 2 I, H], expert e's gate rows then its up rows: its linear_fc1;
//    experts.down_proj [E, H, I]); its prediction module's per expert (Qwen3.6's fused: both read).
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
// architectures), Qwen3.5's text model (qwen3_5_text, Qwen3_5ForCausalLM) or Qwen3.5-MoE's (qwen3_5_moe_text,
// Qwen3_5MoeForCausalLM), or the multimodal qwen3_5 / qwen3_5_moe around them.
bool is_hf_qwen3_next_config(const nlohmann::json& config);
// "Qwen3-Next", "Qwen3.5" or "Qwen3.5-MoE".
std::string hf_qwen3_next_family_name(const nlohmann::json& config);
// The family c is written as: model_type's (--hf-model-type: qwen3_next, qwen3_5_text or qwen3_5_moe_text;
// qwen3_5 and qwen3_5_moe name the text models), else Qwen3-Next with experts and Qwen3.5 without. A family
// whose MLP is not c's kind (experts or dense) is an error naming the flag.
std::string hf_qwen3_next_family_name(const TransformerConfig& c, const std::string& model_type = "");
// `recorded` (the model_type a checkpoint was converted from) when c can be written as that family, else "".
std::string hf_qwen3_next_recorded_type(const TransformerConfig& c, const std::string& recorded);

// config.json -> TransformerConfig (finalized); `file` (the model's tensors) says whether the prediction
// module is there (mtp.fc.weight). Settings lattice cannot reproduce are errors naming `what` (the file) and
// the key.
TransformerConfig hf_qwen3_next_config(const nlohmann::json& config, const std::string& what,
                                       const SafetensorsFile& file, int64_t divisible_by = 128);
// TransformerConfig -> config.json as transformers writes Qwen3NextConfig, Qwen3_5TextConfig or
// Qwen3_5MoeTextConfig (the family as hf_qwen3_next_family_name chooses it).
nlohmann::json hf_qwen3_next_config_json(const TransformerConfig& c, const std::string& tokenizer_type,
                                         const std::string& model_type = "");
// Why a lattice model has no Qwen3-Next / Qwen3.5 form ("" when it has one; Qwen3.5-MoE's asks more:
// every layer with experts and the gated shared expert, the top-k gates renormalized).
std::string hf_qwen3_next_mismatch(const TransformerConfig& c);

// Which HF tensors make each parameter of a model of `c` (the file's config), after checking the file;
// config: the folder's config.json (its family says the layout).
hf::ImportPlan hf_qwen3_next_import_plan(const TransformerConfig& c, const SafetensorsFile& file,
                                         const nlohmann::json& config);

// Reads DIR into a model sized for 1 x seq_length tokens (0: max_position_embeddings).
HfModel load_hf_qwen3_next(const std::string& dir, int64_t divisible_by = 128, int64_t seq_length = 0,
                           bool gradients = true);
// The same folder opened for a streamed conversion (hf_common.h's HfSource; the same checks).
HfSource open_hf_qwen3_next(const std::string& dir, int64_t divisible_by = 128);
// Writes DIR's model and config.json in the family options.model_type chooses; a model without the form is
// an error naming DIR, nothing written.
void save_hf_qwen3_next(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                        const hf::ExportOptions& options = {});
// The same from a model's parameters wherever they are (a checkpoint read tensor by tensor).
void save_hf_qwen3_next(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                        const hf::ExportOptions& options = {});

}  // namespace lattice
