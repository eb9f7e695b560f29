// IndexedDataset / IndexedDatasetBuilder: byte layout against megatron.md's example, round
// trip, a hand-written file read back, and every kind of corrupted input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace lattice;

namespace {

using test_util::temp_dir;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

std::vector<uint8_t> from_hex(const std::string& text) {
  std::vector<uint8_t> out;
  std::string digits;
  for (char c : text)
    if (std::isxdigit(static_cast<unsigned char>(c))) digits.push_back(c);
  for (size_t i = 0; i + 1 < digits.size(); i += 2) out.push_back(uint8_t(std::stoi(digits.substr(i, 2), nullptr, 16)));
  return out;
}

// megatron.md: uint16; documents [10,11,12][13,0] | [20,21,22,23,0] | [30,0].
const char* kSpecIdxHex =
    "4d4d494449445800 00 | 0100000000000000 | 08 | 0400000000000000 | 0400000000000000 |"
    "03000000 02000000 05000000 02000000 |"
    "0000000000000000 0600000000000000 0a00000000000000 1400000000000000 |"
    "0000000000000000 0200000000000000 0300000000000000 0400000000000000";

const std::vector<std::vector<std::vector<int32_t>>> kSpecDocs = {
    {{10, 11, 12}, {13, 0}}, {{20, 21, 22, 23, 0}}, {{30, 0}}};

void write_spec_example(const std::string& prefix) {
  IndexedDatasetBuilder b(prefix, IndexDTypeCode::u16);
  for (const auto& doc : kSpecDocs) {
    for (const auto& seq : doc) b.add_item(seq.data(), int64_t(seq.size()));
    b.end_document();
  }
  b.finalize();
}

// Runs fn, expects a one-line lattice::Error containing every piece.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& pieces) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

void put_u64(std::vector<uint8_t>& b, size_t at, uint64_t v) { std::memcpy(b.data() + at, &v, 8); }

}  // namespace

TEST(DataIndexedDataset, SpecExampleIsByteExact) {
  const std::string p = temp_dir() + "/ex";
  write_spec_example(p);
  const std::vector<uint8_t> idx = read_bytes(p + ".idx");
  ASSERT_EQ(idx.size(), 114u);
  EXPECT_EQ(idx, from_hex(kSpecIdxHex));
  const std::vector<uint8_t> bin = read_bytes(p + ".bin");
  std::vector<uint8_t> expect_bin;
  for (int t : {10, 11, 12, 13, 0, 20, 21, 22, 23, 0, 30, 0}) expect_bin.push_back(uint8_t(t)), expect_bin.push_back(0);
  EXPECT_EQ(bin, expect_bin);
  EXPECT_FALSE(fs::exists(p + ".bin.tmp"));
  EXPECT_FALSE(fs::exists(p + ".idx.tmp"));
}

TEST(DataIndexedDataset, SpecExampleReadsBack) {
  const std::string p = temp_dir() + "/ex";
  write_bytes(p + ".idx", from_hex(kSpecIdxHex));
  std::vector<uint8_t> bin;
  for (int t : {10, 11, 12, 13, 0, 20, 21, 22, 23, 0, 30, 0}) bin.push_back(uint8_t(t)), bin.push_back(0);
  write_bytes(p + ".bin", bin);
  IndexedDataset ds(p);
  EXPECT_EQ(ds.dtype_code(), IndexDTypeCode::u16);
  EXPECT_EQ(ds.token_bytes(), 2u);
  EXPECT_EQ(ds.num_sequences(), 4);
  EXPECT_EQ(ds.num_documents(), 3);
  EXPECT_EQ(ds.num_tokens(), 12);
  EXPECT_EQ(ds.sequence_lengths(), (std::vector<int32_t>{3, 2, 5, 2}));
  EXPECT_EQ(ds.sequence_offsets(), (std::vector<int64_t>{0, 6, 10, 20}));
  EXPECT_EQ(ds.document_indices(), (std::vector<int64_t>{0, 2, 3, 4}));
  std::vector<int32_t> out(5);
  ds.get(2, 0, 5, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{20, 21, 22, 23, 0}));
  ds.get(0, 1, 2, out.data());
  EXPECT_EQ(out[0], 11);
  EXPECT_EQ(out[1], 12);
  EXPECT_NO_THROW(ds.validate_token_ids(31));
}

TEST(DataIndexedDataset, RoundTripInt32AndLargeIds) {
  const std::string p = temp_dir() + "/big";
  std::vector<std::vector<int32_t>> seqs = {{100000, 5, 70000}, {}, {1}, {65535, 65536, 2000000000}};
  {
    IndexedDatasetBuilder b(p, index_dtype_for_vocab(100352));
    for (const auto& s : seqs) {
      b.add_item(s.data(), int64_t(s.size()));
      b.end_document();
    }
    b.finalize();
  }
  IndexedDataset ds(p);
  EXPECT_EQ(ds.dtype_code(), IndexDTypeCode::i32);
  EXPECT_EQ(ds.num_sequences(), 4);
  EXPECT_EQ(ds.num_documents(), 4);
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::vector<int32_t> out(seqs[i].size());
    ds.get(int64_t(i), 0, int64_t(out.size()), out.data());
    EXPECT_EQ(out, seqs[i]) << "sequence " << i;
  }
  EXPECT_EQ(index_dtype_for_vocab(257), IndexDTypeCode::u16);
  EXPECT_EQ(index_dtype_for_vocab(65499), IndexDTypeCode::u16);
  EXPECT_EQ(index_dtype_for_vocab(65500), IndexDTypeCode::i32);
}

TEST(DataIndexedDataset, RoundTripSeveralSequencesPerDocumentAndUnendedLastDocument) {
  const std::string p = temp_dir() + "/docs";
  {
    IndexedDatasetBuilder b(p, IndexDTypeCode::u16);
    const int32_t a[] = {1, 2}, c[] = {3}, d[] = {4, 5, 6};
    b.add_item(a, 2);
    b.add_item(c, 1);
    b.end_document();
    b.end_document();  // an empty document, as Megatron writes for an empty jsonl text
    b.add_item(d, 3);  // finalize() closes this last document
    b.finalize();
  }
  IndexedDataset ds(p);
  EXPECT_EQ(ds.document_indices(), (std::vector<int64_t>{0, 2, 2, 3}));
  EXPECT_EQ(ds.num_documents(), 3);
  EXPECT_EQ(ds.num_tokens(), 6);
}

TEST(DataIndexedDataset, HandWrittenInt32FileIsRead) {
  // An independent writer: the bytes of a 2-document int32 dataset laid out by hand.
  const std::string p = temp_dir() + "/hand";
  std::vector<uint8_t> idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  auto le = [&idx](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) idx.push_back(uint8_t(v >> (8 * i)));
  };
  le(1, 8);                      // version
  le(4, 1);                      // int32
  le(3, 8);                      // 3 sequences
  le(3, 8);                      // 2 documents + 1
  le(2, 4), le(1, 4), le(3, 4);  // lengths
  le(0, 8), le(8, 8), le(12, 8); // byte offsets
  le(0, 8), le(1, 8), le(3, 8);  // document indices
  write_bytes(p + ".idx", idx);
  std::vector<uint8_t> bin;
  for (uint32_t t : {7u, 300000u, 9u, 1u, 2u, 3u})
    for (int i = 0; i < 4; ++i) bin.push_back(uint8_t(t >> (8 * i)));
  write_bytes(p + ".bin", bin);

  IndexedDataset ds(p);
  EXPECT_EQ(ds.dtype_code(), IndexDTypeCode::i32);
  EXPECT_EQ(ds.num_documents(), 2);
  std::vector<int32_t> out(3);
  ds.get(0, 0, 2, out.data());
  EXPECT_EQ(out[0], 7);
  EXPECT_EQ(out[1], 300000);
  ds.get(2, 0, 3, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_NO_THROW(ds.validate_token_ids(300001));
  expect_error([&] { ds.validate_token_ids(300000); }, {"hand.bin", "sequence 0", "300000", "vocab"});
}

TEST(DataIndexedDataset, BuilderLeavesNothingWithoutFinalize) {
  const std::string dir = temp_dir();
  {
    IndexedDatasetBuilder b(dir + "/x", IndexDTypeCode::u16);
    const int32_t t[] = {1, 2, 3};
    b.add_item(t, 3);
  }
  EXPECT_TRUE(fs::is_empty(dir));
  {
    IndexedDatasetBuilder b(dir + "/y", IndexDTypeCode::u16);
    const int32_t t[] = {70000};
    expect_error([&] { b.add_item(t, 1); }, {"y.bin", "70000", "uint16"});
  }
  EXPECT_TRUE(fs::is_empty(dir));
  expect_error([&] { IndexedDatasetBuilder b(dir + "/missing/z", IndexDTypeCode::u16); }, {"missing/z.bin.tmp"});
}

TEST(DataIndexedDataset, MissingFiles) {
  const std::string dir = temp_dir();
  expect_error([&] { IndexedDataset ds(dir + "/none"); }, {"none.idx", "cannot open"});
  write_spec_example(dir + "/ex");
  fs::remove(dir + "/ex.bin");
  expect_error([&] { IndexedDataset ds(dir + "/ex"); }, {"ex.bin", "cannot open"});
}

class DataIndexedDatasetCorrupt : public ::testing::Test {
 protected:
  void SetUp() override {
    p_ = temp_dir() + "/ex";
    write_spec_example(p_);
    idx_ = read_bytes(p_ + ".idx");
    bin_ = read_bytes(p_ + ".bin");
  }
  void expect_open_error(const std::vector<std::string>& pieces) {
    write_bytes(p_ + ".idx", idx_);
    write_bytes(p_ + ".bin", bin_);
    expect_error([&] { IndexedDataset ds(p_); }, pieces);
  }
  std::string p_;
  std::vector<uint8_t> idx_, bin_;
};

TEST_F(DataIndexedDatasetCorrupt, WrongMagic) {
  idx_[0] = 'X';
  expect_open_error({"ex.idx", "wrong magic"});
}

TEST_F(DataIndexedDatasetCorrupt, NotAnIndexAtAll) {
  idx_ = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '\n'};
  expect_open_error({"ex.idx", "wrong magic"});
}

TEST_F(DataIndexedDatasetCorrupt, WrongVersion) {
  idx_[9] = 2;
  expect_open_error({"ex.idx", "version 2"});
}

TEST_F(DataIndexedDatasetCorrupt, UnknownDtypeCode) {
  idx_[17] = 9;
  expect_open_error({"ex.idx", "dtype code 9"});
}

TEST_F(DataIndexedDatasetCorrupt, FloatDtype) {
  idx_[17] = 7;
  expect_open_error({"ex.idx", "float32"});
}

TEST_F(DataIndexedDatasetCorrupt, TruncatedIdx) {
  idx_.resize(100);
  expect_open_error({"ex.idx", "truncated", "114", "100"});
}

TEST_F(DataIndexedDatasetCorrupt, TruncatedIdxHeader) {
  idx_.resize(20);
  expect_open_error({"ex.idx", "truncated", "20"});
}

TEST_F(DataIndexedDatasetCorrupt, EmptyIdx) {
  idx_.clear();
  expect_open_error({"ex.idx", "truncated", "has 0"});
}

TEST_F(DataIndexedDatasetCorrupt, HugeSequenceCount) {
  put_u64(idx_, 18, ~uint64_t(0));
  expect_open_error({"ex.idx", "truncated"});
}

TEST_F(DataIndexedDatasetCorrupt, TrailingBytes) {
  idx_.push_back(0);
  expect_open_error({"ex.idx", "1 unexpected bytes"});
}

TEST_F(DataIndexedDatasetCorrupt, TruncatedBin) {
  bin_.resize(20);
  expect_open_error({"ex.bin", "truncated", "index needs 24 bytes", "file has 20"});
}

TEST_F(DataIndexedDatasetCorrupt, OffsetPastEndOfBin) {
  put_u64(idx_, 34 + 16 + 8 * 3, 1000);  // offset of sequence 3
  expect_open_error({"ex.bin", "truncated", "1004", "sequence 3"});
}

TEST_F(DataIndexedDatasetCorrupt, NegativeLength) {
  const int32_t neg = -1;
  std::memcpy(idx_.data() + 34 + 4, &neg, 4);
  expect_open_error({"ex.idx", "sequence 1", "negative length"});
}

TEST_F(DataIndexedDatasetCorrupt, DocumentIndicesDecrease) {
  put_u64(idx_, 34 + 48 + 16, 1);  // document indices 0 2 1 4
  expect_open_error({"ex.idx", "document indices decrease"});
}

TEST_F(DataIndexedDatasetCorrupt, DocumentIndexPastSequences) {
  put_u64(idx_, 34 + 48 + 24, 5);  // last document index 5 > 4 sequences
  expect_open_error({"ex.idx", "last document index is 5"});
}

TEST_F(DataIndexedDatasetCorrupt, FirstDocumentIndexNotZero) {
  put_u64(idx_, 34 + 48, 1);
  expect_open_error({"ex.idx", "document index 0 is 1"});
}

TEST_F(DataIndexedDatasetCorrupt, TokenIdOutOfVocab) {
  IndexedDataset ds(p_);
  expect_error([&] { ds.validate_token_ids(30); }, {"ex.bin", "sequence 3", "token id 30", "vocab size 30"});
  EXPECT_NO_THROW(ds.validate_token_ids(31));
}
