// --sft's data (data/sft_dataset.h) against an independent Python packing of the same conversations
// (tests/fixtures/make_sft_fixture.py: Megatron's SFTDataset packing written again, with Python's
// jinja2 for the chat template, over byte tokens): every sample's tokens, loss mask and segments. Then
// what a user gets wrong: a bad line, a template that rewrites earlier turns.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "core/error.h"
#include "data/sft_dataset.h"
#include "data/tokenizer.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "train/train_step.h"

namespace lattice {
namespace {

const std::string kDir = std::string(LATTICE_SOURCE_DIR) + "/tests/fixtures/sft";

std::shared_ptr<const SftConversations> conversations(const std::string& file, const std::string& templ) {
  std::shared_ptr<const Tokenizer> tok = make_tokenizer(TokenizerSpec{"ByteTokenizer"});
  return std::make_shared<SftConversations>(file, tok, ChatTemplate::load(templ, "--chat-template"));
}

TEST(SftDataset, PackedAsThePythonReference) {
  std::ifstream f(kDir + "/expected.json");
  const nlohmann::json want = nlohmann::json::parse(f);
  const int64_t S = want["seq_length"];
  const auto data = conversations(kDir + "/conversations.jsonl", kDir + "/chat.jinja");
  ASSERT_EQ(data->size(), int64_t(want["samples"].size()));  // (the blank line is skipped)
  const SftSamples samples(data, 0, data->size(), S);
  EXPECT_TRUE(samples.has_extras());
  for (const char* set : {"samples", "samples_cp2"}) {  // the second with context parallelism 2's padding
    const SftSamples packed(data, 0, data->size(), S, std::string(set) == "samples" ? 1 : 4);
    for (int64_t i = 0; i < data->size(); ++i) {
      SCOPED_TRACE(std::string(set) + " " + std::to_string(i));
      std::vector<int32_t> tokens(static_cast<size_t>(S + 1)), segments(static_cast<size_t>(S));
      std::vector<float> mask(static_cast<size_t>(S));
      packed.sample_with_extras(i, tokens.data(), mask.data(), segments.data());
      const nlohmann::json& w = want[set][size_t(i)];
      EXPECT_EQ(tokens, w["tokens"].get<std::vector<int32_t>>());
      EXPECT_EQ(mask, w["loss_mask"].get<std::vector<float>>());
      EXPECT_EQ(segments, w["segments"].get<std::vector<int32_t>>());
    }
  }
  // A split's sample i is its line begin + i mod its lines; a micro-batch stacks them.
  const SftSamples tail(data, 3, 5, S);
  std::vector<int32_t> a(size_t(S + 1));
  tail.sample(3, a.data());  // line 3 + 3 mod 2 = 4, its tokens alone
  EXPECT_EQ(a, want["samples"][4]["tokens"].get<std::vector<int32_t>>());
  MicroBatch mb;
  fill_micro_batch(tail, 0, 2, &mb);
  ASSERT_EQ(mb.loss_mask.size(), size_t(2 * S));
  EXPECT_EQ(std::vector<float>(mb.loss_mask.begin() + S, mb.loss_mask.end()),
            want["samples"][4]["loss_mask"].get<std::vector<float>>());
}

// A training step over SFT samples passes their loss mask and segments to the model: its loss is the
// model's masked loss over the packed conversations (not the unmasked one, nor one over whole rows).
TEST(SftDataset, ATrainingStepUsesTheMaskAndSegments) {
  std::ifstream f(kDir + "/expected.json");
  const int64_t S = nlohmann::json::parse(f)["seq_length"];
  const auto data = conversations(kDir + "/conversations.jsonl", kDir + "/chat.jinja");
  const SftSamples samples(data, 0, data->size(), S);
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 257;
  c.max_position_embeddings = S;
  c.hidden_dropout = c.attention_dropout = 0;
  c.finalize();
  const int64_t B = 2;
  GPTModel model(c, B, S);
  model.init_parameters(3);
  model.set_document_boundaries(DocumentBoundaries{256, false, true, true});  // as the trainer sets them for --sft
  MicroBatch mb;
  fill_micro_batch(samples, 3, B, &mb);  // samples 3 and 4: the second trains in its second conversation
  const LossSum want = model.forward_loss_sum(mb.tokens.data(), mb.loss_mask.data(), B, S, mb.segments.data());
  const LossSum unmasked = model.forward_loss_sum(mb.tokens.data(), nullptr, B, S, mb.segments.data());
  model.set_document_boundaries(DocumentBoundaries{});  // one document a row: a conversation sees the one before
  const LossSum one_document = model.forward_loss_sum(mb.tokens.data(), mb.loss_mask.data(), B, S);
  model.set_document_boundaries(DocumentBoundaries{256, false, true, true});
  double trained = 0;
  for (float m : mb.loss_mask) trained += m;
  EXPECT_EQ(want.count, trained);
  StepConfig sc{B, B, S, 0.0, 3};
  sc.first_sample = 3;
  Optimizer opt(model.params(), OptimizerConfig{});
  const StepResult r = train_step(model, opt, samples, sc, 0, 1e-3, 0.0);  // (its loss is the forward's)
  EXPECT_NEAR(r.lm_loss, want.sum / want.count, 1e-6);
  EXPECT_GT(std::fabs(r.lm_loss - unmasked.sum / unmasked.count), 1e-3);
  EXPECT_GT(std::fabs(r.lm_loss - one_document.sum / one_document.count), 1e-5);
}

TEST(SftDataset, BadLinesAndTemplatesAreNamed) {
  const std::string dir = ::testing::TempDir() + "/lattice_sft_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  auto error_of = [&](const std::string& lines, const std::string& templ) {
    std::ofstream(dir + "/c.jsonl") << lines;
    std::ofstream(dir + "/t.jinja") << templ;
    try {
      const auto data = conversations(dir + "/c.jsonl", dir + "/t.jinja");
      std::vector<int32_t> tokens(65);
      SftSamples(data, 0, data->size(), 64).sample(0, tokens.data());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string plain = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
                            "{% if add_generation_prompt %}[assistant]{% endif %}";
  const std::string ok = R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})";
  EXPECT_EQ(error_of(ok + "\n", plain), "(no error)");
  EXPECT_NE(error_of(ok + "\nnot json\n", plain).find("c.jsonl line 2: not JSON"), std::string::npos);
  EXPECT_NE(error_of(R"({"text": "x"})", plain).find("line 1: expected an object with a non-empty \"messages\" list"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"messages": [{"content": "x"}]})", plain).find("every message needs a text \"role\""),
            std::string::npos);
  EXPECT_NE(error_of("\n\n", plain).find("no conversations"), std::string::npos);
  // A template that writes the last message differently from the others: the assistant's tokens cannot
  // be told apart (as Qwen3's dropping earlier reasoning).
  const std::string rewrites = "{% for m in messages %}{% if loop.last %}<last>{% endif %}{{ m['content'] }}"
                               "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}";
  EXPECT_NE(error_of(ok, rewrites).find("are not token prefixes of the whole conversation's"), std::string::npos)
      << error_of(ok, rewrites);
  EXPECT_NE(error_of(ok, "{{ raise_exception('no') }}").find("conversation line 1: chat template: no"),
            std::string::npos)
      << error_of(ok, "{{ raise_exception('no') }}");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lattice
