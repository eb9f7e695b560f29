#include "optim/optimizer.h"

#include <cmath>

#include "kernels/elementwise.h"
#include "kernels/optimizer.h"

namespace lattice {

double grad_norm(const ParamBuffer& params) {
  return std::sqrt(sum_of_squares(params.grads(), params.numel()));
}

double clip_grad_norm(ParamBuffer& params, double max_norm) {
  double norm = grad_norm(params);
  if (max_norm > 0) {
    double coeff = max_norm / (norm + 1e-6);
    if (coeff < 1.0) scale_inplace(params.grads(), float(coeff), params.numel());
  }
  return norm;
}

Optimizer::Optimizer(ParamBuffer& params, const OptimizerConfig& config)
    : params_(params), cfg_(config) {
  if (cfg_.optimizer != "adam" && cfg_.optimizer != "sgd")
    LATTICE_FAIL() << "--optimizer must be adam or sgd, got " << cfg_.optimizer;
  const size_t bytes = size_t(params.numel()) * sizeof(float);
  state1_ = Storage(bytes);
  if (cfg_.optimizer == "adam") state2_ = Storage(bytes);
}

void Optimizer::step(double lr, double weight_decay) {
  ++step_;
  for (size_t k = 0; k < params_.infos().size(); ++k) {
    const ParamInfo& p = params_.infos()[k];
    const float wd = p.weight_decay ? float(weight_decay) : 0.0f;
    float* w = params_.param(int(k));
    const float* g = params_.grad(int(k));
    if (cfg_.optimizer == "adam") {
      adamw_update(w, g, state1() + p.offset, state2() + p.offset, p.numel, float(lr),
                   cfg_.adam_beta1, cfg_.adam_beta2, cfg_.adam_eps, wd, step_);
    } else {
      sgd_update(w, g, state1() + p.offset, p.numel, float(lr), cfg_.sgd_momentum, wd, step_ == 1);
    }
  }
}

}  // namespace lattice
