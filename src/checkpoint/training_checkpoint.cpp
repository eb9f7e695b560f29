#include "checkpoint/training_checkpoint.h"

#include "optim/loss_scaler.h"

#include <algorithm>
#include <functional>
#include <list>
#include <optional>
#include <set>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/host_staging.h"
#include "checkpoint/model_checkpoint.h"
#include "checkpoint/part_gather.h"
#include "core/error.h"
#include "dist/comm.h"

namespace lattice {
namespace {

constexpr int kSaveTag = 3100;  // the part transfers of a save: one tag per buffer
}  // namespace

// The optimizer's state tensors by their checkpoint prefix: Adam's two moments, or SGD's
// momentum buffer (torch's names). Muon's: Adam's two, a Muon matrix's momentum buffer in exp_avg
// and zeros in exp_avg_sq.
std::vector<StateSlot> state_slots(const std::string& optimizer) {
  if (optimizer == "adam" || optimizer == "muon") return {{"optimizer.exp_avg.", 1}, {"optimizer.exp_avg_sq.", 2}};
  return {{"optimizer.momentum_buffer.", 1}};
}

std::string save_training_checkpoint(const TrainingSaveOptions& o, const TrainingProgress& p,
                                     const GPTModel& model, const Optimizer& optimizer,
                                     const OptimizerParamScheduler& scheduler) {
  const std::vector<ParamInfo>& infos = model.params().infos();
  const int64_t n = model.params().numel();
  const int tp_rank = model.tensor_parallel().rank();
  const bool contribute = !o.parts_comm || o.contributors.empty() ||
                          std::count(o.contributors.begin(), o.contributors.end(), o.parts_comm->rank()) != 0;
  LATTICE_CHECK(!o.write || !o.parts_comm || o.contributors.empty() || o.contributors[0] == o.parts_comm->rank())
      << "the checkpoint writer must be the first contributor";
  // The buffers the writer's own parts are written from, alive until the save returns: the parameters
  // on the host (on the CPU the buffer itself) and each optimizer state tensor's flat copy. A checkpoint
  // then costs the optimizer state's copies and nothing for the parameters.
  std::optional<HostStaging> params;
  std::list<std::vector<float>> states;
  CheckpointWriter w;
  std::set<std::string> staged;  // name and box of every staged part
  int tag = kSaveTag;
  // Every contributor's parts of one buffer in the parameter layout, staged by the writer one rank at
  // a time: its own written from `flat`, another rank's (in a buffer the next one reuses) copied. A box
  // another rank already gave is a copy of it (a tied embedding's copy on another pipeline stage): stored
  // once.
  auto stage = [&](const char* file, const std::string& prefix, const float* flat) {
    std::vector<TensorPart> mine = param_parts(infos, flat, tp_rank, prefix);
    if (o.experts_only)
      mine.erase(std::remove_if(mine.begin(), mine.end(),
                                [&](const TensorPart& t) { return !model.params().info(t.name.substr(prefix.size())).expert; }),
                 mine.end());
    gather_parts(o.parts_comm, o.contributors, mine, flat, n, tag++,
                 [&](const std::vector<TensorPart>& parts) {
                   if (!o.write) return;
                   for (const TensorPart& t : parts) {
                     nlohmann::json key = {t.name, t.offsets, t.lengths};
                     const bool own = std::less_equal<>{}(flat, t.data) && std::less<>{}(t.data, flat + n);
                     if (staged.insert(key.dump()).second)
                       w.add_piece(file, t.name, "F32", t.global_shape, t.offsets, t.lengths, t.data, own);
                   }
                 });
  };
  if (contribute) stage(kModelFile, "", params.emplace(model.params().params(), n, true).data());
  CheckpointState s;
  s.iteration = p.iteration;
  s.consumed_train_samples = p.consumed_train_samples;
  s.num_floating_point_operations_so_far = p.flops_so_far;
  if (!p.rerun_state_machine.is_null()) s.rerun_state_machine = p.rerun_state_machine;
  s.model_config = model_config_json(model.config());
  s.args = nlohmann::json::parse(o.args_json);
  if (o.save_optim) {
    // Each state tensor in the flat layout (host memory: export_state copies the device's
    // state out); with the distributed optimizer every rank fills in its shard and
    // gather_state completes the rest.
    for (const StateSlot& slot : state_slots(o.optimizer)) {
      std::vector<float>& flat = states.emplace_back(static_cast<size_t>(n), 0.0f);
      optimizer.export_state(slot.slot, flat.data());
      if (o.gather_state) o.gather_state(flat.data());
      if (contribute) stage(kOptimizerFile, slot.prefix, flat.data());
    }
    s.optimizer = OptimizerState{o.optimizer, optimizer.steps()};
    if (o.loss_scaler && o.loss_scaler->dynamic()) s.loss_scaler = o.loss_scaler->state();
    if (o.precision) {
      for (const auto& [index, st] : o.precision->scaling_state()) s.fp8[infos[size_t(index)].name] = st;
      if (o.merge_fp8) o.merge_fp8(s.fp8);
    }
    s.opt_param_scheduler = scheduler.state().to_json();
  }
  if (o.save_rng) s.rng = RngState{p.seed};
  if (!o.write) return "";
  w.set_state(s);
  return w.save(o.dir, o.keep_last_n, o.retain_interval);
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
  TrainingProgress p = fresh;
  p.provenance = checkpoint_provenance(s.args);
  if (o.finetune) return p;

  p.iteration = s.iteration;
  p.consumed_train_samples = s.consumed_train_samples;
  p.flops_so_far = s.num_floating_point_operations_so_far;
  if (s.rerun_state_machine) p.rerun_state_machine = *s.rerun_state_machine;
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
      for (const ParamInfo& pi : model.params().infos())  // this rank's box of each
        read_param_part(r, slot.prefix + pi.name, pi, flat.data() + pi.offset);
      optimizer.import_state(slot.slot, flat.data());  // this rank's shard of it (copied to the device)
    }
    optimizer.set_steps(s.optimizer->step);
    // A constant --loss-scale keeps the command line's value.
    if (o.loss_scaler && o.loss_scaler->dynamic() && s.loss_scaler) o.loss_scaler->load_state(*s.loss_scaler);
    if (o.precision) {
      const std::vector<ParamInfo>& infos = model.params().infos();
      for (size_t i = 0; i < infos.size(); ++i) {
        auto it = s.fp8.find(infos[i].name);
        if (it != s.fp8.end()) o.precision->load_scaling_state(int(i), it->second);
      }
    }
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
