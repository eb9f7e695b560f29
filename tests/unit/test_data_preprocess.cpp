// `lattice preprocess` (run_preprocess / preprocess): jsonl -> .bin/.idx, and its errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace lattice;

namespace {

using test_util::temp_dir;

using test_util::write_text;

// Runs run_preprocess with the given flags (argv[0] = "preprocess").
int run(std::vector<std::string> args) {
  args.insert(args.begin(), "preprocess");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return run_preprocess(int(argv.size()), argv.data());
}

std::vector<int32_t> sequence(const IndexedDataset& ds, int64_t i) {
  std::vector<int32_t> out(size_t(ds.sequence_lengths()[size_t(i)]));
  ds.get(i, 0, int64_t(out.size()), out.data());
  return out;
}

std::string preprocess_error(const std::vector<std::string>& args) {
  std::vector<std::string> full = args;
  full.insert(full.begin(), "preprocess");
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(a.data());
  try {
    preprocess(parse_preprocess_args(int(argv.size()), argv.data()));
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  }
  ADD_FAILURE() << "no error";
  return "";
}

}  // namespace

TEST(DataPreprocess, ByteTokenizerWithEod) {
  const std::string d = temp_dir();
  write_text(d + "/in.jsonl",
             "{\"text\": \"ab\", \"id\": 1}\n"
             "{\"text\": \"\"}\n"                       // empty document: no sequence
             "\n"                                       // blank line: skipped
             "{\"text\": \"h\\u00e9\\n\"}\r\n"          // CRLF, escapes, UTF-8
             "{\"text\": [\"x\", \"\", \"yz\"]}\n");    // sentences: one sequence each
  ASSERT_EQ(run({"--input", d + "/in.jsonl", "--json-keys", "text", "--tokenizer-type", "ByteTokenizer",
                 "--output-prefix", d + "/out", "--append-eod", "--workers", "2"}),
            0);
  IndexedDataset ds(d + "/out_text_document");
  EXPECT_EQ(ds.dtype_code(), IndexDTypeCode::u16);
  EXPECT_EQ(ds.num_documents(), 4);
  EXPECT_EQ(ds.document_indices(), (std::vector<int64_t>{0, 1, 1, 2, 4}));
  ASSERT_EQ(ds.num_sequences(), 4);
  EXPECT_EQ(sequence(ds, 0), (std::vector<int32_t>{'a', 'b', 256}));
  EXPECT_EQ(sequence(ds, 1), (std::vector<int32_t>{'h', 0xc3, 0xa9, '\n', 256}));
  EXPECT_EQ(sequence(ds, 2), (std::vector<int32_t>{'x'}));
  EXPECT_EQ(sequence(ds, 3), (std::vector<int32_t>{'y', 'z', 256}));
  EXPECT_NO_THROW(ds.validate_token_ids(257));
  EXPECT_FALSE(fs::exists(d + "/out_text_document.bin.tmp"));
}

TEST(DataPreprocess, SeveralKeysNoEodAndWorkerCountDoesNotMatter) {
  const std::string d = temp_dir();
  std::string text;
  for (int i = 0; i < 10000; ++i)
    text += "{\"text\": \"doc " + std::to_string(i) + "\", \"title\": \"t" + std::to_string(i % 7) + "\"}\n";
  write_text(d + "/in.jsonl", text);
  for (const char* w : {"1", "3"}) {
    ASSERT_EQ(run({"--input", d + "/in.jsonl", "--json-keys", "text", "title", "--tokenizer-type", "ByteTokenizer",
                   "--output-prefix", d + "/w" + w, "--workers", w}),
              0);
  }
  for (const char* key : {"text", "title"}) {
    IndexedDataset a(d + "/w1_" + key + "_document"), b(d + "/w3_" + key + "_document");
    EXPECT_EQ(a.num_documents(), 10000);
    EXPECT_EQ(a.sequence_lengths(), b.sequence_lengths());
    EXPECT_EQ(a.document_indices(), b.document_indices());
    for (int64_t i : {int64_t(0), int64_t(4095), int64_t(4096), int64_t(9999)}) EXPECT_EQ(sequence(a, i), sequence(b, i));
  }
  IndexedDataset t(d + "/w1_text_document");
  const std::string expect = "doc 4097";
  EXPECT_EQ(sequence(t, 4097), std::vector<int32_t>(expect.begin(), expect.end()));
}

TEST(DataPreprocess, MalformedJsonNamesTheLine) {
  const std::string d = temp_dir();
  write_text(d + "/in.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"broken\n{\"text\": \"ok\"}\n");
  const std::string msg = preprocess_error(
      {"--input", d + "/in.jsonl", "--tokenizer-type", "ByteTokenizer", "--output-prefix", d + "/out"});
  EXPECT_NE(msg.find("in.jsonl line 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed JSON"), std::string::npos) << msg;
  EXPECT_EQ(run({"--input", d + "/in.jsonl", "--tokenizer-type", "ByteTokenizer", "--output-prefix", d + "/out"}), 1);
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 1) << "only in.jsonl may remain";
}

TEST(DataPreprocess, MissingKeyNamesKeyAndLine) {
  const std::string d = temp_dir();
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "{\"text\": \"x\"}\n";
  text += "{\"body\": \"x\"}\n";  // line 5001, in the second chunk
  write_text(d + "/in.jsonl", text);
  const std::string msg = preprocess_error({"--input", d + "/in.jsonl", "--json-keys", "text", "--tokenizer-type",
                                            "ByteTokenizer", "--output-prefix", d + "/out", "--workers", "2"});
  EXPECT_NE(msg.find("line 5001"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'text'"), std::string::npos) << msg;
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 1) << "only in.jsonl may remain";
}

TEST(DataPreprocess, WrongValueTypes) {
  const std::string d = temp_dir();
  write_text(d + "/a.jsonl", "{\"text\": 5}\n");
  EXPECT_NE(preprocess_error({"--input", d + "/a.jsonl", "--tokenizer-type", "ByteTokenizer", "--output-prefix",
                              d + "/out"})
                .find("line 1: key 'text' is number"),
            std::string::npos);
  write_text(d + "/b.jsonl", "[1, 2]\n");
  EXPECT_NE(preprocess_error({"--input", d + "/b.jsonl", "--tokenizer-type", "ByteTokenizer", "--output-prefix",
                              d + "/out"})
                .find("expected a JSON object"),
            std::string::npos);
}

TEST(DataPreprocess, FlagAndFileErrors) {
  const std::string d = temp_dir();
  write_text(d + "/in.jsonl", "{\"text\": \"x\"}\n");
  const std::string in = d + "/in.jsonl";
  auto has = [](const std::string& msg, const std::string& piece) {
    EXPECT_NE(msg.find(piece), std::string::npos) << "'" << piece << "' not in: " << msg;
  };
  has(preprocess_error({"--input", d + "/nope.jsonl", "--tokenizer-type", "ByteTokenizer", "--output-prefix", d + "/o"}),
      "nope.jsonl: cannot open");
  has(preprocess_error({"--input", in, "--tokenizer-type", "ByteTokenizer", "--output-prefix", d + "/o", "--bogus"}),
      "--bogus");
  has(preprocess_error({"--input", in, "--tokenizer-type", "ByteTokenizer", "--output-prefix"}),
      "--output-prefix: missing value");
  has(preprocess_error({"--input", in, "--tokenizer-type", "--output-prefix", d + "/o"}),
      "--tokenizer-type: missing value");
  has(preprocess_error({"--input", in, "--output-prefix", d + "/o"}), "--tokenizer-type is required");
  has(preprocess_error({"--input", in, "--tokenizer-type", "Nope", "--output-prefix", d + "/o"}), "--tokenizer-type");
  has(preprocess_error({"--input", in, "--tokenizer-type", "ByteTokenizer", "--output-prefix", d + "/o", "--workers",
                        "zero"}),
      "--workers");
  has(preprocess_error({"--input", in, "--tokenizer-type", "ByteTokenizer", "--output-prefix", d + "/no/such/dir/o"}),
      "no/such/dir/o_text_document.bin.tmp");
  EXPECT_EQ(run({"--input", in, "--bogus"}), 1);
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 1) << "only in.jsonl may remain";
}

TEST(DataPreprocess, ErrorKeepsPreviousOutput) {
  const std::string d = temp_dir();
  write_text(d + "/good.jsonl", "{\"text\": \"abc\"}\n");
  ASSERT_EQ(run({"--input", d + "/good.jsonl", "--tokenizer-type", "ByteTokenizer", "--output-prefix", d + "/out"}), 0);
  write_text(d + "/bad.jsonl", "{\"text\": \"abcdef\"}\nnot json\n");
  ASSERT_EQ(run({"--input", d + "/bad.jsonl", "--tokenizer-type", "ByteTokenizer", "--output-prefix", d + "/out"}), 1);
  IndexedDataset ds(d + "/out_text_document");
  EXPECT_EQ(sequence(ds, 0), (std::vector<int32_t>{'a', 'b', 'c'}));
  EXPECT_FALSE(fs::exists(d + "/out_text_document.bin.tmp"));
}
