#include "train/train_step.h"

#include <memory>

#include "pipeline/pipeline_runner.h"

#include "train/data_parallel.h"

namespace lattice {
namespace {

// Zero grads, forward-backward over this rank's micro-batches, gradient reductions,
// clip: everything before the update.
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
  model.params().zero_grad();
  auto fetch = [&](int64_t m, int32_t* tokens) {
    const int64_t first = dp ? dp->first_sample(iteration, cfg.global_batch_size, B, m)
                             : iteration * cfg.global_batch_size + m * B;
    fill_micro_batch(data, first, B, tokens);
  };
  auto key_of = [&](int64_t m) {
    return MicroBatchKey{cfg.seed, iteration, dp ? dp->global_micro_batch_index(m) : m, true};
  };
  auto before_backward = [&](bool last) {
    if (dp) dp->grad_sync().begin_backward(last);
  };
  StepResult r;
  r.lm_loss = pipeline->train(fetch, key_of, num_micro, B, T, 1.0f / float(num_micro), before_backward);
  r.lm_loss = pipeline->from_last_stage(r.lm_loss / double(num_micro));
  pipeline->finish_shared_embedding_grads();
  Comm* tp = model.tensor_parallel().comm;
  Comm* pp = pipeline->pipeline_group();
  if (dp) {
    dp->finish_grad_sync();
    model.finish_sequence_parallel_grads(dp->owned_ranges());
    r.lm_loss = dp->average(r.lm_loss);
    r.grad_norm = dp->clip_grad_norm(cfg.clip_grad, tp, pp);
  } else {
    model.finish_sequence_parallel_grads({});
    r.grad_norm = clip_grad_norm(model.params(), cfg.clip_grad, {}, nullptr, tp, pp);
  }
  return r;
}

}  // namespace

StepResult train_step(GPTModel& model, Optimizer& optimizer, const SampleSource& data,
                      const StepConfig& cfg, int64_t iteration, const OptimizerParamScheduler& scheduler,
                      DataParallel* dp, PipelineRunner* pipeline) {
  StepResult r = forward_backward_clip(model, data, cfg, iteration, dp, pipeline);
  optimizer.step(scheduler);
  if (dp) dp->start_param_gather();
  if (dp && !dp->config().overlap_param_gather) dp->finish_param_gather();
  return r;
}

StepResult train_step(GPTModel& model, Optimizer& optimizer, const SampleSource& data,
                      const StepConfig& cfg, int64_t iteration, double lr, double weight_decay,
                      DataParallel* dp, PipelineRunner* pipeline) {
  StepResult r = forward_backward_clip(model, data, cfg, iteration, dp, pipeline);
  optimizer.step(lr, weight_decay);
  if (dp) dp->start_param_gather();
  if (dp && !dp->config().overlap_param_gather) dp->finish_param_gather();
  return r;
}

}  // namespace lattice
