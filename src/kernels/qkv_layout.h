// The fused QKV layer's output layout, per token: Megatron's grouped layout. The H query heads
// share G key/value heads (grouped-query attention, --num-query-groups G; R = H / G query heads
// per group); per token come, group by group, the group's R query vectors, then its key, then
// its value, D values each:
//   qkv [N, G, R + 2, D]
// Without grouping (G = H, R = 1) that is [N, H, 3, D]: each head's q, k and v side by side.
// Query head h = g R + r is query r of group g and attends with group g's key and value. The
// D-vectors of a token are its slots, H + 2G of them.
//
// The attention (kernels/attention.h), the rotary embedding (kernels/rope.h) and the KV cache
// read this layout as the QKV GEMM writes it: a group's key and value are stored once, never
// copied per head.
#pragma once
#include <cstdint>

#include "core/hd.h"

namespace lattice {

struct QkvLayout {
  int64_t H = 0, G = 0, D = 0;  // query heads, key/value heads (groups), head dim

  LATTICE_HD int64_t R() const { return H / G; }              // query heads per group
  LATTICE_HD int64_t slots() const { return H + 2 * G; }      // D-vectors per token
  LATTICE_HD int64_t width() const { return slots() * D; }    // values per token
  // The slot of group g's key (part 1) or value (part 2).
  LATTICE_HD int64_t kv_slot(int64_t g, int part) const { return g * (R() + 2) + R() + part - 1; }
  // The slot of part (0 q, 1 k, 2 v) of query head h.
  LATTICE_HD int64_t slot(int64_t h, int part) const {
    const int64_t r = R(), g = h / r;
    return part == 0 ? g * (r + 2) + h - g * r : kv_slot(g, part);
  }
  // Whether slot s is a query or a key (the parts the rotary embedding rotates), not a value.
  LATTICE_HD bool query_or_key(int64_t s) const { return s % (R() + 2) != R() + 1; }
};

}  // namespace lattice
