#include "kernels/dropout.h"
#include "kernels/layernorm.h"

#include "core/device.h"
#include "kernels/cuda/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cast_math.h"
#include "kernels/jitter_math.h"
#include "kernels/cpu/row_sums.h"
#include "kernels/cpu/simd_math.h"

namespace lattice {

namespace {

// Elements per task: a multiple of 4 (one Philox block), small enough to stay in L1.
constexpr int64_t kChunk = 2048;

// out[i] = keep(first_index + i) ? x[i] * scale : 0, in chunks; the mask depends on
// the global index alone, so chunking and threads do not change it.
void apply_mask(float* out, const float* x, int64_t n, float p, const PhiloxStream& stream,
                uint64_t first_index) {
  LATTICE_CHECK(p >= 0.0f && p < 1.0f) << "dropout probability " << p << " not in [0, 1)";
  if (p == 0.0f) {
    if (out != x) std::memcpy(out, x, size_t(n) * sizeof(float));
    return;
  }
  const float scale = 1.0f / (1.0f - p);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > 4 * kChunk)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t i0 = k * kChunk, len = std::min(n - i0, kChunk);
    alignas(64) float mask[kChunk];
    simd::dropout_mask(mask, stream, first_index + uint64_t(i0), len, p, scale);
    const float* xs = x + i0;
    float* os = out + i0;  // may alias xs: element i is read before it is written
    // A select, not a product, so dropped infinities and NaNs become 0 as specified.
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) os[i] = mask[i] != 0.0f ? xs[i] * mask[i] : 0.0f;
  }
}

}  // namespace

void dropout_forward(float* out, const float* x, int64_t n, float p, const PhiloxStream& stream,
                     uint64_t first_index) {
  LATTICE_KERNEL_ENTRY(cuda::dropout_forward(out, x, n, p, stream, first_index));
  apply_mask(out, x, n, p, stream, first_index);
}

void dropout_backward(float* dx, const float* dout, int64_t n, float p,
                      const PhiloxStream& stream, uint64_t first_index) {
  LATTICE_KERNEL_ENTRY(cuda::dropout_backward(dx, dout, n, p, stream, first_index));
  apply_mask(dx, dout, n, p, stream, first_index);
}

namespace {

// y[i] = x[i] * jitter_factor(first_index + i), or y[i] + that as one FMA (accumulate), one Philox
// block (four indices) at a time (math::jitter_block, the GPU's too), in chunks of blocks; the factors
// depend on the global index alone.
void apply_jitter(float* y, const float* x, int64_t n, float eps, const PhiloxStream& stream, uint64_t first_index,
                  bool accumulate) {
  LATTICE_CHECK(eps >= 0.0f && eps < 1.0f) << "input jitter eps " << eps << " not in [0, 1)";
  if (n <= 0) return;
  const uint64_t first_block = first_index >> 2, last_block = (first_index + uint64_t(n) - 1) >> 2;
  const int64_t blocks = int64_t(last_block - first_block + 1), per_task = kChunk / 4;
  const int64_t tasks = (blocks + per_task - 1) / per_task;
#pragma omp parallel for schedule(static) if (n > 4 * kChunk)
  for (int64_t k = 0; k < tasks; ++k)
    for (int64_t j = k * per_task; j < std::min(blocks, (k + 1) * per_task); ++j)
      math::jitter_block(y, x, n, eps, stream, first_index, first_block + uint64_t(j), accumulate);
}

}  // namespace

void input_jitter_forward(float* out, const float* x, int64_t n, float eps, const PhiloxStream& stream,
                          uint64_t first_index) {
  LATTICE_KERNEL_ENTRY(cuda::input_jitter_forward(out, x, n, eps, stream, first_index));
  apply_jitter(out, x, n, eps, stream, first_index, false);
}

void input_jitter_backward(float* dx, const float* dout, int64_t n, float eps, const PhiloxStream& stream,
                           uint64_t first_index) {
  LATTICE_KERNEL_ENTRY(cuda::input_jitter_backward(dx, dout, n, eps, stream, first_index));
  apply_jitter(dx, dout, n, eps, stream, first_index, true);
}

namespace {

// out = residual + dropout(round(y) + bias), y fp32 or bf16 (math::load_as). Chunks of kChunk
// elements, each through three L1-resident steps that round like the separate kernels:
// v = round(y) + bias; v = keep ? v * scale : 0; out = residual + v.
template <typename Y>
void bias_dropout_add_rows(float* out, const float* residual, const Y* y, const float* bias, int64_t N, int64_t C,
                           float p, const PhiloxStream& stream, uint64_t first_index, Rounding round_y) {
  LATTICE_CHECK(p >= 0.0f && p < 1.0f) << "bias_dropout_add: dropout probability " << p << " not in [0, 1)";
  const int64_t n = N * C;
  const float scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  math::dispatch_rounding(round_y, [&](auto r) {
#pragma omp parallel for schedule(static) if (n > 4 * kChunk)
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t i0 = k * kChunk, len = std::min(n - i0, kChunk);
      alignas(64) float v[kChunk];
      // v = round(y) + bias, row segment by row segment (each one vectorizes).
      for (int64_t i = 0, c = i0 % C; i < len; c = 0) {
        const int64_t seg = std::min(len - i, C - c);
        const Y* __restrict ys = y + i0 + i;
        float* __restrict vs = v + i;
        if (bias) {
          const float* __restrict bs = bias + c;
#pragma omp simd
          for (int64_t j = 0; j < seg; ++j) vs[j] = math::round_as<r.value>(math::load_as(ys, j)) + bs[j];
        } else {
#pragma omp simd
          for (int64_t j = 0; j < seg; ++j) vs[j] = math::round_as<r.value>(math::load_as(ys, j));
        }
        i += seg;
      }
      if (p > 0.0f) {
        alignas(64) float mask[kChunk];
        simd::dropout_mask(mask, stream, first_index + uint64_t(i0), len, p, scale);
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) v[i] = mask[i] != 0.0f ? v[i] * mask[i] : 0.0f;
      }
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) out[i0 + i] = residual[i0 + i] + v[i];
    }
  });
}

}  // namespace

void bias_dropout_add_forward(float* out, const float* residual, const float* y, const float* bias, int64_t N,
                              int64_t C, float p, const PhiloxStream& stream, uint64_t first_index,
                              Rounding round_y) {
  LATTICE_KERNEL_ENTRY(
      cuda::bias_dropout_add_forward(out, residual, y, bias, N, C, p, stream, first_index, round_y));
  bias_dropout_add_rows(out, residual, y, bias, N, C, p, stream, first_index, round_y);
}

void bias_dropout_add_forward(float* out, const float* residual, const uint16_t* y, const float* bias, int64_t N,
                              int64_t C, float p, const PhiloxStream& stream, uint64_t first_index) {
  LATTICE_KERNEL_ENTRY(cuda::bias_dropout_add_forward(out, residual, y, bias, N, C, p, stream, first_index));
  bias_dropout_add_rows(out, residual, y, bias, N, C, p, stream, first_index, Rounding::none);
}

namespace {
void layernorm_of(const float* x, int64_t N, int64_t C, const LayerNormOut& ln) {
  LATTICE_CHECK((ln.f32 == nullptr) != (ln.bf16 == nullptr)) << "bias_dropout_add_layernorm_forward: one output";
  if (ln.bf16)
    layernorm_forward_bf16(ln.bf16, ln.mean, ln.rstd, x, ln.w, ln.b, N, C, ln.eps, ln.kind);
  else
    layernorm_forward(ln.f32, ln.mean, ln.rstd, x, ln.w, ln.b, N, C, ln.eps, ln.kind);
}
}  // namespace

// The CPU runs the two kernels (the rows stay in cache between them for small rows anyway).
void bias_dropout_add_layernorm_forward(float* out, const float* residual, const float* y, const float* bias,
                                        int64_t N, int64_t C, float p, const PhiloxStream& stream,
                                        uint64_t first_index, Rounding round_y, const LayerNormOut& ln) {
  LATTICE_KERNEL_ENTRY(cuda::bias_dropout_add_layernorm_forward(out, residual, y, bias, N, C, p, stream, first_index,
                                                                round_y, ln));
  bias_dropout_add_rows(out, residual, y, bias, N, C, p, stream, first_index, round_y);
  layernorm_of(out, N, C, ln);
}

void bias_dropout_add_layernorm_forward(float* out, const float* residual, const uint16_t* y, const float* bias,
                                        int64_t N, int64_t C, float p, const PhiloxStream& stream,
                                        uint64_t first_index, const LayerNormOut& ln) {
  LATTICE_KERNEL_ENTRY(
      cuda::bias_dropout_add_layernorm_forward(out, residual, y, bias, N, C, p, stream, first_index, ln));
  bias_dropout_add_rows(out, residual, y, bias, N, C, p, stream, first_index, Rounding::none);
  layernorm_of(out, N, C, ln);
}

// cpu::column_sums over row segments masked as apply_mask masks them (dropout_mask of the
// segment's indices, then the same select and product): the bits of dropout_backward and
// bias_backward_cast_bf16, without the masked gradient stored.
void dropout_backward_bias_cast_bf16(float* dbias, uint16_t* dx_bf16, const float* dout, int64_t N, int64_t C,
                                     float p, const PhiloxStream& stream, uint64_t first_index) {
  LATTICE_KERNEL_ENTRY(
      cuda::dropout_backward_bias_cast_bf16(dbias, dx_bf16, dout, N, C, p, stream, first_index));
  LATTICE_CHECK(p >= 0.0f && p < 1.0f) << "dropout_backward: dropout probability " << p << " not in [0, 1)";
  const float scale = 1.0f / (1.0f - p);
  cpu::column_sums(dbias, dx_bf16, N, C, [&](int64_t n, int64_t c0, int64_t len, float* x) {
    alignas(64) float mask[cpu::kSumColumns];
    const int64_t i0 = n * C + c0;
    simd::dropout_mask(mask, stream, first_index + uint64_t(i0), len, p, scale);
    const float* d = dout + i0;
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) x[j] = mask[j] != 0.0f ? d[j] * mask[j] : 0.0f;
    return static_cast<const float*>(x);
  });
}

}  // namespace lattice
