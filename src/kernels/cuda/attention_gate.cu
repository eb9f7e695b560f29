// The attention output gate on the GPU (kernels/attention_gate.h): one thread per element of the
// attention output, the CPU's element math.
#include "kernels/attention_gate.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;

// Element i = (n H + h) D + d of the attention output: its gate's index in qkv.
__device__ __forceinline__ int64_t gate_at(const QkvLayout& L, int64_t i) {
  const int64_t d = i % L.D, nh = i / L.D, h = nh % L.H, n = nh / L.H;
  return n * L.width() + L.gate_slot(h) * L.D + d;
}

__global__ void output_gate_kernel(float* y, const float* o, const float* qkv, int64_t total, QkvLayout L) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = math::output_gate(o[i], qkv[gate_at(L, i)]);
}

__global__ void output_gate_backward_kernel(float* d_o, float* dqkv, const float* dy, const float* o,
                                            const float* qkv, int64_t total, QkvLayout L) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t g = gate_at(L, i);
    float dod, dg;
    math::output_gate_backward(o[i], qkv[g], dy[i], dod, dg);
    d_o[i] = dod;
    dqkv[g] = dg;
  }
}

}  // namespace

void attention_output_gate_forward(float* y, const float* o, const float* qkv, int64_t N, const QkvLayout& layout) {
  LATTICE_CHECK(layout.gated) << "attention_output_gate_forward (CUDA): qkv without gates";
  const int64_t total = N * layout.H * layout.D;
  if (total <= 0) return;
  launch(output_gate_kernel, grid_for(total, kThreads), kThreads, 0, y, o, qkv, total, layout);
  LATTICE_CUDA_LAUNCHED("attention_output_gate_forward");
}

void attention_output_gate_backward(float* d_o, float* dqkv, const float* dy, const float* o, const float* qkv,
                                    int64_t N, const QkvLayout& layout) {
  LATTICE_CHECK(layout.gated) << "attention_output_gate_backward (CUDA): qkv without gates";
  const int64_t total = N * layout.H * layout.D;
  if (total <= 0) return;
  launch(output_gate_backward_kernel, grid_for(total, kThreads), kThreads, 0, d_o, dqkv, dy, o, qkv, total, layout);
  LATTICE_CUDA_LAUNCHED("attention_output_gate_backward");
}

}  // namespace lattice::cuda
