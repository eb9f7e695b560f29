// --rampup-batch-size (train/batch_size_rampup.h) against Megatron's formulas, evaluated in
// Python (Megatron's own arithmetic: float division, int() truncation) for the expected
// values below: RampupBatchsizeNumMicroBatches.update and training.update_train_iters.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "train/batch_size_rampup.h"

namespace lattice {
namespace {

// Megatron's GPT-3 175B recipe: 16 -> 1536 in steps of 16 over 5,859,375 samples.
TEST(BatchSizeRampup, MegatronsGpt3Ramp) {
  const BatchSizeRampup r(16, 16, 5859375, 1536);
  EXPECT_EQ(r.batch_size(0), 16);
  EXPECT_EQ(r.batch_size(61677), 16);  // 5859375 / 95 = 61677.63 samples per step
  EXPECT_EQ(r.batch_size(61678), 32);
  EXPECT_EQ(r.batch_size(3000000), 784);
  EXPECT_EQ(r.batch_size(5859375), 1536);
  EXPECT_EQ(r.batch_size(5859376), 1536);
  // 300M samples: the ramp's iterations consume 5,859,424 samples, then 1536 at a time.
  EXPECT_EQ(r.train_iters(300000000), 211299);
  EXPECT_EQ(r.batch_sizes().size(), 96u);
}

// A small ramp, step by step: 4 -> 8 by 2 over 16 samples, 40 samples in all.
TEST(BatchSizeRampup, SmallRampStepByStep) {
  const BatchSizeRampup r(4, 2, 16, 8);
  const std::vector<int64_t> want = {4, 4, 6, 6, 8, 8};
  int64_t consumed = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(r.batch_size(consumed), want[i]) << "iteration " << i + 1;
    EXPECT_EQ(r.consumed_after(int64_t(i)), consumed);
    consumed += want[i];
  }
  EXPECT_EQ(r.train_iters(40), 6);  // 4 ramp iterations (20 samples), then (40 - 20) / 8
  EXPECT_EQ(r.consumed_after(6), 36);
  EXPECT_EQ(r.consumed_after(10), 68);
  EXPECT_EQ(r.batch_sizes(), (std::vector<int64_t>{4, 6, 8}));
}

TEST(BatchSizeRampup, BadValuesNameTheFlag) {
  auto error_of = [](int64_t start, int64_t incr, int64_t samples, int64_t global) {
    try {
      BatchSizeRampup r(start, incr, samples, global);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(16, 5, 100, 64).find("--rampup-batch-size: the increment 5 does not divide"), std::string::npos);
  EXPECT_NE(error_of(128, 16, 100, 64).find("exceeds --global-batch-size 64"), std::string::npos);
  EXPECT_NE(error_of(0, 16, 100, 64).find("--rampup-batch-size"), std::string::npos);
  EXPECT_NE(error_of(16, 16, -1, 64).find("--rampup-batch-size"), std::string::npos);
  EXPECT_EQ(error_of(64, 16, 100, 64), "");  // no step: always the global batch
  EXPECT_EQ(BatchSizeRampup(64, 16, 100, 64).batch_size(0), 64);
}

}  // namespace
}  // namespace lattice
