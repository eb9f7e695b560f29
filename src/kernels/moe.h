// The token movement of a mixture-of-experts layer (model/moe_layer.h): the rows each expert
// reads gathered from the tokens, and the experts' outputs combined back per token, weighted
// by the router's probabilities. N tokens each routed to k experts make S = N k slots, grouped
// by expert: slot s holds token rows[s]; slot_of[t, j] is the slot of token t's j-th expert.
// Every output element is written by one thread in a fixed order (no atomics): the same bits
// whatever the thread count, on the CPU and the GPU.
#pragma once
#include <cstdint>

namespace lattice {

// xe [S, C]: xe[s] = x[rows[s]], x [N, C]; with w [S] (--moe-apply-probs-on-input's gates)
// xe[s] = w[s] x[rows[s]] (each product rounded on its own).
void moe_gather_rows(float* xe, const float* x, const int32_t* rows, int64_t S, int64_t C, const float* w = nullptr);

// out [N, C]: out[t] = (accumulate ? out[t] : 0) + sum_{j < k} w[slot_of[t, j]] ye[slot_of[t, j]],
// the j in order, a slot -1 (a dropped token's) left out; w null: weights 1 (the gather's
// backward: the gradients of a token's copies summed into its row).
void moe_combine(float* out, const float* ye, const int32_t* slot_of, const float* w, int64_t N, int64_t k, int64_t C,
                 bool accumulate);

// The gradients of moe_combine with weights, from dout [N, C]: d_ye[s] = w[s] dout[rows[s]]
// ([S, C], written; d_ye null: not made, w unread) and d_w[s] = dot(dout[rows[s]], ye[s]) ([S],
// written). With d_ye null it is also the weights' gradient of moe_gather_rows with weights:
// dout = its x, ye = the gradient of its xe.
void moe_combine_backward(float* d_ye, float* d_w, const float* dout, const float* ye, const float* w,
                          const int32_t* rows, int64_t S, int64_t C);

}  // namespace lattice
