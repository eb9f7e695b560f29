// The learning-rate and weight-decay schedule of a training run, from its flags: Megatron's
// get_optimizer_param_scheduler (iteration- or sample-based) and its flag checks.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "optim/opt_param_scheduler.h"
#include "train/arguments.h"

namespace lattice {

// The scheduler `lattice train` uses. Throws lattice::Error naming the flag on an invalid
// combination (e.g. --lr-warmup-fraction with --lr-warmup-iters, --lr-decay-samples without
// --train-samples, --start-weight-decay with the constant style).
OptimizerParamScheduler get_optimizer_param_scheduler(const TrainArgs& args);

// The schedule after `iteration` iterations (consumed_samples = iteration x GBS).
struct ScheduleRow {
  int64_t iteration = 0, consumed_samples = 0;
  double lr = 0, weight_decay = 0;       // the default parameter group (wd_mult 1)
  std::optional<double> decoupled_lr;    // with --decoupled-lr
};

// Rows for iterations 0..train_iters.
std::vector<ScheduleRow> schedule_rows(const TrainArgs& args);

}  // namespace lattice
