#include "optim/loss_scaler.h"

#include <algorithm>

#include "core/error.h"

namespace lattice {

LossScaler::LossScaler(const LossScalerConfig& config) : cfg_(config) {
  const char* scale_flag = cfg_.dynamic ? "--initial-loss-scale" : "--loss-scale";
  if (!(cfg_.initial_scale > 0)) LATTICE_FAIL() << scale_flag << " must be positive, got " << cfg_.initial_scale;
  if (cfg_.dynamic) {
    if (!(cfg_.min_scale > 0)) LATTICE_FAIL() << "--min-loss-scale must be positive, got " << cfg_.min_scale;
    if (cfg_.min_scale > cfg_.initial_scale)
      LATTICE_FAIL() << "--min-loss-scale " << cfg_.min_scale << " exceeds --initial-loss-scale "
                     << cfg_.initial_scale;
    if (cfg_.window < 1) LATTICE_FAIL() << "--loss-scale-window must be >= 1, got " << cfg_.window;
    if (cfg_.hysteresis < 1) LATTICE_FAIL() << "--hysteresis must be >= 1, got " << cfg_.hysteresis;
  }
  scale_ = cfg_.initial_scale;
  hysteresis_tracker_ = cfg_.hysteresis;
}

void LossScaler::update(bool found_inf) {
  if (!cfg_.dynamic) return;
  if (found_inf) {
    growth_tracker_ = 0;
    hysteresis_tracker_ -= 1;
    if (hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * cfg_.backoff_factor, cfg_.min_scale);
    return;
  }
  growth_tracker_ += 1;
  if (growth_tracker_ == cfg_.window) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = cfg_.hysteresis;
    scale_ *= cfg_.growth_factor;
  }
}

void LossScaler::load_state(const LossScalerState& s) {
  if (!(s.scale > 0)) LATTICE_FAIL() << "loss scaler state: scale must be positive, got " << s.scale;
  if (s.growth_tracker < 0) LATTICE_FAIL() << "loss scaler state: negative growth tracker";
  scale_ = s.scale;
  growth_tracker_ = s.growth_tracker;
  hysteresis_tracker_ = s.hysteresis_tracker;
}

}  // namespace lattice
