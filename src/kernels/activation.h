// GELU: Megatron's default is the exact erf form; --openai-gelu selects the tanh form
// (HuggingFace's gelu_new).
#pragma once
#include <cstdint>

#include "kernels/cast.h"

namespace lattice {

enum class GeluKind { erf, tanh };

// out[i] = gelu(x[i])     (out may alias x)
void gelu_forward(float* out, const float* x, int64_t n, GeluKind kind);

// dx[i] = gelu'(x[i]) * round(dout[i])   (written, not accumulated; dx may alias dout)
// round: the rounding of dout when it is a GEMM result read here unrounded
// (GemmSite::caller_rounds), fused into the same pass.
void gelu_backward(float* dx, const float* x, const float* dout, int64_t n, GeluKind kind,
                   Rounding round_dout = Rounding::none);

// Megatron's bias_gelu after the first MLP linear layer, in one pass over its GEMM result
// y [N, C]:  pre[n,c] = round(y[n,c]) + bias[c] (kept for gelu_backward), out = gelu(pre).
// The same bits as round_to, bias_add and gelu_forward one after the other. pre may alias y;
// bias may be null.
void bias_gelu_forward(float* pre, float* out, const float* y, const float* bias, int64_t N, int64_t C,
                       GeluKind kind, Rounding round_y);
// The same with out in bf16 (its patterns), for the next GEMM's bf16 input.
void bias_gelu_forward_bf16(float* pre, uint16_t* out, const float* y, const float* bias, int64_t N, int64_t C,
                            GeluKind kind, Rounding round_y);

}  // namespace lattice
