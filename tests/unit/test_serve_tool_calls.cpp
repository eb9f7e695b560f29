// The tool calls of a chat completion (serve/tool_calls.h): each form read from texts as the model families
// write them (and as vLLM's parsers of the same names read them), texts that are no calls left as content,
// the form a template teaches; then POST /v1/chat/completions over a generator that writes a scripted text:
// the message's tool_calls, content and finish reason, streamed with the calls in the last delta.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "core/error.h"
#include "serve/chat_completions_api.h"
#include "serve/request_fields.h"
#include "serve/tool_calls.h"
#include "serve_test_util.h"

namespace lattice {
namespace {

using nlohmann::json;

json call(const std::string& name, const std::string& args) { return {{"name", name}, {"arguments", args}}; }

TEST(ToolCalls, HermesBlocksAfterTheContent) {
  const ParsedToolCalls p = parse_tool_calls(
      ToolCallFormat::hermes,
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"C\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>");
  ASSERT_TRUE(p.called);
  EXPECT_EQ(p.content, "Let me look.\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0], call("get_weather", R"({"city":"Paris","unit":"C"})"));
  EXPECT_EQ(p.calls[1], call("get_time", "{}"));
  // A last block the decoding cut before its close runs to the end; none before it: no content.
  const ParsedToolCalls open = parse_tool_calls(ToolCallFormat::hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, \"}\"]}}");
  ASSERT_TRUE(open.called);
  EXPECT_EQ(open.content, "");
  EXPECT_EQ(open.calls[0], call("f", R"({"a":[1,"}"]})"));
  // No block, a block that is not JSON, or one without a text name: all content, no calls.
  for (const char* text : {"It is sunny.", "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>",
                           "<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>[1]</tool_call>"}) {
    const ParsedToolCalls none = parse_tool_calls(ToolCallFormat::hermes, text);
    EXPECT_FALSE(none.called) << text;
    EXPECT_TRUE(none.calls.empty()) << text;
  }
}

TEST(ToolCalls, Llama3JsonObjectsAndMistralLists) {
  // Llama 3.1: the text is the call, "parameters" for the arguments, several separated by ";", perhaps
  // after <|python_tag|>.
  ParsedToolCalls p = parse_tool_calls(ToolCallFormat::llama3_json,
                                       "{\"name\": \"f\", \"parameters\": {\"x\": 1}}; {\"name\": \"g\", \"arguments\": {\"s\": \"a;b\"}}");
  ASSERT_TRUE(p.called);
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0], call("f", R"({"x":1})"));
  EXPECT_EQ(p.calls[1], call("g", R"({"s":"a;b"})"));
  p = parse_tool_calls(ToolCallFormat::llama3_json, "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}");
  ASSERT_TRUE(p.called);
  EXPECT_EQ(p.calls[0], call("f", "{}"));
  for (const char* text : {"The answer is {\"name\": 1}", "{\"name\": \"f\"} and more", "{\"name\": \"f\", ", "{}"})
    EXPECT_FALSE(parse_tool_calls(ToolCallFormat::llama3_json, text).called) << text;
  // Mistral: [TOOL_CALLS] then a list, after any content.
  p = parse_tool_calls(ToolCallFormat::mistral,
                       "Sure. [TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}, {\"name\": \"g\", \"arguments\": {}}]");
  ASSERT_TRUE(p.called);
  EXPECT_EQ(p.content, "Sure. ");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0], call("f", R"({"q":"x"})"));
  for (const char* text : {"no calls", "[TOOL_CALLS] {\"name\": \"f\"}", "[TOOL_CALLS] []", "[TOOL_CALLS] [{\"name\": \"f\""})
    EXPECT_FALSE(parse_tool_calls(ToolCallFormat::mistral, text).called) << text;
  EXPECT_FALSE(parse_tool_calls(ToolCallFormat::none, "<tool_call>{\"name\": \"f\"}</tool_call>").called);
}

TEST(ToolCalls, WhereAStreamWaitsAndTheIds) {
  EXPECT_EQ(tool_calls_start(ToolCallFormat::hermes, "abc <tool_call>{"), 4u);
  EXPECT_EQ(tool_calls_start(ToolCallFormat::hermes, "abc <tool_"), 4u);  // may be beginning
  EXPECT_EQ(tool_calls_start(ToolCallFormat::hermes, "abc <b>"), std::string::npos);
  EXPECT_EQ(tool_calls_start(ToolCallFormat::mistral, "ok [TOOL"), 3u);
  EXPECT_EQ(tool_calls_start(ToolCallFormat::llama3_json, "{\"na"), 0u);
  EXPECT_EQ(tool_calls_start(ToolCallFormat::llama3_json, "<|pyt"), 0u);
  EXPECT_EQ(tool_calls_start(ToolCallFormat::llama3_json, ""), 0u);  // nothing written yet
  EXPECT_EQ(tool_calls_start(ToolCallFormat::llama3_json, "Hello"), std::string::npos);
  EXPECT_EQ(tool_calls_start(ToolCallFormat::none, "<tool_call>"), std::string::npos);
  // Ids: distinct per call, the same on a rerun; Mistral's 9 letters and digits.
  const json c = call("f", "{}");
  const json a = openai_tool_call(ToolCallFormat::hermes, c, 7, 0, 0);
  EXPECT_EQ(a["type"], "function");
  EXPECT_EQ(a["function"], c);
  EXPECT_EQ(a["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(a["id"].get<std::string>().size(), 29u);
  EXPECT_EQ(a, openai_tool_call(ToolCallFormat::hermes, c, 7, 0, 0));
  EXPECT_NE(a["id"], openai_tool_call(ToolCallFormat::hermes, c, 7, 0, 1)["id"]);
  EXPECT_NE(a["id"], openai_tool_call(ToolCallFormat::hermes, c, 8, 0, 0)["id"]);
  const std::string m = openai_tool_call(ToolCallFormat::mistral, c, 7, 0, 0)["id"];
  EXPECT_EQ(m.size(), 9u);
  for (char ch : m) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch))) << m;
}

TEST(ToolCalls, TheFormTheTemplateTeaches) {
  EXPECT_EQ(tool_call_format("auto", "{% for t in tools %}<tool_call>{{ t | tojson }}{% endfor %}", "--f"),
            ToolCallFormat::hermes);
  EXPECT_EQ(tool_call_format("auto", "{{ '[TOOL_CALLS]' }}", "--f"), ToolCallFormat::mistral);
  EXPECT_EQ(tool_call_format("auto", "{{- '<|python_tag|>' }}", "--f"), ToolCallFormat::llama3_json);
  EXPECT_EQ(tool_call_format("auto",
                             "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name "
                             "and its value}.",
                             "--f"),
            ToolCallFormat::llama3_json);  // Llama 3.2's
  EXPECT_EQ(tool_call_format("auto", "{{ messages }}", "--f"), ToolCallFormat::none);
  EXPECT_EQ(tool_call_format("mistral", "<tool_call>", "--f"), ToolCallFormat::mistral);  // named: as named
  EXPECT_EQ(tool_call_format("none", "<tool_call>", "--f"), ToolCallFormat::none);
  try {
    tool_call_format("qwen", "", "--tool-call-parser");
    ADD_FAILURE() << "qwen accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tool-call-parser qwen: expected auto, hermes"), std::string::npos) << e.what();
  }
}

// The endpoint over a generator that writes `script` (one byte a token) after any prompt, calling the
// stream's callback after each token as the service's worker does.
struct ScriptedChat : ::testing::Test {
  std::unique_ptr<Tokenizer> tok = make_tokenizer(TokenizerSpec{"ByteTokenizer"});
  std::string dir = ::testing::TempDir() + "/lattice_tool_calls_" + std::to_string(::getpid());
  std::optional<ChatTemplate> chat;
  std::string script;
  std::string rendered;  // the last prompt's text
  std::unique_ptr<EndpointContext> ctx;
  void SetUp() override {
    std::filesystem::create_directories(dir);
    // Qwen-style: tools listed, an assistant's earlier calls written back with tojson, tool results.
    std::ofstream(dir + "/chat.jinja")
        << "{% if tools %}[T]{% for t in tools %}{{ t['function']['name'] }};{% endfor %}{% endif %}"
           "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] or '' }}"
           "{% for c in m.get('tool_calls', []) %}<tool_call>{{ c['function'] | tojson }}</tool_call>{% endfor %}"
           "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
    chat = ChatTemplate::load(dir + "/chat.jinja", "--chat-template");
    ctx = std::make_unique<EndpointContext>(EndpointContext{*tok, 4096, "tiny", {}, {}, &*chat});
    ctx->tool_calls = tool_call_format("auto", chat->text(), "--tool-call-parser");
    ctx->seed = [](std::optional<int64_t>) { return uint64_t(1); };
    ctx->generate = [this](std::vector<GenerationRequest> requests, KeepGoing keep_going) {
      std::vector<GenerationResult> results;
      for (size_t i = 0; i < requests.size(); ++i) {
        GenerationResult r;
        r.tokens = requests[i].prompt;
        r.prompt_length = int64_t(r.tokens.size());
        rendered = tok->decode(r.tokens);
        r.stopped = true;
        for (unsigned char c : script) {
          r.tokens.push_back(int32_t(c));
          if (keep_going && !keep_going(i, r)) break;
        }
        results.push_back(std::move(r));
      }
      return results;
    };
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  // The request as a client's text (its objects' keys in its order).
  json post_text(const std::string& body) {
    const HttpReply r = openai_chat_completions(nlohmann::ordered_json::parse(body), *ctx, 5);
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body);
  }
  json post(const json& body) { return post_text(body.dump()); }
  // The message a bad request is refused with (the service answers it 400).
  std::string refusal(const json& body) {
    try {
      openai_chat_completions(nlohmann::ordered_json::parse(body.dump()), *ctx, 1);
    } catch (const RequestError& e) {
      return e.what();
    }
    return "(no refusal)";
  }
  // A streamed answer's chunks.
  std::vector<json> chunks(const json& body, uint64_t id) {
    std::string all;
    const HttpReply r = openai_chat_completions(nlohmann::ordered_json::parse(body.dump()), *ctx, id);
    EXPECT_TRUE(bool(r.stream));
    if (!r.stream) return {};
    r.stream([&](const std::string& s) {
      all += s;
      return true;
    });
    std::vector<json> out;
    for (size_t at = 0; at < all.size();) {
      const size_t end = all.find("\n\n", at);
      EXPECT_NE(end, std::string::npos);
      if (end == std::string::npos) break;
      const std::string line = all.substr(at + 6, end - at - 6);
      at = end + 2;
      if (line != "[DONE]") out.push_back(json::parse(line));
    }
    return out;
  }
};

const json kTools = {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", json::object()}}}},
                     {{"type", "function"}, {"function", {{"name", "get_time"}, {"parameters", json::object()}}}}};
const std::string kTwoCalls =
    "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";

TEST_F(ScriptedChat, TheMessagesToolCalls) {
  script = kTwoCalls;
  const json body = {{"messages", {{{"role", "user"}, {"content", "Weather?"}}}}, {"tools", kTools}};
  const json reply = post(body);
  const json& c = reply["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(c["message"]["content"], "Checking.");
  ASSERT_EQ(c["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"], call("get_weather", R"({"city":"Paris"})"));
  EXPECT_EQ(c["message"]["tool_calls"][1]["function"], call("get_time", R"({"tz":"CET"})"));
  EXPECT_EQ(c["message"]["tool_calls"][0], openai_tool_call(ToolCallFormat::hermes, call("get_weather", R"({"city":"Paris"})"), 5, 0, 0));
  // parallel_tool_calls false: the first call only.
  json one = body;
  one["parallel_tool_calls"] = false;
  EXPECT_EQ(post(one)["choices"][0]["message"]["tool_calls"].size(), 1u);
  // Without tools offered, or with tool_choice "none", the text is the content.
  for (const json& b : {json{{"messages", body["messages"]}},
                        json{{"messages", body["messages"]}, {"tools", kTools}, {"tool_choice", "none"}}}) {
    const json plain = post(b)["choices"][0];
    EXPECT_EQ(plain["message"]["content"], kTwoCalls);
    EXPECT_FALSE(plain["message"].contains("tool_calls"));
    EXPECT_EQ(plain["finish_reason"], "stop");
  }
  // Only calls: the content is null. Text that is no call: content, finish_reason stop.
  script = "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>";
  EXPECT_TRUE(post(body)["choices"][0]["message"]["content"].is_null());
  script = "It is sunny in <b>Paris</b>.";
  const json sunny = post(body)["choices"][0];
  EXPECT_EQ(sunny["message"]["content"], script);
  EXPECT_EQ(sunny["finish_reason"], "stop");
}

TEST_F(ScriptedChat, StreamedTheCallsComeInTheLastDelta) {
  script = kTwoCalls;
  json body = {{"messages", {{{"role", "user"}, {"content", "Weather?"}}}}, {"tools", kTools}, {"stream", true}};
  const std::vector<json> chunks = this->chunks(body, 5);
  ASSERT_GE(chunks.size(), 3u);
  std::string content;
  for (size_t k = 0; k + 1 < chunks.size(); ++k) {  // before the last: content only, no call markup
    const json& delta = chunks[k]["choices"][0]["delta"];
    EXPECT_FALSE(delta.contains("tool_calls"));
    content += delta.value("content", "");
    EXPECT_TRUE(chunks[k]["choices"][0]["finish_reason"].is_null());
  }
  const json& last = chunks.back()["choices"][0];
  content += last["delta"].value("content", "");
  EXPECT_EQ(content, "Checking.");
  EXPECT_EQ(last["finish_reason"], "tool_calls");
  const json whole = post(json{{"messages", body["messages"]}, {"tools", kTools}});
  ASSERT_EQ(last["delta"]["tool_calls"].size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    json want = whole["choices"][0]["message"]["tool_calls"][k];
    want["index"] = k;
    EXPECT_EQ(last["delta"]["tool_calls"][k], want);
  }
  // Text with no call streams as it is made, what looked like a call's beginning held only until it is not.
  script = "a <tool b";
  std::vector<std::string> pieces;
  for (const json& chunk : this->chunks(body, 6)) pieces.push_back(chunk["choices"][0]["delta"].value("content", ""));
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "a", " ", "<tool ", "b", ""}));
}

// tool_choice "required" or a named function: the prompt ends with the call's opening in the server's form
// and the model's text continues it; answered as the calls read from the opening and the continuation.
TEST_F(ScriptedChat, RequiredAndNamedToolChoiceOpenTheCall) {
  const json messages = {{{"role", "user"}, {"content", "Weather?"}}};
  script = "get_time\", \"arguments\": {}}\n</tool_call>";
  json reply = post({{"messages", messages}, {"tools", kTools}, {"tool_choice", "required"}});
  EXPECT_EQ(rendered.substr(rendered.size() - 33), "<assistant><tool_call>\n{\"name\": \"");
  EXPECT_EQ(reply["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(reply["choices"][0]["message"]["tool_calls"][0]["function"], call("get_time", "{}"));
  script = "{\"city\": \"Oslo\"}}\n</tool_call>";
  const json named = {{"messages", messages}, {"tools", kTools},
                      {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}};
  reply = post(named);
  EXPECT_NE(rendered.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "), std::string::npos) << rendered;
  EXPECT_EQ(reply["choices"][0]["message"]["tool_calls"][0]["function"], call("get_weather", R"({"city":"Oslo"})"));
  EXPECT_TRUE(reply["choices"][0]["message"]["content"].is_null());
  // Streamed: the whole call in the last delta.
  json streamed = named;
  streamed["stream"] = true;
  const std::vector<json> events = chunks(streamed, 9);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(events.back()["choices"][0]["delta"]["tool_calls"][0]["function"], call("get_weather", R"({"city":"Oslo"})"));
  // A continuation that is no call: the text, its forced opening included, is the content.
  script = "oops";
  reply = post(named);
  EXPECT_EQ(reply["choices"][0]["message"]["content"], "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": oops");
  EXPECT_EQ(reply["choices"][0]["finish_reason"], "stop");
  // Refusals: no tools, a function that is none of them, a server without a tool-call form.
  for (const auto& [body, says] : std::vector<std::pair<json, std::string>>{
           {{{"messages", messages}, {"tool_choice", "required"}}, "tool_choice \"required\" needs tools"},
           {{{"messages", messages}, {"tools", kTools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}},
            "names the function \"f\", which is none of the tools"},
           {{{"messages", messages}, {"tools", kTools}, {"tool_choice", {{"type", "x"}}}}, "is not supported"}}) {
    EXPECT_NE(refusal(body).find(says), std::string::npos) << refusal(body);
  }
  ctx->tool_calls = ToolCallFormat::none;
  const std::string none = refusal({{"messages", messages}, {"tools", kTools}, {"tool_choice", "required"}});
  EXPECT_NE(none.find("needs the model's tool-call form"), std::string::npos) << none;
  EXPECT_EQ(forced_tool_call_opening(ToolCallFormat::llama3_json, "a\"b"), "{\"name\": \"a\\\"b\", \"parameters\": ");
  EXPECT_EQ(forced_tool_call_opening(ToolCallFormat::mistral), "[TOOL_CALLS] [{\"name\": \"");
}

// An assistant's earlier calls sent with their arguments as JSON text (as OpenAI's clients send them)
// reach the template as objects: tojson writes them once, not as a quoted text.
TEST_F(ScriptedChat, EarlierCallsArgumentsReachTheTemplateAsObjects) {
  script = "Sunny.";
  post_text(R"({"messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "20C"}], "tools": )" + kTools.dump() + "}");
  EXPECT_EQ(rendered,
            "[T]get_weather;get_time;<user>Weather?<assistant><tool_call>{\"name\": \"get_weather\", \"arguments\": "
            "{\"city\": \"Paris\"}}</tool_call><tool>20C<assistant>");
}

}  // namespace
}  // namespace lattice
