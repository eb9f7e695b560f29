// A Mamba layer's kernel shape (kernels/mamba.h) from the model's config, shared by the training model
// (model/mamba_mixer.cpp) and its users.
#pragma once
#include <cstdint>

#include "kernels/mamba.h"
#include "model/transformer_config.h"

namespace lattice {

// For B sequences of T tokens on one of tp ranks (its share of the heads and groups); state checkpoints
// every min(64, T) tokens.
MambaShape mamba_kernel_shape(const TransformerConfig& cfg, int64_t tp, int64_t B, int64_t T);

// Whether a context-parallel group of cp ranks divides a tensor-parallel rank's Mamba heads and groups (the
// condition of Megatron's context-parallel Mamba: each rank runs its share of them over the whole sequences).
bool mamba_context_splits_heads(const TransformerConfig& cfg, int64_t tp, int64_t cp);

}  // namespace lattice
