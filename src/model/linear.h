// Linear layer math, y = x W^T + b with W stored [out, in] (Megatron/PyTorch layout).
// The tensor-parallel layers (ColumnParallelLinear, RowParallelLinear) are built on
// these with their communication around them.
#pragma once
#include <cstdint>

namespace lattice {

// Mixed precision for the linear layers: a policy decides in which format a GEMM's inputs
// enter the product (bf16, fp16, fp8 with per-tensor scales, ...; products accumulated in
// fp32). `param` names the weight's parameter (per-tensor state such as fp8 scales is kept
// per weight). Without a policy the GEMMs run in fp32.
class GemmPolicy {
 public:
  virtual ~GemmPolicy() = default;
  // y[N, out] = x[N, in] @ W[out, in]^T
  virtual void forward(int param, float* y, const float* x, const float* W, int64_t N, int64_t in, int64_t out) = 0;
  // dW[out, in] += dy^T @ x
  virtual void weight_grad(int param, float* dW, const float* dy, const float* x, int64_t N, int64_t in,
                           int64_t out) = 0;
  // dx[N, in] = dy @ W (accumulated into dx when accumulate)
  virtual void input_grad(int param, float* dx, const float* dy, const float* W, int64_t N, int64_t in,
                          int64_t out, bool accumulate) = 0;
  // Rounds a GEMM result (y of forward, dx of input_grad) to the format layer outputs are
  // kept in (bf16, fp16; nothing for fp32 outputs). linear_forward / linear_backward call
  // it after the GEMM; for a partial sum that the tensor-parallel group reduces next, the
  // parallel layer calls it on the reduced result instead, so every layout rounds the
  // same full sums.
  virtual void round_result(float* v, int64_t n) {}
};

// Where a linear layer's GEMMs go: the model's policy (null: fp32) and the weight's index.
struct GemmSite {
  GemmPolicy* policy = nullptr;
  int param = -1;
  bool partial_sum = false;  // the result is reduced over tensor parallelism before round_result
};

// y[N, out] = x[N, in] @ W[out, in]^T + b[out]   (b may be null)
void linear_forward(float* y, const float* x, const float* W, const float* b, int64_t N,
                    int64_t in, int64_t out, const GemmSite& site = {});

// dW[out, in] += dy^T @ x;  db[out] += sum_n dy;  dx[N, in] = dy @ W (written, or
// accumulated when accumulate_dx). dx may be null when the input needs no gradient.
void linear_backward(float* dx, float* dW, float* db, const float* dy, const float* x,
                     const float* W, int64_t N, int64_t in, int64_t out, bool accumulate_dx = false,
                     const GemmSite& site = {});

}  // namespace lattice
