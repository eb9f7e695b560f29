// Owning buffers of the current device (core/device.h): zeroed, 64-byte aligned. They
// hold what kernels touch (parameters, gradients, optimizer state, the activation
// arena, kernel scratch); host code moves data in and out with the copy functions. On
// the CPU they are plain host memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/device.h"

namespace lattice {

// Owns `bytes` of device memory, zeroed.
class Storage {
 public:
  Storage() = default;
  explicit Storage(size_t bytes);
  void* data() const { return ptr_.get(); }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_.get()); }

 private:
  DevicePtr ptr_;
  size_t bytes_ = 0;
};

// Kernel scratch of n elements of T in device memory that only grows (a new size
// reallocates without keeping the contents; the same or a smaller one is free).
template <typename T>
class DeviceArray {
 public:
  T* resize(size_t n) {
    if (n > n_) {
      storage_ = Storage(n * sizeof(T));
      n_ = n;
    }
    return data();
  }
  T* data() const { return storage_.as<T>(); }
  size_t size() const { return n_; }

 private:
  Storage storage_;
  size_t n_ = 0;
};

// A device array that host code fills (or reads) through a host copy. On the CPU the
// host copy IS the device memory (upload and download do nothing); on a device, host()
// is a staging vector and upload()/download() one copy each.
template <typename T>
class StagedArray {
 public:
  void resize(size_t n) {
    device_.resize(n);
    if (current_device() != Device::cpu && host_.size() < n) host_.resize(n);
  }
  T* host() { return current_device() == Device::cpu ? device_.data() : host_.data(); }
  const T* host() const { return current_device() == Device::cpu ? device_.data() : host_.data(); }
  T* device() const { return device_.data(); }
  void upload(size_t n) {
    if (current_device() != Device::cpu) copy_to_device(device_.data(), host_.data(), n * sizeof(T));
  }
  void download(size_t n) {
    if (current_device() != Device::cpu) copy_to_host(host_.data(), device_.data(), n * sizeof(T));
  }

 private:
  DeviceArray<T> device_;
  std::vector<T> host_;
};

}  // namespace lattice
