// `lattice serve` without its sockets: TextGenerator (the decoding engine shared with `generate
// --batch-size`) and TextGenerationService's endpoints, Megatron's PUT /api and OpenAI's completions.
// Log-probabilities are checked against log_softmax of GPTModel's full forward (an independent path:
// no KV cache, no batching), greedy tokens against its argmax, and every bad request against the
// one-line 400 that names its field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/tokenizer.h"
#include "model/gpt_model.h"
#include "model/text_generation.h"
#include "serve/text_generation_service.h"
#include "serve/token_text.h"
#include "serve_test_util.h"

namespace lattice {
namespace {

// log_softmax of the full forward's logits over tokens[0:n]: [n, V] in double.
std::vector<std::vector<double>> full_forward_logprobs(GPTModel& m, const std::vector<int32_t>& tokens) {
  const int64_t n = int64_t(tokens.size()), V = m.config().vocab_size, Vp = m.config().padded_vocab_size;
  std::vector<float> logits(static_cast<size_t>(n * Vp));
  m.forward_logits(tokens.data(), 1, n, logits.data());
  std::vector<std::vector<double>> lp(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(V)));
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits.data() + i * Vp;
    double mx = row[0], sum = 0;
    for (int64_t t = 0; t < V; ++t) mx = std::max(mx, double(row[t]));
    for (int64_t t = 0; t < V; ++t) sum += std::exp(double(row[t]) - mx);
    for (int64_t t = 0; t < V; ++t) lp[size_t(i)][size_t(t)] = double(row[t]) - mx - std::log(sum);
  }
  return lp;
}

TEST(TextGeneration, TokenLogprobIsLogSoftmaxAndTopIsSorted) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  std::vector<std::pair<int32_t, float>> best;
  for (int32_t t = 0; t < 5; ++t)
    EXPECT_NEAR(token_logprob(logits.data(), 5, t, 3, &best), double(logits[size_t(t)]) - std::log(z), 1e-6);
  ASSERT_EQ(best.size(), 3u);
  EXPECT_EQ(best[0].first, 1);  // the tie of 1 and 3: the lower id first
  EXPECT_EQ(best[1].first, 3);
  EXPECT_EQ(best[2].first, 0);
  EXPECT_NEAR(best[2].second, 1.0 - std::log(z), 1e-6);
  EXPECT_THROW(token_logprob(logits.data(), 5, 5), Error);
}

// Greedy decoding with log-probabilities: every token after the first scored as the full forward
// scores it, every new token the full forward's argmax; the same whether the prompts go one at a
// time or three together (and a finished prompt's sequence taken by the next).
TEST(TextGeneration, LogprobsAndGreedyTokensMatchTheFullForward) {
  auto model = byte_model();
  const int64_t V = model->config().vocab_size;
  std::vector<GenerationRequest> requests;
  for (const std::string& p : {"The quick", "brown fox jumps", "o", "over the lazy dog"}) {
    GenerationRequest r;
    r.prompt.assign(p.begin(), p.end());
    r.max_new_tokens = 6;
    r.sampling.temperature = 0;
    r.logprobs = true;
    r.top_logprobs = 2;
    requests.push_back(r);
  }
  TextGenerator alone(*model, 1, false), together(*model, 3, false);
  const std::vector<GenerationResult> a = alone.run(requests), b = together.run(requests);
  ASSERT_EQ(a.size(), requests.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    const GenerationResult& r = a[i];
    EXPECT_EQ(r.tokens, b[i].tokens);
    ASSERT_EQ(int64_t(r.tokens.size()), r.prompt_length + 6);
    ASSERT_EQ(r.logprobs.size(), r.tokens.size() - 1);
    ASSERT_EQ(r.top_logprobs.size(), r.tokens.size() - 1);
    const auto want = full_forward_logprobs(*model, r.tokens);
    for (size_t k = 0; k + 1 < r.tokens.size(); ++k) {
      EXPECT_NEAR(r.logprobs[k], want[k][size_t(r.tokens[k + 1])], 2e-5) << "token " << k + 1;
      EXPECT_NEAR(b[i].logprobs[k], r.logprobs[k], 2e-5);
      int32_t argmax = 0;
      for (int32_t t = 1; t < V; ++t)
        if (want[k][size_t(t)] > want[k][size_t(argmax)]) argmax = t;
      EXPECT_EQ(r.top_logprobs[k][0].first, argmax) << "token " << k + 1;
      if (int64_t(k + 1) >= r.prompt_length) EXPECT_EQ(r.tokens[k + 1], argmax) << "new token " << k + 1;
    }
  }
}

// Continuous batching: a request that arrives while another decodes starts at the next step, in the
// free sequence, and ends first (it is shorter); each gets the tokens it gets alone.
TEST(TextGeneration, ARequestArrivingMidRunJoinsIt) {
  auto model = byte_model();
  GenerationRequest a, b;
  a.prompt = {65, 66, 67};
  a.max_new_tokens = 12;
  a.stream = PhiloxStream{3, 1};
  b.prompt = {70, 71};
  b.max_new_tokens = 3;
  b.stream = PhiloxStream{4, 1};
  TextGenerator gen(*model, 2, false);
  const std::vector<GenerationResult> alone = gen.run({a, b});
  bool a_given = false, b_arrived = false, b_given = false;
  std::vector<size_t> done_order;
  std::vector<GenerationResult> got(2);
  gen.run(
      [&](GenerationRequest& r, size_t& id) {
        if (!a_given) return r = a, id = 0, a_given = true;
        if (!b_arrived || b_given) return false;
        r = b, id = 1, b_given = true;
        return true;
      },
      [&](size_t id, const GenerationResult& r) {
        if (id == 0 && r.tokens.size() == a.prompt.size() + 2) b_arrived = true;
        return true;
      },
      [&](size_t id, const GenerationResult& r) {
        done_order.push_back(id);
        got[id] = r;
      });
  EXPECT_TRUE(b_given);
  EXPECT_EQ(done_order, (std::vector<size_t>{1, 0}));
  EXPECT_EQ(got[0].tokens, alone[0].tokens);
  EXPECT_EQ(got[1].tokens, alone[1].tokens);
}

// Penalties and bias steer the sampling, not the reported log-probabilities: at every step of a greedy run
// the token taken is the argmax of the model's log-probabilities (all of them, top_logprobs = V) adjusted by
// hand for the text so far; logit_bias +100 on one token makes it every token.
TEST(TextGeneration, PenaltiesAndBiasSteerTheSampling) {
  auto model = byte_model();
  const int64_t V = model->config().vocab_size;
  GenerationRequest r;
  r.prompt = {10, 20, 30, 40};
  r.max_new_tokens = 10;
  r.sampling.temperature = 0;
  r.sampling.frequency_penalty = 1.5f;
  r.sampling.presence_penalty = 0.5f;
  r.sampling.logit_bias = {{int32_t('e'), 1.0f}};
  r.logprobs = true;
  r.top_logprobs = V;
  TextGenerator gen(*model, 2, false);
  const GenerationResult got = gen.run({r})[0];
  ASSERT_EQ(got.tokens.size(), 14u);
  GenerationRequest plain = r;
  plain.sampling = SamplingConfig{0.0f};
  EXPECT_NE(gen.run({plain})[0].tokens, got.tokens) << "the penalties changed nothing";
  for (size_t k = 4; k < got.tokens.size(); ++k) {
    std::vector<float> l(static_cast<size_t>(V), -1e30f);
    for (const auto& [t, lp] : got.top_logprobs[k - 1]) l[size_t(t)] = lp;
    adjust_logits(l.data(), V, r.sampling, std::vector<int32_t>(got.tokens.begin(), got.tokens.begin() + long(k)), 4);
    EXPECT_EQ(got.tokens[k], int32_t(std::max_element(l.begin(), l.end()) - l.begin())) << "step " << k;
  }
  GenerationRequest biased = plain;
  biased.sampling.logit_bias = {{int32_t('A'), 100.0f}};
  const GenerationResult all_a = gen.run({biased})[0];
  EXPECT_EQ(std::vector<int32_t>(all_a.tokens.begin() + 4, all_a.tokens.end()), std::vector<int32_t>(10, int32_t('A')));
}

TEST(TextGeneration, StopTokenCallbackAndScoringOnly) {
  auto model = byte_model();
  GenerationRequest r;
  r.prompt = {10, 20, 30};
  r.max_new_tokens = 8;
  r.sampling.temperature = 0;
  TextGenerator gen(*model, 2, false);
  const GenerationResult free_run = gen.run({r})[0];
  ASSERT_EQ(free_run.tokens.size(), 11u);
  EXPECT_FALSE(free_run.stopped);
  // The third new token as the stop token: the tokens before its first appearance kept.
  r.stop_tokens = {free_run.tokens[5]};
  const auto first = std::find(free_run.tokens.begin() + 3, free_run.tokens.end(), free_run.tokens[5]);
  const GenerationResult stopped = gen.run({r})[0];
  EXPECT_TRUE(stopped.stopped);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(free_run.tokens.begin(), first));
  // Several stop tokens (a chat model's ends of turn): the first of any of them ends it.
  r.stop_tokens = {free_run.tokens[7], free_run.tokens[4]};
  const auto earliest = std::find_first_of(free_run.tokens.begin() + 3, free_run.tokens.end(), r.stop_tokens.begin(),
                                           r.stop_tokens.end());
  const GenerationResult either = gen.run({r})[0];
  EXPECT_TRUE(either.stopped);
  EXPECT_EQ(either.tokens, std::vector<int32_t>(free_run.tokens.begin(), earliest));
  // The callback ends it after the first new token.
  r.stop_tokens.clear();
  const GenerationResult cut = gen.run({r}, [](size_t, const GenerationResult& g) { return g.tokens.size() < 4; })[0];
  EXPECT_EQ(cut.tokens.size(), 4u);
  EXPECT_TRUE(cut.stopped);
  // No new token: the prompt scored.
  r.max_new_tokens = 0;
  r.logprobs = true;
  const GenerationResult scored = gen.run({r})[0];
  EXPECT_EQ(scored.tokens, r.prompt);
  EXPECT_EQ(scored.logprobs.size(), 2u);
  // What it cannot run.
  GenerationRequest bad = r;
  bad.prompt = {};
  EXPECT_THROW(gen.run({bad}), Error);
  bad.prompt = {1, 260};
  EXPECT_THROW(gen.run({bad}), Error);
  bad.prompt.assign(49, 7);  // longer than the context of 48, with log-probabilities
  EXPECT_THROW(gen.run({bad}), Error);
  bad.logprobs = false;  // without them its last 48 tokens are kept
  bad.max_new_tokens = 2;
  EXPECT_EQ(gen.run({bad})[0].tokens.size(), 51u);
}

TEST_F(ServiceFixture, MegatronApiAnswersWhatTheGeneratorDecodes) {
  const nlohmann::json reply = ok("PUT", "/api",
                                  {{"prompts", {"Hello", "a b"}}, {"tokens_to_generate", 5}, {"logprobs", true},
                                   {"temperature", 0.7}, {"top_k", 20}, {"random_seed", 99}});
  ASSERT_EQ(reply["text"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const std::string prompt = i == 0 ? "Hello" : "a b";
    GenerationRequest r;
    r.prompt.assign(prompt.begin(), prompt.end());
    r.max_new_tokens = 5;
    r.sampling.temperature = 0.7f;
    r.sampling.top_k = 20;
    r.stream = prompt_stream(99, i);
    r.stop_tokens = {tok->eod()};
    r.logprobs = true;
    TextGenerator gen(*model, 1, false);
    const GenerationResult want = gen.run({r})[0];
    EXPECT_EQ(reply["tokens"][i].get<std::vector<int32_t>>(), want.tokens);
    EXPECT_EQ(reply["text"][i].get<std::string>(), tok->decode(want.tokens));
    ASSERT_EQ(reply["logprobs"][i].size(), want.tokens.size() - 1);
    EXPECT_FLOAT_EQ(reply["logprobs"][i][0].get<float>(), want.logprobs[0]);
    ASSERT_EQ(reply["segments"][i].size(), want.tokens.size());
    EXPECT_EQ(reply["segments"][i][1].get<std::string>(), prompt.substr(1, 1));
  }
  // Without logprobs there is no "logprobs"; the same seed gives the same text.
  const nlohmann::json again =
      ok("PUT", "/api", {{"prompts", {"Hello"}}, {"tokens_to_generate", 5}, {"temperature", 0.7}, {"top_k", 20}, {"random_seed", 99}});
  EXPECT_FALSE(again.contains("logprobs"));
  EXPECT_EQ(again["tokens"][0], reply["tokens"][0]);
}

// vLLM's /tokenize and /detokenize: a text's ids as the completions encode it, each token's text on
// request, and back; bad ids and fields refused naming them.
TEST_F(ServiceFixture, TokenizeAndDetokenize) {
  const nlohmann::json t = ok("POST", "/tokenize", {{"prompt", "Hi!"}});
  EXPECT_EQ(t["tokens"], nlohmann::json({72, 105, 33}));  // one byte a token
  EXPECT_EQ(t["count"], 3);
  EXPECT_EQ(t["max_model_len"], 48);
  EXPECT_TRUE(t["token_strs"].is_null());
  const nlohmann::json s = ok("POST", "/v1/tokenize", {{"prompt", "Hi!"}, {"return_token_strs", true}});
  EXPECT_EQ(s["token_strs"], nlohmann::json({"H", "i", "!"}));
  EXPECT_EQ(ok("POST", "/detokenize", {{"tokens", {72, 105, 33}}})["prompt"], "Hi!");
  EXPECT_EQ(ok("POST", "/v1/detokenize", {{"tokens", nlohmann::json::array()}})["prompt"], "");
  const std::vector<std::tuple<std::string, std::string, int, std::string>> bad = {
      {"POST", R"({"prompt": 5})", 400, "prompt must be a text"},
      {"POST", R"({"prompt": "x", "truncate": 3})", 400, "unknown field \\\"truncate\\\""},
      {"POST", R"({"messages": [{"role": "user", "content": "x"}]})", 400, "this server has no chat template"},
      {"GET", "", 405, "takes POST"}};
  for (const auto& [method, body, status, says] : bad) {
    const HttpReply r = service->handle(method, "/tokenize", body);
    EXPECT_EQ(r.status, status) << body << ": " << r.body;
    EXPECT_NE(r.body.find(says), std::string::npos) << body << ": " << r.body;
  }
  const HttpReply r = service->handle("POST", "/detokenize", R"({"tokens": [72, 300]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("tokens: 300 is not an id in [0, 257)"), std::string::npos) << r.body;
}

TEST_F(ServiceFixture, RequestsWithoutASeedTakeTheNextOne) {
  const nlohmann::json body = {{"prompts", {"xyz"}}, {"tokens_to_generate", 12}};
  const nlohmann::json a = ok("PUT", "/api", body), b = ok("PUT", "/api", body);
  EXPECT_NE(a["tokens"][0], b["tokens"][0]);  // seeds 1234 and 1235
  nlohmann::json seeded = body;
  seeded["random_seed"] = 1235;
  EXPECT_EQ(ok("PUT", "/api", seeded)["tokens"][0], b["tokens"][0]);
}

TEST_F(ServiceFixture, CompletionsEchoScoresThePromptAsTheFullForward) {
  const std::string prompt = "scoring a prompt";
  const nlohmann::json reply = ok("POST", "/v1/completions",
                                  {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 1}, {"logprobs", 1},
                                   {"echo", true}, {"temperature", 0}});
  ASSERT_EQ(reply["choices"].size(), 1u);
  const nlohmann::json& c = reply["choices"][0];
  const nlohmann::json& lp = c["logprobs"];
  const size_t n = prompt.size() + 1;  // the prompt's bytes and one new token
  ASSERT_EQ(lp["tokens"].size(), n);
  ASSERT_EQ(lp["token_logprobs"].size(), n);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  const auto want = full_forward_logprobs(*model, tokens);
  for (size_t k = 1; k < prompt.size(); ++k)
    EXPECT_NEAR(lp["token_logprobs"][k].get<double>(), want[k - 1][size_t(tokens[k])], 2e-5) << k;
  // The new token: greedy, the likeliest after the prompt, its top log-probability its own.
  const std::string text = c["text"].get<std::string>();
  EXPECT_EQ(text.substr(0, prompt.size()), prompt);
  EXPECT_EQ(lp["top_logprobs"][n - 1].size(), 1u);
  EXPECT_EQ(lp["top_logprobs"][n - 1].begin().value().get<double>(), lp["token_logprobs"][n - 1].get<double>());
  // Offsets: each token's text where the offset says.
  for (size_t k = 0; k < n; ++k) {
    const std::string piece = lp["tokens"][k].get<std::string>();
    EXPECT_EQ(text.substr(lp["text_offset"][k].get<size_t>(), piece.size()), piece) << k;
  }
  EXPECT_EQ(reply["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(reply["usage"]["completion_tokens"], 1);
  EXPECT_EQ(reply["model"], "tiny");
  EXPECT_EQ(reply["object"], "text_completion");
}

TEST_F(ServiceFixture, CompletionsTokenPromptsStopStringsAndNoEcho) {
  // Free-running text, then the same with a stop string taken from it: the text cut before it.
  const nlohmann::json body = {{"prompt", {{104, 105}, {97}}}, {"max_tokens", 10}, {"temperature", 0}, {"logprobs", 0}};
  const nlohmann::json full = ok("POST", "/completions", body);
  ASSERT_EQ(full["choices"].size(), 2u);
  const std::string text = full["choices"][0]["text"].get<std::string>();
  ASSERT_GE(text.size(), 4u) << "the greedy text ended early";
  EXPECT_EQ(full["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(full["choices"][0]["logprobs"]["tokens"].size(), text.size());  // byte tokens, no prompt
  EXPECT_TRUE(full["choices"][0]["logprobs"]["top_logprobs"].is_null());   // logprobs 0
  nlohmann::json stop = body;
  const std::string stop_text = text.substr(2, 2);
  stop["stop"] = {"never said", stop_text};
  const nlohmann::json cut = ok("POST", "/completions", stop);
  for (size_t i = 0; i < 2; ++i) {  // each prompt's text cut before its first stop string, if it says one
    const nlohmann::json &was = full["choices"][i], &is = cut["choices"][i];
    const std::string before = was["text"].get<std::string>();
    const size_t at = before.find(stop_text);
    EXPECT_EQ(is["text"].get<std::string>(), before.substr(0, at)) << i;
    EXPECT_EQ(is["finish_reason"], at == std::string::npos ? "length" : "stop") << i;
    EXPECT_EQ(is["logprobs"]["tokens"].size(), std::min(at, before.size())) << i;
    for (size_t k = 0; k < is["logprobs"]["token_logprobs"].size(); ++k)
      EXPECT_EQ(is["logprobs"]["token_logprobs"][k], was["logprobs"]["token_logprobs"][k]);
  }
  EXPECT_LE(cut["choices"][0]["text"].get<std::string>().size(), 2u);
}

// stream: the pieces of each choice add up to the unstreamed text, the last one with its finish reason;
// with a stop string the text that could begin it is held back and nothing past it is sent.
TEST_F(ServiceFixture, StreamedCompletionsAddUpToTheText) {
  for (const bool with_stop : {false, true}) {
    nlohmann::json body = {{"prompt", {"The ", "a b"}}, {"max_tokens", 12}, {"temperature", 0.8}, {"seed", 5}};
    const nlohmann::json whole = ok("POST", "/v1/completions", body);
    std::string stop;
    if (with_stop) {
      stop = whole["choices"][0]["text"].get<std::string>().substr(3, 2);
      body["stop"] = stop;
    }
    const nlohmann::json want = ok("POST", "/v1/completions", body);
    body["stream"] = true;
    const auto events = stream_events(service->handle("POST", "/v1/completions", body.dump()));
    for (size_t i = 0; i < 2; ++i) {
      SCOPED_TRACE("choice " + std::to_string(i) + (with_stop ? " with the stop string " + stop : ""));
      std::string text, finish;
      for (const auto& [index, piece, reason] : events) {
        if (index != i) continue;
        EXPECT_TRUE(finish.empty()) << "a piece after the finish reason";
        if (with_stop) EXPECT_EQ(piece.find(stop), std::string::npos);
        text += piece;
        finish = reason;
      }
      EXPECT_EQ(text, want["choices"][i]["text"].get<std::string>());
      EXPECT_EQ(finish, want["choices"][i]["finish_reason"].get<std::string>());
    }
  }
}

// n: choice i * n + j is prompt i's j-th sample, from the stream of choice k's index, so n samples of one
// prompt are that prompt given n times; a prompt's tokens count once in usage. include_usage ends a
// stream with the usage.
TEST_F(ServiceFixture, NChoicesAndTheStreamsUsage) {
  const nlohmann::json body = {{"prompt", "ab"}, {"max_tokens", 7}, {"temperature", 1.0}, {"seed", 21}, {"n", 3}};
  const nlohmann::json three = ok("POST", "/v1/completions", body);
  nlohmann::json repeated = body;
  repeated["prompt"] = {"ab", "ab", "ab"};
  repeated.erase("n");
  const nlohmann::json want = ok("POST", "/v1/completions", repeated);
  ASSERT_EQ(three["choices"].size(), 3u);
  std::set<std::string> texts;
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(three["choices"][k]["index"], k);
    EXPECT_EQ(three["choices"][k]["text"], want["choices"][k]["text"]) << k;
    texts.insert(three["choices"][k]["text"].get<std::string>());
  }
  EXPECT_GT(texts.size(), 1u) << "the samples of one prompt should differ";
  EXPECT_EQ(three["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(want["usage"]["prompt_tokens"], 6);
  EXPECT_EQ(three["usage"]["completion_tokens"], want["usage"]["completion_tokens"]);
  // Two prompts, n 2: choices (0,0) (0,1) (1,0) (1,1).
  const nlohmann::json two = ok("POST", "/v1/completions",
                                {{"prompt", {"ab", "cd"}}, {"max_tokens", 5}, {"temperature", 1.0}, {"seed", 4}, {"n", 2}});
  const nlohmann::json each = ok("POST", "/v1/completions",
                                 {{"prompt", {"ab", "ab", "cd", "cd"}}, {"max_tokens", 5}, {"temperature", 1.0}, {"seed", 4}});
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(two["choices"][k]["text"], each["choices"][k]["text"]) << k;
  // The stream's pieces add up to each choice, and its last chunk before [DONE] is the usage.
  nlohmann::json streamed = body;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  const auto events = stream_events(service->handle("POST", "/v1/completions", streamed.dump()));
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(std::get<2>(events.back()), "usage");
  EXPECT_EQ(nlohmann::json::parse(std::get<1>(events.back())), three["usage"]);
  std::vector<std::string> text(3);
  for (const auto& [index, piece, reason] : events)
    if (index < 3) text[index] += piece;
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(text[k], three["choices"][k]["text"].get<std::string>()) << k;
}

// A tokenizer whose decode joins tokens with spaces (NullTokenizer, as SentencePiece's word markers):
// each token's text is the one it has in its place, so the pieces join to the text, at its offsets.
TEST(TokenText, PiecesJoinToTheTextForATokenizerThatJoinsWords) {
  auto model = byte_model();
  TokenizerSpec spec{"NullTokenizer"};
  spec.vocab_size = 250;
  auto tok = make_tokenizer(spec);
  EXPECT_EQ(tok->decode({5}), "5");
  EXPECT_EQ(token_piece(*tok, {4, 5}, 1, 5), " 5");
  ServeOptions o;
  o.log = false;
  TextGenerationService service(*model, *tok, o);
  const HttpReply r = service.handle(
      "POST", "/v1/completions", R"({"prompt": "5 17 42", "max_tokens": 4, "echo": true, "logprobs": 2, "temperature": 0})");
  ASSERT_EQ(r.status, 200) << r.body;
  const nlohmann::json c = nlohmann::json::parse(r.body)["choices"][0];
  const std::string text = c["text"].get<std::string>();
  EXPECT_EQ(text.substr(0, 7), "5 17 42");
  std::string joined;
  for (size_t k = 0; k < c["logprobs"]["tokens"].size(); ++k) {
    EXPECT_EQ(c["logprobs"]["text_offset"][k].get<size_t>(), joined.size()) << k;
    joined += c["logprobs"]["tokens"][k].get<std::string>();
    if (k > 0)
      for (const auto& [piece, lp] : c["logprobs"]["top_logprobs"][k].items()) EXPECT_EQ(piece[0], ' ') << k;
  }
  EXPECT_EQ(joined, text);
  const HttpReply api = service.handle("PUT", "/api", R"({"prompts": ["5 17"], "tokens_to_generate": 3, "random_seed": 2})");
  ASSERT_EQ(api.status, 200) << api.body;
  const nlohmann::json a = nlohmann::json::parse(api.body);
  std::string segments;
  for (const auto& s : a["segments"][0]) segments += s.get<std::string>();
  EXPECT_EQ(segments, a["text"][0].get<std::string>());
}

TEST(TokenText, StreamablePrefixEndsOnACharacterAndBeforeTheHeldBytes) {
  EXPECT_EQ(streamable_prefix("abc", 0), 3u);
  EXPECT_EQ(streamable_prefix("abc", 2), 1u);
  EXPECT_EQ(streamable_prefix("abc", 5), 0u);
  const std::string euro = "\xE2\x82\xAC";  // U+20AC, 3 bytes
  EXPECT_EQ(streamable_prefix("a" + euro, 0), 4u);
  EXPECT_EQ(streamable_prefix("a" + euro.substr(0, 2), 0), 1u);
  EXPECT_EQ(streamable_prefix("a" + euro.substr(0, 1), 0), 1u);
  EXPECT_EQ(streamable_prefix("a" + euro + "b", 1), 4u);
  EXPECT_EQ(streamable_prefix("a" + euro + "b", 2), 1u);  // the held byte cuts the character
  const std::string four = "\xF0\x9F\x98\x80";  // U+1F600
  EXPECT_EQ(streamable_prefix(four.substr(0, 3), 0), 0u);
  EXPECT_EQ(streamable_prefix(four, 0), 4u);
}

// A client that goes away after the first event ends the decoding; the server goes on serving.
TEST_F(ServiceFixture, AStreamWhoseClientLeavesStops) {
  const nlohmann::json body = {{"prompt", "x"}, {"max_tokens", 40}, {"stream", true}, {"seed", 1}};
  const auto events = stream_events(service->handle("POST", "/v1/completions", body.dump()), 1);
  EXPECT_EQ(events.size(), 1u);
  EXPECT_EQ(ok("PUT", "/api", {{"prompts", {"y"}}, {"tokens_to_generate", 2}})["tokens"][0].size(), 3u);
}

// --api-key: every request but GET /health carries "Authorization: Bearer <key>", else 401.
TEST(ServeApiKey, RequestsWithoutTheKeyAreRefused) {
  auto model = byte_model();
  auto tok = make_tokenizer(TokenizerSpec{"ByteTokenizer"});
  ServeOptions o;
  o.log = false;
  o.api_key = "s3cret";
  TextGenerationService service(*model, *tok, o);
  const std::string body = R"({"prompts": ["x"], "tokens_to_generate": 2})";
  HttpReply r = service.handle("PUT", "/api", body);
  EXPECT_EQ(r.status, 401);
  EXPECT_NE(r.body.find("Authorization: Bearer"), std::string::npos) << r.body;
  for (const char* wrong : {"Bearer s3cre", "Bearer s3cret!", "s3cret", "Bearer S3cret"}) {
    r = service.handle("PUT", "/api", body, wrong);
    EXPECT_EQ(r.status, 401) << wrong;
    EXPECT_NE(r.body.find("API key in Authorization is wrong"), std::string::npos) << r.body;
  }
  r = service.handle("POST", "/v1/completions", R"({"prompt": "x"})", "Bearer nope");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(nlohmann::json::parse(r.body)["error"]["message"], "the API key in Authorization is wrong");
  EXPECT_EQ(service.handle("PUT", "/api", body, "Bearer s3cret").status, 200);
  EXPECT_EQ(service.handle("GET", "/health", "").status, 200);
}

// Requests served at the same time are decoded together; each gets what it gets alone.
TEST_F(ServiceFixture, ConcurrentRequestsGetWhatTheyGetAlone) {
  std::vector<nlohmann::json> bodies;
  for (int i = 0; i < 4; ++i)
    bodies.push_back({{"prompts", {"request " + std::to_string(i), "more"}}, {"tokens_to_generate", 8 + i},
                      {"random_seed", 10 + i}});
  std::vector<std::string> alone, together(bodies.size());
  for (const auto& b : bodies) alone.push_back(service->handle("PUT", "/api", b.dump()).body);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < bodies.size(); ++i)
    threads.emplace_back([&, i] { together[i] = service->handle("PUT", "/api", bodies[i].dump()).body; });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < bodies.size(); ++i) {
    const auto a = nlohmann::json::parse(alone[i]), b = nlohmann::json::parse(together[i]);
    EXPECT_EQ(a["tokens"], b["tokens"]) << "request " << i;
  }
}

TEST_F(ServiceFixture, BadRequestsAreRefusedNamingTheField) {
  struct Case {
    const char* method;
    const char* path;
    std::string body;
    int status;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"PUT", "/api", "not json", 400, "not JSON"},
      {"PUT", "/api", "[1]", 400, "not a JSON object"},
      {"PUT", "/api", R"({"tokens_to_generate": 3})", 400, "prompts argument required"},
      {"PUT", "/api", R"({"prompts": "x"})", 400, "prompts is not a list of strings"},
      {"PUT", "/api", R"({"prompts": []})", 400, "prompts is empty"},
      {"PUT", "/api", R"({"prompts": ["x"], "tokens_to_generate": -1})", 400, "tokens_to_generate must be an integer"},
      {"PUT", "/api", R"({"prompts": ["x"], "tokens_to_generate": 1.5})", 400, "tokens_to_generate must be an integer"},
      {"PUT", "/api", R"({"prompts": ["x"], "tokens_to_generate": 0})", 400, "logprobs should be True"},
      {"PUT", "/api", R"({"prompts": ["x"], "temperature": 0})", 400, "temperature must be a positive number"},
      {"PUT", "/api", R"({"prompts": ["x"], "top_k": 1001})", 400, "top_k must be an integer in [0, 1000]"},
      {"PUT", "/api", R"({"prompts": ["x"], "top_k": 2, "top_p": 0.5})", 400, "cannot set both top-k and top-p"},
      {"PUT", "/api", R"({"prompts": ["x"], "logprobs": "yes"})", 400, "logprobs must be true or false"},
      {"PUT", "/api", R"({"prompts": [""]})", 400, "Empty prompts require add_BOS=true"},
      {"PUT", "/api", R"({"prompts": ["x"], "max_len": 3})", 400, "max_len is no longer used"},
      {"PUT", "/api", R"({"prompts": ["x"], "beam_width": 2})", 400, "beam_width is not supported"},
      {"PUT", "/api", R"({"prompts": ["x"], "temprature": 1})", 400, "unknown field \"temprature\""},
      {"PUT", "/api", R"({"prompts": ["x"], "tokens_to_generate": 48})", 400, "longer than the model's context of 48"},
      {"POST", "/api", R"({"prompts": ["x"]})", 405, "/api takes PUT"},
      {"POST", "/v1/completions", R"({"max_tokens": 3})", 400, "prompt is required"},
      {"POST", "/v1/completions", R"({"prompt": [1, 999]})", 400, "token 999 is not an id in [0, 257)"},
      {"POST", "/v1/completions", R"({"prompt": [[1], []]})", 400, "an empty list of token ids"},
      {"POST", "/v1/completions", R"({"prompt": {"a": 1}})", 400, "prompt must be a text"},
      {"POST", "/v1/completions", R"({"prompt": "x", "n": 2, "best_of": 3})", 400, "best_of other than n is not supported"},
      {"POST", "/v1/completions", R"({"prompt": "x", "n": 129})", 400, "n must be an integer in [1, 128]"},
      {"POST", "/v1/completions", R"({"prompt": ["a", "b", "c"], "n": 43})", 400, "n 43 x 3 prompts: at most 128 choices"},
      {"POST", "/v1/completions", R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}})", 400,
       "include_usage must be true or false"},
      {"POST", "/v1/completions", R"({"prompt": "x", "stream": true, "echo": true})", 400, "echo does not go with stream"},
      {"POST", "/v1/completions", R"({"prompt": "x", "stream": true, "logprobs": 1})", 400,
       "logprobs does not go with stream"},
      {"POST", "/v1/completions", R"({"prompt": "x", "logprobs": 21})", 400, "logprobs must be an integer in [0, 20]"},
      {"POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens 0 returns nothing"},
      {"POST", "/v1/completions", R"({"prompt": "x", "stop": [1]})", 400, "stop must be a text"},
      {"POST", "/v1/completions", R"({"prompt": "x", "presence_penalty": 3})", 400, "presence_penalty must be a number in [-2, 2]"},
      {"POST", "/v1/completions", R"({"prompt": "x", "repetition_penalty": 0})", 400, "repetition_penalty must be a number > 0"},
      {"POST", "/v1/completions", R"({"prompt": "x", "logit_bias": {"300": 1}})", 400, "logit_bias: '300' is not a token id (0 to 256)"},
      {"POST", "/v1/completions", R"({"prompt": "x", "logit_bias": {"65": 101}})", 400, "must be a number in [-100, 100], got 101"},
      {"POST", "/v1/completions", R"({"prompt": "x", "logit_bias": [1]})", 400, "logit_bias must be an object"},
      {"POST", "/v1/completions", R"({"prompt": "x", "top_p": 0})", 400, "top_p must be a number in (0, 1]"},
      {"GET", "/v1/completions", "", 405, "takes POST"},
      {"GET", "/generate", "", 404, "no such endpoint: /generate"},
      {"POST", "/health", "", 405, "/health takes GET"},
  };
  for (const Case& c : cases) {
    const HttpReply r = service->handle(c.method, c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.method << " " << c.path << " " << c.body << ": " << r.body;
    EXPECT_NE(r.body.find(c.says), std::string::npos) << c.body << ": " << r.body;
    EXPECT_EQ(std::count(r.body.begin(), r.body.end(), '\n'), r.content_type == "text/plain" ? 1 : 0) << r.body;
  }
  // Still serving.
  EXPECT_EQ(ok("GET", "/v1/models", nullptr)["data"][0]["id"], "tiny");
  EXPECT_EQ(ok("GET", "/health", nullptr)["status"], "ok");
}

}  // namespace
}  // namespace lattice
