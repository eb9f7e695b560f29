#include "kernels/elementwise.h"

#include "core/device.h"
#include "kernels/cuda/ops.h"

#include "kernels/cast_math.h"

#include <algorithm>

namespace lattice {

namespace {
// Columns per task in the column-parallel reductions: a multiple of the vector width,
// large enough to amortise the task, small enough to spread C = 768 over the cores.
constexpr int64_t kColumnChunk = 64;
}  // namespace

void add_forward(float* out, const float* a, const float* b, int64_t n) {
  LATTICE_KERNEL_ENTRY(cuda::add_forward(out, a, b, n));
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void accumulate(float* y, const float* x, int64_t n) {
  LATTICE_KERNEL_ENTRY(cuda::accumulate(y, x, n));
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void bias_add(float* out, const float* bias, int64_t N, int64_t C, Rounding round_out) {
  LATTICE_KERNEL_ENTRY(cuda::bias_add(out, bias, N, C, round_out));
  math::dispatch_rounding(round_out, [&](auto r) {
#pragma omp parallel for schedule(static) if (N * C > 32768)
    for (int64_t n = 0; n < N; ++n) {
      float* __restrict o = out + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = math::round_as<r.value>(o[c]) + bias[c];
    }
  });
}

// Parallel over column chunks; each column sums its rows in index order, so the
// result does not depend on the thread count.
namespace {

// dbias[c] += sum_n dout[n, c], each column summed over n in order (any column blocking
// gives the same bits); with dout16, dout's bf16 cast stored on the way.
void column_sums_of_rows(float* dbias, uint16_t* dout16, const float* dout, int64_t N, int64_t C) {
  const int64_t chunks = (C + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for schedule(static) if (N * C > 32768)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t c0 = k * kColumnChunk, c1 = std::min(C, c0 + kColumnChunk);
    float acc[kColumnChunk] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* __restrict d = dout + n * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += d[c];
      if (dout16) {
        uint16_t* __restrict o = dout16 + n * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) o[c] = math::fp32_to_bf16(d[c]);
      }
    }
    for (int64_t c = c0; c < c1; ++c) dbias[c] += acc[c - c0];
  }
}

}  // namespace

void bias_backward(float* dbias, const float* dout, int64_t N, int64_t C) {
  LATTICE_KERNEL_ENTRY(cuda::bias_backward(dbias, dout, N, C));
  column_sums_of_rows(dbias, nullptr, dout, N, C);
}

void bias_backward_cast_bf16(float* dbias, uint16_t* dout_bf16, const float* dout, int64_t N, int64_t C) {
  LATTICE_KERNEL_ENTRY(cuda::bias_backward_cast_bf16(dbias, dout_bf16, dout, N, C));
  column_sums_of_rows(dbias, dout_bf16, dout, N, C);
}

void scale_inplace(float* x, float s, int64_t n) {
  LATTICE_KERNEL_ENTRY(cuda::scale_inplace(x, s, n));
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace lattice
