// OptimizerParamScheduler: Megatron-LM's learning-rate and weight-decay schedule
// (reference/megatron.md). Steps count SAMPLES: after each non-skipped iteration the
// trainer calls step(global_batch_size). Every value is computed in the same order of
// double operations as Megatron's Python, so the numbers agree bit for bit.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "optim/param_buffer.h"

namespace lattice {

// Megatron's constructor arguments (names as in OptimizerParamScheduler.__init__).
struct OptimizerParamSchedulerOptions {
  double init_lr = 0;                      // --lr-warmup-init
  double max_lr = 0;                       // --lr
  double min_lr = 0;                       // --min-lr
  double lr_warmup_steps = 0;              // samples; fractional with --lr-warmup-fraction
  int64_t lr_decay_steps = 0;              // samples
  std::string lr_decay_style = "linear";   // constant linear cosine inverse-square-root WSD
  double start_wd = 0, end_wd = 0;         // --start/end-weight-decay (both --weight-decay if constant)
  int64_t wd_incr_steps = 0;               // samples
  std::string wd_incr_style = "constant";  // constant linear cosine
  bool use_checkpoint_opt_param_scheduler = false;
  bool override_opt_param_scheduler = false;
  std::optional<int64_t> wsd_decay_steps;  // samples; required by WSD
  std::string lr_wsd_decay_style = "exponential";  // exponential linear cosine minus_sqrt
  // Megatron keeps these in the optimizer's param groups; here the scheduler owns them.
  std::optional<double> decoupled_lr, decoupled_min_lr;  // embedding and output layer
};

// The fields Megatron saves in a checkpoint (state_dict), by its names.
struct OptimizerParamSchedulerState {
  double max_lr = 0;
  double lr_warmup_steps = 0;
  int64_t num_steps = 0;
  std::string lr_decay_style;
  int64_t lr_decay_steps = 0;
  double min_lr = 0;
  double start_wd = 0, end_wd = 0;
  std::string wd_incr_style;
  int64_t wd_incr_steps = 0;

  nlohmann::json to_json() const;
  // `where` names the source (a checkpoint file) in errors about missing or mistyped fields.
  static OptimizerParamSchedulerState from_json(const nlohmann::json& j, const std::string& where);
};

// Megatron's parameter group of one parameter (_get_param_groups): biases and 1-D
// parameters get wd_mult 0; with --decoupled-lr the word embedding and the output layer
// form their own group with its own max/min lr.
struct ParamGroup {
  double wd_mult = 1, lr_mult = 1;
  bool is_decoupled_lr = false;
  double max_lr = 0, min_lr = 0;
};

class OptimizerParamScheduler {
 public:
  // Throws lattice::Error (naming the flag) when a constructor check fails.
  explicit OptimizerParamScheduler(const OptimizerParamSchedulerOptions& options);

  // Adds `increment` samples (the global batch size after a non-skipped iteration).
  void step(int64_t increment);

  // The learning rate of a group after num_steps samples; get_lr() is the default group's.
  double get_lr(const ParamGroup& group) const;
  double get_lr() const { return get_lr(default_group()); }
  double get_wd() const;
  // The decoupled group's learning rate, or nothing without --decoupled-lr.
  std::optional<double> get_decoupled_lr() const;

  ParamGroup param_group(const ParamInfo& p) const;
  double lr_for(const ParamInfo& p) const;  // get_lr(group) * lr_mult
  double wd_for(const ParamInfo& p) const;  // get_wd() * wd_mult

  int64_t num_steps() const { return num_steps_; }
  const OptimizerParamSchedulerOptions& options() const { return opt_; }

  OptimizerParamSchedulerState state() const;
  // Megatron's load_state_dict: with --override-opt_param-scheduler the flags' values stay;
  // with --use-checkpoint-opt_param-scheduler the checkpoint's are taken; with neither, a
  // field that differs is an error naming it (nothing is changed then). num_steps is always
  // the checkpoint's. `where` names the checkpoint in errors.
  void load_state(const OptimizerParamSchedulerState& saved, const std::string& where);

  // Word embedding and output layer: the parameters --decoupled-lr applies to.
  static bool is_embedding_or_output_parameter(const std::string& name);

 private:
  ParamGroup default_group() const;
  void check() const;

  OptimizerParamSchedulerOptions opt_;
  int64_t num_steps_ = 0;
};

}  // namespace lattice
