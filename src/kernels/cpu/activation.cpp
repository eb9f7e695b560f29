#include "kernels/activation.h"

#include <algorithm>

#include "core/device.h"
#include "kernels/cuda/ops.h"

#include "kernels/activation_math.h"
#include "kernels/cast_math.h"
#include "kernels/cpu/element_chunks.h"
#include "kernels/cpu/row_sums.h"

namespace lattice {

namespace {
constexpr int64_t kParallelMin = 32768;

// dx[j] = gelu'(x[j]) * d[j] over one chunk (d already rounded; dx may alias what was read
// into d).
inline void gelu_backward_chunk(float* dx, const float* x, const float* d, int64_t len, GeluKind kind) {
  math::dispatch_activation(kind, [&](auto k) {
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) dx[j] = math::activation_backward<k.value>(x[j], d[j]);
  });
}
}  // namespace

// The element math lives in kernels/activation_math.h, shared with the CUDA kernels.
void gelu_forward(float* out, const float* x, int64_t n, GeluKind kind) {
  LATTICE_KERNEL_ENTRY(cuda::gelu_forward(out, x, n, kind));
  math::dispatch_activation(kind, [&](auto k) {
    cpu::for_element_chunks(n, kParallelMin, [&](int64_t i0, int64_t len) {
      float* o = out + i0;
      const float* v = x + i0;
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) o[j] = math::activation<k.value>(v[j]);
    });
  });
}

void gelu_backward(float* dx, const float* x, const float* dout, int64_t n, GeluKind kind, Rounding round_dout) {
  LATTICE_KERNEL_ENTRY(cuda::gelu_backward(dx, x, dout, n, kind, round_dout));
  if (round_dout == Rounding::none) {
    cpu::for_element_chunks(n, kParallelMin, [&](int64_t i0, int64_t len) {
      gelu_backward_chunk(dx + i0, x + i0, dout + i0, len, kind);
    });
    return;
  }
  // Each chunk of dout rounded into an L1 buffer first (a loop of its own, so that both loops
  // vectorize), then the same element math.
  math::dispatch_rounding(round_dout, [&](auto r) {
    cpu::for_element_chunks(n, kParallelMin, [&](int64_t i0, int64_t len) {
      alignas(64) float d[cpu::kElementChunk];
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) d[j] = math::round_as<r.value>(dout[i0 + j]);
      gelu_backward_chunk(dx + i0, x + i0, d, len, kind);  // dx may alias dout: its chunk is in d
    });
  });
}

void bias_gelu_forward(float* pre, float* out, const float* y, const float* bias, int64_t N, int64_t C,
                       GeluKind kind, Rounding round_y) {
  LATTICE_KERNEL_ENTRY(cuda::bias_gelu_forward(pre, out, y, bias, N, C, kind, round_y));
  math::dispatch_rounding(round_y, [&](auto r) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
    for (int64_t row = 0; row < N; ++row) {
      const float* ys = y + row * C;
      float* ps = pre + row * C;  // may alias ys: element c is read before it is written
      float* __restrict os = out + row * C;
      if (bias) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) ps[c] = math::round_as<r.value>(ys[c]) + bias[c];
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) ps[c] = math::round_as<r.value>(ys[c]);
      }
      math::dispatch_activation(kind, [&](auto k) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) os[c] = math::activation<k.value>(ps[c]);
      });
    }
  });
}

namespace {
// f(row, c0, len, v) for every row and chunk of columns of a [N, C] bf16 GEMM result y,
// v = y[row, c0..c0+len) + bias[c0..) in fp32 (as bias_gelu_forward computes the
// pre-activation), in an L1 buffer.
constexpr int64_t kColumnChunk = 2048;

template <class F>
void for_packed_pre_activation(const uint16_t* y, const float* bias, int64_t N, int64_t C, const F& f) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t row = 0; row < N; ++row)
    for (int64_t c0 = 0; c0 < C; c0 += kColumnChunk) {
      const int64_t len = std::min(kColumnChunk, C - c0);
      alignas(64) float v[kColumnChunk];
      cpu::widen_with_bias(v, y + row * C + c0, bias ? bias + c0 : nullptr, len);
      f(row * C + c0, len, v);
    }
}
}  // namespace

void bias_gelu_forward_packed(uint16_t* out, const uint16_t* y, const float* bias, int64_t N, int64_t C,
                              GeluKind kind) {
  LATTICE_KERNEL_ENTRY(cuda::bias_gelu_forward_packed(out, y, bias, N, C, kind));
  for_packed_pre_activation(y, bias, N, C, [&](int64_t i0, int64_t len, const float* v) {
    uint16_t* os = out + i0;
    math::dispatch_activation(kind, [&](auto k) {
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) os[j] = math::fp32_to_bf16(math::activation<k.value>(v[j]));
    });
  });
}

namespace {
// dout fp32 (rounded by round_dout as it is read) or bf16 (round_dout none).
template <class Td>
void bias_gelu_backward_rows(float* dx, const uint16_t* y, const float* bias, const Td* dout, int64_t N, int64_t C,
                             GeluKind kind, Rounding round_dout, uint16_t* dx_bf16) {
  math::dispatch_rounding(round_dout, [&](auto r) {
    for_packed_pre_activation(y, bias, N, C, [&](int64_t i0, int64_t len, const float* v) {
      alignas(64) float d[kColumnChunk];
      const Td* ds = dout + i0;
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) d[j] = math::round_as<decltype(r)::value>(math::load_as(ds, j));
      float* dxs = dx + i0;
      gelu_backward_chunk(dxs, v, d, len, kind);  // dx may alias dout: its chunk is in d
      if (dx_bf16) {  // may alias y: its chunk was read into v
        uint16_t* os = dx_bf16 + i0;
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) os[j] = math::fp32_to_bf16(dxs[j]);
      }
    });
  });
}
}  // namespace

void bias_gelu_backward_packed(float* dx, const uint16_t* y, const float* bias, const float* dout, int64_t N,
                               int64_t C, GeluKind kind, Rounding round_dout, uint16_t* dx_bf16) {
  LATTICE_KERNEL_ENTRY(cuda::bias_gelu_backward_packed(dx, y, bias, dout, N, C, kind, round_dout, dx_bf16));
  bias_gelu_backward_rows(dx, y, bias, dout, N, C, kind, round_dout, dx_bf16);
}

void bias_gelu_backward_packed(float* dx, const uint16_t* y, const float* bias, const uint16_t* dout, int64_t N,
                               int64_t C, GeluKind kind, uint16_t* dx_bf16) {
  LATTICE_KERNEL_ENTRY(cuda::bias_gelu_backward_packed(dx, y, bias, dout, N, C, kind, dx_bf16));
  bias_gelu_backward_rows(dx, y, bias, dout, N, C, kind, Rounding::none, dx_bf16);
}

// cpu::column_sums over the gradient computed row segment by row segment (the bf16-dout
// form's element math): bias_backward's bits on the fp32 gradient, which is not stored.
void bias_gelu_backward_packed_dbias(uint16_t* dx_bf16, float* dbias, const uint16_t* y, const float* bias,
                                     const uint16_t* dout, int64_t N, int64_t C, GeluKind kind) {
  LATTICE_KERNEL_ENTRY(cuda::bias_gelu_backward_packed_dbias(dx_bf16, dbias, y, bias, dout, N, C, kind));
  // dx_bf16 may alias y: a row segment of y is read (into v) before its cast is stored.
  cpu::column_sums(dbias, dx_bf16, N, C, [&](int64_t n, int64_t c0, int64_t len, float* g) {
    alignas(64) float v[cpu::kSumColumns], d[cpu::kSumColumns];
    const int64_t i0 = n * C + c0;
    cpu::widen_with_bias(v, y + i0, bias ? bias + c0 : nullptr, len);
    const uint16_t* ds = dout + i0;
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) d[j] = math::bf16_to_fp32(ds[j]);
    gelu_backward_chunk(g, v, d, len, kind);
    return static_cast<const float*>(g);
  });
}

}  // namespace lattice
