#include "model/linear.h"

#include "blas/gemm.h"
#include "kernels/elementwise.h"

namespace lattice {

void linear_forward(float* y, const float* x, const float* W, const float* b, int64_t N,
                    int64_t in, int64_t out, const GemmSite& site) {
  if (site.policy) {
    site.policy->forward(site.param, y, x, W, N, in, out);
    if (!site.partial_sum) site.policy->round_result(y, N * out);
  } else
    gemm_f32(Trans::N, Trans::T, N, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
  if (b) bias_add(y, b, N, out);
}

void linear_backward(float* dx, float* dW, float* db, const float* dy, const float* x,
                     const float* W, int64_t N, int64_t in, int64_t out, bool accumulate_dx,
                     const GemmSite& site) {
  if (site.policy)
    site.policy->weight_grad(site.param, dW, dy, x, N, in, out);
  else
    gemm_f32(Trans::T, Trans::N, out, in, N, 1.0f, dy, out, x, in, 1.0f, dW, in);
  if (db) bias_backward(db, dy, N, out);
  if (!dx) return;
  if (site.policy) {
    site.policy->input_grad(site.param, dx, dy, W, N, in, out, accumulate_dx);
    if (!site.partial_sum) site.policy->round_result(dx, N * in);
  } else
    gemm_f32(Trans::N, Trans::N, N, in, out, 1.0f, dy, out, W, in, accumulate_dx ? 1.0f : 0.0f, dx, in);
}

}  // namespace lattice
