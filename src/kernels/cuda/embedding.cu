// Token and position embeddings on the GPU. The backward sums each table row's terms in
// index order, so repeated tokens are summed in exactly the CPU's order (bit-identical
// results) with no atomics: with the rows grouped by index (RowGroups, made on the host), a
// block per group; without, one thread per column walking every row.
#include "kernels/cuda/launch.cuh"
#include "kernels/embedding_math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_reduce.cuh"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;

#define LATTICE_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// out: [N, C]; wpe may be null.
__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const int32_t* positions,
                                         const float* wte, const float* wpe, int64_t N, int64_t C) {
  LATTICE_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C;
    const float te = wte[int64_t(tokens[n]) * C + c];
    out[i] = wpe ? te + wpe[int64_t(positions[n]) * C + c] : te;
  }
}

__global__ void vocab_parallel_embedding_kernel(float* out, const int32_t* tokens, const float* wte_local,
                                                int64_t vocab_begin, int64_t Vl, int64_t N, int64_t C) {
  LATTICE_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C;
    const int64_t row = int64_t(tokens[n]) - vocab_begin;
    out[i] = row >= 0 && row < Vl ? wte_local[row * C + c] : 0.0f;
  }
}

__global__ void position_embedding_add_kernel(float* out, const int32_t* positions, const float* wpe,
                                              int64_t N, int64_t C) {
  LATTICE_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C;
    out[i] += wpe[int64_t(positions[n]) * C + c];
  }
}

// Each thread a column: blockIdx.y 0 of the token embedding's gradient, gridDim.y - 1 of the
// position embedding's (either may be null: none, or done by grouped_scatter_kernel).
__global__ void embedding_backward_kernel(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                          const int32_t* positions, int64_t N, int64_t C,
                                          int64_t vocab_begin, int64_t Vl) {
  LATTICE_GRID_STRIDE(c, C) {
    if (blockIdx.y == 0 && dwte) math::scatter_add_rows(dwte, dout, tokens, N, C, vocab_begin, Vl, c);
    if (blockIdx.y == gridDim.y - 1 && dwpe) math::scatter_add_rows(dwpe, dout, positions, N, C, 0, -1, c);
  }
}

// dst[v - begin, c] += dout[n, c] over the rows n of each group of g (rows of value v, in
// index order; values outside [begin, begin + V) skipped when V >= 0), a block per group
// and its threads over the columns: each (row, column) sums its terms in the order
// scatter_add_rows and the CPU do, and the groups run in parallel.
__global__ void grouped_scatter_kernel(float* dst, const float* dout, const int32_t* idx, RowGroups g, int64_t C,
                                       int64_t begin, int64_t V) {
  for (int64_t k = blockIdx.x; k < g.count; k += gridDim.x) {
    const int32_t s = g.starts[k], e = g.starts[k + 1];
    const int64_t row = int64_t(idx[g.order[s]]) - begin;
    if (V >= 0 && (row < 0 || row >= V)) continue;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float sum = dst[row * C + c];
      for (int32_t j = s; j < e; ++j) sum += dout[int64_t(g.order[j]) * C + c];
      dst[row * C + c] = sum;
    }
  }
}

#undef LATTICE_GRID_STRIDE

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions,
                       const float* wte, const float* wpe, int64_t N, int64_t C) {
  if (N <= 0 || C <= 0) return;
  launch(embedding_forward_kernel, grid_for(N * C, kThreads), kThreads, 0, out, tokens, positions, wte,
                                                                                 wpe, N, C);
  LATTICE_CUDA_LAUNCHED("embedding_forward");
}

void vocab_parallel_embedding_forward(float* out, const int32_t* tokens, const float* wte_local,
                                      int64_t vocab_begin, int64_t Vl, int64_t N, int64_t C) {
  if (N <= 0 || C <= 0) return;
  launch(vocab_parallel_embedding_kernel, grid_for(N * C, kThreads), kThreads, 0,
      out, tokens, wte_local, vocab_begin, Vl, N, C);
  LATTICE_CUDA_LAUNCHED("vocab_parallel_embedding_forward");
}

void position_embedding_add(float* out, const int32_t* positions, const float* wpe, int64_t N,
                            int64_t C) {
  if (N <= 0 || C <= 0) return;
  launch(position_embedding_add_kernel, grid_for(N * C, kThreads), kThreads, 0, out, positions, wpe, N, C);
  LATTICE_CUDA_LAUNCHED("position_embedding_add");
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t N, int64_t C, int64_t vocab_begin,
                        int64_t Vl, const EmbeddingRowGroups& groups) {
  if (N <= 0 || C <= 0) return;
  const bool by_token = groups.tokens.count > 0, by_position = !dwpe || groups.positions.count > 0;
  if (by_token) {
    launch(grouped_scatter_kernel, grid_rows(groups.tokens.count), 256, 0, dwte, dout, tokens, groups.tokens, C,
           vocab_begin, Vl);
    LATTICE_CUDA_LAUNCHED("embedding_backward (tokens)");
  }
  if (dwpe && by_position) {
    launch(grouped_scatter_kernel, grid_rows(groups.positions.count), 256, 0, dwpe, dout, positions, groups.positions, C,
           int64_t(0), int64_t(-1));
    LATTICE_CUDA_LAUNCHED("embedding_backward (positions)");
  }
  if (by_token && by_position) return;
  // Without groups: one thread per column walks every row.
  // 64-thread blocks spread the C columns over more SMs than 256-thread blocks would.
  float* te = by_token ? nullptr : dwte;
  float* pe = by_position ? nullptr : dwpe;
  const dim3 col_grid(grid_for(C, 64), te && pe ? 2u : 1u);
  launch(embedding_backward_kernel, col_grid, 64, 0, te, pe, dout, tokens, positions, N, C, vocab_begin, Vl);
  LATTICE_CUDA_LAUNCHED("embedding_backward");
}

}  // namespace lattice::cuda
