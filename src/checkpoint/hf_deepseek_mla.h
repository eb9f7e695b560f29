// HuggingFace DeepSeek-V2 and DeepSeek-V3 (the multi-latent attention models: DeepseekV2ForCausalLM, the
// remote code DeepSeek-V2 and V2-Lite ship, model_type "deepseek_v2"; transformers' DeepseekV3ForCausalLM,
// "deepseek_v3"; DIR/config.json + DIR/model.safetensors) <-> lattice's GPTModel with multi-latent attention
// (--multi-latent-attention with --qk-layernorm: q_a_proj / q_a_layernorm / q_b_proj (or q_proj),
// kv_a_proj_with_mqa / kv_a_layernorm / kv_b_proj, o_proj), RMSNorm, SwiGLU, no biases, the rotary
// embedding (YaRN with its mscale and mscale_all_dim, which also scales the softmax), and DeepSeek's mixture
// of experts with shared experts, the first first_k_dense_replace layers dense:
//  - V3: sigmoid scores with the choice's bias (mlp.gate.e_score_correction_bias: --moe-router-enable-expert-
//    bias), groups (n_group, topk_group), the chosen scores normalized, routed_scaling_factor;
//  - V2: the softmax over every expert, its top k (greedy), renormalized with norm_topk_prob or not
//    (--moe-router-pre-softmax), routed_scaling_factor; MoE layers every moe_layer_freq.
//
// Every tensor keeps its HF layout (lattice's MLA weights are Megatron's, which DeepSeek's are), so the
// map is one tensor per parameter but for SwiGLU's fused linear_fc1 (gate_proj's rows, then up_proj's)
// and the padded vocabulary. HF -> lattice -> HF reproduces every tensor bit for bit. The multi-token
// prediction modules a DeepSeek-V3 file may carry (num_nextn_predict_layers, layers from num_hidden_layers
// on: enorm, hnorm, eh_proj, a decoder layer, shared_head.norm, and copies of the embedding and lm_head)
// are lattice's prediction depths (--mtp-num-layers), read and written.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/hf_common.h"
#include "model/gpt_model.h"

namespace lattice {

// model_type "deepseek_v2", "deepseek_v3", "kimi_k2" (Kimi-K2, DeepSeek-V3's architecture) or "glm4_moe_lite"
// (GLM-4.7-Flash), or DeepseekV2ForCausalLM, DeepseekV3ForCausalLM or Glm4MoeLiteForCausalLM among the
// architectures.
bool is_hf_deepseek_mla_config(const nlohmann::json& config);
// The form export writes: "Kimi-K2" or "GLM-4.7-Flash" for that model_type (--hf-model-type), else
// "DeepSeek-V3" for a model with the sigmoid router, "DeepSeek-V2" for one with the softmax; and the family
// config.json describes.
const char* hf_deepseek_family_name(const TransformerConfig& c, const std::string& model_type = "");
std::string hf_deepseek_family_name(const nlohmann::json& config);
// `recorded` (the model_type a checkpoint was converted from) when it is kimi_k2 or glm4_moe_lite and c has
// the sigmoid router (their form), else "": export's default --hf-model-type.
std::string hf_deepseek_recorded_type(const TransformerConfig& c, const std::string& recorded);
// The model_type export writes (--hf-model-type, or `model_type` "" for the default): deepseek_v3, kimi_k2
// (Kimi-K2: DeepSeek-V3's architecture and config) or glm4_moe_lite for a model with the sigmoid router,
// deepseek_v2 for one with the softmax; another is an error naming the flag.
std::string hf_deepseek_model_type(const TransformerConfig& c, const std::string& model_type);

// config.json -> TransformerConfig (finalized; vocabulary padded to a multiple of divisible_by); `file`
// (the model's tensors) says whether the prediction modules are there (hf::nextn_predict_layers).
// Settings lattice cannot reproduce are errors naming `what` (the file) and the key.
TransformerConfig hf_deepseek_mla_config(const nlohmann::json& config, const std::string& what,
                                         const SafetensorsFile& file, int64_t divisible_by = 128);

// TransformerConfig -> config.json as DeepseekV3Config or DeepseekV2Config writes it (tokenizer_type under
// kHfTokenizerKey).
// model_type: hf_deepseek_model_type's (kimi_k2 and glm4_moe_lite write their own forms; "": the default).
nlohmann::json hf_deepseek_mla_config_json(const TransformerConfig& c, const std::string& tokenizer_type,
                                           const std::string& model_type = "");

// Why a lattice model has no HF DeepSeek-V2 or V3 form ("" when it has one).
std::string hf_deepseek_mla_mismatch(const TransformerConfig& c);

// Reads DIR into a model sized for 1 x seq_length tokens (0: max_position_embeddings); every problem
// (missing, misshapen or unexpected tensor) is an error naming the file and the tensor.
HfModel load_hf_deepseek_mla(const std::string& dir, int64_t divisible_by = 128, int64_t seq_length = 0,
                             bool gradients = true);
// The same folder opened for a streamed conversion (hf_common.h's HfSource; the same checks).
HfSource open_hf_deepseek_mla(const std::string& dir, int64_t divisible_by = 128);
// Which HF tensors make each parameter of a model of `c` (the file's config), after checking the file: a
// missing, misshapen or unexpected tensor, or a prediction module's embedding or head that differs from the
// model's, is an error naming the file and the tensor.
hf::ImportPlan hf_deepseek_mla_import_plan(const TransformerConfig& c, const SafetensorsFile& file);

// Writes DIR/model.safetensors and DIR/config.json; a model without a DeepSeek form is an error naming
// DIR and the reason, and nothing is written.
void save_hf_deepseek_mla(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                         const hf::ExportOptions& options = {});
// The same from a model's parameters wherever they are (a checkpoint read tensor by tensor).
void save_hf_deepseek_mla(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                         const hf::ExportOptions& options = {});

}  // namespace lattice
