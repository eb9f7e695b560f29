// HuggingFace's rope_scaling "yarn" (transformers' _compute_yarn_parameters) and lattice's YaRN fields
// (--position-embedding-type yarn, model/rotary_embedding.h), both ways.
//
// Read: factor s (required), original_max_position_embeddings L (default: the config's
// max_position_embeddings), beta_fast (32), beta_slow (1), truncate (true: the correction range
// floored and ceiled, --no-yarn-correction-range-round-to-int when false), and the attention factor:
// attention_factor as given, else m(s, mscale) / m(s, mscale_all_dim) when both are set and non-zero,
// else m(s, 1) (m(s, x) = 0.1 x ln s + 1), kept as yarn_mscale (with yarn_mscale_all_dim) so that
// rotary_embedding's formula gives it. A config whose L is given and whose max_position_embeddings is
// not s L, without attention_factor, is refused: transformers versions take its factor from s or from
// max_position_embeddings / L.
// Written: the same keys, attention_factor only when it is not m(s, 1) or max_position_embeddings is
// not s L.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "model/transformer_config.h"

namespace lattice::hf {

// config: the whole config.json (its max_position_embeddings); rope_scaling: its rope_scaling object.
void read_yarn_rope_scaling(const nlohmann::json& config, const nlohmann::json& rope_scaling, const std::string& what,
                            TransformerConfig& c);
nlohmann::json yarn_rope_scaling_json(const TransformerConfig& c);

}  // namespace lattice::hf
