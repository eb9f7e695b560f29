#include "kernels/elementwise.h"

#include "core/device.h"
#include "kernels/cuda/ops.h"

#include "kernels/cast_math.h"

#include <algorithm>

#include "kernels/cpu/row_sums.h"

namespace lattice {

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

// Column chunks, each column summing its rows in index order (cpu::column_sums): the
// result does not depend on the thread count.
void bias_backward(float* dbias, const float* dout, int64_t N, int64_t C) {
  LATTICE_KERNEL_ENTRY(cuda::bias_backward(dbias, dout, N, C));
  cpu::column_sums(dbias, nullptr, N, C, [&](int64_t n, int64_t c0, int64_t, float*) { return dout + n * C + c0; });
}

void bias_backward_cast_bf16(float* dbias, uint16_t* dout_bf16, const float* dout, int64_t N, int64_t C) {
  LATTICE_KERNEL_ENTRY(cuda::bias_backward_cast_bf16(dbias, dout_bf16, dout, N, C));
  cpu::column_sums(dbias, dout_bf16, N, C, [&](int64_t n, int64_t c0, int64_t, float*) { return dout + n * C + c0; });
}

void scale_inplace(float* x, float s, int64_t n) {
  LATTICE_KERNEL_ENTRY(cuda::scale_inplace(x, s, n));
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void copy_head_blocks(float* dst, int64_t dst_row, int64_t dst_head, const float* src, int64_t src_row,
                      int64_t src_head, int64_t N, int64_t H, int64_t len, float scale) {
  LATTICE_KERNEL_ENTRY(cuda::copy_head_blocks(dst, dst_row, dst_head, src, src_row, src_head, N, H, len, scale));
  const bool sum = dst_head == 0;
#pragma omp parallel for schedule(static) if (N * H * len > 32768)
  for (int64_t n = 0; n < N; ++n) {
    if (sum) {
      float* __restrict o = dst + n * dst_row;
      for (int64_t j = 0; j < len; ++j) o[j] = 0.0f;
      for (int64_t h = 0; h < H && src; ++h) {
        const float* __restrict x = src + n * src_row + h * src_head;
        for (int64_t j = 0; j < len; ++j) o[j] += x[j];
      }
      for (int64_t j = 0; j < len; ++j) o[j] *= scale;
      continue;
    }
    for (int64_t h = 0; h < H; ++h) {
      float* __restrict o = dst + n * dst_row + h * dst_head;
      const float* __restrict x = src ? src + n * src_row + h * src_head : nullptr;
      for (int64_t j = 0; j < len; ++j) o[j] = x ? scale * x[j] : 0.0f;
    }
  }
}

}  // namespace lattice
