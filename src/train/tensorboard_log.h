// The scalars Megatron's training loop writes to TensorBoard (its training_log and
// evaluate_and_print_results), under its tags, each at the iteration and, for the
// "... vs samples" twin, at the consumed samples:
//   every --tensorboard-log-interval iterations: learning-rate, batch-size, lm loss (that
//     iteration's), loss-scale (unless --no-log-loss-scale-to-tensorboard), grad-norm,
//     world-size (--log-world-size-to-tensorboard); with --log-memory-to-tensorboard (at the
//     iteration only) mem-reserved-bytes (the process's resident memory, or the memory in use on
//     its GPU), mem-allocated-bytes and mem-max-allocated-bytes (lattice's buffers now and at
//     most: core/device.h device_alloc_stats) and mem-allocated-count; an iteration whose update was skipped
//     (fp16 overflow) has no lm loss and no grad-norm, as in Megatron;
//   with --num-experts, at the same iterations (no twin): load_balancing_loss (and seq_/global_
//     load_balancing_loss, z_loss as the log line has them), over their coefficients, and with
//     --moe-per-layer-logging each MoE layer's as moe/load_balancing_loss_layer_<i> (moe/z_loss_layer_<i>),
//     as Megatron's track_moe_metrics;
//   every --log-interval: iteration-time in seconds (--log-timers-to-tensorboard; no twin);
//   each evaluation: "lm loss validation" (and "lm loss validation ppl" with
//     --log-validation-ppl-to-tensorboard); the final test-set evaluation as "lm loss test".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "train/arguments.h"
#include "train/evaluation.h"
#include "train/tensorboard.h"

namespace lattice {

struct TrainingScalars {
  int64_t iteration = 0, consumed_samples = 0, batch_size = 0, world_size = 1;
  double learning_rate = 0, lm_loss = 0, loss_scale = 1, grad_norm = 0;
  bool skipped = false;  // no lm loss then
  double num_zeros_in_grad = -1, params_norm = -1;  // written when >= 0
  std::vector<std::pair<std::string, double>> moe;  // the MoE losses: tag, value (at the iteration only)
};

class TensorBoardLog {
 public:
  // Nothing is written without --tensorboard-dir, or on a rank that is not the writer.
  TensorBoardLog(const TrainArgs& args, bool writer);
  bool active() const { return writer_ != nullptr; }
  const std::string& path() const;

  // After an iteration: its scalars when iteration is a multiple of --tensorboard-log-interval.
  void iteration(const TrainingScalars& s);
  // At a log line (every --log-interval): the mean iteration time of the interval.
  void iteration_time(int64_t iteration, double seconds);
  // After an evaluation; kind "validation" or "test".
  void evaluation(const std::string& kind, int64_t iteration, int64_t consumed_samples, const EvalResult& r);

 private:
  void pair(const std::string& tag, double value, int64_t iteration, int64_t samples);
  std::unique_ptr<TensorBoardWriter> writer_;
  int64_t interval_ = 1;
  bool ppl_ = false, timers_ = false, loss_scale_ = true, world_size_ = false, memory_ = false;
};

}  // namespace lattice
