#include "model/hybrid_layer_allocation.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace lattice {
namespace {

// Python's round(): the nearest integer, halves to the even one (the default rounding mode's nearbyint).
int64_t round_half_even(double v) { return int64_t(std::nearbyint(v)); }

std::string allocate_by_ratios(int64_t L, double attention_ratio, double mlp_ratio) {
  std::string kinds(size_t(L), 'M');
  const int64_t attention = round_half_even(double(L) * attention_ratio);
  int64_t mamba = L - attention;
  const double section = double(mamba) / double(attention + 1);
  double x = section;
  for (int64_t l = 0; l < L; ++l) {
    if (x < 0.5) {
      kinds[size_t(l)] = '*';
      x += section;
    } else {
      x -= 1;
    }
  }
  const int64_t mlp = round_half_even(double(L) * mlp_ratio);
  if (mlp == 0) return kinds;
  mamba -= mlp;
  const double per_mlp = double(mamba) / double(mlp);
  x = per_mlp;
  for (int64_t l = 0; l < L; ++l) {
    if (kinds[size_t(l)] != 'M') continue;
    if (x < 0.5) {
      kinds[size_t(l)] = '-';
      x += per_mlp;
    } else {
      x -= 1;
    }
  }
  return kinds;
}

}  // namespace

std::string HybridPattern::unified() const {
  std::string s = main;
  for (int64_t k = 0; k < mtp_depths; ++k) s += "/" + mtp;
  return s;
}

bool is_mtp_depth_form(const std::string& depth) {
  static const char* const kForms[] = {"M", "*", "-", "E", "M-", "ME", "*-", "*E"};
  for (const char* f : kForms)
    if (depth == f) return true;
  return false;
}

HybridPattern parse_hybrid_pattern(const std::string& pattern) {
  HybridPattern h;
  const size_t slash = pattern.find('/');
  h.main = pattern.substr(0, slash);
  for (size_t at = slash; at != std::string::npos;) {
    const size_t next = pattern.find('/', at + 1);
    const std::string depth = pattern.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1);
    if (depth.empty() || (h.mtp_depths > 0 && depth != h.mtp))
      LATTICE_FAIL() << "--hybrid-override-pattern '" << pattern << "': the multi-token prediction depths after '/' "
                     << (depth.empty() ? "include an empty one" : "differ ('" + h.mtp + "' and '" + depth + "')")
                     << " (Megatron's form: MAIN/MTP/MTP..., every depth the same layers)";
    h.mtp = depth;
    ++h.mtp_depths;
    at = next;
  }
  return h;
}

std::string allocate_hybrid_layers(int64_t num_layers, double attention_ratio, double mlp_ratio,
                                   const std::string& override_pattern) {
  for (const auto& [flag, ratio] : {std::pair{"--hybrid-attention-ratio", attention_ratio},
                                    std::pair{"--hybrid-mlp-ratio", mlp_ratio}})
    if (!(ratio >= 0.0 && ratio <= 1.0)) LATTICE_FAIL() << flag << " must be in [0, 1], got " << ratio;
  if (attention_ratio + mlp_ratio > 1.0)
    LATTICE_FAIL() << "--hybrid-attention-ratio " << attention_ratio << " and --hybrid-mlp-ratio " << mlp_ratio
                   << " leave no share for the Mamba layers (their sum exceeds 1)";
  LATTICE_CHECK(num_layers > 0) << "--num-layers must be positive for a hybrid model, got " << num_layers;
  const std::string allocated = allocate_by_ratios(num_layers, attention_ratio, mlp_ratio);
  if (override_pattern.empty()) return allocated;
  if (int64_t(override_pattern.size()) != num_layers)
    LATTICE_FAIL() << "--hybrid-override-pattern '" << override_pattern << "' has " << override_pattern.size()
                   << " layers for --num-layers " << num_layers;
  if (attention_ratio > 0.0 || mlp_ratio > 0.0)
    for (char kind : {'M', '*', '-', 'E'})
      if (std::count(override_pattern.begin(), override_pattern.end(), kind) !=
          std::count(allocated.begin(), allocated.end(), kind))
        LATTICE_FAIL() << "--hybrid-override-pattern '" << override_pattern << "' has "
                       << std::count(override_pattern.begin(), override_pattern.end(), kind) << " '" << kind
                       << "' layers where --hybrid-attention-ratio " << attention_ratio << " and --hybrid-mlp-ratio "
                       << mlp_ratio << " allocate " << std::count(allocated.begin(), allocated.end(), kind) << " ("
                       << allocated << ")";
  return override_pattern;
}

}  // namespace lattice
