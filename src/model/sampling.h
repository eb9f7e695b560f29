// Next-token sampling from logits: temperature, top-k, top-p (nucleus); temperature 0
// is greedy. Draws come from a counter-based stream, so a seed gives the same text.
#pragma once
#include <cstdint>

#include "core/philox.h"

namespace lattice {

struct SamplingConfig {
  float temperature = 1.0f;
  int64_t top_k = 0;    // 0: off
  float top_p = 1.0f;   // 1: off
};

// logits: [V] (the real vocabulary only). `draw` is the draw index in the stream.
int32_t sample_token(const float* logits, int64_t V, const SamplingConfig& cfg,
                     const PhiloxStream& stream, uint64_t draw);

}  // namespace lattice
