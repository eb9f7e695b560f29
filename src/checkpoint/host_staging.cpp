#include "checkpoint/host_staging.h"

#include "core/device.h"
#include "core/error.h"

namespace lattice {

HostStaging::HostStaging(const float* device, int64_t n, bool download) : n_(n) {
  if (current_device() == Device::cpu) {
    host_ = const_cast<float*>(device);  // host memory: used in place
    return;
  }
  copy_.assign(static_cast<size_t>(n), 0.0f);
  host_ = copy_.data();
  if (download) {
    device_synchronize();  // kernels still writing the buffer finish first
    copy_to_host(host_, device, size_t(n) * sizeof(float));
  }
}

void HostStaging::upload(float* device) const {
  if (current_device() == Device::cpu) {
    LATTICE_CHECK(device == host_) << "HostStaging: upload to another buffer than the one staged";
    return;
  }
  copy_to_device(device, host_, size_t(n_) * sizeof(float));
}

}  // namespace lattice
