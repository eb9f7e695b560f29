#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace fs = std::filesystem;
using lattice::SafetensorsFile;
using lattice::SafetensorsWriter;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("lattice_st_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::string u64le(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

std::string floats_le(const std::vector<float>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

// A file: length, header (space-padded to 8 bytes unless pad=false), data.
std::string build(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  return u64le(header.size()) + header + data;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The error message of SafetensorsFile::read(path) ("" if it does not throw).
std::string read_error(const std::string& path) {
  try {
    SafetensorsFile::read(path);
  } catch (const lattice::Error& e) {
    return e.what();
  }
  return "";
}

// Writes `bytes` to path and expects reading it to fail with a one-line message naming the file
// and containing each of `needles`.
void expect_read_fails(const std::string& path, const std::string& bytes,
                       const std::vector<std::string>& needles) {
  write_bytes(path, bytes);
  std::string msg = read_error(path);
  ASSERT_FALSE(msg.empty()) << "reading " << path << " did not fail";
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
}

}  // namespace

TEST_F(SafetensorsTest, RoundTrip) {
  std::vector<float> w = {1.5f, -2.25f, 3.0f, 0.0f, 1e-30f, -7.0f};
  std::vector<int32_t> ids = {0, 99, -5, 1 << 30};
  std::vector<uint16_t> bf = {0x3f80, 0xc000, 0x7f80};
  std::vector<uint8_t> raw = {1, 2, 3};
  float scalar = 42.0f;

  SafetensorsWriter wr;
  wr.add_f32("layer.weight", {2, 3}, w.data());
  wr.add("tokens", "I32", {2, 2}, ids.data(), ids.size() * 4);
  wr.add("half", "BF16", {3}, bf.data(), bf.size() * 2);
  wr.add("raw", "U8", {3}, raw.data(), raw.size());
  wr.add("scalar", "F32", {}, &scalar, 4);
  wr.add("empty", "F32", {0, 5}, nullptr, 0);
  wr.set_metadata("hidden_size", "64");
  wr.set_metadata("note", "a \"quoted\" value");
  const std::string path = file("rt.safetensors");
  wr.write(path);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  // The data buffer starts 8-byte aligned.
  std::string bytes = read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);

  auto f = SafetensorsFile::read(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"empty", "half", "layer.weight", "raw", "scalar", "tokens"}));
  EXPECT_TRUE(f.has("raw"));
  EXPECT_FALSE(f.has("missing"));
  EXPECT_EQ(f.get("layer.weight").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.get("layer.weight").dtype, "F32");
  EXPECT_EQ(f.get_f32("layer.weight"), w);
  EXPECT_EQ(f.get_i32("tokens"), ids);
  EXPECT_EQ(f.get("half").dtype, "BF16");
  ASSERT_EQ(f.get("half").bytes.size(), 6u);
  EXPECT_EQ(std::memcmp(f.get("half").bytes.data(), bf.data(), 6), 0);
  EXPECT_EQ(f.get("raw").bytes, raw);
  EXPECT_TRUE(f.get("scalar").shape.empty());
  EXPECT_EQ(f.get("scalar").numel(), 1);
  EXPECT_EQ(f.get_f32("scalar"), std::vector<float>{42.0f});
  EXPECT_EQ(f.get("empty").numel(), 0);
  EXPECT_TRUE(f.get("empty").bytes.empty());
  EXPECT_EQ(f.metadata().at("hidden_size"), "64");
  EXPECT_EQ(f.metadata().at("note"), "a \"quoted\" value");
  EXPECT_EQ(f.metadata().size(), 2u);

  // Overwriting is atomic and replaces the old contents.
  SafetensorsWriter wr2;
  wr2.add_f32("only", {1}, &scalar);
  wr2.write(path);
  auto g = SafetensorsFile::read(path);
  EXPECT_EQ(g.names(), std::vector<std::string>{"only"});
  EXPECT_TRUE(g.metadata().empty());
}

// The writer produces exactly the bytes of a hand-built file, and the reader reads a hand-built
// file (with the keys in another order, as other writers produce them).
// The data is mapped, not copied: each tensor a view of the file, which outlives the SafetensorsFile
// and a rewrite of the file (a new file renamed over it); a write through a copy's mutable bytes
// copies them first and leaves the mapping (and other views) alone.
TEST_F(SafetensorsTest, TensorsAreViewsOfTheMappedFile) {
  const std::vector<float> w = {1, 2, 3, 4};
  SafetensorsWriter wr;
  wr.add_f32("w", {4}, w.data());
  const std::string path = file("mapped.safetensors");
  wr.write(path);
  lattice::SafeTensor kept;
  {
    auto f = SafetensorsFile::read(path);
    EXPECT_TRUE(f.get("w").bytes.mapped());
    kept = f.get("w");  // shares the mapping
  }
  const std::vector<float> other = {9, 9, 9, 9};
  SafetensorsWriter wr2;
  wr2.add_f32("w", {4}, other.data());
  wr2.write(path);  // renamed over the mapped file
  ASSERT_EQ(kept.bytes.size(), 16u);
  std::vector<float> got(4);
  std::memcpy(got.data(), kept.bytes.data(), 16);
  EXPECT_EQ(got, w) << "the view follows the file it mapped, not its replacement";
  lattice::SafeTensor copy = kept;
  copy.bytes[0] ^= 0x01;  // copy on write
  EXPECT_FALSE(copy.bytes.mapped());
  EXPECT_TRUE(kept.bytes.mapped());
  EXPECT_NE(copy.bytes, kept.bytes);
  std::memcpy(got.data(), kept.bytes.data(), 16);
  EXPECT_EQ(got, w);
  EXPECT_EQ(SafetensorsFile::read(path).get_f32("w"), other);
}

TEST_F(SafetensorsTest, ByteLevel) {
  std::vector<float> a = {1.0f, 2.0f};
  std::vector<int32_t> b = {7, -8, 9};
  const std::string data = floats_le(a) + std::string(reinterpret_cast<const char*>(b.data()), 12);
  const std::string header =
      R"({"__metadata__":{"k":"v"},"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]},)"
      R"("b":{"data_offsets":[8,20],"dtype":"I32","shape":[1,3]}})";
  const std::string expected = build(header, data);
  ASSERT_EQ(expected.size() % 8, (8 + 20) % 8);

  SafetensorsWriter wr;
  wr.add_f32("a", {2}, a.data());
  wr.add("b", "I32", {1, 3}, b.data(), 12);
  wr.set_metadata("k", "v");
  wr.write(file("w.safetensors"));
  EXPECT_EQ(read_bytes(file("w.safetensors")), expected);

  // Hand-built, unpadded, tensors listed in reverse order, b's data first in the buffer.
  const std::string data2 = std::string(reinterpret_cast<const char*>(b.data()), 12) + floats_le(a);
  const std::string header2 =
      R"({"b": {"dtype": "I32", "shape": [1, 3], "data_offsets": [0, 12]},)"
      R"( "a": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}, "__metadata__": {"x": "y"}})";
  write_bytes(file("h.safetensors"), build(header2, data2, /*pad=*/false));
  auto f = SafetensorsFile::read(file("h.safetensors"));
  EXPECT_EQ(f.get_f32("a"), a);
  EXPECT_EQ(f.get_i32("b"), b);
  EXPECT_EQ(f.get("b").shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(f.metadata().at("x"), "y");
}

TEST_F(SafetensorsTest, MissingFileAndMissingTensor) {
  const std::string nope = file("nope.safetensors");
  std::string msg = read_error(nope);
  EXPECT_NE(msg.find(nope), std::string::npos) << msg;

  float x = 1.0f;
  int32_t i = 3;
  SafetensorsWriter wr;
  wr.add_f32("x", {1}, &x);
  wr.add("i", "I32", {1}, &i, 4);
  const std::string path = file("t.safetensors");
  wr.write(path);
  auto f = SafetensorsFile::read(path);
  try {
    f.get("decoder.layers.0.mlp.linear_fc1.weight");
    FAIL() << "no error";
  } catch (const lattice::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("decoder.layers.0.mlp.linear_fc1.weight"), std::string::npos) << m;
  }
  try {
    f.get_f32("i");
    FAIL() << "no error";
  } catch (const lattice::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("'i'"), std::string::npos) << m;
    EXPECT_NE(m.find("I32"), std::string::npos) << m;
  }
  EXPECT_THROW(f.get_i32("x"), lattice::Error);
}

TEST_F(SafetensorsTest, CorruptFilesNameTheFile) {
  const std::string p = file("bad.safetensors");
  const std::string d8 = floats_le({1.0f, 2.0f});
  // Too small for the length field.
  expect_read_fails(p, "abc", {"too small"});
  expect_read_fails(p, "", {"too small"});
  // Header length past the end of the file.
  expect_read_fails(p, u64le(1000) + "{}", {"past the end"});
  expect_read_fails(p, u64le(~0ull) + "{}      ", {"past the end"});
  // Invalid JSON; JSON that is not an object.
  expect_read_fails(p, build(R"({"a": {"dtype": "F32", )", d8), {"not valid JSON"});
  expect_read_fails(p, build("[1, 2]", ""), {"not a JSON object"});
  // Bad entries.
  expect_read_fails(p, build(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", d8),
                    {"'a'", "unknown dtype"});
  expect_read_fails(p, build(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8),
                    {"'a'", "shape"});
  expect_read_fails(p, build(R"({"a":{"dtype":"F32","shape":[2]}})", d8), {"'a'", "data_offsets"});
  expect_read_fails(p, build(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8),
                    {"'a'", "begin > end"});
  expect_read_fails(p, build(R"({"__metadata__":{"k":3}})", ""), {"__metadata__", "'k'"});
  // Offsets out of range.
  expect_read_fails(p, build(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", d8),
                    {"'a'", "out of range"});
  // Offsets not matching dtype * shape.
  expect_read_fails(p, build(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8),
                    {"'a'", "needs 12"});
  expect_read_fails(p, build(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}})", d8),
                    {"'a'", "F16"});
  // Overlapping tensors.
  expect_read_fails(p,
                    build(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                          d8),
                    {"'b'", "overlap", "'a'"});
  // A hole between tensors, and trailing bytes.
  expect_read_fails(p,
                    build(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
                          d8),
                    {"'b'", "hole"});
  expect_read_fails(p, build(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8),
                    {"trailing"});
  // Truncated file: the data buffer is shorter than the header says.
  expect_read_fails(p, build(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8.substr(0, 5)),
                    {"'a'", "out of range"});
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  float x[2] = {1, 2};
  SafetensorsWriter wr;
  EXPECT_THROW(wr.add("a", "F32", {3}, x, 8), lattice::Error);   // size mismatch
  EXPECT_THROW(wr.add("a", "F33", {2}, x, 8), lattice::Error);   // unknown dtype
  EXPECT_THROW(wr.add("__metadata__", "F32", {2}, x, 8), lattice::Error);
  wr.add("a", "F32", {2}, x, 8);
  EXPECT_THROW(wr.add("a", "F32", {2}, x, 8), lattice::Error);   // duplicate
  // A failed write names the path and leaves nothing behind.
  const std::string bad = file("no_such_dir/out.safetensors");
  try {
    wr.write(bad);
    FAIL() << "no error";
  } catch (const lattice::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_dir/out.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(bad));
}

// add_view writes the caller's bytes where they are (no copy: what they hold at write() is written), add_f32 of
// a vector takes its values over; both write the same file as add's copies, with add's checks.
TEST_F(SafetensorsTest, WriterViewsAndMovedValuesWriteWhatCopiesWrite) {
  std::vector<float> a = {1.0f, -2.0f, 3.5f}, b = {4.0f, 5.0f};
  SafetensorsWriter copies;
  copies.add_f32("a", {3}, a.data());
  copies.add_f32("b", {2}, b.data());
  copies.write(file("copies.safetensors"));
  std::vector<float> live = {0.0f, 0.0f, 0.0f};
  SafetensorsWriter borrowed;
  borrowed.add_view("a", "F32", {3}, live.data(), 12);
  std::vector<float> moved = b;
  borrowed.add_f32("b", {2}, std::move(moved));
  EXPECT_TRUE(moved.empty()) << "the values were copied, not taken over";
  std::copy(a.begin(), a.end(), live.begin());  // in place, after add_view, before write: the view writes these
  borrowed.write(file("borrowed.safetensors"));
  EXPECT_EQ(read_bytes(file("copies.safetensors")), read_bytes(file("borrowed.safetensors")));
  EXPECT_THROW(borrowed.add_view("c", "F32", {3}, live.data(), 8), lattice::Error);  // size mismatch
  EXPECT_THROW(borrowed.add_view("a", "F32", {3}, live.data(), 12), lattice::Error);  // duplicate
  EXPECT_THROW(borrowed.add_f32("d", {3}, std::vector<float>(2)), lattice::Error);   // size mismatch
}

// cast_f32: F32 tensors to BF16 / F16 bit patterns, rounded to nearest even (ties to even,
// NaN kept, overflow named); others untouched. split: file order, at most max bytes each, a
// larger tensor alone, the metadata in every part.
TEST_F(SafetensorsTest, WriterCastsAndSplits) {
  // 1 + 2^-8 is a tie between bf16's 1 and 1 + 2^-7: to even (1); 1 + 3 x 2^-8 rounds up to 1 + 2^-6.
  const std::vector<float> w = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.5f, std::nanf(""), 70000.0f};
  const int32_t ids[2] = {7, 8};
  SafetensorsWriter wr;
  wr.add_f32("w", {5}, w.data());
  wr.add("ids", "I32", {2}, ids, 8);
  wr.set_metadata("format", "pt");
  SafetensorsWriter f16 = wr;
  wr.cast_f32("BF16");
  wr.write(file("cast.safetensors"));
  SafetensorsFile r = SafetensorsFile::read(file("cast.safetensors"));
  ASSERT_EQ(r.get("w").dtype, "BF16");
  EXPECT_EQ(r.get("ids").dtype, "I32");
  const uint8_t* b = r.get("w").bytes.data();
  auto at = [&](int i) { return uint16_t(b[2 * i] | (b[2 * i + 1] << 8)); };
  EXPECT_EQ(at(0), 0x3f80);
  EXPECT_EQ(at(1), 0x3f82);
  EXPECT_EQ(at(2), 0xc020);
  EXPECT_EQ(at(3) & 0x7f80, 0x7f80);
  EXPECT_NE(at(3) & 0x7f, 0) << "NaN kept";
  EXPECT_EQ(at(4), 0x4789);  // 70000 -> 70144
  try {
    f16.cast_f32("F16");
    FAIL() << "70000 cast to F16";
  } catch (const lattice::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor w: value 70000"), std::string::npos) << e.what();
  }
  EXPECT_THROW(f16.cast_f32("I8"), lattice::Error);

  // 40, 40, 100 and 8 bytes in parts of at most 64: [40] [40] [100] [8]; of at most 100: [40 40] [100] [8].
  for (const auto& [max, parts] : {std::pair{uint64_t(64), std::vector<std::vector<std::string>>{{"a"}, {"b"}, {"c"}, {"d"}}},
                                   std::pair{uint64_t(100), std::vector<std::vector<std::string>>{{"a", "b"}, {"c"}, {"d"}}}}) {
    std::vector<float> x(25, 1.0f);
    SafetensorsWriter s;
    s.add_f32("a", {10}, x.data());
    s.add_f32("b", {10}, x.data());
    s.add_f32("c", {25}, x.data());
    s.add_f32("d", {2}, x.data());
    s.set_metadata("format", "pt");
    EXPECT_EQ(s.data_bytes(), 188u);
    std::vector<SafetensorsWriter> got = s.split(max);
    EXPECT_EQ(s.data_bytes(), 0u) << "split leaves the writer empty";
    ASSERT_EQ(got.size(), parts.size()) << max;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].names(), parts[i]) << max << " part " << i;
      got[i].write(file("part.safetensors"));
      EXPECT_EQ(SafetensorsFile::read(file("part.safetensors")).metadata().at("format"), "pt");
    }
  }
}

// The checked-in GPT fixtures (written by tests/fixtures/make_gpt_fixture.py, an independent
// writer) parse, and hold what the whole-model test expects.
TEST(SafetensorsFixture, GptTinyFilesParse) {
  for (bool untied : {false, true}) {
    const std::string path = std::string(LATTICE_SOURCE_DIR) + "/tests/fixtures/" +
                             (untied ? "gpt_tiny_untied_tanh.safetensors" : "gpt_tiny.safetensors");
    auto f = SafetensorsFile::read(path);
    const auto& m = f.metadata();
    EXPECT_EQ(m.at("num_layers"), "2");
    EXPECT_EQ(m.at("hidden_size"), "64");
    EXPECT_EQ(m.at("padded_vocab_size"), "128");
    EXPECT_EQ(m.count("untie_embeddings_and_output_weights"), untied ? 1u : 0u);
    EXPECT_EQ(m.count("openai_gelu"), untied ? 1u : 0u);
    EXPECT_EQ(f.get("embedding.word_embeddings.weight").shape, (std::vector<int64_t>{128, 64}));
    EXPECT_EQ(f.get("decoder.layers.1.self_attention.linear_qkv.weight").shape,
              (std::vector<int64_t>{192, 64}));
    EXPECT_EQ(f.get("final.decoder.layers.1.mlp.linear_fc2.weight").shape, (std::vector<int64_t>{64, 256}));
    EXPECT_EQ(f.get("grad.decoder.final_layernorm.bias").shape, (std::vector<int64_t>{64}));
    EXPECT_EQ(f.has("output_layer.weight"), untied);
    EXPECT_EQ(f.get("tokens").shape, (std::vector<int64_t>{10, 2, 2, 17}));
    for (int32_t t : f.get_i32("tokens")) {
      EXPECT_GE(t, 0);
      EXPECT_LT(t, 100);
    }
    EXPECT_EQ(f.get("logits").shape, (std::vector<int64_t>{2, 16, 128}));
    EXPECT_EQ(f.get_f32("adam_losses").size(), 10u);
    const float loss = f.get_f32("loss").at(0);
    EXPECT_GT(loss, 4.0f);
    EXPECT_LT(loss, 5.5f);
    // 28 or 29 parameters, each stored 3 times (initial, grad., final.), + tokens logits loss adam_losses.
    EXPECT_EQ(f.names().size(), (untied ? 29u : 28u) * 3 + 4);
  }
}
