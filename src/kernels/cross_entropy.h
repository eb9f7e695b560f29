// Softmax fused with cross entropy over the output layer's logits. The vocabulary is
// padded to Vp columns; only the first V take part in the softmax, so padding never
// changes a result (padded columns get zero gradient).
#pragma once
#include <cstdint>

namespace lattice {

// losses[n] = logsumexp(logits[n, :V]) - logits[n, target[n]]      logits: [N, Vp]
void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t N,
                           int64_t V, int64_t Vp);

// Fused forward + backward, in place: computes losses[n] as above, then overwrites
// logits with dlogits[n, v] = (softmax(v) - [v == target]) * grad_scale * loss_mask[n]
// for v < V, and 0 for the padded columns. loss_mask may be null (all ones).
void cross_entropy_forward_backward(float* logits_to_dlogits, float* losses,
                                    const int32_t* targets, const float* loss_mask,
                                    float grad_scale, int64_t N, int64_t V, int64_t Vp);

}  // namespace lattice
