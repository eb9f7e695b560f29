// LayerNorm over the last dim. N rows of C; statistics in fp32.
#pragma once
#include <cstdint>

#include "kernels/cast.h"

namespace lattice {

// out = (x - mean) * rstd * w + b;  mean[N], rstd[N] saved for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C, float eps);

// The same with out in bf16 (its patterns): bf16 of layernorm_forward's out, for a GEMM
// that reads its input in bf16 (model/linear.h LinearInput).
void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* x, const float* w,
                            const float* b, int64_t N, int64_t C, float eps);

// dx += ...; dw += sum_n dout*xhat; db += sum_n dout      (all three accumulate)
// Deterministic whatever the thread count. round_dout: dout is a GEMM result (the input
// gradient of the next layer's linear, GemmSite::caller_rounds) rounded here as it is read,
// the same bits as rounding it in a pass of its own first.
void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t N,
                        int64_t C, Rounding round_dout = Rounding::none);

}  // namespace lattice
