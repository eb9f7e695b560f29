// NullTokenizer (Megatron's, for text that is already token ids): white-space separated ids
// 0..N-1 of --vocab-size N, N the end of document; errors name the word and the flag.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/tokenizer.h"
#include "test_util.h"

using namespace lattice;
using lattice::test_util::error_of;

TEST(TokNull, IdsSeparatedByWhiteSpace) {
  const auto tok = make_tokenizer({"NullTokenizer", "", "", "", 10});
  EXPECT_EQ(tok->vocab_size(), 11);
  EXPECT_EQ(tok->eod(), 10);
  EXPECT_EQ(tok->encode(" 3 1\t4\n\n1 5 10 "), (std::vector<int32_t>{3, 1, 4, 1, 5, 10}));
  EXPECT_TRUE(tok->encode(" \n").empty());
  EXPECT_EQ(tok->decode({3, 1, 4, 10}), "3 1 4 10");
  EXPECT_EQ(tok->encode(tok->decode({9, 0, 7})), (std::vector<int32_t>{9, 0, 7}));
}

TEST(TokNull, WordsThatAreNotIdsNameThemselves) {
  const auto tok = make_tokenizer({"NullTokenizer", "", "", "", 10});
  for (const char* bad : {"11", "-1", "1.5", "x", "3a", "99999999999999999999"}) {
    const std::string msg = error_of([&] { tok->encode(std::string("1 ") + bad + " 2"); });
    EXPECT_NE(msg.find(std::string("'") + bad), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("0..10"), std::string::npos) << msg;
  }
}

TEST(TokNull, NeedsVocabSizeAndNoFiles) {
  EXPECT_NE(error_of([] { make_tokenizer({"NullTokenizer", "", "", "", 0}); }).find("--vocab-size"), std::string::npos);
  EXPECT_NE(error_of([] { make_tokenizer({"NullTokenizer", "v.json", "", "", 5}); }).find("--vocab-file"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_tokenizer({"NullTokenizer", "", "", "tok.json", 5}); }).find("--tokenizer-model"),
            std::string::npos);
}
