// Helpers for the HuggingFace conversion tests: fixture paths, temporary folders, and fixture
// folders rewritten with edited tensors or config.json (for the bad-input tests).
#pragma once
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "model/gpt_model.h"

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

// Every MoE layer's routed experts (`prefix`<l>.mlp.experts.<e>.{gate,up,down}_proj.weight) fused as
// transformers 5 saves them: mlp.experts.gate_up_proj [E, 2F, C] (each expert's gate rows, then its up
// rows) and mlp.experts.down_proj [E, C, F]. Returns how many layers it fused.
inline int fuse_experts(Tensors& t, const std::string& prefix = "model.layers.") {
  int fused = 0;
  for (int64_t l = 0;; ++l) {
    const std::string x = prefix + std::to_string(l) + ".mlp.experts.";
    if (!t.find(x + "0.gate_proj.weight")) {
      bool later = false;  // a dense layer before the MoE ones, or past the last layer
      for (const auto& [name, unused] : t.list) later = later || name.rfind(prefix + std::to_string(l) + ".", 0) == 0;
      if (!later) return fused;
      continue;
    }
    std::vector<uint8_t> gate_up, down;
    int64_t E = 0;
    std::vector<int64_t> gshape, dshape;
    for (;; ++E) {
      const std::string e = x + std::to_string(E) + ".";
      SafeTensor* g = t.find(e + "gate_proj.weight");
      if (!g) break;
      const SafeTensor* u = t.find(e + "up_proj.weight");
      const SafeTensor* d = t.find(e + "down_proj.weight");
      gate_up.insert(gate_up.end(), g->bytes.begin(), g->bytes.end());
      gate_up.insert(gate_up.end(), u->bytes.begin(), u->bytes.end());
      down.insert(down.end(), d->bytes.begin(), d->bytes.end());
      gshape = g->shape;
      dshape = d->shape;
      const std::string dtype = g->dtype;
      for (const char* n : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) t.erase(e + n);
      if (E == 0) {
        t.list.push_back({x + "gate_up_proj", SafeTensor{dtype, {}, {}}});
        t.list.push_back({x + "down_proj", SafeTensor{dtype, {}, {}}});
      }
    }
    t.find(x + "gate_up_proj")->shape = {E, 2 * gshape[0], gshape[1]};
    t.find(x + "gate_up_proj")->bytes = TensorBytes(std::move(gate_up));
    t.find(x + "down_proj")->shape = {E, dshape[0], dshape[1]};
    t.find(x + "down_proj")->bytes = TensorBytes(std::move(down));
    ++fused;
  }
}

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

// The main loss and each prediction depth's of one micro-batch (the fixture's `tokens_key` tensor: its
// inputs all but the last token, its labels all but the first) against the fixture's `main_loss` and
// `mtp_loss` (the reference's, one per depth), within 1e-5 relative.
inline void expect_fixture_losses(GPTModel& m, const std::string& dir, const std::string& tokens_key) {
  SafetensorsFile ref = SafetensorsFile::read(fixture(dir) + "/expected_logits.safetensors");
  const std::vector<float> want = ref.get_f32("mtp_loss");
  ASSERT_EQ(m.config().mtp_num_layers, int64_t(want.size()));
  const std::vector<int32_t> tokens = ref.get_i32(tokens_key);
  MicroBatchKey key;  // a training forward (the depths run in training only); the model has no dropout
  if (m.params().has_grads()) m.params().zero_grad();
  const double main_loss = m.forward_backward(tokens.data(), nullptr, 1, int64_t(tokens.size()) - 1, 1.0f, key);
  const std::vector<LossSum> depths = m.take_mtp_losses();
  ASSERT_EQ(depths.size(), want.size());
  EXPECT_NEAR(main_loss, ref.get_f32("main_loss")[0], 1e-5 * main_loss) << dir;
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ(depths[k].count, 1.0);  // one micro-batch's mean loss
    const double mtp = depths[k].sum / depths[k].count;
    EXPECT_NEAR(mtp, want[k], 1e-5 * mtp) << dir << ": depth " << k + 1;
  }
}

// `load` fails with a one-line lattice error that contains every one of `needles`.
inline void expect_one_line_error(const std::function<void()>& load, const std::vector<std::string>& needles) {
  try {
    load();
    ADD_FAILURE() << "no error; expected one mentioning " << needles.at(0);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

// Every parameter of m drawn N(0, 0.3) (seed `seed`); with zero_padded_vocabulary, the padded vocabulary rows
// of the embedding and the output layer then zeroed (an export drops them; expect_same_model wants zeros back).
inline void randomize_parameters(GPTModel& m, uint32_t seed, bool zero_padded_vocabulary) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  for (int64_t i = 0; i < m.params().numel(); ++i) m.params().params()[i] = nd(gen);
  if (!zero_padded_vocabulary) return;
  const TransformerConfig& c = m.config();
  for (const char* name : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
    if (!m.params().has(name)) continue;
    const ParamInfo& p = m.params().info(name);
    std::fill(m.params().params() + p.offset + c.vocab_size * c.hidden_size, m.params().params() + p.offset + p.numel,
              0.0f);
  }
}

// Every tensor of the fixture folder `dir` is in `out`'s model file with the same bytes, and no other.
inline void expect_same_tensors(const std::string& dir, const std::string& out) {
  SafetensorsFile a = SafetensorsFile::read(fixture(dir) + "/model.safetensors");
  SafetensorsFile b = SafetensorsFile::read(out + "/model.safetensors");
  EXPECT_EQ(a.names(), b.names());
  for (const std::string& name : a.names()) {
    ASSERT_TRUE(b.has(name)) << name;
    EXPECT_EQ(a.get(name).shape, b.get(name).shape) << name;
    EXPECT_TRUE(a.get(name).bytes == b.get(name).bytes) << name << " differs after the round trip";
  }
}

// `back` (a model converted out and in again) holds every parameter of `model` bit for bit but the
// padded vocabulary rows, which are zero; and since padded rows never touch the logits of real
// tokens, those are bit-identical.
inline void expect_same_model(GPTModel& model, GPTModel& back) {
  const TransformerConfig& c = model.config();
  for (const ParamInfo& p : model.params().infos()) {
    const float* x = model.params().params() + p.offset;
    const float* y = back.params().params() + back.params().info(p.name).offset;
    const bool vocab = p.name == "embedding.word_embeddings.weight" || p.name == "output_layer.weight";
    const int64_t real = vocab ? c.vocab_size * c.hidden_size : p.numel;
    for (int64_t i = 0; i < real; ++i) ASSERT_EQ(x[i], y[i]) << p.name << " element " << i;
    for (int64_t i = real; i < p.numel; ++i) ASSERT_EQ(y[i], 0.0f) << p.name << " padded element " << i;
  }
  const int64_t T = c.max_position_embeddings, Vp = c.padded_vocab_size;
  std::vector<int32_t> tokens(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) tokens[size_t(t)] = int32_t((t * 37 + 5) % c.vocab_size);
  std::vector<float> la(size_t(T * Vp)), lb(size_t(T * Vp));
  model.forward_logits(tokens.data(), 1, T, la.data());
  back.forward_logits(tokens.data(), 1, T, lb.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < c.vocab_size; ++v) ASSERT_EQ(la[size_t(t * Vp + v)], lb[size_t(t * Vp + v)]) << t << "," << v;
}

// The model's logits of the fixture folder `dir`'s token sequence against its
// expected_logits.safetensors (`tokens` [T], `logits` [T, V] from the fixture script's own
// forward pass): within tol (1e-5), with a padded vocabulary.
inline void expect_fixture_logits(GPTModel& model, const std::string& dir, double tol = 1e-5) {
  const TransformerConfig& c = model.config();
  SafetensorsFile ref = SafetensorsFile::read(fixture(dir) + "/expected_logits.safetensors");
  const std::vector<int32_t> tokens = ref.get_i32("tokens");
  const std::vector<float> want = ref.get_f32("logits");
  const int64_t T = int64_t(tokens.size()), V = c.vocab_size, Vp = c.padded_vocab_size;
  ASSERT_EQ(int64_t(want.size()), T * V);
  ASSERT_GT(Vp, V) << "the fixture should exercise vocabulary padding";
  std::vector<float> logits(size_t(T * Vp));
  model.forward_logits(tokens.data(), 1, T, logits.data());
  double max_err = 0, max_ref = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) {
      max_ref = std::max(max_ref, std::fabs(double(want[size_t(t * V + v)])));
      max_err = std::max(max_err, std::fabs(double(logits[size_t(t * Vp + v)]) - want[size_t(t * V + v)]));
    }
  EXPECT_GT(max_ref, 0.5) << "fixture logits too small to be a meaningful check";
  EXPECT_LE(max_err, tol) << dir << ": logits differ from the independent HF-layout model";
}

}  // namespace lattice::hf_test
