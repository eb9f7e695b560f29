// Token + learned absolute position embedding (Megatron's LanguageModelEmbedding).
// N = B*T rows, C = hidden size.
#pragma once
#include <cstdint>

namespace lattice {

// out[n,:] = wte[tokens[n],:] + wpe[positions[n],:]          out: [N,C]
// wte: [V,C], wpe: [P,C] (wpe may be null: no position embedding).
void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions,
                       const float* wte, const float* wpe, int64_t N, int64_t C);

// Megatron's VocabParallelEmbedding lookup on one rank, which holds rows
// [vocab_begin, vocab_begin + Vl) of the table as wte_local [Vl, C]:
// out[n,:] = wte_local[tokens[n] - vocab_begin,:] when tokens[n] is in that range, else 0.
void vocab_parallel_embedding_forward(float* out, const int32_t* tokens, const float* wte_local,
                                      int64_t vocab_begin, int64_t Vl, int64_t N, int64_t C);

// out[n,:] += wpe[positions[n],:]
void position_embedding_add(float* out, const int32_t* positions, const float* wpe, int64_t N, int64_t C);

// dwte[tokens[n] - vocab_begin,:] += dout[n,:] for the tokens in [vocab_begin, vocab_begin + Vl)
// (Vl < 0: every token, vocab_begin 0); dwpe[positions[n],:] += dout[n,:] (dwpe may be
// null). Accumulates. Deterministic whatever the thread count (rows are summed in index
// order).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t N, int64_t C, int64_t vocab_begin = 0,
                        int64_t Vl = -1);

}  // namespace lattice
