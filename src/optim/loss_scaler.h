// Loss scaling for fp16 training, as Megatron's DynamicGradScaler / ConstantGradScaler:
// the loss is multiplied by scale() before backward, gradients are unscaled before the
// update, and a step whose gradients hold an inf/nan (found on any rank) is skipped.
//   dynamic: initial 2**32, min 1, window (growth interval) 1000, hysteresis 2,
//            growth x2, backoff x0.5
// On an inf/nan step: growth tracker = 0, hysteresis tracker -= 1, and the scale backs
// off (not below min) only when the hysteresis tracker is <= 0. After `window`
// consecutive clean steps the scale grows and the hysteresis tracker is reset.
#pragma once
#include <cstdint>

namespace lattice {

struct LossScalerConfig {
  bool dynamic = true;
  double initial_scale = 4294967296.0;  // --initial-loss-scale (2**32); --loss-scale when constant
  double min_scale = 1.0;               // --min-loss-scale
  int64_t window = 1000;                // --loss-scale-window
  int64_t hysteresis = 2;               // --hysteresis
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
};

struct LossScalerState {
  double scale;
  int64_t growth_tracker, hysteresis_tracker;
};

class LossScaler {
 public:
  // Errors name the flag for invalid settings (scale <= 0, min > initial, window < 1, ...).
  explicit LossScaler(const LossScalerConfig& config);
  double scale() const { return scale_; }
  bool dynamic() const { return cfg_.dynamic; }
  // After each step's inf/nan check (already reduced over every rank).
  void update(bool found_inf);
  LossScalerState state() const { return {scale_, growth_tracker_, hysteresis_tracker_}; }
  void load_state(const LossScalerState& s);

 private:
  LossScalerConfig cfg_;
  double scale_;
  int64_t growth_tracker_ = 0, hysteresis_tracker_;
};

}  // namespace lattice
