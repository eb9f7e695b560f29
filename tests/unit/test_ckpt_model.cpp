// The model part of a checkpoint: parameters round-trip bit for bit, a different model
// shape is refused naming the field, and `generate`'s loader rebuilds the model.
#include "checkpoint/model_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "ckpt_test_util.h"

namespace lattice {
namespace {

using ckpt_test::error_of;

TransformerConfig tiny_config() {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.vocab_size = 40;
  c.max_position_embeddings = 8;
  c.finalize();
  return c;
}

std::vector<float> params_of(const GPTModel& m) {
  return std::vector<float>(m.params().params(), m.params().params() + m.params().numel());
}

class CkptModel : public ckpt_test::TempDirTest {};

TEST_F(CkptModel, ParametersRoundTripBitExact) {
  const TransformerConfig c = tiny_config();
  GPTModel saved(c, 1, 8), loaded(c, 1, 8);
  saved.init_parameters(11);
  loaded.init_parameters(12);
  ASSERT_NE(params_of(saved), params_of(loaded));
  save_model_checkpoint(path("ckpt"), 3, saved, R"({"seq-length": 8, "tokenizer-type": "ByteTokenizer"})");

  CheckpointReader r = CheckpointReader::open(path("ckpt"));
  check_model_config(r.state().model_config, c, r.iter_dir());
  load_model_tensors(r, loaded);
  const std::vector<float> a = params_of(saved), b = params_of(loaded);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);

  LoadedModel lm = load_model_checkpoint(path("ckpt"), 1);
  EXPECT_EQ(lm.iteration, 3);
  EXPECT_EQ(lm.seq_length, 8);
  EXPECT_EQ(lm.tokenizer_type, "ByteTokenizer");
  EXPECT_EQ(lm.model->config().num_layers, 2);
  EXPECT_EQ(lm.model->config().padded_vocab_size, c.padded_vocab_size);
  EXPECT_EQ(params_of(*lm.model), a);
  // For inference: no gradient buffer (the parameters' memory once, not twice), and no training.
  EXPECT_FALSE(lm.model->params().has_grads());
  EXPECT_EQ(lm.model->params().grads(), nullptr);
  EXPECT_TRUE(saved.params().has_grads());
  std::vector<int32_t> tokens(size_t(8 + 1), 1);
  EXPECT_THROW(lm.model->forward_backward(tokens.data(), nullptr, 1, 8, 1.0f, MicroBatchKey{}), Error);
}

TEST(CkptModelConfig, MismatchNamesTheFieldAndFlag) {
  const TransformerConfig c = tiny_config();
  const nlohmann::json saved = model_config_json(c);
  EXPECT_EQ(error_of([&] { check_model_config(saved, c, "ckpt/iter_0000001"); }), "");
  TransformerConfig other = c;
  other.hidden_size = 32;
  std::string msg = error_of([&] { check_model_config(saved, other, "ckpt/iter_0000001"); });
  EXPECT_NE(msg.find("ckpt/iter_0000001"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hidden_size is 16, this run's is 32 (--hidden-size)"), std::string::npos) << msg;
  other = c;
  other.layernorm_epsilon = 1e-6f;
  msg = error_of([&] { check_model_config(saved, other, "x"); });
  EXPECT_NE(msg.find("--norm-epsilon"), std::string::npos) << msg;
  // The saved epsilon (a float widened to double in JSON) compares equal to itself.
  const nlohmann::json reparsed = nlohmann::json::parse(saved.dump());
  EXPECT_EQ(error_of([&] { check_model_config(reparsed, c, "x"); }), "");
  EXPECT_EQ(model_config_from_json(reparsed, "x").layernorm_epsilon, c.layernorm_epsilon);
}

// A checkpoint written before the position embedding, rotary and bias fields existed reads as
// learned positions with biases; against a run that uses them, the error names the flag.
TEST(CkptModelConfig, FieldsAddedLaterReadAsTheirOldMeaning) {
  const TransformerConfig c = tiny_config();
  nlohmann::json old = model_config_json(c);
  for (const char* f : {"position_embedding_type", "rotary_percent", "rotary_base", "rotary_interleaved",
                        "rotary_seq_len_interpolation_factor", "add_bias_linear", "normalization", "swiglu",
                        "num_query_groups", "use_rope_scaling", "rope_scaling_factor",
                        "rope_scaling_low_freq_factor", "rope_scaling_high_freq_factor",
                        "rope_scaling_original_max_position_embeddings", "quick_geglu", "glu_linear_offset",
                        "activation_func_clamp_value"})
    ASSERT_EQ(old.erase(f), 1u) << f;
  const TransformerConfig read = model_config_from_json(old, "x");
  EXPECT_FALSE(read.rope());
  EXPECT_TRUE(read.add_bias_linear);
  EXPECT_FALSE(read.rmsnorm());
  EXPECT_FALSE(read.swiglu);
  EXPECT_FALSE(read.gated_linear_unit());
  EXPECT_EQ(read.glu_linear_offset, 0.0f);
  EXPECT_EQ(read.activation_func_clamp_value, 0.0f);
  EXPECT_FALSE(read.grouped_query_attention());
  EXPECT_EQ(read.num_query_groups, c.num_attention_heads);
  EXPECT_FALSE(read.use_rope_scaling);
  EXPECT_EQ(error_of([&] { check_model_config(old, c, "x"); }), "");
  TransformerConfig rope = c;
  rope.position_embedding_type = "rope";
  std::string msg = error_of([&] { check_model_config(old, rope, "x"); });
  EXPECT_NE(msg.find("position_embedding_type is \"learned_absolute\", this run's is \"rope\" "
                     "(--position-embedding-type)"),
            std::string::npos)
      << msg;
  TransformerConfig no_bias = c;
  no_bias.add_bias_linear = false;
  msg = error_of([&] { check_model_config(old, no_bias, "x"); });
  EXPECT_NE(msg.find("(--disable-bias-linear)"), std::string::npos) << msg;
  TransformerConfig swiglu = c;
  swiglu.swiglu = true;
  msg = error_of([&] { check_model_config(old, swiglu, "x"); });
  EXPECT_NE(msg.find("swiglu is false, this run's is true (--swiglu)"), std::string::npos) << msg;
  TransformerConfig gqa = c;
  gqa.num_query_groups = 1;
  msg = error_of([&] { check_model_config(old, gqa, "x"); });
  EXPECT_NE(msg.find("num_query_groups is " + std::to_string(c.num_attention_heads) +
                     ", this run's is 1 (--num-query-groups)"),
            std::string::npos)
      << msg;
  // Written now, they round-trip.
  const nlohmann::json now = nlohmann::json::parse(model_config_json(rope).dump());
  EXPECT_TRUE(model_config_from_json(now, "x").rope());
  EXPECT_EQ(error_of([&] { check_model_config(now, rope, "x"); }), "");
}

TEST(CkptModelConfig, PaddedVocabularyMayDifferButTheVocabularyMayNot) {
  const TransformerConfig c = tiny_config();  // 40 tokens padded to 128
  const nlohmann::json saved = model_config_json(c);
  TransformerConfig tp4 = c;
  tp4.padded_vocab_size = 0;
  tp4.finalize(2);  // the padding of two tensor-parallel ranks
  ASSERT_EQ(tp4.padded_vocab_size, 256);
  EXPECT_EQ(error_of([&] { check_model_config(saved, tp4, "x"); }), "");
  TransformerConfig other = tp4;
  other.vocab_size = 41;
  const std::string msg = error_of([&] { check_model_config(saved, other, "x"); });
  EXPECT_NE(msg.find("vocab_size is 40, this run's is 41"), std::string::npos) << msg;
}

// Prediction depths with one depth's parameters (one depth, or --mtp-use-repeated-layer) read each other
// whatever their numbers of depths, when their layers are the same (NVIDIA's one-depth Nemotron-3 trained as
// Megatron's two repeated ones); otherwise the depths' fields are compared as any other.
TEST(CkptModelConfig, OneDepthOfParametersServesAnyNumberOfRepeatedDepths) {
  auto with = [](const std::string& pattern, int64_t depths, bool repeated) {
    TransformerConfig c = tiny_config();
    c.num_layers = int64_t(pattern.find('/'));
    c.hybrid_layer_pattern = pattern.substr(0, pattern.find('/'));
    c.mtp_hybrid_pattern = pattern.substr(pattern.find('/') + 1);
    c.mtp_num_layers = depths;
    c.mtp_use_repeated_layer = repeated;
    c.position_embedding_type = "none";
    c.padded_vocab_size = 0;
    c.finalize();
    return c;
  };
  const nlohmann::json one = model_config_json(with("*-/*-", 1, false));
  const nlohmann::json repeated3 = model_config_json(with("*-/*-", 3, true));
  EXPECT_EQ(error_of([&] { check_model_config(one, with("*-/*-", 2, true), "x"); }), "");
  EXPECT_EQ(error_of([&] { check_model_config(repeated3, with("*-/*-", 2, true), "x"); }), "");
  EXPECT_EQ(error_of([&] { check_model_config(repeated3, with("*-/*-", 1, false), "x"); }), "");
  // Two depths of their own parameters are not one depth's.
  std::string msg = error_of([&] { check_model_config(model_config_json(with("*-/*-", 2, false)),
                                                       with("*-/*-", 3, true), "x"); });
  EXPECT_NE(msg.find("--mtp-num-layers"), std::string::npos) << msg;
  msg = error_of([&] { check_model_config(one, with("*-/*-", 2, false), "x"); });
  EXPECT_NE(msg.find("--mtp-num-layers"), std::string::npos) << msg;
  // Other depth layers, or another decoder, are another model.
  msg = error_of([&] { check_model_config(one, with("*-/-", 2, true), "x"); });
  EXPECT_NE(msg.find("--hybrid-override-pattern"), std::string::npos) << msg;
  msg = error_of([&] { check_model_config(one, with("*--/*-", 2, true), "x"); });
  EXPECT_FALSE(msg.empty());
}

}  // namespace
}  // namespace lattice
