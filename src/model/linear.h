// Linear layer math, y = x W^T + b with W stored [out, in] (Megatron/PyTorch layout).
// The tensor-parallel layers (ColumnParallelLinear, RowParallelLinear) are built on
// these with their communication around them.
#pragma once
#include <cstdint>

#include "kernels/cast.h"

namespace lattice {

// A linear layer's input x [N, in] as a GEMM operand: fp32 values, or the same values
// already in bf16 (their patterns), as the kernel that made them wrote them (LayerNorm,
// bias_gelu) for a policy with bf16_results: its GEMM then reads them without a conversion.
struct LinearInput {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  LinearInput(const float* x) : f32(x) {}  // NOLINT: fp32 inputs convert implicitly
  static LinearInput in_bf16(const uint16_t* x) {
    LinearInput i(nullptr);
    i.bf16 = x;
    return i;
  }
  // The fp32 values; fails for a bf16 input (a GEMM path without bf16 operands).
  const float* fp32(const char* where) const;
};

// Mixed precision for the linear layers: a policy decides in which format a GEMM's inputs
// enter the product (bf16, fp16, fp8 with per-tensor scales, ...; products accumulated in
// fp32). `param` names the weight's parameter (per-tensor state such as fp8 scales is kept
// per weight). Without a policy the GEMMs run in fp32.
class GemmPolicy {
 public:
  virtual ~GemmPolicy() = default;
  // y[N, out] = x[N, in] @ W[out, in]^T
  virtual void forward(int param, float* y, LinearInput x, const float* W, int64_t N, int64_t in, int64_t out) = 0;
  // dW[out, in] += dy^T @ x
  virtual void weight_grad(int param, float* dW, const float* dy, LinearInput x, int64_t N, int64_t in,
                           int64_t out) = 0;
  // dx[N, in] = dy @ W (accumulated into dx when accumulate)
  virtual void input_grad(int param, float* dx, const float* dy, const float* W, int64_t N, int64_t in,
                          int64_t out, bool accumulate) = 0;
  // The format a GEMM result (y of forward, dx of input_grad) is rounded to, the format
  // layer outputs are kept in (bf16, fp16; none for fp32 outputs). linear_forward /
  // linear_backward round after the GEMM (fused with the bias where there is one); for a
  // partial sum that the tensor-parallel group reduces next, the parallel layer rounds the
  // reduced result instead, so every layout rounds the same full sums.
  virtual Rounding result_rounding() const { return Rounding::none; }
  // An fp8 policy (per-tensor scaled fp8 GEMMs): the MoE router stays out of it, as Megatron's
  // router is no fp8 layer.
  virtual bool fp8() const { return false; }
  void round_result(float* v, int64_t n) const { round_to(v, v, n, result_rounding()); }

  // bf16 storage (the bf16 policy; the others fail): the output layer's logits written and
  // their gradient read as bf16 patterns, half the memory traffic of fp32; and inputs taken
  // in bf16 (LinearInput::in_bf16) by forward, weight_grad and the functions below.
  virtual bool bf16_results() const { return false; }
  // y = round_result(x W^T) as bf16 [N, out], packed at the start of y_buffer (which holds
  // N * out floats; blas gemm_bf16_packed_out). Returns the bf16 result.
  virtual const uint16_t* forward_bf16(int param, float* y_buffer, LinearInput x, const float* W, int64_t N,
                                       int64_t in, int64_t out);
  // weight_grad / input_grad with the output gradient already in bf16 (the values they would
  // convert an fp32 dy to).
  virtual void weight_grad_bf16(int param, float* dW, const uint16_t* dy, LinearInput x, int64_t N, int64_t in,
                                int64_t out);
  virtual void input_grad_bf16(int param, float* dx, const uint16_t* dy, const float* W, int64_t N, int64_t in,
                               int64_t out, bool accumulate);
  // dx = round_result(dy W) as bf16 [N, in], packed at the start of dx_buffer (N * in
  // floats), for a caller that reads the rounded input gradient as bf16. Returns it. dy_bf16:
  // dy's bf16 cast when the caller has it (else dy is converted, or weight_grad's kept).
  virtual const uint16_t* input_grad_packed(int param, float* dx_buffer, const float* dy, const uint16_t* dy_bf16,
                                            const float* W, int64_t N, int64_t in, int64_t out);
};

// Where a linear layer's GEMMs go: the model's policy (null: fp32) and the weight's index.
struct GemmSite {
  GemmPolicy* policy = nullptr;
  int param = -1;
  bool partial_sum = false;  // the result is reduced over tensor parallelism before round_result
  // The result is left unrounded (and without bias): the caller's next kernel rounds it as
  // it reads it, fused with what follows (bias_gelu_forward, bias_dropout_add_forward,
  // gelu_backward, the cross entropy), with rounding(site).
  bool caller_rounds = false;
  // (with caller_rounds, a policy with bf16_results) linear_backward writes the input
  // gradient rounded, as bf16 patterns packed at the start of dx (input_grad_packed), for a
  // caller that reads it so.
  bool packed_input_grad = false;

  GemmSite rounded_by_caller() const {
    GemmSite s = *this;
    s.caller_rounds = true;
    return s;
  }
  GemmSite input_grad_in_bf16() const {
    GemmSite s = rounded_by_caller();
    s.packed_input_grad = true;
    return s;
  }
};

// The rounding a site's results get: the policy's, none without one.
inline Rounding rounding(const GemmSite& site) {
  return site.policy ? site.policy->result_rounding() : Rounding::none;
}

// y[rows, out] = round(y) + b[out] in one pass (b may be null; r none: only the bias): the
// epilogue of a linear layer's forward, after any tensor-parallel reduction.
void round_and_add_bias(float* y, const float* b, int64_t rows, int64_t out, Rounding r);

// y[N, out] = round(x[N, in] @ W[out, in]^T) + b[out]   (b may be null; round: the site's
// rounding, in one pass with the bias; with caller_rounds neither, and b must be null)
void linear_forward(float* y, LinearInput x, const float* W, const float* b, int64_t N,
                    int64_t in, int64_t out, const GemmSite& site = {});

// dW[out, in] += dy^T @ x;  db[out] += sum_n dy;  dx[N, in] = dy @ W (written, or
// accumulated when accumulate_dx), rounded unless partial_sum or caller_rounds. dx may be
// null when the input needs no gradient. dy_bf16, when not null, is dy's bf16 cast made by
// the kernel that produced dy (a policy with bf16_results only): the two GEMMs read it, the
// bias gradient still sums the fp32 dy; the same bits as converting dy here. dy may be null
// with dy_bf16 when no bias gradient is asked for here (db null: the producer summed it).
void linear_backward(float* dx, float* dW, float* db, const float* dy, LinearInput x,
                     const float* W, int64_t N, int64_t in, int64_t out, bool accumulate_dx = false,
                     const GemmSite& site = {}, const uint16_t* dy_bf16 = nullptr);

}  // namespace lattice
