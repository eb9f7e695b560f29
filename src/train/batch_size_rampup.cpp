#include "train/batch_size_rampup.h"

#include <sstream>

#include "core/error.h"

namespace lattice {

BatchSizeRampup::BatchSizeRampup(int64_t start, int64_t increment, int64_t samples, int64_t global)
    : start_(start), increment_(increment), samples_(samples), global_(global) {
  if (start <= 0 || increment <= 0 || samples < 0)
    LATTICE_FAIL() << "--rampup-batch-size " << start << " " << increment << " " << samples
                   << ": the start and the increment must be positive and the samples >= 0";
  if (start > global)
    LATTICE_FAIL() << "--rampup-batch-size: the start " << start << " exceeds --global-batch-size " << global;
  if ((global - start) % increment != 0)
    LATTICE_FAIL() << "--rampup-batch-size: the increment " << increment << " does not divide --global-batch-size "
                   << global << " - start " << start << " = " << global - start;
  const int64_t steps = (global - start) / increment;
  // No step (start == global): every batch is the global one.
  samples_per_increment_ = steps > 0 ? double(samples) / double(steps) : 0.0;
}

int64_t BatchSizeRampup::batch_size(int64_t consumed) const {
  if (consumed > samples_ || samples_per_increment_ <= 0.0) return global_;
  const int64_t steps = int64_t(double(consumed) / samples_per_increment_);
  return start_ + steps * increment_;
}

int64_t BatchSizeRampup::train_iters(int64_t train_samples) const {
  int64_t iterations = 0, consumed = 0;
  while (consumed <= samples_ && consumed <= train_samples) {
    consumed += batch_size(consumed);
    ++iterations;
  }
  if (train_samples > consumed) iterations += (train_samples - consumed) / global_;
  return iterations;
}

int64_t BatchSizeRampup::consumed_after(int64_t iterations) const {
  int64_t consumed = 0;
  for (int64_t i = 0; i < iterations; ++i) {
    if (consumed > samples_) return consumed + (iterations - i) * global_;  // the rest at the global size
    consumed += batch_size(consumed);
  }
  return consumed;
}

std::vector<int64_t> BatchSizeRampup::batch_sizes() const {
  std::vector<int64_t> sizes;
  for (int64_t b = start_; b <= global_; b += increment_) sizes.push_back(b);
  return sizes;
}

std::string BatchSizeRampup::describe() const {
  std::ostringstream os;
  os << "global batch size ramps from " << start_ << " to " << global_ << " in steps of " << increment_ << " over "
     << samples_ << " samples";
  return os.str();
}

}  // namespace lattice
