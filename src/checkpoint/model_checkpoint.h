// The model part of a checkpoint: every parameter under its Megatron-Core name in
// model.safetensors, and the TransformerConfig fields that fix the model's shape in
// checkpoint.json ("model_config"). `lattice generate` loads a model from a checkpoint
// directory alone.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "data/tokenizer.h"
#include "model/gpt_model.h"

namespace lattice {

inline constexpr const char* kModelFile = "model.safetensors";

// The shape-defining TransformerConfig fields, by their Megatron-Core names.
nlohmann::json model_config_json(const TransformerConfig& c);
// Inverse of model_config_json (dropout off: the config of an inference model); `where`
// names the checkpoint in errors.
TransformerConfig model_config_from_json(const nlohmann::json& j, const std::string& where);
// A one-line lattice::Error naming the first field (and its flag) in which the
// checkpoint's model differs from `c`. padded_vocab_size may differ (it depends on the
// tensor-parallel size; loading reslices the vocabulary rows), and so may the number of prediction depths where both
// have one depth's parameters (one depth, or --mtp-use-repeated-layer) of the same layers.
void check_model_config(const nlohmann::json& saved, const TransformerConfig& c, const std::string& where);

// Reads this rank's box of every parameter of `model` from the checkpoint, whatever
// tensor-parallel layout saved it (names and global shapes must match, but for the padded
// vocabulary rows: tensor_parts.h).
void load_model_tensors(const CheckpointReader& r, GPTModel& model);

// A weights-only checkpoint DIR/iter_NNNNNNN (no optimizer, scheduler or RNG state);
// returns the iteration directory.
std::string save_model_checkpoint(const std::string& dir, int64_t iteration, const GPTModel& model,
                                  const std::string& args_json);
// The same checkpoint for a one-process model of `config` (the same files byte for byte) without the model:
// each parameter's values from fill(p, dst) (dst [p.numel]) while its file is written, one parameter in memory
// at a time (lattice convert --from-hf streams so).
std::string save_model_checkpoint(const std::string& dir, int64_t iteration, const TransformerConfig& config,
                                  const std::function<void(const ParamInfo&, float*)>& fill,
                                  const std::string& args_json);

// Tensors a streamed checkpoint holds beside the model's: each parameter's values under prefix + its name in
// `file` (optimizer.safetensors' optimizer.exp_avg.<param>, ...).
struct StreamedTensors {
  std::string file, prefix;
  std::function<void(const ParamInfo&, float*)> fill;
};
// The streamed checkpoint above with `state` (its model_config set here) and those tensors too: a training checkpoint
// made without a model (lattice convert --from-megatron with a run's optimizer state).
std::string save_streamed_checkpoint(const std::string& dir, CheckpointState state, const TransformerConfig& config,
                                     const std::function<void(const ParamInfo&, float*)>& fill,
                                     const std::vector<StreamedTensors>& more = {});

struct LoadedModel {
  std::unique_ptr<GPTModel> model;  // null when opened without it (open_model_checkpoint)
  TransformerConfig config;         // the model's
  std::shared_ptr<const CheckpointReader> reader;
  std::string tokenizer_type;   // as trained (empty for pre-tokenised data)
  TokenizerSpec tokenizer;      // the tokenizer flags it was trained (or converted) with
  int64_t seq_length = 0;
  int64_t iteration = 0;
  std::string hf_model_type;    // the HuggingFace model_type its weights were converted from ("": none)
};

// Loads the latest checkpoint of DIR (or DIR itself when it is an iter_* directory)
// into a one-rank model sized for micro-batches of B x seq_length, with the checkpoint's
// padded vocabulary (whatever tensor-parallel size saved it). For inference: the model has no
// gradient buffer (GPTModel's `gradients` false), so it cannot train.
LoadedModel load_model_checkpoint(const std::string& dir, int64_t B = 1);
// The same checkpoint opened without its model (config, tokenizer and reader: a streamed export reads each
// tensor when it is written); load_model then makes the model load_model_checkpoint would.
LoadedModel open_model_checkpoint(const std::string& dir);
void load_model(LoadedModel& lm, int64_t B = 1);
// Rows of the checkpoint's parameters (whatever layout saved them) as hf::ParamRows reads them: rows
// [row0, row0 + rows) of parameter p into out, the pages read given back after (CheckpointReader::release).
std::function<void(const ParamInfo&, int64_t, int64_t, float*)> checkpoint_param_rows(
    std::shared_ptr<const CheckpointReader> reader);

// Copies every parameter of `model` from a plain safetensors file (names and shapes must
// match): HuggingFace-style weight files and test fixtures.
void load_parameters(GPTModel& model, const std::string& safetensors_path);
void load_parameters(GPTModel& model, const SafetensorsFile& file);

}  // namespace lattice
