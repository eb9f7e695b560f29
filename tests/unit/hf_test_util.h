// Helpers for the HuggingFace conversion tests: fixture paths, temporary folders, and fixture
// folders rewritten with edited tensors or config.json (for the bad-input tests).
#pragma once
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/safetensors.h"

namespace lattice::hf_test {

inline std::string fixture(const std::string& name) {
  return std::string(LATTICE_SOURCE_DIR) + "/tests/fixtures/" + name;
}

// A fresh empty directory under the build tree, removed by the destructor.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name) {
    path = std::filesystem::path(LATTICE_BINARY_DIR) / "test_tmp" / ("hf_" + name);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string str() const { return path.string(); }
};

// A model file's tensors in file order, to edit.
struct Tensors {
  std::vector<std::pair<std::string, SafeTensor>> list;
  SafeTensor* find(const std::string& n) {
    for (auto& [name, t] : list)
      if (name == n) return &t;
    return nullptr;
  }
  void erase(const std::string& n) {
    std::erase_if(list, [&](const auto& e) { return e.first == n; });
  }
};

// The fixture folder `name` copied into tmp with `edit_tensors` applied to its tensors and
// `edit_config` to its config.json (either may be null); returns tmp's path.
inline std::string rewritten_fixture(const std::string& name, const std::function<void(Tensors&)>& edit_tensors,
                                     const std::function<void(nlohmann::json&)>& edit_config, TempDir& tmp) {
  const std::string src = fixture(name);
  SafetensorsFile f = SafetensorsFile::read(src + "/model.safetensors");
  Tensors ts;
  for (const std::string& n : f.names()) ts.list.push_back({n, f.get(n)});
  if (edit_tensors) edit_tensors(ts);
  SafetensorsWriter w;
  for (auto& [tensor, t] : ts.list) w.add(tensor, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
  w.write(tmp.str() + "/model.safetensors");
  std::ifstream in(src + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  if (edit_config) edit_config(j);
  std::ofstream(tmp.str() + "/config.json") << j.dump(2);
  return tmp.str();
}

}  // namespace lattice::hf_test
