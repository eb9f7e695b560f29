// numpy.random.RandomState(seed) as Megatron's GPTDataset uses it: the MT19937 stream
// (seeded exactly like std::mt19937(seed)) and the legacy bounded-integer shuffle.
// Reproducing these two bit for bit is what makes lattice's sample order Megatron's.
#pragma once
#include <cstdint>
#include <random>
#include <utility>

namespace lattice {

class NumpyRandomState {
 public:
  // numpy accepts integer seeds in [0, 2^32); the caller validates the range.
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}

  uint32_t next_uint32() { return uint32_t(mt_()); }
  // numpy's mt19937_next64: the first 32-bit draw is the high half.
  uint64_t next_uint64() {
    const uint64_t hi = next_uint32();
    return hi << 32 | next_uint32();
  }

  // numpy's random_interval: a uniform integer in [0, max] by rejection under the
  // smallest all-ones mask >= max (32-bit draws while max fits in 32 bits).
  uint64_t random_interval(uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;
    for (int s = 1; s <= 32; s *= 2) mask |= mask >> s;
    uint64_t v;
    if (max <= 0xffffffffULL) {
      do v = next_uint32() & mask; while (v > max);
    } else {
      do v = next_uint64() & mask; while (v > max);
    }
    return v;
  }

  // RandomState.shuffle on a 1-D array: for i = n-1 down to 1 swap a[i] with
  // a[random_interval(i)]. O(n); the draws depend on n only, not on the element type.
  template <typename T>
  void shuffle(T* a, int64_t n) {
    for (int64_t i = n - 1; i > 0; --i) std::swap(a[i], a[random_interval(uint64_t(i))]);
  }

 private:
  std::mt19937 mt_;
};

}  // namespace lattice
