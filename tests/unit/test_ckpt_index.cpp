// The tensor index: box arithmetic against a brute-force reference, and validation of
// malformed indexes (overlaps, gaps, pieces outside the tensor or in unlisted files).
#include "checkpoint/checkpoint_index.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "ckpt_test_util.h"

namespace lattice {
namespace {

using json = nlohmann::json;

// Row-major linear index of `idx` in a tensor of shape `shape`.
int64_t linear(const std::vector<int64_t>& idx, const std::vector<int64_t>& shape) {
  int64_t k = 0;
  for (size_t d = 0; d < shape.size(); ++d) k = k * shape[d] + idx[d];
  return k;
}

// Calls fn(index) for every index of a box.
template <typename Fn>
void for_each_index(const std::vector<int64_t>& off, const std::vector<int64_t>& len, Fn fn) {
  if (box_numel(len) == 0) return;
  std::vector<int64_t> idx(off);
  for (;;) {
    fn(idx);
    size_t d = idx.size();
    for (;;) {
      if (d == 0) return;
      --d;
      if (++idx[d] < off[d] + len[d]) break;
      idx[d] = off[d];
    }
  }
}

TEST(CkptIndex, BoxIntersectionMatchesBruteForce) {
  std::mt19937 rng(7);
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int trial = 0; trial < 300; ++trial) {
    const size_t R = size_t(uni(1, 4));
    std::vector<int64_t> shape(R), poff(R), plen(R), woff(R), wlen(R);
    for (size_t d = 0; d < R; ++d) {
      shape[d] = uni(1, 6);
      poff[d] = uni(0, shape[d] - 1);
      plen[d] = uni(1, shape[d] - poff[d]);
      woff[d] = uni(0, shape[d] - 1);
      wlen[d] = uni(1, shape[d] - woff[d]);
    }
    // Global value of element k: k itself (as float), so misplaced copies are visible.
    std::vector<float> piece(size_t(box_numel(plen)));
    for_each_index(poff, plen, [&](const std::vector<int64_t>& g) {
      std::vector<int64_t> local(R);
      for (size_t d = 0; d < R; ++d) local[d] = g[d] - poff[d];
      piece[size_t(linear(local, plen))] = float(linear(g, shape));
    });
    std::vector<float> out(size_t(box_numel(wlen)), -1.0f), want(out);
    int64_t expect_copied = 0;
    for_each_index(woff, wlen, [&](const std::vector<int64_t>& g) {
      bool in_piece = true;
      for (size_t d = 0; d < R; ++d) in_piece = in_piece && g[d] >= poff[d] && g[d] < poff[d] + plen[d];
      std::vector<int64_t> local(R);
      for (size_t d = 0; d < R; ++d) local[d] = g[d] - woff[d];
      if (in_piece) {
        want[size_t(linear(local, wlen))] = float(linear(g, shape));
        ++expect_copied;
      }
    });
    const int64_t copied = copy_box_intersection(poff, plen, piece.data(), woff, wlen, out.data(), sizeof(float));
    ASSERT_EQ(copied, expect_copied) << "trial " << trial;
    ASSERT_EQ(out, want) << "trial " << trial;
  }
}

TEST(CkptIndex, FlatRangesBecomeFewBoxesThatTileThem) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t R = size_t(std::uniform_int_distribution<int>(1, 4)(rng));
    std::vector<int64_t> shape(R);
    for (auto& d : shape) d = std::uniform_int_distribution<int64_t>(1, 5)(rng);
    const int64_t n = box_numel(shape);
    int64_t b = std::uniform_int_distribution<int64_t>(0, n)(rng);
    int64_t e = std::uniform_int_distribution<int64_t>(0, n)(rng);
    if (b > e) std::swap(b, e);
    std::vector<Box> boxes = flat_range_to_boxes(shape, b, e);
    ASSERT_LE(boxes.size(), 2 * R - 1);
    // In order, contiguous, and exactly the range.
    int64_t next = b;
    for (const Box& box : boxes) {
      ASSERT_GT(box_numel(box.lengths), 0);
      std::vector<int64_t> elems;
      for_each_index(box.offsets, box.lengths, [&](const std::vector<int64_t>& g) { elems.push_back(linear(g, shape)); });
      for (int64_t k : elems) ASSERT_EQ(k, next++) << "trial " << trial;
    }
    ASSERT_EQ(next, e) << "trial " << trial;
  }
}

TEST(CkptIndex, ScalarTensor) {
  float v = 3.5f, out = 0;
  EXPECT_EQ(copy_box_intersection({}, {}, &v, {}, {}, &out, sizeof(float)), 1);
  EXPECT_EQ(out, 3.5f);
}

json files_json() { return {{"a.safetensors", {{"bytes", 10}, {"crc32", "00000000"}}}}; }

json tensor_json(const std::vector<json>& pieces) {
  return {{"t", {{"dtype", "F32"}, {"shape", {4, 6}}, {"pieces", json(pieces)}}}};
}

json piece(std::vector<int64_t> off, std::vector<int64_t> len, const char* file = "a.safetensors",
           const char* key = "t") {
  return {{"file", file}, {"key", key}, {"offsets", off}, {"lengths", len}};
}

std::string index_error(const json& tensors, const json& files = files_json()) {
  return ckpt_test::error_of([&] { CheckpointIndex::from_json(tensors, files, "ckpt/checkpoint.json"); });
}

TEST(CkptIndex, ValidTilingsParse) {
  // Two column halves, as tensor parallelism splits a row-parallel weight.
  json t = tensor_json({piece({0, 0}, {4, 3}), piece({0, 3}, {4, 3}, "a.safetensors", "t#1")});
  t["t"]["pieces"][1]["file"] = "b.safetensors";
  json files = files_json();
  files["b.safetensors"] = {{"bytes", 1}, {"crc32", "0000ffff"}};
  CheckpointIndex idx = CheckpointIndex::from_json(t, files, "x");
  ASSERT_EQ(idx.tensors.at("t").pieces.size(), 2u);
  EXPECT_EQ(idx.files.at("b.safetensors").crc32, 0xffffu);
  // And back to JSON unchanged.
  EXPECT_EQ(idx.tensors_json(), t);
  EXPECT_EQ(idx.files_json(), files);
}

TEST(CkptIndex, MalformedIndexesAreRejectedWithTheTensorNamed) {
  struct Case {
    json tensors;
    const char* needle;
  } cases[] = {
      {tensor_json({piece({0, 0}, {4, 4}), piece({0, 3}, {4, 3}, "a.safetensors", "t#1")}), "overlap"},
      {tensor_json({piece({0, 0}, {4, 3}), piece({0, 3}, {4, 3})}), "used twice"},
      {tensor_json({piece({0, 0}, {4, 3})}), "cover 12 of its 24"},
      {tensor_json({piece({0, 0}, {4, 7})}), "outside the global shape"},
      {tensor_json({piece({1, 0}, {4, 6})}), "outside the global shape"},
      {tensor_json({piece({0}, {4})}), "rank"},
      {tensor_json({piece({0, 0}, {4, 6}, "other.safetensors")}), "does not list"},
      {tensor_json({}), "no pieces"},
      {tensor_json({piece({0, -1}, {4, 6})}), "non-negative"},
  };
  for (const Case& c : cases) {
    std::string msg = index_error(c.tensors);
    EXPECT_NE(msg.find("ckpt/checkpoint.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'t'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.needle), std::string::npos) << c.needle << " not in: " << msg;
  }
  json bad_dtype = tensor_json({piece({0, 0}, {4, 6})});
  bad_dtype["t"]["dtype"] = "F33";
  EXPECT_NE(index_error(bad_dtype).find("unknown dtype"), std::string::npos);
  EXPECT_NE(index_error(tensor_json({piece({0, 0}, {4, 6})}), {{"a.safetensors", {{"bytes", 1}, {"crc32", "xyz"}}}})
                .find("crc32"),
            std::string::npos);
  EXPECT_NE(index_error(tensor_json({piece({0, 0}, {4, 6})}), {{"../a", {{"bytes", 1}, {"crc32", "00000000"}}}})
                .find("not a plain file name"),
            std::string::npos);
}

}  // namespace
}  // namespace lattice
