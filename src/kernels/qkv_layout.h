// The fused QKV layer's output layout, per token: Megatron's grouped layout. The H query heads
// share G key/value heads (grouped-query attention, --num-query-groups G; R = H / G query heads
// per group); per token come, group by group, the group's R query vectors, then its key, then
// its value, D values each:
//   qkv [N, G, R + 2, D]
// Without grouping (G = H, R = 1) that is [N, H, 3, D]: each head's q, k and v side by side.
// Query head h = g R + r is query r of group g and attends with group g's key and value. The
// D-vectors of a token are its slots, H + 2G of them.
//
// With the attention output gate (Megatron's --attention-output-gate, `gated`), each group's R
// gate vectors follow its queries: qkv [N, G, 2R + 2, D] (per group R queries, R gates, key,
// value); gate r of group g scales the attention output of query head g R + r. H + H + 2G slots.
//
// The attention (kernels/attention.h), the rotary embedding (kernels/rope.h), the output gate
// (kernels/attention_gate.h) and the KV cache read this layout as the QKV GEMM writes it: a
// group's key and value are stored once, never copied per head.
#pragma once
#include <cstdint>

#include "core/hd.h"

namespace lattice {

struct QkvLayout {
  int64_t H = 0, G = 0, D = 0;  // query heads, key/value heads (groups), head dim
  bool gated = false;           // each group's R gate vectors after its queries

  LATTICE_HD int64_t R() const { return H / G; }                                // query heads per group
  LATTICE_HD int64_t group_slots() const { return (gated ? 2 : 1) * R() + 2; }  // D-vectors per group
  LATTICE_HD int64_t slots() const { return G * group_slots(); }                // D-vectors per token
  LATTICE_HD int64_t width() const { return slots() * D; }                      // values per token
  // The slot of group g's key (part 1) or value (part 2).
  LATTICE_HD int64_t kv_slot(int64_t g, int part) const { return g * group_slots() + group_slots() + part - 3; }
  // The slot of part (0 q, 1 k, 2 v) of query head h.
  LATTICE_HD int64_t slot(int64_t h, int part) const {
    const int64_t r = R(), g = h / r;
    return part == 0 ? g * group_slots() + h - g * r : kv_slot(g, part);
  }
  // The slot of query head h's gate (gated only).
  LATTICE_HD int64_t gate_slot(int64_t h) const { return slot(h, 0) + R(); }
  // Whether slot s is a query or a key (the parts the rotary embedding rotates), not a gate or value.
  LATTICE_HD bool query_or_key(int64_t s) const {
    const int64_t i = s % group_slots();
    return i < R() || i == group_slots() - 2;
  }
};

}  // namespace lattice
