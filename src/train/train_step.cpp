#include "train/train_step.h"

namespace lattice {

StepResult train_step(GPTModel& model, Optimizer& optimizer, const SampleSource& data,
                      const StepConfig& cfg, int64_t iteration, double lr, double weight_decay) {
  const int64_t B = cfg.micro_batch_size, T = cfg.seq_length;
  const int64_t num_micro = cfg.global_batch_size / cfg.micro_batch_size;
  std::vector<int32_t> tokens(static_cast<size_t>(B * (T + 1)));
  model.params().zero_grad();
  StepResult r;
  for (int64_t mb = 0; mb < num_micro; ++mb) {
    fill_micro_batch(data, iteration * cfg.global_batch_size + mb * B, B, tokens.data());
    MicroBatchKey key{cfg.seed, iteration, mb, true};
    r.lm_loss += model.forward_backward(tokens.data(), nullptr, B, T, 1.0f / float(num_micro), key);
  }
  r.lm_loss /= double(num_micro);
  r.grad_norm = clip_grad_norm(model.params(), cfg.clip_grad);
  optimizer.step(lr, weight_decay);
  return r;
}

}  // namespace lattice
