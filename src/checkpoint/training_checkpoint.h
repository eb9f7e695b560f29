// A whole training run's checkpoint: the model, the optimizer state (moments and step
// count), the learning-rate scheduler, the RNG seed, the data position and the arguments,
// saved and restored with Megatron's options (--no-save-optim, --no-load-optim,
// --no-load-rng, --finetune, ...). The trainer's only interface to checkpoints.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/gpt_model.h"
#include "model/mixed_precision.h"
#include "optim/opt_param_scheduler.h"
#include "optim/optimizer.h"

namespace lattice {

class LossScaler;

class Comm;

// Where training stands after `iteration` completed iterations.
struct TrainingProgress {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;  // the next sample index
  uint64_t seed = 0;                   // keys the dropout stream
  double flops_so_far = 0;             // the model FLOPs of the iterations so far (CheckpointState's)
  nlohmann::json provenance = nlohmann::json::object();  // the loaded checkpoint's checkpoint_provenance
  // The result checks' samples (ResultValidator::state(); null: none, not saved).
  nlohmann::json rerun_state_machine = nullptr;
};

// An optimizer's state tensors in optimizer.safetensors: each parameter's under prefix + its name
// ("optimizer.exp_avg.<param>", ...), from the optimizer's state slot.
struct StateSlot {
  const char* prefix;
  int slot;  // Optimizer::param_state slot
};
std::vector<StateSlot> state_slots(const std::string& optimizer);  // --optimizer's: adam (and muon), sgd

struct TrainingSaveOptions {
  std::string dir;                // --save
  std::string optimizer = "adam";  // --optimizer: names the state tensors
  bool save_optim = true;         // !--no-save-optim (optimizer and scheduler)
  bool save_rng = true;           // !--no-save-rng
  int64_t keep_last_n = 0;        // --keep-last-n
  int64_t retain_interval = 0;    // --save-retain-interval
  std::string args_json;          // TrainArgs::to_json()
  // Distributed optimizer: completes a flat optimizer-state buffer in which this rank
  // filled its shard (an all-gather over the data-parallel group). Null: nothing to do.
  std::function<void(float*)> gather_state;
  bool write = true;              // false on the ranks that only take part in the gather
  const LossScaler* loss_scaler = nullptr;  // fp16: its state is saved with the optimizers
  // fp8: its scaling state is saved with the optimizers, by weight name. Under pipeline
  // parallelism each stage holds its own weights' state: merge_fp8 (collective, on every
  // rank) completes the writer's map with the other stages'. Null: this rank's alone.
  const MixedPrecisionPolicy* precision = nullptr;
  std::function<void(std::map<std::string, Fp8ScalingState>&)> merge_fp8;
  // Several ranks holding parts of the model (tensor parallelism): the ranks whose parts make
  // the checkpoint, as ranks of parts_comm, the writer (write = true) first: data-parallel
  // rank 0 of every tensor-parallel (and pipeline) position (the other data-parallel ranks
  // hold copies).
  // Each sends its parts to the writer (part_gather.h). Null / empty: this rank holds all.
  Comm* parts_comm = nullptr;
  std::vector<int> contributors;
  // This rank contributes its expert weights only (ParamInfo::expert): an expert-parallel rank
  // whose other parameters data-parallel rank 0 contributes.
  bool experts_only = false;
};

// Writes DIR/iter_NNNNNNN atomically and then the tracker file; returns the directory
// (empty when !write). Every tensor is stored under its global shape, as the pieces its
// tensor-parallel ranks hold (docs/checkpoint-format.md). Collective: every rank calls it.
std::string save_training_checkpoint(const TrainingSaveOptions& o, const TrainingProgress& p,
                                     const GPTModel& model, const Optimizer& optimizer,
                                     const OptimizerParamScheduler& scheduler);

struct TrainingLoadOptions {
  std::string dir;                 // --load
  std::string optimizer = "adam";  // --optimizer
  bool load_optim = true;          // !--no-load-optim (optimizer and scheduler, as Megatron)
  bool load_rng = true;            // !--no-load-rng
  bool finetune = false;           // --finetune: parameters only, progress restarts at 0
  // fp16: restored with the optimizer state when the checkpoint has it (a checkpoint
  // from an fp32 or bf16 run leaves the scaler at its initial scale).
  LossScaler* loss_scaler = nullptr;
  // fp8: the saved scaling state of each of this rank's weights, with the optimizer state
  // (a weight the checkpoint has none for keeps its fresh state).
  MixedPrecisionPolicy* precision = nullptr;
};

// Loads DIR's latest checkpoint (or DIR itself, an iteration directory) into the model,
// optimizer and scheduler (each rank reads its own box of every tensor, so any
// tensor-parallel layout loads any other's checkpoint) and returns the
// progress to resume from (`fresh` carries the command line's seed, used when the RNG
// state is not loaded). Returns nullopt, touching nothing, when DIR holds no checkpoint
// (neither a tracker file nor checkpoint.json): the run starts from scratch. Any damage or mismatch is a one-line
// lattice::Error naming the file or field.
std::optional<TrainingProgress> load_training_checkpoint(const TrainingLoadOptions& o, const TrainingProgress& fresh,
                                                         GPTModel& model, Optimizer& optimizer,
                                                         OptimizerParamScheduler& scheduler);

}  // namespace lattice
