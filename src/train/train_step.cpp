#include "train/train_step.h"

#include "train/data_parallel.h"

namespace lattice {
namespace {

// Zero grads, forward-backward over this rank's micro-batches, gradient reduction over
// data parallelism, clip: everything before the update.
StepResult forward_backward_clip(GPTModel& model, const SampleSource& data, const StepConfig& cfg,
                                 int64_t iteration, DataParallel* dp) {
  const int64_t B = cfg.micro_batch_size, T = cfg.seq_length;
  const int64_t dp_size = dp ? dp->size() : 1;
  const int64_t num_micro = cfg.global_batch_size / (B * dp_size);
  std::vector<int32_t> tokens(static_cast<size_t>(B * (T + 1)));
  if (dp) dp->finish_param_gather();  // the previous step's sharded update
  model.params().zero_grad();
  StepResult r;
  for (int64_t m = 0; m < num_micro; ++m) {
    const int64_t first = dp ? dp->first_sample(iteration, cfg.global_batch_size, B, m) : iteration * cfg.global_batch_size + m * B;
    fill_micro_batch(data, first, B, tokens.data());
    MicroBatchKey key{cfg.seed, iteration, dp ? dp->global_micro_batch_index(m) : m, true};
    if (dp) dp->grad_sync().begin_backward(m == num_micro - 1);
    r.lm_loss += model.forward_backward(tokens.data(), nullptr, B, T, 1.0f / float(num_micro), key);
  }
  r.lm_loss /= double(num_micro);
  Comm* tp = model.tensor_parallel().comm;
  if (dp) {
    dp->finish_grad_sync();
    model.finish_sequence_parallel_grads(dp->owned_ranges());
    r.lm_loss = dp->average(r.lm_loss);
    r.grad_norm = dp->clip_grad_norm(cfg.clip_grad, tp);
  } else {
    model.finish_sequence_parallel_grads({});
    r.grad_norm = clip_grad_norm(model.params(), cfg.clip_grad, {}, nullptr, tp);
  }
  return r;
}

}  // namespace

StepResult train_step(GPTModel& model, Optimizer& optimizer, const SampleSource& data,
                      const StepConfig& cfg, int64_t iteration, const OptimizerParamScheduler& scheduler,
                      DataParallel* dp) {
  StepResult r = forward_backward_clip(model, data, cfg, iteration, dp);
  optimizer.step(scheduler);
  if (dp) dp->start_param_gather();
  if (dp && !dp->config().overlap_param_gather) dp->finish_param_gather();
  return r;
}

StepResult train_step(GPTModel& model, Optimizer& optimizer, const SampleSource& data,
                      const StepConfig& cfg, int64_t iteration, double lr, double weight_decay,
                      DataParallel* dp) {
  StepResult r = forward_backward_clip(model, data, cfg, iteration, dp);
  optimizer.step(lr, weight_decay);
  if (dp) dp->start_param_gather();
  if (dp && !dp->config().overlap_param_gather) dp->finish_param_gather();
  return r;
}

}  // namespace lattice
