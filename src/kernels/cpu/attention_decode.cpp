// KV-cache decoding attention on the CPU (kernels/attention.h).
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/attention.h"

namespace lattice {

void kv_cache_append(float* k_cache, float* v_cache, const float* qkv, int64_t n, int64_t past,
                     const QkvLayout& L, int64_t Tmax) {
  LATTICE_CHECK(past + n <= Tmax) << "kv_cache_append: " << past << " + " << n << " rows exceed " << Tmax;
  LATTICE_KERNEL_ENTRY(cuda::kv_cache_append(k_cache, v_cache, qkv, n, past, L, Tmax));
  const int64_t D = L.D;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < L.G; ++g) {
      const float* row = qkv + r * L.width();
      const int64_t at = (g * Tmax + past + r) * D;
      std::memcpy(k_cache + at, row + L.kv_slot(g, 1) * D, size_t(D) * sizeof(float));
      std::memcpy(v_cache + at, row + L.kv_slot(g, 2) * D, size_t(D) * sizeof(float));
    }
}

void cached_attention_forward(float* out, const float* qkv, const float* k_cache, const float* v_cache, int64_t n,
                              int64_t past, const QkvLayout& L, int64_t Tmax, int64_t window,
                              const float* softmax_offset) {
  LATTICE_KERNEL_ENTRY(
      cuda::cached_attention_forward(out, qkv, k_cache, v_cache, n, past, L, Tmax, window, softmax_offset));
  const int64_t H = L.H, D = L.D, R = L.R();
  const float scale = 1.0f / std::sqrt(float(D));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < H; ++h) {
      static thread_local std::vector<float> s;  // scores of this (query, head)
      const int64_t last = past + r;             // causal: keys first..last
      const int64_t first = window < 0 || last <= window ? 0 : last - window;
      if (s.size() < size_t(last + 1)) s.resize(size_t(Tmax));
      const float* q = qkv + r * L.width() + L.slot(h, 0) * D;
      const float* k = k_cache + (h / R) * Tmax * D;  // [Tmax, D], the group's
      const float* v = v_cache + (h / R) * Tmax * D;
      float mx = softmax_offset ? softmax_offset[h] : -INFINITY;  // the sink's logit, when the head has one
      for (int64_t t = first; t <= last; ++t) {
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < D; ++d) dot += q[d] * k[t * D + d];
        s[size_t(t)] = dot * scale;
        mx = std::max(mx, s[size_t(t)]);
      }
      float sum = softmax_offset ? std::exp(softmax_offset[h] - mx) : 0.0f;
      for (int64_t t = first; t <= last; ++t) {
        s[size_t(t)] = std::exp(s[size_t(t)] - mx);
        sum += s[size_t(t)];
      }
      float* o = out + (r * H + h) * D;
      std::fill(o, o + D, 0.0f);
      for (int64_t t = first; t <= last; ++t) {
        const float w = s[size_t(t)];
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) o[d] += w * v[t * D + d];
      }
      const float inv = 1.0f / sum;
      for (int64_t d = 0; d < D; ++d) o[d] *= inv;
    }
}

}  // namespace lattice
