// HuggingFace Nemotron-H (model_type "nemotron_h", NemotronHForCausalLM: NVIDIA's Nemotron-H and
// Nemotron-Nano-2 Mamba-2/attention hybrids; DIR/config.json + DIR/model.safetensors) <-> lattice's hybrid
// GPTModel (--hybrid-override-pattern): every layer one pre-norm residual block of the kind
// hybrid_override_pattern (or layers_block_type) gives it, M a Mamba-2 layer, * a self-attention layer, - an
// MLP layer, E an MoE layer (Nemotron-3's: DeepSeek-V3's router, sigmoid scores with the choice's bias
// e_score_correction_bias, n_group / topk_group, the gates normalized x routed_scaling_factor, over ungated relu2
// experts and one shared expert); RMSNorm; grouped-query attention without biases and without any position
// embedding (--position-embedding-type none); the MLP's squared ReLU without biases (--squared-relu); the Mamba
// layers' shape from mamba_num_heads, mamba_head_dim, n_groups and ssm_state_size, a width-4 convolution with bias.
//
// Tensors (the Hub's names, prefix backbone.; transformers 5's model. read too): backbone.embeddings,
// backbone.layers.<l>.norm (the layer's norm: lattice's norm, input_layernorm or pre_mlp_layernorm by its
// kind), backbone.layers.<l>.mixer.* (a Mamba layer's in_proj, conv1d, dt_bias, A_log, D, norm, out_proj
// under lattice's names; an attention layer's q_proj, k_proj, v_proj into the grouped linear_qkv and o_proj;
// an MLP's up_proj and down_proj; an MoE layer's gate.weight, gate.e_score_correction_bias, experts.<e>.up_proj
// and down_proj (or transformers 5's fused experts.up_proj [E, F, C] and down_proj [E, C, F]), shared_experts.*),
// backbone.norm_f, lm_head (absent when tied). Nemotron-3's multi-token prediction (num_nextn_predict_layers depths
// of mtp_hybrid_override_pattern's blocks, or transformers 5's mtp_layers_block_type) is lattice's hybrid depths
// (--hybrid-override-pattern MAIN/MTP/...): one flat list mtp.layers.<i> (no backbone. prefix), depth k's block j at
// i = k P + j (P blocks a depth) with its norm and mixer.* as above, the depth's first block also enorm, hnorm and
// eh_proj, its last final_layernorm; depths that repeat one layer (--mtp-use-repeated-layer) are written as one
// (num_nextn_predict_layers 1, as NVIDIA publishes Nemotron-3). HF -> lattice -> HF reproduces every tensor bit
// for bit.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/hf_common.h"
#include "model/gpt_model.h"

namespace lattice {

// model_type "nemotron_h", or NemotronHForCausalLM among the architectures.
bool is_hf_nemotron_h_config(const nlohmann::json& config);

// config.json -> TransformerConfig (finalized; vocabulary padded to a multiple of divisible_by). Settings
// lattice cannot reproduce (latent MoE projections, biases, another activation, a Mamba norm epsilon other than 1e-5)
// are errors naming `what` (the file) and the key.
// With num_nextn_predict_layers, the prediction depths when `file` holds them (mtp.layers.0.eh_proj.weight) or is
// null.
TransformerConfig hf_nemotron_h_config(const nlohmann::json& config, const std::string& what,
                                       int64_t divisible_by = 128, const SafetensorsFile* file = nullptr);

// TransformerConfig -> config.json as the Hub's Nemotron-H configs are written (tokenizer_type under
// kHfTokenizerKey when non-empty).
nlohmann::json hf_nemotron_h_config_json(const TransformerConfig& c, const std::string& tokenizer_type);

// Why a lattice model has no HF Nemotron-H form ("" when it has one).
std::string hf_nemotron_h_mismatch(const TransformerConfig& c);

// Reads DIR into a model sized for 1 x seq_length tokens (0: max_position_embeddings); every problem
// (missing, misshapen or unexpected tensor) is an error naming the file and the tensor.
HfModel load_hf_nemotron_h(const std::string& dir, int64_t divisible_by = 128, int64_t seq_length = 0,
                           bool gradients = true);
// The same folder opened for a streamed conversion (hf_common.h's HfSource; the same checks).
HfSource open_hf_nemotron_h(const std::string& dir, int64_t divisible_by = 128);

// Writes DIR/model.safetensors and DIR/config.json; a model without the Nemotron-H form is an error naming
// DIR and the reason, and nothing is written.
void save_hf_nemotron_h(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                        const hf::ExportOptions& options = {});
// The same from a model's parameters wherever they are (a checkpoint read tensor by tensor).
void save_hf_nemotron_h(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                        const hf::ExportOptions& options = {});

}  // namespace lattice
