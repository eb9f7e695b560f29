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
//
// With --position-embedding-type yarn (YaRN, as HuggingFace's _compute_yarn_parameters and
// Megatron-Core's YarnRotaryEmbedding): for factor s, the original context L, beta_fast and
// beta_slow, the dims c(b) = R ln(L / (2 pi b)) / (2 ln base) where a pair turns b times over L
// (floored and ceiled with --yarn-correction-range-round-to-int; clamped to [0, R - 1]) bound a ramp
// r(d) = clamp((d - c(beta_fast)) / (c(beta_slow) - c(beta_fast)), 0, 1) over the pairs, and
//   f[d] = inv_freq[d] / s r(d) + inv_freq[d] (1 - r(d))      (fast pairs kept, slow ones interpolated)
// in fp32; the table's cos and sin are then times the attention factor
// m(s, mscale) / m(s, mscale_all_dim), m(s, x) = 0.1 x ln s + 1 (1 for s <= 1), so every q . k
// score is m^2 times the plain rotation's.
//
// With LongRoPE (--longrope-short-factor, HuggingFace's "longrope"), f[d] = 1 / (e[d] base^(2d / R)) in
// fp32, e the short factors or, for the table of a sequence longer than the original context, the long
// ones, and cos and sin times --longrope-attention-factor. A model keeps both tables and rotates a
// sequence by the one its length picks, as transformers does for each forward pass (a KV-cache step: the
// context so far, so keys cached before the context passed the original length keep the short rotation).
#pragma once
#include <cstdint>
#include <vector>

#include "core/storage.h"
#include "kernels/rope.h"
#include "model/transformer_config.h"

namespace lattice {

class RotaryEmbedding {
 public:
  // positions: table rows (the longest sequence or generation context it serves); long_factors: LongRoPE's
  // long factors (else its short ones).
  RotaryEmbedding(const TransformerConfig& config, int64_t positions, bool long_factors = false);
  const RopeTable& table() const { return table_; }

 private:
  DeviceArray<float> cos_, sin_;
  RopeTable table_;
};

// The number of rotated dims of a head: kv_channels x rotary_percent, rounded down (Megatron's
// int(kv_channels * rotary_percent)); --qk-pos-emb-head-dim with --multi-latent-attention.
int64_t rotary_dims(const TransformerConfig& config);

// Frequency f after Llama 3.1's scaling with config's rope_scaling_* values (above), in fp32.
float llama3_scaled_frequency(float f, const TransformerConfig& config);

// YaRN (above): the R / 2 frequencies of R rotated dims, and the attention factor m(s, mscale) /
// m(s, mscale_all_dim) with m = yarn_mscale.
std::vector<float> yarn_frequencies(const TransformerConfig& config, int64_t R);
double yarn_mscale(double factor, double mscale);
double yarn_attention_factor(const TransformerConfig& config);

}  // namespace lattice
