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
#include "data/blended_dataset.h"
#include "data/sft_dataset.h"
#include "data/tokenizer.h"
#include "data/training_data.h"
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
  EXPECT_NE(error_of(ok, rewrites).find("is not a token prefix of the whole conversation's"), std::string::npos)
      << error_of(ok, rewrites);
  EXPECT_NE(error_of(ok, "{{ raise_exception('no') }}").find("conversation line 1: chat template: no"),
            std::string::npos)
      << error_of(ok, "{{ raise_exception('no') }}");
  std::filesystem::remove_all(dir);
}

// A template that writes the last answer otherwise than the earlier ones, as Qwen3's does (an empty thinking
// block before the last answer only, its earlier answers' reasoning dropped): each answer's tokens are those
// of the whole conversation's text from the generation prompt of its turn to the end of its turn (what
// follows the content when the answer is the last message: "<e>" here) - the text the model is shown
// later turns with.
TEST(SftDataset, TemplatesWritingTheLastAnswerOtherwise) {
  const std::string dir = ::testing::TempDir() + "/lattice_sft_qwen3_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/t.jinja")
      << "{%- for m in messages %}<{{ m['role'] }}>"
         "{%- if m['role'] == 'assistant' %}{%- set c = m['content'] %}"
         "{%- if '</think>' in c %}{%- set c = c.split('</think>')[-1] %}{%- endif %}"
         "{%- if loop.last %}<think></think>{%- endif %}{{ c }}<e>"
         "{%- else %}{{ m['content'] }}<e>{%- endif %}{%- endfor %}"
         "{%- if add_generation_prompt %}<assistant>{%- endif %}";
  std::shared_ptr<const Tokenizer> tok = make_tokenizer(TokenizerSpec{"ByteTokenizer"});
  const ChatTemplate chat = ChatTemplate::load(dir + "/t.jinja", "--chat-template");
  const auto messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Q1"},
      {"role": "assistant", "content": "<think>r</think>A1"}, {"role": "user", "content": "Q2"},
      {"role": "assistant", "content": "A2"}])");
  const SftConversation c = tokenize_conversation(chat, *tok, messages, "line 1");
  const std::string text(c.tokens.begin(), c.tokens.end());  // one byte a token
  EXPECT_EQ(text, "<user>Q1<e><assistant>A1<e><user>Q2<e><assistant><think></think>A2<e>");
  std::string trained;
  for (size_t i = 0; i < c.tokens.size(); ++i)
    if (c.trained[i]) trained += char(c.tokens[i]);
  EXPECT_EQ(trained, "A1<e><think></think>A2<e>");
  std::filesystem::remove_all(dir);
}

// --sft with several files: --data-path w1 f1 w2 f2 blends them as pretraining data is blended (blend
// sample s is sample k of file d, (d, k) by Megatron's greedy order; sample k of a file's split is its
// line begin + k mod lines), each file split by --split on its own; the per-split paths take each file
// whole; files without weights are each read once, and a run needing more is refused.
TEST(SftDataset, SeveralFilesAreBlendedAndSplit) {
  const std::string dir = ::testing::TempDir() + "/lattice_sft_blend_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string a_path = kDir + "/conversations.jsonl", b_path = dir + "/b.jsonl";
  {
    std::ofstream b(b_path);
    for (int i = 0; i < 10; ++i)
      b << R"({"messages": [{"role": "user", "content": "q)" << i << R"("}, {"role": "assistant", "content": "a)" << i
        << R"("}]})" << "\n";
  }
  const auto a_file = conversations(a_path, kDir + "/chat.jinja");
  const auto b_file = conversations(b_path, kDir + "/chat.jinja");
  TrainArgs args;
  args.sft = true;
  args.tokenizer_type = "ByteTokenizer";
  args.chat_template = kDir + "/chat.jinja";
  args.seq_length = 96;
  args.global_batch_size = 4;
  args.micro_batch_size = 2;
  args.train_iters = 25;
  args.eval_interval = 25;
  args.eval_iters = 1;
  args.split = "80,20,0";
  args.data_path = {"0.3", a_path, "0.7", b_path};
  const int64_t S = args.seq_length;
  // What a sample of one file's lines [begin, end) at k must be.
  auto expect_line = [&](const SampleSource& got, int64_t s, const SftConversations& file, int64_t begin,
                         int64_t end, int64_t k) {
    std::vector<int32_t> tokens(static_cast<size_t>(S + 1)), want_tokens(static_cast<size_t>(S + 1)), segments(static_cast<size_t>(S)), want_segments(static_cast<size_t>(S));
    std::vector<float> mask(static_cast<size_t>(S)), want_mask(static_cast<size_t>(S));
    got.sample_with_extras(s, tokens.data(), mask.data(), segments.data());
    file.pack(begin + k % (end - begin), S, 1, want_tokens.data(), want_mask.data(), want_segments.data());
    EXPECT_EQ(tokens, want_tokens) << "sample " << s;
    EXPECT_EQ(mask, want_mask) << "sample " << s;
    EXPECT_EQ(segments, want_segments) << "sample " << s;
  };
  std::string summary;
  TrainingData t = make_training_data(args, 257);
  const auto* blend = dynamic_cast<const BlendedDataset*>(t.train.get());
  ASSERT_NE(blend, nullptr);
  EXPECT_TRUE(blend->has_extras());
  EXPECT_EQ(blend->size(), 100);
  // --split 80,20,0: file a's 5 lines give the train split lines [0, 4), file b's 10 lines [0, 8).
  ASSERT_EQ(a_file->size(), 5);
  const SplitRange ra = split_ranges(args.split, 5)[0], rb = split_ranges(args.split, 10)[0];
  ASSERT_EQ(ra.end, 4);
  ASSERT_EQ(rb.end, 8);
  int64_t from_a = 0;
  for (int64_t s = 0; s < blend->size(); ++s) {
    const auto [d, k] = blend->blending_index().locate(s);
    from_a += d == 0;
    if (d == 0) expect_line(*blend, s, *a_file, ra.begin, ra.end, k);
    else expect_line(*blend, s, *b_file, rb.begin, rb.end, k);
  }
  EXPECT_EQ(from_a, 30);  // the weights, exactly at 100 samples
  // The validation split blends the files' validation lines: a's [4, 5), b's [8, 10).
  const auto* valid = dynamic_cast<const BlendedDataset*>(t.valid.get());
  ASSERT_NE(valid, nullptr);
  for (int64_t s = 0; s < valid->size(); ++s) {
    const auto [d, k] = valid->blending_index().locate(s);
    if (d == 0) expect_line(*valid, s, *a_file, 4, 5, k);
    else expect_line(*valid, s, *b_file, 8, 10, k);
  }
  EXPECT_EQ(t.test, nullptr);

  // The per-split paths: each file whole, for its split.
  args.data_path.clear();
  args.train_data_path = {b_path};
  args.valid_data_path = {a_path};
  t = make_training_data(args, 257);
  ASSERT_NE(t.train, nullptr);
  ASSERT_NE(t.valid, nullptr);
  EXPECT_EQ(dynamic_cast<const BlendedDataset*>(t.train.get()), nullptr);
  EXPECT_EQ(t.train->size(), 100);
  for (int64_t s : {0, 9, 10, 57}) expect_line(*t.train, s, *b_file, 0, 10, s);
  for (int64_t s : {0, 4, 7}) expect_line(*t.valid, s, *a_file, 0, 5, s);

  // Files without weights: each one epoch of its split, blended by their lines; 100 samples are more than
  // the 5 + 10 lines hold.
  args.train_data_path.clear();
  args.valid_data_path.clear();
  args.data_path = {a_path, b_path};
  args.split = "100,0,0";
  try {
    make_training_data(args, 257);
    ADD_FAILURE() << "a run reading more than the files' lines once was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hold 15 samples in one epoch of the train split, fewer than the 100"),
              std::string::npos)
        << e.what();
  }
  args.train_iters = 3;  // 12 samples of the 15 lines, each line at most once
  args.eval_interval = 3;
  t = make_training_data(args, 257);
  const auto* listed = dynamic_cast<const BlendedDataset*>(t.train.get());
  ASSERT_NE(listed, nullptr);
  EXPECT_EQ(listed->size(), 12);
  std::vector<int64_t> taken(2, 0);
  for (int64_t s = 0; s < listed->size(); ++s) {
    const auto [d, k] = listed->blending_index().locate(s);
    EXPECT_EQ(k, taken[size_t(d)]++);  // each line at most once
    if (d == 0) expect_line(*listed, s, *a_file, 0, 5, k);
    else expect_line(*listed, s, *b_file, 0, 10, k);
  }
  EXPECT_EQ(taken[0], 4);  // the sizes' weights, 5/15 and 10/15 of 12
  EXPECT_EQ(taken[1], 8);

  // --split giving the train split nothing names the file.
  args.split = "0,1,0";
  try {
    make_training_data(args, 257);
    ADD_FAILURE() << "an empty train split was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--split 0,1,0 gives the train split weight 0: none of the 5 conversation "
                                         "lines of " + a_path),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lattice
