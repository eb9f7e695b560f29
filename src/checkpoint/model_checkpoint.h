// Model weights checkpoint: DIR/iter_NNNNNNN/model.safetensors (every parameter under
// its Megatron-Core name, the model config and the run's arguments in the metadata)
// and DIR/latest_checkpointed_iteration.txt, written last. (Optimizer, scheduler, RNG
// and data state join the checkpoint with the checkpoint issue.)
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "checkpoint/safetensors.h"
#include "model/gpt_model.h"

namespace lattice {

// Returns the iteration directory written.
std::string save_model_checkpoint(const std::string& dir, int64_t iteration, const GPTModel& model,
                                  const std::string& args_json);

struct LoadedModel {
  std::unique_ptr<GPTModel> model;
  std::string tokenizer_type;   // as trained (empty for pre-tokenised data)
  int64_t seq_length = 0;
  int64_t iteration = 0;
};

// Loads the latest checkpoint of DIR (or DIR itself when it is an iter_* directory)
// into a model sized for micro-batches of B x seq_length.
LoadedModel load_model_checkpoint(const std::string& dir, int64_t B = 1);

// Copies every parameter of `model` from a safetensors file (names and shapes must match).
void load_parameters(GPTModel& model, const std::string& safetensors_path);
void load_parameters(GPTModel& model, const SafetensorsFile& file);

}  // namespace lattice
