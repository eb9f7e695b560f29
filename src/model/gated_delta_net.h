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

}  // namespace lattice
