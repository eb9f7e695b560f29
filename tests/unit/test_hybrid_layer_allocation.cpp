// Megatron's hybrid layer allocation (model/hybrid_layer_allocation.h): --hybrid-attention-ratio and
// --hybrid-mlp-ratio give Megatron's patterns (the Mamba-2-Hybrid 8B's as NVIDIA published it, halves rounded
// to even as Python's round does), --hybrid-override-pattern is checked against them, bad values are one-line
// errors naming the flag; and `lattice train`'s flags reach the model's pattern.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/hybrid_layer_allocation.h"
#include "train/arguments.h"
#include "test_util.h"

namespace lattice {
namespace {

using test_util::error_of;

TEST(HybridLayerAllocation, MegatronsPatterns) {
  // NVIDIA's Mamba-2-Hybrid 8B (56 layers, --hybrid-attention-ratio 0.08 --hybrid-mlp-ratio 0.5): its
  // published hybrid_override_pattern.
  EXPECT_EQ(allocate_hybrid_layers(56, 0.08, 0.5, ""), "M-M-M--M-M*-M-M-M-M--M*-M-M-M-M-M*--M-M-M-M-M*-M--M-M-M-");
  EXPECT_EQ(allocate_hybrid_layers(48, 0.1, 0.0, ""), "MMMMMMM*MMMMMMM*MMMMMMMM*MMMMMMM*MMMMMMM*MMMMMMM");
  EXPECT_EQ(allocate_hybrid_layers(10, 0.2, 0.0, ""), "MMM*MM*MMM");
  EXPECT_EQ(allocate_hybrid_layers(10, 0.0, 0.3, ""), "MM-MMM-MM-");
  EXPECT_EQ(allocate_hybrid_layers(24, 0.125, 0.5, ""), "M-M--*M-M-M-*-M-M-*M--M-");
  // Halves to even: 10 x 0.25 = 2.5 -> 2 of each; 3 x 0.5 = 1.5 -> 2 (more than the Mamba layers left);
  // 7 x 0.5 = 3.5 -> 4.
  EXPECT_EQ(allocate_hybrid_layers(10, 0.25, 0.25, ""), "MMM*-M*MM-");
  EXPECT_EQ(allocate_hybrid_layers(3, 0.5, 0.5, ""), "*-*");
  EXPECT_EQ(allocate_hybrid_layers(7, 0.5, 0.25, ""), "M**-**-");
  EXPECT_EQ(allocate_hybrid_layers(8, 1.0, 0.0, ""), "********");
  EXPECT_EQ(allocate_hybrid_layers(4, 0.0, 0.0, ""), "MMMM");  // --is-hybrid-model alone: every layer Mamba
}

TEST(HybridLayerAllocation, OverridePatternMustMatchTheRatiosCounts) {
  // Without ratios any pattern of the right length; with them, the same count of each kind in any order.
  EXPECT_EQ(allocate_hybrid_layers(5, 0.0, 0.0, "M-M*-"), "M-M*-");
  EXPECT_EQ(allocate_hybrid_layers(10, 0.2, 0.0, "*MMMMMMMM*"), "*MMMMMMMM*");
  EXPECT_EQ(allocate_hybrid_layers(4, 0.0, 0.0, "ME*E"), "ME*E");
  const std::string counts = error_of([] { allocate_hybrid_layers(10, 0.2, 0.0, "*MMMMMMM**"); });
  EXPECT_NE(counts.find("--hybrid-override-pattern '*MMMMMMM**' has 7 'M' layers where --hybrid-attention-ratio "
                        "0.2 and --hybrid-mlp-ratio 0 allocate 8 (MMM*MM*MMM)"),
            std::string::npos)
      << counts;
  const std::string length = error_of([] { allocate_hybrid_layers(4, 0.0, 0.0, "M-M*-"); });
  EXPECT_NE(length.find("--hybrid-override-pattern 'M-M*-' has 5 layers for --num-layers 4"), std::string::npos)
      << length;
}

TEST(HybridLayerAllocation, BadRatiosNameTheFlag) {
  EXPECT_NE(error_of([] { allocate_hybrid_layers(4, -0.1, 0.0, ""); })
                .find("--hybrid-attention-ratio must be in [0, 1], got -0.1"),
            std::string::npos);
  EXPECT_NE(error_of([] { allocate_hybrid_layers(4, 0.0, 1.5, ""); }).find("--hybrid-mlp-ratio must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(error_of([] { allocate_hybrid_layers(4, 0.6, 0.5, ""); })
                .find("leave no share for the Mamba layers (their sum exceeds 1)"),
            std::string::npos);
}

TransformerConfig train_config(std::vector<std::string> extra) {
  std::vector<std::string> words = {"lattice", "train", "--num-layers", "10", "--hidden-size", "64",
                                    "--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size", "2",
                                    "--train-iters", "3", "--mock-data", "--vocab-size", "100",
                                    "--mamba-head-dim", "16", "--mamba-num-groups", "2"};
  words.insert(words.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  return parse_train_args(int(argv.size()), argv.data(), 2).transformer_config();
}

TEST(HybridLayerAllocation, TrainFlagsMakeThePattern) {
  EXPECT_EQ(train_config({}).hybrid_layer_pattern, "");  // no hybrid flag: a GPT model
  EXPECT_EQ(train_config({"--hybrid-attention-ratio", "0.2"}).hybrid_layer_pattern, "MMM*MM*MMM");
  EXPECT_EQ(train_config({"--hybrid-attention-ratio", "0.2", "--hybrid-mlp-ratio", "0.3"}).hybrid_layer_pattern,
            allocate_hybrid_layers(10, 0.2, 0.3, ""));
  EXPECT_EQ(train_config({"--is-hybrid-model"}).hybrid_layer_pattern, "MMMMMMMMMM");
  EXPECT_EQ(train_config({"--hybrid-override-pattern", "MMM*MM*MMM"}).hybrid_layer_pattern, "MMM*MM*MMM");
  const std::string e = error_of([] { train_config({"--hybrid-mlp-ratio", "2"}); });
  EXPECT_NE(e.find("--hybrid-mlp-ratio must be in [0, 1], got 2"), std::string::npos) << e;
}

}  // namespace
}  // namespace lattice
