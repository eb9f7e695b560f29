// `lattice serve`'s POST /v1/chat/completions without its sockets: a chat completion is the completion
// of the chat template's text (the same tokens, log-probabilities and samples as /v1/completions given
// that text and seed), streamed or not; the template's variables (tools, chat_template_kwargs) reach
// it; its raise_exception and every bad field are answered 400 naming them.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "serve_test_util.h"

namespace lattice {
namespace {

using nlohmann::json;

// A ChatML-like template over ByteTokenizer's bytes (short: the model's context is 48): "<r>content"
// per message (r: the role's initial), the system message required to come first, tools and a flag
// from chat_template_kwargs written when given.
const char* kTemplate =
    "{% if messages[0]['role'] == 'system' %}{% set rest = messages[1:] %}{{ '[S]' + messages[0]['content'] }}"
    "{% else %}{% set rest = messages %}{% endif %}"
    "{% if tools is defined %}[T]{{ tools | map(attribute='name') | join(',') }}{% endif %}"
    "{% if shout %}[!]{% endif %}"
    "{% for m in rest %}{% if m['role'] == 'system' %}{{ raise_exception('System message must come first') }}"
    "{% endif %}<{{ m['role'][0] }}>{{ m['content'] | trim }}{% endfor %}"
    "{% if add_generation_prompt %}<a>{% endif %}";

struct ChatFixture : ServiceFixture {
  std::string dir = ::testing::TempDir() + "/lattice_chat_" + std::to_string(::getpid());
  void configure(ServeOptions& o) override {
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/chat.jinja") << kTemplate;
    o.chat_template = ChatTemplate::load(dir + "/chat.jinja", "--chat-template");
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
};

const json kMessages = {{{"role", "system"}, {"content", "B."}},
                        {{"role", "user"}, {"content", "  Hi  "}},
                        {{"role", "assistant"}, {"content", "Ok"}},
                        {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}};
const std::string kText = "[S]B.<u>Hi<a>Ok<u>a\nb<a>";

TEST_F(ChatFixture, AChatCompletionIsTheCompletionOfTheTemplatesText) {
  const json chat = ok("POST", "/v1/chat/completions",
                       {{"model", "tiny"}, {"messages", kMessages}, {"max_tokens", 9}, {"temperature", 0.8}, {"seed", 7},
                        {"logprobs", true}, {"top_logprobs", 2}});
  const json plain = ok("POST", "/v1/completions",
                        {{"prompt", kText}, {"max_tokens", 9}, {"temperature", 0.8}, {"seed", 7}, {"logprobs", 2}});
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  const json& c = chat["choices"][0];
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_EQ(c["message"]["content"], plain["choices"][0]["text"]);
  EXPECT_EQ(c["finish_reason"], plain["choices"][0]["finish_reason"]);
  EXPECT_EQ(chat["usage"]["prompt_tokens"], int64_t(kText.size()));  // one byte a token
  EXPECT_EQ(chat["usage"], plain["usage"]);
  const json& entries = c["logprobs"]["content"];
  const json& want = plain["choices"][0]["logprobs"];
  ASSERT_EQ(entries.size(), want["tokens"].size());
  for (size_t k = 0; k < entries.size(); ++k) {
    EXPECT_EQ(entries[k]["token"], want["tokens"][k]);
    EXPECT_EQ(entries[k]["logprob"], want["token_logprobs"][k]);
    // bytes: the token's own (a byte-level token may be part of a character: its text then shows U+FFFD)
    const std::vector<int> bytes = entries[k]["bytes"].get<std::vector<int>>();
    const std::string piece = entries[k]["token"].get<std::string>();
    if (std::all_of(bytes.begin(), bytes.end(), [](int b) { return b < 128; }))
      EXPECT_EQ(std::string(bytes.begin(), bytes.end()), piece);
    else
      EXPECT_EQ(piece, "\xEF\xBF\xBD");
    ASSERT_EQ(entries[k]["top_logprobs"].size(), 2u);
    for (const json& t : entries[k]["top_logprobs"])
      EXPECT_EQ(want["top_logprobs"][k][t["token"].get<std::string>()], t["logprob"]);
  }
  // Without max_tokens the answer may fill the context.
  const json rest = ok("POST", "/chat/completions", {{"messages", kMessages}, {"temperature", 0}});
  EXPECT_EQ(rest["usage"]["total_tokens"].get<int64_t>() <= 48, true);
  EXPECT_EQ(rest["choices"][0]["finish_reason"] == "length", rest["usage"]["total_tokens"] == 48) << rest.dump();
}

TEST_F(ChatFixture, TheTemplatesVariablesAndStopStrings) {
  // tools and chat_template_kwargs reach the template: the same answer as the text they make.
  json body = {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_tokens", 6}, {"temperature", 0.5}, {"seed", 3},
               {"tools", {{{"name", "f"}}, {{"name", "g"}}}}, {"chat_template_kwargs", {{"shout", true}}}};
  const json chat = ok("POST", "/v1/chat/completions", body);
  const json plain = ok("POST", "/v1/completions",
                        {{"prompt", "[T]f,g[!]<u>x<a>"}, {"max_tokens", 6}, {"temperature", 0.5}, {"seed", 3}});
  EXPECT_EQ(chat["choices"][0]["message"]["content"], plain["choices"][0]["text"]);
  // tool_choice "none": no tools; add_generation_prompt false: the text ends with the last message.
  body["tool_choice"] = "none";
  body["add_generation_prompt"] = false;
  const json none = ok("POST", "/v1/chat/completions", body);
  const json plain_none =
      ok("POST", "/v1/completions", {{"prompt", "[!]<u>x"}, {"max_tokens", 6}, {"temperature", 0.5}, {"seed", 3}});
  EXPECT_EQ(none["choices"][0]["message"]["content"], plain_none["choices"][0]["text"]);
  // A stop string cuts the content as it cuts the completion's text.
  const std::string text = chat["choices"][0]["message"]["content"].get<std::string>();
  ASSERT_GE(text.size(), 4u);
  body = {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_tokens", 6}, {"temperature", 0.5}, {"seed", 3},
          {"tools", {{{"name", "f"}}, {{"name", "g"}}}}, {"chat_template_kwargs", {{"shout", true}}},
          {"stop", text.substr(2, 2)}};
  const json cut = ok("POST", "/v1/chat/completions", body);
  EXPECT_EQ(cut["choices"][0]["message"]["content"], text.substr(0, text.find(text.substr(2, 2))));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
}

TEST_F(ChatFixture, StreamedChatAddsUpToTheContent) {
  json body = {{"messages", kMessages}, {"max_tokens", 10}, {"temperature", 0.9}, {"seed", 11}};
  const json whole = ok("POST", "/v1/chat/completions", body);
  body["stream"] = true;
  const HttpReply reply = service->handle("POST", "/v1/chat/completions", body.dump());
  const auto events = stream_events(reply);
  ASSERT_GE(events.size(), 2u);
  std::string text, finish;
  for (const auto& [index, piece, reason] : events) {
    EXPECT_EQ(index, 0u);
    EXPECT_TRUE(finish.empty()) << "a piece after the finish reason";
    text += piece;
    finish = reason;
  }
  EXPECT_EQ(text, whole["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(finish, whole["choices"][0]["finish_reason"].get<std::string>());
  // The first chunk names the assistant's role.
  std::string all;
  service->handle("POST", "/v1/chat/completions", body.dump()).stream([&](const std::string& s) {
    all += s;
    return true;
  });
  const json first = json::parse(all.substr(6, all.find("\n\n") - 6));
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
}

// n choices: choice j is the completion's choice j for the template's text; streamed, each choice's
// pieces add up to it after its role, and include_usage's chunk comes last.
TEST_F(ChatFixture, NChoicesStreamedWithTheUsage) {
  json body = {{"messages", kMessages}, {"max_tokens", 8}, {"temperature", 1.0}, {"seed", 13}, {"n", 2}};
  const json chat = ok("POST", "/v1/chat/completions", body);
  const json plain =
      ok("POST", "/v1/completions", {{"prompt", kText}, {"max_tokens", 8}, {"temperature", 1.0}, {"seed", 13}, {"n", 2}});
  ASSERT_EQ(chat["choices"].size(), 2u);
  for (size_t j = 0; j < 2; ++j) {
    EXPECT_EQ(chat["choices"][j]["index"], j);
    EXPECT_EQ(chat["choices"][j]["message"]["content"], plain["choices"][j]["text"]) << j;
  }
  EXPECT_EQ(chat["usage"], plain["usage"]);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const auto events = stream_events(service->handle("POST", "/v1/chat/completions", body.dump()));
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(std::get<2>(events.back()), "usage");
  EXPECT_EQ(json::parse(std::get<1>(events.back())), chat["usage"]);
  std::vector<std::string> text(2);
  for (const auto& [index, piece, reason] : events)
    if (index < 2) text[index] += piece;
  for (size_t j = 0; j < 2; ++j) EXPECT_EQ(text[j], chat["choices"][j]["message"]["content"].get<std::string>()) << j;
}

// /tokenize with messages: the conversation's tokens as a chat completion reads them (its usage counts them).
TEST_F(ChatFixture, TokenizeAConversation) {
  const json t = ok("POST", "/tokenize", {{"messages", kMessages}});
  EXPECT_EQ(t["count"], int64_t(kText.size()));
  std::vector<int32_t> bytes(kText.begin(), kText.end());
  EXPECT_EQ(t["tokens"], json(bytes));
  const json chat = ok("POST", "/v1/chat/completions", {{"messages", kMessages}, {"max_tokens", 2}});
  EXPECT_EQ(chat["usage"]["prompt_tokens"], t["count"]);
  const json plain = ok("POST", "/tokenize", {{"messages", kMessages}, {"add_generation_prompt", false}});
  EXPECT_EQ(plain["count"], int64_t(kText.size()) - 3);  // without "<a>"
  const HttpReply r = service->handle("POST", "/tokenize", json{{"messages", kMessages}, {"add_special_tokens", true}}.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("add_special_tokens"), std::string::npos) << r.body;
}

TEST_F(ChatFixture, BadChatRequestsAreRefusedNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "the request body is not JSON"},
      {"[1]", "the request body is not a JSON object"},
      {R"({"max_tokens": 3})", "messages must be a non-empty list"},
      {R"({"messages": []})", "messages must be a non-empty list"},
      {R"({"messages": [{"content": "x"}]})", "messages[0] must be an object with a text \"role\""},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content must be a text"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]})",
       "messages[0].content: only {\"type\": \"text\""},
      {R"({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]})",
       "chat template: System message must come first"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"shout": [1]}, "tools": 3})",
       "tools must be a list"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "any"})", "tool_choice \"any\" is not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", "tool_choice \"required\" needs tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"})",
       "needs the model's tool-call form, and this server reads none"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})",
       "response_format {\"type\":\"json_object\"} is not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": true, "stream_options": {"continuous_usage_stats": true}})",
       "stream_options.continuous_usage_stats is not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs needs logprobs: true"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": true, "logprobs": true})", "logprobs does not go with stream"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 0})", "n must be an integer in [1, 128]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 100})", "longer than the model's context of 48"},
      {R"({"messages": [{"role": "user", "content": "0123456789012345678901234567890123456789012345"}]})",
       "the conversation is 52 tokens, which fill the model's context of 48"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"messages": []}})",
       "chat_template_kwargs.messages: give it as the request's own field"},
      {R"({"messages": [{"role": "user", "content": "x"}], "functions": []})", "unknown field \"functions\""},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": -1})", "temperature must be a number"},
  };
  for (const auto& [body, says] : cases) {
    const HttpReply r = service->handle("POST", "/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << body << ": " << r.body;
    const std::string message = json::parse(r.body)["error"]["message"].get<std::string>();
    EXPECT_NE(message.find(says), std::string::npos) << body << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_EQ(service->handle("GET", "/v1/chat/completions", "").status, 405);
}

// Without a template (the tokenizer's folder has none, no --chat-template) chat requests are refused.
TEST_F(ServiceFixture, ChatWithoutATemplateIsRefused) {
  const HttpReply r =
      service->handle("POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("this server has no chat template"), std::string::npos) << r.body;
}

}  // namespace
}  // namespace lattice
