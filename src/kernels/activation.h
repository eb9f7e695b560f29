// The dense MLP's activation (GeluKind, kernels/activation_math.h): GELU, Megatron's default in its
// exact erf form, --openai-gelu its tanh form (HuggingFace's gelu_new); or --squared-relu's
// relu(x)^2. The kernels are named for GELU and take any kind.
#pragma once
#include <cstdint>

#include "kernels/activation_math.h"
#include "kernels/cast.h"

namespace lattice {

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

// bias_gelu on a bf16 GEMM result (the bf16 policy's fc1, blas gemm_bf16_packed_out):
// y [N, C] holds round(x W^T) as bf16 patterns; out = bf16(gelu(y + bias)). No
// pre-activation is stored: bias_gelu_backward_packed recomputes y + bias (exact in fp32, as
// bias_gelu_forward computes it). The same bits as bias_gelu_forward (its output cast to bf16) with
// Rounding::bf16 on the fp32 result, with half the bytes read and none for `pre` written.
// bias may be null.
void bias_gelu_forward_packed(uint16_t* out, const uint16_t* y, const float* bias, int64_t N, int64_t C,
                              GeluKind kind);
// dx = gelu'(y + bias) * round(dout), y [N, C] and bias as in bias_gelu_forward_packed: the
// same bits as gelu_backward on the pre-activation bias_gelu_forward keeps. dx may alias
// dout. dx_bf16, when not null, gets dx's bf16 cast too (fc1's output gradient as its GEMMs
// read it, made here instead of by a conversion pass); it may alias y.
void bias_gelu_backward_packed(float* dx, const uint16_t* y, const float* bias, const float* dout, int64_t N,
                               int64_t C, GeluKind kind, Rounding round_dout = Rounding::none,
                               uint16_t* dx_bf16 = nullptr);
// The same with dout in bf16: fc2's input gradient as its GEMM wrote it, rounded
// (GemmSite::input_grad_in_bf16); the values of the fp32 form with round_dout bf16.
void bias_gelu_backward_packed(float* dx, const uint16_t* y, const float* bias, const uint16_t* dout, int64_t N,
                               int64_t C, GeluKind kind, uint16_t* dx_bf16 = nullptr);
// fc1's backward on bf16 operands with its bias gradient and no fp32 gradient stored: with
// d = gelu'(y + bias) * dout as the bf16-dout form above computes it, dx_bf16 = bf16(d) and
// dbias[c] += sum_n d[n, c], the bits bias_backward gives on the fp32 d (each column summed
// over n in order on the CPU; the GPU's column-sum blocking on the GPU). The fp32 d, [N, C]
// written and read again for the bias alone, never goes to memory. dx_bf16 may alias y.
void bias_gelu_backward_packed_dbias(uint16_t* dx_bf16, float* dbias, const uint16_t* y, const float* bias,
                                     const uint16_t* dout, int64_t N, int64_t C, GeluKind kind);

}  // namespace lattice
