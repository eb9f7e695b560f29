// Softmax fused with cross entropy over the output layer's logits. The vocabulary is
// padded to Vp columns; only the first V take part in the softmax, so padding never
// changes a result (padded columns get zero gradient).
#pragma once
#include <cstdint>

#include "kernels/cast.h"

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
// round_logits: the output layer's GEMM result is read here unrounded
// (GemmSite::caller_rounds) and every logit is taken as round(logit), in steps 1 and 2.
// 1. row_max[n] = max of the valid local logits (-inf when valid == 0); then all-reduce MAX.
void vocab_parallel_ce_max(float* row_max, const float* logits, int64_t N, int64_t valid, int64_t Vl,
                           Rounding round_logits = Rounding::none);
// 2. stats[2n] = sum over the valid local columns of exp(logit - row_max[n]),
//    stats[2n+1] = the target's logit when this rank holds it, else 0; then all-reduce SUM.
//    With store_exp the exponentials overwrite the logits (for step 3's backward).
void vocab_parallel_ce_partials(double* stats, float* logits, const float* row_max,
                                const int32_t* targets, int64_t vocab_begin, int64_t N,
                                int64_t valid, int64_t Vl, bool store_exp,
                                Rounding round_logits = Rounding::none);
// 3. losses[n] = log(stats[2n]) + row_max[n] - stats[2n+1].
void vocab_parallel_ce_loss(float* losses, const double* stats, const float* row_max, int64_t N);
//    Backward, after step 2 with store_exp: dlogits[n, v] = (exp / stats[2n] -
//    [vocab_begin + v == target]) * grad_scale * loss_mask[n] for valid v, 0 for padding.
void vocab_parallel_ce_backward(float* exp_to_dlogits, const double* stats, const int32_t* targets,
                                const float* loss_mask, float grad_scale, int64_t vocab_begin,
                                int64_t N, int64_t valid, int64_t Vl);

// With the whole vocabulary on one rank (nothing to all-reduce between the steps): steps 1,
// 2 (vocab_begin 0; the exponentials stored with `backward`) and 3, and with `backward` the
// backward, row by row. Its bits are those of the four calls one after the other, with
// row_max and stats left as they leave them; the CPU sweeps the logits through memory once
// instead of three times (a GPU runs the four kernels).
void vocab_parallel_ce_fused(float* losses, float* logits_to_dlogits, float* row_max, double* stats,
                             const int32_t* targets, bool backward, const float* loss_mask, float grad_scale,
                             int64_t N, int64_t valid, int64_t Vl, Rounding round_logits = Rounding::none);

// The same on bf16 logits (their 16-bit patterns, [N, Vl] dense, as the bf16 policy's output
// layer writes them: GemmPolicy::forward_bf16), for the same results as the fp32 kernels on
// the widened values. Steps 1 and 2 read them (nothing is stored); the backward rewrites
// them in place as the bf16 gradient, the fp32 kernels' dlogits rounded to bf16:
//   dlogits[n, v] = bf16(exp(logit - row_max[n]) * (grad_scale * loss_mask[n] / stats[2n])
//                        - [vocab_begin + v == target] * grad_scale * loss_mask[n])
// (0 for the padding), with row_max and stats as steps 1 and 2 left them (all-reduced).
void vocab_parallel_ce_max_bf16(float* row_max, const uint16_t* logits, int64_t N, int64_t valid, int64_t Vl);
void vocab_parallel_ce_partials_bf16(double* stats, const uint16_t* logits, const float* row_max,
                                     const int32_t* targets, int64_t vocab_begin, int64_t N, int64_t valid,
                                     int64_t Vl);
void vocab_parallel_ce_backward_bf16(uint16_t* logits_to_dlogits, const float* row_max, const double* stats,
                                     const int32_t* targets, const float* loss_mask, float grad_scale,
                                     int64_t vocab_begin, int64_t N, int64_t valid, int64_t Vl);
// With the whole vocabulary on one rank (nothing to all-reduce between the steps): steps 1,
// 2 and 3, and with `backward` the backward, in one pass over each row. Its bits are those of
// vocab_parallel_ce_max_bf16, _partials_bf16 (vocab_begin 0), vocab_parallel_ce_loss and
// vocab_parallel_ce_backward_bf16 called one after the other, with row_max and stats left as
// they leave them. A GPU reads each row of logits from memory once instead of three times
// (the later reads of a row hit the cache).
void vocab_parallel_ce_fused_bf16(float* losses, uint16_t* logits_to_dlogits, float* row_max, double* stats,
                                  const int32_t* targets, bool backward, const float* loss_mask, float grad_scale,
                                  int64_t N, int64_t valid, int64_t Vl);

}  // namespace lattice
