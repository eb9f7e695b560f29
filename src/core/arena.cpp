#include "core/arena.h"

#include <algorithm>

namespace lattice {

Tensor Arena::alloc(const Shape& shape, DType dtype, const char* what) {
  size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  size_t rounded = (bytes + 63) / 64 * 64;
  if (counting_) {
    used_ += rounded;
    peak_ = std::max(peak_, used_);
    return Tensor(nullptr, shape, dtype);
  }
  LATTICE_CHECK(used_ + rounded <= storage_.size())
      << "activation arena too small for " << what << " " << shape_str(shape) << ": need "
      << used_ + rounded << " bytes, have " << storage_.size();
  Tensor t(static_cast<char*>(storage_.data()) + used_, shape, dtype);
  used_ += rounded;
  peak_ = std::max(peak_, used_);
  return t;
}

float* Arena::alloc_f32(size_t n, const char* what) {
  return static_cast<float*>(alloc({int64_t(n)}, DType::f32, what).data);
}

}  // namespace lattice
