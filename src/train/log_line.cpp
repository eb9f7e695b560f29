#include "train/log_line.h"

#include <cstdio>
#include <nlohmann/json.hpp>

namespace lattice {

std::string format_log_line(const LogLine& l) {
  // Megatron's order: ... | grad norm | num zeros | params norm | number of skipped iterations ...
  char optional[128] = "";
  int n = 0;
  if (l.num_zeros_in_grad >= 0) n += std::snprintf(optional + n, sizeof optional - n, " num zeros: %.1f |", l.num_zeros_in_grad);
  if (l.params_norm >= 0) std::snprintf(optional + n, sizeof optional - n, " params norm: %.3f |", l.params_norm);
  // Megatron's MoE losses follow the lm loss.
  char moe[512] = "";
  int m = 0;
  if (l.load_balancing_loss >= 0) m += std::snprintf(moe, sizeof moe, " load_balancing_loss: %.6E |", l.load_balancing_loss);
  if (l.seq_load_balancing_loss >= 0)
    m += std::snprintf(moe + m, sizeof moe - size_t(m), " seq_load_balancing_loss: %.6E |", l.seq_load_balancing_loss);
  if (l.global_load_balancing_loss >= 0)
    m += std::snprintf(moe + m, sizeof moe - size_t(m), " global_load_balancing_loss: %.6E |",
                       l.global_load_balancing_loss);
  if (l.z_loss >= 0) m += std::snprintf(moe + m, sizeof moe - size_t(m), " z_loss: %.6E |", l.z_loss);
  // --mtp-num-layers: Megatron's "mtp_<k> loss" of each depth (from 1).
  for (size_t k = 0; k < l.mtp_losses.size() && m < int(sizeof moe) - 40; ++k)
    m += std::snprintf(moe + m, sizeof moe - size_t(m), " mtp_%zu loss: %.6E |", k + 1, l.mtp_losses[k]);
  char buf[1536];
  std::snprintf(buf, sizeof buf,
                " iteration %8lld/%8lld | consumed samples: %12lld | elapsed time per iteration (ms): "
                "%.1f | throughput per GPU (TFLOP/s/GPU): %.3f | learning rate: %.6E | global batch "
                "size: %5lld | lm loss: %.6E |%s loss scale: %.1f | grad norm: %.3f |%s number of skipped "
                "iterations: %3lld | number of nan iterations: %3lld | tokens per second: %.1f | MFU: "
                "%.1f%% |",
                (long long)l.iteration, (long long)l.train_iters, (long long)l.consumed_samples,
                l.elapsed_ms, l.tflops_per_gpu, l.learning_rate, (long long)l.global_batch_size,
                l.lm_loss, moe, l.loss_scale, l.grad_norm, optional, (long long)l.skipped_iterations,
                (long long)l.nan_iterations, l.tokens_per_sec, l.mfu_percent);
  return buf;
}

std::string format_metrics_json(const LogLine& l) {
  nlohmann::json j = {{"iteration", l.iteration},
                      {"consumed_samples", l.consumed_samples},
                      {"lm_loss", l.lm_loss},
                      {"learning_rate", l.learning_rate},
                      {"grad_norm", l.grad_norm},
                      {"loss_scale", l.loss_scale},
                      {"elapsed_ms", l.elapsed_ms},
                      {"tokens_per_sec", l.tokens_per_sec},
                      {"tflops_per_gpu", l.tflops_per_gpu},
                      {"mfu_percent", l.mfu_percent},
                      {"skipped_iterations", l.skipped_iterations},
                      {"nan_iterations", l.nan_iterations}};
  if (l.num_zeros_in_grad >= 0) j["num_zeros_in_grad"] = l.num_zeros_in_grad;
  if (l.params_norm >= 0) j["params_norm"] = l.params_norm;
  if (l.load_balancing_loss >= 0) j["load_balancing_loss"] = l.load_balancing_loss;
  if (l.seq_load_balancing_loss >= 0) j["seq_load_balancing_loss"] = l.seq_load_balancing_loss;
  if (l.global_load_balancing_loss >= 0) j["global_load_balancing_loss"] = l.global_load_balancing_loss;
  if (l.z_loss >= 0) j["z_loss"] = l.z_loss;
  // --moe-per-layer-logging: one value per layer, null for a dense one.
  auto per_layer = [&](const char* key, const std::vector<double>& v) {
    if (v.empty()) return;
    nlohmann::json a = nlohmann::json::array();
    for (double x : v) a.push_back(x >= 0 ? nlohmann::json(x) : nlohmann::json(nullptr));
    j[key] = a;
  };
  per_layer("load_balancing_loss_layers", l.layer_load_balancing_loss);
  per_layer("z_loss_layers", l.layer_z_loss);
  if (!l.mtp_losses.empty()) j["mtp_losses"] = l.mtp_losses;
  return j.dump();
}

// The step's MoE losses for TensorBoard under Megatron's tags (track_moe_metrics): each loss type the
// log line shows, over its coefficient, and with --moe-per-layer-logging each MoE layer's as
// "moe/<name>_layer_<i>".
std::vector<std::pair<std::string, double>> moe_scalars(const TrainArgs& args, const StepResult& r) {
  std::vector<std::pair<std::string, double>> s;
  if (r.skipped) return s;
  if (r.load_balancing_loss >= 0 && args.logs_micro_batch_balance()) s.emplace_back("load_balancing_loss", r.load_balancing_loss);
  if (r.seq_load_balancing_loss >= 0) s.emplace_back("seq_load_balancing_loss", r.seq_load_balancing_loss);
  if (r.global_load_balancing_loss >= 0) s.emplace_back("global_load_balancing_loss", r.global_load_balancing_loss);
  if (r.z_loss >= 0) s.emplace_back("z_loss", r.z_loss);
  for (size_t l = 0; l < r.layer_load_balancing_loss.size(); ++l)
    if (r.layer_load_balancing_loss[l] >= 0)
      s.emplace_back("moe/load_balancing_loss_layer_" + std::to_string(l), r.layer_load_balancing_loss[l]);
  for (size_t l = 0; l < r.layer_z_loss.size(); ++l)
    if (r.layer_z_loss[l] >= 0) s.emplace_back("moe/z_loss_layer_" + std::to_string(l), r.layer_z_loss[l]);
  for (size_t k = 0; k < r.mtp_losses.size(); ++k)  // Megatron's track_mtp_metrics tags
    s.emplace_back("mtp_" + std::to_string(k + 1) + " loss", r.mtp_losses[k]);
  return s;
}

}  // namespace lattice
