// Helpers for the dataset tests: temporary directories, synthetic indexed datasets
// whose tokens name their position, the numpy reference fixture, error matching.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "test_util.h"

namespace lattice::ds_test {

// A fresh directory per test (removed when the test passes).
inline std::string temp_dir() { return test_util::temp_dir(); }

// The reference script's tokens: token(sequence s, position p) = (s*131 + p*7) % 1000.
inline int32_t ref_token(int64_t s, int64_t p) { return int32_t((s * 131 + p * 7) % 1000); }

// One document per sequence, tokens ref_token(s, p); returns the prefix.
inline std::string write_dataset(const std::string& prefix, const std::vector<int32_t>& lengths) {
  IndexedDatasetBuilder b(prefix, IndexDTypeCode::u16);
  std::vector<int32_t> toks;
  for (size_t s = 0; s < lengths.size(); ++s) {
    toks.resize(size_t(lengths[s]));
    for (int32_t p = 0; p < lengths[s]; ++p) toks[size_t(p)] = ref_token(int64_t(s), p);
    b.add_item(toks.data(), lengths[s]);
    b.end_document();
  }
  b.finalize();
  return prefix;
}

inline const nlohmann::json& reference() {
  static const nlohmann::json j = [] {
    std::ifstream in(std::string(LATTICE_SOURCE_DIR) + "/tests/fixtures/gpt_dataset_reference.json");
    if (!in) throw Error("tests/fixtures/gpt_dataset_reference.json: cannot open");
    return nlohmann::json::parse(in);
  }();
  return j;
}

// Runs f, expects a lattice::Error whose message contains every needle.
inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no error thrown; expected one mentioning " << needles.front();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << msg << "' lacks '" << n << "'";
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line error: " << msg;
  }
}

}  // namespace lattice::ds_test
