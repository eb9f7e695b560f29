// Optimizers over a ParamBuffer: Megatron's --optimizer adam (AdamW: decoupled
// weight decay, none on biases and 1-D parameters) and sgd (momentum), plus global
// gradient-norm clipping (--clip-grad).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/storage.h"
#include "optim/param_buffer.h"

namespace lattice {

struct OptimizerConfig {
  std::string optimizer = "adam";  // adam | sgd
  float adam_beta1 = 0.9f;
  float adam_beta2 = 0.999f;
  float adam_eps = 1e-8f;
  float sgd_momentum = 0.9f;
  float clip_grad = 1.0f;          // 0 disables clipping
};

// L2 norm of all gradients (accumulated in double).
double grad_norm(const ParamBuffer& params);

// Scales the gradients so their norm is at most max_norm: coeff = max_norm / (norm + 1e-6),
// applied when < 1 (Megatron's and torch's rule). Returns the norm before clipping.
double clip_grad_norm(ParamBuffer& params, double max_norm);

class Optimizer {
 public:
  Optimizer(ParamBuffer& params, const OptimizerConfig& config);
  // One update with the given learning rate and weight decay (the scheduler's values;
  // parameters without weight decay use 0).
  void step(double lr, double weight_decay);
  int64_t steps() const { return step_; }
  // State tensors for checkpoints: Adam exp_avg / exp_avg_sq, or SGD momentum (second null).
  float* state1() const { return state1_.as<float>(); }
  float* state2() const { return state2_.as<float>(); }
  size_t state_bytes() const { return state1_.size() + state2_.size(); }
  void set_steps(int64_t s) { step_ = s; }

 private:
  ParamBuffer& params_;
  OptimizerConfig cfg_;
  Storage state1_, state2_;
  int64_t step_ = 0;
};

}  // namespace lattice
