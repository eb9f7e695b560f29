#include "checkpoint/training_checkpoint.h"

#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/model_checkpoint.h"
#include "core/error.h"

namespace lattice {
namespace {

constexpr const char* kOptimizerFile = "optimizer.safetensors";

// The optimizer's state tensors by their checkpoint prefix: Adam's two moments, or SGD's
// momentum buffer (torch's names).
struct StateSlot {
  const char* prefix;
  int slot;  // Optimizer::param_state slot
};
std::vector<StateSlot> state_slots(const std::string& optimizer) {
  if (optimizer == "adam") return {{"optimizer.exp_avg.", 1}, {"optimizer.exp_avg_sq.", 2}};
  return {{"optimizer.momentum_buffer.", 1}};
}

}  // namespace

std::string save_training_checkpoint(const TrainingSaveOptions& o, const TrainingProgress& p,
                                     const GPTModel& model, const Optimizer& optimizer,
                                     const OptimizerParamScheduler& scheduler) {
  CheckpointWriter w;
  add_model_tensors(w, model);
  CheckpointState s;
  s.iteration = p.iteration;
  s.consumed_train_samples = p.consumed_train_samples;
  s.model_config = model_config_json(model.config());
  s.args = nlohmann::json::parse(o.args_json);
  // Full optimizer tensors in the flat layout; with the distributed optimizer every
  // rank fills in its shard and gather_state completes the rest.
  std::vector<std::vector<float>> flats;
  if (o.save_optim) {
    for (const StateSlot& slot : state_slots(o.optimizer)) {
      flats.emplace_back(static_cast<size_t>(model.params().numel()), 0.0f);
      optimizer.export_state(slot.slot, flats.back().data());
      if (o.gather_state) o.gather_state(flats.back().data());
      for (const ParamInfo& pi : model.params().infos())
        w.add_tensor(kOptimizerFile, slot.prefix + pi.name, "F32", pi.shape, flats.back().data() + pi.offset);
    }
    s.optimizer = OptimizerState{o.optimizer, optimizer.steps()};
    s.opt_param_scheduler = scheduler.state().to_json();
  }
  if (o.save_rng) s.rng = RngState{p.seed};
  if (!o.write) return "";
  w.set_state(s);
  return w.save(o.dir, o.keep_last_n);
}

std::optional<TrainingProgress> load_training_checkpoint(const TrainingLoadOptions& o, const TrainingProgress& fresh,
                                                         GPTModel& model, Optimizer& optimizer,
                                                         OptimizerParamScheduler& scheduler) {
  if (!has_checkpoint(o.dir)) return std::nullopt;
  CheckpointReader r = CheckpointReader::open(o.dir);
  const CheckpointState& s = r.state();
  const std::string where = r.iter_dir();
  check_model_config(s.model_config, model.config(), where);
  load_model_tensors(r, model);
  if (o.finetune) return fresh;

  TrainingProgress p;
  p.iteration = s.iteration;
  p.consumed_train_samples = s.consumed_train_samples;
  p.seed = fresh.seed;
  if (o.load_optim) {
    if (!s.optimizer || !s.opt_param_scheduler)
      LATTICE_FAIL() << "--load " << o.dir << ": " << where
                     << " has no optimizer state (saved with --no-save-optim); give --no-load-optim or --finetune";
    if (s.optimizer->name != o.optimizer)
      LATTICE_FAIL() << "--load " << o.dir << ": " << where << " holds " << s.optimizer->name
                     << " state, this run uses --optimizer " << o.optimizer << "; give --no-load-optim";
    if (s.optimizer->step < 0) LATTICE_FAIL() << where << ": negative optimizer step " << s.optimizer->step;
    // The scheduler first: its mismatch check changes nothing when it fails.
    scheduler.load_state(OptimizerParamSchedulerState::from_json(*s.opt_param_scheduler, where), where);
    std::vector<float> flat(static_cast<size_t>(model.params().numel()), 0.0f);
    for (const StateSlot& slot : state_slots(o.optimizer)) {
      for (const ParamInfo& pi : model.params().infos())
        r.read_tensor(slot.prefix + pi.name, "F32", pi.shape, flat.data() + pi.offset);
      optimizer.import_state(slot.slot, flat.data());  // this rank's shard of it
    }
    optimizer.set_steps(s.optimizer->step);
  }
  if (o.load_rng) {
    if (!s.rng)
      LATTICE_FAIL() << "--load " << o.dir << ": " << where
                     << " has no RNG state (saved with --no-save-rng); give --no-load-rng or --finetune";
    p.seed = s.rng->seed;
  }
  return p;
}

}  // namespace lattice
