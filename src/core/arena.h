// Activation arena: one block sized once for the run's shapes; allocations are
// bump-pointer and the whole arena is reset every step. No allocation in the hot loop.
#pragma once
#include <cstddef>

#include "core/storage.h"
#include "core/tensor.h"

namespace lattice {

class Arena {
 public:
  Arena() = default;
  explicit Arena(size_t bytes) : storage_(bytes) {}
  // An arena that only counts: alloc() returns views with null data. Running the
  // allocation sequence of a step through it gives the exact size to allocate.
  static Arena counting() {
    Arena a;
    a.counting_ = true;
    return a;
  }
  // Returns a view of `shape` elements of `dtype`, 64-byte aligned. Fails if the
  // arena was sized too small (a sizing bug, not a user error).
  Tensor alloc(const Shape& shape, DType dtype = DType::f32, const char* what = "activation");
  float* alloc_f32(size_t n, const char* what = "activation");
  void reset() { used_ = 0; }
  size_t used() const { return used_; }
  size_t capacity() const { return storage_.size(); }
  size_t peak() const { return peak_; }
  // Marks let a caller free everything allocated after a point (e.g. per layer scratch).
  size_t mark() const { return used_; }
  void release_to(size_t mark) { used_ = mark; }

 private:
  Storage storage_;
  size_t used_ = 0;
  size_t peak_ = 0;
  bool counting_ = false;
};

}  // namespace lattice
