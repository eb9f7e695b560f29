// A compiled regular expression for the pre-tokenizers of tokenizer.json (PCRE2 in UTF mode with
// Unicode properties: \p{L}, \p{N}, \s as Unicode white space, (?i:...), look-ahead), matched on
// UTF-8 bytes. Invalid UTF-8 in the text is never matched, so it lands between matches.
// One Regex may be matched from many threads at once.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;

namespace lattice {

class Regex {
 public:
  // `literal`: the pattern is a plain string. Throws lattice::Error naming `where`, the pattern and
  // what is wrong with it.
  Regex(const std::string& pattern, const std::string& where, bool literal = false);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The [start, end) byte ranges of the non-empty, non-overlapping matches in `text`, left to
  // right (each search starts where the previous match ended), appended to *out.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  pcre2_real_code_8* code_ = nullptr;
  std::string pattern_, where_;
};

}  // namespace lattice
