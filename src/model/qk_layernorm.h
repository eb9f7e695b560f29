// Megatron's --qk-layernorm (Megatron-Core's q_layernorm and k_layernorm): every query and key
// head vector of the fused qkv normalized over its D values before the rotary embedding, with
// the model's --normalization (LayerNorm or RMSNorm) and epsilon; one weight (and bias) [D]
// shared by every query head, another by every key head; the values are left as they are
// (Qwen3's q_norm and k_norm, OLMoE, ...).
//
// The fused layout (kernels/qkv_layout.h) interleaves a group's R query vectors with its key
// and value, so the norm gathers the vectors it normalizes with strided copies
// (copy_rows_on_device) into rows
//   qk [N H + N G, D]: the N H query rows (token-major; head h = g R + r), then the N G key rows,
// runs the LayerNorm kernels over each part (kernels/layernorm.h: the same code, bits and
// determinism on the CPU and the GPU), and scatters the result back. Under tensor
// parallelism H and G are the rank's heads and groups; the weights are replicated, and their
// gradients (sums over this rank's heads) are all-reduced over the tensor-parallel group
// (GPTModel::finish_tensor_parallel_grads).
#pragma once
#include <cstdint>

#include "kernels/layernorm.h"
#include "kernels/qkv_layout.h"

namespace lattice {

// The norms' parameters: weights [D], biases [D] (zeros with RMSNorm).
struct QkNormParams {
  const float* q_w = nullptr;
  const float* q_b = nullptr;
  const float* k_w = nullptr;
  const float* k_b = nullptr;
};

// Their gradients [D] each, accumulated (the biases' into a sink with RMSNorm).
struct QkNormGrads {
  float* q_w = nullptr;
  float* q_b = nullptr;
  float* k_w = nullptr;
  float* k_b = nullptr;
};

// Rows of the gathered q and k vectors for N tokens: N (H + G).
inline int64_t qk_norm_rows(int64_t N, const QkvLayout& layout) { return N * (layout.H + layout.G); }

// qkv [N, G, R + 2, D]: the queries and keys normalized in place. raw [rows, D] keeps them as
// they were (the backward's input), mean and rstd [rows] their statistics; tmp [rows, D] is
// scratch (rows = qk_norm_rows).
void qk_layernorm_forward(float* qkv, float* raw, float* mean, float* rstd, float* tmp, const QkNormParams& p,
                          int64_t N, const QkvLayout& layout, float eps, Normalization kind);

// dqkv [N, G, R + 2, D]: the queries' and keys' gradients after the norm replaced by their
// gradients before it (the values' untouched); g accumulates the weights' and biases'
// gradients. raw, mean, rstd: what the forward kept; d_tmp and dx_tmp [rows, D] scratch.
void qk_layernorm_backward(float* dqkv, const QkNormGrads& g, const float* raw, const float* mean, const float* rstd,
                           const QkNormParams& p, float* d_tmp, float* dx_tmp, int64_t N, const QkvLayout& layout,
                           Normalization kind);

}  // namespace lattice
