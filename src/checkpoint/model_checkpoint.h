// The model part of a checkpoint: every parameter under its Megatron-Core name in
// model.safetensors, and the TransformerConfig fields that fix the model's shape in
// checkpoint.json ("model_config"). `lattice generate` loads a model from a checkpoint
// directory alone.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

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
// tensor-parallel size; loading reslices the vocabulary rows).
void check_model_config(const nlohmann::json& saved, const TransformerConfig& c, const std::string& where);

// Reads this rank's box of every parameter of `model` from the checkpoint, whatever
// tensor-parallel layout saved it (names and global shapes must match, but for the padded
// vocabulary rows: tensor_parts.h).
void load_model_tensors(const CheckpointReader& r, GPTModel& model);

// A weights-only checkpoint DIR/iter_NNNNNNN (no optimizer, scheduler or RNG state);
// returns the iteration directory.
std::string save_model_checkpoint(const std::string& dir, int64_t iteration, const GPTModel& model,
                                  const std::string& args_json);

struct LoadedModel {
  std::unique_ptr<GPTModel> model;
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

// Copies every parameter of `model` from a plain safetensors file (names and shapes must
// match): HuggingFace-style weight files and test fixtures.
void load_parameters(GPTModel& model, const std::string& safetensors_path);
void load_parameters(GPTModel& model, const SafetensorsFile& file);

}  // namespace lattice
