// Megatron's RotaryEmbedding: the cos/sin table of the rotary position embedding
// (kernels/rope.h), computed once per model on the host and kept in device memory.
//
// For R rotated dims (kv_channels x --rotary-percent), pair d < R/2 and position t, in fp32
// as Megatron computes them:
//   inv_freq[d] = 1 / base^(2d / R)            (--rotary-base)
//   angle(t, d) = (t / factor) * inv_freq[d]   (factor: --rotary-seq-len-interpolation-factor, 1 if unset)
// and the table holds cos and sin of that fp32 angle, rounded once from double precision.
//
// With --use-rope-scaling (Llama 3.1's scaling, Megatron's and HuggingFace's "llama3" rope_scaling)
// each frequency f = inv_freq[d] is first rescaled by its wavelength w = 2 pi / f, in fp32, with
// factor, low, high and the original context L (--rope-scaling-factor 8, -low-freq-factor 1,
// -high-freq-factor 4, -original-max-position-embeddings 8192 by default):
//   w < L / high:  f              (short wavelengths kept)
//   w > L / low:   f / factor     (long wavelengths stretched)
//   otherwise:     (1 - s) f / factor + s f,  s = (L / w - low) / (high - low)
#pragma once
#include <cstdint>

#include "core/storage.h"
#include "kernels/rope.h"
#include "model/transformer_config.h"

namespace lattice {

class RotaryEmbedding {
 public:
  // positions: table rows (the longest sequence or generation context it serves).
  RotaryEmbedding(const TransformerConfig& config, int64_t positions);
  const RopeTable& table() const { return table_; }

 private:
  DeviceArray<float> cos_, sin_;
  RopeTable table_;
};

// The number of rotated dims of a head: kv_channels x rotary_percent, rounded down (Megatron's
// int(kv_channels * rotary_percent)).
int64_t rotary_dims(const TransformerConfig& config);

// Frequency f after Llama 3.1's scaling with config's rope_scaling_* values (above), in fp32.
float llama3_scaled_frequency(float f, const TransformerConfig& config);

}  // namespace lattice
