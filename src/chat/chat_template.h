// A model's chat template: what HuggingFace's tokenizer.apply_chat_template(messages, tokenize=False)
// renders. The template is a Jinja program (chat/jinja.h) read from
//   - a .jinja (or any text) file: the program itself;
//   - a tokenizer_config.json: its "chat_template", a text or a list of {"name", "template"} (the one
//     named "default" is taken);
//   - a folder: its chat_template.jinja, else its tokenizer_config.json's template.
// The special tokens the template may read (bos_token, eos_token, unk_token, pad_token) are the texts of
// tokenizer_config.json's entries (a text, or an object's "content") beside the template.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/jinja.h"

namespace lattice {

class ChatTemplate {
 public:
  // Throws lattice::Error naming `flag`, the file and what is wrong (unreadable, not JSON, no
  // template, a Jinja syntax error with its line).
  static ChatTemplate load(const std::string& path, const std::string& flag);
  // load() of a tokenizer's folder (or of the folder of its file) when it holds a template, else none.
  static std::optional<ChatTemplate> find_beside(const std::string& tokenizer_path, const std::string& flag);

  // The conversation's text. messages: [{"role", "content", ...}]; with add_generation_prompt the
  // template's opening of the assistant's next turn follows. `extra` (an object: tools, documents,
  // enable_thinking, ...) adds or replaces template variables. A template's raise_exception(M) throws
  // lattice::Error "chat template: M"; another runtime error "chat template line L: what".
  // Objects keep their keys' order (as Python's dicts do: a tool's schema written by tojson).
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  const std::string& source() const { return source_; }           // the file the program came from
  const std::string& text() const { return text_; }               // the program's text
  const nlohmann::ordered_json& special_tokens() const { return special_; }  // {"bos_token": "<s>", ...}

 private:
  ChatTemplate(jinja::Template program, std::string text, std::string source, nlohmann::ordered_json special)
      : program_(std::move(program)), text_(std::move(text)), source_(std::move(source)), special_(std::move(special)) {}
  jinja::Template program_;
  std::string text_, source_;
  nlohmann::ordered_json special_;
};

}  // namespace lattice
