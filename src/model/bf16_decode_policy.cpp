#include "model/bf16_decode_policy.h"

#include "blas/gemm.h"
#include "core/error.h"
#include "kernels/cast.h"

namespace lattice {

void Bf16DecodePolicy::forward(int, float* y, LinearInput x, const float* W, int64_t N, int64_t in, int64_t out) {
  auto [it, fresh] = weights_.try_emplace(W);
  if (fresh) {
    cast_fp32_to_bf16(it->second.resize(size_t(out * in)), W, out * in);
    bytes_ += size_t(out * in) * sizeof(uint16_t);
  }
  cast_fp32_to_bf16(x_.resize(size_t(N * in)), x.fp32("bf16 decoding"), N * in);
  gemm_bf16_few_rows(Trans::N, Trans::T, N, out, in, 1.0f, x_.data(), in, it->second.data(), in, 0.0f, y, out);
}

void Bf16DecodePolicy::weight_grad(int, float*, const float*, LinearInput, int64_t, int64_t, int64_t) {
  LATTICE_FAIL() << "bf16 decoding has no backward";
}

void Bf16DecodePolicy::input_grad(int, float*, const float*, const float*, int64_t, int64_t, int64_t, bool) {
  LATTICE_FAIL() << "bf16 decoding has no backward";
}

}  // namespace lattice
