// Aligned, zero-initialised, owning storage (64-byte alignment for AVX-512).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace lattice {

struct AlignedFree {
  void operator()(void* p) const;
};

// Owns `bytes` of 64-byte aligned memory, zeroed.
class Storage {
 public:
  Storage() = default;
  explicit Storage(size_t bytes);
  void* data() const { return ptr_.get(); }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_.get()); }

 private:
  std::unique_ptr<void, AlignedFree> ptr_;
  size_t bytes_ = 0;
};

}  // namespace lattice
