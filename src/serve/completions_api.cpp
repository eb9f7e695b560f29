#include "serve/completions_api.h"

#include <algorithm>
#include <ctime>

#include "serve/request_fields.h"
#include "serve/openai_common.h"
#include "serve/token_text.h"

namespace lattice {
namespace {

// The prompts of the "prompt" field as token ids (texts encoded, ids checked).
std::vector<std::vector<int32_t>> prompt_ids(const nlohmann::json& req, const Tokenizer& tok, int64_t vocab) {
  auto it = req.find("prompt");
  if (it == req.end() || it->is_null()) throw RequestError("prompt is required");
  const nlohmann::json& p = *it;
  auto ids_of = [&](const nlohmann::json& list) {
    std::vector<int32_t> ids;
    for (const auto& t : list) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
        throw RequestError("prompt: token " + t.dump() + " is not an id in [0, " + std::to_string(vocab) + ")");
      ids.push_back(int32_t(t.get<int64_t>()));
    }
    return ids;
  };
  auto text_ids = [&](const std::string& text) {
    std::vector<int32_t> ids = tok.encode(text);
    if (ids.empty()) ids.push_back(tok.eod());  // an empty prompt: the start of a document
    return ids;
  };
  std::vector<std::vector<int32_t>> prompts;
  if (p.is_string()) {
    prompts.push_back(text_ids(p.get<std::string>()));
  } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](auto& x) { return x.is_string(); })) {
    for (const auto& x : p) prompts.push_back(text_ids(x.get<std::string>()));
  } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](auto& x) { return x.is_number(); })) {
    prompts.push_back(ids_of(p));
  } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](auto& x) { return x.is_array(); })) {
    for (const auto& x : p) {
      if (x.empty()) throw RequestError("prompt: an empty list of token ids");
      prompts.push_back(ids_of(x));
    }
  } else {
    throw RequestError("prompt must be a text, a list of texts, a list of token ids or a list of such lists");
  }
  if (prompts.size() > 128) throw RequestError("prompt: at most 128 prompts, got " + std::to_string(prompts.size()));
  return prompts;
}

}  // namespace

HttpReply openai_completions(const nlohmann::json& req, const EndpointContext& ctx, uint64_t id) {
  if (req.contains("suffix") && !req["suffix"].is_null() && !req["suffix"].empty())
    throw RequestError("suffix is not supported by lattice serve");
  const SamplingConfig sampling = openai_sampling(req, ctx.tokenizer.vocab_size());
  const int64_t n = choices_per_prompt(req);
  const bool stream = bool_field(req, "stream").value_or(false);
  check_known_fields(req, {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "logprobs", "echo",
                           "seed", "stop", "n", "best_of", "stream", "stream_options", "suffix", "logit_bias",
                           "frequency_penalty", "presence_penalty", "repetition_penalty", "user"});
  const bool usage_chunk = stream_includes_usage(req);
  const Tokenizer& tok = ctx.tokenizer;
  const int64_t vocab = tok.vocab_size();
  const std::vector<std::vector<int32_t>> prompts = prompt_ids(req, tok, vocab);
  const int64_t max_tokens = int_field(req, "max_tokens", 0, INT32_MAX).value_or(16);
  const std::optional<int64_t> top = int_field(req, "logprobs", 0, 20);
  const bool echo = bool_field(req, "echo").value_or(false);
  const std::optional<int64_t> given_seed = int_field(req, "seed", INT64_MIN, INT64_MAX);
  const std::vector<std::string> stops = stop_strings(req);
  if (!echo && max_tokens == 0) throw RequestError("max_tokens 0 returns nothing without echo");
  if (int64_t(prompts.size()) * n > 128)
    throw RequestError("n " + std::to_string(n) + " x " + std::to_string(prompts.size()) +
                       " prompts: at most 128 choices a request");
  if (stream && (echo || top)) throw RequestError(std::string(echo ? "echo" : "logprobs") + " does not go with stream");

  // Choice k = i * n + j is prompt i's j-th sample, drawn from prompt_stream(seed, k) (with n 1: prompt i's
  // stream, as generate's).
  const uint64_t seed = ctx.seed(given_seed);
  std::vector<GenerationRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i)
    for (int64_t j = 0; j < n; ++j) {
      requests.push_back(prompt_request(ctx, i, prompts[i], max_tokens, "max_tokens", sampling, seed, top.has_value(),
                                        top.value_or(0)));
      requests.back().stream = prompt_stream(seed, requests.size() - 1);
    }
  if (stream) {
    // data: {"id", "object": "text_completion", "created", "model",
    //        "choices": [{"index", "text", "logprobs": null, "finish_reason"}]}
    const nlohmann::json head = {{"id", "cmpl-" + std::to_string(id)}, {"object", "text_completion"},
                                 {"created", int64_t(std::time(nullptr))}, {"model", ctx.model_name}};
    ClosingOf closing;
    if (usage_chunk)
      closing = [head, n](const std::vector<GenerationResult>& results) {
        nlohmann::json chunk = head;
        chunk["choices"] = nlohmann::json::array();
        chunk["usage"] = usage_of(results, n);
        return chunk;
      };
    return stream_choices(
        std::move(requests), stops, ctx,
        [head](size_t index, const std::string& text, const char* finish) {
          nlohmann::json chunk = head;
          chunk["choices"] = {{{"index", index}, {"text", text}, {"logprobs", nullptr},
                               {"finish_reason", finish ? nlohmann::json(finish) : nlohmann::json(nullptr)}}};
          return chunk;
        },
        {}, closing);
  }
  const std::vector<GenerationResult> results = ctx.generate(std::move(requests), stop_at_strings(tok, stops));

  nlohmann::json choices = nlohmann::json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const GenerationResult& r = results[i];
    const int64_t P0 = r.prompt_length, length = int64_t(r.tokens.size());
    std::string added = continuation_text(tok, r.tokens, P0);
    const size_t cut = first_stop(added, stops);
    const bool stopped = r.stopped || cut != std::string::npos;
    if (cut != std::string::npos) added.resize(cut);
    const std::vector<int32_t> prompt(r.tokens.begin(), r.tokens.begin() + P0);
    const std::string prompt_text = echo ? tok.decode(prompt) : "";
    // The returned tokens [first, last): the prompt's with echo, and the new ones whose text starts
    // before the cut; each one's offset in the returned text.
    const int64_t first = echo ? 0 : P0;
    std::vector<size_t> offsets;
    int64_t last = first;
    for (int64_t k = first; k < length; ++k) {
      const std::vector<int32_t> head(r.tokens.begin(), r.tokens.begin() + k);
      if (k < P0) {
        offsets.push_back(tok.decode(head).size());
      } else {
        const size_t at = continuation_text(tok, head, P0).size();  // in the new text
        if (cut != std::string::npos && at >= cut) break;
        offsets.push_back(prompt_text.size() + at);
      }
      last = k + 1;
    }
    nlohmann::json choice = {{"index", i},
                             {"text", prompt_text + added},
                             {"finish_reason", stopped ? "stop" : "length"},
                             {"logprobs", nullptr}};
    if (top) {
      nlohmann::json pieces = nlohmann::json::array(), lps = nlohmann::json::array(),
                     tops = *top > 0 ? nlohmann::json::array() : nlohmann::json(nullptr);
      for (int64_t k = first; k < last; ++k) {
        pieces.push_back(token_piece(tok, r.tokens, size_t(k), r.tokens[size_t(k)]));
        if (k == 0) {  // the first token: nothing before it to predict it
          lps.push_back(nullptr);
          if (*top > 0) tops.push_back(nullptr);
          continue;
        }
        lps.push_back(r.logprobs[size_t(k - 1)]);
        if (*top > 0) {
          nlohmann::json best = nlohmann::json::object();
          for (const auto& [t, lp] : r.top_logprobs[size_t(k - 1)]) best[token_piece(tok, r.tokens, size_t(k), t)] = lp;
          tops.push_back(best);
        }
      }
      choice["logprobs"] = {{"tokens", pieces}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
    }
    choices.push_back(choice);
  }
  nlohmann::json reply = {{"id", "cmpl-" + std::to_string(id)},
                          {"object", "text_completion"},
                          {"created", int64_t(std::time(nullptr))},
                          {"model", ctx.model_name},
                          {"choices", choices},
                          {"usage", usage_of(results, n)}};
  return HttpReply{200, json_text(reply)};
}

HttpReply openai_models(const EndpointContext& ctx) {
  nlohmann::json reply = {
      {"object", "list"},
      {"data", nlohmann::json::array({{{"id", ctx.model_name}, {"object", "model"}, {"owned_by", "lattice"}}})}};
  return HttpReply{200, json_text(reply)};
}

}  // namespace lattice
