#include "kernels/swiglu.h"

#include <algorithm>

#include "core/device.h"
#include "kernels/activation_math.h"
#include "kernels/cast_math.h"
#include "kernels/cpu/row_sums.h"
#include "kernels/cuda/ops.h"

namespace lattice {

namespace {
constexpr int64_t kParallelMin = 32768;
constexpr int64_t kChunk = cpu::kSumColumns;  // columns of each half handled at once (an L1 buffer)

// g, u [len]: columns [j0, j0 + len) of the gate and of the up projection of row n of a bf16
// GEMM result y [N, 2F], with their biases, in fp32 (as bias_swiglu_forward's pre-activation).
inline void widen_halves(float* g, float* u, const uint16_t* y, const float* bias, int64_t n, int64_t F, int64_t j0,
                         int64_t len) {
  const uint16_t* row = y + n * 2 * F;
  cpu::widen_with_bias(g, row + j0, bias ? bias + j0 : nullptr, len);
  cpu::widen_with_bias(u, row + F + j0, bias ? bias + F + j0 : nullptr, len);
}
}  // namespace

void bias_swiglu_forward(float* pre, float* out, const float* y, const float* bias, int64_t N, int64_t F,
                         Rounding round_y, const GluForm& glu) {
  LATTICE_KERNEL_ENTRY(cuda::bias_swiglu_forward(pre, out, y, bias, N, F, round_y, glu));
  math::dispatch_rounding(round_y, [&](auto r) {
#pragma omp parallel for schedule(static) if (N * F > kParallelMin)
    for (int64_t n = 0; n < N; ++n) {
      const float* ys = y + n * 2 * F;
      float* ps = pre + n * 2 * F;  // may alias ys: element c is read before it is written
      float* __restrict os = out + n * F;
      if (bias) {
#pragma omp simd
        for (int64_t c = 0; c < 2 * F; ++c) ps[c] = math::round_as<r.value>(ys[c]) + bias[c];
      } else {
#pragma omp simd
        for (int64_t c = 0; c < 2 * F; ++c) ps[c] = math::round_as<r.value>(ys[c]);
      }
#pragma omp simd
      for (int64_t j = 0; j < F; ++j) os[j] = math::glu(ps[j], ps[F + j], glu);
    }
  });
}

void bias_swiglu_forward_packed(uint16_t* out, const uint16_t* y, const float* bias, int64_t N, int64_t F,
                                const GluForm& glu) {
  LATTICE_KERNEL_ENTRY(cuda::bias_swiglu_forward_packed(out, y, bias, N, F, glu));
#pragma omp parallel for schedule(static) if (N * F > kParallelMin)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j0 = 0; j0 < F; j0 += kChunk) {
      const int64_t len = std::min(kChunk, F - j0);
      alignas(64) float g[kChunk], u[kChunk];
      widen_halves(g, u, y, bias, n, F, j0, len);
      uint16_t* os = out + n * F + j0;
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) os[j] = math::fp32_to_bf16(math::glu(g[j], u[j], glu));
    }
}

void swiglu_backward(float* dx, const float* pre, const float* dout, int64_t N, int64_t F, Rounding round_dout,
                     const GluForm& glu) {
  LATTICE_KERNEL_ENTRY(cuda::swiglu_backward(dx, pre, dout, N, F, round_dout, glu));
  math::dispatch_rounding(round_dout, [&](auto r) {
#pragma omp parallel for schedule(static) if (N * F > kParallelMin)
    for (int64_t n = 0; n < N; ++n) {
      const float* ps = pre + n * 2 * F;
      float* xs = dx + n * 2 * F;  // may alias ps: elements j and F + j are read before they are written
      const float* ds = dout + n * F;
      const GluForm form = glu;  // the thread's own copy: its fields in registers, not gathered per lane
#pragma omp simd
      for (int64_t j = 0; j < F; ++j) {
        float dg, du;
        math::glu_backward(ps[j], ps[F + j], math::round_as<decltype(r)::value>(ds[j]), form, dg, du);
        xs[j] = dg;
        xs[F + j] = du;
      }
    }
  });
}

// cpu::column_sums' order (each column's rows summed in order from zero, then added to
// dbias): bias_backward's bits on the fp32 gradient, which is not stored. A task takes the
// same columns of both halves, so that the gate and up values of a row are read before
// their gradients' casts are stored (dx_bf16 may alias y).
void bias_swiglu_backward_packed_dbias(uint16_t* dx_bf16, float* dbias, const uint16_t* y, const float* bias,
                                       const uint16_t* dout, int64_t N, int64_t F, const GluForm& glu) {
  LATTICE_KERNEL_ENTRY(cuda::bias_swiglu_backward_packed_dbias(dx_bf16, dbias, y, bias, dout, N, F, glu));
  const int64_t chunks = (F + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (N * F > kParallelMin)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t j0 = k * kChunk, len = std::min(kChunk, F - j0);
    alignas(64) float acc_g[kChunk] = {}, acc_u[kChunk] = {};
    for (int64_t n = 0; n < N; ++n) {
      alignas(64) float g[kChunk], u[kChunk];
      widen_halves(g, u, y, bias, n, F, j0, len);
      const uint16_t* ds = dout + n * F + j0;
      uint16_t* og = dx_bf16 + n * 2 * F + j0;
      uint16_t* ou = og + F;
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) {
        float dg, du;
        math::glu_backward(g[j], u[j], math::bf16_to_fp32(ds[j]), glu, dg, du);
        acc_g[j] += dg;
        acc_u[j] += du;
        og[j] = math::fp32_to_bf16(dg);
        ou[j] = math::fp32_to_bf16(du);
      }
    }
    for (int64_t j = 0; j < len; ++j) {
      dbias[j0 + j] += acc_g[j];
      dbias[F + j0 + j] += acc_u[j];
    }
  }
}

}  // namespace lattice
