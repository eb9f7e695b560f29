// Tensor: a non-owning view (data pointer, shape, dtype). Storage lives in flat
// parameter buffers or the activation arena; a Tensor never frees anything.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace lattice {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

struct Tensor {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::f32;

  Tensor() = default;
  Tensor(void* d, Shape s, DType t = DType::f32) : data(d), shape(std::move(s)), dtype(t) {}

  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape.at(i < 0 ? shape.size() + i : i); }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  float* f32() const {
    LATTICE_CHECK(dtype == DType::f32) << "tensor is " << dtype_name(dtype) << ", not f32";
    return static_cast<float*>(data);
  }
};

}  // namespace lattice
