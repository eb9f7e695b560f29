// Optimizer updates on the GPU with the CPU's per-element steps (kernels/optimizer_math.h),
// and the sum of squares for the gradient norm, in double, in a fixed reduction order.
#include <vector>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_reduce.cuh"
#include "kernels/optimizer_math.h"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;
// Fixed, device-independent: the partial sums (and so the result) do not depend on
// which GPU runs them.
constexpr int kSumBlocks = 512;

#define LATTICE_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// g[i] * scale rounded on its own (never contracted into the update's FMAs): the value
// scale_inplace would have stored; g[i] itself when scale is 1.
__device__ __forceinline__ float scaled_grad(const float* g, int64_t i, float scale) {
  return scale == 1.0f ? g[i] : __fmul_rn(g[i], scale);
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, math::AdamwScalars s,
                             float grad_scale) {
  LATTICE_GRID_STRIDE(i, n) {
    float pi = p[i], mi = m[i], vi = v[i];
    math::adamw_step(pi, scaled_grad(g, i, grad_scale), mi, vi, s);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

// adamw_update_ranges: the ranges' blocks one after the other, kRangeChunk elements a block;
// block_begin[k] is range k's first block (ascending; block_begin[count] the total).
constexpr int64_t kRangeChunk = 4 * kThreads;

struct DeviceAdamwRange {
  int64_t begin, n, state_offset, block_begin;
  math::AdamwScalars s;
};

// M, V: the moments' stored types (float, or uint16_t bf16 patterns: math::adamw_step_stored).
template <class M, class V>
__global__ void __launch_bounds__(kThreads)
    adamw_ranges_kernel(float* p, const float* g, M* m, V* v, const DeviceAdamwRange* ranges, int64_t count,
                        float grad_scale) {
  // The range of this block: the last whose first block is at or before it.
  int64_t lo = 0, hi = count - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (ranges[mid].block_begin <= int64_t(blockIdx.x)) lo = mid; else hi = mid - 1;
  }
  const DeviceAdamwRange& r = ranges[lo];
  const math::AdamwScalars s = r.s;
  const int64_t i0 = (int64_t(blockIdx.x) - r.block_begin) * kRangeChunk;
  for (int64_t j = threadIdx.x; j < kRangeChunk; j += kThreads) {
    const int64_t i = i0 + j;
    if (i >= r.n) break;
    const int64_t e = r.begin + i, st = r.state_offset + i;
    float pi = p[e];
    M mi = m[st];
    V vi = v[st];
    math::adamw_step_stored(pi, scaled_grad(g, e, grad_scale), mi, vi, s);
    p[e] = pi;
    m[st] = mi;
    v[st] = vi;
  }
}

__global__ void sgd_kernel(float* p, const float* g, int64_t n, float lr, float weight_decay, float grad_scale) {
  LATTICE_GRID_STRIDE(i, n) {
    float pi = p[i];
    math::sgd_step(pi, scaled_grad(g, i, grad_scale), lr, weight_decay);
    p[i] = pi;
  }
}

__global__ void sgd_momentum_kernel(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                                    float weight_decay, bool first_step, float grad_scale) {
  LATTICE_GRID_STRIDE(i, n) {
    float pi = p[i], bi = buf[i];
    math::sgd_momentum_step(pi, scaled_grad(g, i, grad_scale), bi, lr, momentum, weight_decay, first_step);
    p[i] = pi;
    buf[i] = bi;
  }
}

// partial[blockIdx.x] = sum of x^2 over this block's grid-stride elements (double).
__global__ void sum_sq_partial_kernel(double* partial, const float* x, int64_t n) {
  double s = 0.0;
  LATTICE_GRID_STRIDE(i, n) s += double(x[i]) * double(x[i]);
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// out[0] = sum of the kSumBlocks partials (one block).
__global__ void sum_partials_kernel(double* out, const double* partial) {
  double s = 0.0;
  for (int i = threadIdx.x; i < kSumBlocks; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = s;
}

// *flag |= 1 when an element is inf or nan (an integer OR: order-free).
__global__ void non_finite_kernel(int* flag, const float* x, int64_t n) {
  int bad = 0;
  LATTICE_GRID_STRIDE(i, n) bad |= !isfinite(x[i]);
  bad = block_reduce(bad, MaxOp{}, 0);
  if (threadIdx.x == 0 && bad) atomicOr(flag, 1);
}

// *count += the zeros among x (an integer sum: order-free).
__global__ void count_zeros_kernel(unsigned long long* count, const float* x, int64_t n) {
  unsigned long long zeros = 0;
  LATTICE_GRID_STRIDE(i, n) zeros += x[i] == 0.0f;
  zeros = block_sum(zeros);
  if (threadIdx.x == 0 && zeros) atomicAdd(count, zeros);
}

#undef LATTICE_GRID_STRIDE

}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
  LATTICE_CHECK(step >= 1) << "adamw_update: step " << step << " must be >= 1";
  if (n <= 0) return;
  const math::AdamwScalars s = math::adamw_scalars(lr, beta1, beta2, eps, weight_decay, step);
  launch(adamw_kernel, grid_for(n, kThreads), kThreads, 0, p, g, m, v, n, s, grad_scale);
  LATTICE_CUDA_LAUNCHED("adamw_update");
}

void adamw_update_ranges(float* p, const float* g, float* m, float* v, const AdamwRange* ranges, int64_t count,
                         float beta1, float beta2, float eps, int64_t step, float grad_scale) {
  cuda::adamw_update_ranges(p, g, AdamwMoments{m, v, false, false}, ranges, count, beta1, beta2, eps, step, grad_scale);
}

void adamw_update_ranges(float* p, const float* g, const AdamwMoments& mo, const AdamwRange* ranges, int64_t count,
                         float beta1, float beta2, float eps, int64_t step, float grad_scale) {
  LATTICE_CHECK(step >= 1) << "adamw_update_ranges: step " << step << " must be >= 1";
  // The ranges with their blocks and scalars, uploaded into a buffer kept for the next step
  // (the process's one device; the stream orders the next upload after this kernel).
  static std::vector<DeviceAdamwRange> table;
  static void* buffer = nullptr;
  static size_t capacity = 0;
  table.clear();
  int64_t blocks = 0;
  for (int64_t k = 0; k < count; ++k) {
    const AdamwRange& r = ranges[k];
    if (r.n <= 0) continue;
    table.push_back({r.begin, r.n, r.state_offset, blocks,
                     math::adamw_scalars(r.lr, beta1, beta2, eps, r.weight_decay, step)});
    blocks += (r.n + kRangeChunk - 1) / kRangeChunk;
  }
  if (table.empty()) return;
  LATTICE_CHECK(blocks <= 2147483647) << "adamw_update_ranges: " << blocks << " blocks";
  const size_t bytes = table.size() * sizeof(DeviceAdamwRange);
  if (bytes > capacity) {
    if (buffer) free_device(buffer);  // free_device synchronizes: the last kernel is done with it
    buffer = malloc_device(bytes);
    capacity = bytes;
  }
  // A pageable source: the copy is staged before the call returns, so table may change after.
  LATTICE_CUDA_CALL(cudaMemcpyAsync(buffer, table.data(), bytes, cudaMemcpyHostToDevice, stream()));
  const auto* table_d = static_cast<DeviceAdamwRange*>(buffer);
  const int64_t n = int64_t(table.size());
  auto* mf = static_cast<float*>(mo.m);
  auto* vf = static_cast<float*>(mo.v);
  auto* mb = static_cast<uint16_t*>(mo.m);
  auto* vb = static_cast<uint16_t*>(mo.v);
  if (!mo.m_bf16 && !mo.v_bf16)
    launch(adamw_ranges_kernel<float, float>, unsigned(blocks), kThreads, 0, p, g, mf, vf, table_d, n, grad_scale);
  else if (mo.m_bf16 && mo.v_bf16)
    launch(adamw_ranges_kernel<uint16_t, uint16_t>, unsigned(blocks), kThreads, 0, p, g, mb, vb, table_d, n,
           grad_scale);
  else if (mo.m_bf16)
    launch(adamw_ranges_kernel<uint16_t, float>, unsigned(blocks), kThreads, 0, p, g, mb, vf, table_d, n, grad_scale);
  else
    launch(adamw_ranges_kernel<float, uint16_t>, unsigned(blocks), kThreads, 0, p, g, mf, vb, table_d, n, grad_scale);
  LATTICE_CUDA_LAUNCHED("adamw_update_ranges");
}

void sgd_update(float* p, const float* g, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, bool first_step, float grad_scale) {
  if (momentum == 0.0f || momentum_buf == nullptr) {
    LATTICE_CHECK(momentum == 0.0f) << "sgd_update: momentum " << momentum << " needs a buffer";
    if (n <= 0) return;
    launch(sgd_kernel, grid_for(n, kThreads), kThreads, 0, p, g, n, lr, weight_decay, grad_scale);
  } else {
    if (n <= 0) return;
    launch(sgd_momentum_kernel, grid_for(n, kThreads), kThreads, 0, p, g, momentum_buf, n, lr, momentum,
           weight_decay, first_step, grad_scale);
  }
  LATTICE_CUDA_LAUNCHED("sgd_update");
}

double sum_of_squares(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  double* scratch = nullptr;  // [kSumBlocks partials, 1 result]
  LATTICE_CUDA_CALL(cudaMallocAsync(reinterpret_cast<void**>(&scratch), (kSumBlocks + 1) * sizeof(double), stream()));
  launch(sum_sq_partial_kernel, kSumBlocks, kThreads, 0, scratch, x, n);
  LATTICE_CUDA_LAUNCHED("sum_of_squares");
  launch(sum_partials_kernel, 1, kThreads, 0, scratch + kSumBlocks, scratch);
  LATTICE_CUDA_LAUNCHED("sum_of_squares (final)");
  double result = 0.0;
  LATTICE_CUDA_CALL(cudaMemcpyAsync(&result, scratch + kSumBlocks, sizeof(double), cudaMemcpyDeviceToHost, stream()));
  LATTICE_CUDA_CALL(cudaFreeAsync(scratch, stream()));
  LATTICE_CUDA_CALL(cudaStreamSynchronize(stream()));
  return result;
}

int64_t count_zeros(const float* x, int64_t n) {
  if (n <= 0) return 0;
  unsigned long long* count = nullptr;
  LATTICE_CUDA_CALL(cudaMallocAsync(reinterpret_cast<void**>(&count), sizeof(*count), stream()));
  LATTICE_CUDA_CALL(cudaMemsetAsync(count, 0, sizeof(*count), stream()));
  const int64_t blocks = grid_for(n, kThreads);
  launch(count_zeros_kernel, unsigned(blocks < kSumBlocks ? blocks : kSumBlocks), kThreads, 0, count, x, n);
  LATTICE_CUDA_LAUNCHED("count_zeros");
  unsigned long long result = 0;
  LATTICE_CUDA_CALL(cudaMemcpyAsync(&result, count, sizeof(result), cudaMemcpyDeviceToHost, stream()));
  LATTICE_CUDA_CALL(cudaFreeAsync(count, stream()));
  LATTICE_CUDA_CALL(cudaStreamSynchronize(stream()));
  return int64_t(result);
}

bool any_non_finite(const float* x, int64_t n) {
  if (n <= 0) return false;
  int* flag = nullptr;
  LATTICE_CUDA_CALL(cudaMallocAsync(reinterpret_cast<void**>(&flag), sizeof(int), stream()));
  LATTICE_CUDA_CALL(cudaMemsetAsync(flag, 0, sizeof(int), stream()));
  const int64_t blocks = grid_for(n, kThreads);
  launch(non_finite_kernel, unsigned(blocks < kSumBlocks ? blocks : kSumBlocks), kThreads, 0, flag, x, n);
  LATTICE_CUDA_LAUNCHED("any_non_finite");
  int result = 0;
  LATTICE_CUDA_CALL(cudaMemcpyAsync(&result, flag, sizeof(int), cudaMemcpyDeviceToHost, stream()));
  LATTICE_CUDA_CALL(cudaFreeAsync(flag, stream()));
  LATTICE_CUDA_CALL(cudaStreamSynchronize(stream()));
  return result != 0;
}

}  // namespace lattice::cuda
