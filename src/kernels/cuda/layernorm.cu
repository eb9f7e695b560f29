// LayerNorm on the GPU: one block per row for the statistics and dx; dw, db through
// deterministic column sums (fixed row chunks, added in chunk order).
#include "kernels/cast_math.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_reduce.cuh"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;

// Two-pass statistics as on the CPU (mean, then the mean squared deviation); out in fp32 or
// bf16.
template <class T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const float* x,
                                         const float* w, const float* b, int64_t N, int64_t C,
                                         float eps) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* x_n = x + n * C;
    T* o_n = out + n * C;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += x_n[c];
    const float m = block_sum(s) / float(C);
    float q = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float d = x_n[c] - m;
      q += d * d;
    }
    const float var = block_sum(q) / float(C);
    const float r = 1.0f / sqrtf(var + eps);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) math::store_as(o_n, c, (x_n[c] - m) * r * w[c] + b[c]);
    if (threadIdx.x == 0) {
      mean[n] = m;
      rstd[n] = r;
    }
  }
}

// dx[n, k] += r * (dout w - mean(dout w) - xhat * mean(dout w xhat))
// (dout rounded as it is read: round_dout)
__global__ void layernorm_backward_dx_kernel(float* dx, const float* dout, const float* x,
                                             const float* w, const float* mean, const float* rstd,
                                             int64_t N, int64_t C, Rounding round_dout) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* x_n = x + n * C;
    const float* d_n = dout + n * C;
    float* dx_n = dx + n * C;
    const float m = mean[n], r = rstd[n];
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float g = math::round_as(d_n[c], round_dout) * w[c];
      sg += g;
      sgx += g * (x_n[c] - m) * r;
    }
    const float mean_g = block_sum(sg) / float(C);
    const float mean_gx = block_sum(sgx) / float(C);
    for (int64_t k = threadIdx.x; k < C; k += blockDim.x) {
      const float xhat = (x_n[k] - m) * r;
      dx_n[k] += r * (math::round_as(d_n[k], round_dout) * w[k] - mean_g - xhat * mean_gx);
    }
  }
}

// (dout * xhat, dout) at (n, c) for the dw, db column sums.
struct LayernormParamGrads {
  const float* dout;
  const float* x;
  const float* mean;
  const float* rstd;
  int64_t C;
  Rounding round_dout;
  __device__ void operator()(int64_t n, int64_t c, float v[2]) const {
    const float d = math::round_as(dout[n * C + c], round_dout);
    v[0] = d * (x[n * C + c] - mean[n]) * rstd[n];
    v[1] = d;
  }
};

}  // namespace

namespace {
template <class T>
void launch_layernorm_forward(T* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                              int64_t N, int64_t C, float eps, const char* what) {
  if (N <= 0) return;
  LATTICE_CHECK(C > 0) << what << ": C " << C;
  launch(layernorm_forward_kernel<T>, grid_rows(N), kThreads, 0, out, mean, rstd, x, w, b, N, C, eps);
  LATTICE_CUDA_LAUNCHED(what);
}
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C, float eps) {
  launch_layernorm_forward(out, mean, rstd, x, w, b, N, C, eps, "layernorm_forward");
}

void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* x, const float* w,
                            const float* b, int64_t N, int64_t C, float eps) {
  launch_layernorm_forward(out, mean, rstd, x, w, b, N, C, eps, "layernorm_forward_bf16");
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t N,
                        int64_t C, Rounding round_dout) {
  if (N <= 0 || C <= 0) return;
  launch(layernorm_backward_dx_kernel, grid_rows(N), kThreads, 0, dx, dout, x, w, mean, rstd, N, C, round_dout);
  LATTICE_CUDA_LAUNCHED("layernorm_backward dx");
  column_sums_accumulate<2>(ColumnOutputs{{dw, db}}, LayernormParamGrads{dout, x, mean, rstd, C, round_dout}, N, C,
                            "layernorm_backward dw/db");
}

}  // namespace lattice::cuda
