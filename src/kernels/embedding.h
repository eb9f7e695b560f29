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

// The rows of an index array (tokens, positions) grouped by value: order [N] the row numbers
// sorted by their index, stably (each value's rows in index order), starts [count + 1] where
// each value's rows begin in order (starts[count] = N). A GPU's embedding_backward sums the
// groups in parallel, each group's rows in order: the same sums as row by row.
struct RowGroups {
  const int32_t* order = nullptr;
  const int32_t* starts = nullptr;
  int64_t count = 0;  // 0: no grouping given
};
struct EmbeddingRowGroups {
  RowGroups tokens, positions;
};
// The grouping of idx[0, N) into out[0, N + count + 1) as [order | starts] (a host
// function; out's first 2N + 1 entries are room enough). Returns count.
int64_t group_rows_by_index(const int32_t* idx, int64_t N, int32_t* out);

// dwte[tokens[n] - vocab_begin,:] += dout[n,:] for the tokens in [vocab_begin, vocab_begin + Vl)
// (Vl < 0: every token, vocab_begin 0); dwpe[positions[n],:] += dout[n,:] (dwpe may be
// null). Accumulates. Deterministic whatever the thread count (rows are summed in index
// order). groups: the rows grouped by token and by position (device memory), which a GPU
// uses to spread the work over the rows as well as the columns (the CPU has no use for them).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t N, int64_t C, int64_t vocab_begin = 0,
                        int64_t Vl = -1, const EmbeddingRowGroups& groups = {});

}  // namespace lattice
