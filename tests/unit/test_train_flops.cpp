// Megatron's FLOPs formula against reference/megatron.md's test vector.
#include <gtest/gtest.h>

#include "train/flops.h"

namespace lattice {
namespace {

TEST(TrainFlops, MegatronTestVector) {
  // GBS=8, s=1024, L=2, h=256, 8 heads, kv_channels 32, ffn 1024, V_padded 50304
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 256;
  c.num_attention_heads = 8;
  c.kv_channels = 32;
  c.ffn_hidden_size = 1024;
  c.vocab_size = 50257;
  c.max_position_embeddings = 1024;
  c.finalize();
  ASSERT_EQ(c.padded_vocab_size, 50304);
  EXPECT_EQ(megatron_flops_per_iteration(c, 8, 1024), 736050020352.0);
  // SwiGLU: ffn_mult 3 (three ffn x h matrices per layer) instead of 2.
  c.swiglu = true;
  EXPECT_EQ(megatron_flops_per_iteration(c, 8, 1024), 761819824128.0);
  // Grouped-query attention: k and v kv_channels x groups wide.
  c.swiglu = false;
  c.num_query_groups = 2;
  EXPECT_EQ(megatron_flops_per_iteration(c, 8, 1024), 726386343936.0);
}

}  // namespace
}  // namespace lattice
