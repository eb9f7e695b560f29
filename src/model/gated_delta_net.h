// A Gated DeltaNet layer's kernel shape (kernels/gated_delta_net.h) from the model's config, shared by the
// training model (model/gated_delta_net.cpp) and decoding (model/gpt_inference.cpp).
#pragma once
#include <cstdint>

#include "kernels/gated_delta_net.h"
#include "model/transformer_config.h"

namespace lattice {

// For B sequences of T tokens on one of tp ranks (its share of the heads); state checkpoints every
// min(64, T) tokens.
GdnShape gdn_kernel_shape(const TransformerConfig& cfg, int64_t tp, int64_t B, int64_t T);

// Whether a context-parallel group of cp ranks splits a GDN layer's core by heads (its size divides the tp
// rank's key heads; model/gated_delta_net.cpp), else every rank runs the whole core.
bool gdn_context_splits_heads(const TransformerConfig& cfg, int64_t tp, int64_t cp);

}  // namespace lattice
