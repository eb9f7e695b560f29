#include "serve/megatron_api.h"

#include "serve/request_fields.h"
#include "serve/token_text.h"

namespace lattice {

HttpReply megatron_generate(const nlohmann::json& req, const EndpointContext& ctx) {
  for (const char* gone : {"max_len", "sentences"})
    if (req.contains(gone))
      throw RequestError(std::string(gone) + " is no longer used; replace it with " +
                         (std::string(gone) == "max_len" ? "tokens_to_generate" : "prompts"));
  for (const char* refused : {"beam_width", "top_p_decay", "top_p_bound", "prevent_newline_after_colon",
                              "length_penalty", "stop_token"})
    if (req.contains(refused)) throw RequestError(std::string(refused) + " is not supported by lattice serve");
  check_known_fields(req, {"prompts", "tokens_to_generate", "logprobs", "temperature", "top_k", "top_p", "add_BOS",
                           "stop_on_eol", "stop_on_double_eol", "random_seed", "no_log"});
  auto prompts_it = req.find("prompts");
  if (prompts_it == req.end()) throw RequestError("prompts argument required");
  if (!prompts_it->is_array()) throw RequestError("prompts is not a list of strings");
  if (prompts_it->empty()) throw RequestError("prompts is empty");
  if (prompts_it->size() > 128) throw RequestError("Maximum number of prompts is 128");
  std::vector<std::string> prompts;
  for (const auto& p : *prompts_it) {
    if (!p.is_string()) throw RequestError("prompts is not a list of strings");
    prompts.push_back(p.get<std::string>());
  }
  const int64_t tokens_to_generate = int_field(req, "tokens_to_generate", 0, INT32_MAX).value_or(64);
  const bool logprobs = bool_field(req, "logprobs").value_or(false);
  if (tokens_to_generate == 0 && !logprobs) throw RequestError("tokens_to_generate=0 implies logprobs should be True");
  SamplingConfig sampling;
  sampling.temperature = float(number_field(req, "temperature", 0.0, 100.0).value_or(1.0));
  if (!(sampling.temperature > 0)) throw RequestError("temperature must be a positive number less than or equal to 100.0");
  sampling.top_k = int_field(req, "top_k", 0, 1000).value_or(0);
  const double top_p = number_field(req, "top_p", 0.0, 1.0).value_or(0.0);
  if (top_p > 0 && sampling.top_k > 0) throw RequestError("cannot set both top-k and top-p samplings.");
  sampling.top_p = top_p > 0 ? float(top_p) : 1.0f;
  const bool add_bos = bool_field(req, "add_BOS").value_or(false);
  const bool stop_on_eol = bool_field(req, "stop_on_eol").value_or(false);
  const bool stop_on_double_eol = bool_field(req, "stop_on_double_eol").value_or(false);
  const std::optional<int64_t> random_seed = int_field(req, "random_seed", -1, INT64_MAX);
  bool_field(req, "no_log");  // (checked; the server logs no request bodies)

  const Tokenizer& tok = ctx.tokenizer;
  const uint64_t seed = ctx.seed(random_seed && *random_seed >= 0 ? random_seed : std::nullopt);
  std::vector<GenerationRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty() && !add_bos) throw RequestError("Empty prompts require add_BOS=true");
    std::vector<int32_t> ids;
    if (add_bos) ids.push_back(tok.eod());
    tok.encode_append(prompts[i], &ids);
    requests.push_back(
        prompt_request(ctx, i, std::move(ids), tokens_to_generate, "tokens_to_generate", sampling, seed, logprobs));
  }
  KeepGoing keep_going;
  if (stop_on_eol || stop_on_double_eol)
    keep_going = [&](size_t, const GenerationResult& r) {
      const std::string piece = token_piece(tok, r.tokens, r.tokens.size() - 1, r.tokens.back());
      if (stop_on_eol) return piece.find('\n') == std::string::npos;
      const std::string text = continuation_text(tok, r.tokens, r.prompt_length);
      return text.find("\n\n") == std::string::npos;
    };
  const std::vector<GenerationResult> results = ctx.generate(std::move(requests), keep_going);

  nlohmann::json text = nlohmann::json::array(), segments = nlohmann::json::array(),
                 tokens = nlohmann::json::array(), lps = nlohmann::json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const GenerationResult& r = results[i];
    text.push_back(prompts[i] + continuation_text(tok, r.tokens, r.prompt_length));
    segments.push_back(token_pieces(tok, r.tokens));
    tokens.push_back(r.tokens);
    lps.push_back(r.logprobs);
  }
  nlohmann::json reply = {{"text", text}, {"segments", segments}, {"tokens", tokens}};
  if (logprobs) reply["logprobs"] = lps;
  return HttpReply{200, json_text(reply)};
}

}  // namespace lattice
