#include "model/linear.h"

#include "blas/gemm.h"
#include "core/error.h"
#include "kernels/elementwise.h"

namespace lattice {

const float* LinearInput::fp32(const char* where) const {
  LATTICE_CHECK(f32) << where << ": a bf16 linear input where fp32 values are needed";
  return f32;
}

const uint16_t* GemmPolicy::forward_bf16(int, float*, LinearInput, const float*, int64_t, int64_t, int64_t) {
  LATTICE_FAIL() << "mixed precision: this policy has no bf16 results";
}
void GemmPolicy::weight_grad_bf16(int, float*, const uint16_t*, LinearInput, int64_t, int64_t, int64_t) {
  LATTICE_FAIL() << "mixed precision: this policy has no bf16 output gradients";
}
void GemmPolicy::input_grad_bf16(int, float*, const uint16_t*, const float*, int64_t, int64_t, int64_t, bool) {
  LATTICE_FAIL() << "mixed precision: this policy has no bf16 output gradients";
}
const uint16_t* GemmPolicy::input_grad_packed(int, float*, const float*, const uint16_t*, const float*, int64_t,
                                              int64_t, int64_t) {
  LATTICE_FAIL() << "mixed precision: this policy has no bf16 results";
}

void round_and_add_bias(float* y, const float* b, int64_t rows, int64_t out, Rounding r) {
  if (b) bias_add(y, b, rows, out, r);
  else if (r != Rounding::none) round_to(y, y, rows * out, r);
}

void linear_forward(float* y, LinearInput x, const float* W, const float* b, int64_t N,
                    int64_t in, int64_t out, const GemmSite& site) {
  LATTICE_CHECK(!(site.caller_rounds && b)) << "linear_forward: a bias with a result the caller rounds";
  if (site.policy)
    site.policy->forward(site.param, y, x, W, N, in, out);
  else
    gemm_f32(Trans::N, Trans::T, N, out, in, 1.0f, x.fp32("linear_forward"), in, W, in, 0.0f, y, out);
  const Rounding r = site.partial_sum || site.caller_rounds ? Rounding::none : rounding(site);
  round_and_add_bias(y, b, N, out, r);
}

void linear_backward(float* dx, float* dW, float* db, const float* dy, LinearInput x,
                     const float* W, int64_t N, int64_t in, int64_t out, bool accumulate_dx,
                     const GemmSite& site, const uint16_t* dy_bf16) {
  LATTICE_CHECK(!dy_bf16 || (site.policy && site.policy->bf16_results()))
      << "linear_backward: a bf16 output gradient without a bf16 policy";
  LATTICE_CHECK(dy || (dy_bf16 && !db))
      << "linear_backward: without the fp32 output gradient, a bf16 one and no bias gradient";
  if (dy_bf16)
    site.policy->weight_grad_bf16(site.param, dW, dy_bf16, x, N, in, out);
  else if (site.policy)
    site.policy->weight_grad(site.param, dW, dy, x, N, in, out);
  else
    gemm_f32(Trans::T, Trans::N, out, in, N, 1.0f, dy, out, x.fp32("linear_backward"), in, 1.0f, dW, in);
  if (db) bias_backward(db, dy, N, out);
  if (!dx) return;
  if (site.packed_input_grad) {
    LATTICE_CHECK(site.policy && site.policy->bf16_results() && site.caller_rounds && !accumulate_dx)
        << "linear_backward: a packed input gradient needs a bf16 policy and caller rounding";
    site.policy->input_grad_packed(site.param, dx, dy, dy_bf16, W, N, in, out);
    return;
  }
  if (site.policy) {
    if (dy_bf16)
      site.policy->input_grad_bf16(site.param, dx, dy_bf16, W, N, in, out, accumulate_dx);
    else
      site.policy->input_grad(site.param, dx, dy, W, N, in, out, accumulate_dx);
    if (!site.partial_sum && !site.caller_rounds) site.policy->round_result(dx, N * in);
  } else
    gemm_f32(Trans::N, Trans::N, N, in, out, 1.0f, dy, out, W, in, accumulate_dx ? 1.0f : 0.0f, dx, in);
}

}  // namespace lattice
