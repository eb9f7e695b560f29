// CUDA twin of kernels/attention.h: causal flash attention, forward and backward, with
// the CPU kernel's definition (layout, lse, document masking, dropout masks drawn from
// the same Philox indices). Pointers are device pointers; launches are asynchronous on
// cuda::compute_stream(). fp32 in and out; head dim D <= 128.
//
// qkv [B,T,H,3,D]   out, dout [B,T,H,D]   lse [B,H,T]   document_ids [B,T] or null
// dqkv [B,T,H,3,D] is written (not accumulated). Results are deterministic (no atomics).
#pragma once
#include <cstdint>

#include "kernels/attention.h"

namespace lattice::cuda {

void attention_forward(float* out, float* lse, const float* qkv, const AttentionShape& s,
                       const AttentionDropout& drop, const int32_t* document_ids = nullptr);

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, const AttentionShape& s, const AttentionDropout& drop,
                        const int32_t* document_ids = nullptr);

}  // namespace lattice::cuda
