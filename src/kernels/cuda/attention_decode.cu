// KV-cache decoding attention on the GPU (kernels/attention.h): one block per (query,
// head); the scores in shared memory, block-wide max and sum in a fixed order, then each
// output element summed over the keys in order by one thread. Decoding is memory-bound on
// the cache reads; this is the simple form (a split-K version would spread long contexts).
#include "kernels/cuda/attention.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_reduce.cuh"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 128;

// One thread per element of the n x G new cache rows (group g's key and value of token r).
__global__ void kv_cache_append_kernel(float* k_cache, float* v_cache, const float* qkv, int64_t n, int64_t past,
                                       QkvLayout L, int64_t Tmax) {
  const int64_t D = L.D, total = n * L.G * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % D, g = (i / D) % L.G, r = i / (D * L.G);
    const float* src = qkv + r * L.width() + L.kv_slot(g, 1) * D;  // the group's key; its value at + D
    const int64_t at = (g * Tmax + past + r) * D + d;
    k_cache[at] = src[d];
    v_cache[at] = src[D + d];
  }
}

// One block per (query r, head h), reading head h's group's cache rows.
__global__ void cached_attention_kernel(float* out, const float* qkv, const float* k_cache, const float* v_cache,
                                        int64_t past, QkvLayout L, int64_t Tmax, int64_t window, float scale,
                                        const float* sink) {
  LATTICE_DYNAMIC_SHARED(float, s);  // [past + r + 1] scores
  const int64_t H = L.H, D = L.D;
  const int64_t r = blockIdx.x / H, h = blockIdx.x % H, g = h / L.R();
  const int64_t last = past + r;
  const int64_t first = window < 0 || last <= window ? 0 : last - window;  // the window's first key
  const float* q = qkv + r * L.width() + L.slot(h, 0) * D;
  const float* k = k_cache + g * Tmax * D;
  const float* v = v_cache + g * Tmax * D;
  float mx = -INFINITY;
  for (int64_t t = first + threadIdx.x; t <= last; t += blockDim.x) {
    float dot = 0.0f;
    for (int64_t d = 0; d < D; ++d) dot += q[d] * k[t * D + d];
    s[t] = dot * scale;
    mx = fmaxf(mx, s[t]);
  }
  mx = block_reduce(mx, MaxOp{}, -INFINITY);
  if (sink) mx = fmaxf(mx, sink[h]);  // the head's sink logit: in the max and the sum, with no value
  float sum = 0.0f;
  for (int64_t t = first + threadIdx.x; t <= last; t += blockDim.x) {
    s[t] = expf(s[t] - mx);
    sum += s[t];
  }
  sum = block_sum(sum);  // also orders the writes of s before the reads below
  if (sink) sum += expf(sink[h] - mx);
  const float inv = 1.0f / sum;
  float* o = out + (r * H + h) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t t = first; t <= last; ++t) acc += s[t] * v[t * D + d];
    o[d] = acc * inv;
  }
}

// The launch's dynamic shared memory (the scores, past + n floats) must fit beside the
// kernel's static reduction scratch: by default both together get 48 KiB; above that the
// kernel opts in, once, to the device's per-block maximum (227 KiB on Hopper).
void reserve_scores(size_t bytes, int64_t context) {
  static int allowed = -1;       // dynamic bytes the kernel may use without a new opt-in
  static size_t max_dynamic = 0;  // the device's per-block maximum less the static scratch
  if (allowed < 0) {
    cudaFuncAttributes attr{};
    LATTICE_CUDA_CALL(cudaFuncGetAttributes(&attr, cached_attention_kernel));
    int optin = 0;
    LATTICE_CUDA_CALL(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, current_device()));
    allowed = attr.maxDynamicSharedSizeBytes;
    max_dynamic = size_t(optin) - attr.sharedSizeBytes;
  }
  LATTICE_CHECK(bytes <= max_dynamic) << "cached_attention_forward: a context of " << context << " tokens needs "
                                      << bytes << " bytes of shared memory; this GPU allows " << max_dynamic;
  if (bytes > size_t(allowed)) {
    LATTICE_CUDA_CALL(cudaFuncSetAttribute(cached_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(max_dynamic)));
    allowed = int(max_dynamic);
  }
}

}  // namespace

void kv_cache_append(float* k_cache, float* v_cache, const float* qkv, int64_t n, int64_t past,
                     const QkvLayout& layout, int64_t Tmax) {
  if (n <= 0) return;
  LATTICE_CHECK(past + n <= Tmax) << "kv_cache_append: " << past << " + " << n << " rows exceed " << Tmax;
  launch(kv_cache_append_kernel, grid_for(n * layout.G * layout.D, 256), 256, 0, k_cache, v_cache, qkv, n, past,
         layout, Tmax);
  LATTICE_CUDA_LAUNCHED("kv_cache_append");
}

void cached_attention_forward(float* out, const float* qkv, const float* k_cache, const float* v_cache, int64_t n,
                              int64_t past, const QkvLayout& layout, int64_t Tmax, int64_t window,
                              const float* softmax_offset) {
  const int64_t H = layout.H;
  if (n <= 0) return;
  const size_t shared = size_t(past + n) * sizeof(float);
  reserve_scores(shared, past + n);
  LATTICE_CHECK(n * H < (int64_t(1) << 31)) << "cached_attention_forward: too many (query, head) pairs";
  launch(cached_attention_kernel, unsigned(n * H), kThreads, shared, out, qkv, k_cache, v_cache, past, layout, Tmax,
         window, 1.0f / sqrtf(float(layout.D)), softmax_offset);
  LATTICE_CUDA_LAUNCHED("cached_attention_forward");
}

}  // namespace lattice::cuda
