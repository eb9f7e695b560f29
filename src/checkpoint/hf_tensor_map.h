// How a HuggingFace model's tensors make lattice's parameters (checkpoint/hf_llama.h,
// checkpoint/hf_deepseek_v3.h): each lattice parameter is a list of HF row blocks, in order (lattice
// fuses tensors HF keeps apart: the grouped linear_qkv, SwiGLU's linear_fc1). HF Linear weights are
// [out, in] like lattice's, so a block is a range of whole rows.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "model/gpt_model.h"

namespace lattice::hf {

// Rows [row0, row0 + rows) of the HF tensor `hf`; rows < 0: all of them.
struct RowBlock {
  std::string hf;
  int64_t row0 = 0, rows = -1;
};

// A lattice parameter and the HF rows that make it, in order. vocab: the HF tensor has
// vocab_size rows, the lattice one padded_vocab_size (the rest zero on import, dropped on export).
// offset: lattice's values are HF's plus it (a GDN layer's out_norm: HF Qwen3-Next's gated norm scales by its
// weight, lattice's zero-centered one by 1 + weight: -1), added on import and taken off on export.
// A block's rows are rows along dim 0 (of any rank).
struct TensorMap {
  std::string lattice;
  std::vector<RowBlock> blocks;
  bool vocab = false;
  float offset = 0.0f;
};

// Megatron's grouped linear_qkv (`lattice`: its weight or bias) from HuggingFace's separate projections
// (`hf`: "model.layers.<l>.self_attn.", `kind`: "weight" or "bias"): per query group its heads' rows of
// q_proj, then its rows of k_proj and of v_proj.
TensorMap grouped_qkv(const TransformerConfig& c, const std::string& lattice, const std::string& hf, const char* kind);

// Every tensor of `shapes` is in f with that shape, or an error naming the file and the tensor.
void check_tensor_shapes(const SafetensorsFile& f, const std::map<std::string, Shape>& shapes);

// The model's parameters from f's tensors (each read once, in fp32), as `map` assembles them;
// shapes: every HF tensor's (the row counts of whole-tensor blocks).
void import_tensors(GPTModel& model, const SafetensorsFile& f, const std::vector<TensorMap>& map,
                    const std::map<std::string, Shape>& shapes);

// The HF tensors of `shapes` from the model's parameters, the inverse of import_tensors (padded
// vocabulary rows dropped), as an F32 file.
SafetensorsWriter export_tensors(const GPTModel& model, const std::vector<TensorMap>& map,
                                 const std::map<std::string, Shape>& shapes);

}  // namespace lattice::hf
