// A hybrid model's layer pattern from Megatron-Core's flags (megatron/core/ssm/mamba_hybrid_layer_allocation):
// --hybrid-attention-ratio and --hybrid-mlp-ratio spread that share of --num-layers as attention-only (*) and
// MLP-only (-) layers among Mamba layers (M), and --hybrid-override-pattern, where given, is the pattern itself
// (with a nonzero ratio, it must have the ratios' count of each kind).
//
// Megatron's allocation, with round() Python's (halves to even):
//   a = round(L x attention ratio) attention layers, evenly spaced with the Mamba layers in a + 1 sections of
//   s = (L - a) / (a + 1) layers: x = s; per layer, x < 0.5: attention and x += s, else x -= 1;
//   m = round(L x mlp ratio) MLP layers among the Mamba ones (right-justified): r = (L - a - m) / m, x = r;
//   per Mamba layer, x < 0.5: MLP and x += r, else x -= 1.
// E.g. 56 layers, 0.08 and 0.5: M-M-M--M-M*-M-M-M-M--M*-M-M-M-M-M*--M-M-M-M-M*-M--M-M-M- (the Mamba-2-Hybrid
// 8B of NVIDIA's "An Empirical Study of Mamba-based Language Models").
#pragma once
#include <cstdint>
#include <string>

namespace lattice {

// Megatron's unified pattern "MAIN/MTP/MTP...": the decoder's layers, then each multi-token prediction depth's
// (all alike: Megatron's rule), e.g. "M*M-/*E/*E" is a 4-layer decoder and 2 depths of "*E".
struct HybridPattern {
  std::string main, mtp;
  int64_t mtp_depths = 0;
  // The unified form again.
  std::string unified() const;
};
// Fails naming --hybrid-override-pattern when the depths' patterns differ or one is empty.
HybridPattern parse_hybrid_pattern(const std::string& pattern);

// Whether a prediction depth's layers are a form lattice runs (as one layer): a mixer (M or *) and/or an MLP
// (- or E) in that order: M, *, -, E, M-, ME, *- or *E.
bool is_mtp_depth_form(const std::string& depth);

// The pattern (one character per layer) of num_layers layers; fails naming the flag for a ratio outside
// [0, 1], ratios summing above 1, or an override pattern of other lengths or counts.
std::string allocate_hybrid_layers(int64_t num_layers, double attention_ratio, double mlp_ratio,
                                   const std::string& override_pattern);

}  // namespace lattice
