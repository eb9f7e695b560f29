// Linear layer math, y = x W^T + b with W stored [out, in] (Megatron/PyTorch layout).
// The tensor-parallel layers (ColumnParallelLinear, RowParallelLinear) are built on
// these with their communication around them.
#pragma once
#include <cstdint>

namespace lattice {

// y[N, out] = x[N, in] @ W[out, in]^T + b[out]   (b may be null)
void linear_forward(float* y, const float* x, const float* W, const float* b, int64_t N,
                    int64_t in, int64_t out);

// dW[out, in] += dy^T @ x;  db[out] += sum_n dy;  dx[N, in] = dy @ W (written, or
// accumulated when accumulate_dx). dx may be null when the input needs no gradient.
void linear_backward(float* dx, float* dW, float* db, const float* dy, const float* x,
                     const float* W, int64_t N, int64_t in, int64_t out, bool accumulate_dx = false);

}  // namespace lattice
