// NoPE layers in a rotary model (--no-rope-freq, Megatron's no_rope_freq; Llama 4's and SmolLM3's):
// the flag's two forms against Megatron's expansion, the errors naming the flag, and the model: a
// rotary model whose every layer skips the rotation computes what a model without position
// embedding computes (the same bits of the loss and of every gradient), and one whose second layer
// skips it computes neither. (Against PyTorch: tests/unit/test_model_vs_torch.cpp's
// gpt_tiny_rope_gqa2_qknorm_norope01.)
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/gpt_model.h"

namespace lattice {
namespace {

TEST(NoRopeFreq, AnIntegerIsMegatronsRepeatedPattern) {
  EXPECT_EQ(TransformerConfig::parse_no_rope_freq("4", 8), (std::vector<int>{0, 0, 0, 1, 0, 0, 0, 1}));
  EXPECT_EQ(TransformerConfig::parse_no_rope_freq("2", 4), (std::vector<int>{0, 1, 0, 1}));
  // Every layer without the rotation is kept as a pattern (empty means every layer rotates).
  EXPECT_EQ(TransformerConfig::parse_no_rope_freq("1", 3), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(TransformerConfig::parse_no_rope_freq("'4'", 4), (std::vector<int>{0, 0, 0, 1}));
}

TEST(NoRopeFreq, AListExpressionIsTakenAsWritten) {
  EXPECT_EQ(TransformerConfig::parse_no_rope_freq("([0]*3+[1]*1)*2", 8), TransformerConfig::parse_no_rope_freq("4", 8));
  EXPECT_EQ(TransformerConfig::parse_no_rope_freq("[1,0,1]", 3), (std::vector<int>{1, 0, 1}));
  EXPECT_TRUE(TransformerConfig::parse_no_rope_freq("[0,0]", 2).empty()) << "no NoPE layer: every layer rotates";
}

void expect_error(const std::string& value, int64_t layers, const std::string& says) {
  try {
    TransformerConfig::parse_no_rope_freq(value, layers);
    ADD_FAILURE() << "'" << value << "' for " << layers << " layers was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--no-rope-freq"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(NoRopeFreq, BadValuesNameTheFlag) {
  expect_error("3", 8, "does not divide --num-layers 8");
  expect_error("[0,1]", 3, "has 2 entries for --num-layers 3");
  expect_error("[0,2]", 2, "an entry other than 0 or 1");
  expect_error("0", 2, "positive integer");
  expect_error("x", 2, "");
}

TransformerConfig rope_config(std::vector<int> no_rope) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.vocab_size = 50;
  c.max_position_embeddings = 16;
  c.hidden_dropout = c.attention_dropout = 0.0f;
  c.position_embedding_type = "rope";
  c.no_rope_pattern = std::move(no_rope);
  return c;
}

TEST(NoRopeFreq, ConfigurationsWithoutARotationToSkipAreRefused) {
  auto refused = [](TransformerConfig c, const std::string& says) {
    try {
      c.finalize();
      ADD_FAILURE() << "accepted: " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  TransformerConfig learned = rope_config({0, 1});
  learned.position_embedding_type = "learned_absolute";
  refused(learned, "--no-rope-freq needs the rotary embedding");
  TransformerConfig mtp = rope_config({0, 1});
  mtp.mtp_num_layers = 1;
  refused(mtp, "--mtp-num-layers with --no-rope-freq");
  refused(rope_config({0, 1, 0}), "--no-rope-freq has 3 entries for --num-layers 2");
}

struct LossAndGrads {
  double loss;
  std::vector<float> grads;
};

LossAndGrads run(TransformerConfig c) {
  c.finalize();
  const int64_t B = 2, T = 16;
  GPTModel model(c, B, T);
  model.init_parameters(77);
  std::vector<int32_t> tokens(size_t(B * (T + 1)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7 + 3) % 50);
  model.params().zero_grad();
  LossAndGrads r;
  r.loss = model.forward_backward(tokens.data(), nullptr, B, T, 1.0f, MicroBatchKey{});
  r.grads.assign(model.params().grads(), model.params().grads() + model.params().numel());
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(NoRopeFreq, EveryLayerWithoutTheRotationIsTheModelWithoutPositions) {
  const LossAndGrads all = run(rope_config({1, 1}));
  TransformerConfig none = rope_config({});
  none.position_embedding_type = "none";
  const LossAndGrads nope = run(none);
  EXPECT_EQ(all.loss, nope.loss);
  EXPECT_TRUE(same_bits(all.grads, nope.grads)) << "gradients differ from the model without positions";
  // One NoPE layer of two: neither the rotary model nor the one without positions.
  const LossAndGrads second = run(rope_config({0, 1})), rotary = run(rope_config({}));
  EXPECT_NE(second.loss, rotary.loss);
  EXPECT_NE(second.loss, nope.loss);
}

}  // namespace
}  // namespace lattice
