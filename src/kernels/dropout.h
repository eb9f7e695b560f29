// Dropout with masks drawn from a counter-based stream: element i of a tensor is
// kept when stream.uniform(first_index + i) >= p. Nothing is stored for backward:
// the mask is drawn again. So the mask depends only on (seed, stream tags, global
// element index), never on the thread count or the parallel layout.
#pragma once
#include <cstdint>

#include "core/philox.h"
#include "kernels/cast.h"
#include "kernels/layernorm.h"

namespace lattice {

// out[i] = keep(i) ? x[i] / (1 - p) : 0      (out may alias x; p == 0 copies)
void dropout_forward(float* out, const float* x, int64_t n, float p, const PhiloxStream& stream,
                     uint64_t first_index);

// dx[i] = keep(i) ? dout[i] / (1 - p) : 0    (written; dx may alias dout)
void dropout_backward(float* dx, const float* dout, int64_t n, float p,
                      const PhiloxStream& stream, uint64_t first_index);

// Megatron's bias-dropout-add after a row-parallel linear layer, in one pass:
//   out[n,c] = residual[n,c] + dropout(round(y[n,c]) + bias[c])
// with dropout_forward's mask of element n*C + c (index first_index + n*C + c), round the
// GEMM result's rounding (GemmSite::caller_rounds). The same fp32 operations, in the same
// order, as round_to, bias_add, dropout_forward and add_forward one after the other: the
// same bits. bias may be null; out may alias residual or y.
void bias_dropout_add_forward(float* out, const float* residual, const float* y, const float* bias, int64_t N,
                              int64_t C, float p, const PhiloxStream& stream, uint64_t first_index,
                              Rounding round_y = Rounding::none);
// dropout_backward's dx = keep ? dout / (1 - p) : 0 (dropout_forward's mask of element
// first_index + n*C + c), not stored: its column sums dbias[c] += sum_n dx[n, c] and its bf16
// cast dx_bf16 [N, C], the bits of dropout_backward followed by bias_backward_cast_bf16 (a
// row-parallel layer's output and bias gradients from the residual stream's, read once).
void dropout_backward_bias_cast_bf16(float* dbias, uint16_t* dx_bf16, const float* dout, int64_t N, int64_t C,
                                     float p, const PhiloxStream& stream, uint64_t first_index);

// The same with y the GEMM's result as bf16 patterns (gemm_bf16_packed_out: round(y) already,
// read at half the bytes): the bits of the fp32 overload on y's fp32 values with round_y bf16.
void bias_dropout_add_forward(float* out, const float* residual, const uint16_t* y, const float* bias, int64_t N,
                              int64_t C, float p, const PhiloxStream& stream, uint64_t first_index);

// bias_dropout_add_forward followed by the LayerNorm that reads its out (layernorm_forward
// into ln.f32, or layernorm_forward_bf16 into ln.bf16), in one pass over the rows: each row's
// sum is written and normalized without being read back. The bits of the two calls. y fp32
// rounded by round_y, or (second form) bf16 patterns.
void bias_dropout_add_layernorm_forward(float* out, const float* residual, const float* y, const float* bias,
                                        int64_t N, int64_t C, float p, const PhiloxStream& stream,
                                        uint64_t first_index, Rounding round_y, const LayerNormOut& ln);
void bias_dropout_add_layernorm_forward(float* out, const float* residual, const uint16_t* y, const float* bias,
                                        int64_t N, int64_t C, float p, const PhiloxStream& stream,
                                        uint64_t first_index, const LayerNormOut& ln);

// Multiplicative noise from the same kind of stream (the MoE router's --moe-input-jitter-eps,
// Switch Transformer's): element i times jitter_factor(stream.u32(first_index + i), eps), uniform in
// [1 - eps, 1 + eps), 0 <= eps < 1. Drawn again for the backward, as dropout's masks.
// out[i] = x[i] * factor(first_index + i)     (out may alias x)
void input_jitter_forward(float* out, const float* x, int64_t n, float eps, const PhiloxStream& stream,
                          uint64_t first_index);
// dx[i] += dout[i] * factor(first_index + i)  (accumulated: the input also feeds the experts)
void input_jitter_backward(float* dx, const float* dout, int64_t n, float eps, const PhiloxStream& stream,
                           uint64_t first_index);

}  // namespace lattice
