// Decoding with bf16 weights (`lattice generate --bf16`): a GEMM policy for GPTInference's linear layers
// (forward only). Each weight is rounded to bf16 once, at its first use (kept by address: the model must
// not change meanwhile), each input rounded to bf16, and the products summed in fp32 by
// gemm_bf16_few_rows: a decode step is memory-bound, and bf16 weights are half the bytes it reads. The
// results and biases stay fp32.
#pragma once
#include <cstdint>
#include <map>
#include <memory>

#include "core/storage.h"
#include "model/linear.h"

namespace lattice {

class Bf16DecodePolicy final : public GemmPolicy {
 public:
  void forward(int param, float* y, LinearInput x, const float* W, int64_t N, int64_t in, int64_t out) override;
  // Inference only: training's gradients are refused.
  void weight_grad(int param, float* dW, const float* dy, LinearInput x, int64_t N, int64_t in,
                   int64_t out) override;
  void input_grad(int param, float* dx, const float* dy, const float* W, int64_t N, int64_t in, int64_t out,
                  bool accumulate) override;
  // The bf16 weights made so far, and their bytes.
  size_t weights() const { return weights_.size(); }
  size_t weight_bytes() const { return bytes_; }

 private:
  std::map<const float*, DeviceArray<uint16_t>> weights_;
  DeviceArray<uint16_t> x_;  // the input rounded to bf16
  size_t bytes_ = 0;
};

}  // namespace lattice
