// A training run under some parallel layout, compared with the single-process run:
// losses and gradient norms per iteration and each parameter part this rank holds
// against the same box of the single run's whole tensor (vocabulary rows beyond the
// single run's padding skipped, and key biases whose gradient is rounding noise when the
// run names them), all to 1e-5 relative in fp32 (RunTolerance for the low-precision formats).
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
};

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
          const double want = single.params[size_t(w.offset + (r0 + i) * wcols + c0 + j)];
          const double have = got.params[size_t(p.offset + box.local_offset + i * cols + j)];
          max_ref = std::max(max_ref, std::fabs(want));
          if (std::fabs(have - want) > max_err) worst = p.name;
          max_err = std::max(max_err, std::fabs(have - want));
          ++compared;
        }
    }
  }
  EXPECT_GT(compared, 0);
  EXPECT_LE(max_err, tol.params * max_ref) << "final parameters (largest difference in " << worst << ")";
  d.params = max_ref > 0 ? max_err / max_ref : 0;
  return d;
}

}  // namespace lattice
