#include "checkpoint/hf_rope_scaling.h"

#include <cmath>

#include "checkpoint/hf_common.h"
#include "core/error.h"
#include "model/rotary_embedding.h"

namespace lattice::hf {

using nlohmann::json;

void read_yarn_rope_scaling(const json& config, const json& s, const std::string& what, TransformerConfig& c) {
  const std::string where = what + " rope_scaling yarn";
  if (!s.contains("factor")) LATTICE_FAIL() << where << " has no factor";
  const double factor = config_positive(s, where, "factor", 0.0);
  const int64_t max_positions = config.contains("max_position_embeddings")
                                    ? config_int(config, what, "max_position_embeddings")
                                    : c.max_position_embeddings;
  const bool has_original = s.contains("original_max_position_embeddings") &&
                            !s["original_max_position_embeddings"].is_null();
  const int64_t original = has_original ? config_int(s, where, "original_max_position_embeddings") : max_positions;
  auto number_or = [&](const char* key, double fallback) {  // transformers' `get(key) or fallback`
    const double v = s.contains(key) && !s[key].is_null() ? s[key].get<double>() : 0.0;
    return v != 0.0 ? v : fallback;
  };
  c.position_embedding_type = "yarn";
  c.yarn_rotary_scaling_factor = float(factor);
  c.yarn_original_max_position_embeddings = original;
  c.yarn_beta_fast = float(number_or("beta_fast", 32.0));
  c.yarn_beta_slow = float(number_or("beta_slow", 1.0));
  c.yarn_correction_range_round_to_int = config_bool(s, where, "truncate", true);
  const double mscale = number_or("mscale", 0.0), all_dim = number_or("mscale_all_dim", 0.0);
  c.yarn_mscale = 1.0f;
  c.yarn_mscale_all_dim = 0.0f;
  if (mscale != 0.0 && all_dim != 0.0) {
    c.yarn_mscale = float(mscale);
    c.yarn_mscale_all_dim = float(all_dim);
  }
  if (s.contains("attention_factor") && !s["attention_factor"].is_null()) {
    const double a = config_positive(s, where, "attention_factor", 0.0);
    if (factor <= 1.0 && a != 1.0)
      LATTICE_FAIL() << where << ": attention_factor " << a << " with factor " << factor
                     << " is not supported (YaRN's factor is 1 without scaling)";
    if (factor > 1.0) {  // m(s, mscale) = a with mscale_all_dim 0
      c.yarn_mscale = float((a - 1.0) / (0.1 * std::log(factor)));
      c.yarn_mscale_all_dim = 0.0f;
    }
  } else if (has_original && double(max_positions) != factor * double(original)) {
    LATTICE_FAIL() << where << ": max_position_embeddings " << max_positions << " is not factor " << factor
                   << " x original_max_position_embeddings " << original
                   << " and no attention_factor is given (transformers versions take the attention factor from "
                      "one or the other); not supported";
  }
}

json yarn_rope_scaling_json(const TransformerConfig& c) {
  const double s = c.yarn_rotary_scaling_factor;
  json j = {{"rope_type", "yarn"},
            {"factor", shortest_float(c.yarn_rotary_scaling_factor)},
            {"original_max_position_embeddings", c.yarn_original_max_position_embeddings},
            {"beta_fast", shortest_float(c.yarn_beta_fast)},
            {"beta_slow", shortest_float(c.yarn_beta_slow)},
            {"truncate", c.yarn_correction_range_round_to_int}};
  const float a = float(yarn_attention_factor(c)), plain = float(yarn_mscale(s, 1.0));
  if (a != plain || double(c.max_position_embeddings) != s * double(c.yarn_original_max_position_embeddings))
    j["attention_factor"] = shortest_float(a);
  return j;
}

}  // namespace lattice::hf
