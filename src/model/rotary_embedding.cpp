#include "model/rotary_embedding.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace lattice {

float llama3_scaled_frequency(float f, const TransformerConfig& c) {
  const float factor = c.rope_scaling_factor, low = c.rope_scaling_low_freq_factor;
  const float high = c.rope_scaling_high_freq_factor;
  const float old_context = float(c.rope_scaling_original_max_position_embeddings);
  const float wavelen = 2.0f * float(M_PI) / f;
  if (wavelen < old_context / high) return f;
  if (wavelen > old_context / low) return f / factor;
  const float smooth = (old_context / wavelen - low) / (high - low);
  return (1.0f - smooth) * f / factor + smooth * f;
}

double yarn_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

double yarn_attention_factor(const TransformerConfig& c) {
  return yarn_mscale(c.yarn_rotary_scaling_factor, c.yarn_mscale) /
         yarn_mscale(c.yarn_rotary_scaling_factor, c.yarn_mscale_all_dim);
}

std::vector<float> yarn_frequencies(const TransformerConfig& c, int64_t R) {
  const int64_t half = R / 2;
  const double base = c.rotary_base, L = double(c.yarn_original_max_position_embeddings);
  // The dim (of R) whose pair turns `rotations` times over the original context.
  auto correction_dim = [&](double rotations) {
    return double(R) * std::log(L / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
  };
  double low = correction_dim(c.yarn_beta_fast), high = correction_dim(c.yarn_beta_slow);
  if (c.yarn_correction_range_round_to_int) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(R - 1));
  if (low == high) high += 0.001;  // no singularity
  const float lo = float(low), span = float(high - low), factor = c.yarn_rotary_scaling_factor;
  std::vector<float> f(static_cast<size_t>(half));
  for (int64_t d = 0; d < half; ++d) {
    const float pos_freq = std::pow(c.rotary_base, float(2 * d) / float(R));
    const float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / (factor * pos_freq);
    const float ramp = std::clamp((float(d) - lo) / span, 0.0f, 1.0f);
    const float keep = 1.0f - ramp;  // the extrapolated frequency's share
    f[size_t(d)] = interpolation * (1.0f - keep) + extrapolation * keep;
  }
  return f;
}

int64_t rotary_dims(const TransformerConfig& c) {
  if (c.multi_latent_attention) return c.qk_pos_emb_head_dim;
  return int64_t(double(c.kv_channels) * c.rotary_percent);
}

RotaryEmbedding::RotaryEmbedding(const TransformerConfig& c, int64_t positions, bool long_factors) {
  const int64_t R = rotary_dims(c), half = R / 2;
  LATTICE_CHECK(R >= 2 && R % 2 == 0 && R <= c.kv_channels && positions >= 1)
      << "rotary embedding of " << R << " dims of " << c.kv_channels << " for " << positions << " positions";
  const float factor = c.rotary_seq_len_interpolation_factor > 0 ? c.rotary_seq_len_interpolation_factor : 1.0f;
  std::vector<float> inv_freq(static_cast<size_t>(half)), cos_h(static_cast<size_t>(positions * half)), sin_h(cos_h.size());
  for (int64_t d = 0; d < half; ++d)
    inv_freq[size_t(d)] = 1.0f / std::pow(c.rotary_base, float(2 * d) / float(R));
  if (c.use_rope_scaling)
    for (float& f : inv_freq) f = llama3_scaled_frequency(f, c);
  if (c.yarn()) inv_freq = yarn_frequencies(c, R);
  if (c.longrope()) {  // as transformers' _compute_longrope_parameters: 1 / (ext[d] * base^(2d / R)) in fp32
    const std::vector<float>& ext = long_factors ? c.longrope_long_factor : c.longrope_short_factor;
    for (int64_t d = 0; d < half; ++d)
      inv_freq[size_t(d)] = 1.0f / (ext[size_t(d)] * std::pow(c.rotary_base, float(2 * d) / float(R)));
  }
  const float scale = c.yarn() ? float(yarn_attention_factor(c)) : c.longrope() ? c.longrope_attention_factor : 1.0f;
  for (int64_t t = 0; t < positions; ++t) {
    const float pos = float(t) / factor;
    for (int64_t d = 0; d < half; ++d) {
      const float angle = pos * inv_freq[size_t(d)];
      cos_h[size_t(t * half + d)] = float(std::cos(double(angle))) * scale;
      sin_h[size_t(t * half + d)] = float(std::sin(double(angle))) * scale;
    }
  }
  copy_to_device(cos_.resize(cos_h.size()), cos_h.data(), cos_h.size() * sizeof(float));
  copy_to_device(sin_.resize(sin_h.size()), sin_h.data(), sin_h.size() * sizeof(float));
  // Megatron's MLA turns pairs (2d, 2d + 1): it de-interleaves q_pe and k_pe, then rotates halves.
  table_ = RopeTable{cos_.data(), sin_.data(), positions, half, c.rotary_interleaved || c.multi_latent_attention};
}

}  // namespace lattice
