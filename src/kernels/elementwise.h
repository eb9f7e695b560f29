// Residual adds, bias, scaling: the small memory-bound ops.
#pragma once
#include <cstdint>

#include "kernels/cast.h"

namespace lattice {

// out = a + b   (out may alias a or b)
void add_forward(float* out, const float* a, const float* b, int64_t n);

// y[i] += x[i]
void accumulate(float* y, const float* x, int64_t n);

// out[n,c] = round(out[n,c]) + bias[c]        out: [N,C]
// round: a GEMM result's rounding (GemmPolicy::result_rounding), fused into the same pass.
void bias_add(float* out, const float* bias, int64_t N, int64_t C, Rounding round_out = Rounding::none);

// dbias[c] += sum_n dout[n,c]   (deterministic)
void bias_backward(float* dbias, const float* dout, int64_t N, int64_t C);
// bias_backward (its bits) that also writes dout's bf16 cast, dout_bf16 [N, C]: a linear
// layer's output gradient as its GEMMs read it, with one read of dout for both.
void bias_backward_cast_bf16(float* dbias, uint16_t* dout_bf16, const float* dout, int64_t N, int64_t C);

// x *= s
void scale_inplace(float* x, float s, int64_t n);

}  // namespace lattice
