#include "core/storage.h"

namespace lattice {

Storage::Storage(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  ptr_ = make_device_buffer(bytes);  // zeroed, 64-byte aligned
}

}  // namespace lattice
