// The tool calls in what a chat model wrote, as OpenAI's chat completions return them ("tool_calls"
// beside the content). Each model family writes its calls in a form of its own, taught by its chat
// template; lattice reads three (the forms of vLLM's --tool-call-parser of the same names):
//   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block per call, after
//                any text (Qwen2.5, Qwen3, QwQ, Hermes 2 and 3); the content is the text before the first;
//                a last block the decoding cut off runs to the end of the text;
//   llama3_json  the whole text one JSON object {"name": ..., "parameters" (or "arguments"): {...}}, or
//                several separated by ";", perhaps after <|python_tag|> (Llama 3.1, 3.2, 3.3); no content;
//   mistral      [TOOL_CALLS] then a JSON list [{"name": ..., "arguments": {...}}, ...] (Mistral 7B v0.3,
//                Nemo, Small); the content is the text before [TOOL_CALLS].
// Text that holds no call, or whose calls are not valid JSON with a text "name", is all content.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace lattice {

enum class ToolCallFormat { none, hermes, llama3_json, mistral };

// --tool-call-parser's value: hermes, llama3_json, mistral, none, or auto: the form the chat template
// (its program's text) teaches: <tool_call> hermes, [TOOL_CALLS] mistral, <|python_tag|> or Llama's
// '{"name": function name, "parameters": dictionary of argument name ...}' llama3_json, else none. Of the
// 97 distinct templates of tests/e2e/test_chat_templates.sh, 12 are hermes (Qwen2.5, Qwen3, QwQ, Granite
// 4, ...; Qwen3-Coder's calls are XML, which hermes does not read: they stay content), 6 llama3_json (Llama
// 3.1, 3.2, 4, Nemotron 70B). Another value is an error naming `flag`.
ToolCallFormat tool_call_format(const std::string& name, const std::string& template_text, const char* flag);
const char* tool_call_format_name(ToolCallFormat f);

struct ParsedToolCalls {
  bool called = false;   // the text holds calls (the rest of these fields then hold them)
  std::string content;   // the text outside the calls ("" for none)
  // [{"name": ..., "arguments": JSON text of the call's arguments}], in the order written
  nlohmann::json calls = nlohmann::json::array();
};
ParsedToolCalls parse_tool_calls(ToolCallFormat f, const std::string& text);

// Streaming: where in a text being written the calls begin or may be beginning (its last bytes a
// prefix of the opening marker), so that the text from there waits for the end; npos where no call
// begins.
size_t tool_calls_start(ToolCallFormat f, const std::string& text);

// tool_choice "required" or a named function: the text that opens a call in form f, written after the
// generation prompt so that the model writes the rest of the call (lattice has no constrained decoding):
// hermes <tool_call>\n{"name": ", llama3_json {"name": ", mistral [TOOL_CALLS] [{"name": "; with a name,
// the name and the opening of its arguments too (..."get_weather", "arguments": ; Llama's "parameters").
// f must not be none.
std::string forced_tool_call_opening(ToolCallFormat f, const std::string& name = "");

// An OpenAI tool call of a completion: {"id", "type": "function", "function": {"name", "arguments"}}. The
// id is unique to (completion, choice, k), 9 letters and digits in the mistral form (which Mistral's
// templates require), else "call_" and 24 of them.
nlohmann::json openai_tool_call(ToolCallFormat f, const nlohmann::json& call, uint64_t completion, size_t choice,
                                size_t k);

}  // namespace lattice
