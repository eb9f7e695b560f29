// The tensor-core flash attention (attention_mma.cu) that attention.cu's entry points use
// for AttentionMath::bf16 / fp16 where it applies (sm_80+, head dim 64 or 128, 16-byte
// aligned tensors); same layouts and outputs as kernels/attention.h. Device pointers.
#pragma once
#include <cstdint>

#include "kernels/attention.h"

namespace lattice::cuda {

// Whether the tensor-core kernels take this shape and these tensors (qkv, out, dout) on
// this device.
bool attention_mma_supported(const AttentionShape& s, const void* a, const void* b, const void* c);

void attention_forward_mma(float* out, float* lse, const AttentionOperand& qkv, const AttentionShape& s,
                           const AttentionDropout& drop, const int32_t* document_ids, AttentionMath math,
                           uint16_t* out_bf16);

void attention_backward_mma(float* dqkv, const AttentionOperand& dout, const AttentionOperand& qkv, const float* out, const float* lse,
                            const AttentionShape& s, const AttentionDropout& drop, const int32_t* document_ids,
                            AttentionMath math, uint16_t* dqkv_bf16, float* dbias);

}  // namespace lattice::cuda
