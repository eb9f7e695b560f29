#include "core/storage.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace lattice {

void AlignedFree::operator()(void* p) const { std::free(p); }

Storage::Storage(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  LATTICE_CHECK(p != nullptr) << "out of memory allocating " << bytes << " bytes";
  std::memset(p, 0, rounded);
  ptr_.reset(p);
}

}  // namespace lattice
