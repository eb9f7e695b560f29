// CUDA twin of kernels/attention.h: causal flash attention, forward and backward, with
// the CPU kernel's definition (layout, lse, document masking, dropout masks drawn from
// the same Philox indices). Pointers are device pointers; launches are asynchronous on
// cuda::compute_stream(). fp32 in and out (qkv also packed: AttentionOperand); head dim D <= 256.
//
// qkv [B,T,G,R+2,D]   out, dout [B,T,H,D]   lse [B,H,T]   document_ids [B,T] or null
// dqkv [B,T,G,R+2,D] is written (not accumulated). Results are deterministic (no atomics).
// math bf16 / fp16 runs the tensor-core kernels (attention_mma.h) where they apply, else
// (and with LATTICE_CUDA_ATTENTION=fp32) the fp32 kernels of attention.cu.
#pragma once
#include <cstdint>

#include "kernels/attention.h"

namespace lattice::cuda {

void attention_forward(float* out, float* lse, const AttentionOperand& qkv, const AttentionShape& s,
                       const AttentionDropout& drop, const int32_t* document_ids = nullptr,
                       AttentionMath math = AttentionMath::fp32, uint16_t* out_bf16 = nullptr,
                       const ContextKeys* context = nullptr);

void attention_backward(float* dqkv, const AttentionOperand& dout, const AttentionOperand& qkv, const float* out,
                        const float* lse, const AttentionShape& s, const AttentionDropout& drop,
                        const int32_t* document_ids = nullptr, AttentionMath math = AttentionMath::fp32,
                        uint16_t* dqkv_bf16 = nullptr, float* dbias = nullptr, const ContextKeys* context = nullptr,
                        float* d_softmax_offset = nullptr);

// KV-cache decoding (kernels/attention.h), device pointers.
void kv_cache_append(float* k_cache, float* v_cache, const float* qkv, int64_t n, int64_t past,
                     const QkvLayout& layout, int64_t Tmax);
void cached_attention_forward(float* out, const float* qkv, const float* k_cache, const float* v_cache, int64_t n,
                              int64_t past, const QkvLayout& layout, int64_t Tmax, int64_t window,
                              const float* softmax_offset);

}  // namespace lattice::cuda
