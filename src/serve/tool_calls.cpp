#include "serve/tool_calls.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "core/philox.h"

namespace lattice {
namespace {

using nlohmann::json;

constexpr const char* kHermesOpen = "<tool_call>";
constexpr const char* kHermesClose = "</tool_call>";
constexpr const char* kPythonTag = "<|python_tag|>";
constexpr const char* kMistralOpen = "[TOOL_CALLS]";
// What Llama 3.1-3.3's and Llama 4's templates tell the model to write.
constexpr const char* kLlamaJsonHint = "\"parameters\": dictionary of argument name";

// A call as written: an object with a text "name" and its arguments (under `arguments`, or Llama's
// "parameters"), or none.
std::optional<json> call_of(const json& v) {
  if (!v.is_object() || !v.contains("name") || !v["name"].is_string()) return std::nullopt;
  const json args = v.contains("arguments") ? v["arguments"] : v.contains("parameters") ? v["parameters"] : json::object();
  return json{{"name", v["name"]}, {"arguments", args.is_string() ? args.get<std::string>() : args.dump()}};
}

std::optional<json> parse_json(const std::string& text) {
  json v = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return std::nullopt;
  return v;
}

// The end (one past) of the JSON value that starts at `at` (an object or a list: brackets matched outside
// strings), or npos when the text ends first.
size_t json_value_end(const std::string& s, size_t at) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = at; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string::npos;
}

size_t skip(const std::string& s, size_t at, const char* chars) {
  while (at < s.size() && std::strchr(chars, s[at]) != nullptr) ++at;
  return at;
}

ParsedToolCalls hermes(const std::string& text) {
  ParsedToolCalls out;
  const size_t first = text.find(kHermesOpen);
  if (first == std::string::npos) return out;
  for (size_t at = first; at != std::string::npos; at = text.find(kHermesOpen, at)) {
    at += std::strlen(kHermesOpen);
    const size_t close = text.find(kHermesClose, at);
    const std::optional<json> v = parse_json(text.substr(at, close == std::string::npos ? std::string::npos : close - at));
    const std::optional<json> call = v ? call_of(*v) : std::nullopt;
    if (!call) return {};
    out.calls.push_back(*call);
    if (close == std::string::npos) break;
    at = close + std::strlen(kHermesClose);
  }
  out.called = true;
  out.content = text.substr(0, first);
  return out;
}

ParsedToolCalls llama3_json(const std::string& text) {
  size_t at = text.rfind(kPythonTag, 0) == 0 ? std::strlen(kPythonTag) : 0;
  if (at == 0 && text.rfind('{', 0) != 0) return {};
  ParsedToolCalls out;
  while ((at = skip(text, at, " \t\r\n;")) < text.size()) {
    if (text[at] != '{') return {};
    const size_t end = json_value_end(text, at);
    if (end == std::string::npos) return {};
    const std::optional<json> v = parse_json(text.substr(at, end - at));
    const std::optional<json> call = v ? call_of(*v) : std::nullopt;
    if (!call) return {};
    out.calls.push_back(*call);
    at = end;
  }
  out.called = !out.calls.empty();
  return out;
}

ParsedToolCalls mistral(const std::string& text) {
  const size_t open = text.find(kMistralOpen);
  if (open == std::string::npos) return {};
  const size_t at = skip(text, open + std::strlen(kMistralOpen), " \t\r\n");
  const size_t end = at < text.size() && text[at] == '[' ? json_value_end(text, at) : std::string::npos;
  const std::optional<json> list = end == std::string::npos ? std::nullopt : parse_json(text.substr(at, end - at));
  if (!list || !list->is_array() || list->empty()) return {};
  ParsedToolCalls out;
  for (const json& v : *list) {
    const std::optional<json> call = call_of(v);
    if (!call) return {};
    out.calls.push_back(*call);
  }
  out.called = true;
  out.content = text.substr(0, open);
  return out;
}

// Where `marker` begins in text, or where text's last bytes are a proper prefix of it; npos otherwise.
size_t marker_start(const std::string& text, const std::string& marker) {
  const size_t found = text.find(marker);
  if (found != std::string::npos) return found;
  for (size_t n = std::min(marker.size() - 1, text.size()); n > 0; --n)
    if (text.compare(text.size() - n, n, marker, 0, n) == 0) return text.size() - n;
  return std::string::npos;
}

}  // namespace

ToolCallFormat tool_call_format(const std::string& name, const std::string& template_text, const char* flag) {
  if (name == "hermes") return ToolCallFormat::hermes;
  if (name == "llama3_json") return ToolCallFormat::llama3_json;
  if (name == "mistral") return ToolCallFormat::mistral;
  if (name == "none") return ToolCallFormat::none;
  if (name != "auto")
    LATTICE_FAIL() << flag << " " << name << ": expected auto, hermes, llama3_json, mistral or none";
  if (template_text.find(kHermesOpen) != std::string::npos) return ToolCallFormat::hermes;
  if (template_text.find(kMistralOpen) != std::string::npos) return ToolCallFormat::mistral;
  if (template_text.find(kPythonTag) != std::string::npos || template_text.find(kLlamaJsonHint) != std::string::npos)
    return ToolCallFormat::llama3_json;
  return ToolCallFormat::none;
}

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::hermes: return "hermes";
    case ToolCallFormat::llama3_json: return "llama3_json";
    case ToolCallFormat::mistral: return "mistral";
    case ToolCallFormat::none: break;
  }
  return "none";
}

ParsedToolCalls parse_tool_calls(ToolCallFormat f, const std::string& text) {
  switch (f) {
    case ToolCallFormat::hermes: return hermes(text);
    case ToolCallFormat::llama3_json: return llama3_json(text);
    case ToolCallFormat::mistral: return mistral(text);
    case ToolCallFormat::none: break;
  }
  return {};
}

size_t tool_calls_start(ToolCallFormat f, const std::string& text) {
  switch (f) {
    case ToolCallFormat::hermes: return marker_start(text, kHermesOpen);
    case ToolCallFormat::mistral: return marker_start(text, kMistralOpen);
    case ToolCallFormat::llama3_json: {
      const std::string tag = kPythonTag;
      const bool tagged = text.compare(0, std::min(text.size(), tag.size()), tag, 0, std::min(text.size(), tag.size())) == 0;
      return text.empty() || text[0] == '{' || tagged ? 0 : std::string::npos;
    }
    case ToolCallFormat::none: break;
  }
  return std::string::npos;
}

std::string forced_tool_call_opening(ToolCallFormat f, const std::string& name) {
  LATTICE_CHECK(f != ToolCallFormat::none) << "a forced tool call needs a tool-call form";
  const std::string open = f == ToolCallFormat::hermes    ? std::string(kHermesOpen) + "\n{\"name\": \""
                           : f == ToolCallFormat::mistral ? std::string(kMistralOpen) + " [{\"name\": \""
                                                          : std::string("{\"name\": \"");
  if (name.empty()) return open;
  const std::string quoted = json(name).dump();  // the name as a JSON text, quotes escaped
  return open + quoted.substr(1) + (f == ToolCallFormat::llama3_json ? ", \"parameters\": " : ", \"arguments\": ");
}

json openai_tool_call(ToolCallFormat f, const json& call, uint64_t completion, size_t choice, size_t k) {
  static const char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  const size_t n = f == ToolCallFormat::mistral ? 9 : 24;
  // Philox of (completion, choice, k): distinct ids for distinct calls, the same for a rerun.
  const PhiloxStream stream{completion, fnv1a32("tool call"), uint32_t(choice), uint32_t(k)};
  std::string id;
  for (size_t i = 0; i < n; i += 4) {
    const auto block = stream.block(i / 4);
    for (size_t b = 0; b < 4 && id.size() < n; ++b) id += kAlnum[block[b] % 62];
  }
  return {{"id", f == ToolCallFormat::mistral ? id : "call_" + id},
          {"type", "function"},
          {"function", {{"name", call["name"]}, {"arguments", call["arguments"]}}}};
}

}  // namespace lattice
