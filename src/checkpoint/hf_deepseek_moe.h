// DeepSeek-V3's mixture of experts and multi-token prediction modules as HuggingFace files store them,
// shared by the families built on them (checkpoint/hf_deepseek_mla.h: DeepSeek-V3; checkpoint/hf_glm4_moe.h:
// GLM-4.5): the first first_k_dense_replace layers' dense SwiGLU mlp.{gate,up,down}_proj, then MoE layers
// (mlp.gate.weight the router, mlp.gate.e_score_correction_bias the choice's bias, mlp.experts.{e}.*,
// mlp.shared_experts.*: n_shared_experts experts as one ungated MLP), routed by sigmoid scores with the bias
// in the choice only, groups (n_group, topk_group), the chosen scores normalized and times
// routed_scaling_factor; and the prediction modules, layers num_hidden_layers on (enorm, hnorm, eh_proj, a
// decoder layer, shared_head.norm), lattice's --mtp-num-layers depths.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/hf_tensor_map.h"
#include "model/gpt_model.h"

namespace lattice::hf {

// Decoder layer l's MLP tensors (HF prefix `hf`, "model.layers.<l>."; lattice prefix `lat`) with every HF
// tensor's shape: the dense MLP or the MoE layer's router, expert bias (when the router has one), routed
// and shared experts. The routed experts per expert (mlp.experts.<e>.{gate,up,down}_proj.weight, the Hub's
// files, what export writes), or, when `file` holds the layer's so, as transformers 5 saves them: 3-D
// mlp.experts.gate_up_proj [E, 2F, C] (each expert's gate rows, then its up rows) and down_proj [E, C, F].
void deepseek_mlp_tensors(const TransformerConfig& c, int64_t l, const std::string& lat, const std::string& hf,
                          std::vector<TensorMap>& m, std::map<std::string, Shape>& shapes,
                          const SafetensorsFile* file = nullptr);

// The whole model's map in DeepSeek-V3's layout (returned, with every HF tensor's shape in `shapes`):
// model.embed_tokens, each decoder layer's tensors added by `layer` (given the HF layer index l, the lattice
// prefix decoder.layers.<l>., the map and the shapes), model.norm, lm_head when untied, and the prediction depths
// (mtp.layers.<k>.* <-> model.layers.<num_layers + k>.*: enorm, hnorm, eh_proj [C, 2C] (the embedding's half
// first, as Megatron's), the depth's decoder layer by `layer` under mtp.layers.<k>.transformer_layer.,
// shared_head.norm); with `copies` also each depth's copies of the embedding and the output layer
// (deepseek_mtp_copies: DeepSeek-V3's files have them).
using LayerTensors = std::function<void(int64_t l, const std::string& lat, std::vector<TensorMap>& m,
                                        std::map<std::string, Shape>& shapes)>;
std::vector<TensorMap> deepseek_layout_tensors(const TransformerConfig& c, const LayerTensors& layer, bool copies,
                                               std::map<std::string, Shape>& shapes);

// The prediction depths' copies of the embedding and the output layer DeepSeek-V3's files carry
// (model.layers.<L>.embed_tokens.weight, shared_head.head.weight), each with the model's tensor it copies.
std::vector<std::pair<std::string, std::string>> deepseek_mtp_copies(const TransformerConfig& c);
// Each copy f holds equals the model's tensor, or an error naming the file and both tensors (lattice's
// depths share the model's embedding and output layer).
void check_mtp_copies(const TransformerConfig& c, const SafetensorsFile& f);

// Checks f for a model of `c` in DeepSeek's layout: every tensor of `shapes` in f with that shape, the depths'
// copies (deepseek_mtp_copies) equal to the model's where f has them, and no other tensor in f but a tied
// model's lm_head.weight that is model.embed_tokens.weight itself; every problem an error naming the file and
// the tensor.
void check_deepseek_layout(const TransformerConfig& c, const SafetensorsFile& f,
                           const std::map<std::string, Shape>& shapes);

// DeepSeek's experts from config.json (`what`: the file, for errors): n_routed_experts (GLM's first configs:
// num_experts), num_experts_per_tok, moe_intermediate_size, n_shared_experts (default 1) of that width,
// routed_scaling_factor. DeepSeek-V2's and V3's.
void read_deepseek_experts(const nlohmann::json& j, const std::string& what, TransformerConfig& c);
// DeepSeek-V3's router and experts from config.json: read_deepseek_experts, sigmoid scores with the expert bias, norm_topk_prob (true: lattice normalizes the
// sigmoid gates of more than one expert), n_group / topk_group, MoE layers from first_k_dense_replace
// (default `first_dense`) on, every layer (moe_layer_freq 1).
void read_sigmoid_router(const nlohmann::json& j, const std::string& what, TransformerConfig& c, int64_t first_dense);

// The same fields written into config.json j.
void write_sigmoid_router(const TransformerConfig& c, nlohmann::json& j);

// Why c's experts have no DeepSeek form (nullptr when they have one): no MoE, gates other than the routed
// experts' outputs weighed (--moe-apply-probs-on-input, sinkhorn), other shared experts, a dense layer
// after an MoE layer. DeepSeek-V2's experts and V3's.
const char* deepseek_experts_mismatch(const TransformerConfig& c);
// deepseek_experts_mismatch, or why c's router is not DeepSeek-V3's: another score function or no expert
// bias, gates not normalized, groups scored otherwise.
const char* sigmoid_router_mismatch(const TransformerConfig& c);

}  // namespace lattice::hf
