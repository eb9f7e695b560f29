// Token + learned absolute position embedding (Megatron's LanguageModelEmbedding).
// N = B*T rows, C = hidden size.
#pragma once
#include <cstdint>

namespace lattice {

// out[n,:] = wte[tokens[n],:] + wpe[positions[n],:]          out: [N,C]
// wte: [V,C], wpe: [P,C] (wpe may be null: no position embedding).
void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions,
                       const float* wte, const float* wpe, int64_t N, int64_t C);

// dwte[tokens[n],:] += dout[n,:]; dwpe[positions[n],:] += dout[n,:]   (accumulates)
// Deterministic whatever the thread count (rows are summed in index order).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t N, int64_t C);

}  // namespace lattice
