// Multi-latent attention (--multi-latent-attention; Megatron-Core's MLASelfAttention, DeepSeek-V2/V3's
// attention): the queries, keys and values of a layer come from low-rank latents, and are written into
// the fused qkv layout (kernels/qkv_layout.h, one group per head) that the rotary embedding, the core
// attention, the KV cache, context parallelism and recomputation read, so everything after the QKV
// layer is the model's ordinary code (GPTModel's training, GPTInference's decoding).
//
// Per token, on Hl heads (Dn = --qk-head-dim, Dr = --qk-pos-emb-head-dim, Dq = Dn + Dr, Dv = --v-head-dim,
// Rq = --q-lora-rank, Rkv = --kv-lora-rank; x the input_layernorm's output [C]):
//   q   = linear_q_proj(x)                                  [Hl, Dq]   (Rq = 0)
//       = linear_q_up_proj(q_layernorm(linear_q_down_proj(x)))         (Rq > 0; the norm with --qk-layernorm)
//   c   = linear_kv_down_proj(x)                            [Rkv + Dr]: the latent c[:Rkv], the rotary key c[Rkv:]
//   kv  = linear_kv_up_proj(kv_layernorm(c[:Rkv]))          [Hl, Dn + Dv]: k_nope, then v, per head
// and in the fused layout, per head, D = kv_channels = max(Dq, Dv) values each (zeros after the end):
//   query = s [q[Dn:] | q[:Dn]],  key = [c[Rkv:] | k_nope],  value = v,
// s = m^2 sqrt(D / Dq): the attention divides by sqrt(D), Megatron's MLA by sqrt(Dq) / m^2 (m: YaRN's
// mscale of --yarn-mscale-all-dim, 1 without yarn). The rotary part comes first in each head so that
// the rotation (Dr dims, pairs (2d, 2d + 1): Megatron's de-interleave then rotate-half) turns the
// head's first dims; reordering a query's and a key's dims alike leaves every score as it is. The
// attention's output per head [Dv | zeros] gives attn_v [Hl Dv], linear_proj's input.
#pragma once
#include <cstdint>

#include "model/transformer_config.h"

namespace lattice {

struct MlaShape {
  int64_t H = 0;  // heads here (Hl)
  int64_t D = 0, Dn = 0, Dr = 0, Dv = 0, Rkv = 0;
  float query_scale = 1.0f;  // s above
  int64_t Dq() const { return Dn + Dr; }
  int64_t Dnv() const { return Dn + Dv; }
  int64_t latent() const { return Rkv + Dr; }  // c's width
};
MlaShape mla_shape(const TransformerConfig& config, int64_t heads);

// qkv [N, H, 3, D] from q [N, H Dq], kv [N, H (Dn + Dv)] and c [N, Rkv + Dr] (before the rotation).
void mla_fuse_qkv(float* qkv, const float* q, const float* kv, const float* c, int64_t N, const MlaShape& s);
// The gradient of mla_fuse_qkv: dq, dkv from dqkv, and the rotary key's, summed over the heads, d_pe [N, Dr].
void mla_split_qkv_grad(float* dq, float* dkv, float* d_pe, const float* dqkv, int64_t N, const MlaShape& s);
// attn_v [N, H Dv] from the attention's output [N, H, D], and the gradient back (the padding's zero).
void mla_values(float* attn_v, const float* attn, int64_t N, const MlaShape& s);
void mla_values_grad(float* d_attn, const float* d_attn_v, int64_t N, const MlaShape& s);

}  // namespace lattice
