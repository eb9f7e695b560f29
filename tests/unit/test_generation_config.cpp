// generation_config.json's stop tokens (data/generation_config.h): the end of document first, then the
// file's eos_token_id, an id or a list, found beside the tokenizer's file or in its folder; bad files named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/generation_config.h"
#include "data/tokenizer.h"

namespace lattice {
namespace {

TEST(GenerationConfig, StopTokensAreTheEndOfDocumentAndTheEosIds) {
  const std::string dir = ::testing::TempDir() + "/lattice_generation_config_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const auto tok = make_tokenizer(TokenizerSpec{"ByteTokenizer"});  // 257 ids, the end of document 256
  auto with = [&](const std::string& text) {
    std::ofstream(dir + "/generation_config.json") << text;
    return generation_stop_tokens(*tok, dir);
  };
  EXPECT_EQ(generation_stop_tokens(*tok, ""), std::vector<int32_t>{256});
  EXPECT_EQ(generation_stop_tokens(*tok, dir), std::vector<int32_t>{256});  // no file
  EXPECT_EQ(with(R"({"eos_token_id": [10, 256, 13], "do_sample": true})"), (std::vector<int32_t>{256, 10, 13}));
  EXPECT_EQ(with(R"({"eos_token_id": 10})"), (std::vector<int32_t>{256, 10}));
  EXPECT_EQ(with(R"({"eos_token_id": null})"), std::vector<int32_t>{256});
  EXPECT_EQ(with(R"({"bos_token_id": 1})"), std::vector<int32_t>{256});
  // A tokenizer file's folder is where the file is looked for.
  with(R"({"eos_token_id": [7]})");
  EXPECT_EQ(generation_stop_tokens(*tok, dir + "/tokenizer.json"), (std::vector<int32_t>{256, 7}));
  auto error_of = [&](const std::string& text) {
    try {
      with(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string file = dir + "/generation_config.json";
  EXPECT_EQ(error_of(R"({"eos_token_id": [10, 999]})"),
            "--tokenizer-model " + file + ": eos_token_id 999 is not a token of the 257-token vocabulary");
  EXPECT_EQ(error_of(R"({"eos_token_id": "x"})"),
            "--tokenizer-model " + file + ": eos_token_id \"x\" is not a token of the 257-token vocabulary");
  EXPECT_EQ(error_of("not json"), "--tokenizer-model " + file + ": not a JSON object");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lattice
