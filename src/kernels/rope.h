// Rotary position embedding (RoPE; Megatron's --position-embedding-type rope): the q and k
// parts of a fused qkv [N, H, 3, D] (kernels/attention.h's layout) rotated in place, pair by
// pair, by angles that grow with the token's position; v is left as it is.
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

namespace lattice {

struct RopeTable {
  const float* cos = nullptr;  // [positions, half]
  const float* sin = nullptr;  // [positions, half]
  int64_t positions = 0;       // rows of the table: pos0 + T must not exceed it
  int64_t half = 0;            // rotated pairs per head (R / 2)
  bool interleaved = false;
};

// qkv [N, H, 3, D]: q and k rotated in place.
void rope_forward(float* qkv, const RopeTable& table, int64_t N, int64_t T, int64_t pos0, int64_t H, int64_t D);

// The gradient of rope_forward (positions pos0 = 0): dqkv's q and k parts rotated back (the
// transpose of each pair's rotation: the angle negated), in place; v's gradient untouched.
void rope_backward(float* dqkv, const RopeTable& table, int64_t N, int64_t T, int64_t H, int64_t D);

}  // namespace lattice
