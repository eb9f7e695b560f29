// Token and position embeddings on the GPU. The backward gives each thread one column
// and walks the rows in index order, so repeated tokens are summed in exactly the CPU's
// order (bit-identical results) with no atomics.
#include "kernels/cuda/launch.cuh"
#include "kernels/embedding_math.h"
#include "kernels/cuda/ops.h"

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

// blockIdx.y 0: the token embedding's gradient, 1: the position embedding's.
__global__ void embedding_backward_kernel(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                          const int32_t* positions, int64_t N, int64_t C,
                                          int64_t vocab_begin, int64_t Vl) {
  LATTICE_GRID_STRIDE(c, C) {
    if (blockIdx.y == 0)
      math::scatter_add_rows(dwte, dout, tokens, N, C, vocab_begin, Vl, c);
    else
      math::scatter_add_rows(dwpe, dout, positions, N, C, 0, -1, c);
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
                        int64_t Vl) {
  if (N <= 0 || C <= 0) return;
  // 64-thread blocks spread the C columns over more SMs than 256-thread blocks would.
  const dim3 grid(grid_for(C, 64), dwpe ? 2u : 1u);
  launch(embedding_backward_kernel, grid, 64, 0, dwte, dwpe, dout, tokens, positions, N, C, vocab_begin,
                                                       Vl);
  LATTICE_CUDA_LAUNCHED("embedding_backward");
}

}  // namespace lattice::cuda
