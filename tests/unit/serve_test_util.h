// What the `lattice serve` tests share: a small random model over ByteTokenizer, a service around it,
// and the events of a streamed answer.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "model/gpt_model.h"
#include "serve/text_generation_service.h"

namespace lattice {

// A random 2-layer model over ByteTokenizer's 257 ids (vocabulary 260), context 48. Its output layer
// (untied) scores only ASCII: the other rows are zero, so its likeliest tokens (greedy, top-k 20)
// are printable-or-control ASCII bytes whose texts JSON carries as they are.
inline std::unique_ptr<GPTModel> byte_model() {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 260;
  c.max_position_embeddings = 48;
  c.untie_embeddings_and_output_weights = true;
  c.hidden_dropout = c.attention_dropout = 0;
  c.finalize();
  auto m = std::make_unique<GPTModel>(c, 1, c.max_position_embeddings);
  std::mt19937 gen(5);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  for (int64_t i = 0; i < m->params().numel(); ++i) m->params().params()[i] = nd(gen);
  const ParamInfo& out = m->params().info("output_layer.weight");  // [Vp, C]
  float* w = m->params().params() + out.offset;
  for (int64_t v = 0; v < out.shape[0]; ++v)
    for (int64_t k = 0; k < out.shape[1]; ++k) w[v * out.shape[1] + k] = v < 128 ? 4 * w[v * out.shape[1] + k] : 0.0f;
  return m;
}

struct ServiceFixture : ::testing::Test {
  std::unique_ptr<GPTModel> model = byte_model();
  std::unique_ptr<Tokenizer> tok = make_tokenizer(TokenizerSpec{"ByteTokenizer"});
  std::unique_ptr<TextGenerationService> service;
  void SetUp() override {
    ServeOptions o;
    o.sequences = 3;
    o.model_name = "tiny";
    o.log = false;
    configure(o);
    service = std::make_unique<TextGenerationService>(*model, *tok, std::move(o));
  }
  virtual void configure(ServeOptions&) {}  // a fixture's other options
  nlohmann::json ok(const std::string& method, const std::string& path, const nlohmann::json& body) {
    const HttpReply r = service->handle(method, path, body.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? nlohmann::json::parse(r.body) : nlohmann::json();
  }
};

// The events of a streamed completion or chat completion: (choice index, text, finish_reason or "") in
// order, include_usage's chunk as (-1, its usage, "usage"); [DONE] last.
inline std::vector<std::tuple<size_t, std::string, std::string>> stream_events(const HttpReply& reply,
                                                                             int stop_after = -1) {
  std::vector<std::tuple<size_t, std::string, std::string>> events;
  std::string all;
  int writes = 0;
  EXPECT_TRUE(bool(reply.stream));
  if (!reply.stream) return events;
  EXPECT_EQ(reply.content_type, "text/event-stream");
  reply.stream([&](const std::string& piece) {
    all += piece;
    return stop_after < 0 || ++writes < stop_after;
  });
  size_t at = 0;
  bool done = false;
  while (at < all.size()) {
    const size_t end = all.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line: " << all.substr(at);
    if (end == std::string::npos) break;
    const std::string line = all.substr(at, end - at);
    at = end + 2;
    EXPECT_EQ(line.rfind("data: ", 0), 0u) << line;
    EXPECT_FALSE(done) << "an event after [DONE]";
    if (line == "data: [DONE]") {
      done = true;
      continue;
    }
    const nlohmann::json chunk = nlohmann::json::parse(line.substr(6));
    EXPECT_TRUE(chunk["object"] == "text_completion" || chunk["object"] == "chat.completion.chunk") << line;
    if (chunk["choices"].empty()) {  // include_usage's last chunk: (-1, the usage, "usage")
      events.emplace_back(size_t(-1), chunk["usage"].dump(), "usage");
      continue;
    }
    const nlohmann::json& c = chunk["choices"][0];
    // a completion's text, or a chat completion's delta's content
    const std::string text = c.contains("text") ? c["text"].get<std::string>() : c["delta"].value("content", "");
    events.emplace_back(c["index"].get<size_t>(), text,
                        c["finish_reason"].is_null() ? "" : c["finish_reason"].get<std::string>());
  }
  if (stop_after < 0) EXPECT_TRUE(done) << all;
  return events;
}

}  // namespace lattice
