// Grouped-query attention (Megatron's --group-query-attention --num-query-groups G): the H
// query heads share G key/value heads, R = H / G query heads per group. The QKV layer makes
// Megatron's grouped layout, per token and group the group's R query vectors, then its key and
// its value:
//   groups [N, G, R + 2, D]
// The attention kernels (kernels/attention.h) read the one-head-one-key layout qkv
// [N, H, 3, D]; gqa_expand makes it, giving head h = g R + r query r of group g and the group's
// key and value (as HuggingFace's repeat_kv), and gqa_reduce takes the gradient back. Without
// grouping (G = H, R = 1) the two layouts are the same.
#pragma once
#include <cstdint>

namespace lattice {

// qkv [N, G R, 3, D] from groups [N, G, R + 2, D].
void gqa_expand(float* qkv, const float* groups, int64_t N, int64_t G, int64_t R, int64_t D);

// The gradient of gqa_expand: dgroups [N, G, R + 2, D] (written, not accumulated) from dqkv
// [N, G R, 3, D]: each query's gradient is its head's; a group's key (value) gradient is the
// sum of its R heads' key (value) gradients, added in head order.
void gqa_reduce(float* dgroups, const float* dqkv, int64_t N, int64_t G, int64_t R, int64_t D);

}  // namespace lattice
