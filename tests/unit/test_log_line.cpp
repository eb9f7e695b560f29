// Megatron's log line and its --metrics-file twin: the fields in Megatron's order and format, the optional
// ones only when logged, the MoE and prediction-depth losses after the lm loss; their TensorBoard tags.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "train/log_line.h"

namespace lattice {
namespace {

LogLine plain() {
  LogLine l;
  l.iteration = 20;
  l.train_iters = 100;
  l.consumed_samples = 160;
  l.global_batch_size = 8;
  l.elapsed_ms = 123.45;
  l.tflops_per_gpu = 1.5;
  l.learning_rate = 3e-4;
  l.lm_loss = 5.25;
  l.loss_scale = 1.0;
  l.grad_norm = 0.75;
  l.skipped_iterations = 0;
  l.nan_iterations = 0;
  l.tokens_per_sec = 2048.0;
  l.mfu_percent = 12.5;
  return l;
}

TEST(LogLine, MegatronsFieldsInItsOrder) {
  EXPECT_EQ(format_log_line(plain()),
            " iteration       20/     100 | consumed samples:          160 | elapsed time per iteration (ms): 123.5 | "
            "throughput per GPU (TFLOP/s/GPU): 1.500 | learning rate: 3.000000E-04 | global batch size:     8 | "
            "lm loss: 5.250000E+00 | loss scale: 1.0 | grad norm: 0.750 | number of skipped iterations:   0 | "
            "number of nan iterations:   0 | tokens per second: 2048.0 | MFU: 12.5% |");
}

TEST(LogLine, OptionalFieldsFollowTheirNeighbours) {
  LogLine l = plain();
  l.num_zeros_in_grad = 3;
  l.params_norm = 10.5;
  l.load_balancing_loss = 0.01;
  l.z_loss = 0.002;
  l.mtp_losses = {4.5, 4.75};
  const std::string s = format_log_line(l);
  EXPECT_NE(s.find("| lm loss: 5.250000E+00 | load_balancing_loss: 1.000000E-02 | z_loss: 2.000000E-03 | "
                   "mtp_1 loss: 4.500000E+00 | mtp_2 loss: 4.750000E+00 | loss scale: 1.0 |"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("| grad norm: 0.750 | num zeros: 3.0 | params norm: 10.500 | number of skipped"), std::string::npos)
      << s;
  const nlohmann::json j = nlohmann::json::parse(format_metrics_json(l));
  EXPECT_EQ(j["iteration"], 20);
  EXPECT_EQ(j["lm_loss"], 5.25);
  EXPECT_EQ(j["load_balancing_loss"], 0.01);
  EXPECT_EQ(j["mtp_losses"], nlohmann::json({4.5, 4.75}));
  EXPECT_FALSE(j.contains("seq_load_balancing_loss"));
  EXPECT_FALSE(nlohmann::json::parse(format_metrics_json(plain())).contains("params_norm"));
}

TEST(LogLine, TensorBoardTags) {
  TrainArgs args;
  StepResult r;
  r.load_balancing_loss = 0.01;
  r.layer_load_balancing_loss = {-1, 0.02};
  r.mtp_losses = {4.5};
  const auto s = moe_scalars(args, r);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].first, "load_balancing_loss");
  EXPECT_EQ(s[1].first, "moe/load_balancing_loss_layer_1");
  EXPECT_EQ(s[2].first, "mtp_1 loss");
  r.skipped = true;
  EXPECT_TRUE(moe_scalars(args, r).empty()) << "a skipped step logs no losses";
}

}  // namespace
}  // namespace lattice
