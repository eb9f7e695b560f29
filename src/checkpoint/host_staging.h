// Host access to a buffer of the current device (core/device.h) for checkpoint and
// weight-file I/O: parameters and optimizer state live on the device, files on the host.
// On the CPU the buffer is host memory and is used in place: no copy, no allocation, so
// the CPU path costs what it did. On a device a host copy of the n floats is staged.
#pragma once
#include <cstdint>
#include <vector>

namespace lattice {

class HostStaging {
 public:
  // download: fill the staged copy from `device` (to read it, or to change part of it);
  // else it starts zeroed (every element will be written).
  HostStaging(const float* device, int64_t n, bool download);
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // The n floats on the host: `device` itself on the CPU, else the staged copy.
  float* data() { return host_; }
  const float* data() const { return host_; }
  // Writes the staged copy to `device` (the buffer it was made from or one of the same
  // size); nothing on the CPU, where data() is that buffer.
  void upload(float* device) const;

 private:
  std::vector<float> copy_;
  float* host_ = nullptr;
  int64_t n_ = 0;
};

}  // namespace lattice
