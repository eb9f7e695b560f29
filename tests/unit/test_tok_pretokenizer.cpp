// GPT-2 pre-tokenisation (gpt2_piece_end) against the regex itself: the expected pieces were
// produced by node's regex engine running GPT-2's pattern with \s as \p{White_Space}:
//   /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\p{White_Space}\p{L}\p{N}]+|
//    \p{White_Space}+(?!\P{White_Space})|\p{White_Space}+/gu      (String.prototype.match)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/gpt2_pretokenizer.h"

using namespace lattice;

namespace {

std::vector<std::string> pieces(const std::string& text) {
  std::vector<std::string> out;
  for (size_t pos = 0, end = 0; pos < text.size(); pos = end) {
    end = gpt2_piece_end(text, pos);
    EXPECT_GT(end, pos);
    out.push_back(text.substr(pos, end - pos));
  }
  return out;
}

using P = std::vector<std::string>;

}  // namespace

TEST(TokPretokenizer, WordsPunctuationAndContractions) {
  EXPECT_EQ(pieces("Hello world, this is a test."), (P{"Hello", " world", ",", " this", " is", " a", " test", "."}));
  EXPECT_EQ(pieces("I'm can't we'll they've she'd it's you're"),
            (P{"I", "'m", " can", "'t", " we", "'ll", " they", "'ve", " she", "'d", " it", "'s", " you", "'re"}));
  EXPECT_EQ(pieces("'''s 's ''ll"), (P{"'''", "s", " '", "s", " ''", "ll"}));
  EXPECT_EQ(pieces("ABC'S"), (P{"ABC", "'", "S"}));  // contractions are lower case only
  EXPECT_EQ(pieces("don't!?"), (P{"don", "'t", "!?"}));
  EXPECT_EQ(pieces("'"), (P{"'"}));
}

TEST(TokPretokenizer, WhiteSpaceRuns) {
  EXPECT_EQ(pieces("   leading and trailing   "), (P{"  ", " leading", " and", " trailing", "   "}));
  EXPECT_EQ(pieces("a\n\nb"), (P{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces("a\n\n"), (P{"a", "\n\n"}));
  EXPECT_EQ(pieces("x \t\ny"), (P{"x", " \t", "\n", "y"}));
  EXPECT_EQ(pieces("x\r\ny"), (P{"x", "\r", "\n", "y"}));
  EXPECT_EQ(pieces("tab\tsep"), (P{"tab", "\t", "sep"}));
  EXPECT_EQ(pieces(" "), (P{" "}));
  EXPECT_EQ(pieces("\n"), (P{"\n"}));
}

TEST(TokPretokenizer, NumbersAndUnicode) {
  EXPECT_EQ(pieces("3.14159 + 42,000"), (P{"3", ".", "14159", " +", " 42", ",", "000"}));
  EXPECT_EQ(pieces("1234567"), (P{"1234567"}));
  EXPECT_EQ(pieces("na\u00efve caf\u00e9 \u65e5\u672c\u8a9e"), (P{"na\u00efve", " caf\u00e9", " \u65e5\u672c\u8a9e"}));
  EXPECT_EQ(pieces("emoji \U0001F44D\U0001F3FD ok!!"), (P{"emoji", " \U0001F44D\U0001F3FD", " ok", "!!"}));
  // Ideographic and no-break spaces are white space; the run gives up its last character.
  EXPECT_EQ(pieces("  \u3000\u3000x"), (P{"  \u3000", "\u3000", "x"}));
  EXPECT_EQ(pieces("a\u00a0\u00a0b"), (P{"a", "\u00a0", "\u00a0", "b"}));
  EXPECT_EQ(pieces("a \u0085b"), (P{"a", " ", "\u0085", "b"}));  // NEL is White_Space (as in tiktoken)
}

TEST(TokPretokenizer, InvalidUtf8IsCoveredByteForByte) {
  const std::string bad = std::string("ab\xff\xfe cd\xc3") + "\xe2\x82" + " \xed\xa0\x80x";  // stray, truncated, surrogate
  std::string joined;
  for (const std::string& p : pieces(bad)) joined += p;
  EXPECT_EQ(joined, bad);
  EXPECT_EQ(pieces("ab\xff\xfe"), (P{"ab", "\xff\xfe"}));  // invalid bytes group as "other" symbols
}

TEST(TokPretokenizer, UnicodeClasses) {
  EXPECT_EQ(unicode_class('a'), CharClass::kLetter);
  EXPECT_EQ(unicode_class('7'), CharClass::kNumber);
  EXPECT_EQ(unicode_class(' '), CharClass::kSpace);
  EXPECT_EQ(unicode_class('!'), CharClass::kOther);
  EXPECT_EQ(unicode_class(0x00BD), CharClass::kNumber);   // VULGAR FRACTION ONE HALF (No)
  EXPECT_EQ(unicode_class(0x216B), CharClass::kNumber);   // ROMAN NUMERAL TWELVE (Nl)
  EXPECT_EQ(unicode_class(0x0661), CharClass::kNumber);   // ARABIC-INDIC DIGIT ONE
  EXPECT_EQ(unicode_class(0x4E00), CharClass::kLetter);   // CJK ideograph
  EXPECT_EQ(unicode_class(0x1D400), CharClass::kLetter);  // MATHEMATICAL BOLD CAPITAL A (beyond the BMP)
  EXPECT_EQ(unicode_class(0x1F44D), CharClass::kOther);   // emoji
  EXPECT_EQ(unicode_class(0x2028), CharClass::kSpace);    // LINE SEPARATOR
  EXPECT_EQ(unicode_class(0x200B), CharClass::kOther);    // ZERO WIDTH SPACE is not White_Space
  EXPECT_EQ(unicode_class(0xFEFF), CharClass::kOther);    // BOM is not White_Space
  EXPECT_EQ(unicode_class(0x10FFFF), CharClass::kOther);
}
