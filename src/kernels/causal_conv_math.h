// The causal depthwise convolution over time that both linear mixers run on their input projection's rows
// (kernels/gated_delta_net.h's GDN layer, kernels/mamba.h's Mamba layer): K taps per channel, the taps of row n
// reading rows n - K + 1 .. n of its sequence and document. Shared by the devices (LATTICE_HD) and the mixers;
// `Shape` is the mixer's (GdnShape, MambaShape): its T, K and same_document(n, m).
#pragma once
#include <cstdint>

#include "core/hd.h"

namespace lattice::math {

// The first tap the convolution takes at row n: none before the start of the sequence or of the row's document.
template <class Shape>
LATTICE_HD inline int64_t causal_conv_first_tap(int64_t n, const Shape& s) {
  int64_t j = s.K - 1 - n % s.T > 0 ? s.K - 1 - n % s.T : 0;
  while (j < s.K - 1 && !s.same_document(n, n - s.K + 1 + j)) ++j;
  return j;
}

}  // namespace lattice::math
