// A training run under some parallel layout, compared with the single-process run:
// losses and gradient norms per iteration and each parameter part this rank holds
// against the same box of the single run's whole tensor (vocabulary rows beyond the
// single run's padding skipped), all to 1e-5 relative.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "optim/param_buffer.h"

namespace lattice {

struct LayoutRun {
  std::vector<double> losses, grad_norms;  // grad norm before clipping
  std::vector<float> params;               // this rank's buffer
  std::vector<ParamInfo> infos;            // its layout (global boxes)
  int peak_activations = 0;
  int64_t warmup = 0;
};

inline void expect_same_run(const LayoutRun& got, const LayoutRun& single) {
  ASSERT_EQ(got.losses.size(), single.losses.size());
  for (size_t i = 0; i < single.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], single.losses[i], 1e-5 * std::fabs(single.losses[i])) << "iteration " << i + 1;
    EXPECT_NEAR(got.grad_norms[i], single.grad_norms[i], 1e-5 * single.grad_norms[i]) << "grad norm " << i + 1;
  }
  std::map<std::string, const ParamInfo*> whole;
  for (const ParamInfo& p : single.infos) whole[p.name] = &p;
  double max_ref = 0, max_err = 0;
  int64_t compared = 0;
  std::string worst;
  for (const ParamInfo& p : got.infos) {
    ASSERT_TRUE(whole.count(p.name)) << p.name;
    const ParamInfo& w = *whole.at(p.name);
    const int64_t rows = p.shape.size() == 2 ? p.shape[0] : 1, cols = p.shape.back();
    const int64_t wcols = w.shape.back(), wrows = w.shape.size() == 2 ? w.shape[0] : 1;
    const int64_t r0 = p.shape.size() == 2 ? p.global_offsets[0] : 0, c0 = p.global_offsets.back();
    for (int64_t i = 0; i < rows && r0 + i < wrows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const double want = single.params[size_t(w.offset + (r0 + i) * wcols + c0 + j)];
        const double have = got.params[size_t(p.offset + i * cols + j)];
        max_ref = std::max(max_ref, std::fabs(want));
        if (std::fabs(have - want) > max_err) worst = p.name;
        max_err = std::max(max_err, std::fabs(have - want));
        ++compared;
      }
  }
  EXPECT_GT(compared, 0);
  EXPECT_LE(max_err, 1e-5 * max_ref) << "final parameters (largest difference in " << worst << ")";
}

}  // namespace lattice
