// The attention output gate (Megatron's --attention-output-gate, the gated attention of Qwen3-Next
// and Qwen3.5): the core attention's output o of query head h is scaled, element by element, by
// sigmoid of the head's gate vector g, which the QKV layer makes beside the query (QkvLayout::gated):
//   y[n, h, d] = o[n, h, d] sigmoid(g[n, h, d])
// and y goes to linear_proj. The element math is here (host and device); the CPU kernels are in
// kernels/cpu/attention_gate.cpp, their CUDA twins in kernels/cuda/attention_gate.cu.
#pragma once
#include <cstdint>

#include "core/hd.h"
#include "kernels/activation_math.h"
#include "kernels/qkv_layout.h"

namespace lattice {

namespace math {
LATTICE_HD inline float output_gate(float o, float g) { return o * sigmoid(g); }
// The gradients of y = o s, s = sigmoid(g), times dy: do = dy s, dg = dy o s (1 - s).
LATTICE_HD inline void output_gate_backward(float o, float g, float dy, float& d_o, float& dg) {
  const float s = sigmoid(g);
  d_o = dy * s;
  dg = dy * o * (s * (1.0f - s));
}
}  // namespace math

// y [N, H, D] from the attention output o [N, H, D] and the gates in qkv [N, G, 2R + 2, D]
// (layout.gated). y may alias o.
void attention_output_gate_forward(float* y, const float* o, const float* qkv, int64_t N, const QkvLayout& layout);
// From dy [N, H, D], o and qkv as in the forward: d_o [N, H, D] (written; may alias dy) and the gates'
// gradients into dqkv's gate slots [N, G, 2R + 2, D] (written; its other slots are left as they are).
void attention_output_gate_backward(float* d_o, float* dqkv, const float* dy, const float* o, const float* qkv,
                                    int64_t N, const QkvLayout& layout);

}  // namespace lattice
