// Rotary position embedding (RoPE; Megatron's --position-embedding-type rope): the queries and
// keys of a fused qkv [N, G, R + 2, D] (kernels/qkv_layout.h: H query vectors and G keys per
// token) rotated in place, pair by pair, by angles that grow with the token's position; the
// values are left as they are.
//
// Row n is token t = n % T of its sequence, at position pos0 + t (Megatron numbers the
// positions 0..T-1 whatever --reset-position-ids says; pos0 > 0 is generation with a KV
// cache). Of each head's D values the first R = 2 * half are rotated and the rest pass
// through (--rotary-percent). The pairs, for d < half:
//   non-interleaved (rotate_half, Megatron's default): (d, d + half)
//   interleaved (--rotary-interleaved):                (2d, 2d + 1)
// and pair (x, y) at angle a = angle(pos, d) becomes (x cos a - y sin a, y cos a + x sin a).
// The table (model/rotary_embedding.h) holds cos a and sin a for every position and pair.
#pragma once
#include <cstdint>

#include "kernels/qkv_layout.h"

namespace lattice {

struct RopeTable {
  const float* cos = nullptr;  // [positions, half]
  const float* sin = nullptr;  // [positions, half]
  int64_t positions = 0;       // rows of the table: pos0 + T must not exceed it
  int64_t half = 0;            // rotated pairs per head (R / 2)
  bool interleaved = false;
};

// The H + G rotated vectors of a token: vector v is slot rope_slot(layout, v), query v % (R + 1)
// of group v / (R + 1), or the group's key when v % (R + 1) = R (the gates and values are not rotated).
LATTICE_HD inline int64_t rope_slot(const QkvLayout& layout, int64_t v) {
  const int64_t per_group = layout.R() + 1, g = v / per_group, j = v % per_group;
  return j < layout.R() ? g * layout.group_slots() + j : layout.kv_slot(g, 1);
}

// qkv [N, G, R + 2, D]: queries and keys rotated in place.
void rope_forward(float* qkv, const RopeTable& table, int64_t N, int64_t T, int64_t pos0, const QkvLayout& layout);

// The gradient of rope_forward (positions pos0 = 0): dqkv's q and k parts rotated back (the
// transpose of each pair's rotation: the angle negated), in place; the values' gradients untouched.
void rope_backward(float* dqkv, const RopeTable& table, int64_t N, int64_t T, const QkvLayout& layout);

}  // namespace lattice
