// The Gated DeltaNet layers of the tests' small models (--experimental-attention-variant gated_delta_net and
// its shapes): one place for the flags a test sets, so the unit, distributed and emulated-GPU tests build the
// same kind of layer.
#pragma once
#include <cstdint>
#include <vector>

#include "model/transformer_config.h"

namespace lattice {

struct GdnShapes {
  int64_t key_heads = 2, value_heads = 4, key_dim = 8, value_dim = 8, conv_kernel = 4;
};

// c with GDN layers where `pattern` (--linear-attention-freq's list, one entry per layer) has 1, of shapes s.
// The layer's activation is SiLU: the test sets --swiglu.
inline void set_gdn(TransformerConfig& c, std::vector<int> pattern, const GdnShapes& s = {}) {
  c.experimental_attention_variant = "gated_delta_net";
  c.linear_attention_pattern = std::move(pattern);
  c.linear_num_key_heads = s.key_heads;
  c.linear_num_value_heads = s.value_heads;
  c.linear_key_head_dim = s.key_dim;
  c.linear_value_head_dim = s.value_dim;
  c.linear_conv_kernel_dim = s.conv_kernel;
}

}  // namespace lattice
