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

// Megatron's vocab-parallel cross entropy as three local passes around the caller's
// communication. This rank holds logits [N, Vl] of vocabulary columns
// [vocab_begin, vocab_begin + Vl), of which the first `valid` are real (the rest padding).
// 1. row_max[n] = max of the valid local logits (-inf when valid == 0); then all-reduce MAX.
void vocab_parallel_ce_max(float* row_max, const float* logits, int64_t N, int64_t valid, int64_t Vl);
// 2. stats[2n] = sum over the valid local columns of exp(logit - row_max[n]),
//    stats[2n+1] = the target's logit when this rank holds it, else 0; then all-reduce SUM.
//    With store_exp the exponentials overwrite the logits (for step 3's backward).
void vocab_parallel_ce_partials(double* stats, float* logits, const float* row_max,
                                const int32_t* targets, int64_t vocab_begin, int64_t N,
                                int64_t valid, int64_t Vl, bool store_exp);
// 3. losses[n] = log(stats[2n]) + row_max[n] - stats[2n+1].
void vocab_parallel_ce_loss(float* losses, const double* stats, const float* row_max, int64_t N);
//    Backward, after step 2 with store_exp: dlogits[n, v] = (exp / stats[2n] -
//    [vocab_begin + v == target]) * grad_scale * loss_mask[n] for valid v, 0 for padding.
void vocab_parallel_ce_backward(float* exp_to_dlogits, const double* stats, const int32_t* targets,
                                const float* loss_mask, float grad_scale, int64_t vocab_begin,
                                int64_t N, int64_t valid, int64_t Vl);

}  // namespace lattice
