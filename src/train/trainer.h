// The trainer: `lattice train` after argument parsing.
#pragma once
#include <vector>

#include "train/arguments.h"

namespace lattice {

// Trains as the arguments say; returns the process exit code.
int run_training(const TrainArgs& args);

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
std::string format_log_line(const LogLine& l);
std::string format_metrics_json(const LogLine& l);

}  // namespace lattice
