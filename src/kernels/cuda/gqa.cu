// Grouped-query attention's layout changes on the GPU: one thread per output element, the
// key and value gradients summed over a group's heads in head order (the CPU's sums).
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;

// Element i of qkv [N, H, 3, D] (H = G R) from groups [N, G, R + 2, D].
__global__ void gqa_expand_kernel(float* qkv, const float* groups, int64_t N, int64_t G, int64_t R, int64_t D) {
  const int64_t total = N * G * R * 3 * D;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % D, part = i / D % 3, h = i / (3 * D) % (G * R), n = i / (3 * D * G * R);
    const int64_t g = h / R, r = h % R;
    const int64_t slot = part == 0 ? r : R + part - 1;  // q_r, or the group's k (v)
    qkv[i] = groups[((n * G + g) * (R + 2) + slot) * D + d];
  }
}

// Element i of dgroups [N, G, R + 2, D] from dqkv [N, G R, 3, D].
__global__ void gqa_reduce_kernel(float* dgroups, const float* dqkv, int64_t N, int64_t G, int64_t R, int64_t D) {
  const int64_t total = N * G * (R + 2) * D;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % D, slot = i / D % (R + 2), g = i / (D * (R + 2)) % G, n = i / (D * (R + 2) * G);
    const float* head0 = dqkv + (n * G * R + g * R) * 3 * D;
    if (slot < R) {
      dgroups[i] = head0[slot * 3 * D + d];
    } else {
      const int64_t part = slot - R + 1;  // 1: k, 2: v
      float s = head0[part * D + d];
      for (int64_t r = 1; r < R; ++r) s += head0[(r * 3 + part) * D + d];
      dgroups[i] = s;
    }
  }
}

}  // namespace

void gqa_expand(float* qkv, const float* groups, int64_t N, int64_t G, int64_t R, int64_t D) {
  const int64_t n = N * G * R * 3 * D;
  if (n <= 0) return;
  launch(gqa_expand_kernel, grid_for(n, kThreads), kThreads, 0, qkv, groups, N, G, R, D);
  LATTICE_CUDA_LAUNCHED("gqa_expand");
}

void gqa_reduce(float* dgroups, const float* dqkv, int64_t N, int64_t G, int64_t R, int64_t D) {
  const int64_t n = N * G * (R + 2) * D;
  if (n <= 0) return;
  launch(gqa_reduce_kernel, grid_for(n, kThreads), kThreads, 0, dgroups, dqkv, N, G, R, D);
  LATTICE_CUDA_LAUNCHED("gqa_reduce");
}

}  // namespace lattice::cuda
