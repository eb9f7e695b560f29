// How a HuggingFace model's tensors make lattice's parameters (checkpoint/hf_llama.h,
// checkpoint/hf_deepseek_v3.h): each lattice parameter is a list of HF row blocks, in order (lattice
// fuses tensors HF keeps apart: the grouped linear_qkv, SwiGLU's linear_fc1). HF Linear weights are
// [out, in] like lattice's, so a block is a range of whole rows.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/model_checkpoint.h"
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
// Every tensor of f is one of `shapes`, one `skip` accepts, or (the model tied) an lm_head.weight equal to
// model.embed_tokens.weight; any other is an error naming the file and the tensor.
void check_no_other_tensors(const SafetensorsFile& f, const std::map<std::string, Shape>& shapes,
                            const TransformerConfig& c, const std::function<bool(const std::string&)>& skip = {});

// What an import reads: each lattice parameter's HF rows and every HF tensor's shape (checked against the file
// before any is read). A parameter the map does not name stays zero (a router's expert bias the file lacks).
struct ImportPlan {
  std::vector<TensorMap> map;
  std::map<std::string, Shape> shapes;
};

// The parameter p's values [p.numel] into dst as `m` assembles them from f (only the rows it names are read,
// in fp32), with m's offset added and the padded vocabulary rows zero; shapes: every HF tensor's (the row counts
// of whole-tensor blocks).
void fill_parameter(const SafetensorsFile& f, const TensorMap& m, const std::map<std::string, Shape>& shapes,
                    const ParamInfo& p, float* dst);

// Where an export reads lattice parameters: rows [row0, row0 + rows) (along dim 0) of parameter p into out.
using ParamRows = std::function<void(const ParamInfo& p, int64_t row0, int64_t rows, float* out)>;

// The HF tensors of `shapes` from the parameters of `layout` read through `rows`, the inverse of fill_parameter
// (padded vocabulary rows dropped), as an F32 file whose tensors are made only when written (one at a time:
// SafetensorsWriter::add_produced); `rows` must stay usable until the file is written.
SafetensorsWriter export_tensors(const ParamBuffer& layout, const ParamRows& rows, const std::vector<TensorMap>& map,
                                 const std::map<std::string, Shape>& shapes);
// A model's parameters as ParamRows (its host copy held while the function lives).
ParamRows model_rows(const GPTModel& model);

// What an export writes from: a model's configuration, its parameters' layout and their rows (a loaded model's,
// or a checkpoint's read as each HF tensor is written: lattice convert --to-hf streams so).
struct ExportSource {
  TransformerConfig config;
  std::shared_ptr<const ParamBuffer> layout;
  ParamRows rows;
};
// Parameter `name` of src whole [numel] (a vocabulary's padded rows zero, not read).
std::vector<float> read_param(const ExportSource& src, const std::string& name);
// Its rows into dst but a padded vocabulary's padding: numel floats, or vocab_size rows (what dst holds).
void read_param_rows(const ExportSource& src, const std::string& name, float* dst);
// A loaded model as an ExportSource (it must outlive the export).
ExportSource model_source(const GPTModel& model);
// A checkpoint opened without its model (open_model_checkpoint) as an ExportSource: each parameter's rows read
// from the checkpoint when an HF tensor that needs them is written.
ExportSource checkpoint_source(const LoadedModel& lm);
// The same from the model.
SafetensorsWriter export_tensors(const GPTModel& model, const std::vector<TensorMap>& map,
                                 const std::map<std::string, Shape>& shapes);

}  // namespace lattice::hf
