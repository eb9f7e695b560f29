// HuggingFace GPT-2 (transformers' GPT2LMHeadModel: DIR/config.json + DIR/model.safetensors)
// <-> lattice's GPTModel.
//
// The layouts differ in three ways, each handled in one place (hf_gpt2.cpp's tensor map):
//  - HF's Conv1D stores weights [in, out]; lattice's Linear stores [out, in] (transposed).
//  - HF's c_attn output is [q of all heads | k of all heads | v of all heads] (3 x C);
//    Megatron's linear_qkv output is per head [q_h k_h v_h] (H x 3 x D).
//  - HF's vocabulary is unpadded (wte [V, C]); lattice pads it to a multiple of
//    --make-vocab-size-divisible-by with zero rows. Padded rows only produce logits of the
//    padded ids, which are never sampled or scored, so they never affect real tokens; export
//    trims them.
// HF -> lattice -> HF reproduces every tensor bit for bit (the attn.bias / attn.masked_bias
// buffers some files carry are constant masks and are not kept).
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/hf_common.h"
#include "checkpoint/safetensors.h"
#include "model/gpt_model.h"

namespace lattice {

// config.json -> TransformerConfig (finalized; vocabulary padded to a multiple of
// divisible_by). Unsupported settings (another model_type or activation, cross attention,
// unscaled or layer-scaled attention) are errors naming `what` (the file) and the key.
TransformerConfig hf_gpt2_config(const nlohmann::json& config, const std::string& what,
                                 int64_t divisible_by = 128);

// TransformerConfig -> config.json as transformers writes GPT2Config (tokenizer_type: the
// lattice tokenizer name, stored under kHfTokenizerKey when non-empty).
nlohmann::json hf_gpt2_config_json(const TransformerConfig& c, const std::string& tokenizer_type);


// The model's parameters as HF tensors ("transformer." names, F32, vocabulary trimmed to
// vocab_size, lm_head.weight only when untied), ready to write.
SafetensorsWriter export_hf_gpt2_tensors(const GPTModel& model);
// The same from a model's parameters wherever they are: each HF tensor made when written.
SafetensorsWriter export_hf_gpt2_tensors(const hf::ExportSource& src);

using HfGpt2Model = HfModel;

// Reads DIR/config.json and DIR/model.safetensors into a model sized for 1 x seq_length
// tokens (0: n_positions).
HfGpt2Model load_hf_gpt2(const std::string& dir, int64_t divisible_by = 128, int64_t seq_length = 0,
                         bool gradients = true);
// The same folder opened for a streamed conversion (hf_common.h's HfSource): names with or without the
// "transformer." prefix, F32/F16/BF16 data; every problem (missing, misshapen or unexpected tensor, an
// lm_head.weight that differs from wte.weight in a tied model) an error naming the file and the tensor.
HfSource open_hf_gpt2(const std::string& dir, int64_t divisible_by = 128);

// Why a lattice model has no HF GPT-2 form ("" when it has one): an attention other than the
// hidden size wide, RMSNorm, no linear biases, grouped-query attention, SwiGLU, rope.
std::string hf_gpt2_mismatch(const TransformerConfig& c);

// Writes DIR/model.safetensors and DIR/config.json (each atomically; DIR is created); a model
// without a GPT-2 form is an error naming DIR and the reason, and nothing is written.
void save_hf_gpt2(const std::string& dir, const GPTModel& model, const std::string& tokenizer_type,
                  const hf::ExportOptions& options = {});
// The same from a model's parameters wherever they are (a checkpoint read tensor by tensor).
void save_hf_gpt2(const std::string& dir, const hf::ExportSource& src, const std::string& tokenizer_type,
                  const hf::ExportOptions& options = {});

}  // namespace lattice
