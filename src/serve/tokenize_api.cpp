#include "serve/tokenize_api.h"

#include "serve/chat_completions_api.h"
#include "serve/request_fields.h"
#include "serve/token_text.h"

namespace lattice {

HttpReply tokenize(const nlohmann::ordered_json& request, const EndpointContext& ctx) {
  const nlohmann::json req = request;
  const Tokenizer& tok = ctx.tokenizer;
  std::vector<int32_t> ids;
  if (req.contains("messages")) {
    check_known_fields(req, {"model", "messages", "add_generation_prompt", "add_special_tokens", "tools",
                             "tool_choice", "chat_template_kwargs", "return_token_strs"});
    if (bool_field(req, "add_special_tokens").value_or(false))
      throw RequestError("add_special_tokens: a conversation is the chat template's text, which writes the "
                         "tokenizer's ids itself (false only)");
    ids = chat_prompt(request, ctx).tokens;
  } else {
    check_known_fields(req, {"model", "prompt", "add_special_tokens", "return_token_strs"});
    const auto prompt = req.find("prompt");
    if (prompt == req.end() || !prompt->is_string()) throw RequestError("prompt must be a text (or give messages)");
    const std::string text = prompt->get<std::string>();
    ids = bool_field(req, "add_special_tokens").value_or(true) ? tok.encode(text) : tok.encode_without_specials(text);
  }
  nlohmann::json reply = {{"count", ids.size()}, {"max_model_len", ctx.context}, {"tokens", ids}, {"token_strs", nullptr}};
  if (bool_field(req, "return_token_strs").value_or(false)) reply["token_strs"] = token_pieces(tok, ids);
  return HttpReply{200, json_text(reply)};
}

HttpReply detokenize(const nlohmann::json& req, const EndpointContext& ctx) {
  check_known_fields(req, {"model", "tokens"});
  const auto tokens = req.find("tokens");
  if (tokens == req.end() || !tokens->is_array()) throw RequestError("tokens must be a list of token ids");
  const int64_t vocab = ctx.tokenizer.vocab_size();
  std::vector<int32_t> ids;
  for (const nlohmann::json& t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
      throw RequestError("tokens: " + t.dump() + " is not an id in [0, " + std::to_string(vocab) + ")");
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  return HttpReply{200, json_text({{"prompt", ctx.tokenizer.decode(ids)}})};
}

}  // namespace lattice
