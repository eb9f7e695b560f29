// SwiGLU, the MLP activation of Megatron's --swiglu (a gated linear unit with SiLU): fc1
// makes two projections of each token, the gate g and the up projection u, and the MLP's
// hidden value is silu(g) u. Every kernel takes the unit's form (GluForm, default SwiGLU): its
// other forms are quick GELU for SiLU (--quick-geglu), an offset on u (--glu-linear-offset) and
// clamps (--activation-func-clamp-value), GPT-OSS's together. The element math is in
// kernels/activation_math.h, shared by the CPU kernels (kernels/cpu/swiglu.cpp) and the CUDA
// kernels (kernels/cuda/swiglu.cu).
#pragma once
#include <cstdint>

#include "kernels/activation_math.h"
#include "kernels/cast.h"

namespace lattice {

// fc1's result y [N, 2F] holds in each row the gate's F columns, then the up projection's F
// (this rank's share of each block of the weight, ParamInfo::tp_blocks); with g = y[n, j] + bias[j] and
// u = y[n, F + j] + bias[F + j], out[n, j] = math::glu(g, u, glu) (silu(g) u), [N, F]. bias [2F]
// may be null.
//
// pre = round(y) + bias [N, 2F] (kept for swiglu_backward; may alias y), out [N, F].
void bias_swiglu_forward(float* pre, float* out, const float* y, const float* bias, int64_t N, int64_t F,
                         Rounding round_y, const GluForm& glu = {});
// On a bf16 GEMM result y [N, 2F] (as bias_gelu_forward_packed): out = bf16(silu(g) u) [N, F],
// the bits of bias_swiglu_forward with Rounding::bf16 cast to bf16; no pre-activation stored.
void bias_swiglu_forward_packed(uint16_t* out, const uint16_t* y, const float* bias, int64_t N, int64_t F,
                                const GluForm& glu = {});
// dx [N, 2F] from the pre-activation pre [N, 2F] and round(dout) [N, F]:
// dx[n, j] = d glu(g, u) / dg * dout[n, j], dx[n, F + j] = d glu / du * dout[n, j]
// (math::glu_backward). Written, not accumulated; dx may alias pre (not dout).
void swiglu_backward(float* dx, const float* pre, const float* dout, int64_t N, int64_t F,
                     Rounding round_dout = Rounding::none, const GluForm& glu = {});
// fc1's backward on bf16 operands (as bias_gelu_backward_packed_dbias): with d the gradient
// swiglu_backward computes from y + bias and the bf16 dout [N, F], dx_bf16 = bf16(d) [N, 2F]
// and dbias[c] += sum_n d[n, c] for the 2F columns (not null), the bits bias_backward gives on
// the fp32 d, which is never stored. dx_bf16 may alias y.
void bias_swiglu_backward_packed_dbias(uint16_t* dx_bf16, float* dbias, const uint16_t* y, const float* bias,
                                       const uint16_t* dout, int64_t N, int64_t F, const GluForm& glu = {});

}  // namespace lattice
