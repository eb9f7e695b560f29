#include "train/train_step.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "core/device.h"
#include "core/error.h"
#include "dist/comm.h"
#include "model/mixed_precision.h"
#include "optim/loss_scaler.h"
#include "pipeline/pipeline_runner.h"
#include "kernels/elementwise.h"
#include "kernels/optimizer.h"
#include "train/data_parallel.h"
#include "train/result_validation.h"

namespace lattice {
namespace {

// Whether any gradient of this rank is inf or nan (a kernel: the grads are device memory).
bool local_grads_non_finite(const ParamBuffer& params) { return any_non_finite(params.grads(), params.numel()); }

// fp16: divides the gradients by `scale` (the loss scale, times the token count with per-token
// loss) and tells whether any rank found an
// inf/nan (MAX over the tensor-, pipeline- and data-parallel groups: every rank).
bool unscale_and_check(ParamBuffer& params, double scale, DataParallel* dp, Comm* tp, Comm* pp) {
  bool bad = local_grads_non_finite(params);
  double found = bad ? 1.0 : 0.0;
  for (Comm* c : {tp, pp, dp ? &dp->grad_comm() : nullptr})
    if (c && c->size() > 1) c->all_reduce(&found, 1, ReduceOp::max);
  if (found > 0) return true;
  scale_inplace(params.grads(), float(1.0 / scale), params.numel());
  return false;
}

// Zero grads, forward-backward over this rank's micro-batches, gradient reductions,
// clip: everything before the update (with fp16, `skipped` when the gradients overflowed).
StepResult forward_backward_clip(GPTModel& model, const SampleSource& data, const StepConfig& cfg,
                                 int64_t iteration, DataParallel* dp, PipelineRunner* pipeline) {
  const int64_t B = cfg.micro_batch_size, T = cfg.seq_length;
  const int64_t dp_size = dp ? dp->size() : 1;
  const int64_t num_micro = cfg.global_batch_size / (B * dp_size);
  std::unique_ptr<PipelineRunner> one_stage;
  if (!pipeline) {
    one_stage = std::make_unique<PipelineRunner>(model, PipelineLayout{1, 1, model.config().num_layers});
    pipeline = one_stage.get();
  }
  if (dp) dp->finish_param_gather();  // the previous step's sharded update
  if (cfg.precision) cfg.precision->refresh_weights();
  model.params().zero_grad();
  model.set_loss_gradient_of_sum(cfg.per_token_loss);
  const int64_t step_first = cfg.first_sample >= 0 ? cfg.first_sample : iteration * cfg.global_batch_size;
  auto fetch = [&](int64_t m, MicroBatch* batch) {
    const int64_t first = dp ? dp->first_sample(step_first, B, m) : step_first + m * B;
    fill_micro_batch(data, first, B, batch);
  };
  auto key_of = [&](int64_t m) {
    return MicroBatchKey{cfg.seed, iteration, dp ? dp->global_micro_batch_index(m) : m, true};
  };
  auto before_backward = [&](bool last) {
    if (dp) dp->grad_sync().begin_backward(last);
  };
  StepResult r;
  r.loss_scale = cfg.loss_scaler ? cfg.loss_scaler->scale() : 1.0;
  // Each micro-batch's loss gradient carries 1/(micro-batches of the global batch): the
  // DP reduction then sums (grad_sync.h), and backward is the same under every layout.
  // Per-token loss: each token's gradient carries the loss scale alone, and the reduced
  // gradients are divided by the global batch's token count below (Megatron's order).
  const double loss_grad_scale = cfg.per_token_loss ? r.loss_scale : r.loss_scale / double(num_micro * dp_size);
  const PipelineRunner::Losses losses =
      pipeline->train(fetch, key_of, num_micro, B, T, float(loss_grad_scale), before_backward);
  // {mean of the micro-batches' means, token loss sum, token count}, on every stage; only the
  // ones the loss needs travel (the first, or the last two).
  double sums[3] = {losses.sum_of_means / double(num_micro), losses.tokens.sum, losses.tokens.count};
  double* needed = cfg.per_token_loss ? sums + 1 : sums;
  const int num_needed = cfg.per_token_loss ? 2 : 1;
  pipeline->from_last_stage(needed, num_needed);
  pipeline->finish_shared_embedding_grads();
  if (cfg.precision) cfg.precision->finish_step();
  Comm* tp = model.tensor_parallel().comm;
  Comm* pp = pipeline->pipeline_group();
  if (dp) {
    dp->finish_grad_sync();
    model.finish_tensor_parallel_grads(dp->owned_ranges());
    dp->comm().all_reduce(needed, num_needed, ReduceOp::sum);
    sums[0] /= double(dp->size());
  } else {
    model.finish_tensor_parallel_grads({});
  }
  if (cfg.validator && cfg.validator->needs_micro_batch_losses()) {  // [all micro-batches] in global order
    std::vector<double>& v = r.micro_batch_loss_sums;
    v.assign(size_t(num_micro * dp_size), 0.0);
    for (int64_t m = 0; m < num_micro; ++m)
      v[size_t(dp ? dp->global_micro_batch_index(m) : m)] = losses.micro_batch_sums[size_t(m)];
    pipeline->from_last_stage(v.data(), int(v.size()));
    if (dp) dp->comm().all_reduce(v.data(), int64_t(v.size()), ReduceOp::sum);
  }
  if (model.config().moe()) {  // every MoE layer of every stage, micro-batch and data-parallel rank
    const GPTModel::MoeLossSums m = model.take_moe_losses();
    model.reset_global_aux_loss_tracker();  // the next step counts its own micro-batches
    double v[8] = {m.load_balancing.sum,        m.load_balancing.count,        m.seq_load_balancing.sum,
                   m.seq_load_balancing.count, m.global_load_balancing.sum,   m.global_load_balancing.count,
                   m.z.sum,                    m.z.count};  // one reduction for all
    if (pp) pp->all_reduce(v, 8, ReduceOp::sum);
    if (dp) dp->comm().all_reduce(v, 8, ReduceOp::sum);
    const TransformerConfig& c = model.config();
    r.load_balancing_loss = v[1] > 0 ? v[0] / v[1] : 0.0;
    if (c.moe_seq_aux_loss) r.seq_load_balancing_loss = v[3] > 0 ? v[2] / v[3] : 0.0;
    if (c.moe_global_aux_loss) r.global_load_balancing_loss = v[5] > 0 ? v[4] / v[5] : 0.0;
    if (c.moe_z_loss_coeff > 0.0f) r.z_loss = v[7] > 0 ? v[6] / v[7] : 0.0;
    if (cfg.moe_per_layer_logging) {  // [L] sums, [L] counts of each kind, reduced as above
      const size_t L = m.layer_load_balancing.size();
      std::vector<double> per(4 * L);
      for (size_t l = 0; l < L; ++l) {
        per[l] = m.layer_load_balancing[l].sum;
        per[L + l] = m.layer_load_balancing[l].count;
        per[2 * L + l] = m.layer_z[l].sum;
        per[3 * L + l] = m.layer_z[l].count;
      }
      if (pp) pp->all_reduce(per.data(), int64_t(per.size()), ReduceOp::sum);
      if (dp) dp->comm().all_reduce(per.data(), int64_t(per.size()), ReduceOp::sum);
      r.layer_load_balancing_loss.assign(L, -1.0);
      if (c.moe_z_loss_coeff > 0.0f) r.layer_z_loss.assign(L, -1.0);
      for (size_t l = 0; l < L; ++l) {
        if (per[L + l] > 0) r.layer_load_balancing_loss[l] = per[l] / per[L + l];
        if (c.moe_z_loss_coeff > 0.0f && per[3 * L + l] > 0) r.layer_z_loss[l] = per[2 * L + l] / per[3 * L + l];
      }
    }
    model.update_expert_biases(dp ? &dp->comm() : nullptr);  // Megatron's, before the optimizer step
  }
  if (model.config().mtp()) {  // [K] sums of the micro-batches' means, [K] counts; every stage and data-parallel rank
    const std::vector<LossSum> m = model.take_mtp_losses();
    const size_t K = size_t(model.config().mtp_num_layers);
    std::vector<double> v(2 * K, 0.0);
    for (size_t k = 0; k < m.size() && k < K; ++k) {
      v[k] = m[k].sum;
      v[K + k] = m[k].count;
    }
    if (pp) pp->all_reduce(v.data(), int64_t(v.size()), ReduceOp::sum);
    if (dp) dp->comm().all_reduce(v.data(), int64_t(v.size()), ReduceOp::sum);
    r.mtp_losses.resize(K);
    for (size_t k = 0; k < K; ++k) r.mtp_losses[k] = v[K + k] > 0 ? v[k] / v[K + k] : 0.0;
  }
  // The global batch's token count divides the per-token gradients (none when every token is
  // masked: the gradients are zero, and stay so).
  const double tokens = cfg.per_token_loss && sums[2] > 0 ? sums[2] : 1.0;
  r.lm_loss = cfg.per_token_loss ? sums[1] / tokens : sums[0];
  const auto& inject = cfg.inject_inf_iterations;
  if (std::find(inject.begin(), inject.end(), iteration) != inject.end() && model.params().numel() > 0) {
    const float inf = std::numeric_limits<float>::infinity();
    copy_to_device(model.params().grads(), &inf, sizeof(float));
  }
  if (cfg.loss_scaler) {
    r.skipped = unscale_and_check(model.params(), r.loss_scale * tokens, dp, tp, pp);
    cfg.loss_scaler->update(r.skipped);
    if (r.skipped) return r;
  } else if (tokens != 1.0) {
    scale_inplace(model.params().grads(), float(1.0 / tokens), model.params().numel());
  }
  r.grad_norm = dp ? dp->grad_norm(tp, pp) : grad_norm(model.params(), {}, nullptr, tp, pp);
  r.grad_scale = clip_coefficient(r.grad_norm, cfg.clip_grad);
  if (cfg.log_num_zeros_in_grad)
    r.num_zeros_in_grad = dp ? dp->count_zero_grads(tp, pp) : count_zero_grads(model.params(), {}, nullptr, tp, pp);
  return r;
}

// Megatron's result checks (every rank sees the same reduced values, so every rank fails alike).
void check_result(const StepResult& r, const StepConfig& cfg, int64_t iteration) {
  if (cfg.validator) cfg.validator->validate(r, iteration);
}

// After the update: the parameters' norm when asked for.
void measure_params(GPTModel& model, const StepConfig& cfg, DataParallel* dp, PipelineRunner* pipeline, StepResult& r) {
  if (!cfg.log_params_norm) return;
  Comm* tp = model.tensor_parallel().comm;
  Comm* pp = pipeline ? pipeline->pipeline_group() : nullptr;
  r.params_norm = dp ? dp->params_norm(tp, pp) : params_norm(model.params(), {}, nullptr, tp, pp);
}

}  // namespace

StepResult train_step(GPTModel& model, Optimizer& optimizer, const SampleSource& data,
                      const StepConfig& cfg, int64_t iteration, const OptimizerParamScheduler& scheduler,
                      DataParallel* dp, PipelineRunner* pipeline) {
  StepResult r = forward_backward_clip(model, data, cfg, iteration, dp, pipeline);
  check_result(r, cfg, iteration);
  if (!r.skipped) optimizer.step(scheduler, r.grad_scale);
  measure_params(model, cfg, dp, pipeline, r);
  if (cfg.precision) cfg.precision->refresh_weights();
  if (dp) dp->start_param_gather();
  if (dp && !dp->config().overlap_param_gather) dp->finish_param_gather();
  return r;
}

StepResult train_step(GPTModel& model, Optimizer& optimizer, const SampleSource& data,
                      const StepConfig& cfg, int64_t iteration, double lr, double weight_decay,
                      DataParallel* dp, PipelineRunner* pipeline) {
  StepResult r = forward_backward_clip(model, data, cfg, iteration, dp, pipeline);
  check_result(r, cfg, iteration);
  if (!r.skipped) optimizer.step(lr, weight_decay, r.grad_scale);
  measure_params(model, cfg, dp, pipeline, r);
  if (cfg.precision) cfg.precision->refresh_weights();
  if (dp) dp->start_param_gather();
  if (dp && !dp->config().overlap_param_gather) dp->finish_param_gather();
  return r;
}

}  // namespace lattice
