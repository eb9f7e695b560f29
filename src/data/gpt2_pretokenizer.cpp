// GPT-2's pre-tokenisation regex, by hand (see gpt2_pretokenizer.h).
#include "data/gpt2_pretokenizer.h"

#include <algorithm>
#include <array>
#include <vector>

namespace lattice {

namespace {

struct ClassRange {
  uint32_t first, last;
  CharClass cls;
};

constexpr CharClass kOther = CharClass::kOther, kLetter = CharClass::kLetter, kNumber = CharClass::kNumber,
                    kSpace = CharClass::kSpace;

constexpr ClassRange kRanges[] = {
#include "data/unicode_categories.inc"
};

CharClass lookup_ranges(uint32_t cp) {
  const ClassRange* end = std::end(kRanges);
  const ClassRange* it = std::upper_bound(std::begin(kRanges), end, cp,
                                          [](uint32_t c, const ClassRange& r) { return c < r.first; });
  if (it == std::begin(kRanges)) return kOther;
  --it;
  return cp <= it->last ? it->cls : kOther;
}

// The Basic Multilingual Plane as a flat table: nearly all text lives there, and one load beats
// a binary search over ~800 ranges.
const std::vector<CharClass>& bmp_table() {
  static const std::vector<CharClass> table = [] {
    std::vector<CharClass> t(0x10000, kOther);
    for (const ClassRange& r : kRanges)
      for (uint32_t c = r.first; c <= r.last && c < 0x10000; ++c) t[c] = r.cls;
    return t;
  }();
  return table;
}

// ASCII classes, the hot path.
constexpr std::array<CharClass, 128> kAscii = [] {
  std::array<CharClass, 128> t{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) t[c] = kLetter;
    else if (c >= '0' && c <= '9') t[c] = kNumber;
    else if (c == ' ' || (c >= '\t' && c <= '\r')) t[c] = kSpace;
    else t[c] = kOther;
  }
  return t;
}();

inline bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

// Decodes one UTF-8 character; returns its length (0 for an invalid sequence) and sets *cp.
inline size_t decode_utf8(const unsigned char* s, size_t avail, uint32_t* cp) {
  const unsigned char b0 = s[0];
  if (b0 < 0xC2 || b0 > 0xF4) return 0;  // continuation byte, overlong lead or out of range
  if (b0 < 0xE0) {
    if (avail < 2 || !is_cont(s[1])) return 0;
    *cp = (uint32_t(b0 & 0x1F) << 6) | (s[1] & 0x3F);
    return 2;
  }
  if (b0 < 0xF0) {
    if (avail < 3 || !is_cont(s[1]) || !is_cont(s[2])) return 0;
    const uint32_t c = (uint32_t(b0 & 0x0F) << 12) | (uint32_t(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    if (c < 0x800 || (c >= 0xD800 && c <= 0xDFFF)) return 0;  // overlong or a surrogate
    *cp = c;
    return 3;
  }
  if (avail < 4 || !is_cont(s[1]) || !is_cont(s[2]) || !is_cont(s[3])) return 0;
  const uint32_t c = (uint32_t(b0 & 0x07) << 18) | (uint32_t(s[1] & 0x3F) << 12) | (uint32_t(s[2] & 0x3F) << 6) |
                     (s[3] & 0x3F);
  if (c < 0x10000 || c > 0x10FFFF) return 0;
  *cp = c;
  return 4;
}

// 's 't 're 've 'm 'll 'd at text[pos] (text[pos] == '\''): the length matched, or 0.
inline size_t contraction_len(std::string_view text, size_t pos) {
  const size_t left = text.size() - pos;
  if (left >= 2) {
    const char a = text[pos + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (left >= 3) {
      const char b = text[pos + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
  }
  return 0;
}

// End of the run of characters of class `cls` that starts at pos.
inline size_t run_end(std::string_view text, size_t pos, CharClass cls) {
  size_t len = 0;
  while (pos < text.size() && char_class_at(text, pos, &len) == cls) pos += len;
  return pos;
}

}  // namespace

CharClass unicode_class(uint32_t cp) {
  if (cp < 128) return kAscii[cp];
  if (cp < 0x10000) return bmp_table()[cp];
  return lookup_ranges(cp);
}

CharClass char_class_at(std::string_view text, size_t pos, size_t* len) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  if (s[0] < 128) {
    *len = 1;
    return kAscii[s[0]];
  }
  uint32_t cp = 0;
  const size_t n = decode_utf8(s, text.size() - pos, &cp);
  if (n == 0) {
    *len = 1;
    return kOther;
  }
  *len = n;
  return unicode_class(cp);
}

size_t gpt2_piece_end(std::string_view text, size_t pos) {
  const size_t n = text.size();
  if (text[pos] == '\'') {
    if (const size_t c = contraction_len(text, pos)) return pos + c;
  }
  size_t len = 0;
  CharClass cls = char_class_at(text, pos, &len);
  // " ?X+": a single ASCII space joins the run of letters, numbers or other symbols after it.
  if (text[pos] == ' ' && pos + 1 < n) {
    size_t next_len = 0;
    const CharClass next = char_class_at(text, pos + 1, &next_len);
    if (next != kSpace) return run_end(text, pos + 1 + next_len, next);
  }
  if (cls != kSpace) return run_end(text, pos + len, cls);
  // "\s+(?!\S)|\s+": a run of white space stops one character short of the next non-space, so
  // that its last character (a space) can lead the next piece; a single character is taken whole.
  size_t end = pos + len, last = pos;
  while (end < n) {
    size_t l = 0;
    if (char_class_at(text, end, &l) != kSpace) break;
    last = end;
    end += l;
  }
  if (end == n || last == pos) return end;
  return last;
}

}  // namespace lattice
