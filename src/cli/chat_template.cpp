// lattice chat-template: a model's chat template applied to a conversation, as HuggingFace's
// tokenizer.apply_chat_template(messages, tokenize=False) renders it (chat/chat_template.h).
//   lattice chat-template (--chat-template PATH | --tokenizer-model PATH) [--add-generation-prompt] < chat.json
//     stdin: a JSON list of messages, or an object with "messages" and any other template variables
//     (tools, documents, enable_thinking, ...); stdout: the text.
//   lattice chat-template --jsonl
//     every stdin line {"template": T, "variables": {...}}; prints one line each: {"text": S},
//     {"raised": M} where the template called raise_exception(M), or {"failed": true} for any other
//     error (its message on stderr). The form tests/e2e/test_chat_templates.sh compares with jinja2.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "chat/jinja.h"
#include "cli/simple_flags.h"
#include "cli/subcommands.h"
#include "core/error.h"
#include "serve/endpoint.h"

namespace lattice {
namespace {

const char* kChatTemplateUsage =
    "usage: lattice chat-template (--chat-template PATH | --tokenizer-model PATH) [--add-generation-prompt] "
    "< chat.json\n"
    "       lattice chat-template --jsonl < cases.jsonl\n"
    "A model's chat template applied to a conversation, as HuggingFace's apply_chat_template(tokenize=False).\n"
    "  --chat-template PATH       a Jinja file, a tokenizer_config.json, or a folder holding either\n"
    "  --tokenizer-model PATH     the tokenizer's folder (or its file): its chat_template.jinja or\n"
    "                             tokenizer_config.json\n"
    "  --add-generation-prompt    end with the opening of the assistant's turn\n"
    "  --jsonl                    stdin lines {\"template\", \"variables\"}; one line each: {\"text\"}, {\"raised\"}\n"
    "                             (the template's raise_exception) or {\"failed\"}\n"
    "stdin: a JSON list of messages ({\"role\", \"content\"}), or an object with \"messages\" and other variables.\n";

int render_jsonl() {
  std::string line;
  for (int64_t n = 1; std::getline(std::cin, line); ++n) {
    if (line.empty()) continue;
    nlohmann::json out;
    const std::string name = "case " + std::to_string(n);
    try {
      const nlohmann::ordered_json c = nlohmann::ordered_json::parse(line);  // dicts in their order, as Python's
      try {
        out["text"] = jinja::Template(c.at("template").get<std::string>(), name)
                          .render(c.value("variables", nlohmann::ordered_json::object()));
      } catch (const Error& e) {
        const std::string what = e.what();
        if (what.rfind(name + ": ", 0) == 0) {  // raise_exception's message
          out["raised"] = what.substr(name.size() + 2);
        } else {
          std::fprintf(stderr, "%s\n", what.c_str());
          out["failed"] = true;
        }
      }
    } catch (const nlohmann::json::exception& e) {
      LATTICE_FAIL() << "stdin line " << n << ": not a {\"template\", \"variables\"} object: " << e.what();
    }
    std::printf("%s\n", json_text(out).c_str());
  }
  return 0;
}

}  // namespace

int cmd_chat_template(int argc, char** argv) {
  if (help_requested(argc, argv, 2)) {
    std::fputs(kChatTemplateUsage, stdout);
    return 0;
  }
  const SimpleFlags f =
      parse_simple_flags(argc, argv, 2, {"chat-template", "tokenizer-model"}, {"add-generation-prompt", "jsonl"});
  if (f.has("jsonl")) return render_jsonl();
  std::optional<ChatTemplate> chat;
  if (f.has("chat-template")) {
    chat = ChatTemplate::load(f.required("chat-template"), "--chat-template");
  } else if (f.has("tokenizer-model")) {
    chat = ChatTemplate::find_beside(f.required("tokenizer-model"), "--tokenizer-model");
    if (!chat)
      LATTICE_FAIL() << "--tokenizer-model " << f.required("tokenizer-model")
                     << ": no chat_template.jinja or tokenizer_config.json chat_template beside it";
  } else {
    LATTICE_FAIL() << "give --chat-template or --tokenizer-model (see lattice chat-template --help)";
  }
  const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  nlohmann::ordered_json chat_json = nlohmann::ordered_json::parse(input, nullptr, /*allow_exceptions=*/false);
  nlohmann::ordered_json extra = nlohmann::ordered_json::object(), messages;
  if (chat_json.is_array()) {
    messages = chat_json;
  } else if (chat_json.is_object() && chat_json.contains("messages") && chat_json["messages"].is_array()) {
    messages = chat_json["messages"];
    chat_json.erase("messages");
    extra = chat_json;
  } else {
    LATTICE_FAIL() << "stdin: expected a JSON list of messages or an object with \"messages\"";
  }
  const std::string text = chat->render(messages, f.has("add-generation-prompt"), extra);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace lattice
