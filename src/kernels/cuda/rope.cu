// The rotary position embedding on the GPU (kernels/rope.h): one thread per rotated pair
// of a query or key, a grid-stride loop over the N x (H + G) x half pairs; the pair's arithmetic is
// the CPU kernel's (kernels/rope_math.h).
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/rope_math.h"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;

// sign 1: forward rotation; -1: its inverse (the gradient).
__global__ void rope_kernel(float* qkv, RopeTable t, int64_t N, int64_t T, int64_t pos0, QkvLayout L, float sign) {
  const int64_t rotated = L.H + L.G, pairs = N * rotated * t.half;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < pairs; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % t.half, vec = e / t.half;  // vec = n * (H + G) + v
    const int64_t n = vec / rotated;
    const int64_t pos = pos0 + n % T;
    float* x = qkv + n * L.width() + rope_slot(L, vec % rotated) * L.D;
    math::rope_rotate(x, math::rope_first(d, t.half, t.interleaved), math::rope_second(d, t.half, t.interleaved),
                      t.cos[pos * t.half + d], sign * t.sin[pos * t.half + d]);
  }
}

void run(float* qkv, const RopeTable& t, int64_t N, int64_t T, int64_t pos0, const QkvLayout& L, float sign) {
  const int64_t pairs = N * (L.H + L.G) * t.half;
  if (pairs <= 0) return;
  launch(rope_kernel, grid_for(pairs, kThreads), kThreads, 0, qkv, t, N, T, pos0, L, sign);
}

}  // namespace

void rope_forward(float* qkv, const RopeTable& table, int64_t N, int64_t T, int64_t pos0, const QkvLayout& layout) {
  run(qkv, table, N, T, pos0, layout, 1.0f);
  LATTICE_CUDA_LAUNCHED("rope_forward");
}

void rope_backward(float* dqkv, const RopeTable& table, int64_t N, int64_t T, const QkvLayout& layout) {
  run(dqkv, table, N, T, 0, layout, -1.0f);
  LATTICE_CUDA_LAUNCHED("rope_backward");
}

}  // namespace lattice::cuda
