// One training iteration: zero grads, forward-backward over this rank's micro-batches
// of the global batch (gradient accumulation, through the pipeline schedule when the
// model is one stage of several), gradient reductions (tied embedding over the first
// and last stage, data parallelism, sequence-parallel norms), clip, optimizer step. The
// building block of the trainer and of library users' own loops.
#pragma once
#include <cstdint>
#include <vector>

#include "data/gpt_batches.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"

namespace lattice {

class DataParallel;
class LossScaler;
class MixedPrecisionPolicy;
class PipelineRunner;
class ResultValidator;

struct StepConfig {
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 1;
  int64_t seq_length = 0;
  double clip_grad = 1.0;
  uint64_t seed = 1234;
  // fp16 loss scaling (null: none). The loss gradient is multiplied by the scaler's scale and
  // the gradients by 1/scale after their reductions; when any gradient on any rank is inf or
  // nan the update is skipped (StepResult::skipped). The scaler is updated every step.
  LossScaler* loss_scaler = nullptr;
  // Mixed precision (null: fp32): told after each update that the main parameters changed.
  MixedPrecisionPolicy* precision = nullptr;
  // Test hook (no flag): at these iterations an inf is written into this rank's first
  // gradient after backward, as an fp16 overflow would leave it.
  std::vector<int64_t> inject_inf_iterations;
  // The step's first sample: the samples consumed before it (-1: iteration x global batch
  // size; --rampup-batch-size changes the batch size from step to step).
  int64_t first_sample = -1;
  // Megatron's --calculate-per-token-loss: the step's loss is the sum of its token losses over
  // all micro-batches and data-parallel ranks divided by their token count, and so is its
  // gradient (otherwise: the mean over micro-batches of each micro-batch's mean token loss).
  // The same with any split of the global batch into micro-batches and ranks, also when
  // --eod-mask-loss leaves micro-batches with different token counts.
  bool per_token_loss = false;
  // Megatron's --log-num-zeros-in-grad and --log-params-norm: StepResult's num_zeros_in_grad
  // (the reduced, unscaled gradients before clipping) and params_norm (after the update).
  bool log_num_zeros_in_grad = false, log_params_norm = false;
  // Megatron's result checks (train/result_validation.h: --check-for-nan-in-loss-and-grad,
  // --check-for-spiky-loss, --check-for-large-grads; null: none): a step whose result the validator
  // rejects fails (lattice::Error naming the iteration) before its update, so the parameters stay as
  // they were. An fp16 step skipped for overflow is not checked.
  ResultValidator* validator = nullptr;
  // Megatron's --moe-per-layer-logging: StepResult's layer_load_balancing_loss and layer_z_loss.
  bool moe_per_layer_logging = false;
};

struct StepResult {
  double lm_loss = 0;    // mean over micro-batches of each micro-batch's mean token loss (per_token_loss:
                         // the global batch's mean token loss)
  double grad_norm = 0;  // before clipping
  float grad_scale = 1;  // clipping's coefficient, applied by the optimizer as it reads the gradients
  bool skipped = false;  // no update was applied (fp16 inf/nan); the LR scheduler must not step
  double loss_scale = 1;  // the scale this step's gradients were computed with
  int64_t num_zeros_in_grad = -1;  // with StepConfig::log_num_zeros_in_grad (-1: not counted)
  double params_norm = -1;         // with StepConfig::log_params_norm (-1: not computed)
  // --num-experts: the load-balancing loss over its coefficient (1: the experts evenly loaded),
  // averaged over the MoE layers, micro-batches and data-parallel ranks, as Megatron logs it
  // (-1: no experts).
  double load_balancing_loss = -1;
  double seq_load_balancing_loss = -1;     // seq_aux_loss listed (-1: not)
  double global_load_balancing_loss = -1;  // global_aux_loss listed (-1: not)
  double z_loss = -1;  // --moe-z-loss-coeff: the z-loss over its coefficient, averaged the same way (-1: none)
  // StepConfig::moe_per_layer_logging: each layer's load-balancing loss (and with --moe-z-loss-coeff its
  // z-loss) averaged the same way, by layer number, -1 for a dense layer; empty otherwise.
  std::vector<double> layer_load_balancing_loss, layer_z_loss;
  // With a validator that checks for spiky loss: every micro-batch's loss (the sum of its token
  // losses) in the global batch's order, the same on every rank; empty otherwise.
  std::vector<double> micro_batch_loss_sums;
  // --mtp-num-layers: each prediction depth's loss (Megatron's "mtp_<k> loss"), averaged over the
  // micro-batches and data-parallel ranks as lm_loss is; empty without it.
  std::vector<double> mtp_losses;
};

// Runs iteration `iteration` (0-based) on samples [iteration*GBS, (iteration+1)*GBS); each
// parameter's learning rate and weight decay come from the scheduler's current state (the
// caller steps the scheduler by GBS afterwards unless the result is skipped).
// With `dp`, this rank runs its share of the global batch (data parallelism) and the
// gradients are reduced over the data-parallel group before clipping. With `pipeline`
// the model is this rank's stage and the runner's schedule drives the micro-batches
// (null: one stage).
StepResult train_step(GPTModel& model, Optimizer& optimizer, const SampleSource& data,
                      const StepConfig& cfg, int64_t iteration, const OptimizerParamScheduler& scheduler,
                      DataParallel* dp = nullptr, PipelineRunner* pipeline = nullptr);

// The same with a constant learning rate and weight decay (none on biases and 1-D params).
StepResult train_step(GPTModel& model, Optimizer& optimizer, const SampleSource& data,
                      const StepConfig& cfg, int64_t iteration, double lr, double weight_decay,
                      DataParallel* dp = nullptr, PipelineRunner* pipeline = nullptr);

}  // namespace lattice
