#include "data/generation_config.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lattice {

std::vector<int32_t> generation_stop_tokens(const Tokenizer& tok, const std::string& tokenizer_model) {
  namespace fs = std::filesystem;
  std::vector<int32_t> stops = {tok.eod()};
  if (tokenizer_model.empty()) return stops;
  std::error_code ec;
  fs::path dir(tokenizer_model);
  if (!fs::is_directory(dir, ec)) dir = dir.parent_path();
  const fs::path file = (dir.empty() ? fs::path(".") : dir) / "generation_config.json";
  if (!fs::exists(file, ec)) return stops;
  const std::string what = "--tokenizer-model " + file.string();
  const nlohmann::json j = nlohmann::json::parse(read_tokenizer_file(file.string(), what), nullptr, false);
  if (j.is_discarded() || !j.is_object()) LATTICE_FAIL() << what << ": not a JSON object";
  if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return stops;
  const nlohmann::json ids = j["eos_token_id"].is_array() ? j["eos_token_id"] : nlohmann::json::array({j["eos_token_id"]});
  for (const nlohmann::json& v : ids) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= tok.vocab_size())
      LATTICE_FAIL() << what << ": eos_token_id " << v.dump() << " is not a token of the " << tok.vocab_size()
                     << "-token vocabulary";
    const int32_t id = v.get<int32_t>();
    if (std::find(stops.begin(), stops.end(), id) == stops.end()) stops.push_back(id);
  }
  return stops;
}

}  // namespace lattice
