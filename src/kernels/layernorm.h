// LayerNorm over the last dim. N rows of C; statistics in fp32.
#pragma once
#include <cstdint>

#include "kernels/cast.h"

namespace lattice {

// Megatron's --normalization: LayerNorm, or RMSNorm, which subtracts no mean: out = x * rstd *
// w + b with rstd = 1 / sqrt(mean(x^2) + eps) (the model passes zeros for b: RMSNorm has no
// bias). RMSNorm saves mean = 0, so xhat = (x - mean) * rstd holds for both, and its backward
// drops LayerNorm's mean(dout w) term.
enum class Normalization { layernorm, rmsnorm };

// out = (x - mean) * rstd * w + b;  mean[N], rstd[N] saved for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C, float eps,
                       Normalization kind = Normalization::layernorm);

// The same with out in bf16 (its patterns): bf16 of layernorm_forward's out, for a GEMM
// that reads its input in bf16 (model/linear.h LinearInput).
void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* x, const float* w,
                            const float* b, int64_t N, int64_t C, float eps,
                            Normalization kind = Normalization::layernorm);

// A LayerNorm's output as a kernel that also makes its input writes it (dropout.h's
// bias_dropout_add_layernorm_forward): out in fp32 or bf16 (one of f32, bf16), the row
// statistics mean, rstd [N], and the LayerNorm's parameters w, b [C] and epsilon.
struct LayerNormOut {
  float* f32 = nullptr;
  uint16_t* bf16 = nullptr;
  float* mean = nullptr;
  float* rstd = nullptr;
  const float* w = nullptr;
  const float* b = nullptr;
  float eps = 1e-5f;
  Normalization kind = Normalization::layernorm;
};

// The output gradient a LayerNorm backward reads: fp32, rounded as it is read (round: a
// GEMM result, the input gradient of the next layer's linear, GemmSite::caller_rounds; the
// same bits as rounding it in a pass of its own first), or the bf16 patterns such a GEMM
// wrote already rounded (GemmSite::input_grad_in_bf16; the values of the fp32 form with
// round bf16, half the bytes).
struct LayerNormDout {
  const float* f32 = nullptr;
  Rounding round = Rounding::none;
  const uint16_t* bf16 = nullptr;
  LayerNormDout(const float* d, Rounding r = Rounding::none) : f32(d), round(r) {}  // NOLINT: fp32 converts
  static LayerNormDout in_bf16(const uint16_t* d) {
    LayerNormDout o(nullptr);
    o.bf16 = d;
    return o;
  }
};

// What the row-parallel layer before a LayerNorm (in the forward order) takes from the
// residual stream's gradient dx when no dropout comes between them, its output gradient
// being dx itself: dx's bf16 cast [N, C] for its GEMMs, and dx's column sums added to its
// bias gradient [C]. The backward makes both from the accumulated dx as it writes it: what
// bias_backward_cast_bf16 on dx gives (its bits on the CPU; on a GPU the column sums run in
// the kernel's row order, within rows x 2^-24 of each column's sum of magnitudes), without
// reading dx again. Both or neither.
struct ResidualGradOut {
  uint16_t* bf16 = nullptr;
  float* bias_grad = nullptr;
};

// dx += ...; dw += sum_n dout*xhat; db += sum_n dout      (all three accumulate)
// Deterministic whatever the thread count.
void layernorm_backward(float* dx, float* dw, float* db, LayerNormDout dout, const float* x, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C, ResidualGradOut next = {},
                        Normalization kind = Normalization::layernorm);

}  // namespace lattice
