// A training run under some parallel layout, compared with the single-process run:
// losses and gradient norms per iteration and each parameter part this rank holds
// against the same box of the single run's whole tensor (vocabulary rows beyond the
// single run's padding skipped, and key biases whose gradient is rounding noise when the
// run names them), all to 1e-5 relative in fp32 (RunTolerance for the low-precision formats),
// each parameter element with its rounding spread on top when the test measured it.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "model/transformer_config.h"
#include "optim/param_buffer.h"

namespace lattice {

struct LayoutRun {
  std::vector<double> losses, grad_norms;  // grad norm before clipping
  std::vector<float> params;               // this rank's buffer
  std::vector<ParamInfo> infos;            // its layout (global boxes)
  int peak_activations = 0;
  int64_t warmup = 0;
  std::vector<int64_t> key_bias_noise;     // key_bias_elements of the run's model (the single run's is read)
  std::vector<float> rounding_spread;      // the single run's: measure_rounding_spread's, per element of params
};

// A layout sums in another order than the single process, so its gradients differ by rounding, and Adam
// divides each gradient by its own running RMS: an element whose gradient is small against the rounding of the
// terms that make it (terms that nearly cancel) takes steps whose size and sign rounding picks, for up to lr
// each. Such an element's final value is not set by the math to 1e-5, in any layout. The single run shows
// which: train it again from initial parameters each moved by a relative kRoundingPerturbation (about 16 fp32
// ulps, the size of the differences a layout's sums leave in the forward), and each element's rounding
// spread is how far its final value moved. expect_same_run allows each element its spread on top of the
// tolerance. A well-conditioned element's spread is about 1e-8 (measured: the median 1e-8, the 99.9th
// percentile 8e-7 after 20 steps of lr 1e-3), so a layout's error still has to stay within the tolerance;
// an ill-conditioned one's reaches 6e-5 (one expert's fc1 element, value -1.2e-4, its gradient nearly
// cancelling; a layout run on AVX2 GEMMs ends 1.3e-5 off there).
constexpr double kRoundingPerturbation = 1e-6;

// Moves every parameter element by a relative (-1, 1) x `relative`, from a fixed pseudo-random sequence.
inline void perturb_parameters(ParamBuffer& params, double relative) {
  std::vector<float> w;
  params.download_params(w);
  uint64_t h = 0x9e3779b97f4a7c15ull;  // xorshift64
  for (float& x : w) {
    h ^= h << 13;
    h ^= h >> 7;
    h ^= h << 17;
    const double r = double(h >> 11) / double(1ull << 52) - 1;  // [-1, 1)
    x = float(double(x) * (1 + relative * r));
  }
  params.upload_params(w.data());
}

// |single - perturbed| per element of the final parameters: `perturbed` trained as `single` was, from its
// initial parameters moved by perturb_parameters(kRoundingPerturbation).
inline std::vector<float> measure_rounding_spread(const LayoutRun& single, const LayoutRun& perturbed) {
  EXPECT_EQ(single.params.size(), perturbed.params.size());
  std::vector<float> spread(single.params.size());
  for (size_t i = 0; i < spread.size() && i < perturbed.params.size(); ++i)
    spread[i] = std::fabs(perturbed.params[i] - single.params[i]);
  return spread;
}

// The elements of linear_qkv.bias that are the attention's key bias when its gradient is zero but for
// rounding: with the vanilla softmax, no rotary embedding and no q/k norm, a bias on the keys adds the same
// q.b to every score of a query's row, which the softmax ignores. Adam turns that rounding into steps of up
// to lr in directions the rounding picks, so two layouts' key biases differ by noise, not by an error
// (measured on an Intel Sapphire Rapids CPU: up to 1.1e-5 after 20 steps of lr 1e-3, every other element
// within 2e-6); expect_same_run leaves them out. Megatron's layout: per query group its queries (and their
// gates), its key, its value.
inline std::vector<int64_t> key_bias_elements(const TransformerConfig& c) {
  std::vector<int64_t> keys;
  if (!c.add_bias_linear && !c.add_qkv_bias) return keys;
  if (c.multi_latent_attention || c.position_embedding_type == "rope" || c.qk_layernorm || c.qk_l2_norm ||
      c.softmax_type != "vanilla")
    return keys;
  const std::vector<int64_t> rows = c.qkv_group_rows();  // q (gate) k v of one group
  int64_t group = 0;
  for (int64_t r : rows) group += r;
  const int64_t key_at = group - 2 * c.kv_channels;
  for (int64_t g = 0; g < c.num_query_groups; ++g)
    for (int64_t d = 0; d < c.kv_channels; ++d) keys.push_back(g * group + key_at + d);
  return keys;
}

// Relative tolerances: losses and gradient norms against their values, parameters
// against the largest parameter magnitude.
struct RunTolerance {
  double loss = 1e-5, grad_norm = 1e-5, params = 1e-5;
};

// The largest relative differences found (for the record).
struct RunDifference {
  double loss = 0, grad_norm = 0, params = 0;
};

inline RunDifference expect_same_run(const LayoutRun& got, const LayoutRun& single, const RunTolerance& tol = {}) {
  RunDifference d;
  EXPECT_EQ(got.losses.size(), single.losses.size());
  if (got.losses.size() != single.losses.size()) return d;
  for (size_t i = 0; i < single.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], single.losses[i], tol.loss * std::fabs(single.losses[i])) << "iteration " << i + 1;
    EXPECT_NEAR(got.grad_norms[i], single.grad_norms[i], tol.grad_norm * single.grad_norms[i]) << "grad norm " << i + 1;
    d.loss = std::max(d.loss, std::fabs(got.losses[i] - single.losses[i]) / std::fabs(single.losses[i]));
    if (single.grad_norms[i] > 0)
      d.grad_norm = std::max(d.grad_norm, std::fabs(got.grad_norms[i] - single.grad_norms[i]) / single.grad_norms[i]);
  }
  std::map<std::string, const ParamInfo*> whole;
  for (const ParamInfo& p : single.infos) whole[p.name] = &p;
  const std::string qkv_bias = "self_attention.linear_qkv.bias";
  auto noise = [&](const std::string& name, int64_t index) {
    return name.size() >= qkv_bias.size() && name.compare(name.size() - qkv_bias.size(), qkv_bias.size(), qkv_bias) == 0 &&
           std::binary_search(single.key_bias_noise.begin(), single.key_bias_noise.end(), index);
  };
  const bool spread = !single.rounding_spread.empty();
  EXPECT_TRUE(!spread || single.rounding_spread.size() == single.params.size());
  // max_err: the largest difference beyond the element's rounding spread (its whole difference without one)
  double max_ref = 0, max_err = 0;
  int64_t compared = 0;
  std::string worst;
  for (const ParamInfo& p : got.infos) {
    EXPECT_TRUE(whole.count(p.name)) << p.name;
    if (!whole.count(p.name)) return d;
    const ParamInfo& w = *whole.at(p.name);
    for (const ParamBox& box : param_boxes(p, param_tp_rank(p))) {  // one, or one per block (SwiGLU's fc1)
      // Rows along dim 0, the other dims flattened (a 3-D tensor, a GDN layer's conv1d.weight, splits along
      // dim 0 only).
      const bool matrix = box.lengths.size() >= 2;
      int64_t cols = 1, wcols = 1;
      for (size_t dim = matrix ? 1 : 0; dim < box.lengths.size(); ++dim) {
        cols *= box.lengths[dim];
        wcols *= w.shape[dim];
      }
      const int64_t rows = matrix ? box.lengths[0] : 1, wrows = matrix ? w.shape[0] : 1;
      const int64_t r0 = matrix ? box.offsets[0] : 0, c0 = box.lengths.size() <= 2 ? box.offsets.back() : 0;
      for (int64_t i = 0; i < rows && r0 + i < wrows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          if (noise(p.name, (r0 + i) * wcols + c0 + j)) continue;
          const size_t at = size_t(w.offset + (r0 + i) * wcols + c0 + j);
          const double want = single.params[at];
          const double have = got.params[size_t(p.offset + box.local_offset + i * cols + j)];
          const double err = std::fabs(have - want) - (spread ? double(single.rounding_spread[at]) : 0.0);
          max_ref = std::max(max_ref, std::fabs(want));
          if (err > max_err) worst = p.name;
          max_err = std::max(max_err, err);
          ++compared;
        }
    }
  }
  EXPECT_GT(compared, 0);
  EXPECT_LE(max_err, tol.params * max_ref) << "final parameters (largest difference" << (spread ? " beyond the rounding spread" : "")
                                             << " in " << worst << ")";
  d.params = max_ref > 0 ? max_err / max_ref : 0;
  return d;
}

}  // namespace lattice
