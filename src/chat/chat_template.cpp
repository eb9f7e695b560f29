#include "chat/chat_template.h"

#include <filesystem>

#include "core/error.h"
#include "data/tokenizer.h"

namespace lattice {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The texts of tokenizer_config.json's special tokens, as transformers' special_tokens_map gives them.
nlohmann::ordered_json special_tokens_of(const json& config) {
  nlohmann::ordered_json special = nlohmann::ordered_json::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    auto it = config.find(key);
    if (it == config.end()) continue;
    if (it->is_string()) special[key] = it->get<std::string>();
    else if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
      special[key] = (*it)["content"].get<std::string>();
  }
  return special;
}

json read_config(const fs::path& file, const std::string& flag) {
  const std::string text = read_tokenizer_file(file.string(), flag + " " + file.string());
  json config = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object())
    LATTICE_FAIL() << flag << " " << file.string() << ": not a JSON object";
  return config;
}

// tokenizer_config.json's "chat_template": a text, or a list of named templates ("default" taken).
std::optional<std::string> template_of(const json& config, const fs::path& file, const std::string& flag) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const json& t : *it)
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
        return t["template"].get<std::string>();
    LATTICE_FAIL() << flag << " " << file.string() << ": chat_template lists no template named \"default\"";
  }
  LATTICE_FAIL() << flag << " " << file.string() << ": chat_template is " << it->type_name()
                 << ", expected a text or a list of {name, template}";
}

// The program, named "chat template" in the errors of its rendering (which a server's clients read);
// a syntax error names the flag and file.
jinja::Template compile(const std::string& source, const fs::path& file, const std::string& flag) {
  try {
    return jinja::Template(source, "chat template");
  } catch (const Error& e) {
    LATTICE_FAIL() << flag << " " << file.string() << ": " << e.what();
  }
}

}  // namespace

ChatTemplate ChatTemplate::load(const std::string& path, const std::string& flag) {
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    std::optional<ChatTemplate> found = find_beside(path, flag);
    if (!found)
      LATTICE_FAIL() << flag << " " << path << ": the folder has no chat_template.jinja and no tokenizer_config.json "
                     << "with a chat_template";
    return std::move(*found);
  }
  if (!fs::exists(p, ec)) LATTICE_FAIL() << flag << " " << path << ": no such file";
  const fs::path config_file = p.parent_path() / "tokenizer_config.json";
  if (p.extension() == ".json") {  // a tokenizer_config.json
    const json config = read_config(p, flag);
    std::optional<std::string> source = template_of(config, p, flag);
    if (!source) LATTICE_FAIL() << flag << " " << path << ": no chat_template in it";
    return ChatTemplate(compile(*source, p, flag), *source, path, special_tokens_of(config));
  }
  const std::string source = read_tokenizer_file(path, flag + " " + path);
  nlohmann::ordered_json special = nlohmann::ordered_json::object();
  if (fs::exists(config_file, ec)) special = special_tokens_of(read_config(config_file, flag));
  return ChatTemplate(compile(source, p, flag), source, path, std::move(special));
}

std::optional<ChatTemplate> ChatTemplate::find_beside(const std::string& tokenizer_path, const std::string& flag) {
  if (tokenizer_path.empty()) return std::nullopt;
  std::error_code ec;
  fs::path dir(tokenizer_path);
  if (!fs::is_directory(dir, ec)) dir = dir.parent_path();
  if (dir.empty()) dir = ".";
  const fs::path jinja_file = dir / "chat_template.jinja", config_file = dir / "tokenizer_config.json";
  nlohmann::ordered_json special = nlohmann::ordered_json::object();
  std::optional<std::string> source;
  fs::path from;
  if (fs::exists(config_file, ec)) {
    const json config = read_config(config_file, flag);
    special = special_tokens_of(config);
    source = template_of(config, config_file, flag);
    from = config_file;
  }
  if (fs::exists(jinja_file, ec)) {  // transformers writes the template here, when it does, instead
    source = read_tokenizer_file(jinja_file.string(), flag + " " + jinja_file.string());
    from = jinja_file;
  }
  if (!source) return std::nullopt;
  return ChatTemplate(compile(*source, from, flag), *source, from.string(), std::move(special));
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra) const {
  // As apply_chat_template: the special tokens, then messages and add_generation_prompt, then the
  // caller's variables over them.
  nlohmann::ordered_json variables = special_;
  variables["messages"] = messages;
  variables["add_generation_prompt"] = add_generation_prompt;
  for (auto it = extra.begin(); it != extra.end(); ++it) variables[it.key()] = it.value();
  return program_.render(variables);
}

}  // namespace lattice
