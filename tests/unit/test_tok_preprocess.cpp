// `lattice preprocess` streaming (chunks, workers, .gz), bad lines, empty documents, and
// `lattice merge-datasets`. Byte-level tokenizer throughout, so no downloaded files are needed.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/merge_datasets.h"
#include "data/preprocess.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace lattice;

namespace {

using test_util::temp_dir;

using test_util::write_text;

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f) << path;
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_gz(const std::string& path, const std::string& text) {
  gzFile g = gzopen(path.c_str(), "wb");
  ASSERT_NE(g, nullptr);
  ASSERT_EQ(gzwrite(g, text.data(), unsigned(text.size())), int(text.size()));
  ASSERT_EQ(gzclose(g), Z_OK);
}

PreprocessOptions options(const std::string& input, const std::string& prefix) {
  PreprocessOptions o;
  o.input = input;
  o.json_keys = {"text"};
  o.tokenizer_type = "ByteTokenizer";
  o.output_prefix = prefix;
  o.append_eod = true;
  o.progress = false;
  return o;
}

std::string error_of(const PreprocessOptions& o) {
  try {
    preprocess(o);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  }
  ADD_FAILURE() << "no error";
  return "";
}

// A jsonl with documents of very different sizes, blank and CRLF lines, and no final newline.
std::string varied_jsonl() {
  std::string s;
  for (int i = 0; i < 400; ++i) {
    std::string text(size_t(i * 37 % 900), char('a' + i % 26));
    if (i % 50 == 7) text = std::string(5000, 'L');  // longer than a small chunk
    s += "{\"text\": \"" + text + "\", \"n\": " + std::to_string(i) + "}" + (i % 13 == 0 ? "\r\n" : "\n");
    if (i % 97 == 0) s += "\n   \n";
  }
  return s + "{\"text\": \"last line without newline\"}";
}

#define EXPECT_HAS(msg, piece) EXPECT_NE((msg).find(piece), std::string::npos) << "'" << (piece) << "' not in: " << (msg)

}  // namespace

TEST(TokPreprocess, ChunkSizeWorkersAndGzipDoNotChangeTheBytes) {
  const std::string d = temp_dir();
  const std::string text = varied_jsonl();
  write_text(d + "/in.jsonl", text);
  write_gz(d + "/in.jsonl.gz", text);
  PreprocessOptions ref = options(d + "/in.jsonl", d + "/ref");
  const PreprocessStats s = preprocess(ref);
  EXPECT_EQ(s.documents, 401);
  EXPECT_EQ(s.input_bytes, int64_t(text.size()));
  const std::string bin = read_bytes(d + "/ref_text_document.bin"), idx = read_bytes(d + "/ref_text_document.idx");
  struct Variant {
    const char* name;
    std::string input;
    int workers;
    size_t chunk;
  };
  for (const Variant& v : {Variant{"w3", d + "/in.jsonl", 3, size_t(1) << 20}, Variant{"small1", d + "/in.jsonl", 1, 64},
                           Variant{"small4", d + "/in.jsonl", 4, 300}, Variant{"gz", d + "/in.jsonl.gz", 2, 1000}}) {
    PreprocessOptions o = options(v.input, d + "/" + v.name);
    o.workers = v.workers;
    o.chunk_bytes = v.chunk;
    preprocess(o);
    EXPECT_EQ(read_bytes(d + "/" + v.name + "_text_document.bin"), bin) << v.name;
    EXPECT_EQ(read_bytes(d + "/" + v.name + "_text_document.idx"), idx) << v.name;
  }
  IndexedDataset ds(d + "/ref_text_document");
  EXPECT_EQ(ds.num_documents(), 401);
  std::vector<int32_t> last(size_t(ds.sequence_lengths().back()));
  ds.get(ds.num_sequences() - 1, 0, int64_t(last.size()), last.data());
  EXPECT_EQ(std::string(last.begin(), last.end() - 1), "last line without newline");
  EXPECT_EQ(last.back(), 256);
}

TEST(TokPreprocess, EmptyDocumentsEndADocumentWithoutTokens) {
  const std::string d = temp_dir();
  write_text(d + "/in.jsonl", "{\"text\": \"ab\"}\n{\"text\": \"\"}\n{\"text\": []}\n{\"text\": [\"\", \"\"]}\n{\"text\": \"c\"}\n");
  const PreprocessStats s = preprocess(options(d + "/in.jsonl", d + "/out"));
  EXPECT_EQ(s.documents, 5);
  EXPECT_EQ(s.empty_documents, 3);
  IndexedDataset ds(d + "/out_text_document");
  EXPECT_EQ(ds.document_indices(), (std::vector<int64_t>{0, 1, 1, 1, 1, 2}));
  EXPECT_EQ(ds.sequence_lengths(), (std::vector<int32_t>{3, 2}));  // no EOD for the empty ones
}

TEST(TokPreprocess, BadLinesAreErrorsNamingTheLine) {
  const std::string d = temp_dir();
  const std::string good = "{\"text\": \"ok\"}\n";
  struct Case {
    std::string line, message;
  };
  const std::vector<Case> cases = {
      {"{\"text\": \"broken\n", "line 3: malformed JSON"},
      {"{\"text\": \"caf\xe9\"}\n", "line 3: invalid UTF-8"},            // Latin-1, not UTF-8
      {"{\"text\": \"\\ud800\"}\n", "line 3: invalid \\u escape"},        // lone surrogate
      {"{\"body\": \"x\"}\n", "line 3: missing key 'text'"},
      {"{\"text\": {\"a\": 1}}\n", "line 3: key 'text' is object"},
      {"\"just a string\"\n", "line 3: expected a JSON object, got string"},
  };
  for (const Case& c : cases) {
    write_text(d + "/in.jsonl", good + good + c.line + good);
    const std::string msg = error_of(options(d + "/in.jsonl", d + "/out"));
    EXPECT_HAS(msg, d + "/in.jsonl " + c.message);
    EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 1) << "only in.jsonl may remain";
  }
}

TEST(TokPreprocess, FirstBadLineIsReportedWhateverTheWorkers) {
  const std::string d = temp_dir();
  std::string text;
  for (int i = 1; i <= 3000; ++i) text += (i == 1234 || i == 2500) ? "nope\n" : "{\"text\": \"line\"}\n";
  write_text(d + "/in.jsonl", text);
  for (int workers : {1, 4}) {
    PreprocessOptions o = options(d + "/in.jsonl", d + "/out");
    o.workers = workers;
    o.chunk_bytes = 200;
    EXPECT_HAS(error_of(o), "in.jsonl line 1234: malformed JSON");
  }
}

TEST(TokPreprocess, SkipBadLinesCountsAndSkips) {
  const std::string d = temp_dir();
  write_text(d + "/in.jsonl",
             "{\"text\": \"a\"}\nnot json\n{\"text\": \"b\"}\n{\"x\": 1}\n{\"text\": \"\xff\"}\n{\"text\": \"c\"}\n");
  PreprocessOptions o = options(d + "/in.jsonl", d + "/out");
  o.skip_bad_lines = true;
  o.workers = 2;
  o.chunk_bytes = 16;
  const PreprocessStats s = preprocess(o);
  EXPECT_EQ(s.documents, 3);
  EXPECT_EQ(s.bad_lines, 3);
  EXPECT_HAS(s.first_bad_line, "in.jsonl line 2: malformed JSON");
  IndexedDataset ds(d + "/out_text_document");
  EXPECT_EQ(ds.num_documents(), 3);
  EXPECT_EQ(ds.sequence_lengths(), (std::vector<int32_t>{2, 2, 2}));
}

TEST(TokPreprocess, FileErrors) {
  const std::string d = temp_dir();
  write_text(d + "/in.jsonl", "{\"text\": \"x\"}\n");
  PreprocessOptions o = options(d + "/in.jsonl", d + "/out");
  o.tokenizer_type = "GPT2BPETokenizer";
  o.vocab_file = d + "/missing-vocab.json";
  o.merge_file = d + "/missing-merges.txt";
  EXPECT_HAS(error_of(o), "--vocab-file " + d + "/missing-vocab.json: cannot open");
  o.vocab_file = "";
  EXPECT_HAS(error_of(o), "--vocab-file is required");
  // A .gz file cut short.
  std::string big;
  for (int i = 0; i < 2000; ++i) big += "{\"text\": \"document number " + std::to_string(i) + "\"}\n";
  write_gz(d + "/full.jsonl.gz", big);
  const std::string gz = read_bytes(d + "/full.jsonl.gz");
  write_text(d + "/cut.jsonl.gz", gz.substr(0, gz.size() / 2));
  EXPECT_HAS(error_of(options(d + "/cut.jsonl.gz", d + "/out")), "cut.jsonl.gz: compressed data ends early");
  EXPECT_FALSE(fs::exists(d + "/out_text_document.bin"));
  EXPECT_FALSE(fs::exists(d + "/out_text_document.bin.tmp"));
}

TEST(TokPreprocess, FlagsOfTheIssue) {
  std::vector<std::string> args = {"preprocess", "--input", "f.jsonl", "--json-keys", "text", "title",
                                   "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "v.json", "--merge-file",
                                   "m.txt", "--output-prefix", "P", "--append-eod", "--workers", "3",
                                   "--keep-newlines", "--skip-bad-lines", "--no-progress"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  const PreprocessOptions o = parse_preprocess_args(int(argv.size()), argv.data());
  EXPECT_EQ(o.json_keys, (std::vector<std::string>{"text", "title"}));
  EXPECT_EQ(o.workers, 3);
  EXPECT_TRUE(o.append_eod && o.keep_newlines && o.skip_bad_lines && !o.progress);
  EXPECT_EQ(o.vocab_file, "v.json");
  EXPECT_EQ(o.merge_file, "m.txt");
}

TEST(TokMergeDatasets, MergeEqualsPreprocessingTheConcatenation) {
  const std::string d = temp_dir();
  const std::string a = "{\"text\": \"first\"}\n{\"text\": \"\"}\n{\"text\": [\"x\", \"yz\"]}\n";
  const std::string b = "{\"text\": \"second file\"}\n";
  write_text(d + "/a.jsonl", a);
  write_text(d + "/b.jsonl", b);
  write_text(d + "/ab.jsonl", a + b + a);
  fs::create_directories(d + "/parts");
  preprocess(options(d + "/a.jsonl", d + "/parts/a"));
  preprocess(options(d + "/b.jsonl", d + "/parts/b"));
  preprocess(options(d + "/ab.jsonl", d + "/ab"));
  const std::string pa = d + "/parts/a_text_document", pb = d + "/parts/b_text_document";
  const MergeStats s = merge_datasets({pa, pb, pa}, d + "/merged");
  EXPECT_EQ(s.datasets, 3);
  EXPECT_EQ(s.documents, 7);
  EXPECT_EQ(read_bytes(d + "/merged.bin"), read_bytes(d + "/ab_text_document.bin"));
  EXPECT_EQ(read_bytes(d + "/merged.idx"), read_bytes(d + "/ab_text_document.idx"));
  // Megatron's form: a directory, its prefixes by name.
  EXPECT_EQ(merge_input_prefixes({d + "/parts"}), (std::vector<std::string>{pa, pb}));
}

TEST(TokMergeDatasets, Errors) {
  const std::string d = temp_dir();
  write_text(d + "/a.jsonl", "{\"text\": \"a\"}\n");
  preprocess(options(d + "/a.jsonl", d + "/a"));
  {
    IndexedDatasetBuilder wide(d + "/wide", IndexDTypeCode::i32);
    const int32_t t[2] = {70000, 1};
    wide.add_item(t, 2);
    wide.end_document();
    wide.finalize();
  }
  try {
    merge_datasets({d + "/a_text_document", d + "/wide"}, d + "/m");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "--input " + d + "/wide: token dtype code 4 differs");
  }
  try {
    merge_datasets({d + "/a_text_document", d + "/nope"}, d + "/m");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), d + "/nope");
  }
  EXPECT_FALSE(fs::exists(d + "/m.bin"));
  EXPECT_FALSE(fs::exists(d + "/m.bin.tmp"));
}
