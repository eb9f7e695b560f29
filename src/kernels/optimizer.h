// Optimizer update kernels over contiguous ranges of the flat parameter buffer.
#pragma once
#include <cstdint>

namespace lattice {

// AdamW (decoupled weight decay, bias-corrected), as torch.optim.AdamW and
// Megatron's --optimizer adam compute it. step >= 1.
//   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
// grad_scale (gradient clipping's coefficient): the update uses g * grad_scale, rounded as a
// product of its own, the bits scale_inplace(g, grad_scale) would store before the update,
// without that pass over the gradients (g is not changed).
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step, float grad_scale = 1.0f);

// One range of the flat buffers for adamw_update_ranges: p[begin, begin + n) and g likewise,
// m and v from state_offset, with this range's learning rate and weight decay.
struct AdamwRange {
  int64_t begin = 0, n = 0, state_offset = 0;
  float lr = 0.0f, weight_decay = 0.0f;
};
// adamw_update on each range (ranges: a host array of count), in one pass: the bits of the
// calls one by one, with one kernel launch on a GPU instead of one per range (a model's
// parameters: the LayerNorms' and biases' ranges are small, and their launches would cost
// more than their bytes).
void adamw_update_ranges(float* p, const float* g, float* m, float* v, const AdamwRange* ranges, int64_t count,
                         float beta1, float beta2, float eps, int64_t step, float grad_scale = 1.0f);

// Where AdamW's moments live: fp32 arrays, or bf16 bit patterns (Megatron's precision-aware
// optimizer, --exp-avg-dtype / --exp-avg-sq-dtype bf16: half the optimizer state). Each
// element's step reads its moments exactly into fp32, runs adamw_update's fp32 step (the
// parameter's update uses the new moments before rounding) and stores them rounded to nearest
// even (kernels/optimizer_math.h adamw_step_stored).
struct AdamwMoments {
  void* m = nullptr;  // float[] or uint16_t[] (m_bf16)
  void* v = nullptr;  // float[] or uint16_t[] (v_bf16)
  bool m_bf16 = false, v_bf16 = false;
};
// adamw_update_ranges with the moments as stored; both fp32: the float overload's bits.
void adamw_update_ranges(float* p, const float* g, const AdamwMoments& moments, const AdamwRange* ranges,
                         int64_t count, float beta1, float beta2, float eps, int64_t step, float grad_scale = 1.0f);

// SGD with momentum and L2 weight decay, as torch.optim.SGD (dampening 0, Megatron --optimizer sgd):
//   g' = g + wd p;  buf = momentum * buf + g' (buf = g' on the first step);  p -= lr * buf
// grad_scale as for adamw_update.
void sgd_update(float* p, const float* g, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, bool first_step, float grad_scale = 1.0f);

// sum of squares, accumulated in double (for the global gradient norm).
double sum_of_squares(const float* x, int64_t n);
// Whether any x[i] is inf or nan (the fp16 loss scaler's overflow check).
bool any_non_finite(const float* x, int64_t n);
// How many x[i] are zero (+0 or -0): Megatron's --log-num-zeros-in-grad.
int64_t count_zeros(const float* x, int64_t n);

}  // namespace lattice
