#include "train/tensorboard_log.h"

#include "core/device.h"
#include "train/memory_estimate.h"

namespace lattice {

TensorBoardLog::TensorBoardLog(const TrainArgs& a, bool writer)
    : interval_(a.tensorboard_log_interval),
      ppl_(a.log_validation_ppl_to_tensorboard),
      timers_(a.log_timers_to_tensorboard),
      loss_scale_(!a.no_log_loss_scale_to_tensorboard),
      world_size_(a.log_world_size_to_tensorboard),
      memory_(a.log_memory_to_tensorboard) {
  if (writer && !a.tensorboard_dir.empty()) writer_ = std::make_unique<TensorBoardWriter>(a.tensorboard_dir);
}

const std::string& TensorBoardLog::path() const {
  static const std::string none;
  return writer_ ? writer_->path() : none;
}

void TensorBoardLog::pair(const std::string& tag, double value, int64_t iteration, int64_t samples) {
  writer_->add_scalar(tag, value, iteration);
  writer_->add_scalar(tag + " vs samples", value, samples);
}

void TensorBoardLog::iteration(const TrainingScalars& s) {
  if (!writer_ || s.iteration % interval_ != 0) return;
  pair("learning-rate", s.learning_rate, s.iteration, s.consumed_samples);
  pair("batch-size", double(s.batch_size), s.iteration, s.consumed_samples);
  if (!s.skipped) pair("lm loss", s.lm_loss, s.iteration, s.consumed_samples);
  if (loss_scale_) pair("loss-scale", s.loss_scale, s.iteration, s.consumed_samples);
  if (world_size_) pair("world-size", double(s.world_size), s.iteration, s.consumed_samples);
  if (!s.skipped) pair("grad-norm", s.grad_norm, s.iteration, s.consumed_samples);
  if (s.num_zeros_in_grad >= 0) pair("num-zeros", s.num_zeros_in_grad, s.iteration, s.consumed_samples);
  if (s.params_norm >= 0) pair("params-norm", s.params_norm, s.iteration, s.consumed_samples);
  for (const auto& [tag, value] : s.moe) writer_->add_scalar(tag, value, s.iteration);
  if (memory_) {  // Megatron's four memory scalars, at the iteration only
    const DeviceAllocStats a = device_alloc_stats();
    writer_->add_scalar("mem-reserved-bytes", double(kernels_on_gpu() ? device_used_bytes() : resident_bytes()),
                        s.iteration);
    writer_->add_scalar("mem-allocated-bytes", double(a.allocated_bytes), s.iteration);
    writer_->add_scalar("mem-max-allocated-bytes", double(a.peak_allocated_bytes), s.iteration);
    writer_->add_scalar("mem-allocated-count", double(a.allocations), s.iteration);
  }
  writer_->flush();
}

void TensorBoardLog::iteration_time(int64_t iteration, double seconds) {
  if (!writer_ || !timers_) return;
  writer_->add_scalar("iteration-time", seconds, iteration);
  writer_->flush();
}

void TensorBoardLog::evaluation(const std::string& kind, int64_t iteration, int64_t consumed_samples,
                                const EvalResult& r) {
  if (!writer_) return;
  pair("lm loss " + kind, r.lm_loss, iteration, consumed_samples);
  if (ppl_) pair("lm loss " + kind + " ppl", r.ppl, iteration, consumed_samples);
  writer_->flush();
}

}  // namespace lattice
