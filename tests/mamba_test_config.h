// The hybrid Mamba models of the tests (--hybrid-override-pattern and the Mamba layers' shapes): one place for
// the flags a test sets, so the unit, distributed and emulated-GPU tests build the same kind of model.
#pragma once
#include <cstdint>
#include <string>

#include "model/hybrid_layer_allocation.h"
#include "model/transformer_config.h"

namespace lattice {

struct MambaShapes {
  int64_t heads = 4, head_dim = 8, groups = 2, state_dim = 6;
};

// c as a hybrid model of `pattern` (one character per layer: M Mamba, * attention, - MLP, E MoE; Megatron's
// unified form MAIN/MTP/... adds prediction depths) with Mamba layers of shapes s; num_layers is the main
// pattern's length.
inline void set_hybrid(TransformerConfig& c, const std::string& pattern, const MambaShapes& s = {}) {
  const HybridPattern h = parse_hybrid_pattern(pattern);
  c.hybrid_layer_pattern = h.main;
  c.num_layers = int64_t(h.main.size());
  if (h.mtp_depths > 0) {
    c.mtp_hybrid_pattern = h.mtp;
    c.mtp_num_layers = h.mtp_depths;
  }
  c.mamba_num_heads = s.heads;
  c.mamba_head_dim = s.head_dim;
  c.mamba_num_groups = s.groups;
  c.mamba_state_dim = s.state_dim;
}

}  // namespace lattice
