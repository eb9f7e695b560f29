// The multi-latent attention of the tests' small models (--multi-latent-attention and its shapes): one
// place for the flags a test sets, so the unit, distributed and emulated-GPU tests build the same kind of layer.
#pragma once
#include <cstdint>

#include "model/transformer_config.h"

namespace lattice {

struct MlaShapes {
  int64_t q_lora_rank = 16, kv_lora_rank = 12, qk_head_dim = 8, qk_pos_emb_head_dim = 4, v_head_dim = 6;
};

// c with multi-latent attention of shapes s and its latents' norms (--qk-layernorm), the rotary embedding
// (kept when c has yarn), and the head dim and query groups left for finalize() to derive.
inline void set_mla(TransformerConfig& c, const MlaShapes& s = {}) {
  c.multi_latent_attention = true;
  c.qk_layernorm = true;
  if (!c.rope()) c.position_embedding_type = "rope";
  c.q_lora_rank = s.q_lora_rank;
  c.kv_lora_rank = s.kv_lora_rank;
  c.qk_head_dim = s.qk_head_dim;
  c.qk_pos_emb_head_dim = s.qk_pos_emb_head_dim;
  c.v_head_dim = s.v_head_dim;
  c.kv_channels = 0;
  c.num_query_groups = 0;
}

}  // namespace lattice
