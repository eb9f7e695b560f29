// What the mixed-precision GEMM policies keep between GEMMs (model/mixed_precision.cpp,
// model/fp8_current_scaling.cpp): each weight's low-precision copy, made once per update,
// and the last output gradient a weight_grad converted, for the input_grad that follows.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/storage.h"

namespace lattice {

// Per-weight low-precision copies (device memory), re-made from the fp32 weight after
// refresh_weights.
template <class T>
class WeightCache {
 public:
  // The copy of weight `param` (n elements of W), converting when stale.
  template <class Convert>
  const T* get(int param, const float* W, int64_t n, const Convert& convert) {
    if (param < 0) LATTICE_FAIL() << "mixed precision: a linear layer without a parameter index";
    if (size_t(param) >= copies_.size()) {
      copies_.resize(size_t(param) + 1);
      numel_.resize(size_t(param) + 1, -1);
      fresh_.resize(size_t(param) + 1, false);
    }
    DeviceArray<T>& c = copies_[size_t(param)];
    if (!fresh_[size_t(param)] || numel_[size_t(param)] != n) {
      c.resize(size_t(n));
      numel_[size_t(param)] = n;
      convert(c.data(), W, n);
      fresh_[size_t(param)] = true;
    }
    return c.data();
  }
  void invalidate() { std::fill(fresh_.begin(), fresh_.end(), false); }

 private:
  std::vector<DeviceArray<T>> copies_;
  std::vector<int64_t> numel_;
  std::vector<bool> fresh_;
};

// The output gradient dy that weight_grad converted last, for input_grad of the same
// linear layer to reuse (linear_backward calls weight_grad, then input_grad, on one dy):
// the same values, not converted twice. Forgotten once input_grad has used it.
class LastOutputGrad {
 public:
  void remember(int param, const float* dy, int64_t n) { held_ = {param, dy, n}; }
  // Whether the buffer holds this dy's conversion; forgets it either way.
  bool take(int param, const float* dy, int64_t n) {
    const bool same = held_.param == param && held_.dy == dy && held_.n == n;
    held_ = {};
    return same;
  }

 private:
  struct {
    int param = -1;
    const float* dy = nullptr;
    int64_t n = 0;
  } held_;
};

}  // namespace lattice
