// Megatron's training log: the line printed every --log-interval iterations, its --metrics-file JSON
// twin, and the step's MoE and multi-token prediction losses under their TensorBoard tags.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/arguments.h"
#include "train/train_step.h"

namespace lattice {

// Megatron's log line for one logging interval.
struct LogLine {
  int64_t iteration, train_iters, consumed_samples, global_batch_size;
  double elapsed_ms, tflops_per_gpu, learning_rate, lm_loss, loss_scale, grad_norm;
  int64_t skipped_iterations, nan_iterations;
  double tokens_per_sec, mfu_percent;
  double num_zeros_in_grad = -1, params_norm = -1;  // logged when >= 0 (--log-num-zeros-in-grad, --log-params-norm)
  double load_balancing_loss = -1;                  // logged when >= 0 (--num-experts)
  double seq_load_balancing_loss = -1;              // logged when >= 0 (seq_aux_loss listed)
  double global_load_balancing_loss = -1;           // logged when >= 0 (global_aux_loss listed)
  double z_loss = -1;                               // logged when >= 0 (--moe-z-loss-coeff)
  // --moe-per-layer-logging: each layer's, by layer number (-1: a dense layer; empty: not logged).
  std::vector<double> layer_load_balancing_loss, layer_z_loss;
  std::vector<double> mtp_losses;  // --mtp-num-layers: each depth's mean loss over the interval (empty: none)
};
// " iteration N/M | consumed samples: ... | lm loss: ... | ... | MFU: x% |", Megatron's fields in its order.
std::string format_log_line(const LogLine& l);
// The same values as one JSON object (a --metrics-file line).
std::string format_metrics_json(const LogLine& l);

// The step's MoE losses for TensorBoard under Megatron's tags (track_moe_metrics): each loss type the
// log line shows, over its coefficient, and with --moe-per-layer-logging each MoE layer's as
// "moe/<name>_layer_<i>"; each prediction depth's as "mtp_<k> loss" (track_mtp_metrics).
std::vector<std::pair<std::string, double>> moe_scalars(const TrainArgs& args, const StepResult& r);

}  // namespace lattice
